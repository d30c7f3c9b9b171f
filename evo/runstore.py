"""The run store: the only writer of a run directory.

    runs/<name>/
      run.sqlite        members, lineage, evaluations, mutations, generations, status, experiment
      experiment.toml   the experiment file exactly as given
      checkpoints/gNNNN/{start,trained}/mNNNNN/   safetensors + JSON (evo.checkpoint)

A generation becomes durable in one SQLite transaction that records its evaluations *and* the
next population. Checkpoint files are written (atomically, each) before that transaction, so a
crash at any point leaves the last completed generation intact and resumable: files written by
an unfinished generation are simply written again. Everything a person sees — leaderboard,
lineage, export, resume — reads from here.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from evo.checkpoint import load_state, save_state
from evo.diversity import Diversity
from evo.faults import Failure
from evo.replay import snapshot as snap
from evo.replay.protocol import Replay

__all__ = ["RunStore", "RunStoreError", "MemberRecord", "EvaluatedMember", "DB_NAME"]

DB_NAME = "run.sqlite"

#: Crash-window fault injection for the crash-safety tests (tests/test_cli.py,
#: tests/efficientzero/test_crash_resume.py): with EVO_FAULT="WINDOW:G" the process SIGKILLs
#: itself in WINDOW of generation G:
#:   after_checkpoints       every checkpoint file of G is written, its SQLite transaction is not;
#:   after_commit            G is committed, the checkpoints it made obsolete are not yet pruned;
#:   during_replay_snapshot  one file of G's replay snapshot is written, its completion marker is not
#:                           (every backend: a Ray replay service's actors send their arrays and this
#:                           process writes the files).
FAULT_ENV = "EVO_FAULT"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS run (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS members (
    idx INTEGER PRIMARY KEY, parent INTEGER, born INTEGER NOT NULL, mutation TEXT);
CREATE TABLE IF NOT EXISTS population (
    generation INTEGER NOT NULL, idx INTEGER NOT NULL, checkpoint TEXT, digest TEXT,
    history TEXT NOT NULL, arch TEXT NOT NULL, hparams TEXT NOT NULL,
    PRIMARY KEY (generation, idx));
CREATE TABLE IF NOT EXISTS evaluations (
    generation INTEGER NOT NULL, idx INTEGER NOT NULL, fitness REAL NOT NULL, score REAL NOT NULL,
    history TEXT NOT NULL, metrics TEXT NOT NULL, train_metrics TEXT NOT NULL,
    checkpoint TEXT, digest TEXT, arch TEXT NOT NULL, hparams TEXT NOT NULL, wall_s REAL,
    PRIMARY KEY (generation, idx));
CREATE TABLE IF NOT EXISTS mutations (
    child INTEGER PRIMARY KEY, parent INTEGER NOT NULL, generation INTEGER NOT NULL,
    kind TEXT NOT NULL, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS generations (
    generation INTEGER PRIMARY KEY, completed_at REAL NOT NULL, best_idx INTEGER NOT NULL,
    best_score REAL NOT NULL, wall_s REAL NOT NULL);
"""

# one row per generation: how many trained members were distinct networks (evo.diversity); runs
# made before this table existed get it on their next commit and read as "not measured" until then
_DIVERSITY_SCHEMA = """
CREATE TABLE IF NOT EXISTS diversity (
    generation INTEGER PRIMARY KEY, members INTEGER NOT NULL, distinct_members INTEGER NOT NULL,
    mean_distance REAL, identical TEXT NOT NULL, digests TEXT NOT NULL);
"""


# one row per evaluation: the member's cumulative compute along its line after that round
# (evo.compute); runs from before it read as "not measured"
_COMPUTE_SCHEMA = """
CREATE TABLE IF NOT EXISTS compute (
    generation INTEGER NOT NULL, idx INTEGER NOT NULL, env_steps REAL NOT NULL, updates REAL NOT NULL,
    member_s REAL NOT NULL, PRIMARY KEY (generation, idx));
"""

