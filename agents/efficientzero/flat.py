"""The search's network calls as flat torch.fx graphs: the same ops without nn.Module's per-call cost.

A CartPole member's search calls its networks 16 times per step on 8-10 rows. At that size each
`nn.Linear` costs ~4 µs of arithmetic and about as much again in `Module.__call__` and attribute
lookups (hooks, `__getattr__` through nested containers): ~47 of the ~130 µs of one
dynamics-and-prediction call. `torch.fx` traces a call through every submodule down to the functional
ops (`F.linear`, `F.relu`, `torch.cat`, ...); here the parameters become the graph's inputs, so one
call is one flat Python function of tensors. The ops and their order are those of the modules, so
the outputs are bit-for-bit the modules' (tests/efficientzero/test_flat.py).

A graph belongs to one structure of the model: the identity of every submodule, parameter and buffer,
and the training flags. A mutation that swaps a module or a parameter makes a new
structure and the next call traces again (~10 ms); an optimiser step or `load_state_dict` writes the
same tensors in place and keeps the graph. A model fx cannot trace (Python control flow on a tensor's
shape, as in the conv variant's 1x1 convolutions) keeps its modules' calls: `search_calls` returns None.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

__all__ = ["search_calls", "SearchCalls", "enabled"]

#: whether `search_calls` traces (the learner's "fast" path; `learner.set_path("baseline")` turns it off,
#: so a side-by-side benchmark's baseline arm searches through the modules as first written)
enabled = True

#: (latent, p_logits, v_logits) from observations
Initial = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
#: (latent, (h, c), value-prefix logits, p_logits, v_logits) from (latent, action, (h, c))
Recurrent = Callable[[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]], tuple[Any, ...]]


class _Inline(fx.Tracer):
    """Traces into every module, so that only functional ops and parameter reads are left."""

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return False


class _InitialCall(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        latent = self.model.represent(obs)
        policy, value = self.model.predict(latent)
        return latent, policy, value


class _RecurrentCall(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, latent: torch.Tensor, action: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[Any, ...]:
        latent, (h, c), prefix = self.model.dynamics(latent, action, (h, c))
        policy, value = self.model.predict(latent)
        return latent, h, c, prefix, policy, value


def _flat_function(root: torch.nn.Module) -> Callable[..., Any]:
    """`root.forward` traced into one graph whose parameters are arguments after the call's own:
    returns fn(*args) with the parameters bound (the same tensor objects, so in-place updates show)."""
    graph = _Inline().trace(root)
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    last, tensors = inputs[-1], []
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        with graph.inserting_after(last):
            last = graph.placeholder(f"p{len(tensors)}")
        node.replace_all_uses_with(last)
        graph.erase_node(node)
        value: Any = root
        for part in node.target.split("."):
            value = getattr(value, part)
        tensors.append(value)
    graph.lint()
    forward = fx.GraphModule(torch.nn.Module(), graph).forward  # no reference back to the model

    def call(*args: Any) -> Any:
        return forward(*args, *tensors)

    return call


class SearchCalls:
    """A model's two search calls as flat graphs (`search_calls`)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._initial = _flat_function(_InitialCall(model))
        self._recurrent = _flat_function(_RecurrentCall(model))

    def initial_inference(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._initial(obs)

    def recurrent_inference(self, latent: torch.Tensor, action: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]
                            ) -> tuple[Any, ...]:
        latent, h, c, prefix, policy, value = self._recurrent(latent, action, *hidden)
        return latent, (h, c), prefix, policy, value


def _walk(module: torch.nn.Module, out: list[Any]) -> None:
    out.extend((module, module.training, *module._parameters.values(), *module._buffers.values()))
    for child in module._modules.values():
        if child is not None:
            _walk(child, out)


def _structure(model: torch.nn.Module) -> tuple[list[Any], tuple[int, ...]]:
    """What a traced graph depends on, by identity: every submodule, its training flag, its parameters
    and buffers (read straight from the modules' dicts: ~15 µs, against ~100 for `modules()` and
    `parameters()`). The objects are returned too: held by the cache, their ids cannot be reused."""
    held: list[Any] = []
    _walk(model, held)
    return held[1:], tuple(map(id, held))


_cache: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple[Any, ...], list[Any], SearchCalls | None]] = (
    weakref.WeakKeyDictionary())


def search_calls(model: Any) -> SearchCalls | None:
    """`model`'s search calls as flat graphs, traced on first use and again when its structure changes;
    None for a model fx cannot trace or that is not an nn.Module with represent/predict/dynamics."""
    calls_needed = ("represent", "predict", "dynamics")
    if not enabled or not isinstance(model, torch.nn.Module) or not all(hasattr(model, n) for n in calls_needed):
        return None
    held, key = _structure(model)
    cached = _cache.get(model)
    if cached is not None and cached[0] == key:
        return cached[2]
    try:
        calls: SearchCalls | None = SearchCalls(model)
    except Exception:  # untraceable Python in the model (fx raises its own kinds): its modules' calls serve
        calls = None
    _cache[model] = (key, held, calls)
    return calls
