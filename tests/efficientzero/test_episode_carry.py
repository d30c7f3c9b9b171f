"""Episodes do not end at a `train` call's boundary: the envs' episodes in flight, their returns and
step counts carry over to the next call through the member's state (seeds and action logs, replayed),
so a member rebuilt from its state — a Ray worker, a resume from a checkpoint, a clone — continues
exactly where it was."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from agents.efficientzero.agent import EfficientZeroAgent
from agents.efficientzero.envs import EnvPool
from evo.agent import AgentContext
from evo.checkpoint import load_state, save_state
from evo.replay import build_replay
from tests.efficientzero.test_agent import FAST_HP, SMALL_ARCH

# CartPole's episodes last up to 500 steps; 2 envs and 24 steps a call cut every one of them
TASK = {"env_id": "CartPole-v1", "num_envs": 2, "eval_episodes": 1, "min_replay": 10_000, "replay_capacity": 5000,
        "segment_length": 50}


class RecordingReplay:
    """A real store that keeps every inserted batch."""

    def __init__(self, task):
        self.store = build_replay(EfficientZeroAgent.replay_spec(task), 0, distributed=False)
        self.inserts: list[dict] = []

    def insert(self, batch):
        self.inserts.append({k: np.array(v) for k, v in batch.items()})
        return self.store.insert(batch)

    def __len__(self):
        return len(self.store)


def _member(seed=0, index=0, task=TASK, replay=None):
    ctx = AgentContext(task=task, replay=replay if replay is not None else RecordingReplay(task), seed=0)
    return EfficientZeroAgent.create(SMALL_ARCH, FAST_HP, seed, index, ctx)


def _steps(agent) -> list[np.ndarray]:
    return [b["step"] for b in agent.context.replay.inserts]


def test_episodes_continue_across_train_calls():
    agent = _member()
    agent.train(24)
    in_flight, done = list(agent.selfplay.ep_steps), len(agent.context.replay.inserts)
    assert max(in_flight) > 0
    agent.train(24)
    # each env's episode goes on where it was: its next piece starts at the step it had reached
    firsts = [int(s[0]) for s in _steps(agent)[done:]]
    assert all(step in firsts for step in in_flight)
    for _ in range(30):
        if agent.train(24)["train_episodes"]:
            break
    else:
        pytest.fail("no episode finished: episodes longer than one call must finish in a later one")


def test_a_member_rebuilt_from_its_checkpoint_continues_its_episodes_exactly(tmp_path):
    a = _member(seed=4)
    a.train(24)
    save_state(tmp_path / "m", a.get_state())  # what a resume or a Ray worker starts from
    state, _ = load_state(tmp_path / "m")
    b = EfficientZeroAgent.from_state(state, AgentContext(task=TASK, replay=RecordingReplay(TASK), seed=0))
    assert np.array_equal(a.selfplay._pool.observations(), b.selfplay._training_pool(b.rng).observations())
    ma, mb = a.train(24), b.train(24)
    ma.pop("train_seconds"), mb.pop("train_seconds")
    assert ma == mb
    rows_a, rows_b = a.context.replay.inserts[-2:], b.context.replay.inserts
    for x, y in zip(rows_a, rows_b):
        for k in ("obs", "action", "reward", "terminal", "step"):
            assert np.array_equal(x[k], y[k]), k
    assert b.selfplay.carry_restarts == 0


def test_a_clone_inherits_its_parents_episodes_in_flight():
    parent = _member(seed=5)
    parent.train(24)
    child = parent.clone(9)
    pool = child.selfplay._training_pool(child.rng)
    assert np.array_equal(pool.observations(), parent.selfplay._pool.observations())
    assert child.selfplay.ep_steps == parent.selfplay.ep_steps and child.selfplay.ep_returns == parent.selfplay.ep_returns
    inherited = list(child.selfplay.ep_steps)
    child.train(2)
    assert sorted(int(b["step"][0]) for b in child.context.replay.inserts[-2:]) == sorted(inherited)


class _Noisy(gym.Env):
    """Observations from an unseeded generator: replaying its actions cannot reproduce them."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.random.default_rng().uniform(-1, 1, 2).astype(np.float32), {}

    def step(self, action):
        return np.random.default_rng().uniform(-1, 1, 2).astype(np.float32), 1.0, False, False, {}


def test_an_env_that_cannot_be_replayed_restarts_its_episode_and_says_so():
    task = EfficientZeroAgent.validate_task({"env_id": f"{__name__}:_Noisy", "num_envs": 2})
    rng = np.random.default_rng(0)
    pool = EnvPool(task, 2)
    pool.reset_all(rng)
    for _ in range(3):
        pool.step(0, 1), pool.step(1, 0)
    again = EnvPool(task, 2)
    assert again.restore(pool.snapshot(), rng) == [0, 1] and again.restarts == 2
    assert all(len(a) == 0 for a in again.actions)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "MinAtar/Breakout-v1"])  # MinAtar: sticky actions, random spawns
def test_replay_rebuilds_the_exact_env_state(env_id):
    task = EfficientZeroAgent.validate_task({"env_id": env_id, "num_envs": 3})
    rng = np.random.default_rng(1)
    pool = EnvPool(task, 3)
    pool.reset_all(rng)
    for _ in range(40):
        for i in range(3):
            _, _, term, trunc, _ = pool.step(i, int(rng.integers(pool.envs[i].action_space.n)))
            if term or trunc:
                pool.reset(i, rng)
    again = EnvPool(task, 3)
    assert again.restore(pool.snapshot(), rng) == []
    for _ in range(20):  # and they keep stepping alike
        a = int(rng.integers(2))
        for i in range(3):
            x, y = pool.step(i, a), again.step(i, a)
            assert np.array_equal(x[0], y[0]) and x[1:] == y[1:]
            if x[2] or x[3]:
                pool.reset_to(i, 7), again.reset_to(i, 7)
