"""benchmarks.suite_extend: a finished suite run carried on past its budget, and its report."""

from __future__ import annotations

import json

import pytest

from benchmarks import suite, suite_extend


def tiny_run(tmp_path):
    """A real, finished CartPole run of the suite's file, shrunk as `--quick` shrinks its population and task."""
    from evo.api import run

    overrides = {f"population.{k}": v for k, v in suite.QUICK["population"].items()}
    overrides |= {f"agent.task.{k}": v for k, v in suite.QUICK["task"].items()}
    overrides |= {"population.generations": 1, "backend": "inline"}
    return run(suite.ROOT / suite.TASKS["cartpole"]["file"], overrides=overrides, runs_dir=tmp_path,
               name="cartpole_s0", quiet=True)


def test_extends_a_finished_run_and_reports_every_generation(tmp_path):
    tiny_run(tmp_path)
    out = tmp_path / "ext.json"
    report = suite_extend.main(["cartpole_s0", "--runs-dir", str(tmp_path), "--generations", "2",
                                "--heldout-episodes", "2", "--json", str(out)])
    assert report == json.loads(out.read_text())
    assert report["generations_before"] == 1 and report["generations"] == 2
    steps = report["env_steps_per_generation"]
    assert steps == 2 * 64 and [p[0] for p in report["curve"]] == [steps, 2 * steps]
    assert len(report["train_return"]) == 2 and len(report["x_random"]) == 2
    assert report["random"]["episodes"] * report["random"]["repeats"] == 10 * suite.RANDOM_REPEATS  # >= 10 starts
    assert report["x_random"][-1] == round(report["curve"][-1][1] / report["random"]["mean"], 2)
    held = report["heldout"]
    assert held["episodes"] == 2 and held["last_elite"]["generation"] == 1
    # the store now says 2 generations, so asking again for 2 only reports
    again = suite_extend.main(["cartpole_s0", "--runs-dir", str(tmp_path), "--generations", "2",
                               "--heldout-episodes", "2", "--json", str(out)])
    assert again["generations_before"] == 2 and again["curve"] == report["curve"]


def test_refuses_a_missing_run_and_bad_generations(tmp_path):
    with pytest.raises(SystemExit, match="no RunStore"):
        suite_extend.main(["nothing_here", "--runs-dir", str(tmp_path), "--generations", "3", "--json",
                           str(tmp_path / "x.json")])
    with pytest.raises(SystemExit):
        suite_extend.main(["nothing_here", "--runs-dir", str(tmp_path), "--generations", "0", "--json",
                           str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()
