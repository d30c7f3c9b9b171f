"""Held-out evaluation of a run's kept checkpoints (evo/heldout.py): `Run.evaluate`, `evo evaluate`
and `evo export --best`. A real EfficientZero run on CartPole (inline, tiny) for the seed and
episode plumbing; the shared toy run (conftest `toy_runs`) for the command line."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import evo
from evo.heldout import HELDOUT_SEED_OFFSET
from tests.conftest import REPO
from tests.conftest import evo_in_process as cli

TINY_EZ = {"backend": "inline", "population.size": 2, "population.generations": 2,
           "population.steps_per_generation": 64, "selection.tournament_size": 1,
           "agent.task.eval_episodes": 3, "agent.task.eval_max_steps": 60, "agent.task.min_replay": 32,
           "agent.task.num_envs": 4, "agent.hparams.num_simulations.value": 8}


@pytest.fixture(scope="module")
def ez_run(tmp_path_factory: pytest.TempPathFactory) -> evo.Run:
    runs = tmp_path_factory.mktemp("heldout") / "runs"
    return evo.run(REPO / "experiments" / "cartpole_efficientzero.toml", runs_dir=runs, overrides=TINY_EZ, quiet=True)


def test_on_the_runs_own_starts_the_evaluation_is_the_runs(ez_run: evo.Run) -> None:
    """Rebuilt from its checkpoint and given the run seed, the elite scores exactly what the run
    recorded: the held-out evaluation evaluates the very agent the run kept."""
    board = ez_run.leaderboard()
    seed = int(ez_run.experiment()["seed"])
    same = ez_run.evaluate(seed=seed)
    assert same["member"] == board["member"][0] and same["episodes"] == 3
    assert same["fitness"] == same["run_fitness"] == board["fitness"][0]


def test_held_out_episodes_come_from_another_seed_and_repeat(ez_run: evo.Run) -> None:
    seed = int(ez_run.experiment()["seed"])
    held = ez_run.evaluate(episodes=7)
    assert held["seed"] == seed + HELDOUT_SEED_OFFSET and held["episodes"] == 7
    assert held["metrics"]["eval_length"] > 0 and held["seconds"] > 0
    assert ez_run.evaluate(episodes=7)["fitness"] == held["fitness"]  # fixed starts, greedy search: repeatable
    assert ez_run.evaluate(episodes=7, seed=seed + 1)["fitness"] != held["fitness"] or \
        ez_run.evaluate(episodes=7, seed=seed + 2)["fitness"] != held["fitness"]  # other starts, other returns


def test_best_and_generation_pick_the_checkpoint_evaluated(ez_run: evo.Run) -> None:
    with sqlite3.connect(ez_run.path / "run.sqlite") as db:
        top = db.execute("SELECT idx, generation FROM evaluations WHERE checkpoint IS NOT NULL "
                         "ORDER BY score DESC, generation DESC LIMIT 1").fetchone()
        first = db.execute("SELECT idx FROM evaluations WHERE generation = 0 ORDER BY score DESC, idx LIMIT 1").fetchone()
    best = ez_run.evaluate(best=True, episodes=2)
    assert (best["member"], best["generation"]) == tuple(top)
    assert ez_run.evaluate(generation=0, episodes=2)["member"] == first[0]
    assert ez_run.elite(best=True).index == top[0]


@pytest.mark.parametrize("episodes", [0, -3, 2.5, True])
def test_bad_episode_counts_are_refused(ez_run: evo.Run, episodes) -> None:
    with pytest.raises(ValueError, match="episodes: expected a whole number of at least 1"):
        ez_run.evaluate(episodes=episodes)


# ---- the command line, on the shared toy run (its evaluation has no episodes and no seed) -----------
def test_evo_evaluate_prints_the_fresh_and_the_recorded_fitness(toy_runs: Path, capsys, monkeypatch) -> None:
    code, out, err = cli(["evaluate", "toy", "--format", "json"], toy_runs.parent, capsys, monkeypatch)
    assert code == 0, err
    result = json.loads(out)
    assert result["generation"] == 2 and result["episodes"] is None and result["seed"] == 7 + HELDOUT_SEED_OFFSET
    assert result["fitness"] == pytest.approx(result["run_fitness"], abs=1e-7)  # the toy ignores the seed
    code, out, _ = cli(["evaluate", "toy", "--best"], toy_runs.parent, capsys, monkeypatch)
    with sqlite3.connect(toy_runs / "toy" / "run.sqlite") as db:
        idx, generation, score = db.execute("SELECT idx, generation, score FROM evaluations WHERE checkpoint IS NOT NULL "
                                            "ORDER BY score DESC, generation DESC LIMIT 1").fetchone()
    assert code == 0 and out.startswith(f"member {idx} (generation {generation}): fitness ")
    assert f"the run scored it {score:.4g}" in out


def test_evo_evaluate_refuses_bad_input_with_exit_2(toy_runs: Path, capsys, monkeypatch) -> None:
    code, _, err = cli(["evaluate", "toy", "--episodes", "5"], toy_runs.parent, capsys, monkeypatch)
    assert code == 2 and "has no eval_episodes to set" in err
    code, _, err = cli(["evaluate", "toy", "--member", "999"], toy_runs.parent, capsys, monkeypatch)
    assert code == 2 and "no such member" in err
    code, _, err = cli(["evaluate", "nope"], toy_runs.parent, capsys, monkeypatch)
    assert code == 2 and "no run 'nope'" in err
    with pytest.raises(SystemExit) as info:
        cli(["evaluate", "toy", "--best", "--generation", "0"], toy_runs.parent, capsys, monkeypatch)
    assert info.value.code == 2


def test_evo_export_best_writes_the_best_checkpoint(toy_runs: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    with sqlite3.connect(toy_runs / "toy" / "run.sqlite") as db:
        idx, generation = db.execute("SELECT idx, generation FROM evaluations WHERE checkpoint IS NOT NULL "
                                     "ORDER BY score DESC, generation DESC LIMIT 1").fetchone()
    code, out, err = cli(["export", "toy", "--best", "--out", str(tmp_path / "best")], toy_runs.parent, capsys, monkeypatch)
    assert code == 0, err
    assert out.startswith(f"exported member {idx} (generation {generation},")
    assert json.loads((tmp_path / "best" / "config.json").read_text())["info"]["generation"] == generation
