"""Checkpoints as safetensors + JSON. Loading never unpickles.

An agent's state is a nested structure of dicts/lists holding tensors, numpy arrays and JSON
scalars. `save_state` splits it into a flat tensor file (`tensors.safetensors`) and a JSON
skeleton (`state.json`) where each tensor is replaced by a reference. The skeleton also carries
the SHA-256 of the tensor file and of itself, so a truncated or edited checkpoint is refused
with `CheckpointError` instead of producing a silently different agent.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

__all__ = ["CheckpointError", "save_state", "load_state", "flatten_state", "unflatten_state", "atomic_write"]

FORMAT = "evo-checkpoint/1"
TENSORS = "tensors.safetensors"
SKELETON = "state.json"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, truncated, altered or of an unknown format."""


def flatten_state(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """Split `state` into a JSON-able skeleton and a flat {key: tensor} dict."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(obj: Any, path: str) -> Any:
        if torch.is_tensor(obj):
            key = path or "_"
            tensors[key] = obj.detach().cpu().contiguous()
            return {"__tensor__": key}
        if isinstance(obj, np.ndarray):
            key = path or "_"
            tensors[key] = torch.from_numpy(np.ascontiguousarray(obj).copy())
            return {"__ndarray__": key}
        if isinstance(obj, dict):
            for k in obj:
                if not isinstance(k, str):
                    raise TypeError(f"state key {k!r} at {path or '<root>'}: expected str keys")
            return {k: walk(v, f"{path}.{k}" if path else k) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [walk(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(obj)]
        if isinstance(obj, (np.integer,)):
            return int(obj)
        if isinstance(obj, (np.floating,)):
            return float(obj)
        if obj is None or isinstance(obj, (str, int, float, bool)):
            return obj
        raise TypeError(f"state value at {path or '<root>'}: cannot store a {type(obj).__name__} "
                        "(tensors, arrays and JSON scalars only)")

    return walk(state, ""), tensors


def unflatten_state(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    def walk(obj: Any) -> Any:
        if isinstance(obj, dict):
            if set(obj) == {"__tensor__"}:
                return tensors[obj["__tensor__"]]
            if set(obj) == {"__ndarray__"}:
                return tensors[obj["__ndarray__"]].numpy()
            return {k: walk(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        return obj

    return walk(skeleton)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary file, fsync, then rename: readers see the old file or the new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_state(directory: str | os.PathLike, state: Any, meta: dict[str, Any] | None = None) -> str:
    """Write `state` under `directory`; returns the checkpoint's digest (stored by the run store)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    skeleton, tensors = flatten_state(state)
    blob = st_save(tensors) if tensors else st_save({"_empty": torch.zeros(0)})
    body = {"format": FORMAT, "meta": meta or {}, "tensors_sha256": _digest(blob), "state": skeleton}
    body_bytes = json.dumps(body, sort_keys=True).encode()
    digest = _digest(body_bytes)
    atomic_write(directory / TENSORS, blob)
    atomic_write(directory / SKELETON, json.dumps({"sha256": digest, "body": body}, sort_keys=True).encode())
    return digest


def load_state(directory: str | os.PathLike, expect_digest: str | None = None) -> tuple[Any, dict[str, Any]]:
    """Read and verify a checkpoint; returns (state, meta). Raises CheckpointError on any damage."""
    directory = Path(directory)
    skel_path, tensor_path = directory / SKELETON, directory / TENSORS
    for p in (skel_path, tensor_path):
        if not p.is_file():
            raise CheckpointError(f"{p}: checkpoint file missing")
    try:
        outer = json.loads(skel_path.read_bytes())
        body = outer["body"]
        recorded = outer["sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{skel_path}: not a readable evo checkpoint ({exc})") from None
    actual = _digest(json.dumps(body, sort_keys=True).encode())
    if actual != recorded:
        raise CheckpointError(f"{skel_path}: contents altered (sha256 {actual[:12]}… != recorded {recorded[:12]}…)")
    if expect_digest is not None and recorded != expect_digest:
        raise CheckpointError(f"{directory}: checkpoint digest {recorded[:12]}… is not the one the run store "
                              f"recorded ({expect_digest[:12]}…)")
    if body.get("format") != FORMAT:
        raise CheckpointError(f"{skel_path}: format {body.get('format')!r}, expected {FORMAT!r}")
    blob = tensor_path.read_bytes()
    if _digest(blob) != body["tensors_sha256"]:
        raise CheckpointError(f"{tensor_path}: tensor file truncated or altered (sha256 mismatch)")
    try:
        tensors = st_load(blob)
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{tensor_path}: unreadable safetensors data ({exc})") from None
    return unflatten_state(body["state"], tensors), body.get("meta", {})
