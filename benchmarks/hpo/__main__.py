"""The HPO benchmark: evo against random search, Ray Tune PBT / PB2 and AgileRL, side by side.

    python -m benchmarks.hpo [--quick] [--seeds K] [--first-seed F] [--task cartpole|randomwalks|randomwalks-sparse]
        [--regime tuned|scratch] --json OUT.json [--plot OUT.png]

Every strategy gets the same budget (`common.Task.budget`: training steps of all members together)
and searches the same space; each (seed, strategy) runs in a process of its own, interleaved seed
by seed (evo, random, PBT, AgileRL, PB2 for seed 0, then seed 1, …) so that load drifts on a
shared machine hit every strategy alike, and each run's load average is recorded. The JSON is
rewritten after every run, so a run cut short keeps what finished. docs/benchmarks.md has the
method and the results.

Regimes: "tuned" (member 0 starts from the experiment file's tuned values, the others drawn from
the ranges) and "scratch" (HPO from scratch: every founder drawn). Default 5 seeds. The report's
`compare` block (benchmarks/hpo/stats.py) gives, for evo and each of its variants run against each peer, the
difference of medians of the final best and of the areas under best-so-far vs steps and vs
seconds, each with a bootstrap 95% interval over seeds, and the same paired by seed (`paired`: the
mean per-seed difference, its interval and the Wilcoxon signed-rank p).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.hpo.common import ROOT, TASKS, machine, task
from benchmarks.hpo.evo_strategy import VARIANTS
from benchmarks.hpo.stats import compare, target_hold
from benchmarks.hpo.strategy import ABLATIONS, STRATEGIES

REPORT_FIELDS = ("steps_to_target", "seconds_to_target", "final_best", "curve")


def run_one(name: str, seed: int, task_name: str, quick: bool, log_dir: Path, reuse: bool = False,
            collect_only: bool = False, regime: str = "tuned") -> dict[str, Any]:
    """One strategy × seed in a subprocess; a failure is recorded (with its log's tail), not raised.
    `reuse`: a result this (seed, strategy) already left in `log_dir` is read instead of run again;
    `collect_only`: nothing is run — a missing result is reported "not run", a partial one as partial."""
    tag = "" if regime == "tuned" else f"_{regime}"  # tuned runs keep their old file names (--reuse)
    out = log_dir / f"{name}{tag}_{seed}.json"
    log = log_dir / f"{name}{tag}_{seed}.log"
    if reuse and out.exists():
        return {**json.loads(out.read_text()), "reused_from": str(out)}
    if collect_only:
        partial = out.with_name(out.name + ".partial")
        if partial.exists():
            return {**json.loads(partial.read_text()), "reused_from": str(partial),
                    "error": "stopped before the end of its budget (partial curve)"}
        return {"strategy": name, "seed": seed, "error": "not run", "steps_to_target": None, "seconds_to_target": None,
                "final_best": None, "curve": []}
    cmd = [sys.executable, "-m", "benchmarks.hpo.strategy", "--strategy", name, "--seed", str(seed),
           "--task", task_name, "--regime", regime, "--out", str(out), *(["--quick"] if quick else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc == 0 and out.exists():
        return json.loads(out.read_text())
    tail = log.read_text()[-2000:] if log.exists() else ""
    failed = {"strategy": name, "seed": seed, "error": f"exit {rc} after {time.perf_counter() - t0:.0f} s", "log_tail": tail,
              "steps_to_target": None, "seconds_to_target": None, "final_best": None, "curve": []}
    partial = out.with_name(out.name + ".partial")
    if partial.exists():  # what it measured before it stopped: kept, marked partial (final_best is not at the budget's end)
        failed.update(json.loads(partial.read_text()))
    return failed


def ratios(report: dict[str, Any]) -> dict[str, Any]:
    """evo's medians against each peer's: steps and seconds to target, final best."""
    def med(runs: list[dict[str, Any]], key: str) -> float | None:
        vals = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    s = report["strategies"]
    if "evo" not in s:
        return {}
    out = {}
    for peer, runs in s.items():
        if peer == "evo":
            continue
        row = {}
        for key in ("steps_to_target", "seconds_to_target"):
            e, p = med(s["evo"], key), med(runs, key)
            row[key] = {"evo": e, peer: p, "evo/peer": round(e / p, 3) if e and p else None,
                        "reached": {"evo": sum(r.get(key) is not None for r in s["evo"]),
                                    peer: sum(r.get(key) is not None for r in runs), "of": len(runs)}}
        row["final_best"] = {"evo": med(s["evo"], "final_best"), peer: med(runs, "final_best")}
        out[peer] = row
    return out


def _write_report(report: dict[str, Any], t: Any, args: argparse.Namespace) -> None:
    """Ratios, bootstrap comparisons (the slow part: tens of seconds with many strategies) and the plot."""
    report["ratios"] = ratios(report)
    report["target_hold"] = {name: target_hold(runs, t.target) for name, runs in report["strategies"].items()}
    report["compare"] = {ref: compare(report["strategies"], t.budget, reference=ref)
                         for ref in VARIANTS if ref in report["strategies"]}
    report["machine"]["loadavg_now"] = list(os.getloadavg())
    Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    if args.plot:
        from benchmarks.hpo.plot import plot

        plot(report, args.plot)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, reduced budgets: minutes per strategy")
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..K-1 (default 5, --quick 2)")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="seeds F..F+K-1 instead (e.g. --collect a later session's seeds apart, whose seconds compare)")
    parser.add_argument("--regime", default="tuned", choices=["tuned", "scratch"],
                        help="founders: member 0 from the tuned file ('tuned') or every founder drawn ('scratch')")
    parser.add_argument("--task", default="cartpole", choices=list(TASKS))
    parser.add_argument("--strategies", default=None,
                        help=f"comma-separated subset of {','.join(STRATEGIES)}, run in this order within a seed "
                             "(default all that apply to the task); ablations, run only when named: "
                             + "; ".join(f"{k}: {v}" for k, v in ABLATIONS.items()))
    parser.add_argument("--json", required=True)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--logs", default=None, help="keep each run's log and JSON here (default: a temporary dir)")
    parser.add_argument("--reuse", action="store_true",
                        help="continue an interrupted benchmark: read the results already in --logs instead of rerunning")
    parser.add_argument("--collect", action="store_true",
                        help="run nothing: write the report from the results (and partial curves) in --logs")
    args = parser.parse_args()
    t = task(args.task, args.quick)
    if args.first_seed < 0:
        parser.error(f"--first-seed: expected 0 or more, found {args.first_seed}")
    seeds = list(range(args.first_seed, args.first_seed + (args.seeds if args.seeds is not None else (2 if args.quick else 5))))
    names = args.strategies.split(",") if args.strategies else [s for s in STRATEGIES
                                                                  if args.task == "cartpole" or s != "agilerl"]
    unknown = [n for n in names if n not in STRATEGIES and n not in ABLATIONS]
    if unknown:
        parser.error(f"--strategies: unknown {unknown}; expected some of {list(STRATEGIES) + list(ABLATIONS)}")
    report: dict[str, Any] = {
        "benchmark": "hpo", "quick": args.quick, "task": t.to_json(), "regime": args.regime, "seeds": seeds,
        "machine": machine(),
        "budget_counts": f"{t.unit} of every member's training (train() steps), summed over the population; "
                         "fitness evaluations are not counted (their time is in the wall clock)",
        "skipped": {} if args.task == "cartpole" else {"agilerl": f"AgileRL's DQN is online; {args.task} is offline"},
        "strategies": {n: [] for n in names},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if (args.reuse or args.collect) and not args.logs:
        parser.error("--reuse and --collect read the results in --logs DIR; give it")
    log_dir = Path(args.logs or tempfile.mkdtemp(prefix="hpo-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    if args.collect:  # the machine block then describes the moment of collection; each run has its own load averages
        report["collected_from"] = str(log_dir)
    for seed in seeds:
        for name in names:  # interleaved: every strategy of seed 0, then seed 1, ...
            print(f"[{time.strftime('%H:%M:%S')}] {name} seed {seed} (load {os.getloadavg()[0]:.1f})", flush=True)
            result = run_one(name, seed, args.task, args.quick, log_dir, reuse=args.reuse or args.collect,
                             collect_only=args.collect, regime=args.regime)
            report["strategies"][name].append(result)
            print(f"    steps_to_target {result['steps_to_target']} seconds_to_target {result['seconds_to_target']} "
                  f"final_best {result['final_best']}" + (f" ERROR {result['error']}" if "error" in result else ""),
                  flush=True)
            if not args.collect:  # the report so far after every run, so an interrupted benchmark leaves one
                _write_report(report, t, args)
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _write_report(report, t, args)
    print(json.dumps(report["ratios"], indent=1))


if __name__ == "__main__":
    main()
