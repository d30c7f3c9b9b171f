"""`SchedulerContract`: what every scheduler backend promises the generation loop.

Subclass it in a test file, name the agent class to run (a fast one: the checks train a few tiny
members several times) and say how to build the backend:

    class TestMyScheduler(SchedulerContract):
        agent_class = ToyAgent
        scheduler_class = MyScheduler
        parallel = True                      # members may finish out of order

        def make_scheduler(self, agent_class, context, timeout_s):
            return MyScheduler(agent_class, context, timeout_s=timeout_s or 600)

The checks follow the protocol in evo/scheduler/base.py: results equal training the same members
in this process and repeat for the same seed; results come back in the order of the input; a
member that raises fails alone (its result carries a `Failure` of kind "error", fitness −inf and
its generation-start state) while the others train on; a member given 0 steps (steps per member)
is evaluated untrained; a hint of each member's duration (`expected_s`) changes no result and is
checked; a member over the timeout fails the same way (kind "timeout") promptly,
while members within it never fail however long the generation.

Misbehaving members come from `probe_class(agent_class)`, a subclass that raises or sleeps for a
few reserved member indices, so one backend instance serves most checks. The checks compare
runs for equality, so pick an agent whose members share no mutable state (no online replay)
unless the backend isolates members' replay writes.
"""

from __future__ import annotations

import math
import time
from typing import Any, ClassVar

from evo.agent import Agent, AgentContext, clone_tree
from evo.hparams import parse_hparam
from evo.observer import RunObserver
from evo.rng import member_seed
from evo.scheduler.base import MemberResult, Scheduler
from evo.testing.compare import assert_same_state, metric_differences, timing_names

__all__ = ["SchedulerContract", "probe_class", "FAIL_INDEX", "HANG_INDEX", "HANG_S", "SLOW_INDEX", "PACED_INDICES"]

#: a member with this index raises in train()
FAIL_INDEX = 90_001
#: a member with this index sleeps HANG_S seconds in train(): far longer than any timeout the checks use
HANG_INDEX = 90_002
HANG_S = 60.0
#: a member with this index sleeps SLOW_S before training (so it finishes after members given later)
SLOW_INDEX = 90_003
SLOW_S = 1.0
#: members with these indices sleep PACED_S before training (each within the timeout, together beyond it)
PACED_INDICES = (90_010, 90_011, 90_012, 90_013)
PACED_S = 2.5
INJECTED = "injected failure (evo.testing.scheduler_contract)"

_PROBES: dict[type, type] = {}


def probe_class(base: type[Agent]) -> type[Agent]:
    """`base` with misbehaviour for the reserved indices above; every other member behaves exactly as
    `base` does. One class per base per process (Ray ships it to workers by value)."""
    if base not in _PROBES:
        def train(self: Agent, steps: int) -> dict[str, float]:
            if self.index == FAIL_INDEX:
                raise RuntimeError(INJECTED)
            if self.index == HANG_INDEX:
                time.sleep(HANG_S)
            elif self.index == SLOW_INDEX:
                time.sleep(SLOW_S)
            elif self.index in PACED_INDICES:
                time.sleep(PACED_S)
            return base.train(self, steps)

        _PROBES[base] = type(base)(f"SchedulerProbe[{base.__qualname__}]", (base,),
                                   {"train": train, "__module__": __name__})
    return _PROBES[base]


class _Recorder(RunObserver):
    def __init__(self) -> None:
        self.events: list[tuple[int, str]] = []
        self.steps: dict[int, int] = {}

    def member_event(self, index: int, event: str, data: dict[str, Any]) -> None:
        self.events.append((index, event))
        if event == "done":
            self.steps[index] = data.get("steps")

    def start_order(self) -> list[int]:
        return [i for i, e in self.events if e == "training"]

    def done_order(self) -> list[int]:
        return [i for i, e in self.events if e == "done"]

    def done_steps(self) -> dict[int, int]:
        """The steps each member's "done" event reported."""
        return dict(self.steps)


