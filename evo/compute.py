"""Compute accounting: what a member's training cost, and judging members at equal compute.

Three units, counted for every round a member trains (one `agent.train(steps)` + `evaluate()`):

* `env_steps`: the agent's cumulative `env_steps` training metric when it reports one (EfficientZero
  does), else the `steps` the engine passed to `train` (the agent's own unit);
* `updates`: the agent's cumulative `updates` metric when reported, else `steps` likewise;
* `member_s`: the round's wall seconds (training + evaluation) on its worker.

A member's `Compute` is cumulative along its *line*: a clone starts from what its parent had spent
(it carries the parent's training), so two members' totals say how much training each embodies.
What the run spent is the sum of the rounds' deltas, counted once (the budget, `population.budget`).

A member's *line* is the series of (compute, score) points of its own evaluations and, before its
birth, its ancestors'. `scores_at_equal_compute` judges a group of members each by its line's
score at one common level of compute, so a member that doubled its updates is compared with the
others' scores at the same number of updates, not with their scores at half of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Compute", "LinePoint", "round_compute", "scores_at_equal_compute", "UNITS"]

UNITS = ("env_steps", "updates", "member_s")


@dataclass(frozen=True)
class Compute:
    env_steps: float = 0.0
    updates: float = 0.0
    member_s: float = 0.0

    def __add__(self, other: Compute) -> Compute:
        return Compute(self.env_steps + other.env_steps, self.updates + other.updates, self.member_s + other.member_s)

    def __sub__(self, other: Compute) -> Compute:
        return Compute(self.env_steps - other.env_steps, self.updates - other.updates, self.member_s - other.member_s)

    def get(self, unit: str) -> float:
        """The amount in `unit`: env_steps, updates, member_s (or the budget's name member_seconds)."""
        return float(getattr(self, "member_s" if unit == "member_seconds" else unit))

    def to_json(self) -> dict[str, float]:
        return {"env_steps": self.env_steps, "updates": self.updates, "member_s": self.member_s}


@dataclass(frozen=True)
class LinePoint:
    """One evaluation on a member's line: the line's cumulative compute then, its score, and the
    secondary signal's value (NaN when the agent did not report it)."""

    compute: Compute
    score: float
    secondary: float = math.nan


def round_compute(before: Compute, steps: int, train_metrics: dict[str, float], wall_s: float) -> Compute:
    """The member's cumulative compute after a round that started at `before`."""
    def counter(name: str, fallback: float) -> float:
        value = train_metrics.get(name)
        if isinstance(value, (int, float)) and math.isfinite(float(value)) and float(value) >= 0:
            return float(value)
        return fallback

    return Compute(counter("env_steps", before.env_steps + steps), counter("updates", before.updates + steps),
                   before.member_s + float(wall_s))


def _score_at(line: Sequence[LinePoint], unit: str, level: float) -> LinePoint | None:
    """The line's last point at or below `level` of `unit`."""
    best = None
    for point in line:
        if point.compute.get(unit) <= level + 1e-9:
            best = point
    return best


def scores_at_equal_compute(lines: Sequence[Sequence[LinePoint]], unit: str) -> tuple[list[LinePoint], float]:
    """Each line's point at one common level of `unit`: the least latest compute among the lines,
    raised to the largest first point when some line has no point that low (early on, a member
    that spends twice the updates per round has no evaluation at the others' level). Returns the
    points (a line with no point: its first) and the level."""
    if not lines:
        return [], math.nan
    latest = min(line[-1].compute.get(unit) for line in lines)
    first = max(line[0].compute.get(unit) for line in lines)
    level = max(latest, first)
    return [_score_at(line, unit, level) or line[0] for line in lines], level
