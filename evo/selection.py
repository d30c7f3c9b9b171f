"""Tournament selection with elitism, and the fitness a member is judged by.

Ties are broken by the seeded generator passed in, never by list order or the clock, so the same
seed always selects the same parents.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["fitness_score", "argmax_tiebreak", "tournament_select"]


def fitness_score(history: Sequence[float], window: int) -> float:
    """Mean of the last `window` evaluations (smooths noisy returns); -inf for no evaluations."""
    recent = [float(x) for x in list(history)[-window:] if not math.isnan(float(x))]
    return float(np.mean(recent)) if recent else -math.inf


def argmax_tiebreak(values: Sequence[float], rng: np.random.Generator) -> int:
    """Index of the largest value; among equal largest values, one drawn by `rng`."""
    arr = np.asarray(values, dtype=float)
    best = np.flatnonzero(arr == arr.max())
    return int(best[0] if len(best) == 1 else best[int(rng.integers(len(best)))])


def tournament_select(fitness: Sequence[float], n_children: int, tournament_size: int, elitism: bool,
                      rng: np.random.Generator, eligible: Sequence[bool] | None = None) -> tuple[int | None, list[int]]:
    """Pick the elite (if `elitism`) and the parents of the other `n_children - 1` (or `n_children`) slots.

    Each parent wins a tournament of `tournament_size` distinct members drawn at random.
    Members not `eligible` (those that failed this generation) take part in nothing: tournaments
    draw from the eligible ones only (of size min(tournament_size, how many are eligible)), so
    their slots go to others. Returns (elite position or None, parent positions).
    """
    n = len(fitness)
    if n == 0:
        raise ValueError("cannot select from an empty population")
    if not 1 <= tournament_size <= n:
        raise ValueError(f"tournament_size: expected 1..{n}, found {tournament_size}")
    if eligible is not None and not all(eligible):
        pool = np.flatnonzero(np.asarray(eligible, dtype=bool))
        if pool.size == 0:
            raise ValueError("cannot select: every member failed")
        elite, parents = tournament_select([fitness[i] for i in pool], n_children, min(tournament_size, pool.size),
                                           elitism, rng)
        return (None if elite is None else int(pool[elite])), [int(pool[p]) for p in parents]
    values = np.asarray(fitness, dtype=float)
    elite = argmax_tiebreak(values, rng) if elitism else None
    slots = n_children - (1 if elitism else 0)
    parents = []
    for _ in range(max(slots, 0)):
        entrants = rng.choice(n, size=tournament_size, replace=False)
        parents.append(int(entrants[argmax_tiebreak(values[entrants], rng)]))
    return elite, parents
