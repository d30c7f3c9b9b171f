"""EfficientZero trains on the device its context names (`AgentContext.device`, which the Ray
scheduler sets to the GPU share it was granted): model, target model, Adam state, self-play
search, learner batches and fused groups live there; `get_state()` holds CPU tensors wherever the
member trained. The CUDA tests are marked `gpu` (skipped cleanly without CUDA; `./scripts/test.sh
-m gpu`); the device lookup the search uses is checked on the CPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from agents.efficientzero import learner
from agents.efficientzero.agent import EfficientZeroAgent
from agents.efficientzero.fused import FusedEfficientZero
from agents.efficientzero.mcts import model_device
from evo.agent import AgentContext
from evo.replay import build_replay
from evo.replay.view import MemberView, view_seed
from tests.test_gpu import tensor_devices

ARCH = {"variant": "mlp", "latent_size": 16, "width": 16, "blocks": [16], "lstm_hidden_size": 16,
        "fc_reward_layers": [8], "proj_size": 16, "value_support": 5, "reward_support": 3}
TASK = {"num_envs": 2, "eval_episodes": 2, "min_replay": 16, "segment_length": 8, "dtype": "float64"}
HP = {"batch_size": 8, "num_simulations": 4, "reanalyse_ratio": 0.5, "target_update_interval": 5}


def _member(device: str, replay: Any, index: int = 0, hp: dict[str, Any] | None = None) -> EfficientZeroAgent:
    ctx = AgentContext(task=TASK, replay=replay, device=device, seed=3)
    return EfficientZeroAgent.create(ARCH, {**HP, **(hp or {})}, 100 + index, index, ctx)


def _on(agent: EfficientZeroAgent) -> set[str]:
    """Devices of the weights, target weights and Adam moments (Adam keeps its 0-d `step` counters
    on the CPU on every device, so those are left out)."""
    moments = [v for s in agent.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    return tensor_devices([dict(agent.model.state_dict()), dict(agent.target_model.state_dict()), moments])


def test_the_search_finds_where_a_model_computes() -> None:
    class NotAModule:  # the search protocol does not require an nn.Module
        def represent(self, obs: torch.Tensor) -> torch.Tensor:
            return obs

    class WithDevice:
        device = "meta"

    assert model_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert model_device(torch.nn.Linear(2, 2, device="meta")) == torch.device("meta")
    assert model_device(WithDevice()) == torch.device("meta")
    assert model_device(NotAModule()) == torch.device("cpu")
    assert model_device(torch.nn.ReLU()) == torch.device("cpu")  # no parameters: the CPU


def test_a_member_is_built_on_its_contexts_device() -> None:
    """Weights are drawn on the CPU from the member's generator and moved, so the device does not
    change them: a member built on the meta device (shapes only) has the same parameter shapes, and
    one rebuilt on the CPU the same values."""
    replay = build_replay(EfficientZeroAgent.replay_spec(TASK), 3, distributed=False)
    on_meta, on_cpu = _member("meta", replay), _member("cpu", replay)
    assert on_meta.device == torch.device("meta") and tensor_devices(dict(on_meta.model.state_dict())) == {"meta"}
    assert tensor_devices(dict(on_meta.target_model.state_dict())) == {"meta"}
    assert [p.shape for p in on_meta.model.parameters()] == [p.shape for p in on_cpu.model.parameters()]
    again = _member("cpu", replay)
    assert all(torch.equal(p, q) for p, q in zip(on_cpu.model.parameters(), again.model.parameters()))


cuda = pytest.mark.gpu


@cuda
def test_a_member_trains_evaluates_mutates_and_restores_on_cuda() -> None:
    replay = build_replay(EfficientZeroAgent.replay_spec(TASK), 3, distributed=False)
    agent = _member("cuda", replay)
    metrics = agent.train(48)
    assert agent.updates > 0 and np.isfinite(metrics["loss_total"])
    assert _on(agent) == {"cuda"}
    rng = np.random.default_rng(0)
    for _ in range(3):  # widen / add blocks / LSTM widening: new weights land on the member's device
        agent.mutate_architecture(rng, new_layer_prob=0.5)
    agent.set_activation("GELU")
    agent.train(16)
    assert _on(agent) == {"cuda"}
    fitness = agent.evaluate().fitness
    state = agent.get_state()
    assert tensor_devices(state) == {"cpu"}  # checkpoints and Ray results never carry CUDA tensors
    restored = EfficientZeroAgent.from_state(state, AgentContext(task=TASK, replay=replay, device="cuda", seed=3))
    assert _on(restored) == {"cuda"} and restored.evaluate().fitness == fitness
    restored.train(16)


@cuda
def test_the_loss_on_cuda_equals_the_loss_on_the_cpu_in_float64() -> None:
    """One state, one sampled batch: the learner's terms and gradients on CUDA agree with the CPU's
    to float64 rounding, and so does a greedy evaluation."""
    replay = build_replay(EfficientZeroAgent.replay_spec(TASK), 3, distributed=False)
    trained = _member("cpu", replay, hp={"reanalyse_ratio": 0.0})
    trained.train(48)
    state = trained.get_state()
    on = {d: EfficientZeroAgent.from_state(state, AgentContext(task=TASK, replay=replay, device=d, seed=3))
          for d in ("cpu", "cuda")}
    windows = learner.sample_windows(replay, on["cpu"].hparams)
    results = {}
    for d, agent in on.items():
        boot = learner.bootstrap_values(agent.target_model, learner.window_obs(windows))
        batch = learner.batch_from_windows(windows, boot, agent.target_model, agent.hparams, np.random.default_rng(0))
        assert tensor_devices(batch.tensors) == {d}
        hp = {k: float(agent.hparams[k]) for k in learner.LOSS_WEIGHTS.values()}
        hp["lstm_horizon_len"] = int(agent.hparams["lstm_horizon_len"])
        params = dict(agent.model.named_parameters())
        terms = learner.loss_terms(agent.model, params, dict(agent.model.named_buffers()), batch.tensors, hp)
        grads = torch.autograd.grad(terms["loss_total"], list(params.values()))
        results[d] = (boot, {k: float(v) for k, v in terms.items() if v.dim() == 0}, [g.cpu() for g in grads])
    (boot_c, terms_c, grads_c), (boot_g, terms_g, grads_g) = results["cpu"], results["cuda"]
    np.testing.assert_allclose(boot_g, boot_c, rtol=0, atol=1e-9)
    for k in terms_c:
        assert abs(terms_c[k] - terms_g[k]) < 1e-9, k
    assert all(torch.allclose(g, c, rtol=0, atol=1e-9) for g, c in zip(grads_g, grads_c))
    assert on["cuda"].evaluate().fitness == on["cpu"].evaluate().fitness


@cuda
def test_a_fused_group_trains_on_its_members_cuda_device() -> None:
    """Members on CUDA train as one fused program there (stacked weights, search, bootstrap values,
    batches), and each gets back what it would have alone, to float64 rounding."""
    spec = EfficientZeroAgent.replay_spec(TASK)

    def members() -> list[EfficientZeroAgent]:
        shared = build_replay(spec, 3, distributed=False)
        return [_member("cuda", MemberView(shared, shared.view_basis(), view_seed(3, i, 0)), i,
                        {"lr": lr, "reanalyse_ratio": 0.0}) for i, lr in enumerate((3e-3, 1e-3))]

    alone, fused = members(), members()
    expected = [a.train(48) for a in alone]
    got = FusedEfficientZero().train(fused, 48)
    for m_alone, m_fused, a, f in zip(expected, got, alone, fused):
        assert a.updates == f.updates > 0 and _on(f) == {"cuda"}
        assert abs(m_alone["loss_total"] - m_fused["loss_total"]) < 1e-7
        assert all(torch.allclose(p, q, rtol=0, atol=1e-7) for p, q in zip(a.model.parameters(), f.model.parameters()))
