"""Run store pieces not covered through the CLI: replay snapshots per generation, pruning, listing."""

from __future__ import annotations

import numpy as np

from evo.replay import Field, ReplayStore, Schema
from evo.runstore import RunStore


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
