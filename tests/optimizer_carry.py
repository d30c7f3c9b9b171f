"""Does an architecture mutation carry the optimizer's state? A check any torch agent's tests can use.

    before = OptimizerSnapshot.take(modules, optimizer)
    ... the mutation ...
    counts = before.assert_carried(modules, optimizer)

Parameters are matched by (module, attribute): the same object afterwards is a *kept* parameter,
and every piece of its state (exp_avg, exp_avg_sq, step, …) must be exactly what it was; a new
object under the same module attribute is a *resized* parameter, and its step must be the old
step while every element of the smaller of the two tensors reappears in the larger one *together
with its moments*: the (weight, exp_avg, exp_avg_sq) triples of the smaller tensor are a
sub-multiset of the larger one's. The weights witness where each element went, so this checks the
overlap of any index mapping (head slices, LSTM gate blocks, kept units after narrowing) without
knowing it. A fresh optimizer (AgileRL's way) or moments left behind fail it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["OptimizerSnapshot", "clear_optimizer_state", "zero_second_moments"]

Key = tuple[int, str]


def _named(modules: list[nn.Module]) -> dict[Key, tuple[nn.Module, nn.Parameter]]:
    out: dict[Key, tuple[nn.Module, nn.Parameter]] = {}
    for root in modules:
        for module in root.modules():
            for name, p in module.named_parameters(recurse=False):
                out[(id(module), name)] = (module, p)
    return out


def _copy_state(state: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in state.items()}


def _triples(weight: torch.Tensor, state: dict[str, Any]) -> Counter:
    """Each element's (weight, state tensors of the weight's shape…) as a hashable tuple."""
    keys = _moment_keys(state, weight.shape)
    columns = [weight.detach().reshape(-1).double()] + [state[k].detach().reshape(-1).double() for k in keys]
    return Counter(map(tuple, torch.stack(columns, 1).tolist()))


def _moment_keys(state: dict[str, Any], shape: torch.Size) -> list[str]:
    return sorted(k for k, v in state.items() if torch.is_tensor(v) and v.shape == shape and v.dim() > 0)


@dataclass
class OptimizerSnapshot:
    params: dict[Key, tuple[nn.Module, nn.Parameter]]  # keeps old modules alive: their ids stay unique
    weights: dict[Key, torch.Tensor]
    state: dict[Key, dict[str, Any]]

    @classmethod
    def take(cls, modules: list[nn.Module], optimizer: torch.optim.Optimizer) -> OptimizerSnapshot:
        params = _named(modules)
        return cls(params, {k: p.detach().clone() for k, (_, p) in params.items()},
                   {k: _copy_state(optimizer.state.get(p, {})) for k, (_, p) in params.items()})

    def assert_carried(self, modules: list[nn.Module], optimizer: torch.optim.Optimizer) -> dict[str, int]:
        """Assert the state was carried (see the module docstring); returns counts of kept, resized,
        removed and added parameters, and how many kept or resized ones had state to carry."""
        now = _named(modules)
        in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
        module_params = {id(p) for _, p in now.values()}
        assert in_optimizer == module_params, "the optimizer's parameters are not exactly the module's parameters"
        counts = dict.fromkeys(("kept", "resized", "removed", "added", "with_state"), 0)
        for key, (_, old) in self.params.items():
            if key not in now:
                counts["removed"] += 1
                continue
            new = now[key][1]
            before, after = self.state[key], optimizer.state.get(new, {})
            counts["with_state"] += bool(before)
            if new is old:
                counts["kept"] += 1
                assert before.keys() == after.keys(), f"kept {key[1]}: state keys {sorted(before)} became {sorted(after)}"
                for k, v in before.items():
                    assert torch.equal(torch.as_tensor(v), torch.as_tensor(after[k])), f"kept {key[1]}: {k} changed"
                continue
            counts["resized"] += 1
            if not before:
                continue
            for k in set(before) - set(_moment_keys(before, old.shape)):
                assert k in after and torch.equal(torch.as_tensor(before[k]), torch.as_tensor(after[k])), \
                    f"resized {key[1]} {tuple(old.shape)}->{tuple(new.shape)}: {k} not carried"
            old_t, new_t = _triples(self.weights[key], before), _triples(new, after)
            small, large = (old_t, new_t) if old.numel() <= new.numel() else (new_t, old_t)
            missing = small - large
            assert not missing, (f"resized {key[1]} {tuple(old.shape)}->{tuple(new.shape)}: {sum(missing.values())} "
                                 f"elements lost their moments on the overlap")
        counts["added"] = sum(1 for key in now if key not in self.params)
        return counts


def clear_optimizer_state(agent: Any) -> None:
    """The 'fresh Adam' mutant: what rebuilding the optimizer after a mutation leaves."""
    for opt in agent.optimizers():
        opt.state.clear()


def zero_second_moments(agent: Any) -> None:
    """A subtler mutant: first moments carried, second moments restarted."""
    for opt in agent.optimizers():
        for st in opt.state.values():
            if "exp_avg_sq" in st:
                st["exp_avg_sq"].zero_()
