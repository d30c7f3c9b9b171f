"""evo itself: tournament selection, mutations and the shared replay store, on the Ray backend.

The run is an ordinary evo run (RunStore in a temporary directory, `start_backend`, `evolve`) of
the task's experiment file with the benchmark's seed, budget and sampled founders. A curve point
is taken when each generation is committed: the best fitness of the generation (each member's
fitness is its own 10-episode evaluation), the steps trained so far and the seconds since `evolve`
began (checkpointing, replay snapshots and selection included).
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from benchmarks.hpo.common import Task, load, search_space
from evo.observer import RunObserver


class CurveObserver(RunObserver):
    """Steps are counted from members' rounds as they end ("done" events: the steps each trained),
    so a point says what the run had trained by then, in sync and async runs alike (an async
    generation completes while later rounds are already done). With rungs a round ends in parts,
    each a "done" event; only the parts with an evaluation (a fitness) count as rounds."""

    def __init__(self, steps_per_generation: int, on_point: Callable[[list], None] | None = None,
                 population: int | None = None, budget: int | None = None) -> None:
        """`population`: an async run's size: a point is taken every `population` evaluated rounds
        (the best fitness of the last `population`), since its generations complete behind its rounds.
        `budget` (an async run whose rounds end early, stopped at rungs): a point after every
        evaluated round, none past this many steps (the run finishes its rounds in flight once the
        budget is spent; what they train past it is not credited). In a sync run: no point for a
        generation that took the steps trained past it (one that rests from a late generation on)."""
        self.steps_per_generation = steps_per_generation
        self.on_point = on_point
        self.population = population
        self.budget = budget
        self.recent: list[float] = []
        self.start = time.perf_counter()
        self.steps = 0
        self.trained = 0  # steps of every "done" event so far
        self.rounds_done = 0
        self.curve: list[list[float]] = []
        self.profile: list[dict[str, Any]] = []
        self._t_gen = self.start

    def carry_on(self, curve: list[list[float]]) -> None:
        """Continue `curve` (a run resumed from its store): steps, rounds and clock go on from its last point."""
        self.curve = [list(p) for p in curve]
        if curve:
            self.steps = self.trained = int(curve[-1][0])
            self.rounds_done = self.steps // self.steps_per_generation
            self.start -= curve[-1][1]

    def generation_started(self, generation: int, indices: list[int]) -> None:
        self._t_gen = time.perf_counter()

    def member_event(self, index: int, event: str, details: dict[str, Any]) -> None:
        if event != "done":
            return
        self.trained += int(details.get("steps", self.steps_per_generation))
        if "fitness" not in details:  # a part of a round before a rung judged on a training metric
            return
        self.rounds_done += 1
        if self.population:
            self.recent = [*self.recent, float(details["fitness"])][-self.population:]
            if self.budget is not None or self.rounds_done % self.population == 0:
                self.async_point()

    def async_point(self) -> None:
        """A point of an async run: the steps trained so far, the best of its last `population` rounds."""
        if not self.recent or (self.budget is not None and self.trained > self.budget):
            return
        now = time.perf_counter()
        self.steps = self.trained
        self.curve.append([self.steps, round(now - self.start, 2), max(self.recent)])
        print(f"evo-async rounds {self.rounds_done}: steps {self.steps} t {now - self.start:.0f}s "
              f"best {max(self.recent):.1f}", flush=True)
        if self.on_point is not None:
            self.on_point(self.curve)

    def generation_done(self, generation: int, board: list[dict[str, Any]]) -> None:
        now = time.perf_counter()
        if not board:
            return
        best = max(float(row["fitness"]) for row in board)
        past_budget = self.budget is not None and self.trained > self.budget
        sync_point = not self.population and not past_budget  # sync: a point per generation within the budget
        if sync_point:
            self.steps = self.trained
            self.curve.append([self.steps, round(now - self.start, 2), best])
        self.profile.append({
            "generation": generation, "wall_s": round(now - self._t_gen, 2),
            # member-side seconds, summed over members (they run 2 at a time on the Ray workers)
            "train_s": round(sum(float(r["train_metrics"].get("train_seconds", 0.0)) for r in board), 2),
            "eval_s": round(sum(float(r["metrics"].get("eval_seconds", 0.0)) for r in board), 2),
            "member_wall_s": round(sum(float(r["wall_s"] or 0.0) for r in board), 2),
            "updates": [int(r["metrics"].get("updates", 0)) for r in board],
            "fitness": [float(r["fitness"]) for r in board],
        })
        print(f"evo gen {generation}: steps {self.trained} t {now - self.start:.0f}s best {best:.1f}"
              + (" (past the budget: no curve point)" if past_budget else ""), flush=True)
        if sync_point and self.on_point is not None:
            self.on_point(self.curve)


# the `evo-nomut` ablation: every child is its parent's copy (no architecture, weight, activation or
# hyperparameter change), so the population moves only by selection over the founders
NO_MUTATION = {"mutation.no_mutation": 1.0, "mutation.architecture": 0.0, "mutation.parameters": 0.0,
               "mutation.activation": 0.0, "mutation.rl_hp": 0.0}

# `evo-async`: asynchronous evolution (evo/steady.py) judged at equal env steps, ties broken by the
# training return, two founders' lines kept
ASYNC = {"population.mode": "async", "selection.equal_compute": "env_steps",
         "selection.secondary": "train_episode_return", "selection.founder_lines": 2}

# `evo-seconds`: evo (sync) with every tournament judged at equal member-seconds (evo/compute.py), so
# selection cannot favour members that buy their score with more updates per env step
EQUAL_SECONDS = {"selection.equal_compute": "member_seconds"}

# `evo-noarch`: evo (sync) with no architecture mutation (its share goes to "no mutation"; the other
# kinds keep theirs), to measure what growing members costs in CPU per env step and what it buys
NO_ARCHITECTURE = {"mutation.architecture": 0.0, "mutation.no_mutation": 0.6}

# `evo-unbeaten`: evo (sync) where a member keeps its slot unless its tournament's winner beats it
# (selection.keep_unbeaten), so founders tied at the floor are not overwritten by coin toss
KEEP_UNBEATEN = {"selection.keep_unbeaten": True}

# `evo-rungs`: evo-async with early stopping inside rounds, judged on the training return (no
# evaluation at a rung: population.rung_metric), and the task's env-step budget as the run's budget,
# so the steps stopped rounds did not train go to more rounds
RUNGS = {**ASYNC, "population.rungs": [0.25, 0.5], "population.rung_metric": "train_episode_return"}

# `evo-rungs-eval`: evo-rungs whose rungs are judged on an evaluation (no population.rung_metric), for agents
# that report no training return: ILQL trains offline on randomwalks, where every rung of evo-rungs would be
# unjudged. A rung then costs an evaluation, and the updates of stopped rounds still go to more rounds
RUNGS_EVAL = {**ASYNC, "population.rungs": [0.25, 0.5]}

# `evo-champion-eval`: evo-rungs-eval with the run's best state kept out of training (selection.champion): the
# async counterpart of a resting elite, which on randomwalks-sparse kept sync evo's finals from falling back
CHAMPION_EVAL = {**RUNGS_EVAL, "selection.champion": True}

# `evo-champion`: evo-rungs with the run's best state kept out of training and drawn into tournaments
# (selection.champion), so a population whose members collapse after a peak trains on from the peak
CHAMPION = {**RUNGS, "selection.champion": True}

# `evo-fallback`: evo-champion with the champion called back only after a fall: it enters tournaments
# only while every member's latest score is more than a fifth of the task's target below it
# (selection.champion_margin), so the luckiest old evaluation does not keep pulling slots back to it.
# A value that is a function of the task is resolved by `settings`.
FALLBACK = {**CHAMPION, "selection.champion_margin": lambda t: 0.2 * t.target}

# `evo-noselect`: evo (sync) with selection and mutation switched off: every member keeps its slot,
# unmutated (keep_unbeaten with a tie tolerance no score difference reaches), so the four founders train
# side by side for the whole budget and their only link is the run's shared replay store. Random search
# trains the same founders with a store each: the two differ in the sharing of data (and their schedulers)
NO_SELECTION = {**NO_MUTATION, **KEEP_UNBEATEN, "selection.tie_tolerance": 1e12}

# `evo-margin`: evo (sync) where a member is replaced only by a tournament winner more than a tenth of
# the task's target above it (keep_unbeaten with that tie tolerance: ~the standard error of CartPole's
# 10-episode mean), so selection waits until scores separate from the evaluation's noise
MARGIN = {**KEEP_UNBEATEN, "selection.tie_tolerance": lambda t: 0.1 * t.target}

# `evo-own`: evo-margin with half of every batch a member draws taken from its own rows of the
# generation (replay.own_share), once it holds a batch's worth: each member still reads the others'
# data, but no longer three parts in four of it (with 4 members, in proportion to the rows)
OWN_DATA = {**MARGIN, "replay.own_share": 0.5}

# `evo-lines`: evo-own with two founders' lines kept to the end (selection.founder_lines): the first
# generations' scores (9 against 200) say little about which founder ends best, so the best line
# takes slots but never all four, and the runner-up line trains on as random search's lines do
TWO_LINES = {**OWN_DATA, "selection.founder_lines": 2}

# `evo-explore`: evo-own where the lowest-scoring member's slot takes a new child every generation
# (selection.replace_worst), margin or not: once evo-own's four members sit within the margin of each
# other nobody is replaced and nothing is mutated again, so a stalled line stays stalled
EXPLORE = {**OWN_DATA, "selection.replace_worst": 1}

# `evo-lines-explore`: both of the above: two founders' lines kept to the end, and the lowest-scoring
# member's slot given a new child every generation, so neither the leader's early lead nor a population
# sitting within the margin stops the search
LINES_EXPLORE = {**TWO_LINES, "selection.replace_worst": 1}

# `evo-truncate`: PBT's exploit rule inside evo (selection.truncation = 1: truncation selection at a quarter
# of a population of 4): every generation the lowest-scoring member's slot takes a mutated clone of the
# best and every other member trains on, whatever the gap. Plain evo instead overwrites every non-elite
# slot with a tournament winner's clone; evo-margin and its kin keep members within the margin, so some
# of their generations change nothing
TRUNCATE = {"selection.truncation": 1}

# `evo-truncate-hp`: evo-truncate whose children change every mutable hyperparameter (each grown ×1.2 or
# shrunk ×0.8, evo's rl_hp mutation with a count above any search space's size) and nothing else: PBT's
# explore without its resampling. evo's own mix makes 40% of children plain copies, changes one
# hyperparameter of seven in 20%, and in 40% changes the network (a layer, noise on the weights, the
# activation), where PBT perturbs every hyperparameter of every child
TRUNCATE_HP = {**TRUNCATE, "mutation.no_mutation": 0.0, "mutation.architecture": 0.0, "mutation.parameters": 0.0,
               "mutation.activation": 0.0, "mutation.rl_hp": 1.0, "mutation.rl_hp_count": 100}

# `evo-truncate-hp3`: evo-truncate-hp with three hyperparameters of each child changed, not all: the step
# between evo's one (too little on randomwalks-sparse) and PBT's all (too much on CartPole's twelve)
TRUNCATE_HP3 = {**TRUNCATE_HP, "mutation.rl_hp_count": 3}

# `evo-truncate-hp-own`: evo-truncate-hp with half of every batch a member draws from its own rows of the
# generation (replay.own_share = 0.5, as evo-own). PBT's trials each keep a store of their own; on CartPole
# own_share is what took evo-margin's final level with the peers. A task whose members insert nothing (ILQL
# trains offline on randomwalks) has no own rows, so there it changes nothing
TRUNCATE_HP_OWN = {**TRUNCATE_HP, "replay.own_share": 0.5}

# `evo-truncate-hp3-own`: evo-truncate-hp-own with three hyperparameters of each child changed, not all (as
# evo-truncate-hp3): own data with the smaller step
TRUNCATE_HP3_OWN = {**TRUNCATE_HP_OWN, "mutation.rl_hp_count": 3}

# `evo-truncate-hp-line`: evo-truncate-hp where every batch a member draws comes from its line store
# (replay.own_rows = "line", own_share = 1, once it holds a batch's worth): every row its line inserted,
# kept across generations and copied to a clone, as each PBT trial keeps a store of its own and copies
# its parent's on exploit. evo-truncate-hp-own reached CartPole's target as often as the peers but held it
# less often; this tells whether the others' data is why
TRUNCATE_HP_LINE = {**TRUNCATE_HP, "replay.own_share": 1.0, "replay.own_rows": "line"}

# `evo-truncate-hp-own-line`: evo-truncate-hp-own whose own half of each batch comes from the member's line
# store, not from its rows of this generation: the other half is still every member's data
TRUNCATE_HP_OWN_LINE = {**TRUNCATE_HP_OWN, "replay.own_rows": "line"}

# `evo-truncate-hp-own-rest`: evo-truncate-hp-own whose best member rests (selection.rest_elite): each
# generation the survivor with the best last evaluation is evaluated, not trained, while its clone and the
# others train on.
# evo-truncate-hp-own reached CartPole's target on 11 seeds of 12 but ended there on 5: training on past
# the target lost it. A resting round trains nothing, so the run has more generations, never past the budget
TRUNCATE_HP_OWN_REST = {**TRUNCATE_HP_OWN, "selection.rest_elite": True}

# `evo-truncate-hp-own-rest-best`: evo-truncate-hp-own-rest whose best member rests only once it has evaluated at
# the task's best possible fitness (selection.rest_from; CartPole-v1: 500). Resting from generation 1 kept every
# CartPole run that reached 475 there, but cost finding: a generation trains 3 members where 4 trained, and
# the rest reached 475 on 9 seeds of 12 where evo-truncate-hp-own did on 11. Until a member is perfect this run
# is evo-truncate-hp-own's, step for step; from then on nothing can beat the resting member, only equal it
TRUNCATE_HP_OWN_REST_BEST = {**TRUNCATE_HP_OWN_REST, "selection.rest_from": lambda t: t.best_possible}

# `evo-truncate-hp-own-rest-shared`: evo-truncate-hp-own-rest with every member of a generation in flight at
# once, four actors of half a CPU on the two cores, instead of two actors of one CPU each. A resting
# generation trains three members: two actors run them in two waves, one actor idle in the second (~2T
# for three rounds of T seconds), where three processes sharing two cores end together (~1.5T). Results
# do not depend on which actor trains a member, so only the seconds change
TRUNCATE_HP_OWN_REST_SHARED = {**TRUNCATE_HP_OWN_REST, "resources.num_workers": 4, "resources.cpus_per_member": 0.5}

# `evo-pbt-own`: evo-truncate-hp-own whose children draw each hyperparameter afresh from its whole range with
# probability 0.25 instead of growing or shrinking it (mutation.rl_hp_resample: PBT's resample_probability,
# its documented default): PBT's exploit and explore whole, inside evo, with half of each batch the member's own
PBT_OWN = {**TRUNCATE_HP_OWN, "mutation.rl_hp_resample": 0.25}

# `evo-truncate-hp-own-rest-infer`: evo-truncate-hp-own-rest where every evaluation also tries the member's
# inference-only hyperparameters at twice and half their values on the same weights and keeps the best
# (mutation.inference_search; ILQL: inference_beta, the β it decodes with). Over the peers' 1,200 evaluations on
# randomwalks-sparse, β correlates with the score more than any other hyperparameter (0.54), yet PBT and evo
# spend a round of training on each guess at it; here a guess costs an evaluation. EfficientZero names no
# such hyperparameter, so on CartPole this mode is refused
TRUNCATE_HP_OWN_REST_INFER = {**TRUNCATE_HP_OWN_REST, "mutation.inference_search": True}

# Every committed run of these strategies used the plain tournament (each non-elite slot a clone of
# its tournament's winner); the main job's file turned keep_unbeaten on after them. Each strategy
# below starts from the plain tournament, so `evo` and the ablations stay what the committed results
# (and `--reuse`) measured, whatever the file says; `evo-unbeaten` is the file's current rule.
PLAIN_TOURNAMENT = {"selection.keep_unbeaten": False}

#: every evo strategy of the benchmark and the experiment settings it changes
VARIANTS: dict[str, dict[str, Any]] = {
    name: {**PLAIN_TOURNAMENT, **changes}
    for name, changes in {"evo": {}, "evo-async": ASYNC, "evo-nomut": NO_MUTATION, "evo-seconds": EQUAL_SECONDS,
                          "evo-noarch": NO_ARCHITECTURE, "evo-unbeaten": KEEP_UNBEATEN, "evo-rungs": RUNGS,
                          "evo-rungs-eval": RUNGS_EVAL, "evo-champion-eval": CHAMPION_EVAL,
                          "evo-champion": CHAMPION, "evo-fallback": FALLBACK, "evo-noselect": NO_SELECTION,
                          "evo-margin": MARGIN, "evo-own": OWN_DATA,
                          "evo-lines": TWO_LINES, "evo-explore": EXPLORE,
                          "evo-lines-explore": LINES_EXPLORE, "evo-truncate": TRUNCATE,
                          "evo-truncate-hp": TRUNCATE_HP, "evo-truncate-hp3": TRUNCATE_HP3,
                          "evo-truncate-hp-own": TRUNCATE_HP_OWN,
                          "evo-truncate-hp3-own": TRUNCATE_HP3_OWN, "evo-truncate-hp-line": TRUNCATE_HP_LINE,
                          "evo-truncate-hp-own-line": TRUNCATE_HP_OWN_LINE,
                          "evo-truncate-hp-own-rest": TRUNCATE_HP_OWN_REST,
                          "evo-truncate-hp-own-rest-best": TRUNCATE_HP_OWN_REST_BEST,
                          "evo-truncate-hp-own-rest-shared": TRUNCATE_HP_OWN_REST_SHARED,
                          "evo-truncate-hp-own-rest-infer": TRUNCATE_HP_OWN_REST_INFER,
                          "evo-pbt-own": PBT_OWN}.items()}


def settings(t: Task, overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` for task `t`: a value given as a function of the task (FALLBACK's margin) is called."""
    return {key: value(t) if callable(value) else value for key, value in overrides.items()}


