"""benchmarks.breakout_plateau: the scripted tracking policy reads MinAtar Breakout's channels right and
beats random by far; a run's elite searched with ties broken by lowest index plays exactly what the
run's own evaluation plays on the same starts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("minatar")

import evo
from benchmarks import breakout_plateau as bp
from tests.conftest import REPO


def _frame(paddle_col: int, ball_col: int | None) -> np.ndarray:
    obs = np.zeros((4, 10, 10), dtype=np.uint8)
    obs[bp.PADDLE, 9, paddle_col] = 255
    if ball_col is not None:
        obs[bp.BALL, 5, ball_col] = 255
    return obs


def test_tracking_moves_toward_the_ball_and_stays_when_level_or_ball_gone() -> None:
    assert bp.tracking_action(_frame(5, 2)) == bp.LEFT
    assert bp.tracking_action(_frame(5, 8)) == bp.RIGHT
    assert bp.tracking_action(_frame(5, 5)) == bp.NONE
    assert bp.tracking_action(_frame(5, None)) == bp.NONE


def test_tracking_scores_far_above_random_on_the_same_starts() -> None:
    rng = np.random.default_rng(0)
    tracking = bp.play_scripted(bp.tracking_action, 10, 1000)
    random = bp.play_scripted(lambda obs: int(rng.integers(3)), 10, 1000)
    assert tracking["episodes"] == random["episodes"] == 10
    assert tracking["mean"] > 3 * max(random["mean"], 0.5) and tracking["length"] > 3 * random["length"]
    assert bp.play_scripted(bp.tracking_action, 10, 1000) == tracking  # seeded starts: repeatable


def test_ties_break_by_lowest_index_prior_or_at_random_and_only_ties_move() -> None:
    visits = np.array([[3, 3, 2], [1, 5, 2]])
    prior = np.array([[0.1, 0.6, 0.3], [0.9, 0.05, 0.05]])
    rng = np.random.default_rng(0)
    assert bp.tie_broken_argmax(visits, prior, "lowest_index", rng).tolist() == [0, 1]
    assert bp.tie_broken_argmax(visits, prior, "prior", rng).tolist() == [1, 1]  # row 2 has no tie: the prior cannot move it
    draws = np.array([bp.tie_broken_argmax(visits, prior, "random", rng) for _ in range(200)])
    assert set(draws[:, 0]) == {0, 1} and set(draws[:, 1]) == {1}
    with pytest.raises(ValueError, match="rule"):
        bp.tie_broken_argmax(visits, prior, "highest_index", rng)


@pytest.fixture(scope="module")
def breakout_run(tmp_path_factory: pytest.TempPathFactory) -> evo.Run:
    overrides = {"backend": "inline", "population.size": 2, "population.generations": 1,
                 "population.steps_per_generation": 64, "selection.tournament_size": 1,
                 "agent.task.eval_episodes": 3, "agent.task.eval_max_steps": 40, "agent.task.min_replay": 32,
                 "agent.task.num_envs": 4}
    runs = tmp_path_factory.mktemp("plateau") / "runs"
    return evo.run(REPO / "experiments" / "suite" / "minatar_breakout.toml", runs_dir=runs, overrides=overrides,
                   quiet=True)


def test_lowest_index_ties_replay_the_runs_own_evaluation(breakout_run: evo.Run) -> None:
    ties = bp.elite_ties(breakout_run.path, 8, 1000)
    own = breakout_run.evaluate(episodes=8, seed=1000)
    assert ties["lowest_index"]["eval_return"] == own["fitness"]
    assert ties["lowest_index"]["eval_length"] == own["metrics"]["eval_length"]
    other = breakout_run.evaluate(episodes=8, seed=1003)
    assert bp.elite_ties(breakout_run.path, 8, 1003)["lowest_index"]["eval_return"] == other["fitness"]
    # a barely trained member ties on most moves, so breaking them at random plays other episodes
    assert ties["lowest_index"]["tied_share"] > 0.5
    assert ties["random"]["eval_length"] != ties["lowest_index"]["eval_length"]
    for rule in bp.RULES:
        assert 0.0 <= ties[rule]["tied_share"] <= 1.0 and 0 < ties[rule]["eval_length"] <= 40


def test_the_command_writes_its_json_and_refuses_no_episodes(tmp_path: Path, breakout_run: evo.Run) -> None:
    out = bp.main(["--run", str(breakout_run.path), "--episodes", "2", "--json", str(tmp_path / "p.json")])
    assert json.loads((tmp_path / "p.json").read_text()) == json.loads(json.dumps(out))
    assert set(out) >= {"tracking", "random", "elite", "loadavg", "run_seed"}
    with pytest.raises(SystemExit):
        bp.main(["--episodes", "0", "--json", str(tmp_path / "q.json")])


def test_tie_breaks_move_only_tied_rows() -> None:
    from benchmarks.greedy_play import tie_break_scores, tied_rows

    visits = np.array([[2, 2, 2, 1, 1], [4, 1, 1, 1, 1], [0, 3, 3, 2, 0]])
    prior = np.array([[0.1, 0.2, 0.5, 0.1, 0.1], [0.1, 0.6, 0.1, 0.1, 0.1], [0.2, 0.4, 0.1, 0.2, 0.1]])
    assert tied_rows(visits).tolist() == [True, False, True]
    rng = np.random.default_rng(0)
    assert tie_break_scores(visits, prior, "lowest_index", rng).argmax(1).tolist() == [0, 0, 1]
    assert tie_break_scores(visits, prior, "prior", rng).argmax(1).tolist() == [2, 0, 1]
    drawn = np.array([tie_break_scores(visits, prior, "random", rng).argmax(1) for _ in range(300)])
    assert set(drawn[:, 0]) == {0, 1, 2} and set(drawn[:, 1]) == {0} and set(drawn[:, 2]) == {1, 2}
    with pytest.raises(ValueError, match="rule"):
        tie_break_scores(visits, prior, "first", rng)
