"""Load or export a member of a run from its kept checkpoint: what `evo export` writes, what
`evo evaluate` and `Run.elite` rebuild, and what the dashboard's download button and the MLflow
logger's artifact hold (one code path for all of them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evo.agent import Agent, AgentContext
from evo.checkpoint import load_state
from evo.runstore import RunStore

__all__ = ["export_member", "load_member"]


def load_member(store: RunStore, member: int | None = None, *, generation: int | None = None, best: bool = False,
                task: dict[str, Any] | None = None, seed: int | None = None) -> tuple[dict[str, Any], Agent]:
    """Member `member` (default: the last generation's elite) rebuilt as a live agent from a kept
    trained checkpoint (`RunStore.trained_checkpoint` picks it from `generation` and `best`); returns
    (its evaluation row, the agent). `task` overrides fields of the experiment's task settings and
    `seed` the run seed the agent sees (both for evaluating elsewhere than the run did).

    Raises `RunStoreError` (no such member, or its checkpoint was pruned) or `CheckpointError` (a
    damaged checkpoint)."""
    from evo.spec import parse_experiment

    row, path, digest = store.trained_checkpoint(member, generation=generation, best=best)
    state, _ = load_state(path, expect_digest=digest)
    exp = parse_experiment(store.experiment(), f"{store.path}/experiment")
    context = AgentContext(task={**exp.task, **(task or {})}, seed=exp.seed if seed is None else int(seed))
    return row, exp.agent_class.from_state(state, context)


def export_member(store: RunStore, out: str | Path, member: int | None = None, *,
                  best: bool = False) -> tuple[dict[str, Any], Path]:
    """Write member `member` (default: the last generation's elite; with `best`, the highest-scored
    kept checkpoint of the run) to `out`; returns (its evaluation row, the export directory).

    Raises what `load_member` raises, or `ValueError` (the agent cannot write part of its export)."""
    row, agent = load_member(store, member, best=best)
    written = agent.export(out, info={"run": store.name, "generation": row["generation"], "member": row["index"],
                                      "score": row["score"], "fitness": row["fitness"], "evaluations": row["history"]})
    return row, Path(written)
