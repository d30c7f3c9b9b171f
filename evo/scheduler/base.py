"""The Scheduler protocol: train and evaluate a generation's members, somewhere.

A scheduler receives agents and gives back trained agents with their evaluations. Where the work
runs (this process, Ray actors on other cores, GPUs or machines) is its business alone; the
generation loop cannot tell the difference, and for the same seed both backends give the same
results when members do not share mutable state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents.base import Agent, AgentContext, Evaluation

__all__ = ["Scheduler", "MemberResult", "ProgressCallback", "MemberFailed"]


@dataclass
class MemberResult:
    agent: Agent
    evaluation: Evaluation
    train_metrics: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0


class MemberFailed(RuntimeError):
    """A member's training or evaluation raised; carries the member index."""

    def __init__(self, index: int, message: str) -> None:
        self.index = index
        super().__init__(f"member {index}: {message}")


#: called with (member index, event, details) — events: "training", "done"
ProgressCallback = Callable[[int, str, dict[str, Any]], None]


class Scheduler(Protocol):
    context: AgentContext

    def run_generation(self, agents: list[Agent], steps: int,
                       progress: ProgressCallback | None = None) -> list[MemberResult]:
        """Train each agent for `steps` and evaluate it; results in the order of `agents`."""

    def close(self) -> None:
        """Release workers and services."""


def train_and_evaluate(agent: Agent, steps: int) -> tuple[dict[str, float], Evaluation, float]:
    import time

    start = time.perf_counter()
    metrics = agent.train(steps)
    evaluation = agent.evaluate()
    return dict(metrics or {}), evaluation, time.perf_counter() - start
