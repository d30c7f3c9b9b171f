"""Fused groups on Ray (evo.fused.remote + the RayScheduler dispatch): how a group is cut into jobs,
and that a job's members keep per-member faults — a member that raises fails alone, and when the
actor of a fused job dies every member of the job is retried and ends as if trained here.

The EfficientZero run on Ray is in test_fused_run.py; here the toy agent keeps it fast, with a
trainer that trains a group's members one after another (a real `FusedTrainer`, not vectorised:
what is under test is the scheduler's handling of jobs, not the fused arithmetic)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from evo.agent import AgentContext
from evo.fused.remote import FusedJobs
from evo.rng import member_seed
from evo.testing.scheduler_contract import FAIL_INDEX, INJECTED, probe_class
from tests.toy_agent import ToyAgent

TASK = ToyAgent.validate_task({"n_train": 128, "n_val": 64})
KILL_INDEX = 777


class OneByOne:
    """Groups toy members by architecture; trains and evaluates a group's members in turn."""

    def group_key(self, agent: Any) -> str | None:
        return json.dumps(agent.arch, sort_keys=True)

    def train(self, agents: list[Any], steps: int) -> list[dict[str, float] | BaseException]:
        out: list[dict[str, float] | BaseException] = []
        for agent in agents:
            try:
                out.append({**agent.train(steps), "job_size": float(len(agents))})
            except Exception as exc:
                out.append(exc)
        return out

    def evaluate(self, agents: list[Any]) -> list[Any]:
        return [agent.evaluate() for agent in agents]


def members(cls: type, indices: list[int], arch: dict[str, Any] | None = None) -> list[Any]:
    ctx = AgentContext(task=TASK, seed=0)
    values = {k: h.value for k, h in ToyAgent.default_hparams().items()}
    a = ToyAgent.validate_arch(dict(arch or {}))
    return [cls.create(a, values, member_seed(0, i), i, ctx) for i in indices]


def test_groups_are_cut_into_about_one_chunk_per_actor() -> None:
    small = {"blocks": [8]}
    agents = members(ToyAgent, list(range(8))) + members(ToyAgent, [8, 9], small) + members(ToyAgent, [10], small)
    jobs = FusedJobs(OneByOne(), agents, workers=2)
    queue = deque(range(len(agents)))
    taken = []
    while queue:
        taken.append(jobs.take(queue))
    # chunks per group: round(g * workers / n), at least one: round(16 / 11) = 1 job of 8, round(6 / 11) -> 1 of 3
    assert taken == [list(range(8)), [8, 9, 10]]
    jobs = FusedJobs(OneByOne(), agents[:8], workers=2)
    queue = deque([5, 0, 1, 2, 3, 4, 6, 7])  # a retried member comes back at the front
    assert [jobs.take(queue), jobs.take(queue)] == [[5, 0, 1, 2], [3, 4, 6, 7]]
    jobs = FusedJobs(OneByOne(), agents[:8], workers=8)
    assert jobs.take(deque(range(8))) == [0]  # as many actors as members: one each


def _killer(marker: str) -> type:
    """The toy agent, except that member KILL_INDEX kills its actor's process the first time it trains,
    after a pause: the other job is in by then and its actor idle, the order in which CI once saw the
    killed job's first member retried alone before its other members' errors were read."""
    base = ToyAgent

    def train(self: Any, steps: int) -> dict[str, float]:
        if self.index == KILL_INDEX and not os.path.exists(marker):
            Path(marker).touch()
            time.sleep(2.0)
            os.kill(os.getpid(), signal.SIGKILL)
        return base.train(self, steps)

    return type(base)("KillOnce", (base,), {"train": train, "__module__": __name__ + ".by_value"})


def test_a_fused_job_keeps_faults_per_member(ray_cluster) -> None:
    from evo.scheduler.ray import RayScheduler

    with tempfile.TemporaryDirectory() as tmp:
        cls = _killer(str(Path(tmp) / "killed"))
        probe = probe_class(cls)
        scheduler = RayScheduler(probe, AgentContext(task=TASK, seed=0), num_workers=2, cpus_per_member=1,
                                 timeout_s=600, fused=OneByOne())
        try:
            indices = [1, KILL_INDEX, 2, FAIL_INDEX, 3, 4]  # jobs of 3: [1, KILL, 2] and [FAIL, 3, 4]
            results = scheduler.run_generation(members(probe, indices), 5)
        finally:
            scheduler.close()
        assert (Path(tmp) / "killed").exists()
    here = {i: (a.train(5), a.evaluate()) for i, a in zip(indices, members(ToyAgent, indices)) if i != FAIL_INDEX}
    assert [r.agent.index for r in results] == indices
    for r in results:
        if r.agent.index == FAIL_INDEX:
            assert r.failure is not None and r.failure.kind == "error" and INJECTED in r.failure.message
            continue
        assert r.failure is None, r.failure
        assert r.evaluation.fitness == here[r.agent.index][1].fitness
        assert r.train_metrics["job_size"] >= 2  # trained in a fused job, on the retry too
        killed_job = r.agent.index in (1, KILL_INDEX, 2)
        assert [f.kind for f in r.retries] == (["lost"] if killed_job else []), r.retries
