"""Positions past a terminal (hp `absorbing_terminal`, opt-in): trained as an absorbing state (value 0,
no further reward) instead of masked out of the value and value-prefix losses."""

import numpy as np
import torch

from agents.efficientzero import learner
from agents.efficientzero.agent import EfficientZeroAgent
from agents.efficientzero.model import build_model
from agents.efficientzero.support import scalar_to_support
from evo.replay import build_replay
from tests.efficientzero.test_agent import FAST_HP, SMALL_ARCH

TASK = EfficientZeroAgent.validate_task({"env_id": "CartPole-v1", "num_envs": 1, "replay_capacity": 100})
HP = {**{k: hp.value for k, hp in EfficientZeroAgent.default_hparams().items()}, **FAST_HP, "batch_size": 64}


def _batch(absorbing: bool):
    store = build_replay(EfficientZeroAgent.replay_spec(TASK), 0, distributed=False)
    n = 4  # a 4-row episode that ends in a terminal: the pole fell after the 4th action
    store.insert({"obs": np.zeros((n, 4), np.float32), "action": np.zeros(n, np.int64), "reward": np.ones(n, np.float32),
                  "terminal": np.array([False, False, False, True]), "policy": np.full((n, 2), 0.5, np.float32),
                  "root_value": np.zeros(n, np.float32), "episode": np.full(n, 7, np.int64), "step": np.arange(n)})
    model = build_model((4,), 2, EfficientZeroAgent.validate_arch(SMALL_ARCH), torch.Generator().manual_seed(0))
    hp = {**HP, "absorbing_terminal": absorbing}
    seq = learner.sample_windows(store, hp)
    boot = np.full(np.asarray(seq.mask).shape, 5.0)
    return learner.batch_from_windows(seq, boot, model, hp, np.random.default_rng(0)), model, hp


def test_positions_past_a_terminal_learn_value_zero_and_no_reward_when_absorbing():
    off, _, _ = _batch(False)
    on, model, hp = _batch(True)
    t_off, t_on = off.tensors, on.tensors
    assert torch.equal(t_off["value_valid"], t_off["valid"])  # the default: masked out, as before
    extra = (t_on["value_valid"] > 0) & (t_on["valid"] == 0)
    assert extra.any()  # every window of a 4-row episode with K = 3 reaches past its terminal or ends on it
    zero = scalar_to_support(torch.zeros(1), model.value_support)[0]
    assert torch.allclose(t_on["value_target"][extra], zero.expand(int(extra.sum()), -1))
    # the value prefix is learned past the terminal too, and stays at the episode's rewards up to it
    assert t_on["mask"].sum() > t_off["mask"].sum()
    assert torch.equal(t_on["valid"], t_off["valid"]) and torch.equal(t_on["policy_target"], t_off["policy_target"])
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    for path in ("baseline", "fast"):  # the learner's two paths (docs/efficientzero.md) train the same terms
        with learner.use_path(path):
            loss_on = learner.loss_terms(model, params, buffers, t_on, hp)["loss_value"]
            loss_off = learner.loss_terms(model, params, buffers, t_off, hp)["loss_value"]
        assert loss_on > loss_off, path  # more value terms enter the loss
        if path == "baseline":
            baseline_on = loss_on
    assert torch.allclose(loss_on, baseline_on, rtol=1e-5)
