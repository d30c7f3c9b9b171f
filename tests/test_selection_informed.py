"""Selection that is not blind (evo/selection.py, evo/compute.py): equal-compute judging, ties
broken by a secondary signal that is recorded, founders' lines kept alive."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evo.compute import Compute, LinePoint, round_compute, scores_at_equal_compute
from evo.population import lines_surviving_unbeaten, release_worst, unbeaten_slots
from evo.selection import judged_tournament_select, keep_founder_lines, pick_best, truncation_select
from evo.spec import SpecError, load_experiment
from tests.conftest import TOY_EXPERIMENT, evolve_toy


def _line(*points: tuple[float, float]) -> list[LinePoint]:
    return [LinePoint(Compute(0, u, 0), s) for u, s in points]


def test_a_member_that_doubles_its_updates_is_judged_at_the_others_updates() -> None:
    slow = _line((100, 1.0), (200, 2.0), (300, 3.0))            # 100 updates a round
    fast = _line((200, 1.5), (400, 2.5), (600, 3.5))            # 200 a round: its latest score looks best
    points, level = scores_at_equal_compute([slow, fast], "updates")
    assert level == 300 and [p.score for p in points] == [3.0, 1.5]  # at 300 updates the slow line is ahead
    # early on no line has a point at the other's level: the level rises to the largest first point
    points, level = scores_at_equal_compute([slow[:1], fast[:1]], "updates")
    assert level == 200 and [p.score for p in points] == [1.0, 1.5]


def test_round_compute_prefers_the_agents_counters_and_falls_back_to_steps() -> None:
    before = Compute(100, 50, 2.0)
    assert round_compute(before, 30, {"env_steps": 160.0, "updates": 90.0}, 1.5) == Compute(160, 90, 3.5)
    assert round_compute(before, 30, {"loss": 1.0}, 0.5) == Compute(130, 80, 2.5)


def test_ties_go_to_the_secondary_signal_and_say_so() -> None:
    rng = np.random.default_rng(0)
    assert pick_best([9.0, 9.0, 9.0], rng, [1.0, 5.0, math.nan], secondary_name="ret") == (1, "secondary:ret")
    assert pick_best([9.0, 9.5, 9.0], rng, [1.0, 0.0, 7.0]) == (1, "score")
    assert pick_best([9.0, 9.05], rng, [3.0, 1.0], tolerance=0.1, secondary_name="ret") == (0, "secondary:ret")
    pos, why = pick_best([9.0, 9.0], rng, [math.nan, math.nan])
    assert why == "random tie" and pos in (0, 1)


def test_judged_tournaments_use_the_judge_and_skip_failed_members() -> None:
    rng = np.random.default_rng(1)
    scores = [1.0, 1.0, 1.0, 1.0]
    secondary = [0.0, 0.0, 9.0, 0.0]

    def judge(pos):
        return [scores[p] for p in pos], [secondary[p] for p in pos]

    elite, parents, decided = judged_tournament_select(4, 4, 4, True, rng, judge)
    assert elite == 2 and parents == [2, 2, 2] and decided == ["secondary:secondary"] * 3
    elite, parents, _ = judged_tournament_select(4, 4, 2, True, rng, judge, eligible=[True, True, False, True])
    assert elite != 2 and 2 not in parents


def test_founder_lines_survive_a_takeover() -> None:
    founders = [0, 0, 1, 2]            # positions 0 and 1 descend from founder 0, 2 from 1, 3 from 2
    values = [5.0, 4.0, 3.0, 1.0]
    takeover = [0, 0, 1]               # the elite (position 0) and every parent of line 0
    parents, changed = keep_founder_lines(takeover, founders, values, lines=2, elite=0)
    assert parents == [0, 0, 2] and changed == [2]  # the best missing line takes the last crowded slot
    parents, changed = keep_founder_lines(takeover, founders, values, lines=3, elite=0)
    assert parents == [0, 3, 2] and changed == [2, 1]
    assert keep_founder_lines(takeover, founders, values, lines=1, elite=0) == (takeover, [])
    # a failed member's line is not brought back
    assert keep_founder_lines(takeover, founders, values, lines=3, eligible=[True, True, True, False], elite=0)[0] == [0, 0, 2]


def test_informed_selection_in_a_sync_run_records_what_decided(tmp_path) -> None:
    store = evolve_toy(tmp_path, {"selection.equal_compute": "updates", "selection.secondary": "val_mse",
                                  "selection.founder_lines": 2, "population.initial": "sample"})
    children = [m for m in store.all_members() if m["parent"] is not None]
    assert children and all(m["mutation"]["details"]["selected_by"] in
                            ("score", "secondary:val_mse", "random tie", "founder line kept") for m in children)
    founders = {}
    for m in store.all_members():
        founders[m["index"]] = m["index"] if m["parent"] is None else founders[m["parent"]]
    for g in range(store.last_completed_generation() + 1):
        alive = {founders[e["index"]] for e in store.evaluations(g)}
        assert len(alive) >= 2, f"generation {g}: one founder took all"


def test_a_member_is_replaced_only_by_a_winner_that_beats_it() -> None:
    # 4 members, the elite at position 1: parent slots 0, 1, 2 belong to positions 0, 2, 3
    floor = [-200.0, -200.0, -200.0, -200.0]
    assert unbeaten_slots(4, floor, 1, [3, 0, 2], 0.0) == {0: 0, 1: 2, 2: 3}  # all tie: nobody is overwritten
    scores = [-200.0, -150.0, -200.0, -190.0]
    assert unbeaten_slots(4, scores, 1, [1, 0, 1], 0.0) == {1: 2}  # slots 0 and 2 lose to the elite; 1 ties
    assert unbeaten_slots(4, scores, 1, [1, 0, 1], 45.0) == {1: 2, 2: 3}  # -150 is within 45 of -190, not of -200
    assert unbeaten_slots(4, floor, 1, [3, 0, 2], 0.0, eligible=[True, True, False, True]) == {0: 0, 2: 3}  # failed
    assert unbeaten_slots(3, [1.0, 2.0, 3.0], None, [2, 2, 2], 0.0) == {2: 2}  # no elitism: a slot per member


def test_replace_worst_frees_the_lowest_kept_slots_and_no_more() -> None:
    # the elite at position 1; slots 0, 1, 2 belong to positions 0, 2, 3; every score within the margin
    close = [300.0, 320.0, 290.0, 310.0]
    assert unbeaten_slots(4, close, 1, [1, 1, 3], 50.0) == {0: 0, 1: 2, 2: 3}  # frozen: nobody replaced
    assert release_worst(unbeaten_slots(4, close, 1, [1, 1, 3], 50.0), close, 3, 1) == {0: 0, 2: 3}  # 290 goes
    assert release_worst(unbeaten_slots(4, close, 1, [1, 1, 3], 50.0), close, 3, 2) == {2: 3}  # then 300
    scores = [100.0, 320.0, 290.0, 310.0]  # position 0 is beaten anyway: one slot already replaced
    assert release_worst(unbeaten_slots(4, scores, 1, [1, 1, 3], 50.0), scores, 3, 1) == {1: 2, 2: 3}
    assert release_worst(unbeaten_slots(4, close, 1, [1, 1, 3], 50.0), close, 3, 3) == {}


def test_a_kept_member_cannot_undo_the_founder_line_quota() -> None:
    # founders 0, 1, 0, 0: line 1 is member 1 alone, far behind; the elite is member 0 (slots 0-2 belong
    # to members 1-3). keep_founder_lines gave slot 2 a parent from line 1, but slot 2's owner (295, line 0)
    # is not beaten by it, so it is kept there, and member 1 loses slot 0 to the elite: no line 1 left
    founders, scores = [0, 1, 0, 0], [300.0, 10.0, 290.0, 295.0]
    parents = [0, 0, 1]
    kept = unbeaten_slots(4, scores, 0, parents, 47.5)
    assert kept == {1: 2, 2: 3}  # what survives holds line 0 only
    changed = lines_surviving_unbeaten(founders, scores, 0, parents, kept, set(), 2)
    assert changed == [0] and kept == {0: 1, 1: 2, 2: 3}  # member 1 keeps its own slot, unmutated
    # released by replace_worst, the slot takes a clone of the line's member instead (the quota holds too)
    parents, kept = [0, 0, 1], {1: 2, 2: 3}
    assert lines_surviving_unbeaten(founders, scores, 0, parents, kept, {0}, 2) == [0]
    assert parents[0] == 1 and 0 not in kept
    # a line already held (or the quota met) changes nothing
    parents, kept = [0, 1, 0], {2: 3}
    assert lines_surviving_unbeaten(founders, scores, 0, parents, kept, set(), 2) == [] and parents == [0, 1, 0]


def test_founder_lines_survive_keep_unbeaten_through_next_generation() -> None:
    from evo.agent import AgentContext
    from evo.population import initial_population, next_generation

    exp, _ = load_experiment(TOY_EXPERIMENT, {"selection.keep_unbeaten": True, "selection.tie_tolerance": 47.5,
                                              "selection.founder_lines": 2})
    members = initial_population(exp, AgentContext(task=exp.task, seed=0))
    founders_of = {0: 0, 1: 1, 2: 0, 3: 0}
    for generation in range(1, 13):  # over many draws of the tournaments
        founders = dict(founders_of)
        after = next_generation(members, [300.0, 10.0, 290.0, 295.0], generation, exp,
                                lines={m.index: [] for m in members}, founders=founders)
        assert {founders[m.record.index] for m in after} == {0, 1}, generation


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_keep_unbeaten_overwrites_nobody_while_every_score_ties(tmp_path, mode: str) -> None:
    # a tolerance wider than any score gap: every member ties, so no member is ever replaced
    store = evolve_toy(tmp_path, {"population.mode": mode, "selection.keep_unbeaten": True,
                                  "selection.tie_tolerance": 1e9})
    assert {m["index"] for m in store.all_members()} == {0, 1, 2, 3}
    last = store.last_completed_generation()
    assert last >= 2 and {e["index"] for e in store.evaluations(last)} == {0, 1, 2, 3}
    # without it, the same run overwrites members by coin toss
    store = evolve_toy(tmp_path, {"population.mode": mode, "selection.tie_tolerance": 1e9}, name="blind")
    assert {m["index"] for m in store.all_members()} > {0, 1, 2, 3}


def test_replace_worst_replaces_the_lowest_member_each_generation_of_a_frozen_population(tmp_path) -> None:
    # every member ties within the tolerance, so keep_unbeaten alone replaces nobody (test above);
    # replace_worst = 1 gives exactly the lowest scorer's slot to a new child each generation
    store = evolve_toy(tmp_path, {"selection.keep_unbeaten": True, "selection.tie_tolerance": 1e9,
                                  "selection.replace_worst": 1, "population.generations": 4})
    last = store.last_completed_generation()
    assert last >= 2
    for g in range(last):
        now = store.evaluations(g)
        after = {e["index"] for e in store.evaluations(g + 1)}
        gone = [e for e in now if e["index"] not in after]
        assert len(gone) == 1, f"generation {g}: {len(gone)} replaced"
        assert gone[0]["score"] == min(e["score"] for e in now)
        assert len(after - {e["index"] for e in now}) == 1  # one child took the slot
    children = [m for m in store.all_members() if m["mutation"]]
    assert children and all(m["mutation"]["details"]["selected_by"] == "worst replaced" for m in children)


def test_truncation_replaces_the_lowest_by_clones_of_the_highest_and_keeps_the_rest() -> None:
    rng = np.random.default_rng(0)
    assert truncation_select([3.0, 9.0, 1.0, 5.0], 1, rng) == {2: 1}
    assert truncation_select([3.0, 9.0, 1.0, 5.0, 7.0, 0.0], 2, rng) == {5: 1, 2: 4}  # lowest by highest
    # a failed member ranks last and is replaced first; more failures than k are all replaced
    assert truncation_select([3.0, 9.0, 1.0, 5.0], 1, rng, eligible=[True, False, True, True]) == {1: 3}
    assert truncation_select([3.0, 9.0, 1.0, 5.0], 1, rng, eligible=[False, True, False, True]) == {0: 1, 2: 1}
    # ties at a floor: which of them goes is drawn, not always the same position
    losers = {next(iter(truncation_select([0.0, 0.0, 0.0, 5.0], 1, np.random.default_rng(s)))) for s in range(40)}
    assert losers == {0, 1, 2}
    for k in (0, 3):
        with pytest.raises(ValueError, match="truncation: expected 1..2"):
            truncation_select([1.0, 2.0, 3.0, 4.0], k, rng)
    with pytest.raises(ValueError, match="every member failed"):
        truncation_select([1.0, 2.0], 1, rng, eligible=[False, False])


def test_truncation_replaces_exactly_the_lowest_member_each_generation_by_a_clone_of_the_best(tmp_path) -> None:
    # PBT's exploit rule: one child a generation, in the lowest scorer's slot, from the best; the others train on
    store = evolve_toy(tmp_path, {"selection.truncation": 1, "population.generations": 4})
    last = store.last_completed_generation()
    assert last >= 2
    parents = {m["index"]: m["parent"] for m in store.all_members()}
    for g in range(last):
        now = store.evaluations(g)
        after = {e["index"] for e in store.evaluations(g + 1)}
        gone = [e for e in now if e["index"] not in after]
        born = after - {e["index"] for e in now}
        assert len(gone) == 1 and len(born) == 1, g
        assert gone[0]["score"] == min(e["score"] for e in now)
        best = [e["index"] for e in now if e["score"] == max(x["score"] for x in now)]
        assert parents[born.pop()] in best
    children = [m for m in store.all_members() if m["mutation"]]
    assert children and all(m["mutation"]["details"]["selected_by"] == "truncation" for m in children)


def test_keep_unbeaten_keeps_every_member_that_shares_the_best_score(tmp_path) -> None:
    store = evolve_toy(tmp_path, {"selection.keep_unbeaten": True, "population.generations": 4})
    replaced = 0
    for g in range(store.last_completed_generation()):
        now = store.evaluations(g)
        after = {e["index"] for e in store.evaluations(g + 1)}
        top = max(e["score"] for e in now)
        assert {e["index"] for e in now if e["score"] == top} <= after  # nobody beats the best
        replaced += sum(e["index"] not in after for e in now)
        # a replaced member always scored below the best of its generation
        assert all(e["score"] < top for e in now if e["index"] not in after)
    assert replaced > 0, "the toy run's scores differ: someone should have been beaten"


def test_the_new_fields_are_checked() -> None:
    with pytest.raises(SpecError, match="population.budget"):
        load_experiment(TOY_EXPERIMENT, {"population.budget": {}})
    with pytest.raises(SpecError, match="population.mode"):
        load_experiment(TOY_EXPERIMENT, {"population.mode": "steady"})
    with pytest.raises(SpecError, match="selection.equal_compute"):
        load_experiment(TOY_EXPERIMENT, {"selection.equal_compute": "flops"})


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_model_guided_children_learn_from_the_runs_rounds(tmp_path, mode: str) -> None:
    pytest.importorskip("sklearn")
    store = evolve_toy(tmp_path, {
        "population.mode": mode, "population.generations": 4, "mutation.no_mutation": 0.0, "mutation.architecture": 0.0,
        "mutation.parameters": 0.0, "mutation.activation": 0.0, "mutation.rl_hp": 0.0, "mutation.model_guided": 1.0})
    records = [m["mutation"] for m in store.all_members() if m["parent"] is not None]
    assert records and all(r["kind"] == "model_guided" for r in records)
    guided = [r for r in records if "observations" in r.get("details", {})]
    assert guided, "no child was placed by the model (always too few observations?)"
    assert all(r["details"]["observations"] >= 4 for r in guided)
