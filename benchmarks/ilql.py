"""ILQL vs behaviour cloning on the same offline data, one agent, side by side.

    python -m benchmarks.ilql [--quick] [--task randomwalks|wordle|both] --json OUT.json

Trains one ILQL member (through the Agent protocol, drawing from the shared replay store) and
evaluates the same network two ways:
* BC   : β = 0, sampling at temperature 1 — the behaviour policy the data came from;
* ILQL : β = inference_beta, greedy (top-k 1) — the policy perturbed by min Qt − V.
randomwalks fields: bc_optimality, ilql_optimality, data_optimality, train_steps, tokens_per_s,
wall_s. Wordle fields (prefixed wordle_): BC and ILQL mean return and win rate, plus the data's
and the expert's. tokens_per_s counts real (non-padding) training tokens per second of training.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from typing import Any

import numpy as np
import torch

from agents.ilql.agent import ILQLAgent
from agents.ilql.tasks import make_task
from evo.agent import AgentContext
from evo.replay import build_replay

SETTINGS = {
    "randomwalks": {
        "task": {"task": "randomwalks"},
        "arch": {"n_layer": 2, "n_embd": 64, "n_head": 2, "dim_feedfwd": 256, "block_size": 16},
        "hparams": {"lr": 1e-3, "batch_size": 64, "alpha": 0.05, "tau": 0.7, "cql_weight": 0.1, "inference_beta": 10.0},
        "steps": 1000, "quick_steps": 300, "eval_samples": 32,
    },
    "wordle": {
        "task": {"task": "wordle"},
        "arch": {"n_layer": 2, "n_embd": 64, "n_head": 4, "dim_feedfwd": 256, "block_size": 64},
        "hparams": {"lr": 1e-3, "batch_size": 32, "alpha": 0.05, "tau": 0.7, "cql_weight": 0.1, "inference_beta": 4.0},
        "steps": 3000, "quick_steps": 400, "eval_samples": 2,
    },
}


def run_task(name: str, quick: bool, seed: int) -> dict[str, Any]:
    s = SETTINGS[name]
    task_cfg = ILQLAgent.validate_task({**s["task"], "eval_samples": s["eval_samples"]})
    t0 = time.perf_counter()
    store = build_replay(ILQLAgent.replay_spec(task_cfg), seed, distributed=False)
    setup_s = time.perf_counter() - t0
    context = AgentContext(task=task_cfg, replay=store, seed=seed)
    agent = ILQLAgent.create(ILQLAgent.validate_arch(s["arch"]), s["hparams"], seed=seed, index=0, context=context)
    task = make_task(task_cfg)
    steps = s["quick_steps"] if quick else s["steps"]
    tokens_per_row = float(np.mean([len(e.tokens) for e in task.episodes()]))

    t1 = time.perf_counter()
    losses = agent.train(steps)
    train_s = time.perf_counter() - t1

    g = torch.Generator().manual_seed(seed)
    extra = {"mask_invalid": True} if name == "randomwalks" else {}
    t2 = time.perf_counter()
    bc = task.evaluate(agent.ilql.model, 0.0, samples=s["eval_samples"], temperature=1.0, top_k=0, generator=g, **extra)
    bc_greedy = task.evaluate(agent.ilql.model, 0.0, samples=1, top_k=1, generator=g, **extra)
    ilql = task.evaluate(agent.ilql.model, float(agent.hparams["inference_beta"]), samples=s["eval_samples"],
                         top_k=1, generator=g, **extra)
    eval_s = time.perf_counter() - t2
    out: dict[str, Any] = {
        "train_steps": steps,
        "batch_size": agent.hparams["batch_size"],
        "tokens_per_s": steps * agent.hparams["batch_size"] * tokens_per_row / train_s,
        "train_s": train_s,
        "eval_s": eval_s,
        "setup_s": setup_s,
        "inference_beta": agent.hparams["inference_beta"],
        "final_losses": losses,
    }
    if name == "randomwalks":
        out.update({"bc_optimality": bc["optimality"], "bc_greedy_optimality": bc_greedy["optimality"],
                    "ilql_optimality": ilql["optimality"], "data_optimality": task.data_optimality()})
    else:
        data, expert = task.data_stats(), task.expert_stats()
        out.update({"bc_return": bc["mean_return"], "bc_win_rate": bc["win_rate"],
                    "bc_greedy_return": bc_greedy["mean_return"], "bc_greedy_win_rate": bc_greedy["win_rate"],
                    "ilql_return": ilql["mean_return"], "ilql_win_rate": ilql["win_rate"],
                    "data_return": data["mean_return"], "data_win_rate": data["win_rate"],
                    "expert_return": expert["mean_return"], "expert_win_rate": expert["win_rate"]})
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ilql", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short training (about a minute in all)")
    parser.add_argument("--task", choices=["randomwalks", "wordle", "both"], default="both")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 is fastest on 2 cores)")
    parser.add_argument("--json", metavar="OUT.json", help="write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    result: dict[str, Any] = {"benchmark": "ilql", "quick": args.quick, "seed": args.seed, "threads": args.threads,
                              "torch": torch.__version__, "python": platform.python_version()}
    if args.task in ("randomwalks", "both"):
        result.update(run_task("randomwalks", args.quick, args.seed))
    if args.task in ("wordle", "both"):
        result.update({f"wordle_{k}": v for k, v in run_task("wordle", args.quick, args.seed).items()})
    result["wall_s"] = time.perf_counter() - start

    keys = [k for k in ("bc_optimality", "bc_greedy_optimality", "ilql_optimality", "data_optimality",
                        "wordle_bc_return", "wordle_bc_win_rate", "wordle_ilql_return", "wordle_ilql_win_rate",
                        "wordle_data_return", "wordle_expert_return", "train_steps", "wordle_train_steps",
                        "tokens_per_s", "wordle_tokens_per_s", "wall_s") if k in result]
    for k in keys:
        v = result[k]
        print(f"{k:>24}: {v:.3f}" if isinstance(v, float) else f"{k:>24}: {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, sort_keys=True)
    return result


if __name__ == "__main__":
    main()
