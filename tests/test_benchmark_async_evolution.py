"""benchmarks.async_evolution: the idle/tail arithmetic and the experiments it builds (no Ray)."""

from __future__ import annotations

import math

import pytest

from benchmarks.async_evolution import _experiment, idle_stats
from evo.spec import parse_experiment


def test_idle_stats_counts_gaps_start_and_tail_per_actor() -> None:
    # actor 1: rounds 0-4 and 6-10 (a 2 s gap); actor 2: starts at 1, one round 1-7, then nothing (tail 3 s)
    spans = [(1, 0.0, 4.0), (1, 6.0, 10.0), (2, 1.0, 7.0)]
    out = idle_stats(spans)
    assert out["wall_s"] == 10.0
    assert out["member_s"] == 14.0
    assert out["idle_s"] == 2.0 + 1.0  # actor 1's gap, actor 2's late start
    assert out["tail_s"] == 3.0
    assert out["idle_fraction"] == pytest.approx(3.0 / 14.0)
    assert out["idle_with_tail_fraction"] == pytest.approx(6.0 / 14.0)
    assert out["utilisation"] == pytest.approx(14.0 / 20.0)
    assert (out["rounds"], out["actors"]) == (3, 2)


def test_idle_stats_of_no_rounds_is_empty_not_an_error() -> None:
    out = idle_stats([])
    assert out["rounds"] == 0 and out["member_s"] == 0.0 and math.isnan(out["idle_fraction"])


@pytest.mark.parametrize("agent", ["ratio_toy", "efficientzero"])
@pytest.mark.parametrize("initial", ["sample", "scratch"])
def test_experiment_takes_the_founders_regime(agent: str, initial: str) -> None:
    data = _experiment(agent, "async", size=2, generations=3, steps=100, workers=2, seed=1, initial=initial)
    exp = parse_experiment(data, "<test>")
    assert exp.population.initial == initial
    assert exp.population.mode == "async"
    assert (exp.population.size, exp.population.generations, exp.population.steps_per_generation) == (2, 3, 100)


def test_experiment_keeps_founder_lines_in_both_modes() -> None:
    for mode in ("sync", "async"):
        data = _experiment("efficientzero", mode, size=4, generations=2, steps=100, workers=2, seed=0,
                           initial="scratch", founder_lines=2)
        assert parse_experiment(data, "<test>").selection.founder_lines == 2
