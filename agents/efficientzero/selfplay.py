"""EfficientZero self-play: collecting game segments into the shared replay, and evaluation episodes.

`SelfPlay.collect` runs one game segment per vector env: the envs are reset from the member's RNG,
`steps` environment steps are collected with one batched MCTS over all envs per step, and each
env's rows go to the replay when its episode ends, every `segment_length` rows of a long episode,
and at the end of the call. After every vector step a callback runs (the agent interleaves its
gradient updates there). Segments start from fresh resets, so nothing about the envs needs saving:
a member's state is its episode counter plus what the agent holds.

Rows (see `replay_schema`): obs, action, reward, terminal, the search's root visit distribution
(`policy`) and root value, the episode id `(member_index << 40) | counter` and the step in it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any

import numpy as np
import torch

from agents.efficientzero.envs import make_vector_env
from agents.efficientzero.mcts import BatchedMCTS, MCTSConfig, SearchResult, select_actions
from evo.replay import Field, Replay, Schema

__all__ = ["SelfPlay", "replay_schema", "drive", "EPISODE_SHIFT"]

#: episode ids are (member index << EPISODE_SHIFT) | the member's episode counter: unique in a run
EPISODE_SHIFT = 40

_ROW_FIELDS = ("obs", "action", "reward", "terminal", "policy", "root_value", "step")


def replay_schema(obs_shape: tuple[int, ...], num_actions: int) -> Schema:
    """The rows EfficientZero self-play writes to the shared store."""
    return Schema({
        "obs": Field("float32", tuple(obs_shape)),
        "action": Field("int64"),
        "reward": Field("float32"),
        "terminal": Field("bool"),
        "policy": Field("float32", (num_actions,)),
        "root_value": Field("float32"),
        "episode": Field("int64"),
        "step": Field("int64"),
    })


def _empty_rows() -> dict[str, list]:
    return {k: [] for k in _ROW_FIELDS}


def _flush(replay: Replay, rows: dict[str, list], episode: int) -> None:
    """Insert one env's pending rows as one trajectory piece of `episode`."""
    if not rows["obs"]:
        return
    replay.insert({
        "obs": np.stack(rows["obs"]).astype(np.float32),
        "action": np.asarray(rows["action"], dtype=np.int64),
        "reward": np.asarray(rows["reward"], dtype=np.float32),
        "terminal": np.asarray(rows["terminal"], dtype=bool),
        "policy": np.stack(rows["policy"]).astype(np.float32),
        "root_value": np.asarray(rows["root_value"], dtype=np.float32),
        "episode": np.full(len(rows["obs"]), episode, dtype=np.int64),
        "step": np.asarray(rows["step"], dtype=np.int64),
    })


