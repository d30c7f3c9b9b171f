"""The learner's fast path computes the baseline's function: in float64, one update's losses,
gradients and new weights agree to 1e-10; the bootstrap rows it skips are rows no target reads."""

import copy

import numpy as np
import pytest
import torch

from agents.efficientzero import learner
from agents.efficientzero.agent import EfficientZeroAgent
from agents.efficientzero.model import build_model
from agents.efficientzero.targets import bootstrap_rows, nstep_value_targets
from tests.efficientzero.test_agent import SMALL_CONV_ARCH, make

WEIGHTS = {"value_weight": 0.25, "policy_weight": 1.0, "value_prefix_weight": 1.0, "consistency_weight": 2.0}
TASK = {"env_id": "CartPole-v1", "num_envs": 2, "eval_episodes": 2, "min_replay": 16, "replay_capacity": 5000,
        "segment_length": 10, "dtype": "float64"}
TOL = 1e-10


def _nonzero_outputs(model, seed):
    """Output layers start at zero; random weights give every term a gradient worth comparing."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen, dtype=torch.float64) * 0.3)


# the conv variant on MinAtar Breakout's own images (4 x 10 x 10, 3 actions): its stacked unroll looks the
# action planes' convolution up and runs the 1x1 convs as batched products (model.DynamicsNetwork.forward_action)
CONV_TASK = {**TASK, "env_id": "MinAtar/Breakout-v1", "eval_episodes": 1}


@pytest.fixture(scope="module", params=["mlp", "conv"])
def member(request):
    # K = 5 steps with an LSTM horizon of 2: resets inside the unroll (after steps 2 and 4)
    hp = {"num_unroll_steps": 5, "lstm_horizon_len": 2, "td_steps": 3}
    if request.param == "conv":
        agent = make(seed=0, hp=hp, task=CONV_TASK, arch=SMALL_CONV_ARCH)
        assert type(agent.model).__name__ == "EfficientZeroConv"
    else:
        agent = make(seed=0, hp=hp, task=TASK)
    agent.train(80)
    _nonzero_outputs(agent.model, 1)
    _nonzero_outputs(agent.target_model, 2)
    return agent


def _terms_and_grads(model, batch, path):
    hp = {**WEIGHTS, "lstm_horizon_len": 2}
    model.train()
    with learner.use_path(path):
        terms = learner.loss_terms(model, dict(model.named_parameters()), dict(model.named_buffers()), batch, hp)
    model.zero_grad(set_to_none=True)
    terms["loss_total"].backward()
    return terms, {name: p.grad.clone() for name, p in model.named_parameters()}


def _assert_close(a, b, what):
    err = (a.detach() - b.detach()).abs().max().item()
    assert err <= TOL * max(1.0, b.detach().abs().max().item()), f"{what}: differs by {err:.3g}"


def test_float64_losses_and_gradients_equal_the_baseline(member):
    with learner.use_path("baseline"):
        batch = learner.sample_batch(member.replay, member.target_model, member.hparams, member.rng)
    assert batch.tensors["obs"].shape[1] == 6 and batch.tensors["valid"].min() == 0  # windows run past an end
    want, want_grads = _terms_and_grads(member.model, batch.tensors, "baseline")
    got, got_grads = _terms_and_grads(member.model, batch.tensors, "fast")
    assert set(got) == set(want)
    for name in want:
        _assert_close(got[name], want[name], name)
    assert set(got_grads) == set(want_grads)
    for name, g in want_grads.items():
        assert g.abs().max() > 0, name  # every parameter takes part, so a dropped term would show
        _assert_close(got_grads[name], g, name)


def test_float64_update_equals_the_baseline(member):
    """One whole `update` on each path (fused Adam on the fast one) from the same state and batch."""
    with learner.use_path("baseline"):
        batch = learner.sample_batch(member.replay, member.target_model, member.hparams, member.rng)
    results = {}
    for path in ("baseline", "fast"):
        model, target = copy.deepcopy(member.model), copy.deepcopy(member.target_model)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
        for step in (1, 2):  # the second step has moments to use
            with learner.use_path(path):
                metrics = learner.update(model, target, opt, member.replay, batch, member.hparams, step)
        assert all(g.get("fused") is None for g in opt.param_groups)  # the member's own settings stay
        results[path] = (metrics, dict(model.named_parameters()))
    (m_base, p_base), (m_fast, p_fast) = results["baseline"], results["fast"]
    for name, value in m_base.items():
        assert abs(m_fast[name] - value) <= TOL * max(1.0, abs(value)), name
    for name, p in p_base.items():
        _assert_close(p_fast[name], p, name)


def test_a_wrong_rewrite_is_caught(member, monkeypatch):
    """The comparison can fail: without the halved gradient through the unrolled latents (one
    line of the stacked unroll) the fast path's gradients differ."""
    from agents.efficientzero import model as model_module

    with learner.use_path("baseline"):
        batch = learner.sample_batch(member.replay, member.target_model, member.hparams, member.rng)
    _, want_grads = _terms_and_grads(member.model, batch.tensors, "baseline")
    monkeypatch.setattr(model_module, "_halve_gradient", lambda g: g)
    _, got_grads = _terms_and_grads(member.model, batch.tensors, "fast")
    worst = max((got_grads[n] - g).abs().max().item() for n, g in want_grads.items())
    assert worst > 1e-6


