"""Evaluate a kept checkpoint of a run on episodes the run never selected on.

A run scores every member on the same evaluation starts, generation after generation, and keeps
the member that scores best on them: the elite's score is the maximum of noisy estimates on a
fixed set, so it is biased upward (and, with few episodes, by a lot). `evaluate_member` rebuilds a
member from its checkpoint and evaluates it afresh, on more episodes from a different seed; that
is the number to quote for what an exported agent does. It is what `evo evaluate` prints."""

from __future__ import annotations

import time
from typing import Any

from evo.runstore import RunStore

__all__ = ["HELDOUT_SEED_OFFSET", "evaluate_member"]

#: the held-out seed is the run seed plus this, unless given (far from any seed a run uses itself)
HELDOUT_SEED_OFFSET = 1000


def evaluate_member(store: RunStore, member: int | None = None, *, generation: int | None = None, best: bool = False,
                    episodes: int | None = None, seed: int | None = None) -> dict[str, Any]:
    """Evaluate member `member` (default: the last generation's elite; `generation` and `best` pick the
    checkpoint as `RunStore.trained_checkpoint` does) with its agent's own `evaluate`, the run seed
    replaced by `seed` (default: run seed + `HELDOUT_SEED_OFFSET`) and, when given, `episodes` in
    place of the experiment's `eval_episodes`. Returns the member, its generation, what the run
    recorded for it (`run_fitness`, `run_score`) and the fresh evaluation (`fitness`, `metrics`,
    `seconds`).

    Raises `ValueError` for a bad `episodes` or an experiment without `eval_episodes` to set, and
    what `evo.export.load_member` raises."""
    from evo.export import load_member
    from evo.spec import parse_experiment

    exp = parse_experiment(store.experiment(), f"{store.path}/experiment")
    task: dict[str, Any] = {}
    if episodes is not None:
        if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
            raise ValueError(f"episodes: expected a whole number of at least 1, found {episodes!r}")
        if "eval_episodes" not in exp.task:
            raise ValueError(f"{store.name}: its [agent.task] has no eval_episodes to set; "
                             "evaluate without --episodes (the agent's own evaluation)")
        task["eval_episodes"] = episodes
    seed = exp.seed + HELDOUT_SEED_OFFSET if seed is None else int(seed)
    row, agent = load_member(store, member, generation=generation, best=best, task=task, seed=seed)
    t0 = time.perf_counter()
    evaluation = agent.evaluate()
    return {"run": store.name, "member": row["index"], "generation": row["generation"],
            "run_fitness": row["fitness"], "run_score": row["score"], "seed": seed,
            "episodes": (exp.task | task).get("eval_episodes"), "fitness": evaluation.fitness,
            "metrics": dict(evaluation.metrics), "seconds": time.perf_counter() - t0}
