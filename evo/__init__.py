"""evo: evolutionary hyperparameter and architecture optimisation for populations of RL agents.

    import evo
    run = evo.run("experiments/randomwalks_ilql.toml", overrides={"population.size": 2}, backend="inline")
    run.leaderboard()                 # pandas DataFrame, elite first
    evo.open_run("runs/randomwalks_ilql").evaluations()
    agent = evo.load("exported/")     # an exported agent, without its run

`evo.run`, `evo.open_run`, `evo.Run`, `evo.RunFailed`, `evo.RunInterrupted` (evo.api), `evo.SpecError`
(evo.spec), `evo.load` (evo.registry). Submodules are imported on first use, so `import evo` stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["Run", "RunFailed", "RunInterrupted", "SpecError", "load", "open_run", "run"]

_WHERE = {"load": "evo.registry", "run": "evo.api", "open_run": "evo.api", "Run": "evo.api", "RunFailed": "evo.api",
          "RunInterrupted": "evo.api", "SpecError": "evo.spec"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'evo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
