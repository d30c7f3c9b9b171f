"""Adam / AdamW over stacked parameters, with every setting and counter per member.

`StackedAdam` keeps, for each parameter tensor of shape [capacity, *shape], moments of the same
shape and a step counter of shape [capacity]; lr, betas, eps, weight decay and the gradient-clip
norm are [capacity] tensors. One `step` updates every active slot as `torch.optim.Adam` (or AdamW)
plus `clip_grad_norm_` would update that member alone — same formulas, same order — so float64
results agree with a per-member loop to rounding. Inactive slots are left untouched.

Per-parameter step counters (not one per member) are kept because a member's parameters can have
different ages: after an architecture mutation a new block starts at step 0 while the rest of
the network continues (see `evo.evolvable.remap_optimizer`).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["StackedAdam", "clip_per_member", "ADAM_DEFAULTS"]

#: the per-member settings and their torch.optim.Adam defaults; max_grad_norm=inf means no clipping
ADAM_DEFAULTS: dict[str, float] = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0,
                                   "max_grad_norm": float("inf")}


def _col(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A [C] tensor shaped to broadcast against [C, *shape] and cast to its dtype."""
    return x.to(like.dtype).reshape(-1, *([1] * (like.dim() - 1)))


def clip_per_member(grads: dict[str, torch.Tensor], max_norm: torch.Tensor) -> torch.Tensor:
    """Scale each member's gradients so that member's total norm is at most max_norm[i].

    The per-member version of `torch.nn.utils.clip_grad_norm_` (same formula, eps 1e-6): a global
    clip would let one member's large gradient shrink every other member's step. Returns the
    members' total norms before clipping, [C]. Modifies `grads` in place.
    """
    norms = [torch.linalg.vector_norm(g.reshape(g.shape[0], -1), 2, dim=1) for g in grads.values()]
    if not norms:
        return max_norm.new_zeros(max_norm.shape)
    total = torch.linalg.vector_norm(torch.stack(norms, dim=1), 2, dim=1)
    coef = (max_norm.to(total.dtype) / (total + 1e-6)).clamp(max=1.0)
    for g in grads.values():
        g.mul_(_col(coef, g))
    return total


class StackedAdam:
    """Adam (or AdamW with `decoupled_weight_decay=True`) for a dict of stacked parameters."""

    SETTINGS = tuple(ADAM_DEFAULTS)

    def __init__(self, params: dict[str, torch.Tensor], decoupled_weight_decay: bool = False) -> None:
        if not params:
            raise ValueError("StackedAdam: no parameters to optimise")
        self.params = params
        self.decoupled = bool(decoupled_weight_decay)
        ref = next(iter(params.values()))
        self.capacity, device = ref.shape[0], ref.device
        # settings in float64: bias corrections are computed as torch.optim.Adam computes them (Python floats)
        self.hp = {k: torch.full((self.capacity,), v, dtype=torch.float64, device=device) for k, v in ADAM_DEFAULTS.items()}
        self.exp_avg = {k: torch.zeros_like(p) for k, p in params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(p) for k, p in params.items()}
        self.steps = {k: torch.zeros(self.capacity, dtype=torch.float64, device=device) for k in params}

    # ---- per-member settings and state -------------------------------------------------------
    def set(self, slot: int, **settings: float) -> None:
        """Set some of lr, beta1, beta2, eps, weight_decay, max_grad_norm for one member."""
        unknown = sorted(set(settings) - set(self.hp))
        if unknown:
            raise ValueError(f"StackedAdam.set: unknown setting {unknown[0]!r}; expected some of {list(self.hp)}")
        for k, v in settings.items():
            self.hp[k][slot] = float(v)

    def settings(self, slot: int) -> dict[str, float]:
        return {k: float(v[slot]) for k, v in self.hp.items()}

    def load_state(self, slot: int, state: dict[str, dict[str, Any]]) -> None:
        """Adopt one member's torch.optim.Adam state, keyed by parameter name ({name: {step, exp_avg,
        exp_avg_sq}}, as `evo.evolvable.optimizer_state` writes it). Parameters absent from `state`
        start fresh (step 0, zero moments), exactly as Adam treats a parameter it has not seen."""
        unknown = sorted(set(state) - set(self.params))
        if unknown:
            raise ValueError(f"optimizer state: parameter {unknown[0]!r} is not in the stacked module")
        with torch.no_grad():
            for name in self.params:
                st = state.get(name) or {}
                if "exp_avg" in st:
                    self.exp_avg[name][slot].copy_(st["exp_avg"])
                    self.exp_avg_sq[name][slot].copy_(st["exp_avg_sq"])
                else:
                    self.exp_avg[name][slot].zero_()
                    self.exp_avg_sq[name][slot].zero_()
                self.steps[name][slot] = float(st["step"]) if "step" in st else 0.0

    def slot_state(self, slot: int) -> dict[str, dict[str, Any]]:
        """One member's state in torch.optim.Adam's per-parameter form (copies), keyed by name;
        parameters never stepped are absent, as in torch."""
        out = {}
        for name in self.params:
            step = float(self.steps[name][slot])
            if step == 0:
                continue
            out[name] = {"step": torch.tensor(step, dtype=torch.float32),
                         "exp_avg": self.exp_avg[name][slot].detach().clone(),
                         "exp_avg_sq": self.exp_avg_sq[name][slot].detach().clone()}
        return out

    def copy(self, src: int, dst: int) -> None:
        """Slot `dst` takes slot `src`'s moments, step counters and settings (exploit)."""
        with torch.no_grad():
            for name in self.params:
                self.exp_avg[name][dst].copy_(self.exp_avg[name][src])
                self.exp_avg_sq[name][dst].copy_(self.exp_avg_sq[name][src])
                self.steps[name][dst] = self.steps[name][src]
            for v in self.hp.values():
                v[dst] = v[src]

    # ---- the update -------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, grads: dict[str, torch.Tensor], active: torch.Tensor) -> None:
        """One Adam step for every active slot; `grads` are stacked like the parameters.

        In place, with the mask folded into [capacity] coefficients (an inactive slot gets lr 0, lerp
        weight 0 and beta2 1, and its gradient is zeroed, so its weights, moments and counters stay
        exactly as they were): a few ops per parameter, no masked copies of whole tensors."""
        hp = self.hp
        on = active.to(torch.float64)
        lr, beta1, beta2, eps, wd = hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"]
        for name, p in self.params.items():
            g = torch.where(_col(active, p).bool(), grads[name], 0.0)
            m, v, step = self.exp_avg[name], self.exp_avg_sq[name], self.steps[name]
            step.add_(on)
            if self.decoupled:
                p.mul_(_col(1 - lr * wd * on, p))
            else:
                g.addcmul_(_col(wd, g), p)  # g is our own tensor (torch.where made it)
            m.lerp_(g, _col((1 - beta1) * on, m))
            v.mul_(_col(torch.where(active, beta2, 1.0), v)).add_(g * g * _col((1 - beta2) * on, v))
            counted = step.clamp_min(1.0)  # an inactive slot that never stepped: any finite correction
            step_size = torch.where(active, lr / (1 - beta1**counted), 0.0)
            denom = v.sqrt().div_(_col((1 - beta2**counted) ** 0.5, v)).add_(_col(eps, v))
            p.sub_(m * _col(step_size, p) / denom)
