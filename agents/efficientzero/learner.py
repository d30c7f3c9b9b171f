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

Two implementations of steps 2 and 3 compute the same function (`PATHS`; `use_path` switches
them for a benchmark or a test): "fast", the default — the unroll's heads run once on all steps'
latents (`model(..., stacked=True)`), the loss is computed on [steps, B] tensors in a few ops,
clipping and Adam use torch's multi-tensor (foreach) kernels — and "baseline", the step-by-step
unroll and loss as first written, kept as the reference (tests/efficientzero/test_fast_path.py:
float64 losses and gradients of both agree to 1e-10). docs/efficientzero.md has the profile.

On the fast path `update(..., compile=True)` (the agent's `task.compile`) runs the forward unroll and
the loss through `torch.compile` (inductor, C++ wrapper), so the backward is a compiled graph too:
`compiled_loss`. One graph per architecture, batch size dynamic; compiled graphs live on disk in a
cache every process of the machine shares (`compile_cache_dir`), so a graph compiles once per machine
(~45 s) and loads in a few seconds in any later process; a process compiles at most
`MAX_COMPILED_GRAPHS` architectures and runs any further one, or one whose compile fails, eagerly;
while another process compiles a graph, the others train that architecture eagerly and load it after.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from agents.efficientzero import flat as flat_graphs
from agents.efficientzero.mcts import BatchedMCTS, MCTSConfig, model_device
from agents.efficientzero.model import EfficientZeroConv, StackedUnroll, Unroll
from agents.efficientzero.support import scalar_to_support, support_to_scalar
from agents.efficientzero.targets import bootstrap_rows, nstep_value_targets, value_prefix_targets
from evo.faults import check_finite
from evo.replay import Replay

__all__ = ["PATHS", "set_path", "use_path", "current_path", "Batch", "LOSS_NAMES",
           "LOSS_WEIGHTS", "ENTROPY_WEIGHT", "WEIGHT_NAMES", "reported_terms", "sample_batch", "sample_windows",
           "window_obs", "bootstrap_values",
           "batch_from_windows", "reanalyse_policy", "loss_terms", "fused_loss",
           "update", "AUTOCAST_MODES", "effective_autocast", "COMPILE_MODES", "MAX_COMPILED_GRAPHS",
           "compile_cache_dir", "compiled_loss", "compile_stats"]

#: the named loss terms `loss_terms` returns (besides `loss_total` and the detached `root_value`)
LOSS_NAMES = ("loss_value", "loss_policy", "loss_value_prefix", "loss_consistency")
#: the hyperparameter weighting each term in the total, in the order they are summed
LOSS_WEIGHTS = {"loss_value": "value_weight", "loss_policy": "policy_weight",
                "loss_value_prefix": "value_prefix_weight", "loss_consistency": "consistency_weight"}
#: an optional regulariser (as LightZero's `policy_entropy_weight`): the predicted policies' negative
#: entropy, `loss_policy_entropy`, weighted by this hyperparameter. At a weight of 0.0 (a float, the
#: default) it is neither computed nor reported, so the four terms above are exactly what they were;
#: a tensor weight (a fused group's, a compiled graph's) always computes it
ENTROPY_WEIGHT = "policy_entropy_weight"
#: every weight `loss_terms` reads from `hp`, in the order fused groups and compiled graphs pass them
WEIGHT_NAMES = (*LOSS_WEIGHTS.values(), ENTROPY_WEIGHT)


def _entropy_wanted(hp: Mapping[str, Any]) -> bool:
    weight = hp.get(ENTROPY_WEIGHT, 0.0)
    return isinstance(weight, torch.Tensor) or float(weight) != 0.0


def reported_terms(hp: Mapping[str, Any]) -> tuple[str, ...]:
    """The loss terms a member reports: `LOSS_NAMES`, and `loss_policy_entropy` where its weight is not 0."""
    return LOSS_NAMES + (("loss_policy_entropy",) if float(hp.get(ENTROPY_WEIGHT, 0.0)) != 0.0 else ())


def _full(t: torch.Tensor) -> torch.Tensor:
    """`t` in float32 when autocast left it in a 16-bit type (CPU autocast runs softmaxes and sums in
    their input's dtype); float32 and float64 tensors pass unchanged."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def _negative_entropy(logits: torch.Tensor) -> torch.Tensor:
    """sum_a p log p over the last dimension (<= 0; minimising it spreads the policy)."""
    log_p = F.log_softmax(_full(logits), -1)
    return (log_p.exp() * log_p).sum(-1)


#: the learner's implementations: "fast" (stacked unroll, vectorised loss, foreach Adam; and the flat graphs
#: of agents/efficientzero/flat.py, for the search too) and "baseline" (step-by-step, as first written); the
#: same function, see the module docstring
PATHS = ("fast", "baseline")
_path = "fast"


def current_path() -> str:
    return _path


def set_path(name: str) -> str:
    """Use the learner's "fast" or "baseline" implementation from now on (process-wide); returns
    the previous one."""
    global _path
    if name not in PATHS:
        raise ValueError(f"learner path: expected one of {PATHS}, found {name!r}")
    old, _path = _path, name
    flat_graphs.enabled = name == "fast"  # the flat graphs (search, unroll, bootstrap values) belong to the fast path
    return old


@contextlib.contextmanager
def use_path(name: str) -> Iterator[None]:
    """`set_path(name)` inside the block."""
    old = set_path(name)
    try:
        yield
    finally:
        set_path(old)


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
    rows = None
    if _path == "fast":  # only the rows whose value a target reads
        rows = bootstrap_rows(np.asarray(seq.data["terminal"]), np.asarray(seq.mask), int(hp["td_steps"]),
                              int(hp["num_unroll_steps"]) + 1)
    return batch_from_windows(seq, bootstrap_values(target_model, window_obs(seq), rows), target_model, hp, rng)


def sample_windows(replay: Replay, hp: Mapping[str, Any]) -> Any:
    """`batch_size` sequence windows of K + 1 + td_steps rows (a `SequenceBatch`)."""
    L = int(hp["num_unroll_steps"]) + 1 + int(hp["td_steps"])
    return replay.sample_sequences(int(hp["batch_size"]), L)


def window_obs(seq: Any) -> torch.Tensor:
    """The windows' observations, [B, L, ...] float32, on the CPU (where the replay's arrays are)."""
    return torch.as_tensor(np.asarray(seq.data["obs"]), dtype=torch.float32)


def bootstrap_values(target_model: torch.nn.Module, obs: torch.Tensor, rows: np.ndarray | None = None) -> np.ndarray:
    """The target network's value of every row of the windows, [B, L] (numpy); with `rows` ([B, L]
    bool, `targets.bootstrap_rows`) only of those rows, the others 0."""
    B, L = obs.shape[:2]

    def values_of(x: torch.Tensor) -> np.ndarray:
        x = x.to(model_device(target_model))
        calls = flat_graphs.search_calls(target_model)  # the search's first call: represent, then predict
        _, tv_logits = target_model.predict(target_model.represent(x)) if calls is None else calls.initial_inference(x)[1:]
        return support_to_scalar(tv_logits, target_model.value_support, target_model.support_step).cpu().numpy()

    with torch.inference_mode() if _path == "fast" else torch.no_grad():
        flat = obs.reshape(B * L, *obs.shape[2:])
        if rows is None:
            return values_of(flat).reshape(B, L)
        index = np.flatnonzero(rows.reshape(-1))
        values = values_of(flat[torch.as_tensor(index)])
        out = np.zeros(B * L, dtype=values.dtype)
        out[index] = values
        return out.reshape(B, L)


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
        "value_target": scalar_to_support(torch.as_tensor(z, dtype=torch.float32), target_model.value_support,
                                          target_model.support_step),
        "value_prefix_target": scalar_to_support(torch.as_tensor(vp, dtype=torch.float32), target_model.reward_support,
                                                 target_model.support_step),
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
    return (target * F.log_softmax(_full(logits), -1)).sum(-1)


def loss_terms(model: torch.nn.Module, params: Mapping[str, torch.Tensor] | None, buffers: Mapping[str, torch.Tensor] | None,
               batch: Mapping[str, torch.Tensor], hp: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The named losses of `model` run with `params` and `buffers` on `batch` (`Batch.tensors`);
    None for both: the module's own (what `update` passes: no dictionaries of 43 tensors to build and compare).

    `hp` holds the four loss weights (`LOSS_WEIGHTS`; floats or 0-d tensors) and
    `lstm_horizon_len` (a Python int: it shapes the computation). Returns the importance-weighted
    means `loss_value`, `loss_policy`, `loss_value_prefix`, `loss_consistency`, their weighted sum
    `loss_total`, and `root_value` [B] (the predicted value at each first observation, detached;
    new priorities are |root_value - target|).
    """
    if _path == "fast":
        return _loss_terms_stacked(model, params, buffers, batch, hp)
    if params is None:
        params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    out: Unroll = functional_call(model, (dict(params), dict(buffers)),
                                  (batch["obs"], batch["actions"], int(hp["lstm_horizon_len"])))
    value_target, prefix_target, policy_target = batch["value_target"], batch["value_prefix_target"], batch["policy_target"]
    valid, mask, weights = batch["valid"], batch["mask"], batch["weights"]
    B, K = batch["actions"].shape

    root_value = support_to_scalar(_full(out.value_logits[0].detach()), model.value_support, model.support_step)
    value_valid = batch.get("value_valid", valid)  # = valid unless hp absorbing_terminal
    loss_value = -_cross_entropy(value_target[:, 0], out.value_logits[0]) * value_valid[:, 0]
    loss_policy = -_cross_entropy(policy_target[:, 0], out.policy_logits[0]) * valid[:, 0]
    loss_prefix = valid.new_zeros(B)
    loss_consistency = valid.new_zeros(B)
    for k in range(1, K + 1):  # accumulated step by step, in this order: the sums are bit-for-bit stable
        loss_prefix = loss_prefix - _cross_entropy(prefix_target[:, k - 1], out.value_prefix_logits[k - 1]) * mask[:, k - 1]
        loss_value = loss_value - _cross_entropy(value_target[:, k], out.value_logits[k]) * value_valid[:, k]
        loss_policy = loss_policy - _cross_entropy(policy_target[:, k], out.policy_logits[k]) * valid[:, k]
        cos = F.cosine_similarity(_full(out.predicted_projections[k - 1]), _full(out.target_projections[:, k - 1]), dim=-1)
        loss_consistency = loss_consistency - cos * valid[:, k]
    loss_entropy = None
    if _entropy_wanted(hp):
        loss_entropy = _negative_entropy(out.policy_logits[0]) * valid[:, 0]
        for k in range(1, K + 1):
            loss_entropy = loss_entropy + _negative_entropy(out.policy_logits[k]) * valid[:, k]

    return _weighted_terms(weights, loss_value, loss_policy, loss_prefix, loss_consistency, root_value, hp, loss_entropy)


