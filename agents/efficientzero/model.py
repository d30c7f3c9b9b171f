"""EfficientZero networks: representation, dynamics (with a value-prefix LSTM), prediction,
projection and projection-prediction heads, in an MLP variant (vector observations) and a
convolutional variant (image observations).

Every model exposes the same five functions the search and the learner use:

    latent               = model.represent(obs)
    policy_logits, value = model.predict(latent)                      # value: logits over the support
    latent, (h, c), vp   = model.dynamics(latent, action, (h, c))     # vp: value-prefix logits
    proj                 = model.project(latent)                      # target branch (stop-grad by caller)
    pred                 = model.project_predict(model.project(latent))

Calling a model, `model(obs, actions, lstm_horizon_len) -> Unroll`, is the learner's forward pass:
the K-step unroll from the first observation of each window along the replayed actions. It is the
one method `torch.func.functional_call` runs, so the learner's loss can be evaluated with any
parameters (and vmapped over stacked members).

Hidden states of the value-prefix LSTM are (h, c) tensors of shape [B, H]. The LSTM cell is built
from two Linear layers, so every model works under `torch.func.vmap` (nn.LSTM has no vmap rule).
Normalisation is LayerNorm by default (BatchNorm cannot update running stats under vmap);
`DynamicsNetwork` also accepts norm_type='BN' as documented.

Each variant owns its architecture mutations: `mutate_architecture(rng, new_layer_prob, bounds,
generator) -> (MutationRecord, ParamChange)`, and `set_activation(name) -> ParamChange`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from evo.evolvable import ACTIVATIONS, EvolvableMLP, ParamChange, make_activation
from evo.records import MutationRecord

__all__ = [
    "LSTMCell",
    "ResBlock",
    "DynamicsNetwork",
    "MLPDynamicsNetwork",
    "EfficientZeroMLP",
    "EfficientZeroConv",
    "Unroll",
    "StackedUnroll",
    "build_model",
    "set_model_activation",
]

Hidden = tuple[torch.Tensor, torch.Tensor]


def _act(activation: Any) -> nn.Module:
    """An activation module from a name, a class (nn.ReLU) or an instance."""
    if isinstance(activation, str):
        return make_activation(activation)
    if isinstance(activation, nn.Module):
        return type(activation)() if not isinstance(activation, nn.Threshold) else nn.Threshold(-1.0, -1.0)
    return activation()


def _one_hot(action: torch.Tensor, num_actions: int, like: torch.Tensor) -> torch.Tensor:
    """[B] actions -> [B, A] one-hot rows in `like`'s dtype and device. Equal to F.one_hot(...).to(dtype),
    which cannot run under vmap (it checks the action range with .item())."""
    classes = torch.arange(num_actions, device=action.device)
    return (action.long().unsqueeze(-1) == classes).to(like.dtype)


#: (latent, action, LSTM state or None) -> (next latent, LSTM state, value-prefix logits)
DynamicsStep = Callable[[torch.Tensor, torch.Tensor, Hidden | None], tuple[torch.Tensor, Hidden, torch.Tensor]]


def _conv1x1(x: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """`conv(x)` for a 1x1, stride-1 conv as one batched matrix product over the pixels (the same
    sums). For the learner's small images (10x10, 16 -> 4 channels) its forward + backward took
    0.18 ms against oneDNN's 0.46 at batch 64, 0.78 against 1.73 at batch 384 (one CPU thread)."""
    # the sizes read one by one, not unpacked: fx traces `x.shape[i]` but cannot iterate a traced shape
    B, C, H, W = x.shape[0], x.shape[1], x.shape[2], x.shape[3]
    weight = conv.weight.reshape(1, -1, C).expand(B, -1, -1)
    pixels = x.reshape(B, C, H * W)
    if conv.bias is None:
        return torch.bmm(weight, pixels).reshape(B, -1, H, W)
    bias = conv.bias.reshape(1, -1, 1).expand(B, -1, H * W)
    return torch.baddbmm(bias, weight, pixels).reshape(B, -1, H, W)


def _minmax(x: torch.Tensor) -> torch.Tensor:
    """Scale each sample's latent to [0, 1] (MuZero's hidden-state normalisation)."""
    flat = x.flatten(1)
    lo = flat.min(dim=1, keepdim=True).values
    hi = flat.max(dim=1, keepdim=True).values
    scaled = (flat - lo) / (hi - lo).clamp_min(1e-5)
    return scaled.view_as(x)


