"""One strategy on one seed, in a process of its own (its own Ray, nothing left behind):

    python -m benchmarks.hpo.strategy --strategy NAME --seed 0 --task cartpole [--regime tuned|scratch] \
        [--quick] --out R.json

NAME: evo, evo-async, random, pbt, pb2, agilerl, or a variant of evo (evo-nomut, evo-seconds,
evo-noarch, evo-unbeaten, evo-rungs, evo-champion, evo-fallback, evo-noselect, evo-margin, evo-own,
evo-lines, evo-explore, evo-lines-explore, evo-truncate, evo-truncate-hp, evo-truncate-hp3,
evo-truncate-hp-own, evo-truncate-hp3-own, evo-truncate-hp-line, evo-truncate-hp-own-line,
evo-truncate-hp-own-rest, evo-truncate-hp-own-rest-shared, evo-truncate-hp-own-rest-infer, evo-pbt-own;
`ABLATIONS` says what each changes, `evo_strategy.VARIANTS` how).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from benchmarks.hpo import evo_strategy
from benchmarks.hpo.common import TASKS, summarise, task

# the run order within a seed: PB2, the extra, last; evo-async is evo's asynchronous mode (evo_strategy.ASYNC)
STRATEGIES = ("evo", "evo-async", "random", "pbt", "agilerl", "pb2")
# evo with one part switched off, to tell which part of evo a result comes from; run only when named
ABLATIONS = {"evo-nomut": "evo with every child an unmutated copy: tournament selection and the shared replay only",
             "evo-seconds": "evo judging members at equal member-seconds (selection.equal_compute): "
                            "a member that spends more seconds per env step must earn them",
             "evo-noarch": "evo with no architecture mutation: what growing members costs per env step and buys",
             "evo-unbeaten": "evo where a member is replaced only by a tournament winner that beats it "
                             "(selection.keep_unbeaten): no coin-toss overwrites among tied members",
             "evo-rungs": "evo-async with early stopping inside rounds judged on the training return "
                          "(population.rungs, rung_metric): the steps of stopped rounds go to more rounds",
             "evo-rungs-eval": "evo-rungs judged on an evaluation at each rung (no rung_metric), for agents with no "
                               "training return (ILQL offline): a rung costs an evaluation",
             "evo-champion-eval": "evo-rungs-eval with the run's best state kept out of training (selection.champion)",
             "evo-champion": "evo-rungs with the run's best state kept out of training and drawn into "
                             "tournaments (selection.champion): a population that collapses trains on from its peak",
             "evo-fallback": "evo-champion with the champion drawn only after a fall: while every member's latest "
                             "score is more than a fifth of the task's target below it (selection.champion_margin)",
             "evo-noselect": "evo with selection and mutation off: every member keeps its slot unmutated, so the "
                             "founders train side by side and share only the replay store (random search: a store each)",
             "evo-margin": "evo where a member is replaced only by a tournament winner more than a tenth of the "
                           "task's target above it (selection.keep_unbeaten, tie_tolerance): selection waits "
                           "until scores separate from the evaluation's noise",
             "evo-own": "evo-margin with at least half of each batch drawn from the member's own rows of the "
                        "generation (replay.own_share = 0.5): less of the others' data in every update",
             "evo-lines": "evo-own with two founders' lines kept to the end (selection.founder_lines = 2): the best "
                          "line takes slots but never all, so one early leader cannot end the search",
             "evo-explore": "evo-own with the lowest-scoring member replaced by a new child every generation "
                            "(selection.replace_worst = 1), so members within the margin of each other still explore",
             "evo-lines-explore": "evo-own with both: two founders' lines kept to the end and the lowest-scoring "
                                  "member replaced by a new child every generation",
             "evo-truncate": "evo with PBT's exploit rule: each generation only the lowest-scoring member is "
                             "replaced, by a mutated clone of the best; the others train on whatever the gap",
             "evo-truncate-hp": "evo-truncate whose children change every hyperparameter (x1.2 or x0.8) and nothing "
                                "else: PBT's explore without its resampling",
             "evo-truncate-hp3": "evo-truncate-hp with three hyperparameters of each child changed, not all",
             "evo-truncate-hp-own": "evo-truncate-hp with at least half of each batch drawn from the member's own "
                                    "rows of the generation (replay.own_share = 0.5, as evo-own)",
             "evo-truncate-hp3-own": "evo-truncate-hp-own with three hyperparameters of each child changed, not all",
             "evo-truncate-hp-line": "evo-truncate-hp drawing every batch from the member's line store "
                                     "(replay.own_rows = 'line', own_share = 1): every row its line inserted, kept "
                                     "and copied to clones, as PBT's trials keep a store each",
             "evo-truncate-hp-own-line": "evo-truncate-hp-own whose own half of each batch comes from the member's "
                                         "line store (replay.own_rows = 'line'), not its rows of this generation",
             "evo-truncate-hp-own-rest": "evo-truncate-hp-own whose best member rests (selection.rest_elite): "
                                         "evaluated, not trained, until another evaluates higher; its clone trains on",
             "evo-truncate-hp-own-rest-best": "evo-truncate-hp-own-rest whose best member rests only once it has "
                                              "evaluated at the task's best possible fitness (selection.rest_from; "
                                              "CartPole: 500); until then every member trains",
             "evo-truncate-hp-own-rest-shared": "evo-truncate-hp-own-rest with all four members of a generation in "
                                                "flight at once, four actors of half a CPU on the two cores "
                                                "(resources.num_workers = 4, cpus_per_member = 0.5): the same "
                                                "results, with no actor idle while a third member trains",
             "evo-truncate-hp-own-rest-infer": "evo-truncate-hp-own-rest where each evaluation also tries the "
                                               "member's inference-only hyperparameters at twice and half their "
                                               "values on the same weights and keeps the best "
                                               "(mutation.inference_search; ILQL's inference_beta)",
             "evo-pbt-own": "evo-truncate-hp-own whose children draw each hyperparameter afresh from its whole range "
                            "with probability 0.25 (mutation.rl_hp_resample: PBT's resample_probability)"}


def run(name: str, seed: int, task_name: str, quick: bool, partial: str | None = None, regime: str = "tuned") -> dict:
    """`partial`: a file rewritten with the curve so far at every curve point (evo, random, PBT, PB2),
    so a run stopped before the end of its budget still leaves what it measured."""
    t = task(task_name, quick)
    load_before, t0 = os.getloadavg(), time.perf_counter()

    def on_point(curve: list[list[float]]) -> None:
        if partial:
            record = {"strategy": name, "seed": seed, "partial": True, **summarise(curve, t.target), "curve": curve,
                      "loadavg_before": list(load_before), "loadavg_now": list(os.getloadavg())}
            with open(partial, "w") as fh:
                json.dump(record, fh)

    if name in evo_strategy.VARIANTS:
        out = evo_strategy.run(t, seed, on_point=on_point, overrides=evo_strategy.VARIANTS[name], regime=regime)
    elif name in ("random", "pbt", "pb2"):
        from benchmarks.hpo import tune_strategies

        out = tune_strategies.run(t, seed, name, on_point=on_point, regime=regime)
    elif name == "agilerl":
        from benchmarks.hpo import agilerl_peer

        out = agilerl_peer.run(t, seed)
    else:
        raise ValueError(f"--strategy: expected one of {STRATEGIES + tuple(ABLATIONS)}, found {name!r}")
    return {"strategy": name, "seed": seed, "regime": regime, **summarise(out["curve"], t.target), **out,
            "process_wall_s": round(time.perf_counter() - t0, 1), "loadavg_before": list(load_before),
            "loadavg_after": list(os.getloadavg())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", required=True, choices=STRATEGIES + tuple(ABLATIONS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task", default="cartpole", choices=list(TASKS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--regime", default="tuned", choices=["tuned", "scratch"])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = run(args.strategy, args.seed, args.task, args.quick, partial=args.out + ".partial", regime=args.regime)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2, default=str)


if __name__ == "__main__":
    main()
