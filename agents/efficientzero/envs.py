"""Environments for EfficientZero: gymnasium vector envs for self-play and evaluation, plus a tiny
image environment (`evo/TinyImage-v0`) that exercises the convolutional model in tests.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["TinyImageEnv", "make_vector_env", "env_spaces", "TINY_IMAGE_ID"]

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


def make_vector_env(env_id: str, num_envs: int, env_kwargs: dict[str, Any] | None = None) -> gym.vector.SyncVectorEnv:
    """A synchronous vector env that resets finished sub-envs within the same step."""
    kwargs = dict(env_kwargs or {})
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, **kwargs) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


def env_spaces(env_id: str, env_kwargs: dict[str, Any] | None = None) -> tuple[tuple[int, ...], int]:
    """(observation shape, number of discrete actions) of an env id; refuses non-discrete actions."""
    env = gym.make(env_id, **dict(env_kwargs or {}))
    try:
        if not isinstance(env.action_space, spaces.Discrete):
            raise ValueError(f"task.env_id: expected an environment with discrete actions, "
                             f"found {env.action_space} for {env_id!r}")
        if not isinstance(env.observation_space, spaces.Box):
            raise ValueError(f"task.env_id: expected Box observations, found {env.observation_space} for {env_id!r}")
        return tuple(int(s) for s in env.observation_space.shape), int(env.action_space.n)
    finally:
        env.close()
