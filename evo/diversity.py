"""Population diversity: are the members different networks, and how far apart are they?

Measured by the engine on every generation's *trained* member states (`Agent.get_state()` trees),
so it works for any agent kind without asking the agent anything:

* The **parameter digest** of a member is a SHA-256 over every floating-point tensor or array in
  its state (weights, target networks, optimizer moments), visited in sorted path order, with each
  leaf's path, dtype and shape. RNG states (integer tensors, JSON strings), counters and other
  JSON are left out, so two members whose networks are bit-identical share a digest even when
  their random streams differ. `distinct` counts the digests of a generation; `identical` lists
  the groups of members that share one — a population member trained twice.
* The **mean pairwise relative distance** is cheap and continuous: for two members a and b,
  ‖a − b‖ / √((‖a‖² + ‖b‖²) / 2) over the float leaves both have at the same path with the same
  shape (architecture mutations change some shapes; those leaves are skipped for that pair). It is
  scale-free, so it reads the same for a tiny MLP and a transformer: 0 means identical and √2 is
  two unrelated vectors of equal norm. It is a mean over all pairs, so it does not show a single
  identical pair: the digests do.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np
import torch

__all__ = ["Diversity", "float_leaves", "parameter_digest", "relative_distance", "measure_diversity"]


@dataclass
class Diversity:
    """One generation's diversity: `members` trained, `distinct` parameter digests among them."""

    members: int
    distinct: int
    mean_distance: float                     # NaN when no pair of members has a comparable tensor
    identical: list[list[int]] = field(default_factory=list)   # groups of member indices sharing a digest
    digests: dict[int, str] = field(default_factory=dict)      # member index -> parameter digest

    @property
    def collapsed(self) -> bool:
        """Some members are bit-identical networks."""
        return self.distinct < self.members

    def summary(self) -> str:
        """One line for a person, e.g. '4/4 distinct, mean distance 0.031' or '… IDENTICAL: 3=5'."""
        distance = "-" if math.isnan(self.mean_distance) else f"{self.mean_distance:.3g}"
        line = f"{self.distinct}/{self.members} distinct, mean distance {distance}"
        if self.identical:
            line += " — IDENTICAL: " + ", ".join("=".join(str(i) for i in group) for group in self.identical)
        return line


def float_leaves(state: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """Every floating-point tensor / array of a state tree as a float64-comparable numpy array, by path."""
    out: dict[str, np.ndarray] = {}
    if torch.is_tensor(state):
        if state.is_floating_point():
            out[prefix] = state.detach().cpu().contiguous().numpy()
    elif isinstance(state, np.ndarray):
        if np.issubdtype(state.dtype, np.floating):
            out[prefix] = np.ascontiguousarray(state)
    elif isinstance(state, dict):
        for key in sorted(state, key=str):
            out.update(float_leaves(state[key], f"{prefix}/{key}"))
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            out.update(float_leaves(value, f"{prefix}/{i}"))
    return out


def parameter_digest(leaves: dict[str, np.ndarray]) -> str:
    """SHA-256 over the leaves in sorted path order, with each one's path, dtype and shape."""
    h = hashlib.sha256()
    for path in sorted(leaves):
        value = leaves[path]
        h.update(f"{path}|{value.dtype.str}|{value.shape};".encode())
        h.update(value.tobytes())
    return h.hexdigest()


def relative_distance(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """‖a − b‖ / √((‖a‖² + ‖b‖²) / 2) over the paths both have with equal shapes; NaN if none."""
    diff = norm_a = norm_b = 0.0
    shared = 0
    for path in sorted(a.keys() & b.keys()):
        x, y = a[path], b[path]
        if x.shape != y.shape:
            continue
        x64, y64 = x.astype(np.float64, copy=False).ravel(), y.astype(np.float64, copy=False).ravel()
        diff += float(np.dot(x64 - y64, x64 - y64))
        norm_a += float(np.dot(x64, x64))
        norm_b += float(np.dot(y64, y64))
        shared += 1
    if shared == 0:
        return math.nan
    scale = math.sqrt((norm_a + norm_b) / 2)
    return 0.0 if scale == 0.0 else math.sqrt(diff) / scale


def measure_diversity(states: dict[int, dict[str, Any]]) -> Diversity:
    """Diversity of the members `states` (member index -> `get_state()` tree)."""
    leaves = {index: float_leaves(state) for index, state in states.items()}
    digests = {index: parameter_digest(values) for index, values in leaves.items()}
    groups: dict[str, list[int]] = {}
    for index in sorted(digests):
        groups.setdefault(digests[index], []).append(index)
    distances = [relative_distance(leaves[i], leaves[j]) for i, j in combinations(sorted(leaves), 2)]
    distances = [d for d in distances if not math.isnan(d)]
    return Diversity(members=len(states), distinct=len(groups),
                     mean_distance=float(np.mean(distances)) if distances else math.nan,
                     identical=[g for g in groups.values() if len(g) > 1], digests=digests)
