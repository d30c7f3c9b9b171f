"""A hash hit is only a duplicate after a content check: forced collisions never merge rows."""

from __future__ import annotations

import numpy as np
import pytest

from evo.replay import ReplayError, ReplayStore, hash_rows
from tests.replay.helpers import SCHEMA, assert_batches_equal, concat, rows, take


def tiny_hash(schema, arrays):
    """4 distinct values: nearly every pair of rows collides."""
    return hash_rows(schema, arrays) & np.uint64(3)


def test_colliding_rows_are_kept_apart_and_duplicates_still_found(tmp_path):
    s = ReplayStore(SCHEMA, capacity=200, hash_fn=tiny_hash, sampler="prioritized")
    b = rows(40)
    k1 = s.insert(b)
    assert len(s) == 40 and len(np.unique(k1)) == 40
    assert_batches_equal(s.get(k1), b)
    assert s.stats()["collisions"] > 0
    # duplicates (within the batch and of stored rows) still resolve to the same keys
    k2 = s.insert(concat(take(b, [5, 5, 39]), rows(3, seed=1), take(rows(3, seed=1), [0])))
    assert k2[0] == k2[1] == k1[5] and k2[2] == k1[39]
    assert k2[6] == k2[3]
    assert len(s) == 43
    assert s.refcounts(k1[[5, 39]]).tolist() == [3, 2]
    # keys are deterministic: a second store fed the same rows in the same order agrees
    t = ReplayStore(SCHEMA, capacity=200, hash_fn=tiny_hash)
    np.testing.assert_array_equal(t.insert(b), k1)
    # snapshot needs the same hash function back
    s.snapshot(tmp_path)
    with pytest.raises(ReplayError, match="custom hash_fn"):
        ReplayStore.restore(tmp_path)
    r = ReplayStore.restore(tmp_path, hash_fn=tiny_hash)
    np.testing.assert_array_equal(r.insert(take(b, [7])), k1[[7]])
    assert_batches_equal(r.get(k1), b)


def test_collisions_with_eviction():
    s = ReplayStore(SCHEMA, capacity=16, hash_fn=tiny_hash)
    seen = {}
    for i in range(10):
        b = rows(8, seed=i)
        for k, j in zip(s.insert(b).tolist(), range(8)):
            seen[k] = take(b, [j])
        live = [k for k in seen if s.contains(np.array([k], np.uint64))[0]]
        assert len(live) == len(s) <= 16
        for k in live:
            assert_batches_equal(s.get(np.array([k], np.uint64)), seen[k])


def test_constant_hash_degrades_but_stays_correct():
    s = ReplayStore(SCHEMA, capacity=64, hash_fn=lambda schema, a: np.zeros(len(a["action"]), np.uint64))
    b = rows(30)
    k = s.insert(concat(b, b))
    np.testing.assert_array_equal(k[:30], k[30:])
    assert len(np.unique(k[:30])) == 30
    assert_batches_equal(s.get(k[:30]), b)


def test_reserved_empty_key_is_remixed():
    s = ReplayStore(SCHEMA, capacity=8, hash_fn=lambda schema, a: np.full(len(a["action"]), 2**64 - 1, np.uint64))
    k = s.insert(rows(3))
    assert (k != np.uint64(2**64 - 1)).all() and s.contains(k).all()
    assert not s.contains(np.array([2**64 - 1], np.uint64))[0]


def test_nan_rows_deduplicate_bitwise():
    b = rows(2)
    b["reward"][:] = np.nan
    s = ReplayStore(SCHEMA, capacity=8)
    k1, k2 = s.insert(b), s.insert(b)
    np.testing.assert_array_equal(k1, k2)
    assert len(s) == 2
