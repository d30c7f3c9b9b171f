"""Member views: what one member sees of the shared replay store during one generation.

Without views, members write into the shared store while others read it, so what a member samples
depends on which members ran before it, or beside it on other Ray workers: the same seed gives
different leaderboards inline and on 1, 2 or 4 workers. A `MemberView` makes a member's reads
independent of scheduling (docs/replay.md, "Member views"):

* **reads** see the shared store *as of the generation's start* plus the member's *own* inserts of
  this generation. The own inserts live in a small member-local overlay store, treated as a second
  shard: a uniform draw picks a shard in proportion to its rows, a prioritised draw in proportion
  to its priority mass, and a sequence comes from whichever shard holds its start row. Importance
  weights are normalised by the smallest priority over both shards, as one store would.
  `own_share` (the experiment's `replay.own_share`) raises the own shard's share of every draw to
  at least that much once it holds a batch's worth of rows: a deliberate bias toward the member's
  own, most recent data.
* **randomness** comes from the view's own generator, seeded by (run seed, member index,
  generation), never from the shared store's stream.
* **draws from the shared store come in blocks** (`_SharedReads`): `BLOCK_BATCHES` batches' worth
  of rows in one seeded call, shuffled, handed out in order, the next block requested as soon as
  one is opened. On Ray each call to the store is a round trip to its actor (~2 ms, longer when the
  cores are busy), one per gradient update before; now one per `BLOCK_BATCHES` updates, and it is
  in flight while the member computes.
* **writes** (inserts and priority updates) are *staged*: inserts go to the overlay, priority
  updates of overlay rows apply there at once, and every write is also logged. After the
  generation the engine replays each member's log against the shared store, in member order
  (`StagedWrites`, `ReplayStore.apply_staged`). A failed or retried attempt's log is dropped, so
  nothing it inserted ever reaches the shared store.

With `own_rows = "line"` (the experiment's `replay.own_rows`) the own shard is the member's *line
store*: a store of its own, kept from generation to generation, which holds every row its line
inserted (up to the shared store's capacity, oldest evicted first) with the priorities its line gave
them. A clone starts from a copy of its parent's line store, as a PBT trial copies its parent's
store on exploit. The view starts from the line store it is given (`line`: the state `line_state`
returned the generation before) and hands back its new state; its rows still reach the shared store
only through the staged log, which holds this generation's writes alone.

The shared store does not change during a generation (every member writes through a view), so
"as of the generation's start" needs no copy. Not seen within the generation: other members'
data of this generation, and the member's own priority updates of rows already in the shared
store (they take effect at the boundary).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from evo.replay.errors import RateLimited, ReplayError
from evo.replay.hashing import hash_rows
from evo.replay.protocol import Replay
from evo.replay.staging import StagedWrites, ViewBasis
from evo.replay.store import ReplayStore, SampleBatch, SequenceBatch, _as_keys

__all__ = ["MemberView", "view_seed", "commit_views", "LineState", "OWN_ROWS"]

#: what a view's own shard holds: this generation's inserts, or the member's line store (module docstring)
OWN_ROWS = ("generation", "line")
#: a line store's state, as `ReplayStore.snapshot_state` gives it: (meta, arrays)
LineState = tuple[dict[str, Any], dict[str, np.ndarray]]

_MIN_OVERLAY = 4096  # first overlay size in rows; it doubles (replaying its own log) up to the store's capacity
#: a read of the shared store fetches this many batches' worth of rows (one round trip per 8 batches on Ray)
BLOCK_BATCHES = 8
_reader: ThreadPoolExecutor | None = None  # fetches the next block of a remote store while the member computes


def view_seed(run_seed: int, index: int, generation: int) -> np.random.SeedSequence:
    """The seed of member `index`'s view in `generation`: its own stream, whoever runs it, wherever."""
    return np.random.SeedSequence([int(run_seed) & 0xFFFFFFFF, int(index), int(generation), 0x5EA1])


