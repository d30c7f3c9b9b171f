"""Exact comparison of state trees (what `Agent.get_state` returns and checkpoints hold).

A state tree is nested dicts and lists of tensors, numpy arrays and JSON scalars. "Equal" here
means bit for bit: same keys, same dtypes, same shapes, same values (NaN equals NaN in the same
place). A checkpoint round trip turns tuples into lists, so the two count as the same sequence.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["state_differences", "assert_same_state", "metric_differences", "timing_names", "tensors", "shared_tensors"]


def state_differences(a: Any, b: Any, path: str = "", limit: int = 5) -> list[str]:
    """Where two state trees differ, as readable lines (at most `limit`); [] when they are identical."""
    out: list[str] = []
    _diff(a, b, path or "<root>", out, limit)
    return out


def _diff(a: Any, b: Any, path: str, out: list[str], limit: int) -> None:
    if len(out) >= limit:
        return
    if torch.is_tensor(a) or torch.is_tensor(b):
        if not (torch.is_tensor(a) and torch.is_tensor(b)):
            out.append(f"{path}: a {type(a).__name__} vs a {type(b).__name__}")
        elif a.dtype != b.dtype or a.shape != b.shape:
            out.append(f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}")
        elif not torch.equal(a.detach().cpu(), b.detach().cpu()) and not _same_with_nans(a, b):
            delta = (a.detach().cpu().double() - b.detach().cpu().double()).abs().nan_to_num(nan=math.inf).max()
            out.append(f"{path}: values differ (max |Δ| {float(delta):.3g})")
        return
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            out.append(f"{path}: a {type(a).__name__} vs a {type(b).__name__}")
        elif a.dtype != b.dtype or a.shape != b.shape:
            out.append(f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}")
        elif not np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
            out.append(f"{path}: values differ")
        return
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            only_a, only_b = sorted(map(str, set(a) - set(b))), sorted(map(str, set(b) - set(a)))
            out.append(f"{path}: keys differ (only in first: {only_a}, only in second: {only_b})")
            return
        for key in a:
            _diff(a[key], b[key], f"{path}.{key}", out, limit)
        return
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            out.append(f"{path}: length {len(a)} vs {len(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{path}[{i}]", out, limit)
        return
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return
    if type(a) is not type(b) and not (_is_number(a) and _is_number(b)):
        out.append(f"{path}: {a!r} ({type(a).__name__}) vs {b!r} ({type(b).__name__})")
    elif a != b:
        out.append(f"{path}: {a!r} vs {b!r}")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _same_with_nans(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not a.is_floating_point():
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    return bool(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))


def assert_same_state(a: Any, b: Any, what: str = "state") -> None:
    """AssertionError naming the first differing paths unless `a` and `b` are identical trees."""
    diffs = state_differences(a, b)
    if diffs:
        raise AssertionError(f"{what}: the two differ at\n  " + "\n  ".join(diffs))


def metric_differences(a: dict[str, Any], b: dict[str, Any], ignore: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Differences between two metric dicts, leaving out the names in `ignore` (wall-clock timings)."""
    keep_a = {k: v for k, v in a.items() if k not in ignore}
    keep_b = {k: v for k, v in b.items() if k not in ignore}
    return state_differences(keep_a, keep_b)


def timing_names(*metrics: dict[str, Any], extra: frozenset[str] | set[str] = frozenset()) -> frozenset[str]:
    """The metric names that measure wall-clock time: those containing "seconds" or ending in "_s",
    and any listed in `extra`. Runs that must be identical may still differ in these."""
    names = {k for m in metrics for k in m}
    return frozenset(extra) | {k for k in names if "seconds" in k or k.endswith("_s")}


def tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a tree of dicts, lists, modules' state dicts and optimizers' states."""
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from tensors(value)


def shared_tensors(a: Any, b: Any) -> list[str]:
    """Descriptions of tensors in `b` whose storage is also used by a tensor in `a` (empty: none shared)."""
    pointers = {t.untyped_storage().data_ptr() for t in tensors(a) if t.numel() > 0}
    return [f"{tuple(t.shape)} {t.dtype}" for t in tensors(b)
            if t.numel() > 0 and t.untyped_storage().data_ptr() in pointers]
