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
from evo.replay.view import MemberView
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


# ---------------------------------------------------------------- a shard SIGKILLed mid-generation, restarted by Ray
def _sigkill_and_wait(actor, pid: int) -> None:
    import signal

    os.kill(pid, signal.SIGKILL)
    _wait_restart(actor, pid)


def _wait_restart(actor, pid: int) -> None:
    deadline = time.time() + 90
    while True:  # Ray restarts the process; its constructor restores the checkpoint and replays the log
        try:
            if ray.get(actor.info.remote(), timeout=10)["pid"] != pid:
                return
        except Exception:
            pass
        assert time.time() < deadline, "shard actor did not restart"
        time.sleep(0.2)


def test_a_shard_sigkilled_mid_generation_serves_the_same_reads_and_commits_once(tmp_path):
    """A run's sharded store (restart snapshots, as build_replay starts it): a member view reads, a
    shard's process is SIGKILLed mid-generation, Ray restarts it and the view's reads — one in flight
    while the shard was down — are those of a store nobody killed; the boundary's writes, then
    another kill, and the store equals the unkilled one (rows, refcounts, masses)."""
    kw = {"capacity": 2000, "sampler": "prioritized", "seed": 6}
    s = ShardedReplay.start(SCHEMA, 2, snapshot_dir=tmp_path / "restart", **kw)
    ref = ShardedReplay.in_process(SCHEMA, 2, **kw)
    try:
        for st in (s, ref):
            keys = st.insert(rows(300, seed=1))
            st.update_priorities(keys[:50], np.linspace(0.2, 3.0, 50))
        views = [MemberView(st, st.view_basis(), seed=5) for st in (s, ref)]  # view_basis: the checkpoint
        assert [i["restored_from"].endswith("snapshot-000001") for i in s.info()] == [True, True]
        for v in views:
            v.insert(rows(40, seed=2))
        reads = [[v.sample(64).keys for _ in range(4)] for v in views]
        pid = s.info()[1]["pid"]
        out: dict = {}
        reader = threading.Thread(target=lambda: out.update(k=[views[0].sample(64).keys for _ in range(20)]))
        import signal

        os.kill(pid, signal.SIGKILL)
        reader.start()  # reads while the shard is down or restarting: Ray retries them on the new process
        reader.join(120)
        _wait_restart(s.actors[1], pid)
        on_killed = {int(k) for k in keys if k % np.uint64(2) == 1}  # shard = key % 2
        assert any(on_killed & {int(x) for x in k} for k in out["k"])  # some reads came from the killed shard
        reads[1] += [views[1].sample(64).keys for _ in range(20)]
        reads[0] += out["k"]
        for a, b in zip(*reads):
            np.testing.assert_array_equal(a, b)
        for v in views:
            v.update_priorities(v.sample(32).keys, np.linspace(0.5, 2.0, 32))
        s.apply_staged(views[0].staged())
        ref.apply_staged(views[1].staged())
        _sigkill_and_wait(s.actors[0], s.info()[0]["pid"])  # after the boundary's writes, before a checkpoint
        assert [i["replayed"] for i in s.info()] == [1, 0]  # shard 0 replayed its logged part
        got, want = s.stats(), ref.stats()
        assert {k: got[k] for k in got if k != "samples"} == {k: want[k] for k in want if k != "samples"}
        keys = ref.sample(500).keys
        np.testing.assert_array_equal(s.refcounts(keys), ref.refcounts(keys))
        b1, b2 = s.view_basis(), ref.view_basis()
        np.testing.assert_allclose(np.array(b1.parts), np.array(b2.parts), rtol=1e-9)
        assert b1.max_priority == b2.max_priority
    finally:
        s.stop()


def test_a_runs_replay_store_removes_its_restart_snapshots_when_it_stops():
    """build_replay gives a run's shards restart snapshots in a temporary directory of their own; stopping
    the store (the scheduler's close) removes it."""
    from evo.replay import ReplaySpec, build_replay

    spec = ReplaySpec(SCHEMA, capacity=100, shards=2)
    store = build_replay(spec, seed=0, distributed=True)
    store.insert(rows(10))
    store.view_basis()  # a generation's start: the shards checkpoint
    root = store._snapshot_dir
    assert any(os.scandir(root))
    store.stop()
    assert not os.path.exists(root)
