"""Hyperparameter ranges and their mutation.

An `HParam` is a value plus the range it may move in. Mutation follows two public models:
AgileRL's RLParameter (multiply by a grow or shrink factor, then clip to [min, max]) and Ray Tune
PBT's *explore* (with `resample_prob`, draw a fresh value from the whole range instead).
Values never leave their bounds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

__all__ = ["HParam", "HParamError", "parse_hparam", "mutate_hparams"]

_KINDS = ("float", "int", "choice")
_SCALES = ("linear", "log")


class HParamError(ValueError):
    """A hyperparameter range that cannot be honoured (min > max, value outside, ...)."""


@dataclass(frozen=True)
class HParam:
    """One hyperparameter: its current value and, if mutable, its range.

    A range is present when `min`/`max` are given (float, int) or `choices` (choice).
    An HParam with no range is fixed: mutation never touches it.
    """

    value: Any
    min: float | None = None
    max: float | None = None
    scale: str = "linear"
    kind: str = "float"
    choices: tuple[Any, ...] | None = None
    grow: float = 1.2
    shrink: float = 0.8
    resample_prob: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise HParamError(f"kind: expected one of {list(_KINDS)}, found {self.kind!r}")
        if self.scale not in _SCALES:
            raise HParamError(f"scale: expected one of {list(_SCALES)}, found {self.scale!r}")
        if not 0.0 <= self.resample_prob <= 1.0:
            raise HParamError(f"resample_prob: expected a probability in [0, 1], found {self.resample_prob}")
        if self.kind == "choice":
            if not self.choices:
                raise HParamError("choices: expected a non-empty list for kind 'choice'")
            if self.value not in self.choices:
                raise HParamError(f"value: expected one of {list(self.choices)}, found {self.value!r}")
            return
        if (self.min is None) != (self.max is None):
            raise HParamError("min/max: give both bounds or neither")
        for bound in ("min", "max"):  # TOML allows inf/nan; a range must be a real interval to clip and sample in
            v = getattr(self, bound)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise HParamError(f"{bound}: expected a finite number, found {v!r}")
        if self.kind == "int" and not float(self.value).is_integer():
            raise HParamError(f"value: expected an integer, found {self.value!r}")
        if self.min is not None:
            if self.min > self.max:
                raise HParamError(f"min/max: expected min <= max, found min={self.min} > max={self.max}")
            if not self.min <= self.value <= self.max:
                raise HParamError(f"value: expected within [{self.min}, {self.max}], found {self.value}")
            if self.scale == "log" and self.min <= 0:
                raise HParamError(f"min: a log-scale range needs min > 0, found {self.min}")
        if not (self.grow >= 1.0 and 0.0 < self.shrink <= 1.0):
            raise HParamError(f"grow/shrink: expected grow >= 1 and 0 < shrink <= 1, found {self.grow}/{self.shrink}")

    @property
    def mutable(self) -> bool:
        return len(self.choices or ()) > 1 if self.kind == "choice" else self.min is not None and self.min < self.max

    def with_value(self, value: Any) -> HParam:
        data = asdict(self)
        data["value"] = value
        return HParam(**data)

    def sample(self, rng: np.random.Generator) -> Any:
        """A fresh value drawn from the whole range (uniform, or log-uniform on a log scale)."""
        if self.kind == "choice":
            return self.choices[int(rng.integers(len(self.choices)))]
        lo, hi = float(self.min), float(self.max)
        if self.scale == "log":
            x = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        else:
            x = rng.uniform(lo, hi)
        return self._fit(x)

    def mutate(self, rng: np.random.Generator) -> Any:
        """The next value: resample with `resample_prob`, otherwise grow or shrink (50/50) and clip."""
        if not self.mutable:
            return self.value
        if rng.random() < self.resample_prob:
            return self.sample(rng)
        if self.kind == "choice":
            others = [c for c in self.choices if c != self.value]
            return others[int(rng.integers(len(others)))] if others else self.value
        factor = self.grow if rng.random() < 0.5 else self.shrink
        x = float(self.value) * factor
        if self.kind == "int" and round(x) == self.value:
            # an int that rounds back to itself would never move: step by one in the chosen direction
            x = self.value + (1 if factor >= 1.0 else -1)
        return self._fit(x)

    def clip(self, x: float) -> Any:
        """`x` as a value of this range: clipped to [min, max], rounded for an int."""
        return self._fit(x)

    def _fit(self, x: float) -> Any:
        x = min(max(x, float(self.min)), float(self.max))
        if self.kind == "int":
            return int(min(max(round(x), math.ceil(self.min)), math.floor(self.max)))
        return float(x)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if data["choices"] is not None:
            data["choices"] = list(data["choices"])
        return data


_RANGE_KEYS = {"value", "min", "max", "scale", "kind", "choices", "grow", "shrink", "resample_prob"}


def parse_hparam(name: str, raw: Any, default: HParam | None = None) -> HParam:
    """Build an HParam from an experiment-file entry.

    `raw` is a plain value (fixed unless the agent's default declares a range, which it keeps)
    or a table with the keys of `HParam`. Errors name the hyperparameter and the field.
    """
    try:
        if isinstance(raw, dict):
            unknown = set(raw) - _RANGE_KEYS
            if unknown:
                raise HParamError(f"unknown key(s) {sorted(unknown)}; expected some of {sorted(_RANGE_KEYS)}")
            base = default.to_json() if default is not None else {}
            merged = {**base, **raw}
            if "value" not in merged:
                raise HParamError("value: expected a starting value")
            if "choices" in raw and "kind" not in raw:
                merged["kind"] = "choice"  # (otherwise the default's kind came with `base`)
            if merged.get("choices") is not None:
                merged["choices"] = tuple(merged["choices"])
            return HParam(**merged)
        if isinstance(raw, (list, tuple)):
            raise HParamError(f"expected a value or a table, found a list {raw!r}")
        if default is not None:
            if isinstance(raw, bool) != isinstance(default.value, bool):
                raise HParamError(f"expected a value like {default.value!r}, found {raw!r}")
            return default.with_value(raw)
        kind = "int" if isinstance(raw, int) and not isinstance(raw, bool) else "float"
        if not isinstance(raw, (int, float)) or isinstance(raw, bool):
            kind = "choice"
            return HParam(value=raw, kind=kind, choices=(raw,))
        return HParam(value=raw, kind=kind)
    except HParamError as exc:
        raise HParamError(f"{name}: {exc}") from None
    except TypeError as exc:
        raise HParamError(f"{name}: {exc}") from None


def mutate_hparams(
    space: dict[str, HParam], values: dict[str, Any], rng: np.random.Generator, n: int = 1, resample_prob: float = 0.0
) -> dict[str, tuple[Any, Any]]:
    """Mutate `n` randomly chosen mutable hyperparameters; returns {name: (old, new)} of the changes.

    `resample_prob`: the least chance that a picked hyperparameter is drawn afresh from its whole range
    (PBT's `resample_probability` for all of them at once); a hyperparameter's own, if higher, stays.
    The random draws are the same whatever it is, so 0 mutates exactly as before it existed."""
    if not 0.0 <= resample_prob <= 1.0:
        raise HParamError(f"resample_prob: expected a probability in [0, 1], found {resample_prob}")
    names = sorted(k for k, hp in space.items() if hp.mutable)
    if not names:
        return {}
    picked = rng.choice(len(names), size=min(n, len(names)), replace=False)
    changes: dict[str, tuple[Any, Any]] = {}
    for i in sorted(int(j) for j in picked):
        name = names[i]
        old = values[name]
        hp = space[name].with_value(old)
        if resample_prob > hp.resample_prob:
            hp = replace(hp, resample_prob=resample_prob)
        new = hp.mutate(rng)
        changes[name] = (old, new)
    return changes
