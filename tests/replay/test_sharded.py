"""What a sharded store adds to the contract suite (tests/replay/test_contract.py runs that against
3 shards): routing stable across processes, the sampling distribution of one big store, per-shard
capacity and limiter, member views committed as into one store. (A killed shard actor brought back
from a snapshot the driver wrote: tests/replay/test_service.py, which has a Ray cluster up already.)"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from evo.replay import RateLimited, RateLimiter, ReplayError, ReplayStore
from evo.replay.sharded import ShardedReplay, route
from evo.replay.view import BLOCK_BATCHES, MemberView, commit_views
from tests.replay.helpers import SCHEMA, SEQ_SCHEMA, rows, trajectory

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def chi2_pvalue(stat: float, dof: int) -> float:
    """Upper tail of the chi-square distribution (Wilson-Hilferty; accurate to ~1e-3 for dof >= 30)."""
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def goodness_of_fit(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return chi2_pvalue(float(((counts - expected) ** 2 / expected).sum()), counts.size - 1)


# ---------------------------------------------------------------- routing
_ROUTE_SCRIPT = """
import json, sys
from evo.replay.sharded import route
from tests.replay.helpers import SCHEMA, rows
shard, keys = route(SCHEMA, rows(500, seed=3), 4)
print(json.dumps({"shard": shard.tolist(), "keys": [int(k) for k in keys]}))
"""


def test_routing_is_stable_across_processes_and_hash_seeds():
    shard, keys = route(SCHEMA, rows(500, seed=3), 4)
    assert np.bincount(shard, minlength=4).min() > 80  # all four shards get rows
    np.testing.assert_array_equal(shard, (keys % np.uint64(4)).astype(np.int64))
    for seed in ("4242",):  # another process, another hash seed
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": REPO}
        out = subprocess.run([sys.executable, "-c", _ROUTE_SCRIPT], env=env, capture_output=True, text=True,
                             check=True, timeout=120)
        got = json.loads(out.stdout)
        assert got["shard"] == shard.tolist()
        assert got["keys"] == [int(k) for k in keys]


def test_trajectories_route_whole_and_need_the_episode_as_key():
    shard, _ = route(SEQ_SCHEMA, trajectory(7, 0, 50), 4, episode_field="episode")
    assert (shard == shard[0]).all()
    keyed_by_obs = type(SEQ_SCHEMA)(SEQ_SCHEMA.fields, key_fields=("obs",))
    with pytest.raises(ReplayError, match="must then be one of the key fields"):
        ShardedReplay.in_process(keyed_by_obs, 2, capacity=100, episode_field="episode")
    with pytest.raises(ReplayError, match="shards must be an integer >= 1"):
        ShardedReplay.in_process(SCHEMA, 0, capacity=100)


# ---------------------------------------------------------------- sampling distribution
def _filled(store, n_rows: int = 120):
    keys = store.insert(rows(n_rows, seed=11))
    return keys


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_split_sampling_distribution_equals_one_store(sampler):
    """draw="split": counts over many batches fit each row's probability in one big store (chi-square,
    fixed seeds); the same test on a store sampled without regard to priority fails, so it can fail."""
    kw = {"capacity": 1000, "sampler": sampler, "alpha": 0.7, "beta": 0.5}
    one, sharded = ReplayStore(SCHEMA, seed=1, **kw), ShardedReplay.in_process(SCHEMA, 3, seed=2, draw="split", **kw)
    keys = _filled(one)
    np.testing.assert_array_equal(_filled(sharded), keys)
    prio = np.random.default_rng(5).gamma(0.6, 2.0, keys.size) + 0.01
    if sampler == "prioritized":
        one.update_priorities(keys, prio)
        sharded.update_priorities(keys, prio)
        probs = prio**0.7 / (prio**0.7).sum()
    else:
        probs = np.full(keys.size, 1 / keys.size)
    pos = {int(k): i for i, k in enumerate(keys)}
    counts = {}
    for name, store in (("one", one), ("sharded", sharded)):
        c = np.zeros(keys.size)
        for _ in range(120):
            batch = store.sample(256)
            np.add.at(c, [pos[int(k)] for k in batch.keys], 1)
            if sampler == "prioritized":  # importance weights against the global smallest priority
                p = prio[[pos[int(k)] for k in batch.keys]]
                np.testing.assert_allclose(batch.weights, (prio.min() / p) ** (0.7 * 0.5), rtol=1e-5)  # leaves are p**alpha
        counts[name] = c
        assert goodness_of_fit(c, probs) > 1e-3, name
    # the two stores agree with each other (homogeneity of the two count vectors)
    table = np.stack([counts["one"], counts["sharded"]])
    expected = table.sum(0, keepdims=True) * table.sum(1, keepdims=True) / table.sum()
    assert chi2_pvalue(float(((table - expected) ** 2 / expected).sum()), keys.size - 1) > 1e-3
    if sampler == "prioritized":  # power: these counts are far from what ignoring priorities would give
        assert goodness_of_fit(counts["sharded"], np.full(keys.size, 1 / keys.size)) < 1e-6


def _lopsided(n_per_shard=(80, 30, 10)) -> dict[str, np.ndarray]:
    """Rows that route 80 / 30 / 10 to 3 shards: unequal shard masses, so a shard chosen by anything
    but its mass gives rows visibly wrong probabilities."""
    pool = rows(2000, seed=21)
    shard, _ = route(SCHEMA, pool, 3)
    idx = np.concatenate([np.flatnonzero(shard == i)[:n] for i, n in enumerate(n_per_shard)])
    return {k: v[idx] for k, v in pool.items()}


def _one_shard_setup(sampler: str):
    kw = {"capacity": 1000, "sampler": sampler, "alpha": 0.7, "beta": 0.5}
    one, sharded = ReplayStore(SCHEMA, seed=1, **kw), ShardedReplay.in_process(SCHEMA, 3, seed=2, **kw)
    assert sharded.draw == "one"  # the default
    data = _lopsided()
    keys = one.insert(data)
    np.testing.assert_array_equal(sharded.insert(data), keys)
    if sampler == "prioritized":
        prio = np.random.default_rng(5).gamma(0.6, 2.0, keys.size) + 0.01
        one.update_priorities(keys, prio)
        sharded.update_priorities(keys, prio)
        probs = prio**0.7 / (prio**0.7).sum()
    else:
        prio, probs = None, np.full(keys.size, 1 / keys.size)
    return one, sharded, keys, prio, probs


def _counts(keys, drawn) -> np.ndarray:
    pos = {int(k): i for i, k in enumerate(keys)}
    c = np.zeros(keys.size)
    np.add.at(c, [pos[int(k)] for k in drawn], 1)
    return c


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_one_shard_draws_give_each_row_one_stores_probability(sampler):
    """draw="one" (the default): a batch comes whole from one shard chosen by its mass. Per-row
    frequencies of independent draws (batches of 1: each a fresh shard choice) fit one big store's
    probabilities and the one store's own counts (chi-square, fixed seeds); importance weights are
    one store's exactly. Choosing the shard uniformly instead (the same code, told equal masses)
    fails the same test, so it can fail. Shards hold 80 / 30 / 10 rows."""
    one, sharded, keys, prio, probs = _one_shard_setup(sampler)
    n = 12_000
    drawn = {"one": [], "sharded": []}
    pos = {int(k): i for i, k in enumerate(keys)}
    for name, store in (("one", one), ("sharded", sharded)):
        weights = []
        for _ in range(n):
            b = store.sample(1)
            drawn[name].append(int(b.keys[0]))
            weights.append(float(b.weights[0]))
        if prio is not None:  # importance weights against the global smallest priority, as one store
            p = prio[[pos[k] for k in drawn[name]]]
            np.testing.assert_allclose(weights, (prio.min() / p) ** (0.7 * 0.5), rtol=1e-5)
    counts = {name: _counts(keys, d) for name, d in drawn.items()}
    for name, c in counts.items():
        assert goodness_of_fit(c, probs) > 1e-3, name
    table = np.stack([counts["one"], counts["sharded"]])
    expected = table.sum(0, keepdims=True) * table.sum(1, keepdims=True) / table.sum()
    assert chi2_pvalue(float(((table - expected) ** 2 / expected).sum()), keys.size - 1) > 1e-3
    # a wrong draw: the shard chosen uniformly (a basis claiming equal masses), rows then by the shard
    basis = sharded.view_basis()
    wrong = sharded.bound_to(dataclasses.replace(basis, parts=tuple((r, 1.0, m) for r, _, m in basis.parts)))
    bad = _counts(keys, [int(wrong.sample(1, seed=s).keys[0]) for s in range(n)])
    assert goodness_of_fit(bad, probs) < 1e-6
    # and the right masses through the same seeded path pass
    right = sharded.bound_to(basis)
    assert goodness_of_fit(_counts(keys, [int(right.sample(1, seed=s).keys[0]) for s in range(n)]), probs) > 1e-3


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_one_shard_batches_choose_shards_by_mass_and_rows_within_them(sampler):
    """Batches of 256 from one shard each: rows of a batch are not independent draws (they share a
    shard), so the test is in two stages that multiply to one store's probability — the shard a batch
    came from, against mass_i / total over the batches, and the rows within each shard, against
    p_row / mass_i over that shard's draws."""
    _, sharded, keys, prio, probs = _one_shard_setup(sampler)
    shard_of = route(SCHEMA, sharded.get(keys), 3)[0]
    mass = np.array([probs[shard_of == i].sum() for i in range(3)])
    chosen, within = np.zeros(3), [np.zeros(keys.size) for _ in range(3)]
    for _ in range(600):
        b = sharded.sample(256)
        c = _counts(keys, b.keys)
        (i,) = np.unique(shard_of[c > 0])  # every row of the batch from one shard
        chosen[i] += 1
        within[i] += c
    assert goodness_of_fit(chosen, mass) > 1e-3
    for i in range(3):
        on = shard_of == i
        assert goodness_of_fit(within[i][on], probs[on] / probs[on].sum()) > 1e-3, i
    assert goodness_of_fit(chosen, np.full(3, 1 / 3)) < 1e-6  # power: the shards' masses are far apart


