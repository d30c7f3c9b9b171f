"""Train members one after another in this process: for debugging and fast tests."""

from __future__ import annotations

from evo.agent import Agent
from evo.observer import RunObserver
from evo.replay.protocol import Replay, ReplaySpec, build_replay
from evo.scheduler.base import MemberFailed, MemberResult, train_and_evaluate

__all__ = ["InlineScheduler"]


class InlineScheduler:
    def __init__(self, threads: int | None = 1) -> None:
        if threads:
            import torch

            # like the Ray workers: on small machines 2+ intra-op threads stall tight training loops
            # (ILQL measured ~10x slower with 2 threads on 2 cores)
            torch.set_num_threads(threads)

    @staticmethod
    def build_replay(spec: ReplaySpec, seed: int) -> Replay:
        return build_replay(spec, seed, distributed=False)

    def run_generation(self, agents: list[Agent], steps: int,
                       observer: RunObserver | None = None) -> list[MemberResult]:
        observer = observer or RunObserver()
        results = []
        for agent in agents:
            observer.member_event(agent.index, "training", {})
            try:
                metrics, evaluation, wall = train_and_evaluate(agent, steps)
            except Exception as exc:
                raise MemberFailed(agent.index, f"{type(exc).__name__}: {exc}") from exc
            results.append(MemberResult(agent, evaluation, metrics, wall))
            observer.member_event(agent.index, "done", {"fitness": evaluation.fitness, "wall_s": wall})
        return results

    def close(self) -> None:
        pass
