"""The Scheduler protocol: train and evaluate a generation's members, somewhere.

A scheduler receives agents and gives back trained agents with their evaluations. Where the work
runs (this process, Ray actors on other cores, GPUs or machines) is its business alone; the
generation loop cannot tell the difference: for the same seed every backend gives the same
results, also for members sharing the run's replay store, because each member reads and writes
it through its own view for the generation (`evo.replay.view`), whose staged writes the scheduler
commits in member order once every member is done. Each backend also builds the run's shared
replay store where its members can reach it (`build_replay`).

A member that fails does not fail the generation: its result carries a `Failure` (docs/faults.md)
and the generation loop gives it fitness −inf. Only a lost worker is retried.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from evo.agent import Agent, AgentContext, Evaluation
from evo.faults import Diverged, Failure, describe_exception
from evo.inference import search_at_evaluation
from evo.observer import RunObserver
from evo.replay.protocol import Replay, ReplaySpec
from evo.replay.staging import ViewBasis
from evo.replay.view import LineState, MemberView
from evo.training_thread import prepare_training_thread

__all__ = ["Scheduler", "MemberResult", "MemberFailed", "train_and_evaluate", "attempt_member", "done_event",
           "member_context", "failed_result", "steps_of_members", "dispatch_order"]


@dataclass
class MemberResult:
    """One member's outcome in one generation. With `failure` set the member failed: `agent` is
    its generation-start state and `evaluation.fitness` is −inf. `evaluation` is None for a member
    trained without an evaluation (an async rung judged on a training metric). `retries` are the
    lost attempts that were retried before this outcome. `line` is the member's line store after
    the generation (`replay.own_rows = "line"`; None otherwise, and for a failed member)."""

    agent: Agent
    evaluation: Evaluation | None
    train_metrics: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    failure: Failure | None = None
    retries: list[Failure] = field(default_factory=list)
    line: LineState | None = None

    @property
    def failed(self) -> bool:
        return self.failure is not None


class MemberFailed(RuntimeError):
    """A member's training or evaluation raised (or timed out); carries the member index."""

    def __init__(self, index: int, message: str) -> None:
        self.index = index
        super().__init__(f"member {index}: {message}")


class Scheduler(Protocol):
    @staticmethod
    def build_replay(spec: ReplaySpec, seed: int) -> Replay:
        """The run's shared store, placed where this backend's members reach it."""

    def run_generation(self, agents: list[Agent], steps: int | Sequence[int], observer: RunObserver | None = None,
                       generation: int = 0, lines: dict[int, LineState] | None = None,
                       expected_s: Sequence[float | None] | None = None) -> list[MemberResult]:
        """Train each agent for `steps` (one count for all, or one per agent: 0 evaluates a member
        without training it, `selection.rest_elite`) and evaluate it; results in the order of `agents`, failed
        members included (`MemberResult.failure`). `generation` seeds the members' replay views;
        `lines` holds their line stores by member index (`replay.own_rows = "line"`), and each
        result carries the new one. `expected_s`: the seconds each member's round is expected to take
        (None: unknown), a hint a parallel backend may use to start the longest first
        (`dispatch_order`); it changes which worker runs a member and when, never a result."""

    def close(self) -> None:
        """Release workers and services."""


def train_and_evaluate(agent: Agent, steps: int, on_evaluate: Callable[[], None] | None = None,
                       evaluate: bool = True) -> tuple[dict[str, float], Evaluation | None, float]:
    """Train, then evaluate (calling `on_evaluate` in between, for live displays); returns
    (train metrics, evaluation, wall seconds), the evaluation None with `evaluate=False`. Raises
    `Diverged` when a loss metric, a parameter or the fitness is not finite."""
    start = time.perf_counter()
    prepare_training_thread(threads=None)  # on the thread that trains; the agent chooses its threads
    metrics: dict[str, float] = {}
    if steps > 0:  # 0: a resting member (selection.rest_elite) is evaluated as it is
        metrics = dict(agent.train(steps) or {})
        check_trained(agent, metrics)
    if not evaluate:
        return metrics, None, time.perf_counter() - start
    if on_evaluate is not None:
        on_evaluate()
    evaluation = agent.evaluate()
    if not math.isfinite(float(evaluation.fitness)):
        raise Diverged(f"fitness is {evaluation.fitness}")
    search = getattr(getattr(agent, "context", None), "inference_search", None)
    if search is not None:  # mutation.inference_search: neighbours of its inference-only values, on the same weights
        evaluation = search_at_evaluation(agent, evaluation, search)
    return metrics, evaluation, time.perf_counter() - start


