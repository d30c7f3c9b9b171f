"""Members, cloning by index, lineage, and the generation loop.

One generation: train + evaluate every member (the scheduler), score each by the mean of its
last k evaluations, keep the elite unmutated, fill the other slots with mutated clones of
tournament winners, and commit it all to the run store in one transaction. Randomness for
selection and mutation is drawn from a generator seeded by (seed, generation), so a run resumed
after a crash makes exactly the choices the uninterrupted run would have made.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from agents import agent_class
from agents.base import Agent, AgentContext
from evo.mutation import apply_mutation
from evo.runstore import EvaluatedMember, MemberRecord, RunStore
from evo.scheduler.base import MemberResult, ProgressCallback, Scheduler
from evo.selection import fitness_score, tournament_select
from evo.spec import Experiment

__all__ = ["Member", "member_seed", "initial_population", "next_generation", "evolve", "make_scheduler"]


@dataclass
class Member:
    record: MemberRecord
    agent: Agent

    @property
    def index(self) -> int:
        return self.record.index


def member_seed(seed: int, index: int) -> int:
    """A member's own seed: independent streams for every (run seed, index) pair."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1, dtype=np.uint64)[0] >> 1)


def generation_rng(seed: int, generation: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, generation, 0x5E1EC7]))


def initial_population(exp: Experiment, context: AgentContext) -> list[Member]:
    cls = agent_class(exp.agent.kind)
    space = exp.hparam_space()
    members = []
    for index in range(exp.population.size):
        values = {name: hp.value for name, hp in space.items()}
        if exp.population.initial == "sample" and index > 0:
            # PBT-style spread; member 0 keeps the file's values so a good default is never lost
            rng = np.random.default_rng(np.random.SeedSequence([exp.seed, index, 0x1417]))
            values.update({name: hp.sample(rng) for name, hp in space.items() if hp.mutable})
        agent = cls.create(exp.arch(), values, member_seed(exp.seed, index), index, context)
        record = MemberRecord(index, None, 0, None, dict(agent.arch), dict(agent.hparams), [])
        members.append(Member(record, agent))
    return members


def next_generation(members: list[Member], generation: int, exp: Experiment) -> list[Member]:
    """Select and mutate: the population that starts generation `generation`."""
    rng = generation_rng(exp.seed, generation)
    scores = [fitness_score(m.record.history, exp.selection.fitness_window) for m in members]
    elite, parents = tournament_select(scores, len(members), exp.selection.tournament_size,
                                       exp.selection.elitism, rng)
    next_index = max(m.index for m in members) + 1
    out: list[Member] = []
    if elite is not None:
        e = members[elite]
        # the elite survives unmutated and keeps its index and history
        out.append(Member(MemberRecord(e.index, e.record.parent, e.record.born, e.record.mutation,
                                       dict(e.agent.arch), dict(e.agent.hparams), list(e.record.history)),
                          e.agent.clone(e.index)))
    for pos in parents:
        parent = members[pos]
        child = parent.agent.clone(next_index)
        mutation = apply_mutation(child, exp.mutation, exp.hparam_space(), rng)
        out.append(Member(MemberRecord(next_index, parent.index, generation, mutation,
                                       dict(child.arch), dict(child.hparams), []), child))
        next_index += 1
    return out


def make_scheduler(exp: Experiment, backend: str, address: str | None = None) -> Scheduler:
    """The run's shared context (task + replay store) and a scheduler for `backend`."""
    cls = agent_class(exp.agent.kind)
    distributed = backend == "ray"
    if distributed:
        from evo.scheduler.ray import RayScheduler, init_ray

        init_ray(address or exp.resources.address)
    replay = cls.create_replay(exp.task(), exp.seed, distributed)
    context = AgentContext(task=exp.task(), replay=replay, seed=exp.seed)
    if not distributed:
        from evo.scheduler.inline import InlineScheduler

        return InlineScheduler(context, threads=max(1, int(exp.resources.cpus_per_member)))
    import ray

    cpus = ray.cluster_resources().get("CPU", 1)
    workers = exp.resources.num_workers or max(1, min(exp.population.size, int(cpus // exp.resources.cpus_per_member)))
    return RayScheduler(exp.agent.kind, context, workers, exp.resources.cpus_per_member,
                        exp.resources.gpus_per_member, exp.resources.timeout_s)


GenerationCallback = Callable[[int, list[dict[str, Any]]], None]


def evolve(exp: Experiment, store: RunStore, scheduler: Scheduler, generations: int | None = None,
           progress: ProgressCallback | None = None, on_generation: GenerationCallback | None = None,
           on_generation_start: Callable[[int, list[int]], None] | None = None) -> None:
    """Run (or continue) the generation loop until `generations` are complete."""
    cls = agent_class(exp.agent.kind)
    total = generations or exp.population.generations
    start = store.last_completed_generation() + 1
    if start == 0 and not store.population(0):
        members = initial_population(exp, scheduler.context)
        store.save_initial_population([(m.record, m.agent.get_state()) for m in members])
    else:
        members = [Member(rec, cls.from_state(state, scheduler.context)) for rec, state in store.load_population(start)]
        if start > 0:
            store.restore_replay(scheduler.context.replay, start - 1)
    store.set(status="running", generations_planned=total)
    for generation in range(start, total):
        t0 = time.perf_counter()
        if on_generation_start:
            on_generation_start(generation, [m.index for m in members])
        results: list[MemberResult] = scheduler.run_generation([m.agent for m in members],
                                                               exp.population.steps_per_generation, progress)
        evaluated = []
        for member, result in zip(members, results):
            member.agent = result.agent
            member.record.history.append(float(result.evaluation.fitness))
            member.record.arch, member.record.hparams = dict(result.agent.arch), dict(result.agent.hparams)
            score = fitness_score(member.record.history, exp.selection.fitness_window)
            evaluated.append(EvaluatedMember(member.record, float(result.evaluation.fitness), score,
                                             dict(result.evaluation.metrics), result.train_metrics,
                                             member.agent.get_state(), result.wall_s))
        children = next_generation(members, generation + 1, exp)
        store.snapshot_replay(scheduler.context.replay, generation)
        store.commit_generation(generation, evaluated, [(c.record, c.agent.get_state()) for c in children],
                                time.perf_counter() - t0)
        if on_generation:
            on_generation(generation, store.evaluations(generation))
        members = children
    store.set(status="completed")
