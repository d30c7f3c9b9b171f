"""Members, cloning by index, lineage, and the generation loop.

One generation: train + evaluate every member (the scheduler), score each by the mean of its
last k evaluations, keep the elite unmutated, fill the other slots with mutated clones of
tournament winners, and commit it all to the run store in one transaction. Randomness for
selection and mutation is drawn from a generator seeded by (seed, generation), so a run resumed
after a crash makes exactly the choices the uninterrupted run would have made.

Words: a member's *fitness* is one evaluation; its *score* is the mean of its last
`selection.fitness_window` fitnesses, and selection ranks by score.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from evo import interrupts
from evo.agent import Agent, AgentContext
from evo.compute import Compute, LinePoint, round_compute, scores_at_equal_compute
from evo.diversity import measure_diversity
from evo.faults import Failure, GenerationFailed
from evo.inference import inference_search
from evo.mutation import apply_mutation
from evo.observer import RunObserver
from evo.rng import child_seed, generation_rng, member_seed
from evo.runstore import EvaluatedMember, MemberRecord, RunStore
from evo.scheduler.base import MemberResult, Scheduler
from evo.selection import (
    best_of_lines,
    fitness_score,
    judged_tournament_select,
    keep_founder_lines,
    most_crowded_line,
    tournament_select,
    truncation_select,
)
from evo.spec import Experiment

if TYPE_CHECKING:
    from evo.fused.run import FusedTrainer

__all__ = ["Member", "initial_population", "next_generation", "evolve", "start_backend"]


@dataclass
class Member:
    record: MemberRecord
    agent: Agent

    @property
    def index(self) -> int:
        return self.record.index


def initial_population(exp: Experiment, context: AgentContext) -> list[Member]:
    members = []
    for index in range(exp.population.size):
        values = {name: hp.value for name, hp in exp.hparam_space.items()}
        if (exp.population.initial == "sample" and index > 0) or exp.population.initial == "scratch":
            # PBT-style spread; with "sample" member 0 keeps the file's values so a good default is never
            # lost, with "scratch" (HPO from scratch) every founder is drawn
            rng = np.random.default_rng(np.random.SeedSequence([exp.seed, index, 0x1417]))
            values.update({name: hp.sample(rng) for name, hp in exp.hparam_space.items() if hp.mutable})
        agent = exp.agent_class.create(exp.arch, values, member_seed(exp.seed, index), index, context)
        record = MemberRecord(index, None, 0, None, dict(agent.arch), dict(agent.hparams), [])
        members.append(Member(record, agent))
    return members


def next_generation(members: list[Member], scores: list[float], generation: int, exp: Experiment,
                    eligible: list[bool] | None = None, lines: dict[int, list[LinePoint]] | None = None,
                    founders: dict[int, int] | None = None, observations: Sequence = ()) -> list[Member]:
    """Select by `scores` and mutate: the population that starts generation `generation`.
    Members not `eligible` (failed this generation) are neither elite nor parent.

    With `selection.equal_compute`, `secondary` or `founder_lines` set (and the members' `lines`
    and `founders` given), selection is not blind: members are judged at equal compute, ties go to
    the secondary signal, and founders' lines are kept; each child's mutation record says what
    decided its parent's tournament (`details.selected_by`)."""
    rng = generation_rng(exp.seed, generation)
    sel = exp.selection
    if sel.truncation:
        return _truncation_generation(members, scores, generation, exp, rng, eligible, lines, founders, observations)
    decided: list[str] = []
    if lines is not None and (sel.equal_compute != "none" or sel.secondary or sel.founder_lines or sel.tie_tolerance):
        unit = sel.equal_compute if sel.equal_compute != "none" else "env_steps"

        def judge(positions: Sequence[int]) -> tuple[list[float], list[float]]:
            if sel.equal_compute == "none":  # this generation's scores; the secondary signal from the latest point
                latest = [lines.get(members[p].index) or [] for p in positions]
                return ([scores[p] for p in positions],
                        [pts[-1].secondary if pts else math.nan for pts in latest])
            judged = [lines.get(members[p].index) or [LinePoint(Compute(), scores[p])] for p in positions]
            points, _ = scores_at_equal_compute(judged, unit)
            return [pt.score for pt in points], [pt.secondary for pt in points]

        elite, parents, decided = judged_tournament_select(len(members), len(members), sel.tournament_size,
                                                           sel.elitism, rng, judge, eligible, sel.tie_tolerance,
                                                           sel.secondary or "secondary")
        if sel.founder_lines and founders is not None:
            parents, changed = keep_founder_lines(parents, [founders.get(m.index, m.index) for m in members], scores,
                                                  sel.founder_lines, eligible, elite)
            for slot in changed:
                decided[slot] = "founder line kept"
    else:
        elite, parents = tournament_select(scores, len(members), exp.selection.tournament_size,
                                           exp.selection.elitism, rng, eligible=eligible)
    kept: dict[int, int] = {}
    if sel.keep_unbeaten:
        unbeaten = unbeaten_slots(len(members), scores, elite, parents, sel.tie_tolerance, eligible)
        kept = release_worst(unbeaten, scores, len(parents), sel.replace_worst)
        released = unbeaten.keys() - kept
        for slot in released if decided else ():  # say which children exist only because of the quota
            decided[slot] = "worst replaced"
        if sel.founder_lines and founders is not None:
            # a kept member survives in its own slot whatever its parent says, so the lines are counted again
            # on what survives; without this the quota above could be undone (a slot handed to a missing
            # line kept its owner from another line, while the line's own member lost its slot)
            for slot in lines_surviving_unbeaten([founders.get(m.index, m.index) for m in members], scores, elite,
                                                 parents, kept, released, sel.founder_lines, eligible):
                if decided:
                    decided[slot] = "founder line kept"
    next_index = max(m.index for m in members) + 1
    out: list[Member] = []
    if elite is not None:  # the elite survives unmutated
        out.append(_survivor(members[elite]))
    for slot, pos in enumerate(parents):
        if slot in kept:
            out.append(_survivor(members[kept[slot]]))
            continue
        out.append(_mutated_child(members[pos], next_index, generation, exp, rng, observations, lines, founders,
                                  decided[slot] if decided else None))
        next_index += 1
    return out


