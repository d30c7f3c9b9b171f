"""`evo new`: a commented experiment file to start from, for a gymnasium environment or a JSONL file.

    evo new --env CartPole-v1 > mine.toml           # EfficientZero on any discrete-action gymnasium id
    evo new --jsonl data.jsonl > mine.toml          # ILQL on your episodes (docs/ilql.md's format)
    evo new --jsonl data.jsonl --pretrained DIR     # ... starting from a local GPT-2-family model

The environment id is looked up in gymnasium's registry (with a suggestion when it is misspelt),
then the whole file is validated exactly as `evo run` would (the agent makes the environment, or
scans every line of the data) before a character is written: bad input is a `SpecError` and
nothing is printed. Values are the checked-in experiments' (experiments/). A vector env's file is
issue 23's "works" default: the same for every env id (only `env_id` and `name` differ), up to
400,000 env steps and stopped at the env's own threshold (`population.stop_at_score = "task"`), so
CartPole ends in minutes and MountainCar gets the budget it needs (docs/benchmarks.md, "The defaults a
user gets"). An image env's file is scaled to a first run of a few minutes on a laptop.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from evo.spec import SpecError, parse_experiment

__all__ = ["new_experiment", "ENV_AGENTS"]

#: agents that learn from a gymnasium environment (the engine knows them only by name: evo.registry)
ENV_AGENTS = ("efficientzero",)

_HEADER = """\
# {title}
# Written by `{command}`. Run it with:
#   evo run {file}                       (add --backend inline to stay in this process)
#   evo run {file} --set population.size=8 --set population.generations=20
# Every table is explained in docs/experiments.md; the agent's own keys in {agent_doc}.
name = "{name}"
seed = 0
backend = "ray"                   # "ray": members on local cores (or a cluster: --address); "inline": this process
"""

_EVOLUTION = """
[selection]
tournament_size = 2               # parents win a tournament of this many members
elitism = true                    # the best member survives unmutated
fitness_window = 2                # score = mean of a member's last 2 evaluations

[mutation]                        # relative probabilities; one kind is drawn per child
no_mutation = 0.4
architecture = 0.2                # add/remove a layer or nodes (function-preserving where possible)
new_layer = 0.3
parameters = 0.1                  # Gaussian noise on the weights
mutation_sd = 0.05
activation = 0.1
activation_choices = {activations}
rl_hp = 0.2                       # move one hyperparameter within its range below

[resources]
cpus_per_member = 1
gpus_per_member = 0               # e.g. 1 (or 0.25 to share a GPU); needs CUDA, else evo refuses at once
"""

_EZ_VECTOR = """
[population]
size = 4                          # members
generations = 10                  # at most: 400,000 env steps in all, unless the task is solved first (below)
steps_per_generation = 10000      # env steps each member collects before it is judged: on a sparse task
                                  # (MountainCar) shorter rounds let blind selection overwrite members that were
                                  # learning before their evaluation showed it (docs/benchmarks.md)
stop_at_score = "task"            # stop once a member scores the env's reward_threshold (CartPole-v1 475,
                                  # LunarLander-v3 200, MountainCar-v0 -110); none: all generations run
initial = "same"                  # or "sample": founders draw their hyperparameters from the ranges

[agent]
kind = "efficientzero"

[agent.task]
env_id = "{env_id}"
num_envs = 8                      # vector environments searched as one MCTS batch
eval_episodes = 10                # fitness = mean return of this many greedy episodes
eval_max_steps = 2000
replay_capacity = 100000          # rows of the shared replay store (all members together)
min_replay = 256                  # no gradient update before this many rows

[agent.arch]                      # observation {obs_shape}: the MLP variant
latent_size = 64
width = 64
blocks = [64]
lstm_hidden_size = 64
value_support = 25
reward_support = 5
activation = "ReLU"
max_blocks = 3
max_width = 256

[agent.hparams]                   # a value, or a range evolution moves within
lr = {{ value = 3e-3, min = 1e-4, max = 1e-2, scale = "log" }}
num_simulations = {{ value = 16, min = 8, max = 32, kind = "int" }}
td_steps = {{ value = 5, min = 3, max = 10, kind = "int" }}
discount = {{ value = 0.99, min = 0.97, max = 0.997 }}
collect_temperature = {{ value = 1.0, min = 0.25, max = 1.0 }}
replay_ratio = {{ value = 0.25, min = 0.1, max = 0.5 }}   # gradient updates per environment step
consistency_weight = {{ value = 2.0, min = 0.5, max = 4.0 }}
target_update_interval = {{ value = 100, min = 50, max = 400, kind = "int" }}
batch_size = {{ value = 128, min = 64, max = 256, kind = "int" }}
reanalyse_ratio = {{ value = 0.0, min = 0.0, max = 0.25 }}   # share of sampled targets re-searched with MCTS
# exploration while collecting: with probability 0.2 per step a random action held for n ~ zeta(1) steps
# (what finds MountainCar's flag; docs/efficientzero.md, "Exploration")
explore_epsilon = {{ value = 0.2, min = 0.0, max = 0.5 }}
explore_duration_mu = {{ value = 1.0, min = 1.0, max = 3.0 }}
"""

_EZ_IMAGE = """
[population]
size = 2                          # members
generations = 6
steps_per_generation = 1600       # environment steps each member collects per generation
initial = "same"                  # or "sample": founders draw their hyperparameters from the ranges

