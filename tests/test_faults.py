"""Faults that need no cluster: diverging and raising members, all members failing, failed members
kept out of selection, impossible resource requests, bad hyperparameter bounds (docs/faults.md).

The runs go through `evo.cli.main` in this process on the inline backend with the real ToyAgent
(tests/fault_agents.py makes chosen members' lr explode for real, or raise).
"""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from evo.faults import Failure, ResourceRequestError
from evo.scheduler.resources import plan_workers
from evo.selection import tournament_select
from evo.spec import ExperimentSpec, SpecError, parse_experiment
from tests.conftest import TOY_EXPERIMENT
from tests.conftest import evo_in_process as evo


def faulty_experiment(directory: Path, name: str, **task: object) -> Path:
    """The toy experiment with FaultyToyAgent and extra [agent.task] keys."""
    text = TOY_EXPERIMENT.read_text().replace('kind = "tests.toy_agent:ToyAgent"', 'kind = "tests.fault_agents:FaultyToyAgent"')
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in task.items())
    text = text.replace("n_val = 128\n", "n_val = 128\n" + extra).replace('name = "toy"', f'name = "{name}"')
    path = directory / f"{name}.toml"
    path.write_text(text)
    return path


def test_a_diverging_member_is_failed_and_the_run_goes_on(tmp_path: Path, capsys, monkeypatch) -> None:
    # members 1 and 2 fail in generation 0; member 9 (the last child of generation 2) in the last one
    faulty_experiment(tmp_path, "diverge", explode_lr=[1], raise_in=[2, 9])
    code, out, err = evo(["run", "diverge.toml"], tmp_path, capsys, monkeypatch)
    assert code == 0, err
    with sqlite3.connect(tmp_path / "runs" / "diverge" / "run.sqlite") as db:
        rows = db.execute("SELECT generation, idx, fitness, score FROM evaluations ORDER BY generation, idx").fetchall()
        failures = db.execute("SELECT generation, idx, attempt, kind, message, retried FROM failures").fetchall()
        mutations = db.execute("SELECT child, parent FROM mutations WHERE generation = 1").fetchall()
    # every generation evaluated all four members exactly once; the failed ones at -inf
    assert [(g, n) for g, n in _counts(rows)] == [(0, 4), (1, 4), (2, 4)]
    gen0 = {idx: fitness for g, idx, fitness, _ in rows if g == 0}
    assert gen0[1] == -math.inf and gen0[2] == -math.inf and all(math.isfinite(gen0[i]) for i in (0, 3))
    assert failures[0][:4] == (0, 1, 1, "diverged") and "loss_mse" in failures[0][4] and failures[0][5] == 0
    assert failures[1][:4] == (0, 2, 1, "error") and "RuntimeError: member 2 was told to raise" in failures[1][4]
    # neither failed member is the elite nor a parent: nothing descends from them
    assert {p for _, p in mutations} <= {0, 3} and {idx for g, idx, *_ in rows if g == 1} & {1, 2} == set()
    assert failures[2][:4] == (2, 9, 1, "error")
    # the failure text is in the leaderboard (member 9 failed in the last generation: ranked last)
    code, text, _ = evo(["leaderboard", "diverge", "--format", "json"], tmp_path, capsys, monkeypatch)
    board = json.loads(text)
    assert board[-1]["member"] == 9 and board[-1]["fitness"] is None and board[-1]["score"] is None
    assert board[-1]["failure"]["kind"] == "error" and "member 9 was told to raise" in board[-1]["failure"]["error"]
    assert all(r["failure"] is None for r in board[:-1])
    code, table, _ = evo(["leaderboard", "diverge"], tmp_path, capsys, monkeypatch)
    assert "failed: error" in table
    code, listing, _ = evo(["runs"], tmp_path, capsys, monkeypatch)
    assert "3 failed" in listing


def test_a_ctrl_c_that_library_code_swallows_still_stops_the_run(tmp_path: Path, capsys, monkeypatch) -> None:
    """A KeyboardInterrupt caught inside a member's training (as a library's own signal check can) is
    not lost: the run stops, resumably, at the next point the driver checks (evo.interrupts), and a
    resume gives the uninterrupted run's numbers."""
    shutil.copy(TOY_EXPERIMENT, tmp_path / "toy.toml")
    assert evo(["run", "toy.toml", "--name", "reference"], tmp_path, capsys, monkeypatch)[0] == 0
    marker = tmp_path / "interrupt-sent"
    faulty_experiment(tmp_path, "swallowed", swallow_interrupt_once=str(marker))
    code, _, err = evo(["run", "swallowed.toml"], tmp_path, capsys, monkeypatch)
    assert marker.exists() and code == 130, err
    assert "interrupted; resume with: evo resume swallowed" in err
    run = tmp_path / "runs" / "swallowed"
    with sqlite3.connect(run / "run.sqlite") as db:
        assert db.execute("SELECT value FROM run WHERE key = 'status'").fetchone()[0] == "interrupted"
        assert db.execute("SELECT COUNT(*) FROM generations").fetchone()[0] == 1  # generation 0 finished, 1 never began
    assert evo(["resume", "swallowed"], tmp_path, capsys, monkeypatch)[0] == 0

    def table(name: str) -> list[tuple]:
        with sqlite3.connect(tmp_path / "runs" / name / "run.sqlite") as db:
            return db.execute("SELECT generation, idx, fitness, hparams FROM evaluations ORDER BY generation, idx").fetchall()

    assert table("swallowed") == table("reference")


