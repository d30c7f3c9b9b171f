"""Architecture mutations: growth preserves the function; Adam state survives; clones are independent."""

import json

import numpy as np
import pytest
import torch

from evo.agent import AgentContext
from evo.evolvable import ACTIVATIONS, EvolvableMLP, remap_optimizer
from evo.mutation import MUTATIONS, apply_mutation
from evo.spec import MutationSpec
from tests.toy_agent import ToyAgent


def _net(activation: str = "Tanh") -> tuple[EvolvableMLP, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    net = EvolvableMLP(5, 3, width=12, blocks=[10, 14], activation=activation, generator=g)
    return net, torch.randn(32, 5, generator=g)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("op", ["add_block", "widen_block", "widen_trunk"])
def test_growth_is_function_preserving(activation: str, op: str) -> None:
    net, x = _net(activation)
    before = net(x).detach()
    g = torch.Generator().manual_seed(1)
    {"add_block": lambda: net.add_block(1, 9, g), "widen_block": lambda: net.widen_block(0, 7, g),
     "widen_trunk": lambda: net.widen_trunk(5, g)}[op]()
    assert torch.allclose(net(x), before, atol=1e-6, rtol=0)


def test_growth_leaves_new_units_trainable() -> None:
    net, x = _net()
    net.widen_block(0, 4)
    net.add_block(0, 6)
    net(x).pow(2).sum().backward()
    assert net.blocks[1].fc2.weight.grad[:, -4:].abs().sum() > 0  # zero-initialised columns still learn
    assert net.blocks[0].fc2.weight.grad.abs().sum() > 0


def test_adam_state_survives_architecture_changes() -> None:
    net, x = _net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        opt.step()
    w_in_state = {k: v.clone() for k, v in opt.state[net.fc_in.weight].items()}
    untouched = net.blocks[1].fc1.weight
    untouched_state = opt.state[untouched]["exp_avg"].clone()
    remap_optimizer(opt, net.widen_trunk(4))
    remap_optimizer(opt, net.add_block(0, 8))
    new_state = opt.state[net.fc_in.weight]
    assert torch.equal(new_state["exp_avg"][:12], w_in_state["exp_avg"])
    assert torch.equal(new_state["exp_avg"][12:], torch.zeros(4, 5))
    assert int(new_state["step"]) == int(w_in_state["step"]) == 3
    assert torch.equal(opt.state[net.blocks[2].fc1.weight]["exp_avg"][:, :12], untouched_state)
    params = {id(p) for g in opt.param_groups for p in g["params"]}
    assert params == {id(p) for p in net.parameters()}
    opt.zero_grad()
    net(x).pow(2).mean().backward()
    opt.step()  # still a working optimizer


def test_shrinking_keeps_optimizer_consistent() -> None:
    net, x = _net("PReLU")
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    net(x).sum().backward()
    opt.step()
    remap_optimizer(opt, net.narrow_block(1, 6))
    remap_optimizer(opt, net.remove_block(0))
    remap_optimizer(opt, net.set_activation("ELU"))
    assert net.block_sizes == [8]
    assert {id(p) for g in opt.param_groups for p in g["params"]} == {id(p) for p in net.parameters()}
    opt.zero_grad()
    net(x).sum().backward()
    opt.step()


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
