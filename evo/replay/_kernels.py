"""Optional numba kernels for the replay store's hot paths (insert and prioritised sampling).

numba is optional: when it is not installed, or ``EVO_REPLAY_NUMBA=0`` is set, or on a big-endian
machine, every caller falls back to the pure-numpy code next to it. Both paths compute exactly the
same thing: the same keys (the kernel runs the same uint64 arithmetic as ``hashing.hash_packed``),
the same dedup/collision decisions, the same index contents (slot per key; only the bucket entry a
key lands in may differ, which nothing observes) and bit-identical prioritised samples (the random
numbers and the importance weights are computed by numpy in both cases). So a snapshot taken with
one path restores and samples identically with the other.

Kernels are compiled lazily on first use (``cache=True`` keeps the machine code on disk between
processes); :func:`warmup` compiles them all up front and returns how long that took, so a benchmark
can keep compile time out of steady-state timing.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

try:  # pragma: no cover - depends on the environment
    if os.environ.get("EVO_REPLAY_NUMBA", "1").strip().lower() in ("0", "false", "no", "off"):
        raise ImportError("disabled by EVO_REPLAY_NUMBA")
    if sys.byteorder != "little":
        raise ImportError("kernels compare little-endian row bytes")
    import numba

    AVAILABLE = True
except Exception:  # ImportError, or a numba that fails to load against this numpy
    numba = None
    AVAILABLE = False

_enabled = AVAILABLE


def enabled() -> bool:
    """Whether the numba kernels are in use (importable, not disabled, not switched off)."""
    return _enabled


def set_enabled(on: bool) -> bool:
    """Switch the kernels on or off at run time (tests run both paths); returns the previous
    setting. Switching on without numba is an error."""
    global _enabled
    if on and not AVAILABLE:
        raise RuntimeError("numba is not available (not installed, or EVO_REPLAY_NUMBA=0)")
    prev, _enabled = _enabled, bool(on)
    return prev


if AVAILABLE:  # pragma: no branch
    _njit = numba.njit(cache=True, nogil=True, boundscheck=False)

    _EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)
    _FIB = np.uint64(0x9E3779B97F4A7C15)
    _P2 = np.uint64(0xBF58476D1CE4E5B9)
    _F1 = np.uint64(0xFF51AFD7ED558CCD)
    _F2 = np.uint64(0xC4CEB9FE1A85EC53)
    _U29, _U32, _U33 = np.uint64(29), np.uint64(32), np.uint64(33)
    _U1, _U2, _U3, _U4, _U5, _U6, _U7 = (np.uint64(i) for i in range(1, 8))
    _U8, _U16, _U24, _U40, _U48, _U56 = (np.uint64(i) for i in (8, 16, 24, 40, 48, 56))
    _W = 8

    @_njit
    def _hash_row(m, i, w, add, mul, seed):
        """The key of packed row i (its first w words): hashing.hash_packed's arithmetic, one row."""
        h = np.uint64(0)
        for j in range(w):
            x = (m[i, j] + add[j]) * mul[j]
            x ^= x >> _U32
            x *= _P2
            x ^= x >> _U29
            h += x
        h ^= seed
        h ^= h >> _U33
        h *= _F1
        h ^= h >> _U33
        h *= _F2
        h ^= h >> _U33
        return h

    @_njit
    def hash_words(m, add, mul, seed):
        """hashing.hash_packed for rows of at most _MAX_WORDS words, fused into one pass."""
        n, w = m.shape
        out = np.empty(n, dtype=np.uint64)
        for i in range(n):
            out[i] = _hash_row(m, i, w, add, mul, seed)
        return out

    @_njit
    def _probe(fkeys, fslot, overflow, bmask, shift, mul, k):
        if k == _EMPTY:
            return -1
        b = np.int64((k * mul) >> shift)
        while True:
            base = b * _W
            for j in range(_W):
                if fkeys[base + j] == k:
                    return np.int64(fslot[base + j])
            if not overflow[b]:
                return -1
            b = (b + 1) & bmask

    @_njit
    def _touch_homes(keys, fkeys, fslot, shift, mul):
        """Load each key's home bucket with no branches, so the cache misses overlap; returns a
        value only so the loads are not optimised away."""
        t = np.int64(0)
        for i in range(keys.shape[0]):
            base = np.int64((keys[i] * mul) >> shift) * _W
            t ^= np.int64(fkeys[base] & np.uint64(1))
        return t

    @_njit
    def lookup(keys, fkeys, fslot, overflow, bmask, shift, mul):
        """KeyIndex.lookup: slot per key or -1; probing stops at the first never-overflowed bucket."""
        n = keys.shape[0]
        out = np.empty(n, dtype=np.int64)
        for i in range(n):
            out[i] = _probe(fkeys, fslot, overflow, bmask, shift, mul, keys[i])
        return out

    @_njit
    def place(keys, slots, fkeys, fslot, overflow, bmask, shift, mul, slot_pos):
        """KeyIndex._place: put each (absent, distinct) key in the first free entry from its home
        bucket on, marking full buckets as overflowed; returns how many buckets newly overflowed."""
        newly = 0
        for i in range(keys.shape[0]):
            k = keys[i]
            b = np.int64((k * mul) >> shift)
            while True:
                base = b * _W
                e = -1
                for j in range(_W):
                    if fkeys[base + j] == _EMPTY:
                        e = base + j
                        break
                if e >= 0:
                    fkeys[e] = k
                    fslot[e] = slots[i]
                    slot_pos[slots[i]] = e
                    break
                if not overflow[b]:
                    overflow[b] = True
                    newly += 1
                b = (b + 1) & bmask
        return newly

    @_njit
    def evict(slots, slot_pos, fkeys, fslot, refcount):
        """KeyIndex.remove_slots for the live ones among ``slots``; returns the slots removed."""
        out = np.empty(slots.shape[0], dtype=np.int64)
        c = 0
        for i in range(slots.shape[0]):
            s = slots[i]
            p = slot_pos[s]
            if p >= 0:
                fkeys[p] = _EMPTY
                fslot[p] = -1
                slot_pos[s] = -1
                refcount[s] = 0
                out[c] = s
                c += 1
        return out[:c]

    @_njit
    def _same_stored(packed, i, cols, offs, widths, s):
        for f in range(len(cols)):
            col = cols[f]
            off = offs[f]
            for t in range(widths[f]):
                if col[s, t] != packed[i, off + t]:
                    return False
        return True

    @_njit
    def _same_rows(packed, i, r):
        for t in range(packed.shape[1]):
            if packed[i, t] != packed[r, t]:
                return False
        return True

    @_njit
    def _batch_dedup(tkeys, trow, tmask, tshift, packed, i, k, rep, pending):
        """Place row i (key k) in the batch's own open-addressing table; 1 if it is the first of its
        content in the batch (rep[i] = i), else 0 (rep[i] = the earlier equal row, or pending[i]
        when only the hash matches)."""
        t = np.int64((k * _FIB) >> tshift)
        while True:
            r = trow[t]
            if r < 0:
                tkeys[t] = k
                trow[t] = i
                rep[i] = i
                return 1
            if tkeys[t] == k:
                if _same_rows(packed, i, r):
                    rep[i] = r
                else:
                    pending[i] = True
                return 0
            t = (t + 1) & tmask

    @_njit
    def classify(h, packed, cols, offs, widths, fkeys, fslot, overflow, bmask, shift, mul):
        """The dedup decision of ReplayStore.insert for each row i (same semantics as the numpy path):

        * ``stored[i]``: slot of a stored row with key h[i] and identical key-field bytes, else -1;
        * ``rep[i]``: -1 if the row is stored already or pending, else the first earlier batch row
          with the same key and bytes (itself if none);
        * ``pending[i]``: the key is taken by different content (stored or earlier in the batch) or
          is the reserved empty marker - the collision slow path decides.
        """
        n = h.shape[0]
        stored = np.full(n, -1, dtype=np.int64)
        rep = np.full(n, -1, dtype=np.int64)
        pending = np.zeros(n, dtype=np.bool_)
        cap = 16
        while cap < 2 * n:
            cap *= 2
        tkeys = np.empty(cap, dtype=np.uint64)
        trow = np.full(cap, -1, dtype=np.int64)
        tmask = cap - 1
        bits = 0
        while (1 << bits) < cap:
            bits += 1
        tshift = np.uint64(64 - bits)
        for i in range(n):
            k = h[i]
            if k == _EMPTY:
                pending[i] = True
                continue
            s = _probe(fkeys, fslot, overflow, bmask, shift, mul, k)
            if s >= 0:
                if _same_stored(packed, i, cols, offs, widths, s):
                    stored[i] = s
                else:
                    pending[i] = True
                continue
            _batch_dedup(tkeys, trow, tmask, tshift, packed, i, k, rep, pending)
        return stored, rep, pending

    @_njit
    def pack_classify(srcs, offs, widths, words, add, mul, seed, kb, cols, coffs, cwidths,
                      fkeys, fslot, overflow, bmask, shift, fib):
        """Pack, hash and classify a batch in one pass (ReplayStore.insert's fused path).

        ``srcs[f]`` is the batch's hashed field f as uint8 [n, widths[f]], packed at byte offset
        ``offs[f]`` of a zero-padded row of ``words`` uint64 words (exactly ``hashing.pack_rows``);
        the key is ``hash_words`` of that row. A hash hit is confirmed against ``kb`` (the stored
        rows' packed key bytes, one contiguous row per slot) when it has rows, else against the
        stored columns ``cols`` (as in :func:`classify`). Returns (packed u64 [n, words], keys,
        stored, rep, pending, the new rows (rep[i] == i), how many rows are pending) with
        :func:`classify`'s semantics."""
        n = srcs[0].shape[0]
        packed = np.zeros((n, words), dtype=np.uint64)
        pb = packed.view(np.uint8)
        h = np.empty(n, dtype=np.uint64)
        flat = pb.reshape(-1)
        rb = np.uint64(words * 8)
        for f in range(len(srcs)):  # unsigned flat indices: no wraparound checks in the copy
            src = srcs[f].reshape(-1)
            off = np.uint64(offs[f])
            w = np.uint64(widths[f])
            for i in range(n):
                d = np.uint64(i) * rb + off
                s0 = np.uint64(i) * w
                for t in range(w):
                    flat[d + np.uint64(t)] = src[s0 + np.uint64(t)]
        for i in range(n):
            h[i] = _hash_row(packed, i, words, add, mul, seed)
        # probe every key first, after touching every home bucket in a branch-free loop (so the
        # cache misses overlap instead of queueing behind each probe's branches), then confirm hits
        slot = np.empty(n + 1, dtype=np.int64)
        slot[n] = _touch_homes(h, fkeys, fslot, shift, fib)
        for i in range(n):
            slot[i] = _probe(fkeys, fslot, overflow, bmask, shift, fib, h[i])
        if kb.shape[0] > 0:
            t = np.uint64(0)
            for i in range(n):
                s = slot[i]
                if s >= 0:
                    t ^= kb[s, 0]
            slot[n] ^= np.int64(t & np.uint64(1))
        stored = np.full(n, -1, dtype=np.int64)
        rep = np.full(n, -1, dtype=np.int64)
        pending = np.zeros(n, dtype=np.bool_)
        use_kb = kb.shape[0] > 0
        cap = 16
        while cap < 2 * n:
            cap *= 2
        tkeys = np.empty(cap, dtype=np.uint64)
        trow = np.full(cap, -1, dtype=np.int64)
        tmask = cap - 1
        bits = 0
        while (1 << bits) < cap:
            bits += 1
        tshift = np.uint64(64 - bits)
        n_new = 0
        for i in range(n):
            k = h[i]
            if k == _EMPTY:
                pending[i] = True
                continue
            s = slot[i]
            if s >= 0:
                if use_kb:
                    same = True
                    for j in range(words):
                        if kb[s, j] != packed[i, j]:
                            same = False
                            break
                else:
                    same = _same_stored(pb, i, cols, coffs, cwidths, s)
                if same:
                    stored[i] = s
                else:
                    pending[i] = True
                continue
            n_new += _batch_dedup(tkeys, trow, tmask, tshift, packed, i, k, rep, pending)
        new_rows = np.empty(n_new, dtype=np.int64)
        c = 0
        n_pending = 0
        for i in range(n):
            if rep[i] == i:
                new_rows[c] = i
                c += 1
            n_pending += pending[i]
        return packed, h, stored, rep, pending, new_rows, n_pending

    @_njit
    def write_rows(dst, src, rows, start, kb, packed):
        """Copy batch rows ``rows`` (all rows if empty) field by field (uint8 views) to ring slots
        start, start+1, ... (wrapping), and their packed key bytes into ``kb`` when it has rows;
        returns the slots written."""
        cap = dst[0].shape[0]
        m = rows.shape[0] if rows.shape[0] > 0 else src[0].shape[0]
        all_rows = rows.shape[0] == 0
        slots = np.empty(m, dtype=np.int64)
        for j in range(m):
            slots[j] = (start + j) % cap
        for f in range(len(dst)):
            d = dst[f]
            s = src[f]
            w = d.shape[1]
            for j in range(m):
                r = j if all_rows else rows[j]
                sl = slots[j]
                for t in range(w):
                    d[sl, t] = s[r, t]
        if kb.shape[0] > 0:
            words = kb.shape[1]
            for j in range(m):
                r = j if all_rows else rows[j]
                sl = slots[j]
                for t in range(words):
                    kb[sl, t] = packed[r, t]
        return slots

    @_njit
    def commit(stored, rep, new_rows, start, dst, src, kb, packed, keys, slot_key, slot_pos, refcount,
               fkeys, fslot, overflow, bmask, shift, mul):
        """The commit of ReplayStore.insert's fused path, in the numpy path's order: bump stored
        duplicates, evict the ring slots about to be overwritten, write the new rows (``new_rows``;
        every row when empty) and their key bytes, index them (refcount 1), bump in-batch duplicates.
        Returns (slots written, slots evicted, buckets newly overflowed)."""
        n = rep.shape[0]
        cap = slot_pos.shape[0]
        for i in range(n):
            if stored[i] >= 0:
                refcount[stored[i]] += 1
        m = new_rows.shape[0] if new_rows.shape[0] > 0 else n
        ring = np.empty(m + 1, dtype=np.int64)
        for j in range(m):
            ring[j] = (start + j) % cap
        nk = np.empty(m, dtype=np.uint64)
        for j in range(m):
            nk[j] = keys[new_rows[j]] if new_rows.shape[0] > 0 else keys[j]
        t = _touch_homes(nk, fkeys, fslot, shift, mul)  # overlap the misses of evict and place
        for j in range(m):
            p = slot_pos[ring[j]]
            t ^= np.int64(fkeys[max(p, 0)] & np.uint64(1))
        ring[m] = t  # keeps the touching loads
        evicted = evict(ring[:m], slot_pos, fkeys, fslot, refcount)
        slots = write_rows(dst, src, new_rows, start, kb, packed)
        newly = place(nk, slots, fkeys, fslot, overflow, bmask, shift, mul, slot_pos)
        for j in range(m):
            slot_key[slots[j]] = nk[j]
            refcount[slots[j]] = 1
        if m < n:
            slot_of = np.full(n, -1, dtype=np.int64)
            for j in range(m):
                slot_of[new_rows[j]] = slots[j]
            for i in range(n):
                r = rep[i]
                if r >= 0 and r != i:
                    refcount[slot_of[r]] += 1
        return slots, evicted, newly

    @_njit
    def find(u, bcum, bstart, sub, pref, leaves):
        """SumTree.find: per target, the block by binary search over the block prefixes (side
        'right'), then the first leaf whose in-block running sum passes the remainder, found as a
        count of prefixes <= remainder over the block's per-line sums (one cache line) and then
        over the chosen line of leaf prefixes (one more); branch-free, so the loads of many targets
        overlap. A remainder at or past the block's end (rounding) takes its last live leaf."""
        n = u.shape[0]
        nb = bcum.shape[0]
        nl = sub.shape[1]
        bl = pref.shape[1]
        ln = bl // nl
        out = np.empty(n, dtype=np.int64)
        bs = np.empty(n, dtype=np.int64)
        rs = np.empty(n, dtype=np.float64)
        c = 0  # how many block prefixes are <= the previous target (searchsorted side 'right')
        px = -np.inf
        for i in range(n):
            x = u[i]
            if x >= px:  # targets usually ascend (stratified draws): gallop on from the last block
                lo = c
                hi = c
                step = 1
                while hi < nb and bcum[hi] <= x:
                    lo = hi + 1
                    hi = lo + step
                    step <<= 1
                hi = min(hi, nb)
            else:
                lo, hi = 0, nb
            while lo < hi:  # prefixes before lo are <= x, the one at hi (if any) is > x
                mid = (lo + hi) >> 1
                if bcum[mid] <= x:
                    lo = mid + 1
                else:
                    hi = mid
            c = lo
            px = x
            b = min(lo, nb - 1)
            bs[i] = b
            rs[i] = x - bstart[b]
        for i in range(n):
            b = bs[i]
            r = rs[i]
            g = 0
            for t in range(nl):
                g += sub[b, t] <= r
            if g == nl:
                j = bl - 1
                while j > 0 and not leaves[b * bl + j] > 0:
                    j -= 1
            else:
                j = g * ln
                base = j
                for t in range(ln):
                    j += pref[b, base + t] <= r
            out[i] = b * bl + j
        return out


