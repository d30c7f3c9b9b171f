"""Gumbel against PUCT root search at equal simulations: single EfficientZero agents, side by side.

    python -m benchmarks.search_ab [--env CartPole-v1] [--simulations 8] [--seeds 0 1 2]
                                   [--budget 8000] [--eval-every 1000] --json OUT

For every seed the two searches train in turn in one process (seed s: puct, then gumbel; then seed
s+1), so machine load falls on both alike. Each agent has the CartPole defaults of
benchmarks.efficientzero (discount 0.99) with `search` and `num_simulations` set; after every
`--eval-every` env steps it plays 10 greedy evaluation episodes (the same starts for both). The JSON
holds each run's curve [env_steps, wall_s, eval_return] and the load average beside every run.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from agents.efficientzero.agent import EfficientZeroAgent
from evo.agent import AgentContext
from evo.replay import build_replay


def train_curve(env_id: str, search: str, sims: int, seed: int, budget: int, every: int,
                extra: dict | None = None) -> dict:
    task = {"env_id": env_id, "num_envs": 8, "eval_episodes": 10}
    hp = {"discount": 0.99, "search": search, "num_simulations": sims, **(extra or {})}
    replay = build_replay(EfficientZeroAgent.replay_spec(task), seed, distributed=False)
    agent = EfficientZeroAgent.create({}, hp, seed, 0, AgentContext(task=task, replay=replay, seed=seed))
    load0, t0, curve = os.getloadavg()[0], time.perf_counter(), []
    while agent.env_steps < budget:
        agent.train(every)
        ev = agent.evaluate()
        curve.append([agent.env_steps, round(time.perf_counter() - t0, 1), ev.fitness])
        print(json.dumps({"search": search, "seed": seed, "point": curve[-1]}), flush=True)
    return {"search": search, "seed": seed, "simulations": sims, "curve": curve, "hparams": hp,
            "loadavg_start": round(load0, 2), "loadavg_end": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--simulations", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=8000)
    parser.add_argument("--eval-every", type=int, default=1000)
    parser.add_argument("--kinds", nargs="+", default=["puct", "gumbel"], choices=["puct", "gumbel"])
    parser.add_argument("--hp", default="{}", help="more hyperparameters for both, as JSON (e.g. collect_temperature)")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = []
    for seed in args.seeds:
        for search in args.kinds:
            runs.append(train_curve(args.env, search, args.simulations, seed, args.budget, args.eval_every,
                                    json.loads(args.hp)))
            Path(args.json).write_text(json.dumps({"env": args.env, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()


def tie_stats(agent: EfficientZeroAgent, seed: int = 0) -> dict:
    """Greedy evaluation's visit ties (issue 23's suspect: argmax breaks them toward action 0): the
    share of evaluation steps whose top visit count is shared, and the evaluation return on the
    same starts with ties broken by lowest index (as shipped) and uniformly at random. The share counts
    every searched row, and the evaluation searches finished envs too (their last observation), so it
    is not the share of moves played; `greedy_play.play`'s `tied_share` is (the numbers in
    docs/efficientzero.md were made with this one)."""
    from agents.efficientzero.mcts import BatchedMCTS, MCTSConfig, SearchResult
    from agents.efficientzero.selfplay import drive
    from benchmarks.greedy_play import tie_break_scores, tied_rows

    mcts = BatchedMCTS(MCTSConfig.from_hparams(agent.hparams))
    out = {}
    for rule in ("lowest_index", "random"):
        rng = np.random.default_rng(seed)
        steps = ties = 0

        def search(obs, rule=rule, rng=rng):
            nonlocal steps, ties
            res = mcts.run(agent.model, torch.as_tensor(obs, dtype=torch.float32), None, add_noise=False)
            steps += len(res.visit_counts)
            ties += int(tied_rows(res.visit_counts).sum())
            counts = tie_break_scores(res.visit_counts, res.root_prior, rule, rng)
            return SearchResult(counts, res.root_values, res.policy, res.root_prior, res.action)

        metrics = drive(agent.selfplay.evaluation(agent.context.seed), search)
        out[rule] = {"eval_return": metrics["eval_return"], "tied_share": round(ties / max(steps, 1), 3)}
    return out


def ties_main() -> None:
    """python -c 'from benchmarks.search_ab import ties_main; ties_main()' SEED BUDGET OUT"""
    import sys

    seed, budget, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    task = {"env_id": "CartPole-v1", "num_envs": 8, "eval_episodes": 10}
    replay = build_replay(EfficientZeroAgent.replay_spec(task), seed, distributed=False)
    agent = EfficientZeroAgent.create({}, {"discount": 0.99}, seed, 0, AgentContext(task=task, replay=replay, seed=seed))
    points = []
    while agent.env_steps < budget:
        agent.train(2000)
        points.append({"env_steps": agent.env_steps, "loadavg": round(os.getloadavg()[0], 2), **tie_stats(agent)})
        print(json.dumps(points[-1]), flush=True)
        Path(path).write_text(json.dumps(points, indent=1))
