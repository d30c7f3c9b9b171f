"""`RunObserver`: how a live display (or a logger, or a dashboard feed) follows a run.

The generation loop and the schedulers call these three hooks and nothing else; every hook has
a no-op default, so an observer overrides only what it needs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RunObserver", "ObserverGroup"]


class RunObserver:
    def generation_started(self, generation: int, indices: list[int]) -> None:
        """Generation `generation` begins with the members `indices`."""

    def member_event(self, index: int, event: str, details: dict[str, Any]) -> None:
        """A member changed state: "training", "evaluating" (a member given no steps, `selection.rest_elite`,
        goes straight to it), "done" (details: fitness if it was evaluated, wall_s, steps trained),
        "failed" or "retried" (details: error)."""

    def generation_done(self, generation: int, board: list[dict[str, Any]]) -> None:
        """Generation `generation` is committed; `board` is its evaluations, best score first."""


class ObserverGroup(RunObserver):
    """Several observers as one (the live display and the loggers), called in order."""

    def __init__(self, observers: list[RunObserver]) -> None:
        self.observers = list(observers)

    def generation_started(self, generation: int, indices: list[int]) -> None:
        for o in self.observers:
            o.generation_started(generation, indices)

    def member_event(self, index: int, event: str, details: dict[str, Any]) -> None:
        for o in self.observers:
            o.member_event(index, event, details)

    def generation_done(self, generation: int, board: list[dict[str, Any]]) -> None:
        for o in self.observers:
            o.generation_done(generation, board)
