"""Diversity through the real `evo` command and the run store: measured every generation, stored,
shown by `evo runs` and `evo leaderboard`, and flagged when two members are bit-identical."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch

from evo.cli import main
from evo.diversity import float_leaves, measure_diversity, parameter_digest, relative_distance
from evo.runstore import EvaluatedMember, MemberRecord, RunStore
from evo.spec import load_experiment
from tests.conftest import TOY_EXPERIMENT, run_evo


def evo(args: list[str], cwd: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> str:
    """A read-only query of a finished run, in-process (same code as the console script, no start-up)."""
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    assert main(args) == 0
    return capsys.readouterr().out


def test_every_generation_of_a_clone_only_population_is_distinct(workdir: Path, capsys, monkeypatch) -> None:
    """Every child an unmutated clone (no_mutation = 1): before issue 15 each retraced its parent
    and the population collapsed to copies; now no two members of any generation are identical."""
    toml = (workdir / "toy.toml").read_text()
    toml = toml.replace("no_mutation = 0.2", "no_mutation = 1.0").replace("architecture = 0.3", "architecture = 0.0")
    toml = toml.replace("parameters = 0.2", "parameters = 0.0").replace("activation = 0.1", "activation = 0.0")
    toml = toml.replace("rl_hp = 0.2", "rl_hp = 0.0")
    (workdir / "toy.toml").write_text(toml)
    run_evo(["run", "toy.toml", "--name", "clones", "--backend", "inline"], workdir, check=True)

    store = RunStore.open("clones", workdir / "runs")
    history = store.diversity_history()
    kinds = {r[0] for r in sqlite3.connect(store.path / "run.sqlite").execute("SELECT kind FROM mutations")}
    assert kinds == {"no_mutation"}, "the scenario needs unmutated children"
    assert sorted(history) == [0, 1, 2]
    for generation, d in history.items():
        assert (d.members, d.distinct, d.identical) == (4, 4, []), f"generation {generation}: {d.summary()}"
        assert 0 < d.mean_distance < math.sqrt(2)
        trained = {ev["index"] for ev in store.evaluations(generation)}
        assert set(d.digests) == trained
    store.close()

    rows = json.loads(evo(["leaderboard", "clones", "--format", "json"], workdir, capsys, monkeypatch))
    assert all(r["identical_to"] == [] and r["distinct_members"] == 4 for r in rows)
    assert len({r["param_digest"] for r in rows}) == 4
    assert "diversity 4/4 distinct" in evo(["leaderboard", "clones"], workdir, capsys, monkeypatch)
    assert "4/4 distinct" in evo(["runs"], workdir, capsys, monkeypatch)


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"net": {"w": torch.randn(4, 3, generator=g), "b": torch.zeros(3)},
            "rng": {"torch": torch.zeros(8, dtype=torch.uint8)}, "steps": 5}


def _commit_twins(runs: Path) -> RunStore:
    """A run whose generation 0 holds members 0 and 1 with the same weights (different RNG states)."""
    exp, text = load_experiment(TOY_EXPERIMENT)
    store = RunStore.create(runs, "twins", text, exp.to_json())
    twin = _state(0)
    twin["rng"]["torch"] = torch.ones(8, dtype=torch.uint8)
    states = {0: _state(0), 1: twin, 2: _state(2)}
    evaluated = [EvaluatedMember(MemberRecord(i, None, 0, None, {}, {}, [float(-i)]), float(-i), float(-i), {}, {}, s)
                 for i, s in states.items()]
    store.save_initial_population([(ev.record, ev.state) for ev in evaluated])
    store.commit_generation(0, evaluated, [], 0.0, diversity=measure_diversity(states))
    return store


def test_identical_members_are_flagged_by_runs_and_leaderboard(tmp_path: Path, capsys, monkeypatch) -> None:
    _commit_twins(tmp_path / "runs").close()
    rows = json.loads(evo(["leaderboard", "twins", "--format", "json"], tmp_path, capsys, monkeypatch))
    assert {r["member"]: r["identical_to"] for r in rows} == {0: [1], 1: [0], 2: []}
    assert all(r["distinct_members"] == 2 for r in rows)
    table = evo(["leaderboard", "twins"], tmp_path, capsys, monkeypatch)
    assert "2/3 distinct" in table and "IDENTICAL: 0=1" in table
    assert "IDENTICAL: 0=1" in evo(["runs"], tmp_path, capsys, monkeypatch)


def test_runs_from_before_the_measurement_read_as_unmeasured(tmp_path: Path, capsys, monkeypatch) -> None:
    store = _commit_twins(tmp_path / "runs")
    store._db.execute("DROP TABLE diversity")
    assert store.diversity() is None and store.diversity_history() == {}
    assert "identical_to" not in json.loads(evo(["leaderboard", "twins", "--format", "json"], tmp_path, capsys, monkeypatch))[0]
    again = EvaluatedMember(MemberRecord(0, None, 0, None, {}, {}, [0.0, 0.0]), 0.0, 0.0, {}, {}, _state(0))
    store.commit_generation(1, [again], [], 0.0, diversity=measure_diversity({0: _state(0)}))  # the table comes back
    assert store.diversity(1).distinct == 1
    store.close()


def test_digest_covers_float_leaves_only_and_distance_is_scale_free() -> None:
    a, b = _state(0), _state(0)
    b["rng"]["torch"] += 1
    b["steps"] = 6
    assert parameter_digest(float_leaves(a)) == parameter_digest(float_leaves(b))
    b["net"]["b"][0] = 1e-7
    assert parameter_digest(float_leaves(a)) != parameter_digest(float_leaves(b))
    x, y = float_leaves(_state(0)), float_leaves(_state(1))
    scaled = {k: v * 1000 for k, v in x.items()}
    assert relative_distance(x, x) == 0.0
    assert relative_distance(x, y) == pytest.approx(relative_distance(scaled, {k: v * 1000 for k, v in y.items()}))
    assert math.isnan(relative_distance(x, {"/net/w": np.zeros((2, 2), np.float32)}))  # no tensor of a shared shape
