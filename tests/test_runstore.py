"""Run store pieces not covered through the CLI or the contract suite (evo/testing/runstore_contract.py):
replay snapshots per generation, pruning, the generation's best, lineage, export lookups, failures,
diversity, listing and the errors a person sees."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evo.diversity import Diversity
from evo.faults import Failure
from evo.replay import Field, ReplayStore, Schema
from evo.runstore import EvaluatedMember, RunStore, RunStoreError
from evo.testing.runstore_contract import evaluated, founders, offspring


def _replay(seed: int = 0) -> ReplayStore:
    schema = Schema({"obs": Field("float32", (3,)), "episode": Field("int64"), "step": Field("int64")})
    return ReplayStore(schema, capacity=64, sampler="prioritized", seed=seed, episode_field="episode")


def _rows(n: int, episode: int) -> dict[str, np.ndarray]:
    return {"obs": np.arange(3 * n, dtype=np.float32).reshape(n, 3) + episode,
            "episode": np.full(n, episode), "step": np.arange(n)}


def test_replay_snapshot_of_a_generation_is_what_resume_loads(tmp_path) -> None:
    store = RunStore.create(tmp_path, "r", "name='r'", {})
    replay = _replay()
    keys0 = replay.insert(_rows(5, 1))
    store.snapshot_replay(replay, 0)
    replay.insert(_rows(7, 2))  # generation 1's data, never committed
    fresh = _replay(seed=1)
    assert store.restore_replay(fresh, 0)
    assert len(fresh) == 5 and fresh.contains(keys0).all()
    np.testing.assert_array_equal(fresh.get(keys0)["obs"], _rows(5, 1)["obs"])
    # the restored store samples exactly as the snapshotted one would have: compare with a twin that
    # went through the same inserts and stopped at the snapshot
    original = _replay()
    original.insert(_rows(5, 1))
    assert fresh.stats() == original.stats()
    for _ in range(3):
        np.testing.assert_array_equal(fresh.sample(4).keys, original.sample(4).keys)
    assert not store.restore_replay(fresh, 3)  # no snapshot for that generation


def test_list_runs_skips_half_created_directories(tmp_path) -> None:
    RunStore.create(tmp_path, "a", "name='a'", {"population": {"generations": 3}, "agent": {"kind": "x"}})
    (tmp_path / ".b.creating").mkdir()
    (tmp_path / "notarun").mkdir()
    runs = RunStore.list_runs(tmp_path)
    assert [r["name"] for r in runs] == ["a"]
    assert runs[0]["generations_done"] == 0 and runs[0]["generations"] == 3 and runs[0]["status"] == "created"


def _run(tmp_path, generations: int) -> tuple[RunStore, list[list[EvaluatedMember]]]:
    """A run of 3 members with `generations` committed generations (the contract suite's data)."""
    store = RunStore.create(tmp_path, "r", "name='r'", {"population": {"generations": 5}, "agent": {"kind": "toy"}})
    population = founders([0, 1, 2])
    store.save_initial_population(population)
    trained_by_generation, next_index = [], 3
    for g in range(generations):
        trained = evaluated(population, g)
        population = offspring(trained, g, first_index=next_index)
        next_index += len(population) - 1
        store.commit_generation(g, trained, population, wall_s=1.0 + g)
        trained_by_generation.append(trained)
    return store, trained_by_generation


def test_pruning_keeps_the_last_generation_and_each_generations_best(tmp_path) -> None:
    store, trained = _run(tmp_path, 3)
    best = [max(t, key=lambda e: (e.score, -e.record.index)).record.index for t in trained]
    kept = {(r["generation"], r["index"]) for r in store.all_evaluations() if r["checkpoint"] is not None}
    assert kept == {(0, best[0]), (1, best[1])} | {(2, e.record.index) for e in trained[2]}
    on_disk = {(int(p.parent.parent.name[1:]), int(p.name[1:])) for p in (store.path / "checkpoints").glob("g*/trained/m*")}
    assert on_disk == kept
    assert sorted(p.parent.parent.name for p in (store.path / "checkpoints").glob("g*/start/m*")) == ["g0003"] * 3
    with pytest.raises(RunStoreError, match=r"generation 1 start checkpoint of member \d+ was pruned"):
        store.load_population(1)
    assert len(store.load_population(3)) == 3
    pruned = next(e.record.index for e in trained[0] if e.record.index != best[0])
    with pytest.raises(RunStoreError, match=f"member {pruned}: its checkpoints were pruned"):
        store.trained_checkpoint(pruned)


def test_the_generations_best_is_the_top_score_and_ties_go_to_the_lower_index(tmp_path) -> None:
    store = RunStore.create(tmp_path, "r", "name='r'", {})
    population = founders([0, 1, 2])
    store.save_initial_population(population)
    trained = [EvaluatedMember(e.record, 1.0, score, {}, {}, e.state)
               for e, score in zip(evaluated(population, 0), [0.5, 2.0, 2.0])]
    store.commit_generation(0, trained, population, wall_s=3.0)
    assert [(g["generation"], g["best_index"], g["best_score"], g["wall_s"]) for g in store.all_generations()] == [
        (0, 1, 2.0, 3.0)]
    assert [r["index"] for r in store.evaluations(0)] == [1, 2, 0]  # best score first, then index
    row, path, digest = store.trained_checkpoint()
    assert row["index"] == 1 and path == store.path / "checkpoints/g0000/trained/m00001" and len(digest) == 64


def test_a_checkpoint_is_picked_by_generation_or_as_the_best_of_the_run(tmp_path) -> None:
    """`generation` reads that generation's kept checkpoint; `best` the highest score over every
    generation (of one member or of all), which need not be the last generation's elite."""
    store = RunStore.create(tmp_path, "r", "name='r'", {})
    population = founders([0, 1])
    store.save_initial_population(population)
    scores = [[1.0, 5.0], [4.0, 2.0]]  # member 1 peaks in generation 0; member 0 leads in generation 1
    for g, pair in enumerate(scores):
        trained = [EvaluatedMember(e.record, s, s, {}, {}, e.state) for e, s in zip(evaluated(population, g), pair)]
        store.commit_generation(g, trained, population, wall_s=1.0)
    assert store.trained_checkpoint()[0]["index"] == 0  # the last generation's elite
    row, path, _ = store.trained_checkpoint(best=True)
    assert (row["index"], row["generation"], row["score"]) == (1, 0, 5.0)
    assert path == store.path / "checkpoints/g0000/trained/m00001"
    assert store.trained_checkpoint(0, best=True)[0]["generation"] == 1
    assert store.trained_checkpoint(generation=0)[0]["index"] == 1  # generation 0's elite
    assert store.trained_checkpoint(1, generation=1)[0]["score"] == 2.0
    with pytest.raises(RunStoreError, match="member 0: no kept checkpoint of generation 0"):
        store.trained_checkpoint(0, generation=0)  # pruned: neither the last generation nor generation 0's best
    with pytest.raises(RunStoreError, match="generation 5 has no evaluations"):
        store.trained_checkpoint(generation=5)
    with pytest.raises(ValueError, match="not both"):
        store.trained_checkpoint(best=True, generation=0)


def test_lineage_walks_to_the_founder_with_each_ancestors_best_score(tmp_path) -> None:
    store, trained = _run(tmp_path, 2)
    child = max(m["index"] for m in store.all_members())
    chain = store.lineage(child)
    assert [m["index"] for m in chain][0] == child and chain[-1]["parent"] is None
    assert all(a["parent"] == b["index"] for a, b in zip(chain, chain[1:]))
    assert chain[0]["mutation"]["kind"] == "rl_hp" and chain[-1]["mutation"] is None
    founder_scores = [e.score for t in trained for e in t if e.record.index == chain[-1]["index"]]
    assert chain[-1]["best_score"] == max(founder_scores)
    with pytest.raises(RunStoreError, match="no member 99 in this run"):
        store.lineage(99)


def test_export_lookups_say_why_there_is_nothing(tmp_path) -> None:
    store = RunStore.create(tmp_path, "r", "name='r'", {})
    for best in (False, True):
        with pytest.raises(RunStoreError, match="no completed generation yet, nothing to export"):
            store.trained_checkpoint(best=best)
    with pytest.raises(RunStoreError, match="member 7: no such member"):
        store.trained_checkpoint(7)


def test_opening_and_creating_name_what_is_wrong(tmp_path) -> None:
    RunStore.create(tmp_path, "r", "name='r'", {}).close()
    with pytest.raises(RunStoreError, match="a run with this name exists; use `evo resume r`"):
        RunStore.create(tmp_path, "r", "name='r'", {})
    with pytest.raises(RunStoreError, match="no run 'nope'"):
        RunStore.open("nope", tmp_path)
    store = RunStore.open("r", tmp_path)
    assert store.name == "r" and store.status == "created" and store.experiment() == {}
    assert (store.path / "experiment.toml").read_text() == "name='r'"


def test_summary_reports_progress_and_the_best_score(tmp_path) -> None:
    store, trained = _run(tmp_path, 2)
    store.set(status="done")
    summary = store.summary()
    assert {k: summary[k] for k in ("name", "status", "generations_done", "generations", "agent")} == {
        "name": "r", "status": "done", "generations_done": 2, "generations": 5, "agent": "toy"}
    assert summary["best_score"] == max(e.score for e in trained[1])
    assert summary["created_at"] <= summary["updated_at"]


def test_failures_are_kept_per_attempt_and_a_redone_generation_overwrites(tmp_path) -> None:
    store = RunStore.create(tmp_path, "r", "name='r'", {})
    assert store.failures() == []  # the table is made on first use
    first = [Failure(1, "worker_lost", "node died", 1, 0, True), Failure(1, "error", "boom", 2, 0, False),
             Failure(2, "timeout", "slow", 1, 1, False)]
    store.record_failures(first)
    assert store.failures() == first and store.failures(1) == first[2:]
    store.record_failures([Failure(1, "error", "boom again", 2, 0, False)])
    assert [f.message for f in store.failures(0)] == ["node died", "boom again"]


def test_diversity_reads_back_per_generation_and_keeps_an_unmeasured_distance(tmp_path) -> None:
    store = RunStore.create(tmp_path, "r", "name='r'", {})
    population = founders([0, 1])
    store.save_initial_population(population)
    d0 = Diversity(2, 1, math.nan, [[0, 1]], {0: "aa", 1: "aa"})
    d1 = Diversity(2, 2, 0.25, [], {0: "aa", 1: "bb"})
    store.commit_generation(0, evaluated(population, 0), population, 1.0, diversity=d0)
    assert store.diversity(1) is None
    store.commit_generation(1, evaluated(population, 1), population, 1.0, diversity=d1)
    history = store.diversity_history()
    assert sorted(history) == [0, 1] and history[1] == d1 and store.diversity() == d1
    assert math.isnan(history[0].mean_distance) and history[0].identical == [[0, 1]] and history[0].digests == d0.digests
