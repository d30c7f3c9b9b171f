"""One contract suite, run against every backend (Optuna's StorageTestCase idea): in-process memory,
in-process mmap, the Ray service (one shard), and a sharded store (3 shards) in process and on Ray.

A few tests pin behaviour of one store's single FIFO ring and single rate limiter (exact eviction
order, the exact sample/insert balance); a sharded store keeps those per shard (docs/replay.md,
"Shards"), so those tests skip it and tests/replay/test_sharded.py checks the per-shard versions."""

from __future__ import annotations

import numpy as np
import pytest

import evo.replay
from evo.replay import RateLimited, RateLimiter, ReplayError, ReplayService, ReplayStore
from evo.replay.sharded import ShardedReplay
from tests.replay.helpers import SCHEMA, SEQ_SCHEMA, assert_batches_equal, concat, rows, take, trajectory

BACKENDS = ["memory", "mmap", "ray", "sharded",
            pytest.param("sharded-ray", marks=pytest.mark.slow)]  # 3 actors per store: ~10 s a test here
SHARDS = 3


def one_ring_only(make, why: str) -> None:
    """Skip a test of one store's single ring/limiter for the sharded backends (see the module docstring)."""
    if make.backend.startswith("sharded"):
        pytest.skip(f"per shard in a sharded store: {why}")


@pytest.fixture(params=BACKENDS)
def make(request, tmp_path):
    """Factory: make(schema, **store_kwargs) -> a store-like object of the parametrised backend."""
    made = []

    def factory(schema=SCHEMA, **kw):
        if request.param == "memory":
            s = ReplayStore(schema, storage="memory", **kw)
        elif request.param == "mmap":
            s = ReplayStore(schema, storage="mmap", path=tmp_path / "cols", **kw)
        elif request.param == "sharded":
            s = ShardedReplay.in_process(schema, SHARDS, **kw)
        elif request.param == "sharded-ray":
            request.getfixturevalue("ray_cluster")
            s = ShardedReplay.start(schema, SHARDS, rate_limit_timeout_s=kw.pop("rate_limit_timeout_s", 0.5), **kw)
        else:
            request.getfixturevalue("ray_cluster")
            s = ReplayService.start(schema, rate_limit_timeout_s=kw.pop("rate_limit_timeout_s", 0.5), **kw)
        made.append(s)
        return s

    def restore(dir):
        """A new store of this backend's kind restored from a snapshot `s.snapshot(dir)` wrote."""
        if request.param == "sharded":
            return ShardedReplay.restore(dir, in_process=True)
        if request.param == "sharded-ray":
            s = ShardedReplay.restore(dir)
            made.append(s)
            return s
        return ReplayStore.restore(dir)

    factory.backend = request.param
    factory.restore = restore
    yield factory
    for s in made:
        if isinstance(s, (ReplayService, ShardedReplay)):
            s.stop()


def test_backend_is_a_replay(make):
    """Members are typed against the `evo.replay.Replay` protocol: every backend must satisfy it."""
    assert isinstance(make(capacity=8), evo.replay.Replay)


def test_insert_get_roundtrip(make):
    s = make(capacity=100)
    b = rows(10)
    keys = s.insert(b)
    assert keys.dtype == np.uint64 and keys.shape == (10,)
    assert len(set(keys.tolist())) == 10
    assert len(s) == 10 and s.capacity == 100
    assert_batches_equal(s.get(keys), b)
    assert_batches_equal(s.get(keys[::-1]), take(b, slice(None, None, -1)))


def test_duplicates_return_existing_key_and_count(make):
    s = make(capacity=100)
    b = rows(10)
    k1 = s.insert(b)
    k2 = s.insert(concat(take(b, [3, 3]), rows(1, seed=9)))
    assert k2[0] == k2[1] == k1[3]
    assert len(s) == 11
    rc = s.refcounts(k1)
    assert rc[3] == 3 and (np.delete(rc, 3) == 1).all()
    st = s.stats()
    assert st["duplicates"] == 2 and st["rows_new"] == 11 and st["rows_inserted"] == 13


