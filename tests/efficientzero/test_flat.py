"""The flat graphs (agents/efficientzero/flat.py) of the search and of the learner's unroll compute the
modules' outputs (and gradients) bit for bit, follow the model through mutations and in-place updates,
and step aside where fx cannot trace."""

import contextlib
import gc
import weakref

import numpy as np
import pytest
import torch

from agents.efficientzero import flat, learner
from agents.efficientzero.agent import EfficientZeroAgent
from agents.efficientzero.mcts import BatchedMCTS, MCTSConfig
from agents.efficientzero.model import build_model


def _model(dtype=torch.float64, **arch):
    model = build_model((4,), 2, {**EfficientZeroAgent.default_arch(), **arch}, torch.Generator().manual_seed(0))
    model = model.to(dtype)
    with torch.no_grad():  # the output layers start at zero; random weights make every output worth comparing
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=dtype) * 0.2)
    return model.eval()


def _module_calls(model, obs, latent, action, hidden):
    first = model.represent(obs)
    policy, value = model.predict(first)
    lat, (h, c), prefix = model.dynamics(latent, action, hidden)
    p, v = model.predict(lat)
    return (first, policy, value), (lat, (h, c), prefix, p, v)


def _flat_calls(calls, obs, latent, action, hidden):
    return calls.initial_inference(obs), calls.recurrent_inference(latent, action, hidden)


def _inputs(dtype, batch=7, hidden_size=64):
    gen = torch.Generator().manual_seed(1)
    obs = torch.randn(batch, 4, generator=gen, dtype=dtype)
    latent = torch.rand(batch, 64, generator=gen, dtype=dtype)
    action = torch.randint(0, 2, (batch,), generator=gen)
    hidden = (torch.randn(batch, hidden_size, generator=gen, dtype=dtype),
              torch.randn(batch, hidden_size, generator=gen, dtype=dtype))
    return obs, latent, action, hidden


def _assert_identical(a, b):
    flat_a = torch.utils._pytree.tree_leaves(a)
    flat_b = torch.utils._pytree.tree_leaves(b)
    assert len(flat_a) == len(flat_b)
    for x, y in zip(flat_a, flat_b):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("arch", [{}, {"blocks": []}, {"blocks": [64, 32], "activation": "GELU"},
                                  {"activation": "ELU", "width": 48}, {"activation": "Tanh", "lstm_hidden_size": 32}])
def test_flat_calls_equal_the_modules_bit_for_bit(dtype, arch):
    model = _model(dtype, **arch)
    calls = flat.search_calls(model)
    assert calls is not None
    inputs = _inputs(dtype, hidden_size=model.lstm_hidden_size)
    with torch.inference_mode():
        _assert_identical(_flat_calls(calls, *inputs), _module_calls(model, *inputs))
    # with autograd on as well: the same ops record the same values
    _assert_identical(_flat_calls(calls, *inputs), _module_calls(model, *inputs))


@contextlib.contextmanager
def _flat_graphs(enabled):
    """`flat.enabled` inside the block (alone: `learner.use_path` would change the learner's path too)."""
    old, flat.enabled = flat.enabled, enabled
    try:
        yield
    finally:
        flat.enabled = old


def _search(model, seed, search="puct", enabled=True):
    obs = np.random.default_rng(seed).normal(size=(9, 4)).astype(np.float32)
    with _flat_graphs(enabled):
        return BatchedMCTS(MCTSConfig(num_simulations=12, discount=0.99, search=search)).run(
            model, obs, np.random.default_rng(seed), add_noise=True)


@pytest.mark.parametrize("search", ["puct", "gumbel"])
def test_a_search_through_flat_graphs_is_the_search_through_modules(search):
    model = _model(torch.float32)
    for seed in range(3):
        a, b = _search(model, seed, search, enabled=True), _search(model, seed, search, enabled=False)
        for field in ("visit_counts", "root_values", "policy", "root_prior", "action"):
            x, y = getattr(a, field), getattr(b, field)
            assert (x is None and y is None) or np.array_equal(x, y), field


