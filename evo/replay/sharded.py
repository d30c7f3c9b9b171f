"""ShardedReplay: one logical replay store split over N shards, each a ReplayStore in a replay actor.

Routing. A row goes to shard ``key % N``, where ``key`` is its stable content hash (``hash_rows``:
the same in every process, under every PYTHONHASHSEED). Equal rows therefore always meet in the
same shard and deduplication stays exact. A store with an ``episode_field`` routes by a stable mix
of the episode id instead, so a trajectory's rows stay together and sequence windows are linked as
in one store; that needs the episode field to be a key field (equal rows then still share a shard).

Sampling (``draw="one"``, the default). A whole batch comes from one shard, chosen with
probability proportional to its sampling mass (rows for uniform, the sum of priority**alpha for
prioritised); that shard draws all of it. A row of shard i is then drawn with probability
(mass_i / total) * (p_row / mass_i) = p_row / total in every slot of the batch: exactly one big
store's probability. A batch costs one call to one shard. The masses are those the shards reported
with this client's earlier batches (a shard answers with its draw and its current mass); all of
them are asked for first when this client has none, wrote since, or drew ``_REFRESH_EVERY`` batches
since it last asked them all. Rows of one batch share a shard, which content-hash routing makes a
random partition of the rows (docs/replay.md, "Shards": what changes for a batch's composition).

``draw="split"`` (the earlier design, kept for comparison and for rate-limited stores): a batch is
split across all shards by one multinomial draw over their masses and every shard draws its share,
at once. Unseeded draws of a store whose rate limiter has ``samples_per_insert`` always split (each
shard keeps its own samples-per-insert balance with 1/N of the error buffer: whole batches on one
shard would need N times the buffer).

Importance weights come back normalised by each shard's smallest priority and are rescaled to the
smallest over all shards, as one store computes them. A seeded draw (a member view's read) takes
the shard choice (or split) and the shard's seed from that seed, so it is reproducible. A member
view binds the client to its generation's basis (``bound_to``): its seeded reads then take the
shards' masses from the basis instead of asking (the shared store does not change during a
generation), so each costs one call.

Everything else works per shard: FIFO eviction within each shard's slice of the capacity, the
samples-per-insert balance of the rate limiter (each shard with 1/N of the error buffer; the
minimum size is checked on the total), snapshots (one directory holding every shard's arrays,
written by the caller) and restore. See docs/replay.md, "Shards".
"""

from __future__ import annotations

import bisect
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from evo.replay.errors import RateLimited, ReplayError
from evo.replay.hashing import HashFn, fmix64, hash_rows
from evo.replay.ratelimit import RateLimiter
from evo.replay.schema import Schema
from evo.replay.snapshot import read_snapshot, write_snapshot
from evo.replay.staging import StagedWrites, ViewBasis
from evo.replay.store import ReplayStore, SampleBatch, SequenceBatch, _as_keys

__all__ = ["ShardedReplay", "route", "apply_shard_ops"]

SNAPSHOT_FORMAT = "sharded/1"
_EPISODE_SALT = np.uint64(0x5EA5_0DE5_1A7E_5EED)
_POLL_S = 0.02  # how often a sample waiting for the minimum size re-reads the shards' sizes
_REFRESH_EVERY = 32  # one-shard draws: ask every shard's mass again after this many unseeded batches
DRAWS = ("one", "split")


