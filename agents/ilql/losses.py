"""ILQL objective terms (Snell et al. 2022), each a small function that returns one named loss.

Shapes: B sequences, A action slots, S = A + 1 state slots, V vocabulary.
  q, target_q : (B, A) Q of the data action        qs_full : (B, A, V) Q over every token
  v           : (B, S) V of every state            rewards : (B, A)
  terminals   : (B, S) bool, state is terminal     mask    : (B, A) bool, action slot is real
Every term averages over real action slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "td_target", "q_loss", "expectile_loss", "cql_loss", "awac_weights", "awac_loss", "dm_loss",
    "ILQLLossConfig", "ilql_loss",
]


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp_min(1.0)


def td_target(rewards: torch.Tensor, v: torch.Tensor, terminals: torch.Tensor, gamma: float) -> torch.Tensor:
    """r_t + γ (1 − done_{t+1}) V(s_{t+1}), detached."""
    v_next = v[:, 1:].detach() * (~terminals[:, 1:]).to(v.dtype)
    return rewards + gamma * v_next


def q_loss(q: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Squared TD error."""
    return _masked_mean((q - target).pow(2), mask)


def expectile_loss(target_q: torch.Tensor, v: torch.Tensor, tau: float, mask: torch.Tensor) -> torch.Tensor:
    """Expectile regression of V towards target Q: weight tau where Q ≥ V, 1 − tau where Q < V."""
    diff = target_q.detach() - v
    weight = torch.where(diff >= 0, torch.full_like(diff, tau), torch.full_like(diff, 1.0 - tau))
    return _masked_mean(weight * diff.pow(2), mask)


def cql_loss(qs_full: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Cross-entropy of Q / temperature against the data token (pushes down Q of unseen tokens)."""
    ce = F.cross_entropy((qs_full / temperature).flatten(0, 1), actions.flatten(), reduction="none")
    return _masked_mean(ce.view_as(actions).to(qs_full.dtype), mask)


@torch.no_grad()
def awac_weights(target_q: torch.Tensor, v: torch.Tensor, beta: float, exp_weights: bool = True,
                 clip_weight: float | None = None) -> torch.Tensor:
    """exp(β (Qt − V)), or the sign rule (1 where Qt > V, else 0) when exp_weights is False; clipped."""
    adv = target_q - v
    w = torch.exp(beta * adv) if exp_weights else (adv > 0).to(adv.dtype)
    if clip_weight is not None:
        w = w.clamp(max=clip_weight)
    return w


def awac_loss(logits: torch.Tensor, tokens: torch.Tensor, attn_mask: torch.Tensor, action_idxs: torch.Tensor,
              weights: torch.Tensor, mask: torch.Tensor, transition_weight: float = 0.0) -> torch.Tensor:
    """Advantage-weighted next-token cross-entropy.

    Action tokens carry `weights`; every other real token (environment / transition tokens)
    carries `transition_weight`. Normalised by the number of real action tokens.
    """
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    ce = ce.view(tokens.shape[0], -1)
    idx = action_idxs.masked_fill(~mask, 0)
    m = mask.to(ce.dtype)
    is_action = torch.zeros_like(ce).scatter_add(1, idx, m) > 0
    action_w = torch.zeros_like(ce).scatter_add(1, idx, weights.to(ce.dtype) * m)
    w = torch.where(is_action, action_w, attn_mask[:, 1:].to(ce.dtype) * transition_weight)
    return (ce * w).sum() / mask.sum().clamp_min(1)


def dm_loss(qs_full: torch.Tensor, q: torch.Tensor, mask: torch.Tensor, margin: float) -> torch.Tensor:
    """Large-margin term: Q of any token should not exceed the data action's Q minus `margin`."""
    hinge = (qs_full - margin - q.unsqueeze(-1)).clamp_min(0).sum(-1)
    return _masked_mean(hinge, mask)


@dataclass
class ILQLLossConfig:
    gamma: float = 0.99
    tau: float = 0.7
    beta: float = 0.0               # AWAC temperature used in training
    cql_temp: float = 1.0
    exp_weights: bool = True
    clip_weight: float | None = None
    transition_weight: float = 0.0
    value_min: float | None = None
    value_max: float | None = None
    dm_margin: float = 0.0
    v_weight: float = 1.0
    cql_weight: float = 0.01
    awac_weight: float = 1.0
    dm_weight: float = 0.0


def ilql_loss(out: dict, batch: dict[str, torch.Tensor], cfg: ILQLLossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss and every term by name, from `ILQLModel.forward` output and a batch."""
    tokens, action_idxs = batch["tokens"], batch["action_idxs"]
    mask = batch["action_mask"]
    actions = tokens.gather(1, (action_idxs + 1).masked_fill(~mask, 0))
    data_q = [q.gather(-1, actions.unsqueeze(-1)).squeeze(-1) for q in out["qs"]]
    target_q = torch.stack([q.gather(-1, actions.unsqueeze(-1)).squeeze(-1) for q in out["target_qs"]]).min(0).values
    if cfg.value_min is not None or cfg.value_max is not None:
        target_q = target_q.clamp(cfg.value_min, cfg.value_max)
    vs = out["vs"]
    v = vs[:, :-1]

    target = td_target(batch["rewards"], vs, batch["terminals"], cfg.gamma)
    terms = {
        "loss_q": sum(q_loss(q, target, mask) for q in data_q),
        "loss_v": expectile_loss(target_q, v, cfg.tau, mask),
        "loss_cql": sum(cql_loss(q, actions, mask, cfg.cql_temp) for q in out["qs"]),
    }
    w = awac_weights(target_q, v.detach(), cfg.beta, cfg.exp_weights, cfg.clip_weight)
    terms["loss_awac"] = awac_loss(out["logits"], tokens, batch["attn_mask"], action_idxs, w, mask, cfg.transition_weight)
    terms["loss_dm"] = (sum(dm_loss(qf, q, mask, cfg.dm_margin) for qf, q in zip(out["qs"], data_q))
                        if cfg.dm_weight else torch.zeros((), device=tokens.device))
    total = (terms["loss_q"] + cfg.v_weight * terms["loss_v"] + cfg.cql_weight * terms["loss_cql"]
             + cfg.awac_weight * terms["loss_awac"] + cfg.dm_weight * terms["loss_dm"])
    metrics = {k: float(t.detach()) for k, t in terms.items()}
    metrics["loss"] = float(total.detach())
    metrics["mean_q"] = _masked_mean(data_q[0].detach(), mask).item()
    metrics["mean_v"] = _masked_mean(v.detach(), mask).item()
    metrics["mean_awac_weight"] = _masked_mean(w, mask).item()
    return total, metrics
