"""The replay seam: what a member may call on the shared store (`Replay`), and what an agent kind
declares it needs (`ReplaySpec`). Where the store lives — in this process or as a Ray actor — is
the run's choice, made by the scheduler backend from the spec (`build_replay`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from evo.replay.schema import Schema
from evo.replay.staging import StagedWrites, ViewBasis

__all__ = ["Replay", "SharedReplay", "ReplaySpec", "build_replay"]


@runtime_checkable
class Replay(Protocol):
    """The shared store as members use it. `ReplayStore`, `ReplayService` and `ShardedReplay` implement it,
    and `tests/replay/test_contract.py` holds every backend to it."""

    schema: Schema

    def __len__(self) -> int: ...

    def insert(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Add rows; returns their content keys (duplicates are stored once)."""

    def sample(self, batch_size: int) -> Any:
        """A `SampleBatch` drawn by the store's sampler (uniform or prioritised)."""

    def sample_sequences(self, batch_size: int, length: int) -> Any:
        """A `SequenceBatch` of windows along episodes (needs an `episode_field`)."""

    def get(self, keys: Any) -> dict[str, np.ndarray]:
        """The rows with these keys, in order."""

    def hash(self, batch: Mapping[str, Any]) -> np.ndarray:
        """The content keys these rows would get, without inserting them."""

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """New priorities for stored rows; returns how many were found."""

    def snapshot(self, dir: str | os.PathLike, keep: int = 2) -> str:
        """Write a complete, atomic snapshot under `dir`; returns its path. The files are written
        by the calling process (a Ray-backed store sends its arrays to it), so `dir` need exist
        only there."""

    def load_snapshot(self, dir: str | os.PathLike) -> str:
        """Replace the contents with the newest complete snapshot under `dir`, in place (read by
        the calling process)."""


@runtime_checkable
class SharedReplay(Replay, Protocol):
    """The run's shared store as the engine uses it besides the members' calls: the basis of the
    members' views at a generation's start, and their staged writes replayed at its end
    (evo.replay.view; `ReplayStore`, `ReplayService` and `ShardedReplay` implement it)."""

    def view_basis(self) -> ViewBasis:
        """Size, priority mass and sampler settings as of now."""

    def apply_staged(self, staged: StagedWrites) -> dict[str, int]:
        """Replay one member's staged writes, in the order it made them."""


@dataclass
class ReplaySpec:
    """What an agent kind needs from the run's shared store, built once per run by the backend.

    `initial_rows`, when given, returns the rows to load before training (an offline dataset):
    one mapping of arrays, or an iterable of such chunks so that a large file streams into the
    store without ever being whole in memory. It is called once, in the driver.
    """

    schema: Schema
    capacity: int
    sampler: str = "uniform"
    alpha: float = 0.6
    beta: float = 0.4
    episode_field: str | None = None
    min_size_to_sample: int | None = None
    samples_per_insert: float | None = None
    #: replay actors the store is split over on the Ray backend (the experiment's `[replay]` table;
    #: docs/replay.md, "Shards"); `spread` places them with Ray's SPREAD strategy
    shards: int = 1
    spread: bool = False
    initial_rows: Callable[[], Mapping[str, np.ndarray] | Iterable[Mapping[str, np.ndarray]]] | None = field(
        default=None, repr=False)

    def store_kwargs(self, seed: int) -> dict[str, Any]:
        """Keyword arguments of `ReplayStore` (and of `ReplayService.start`) for this spec."""
        from evo.replay.ratelimit import RateLimiter

        limiter = None
        if self.min_size_to_sample is not None or self.samples_per_insert is not None:
            limiter = RateLimiter(min_size_to_sample=self.min_size_to_sample or 1,
                                  samples_per_insert=self.samples_per_insert)
        return {"capacity": int(self.capacity), "sampler": self.sampler, "alpha": self.alpha, "beta": self.beta,
                "seed": int(seed), "episode_field": self.episode_field, "rate_limiter": limiter}


#: how many times a run's replay actor (each shard) may be restarted after its process dies
RESTARTS = 8


def build_replay(spec: ReplaySpec, seed: int, distributed: bool) -> Replay:
    """The store for `spec`: in this process, or Ray actors every worker reaches (`distributed`):
    one replay actor, or `spec.shards` of them behind a `ShardedReplay`."""
    if distributed:
        # restart snapshots on the actors' nodes: an actor that dies mid-generation comes back to the
        # generation's start (its view_basis checkpoint) plus the boundary writes it logged since
        from evo.replay.service import restart_dir

        restarts = {"snapshot_dir": restart_dir(), "max_restarts": RESTARTS}
    if distributed and spec.shards > 1:
        from evo.replay.sharded import ShardedReplay

        store: Replay = ShardedReplay.start(spec.schema, spec.shards, spread=spec.spread, **restarts,
                                            **spec.store_kwargs(seed))
        store.owns_snapshot_dir = True
    elif distributed:
        from evo.replay.service import ReplayService

        store = ReplayService.start(spec.schema, scheduling_strategy="SPREAD" if spec.spread else None, **restarts,
                                    **spec.store_kwargs(seed))
        store.owns_snapshot_dir = True
    else:
        if spec.shards > 1:
            import warnings

            warnings.warn(f"replay.shards = {spec.shards}: the inline backend keeps one in-process store "
                          "(shards are replay actors on the Ray backend)", stacklevel=2)
        from evo.replay.store import ReplayStore

        store = ReplayStore(spec.schema, **spec.store_kwargs(seed))
    if spec.initial_rows is not None:
        rows = spec.initial_rows()
        for chunk in [rows] if isinstance(rows, Mapping) else rows:
            store.insert(chunk)
    return store
