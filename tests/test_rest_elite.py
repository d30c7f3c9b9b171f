"""`selection.rest_elite` (docs/experiments.md): of a generation's members that survive into the
next, the one with the best last evaluation is evaluated there without training, until another
member evaluates higher; its clones train on. Each backend's part (a member given 0 steps is
evaluated untrained) is in the scheduler contract (evo/testing/scheduler_contract.py); the engine
test runs the real `evo` command with the shipped CartPole EfficientZero file, and resumes it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import tomllib

from evo.runstore import RunStore
from evo.scheduler.base import steps_of_members
from evo.spec import ExperimentSpec
from tests.conftest import REPO, small_cartpole_truncation_run


def test_steps_per_member_are_checked() -> None:
    assert steps_of_members(np.int64(7), 2) == [7, 7]
    assert steps_of_members((3, 0), 2) == [3, 0]
    with pytest.raises(ValueError, match="expected 3 counts"):
        steps_of_members([1, 2], 3)
    with pytest.raises(ValueError, match="none negative"):
        steps_of_members([1, -1], 2)
    assert steps_of_members([4, 4], 2, in_step=True) == [4, 4]
    with pytest.raises(ValueError, match="fused members train in step"):
        steps_of_members([4, 0], 2, in_step=True)


def _cartpole() -> dict:
    data = tomllib.loads((REPO / "experiments" / "cartpole_efficientzero.toml").read_text())
    data["selection"] = {**data.get("selection", {}), "rest_elite": True}
    return data


def test_rest_elite_needs_synchronous_unfused_generations() -> None:
    data = _cartpole()
    ExperimentSpec.model_validate(data)
    for key, value in (("population", {"mode": "async"}), ("resources", {"fused": True})):
        bad = _cartpole()
        bad[key] = {**bad.get(key, {}), **value}
        with pytest.raises(ValueError, match="selection.rest_elite"):
            ExperimentSpec.model_validate(bad)


def test_rest_from_needs_rest_elite_and_a_finite_score() -> None:
    data = _cartpole()
    data["selection"]["rest_from"] = 500
    assert ExperimentSpec.model_validate(data).selection.rest_from == 500.0
    data["selection"]["rest_elite"] = False
    with pytest.raises(ValueError, match="selection.rest_from: expected selection.rest_elite = true"):
        ExperimentSpec.model_validate(data)
    for bad in (math.nan, math.inf, "max"):
        data = _cartpole()
        data["selection"]["rest_from"] = bad
        with pytest.raises(ValueError, match="rest_from"):
            ExperimentSpec.model_validate(data)


def test_a_run_rests_its_elite_and_a_resumed_run_rests_the_same_member(tmp_path: Path) -> None:
    """The real `evo` command, CartPole EfficientZero inline, truncation selection: from generation 1 on,
    exactly the surviving member with the best last evaluation of the generation before rests. Its counters do not
    move, its (deterministic) evaluation repeats its fitness, its round spends no env steps, and a
    resumed run rests the member the interrupted one would have."""
    small_cartpole_truncation_run(tmp_path, 5, selection={"rest_elite": True})

    store = RunStore.open("cartpole_efficientzero", tmp_path / "runs")
    try:
        boards = [store.evaluations(g) for g in range(3)]
        spent = store.spent()
    finally:
        store.close()
    assert not any(row["train_metrics"].get("rested") for row in boards[0])  # generation 0: everyone trains
    for g in (1, 2):  # generation 2 ran after the resume
        present = {row["index"] for row in boards[g]}
        expected = min((row for row in boards[g - 1] if row["index"] in present),
                       key=lambda row: (-row["fitness"], row["index"]))["index"]
        rested = [row for row in boards[g] if row["train_metrics"].get("rested")]
        assert [row["index"] for row in rested] == [expected]
        previous = next(row for row in boards[g - 1] if row["index"] == expected)
        # the counters its evaluation reports did not move: not one env step or gradient update
        for counter in ("env_steps", "updates"):
            assert rested[0]["metrics"][counter] == previous["metrics"][counter] > 0
        assert math.isclose(rested[0]["fitness"], previous["fitness"])
        trained = [row for row in boards[g] if not row["train_metrics"].get("rested")]
        assert trained and all(row["train_metrics"]["env_steps"] > 0 for row in trained)
    # three members' rounds in generation 0, two in each of the two after (one rests): 7 rounds of 160
    assert spent.env_steps == pytest.approx(7 * 160, abs=2 * 7)


def test_the_member_that_rests_is_the_survivor_with_the_best_last_evaluation() -> None:
    from types import SimpleNamespace

    from evo.population import resting_member

    def members(*indices: int) -> list:
        return [SimpleNamespace(index=i) for i in indices]

    # scores over a fitness window of 2: member 2 just went from 12 to 500, so it scores 256 and
    # member 1 (290) is first by score; it is member 2's weights that evaluated at 500, so they rest
    board = [{"index": 1, "score": 290.0, "fitness": 305.0}, {"index": 2, "score": 256.0, "fitness": 500.0},
             {"index": 0, "score": 20.0, "fitness": 39.0}]
    assert resting_member(board, members(0, 1, 2)) == 2
    assert resting_member(board, members(0, 1, 5)) == 1  # member 2 was replaced: the best survivor rests
    assert resting_member(board, members(5, 6)) is None  # no survivor
    assert resting_member([], members(0, 1, 2)) is None  # generation 0 (no generation before): everyone trains
    tie = [{"index": 3, "score": 500.0, "fitness": 500.0}, {"index": 1, "score": 480.0, "fitness": 500.0},
           {"index": 4, "score": -math.inf, "fitness": -math.inf}]
    assert resting_member(tie, members(1, 3, 4)) == 1  # a tie goes to the lowest index; a failed member never rests


def test_with_rest_from_only_a_member_at_that_score_rests() -> None:
    """`selection.rest_from`: until a survivor's last evaluation reaches the score, every member trains;
    from then on the best survivor at or above it rests, as without the threshold."""
    from types import SimpleNamespace

    from evo.population import resting_member

    def members(*indices: int) -> list:
        return [SimpleNamespace(index=i) for i in indices]

    board = [{"index": 0, "score": 480.0, "fitness": 499.0}, {"index": 1, "score": 300.0, "fitness": 320.0}]
    assert resting_member(board, members(0, 1), rest_from=500.0) is None  # 499 < 500: everyone trains
    assert resting_member(board, members(0, 1), rest_from=499.0) == 0     # reached, not only passed
    assert resting_member(board, members(0, 1), rest_from=None) == 0
    at = [{"index": 3, "score": 400.0, "fitness": 500.0}, {"index": 1, "score": 490.0, "fitness": 499.5}]
    assert resting_member(at, members(1, 3), rest_from=500.0) == 3
    assert resting_member(at, members(1, 4), rest_from=500.0) is None     # the one at 500 was replaced


def test_a_run_with_rest_from_trains_everyone_until_a_member_reaches_it(tmp_path: Path) -> None:
    """The real `evo` command and its resume: with a score no member reaches, no member ever rests and every
    round trains (the run is the one without rest_elite). Without the score the same run rests a member from
    generation 1 on (the test above)."""
    (tmp_path / "never").mkdir()
    small_cartpole_truncation_run(tmp_path / "never", 5, selection={"rest_elite": True, "rest_from": 1e9})
    store = RunStore.open("cartpole_efficientzero", tmp_path / "never" / "runs")
    try:
        boards = [store.evaluations(g) for g in range(3)]
        spent = store.spent()
    finally:
        store.close()
    assert not any(row["train_metrics"].get("rested") for board in boards for row in board)
    assert spent.env_steps == pytest.approx(9 * 160, abs=2 * 9)  # 3 members × 3 generations, all trained