def test_bootstrap_rows_are_the_only_values_targets_read():
    rng = np.random.default_rng(0)
    B, K, td = 400, 5, 4
    L = K + 1 + td
    ends = rng.integers(1, L + 3, size=B)  # trajectory length inside the window (past L: no end)
    mask = np.arange(L)[None] < ends[:, None]
    terminals = np.zeros((B, L), bool)
    hit = (ends <= L) & (rng.random(B) < 0.5)  # half the ended trajectories end in a terminal
    terminals[np.flatnonzero(hit), ends[hit] - 1] = True
    rewards = rng.normal(size=(B, L))
    values = rng.normal(size=(B, L))
    rows = bootstrap_rows(terminals, mask, td, K + 1)
    assert 0 < rows.sum() < mask.sum()
    poisoned = np.where(rows, values, np.nan)
    want = nstep_value_targets(rewards, terminals, mask, values, 0.99, td, K + 1)
    got = nstep_value_targets(rewards, terminals, mask, poisoned, 0.99, td, K + 1)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    # and the rule is not vacuous: poisoning one row it keeps changes a target
    kept = np.argwhere(rows & ~terminals)[0]
    values2 = values.copy()
    values2[tuple(kept)] = np.nan
    assert np.isnan(nstep_value_targets(rewards, terminals, mask, values2, 0.99, td, K + 1)[0]).any()


def test_bootstrap_values_of_chosen_rows_equal_the_full_computation(member):
    seq = learner.sample_windows(member.replay, member.hparams)
    obs = learner.window_obs(seq)
    full = learner.bootstrap_values(member.target_model, obs)
    rows = bootstrap_rows(np.asarray(seq.data["terminal"]), np.asarray(seq.mask), 3, 6)
    part = learner.bootstrap_values(member.target_model, obs, rows)
    np.testing.assert_allclose(part[rows], full[rows], rtol=TOL, atol=TOL)
    assert (part[~rows] == 0).all()


def test_float32_updates_agree_to_rounding():
    """In float32 the paths round differently, and no more: 20 updates on the same batches from the
    same state leave weights within 1e-5 of each other (they move by ~1e-1)."""
    agent = make(seed=3, hp={"num_unroll_steps": 5, "lstm_horizon_len": 5, "td_steps": 3})
    agent.train(80)
    with learner.use_path("baseline"):
        batches = [learner.sample_batch(agent.replay, agent.target_model, agent.hparams, agent.rng) for _ in range(20)]
    start = torch.cat([p.detach().flatten() for p in agent.model.parameters()])
    weights = {}
    for path in ("baseline", "fast"):
        model, target = copy.deepcopy(agent.model), copy.deepcopy(agent.target_model)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
        with learner.use_path(path):
            for step, batch in enumerate(batches, 1):
                learner.update(model, target, opt, agent.replay, batch, agent.hparams, step)
        weights[path] = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert (weights["baseline"] - start).abs().max() > 1e-2
    assert (weights["fast"] - weights["baseline"]).abs().max() < 1e-5


def test_set_training_sets_the_flags_module_train_sets():
    class Frozen(torch.nn.Module):  # a module with its own rule: stays in eval mode
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)

        def train(self, mode: bool = True):
            return super().train(False)

    model = build_model((4,), 2, EfficientZeroAgent.default_arch())
    model.extra = Frozen()
    for mode in (True, False, True):
        learner.set_training(model, mode)
        flags = [(name, m.training) for name, m in model.named_modules()]
        model.train(mode)
        assert flags == [(name, m.training) for name, m in model.named_modules()]
        assert model.extra.training is False and model.extra.inner.training is False
