"""Key index: hash key -> dense slot, with a reference count per slot.

An open-addressing table of 8-key buckets (one 64-byte cache line of keys per bucket, slots in a
parallel array), probed for a whole batch at once: one gather fetches every key's home bucket and
only keys whose bucket has ever overflowed probe on to the next one. So a lookup or insert of a
batch is a handful of numpy calls, not a Python loop per row. Because a bucket remembers whether it
overflowed, a deleted entry is simply emptied (no tombstones): a lookup keeps probing past an
overflowed bucket whatever its entries hold. When more than an eighth of the buckets have
overflowed the table is rebuilt, which keeps probes short under constant FIFO eviction. The table
has at least four times ``capacity`` entries (12 bytes each), so nearly every key is
resolved in its home bucket. One key value (all ones) marks an empty entry and is
reserved: the store gives a row hashing to it a re-mixed key, as for a collision.

Unlike TorchRL's HashToInt the index is plain arrays: it is rebuilt from ``slot_key`` on restore
(which yields the same mapping) and keys leave it when their slot is evicted.
"""

from __future__ import annotations

import numpy as np

from evo.replay import _kernels

EMPTY_KEY = np.uint64(0xFFFFFFFFFFFFFFFF)
_FIB = np.uint64(0x9E3779B97F4A7C15)
_HAS_BITCOUNT = hasattr(np, "bitwise_count")
W = 8  # keys per bucket: 8 x 8 bytes = one 64-byte cache line


def _rows(m: np.ndarray) -> np.ndarray:
    """Each row of a C-contiguous bool [n, 8] array as one little-endian uint64 (non-zero = any
    True); numpy's bool reductions along an 8-wide axis are an order of magnitude slower."""
    return m.view(np.uint64).reshape(-1)


def _first(x: np.ndarray) -> np.ndarray:
    """Index of the first True entry of rows packed by ``_rows`` (rows must be non-zero)."""
    low = x & (np.uint64(0) - x)  # lowest set bit
    if _HAS_BITCOUNT:
        return (np.bitwise_count(low - np.uint64(1)) >> 3).astype(np.int64)
    return np.log2(low.astype(np.float64)).astype(np.int64) >> 3  # numpy < 2.0: exact for powers of two


