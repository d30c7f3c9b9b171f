"""Train members on Ray actors: several cores, GPUs or machines.

Members travel as their state (tensors + JSON, the same tree a checkpoint holds), so an actor
can train any member and the result does not depend on which actor ran it. Each actor builds the
run's AgentContext once (the task and the shared replay store handle) and pins torch to
`cpus_per_member` threads.
"""

from __future__ import annotations

import os
import time
from typing import Any

from evo.agent import Agent, AgentContext
from evo.observer import RunObserver
from evo.replay.protocol import Replay, ReplaySpec, build_replay
from evo.scheduler.base import MemberFailed, MemberResult, train_and_evaluate

__all__ = ["RayScheduler", "init_ray"]


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the cluster at `address` (or RAY_ADDRESS); otherwise start a small local one."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    # workers must import the same code as the driver (agents given as module:Class paths too)
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}}
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False,
                 object_store_memory=256 * 1024**2, runtime_env=env, log_to_driver=False)


class _MemberWorker:
    """A Ray actor that trains whichever member it is handed."""

    def __init__(self, agent_class: type[Agent], context: AgentContext, threads: int) -> None:
        import torch

        torch.set_num_threads(max(1, threads))
        self.cls = agent_class
        self.context = context

    def run(self, state: dict[str, Any], steps: int) -> tuple[dict[str, Any], dict[str, float], Any, float]:
        agent = self.cls.from_state(state, self.context)
        metrics, evaluation, wall = train_and_evaluate(agent, steps)
        return agent.get_state(), metrics, evaluation, wall


class RayScheduler:
    def __init__(self, agent_class: type[Agent], context: AgentContext, num_workers: int,
                 cpus_per_member: float = 1.0, gpus_per_member: float = 0.0, timeout_s: float = 3600.0) -> None:
        import ray

        self.context = context
        self.cls = agent_class
        self.timeout_s = timeout_s
        actor = ray.remote(num_cpus=cpus_per_member, num_gpus=gpus_per_member)(_MemberWorker)
        worker_context = AgentContext(task=context.task, replay=context.replay,
                                      device="cuda" if gpus_per_member > 0 else context.device, seed=context.seed)
        self.workers = [actor.remote(agent_class, worker_context, int(max(1, cpus_per_member))) for _ in range(num_workers)]

    @staticmethod
    def build_replay(spec: ReplaySpec, seed: int) -> Replay:
        return build_replay(spec, seed, distributed=True)

    def run_generation(self, agents: list[Agent], steps: int,
                       observer: RunObserver | None = None) -> list[MemberResult]:
        import ray

        observer = observer or RunObserver()
        pending: dict[Any, int] = {}
        queue = list(range(len(agents)))
        idle = list(self.workers)
        results: list[MemberResult | None] = [None] * len(agents)
        deadline = time.monotonic() + self.timeout_s
        busy: dict[Any, Any] = {}
        while queue or pending:
            while queue and idle:
                pos = queue.pop(0)
                worker = idle.pop(0)
                ref = worker.run.remote(agents[pos].get_state(), steps)
                pending[ref], busy[ref] = pos, worker
                observer.member_event(agents[pos].index, "training", {})
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise MemberFailed(agents[next(iter(pending.values()))].index,
                                   f"no result within {self.timeout_s:.0f} s (resources.timeout_s)")
            ref = ready[0]
            pos = pending.pop(ref)
            idle.append(busy.pop(ref))
            try:
                state, metrics, evaluation, wall = ray.get(ref)
            except Exception as exc:
                raise MemberFailed(agents[pos].index, f"{type(exc).__name__}: {exc}") from exc
            agent = self.cls.from_state(state, self.context)
            agent.index = agents[pos].index
            results[pos] = MemberResult(agent, evaluation, metrics, wall)
            observer.member_event(agent.index, "done", {"fitness": evaluation.fitness, "wall_s": wall})
        return [r for r in results if r is not None]

    def close(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []
