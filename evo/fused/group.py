"""A fused group: same-architecture members trained as one vectorised program.

    group = FusedGroup(template, capacity=8, loss=my_loss)
    group.load(slot, module, optimizer_state, lr=3e-3, weight_decay=1e-4, max_grad_norm=10.0,
               scalars={"discount": 0.99})
    terms = group.step(batch)            # batch: a tree of tensors with a leading [capacity] axis
    group.read(slot, module)             # weights back into an ordinary module

The loss is any function `loss(params, buffers, batch, scalars) -> (total, {name: term})` written
for *one* member (use `group.stack.call_one(params, buffers, "method", ...)` to run the module);
the group evaluates it for every slot with `torch.func.vmap(torch.func.grad_and_value(loss))`,
clips each member's gradient by its own norm and applies `StackedAdam`, whose lr, betas, eps,
weight decay and step counters are per member. `scalars` are per-member numbers that enter the
loss (discounts, loss weights) and arrive as 0-d tensors.

Slots have a fixed capacity and an active mask, so members joining, leaving, being cloned or
exploited never change a tensor's shape: `exploit(src, dst)` copies weights, optimizer state,
settings and scalars in place. A member whose architecture changes leaves the group (`read`,
`release`) and joins the group of its new architecture (`FusedPopulation.place`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.func import grad_and_value, vmap
from torch.utils._pytree import tree_map

from evo.fused.adam import ADAM_DEFAULTS, StackedAdam, clip_per_member
from evo.fused.stack import StackedModules, architecture_key, batchnorm_modules

__all__ = ["FusedGroup", "FusedPopulation", "LossFn", "stack_batches", "can_fuse"]

LossFn = Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor], Any, dict[str, torch.Tensor]],
                  tuple[torch.Tensor, dict[str, torch.Tensor]]]


def can_fuse(module: nn.Module, warn: bool = True) -> bool:
    """False (with one warning line) for modules that cannot train under vmap: BatchNorm's running
    statistics are updated in place during training, which vmap cannot do per member."""
    bn = batchnorm_modules(module)
    if bn and warn:
        warnings.warn(f"fused training: {type(module).__name__} has BatchNorm ({bn[0]}); training its members "
                      f"one by one (use LayerNorm to fuse)", stacklevel=2)
    return not bn


def stack_batches(batches: Mapping[int, Any], capacity: int) -> Any:
    """Stack per-slot batches (trees of tensors of equal shapes) into one tree with a leading
    [capacity] axis. Empty slots get a copy of the first batch: they compute on it, shapes stay
    fixed, and their results are discarded."""
    if not batches:
        raise ValueError("stack_batches: no batches")
    filler = next(iter(batches.values()))
    rows = [batches.get(i, filler) for i in range(capacity)]
    return tree_map(lambda *xs: torch.stack(xs), *rows)


class FusedGroup:
    """Members of one architecture in `capacity` slots, trained with one vectorised step."""

    def __init__(self, template: nn.Module, capacity: int, loss: LossFn, *, decoupled_weight_decay: bool = False,
                 scalars: Mapping[str, float] | None = None, compile: bool = False,
                 device: torch.device | str | None = None) -> None:
        if not can_fuse(template, warn=False):
            raise ValueError(f"FusedGroup: {type(template).__name__} has BatchNorm ({batchnorm_modules(template)[0]}); "
                             f"its running statistics cannot update under vmap (use LayerNorm)")
        self.stack = StackedModules(template, capacity, device)
        self.key = self.stack.key
        self.capacity = self.stack.capacity
        self.loss = loss
        self.optimizer = StackedAdam(self.stack.params, decoupled_weight_decay)
        ref = next(iter(self.stack.params.values()))
        self.scalar_defaults = dict(scalars or {})
        self.scalars = {k: torch.full((self.capacity,), float(v), dtype=ref.dtype, device=ref.device)
                        for k, v in self.scalar_defaults.items()}
        self._grad_fn = vmap(grad_and_value(self._loss_one, has_aux=True), in_dims=(0, 0, 0, 0))
        self._step_fn: Callable[..., Any] = self._step_impl
        if compile:
            self._step_fn = torch.compile(self._step_impl, dynamic=False)

    # ---- members ------------------------------------------------------------------------------
    @property
    def active(self) -> torch.Tensor:
        return self.stack.active

    def load(self, slot: int, module: nn.Module, optimizer_state: Mapping[str, Any] | None = None,
             scalars: Mapping[str, float] | None = None, **settings: float) -> None:
        """Put a member into `slot`: its weights, its optimizer state (`{name: {step, exp_avg,
        exp_avg_sq}}`; None starts fresh), its loss scalars and its optimizer settings (lr, beta1,
        beta2, eps, weight_decay, max_grad_norm; unspecified ones take torch's defaults)."""
        self._check_slot(slot)
        self.stack.load(slot, module)
        self.optimizer.load_state(slot, dict(optimizer_state or {}))
        self.optimizer.set(slot, **{**ADAM_DEFAULTS, **settings})
        self.set_scalars(slot, **{**self.scalar_defaults, **dict(scalars or {})})

    def read(self, slot: int, module: nn.Module | None = None) -> nn.Module:
        """The member in `slot` as an ordinary module (written into `module` if given)."""
        return self.stack.read(slot, module) if module is not None else self.stack.module_for(slot)

    def optimizer_state(self, slot: int) -> dict[str, dict[str, Any]]:
        """The member's Adam state keyed by parameter name (copies)."""
        return self.optimizer.slot_state(slot)

    def set_scalars(self, slot: int, **values: float) -> None:
        unknown = sorted(set(values) - set(self.scalars))
        if unknown:
            raise ValueError(f"FusedGroup.set_scalars: unknown scalar {unknown[0]!r}; "
                             f"this group's loss takes {sorted(self.scalars)}")
        for k, v in values.items():
            self.scalars[k][slot] = float(v)

    def set_settings(self, slot: int, **settings: float) -> None:
        self.optimizer.set(slot, **settings)

    def exploit(self, src: int, dst: int) -> None:
        """Slot `dst` becomes an exact copy of `src`: weights, optimizer state, settings, scalars."""
        self._check_slot(src)
        self._check_slot(dst)
        self.stack.copy(src, dst)
        self.optimizer.copy(src, dst)
        for v in self.scalars.values():
            v[dst] = v[src]

    def release(self, slot: int) -> None:
        self.stack.release(slot)

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.capacity:
            raise IndexError(f"slot {slot}: expected 0..{self.capacity - 1}")

    # ---- training -----------------------------------------------------------------------------
    def _loss_one(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], batch: Any,
                  scalars: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        total, terms = self.loss(params, buffers, batch, scalars)
        return total, {"loss_total": total.detach(), **{k: v.detach() for k, v in terms.items()}}

    def _step_impl(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], batch: Any,
                   scalars: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        grads, (_, terms) = self._grad_fn(params, buffers, batch, scalars)
        return grads, terms

    def gradients(self, batch: Any) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Every slot's gradient of its own loss on its own batch, [capacity, ...], and the loss terms."""
        params = {k: p.detach() for k, p in self.stack.params.items()}
        return self._step_fn(params, self.stack.buffers, batch, self.scalars)

    def step(self, batch: Any, mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """One training step of every active member (and, with `mask`, only those it marks) on its
        own slice of `batch`; the others' slots compute but do not change.

        Returns each loss term and the pre-clip gradient norm as [capacity] tensors (entries of
        slots that did not step are meaningless)."""
        grads, terms = self.gradients(batch)
        norms = clip_per_member(grads, self.optimizer.hp["max_grad_norm"])
        stepping = self.stack.active if mask is None else self.stack.active & mask.to(self.stack.active.device)
        self.optimizer.step(grads, stepping)
        return {**terms, "grad_norm": norms}

    def call(self, method: str, *args: Any, in_dims: Any = None) -> Any:
        """Inference: `template.method(*args)` for every slot at once (args carry the slot axis)."""
        with torch.no_grad():
            return self.stack.call(method, *args, in_dims=in_dims)


class FusedPopulation:
    """Members placed into groups by architecture key; a member whose architecture changes moves.

    `key_fn` may add to the module's own key whatever else fixes the step's shapes (e.g. a batch
    size), and `group_factory(template, capacity)` builds a group for a new key.
    """

    def __init__(self, group_factory: Callable[[nn.Module, int], FusedGroup], capacity: int,
                 key_fn: Callable[[nn.Module, Any], str] | None = None) -> None:
        self.factory = group_factory
        self.capacity = int(capacity)
        self.key_fn = key_fn or (lambda module, extra: architecture_key(module, extra))
        self.groups: dict[str, FusedGroup] = {}
        self.where: dict[Any, tuple[str, int]] = {}

    def place(self, member: Any, module: nn.Module, optimizer_state: Mapping[str, Any] | None = None,
              scalars: Mapping[str, float] | None = None, extra: Any = None, **settings: float) -> tuple[FusedGroup, int]:
        """Load `member` into the group of its architecture (moving it if it lived elsewhere)."""
        key = self.key_fn(module, extra)
        old = self.where.get(member)
        if old is not None and old[0] != key:
            self.groups[old[0]].release(old[1])
            old = None
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = self.factory(module, self.capacity)
        if old is not None:
            slot = old[1]
        else:
            taken = {s for k, s in self.where.values() if k == key}
            free = [s for s in group.stack.free_slots() if s not in taken]
            if not free:
                raise RuntimeError(f"fused group {key} is full ({group.capacity} slots); raise the capacity")
            slot = free[0]
        group.load(slot, module, optimizer_state, scalars, **settings)
        self.where[member] = (key, slot)
        return group, slot

    def remove(self, member: Any) -> None:
        key, slot = self.where.pop(member)
        self.groups[key].release(slot)

    def locate(self, member: Any) -> tuple[FusedGroup, int]:
        key, slot = self.where[member]
        return self.groups[key], slot
