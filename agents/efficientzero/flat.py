"""A model's network calls as flat torch.fx graphs: the same ops without nn.Module's per-call cost.

A CartPole member's search calls its networks 16 times per step on 8-10 rows. At that size each
`nn.Linear` costs ~4 µs of arithmetic and about as much again in `Module.__call__` and attribute
lookups (hooks, `__getattr__` through nested containers): ~47 of the ~130 µs of one
dynamics-and-prediction call. The learner's unroll makes ~120 module calls per update. `torch.fx`
traces a call through every submodule down to the functional ops (`F.linear`, `F.relu`, `torch.cat`,
...); here the parameters become the graph's inputs, so one call is one flat Python function of
tensors. The ops and their order are those of the modules, so outputs and gradients are bit for bit
the modules' (tests/efficientzero/test_flat.py).

Two sets of calls: `search_calls` (the search's initial and recurrent inference, `mcts.search`) and
`unroll_calls` (the pieces of the learner's stacked unroll, `_ModelBase._unroll_stacked`).

A graph belongs to one structure of the model: the identity of every submodule, parameter and buffer,
and the training flags (a model is in train mode while it learns and in eval mode while it searches:
both structures stay cached). A mutation that swaps a module or a parameter makes a new structure and
the next call traces again (~10 ms a graph); an optimiser step or `load_state_dict` writes the same
tensors in place and keeps the graphs. A model fx cannot trace (Python control flow on a tensor's
shape; the conv variant's was rewritten to read sizes by index), or one with forward or backward hooks
on a module (or global ones, which a graph would skip), keeps its modules' calls: both functions return
None.
Only the model's own parameters are traced: callers that swap others in (`functional_call`, vmap) use
the modules.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

__all__ = ["search_calls", "unroll_calls", "SearchCalls", "UnrollCalls", "enabled"]

#: whether the calls are traced (the learner's "fast" path; `learner.set_path("baseline")` turns it off,
#: so a side-by-side benchmark's baseline arm runs through the modules as first written)
enabled = True

Hidden = tuple[torch.Tensor, torch.Tensor]


class _Inline(fx.Tracer):
    """Traces into every module, so that only functional ops and parameter reads are left."""

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return False

    def call_module(self, m: torch.nn.Module, forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            return super().call_module(m, forward, args, kwargs)
        # a batch norm checks its input's rank in Python, which fx cannot trace; the check is validation only
        # (the same shapes meet it on the modules' path), so it is left out of the graph
        m.__dict__["_check_input_dim"] = lambda x: None
        try:
            return super().call_module(m, forward, args, kwargs)
        finally:
            del m.__dict__["_check_input_dim"]


class _Call(torch.nn.Module):
    """`fn(model, *inputs)` as a module fx can trace (a fixed number of named inputs: fx cannot trace *args)."""

    def __init__(self, model: torch.nn.Module, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.model, self.fn = model, fn


class _Call0(_Call):
    def forward(self) -> Any:
        return self.fn(self.model)


class _Call1(_Call):
    def forward(self, a: torch.Tensor) -> Any:
        return self.fn(self.model, a)


class _Call2(_Call):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Any:
        return self.fn(self.model, a, b)


class _Call3(_Call):
    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
        return self.fn(self.model, a, b, c)


class _Call4(_Call):
    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> Any:
        return self.fn(self.model, a, b, c, d)


class _Call5(_Call):
    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor, e: torch.Tensor) -> Any:
        return self.fn(self.model, a, b, c, d, e)


_ARITY = {0: _Call0, 1: _Call1, 2: _Call2, 3: _Call3, 4: _Call4, 5: _Call5}


def _flat_function(model: torch.nn.Module, arity: int, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn(model, *inputs)` traced into one graph whose parameters are arguments after the inputs:
    returns a function of the inputs with the parameters bound (the same tensor objects, so in-place
    updates show)."""
    root = _ARITY[arity](model, fn)
    graph = _Inline().trace(root)
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    last, tensors = (inputs[-1] if inputs else None), []
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        with graph.inserting_after(last) if last is not None else graph.inserting_before(next(iter(graph.nodes))):
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