def route(schema: Schema, arrays: Mapping[str, np.ndarray], shards: int, episode_field: str | None = None,
          hash_fn: HashFn | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(shard of each row, content key of each row) for validated ``arrays``. Stable across
    processes and machines: a pure function of the rows' bytes."""
    keys = np.asarray(hash_fn(schema, arrays) if hash_fn is not None else hash_rows(schema, arrays), dtype=np.uint64)
    if shards == 1:
        return np.zeros(keys.shape[0], dtype=np.int64), keys
    if episode_field is not None:
        by = fmix64(np.ascontiguousarray(arrays[episode_field], dtype=np.int64).view(np.uint64) ^ _EPISODE_SALT)
    else:
        by = keys
    return (by % np.uint64(shards)).astype(np.int64), keys


def apply_shard_ops(store: ReplayStore, ops: Sequence[tuple[Any, ...]]) -> dict[str, int]:
    """One shard's part of a member's staged writes, in the member's order (runs in the shard).

    Inserts are the rows routed here; a priority update carries *all* of the op's keys (each shard
    updates those it holds) and raises this shard's "largest priority seen" to the op's largest, so
    that new rows on every shard enter at the priority one store would give them."""
    limiter, store.rate_limiter = store.rate_limiter, None
    rows = updates = 0
    try:
        for op in ops:
            if op[0] == "insert":
                rows += int(next(iter(op[1].values())).shape[0]) if op[1] else 0
                store.insert(op[1])
            else:
                keys, p = op[1], np.asarray(op[2], dtype=np.float64)
                updates += store.update_priorities(keys, p)
                if p.size and store._sampler_kind == "prioritized":
                    store._sampler.max_priority = max(store._sampler.max_priority, float(p.max()))
    finally:
        store.rate_limiter = limiter
    return {"rows": rows, "priority_updates": updates}


def _shard_capacities(capacity: int, shards: int) -> list[int]:
    return [capacity // shards + (i < capacity % shards) for i in range(shards)]


def _shard_seed(seed: int, index: int, shards: int) -> int:
    if shards == 1:
        return int(seed)
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, index, 0x5A4D]).generate_state(1, np.uint64)[0])


def _shard_limiter(limiter: RateLimiter | None, shards: int) -> RateLimiter | None:
    """Each shard keeps the samples-per-insert balance for its own rows with 1/N of the error
    buffer; the minimum size is the client's check, on the total."""
    if limiter is None or shards == 1:
        return limiter
    if limiter.samples_per_insert is None:
        return None
    return RateLimiter(min_size_to_sample=1, samples_per_insert=limiter.samples_per_insert,
                       error_buffer=float(limiter.error_buffer) / shards)


class _LocalShards:
    """Shards in this process (the same shard bodies the Ray actors run, called one after another)."""

    def __init__(self, bodies: list[Any]) -> None:
        self.bodies = bodies

    def call(self, calls: list[tuple[int, str, tuple]]) -> list[Any]:
        return [getattr(self.bodies[i], m)(*a) for i, m, a in calls]

    def call_one(self, i: int, method: str, args: tuple) -> Any:
        return getattr(self.bodies[i], method)(*args)

    def stop(self) -> None:
        pass


class _RayShards:
    """Shards as Ray actors: every call of a batch is submitted before any is awaited (parallel)."""

    def __init__(self, actors: list[Any], timeout_s: float | None) -> None:
        self.actors, self.timeout_s = actors, timeout_s

    def call(self, calls: list[tuple[int, str, tuple]]) -> list[Any]:
        import ray

        return ray.get([getattr(self.actors[i], m).remote(*a) for i, m, a in calls], timeout=self.timeout_s)

    def call_one(self, i: int, method: str, args: tuple) -> Any:
        import ray

        return ray.get(getattr(self.actors[i], method).remote(*args), timeout=self.timeout_s)

    def stop(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a, no_restart=True)


