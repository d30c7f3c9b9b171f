"""The learner's loss is a pure function of (parameters, buffers, batch, loss weights): it equals the
step-by-step module computation bit for bit, and runs under torch.func.vmap over stacked members."""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, stack_module_state, vmap

from agents.efficientzero import learner
from agents.efficientzero.support import support_to_scalar
from tests.efficientzero.test_agent import make

WEIGHTS = {"value_weight": 0.25, "policy_weight": 1.0, "value_prefix_weight": 1.0, "consistency_weight": 2.0}


def module_loss(model, batch, hp):
    """The loss as the agent computed it before the split (methods called on the module, losses
    accumulated while unrolling): the reference the functional loss must reproduce exactly."""
    obs, actions = batch["obs"], batch["actions"]
    B, K = actions.shape
    with torch.no_grad():
        proj_target = model.project(model.represent(obs[:, 1 : K + 1].reshape(B * K, *obs.shape[2:]))).reshape(B, K, -1)
    vt, pt, pi, valid, mask = (batch[k] for k in ("value_target", "value_prefix_target", "policy_target", "valid", "mask"))
    latent = model.represent(obs[:, 0])
    policy_logits, value_logits = model.predict(latent)
    root_value = support_to_scalar(value_logits.detach(), model.value_support)
    loss_value = -(vt[:, 0] * F.log_softmax(value_logits, -1)).sum(-1) * valid[:, 0]
    loss_policy = -(pi[:, 0] * F.log_softmax(policy_logits, -1)).sum(-1) * valid[:, 0]
    loss_prefix, loss_consistency = torch.zeros(B), torch.zeros(B)
    hidden = model.initial_hidden(B)
    for k in range(1, K + 1):
        latent, hidden, prefix_logits = model.dynamics(latent, actions[:, k - 1], hidden)
        latent.register_hook(lambda g: g * 0.5)
        policy_logits, value_logits = model.predict(latent)
        loss_prefix = loss_prefix - (pt[:, k - 1] * F.log_softmax(prefix_logits, -1)).sum(-1) * mask[:, k - 1]
        loss_value = loss_value - (vt[:, k] * F.log_softmax(value_logits, -1)).sum(-1) * valid[:, k]
        loss_policy = loss_policy - (pi[:, k] * F.log_softmax(policy_logits, -1)).sum(-1) * valid[:, k]
        cos = F.cosine_similarity(model.project_predict(model.project(latent)), proj_target[:, k - 1], dim=-1)
        loss_consistency = loss_consistency - cos * valid[:, k]
        if k % hp["lstm_horizon_len"] == 0:
            hidden = model.initial_hidden(B)
    w = batch["weights"]
    terms = {"loss_value": (w * loss_value).mean(), "loss_policy": (w * loss_policy).mean(),
             "loss_value_prefix": (w * loss_prefix).mean(), "loss_consistency": (w * loss_consistency).mean()}
    total = sum(hp[learner.LOSS_WEIGHTS[name]] * terms[name] for name in learner.LOSS_NAMES)
    return {**terms, "loss_total": total, "root_value": root_value}


@pytest.fixture(scope="module")
def trained():
    """Two members (different weights) sharing one store after a little self-play, and a batch each."""
    a = make(seed=0, index=0, hp={"lstm_horizon_len": 2})
    b = make(seed=1, index=1, hp={"lstm_horizon_len": 2}, replay=a.replay)
    a.train(48)
    b.train(48)
    for agent in (a, b):  # non-zero output layers, so every term has a gradient worth comparing
        for mod in agent.model.modules():
            if isinstance(mod, torch.nn.Linear):
                torch.nn.init.normal_(mod.weight, std=0.2, generator=torch.Generator().manual_seed(agent.index))
    batches = [learner.sample_batch(m.replay, m.target_model, m.hparams, m.rng) for m in (a, b)]
    return (a, b), batches


def _gradients(model, terms):
    model.zero_grad(set_to_none=True)
    terms["loss_total"].backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_functional_loss_equals_the_module_loss_bit_for_bit(trained):
    """The baseline path, bit for bit (the fast path equals it to rounding: test_fast_path.py)."""
    (a, _), (batch, _) = trained
    hp = {**WEIGHTS, "lstm_horizon_len": 2}
    model = a.model.train()
    want = module_loss(model, batch.tensors, hp)
    want_grads = _gradients(model, want)
    with learner.use_path("baseline"):
        got = learner.loss_terms(model, dict(model.named_parameters()), dict(model.named_buffers()), batch.tensors, hp)
    got_grads = _gradients(model, got)
    assert set(got) == set(want) == {*learner.LOSS_NAMES, "loss_total", "root_value"}
    for name in want:
        assert torch.equal(got[name], want[name]), name
    for name in want_grads:
        assert torch.equal(got_grads[name], want_grads[name]), name


