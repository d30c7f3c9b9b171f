"""`RunStoreContract`: what the generation loop, `evo resume` and every reader rely on the run store for.

A generation becomes durable all at once or not at all, and whatever was written reads back
exactly (values, states, lineage), also after the store is closed and opened again. Subclass it
in a test file; the defaults build evo's SQLite `RunStore`:

    class TestRunStore(RunStoreContract):
        pass

Failures are injected where a real run meets them: a checkpoint write that fails part-way through
a commit (`inject_checkpoint_failure`, default: the disk "fills up" after N checkpoint files), and
a value the store cannot record, met inside the commit's transaction after some rows are written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from evo.checkpoint import load_state
from evo.runstore import EvaluatedMember, MemberRecord, RunStore
from evo.testing.compare import assert_same_state, state_differences

__all__ = ["RunStoreContract", "INJECTED"]

INJECTED = "injected: no space left on device (evo.testing.runstore_contract)"
_EXPERIMENT_TOML = 'name = "contract"\n'

# floats that a lossy encoding would change (repr round-trips them exactly; str/float32 would not)
_AWKWARD = [1 / 3, 0.1 + 0.2, 1e-300, -2.5e17, 5e-324]


def member_state(index: int, generation: int) -> dict[str, Any]:
    """A member state like an agent's: tensors of several dtypes, an array, JSON scalars, nesting."""
    g = torch.Generator().manual_seed(1000 * generation + index)
    return {"index": index, "weights": {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g).double()},
            "steps": torch.tensor([generation * 10 + index], dtype=torch.int64),
            "moments": np.arange(6, dtype=np.float32).reshape(2, 3) * (index + 1),
            "rng": f"state-{index}-{generation}", "flags": [True, None, _AWKWARD[index % len(_AWKWARD)]]}


def founders(indices: list[int]) -> list[tuple[MemberRecord, dict[str, Any]]]:
    return [(MemberRecord(i, None, 0, None, {"width": 16 + i, "blocks": [8, 8]}, {"lr": _AWKWARD[i % 5], "batch": 32}, []),
             member_state(i, 0)) for i in indices]


def evaluated(population: list[tuple[MemberRecord, dict[str, Any]]], generation: int) -> list[EvaluatedMember]:
    """Each member trained for `generation`: its fitness appended to its history, a new state."""
    out = []
    for pos, (rec, _) in enumerate(population):
        fitness = _AWKWARD[(pos + generation) % 5] * (pos + 1)
        record = MemberRecord(rec.index, rec.parent, rec.born, rec.mutation, dict(rec.arch), dict(rec.hparams),
                              [*rec.history, fitness])
        out.append(EvaluatedMember(record, fitness, fitness - 0.5, {"eval_return": fitness, "len": float(pos)},
                                   {"loss": 1 / (pos + 3)}, member_state(rec.index, generation + 100), wall_s=0.25 * pos))
    return out


def offspring(trained: list[EvaluatedMember], generation: int, first_index: int) -> list[tuple[MemberRecord, dict[str, Any]]]:
    """The next population: the best survives under its index, the others are replaced by mutated children."""
    best = max(trained, key=lambda e: e.score)
    out = [(best.record, member_state(best.record.index, generation + 1))]
    for k, parent in enumerate(e for e in trained if e is not best):
        mutation = {"kind": "rl_hp", "op": "hparams", "changes": {"lr": [parent.record.hparams["lr"], 0.5 ** (k + 2)]}}
        rec = MemberRecord(first_index + k, parent.record.index, generation + 1, mutation, dict(parent.record.arch),
                           {**parent.record.hparams, "lr": 0.5 ** (k + 2)}, [])
        out.append((rec, member_state(rec.index, generation + 1)))
    return out


