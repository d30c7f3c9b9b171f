"""Networks whose shape can change during training without forgetting what they compute.

Two pieces every agent can use:

* `make_activation(name)`: the activation registry the activation mutation draws from.
* `ParamChange` + `remap_optimizer`: after an architecture mutation, the optimizer keeps its
  state (Adam moments, step counts) for every tensor that survived, and the overlapping part of
  every tensor that was resized. AgileRL rebuilds the optimizer from scratch after a mutation,
  which is why fitness often drops right after one; carrying the state avoids that.

`EvolvableMLP` is a residual MLP built so that every *growth* is exactly function-preserving
whatever the activation:

    z = act(W_in x + b_in)                         trunk of width `width`
    z = z + W2_k act(W1_k z + b1_k) + b2_k         one residual block per entry of `blocks`
    y = W_out z + b_out

* a new block starts with W2 = 0, b2 = 0, so it adds nothing (Net2DeeperNet needs an idempotent
  activation; a zero residual branch does not);
* a block widened by k units gets k new rows in W1 (random) and k zero columns in W2;
* the trunk widened by k dims gets k new rows in W_in, zero columns in every W1 and W_out,
  and zero rows in every W2, so the old dims never see the new ones until training moves them.

Removing a block or units cannot preserve the function in general; those mutations drop the
parts that contribute least (smallest outgoing weight norm) and say so in their record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from evo.records import MutationRecord

__all__ = [
    "ACTIVATIONS",
    "make_activation",
    "ParamChange",
    "remap_optimizer",
    "optimizer_state",
    "load_optimizer_state",
    "EvolvableMLP",
]

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "ReLU": nn.ReLU,
    "GELU": nn.GELU,
    "PReLU": nn.PReLU,
    "Tanh": nn.Tanh,
    "Sigmoid": nn.Sigmoid,
    "ELU": nn.ELU,
    # a floored identity: x above -1, else -1 (distinct from ReLU, still cheap)
    "Threshold": lambda: nn.Threshold(-1.0, -1.0),
    "LeakyReLU": nn.LeakyReLU,
    "SiLU": nn.SiLU,
    "Softsign": nn.Softsign,
    # GPT-2's own activation (gelu_new): a pretrained GPT-2 keeps computing what it was trained with
    "GELUTanh": lambda: nn.GELU(approximate="tanh"),
}


def make_activation(name: str) -> nn.Module:
    """A fresh activation module by name; unknown names get a list of the known ones."""
    try:
        return ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)}, found {name!r}") from None


Index = tuple[Any, ...]


@dataclass
class ParamChange:
    """What an architecture mutation did to a module's parameters.

    `resized`: (old, new, old_index, new_index) — new[new_index] continues old[old_index];
    `removed`: parameters that no longer exist; `added`: brand-new parameters.
    Parameters not mentioned are the same objects as before and keep their state untouched.
    """

    resized: list[tuple[nn.Parameter, nn.Parameter, Index, Index]] = field(default_factory=list)
    removed: list[nn.Parameter] = field(default_factory=list)
    added: list[nn.Parameter] = field(default_factory=list)

    def extend(self, other: ParamChange) -> ParamChange:
        self.resized += other.resized
        self.removed += other.removed
        self.added += other.added
        return self


def remap_optimizer(optimizer: torch.optim.Optimizer, change: ParamChange, group: int = 0) -> None:
    """Update `optimizer` in place to follow `change`, keeping every piece of state that still applies.

    Resized tensors keep their moments on the overlapping region (zeros elsewhere) and their
    step count; added tensors join param group `group` with fresh state; removed ones leave.
    """
    replace = {id(old): new for old, new, _, _ in change.resized}
    drop = {id(p) for p in change.removed}
    for g in optimizer.param_groups:
        params = []
        for p in g["params"]:
            if id(p) in drop:
                continue
            params.append(replace.get(id(p), p))
        g["params"] = params
    optimizer.param_groups[group]["params"].extend(change.added)
    for p in change.removed:
        optimizer.state.pop(p, None)
    for old, new, old_index, new_index in change.resized:
        state = optimizer.state.pop(old, None)
        if not state:
            continue
        moved: dict[str, Any] = {}
        for key, value in state.items():
            if torch.is_tensor(value) and value.shape == old.shape and value.dim() > 0:
                fresh = torch.zeros_like(new, memory_format=torch.preserve_format)
                fresh[new_index] = value[old_index]
                moved[key] = fresh
            else:
                moved[key] = value.clone() if torch.is_tensor(value) else value
        optimizer.state[new] = moved


def optimizer_state(optimizer: torch.optim.Optimizer, module: nn.Module) -> dict[str, Any]:
    """The optimizer's state keyed by parameter *name* in `module`, plus its group settings.

    By name, not position: after architecture mutations the optimizer's parameter order differs
    from a freshly built module's, so a positional state dict would pair moments with the wrong
    tensors. Tensors are copied to the CPU, so the tree checkpoints anywhere.
    """
    names = {id(p): n for n, p in module.named_parameters()}
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
              for g in optimizer.param_groups]
    state = {names[id(p)]: {k: (v.detach().cpu().clone() if torch.is_tensor(v) else v) for k, v in st.items()}
             for p, st in optimizer.state.items() if id(p) in names}
    return {"groups": groups, "state": state}


def load_optimizer_state(optimizer: torch.optim.Optimizer, module: nn.Module, saved: dict[str, Any]) -> None:
    """Inverse of `optimizer_state` for an optimizer over `module`'s parameters (copies, never aliases)."""
    params = dict(module.named_parameters())
    for group, settings in zip(optimizer.param_groups, saved["groups"]):
        group.update({k: (tuple(v) if isinstance(v, list) else v) for k, v in settings.items()})
    for name, st in saved["state"].items():
        if name not in params:
            raise ValueError(f"optimizer state: parameter {name!r} is not in the module built from the saved arch")
        device = params[name].device
        optimizer.state[params[name]] = {k: (v.clone().to(device) if torch.is_tensor(v) and v.dim() > 0
                                             else v.clone() if torch.is_tensor(v) else v) for k, v in st.items()}


