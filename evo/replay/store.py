"""ReplayStore: the in-process hash-indexed replay store every population member shares.

A row's key is a stable content hash of its key fields (``hashing.py``). Inserting a row that is
already stored returns the existing key and bumps its reference count; a hash hit only counts as
a duplicate after a bitwise comparison of the key fields, so two different rows are never merged
(a genuinely colliding row gets a re-mixed key instead). Rows live in a fixed-capacity ring of
columnar slots (``storage.py``); when the ring is full the oldest slots are overwritten (FIFO) and
their keys leave the index. Sampling is uniform or prioritised (``samplers.py``), optionally
gated by a rate limiter (``ratelimit.py``), and always drawn from the store's own seeded generator.

Not thread-safe by itself: share it across processes through :class:`evo.replay.ReplayService`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from evo.replay import _kernels
from evo.replay import snapshot as snap
from evo.replay.errors import ReplayError
from evo.replay.hashing import _ADD, _MAX_WORDS, _MUL, HashFn, _layout, hash_packed, pack_rows, remix
from evo.replay.index import EMPTY_KEY, KeyIndex
from evo.replay.ratelimit import RateLimiter
from evo.replay.samplers import follow, make_sampler
from evo.replay.schema import Schema
from evo.replay.staging import StagedWrites, ViewBasis
from evo.replay.storage import ColumnStorage, _bits

FORMAT_VERSION = 1
_RESERVED = int(EMPTY_KEY)
_KB_MAX_WORDS = 32  # keep a packed key-bytes column (one contiguous row per slot) up to 256 B/row
_NO_ROWS = np.zeros(0, dtype=np.int64)


@dataclass
class SampleBatch:
    """Rows drawn by :meth:`ReplayStore.sample`; ``weights`` are importance weights (ones if uniform)."""

    data: dict[str, np.ndarray]
    keys: np.ndarray
    weights: np.ndarray

    def __len__(self) -> int:
        return int(self.keys.shape[0])


@dataclass
class SequenceBatch:
    """Windows drawn by :meth:`ReplayStore.sample_sequences`: data ``[B, length, ...]``; ``mask`` is
    False (and data zero) where a window runs past its trajectory's last stored row."""

    data: dict[str, np.ndarray]
    mask: np.ndarray
    keys: np.ndarray
    weights: np.ndarray

    def __len__(self) -> int:
        return int(self.keys.shape[0])


def _as_keys(keys: Any) -> np.ndarray:
    k = np.asarray(keys)
    if k.dtype != np.uint64:
        if k.size and (k.dtype.kind not in "iu" or (k.dtype.kind == "i" and (k < 0).any())):
            raise ReplayError(f"keys must be uint64 (as returned by insert), found dtype {k.dtype}")
        k = k.astype(np.uint64)
    return k.reshape(-1)


