"""`RunObserver`: how a live display (or a logger, or a dashboard feed) follows a run.

The generation loop and the schedulers call these three hooks and nothing else; every hook has
a no-op default, so an observer overrides only what it needs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RunObserver"]


class RunObserver:
    def generation_started(self, generation: int, indices: list[int]) -> None:
        """Generation `generation` begins with the members `indices`."""

    def member_event(self, index: int, event: str, details: dict[str, Any]) -> None:
        """A member changed state: "training", or "done" (details: fitness, wall_s)."""

    def generation_done(self, generation: int, board: list[dict[str, Any]]) -> None:
        """Generation `generation` is committed; `board` is its evaluations, best score first."""
