"""What `task.env_id` may name — gymnasium ids, Atari under the 100k protocol, MinAtar, a person's own
`package.module:Class` — and what is refused at validation time, with the key named."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from agents.efficientzero.agent import EfficientZeroAgent
from agents.efficientzero.atari import ATARI_DEFAULTS
from agents.efficientzero.envs import EnvPool, make_env, observation_spec
from agents.efficientzero.model import EfficientZeroConv
from evo.agent import AgentContext
from evo.replay import build_replay


class GridEnv(gym.Env):
    """A person's own env: a channel-last 8×8×2 image, three actions."""

    observation_space = spaces.Box(0, 1, (8, 8, 2), np.uint8)
    action_space = spaces.Discrete(3)

    def __init__(self, goal: int = 5) -> None:
        self.goal, self.pos = goal, 0

    def _obs(self):
        img = np.zeros((8, 8, 2), np.uint8)
        img[0, self.pos, 0] = img[0, self.goal, 1] = 1
        return img

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = int(self.np_random.integers(0, 3))
        return self._obs(), {}

    def step(self, action):
        self.pos = int(np.clip(self.pos + int(action) - 1, 0, 7))
        return self._obs(), float(self.pos == self.goal), self.pos == self.goal, False, {}


class FlatImageEnv(GridEnv):
    observation_space = spaces.Box(0, 1, (8, 8), np.uint8)


class DictObsEnv(GridEnv):
    observation_space = spaces.Dict({"grid": spaces.Box(0, 1, (8, 8, 2), np.uint8)})


@pytest.mark.parametrize("env_id, message", [
    ("Pendulum-v1", r"task.env_id: expected an environment with discrete actions, found Box"),
    ("FrozenLake-v1", r"task.env_id: expected Box observations \(a vector or an image\), found Discrete"),
    (f"{__name__}:FlatImageEnv", r"task.env_id: expected observations of rank 1 .* or 3 .*found shape \(8, 8\)"),
    (f"{__name__}:DictObsEnv", r"task.env_id: expected Box observations"),
    (f"{__name__}:Missing", r"task.env_id: cannot import"),
])
def test_what_search_cannot_use_is_refused_at_validation(env_id, message):
    with pytest.raises(ValueError, match=message):
        EfficientZeroAgent.validate_task({"env_id": env_id})


def test_a_persons_own_env_by_import_path_with_kwargs():
    task = EfficientZeroAgent.validate_task({"env_id": f"{__name__}:GridEnv", "env_kwargs": {"goal": 6}})
    spec = observation_spec(task)
    assert (spec.shape, spec.dtype, spec.num_actions) == ((2, 8, 8), "uint8", 3)  # channel-last turned channel-first
    env = make_env(task)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.uint8 and set(np.unique(obs)) == {0, 255} and env.unwrapped.goal == 6


