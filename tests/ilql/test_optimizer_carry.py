"""ILQL carries Adam's state through add_layer, remove_layer, widen_ff and activation swaps, at agent level.

Every surviving parameter's exp_avg, exp_avg_sq and step are exactly what they were; widened
feed-forward weights keep them on the old units (tests/optimizer_carry.py). A restarted optimizer
fails the same check.
"""

from __future__ import annotations

import numpy as np
import pytest

from agents.ilql.agent import ILQLAgent
from evo.agent import AgentContext
from evo.replay import build_replay
from tests.optimizer_carry import OptimizerSnapshot, clear_optimizer_state, zero_second_moments

ARCH = {"n_layer": 2, "n_embd": 32, "n_head": 2, "dim_feedfwd": 64, "min_layers": 1, "max_layers": 4}
OPS = ("add_layer", "remove_layer", "widen_ff")


@pytest.fixture(scope="module")
def trained() -> ILQLAgent:
    task = ILQLAgent.validate_task({"task": "randomwalks", "eval_samples": 1})
    ctx = AgentContext(task=task, replay=build_replay(ILQLAgent.replay_spec(task), 0, distributed=False), seed=0)
    agent = ILQLAgent.create(ILQLAgent.validate_arch(ARCH), {"batch_size": 16}, seed=1, index=0, context=ctx)
    agent.train(3)
    return agent


@pytest.fixture(scope="module")
def seed_of_op(trained) -> dict[str, int]:
    found: dict[str, int] = {}
    for seed in range(100):
        if all(op in found for op in OPS):
            break
        found.setdefault(trained.clone(1).mutate_architecture(np.random.default_rng(seed), 0.5).op, seed)
    return found


def _modules(agent: ILQLAgent) -> list:
    return list(agent.networks().values())  # everything the optimizer trains (target heads are not)


def _mutate_and_check(agent: ILQLAgent, seed: int) -> tuple[str, dict[str, int]]:
    child = agent.clone(1)
    before = OptimizerSnapshot.take(_modules(child), child.ilql.optimizer)
    record = child.mutate_architecture(np.random.default_rng(seed), 0.5)
    return record.op, before.assert_carried(_modules(child), child.ilql.optimizer)


@pytest.mark.parametrize("op", OPS)
def test_architecture_operation_carries_adam_state(op, trained, seed_of_op) -> None:
    assert op in seed_of_op, f"no rng seed in 0..99 drew {op}"
    done, counts = _mutate_and_check(trained, seed_of_op[op])
    assert done == op and counts["kept"] > 0 and counts["with_state"] > 0
    expected = {"add_layer": "added", "remove_layer": "removed", "widen_ff": "resized"}[op]
    assert counts[expected] > 0


def test_activation_swap_carries_adam_state(trained) -> None:
    child = trained.clone(1)
    before = OptimizerSnapshot.take(_modules(child), child.ilql.optimizer)
    child.set_activation("PReLU")
    counts = before.assert_carried(_modules(child), child.ilql.optimizer)
    assert counts["added"] > 0 and counts["kept"] > 0 and counts["with_state"] > 0


@pytest.mark.parametrize("mutant", [clear_optimizer_state, zero_second_moments])
def test_the_check_catches_a_restarted_optimizer(mutant, trained, seed_of_op, monkeypatch) -> None:
    mutate = ILQLAgent.mutate_architecture

    def broken(self, rng, new_layer_prob):
        record = mutate(self, rng, new_layer_prob)
        mutant(self)
        return record

    monkeypatch.setattr(ILQLAgent, "mutate_architecture", broken)
    with pytest.raises(AssertionError, match="^(kept|resized) "):
        _mutate_and_check(trained, seed_of_op["widen_ff"])
