"""Learning targets computed from replayed sequence windows (numpy, no model inside).

A window holds L = K + 1 + td_steps consecutive rows of one trajectory starting at the sampled
position; `mask` is False past the trajectory's end. Row t stores obs_t, the action a_t taken
there, the reward r_t received for it and `terminal_t` (the episode terminated after a_t).

* Value targets (n-step, bootstrapped): z_i = sum_{j<n} g^j r_{i+j} + g^n V(obs_{i+n}).
  A terminal inside the horizon ends the sum with no bootstrap. A trajectory that ends without a
  terminal (time-limit truncation, or the end of a collected game segment) has no stored
  successor observation, so the horizon shortens: bootstrap from V(obs) of its last row instead
  of adding that row's reward. V comes from the target network at sample time (reanalyse).
* Value-prefix targets for unroll step k = 1..K: the sum of rewards since the last LSTM reset,
  r_s + ... + r_{k-1} with s = floor((k-1)/H)*H (H = lstm_horizon_len), the quantity the
  dynamics LSTM predicts; search recovers rewards as differences of consecutive prefixes.
"""

from __future__ import annotations

import numpy as np

__all__ = ["nstep_value_targets", "bootstrap_rows", "value_prefix_targets"]


def nstep_value_targets(rewards: np.ndarray, terminals: np.ndarray, mask: np.ndarray, values: np.ndarray,
                        discount: float, td_steps: int, num_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """n-step value targets for window positions 0..num_positions-1.

    rewards, terminals, mask, values: [B, L] with L >= num_positions + td_steps.
    Returns (targets [B, P], valid [B, P]); invalid positions (past the end) get target 0.
    """
    B, L = rewards.shape
    if L < num_positions + td_steps:
        raise ValueError(f"window length {L} < num_positions {num_positions} + td_steps {td_steps}")
    mask = mask.astype(bool)
    terminals = terminals.astype(bool) & mask
    rewards = np.where(mask, rewards, 0.0).astype(np.float64)
    values = values.astype(np.float64)
    nxt = np.concatenate([mask[:, 1:], np.zeros((B, 1), bool)], axis=1)  # row t+1 exists
    # all positions at once, one horizon step j at a time: row i + j of position i is column j + i of the
    # [B, P] slices; each target adds its terms in the order of j, as a loop over positions would
    P = num_positions
    z = np.zeros((B, P))
    alive = mask[:, :P].copy()
    for j in range(td_steps):
        g = discount ** j
        term, succ = terminals[:, j: j + P], nxt[:, j: j + P]
        ends_here = alive & ~term & ~succ   # no successor stored: back off
        z += np.where(ends_here, g * values[:, j: j + P], 0.0)
        add = alive & ~ends_here
        z += np.where(add, g * rewards[:, j: j + P], 0.0)
        alive = add & ~term
    z += np.where(alive, discount ** td_steps * values[:, td_steps: td_steps + P], 0.0)
    targets = z
    return targets, mask[:, :num_positions].copy()


def bootstrap_rows(terminals: np.ndarray, mask: np.ndarray, td_steps: int, num_positions: int) -> np.ndarray:
    """The rows [B, L] whose bootstrap value `nstep_value_targets` can read: inside the trajectory,
    and either a horizon's end (positions td_steps .. td_steps + num_positions - 1) or the last
    stored row of a trajectory that ends without a terminal (the shortened horizon's back-off).
    The values of every other row are never used (tests/efficientzero/test_fast_path.py poisons
    them with NaN), so a learner may compute only these."""
    mask = np.asarray(mask, dtype=bool)
    B, L = mask.shape
    nxt = np.concatenate([mask[:, 1:], np.zeros((B, 1), bool)], axis=1)
    rows = mask & ~nxt & ~np.asarray(terminals, dtype=bool)
    ends = np.zeros(L, bool)
    ends[td_steps: td_steps + num_positions] = True
    return mask & (rows | ends)


def value_prefix_targets(rewards: np.ndarray, mask: np.ndarray, horizon: int, num_unroll: int) -> np.ndarray:
    """Targets [B, K] for unroll steps 1..K from window rewards [B, L >= K] (zero past the end)."""
    r = np.where(mask[:, :num_unroll].astype(bool), rewards[:, :num_unroll], 0.0).astype(np.float64)
    out = np.zeros_like(r)
    acc = np.zeros(r.shape[0])
    for k in range(1, num_unroll + 1):
        if (k - 1) % horizon == 0:
            acc = np.zeros(r.shape[0])
        acc = acc + r[:, k - 1]
        out[:, k - 1] = acc
    return out