def test_a_bound_view_read_is_one_call():
    """A member view's seeded read of a sharded store: the basis carries every shard's mass, so a draw
    is one call to one shard (split draws without the basis: a round to ask the masses, then a call
    to every shard — 2N). The view draws in blocks of BLOCK_BATCHES such draws: 10 batches open two."""
    s = ShardedReplay.in_process(SCHEMA, 4, capacity=1000, seed=3)
    s.insert(rows(400))
    view = MemberView(s, s.view_basis(), seed=7)
    before = view.base.calls
    for _ in range(10):
        view.sample(32)
    assert view.base.calls - before == 2 * BLOCK_BATCHES
    split = ShardedReplay.in_process(SCHEMA, 4, capacity=1000, seed=3, draw="split")
    split.insert(rows(400))
    c0 = split.calls
    split.sample(32, seed=1)
    assert split.calls - c0 == 2 * 4
    unbound = ShardedReplay.in_process(SCHEMA, 4, capacity=1000, seed=3)
    unbound.insert(rows(400))
    c0 = unbound.calls
    unbound.sample(32, seed=1)
    assert unbound.calls - c0 == 4 + 1  # ask the masses, then one shard
    # bound and unbound seeded reads of the same store are the same draw
    np.testing.assert_array_equal(s.bound_to(s.view_basis()).sample(32, seed=1).keys, s.sample(32, seed=1).keys)


