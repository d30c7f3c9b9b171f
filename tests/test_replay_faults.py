"""A replay shard SIGKILLed during a real `evo run` (Ray, `[replay] shards = 2`) costs nothing: Ray
restarts the shard's process, which comes back to its generation-start checkpoint plus the boundary
writes it logged (docs/replay.md, "Restarts"); members' reads in flight are retried and return the same
rows. The run completes with the leaderboard and the replay store (rows, refcounts) of an unkilled run
of the same seed, and no member failed.

The chaos test kills member actors and replay shards at seeded random moments of one run (a member
killed is retried from its start state: docs/faults.md); the same holds.

Both are `slow`: each runs the tiny EfficientZero experiment twice on Ray (minutes on 2 cores). The
restart itself is also tested fast, on Ray (tests/replay/test_service.py) and in process
(tests/replay/test_restarts.py).
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.test_faults_ray import (
    EvoProcess,
    efficientzero,
    generations_done,
    session_pids,
    table,
    training_workers,
    wait_until,
)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")]


def replay_actors(driver: int) -> list[int]:
    """Live replay actor (shard) processes of the run started by `evo` process `driver`."""
    out = []
    for pid in session_pids(driver):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::_ReplayActor"):
                out.append(pid)
        except OSError:
            pass
    return sorted(out)


def sharded(directory: Path, generations: int = 2, steps: int = 64) -> Path:
    """The tiny EfficientZero run on Ray with `[replay] shards = 2`, `steps` env steps per member and generation."""
    path = efficientzero(directory, generations=generations)
    text = path.read_text()
    assert "steps_per_generation = 64" in text
    path.write_text(text.replace("steps_per_generation = 64", f"steps_per_generation = {steps}")
                    + "\n[replay]\nshards = 2\n")
    return path


def store_counts(run_dir: Path, generation: int) -> dict[str, Any]:
    """The sharded store as the run snapshotted it after `generation`: counters, rows and refcounts."""
    from evo.replay.sharded import ShardedReplay

    s = ShardedReplay.restore(run_dir / "replay" / f"g{generation:04d}", in_process=True)
    stats = {k: v for k, v in s.stats().items() if k != "samples"}  # reads of killed attempts count samples
    keys = np.sort(np.concatenate([np.asarray(b._store._index.slot_key[: b._store._written])[
        np.asarray(b._store._index.slot_pos[: b._store._written]) >= 0] for b in s._shards.bodies]))
    return {**stats, "keys": keys.tolist(), "refcounts": s.refcounts(keys).tolist(),
            "mass": round(s.view_basis().mass, 6)}


def failures(run_dir: Path) -> list[tuple]:
    """The run's recorded failed attempts (none: the run store has no failures table yet)."""
    import sqlite3

    with sqlite3.connect(run_dir / "run.sqlite") as db:
        if not db.execute("SELECT name FROM sqlite_master WHERE name = 'failures'").fetchall():
            return []
        return db.execute("SELECT generation, idx, attempt, kind, retried FROM failures "
                          "ORDER BY generation, idx, attempt").fetchall()


def kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def test_a_replay_shard_sigkilled_mid_generation_changes_nothing(tmp_path: Path) -> None:
    experiment = sharded(tmp_path)
    clean = EvoProcess(["run", experiment.name, "--name", "clean"], tmp_path, "clean.log")
    assert clean.wait(600) == 0, clean.tail()

    run = EvoProcess(["run", experiment.name, "--name", "killed"], tmp_path, "killed.log")
    run_dir = tmp_path / "runs" / "killed"
    # generation 1: the store holds generation 0's rows, members are training on their views of it
    wait_until(lambda: generations_done(run_dir) >= 1 and training_workers(run.pid), 400, "generation 1 training", run)
    shards = replay_actors(run.pid)
    assert len(shards) == 2, shards
    assert kill(shards[0])
    wait_until(lambda: len(set(replay_actors(run.pid)) - set(shards)) == 1, 120, "the shard restarted", run)
    assert generations_done(run_dir) == 1  # it died mid-generation, not after it
    assert run.wait(600) == 0, run.tail()
    assert failures(run_dir) == []  # no member noticed
    assert table(run_dir) == table(tmp_path / "runs" / "clean")
    assert store_counts(run_dir, 1) == store_counts(tmp_path / "runs" / "clean", 1)


def test_chaos_members_and_shards_killed_at_seeded_random_moments(tmp_path: Path) -> None:
    """Over a 3-generation run: at seeded random moments kill a training member actor or a replay
    shard (up to 4 kills, 2 of each in a seeded order, one of each first; at least those two), the
    kills landing wherever the run is (training, a member's reads, the boundary's writes); the run
    completes with a clean run's leaderboard, rows and refcounts."""
    experiment = sharded(tmp_path, generations=3, steps=512)  # generations long enough for 4 kills
    clean = EvoProcess(["run", experiment.name, "--name", "clean"], tmp_path, "clean.log")
    assert clean.wait(900) == 0, clean.tail()

    rng = random.Random(25)
    plan = [*rng.sample(["member", "shard"], 2), *rng.sample(["member", "shard"], 2)]  # one of each first
    run = EvoProcess(["run", experiment.name, "--name", "chaos"], tmp_path, "chaos.log")
    run_dir = tmp_path / "runs" / "chaos"
    done = []
    for what in plan:  # until the plan is done or the run is (an idle machine runs it in ~30 s)
        wait_until(lambda: training_workers(run.pid) or run.proc.poll() is not None, 400, "members training")
        time.sleep(rng.uniform(0.0, 1.5))  # a seeded random moment within the training
        if run.proc.poll() is not None:
            break
        victims = training_workers(run.pid) if what == "member" else replay_actors(run.pid)
        if victims and kill(rng.choice(victims)):
            done.append((what, generations_done(run_dir)))
            time.sleep(1.0)  # let Ray notice before the next victim is picked
    assert run.wait(900) == 0, run.tail()
    assert {w for w, _ in done} == {"member", "shard"}, done
    lost = [f for f in failures(run_dir) if f[3] == "lost"]
    assert lost and all(f[4] == 1 for f in lost), (failures(run_dir), done)  # killed members: retried
    assert table(run_dir) == table(tmp_path / "runs" / "clean")
    for g in range(3):
        assert store_counts(run_dir, g) == store_counts(tmp_path / "runs" / "clean", g), (g, done)