def _counts(rows: list[tuple]) -> list[tuple[int, int]]:
    out: dict[int, int] = {}
    for g, *_ in rows:
        out[g] = out.get(g, 0) + 1
    return sorted(out.items())


def test_every_member_failing_stops_the_run_with_their_errors(tmp_path: Path, capsys, monkeypatch) -> None:
    faulty_experiment(tmp_path, "allfail", explode_lr=[0, 1], raise_in=[2, 3])
    code, _, err = evo(["run", "allfail.toml"], tmp_path, capsys, monkeypatch)
    assert code == 1
    assert "every member of generation 0 failed" in err
    for index in range(4):
        assert f"member {index}: " in err
    assert "diverged: training metric loss_mse" in err and "RuntimeError: member 3 was told to raise" in err
    code, listing, _ = evo(["runs"], tmp_path, capsys, monkeypatch)
    assert "failed" in listing and "running" not in listing


def test_selection_never_picks_a_failed_member() -> None:
    rng = np.random.default_rng(0)
    scores = [5.0, -math.inf, 1.0, -math.inf]
    for _ in range(200):
        elite, parents = tournament_select(scores, 4, 3, True, rng, eligible=[True, False, True, False])
        assert elite == 0 and set(parents) <= {0, 2}
    # everyone eligible: exactly the draws of plain selection (a run without failures is unchanged)
    a = tournament_select([3.0, 1.0, 2.0], 3, 2, True, np.random.default_rng(5))
    b = tournament_select([3.0, 1.0, 2.0], 3, 2, True, np.random.default_rng(5), eligible=[True] * 3)
    assert a == b


@pytest.mark.parametrize("bound, value", [("max", "inf"), ("min", "-inf"), ("max", "nan")])
def test_infinite_hyperparameter_bounds_are_refused(bound: str, value: str) -> None:
    import tomllib

    text = TOY_EXPERIMENT.read_text().replace("lr = { value = 3e-3, min = 1e-4, max = 3e-2",
                                              "lr = { value = 3e-3, min = 1e-4, max = 3e-2".replace(
                                                  f"{bound} = {'1e-4' if bound == 'min' else '3e-2'}", f"{bound} = {value}"))
    with pytest.raises(SpecError) as err:
        parse_experiment(tomllib.loads(text), "toy.toml")
    assert err.value.field == f"agent.hparams.lr.{bound}"
    assert "expected a finite number" in str(err.value)


def _res(**kw: object):
    return ExperimentSpec.model_validate({"name": "x", "population": {"size": 4, "generations": 1,
                                                                        "steps_per_generation": 1},
                                          "agent": {"kind": "k"}, "resources": kw}).resources


def test_resource_requests_are_checked_against_what_nodes_offer() -> None:
    cpu_node = [{"CPU": 2.0, "memory": 1e9}]
    assert plan_workers(_res(), 4, cpu_node) == 2
    assert plan_workers(_res(cpus_per_member=0.5), 4, cpu_node) == 4
    with pytest.raises(ResourceRequestError) as err:
        plan_workers(_res(gpus_per_member=1), 4, cpu_node)
    assert err.value.field == "resources.gpus_per_member" and "1 GPU per member" in str(err.value)
    assert "no GPU at all" in str(err.value)
    with pytest.raises(ResourceRequestError) as err:
        plan_workers(_res(cpus_per_member=4), 4, cpu_node + [{"CPU": 3.0}])
    assert err.value.field == "resources.cpus_per_member" and "at most 3 CPU on any one node (5 in total" in str(err.value)
    with pytest.raises(ResourceRequestError) as err:
        plan_workers(_res(num_workers=3), 4, cpu_node)
    assert err.value.field == "resources.num_workers" and "room for 2" in str(err.value)
    with pytest.raises(ResourceRequestError) as err:
        plan_workers(_res(custom_resources={"tpu": 1}), 4, cpu_node)
    assert err.value.field == "resources.custom_resources.tpu"
    # GPU on one node, enough CPUs only on another: no node has both
    with pytest.raises(ResourceRequestError) as err:
        plan_workers(_res(cpus_per_member=2, gpus_per_member=1), 4, [{"CPU": 1.0, "GPU": 1.0}, {"CPU": 4.0}])
    assert err.value.field == "resources"
    assert plan_workers(_res(gpus_per_member=0.5), 4, [{"CPU": 8.0, "GPU": 1.0}]) == 2


def test_failure_records_round_trip() -> None:
    f = Failure(3, "lost", "ActorDiedError: gone", attempt=2, generation=5, retried=True)
    assert Failure.from_json(json.loads(json.dumps(f.to_json()))) == f and f.retryable
    assert not Failure(3, "diverged", "loss is nan").retryable


def test_a_spec_without_the_new_fields_still_loads(tmp_path: Path) -> None:
    shutil.copy(TOY_EXPERIMENT, tmp_path / "toy.toml")
    import tomllib

    exp = parse_experiment(tomllib.loads((tmp_path / "toy.toml").read_text()), "toy.toml")
    assert exp.resources.max_failures == 2 and exp.resources.wait_for_resources_s == 0
    assert exp.resources.custom_resources == {}
