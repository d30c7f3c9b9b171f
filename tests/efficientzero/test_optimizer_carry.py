"""EfficientZero carries Adam's state through every architecture operation, at agent level.

After each operation, every surviving parameter's exp_avg, exp_avg_sq and step are exactly what
they were, and a resized one keeps them on its overlap with the old tensor (tests/optimizer_carry.py).
Rebuilding the optimizer after a mutation (AgileRL's way), or restarting only the second moments,
fails the same check (the mutant tests below). Growth also keeps what the model computes: adding a
block bit for bit, widening within 1e-6 (float32 sums of different length; docs/efficientzero.md).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.efficientzero import EfficientZeroAgent
from agents.efficientzero.envs import TINY_IMAGE_ID
from evo.agent import AgentContext
from evo.replay import build_replay
from tests.optimizer_carry import OptimizerSnapshot, clear_optimizer_state, zero_second_moments

# node_step 8 and min_hidden 8 leave room to narrow a 16-unit block as well as to widen it
MLP_ARCH = {"latent_size": 16, "width": 16, "blocks": [16], "lstm_hidden_size": 16, "proj_size": 16,
            "value_support": 10, "reward_support": 5, "node_step": 8, "min_hidden": 8}
CONV_ARCH = {"channels": 4, "proj_size": 8, "lstm_hidden_size": 8, "value_support": 5, "reward_support": 5}
HP = {"num_simulations": 4, "batch_size": 16, "replay_ratio": 0.5, "td_steps": 3, "num_unroll_steps": 3}

MLP_OPS = ("add_block", "remove_block", "widen_block", "narrow_block", "widen_trunk", "widen_lstm")
CONV_OPS = ("add_res_block", "remove_res_block")


def _trained(env_id: str, arch: dict) -> EfficientZeroAgent:
    task = {"env_id": env_id, "num_envs": 2, "eval_episodes": 1, "min_replay": 16, "replay_capacity": 2000}
    ctx = AgentContext(task=task, replay=build_replay(EfficientZeroAgent.replay_spec(task), 0, distributed=False))
    agent = EfficientZeroAgent.create(arch, HP, 0, 0, ctx)
    agent.train(40)  # rows reach the store when the segment ends ...
    agent.train(40)  # ... so the second call updates
    assert agent.updates > 0  # Adam has moments to carry
    return agent


@pytest.fixture(scope="module")
def agents_by_variant() -> dict[str, EfficientZeroAgent]:
    return {"mlp": _trained("CartPole-v1", MLP_ARCH), "conv": _trained(TINY_IMAGE_ID, CONV_ARCH)}


@pytest.fixture(scope="module")
def seed_of_op(agents_by_variant) -> dict[str, tuple[str, int]]:
    """For each operation, a (variant, rng seed) whose mutation performs it."""
    found: dict[str, tuple[str, int]] = {}
    for variant, ops in (("mlp", MLP_OPS), ("conv", CONV_OPS)):
        for seed in range(200):
            if all(op in found for op in ops):
                break
            op = agents_by_variant[variant].clone(1).mutate_architecture(np.random.default_rng(seed), 0.5).op
            found.setdefault(op, (variant, seed))
    return found


def _mutate_and_check(agent: EfficientZeroAgent, seed: int) -> tuple[str, dict[str, int]]:
    child = agent.clone(1)
    before = OptimizerSnapshot.take([child.model], child.optimizer)
    record = child.mutate_architecture(np.random.default_rng(seed), 0.5)
    return record.op, before.assert_carried([child.model], child.optimizer)


@torch.no_grad()
def _outputs(agent: EfficientZeroAgent) -> list[torch.Tensor]:
    """Everything the search reads: prediction at the root and after three dynamics steps."""
    m = agent.model
    obs = torch.rand(5, *agent.obs_shape, generator=torch.Generator().manual_seed(0))
    latent, hidden = m.represent(obs), m.initial_hidden(5)
    outs = [*m.predict(latent), m.project_predict(m.project(latent))]
    for k in range(3):
        latent, hidden, prefix = m.dynamics(latent, torch.tensor([k % 2] * 5), hidden)
        outs += [prefix, *m.predict(latent)]
    return outs


@pytest.mark.parametrize("op", MLP_OPS + CONV_OPS)
def test_architecture_operation_carries_adam_state(op, agents_by_variant, seed_of_op) -> None:
    assert op in seed_of_op, f"no rng seed in 0..199 drew {op}"
    variant, seed = seed_of_op[op]
    done, counts = _mutate_and_check(agents_by_variant[variant], seed)
    assert done == op
    assert counts["kept"] > 0 and counts["with_state"] > 0
    if op.startswith(("widen", "narrow")):
        assert counts["resized"] > 0  # the overlap check ran on real moments
    if op.startswith("add"):
        assert counts["added"] > 0 and counts["resized"] == 0
    if op.startswith("remove"):
        assert counts["removed"] > 0


@pytest.mark.parametrize("op", ["add_block", "add_res_block", "widen_block", "widen_trunk", "widen_lstm"])
def test_growth_keeps_what_the_model_computes(op, agents_by_variant, seed_of_op) -> None:
    variant, seed = seed_of_op[op]
    child = agents_by_variant[variant].clone(1)
    for mod in child.model.modules():  # non-zero output layers, so preservation is a real check
        if isinstance(mod, torch.nn.Linear):
            torch.nn.init.normal_(mod.weight, std=0.3, generator=torch.Generator().manual_seed(1))
    before = _outputs(child)
    assert child.mutate_architecture(np.random.default_rng(seed), 0.5).op == op
    for old, new in zip(before, _outputs(child)):
        if op.startswith("add"):
            assert torch.equal(old, new)
        else:
            assert torch.allclose(old, new, atol=1e-6, rtol=0)


def test_set_activation_carries_adam_state(agents_by_variant) -> None:
    child = agents_by_variant["mlp"].clone(1)
    before = OptimizerSnapshot.take([child.model], child.optimizer)
    child.set_activation("PReLU")  # brings parameters of its own
    counts = before.assert_carried([child.model], child.optimizer)
    assert counts["added"] > 0 and counts["kept"] > 0 and counts["with_state"] > 0


@pytest.mark.parametrize("mutant", [clear_optimizer_state, zero_second_moments])
@pytest.mark.parametrize("op", ["widen_lstm", "add_res_block"])
def test_the_check_catches_a_restarted_optimizer(op, mutant, agents_by_variant, seed_of_op, monkeypatch) -> None:
    mutate = EfficientZeroAgent.mutate_architecture

    def broken(self, rng, new_layer_prob):
        record = mutate(self, rng, new_layer_prob)
        mutant(self)
        return record

    monkeypatch.setattr(EfficientZeroAgent, "mutate_architecture", broken)
    variant, seed = seed_of_op[op]
    with pytest.raises(AssertionError, match="^(kept|resized) "):
        _mutate_and_check(agents_by_variant[variant], seed)