class RunStoreContract:
    """The run store's contract; subclass it as `Test<Something>` to run it."""

    # ---- hooks --------------------------------------------------------------------------------
    def create_store(self, root: Path) -> RunStore:
        return RunStore.create(root, "contract", _EXPERIMENT_TOML, {"population": {"size": 3}})

    def reopen_store(self, store: RunStore) -> RunStore:
        """The same run opened afresh, as `evo resume` or a reader in another process opens it."""
        path = store.path
        store.close()
        return RunStore.open(path)

    def inject_checkpoint_failure(self, monkeypatch: Any, after: int) -> None:
        """Make checkpoint writes fail from the (`after`+1)-th on, as a full disk would."""
        import evo.runstore as module

        real, calls = module.save_state, [0]

        def failing(*args: Any, **kwargs: Any) -> str:
            calls[0] += 1
            if calls[0] > after:
                raise OSError(INJECTED)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, "save_state", failing)

    # ---- reading back -------------------------------------------------------------------------
    def check_population(self, store: RunStore, generation: int,
                         expected: list[tuple[MemberRecord, dict[str, Any]]]) -> None:
        got = store.load_population(generation)
        want = sorted(expected, key=lambda p: p[0].index)
        assert [r.index for r, _ in got] == [r.index for r, _ in want], (
            f"generation {generation} population: members {[r.index for r, _ in got]}, wrote {[r.index for r, _ in want]}")
        for (rec, state), (wrec, wstate) in zip(got, want):
            assert rec == wrec, f"generation {generation}, member {rec.index}: record {rec} read back, {wrec} written"
            assert_same_state(state, wstate, f"generation {generation}, member {rec.index}: start state")

    def check_evaluations(self, store: RunStore, generation: int, expected: list[EvaluatedMember]) -> None:
        rows = store.evaluations(generation)
        want = sorted(expected, key=lambda e: (-e.score, e.record.index))
        assert [r["index"] for r in rows] == [e.record.index for e in want], (
            f"generation {generation}: evaluations of {[r['index'] for r in rows]}, wrote {[e.record.index for e in want]}")
        for row, ev in zip(rows, want):
            rec = ev.record
            written = {"generation": generation, "fitness": ev.fitness, "score": ev.score, "history": rec.history,
                       "metrics": ev.metrics, "train_metrics": ev.train_metrics, "arch": rec.arch, "hparams": rec.hparams,
                       "parent": rec.parent, "born": rec.born, "mutation": rec.mutation, "wall_s": ev.wall_s}
            diffs = state_differences({k: row[k] for k in written}, written)
            assert not diffs, f"generation {generation}, member {rec.index}: read back differently: {diffs}"

    def readback(self, store: RunStore, generation: int) -> dict[str, Any]:
        """Everything a resume from `generation` reads, for before/after comparisons."""
        return {"last": store.last_completed_generation(), "evaluations": store.evaluations(generation),
                "next": store.load_population(generation + 1)}

    def committed_run(self, root: Path) -> tuple[RunStore, list[tuple[MemberRecord, dict[str, Any]]]]:
        """A store with generation 0 committed; returns it and generation 1's population."""
        store = self.create_store(root)
        population = founders([0, 1, 2])
        store.save_initial_population(population)
        trained = evaluated(population, 0)
        following = offspring(trained, 0, first_index=3)
        store.commit_generation(0, trained, following, wall_s=1.5)
        return store, following

    # ---- the contract -------------------------------------------------------------------------
    def test_a_new_run_has_no_completed_generation(self, tmp_path: Path) -> None:
        store = self.create_store(tmp_path)
        assert store.last_completed_generation() == -1 and store.evaluations() == []
        store.close()

    def test_the_initial_population_reads_back_exactly(self, tmp_path: Path) -> None:
        store = self.create_store(tmp_path)
        population = founders([0, 1, 2])
        store.save_initial_population(population)
        self.check_population(store, 0, population)
        assert store.last_completed_generation() == -1
        store.close()

    def test_a_committed_generation_reads_back_exactly(self, tmp_path: Path) -> None:
        store = self.create_store(tmp_path)
        population = founders([0, 1, 2])
        store.save_initial_population(population)
        trained = evaluated(population, 0)
        following = offspring(trained, 0, first_index=3)
        store.commit_generation(0, trained, following, wall_s=1.5)
        assert store.last_completed_generation() == 0
        self.check_evaluations(store, 0, trained)
        self.check_population(store, 1, following)
        best = max(trained, key=lambda e: e.score)
        row, path, digest = store.trained_checkpoint()
        assert row["index"] == best.record.index, f"the elite read back is member {row['index']}, not {best.record.index}"
        state, _ = load_state(path, expect_digest=digest)
        assert_same_state(state, best.state, "the elite's trained checkpoint")
        child = following[1][0]
        chain = [m["index"] for m in store.lineage(child.index)]
        assert chain == [child.index, child.parent], f"lineage of member {child.index}: {chain}"
        store.close()

    def test_a_reopened_run_reads_back_the_same(self, tmp_path: Path) -> None:
        store, following = self.committed_run(tmp_path)
        before = self.readback(store, 0)
        store = self.reopen_store(store)
        assert_same_state(self.readback(store, 0), before, "the run after closing and opening it again")
        self.check_population(store, 1, following)
        store.close()

    def test_a_commit_failing_while_writing_checkpoints_leaves_the_last_generation(self, tmp_path: Path,
                                                                                  monkeypatch: Any) -> None:
        store, following = self.committed_run(tmp_path)
        before = self.readback(store, 0)
        trained = evaluated(following, 1)
        self.inject_checkpoint_failure(monkeypatch, after=2)  # some of generation 1's files are written, then none
        try:
            store.commit_generation(1, trained, offspring(trained, 1, first_index=6), wall_s=2.0)
        except OSError as exc:
            assert INJECTED in str(exc), f"commit_generation failed, but not with the injected error: {exc!r}"
        else:
            raise AssertionError("commit_generation succeeded although checkpoint writes failed")
        monkeypatch.undo()
        self._check_untouched_then_retry(store, before, following)

    def test_a_commit_failing_inside_its_transaction_leaves_the_last_generation(self, tmp_path: Path) -> None:
        store, following = self.committed_run(tmp_path)
        before = self.readback(store, 0)
        trained = evaluated(following, 1)
        broken = [*trained]
        broken[-1] = EvaluatedMember(**{**vars(trained[-1]), "metrics": {"eval_return": object()}})
        try:
            store.commit_generation(1, broken, offspring(trained, 1, first_index=6), wall_s=2.0)
        except (TypeError, ValueError):
            pass
        else:
            raise AssertionError("commit_generation recorded a metric that is not a number")
        self._check_untouched_then_retry(store, before, following)

    def _check_untouched_then_retry(self, store: RunStore, before: dict[str, Any],
                                    following: list[tuple[MemberRecord, dict[str, Any]]]) -> None:
        store = self.reopen_store(store)
        assert store.last_completed_generation() == 0, "a failed commit must not complete its generation"
        assert store.evaluations(1) == [], "a failed commit must leave no evaluations behind"
        assert_same_state(self.readback(store, 0), before, "the last completed generation after a failed commit")
        trained = evaluated(following, 1)
        nxt = offspring(trained, 1, first_index=6)
        store.commit_generation(1, trained, nxt, wall_s=2.0)  # the resumed run commits cleanly
        assert store.last_completed_generation() == 1
        self.check_evaluations(store, 1, trained)
        self.check_population(store, 2, nxt)
        store.close()

    def test_a_generations_replay_snapshot_is_what_restore_loads(self, tmp_path: Path) -> None:
        from evo.replay import Field, ReplayStore, Schema

        schema = Schema({"obs": Field("float32", (3,)), "episode": Field("int64"), "step": Field("int64")})

        def rows(n: int, episode: int) -> dict[str, np.ndarray]:
            return {"obs": np.arange(3 * n, dtype=np.float32).reshape(n, 3) / 7 + episode,
                    "episode": np.full(n, episode, dtype=np.int64), "step": np.arange(n, dtype=np.int64)}

        store, _ = self.committed_run(tmp_path)
        replay = ReplayStore(schema, capacity=64, seed=0)
        keys = replay.insert(rows(5, 1))
        store.snapshot_replay(replay, 0)
        replay.insert(rows(7, 2))  # generation 1's rows: not part of generation 0's snapshot
        store = self.reopen_store(store)
        fresh = ReplayStore(schema, capacity=64, seed=1)
        assert store.restore_replay(fresh, 0), "restore_replay found no snapshot of generation 0"
        assert len(fresh) == 5 and bool(fresh.contains(keys).all())
        assert_same_state(fresh.get(keys), rows(5, 1), "rows restored from generation 0's snapshot")
        assert not store.restore_replay(fresh, 1), "restore_replay claims a snapshot of a generation that has none"
        store.close()