@pytest.mark.parametrize("learn", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_minatar_is_a_small_uint8_image_for_the_conv_model(learn):
    task = EfficientZeroAgent.validate_task({"env_id": "MinAtar/Breakout-v1", "num_envs": 2, "eval_episodes": 1,
                                             "min_replay": 8 if learn else 10_000, "segment_length": 8})
    spec = observation_spec(task)
    assert (spec.shape, spec.dtype, spec.num_actions) == ((4, 10, 10), "uint8", 3)
    schema = EfficientZeroAgent.replay_spec(task).schema
    assert schema.fields["obs"].dtype == "uint8" and schema.fields["obs"].row_bytes == 400
    arch = {"channels": 8, "num_res_blocks": 1, "width": 16, "lstm_hidden_size": 16, "proj_size": 16,
            "value_support": 5, "reward_support": 2}
    agent = EfficientZeroAgent.create(arch, {"num_simulations": 2, "batch_size": 8, "num_unroll_steps": 2, "td_steps": 2},
                                      0, 0, AgentContext(task=task, replay=build_replay(EfficientZeroAgent.replay_spec(task), 0,
                                                                                         distributed=False)))
    assert isinstance(agent.model, EfficientZeroConv) and agent.model.obs_scale == 1 / 255
    metrics = agent.train(40 if learn else 8)
    assert (metrics["updates"] > 0 and np.isfinite(metrics["loss_total"])) if learn else metrics["updates"] == 0
    row = agent.replay.sample(1).data["obs"]
    assert row.dtype == np.uint8 and row.max() in (0, 255)


def test_a_minatar_episode_from_a_seed_does_not_depend_on_the_episode_before():
    # MinAtar's sticky actions repeat the last action played (p = 0.1); its reset kept that action from
    # the episode before, so the same seed and actions gave different episodes (evaluations that
    # differed from one call to the next). Two pools whose episodes before end moving left and right.
    task = EfficientZeroAgent.validate_task({"env_id": "MinAtar/Breakout-v1", "num_envs": 1})
    left, right = EnvPool(task, 1), EnvPool(task, 1)
    for seed in range(60):
        episodes = []
        for pool, before in ((left, 1), (right, 2)):
            pool.reset_to(0, 10_000 + seed)
            for _ in range(3):
                pool.step(0, before)
            obs = [pool.reset_to(0, seed)] + [pool.step(0, 0)[0] for _ in range(4)]
            episodes.append(np.stack(obs))
        assert np.array_equal(*episodes), f"seed {seed}: the episode depends on the one before"


def test_atari_follows_the_100k_protocol():
    task = EfficientZeroAgent.validate_task({"env_id": "ALE/Pong-v5", "num_envs": 1})
    assert task["atari"] == ATARI_DEFAULTS
    spec = observation_spec(task)
    assert (spec.shape, spec.dtype, spec.num_actions) == ((4, 96, 96), "uint8", 6)  # 4 grey frames, minimal actions
    assert EfficientZeroAgent.replay_spec(task).schema.fields["obs"].row_bytes == 4 * 96 * 96
    pool = EnvPool(task, 1)
    pool.reset_to(0, 3)
    first = pool.obs[0]
    assert all(np.array_equal(first[0], first[k]) for k in range(1, 4))  # a reset repeats the first frame
    obs, *_ = pool.step(0, 0)
    assert np.array_equal(obs[:3], first[1:])  # the stack shifts by one processed frame per agent step
    rgb = EfficientZeroAgent.validate_task({"env_id": "ALE/Pong-v5", "atari": {"grayscale": False, "frame_stack": 2}})
    assert observation_spec(rgb).shape == (6, 96, 96)
    with pytest.raises(ValueError, match="task.atari.frameskip: unknown key"):
        EfficientZeroAgent.validate_task({"env_id": "ALE/Pong-v5", "atari": {"frameskip": 4}})
    with pytest.raises(ValueError, match="task.atari: only for ALE/ environments"):
        EfficientZeroAgent.validate_task({"env_id": "CartPole-v1", "atari": {"frame_skip": 2}})


class LivesEnv(gym.Env):
    """Reward 5 a step; a life lost every 3 steps (info["lives"] 3, 2, 1, 0); the game ends at 0."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {"lives": 3}

    def step(self, action):
        self.t += 1
        lives = 3 - self.t // 3
        return np.full(4, self.t / 10, np.float32), 5.0, lives == 0, False, {"lives": lives}


def test_training_rows_clip_rewards_and_end_at_a_lost_life_evaluation_does_not():
    from agents.efficientzero.model import build_model
    from agents.efficientzero.selfplay import SelfPlay
    from tests.efficientzero.test_agent import FAST_HP, SMALL_ARCH

    plain = EfficientZeroAgent.validate_task({"env_id": f"{__name__}:LivesEnv", "num_envs": 1, "eval_episodes": 1,
                                              "segment_length": 100})
    task = {**plain, "atari": dict(ATARI_DEFAULTS)}  # the protocol's training-only rules, on an env with lives
    hp = {**{k: v.value for k, v in EfficientZeroAgent.default_hparams().items()}, **FAST_HP}
    model = build_model((4,), 2, EfficientZeroAgent.validate_arch(SMALL_ARCH))
    store = build_replay(EfficientZeroAgent.replay_spec(plain), 0, distributed=False)
    inserts = []
    replay = type("Recording", (), {"insert": lambda self, b: inserts.append(b) or store.insert(b)})()
    finished = SelfPlay(task).collect(model, hp, np.random.default_rng(0), replay, 0, 9, lambda n: None)
    assert finished == [45.0]  # the true score
    assert [len(b["reward"]) for b in inserts] == [3, 3, 3]  # a lost life ends a trajectory piece
    assert all(b["terminal"][-1] and not b["terminal"][:-1].any() for b in inserts)
    assert all(np.all(b["reward"] == 1.0) for b in inserts)  # clipped to its sign
    assert [int(b["step"][0]) for b in inserts] == [0, 3, 6]  # one game, three lives
    ev = SelfPlay(task).evaluate(model, hp, run_seed=0)
    assert (ev["eval_return"], ev["eval_length"]) == (45.0, 9.0)  # the game, to its real end, unclipped


def test_the_task_threshold_is_gymnasiums_reward_threshold_where_the_env_has_one():
    # what `population.stop_at_score = "task"` stops at: the env's own "solved" return, on the fitness's scale
    assert EfficientZeroAgent.reward_threshold({"env_id": "CartPole-v1"}) == 475.0
    assert EfficientZeroAgent.reward_threshold({"env_id": "MountainCar-v0"}) == -110.0
    assert EfficientZeroAgent.reward_threshold({"env_id": "MinAtar/Breakout-v1"}) is None  # registered without one
    assert EfficientZeroAgent.reward_threshold({"env_id": f"{__name__}:GridEnv"}) is None


def test_rescaled_observations_map_finite_bounds_onto_minus_one_to_one():
    """MountainCar's position [-1.2, 0.6] and velocity [-0.07, 0.07] both reach the model on [-1, 1]."""
    raw_task = EfficientZeroAgent.validate_task({"env_id": "MountainCar-v0"})
    task = EfficientZeroAgent.validate_task({"env_id": "MountainCar-v0", "rescale_observations": True})
    raw, scaled = EnvPool(raw_task, 1), EnvPool(task, 1)
    raw.reset_to(0, 7)
    scaled.reset_to(0, 7)
    lo, hi = np.array([-1.2, -0.07]), np.array([0.6, 0.07])
    seen = []
    for t in range(300):
        action = 2 if (t // 40) % 2 == 0 else 0  # rock back and forth: the velocity grows
        (r, *_), (s, *_) = raw.step(0, action), scaled.step(0, action)
        np.testing.assert_allclose(s, 2 * (r - lo) / (hi - lo) - 1, atol=1e-5)
        seen.append(s)
    seen = np.array(seen)
    assert seen.min() >= -1 and seen.max() <= 1 and np.abs(seen[:, 1]).max() > 0.3  # raw velocity at most 0.07
    assert observation_spec(task).shape == (2,)


def test_rescaling_leaves_unbounded_components_and_refuses_images():
    raw_task = EfficientZeroAgent.validate_task({"env_id": "CartPole-v1"})
    task = EfficientZeroAgent.validate_task({"env_id": "CartPole-v1", "rescale_observations": True})
    r, _ = make_env(raw_task).reset(seed=3)
    s, _ = make_env(task).reset(seed=3)
    np.testing.assert_allclose(s[[1, 3]], r[[1, 3]])  # the velocities: unbounded, unchanged
    np.testing.assert_allclose(s[[0, 2]], r[[0, 2]] / np.array([4.8, 0.41887903]), rtol=1e-5)
    with pytest.raises(ValueError, match="task.rescale_observations: for vector observations"):
        EfficientZeroAgent.validate_task({"env_id": "MinAtar/Breakout-v1", "rescale_observations": True})
    with pytest.raises(ValueError, match="task.rescale_observations: expected true or false"):
        EfficientZeroAgent.validate_task({"env_id": "CartPole-v1", "rescale_observations": "yes"})
