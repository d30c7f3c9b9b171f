"""Line stores (`replay.own_rows = "line"`, docs/replay.md "Member views"): a member's own rows are
every row its line inserted, kept from generation to generation with their priorities and copied to a
clone, as a PBT trial keeps a store of its own and copies its parent's on exploit. The rows still
reach the shared store through the generation's staged writes, and only once.

View-level tests use real in-process stores; the engine test runs the real `evo` command with the
shipped CartPole EfficientZero file, inline, and resumes it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tomllib

from evo.agent import AgentContext, Evaluation
from evo.replay import ReplayError, ReplayStore
from evo.replay.view import MemberView, commit_views
from evo.runstore import RunStore
from evo.scheduler.inline import InlineScheduler
from evo.spec import ExperimentSpec
from tests.conftest import REPO, small_cartpole_truncation_run
from tests.test_reproducible_replay import SCHEMA, rows, shared


def _line_view(base: ReplayStore, seed: int, line=None, own_share: float = 1.0) -> MemberView:
    return MemberView(base, base.view_basis(), seed, own_share=own_share, own_rows="line", line=line)


def test_a_line_store_carries_a_members_rows_into_its_next_generation() -> None:
    base = shared()
    first = _line_view(base, 1)
    assert first.line_state() is None  # nothing inserted: no line yet
    old = first.insert(rows(500, 40))
    first.update_priorities(old[:10], np.full(10, 7.0))
    commit_views(base, [(0, first.staged())])
    line = first.line_state()

    second = _line_view(base, 2, line)
    assert second.contains(old).all() and len(second) == len(base) + 40
    new = second.insert(rows(501, 30))
    # the staged log holds this generation's writes only: the line's rows reached the shared store already
    assert second.staged().rows == 30 and len(second.staged().ops) == 1
    # own_share 1 and 70 own rows: every draw comes from the line, old rows and new
    drawn = np.concatenate([np.asarray(second.sample(64).data["episode"]) for _ in range(50)])
    assert set(np.unique(drawn)) == {500, 501}
    # the priorities the line gave its rows came along: ten rows at 7, thirty at the first view's 1, and
    # the new thirty at the line's top priority, 7 (alpha 0.6); equal priorities would give 10 / 70
    keys = np.concatenate([np.asarray(second.sample(64).keys) for _ in range(100)])
    high = 7.0 ** base.view_basis().alpha
    assert abs(np.isin(keys, old[:10]).mean() - 10 * high / (40 * high + 30)) < 0.02
    after = second.line_state()
    assert ReplayStore.from_state(*after, "memory").contains(np.concatenate([old, new])).all()
    # the state handed back is detached: later writes to the view do not change it
    second.insert(rows(502, 5))
    assert len(ReplayStore.from_state(*after, "memory")) == 70


def test_a_line_store_keeps_the_newest_rows_at_the_shared_stores_capacity() -> None:
    base = shared("uniform", capacity=300)
    view = _line_view(base, 3)
    for ep in range(5):
        view.insert(rows(700 + ep, 100))
    state = view.line_state()
    restored = ReplayStore.from_state(*state, "memory")
    assert restored.capacity == 300 and len(restored) == 300
    kept = set(np.unique(restored.get(restored.sample(300, seed=0).keys)["episode"]).tolist())
    assert kept <= {702, 703, 704}
    # a view on another run's store (another capacity) refuses it
    with pytest.raises(ReplayError, match="another run"):
        _line_view(shared("uniform", capacity=500), 4, state)


def test_a_line_is_only_taken_with_own_rows_line() -> None:
    base = shared()
    view = _line_view(base, 1)
    view.insert(rows(500, 20))
    with pytest.raises(ReplayError, match="own_rows is not 'line'"):
        MemberView(base, base.view_basis(), 2, line=view.line_state())
    with pytest.raises(ReplayError, match="own_rows must be one of"):
        MemberView(base, base.view_basis(), 2, own_rows="lineage")
    plain = MemberView(base, base.view_basis(), 2)
    plain.insert(rows(501, 20))
    assert plain.line_state() is None  # a view that keeps no line hands none back


class _Counter:
    """A minimal real agent: each train() inserts a new episode (its index and round in the id) and
    reports which episodes its draws came from."""

    kind = "tests.test_line_stores:_Counter"

    def __init__(self, index: int, context: AgentContext, round_: int = 0) -> None:
        self.index, self.context, self.round = index, context, round_
        self.arch, self.hparams = {}, {}

    def train(self, steps: int) -> dict[str, float]:
        self.context.replay.insert(rows(10_000 * (self.index + 1) + self.round, steps))
        self.round += 1
        drawn = np.concatenate([np.asarray(self.context.replay.sample(32).data["episode"]) for _ in range(20)])
        return {"rounds_drawn": float(len(np.unique(drawn)))}

    def evaluate(self) -> Evaluation:
        return Evaluation(float(self.index))

    def get_state(self) -> dict:
        return {"index": self.index, "round": self.round}

    @classmethod
    def from_state(cls, state: dict, context: AgentContext) -> _Counter:
        return cls(int(state["index"]), context, int(state["round"]))


def test_the_inline_scheduler_passes_each_members_line_from_generation_to_generation() -> None:
    base = shared("uniform")
    context = AgentContext(replay=base, seed=0, own_share=1.0, own_rows="line")
    scheduler = InlineScheduler(threads=None, context=context)
    agents = [_Counter(0, context), _Counter(1, context)]
    lines: dict = {}
    for generation in range(3):
        results = scheduler.run_generation(agents, 40, generation=generation, lines=lines)
        lines = {r.agent.index: r.line for r in results}
        agents = [r.agent for r in results]
    # own_share 1: a member draws from its own line only, which now holds its three rounds' episodes
    assert [r.train_metrics["rounds_drawn"] for r in results] == [3.0, 3.0]
    for index, (_meta, arrays) in lines.items():
        episodes = set(np.unique(arrays["col.episode"][arrays["live"]]).tolist())
        assert episodes == {10_000 * (index + 1) + r for r in range(3)}
    # and each row reached the shared store once
    assert len(base) == 200 + 2 * 3 * 40


def _counter_generations(scheduler, context: AgentContext, generations: int) -> tuple[list, dict]:
    agents, lines = [_Counter(0, context), _Counter(1, context)], {}
    for generation in range(generations):
        results = scheduler.run_generation(agents, 40, generation=generation, lines=lines)
        lines = {r.agent.index: r.line for r in results}
        agents = [r.agent for r in results]
    return results, lines


def test_ray_members_carry_their_lines_as_inline_ones_do(ray_cluster) -> None:
    """Line stores travel to Ray actors with the member and back with its result: the same lines and
    the same draws as inline, from a Ray replay service."""
    from evo.replay.protocol import ReplaySpec
    from evo.scheduler.ray import RayScheduler

    spec = ReplaySpec(SCHEMA, capacity=10_000, sampler="uniform", episode_field="episode")
    inline_context = AgentContext(replay=shared("uniform"), seed=0, own_share=1.0, own_rows="line")
    service = RayScheduler.build_replay(spec, 1)
    try:
        for ep in range(10):
            service.insert(rows(ep, 20))
        context = AgentContext(replay=service, seed=0, own_share=1.0, own_rows="line")
        scheduler = RayScheduler(_Counter, context, num_workers=2, cpus_per_member=1, timeout_s=600)
        try:
            on_ray, ray_lines = _counter_generations(scheduler, context, 3)
            assert len(service) == 200 + 2 * 3 * 40
        finally:
            scheduler.close()  # stops the service too
    finally:
        service.stop()
    inline, inline_lines = _counter_generations(InlineScheduler(threads=None, context=inline_context), inline_context, 3)
    assert [r.train_metrics for r in on_ray] == [r.train_metrics for r in inline]
    for index in (0, 1):
        assert np.array_equal(ray_lines[index][1]["slot_key"], inline_lines[index][1]["slot_key"])


def test_own_rows_line_needs_synchronous_generations() -> None:
    data = tomllib.loads((REPO / "experiments" / "cartpole_efficientzero.toml").read_text())
    data["replay"] = {"own_rows": "line"}
    ExperimentSpec.model_validate(data)
    data["population"]["mode"] = "async"
    with pytest.raises(ValueError, match="own_rows = 'line'"):
        ExperimentSpec.model_validate(data)


def _line_episodes(run_dir: Path, generation: int) -> dict[int, set[int]]:
    store = RunStore.open("cartpole_efficientzero", run_dir.parent)
    try:
        lines = store.load_lines(generation)
    finally:
        store.close()
    return {i: {int(e) for e in arrays["col.episode"][arrays["live"]]} for i, (_, arrays) in lines.items()}


def test_a_run_keeps_lines_copies_them_to_clones_and_resumes_with_them(tmp_path: Path) -> None:
    """The real `evo` command, CartPole EfficientZero inline, truncation selection (the worst member's
    slot takes a clone of the best every generation): each line store holds the episodes of its own
    ancestors only (episode id = writer index << 40 | counter), a clone's starts as its parent's, and
    a resumed run continues from the saved lines."""
    small_cartpole_truncation_run(tmp_path, 3, replay={"own_share": 1.0, "own_rows": "line"})

    run_dir = tmp_path / "runs" / "cartpole_efficientzero"
    store = RunStore.open("cartpole_efficientzero", tmp_path / "runs")
    try:
        parents = {rec.index: rec.parent for g in range(4) for rec, _, _ in store.population(g)}
    finally:
        store.close()

    def ancestors(index: int) -> set[int]:
        out = {index}
        while parents.get(index) is not None:
            index = parents[index]
            out.add(index)
        return out

    before, after = _line_episodes(run_dir, 1), _line_episodes(run_dir, 2)
    assert len(before) == 3 and len(after) == 3
    for lines in (before, after):
        for index, episodes in lines.items():
            writers = {e >> 40 for e in episodes}
            assert writers and writers <= ancestors(index), (index, writers, ancestors(index))
    # a member of generation 2 started from the line saved before the resume and added to it
    for index in before.keys() & after.keys():
        assert before[index] < after[index]
    # the clone born at the end of generation 2 starts from its parent's line (the best member, which trains on)
    born = [i for i in after if i not in before]
    assert len(born) == 1, "truncation selection replaces one member of three every generation"
    assert after[born[0]] == after[parents[born[0]]]
