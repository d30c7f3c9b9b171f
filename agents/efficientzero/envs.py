"""Environments for EfficientZero: what `task.env_id` may name, the pool of envs a member acts in
(whose in-flight episodes outlive a `train` call), and a tiny image env for tests.

`task.env_id` may be
* any gymnasium id (`env_kwargs` passed to `gymnasium.make`), e.g. `CartPole-v1`;
* `ALE/<Game>-v5`: Atari through ale-py under the Atari 100k protocol (agents.efficientzero.atari);
* `MinAtar/<Game>-v1` (the `minatar` package): 10×10×C boolean images, served channel-first as
  uint8 0/255; a reset clears the sticky action MinAtar would carry over from the episode before;
* `package.module:Class`: a person's own `gymnasium.Env` subclass, built as `Class(**env_kwargs)`.

Observations must be a Box of rank 1 (a vector: the MLP model) or rank 3 (an image: the conv
model; channel-last images — last axis smaller than the first and at most 16 — are transposed to
[C, H, W]). Integer images are stored and searched as uint8 (the model scales them by 1/255).
Actions must be Discrete. Anything else is refused when the experiment is checked.
`task.rescale_observations = true` maps each vector component with finite bounds onto [-1, 1]
(gymnasium's `RescaleObservation`), so MountainCar's velocity (±0.07) reaches the network on the
scale of its position; what the replay store holds and every search sees are the rescaled values.

`EnvPool` keeps one env per slot, resets each from a seed drawn from the member's RNG, and logs
the actions of the episode in flight. Its `snapshot()` (seeds and actions; JSON and arrays) is part
of the member's state; `restore()` rebuilds the envs by replaying those actions, so the episodes
continue exactly where they were, in any process, after any checkpoint. An env whose replay does
not reproduce the recorded observation (not deterministic given seed and actions) restarts that
slot with a fresh episode and counts it in `carry_restarts`.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["TinyImageEnv", "TINY_IMAGE_ID", "make_env", "ObsSpec", "observation_spec", "check_spaces", "EnvPool"]

TINY_IMAGE_ID = "evo/TinyImage-v0"


class TinyImageEnv(gym.Env):
    """A 1x6x6 image with a lit pixel (the agent) in the middle row and a goal column.

    Actions: 0 = left, 1 = right. Reward +1 and termination on reaching the goal; -0.05 per step
    otherwise; truncated after 12 steps. The goal is the right edge, so the optimal return is
    about 0.8 (the pixel starts in column 1 or 2) and a uniformly random policy usually scores
    below zero.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, size: int = 6, max_steps: int = 12) -> None:
        self.size, self.max_steps = size, max_steps
        self.observation_space = spaces.Box(0.0, 1.0, shape=(1, size, size), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.pos = 0
        self.t = 0

    def _obs(self) -> np.ndarray:
        img = np.zeros((1, self.size, self.size), dtype=np.float32)
        img[0, self.size // 2, self.pos] = 1.0
        img[0, :, self.size - 1] = np.maximum(img[0, :, self.size - 1], 0.5)
        return img

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.pos = int(self.np_random.integers(1, 3))
        self.t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        self.pos = int(np.clip(self.pos + (1 if int(action) == 1 else -1), 0, self.size - 1))
        terminated = self.pos == self.size - 1
        reward = 1.0 if terminated else -0.05
        truncated = (not terminated) and self.t >= self.max_steps
        return self._obs(), reward, terminated, truncated, {}


if TINY_IMAGE_ID not in gym.registry:
    gym.register(id=TINY_IMAGE_ID, entry_point=TinyImageEnv)


class _ChannelFirst(gym.ObservationWrapper):
    """[H, W, C] → [C, H, W]; boolean or 0/1 images become uint8 0/255 (so every image scales by 1/255)."""

    def __init__(self, env: gym.Env, transpose: bool) -> None:
        super().__init__(env)
        self.transpose = transpose
        box = env.observation_space
        shape = (box.shape[2], box.shape[0], box.shape[1]) if transpose else box.shape
        self.binary = box.dtype == np.bool_ or (np.issubdtype(box.dtype, np.integer) and int(np.max(box.high)) == 1)
        self.observation_space = spaces.Box(0, 255, shape, np.uint8)

    def observation(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs)
        if self.transpose:
            x = np.transpose(x, (2, 0, 1))
        return np.ascontiguousarray(x, dtype=np.uint8) * np.uint8(255) if self.binary else np.ascontiguousarray(x, np.uint8)


class _ClearStickyAction(gym.Wrapper):
    """MinAtar (1.0.15) keeps the previous episode's last action through `reset`: its sticky-action
    rule repeats `last_action` with probability 0.1, so the first step of an episode reset from a
    seed depended on the episode before it, and the same member on the same evaluation starts scored
    differently from one evaluation to the next (2.14, 2.06, 2.14, 1.94, 2.02 over 50 Breakout
    episodes). Clearing it on reset, as a fresh game has it, makes the seed fix the episode."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.env.unwrapped.game.last_action = 0
        return self.env.reset(**kwargs)


def _is_user_class(env_id: str) -> bool:
    """`package.module:Class` (a person's own env), not a registered id such as `ns/Name:v1`."""
    return ":" in env_id and "/" not in env_id.split(":")[0]


def _user_env(spec: str, kwargs: dict[str, Any]) -> gym.Env:
    module_name, _, attr = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"task.env_id: cannot import {spec!r} ({exc})") from None
    env = cls(**kwargs)
    if not isinstance(env, gym.Env):
        raise ValueError(f"task.env_id: expected {spec} to build a gymnasium.Env, found {type(env).__name__}")
    return env


def _registered(env_id: str) -> None:
    """Register the ids of the packages gymnasium 1.x no longer loads by itself."""
    if env_id.startswith("MinAtar/") and env_id not in gym.registry:
        from minatar.gym import register_envs

        register_envs()


def reward_threshold(task: Mapping[str, Any]) -> float | None:
    """gymnasium's `reward_threshold` for the task's registered id (CartPole-v1 475, MountainCar-v0
    −110, LunarLander-v3 200): the return at which the task counts as solved. None for ids without
    one (MinAtar's, Atari's) and for a person's own `package.module:Class`."""
    env_id = task["env_id"]
    if _is_user_class(env_id):
        return None
    _registered(env_id)
    try:
        threshold = gym.spec(env_id).reward_threshold
    except gym.error.Error:
        return None
    return None if threshold is None else float(threshold)


def _is_image_hwc(shape: tuple[int, ...]) -> bool:
    return len(shape) == 3 and shape[-1] < shape[0] and shape[-1] <= 16


def make_env(task: Mapping[str, Any]) -> gym.Env:
    """One env for `task` (a checked [agent.task] table), observations in the layout the model reads."""
    from agents.efficientzero.atari import is_atari, make_atari

    env_id, kwargs = task["env_id"], dict(task.get("env_kwargs") or {})
    if is_atari(env_id):
        return make_atari(env_id, kwargs, task["atari"])
    if _is_user_class(env_id):
        env = _user_env(env_id, kwargs)
    else:
        _registered(env_id)
        env = gym.make(env_id, **kwargs)
        if env_id.startswith("MinAtar/"):
            env = _ClearStickyAction(env)
    box = env.observation_space
    if isinstance(box, spaces.Box) and len(box.shape) == 3 and (
            _is_image_hwc(box.shape) or box.dtype == np.bool_ or np.issubdtype(box.dtype, np.integer)):
        env = _ChannelFirst(env, _is_image_hwc(box.shape))
    if task.get("rescale_observations"):
        env = _rescaled(env, env_id)
    return env


def _rescaled(env: gym.Env, env_id: str) -> gym.Env:
    """`env` with each vector component whose bounds are both finite mapped affinely onto [-1, 1]; the
    others (CartPole's velocities) unchanged. Fixed by the space, so no state to snapshot or checkpoint."""
    box = env.observation_space
    if not (isinstance(box, spaces.Box) and len(box.shape) == 1 and np.issubdtype(box.dtype, np.floating)):
        raise ValueError(f"task.rescale_observations: for vector observations of floats, found {box} for {env_id!r}")
    bounded = np.isfinite(box.low) & np.isfinite(box.high) & (box.high > box.low)
    low = np.where(bounded, -1.0, box.low).astype(box.dtype)
    high = np.where(bounded, 1.0, box.high).astype(box.dtype)
    return gym.wrappers.RescaleObservation(env, low, high)


@dataclass(frozen=True)
class ObsSpec:
    """What the model and the replay store see: observation shape and dtype, number of actions."""

    shape: tuple[int, ...]
    dtype: str          # "float32" (vectors, float images) or "uint8" (integer images, stored as is)
    num_actions: int

    @property
    def obs_scale(self) -> float:
        return 1.0 / 255.0 if self.dtype == "uint8" else 1.0


def check_spaces(env: gym.Env, env_id: str) -> ObsSpec:
    if not isinstance(env.action_space, spaces.Discrete):
        raise ValueError(f"task.env_id: expected an environment with discrete actions, found {env.action_space} "
                         f"for {env_id!r} (EfficientZero searches over a finite set of actions)")
    box = env.observation_space
    if not isinstance(box, spaces.Box):
        raise ValueError(f"task.env_id: expected Box observations (a vector or an image), found {box} for {env_id!r}")
    if len(box.shape) not in (1, 3):
        raise ValueError(f"task.env_id: expected observations of rank 1 (a vector) or 3 (an image [C, H, W]), "
                         f"found shape {box.shape} for {env_id!r}")
    return ObsSpec(tuple(int(s) for s in box.shape), "uint8" if box.dtype == np.uint8 else "float32",
                   int(env.action_space.n))


_SPECS: dict[str, ObsSpec] = {}


def observation_spec(task: Mapping[str, Any]) -> ObsSpec:
    """The spec of `task`'s env (probed once per process); raises ValueError naming task.env_id."""
    import json

    keys = ("env_id", "env_kwargs", "atari", "rescale_observations")
    key = json.dumps({k: task[k] for k in keys if k in task}, sort_keys=True, default=str)
    if key not in _SPECS:
        env = make_env(task)
        try:
            _SPECS[key] = check_spaces(env, task["env_id"])
        finally:
            env.close()
    return _SPECS[key]


def _crc(obs: Any) -> int:
    return zlib.crc32(np.ascontiguousarray(obs).tobytes())


class EnvPool:
    """`n` envs acting in lockstep, each reset from a seed drawn from the member's RNG, with the
    actions of its episode in flight logged so the pool can be rebuilt anywhere (`restore`)."""

    def __init__(self, task: Mapping[str, Any], n: int) -> None:
        self.task, self.n = task, n
        self.envs = [make_env(task) for _ in range(n)]
        self.seeds = [0] * n
        self.actions: list[list[int]] = [[] for _ in range(n)]
        self.obs: list[Any] = [None] * n
        self.lives: list[int | None] = [None] * n
        self.restarts = 0

    def reset(self, i: int, rng: np.random.Generator) -> Any:
        """Reset env i from a seed drawn from `rng` (the member's: training starts are its own)."""
        return self.reset_to(i, int(rng.integers(2**31)))

    def reset_to(self, i: int, seed: int) -> Any:
        """Reset env i from a given seed (evaluation: the same starts for every member)."""
        obs, info = self.envs[i].reset(seed=int(seed))
        self.seeds[i], self.actions[i], self.obs[i], self.lives[i] = int(seed), [], obs, info.get("lives")
        return obs

    def reset_all(self, rng: np.random.Generator) -> None:
        for i in range(self.n):
            self.reset(i, rng)

    def step(self, i: int, action: int) -> tuple[Any, float, bool, bool, bool]:
        """Step env i; returns (obs, reward, terminated, truncated, life_lost)."""
        obs, reward, terminated, truncated, info = self.envs[i].step(int(action))
        self.actions[i].append(int(action))
        self.obs[i] = obs
        lives = info.get("lives")
        life_lost = lives is not None and self.lives[i] is not None and lives < self.lives[i]
        self.lives[i] = lives
        return obs, float(reward), bool(terminated), bool(truncated), life_lost

    def observations(self) -> np.ndarray:
        return np.stack([np.asarray(o) for o in self.obs])

    def snapshot(self) -> dict[str, Any]:
        """Seeds, actions since each reset and a checksum of each current observation."""
        return {"seeds": list(self.seeds), "actions": [np.asarray(a, dtype=np.int64) for a in self.actions],
                "obs_crc": [_crc(o) for o in self.obs], "lives": list(self.lives)}

    def restore(self, snap: Mapping[str, Any], rng: np.random.Generator) -> list[int]:
        """Replay each slot's episode; a slot whose replay differs from the recorded observation (a
        non-deterministic env) starts a fresh episode instead: those slots are returned (and counted
        in `restarts`)."""
        restarted = []
        for i in range(self.n):
            obs, info = self.envs[i].reset(seed=int(snap["seeds"][i]))
            self.seeds[i], self.lives[i] = int(snap["seeds"][i]), info.get("lives")
            actions = [int(a) for a in np.asarray(snap["actions"][i]).reshape(-1)]
            for a in actions:
                obs, _, terminated, truncated, info = self.envs[i].step(a)
                self.lives[i] = info.get("lives")
                if terminated or truncated:
                    break
            self.actions[i], self.obs[i] = actions, obs
            if _crc(obs) != int(snap["obs_crc"][i]):
                self.restarts += 1
                self.reset(i, rng)
                restarted.append(i)
        return restarted

    def close(self) -> None:
        for env in self.envs:
            env.close()