def test_contains(make):
    s = make(capacity=100)
    keys = s.insert(rows(5))
    other = np.array([1, 2, int(keys[0])], dtype=np.uint64)
    np.testing.assert_array_equal(s.contains(other), [False, False, True])
    assert s.contains(keys).all()


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda b: {k: v for k, v in b.items() if k != "done"}, "missing \\['done'\\]"),
        (lambda b: {**b, "extra": b["done"]}, "unexpected \\['extra'\\]"),
        (lambda b: {**b, "reward": b["reward"].astype(np.float64)}, "'reward': expected dtype float32, found float64"),
        (lambda b: {**b, "obs": b["obs"][:, :7]}, "'obs': expected shape"),
        (lambda b: {**b, "action": b["action"][:3]}, "'action': has 3 rows"),
    ],
)
def test_bad_batch_writes_nothing(make, bad, match):
    s = make(capacity=100)
    s.insert(rows(4, seed=1))
    with pytest.raises(ReplayError, match=match):
        s.insert(bad(rows(5, seed=2)))
    assert len(s) == 4 and s.stats()["rows_inserted"] == 4
    assert not s.contains(s.hash(rows(5, seed=2))).any()


def test_fifo_eviction_keys_leave_the_map(make):
    one_ring_only(make, "which rows a full store evicts")
    s = make(capacity=10)
    k1 = s.insert(rows(6, seed=1))
    k2 = s.insert(rows(6, seed=2))
    assert len(s) == 10
    np.testing.assert_array_equal(s.contains(k1), [False, False, True, True, True, True])
    assert s.contains(k2).all()
    with pytest.raises(ReplayError, match="not in the store"):
        s.get(k1[:1])
    # a re-inserted evicted row is new again (same content, same key)
    k3 = s.insert(take(rows(6, seed=1), [0]))
    assert k3[0] == k1[0] and s.contains(k3).all() and len(s) == 10
    assert s.stats()["evicted"] == 3


def test_batch_larger_than_capacity_is_refused(make):
    one_ring_only(make, "each shard refuses more distinct rows than its slice of the capacity")
    s = make(capacity=4)
    with pytest.raises(ReplayError, match="exceeds the store's capacity"):
        s.insert(rows(5))
    assert len(s) == 0
    s.insert(concat(rows(4), rows(4)))  # 8 rows but only 4 new: fits
    assert len(s) == 4


def test_uniform_sample_is_valid_and_seeded(make):
    a, b = make(capacity=1000, seed=7), make(capacity=1000, seed=7)
    data = rows(500)
    a.insert(data)
    b.insert(data)
    sa, sb = a.sample(64), b.sample(64)
    np.testing.assert_array_equal(sa.keys, sb.keys)
    assert sa.weights.dtype == np.float32 and (sa.weights == 1).all()
    assert_batches_equal(sa.data, a.get(sa.keys))
    assert len(np.unique(np.concatenate([a.sample(256).keys for _ in range(20)]))) > 400


def test_sample_empty_store_errors(make):
    s = make(capacity=10)
    with pytest.raises(ReplayError, match="empty"):
        s.sample(4)


def test_prioritized_sampling(make):
    s = make(capacity=1000, sampler="prioritized", alpha=1.0, beta=1.0, seed=3)
    keys = s.insert(rows(100))
    # new rows get max priority (1.0): uniform at first
    assert (s.sample(32).weights == 1).all()
    pr = np.full(100, 0.01)
    pr[:5] = 10.0
    assert s.update_priorities(keys, pr) == 100
    drawn = np.concatenate([s.sample(128).keys for _ in range(10)])
    assert np.isin(drawn, keys[:5]).mean() > 0.9  # 50 / (50 + 0.95) of the mass
    batch = s.sample(256)
    # weights = (p_min / p_i)^beta: 1 for the lowest priority, 0.001 for the 10.0 rows
    w = dict(zip(batch.keys.tolist(), batch.weights.tolist()))
    for k, wi in w.items():
        expected = 0.001 if k in set(keys[:5].tolist()) else 1.0
        assert wi == pytest.approx(expected, rel=1e-5)
    # a new row enters at the max priority seen (10.0)
    knew = s.insert(rows(1, seed=99))
    drawn = np.concatenate([s.sample(256).keys for _ in range(4)])
    assert np.isin(drawn, knew).mean() > 0.1
    # unknown keys are ignored (count says how many were updated)
    assert s.update_priorities(np.array([12345, keys[0]], dtype=np.uint64), [1.0, 1.0]) == 1
    with pytest.raises(ReplayError, match="priorities must be finite"):
        s.update_priorities(keys[:1], [-1.0])