# asynchronous runs (population.mode = "async"): what each slot trains next, committed with every
# member's round, so a resume restarts exactly the rounds that were in flight
_SLOTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS async_slots (slot INTEGER PRIMARY KEY, idx INTEGER NOT NULL, round INTEGER NOT NULL);
"""


class RunStoreError(RuntimeError):
    """A run directory that is missing, already exists, or is not an evo run."""


@dataclass
class MemberRecord:
    """A member as the store knows it: identity, lineage and fitness history."""

    index: int
    parent: int | None
    born: int
    mutation: dict[str, Any] | None
    arch: dict[str, Any]
    hparams: dict[str, Any]
    history: list[float] = field(default_factory=list)


@dataclass
class EvaluatedMember:
    record: MemberRecord
    fitness: float
    score: float
    metrics: dict[str, float]
    train_metrics: dict[str, float]
    state: dict[str, Any]
    wall_s: float = 0.0
    compute: Any = None  # evo.compute.Compute: the member's line's cumulative compute after this round


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=_json_default)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


# one row per failed attempt of a member (evo.faults.Failure); created on first use
_FAILURES_SCHEMA = """
CREATE TABLE IF NOT EXISTS failures (
    generation INTEGER NOT NULL, idx INTEGER NOT NULL, attempt INTEGER NOT NULL, kind TEXT NOT NULL,
    message TEXT NOT NULL, retried INTEGER NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (generation, idx, attempt));
