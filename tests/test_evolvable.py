"""Architecture mutations: growth preserves the function; Adam state survives; clones are independent."""

import json

import numpy as np
import pytest
import torch

from evo.agent import AgentContext
from evo.evolvable import ACTIVATIONS, EvolvableMLP, remap_optimizer
from evo.mutation import MUTATIONS, apply_mutation
from evo.spec import MutationSpec
from tests.optimizer_carry import OptimizerSnapshot, clear_optimizer_state, zero_second_moments
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


def _adam_after_steps(net: torch.nn.Module, x: torch.Tensor, steps: int) -> torch.optim.Adam:
    """An Adam optimizer of `net` with `steps` steps taken (so every parameter has state to carry)."""
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        opt.step()
    return opt


@pytest.mark.parametrize("op", sorted(_OPS))
def test_adam_state_survives_architecture_changes(op: str) -> None:
    """exp_avg, exp_avg_sq and step of every surviving tensor, and of every resized one on its overlap."""
    net, x = _net()
    opt = _adam_after_steps(net, x, 3)
    before = OptimizerSnapshot.take([net], opt)
    remap_optimizer(opt, _OPS[op](net))
    counts = before.assert_carried([net], opt)
    assert counts["kept"] > 0 and counts["with_state"] > 0
    assert counts[{"add_block": "added", "remove_block": "removed", "set_activation": "added"}.get(op, "resized")] > 0
    opt.zero_grad()
    net(x).pow(2).mean().backward()
    opt.step()  # still a working optimizer


@pytest.mark.parametrize("mutant", [clear_optimizer_state, zero_second_moments])
@pytest.mark.parametrize("op", ["add_block", "widen_trunk", "narrow_block"])
def test_the_check_catches_a_restarted_optimizer(op: str, mutant) -> None:
    """The check above fails when the optimizer is rebuilt (AgileRL's way) or its second moments restart."""
    from types import SimpleNamespace

    net, x = _net()
    opt = _adam_after_steps(net, x, 2)
    before = OptimizerSnapshot.take([net], opt)
    remap_optimizer(opt, _OPS[op](net))
    mutant(SimpleNamespace(optimizers=lambda: [opt]))
    with pytest.raises(AssertionError, match="^(kept|resized) "):
        before.assert_carried([net], opt)


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


# ---- pieces the mutation tests above do not pin down -------------------------------------------------

def test_an_unknown_activation_is_refused_with_the_known_ones() -> None:
    from evo.evolvable import make_activation

    with pytest.raises(ValueError, match=r"^activation: expected one of \['ELU', .*\], found 'Swish'$"):
        make_activation("Swish")


def test_arch_reports_the_current_shape() -> None:
    net, _ = _net()
    net.widen_trunk(4)
    net.add_block(2, 5)
    net.set_activation("GELU")
    assert net.arch() == {"width": 16, "blocks": [10, 14, 5], "activation": "GELU"}
    assert net.fc_in.out_features == 16 and net.blocks[2].fc1.in_features == 16 and net.fc_out.in_features == 16


def test_a_seeded_build_leaves_the_global_torch_stream_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    EvolvableMLP(5, 3, 8, [8], generator=torch.Generator().manual_seed(0))
    assert torch.equal(torch.rand(3), expected)
    a = EvolvableMLP(5, 3, 8, [8], generator=torch.Generator().manual_seed(4))
    b = EvolvableMLP(5, 3, 8, [8], generator=torch.Generator().manual_seed(4))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_new_units_get_pytorch_default_scale_from_the_generator() -> None:
    net, _ = _net()
    net.widen_block(0, 200, torch.Generator().manual_seed(5))
    new_rows = net.blocks[0].fc1.weight[10:].detach()
    bound = 1 / 12 ** 0.5  # fan-in = trunk width
    assert new_rows.abs().max() <= bound and new_rows.abs().max() > 0.9 * bound
    twin, _ = _net()
    twin.widen_block(0, 200, torch.Generator().manual_seed(5))
    assert torch.equal(twin.blocks[0].fc1.weight, net.blocks[0].fc1.weight)