def _resized(old: nn.Parameter, new_data: torch.Tensor, old_index: Index, new_index: Index,
             change: ParamChange) -> nn.Parameter:
    new = nn.Parameter(new_data)
    change.resized.append((old, new, old_index, new_index))
    return new


class _Block(nn.Module):
    def __init__(self, width: int, hidden: int, activation: str) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = make_activation(activation)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z + self.fc2(self.act(self.fc1(z)))


class EvolvableMLP(nn.Module):
    """A residual MLP whose width and depth mutate; see the module docstring for the maths.

    `arch` keys: width, blocks (list of block hidden sizes), activation, and optional bounds
    min_blocks, max_blocks, min_width, max_width, min_hidden, max_hidden, node_step.
    """

    def __init__(self, in_features: int, out_features: int, width: int = 64,
                 blocks: list[int] | tuple[int, ...] = (64,), activation: str = "ReLU",
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.activation = activation
        with _seeded(generator):
            self.fc_in = nn.Linear(in_features, width)
            self.act = make_activation(activation)
            self.blocks = nn.ModuleList(_Block(width, h, activation) for h in blocks)
            self.fc_out = nn.Linear(width, out_features)

    @property
    def width(self) -> int:
        return self.fc_in.out_features

    @property
    def block_sizes(self) -> list[int]:
        return [b.fc1.out_features for b in self.blocks]

    def arch(self) -> dict[str, Any]:
        return {"width": self.width, "blocks": self.block_sizes, "activation": self.activation}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.act(self.fc_in(x))
        for block in self.blocks:
            z = block(z)
        return self.fc_out(z)

    # -- growth (exact) ---------------------------------------------------------------------
    def add_block(self, position: int, hidden: int, generator: torch.Generator | None = None) -> ParamChange:
        """Insert a residual block whose output branch is zero: the function is unchanged."""
        with _seeded(generator):
            block = _Block(self.width, hidden, self.activation)
        ref = self.fc_in.weight
        block.to(device=ref.device, dtype=ref.dtype)
        with torch.no_grad():
            block.fc2.weight.zero_()
            block.fc2.bias.zero_()
        self.blocks.insert(position, block)
        return ParamChange(added=list(block.parameters()))

    def widen_block(self, i: int, extra: int, generator: torch.Generator | None = None) -> ParamChange:
        """Add `extra` hidden units to block i: new incoming rows random, outgoing columns zero."""
        block, change = self.blocks[i], ParamChange()
        h = block.fc1.out_features
        w1 = _init_like(block.fc1.weight, (h + extra, self.width), generator)
        b1 = _init_like(block.fc1.bias, (h + extra,), generator, fan_in=self.width)
        w1[:h], b1[:h] = block.fc1.weight.detach(), block.fc1.bias.detach()
        w2 = block.fc2.weight.new_zeros(self.width, h + extra)
        w2[:, :h] = block.fc2.weight.detach()
        block.fc1.weight = _resized(block.fc1.weight, w1, (slice(None),) * 2, (slice(0, h), slice(None)), change)
        block.fc1.bias = _resized(block.fc1.bias, b1, (slice(None),), (slice(0, h),), change)
        block.fc2.weight = _resized(block.fc2.weight, w2, (slice(None),) * 2, (slice(None), slice(0, h)), change)
        block.fc1.out_features = block.fc2.in_features = h + extra
        return change

    def widen_trunk(self, extra: int, generator: torch.Generator | None = None) -> ParamChange:
        """Add `extra` trunk dims that nothing old reads from and no block writes to (yet)."""
        change, w = ParamChange(), self.width
        n = w + extra
        full, head = (slice(None), slice(None)), (slice(0, w), slice(None))
        w_in = _init_like(self.fc_in.weight, (n, self.in_features), generator)
        b_in = _init_like(self.fc_in.bias, (n,), generator, fan_in=self.in_features)
        w_in[:w], b_in[:w] = self.fc_in.weight.detach(), self.fc_in.bias.detach()
        self.fc_in.weight = _resized(self.fc_in.weight, w_in, full, head, change)
        self.fc_in.bias = _resized(self.fc_in.bias, b_in, (slice(None),), (slice(0, w),), change)
        self.fc_in.out_features = n
        cols = (slice(None), slice(0, w))
        for block in self.blocks:
            w1 = block.fc1.weight.new_zeros(block.fc1.out_features, n)
            w1[:, :w] = block.fc1.weight.detach()
            block.fc1.weight = _resized(block.fc1.weight, w1, full, cols, change)
            w2 = block.fc2.weight.new_zeros(n, block.fc2.in_features)
            w2[:w] = block.fc2.weight.detach()
            block.fc2.weight = _resized(block.fc2.weight, w2, full, head, change)
            b2 = block.fc2.bias.new_zeros(n)
            b2[:w] = block.fc2.bias.detach()
            block.fc2.bias = _resized(block.fc2.bias, b2, (slice(None),), (slice(0, w),), change)
            block.fc1.in_features = block.fc2.out_features = n
        w_out = self.fc_out.weight.new_zeros(self.out_features, n)
        w_out[:, :w] = self.fc_out.weight.detach()
        self.fc_out.weight = _resized(self.fc_out.weight, w_out, full, cols, change)
        self.fc_out.in_features = n
        return change

    # -- shrinking (approximate: drops the least used parts) --------------------------------
    def remove_block(self, i: int) -> ParamChange:
        block = self.blocks[i]
        del self.blocks[i]
        return ParamChange(removed=list(block.parameters()))

    def narrow_block(self, i: int, remove: int) -> ParamChange:
        """Drop the `remove` hidden units of block i with the smallest outgoing weight norm."""
        block, change = self.blocks[i], ParamChange()
        h = block.fc1.out_features
        keep_n = h - remove
        norms = block.fc2.weight.detach().norm(dim=0)
        keep = torch.sort(torch.topk(norms, keep_n).indices).values
        block.fc1.weight = _resized(block.fc1.weight, block.fc1.weight.detach()[keep].clone(),
                                    (keep, slice(None)), (slice(None), slice(None)), change)
        block.fc1.bias = _resized(block.fc1.bias, block.fc1.bias.detach()[keep].clone(), (keep,), (slice(None),), change)
        block.fc2.weight = _resized(block.fc2.weight, block.fc2.weight.detach()[:, keep].clone(),
                                    (slice(None), keep), (slice(None), slice(None)), change)
        block.fc1.out_features = block.fc2.in_features = keep_n
        return change

    # -- activation ---------------------------------------------------------------------------
    def set_activation(self, name: str) -> ParamChange:
        """Swap every activation (not function-preserving; PReLU brings its own parameter)."""
        change = ParamChange()
        ref = self.fc_in.weight
        for owner in [self, *self.blocks]:
            change.removed += list(owner.act.parameters())
            owner.act = make_activation(name).to(device=ref.device, dtype=ref.dtype)
            change.added += list(owner.act.parameters())
        self.activation = name
        return change

    # -- the mutation the engine asks for -----------------------------------------------------
    def mutate(self, rng: np.random.Generator, new_layer_prob: float, bounds: dict[str, int],
               generator: torch.Generator | None = None) -> tuple[ParamChange, MutationRecord]:
        """One architecture mutation within `bounds`; returns the change and its record.

        With probability `new_layer_prob` a layer mutation (add or remove a block), otherwise
        a node mutation (widen or narrow a block, or widen the trunk). Growth is preferred
        when both directions are allowed (2:1), as in AgileRL.
        """
        b = {"min_blocks": 0, "max_blocks": 4, "min_hidden": 8, "max_hidden": 256,
             "min_width": 8, "max_width": 256, "node_step": 16, **bounds}
        step = int(b["node_step"])
        n_blocks = len(self.blocks)
        if rng.random() < new_layer_prob:
            can_add, can_remove = n_blocks < b["max_blocks"], n_blocks > b["min_blocks"]
            if can_add and (not can_remove or rng.random() < 2 / 3):
                pos = int(rng.integers(n_blocks + 1))
                hidden = int(np.clip(self.width, b["min_hidden"], b["max_hidden"]))
                change = self.add_block(pos, hidden, generator)
                return change, MutationRecord("add_block", {"blocks": [n_blocks, n_blocks + 1]}, True,
                                              {"position": pos, "hidden": hidden})
            if can_remove:
                norms = [float(blk.fc2.weight.detach().norm()) for blk in self.blocks]
                pos = int(np.argmin(norms))
                return self.remove_block(pos), MutationRecord("remove_block", {"blocks": [n_blocks, n_blocks - 1]},
                                                              norms[pos] == 0.0, {"position": pos})
            return ParamChange(), MutationRecord.none("block count at its bounds")
        options: list[tuple[str, int]] = []
        if self.width + step <= b["max_width"]:
            options.append(("widen_trunk", -1))
        for i, h in enumerate(self.block_sizes):
            if h + step <= b["max_hidden"]:
                options += [("widen_block", i)] * 2
            if h - step >= b["min_hidden"]:
                options.append(("narrow_block", i))
        if not options:
            return ParamChange(), MutationRecord.none("widths at their bounds")
        op, i = options[int(rng.integers(len(options)))]
        if op == "widen_trunk":
            width = self.width
            return self.widen_trunk(step, generator), MutationRecord(op, {"width": [width, self.width]}, True)
        hidden = self.block_sizes[i]
        change = self.widen_block(i, step, generator) if op == "widen_block" else self.narrow_block(i, step)
        return change, MutationRecord(op, {f"block{i}.hidden": [hidden, self.block_sizes[i]]}, op == "widen_block",
                                      {"block": i})


class _seeded:
    """Draw default PyTorch initialisations from `generator` (members stay reproducible)."""

    def __init__(self, generator: torch.Generator | None) -> None:
        self.generator = generator

    def __enter__(self) -> None:
        if self.generator is not None:
            self._state = torch.random.get_rng_state()
            torch.random.manual_seed(int(torch.randint(0, 2**62, (1,), generator=self.generator)))

    def __exit__(self, *exc: object) -> None:
        if self.generator is not None:
            torch.random.set_rng_state(self._state)


def _init_like(ref: torch.Tensor, shape: tuple[int, ...], generator: torch.Generator | None,
               fan_in: int | None = None) -> torch.Tensor:
    """Kaiming-uniform-like values (PyTorch's Linear default) for the new rows of a tensor."""
    fan = fan_in if fan_in is not None else shape[-1]
    bound = 1.0 / max(fan, 1) ** 0.5
    out = torch.empty(shape, dtype=ref.dtype)
    out.uniform_(-bound, bound, generator=generator)
    return out.to(ref.device)