def _truncation_generation(members: list[Member], scores: list[float], generation: int, exp: Experiment,
                           rng: np.random.Generator, eligible: list[bool] | None, lines: dict[int, list[LinePoint]] | None,
                           founders: dict[int, int] | None, observations: Sequence) -> list[Member]:
    """`selection.truncation`: the lowest-scoring members' positions take mutated clones of the best; the rest train on."""
    replaced = truncation_select(scores, exp.selection.truncation, rng, eligible)
    next_index = max(m.index for m in members) + 1
    out: list[Member] = []
    for pos, member in enumerate(members):
        if pos not in replaced:
            out.append(_survivor(member))
            continue
        out.append(_mutated_child(members[replaced[pos]], next_index, generation, exp, rng, observations, lines,
                                  founders, "truncation"))
        next_index += 1
    return out


def _mutated_child(parent: Member, index: int, generation: int, exp: Experiment, rng: np.random.Generator,
                   observations: Sequence, lines: dict[int, list[LinePoint]] | None, founders: dict[int, int] | None,
                   selected_by: str | None) -> Member:
    """Member `index`, born in `generation`: a clone of `parent`, mutated; it inherits its parent's line
    (`lines`) and founder. `selected_by` (what decided the parent's selection) goes in its mutation record."""
    # a child's own streams, from (run seed, its index, its birth generation): an unmutated
    # clone must explore, not retrace its parent's training draw for draw
    child = parent.agent.clone(index, seed=child_seed(exp.seed, index, generation))
    mutation = apply_mutation(child, exp.mutation, exp.hparam_space, rng, observations, generation)
    if selected_by is not None:
        mutation = replace(mutation, details={**mutation.details, "selected_by": selected_by})
    if lines is not None:
        lines[index] = list(lines.get(parent.index, []))
    if founders is not None:
        founders[index] = founders.get(parent.index, parent.index)
    return Member(MemberRecord(index, parent.index, generation, mutation.to_json(),
                               dict(child.arch), dict(child.hparams), []), child)


def unbeaten_slots(n: int, scores: Sequence[float], elite: int | None, parents: Sequence[int],
                   tolerance: float, eligible: Sequence[bool] | None = None) -> dict[int, int]:
    """`selection.keep_unbeaten`: the parent slots whose own member survives, of `n` members. Slot k
    belongs to the k-th member other than the elite; it is kept when that member trained (is `eligible`) and its
    tournament's winner does not score more than `tolerance` above it. Returns {slot: position}.

    Without it every non-elite slot is overwritten by a clone, so while all members tie (at a
    floor score) a coin toss decides whose weights survive, and progress the evaluation cannot yet
    see is lost; with it a member is replaced only by one that beats it (PBT's exploit rule)."""
    owners = [p for p in range(n) if p != elite]
    ok = [True] * n if eligible is None else list(eligible)
    return {slot: own for slot, (own, winner) in enumerate(zip(owners, parents))
            if ok[own] and not scores[winner] > scores[own] + tolerance}


