"""Asynchronous evolution (`population.mode = "async"`): no generation barrier, no idle worker.

The population is `population.size` *slots*. A slot's member trains one **round** at a time
(`population.steps_per_generation` steps, then an evaluation). The moment a round ends, the
member is scored and judged at once, against the latest scores of the others:

* a tournament of `selection.tournament_size` entrants: the member that just finished and
  others drawn at random among the slots whose member has been evaluated (and did not fail);
* every entrant is judged by its *line's* score at one common level of compute
  (`selection.equal_compute`, env steps unless set; `evo.compute.scores_at_equal_compute`): a
  member that finishes rounds fast is compared with the others at the steps they reached, never
  with their older, shorter-trained scores, which is the steady-state bias toward fast members
  (a round is a fixed number of steps, so a fast member finishes more rounds, not cheaper ones);
* ties go to `selection.secondary`, then to the seeded generator (`evo.selection.pick_best`);
* if the finisher wins, it continues into its next round unmutated; otherwise its slot gets a
  mutated clone of the winner (the winner's latest trained state, and its line), which starts at
  the winner's round: a round counts training, so a clone of a member 5 rounds in starts round 5;
* `selection.keep_unbeaten`: the finisher continues unless the winner scores more than
  `selection.tie_tolerance` above it (a tie, at a floor score say, overwrites nobody);
* `selection.founder_lines`: a member whose founder's line would leave the population, while no
  more than that many lines are alive, continues instead;
* `selection.champion`: the best state evaluated so far is kept out of training and drawn like one
  more rival; drawn, and more than `tie_tolerance` above the winner's latest score, its mutated
  clone takes the slot, starting the round after its evaluation (every slot keeps training, so
  without it a peak a population trains itself away from is lost). With
  `selection.champion_margin` it is drawn only while every member's latest score is more than the
  margin below it: after a fall, not whenever a luckier old evaluation is ahead of the members;

A slot that fails gets a clone of a tournament winner among the others (or, when none has been
evaluated yet, its member is tried again, `resources.max_failures` times).

**Generations in the run store.** A round is the run store's generation: a member's evaluation
after its r-th round of training (counting its ancestors' rounds) is the row of generation r, so
the rows of one generation compare members at equal steps. Generation g is *completed* (a
`generations` row: its best, the diversity of the members then in the slots; the leaderboard and
`evo runs` read it) once every slot has passed round g. A slot can go back to an earlier round
(its clone's winner was behind): its later evaluation at a completed generation is still recorded
there. The run stops after `population.size × population.generations` member-rounds (the same
training as a synchronous run), or when `population.budget` is spent, whichever comes first;
rounds in flight then finish.

**Durability.** Each round commits in one SQLite transaction (`RunStore.commit_round`): the
evaluation, the line's compute, the slot's next member and its start state. A crash loses only the
rounds in flight; `evo resume` restarts them from their start states. On the inline backend the
order of rounds is fixed (the slot with the fewest rounds first), so a run, and a run resumed
after a crash, are reproducible; on Ray the order is the order results arrive.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from evo import interrupts
from evo.agent import AgentContext, clone_tree
from evo.compute import Compute, LinePoint, round_compute, scores_at_equal_compute
from evo.diversity import measure_diversity
from evo.faults import GenerationFailed
from evo.mutation import apply_mutation
from evo.observer import RunObserver
from evo.rng import child_seed
from evo.runstore import EvaluatedMember, MemberRecord, RunStore
from evo.scheduler.base import MemberResult
from evo.selection import fitness_score, pick_best
from evo.spec import Experiment

__all__ = ["evolve_async", "decision_rng", "rebuild_lines", "rung_value", "secondary_value"]

_TAG = 0xA5EC


def decision_rng(seed: int, index: int, round_: int) -> np.random.Generator:
    """The stream for judging member `index` after round `round_` (and mutating its replacement)."""
    return np.random.default_rng(np.random.SeedSequence([seed, index, round_, _TAG]))


def secondary_value(name: str | None, evaluation_metrics: dict, train_metrics: dict) -> float:
    """`selection.secondary`'s value: the evaluation's metric, else the training metric, else NaN."""
    if name is None:
        return math.nan
    for source in (evaluation_metrics, train_metrics):
        value = source.get(name)
        if isinstance(value, (int, float)):
            return float(value)
    return math.nan


def rebuild_lines(store: RunStore, exp: Experiment) -> tuple[dict[int, list[LinePoint]], dict[int, int], list]:
    """Every member's line (its ancestors' evaluations before its birth, then its own), founder, and
    the run's observations for the model-guided mutation ((hyperparameters, round, score gain over
    the round) of every evaluation that follows another on its line), from the run store: a resumed
    run judges and mutates as the uninterrupted one did."""
    full, founders, observations = _labelled_lines(store, exp)
    return _unlabelled(full), founders, observations


def _unlabelled(full: dict[int, list[tuple[int, LinePoint]]]) -> dict[int, list[LinePoint]]:
    """Lines without their points' generations."""
    return {i: [p for _, p in points] for i, points in full.items()}