class SchedulerContract:
    """The Scheduler protocol's contract; subclass it as `Test<Something>` to run it."""

    #: the agent members are built from (keep it fast)
    agent_class: ClassVar[type[Agent]]
    #: the backend's class (its static `build_replay` places the run's replay store)
    scheduler_class: ClassVar[type]
    task: ClassVar[dict[str, Any]] = {}
    arch: ClassVar[dict[str, Any]] = {}
    hparams: ClassVar[dict[str, Any]] = {}
    train_steps: ClassVar[int] = 3
    run_seed: ClassVar[int] = 0
    #: members run at the same time, so they can finish in any order
    parallel: ClassVar[bool] = False
    #: the backend honours a timeout (False: the timeout checks are skipped, with that reason)
    supports_timeout: ClassVar[bool] = True
    #: the timeout the timeout checks give the backend, in seconds: above PACED_S plus a warm member's
    #: own time on a busy machine, below HANG_S / 2
    timeout_s: ClassVar[float] = 4.0
    #: wall-clock metrics besides those `timing_names` recognises, left out of equality checks
    timing_metrics: ClassVar[frozenset[str]] = frozenset()

    # ---- hooks --------------------------------------------------------------------------------
    def make_scheduler(self, agent_class: type[Agent], context: AgentContext, timeout_s: float | None) -> Scheduler:
        """A backend running `agent_class` members in `context`; `timeout_s` None: the backend's default.

        Return it ready: workers started and warm (a process's first torch optimizer imports
        torch._dynamo, seconds on a busy machine), so the timeout checks time members, not start-up."""
        raise NotImplementedError(f"{type(self).__name__} must define make_scheduler(agent_class, context, timeout_s)")

    def make_context(self) -> AgentContext:
        task = self.agent_class.validate_task(dict(self.task))
        spec = self.agent_class.replay_spec(task)
        replay = self.scheduler_class.build_replay(spec, self.run_seed) if spec is not None else None
        return AgentContext(task=task, replay=replay, seed=self.run_seed)

    # ---- members ------------------------------------------------------------------------------
    def members(self, indices: list[int], cls: type[Agent] | None = None,
                context: AgentContext | None = None) -> list[Agent]:
        """Founders with these indices, seeded as `evo run` seeds them (`member_seed(run seed, index)`)."""
        cls = cls or probe_class(self.agent_class)
        context = context or self.shared()[1]
        defaults = self.agent_class.default_hparams()
        values = {name: (parse_hparam(name, self.hparams[name], hp) if name in self.hparams else hp).value
                  for name, hp in defaults.items()}
        arch = self.agent_class.validate_arch(dict(self.arch))
        return [cls.create(arch, values, member_seed(self.run_seed, i), i, context) for i in indices]

    def shared(self) -> tuple[Scheduler, AgentContext]:
        """One backend per test class (with `timeout_s` where supported), closed by `teardown_class`.
        No check leaves it a member short: the hanging member gets a backend of its own."""
        cls = type(self)
        if "_shared_backend" not in cls.__dict__:
            context = self.make_context()
            timeout = self.timeout_s if self.supports_timeout else None
            cls._shared_backend = (self.make_scheduler(probe_class(self.agent_class), context, timeout), context)
        return cls._shared_backend

    @classmethod
    def teardown_class(cls) -> None:
        backend = cls.__dict__.get("_shared_backend")
        if backend is not None:
            del cls._shared_backend
            backend[0].close()

    def check_failed(self, result: MemberResult, index: int, kind: str, start_state: dict[str, Any]) -> None:
        """`result` reports member `index` failed with `kind`, fitness −inf and its generation-start state."""
        failure = result.failure
        assert failure is not None, f"member {index} should have failed ({kind}); it returned fitness {result.evaluation.fitness}"
        assert failure.index == index and failure.kind == kind, f"member {index}: expected a {kind!r} failure, found {failure}"
        assert result.agent.index == index
        assert result.evaluation.fitness == -math.inf, (
            f"a failed member's fitness must be -inf, found {result.evaluation.fitness}")
        assert_same_state(result.agent.get_state(), start_state, f"failed member {index}: its generation-start state")

    def check_succeeded(self, results: list[MemberResult], indices: list[int]) -> None:
        for r, index in zip(results, indices):
            assert r.failure is None, f"member {index} failed: {r.failure}"
            assert r.agent.index == index and math.isfinite(float(r.evaluation.fitness))

    # ---- the contract -------------------------------------------------------------------------
    def test_results_equal_training_here_and_repeat_for_the_same_seed(self) -> None:
        indices = [12, 3, 7]
        scheduler, context = self.shared()
        first = scheduler.run_generation(self.members(indices), self.train_steps)
        again = scheduler.run_generation(self.members(indices), self.train_steps)
        here = self.members(indices, cls=self.agent_class, context=self.make_context())
        for pos, agent in enumerate(here):
            metrics, evaluation = agent.train(self.train_steps), agent.evaluate()
            for name, results in (("first run", first), ("second run", again)):
                got: MemberResult = results[pos]
                where = f"{name}, member {indices[pos]}"
                assert got.agent.index == indices[pos], f"{where}: result holds member {got.agent.index}"
                assert got.evaluation.fitness == evaluation.fitness, (
                    f"{where}: fitness {got.evaluation.fitness}, training in this process gave {evaluation.fitness}")
                timings = timing_names(got.train_metrics, metrics, got.evaluation.metrics, evaluation.metrics,
                                       extra=self.timing_metrics)
                diffs = metric_differences(got.train_metrics, metrics, timings)
                diffs += metric_differences(got.evaluation.metrics, evaluation.metrics, timings)
                assert not diffs, f"{where}: metrics differ from training in this process: {diffs}"
                assert_same_state(got.agent.get_state(), agent.get_state(), f"{where}: the trained member")

    def test_a_member_given_no_steps_is_evaluated_untrained(self) -> None:
        """Steps per member (`selection.rest_elite` gives the resting one 0): that member is evaluated as
        it is, the others train, each as in this process; "done" events report each member's steps."""
        indices = [14, 6]
        scheduler, _ = self.shared()
        observer = _Recorder()
        results = scheduler.run_generation(self.members(indices), [self.train_steps, 0], observer)
        self.check_succeeded(results, indices)
        here = self.members(indices, cls=self.agent_class, context=self.make_context())
        here[0].train(self.train_steps)
        for pos, agent in enumerate(here):
            evaluation = agent.evaluate()
            where = f"member {indices[pos]} given {[self.train_steps, 0][pos]} steps"
            assert results[pos].evaluation.fitness == evaluation.fitness, (
                f"{where}: fitness {results[pos].evaluation.fitness}, in this process {evaluation.fitness}")
            assert_same_state(results[pos].agent.get_state(), agent.get_state(), where)
        assert results[1].train_metrics == {}, f"an untrained member reports training metrics {results[1].train_metrics}"
        assert observer.done_steps() == {14: self.train_steps, 6: 0}, f"'done' events said {observer.done_steps()}"
        said = [e for i, e in observer.events if i == 6]
        assert "training" not in said and "evaluating" in said, f"the untrained member's events: {said}"

    def test_a_dispatch_hint_changes_no_result(self) -> None:
        """`expected_s`, the seconds each member is expected to take, only orders the work: results are
        those of the same members without it, in input order; a parallel backend starts the members of
        unknown duration first, then the longest (`evo.scheduler.base.dispatch_order`)."""
        indices = [12, 3, 7]
        scheduler, _ = self.shared()
        observer = _Recorder()
        hinted = scheduler.run_generation(self.members(indices), self.train_steps, observer, expected_s=[0.5, None, 2.0])
        plain = scheduler.run_generation(self.members(indices), self.train_steps)
        self.check_succeeded(hinted, indices)
        for pos, index in enumerate(indices):
            got, without = hinted[pos].evaluation.fitness, plain[pos].evaluation.fitness
            assert got == without, f"member {index}: fitness {got} with the hint, {without} without"
            assert_same_state(hinted[pos].agent.get_state(), plain[pos].agent.get_state(), f"member {index} with the hint")
        if self.parallel:
            assert observer.start_order() == [3, 7, 12], f"members started in the order {observer.start_order()}"

    def test_a_bad_dispatch_hint_is_refused(self) -> None:
        scheduler, _ = self.shared()
        for bad in ([1.0], [1.0, -1.0], [float("nan"), None]):
            try:
                scheduler.run_generation(self.members([4, 8]), self.train_steps, expected_s=bad)
            except ValueError as exc:
                assert "expected_s" in str(exc), f"the refusal of {bad} does not name expected_s: {exc}"
            else:
                raise AssertionError(f"expected_s={bad} for 2 members was accepted")

    def test_results_come_back_in_input_order(self) -> None:
        indices = [SLOW_INDEX, 21, 5]  # the first finishes last on a parallel backend
        scheduler, _ = self.shared()
        observer = _Recorder()
        results = scheduler.run_generation(self.members(indices), self.train_steps, observer)
        assert [r.agent.index for r in results] == indices, (
            f"results for members {[r.agent.index for r in results]}, given {indices}")
        assert sorted(observer.done_order()) == sorted(indices), f"observer saw 'done' for {observer.done_order()}"
        if self.parallel:
            assert observer.done_order() != indices, (
                "the slow first member finished first: the check did not exercise out-of-order completion")

    def test_a_raising_member_fails_alone_with_its_error(self) -> None:
        scheduler, _ = self.shared()
        indices = [4, FAIL_INDEX, 9]
        members = self.members(indices)
        start = clone_tree(members[1].get_state())
        results = scheduler.run_generation(members, self.train_steps)
        assert [r.agent.index for r in results] == indices, "failed members keep their place in the results"
        self.check_failed(results[1], FAIL_INDEX, "error", start)
        assert INJECTED in results[1].failure.message, f"the failure should carry the member's error: {results[1].failure}"
        self.check_succeeded([results[0], results[2]], [4, 9])

    def test_a_member_over_the_timeout_fails_promptly(self) -> None:
        self._skip_without_timeout()
        # a backend of its own: the hung member's worker may be replaced by a cold one
        scheduler = self.make_scheduler(probe_class(self.agent_class), self.make_context(), self.timeout_s)
        members = self.members([HANG_INDEX, 4])
        start_state = clone_tree(members[0].get_state())
        try:
            start = time.monotonic()
            results = scheduler.run_generation(members, self.train_steps)
            waited = time.monotonic() - start
        finally:
            start = time.monotonic()
            scheduler.close()
            closing = time.monotonic() - start
        assert [r.agent.index for r in results] == [HANG_INDEX, 4]
        self.check_failed(results[0], HANG_INDEX, "timeout", start_state)
        self.check_succeeded(results[1:], [4])
        assert self.timeout_s * 0.9 <= waited < HANG_S / 2, (
            f"the generation with a hanging member returned after {waited:.1f} s with timeout_s={self.timeout_s}")
        assert closing < 15, f"close() took {closing:.1f} s after a member hung"

    def test_members_within_the_timeout_never_fail_however_long_the_generation(self) -> None:
        self._skip_without_timeout()
        scheduler, _ = self.shared()
        indices = list(PACED_INDICES)  # each takes PACED_S < timeout_s; together they take longer
        start = time.monotonic()
        results = scheduler.run_generation(self.members(indices), self.train_steps)
        took = time.monotonic() - start
        assert [r.agent.index for r in results] == indices
        self.check_succeeded(results, indices)
        assert took > self.timeout_s, (f"the generation took {took:.1f} s: the check needs it to outlast the timeout "
                                       f"(give make_scheduler at most {len(indices) // 2} concurrent members)")
    def _skip_without_timeout(self) -> None:
        if not self.supports_timeout:
            import pytest

            pytest.skip(f"{self.scheduler_class.__name__} has no timeout (supports_timeout = False)")
