"""The Python API (evo.api): `evo.run` on the toy agent, every DataFrame a `Run` offers, the elite,
export, resume; errors as `evo.SpecError` with the field; progress and quiet; the inline GPU check."""

from __future__ import annotations

import json
import logging
import sqlite3
import warnings
from pathlib import Path

import pandas as pd
import pytest
import tomllib
import torch

import evo
from evo.api import run_log
from evo.runstore import RunStoreError
from evo.scheduler.inline import inline_device
from tests.conftest import TOY_EXPERIMENT, run_evo


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> evo.Run:
    """The toy experiment for 2 of its 3 generations, started from Python, quietly."""
    runs = tmp_path_factory.mktemp("api") / "runs"
    return evo.run(TOY_EXPERIMENT, runs_dir=runs, generations=2, quiet=True)


def test_run_returns_a_run_whose_dataframes_match_the_run_store(toy_run: evo.Run) -> None:
    assert toy_run.status == "completed" and toy_run.name == "toy"
    assert toy_run.summary()["generations_done"] == 2 and "completed, 2/2 generations" in repr(toy_run)

    board = toy_run.leaderboard()
    assert isinstance(board, pd.DataFrame) and len(board) == 4
    assert list(board["rank"]) == [1, 2, 3, 4] and board["score"].is_monotonic_decreasing
    assert {"member", "score", "score_std", "fitness", "parent", "last_mutation", "hp.lr", "hp.batch_size",
            "arch.width", "arch.blocks"} <= set(board.columns)
    assert not any(c.startswith("arch.min_") for c in board.columns)  # mutation bounds are not knobs
    assert len(toy_run.leaderboard(top=2)) == 2

    evals = toy_run.evaluations()
    assert len(evals) == 8 and sorted(evals["generation"].unique()) == [0, 1]  # 2 generations x 4 members
    assert {"fitness", "score", "metric.val_mse", "train.loss_mse", "hp.lr", "wall_s"} <= set(evals.columns)
    assert (evals["fitness"] == -evals["metric.val_mse"]).all()  # the toy's fitness is minus its validation MSE
    last = evals[evals["generation"] == 1].set_index("member")
    assert last.loc[board["member"], "score"].tolist() == board["score"].tolist()

    mutations = toy_run.mutations()
    children = board[board["parent"].notna()]
    assert len(children) >= 1 and set(children["member"]) <= set(mutations["child"])
    row = mutations.set_index("child").loc[int(children["member"].iloc[0])]
    assert row["generation"] == 1 and row["kind"] in {"no_mutation", "architecture", "parameters", "activation", "rl_hp"}
    parent0 = evals[(evals["generation"] == 0) & (evals["member"] == row["parent"])]["score"].item()
    assert row["parent_score"] == parent0 and row["delta"] == pytest.approx(row["child_fitness"] - parent0)

    child = int(children["member"].iloc[0])
    lineage = toy_run.lineage(child)
    assert lineage["member"].iloc[0] == child and pd.isna(lineage["parent"].iloc[-1])  # back to a founder
    assert lineage["mutation"].iloc[0] != "" and lineage["mutation"].iloc[-1] == ""
    with pytest.raises(RunStoreError, match="no member 999"):
        toy_run.lineage(999)

    diversity = toy_run.diversity()
    assert list(diversity["generation"]) == [0, 1] and (diversity["members"] == 4).all()
    assert (diversity["distinct"] <= 4).all() and (diversity["mean_distance"] >= 0).all()


def test_elite_export_open_run_and_resume(toy_run: evo.Run, tmp_path: Path) -> None:
    board = toy_run.leaderboard()
    elite = toy_run.elite()
    assert elite.index == board["member"][0]
    assert elite.evaluate().fitness == pytest.approx(board["fitness"][0], abs=1e-7)
    out = toy_run.export(tmp_path / "exported")
    assert evo.load(out).evaluate().fitness == pytest.approx(board["fitness"][0], abs=1e-7)

    reopened = evo.open_run("toy", runs_dir=toy_run.path.parent)
    assert reopened.path == toy_run.path and evo.open_run(toy_run.path).name == "toy"
    with pytest.raises(RunStoreError, match="no run 'nope'"):
        evo.open_run("nope", runs_dir=tmp_path)

    resumed = reopened.resume(generations=3, quiet=True)  # the toy's own 3 generations, continued
    assert resumed.summary()["generations_done"] == 3 and len(resumed.evaluations()) == 12


