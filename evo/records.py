"""`MutationRecord`: what one mutation did to a member, as the run store, leaderboard and lineage
show it. Agents return one from each mutation method; the engine fills in `kind`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["MutationRecord"]


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@dataclass
class MutationRecord:
    """`op` names the operation ("add_block", "widen_lstm", "weight_noise", "hparams", "none", …);
    `changes` maps a changed quantity to [old, new]; `function_preserving` says whether the
    member computes the same function right after the change (None: not applicable);
    `details` holds anything else worth keeping (JSON values only)."""

    op: str = "none"
    changes: dict[str, list[Any]] = field(default_factory=dict)
    function_preserving: bool | None = None
    details: dict[str, Any] = field(default_factory=dict)
    kind: str = ""

    @classmethod
    def none(cls, reason: str) -> MutationRecord:
        """A mutation that could not change anything (e.g. a size already at its bound)."""
        return cls(op="none", details={"reason": reason})

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "op": self.op}
        if self.changes:
            out["changes"] = {k: list(v) for k, v in self.changes.items()}
        if self.function_preserving is not None:
            out["function_preserving"] = self.function_preserving
        if self.details:
            out["details"] = dict(self.details)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> MutationRecord | None:
        if not data:
            return None
        known = {"kind", "op", "changes", "function_preserving", "details"}
        details = {**data.get("details", {}), **{k: v for k, v in data.items() if k not in known}}
        return cls(op=str(data.get("op", "none")), changes=dict(data.get("changes", {})),
                   function_preserving=data.get("function_preserving"), details=details,
                   kind=str(data.get("kind", "")))

    def summary(self) -> str:
        """One short line, e.g. "rl_hp lr 0.003→0.0045" or "architecture add_block (dynamics)"."""
        parts = [self.kind or "?"]
        if self.op not in ("none", self.kind, "hparams", f"set_{self.kind}"):
            parts.append(self.op)
        if "network" in self.details:
            parts.append(f"({self.details['network']})")
        parts += [f"{k} {_fmt(old)}→{_fmt(new)}" for k, (old, new) in self.changes.items()]
        if self.op == "none" and self.kind not in ("no_mutation", ""):
            parts.append("(no change)")
        return " ".join(parts)