"""


class RunStore:
    def __init__(self, path: Path, read_only: bool = False) -> None:
        """`read_only`: open the database with SQLite's mode=ro, for readers (the dashboard) that
        must never write nor block a running `evo run`; WAL lets them read while it commits."""
        # absolute: the run directory is named to Ray-side code (checkpoints) by path
        self.path = Path(path).resolve()
        self.read_only = read_only
        if read_only:
            self._db = sqlite3.connect(f"{(self.path / DB_NAME).as_uri()}?mode=ro", uri=True, isolation_level=None,
                                       timeout=30)
        else:
            self._db = sqlite3.connect(self.path / DB_NAME, isolation_level=None, timeout=30)
        self._db.row_factory = sqlite3.Row
        if not read_only:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")

    # ---- opening ----------------------------------------------------------------------------
    @classmethod
    def create(cls, runs_dir: str | Path, name: str, experiment_text: str, experiment: dict[str, Any],
               source: str = "") -> RunStore:
        path = Path(runs_dir) / name
        if path.exists():
            raise RunStoreError(f"{path}: a run with this name exists; use `evo resume {name}` or pick another --name")
        tmp = Path(runs_dir) / f".{name}.creating"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "experiment.toml").write_text(experiment_text)
        db = sqlite3.connect(tmp / DB_NAME)
        db.executescript(_SCHEMA)
        db.executescript(_DIVERSITY_SCHEMA)
        now = time.time()
        rows = {"name": name, "status": "created", "experiment_toml": experiment_text, "source": source,
                "experiment": _dumps(experiment), "created_at": repr(now), "updated_at": repr(now), "schema": "1"}
        db.executemany("INSERT INTO run VALUES (?, ?)", rows.items())
        db.commit()
        db.close()
        tmp.rename(path)  # the run appears whole or not at all
        return cls(path)

    @classmethod
    def open(cls, run: str | Path, runs_dir: str | Path = "runs", read_only: bool = False) -> RunStore:
        path = Path(run)
        if not (path / DB_NAME).is_file():
            path = Path(runs_dir) / str(run)
        if not (path / DB_NAME).is_file():
            raise RunStoreError(f"no run {str(run)!r}: neither {run} nor {Path(runs_dir) / str(run)} holds {DB_NAME}")
        return cls(path, read_only=read_only)

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # ---- run-level facts ----------------------------------------------------------------------
    def get(self, key: str, default: str | None = None) -> str | None:
        row = self._db.execute("SELECT value FROM run WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set(self, **values: Any) -> None:
        with self._transaction() as db:
            for key, value in {**values, "updated_at": repr(time.time())}.items():
                db.execute("INSERT OR REPLACE INTO run VALUES (?, ?)", (key, str(value)))

    @property
    def name(self) -> str:
        return self.get("name") or self.path.name

    @property
    def status(self) -> str:
        return self.get("status") or "unknown"

    def experiment(self) -> dict[str, Any]:
        return json.loads(self.get("experiment") or "{}")

    # ---- writing generations ----------------------------------------------------------------
    def _write_checkpoint(self, generation: int, phase: str, index: int, state: dict[str, Any]) -> tuple[str, str]:
        rel = f"checkpoints/g{generation:04d}/{phase}/m{index:05d}"
        digest = save_state(self.path / rel, state, meta={"generation": generation, "phase": phase, "index": index})
        return rel, digest

    def _insert_population(self, db: sqlite3.Connection, generation: int,
                           rows: list[tuple[MemberRecord, str, str]]) -> None:
        for rec, rel, digest in rows:
            db.execute("INSERT OR IGNORE INTO members VALUES (?, ?, ?, ?)",
                       (rec.index, rec.parent, rec.born, _dumps(rec.mutation) if rec.mutation is not None else None))
            if rec.parent is not None and rec.mutation is not None:
                db.execute("INSERT OR IGNORE INTO mutations VALUES (?, ?, ?, ?, ?)",
                           (rec.index, rec.parent, rec.born, rec.mutation.get("kind", "?"), _dumps(rec.mutation)))
            db.execute("INSERT OR REPLACE INTO population VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (generation, rec.index, rel, digest, _dumps(rec.history), _dumps(rec.arch), _dumps(rec.hparams)))

    def save_initial_population(self, members: list[tuple[MemberRecord, dict[str, Any]]]) -> None:
        written = [(rec, *self._write_checkpoint(0, "start", rec.index, state)) for rec, state in members]
        with self._transaction() as db:
            self._insert_population(db, 0, written)
            db.execute("INSERT OR REPLACE INTO run VALUES ('status', 'running')")

    def commit_generation(self, generation: int, evaluated: list[EvaluatedMember],
                          next_population: list[tuple[MemberRecord, dict[str, Any]]], wall_s: float,
                          diversity: Diversity | None = None, spent: Any = None) -> None:
        """Make generation `generation` durable: its evaluations (and their `diversity` and compute)
        and the population of the next one; `spent`: what the run has spent in all (evo.compute.Compute)."""
        trained = [(ev, *self._write_checkpoint(generation, "trained", ev.record.index, ev.state)) for ev in evaluated]
        starts = [(rec, *self._write_checkpoint(generation + 1, "start", rec.index, state)) for rec, state in next_population]
        best = max(trained, key=lambda t: (t[0].score, -t[0].record.index))[0]
        _crash_if("after_checkpoints", generation)
        with self._transaction() as db:
            for ev, rel, digest in trained:
                r = ev.record
                db.execute("INSERT INTO evaluations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (generation, r.index, ev.fitness, ev.score, _dumps(r.history), _dumps(ev.metrics),
                            _dumps(ev.train_metrics), rel, digest, _dumps(r.arch), _dumps(r.hparams), ev.wall_s))
                self._insert_compute(db, generation, ev)
            if spent is not None:
                db.execute("INSERT OR REPLACE INTO run VALUES ('spent', ?)", (_dumps(spent.to_json()),))
            self._insert_population(db, generation + 1, starts)
            if diversity is not None:
                self._insert_diversity(db, generation, diversity)
            db.execute("INSERT INTO generations VALUES (?, ?, ?, ?, ?)",
                       (generation, time.time(), best.record.index, best.score, wall_s))
            db.execute("INSERT OR REPLACE INTO run VALUES ('generations_done', ?)", (str(generation + 1),))
            db.execute("INSERT OR REPLACE INTO run VALUES ('updated_at', ?)", (repr(time.time()),))
        _crash_if("after_commit", generation)
        self._prune(generation)

    # ---- compute (evo.compute) -------------------------------------------------------------------
    @staticmethod
    def _insert_compute(db: sqlite3.Connection, generation: int, ev: EvaluatedMember) -> None:
        if ev.compute is None:
            return
        db.execute(_COMPUTE_SCHEMA)  # runs created before the table existed
        c = ev.compute
        db.execute("INSERT OR REPLACE INTO compute VALUES (?, ?, ?, ?, ?)",
                   (generation, ev.record.index, c.env_steps, c.updates, c.member_s))

    def _has_table(self, name: str) -> bool:
        return self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None

    def compute(self) -> dict[tuple[int, int], Any]:
        """Every measured evaluation's cumulative line compute, by (generation, member)."""
        from evo.compute import Compute

        if not self._has_table("compute"):
            return {}
        return {(r["generation"], r["idx"]): Compute(r["env_steps"], r["updates"], r["member_s"])
                for r in self._db.execute("SELECT * FROM compute")}

    def spent(self) -> Any:
        """What the run has spent in all (evo.compute.Compute; zero for runs from before the measurement)."""
        from evo.compute import Compute

        data = json.loads(self.get("spent") or "{}")
        return Compute(**{k: float(v) for k, v in data.items()})

    # ---- asynchronous runs -------------------------------------------------------------------------
    def save_initial_slots(self, members: list[tuple[MemberRecord, dict[str, Any]]]) -> None:
        """An async run's founders: generation 0's start states, slot i holding founder i."""
        written = [(rec, *self._write_checkpoint(0, "start", rec.index, state)) for rec, state in members]
        with self._transaction() as db:
            db.execute(_SLOTS_SCHEMA)
            self._insert_population(db, 0, written)
            for slot, (rec, _) in enumerate(members):
                db.execute("INSERT OR REPLACE INTO async_slots VALUES (?, ?, ?)", (slot, rec.index, 0))
            db.execute("INSERT OR REPLACE INTO run VALUES ('status', 'running')")

    def commit_round(self, slot: int, ev: EvaluatedMember | None, round_: int,
                     successor: tuple[MemberRecord, int, dict[str, Any]], spent: Any, rounds_done: int,
                     failures: list[Failure] | None = None) -> None:
        """Make one member's round durable in one transaction (async runs): its evaluation at
        generation `round_` (None: it failed; its `failures`), and what `slot` trains next
        (`successor`: record, the round it starts, its start state)."""
        trained = None if ev is None else self._write_checkpoint(round_, "trained", ev.record.index, ev.state)
        rec, start_round, state = successor
        start = self._write_checkpoint(start_round, "start", rec.index, state)
        _crash_if("after_checkpoints", rounds_done)
        with self._transaction() as db:
            db.execute(_SLOTS_SCHEMA)
            if ev is not None and trained is not None:
                r = ev.record
                db.execute("INSERT OR REPLACE INTO evaluations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (round_, r.index, ev.fitness, ev.score, _dumps(r.history), _dumps(ev.metrics),
                            _dumps(ev.train_metrics), *trained, _dumps(r.arch), _dumps(r.hparams), ev.wall_s))
                self._insert_compute(db, round_, ev)
            if failures:
                db.execute(_FAILURES_SCHEMA)
                for f in failures:
                    db.execute("INSERT OR REPLACE INTO failures VALUES (?, ?, ?, ?, ?, ?, ?)",
                               (f.generation, f.index, f.attempt, f.kind, f.message, int(f.retried), time.time()))
            self._insert_population(db, start_round, [(rec, *start)])
            db.execute("INSERT OR REPLACE INTO async_slots VALUES (?, ?, ?)", (slot, rec.index, start_round))
            db.execute("INSERT OR REPLACE INTO run VALUES ('spent', ?)", (_dumps(spent.to_json()),))
            db.execute("INSERT OR REPLACE INTO run VALUES ('rounds_done', ?)", (str(rounds_done),))
            db.execute("INSERT OR REPLACE INTO run VALUES ('updated_at', ?)", (repr(time.time()),))
        _crash_if("after_commit", rounds_done)

    def complete_generation(self, generation: int, wall_s: float, diversity: Diversity | None = None) -> bool:
        """Mark `generation` complete in an async run (every slot has passed that round); False if
        no member was evaluated at it (nothing to mark)."""
        rows = self.evaluations(generation)
        if not rows:
            return False
        with self._transaction() as db:
            if diversity is not None:
                self._insert_diversity(db, generation, diversity)
            db.execute("INSERT OR REPLACE INTO generations VALUES (?, ?, ?, ?, ?)",
                       (generation, time.time(), rows[0]["index"], rows[0]["score"], wall_s))
            db.execute("INSERT OR REPLACE INTO run VALUES ('generations_done', ?)", (str(generation + 1),))
        return True

    def slots(self) -> list[tuple[int, int, int]]:
        """An async run's slots: (slot, member index, the round it trains next)."""
        if not self._has_table("async_slots"):
            return []
        return [(r["slot"], r["idx"], r["round"]) for r in self._db.execute("SELECT * FROM async_slots ORDER BY slot")]

    def load_start(self, generation: int, index: int) -> tuple[MemberRecord, dict[str, Any]]:
        """One member's start state of `generation` (an async slot's pending round)."""
        for rec, rel, digest in self.population(generation):
            if rec.index == index:
                if rel is None:
                    raise RunStoreError(f"{self.path}: generation {generation} start checkpoint of member {index} was pruned")
                state, _ = load_state(self.path / rel, expect_digest=digest)
                return rec, state
        raise RunStoreError(f"{self.path}: no start state of member {index} in generation {generation}")

    def prune_async(self) -> None:
        """An async run's obsolete checkpoints: start states no slot waits on, and trained states that
        are neither a completed generation's best, nor a member's latest, nor the run's best."""
        pending = {(r, i) for _, i, r in self.slots()}
        keep_best = {(r["generation"], r["best_idx"]) for r in self._db.execute("SELECT generation, best_idx FROM generations")}
        latest = {(r[0], r[1]) for r in self._db.execute("SELECT MAX(generation), idx FROM evaluations GROUP BY idx")}
        try:  # and the run's best state (what `evo export --best` writes; an async run's selection.champion)
            best, _, _ = self.trained_checkpoint(best=True)
            keep_best.add((best["generation"], best["index"]))
        except RunStoreError:  # no trained state kept yet
            pass
        with self._transaction() as db:
            starts = [r for r in db.execute("SELECT generation, idx, checkpoint FROM population "
                                            "WHERE checkpoint IS NOT NULL").fetchall()
                      if (r["generation"], r["idx"]) not in pending]
            trained = [r for r in db.execute("SELECT generation, idx, checkpoint FROM evaluations "
                                             "WHERE checkpoint IS NOT NULL").fetchall()
                       if (r["generation"], r["idx"]) not in keep_best | latest]
            for r in starts:
                db.execute("UPDATE population SET checkpoint = NULL WHERE generation = ? AND idx = ?",
                           (r["generation"], r["idx"]))
            for r in trained:
                db.execute("UPDATE evaluations SET checkpoint = NULL WHERE generation = ? AND idx = ?",
                           (r["generation"], r["idx"]))
        for r in [*starts, *trained]:
            shutil.rmtree(self.path / r["checkpoint"], ignore_errors=True)

    # ---- diversity ------------------------------------------------------------------------------
    @staticmethod
    def _insert_diversity(db: sqlite3.Connection, generation: int, d: Diversity) -> None:
        db.execute(_DIVERSITY_SCHEMA)  # runs created before the table existed
        mean = None if math.isnan(d.mean_distance) else d.mean_distance
        db.execute("INSERT OR REPLACE INTO diversity VALUES (?, ?, ?, ?, ?, ?)",
                   (generation, d.members, d.distinct, mean, _dumps(d.identical),
                    _dumps({str(k): v for k, v in d.digests.items()})))

    def diversity(self, generation: int | None = None) -> Diversity | None:
        """What `evo.diversity` measured on `generation`'s trained members (default: the last
        completed one); None if it was not measured (runs from before the measurement)."""
        if generation is None:
            generation = self.last_completed_generation()
        return self.diversity_history().get(generation)

    def diversity_history(self) -> dict[int, Diversity]:
        """Every measured generation's diversity, by generation."""
        present = self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'diversity'").fetchone()
        if present is None:
            return {}
        out = {}
        for r in self._db.execute("SELECT * FROM diversity ORDER BY generation"):
            out[r["generation"]] = Diversity(
                members=r["members"], distinct=r["distinct_members"],
                mean_distance=math.nan if r["mean_distance"] is None else r["mean_distance"],
                identical=json.loads(r["identical"]), digests={int(k): v for k, v in json.loads(r["digests"]).items()})
        return out

    # ---- the shared replay store -------------------------------------------------------------
    def snapshot_replay(self, replay: Replay, generation: int) -> None:
        """Snapshot the run's shared replay store as of the end of `generation` (before it commits).

        The snapshot for generation g is what a resume from g loads, so the data matches the
        population it resumes. The files are written here, in the driver's run directory, for
        every backend: a Ray replay service (one actor or N shards) returns its arrays through
        Ray's object store and never writes a path of its own (docs/replay.md, "Snapshots").
        """
        with _crash_mid_snapshot_if("during_replay_snapshot", generation):
            replay.snapshot(self.path / "replay" / f"g{generation:04d}", keep=1)

    def restore_replay(self, replay: Replay, generation: int) -> bool:
        """Load the replay snapshot of `generation` into `replay` in place (read here and sent to a
        Ray service's actors); False if there is none."""
        directory = self.path / "replay" / f"g{generation:04d}"
        if not directory.is_dir():
            return False
        replay.load_snapshot(directory)
        return True

    def save_lines(self, generation: int, lines: dict[int, Any]) -> None:
        """Write the line stores the members of generation `generation + 1` start from (`replay.own_rows
        = "line"`), one snapshot per member under lines/g<generation>/; what `load_lines(generation)`
        reads on resume. Those of generations before `generation - 1` go: a crash before this
        generation commits resumes from the one before it."""
        root = self.path / "lines"
        directory = root / f"g{generation:04d}"
        directory.mkdir(parents=True, exist_ok=True)
        for index, (meta, arrays) in sorted(lines.items()):
            snap.write_snapshot(directory / f"m{index:06d}", meta, arrays, keep=1)
        (directory / "COMPLETE").write_text(json.dumps(sorted(int(i) for i in lines)))
        for old in root.glob("g*"):
            if old.name[1:].isdigit() and int(old.name[1:]) < generation - 1:
                shutil.rmtree(old, ignore_errors=True)

    def load_lines(self, generation: int) -> dict[int, Any]:
        """The line stores `save_lines(generation)` wrote, by member index; {} if it wrote none (or
        did not finish: members then start from empty line stores)."""
        directory = self.path / "lines" / f"g{generation:04d}"
        marker = directory / "COMPLETE"
        if not marker.is_file():
            return {}
        out = {}
        for index in json.loads(marker.read_text()):
            _, meta, arrays = snap.read_snapshot(directory / f"m{index:06d}")
            out[int(index)] = (meta, arrays)
        return out

    # ---- failures (docs/faults.md) --------------------------------------------------------------
    def record_failures(self, failures: list[Failure]) -> None:
        """Record failed attempts (lost workers, divergences, errors, timeouts), retried or not.
        Idempotent per (generation, member, attempt): a generation redone after a crash overwrites."""
        with self._transaction() as db:
            db.execute(_FAILURES_SCHEMA)  # created on first use: runs from before it read as "no failures"
            for f in failures:
                db.execute("INSERT OR REPLACE INTO failures VALUES (?, ?, ?, ?, ?, ?, ?)",
                           (f.generation, f.index, f.attempt, f.kind, f.message, int(f.retried), time.time()))

    def failures(self, generation: int | None = None) -> list[Failure]:
        """Failed attempts, oldest first (of one `generation`, or all)."""
        present = self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'failures'").fetchone()
        if present is None:
            return []
        where, args = ("WHERE generation = ?", (generation,)) if generation is not None else ("", ())
        rows = self._db.execute(f"SELECT * FROM failures {where} ORDER BY generation, idx, attempt", args).fetchall()
        return [Failure(r["idx"], r["kind"], r["message"], r["attempt"], r["generation"], bool(r["retried"])) for r in rows]

    def _prune(self, generation: int) -> None:
        """Drop checkpoints no longer needed: older start states, and trained states that were not a generation's best."""
        keep_best = {(r["generation"], r["best_idx"]) for r in self._db.execute("SELECT generation, best_idx FROM generations")}
        with self._transaction() as db:
            old = db.execute("SELECT generation, idx, checkpoint FROM evaluations "
                             "WHERE generation < ? AND checkpoint IS NOT NULL", (generation,)).fetchall()
            doomed = [r for r in old if (r["generation"], r["idx"]) not in keep_best]
            for r in doomed:
                db.execute("UPDATE evaluations SET checkpoint = NULL WHERE generation = ? AND idx = ?",
                           (r["generation"], r["idx"]))
            starts = db.execute("SELECT generation, idx, checkpoint FROM population "
                                "WHERE generation <= ? AND checkpoint IS NOT NULL", (generation,)).fetchall()
            for r in starts:
                db.execute("UPDATE population SET checkpoint = NULL WHERE generation = ? AND idx = ?",
                           (r["generation"], r["idx"]))
        for r in [*doomed, *starts]:
            shutil.rmtree(self.path / r["checkpoint"], ignore_errors=True)

    # ---- reading -----------------------------------------------------------------------------
    def last_completed_generation(self) -> int:
        row = self._db.execute("SELECT MAX(generation) FROM generations").fetchone()
        return -1 if row[0] is None else int(row[0])

    def population(self, generation: int) -> list[tuple[MemberRecord, str | None, str | None]]:
        rows = self._db.execute(
            "SELECT p.*, m.parent, m.born, m.mutation FROM population p JOIN members m ON m.idx = p.idx "
            "WHERE p.generation = ? ORDER BY p.idx", (generation,)).fetchall()
        return [(MemberRecord(r["idx"], r["parent"], r["born"], json.loads(r["mutation"]) if r["mutation"] else None,
                              json.loads(r["arch"]), json.loads(r["hparams"]), json.loads(r["history"])),
                 r["checkpoint"], r["digest"]) for r in rows]

    def load_population(self, generation: int) -> list[tuple[MemberRecord, dict[str, Any]]]:
        out = []
        for rec, rel, digest in self.population(generation):
            if rel is None:
                raise RunStoreError(f"{self.path}: generation {generation} start checkpoint of member {rec.index} was pruned")
            state, _ = load_state(self.path / rel, expect_digest=digest)
            out.append((rec, state))
        return out

    def evaluations(self, generation: int | None = None) -> list[dict[str, Any]]:
        if generation is None:
            generation = self.last_completed_generation()
        rows = self._db.execute(
            "SELECT e.*, m.parent, m.born, m.mutation FROM evaluations e JOIN members m ON m.idx = e.idx "
            "WHERE e.generation = ? ORDER BY e.score DESC, e.idx ASC", (generation,)).fetchall()
        return [_evaluation_row(r) for r in rows]

    def member(self, index: int) -> dict[str, Any] | None:
        r = self._db.execute("SELECT * FROM members WHERE idx = ?", (index,)).fetchone()
        if r is None:
            return None
        return {"index": r["idx"], "parent": r["parent"], "born": r["born"],
                "mutation": json.loads(r["mutation"]) if r["mutation"] else None}

    def lineage(self, index: int) -> list[dict[str, Any]]:
        """The member and its ancestors, newest first, each with the mutation that made it."""
        chain, seen = [], set()
        current: int | None = index
        while current is not None and current not in seen:
            seen.add(current)
            m = self.member(current)
            if m is None:
                if not chain:
                    raise RunStoreError(f"{self.path}: no member {index} in this run")
                break
            best = self._db.execute("SELECT MAX(score) FROM evaluations WHERE idx = ?", (current,)).fetchone()[0]
            m["best_score"] = best
            chain.append(m)
            current = m["parent"]
        return chain

    def trained_checkpoint(self, index: int | None = None, generation: int | None = None,
                           best: bool = False) -> tuple[dict[str, Any], Path, str]:
        """A kept trained checkpoint: by default the newest of `index` (default: the elite of the
        last generation); `generation` asks for that generation's; `best` for the highest score over
        the whole run (of `index`, or of any member; ties go to the later generation, then the higher
        index), which is what to export when a run's last generation is worse than an earlier one."""
        if best and generation is not None:
            raise ValueError("give a generation or ask for the best checkpoint, not both")
        if index is None and not best:
            board = self.evaluations(generation)
            if not board:
                raise RunStoreError(f"{self.path}: no completed generation yet, nothing to export" if generation is None
                                    else f"{self.path}: generation {generation} has no evaluations")
            index = board[0]["index"]
        where, args = ["e.checkpoint IS NOT NULL"], []
        if index is not None:
            where.append("e.idx = ?")
            args.append(index)
        if generation is not None:
            where.append("e.generation = ?")
            args.append(generation)
        order = "e.score DESC, e.generation DESC, e.idx DESC" if best else "e.generation DESC"
        r = self._db.execute(
            "SELECT e.*, m.parent, m.born, m.mutation FROM evaluations e JOIN members m ON m.idx = e.idx "
            f"WHERE {' AND '.join(where)} ORDER BY {order} LIMIT 1", args).fetchone()
        if r is None:
            if index is None:
                raise RunStoreError(f"{self.path}: no completed generation yet, nothing to export")
            kept = "only each generation's best and the last generation are kept"
            if self.member(index) is None:
                why = "no such member"
            elif generation is not None:
                why = f"no kept checkpoint of generation {generation} ({kept})"
            else:
                why = f"its checkpoints were pruned ({kept})"
            raise RunStoreError(f"{self.path}: member {index}: {why}")
        return _evaluation_row(r), self.path / r["checkpoint"], r["digest"]

    def summary(self) -> dict[str, Any]:
        best = self._db.execute("SELECT MAX(score) FROM evaluations WHERE generation = ?",
                                (self.last_completed_generation(),)).fetchone()[0]
        exp = self.experiment()
        return {"name": self.name, "status": self.status, "generations_done": self.last_completed_generation() + 1,
                "generations": exp.get("population", {}).get("generations"), "best_score": best,
                "agent": exp.get("agent", {}).get("kind"), "updated_at": float(self.get("updated_at") or 0),
                "created_at": float(self.get("created_at") or 0),
                "diversity": self.diversity(),
                # {"generation", "member", "score", "target"} once population.stop_at_score ended the run, else None
                "stopped_at_score": json.loads(self.get("stopped_at_score") or "null")}

    # ---- reading whole tables (the dashboard's views) ------------------------------------------
    def all_evaluations(self) -> list[dict[str, Any]]:
        """Every evaluation of the run, by generation, best score first within one."""
        rows = self._db.execute(
            "SELECT e.*, m.parent, m.born, m.mutation FROM evaluations e JOIN members m ON m.idx = e.idx "
            "ORDER BY e.generation, e.score DESC, e.idx").fetchall()
        return [_evaluation_row(r) for r in rows]

    def all_members(self) -> list[dict[str, Any]]:
        """Every member ever created (founders and children), by index."""
        return [{"index": r["idx"], "parent": r["parent"], "born": r["born"],
                 "mutation": json.loads(r["mutation"]) if r["mutation"] else None}
                for r in self._db.execute("SELECT * FROM members ORDER BY idx")]

    def all_generations(self) -> list[dict[str, Any]]:
        """Completed generations: when, the best member and score, and wall time."""
        return [{"generation": r["generation"], "completed_at": r["completed_at"], "best_index": r["best_idx"],
                 "best_score": r["best_score"], "wall_s": r["wall_s"]}
                for r in self._db.execute("SELECT * FROM generations ORDER BY generation")]

    @staticmethod
    def list_runs(runs_dir: str | Path, read_only: bool = False) -> list[dict[str, Any]]:
        out = []
        root = Path(runs_dir)
        if not root.is_dir():
            return out
        for path in sorted(root.iterdir()):
            if (path / DB_NAME).is_file() and not path.name.startswith("."):
                store = RunStore(path, read_only=read_only)
                try:
                    out.append(store.summary())
                finally:
                    store.close()
        return out


