"""Export a member of a run as a self-contained directory: what `evo export` writes, and what the
dashboard's download button and the MLflow logger's artifact hold (one code path for all three)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evo.agent import AgentContext
from evo.checkpoint import load_state
from evo.runstore import RunStore

__all__ = ["export_member"]


def export_member(store: RunStore, out: str | Path, member: int | None = None) -> tuple[dict[str, Any], Path]:
    """Write member `member` (default: the last generation's elite) from its newest kept trained
    checkpoint to `out`; returns (its evaluation row, the export directory).

    Raises `RunStoreError` (no such member, or its checkpoint was pruned), `CheckpointError` (a
    damaged checkpoint) or `ValueError` (the agent cannot write part of its export)."""
    from evo.spec import parse_experiment

    row, path, digest = store.trained_checkpoint(member)
    state, _ = load_state(path, expect_digest=digest)
    exp = parse_experiment(store.experiment(), f"{store.path}/experiment")
    agent = exp.agent_class.from_state(state, AgentContext(task=exp.task, seed=exp.seed))
    written = agent.export(out, info={"run": store.name, "generation": row["generation"], "member": row["index"],
                                      "score": row["score"], "fitness": row["fitness"], "evaluations": row["history"]})
    return row, Path(written)
