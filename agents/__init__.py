"""Agent implementations evo ships: `efficientzero` and `ilql` (registered as entry points of the
`evo.agents` group in pyproject.toml). This package imports evo; evo never imports it.

`agents.load` is a convenience that re-exports `evo.load` (rebuild an exported agent).
"""

from evo.registry import load

__all__ = ["load"]
