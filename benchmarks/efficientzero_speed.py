"""EfficientZero's learner, fast path against baseline, side by side in one process.

    python -m benchmarks.efficientzero_speed [--quick] [--only learner,cartpole,minatar] --json OUT.json

The two paths of `agents.efficientzero.learner` (`learner.use_path`: "fast", the default, and
"baseline", the step-by-step code it replaced) compute the same function (float64 equality:
tests/efficientzero/test_fast_path.py). Each section builds a member from an experiment file's
defaults (its task, arch and hyperparameter values), trains it until its replay is warm, then
alternates the two paths in short windows on that same member — baseline, fast, fast, baseline, ...
— so load from other processes falls on both sides alike:

* learner: `sample_batch` + `update` (the CartPole experiment: batch 128, unroll 5); updates per
  second, and the sampling's and the update's share;
* cartpole: `agent.train(steps)` of the CartPole experiment's member (self-play, search and its
  updates): env steps per second;
* minatar: the same for experiments/minatar_breakout_efficientzero.toml's conv member.

Every window records wall seconds and this process's CPU seconds (`time.process_time`: on a loaded
machine the CPU seconds are the steadier measure of the work) and the load average; each side's
median and best are reported with the ratios fast / baseline. One torch thread, as members train.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = {"cartpole": "experiments/cartpole_efficientzero.toml",
               "minatar": "experiments/minatar_breakout_efficientzero.toml"}


def build_member(name: str, seed: int = 0) -> Any:
    """The experiment's first member (the file's hyperparameter values), with a private store."""
    from evo.agent import AgentContext
    from evo.replay import build_replay
    from evo.spec import load_experiment

    exp, _ = load_experiment(ROOT / EXPERIMENTS[name], {"seed": seed})
    replay = build_replay(exp.agent_class.replay_spec(exp.task), seed, distributed=False)
    return exp.agent_class.create(exp.arch, {n: hp.value for n, hp in exp.hparam_space.items()}, seed, 0,
                                  AgentContext(task=exp.task, replay=replay, seed=seed))


def alternate(work: Any, units: float, rounds: int) -> dict[str, Any]:
    """`rounds` pairs of windows in the order baseline, fast, fast, baseline, ...; `work()` does
    `units` of work (updates, env steps) on the current path."""
    from agents.efficientzero import learner

    windows: dict[str, list[dict[str, float]]] = {"baseline": [], "fast": []}
    for r in range(rounds):
        for path in (("baseline", "fast") if r % 2 == 0 else ("fast", "baseline")):
            with learner.use_path(path):
                load = os.getloadavg()[0]
                w0, c0 = time.perf_counter(), time.process_time()
                work()
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            windows[path].append({"wall_s": wall, "cpu_s": cpu, "load1": load,
                                  "per_s_wall": units / wall, "per_s_cpu": units / max(cpu, 1e-9)})
    out: dict[str, Any] = {"units_per_window": units, "rounds": rounds}
    for path, ws in windows.items():
        out[path] = {f"{stat}_{clock}": round(fn([w[f"per_s_{clock}"] for w in ws]), 2)
                     for stat, fn in (("median", statistics.median), ("best", max)) for clock in ("wall", "cpu")}
        out[path]["windows"] = [{k: round(v, 4) for k, v in w.items()} for w in ws]
    for stat in ("median", "best"):
        for clock in ("wall", "cpu"):
            key = f"{stat}_{clock}"
            out[f"ratio_{key}"] = round(out["fast"][key] / out["baseline"][key], 3)
    return out


def learner_section(quick: bool) -> dict[str, Any]:
    from agents.efficientzero import learner

    agent = build_member("cartpole")
    agent.train(400 if quick else 1500)
    torch.set_num_threads(1)
    n = 20 if quick else 50
    parts = {"baseline": [0.0, 0.0], "fast": [0.0, 0.0]}

    def work() -> None:
        part = parts[learner.current_path()]
        for _ in range(n):
            t0 = time.process_time()
            batch = learner.sample_batch(agent.replay, agent.target_model, agent.hparams, agent.rng)
            t1 = time.process_time()
            learner.update(agent.model, agent.target_model, agent.optimizer, agent.replay, batch, agent.hparams,
                           agent.updates + 1)
            agent.updates += 1
            part[0] += t1 - t0
            part[1] += time.process_time() - t1

    out = alternate(work, n, 4 if quick else 8)
    for path, (sample, update) in parts.items():
        count = n * len(out[path]["windows"])
        out[path]["sample_cpu_ms"] = round(sample / count * 1e3, 3)
        out[path]["update_cpu_ms"] = round(update / count * 1e3, 3)
    return out


def member_section(name: str, quick: bool) -> dict[str, Any]:
    agent = build_member(name)
    # (warm-up steps beyond min_replay, window steps --quick, window steps)
    steps = {"cartpole": (150, 300, 1000), "minatar": (100, 150, 400)}[name]
    warm = int(agent.task["min_replay"]) + steps[0]
    agent.train(warm)  # past min_replay: every window learns
    window = steps[1] if quick else steps[2]
    return {"steps_per_window": window, "warm_steps": warm,
            **alternate(lambda: agent.train(window), window, 2 if quick else 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about a minute on an idle 2-core machine")
    parser.add_argument("--only", default="learner,cartpole,minatar", help="comma-separated sections")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    out: dict[str, Any] = {"quick": args.quick, "torch": torch.__version__, "python": platform.python_version(),
                           "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                           "loadavg_start": list(os.getloadavg())}
    t0 = time.perf_counter()
    for section in sections:
        if section == "learner":
            out["learner"] = learner_section(args.quick)
        elif section in EXPERIMENTS:
            try:
                out[section] = member_section(section, args.quick)
            except ImportError as err:  # MinAtar not installed: say so, measure the rest
                out[section] = {"skipped": str(err)}
        else:
            raise SystemExit(f"--only: unknown section {section!r}; expected learner, cartpole, minatar")
        summary = {k: v for k, v in out[section].items() if k.startswith("ratio") or k == "skipped"}
        print(section, json.dumps(summary), flush=True)
    out["loadavg_end"] = list(os.getloadavg())
    out["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k not in EXPERIMENTS and k != "learner"}))


if __name__ == "__main__":
    main()
