"""Agent kinds: which class a kind name stands for, and `load` for exported agents.

A kind is a name registered under the `evo.agents` entry-point group (evo's own package declares
`efficientzero` and `ilql` in pyproject.toml; any installed package can add more), a name given
to `register()`, or an import path `package.module:Class` naming any `evo.agent.Agent` subclass.
The engine resolves a kind once, when an experiment is loaded, and passes the class on.
"""

from __future__ import annotations

import importlib
import json
from importlib.metadata import entry_points
from pathlib import Path

from evo.agent import EXPORT_CONFIG, Agent

__all__ = ["ENTRY_POINT_GROUP", "register", "kinds", "agent_class", "class_path", "load"]

ENTRY_POINT_GROUP = "evo.agents"
_registered: dict[str, type[Agent]] = {}


def register(kind: str, cls: type[Agent]) -> None:
    """Make `kind` name `cls` in this process (entry points do the same for installed packages)."""
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise TypeError(f"register({kind!r}, …): expected an evo.agent.Agent subclass, found {cls!r}")
    _registered[kind] = cls


def kinds() -> dict[str, str]:
    """Every named kind and what it points at ("module:Class")."""
    out = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    out.update({k: class_path(c) for k, c in _registered.items()})
    return out


def class_path(cls: type) -> str:
    """The `module:Class` path that `agent_class` resolves back to `cls`."""
    return f"{cls.__module__}:{cls.__qualname__}"


def agent_class(kind: str) -> type[Agent]:
    """The Agent class for a kind name or a `module:Class` path; ValueError (actionable) if unknown."""
    if kind in _registered:
        return _registered[kind]
    named = kinds()
    target = named.get(kind, kind)
    if ":" not in target:
        raise ValueError(f"expected one of {sorted(named)} or 'package.module:Class', found {kind!r}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"agent kind {kind!r}: cannot import {module_name} ({exc})") from None
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise ValueError(f"agent kind {kind!r}: {target} is not an evo.agent.Agent subclass")
    return cls


def load(directory: str | Path) -> Agent:
    """Rebuild an agent written by `evo export` (or `Agent.export`); needs no run directory."""
    directory = Path(directory)
    config_path = directory / EXPORT_CONFIG
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: not an exported evo agent (no {EXPORT_CONFIG})")
    config = json.loads(config_path.read_text())
    cls = agent_class(config.get("class") or config["kind"])
    return cls.load_export(directory)