def _labelled_lines(store: RunStore, exp: Experiment) -> tuple[dict[int, list[tuple[int, LinePoint]]], dict[int, int], list]:
    """`rebuild_lines`, each point with the generation (round) of its evaluation."""
    members = {m["index"]: m for m in store.all_members()}
    compute = store.compute()
    steps = exp.population.steps_per_generation
    own: dict[int, list[tuple[int, LinePoint]]] = {i: [] for i in members}
    hparams: dict[tuple[int, int], dict] = {}
    for ev in sorted(store.all_evaluations(), key=lambda e: e["generation"]):
        g = ev["generation"]
        c = compute.get((g, ev["index"]), Compute((g + 1) * steps, (g + 1) * steps, 0.0))
        sec = secondary_value(exp.selection.secondary, ev["metrics"], ev["train_metrics"])
        own.setdefault(ev["index"], []).append((g, LinePoint(c, float(ev["score"]), sec)))
        hparams[(g, ev["index"])] = ev["hparams"]
    full: dict[int, list[tuple[int, LinePoint]]] = {}
    founders: dict[int, int] = {}

    def line(i: int) -> list[tuple[int, LinePoint]]:
        if i not in full:
            parent = members[i]["parent"]
            if parent is None or parent not in members:
                founders[i], inherited = i, []
            else:  # the parent's line up to the round the child was cloned at
                inherited = [(g, p) for g, p in line(parent) if g < members[i]["born"]]
                founders[i] = founders[parent]
            full[i] = inherited + own.get(i, [])
        return full[i]

    for i in sorted(members):
        line(i)
    observations = []
    for i, points in full.items():
        mine = {g for g, _ in own.get(i, [])}
        for (_, before), (g, after) in zip(points, points[1:]):
            if g in mine:
                observations.append((g, i, (hparams[(g, i)], g, after.score - before.score)))
    observations = [o for _, _, o in sorted(observations, key=lambda t: (t[0], t[1]))]
    return full, founders, observations


@dataclass
class _Champion:
    """The best state the run has evaluated (`selection.champion`), kept out of training."""
    score: float
    generation: int      # its evaluation's round: a clone of it starts at round generation + 1
    index: int           # its member
    state: dict
    line: list[LinePoint]  # its member's line up to and including this evaluation

    def beats(self, score: float, generation: int, index: int) -> bool:
        """Is it ahead of an evaluation (score, generation, index)? The order of `RunStore.trained_checkpoint(best=True)`:
        score, then the later generation, then the higher index, so a resumed run finds the same champion."""
        return (self.score, self.generation, self.index) > (score, generation, index)


