import inspect

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from agents.efficientzero.agent import EfficientZeroAgent
from agents.efficientzero.model import DynamicsNetwork, LSTMCell, build_model

ARCH = EfficientZeroAgent.validate_arch({"latent_size": 32, "width": 32, "blocks": [32], "lstm_hidden_size": 16,
                                         "proj_size": 16})


def test_dynamics_network_signature_matches_documentation():
    params = inspect.signature(DynamicsNetwork.__init__).parameters
    expected = {"observation_shape": inspect.Parameter.empty, "action_encoding_dim": 2, "num_res_blocks": 1,
                "num_channels": 64, "reward_head_channels": 64, "output_support_size": 601,
                "flatten_output_size_for_reward_head": 64, "downsample": False, "lstm_hidden_size": 512,
                "last_linear_layer_init_zero": True, "activation": nn.ReLU, "norm_type": "BN"}
    for name, default in expected.items():
        assert params[name].default == default, name
    assert list(params["fc_reward_layers"].default) == [32]
    fwd = list(inspect.signature(DynamicsNetwork.forward).parameters)
    assert fwd == ["self", "state_action_encoding", "reward_hidden_state"]


@pytest.mark.parametrize("norm_type", ["BN", "LN"])
@pytest.mark.parametrize("downsample", [False, True])
def test_dynamics_network_shapes(norm_type, downsample):
    obs_shape = (3, 32, 32)
    hw = (2, 2) if downsample else (32, 32)
    net = DynamicsNetwork(obs_shape, action_encoding_dim=2, num_res_blocks=1, num_channels=10, reward_head_channels=4,
                          fc_reward_layers=[8], output_support_size=21, flatten_output_size_for_reward_head=4 * hw[0] * hw[1],
                          downsample=downsample, lstm_hidden_size=12, norm_type=norm_type)
    x = torch.randn(5, 10, *hw)
    h = torch.zeros(1, 5, 12)
    latent, (h1, c1), vp = net(x, (h, h.clone()))
    assert latent.shape == (5, 8, *hw)
    assert h1.shape == c1.shape == (1, 5, 12)
    assert vp.shape == (5, 21)
    assert torch.allclose(vp, torch.zeros_like(vp))  # last layer starts at zero
    assert isinstance(net.get_dynamic_mean(), float)
    w, mean = net.get_reward_mean()
    assert isinstance(w, np.ndarray) and mean == 0.0


def test_dynamics_network_refuses_bad_flatten_size():
    with pytest.raises(ValueError, match="flatten_output_size_for_reward_head"):
        DynamicsNetwork((3, 4, 4), num_channels=10, reward_head_channels=4, flatten_output_size_for_reward_head=7)


def test_lstm_cell_matches_torch_lstm_and_vmaps():
    torch.manual_seed(0)
    cell = LSTMCell(6, 5)
    ref = nn.LSTMCell(6, 5)
    with torch.no_grad():
        ref.weight_ih.copy_(cell.ih.weight)
        ref.bias_ih.copy_(cell.ih.bias)
        ref.weight_hh.copy_(cell.hh.weight)
        ref.bias_hh.zero_()
    x, h, c = torch.randn(4, 6), torch.randn(4, 5), torch.randn(4, 5)
    h1, c1 = cell(x, (h, c))
    h2, c2 = ref(x, (h, c))
    assert torch.allclose(h1, h2, atol=1e-6) and torch.allclose(c1, c2, atol=1e-6)
    # a population of 3 cells stacked and run under vmap == the loop
    cells = [LSTMCell(6, 5) for _ in range(3)]
    params, buffers = stack_module_state(cells)
    xs = torch.randn(3, 4, 6)
    hs = (torch.zeros(3, 4, 5), torch.zeros(3, 4, 5))

    def run(p, b, x, hidden):
        return functional_call(cells[0], (p, b), (x, hidden))

    vh, vc = vmap(run)(params, buffers, xs, hs)
    for i, cell_i in enumerate(cells):
        lh, lc = cell_i(xs[i], (hs[0][i], hs[1][i]))
        assert torch.allclose(vh[i], lh, atol=1e-6) and torch.allclose(vc[i], lc, atol=1e-6)


