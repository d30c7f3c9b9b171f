"""population.stop_at_score: a run ends once a member's score reaches the target (sync after that
generation, async with no new round), records who and when, and a resumed run does not train on —
also when the driver died between committing that generation and writing the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evo.population import evolve, start_backend
from evo.runstore import RunStore
from evo.spec import SpecError, load_experiment
from tests.conftest import TOY_EXPERIMENT, evo_in_process, evolve_toy

# The toy agent's fitness is minus a validation MSE: always ≤ 0, so -1e9 is reached by the first
# evaluation and 1.0 never.
REACHED, NEVER = -1e9, 1.0


def _run(tmp_path: Path, overrides: dict) -> RunStore:
    return evolve_toy(tmp_path, {"population.generations": 3, **overrides})


def test_a_sync_run_stops_after_the_generation_that_reached_the_score(tmp_path: Path) -> None:
    store = _run(tmp_path, {"population.stop_at_score": REACHED})
    assert store.status == "completed" and store.last_completed_generation() == 0
    stopped = store.summary()["stopped_at_score"]
    best = store.evaluations(0)[0]
    assert stopped == {"generation": 0, "member": best["index"], "score": best["score"], "target": REACHED}


def test_a_score_never_reached_runs_every_generation_and_records_no_stop(tmp_path: Path) -> None:
    store = _run(tmp_path, {"population.stop_at_score": NEVER})
    assert store.last_completed_generation() == 2 and store.summary()["stopped_at_score"] is None


def test_task_without_a_threshold_never_stops(tmp_path: Path) -> None:
    exp, _ = load_experiment(TOY_EXPERIMENT, {"population.stop_at_score": "task"})
    assert exp.stop_score is None  # the toy agent declares no threshold (Agent.reward_threshold's default)
    store = _run(tmp_path, {"population.stop_at_score": "task"})
    assert store.last_completed_generation() == 2 and store.summary()["stopped_at_score"] is None


def test_an_async_run_starts_no_round_after_the_score_is_reached(tmp_path: Path) -> None:
    store = _run(tmp_path, {"population.stop_at_score": REACHED, "population.mode": "async"})
    rounds = int(store.get("rounds_done"))
    assert store.status == "completed" and 1 <= rounds < 4 * 3  # the inline backend: one round in flight
    assert store.summary()["stopped_at_score"]["target"] == REACHED


def test_resume_of_a_stopped_run_says_so_and_trains_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    (tmp_path / "toy.toml").write_text(TOY_EXPERIMENT.read_text().replace(
        "[population]\n", f"[population]\nstop_at_score = {REACHED}\n", 1))
    code, out, _ = evo_in_process(["run", "toy.toml", "--name", "s", "--backend", "inline", "--quiet"], tmp_path,
                                  capsys, monkeypatch)
    assert code == 0 and "completed: 1 generations (stopped early: member" in out
    assert f"population.stop_at_score {REACHED:.4g}" in out
    code, out, _ = evo_in_process(["resume", "s", "--generations", "5"], tmp_path, capsys, monkeypatch)
    assert code == 0 and "run s stopped: member" in out and "nothing to resume" in out
    assert RunStore.open("s", tmp_path / "runs").last_completed_generation() == 0


def test_a_driver_killed_before_writing_the_stop_is_stopped_on_resume(tmp_path: Path) -> None:
    store = _run(tmp_path, {"population.stop_at_score": REACHED})
    with store._transaction() as db:  # the window between committing generation 0 and recording the stop
        db.execute("DELETE FROM run WHERE key = 'stopped_at_score'")
    exp, _ = load_experiment(TOY_EXPERIMENT, {"population.generations": 3, "population.stop_at_score": REACHED})
    scheduler, context = start_backend(exp, "inline")
    try:
        evolve(exp, store, scheduler, context)
    finally:
        scheduler.close()
    assert store.last_completed_generation() == 0  # nothing more was trained
    assert json.loads(store.get("stopped_at_score"))["generation"] == 0


@pytest.mark.parametrize("value", ["solved", True, float("nan")])
def test_a_bad_stop_at_score_is_refused_with_its_field(value) -> None:
    with pytest.raises(SpecError) as exc:
        load_experiment(TOY_EXPERIMENT, {"population.stop_at_score": value})
    assert exc.value.field == "population.stop_at_score" and 'expected a finite number or "task"' in exc.value.message