def resting_generations(t: Task) -> int:
    """The generations task `t`'s budget pays for when one member rests from generation 1 on
    (`selection.rest_elite`): all members train in generation 0, all but one after; none that would
    pass the budget (the run spends up to a round per member less than it, never more)."""
    rounds_after_first = t.budget // t.steps_per_generation - t.population
    return 1 + rounds_after_first // (t.population - 1)


def budgeted_generations(t: Task, overrides: dict[str, Any]) -> int | None:
    """The generations of a run that task `t`'s budget ends, not its rounds' count; None for any other run.
    Rungs (`population.rungs`) end rounds early: up to four times the task's generations. A resting elite
    (`selection.rest_elite`) trains one member fewer a generation: the generations that pays for when the
    rest begins at generation 1. When it begins later (`rest_from`) a last generation can pass the budget
    (evo stops after the generation that reaches it): the observer credits no point past the budget, so the
    run is judged on what the budget paid for."""
    if overrides.get("population.rungs"):
        return 4 * t.generations
    if overrides.get("selection.rest_elite"):
        return resting_generations(t)
    return None


def selection_counts(store: Any) -> dict[str, int]:
    """How many children each selection reason made in a run (`selected_by` of every member's mutation:
    "score", "champion", "founder line kept"...): the run store is temporary, so the counts go in the JSON."""
    # a plain tournament records no reason (a mutation's JSON has "details" only when it has some)
    counts = Counter(m["mutation"].get("details", {}).get("selected_by", "?") for m in store.all_members() if m["mutation"])
    return dict(sorted(counts.items()))