class MemberView:
    """The `Replay` a member uses during one generation: the shared store frozen at the
    generation's start plus the member's own staged writes. See the module docstring."""

    def __init__(self, base: Replay, basis: ViewBasis, seed: np.random.SeedSequence | int, own_share: float = 0.0,
                 own_rows: str = "generation", line: LineState | None = None) -> None:
        if not 0.0 <= float(own_share) <= 1.0:
            raise ReplayError(f"own_share must be in [0, 1], found {own_share}")
        if own_rows not in OWN_ROWS:
            raise ReplayError(f"own_rows must be one of {OWN_ROWS}, found {own_rows!r}")
        if line is not None and own_rows != "line":
            raise ReplayError("a line store was given, but own_rows is not 'line'")
        self.own_share = float(own_share)
        self.own_rows = own_rows
        bind = getattr(base, "bound_to", None)  # a sharded store: reads take the shards' masses from the basis
        self.base = bind(basis) if bind is not None else base
        self.basis = basis
        self.schema = base.schema
        self.capacity = basis.capacity
        ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(int(seed))
        self._rng = np.random.Generator(np.random.PCG64(ss))
        # the blocks' seeds: a stream of their own (a child of the view's seed, without spawning from it)
        self._shared = _SharedReads(self.base, np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, 0xB10C)))
        self._overlay: ReplayStore | None = None
        self._staged = StagedWrites()
        if line is not None:
            self._overlay = self._line_store(line)

    # ---- the member's own shard ------------------------------------------------------------
    def _new_overlay(self, capacity: int) -> ReplayStore:
        b = self.basis
        store = ReplayStore(self.schema, capacity=capacity, sampler=b.sampler, alpha=b.alpha, beta=b.beta,
                            episode_field=b.episode_field)
        if b.sampler == "prioritized":
            store._sampler.max_priority = b.max_priority  # new rows get the shared store's top priority
        return store

    def _line_store(self, line: LineState) -> ReplayStore:
        """The line store restored from `line`, at the shared store's capacity (it never grows: growing
        replays this generation's log, which holds none of the line's earlier rows)."""
        meta, arrays = line
        store = ReplayStore.from_state(meta, arrays, "memory")
        if store.capacity != self.capacity or store.schema.to_json() != self.schema.to_json():
            raise ReplayError(f"the line store holds {store.capacity} rows of another schema or capacity than the "
                              f"shared store ({self.capacity}): it belongs to another run")
        if self.basis.sampler == "prioritized":
            store._sampler.max_priority = max(store._sampler.max_priority, self.basis.max_priority)
        return store

    def _room_for(self, n: int) -> ReplayStore:
        """The overlay, grown (by replaying the log into a larger one) so that `n` more rows fit; a
        line store is made at the shared store's capacity at once (FIFO then evicts its oldest rows)."""
        ov = self._overlay
        if self.own_rows == "line":
            if ov is None:
                self._overlay = ov = self._new_overlay(self.capacity)
            return ov
        need = (len(ov) if ov is not None else 0) + n
        if ov is not None and (need <= ov.capacity or ov.capacity >= self.capacity):
            return ov
        size = _MIN_OVERLAY if ov is None else 2 * ov.capacity
        while size < need:
            size *= 2
        fresh = self._new_overlay(min(size, self.capacity))
        for op in self._staged.ops:
            if op[0] == "insert":
                fresh.insert(op[1])
            else:
                fresh.update_priorities(op[1], op[2])
        self._overlay = fresh
        return fresh

    def _own(self) -> int:
        return len(self._overlay) if self._overlay is not None else 0

    # ---- the Replay protocol -----------------------------------------------------------------
    def __len__(self) -> int:
        return self.basis.size + self._own()

    def insert(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Stage rows: visible to this member at once, in the shared store after the generation."""
        arrays, n = self.schema.validate(batch)
        if n == 0:
            return np.zeros(0, dtype=np.uint64)
        arrays = {k: np.array(v, copy=True) for k, v in arrays.items()}  # the log must not alias the caller's buffers
        keys = self._room_for(n).insert(arrays)
        self._staged.ops.append(("insert", arrays))
        return keys

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Own rows' priorities change at once; the shared store's rows' at the boundary. Returns the
        number of updates staged."""
        k = _as_keys(keys)
        p = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if p.shape[0] != k.shape[0]:
            raise ReplayError(f"update_priorities: {k.shape[0]} keys but {p.shape[0]} priorities")
        if self.basis.sampler != "prioritized":
            raise ReplayError("update_priorities needs sampler='prioritized'; this store samples uniformly")
        if not np.all(np.isfinite(p)) or np.any(p < 0):
            raise ReplayError("update_priorities: priorities must be finite and >= 0 (add a small epsilon yourself)")
        if self._overlay is not None:
            self._overlay.update_priorities(k, p)
        self._staged.ops.append(("priorities", k.copy(), p.copy()))
        return int(k.shape[0])

    def _split(self, batch_size: int) -> tuple[int, int, int]:
        """How many of `batch_size` draws come from the shared store and from the own shard, and the own
        shard's seed, all from the view's generator. (Two seeds are drawn: the first once seeded the shared
        store's draw, which `_SharedReads` seeds now; drawing it keeps the own shard's seeds as they were.)
        A row is drawn in proportion to its sampling mass, as from one store, unless `own_share` asks for
        more own rows: once the own shard holds a batch's worth, each draw is an own row with at least
        that probability (a bias toward the member's own, most recent data; each part keeps its
        importance weights)."""
        if batch_size < 1:
            raise ReplayError(f"batch_size must be >= 1, found {batch_size}")
        size = len(self)
        if size < self.basis.min_size_to_sample:
            raise RateLimited(f"sample needs at least {self.basis.min_size_to_sample} rows, the member's view has {size}",
                              retryable=False)
        if size == 0:
            raise ReplayError("cannot sample from an empty store")
        ov = self._overlay
        if self.basis.sampler == "prioritized":
            base_mass, own_mass = self.basis.mass, (ov._sampler.tree.total if ov is not None else 0.0)
        else:
            base_mass, own_mass = float(self.basis.size), float(self._own())
        if own_mass <= 0:
            n_own = 0
        elif base_mass <= 0:
            n_own = batch_size
        else:
            share = own_mass / (base_mass + own_mass)
            if self._own() >= batch_size:  # not before: a few fresh rows would fill half of every batch
                share = max(share, self.own_share)
            n_own = int(self._rng.binomial(batch_size, share))
        seeds = self._rng.integers(0, 2**63, size=2)
        return batch_size - n_own, n_own, int(seeds[1])

    def _weight_scale(self) -> tuple[float, float]:
        """Factors that renormalise each shard's importance weights by the smallest priority of both."""
        if self.basis.sampler != "prioritized" or self._overlay is None:
            return 1.0, 1.0
        own_min = self._overlay._sampler.tree.min
        low = min(self.basis.min_leaf, own_min)
        beta = self.basis.beta
        scale = lambda m: float((low / m) ** beta) if np.isfinite(m) and m > 0 else 1.0
        return scale(self.basis.min_leaf), scale(own_min)

    def sample(self, batch_size: int) -> SampleBatch:
        return self._draw(batch_size, None)

    def sample_sequences(self, batch_size: int, length: int) -> SequenceBatch:
        if self.basis.episode_field is None:
            raise ReplayError("sample_sequences needs the store to be built with episode_field=<int64 field>")
        return self._draw(batch_size, length)

    def _draw(self, batch_size: int, length: int | None) -> SampleBatch | SequenceBatch:
        """`batch_size` draws over both shards: rows (`length` None) or windows of `length` rows."""
        n_base, n_own, s_own = self._split(batch_size)
        parts = []
        wb, wo = self._weight_scale()
        if n_base:
            parts.append((self._shared.take(n_base, length, batch_size), wb))
        if n_own:
            parts.append((_sample(self._overlay, n_own, length, s_own), wo))
        if len(parts) == 1 and parts[0][1] == 1.0:
            return parts[0][0]
        return _join([replace(p, weights=np.asarray(p.weights) * np.float32(w)) for p, w in parts])

    def get(self, keys: Any) -> dict[str, np.ndarray]:
        k = _as_keys(keys)
        if not self._own():
            return self.base.get(k)
        own = self._overlay.contains(k)
        if own.all():
            return self._overlay.get(k)
        if not own.any():
            return self.base.get(k)
        a, b = self._overlay.get(k[own]), self.base.get(k[~own])
        out = {}
        for name in a:
            col = np.empty((k.shape[0], *a[name].shape[1:]), dtype=a[name].dtype)
            col[own], col[~own] = a[name], b[name]
            out[name] = col
        return out

    def contains(self, keys: Any) -> np.ndarray:
        k = _as_keys(keys)
        own = self._overlay.contains(k) if self._own() else np.zeros(k.shape[0], dtype=bool)
        return own | np.asarray(self.base.contains(k), dtype=bool)

    def hash(self, batch: Mapping[str, Any]) -> np.ndarray:
        if self.basis.custom_hash:
            return self.base.hash(batch)
        arrays, _ = self.schema.validate(batch)
        return hash_rows(self.schema, arrays)  # a pure function of the bytes: no round trip to the store

    def snapshot(self, dir: str | os.PathLike, keep: int = 2) -> str:
        raise ReplayError("a member's view of the shared store cannot be snapshotted; the run snapshots the "
                          "shared store itself at each generation's end")

    def load_snapshot(self, dir: str | os.PathLike) -> str:
        raise ReplayError("a member's view of the shared store cannot load a snapshot; load it into the shared store")

    # ---- the boundary --------------------------------------------------------------------------
    def staged(self) -> StagedWrites:
        """This member's writes of the generation, for `commit_views` (plain data: ships over Ray), with
        consecutive priority updates joined (`StagedWrites.coalesced`: the same result, a fraction of the cost)."""
        return self._staged.coalesced()

    def line_state(self) -> LineState | None:
        """With `own_rows = "line"`: the line store as it is now, detached from the view (plain
        arrays: ships over Ray), for the member's next view and its clones'; None when it holds no
        rows or the view keeps no line."""
        if self.own_rows != "line" or not self._own():
            return None
        return self._overlay.snapshot_state(copy=True)


class _SharedReads:
    """A view's draws from the frozen shared store, in blocks: each block is one seeded call for
    `BLOCK_BATCHES` times the caller's batch size, shuffled (a prioritised draw is stratified, so its
    rows come in the order of the priority mass), and handed out in order; a batch that needs more
    than a block holds continues in the next. The next block is requested when one is opened: in a
    reader thread for a store in other processes (`remote`: its round trip then overlaps the member's
    computation), lazily for an in-process one. Its seed and size are fixed at that moment either way,
    so the rows depend neither on timing nor on the backend. Each row is still drawn in proportion to
    its priority, with the same importance weight; a batch's rows are a random subset of a larger
    stratified draw. A sharded store that draws a batch from one shard (`draw = "one"`) makes a block
    of `BLOCK_BATCHES` such draws, so a block still mixes shards."""

    def __init__(self, base: Replay, seed: np.random.SeedSequence) -> None:
        self.base = base
        self._seeds = np.random.Generator(np.random.PCG64(seed))
        self._prefetch = bool(getattr(base, "remote", False))
        self._draws = BLOCK_BATCHES if getattr(base, "draw", None) == "one" and getattr(base, "n_shards", 1) > 1 else 1
        self._length: int | None | bool = False  # the window length of the blocks in hand (None: rows; False: none yet)
        self._block: Any = None
        self._pos = 0
        self._next: Callable[[], Any] | None = None

    def take(self, n: int, length: int | None, batch_size: int) -> SampleBatch | SequenceBatch:
        """`n` draws: rows (`length` None) or windows of `length` rows."""
        if length != self._length:  # blocks of another window length are of no use: start afresh
            self._length, self._block, self._pos, self._next = length, None, 0, None
        parts = []
        while n > 0:
            if self._block is None or self._pos == len(self._block):
                self._block = (self._next or self._request(length, batch_size))()
                self._pos = 0
                self._next = self._request(length, batch_size)
            k = min(n, len(self._block) - self._pos)
            parts.append(_rows(self._block, slice(self._pos, self._pos + k)))
            self._pos += k
            n -= k
        return parts[0] if len(parts) == 1 else _join(parts)

    def _request(self, length: int | None, batch_size: int) -> Callable[[], Any]:
        """The next block: a call that returns it (at once, or once its fetch is done)."""
        size = BLOCK_BATCHES * batch_size
        seeds = [int(s) for s in self._seeds.integers(0, 2**63, size=self._draws + 1)]
        base, per_draw = self.base, size // self._draws

        def fetch() -> SampleBatch | SequenceBatch:
            got = [_sample(base, per_draw, length, s) for s in seeds[:-1]]
            shuffle = np.random.Generator(np.random.PCG64(seeds[-1])).permutation(size)
            return _rows(got[0] if len(got) == 1 else _join(got), shuffle)

        if not self._prefetch:
            return fetch
        global _reader
        if _reader is None:
            _reader = ThreadPoolExecutor(max_workers=2, thread_name_prefix="evo-replay-read")
        return _reader.submit(fetch).result


def _sample(store: Replay, n: int, length: int | None, seed: int) -> SampleBatch | SequenceBatch:
    """`n` seeded draws from `store`: rows (`length` None) or windows of `length` rows."""
    return store.sample(n, seed=seed) if length is None else store.sample_sequences(n, length, seed=seed)


def _rows(batch: SampleBatch | SequenceBatch, index: Any) -> SampleBatch | SequenceBatch:
    data = {k: np.asarray(v)[index] for k, v in batch.data.items()}
    keys, weights = np.asarray(batch.keys)[index], np.asarray(batch.weights)[index]
    if isinstance(batch, SequenceBatch):
        return SequenceBatch(data, np.asarray(batch.mask)[index], keys, weights)
    return SampleBatch(data, keys, weights)


def _join(parts: list[Any]) -> SampleBatch | SequenceBatch:
    data, keys = _concat([p.data for p in parts]), np.concatenate([np.asarray(p.keys) for p in parts])
    weights = np.concatenate([np.asarray(p.weights) for p in parts])
    if isinstance(parts[0], SequenceBatch):
        return SequenceBatch(data, np.concatenate([np.asarray(p.mask) for p in parts]), keys, weights)
    return SampleBatch(data, keys, weights)


def commit_views(base: Replay, staged: list[tuple[int, StagedWrites]]) -> None:
    """Replay each member's staged writes against the shared store, in member-index order."""
    for _, writes in sorted(staged, key=lambda t: t[0]):
        if writes:
            base.apply_staged(writes)


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {name: np.concatenate([np.asarray(p[name]) for p in parts]) for name in parts[0]}
