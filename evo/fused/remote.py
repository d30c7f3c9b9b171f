"""Fused training on Ray: which members an actor trains together, and what the actor does with them.

The driver (evo/scheduler/ray.py) hands each actor a *job*: one member, or several members of one
fused group (equal `FusedTrainer.group_key`). `FusedJobs` forms the jobs: a group of g members in a
generation of n members on W actors is cut into about g * W / n chunks of equal size, so every
actor gets work and each chunk is as large as the actors allow. Jobs are taken from the driver's
queue of member positions, so a member that comes back to the queue (its actor died) is retried
on its own or with other queued members of its group: faults stay per member.

On the actor, `train_members` builds each member from its state on its own replay view, runs
`attempt_fused` (the members of the job train and evaluate as one program) and returns one result
per member in the form `_MemberWorker.run` returns for one: the driver handles them one by one.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from evo.agent import Agent, AgentContext
from evo.fused.run import FusedTrainer, attempt_fused

__all__ = ["FusedJobs", "train_members"]


class FusedJobs:
    """Cuts a generation's members (by position) into jobs for `workers` actors."""

    def __init__(self, trainer: FusedTrainer, agents: Sequence[Agent], workers: int) -> None:
        if workers < 1:
            raise ValueError(f"FusedJobs: expected at least one worker, found {workers}")
        self.keys = [trainer.group_key(a) for a in agents]
        sizes: dict[str, int] = {}
        for key in self.keys:
            if key is not None:
                sizes[key] = sizes.get(key, 0) + 1
        n = len(agents)
        # chunks per group in proportion to its share of the generation, at least one
        self.chunk = {key: math.ceil(g / max(1, min(g, round(g * workers / n)))) for key, g in sizes.items()}

    def take(self, queue: deque[int]) -> list[int]:
        """The next job: the queue's first member and the queued members of its group behind it,
        up to the group's chunk size (removed from `queue`, in queue order)."""
        first = queue.popleft()
        key = self.keys[first]
        if key is None or self.chunk[key] == 1:
            return [first]
        job = [first]
        for pos in list(queue):
            if len(job) == self.chunk[key]:
                break
            if self.keys[pos] == key:
                job.append(pos)
                queue.remove(pos)
        return job


def train_members(agent_class: type[Agent], context: AgentContext, trainer: FusedTrainer, states: Sequence[Any],
                  steps: int, basis: Any, seeds: Sequence[Any],
                  to_cpu: Callable[[Any], Any] = lambda tree: tree) -> list[dict[str, Any]]:
    """Train and evaluate the members given by `states` as one fused program, each on its own view
    of the shared replay store (`basis` and its seed from `seeds`; basis None: no shared store).
    Per member, in order, the dict `_MemberWorker.run` returns for one member: {failure, wall_s},
    or {failure: None, state (through `to_cpu`), metrics, evaluation, wall_s, staged, load_s, save_s}."""
    from evo.scheduler.base import attempt_member, member_context, member_view

    start = time.perf_counter()
    views = [member_view(context, basis, seed) if basis is not None else None for seed in seeds]
    agents = [agent_class.from_state(state, member_context(context, view) if view is not None else context)
              for state, view in zip(states, views)]
    load_s = (time.perf_counter() - start) / max(1, len(agents))
    outcomes = attempt_fused(trainer, agents, steps, lambda a: attempt_member(a, steps))
    out: list[dict[str, Any]] = []
    for agent, view, (metrics, evaluation, wall, failure) in zip(agents, views, outcomes):
        if failure is not None:  # whatever the member staged is dropped with its view
            out.append({"failure": failure, "wall_s": wall})
            continue
        t = time.perf_counter()
        state = to_cpu(agent.get_state())
        out.append({"failure": None, "state": state, "metrics": metrics, "evaluation": evaluation, "wall_s": wall,
                    "staged": view.staged() if view is not None else None, "load_s": load_s,
                    "save_s": time.perf_counter() - t})
    return out