class _Unroll(nn.Module):
    """represent -> dynamics -> predict as one forward, so functional_call can stack members."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, obs: torch.Tensor, action: torch.Tensor):
        latent = self.m.represent(obs)
        nxt, _, vp = self.m.dynamics(latent, action, self.m.initial_hidden(obs.shape[0]))
        policy, value = self.m.predict(nxt)
        return vp, policy, value


def test_whole_mlp_model_runs_under_vmap():
    members = [_Unroll(build_model((4,), 2, ARCH, torch.Generator().manual_seed(i))) for i in range(2)]
    for m in members:  # non-zero heads so the comparison is meaningful
        for lin in m.modules():
            if isinstance(lin, nn.Linear):
                nn.init.normal_(lin.weight, std=0.2)
    params, buffers = stack_module_state(members)
    obs, action = torch.randn(2, 3, 4), torch.tensor([0, 1, 1])
    out = vmap(lambda p, b, o: functional_call(members[0], (p, b), (o, action)))(params, buffers, obs)
    for i, m in enumerate(members):
        for got, want in zip(out, m(obs[i], action)):
            assert torch.allclose(got[i], want, atol=1e-5)


def test_lstm_widening_is_function_preserving():
    m = build_model((4,), 2, ARCH, torch.Generator().manual_seed(0))
    nn.init.normal_(m.dynamics_network.fc_reward_head[-1].weight)  # make the head non-trivial
    obs = torch.randn(7, 4)
    a = torch.tensor([0, 1, 0, 1, 1, 0, 1])

    def unroll():
        latent = m.represent(obs)
        hidden = (torch.zeros(7, m.dynamics_network.lstm.hidden_size), torch.zeros(7, m.dynamics_network.lstm.hidden_size))
        outs = []
        for _ in range(3):
            latent, hidden, vp = m.dynamics(latent, a, hidden)
            outs.append(vp)
        return torch.stack(outs)

    before = unroll()
    m.dynamics_network.widen_lstm(8, torch.Generator().manual_seed(1))
    assert m.dynamics_network.lstm.hidden_size == 24
    assert torch.allclose(unroll(), before, atol=1e-6)


def test_conv_model_shapes_and_identity_block():
    arch = EfficientZeroAgent.validate_arch({"variant": "conv", "channels": 8, "proj_size": 16})
    m = build_model((1, 6, 6), 2, arch, torch.Generator().manual_seed(0))
    obs = torch.rand(3, 1, 6, 6)
    latent = m.represent(obs)
    assert latent.shape == (3, 8, 6, 6)
    policy, value = m.predict(latent)
    assert policy.shape == (3, 2) and value.shape == (3, 2 * arch["value_support"] + 1)
    nxt, (h, c), vp = m.dynamics(latent, torch.tensor([0, 1, 1]), m.initial_hidden(3))
    assert nxt.shape == latent.shape and vp.shape == (3, 2 * arch["reward_support"] + 1)
    for module in m.modules():  # make heads non-trivial so the comparison means something
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.1)
    before = m.predict(m.dynamics(m.represent(obs), torch.tensor([0, 1, 1]), m.initial_hidden(3))[0])[1]
    m.add_res_block("representation")
    m.add_res_block("dynamics")
    after = m.predict(m.dynamics(m.represent(obs), torch.tensor([0, 1, 1]), m.initial_hidden(3))[0])[1]
    assert torch.allclose(before, after, atol=1e-6)


def _rng_whose_first_integer_is(value: int, high: int) -> int:
    return next(s for s in range(100) if int(np.random.default_rng(s).integers(high)) == value)


def test_mlp_model_owns_its_architecture_mutations():
    m = build_model((4,), 2, ARCH, torch.Generator().manual_seed(0))
    seed = _rng_whose_first_integer_is(3, 4)  # the fourth choice: widen the value-prefix LSTM
    at_bound = {**ARCH, "max_lstm_hidden_size": ARCH["lstm_hidden_size"]}
    record, change = m.mutate_architecture(np.random.default_rng(seed), 0.5, at_bound, torch.Generator())
    assert record.op == "none" and "lstm_hidden_size" in record.details["reason"] and not change.resized
    record, change = m.mutate_architecture(np.random.default_rng(seed), 0.5, ARCH, torch.Generator())
    step = ARCH["node_step"]
    assert record.op == "widen_lstm" and record.changes == {"lstm_hidden_size": [16, 16 + step]}
    assert m.lstm_hidden_size == m.arch()["lstm_hidden_size"] == 16 + step and change.resized
    assert m.initial_hidden(2)[0].shape == (2, 16 + step)
    seed = _rng_whose_first_integer_is(0, 4)  # the first choice: the representation MLP
    record, _ = m.mutate_architecture(np.random.default_rng(seed), 1.0, ARCH, torch.Generator())
    assert record.details["network"] == "representation" and record.op in ("add_block", "remove_block")


def test_conv_model_owns_its_architecture_mutations():
    arch = EfficientZeroAgent.validate_arch({"variant": "conv", "channels": 4, "proj_size": 8, "num_res_blocks": 1})
    m = build_model((1, 6, 6), 2, arch, torch.Generator().manual_seed(0))
    pinned = {**arch, "min_res_blocks": 1, "max_res_blocks": 1}
    record, change = m.mutate_architecture(np.random.default_rng(0), 0.5, pinned)
    assert record.op == "none" and not change.added and not change.removed
    grown = {**arch, "min_res_blocks": 1, "max_res_blocks": 4}  # at the lower bound: it can only grow
    record, change = m.mutate_architecture(np.random.default_rng(0), 0.5, grown)
    assert record.op == "add_res_block" and change.added
    assert sum(m.arch().values()) == 3