class _Hall:
    """`selection.champion`: the champion so far, and how an agent is rebuilt from its state."""

    def __init__(self, best: _Champion | None, make_agent: Callable[[dict], Any]) -> None:
        self.best, self.make_agent = best, make_agent

    def offer(self, score: float, generation: int, index: int, state: dict, line: list[LinePoint]) -> None:
        """A fresh evaluation: it becomes the champion if it is ahead (`_Champion.beats`)."""
        if self.best is None or not self.best.beats(score, generation, index):
            self.best = _Champion(score, generation, index, state, list(line))


#: the champion as a tournament entrant (it has no slot)
_CHAMPION = object()


def champion_called(champion_score: float, latest: list[float], margin: float | None) -> bool:
    """Does the champion enter tournaments now (`selection.champion_margin`)? Always without a margin;
    with one, only while every member's latest score (`latest`) is more than `margin` below it. The
    champion is the highest of many noisy evaluations, so without the gate it keeps pulling slots back
    to an old state whenever its luck is ahead of the members' latest scores."""
    return margin is None or all(score < champion_score - margin for score in latest)


def _champion_from_store(store: RunStore, labelled: dict[int, list[tuple[int, LinePoint]]]) -> _Champion | None:
    """The champion of a resumed run: its best kept trained checkpoint (the run store keeps it);
    `labelled`: the run's lines (`_labelled_lines`)."""
    from evo.checkpoint import load_state
    from evo.runstore import RunStoreError

    try:
        row, path, digest = store.trained_checkpoint(best=True)
    except RunStoreError:  # nothing evaluated yet
        return None
    state, _ = load_state(path, expect_digest=digest)
    g, index = int(row["generation"]), int(row["index"])
    return _Champion(float(row["score"]), g, index, state, [p for gen, p in labelled.get(index, []) if gen <= g])


@dataclass
class _Slot:
    slot: int
    record: MemberRecord
    agent: object
    round: int           # the round it trains next (or now)
    start: Compute       # its line's compute at the start of that round
    ok: bool = False     # its member has an evaluation of its own and its last round did not fail
    failures: int = 0
    segment: int = 0     # with rungs: the part of its round it trains next