class ReplayStore:
    """Hash-indexed, deduplicating replay store. See ``docs/replay.md`` for the full contract."""

    def __init__(
        self,
        schema: Schema,
        capacity: int = 100_000,
        storage: str = "memory",
        path: str | os.PathLike | None = None,
        eviction: str = "fifo",
        sampler: str = "uniform",
        alpha: float = 0.6,
        beta: float = 0.4,
        seed: int = 0,
        rate_limiter: RateLimiter | None = None,
        episode_field: str | None = None,
        hash_fn: HashFn | None = None,
    ) -> None:
        if not isinstance(schema, Schema):
            raise ReplayError(f"schema must be a Schema, found {type(schema).__name__}")
        if eviction != "fifo":
            raise ReplayError(f"eviction must be 'fifo' (the only policy), found {eviction!r}")
        if episode_field is not None:
            f = schema.fields.get(episode_field)
            if f is None or f.dtype != "int64" or f.shape != ():
                raise ReplayError(
                    f"episode_field {episode_field!r} must name a scalar int64 field, found "
                    f"{'no such field' if f is None else f'{f.dtype}{list(f.shape)}'}"
                )
        self.schema = schema
        self.capacity = int(capacity)
        self.eviction = eviction
        self.episode_field = episode_field
        self.seed = int(seed)
        self.rate_limiter = rate_limiter
        self._storage_kind = storage
        self._storage = ColumnStorage(schema, self.capacity, storage, path)
        self._index = KeyIndex(self.capacity)
        self._sampler_kind = "prioritized" if sampler in ("prioritized", "prioritised") else sampler
        self._sampler = make_sampler(sampler, self.capacity, alpha, beta)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._hash_fn = hash_fn
        self._next = 0  # ring position of the next new row
        self._written = 0  # slots ever written (<= capacity)
        self.counters = {"rows_inserted": 0, "rows_new": 0, "duplicates": 0, "collisions": 0, "evicted": 0,
                         "samples": 0}
        # Packed key-field bytes of every stored row (exactly what was hashed), so a hash hit is
        # confirmed with one contiguous compare instead of a read from every key column.
        words = _layout(schema)[1]
        has_bytes = bool(_layout(schema)[0])
        self._kb = (np.zeros((self.capacity, words), dtype=np.uint64)
                    if hash_fn is None and has_bytes and words <= _KB_MAX_WORDS else None)
        if episode_field is not None:
            self._succ = np.full(self.capacity, -1, dtype=np.int64)
            self._pred = np.full(self.capacity, -1, dtype=np.int64)
            self._tails: dict[int, tuple[int, int]] = {}

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return len(self._index)

    @property
    def path(self) -> str | None:
        """Directory of the column files (mmap storage), else None."""
        return self._storage.dir

    def contains(self, keys: Any) -> np.ndarray:
        """Boolean per key: is it stored now (inserted and not evicted)?"""
        return self._index.lookup(_as_keys(keys)) >= 0

    def get(self, keys: Any) -> dict[str, np.ndarray]:
        """Rows for ``keys``, in order. ReplayError if any key is absent (never inserted, or evicted)."""
        k = _as_keys(keys)
        slots = self._index.lookup(k)
        if (slots < 0).any():
            missing = k[slots < 0]
            raise ReplayError(
                f"{missing.size} of {k.size} keys are not in the store (never inserted or evicted), "
                f"first: {int(missing[0]):#018x}"
            )
        return self._storage.gather(slots)

    def refcounts(self, keys: Any) -> np.ndarray:
        """How many times each key's row was inserted (0 if absent)."""
        slots = self._index.lookup(_as_keys(keys))
        out = np.zeros(slots.shape[0], dtype=np.int64)
        ok = slots >= 0
        out[ok] = self._index.refcount[slots[ok]]
        return out

    def stats(self) -> dict[str, int]:
        """Counters: rows_inserted (all rows offered), rows_new, duplicates (confirmed by content),
        collisions (hash hits whose content differed), evicted, samples; plus size and capacity."""
        return {**self.counters, "size": len(self), "capacity": self.capacity}

    def hash(self, batch: Mapping[str, Any]) -> np.ndarray:
        """The content hash of each row of a (validated) batch, without inserting it."""
        arrays, n = self.schema.validate(batch)
        return self._hash(arrays, n, pack_rows(self.schema, arrays))

    def _hash(self, arrays: Mapping[str, np.ndarray], n: int, packed: np.ndarray) -> np.ndarray:
        if self._hash_fn is None:
            return hash_packed(self.schema, packed)
        h = self._hash_fn(self.schema, arrays)
        h = np.asarray(h)
        if h.shape != (n,) or h.dtype != np.uint64:
            raise ReplayError(f"hash_fn must return uint64[{n}], returned {h.dtype}{list(h.shape)}")
        return h

    # ------------------------------------------------------------------ insert
    def _cmp_layout(self):
        """(uint8 [capacity, width] view of each hashed column, byte offsets in a packed row, widths)
        for the kernel that compares stored rows with a batch; None if no key field has bytes."""
        cached = self.__dict__.get("_cmp_cache")
        if cached is None or cached[0] is not self._storage.columns:
            parts = _layout(self.schema)[0]
            if not parts:
                lay = None
            else:
                cols = tuple(np.asarray(self._storage.columns[k]).reshape(self.capacity, -1).view(np.uint8)
                             for k, _, _ in parts)
                lay = (cols, np.array([o for _, o, _ in parts], dtype=np.int64),
                       np.array([w for _, _, w in parts], dtype=np.int64))
            cached = (self._storage.columns, lay)
            self._cmp_cache = cached
        return cached[1]

    def _fused_layout(self):
        """Cached arguments of the fused insert kernels (None where they do not apply: custom
        hash_fn, no key bytes, or rows too wide for the one-pass hash)."""
        cached = self.__dict__.get("_fused_cache")
        if cached is None or cached[0] is not self._storage.columns:
            parts, words, seed = _layout(self.schema)
            lay = None
            if self._hash_fn is None and parts and words <= _MAX_WORDS:
                cmp = self._cmp_layout()
                if self._kb is not None:  # compare against kb; the column tuple is a placeholder
                    cmp = ((np.zeros((1, 1), dtype=np.uint8),), cmp[1][:1], np.zeros(1, dtype=np.int64))
                names = tuple(k for k, f in self.schema.fields.items() if f.row_bytes)
                dst = tuple(np.asarray(self._storage.columns[k]).reshape(self.capacity, -1).view(np.uint8)
                            for k in names)
                kb = self._kb if self._kb is not None else np.zeros((0, words), dtype=np.uint64)
                lay = (tuple(k for k, _, _ in parts), np.array([o for _, o, _ in parts], dtype=np.int64),
                       np.array([w for _, _, w in parts], dtype=np.int64), words, np.uint64(seed), kb, cmp,
                       names, dst)
            cached = (self._storage.columns, lay)
            self._fused_cache = cached
        return cached[1]

    def insert(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Insert rows; return one uint64 key per row. All-or-nothing: a bad batch writes nothing."""
        arrays, n = self.schema.validate(batch)
        if n == 0:
            return np.zeros(0, dtype=np.uint64)
        fused = self._fused_layout() if _kernels.enabled() else None
        ar = np.arange(n)
        if fused is not None:
            hnames, offs, widths, words, seed, kb, (cols, coffs, cwidths), wnames, dst = fused
            srcs = tuple(arrays[k].reshape(n, -1).view(np.uint8) for k in hnames)
            idx = self._index
            packed, h, stored, rep, pending, new_rows, n_pending = _kernels.pack_classify(
                srcs, offs, widths, words, _ADD, _MUL, seed, kb, cols, coffs, cwidths,
                idx._fkeys, idx._fslot, idx._overflow, idx._bmask, idx._shift, idx._mul)
            if not n_pending:
                return self._commit(arrays, n, ar, h, stored, rep, packed, fused, new_rows)
            keys = h.copy()
            self._resolve_collisions(arrays, h, keys, stored, rep, pending)
            return self._commit(arrays, n, ar, keys, stored, rep, packed, fused)
        packed = pack_rows(self.schema, arrays)  # key-field bytes as uint64 words: hashed and compared
        h = self._hash(arrays, n, packed)
        keys = h.copy()
        if _kernels.enabled() and self._cmp_layout() is not None:
            cols, offs, widths = self._cmp_layout()
            idx = self._index
            stored, rep, pending = _kernels.classify(h, packed.view(np.uint8), cols, offs, widths, idx._fkeys,
                                                     idx._fslot, idx._overflow, idx._bmask, idx._shift, idx._mul)
            any_pending = bool(pending.any())
        else:
            stored, rep, pending, any_pending = self._classify(packed, h, n, ar)
        if any_pending:
            self._resolve_collisions(arrays, h, keys, stored, rep, pending)
        return self._commit(arrays, n, ar, keys, stored, rep, packed, None)

    def _commit(self, arrays, n, ar, keys, stored, rep, packed, fused, new_rows=None) -> np.ndarray:
        newm = None
        if new_rows is None:
            newm = rep == ar
            new_rows = np.flatnonzero(newm)
        n_new = int(new_rows.size)
        if n_new > self.capacity:
            raise ReplayError(
                f"insert of {n_new} new rows exceeds the store's capacity of {self.capacity}; split the batch"
            )
        if self.rate_limiter is not None:
            self.rate_limiter.check_insert(n_new)
        # ---- commit (nothing below can fail on user input)
        if fused is not None and self.episode_field is None and n_new:
            idx = self._index
            if idx._n_overflow * 8 > idx._overflow.size:
                idx._rebuild()
            src = tuple(arrays[k].reshape(n, -1).view(np.uint8) for k in fused[7])
            write, gone, newly = _kernels.commit(
                stored, rep, _NO_ROWS if n_new == n else new_rows, self._next, fused[8], src, fused[5], packed,
                keys, idx.slot_key, idx.slot_pos, idx.refcount, idx._fkeys, idx._fslot, idx._overflow, idx._bmask,
                idx._shift, idx._mul)
            idx._n_overflow += newly
            idx._live += n_new - gone.size
            self.counters["evicted"] += int(gone.size)
            self._next = (self._next + n_new) % self.capacity
            self._written = min(self.capacity, self._written + n_new)
            self._sampler.on_insert(write)
            self._count_insert(n, n_new)
            return keys
        if newm is None:
            newm = rep == ar
        dup_stored = stored >= 0
        if dup_stored.any():
            self._index.bump(stored[dup_stored])
        write = np.zeros(0, dtype=np.int64)
        if n_new:
            write = (self._next + np.arange(n_new)) % self.capacity
            self._evict(write)
            if fused is not None:
                dst, names = fused[8], fused[7]
                src = tuple(arrays[k].reshape(n, -1).view(np.uint8) for k in names)
                write = _kernels.write_rows(dst, src, _NO_ROWS if n_new == n else new_rows, self._next,
                                            fused[5], packed)
            else:
                write = self._storage.write(self._next, n_new, arrays, None if n_new == n else new_rows)
                if self._kb is not None:
                    self._kb[write] = packed[new_rows]
            self._index.add(keys[new_rows], write)
            self._next = (self._next + n_new) % self.capacity
            self._written = min(self.capacity, self._written + n_new)
            self._sampler.on_insert(write)
        if n_new != n or self.episode_field is not None:
            slot_of_rep = np.full(n, -1, dtype=np.int64)
            slot_of_rep[new_rows] = write
            in_batch_dup = (rep >= 0) & ~newm
            if in_batch_dup.any():
                self._index.bump(slot_of_rep[rep[in_batch_dup]])
            if self.episode_field is not None:
                slots = np.where(rep >= 0, slot_of_rep[np.maximum(rep, 0)], stored)
                live = slots >= 0
                live[live] = self._index.slot_key[slots[live]] == keys[live]
                live[live] &= self._index.slot_pos[slots[live]] >= 0
                self._link(arrays[self.episode_field], np.where(live, slots, -1), keys)
        self._count_insert(n, n_new)
        return keys

    def _count_insert(self, n: int, n_new: int) -> None:
        """Counters and the rate limiter after an insert of n rows, n_new of them new."""
        c = self.counters
        c["rows_inserted"] += n
        c["rows_new"] += n_new
        c["duplicates"] += n - n_new
        if self.rate_limiter is not None:
            self.rate_limiter.inserts += n_new  # only new rows count as inserts

    def _classify(self, packed: np.ndarray, h: np.ndarray, n: int, ar: np.ndarray):
        """numpy path of the dedup decision (see ``_kernels.classify`` for the contract)."""
        stored = self._index.lookup(h)  # slot of an existing row with this key, or -1
        hitm = stored >= 0
        pending = h == EMPTY_KEY  # the index's empty marker is reserved: such rows take the collision path
        any_pending = bool(pending.any())
        if hitm.any():  # confirm every hash hit by comparing the stored row's bytes
            hit = np.flatnonzero(hitm)
            cols = self._storage.columns
            theirs = pack_rows(self.schema, {k: cols[k].take(stored[hit], axis=0) for k in self.schema.hashed_fields})
            eq = packed[hit] == theirs
            if not eq.all():
                bad = hit[~eq.all(axis=1)]
                stored[bad] = -1
                pending[bad] = any_pending = True
        # rep[i]: the batch row whose copy row i is (itself if new), -1 if row i is stored already
        rep = np.where(hitm | pending, -1, ar)
        order = np.argsort(h, kind="stable")
        sk = h[order]
        same = sk[1:] == sk[:-1]
        if same.any():  # equal keys in the batch: all hits (handled above) or all misses
            starts = np.ones(n, dtype=bool)
            starts[1:] = ~same
            first = order[np.maximum.accumulate(np.where(starts, ar, 0))]
            cand = ~starts & (rep[order] >= 0)
            rows_c, reps_c = order[cand], first[cand]
            if rows_c.size:
                eq = (packed[rows_c] == packed[reps_c]).all(axis=1)
                rep[rows_c[eq]] = reps_c[eq]
                bad = rows_c[~eq]
                if bad.size:
                    rep[bad] = -1
                    pending[bad] = any_pending = True
        return stored, rep, pending, any_pending

    def _resolve_collisions(self, arrays, h, keys, stored, rep, pending) -> None:
        """Slow path, row by row, for rows whose hash matched different content: try re-mixed keys
        until one is free or holds this very row. Rare at 64 bits; exercised by tests with a
        deliberately truncated hash."""
        names = self.schema.hashed_fields
        claimed = {int(h[i]): int(i) for i in np.flatnonzero(rep == np.arange(len(h)))}
        for i in np.flatnonzero(pending):
            i = int(i)
            attempt = 0
            k = int(h[i])
            while True:
                s = int(self._index.lookup(np.array([k], dtype=np.uint64))[0])
                if k == _RESERVED:
                    pass
                elif s >= 0:
                    if self._storage.equal_rows(names, np.array([s]), arrays, np.array([i]))[0]:
                        stored[i] = s
                        keys[i] = k
                        break
                elif k in claimed:
                    r = claimed[k]
                    if _rows_equal(names, arrays, np.array([i]), np.array([r]))[0]:
                        rep[i] = r
                        break
                else:
                    claimed[k] = i
                    rep[i] = i
                    keys[i] = k
                    break
                attempt += 1
                self.counters["collisions"] += 1
                k = remix(int(h[i]), attempt)
            pending[i] = False
        # in-batch rows pointing at a representative that took a re-mixed key share that key
        for i in np.flatnonzero(rep >= 0):
            keys[i] = keys[rep[i]]

    def _evict(self, slots: np.ndarray) -> None:
        """FIFO: the ring slots about to be overwritten lose their keys (and trajectory links)."""
        live = self._index.remove_slots(slots)
        if not live.size:
            return
        self.counters["evicted"] += int(live.size)
        if self.episode_field is not None:
            p = self._pred[live]
            self._succ[p[p >= 0]] = -1
            q = self._succ[live]
            self._pred[q[q >= 0]] = -1
            self._succ[live] = -1
            self._pred[live] = -1

    def _link(self, episodes: np.ndarray, slots: np.ndarray, keys: np.ndarray) -> None:
        """Chain each row to the previous row of its trajectory (rows of one trajectory arrive in
        order, possibly over several calls and interleaved with other trajectories)."""
        order = np.argsort(episodes, kind="stable")
        ep, sl, ky = episodes[order], slots[order], keys[order]
        prev = np.empty_like(sl)
        prev[1:] = sl[:-1]
        first = np.ones(ep.size, dtype=bool)
        first[1:] = ep[1:] != ep[:-1]
        idx = self._index
        for j in np.flatnonzero(first):
            t = self._tails.get(int(ep[j]))
            ok = t is not None and idx.slot_pos[t[0]] >= 0 and int(idx.slot_key[t[0]]) == t[1]
            prev[j] = t[0] if ok else -1
        cand = (prev >= 0) & (sl >= 0) & (prev != sl)
        p, c = prev[cand], sl[cand]
        # first link wins: a row already followed (or preceded) keeps its link
        free = (self._succ[p] < 0) & (self._pred[c] < 0)
        p, c = p[free], c[free]
        if p.size:
            _, ip = np.unique(p, return_index=True)
            keep = np.zeros(p.size, dtype=bool)
            keep[ip] = True
            _, ic = np.unique(c, return_index=True)
            keep2 = np.zeros(p.size, dtype=bool)
            keep2[ic] = True
            keep &= keep2
            self._succ[p[keep]] = c[keep]
            self._pred[c[keep]] = p[keep]
        last = np.ones(ep.size, dtype=bool)
        last[:-1] = ep[1:] != ep[:-1]
        for j in np.flatnonzero(last):
            if sl[j] >= 0:
                self._tails[int(ep[j])] = (int(sl[j]), int(ky[j]))
            else:
                self._tails.pop(int(ep[j]), None)
        if len(self._tails) > 2 * self.capacity + 1024:
            self._tails = {
                e: t for e, t in self._tails.items() if idx.slot_pos[t[0]] >= 0 and int(idx.slot_key[t[0]]) == t[1]
            }

    # ------------------------------------------------------------------ sampling
    def _draw(self, batch_size: int, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        if batch_size < 1:
            raise ReplayError(f"batch_size must be >= 1, found {batch_size}")
        size = len(self)
        # a seeded draw is a member view's read (evo.replay.view): its own stream, outside the limiter
        limiter = self.rate_limiter if seed is None else None
        if limiter is not None:
            limiter.check_sample(batch_size, size)
        if size == 0:
            raise ReplayError("cannot sample from an empty store")
        rng = self._rng if seed is None else np.random.Generator(np.random.PCG64(int(seed)))
        slots, weights = self._sampler.sample(rng, self._written, batch_size)
        if limiter is not None:
            limiter.samples += batch_size
        self.counters["samples"] += batch_size
        return slots, weights

    def sample(self, batch_size: int, seed: int | None = None) -> SampleBatch:
        """``batch_size`` rows drawn with replacement by the store's sampler, from the store's own
        generator — or, with ``seed``, from a fresh generator seeded by it (the store's stream and
        rate limiter untouched: that is how a member view reads the shared store)."""
        slots, weights = self._draw(batch_size, seed)
        return SampleBatch(self._storage.gather(slots), self._index.slot_key[slots], weights)

    def sample_sequences(self, batch_size: int, length: int, seed: int | None = None) -> SequenceBatch:
        """Windows of ``length`` consecutive rows of one trajectory, starting at sampled rows
        (priorities apply to the start row); mask is False past the trajectory's stored end.
        ``seed`` as in :meth:`sample`."""
        if self.episode_field is None:
            raise ReplayError("sample_sequences needs the store to be built with episode_field=<int64 field>")
        if length < 1:
            raise ReplayError(f"length must be >= 1, found {length}")
        start, weights = self._draw(batch_size, seed)
        slots, mask = follow(self._succ, start, length)
        flat = self._storage.gather(slots.reshape(-1))
        data = {}
        for name, arr in flat.items():
            arr = arr.reshape(batch_size, length, *arr.shape[1:])
            arr[~mask] = 0
            data[name] = arr
        return SequenceBatch(data, mask, self._index.slot_key[start], weights)

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set priorities of stored keys (prioritised sampler). Keys no longer stored (evicted since
        they were sampled) are ignored; returns how many keys were updated."""
        k = _as_keys(keys)
        p = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if p.shape[0] != k.shape[0]:
            raise ReplayError(f"update_priorities: {k.shape[0]} keys but {p.shape[0]} priorities")
        slots = self._index.lookup(k)
        ok = slots >= 0
        self._sampler.update(slots[ok], p[ok])
        return int(ok.sum())

    # ------------------------------------------------------------------ member views
    def mass(self) -> tuple[int, float, float]:
        """(rows, sampling mass, smallest positive priority**alpha): what a shard reports with each
        draw (evo.replay.sharded); the same numbers as ``view_basis``, computed without building it."""
        if self._sampler_kind == "prioritized":
            tree = self._sampler.tree
            return len(self), tree.total, tree.min
        n = len(self)
        return n, float(n), 1.0

    def view_basis(self) -> ViewBasis:
        """What a member view needs to know of this store at a generation's start (evo.replay.view)."""
        prioritized = self._sampler_kind == "prioritized"
        tree = self._sampler.tree if prioritized else None
        limiter = self.rate_limiter
        return ViewBasis(
            size=len(self), capacity=self.capacity, sampler=self._sampler_kind,
            mass=tree.total if tree is not None else float(len(self)),
            min_leaf=tree.min if tree is not None else 1.0,
            max_priority=self._sampler.max_priority if prioritized else 1.0,
            alpha=self._sampler.alpha if prioritized else 1.0, beta=self._sampler.beta if prioritized else 0.0,
            episode_field=self.episode_field, min_size_to_sample=limiter.min_size_to_sample if limiter else 1,
            custom_hash=self._hash_fn is not None)

    def apply_staged(self, staged: StagedWrites) -> dict[str, int]:
        """Replay one member view's writes (inserts and priority updates, in the order the member
        made them) against this store; the engine calls it at a generation's end, member by member.
        The rate limiter does not gate them: they were made against the member's own view."""
        limiter, self.rate_limiter = self.rate_limiter, None
        rows = updates = 0
        try:
            for op in staged.ops:
                if op[0] == "insert":
                    rows += int(next(iter(op[1].values())).shape[0]) if op[1] else 0
                    self.insert(op[1])
                else:
                    updates += self.update_priorities(op[1], op[2])
        finally:
            self.rate_limiter = limiter
        return {"rows": rows, "priority_updates": updates}

    # ------------------------------------------------------------------ persistence
    def snapshot(self, dir: str | os.PathLike, keep: int = 2) -> str:
        """Write an exact snapshot under ``dir`` (atomically; see ``snapshot.py``); return its path."""
        meta, arrays = self.snapshot_state()
        self._storage.flush()
        return snap.write_snapshot(dir, meta, arrays, keep=keep)

    def snapshot_state(self, copy: bool = False) -> tuple[dict, dict[str, np.ndarray]]:
        """(meta, arrays) of an exact snapshot, without writing it: what a replay actor returns to the
        driver, whose run store writes the files (``copy=True`` detaches the arrays from the store)."""
        w = self._written
        arrays = {f"col.{k}": v[:w] for k, v in self._storage.columns.items()}
        arrays["slot_key"] = self._index.slot_key[:w]
        arrays["refcount"] = self._index.refcount[:w]
        arrays["live"] = self._index.slot_pos[:w] >= 0
        arrays.update({f"sampler.{k}": v for k, v in self._sampler.arrays().items()})
        if self.episode_field is not None:
            arrays["succ"], arrays["pred"] = self._succ[:w], self._pred[:w]
            te = np.array(list(self._tails), dtype=np.int64)
            tv = np.array(list(self._tails.values()), dtype=np.uint64).reshape(-1, 2)
            arrays["tails.episode"], arrays["tails.slot_key"] = te, tv
        meta = {
            "format": FORMAT_VERSION,
            "schema": self.schema.to_json(),
            "capacity": self.capacity,
            "storage": self._storage_kind,
            "path": self._storage.root,
            "eviction": self.eviction,
            "sampler": self._sampler_kind,
            "sampler_state": self._sampler.state(),
            "seed": self.seed,
            "rng": self._rng.bit_generator.state,
            "episode_field": self.episode_field,
            "rate_limiter": self.rate_limiter.state() if self.rate_limiter is not None else None,
            "counters": self.counters,
            "next": self._next,
            "written": self._written,
            "custom_hash": self._hash_fn is not None,
        }
        if copy:
            arrays = {k: np.array(v, copy=True) for k, v in arrays.items()}
            meta = {**meta, "counters": dict(self.counters), "rng": dict(meta["rng"])}
        return meta, arrays

    @classmethod
    def restore(
        cls,
        dir: str | os.PathLike,
        storage: str | None = None,
        path: str | os.PathLike | None = None,
        hash_fn: HashFn | None = None,
    ) -> ReplayStore:
        """The store as of the newest complete snapshot under ``dir`` (incomplete ones are skipped).

        ``storage``/``path`` override where the restored columns live (default: as snapshotted; an
        mmap store gets fresh files under its old path root, never touching the original's files).
        """
        _, meta, arrays = snap.read_snapshot(dir)
        return cls.from_state(meta, arrays, storage, path, hash_fn)

    @classmethod
    def from_state(
        cls,
        meta: dict,
        arrays: Mapping[str, np.ndarray],
        storage: str | None = None,
        path: str | os.PathLike | None = None,
        hash_fn: HashFn | None = None,
    ) -> ReplayStore:
        """A new store from a snapshot's (meta, arrays) already in memory, as :meth:`snapshot_state`
        returns them (a member view's line store, a state sent by another process): :meth:`restore`
        without the files. ``storage``/``path``/``hash_fn`` as there; the arrays are copied into the
        new store's columns, so later writes to either do not reach the other."""
        return cls._from_state(meta, arrays, storage, path, hash_fn)

    def load_snapshot(self, dir: str | os.PathLike) -> str:
        """Replace this store's entire contents and state (data, index, refcounts, priorities,
        trajectory links, sampler RNG, rate limiter, counters, capacity and schema) in place with
        the newest complete snapshot under ``dir``; return that snapshot's path.

        The new state is built completely before anything is swapped, so a failure (no complete
        snapshot, wrong format, missing custom hash_fn) leaves this store untouched. The store keeps
        its own storage kind and column directory root (an mmap store gets fresh column files
        there). Its custom ``hash_fn`` is kept if the snapshot was taken with one (and required
        then); a snapshot keyed by the built-in hash keeps using the built-in hash."""
        path, meta, arrays = snap.read_snapshot(dir)
        self.load_state(meta, arrays)
        return path

    def load_state(self, meta: dict, arrays: Mapping[str, np.ndarray]) -> None:
        """:meth:`load_snapshot` from a snapshot's (meta, arrays) already in memory (as
        :meth:`snapshot_state` returns them), e.g. sent to a replay actor by the driver."""
        fresh = type(self)._from_state(meta, arrays, self._storage_kind, self._storage.root, self._hash_fn,
                                       custom_only=True)
        old = self._storage
        self.__dict__.clear()
        self.__dict__.update(fresh.__dict__)
        old.close()

    @classmethod
    def _from_state(cls, meta, arrays, storage, path, hash_fn, custom_only=False) -> ReplayStore:
        if custom_only and not meta.get("custom_hash"):
            hash_fn = None
        if "shards" in meta:
            raise ReplayError(f"this is a snapshot of a sharded replay service ({len(meta['shards'])} shards): "
                              "restore it with ShardedReplay.restore or load it into one with as many shards")
        if meta.get("format") != FORMAT_VERSION:
            raise ReplayError(f"snapshot format {meta.get('format')} is not supported (expected {FORMAT_VERSION})")
        if meta["custom_hash"] and hash_fn is None:
            raise ReplayError("this snapshot was taken with a custom hash_fn; pass the same hash_fn to restore")
        st = meta["sampler_state"]
        kind = storage or meta["storage"]
        store = cls(
            Schema.from_json(meta["schema"]),
            capacity=meta["capacity"],
            storage=kind,
            path=path if path is not None else (meta["path"] if kind == "mmap" else None),
            eviction=meta["eviction"],
            sampler=meta["sampler"],
            alpha=st.get("alpha", 0.6),
            beta=st.get("beta", 0.4),
            seed=meta["seed"],
            rate_limiter=RateLimiter.from_state(meta["rate_limiter"]) if meta["rate_limiter"] else None,
            episode_field=meta["episode_field"],
            hash_fn=hash_fn,
        )
        w = int(meta["written"])
        for name, col in store._storage.columns.items():
            col[:w] = arrays[f"col.{name}"]
        if store._kb is not None and w:
            store._kb[:w] = pack_rows(store.schema, {k: store._storage.columns[k][:w] for k in store.schema.hashed_fields})
        live = np.zeros(store.capacity, dtype=bool)
        live[:w] = arrays["live"]
        slot_key = np.zeros(store.capacity, dtype=np.uint64)
        slot_key[:w] = arrays["slot_key"]
        refcount = np.zeros(store.capacity, dtype=np.int64)
        refcount[:w] = arrays["refcount"]
        store._index.reset_from(slot_key, live, refcount)
        store._sampler.load_state(st, {k[8:]: v for k, v in arrays.items() if k.startswith("sampler.")})
        store._rng.bit_generator.state = meta["rng"]
        store.counters = dict(meta["counters"])
        store._next, store._written = int(meta["next"]), w
        if store.episode_field is not None:
            store._succ[:w], store._pred[:w] = arrays["succ"], arrays["pred"]
            tv = arrays["tails.slot_key"]
            store._tails = {int(e): (int(v[0]), int(v[1])) for e, v in zip(arrays["tails.episode"], tv)}
        return store

    def close(self) -> None:
        """Flush mmap columns to disk and release them; the store is unusable afterwards."""
        self._storage.close()


def _rows_equal(names: tuple[str, ...], arrays: Mapping[str, np.ndarray], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bitwise equality of batch rows ``a`` and ``b`` over the key fields."""
    eq = np.ones(a.shape[0], dtype=bool)
    for name in names:
        x = _bits(arrays[name])
        eq &= (x[a].reshape(a.shape[0], -1) == x[b].reshape(b.shape[0], -1)).all(axis=1)
    return eq