def test_update_priorities_needs_prioritized(make):
    s = make(capacity=10)
    keys = s.insert(rows(3))
    with pytest.raises(ReplayError, match="sampler='prioritized'"):
        s.update_priorities(keys, [1.0, 2.0, 3.0])


def test_sequences(make):
    s = make(SEQ_SCHEMA, capacity=1000, episode_field="episode", seed=1)
    # two trajectories arriving interleaved over several calls
    s.insert(trajectory(1, 0, 3))
    s.insert(concat(trajectory(2, 0, 4), trajectory(1, 3, 2)))
    s.insert(trajectory(2, 4, 1))
    batch = s.sample_sequences(64, 4)
    assert batch.data["obs"].shape == (64, 4, 3) and batch.mask.shape == (64, 4)
    for i in range(64):
        ep = int(batch.data["episode"][i, 0])
        st = int(batch.data["step"][i, 0])
        n_ep = 5
        valid = min(4, n_ep - st)
        np.testing.assert_array_equal(batch.mask[i], np.arange(4) < valid)
        np.testing.assert_array_equal(batch.data["step"][i, :valid], np.arange(st, st + valid))
        assert (batch.data["episode"][i, :valid] == ep).all()
        assert (batch.data["obs"][i, valid:] == 0).all() and (batch.data["step"][i, valid:] == 0).all()
    assert_batches_equal(take(batch.data, (slice(None), 0)), s.get(batch.keys))


def test_sequences_need_episode_field(make):
    s = make(capacity=10)
    s.insert(rows(3))
    with pytest.raises(ReplayError, match="episode_field"):
        s.sample_sequences(2, 3)


def test_rate_limiter_min_size(make):
    s = make(capacity=100, rate_limiter=RateLimiter(min_size_to_sample=10))
    s.insert(rows(5))
    with pytest.raises(RateLimited, match="min_size_to_sample=10"):
        s.sample(2)
    s.insert(rows(5, seed=1))
    assert len(s.sample(2)) == 2


def test_rate_limiter_samples_per_insert(make):
    one_ring_only(make, "the sample/insert balance, each shard with 1/N of the error buffer")
    lim = RateLimiter(min_size_to_sample=4, samples_per_insert=2.0, error_buffer=8.0)
    s = make(capacity=100, rate_limiter=lim)
    s.insert(rows(4))  # diff = 8 = offset
    s.sample(8)  # diff 0 >= offset - buffer = 0
    with pytest.raises(RateLimited):
        s.sample(1)
    with pytest.raises(RateLimited, match="never pass"):
        s.sample(100)
    s.insert(rows(2, seed=5))  # +4
    s.sample(4)
    # duplicates buy no samples
    s.insert(rows(2, seed=5))
    with pytest.raises(RateLimited):
        s.sample(1)
    # collector too far ahead: diff is 0 and may reach offset + buffer = 16: 8 new rows, not 9
    s.insert(rows(8, seed=6))
    with pytest.raises(RateLimited, match="insert refused"):
        s.insert(rows(1, seed=7))