def evolve_async(exp: Experiment, store: RunStore, scheduler, context: AgentContext,
                 generations: int | None = None, observer: RunObserver | None = None) -> None:
    """Run (or continue) an asynchronous evolution until its budget is spent (module docstring)."""
    from evo.population import initial_population, stop_record

    observer = observer or RunObserver()
    total = generations or exp.population.generations
    size, steps = exp.population.size, exp.population.steps_per_generation
    budget = exp.population.budget
    unit = exp.selection.equal_compute if exp.selection.equal_compute != "none" else "env_steps"
    secondary = exp.selection.secondary
    fresh = not store.slots()
    if fresh:
        founders_ = initial_population(exp, context)
        store.save_initial_slots([(m.record, m.agent.get_state()) for m in founders_])
        slots = [_Slot(i, m.record, m.agent, 0, Compute()) for i, m in enumerate(founders_)]
    labelled, founders, observations = _labelled_lines(store, exp)
    lines = _unlabelled(labelled)
    if not fresh:
        slots = []
        for slot, index, round_ in store.slots():
            rec, state = store.load_start(round_, index)
            agent = exp.agent_class.from_state(state, context)
            line = lines.get(index, [])
            slots.append(_Slot(slot, rec, agent, round_, line[-1].compute if line else Compute(), ok=bool(rec.history)))
        done = store.last_completed_generation()
        if done >= 0 and context.replay is not None:
            store.restore_replay(context.replay, done)
    spent = store.spent()
    rounds_done = int(store.get("rounds_done") or 0)
    next_index = max(founders) + 1
    completed = store.last_completed_generation()
    store.set(status="running", generations_planned=total, mode="async")
    observer.generation_started(completed + 1, [s.record.index for s in slots])
    dispatched, in_flight = rounds_done, set()
    clock = time.perf_counter()
    writer = _Writer(store.path, observer)
    # early stopping inside a round (population.rungs): the round's steps in segments, an evaluation after
    # each; rung records are the fitnesses seen at (round, rung), as ASHA's
    bounds = [round(steps * f) for f in exp.population.rungs] + [steps]
    segment_steps = [b - a for a, b in zip([0, *bounds[:-1]], bounds)]
    rung_records: dict[tuple[int, int], list[float]] = {}
    rung_metric = exp.population.rung_metric
    rung_stats = json.loads(store.get("rung_stats") or '{"stopped": 0, "rungs_passed": 0, "env_steps_saved": 0}')
    hall = None
    if exp.selection.champion:  # the best state so far, out of training (a resumed run's from its store)
        hall = _Hall(_champion_from_store(store, labelled), lambda state: exp.agent_class.from_state(clone_tree(state), context))

    # population.stop_at_score: reached by a round judged before (a resumed run), or by one judged below
    target = exp.stop_score
    reached = [] if target is None else [(p.score, i) for i, line in lines.items() for p in line if p.score >= target]
    stopped = bool(reached)
    if stopped and not store.get("stopped_at_score"):
        score, index = max(reached)
        store.set(stopped_at_score=stop_record(None, index, score, target))

    def exhausted() -> bool:
        if dispatched >= size * total or stopped:
            return True
        return budget is not None and spent.get(budget.unit) >= budget.amount

    def dispatch() -> None:
        nonlocal dispatched
        while len(in_flight) < scheduler.capacity:
            idle = [s for s in slots if s.slot not in in_flight]
            if exhausted():  # no round starts, but one past a rung trains its remaining parts and is judged
                idle = [s for s in idle if s.segment > 0]
            if not idle:
                return
            s = min(idle, key=lambda x: (x.round, x.slot))  # fewest rounds first: no slot runs far ahead
            # a rung judged on a training metric needs no evaluation: only a round's last part has one
            scheduler.submit(s.slot, s.agent, segment_steps[s.segment], s.round, observer,
                             evaluate=rung_metric is None or s.segment == len(segment_steps) - 1)
            in_flight.add(s.slot)
            dispatched += s.segment == 0

    try:
        while True:
            interrupts.check()
            writer.check()
            dispatch()
            if not in_flight:
                break
            for key, result in scheduler.collect(timeout=1.0):
                in_flight.discard(key)
                s = slots[key]
                seg = segment_steps[s.segment]
                stop = False
                if s.segment < len(segment_steps) - 1 and not result.failed:
                    value = rung_value(rung_metric, result)
                    if math.isnan(value):  # nothing to judge on (no training episode ended, say): it goes on
                        rung_stats["unjudged"] = rung_stats.get("unjudged", 0) + 1
                    else:
                        stop = _behind_at_rung(exp, slots, s, value, rung_records, lines, founders)
                    if not stop:  # on to the round's next part: nothing is judged or written yet
                        after = round_compute(s.start, seg, result.train_metrics, result.wall_s)
                        spent, s.start, s.agent = spent + (after - s.start), after, result.agent
                        s.segment += 1
                        rung_stats["rungs_passed"] += 1
                        dispatch()
                        continue
                    rung_stats["stopped"] += 1
                    rung_stats["env_steps_saved"] += steps - sum(segment_steps[:s.segment + 1])
                rounds_done += 1
                commit, cost = _judge(exp, slots, s, result, lines, founders, next_index, seg, unit, secondary,
                                      observations, stopped_at=s.segment if stop else None, hall=hall)
                s.segment = 0
                spent = spent + cost
                ev = commit[0]
                if target is not None and not stopped and ev is not None and ev.score >= target:
                    stopped = True  # rounds in flight finish; none starts
                    note = stop_record(commit[2], ev.record.index, ev.score, target)
                    writer.put(lambda st, n=note: st.set(stopped_at_score=n))
                if commit[1][0].index == next_index:
                    next_index += 1
                dispatch()  # the slot's next round starts before anything is written: no worker waits on the disk
                writer.put(lambda st, c=commit, slot=s.slot, n=rounds_done, sp=spent: st.commit_round(slot, c[0], c[2], c[1],
                                                                                                    sp, n, c[3]))
            # generations every slot has passed are complete
            reached = min(s.round for s in slots)
            if reached - 1 > completed:
                diversity = measure_diversity({s.record.index: s.agent.get_state() for s in slots if s.ok})
                now = time.perf_counter()
                writer.put(lambda st, first=completed + 1, last=reached - 1, d=diversity, w=now - clock:
                           _complete(st, first, last, d, w, observer))
                clock, completed = now, reached - 1
                if context.replay is not None:
                    writer.drain()  # the snapshot follows the rounds it holds
                    store.snapshot_replay(context.replay, completed)
    finally:
        writer.close()
        if exp.population.rungs:
            store.set(rung_stats=json.dumps(rung_stats))
    store.set(status="completed", rounds_done=rounds_done)


