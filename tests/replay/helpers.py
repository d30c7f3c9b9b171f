"""Shared test data for the replay store tests."""

from __future__ import annotations

import numpy as np

from evo.replay import Field, Schema

SCHEMA = Schema({"obs": Field("float32", (8,)), "action": Field("int64"), "reward": Field("float32"),
                 "next_obs": Field("float32", (8,)), "done": Field("bool")})

SEQ_SCHEMA = Schema({"episode": Field("int64"), "step": Field("int64"), "obs": Field("float32", (3,)),
                     "reward": Field("float32")})


def rows(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((n, 8), dtype=np.float32),
        "action": rng.integers(0, 4, n),
        "reward": rng.standard_normal(n, dtype=np.float32),
        "next_obs": rng.standard_normal((n, 8), dtype=np.float32),
        "done": rng.random(n) < 0.1,
    }


def take(batch: dict[str, np.ndarray], idx) -> dict[str, np.ndarray]:
    return {k: np.asarray(v)[idx] for k, v in batch.items()}


def concat(*batches: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def trajectory(episode: int, start: int, n: int) -> dict[str, np.ndarray]:
    """Rows start..start+n-1 of one trajectory; obs encodes (episode, step) so windows are checkable."""
    steps = np.arange(start, start + n, dtype=np.int64)
    return {
        "episode": np.full(n, episode, dtype=np.int64),
        "step": steps,
        "obs": np.stack([np.full(n, episode), steps, steps * 2], axis=1).astype(np.float32),
        "reward": steps.astype(np.float32),
    }


def assert_batches_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