def test_a_toml_string_and_a_dict_run_like_the_file(tmp_path: Path) -> None:
    text = TOY_EXPERIMENT.read_text()
    runs = tmp_path / "runs"
    a = evo.run(TOY_EXPERIMENT, runs_dir=runs, generations=1, quiet=True)
    b = evo.run(text, runs_dir=runs, generations=1, quiet=True)
    c = evo.run(tomllib.loads(text), runs_dir=runs, name="from_dict", generations=1, quiet=True)
    assert [r.name for r in (a, b, c)] == ["toy", "toy-2", "from_dict"]
    numbers = [r.evaluations()[["member", "fitness"]].values.tolist() for r in (a, b, c)]
    assert numbers[0] == numbers[1] == numbers[2]
    with pytest.raises(evo.SpecError, match="a run with this name exists") as info:  # a taken name is bad input too
        evo.run(text, runs_dir=runs, name="toy", quiet=True)
    assert info.value.field == "name"


@pytest.mark.parametrize(("overrides", "field", "words"), [
    ({"population.size": 0}, "population.size", "greater than or equal to 1"),
    ({"populaton.size": 3}, "populaton", "unknown field"),
    ({"agent.hparams.lr.max": "high"}, "agent.hparams.lr", "max"),
    ({"agent.hparams.nope": 1}, "agent.hparams.nope", "unknown hyperparameter"),
    ({"population.size.x": 1}, "population.size.x", "not a table"),
    ({"resources.gpus_per_member": 1}, "resources.gpus_per_member", "GPU"),
])
def test_bad_input_raises_spec_error_with_the_field_and_creates_nothing(tmp_path: Path, overrides: dict,
                                                                        field: str, words: str) -> None:
    if "resources.gpus_per_member" in overrides and torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the inline backend trains on it")
    with pytest.raises(evo.SpecError) as info:
        evo.run(TOY_EXPERIMENT, runs_dir=tmp_path / "runs", overrides=overrides, quiet=True)
    assert info.value.field.startswith(field) and words in str(info.value)
    assert not (tmp_path / "runs").exists()


def test_overrides_are_typed_deep_and_stored_with_the_run(tmp_path: Path) -> None:
    run = evo.run(TOY_EXPERIMENT, runs_dir=tmp_path / "runs", generations=1, quiet=True,
                  overrides={"population.size": 3, "agent.hparams.lr.max": 0.01, "agent.hparams.batch_size": 16})
    stored = run.experiment()
    assert stored["population"]["size"] == 3 and stored["population"]["generations"] == 1
    # lr keeps the file's other range keys; a plain value on a ranged hyperparameter is its new start
    assert stored["agent"]["hparams"]["lr"] == {"value": 3e-3, "min": 1e-4, "max": 0.01, "scale": "log", "resample_prob": 0.2}
    assert stored["agent"]["hparams"]["batch_size"] == {"value": 16, "min": 8, "max": 128}
    assert run.overrides() == {"agent.hparams.batch_size": 16, "agent.hparams.lr.max": 0.01, "population.size": 3}
    assert len(run.leaderboard()) == 3 and set(run.evaluations()["hp.batch_size"]) == {16}
    assert "# population.size = 3" in (run.path / "experiment.toml").read_text()