def test_seeded_reads_are_reproducible_and_shard_sizes_set_the_split():
    s = ShardedReplay.in_process(SCHEMA, 4, capacity=1000, seed=3)
    _filled(s, 400)
    a, b = s.sample(64, seed=99), s.sample(64, seed=99)
    np.testing.assert_array_equal(a.keys, b.keys)
    assert not np.array_equal(a.keys, s.sample(64, seed=100).keys)


# ---------------------------------------------------------------- per-shard capacity and limiter
def test_capacity_is_split_and_each_shard_evicts_its_oldest():
    s = ShardedReplay.in_process(SCHEMA, 3, capacity=30, seed=0)
    assert s.capacity == 30 and [i["capacity"] for i in s.info()] == [10, 10, 10]
    first = s.insert(rows(20, seed=1))
    for k in range(2, 8):
        s.insert(rows(10, seed=k))
    assert len(s) == 30 and s.stats()["evicted"] == 80 - 30
    assert not s.contains(first).any()  # every shard's oldest rows went first
    with pytest.raises(ReplayError, match="exceeds the store's capacity of 10 rows on that shard"):
        s.insert(rows(60, seed=9))
    assert s.stats()["rows_inserted"] == 80  # refused before anything was sent


def test_rate_limiter_minimum_is_on_the_total():
    s = ShardedReplay.in_process(SCHEMA, 3, capacity=100, rate_limiter=RateLimiter(min_size_to_sample=10))
    s.insert(rows(9))
    with pytest.raises(RateLimited, match="holds 9 rows, the rate limiter needs min_size_to_sample=10"):
        s.sample(4)
    s.insert(rows(1, seed=1))
    assert len(s.sample(4)) == 4