def rung_value(metric: str | None, result: MemberResult) -> float:
    """What a rung judges a member on (higher is better): its evaluation's fitness, or with
    `population.rung_metric` that training metric (negated for a leading '-'); NaN where the agent
    did not report a finite value."""
    if metric is None:
        return float(result.evaluation.fitness)
    sign, name = (-1.0, metric[1:]) if metric.startswith("-") else (1.0, metric)
    value = secondary_value(name, {}, result.train_metrics)  # NaN where it is not reported
    return sign * value if math.isfinite(value) else math.nan


def _behind_at_rung(exp: Experiment, slots: list[_Slot], s: _Slot, fitness: float,
                    records: dict[tuple[int, int], list[float]], lines: dict[int, list[LinePoint]],
                    founders: dict[int, int]) -> bool:
    """Record the member's `fitness` at its rung (`rung_value`); True if it is outside the top
    `population.rung_keep` share of the values seen at this (round, rung) — by more than
    `selection.tie_tolerance` — and another member could take its slot (and it is not the last of a
    founder line kept alive)."""
    seen = records.setdefault((s.round, s.segment), [])
    seen.append(fitness)
    rivals = [o for o in slots if o is not s and o.ok and lines.get(o.record.index)]
    if len(seen) < 2 or not rivals:
        return False
    if exp.selection.founder_lines:
        line_of = [founders.get(o.record.index, o.record.index) for o in slots]
        mine = founders.get(s.record.index, s.record.index)
        if line_of.count(mine) == 1 and len(set(line_of)) <= exp.selection.founder_lines:
            return False
    keep = max(1, math.ceil(len(seen) * exp.population.rung_keep))
    cutoff = sorted(seen, reverse=True)[keep - 1]
    return fitness < cutoff - exp.selection.tie_tolerance


def _complete(store: RunStore, first: int, last: int, diversity, wall_s: float, observer: RunObserver) -> None:
    """Mark generations first..last complete (the diversity of the members then in the slots on the last)."""
    for g in range(first, last + 1):
        if store.complete_generation(g, wall_s if g == first else 0.0, diversity if g == last else None):
            observer.generation_done(g, store.evaluations(g))
    store.prune_async()
    observer.generation_started(last + 1, [])


class _Writer:
    """Writes an async run's rounds to its run store in a thread of their own, in order, so the
    driver hands out the next round without waiting on checkpoint files and fsyncs. The thread has
    its own connection (SQLite's are per thread); an error there stops the run at the next check."""

    def __init__(self, path, observer: RunObserver) -> None:
        import queue
        import threading

        self.path, self.error = path, None
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="evo-async-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        store = RunStore(self.path)
        try:
            while True:
                job = self.jobs.get()
                if job is None:
                    return
                if self.error is None:
                    try:
                        job(store)
                    except BaseException as exc:  # reported to the driver by check()
                        self.error = exc
                self.jobs.task_done()
        finally:
            store.close()

    def put(self, job) -> None:
        self.check()
        self.jobs.put(job)

    def drain(self) -> None:
        self.jobs.join()
        self.check()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Write everything queued, then stop; re-raise the thread's error."""
        self.jobs.put(None)
        self.thread.join()
        self.check()