def test_narrowing_keeps_the_units_with_the_largest_outgoing_weights() -> None:
    net, x = _net()
    block = net.blocks[0]
    with torch.no_grad():
        block.fc2.weight.mul_(0.01)
        block.fc2.weight[:, [1, 4, 7]] *= 1000.0  # the three units that matter, kept in their order
    w1 = block.fc1.weight.detach()[[1, 4, 7]].clone()
    net.narrow_block(0, 7)
    assert net.block_sizes[0] == 3 and torch.equal(net.blocks[0].fc1.weight, w1)


def test_mutate_adds_blocks_of_the_trunk_width_clipped_to_the_hidden_bounds() -> None:
    net, _ = _net()  # width 12
    rng = np.random.default_rng(0)
    _, record = net.mutate(rng, 1.0, {"min_blocks": 2, "max_blocks": 3, "min_hidden": 20, "max_hidden": 40})
    assert record.op == "add_block" and record.details["hidden"] == 20 and record.function_preserving
    assert record.changes == {"blocks": [2, 3]} and net.block_sizes[record.details["position"]] == 20


def test_mutate_removes_the_block_that_contributes_least() -> None:
    net, x = _net()
    with torch.no_grad():
        net.blocks[1].fc2.weight.mul_(1e-3)
    _, record = net.mutate(np.random.default_rng(0), 1.0, {"min_blocks": 0, "max_blocks": 2})  # at max: remove
    assert record.op == "remove_block" and record.details == {"position": 1} and record.function_preserving is False
    assert net.block_sizes == [10]
    net.add_block(0, 4)  # a fresh block has a zero branch: removing it is exact, and says so
    before = net(x).detach()
    _, record = net.mutate(np.random.default_rng(0), 1.0, {"min_blocks": 0, "max_blocks": 2})
    assert record.details == {"position": 0} and record.function_preserving is True
    assert torch.equal(net(x), before)


def test_mutate_grows_twice_as_often_as_it_shrinks() -> None:
    rng = np.random.default_rng(0)
    ops = []
    for _ in range(600):
        net, _ = _net()
        ops.append(net.mutate(rng, 1.0, {"min_blocks": 0, "max_blocks": 4})[1].op)
    assert abs(ops.count("add_block") / len(ops) - 2 / 3) < 0.05


@pytest.mark.parametrize("new_layer_prob, ops", [(0.0, {"widen_trunk", "widen_block", "narrow_block"}),
                                                 (1.0, {"add_block", "remove_block"})])
def test_new_layer_probability_picks_layer_or_node_mutations(new_layer_prob, ops) -> None:
    rng = np.random.default_rng(1)
    net, _ = _net()
    seen = {net.mutate(rng, new_layer_prob, {"min_blocks": 1, "max_blocks": 3})[1].op for _ in range(40)}
    assert seen <= ops and len(seen) >= 2


def test_mutate_at_its_bounds_changes_nothing_and_says_why() -> None:
    net, x = _net()  # width 12, blocks [10, 14]
    before = net(x).detach()
    change, record = net.mutate(np.random.default_rng(0), 1.0, {"min_blocks": 2, "max_blocks": 2})
    assert record.details == {"reason": "block count at its bounds"} and not (change.added or change.removed)
    bounds = {"max_width": 12, "min_hidden": 11, "max_hidden": 13, "node_step": 4}
    change, record = net.mutate(np.random.default_rng(0), 0.0, bounds)
    assert record.details == {"reason": "widths at their bounds"} and not change.resized
    assert torch.equal(net(x), before)


def test_a_step_that_lands_exactly_on_a_bound_is_allowed() -> None:
    """widen when width + step == max_width or hidden + step == max_hidden; narrow when hidden - step == min_hidden."""
    seen = set()
    for seed in range(30):
        net, _ = _net()  # width 12, blocks [10, 14]
        _, record = net.mutate(np.random.default_rng(seed), 0.0,
                               {"max_width": 16, "min_hidden": 10, "max_hidden": 14, "node_step": 4})
        seen.add((record.op, json.dumps(record.changes)))
    assert seen == {("widen_trunk", '{"width": [12, 16]}'), ("narrow_block", '{"block1.hidden": [14, 10]}'),
                    ("widen_block", '{"block0.hidden": [10, 14]}')}


