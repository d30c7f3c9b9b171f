"""Where a MinAtar Breakout member's greedy play stands (issue 23's plateau near 3.5): a scripted policy
that keeps the paddle under the ball, played on a run's starts, and for a finished suite run the
visit ties of its last elite's greedy search, with the return when ties are broken three ways.

    python -m benchmarks.breakout_plateau [--run runs/suite/minatar_breakout_s0_vXXXX] [--run-seed 1000]
                                          [--episodes 50] --json OUT

`--run-seed` picks the starts as `SelfPlay.evaluation` does (`evaluation_seed(run_seed, i)`): a suite
run of seed s evaluates on s's and is held out on s + 1000's (evo.heldout). The scripted policy moves
toward the ball's column (MinAtar's channels: 0 paddle, 1 ball; actions: none, left, right) and is a
reference for what tracking alone scores; a random policy plays the same starts beside it. With
`--run`, the run's last elite plays its greedy search (no noise, its own simulations) on those starts,
the steps whose top visit count is shared are counted, and ties are broken by lowest index (as
shipped), by the network's prior and uniformly at random. Results: docs/benchmarks.md, "Breakout's
plateau near 3.5".
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.greedy_play import RULES, play, tie_break_scores

TASK = {"env_id": "MinAtar/Breakout-v1"}
PADDLE, BALL = 0, 1
NONE, LEFT, RIGHT = 0, 1, 2


def tracking_action(obs: np.ndarray) -> int:
    """Move the paddle toward the ball's column ([C, H, W] observation); stay when level or no ball."""
    paddle = np.argwhere(obs[PADDLE])
    ball = np.argwhere(obs[BALL])
    if len(paddle) == 0 or len(ball) == 0:
        return NONE
    dx = int(ball[0][1]) - int(paddle[0][1])
    return NONE if dx == 0 else (LEFT if dx < 0 else RIGHT)


def play_scripted(policy: Callable[[np.ndarray], int], episodes: int, run_seed: int, cap: int = 1000) -> dict[str, float]:
    """`policy` on `episodes` episodes from the starts of `run_seed`; mean and std of the return, mean length."""
    from agents.efficientzero.envs import make_env
    from agents.efficientzero.selfplay import evaluation_seed

    env = make_env(TASK)
    returns, lengths = [], []
    for i in range(episodes):
        obs, _ = env.reset(seed=evaluation_seed(run_seed, i))
        total, steps, done = 0.0, 0, False
        while not done and steps < cap:
            obs, reward, term, trunc, _ = env.step(policy(obs))
            total, steps, done = total + float(reward), steps + 1, term or trunc
        returns.append(total)
        lengths.append(steps)
    return {"mean": float(np.mean(returns)), "std": float(np.std(returns)), "length": float(np.mean(lengths)),
            "episodes": episodes}


def tie_broken_argmax(visits: np.ndarray, prior: np.ndarray, rule: str, rng: np.random.Generator) -> np.ndarray:
    """Per row, the most visited action; among tied ones the lowest index (as `select_actions` at
    temperature 0), the highest `prior`, or one drawn uniformly (`greedy_play.tie_break_scores`)."""
    return tie_break_scores(visits, prior, rule, rng).argmax(1)


def elite_ties(run_path: str | Path, episodes: int, run_seed: int) -> dict[str, Any]:
    """The last elite of the run at `run_path`, searched greedily on `episodes` starts of `run_seed`: per
    tie-break rule, the mean return and length, and the share of its moves whose top visit count was shared
    (episodes end as the run's evaluation ends them: at the env's end or after `eval_max_steps`)."""
    from evo.api import open_run

    agent = open_run(run_path).elite()
    hp = agent.hparams
    simulations = int(hp["eval_simulations"]) or int(hp["num_simulations"])
    out: dict[str, Any] = {"hparams": {k: hp[k] for k in ("num_simulations", "search", "lr")}}
    for rule in RULES:
        played = play(agent, agent.selfplay.task, episodes, simulations, 0.0, np.random.default_rng(0),
                      cap=int(agent.selfplay.task["eval_max_steps"]), run_seed=run_seed,
                      choose=lambda result, rng, rule=rule: tie_broken_argmax(result.visit_counts, result.root_prior,
                                                                             rule, rng))
        out[rule] = {"eval_return": played["return"], "eval_length": played["length"],
                     "tied_share": played["tied_share"]}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", help="a finished suite run of MinAtar Breakout (its RunStore folder)")
    parser.add_argument("--run-seed", type=int, default=1000, help="whose starts: s (evaluation) or s + 1000 (held out)")
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error("--episodes: expected at least 1")
    rng = np.random.default_rng(args.run_seed)
    result: dict[str, Any] = {
        "run_seed": args.run_seed, "loadavg": [round(x, 2) for x in os.getloadavg()],
        "tracking": play_scripted(tracking_action, args.episodes, args.run_seed),
        "random": play_scripted(lambda obs: int(rng.integers(3)), args.episodes, args.run_seed),
    }
    if args.run:
        result["run"] = str(args.run)
        result["elite"] = elite_ties(args.run, args.episodes, args.run_seed)
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
