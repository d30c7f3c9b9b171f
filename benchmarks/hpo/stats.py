"""Statistics of the HPO benchmark: areas under best-so-far curves and bootstrap intervals of
evo minus each peer.

A curve is a list of points [steps, seconds, best fitness of that point]. Its *best-so-far*
curve is the running maximum (what a person who kept the best member so far holds), a step
function; the area under it up to a horizon, divided by the horizon, is the mean best-so-far over
the budget (`auc`), in fitness units: a strategy that reaches a good member early has a larger
area than one that reaches it at the end. Before a curve's first point the best-so-far is the
`floor` (the task's worst fitness). The `_shared` areas start at the latest first point of any run
(`shared_window_start`): there every run's best-so-far is measured, so a strategy that reports its
first point later is compared on what it found, not charged the floor for the wait.

Differences between strategies are reported with a percentile bootstrap over seeds: each
strategy's seeds are resampled with replacement (independently: seeds are not paired across
strategies), the statistic (median) taken on each resample, and the 2.5 and 97.5 percentiles of
evo's minus the peer's form the 95% interval. "excludes 0" then says the difference is resolved.

Every strategy of a seed starts from the same founders, so the seeds can also be paired
(`paired_difference`, reported beside the unpaired figures as `paired`): the per-seed differences
evo − peer, the bootstrap 95% interval of their mean (seeds resampled with replacement), how many
are positive, and the Wilcoxon signed-rank test's two-sided p (scipy). Pairing removes the spread
that seeds share (an easy draw of founders is easy for every strategy), which the unpaired interval
counts as noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["auc", "bootstrap_difference", "paired_difference", "compare", "at_reports"]

#: how many points of a curve `auc_seconds_reports` keeps: about as many as a Tune strategy reports a run
REPORTS = 5


def auc(curve: Sequence[Sequence[float]], axis: int, horizon: float, floor: float = 0.0,
        start: float = 0.0) -> float | None:
    """Mean best-so-far fitness over [start, horizon] along `axis` (0: steps, 1: seconds); None without
    points. Points before `start` count toward the best-so-far at `start`."""
    if not curve or horizon <= start:
        return None
    area, best, x_prev = 0.0, floor, start
    for point in sorted(curve, key=lambda p: p[axis]):
        x = min(max(float(point[axis]), start), horizon)
        area += best * max(0.0, x - x_prev)
        x_prev = max(x_prev, x)
        best = max(best, float(point[2]))
        if x >= horizon:
            break
    area += best * max(0.0, horizon - x_prev)
    return area / (horizon - start)


def at_reports(curve: Sequence[Sequence[float]], budget: float, reports: int = REPORTS) -> list[Sequence[float]]:
    """The curve as `reports` evenly spaced reports would have shown it: at each k/reports of the budget,
    the last point at or before it (each point once). The best-so-far is a maximum over a curve's points,
    and a strategy that evaluates at every rung has 60-odd points where a Tune run has 5: thinned, every
    strategy's maximum is over about as many noisy evaluations."""
    out: list[Sequence[float]] = []
    for k in range(1, reports + 1):
        before = [p for p in curve if float(p[0]) <= budget * k / reports]
        if before and (not out or before[-1] is not out[-1]):
            out.append(before[-1])
    return out


def bootstrap_difference(a: Sequence[float], b: Sequence[float], stat: Callable[[np.ndarray], float] = np.median,
                         n: int = 10000, seed: int = 0) -> dict[str, Any]:
    """stat(a) − stat(b) with its percentile-bootstrap 95% interval (independent resampling of a and b)."""
    a, b = np.asarray([x for x in a if x is not None], float), np.asarray([x for x in b if x is not None], float)
    if a.size == 0 or b.size == 0:
        return {"difference": None, "ci95": None, "excludes_0": None, "n": [int(a.size), int(b.size)]}
    rng = np.random.default_rng(seed)
    ra = a[rng.integers(a.size, size=(n, a.size))]
    rb = b[rng.integers(b.size, size=(n, b.size))]
    ci95, excludes_0 = _interval(np.apply_along_axis(stat, 1, ra) - np.apply_along_axis(stat, 1, rb))
    return {"difference": float(stat(a) - stat(b)), "ci95": ci95, "excludes_0": excludes_0,
            "n": [int(a.size), int(b.size)]}


def _interval(resampled: np.ndarray) -> tuple[list[float], bool]:
    """The percentile-bootstrap 95% interval of a statistic's resampled values, and whether it excludes 0."""
    low, high = (float(x) for x in np.percentile(resampled, [2.5, 97.5]))
    return [low, high], bool(low > 0 or high < 0)


