"""Batched MCTS for EfficientZero with the whole forest held in arrays.

One search runs B independent trees (one per root) in lock-step: every simulation descends all
B trees (compiled loop over arrays), calls the network *once* on the B new leaves, then expands
and backs up all B paths. Nothing is a Python object per node. Node n of tree b lives at
[b, n] in every array; the leaf created by simulation s is node s+1 in every tree, so the
latent / LSTM buffers are written with one contiguous slice per simulation.

Rules (MuZero / EfficientZero):
* pUCT: score = Q_norm + P * sqrt(N_parent) / (1 + N_child) * (log((N_parent + 19652 + 1) / 19652) + 1.25);
  unvisited children use the mean normalised Q of their visited siblings (0 if none), computed per
  tree, so nothing leaks between batch entries.
* Q of a child = reward + discount * mean value, normalised by per-tree min-max statistics with
  a 0.01 floor on the spread.
* rewards come from value-prefix differences; the LSTM hidden state is reset (and the parent
  prefix treated as 0) every `lstm_horizon_len` steps of depth.
* Dirichlet(0.3) noise mixed in at 0.25 on the root priors when collecting.
* Ties are broken by lowest action index; the only randomness is the caller's numpy Generator
  (noise and action sampling), so a search is deterministic for a given seed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from agents.efficientzero.flat import search_calls

try:  # numba compiles the tree loops; without it the same code runs (slowly) as Python
    from numba import njit
except ImportError:  # pragma: no cover
    def njit(*args: Any, **kwargs: Any) -> Any:
        if args and callable(args[0]):
            return args[0]
        return lambda f: f

__all__ = ["MCTSConfig", "SearchResult", "BatchedMCTS", "search", "select_actions", "SearchModel", "SEARCH_KINDS",
           "considered_visits"]

SEARCH_KINDS = ("puct", "gumbel")
PB_C_BASE = 19652.0
PB_C_INIT = 1.25


class SearchModel(Protocol):
    action_space_size: int
    value_support: int
    reward_support: int
    support_step: float

    def represent(self, obs: torch.Tensor) -> torch.Tensor: ...
    def predict(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...
    def dynamics(self, latent: torch.Tensor, action: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]) -> Any: ...
    def initial_hidden(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class MCTSConfig:
    num_simulations: int = 16
    discount: float = 0.997
    lstm_horizon_len: int = 5
    dirichlet_alpha: float = 0.3
    exploration_fraction: float = 0.25
    value_min_max_delta: float = 0.01
    search: str = "puct"             # "puct" (MuZero) or "gumbel" (Gumbel MuZero, Danihelka et al. 2022)
    max_considered_actions: int = 16  # Gumbel: root actions sampled without replacement (Gumbel-top-k)
    gumbel_scale: float = 1.0         # Gumbel: scale of the root noise when collecting (0 at evaluation)

    @classmethod
    def from_hparams(cls, hp: Mapping[str, Any], num_simulations: int | None = None) -> MCTSConfig:
        """The search an EfficientZero member runs with its hyperparameters (`num_simulations`, `discount`,
        `lstm_horizon_len`, `dirichlet_alpha`, `exploration_fraction`, `search`, `max_considered_actions`);
        `num_simulations` overrides."""
        return cls(num_simulations=int(num_simulations or hp["num_simulations"]), discount=float(hp["discount"]),
                   lstm_horizon_len=int(hp["lstm_horizon_len"]), dirichlet_alpha=float(hp["dirichlet_alpha"]),
                   exploration_fraction=float(hp["exploration_fraction"]), search=str(hp.get("search", "puct")),
                   max_considered_actions=int(hp.get("max_considered_actions", 16)))

    def __post_init__(self) -> None:
        if self.search not in SEARCH_KINDS:
            raise ValueError(f"search: expected one of {list(SEARCH_KINDS)}, found {self.search!r}")


@dataclass
class SearchResult:
    visit_counts: np.ndarray   # [B, A] visits of the root's children (sum = num_simulations)
    root_values: np.ndarray    # [B] mean backed-up value at the root
    policy: np.ndarray         # [B, A] the policy target: visit distribution (PUCT), improved policy (Gumbel)
    root_prior: np.ndarray     # [B, A] root priors after noise
    # [B] the action a Gumbel root chose (sequential halving's survivor); -1 for PUCT roots, whose action
    # is drawn from the visits by the caller (`select_actions`). None: no root searched with Gumbel.
    action: np.ndarray | None = None


# ---------------------------------------------------------------------------------------------
# compiled tree kernels
# ---------------------------------------------------------------------------------------------
@njit(cache=True)
def _softmax_into(logits: np.ndarray, out: np.ndarray) -> None:
    m = logits.max()
    s = 0.0
    for a in range(logits.shape[0]):
        out[a] = math.exp(logits[a] - m)
        s += out[a]
    for a in range(logits.shape[0]):
        out[a] /= s


@njit(cache=True)
def _support_scalar(logits: np.ndarray, support: int, step: float) -> float:
    m = logits.max()
    s = 0.0
    e = 0.0
    for i in range(logits.shape[0]):
        p = math.exp(logits[i] - m)
        s += p
        e += p * (i - support)
    y = e / s * step
    eps = 0.001
    sign = 1.0 if y > 0 else (-1.0 if y < 0 else 0.0)
    t = (math.sqrt(1.0 + 4.0 * eps * (abs(y) + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return sign * (t * t - 1.0)


@njit(cache=True)
def _normalize(q: float, lo: float, hi: float, floor: float) -> float:
    if hi < lo:  # no statistics yet
        return q
    delta = hi - lo
    if delta < floor:
        delta = floor
    v = (q - lo) / delta
    if v < 0.0:
        v = 0.0
    elif v > 1.0:
        v = 1.0
    return v


@njit(cache=True)
def _completed_q(b, node, children, prior, visits, value_sum, reward, raw_value, discount, floor, out):
    """mctx's `qtransform_completed_by_mix_value` at `node` of tree b, into out[A]: the children's Q
    (reward + discount * mean value) where visited, else the node's mixed value (its network value
    averaged with the prior-weighted Q of the visited children), min-max rescaled over the children
    (spread floored at `floor`) and scaled by 0.1 * (50 + the most visits of a child)."""
    A = out.shape[0]
    n_sum = 0
    n_max = 0
    p_sum = 0.0
    pq_sum = 0.0
    for a in range(A):
        c = children[b, node, a]
        if c >= 0:
            q = reward[b, c] + discount * value_sum[b, c] / visits[b, c]
            out[a] = q
            n = visits[b, c]
            n_sum += n
            if n > n_max:
                n_max = n
            p = max(prior[b, node, a], 1e-30)
            p_sum += p
            pq_sum += p * q
    mixed = raw_value[b, node]
    if n_sum > 0:
        mixed = (raw_value[b, node] + n_sum * (pq_sum / p_sum)) / (n_sum + 1.0)
    lo = 1e300
    hi = -1e300
    for a in range(A):
        if children[b, node, a] < 0:
            out[a] = mixed
        if out[a] < lo:
            lo = out[a]
        if out[a] > hi:
            hi = out[a]
    spread = max(hi - lo, floor)
    scale = 0.1 * (50.0 + n_max)
    for a in range(A):
        out[a] = scale * (out[a] - lo) / spread


@njit(cache=True)
def _gumbel_root_action(b, considered, gumbel, root_logits, children, visits, cq):
    """Sequential halving at the root: among the children with exactly `considered` visits, the one
    with the largest gumbel + logit + completed Q (mctx's `score_considered`)."""
    A = cq.shape[0]
    best = -1e300
    best_a = 0
    for a in range(A):
        c = children[b, 0, a]
        n = visits[b, c] if c >= 0 else 0
        if n != considered:
            continue
        score = gumbel[b, a] + root_logits[b, a] + cq[a]
        if score > best:
            best = score
            best_a = a
    return best_a


@njit(cache=True)
def _gumbel_interior_action(b, node, children, prior, visits, cq, probs):
    """Deterministic non-root selection: the child whose share of visits lags most behind the improved
    policy softmax(log prior + completed Q) (mctx's `gumbel_muzero_interior_action_selection`)."""
    A = cq.shape[0]
    m = -1e300
    for a in range(A):
        probs[a] = math.log(max(prior[b, node, a], 1e-30)) + cq[a]
        if probs[a] > m:
            m = probs[a]
    s = 0.0
    n_sum = 0
    for a in range(A):
        probs[a] = math.exp(probs[a] - m)
        s += probs[a]
        c = children[b, node, a]
        if c >= 0:
            n_sum += visits[b, c]
    best = -1e300
    best_a = 0
    for a in range(A):
        c = children[b, node, a]
        n = visits[b, c] if c >= 0 else 0
        score = probs[a] / s - n / (1.0 + n_sum)
        if score > best:
            best = score
            best_a = a
    return best_a


@njit(cache=True)
def _select(children, prior, visits, value_sum, reward, minmax, discounts, floor, path, path_len,
            out_parent, out_action, live, gumbel_tree, gumbel, root_logits, raw_value, considered, sim):
    B, _, A = children.shape
    cq = np.empty(A)
    probs = np.empty(A)
    for b in range(B):
        if not live[b]:  # this tree's simulations are spent: its (ignored) network input is its root
            out_parent[b] = 0
            out_action[b] = 0
            continue
        discount = discounts[b]
        node = 0
        depth = 0
        path[b, 0] = 0
        lo, hi = minmax[b, 0], minmax[b, 1]
        while True:
            if gumbel_tree[b]:
                _completed_q(b, node, children, prior, visits, value_sum, reward, raw_value, discount, floor, cq)
                if node == 0:
                    best_a = _gumbel_root_action(b, considered[b, sim], gumbel, root_logits, children, visits, cq)
                else:
                    best_a = _gumbel_interior_action(b, node, children, prior, visits, cq, probs)
            else:
                best_a = _puct_action(b, node, children, prior, visits, value_sum, reward, discount, lo, hi, floor)
            c = children[b, node, best_a]
            if c < 0:
                out_parent[b] = node
                out_action[b] = best_a
                path_len[b] = depth + 1
                break
            node = c
            depth += 1
            path[b, depth] = node


@njit(cache=True)
def _puct_action(b, node, children, prior, visits, value_sum, reward, discount, lo, hi, floor):
    """pUCT selection at `node` of tree b: unvisited children valued at the mean normalised Q of the
    visited ones."""
    A = children.shape[2]
    n_parent = visits[b, node]
    # mean normalised Q over this node's visited children: the value for unvisited ones
    q_sum = 0.0
    n_vis = 0
    for a in range(A):
        c = children[b, node, a]
        if c >= 0:
            q_sum += _normalize(reward[b, c] + discount * value_sum[b, c] / visits[b, c], lo, hi, floor)
            n_vis += 1
    mean_q = q_sum / n_vis if n_vis > 0 else 0.0
    pb_c = math.log((n_parent + PB_C_BASE + 1.0) / PB_C_BASE) + PB_C_INIT
    sqrt_n = math.sqrt(n_parent)
    best = -1e30
    best_a = 0
    for a in range(A):
        c = children[b, node, a]
        if c >= 0:
            q = _normalize(reward[b, c] + discount * value_sum[b, c] / visits[b, c], lo, hi, floor)
            n_child = visits[b, c]
        else:
            q = mean_q
            n_child = 0
        score = q + prior[b, node, a] * sqrt_n / (1.0 + n_child) * pb_c
        if score > best:
            best = score
            best_a = a
    return best_a


@njit(cache=True)
def _expand_backup(leaf, out_parent, out_action, outputs, num_actions, value_support, reward_support, step,
                   children, prior, visits, value_sum, reward, vprefix, depth, minmax, discounts,
                   horizon, path, path_len, live, raw_value):
    B = children.shape[0]
    A = num_actions
    nv = 2 * value_support + 1
    for b in range(B):
        if not live[b]:
            continue
        discount = discounts[b]
        parent = out_parent[b]
        children[b, parent, out_action[b]] = leaf
        d = depth[b, parent] + 1
        depth[b, leaf] = d
        _softmax_into(outputs[b, :A], prior[b, leaf])
        value = _support_scalar(outputs[b, A:A + nv], value_support, step)
        raw_value[b, leaf] = value
        vp = _support_scalar(outputs[b, A + nv:], reward_support, step)
        parent_vp = 0.0 if depth[b, parent] % horizon == 0 else vprefix[b, parent]
        reward[b, leaf] = vp - parent_vp
        vprefix[b, leaf] = vp
        path[b, path_len[b]] = leaf
        n = path_len[b] + 1
        bootstrap = value
        for i in range(n - 1, -1, -1):
            node = path[b, i]
            value_sum[b, node] += bootstrap
            visits[b, node] += 1
            q = reward[b, node] + discount * value_sum[b, node] / visits[b, node]
            if q < minmax[b, 0]:
                minmax[b, 0] = q
            if q > minmax[b, 1]:
                minmax[b, 1] = q
            bootstrap = reward[b, node] + discount * bootstrap


@njit(cache=True)
def _gumbel_outputs(gumbel_tree, children, prior, visits, value_sum, reward, raw_value, discounts, floor, gumbel,
                    root_logits, policy, action):
    """For every Gumbel tree: the policy target softmax(root logits + completed Q) into policy[b] and
    the action into action[b]: among the most-visited root children, the largest gumbel + logit +
    completed Q (with the noise at 0, the greedy action)."""
    B, _, A = children.shape
    cq = np.empty(A)
    for b in range(B):
        if not gumbel_tree[b]:
            continue
        _completed_q(b, 0, children, prior, visits, value_sum, reward, raw_value, discounts[b], floor, cq)
        most = 0
        for a in range(A):
            c = children[b, 0, a]
            if c >= 0 and visits[b, c] > most:
                most = visits[b, c]
        action[b] = _gumbel_root_action(b, most, gumbel, root_logits, children, visits, cq)
        for a in range(A):
            cq[a] += root_logits[b, a]
        _softmax_into(cq, policy[b])


def model_device(model: Any) -> torch.device:
    """Where `model` computes: its `device` attribute (a fused population's search model), else that of
    its first parameter, else the CPU (a search model need not be an nn.Module)."""
    device = getattr(model, "device", None)
    if device is not None:
        return torch.device(device)
    first = next(model.parameters(), None) if hasattr(model, "parameters") else None
    return first.device if first is not None else torch.device("cpu")


# ---------------------------------------------------------------------------------------------
class BatchedMCTS:
    """Search from a batch of observations with a model exposing represent/predict/dynamics."""

    def __init__(self, config: MCTSConfig) -> None:
        self.config = config

    @torch.inference_mode()
    def run(self, model: SearchModel, obs: torch.Tensor | np.ndarray, rng: np.random.Generator | None = None,
            add_noise: bool = False, num_simulations: int | None = None) -> SearchResult:
        cfg = self.config
        sims = int(num_simulations or cfg.num_simulations)
        B = int(torch.as_tensor(obs).shape[0])
        noise = gumbel_noise = None
        gumbel = cfg.search == "gumbel"
        if add_noise:
            if rng is None:
                raise ValueError("add_noise=True needs a numpy Generator (rng) for the root noise")
            if gumbel:
                gumbel_noise = lambda A: cfg.gumbel_scale * rng.gumbel(size=(B, A))
            else:
                noise = lambda A: rng.dirichlet([cfg.dirichlet_alpha] * A, size=B)
        return search(model, obs, np.full(B, cfg.discount), np.full(B, sims, dtype=np.int64), int(cfg.lstm_horizon_len),
                      noise, np.full(B, cfg.exploration_fraction), cfg.value_min_max_delta,
                      gumbel=np.full(B, gumbel), gumbel_noise=gumbel_noise,
                      max_considered_actions=np.full(B, cfg.max_considered_actions))


@torch.inference_mode()  # no autograd bookkeeping at all (no_grad still tracks versions and views)
def search(model: SearchModel, obs: torch.Tensor | np.ndarray, discounts: np.ndarray, simulations: np.ndarray,
           lstm_horizon_len: int, noise: Callable[[int], np.ndarray] | None = None,
           exploration_fractions: np.ndarray | None = None, value_min_max_delta: float = 0.01,
           gumbel: np.ndarray | None = None, gumbel_noise: Callable[[int], np.ndarray] | None = None,
           max_considered_actions: np.ndarray | None = None) -> SearchResult:
    """B trees searched in lock-step, each with its own discount and simulation budget.

    `noise(A)`, when given, returns the [B, A] Dirichlet noise mixed into the root priors at each
    root's `exploration_fractions` (PUCT roots only).

    `gumbel` [B] (bool) marks the roots searched the Gumbel MuZero way (Danihelka et al. 2022, as in
    mctx's `gumbel_muzero_policy`): `gumbel_noise(A)`, when given, returns [B, A] Gumbel noise added to
    the root logits (none: greedy); the root's simulations go to the top `max_considered_actions` [B]
    of noise + logits and are halved among them by noise + logit + completed Q (sequential halving);
    below the root, the child whose visit share lags the improved policy most is descended into; the
    policy target is softmax(logits + completed Q) and `SearchResult.action` the surviving action.

    `BatchedMCTS.run` is this with one config for every root; a population's searches run as one call
    here with each member's settings on its own roots (a tree whose budget is spent stops; the network
    still sees a row for it, which is ignored).
    """
    device = model_device(model)
    obs_t = torch.as_tensor(obs).to(device)  # the tree lives in numpy; only the network calls run on `device`
    # a model may offer both calls of a step as one (a fused population's: one vmapped call each);
    # a plain model's are traced into flat graphs (the same ops without the modules' per-call cost)
    initial, recurrent = getattr(model, "initial_inference", None), getattr(model, "recurrent_inference", None)
    if initial is None and recurrent is None:
        calls = search_calls(model)
        if calls is not None:
            initial, recurrent = calls.initial_inference, calls.recurrent_inference
    if initial is not None:
        latent, policy_logits, value_logits = initial(obs_t)
    else:
        latent = model.represent(obs_t)
        policy_logits, value_logits = model.predict(latent)
    B, A = policy_logits.shape
    discounts = np.ascontiguousarray(discounts, dtype=np.float64)
    simulations = np.asarray(simulations, dtype=np.int64)
    sims = int(simulations.max()) if B else 0
    N = sims + 1
    vs, rs, step = int(model.value_support), int(model.reward_support), float(model.support_step)

    children = np.full((B, N, A), -1, dtype=np.int32)
    prior = np.zeros((B, N, A), dtype=np.float64)
    visits = np.zeros((B, N), dtype=np.int64)
    value_sum = np.zeros((B, N), dtype=np.float64)
    reward = np.zeros((B, N), dtype=np.float64)
    vprefix = np.zeros((B, N), dtype=np.float64)
    depth = np.zeros((B, N), dtype=np.int64)
    minmax = np.empty((B, 2), dtype=np.float64)
    minmax[:, 0], minmax[:, 1] = np.inf, -np.inf
    path = np.zeros((B, N + 1), dtype=np.int64)
    path_len = np.zeros(B, dtype=np.int64)
    out_parent = np.zeros(B, dtype=np.int64)
    out_action = np.zeros(B, dtype=np.int64)

    # root: priors (with noise when collecting) and one visit carrying its predicted value
    root_logits = policy_logits.double().cpu().numpy()
    root_prior = np.exp(root_logits - root_logits.max(1, keepdims=True))
    root_prior /= root_prior.sum(1, keepdims=True)
    gumbel_tree = np.zeros(B, dtype=np.bool_) if gumbel is None else np.asarray(gumbel, dtype=np.bool_)
    if noise is not None:
        fraction = np.where(gumbel_tree, 0.0, np.asarray(exploration_fractions, dtype=np.float64))[:, None]
        root_prior = (1 - fraction) * root_prior + fraction * noise(A)
    prior[:, 0] = root_prior
    root_logits = np.ascontiguousarray(root_logits - root_logits.max(1, keepdims=True))
    g = np.zeros((B, A)) if gumbel_noise is None or not gumbel_tree.any() else np.asarray(gumbel_noise(A), np.float64)
    considered = np.zeros((B, max(sims, 1)), dtype=np.int64)
    if gumbel_tree.any():
        m = np.full(B, 16) if max_considered_actions is None else np.asarray(max_considered_actions)
        for b in np.flatnonzero(gumbel_tree):
            seq = considered_visits(min(int(m[b]), A), int(simulations[b]))
            considered[b, :len(seq)] = seq
    raw_value = np.zeros((B, N), dtype=np.float64)
    value_np = value_logits.double().cpu().numpy()
    visits[:, 0] = 1
    for b in range(B):
        value_sum[b, 0] = raw_value[b, 0] = _support_scalar(value_np[b], vs, step)

    # node buffers, flat: entry n * B + b holds node n of tree b (index_select beats 2-D indexing)
    D = latent.shape[1:]
    h0, c0 = model.initial_hidden(B)
    lat_buf = latent.new_empty((N * B, *D))
    h_buf = h0.new_empty((N * B, *h0.shape[1:]))
    c_buf = c0.new_empty((N * B, *c0.shape[1:]))
    lat_buf[:B], h_buf[:B], c_buf[:B] = latent, h0, c0
    col = np.arange(B)
    horizon = int(lstm_horizon_len)

    for s in range(sims):
        leaf = s + 1
        live = simulations > s
        _select(children, prior, visits, value_sum, reward, minmax, discounts, value_min_max_delta,
                path, path_len, out_parent, out_action, live, gumbel_tree, g, root_logits, raw_value, considered, s)
        flat = torch.from_numpy(out_parent * B + col).to(device)
        args = (lat_buf.index_select(0, flat), torch.from_numpy(out_action).to(device),
                (h_buf.index_select(0, flat), c_buf.index_select(0, flat)))
        if recurrent is not None:
            lat, (h, c), vp_logits, p_logits, v_logits = recurrent(*args)
        else:
            lat, (h, c), vp_logits = model.dynamics(*args)
            p_logits, v_logits = model.predict(lat)
        rows = slice(leaf * B, (leaf + 1) * B)
        lat_buf[rows] = lat
        # LSTM reset every `horizon` steps of depth (depth of leaf = parent depth + 1)
        reset = (depth[col, out_parent] + 1) % horizon == 0
        if reset.any():
            keep = torch.from_numpy(~reset).to(h.device, h.dtype).unsqueeze(1)
            h, c = h * keep, c * keep
        h_buf[rows], c_buf[rows] = h, c
        outputs = torch.cat([p_logits, v_logits, vp_logits], dim=1).cpu().numpy()
        _expand_backup(leaf, out_parent, out_action, outputs, A, vs, rs, step, children, prior, visits, value_sum,
                       reward, vprefix, depth, minmax, discounts, horizon, path, path_len, live, raw_value)

    root_children = children[:, 0]
    counts = np.where(root_children >= 0, np.take_along_axis(visits, np.maximum(root_children, 0), 1), 0)
    root_values = value_sum[:, 0] / visits[:, 0]
    policy = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    action = None
    if gumbel_tree.any():
        action = np.full(B, -1, dtype=np.int64)
        _gumbel_outputs(gumbel_tree, children, prior, visits, value_sum, reward, raw_value, discounts,
                        value_min_max_delta, g, root_logits, policy, action)
    return SearchResult(counts, root_values, policy, root_prior, action)


@functools.lru_cache(maxsize=256)
def considered_visits(max_considered: int, num_simulations: int) -> tuple[int, ...]:
    """Sequential halving's schedule (mctx's `get_sequence_of_considered_visits`): entry s is the visit
    count a root child must have to be picked by simulation s. `max_considered` actions get equal
    visits per phase, then the better half goes on, for log2(max_considered) phases in all."""
    if max_considered <= 1:
        return tuple(range(num_simulations))
    log2max = math.ceil(math.log2(max_considered))
    sequence: list[int] = []
    visits = [0] * max_considered
    considered = max_considered
    while len(sequence) < num_simulations:
        extra = max(1, int(num_simulations / (log2max * considered)))
        for _ in range(extra):
            sequence.extend(visits[:considered])
            for i in range(considered):
                visits[i] += 1
        considered = max(2, considered // 2)
    return tuple(sequence[:num_simulations])


def select_actions(visit_counts: np.ndarray, temperature: float, rng: np.random.Generator | None) -> np.ndarray:
    """Actions from root visit counts: argmax (lowest index on ties) at temperature 0, else
    sampled from counts^(1/T)."""
    if temperature <= 0 or rng is None:
        return visit_counts.argmax(1)
    logits = np.log(np.maximum(visit_counts, 1e-12)) / temperature
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    u = rng.random(len(probs))[:, None]
    return np.minimum((probs.cumsum(1) < u).sum(1), probs.shape[1] - 1)