def _loss_terms_stacked(model: torch.nn.Module, params: Mapping[str, torch.Tensor] | None,
                        buffers: Mapping[str, torch.Tensor] | None, batch: Mapping[str, torch.Tensor],
                        hp: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """`loss_terms` on the stacked unroll: every step's cross-entropies in one op per head."""
    args = (batch["obs"], batch["actions"], int(hp["lstm_horizon_len"]))
    if params is None or _own_state(model, params, buffers or {}):  # the module's own tensors: nothing to swap in
        # flat graphs in eager mode; torch.compile traces the modules itself
        calls = None if torch.compiler.is_compiling() else flat_graphs.unroll_calls(model)
        out: StackedUnroll = model(*args, stacked=True, calls=calls)
    else:
        out = functional_call(model, (dict(params), dict(buffers or {})), args, {"stacked": True})
    valid = batch["valid"].transpose(0, 1)  # [K+1, B]
    mask = batch["mask"].transpose(0, 1)    # [K, B]
    weights = batch["weights"]

    def ce(target: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:  # target [B, S, n], logits [S, B, n]
        return (target.transpose(0, 1) * F.log_softmax(_full(logits), -1)).sum(-1)

    root_value = support_to_scalar(_full(out.value_logits[0].detach()), model.value_support, model.support_step)
    value_valid = batch["value_valid"].transpose(0, 1) if "value_valid" in batch else valid  # hp absorbing_terminal
    loss_value = -(ce(batch["value_target"], out.value_logits) * value_valid).sum(0)
    loss_policy = -(ce(batch["policy_target"], out.policy_logits) * valid).sum(0)
    loss_prefix = -(ce(batch["value_prefix_target"], out.value_prefix_logits) * mask).sum(0)
    cos = F.cosine_similarity(_full(out.predicted_projections), _full(out.target_projections).transpose(0, 1), dim=-1)
    loss_consistency = -(cos * valid[1:]).sum(0)
    loss_entropy = (_negative_entropy(out.policy_logits) * valid).sum(0) if _entropy_wanted(hp) else None
    return _weighted_terms(weights, loss_value, loss_policy, loss_prefix, loss_consistency, root_value, hp, loss_entropy)


def _weighted_terms(weights: torch.Tensor, loss_value: torch.Tensor, loss_policy: torch.Tensor, loss_prefix: torch.Tensor,
                    loss_consistency: torch.Tensor, root_value: torch.Tensor, hp: Mapping[str, Any],
                    loss_entropy: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per-window loss sums [B] -> the importance-weighted means, and their total at the member's loss weights
    (both learner paths end here, so they weigh alike); `loss_entropy` (None: not wanted) is the
    `ENTROPY_WEIGHT` regulariser's, added after the four terms."""
    terms = {
        "loss_value": (weights * loss_value).mean(),
        "loss_policy": (weights * loss_policy).mean(),
        "loss_value_prefix": (weights * loss_prefix).mean(),
        "loss_consistency": (weights * loss_consistency).mean(),
    }
    total = (hp["value_weight"] * terms["loss_value"] + hp["policy_weight"] * terms["loss_policy"]
             + hp["value_prefix_weight"] * terms["loss_value_prefix"]
             + hp["consistency_weight"] * terms["loss_consistency"])
    if loss_entropy is not None:
        terms["loss_policy_entropy"] = (weights * loss_entropy).mean()
        total = total + hp[ENTROPY_WEIGHT] * terms["loss_policy_entropy"]
    return {**terms, "loss_total": total, "root_value": root_value}


def _own_state(model: torch.nn.Module, params: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor]) -> bool:
    """Are `params` and `buffers` exactly the module's own tensors (the same objects)?"""
    own_p, own_b = dict(model.named_parameters()), dict(model.named_buffers())
    return (len(own_p) == len(params) and len(own_b) == len(buffers)
            and all(params.get(k) is v for k, v in own_p.items()) and all(buffers.get(k) is v for k, v in own_b.items()))


def set_training(module: torch.nn.Module, mode: bool) -> None:
    """`module.train(mode)` with the flags set straight in each module's dict: the same flags, where
    nn.Module.train's recursion and per-module `__setattr__` cost ~70 µs a call for the CartPole member
    (twice an update: ~1.5% of it on Ray). A module that overrides `train` applies its own (to itself
    and what it holds)."""
    if type(module).train is not torch.nn.Module.train:
        module.train(mode)
        return
    module.__dict__["training"] = mode  # what Module.__setattr__ does for a plain attribute
    for child in module._modules.values():
        if child is not None:
            set_training(child, mode)


def _clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` in fewer calls: the norm of all gradients as one vector,
    and no multiplication when the clip coefficient is 1 (multiplying by 1.0 changes nothing)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    total = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads]), 2.0)
    coef = max_norm / (total + 1e-6)  # as torch computes it
    if bool(coef < 1.0):
        torch._foreach_mul_(grads, coef)
    return total


# ---------------------------------------------------------------------------------------------
# torch.compile of the fast path's loss (and so of its backward)
# ---------------------------------------------------------------------------------------------
#: `task.compile` values: "off" (eager) or "on" (`compiled_loss`)
COMPILE_MODES = ("off", "on")
#: `task.autocast`: "bf16" runs the update's forward and backward under torch.autocast in bfloat16
#: (convolutions and matrix products in bf16, and on a CPU the norms and activations after them; the
#: loss's softmaxes and cosines in float32: `_full`); targets, search, clipping and Adam stay float32.
#: It pays for conv members on a CPU with bf16 kernels (avx512_bf16 or AMX) and slows small MLP
#: members (docs/efficientzero.md "bf16"). "auto" is "bf16" exactly there (`effective_autocast`).
AUTOCAST_MODES = ("off", "bf16", "auto")
#: architectures one process compiles at most (each costs ~45 s cold, a few seconds from the disk
#: cache); a member of any further architecture trains eagerly
MAX_COMPILED_GRAPHS = 8
_compiled: dict[str, Any] = {"fn": None, "graphs": {}, "failed": set()}
#: the user's own TORCHINDUCTOR_CACHE_DIR, read at import (torch writes its /tmp default into the
#: variable the first time any of its code asks, so later the variable no longer says who chose it)
_USER_CACHE_DIR = os.environ.get("TORCHINDUCTOR_CACHE_DIR")


#: whether this process has asked `cpu_has_bf16_kernels` yet (asked once, at its first bf16 update)
_bf16_kernels_checked = False


def cpu_has_bf16_kernels() -> bool:
    """Whether this CPU has bfloat16 instructions oneDNN computes with (AVX-512 BF16 or AMX). Without them
    bf16 convolutions are emulated: measured 2x (AVX-512 without BF16) to 15x (AVX2) slower than float32
    for the conv member's [128, 16, 10, 10] convolution (docs/efficientzero.md, "bf16")."""
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    known = [check for check in checks if check is not None]
    return not known or any(check() for check in known)  # a torch without the probes: assume it has them


#: `cpu_has_bf16_kernels()` as "auto" first found it in this process (None: not asked yet)
_auto_cpu_has_bf16: bool | None = None


def effective_autocast(mode: str, model: torch.nn.Module, compile: bool = False) -> str:
    """What `task.autocast = mode` runs `model`'s update in: "off" or "bf16". "auto" is "bf16" only where
    bf16 was measured not to cost: a conv member (`EfficientZeroConv`), eager, in float32, on a CPU with
    bf16 kernels (1.2-1.3x on an AVX-512 BF16 EPYC, 1.01x on an AMX Xeon). Everywhere else it is "off": MLP
    members got slower (0.88-0.90x), an H200 too (0.86x), and a CPU without bf16 instructions emulates it
    (0.07-0.47x). docs/efficientzero.md, "bf16"."""
    global _auto_cpu_has_bf16
    if mode != "auto":
        return mode
    if compile or not isinstance(model, EfficientZeroConv):
        return "off"
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype != torch.float32:
        return "off"
    if _auto_cpu_has_bf16 is None:
        _auto_cpu_has_bf16 = cpu_has_bf16_kernels()
    return "bf16" if _auto_cpu_has_bf16 else "off"


def _warn_if_bf16_is_emulated(device: torch.device) -> None:
    """At a process's first bf16 update on a CPU: warn when that CPU emulates bf16 (the CPU does not change)."""
    global _bf16_kernels_checked
    if device.type != "cpu" or _bf16_kernels_checked:
        return
    _bf16_kernels_checked = True
    if not cpu_has_bf16_kernels():
        warnings.warn("task.autocast = 'bf16' on a CPU without bf16 instructions (no AVX-512 BF16, no AMX): its "
                      "convolutions are emulated, 2-15x slower than float32 where measured; set autocast = 'off' "
                      "here", UserWarning, stacklevel=3)


def compile_cache_dir() -> str:
    """Where inductor keeps compiled graphs: $TORCHINDUCTOR_CACHE_DIR when the process started with
    it, else $XDG_CACHE_HOME/evo/torchinductor (~/.cache/evo/torchinductor) — one directory for every
    process of this user on the machine, Ray workers included, so each graph compiles once per machine
    and survives reboots (torch's own default is under /tmp)."""
    if _USER_CACHE_DIR:
        return _USER_CACHE_DIR
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "evo", "torchinductor")


def compile_stats() -> dict[str, float]:
    """This process's compiled graphs so far: how many, the seconds their first calls took
    (compile or cache load, trace included) and how many architectures fell back to eager."""
    return {"compiled_graphs": float(len(_compiled["graphs"])),
            "compile_seconds": float(sum(_compiled["graphs"].values())),
            "compile_failures": float(len(_compiled["failed"]))}


def _graph_key(model: torch.nn.Module, lstm_horizon_len: int) -> tuple:
    """What selects a compiled graph: the modules, the parameters' shapes and dtypes, the device
    (the batch size is a dynamic dimension, the loss weights are tensor inputs)."""
    return (type(model).__name__, lstm_horizon_len, float(getattr(model, "obs_scale", 1.0)), str(model_device(model)),
            tuple((n, tuple(p.shape), str(p.dtype)) for n, p in model.named_parameters()),
            tuple(type(m).__name__ for m in model.modules()))


def _compile_lock(key: tuple) -> Any:
    """One compile of a graph at a time on the machine: an exclusive, non-blocking flock on a file
    named by the graph's key in the cache directory. Returns the open file (close it to release; the
    lock also goes with the process), False when another process holds it, None where flock is
    unavailable (not POSIX: no lock, compile anyway)."""
    try:
        import fcntl
    except ImportError:
        return None
    folder = os.path.join(compile_cache_dir(), "evo-locks")
    os.makedirs(folder, exist_ok=True)
    handle = open(os.path.join(folder, hashlib.sha256(repr(key).encode()).hexdigest()[:24] + ".lock"), "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return False
    return handle


def _loss_to_compile(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], weights: torch.Tensor,
                     lstm_horizon_len: int) -> dict[str, torch.Tensor]:
    hp: dict[str, Any] = dict(zip(WEIGHT_NAMES, weights.unbind(0)))
    hp["lstm_horizon_len"] = lstm_horizon_len
    return _loss_terms_stacked(model, dict(model.named_parameters()), dict(model.named_buffers()), batch, hp)


def compiled_loss(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], hp: Mapping[str, Any]
                  ) -> dict[str, torch.Tensor] | None:
    """The fast path's `loss_terms` with the model's own parameters, through `torch.compile`
    (inductor, C++ wrapper; the backward of the result is compiled too). The batch dimension is
    dynamic: one graph serves every batch size. Returns None where the model runs eagerly: over
    `MAX_COMPILED_GRAPHS` architectures in this process, its compile failed (warned once), or another
    process is compiling the same graph right now (`_compile_lock`; this one tries again at its next
    update and then loads the graph from the disk cache instead of compiling it a second time)."""
    H = int(hp["lstm_horizon_len"])
    key = _graph_key(model, H)
    graphs = _compiled["graphs"]
    if key in _compiled["failed"] or (key not in graphs and len(graphs) >= MAX_COMPILED_GRAPHS):
        return None
    lock = None
    if key not in graphs:
        lock = _compile_lock(key)
        if lock is False:  # another process is compiling this graph: train eagerly until it is in the cache
            return None
    if _compiled["fn"] is None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = compile_cache_dir()
        # our own cap decides which architectures compile; dynamo's per-function limit must not cut in first
        from torch._dynamo import config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 2 * MAX_COMPILED_GRAPHS + 2)
        _compiled["fn"] = torch.compile(_loss_to_compile, options={"cpp_wrapper": True})
    from torch import _dynamo  # imported on first use: a second of import time no eager process needs

    for tensor in batch.values():
        _dynamo.mark_dynamic(tensor, 0)
    ref = next(model.parameters())
    weights = torch.tensor([float(hp.get(n, 0.0)) for n in WEIGHT_NAMES], dtype=ref.dtype, device=ref.device)
    t0 = time.perf_counter()
    try:
        terms = _compiled["fn"](model, batch, weights, H)
    except Exception as err:  # any compiler failure: this architecture trains eagerly
        _compiled["failed"].add(key)
        warnings.warn(f"torch.compile of the EfficientZero loss failed ({type(err).__name__}: {err}); "
                      "this architecture trains eagerly", RuntimeWarning, stacklevel=2)
        return None
    finally:
        if lock:
            lock.close()  # releases the flock
    if key not in graphs:
        graphs[key] = time.perf_counter() - t0
    return terms


def fused_loss(model: torch.nn.Module, lstm_horizon_len: int
               ) -> Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """`loss_terms` in the shape `evo.fused.FusedGroup` trains: `(params, buffers, batch, scalars) ->
    (loss_total, terms)`, with `batch` a `Batch.tensors` and `scalars` the `WEIGHT_NAMES`
    hyperparameters (0-d tensors, one value per member). `model` only supplies the code: any member
    of the architecture. The terms include `root_value`, from which the new priorities follow."""
    def loss(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], batch: Mapping[str, torch.Tensor],
             scalars: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        terms = loss_terms(model, params, buffers, batch, {**scalars, "lstm_horizon_len": lstm_horizon_len})
        total = terms.pop("loss_total")
        return total, terms

    return loss


def update(model: torch.nn.Module, target_model: torch.nn.Module, optimizer: torch.optim.Optimizer, replay: Replay,
           batch: Batch, hp: Mapping[str, Any], step: int, compile: bool = False, autocast: str = "off") -> dict[str, float]:
    """Update number `step` (counting from 1): one Adam step on `loss_terms` with the model's own
    parameters, gradient norm clipped at `grad_clip`; the target network copies the model every
    `target_update_interval` updates; the sampled windows get priorities |V(o_0) - z_0| + 1e-6.
    With `compile` (fast path only) the loss and its backward run through `compiled_loss`; with
    `autocast` "bf16" (eager only) the loss's forward, and so its backward, run in bfloat16; "auto" is
    "bf16" where that pays (`effective_autocast`). Returns the loss terms, `loss_total`, `grad_norm`
    and `target_value_mean`."""
    if autocast not in AUTOCAST_MODES:
        raise ValueError(f"autocast: expected one of {list(AUTOCAST_MODES)}, found {autocast!r}")
    if autocast == "bf16" and compile:
        raise ValueError("autocast: 'bf16' runs the eager loss; it cannot be combined with compile")
    autocast = effective_autocast(autocast, model, compile)
    if autocast != "off":
        _warn_if_bf16_is_emulated(model_device(model))
    set_training(model, True)
    terms = compiled_loss(model, batch.tensors, hp) if compile and _path == "fast" else None
    if terms is None:
        weights = {name: float(hp.get(name, 0.0)) for name in WEIGHT_NAMES}
        with torch.autocast(model_device(model).type, dtype=torch.bfloat16, enabled=autocast == "bf16"):
            terms = loss_terms(model, None, None, batch.tensors,
                               {**weights, "lstm_horizon_len": int(hp["lstm_horizon_len"])})
    check_finite(terms["loss_total"], "loss_total")  # a diverged member stops here, not at NaN priorities
    optimizer.zero_grad(set_to_none=True)
    terms["loss_total"].backward()
    if _path == "fast":
        grad_norm = _clip_grad_norm(list(model.parameters()), float(hp["grad_clip"]))
    else:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float(hp["grad_clip"]))
    if _path == "fast" and isinstance(optimizer, torch.optim.Adam) and model_device(model).type == "cpu":
        # torch's fused Adam kernel: the same formulas in one call per tensor instead of ~10 (on the
        # CPU the foreach kernels are no faster; on a GPU torch already uses them); for this step
        # only, so a checkpoint keeps the member's own settings
        settings = [group.get("fused") for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["fused"] = True
        try:
            optimizer.step()
        finally:
            for group, fused in zip(optimizer.param_groups, settings):
                group["fused"] = fused
    else:
        optimizer.step()
    set_training(model, False)
    if step % int(hp["target_update_interval"]) == 0:
        target_model.load_state_dict(model.state_dict())

    priorities = np.abs(terms["root_value"].cpu().numpy() - batch.root_target) + 1e-6
    replay.update_priorities(batch.keys, priorities)
    out = {name: float(terms[name].detach()) for name in reported_terms(hp)}
    out.update({"loss_total": float(terms["loss_total"].detach()), "grad_norm": float(grad_norm),
                "target_value_mean": float(batch.root_target.mean())})
    return out
