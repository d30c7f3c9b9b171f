"""Stable, vectorised content hashing of rows.

Why not Python's ``hash()`` (what TorchRL's SipHash uses): it is seeded per process, so the same row
gets a different key in every worker and after every restart. Here a row's key depends only on its
bytes (little-endian, canonical field order) and on the schema of the hashed fields, so it is the
same in every process, on every machine and across restarts.

The hash is a per-word mix (multiply / xor-shift, position-dependent constants) summed over the
row's 64-bit words and finished with the murmur3 ``fmix64`` avalanche. It runs as a handful of
whole-batch numpy operations. It is not cryptographic and need not be: every hash hit is confirmed
by comparing content (see ``store.py``), so a collision can never merge two different rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

import numpy as np
import xxhash

from evo.replay import _kernels
from evo.replay.schema import Schema

HashFn = Callable[[Schema, Mapping[str, np.ndarray]], np.ndarray]

_M64 = (1 << 64) - 1
_P1 = np.uint64(0x9E3779B97F4A7C15)  # golden ratio (odd)
_P2 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64 multipliers
_P3 = np.uint64(0x94D049BB133111EB)
_F1 = np.uint64(0xFF51AFD7ED558CCD)  # murmur3 fmix64
_F2 = np.uint64(0xC4CEB9FE1A85EC53)
_S29, _S31, _S32, _S33 = (np.uint64(s) for s in (29, 31, 32, 33))


def _splitmix(n: int, seed: int) -> np.ndarray:
    """n stable pseudo-random 64-bit constants (python ints, so identical everywhere)."""
    out, x = [], seed
    for _ in range(n):
        x = (x + 0x9E3779B97F4A7C15) & _M64
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        out.append(z ^ (z >> 31))
    return np.array(out, dtype=np.uint64)


_MAX_WORDS = 1 << 10
_ADD = _splitmix(_MAX_WORDS, 1)
_MUL = _splitmix(_MAX_WORDS, 2) | np.uint64(1)  # odd multipliers are bijective mod 2**64


def schema_seed(schema: Schema) -> int:
    """A stable 64-bit seed from the hashed fields' names, dtypes and shapes (xxh3)."""
    desc = [(n, schema.fields[n].dtype, list(schema.fields[n].shape)) for n in schema.hashed_fields]
    return xxhash.xxh3_64_intdigest(json.dumps(desc, separators=(",", ":")).encode())


def _layout(schema: Schema) -> tuple[list[tuple[str, int, int]], int, int]:
    """(name, byte offset, byte width) per hashed field, words per row, seed - cached on the schema."""
    cached = schema.__dict__.get("_hash_layout")
    if cached is None:
        parts, off = [], 0
        for k in schema.hashed_fields:
            width = schema.fields[k].row_bytes
            if width:
                parts.append((k, off, width))
            off += width
        words = max(1, -(-off // 8))
        seed = schema_seed(schema) ^ (words * 0x9E3779B97F4A7C15 & _M64)
        cached = (parts, words, seed)
        object.__setattr__(schema, "_hash_layout", cached)
    return cached


def pack_rows(schema: Schema, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """The hashed fields of each row as little-endian bytes, zero-padded, viewed as uint64 [n, words]."""
    parts, words, _ = _layout(schema)
    n = int(np.asarray(arrays[schema.hashed_fields[0]]).shape[0])
    buf = np.empty((n, words * 8), dtype=np.uint8)
    end = parts[-1][1] + parts[-1][2] if parts else 0
    buf[:, end:] = 0
    for k, off, width in parts:
        a = np.asarray(arrays[k])
        if a.dtype.byteorder == ">" or not a.flags.c_contiguous:
            a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        buf[:, off : off + width] = a.reshape(n, -1).view(np.uint8)
    return buf.view(np.uint64)


def fmix64(h: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finaliser, in place; full avalanche so every input bit reaches every output bit."""
    h ^= h >> _S33
    h *= _F1
    h ^= h >> _S33
    h *= _F2
    h ^= h >> _S33
    return h


def hash_rows(schema: Schema, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """uint64 key per row of ``arrays`` over ``schema.hashed_fields``; stable across processes."""
    return hash_packed(schema, pack_rows(schema, arrays))


def hash_packed(schema: Schema, m: np.ndarray) -> np.ndarray:
    """The hash of rows already packed by :func:`pack_rows` (the store reuses the packed words to
    confirm hash hits by content)."""
    n, w = m.shape
    if w > _MAX_WORDS:
        # Very wide rows (long token sequences): fold blocks of words, then finalise.
        return _hash_wide(schema, m)
    if _kernels.enabled():
        return _kernels.hash_words(m, _ADD, _MUL, np.uint64(_layout(schema)[2]))
    x = m + _ADD[:w]
    x *= _MUL[:w]
    x ^= x >> _S32
    x *= _P2
    x ^= x >> _S29
    h = x.sum(axis=1, dtype=np.uint64)
    h ^= np.uint64(_layout(schema)[2])
    return fmix64(h)


def _hash_wide(schema: Schema, m: np.ndarray) -> np.ndarray:
    n, w = m.shape
    h = np.full(n, schema_seed(schema), dtype=np.uint64)
    for start in range(0, w, _MAX_WORDS):
        block = m[:, start : start + _MAX_WORDS]
        bw = block.shape[1]
        x = block + _ADD[:bw]
        x *= _MUL[:bw]
        x ^= x >> _S32
        x *= _P2
        x ^= x >> _S29
        h = fmix64(h * _P1 + x.sum(axis=1, dtype=np.uint64))
    h ^= np.uint64(w * 0x9E3779B97F4A7C15 & _M64)
    return fmix64(h)


def remix(key: int, attempt: int) -> int:
    """The key a row gets when ``attempt`` earlier candidate keys were taken by different content.

    Deterministic, so a row that collided still gets the same key in another store that saw the
    same rows in the same order; collisions at 64 bits are astronomically rare in practice.
    """
    z = (int(key) + attempt * 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)
