"""Where one EfficientZero member's time goes during one evo generation on CartPole.

    python -m benchmarks.hpo.profile_member [--steps 2000] [--warm 2000] [--path fast|baseline] --json OUT.json

Builds a member from the benchmark's experiment (the file's hyperparameters), trains `--warm` steps
first (so the replay store is full enough to learn and the kernels are compiled), then trains
`--steps` more and evaluates, timing the parts with wall-clock wrappers around the functions that do
them: MCTS search (`BatchedMCTS.run`), the learner (`learner.sample_batch` + `learner.update`), the
environment (`EnvPool.step`) and evaluation (`evaluate`). The rest of `train` is row bookkeeping and
replay writes. Scheduling (Ray, checkpoints, selection) is not in a single member: the benchmark's
evo profile has each generation's wall time against its members' own seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from typing import Any

from benchmarks.hpo.common import load, task


def timed(totals: dict[str, float], name: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - t0
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warm", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--path", default="fast", choices=("fast", "baseline"),
                        help="the learner's implementation (agents.efficientzero.learner.use_path)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import torch

    from agents.efficientzero import learner, mcts
    from agents.efficientzero.envs import EnvPool
    from evo.agent import AgentContext
    from evo.replay import build_replay

    torch.set_num_threads(1)
    learner.set_path(args.path)
    exp, _ = load(task("cartpole", quick=False), args.seed)
    replay = build_replay(exp.agent_class.replay_spec(exp.task), args.seed, distributed=False)
    agent = exp.agent_class.create(exp.arch, {n: hp.value for n, hp in exp.hparam_space.items()}, args.seed, 0,
                                   AgentContext(task=exp.task, replay=replay, seed=args.seed))
    agent.train(args.warm)
    totals: dict[str, float] = defaultdict(float)
    mcts.BatchedMCTS.run = timed(totals, "search", mcts.BatchedMCTS.run)
    learner.sample_batch = timed(totals, "learner_sample", learner.sample_batch)
    learner.update = timed(totals, "learner_update", learner.update)
    EnvPool.step = timed(totals, "env", EnvPool.step)
    t0, c0 = time.perf_counter(), time.process_time()
    agent.train(args.steps)
    train_s, train_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    during_train = dict(totals)
    t1 = time.perf_counter()
    fitness = agent.evaluate().fitness
    eval_s = time.perf_counter() - t1
    search_in_eval = totals["search"] - during_train.get("search", 0.0)
    out = {
        "path": args.path, "steps": args.steps, "updates": agent.updates, "train_s": round(train_s, 2),
        "train_cpu_s": round(train_cpu_s, 2), "eval_s": round(eval_s, 2),
        "train_parts_s": {k: round(v, 2) for k, v in during_train.items()},
        "train_other_s": round(train_s - sum(during_train.values()), 2),
        "eval_search_s": round(search_in_eval, 2), "fitness": fitness, "loadavg": list(os.getloadavg()),
        "hparams": {k: agent.hparams[k] for k in ("num_simulations", "replay_ratio", "batch_size")},
    }
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