def test_functional_loss_uses_the_given_parameters(trained):
    (a, b), (batch, _) = trained
    hp = {**WEIGHTS, "lstm_horizon_len": 2}
    own = learner.loss_terms(b.model, dict(b.model.named_parameters()), {}, batch.tensors, hp)
    borrowed = learner.loss_terms(a.model, {k: v.detach() for k, v in b.model.named_parameters()}, {}, batch.tensors, hp)
    for name in learner.LOSS_NAMES + ("loss_total",):
        assert torch.equal(own[name], borrowed[name]), name
    mine = learner.loss_terms(a.model, dict(a.model.named_parameters()), {}, batch.tensors, hp)
    assert not torch.equal(mine["loss_total"], own["loss_total"])


def test_loss_and_gradient_vmap_over_stacked_members(trained):
    members, batches = trained
    models = [m.model.train() for m in members]
    params, buffers = stack_module_state(models)
    stacked = {k: torch.stack([b.tensors[k] for b in batches]) for k in batches[0].tensors}
    # per-member loss weights as tensors: what a fused trainer evolves without recompiling
    per_member = [dict(WEIGHTS), {**WEIGHTS, "value_weight": 0.7, "consistency_weight": 0.5}]
    weights = {k: torch.tensor([w[k] for w in per_member]) for k in WEIGHTS}

    def loss(p, b, batch, w):
        return learner.loss_terms(models[0], p, b, batch, {**w, "lstm_horizon_len": 2})

    def total(p, b, batch, w):
        return loss(p, b, batch, w)["loss_total"]

    terms = vmap(loss)(params, buffers, stacked, weights)
    grads = vmap(grad(total))(params, buffers, stacked, weights)
    for i, (model, batch) in enumerate(zip(models, batches)):
        want = learner.loss_terms(model, dict(model.named_parameters()), {}, batch.tensors,
                                  {**per_member[i], "lstm_horizon_len": 2})
        want_grads = _gradients(model, want)
        for name in learner.LOSS_NAMES + ("loss_total", "root_value"):
            torch.testing.assert_close(terms[name][i], want[name].detach(), rtol=1e-5, atol=1e-6)
        for name, g in want_grads.items():
            torch.testing.assert_close(grads[name][i], g, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(terms["loss_total"][0], terms["loss_total"][1])


class RecordingReplay:
    """The real store, with the priority updates it receives recorded."""

    def __init__(self, store):
        self.store, self.priority_updates = store, []

    def update_priorities(self, keys, priorities):
        self.priority_updates.append((np.asarray(keys).copy(), np.asarray(priorities).copy()))
        return self.store.update_priorities(keys, priorities)


def test_update_steps_adam_syncs_the_target_and_reprioritises(trained):
    (a, _), _ = trained
    a = a.clone(5)
    replay = RecordingReplay(a.replay)
    hp = {**a.hparams, "target_update_interval": 3}
    for step in (2, 3):
        before = {k: v.clone() for k, v in a.model.state_dict().items()}
        batch = learner.sample_batch(a.replay, a.target_model, a.hparams, a.rng)
        a.model.train()
        root_value = learner.loss_terms(a.model, dict(a.model.named_parameters()), {}, batch.tensors, hp)["root_value"]
        metrics = learner.update(a.model, a.target_model, a.optimizer, replay, batch, hp, step=step)
        assert set(metrics) == {*learner.LOSS_NAMES, "loss_total", "grad_norm", "target_value_mean"}
        assert all(np.isfinite(v) for v in metrics.values())
        after = a.model.state_dict()
        assert all(not torch.equal(before[k], after[k]) for k in before)  # Adam moved every tensor
        assert not a.model.training  # left in eval mode for the search
        synced = all(torch.equal(a.target_model.state_dict()[k], v) for k, v in after.items())
        assert synced == (step == 3)  # every target_update_interval updates
        keys, priorities = replay.priority_updates[-1]
        assert np.array_equal(keys, batch.keys)
        assert np.array_equal(priorities, np.abs(root_value.numpy() - batch.root_target) + 1e-6)


def test_fused_group_trains_members_as_their_own_updates_would(trained):
    from evo.evolvable import optimizer_state
    from evo.fused import FusedGroup, stack_batches

    members = [m.clone(10 + i) for i, m in enumerate(trained[0])]
    batches = trained[1]
    per_member = [dict(WEIGHTS), {**WEIGHTS, "value_weight": 0.7, "consistency_weight": 0.5}]
    lrs = [3e-3, 1e-3]
    template = members[0].model.train()
    group = FusedGroup(template, 2, learner.fused_loss(template, 2), scalars=WEIGHTS)
    for slot, m in enumerate(members):
        m.model.train()
        group.load(slot, m.model, optimizer_state(m.optimizer, m.model)["state"], scalars=per_member[slot],
                   lr=lrs[slot], weight_decay=m.hparams["weight_decay"], max_grad_norm=m.hparams["grad_clip"])
    terms = group.step(stack_batches({i: b.tensors for i, b in enumerate(batches)}, 2))
    for slot, (m, batch) in enumerate(zip(members, batches)):
        m.set_hparams({"lr": lrs[slot], **per_member[slot]})
        metrics = learner.update(m.model, m.target_model, m.optimizer, m.replay, batch, m.hparams, step=1)
        assert np.isclose(float(terms["loss_total"][slot]), metrics["loss_total"], rtol=1e-5)
        assert np.isclose(float(terms["grad_norm"][slot]), metrics["grad_norm"], rtol=1e-4)
        fused = dict(group.read(slot).named_parameters())
        for name, p in m.model.named_parameters():
            torch.testing.assert_close(fused[name], p.detach(), rtol=1e-4, atol=1e-6)


def _policy_logits(model, batch):
    """The predicted policy logits [K+1, B, A] along the unroll (no gradient)."""
    with torch.no_grad():
        return model(batch["obs"], batch["actions"], 2, stacked=True).policy_logits


@pytest.mark.parametrize("path", ["fast", "baseline"])
def test_policy_entropy_bonus_is_the_masked_negative_entropy_and_free_at_zero(trained, path):
    """`policy_entropy_weight` adds w * mean_b(weight_b * sum_k valid_bk * sum_a p log p) to the total;
    at 0.0 nothing is computed or reported and the other terms and the total are exactly what they were."""
    (a, _), (batch, _) = trained
    model, t = a.model.train(), batch.tensors
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    with learner.use_path(path):
        plain = learner.loss_terms(model, params, buffers, t, {**WEIGHTS, "lstm_horizon_len": 2})
        zero = learner.loss_terms(model, params, buffers, t, {**WEIGHTS, "policy_entropy_weight": 0.0, "lstm_horizon_len": 2})
        bonus = learner.loss_terms(model, params, buffers, t, {**WEIGHTS, "policy_entropy_weight": 0.1, "lstm_horizon_len": 2})
    assert "loss_policy_entropy" not in zero and "loss_policy_entropy" in bonus
    for name in (*learner.LOSS_NAMES, "loss_total"):
        assert torch.equal(plain[name], zero[name]), name
    for name in learner.LOSS_NAMES:
        assert torch.equal(plain[name], bonus[name]), name
    logits = _policy_logits(model, t)
    log_p = F.log_softmax(logits, -1)
    per_window = ((log_p.exp() * log_p).sum(-1) * t["valid"].transpose(0, 1)).sum(0)
    want = (t["weights"] * per_window).mean()
    torch.testing.assert_close(bonus["loss_policy_entropy"].detach(), want, rtol=1e-5, atol=1e-6)
    assert float(want) < 0  # a negative entropy: minimising it spreads the policy
    torch.testing.assert_close(bonus["loss_total"], plain["loss_total"] + 0.1 * bonus["loss_policy_entropy"])


class _NoPriorities:
    def update_priorities(self, keys, priorities):  # the fixture's store keeps its priorities
        pass


def test_policy_entropy_bonus_spreads_the_learned_policy(trained):
    """Trained on the same batch, whose policy targets all name action 0 (the collapse the bonus is
    for), a member with the bonus keeps a higher policy entropy than one without, and reports the
    term; at weight 0 the update reports exactly the four terms."""
    (a, _), (batch, _) = trained
    target = torch.zeros_like(batch.tensors["policy_target"])
    target[..., 0] = 1.0
    batch = dataclasses.replace(batch, tensors={**batch.tensors, "policy_target": target})
    entropies = {}
    for weight in (0.0, 1.0):
        member = make(seed=0, index=0, hp={"lstm_horizon_len": 2, "policy_entropy_weight": weight})
        member.model.load_state_dict(a.model.state_dict())
        member.target_model.load_state_dict(a.model.state_dict())
        member.optimizer = torch.optim.Adam(member.model.parameters(), lr=1e-2)
        for step in range(1, 31):
            metrics = learner.update(member.model, member.target_model, member.optimizer, _NoPriorities(), batch,
                                     member.hparams, step)
        assert ("loss_policy_entropy" in metrics) == (weight != 0)
        log_p = F.log_softmax(_policy_logits(member.model, batch.tensors), -1)
        entropies[weight] = float(-(log_p.exp() * log_p).sum(-1).mean())
    assert entropies[1.0] > entropies[0.0] + 0.05, entropies
