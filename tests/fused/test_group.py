"""Fused training equals the per-member loop: N members trained as one vmapped step and one by
one with torch.optim.Adam(W) + clip_grad_norm_, from the same weights on the same batches,
agree to 1e-10 in float64 — with per-member lr, betas, eps, weight decay, clip norms and
discounts, through an in-place exploit, an empty slot, and a member moving to another group
after an architecture mutation."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from evo.evolvable import EvolvableMLP, load_optimizer_state, optimizer_state, remap_optimizer
from evo.fused import FusedGroup, FusedPopulation, StackedModules, architecture_key, call_method, can_fuse, stack_batches

OBS, ACTIONS = 5, 3


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def td_loss(q_values, batch, discount):
    """A one-step TD loss whose target uses the member's own discount (detached bootstrap)."""
    q = q_values(batch["obs"]).gather(1, batch["action"].unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        nxt = q_values(batch["next_obs"]).max(1).values
    target = batch["reward"] + discount * nxt
    loss_q = ((q - target) ** 2).mean()
    return loss_q, {"loss_q": loss_q}


def fused_td_loss(template: nn.Module):
    """The same loss for one member of a fused group: the module runs on the member's tensors."""
    def loss(params, buffers, batch, scalars):
        return td_loss(lambda x: call_method(template, params, buffers, "forward", x), batch, scalars["discount"])
    return loss


def make_batch(g: torch.Generator, n: int = 16) -> dict[str, torch.Tensor]:
    return {"obs": torch.randn(n, OBS, generator=g, dtype=torch.float64),
            "action": torch.randint(0, ACTIONS, (n,), generator=g),
            "reward": torch.randn(n, generator=g, dtype=torch.float64),
            "next_obs": torch.randn(n, OBS, generator=g, dtype=torch.float64)}


class LoopMember:
    """The reference: one module, one torch optimizer, clip_grad_norm_, its own discount."""

    def __init__(self, module: nn.Module, hp: dict[str, float], adamw: bool) -> None:
        self.module, self.hp = module, dict(hp)
        cls = torch.optim.AdamW if adamw else torch.optim.Adam
        self.opt = cls(module.parameters(), lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                       weight_decay=hp["weight_decay"])

    def step(self, batch) -> float:
        loss, _ = td_loss(self.module, batch, self.hp["discount"])
        self.opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.hp["max_grad_norm"])
        self.opt.step()
        return float(norm)


def member_hparams(i: int) -> dict[str, float]:
    return {"lr": 1e-3 * (1 + i), "beta1": 0.9 - 0.02 * i, "beta2": 0.999 - 0.001 * i, "eps": 1e-8 * (1 + i),
            "weight_decay": 1e-3 * i, "max_grad_norm": [0.5, 1.0, 100.0, 2.0][i % 4], "discount": 0.9 + 0.02 * i}


def settings_of(hp: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in hp.items() if k != "discount"}


def max_diff(group: FusedGroup, slot: int, module: nn.Module) -> float:
    fused = group.read(slot)
    return max(float((a - b).detach().abs().max()) for a, b in zip(fused.parameters(), module.parameters()))


def build_group(template: nn.Module, capacity: int, adamw: bool = False) -> FusedGroup:
    return FusedGroup(template, capacity, fused_td_loss(template), decoupled_weight_decay=adamw,
                      scalars={"discount": 0.99})


@pytest.mark.parametrize("adamw", [False, True])
def test_fused_equals_loop_through_exploit_f64(adamw: bool) -> None:
    N, capacity = 4, 6   # two empty slots: they must neither disturb nor be disturbed
    torch.manual_seed(0)
    modules = [nn.Sequential(nn.Linear(OBS, 32), nn.Tanh(), nn.Linear(32, ACTIONS)).double() for _ in range(N)]
    hps = [member_hparams(i) for i in range(N)]
    loop = [LoopMember(copy.deepcopy(m), hp, adamw) for m, hp in zip(modules, hps)]
    group = build_group(modules[0], capacity, adamw)
    slots = [0, 2, 3, 5]    # not 0..N-1: slots are not positions
    for slot, m, hp in zip(slots, modules, hps):
        group.load(slot, m, scalars={"discount": hp["discount"]}, **settings_of(hp))
    g = torch.Generator().manual_seed(1)
    for t in range(50):
        batches = [make_batch(g) for _ in range(N)]
        if t == 25:  # exploit: member 3 becomes a copy of member 0 (weights, Adam state, settings, discount)
            group.exploit(slots[0], slots[3])
            loop[3] = LoopMember(copy.deepcopy(loop[0].module), hps[0], adamw)
            loop[3].opt.load_state_dict(copy.deepcopy(loop[0].opt.state_dict()))
        out = group.step(stack_batches(dict(zip(slots, batches)), capacity))
        for i, (member, batch) in enumerate(zip(loop, batches)):
            norm = member.step(batch)
            assert abs(float(out["grad_norm"][slots[i]]) - norm) < 1e-10
    for slot, member in zip(slots, loop):
        assert max_diff(group, slot, member.module) < 1e-10
        state = group.optimizer_state(slot)
        name, p = next(iter(member.module.named_parameters()))
        assert float(state[name]["step"]) == float(member.opt.state[p]["step"]) == 50.0
        assert float((state[name]["exp_avg_sq"] - member.opt.state[p]["exp_avg_sq"]).abs().max()) < 1e-10
    assert not bool(group.active[1]) and not bool(group.active[4])


