"""AgileRL's DQN with its evolutionary HPO on CartPole-v1 (or another id), run the way its users run it.

This script runs inside AgileRL's own virtual environment (`benchmarks.hpo.agilerl_peer` makes it), so it
imports AgileRL, gymnasium, numpy, torch and minatar only, never evo. It calls `train_off_policy` unchanged,
with the settings of AgileRL's shipped DQN config (configs/training/dqn/dqn.yaml: population 4,
tournament 2 with elitism, the mutation probabilities, the lr/batch/learn_step ranges, the network)
on CartPole-v1 (`--env-id`: another gymnasium id; a MinAtar id gets the MinAtar paper's network as its
image encoder, the shipped config having none), and records a curve point at every evolution step: the total env steps the
population has trained on, the seconds since training started, and the best member (by AgileRL's
own fitness) evaluated on 10 greedy episodes. That extra evaluation is the benchmark's, so its time
is taken off the clock and its steps are not counted. The run stops after the last round that fits
in the env-step budget (rounds are whole multiples of the 16 envs, so a budget that is not one ends
up to a round short of it, never past it).

    python agilerl_runner.py --seed 0 --budget 48000 --evo-steps 2000 --out curve.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import gymnasium as gym
import numpy as np
import torch

# the shipped DQN config (configs/training/dqn/dqn.yaml in AgileRL's repository), with ENV_NAME set to
# CartPole-v1, no early stop at TARGET_SCORE (the benchmark stops on its budget) and no W&B
INIT_HP = {
    "ALGO": "DQN", "DOUBLE": False, "NUM_ENVS": 16, "BATCH_SIZE": 128, "CUDAGRAPHS": False, "LR": 6.3e-4,
    "GAMMA": 0.99, "MEMORY_SIZE": 50_000, "LEARN_STEP": 4, "TAU": 0.001, "TOURN_SIZE": 2, "ELITISM": True,
    "POP_SIZE": 4, "EVO_STEPS": 10_000, "EVAL_STEPS": None, "EVAL_LOOP": 1, "LEARNING_DELAY": 0,
    "EPS_DECAY": 0.99, "EPS_START": 1.0, "EPS_END": 0.1,
}
MUTATION_PARAMS = {
    "NO_MUT": 0.4, "ARCH_MUT": 0.2, "NEW_LAYER": 0.2, "PARAMS_MUT": 0.2, "ACT_MUT": 0.2, "RL_HP_MUT": 0.2,
    "MUT_SD": 0.1, "MIN_LR": 0.0000625, "MAX_LR": 0.01, "MIN_BATCH_SIZE": 8, "MAX_BATCH_SIZE": 512,
    "MIN_LEARN_STEP": 1, "MAX_LEARN_STEP": 10,
}
NET_CONFIG = {"latent_dim": 128, "encoder_config": {"hidden_size": [256]}, "head_config": {"hidden_size": [256]}}
# MinAtar's 10x10 images: the shipped config has no image encoder, so the MinAtar paper's DQN network
# (Young & Tian 2019: one 3x3 convolution of 16 channels, stride 1, then 128 hidden units) as AgileRL's
# evolvable CNN encoder and MLP head; everything else is the shipped config's
MINATAR_NET_CONFIG = {"latent_dim": 128, "encoder_config": {"channel_size": [16], "kernel_size": [3], "stride_size": [1]},
                      "head_config": {"hidden_size": [128]}}
ENV_ID = "CartPole-v1"


def make_env(env_id: str) -> gym.Env:
    """One env: gymnasium's id as it is; a MinAtar id registered (gymnasium 1.x no longer loads the
    package's ids) and served as AgileRL reads images, channel-first uint8 0/255 (its default
    normalize_images divides by 255)."""
    if not env_id.startswith("MinAtar/"):
        return gym.make(env_id)
    from minatar.gym import register_envs

    if env_id not in gym.registry:
        register_envs()
    env = gym.make(env_id)
    h, w, c = env.observation_space.shape
    space = gym.spaces.Box(0, 255, (c, h, w), np.uint8)
    return gym.wrappers.TransformObservation(
        env, lambda o: np.ascontiguousarray(np.transpose(o, (2, 0, 1)), dtype=np.uint8) * np.uint8(255), space)


def net_config(env_id: str) -> dict:
    return MINATAR_NET_CONFIG if env_id.startswith("MinAtar/") else NET_CONFIG


class BudgetSpent(Exception):
    """Raised from the evolution-step hook once the population has trained on the whole budget."""


def greedy_return(agent, env_id: str, episodes: int, seed: int) -> float:
    """Mean return of `episodes` greedy episodes (one per env of a vector env), AgileRL's own actions."""
    env = gym.vector.SyncVectorEnv([lambda: make_env(env_id) for _ in range(episodes)])
    obs, _ = env.reset(seed=seed)
    scores, done = np.zeros(episodes), np.zeros(episodes, dtype=bool)
    agent.set_training_mode(False)
    with torch.no_grad():
        while not done.all():
            obs, reward, term, trunc, _ = env.step(agent.get_action(obs, epsilon=0.0))
            scores += np.where(done, 0.0, reward)
            done |= term | trunc
    agent.set_training_mode(True)
    env.close()
    return float(scores.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=int, required=True, help="env steps of all members together")
    parser.add_argument("--evo-steps", type=int, default=INIT_HP["EVO_STEPS"], help="env steps per member per evolution step")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--out", required=True)
    parser.add_argument("--env-id", default=ENV_ID, help="a gymnasium id, MinAtar/<Game>-v1 included")
    args = parser.parse_args()

    import agilerl
    from agilerl.algorithms.core.registry import HyperparameterConfig, RLParameter
    from agilerl.components.replay_buffer import ReplayBuffer
    from agilerl.hpo.mutation import Mutations
    from agilerl.hpo.tournament import TournamentSelection
    from agilerl.population import Population
    from agilerl.training.train_off_policy import train_off_policy
    from agilerl.utils.utils import create_population, make_vect_envs

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.set_num_threads(1)
    hp, mp = dict(INIT_HP, EVO_STEPS=args.evo_steps), MUTATION_PARAMS
    env = make_vect_envs(num_envs=hp["NUM_ENVS"], make_env=lambda: make_env(args.env_id))
    hp_config = HyperparameterConfig(
        lr=RLParameter(min=mp["MIN_LR"], max=mp["MAX_LR"]),
        batch_size=RLParameter(min=mp["MIN_BATCH_SIZE"], max=mp["MAX_BATCH_SIZE"], dtype=int),
        learn_step=RLParameter(min=mp["MIN_LEARN_STEP"], max=mp["MAX_LEARN_STEP"], dtype=int, grow_factor=1.5,
                               shrink_factor=0.75),
    )
    pop = create_population(hp["ALGO"], net_config(args.env_id), hp, observation_space=env.single_observation_space,
                            action_space=env.single_action_space, hp_config=hp_config, population_size=hp["POP_SIZE"],
                            num_envs=hp["NUM_ENVS"], device="cpu")
    memory = ReplayBuffer(max_size=hp["MEMORY_SIZE"], device="cpu")
    tournament = TournamentSelection(hp["TOURN_SIZE"], hp["ELITISM"], hp["POP_SIZE"])
    mutations = Mutations(no_mutation=mp["NO_MUT"], architecture=mp["ARCH_MUT"], new_layer_prob=mp["NEW_LAYER"],
                          parameters=mp["PARAMS_MUT"], activation=mp["ACT_MUT"], rl_hp=mp["RL_HP_MUT"],
                          mutation_sd=mp["MUT_SD"], rand_seed=args.seed, device="cpu")

    steps_per_round = hp["POP_SIZE"] * (args.evo_steps // hp["NUM_ENVS"]) * hp["NUM_ENVS"]
    record = {"curve": [], "rounds": 0, "eval_seconds": 0.0, "hpo_eval_rounds": 0}
    clock = {"start": None, "paused": 0.0}
    original = Population.increment_evo_step

    def at_evolution_step(self: Population) -> None:
        """After every member trained and was tested (AgileRL's fitness), before selection."""
        original(self)
        t_eval = time.perf_counter()
        record["rounds"] += 1
        agents = list(self.agents)
        fitness = [float(a.fitness[-1]) if len(a.fitness) else float("-inf") for a in agents]
        best = agents[int(np.argmax(fitness))]
        score = greedy_return(best, args.env_id, args.eval_episodes, seed=10_000 + record["rounds"])
        clock["paused"] += time.perf_counter() - t_eval
        seconds = time.perf_counter() - clock["start"] - clock["paused"]
        steps = record["rounds"] * steps_per_round
        record["curve"].append([steps, round(seconds, 2), score])
        record.setdefault("agilerl_fitness", []).append(fitness)
        print(json.dumps({"env_steps": steps, "seconds": round(seconds, 1), "best": score, "fitness": fitness}), flush=True)
        if steps + steps_per_round > args.budget:  # the next round would pass the budget: stop within it
            raise BudgetSpent

    Population.increment_evo_step = at_evolution_step
    clock["start"] = time.perf_counter()
    try:
        train_off_policy(env, args.env_id, hp["ALGO"], pop, memory=memory, init_hp=hp, mut_p=mp,
                         max_steps=10 * args.budget,  # the hook stops the run when the budget is spent
                         evo_steps=args.evo_steps, eval_steps=hp["EVAL_STEPS"], eval_loop=hp["EVAL_LOOP"],
                         learning_delay=hp["LEARNING_DELAY"], eps_start=hp["EPS_START"], eps_end=hp["EPS_END"],
                         eps_decay=hp["EPS_DECAY"], target=None, tournament=tournament, mutation=mutations,
                         wb=False, verbose=False)
    except BudgetSpent:
        pass
    finally:
        Population.increment_evo_step = original
        try:
            env.close()
        except Exception:  # already closed by AgileRL
            pass
    out = {
        "curve": record["curve"],
        "agilerl_fitness": record.get("agilerl_fitness", []),
        "benchmark_eval_seconds_excluded": round(clock["paused"], 2),
        "versions": {"agilerl": agilerl.__version__ if hasattr(agilerl, "__version__") else _version("agilerl"),
                     "torch": torch.__version__, "gymnasium": gym.__version__},
        "settings": {"INIT_HP": hp, "MUTATION_PARAMS": mp, "NET_CONFIG": net_config(args.env_id), "env_id": args.env_id,
                     "steps_per_round": steps_per_round},
        "pid": os.getpid(),
    }
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=2, default=str)


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