class SelfPlay:
    """One member's acting side: its vector envs (built on first use, never saved) and its episode counter."""

    def __init__(self, task: Mapping[str, Any], episodes: int = 0) -> None:
        self.task = task
        self.episodes = episodes
        self._envs: Any = None
        self._eval_envs: Any = None

    def _new_episode_id(self, member_index: int) -> int:
        self.episodes += 1
        return (member_index << EPISODE_SHIFT) | self.episodes

    def collect(self, model: torch.nn.Module, hp: Mapping[str, Any], rng: np.random.Generator, replay: Replay,
                member_index: int, steps: int, after_step: Callable[[int], None]) -> list[float]:
        """Collect at least `steps` env steps (a multiple of `num_envs`) searching with `model`
        (Dirichlet noise at the root, actions sampled at `collect_temperature`); `after_step(num_envs)`
        runs after every vector step. Returns the returns of the episodes that finished."""
        mcts = BatchedMCTS(MCTSConfig.from_hparams(hp))
        model.eval()
        return drive(self.segment(hp, rng, replay, member_index, steps, after_step),
                     lambda obs: mcts.run(model, torch.as_tensor(obs, dtype=torch.float32), rng, add_noise=True))

    def segment(self, hp: Mapping[str, Any], rng: np.random.Generator, replay: Replay, member_index: int, steps: int,
                after_step: Callable[[int], None] | None) -> Generator[np.ndarray | None, SearchResult | None, list[float]]:
        """`collect` without the search: yields each vector step's observations and expects the search
        result for them (made with `rng`'s root noise) in return. A fused trainer drives several
        members' segments with one search over all their roots; `collect` drives one.

        With `after_step=None` the generator yields None after each vector step instead of calling
        it (resume it with `send(None)`): a fused driver learns for every member there, in the
        place `after_step` would have run — before the segment's final rows are flushed."""
        n = int(self.task["num_envs"])
        if self._envs is None:
            self._envs = make_vector_env(self.task["env_id"], n, self.task["env_kwargs"])
        envs = self._envs
        obs, _ = envs.reset(seed=int(rng.integers(2**31)))
        buffers = [_empty_rows() for _ in range(n)]
        ep_ids = [self._new_episode_id(member_index) for _ in range(n)]
        ep_steps = [0] * n
        returns = np.zeros(n)
        finished: list[float] = []
        temperature = float(hp["collect_temperature"])
        collected = 0
        while collected < steps:
            result = yield obs
            actions = select_actions(result.visit_counts, temperature, rng)
            next_obs, reward, term, trunc, _ = envs.step(actions)
            for i in range(n):
                rows = buffers[i]
                rows["obs"].append(np.asarray(obs[i], dtype=np.float32))
                rows["action"].append(int(actions[i]))
                rows["reward"].append(float(reward[i]))
                rows["terminal"].append(bool(term[i]))
                rows["policy"].append(result.policy[i].astype(np.float32))
                rows["root_value"].append(float(result.root_values[i]))
                rows["step"].append(ep_steps[i])
                ep_steps[i] += 1
                returns[i] += reward[i]
                if term[i] or trunc[i]:
                    finished.append(float(returns[i]))
                    returns[i] = 0.0
                    _flush(replay, rows, ep_ids[i])
                    buffers[i] = _empty_rows()
                    ep_ids[i], ep_steps[i] = self._new_episode_id(member_index), 0
                elif len(rows["obs"]) >= self.task["segment_length"]:
                    _flush(replay, rows, ep_ids[i])
                    buffers[i] = _empty_rows()
                    ep_ids[i] = self._new_episode_id(member_index)
            obs = next_obs
            collected += n
            if after_step is None:
                yield None
            else:
                after_step(n)
        for i in range(n):
            _flush(replay, buffers[i], ep_ids[i])
        return finished

    def evaluate(self, model: torch.nn.Module, hp: Mapping[str, Any], run_seed: int) -> dict[str, float]:
        """`eval_episodes` greedy episodes (search without noise, argmax of visits, `eval_simulations`
        or else `num_simulations`), from starts fixed by the run seed so every member of a run faces
        the same ones. Returns `eval_return` (mean), `eval_return_std` and `eval_length`."""
        mcts = BatchedMCTS(MCTSConfig.from_hparams(hp, int(hp["eval_simulations"]) or None))
        model.eval()
        return drive(self.evaluation(run_seed),
                     lambda obs: mcts.run(model, torch.as_tensor(obs, dtype=torch.float32), None, add_noise=False))

    def evaluation(self, run_seed: int) -> Generator[np.ndarray, SearchResult, dict[str, float]]:
        """`evaluate` without the search: yields observations, expects their (noise-free) search result."""
        n = int(self.task["eval_episodes"])
        if self._eval_envs is None:
            self._eval_envs = make_vector_env(self.task["env_id"], n, self.task["env_kwargs"])
        envs = self._eval_envs
        obs, _ = envs.reset(seed=int(run_seed) * 7919 + 12345)
        returns, lengths = np.zeros(n), np.zeros(n, dtype=np.int64)
        done = np.zeros(n, dtype=bool)
        while not done.all():
            result = yield obs
            actions = select_actions(result.visit_counts, 0.0, None)
            obs, reward, term, trunc, _ = envs.step(actions)
            live = ~done
            returns[live] += reward[live]
            lengths[live] += 1
            done |= term | trunc
        return {"eval_return": float(returns.mean()), "eval_return_std": float(returns.std()),
                "eval_length": float(lengths.mean())}


def drive(steps: Generator[np.ndarray, SearchResult, Any], search: Callable[[np.ndarray], SearchResult]) -> Any:
    """Run a `segment` / `evaluation` generator to its end, answering each observation with `search(obs)`;
    returns the generator's return value."""
    try:
        obs = next(steps)
        while True:
            obs = steps.send(search(obs))
    except StopIteration as stop:
        return stop.value