def _crash_if(window: str, generation: int) -> None:
    """SIGKILL this process if EVO_FAULT names this window of this generation (see FAULT_ENV)."""
    if os.environ.get(FAULT_ENV) == f"{window}:{generation}":
        os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def _crash_mid_snapshot_if(window: str, generation: int) -> Iterator[None]:
    """Inside the block, SIGKILL this process once the replay snapshot writer has written a file."""
    if os.environ.get(FAULT_ENV) != f"{window}:{generation}":
        yield
        return
    from evo.replay import snapshot

    write = snapshot._write_array

    def write_then_die(path: str, array: np.ndarray) -> None:
        write(path, array)
        _crash_if(window, generation)

    snapshot._write_array = write_then_die
    try:
        yield
    finally:
        snapshot._write_array = write


def _evaluation_row(r: sqlite3.Row) -> dict[str, Any]:
    history = json.loads(r["history"])
    return {
        "generation": r["generation"], "index": r["idx"], "fitness": r["fitness"], "score": r["score"],
        "history": history, "metrics": json.loads(r["metrics"]), "train_metrics": json.loads(r["train_metrics"]),
        "arch": json.loads(r["arch"]), "hparams": json.loads(r["hparams"]), "parent": r["parent"], "born": r["born"],
        "mutation": json.loads(r["mutation"]) if r["mutation"] else None, "checkpoint": r["checkpoint"],
        "digest": r["digest"], "wall_s": r["wall_s"],
    }

