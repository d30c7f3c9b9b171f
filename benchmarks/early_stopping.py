"""Early stopping inside asynchronous evolution (`population.rungs`): compute saved, and the final best.

    .venv/bin/python -m benchmarks.early_stopping [--task toy|cartpole] [--quick] [--seeds K] [--rungs 0.25,0.5]
        [--rung-metric NAME] [--no-same-steps] --json OUT.json

Per seed, three inline async runs, the same population and rounds, of either

* `toy` (default): the toy regression agent (tests/toy_agent.py), 6 slots, founders drawn from the
  ranges; fitness is minus the validation MSE (higher is better);
* `cartpole`: EfficientZero on CartPole-v1, experiments/cartpole_efficientzero.toml as it is (its 4
  tuned founders, 2,000 env steps per round), in async mode; fitness is the mean greedy return.

The three runs:

* `plain`: no rungs, `generations` rounds per slot (the reference's env steps: its budget);
* `rungs, same rounds`: rungs on, the same number of member-rounds: the steps stopped rounds did not
  train are the compute saved, and its final best shows what stopping cost;
* `rungs, same steps`: rungs on, `population.budget.env_steps` = plain's env steps: what stopping buys
  when the saved steps go to other rounds (`--no-same-steps` skips it).

The rungs judge members on an evaluation's fitness, or with `--rung-metric` on that training metric
(`population.rung_metric`, e.g. EfficientZero's `train_episode_return`), which costs no evaluation.

Reported per run: the best fitness seen, the best of its last round, env steps, updates and
member-seconds spent; per seed the share of env steps and of member-seconds the rungs saved; medians
over seeds, and the median differences to `plain` with bootstrap 95% intervals (benchmarks/hpo/stats.py).
Rounds run one at a time in one process (the inline backend), so env steps and scores do not depend
on the machine's load; member-seconds do (the load average is recorded per seed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.hpo.stats import bootstrap_difference

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Task:
    path: Path                   # the experiment file
    overrides: dict[str, Any]    # what every run of it changes
    generations: int             # rounds per slot
    quick: dict[str, Any]        # what --quick changes besides (rounds included)


TASKS: dict[str, Task] = {
    "toy": Task(ROOT / "tests" / "experiments" / "toy.toml", {"population.initial": "scratch", "population.size": 6},
                8, {"population.generations": 4}),
    "cartpole": Task(ROOT / "experiments" / "cartpole_efficientzero.toml", {}, 6,
                     {"population.generations": 2, "population.steps_per_generation": 400}),
}


def run(task: str, seed: int, generations: int, rungs: list[float], budget: int | None, runs_dir: str,
        quick: bool = False, rung_metric: str | None = None) -> dict[str, Any]:
    from evo.population import evolve, start_backend
    from evo.runstore import RunStore
    from evo.spec import load_experiment

    t = TASKS[task]
    overrides: dict[str, Any] = {**t.overrides, **(t.quick if quick else {}), "seed": seed, "population.mode": "async",
                                 "population.generations": generations, "population.rungs": rungs}
    if rungs and rung_metric:
        overrides["population.rung_metric"] = rung_metric
    if budget is not None:
        overrides.update({"population.budget": {"env_steps": budget}, "population.generations": generations * 4})
    exp, text = load_experiment(t.path, overrides)
    store = RunStore.create(runs_dir, f"{task}-s{seed}-{len(rungs)}-{budget}", text, exp.to_json())
    scheduler, context = start_backend(exp, "inline")
    t0 = time.perf_counter()
    try:
        evolve(exp, store, scheduler, context)
    finally:
        scheduler.close()
    wall = time.perf_counter() - t0
    evs = store.all_evaluations()
    final_round = max(e["generation"] for e in evs)
    spent = store.spent()
    out = {"best": max(e["score"] for e in evs), "env_steps": spent.env_steps, "updates": spent.updates,
           "member_s": spent.member_s, "wall_s": wall,
           "last_round_best": max(e["score"] for e in evs if e["generation"] == final_round),
           "rung_stats": json.loads(store.get("rung_stats") or "{}")}
    store.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=sorted(TASKS), default="toy")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seeds", type=int, help="seeds per arm (default 8; 3 with --quick)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--generations", type=int, help="rounds per slot (default: 8 toy, 6 cartpole)")
    p.add_argument("--rungs", default="0.25,0.5")
    p.add_argument("--rung-metric", help="judge rungs on this training metric (population.rung_metric), not an "
                                         "evaluation; a leading - (lower first) as --rung-metric=-loss")
    p.add_argument("--no-same-steps", action="store_true", help="skip the `rungs, same steps` arm")
    p.add_argument("--reuse", action="store_true", help="keep the seeds --json already holds, run the others")
    p.add_argument("--json")
    args = p.parse_args(argv)
    t = TASKS[args.task]
    args.seeds = args.seeds or (3 if args.quick else 8)
    generations = args.generations or (t.quick["population.generations"] if args.quick else t.generations)
    rungs = [float(x) for x in args.rungs.split(",")]
    rows: list[dict[str, Any]] = []
    if args.reuse and args.json and Path(args.json).exists():
        before = json.loads(Path(args.json).read_text())
        if before.get("task", "toy") != args.task:
            p.error(f"--reuse: {args.json} holds task {before.get('task', 'toy')!r}, not {args.task!r}")
        if before.get("rung_metric") != args.rung_metric:
            p.error(f"--reuse: {args.json} judged rungs on {before.get('rung_metric')!r}, not {args.rung_metric!r}")
        rows = before["rows"]
    done = {r["seed"] for r in rows}
    with tempfile.TemporaryDirectory(prefix="evo-rungs-") as runs_dir:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            if seed in done:
                continue
            load = os.getloadavg()[0]
            plain = run(args.task, seed, generations, [], None, runs_dir, args.quick)
            same_rounds = run(args.task, seed, generations, rungs, None, runs_dir, args.quick, args.rung_metric)
            row = {"seed": seed, "load_avg_1m": load, "plain": plain, "rungs_same_rounds": same_rounds,
                   "saved_fraction": 1 - same_rounds["env_steps"] / plain["env_steps"],
                   "saved_member_s_fraction": 1 - same_rounds["member_s"] / max(plain["member_s"], 1e-9)}
            if not args.no_same_steps:
                row["rungs_same_steps"] = run(args.task, seed, generations, rungs, int(plain["env_steps"]), runs_dir,
                                              args.quick, args.rung_metric)
            print(json.dumps(row), flush=True)
            rows.append(row)
            if args.json:  # after every seed: an interrupted run keeps what it finished (--reuse)
                Path(args.json).write_text(json.dumps({"task": args.task, "rung_metric": args.rung_metric,
                                                       "rows": rows}, indent=2))

    def col(name: str, key: str) -> list[float]:
        return [r[name][key] for r in rows]

    arms = [k for k in ("plain", "rungs_same_rounds", "rungs_same_steps") if all(k in r for r in rows)]
    summary = {
        "task": args.task, "rung_metric": args.rung_metric, "rungs": rungs, "seeds": len(rows),
        "generations": generations,
        "median_saved_fraction": statistics.median(r["saved_fraction"] for r in rows),
        "median_saved_member_s_fraction": statistics.median(r.get("saved_member_s_fraction", math.nan) for r in rows),
        "median_best": {k: statistics.median(col(k, "best")) for k in arms},
        **{f"{k}_minus_plain": bootstrap_difference(col(k, "best"), col("plain", "best")) for k in arms[1:]},
        "rows": rows,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