def test_an_update_in_place_keeps_the_graph_and_shows_in_it():
    model = _model(torch.float32)
    calls = flat.search_calls(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    obs, latent, action, hidden = _inputs(torch.float32)
    model.represent(obs).sum().backward()
    optimizer.step()
    other = _model(torch.float32, activation="GELU")
    model.load_state_dict(_model(torch.float32).state_dict() | {"prediction.fc_out.bias": torch.ones(53)})
    assert flat.search_calls(model) is calls  # the same tensors, written in place
    with torch.inference_mode():
        _assert_identical(_flat_calls(calls, obs, latent, action, hidden), _module_calls(model, obs, latent, action, hidden))
    assert flat.search_calls(other) is not calls


def test_a_mutation_traces_again():
    model = _model(torch.float32)
    inputs = _inputs(torch.float32)
    rng = np.random.default_rng(0)
    bounds = EfficientZeroAgent.default_arch()
    seen = [flat.search_calls(model)]
    ops = []
    for _ in range(6):
        record, _ = model.mutate_architecture(rng, 0.5, bounds, torch.Generator().manual_seed(3))
        calls = flat.search_calls(model)
        if record.op != "none":
            assert calls is not seen[-1], record
        seen.append(calls)
        ops.append(record.op)
        inputs = _inputs(torch.float32, hidden_size=model.lstm_hidden_size)
        with torch.inference_mode():
            _assert_identical(_flat_calls(calls, *inputs), _module_calls(model, *inputs))
    assert len(set(ops) - {"none"}) >= 2, ops  # several kinds of change were met
    model.set_activation("Tanh")  # new activation modules, no new parameters
    calls = flat.search_calls(model)
    assert calls is not seen[-1]
    with torch.inference_mode():
        _assert_identical(_flat_calls(calls, *inputs), _module_calls(model, *inputs))
    model.train()  # a training flag is part of the structure
    assert flat.search_calls(model) is not calls


def test_train_and_eval_structures_stay_cached():
    """A member searches in eval mode and learns in train mode, in turns: neither traces again."""
    model = _model(torch.float32)
    search = flat.search_calls(model)
    model.train()
    unroll = flat.unroll_calls(model)
    assert unroll is not None and flat.search_calls(model) is not search
    model.eval()
    assert flat.search_calls(model) is search
    model.train()
    assert flat.unroll_calls(model) is unroll


def _unroll_batch(dtype, B=6, K=5):
    gen = torch.Generator().manual_seed(2)
    return torch.randn(B, K + 1, 4, generator=gen, dtype=dtype), torch.randint(0, 2, (B, K), generator=gen)


def _assert_unrolls_identical(model, obs, actions, calls):
    """The stacked unroll (LSTM reset every 2 steps) through `calls` and through the modules: every output
    and every parameter's gradient equal bit for bit, the halved latent gradients included."""

    def run(calls):
        model.zero_grad(set_to_none=True)
        out = model(obs, actions, 2, stacked=True, calls=calls)
        loss = sum((t.double() * (i + 1)).sin().sum() for i, t in enumerate(out[:4]))  # target_projections: no grad
        loss.backward()
        return out, {n: p.grad.clone() for n, p in model.named_parameters()}

    (out_m, grads_m), (out_f, grads_f) = run(None), run(calls)
    _assert_identical(tuple(out_f), tuple(out_m))
    assert grads_f.keys() == grads_m.keys()
    for name in grads_m:
        assert torch.equal(grads_f[name], grads_m[name]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("arch", [{}, {"blocks": [64, 32], "activation": "GELU"}, {"activation": "Tanh", "lstm_hidden_size": 32},
                                  {"norm_type": "BN"}])
def test_the_unroll_through_flat_graphs_equals_the_modules_with_its_gradients(dtype, arch):
    """The learner's stacked unroll (K = 5, LSTM reset after step 2 and 4) with `calls`: every output and
    every parameter's gradient equal to the modules' bit for bit, the halved latent gradients included."""
    model = _model(dtype, **arch).train()
    obs, actions = _unroll_batch(dtype)
    calls = flat.unroll_calls(model)
    assert calls is not None
    _assert_unrolls_identical(model, obs, actions, calls)


def test_an_update_on_the_fast_path_learns_through_the_flat_graphs():
    """`learner.loss_terms` with the module's own parameters (None, as `update` passes them) goes through
    the unroll's flat graphs and gives the terms the modules give."""
    model = _model(torch.float32).train()
    obs, actions = _unroll_batch(torch.float32, B=8)
    B, K = actions.shape
    gen = torch.Generator().manual_seed(3)
    batch = {"obs": obs, "actions": actions,
             "value_target": torch.softmax(torch.randn(B, K + 1, 51, generator=gen), -1),
             "value_prefix_target": torch.softmax(torch.randn(B, K, 11, generator=gen), -1),
             "policy_target": torch.softmax(torch.randn(B, K + 1, 2, generator=gen), -1),
             "valid": torch.ones(B, K + 1), "mask": torch.ones(B, K), "weights": torch.rand(B, generator=gen)}
    hp = {"value_weight": 0.25, "policy_weight": 1.0, "value_prefix_weight": 1.0, "consistency_weight": 2.0,
          "lstm_horizon_len": 2}
    traced = learner.loss_terms(model, None, None, batch, hp)
    assert any(made.get("unroll") is not None for _, made in flat._cache[model].values())  # it went through them
    with _flat_graphs(False):
        plain = learner.loss_terms(model, None, None, batch, hp)
    for name in plain:
        assert torch.equal(traced[name], plain[name]), name


def test_the_cache_does_not_keep_a_model_alive():
    model = _model(torch.float32)
    assert flat.search_calls(model) is not None
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


#: the suite's MinAtar conv model, smaller
CONV = {"variant": "conv", "channels": 8, "num_res_blocks": 1, "reward_head_channels": 4, "head_channels": 4, "width": 32,
        "lstm_hidden_size": 16, "fc_reward_layers": [16], "proj_size": 32, "value_support": 10, "reward_support": 5,
        "downsample": False, "norm_type": "LN"}


def _conv_model(dtype, **arch):
    model = build_model((4, 10, 10), 3, {**EfficientZeroAgent.default_arch(), **CONV, **arch},
                        torch.Generator().manual_seed(0)).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=dtype) * 0.2)
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("arch", [{}, {"norm_type": "BN", "activation": "GELU"}, {"num_res_blocks": 2, "dyn_res_blocks": 0},
                                  {"downsample": True}])
