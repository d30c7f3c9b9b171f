"""Atari through `ale-py` with the EfficientZero Atari 100k protocol (Ye et al. 2021, after DQN/MuZero):

* frame skip 4, the last two frames max-pooled (flicker);
* grey (or RGB) frames resized to 96×96 by area averaging;
* a stack of the last 4 processed frames as channels (uint8 [4·C, 96, 96]);
* up to 30 no-op actions after each reset (drawn from the env's seeded RNG);
* sticky actions off (`repeat_action_probability = 0`), the minimal action set;
* episodes capped at 108,000 frames (27,000 agent steps);
* for training only: rewards clipped to their sign and a lost life marked terminal (the game goes
  on; `selfplay` applies both, so evaluation plays the true game score to the real game over).

Every piece is a key of the task's `atari` table (`ATARI_DEFAULTS`). Resizing is area
interpolation written as two small matrix products, so OpenCV is not needed.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

__all__ = ["ATARI_DEFAULTS", "is_atari", "make_atari", "check_atari_settings"]

ATARI_DEFAULTS: dict[str, Any] = {
    "frame_skip": 4,
    "screen_size": 96,
    "grayscale": True,
    "frame_stack": 4,
    "noop_max": 30,
    "repeat_action_probability": 0.0,   # sticky actions off
    "max_episode_frames": 108_000,
    "clip_rewards": True,               # training rows only
    "terminal_on_life_loss": True,      # training rows only
}


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/")


def check_atari_settings(settings: Any) -> dict[str, Any]:
    """The `atari` table with defaults; refuses unknown keys and wrong types naming the key."""
    if not isinstance(settings, dict):
        raise ValueError(f"task.atari: expected a table, found {settings!r}")
    unknown = sorted(set(settings) - set(ATARI_DEFAULTS))
    if unknown:
        raise ValueError(f"task.atari.{unknown[0]}: unknown key; expected some of {sorted(ATARI_DEFAULTS)}")
    out = {**ATARI_DEFAULTS, **settings}
    for key, default in ATARI_DEFAULTS.items():
        value = out[key]
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= (0 if key == "noop_max" else 1)
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0
        if not ok:
            expected = "true or false" if isinstance(default, bool) else f"a number like {default!r}"
            raise ValueError(f"task.atari.{key}: expected {expected}, found {value!r}")
    return out


@lru_cache(maxsize=8)
def _area_matrix(n_in: int, n_out: int) -> torch.Tensor:
    """[n_out, n_in] weights of area interpolation (OpenCV's INTER_AREA): output pixel j is the
    mean of the input span [j·r, (j+1)·r), r = n_in / n_out, partial pixels weighted by overlap."""
    r = n_in / n_out
    m = np.zeros((n_out, n_in), np.float32)
    for j in range(n_out):
        lo, hi = j * r, (j + 1) * r
        for i in range(int(np.floor(lo)), min(int(np.ceil(hi)), n_in)):
            m[j, i] = min(hi, i + 1) - max(lo, i)
    return torch.from_numpy(m / r)


class _AtariPreprocess(gym.Wrapper):
    """No-op starts, frame skip with a max over the last two frames, area resize to a square."""

    def __init__(self, env: gym.Env, frame_skip: int, screen_size: int, grayscale: bool, noop_max: int) -> None:
        super().__init__(env)
        self.frame_skip, self.size, self.grayscale, self.noop_max = frame_skip, screen_size, grayscale, noop_max
        c = 1 if grayscale else 3
        self.observation_space = spaces.Box(0, 255, (c, screen_size, screen_size), np.uint8)

    def _process(self, frame: np.ndarray) -> np.ndarray:
        """Area resize as two small matrix products (rows then columns); [C, S, S] uint8. In torch,
        whose thread count the agent pins: numpy's BLAS threads thrash on a busy machine (measured
        30 ms against 0.6 ms per frame at load 15 on 2 cores)."""
        x = torch.from_numpy(np.asarray(frame, dtype=np.float32))
        x = x[None] if x.ndim == 2 else x.permute(2, 0, 1)
        out = _area_matrix(x.shape[1], self.size) @ x @ _area_matrix(x.shape[2], self.size).T
        return out.round_().clamp_(0, 255).to(torch.uint8).numpy()

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        frame, info = self.env.reset(seed=seed, options=options)
        noops = int(self.env.unwrapped.np_random.integers(1, self.noop_max + 1)) if self.noop_max > 0 else 0
        for _ in range(noops):
            frame, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                frame, info = self.env.reset()
        return self._process(frame), info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        total, last = 0.0, None
        terminated = truncated = False
        info: dict = {}
        for t in range(self.frame_skip):
            frame, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if t >= self.frame_skip - 2 or terminated or truncated:
                last = frame if last is None else np.maximum(last, frame)
            if terminated or truncated:
                break
        return self._process(last), total, terminated, truncated, info


class _FrameStack(gym.Wrapper):
    """The last `k` observations as channels [k·C, H, W]; after a reset, the first one repeated."""

    def __init__(self, env: gym.Env, k: int) -> None:
        super().__init__(env)
        self.k = k
        c, h, w = env.observation_space.shape
        self.observation_space = spaces.Box(0, 255, (k * c, h, w), np.uint8)
        self.frames: deque[np.ndarray] = deque(maxlen=k)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.frames.extend([obs] * self.k)
        return np.concatenate(self.frames), info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.frames.append(obs)
        return np.concatenate(self.frames), reward, terminated, truncated, info


def make_atari(env_id: str, env_kwargs: dict[str, Any], settings: dict[str, Any]) -> gym.Env:
    """One Atari env under the protocol (`settings` = a checked `atari` table)."""
    import ale_py

    gym.register_envs(ale_py)
    kwargs = {"frameskip": 1, "repeat_action_probability": float(settings["repeat_action_probability"]),
              "full_action_space": False, "max_num_frames_per_episode": int(settings["max_episode_frames"]),
              "obs_type": "grayscale" if settings["grayscale"] else "rgb", **env_kwargs}
    env = gym.make(env_id, **kwargs)
    env = _AtariPreprocess(env, int(settings["frame_skip"]), int(settings["screen_size"]), bool(settings["grayscale"]),
                           int(settings["noop_max"]))
    return _FrameStack(env, int(settings["frame_stack"]))
