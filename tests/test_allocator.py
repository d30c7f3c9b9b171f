"""evo.allocator: freed memory stays in the process (no page faults per update), opt-out, once per process.

Each case runs in a fresh interpreter: malloc's settings are process-wide and cannot be undone."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# three written 8 MiB blocks, freed together: glibc's default trims its heap top after each round,
# so the next round faults its pages in again
_PROBE = r"""
import json, resource, sys
import numpy as np
from evo.allocator import allocator_state, keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    blocks = [np.ones(1 << 20) for _ in range(3)]; del blocks
before = faults()
for _ in range(20):
    blocks = [np.ones(1 << 20) for _ in range(3)]; del blocks
print(json.dumps({"applied": applied, "again": keep_freed_memory() if applied else None,
                  "faults_per_round": (faults() - before) / 20, "state": allocator_state()}))
"""

glibc_only = pytest.mark.skipif(platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc",
                                reason="mallopt is glibc's")


def _probe(mode: str, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT, **env}, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc_only
def test_kept_memory_stops_the_page_faults_of_a_repeated_allocation() -> None:
    default, kept = _probe("default"), _probe("keep")
    assert default["faults_per_round"] > 100, default  # the pattern does fault under glibc's defaults
    assert kept["applied"] and kept["again"] is True
    assert kept["state"]["reason"] == "mallopt" and kept["state"]["glibc"]
    assert kept["faults_per_round"] < 5, kept


@glibc_only
def test_evo_allocator_default_leaves_malloc_alone() -> None:
    out = _probe("keep", EVO_ALLOCATOR="default")
    assert out["applied"] is False
    assert out["state"]["reason"] == "EVO_ALLOCATOR=default"
    assert out["faults_per_round"] > 100


def test_state_before_any_call_says_not_asked() -> None:
    code = "import json; from evo.allocator import allocator_state; print(json.dumps(allocator_state()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, check=True, timeout=60)
    assert json.loads(out.stdout) == {"applied": False, "reason": "not asked"}