def test_the_conv_variant_through_flat_graphs_equals_the_modules_with_its_gradients(dtype, arch):
    """The MinAtar model: the search's calls, and the learner's unroll (its action maps computed once per
    unroll, its 1x1 convolutions as batched products) with every parameter's gradient, bit for bit."""
    model = _conv_model(dtype, **arch).eval()
    gen = torch.Generator().manual_seed(1)
    obs = (torch.rand(5, 4, 10, 10, generator=gen) < 0.3).to(torch.uint8)
    latent = torch.rand(model.represent(obs).shape, generator=gen, dtype=dtype)
    action = torch.randint(0, 3, (5,), generator=gen)
    hidden = (torch.randn(5, 16, generator=gen, dtype=dtype), torch.randn(5, 16, generator=gen, dtype=dtype))
    calls = flat.search_calls(model)
    assert calls is not None
    with torch.inference_mode():
        _assert_identical(_flat_calls(calls, obs, latent, action, hidden), _module_calls(model, obs, latent, action, hidden))

    model.train()
    unroll = flat.unroll_calls(model)
    assert unroll is not None
    obs_k = (torch.rand(6, 6, 4, 10, 10, generator=gen) < 0.3).to(torch.uint8)
    actions = torch.randint(0, 3, (6, 5), generator=gen)
    _assert_unrolls_identical(model, obs_k, actions, unroll)


