"""Early stopping inside asynchronous evolution (`population.rungs`): compute saved, and the final best.

    .venv/bin/python -m benchmarks.early_stopping [--quick] [--seeds K] [--rungs 0.25,0.5] --json OUT.json

Per seed, three inline async runs of the toy regression agent (tests/toy_agent.py; founders drawn
from the ranges), the same population and rounds:

* `plain`: no rungs, `generations` rounds per slot (the reference's env steps: its budget);
* `rungs, same rounds`: rungs on, the same number of member-rounds: the steps stopped rounds did not
  train are the compute saved, and its final best shows what stopping cost;
* `rungs, same steps`: rungs on, `population.budget.env_steps` = plain's env steps: what stopping buys
  when the saved steps go to other rounds.

Fitness is minus the validation MSE (higher is better). Reported: medians over seeds, and the
median differences to `plain` with bootstrap 95% intervals (benchmarks/hpo/stats.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.hpo.stats import bootstrap_difference

ROOT = Path(__file__).resolve().parents[1]


def run(seed: int, generations: int, rungs: list[float], budget: int | None, runs_dir: str) -> dict[str, Any]:
    from evo.population import evolve, start_backend
    from evo.runstore import RunStore
    from evo.spec import load_experiment

    overrides: dict[str, Any] = {"seed": seed, "population.mode": "async", "population.initial": "scratch",
                                 "population.size": 6, "population.generations": generations,
                                 "population.rungs": rungs}
    if budget is not None:
        overrides.update({"population.budget": {"env_steps": budget}, "population.generations": generations * 4})
    exp, text = load_experiment(ROOT / "tests" / "experiments" / "toy.toml", overrides)
    store = RunStore.create(runs_dir, f"s{seed}-{len(rungs)}-{budget}", text, exp.to_json())
    scheduler, context = start_backend(exp, "inline")
    evolve(exp, store, scheduler, context)
    evs = store.all_evaluations()
    final_round = max(e["generation"] for e in evs)
    out = {"best": max(e["score"] for e in evs), "env_steps": store.spent().env_steps,
           "last_round_best": max(e["score"] for e in evs if e["generation"] == final_round),
           "rung_stats": json.loads(store.get("rung_stats") or "{}")}
    store.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--rungs", default="0.25,0.5")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.generations = 3, 4
    rungs = [float(x) for x in args.rungs.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="evo-rungs-") as runs_dir:
        for seed in range(args.seeds):
            plain = run(seed, args.generations, [], None, runs_dir)
            same_rounds = run(seed, args.generations, rungs, None, runs_dir)
            same_steps = run(seed, args.generations, rungs, int(plain["env_steps"]), runs_dir)
            row = {"seed": seed, "load_avg_1m": os.getloadavg()[0], "plain": plain, "rungs_same_rounds": same_rounds,
                   "rungs_same_steps": same_steps,
                   "saved_fraction": 1 - same_rounds["env_steps"] / plain["env_steps"]}
            print(json.dumps(row), flush=True)
            rows.append(row)

    def col(name: str, key: str) -> list[float]:
        return [r[name][key] for r in rows]

    summary = {
        "rungs": rungs, "seeds": args.seeds, "generations": args.generations, "population": 6,
        "median_saved_fraction": statistics.median(r["saved_fraction"] for r in rows),
        "median_best": {k: statistics.median(col(k, "best")) for k in ("plain", "rungs_same_rounds", "rungs_same_steps")},
        "rungs_same_rounds_minus_plain": bootstrap_difference(col("rungs_same_rounds", "best"), col("plain", "best")),
        "rungs_same_steps_minus_plain": bootstrap_difference(col("rungs_same_steps", "best"), col("plain", "best")),
        "rows": rows,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
