"""Offline-RL tasks for ILQL: `randomwalks` and `wordle` (generated locally) and `jsonl` (a person's
own episodes, agents.ilql.tasks.jsonl).

A task object offers: `tokenizer`, `vocab_size`, `max_tokens`, `max_actions`, `episodes()`
(the offline dataset as `agents.ilql.data.Episode`s) and `evaluate(model, beta, ...)`.
`make_task(settings)` builds (and caches per process) the task for a validated [agent.task] table.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["TASKS", "make_task", "task_defaults"]

TASKS = ("randomwalks", "wordle", "jsonl")

_CACHE: dict[str, Any] = {}


def task_defaults(name: str) -> dict[str, Any]:
    if name == "randomwalks":
        return {"n_nodes": 21, "p_edge": 0.1, "max_length": 10, "n_walks": 1000, "seed": 1000}
    if name == "wordle":
        from agents.ilql.tasks.wordle import WORDLE_DEFAULTS

        return dict(WORDLE_DEFAULTS)
    if name == "jsonl":
        from agents.ilql.tasks.jsonl import JSONL_DEFAULTS

        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in JSONL_DEFAULTS.items()}
    raise ValueError(f"task.task: expected one of {list(TASKS)}, found {name!r}")


def make_task(settings: dict[str, Any]) -> Any:
    """The task object for `settings` (the task-building keys of [agent.task]); cached per process."""
    name = settings["task"]
    params = {k: settings[k] for k in [*task_defaults(name), "scan"] if k in settings}
    key = json.dumps({"task": name, **params}, sort_keys=True)
    if key not in _CACHE:
        if name == "jsonl":
            from agents.ilql.tasks.jsonl import JsonlTask

            _CACHE[key] = JsonlTask(params)
        elif name == "randomwalks":
            from agents.ilql.tasks.randomwalks import RandomWalks

            _CACHE[key] = RandomWalks(**params)
        else:
            from agents.ilql.tasks.wordle import Wordle

            _CACHE[key] = Wordle(**params)
    return _CACHE[key]
