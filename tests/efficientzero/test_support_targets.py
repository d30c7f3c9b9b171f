import numpy as np
import pytest
import torch

from agents.efficientzero.support import h, h_inv, scalar_to_support, support_to_scalar
from agents.efficientzero.targets import nstep_value_targets, value_prefix_targets


def test_transform_round_trip():
    x = torch.tensor([-500.0, -37.5, -1.0, -1e-3, 0.0, 0.3, 1.0, 42.0, 300.0, 1e4], dtype=torch.float64)
    assert torch.allclose(h_inv(h(x)), x, rtol=1e-9, atol=1e-9)
    assert torch.allclose(h(torch.tensor([3.0])), torch.tensor([1.0 + 0.003]))  # sqrt(4) - 1 + 0.001 * 3


def test_two_hot_and_back():
    x = torch.tensor([0.0, 1.0, 2.5, -7.0, 120.0], dtype=torch.float64)
    probs = scalar_to_support(x, 20)
    assert probs.shape == (5, 41)
    assert torch.allclose(probs.sum(-1), torch.ones(5, dtype=torch.float64))
    assert (probs > 0).sum(-1).max() <= 2
    # expectation on the transformed scale equals h(x): exact two-hot
    bins = torch.arange(-20, 21, dtype=torch.float64)
    assert torch.allclose((probs * bins).sum(-1), h(x))
    # logits = log(probs) decode back to x
    back = support_to_scalar(torch.log(probs + 1e-30), 20)
    assert torch.allclose(back, x, atol=1e-6)


def test_two_hot_clamps_to_support():
    probs = scalar_to_support(torch.tensor([1e6, -1e6]), 5)
    assert probs[0, -1] == 1 and probs[1, 0] == 1


def _window(rewards, terminal_at=None, length=None):
    L = len(rewards)
    r = np.asarray(rewards, dtype=np.float64)[None]
    t = np.zeros((1, L), bool)
    if terminal_at is not None:
        t[0, terminal_at] = True
    m = np.zeros((1, L), bool)
    m[0, : (length if length is not None else L)] = True
    return r, t, m


def test_nstep_bootstraps_inside_episode():
    r, t, m = _window([1, 2, 3, 4, 5, 6, 7])
    v = np.arange(10, 17, dtype=np.float64)[None]
    z, valid = nstep_value_targets(r, t, m, v, 0.9, 2, 3)
    expect = [1 + 0.9 * 2 + 0.81 * 12, 2 + 0.9 * 3 + 0.81 * 13, 3 + 0.9 * 4 + 0.81 * 14]
    assert np.allclose(z[0], expect) and valid.all()


def test_nstep_stops_at_terminal():
    r, t, m = _window([1, 1, 1, 0, 0, 0, 0], terminal_at=2, length=3)
    v = np.full((1, 7), 100.0)
    z, valid = nstep_value_targets(r, t, m, v, 0.5, 3, 4)
    assert np.allclose(z[0], [1 + 0.5 + 0.25, 1 + 0.5, 1, 0])
    assert valid[0].tolist() == [True, True, True, False]


def test_nstep_segment_end_backs_off_to_last_observation():
    # trajectory of 3 rows that ends without a terminal (truncation / end of a game segment)
    r, t, m = _window([1, 1, 1, 0, 0, 0], length=3)
    v = np.array([[10.0, 20.0, 30.0, 99.0, 99.0, 99.0]])
    z, _ = nstep_value_targets(r, t, m, v, 0.5, 3, 3)
    # position 0: r0 + g r1 + g^2 V(obs_2) (r2 has no successor observation to bootstrap from)
    assert np.allclose(z[0], [1 + 0.5 + 0.25 * 30, 1 + 0.5 * 30, 30])


def test_value_prefix_resets_every_horizon():
    r = np.array([[1.0, 2.0, 3.0, 4.0, 5.0]])
    m = np.ones_like(r, bool)
    assert value_prefix_targets(r, m, 2, 5)[0].tolist() == [1, 3, 3, 7, 5]
    assert value_prefix_targets(r, m, 5, 5)[0].tolist() == [1, 3, 6, 10, 15]
    m[0, 3:] = False  # past the trajectory end the prefix stops growing
    assert value_prefix_targets(r, m, 5, 5)[0].tolist() == [1, 3, 6, 6, 6]


def test_window_too_short_is_refused():
    r, t, m = _window([1, 1, 1])
    with pytest.raises(ValueError, match="window length"):
        nstep_value_targets(r, t, m, r, 0.9, 3, 2)


def test_finer_bins_encode_and_decode_with_their_step():
    """`arch.support_step`: bins k * step on the h scale. The two-hot's expectation is still h(x), the two bins
    it uses lie one step apart, and decoding (torch, numpy, the search's numba) recovers x."""
    from agents.efficientzero.mcts import _support_scalar
    from agents.efficientzero.support import support_to_scalar_np

    x = torch.tensor([0.0, 1.0, -7.0, 120.0, -190.0], dtype=torch.float64)
    probs = scalar_to_support(x, 80, step=0.25)
    bins = torch.arange(-80, 81, dtype=torch.float64) * 0.25
    assert torch.allclose((probs * bins).sum(-1), h(x)) and torch.allclose(probs.sum(-1), torch.ones(5, dtype=torch.float64))
    used = [bins[p > 0] for p in probs]
    assert all(len(u) == 1 or (u[1] - u[0]).item() == 0.25 for u in used)
    logits = torch.log(probs + 1e-30)
    assert torch.allclose(support_to_scalar(logits, 80, step=0.25), x, atol=1e-6)
    assert np.allclose(support_to_scalar_np(logits.numpy(), 80, step=0.25), x.numpy(), atol=1e-6)
    assert np.allclose([_support_scalar(row, 80, 0.25) for row in logits.numpy()], x.numpy(), atol=1e-6)
    # the same step-1 support covers 4x the range: 120 sits in a bin 4x as wide
    coarse = scalar_to_support(x, 20)
    assert (coarse > 0).sum().item() <= 10 and torch.allclose(support_to_scalar(torch.log(coarse + 1e-30), 20), x, atol=1e-6)
    # clamped at S * step
    assert scalar_to_support(torch.tensor([1e4]), 8, step=0.5)[0, -1] == 1
