"""ReplayService: one ReplayStore in a Ray actor, shared by every member of a population.

The actor takes no CPU (``num_cpus=0``): it is a data structure, not a worker, and must never
compete with training actors for a CPU slot. It is threaded (``max_concurrency``) so that a sample
waiting on the rate limiter does not block the insert that would unblock it; all store access is
serialised by one condition variable. Calls are batched (one actor call per insert/sample batch)
and answer with numpy arrays (zero-copy and read-only when over Ray's inline threshold).

Fault tolerance: with ``snapshot_dir`` the actor snapshots every ``snapshot_every`` inserted rows
(and on ``snapshot()``); if the actor process dies, Ray restarts it (``max_restarts``) and its
constructor restores the newest complete snapshot, and calls in flight are retried
(``max_task_retries``) — inserts are idempotent apart from reference counts, thanks to dedup.
That ``snapshot_dir`` is a path on the actor's node. With one, the actor also *checkpoints* when
asked for its ``view_basis`` (a generation's start: the state every member view reads) if it
changed since its last snapshot, and logs each boundary write (``apply_staged``,
``apply_shard_ops``) to a write-ahead log beside that snapshot before applying it, under the
call's token: a restarted actor restores the checkpoint and replays the log, and a retried call
whose token the log holds is answered without applying it twice. So an actor killed
mid-generation comes back to exactly the generation's start (the members' seeded reads, retried by
Ray, return the same rows), and one killed during the boundary loses and doubles nothing
(docs/replay.md, "Restarts"). A snapshot the *caller* asks for
(``snapshot(dir)``, ``load_snapshot(dir)``; the run store's per-generation snapshots) travels
through Ray instead: the actor returns its arrays and the caller writes the files, or the caller
reads them and sends them, so the driver's run directory need not exist where the actor runs.

`evo.replay.sharded.ShardedReplay` runs several of these actors as one store.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

from evo.replay.errors import RateLimited, ReplayError
from evo.replay.schema import Schema
from evo.replay.snapshot import latest_complete, read_snapshot, write_snapshot
from evo.replay.staging import StagedWrites, ViewBasis
from evo.replay.store import ReplayStore, SampleBatch, SequenceBatch


class _ReplayActor:
    """The actor body (decorated with ``ray.remote`` at start time so importing needs no Ray)."""

    def __init__(self, schema_json: dict, snapshot_dir: str | None, snapshot_every: int | None,
                 rate_limit_timeout_s: float, store_kwargs: dict) -> None:
        self._cond = threading.Condition()
        self._snapshot_dir = snapshot_dir
        self._snapshot_every = snapshot_every
        self._timeout = rate_limit_timeout_s
        self.restored_from = None
        self._applied: dict[str, dict] = {}  # token -> result of the boundary writes since the checkpoint
        self._dirty = False  # changed since the last snapshot in snapshot_dir
        self.replayed = 0  # write-ahead log entries replayed by this process at start
        if snapshot_dir is not None and latest_complete(snapshot_dir) is not None:
            self.restored_from = latest_complete(snapshot_dir)
            self._store = ReplayStore.restore(snapshot_dir, hash_fn=store_kwargs.get("hash_fn"))
        else:
            self._store = ReplayStore(Schema.from_json(schema_json), **store_kwargs)
        if snapshot_dir is not None:
            self._replay_log()
        self._rows_at_snapshot = self._store.counters["rows_inserted"]

    # ---- the write-ahead log of boundary writes (module docstring) ------------------------------
    def _log_dir(self) -> str:
        base = os.path.basename(self.restored_from) if self.restored_from else "initial"
        return os.path.join(self._snapshot_dir, "wal", base)

    def _replay_log(self) -> None:
        """Apply the boundary writes logged since the snapshot this process restored, in order."""
        d = self._log_dir()
        if not os.path.isdir(d):
            return
        for name in sorted(n for n in os.listdir(d) if n.endswith(".npz")):
            kind, token, ops = _read_entry(os.path.join(d, name))
            self._applied[token] = self._apply(kind, ops)
            self.replayed += 1
            self._dirty = True

    def _apply(self, kind: str, ops: list) -> dict:
        if kind == "staged":
            return self._store.apply_staged(StagedWrites(ops))
        from evo.replay.sharded import apply_shard_ops

        return apply_shard_ops(self._store, ops)

    def _logged(self, kind: str, ops: list, token: str | None) -> dict:
        """Apply boundary writes once: logged first (with a snapshot_dir), skipped if ``token`` was applied."""
        durable = self._snapshot_dir is not None and token is not None
        if durable and token in self._applied:
            return self._applied[token]  # a retried call: applied before this process died (or by it)
        if durable:
            _write_entry(os.path.join(self._log_dir(), f"{len(self._applied):06d}.npz"), kind, token, ops)
        out = self._apply(kind, ops)
        if durable:  # remembered until the next checkpoint (without a snapshot_dir a restart is empty anyway)
            self._applied[token] = out
        self._dirty = True
        return out

    def _checkpoint_locked(self) -> None:
        """Snapshot into snapshot_dir if the store changed since the last one there (or there is none),
        then drop the logs of older snapshots: the state a restart comes back to."""
        if self._snapshot_dir is None or (not self._dirty and self.restored_from is not None):
            return
        self._snapshot_locked(self._snapshot_dir)

    def discard_snapshots(self) -> None:
        """Remove this actor's snapshot_dir (a run's restart snapshots, when the run stops)."""
        with self._cond:
            if self._snapshot_dir is not None:
                shutil.rmtree(self._snapshot_dir, ignore_errors=True)
                if os.path.basename(os.path.normpath(self._snapshot_dir)).startswith("shard-"):
                    try:  # a sharded store's directory: the last shard to leave removes it
                        os.rmdir(os.path.dirname(os.path.normpath(self._snapshot_dir)))
                    except OSError:
                        pass

    def _blocking(self, fn, timeout: float | None):
        """Run ``fn`` under the lock; while the rate limiter refuses, wait for the other side."""
        timeout = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                try:
                    out = fn()
                except RateLimited as exc:
                    left = deadline - time.monotonic()
                    if not exc.retryable or left <= 0:
                        waited = f" (waited {timeout:g}s in the replay service)" if timeout > 0 else ""  # 0: in process
                        raise RateLimited(f"{exc}{waited}", exc.retryable) from None
                    self._cond.wait(left)
                    continue
                self._cond.notify_all()
                return out

    def insert(self, batch: Mapping[str, np.ndarray], timeout: float | None = None) -> np.ndarray:
        keys = self._blocking(lambda: self._store.insert(batch), timeout)
        self._dirty = True
        if self._snapshot_dir and self._snapshot_every:
            with self._cond:
                if self._store.counters["rows_inserted"] - self._rows_at_snapshot >= self._snapshot_every:
                    self._snapshot_locked(self._snapshot_dir)
        return keys

    def sample(self, batch_size: int, timeout: float | None = None, seed: int | None = None) -> SampleBatch:
        if seed is not None:  # a member view's seeded read: not rate-limited, so never waits
            with self._cond:
                return self._store.sample(batch_size, seed)
        return self._blocking(lambda: self._store.sample(batch_size), timeout)

    def sample_sequences(self, batch_size: int, length: int, timeout: float | None = None,
                         seed: int | None = None) -> SequenceBatch:
        if seed is not None:
            with self._cond:
                return self._store.sample_sequences(batch_size, length, seed)
        return self._blocking(lambda: self._store.sample_sequences(batch_size, length), timeout)

    def apply_staged(self, staged: StagedWrites, token: str | None = None) -> dict:
        """One member view's writes of a generation, replayed in one call (see ReplayStore.apply_staged);
        logged and applied once per ``token`` (module docstring)."""
        with self._cond:
            out = self._logged("staged", staged.ops, token)
            self._cond.notify_all()
            return out

    def call(self, method: str, *args: Any) -> Any:
        """Non-blocking store methods (get, contains, refcounts, update_priorities, stats, hash, len,
        view_basis — which first checkpoints a changed store that has a snapshot_dir)."""
        if method not in _PLAIN:
            raise ReplayError(f"unknown replay method {method!r}")
        with self._cond:
            if method == "__len__":
                return len(self._store)
            if method == "view_basis":
                self._checkpoint_locked()
            elif method == "update_priorities":
                self._dirty = True
            return getattr(self._store, method)(*args)

    def snapshot(self, dir: str | None = None, keep: int = 2) -> str:
        with self._cond:
            return self._snapshot_locked(dir or self._snapshot_dir, keep)

    def export_state(self) -> tuple[dict, dict]:
        """The store's exact snapshot as (meta, arrays), copied under the lock: the driver writes the
        files (its run directory need not exist on this actor's node)."""
        with self._cond:
            return self._store.snapshot_state(copy=True)

    def import_state(self, meta: dict, arrays: dict, path: str | None = None) -> None:
        """Replace the store in place with a snapshot the driver read (see ``load_snapshot``)."""
        with self._cond:
            self._store.load_state(meta, arrays)
            self.restored_from = path
            self._rows_at_snapshot = self._store.counters["rows_inserted"]
            self._dirty = True
            if self._snapshot_dir is not None:
                self._snapshot_locked(self._snapshot_dir)
            self._cond.notify_all()

    # ---- calls of a sharded service's client (evo/replay/sharded.py) -----------------------------
    def mass(self) -> tuple[int, float, float]:
        """(rows, sampling mass, smallest positive priority**alpha) as of now."""
        with self._cond:
            return self._store.mass()

    def sample_part(self, batch_size: int, length: int | None, timeout: float | None,
                    seed: int | None) -> tuple[SampleBatch | SequenceBatch | None, tuple[int, float, float]]:
        """A shard's share of a batch (None for a share of 0) and this shard's (rows, mass, smallest
        priority**alpha) at that moment: the client rescales importance weights by the smallest over
        all shards and splits its next batch by these masses."""
        def draw():
            out = None
            if batch_size:
                out = (self._store.sample(batch_size, seed) if length is None
                       else self._store.sample_sequences(batch_size, length, seed))
            return out, self._store.mass()

        if seed is not None or not batch_size:
            with self._cond:
                return draw()
        return self._blocking(draw, timeout)

    def get_present(self, keys: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Which of ``keys`` this shard holds, and their rows (in order)."""
        with self._cond:
            found = self._store.contains(keys)
            return found, self._store.get(keys[found])

    def update_found(self, keys: np.ndarray, priorities: np.ndarray) -> tuple[int, float]:
        """Update the keys this shard holds; (how many, the largest priority among them or -1)."""
        with self._cond:
            found = self._store.contains(keys)
            n = self._store.update_priorities(keys[found], priorities[found])
            return n, float(priorities[found].max()) if n else -1.0

    def raise_max_priority(self, priority: float) -> None:
        """New rows get the largest priority seen by *any* shard, as in one store."""
        with self._cond:
            sampler = self._store._sampler
            sampler.max_priority = max(sampler.max_priority, float(priority))
            self._dirty = True

    def apply_shard_ops(self, ops: list, token: str | None = None) -> dict:
        """This shard's part of a member's staged writes, in the member's order (see sharded.py);
        logged and applied once per ``token``."""
        with self._cond:
            out = self._logged("shard_ops", ops, token)
            self._cond.notify_all()
            return out

    def _snapshot_locked(self, dir: str | None, keep: int = 2) -> str:
        if dir is None:
            raise ReplayError("snapshot needs a directory (none given and the service has no snapshot_dir)")
        path = self._store.snapshot(dir, keep=keep)
        self._rows_at_snapshot = self._store.counters["rows_inserted"]
        if self._snapshot_dir is not None and os.path.abspath(dir) == os.path.abspath(self._snapshot_dir):
            # the restart point moved here: the logs of earlier snapshots are spent
            self.restored_from, self._dirty, self._applied = path, False, {}
            wal = os.path.join(self._snapshot_dir, "wal")
            if os.path.isdir(wal):
                for name in os.listdir(wal):
                    if name != os.path.basename(path):
                        shutil.rmtree(os.path.join(wal, name), ignore_errors=True)
        return path

    def info(self) -> dict:
        return {"capacity": self._store.capacity, "schema": self._store.schema.to_json(),
                "restored_from": self.restored_from, "pid": os.getpid(), "replayed": self.replayed}


_PLAIN = {"get", "contains", "refcounts", "update_priorities", "stats", "hash", "__len__", "view_basis"}


def _write_entry(path: str, kind: str, token: str, ops: list) -> None:
    """One write-ahead log entry: ``ops`` as .npz arrays plus a JSON header, written to a temporary
    file, fsynced and renamed into place (a torn entry is never read)."""
    arrays: dict[str, np.ndarray] = {}
    shape = []
    for i, op in enumerate(ops):
        if op[0] == "insert":
            shape.append(["insert", sorted(op[1])])
            arrays.update({f"{i}.{k}": np.asarray(v) for k, v in op[1].items()})
        else:
            shape.append(["priorities"])
            arrays[f"{i}.keys"], arrays[f"{i}.p"] = np.asarray(op[1]), np.asarray(op[2])
    head = json.dumps({"kind": kind, "token": token, "ops": shape}).encode()
    arrays["__head__"] = np.frombuffer(head, dtype=np.uint8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_entry(path: str) -> tuple[str, str, list]:
    with np.load(path, allow_pickle=False) as z:
        head = json.loads(bytes(z["__head__"]).decode())
        ops: list[tuple[Any, ...]] = []
        for i, op in enumerate(head["ops"]):
            if op[0] == "insert":
                ops.append(("insert", {k: z[f"{i}.{k}"] for k in op[1]}))
            else:
                ops.append(("priorities", z[f"{i}.keys"], z[f"{i}.p"]))
    return head["kind"], head["token"], ops


def restart_dir() -> str:
    """A fresh path for a run's replay restart snapshots (created by the actor on its node)."""
    return os.path.join(tempfile.gettempdir(), f"evo-replay-{uuid.uuid4().hex[:12]}")


class ReplayService:
    """Client for a replay actor: the ReplayStore API, blocking, numpy back. Picklable, so it can be
    handed to training actors; ``ReplayService.connect(name)`` finds a named service from anywhere."""

    remote = True  # every call is a round trip to the actor (member views fetch their reads ahead: evo.replay.view)

    def __init__(self, actor: Any, timeout_s: float | None = None) -> None:
        import ray

        self._actor = actor
        self._timeout_s = timeout_s
        info = ray.get(actor.info.remote(), timeout=timeout_s)
        self.capacity: int = info["capacity"]
        self.schema = Schema.from_json(info["schema"])

    @classmethod
    def start(
        cls,
        schema: Schema,
        name: str | None = None,
        snapshot_dir: str | os.PathLike | None = None,
        snapshot_every: int | None = None,
        max_restarts: int = 3,
        rate_limit_timeout_s: float = 30.0,
        max_concurrency: int = 8,
        namespace: str | None = None,
        scheduling_strategy: str | None = None,
        **store_kwargs: Any,
    ) -> ReplayService:
        """Start the actor (``num_cpus=0``) in the current Ray cluster and return a client.

        ``rate_limit_timeout_s``: how long a rate-limited insert/sample waits before raising
        RateLimited. ``scheduling_strategy``: Ray's, e.g. "SPREAD". ``store_kwargs`` go to
        :class:`ReplayStore` (capacity, storage, sampler, ...).
        """
        return cls(_launch(schema, name, snapshot_dir, snapshot_every, max_restarts, rate_limit_timeout_s,
                           max_concurrency, namespace, scheduling_strategy, store_kwargs))

    @classmethod
    def connect(cls, name: str, namespace: str | None = None) -> ReplayService:
        """Client for a service started elsewhere with ``name=``."""
        import ray

        return cls(ray.get_actor(name, namespace=namespace))

    def __reduce__(self):
        return (_rebuild_client, (self._actor, self.capacity, self.schema.to_json(), self._timeout_s))

    def _get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref, timeout=self._timeout_s)

    # the ReplayStore API
    def insert(self, batch: Mapping[str, Any], timeout: float | None = None) -> np.ndarray:
        batch = {k: np.asarray(v) for k, v in batch.items()} if isinstance(batch, Mapping) else batch
        return self._get(self._actor.insert.remote(batch, timeout))

    def sample(self, batch_size: int, timeout: float | None = None, seed: int | None = None) -> SampleBatch:
        return self._get(self._actor.sample.remote(batch_size, timeout, seed))

    def sample_sequences(self, batch_size: int, length: int, timeout: float | None = None,
                         seed: int | None = None) -> SequenceBatch:
        return self._get(self._actor.sample_sequences.remote(batch_size, length, timeout, seed))

    def view_basis(self) -> ViewBasis:
        """The store as of now, for member views (evo.replay.view)."""
        return self._get(self._actor.call.remote("view_basis"))

    def apply_staged(self, staged: StagedWrites) -> dict:
        """Replay a member view's staged writes in the actor, in one call (applied once, also when
        Ray retries it on a restarted actor: the call carries a fresh token)."""
        return self._get(self._actor.apply_staged.remote(staged, uuid.uuid4().hex))

    def get(self, keys: Any) -> dict[str, np.ndarray]:
        return self._get(self._actor.call.remote("get", np.asarray(keys)))

    def contains(self, keys: Any) -> np.ndarray:
        return self._get(self._actor.call.remote("contains", np.asarray(keys)))

    def refcounts(self, keys: Any) -> np.ndarray:
        return self._get(self._actor.call.remote("refcounts", np.asarray(keys)))

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        return self._get(self._actor.call.remote("update_priorities", np.asarray(keys), np.asarray(priorities)))

    def stats(self) -> dict[str, int]:
        return self._get(self._actor.call.remote("stats"))

    def hash(self, batch: Mapping[str, Any]) -> np.ndarray:
        return self._get(self._actor.call.remote("hash", dict(batch)))

    def __len__(self) -> int:
        return self._get(self._actor.call.remote("__len__"))

    def snapshot(self, dir: str | os.PathLike | None = None, keep: int = 2) -> str:
        """Snapshot the store under ``dir`` *in this process*: the actor returns its arrays through
        Ray's object store and this caller writes the files, so ``dir`` need exist only here (the
        driver's run directory). Without ``dir``, the actor snapshots into its own ``snapshot_dir``
        (a path on its node: what it restores from if its process dies)."""
        if dir is None:
            return self._get(self._actor.snapshot.remote(None, keep))
        meta, arrays = self._get(self._actor.export_state.remote())
        return write_snapshot(dir, meta, arrays, keep=keep)

    def load_snapshot(self, dir: str | os.PathLike) -> str:
        """Replace the service's store in place with the newest complete snapshot under ``dir``, read
        in this process and sent to the actor through Ray; returns that snapshot's path."""
        path, meta, arrays = read_snapshot(dir)
        self._get(self._actor.import_state.remote(meta, arrays, path))
        info = self.info()
        self.capacity, self.schema = info["capacity"], Schema.from_json(info["schema"])
        return path

    def info(self) -> dict:
        return self._get(self._actor.info.remote())

    @property
    def actor(self) -> Any:
        return self._actor

    #: set by whoever made the snapshot_dir for this store alone (build_replay: a run's restart snapshots)
    owns_snapshot_dir = False

    def stop(self) -> None:
        """Kill the actor for good (no restart), first removing its snapshot_dir if this client owns it."""
        import ray

        if self.owns_snapshot_dir:
            try:
                self._get(self._actor.discard_snapshots.remote())
            except Exception:  # already gone
                pass
        ray.kill(self._actor, no_restart=True)


def _launch(schema: Schema, name: str | None, snapshot_dir: str | os.PathLike | None, snapshot_every: int | None,
            max_restarts: int, rate_limit_timeout_s: float, max_concurrency: int, namespace: str | None,
            scheduling_strategy: str | None, store_kwargs: dict) -> Any:
    """Create a replay actor without waiting for it (ReplayService(actor) waits)."""
    import ray

    if not ray.is_initialized():
        raise ReplayError("ReplayService.start needs a running Ray cluster: call ray.init() first")
    if snapshot_every is not None and snapshot_dir is None:
        raise ReplayError("snapshot_every needs snapshot_dir")
    opts: dict[str, Any] = {"num_cpus": 0, "max_restarts": max_restarts,
                            "max_task_retries": max_restarts if max_restarts else 0, "max_concurrency": max_concurrency}
    if scheduling_strategy is not None:
        opts["scheduling_strategy"] = scheduling_strategy
    if name is not None:
        opts["name"] = name
        if namespace is not None:
            opts["namespace"] = namespace
    return ray.remote(_ReplayActor).options(**opts).remote(
        schema.to_json(), os.fspath(snapshot_dir) if snapshot_dir is not None else None, snapshot_every,
        rate_limit_timeout_s, store_kwargs)


def _rebuild_client(actor: Any, capacity: int, schema_json: dict, timeout_s: float | None) -> ReplayService:
    c = ReplayService.__new__(ReplayService)
    c._actor, c.capacity, c.schema, c._timeout_s = actor, capacity, Schema.from_json(schema_json), timeout_s
    return c
