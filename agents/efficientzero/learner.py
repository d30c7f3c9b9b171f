"""The EfficientZero learner: one gradient update from the shared replay.

Three steps, each a function of what it is given (no agent object):

1. `sample_batch` (numpy side): prioritised sequence windows of K + 1 + td_steps rows; value
   targets recomputed with the target network (reanalyse), value-prefix targets, policy targets
   (optionally re-searched), importance weights. The result is a dict of batch-first tensors.
2. `loss_terms(model, params, buffers, batch, hp)`: the named losses of a K-step unroll, computed
   with `torch.func.functional_call`, so the same function evaluates any parameters. The loss
   weights in `hp` may be Python floats or 0-d tensors: a fused trainer can
   `torch.func.vmap(torch.func.grad(...))` it over stacked members' parameters, batches and
   per-member weights; `fused_loss` hands it to `evo.fused.FusedGroup` in that engine's shape.
3. `update`: Adam on the weighted total, gradient-norm clipping, target-network sync and new
   priorities for the sampled windows.

    loss = w_p * loss_policy + w_v * loss_value + w_vp * loss_value_prefix + w_c * loss_consistency
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from agents.efficientzero.mcts import BatchedMCTS, MCTSConfig, model_device
from agents.efficientzero.model import Unroll
from agents.efficientzero.support import scalar_to_support, support_to_scalar
from agents.efficientzero.targets import nstep_value_targets, value_prefix_targets
from evo.faults import check_finite
from evo.replay import Replay

__all__ = ["Batch", "LOSS_NAMES", "LOSS_WEIGHTS", "sample_batch", "sample_windows", "window_obs", "bootstrap_values",
           "batch_from_windows", "reanalyse_policy", "loss_terms", "fused_loss",
           "update"]

#: the named loss terms `loss_terms` returns (besides `loss_total` and the detached `root_value`)
LOSS_NAMES = ("loss_value", "loss_policy", "loss_value_prefix", "loss_consistency")
#: the hyperparameter weighting each term in the total, in the order they are summed
LOSS_WEIGHTS = {"loss_value": "value_weight", "loss_policy": "policy_weight",
                "loss_value_prefix": "value_prefix_weight", "loss_consistency": "consistency_weight"}


@dataclass
class Batch:
    """One update's data: `tensors` is what `loss_terms` reads; the rest stays on the numpy side.

    tensors (B windows, K unroll steps): `obs` [B, K+1, ...], `actions` [B, K], `value_target`
    [B, K+1, 2Sv+1] and `value_prefix_target` [B, K, 2Sr+1] (two-hot), `policy_target` [B, K+1, A],
    `valid` [B, K+1] (position inside the trajectory), `mask` [B, K] (action inside it), `weights` [B],
    `value_valid` [B, K+1] (`valid`, and with `absorbing_terminal` the positions past a terminal too;
    `mask` then covers them as well: their value target is 0 and their value prefix stays put).
    """

    tensors: dict[str, torch.Tensor]
    keys: np.ndarray          # replay keys of the windows, for their new priorities
    root_target: np.ndarray   # [B] n-step value target of each window's first row (float64)


def sample_batch(replay: Replay, target_model: torch.nn.Module, hp: Mapping[str, Any],
                 rng: np.random.Generator) -> Batch:
    """Sample `batch_size` windows and build their targets with the target network.

    `rng` is only drawn from when `reanalyse_ratio` > 0 (which windows are re-searched). The three
    phases are separate functions so that a fused trainer can compute several members'
    bootstrap values in one call: `sample_windows`, `bootstrap_values`, `batch_from_windows`.
    """
    seq = sample_windows(replay, hp)
    return batch_from_windows(seq, bootstrap_values(target_model, window_obs(seq)), target_model, hp, rng)


def sample_windows(replay: Replay, hp: Mapping[str, Any]) -> Any:
    """`batch_size` sequence windows of K + 1 + td_steps rows (a `SequenceBatch`)."""
    L = int(hp["num_unroll_steps"]) + 1 + int(hp["td_steps"])
    return replay.sample_sequences(int(hp["batch_size"]), L)


def window_obs(seq: Any) -> torch.Tensor:
    """The windows' observations, [B, L, ...] float32, on the CPU (where the replay's arrays are)."""
    return torch.as_tensor(np.asarray(seq.data["obs"]), dtype=torch.float32)


def bootstrap_values(target_model: torch.nn.Module, obs: torch.Tensor) -> np.ndarray:
    """The target network's value of every row of the windows, [B, L] (numpy)."""
    B, L = obs.shape[:2]
    with torch.no_grad():
        flat = obs.reshape(B * L, *obs.shape[2:]).to(model_device(target_model))
        _, tv_logits = target_model.predict(target_model.represent(flat))
        return support_to_scalar(tv_logits, target_model.value_support).reshape(B, L).cpu().numpy()