# ---------------------------------------------------------------------------------------------
# value-prefix LSTM
# ---------------------------------------------------------------------------------------------
class LSTMCell(nn.Module):
    """An LSTM cell from linear ops (gate order i, f, g, o as in nn.LSTM); vmap-friendly."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.ih = nn.Linear(input_size, 4 * hidden_size)
        self.hh = nn.Linear(hidden_size, 4 * hidden_size, bias=False)

    def forward(self, x: torch.Tensor, state: Hidden | None) -> Hidden:
        """One step; `state` None is the zero state (h = c = 0): the recurrent product and the
        forget term are then skipped, which changes no value (hh(0) = 0 and sigmoid(f) * 0 = 0
        exactly) and no gradient (both contribute exact zeros)."""
        if state is None:
            i, f, g, o = self.ih(x).chunk(4, dim=-1)
            c = torch.sigmoid(i) * torch.tanh(g)
        else:
            h, c = state
            i, f, g, o = (self.ih(x) + self.hh(h)).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, c

    def widen(self, extra: int, generator: torch.Generator | None = None) -> ParamChange:
        """Add `extra` units. Old units never read the new ones (zero columns), so as long as
        whatever reads h ignores the new units (zero input columns), the function is unchanged."""
        H, n = self.hidden_size, self.hidden_size + extra
        change = ParamChange()
        bound = 1.0 / math.sqrt(n)
        ref = self.ih.weight
        new_rows = torch.cat([torch.arange(k * n, k * n + H) for k in range(4)]).to(ref.device)
        # drawn on the CPU from the member's generator (the same values on every device), then moved to
        # the module's device and dtype (float64 members widen in float64) before the old rows go in
        draw = lambda *shape: torch.empty(*shape, dtype=ref.dtype).uniform_(-bound, bound, generator=generator).to(ref.device)
        w_ih, b_ih, w_hh = draw(4 * n, self.input_size), draw(4 * n), draw(4 * n, n)
        with torch.no_grad():
            w_ih[new_rows] = self.ih.weight
            b_ih[new_rows] = self.ih.bias
            w_hh[new_rows] = 0.0
            w_hh[new_rows, :H] = self.hh.weight
        everything = (slice(None), slice(None))
        for owner, name, data, new_idx in (
            (self.ih, "weight", w_ih, (new_rows, slice(None))),
            (self.ih, "bias", b_ih, (new_rows,)),
            (self.hh, "weight", w_hh, (new_rows.unsqueeze(1), torch.arange(H, device=ref.device).unsqueeze(0))),
        ):
            old = getattr(owner, name)
            new = nn.Parameter(data)
            change.resized.append((old, new, everything[: old.dim()], new_idx))
            setattr(owner, name, new)
        self.ih.out_features = self.hh.out_features = 4 * n
        self.hh.in_features = n
        self.hidden_size = n
        return change


def _widen_inputs(linear: nn.Linear, extra: int) -> ParamChange:
    """Append `extra` zero input columns to a Linear layer (function-preserving)."""
    change = ParamChange()
    w = linear.weight.new_zeros(linear.out_features, linear.in_features + extra)
    w[:, : linear.in_features] = linear.weight.detach()
    new = nn.Parameter(w)
    change.resized.append((linear.weight, new, (slice(None), slice(None)), (slice(None), slice(0, linear.in_features))))
    linear.weight = new
    linear.in_features += extra
    return change


# ---------------------------------------------------------------------------------------------
# convolutional pieces
# ---------------------------------------------------------------------------------------------
def _norm2d(norm_type: str, channels: int, hw: tuple[int, int]) -> nn.Module:
    if norm_type == "BN":
        return nn.BatchNorm2d(channels)
    if norm_type == "LN":
        return nn.LayerNorm([channels, *hw])
    raise ValueError(f"norm_type: expected 'BN' or 'LN', found {norm_type!r}")


def _norm1d(norm_type: str, size: int) -> nn.Module:
    if norm_type == "BN":
        return nn.BatchNorm1d(size)
    if norm_type == "LN":
        return nn.LayerNorm(size)
    raise ValueError(f"norm_type: expected 'BN' or 'LN', found {norm_type!r}")


class ResBlock(nn.Module):
    """Pre-activation residual block x + conv(act(norm(conv(act(norm(x)))))).

    With `zero_init` the last conv starts at zero, so a freshly inserted block is the identity.
    """

    def __init__(self, channels: int, hw: tuple[int, int], activation: Any = nn.ReLU,
                 norm_type: str = "LN", zero_init: bool = False) -> None:
        super().__init__()
        self.norm1 = _norm2d(norm_type, channels, hw)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = _norm2d(norm_type, channels, hw)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.act = _act(activation)
        if zero_init:
            nn.init.zeros_(self.conv2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(self.act(self.norm1(x)))
        return x + self.conv2(self.act(self.norm2(y)))


def _fc_head(in_size: int, layers: Sequence[int], out_size: int, activation: Any,
             zero_last: bool) -> nn.Sequential:
    mods: list[nn.Module] = []
    size = in_size
    for width in layers:
        mods += [nn.Linear(size, width), _act(activation)]
        size = width
    last = nn.Linear(size, out_size)
    if zero_last:
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
    mods.append(last)
    return nn.Sequential(*mods)


def latent_hw(observation_shape: Sequence[int], downsample: bool) -> tuple[int, int]:
    h, w = int(observation_shape[-2]), int(observation_shape[-1])
    return (math.ceil(h / 16), math.ceil(w / 16)) if downsample else (h, w)


class DynamicsNetwork(nn.Module):
    """Convolutional dynamics with a value-prefix LSTM (LightZero's documented interface).

    `num_channels` counts the latent channels plus `action_encoding_dim` action planes; the
    input `state_action_encoding` is their concatenation [B, num_channels, h, w]. The value
    prefix is predicted from the next latent through a 1x1 conv, an LSTM and an MLP head.
    `reward_hidden_state` is (h, c), each [B, lstm_hidden_size] or nn.LSTM-style [1, B, H];
    the returned state has the same layout.
    """

    def __init__(
        self,
        observation_shape: Sequence[int],
        action_encoding_dim: int = 2,
        num_res_blocks: int = 1,
        num_channels: int = 64,
        reward_head_channels: int = 64,
        fc_reward_layers: Sequence[int] = (32,),
        output_support_size: int = 601,
        flatten_output_size_for_reward_head: int = 64,
        downsample: bool = False,
        lstm_hidden_size: int = 512,
        last_linear_layer_init_zero: bool = True,
        activation: Any = nn.ReLU,
        norm_type: str = "BN",
    ) -> None:
        super().__init__()
        if norm_type not in ("BN", "LN"):
            raise ValueError(f"norm_type: expected 'BN' or 'LN', found {norm_type!r}")
        if num_channels <= action_encoding_dim:
            raise ValueError(f"num_channels: expected more than action_encoding_dim={action_encoding_dim}, found {num_channels}")
        self.action_encoding_dim = action_encoding_dim
        self.num_channels = num_channels
        self.flatten_output_size_for_reward_head = flatten_output_size_for_reward_head
        self.lstm_hidden_size = lstm_hidden_size
        self.norm_type = norm_type
        latent_c = num_channels - action_encoding_dim
        hw = latent_hw(observation_shape, downsample)
        self.conv = nn.Conv2d(num_channels, latent_c, 3, padding=1, bias=False)
        self.norm_common = _norm2d(norm_type, latent_c, hw)
        self.act = _act(activation)
        self.resblocks = nn.ModuleList(ResBlock(latent_c, hw, activation, norm_type) for _ in range(num_res_blocks))
        self.conv1x1_reward = nn.Conv2d(latent_c, reward_head_channels, 1)
        self.norm_reward = _norm2d(norm_type, reward_head_channels, hw)
        expected = reward_head_channels * hw[0] * hw[1]
        if flatten_output_size_for_reward_head != expected:
            raise ValueError(
                f"flatten_output_size_for_reward_head: expected reward_head_channels*h*w = {expected}, "
                f"found {flatten_output_size_for_reward_head}")
        self.lstm = LSTMCell(flatten_output_size_for_reward_head, lstm_hidden_size)
        self.norm_value_prefix = _norm1d(norm_type, lstm_hidden_size)
        self.fc_reward_head = _fc_head(lstm_hidden_size, list(fc_reward_layers), output_support_size,
                                       activation, last_linear_layer_init_zero)

    def forward(self, state_action_encoding: torch.Tensor, reward_hidden_state: Hidden | None
                ) -> tuple[torch.Tensor, Hidden, torch.Tensor]:
        state = state_action_encoding[:, : -self.action_encoding_dim]
        return self._from_conv(self.conv(state_action_encoding), state, reward_hidden_state, self.conv1x1_reward)

    def action_maps(self, hw: tuple[int, int]) -> torch.Tensor:
        """What the first conv makes of each action's planes alone, [A, latent channels, h, w]: the
        action part of `forward`'s input is one of A images (plane a all ones), so its convolution
        is a table of A maps (their borders differ: zero padding), computed once per unroll."""
        A, w = self.action_encoding_dim, self.conv.weight
        planes = w.new_ones(A).diag()[:, :, None, None].expand(A, A, *hw)  # eye(A) in w's dtype, traceable
        return F.conv2d(planes, w[:, -A:], padding=self.conv.padding)

    def forward_action(self, latent: torch.Tensor, action: torch.Tensor, reward_hidden_state: Hidden | None,
                       maps: torch.Tensor) -> tuple[torch.Tensor, Hidden, torch.Tensor]:
        """`forward` of `latent` concatenated with `action`'s one-hot planes, the same sums split in
        two: the conv of the latent's channels plus the action's map (`action_maps`), and the 1x1
        reward conv as a batched matrix product (`_conv1x1`). The learner's fast path unrolls with it:
        on a CPU a conv over latent + A channels costs about as much as over twice the latent's
        channels (oneDNN pads the odd count), and oneDNN's 1x1 backward is ~2x slower than a bmm's."""
        x = F.conv2d(latent, self.conv.weight[:, : -self.action_encoding_dim], padding=self.conv.padding)
        return self._from_conv(x + maps.index_select(0, action.long()), latent, reward_hidden_state,
                               lambda t: _conv1x1(t, self.conv1x1_reward))

    def _from_conv(self, x: torch.Tensor, state: torch.Tensor, reward_hidden_state: Hidden | None,
                   reward_conv: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, Hidden, torch.Tensor]:
        """The network after its first conv (`x`, before the norm): residual tower, value-prefix LSTM and head."""
        x = self.act(self.norm_common(x) + state)
        for block in self.resblocks:
            x = block(x)
        next_latent_state = _minmax(x)
        r = self.act(self.norm_reward(reward_conv(next_latent_state)))
        r = r.reshape(r.shape[0], self.flatten_output_size_for_reward_head)
        # either state layout ([B, H] or nn.LSTM's [1, B, H]) in and the same out, by reshapes rather than a
        # branch on the state's rank: the same values, and fx traces it (no Python test of a tensor's shape)
        hc, size = reward_hidden_state, self.lstm_hidden_size
        if hc is not None:
            hc = (hc[0].reshape(-1, size), hc[1].reshape(-1, size))
        h, c = self.lstm(r, hc)
        value_prefix = self.fc_reward_head(self.act(self.norm_value_prefix(h)))
        if reward_hidden_state is not None:
            h, c = h.reshape(reward_hidden_state[0].shape), c.reshape(reward_hidden_state[1].shape)
        return next_latent_state, (h, c), value_prefix

    def get_dynamic_mean(self) -> float:
        """Mean of the dynamics conv weights (a cheap health statistic LightZero logs)."""
        ws = [self.conv.weight.detach().reshape(-1)]
        for block in self.resblocks:
            ws += [block.conv1.weight.detach().reshape(-1), block.conv2.weight.detach().reshape(-1)]
        return float(torch.cat(ws).mean())

    def get_reward_mean(self) -> tuple[np.ndarray, float]:
        """(weights of the value-prefix head's last layer, their mean)."""
        w = self.fc_reward_head[-1].weight.detach().cpu().numpy().reshape(-1)
        return w, float(w.mean())


class MLPDynamicsNetwork(nn.Module):
    """Dynamics for vector latents: MLP(latent ++ one-hot action) -> next latent; LSTM -> value prefix."""

    def __init__(self, latent_size: int, action_space_size: int, width: int, blocks: Sequence[int],
                 lstm_hidden_size: int, fc_reward_layers: Sequence[int], output_support_size: int,
                 activation: str = "ReLU", generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.action_space_size = action_space_size
        self.trunk = EvolvableMLP(latent_size + action_space_size, latent_size, width, list(blocks), activation, generator)
        self.lstm = LSTMCell(latent_size, lstm_hidden_size)
        # no norm between LSTM and head: widening the LSTM then stays function-preserving
        self.fc_reward_head = _fc_head(lstm_hidden_size, list(fc_reward_layers), output_support_size, activation, True)

    def forward(self, state_action_encoding: torch.Tensor, reward_hidden_state: Hidden | None
                ) -> tuple[torch.Tensor, Hidden, torch.Tensor]:
        next_latent = _minmax(self.trunk(state_action_encoding))
        h, c = self.lstm(next_latent, reward_hidden_state)
        return next_latent, (h, c), self.fc_reward_head(h)

    def widen_lstm(self, extra: int, generator: torch.Generator | None = None) -> ParamChange:
        change = self.lstm.widen(extra, generator)
        return change.extend(_widen_inputs(self.fc_reward_head[0], extra))


class _Projection(nn.Module):
    """SimSiam-style projection and projection-prediction heads for the consistency loss."""

    def __init__(self, in_size: int, proj_size: int, activation: str) -> None:
        super().__init__()
        self.projection = nn.Sequential(nn.Linear(in_size, proj_size), nn.LayerNorm(proj_size), _act(activation),
                                        nn.Linear(proj_size, proj_size))
        self.prediction_head = nn.Sequential(nn.Linear(proj_size, proj_size // 2), nn.LayerNorm(proj_size // 2),
                                             _act(activation), nn.Linear(proj_size // 2, proj_size))


class StackedUnroll(NamedTuple):
    """The outputs of a K-step unroll stacked step-major (`forward(..., stacked=True)`): the same
    numbers as `Unroll` (each step's rows computed by the same layers, in one call for all steps)."""

    policy_logits: torch.Tensor          # [K+1, B, A]
    value_logits: torch.Tensor           # [K+1, B, 2Sv+1]
    value_prefix_logits: torch.Tensor    # [K, B, 2Sr+1]
    predicted_projections: torch.Tensor  # [K, B, P]
    target_projections: torch.Tensor     # [B, K, P], no gradient


class Unroll(NamedTuple):
    """The outputs of a K-step unroll (lists hold one [B, ...] tensor per step, kept apart rather than
    stacked so the learner's loss and its gradient are computed exactly as step-by-step code would)."""

    policy_logits: list[torch.Tensor]          # K+1: at the first observation, then after each action
    value_logits: list[torch.Tensor]           # K+1
    value_prefix_logits: list[torch.Tensor]    # K: after each action
    predicted_projections: list[torch.Tensor]  # K: project_predict(project(latent_k))
    target_projections: torch.Tensor           # [B, K, P]: project(represent(obs_k)), no gradient


def _halve_gradient(grad: torch.Tensor) -> torch.Tensor:
    return grad * 0.5


class _ModelBase(nn.Module):
    action_space_size: int
    value_support: int
    reward_support: int
    #: the bins' width on the h-transformed scale (agents.efficientzero.support)
    support_step: float = 1.0
    lstm_hidden_size: int
    #: observations are multiplied by this before the representation (1/255 for uint8 images)
    obs_scale: float = 1.0

    def initial_hidden(self, batch: int) -> Hidden:
        ref = next(self.parameters())
        z = ref.new_zeros(batch, self.lstm_hidden_size)
        return z, z.clone()

    def project(self, latent: torch.Tensor) -> torch.Tensor:
        return self.proj.projection(latent.flatten(1))

    def project_predict(self, proj: torch.Tensor) -> torch.Tensor:
        return self.proj.prediction_head(proj)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, lstm_horizon_len: int,
                stacked: bool = False, calls: Any = None) -> Unroll | StackedUnroll:
        """Unroll K = actions.shape[1] steps from obs[:, 0] along `actions` [B, K]; obs is [B, K+1, ...].

        The consistency targets (projections of the real observations obs[:, 1..K]) are computed
        first, without gradient. The gradient through each unrolled latent is halved (MuZero), and
        the LSTM state is reset every `lstm_horizon_len` steps, as the search does.

        `stacked=True` (the learner's fast path) returns a `StackedUnroll`: only the recurrence
        (dynamics) runs step by step; the prediction heads run once on all K+1 latents and the
        projection heads once on all K, and the LSTM's zero states are not multiplied. Each row's
        value is the same function of the weights (a pure rewrite: float64 results agree with the
        step-by-step unroll to rounding), with about a third of the calls. `calls` (stacked only; an
        `agents.efficientzero.flat.UnrollCalls`) runs its pieces as flat graphs: the same ops, bit for bit.
        """
        if stacked:
            return self._unroll_stacked(obs, actions, lstm_horizon_len, calls)
        B, K = actions.shape
        with torch.no_grad():
            nxt = obs[:, 1 : K + 1].reshape(B * K, *obs.shape[2:])
            target_projections = self.project(self.represent(nxt)).reshape(B, K, -1)
        latent = self.represent(obs[:, 0])
        policy, value = self.predict(latent)
        out = Unroll([policy], [value], [], [], target_projections)
        hidden = self.initial_hidden(B)
        for k in range(1, K + 1):
            latent, hidden, prefix_logits = self.dynamics(latent, actions[:, k - 1], hidden)
            if latent.requires_grad:
                latent.register_hook(_halve_gradient)
            policy, value = self.predict(latent)
            out.policy_logits.append(policy)
            out.value_logits.append(value)
            out.value_prefix_logits.append(prefix_logits)
            out.predicted_projections.append(self.project_predict(self.project(latent)))
            if k % lstm_horizon_len == 0:
                hidden = self.initial_hidden(B)
        return out

    def _unroll_stacked(self, obs: torch.Tensor, actions: torch.Tensor, lstm_horizon_len: int,
                        calls: Any = None) -> StackedUnroll:
        B, K = actions.shape
        c = self if calls is None else calls
        represent, project, project_predict = c.represent, c.project, c.project_predict
        predict = self._predict_stacked if calls is None else calls.predict
        with torch.no_grad():
            nxt = obs[:, 1 : K + 1].reshape(B * K, *obs.shape[2:])
            target_projections = project(represent(nxt)).reshape(B, K, -1)
        latent = represent(obs[:, 0])
        latents, prefixes = [latent], []
        hidden: Hidden | None = None  # the zero state
        dynamics = self._unroll_dynamics() if calls is None else calls.unroll_dynamics()
        for k in range(1, K + 1):
            latent, hidden, prefix_logits = dynamics(latent, actions[:, k - 1], hidden)
            if latent.requires_grad:
                latent.register_hook(_halve_gradient)
            latents.append(latent)
            prefixes.append(prefix_logits)
            if k % lstm_horizon_len == 0:
                hidden = None
        policy, value = predict(torch.cat(latents))
        predicted = project_predict(project(torch.cat(latents[1:])))
        return StackedUnroll(policy.reshape(K + 1, B, -1), value.reshape(K + 1, B, -1), torch.stack(prefixes),
                             predicted.reshape(K, B, -1), target_projections)

    def _unroll_dynamics(self) -> DynamicsStep:
        """The step function of one stacked unroll: `_unroll_step` with `_unroll_shared()` computed once."""
        shared = self._unroll_shared()
        return lambda latent, action, hidden: self._unroll_step(latent, action, hidden, *shared)

    def _unroll_shared(self) -> tuple[torch.Tensor, ...]:
        """What every step of one stacked unroll shares, computed once per unroll (a model's override)."""
        return ()

    def _unroll_step(self, latent: torch.Tensor, action: torch.Tensor, hidden: Hidden | None, *shared: torch.Tensor
                     ) -> tuple[torch.Tensor, Hidden, torch.Tensor]:
        """One step of the stacked unroll given `_unroll_shared()`: `dynamics`, or an equal override."""
        return self.dynamics(latent, action, hidden)

    def _predict_stacked(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`predict` on the stacked unroll's K+1 latents (an override may compute it differently)."""
        return self.predict(latent)

    def set_activation(self, name: str) -> ParamChange:
        """Swap every activation module for a fresh `name` activation."""
        return set_model_activation(self, name)

    def mutate_architecture(self, rng: np.random.Generator, new_layer_prob: float, bounds: Mapping[str, Any],
                            generator: torch.Generator | None = None) -> tuple[MutationRecord, ParamChange]:
        """One architecture change drawn with `rng` within `bounds` (the agent's arch table); the
        record says what changed, the ParamChange lets the caller carry optimizer state over."""
        raise NotImplementedError


#: the arch keys that bound an EvolvableMLP mutation
_MLP_BOUNDS = ("min_blocks", "max_blocks", "min_hidden", "max_hidden", "min_width", "max_width", "node_step")


class EfficientZeroMLP(_ModelBase):
    """All EfficientZero networks for vector observations (CartPole-sized by default)."""

    def __init__(self, obs_dim: int, action_space_size: int, arch: dict[str, Any],
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.obs_dim, self.action_space_size = obs_dim, action_space_size
        self.value_support = int(arch["value_support"])
        self.reward_support = int(arch["reward_support"])
        self.support_step = float(arch.get("support_step", 1.0))
        self.lstm_hidden_size = int(arch["lstm_hidden_size"])
        latent, act = int(arch["latent_size"]), arch["activation"]
        self.latent_size = latent
        width = int(arch["width"])
        self.representation = EvolvableMLP(obs_dim, latent, int(arch.get("rep_width", width)),
                                           list(arch.get("rep_blocks", arch["blocks"])), act, generator)
        self.dynamics_network = MLPDynamicsNetwork(latent, action_space_size, int(arch.get("dyn_width", width)),
                                                   list(arch.get("dyn_blocks", arch["blocks"])),
                                                   self.lstm_hidden_size, list(arch["fc_reward_layers"]),
                                                   2 * self.reward_support + 1, act, generator)
        self.prediction = EvolvableMLP(latent, action_space_size + 2 * self.value_support + 1,
                                       int(arch.get("pred_width", width)), list(arch.get("pred_blocks", arch["blocks"])),
                                       act, generator)
        with torch.no_grad():  # start with a uniform policy and a zero value
            self.prediction.fc_out.weight.zero_()
            self.prediction.fc_out.bias.zero_()
        self.proj = _Projection(latent, int(arch["proj_size"]), act)

    def represent(self, obs: torch.Tensor) -> torch.Tensor:
        # the networks' own dtype (float64 members in exactness tests), not always float32
        x = obs.flatten(1).to(self.representation.fc_in.weight.dtype)
        return _minmax(self.representation(x if self.obs_scale == 1.0 else x * self.obs_scale))

    def predict(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.prediction(latent)
        return out[:, : self.action_space_size], out[:, self.action_space_size:]

    def dynamics(self, latent: torch.Tensor, action: torch.Tensor, hidden: Hidden | None
                 ) -> tuple[torch.Tensor, Hidden, torch.Tensor]:
        onehot = _one_hot(action, self.action_space_size, latent)
        return self.dynamics_network(torch.cat([latent, onehot], dim=-1), hidden)

    def arch(self) -> dict[str, Any]:
        return {"rep_width": self.representation.width, "rep_blocks": self.representation.block_sizes,
                "dyn_width": self.dynamics_network.trunk.width, "dyn_blocks": self.dynamics_network.trunk.block_sizes,
                "pred_width": self.prediction.width, "pred_blocks": self.prediction.block_sizes,
                "lstm_hidden_size": self.lstm_hidden_size}

    def mutate_architecture(self, rng: np.random.Generator, new_layer_prob: float, bounds: Mapping[str, Any],
                            generator: torch.Generator | None = None) -> tuple[MutationRecord, ParamChange]:
        """Representation, dynamics trunk or prediction gets an `EvolvableMLP` mutation, or the
        value-prefix LSTM widens by `node_step` units (each of the four with equal chance). The trunk
        output of representation/dynamics is the latent, so the latent size never changes."""
        parts = {"representation": self.representation, "dynamics": self.dynamics_network.trunk,
                 "prediction": self.prediction}
        choice = int(rng.integers(len(parts) + 1))
        step = int(bounds["node_step"])
        if choice == len(parts):
            H = self.lstm_hidden_size
            if H + step > int(bounds["max_lstm_hidden_size"]):
                return MutationRecord.none("lstm_hidden_size at its bound"), ParamChange()
            change = self.dynamics_network.widen_lstm(step, generator)
            self.lstm_hidden_size = H + step
            return MutationRecord("widen_lstm", {"lstm_hidden_size": [H, H + step]}, True, {"network": "dynamics"}), change
        name = list(parts)[choice]
        mlp: EvolvableMLP = parts[name]
        change, record = mlp.mutate(rng, new_layer_prob, {k: int(bounds[k]) for k in _MLP_BOUNDS}, generator)
        record.details["network"] = name
        return record, change


class EfficientZeroConv(_ModelBase):
    """All EfficientZero networks for image observations [C, H, W] (residual conv towers)."""

    def __init__(self, obs_shape: Sequence[int], action_space_size: int, arch: dict[str, Any],
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if generator is not None:
            torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
        c_obs = int(obs_shape[0])
        self.obs_shape = tuple(int(s) for s in obs_shape)
        self.action_space_size = action_space_size
        self.value_support = int(arch["value_support"])
        self.reward_support = int(arch["reward_support"])
        self.support_step = float(arch.get("support_step", 1.0))
        self.lstm_hidden_size = int(arch["lstm_hidden_size"])
        self.downsample = bool(arch["downsample"])
        self.norm_type = arch["norm_type"]
        act, norm = arch["activation"], self.norm_type
        channels = int(arch["channels"])
        self.latent_channels = channels
        hw = latent_hw(obs_shape, self.downsample)
        self.hw = hw
        stem: list[nn.Module] = []
        if self.downsample:
            h1 = (math.ceil(obs_shape[1] / 2), math.ceil(obs_shape[2] / 2))
            h2 = (math.ceil(h1[0] / 2), math.ceil(h1[1] / 2))
            stem += [nn.Conv2d(c_obs, channels, 3, stride=2, padding=1), ResBlock(channels, h1, act, norm),
                     nn.Conv2d(channels, channels, 3, stride=2, padding=1), ResBlock(channels, h2, act, norm),
                     nn.AvgPool2d(2, ceil_mode=True), nn.AvgPool2d(2, ceil_mode=True)]
        else:
            stem += [nn.Conv2d(c_obs, channels, 3, padding=1, bias=False), _norm2d(norm, channels, hw), _act(act)]
        self.stem = nn.Sequential(*stem)
        self.rep_blocks = nn.ModuleList(ResBlock(channels, hw, act, norm) for _ in range(int(arch["num_res_blocks"])))
        reward_c = int(arch["reward_head_channels"])
        self.dynamics_network = DynamicsNetwork(
            obs_shape, action_encoding_dim=action_space_size,
            num_res_blocks=int(arch["num_res_blocks"] if arch.get("dyn_res_blocks") is None else arch["dyn_res_blocks"]),
            num_channels=channels + action_space_size, reward_head_channels=reward_c,
            fc_reward_layers=list(arch["fc_reward_layers"]), output_support_size=2 * self.reward_support + 1,
            flatten_output_size_for_reward_head=reward_c * hw[0] * hw[1], downsample=self.downsample,
            lstm_hidden_size=self.lstm_hidden_size, activation=make_activation(act).__class__ if act != "Threshold" else act,
            norm_type=norm)
        head_c = int(arch["head_channels"])
        flat = head_c * hw[0] * hw[1]
        self.pred_conv = nn.Sequential(nn.Conv2d(channels, head_c, 1), _act(act))
        self.policy_head = _fc_head(flat, [int(arch["width"])], action_space_size, act, True)
        self.value_head = _fc_head(flat, [int(arch["width"])], 2 * self.value_support + 1, act, True)
        self.proj = _Projection(channels * hw[0] * hw[1], int(arch["proj_size"]), act)

    def represent(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.to(self.stem[0].weight.dtype)
        x = self.stem(x if self.obs_scale == 1.0 else x * self.obs_scale)
        for block in self.rep_blocks:
            x = block(x)
        return _minmax(x)

    def predict(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.pred_conv(latent).flatten(1)
        return self.policy_head(x), self.value_head(x)

    def dynamics(self, latent: torch.Tensor, action: torch.Tensor, hidden: Hidden | None
                 ) -> tuple[torch.Tensor, Hidden, torch.Tensor]:
        planes = _one_hot(action, self.action_space_size, latent)
        planes = planes[:, :, None, None].expand(-1, -1, latent.shape[2], latent.shape[3])
        return self.dynamics_network(torch.cat([latent, planes], dim=1), hidden)

    def _unroll_shared(self) -> tuple[torch.Tensor, ...]:
        """The action planes' convolutions (`DynamicsNetwork.action_maps`), once per unroll."""
        return (self.dynamics_network.action_maps(self.hw),)

    def _unroll_step(self, latent: torch.Tensor, action: torch.Tensor, hidden: Hidden | None, *shared: torch.Tensor
                     ) -> tuple[torch.Tensor, Hidden, torch.Tensor]:
        """`dynamics` with the action planes' convolution looked up (`DynamicsNetwork.forward_action`)."""
        return self.dynamics_network.forward_action(latent, action, hidden, shared[0])

    def _predict_stacked(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`predict` with its 1x1 conv as a batched matrix product (`_conv1x1`: the same sums)."""
        conv, act = self.pred_conv
        x = act(_conv1x1(latent, conv)).flatten(1)
        return self.policy_head(x), self.value_head(x)

    def add_res_block(self, where: str) -> ParamChange:
        """Insert an identity-initialised residual block (function-preserving)."""
        blocks = self.rep_blocks if where == "representation" else self.dynamics_network.resblocks
        ref = next(self.parameters())
        act = type(self.dynamics_network.act) if not isinstance(self.dynamics_network.act, nn.Threshold) else "Threshold"
        block = ResBlock(self.latent_channels, self.hw, act, self.norm_type, zero_init=True).to(ref.device, ref.dtype)
        blocks.append(block)
        return ParamChange(added=list(block.parameters()))

    def remove_res_block(self, where: str) -> ParamChange:
        blocks = self.rep_blocks if where == "representation" else self.dynamics_network.resblocks
        block = blocks[len(blocks) - 1]
        del blocks[len(blocks) - 1]
        return ParamChange(removed=list(block.parameters()))

    def arch(self) -> dict[str, Any]:
        return {"num_res_blocks": len(self.rep_blocks), "dyn_res_blocks": len(self.dynamics_network.resblocks)}

    def mutate_architecture(self, rng: np.random.Generator, new_layer_prob: float, bounds: Mapping[str, Any],
                            generator: torch.Generator | None = None) -> tuple[MutationRecord, ParamChange]:
        """Representation or dynamics tower (even chance) gains an identity-initialised residual block
        (2:1 over removing one when both are allowed, within `min_res_blocks`..`max_res_blocks`).
        `new_layer_prob` and `generator` are unused: a new block's weights are zero or drawn from
        torch's global RNG."""
        where = "representation" if rng.random() < 0.5 else "dynamics"
        blocks = self.rep_blocks if where == "representation" else self.dynamics_network.resblocks
        n = len(blocks)
        lo, hi = int(bounds["min_res_blocks"]), int(bounds["max_res_blocks"])
        grow = n < hi and (n <= lo or rng.random() < 2 / 3)
        if grow:
            return (MutationRecord("add_res_block", {"res_blocks": [n, n + 1]}, True, {"network": where}),
                    self.add_res_block(where))
        if n > lo:
            return (MutationRecord("remove_res_block", {"res_blocks": [n, n - 1]}, False, {"network": where}),
                    self.remove_res_block(where))
        return MutationRecord.none("residual block count at its bounds"), ParamChange()


def build_model(obs_shape: Sequence[int], action_space_size: int, arch: dict[str, Any],
                generator: torch.Generator | None = None) -> _ModelBase:
    """The MLP variant for 1-D observations, the conv variant for [C, H, W] observations."""
    if arch.get("variant", "auto") == "conv" or (arch.get("variant", "auto") == "auto" and len(obs_shape) == 3):
        if len(obs_shape) != 3:
            raise ValueError(f"arch.variant: 'conv' needs [C, H, W] observations, found shape {tuple(obs_shape)}")
        state = torch.random.get_rng_state()
        try:
            model = EfficientZeroConv(obs_shape, action_space_size, arch, generator)
        finally:
            torch.random.set_rng_state(state)
        return model
    obs_dim = int(np.prod(obs_shape))
    state = torch.random.get_rng_state()
    try:  # modules without their own generator hook draw from the global RNG: seed it from ours
        if generator is not None:
            torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
        return EfficientZeroMLP(obs_dim, action_space_size, arch, generator)
    finally:
        torch.random.set_rng_state(state)


_ACT_TYPES = tuple({type(f()) for f in ACTIVATIONS.values()})


def set_model_activation(model: nn.Module, name: str) -> ParamChange:
    """Swap every activation module in `model` for a fresh `name` activation."""
    make_activation(name)  # validate early
    change = ParamChange()
    ref = next(model.parameters())
    for module in list(model.modules()):
        if isinstance(module, EvolvableMLP):
            module.activation = name
        for child_name, child in list(module.named_children()):
            if isinstance(child, _ACT_TYPES):
                change.removed += list(child.parameters())
                new = make_activation(name).to(ref.device, ref.dtype)
                change.added += list(new.parameters())
                setattr(module, child_name, new)
    return change
