"""The Scheduler protocol: train and evaluate a generation's members, somewhere.

A scheduler receives agents and gives back trained agents with their evaluations. Where the work
runs (this process, Ray actors on other cores, GPUs or machines) is its business alone; the
generation loop cannot tell the difference, and for the same seed both backends give the same
results when members do not share mutable state. Each backend also builds the run's shared
replay store where its members can reach it (`build_replay`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from evo.agent import Agent, Evaluation
from evo.observer import RunObserver
from evo.replay.protocol import Replay, ReplaySpec

__all__ = ["Scheduler", "MemberResult", "MemberFailed", "train_and_evaluate"]


@dataclass
class MemberResult:
    agent: Agent
    evaluation: Evaluation
    train_metrics: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0


class MemberFailed(RuntimeError):
    """A member's training or evaluation raised (or timed out); carries the member index."""

    def __init__(self, index: int, message: str) -> None:
        self.index = index
        super().__init__(f"member {index}: {message}")


class Scheduler(Protocol):
    @staticmethod
    def build_replay(spec: ReplaySpec, seed: int) -> Replay:
        """The run's shared store, placed where this backend's members reach it."""

    def run_generation(self, agents: list[Agent], steps: int,
                       observer: RunObserver | None = None) -> list[MemberResult]:
        """Train each agent for `steps` and evaluate it; results in the order of `agents`.
        A member that raises or times out surfaces as `MemberFailed`."""

    def close(self) -> None:
        """Release workers and services."""


def train_and_evaluate(agent: Agent, steps: int) -> tuple[dict[str, float], Evaluation, float]:
    start = time.perf_counter()
    metrics = agent.train(steps)
    evaluation = agent.evaluate()
    return dict(metrics or {}), evaluation, time.perf_counter() - start
