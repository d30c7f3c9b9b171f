"""Fused EfficientZero equals each member alone: in float64, a group trained and evaluated with
`FusedEfficientZero` (one search over all members' roots, one vmapped gradient step per round)
gives every member the weights, metrics and fitness its own `train` / `evaluate` give it, with
different lr, discount, loss weights (the policy-entropy bonus too) and replay ratio per member."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.efficientzero.agent import EfficientZeroAgent
from agents.efficientzero.fused import FusedEfficientZero, StackedSearchModel, search_members
from agents.efficientzero.mcts import BatchedMCTS, MCTSConfig
from evo.agent import AgentContext
from evo.fused import StackedModules
from evo.replay.view import MemberView, view_seed
from tests.efficientzero.test_agent import SMALL_CONV_ARCH

TASK = {"num_envs": 2, "eval_episodes": 2, "min_replay": 16, "segment_length": 8, "dtype": "float64"}
ARCH = {"variant": "mlp", "latent_size": 16, "width": 16, "blocks": [16], "lstm_hidden_size": 16,
        "fc_reward_layers": [8], "proj_size": 16, "value_support": 5, "reward_support": 3}
HPARAMS = [{"lr": 3e-3, "discount": 0.99, "replay_ratio": 0.25, "consistency_weight": 2.0},
           {"lr": 1e-3, "discount": 0.97, "replay_ratio": 0.5, "consistency_weight": 0.5, "num_simulations": 6,
            "policy_entropy_weight": 0.05},
           {"lr": 5e-3, "discount": 0.995, "replay_ratio": 0.25, "value_weight": 0.5, "target_update_interval": 5}]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# the conv variant on MinAtar Breakout: its stacked unroll (action maps, 1x1 convs as bmm) runs under vmap
CONV_TASK = {**TASK, "env_id": "MinAtar/Breakout-v1"}


def members(shared, task=TASK, arch=ARCH):
    """Three members, each on its own view of one shared store (as a scheduler gives them)."""
    out = []
    for i, hp in enumerate(HPARAMS):
        view = MemberView(shared, shared.view_basis(), view_seed(3, i, 0))
        ctx = AgentContext(task=task, replay=view, seed=3)
        out.append(EfficientZeroAgent.create(arch, {"batch_size": 8, "num_simulations": 4, **hp}, 100 + i, i, ctx))
    return out


@pytest.mark.parametrize("task,arch", [(TASK, ARCH), (CONV_TASK, SMALL_CONV_ARCH)], ids=["mlp", "conv"])
def test_fused_group_equals_each_member_alone_f64(task, arch):
    spec = EfficientZeroAgent.replay_spec(task)
    from evo.replay.protocol import build_replay

    alone, fused = members(build_replay(spec, 3, False), task, arch), members(build_replay(spec, 3, False), task, arch)
    expected = [(a.train(48), a.evaluate()) for a in alone]
    trainer = FusedEfficientZero()
    metrics = trainer.train(fused, 48)
    evaluations = trainer.evaluate(fused)
    for (m_alone, e_alone), m_fused, e_fused, a, f in zip(expected, metrics, evaluations, alone, fused):
        assert a.updates == f.updates > 0 and a.env_steps == f.env_steps
        assert e_alone.fitness == e_fused.fitness
        # the same columns fused or not (dashboards, leaderboard): fused adds only its group size
        assert set(m_fused) - set(m_alone) == {"fused_group_size"} and set(m_alone) <= set(m_fused)
        assert set(e_fused.metrics) == set(e_alone.metrics) and e_fused.metrics["eval_seconds"] > 0
        for k in ("loss_total", "loss_value", "loss_consistency", "grad_norm"):
            assert abs(m_alone[k] - m_fused[k]) < 1e-9, k
        # the entropy bonus (member 1's) reaches the fused step too, and is reported only where it is weighed
        weighed = a.hparams["policy_entropy_weight"] != 0
        assert ("loss_policy_entropy" in m_alone) == weighed == ("loss_policy_entropy" in m_fused)
        if "loss_policy_entropy" in m_alone:
            assert abs(m_alone["loss_policy_entropy"] - m_fused["loss_policy_entropy"]) < 1e-9
        for (name, p), q in zip(a.model.named_parameters(), f.model.parameters()):
            assert float((p - q).abs().max()) < 1e-9, name
        sa, sf = a.optimizer.state_dict()["state"], f.optimizer.state_dict()["state"]
        assert all(float(sa[k]["step"]) == float(sf[k]["step"]) for k in sa)
        assert a.rng.bit_generator.state == f.rng.bit_generator.state  # same draws, same order


def test_one_search_over_several_members_roots_equals_their_own_searches():
    ctx = AgentContext(task={**TASK, "dtype": "float32"}, seed=0)
    # member 1 searches the Gumbel way: its roots get Gumbel noise from its own generator, the others Dirichlet
    agents = [EfficientZeroAgent.create(ARCH, {"num_simulations": 3 + 2 * i, "discount": 0.9 + 0.04 * i,
                                               "search": "gumbel" if i == 1 else "puct"}, i, i, ctx)
              for i in range(3)]
    with torch.no_grad():
        for a in agents:
            for p in a.model.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=a.generator))
    stack = StackedModules(agents[0].model, 3)
    for i, a in enumerate(agents):
        stack.load(i, a.model)
    obs = [np.random.default_rng(i).normal(size=(5, 4)).astype(np.float32) for i in range(3)]
    fused = search_members(StackedSearchModel(stack.template, stack.params, stack.buffers, 3), obs,
                           [a.hparams for a in agents], [np.random.default_rng(10 + i) for i in range(3)])
    for i, a in enumerate(agents):
        own = BatchedMCTS(MCTSConfig.from_hparams(a.hparams)).run(a.model, torch.as_tensor(obs[i]),
                                                                 np.random.default_rng(10 + i), add_noise=True)
        assert np.array_equal(own.visit_counts, fused[i].visit_counts)
        np.testing.assert_allclose(own.root_values, fused[i].root_values, rtol=1e-5)
        np.testing.assert_allclose(own.policy, fused[i].policy, rtol=1e-5, atol=1e-7)
        own_action = np.full(5, -1) if own.action is None else own.action  # -1: drawn from the visits by the caller
        assert np.array_equal(own_action, fused[i].action), i