def steps_of_members(steps: int | Sequence[int], n: int, in_step: bool = False) -> list[int]:
    """`run_generation`'s `steps` as one count per member of `n`: a single count is everyone's.
    `in_step`: the members train as one program (fused groups), so their counts must be equal."""
    if isinstance(steps, numbers.Integral):
        return [int(steps)] * n
    out = [int(s) for s in steps]
    if len(out) != n or any(s < 0 for s in out):
        raise ValueError(f"steps: expected {n} counts, none negative, found {out}")
    if in_step and len(set(out)) > 1:
        raise ValueError(f"steps: fused members train in step, expected one count for all, found {out}")
    return out


def dispatch_order(expected_s: Sequence[float | None] | None, n: int) -> list[int]:
    """The positions of `n` members in the order a parallel backend starts them: members whose
    duration is unknown first (in input order), then the longest expected first, ties in input order.
    Started last, a long member keeps the generation waiting while the other workers idle. Longest
    first is Graham's LPT rule: with exact durations on identical workers, each member going to the
    first free one, a generation ends within 4/3 of the best split."""
    if expected_s is None:
        return list(range(n))
    expected = list(expected_s)
    if len(expected) != n or any(e is not None and not (math.isfinite(e) and e >= 0) for e in expected):
        raise ValueError(f"expected_s: expected {n} durations, each None or finite and not negative, found {expected}")
    return sorted(range(n), key=lambda pos: (expected[pos] is not None, -(expected[pos] or 0.0), pos))


def check_trained(agent: Agent, metrics: dict[str, float]) -> None:
    """The engine's own divergence checks after `train`: every loss metric finite, and (for agents
    that list their networks) every parameter finite. One pass over the weights: cheap next to training."""
    for name, value in metrics.items():
        if "loss" in name and isinstance(value, (int, float)) and not math.isfinite(value):
            raise Diverged(f"training metric {name} is {value}")
    networks = getattr(agent, "networks", None)
    if networks is None:
        return
    import torch

    for net_name, net in networks().items():
        for name, p in net.named_parameters():
            if p.is_floating_point() and not bool(torch.isfinite(p).all()):
                raise Diverged(f"parameter {net_name}.{name} is not finite after training")


def attempt_member(agent: Agent, steps: int, on_evaluate: Callable[[], None] | None = None, evaluate: bool = True
                   ) -> tuple[dict[str, float], Evaluation | None, float, tuple[str, str] | None]:
    """`train_and_evaluate`, with what went wrong caught: (metrics, evaluation, wall_s, failure),
    where failure is None or (kind, message) with kind "diverged", "error", or "lost" (a Ray error
    inside the member, e.g. the replay service unreachable: not the member's fault, so retried)."""
    start = time.perf_counter()
    try:
        metrics, evaluation, wall = train_and_evaluate(agent, steps, on_evaluate, evaluate)
        return metrics, evaluation, wall, None
    except Diverged as exc:
        return {}, None, time.perf_counter() - start, ("diverged", str(exc))
    except Exception as exc:
        kind = "lost" if type(exc).__module__.startswith("ray.") else "error"
        return {}, None, time.perf_counter() - start, (kind, describe_exception(exc))


def done_event(evaluation: Evaluation | None, wall_s: float, steps: int) -> dict[str, Any]:
    """The observer's "done" event of a member: its fitness (if it was evaluated), wall seconds and
    the steps it trained."""
    out = {"wall_s": wall_s, "steps": steps}
    return out if evaluation is None else {"fitness": evaluation.fitness, **out}


def member_context(context: AgentContext, replay: Replay | None) -> AgentContext:
    """The run's context with a member's own view of the shared replay store."""
    return replace(context, replay=replay)


def member_view(context: AgentContext, basis: ViewBasis, seed: Any, line: LineState | None = None) -> MemberView:
    """A member's view of the run's shared store for one generation, drawn as the run asks (`own_share`,
    `own_rows`); `line` is the member's line store (`own_rows = "line"`), None for an empty one."""
    return MemberView(context.replay, basis, seed, context.own_share, context.own_rows, line)


def failed_result(agent: Agent, failure: Failure, wall_s: float = 0.0,
                  retries: list[Failure] | None = None) -> MemberResult:
    """The result of a member that failed: its start state, fitness −inf, no metrics."""
    return MemberResult(agent, Evaluation(-math.inf, {}), {}, wall_s, failure, list(retries or []))
