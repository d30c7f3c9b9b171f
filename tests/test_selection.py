import numpy as np
import pytest

from evo.selection import argmax_tiebreak, fitness_score, tournament_select


def test_fitness_is_mean_of_last_k() -> None:
    assert fitness_score([1.0, 2.0, 3.0, 5.0], 2) == 4.0
    assert fitness_score([1.0], 3) == 1.0
    assert fitness_score([], 3) == -np.inf


def test_elitism_always_keeps_the_best() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        fit = rng.normal(size=8)
        elite, parents = tournament_select(fit, 8, 3, True, rng)
        assert elite == int(np.argmax(fit)) and len(parents) == 7


def test_without_elitism_every_slot_is_a_tournament() -> None:
    elite, parents = tournament_select([1.0, 2.0, 3.0], 3, 2, False, np.random.default_rng(0))
    assert elite is None and len(parents) == 3


def test_tournament_of_whole_population_always_picks_the_best() -> None:
    fit = [0.1, 0.9, 0.3, 0.2]
    _, parents = tournament_select(fit, 4, 4, True, np.random.default_rng(3))
    assert parents == [1, 1, 1]


def test_worst_member_never_wins_a_tournament_of_two() -> None:
    rng = np.random.default_rng(0)
    fit = [5.0, 1.0, 3.0, 4.0, 2.0]
    for _ in range(100):
        _, parents = tournament_select(fit, 5, 2, True, rng)
        assert 1 not in parents


def test_ties_are_broken_by_the_seeded_rng_not_by_order() -> None:
    picks = {argmax_tiebreak([1.0, 1.0, 1.0, 0.0], np.random.default_rng(s)) for s in range(40)}
    assert picks == {0, 1, 2}
    assert argmax_tiebreak([1.0, 1.0], np.random.default_rng(5)) == argmax_tiebreak([1.0, 1.0], np.random.default_rng(5))


def test_selection_is_deterministic_under_a_seed() -> None:
    fit = [0.5, 0.5, 0.2, 0.9, 0.9, 0.1]
    a = tournament_select(fit, 6, 2, True, np.random.default_rng(11))
    b = tournament_select(fit, 6, 2, True, np.random.default_rng(11))
    assert a == b


def test_bad_tournament_size() -> None:
    with pytest.raises(ValueError, match="tournament_size"):
        tournament_select([1.0, 2.0], 2, 3, True, np.random.default_rng(0))
