"""Categorical supports for values and value prefixes (MuZero appendix F).

A scalar x is squashed by h(x) = sign(x)(sqrt(|x|+1) - 1) + eps*x, then represented as a
"two-hot" distribution over the 2S+1 bins k*step, k = -S..S (step 1: MuZero's integers). The network
predicts logits over those bins; the expected bin mapped back through h^-1 gives the scalar.
A smaller `step` makes the bins finer on the h scale (`arch.support_step`): at step 1 one bin spans
about 20 return units near |x| = 100 and 28 near 200.
"""

from __future__ import annotations

import numpy as np
import torch

EPS = 0.001

__all__ = ["h", "h_inv", "scalar_to_support", "support_to_scalar", "h_inv_np", "support_to_scalar_np"]


def h(x: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """The invertible value transform h(x) = sign(x)(sqrt(|x|+1) - 1) + eps*x."""
    return torch.sign(x) * (torch.sqrt(torch.abs(x) + 1) - 1) + eps * x


def h_inv(y: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Exact inverse of `h` (closed form of the quadratic in sqrt(|x|+1))."""
    return torch.sign(y) * (
        ((torch.sqrt(1 + 4 * eps * (torch.abs(y) + 1 + eps)) - 1) / (2 * eps)) ** 2 - 1
    )


def h_inv_np(y: np.ndarray, eps: float = EPS) -> np.ndarray:
    return np.sign(y) * (((np.sqrt(1 + 4 * eps * (np.abs(y) + 1 + eps)) - 1) / (2 * eps)) ** 2 - 1)


def scalar_to_support(x: torch.Tensor, support_size: int, step: float = 1.0) -> torch.Tensor:
    """Two-hot targets: [...] scalars -> [..., 2S+1] probabilities on the transformed scale."""
    y = (h(x) if step == 1.0 else h(x) / step).clamp(-support_size, support_size)
    low = y.floor()
    frac = y - low
    idx = (low + support_size).long()
    out = torch.zeros(*x.shape, 2 * support_size + 1, dtype=x.dtype, device=x.device)
    out.scatter_(-1, idx.unsqueeze(-1), (1 - frac).unsqueeze(-1))
    upper = (idx + 1).clamp(max=2 * support_size)
    # when y sits exactly on the top bin frac is 0, so adding to the clamped index is harmless
    out.scatter_add_(-1, upper.unsqueeze(-1), frac.unsqueeze(-1))
    return out


def support_to_scalar(logits: torch.Tensor, support_size: int, step: float = 1.0) -> torch.Tensor:
    """Expected value of softmax(logits) over the bins (-S..S) * step, mapped back through h^-1."""
    probs = torch.softmax(logits, dim=-1)
    bins = torch.arange(-support_size, support_size + 1, dtype=probs.dtype, device=probs.device)
    y = (probs * bins).sum(-1)
    return h_inv(y if step == 1.0 else y * step)


def support_to_scalar_np(logits: np.ndarray, support_size: int, step: float = 1.0) -> np.ndarray:
    z = logits - logits.max(-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(-1, keepdims=True)
    bins = np.arange(-support_size, support_size + 1, dtype=p.dtype)
    return h_inv_np((p * bins).sum(-1) * step)
