"""Self-play writes each env's trajectory to the shared store in segments under member-scoped
episode ids, hands control back after every vector step, and evaluates from fixed starts."""

import numpy as np
import pytest
import torch

from agents.efficientzero.agent import EfficientZeroAgent
from agents.efficientzero.model import build_model
from agents.efficientzero.selfplay import EPISODE_SHIFT, SelfPlay
from evo.replay import build_replay
from tests.efficientzero.test_agent import FAST_HP, SMALL_ARCH

TASK = EfficientZeroAgent.validate_task({"env_id": "CartPole-v1", "num_envs": 2, "eval_episodes": 2,
                                         "segment_length": 5, "replay_capacity": 1000})
HP = {**{k: hp.value for k, hp in EfficientZeroAgent.default_hparams().items()}, **FAST_HP}


class RecordingReplay:
    """The real store, with every inserted batch kept for inspection (all else passes through, so a
    training member can sample from it)."""

    def __init__(self, store):
        self.store, self.inserts = store, []

    def insert(self, batch):
        self.inserts.append({k: np.array(v) for k, v in batch.items()})
        return self.store.insert(batch)

    def __len__(self):
        return len(self.store)

    def __getattr__(self, name):
        return getattr(self.store, name)


def _model():
    arch = EfficientZeroAgent.validate_arch(SMALL_ARCH)
    return build_model((4,), 2, arch, torch.Generator().manual_seed(0))


def test_collect_writes_segments_under_member_episode_ids():
    store = build_replay(EfficientZeroAgent.replay_spec(TASK), 0, distributed=False)
    replay = RecordingReplay(store)
    selfplay = SelfPlay(TASK)
    calls: list[int] = []
    finished = selfplay.collect(_model(), HP, np.random.default_rng(0), replay, 3, 30, calls.append)
    assert calls == [2] * 15  # after every vector step, with the env steps it took
    assert len(store) == sum(len(b["obs"]) for b in replay.inserts) == 30
    ids = [int(b["episode"][0]) for b in replay.inserts]
    assert len(set(ids)) == len(ids)  # one id per stored piece
    assert all(i >> EPISODE_SHIFT == 3 and 1 <= i & ((1 << EPISODE_SHIFT) - 1) <= selfplay.episodes for i in ids)
    for b in replay.inserts:
        n = len(b["obs"])
        assert 1 <= n <= TASK["segment_length"]
        assert np.all(b["episode"] == b["episode"][0])
        assert np.array_equal(np.diff(b["step"]), np.ones(n - 1))  # consecutive steps of one trajectory
        assert not b["terminal"][:-1].any()  # a terminal ends its piece
        assert np.allclose(b["policy"].sum(1), 1.0) and np.isfinite(b["root_value"]).all()
    assert len(finished) == sum(bool(b["terminal"][-1]) for b in replay.inserts)


def test_evaluation_is_repeatable_from_the_run_seed():
    selfplay, model, hp = SelfPlay(TASK), _model(), {**HP, "eval_simulations": 2}
    first = selfplay.evaluate(model, hp, run_seed=5)
    assert set(first) == {"eval_return", "eval_return_std", "eval_length", "eval_truncated"}
    assert first == SelfPlay(TASK).evaluate(model, hp, run_seed=5) == selfplay.evaluate(model, hp, run_seed=5)
    assert first["eval_length"] >= 1 and first["eval_return"] == first["eval_length"]  # CartPole: +1 per step


def test_a_time_limit_cut_is_not_a_terminal_and_its_targets_bootstrap():
    """CartPole cut by a 4-step TimeLimit (a random policy never fails that fast): every episode ends
    truncated, its last row is stored non-terminal, and the n-step target of that row bootstraps from
    the value (a terminal would give the bare reward)."""
    from agents.efficientzero.targets import nstep_value_targets

    task = EfficientZeroAgent.validate_task({**TASK, "env_kwargs": {"max_episode_steps": 4}, "segment_length": 200})
    store = build_replay(EfficientZeroAgent.replay_spec(task), 0, distributed=False)
    replay = RecordingReplay(store)
    finished = SelfPlay(task).collect(_model(), HP, np.random.default_rng(0), replay, 0, 16, lambda n: None)
    assert finished == [4.0] * 4
    for b in replay.inserts:
        assert len(b["obs"]) == 4 and not b["terminal"].any()
        rewards, terminals = b["reward"][None].astype(np.float64), b["terminal"][None]
        mask, values = np.ones((1, 4), bool), np.full((1, 4), 10.0)
        z, _ = nstep_value_targets(np.pad(rewards, ((0, 0), (0, 3))), np.pad(terminals, ((0, 0), (0, 3))),
                                   np.pad(mask, ((0, 0), (0, 3))), np.pad(values, ((0, 0), (0, 3))), 0.9, 3, 4)
        assert z[0, -1] == pytest.approx(10.0)  # the cut row: its own value, not 0 or the reward alone
        assert z[0, 2] == pytest.approx(1.0 + 0.9 * 10.0)
