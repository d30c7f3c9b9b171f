"""Columnar row storage: one preallocated array per field, in memory or memory-mapped on disk.

Preallocation means an insert is a slice copy per field and a sample is one gather per field;
nothing grows or reallocates while training. ``mmap`` storage keeps the columns in ``.npy`` files
(``np.lib.format.open_memmap``) under ``path/store-<id>/`` so a store larger than RAM pages in on
demand and several stores (or a restored copy) can share one ``path`` without touching each
other's files.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping

import numpy as np

from evo.replay.errors import ReplayError
from evo.replay.schema import Schema

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _bits(a: np.ndarray) -> np.ndarray:
    """View as unsigned ints of the same width so comparison is bitwise (NaN == NaN, -0.0 != 0.0),
    matching what the hash saw."""
    return a.view(_UINT[a.dtype.itemsize]) if a.dtype.itemsize in _UINT else a


class ColumnStorage:
    """Fixed-capacity columns addressed by slot."""

    def __init__(self, schema: Schema, capacity: int, kind: str = "memory", path: str | os.PathLike | None = None) -> None:
        if capacity < 1:
            raise ReplayError(f"capacity must be at least 1, found {capacity}")
        if kind not in ("memory", "mmap"):
            raise ReplayError(f"storage must be 'memory' or 'mmap', found {kind!r}")
        self.schema, self.capacity, self.kind = schema, int(capacity), kind
        self.root = None
        self.dir = None
        if kind == "mmap":
            if path is None:
                raise ReplayError("storage='mmap' needs path=DIR for its column files")
            self.root = os.fspath(path)
            self.dir = os.path.join(self.root, f"store-{uuid.uuid4().hex[:12]}")
            os.makedirs(self.dir, exist_ok=False)
        self.columns: dict[str, np.ndarray] = {}
        for name, f in schema.fields.items():
            shape = (self.capacity, *f.shape)
            if kind == "memory":
                self.columns[name] = np.zeros(shape, dtype=f.np_dtype)
            else:
                fn = os.path.join(self.dir, f"{name}.npy")
                self.columns[name] = np.lib.format.open_memmap(fn, mode="w+", dtype=f.np_dtype, shape=shape)

    def write(self, start: int, n: int, arrays: Mapping[str, np.ndarray], rows: np.ndarray | None) -> np.ndarray:
        """Write ``n`` rows (``arrays[f][rows]``, or all rows when ``rows`` is None) to the ring
        positions ``start, start+1, ...`` (wrapping); return the slots written."""
        end = start + n
        if end <= self.capacity:
            for name, col in self.columns.items():
                src = arrays[name] if rows is None else arrays[name][rows]
                col[start:end] = src
            return np.arange(start, end, dtype=np.int64)
        slots = np.arange(start, end, dtype=np.int64) % self.capacity
        for name, col in self.columns.items():
            src = arrays[name] if rows is None else arrays[name][rows]
            col[slots] = src
        return slots

    def gather(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        # take() is several times faster than fancy indexing for 2-D columns
        return {name: col.take(slots, axis=0) for name, col in self.columns.items()}

    def equal_rows(self, names: tuple[str, ...], slots: np.ndarray, arrays: Mapping[str, np.ndarray],
                   rows: np.ndarray) -> np.ndarray:
        """Bitwise comparison of stored ``slots`` with ``arrays[...][rows]`` over ``names``."""
        eq = np.ones(len(slots), dtype=bool)
        for name in names:
            a = _bits(self.columns[name][slots]).reshape(len(slots), -1)
            b = _bits(np.ascontiguousarray(arrays[name][rows])).reshape(len(slots), -1)
            eq &= (a == b).all(axis=1)
        return eq

    def flush(self) -> None:
        if self.kind == "mmap":
            for col in self.columns.values():
                col.flush()

    def close(self) -> None:
        self.flush()
        self.columns = {}