def batch_from_windows(seq: Any, boot: np.ndarray, target_model: torch.nn.Module, hp: Mapping[str, Any],
                       rng: np.random.Generator) -> Batch:
    """Value, value-prefix and policy targets and importance weights for sampled windows, given
    their bootstrap values `boot` [B, L]. The tensors are put on the target model's device (one copy
    per tensor; no-ops on the CPU)."""
    K, n_td, H = int(hp["num_unroll_steps"]), int(hp["td_steps"]), int(hp["lstm_horizon_len"])
    data, mask = seq.data, np.asarray(seq.mask, dtype=bool)
    obs = window_obs(seq)
    rewards = np.asarray(data["reward"], dtype=np.float64)
    terminals = np.asarray(data["terminal"], dtype=bool)
    z, valid = nstep_value_targets(rewards, terminals, mask, boot, float(hp["discount"]), n_td, K + 1)
    vp = value_prefix_targets(rewards, mask, H, K)
    value_valid, prefix_mask = valid, mask[:, :K]
    if hp.get("absorbing_terminal", False):
        # positions past a terminal are an absorbing state: value target 0 (z is 0 there) and no further
        # reward (the prefix stays put), both learned (LightZero); policy and consistency stay masked
        after = (np.cumsum(terminals & mask, axis=1) > 0) & ~mask
        value_valid, prefix_mask = valid | after[:, : K + 1], prefix_mask | after[:, :K]
    policy = np.asarray(data["policy"], dtype=np.float32)[:, : K + 1].copy()
    if float(hp["reanalyse_ratio"]) > 0:
        policy = reanalyse_policy(target_model, obs[:, : K + 1], policy, valid, hp, rng)

    weights = torch.as_tensor(np.asarray(seq.weights), dtype=torch.float32)
    # the store normalises by the smallest priority ever stored, which can make every weight tiny;
    # normalising by the batch's largest weight (as LightZero does) keeps the step size meaningful
    weights = weights / weights.max().clamp_min(1e-12)
    tensors = {
        "obs": obs[:, : K + 1],
        "actions": torch.as_tensor(np.asarray(data["action"]), dtype=torch.long)[:, :K],
        "value_target": scalar_to_support(torch.as_tensor(z, dtype=torch.float32), target_model.value_support),
        "value_prefix_target": scalar_to_support(torch.as_tensor(vp, dtype=torch.float32), target_model.reward_support),
        "policy_target": torch.as_tensor(policy),
        "valid": torch.as_tensor(valid, dtype=torch.float32),
        "mask": torch.as_tensor(prefix_mask, dtype=torch.float32),
        "value_valid": torch.as_tensor(value_valid, dtype=torch.float32),
        "weights": weights,
    }
    device = model_device(target_model)
    return Batch({k: v.to(device) for k, v in tensors.items()}, np.asarray(seq.keys), z[:, 0])


def reanalyse_policy(target_model: torch.nn.Module, obs: torch.Tensor, policy: np.ndarray, valid: np.ndarray,
                     hp: Mapping[str, Any], rng: np.random.Generator) -> np.ndarray:
    """Re-search a `reanalyse_ratio` share of the windows with the target model (fresher policy
    targets); obs [B, P, ...], policy [B, P, A], valid [B, P]. Positions past a trajectory's end keep
    their (unused) stored targets."""
    B, P = policy.shape[:2]
    count = int(round(float(hp["reanalyse_ratio"]) * B))
    if count == 0:
        return policy
    rows = np.sort(rng.choice(B, size=count, replace=False))
    sub = obs[torch.as_tensor(rows)].reshape(count * P, *obs.shape[2:])
    result = BatchedMCTS(MCTSConfig.from_hparams(hp)).run(target_model, sub, rng, add_noise=False)
    fresh = result.policy.reshape(count, P, -1).astype(np.float32)
    keep = valid[rows][..., None]
    policy[rows] = np.where(keep, fresh, policy[rows])
    return policy


