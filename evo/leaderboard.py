"""Leaderboard rows from the run store, and their table / CSV / JSON renderings.

The table shows only what tells members apart: the hyperparameters and architecture knobs whose
values differ across the population (`show_all` for every one); what every member shares is said
once, under the table, instead of on every row.
"""

from __future__ import annotations

import io
import json
import math
from typing import Any

import numpy as np

from evo.diversity import Diversity
from evo.faults import Failure
from evo.records import MutationRecord
from evo.runstore import RunStore

__all__ = ["leaderboard_rows", "render", "diversity_line", "varying_keys", "arch_knobs", "compact", "compute_cell"]


def compact(v: Any) -> str:
    """A value in a few characters: 4 significant digits, lists without spaces."""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(compact(x) for x in v) + "]"
    return str(v)


def arch_knobs(arch: dict[str, Any]) -> dict[str, Any]:
    """The architecture without its mutation bounds (min_*, max_*, node_step), which never differ."""
    return {k: v for k, v in arch.items() if not k.startswith(("min_", "max_")) and k != "node_step"}


def varying_keys(dicts: list[dict[str, Any]]) -> list[str]:
    """Keys whose values are not the same in every dict (a key missing somewhere varies), in first-seen order."""
    keys: dict[str, None] = {}
    for d in dicts:
        keys.update(dict.fromkeys(d))
    return [k for k in keys if len({json.dumps(d.get(k), sort_keys=True, default=str) for d in dicts}) > 1]


def leaderboard_rows(store: RunStore, top: int | None = None) -> list[dict[str, Any]]:
    """Members of the last completed generation, elite first.

    `score` is what selection ranked by (the mean of the last `fitness_window` evaluations, with
    `score_std` their spread); `fitness` is the member's latest single evaluation; `arch` is the
    architecture without its mutation bounds.
    """
    window = int(store.experiment().get("selection", {}).get("fitness_window", 1))
    last = store.last_completed_generation()
    failures = store.failures(last)
    compute = {idx: c for (g, idx), c in store.compute().items() if g == last}
    rows = []
    for rank, ev in enumerate(store.evaluations(last), start=1):
        recent = [x for x in ev["history"][-window:] if math.isfinite(x)]  # a failed evaluation is -inf
        record = MutationRecord.from_json(ev["mutation"])
        rows.append({
            "rank": rank,
            "member": ev["index"],
            "score": ev["score"],
            "score_std": float(np.std(recent)) if recent else float("nan"),
            "fitness": ev["fitness"],
            "evaluations": len(ev["history"]),
            "age": last - ev["born"] + 1,
            "parent": ev["parent"],
            "last_mutation": "-" if record is None else record.summary(),
            "hparams": ev["hparams"],
            "arch": arch_knobs(ev["arch"]),
            "generation": last,
            # what the member's line had spent by this evaluation (evo.compute); None before it was measured
            "compute": compute[ev["index"]].to_json() if ev["index"] in compute else None,
            **_failure_fields(failures, ev["index"]),
        })
    _add_diversity(rows, store.diversity(last))
    return rows[:top] if top else rows


def _add_diversity(rows: list[dict[str, Any]], diversity: Diversity | None) -> None:
    """Per row: its parameter digest, the members with bit-identical parameters (`identical_to`,
    empty when it is unique) and the generation's distinct count and mean distance (evo.diversity)."""
    if diversity is None:  # a run from before the measurement
        return
    for row in rows:
        digest = diversity.digests.get(row["member"])
        twins = next((g for g in diversity.identical if row["member"] in g), [])
        row.update({"param_digest": digest, "identical_to": [i for i in twins if i != row["member"]],
                    "distinct_members": diversity.distinct,
                    "mean_param_distance": None if math.isnan(diversity.mean_distance) else diversity.mean_distance})


def diversity_line(store: RunStore, generation: int | None = None) -> str:
    """'diversity 4/4 distinct, mean distance 0.031' (flagged IDENTICAL when members are twins); '' if unmeasured."""
    diversity = store.diversity(generation)
    return "" if diversity is None else f"diversity {diversity.summary()}"


