"""What a member's greedy play does (issue 23's Asterix diagnosis): one EfficientZero member of a
suite file trained alone, and after each checkpoint its search played on the evaluation starts,
counting the share of each action, the return and the episode length, beside a random policy.

    python -m benchmarks.greedy_play FILE STEPS[,STEPS...] ['{"policy_entropy_weight": 0.05}'] [--episodes N] [--json OUT]

STEPS are the env-step counts at which the member is examined (trained in chunks of 5,000). At each,
its search plays `--episodes` (30) episodes from the evaluation starts of seed 0 at (simulations,
temperature) = (the file's, 0), (32, 0) and (the file's, 1): greedy, greedy with a deeper search, and
sampled as collection samples. The JSON overrides the file's [agent.hparams] starting values (seed 0;
the keys as `benchmarks.explore_probe`'s, which builds the member). One
member, no evolution, no Ray: env steps are that member's. Results: docs/efficientzero.md, "Asterix".
"""

from __future__ import annotations

import collections
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

CHUNK = 5000


RULES = ("lowest_index", "prior", "random")


def tied_rows(visits: np.ndarray) -> np.ndarray:
    """Per row of root visit counts: is its top count shared by more than one action?"""
    return (visits == visits.max(1, keepdims=True)).sum(1) > 1


def tie_break_scores(visits: np.ndarray, prior: np.ndarray, rule: str, rng: np.random.Generator) -> np.ndarray:
    """Root visit counts with less than one visit added so that their argmax breaks ties among the most
    visited actions by `rule`: the lowest index (as `select_actions` at temperature 0: nothing added), the
    highest `prior`, or uniformly at random. Untied rows keep their argmax."""
    if rule not in RULES:
        raise ValueError(f"rule: expected one of {RULES}, found {rule!r}")
    score = np.asarray(visits, dtype=np.float64)
    if rule == "prior":
        return score + 0.5 * np.asarray(prior)  # priors are at most 1
    if rule == "random":
        return score + 0.5 * rng.random(score.shape)
    return score


def play(agent: Any, task: dict[str, Any], episodes: int, simulations: int | None, temperature: float,
         rng: np.random.Generator, cap: int = 1000, run_seed: int = 0,
         choose: Callable[[Any, np.random.Generator], np.ndarray] | None = None) -> dict[str, Any]:
    """`episodes` episodes from the evaluation starts of `run_seed` (an episode ends at the env's end or after
    `cap` steps); `simulations` None plays uniformly at random. The search's actions are `choose(result, rng)`,
    by default `chosen_actions` at `temperature`. `tied_share`: of the moves played, the share whose search
    had its top visit count shared (0 without a search)."""
    import torch

    from agents.efficientzero.envs import EnvPool
    from agents.efficientzero.mcts import BatchedMCTS, MCTSConfig
    from agents.efficientzero.selfplay import chosen_actions, evaluation_seed

    pool = EnvPool(task, episodes)
    for i in range(episodes):
        pool.reset_to(i, evaluation_seed(run_seed, i))
    n_actions = pool.envs[0].action_space.n
    mcts = None if simulations is None else BatchedMCTS(MCTSConfig.from_hparams(agent.hparams, simulations))
    choose = choose or (lambda result, gen: chosen_actions(result, temperature, gen))
    agent.model.eval()
    counts: collections.Counter = collections.Counter()
    returns, lengths, done = np.zeros(episodes), np.zeros(episodes, dtype=np.int64), np.zeros(episodes, dtype=bool)
    tied = np.zeros(episodes, dtype=bool)
    ties = 0
    while not done.all():
        if mcts is None:
            actions = rng.integers(0, n_actions, episodes)
        else:
            with torch.inference_mode():
                result = mcts.run(agent.model, torch.as_tensor(pool.observations(), dtype=torch.float32), None,
                                  add_noise=False)
            tied = tied_rows(result.visit_counts)
            actions = choose(result, rng)
        for i in np.flatnonzero(~done):
            counts[int(actions[i])] += 1
            ties += int(tied[i])
            _, reward, term, trunc, _ = pool.step(i, int(actions[i]))
            returns[i] += reward
            lengths[i] += 1
            done[i] = term or trunc or lengths[i] >= cap
    total = sum(counts.values())
    return {"return": float(returns.mean()), "se": float(returns.std() / np.sqrt(episodes)),
            "length": float(lengths.mean()), "action_share": [round(counts[a] / total, 3) for a in range(n_actions)],
            "tied_share": round(ties / max(total, 1), 3)}


def examine(file: str, checkpoints: list[int], overrides: dict[str, Any], episodes: int = 30) -> dict[str, Any]:
    from benchmarks.explore_probe import one_member

    agent, _, _, task, _ = one_member({"file": file, **overrides})
    rng = np.random.default_rng(1)
    sims = int(agent.hparams["num_simulations"])
    out: dict[str, Any] = {"file": file, "overrides": overrides, "episodes": episodes,
                           "random": play(agent, task, episodes, None, 0.0, rng), "checkpoints": []}
    print("random", out["random"], flush=True)
    for steps in sorted(checkpoints):
        train_return = None
        while agent.env_steps < steps:
            train_return = agent.train(min(CHUNK, steps - agent.env_steps)).get("train_episode_return")
        row: dict[str, Any] = {"env_steps": agent.env_steps, "train_episode_return": train_return, "plays": []}
        for simulations, temperature in [(sims, 0.0), (32, 0.0), (sims, 1.0)]:
            row["plays"].append({"simulations": simulations, "temperature": temperature,
                                 **play(agent, task, episodes, simulations, temperature, rng)})
            print(steps, row["plays"][-1], flush=True)
        out["checkpoints"].append(row)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = list(sys.argv[1:] if argv is None else argv)
    options = {"--json": None, "--episodes": "30"}
    for flag in options:
        if flag in args:
            i = args.index(flag)
            options[flag] = args[i + 1]
            del args[i:i + 2]
    if len(args) < 2:
        raise SystemExit(__doc__)
    checkpoints = [int(s) for s in args[1].split(",")]
    result = examine(args[0], checkpoints, json.loads(args[2]) if len(args) > 2 else {}, int(options["--episodes"]))
    if options["--json"]:
        Path(options["--json"]).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
