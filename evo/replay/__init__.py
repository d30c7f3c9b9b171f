"""Shared hash-indexed replay store. See docs/replay.md.

Implementation modules are private; this package re-exports the public API.
"""

from evo.replay.errors import RateLimited, ReplayError
from evo.replay.hashing import hash_rows
from evo.replay.protocol import Replay, ReplaySpec, build_replay
from evo.replay.ratelimit import RateLimiter
from evo.replay.schema import Field, Schema
from evo.replay.service import ReplayService
from evo.replay.sharded import ShardedReplay
from evo.replay.store import ReplayStore, SampleBatch, SequenceBatch

__all__ = [
    "Field",
    "Schema",
    "ReplayStore",
    "SampleBatch",
    "SequenceBatch",
    "RateLimiter",
    "RateLimited",
    "ReplayService",
    "ShardedReplay",
    "ReplayError",
    "hash_rows",
    "Replay",
    "ReplaySpec",
    "build_replay",
]