class KeyIndex:
    """Maps uint64 keys to slots ``0..capacity-1``; tracks each slot's key, table entry and refcount."""

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.slot_key = np.zeros(self.capacity, dtype=np.uint64)
        self.slot_pos = np.full(self.capacity, -1, dtype=np.int64)  # flat table entry, -1 = not stored
        self.refcount = np.zeros(self.capacity, dtype=np.int64)
        self._live = 0
        self.rebuilds = 0
        self._mul = _FIB  # home bucket = top bits of key * _mul (tests make it poor to force overflow)
        nb = 2
        while nb * W < 4 * self.capacity:  # load <= 1/4: a bucket of 8 almost never overflows
            nb *= 2
        self._alloc(nb)

    def _alloc(self, nbuckets: int) -> None:
        bits = int(nbuckets).bit_length() - 1
        self._shift = np.uint64(64 - bits)
        self._bmask = nbuckets - 1
        self._bkeys = np.full((nbuckets, W), EMPTY_KEY, dtype=np.uint64)
        self._bslot = np.full((nbuckets, W), -1, dtype=np.int32)
        self._fkeys, self._fslot = self._bkeys.reshape(-1), self._bslot.reshape(-1)
        self._overflow = np.zeros(nbuckets, dtype=bool)
        self._n_overflow = 0

    def __len__(self) -> int:
        return self._live

    def _home(self, keys: np.ndarray) -> np.ndarray:
        # Fibonacci hashing: robust even to structured keys from an injected hash function.
        return (keys * self._mul >> self._shift).astype(np.int64)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Slot of each key, or -1 where the key is not in the index."""
        keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
        out = np.full(keys.shape[0], -1, dtype=np.int64)
        if not keys.size or not self._live:
            return out
        if _kernels.enabled():
            return _kernels.lookup(keys, self._fkeys, self._fslot, self._overflow, self._bmask, self._shift, self._mul)
        b = self._home(keys)
        active = None
        k = keys
        while True:
            x = _rows(self._bkeys.take(b, axis=0) == k[:, None])
            found = x != 0
            if found.any():
                fi = np.flatnonzero(found)
                hit = self._fslot[b[fi] * W + _first(x[fi])]
                out[fi if active is None else active[fi]] = hit
            if not self._n_overflow:
                break
            go = ~found & self._overflow[b]
            if not go.any():
                break
            idx = np.flatnonzero(go)
            active = idx if active is None else active[idx]
            k = k[idx]
            b = (b[idx] + 1) & self._bmask
        out[keys == EMPTY_KEY] = -1
        return out

    def add(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Insert distinct keys known to be absent, pointing at ``slots`` (refcount 1)."""
        keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        if not keys.size:
            return
        if self._n_overflow * 8 > self._overflow.size:
            self._rebuild()
        self._place(keys, slots)
        self.slot_key[slots] = keys
        self.refcount[slots] = 1
        self._live += keys.size

    def _place(self, keys: np.ndarray, slots: np.ndarray) -> None:
        if _kernels.enabled():
            self._n_overflow += _kernels.place(keys, slots, self._fkeys, self._fslot, self._overflow, self._bmask,
                                               self._shift, self._mul, self.slot_pos)
            return
        b = self._home(keys)
        fkeys = self._fkeys
        while keys.size:
            x = _rows(self._bkeys.take(b, axis=0) == EMPTY_KEY)
            has = x != 0
            fe = b * W + _first(x | np.uint64(1 << 63))  # rows with no room get a dummy entry 7
            fe_h = fe[has]
            fkeys[fe_h] = keys[has]  # several keys may pick one entry: read back who won
            won = np.zeros(keys.size, dtype=bool)
            won[has] = fkeys[fe_h] == keys[has]
            fw = fe[won]
            self._fslot[fw] = slots[won]
            self.slot_pos[slots[won]] = fw
            if won.all():
                return
            full = ~has
            if full.any():  # bucket full: mark it overflowed and move those keys to the next bucket
                newly = np.unique(b[full])
                newly = newly[~self._overflow[newly]]
                self._overflow[newly] = True
                self._n_overflow += newly.size
                b = np.where(full, (b + 1) & self._bmask, b)
            lose = ~won
            keys, slots, b = keys[lose], slots[lose], b[lose]

    def remove_slots(self, slots: np.ndarray) -> np.ndarray:
        """Drop the keys held by ``slots`` (eviction): their entries become empty again. Returns the
        slots that held a key."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        if _kernels.enabled():
            gone = _kernels.evict(slots, self.slot_pos, self._fkeys, self._fslot, self.refcount)
            self._live -= gone.size
            return gone
        pos = self.slot_pos[slots]
        live = pos >= 0
        if not live.all():
            slots, pos = slots[live], pos[live]
        if not pos.size:
            return slots
        self._fkeys[pos] = EMPTY_KEY
        self._fslot[pos] = -1
        self.slot_pos[slots] = -1
        self.refcount[slots] = 0
        self._live -= pos.size
        return slots

    def bump(self, slots: np.ndarray) -> None:
        """Add one reference per occurrence of a slot (duplicate inserts)."""
        np.add.at(self.refcount, np.asarray(slots, dtype=np.int64), 1)

    def live_slots(self) -> np.ndarray:
        return np.flatnonzero(self.slot_pos >= 0)

    def _rebuild(self) -> None:
        """Rehash every live key into a clean table (clears overflow marks)."""
        live = self.live_slots()
        self.rebuilds += 1
        self._alloc(self._overflow.size)
        if live.size:
            self._place(self.slot_key[live], live)

    def reset_from(self, slot_key: np.ndarray, live: np.ndarray, refcount: np.ndarray) -> None:
        """Rebuild the whole index from per-slot keys (used by restore)."""
        self.slot_key[:] = slot_key
        self.refcount[:] = np.where(live, refcount, 0)
        self.slot_pos[:] = np.where(live, 0, -1)
        self._live = int(live.sum())
        self._rebuild()
