"""Tournament selection with elitism, and the fitness a member is judged by.

Ties are broken by the seeded generator passed in, never by list order or the clock, so the same
seed always selects the same parents.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["fitness_score", "argmax_tiebreak", "tournament_select", "pick_best", "judged_tournament_select",
           "keep_founder_lines", "best_of_lines", "most_crowded_line"]


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


def truncation_select(scores: Sequence[float], k: int, rng: np.random.Generator,
                      eligible: Sequence[bool] | None = None) -> dict[int, int]:
    """PBT's exploit rule (truncation selection, `selection.truncation`): the `k` lowest-scoring members
    are replaced by clones of the `k` highest, the lowest by the highest, the next by the next; every
    other member trains on. Members not `eligible` (failed this generation) rank below all others and
    are always replaced (by more than `k` if that many failed). Equal scores are ordered by `rng`, so a
    tie at a floor score does not always cost the same position its slot.
    Returns {replaced position: cloned position}."""
    n = len(scores)
    ok = [True] * n if eligible is None else [bool(e) for e in eligible]
    if n == 0 or not any(ok):
        raise ValueError("cannot select: every member failed" if n else "cannot select from an empty population")
    if not 1 <= k <= n // 2:
        raise ValueError(f"truncation: expected 1..{n // 2} (half of {n} members), found {k}")
    draw = rng.random(n)
    best_first = sorted(range(n), key=lambda p: (not ok[p], -float(scores[p]) if ok[p] else 0.0, draw[p]))
    replaced = max(k, n - sum(ok))
    winners = [p for p in best_first[:n - replaced] if ok[p]][:k]
    losers = best_first[n - replaced:][::-1]  # the lowest first
    return {loser: winners[i % len(winners)] for i, loser in enumerate(losers)}


# ---- selection that is not blind: ties broken by a secondary signal, judging at equal compute ----

Judge = Callable[[Sequence[int]], tuple[Sequence[float], Sequence[float]]]


def pick_best(values: Sequence[float], rng: np.random.Generator, secondary: Sequence[float] | None = None,
              tolerance: float = 0.0, secondary_name: str = "secondary") -> tuple[int, str]:
    """The position of the best of `values` and what decided it: "score" (one value is best by more
    than `tolerance`), "secondary:NAME" (the tied best differ in `secondary`, larger is better; NaN
    ranks last), "random tie" (tied in both: `rng` draws) or "only entrant"."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 1:
        return 0, "only entrant"
    top = arr.max()
    tied = np.flatnonzero(arr >= top - tolerance) if math.isfinite(top) else np.flatnonzero(arr == top)
    if tied.size == 1:
        return int(tied[0]), "score"
    if secondary is not None:
        sec = np.asarray(secondary, dtype=float)[tied]
        sec = np.where(np.isnan(sec), -np.inf, sec)
        if np.isfinite(sec).any():
            best = tied[np.flatnonzero(sec == sec.max())]
            if best.size == 1:
                return int(best[0]), f"secondary:{secondary_name}"
            tied = best
    return int(tied[int(rng.integers(tied.size))]), "random tie"


def judged_tournament_select(n: int, n_children: int, tournament_size: int, elitism: bool, rng: np.random.Generator,
                             judge: Judge, eligible: Sequence[bool] | None = None, tolerance: float = 0.0,
                             secondary_name: str = "secondary") -> tuple[int | None, list[int], list[str]]:
    """`tournament_select` where each tournament's entrants are judged together by `judge(positions)`
    -> (values, secondary values) (e.g. at equal compute), ties going to the secondary signal
    (`pick_best`). Returns (elite, parents, what decided each parent's tournament)."""
    pool = np.arange(n) if eligible is None else np.flatnonzero(np.asarray(eligible, dtype=bool))
    if pool.size == 0:
        raise ValueError("cannot select: every member failed")
    size = min(tournament_size, pool.size)
    elite = None
    if elitism:
        values, sec = judge([int(p) for p in pool])
        elite = int(pool[pick_best(values, rng, sec, tolerance, secondary_name)[0]])
    parents, decided = [], []
    for _ in range(max(n_children - (1 if elitism else 0), 0)):
        entrants = [int(p) for p in pool[rng.choice(pool.size, size=size, replace=False)]]
        values, sec = judge(entrants)
        best, why = pick_best(values, rng, sec, tolerance, secondary_name)
        parents.append(entrants[best])
        decided.append(why)
    return elite, parents, decided


def best_of_lines(founders: Sequence[int], values: Sequence[float],
                  eligible: Sequence[bool] | None = None) -> dict[int, int]:
    """Each founder's line -> the position of its best `eligible` member by `values` (the first on ties)."""
    ok = [True] * len(founders) if eligible is None else list(eligible)
    best_of: dict[int, int] = {}
    for pos, founder in enumerate(founders):
        if ok[pos] and (founder not in best_of or values[pos] > values[best_of[founder]]):
            best_of[founder] = pos
    return best_of


def most_crowded_line(held: Sequence[int]) -> tuple[int, int]:
    """(the line holding the most of `held`'s slots, lowest founder on ties; how many it holds)."""
    counts = {f: list(held).count(f) for f in set(held)}
    crowded = max(counts, key=lambda f: (counts[f], -f))
    return crowded, counts[crowded]


def keep_founder_lines(parents: list[int], founders: Sequence[int], values: Sequence[float], lines: int,
                       eligible: Sequence[bool] | None = None, elite: int | None = None) -> tuple[list[int], list[int]]:
    """Make at least `lines` founders' lines parents of the next population (fewer if fewer are
    alive): each missing line, best first by its best member's value, takes the slot of a parent
    whose line holds the most slots. Returns (parents, the slots changed)."""
    best_of = best_of_lines(founders, values, eligible)
    parents = list(parents)
    present = [founders[p] for p in parents] + ([founders[elite]] if elite is not None else [])
    missing = sorted((f for f in best_of if f not in present), key=lambda f: -values[best_of[f]])
    changed = []
    for founder in missing:
        if len(set(present)) >= lines:
            break
        crowded, count = most_crowded_line(present)
        if count < 2:
            break
        # the crowded line's last parent slot goes to the missing line's best member
        slot = max(i for i, p in enumerate(parents) if founders[p] == crowded)
        parents[slot] = best_of[founder]
        present = [founders[p] for p in parents] + ([founders[elite]] if elite is not None else [])
        changed.append(slot)
    return parents, changed
