"""Schema: named fields with a dtype and a per-row shape, declared once per store.

Validation lives here so every backend refuses a bad batch the same way and before anything is
written (batch inserts are all-or-nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evo.replay.errors import ReplayError


@dataclass(frozen=True)
class Field:
    """One column: a numpy dtype name (``"float32"``, ``"int64"``, ``"bool"`` ...) and a row shape."""

    dtype: str
    shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        try:
            dt = np.dtype(self.dtype)
        except TypeError as exc:
            raise ReplayError(f"Field dtype {self.dtype!r} is not a numpy dtype") from exc
        if dt.kind not in "biuf" or dt.hasobject:
            raise ReplayError(f"Field dtype {self.dtype!r}: only bool, integer and float fields are storable")
        shape = tuple(int(s) for s in self.shape)
        if any(s < 0 for s in shape):
            raise ReplayError(f"Field shape {self.shape!r} has a negative dimension")
        object.__setattr__(self, "dtype", dt.name)
        object.__setattr__(self, "shape", shape)

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.np_dtype.itemsize


@dataclass(frozen=True)
class Schema:
    """Named fields plus the fields whose content defines a row's identity (its key).

    ``key_fields=None`` hashes every field; a tuple hashes only those (QueryModule-style
    aggregation), so rows equal on the key fields are one entry and the first one's other fields win.
    """

    fields: Mapping[str, Field]
    key_fields: tuple[str, ...] | None = None
    _key: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.fields:
            raise ReplayError("Schema needs at least one field")
        fields = {}
        for name, f in self.fields.items():
            if not isinstance(name, str) or not name:
                raise ReplayError(f"Schema field names must be non-empty strings, found {name!r}")
            if not isinstance(f, Field):
                raise ReplayError(f"Schema field {name!r}: expected a Field, found {type(f).__name__}")
            fields[name] = f
        object.__setattr__(self, "fields", fields)
        if self.key_fields is not None:
            kf = tuple(self.key_fields)
            if not kf:
                raise ReplayError("Schema key_fields is empty; use None to hash every field")
            unknown = [k for k in kf if k not in fields]
            if unknown:
                raise ReplayError(f"Schema key_fields {unknown} are not fields (fields: {sorted(fields)})")
            if len(set(kf)) != len(kf):
                raise ReplayError(f"Schema key_fields {kf} repeats a field")
            object.__setattr__(self, "key_fields", kf)
        # Hash order is sorted by name so that dict order never changes a key.
        object.__setattr__(self, "_key", tuple(sorted(self.key_fields or fields)))

    @property
    def hashed_fields(self) -> tuple[str, ...]:
        """Fields that feed the hash and the content comparison, in canonical (sorted) order."""
        return self._key

    def validate(self, batch: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
        """Check a batch against the schema; return contiguous arrays and the row count.

        Raises ReplayError naming the field, what was expected and what was found.
        """
        fast = self.__dict__.get("_fast_check")
        if fast is None:  # (name, dtype, row shape) per field, resolved once per schema
            fast = tuple((k, f.np_dtype, f.shape) for k, f in self.fields.items())
            object.__setattr__(self, "_fast_check", fast)
        if type(batch) is dict and len(batch) == len(fast):
            # the common case (exact dict of C-contiguous arrays of the right dtypes and shapes)
            # without building error context; anything unusual takes the full check below
            out, n = {}, -1
            for name, dt, shape in fast:
                a = batch.get(name)
                if (type(a) is not np.ndarray or a.dtype != dt or a.shape[1:] != shape or a.ndim != 1 + len(shape)
                        or not a.flags.c_contiguous or (n >= 0 and a.shape[0] != n)):
                    break
                n = a.shape[0]
                out[name] = a
            else:
                return out, max(n, 0)
        if not isinstance(batch, Mapping):
            raise ReplayError(f"insert expects a dict of arrays, found {type(batch).__name__}")
        missing = sorted(set(self.fields) - set(batch))
        extra = sorted(set(batch) - set(self.fields))
        if missing or extra:
            raise ReplayError(
                f"batch fields do not match the schema: missing {missing}, unexpected {extra} "
                f"(expected {sorted(self.fields)})"
            )
        out: dict[str, np.ndarray] = {}
        n = None
        for name, f in self.fields.items():
            arr = np.asarray(batch[name])
            if arr.dtype != f.np_dtype:
                raise ReplayError(
                    f"field {name!r}: expected dtype {f.dtype}, found {arr.dtype} (convert with .astype)"
                )
            if arr.ndim != 1 + len(f.shape) or tuple(arr.shape[1:]) != f.shape:
                raise ReplayError(
                    f"field {name!r}: expected shape (rows, {', '.join(map(str, f.shape))}) i.e. "
                    f"per-row {f.shape}, found {arr.shape}"
                )
            if n is None:
                n = arr.shape[0]
            elif arr.shape[0] != n:
                raise ReplayError(f"field {name!r}: has {arr.shape[0]} rows, other fields have {n}")
            out[name] = np.ascontiguousarray(arr)
        return out, int(n or 0)

    def to_json(self) -> dict:
        return {
            "fields": {k: {"dtype": f.dtype, "shape": list(f.shape)} for k, f in self.fields.items()},
            "key_fields": list(self.key_fields) if self.key_fields is not None else None,
        }

    @classmethod
    def from_json(cls, d: Mapping) -> Schema:
        kf = d.get("key_fields")
        return cls(
            {k: Field(v["dtype"], tuple(v["shape"])) for k, v in d["fields"].items()},
            key_fields=tuple(kf) if kf is not None else None,
        )
