"""Ray-specific behaviour of ReplayService: restart from snapshot, blocking rate limits, sharing; and
of a sharded store on Ray: a killed shard actor brought back from a snapshot the driver wrote."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from evo.replay import RateLimited, RateLimiter, ReplayError, ReplayService
from evo.replay.sharded import ShardedReplay
from tests.replay.helpers import SCHEMA, assert_batches_equal, rows

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.usefixtures("ray_cluster")  # tests/conftest.py: one local Ray for the module


def test_actor_restart_restores_last_snapshot(tmp_path):
    svc = ReplayService.start(SCHEMA, snapshot_dir=tmp_path, snapshot_every=100, capacity=1000,
                              sampler="prioritized", seed=5)
    try:
        k1 = svc.insert(rows(60))
        assert not list(tmp_path.glob("snapshot-*"))
        k2 = svc.insert(rows(60, seed=1))  # 120 rows since the last snapshot -> snapshot
        assert len(list(tmp_path.glob("snapshot-*"))) == 1
        svc.update_priorities(k1[:5], np.full(5, 7.0))
        svc.snapshot()
        svc.insert(rows(10, seed=2))  # after the last snapshot: lost on a crash
        pid = svc.info()["pid"]
        ray.kill(svc.actor, no_restart=False)
        deadline = time.time() + 60
        while True:  # ray.kill is asynchronous and calls during the restart may fail: wait for the new process
            try:
                info = svc.info()
                if info["pid"] != pid:
                    break
            except Exception:
                if time.time() > deadline:
                    raise
            assert time.time() < deadline, "actor did not restart"
            time.sleep(0.2)
        assert info["restored_from"].endswith("snapshot-000002")
        assert len(svc) == 120
        assert svc.contains(np.concatenate([k1, k2])).all()
        assert_batches_equal(svc.get(k1), rows(60))
    finally:
        svc.stop()


def test_sample_blocks_until_insert_or_times_out():
    svc = ReplayService.start(SCHEMA, capacity=100, rate_limit_timeout_s=0.3,
                              rate_limiter=RateLimiter(min_size_to_sample=5))
    try:
        t0 = time.time()
        with pytest.raises(RateLimited, match="waited 0.3s"):
            svc.sample(2)
        assert time.time() - t0 >= 0.3
        out = {}

        def learner():
            out["batch"] = svc.sample(4, timeout=20)

        th = threading.Thread(target=learner)
        th.start()
        time.sleep(0.5)
        assert th.is_alive()  # waiting for data
        svc.insert(rows(5))
        th.join(20)
        assert len(out["batch"]) == 4
        with pytest.raises(ReplayError):  # ordinary errors are not retried
            svc.insert({"obs": np.zeros((1, 8), np.float32)})
    finally:
        svc.stop()


@ray.remote(num_cpus=0)
def collector(client, seed):
    return client.insert(rows(50, seed=seed))


def test_clients_shared_across_workers_deduplicate():
    svc = ReplayService.start(SCHEMA, name="replay-test", capacity=1000)
    try:
        other = ReplayService.connect("replay-test")
        keys = ray.get([collector.remote(svc, 0), collector.remote(other, 0), collector.remote(svc, 1)])
        np.testing.assert_array_equal(keys[0], keys[1])
        assert len(svc) == 100 and svc.stats()["duplicates"] == 50
        assert (svc.refcounts(keys[0]) == 2).all()
        assert other.capacity == 1000 and other.schema == SCHEMA
    finally:
        svc.stop()


# ---------------------------------------------------------------- a shard killed, restored from the driver's snapshot
def test_killed_shard_comes_back_from_the_drivers_snapshot(tmp_path, monkeypatch):
    s = ShardedReplay.start(SCHEMA, 2, capacity=400, sampler="prioritized", seed=6, max_restarts=1)
    try:
        keys = s.insert(rows(150, seed=1))
        s.update_priorities(keys[:40], np.linspace(0.1, 4.0, 40))
        path = s.snapshot(tmp_path / "snaps")  # written here, by the caller: the actors return arrays
        assert os.path.isfile(os.path.join(path, "COMPLETE"))
        stats, before = s.stats(), s.view_basis()
        s.insert(rows(20, seed=2))  # after the snapshot
        victim = s.actors[1]
        pid = ray.get(victim.info.remote())["pid"]
        ray.kill(victim, no_restart=False)
        deadline = time.time() + 90
        while True:  # the restarted actor is a fresh, empty shard
            try:
                if ray.get(victim.info.remote(), timeout=10)["pid"] != pid:
                    break
            except Exception:
                pass
            assert time.time() < deadline, "shard actor did not restart"
            time.sleep(0.2)
        assert len(s) < 170
        assert s.load_snapshot(tmp_path / "snaps") == path
        assert s.stats() == stats and s.contains(keys).all()
        after = s.view_basis()
        assert after.mass == pytest.approx(before.mass) and after.max_priority == before.max_priority
        # the restored store samples exactly as the same snapshot restored in process
        local = ShardedReplay.restore(tmp_path / "snaps", in_process=True)
        a, b = s.sample(64), local.sample(64)
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(a.weights, b.weights)
        assert_batches_equal(s.get(keys), rows(150, seed=1))
        # the run store's seam: it asks the shards for their arrays and writes the files itself
        from evo.replay import snapshot
        from evo.runstore import RunStore

        written = []
        write = snapshot._write_array
        monkeypatch.setattr(snapshot, "_write_array", lambda p, a: (written.append(p), write(p, a)))
        run = RunStore.create(tmp_path / "runs", "r", "", {})
        try:
            at3 = s.stats()
            run.snapshot_replay(s, 3)
            assert any("shard001." in os.path.basename(p) for p in written)  # written here, by this process
            assert (run.path / "replay" / "g0003").is_dir()
            s.insert(rows(5, seed=3))
            assert run.restore_replay(s, 3) and s.stats() == at3
        finally:
            run.close()
    finally:
        s.stop()