class ShardedReplay:
    """The ReplayStore API over N shards (module docstring). ``start`` runs the shards as Ray actors
    (picklable client, handed to training actors like ReplayService); ``in_process`` keeps them in
    this process."""

    def __init__(self, shards: _LocalShards | _RayShards, n: int, schema: Schema, capacity: int, sampler: str,
                 beta: float, episode_field: str | None, min_size_to_sample: int | None, hash_fn: HashFn | None,
                 seed: int, rate_limit_timeout_s: float, snapshot_dir: str | None = None, draw: str = "one",
                 samples_per_insert: float | None = None) -> None:
        if draw not in DRAWS:
            raise ReplayError(f"draw must be one of {list(DRAWS)}, found {draw!r}")
        self._shards, self.n_shards, self.schema, self.capacity = shards, n, schema, capacity
        self._sampler, self._beta, self.episode_field = sampler, beta, episode_field
        self._min_size, self._hash_fn, self.seed = min_size_to_sample, hash_fn, seed
        self._timeout, self._snapshot_dir = rate_limit_timeout_s, snapshot_dir
        self.draw, self._spi = draw, samples_per_insert
        self._rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 0x5A4D])))
        # [N, 3] rows, mass, smallest leaf of each shard as its last answer to this client reported
        # them; the next unseeded batch is drawn by these (None: ask first). This client's own
        # writes clear it; `_age` counts one-shard batches since every shard last answered.
        self._last: np.ndarray | None = None
        self._age = 0
        # [N, 3] of the view basis this client is bound to (bound_to): seeded reads use these
        self._frozen: np.ndarray | None = None
        self._fast: tuple | None = None  # (_last, cumulative masses, rows of _last): see _cache_fast
        self.calls = 0  # shard calls made by this client object (tests count them)

    @property
    def remote(self) -> bool:
        """Whether the shards are Ray actors (a call is a round trip; member views fetch their reads ahead)."""
        return isinstance(self._shards, _RayShards)

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _check(schema: Schema, shards: int, capacity: int, episode_field: str | None) -> None:
        if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
            raise ReplayError(f"shards must be an integer >= 1, found {shards!r}")
        if capacity < shards:
            raise ReplayError(f"capacity {capacity} cannot be split over {shards} shards (each needs >= 1 row)")
        if shards > 1 and episode_field is not None and episode_field not in schema.hashed_fields:
            raise ReplayError(
                f"a sharded store routes a trajectory by its episode field {episode_field!r}, which must then be "
                f"one of the key fields {list(schema.hashed_fields)} (else equal rows could land on different shards)")

    @staticmethod
    def _shard_kwargs(shards: int, i: int, capacity: int, seed: int, rate_limiter: RateLimiter | None,
                      store_kwargs: dict) -> dict:
        return {**store_kwargs, "capacity": _shard_capacities(capacity, shards)[i], "seed": _shard_seed(seed, i, shards),
                "rate_limiter": _shard_limiter(rate_limiter, shards)}

    @classmethod
    def in_process(cls, schema: Schema, shards: int, capacity: int = 100_000, seed: int = 0,
                   rate_limiter: RateLimiter | None = None, draw: str = "one", **store_kwargs: Any) -> ShardedReplay:
        """N shards in this process (a refused rate-limited call raises at once, as a ReplayStore does).
        ``draw``: "one" (a batch from one shard chosen by mass) or "split" (module docstring)."""
        from evo.replay.service import _ReplayActor

        cls._check(schema, shards, capacity, store_kwargs.get("episode_field"))
        bodies = [_ReplayActor(schema.to_json(), None, None, 0.0,
                               cls._shard_kwargs(shards, i, capacity, seed, rate_limiter, store_kwargs))
                  for i in range(shards)]
        return cls._client(_LocalShards(bodies), shards, schema, capacity, seed, rate_limiter, store_kwargs, 0.0, None,
                           draw)

    @classmethod
    def start(cls, schema: Schema, shards: int, spread: bool = False, name: str | None = None,
              snapshot_dir: str | os.PathLike | None = None, snapshot_every: int | None = None, max_restarts: int = 3,
              rate_limit_timeout_s: float = 30.0, max_concurrency: int = 8, capacity: int = 100_000, seed: int = 0,
              rate_limiter: RateLimiter | None = None, draw: str = "one", **store_kwargs: Any) -> ShardedReplay:
        """Start ``shards`` replay actors (``num_cpus=0``; ``spread``: Ray's SPREAD strategy, one per
        node where it can) and return the client. ``snapshot_dir``/``snapshot_every`` give each shard
        its own restart snapshots under ``snapshot_dir/shard-NNN`` (paths on the shard's node)."""
        from evo.replay.service import ReplayService, _launch

        cls._check(schema, shards, capacity, store_kwargs.get("episode_field"))
        if snapshot_every is not None and snapshot_dir is None:
            raise ReplayError("snapshot_every needs snapshot_dir")
        actors = [_launch(schema, None if name is None else f"{name}-shard{i:03d}",
                          None if snapshot_dir is None else os.path.join(os.fspath(snapshot_dir), f"shard-{i:03d}"),
                          snapshot_every, max_restarts, rate_limit_timeout_s, max_concurrency, None,
                          "SPREAD" if spread else None,
                          cls._shard_kwargs(shards, i, capacity, seed, rate_limiter, store_kwargs))
                  for i in range(shards)]
        for a in actors:  # started concurrently; wait until each answers (a bad store_kwargs raises here)
            ReplayService(a)
        return cls._client(_RayShards(actors, None), shards, schema, capacity, seed, rate_limiter, store_kwargs,
                           rate_limit_timeout_s, None if snapshot_dir is None else os.fspath(snapshot_dir), draw)

    @classmethod
    def _client(cls, shards, n, schema, capacity, seed, rate_limiter, store_kwargs, timeout, snapshot_dir, draw):
        sampler = store_kwargs.get("sampler", "uniform")
        return cls(shards, n, schema, capacity, "prioritized" if sampler in ("prioritized", "prioritised") else sampler,
                   float(store_kwargs.get("beta", 0.4)), store_kwargs.get("episode_field"),
                   rate_limiter.min_size_to_sample if rate_limiter is not None else None, store_kwargs.get("hash_fn"),
                   int(seed), float(timeout), snapshot_dir, draw,
                   rate_limiter.samples_per_insert if rate_limiter is not None else None)

    @classmethod
    def restore(cls, dir: str | os.PathLike, in_process: bool = False, hash_fn: HashFn | None = None,
                **start_kwargs: Any) -> ShardedReplay:
        """A new sharded store (Ray actors, or ``in_process``) as of the newest complete sharded
        snapshot under ``dir``; ``start_kwargs`` go to :meth:`start`."""
        path, meta, arrays = read_snapshot(dir)
        if "shards" not in meta:
            raise ReplayError(f"{path} is a snapshot of a single store: restore it with ReplayStore.restore")
        first = meta["shards"][0]
        n = len(meta["shards"])
        schema = Schema.from_json(first["schema"])
        cap = sum(m["capacity"] for m in meta["shards"])
        made = (cls.in_process(schema, n, capacity=cap, hash_fn=hash_fn) if in_process
                else cls.start(schema, n, capacity=cap, hash_fn=hash_fn, **start_kwargs))
        made._load(path, meta, arrays)
        return made

    # ------------------------------------------------------------------ basics
    def _call(self, calls: list[tuple[int, str, tuple]]) -> list[Any]:
        self.calls += len(calls)
        return self._shards.call(calls)

    def _all(self, method: str, *args: Any) -> list[Any]:
        return self._call([(i, method, args) for i in range(self.n_shards)])

    def __len__(self) -> int:
        return int(sum(self._all("call", "__len__")))

    def stats(self) -> dict[str, int]:
        """The shards' counters summed, plus size, capacity and the number of shards."""
        out: dict[str, int] = {}
        for st in self._all("call", "stats"):
            for k, v in st.items():
                out[k] = out.get(k, 0) + int(v)
        out["shards"] = self.n_shards
        return out

    def hash(self, batch: Mapping[str, Any]) -> np.ndarray:
        arrays, _ = self.schema.validate(batch)
        return route(self.schema, arrays, 1, hash_fn=self._hash_fn)[1]

    def contains(self, keys: Any) -> np.ndarray:
        k = _as_keys(keys)
        out = np.zeros(k.shape[0], dtype=bool)
        for found in self._all("call", "contains", k):
            out |= np.asarray(found, dtype=bool)
        return out

    def refcounts(self, keys: Any) -> np.ndarray:
        k = _as_keys(keys)
        return np.sum([np.asarray(r, dtype=np.int64) for r in self._all("call", "refcounts", k)], axis=0,
                      dtype=np.int64).reshape(-1)

    def get(self, keys: Any) -> dict[str, np.ndarray]:
        """Rows for ``keys``, in order; ReplayError if any key is in no shard."""
        k = _as_keys(keys)
        out = {name: np.zeros((k.shape[0], *f.shape), dtype=f.dtype) for name, f in self.schema.fields.items()}
        have = np.zeros(k.shape[0], dtype=bool)
        for found, rows in self._all("get_present", k):
            found = np.asarray(found, dtype=bool)
            pick = np.flatnonzero(found & ~have)  # a key held by two shards (a cross-shard hash collision): first wins
            if pick.size:
                at = np.searchsorted(np.flatnonzero(found), pick)  # its row among this shard's hits
                for name, col in rows.items():
                    out[name][pick] = np.asarray(col)[at]
                have[pick] = True
        if not have.all():
            missing = k[~have]
            raise ReplayError(f"{missing.size} of {k.size} keys are not in the store (never inserted or evicted), "
                              f"first: {int(missing[0]):#018x}")
        return out

    # ------------------------------------------------------------------ insert
    def insert(self, batch: Mapping[str, Any], timeout: float | None = None) -> np.ndarray:
        """Insert rows, each into the shard its key routes it to; one uint64 key per row.

        A bad batch (fields, dtypes, shapes) or one with more distinct rows for a shard than that
        shard's capacity raises before anything is sent. Otherwise each shard's part is
        all-or-nothing on its own (a rate-limited shard may refuse while the others commit)."""
        arrays, n = self.schema.validate(batch)
        if n == 0:
            return np.zeros(0, dtype=np.uint64)
        self._last = None
        shard, h = route(self.schema, arrays, self.n_shards, self.episode_field, self._hash_fn)
        parts = self._split_rows(arrays, shard, h)
        calls = [(i, "insert", ({k: v[idx] for k, v in arrays.items()} if idx.size < n else arrays, timeout))
                 for i, idx in parts]
        keys = np.empty(n, dtype=np.uint64)
        for (_, idx), got in zip(parts, self._call(calls)):
            keys[idx] = got
        return keys

    def _split_rows(self, arrays: Mapping[str, np.ndarray], shard: np.ndarray, h: np.ndarray) -> list[tuple[int, np.ndarray]]:
        caps = _shard_capacities(self.capacity, self.n_shards)
        parts = []
        for i in range(self.n_shards):
            idx = np.flatnonzero(shard == i)
            if not idx.size:
                continue
            distinct = np.unique(h[idx]).size
            if distinct > caps[i]:
                raise ReplayError(
                    f"insert of {distinct} distinct rows into shard {i} exceeds the store's capacity of {caps[i]} "
                    f"rows on that shard ({self.capacity} split over {self.n_shards} shards); split the batch")
            parts.append((i, idx))
        return parts

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int, timeout: float | None = None, seed: int | None = None) -> SampleBatch:
        """``batch_size`` rows drawn as one store would draw them (module docstring). ``seed``: a
        member view's read — split and shard draws from that seed, outside the rate limiter."""
        return self._draw(batch_size, None, timeout, seed)

    def sample_sequences(self, batch_size: int, length: int, timeout: float | None = None,
                         seed: int | None = None) -> SequenceBatch:
        if self.episode_field is None:
            raise ReplayError("sample_sequences needs the store to be built with episode_field=<int64 field>")
        if length < 1:
            raise ReplayError(f"length must be >= 1, found {length}")
        return self._draw(batch_size, length, timeout, seed)

    def _masses(self, batch_size: int, timeout: float | None, seeded: bool) -> np.ndarray:
        """[N, 3] rows, masses, smallest leaves; waits (unseeded) until the total reaches the limiter's minimum."""
        wait = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        while True:
            m = np.array(self._all("mass"), dtype=np.float64).reshape(self.n_shards, 3)
            size = int(m[:, 0].sum())
            if seeded or self._min_size is None or size >= self._min_size:
                return m
            if time.monotonic() >= deadline:
                msg = (f"sampling refused: the store holds {size} rows, the rate limiter needs "
                       f"min_size_to_sample={self._min_size}")
                raise RateLimited(msg + (f" (waited {wait:g}s in the replay service)" if wait > 0 else ""))
            time.sleep(_POLL_S)

    def _draw(self, batch_size: int, length: int | None, timeout: float | None, seed: int | None):
        if batch_size < 1:
            raise ReplayError(f"batch_size must be >= 1, found {batch_size}")
        one = self.draw == "one" and (seed is not None or self._spi is None)
        fast = self._fast
        if seed is None and one and fast is not None and fast[0] is self._last and self._age < _REFRESH_EVERY:
            return self._draw_fast(fast, batch_size, length, timeout)
        if seed is not None and self._frozen is not None:
            m = self._frozen  # a bound view's read: the generation's masses, no round of calls
        else:
            m = self._last if seed is None and not (one and self._age >= _REFRESH_EVERY) else None
            if m is None or (self._min_size is not None and m[:, 0].sum() < self._min_size) or not m[:, 1].sum() > 0:
                m = self._masses(batch_size, timeout, seed is not None)
                if seed is None:
                    self._last, self._age = m, 0
        if m[:, 0].sum() == 0:
            raise ReplayError("cannot sample from an empty store")
        mass = m[:, 1]
        total = mass.sum()
        if not total > 0:
            raise ReplayError("prioritized sampling: every stored row has priority 0")
        rng = self._rng if seed is None else np.random.Generator(np.random.PCG64(int(seed)))
        if one:
            return self._draw_one(m, rng, batch_size, length, timeout, seed)
        counts = rng.multinomial(batch_size, mass / total)
        seeds = rng.integers(0, 2**63, size=self.n_shards) if seed is not None else [None] * self.n_shards
        # every shard answers (a share of 0 just reports its mass), so the next split has fresh masses
        calls = [(i, "sample_part", (int(c), length, timeout, None if seeds[i] is None else int(seeds[i])))
                 for i, c in enumerate(counts)]
        got = self._call(calls)
        now = np.array([st for _, st in got], dtype=np.float64).reshape(self.n_shards, 3)
        if seed is None:
            self._last, self._age = now, 0
        mins = now[:, 2]
        parts = [(i, b) for i, (b, _) in enumerate(got) if b is not None]
        weights = [np.asarray(b.weights) for _, b in parts]
        if self._sampler == "prioritized":
            low = mins.min()
            weights = [w * np.float32((low / mins[i]) ** self._beta) if np.isfinite(mins[i]) and mins[i] > 0 else w
                       for (i, _), w in zip(parts, weights)]
        keys = np.concatenate([np.asarray(b.keys) for _, b in parts])
        data = {name: np.concatenate([np.asarray(b.data[name]) for _, b in parts]) for name in parts[0][1].data}
        w = np.concatenate(weights).astype(np.float32)
        if length is None:
            return SampleBatch(data, keys, w)
        return SequenceBatch(data, np.concatenate([np.asarray(b.mask) for _, b in parts]), keys, w)

    def _draw_one(self, m: np.ndarray, rng: np.random.Generator, batch_size: int, length: int | None,
                  timeout: float | None, seed: int | None):
        """The whole batch from one shard, chosen with probability mass_i / total (module docstring)."""
        mass = m[:, 1]
        cum = np.cumsum(mass)
        i = min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), self.n_shards - 1)
        shard_seed = None if seed is None else int(rng.integers(0, 2**63))
        batch, st = self._call([(i, "sample_part", (batch_size, length, timeout, shard_seed))])[0]
        if seed is None:  # this shard's fresh mass replaces what this client knew of it
            if self._last is not m:
                self._last = m.copy()
            self._last[i] = st
            self._age += 1
            m = self._last
            self._cache_fast()
        return self._rescaled(batch, length, m[:, 2].min(), m[i, 2])

    def _rescaled(self, batch, length: int | None, low: float, own: float):
        """Importance weights of one shard's batch against the smallest priority over all shards."""
        if self._sampler == "prioritized" and np.isfinite(own) and own > 0 and low < own:
            w = (np.asarray(batch.weights) * np.float32((low / own) ** self._beta)).astype(np.float32)
            return (SampleBatch(batch.data, batch.keys, w) if length is None
                    else SequenceBatch(batch.data, batch.mask, batch.keys, w))
        return batch

    def _cache_fast(self) -> None:
        """What the next unseeded one-shard draws need, as plain Python numbers (``_draw_fast``): kept
        while ``_last`` is the same object and valid to draw from, else None (the full path decides)."""
        m = self._last
        ok = (m is not None and m[:, 0].sum() > 0 and m[:, 1].sum() > 0
              and (self._min_size is None or m[:, 0].sum() >= self._min_size))
        self._fast = (m, np.cumsum(m[:, 1]).tolist(), [tuple(r) for r in m.tolist()]) if ok else None

    def _draw_fast(self, fast: tuple, batch_size: int, length: int | None, timeout: float | None):
        """``_draw_one`` for an unseeded batch whose masses this client knows: the same choice from the
        same generator (bisect on the cumulative masses is searchsorted's right side), less numpy."""
        m, cum, known = fast
        i = min(bisect.bisect_right(cum, self._rng.random() * cum[-1]), self.n_shards - 1)
        self.calls += 1
        batch, st = self._shards.call_one(i, "sample_part", (batch_size, length, timeout, None))
        self._age += 1
        st = tuple(st)
        if st != known[i]:  # the shard's mass moved: refresh what this client knows
            m[i] = st
            self._cache_fast()
        if self._sampler == "prioritized":
            return self._rescaled(batch, length, m[:, 2].min(), m[i, 2])
        return batch

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set priorities of stored keys (on whichever shard holds each); returns how many were found.
        New rows then enter every shard at the largest priority seen, as in one store."""
        k = _as_keys(keys)
        p = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if p.shape[0] != k.shape[0]:
            raise ReplayError(f"update_priorities: {k.shape[0]} keys but {p.shape[0]} priorities")
        if self._sampler != "prioritized":
            raise ReplayError("update_priorities needs sampler='prioritized'; this store samples uniformly")
        if not np.all(np.isfinite(p)) or np.any(p < 0):
            raise ReplayError("update_priorities: priorities must be finite and >= 0 (add a small epsilon yourself)")
        self._last = None
        got = self._all("update_found", k, p)
        top = max(mx for _, mx in got)
        if top >= 0:
            self._all("raise_max_priority", top)
        return int(sum(n for n, _ in got))

    # ------------------------------------------------------------------ member views
    def view_basis(self) -> ViewBasis:
        """The whole store as one basis: sizes and masses summed, the smallest leaf, the largest
        priority; ``parts`` keeps each shard's (rows, mass, smallest leaf), which a view's reads use
        instead of asking the shards (``bound_to``)."""
        bs = self._all("call", "view_basis")
        b0 = bs[0]
        return ViewBasis(size=sum(b.size for b in bs), capacity=sum(b.capacity for b in bs), sampler=b0.sampler,
                         mass=float(sum(b.mass for b in bs)), min_leaf=min(b.min_leaf for b in bs),
                         max_priority=max(b.max_priority for b in bs), alpha=b0.alpha, beta=b0.beta,
                         episode_field=b0.episode_field, min_size_to_sample=self._min_size or 1, custom_hash=b0.custom_hash,
                         parts=tuple((int(b.size), float(b.mass), float(b.min_leaf)) for b in bs))

    def bound_to(self, basis: ViewBasis) -> ShardedReplay:
        """A client whose seeded reads take the shards' masses from ``basis`` (this store's
        ``view_basis()`` at a generation's start) instead of asking every shard first: a member
        view's read is then one call. The shared store must not change while it is used (a
        generation: members write through views); the client's other calls are unchanged."""
        if basis.parts is None or len(basis.parts) != self.n_shards:
            return self
        bound = object.__new__(type(self))
        bound.__dict__.update(self.__dict__)
        bound._frozen = np.array(basis.parts, dtype=np.float64).reshape(self.n_shards, 3)
        bound._last, bound._fast, bound._age, bound.calls = None, None, 0, 0
        bound._rng = np.random.Generator(np.random.PCG64())  # never shares the unseeded stream
        return bound

    def apply_staged(self, staged: StagedWrites) -> dict[str, int]:
        """A member view's writes, split by shard (each shard keeps the member's order; priority
        updates go to every shard) and applied by all shards at once."""
        per: list[list[tuple[Any, ...]]] = [[] for _ in range(self.n_shards)]
        for op in staged.ops:
            if op[0] == "insert":
                arrays, n = self.schema.validate(op[1])
                if not n:
                    continue
                shard, h = route(self.schema, arrays, self.n_shards, self.episode_field, self._hash_fn)
                for i, idx in self._split_rows(arrays, shard, h):
                    per[i].append(("insert", {k: v[idx] for k, v in arrays.items()} if idx.size < n else arrays))
            else:
                for ops in per:
                    ops.append(op)
        self._last = None
        token = uuid.uuid4().hex  # a shard that Ray retries this on after a restart applies it once
        calls = [(i, "apply_shard_ops", (ops, token)) for i, ops in enumerate(per) if ops]
        done = self._call(calls)
        return {"rows": staged.rows, "priority_updates": int(sum(d["priority_updates"] for d in done))}

    # ------------------------------------------------------------------ persistence
    def snapshot(self, dir: str | os.PathLike | None = None, keep: int = 2) -> str:
        """One snapshot of every shard under ``dir``, written by this caller (the shards return
        their arrays through Ray); consistent when no one writes meanwhile (the run snapshots
        between generations). Without ``dir`` each shard snapshots into its own snapshot_dir."""
        if dir is None:
            if self._snapshot_dir is None:
                raise ReplayError("snapshot needs a directory (none given and the service has no snapshot_dir)")
            self._all("snapshot", None, keep)
            return self._snapshot_dir
        states = self._all("export_state")
        meta = {"format": SNAPSHOT_FORMAT, "shards": [m for m, _ in states],
                "client": {"rng": self._rng.bit_generator.state, "min_size_to_sample": self._min_size}}
        arrays = {f"shard{i:03d}.{k}": v for i, (_, arrs) in enumerate(states) for k, v in arrs.items()}
        return write_snapshot(dir, meta, arrays, keep=keep)

    def load_snapshot(self, dir: str | os.PathLike) -> str:
        """Replace every shard's state in place with the newest complete sharded snapshot under
        ``dir`` (read here, sent to the shards); it must have as many shards as this store."""
        path, meta, arrays = read_snapshot(dir)
        self._load(path, meta, arrays)
        return path

    def _load(self, path: str, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        if meta.get("format") != SNAPSHOT_FORMAT:
            raise ReplayError(f"{path} is not a sharded replay snapshot (format {meta.get('format')!r}); a sharded "
                              f"store loads only snapshots of a sharded store")
        if len(meta["shards"]) != self.n_shards:
            raise ReplayError(f"{path} holds {len(meta['shards'])} shards, this store has {self.n_shards}")
        calls = []
        for i, m in enumerate(meta["shards"]):
            pre = f"shard{i:03d}."
            calls.append((i, "import_state", (m, {k[len(pre):]: v for k, v in arrays.items() if k.startswith(pre)}, path)))
        self._call(calls)
        self._last = None
        first = meta["shards"][0]
        self.schema = Schema.from_json(first["schema"])
        self.capacity = sum(int(m["capacity"]) for m in meta["shards"])
        self._sampler, self.episode_field = first["sampler"], first["episode_field"]
        self._beta = float(first["sampler_state"].get("beta", 0.4))
        self._min_size = meta["client"]["min_size_to_sample"]
        self._spi = (first.get("rate_limiter") or {}).get("samples_per_insert")
        self._frozen = None
        self._rng.bit_generator.state = meta["client"]["rng"]

    # ------------------------------------------------------------------ Ray plumbing
    def info(self) -> list[dict]:
        return self._all("info")

    @property
    def actors(self) -> list[Any]:
        """The shards' Ray actor handles (empty in process)."""
        return list(getattr(self._shards, "actors", []))

    #: set by whoever made the snapshot_dir for this store alone (build_replay: a run's restart snapshots)
    owns_snapshot_dir = False

    def stop(self) -> None:
        """Kill the shard actors for good (no restart), first removing their snapshot_dirs if this
        client owns them."""
        if self.owns_snapshot_dir:
            try:
                self._all("discard_snapshots")
            except Exception:  # a shard already gone
                pass
        self._shards.stop()

    def __reduce__(self):
        if not isinstance(self._shards, _RayShards):
            raise ReplayError("an in-process ShardedReplay cannot be sent to another process; use ShardedReplay.start")
        return (_rebuild, (self._shards.actors, self.n_shards, self.schema.to_json(), self.capacity, self._sampler,
                           self._beta, self.episode_field, self._min_size, self._hash_fn, self.seed, self._timeout,
                           self._snapshot_dir, self.draw, self._spi, self._frozen))


def _rebuild(actors, n, schema_json, capacity, sampler, beta, episode_field, min_size, hash_fn, seed, timeout,
             snapshot_dir, draw="one", spi=None, frozen=None) -> ShardedReplay:
    c = ShardedReplay(_RayShards(actors, None), n, Schema.from_json(schema_json), capacity, sampler, beta,
                      episode_field, min_size, hash_fn, seed, timeout, snapshot_dir, draw, spi)
    c._frozen = frozen
    # a copy in another process splits its unseeded batches with its own fresh stream (copies that
    # shared the driver's stream would make the same splits); seeded reads do not use it
    c._rng = np.random.Generator(np.random.PCG64())
    return c