# ---------------------------------------------------------------- member views
def test_member_views_commit_as_into_one_store():
    kw = {"capacity": 600, "sampler": "prioritized", "episode_field": "episode"}
    one, sharded = ReplayStore(SEQ_SCHEMA, seed=0, **kw), ShardedReplay.in_process(SEQ_SCHEMA, 3, seed=0, **kw)
    for store in (one, sharded):
        store.insert(trajectory(0, 0, 30))
    staged = []
    for member in range(3):
        view = MemberView(sharded, sharded.view_basis(), seed=member)
        base = view.sample(16)
        view.update_priorities(base.keys, np.linspace(0.5, 3.0 + member, 16))
        view.insert(trajectory(member + 1, 0, 40))
        own = view.sample_sequences(8, 4)
        view.update_priorities(own.keys, np.full(8, 0.25))
        staged.append((member, view.staged()))
    basis = sharded.view_basis()
    assert basis.size == 30 and basis.mass == pytest.approx(30.0)
    commit_views(one, staged)
    commit_views(sharded, staged)
    st1, st2 = one.stats(), sharded.stats()
    same = [k for k in st1 if k != "samples"]  # the views read the sharded store, not `one`
    assert {k: st2[k] for k in same} == {k: st1[k] for k in same}  # 150 rows in 600 slots: nothing evicted
    keys = one.sample(500).keys
    assert sharded.contains(keys).all()
    np.testing.assert_array_equal(one.refcounts(keys), sharded.refcounts(keys))
    b1, b2 = one.view_basis(), sharded.view_basis()
    assert b2.mass == pytest.approx(b1.mass) and b2.min_leaf == pytest.approx(b1.min_leaf)
    assert b2.max_priority == b1.max_priority == 5.0
    seq = sharded.sample_sequences(32, 5)  # windows within a trajectory, as one store links them
    steps = seq.data["step"]
    assert ((np.diff(steps, axis=1) == 1) | ~seq.mask[:, 1:]).all()


# ---------------------------------------------------------------- a real run on Ray with [replay] shards = 2
@pytest.mark.slow
def test_efficientzero_run_on_ray_with_two_replay_shards(tmp_path):
    """`evo run` with `[replay] shards = 2`: members write through views into a 2-shard store, and the
    run store's per-generation snapshots (written in the driver's run directory) hold both shards,
    each with rows of both founders' episodes."""
    import tomli_w
    import tomllib

    from tests.conftest import run_evo
    from tests.test_agents_e2e import SEED, tiny_experiment

    name = "cartpole_efficientzero"
    path = tiny_experiment(name, tmp_path, "ray")
    data = tomllib.loads(path.read_text())
    data["population"]["steps_per_generation"] = 160
    data["replay"] = {"shards": 2}
    path.write_text(tomli_w.dumps(data))
    proc = run_evo(["run", f"{name}.toml", "--seed", str(SEED)], tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    from evo.replay.snapshot import read_snapshot

    _, meta, arrays = read_snapshot(tmp_path / "runs" / name / "replay" / "g0001")
    assert len(meta["shards"]) == 2
    episodes = [set(arrays[f"shard{i:03d}.col.episode"][arrays[f"shard{i:03d}.live"]].tolist()) for i in range(2)]
    assert all(episodes) and not episodes[0] & episodes[1]  # trajectories whole on one shard each
    assert {e >> 40 for e in episodes[0] | episodes[1]} >= {0, 1}  # both founders wrote


def test_the_replay_table_reaches_the_spec_and_inline_keeps_one_store():
    import dataclasses

    import tomllib

    from evo.replay import ReplaySpec, build_replay
    from evo.spec import parse_experiment

    data = tomllib.loads(open(os.path.join(REPO, "experiments", "cartpole_efficientzero.toml")).read())
    assert parse_experiment(data).replay.shards == 1  # the default: one replay actor
    data["replay"] = {"shards": 3, "spread": True}
    exp = parse_experiment(data)
    assert (exp.replay.shards, exp.replay.spread) == (3, True)
    spec = dataclasses.replace(ReplaySpec(SCHEMA, capacity=64), shards=exp.replay.shards)
    with pytest.warns(UserWarning, match="inline backend keeps one in-process store"):
        store = build_replay(spec, seed=0, distributed=False)
    assert isinstance(store, ReplayStore)
