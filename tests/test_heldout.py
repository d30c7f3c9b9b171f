"""Held-out evaluation of a run's kept checkpoints (evo/heldout.py): `Run.evaluate`, `evo evaluate`
and `evo export --best`. A real EfficientZero run on CartPole (inline, tiny) for the seed and
episode plumbing; the toy run of tests/test_cli.py's kind for the command line."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

import evo
from evo.cli import main
from evo.heldout import HELDOUT_SEED_OFFSET
from tests.conftest import REPO, TOY_EXPERIMENT, run_evo

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


# ---- the command line, on the toy agent (its evaluation has no episodes and no seed) ----------------
@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("heldout_cli")
    shutil.copy(TOY_EXPERIMENT, cwd / "toy.toml")
    run_evo(["run", "toy.toml", "--name", "ref", "--backend", "inline"], cwd, check=True)
    return cwd


def _evo(args: list[str], cwd: Path, capsys, monkeypatch) -> tuple[int, str, str]:
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_evo_evaluate_prints_the_fresh_and_the_recorded_fitness(toy: Path, capsys, monkeypatch) -> None:
    code, out, err = _evo(["evaluate", "ref", "--format", "json"], toy, capsys, monkeypatch)
    assert code == 0, err
    result = json.loads(out)
    assert result["generation"] == 2 and result["episodes"] is None and result["seed"] == 7 + HELDOUT_SEED_OFFSET
    assert result["fitness"] == pytest.approx(result["run_fitness"], abs=1e-7)  # the toy ignores the seed
    code, out, _ = _evo(["evaluate", "ref", "--best"], toy, capsys, monkeypatch)
    with sqlite3.connect(toy / "runs" / "ref" / "run.sqlite") as db:
        idx, generation, score = db.execute("SELECT idx, generation, score FROM evaluations WHERE checkpoint IS NOT NULL "
                                            "ORDER BY score DESC, generation DESC LIMIT 1").fetchone()
    assert code == 0 and out.startswith(f"member {idx} (generation {generation}): fitness ")
    assert f"the run scored it {score:.4g}" in out


def test_evo_evaluate_refuses_bad_input_with_exit_2(toy: Path, capsys, monkeypatch) -> None:
    code, _, err = _evo(["evaluate", "ref", "--episodes", "5"], toy, capsys, monkeypatch)
    assert code == 2 and "has no eval_episodes to set" in err
    code, _, err = _evo(["evaluate", "ref", "--member", "999"], toy, capsys, monkeypatch)
    assert code == 2 and "no such member" in err
    code, _, err = _evo(["evaluate", "nope"], toy, capsys, monkeypatch)
    assert code == 2 and "no run 'nope'" in err
    with pytest.raises(SystemExit) as info:
        _evo(["evaluate", "ref", "--best", "--generation", "0"], toy, capsys, monkeypatch)
    assert info.value.code == 2


def test_evo_export_best_writes_the_best_checkpoint(toy: Path, capsys, monkeypatch) -> None:
    with sqlite3.connect(toy / "runs" / "ref" / "run.sqlite") as db:
        idx, generation = db.execute("SELECT idx, generation FROM evaluations WHERE checkpoint IS NOT NULL "
                                     "ORDER BY score DESC, generation DESC LIMIT 1").fetchone()
    code, out, err = _evo(["export", "ref", "--best", "--out", str(toy / "best")], toy, capsys, monkeypatch)
    assert code == 0, err
    assert out.startswith(f"exported member {idx} (generation {generation},")
    assert json.loads((toy / "best" / "config.json").read_text())["info"]["generation"] == generation