[agent]
kind = "efficientzero"

[agent.task]
env_id = "{env_id}"
num_envs = 8
eval_episodes = 8                 # fitness = mean return of this many greedy episodes
eval_max_steps = 500
replay_capacity = 50000
segment_length = 200
min_replay = 400

{note}[agent.arch]                      # observation {obs_shape}: the convolutional variant
variant = "conv"
channels = 16
num_res_blocks = 1
reward_head_channels = 4
head_channels = 4
width = 32
lstm_hidden_size = 32
fc_reward_layers = [32]
proj_size = 64
value_support = 10
reward_support = 5
downsample = {downsample}
norm_type = "LN"
min_res_blocks = 1
max_res_blocks = 3

[agent.hparams]
lr = {{ value = 3e-3, min = 3e-4, max = 1e-2, scale = "log" }}
num_simulations = {{ value = 16, min = 8, max = 32, kind = "int" }}
replay_ratio = {{ value = 0.25, min = 0.1, max = 0.5 }}
batch_size = {{ value = 64, min = 32, max = 128, kind = "int" }}
"""

_ILQL = """
[population]
size = 4                          # members
generations = 5
steps_per_generation = 500        # gradient updates each member makes per generation
initial = "same"                  # or "sample": founders draw their hyperparameters from the ranges

[agent]
kind = "ilql"

[agent.task]
task = "jsonl"
path = "{path}"                   # relative to the directory you run evo in
tokenizer = "{tokenizer}"{tokenizer_note}
# env = "mypackage.games:TextGame"  # a text environment to score members by acting (docs/ilql.md);
#                                   # without one, fitness = - ILQL loss on held-out rows of the file
eval_top_k = 1

[agent.arch]
{arch}
min_layers = 1
max_layers = {max_layers}

[agent.hparams]
lr = {{ value = 1e-3, min = 1e-4, max = 5e-3, scale = "log" }}
batch_size = 32
alpha = {{ value = 0.05, min = 0.005, max = 0.5, scale = "log" }}    # Polyak rate of the target Q heads
tau = {{ value = 0.7, min = 0.5, max = 0.95 }}                        # expectile of the V loss
gamma = 0.99
cql_weight = {{ value = 0.1, min = 0.001, max = 1.0, scale = "log" }}
inference_beta = {{ value = 4.0, min = 0.5, max = 50.0, scale = "log" }}
"""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.-").lower() or "experiment"


def _env_spec(env_id: str) -> Any:
    """gymnasium's registry entry for `env_id` (registering ALE/ and MinAtar/ ids on demand), or a
    SpecError with gymnasium's own explanation (which suggests near names)."""
    import gymnasium as gym

    for attempt in range(2):
        try:
            return gym.spec(env_id)
        except gym.error.Error as exc:
            if attempt == 0 and _register_plugin(env_id):
                continue
            raise SpecError("--env", "agent.task.env_id", f"not a registered gymnasium environment: {exc}") from None
    raise AssertionError("unreachable")


def _register_plugin(env_id: str) -> bool:
    """Import the package that registers `env_id`'s namespace (the `envs` extra); True if one was."""
    try:
        if env_id.startswith("ALE/"):
            import ale_py
            import gymnasium as gym

            gym.register_envs(ale_py)
            return True
        if env_id.startswith("MinAtar/"):
            from minatar.gym import register_envs

            register_envs()
            return True
    except ImportError:
        return False
    return False


def _observation(env_id: str) -> tuple[tuple[int, ...], Any]:
    """(observation shape, action space) of one instance of the environment."""
    import gymnasium as gym

    try:
        env = gym.make(env_id)
    except Exception as exc:
        raise SpecError("--env", "agent.task.env_id", f"cannot make {env_id!r}: {type(exc).__name__}: {exc}") from None
    try:
        return tuple(env.observation_space.shape or ()), env.action_space
    finally:
        env.close()


