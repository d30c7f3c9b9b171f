"""KeyIndex against a dict model, through overflow, eviction and rebuilds."""

from __future__ import annotations

import numpy as np

from evo.replay.index import KeyIndex


def test_index_matches_dict_model_under_fifo_churn():
    cap = 512
    ix = KeyIndex(cap)
    # a deliberately poor home multiplier: every key below lands in one of 4 buckets, so chains overflow
    ix._mul = np.uint64(1 << 22)
    model: dict[int, int] = {}
    rng = np.random.default_rng(0)
    nxt = 0
    for step in range(150):
        n = int(rng.integers(1, 60))
        keys = np.unique(rng.integers(0, 2000, n).astype(np.uint64) * np.uint64(2**40) + np.uint64(step % 7))
        keys = keys[ix.lookup(keys) < 0]
        slots = (nxt + np.arange(keys.size)) % cap
        nxt = (nxt + keys.size) % cap
        ix.remove_slots(slots)
        for k in [k for k, v in model.items() if v in set(slots.tolist())]:
            del model[k]
        ix.add(keys, slots)
        model.update(zip(keys.tolist(), slots.tolist()))
        probe = np.concatenate([keys, rng.integers(0, 2000, 50).astype(np.uint64) * np.uint64(2**40)])
        expected = [model.get(int(k), -1) for k in probe]
        np.testing.assert_array_equal(ix.lookup(probe), expected)
        assert len(ix) == len(model)
    assert ix.rebuilds > 0  # overflow marks accumulated under churn and the table was rebuilt


def test_refcounts_and_reset_from():
    ix = KeyIndex(8)
    ix.add(np.array([10, 20, 30], np.uint64), np.array([0, 1, 2]))
    ix.bump(np.array([1, 1, 2]))
    assert ix.refcount[:3].tolist() == [1, 3, 2]
    live = ix.slot_pos >= 0
    jx = KeyIndex(8)
    jx.reset_from(ix.slot_key, live, ix.refcount)
    np.testing.assert_array_equal(jx.lookup(np.array([30, 10, 20, 40], np.uint64)), [2, 0, 1, -1])
    assert jx.refcount[:3].tolist() == [1, 3, 2]
    ix.remove_slots(np.array([1]))
    assert ix.lookup(np.array([20], np.uint64))[0] == -1 and ix.refcount[1] == 0 and len(ix) == 2
