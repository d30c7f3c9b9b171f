"""Offline ILQL data as a per-token MDP, padded to fixed shapes for the shared replay store.

One row is one episode:
  tokens      (L,)   int64  token ids, right-padded with 0
  attn_mask   (L,)   bool   real tokens
  action_idxs (A,)   int64  positions p whose hidden state chose the action tokens[p + 1]
  state_idxs  (A+1,) int64  the state of each action, then the final state
  rewards     (A,)   float32 reward received for each action
  terminals   (A+1,) bool   state is terminal (the TD target of action i uses terminals[i + 1])
  action_mask (A,)   bool   real action slots
Tokens between actions that are not actions (observations such as Wordle feedback) are
"transitions": the policy may learn them with `transition_weight`, Q never sees them as actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["Episode", "episodes_to_arrays", "validate_dataset", "replay_schema", "to_torch", "FIELDS"]

FIELDS = ("tokens", "attn_mask", "action_idxs", "state_idxs", "rewards", "terminals", "action_mask")


@dataclass
class Episode:
    tokens: list[int]
    action_idxs: list[int]       # positions p with tokens[p + 1] an action
    rewards: list[float]         # one per action
    done: bool = True            # whether the final state is terminal


def episodes_to_arrays(episodes: Sequence[Episode], max_len: int, max_actions: int) -> dict[str, np.ndarray]:
    n = len(episodes)
    out = {
        "tokens": np.zeros((n, max_len), np.int64),
        "attn_mask": np.zeros((n, max_len), bool),
        "action_idxs": np.zeros((n, max_actions), np.int64),
        "state_idxs": np.zeros((n, max_actions + 1), np.int64),
        "rewards": np.zeros((n, max_actions), np.float32),
        "terminals": np.ones((n, max_actions + 1), bool),
        "action_mask": np.zeros((n, max_actions), bool),
    }
    for i, ep in enumerate(episodes):
        if len(ep.tokens) > max_len:
            raise ValueError(f"episode {i}: tokens: expected at most {max_len} tokens, found {len(ep.tokens)}")
        if len(ep.action_idxs) > max_actions:
            raise ValueError(f"episode {i}: action_idxs: expected at most {max_actions} actions, found {len(ep.action_idxs)}")
        if len(ep.rewards) != len(ep.action_idxs):
            raise ValueError(f"episode {i}: rewards: expected one per action ({len(ep.action_idxs)}), found {len(ep.rewards)}")
        t, a = len(ep.tokens), len(ep.action_idxs)
        out["tokens"][i, :t] = ep.tokens
        out["attn_mask"][i, :t] = True
        out["action_idxs"][i, :a] = ep.action_idxs
        out["state_idxs"][i, :a] = ep.action_idxs
        out["state_idxs"][i, a:] = t - 1
        out["rewards"][i, :a] = ep.rewards
        out["terminals"][i, :a] = False
        out["terminals"][i, a] = ep.done
        out["action_mask"][i, :a] = True
    validate_dataset(out)
    return out


def validate_dataset(data: dict[str, Any], vocab_size: int | None = None) -> dict[str, Any]:
    """Refuse malformed data with an error naming the field, what was expected and what was found."""
    missing = [f for f in FIELDS if f not in data]
    if missing:
        raise ValueError(f"dataset.{missing[0]}: expected fields {list(FIELDS)}, missing {missing}")
    arr = {k: np.asarray(data[k].cpu() if torch.is_tensor(data[k]) else data[k]) for k in FIELDS}
    tokens = arr["tokens"]
    if tokens.ndim != 2:
        raise ValueError(f"dataset.tokens: expected shape (N, L), found {tokens.shape}")
    n, length = tokens.shape
    a = arr["action_idxs"].shape[-1] if arr["action_idxs"].ndim == 2 else -1
    expect = {"attn_mask": (n, length), "action_idxs": (n, a), "state_idxs": (n, a + 1), "rewards": (n, a),
              "terminals": (n, a + 1), "action_mask": (n, a)}
    for key, shape in expect.items():
        if arr[key].shape != shape:
            raise ValueError(f"dataset.{key}: expected shape {shape} (N={n}, L={length}, A={a}, S=A+1), found {arr[key].shape}")
    mask = arr["action_mask"].astype(bool)
    act = arr["action_idxs"]
    if np.any(mask & ((act < 0) | (act >= length - 1))):
        row, col = np.argwhere(mask & ((act < 0) | (act >= length - 1)))[0]
        raise ValueError(f"dataset.action_idxs: expected positions in [0, {length - 2}] (the action is tokens[p + 1]), "
                         f"found {act[row, col]} at row {row}, slot {col}")
    st = arr["state_idxs"]
    if np.any((st < 0) | (st >= length)):
        row, col = np.argwhere((st < 0) | (st >= length))[0]
        raise ValueError(f"dataset.state_idxs: expected positions in [0, {length - 1}], "
                         f"found {st[row, col]} at row {row}, slot {col}")
    attn = arr["attn_mask"].astype(bool)
    lengths = attn.sum(1)
    if np.any(mask & (act + 1 >= lengths[:, None])):
        row, col = np.argwhere(mask & (act + 1 >= lengths[:, None]))[0]
        raise ValueError(f"dataset.action_idxs: action at position {act[row, col] + 1} of row {row} lies beyond its "
                         f"{lengths[row]} real tokens")
    if vocab_size is not None and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"dataset.tokens: expected ids in [0, {vocab_size - 1}], found range [{tokens.min()}, {tokens.max()}]")
    if not np.all(np.isfinite(arr["rewards"])):
        raise ValueError("dataset.rewards: expected finite numbers, found NaN or inf")
    return data


def replay_schema(max_len: int, max_actions: int, row_field: str | None = None):
    """The evo.replay Schema for ILQL rows.

    With `row_field`, rows carry their position in the offline dataset and are keyed by it alone:
    the dataset is a multiset (1000 random walks repeat short walks many times), and collapsing
    equal episodes would change the behaviour distribution that BC and ILQL learn from. Without
    it, rows are keyed by their content.
    """
    from evo.replay import Field, Schema

    fields = {
        "tokens": Field("int64", (max_len,)),
        "attn_mask": Field("bool", (max_len,)),
        "action_idxs": Field("int64", (max_actions,)),
        "state_idxs": Field("int64", (max_actions + 1,)),
        "rewards": Field("float32", (max_actions,)),
        "terminals": Field("bool", (max_actions + 1,)),
        "action_mask": Field("bool", (max_actions,)),
    }
    if row_field is None:
        return Schema(fields, key_fields=("tokens", "action_idxs", "rewards"))
    fields[row_field] = Field("int64", ())
    return Schema(fields, key_fields=(row_field,))


def to_torch(batch: dict[str, np.ndarray], device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(batch[k])).to(device) for k in FIELDS}  # copies: store arrays may be read-only
