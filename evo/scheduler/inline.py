"""Train members one after another in this process: for debugging and fast tests.

Members that share the run's replay store each train on their own view of it (evo.replay.view),
rebuilt from their state with that view; the views' staged writes are committed in member order
after the last member, exactly as the Ray backend does, so both give the same results.

`resources.gpus_per_member > 0` makes members train on this process's CUDA device (`inline_device`);
without one the request is refused before anything starts, as the Ray backend refuses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evo.agent import Agent, AgentContext, clone_tree
from evo.faults import Failure, ResourceRequestError
from evo.fused.run import attempt_fused
from evo.observer import RunObserver
from evo.replay.protocol import Replay, ReplaySpec, build_replay
from evo.replay.view import LineState, commit_views, view_seed
from evo.scheduler.base import (
    MemberResult,
    attempt_member,
    dispatch_order,
    done_event,
    failed_result,
    member_context,
    member_view,
    steps_of_members,
)
from evo.training_thread import prepare_training_thread

__all__ = ["InlineScheduler", "inline_device"]


def inline_device(gpus_per_member: float, cuda_devices: int | None = None) -> str:
    """The device inline members train on: "cpu" without a GPU request; "cuda" (this process's
    current CUDA device) with one. Asking for more GPUs than this process sees raises
    `ResourceRequestError` (exit 2). `cuda_devices`: the count to assume (default: torch's)."""
    if gpus_per_member <= 0:
        return "cpu"
    if cuda_devices is None:
        import torch

        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cuda_devices < gpus_per_member:
        raise ResourceRequestError("resources.gpus_per_member", f"{gpus_per_member:g} GPU per member on the inline backend",
                                   f"{cuda_devices} CUDA device{'s' if cuda_devices != 1 else ''} in this process",
                                   "set gpus_per_member = 0 to train on the CPU, or use the Ray backend on a GPU cluster")
    return "cuda"


class InlineScheduler:
    def __init__(self, threads: int | None = 1, context: AgentContext | None = None, fused: Any = None) -> None:
        """`context`: the run's context; its replay store (if any) is read through member views.
        `fused`: an `evo.fused.run.FusedTrainer` (resources.fused): members sharing a group key
        train and evaluate as one program (docs/fused.md)."""
        self.context = context
        self.fused = fused
        # members train on this thread, as on a Ray worker: threads, allocator, denormals (evo/training_thread.py)
        prepare_training_thread(threads or None)

    @staticmethod
    def build_replay(spec: ReplaySpec, seed: int) -> Replay:
        return build_replay(spec, seed, distributed=False)

    def run_generation(self, agents: list[Agent], steps: int | Sequence[int], observer: RunObserver | None = None,
                       generation: int = 0, evaluate: bool = True,
                       lines: dict[int, LineState] | None = None,
                       expected_s: Sequence[float | None] | None = None) -> list[MemberResult]:
        """See `Scheduler.run_generation`; `evaluate=False` (an async rung judged on a training metric)
        trains without evaluating, except fused groups (sync only), whose evaluation is one program.
        Members run one after another in the order given: `expected_s` is checked, and the order of
        one process's work does not change its end."""
        lines = lines or {}
        per_member = steps_of_members(steps, len(agents), in_step=bool(self.fused))
        dispatch_order(expected_s, len(agents))  # a bad hint is refused here as on Ray
        observer = observer or RunObserver()
        shared = self.context.replay if self.context is not None else None
        basis = shared.view_basis() if shared is not None else None
        results, staged = [], []
        prepared = [self._prepare(agent, basis, generation, lines.get(agent.index)) for agent in agents] if self.fused else []
        if self.fused:
            for agent in agents:
                observer.member_event(agent.index, "training", {})
            count = per_member[0] if per_member else 0
            outcomes = attempt_fused(self.fused, [p[1] for p in prepared], count, lambda m: attempt_member(m, count))
        for pos, agent in enumerate(agents):
            if self.fused:
                context, member, start, view = prepared[pos]
                metrics, evaluation, wall, failure = outcomes[pos]
            else:
                if per_member[pos]:  # a member given no steps only evaluates: its "evaluating" event comes next
                    observer.member_event(agent.index, "training", {})
                context, member, start, view = self._prepare(agent, basis, generation, lines.get(agent.index))
                metrics, evaluation, wall, failure = attempt_member(
                    member, per_member[pos], on_evaluate=lambda index=agent.index: observer.member_event(index, "evaluating", {}),
                    evaluate=evaluate)
            if failure is not None:
                kind, message = failure
                # inline, "lost" can only mean a Ray error inside the member: nothing to retry on
                f = Failure(agent.index, kind, message, 1, generation)
                before = agent if start is None else type(agent).from_state(start, context)
                results.append(failed_result(before, f, wall))
                observer.member_event(agent.index, "failed", {"error": f"{kind}: {message}", "kind": kind})
                continue
            line = None
            if view is not None:
                staged.append((agent.index, view.staged()))
                line = view.line_state()
                member = type(agent).from_state(member.get_state(), context)  # let go of the view
            results.append(MemberResult(member, evaluation, metrics, wall, line=line))
            observer.member_event(agent.index, "done", done_event(evaluation, wall, per_member[pos]))
        if shared is not None:
            commit_views(shared, staged)
        return results

    def _prepare(self, agent: Agent, basis: Any, generation: int,
                 line: LineState | None = None) -> tuple[AgentContext, Agent, Any, Any]:
        """(context, the member to train, its start state if trained in place, its replay view)."""
        context = self.context or getattr(agent, "context", AgentContext())
        if basis is not None:
            view = member_view(context, basis, view_seed(context.seed, agent.index, generation), line)
            return context, type(agent).from_state(agent.get_state(), member_context(context, view)), None, view
        # trained in place; its start state kept in case it fails
        return context, agent, clone_tree(agent.get_state()), None

    # ---- asynchronous evolution (population.mode = "async"; evo.steady) ------------------------------
    capacity = 1  # members in flight at once

    def submit(self, key: Any, agent: Agent, steps: int, round_: int, observer: RunObserver | None = None,
               evaluate: bool = True) -> None:
        """Queue `agent` for a round of `steps` (evaluated after it unless `evaluate=False`); `collect`
        trains it (one member at a time, in order)."""
        self._submitted = getattr(self, "_submitted", [])
        self._submitted.append((key, agent, steps, round_, observer, evaluate))

    def in_flight(self) -> int:
        return len(getattr(self, "_submitted", []))

    def collect(self, timeout: float | None = None) -> list[tuple[Any, MemberResult]]:
        """Train the oldest queued member now and return its (key, result); its replay view's
        writes reach the shared store at once."""
        if not getattr(self, "_submitted", None):
            return []
        key, agent, steps, round_, observer, evaluate = self._submitted.pop(0)
        return [(key, self.run_generation([agent], steps, observer, generation=round_, evaluate=evaluate)[0])]

    def close(self) -> None:
        pass