def _cross_entropy(target: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    return (target * F.log_softmax(logits, -1)).sum(-1)


def loss_terms(model: torch.nn.Module, params: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor],
               batch: Mapping[str, torch.Tensor], hp: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The named losses of `model` run with `params` and `buffers` on `batch` (`Batch.tensors`).

    `hp` holds the four loss weights (`LOSS_WEIGHTS`; floats or 0-d tensors) and
    `lstm_horizon_len` (a Python int: it shapes the computation). Returns the importance-weighted
    means `loss_value`, `loss_policy`, `loss_value_prefix`, `loss_consistency`, their weighted sum
    `loss_total`, and `root_value` [B] (the predicted value at each first observation, detached;
    new priorities are |root_value - target|).
    """
    out: Unroll = functional_call(model, (dict(params), dict(buffers)),
                                  (batch["obs"], batch["actions"], int(hp["lstm_horizon_len"])))
    value_target, prefix_target, policy_target = batch["value_target"], batch["value_prefix_target"], batch["policy_target"]
    valid, mask, weights = batch["valid"], batch["mask"], batch["weights"]
    B, K = batch["actions"].shape

    root_value = support_to_scalar(out.value_logits[0].detach(), model.value_support)
    value_valid = batch.get("value_valid", valid)  # = valid unless hp absorbing_terminal
    loss_value = -_cross_entropy(value_target[:, 0], out.value_logits[0]) * value_valid[:, 0]
    loss_policy = -_cross_entropy(policy_target[:, 0], out.policy_logits[0]) * valid[:, 0]
    loss_prefix = valid.new_zeros(B)
    loss_consistency = valid.new_zeros(B)
    for k in range(1, K + 1):  # accumulated step by step, in this order: the sums are bit-for-bit stable
        loss_prefix = loss_prefix - _cross_entropy(prefix_target[:, k - 1], out.value_prefix_logits[k - 1]) * mask[:, k - 1]
        loss_value = loss_value - _cross_entropy(value_target[:, k], out.value_logits[k]) * value_valid[:, k]
        loss_policy = loss_policy - _cross_entropy(policy_target[:, k], out.policy_logits[k]) * valid[:, k]
        cos = F.cosine_similarity(out.predicted_projections[k - 1], out.target_projections[:, k - 1], dim=-1)
        loss_consistency = loss_consistency - cos * valid[:, k]

    terms = {
        "loss_value": (weights * loss_value).mean(),
        "loss_policy": (weights * loss_policy).mean(),
        "loss_value_prefix": (weights * loss_prefix).mean(),
        "loss_consistency": (weights * loss_consistency).mean(),
    }
    total = (hp["value_weight"] * terms["loss_value"] + hp["policy_weight"] * terms["loss_policy"]
             + hp["value_prefix_weight"] * terms["loss_value_prefix"]
             + hp["consistency_weight"] * terms["loss_consistency"])
    return {**terms, "loss_total": total, "root_value": root_value}


def fused_loss(model: torch.nn.Module, lstm_horizon_len: int
               ) -> Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """`loss_terms` in the shape `evo.fused.FusedGroup` trains: `(params, buffers, batch, scalars) ->
    (loss_total, terms)`, with `batch` a `Batch.tensors` and `scalars` the four `LOSS_WEIGHTS`
    hyperparameters (0-d tensors, one value per member). `model` only supplies the code: any member
    of the architecture. The terms include `root_value`, from which the new priorities follow."""
    def loss(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], batch: Mapping[str, torch.Tensor],
             scalars: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        terms = loss_terms(model, params, buffers, batch, {**scalars, "lstm_horizon_len": lstm_horizon_len})
        total = terms.pop("loss_total")
        return total, terms

    return loss


def update(model: torch.nn.Module, target_model: torch.nn.Module, optimizer: torch.optim.Optimizer, replay: Replay,
           batch: Batch, hp: Mapping[str, Any], step: int) -> dict[str, float]:
    """Update number `step` (counting from 1): one Adam step on `loss_terms` with the model's own
    parameters, gradient norm clipped at `grad_clip`; the target network copies the model every
    `target_update_interval` updates; the sampled windows get priorities |V(o_0) - z_0| + 1e-6.
    Returns the loss terms, `loss_total`, `grad_norm` and `target_value_mean`."""
    model.train()
    weights = {name: float(hp[name]) for name in LOSS_WEIGHTS.values()}
    terms = loss_terms(model, dict(model.named_parameters()), dict(model.named_buffers()), batch.tensors,
                       {**weights, "lstm_horizon_len": int(hp["lstm_horizon_len"])})
    check_finite(terms["loss_total"], "loss_total")  # a diverged member stops here, not at NaN priorities
    optimizer.zero_grad(set_to_none=True)
    terms["loss_total"].backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float(hp["grad_clip"]))
    optimizer.step()
    model.eval()
    if step % int(hp["target_update_interval"]) == 0:
        target_model.load_state_dict(model.state_dict())

    priorities = np.abs(terms["root_value"].cpu().numpy() - batch.root_target) + 1e-6
    replay.update_priorities(batch.keys, priorities)
    out = {name: float(terms[name].detach()) for name in LOSS_NAMES}
    out.update({"loss_total": float(terms["loss_total"].detach()), "grad_norm": float(grad_norm),
                "target_value_mean": float(batch.root_target.mean())})
    return out
