"""Live progress for `evo run`: a generation bar with ETA, each member's state, the best score so
far and the training throughput.

On a terminal it is a rich Live view; otherwise (CI logs, pipes) or with `--quiet`, one plain line
per generation plus a line for each member that fails or is retried, so logs stay readable; from
Python with `quiet=True` (mode "none"), nothing at all. The plain lines also go to the `evo.run`
logger (the run directory's `run.log`, see evo.api), whatever the mode.

Throughput is in the agent's own steps (`population.steps_per_generation`'s unit: environment
steps for EfficientZero, gradient updates for ILQL) per second of wall time.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from evo.observer import RunObserver

__all__ = ["RunDisplay", "format_duration", "pack_phrases"]

log = logging.getLogger("evo.run")
MODES = ("auto", "live", "lines", "none")

STATE_STYLES = {"queued": "dim", "training": "yellow", "evaluating": "cyan", "done": "green", "failed": "bold red",
                "retried": "magenta"}


def _live_capable(console: Console) -> bool:
    """A terminal, or a Jupyter notebook with ipywidgets (rich draws its live view in a widget there)."""
    if console.is_terminal:
        return True
    if not console.is_jupyter:
        return False
    import importlib.util

    return importlib.util.find_spec("ipywidgets") is not None


def pack_phrases(phrases: list[str], width: int, sep: str = " · ") -> list[str]:
    """Phrases joined by `sep` into as few lines of at most `width` characters as they fit in; a line
    breaks only between phrases (a phrase longer than the width gets a line of its own)."""
    lines: list[str] = []
    for phrase in phrases:
        if lines and len(lines[-1]) + len(sep) + len(phrase) <= width:
            lines[-1] += sep + phrase
        else:
            lines.append(phrase)
    return lines


def format_duration(seconds: float | None) -> str:
    """`1h02m`, `3m05s`, `42s`; "-" when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class RunDisplay(RunObserver):
    def __init__(self, run: str, generations: int, population: int, backend: str,
                 steps_per_generation: int | None = None, quiet: bool = False, mode: str = "auto") -> None:
        """`mode`: "live" (rich), "lines" (one plain line per generation), "none", or "auto": live on
        a terminal (or in a notebook with ipywidgets), else lines. `quiet=True` is mode "lines" (the CLI's --quiet)."""
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, found {mode!r}")
        self.run, self.generations, self.backend = run, generations, backend
        self.population = population
        self.steps = steps_per_generation
        self.console = Console()
        mode = "lines" if quiet and mode == "auto" else mode
        self.mode = ("live" if _live_capable(self.console) else "lines") if mode == "auto" else mode
        self.live_mode = self.mode == "live"
        self.status: dict[int, str] = {}
        self.fitness: dict[int, float] = {}
        self.wall: dict[int, float] = {}
        self.best, self.best_index = -math.inf, None
        self.generation = 0
        self._first_generation: int | None = None
        self._generation_walls: list[float] = []
        self._lock = threading.Lock()
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("eta {task.fields[eta]}"))
        self.task = self.progress.add_task(f"{run} generations", total=generations, eta="-")
        self.live: Live | None = None
        self._t0 = time.perf_counter()
        self._generation_t0 = self._t0

    def __enter__(self) -> RunDisplay:
        if self.live_mode:
            self.live = Live(self._render(), console=self.console, refresh_per_second=4)
            self.live.__enter__()
        else:
            self._say(f"run {self.run}: {self.generations} generations of {self.population} members on the "
                      f"{self.backend} backend")
        return self

    def _say(self, line: str) -> None:
        """A plain line: printed in mode "lines", logged (the run's run.log) in every mode."""
        log.info(line)
        if self.mode == "lines":
            print(line, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    # ---- numbers ------------------------------------------------------------------------------
    def eta_s(self, now: float | None = None) -> float | None:
        """Seconds left: generations still to run × the mean generation time seen so far (within the
        first generation, extrapolated from the members already done)."""
        now = time.perf_counter() if now is None else now
        elapsed = now - self._generation_t0
        remaining = self.generations - self.generation
        if self._generation_walls:
            per_generation = sum(self._generation_walls) / len(self._generation_walls)
        else:
            done = sum(1 for s in self.status.values() if s == "done")
            if not done:
                return None
            per_generation = elapsed / done * max(len(self.status), 1)
        return max(0.0, per_generation * remaining - elapsed)

    def steps_per_s(self, now: float | None = None) -> float | None:
        """The current generation's trained steps per second of wall time (None before a member is done)."""
        now = time.perf_counter() if now is None else now
        done = sum(1 for s in self.status.values() if s == "done")
        if not self.steps or not done or now <= self._generation_t0:
            return None
        return done * self.steps / (now - self._generation_t0)

    # ---- rendering ----------------------------------------------------------------------------
    def _phrases(self) -> list[str]:
        best = "-" if self.best == -math.inf else f"{self.best:.4g} (member {self.best_index})"
        rate = self.steps_per_s()
        counts = {s: sum(1 for v in self.status.values() if v == s) for s in STATE_STYLES}
        states = [f"{n} {s}" for s, n in counts.items() if n]
        return [f"generation {min(self.generation + 1, self.generations)}/{self.generations}",
                f"best score so far {best}", f"{'-' if rate is None else f'{rate:,.0f}'} steps/s",
                *(states or ["starting"])]

    def _headline(self) -> str:
        return " · ".join(self._phrases())

    def header_lines(self, width: int) -> list[str]:
        """The headline laid out for a terminal `width` columns wide, broken only between phrases."""
        return pack_phrases(self._phrases(), max(20, width))

    def _render(self, width: int | None = None) -> Group:
        self.progress.update(self.task, eta=format_duration(self.eta_s()))
        header = [Text(line, no_wrap=True, overflow="ellipsis")
                  for line in self.header_lines(width or self.console.width)]
        table = Table(expand=False)
        for col in ("member", "state", "fitness", "wall", "steps/s"):
            table.add_column(col, justify="left" if col in ("member", "state") else "right")
        for index in sorted(self.status):
            fit, wall, state = self.fitness.get(index), self.wall.get(index), self.status[index]
            rate = f"{self.steps / wall:,.0f}" if self.steps and wall else "-"
            table.add_row(str(index), Text(state, style=STATE_STYLES.get(state, "")),
                          "-" if fit is None else f"{fit:.4g}", format_duration(wall), rate)
        return Group(self.progress, *header, table)

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._render())

    # ---- the observer hooks -------------------------------------------------------------------
    def generation_started(self, generation: int, indices: list[int]) -> None:
        with self._lock:
            if self._first_generation is None:
                self._first_generation = generation
            self.generation = generation
            self._generation_t0 = time.perf_counter()
            self.progress.update(self.task, completed=generation)
            self.status = dict.fromkeys(indices, "queued")
            self.fitness, self.wall = {}, {}
            self._refresh()

    def member_event(self, index: int, event: str, details: dict[str, Any]) -> None:
        with self._lock:
            self.status[index] = event
            if "fitness" in details:
                self.fitness[index] = float(details["fitness"])
            if "wall_s" in details:
                self.wall[index] = float(details["wall_s"])
            if event in ("failed", "retried"):
                why = f": {details['error']}" if details.get("error") else ""
                self._say(f"generation {self.generation + 1}: member {index} {event}{why}")
            self._refresh()

    def generation_done(self, generation: int, board: list[dict[str, Any]]) -> None:
        with self._lock:
            now = time.perf_counter()
            rate = self.steps_per_s(now)
            self._generation_walls.append(now - self._generation_t0)
            if board and float(board[0]["score"]) > self.best:
                self.best, self.best_index = float(board[0]["score"]), board[0]["index"]
            self.generation = generation + 1
            self._generation_t0 = now
            self.progress.update(self.task, completed=generation + 1)
            self._refresh()
            top = board[0] if board else None
            elite = f"elite member {top['index']} score {top['score']:.4g}" if top else "no evaluations"
            failed = sum(1 for s in self.status.values() if s == "failed")
            self._say(f"generation {generation + 1}/{self.generations}: {elite}; best so far {self.best:.4g}; "
                      f"{'-' if rate is None else f'{rate:,.0f}'} steps/s"
                      f"{f'; {failed} failed' if failed else ''}; {now - self._t0:.1f} s elapsed, "
                      f"eta {format_duration(self.eta_s(now))}")
