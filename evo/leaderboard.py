"""Leaderboard rows from the run store, and their table / CSV / JSON renderings."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import numpy as np

from evo.runstore import RunStore

__all__ = ["leaderboard_rows", "render"]


def _mutation_summary(mutation: dict[str, Any] | None) -> str:
    if not mutation:
        return "-"
    kind = mutation.get("kind", "?")
    if kind == "rl_hp":
        changes = mutation.get("changes", {})
        return "rl_hp " + ", ".join(f"{k}→{_fmt(v[1])}" for k, v in changes.items()) if changes else "rl_hp"
    if kind == "architecture":
        return f"architecture {mutation.get('op', '?')}"
    if kind == "activation":
        return f"activation {mutation.get('from')}→{mutation.get('to')}"
    if kind == "parameters":
        return f"parameters sd={mutation.get('sd')}"
    return kind


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _arch_summary(arch: dict[str, Any]) -> str:
    shown = {k: v for k, v in arch.items() if not k.startswith(("min_", "max_")) and k != "node_step"}
    return " ".join(f"{k}={v}" for k, v in shown.items())


def leaderboard_rows(store: RunStore, top: int | None = None) -> list[dict[str, Any]]:
    """Members of the last completed generation, elite first."""
    window = int(store.experiment().get("selection", {}).get("fitness_window", 1))
    last = store.last_completed_generation()
    rows = []
    for rank, ev in enumerate(store.evaluations(last), start=1):
        recent = [x for x in ev["history"][-window:] if not math.isnan(x)]
        rows.append({
            "rank": rank,
            "member": ev["index"],
            "fitness": float(np.mean(recent)) if recent else float("nan"),
            "fitness_std": float(np.std(recent)) if recent else float("nan"),
            "last_fitness": ev["fitness"],
            "evaluations": len(ev["history"]),
            "age": last - ev["born"] + 1,
            "parent": ev["parent"],
            "last_mutation": _mutation_summary(ev["mutation"]),
            "hparams": ev["hparams"],
            "arch": _arch_summary(ev["arch"]),
            "generation": last,
        })
    return rows[:top] if top else rows


def render(rows: list[dict[str, Any]], fmt: str, title: str = "", shown_hparams: set[str] | None = None) -> str:
    """`shown_hparams` limits the table's hyperparameter column (CSV and JSON always carry all)."""
    if fmt == "json":
        return json.dumps(rows, indent=2, default=str)
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
    for col in ("rank", "member", "fitness", "age", "parent", "last mutation", "hyperparameters", "architecture"):
        table.add_column(col, overflow="fold")
    for r in rows:
        hp = ", ".join(f"{k}={_fmt(v)}" for k, v in r["hparams"].items() if shown_hparams is None or k in shown_hparams)
        table.add_row(str(r["rank"]), str(r["member"]), f"{r['fitness']:.4g} ± {r['fitness_std']:.2g}", str(r["age"]),
                      "-" if r["parent"] is None else str(r["parent"]), r["last_mutation"], hp, r["arch"])
    console = Console(file=io.StringIO(), width=160, force_terminal=False)
    console.print(table)
    return console.file.getvalue()