def test_a_conv_search_through_flat_graphs_is_the_search_through_modules_and_follows_a_new_block():
    model = _conv_model(torch.float32).eval()
    obs = (np.random.default_rng(0).random((4, 4, 10, 10)) < 0.3).astype(np.uint8)

    def search(enabled):
        with _flat_graphs(enabled):
            search = BatchedMCTS(MCTSConfig(num_simulations=8, discount=0.99))
            return search.run(model, obs, np.random.default_rng(1), add_noise=True)

    before = flat.search_calls(model)
    for _ in range(2):
        a, b = search(True), search(False)
        for field in ("visit_counts", "root_values", "policy", "action"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), field
        model.add_res_block("dynamics")  # identity-initialised: a new structure, the same outputs
        model.eval()
    assert flat.search_calls(model) is not before


def test_the_dynamics_keep_either_lstm_state_layout():
    """[B, H] in, [B, H] out; nn.LSTM's [1, B, H] in, [1, B, H] out; the same values."""
    model = _conv_model(torch.float64).eval()
    gen = torch.Generator().manual_seed(5)
    latent = torch.rand(3, 8, 10, 10, generator=gen, dtype=torch.float64)
    action = torch.tensor([0, 2, 1])
    h, c = torch.randn(3, 16, generator=gen, dtype=torch.float64), torch.randn(3, 16, generator=gen, dtype=torch.float64)
    flat_out = model.dynamics(latent, action, (h, c))
    lstm_out = model.dynamics(latent, action, (h[None], c[None]))
    assert flat_out[1][0].shape == (3, 16) and lstm_out[1][0].shape == (1, 3, 16)
    _assert_identical((lstm_out[0], lstm_out[1][0][0], lstm_out[1][1][0], lstm_out[2]),
                      (flat_out[0], flat_out[1][0], flat_out[1][1], flat_out[2]))


class _ShapeBranching(torch.nn.Module):
    """A model whose predict branches on a tensor's size in Python, which fx cannot trace."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _model(torch.float32)

    def represent(self, obs):
        return self.inner.represent(obs)

    def predict(self, latent):
        return self.inner.predict(latent if latent.shape[0] > 1 else latent.clone())

    def dynamics(self, latent, action, hidden):
        return self.inner.dynamics(latent, action, hidden)


def test_a_model_fx_cannot_trace_and_other_objects_keep_their_module_calls():
    assert flat.search_calls(_ShapeBranching()) is None
    assert flat.search_calls(torch.nn.Linear(2, 2)) is None  # no represent/predict/dynamics


def test_the_baseline_path_searches_through_the_modules():
    model = _model(torch.float32)
    with learner.use_path("baseline"):
        assert flat.search_calls(model) is None
    assert flat.search_calls(model) is not None



def test_bootstrap_values_through_the_flat_graph_are_the_modules():
    model = _model(torch.float32)
    obs = torch.randn(5, 11, 4, generator=torch.Generator().manual_seed(4))
    rows = np.random.default_rng(0).random((5, 11)) < 0.4
    traced = learner.bootstrap_values(model, obs, rows)
    with _flat_graphs(False):
        plain = learner.bootstrap_values(model, obs, rows)
    assert np.array_equal(traced, plain) and np.count_nonzero(traced) == rows.sum()


def test_a_model_with_hooks_keeps_its_module_calls():
    """A graph calls no module, so it would skip hooks: a hooked model (or any global hook) runs its modules."""
    model = _model(torch.float32)
    assert flat.search_calls(model) is not None
    seen = []
    handle = model.prediction.fc_out.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    assert flat.search_calls(model) is None and flat.unroll_calls(model) is None
    _search(model, 0)
    assert len(seen) == 13  # the root and 12 simulations, each through the hooked layer
    handle.remove()
    assert flat.search_calls(model) is not None
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    try:
        assert flat.search_calls(model) is None
    finally:
        handle.remove()
