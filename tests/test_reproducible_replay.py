"""Member views of the shared replay store (evo.replay.view, docs/replay.md "Member views"): what a
member reads does not depend on which other members ran before or beside it, writes reach the
shared store at the generation's end in member order, and a failed attempt's writes never do.

The fast tests use real in-process stores; the leaderboard equality of EfficientZero inline, on
Ray with 1 and with 2 workers is in tests/test_faults_ray.py (real Ray, real processes).
"""

from __future__ import annotations

import numpy as np
import pytest

from evo.agent import AgentContext, Evaluation
from evo.replay import Field, ReplayError, ReplayStore, Schema
from evo.replay.view import BLOCK_BATCHES, MemberView, commit_views, view_seed
from evo.scheduler.inline import InlineScheduler

SCHEMA = Schema({"obs": Field("float32", (3,)), "episode": Field("int64"), "step": Field("int64")})


def rows(episode: int, n: int) -> dict[str, np.ndarray]:
    g = np.random.default_rng(episode)
    return {"obs": g.random((n, 3), dtype=np.float32), "episode": np.full(n, episode, dtype=np.int64),
            "step": np.arange(n, dtype=np.int64)}


def shared(sampler: str = "prioritized", capacity: int = 10_000) -> ReplayStore:
    store = ReplayStore(SCHEMA, capacity=capacity, sampler=sampler, episode_field="episode", seed=1)
    for ep in range(10):
        store.insert(rows(ep, 20))
    return store


def member_session(view: MemberView, episode: int) -> list[np.ndarray]:
    """What a member does in a generation: insert, sample, update priorities; returns what it drew."""
    drawn = []
    for i in range(3):
        view.insert(rows(episode * 100 + i, 15))
        seq = view.sample_sequences(16, 4)
        drawn.append(np.asarray(seq.keys).copy())
        drawn.append(np.asarray(seq.data["obs"]).copy())
        drawn.append(np.asarray(seq.weights).copy())
        view.update_priorities(seq.keys, np.linspace(0.1, 2.0, 16) * (i + 1))
    return drawn


def test_a_members_draws_do_not_depend_on_other_members() -> None:
    """Member 1 alone, after member 0, or interleaved call by call with member 0: the same batches."""
    alone = member_session(MemberView(s := shared(), s.view_basis(), view_seed(0, 1, 0)), 1)
    base = shared()
    basis = base.view_basis()
    v0, v1 = MemberView(base, basis, view_seed(0, 0, 0)), MemberView(base, basis, view_seed(0, 1, 0))
    member_session(v0, 0)
    after = member_session(v1, 1)
    assert all(np.array_equal(a, b) for a, b in zip(alone, after))
    # the shared store itself did not change while members ran
    assert len(base) == 200 and base.stats()["rows_inserted"] == 200


def test_reads_see_the_generation_start_plus_own_inserts_only() -> None:
    base = shared("uniform")
    basis = base.view_basis()
    mine, other = MemberView(base, basis, 1), MemberView(base, basis, 2)
    own_keys = mine.insert(rows(500, 40))
    other_keys = other.insert(rows(600, 40))
    assert len(mine) == 240 and len(other) == 240
    assert mine.contains(own_keys).all() and not mine.contains(other_keys).any()
    assert np.array_equal(mine.get(own_keys)["episode"], np.full(40, 500))
    # uniform draws pick the own shard in proportion to its rows: 40 of 240
    picked = np.concatenate([np.asarray(mine.sample(256).data["episode"]) for _ in range(40)])
    share = float(np.mean(picked == 500))
    assert abs(share - 40 / 240) < 0.02 and not np.any(picked == 600)
    with pytest.raises(ReplayError, match="cannot be snapshotted"):
        mine.snapshot("/tmp/nowhere")


