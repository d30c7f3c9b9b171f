"""The scheduler contract over both backends, with the toy agent (fast; no replay store)."""

from __future__ import annotations

import pytest

from evo.agent import Agent, AgentContext
from evo.scheduler.inline import InlineScheduler
from evo.testing import SchedulerContract
from tests.toy_agent import ToyAgent


class _ToyMembers(SchedulerContract):
    agent_class = ToyAgent
    task = {"n_train": 128, "n_val": 64}
    hparams = {"batch_size": 16}
    train_steps = 5


class TestInlineScheduler(_ToyMembers):
    scheduler_class = InlineScheduler
    supports_timeout = False  # members run in this process, one after another: nothing can interrupt them

    def make_scheduler(self, agent_class: type[Agent], context: AgentContext, timeout_s: float | None) -> InlineScheduler:
        return InlineScheduler(threads=1, context=context)


def _warm_up(worker: object) -> None:
    """Run in each actor: the first torch optimizer in a process imports torch._dynamo (~4 s here)."""
    import torch

    weight = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.Adam([weight])
    weight.sum().backward()
    optimizer.step()


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from evo.scheduler.ray import init_ray

    init_ray(num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.mark.usefixtures("ray_cluster")
class TestRayScheduler(_ToyMembers):
    parallel = True

    @property
    def scheduler_class(self) -> type:  # imported lazily: the module must collect without Ray
        from evo.scheduler.ray import RayScheduler

        return RayScheduler

    def make_scheduler(self, agent_class: type[Agent], context: AgentContext, timeout_s: float | None):
        import ray

        from evo.scheduler.ray import RayScheduler

        # half a CPU each: the shared backend and a timeout check's own fit in one 2-CPU cluster together
        scheduler = RayScheduler(agent_class, context, num_workers=2, cpus_per_member=0.5,
                                 timeout_s=timeout_s or 600)
        # start and warm the actors, so the timeout checks time members rather than process start-up
        ray.get([w.__ray_call__.remote(_warm_up) for w in scheduler.workers], timeout=180)
        return scheduler

    def test_last_timing_holds_the_generation_seconds(self) -> None:
        """`last_timing` (read by benchmarks.scheduler) times the generation it describes: its wall
        seconds lie within the call's, and every member's span within the generation's clock."""
        import time

        scheduler, _ = self.shared()
        indices = [41, 42, 43]
        began = time.time()
        start = time.perf_counter()
        self.check_succeeded(scheduler.run_generation(self.members(indices), self.train_steps), indices)
        elapsed = time.perf_counter() - start
        timing = scheduler.last_timing
        assert 0 < timing["wall_s"] <= elapsed
        assert began <= timing["began_at"] <= timing["ended_at"] <= time.time()
        assert sorted(timing["spans"]) == indices
        assert all(timing["began_at"] <= s <= e <= timing["ended_at"] for _, s, e in timing["spans"].values())

    def test_a_long_member_given_last_gets_an_actor_to_itself(self) -> None:
        """With `expected_s`, the member expected to take longest starts first and no other member is
        queued behind it (`prefetch` queues a member behind the actor with the fewest expected seconds
        pending): the short ones share the other actor. Without the hint, the input order (long member
        last) puts a short one before it on one actor — the generation waits for both in a row."""
        from evo.testing.scheduler_contract import PACED_INDICES, PACED_S

        scheduler, _ = self.shared()
        indices = [31, 32, 33, PACED_INDICES[0]]

        def actors(expected_s: list[float] | None) -> dict[int, int]:
            results = scheduler.run_generation(self.members(indices), self.train_steps, expected_s=expected_s)
            self.check_succeeded(results, indices)
            return {index: span[0] for index, span in scheduler.last_timing["spans"].items()}

        hinted = actors([0.05, 0.05, 0.05, PACED_S])
        long_actor = hinted[PACED_INDICES[0]]
        assert [i for i, pid in hinted.items() if pid == long_actor] == [PACED_INDICES[0]], (
            f"members by actor pid with the hint: {hinted}")
        plain = actors(None)
        assert len([i for i, pid in plain.items() if pid == plain[PACED_INDICES[0]]]) >= 2, (
            f"without the hint the long member shared its actor (the check's premise): {plain}")
