"""Each shipped agent through the real `evo` command: run → leaderboard → export → agents.load.

Budgets are tiny (this checks the plumbing, not learning; the agents' own suites and benchmarks
cover learning). The shipped experiment files are the starting point, so they stay valid.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomli_w
import tomllib

import agents
from tests.conftest import REPO, run_evo

TINY = {
    "cartpole_efficientzero": {
        "population": {"size": 2, "generations": 2, "steps_per_generation": 48},
        "agent.task": {"num_envs": 2, "eval_episodes": 1, "min_replay": 16},
        "agent.hparams": {"batch_size": 32, "num_simulations": {"value": 4, "min": 2, "max": 8, "kind": "int"}},
    },
    "randomwalks_ilql": {
        "population": {"size": 2, "generations": 2, "steps_per_generation": 3},
        "agent.task": {"eval_samples": 1, "eval_bc": False},
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


@pytest.mark.parametrize("name", sorted(TINY))
def test_agent_population_end_to_end_inline(tmp_path: Path, name: str) -> None:
    tiny_experiment(name, tmp_path, "inline")
    proc = run_evo(["run", f"{name}.toml"], tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads(run_evo(["leaderboard", name, "--format", "json"], tmp_path, check=True).stdout)
    assert len(rows) == 2 and rows[0]["fitness"] >= rows[1]["fitness"]
    out = tmp_path / "export"
    run_evo(["export", name, "--out", str(out)], tmp_path, check=True)
    agent = agents.load(out)
    assert agent.index == rows[0]["member"] and agent.hparams == rows[0]["hparams"]
    assert isinstance(agent.evaluate().fitness, float)


def test_efficientzero_population_on_ray_shares_one_replay_service(tmp_path: Path) -> None:
    name = "cartpole_efficientzero"
    tiny_experiment(name, tmp_path, "ray")
    proc = run_evo(["run", f"{name}.toml"], tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads(run_evo(["leaderboard", name, "--format", "json"], tmp_path, check=True).stdout)
    assert len(rows) == 2
    out = tmp_path / "export"
    run_evo(["export", name, "--out", str(out)], tmp_path, check=True)
    assert agents.load(out).index == rows[0]["member"]