def _judge(exp: Experiment, slots: list[_Slot], s: _Slot, result: MemberResult, lines: dict[int, list[LinePoint]],
           founders: dict[int, int], next_index: int, steps: int, unit: str, secondary: str | None,
           observations: list, stopped_at: int | None = None, hall: _Hall | None = None):
    """Score the round `s` just finished (`steps`: what its last part trained) and decide what the
    slot trains next. A round stopped at rung `stopped_at` is judged without the member itself as
    an entrant: its slot goes to a tournament winner among the others (stopped on a training metric,
    `population.rung_metric`, it has no evaluation: only its compute is counted). With `hall`
    (`selection.champion`) the champion is drawn like one more rival; drawn, it wins when its score is
    more than `selection.tie_tolerance` above the tournament winner's latest (its score is its state's,
    so it is not judged at equal compute: the question is which state to train on from here).
    Returns ((evaluation or None, (successor record, its start round, its start state), the round,
    failures), the compute spent)."""
    rec, round_ = s.record, s.round
    failures = [*result.retries, *([result.failure] if result.failure else [])]
    rng = decision_rng(exp.seed, rec.index, round_)
    if result.failed:
        cost = Compute(0.0, 0.0, result.wall_s)
        ev = None
        s.ok = False
        s.failures += 1
    elif result.evaluation is None:  # stopped at a rung judged on a training metric: trained, not evaluated
        s.agent = result.agent
        cost = round_compute(s.start, steps, result.train_metrics, result.wall_s) - s.start
        ev = None
    else:
        s.agent = result.agent
        rec.history.append(float(result.evaluation.fitness))
        rec.arch, rec.hparams = dict(result.agent.arch), dict(result.agent.hparams)
        score = fitness_score(rec.history, exp.selection.fitness_window)
        after = round_compute(s.start, steps, result.train_metrics, result.wall_s)
        cost = after - s.start
        sec = secondary_value(secondary, result.evaluation.metrics, result.train_metrics)
        line = lines.setdefault(rec.index, [])
        if line:  # what this round of these hyperparameters gained: the model-guided mutation learns from it
            observations.append((dict(rec.hparams), round_, score - line[-1].score))
        line.append(LinePoint(after, score, sec))
        state = clone_tree(s.agent.get_state())  # the writer's copy (and the champion's): the member trains on
        if hall is not None:
            hall.offer(score, round_, rec.index, state, line)
        metrics = dict(result.evaluation.metrics)
        if stopped_at is not None:  # the leaderboard and dashboard show the round was cut short
            metrics["stopped_at_rung"] = float(stopped_at)
        ev = EvaluatedMember(_frozen(rec), float(result.evaluation.fitness), score, metrics,
                             result.train_metrics, state, result.wall_s, compute=after)
        s.start, s.ok, s.failures = after, True, 0
    judged = [o for o in slots if o.ok and lines.get(o.record.index)]  # the finisher too: its line has this round
    rivals = [o for o in judged if o is not s]
    k = exp.selection.tournament_size
    winner, why = None, "no rival yet"
    champion = hall.best if hall is not None else None
    if champion is not None and not champion_called(champion.score, [lines[o.record.index][-1].score for o in judged],
                                                    exp.selection.champion_margin):
        champion = None  # the population has not fallen from the peak: it trains on from where it is
    if rivals:
        enters = s.ok and stopped_at is None
        pool = rivals + ([_CHAMPION] if champion is not None else [])
        drawn = [pool[int(i)] for i in rng.choice(len(pool), size=min(len(pool), k - 1 if enters else k),
                                                  replace=False)] if (k > 1 or not enters) else []
        entrants = ([s] if enters else []) + [d for d in drawn if d is not _CHAMPION]
        if entrants:
            points, _ = scores_at_equal_compute([lines[e.record.index] for e in entrants], unit)
            best, why = pick_best([p.score for p in points], rng, [p.secondary for p in points],
                                  exp.selection.tie_tolerance, secondary or "secondary")
            winner = entrants[best]
            if (exp.selection.keep_unbeaten and enters and best != 0
                    and not points[best].score > points[0].score + exp.selection.tie_tolerance):
                winner, why = s, "unbeaten"  # a tie does not overwrite the finisher (selection.keep_unbeaten)
        if _CHAMPION in drawn and (winner is None or champion.score > lines[winner.record.index][-1].score
                                   + exp.selection.tie_tolerance):
            winner, why = _CHAMPION, "champion"
    # the winner has trained fewer rounds: no going back (clone_behind; the champion is always behind)
    if (winner is not None and winner is not s and winner is not _CHAMPION and s.ok and stopped_at is None
            and not exp.selection.clone_behind and winner.round < round_ + 1):
        winner, why = s, "winner behind"
    lines_alive = {founders.get(o.record.index, o.record.index) for o in slots}
    mine = founders.get(rec.index, rec.index)
    if (winner is not None and winner is not s and s.ok and exp.selection.founder_lines > 0
            and sum(1 for o in slots if founders.get(o.record.index, o.record.index) == mine) == 1
            and len(lines_alive) <= exp.selection.founder_lines):
        winner, why = s, "founder line kept"
    if winner is None or winner is s:
        if s.ok:  # it continues into its next round
            s.round += 1
            state = ev.state if ev is not None else clone_tree(s.agent.get_state())
            return (ev, (_frozen(rec), s.round, state), round_, failures), cost
        if s.failures > exp.resources.max_failures + 1:  # failed, and nobody to take over from
            raise GenerationFailed(round_, [result.failure] if result.failure else [])
        return (ev, (_frozen(rec), s.round, clone_tree(s.agent.get_state())), round_, failures), cost  # tried again
    if winner is _CHAMPION:  # its state trained through round `generation`
        start_round, parent_index, parent_line = champion.generation + 1, champion.index, champion.line
        parent_agent, start = hall.make_agent(champion.state), champion.line[-1].compute
    else:
        # the rounds its trained state holds; the compute it embodies: a parent past a rung has trained
        # part of a round more than its line's last point, and `spent` already counts that part (the
        # clone's first round must not)
        start_round, parent_index, parent_line = winner.round, winner.record.index, lines[winner.record.index]
        parent_agent, start = winner.agent, winner.start
    child = parent_agent.clone(next_index, seed=child_seed(exp.seed, next_index, start_round))
    mutation = apply_mutation(child, exp.mutation, exp.hparam_space, rng, observations, start_round)
    mutation = replace(mutation, details={**mutation.details, "selected_by": why, "slot": s.slot,
                                          "replaced": rec.index,
                                          **({"replaced_at_rung": stopped_at} if stopped_at is not None else {})})
    new = MemberRecord(next_index, parent_index, start_round, mutation.to_json(), dict(child.arch),
                       dict(child.hparams), [])
    lines[next_index] = list(parent_line)
    founders[next_index] = founders.get(parent_index, parent_index)
    s.record, s.agent, s.round, s.ok, s.failures = new, child, start_round, False, 0
    s.start = start
    return (ev, (_frozen(new), start_round, clone_tree(child.get_state())), round_, failures), cost


def _frozen(rec: MemberRecord) -> MemberRecord:
    """A copy of `rec` as it is now, for the writer thread (the slot's record keeps changing; states
    handed to the writer are copied likewise: inline, a member trains in place)."""
    import copy

    return copy.deepcopy(rec)