def env_experiment(env_id: str, agent: str = "efficientzero", name: str | None = None,
                   file: str = "mine.toml") -> str:
    """The experiment text for `agent` on gymnasium `env_id`, validated."""
    import gymnasium as gym

    if agent not in ENV_AGENTS:
        raise SpecError("--agent", "agent.kind", f"expected one of {list(ENV_AGENTS)} for --env "
                                                 f"(ilql learns from data: evo new --jsonl FILE), found {agent!r}")
    _env_spec(env_id)
    shape, actions = _observation(env_id)
    if not isinstance(actions, gym.spaces.Discrete):
        raise SpecError("--env", "agent.task.env_id", f"{agent} needs a discrete action space; {env_id} has {actions}")
    if len(shape) == 1:
        body = _EZ_VECTOR.format(env_id=env_id, obs_shape=list(shape))
    elif len(shape) in (2, 3):
        note = ("# Atari: the agent applies the Atari 100k protocol's preprocessing ([agent.task.atari]);\n"
                "# experiments/atari_pong_efficientzero.toml holds the paper's network and budget.\n\n"
                if env_id.startswith("ALE/") else "")
        body = _EZ_IMAGE.format(env_id=env_id, obs_shape=list(shape), downsample=str(min(shape[:2]) >= 64).lower(),
                                note=note)
    else:
        raise SpecError("--env", "agent.task.env_id", f"expected a vector or image observation, found shape {shape}")
    name = name or _slug(f"{env_id.split('/')[-1]}_{agent}")
    text = _HEADER.format(title=f"{agent} on {env_id}", command=f"evo new --env {env_id} --agent {agent}",
                          file=file, name=name, agent_doc=f"docs/{agent}.md") + body + \
        _EVOLUTION.format(activations='["ReLU", "GELU", "ELU", "Tanh"]')
    return _validated(text, "--env")


def jsonl_experiment(path: str, pretrained: str | None = None, name: str | None = None,
                     file: str = "mine.toml") -> str:
    """The ILQL experiment text for the episodes in `path` (optionally from a local model), validated:
    every line of the file is checked (docs/ilql.md, "The file: one episode per line")."""
    p = Path(path)
    if not p.is_file():
        raise SpecError("--jsonl", "agent.task.path", f"no such file: {path}")
    if pretrained is not None:
        d = Path(pretrained)
        if not (d / "config.json").is_file():
            raise SpecError("--pretrained", "agent.arch.pretrained",
                            f"expected a local model directory holding config.json, found {pretrained}")
        arch = f'pretrained = "{_toml_str(pretrained)}"   # shape keys come from its config.json'
        tokenizer, note, max_layers = _toml_str(pretrained), "       # the model's own tokenizer", 24
    else:
        arch = ("n_layer = 2\nn_embd = 64\nn_head = 4\ndim_feedfwd = 256\n"
                "block_size = 128                  # positions: at least the longest episode's tokens\n"
                'activation = "GELU"')
        tokenizer, max_layers = "char", 4
        note = "                # one token per character; or a local Hugging Face tokenizer dir"
    name = name or _slug(f"{p.stem}_ilql")
    command = f"evo new --jsonl {path}" + (f" --pretrained {pretrained}" if pretrained else "")
    text = _HEADER.format(title=f"ILQL on the episodes in {path}", command=command, file=file, name=name,
                          agent_doc="docs/ilql.md") + \
        _ILQL.format(path=_toml_str(path), tokenizer=tokenizer, tokenizer_note=note, arch=arch, max_layers=max_layers) + \
        _EVOLUTION.format(activations='["GELU", "ReLU", "Tanh", "SiLU"]')
    return _validated(text, "--jsonl")


def _toml_str(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _validated(text: str, source: str) -> str:
    """`text` if it parses and validates as `evo run` would; else the SpecError, naming `source`."""
    import tomllib

    parse_experiment(tomllib.loads(text), source)
    return text


def new_experiment(env: str | None = None, jsonl: str | None = None, agent: str | None = None,
                   pretrained: str | None = None, name: str | None = None, file: str = "mine.toml") -> str:
    """`evo new`'s text: exactly one of `env` (a gymnasium id) or `jsonl` (a file of episodes)."""
    if (env is None) == (jsonl is None):
        raise SpecError("evo new", "", "expected exactly one of --env ENV_ID or --jsonl FILE")
    if env is not None:
        if pretrained is not None:
            raise SpecError("evo new", "--pretrained", "goes with --jsonl (a language model for ILQL), not --env")
        return env_experiment(env, agent or "efficientzero", name, file)
    if agent not in (None, "ilql"):
        raise SpecError("evo new", "--agent", f"--jsonl trains ilql, found {agent!r}")
    return jsonl_experiment(jsonl, pretrained, name, file)
