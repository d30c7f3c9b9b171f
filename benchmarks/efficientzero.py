"""One EfficientZero agent learning CartPole-v1 on this machine.

    python -m benchmarks.efficientzero [--quick] [--seed S] [--path fast|baseline] [--arch KEY=VALUE ...] --json OUT.json

Trains in chunks of `--eval-every` environment steps and after each chunk evaluates 10 greedy
episodes (MCTS, no noise). Fields: env_steps_to_195 and wall_s_to_195 (the first evaluation with
mean return >= 195; null if never; wall time counts training *and* evaluations since start),
final_eval_return, env_steps, updates, plus the evaluation curve. Target: 195 within 20,000 env
steps and 540 s. --quick stops after about a minute. The agent's default network unless `--arch KEY=VALUE`
(repeatable, a TOML value: `--arch width=32 --arch 'blocks=[32]'`) changes keys of it.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from agents.efficientzero import learner
from agents.efficientzero.agent import EfficientZeroAgent
from benchmarks.devices import cpu_name
from evo.agent import AgentContext
from evo.replay import build_replay
from evo.spec import parse_override

TASK = {"env_id": "CartPole-v1", "num_envs": 8, "eval_episodes": 10}
HPARAMS = {"discount": 0.99}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="stop after about a minute")
    parser.add_argument("--json", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-env-steps", type=int, default=20_000)
    parser.add_argument("--max-seconds", type=float, default=540.0)
    parser.add_argument("--eval-every", type=int, default=1000)
    parser.add_argument("--keep-going", action="store_true", help="train on after reaching 195")
    parser.add_argument("--path", default="fast", choices=learner.PATHS,
                        help="the learner's loss path (`learner.set_path`): the fast default or the baseline it replaced")
    parser.add_argument("--arch", action="append", default=[], metavar="KEY=VALUE",
                        help="an architecture key over the agent's defaults (TOML value), repeatable")
    args = parser.parse_args()
    arch = dict(parse_override(text) for text in args.arch)
    learner.set_path(args.path)
    torch.set_num_threads(1)
    max_seconds = 60.0 if args.quick else args.max_seconds
    replay = build_replay(EfficientZeroAgent.replay_spec(TASK), args.seed, distributed=False)
    ctx = AgentContext(task=TASK, replay=replay, seed=args.seed)
    agent = EfficientZeroAgent.create(arch, HPARAMS, args.seed, 0, ctx)
    start = time.perf_counter()
    curve, solved, last = [], None, None
    while agent.env_steps < args.max_env_steps and time.perf_counter() - start < max_seconds:
        metrics = agent.train(args.eval_every)
        ev = agent.evaluate()
        wall = time.perf_counter() - start
        last = ev.fitness
        point = {"env_steps": agent.env_steps, "updates": agent.updates, "wall_s": round(wall, 1),
                 "eval_return": ev.fitness, "train_episode_return": round(metrics.get("train_episode_return", float("nan")), 1),
                 "loss_value": round(metrics.get("loss_value", float("nan")), 4),
                 "loss_policy": round(metrics.get("loss_policy", float("nan")), 4)}
        curve.append(point)
        print(json.dumps(point), flush=True)
        if solved is None and ev.fitness >= 195:
            solved = point
            if not args.keep_going:
                break
    out = {
        "benchmark": "efficientzero",
        "env_id": "CartPole-v1",
        "quick": args.quick,
        "seed": args.seed,
        "learner_path": args.path,
        "env_steps_to_195": solved["env_steps"] if solved else None,
        "wall_s_to_195": solved["wall_s"] if solved else None,
        "final_eval_return": last,
        "env_steps": agent.env_steps,
        "updates": agent.updates,
        "wall_s": round(time.perf_counter() - start, 1),
        "hparams": agent.hparams,
        "arch": {k: agent.arch[k] for k in ("latent_size", "width", "blocks", "lstm_hidden_size", "value_support",
                                            "reward_support")},
        "arch_overrides": arch,
        "task": TASK,
        "torch_threads": 1,
        "machine": cpu_name(),
        "curve": curve,
    }
    print(json.dumps({k: out[k] for k in ("env_steps_to_195", "wall_s_to_195", "final_eval_return", "env_steps", "updates")}))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2, default=str)


if __name__ == "__main__":
    main()