def test_snapshot_restore_exact(make, tmp_path):
    s = make(SEQ_SCHEMA, capacity=50, sampler="prioritized", episode_field="episode", seed=4)
    for ep in range(8):
        s.insert(trajectory(ep, 0, 9))  # 72 rows into 50 slots: wraps and evicts
    s.insert(trajectory(3, 0, 2))  # evicted rows come back; duplicates of live rows bump refcounts
    keys = s.sample(16).keys
    s.update_priorities(keys, np.linspace(0.1, 5.0, 16))
    path = s.snapshot(tmp_path / "snaps")
    r = make.restore(tmp_path / "snaps")
    assert len(r) == len(s) and r.stats() == s.stats()
    all_keys = r.sample(200).keys
    np.testing.assert_array_equal(s.sample(200).keys, all_keys)
    # continue identically: samples, sequences, inserts
    a, b = s.sample(32), r.sample(32)
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.weights, b.weights)
    sa, sb = s.sample_sequences(8, 5), r.sample_sequences(8, 5)
    assert_batches_equal(sa.data, sb.data)
    np.testing.assert_array_equal(sa.mask, sb.mask)
    np.testing.assert_array_equal(s.refcounts(all_keys), r.refcounts(all_keys))
    assert_batches_equal(s.get(all_keys), r.get(all_keys))
    np.testing.assert_array_equal(s.insert(trajectory(9, 0, 3)), r.insert(trajectory(9, 0, 3)))
    np.testing.assert_array_equal(s.sample(64).keys, r.sample(64).keys)
    np.testing.assert_array_equal(s.contains(all_keys), r.contains(all_keys))
    assert path.endswith("snapshot-000001")


def test_load_snapshot_replaces_state_in_place(make, tmp_path):
    s = make(SEQ_SCHEMA, capacity=50, sampler="prioritized", episode_field="episode", seed=4)
    for ep in range(7):
        s.insert(trajectory(ep, 0, 9))  # wraps and evicts
    keys = s.sample(16).keys
    s.update_priorities(keys, np.linspace(0.1, 5.0, 16))
    path = s.snapshot(tmp_path / "snaps")
    ref = make.restore(tmp_path / "snaps")  # what the store must look like after loading
    # diverge: new rows (evicting old ones), samples (RNG and limiter state), priorities
    later = s.insert(trajectory(20, 0, 12))
    s.sample(40)
    s.update_priorities(keys, np.full(16, 9.0))
    assert s.load_snapshot(tmp_path / "snaps") == path
    assert len(s) == len(ref) and s.stats() == ref.stats() and s.capacity == 50
    assert not s.contains(later).any()
    live = ref.sample(200).keys
    np.testing.assert_array_equal(s.sample(200).keys, live)
    a, b = s.sample(32), ref.sample(32)
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.weights, b.weights)
    sa, sb = s.sample_sequences(8, 5), ref.sample_sequences(8, 5)
    assert_batches_equal(sa.data, sb.data)
    np.testing.assert_array_equal(sa.mask, sb.mask)
    np.testing.assert_array_equal(s.refcounts(live), ref.refcounts(live))
    assert_batches_equal(s.get(live), ref.get(live))
    np.testing.assert_array_equal(s.insert(trajectory(9, 0, 3)), ref.insert(trajectory(9, 0, 3)))
    np.testing.assert_array_equal(s.sample(64).keys, ref.sample(64).keys)
    # a store of another capacity and schema takes on the snapshot's whole state
    t = make(SCHEMA, capacity=20, seed=1)
    t.insert(rows(6))  # at most 6 rows per shard of a 3-shard store
    assert t.load_snapshot(tmp_path / "snaps") == path
    assert t.capacity == 50 and set(t.schema.fields) == set(SEQ_SCHEMA.fields)
    fresh = make.restore(tmp_path / "snaps")
    np.testing.assert_array_equal(t.sample(64).keys, fresh.sample(64).keys)
    # no complete snapshot: an error, and the store is left as it was
    n = len(t)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReplayError, match="no complete snapshot"):
        t.load_snapshot(tmp_path / "empty")
    assert len(t) == n and t.contains(fresh.sample(8).keys).all()
