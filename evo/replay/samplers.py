"""Samplers: which slots a batch is drawn from, and with what importance weights.

Every sampler draws from the store's own seeded ``numpy.random.Generator`` so sampling is
reproducible and its state is part of a snapshot. A sampler sees slots ``0..size-1`` only; the
store maps slots back to keys and data.

The prioritised sampler keeps ``priority ** alpha`` in a two-level sum tree whose levels hold
prefix sums, so a batch is found with two ``searchsorted`` calls instead of a Python-level walk;
that is what makes >10^4 prioritised batches per second possible from Python at a million rows.
Per-block minima give the smallest live priority, so importance weights are normalised by the
global maximum weight, as in Schaul et al. (2016).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from evo.replay import _kernels
from evo.replay.errors import ReplayError

BLOCK = 64  # leaves per block of the two-level sum tree
LINE = 8  # leaves per 64-byte cache line of a block's prefixes


class Sampler(Protocol):
    """What the store needs from a sampler."""

    def on_insert(self, slots: np.ndarray) -> None: ...
    def sample(self, rng: np.random.Generator, size: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]: ...
    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None: ...
    def state(self) -> dict: ...
    def load_state(self, state: dict) -> None: ...


class UniformSampler:
    """Each stored row equally likely; weights are ones."""

    name = "uniform"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    def on_insert(self, slots: np.ndarray) -> None:
        pass

    def sample(self, rng: np.random.Generator, size: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        # floor(U * size): uniform over 0..size-1 (to 2**-53) and ~2x faster than rng.integers here
        slots = (rng.random(batch_size) * size).astype(np.int64)
        return slots, np.ones(batch_size, dtype=np.float32)

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        raise ReplayError("update_priorities needs sampler='prioritized'; this store samples uniformly")

    def state(self) -> dict:
        return {}

    def arrays(self) -> dict[str, np.ndarray]:
        return {}

    def load_state(self, state: dict, arrays: dict[str, np.ndarray] | None = None) -> None:
        pass


class SumTree:
    """A two-level sum tree: root -> blocks of ``BLOCK`` leaves -> leaves, with prefix sums per level.

    Both levels keep running prefix sums instead of plain node sums, so a whole batch descends in
    two vectorised steps: a ``searchsorted`` over the block prefixes (small, cache-resident), then
    one gather of each chosen block's 64 leaf prefixes (one contiguous 512-byte read per draw) and
    an ``argmax`` for the first prefix past the target. A per-level Python loop or a binary search
    over all leaves costs far more (the latter is dominated by cache misses at a million leaves).
    An update rewrites the prefixes of the blocks it touches plus one cumsum over the block sums.
    Zero-priority leaves add nothing to a prefix, so they are never drawn. Restore recomputes
    everything with the same formulas, so a restored tree samples bit-identically.
    """

    def __init__(self, capacity: int) -> None:
        self.nblocks = max(1, -(-capacity // BLOCK))
        self.leaves = np.zeros(self.nblocks * BLOCK, dtype=np.float64)
        self._pref = np.zeros((self.nblocks, BLOCK), dtype=np.float64)
        # every LINE-th prefix of each block (its running sum at the end of each 8-leaf cache line),
        # contiguous: a draw reads one line of these, then one line of _pref
        self._sub = np.zeros((self.nblocks, BLOCK // LINE), dtype=np.float64)
        self._bsum = np.zeros(self.nblocks, dtype=np.float64)
        self._bmin = np.full(self.nblocks, np.inf, dtype=np.float64)
        self._bcum = np.zeros(self.nblocks, dtype=np.float64)
        self._bstart = np.zeros(self.nblocks, dtype=np.float64)  # exactly _bcum shifted by one
        self._min = float("inf")

    @property
    def total(self) -> float:
        return float(self._bcum[-1])

    @property
    def min(self) -> float:
        """Smallest positive leaf (inf if none)."""
        return self._min

    def _refresh(self, blocks: np.ndarray | slice) -> None:
        lv = self.leaves.reshape(-1, BLOCK)[blocks]
        pre = np.cumsum(lv, axis=1)
        self._pref[blocks] = pre
        self._sub[blocks] = pre[:, LINE - 1 :: LINE]
        self._bsum[blocks] = pre[:, -1]
        self._bmin[blocks] = np.where(lv > 0, lv, np.inf).min(axis=1)
        np.cumsum(self._bsum, out=self._bcum)
        self._bstart[1:] = self._bcum[:-1]
        self._min = float(self._bmin.min())

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set leaves (values > 0, or 0 for 'never sample') and refresh the blocks they live in."""
        idx = np.asarray(idx, dtype=np.int64)
        if not idx.size:
            return
        values = np.asarray(values)
        if idx.size > 1:
            # a leaf set twice in one call keeps its last value (a prioritised batch can draw a row twice; a
            # generation's coalesced priority updates repeat rows): numpy leaves repeated assignment's order open
            _, first_from_end = np.unique(idx[::-1], return_index=True)
            if first_from_end.size < idx.size:
                last = np.sort(idx.size - 1 - first_from_end)
                idx, values = idx[last], values[last]
        self.leaves[idx] = values
        lo, hi = int(idx.min()) // BLOCK, int(idx.max()) // BLOCK
        if hi - lo + 1 <= 2 * idx.size:  # compact span (fresh ring slots): refresh a slice of blocks
            self._refresh(slice(lo, hi + 1))
        else:
            self._refresh(np.unique(idx // BLOCK))

    def rebuild(self) -> None:
        self._refresh(slice(None))

    def find(self, u: np.ndarray) -> np.ndarray:
        """Leaf index for each prefix-sum target ``u`` in [0, total)."""
        if _kernels.enabled():
            return _kernels.find(u, self._bcum, self._bstart, self._sub, self._pref, self.leaves)
        b = np.searchsorted(self._bcum, u, side="right")  # u < total, so b < nblocks and bsum[b] > 0
        r = u - self._bstart[b]
        # first leaf whose running sum passes r: prefixes are non-decreasing, so that is the count of
        # prefixes <= r - first over the block's per-line sums, then within the chosen line
        g = (self._sub.take(b, axis=0) <= r[:, None]).sum(axis=1)
        past = g == BLOCK // LINE  # rounding put r at the block's end: take its last live leaf
        g = np.minimum(g, BLOCK // LINE - 1)
        lines = self._pref.reshape(-1, LINE).take(b * (BLOCK // LINE) + g, axis=0)
        j = g * LINE + (lines <= r[:, None]).sum(axis=1)
        if past.any():
            for i in np.flatnonzero(past):
                j[i] = int(np.flatnonzero(self.leaves[b[i] * BLOCK : (b[i] + 1) * BLOCK] > 0)[-1])
        return b * BLOCK + j


class PrioritizedSampler:
    """Proportional prioritised replay: P(i) = p_i^alpha / sum_k p_k^alpha; w_i = (N P(i))^-beta / max w.

    New rows get the largest priority seen so far (so every row is sampled at least once with high
    probability). Batches are stratified: one draw from each of ``batch_size`` equal slices of the mass.
    """

    name = "prioritized"

    def __init__(self, capacity: int, alpha: float = 0.6, beta: float = 0.4) -> None:
        if alpha < 0 or beta < 0:
            raise ReplayError(f"alpha and beta must be >= 0, found alpha={alpha}, beta={beta}")
        self.capacity, self.alpha, self.beta = capacity, float(alpha), float(beta)
        self.tree = SumTree(capacity)
        self.max_priority = 1.0

    def on_insert(self, slots: np.ndarray) -> None:
        self.tree.set(slots, np.full(len(slots), self.max_priority**self.alpha))

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        p = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if p.shape[0] != len(slots):
            raise ReplayError(f"update_priorities: {len(slots)} keys but {p.shape[0]} priorities")
        if not np.all(np.isfinite(p)) or np.any(p < 0):
            raise ReplayError("update_priorities: priorities must be finite and >= 0 (add a small epsilon yourself)")
        if p.size:
            self.max_priority = max(self.max_priority, float(p.max()))
            self.tree.set(slots, p**self.alpha)

    def sample(self, rng: np.random.Generator, size: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        total = self.tree.total
        if not total > 0:
            raise ReplayError("prioritized sampling: every stored row has priority 0")
        u = rng.random(batch_size)
        u += np.arange(batch_size)
        u *= total / batch_size
        np.minimum(u, np.nextafter(total, 0), out=u)
        slots = self.tree.find(u)
        p = self.tree.leaves[slots]
        # (N P_min)^beta / (N P_i)^beta == (p_min / p_i)^beta: normalised by the largest weight.
        weights = (self.tree.min / p) ** self.beta
        return slots, weights.astype(np.float32)

    def state(self) -> dict:
        return {"alpha": self.alpha, "beta": self.beta, "max_priority": self.max_priority}

    def arrays(self) -> dict[str, np.ndarray]:
        return {"priority_leaves": self.tree.leaves}

    def load_state(self, state: dict, arrays: dict[str, np.ndarray] | None = None) -> None:
        self.alpha, self.beta = float(state["alpha"]), float(state["beta"])
        self.max_priority = float(state["max_priority"])
        if arrays is not None:
            leaves = arrays["priority_leaves"]
            self.tree.leaves[: leaves.shape[0]] = leaves
            self.tree.rebuild()


def make_sampler(kind: str, capacity: int, alpha: float, beta: float):
    if kind == "uniform":
        return UniformSampler(capacity)
    if kind in ("prioritized", "prioritised"):
        return PrioritizedSampler(capacity, alpha, beta)
    raise ReplayError(f"sampler must be 'uniform' or 'prioritized', found {kind!r}")


def follow(succ: np.ndarray, start: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Walk ``length-1`` trajectory links from each start slot: slots [B, length] and a validity mask."""
    b = start.shape[0]
    slots = np.zeros((b, length), dtype=np.int64)
    mask = np.zeros((b, length), dtype=bool)
    cur = start.astype(np.int64)
    alive = np.ones(b, dtype=bool)
    for t in range(length):
        slots[:, t] = np.where(alive, cur, 0)
        mask[:, t] = alive
        if t + 1 < length:
            nxt = succ[np.where(alive, cur, 0)]
            alive &= nxt >= 0
            cur = np.where(alive, nxt, 0)
    return slots, mask