def test_progress_lines_off_a_terminal_and_nothing_when_quiet(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    evo.run(TOY_EXPERIMENT, runs_dir=tmp_path / "runs", name="loud", generations=2)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "run loud: 2 generations of 4 members on the inline backend"
    assert [line.split(":")[0] for line in out[1:]] == ["generation 1/2", "generation 2/2"]
    run = evo.run(TOY_EXPERIMENT, runs_dir=tmp_path / "runs", name="hush", generations=2, quiet=True)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    log = (run.path / "run.log").read_text()  # the same lines, in the run directory
    assert "run hush: 2 generations" in log and "generation 2/2: elite member" in log


def test_a_terminal_gets_the_live_view_and_quiet_still_silences_it(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich treats the output as a terminal
    monkeypatch.setenv("COLUMNS", "100")
    evo.run(TOY_EXPERIMENT, runs_dir=tmp_path / "runs", name="live", generations=1)
    out = capsys.readouterr().out
    assert "live generations" in out and "member" in out and "state" in out  # rich's progress bar and member table
    assert "run live: 1 generations of" not in out  # not the plain lines
    evo.run(TOY_EXPERIMENT, runs_dir=tmp_path / "runs", name="hush", generations=1, quiet=True)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_quiet_keeps_third_party_output_off_the_console_and_in_run_log(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    from transformers.utils import logging as hf_logging

    bars_before = hf_logging.is_progress_bar_enabled()
    with run_log(tmp_path / "quiet.log", quiet=True):
        warnings.warn("a library's deprecation notice", DeprecationWarning, stacklevel=1)
        logging.getLogger("transformers.modeling_utils").warning("some weights were not used")
        logging.getLogger("ray").info("Started a local Ray instance.")
        assert not hf_logging.is_progress_bar_enabled()  # no "Loading weights" bars
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    text = (tmp_path / "quiet.log").read_text()
    assert "deprecation notice" in text and "some weights were not used" in text
    assert hf_logging.is_progress_bar_enabled() == bars_before  # put back afterwards
    with run_log(tmp_path / "loud.log", quiet=False):
        warnings.warn("shown as usual", UserWarning, stacklevel=1)
    assert "shown as usual" in capsys.readouterr().err and "shown as usual" in (tmp_path / "loud.log").read_text()


def test_inline_device_honours_or_refuses_a_gpu_request() -> None:
    assert inline_device(0) == "cpu" and inline_device(0, cuda_devices=0) == "cpu"
    assert inline_device(1, cuda_devices=1) == "cuda" and inline_device(0.25, cuda_devices=1) == "cuda"
    with pytest.raises(ValueError, match="resources.gpus_per_member: asked for 2 GPU per member on the inline backend"):
        inline_device(2, cuda_devices=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cli_refuses_a_gpu_request_inline_without_cuda(workdir: Path) -> None:
    text = TOY_EXPERIMENT.read_text().replace("num_workers = 2", "num_workers = 2\ngpus_per_member = 1")
    (workdir / "toy.toml").write_text(text)
    proc = run_evo(["run", "toy.toml", "--backend", "inline"], workdir)
    assert proc.returncode == 2, proc.stderr
    assert "toy.toml: resources.gpus_per_member: asked for 1 GPU per member on the inline backend" in proc.stderr
    assert "0 CUDA devices" in proc.stderr and not (workdir / "runs").exists()


@pytest.mark.gpu
def test_inline_members_train_on_cuda(tmp_path: Path) -> None:
    """gpus_per_member on the inline backend: an EfficientZero member trains with its networks on the GPU."""
    from evo.population import initial_population, start_backend
    from evo.spec import load_experiment

    exp, _ = load_experiment(Path(__file__).parents[1] / "experiments" / "cartpole_efficientzero.toml",
                             {"resources.gpus_per_member": 1, "population.size": 1,
                              "selection.tournament_size": 1, "backend": "inline"})
    scheduler, context = start_backend(exp, "inline")
    agent = initial_population(exp, context)[0].agent
    results = scheduler.run_generation([agent], 64)
    assert all(p.is_cuda for net in results[0].agent.networks().values() for p in net.parameters())


def test_the_run_store_records_overrides_for_the_dashboard(tmp_path: Path) -> None:
    from dashboards.data import run_summary
    from evo.runstore import RunStore

    run = evo.run(TOY_EXPERIMENT, runs_dir=tmp_path / "runs", generations=1, quiet=True,
                  overrides={"population.size": 3, "selection.fitness_window": 1})
    with sqlite3.connect(run.path / "run.sqlite") as db:
        stored = dict(db.execute("SELECT key, value FROM run").fetchall())
    assert json.loads(stored["experiment"])["selection"]["fitness_window"] == 1
    assert json.loads(stored["overrides"]) == {"population.size": 3, "selection.fitness_window": 1}
    store = RunStore.open(run.path, read_only=True)
    try:
        assert run_summary(store)["population"] == 3  # what the dashboard's runs view shows
    finally:
        store.close()