def test_prioritised_weights_are_normalised_over_both_shards() -> None:
    base = shared()
    keys = base.sample(200).keys
    base.update_priorities(keys, np.full(len(keys), 4.0))  # the shared store's rows now outweigh new ones
    basis = base.view_basis()
    view = MemberView(base, basis, 3)
    own = view.insert(rows(700, 50))
    view.update_priorities(own, np.full(50, 0.01))  # own rows: tiny priority, the smallest of both shards
    batch = view.sample(4096)
    w, k = np.asarray(batch.weights), np.asarray(batch.keys)
    is_own = np.isin(k, own)
    assert is_own.any() and (~is_own).any()
    # the smallest priority (an own row) has weight 1; a shared row of priority p has (0.01 / p)^(alpha*beta)
    alpha, beta = basis.alpha, basis.beta
    assert np.allclose(w[is_own], 1.0)
    stored = base.get(k[~is_own])  # priorities of shared rows are 4.0 or the max seen (4.0) -> same weight
    assert stored["obs"].shape[0] == int((~is_own).sum())
    assert np.allclose(w[~is_own], (0.01 / 4.0) ** (alpha * beta), rtol=1e-5)


class Counted:
    """A shared store whose seeded reads are counted; `remote` makes the view fetch ahead in a thread."""

    def __init__(self, store: ReplayStore, remote: bool) -> None:
        self.store, self.remote, self.reads = store, remote, 0
        self.schema = store.schema

    def sample(self, n: int, seed: int | None = None):
        self.reads += 1
        return self.store.sample(n, seed=seed)

    def sample_sequences(self, n: int, length: int, seed: int | None = None):
        self.reads += 1
        return self.store.sample_sequences(n, length, seed=seed)


def wait_for_reads(store: Counted, n: int, timeout: float = 10.0) -> bool:
    """Whether `store` has seen `n` reads (the last one, fetched ahead, runs in the reader thread)."""
    import time

    deadline = time.monotonic() + timeout
    while store.reads < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return store.reads == n


def test_shared_reads_come_in_blocks_fetched_ahead_with_the_same_rows() -> None:
    """One read of the shared store per BLOCK_BATCHES batches; a remote store's next block is fetched
    ahead in a thread, and the member sees exactly the rows the in-process order gives."""
    store = shared()
    basis = store.view_basis()
    lazy, ahead = Counted(store, remote=False), Counted(store, remote=True)
    views = [MemberView(b, basis, view_seed(0, 1, 2)) for b in (lazy, ahead)]
    drawn = [member_session(v, 3) + [np.asarray(v.sample_sequences(16, 4).keys) for _ in range(2 * BLOCK_BATCHES)]
             for v in views]
    assert all(np.array_equal(a, b) for a, b in zip(*drawn))
    assert lazy.reads >= 2 and wait_for_reads(ahead, lazy.reads + 1)  # the next block is always already requested
    lazy, ahead = Counted(store, remote=False), Counted(store, remote=True)
    for view in (MemberView(lazy, basis, 4), MemberView(ahead, basis, 4)):  # no own rows: every draw is shared
        for _ in range(2 * BLOCK_BATCHES + 1):
            view.sample_sequences(16, 4)
    assert lazy.reads == 3 and wait_for_reads(ahead, 4)
    rows_batches = [MemberView(b, basis, 5) for b in (Counted(store, False), Counted(store, True))]
    got = [[np.asarray(v.sample(64).keys) for _ in range(10)] for v in rows_batches]
    assert all(np.array_equal(a, b) for a, b in zip(*got))


def test_shared_reads_draw_each_row_in_proportion_to_its_priority() -> None:
    """The blocks are shuffled stratified draws: over many batches a row's share is its priority's
    (chi-square against p**alpha; the same counts are far from uniform, so the test has power)."""
    from tests.replay.test_sharded import goodness_of_fit

    store = shared()  # 200 rows
    keys = store.sample(200, seed=0).keys
    all_keys = np.unique(np.asarray(keys))
    store.update_priorities(all_keys, np.linspace(0.1, 3.0, all_keys.size))
    basis = store.view_basis()
    view = MemberView(store, basis, 11)
    counts = np.zeros(all_keys.size)
    drawn = np.concatenate([np.asarray(view.sample(48).keys) for _ in range(600)])
    found = np.searchsorted(all_keys, drawn)
    assert np.array_equal(all_keys[found], drawn)  # only rows whose priority was set are drawn...
    np.add.at(counts, found, 1)
    p = np.linspace(0.1, 3.0, all_keys.size) ** basis.alpha
    assert goodness_of_fit(counts, p / p.sum()) > 1e-3
    assert goodness_of_fit(counts, np.full(all_keys.size, 1 / all_keys.size)) < 1e-6
    # a block is shuffled: unshuffled, a stratified block's first batch would hold only the rows at the
    # start of the priority mass (here the first two of ten episodes)
    first = MemberView(fresh := shared(), fresh.view_basis(), 12).sample(16)
    assert np.unique(np.asarray(first.data["episode"])).size >= 4


