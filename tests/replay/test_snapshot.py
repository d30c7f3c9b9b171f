"""Snapshots are atomic: a kill -9 mid-write or a damaged snapshot falls back to the previous one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evo.replay import RateLimiter, ReplayError, ReplayStore
from evo.replay import snapshot as snap
from tests.replay.helpers import SCHEMA, assert_batches_equal, rows

REPO = Path(__file__).resolve().parents[2]

WRITER = r"""
import sys, time
import evo.replay.snapshot as snap
from evo.replay import ReplayStore
from tests.replay.helpers import SCHEMA, rows

root = sys.argv[1]
s = ReplayStore(SCHEMA, capacity=1000, sampler="prioritized", seed=3)
s.insert(rows(300))
s.snapshot(root)
print("FIRST", flush=True)
s.insert(rows(300, seed=1))
real, n = snap._write_array, [0]

def slow(path, arr):
    real(path, arr)
    n[0] += 1
    if n[0] == 3:  # some files written, no marker yet
        print("WRITING", flush=True)
        time.sleep(120)

snap._write_array = slow
s.snapshot(root)
print("FINISHED", flush=True)
"""


def reference_store() -> ReplayStore:
    s = ReplayStore(SCHEMA, capacity=1000, sampler="prioritized", seed=3)
    s.insert(rows(300))
    return s


def test_kill_9_during_snapshot_restores_previous(tmp_path):
    root = tmp_path / "snaps"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "FIRST"
        assert proc.stdout.readline().strip() == "WRITING"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    leftovers = [p.name for p in root.iterdir()]
    assert any(n.startswith(".tmp-") for n in leftovers) and "snapshot-000001" in leftovers
    r = ReplayStore.restore(root)
    ref = reference_store()
    assert len(r) == 300 and r.stats() == ref.stats()
    keys = ref.sample(300).keys
    np.testing.assert_array_equal(r.sample(300).keys, keys)
    assert_batches_equal(r.get(keys), ref.get(keys))
    # the next snapshot cleans up the debris and numbers on
    path = r.snapshot(root)
    assert path.endswith("snapshot-000002")
    assert not any(p.name.startswith(".tmp-") for p in root.iterdir())


def test_damaged_newest_snapshot_falls_back(tmp_path):
    s = ReplayStore(SCHEMA, capacity=100, seed=1, rate_limiter=RateLimiter(min_size_to_sample=1))
    k1 = s.insert(rows(10))
    p1 = s.snapshot(tmp_path)
    s.insert(rows(10, seed=1))
    p2 = s.snapshot(tmp_path)
    assert len(ReplayStore.restore(tmp_path)) == 20
    # truncate a data file of the newest: size no longer matches the marker
    victim = next(Path(p2).glob("col.obs.npy"))
    victim.write_bytes(victim.read_bytes()[:-8])
    assert snap.latest_complete(tmp_path) == p1
    r = ReplayStore.restore(tmp_path)
    assert len(r) == 10 and r.contains(k1).all()
    # a named snapshot without its marker is incomplete too
    os.remove(os.path.join(p1, snap.MARKER))
    with pytest.raises(ReplayError, match="no complete snapshot"):
        ReplayStore.restore(tmp_path)


def test_keep_prunes_old_snapshots(tmp_path):
    s = ReplayStore(SCHEMA, capacity=100)
    for i in range(4):
        s.insert(rows(2, seed=i))
        s.snapshot(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot-000003", "snapshot-000004"]
    assert len(ReplayStore.restore(tmp_path / "snapshot-000003")) == 6  # a snapshot dir itself works too


def test_mmap_restore_uses_fresh_files(tmp_path):
    s = ReplayStore(SCHEMA, capacity=100, storage="mmap", path=tmp_path / "cols")
    keys = s.insert(rows(20))
    s.snapshot(tmp_path / "snaps")
    r = ReplayStore.restore(tmp_path / "snaps")
    assert r.path != s.path and Path(r.path).parent == Path(s.path).parent
    r.insert(rows(5, seed=9))
    assert len(s) == 20 and len(r) == 25
    assert_batches_equal(s.get(keys), r.get(keys))
    m = ReplayStore.restore(tmp_path / "snaps", storage="memory")
    assert m.path is None and len(m) == 20
    # mmap columns are real files that survive the process
    s.close()
    col = np.load(Path(s.path) / "obs.npy", mmap_mode="r")
    np.testing.assert_array_equal(col[:20], rows(20)["obs"])


def test_from_state_is_restore_without_the_files(tmp_path):
    """`ReplayStore.from_state` builds the store `restore` would from the (meta, arrays) `snapshot_state`
    gives: the same rows, priorities and sampler stream; the new store owns its columns."""
    s = reference_store()
    keys = s.insert(rows(50, seed=4))
    s.update_priorities(keys[:10], np.linspace(0.5, 5.0, 10))
    meta, arrays = s.snapshot_state()
    s.snapshot(tmp_path)
    restored, built = ReplayStore.restore(tmp_path), ReplayStore.from_state(meta, arrays)
    assert len(built) == len(restored) == len(s) == 350
    assert_batches_equal(built.get(keys), restored.get(keys))
    first, again = built.sample(32), restored.sample(32)  # the sampler's RNG came along
    assert_batches_equal(first.data, again.data)
    np.testing.assert_array_equal(first.keys, again.keys)
    np.testing.assert_array_equal(first.weights, again.weights)
    before = {name: np.array(a, copy=True) for name, a in arrays.items()}
    built.update_priorities(keys[:5], np.full(5, 9.0))  # writes to the new store leave the old one alone
    built.insert(rows(5, seed=8))
    _, now = s.snapshot_state()
    assert set(now) == set(before) and len(s) == 350
    for name in before:
        np.testing.assert_array_equal(now[name], before[name], err_msg=name)
    with pytest.raises(ReplayError, match="format"):
        ReplayStore.from_state({**meta, "format": -1}, arrays)