def test_optimizer_state_by_name_restores_into_a_rebuilt_module() -> None:
    from evo.evolvable import load_optimizer_state, optimizer_state

    net, x = _net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2, betas=(0.8, 0.9))
    net(x).pow(2).mean().backward()
    opt.step()
    remap_optimizer(opt, net.add_block(0, 6))  # parameter order now differs from a fresh build's
    saved = json.loads(json.dumps({"groups": optimizer_state(opt, net)["groups"]}))["groups"]
    assert saved[0]["betas"] == [0.8, 0.9]  # JSON-able
    state = optimizer_state(opt, net)
    rebuilt = EvolvableMLP(5, 3, 12, net.block_sizes, "Tanh")
    rebuilt.load_state_dict(net.state_dict())
    opt2 = torch.optim.Adam(rebuilt.parameters(), lr=1.0)
    load_optimizer_state(opt2, rebuilt, state)
    assert opt2.param_groups[0]["lr"] == 1e-2 and opt2.param_groups[0]["betas"] == (0.8, 0.9)
    for name, p in net.named_parameters():
        q = dict(rebuilt.named_parameters())[name]
        assert set(opt.state[p]) == set(opt2.state[q])
        for key, value in opt.state[p].items():
            assert torch.equal(opt2.state[q][key], value) and opt2.state[q][key] is not value
    with pytest.raises(ValueError, match=r"parameter 'blocks\.9\.fc1\.weight' is not in the module"):
        load_optimizer_state(opt2, rebuilt, {"groups": state["groups"], "state": {"blocks.9.fc1.weight": {}}})


def test_remap_moves_added_parameters_into_the_chosen_group_and_drops_removed_state() -> None:
    net, x = _net()
    head = list(net.fc_out.parameters())
    opt = torch.optim.Adam([{"params": [p for p in net.parameters() if all(p is not h for h in head)]},
                            {"params": head, "lr": 0.5}], lr=1e-2)
    net(x).pow(2).mean().backward()
    opt.step()
    removed = list(net.blocks[0].parameters())
    remap_optimizer(opt, net.remove_block(0))
    assert not any(p in opt.state for p in removed)
    assert not any(p is r for g in opt.param_groups for p in g["params"] for r in removed)
    added = net.add_block(0, 4)
    remap_optimizer(opt, added, group=1)
    assert all(any(p is a for p in opt.param_groups[1]["params"]) for a in added.added)
    assert not any(a in opt.state for a in added.added)  # fresh state: Adam makes it on the next step


def test_a_resized_parameter_without_state_stays_without() -> None:
    net, _ = _net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)  # never stepped: no state yet
    remap_optimizer(opt, net.widen_block(0, 4))
    assert len(opt.state) == 0
    assert any(p is net.blocks[0].fc1.weight for p in opt.param_groups[0]["params"])


def test_a_seeded_build_depends_on_its_generator_only() -> None:
    torch.manual_seed(1)
    a = EvolvableMLP(5, 3, 8, [8], generator=torch.Generator().manual_seed(4))
    torch.manual_seed(2)
    b = EvolvableMLP(5, 3, 8, [8], generator=torch.Generator().manual_seed(4))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_saved_optimizer_state_is_a_copy_with_json_groups() -> None:
    from evo.evolvable import load_optimizer_state, optimizer_state

    net, x = _net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2, betas=(0.8, 0.9))
    for _ in range(2):
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        opt.step()
    saved = optimizer_state(opt, net)
    assert saved["groups"][0]["betas"] == [0.8, 0.9] and isinstance(saved["groups"][0]["betas"], list)
    frozen = {n: {k: v.clone() for k, v in st.items()} for n, st in saved["state"].items()}
    opt.zero_grad()
    net(x).pow(2).mean().backward()
    opt.step()  # training on must not reach into what was saved
    for name, st in saved["state"].items():
        assert all(torch.equal(v, frozen[name][k]) for k, v in st.items()), name
    opt2 = torch.optim.Adam(net.parameters(), lr=1.0)
    load_optimizer_state(opt2, net, saved)
    name, p = next(iter(net.named_parameters()))
    assert all(opt2.state[p][k] is not v for k, v in saved["state"][name].items())  # loading copies too


def test_removing_parameters_that_never_had_state_is_fine() -> None:
    net, _ = _net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)  # never stepped
    remap_optimizer(opt, net.remove_block(0))
    assert len(opt.param_groups[0]["params"]) == len(list(net.parameters()))