def test_staged_writes_reach_the_store_in_member_order() -> None:
    """Committing views equals making each member's calls on the shared store, member 0 first."""
    direct, staged_base = shared(), shared()
    basis = staged_base.view_basis()
    views = {i: MemberView(staged_base, basis, view_seed(7, i, 3)) for i in (2, 0, 1)}
    plans = {i: [rows(1000 * (i + 1) + j, 12) for j in range(3)] for i in views}
    for i, view in views.items():  # any order of running
        for batch in plans[i]:
            keys = view.insert(batch)
            view.update_priorities(keys, np.arange(1, 13) * (i + 1.0))
    for i in sorted(views):  # what member order means
        for batch in plans[i]:
            keys = direct.insert(batch)
            direct.update_priorities(keys, np.arange(1, 13) * (i + 1.0))
    commit_views(staged_base, [(i, v.staged()) for i, v in views.items()])
    assert len(staged_base) == len(direct) == 200 + 9 * 12
    for seed in range(3):
        a, b = staged_base.sample_sequences(64, 5, seed=seed), direct.sample_sequences(64, 5, seed=seed)
        assert np.array_equal(a.keys, b.keys) and np.array_equal(a.weights, b.weights)
        assert np.array_equal(a.data["obs"], b.data["obs"]) and np.array_equal(a.mask, b.mask)


def test_the_overlay_grows_by_replaying_its_own_log() -> None:
    base = shared(capacity=50_000)
    view = MemberView(base, base.view_basis(), 9)
    keys = [view.insert(rows(2000 + j, 1000)) for j in range(6)]  # 6000 rows: past the first 4096-row overlay
    assert len(view) == 6200 and view._overlay.capacity >= 6000
    assert np.array_equal(view.get(keys[0])["episode"], np.full(1000, 2000))


class _Writer:
    """A minimal real agent that writes the shared store and can be told to raise after writing."""

    kind = "tests.test_reproducible_replay:_Writer"

    def __init__(self, index: int, context: AgentContext, raise_after_insert: bool = False) -> None:
        self.index, self.context, self.raise_after_insert = index, context, raise_after_insert
        self.arch, self.hparams = {}, {}

    def train(self, steps: int) -> dict[str, float]:
        self.context.replay.insert(rows(10_000 + self.index, steps))
        if self.raise_after_insert:
            raise RuntimeError("died after inserting")
        drawn = np.asarray(self.context.replay.sample(16).data["episode"])
        return {"rows_seen": float(len(self.context.replay)), "own_drawn": float(np.mean(drawn == 10_000 + self.index))}

    def evaluate(self) -> Evaluation:
        return Evaluation(float(self.index))

    def get_state(self) -> dict:
        return {"index": self.index, "raise": self.raise_after_insert}

    @classmethod
    def from_state(cls, state: dict, context: AgentContext) -> _Writer:
        return cls(int(state["index"]), context, bool(state["raise"]))


def test_a_failed_members_inserts_never_reach_the_shared_store() -> None:
    base = shared("uniform")
    context = AgentContext(replay=base, seed=0)
    agents = [_Writer(0, context), _Writer(1, context, raise_after_insert=True), _Writer(2, context)]
    results = InlineScheduler(threads=None, context=context).run_generation(agents, 30, generation=0)
    assert [r.failed for r in results] == [False, True, False]
    assert "died after inserting" in results[1].failure.message
    # each member saw the store as of the start plus its own 30 rows, never another member's
    assert results[0].train_metrics["rows_seen"] == results[2].train_metrics["rows_seen"] == 230
    eps = set(np.asarray(base.get(base.sample(4096, seed=0).keys)["episode"]).tolist())
    assert {10_000, 10_002} <= eps and 10_001 not in eps
    assert len(base) == 260 and base.stats()["rows_inserted"] == 260


