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


def test_a_unique_best_consumes_no_random_draw() -> None:
    """Only ties draw from the generator, so a run without ties keeps the same streams."""
    rng, twin = np.random.default_rng(2), np.random.default_rng(2)
    assert argmax_tiebreak([0.1, 0.7, 0.3], rng) == 1
    assert rng.random() == twin.random()


def test_a_tie_of_two_is_broken_both_ways() -> None:
    assert {argmax_tiebreak([2.0, 0.0, 2.0], np.random.default_rng(s)) for s in range(40)} == {0, 2}


def test_ties_inside_tournaments_are_broken_by_the_rng() -> None:
    """Equal fitness everywhere: every tournament is a tie, and the winners vary with the seed."""
    winners = set()
    for s in range(10):
        _, parents = tournament_select([1.0] * 4, 4, 2, False, np.random.default_rng(s))
        winners.update(parents)
    assert winners == {0, 1, 2, 3}


def test_one_child_with_elitism_is_the_elite_alone() -> None:
    assert tournament_select([0.3, 0.9, 0.1], 1, 2, True, np.random.default_rng(0)) == (1, [])


def test_a_population_of_one_selects_itself() -> None:
    assert tournament_select([0.5], 3, 1, True, np.random.default_rng(0)) == (0, [0, 0])


def test_a_tournament_of_one_is_a_uniform_draw() -> None:
    counts = np.zeros(4)
    rng = np.random.default_rng(0)
    for _ in range(100):
        _, parents = tournament_select([4.0, 3.0, 2.0, 1.0], 5, 1, False, rng)
        np.add.at(counts, parents, 1)
    assert np.all(np.abs(counts / counts.sum() - 0.25) < 0.05)  # fitness plays no part


@pytest.mark.parametrize("fitness, size, message", [
    ([], 1, "cannot select from an empty population"),
    ([1.0, 2.0], 3, "tournament_size: expected 1..2, found 3"),
    ([1.0, 2.0], 0, "tournament_size: expected 1..2, found 0"),
])
def test_bad_input_is_refused_with_what_was_expected(fitness, size, message) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        tournament_select(fitness, 2, size, True, np.random.default_rng(0))


def test_failed_members_are_never_elite_nor_parents() -> None:
    """Members marked not eligible (failed this generation) lose their slots even with the best fitness."""
    fit = [9.0, 1.0, 8.0, 2.0, 3.0]
    eligible = [False, True, False, True, True]
    rng = np.random.default_rng(0)
    chosen = set()
    for _ in range(50):
        elite, parents = tournament_select(fit, 5, 2, True, rng, eligible=eligible)
        assert elite == 4 and len(parents) == 4
        chosen.update(parents)
    assert chosen == {3, 4}  # pairs of the eligible 1, 3, 4: member 1 never wins one


def test_tournaments_shrink_to_the_eligible_members() -> None:
    """Tournament size 4 over 2 eligible members: each tournament is both of them, so the better wins."""
    elite, parents = tournament_select([5.0, 1.0, 2.0, 3.0], 4, 4, False, np.random.default_rng(0),
                                       eligible=[False, True, False, True])
    assert elite is None and parents == [3, 3, 3, 3]


def test_all_eligible_selects_as_without_a_mask() -> None:
    fit = [0.5, 0.1, 0.9, 0.4]
    assert (tournament_select(fit, 4, 2, True, np.random.default_rng(7), eligible=[True] * 4)
            == tournament_select(fit, 4, 2, True, np.random.default_rng(7)))


def test_every_member_failed_is_an_error() -> None:
    with pytest.raises(ValueError, match="^cannot select: every member failed$"):
        tournament_select([1.0, 2.0], 2, 2, True, np.random.default_rng(0), eligible=[False, False])
