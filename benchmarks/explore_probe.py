"""The exploration probe (issue 23): one EfficientZero member trained on a suite task's settings,
measuring what collection finds — training episodes that reached the goal per chunk — beside the
greedy evaluation return.

    python -m benchmarks.explore_probe NAME TOTAL CHUNK ['{"explore_epsilon": 0.2, ...}'] [--json OUT]

The JSON overrides hyperparameters of the file's [agent.hparams] (their starting values); three keys
are not hyperparameters: "file" (default experiments/suite/mountaincar.toml), "env_id" (replaces the
file's) and "seed" (default 0); "task" is a table merged into [agent.task]. A MountainCar episode
"reached the goal" when its return is above -200 (it terminated before the time limit). One member,
no evolution, no Ray: env steps are that member's. Results in docs/efficientzero.md, "Exploration".
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import tomllib

ROOT = Path(__file__).resolve().parents[1]


def one_member(overrides: dict) -> tuple[Any, str, int, dict, dict]:
    """One EfficientZero member of a suite file with its own store, as the module docstring's JSON
    describes ("file", "env_id", "seed", "task", the rest hyperparameters): (agent, file, seed, task, hparams)."""
    import torch

    from agents.efficientzero import EfficientZeroAgent
    from evo.agent import AgentContext
    from evo.replay import build_replay

    torch.set_num_threads(1)
    over = dict(overrides)
    file = over.pop("file", "experiments/suite/mountaincar.toml")
    data = tomllib.loads((ROOT / file).read_text())
    seed = int(over.pop("seed", 0))
    task = {**data["agent"]["task"], **over.pop("task", {})}
    task["env_id"] = over.pop("env_id", task["env_id"])
    hp = {k: (v["value"] if isinstance(v, dict) else v) for k, v in data["agent"]["hparams"].items()}
    hp.update(over)
    replay = build_replay(EfficientZeroAgent.replay_spec(task), seed, distributed=False)
    agent = EfficientZeroAgent.create(dict(data["agent"]["arch"]), hp, seed, 0,
                                      AgentContext(task=task, replay=replay, seed=seed))
    return agent, file, seed, task, hp


def probe(name: str, total: int, chunk: int, overrides: dict) -> dict:
    agent, file, seed, task, hp = one_member(overrides)
    finished: list[float] = []
    collect = agent.selfplay.collect

    def recording(*args, **kwargs):
        out = collect(*args, **kwargs)
        finished.extend(out)
        return out

    agent.selfplay.collect = recording
    goal = "MountainCar" in task["env_id"]
    t0, log = time.perf_counter(), []
    while agent.env_steps < total:
        n0 = len(finished)
        agent.train(chunk)
        ev = agent.evaluate().metrics
        new = finished[n0:]
        row = {"env_steps": agent.env_steps, "episodes": len(new),
               "goal": int(sum(r > -200 for r in new)) if goal else None,
               "train_mean": float(np.mean(new)) if new else None, "train_max": float(max(new)) if new else None,
               "eval": ev["eval_return"], "s": round(time.perf_counter() - t0), "load": round(os.getloadavg()[0], 2)}
        log.append(row)
        print(name, row, flush=True)
    return {"name": name, "file": file, "seed": seed, "hparams": hp, "task": task, "log": log}


def main(argv: list[str] | None = None) -> dict:
    args = list(sys.argv[1:] if argv is None else argv)
    out = None
    if "--json" in args:
        i = args.index("--json")
        out = args[i + 1]
        del args[i:i + 2]
    name, total, chunk = args[0], int(args[1]), int(args[2])
    result = probe(name, total, chunk, json.loads(args[3]) if len(args) > 3 else {})
    if out:
        Path(out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
