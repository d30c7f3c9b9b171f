"""Fused training in runs: how a scheduler trains a generation's members as fused groups.

An agent class opts in with a classmethod `fused_trainer(compile: bool) -> FusedTrainer`; the
trainer says which members can share a group (`group_key`; None: train this one alone) and trains
and evaluates a group in one program. `attempt_fused` is the fused counterpart of
`evo.scheduler.base.attempt_member` for a whole generation: members are grouped by key, groups of
two or more are trained fused, the rest one by one, and every member comes back with the same
(metrics, evaluation, wall_s, failure) tuple and the same divergence checks as alone.

`resources.fused = true` in an experiment turns this on (docs/fused.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from evo.agent import Agent, Evaluation
from evo.faults import Diverged, describe_exception
from evo.training_thread import prepare_training_thread

__all__ = ["FusedTrainer", "fused_trainer_for", "attempt_fused"]

Outcome = tuple[dict[str, float], "Evaluation | None", float, "tuple[str, str] | None"]


class FusedTrainer(Protocol):
    def group_key(self, agent: Agent) -> str | None:
        """Members with equal keys can be trained as one group; None trains this member alone."""

    def train(self, agents: Sequence[Agent], steps: int) -> list[dict[str, float] | BaseException]:
        """Each member's `train(steps)`, fused; per member its metrics or the exception that stopped it."""

    def evaluate(self, agents: Sequence[Agent]) -> list[Evaluation]:
        """Each member's `evaluate()`, fused."""


def fused_trainer_for(agent_class: type[Agent], compile: bool = False) -> FusedTrainer | None:
    """The agent class's fused trainer, or None (with the reason in a warning) if it has none."""
    hook = getattr(agent_class, "fused_trainer", None)
    if hook is None:
        import warnings

        warnings.warn(f"resources.fused: {agent_class.__name__} has no fused_trainer(); training members one by one",
                      stacklevel=2)
        return None
    return hook(compile=compile)


def _failure(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, Diverged):
        return "diverged", str(exc)
    return ("lost" if type(exc).__module__.startswith("ray.") else "error"), describe_exception(exc)


def attempt_fused(trainer: FusedTrainer, members: Sequence[Agent], steps: int,
                  attempt_one: Callable[[Agent], Outcome]) -> list[Outcome]:
    """Every member's (metrics, evaluation, wall_s, failure), in order. Members sharing a group key
    train and evaluate fused; a member alone in its group goes through `attempt_one`."""
    from evo.scheduler.base import check_trained

    prepare_training_thread(threads=None)  # as train_and_evaluate does for a member alone
    groups: dict[str, list[int]] = {}
    alone: list[int] = []
    for pos, agent in enumerate(members):
        key = trainer.group_key(agent)
        (alone.append(pos) if key is None else groups.setdefault(key, []).append(pos))
    for key in [k for k, v in groups.items() if len(v) == 1]:
        alone += groups.pop(key)
    out: list[Any] = [None] * len(members)
    for pos in alone:
        out[pos] = attempt_one(members[pos])
    for positions in groups.values():
        group = [members[p] for p in positions]
        start = time.perf_counter()
        try:
            trained = trainer.train(group, steps)
        except Exception as exc:  # the group's program failed: every member in it did
            for p in positions:
                out[p] = ({}, None, time.perf_counter() - start, _failure(exc))
            continue
        ok = []
        for p, agent, result in zip(positions, group, trained):
            if isinstance(result, BaseException):
                out[p] = ({}, None, time.perf_counter() - start, _failure(result))
                continue
            try:
                check_trained(agent, result)
                ok.append((p, agent, result))
            except Diverged as exc:
                out[p] = ({}, None, time.perf_counter() - start, ("diverged", str(exc)))
        if not ok:
            continue
        try:
            evaluations = trainer.evaluate([a for _, a, _ in ok])
        except Exception as exc:
            for p, _, _ in ok:
                out[p] = ({}, None, time.perf_counter() - start, _failure(exc))
            continue
        wall = time.perf_counter() - start
        for (p, _, metrics), evaluation in zip(ok, evaluations):
            failure = None if math.isfinite(float(evaluation.fitness)) else ("diverged", f"fitness is {evaluation.fitness}")
            out[p] = (metrics, None if failure else evaluation, wall, failure)
    return out
