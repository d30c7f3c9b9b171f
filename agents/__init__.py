"""Agent kinds evo can evolve, and `load` for exported agents.

A kind is either a registered name (`efficientzero`, `ilql`) or an import path
`package.module:Class` naming any `agents.base.Agent` subclass, so users can plug in their own.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agents.base import Agent

__all__ = ["AGENT_KINDS", "agent_class", "load"]

AGENT_KINDS: dict[str, str] = {
    "efficientzero": "agents.efficientzero.agent:EfficientZeroAgent",
    "ilql": "agents.ilql.agent:ILQLAgent",
}


def agent_class(kind: str) -> "type[Agent]":
    """The Agent class for a registered kind or a `module:Class` path; ValueError if unknown."""
    from agents.base import Agent

    target = AGENT_KINDS.get(kind, kind)
    if ":" not in target:
        raise ValueError(f"expected one of {sorted(AGENT_KINDS)} or 'package.module:Class', found {kind!r}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"agent kind {kind!r}: cannot import {module_name} ({exc})") from None
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise ValueError(f"agent kind {kind!r}: {target} is not an agents.base.Agent subclass")
    return cls


def load(directory: str | Path) -> "Agent":
    """Rebuild an agent written by `evo export` (or `Agent.export`); needs no run directory."""
    from agents.base import EXPORT_CONFIG

    directory = Path(directory)
    config_path = directory / EXPORT_CONFIG
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: not an exported evo agent (no {EXPORT_CONFIG})")
    config = json.loads(config_path.read_text())
    cls = agent_class(config.get("class") or config["kind"])
    return cls.load_export(directory)