def _failure_fields(failures: list[Failure], index: int) -> dict[str, Any]:
    """`failure`: how the member failed in this generation (kind, error, attempt), or None;
    `retried`: how many of its attempts were lost with their worker and run again (docs/faults.md)."""
    mine = [f for f in failures if f.index == index]
    final = next((f for f in mine if not f.retried), None)
    return {"failure": None if final is None else {"kind": final.kind, "error": final.message, "attempt": final.attempt},
            "retried": sum(1 for f in mine if f.retried)}


def compute_cell(compute: dict[str, float] | None) -> str:
    """'4.8k steps · 2.4k upd · 31 s': what a member's line spent (env steps, updates, member-seconds)."""
    if not compute:
        return "-"

    def short(x: float) -> str:
        return f"{x / 1e6:.3g}M" if x >= 1e6 else f"{x / 1e3:.3g}k" if x >= 1e3 else f"{x:.3g}"

    return f"{short(compute['env_steps'])} steps · {short(compute['updates'])} upd · {compute['member_s']:.3g} s"


def _finite_or_none(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite_or_none(v) for v in obj]
    return obj


def _score_cells(r: dict[str, Any]) -> tuple[str, str]:
    if r.get("failure"):
        return "-", f"failed: {r['failure']['kind']}"
    return f"{r['score']:.4g} ± {r['score_std']:.2g}", f"{r['fitness']:.4g}"


def render(rows: list[dict[str, Any]], fmt: str, title: str = "", show_all: bool = False,
           population: list[dict[str, Any]] | None = None) -> str:
    """The rows as a table, CSV or JSON. The table shows the hyperparameters and architecture keys
    that vary across `population` (default: `rows`), or every one with `show_all`; CSV and JSON
    always carry all of them."""
    if fmt == "json":
        return json.dumps(_finite_or_none(rows), indent=2, default=str)  # strict JSON: no -Infinity
    if fmt == "csv":
        import pandas as pd

        flat = [{**{k: v for k, v in r.items() if k not in ("hparams", "arch", "compute")},
                 **{f"compute.{k}": v for k, v in (r.get("compute") or {}).items()},
                 **{f"hp.{k}": v for k, v in r["hparams"].items()},
                 **{f"arch.{k}": compact(v) for k, v in r["arch"].items()}} for r in rows]
        buf = io.StringIO()
        pd.DataFrame(flat).to_csv(buf, index=False)
        return buf.getvalue()
    from rich.console import Console
    from rich.table import Table

    everyone = population or rows
    hp_keys = list(everyone[0]["hparams"]) if show_all and everyone else varying_keys([r["hparams"] for r in everyone])
    arch_keys = list(everyone[0]["arch"]) if show_all and everyone else varying_keys([r["arch"] for r in everyone])
    table = Table(title=title)
    for col in ("rank", "member", "score", "fitness", "compute", "age", "parent", "last mutation", "hyperparameters",
                "architecture"):
        table.add_column(col, overflow="fold")
    for r in rows:
        hp = " ".join(f"{k}={compact(r['hparams'][k])}" for k in hp_keys if k in r["hparams"]) or "-"
        arch = " ".join(f"{k}={compact(r['arch'][k])}" for k in arch_keys if k in r["arch"]) or "-"
        table.add_row(str(r["rank"]), str(r["member"]), *_score_cells(r), compute_cell(r.get("compute")),
                      str(r["age"]), "-" if r["parent"] is None else str(r["parent"]), r["last_mutation"], hp, arch)
    if not show_all and everyone:
        shared_hp = {k: v for k, v in everyone[0]["hparams"].items() if k not in hp_keys}
        shared_arch = {k: v for k, v in everyone[0]["arch"].items() if k not in arch_keys}
        table.caption = ("same in every member (--all shows them per row): "
                         f"hyperparameters {' '.join(f'{k}={compact(v)}' for k, v in shared_hp.items()) or '-'}; "
                         f"architecture {' '.join(f'{k}={compact(v)}' for k, v in shared_arch.items()) or '-'}")
        table.caption_justify = "left"
    console = Console(file=io.StringIO(), width=160, force_terminal=False)
    console.print(table)
    return console.file.getvalue()
