"""Train members on Ray actors: several cores, GPUs or machines.

Members travel as their state (tensors + JSON, the same tree a checkpoint holds), so an actor
can train any member and the result does not depend on which actor ran it. Each actor builds the
run's AgentContext once (the task and the shared replay store handle) and pins torch to
`cpus_per_member` threads; for each member it wraps the store in the member's own view
(evo.replay.view) and ships the view's staged writes back with the result.

Faults (docs/faults.md): a member whose actor dies (process killed, node lost) is retried from its
generation-start state on another actor, up to `max_failures` times, and a replacement actor keeps
the pool at `num_workers`; a member that diverges or raises is reported failed (not retried); a
member with no result within `timeout_s` is reported failed and its actor replaced. The driver
waits in slices of at most a second, so Ctrl-C and SIGTERM are handled within seconds.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np

from evo.agent import Agent, AgentContext
from evo.faults import Failure
from evo.observer import RunObserver
from evo.replay.protocol import Replay, ReplaySpec, build_replay
from evo.replay.staging import ViewBasis
from evo.replay.view import MemberView, commit_views, view_seed
from evo.scheduler.base import MemberResult, attempt_member, failed_result, member_context
from evo.scheduler.cluster import init_ray

__all__ = ["RayScheduler", "init_ray"]


class _MemberWorker:
    """A Ray actor that trains whichever member it is handed."""

    def __init__(self, agent_class: type[Agent], context: AgentContext, threads: int) -> None:
        import torch

        torch.set_num_threads(max(1, threads))
        self.cls = agent_class
        self.context = context

    def pid(self) -> int:
        import os

        return os.getpid()

    def run(self, state: dict[str, Any], steps: int, basis: ViewBasis | None,
            seed: np.random.SeedSequence) -> dict[str, Any]:
        view = MemberView(self.context.replay, basis, seed) if basis is not None else None
        agent = self.cls.from_state(state, member_context(self.context, view) if view is not None else self.context)
        metrics, evaluation, wall, failure = attempt_member(agent, steps)
        if failure is not None:  # whatever the attempt staged is dropped with the view
            return {"failure": failure, "wall_s": wall}
        return {"failure": None, "state": agent.get_state(), "metrics": metrics, "evaluation": evaluation,
                "wall_s": wall, "staged": view.staged() if view is not None else None}


class RayScheduler:
    def __init__(self, agent_class: type[Agent], context: AgentContext, num_workers: int,
                 cpus_per_member: float = 1.0, gpus_per_member: float = 0.0, timeout_s: float = 3600.0,
                 max_failures: int = 2, custom_resources: dict[str, float] | None = None) -> None:
        import ray

        self.context = context
        self.cls = agent_class
        self.timeout_s = timeout_s
        self.max_failures = max_failures
        self.num_workers = num_workers
        self._actor = ray.remote(num_cpus=cpus_per_member, num_gpus=gpus_per_member, max_restarts=0,
                                 resources=dict(custom_resources or {}) or None)(_MemberWorker)
        self._worker_args = (agent_class,
                             AgentContext(task=context.task, replay=context.replay,
                                          device="cuda" if gpus_per_member > 0 else context.device, seed=context.seed),
                             int(max(1, cpus_per_member)))
        self.workers = [self._actor.remote(*self._worker_args) for _ in range(num_workers)]

    @staticmethod
    def build_replay(spec: ReplaySpec, seed: int) -> Replay:
        return build_replay(spec, seed, distributed=True)

    def _replace(self, worker: Any) -> Any:
        """Kill `worker` (if it still lives) and start a new actor in its place."""
        import ray

        try:
            ray.kill(worker, no_restart=True)
        except Exception:  # already gone
            pass
        if worker in self.workers:
            self.workers.remove(worker)
        fresh = self._actor.remote(*self._worker_args)
        self.workers.append(fresh)
        return fresh

    def run_generation(self, agents: list[Agent], steps: int, observer: RunObserver | None = None,
                       generation: int = 0) -> list[MemberResult]:
        import ray
        from ray.exceptions import RayError, RayTaskError

        observer = observer or RunObserver()
        shared = self.context.replay
        basis = shared.view_basis() if shared is not None else None
        n = len(agents)
        states = [ray.put(a.get_state()) for a in agents]  # each member's start state, kept for retries
        queue = deque(range(n))
        attempts, retries = [0] * n, [[] for _ in range(n)]
        results: list[MemberResult | None] = [None] * n
        staged = []
        pending: dict[Any, tuple[int, Any, float]] = {}
        idle = list(self.workers)

        def lost(pos: int, message: str) -> None:
            index = agents[pos].index
            f = Failure(index, "lost", message, attempts[pos], generation)
            if attempts[pos] <= self.max_failures:
                retries[pos].append(Failure(index, "lost", message, attempts[pos], generation, retried=True))
                queue.appendleft(pos)
                observer.member_event(index, "retried", {"error": f"lost: {message}", "attempt": attempts[pos]})
            else:
                results[pos] = failed_result(agents[pos], f, 0.0, retries[pos])
                observer.member_event(index, "failed", {"error": f"lost: {message}", "kind": "lost"})

        while queue or pending:
            while queue and idle:
                pos = queue.popleft()
                worker = idle.pop(0)
                attempts[pos] += 1
                ref = worker.run.remote(states[pos], steps, basis, view_seed(self.context.seed, agents[pos].index, generation))
                pending[ref] = (pos, worker, time.monotonic() + self.timeout_s)
                observer.member_event(agents[pos].index, "training", {})
            now = time.monotonic()
            wait = min(1.0, max(0.0, min(d for _, _, d in pending.values()) - now))
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait)
            if not ready:
                for ref, (pos, worker, deadline) in list(pending.items()):
                    if time.monotonic() >= deadline:
                        del pending[ref]
                        idle.append(self._replace(worker))
                        f = Failure(agents[pos].index, "timeout", f"no result within {self.timeout_s:g} s "
                                    "(resources.timeout_s); its worker was replaced", attempts[pos], generation)
                        results[pos] = failed_result(agents[pos], f, self.timeout_s, retries[pos])
                        observer.member_event(f.index, "failed", {"error": f"timeout: {f.message}", "kind": "timeout"})
                continue
            ref = ready[0]
            pos, worker, _ = pending.pop(ref)
            try:
                out = ray.get(ref)
            except RayTaskError as exc:  # the wrapper itself raised (e.g. a state from_state refuses)
                idle.append(worker)
                f = Failure(agents[pos].index, "error", _first_line(exc), attempts[pos], generation)
                results[pos] = failed_result(agents[pos], f, 0.0, retries[pos])
                observer.member_event(f.index, "failed", {"error": f"error: {f.message}", "kind": "error"})
                continue
            except RayError as exc:  # the actor's process or node is gone: replace it, retry the member
                idle.append(self._replace(worker))
                lost(pos, f"{type(exc).__name__}: {_first_line(exc)}")
                continue
            idle.append(worker)
            index = agents[pos].index
            if out["failure"] is not None:
                kind, message = out["failure"]
                if kind == "lost":
                    lost(pos, message)
                    continue
                f = Failure(index, kind, message, attempts[pos], generation)
                results[pos] = failed_result(agents[pos], f, out["wall_s"], retries[pos])
                observer.member_event(index, "failed", {"error": f"{kind}: {message}", "kind": kind})
                continue
            agent = self.cls.from_state(out["state"], self.context)
            agent.index = index
            results[pos] = MemberResult(agent, out["evaluation"], out["metrics"], out["wall_s"], None, retries[pos])
            if out["staged"] is not None:
                staged.append((index, out["staged"]))
            observer.member_event(index, "done", {"fitness": out["evaluation"].fitness, "wall_s": out["wall_s"]})
        if shared is not None:
            commit_views(shared, staged)
        return [r for r in results if r is not None]

    def worker_pids(self) -> list[int]:
        """Process ids of the live member actors (tests kill them)."""
        import ray

        return ray.get([w.pid.remote() for w in self.workers])

    def close(self) -> None:
        import ray

        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # already gone
                pass
        self.workers = []
        stop = getattr(self.context.replay, "stop", None)  # the run's replay service: ours to stop
        if stop is not None:
            try:
                stop()
            except Exception:
                pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= 300 else line[:297] + "..."
