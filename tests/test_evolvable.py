"""Architecture mutations: growth preserves the function; Adam state survives; clones are independent."""

import json

import numpy as np
import pytest
import torch

from evo.agent import AgentContext
from evo.evolvable import ACTIVATIONS, EvolvableMLP, remap_optimizer
from evo.mutation import MUTATIONS, apply_mutation
from evo.spec import MutationSpec
from tests.optimizer_carry import OptimizerSnapshot
from tests.toy_agent import ToyAgent


def _net(activation: str = "Tanh") -> tuple[EvolvableMLP, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    net = EvolvableMLP(5, 3, width=12, blocks=[10, 14], activation=activation, generator=g)
    return net, torch.randn(32, 5, generator=g)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_adding_a_block_is_bit_exact(activation: str) -> None:
    net, x = _net(activation)
    before = net(x).detach()
    net.add_block(1, 9, torch.Generator().manual_seed(1))
    assert torch.equal(net(x), before)  # a zero residual branch adds exactly 0.0


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("op", ["widen_block", "widen_trunk"])
def test_widening_preserves_the_function_to_float32_rounding(activation: str, op: str) -> None:
    """Widening appends zero terms to dot products; a longer float32 sum may round differently
    (measured up to 2.4e-7 here), so widening is exact in real arithmetic, within 1e-6 in float32."""
    net, x = _net(activation)
    before = net(x).detach()
    g = torch.Generator().manual_seed(1)
    {"widen_block": lambda: net.widen_block(0, 7, g), "widen_trunk": lambda: net.widen_trunk(5, g)}[op]()
    assert torch.allclose(net(x), before, atol=1e-6, rtol=0)


def test_growth_leaves_new_units_trainable() -> None:
    net, x = _net()
    net.widen_block(0, 4)
    net.add_block(0, 6)
    net(x).pow(2).sum().backward()
    assert net.blocks[1].fc2.weight.grad[:, -4:].abs().sum() > 0  # zero-initialised columns still learn
    assert net.blocks[0].fc2.weight.grad.abs().sum() > 0


_OPS = {
    "add_block": lambda net: net.add_block(0, 8),
    "widen_block": lambda net: net.widen_block(1, 4),
    "widen_trunk": lambda net: net.widen_trunk(4),
    "narrow_block": lambda net: net.narrow_block(1, 6),
    "remove_block": lambda net: net.remove_block(0),
    "set_activation": lambda net: net.set_activation("PReLU"),
}


@pytest.mark.parametrize("op", sorted(_OPS))
def test_adam_state_survives_architecture_changes(op: str) -> None:
    """exp_avg, exp_avg_sq and step of every surviving tensor, and of every resized one on its overlap."""
    net, x = _net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        opt.step()
    before = OptimizerSnapshot.take([net], opt)
    remap_optimizer(opt, _OPS[op](net))
    counts = before.assert_carried([net], opt)
    assert counts["kept"] > 0 and counts["with_state"] > 0
    assert counts[{"add_block": "added", "remove_block": "removed", "set_activation": "added"}.get(op, "resized")] > 0
    opt.zero_grad()
    net(x).pow(2).mean().backward()
    opt.step()  # still a working optimizer


def test_resized_moments_sit_on_the_old_units() -> None:
    """The overlap spelled out for one case: widened trunk rows keep their moments, new rows start at zero."""
    net, x = _net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    net(x).pow(2).mean().backward()
    opt.step()
    old = {k: v.clone() for k, v in opt.state[net.fc_in.weight].items()}
    remap_optimizer(opt, net.widen_trunk(4))
    new = opt.state[net.fc_in.weight]
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(new[key][:12], old[key]) and torch.equal(new[key][12:], torch.zeros(4, 5))
    assert torch.equal(new["step"], old["step"])


def test_mutate_respects_bounds_and_records_are_json() -> None:
    net, x = _net()
    rng = np.random.default_rng(0)
    bounds = {"min_blocks": 1, "max_blocks": 3, "min_hidden": 8, "max_hidden": 32, "max_width": 28, "node_step": 8}
    for _ in range(60):
        change, record = net.mutate(rng, 0.5, bounds)
        json.dumps(record.to_json())
        assert 1 <= len(net.blocks) <= 3
        assert all(8 <= h <= 32 for h in net.block_sizes) and net.width <= 28
        assert net(x).shape == (32, 3)


def _toy(index: int = 0) -> ToyAgent:
    hp = {k: v.value for k, v in ToyAgent.default_hparams().items()}
    return ToyAgent.create(ToyAgent.default_arch(), hp, seed=3, index=index,
                           context=AgentContext(task=ToyAgent.validate_task({})))


def test_clone_is_independent_of_parent() -> None:
    parent = _toy()
    parent.train(5)
    before = {k: v.clone() for k, v in parent.net.state_dict().items()}
    opt_before = parent.opt.state_dict()["state"][0]["exp_avg"].clone()
    child = parent.clone(7)
    assert child.index == 7 and parent.index == 0
    # the clone carries optimizer state, not a fresh optimizer
    assert torch.equal(child.opt.state_dict()["state"][0]["exp_avg"], opt_before)
    spec = MutationSpec()
    rng = np.random.default_rng(0)
    for kind in MUTATIONS:
        MUTATIONS[kind](child, spec, dict(ToyAgent.default_hparams().items()), rng)
    child.train(5)
    child.set_hparams({"lr": 0.02})
    for k, v in parent.net.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert torch.equal(parent.opt.state_dict()["state"][0]["exp_avg"], opt_before)
    assert parent.opt.param_groups[0]["lr"] == ToyAgent.default_hparams()["lr"].value


def test_clone_continues_exactly_like_the_parent() -> None:
    parent = _toy()
    parent.train(3)
    child = parent.clone(1)
    parent.train(4)
    child.train(4)
    for (k, a), b in zip(parent.net.state_dict().items(), child.net.state_dict().values()):
        assert torch.equal(a, b), k


def test_apply_mutation_records_kind_and_is_seeded() -> None:
    records = []
    for _ in range(2):
        agent = _toy()
        rng = np.random.default_rng(5)
        records.append([apply_mutation(agent, MutationSpec(activation=0.2), ToyAgent.default_hparams(), rng)
                        for _ in range(10)])
    assert records[0] == records[1]
    assert {r.kind for r in records[0]} <= set(MUTATIONS)
    json.dumps([r.to_json() for r in records[0]])
