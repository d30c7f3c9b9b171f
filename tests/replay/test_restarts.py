"""A replay actor that dies comes back as it was (docs/replay.md, "Restarts"), tested on the actor's own
body in this process: a restart is Ray running the constructor again with the same arguments, so
building a second body on the same snapshot_dir is exactly what a restarted process does.

* `view_basis` checkpoints a changed store (the state every member view of a generation reads);
* boundary writes (`apply_staged`, `apply_shard_ops`) are logged before they are applied, under the
  call's token: a restart replays the log, and a retried call with a logged token is not applied twice;
* a checkpoint drops the spent logs.
(The same on Ray with SIGKILL: tests/replay/test_service.py; during a real `evo run`: tests/test_replay_faults.py.)
"""

from __future__ import annotations

import os

import numpy as np

from evo.replay.service import _ReplayActor
from evo.replay.sharded import ShardedReplay
from evo.replay.staging import StagedWrites
from evo.replay.view import MemberView
from tests.replay.helpers import SCHEMA, rows

KW = {"capacity": 500, "sampler": "prioritized", "seed": 4}


def body(d) -> _ReplayActor:
    return _ReplayActor(SCHEMA.to_json(), os.fspath(d), None, 0.0, dict(KW))


def state(a: _ReplayActor) -> tuple:
    keys = np.sort(np.asarray(a._store._index.slot_key[: a._store._written]))
    b = a._store.view_basis()
    st = {k: v for k, v in a._store.stats().items() if k != "samples"}
    return st, keys.tolist(), a._store.refcounts(keys).tolist(), round(b.mass, 9), b.max_priority


def staged(seed: int) -> StagedWrites:
    r = rows(30, seed=seed)
    w = StagedWrites()
    w.ops.append(("insert", r))
    w.ops.append(("insert", {k: v[:5] for k, v in r.items()}))  # duplicates: refcounts 2
    return w


def test_a_restarted_actor_comes_back_to_the_checkpoint_plus_the_logged_boundary_writes(tmp_path):
    a = body(tmp_path)
    a.insert(rows(100))
    a.call("view_basis")  # a generation starts: checkpoint
    assert a.restored_from.endswith("snapshot-000001")
    start = state(a)
    seeded = a.sample(32, seed=9)
    # killed mid-generation: the restart is the generation's start, and seeded reads are the same rows
    b = body(tmp_path)
    assert state(b) == start and b.replayed == 0
    np.testing.assert_array_equal(b.sample(32, seed=9).keys, seeded.keys)
    # the boundary: two members' writes, then killed before the next checkpoint
    out1 = b.apply_staged(staged(1), token="m1")
    b.apply_staged(staged(2), token="m2")
    done = state(b)
    c = body(tmp_path)
    assert c.replayed == 2 and state(c) == done
    # Ray retries the call that was in flight: its token is in the log, so it is not applied twice
    assert c.apply_staged(staged(2), token="m2") is not None and state(c) == done
    assert c.apply_staged(staged(1), token="m1") == out1
    c.apply_staged(staged(3), token="m3")
    after = state(c)
    assert after != done
    # the next generation's start checkpoints and drops the spent log
    c.call("view_basis")
    assert c.restored_from.endswith("snapshot-000002") and os.listdir(tmp_path / "wal") == []
    d = body(tmp_path)
    assert d.replayed == 0 and state(d) == after


def test_without_tokens_a_retry_would_double_the_writes(tmp_path):
    """The failure the tokens prevent: the same writes applied twice raise refcounts (rows dedupe)."""
    a = body(tmp_path)
    a.insert(rows(50))
    a.call("view_basis")
    a.apply_staged(staged(1), token="t")
    once = state(a)
    a.apply_staged(staged(1), token="t")
    assert state(a) == once
    a.apply_staged(staged(1))  # no token: applied again
    assert state(a)[2] != once[2]


def test_a_sharded_stores_shards_log_their_part_of_each_member(tmp_path):
    """Every shard of an in-process sharded store with restart snapshots logs its part of a member's
    writes; rebuilt from their directories, the shards hold what the live ones do."""
    s = ShardedReplay.in_process(SCHEMA, 2, **KW)
    for i, b in enumerate(s._shards.bodies):  # what ShardedReplay.start(snapshot_dir=...) gives each shard
        b._snapshot_dir = os.fspath(tmp_path / f"shard-{i:03d}")
    s.insert(rows(80))
    basis = s.view_basis()
    view = MemberView(s, basis, seed=3)
    view.insert(rows(20, seed=5))
    view.update_priorities(view.sample(16).keys, np.linspace(0.5, 2.0, 16))
    s.apply_staged(view.staged())
    live = [state(b) for b in s._shards.bodies]
    back = [_ReplayActor(SCHEMA.to_json(), os.fspath(tmp_path / f"shard-{i:03d}"), None, 0.0,
                         {**KW, "capacity": 250, "seed": b._store.seed}) for i, b in enumerate(s._shards.bodies)]
    assert [b.replayed for b in back] == [1, 1]
    assert [state(b) for b in back] == live