def _split(out: tuple[Any, Hidden, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    latent, (h, c), prefix = out
    return latent, h, c, prefix


class SearchCalls:
    """A model's two search calls (`mcts.search`'s `initial_inference` and `recurrent_inference`)."""

    def __init__(self, model: torch.nn.Module) -> None:
        def initial(m: Any, obs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            latent = m.represent(obs)
            return (latent, *m.predict(latent))

        def recurrent(m: Any, latent: torch.Tensor, action: torch.Tensor, h: torch.Tensor, c: torch.Tensor
                      ) -> tuple[torch.Tensor, ...]:
            latent, h, c, prefix = _split(m.dynamics(latent, action, (h, c)))
            return (latent, h, c, prefix, *m.predict(latent))

        self._initial = _flat_function(model, 1, initial)
        self._recurrent = _flat_function(model, 4, recurrent)

    def initial_inference(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._initial(obs)

    def recurrent_inference(self, latent: torch.Tensor, action: torch.Tensor, hidden: Hidden) -> tuple[Any, ...]:
        latent, h, c, prefix, policy, value = self._recurrent(latent, action, *hidden)
        return latent, (h, c), prefix, policy, value


class UnrollCalls:
    """The calls of the learner's stacked unroll (`_ModelBase._unroll_stacked`'s `calls`): `represent`,
    `project`, `project_predict`, `predict` (the model's `_predict_stacked`) and `unroll_dynamics()` (the
    model's: what the steps share, `_unroll_shared`, once per unroll, then its `_unroll_step` per step;
    a None state is the zero state, a graph of its own)."""

    def __init__(self, model: Any) -> None:
        self.represent = _flat_function(model, 1, lambda m, x: m.represent(x))
        self.project = _flat_function(model, 1, lambda m, x: m.project(x))
        self.project_predict = _flat_function(model, 1, lambda m, x: m.project_predict(x))
        self.predict = _flat_function(model, 1, lambda m, x: m._predict_stacked(x))
        with torch.no_grad():  # only how many tensors the steps share
            n = len(model._unroll_shared())
        self._shared = _flat_function(model, 0, lambda m: tuple(m._unroll_shared())) if n else (lambda: ())
        self._first = _flat_function(model, 2 + n, lambda m, z, a, *s: _split(m._unroll_step(z, a, None, *s)))
        self._next = _flat_function(model, 4 + n, lambda m, z, a, h, c, *s: _split(m._unroll_step(z, a, (h, c), *s)))

    def unroll_dynamics(self) -> Callable[[torch.Tensor, torch.Tensor, Hidden | None], tuple[torch.Tensor, Hidden, torch.Tensor]]:
        """The step function of one unroll (as the model's `_unroll_dynamics()`)."""
        shared = self._shared()

        def step(latent: torch.Tensor, action: torch.Tensor, hidden: Hidden | None) -> tuple[torch.Tensor, Hidden, torch.Tensor]:
            out = self._first(latent, action, *shared) if hidden is None else self._next(latent, action, *hidden, *shared)
            return out[0], (out[1], out[2]), out[3]

        return step


def _hooked(module: torch.nn.Module) -> bool:
    """Has `module` forward or backward hooks? A traced graph calls no module, so it would skip them."""
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def _walk(module: torch.nn.Module, out: list[Any]) -> bool:
    """Append `module`'s part of the structure to `out`; whether any module on the way has hooks."""
    out.extend((module, module.training, *module._parameters.values(), *module._buffers.values()))
    hooked = _hooked(module)
    for child in module._modules.values():
        if child is not None:
            hooked = _walk(child, out) or hooked
    return hooked


def _global_hooks() -> bool:
    m = torch.nn.modules.module
    return bool(m._global_forward_hooks or m._global_forward_pre_hooks or m._global_backward_hooks
                or m._global_backward_pre_hooks)


def _structure(model: torch.nn.Module) -> tuple[list[Any], tuple[int, ...], bool]:
    """What a traced graph depends on, by identity: every submodule, its training flag, its parameters
    and buffers (read straight from the modules' dicts: ~15 µs, against ~100 for `modules()` and
    `parameters()`). The objects are returned too: held by the cache, their ids cannot be reused.
    The flag: whether some module has hooks (then the modules run, hooks and all)."""
    held: list[Any] = []
    hooked = _walk(model, held)
    return held[1:], tuple(map(id, held)), hooked


#: structures kept per model: its train-mode and eval-mode ones, and a spare
_KEEP = 3
#: model -> {structure key: (held objects, {kind: calls or None})}; weak, so a dead model's graphs go with it
_cache: weakref.WeakKeyDictionary[torch.nn.Module, OrderedDict[tuple[int, ...], tuple[list[Any], dict[str, Any]]]] = (
    weakref.WeakKeyDictionary())
_KINDS: dict[str, Callable[[torch.nn.Module], Any]] = {"search": SearchCalls, "unroll": UnrollCalls}
_lock = threading.Lock()  # the cache is process-wide; members in threads of one process share it


def _calls(model: Any, kind: str) -> Any:
    needed = ("represent", "predict", "dynamics")
    if not enabled or not isinstance(model, torch.nn.Module) or not all(hasattr(model, n) for n in needed):
        return None
    held, key, hooked = _structure(model)
    if hooked or _global_hooks():
        return None
    with _lock:
        entries = _cache.get(model)
        if entries is None:
            entries = _cache[model] = OrderedDict()
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = (held, {})
            while len(entries) > _KEEP:
                entries.popitem(last=False)
        entries.move_to_end(key)
        made = entry[1]
        if kind not in made:
            try:
                made[kind] = _KINDS[kind](model)
            except Exception:  # untraceable Python in the model (fx raises its own kinds): its modules' calls serve
                made[kind] = None
        return made[kind]


def search_calls(model: Any) -> SearchCalls | None:
    """`model`'s search calls as flat graphs, traced on first use and again when its structure changes;
    None for a model fx cannot trace or that is not an nn.Module with represent/predict/dynamics."""
    return _calls(model, "search")


def unroll_calls(model: Any) -> UnrollCalls | None:
    """The learner's unroll calls of `model` as flat graphs (as `search_calls`); None where they cannot be."""
    return _calls(model, "unroll")
