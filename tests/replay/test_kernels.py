"""The numba kernels and the numpy fallback give identical results (keys, dedup, index, samples)."""

from __future__ import annotations

import numpy as np
import pytest

from evo.replay import ReplayStore, _kernels
from tests.replay.helpers import SCHEMA, concat, rows, take

pytestmark = pytest.mark.skipif(not _kernels.AVAILABLE, reason="numba not installed")


def _run(on: bool):
    prev = _kernels.set_enabled(on)
    try:
        s = ReplayStore(SCHEMA, capacity=700, sampler="prioritized", seed=5)
        out = []
        rng = np.random.default_rng(1)
        for i in range(12):
            b = rows(150, seed=i)
            if i:
                b = concat(b, take(rows(150, seed=i - 1), rng.integers(0, 150, 60)), take(b, [0, 0, 3]))
            k = s.insert(b)
            out.append(k)
            batch = s.sample(64)
            out += [batch.keys, batch.weights]
            s.update_priorities(batch.keys, rng.exponential(1.0, 64))
        out.append(s.refcounts(np.concatenate(out[::3])))
        return out, s.stats()
    finally:
        _kernels.set_enabled(prev)


def test_numba_and_numpy_paths_agree():
    a, sa = _run(True)
    b, sb = _run(False)
    assert sa == sb and sa["evicted"] > 0 and sa["duplicates"] > 0
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_key_bytes_column_survives_path_switch_and_restore(tmp_path):
    """The packed key-bytes column that confirms hash hits stays in step with the columns whichever
    path wrote them, and is rebuilt on restore: re-inserting stored rows dedupes every time."""
    prev = _kernels.set_enabled(True)
    try:
        s = ReplayStore(SCHEMA, capacity=300, seed=0)
        a, b = rows(200, seed=1), rows(200, seed=2)
        ka = s.insert(a)
        _kernels.set_enabled(False)
        kb = s.insert(b)  # wraps the ring: evicts 100 of a
        _kernels.set_enabled(True)
        assert (s.insert(b) == kb).all() and s.stats()["duplicates"] == 200
        s.snapshot(tmp_path)
        for on in (True, False):
            _kernels.set_enabled(on)
            r = ReplayStore.restore(tmp_path)
            assert (r.insert(b) == kb).all() and r.stats()["duplicates"] == 400
            assert (r.insert(take(a, range(100, 200))) == ka[100:]).all() and r.stats()["duplicates"] == 500
            np.testing.assert_array_equal(r._kb, s._kb)
    finally:
        _kernels.set_enabled(prev)
