"""Stacked parameters: N same-architecture modules as one set of tensors with a leading slot axis.

A `StackedModules` holds every parameter and buffer of a template module as one tensor of shape
[capacity, *shape]. Slot i holds member i; `load`, `read` and `copy` move one member in or out
of a slot in place, so the tensors never change shape (no recompiles, no re-allocation) while
members come, go and are cloned. `call` runs any method of the template with each slot's own
weights, vectorised over the slot axis with `torch.func.vmap`.

Members can share a stack only when their tensors have the same shapes and their code takes
the same path: `architecture_key` condenses exactly that into a short string.
"""

from __future__ import annotations

import copy
import hashlib
import json
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap

__all__ = ["architecture_key", "StackedModules", "MethodCall", "call_method", "batchnorm_modules"]

_NORMS_WITH_RUNNING_STATS = (nn.modules.batchnorm._BatchNorm,)


def batchnorm_modules(module: nn.Module) -> list[str]:
    """Names of submodules that update running statistics in training (they cannot run under vmap)."""
    return [name for name, m in module.named_modules()
            if isinstance(m, _NORMS_WITH_RUNNING_STATS) and m.track_running_stats]


def architecture_key(module: nn.Module, extra: Any = None) -> str:
    """A short string equal for two modules iff they can share a stack.

    It covers every parameter's and buffer's name, shape and dtype, and every submodule's class
    and `extra_repr()` (which holds settings such as an activation's threshold or a norm's eps).
    `extra` adds what the module alone does not show but changes the code path or shapes of the
    training step (e.g. a batch size); it must be JSON-serialisable.
    """
    parts: list[Any] = []
    for name, p in module.named_parameters():
        parts.append(["p", name, list(p.shape), str(p.dtype), bool(p.requires_grad)])
    for name, b in module.named_buffers():
        parts.append(["b", name, list(b.shape), str(b.dtype)])
    for name, m in module.named_modules():
        parts.append(["m", name, f"{type(m).__module__}.{type(m).__qualname__}", m.extra_repr()])
    parts.append(["x", extra])
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class MethodCall(nn.Module):
    """Wraps a module so `functional_call` can run any of its methods, not only `forward`."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.m = module

    def forward(self, method: str | Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if callable(method):  # several calls under one reparametrisation: method(module, *args)
            return method(self.m, *args, **kwargs)
        return getattr(self.m, method)(*args, **kwargs)


_CALLERS: weakref.WeakKeyDictionary[nn.Module, MethodCall] = weakref.WeakKeyDictionary()


def call_method(module: nn.Module, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                method: str | Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`module.method(*args)` computed with `params` and `buffers` in place of the module's own
    tensors (`torch.func.functional_call` for any method). `module` only supplies the code: any
    module of the same architecture gives the same result. This is what a fused loss calls.
    `method` may also be a function `f(module, *args)`: several calls under one swap of tensors."""
    caller = _CALLERS.get(module)
    if caller is None:
        caller = _CALLERS[module] = MethodCall(module)
    state = {f"m.{k}": v for k, v in params.items()}
    state.update({f"m.{k}": v for k, v in buffers.items()})
    return functional_call(caller, state, (method, *args), kwargs)


class StackedModules:
    """The parameters and buffers of up to `capacity` same-architecture modules, stacked by slot.

    `params` holds the trainable parameters (requires_grad), `buffers` everything else that the
    module's state dict holds (buffers and frozen parameters). Slots start empty (zeros);
    `active` marks those holding a member.
    """

    def __init__(self, template: nn.Module, capacity: int, device: torch.device | str | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: expected at least 1 slot, found {capacity}")
        ref = next(iter(template.parameters()), None)
        self.device = torch.device(device) if device is not None else (ref.device if ref is not None else torch.device("cpu"))
        # a private copy: the stack must not change when the caller's module does
        self.template = copy.deepcopy(template).to(self.device)
        self.key = architecture_key(template)
        self.capacity = int(capacity)
        self.params: dict[str, torch.Tensor] = {}
        self.buffers: dict[str, torch.Tensor] = {}
        for name, p in self.template.named_parameters():
            target = self.params if p.requires_grad else self.buffers
            target[name] = torch.zeros((capacity, *p.shape), dtype=p.dtype, device=self.device)
        for name, b in self.template.named_buffers():
            self.buffers[name] = torch.zeros((capacity, *b.shape), dtype=b.dtype, device=self.device)
        self.active = torch.zeros(capacity, dtype=torch.bool, device=self.device)

    # ---- slots ------------------------------------------------------------------------------
    def check(self, module: nn.Module) -> None:
        """Raise if `module` cannot live in this stack (another architecture)."""
        if architecture_key(module) != self.key:
            names = {n: tuple(t.shape[1:]) for n, t in {**self.params, **self.buffers}.items()}
            theirs = {n: tuple(t.shape) for n, t in module.state_dict().items()}
            diff = sorted(set(names.items()) ^ set(theirs.items()))[:3]
            raise ValueError(f"module does not fit this stack (architecture key {architecture_key(module)} != {self.key}); "
                             f"first differences (name, shape): {diff}")

    def load(self, slot: int, module: nn.Module) -> None:
        """Copy `module`'s weights into `slot` (in place) and mark the slot active."""
        self.check(module)
        with torch.no_grad():
            state = _named_tensors(module)
            for name, t in {**self.params, **self.buffers}.items():
                t[slot].copy_(state[name])
        self.active[slot] = True

    def read(self, slot: int, module: nn.Module) -> nn.Module:
        """Copy `slot`'s weights into `module` (same architecture) and return it."""
        self.check(module)
        with torch.no_grad():
            state = _named_tensors(module)
            for name, t in {**self.params, **self.buffers}.items():
                state[name].copy_(t[slot])
        return module

    def copy(self, src: int, dst: int) -> None:
        """Slot `dst` becomes an exact copy of slot `src` (exploit, clone)."""
        with torch.no_grad():
            for t in (*self.params.values(), *self.buffers.values()):
                t[dst].copy_(t[src])
        self.active[dst] = self.active[src]

    def release(self, slot: int) -> None:
        """Mark `slot` free; its tensors keep their values until the next `load`."""
        self.active[slot] = False

    def free_slots(self) -> list[int]:
        return [i for i in range(self.capacity) if not bool(self.active[i])]

    # ---- functional calls -------------------------------------------------------------------
    def call_one(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], method: str,
                 *args: Any, **kwargs: Any) -> Any:
        """Run `template.method(*args)` with one member's `params` and `buffers` (no slot axis).

        A loss function can call this inside the vmapped step (or `call_method` with its own template)."""
        return call_method(self.template, params, buffers, method, *args, **kwargs)

    def call(self, method: str, *args: Any, in_dims: Iterable[int | None] | None = None) -> Any:
        """`template.method(*args)` for every slot at once; each arg has a leading slot axis
        (or pass `in_dims` with None for args shared by every slot). Outputs have a slot axis."""
        dims = tuple(in_dims) if in_dims is not None else (0,) * len(args)

        def one(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], *a: Any) -> Any:
            return self.call_one(params, buffers, method, *a)

        return vmap(one, in_dims=(0, 0, *dims))(self.params, self.buffers, *args)

    def module_for(self, slot: int) -> nn.Module:
        """A fresh module holding `slot`'s weights (a copy of the template)."""
        return self.read(slot, copy.deepcopy(self.template))


def _named_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """A module's parameters and buffers by name (the tensors themselves, not copies)."""
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}
