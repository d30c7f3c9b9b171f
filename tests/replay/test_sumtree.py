"""The two-level sum tree draws in proportion to priority and never draws a zero."""

from __future__ import annotations

import numpy as np

from evo.replay.samplers import BLOCK, PrioritizedSampler, SumTree


def test_find_matches_proportions():
    n = 5 * BLOCK + 7
    t = SumTree(n)
    rng = np.random.default_rng(0)
    p = rng.exponential(1.0, n)
    p[rng.random(n) < 0.3] = 0.0  # zero-priority leaves (and empty ones past n) are never drawn
    t.set(np.arange(n), p)
    assert t.total == np.cumsum(t._bsum)[-1]
    u = np.sort(rng.random(200_000)) * t.total
    leaf = t.find(u)
    counts = np.bincount(leaf, minlength=t.leaves.size)
    assert counts[n:].sum() == 0 and counts[:n][p == 0].sum() == 0
    expected = p / p.sum() * u.size
    big = expected > 50
    assert np.abs(counts[:n][big] - expected[big]).max() < 6 * np.sqrt(expected[big]).max()
    assert t.min == p[p > 0].min()


def test_boundaries_and_exact_rebuild():
    t = SumTree(3 * BLOCK)
    t.set(np.array([0, BLOCK, 3 * BLOCK - 1]), np.array([1.0, 2.0, 3.0]))
    edges = np.array([0.0, 0.999999, 1.0, 2.999999, 3.0, np.nextafter(6.0, 0)])
    np.testing.assert_array_equal(t.find(edges), [0, 0, BLOCK, BLOCK, 3 * BLOCK - 1, 3 * BLOCK - 1])
    # scattered updates then rebuild-from-leaves give bit-identical prefixes
    rng = np.random.default_rng(1)
    for _ in range(20):
        idx = rng.integers(0, 3 * BLOCK, 17)
        t.set(idx, rng.random(17))
    r = SumTree(3 * BLOCK)
    r.leaves[:] = t.leaves
    r.rebuild()
    np.testing.assert_array_equal(r._pref, t._pref)
    np.testing.assert_array_equal(r._bcum, t._bcum)


def test_sampler_weights_normalised_by_global_max():
    s = PrioritizedSampler(100, alpha=0.5, beta=0.7)
    s.on_insert(np.arange(10))
    s.update(np.arange(10), np.arange(1, 11, dtype=float))
    slots, w = s.sample(np.random.default_rng(0), 10, 512)
    p = np.arange(1, 11, dtype=float) ** 0.5
    np.testing.assert_allclose(w, (p.min() / p[slots]) ** 0.7, rtol=1e-6)
    assert w.max() <= 1.0
