"""Asynchronous evolution (population.mode = "async", evo/steady.py): rounds instead of a barrier,
judged at equal steps, durable round by round, resumable after a SIGKILL in every window."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from evo.cli import main
from evo.runstore import RunStore
from evo.spec import load_experiment
from tests.conftest import TOY_EXPERIMENT, evolve_toy, run_evo

ASYNC = {"population.mode": "async"}


def _toy_async(cwd: Path, extra: str = "") -> Path:
    text = TOY_EXPERIMENT.read_text().replace("[population]\n", f'[population]\nmode = "async"\n{extra}')
    path = cwd / "toy_async.toml"
    path.write_text(text)
    return path


def rounds(run_dir: Path) -> list[tuple]:
    """Every evaluation (generation = round) but its wall time, and every member's lineage."""
    with sqlite3.connect(run_dir / "run.sqlite") as db:
        evs = db.execute("SELECT generation, idx, fitness, score, history, hparams, arch FROM evaluations "
                         "ORDER BY generation, idx").fetchall()
        members = db.execute("SELECT idx, parent, born, mutation FROM members ORDER BY idx").fetchall()
    return evs + members


@pytest.fixture(scope="module")
def async_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("async")
    _toy_async(cwd)
    run_evo(["run", "toy_async.toml", "--name", "ref", "--backend", "inline", "--quiet"], cwd, check=True)
    return cwd


def _run(tmp_path: Path, overrides: dict, backend: str = "inline", name: str = "r") -> RunStore:
    return evolve_toy(tmp_path, {**ASYNC, **overrides}, name, backend)


def test_an_async_run_trains_its_budget_of_rounds_and_judges_each_at_once(tmp_path: Path) -> None:
    store = _run(tmp_path, {"population.generations": 4})
    assert store.status == "completed" and int(store.get("rounds_done")) == 4 * 4
    evs = store.all_evaluations()
    assert len(evs) == 16  # every member-round evaluated once
    children = [m for m in store.all_members() if m["parent"] is not None]
    assert children, "no member was ever replaced"
    for m in children:  # a clone starts at the round its parent's training had reached
        parent_rounds = [e["generation"] for e in evs if e["index"] == m["parent"]]
        assert m["born"] - 1 in parent_rounds
        assert m["mutation"]["details"]["selected_by"] in ("score", "random tie", "secondary:secondary")
    # the slots hold what trains next, each start state on disk
    for _slot, index, round_ in store.slots():
        rec, state = store.load_start(round_, index)
        assert rec.index == index and state
    # compute is reported per evaluation and in all
    compute = store.compute()
    assert len(compute) == 16 and store.spent().updates == 16 * 30
    assert store.last_completed_generation() >= 1