def release_worst(kept: dict[int, int], scores: Sequence[float], slots: int, replace_worst: int) -> dict[int, int]:
    """`kept` ({slot: position} of `slots` parent slots) less its lowest-scoring members, until at least
    `replace_worst` slots are not kept (`selection.replace_worst`): a population whose scores all sit
    within the tie tolerance still tries new children each generation (PBT replaces its bottom quantile
    whatever the gap)."""
    release = replace_worst - (slots - len(kept))
    dropped = set(sorted(kept, key=lambda s: (scores[kept[s]], s))[:max(release, 0)])
    return {slot: own for slot, own in kept.items() if slot not in dropped}


def lines_surviving_unbeaten(founders: Sequence[int], scores: Sequence[float], elite: int | None, parents: list[int],
                             kept: dict[int, int], released: set[int], lines: int,
                             eligible: Sequence[bool] | None = None) -> list[int]:
    """`selection.founder_lines` under `keep_unbeaten`: make at least `lines` founders' lines survive,
    counting each slot's line as what it holds next generation (its owner if kept, else its parent's
    clone). Each missing line, best first, takes back its best member's own slot (kept there; a clone of
    it if `replace_worst` released the slot) when the line that slot holds has another; else the last
    slot of the most crowded line takes a clone of that member. Changes `parents` and `kept` in place;
    returns the slots changed."""
    owners = [p for p in range(len(founders)) if p != elite]

    def source(slot: int) -> int:
        return kept[slot] if slot in kept else parents[slot]

    best_of = best_of_lines(founders, scores, eligible)
    changed = []
    for founder in sorted(best_of, key=lambda f: -scores[best_of[f]]):
        held = [founders[source(s)] for s in range(len(parents))] + ([founders[elite]] if elite is not None else [])
        if len(set(held)) >= lines:
            break
        if founder in held:
            continue
        best = best_of[founder]
        own = owners.index(best) if best in owners else None
        if own is not None and own < len(parents) and held.count(founders[source(own)]) >= 2:
            slot = own
        else:
            crowded, count = most_crowded_line(held)
            if count < 2:
                break
            slot = max(s for s in range(len(parents)) if founders[source(s)] == crowded)
        parents[slot] = best
        if slot == own and slot not in released:
            kept[slot] = best
        else:
            kept.pop(slot, None)
        changed.append(slot)
    return changed


def _survivor(member: Member) -> Member:
    """`member` into the next generation unmutated: its index, history and random streams kept."""
    rec = member.record
    return Member(MemberRecord(rec.index, rec.parent, rec.born, rec.mutation, dict(member.agent.arch),
                               dict(member.agent.hparams), list(rec.history)), member.agent.clone(rec.index))


def start_backend(exp: Experiment, backend: str, address: str | None = None) -> tuple[Scheduler, AgentContext]:
    """A scheduler for `backend` and the run's shared context, with the replay store the agent
    class asks for built where that backend's members reach it."""
    spec = exp.agent_class.replay_spec(exp.task)
    if spec is not None:  # the [replay] table: how many actors hold the store (Ray backend)
        spec = replace(spec, shards=exp.replay.shards, spread=exp.replay.spread)
    if backend == "inline":
        from evo.scheduler.inline import InlineScheduler, inline_device

        device = inline_device(exp.resources.gpus_per_member)  # refuses a GPU request without CUDA
        replay = InlineScheduler.build_replay(spec, exp.seed) if spec else None
        context = AgentContext(task=exp.task, replay=replay, seed=exp.seed, device=device, own_share=exp.replay.own_share,
                               own_rows=exp.replay.own_rows, inference_search=inference_search(exp))
        return InlineScheduler(threads=max(1, int(exp.resources.cpus_per_member)), context=context,
                               fused=_fused_trainer(exp)), context
    from evo.scheduler.ray import RayScheduler, init_ray
    from evo.scheduler.resources import check_cluster, local_machine, plan_workers

    res = exp.resources
    address = address or res.address or os.environ.get("RAY_ADDRESS")
    here = None if address else local_machine()
    if here is not None:  # a local cluster cannot give what this machine lacks: say so before starting one
        plan_workers(res, exp.population.size, here)
    init_ray(address)
    workers = check_cluster(res, exp.population.size)  # an impossible request fails now, not after timeout_s
    replay = RayScheduler.build_replay(spec, exp.seed) if spec else None
    context = AgentContext(task=exp.task, replay=replay, seed=exp.seed, own_share=exp.replay.own_share,
                           own_rows=exp.replay.own_rows, inference_search=inference_search(exp))
    return RayScheduler(exp.agent_class, context, workers, res.cpus_per_member, res.gpus_per_member,
                        res.timeout_s, res.max_failures, res.custom_resources, res.placement,
                        fused=_fused_trainer(exp)), context


