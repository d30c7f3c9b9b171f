"""TensorBoard and MLflow logging of a real tiny run, read back with the real libraries:
TensorBoard's event reader, and MLflow's client on its file store."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

import agents
from evo.cli import main
from tests.conftest import TOY_EXPERIMENT, run_evo

pytest.importorskip("tensorboard", reason="the logging tests need the dev extra (tensorboard)")
pytest.importorskip("mlflow", reason="the logging tests need the dev extra (mlflow-skinny)")


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy experiment with TensorBoard logging from the experiment file's [logging] table and
    MLflow logging from `--log`: 2 generations, then `evo resume` to the third (the loggers go on
    where they stopped: same parent run, same member runs, same event directories)."""
    cwd = tmp_path_factory.mktemp("logged")
    text = TOY_EXPERIMENT.read_text() + '\n[logging]\ntensorboard = "tb"\n'
    (cwd / "toy.toml").write_text(text)
    run_evo(["run", "toy.toml", "--backend", "inline", "--quiet", "--generations", "2", "--log", "mlflow", "mlruns"], cwd,
            check=True)
    run_evo(["resume", "toy", "--generations", "3", "--quiet"], cwd, check=True)
    return cwd


def table(cwd: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(cwd / "runs" / "toy" / "run.sqlite") as db:
        return db.execute(sql).fetchall()


def test_tensorboard_scalars_and_hparams(logged: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    root = logged / "tb" / "toy"
    population = EventAccumulator(str(root / "population"))
    population.Reload()
    best = [(e.step, e.value) for e in population.Scalars("best_score")]
    assert best == [(g, pytest.approx(s, rel=1e-6)) for g, s in table(logged, "SELECT generation, best_score FROM generations")]

    evaluations = table(logged, "SELECT generation, idx, fitness, score FROM evaluations ORDER BY idx, generation")
    members = sorted({i for _, i, _, _ in evaluations})
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("member_")) == [f"member_{i:05d}" for i in members]
    final = {i for (i,) in table(logged, "SELECT idx FROM evaluations WHERE generation = 2")}
    sessions = set()
    for index in members:
        acc = EventAccumulator(str(root / f"member_{index:05d}"))
        acc.Reload()
        got = [(e.step, e.value) for e in acc.Scalars("fitness")]
        assert got == [(g, pytest.approx(f, rel=1e-6)) for g, i, f, _ in evaluations if i == index]
        assert {"score", "eval/val_mse", "train/loss_mse", "hparams/lr"} <= set(acc.Tags()["scalars"])
        try:
            content = acc.PluginTagToContent("hparams")
        except KeyError:  # no HParams data in this member's run: it left before the end
            content = {}
        if "_hparams_/session_start_info" in content:
            info = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
            assert {"lr", "batch_size", "arch.width"} <= set(info.hparams)
            sessions.add(index)
    # the HParams dashboard holds the final population (and that of the first invocation, which
    # ended after generation 2: each `evo run` / `evo resume` writes its own at the end)
    assert final <= sessions and sessions <= {i for (i,) in table(logged, "SELECT idx FROM evaluations WHERE generation >= 1")}


def test_mlflow_parent_nested_members_metrics_and_elite_artifact(logged: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads its plain-directory store only on request

    client = MlflowClient(tracking_uri=(logged / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("toy")
    runs = client.search_runs([experiment.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("evo.role") == "run")
    assert parent.info.run_name == "toy" and parent.info.status == "FINISHED"
    assert parent.data.params["population.size"] == "4" and parent.data.params["seed"] == "7"
    best = [(m.step, m.value) for m in client.get_metric_history(parent.info.run_id, "best_score")]
    assert sorted(best) == [(g, pytest.approx(s)) for g, s in table(logged, "SELECT generation, best_score FROM generations")]

    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    evaluations = table(logged, "SELECT generation, idx, fitness, hparams FROM evaluations")
    assert sorted(int(r.data.tags["evo.member"]) for r in children) == sorted({i for _, i, _, _ in evaluations})
    assert all(r.info.status == "FINISHED" for r in children)
    for r in children:
        index = int(r.data.tags["evo.member"])
        history = sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, "fitness"))
        assert history == sorted((g, pytest.approx(f)) for g, i, f, _ in evaluations if i == index)
        hparams = next(json.loads(h) for _, i, _, h in evaluations if i == index)
        assert {k: r.data.params[k] for k in hparams} == {k: str(v) for k, v in hparams.items()}
        if r.data.tags["evo.parent"]:
            assert r.data.tags["evo.mutation"] != "founder"

    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "elite")}
    assert {"elite/config.json", "elite/agent"} <= artifacts
    local = client.download_artifacts(parent.info.run_id, "elite", str(tmp_path))
    moved = tmp_path / "moved"
    shutil.copytree(local, moved)
    agent = agents.load(moved)
    elite, fitness = table(logged, "SELECT idx, fitness FROM evaluations WHERE generation = 2 "
                                   "ORDER BY score DESC, idx LIMIT 1")[0]
    assert agent.index == elite and parent.data.tags["evo.elite"] == str(elite)
    assert agent.evaluate().fitness == pytest.approx(fitness, abs=1e-7)


def test_a_bad_logging_target_is_refused_before_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.toml").write_text(TOY_EXPERIMENT.read_text() + '\n[logging]\nwandb = "x"\n')
    assert main(["run", "bad.toml", "--backend", "inline"]) == 2
    assert "bad.toml: logging.wandb: unknown field" in capsys.readouterr().err
    shutil.copy(TOY_EXPERIMENT, tmp_path / "toy.toml")
    assert main(["run", "toy.toml", "--backend", "inline", "--log", "neptune", "x"]) == 2
    assert "logging.neptune: unknown field" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
