"""evo: evolutionary hyperparameter and architecture optimisation for populations of RL agents.

`evo.load(directory)` rebuilds an exported agent (see `evo.registry`). Submodules are imported
on first use, so `import evo` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load"]


def __getattr__(name: str) -> Any:
    if name == "load":
        from evo.registry import load

        return load
    raise AttributeError(f"module 'evo' has no attribute {name!r}")
