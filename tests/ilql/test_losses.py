"""ILQL loss terms against values computed by hand on tiny tensors."""

import math

import torch

from agents.ilql.losses import (
    ILQLLossConfig,
    awac_loss,
    awac_weights,
    cql_loss,
    dm_loss,
    expectile_loss,
    ilql_loss,
    q_loss,
    td_target,
)


def test_td_target_respects_terminals():
    rewards = torch.tensor([[0.0, 1.0]])
    v = torch.tensor([[5.0, 2.0, 3.0]])  # V(s0), V(s1), V(s2)
    terminals = torch.tensor([[False, False, True]])
    target = td_target(rewards, v, terminals, gamma=0.5)
    # action 0: 0 + 0.5 * V(s1) = 1.0 ; action 1 leads to terminal s2: 1 + 0 = 1.0
    assert torch.allclose(target, torch.tensor([[1.0, 1.0]]))
    terminals = torch.tensor([[False, False, False]])
    assert torch.allclose(td_target(rewards, v, terminals, 0.5), torch.tensor([[1.0, 2.5]]))


def test_q_loss_is_masked_mean_squared_error():
    q = torch.tensor([[1.0, 2.0, 9.0]])
    target = torch.tensor([[0.0, 4.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    assert math.isclose(q_loss(q, target, mask).item(), (1 + 4) / 2)


def test_expectile_loss_weights_by_sign():
    target_q = torch.tensor([[2.0, 0.0]])
    v = torch.tensor([[1.0, 2.0]])  # diff +1 (weight tau), diff -2 (weight 1 - tau)
    mask = torch.ones(1, 2, dtype=torch.bool)
    tau = 0.8
    expected = (tau * 1.0 + (1 - tau) * 4.0) / 2
    assert math.isclose(expectile_loss(target_q, v, tau, mask).item(), expected, rel_tol=1e-6)


def test_cql_is_cross_entropy_of_scaled_q():
    q = torch.tensor([[[1.0, 2.0, 0.0]]])
    actions = torch.tensor([[1]])
    mask = torch.ones(1, 1, dtype=torch.bool)
    temp = 2.0
    z = [0.5, 1.0, 0.0]
    expected = -(1.0 - math.log(sum(math.exp(x) for x in z)))
    assert math.isclose(cql_loss(q, actions, mask, temp).item(), expected, rel_tol=1e-6)


def test_awac_weights_exp_sign_and_clip():
    tq = torch.tensor([1.0, 0.0, 3.0])
    v = torch.tensor([0.5, 1.0, 0.0])
    w = awac_weights(tq, v, beta=2.0)
    assert torch.allclose(w, torch.exp(torch.tensor([1.0, -2.0, 6.0])))
    assert torch.allclose(awac_weights(tq, v, beta=2.0, clip_weight=5.0), torch.tensor([math.e, math.exp(-2), 5.0]))
    assert torch.equal(awac_weights(tq, v, beta=2.0, exp_weights=False), torch.tensor([1.0, 0.0, 1.0]))


def test_awac_loss_weights_actions_and_transitions():
    # tokens: prompt, action, transition, action ; vocab 4; uniform logits -> CE = log 4 everywhere
    tokens = torch.tensor([[1, 2, 3, 2]])
    attn = torch.ones(1, 4, dtype=torch.bool)
    logits = torch.zeros(1, 4, 4)
    action_idxs = torch.tensor([[0, 2, 0]])  # third slot is padding
    mask = torch.tensor([[True, True, False]])
    weights = torch.tensor([[2.0, 3.0, 100.0]])
    ce = math.log(4)
    got = awac_loss(logits, tokens, attn, action_idxs, weights, mask, transition_weight=0.5).item()
    assert math.isclose(got, (2 * ce + 3 * ce + 0.5 * ce) / 2, rel_tol=1e-6)


def test_dm_loss_hinge():
    qf = torch.tensor([[[1.0, 3.0, 0.0]]])
    q = torch.tensor([[1.0]])
    mask = torch.ones(1, 1, dtype=torch.bool)
    # relu(qf - margin - q) with margin 0.5: [0, 1.5, 0]  (the data token itself gets relu(-0.5) = 0)
    assert math.isclose(dm_loss(qf, q, mask, 0.5).item(), 1.5)


def test_ilql_loss_reports_every_term_by_name():
    b, a, length, voc = 2, 3, 5, 6
    torch.manual_seed(0)
    out = {"logits": torch.randn(b, length, voc, requires_grad=True),
           "qs": [torch.randn(b, a, voc, requires_grad=True) for _ in range(2)],
           "target_qs": [torch.randn(b, a, voc) for _ in range(2)],
           "vs": torch.randn(b, a + 1, requires_grad=True)}
    batch = {"tokens": torch.randint(1, voc, (b, length)), "attn_mask": torch.ones(b, length, dtype=torch.bool),
             "action_idxs": torch.tensor([[0, 1, 2], [0, 1, 0]]), "state_idxs": torch.tensor([[0, 1, 2, 3], [0, 1, 2, 2]]),
             "rewards": torch.randn(b, a), "terminals": torch.tensor([[False] * 3 + [True], [False, False, True, True]]),
             "action_mask": torch.tensor([[True] * 3, [True, True, False]])}
    total, metrics = ilql_loss(out, batch, ILQLLossConfig(dm_weight=0.1, dm_margin=0.1))
    for name in ("loss_q", "loss_v", "loss_cql", "loss_awac", "loss_dm", "loss"):
        assert name in metrics and math.isfinite(metrics[name])
    total.backward()
    assert out["vs"].grad is not None and out["qs"][1].grad is not None
