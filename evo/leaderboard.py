"""Leaderboard rows from the run store, and their table / CSV / JSON renderings."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import numpy as np

from evo.faults import Failure
from evo.records import MutationRecord
from evo.runstore import RunStore

__all__ = ["leaderboard_rows", "render"]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _arch_summary(arch: dict[str, Any]) -> str:
    shown = {k: v for k, v in arch.items() if not k.startswith(("min_", "max_")) and k != "node_step"}
    return " ".join(f"{k}={v}" for k, v in shown.items())


def leaderboard_rows(store: RunStore, top: int | None = None) -> list[dict[str, Any]]:
    """Members of the last completed generation, elite first.

    `score` is what selection ranked by (the mean of the last `fitness_window` evaluations, with
    `score_std` their spread); `fitness` is the member's latest single evaluation.
    """
    window = int(store.experiment().get("selection", {}).get("fitness_window", 1))
    last = store.last_completed_generation()
    failures = store.failures(last)
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
            "arch": _arch_summary(ev["arch"]),
            "generation": last,
            **_failure_fields(failures, ev["index"]),
        })
    return rows[:top] if top else rows


def _failure_fields(failures: list[Failure], index: int) -> dict[str, Any]:
    """`failure`: how the member failed in this generation (kind, error, attempt), or None;
    `retried`: how many of its attempts were lost with their worker and run again (docs/faults.md)."""
    mine = [f for f in failures if f.index == index]
    final = next((f for f in mine if not f.retried), None)
    return {"failure": None if final is None else {"kind": final.kind, "error": final.message, "attempt": final.attempt},
            "retried": sum(1 for f in mine if f.retried)}


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


def render(rows: list[dict[str, Any]], fmt: str, title: str = "", shown_hparams: set[str] | None = None) -> str:
    """`shown_hparams` limits the table's hyperparameter column (CSV and JSON always carry all)."""
    if fmt == "json":
        return json.dumps(_finite_or_none(rows), indent=2, default=str)  # strict JSON: no -Infinity
    if fmt == "csv":
        import pandas as pd

        flat = [{**{k: v for k, v in r.items() if k != "hparams"}, **{f"hp.{k}": v for k, v in r["hparams"].items()}}
                for r in rows]
        buf = io.StringIO()
        pd.DataFrame(flat).to_csv(buf, index=False)
        return buf.getvalue()
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("rank", "member", "score", "fitness", "age", "parent", "last mutation", "hyperparameters", "architecture"):
        table.add_column(col, overflow="fold")
    for r in rows:
        hp = ", ".join(f"{k}={_fmt(v)}" for k, v in r["hparams"].items() if shown_hparams is None or k in shown_hparams)
        table.add_row(str(r["rank"]), str(r["member"]), *_score_cells(r),
                      str(r["age"]),
                      "-" if r["parent"] is None else str(r["parent"]), r["last_mutation"], hp, r["arch"])
    console = Console(file=io.StringIO(), width=160, force_terminal=False)
    console.print(table)
    return console.file.getvalue()
