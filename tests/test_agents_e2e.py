"""Each shipped agent through the real `evo` command: run → leaderboard → export → agents.load.

Budgets are tiny: this checks the plumbing (tests/efficientzero/test_learning.py and
tests/ilql/test_learning.py check learning). The shipped experiment files are the starting point,
so they stay valid. Runs use a non-zero seed because evaluation seeds derive from the run seed:
with seed 0 an export that lost the seed would still evaluate as in the run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomli_w
import tomllib
import torch

import agents
from evo.cli import main
from evo.replay.snapshot import read_snapshot
from evo.runstore import RunStore
from tests.conftest import REPO, run_evo

SEED = 5

TINY = {
    "cartpole_efficientzero": {
        "population": {"size": 2, "generations": 2, "steps_per_generation": 48},
        "agent.task": {"num_envs": 2, "eval_episodes": 8, "min_replay": 16},
        "agent.hparams": {"batch_size": 32, "num_simulations": {"value": 4, "min": 2, "max": 8, "kind": "int"}},
    },
    "randomwalks_ilql": {
        "population": {"size": 2, "generations": 2, "steps_per_generation": 3},
        # sampled decoding (top_k 0): the fitness depends on the evaluation's random stream
        "agent.task": {"eval_samples": 1, "eval_bc": False, "eval_top_k": 0},
        "agent.hparams": {"batch_size": 16},
    },
}


def tiny_experiment(name: str, directory: Path, backend: str) -> Path:
    data = tomllib.loads((REPO / "experiments" / f"{name}.toml").read_text())
    for section, values in TINY[name].items():
        target = data
        for part in section.split("."):
            target = target.setdefault(part, {})
        target.update(values)
    data["backend"] = backend
    data["mutation"].update({"architecture": 0.4, "no_mutation": 0.1})
    path = directory / f"{name}.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def leaderboard(name: str, cwd: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    assert main(["leaderboard", name, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", sorted(TINY))
def test_exported_elite_evaluates_exactly_as_in_the_run(tmp_path: Path, name: str, capsys, monkeypatch) -> None:
    tiny_experiment(name, tmp_path, "inline")
    proc = run_evo(["run", f"{name}.toml", "--seed", str(SEED)], tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = leaderboard(name, tmp_path, capsys, monkeypatch)
    assert len(rows) == 2 and rows[0]["score"] >= rows[1]["score"]
    out = tmp_path / "export"
    assert main(["export", name, "--out", str(out)]) == 0  # in-process: the same code as the command
    assert json.loads((out / "config.json").read_text())["seed"] == SEED
    agent = agents.load(out)  # nothing but the exported directory
    assert agent.index == rows[0]["member"] and agent.hparams == rows[0]["hparams"] and agent.context.seed == SEED
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the inline run evaluated (cpus_per_member = 1)
    try:
        assert agent.evaluate().fitness == rows[0]["fitness"]  # the leaderboard's last single evaluation
        assert agent.evaluate().fitness == rows[0]["fitness"]  # and evaluating changes nothing
    finally:
        torch.set_num_threads(threads)


def test_efficientzero_population_on_ray_shares_one_replay_service(tmp_path: Path) -> None:
    """Every member writes to the one Ray replay service and it lives across generations: the run
    store's snapshot after generation 0 holds episodes of both founders, the one after generation 1
    still holds all of them plus the child's. (Reads go through per-member views of that service,
    docs/replay.md; the founders' gradient updates show they read their rows back.)"""
    name = "cartpole_efficientzero"
    path = tiny_experiment(name, tmp_path, "ray")
    # in-flight episodes carry over between generations: give each env enough steps (80) that every
    # founder finishes episodes (and so writes rows) in generation 0
    data = tomllib.loads(path.read_text())
    data["population"]["steps_per_generation"] = 160
    path.write_text(tomli_w.dumps(data))
    proc = run_evo(["run", f"{name}.toml", "--seed", str(SEED)], tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    store = RunStore.open(name, tmp_path / "runs")
    founders = store.evaluations(0)
    store.close()
    assert sorted(ev["index"] for ev in founders) == [0, 1]
    assert all(ev["train_metrics"]["updates"] > 0 for ev in founders)
    episodes = []
    for generation in (0, 1):
        _, _, arrays = read_snapshot(tmp_path / "runs" / name / "replay" / f"g{generation:04d}")
        episodes.append({int(e) for e in arrays["col.episode"][arrays["live"]]})
    writers = [{e >> 40 for e in eps} for eps in episodes]  # episode id = member index << 40 | counter
    assert writers[0] == {0, 1}
    assert episodes[0] <= episodes[1] and writers[1] - writers[0] == {2}  # the child, index 2, wrote too