def run(t: Task, seed: int, backend: str = "ray", on_point: Callable[[list], None] | None = None,
        overrides: dict[str, Any] | None = None, regime: str = "tuned") -> dict[str, Any]:
    """`overrides`: experiment settings changed for an ablation or mode (dotted keys, e.g. NO_MUTATION, ASYNC)."""
    from evo.population import evolve, start_backend
    from evo.runstore import RunStore

    overrides = settings(t, overrides or {})
    budget, generations = None, budgeted_generations(t, overrides)
    if generations is not None:  # the budget, not the rounds' count, ends the run
        budget = t.budget
        overrides.update({"population.budget": {"env_steps": budget}, "population.generations": generations})
    exp, text = load(t, seed, regime, backend=backend, **overrides)
    with tempfile.TemporaryDirectory(prefix="evo-hpo-") as runs_dir:
        store = RunStore.create(runs_dir, f"hpo_{t.name}_{seed}", text, exp.to_json())
        scheduler, context = start_backend(exp, backend)
        try:
            # the clock starts once the backend is up
            observer = CurveObserver(t.steps_per_generation, on_point,
                                     population=t.population if exp.population.mode == "async" else None,
                                     budget=budget)
            evolve(exp, store, scheduler, context, observer=observer)
            if observer.population and observer.budget is None and observer.rounds_done % observer.population:
                observer.async_point()  # the last rounds, fewer than a population's worth
            spent = store.spent().to_json()
            chosen = selection_counts(store)
        finally:
            scheduler.close()
            store.close()
    return {
        "curve": observer.curve,
        "profile": observer.profile,
        "spent": spent,  # env steps, updates and member-seconds the run trained (evo.compute)
        "selected_by": chosen,  # why each child was made: how often the champion was called back, say
        "used": {"selection": f"tournament {exp.selection.tournament_size}, elitism {exp.selection.elitism}, "
                              f"fitness window {exp.selection.fitness_window}",
                 "mode": exp.population.mode, "regime": regime, "initial": exp.population.initial,
                 "informed_selection": exp.selection.model_dump(mode="json"),
                 "mutation": exp.mutation.model_dump(mode="json"),
                 "shared_replay": exp.agent_class.replay_spec(exp.task) is not None,
                 "fused": bool(exp.resources.fused),  # fused groups run inline and on Ray (evo/fused/remote.py)
                 "backend": backend, "workers": getattr(scheduler, "num_workers", 1),
                 "search_space": sorted(search_space(exp))},
    }
