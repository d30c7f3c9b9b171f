"""Ray-specific behaviour of ReplayService: restart from snapshot, blocking rate limits, sharing."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from evo.replay import RateLimited, RateLimiter, ReplayError, ReplayService
from tests.replay.helpers import SCHEMA, assert_batches_equal, rows

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024**2,
             log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


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