def _fused_trainer(exp: Experiment) -> FusedTrainer | None:
    """resources.fused: the agent class's fused trainer (either backend; docs/fused.md), else None."""
    if not exp.resources.fused:
        return None
    from evo.fused.run import fused_trainer_for

    return fused_trainer_for(exp.agent_class, exp.resources.fused_compile)


def evolve(exp: Experiment, store: RunStore, scheduler: Scheduler, context: AgentContext,
           generations: int | None = None, observer: RunObserver | None = None) -> None:
    """Run (or continue) the generation loop until `generations` are complete (or
    `population.budget` is spent); `population.mode = "async"` runs `evo.steady.evolve_async`."""
    if exp.population.mode == "async":
        from evo.steady import evolve_async

        return evolve_async(exp, store, scheduler, context, generations, observer)
    from evo.steady import rebuild_lines, secondary_value

    observer = observer or RunObserver()
    total = generations or exp.population.generations
    start = store.last_completed_generation() + 1
    if start == 0 and not store.population(0):
        members = initial_population(exp, context)
        store.save_initial_population([(m.record, m.agent.get_state()) for m in members])
    else:
        members = [Member(rec, exp.agent_class.from_state(state, context)) for rec, state in store.load_population(start)]
        if start > 0 and context.replay is not None:
            store.restore_replay(context.replay, start - 1)
    # each member's line store by index (replay.own_rows = "line"), None when the run keeps none
    line_stores = (store.load_lines(start - 1) if start > 0 else {}) if context.own_rows == "line" else None
    # each member's (compute, score) line and founder; what rounds of hyperparameters gained
    lines, founders, observations = rebuild_lines(store, exp)
    spent, budget = store.spent(), exp.population.budget
    store.set(status="running", generations_planned=total)
    for generation in range(start, total):
        interrupts.check()
        if budget is not None and spent.get(budget.unit) >= budget.amount:
            break
        if generation == start and reached_stop_score(store, exp, generation - 1):  # resumed after it did
            break
        t0 = time.perf_counter()
        observer.generation_started(generation, [m.index for m in members])
        # the generation before, as the run store has it: a resumed run rests and orders as the interrupted one would
        before = store.evaluations(generation - 1) if generation > 0 else []
        resting = resting_member(before, members, exp.selection.rest_from) if exp.selection.rest_elite else None
        steps = [0 if m.index == resting else exp.population.steps_per_generation for m in members]
        results = scheduler.run_generation([m.agent for m in members], steps, observer, generation=generation,
                                           expected_s=expected_seconds(before, members, steps),
                                           **({"lines": line_stores} if line_stores is not None else {}))
        record_failures(store, generation, results)  # all failed: GenerationFailed, the run stops
        evaluated, scores = [], []
        for member, result in zip(members, results):
            member.agent = result.agent
            member.record.history.append(float(result.evaluation.fitness))
            member.record.arch, member.record.hparams = dict(result.agent.arch), dict(result.agent.hparams)
            score = fitness_score(member.record.history, exp.selection.fitness_window)
            scores.append(score)
            line = lines.setdefault(member.index, [])
            before = line[-1].compute if line else Compute()
            rested = member.index == resting
            after = before + Compute(0.0, 0.0, result.wall_s) if result.failed or rested else \
                round_compute(before, exp.population.steps_per_generation, result.train_metrics, result.wall_s)
            spent = spent + (after - before)
            train_metrics = {**result.train_metrics, "rested": 1.0} if rested else result.train_metrics
            if not result.failed:
                if line and not rested:  # a resting round changed no hyperparameter's outcome: not a PB2 observation
                    observations.append((dict(member.record.hparams), generation, score - line[-1].score))
                line.append(LinePoint(after, score, secondary_value(exp.selection.secondary, result.evaluation.metrics,
                                                                    result.train_metrics)))
            evaluated.append(EvaluatedMember(member.record, float(result.evaluation.fitness), score,
                                             dict(result.evaluation.metrics), train_metrics,
                                             member.agent.get_state(), result.wall_s, compute=after))
        # of the members that trained (a failed one holds its start state)
        diversity = measure_diversity({ev.record.index: ev.state for ev, r in zip(evaluated, results) if not r.failed})
        children = next_generation(members, scores, generation + 1, exp, eligible=[not r.failed for r in results],
                                   lines=lines, founders=founders, observations=observations)
        if context.replay is not None:
            store.snapshot_replay(context.replay, generation)
        if line_stores is not None:
            line_stores = inherited_lines(line_stores, members, results, children)
            store.save_lines(generation, line_stores)
        store.commit_generation(generation, evaluated, [(c.record, c.agent.get_state()) for c in children],
                                time.perf_counter() - t0, diversity=diversity, spent=spent)
        observer.generation_done(generation, store.evaluations(generation))
        members = children
        if reached_stop_score(store, exp, generation):
            break
    store.set(status="completed")