def warmup() -> float:
    """Compile (or load from the on-disk cache) every kernel; seconds taken, 0.0 without numba."""
    if not AVAILABLE:
        return 0.0
    t = time.perf_counter()
    m = np.zeros((2, 3), dtype=np.uint64)
    hash_words(m, m[0], m[0] | np.uint64(1), np.uint64(1))
    nb = 4
    fkeys = np.full(nb * 8, 0xFFFFFFFFFFFFFFFF, dtype=np.uint64)
    fslot = np.full(nb * 8, -1, dtype=np.int32)
    ov = np.zeros(nb, dtype=bool)
    shift = np.uint64(62)
    slot_pos = np.full(4, -1, dtype=np.int64)
    keys = np.array([1, 2], dtype=np.uint64)
    place(keys, np.array([0, 1], dtype=np.int64), fkeys, fslot, ov, nb - 1, shift, _FIB, slot_pos)
    lookup(keys, fkeys, fslot, ov, nb - 1, shift, _FIB)
    packed = np.zeros((2, 8), dtype=np.uint8)
    cols = (np.zeros((4, 8), dtype=np.uint8),)
    classify(keys, packed, cols, np.zeros(1, np.int64), np.full(1, 8, np.int64), fkeys, fslot, ov, nb - 1, shift,
             _FIB)
    evict(np.array([0], dtype=np.int64), slot_pos, fkeys, fslot, np.zeros(4, np.int64))
    pref = np.ones((2, 64), dtype=np.float64).cumsum(axis=1)
    find(np.array([0.5, 70.0]), np.array([64.0, 128.0]), np.array([0.0, 64.0]), pref[:, 7::8].copy(), pref,
         np.ones(128))
    return time.perf_counter() - t
