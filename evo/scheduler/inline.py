"""Train members one after another in this process: for debugging and fast tests."""

from __future__ import annotations

from agents.base import Agent, AgentContext
from evo.scheduler.base import MemberFailed, MemberResult, ProgressCallback, train_and_evaluate

__all__ = ["InlineScheduler"]


class InlineScheduler:
    def __init__(self, context: AgentContext, threads: int | None = 1) -> None:
        self.context = context
        if threads:
            import torch

            # like the Ray workers: on small machines 2+ intra-op threads stall tight training loops
            # (ILQL measured ~10x slower with 2 threads on 2 cores)
            torch.set_num_threads(threads)

    def run_generation(self, agents: list[Agent], steps: int,
                       progress: ProgressCallback | None = None) -> list[MemberResult]:
        results = []
        for agent in agents:
            if progress:
                progress(agent.index, "training", {})
            try:
                metrics, evaluation, wall = train_and_evaluate(agent, steps)
            except Exception as exc:
                raise MemberFailed(agent.index, f"{type(exc).__name__}: {exc}") from exc
            results.append(MemberResult(agent, evaluation, metrics, wall))
            if progress:
                progress(agent.index, "done", {"fitness": evaluation.fitness, "wall_s": wall})
        return results

    def close(self) -> None:
        pass
