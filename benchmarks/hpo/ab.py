"""Two code versions on the same HPO runs: how much sooner does one finish what the other does?

    python -m benchmarks.hpo.ab BEFORE_LOGS AFTER_LOGS [--strategy NAME] --json OUT.json

Each folder holds `benchmarks.hpo --logs` runs of the same strategy and seeds, one made by each
version (run them alternately, seed by seed, on an idle machine: a drift in load then hits both).
For a change that should alter only *when* work happens (the scheduler's dispatch order, say), the
runs' curves must be the same in steps and fitness: the report says per seed whether they are, and
the ratio of the two runs' seconds (before / after: > 1 means the change is faster) with its median,
the ratio of the total seconds, and a percentile-bootstrap 95% interval of the mean of the
per-seed log-ratios, given as a ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.hpo.common import machine
from benchmarks.hpo.stats import paired_difference


def runs(folder: Path, strategy: str | None) -> dict[int, dict[str, Any]]:
    """The complete runs in `folder` (a `benchmarks.hpo --logs` folder) by seed; with `strategy`, only its."""
    out: dict[int, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            run = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(run, dict) or not run.get("curve") or "error" in run or "seed" not in run:
            continue  # a report (out.json), a partial or failed run
        if strategy is not None and run.get("strategy") != strategy:
            continue
        if int(run["seed"]) in out:
            raise ValueError(f"{folder}: two runs of seed {run['seed']}; name one strategy with --strategy")
        out[int(run["seed"])] = run
    return out


def compare_runs(before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]], n: int = 10000,
                 seed: int = 0) -> dict[str, Any]:
    """Per seed both have: same curve (steps and fitness of every point), the two runs' seconds and their
    ratio before / after; over the seeds the median ratio, the total seconds' ratio, and the bootstrap
    95% interval of the geometric mean ratio."""
    seeds = sorted(set(before) & set(after))
    rows = []
    for s in seeds:
        a, b = before[s]["curve"], after[s]["curve"]
        same = [(p[0], p[2]) for p in a] == [(p[0], p[2]) for p in b]
        rows.append({"seed": s, "same_curve": same, "before_s": float(a[-1][1]), "after_s": float(b[-1][1]),
                     "ratio": float(a[-1][1]) / float(b[-1][1]), "final_best": [float(a[-1][2]), float(b[-1][2])]})
    out: dict[str, Any] = {"seeds": seeds, "per_seed": rows, "all_curves_same": all(r["same_curve"] for r in rows)}
    if rows:
        # the per-seed log-ratios are paired differences of log seconds: their mean's bootstrap interval, as a ratio
        logs = paired_difference({r["seed"]: math.log(r["before_s"]) for r in rows},
                                 {r["seed"]: math.log(r["after_s"]) for r in rows}, n=n, seed=seed)
        out.update(median_ratio=float(np.median([r["ratio"] for r in rows])),
                   total_ratio=sum(r["before_s"] for r in rows) / sum(r["after_s"] for r in rows),
                   geometric_mean_ratio=math.exp(logs["mean"]),
                   ci95_geometric_mean_ratio=[math.exp(x) for x in logs["ci95_mean"]])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="--logs folder of the runs before the change")
    parser.add_argument("after", type=Path, help="--logs folder of the same runs after it")
    parser.add_argument("--strategy", default=None, help="only this strategy's runs (default: the folders hold one)")
    parser.add_argument("--json", required=True, type=Path)
    args = parser.parse_args(argv)
    for folder in (args.before, args.after):
        if not folder.is_dir():
            parser.error(f"{folder}: no such folder")
    before, after = runs(args.before, args.strategy), runs(args.after, args.strategy)
    if not set(before) & set(after):
        parser.error(f"no seed has a complete run in both folders (before: {sorted(before)}, after: {sorted(after)})")
    report = {"benchmark": "hpo.ab", "before": str(args.before), "after": str(args.after), "strategy": args.strategy,
              "machine": machine(), **compare_runs(before, after)}
    args.json.write_text(json.dumps(report, indent=1))
    for r in report["per_seed"]:
        print(f"seed {r['seed']}: {r['before_s']:.1f} s -> {r['after_s']:.1f} s ({r['ratio']:.3f}x), "
              f"{'same curve' if r['same_curve'] else 'curves differ'}")
    print(f"median {report['median_ratio']:.3f}x, total {report['total_ratio']:.3f}x, geometric mean "
          f"{report['geometric_mean_ratio']:.3f}x {[round(x, 3) for x in report['ci95_geometric_mean_ratio']]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