def test_member_moves_group_after_widening_with_state_carried_f64() -> None:
    """Architecture mutation: read out of group A, widen (function-preserving, Adam state remapped),
    place into group B; it continues exactly like its looped twin."""
    torch.manual_seed(3)
    hp = member_hparams(1)
    modules = [EvolvableMLP(OBS, ACTIONS, width=16, blocks=[16]).double() for _ in range(2)]
    loop = [LoopMember(copy.deepcopy(m), hp, False) for m in modules]

    factory = lambda template, capacity: build_group(template, capacity)
    pop = FusedPopulation(factory, capacity=2)
    for i, m in enumerate(modules):
        pop.place(i, m, scalars={"discount": hp["discount"]}, **settings_of(hp))
    g = torch.Generator().manual_seed(4)

    def run(steps: int) -> None:
        for _ in range(steps):
            batches = [make_batch(g) for _ in range(2)]
            by_group: dict[str, dict[int, dict]] = {}
            for i, b in enumerate(batches):
                group, slot = pop.locate(i)
                by_group.setdefault(group.key, {})[slot] = b
            for key, bs in by_group.items():
                group = pop.groups[key]
                group.step(stack_batches(bs, group.capacity))
            for member, b in zip(loop, batches):
                member.step(b)

    run(10)
    # member 1 widens its trunk: out of its group, mutate, into the group of its new architecture
    group, slot = pop.locate(1)
    module = group.read(slot, copy.deepcopy(modules[1]))
    saved = {"groups": [{"lr": hp["lr"]}], "state": group.optimizer_state(slot)}
    opt = torch.optim.Adam(module.parameters(), lr=hp["lr"])
    load_optimizer_state(opt, module, saved)
    remap_optimizer(opt, module.widen_trunk(8, torch.Generator().manual_seed(5)))
    remap_optimizer(loop[1].opt, loop[1].module.widen_trunk(8, torch.Generator().manual_seed(5)))
    old_key = group.key
    new_group, new_slot = pop.place(1, module, optimizer_state(opt, module)["state"],
                                    scalars={"discount": hp["discount"]}, **settings_of(hp))
    assert new_group.key != old_key and not bool(pop.groups[old_key].active[slot])
    assert len(pop.groups) == 2
    run(10)
    for i, member in enumerate(loop):
        group, slot = pop.locate(i)
        assert max_diff(group, slot, member.module) < 1e-10


def test_architecture_key_and_batchnorm_fallback() -> None:
    a = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    assert architecture_key(a) == architecture_key(copy.deepcopy(a))
    assert architecture_key(a) != architecture_key(nn.Sequential(nn.Linear(3, 5), nn.ReLU()))
    assert architecture_key(a) != architecture_key(nn.Sequential(nn.Linear(3, 4), nn.Tanh()))
    assert architecture_key(a, 32) != architecture_key(a, 64)
    bn = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    with pytest.warns(UserWarning, match="BatchNorm"):
        assert not can_fuse(bn)
    with pytest.raises(ValueError, match="BatchNorm"):
        FusedGroup(bn, 2, lambda *a: None)
    with pytest.raises(ValueError, match="does not fit"):
        StackedModules(a, 2).load(0, nn.Sequential(nn.Linear(3, 5), nn.ReLU()))


def test_vmapped_inference_matches_each_member() -> None:
    torch.manual_seed(5)
    modules = [nn.Sequential(nn.Linear(OBS, 8), nn.GELU(), nn.Linear(8, 2)).double() for _ in range(3)]
    stack = StackedModules(modules[0], 3)
    for i, m in enumerate(modules):
        stack.load(i, m)
    x = torch.randn(3, 7, OBS, dtype=torch.float64)
    out = stack.call("forward", x)
    for i, m in enumerate(modules):
        np.testing.assert_allclose(out[i].detach().numpy(), m(x[i]).detach().numpy(), rtol=0, atol=1e-12)
    shared = stack.call("forward", x[0], in_dims=(None,))
    assert shared.shape == (3, 7, 2)
