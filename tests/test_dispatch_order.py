"""The dispatch hint of a sync generation (`expected_s`, docs/architecture.md): the generation loop
tells the scheduler how long each member's round is expected to take, from the run store, and a
parallel backend starts the longest first. What each backend does with it is in the scheduler
contract (evo/testing/scheduler_contract.py) and tests/contracts/test_schedulers.py."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from evo.population import evolve, expected_seconds, start_backend
from evo.runstore import RunStore
from evo.scheduler.base import dispatch_order
from evo.spec import load_experiment
from tests.conftest import TOY_EXPERIMENT


def test_dispatch_order_starts_unknown_then_longest_members() -> None:
    assert dispatch_order(None, 3) == [0, 1, 2]
    assert dispatch_order([1.0, 5.0, 0.0, 5.0], 4) == [1, 3, 0, 2]  # ties keep the input order
    assert dispatch_order([2.0, None, 9.0, None], 4) == [1, 3, 2, 0]  # unknown first: it may be the longest
    assert dispatch_order((), 0) == []
    for bad in ([1.0], [1.0, -0.5], [math.nan, 1.0], [math.inf, 1.0]):
        with pytest.raises(ValueError, match="expected_s"):
            dispatch_order(bad, 2)


def _row(index: int, wall_s: float, fitness: float = 1.0, rested: bool = False) -> dict:
    return {"index": index, "wall_s": wall_s, "fitness": fitness, "train_metrics": {"rested": 1.0} if rested else {}}


def test_a_member_is_expected_to_take_its_own_last_round_or_its_parents() -> None:
    board = [_row(0, 8.0), _row(1, 0.3, rested=True), _row(2, 3.0), _row(3, 5.0, fitness=-math.inf)]

    def member(index: int, parent: int | None) -> SimpleNamespace:
        return SimpleNamespace(index=index, record=SimpleNamespace(parent=parent))

    members = [member(0, None), member(1, None), member(4, 2), member(5, 3), member(6, 1), member(2, None)]
    assert expected_seconds(board, members, [10, 10, 10, 10, 10, 0]) == [
        8.0,   # trained in generation 0: its own round
        None,  # rested then, and no parent that trained: unknown
        3.0,   # a clone of member 2: its parent's round
        None,  # a clone of a member that failed: unknown
        None,  # a clone of the resting member: its round was an evaluation only
        0.0,   # given no steps: it only evaluates
    ]
    assert expected_seconds([], members[:2], [10, 10]) == [None, None]  # generation 0: no generation before


def test_the_loop_hints_each_generation_from_the_one_before(tmp_path: Path) -> None:
    """A real (toy, inline) run with a resting elite: generation 0 has no hint; later, each member's
    hint is its own or its parent's recorded seconds of the generation before, and the resting one's 0."""
    exp, text = load_experiment(TOY_EXPERIMENT, {"population.generations": 3, "selection.rest_elite": True})
    store = RunStore.create(tmp_path, "r", text, exp.to_json())
    scheduler, context = start_backend(exp, "inline")
    hints: list[dict[int, float | None]] = []
    run_generation = scheduler.run_generation

    def recording(agents: list, steps: list, *args, expected_s=None, **kwargs) -> list:
        hints.append(dict(zip([a.index for a in agents], expected_s)))
        return run_generation(agents, steps, *args, expected_s=expected_s, **kwargs)

    scheduler.run_generation = recording
    try:
        evolve(exp, store, scheduler, context)
        boards = [{row["index"]: row for row in store.evaluations(g)} for g in range(3)]
    finally:
        scheduler.close()
        store.close()

    def trained_s(row: dict | None) -> float | None:
        return None if row is None or row["train_metrics"].get("rested") else row["wall_s"]

    assert list(hints[0].values()) == [None] * exp.population.size
    rested = 0
    for g in (1, 2):
        assert set(hints[g]) == set(boards[g])
        for index, hint in hints[g].items():
            row = boards[g][index]
            if row["train_metrics"].get("rested"):
                rested += 1
                assert hint == 0.0
                continue
            own, parent = trained_s(boards[g - 1].get(index)), trained_s(boards[g - 1].get(row["parent"]))
            assert hint == (own if own is not None else parent), f"generation {g}, member {index}"
            assert hint is None or hint > 0
    assert rested == 2  # one a generation: the check saw the resting member's hint
