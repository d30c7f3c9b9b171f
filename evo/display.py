"""Live progress for `evo run`: a generation bar, each member's status, the best score so far.

On a terminal it is a rich Live view; otherwise (CI logs, pipes) one plain line per event that
matters, so logs stay readable.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evo.observer import RunObserver

__all__ = ["RunDisplay"]


class RunDisplay(RunObserver):
    def __init__(self, run: str, generations: int, population: int, backend: str) -> None:
        self.run, self.generations, self.backend = run, generations, backend
        self.console = Console()
        self.live_mode = self.console.is_terminal
        self.status: dict[int, str] = {}
        self.fitness: dict[int, float] = {}
        self.best = -math.inf
        self.generation = 0
        self._lock = threading.Lock()
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn())
        self.task = self.progress.add_task(f"{run} generations", total=generations)
        self.live: Live | None = None
        self._t0 = time.perf_counter()

    def __enter__(self) -> RunDisplay:
        if self.live_mode:
            self.live = Live(self._render(), console=self.console, refresh_per_second=4)
            self.live.__enter__()
        else:
            print(f"run {self.run}: {self.generations} generations on the {self.backend} backend", flush=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def _render(self) -> Group:
        table = Table(title=f"generation {self.generation} · best score so far "
                            f"{'-' if self.best == -math.inf else f'{self.best:.4g}'}", expand=False)
        table.add_column("member")
        table.add_column("status")
        table.add_column("fitness")
        for index in sorted(self.status):
            fit = self.fitness.get(index)
            table.add_row(str(index), self.status[index], "-" if fit is None else f"{fit:.4g}")
        return Group(self.progress, table)

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._render())

    def generation_started(self, generation: int, indices: list[int]) -> None:
        with self._lock:
            self.generation = generation
            self.progress.update(self.task, completed=generation)
            self.status = dict.fromkeys(indices, "queued")
            self.fitness = {}
            self._refresh()

    def member_event(self, index: int, event: str, details: dict[str, Any]) -> None:
        with self._lock:
            self.status[index] = event
            if "fitness" in details:
                self.fitness[index] = float(details["fitness"])
            self._refresh()

    def generation_done(self, generation: int, board: list[dict[str, Any]]) -> None:
        with self._lock:
            if board:
                self.best = max(self.best, float(board[0]["score"]))
            self.progress.update(self.task, completed=generation + 1)
            self._refresh()
            if not self.live_mode:
                top = board[0] if board else None
                elite = f"elite member {top['index']} score {top['score']:.4g}" if top else "no evaluations"
                print(f"generation {generation + 1}/{self.generations}: {elite}; best so far {self.best:.4g} "
                      f"({time.perf_counter() - self._t0:.1f} s)", flush=True)