def paired_difference(a: dict[int, float | None], b: dict[int, float | None], n: int = 10000,
                      seed: int = 0) -> dict[str, Any]:
    """Per-seed differences a[s] − b[s] over the seeds both have a value for (`a`, `b`: seed -> value):
    their mean and median, the percentile-bootstrap 95% interval of the mean (seeds resampled with
    replacement), the count of positive / negative ones and the Wilcoxon signed-rank test's two-sided
    p (None below 2 seeds or when every difference is 0)."""
    seeds = sorted(s for s in a if s is not None and a[s] is not None and b.get(s) is not None)
    d = np.asarray([float(a[s]) - float(b[s]) for s in seeds])
    out: dict[str, Any] = {"seeds": seeds, "n": len(seeds), "mean": None, "median": None, "ci95_mean": None,
                           "excludes_0": None, "positive": int((d > 0).sum()), "negative": int((d < 0).sum()),
                           "wilcoxon_p": None}
    if d.size == 0:
        return out
    rng = np.random.default_rng(seed)
    ci95, excludes_0 = _interval(d[rng.integers(d.size, size=(n, d.size))].mean(axis=1))
    out.update(mean=float(d.mean()), median=float(np.median(d)), ci95_mean=ci95, excludes_0=excludes_0)
    if d.size >= 2 and np.any(d != 0):
        from scipy.stats import wilcoxon  # scipy comes with scikit-learn (the bench and search extras)

        out["wilcoxon_p"] = float(wilcoxon(d).pvalue)
    return out


def complete_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs that finished with a curve (a failed or partial run carries "error")."""
    return [r for r in runs if r.get("curve") and "error" not in r]


def target_hold(runs: list[dict[str, Any]], target: float) -> dict[str, int]:
    """Of a strategy's complete runs: how many reached the target, how many of those held it (no later
    curve point below it) and how many ended at or above it. A final best below a reached target is a
    best member that fell after its peak; the counts say whether a strategy loses the target late."""
    curves = [[p[2] for p in r["curve"]] for r in complete_runs(runs)]
    reached = [c[next(i for i, best in enumerate(c) if best >= target):] for c in curves if max(c) >= target]
    return {"runs": len(curves), "reached": len(reached), "held": sum(min(c) >= target for c in reached),
            "final_at_target": sum(c[-1] >= target for c in curves)}


def compare(strategies: dict[str, list[dict[str, Any]]], budget: float, reference: str = "evo",
            floor: float = 0.0) -> dict[str, Any]:
    """For each peer: evo's (`reference`'s) median minus the peer's, with bootstrap 95% intervals, of
    the final best, the area under best-so-far vs steps (horizon: the budget) and vs seconds
    (horizon: the longest run's last point over all strategies, so a slow run is charged its time).
    `auc_seconds_seed` is the area vs seconds to the longest run's last point *of the run's seed*: seeds
    run on machines of different speeds (another session) then pool, where one global horizon would
    score the fast machine's runs mostly on their final value. `auc_seconds_reports` is the area vs seconds
    of each curve thinned to `REPORTS` points (`at_reports`), so a strategy that evaluates more often is
    not ahead for its extra draws alone."""
    runs_ok = [r for runs in strategies.values() for r in complete_runs(runs)]
    seed_horizon: dict[Any, float] = {}
    for r in runs_ok:
        seed_horizon[r.get("seed")] = max(seed_horizon.get(r.get("seed"), 0.0), max(float(p[1]) for p in r["curve"]))
    horizon_s = max(seed_horizon.values(), default=0.0)
    # the shared window: from the latest first point of any run, so every run's best-so-far there is
    # measured, not the floor — a strategy whose first report comes later is not charged the floor
    # for that gap (on randomwalks that gap alone made the plain areas differ "significantly")
    start = [max((min(float(p[axis]) for p in r["curve"]) for r in runs_ok), default=0.0) for axis in (0, 1)]
    per: dict[str, dict[str, list[float | None]]] = {}
    seeds: dict[str, list[int | None]] = {}
    for name, runs in strategies.items():
        done = complete_runs(runs)
        seeds[name] = [r.get("seed") for r in done]
        per[name] = {"final_best": [r.get("final_best") for r in done],
                     "auc_steps": [auc(r["curve"], 0, budget, floor) for r in done],
                     "auc_seconds": [auc(r["curve"], 1, horizon_s, floor) for r in done],
                     "auc_steps_shared": [auc(r["curve"], 0, budget, floor, start[0]) for r in done],
                     "auc_seconds_shared": [auc(r["curve"], 1, horizon_s, floor, start[1]) for r in done],
                     "auc_seconds_seed": [auc(r["curve"], 1, seed_horizon[r.get("seed")], floor) for r in done],
                     "auc_seconds_reports": [auc(at_reports(r["curve"], budget), 1, horizon_s, floor) for r in done]}
    out: dict[str, Any] = {"horizon_seconds": horizon_s, "shared_window_start": {"steps": start[0], "seconds": start[1]},
                           "per_strategy": {
        name: {k: (float(np.median([x for x in v if x is not None])) if any(x is not None for x in v) else None)
               for k, v in m.items()} for name, m in per.items()}}
    if reference not in per:
        return out
    for peer in per:
        if peer == reference:
            continue
        out[f"{reference}-{peer}"] = {k: bootstrap_difference(per[reference][k], per[peer][k])
                                      for k in per[reference]}
        out[f"{reference}-{peer}"]["paired"] = {
            k: paired_difference(dict(zip(seeds[reference], per[reference][k])), dict(zip(seeds[peer], per[peer][k])))
            for k in per[reference]}
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}