def expected_seconds(before: list[dict[str, Any]], members: list[Member], steps: Sequence[int]) -> list[float | None]:
    """How long each member's round is expected to take, for the scheduler's dispatch order (longest
    first, `evo.scheduler.base.dispatch_order`): 0 for a member given no steps (it only evaluates); else
    the seconds of its own round in the generation before (`before`: its evaluations, [] in generation
    0) if it trained then, or else its parent's (a clone trains like its parent, give or take its
    mutation); None when neither trained then (generation 0; a member that rested then, whose parent
    did not train then)."""
    rows = {row["index"]: row for row in before}

    def trained(index: int | None) -> float | None:
        row = rows.get(index)
        if row is None or row["wall_s"] is None or not math.isfinite(float(row["fitness"])):
            return None  # not in that generation, or failed
        return None if row["train_metrics"].get("rested") else float(row["wall_s"])

    out: list[float | None] = []
    for member, count in zip(members, steps):
        own = trained(member.index)
        out.append(0.0 if count == 0 else own if own is not None else trained(member.record.parent))
    return out


def resting_member(before: list[dict[str, Any]], members: list[Member], rest_from: float | None = None) -> int | None:
    """`selection.rest_elite`: the index of the member that rests this generation — of the members of
    the generation before (`before`: its evaluations, [] in generation 0) still in the population
    (survivors in their own slots), the one whose last evaluation was highest (ties: the lowest index);
    None in generation 0, when none survived, or when none evaluated at `rest_from` or above
    (`selection.rest_from`). Its fitness, not its score: what rests is the state that evaluation
    measured, where a score over a fitness window also averages earlier states' (a member that just
    reached 500 from 12 scores 256)."""
    present = {m.index for m in members}
    floor = -math.inf if rest_from is None else rest_from
    rows = [row for row in before if row["index"] in present and math.isfinite(float(row["fitness"]))
            and float(row["fitness"]) >= floor]
    return min(rows, key=lambda row: (-float(row["fitness"]), row["index"]))["index"] if rows else None


def inherited_lines(line_stores: dict[int, Any], members: list[Member], results: list[MemberResult],
                    children: list[Member]) -> dict[int, Any]:
    """The line stores the next generation starts from: a member that trained keeps the one its view
    handed back (a failed one, the one it started with), and a clone takes a copy of its parent's —
    the same arrays, as every view restores its own store from them."""
    after = dict(line_stores)
    for member, result in zip(members, results):
        if not result.failed and result.line is not None:
            after[member.index] = result.line
    out = {}
    for child in children:
        source = child.index if child.index in after else child.record.parent
        if source is not None and source in after:
            out[child.index] = after[source]
    return out


def reached_stop_score(store: RunStore, exp: Experiment, generation: int) -> bool:
    """True once a member's score in `generation` has reached `population.stop_at_score`; the first
    time, the run key `stopped_at_score` records who and when (sync: the run ends after that
    generation; async, evo.steady: no new round starts)."""
    target = exp.stop_score
    rows = store.evaluations(generation) if target is not None and generation >= 0 else []
    if not rows or not rows[0]["score"] >= target:  # best score first
        return False
    if not store.get("stopped_at_score"):
        store.set(stopped_at_score=stop_record(generation, rows[0]["index"], rows[0]["score"], target))
    return True


def stop_record(generation: int | None, member: int, score: float, target: float) -> str:
    """The run key `stopped_at_score` (sync and async runs alike; evo.api.stop_reason words it)."""
    return json.dumps({"generation": generation, "member": member, "score": score, "target": target})


def record_failures(store: RunStore, generation: int, results: list[MemberResult]) -> list[Failure]:
    """Write every failed attempt of the generation to the run store (retried ones too); raise
    `GenerationFailed` if no member came through."""
    events = [f for r in results for f in [*r.retries, *([r.failure] if r.failure else [])]]
    if events:
        store.record_failures(events)
    failed = [r.failure for r in results if r.failure is not None]
    if results and len(failed) == len(results):
        raise GenerationFailed(generation, failed)
    return failed
