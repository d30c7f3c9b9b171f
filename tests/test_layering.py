"""The engine never imports the plugin folder: every evo module imports in a fresh interpreter in
which importing `agents` (or anything under it) raises."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import evo
from tests.conftest import REPO

BLOCKER = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "agents" or name.startswith("agents."):
            raise ImportError(f"evo must not import {name}")
        return None

sys.meta_path.insert(0, Block())
import importlib
for name in sys.argv[1:]:
    importlib.import_module(name)
print("imported", len(sys.argv) - 1)
"""


def evo_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(evo.__path__, "evo."))


def test_every_evo_module_imports_without_agents() -> None:
    modules = evo_modules()
    assert "evo.agent" in modules and "evo.registry" in modules and len(modules) > 20
    proc = subprocess.run([sys.executable, "-c", BLOCKER, *modules], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"imported {len(modules)}" in proc.stdout


def test_blocker_really_blocks() -> None:
    """The check above can fail: importing agents under the blocker raises."""
    proc = subprocess.run([sys.executable, "-c", BLOCKER, "agents.ilql"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and "evo must not import agents" in proc.stderr
