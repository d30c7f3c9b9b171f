"""EfficientZero self-play: collecting game segments into the shared replay, and evaluation episodes.

`SelfPlay.collect` runs one game segment per env of the member's `EnvPool`: `steps` environment
steps are collected with one batched MCTS over all envs per step, and each env's rows go to the
replay when its episode ends, every `segment_length` rows of a long episode, and at the end of the
call. After every vector step a callback runs (the agent interleaves its gradient updates there).

Episodes do not end at a `train` call's boundary: the envs' episodes in flight, their returns and
step counts carry over to the next call (`state()` / `load_state()`: the pool's seeds and action
logs, replayed to rebuild the envs anywhere; see agents.efficientzero.envs). Each call's rows of
an episode are a trajectory piece of their own (a new episode id), so nothing pending is held
between calls. An env is reset, from a seed drawn from the member's RNG, only when its episode ends.

For Atari (`task.atari`), training rows clip rewards to their sign and mark a lost life terminal
(the game goes on in a new trajectory piece); returns and evaluation use the true game score.

Rows (see `replay_schema`): obs, action, reward, terminal, the search's root visit distribution
(`policy`) and root value, the episode id `(member_index << 40) | counter` and the step in it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any

import numpy as np
import torch

from agents.efficientzero.envs import EnvPool
from agents.efficientzero.mcts import BatchedMCTS, MCTSConfig, SearchResult, select_actions
from evo.replay import Field, Replay, Schema

__all__ = ["SelfPlay", "replay_schema", "drive", "chosen_actions", "evaluation_seed", "EPISODE_SHIFT",
           "ExtendedExploration"]

#: episode ids are (member index << EPISODE_SHIFT) | the member's episode counter: unique in a run
EPISODE_SHIFT = 40

_ROW_FIELDS = ("obs", "action", "reward", "terminal", "policy", "root_value", "step")


def replay_schema(obs_shape: tuple[int, ...], num_actions: int, obs_dtype: str = "float32") -> Schema:
    """The rows EfficientZero self-play writes to the shared store (images as uint8: 1 byte a pixel)."""
    return Schema({
        "obs": Field(obs_dtype, tuple(obs_shape)),
        "action": Field("int64"),
        "reward": Field("float32"),
        "terminal": Field("bool"),
        "policy": Field("float32", (num_actions,)),
        "root_value": Field("float32"),
        "episode": Field("int64"),
        "step": Field("int64"),
    })


def evaluation_seed(run_seed: int, i: int) -> int:
    """The seed evaluation episode `i` of a run seeded `run_seed` starts from (`SelfPlay.evaluation`;
    baselines that play the same starts use it too)."""
    return int(run_seed) * 7919 + 12345 + i


def _empty_rows() -> dict[str, list]:
    return {k: [] for k in _ROW_FIELDS}


def _flush(replay: Replay, rows: dict[str, list], episode: int) -> None:
    """Insert one env's pending rows as one trajectory piece of `episode`."""
    if not rows["obs"]:
        return
    replay.insert({
        "obs": np.stack(rows["obs"]),
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
        self._pool: EnvPool | None = None
        self._eval_pool: EnvPool | None = None
        self._carried: Mapping[str, Any] | None = None  # a saved state, restored on the next segment
        n = int(task["num_envs"])
        self.ep_steps, self.ep_returns = [0] * n, [0.0] * n  # of the episodes in flight
        # temporally-extended exploration in flight (`explore_epsilon`): steps left and the action held
        self.repeat_left, self.repeat_action = [0] * n, [0] * n
        self.carry_restarts = 0
        atari = task.get("atari") or {}
        self._clip_rewards = bool(atari.get("clip_rewards", False))
        self._life_terminal = bool(atari.get("terminal_on_life_loss", False))

    def state(self) -> dict[str, Any] | None:
        """The episodes in flight (None before the first segment): pool snapshot, step counts, returns."""
        if self._pool is None:
            return None if self._carried is None else dict(self._carried)
        return {"pool": self._pool.snapshot(), "ep_steps": list(self.ep_steps), "ep_returns": list(self.ep_returns),
                "carry_restarts": self.carry_restarts, "repeat_left": list(self.repeat_left),
                "repeat_action": list(self.repeat_action)}

    def load_state(self, state: Mapping[str, Any] | None) -> None:
        """Continue the episodes of `state` (a `state()`) at the next segment."""
        self._carried = state
        if state is not None:
            self.ep_steps = [int(v) for v in state["ep_steps"]]
            self.ep_returns = [float(v) for v in state["ep_returns"]]
            self.carry_restarts = int(state.get("carry_restarts", 0))
            n = len(self.ep_steps)
            self.repeat_left = [int(v) for v in state.get("repeat_left", [0] * n)]
            self.repeat_action = [int(v) for v in state.get("repeat_action", [0] * n)]

    def _training_pool(self, rng: np.random.Generator) -> EnvPool:
        """The member's envs: built on first use, then either the carried episodes replayed or fresh ones."""
        if self._pool is None:
            self._pool = EnvPool(self.task, int(self.task["num_envs"]))
            if self._carried is None:
                self._pool.reset_all(rng)
            else:
                for i in self._pool.restore(self._carried["pool"], rng):
                    self.ep_steps[i], self.ep_returns[i], self.repeat_left[i] = 0, 0.0, 0
                self.carry_restarts += self._pool.restarts
            self._carried = None
        return self._pool

    def _new_episode_id(self, member_index: int) -> int:
        self.episodes += 1
        return (member_index << EPISODE_SHIFT) | self.episodes

    def collect(self, model: torch.nn.Module, hp: Mapping[str, Any], rng: np.random.Generator, replay: Replay,
                member_index: int, steps: int, after_step: Callable[[int], None], env_steps: int = 0) -> list[float]:
        """Collect at least `steps` env steps (a multiple of `num_envs`) searching with `model`
        (PUCT: Dirichlet noise at the root, actions sampled at `collect_temperature`; Gumbel: Gumbel
        noise at the root, the search's own action); `after_step(num_envs)`
        runs after every vector step; `env_steps` is the member's count before this call (where an
        `explore_decay_steps` schedule stands). Returns the returns of the episodes that finished."""
        mcts = BatchedMCTS(MCTSConfig.from_hparams(hp))
        model.eval()
        return drive(self.segment(hp, rng, replay, member_index, steps, after_step, env_steps),
                     lambda obs: mcts.run(model, torch.as_tensor(obs, dtype=torch.float32), rng, add_noise=True))

    def segment(self, hp: Mapping[str, Any], rng: np.random.Generator, replay: Replay, member_index: int, steps: int,
                after_step: Callable[[int], None] | None,
                env_steps: int = 0) -> Generator[np.ndarray | None, SearchResult | None, list[float]]:
        """`collect` without the search: yields each vector step's observations and expects the search
        result for them (made with `rng`'s root noise) in return. A fused trainer drives several
        members' segments with one search over all their roots; `collect` drives one.

        With `after_step=None` the generator yields None after each vector step instead of calling
        it (resume it with `send(None)`): a fused driver learns for every member there, in the
        place `after_step` would have run — before the segment's final rows are flushed. `env_steps`: as `collect`'s."""
        n = int(self.task["num_envs"])
        pool = self._training_pool(rng)
        obs = pool.observations()
        buffers = [_empty_rows() for _ in range(n)]
        ep_ids = [self._new_episode_id(member_index) for _ in range(n)]  # this call's piece of each episode
        ep_steps, returns = self.ep_steps, self.ep_returns
        finished: list[float] = []
        temperature = float(hp["collect_temperature"])
        explore = ExtendedExploration.from_hparams(hp, int(pool.envs[0].action_space.n), n)
        collected = 0
        while collected < steps:
            result = yield obs
            actions = explore.apply(chosen_actions(result, temperature, rng), self.repeat_left, self.repeat_action, rng,
                                    env_steps + collected)
            for i in range(n):
                _, reward, term, trunc, life_lost = pool.step(i, int(actions[i]))
                life_end = life_lost and self._life_terminal and not term
                rows = buffers[i]
                rows["obs"].append(obs[i])
                rows["action"].append(int(actions[i]))
                rows["reward"].append(float(np.sign(reward)) if self._clip_rewards else reward)
                rows["terminal"].append(term or life_end)
                rows["policy"].append(result.policy[i].astype(np.float32))
                rows["root_value"].append(float(result.root_values[i]))
                rows["step"].append(ep_steps[i])
                ep_steps[i] += 1
                returns[i] += reward
                if term or trunc:
                    finished.append(float(returns[i]))
                    returns[i] = 0.0
                    _flush(replay, rows, ep_ids[i])
                    buffers[i] = _empty_rows()
                    ep_ids[i], ep_steps[i], self.repeat_left[i] = self._new_episode_id(member_index), 0, 0
                    pool.reset(i, rng)
                elif life_end or len(rows["obs"]) >= self.task["segment_length"]:
                    _flush(replay, rows, ep_ids[i])
                    buffers[i] = _empty_rows()
                    ep_ids[i] = self._new_episode_id(member_index)
            obs = pool.observations()
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
        """`evaluate` without the search: yields the observations, expects their (noise-free) search
        result. Env i starts from seed `evaluation_seed(run_seed, i)`
        (every member faces the same starts); an episode stops at the env's own end or after
        `eval_max_steps` steps (counted in `eval_truncated`)."""
        n, cap = int(self.task["eval_episodes"]), int(self.task["eval_max_steps"])
        if self._eval_pool is None:
            self._eval_pool = EnvPool(self.task, n)
        pool = self._eval_pool
        for i in range(n):
            pool.reset_to(i, evaluation_seed(run_seed, i))
        returns, lengths = np.zeros(n), np.zeros(n, dtype=np.int64)
        done, capped = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        while not done.all():
            # every env's observation, finished ones too: fused evaluation searches equal batches per member
            result = yield pool.observations()
            actions = chosen_actions(result, 0.0, None)
            for i in np.flatnonzero(~done):
                _, reward, term, trunc, _ = pool.step(i, int(actions[i]))
                returns[i] += reward
                lengths[i] += 1
                capped[i] = not (term or trunc) and lengths[i] >= cap
                done[i] = term or trunc or capped[i]
        return {"eval_return": float(returns.mean()), "eval_return_std": float(returns.std()),
                "eval_length": float(lengths.mean()), "eval_truncated": float(capped.mean())}


class ExtendedExploration:
    """Temporally-extended epsilon-greedy ("ez-greedy", Dabney, Ostrovski & Barreto 2021): at each
    step of an env not already exploring, with probability `epsilon` a uniformly random action is
    drawn and held for n steps, n from a zeta (power-law) distribution P(n) ∝ n^-mu on 1..`max_duration`;
    otherwise the search's action is played. The search still runs at every step and its policy
    is stored as the target: only the action played differs. A step at epsilon 0 draws nothing from the RNG
    (collection is then exactly the search's). Dithering (n = 1 always) is what `mu` → ∞ gives;
    a small `mu` holds an action long enough to change a state's momentum (MountainCar's swing).

    `spread` gives the member's envs a spectrum of epsilons as Ape-X's actors (Horgan et al. 2018):
    env i of n explores with epsilon ** (1 + spread * i / (n - 1)), so env 0 explores most and the
    last almost not at all (spread 0: every env at `epsilon`).

    `decay_steps` > 0 anneals as a DQN does (Mnih et al. 2015): at the member's env step t the
    probability is epsilon + (epsilon_start - epsilon) * max(0, 1 - t / decay_steps), from
    `epsilon_start` down to `epsilon`, which it then keeps (0: `epsilon` from the first step)."""

    def __init__(self, epsilon: float, mu: float, max_duration: int, num_actions: int, num_envs: int = 1,
                 spread: float = 0.0, epsilon_start: float = 1.0, decay_steps: int = 0) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"hparams.explore_epsilon: expected a probability in [0, 1], found {epsilon}")
        if not 0.0 <= epsilon_start <= 1.0:
            raise ValueError(f"hparams.explore_epsilon_start: expected a probability in [0, 1], found {epsilon_start}")
        if decay_steps < 0:
            raise ValueError(f"hparams.explore_decay_steps: expected at least 0, found {decay_steps}")
        if max_duration < 1:
            raise ValueError(f"hparams.explore_max_duration: expected at least 1, found {max_duration}")
        if spread < 0:
            raise ValueError(f"hparams.explore_spread: expected at least 0, found {spread}")
        self.epsilon, self.num_actions = float(epsilon), int(num_actions)
        self.epsilon_start, self.decay_steps = float(epsilon_start), int(decay_steps)
        rank = np.arange(num_envs) / max(num_envs - 1, 1)
        self.exponents = 1.0 + float(spread) * rank
        self.epsilons = float(epsilon) ** self.exponents
        n = np.arange(1, int(max_duration) + 1, dtype=np.float64)
        p = n ** -float(mu)
        self.cdf = np.cumsum(p / p.sum())

    @classmethod
    def from_hparams(cls, hp: Mapping[str, Any], num_actions: int, num_envs: int = 1) -> ExtendedExploration:
        return cls(float(hp.get("explore_epsilon", 0.0)), float(hp.get("explore_duration_mu", 2.0)),
                   int(hp.get("explore_max_duration", 100)), num_actions, num_envs, float(hp.get("explore_spread", 0.0)),
                   float(hp.get("explore_epsilon_start", 1.0)), int(hp.get("explore_decay_steps", 0)))

    def epsilon_at(self, step: int) -> float:
        """The exploration probability at the member's env step `step` (before `spread`)."""
        if self.decay_steps <= 0 or step >= self.decay_steps:
            return self.epsilon
        return self.epsilon + (self.epsilon_start - self.epsilon) * (1.0 - step / self.decay_steps)

    def durations(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """`size` draws of n ~ zeta(mu) truncated to 1..max_duration."""
        return np.minimum(np.searchsorted(self.cdf, rng.random(size), side="right"), len(self.cdf) - 1) + 1

    def apply(self, actions: np.ndarray, left: list[int], held: list[int], rng: np.random.Generator | None,
              step: int = 0) -> np.ndarray:
        """The actions to play given the search's `actions` at the member's env step `step`; `left` /
        `held` (per env: steps of the current option left, its action) are updated in place."""
        epsilon = self.epsilon_at(step)
        if epsilon <= 0.0 or rng is None:
            return actions
        # annealing: the spread's spectrum around the current epsilon (its fixed values once it is done)
        epsilons = self.epsilons if epsilon == self.epsilon else epsilon ** self.exponents
        out = np.array(actions, copy=True)
        for i in range(len(out)):
            if left[i] <= 0 and rng.random() < epsilons[min(i, len(epsilons) - 1)]:
                held[i] = int(rng.integers(self.num_actions))
                left[i] = int(self.durations(rng, 1)[0])
            if left[i] > 0:
                out[i] = held[i]
                left[i] -= 1
        return out


def chosen_actions(result: SearchResult, temperature: float, rng: np.random.Generator | None) -> np.ndarray:
    """The actions to play: a Gumbel root's own choice (`SearchResult.action`), else drawn from the
    root visits at `temperature` (`select_actions`; argmax at 0)."""
    actions = select_actions(result.visit_counts, temperature, rng)
    if result.action is not None:
        actions = np.where(result.action >= 0, result.action, actions)
    return actions


def drive(steps: Generator[np.ndarray, SearchResult, Any], search: Callable[[np.ndarray], SearchResult]) -> Any:
    """Run a `segment` / `evaluation` generator to its end, answering each observation with `search(obs)`;
    returns the generator's return value."""
    try:
        obs = next(steps)
        while True:
            obs = steps.send(search(obs))
    except StopIteration as stop:
        return stop.value