def test_inline_async_is_reproducible_and_the_leaderboard_shows_compute(async_runs: Path, capsys, monkeypatch) -> None:
    run_evo(["run", "toy_async.toml", "--name", "again", "--backend", "inline", "--quiet"], async_runs, check=True)
    assert rounds(async_runs / "runs" / "again") == rounds(async_runs / "runs" / "ref")
    monkeypatch.chdir(async_runs)
    capsys.readouterr()
    assert main(["leaderboard", "ref", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["compute"]["updates"] >= 30 for r in rows)
    assert main(["leaderboard", "ref"]) == 0
    assert "steps ·" in capsys.readouterr().out


# window -> environment of the killed run (the toy config: 4 slots x 3 rounds = 12 member-rounds)
CRASH = {
    "in_train": {"EVO_TOY_KILL_AT_TRAIN": "7"},           # inside the 7th round: rounds 1-6 durable
    "after_checkpoints": {"EVO_FAULT": "after_checkpoints:5"},  # round 5's files written, not committed
    "after_commit": {"EVO_FAULT": "after_commit:5"},      # round 5 committed, nothing after
}


@pytest.mark.parametrize("window", [pytest.param(w, marks=[] if w == "after_commit" else [pytest.mark.slow])
                                    for w in sorted(CRASH)])
def test_a_killed_async_run_resumes_to_the_uninterrupted_run(async_runs: Path, window: str) -> None:
    name = f"k{sorted(CRASH).index(window)}"
    killed = run_evo(["run", "toy_async.toml", "--name", name, "--backend", "inline", "--quiet"], async_runs,
                     env=CRASH[window])
    assert killed.returncode == -9, killed.stderr
    run_dir = async_runs / "runs" / name
    with sqlite3.connect(run_dir / "run.sqlite") as db:
        done = int(db.execute("SELECT value FROM run WHERE key = 'rounds_done'").fetchone()[0])
    # rounds are written by a thread of their own: killed in training, the last ones may be unwritten
    assert done == 5 if window == "after_commit" else done == 4 if window == "after_checkpoints" else 1 <= done <= 6
    run_evo(["resume", name, "--quiet"], async_runs, check=True)
    assert rounds(run_dir) == rounds(async_runs / "runs" / "ref")  # no round lost, none twice, same choices


@pytest.mark.slow
def test_async_on_ray_uses_every_worker_and_commits_every_round(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    import ray

    try:
        store = _run(tmp_path, {"backend": "ray", "population.generations": 3}, backend="ray")
    finally:
        ray.shutdown()
    assert store.status == "completed" and int(store.get("rounds_done")) == 12
    assert len(store.all_evaluations()) == 12
    assert store.last_completed_generation() >= 0
    assert {s for s, _, _ in store.slots()} == {0, 1, 2, 3}


def test_a_budget_stops_sync_and_async_runs(tmp_path: Path) -> None:
    # 30 updates per round: a budget of 100 updates is spent after the 4th round
    store = _run(tmp_path, {"population.mode": "sync", "population.budget": {"updates": 100}}, name="s")
    assert store.last_completed_generation() == 0 and store.spent().updates == 120
    store = _run(tmp_path, {"population.budget": {"updates": 100}}, name="a")
    assert int(store.get("rounds_done")) == 4 and store.spent().updates == 120


def test_a_resumed_finished_async_run_says_so(async_runs: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(async_runs)
    capsys.readouterr()
    assert main(["resume", "ref"]) == 0
    assert "already has" in capsys.readouterr().out


def test_rungs_stop_members_behind_and_report_the_steps_saved(tmp_path: Path) -> None:
    store = _run(tmp_path, {"population.generations": 5, "population.rungs": [0.25, 0.5],
                            "population.initial": "scratch"})
    stats = json.loads(store.get("rung_stats"))
    assert stats["stopped"] > 0 and stats["env_steps_saved"] > 0
    stopped = [e for e in store.all_evaluations() if "stopped_at_rung" in e["metrics"]]
    assert len(stopped) == stats["stopped"]
    # a round stopped at the first rung trained a quarter of its steps: the spent env steps say so
    full = 5 * 4 * 30
    assert store.spent().env_steps == full - stats["env_steps_saved"]
    replaced = {m["mutation"]["details"]["replaced"] for m in store.all_members()
                if m["mutation"] and "replaced_at_rung" in m["mutation"]["details"]}
    assert replaced == {e["index"] for e in stopped}  # every stopped member's slot went to a clone of another


def test_rounds_past_a_rung_finish_after_the_last_round_has_started(tmp_path: Path) -> None:
    # rung_keep near 1: no member is ever behind, so every round trains all of its steps, the last too
    store = _run(tmp_path, {"population.generations": 3, "population.rungs": [0.25, 0.5], "population.rung_keep": 0.99})
    stats = json.loads(store.get("rung_stats"))
    assert stats == {"stopped": 0, "rungs_passed": 2 * 3 * 4, "env_steps_saved": 0}
    assert int(store.get("rounds_done")) == 3 * 4 and len(store.all_evaluations()) == 3 * 4
    assert store.spent().env_steps == 3 * 4 * 30


def test_a_clone_of_a_member_past_a_rung_is_not_charged_twice(tmp_path: Path) -> None:
    """Two rounds in flight (as on two Ray workers, here inline and in order): a member is judged while
    a rival is between the parts of its round, so the rival's mid-round state is what gets cloned. The
    agent counts env steps cumulatively (as EfficientZero does); what the run spent must be what was
    trained, once: every round's steps less those its rung stopped."""
    from evo.agent import AgentContext
    from evo.population import evolve
    from evo.scheduler.inline import InlineScheduler

    class TwoInFlight(InlineScheduler):
        capacity = 2

    exp, text = load_experiment(TOY_EXPERIMENT, {**ASYNC, "agent.kind": "tests.toy_agent:CountingToyAgent",
                                                 "population.generations": 6, "population.rungs": [0.25, 0.5],
                                                 "population.initial": "scratch"})
    store = RunStore.create(tmp_path, "two", text, exp.to_json())
    context = AgentContext(task=exp.task, seed=exp.seed)
    evolve(exp, store, TwoInFlight(threads=1, context=context), context)
    stats = json.loads(store.get("rung_stats"))
    assert stats["stopped"] > 0 and int(store.get("rounds_done")) == 6 * 4
    assert store.spent().env_steps == 6 * 4 * 30 - stats["env_steps_saved"]


def _stopped_unevaluated(store: RunStore) -> set[int]:
    """The members whose slot went to a clone at a rung."""
    return {m["mutation"]["details"]["replaced"] for m in store.all_members()
            if m["mutation"] and "replaced_at_rung" in m["mutation"]["details"]}


def test_rungs_judged_on_a_training_metric_cost_no_evaluation(tmp_path: Path) -> None:
    from tests.toy_agent import CountingToyAgent

    CountingToyAgent.evaluations = 0
    store = _run(tmp_path, {"agent.kind": "tests.toy_agent:CountingToyAgent", "population.generations": 5,
                            "population.rungs": [0.25, 0.5], "population.rung_metric": "-loss_mse",
                            "population.initial": "scratch"})
    stats = json.loads(store.get("rung_stats"))
    assert stats["stopped"] > 0 and stats.get("unjudged", 0) == 0 and int(store.get("rounds_done")) == 5 * 4
    evs = store.all_evaluations()
    # a round that trained all its steps is evaluated once at its end; a stopped one never
    assert CountingToyAgent.evaluations == len(evs) == 5 * 4 - stats["stopped"]
    assert not any("stopped_at_rung" in e["metrics"] for e in evs)
    stopped = _stopped_unevaluated(store)
    assert len(stopped) == stats["stopped"]
    assert store.spent().env_steps == 5 * 4 * 30 - stats["env_steps_saved"]  # the stopped rounds' steps counted


def test_a_rung_metric_the_agent_does_not_report_stops_nobody(tmp_path: Path) -> None:
    store = _run(tmp_path, {"population.generations": 2, "population.rungs": [0.5], "population.rung_metric": "nope"})
    stats = json.loads(store.get("rung_stats"))
    assert stats == {"stopped": 0, "rungs_passed": 2 * 4, "unjudged": 2 * 4, "env_steps_saved": 0}
    assert len(store.all_evaluations()) == 2 * 4


@pytest.mark.slow
def test_rungs_on_a_training_metric_on_ray(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    import ray

    try:
        store = _run(tmp_path, {"backend": "ray", "agent.kind": "tests.toy_agent:CountingToyAgent",
                                "population.generations": 4, "population.rungs": [0.25, 0.5],
                                "population.rung_keep": 0.25, "population.rung_metric": "-loss_mse",
                                "population.initial": "scratch"}, backend="ray")
    finally:
        ray.shutdown()
    stats = json.loads(store.get("rung_stats"))
    assert store.status == "completed" and int(store.get("rounds_done")) == 4 * 4 and stats["stopped"] > 0
    assert len(store.all_evaluations()) == 4 * 4 - stats["stopped"] == 4 * 4 - len(_stopped_unevaluated(store))
    assert store.spent().env_steps == 4 * 4 * 30 - stats["env_steps_saved"]


def test_rungs_need_async_mode() -> None:
    from evo.spec import SpecError

    with pytest.raises(SpecError, match="population.rungs"):
        load_experiment(TOY_EXPERIMENT, {"population.rungs": [0.5]})
    with pytest.raises(SpecError, match="population.rungs"):
        load_experiment(TOY_EXPERIMENT, {**ASYNC, "population.rungs": [0.5, 0.5]})
    with pytest.raises(SpecError, match="population.rung_metric: expected population.rungs"):
        load_experiment(TOY_EXPERIMENT, {**ASYNC, "population.rung_metric": "train_episode_return"})
    for bad in ("-", "--loss", ""):
        with pytest.raises(SpecError, match="population.rung_metric"):
            load_experiment(TOY_EXPERIMENT, {**ASYNC, "population.rungs": [0.5], "population.rung_metric": bad})


def test_a_failing_member_is_recorded_and_its_slot_taken_over(tmp_path: Path) -> None:
    store = _run(tmp_path, {"agent.kind": "tests.fault_agents:FaultyToyAgent", "agent.task": {"raise_in": [1]}})
    assert store.status == "completed" and int(store.get("rounds_done")) == 12
    failed = store.failures()
    assert [(f.index, f.kind, f.generation) for f in failed] == [(1, "error", 0)]
    heir = [m for m in store.all_members() if m["mutation"] and m["mutation"]["details"].get("replaced") == 1]
    assert len(heir) == 1 and heir[0]["parent"] != 1
    assert all(e["index"] != 1 for e in store.all_evaluations())


@pytest.mark.slow
def test_an_async_ray_run_retries_a_member_whose_worker_was_killed(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    import os
    import signal
    import threading
    import time

    import ray

    pids = tmp_path / "pids"
    pids.mkdir()

    def kill_one() -> None:  # the first worker seen training a member of round 1 or later dies
        deadline = time.time() + 120
        while time.time() < deadline:
            seen = sorted(pids.iterdir(), key=lambda p: p.stat().st_mtime)
            if len(seen) >= 5:
                os.kill(int(seen[-1].name.rsplit("-", 1)[1]), signal.SIGKILL)
                return
            time.sleep(0.05)

    threading.Thread(target=kill_one, daemon=True).start()
    try:
        store = _run(tmp_path, {"backend": "ray", "agent.kind": "tests.fault_agents:FaultyToyAgent",
                                "agent.task": {"pid_dir": str(pids), "train_sleep_s": 0.5}}, backend="ray")
    finally:
        ray.shutdown()
    assert store.status == "completed" and int(store.get("rounds_done")) == 12
    assert len(store.all_evaluations()) == 12  # the lost round was run again, not lost
    assert any(f.kind == "lost" and f.retried for f in store.failures())


def test_without_clone_behind_no_slot_goes_back_a_round(tmp_path: Path) -> None:
    store = _run(tmp_path, {"population.generations": 5, "population.initial": "scratch",
                            "selection.clone_behind": False})
    members = {m["index"]: m for m in store.all_members()}
    evs = store.all_evaluations()
    for m in members.values():
        if m["parent"] is None:
            continue
        # a child starts at its parent's round, never before the round the member it replaced had reached
        replaced = m["mutation"]["details"]["replaced"]
        replaced_rounds = [e["generation"] for e in evs if e["index"] == replaced]
        if m["mutation"]["details"].get("selected_by") != "founder line kept" and replaced_rounds:
            assert m["born"] >= max(replaced_rounds) + 1, (m, replaced_rounds)


# selection.champion: members fade after their first round (30 steps), so every line's best state lies behind it
CHAMPION = {"agent.kind": "tests.toy_agent:FadingToyAgent", "selection.champion": True, "selection.fitness_window": 1}


def _best(store: RunStore) -> dict:
    """The run's best evaluation, in the order `RunStore.trained_checkpoint(best=True)` ranks them."""
    return max(store.all_evaluations(), key=lambda e: (e["score"], e["generation"], e["index"]))


def test_the_champion_brings_the_best_state_back_into_training(tmp_path: Path) -> None:
    store = _run(tmp_path, {**CHAMPION, "population.generations": 6})
    evs = {(e["index"], e["generation"]): e for e in store.all_evaluations()}
    best = _best(store)
    assert best["generation"] == 0  # the fading toy peaks after its first round: a founder's
    faded = max(e["score"] for e in evs.values() if e["generation"] > 0)
    clones = [m for m in store.all_members() if m["mutation"] and m["mutation"]["details"]["selected_by"] == "champion"]
    assert clones, "no slot was given the champion"
    for m in clones:  # each a clone of a founder's peak (the best seen when it was made), the round after it
        parent = evs[(m["parent"], m["born"] - 1)]
        assert parent["generation"] == 0 and parent["score"] > faded
    last = max(clones, key=lambda m: m["index"])  # once every founder has been judged, the champion is the best
    assert (last["parent"], last["born"]) == (best["index"], 1)
    # its trained state outlives the pruning of obsolete checkpoints: what `evo export --best` writes
    row, path, _ = store.trained_checkpoint(best=True)
    assert (row["index"], row["generation"]) == (best["index"], best["generation"]) and path.exists()
    # without the champion no slot goes back to a peak state and the population only fades: its
    # evaluations after the first round score lower
    plain = _run(tmp_path, {**CHAMPION, "selection.champion": False, "population.generations": 6}, name="plain")
    assert not any(m["mutation"] and m["mutation"]["details"]["selected_by"] == "champion" for m in plain.all_members())

    def after_peak(st: RunStore) -> float:
        return float(np.mean([e["score"] for e in st.all_evaluations() if e["generation"] > 0]))

    assert after_peak(store) > after_peak(plain) + 1.0, (after_peak(store), after_peak(plain))


def test_a_killed_run_with_a_champion_resumes_to_the_uninterrupted_run(tmp_path: Path) -> None:
    text = _toy_async(tmp_path).read_text()
    text = text.replace('kind = "tests.toy_agent:ToyAgent"', 'kind = "tests.toy_agent:FadingToyAgent"')
    text = text.replace("fitness_window = 2", "fitness_window = 1\nchampion = true")
    text = text.replace("generations = 3", "generations = 6")
    (tmp_path / "champion.toml").write_text(text)
    run_evo(["run", "champion.toml", "--name", "ref", "--backend", "inline", "--quiet"], tmp_path, check=True)
    # killed after 10 of 24 rounds: the champion was crowned before, and clones of it are made after
    killed = run_evo(["run", "champion.toml", "--name", "k", "--backend", "inline", "--quiet"], tmp_path,
                     env={"EVO_FAULT": "after_commit:10"})
    assert killed.returncode == -9, killed.stderr
    run_evo(["resume", "k", "--quiet"], tmp_path, check=True)
    assert rounds(tmp_path / "runs" / "k") == rounds(tmp_path / "runs" / "ref")
    members = RunStore(tmp_path / "runs" / "ref").all_members()
    chosen = [m for m in members if m["mutation"] and m["mutation"]["details"]["selected_by"] == "champion"]
    assert any(m["index"] >= 10 for m in chosen)  # a champion clone made after the crash's point, from the store


def test_the_champion_is_called_only_after_the_population_falls_below_its_margin() -> None:
    from evo.steady import champion_called

    assert champion_called(10.0, [9.9, 12.0], None)  # no margin: always in the pool
    assert champion_called(10.0, [4.0, 2.5], 5.0)  # every member more than 5 below the peak: a fall
    assert not champion_called(10.0, [4.0, 5.0], 5.0)  # one member at exactly the margin holds the line
    assert not champion_called(10.0, [4.0, 10.0], 5.0)  # the peak's own line still scores it
    assert champion_called(10.0, [9.0], 0.0)  # margin 0: any member below it


def test_a_champion_margin_no_member_falls_below_leaves_the_run_as_without_a_champion(tmp_path: Path) -> None:
    # the fading toy falls ~3 a round; a margin of 1e6 is never crossed, so the champion never enters
    # a tournament, and it draws nothing from the rng either: the run is the plain tournament's, round for round
    gated = _run(tmp_path, {**CHAMPION, "selection.champion_margin": 1e6, "population.generations": 6}, name="gated")
    plain = _run(tmp_path, {**CHAMPION, "selection.champion": False, "population.generations": 6}, name="plain")
    assert not any(m["mutation"] and m["mutation"]["details"]["selected_by"] == "champion" for m in gated.all_members())
    assert rounds(gated.path) == rounds(plain.path)
    # a margin the fade crosses: the champion is called back, as without a margin
    fallen = _run(tmp_path, {**CHAMPION, "selection.champion_margin": 1.0, "population.generations": 6}, name="fallen")
    clones = [m for m in fallen.all_members() if m["mutation"] and m["mutation"]["details"]["selected_by"] == "champion"]
    assert clones, "the population fell more than the margin below its peak, and no slot was given the champion"
    # the HPO benchmark keeps these counts, its run stores being temporary
    from benchmarks.hpo.evo_strategy import selection_counts

    counts = selection_counts(fallen)
    assert counts["champion"] == len(clones) and "champion" not in selection_counts(gated)
    assert sum(counts.values()) == sum(1 for m in fallen.all_members() if m["mutation"])


def test_a_champion_margin_needs_the_champion() -> None:
    from evo.spec import SpecError

    with pytest.raises(SpecError, match="selection.champion_margin: expected selection.champion = true"):
        load_experiment(TOY_EXPERIMENT, {**ASYNC, "selection.champion_margin": 5.0})
    with pytest.raises(SpecError, match="champion_margin"):
        load_experiment(TOY_EXPERIMENT, {**ASYNC, "selection.champion": True, "selection.champion_margin": -1.0})
    spec = load_experiment(TOY_EXPERIMENT, {**ASYNC, "selection.champion": True, "selection.champion_margin": 5.0})[0]
    assert spec.selection.champion_margin == 5.0


def test_the_champion_needs_async_mode() -> None:
    from evo.spec import SpecError

    with pytest.raises(SpecError, match="selection.champion: expected population.mode = 'async'"):
        load_experiment(TOY_EXPERIMENT, {"selection.champion": True})
    assert load_experiment(TOY_EXPERIMENT, {**ASYNC, "selection.champion": True})[0].selection.champion


def test_pruning_keeps_the_runs_best_state(tmp_path: Path) -> None:
    """An async run prunes trained states that are neither a completed generation's best nor a member's
    latest as its generations complete; the run's best is kept as well (the champion, `evo export --best`),
    even while its generation is incomplete — here, no generation row names it."""
    store = _run(tmp_path, {"agent.kind": "tests.toy_agent:FadingToyAgent", "population.generations": 4})
    best = _best(store)
    assert any(e["index"] == best["index"] and e["generation"] > best["generation"] for e in store.all_evaluations())
    with store._db:  # not a member's latest (the fading toy peaks first), and now no generation's best
        store._db.execute("UPDATE generations SET best_idx = -1")
    store.prune_async()
    row, path, _ = store.trained_checkpoint(best=True)
    assert (row["index"], row["generation"]) == (best["index"], best["generation"]) and path.exists()