def test_own_share_raises_the_share_of_own_rows_once_they_fill_a_batch() -> None:
    base = shared("uniform")
    basis = base.view_basis()
    plain, default = MemberView(base, basis, 7, own_share=0.0), MemberView(base, basis, 7)
    biased = MemberView(base, basis, 7, own_share=0.5)
    for view in (plain, default, biased):
        view.insert(rows(800, 20))

    def own_drawn(view: MemberView) -> float:
        picked = np.concatenate([np.asarray(view.sample(64).data["episode"]) for _ in range(200)])
        return float(np.mean(np.isin(picked, (800, 801))))

    # 20 own rows, fewer than a batch of 64: still drawn in proportion to their rows (20 of 220)
    assert abs(own_drawn(biased) - 20 / 220) < 0.02
    for view in (plain, default, biased):
        view.insert(rows(801, 100))
    # 0 is the default, which draws exactly as before
    a, b = plain.sample(256), default.sample(256)
    assert np.array_equal(np.asarray(a.keys), np.asarray(b.keys))
    # 120 own rows: at least half of every draw; their mass alone gives 120 / 320
    assert abs(own_drawn(biased) - 0.5) < 0.03
    assert abs(own_drawn(plain) - 120 / 320) < 0.03
    with pytest.raises(ReplayError, match="own_share"):
        MemberView(base, basis, 7, own_share=1.5)


def test_the_experiments_own_share_reaches_every_members_view() -> None:
    """replay.own_share = 1: once a member holds a batch's worth of its own rows, it draws nothing else."""
    base = shared("uniform")
    for share, expected in ((1.0, lambda m: m == 1.0), (0.0, lambda m: m < 0.6)):
        context = AgentContext(replay=base, seed=0, own_share=share)
        agents = [_Writer(0, context), _Writer(1, context)]
        results = InlineScheduler(threads=None, context=context).run_generation(agents, 30, generation=0)
        assert all(expected(r.train_metrics["own_drawn"]) for r in results), share


def _tree_state(store: ReplayStore) -> tuple:
    sampler = store._sampler
    tree = sampler.tree
    return (sampler.max_priority, tree.total, tree.min, tree.leaves.copy(), tree._pref.copy(), tree._bcum.copy())


def test_a_views_priority_updates_are_joined_and_leave_the_store_as_each_one_would() -> None:
    """A learner stages one priority update per gradient step; the view hands them back joined between
    inserts (`StagedWrites.coalesced`). Applied, they leave the shared store exactly as the updates one
    by one do: rows repeated within and across updates keep their last priority, the top priority counts
    an overwritten value, rows not stored are skipped, inserts stay between the runs they split."""
    base = shared()
    stored = base.sample(64, seed=0).keys
    view = MemberView(base, base.view_basis(), view_seed(3, 0, 0))
    g = np.random.default_rng(5)
    for step in range(12):
        if step in (4, 9):
            view.insert(rows(500 + step, 10))
        keys = np.concatenate([g.choice(stored, 6), g.choice(stored, 2), np.array([12345], dtype=np.uint64)])
        p = g.random(keys.size) + 0.05
        p[0] = 50.0 if step == 2 else p[0]  # overwritten later or not, it raises the top priority
        view.update_priorities(keys, p)
    one_by_one, joined = shared(), shared()
    for op in view._staged.ops:
        if op[0] == "insert":
            one_by_one.insert(op[1])
        else:
            one_by_one.update_priorities(op[1], op[2])
    staged = view.staged()
    assert [op[0] for op in staged.ops] == ["priorities", "insert", "priorities", "insert", "priorities"]
    assert staged.rows == view._staged.rows == 20 and staged.priority_updates == view._staged.priority_updates
    commit_views(joined, [(0, staged)])
    for a, b in zip(_tree_state(joined), _tree_state(one_by_one)):
        assert np.array_equal(a, b)
    assert joined._sampler.max_priority == 50.0
    for seed in range(3):
        x, y = joined.sample_sequences(32, 4, seed=seed), one_by_one.sample_sequences(32, 4, seed=seed)
        assert np.array_equal(x.keys, y.keys) and np.array_equal(x.weights, y.weights)


def test_a_row_set_twice_in_one_priority_update_keeps_the_last_value() -> None:
    store = shared()
    key = store.sample(1, seed=0).keys[:1]
    store.update_priorities(np.repeat(key, 5), np.array([9.0, 1.0, 7.0, 3.0, 2.0]))
    slot = store._index.lookup(key)[0]
    assert store._sampler.tree.leaves[slot] == 2.0 ** store._sampler.alpha
    assert store._sampler.max_priority >= 9.0
