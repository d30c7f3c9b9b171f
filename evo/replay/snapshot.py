"""Crash-safe snapshot files: write to a temporary directory, mark complete, rename atomically.

Layout under a snapshot root::

    root/snapshot-000001/   meta.json, <array>.npy ..., COMPLETE
    root/snapshot-000002/   ...
    root/.tmp-<uuid>/       a snapshot being written (or abandoned by a crash)

Every file is fsynced, then ``COMPLETE`` (listing each file and its size) is written and fsynced,
then the directory is renamed into place and the root fsynced. A crash at any moment leaves either
the previous snapshots untouched plus a ``.tmp-*`` directory (ignored and later removed), or a
complete new snapshot. A snapshot whose marker is missing or whose files do not match the marker is
treated as incomplete, and the newest complete one is used instead. Arrays are ``.npy`` files read
with ``allow_pickle=False``: loading a snapshot can never execute code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Mapping

import numpy as np

from evo.replay.errors import ReplayError

MARKER = "COMPLETE"
META = "meta.json"
_NAME = re.compile(r"^snapshot-(\d{6,})$")


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    try:
        _fsync_file(path)
    except OSError:  # some filesystems cannot fsync a directory; the rename is still atomic
        pass


def _write_array(path: str, arr: np.ndarray) -> None:
    with open(path, "wb") as fh:
        np.save(fh, np.ascontiguousarray(arr), allow_pickle=False)
        fh.flush()
        os.fsync(fh.fileno())


def _is_complete(path: str) -> bool:
    marker = os.path.join(path, MARKER)
    if not os.path.isfile(marker):
        return False
    try:
        with open(marker) as fh:
            listing = json.load(fh)["files"]
        return all(os.path.getsize(os.path.join(path, f)) == size for f, size in listing.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def list_snapshots(root: str | os.PathLike) -> list[tuple[int, str, bool]]:
    """(sequence number, path, complete?) for every ``snapshot-N`` under root, oldest first."""
    root = os.fspath(root)
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = _NAME.match(name)
        if m:
            p = os.path.join(root, name)
            out.append((int(m.group(1)), p, _is_complete(p)))
    return sorted(out)


def latest_complete(root: str | os.PathLike) -> str | None:
    """Path of the newest complete snapshot under root (or root itself if it is one), else None."""
    root = os.fspath(root)
    if _is_complete(root):
        return root
    done = [p for _, p, ok in list_snapshots(root) if ok]
    return done[-1] if done else None


def write_snapshot(root: str | os.PathLike, meta: Mapping, arrays: Mapping[str, np.ndarray], keep: int = 2) -> str:
    """Write one snapshot under root atomically; keep the newest ``keep`` complete ones. Returns its path."""
    root = os.fspath(root)
    os.makedirs(root, exist_ok=True)
    for name in os.listdir(root):  # leftovers of writers that died mid-snapshot
        if name.startswith(".tmp-"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    existing = list_snapshots(root)
    seq = (existing[-1][0] + 1) if existing else 1
    tmp = os.path.join(root, f".tmp-{uuid.uuid4().hex}")
    os.makedirs(tmp)
    files = {}
    for name, arr in arrays.items():
        fn = f"{name}.npy"
        _write_array(os.path.join(tmp, fn), arr)
        files[fn] = os.path.getsize(os.path.join(tmp, fn))
    with open(os.path.join(tmp, META), "w") as fh:
        json.dump(meta, fh)
        fh.flush()
        os.fsync(fh.fileno())
    files[META] = os.path.getsize(os.path.join(tmp, META))
    with open(os.path.join(tmp, MARKER), "w") as fh:
        json.dump({"files": files}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(tmp)
    final = os.path.join(root, f"snapshot-{seq:06d}")
    os.rename(tmp, final)
    _fsync_dir(root)
    done = [p for _, p, ok in list_snapshots(root) if ok]
    for old in done[: max(0, len(done) - max(1, keep))]:
        shutil.rmtree(old, ignore_errors=True)
    for _, p, ok in list_snapshots(root):  # incomplete named snapshots older than the newest complete
        if not ok and p < final:
            shutil.rmtree(p, ignore_errors=True)
    return final


def read_snapshot(root: str | os.PathLike) -> tuple[str, dict, dict[str, np.ndarray]]:
    """(path, meta, arrays) of the newest complete snapshot under root; ReplayError if there is none."""
    path = latest_complete(root)
    if path is None:
        found = list_snapshots(root)
        raise ReplayError(
            f"no complete snapshot under {os.fspath(root)!r}"
            + (f" ({len(found)} incomplete: {[os.path.basename(p) for _, p, _ in found]})" if found else "")
        )
    with open(os.path.join(path, META)) as fh:
        meta = json.load(fh)
    arrays = {}
    for fn in os.listdir(path):
        if fn.endswith(".npy"):
            arrays[fn[:-4]] = np.load(os.path.join(path, fn), allow_pickle=False)
    return path, meta, arrays
