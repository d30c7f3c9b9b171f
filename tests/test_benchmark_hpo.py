"""The HPO benchmark (benchmarks/hpo, docs/benchmarks.md): the shared pieces by default, the whole
`--quick` run (every strategy, AgileRL's venv made on first use) as a slow test that checks the
JSON's schema, not the outcome."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.hpo.common import founders, load, summarise, task

ROOT = Path(__file__).resolve().parents[1]


def test_random_search_and_pbt_start_from_evos_founders():
    from evo.agent import AgentContext
    from evo.population import initial_population

    t = task("cartpole", quick=True)
    exp, _ = load(t, seed=3)
    members = initial_population(exp, AgentContext(task=exp.task, seed=3))
    for member, start in zip(members, founders(exp), strict=True):
        assert {k: member.agent.hparams[k] for k in start} == start
    assert founders(exp)[0]["lr"] == exp.hparam_space["lr"].value  # member 0 keeps the file's values
    assert len({f["lr"] for f in founders(exp)}) == t.population   # the others are drawn from the ranges


def test_the_no_mutation_ablation_changes_only_the_mutation_weights():
    from benchmarks.hpo.evo_strategy import NO_MUTATION

    t = task("cartpole", quick=True)
    exp, _ = load(t, seed=0)
    ablated, _ = load(t, seed=0, **NO_MUTATION)
    assert list(ablated.mutation.weights()) == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # every child an unmutated copy
    assert list(exp.mutation.weights()) != list(ablated.mutation.weights())
    assert ablated.selection == exp.selection and ablated.hparam_space == exp.hparam_space


def test_the_no_architecture_ablation_gives_its_share_to_no_mutation():
    """evo-noarch: no architecture mutation, the other kinds drawn exactly as often as in evo."""
    from benchmarks.hpo.evo_strategy import NO_ARCHITECTURE, VARIANTS
    from benchmarks.hpo.strategy import ABLATIONS, STRATEGIES

    t = task("cartpole", quick=True)
    exp, _ = load(t, seed=0)
    ablated, _ = load(t, seed=0, **NO_ARCHITECTURE)
    before, after = exp.mutation.weights() / exp.mutation.weights().sum(), ablated.mutation.weights()
    kinds = list(ablated.mutation.KINDS)
    assert after[kinds.index("architecture")] == 0.0 and after.sum() == pytest.approx(1.0)
    assert after[kinds.index("no_mutation")] == pytest.approx(before[kinds.index("no_mutation")]
                                                              + before[kinds.index("architecture")])
    for kind in ("parameters", "activation", "rl_hp"):
        assert after[kinds.index(kind)] == pytest.approx(before[kinds.index(kind)]), kind
    # every evo variant is a strategy the benchmark can run by name
    assert set(VARIANTS) <= set(STRATEGIES) | set(ABLATIONS)


def test_the_keep_unbeaten_ablation_changes_only_that_selection_switch():
    """evo-unbeaten differs from evo by keep_unbeaten alone; every other evo strategy keeps the plain
    tournament its committed runs used, though the main job's file now turns keep_unbeaten on."""
    from benchmarks.hpo.evo_strategy import VARIANTS

    t = task("cartpole", quick=True)
    file_exp, _ = load(t, seed=0, regime="scratch")
    assert file_exp.selection.keep_unbeaten                     # the shipped file's rule
    exp, _ = load(t, seed=0, regime="scratch", **VARIANTS["evo"])
    ablated, _ = load(t, seed=0, regime="scratch", **VARIANTS["evo-unbeaten"])
    assert ablated.selection.keep_unbeaten and not exp.selection.keep_unbeaten
    assert ablated.selection.model_copy(update={"keep_unbeaten": False}) == exp.selection
    assert ablated.mutation == exp.mutation and ablated.hparam_space == exp.hparam_space
    for name, changes in VARIANTS.items():  # evo-noselect keeps every member by it (next test)
        assert changes["selection.keep_unbeaten"] is (name in ("evo-unbeaten", "evo-noselect", "evo-margin", "evo-own",
                                                                  "evo-lines", "evo-explore", "evo-lines-explore")), name


def _one_generation(exp, scores: list[float], members: list | None = None, generation: int = 1) -> tuple[list, list]:
    """A population of `exp`'s founders (or `members`) and generation `generation` after `scores`."""
    from evo.agent import AgentContext
    from evo.population import initial_population, next_generation

    members = members or initial_population(exp, AgentContext(task=exp.task, seed=0))
    after = next_generation(members, scores, generation, exp, lines={m.index: [] for m in members},
                            founders={m.index: m.index for m in members})
    return members, after


def _only_child(exp, scores: list[float]) -> tuple:
    """(the one child of generation 1 after `scores`, its parent among the founders): a truncation = 1 run."""
    members, after = _one_generation(exp, scores)
    (child,) = [m for m in after if m.record.born == 1]
    return child, next(m for m in members if m.index == child.record.parent)


def test_the_margin_ablation_replaces_a_member_only_from_a_tenth_of_the_target_behind():
    from benchmarks.hpo.evo_strategy import VARIANTS, settings

    t = task("cartpole", quick=True)
    exp, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-margin"]))
    assert exp.selection.keep_unbeaten and exp.selection.tie_tolerance == pytest.approx(0.1 * t.target)
    members, close = _one_generation(exp, [100.0, 60.0, 90.0, 80.0])
    assert all(m.record.born == 0 for m in close)  # 40 behind the best: within the margin, nobody replaced
    _, far = _one_generation(exp, [500.0, 9.0, 480.0, 0.0], members)
    assert any(m.record.born == 1 for m in far)


def test_the_own_data_ablation_is_the_margin_rule_with_half_of_each_batch_from_own_rows():
    from benchmarks.hpo.evo_strategy import VARIANTS, settings

    t = task("cartpole", quick=True)
    own, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-own"]))
    margin, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-margin"]))
    assert own.replay.own_share == 0.5 and margin.replay.own_share == 0.0
    assert own.selection == margin.selection and own.mutation == margin.mutation


def test_the_two_lines_ablation_keeps_a_second_founder_line_when_one_leads_by_far():
    """evo-lines: one founder far ahead of three at the floor takes slots, but another founder's line
    stays; evo-own, the same rule without it, lets the leader take all in some generations."""
    from benchmarks.hpo.evo_strategy import VARIANTS, settings

    t = task("cartpole", quick=True)
    lines, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-lines"]))
    own, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-own"]))
    assert lines.selection.founder_lines == 2 and own.selection.founder_lines == 0
    assert lines.replay == own.replay and lines.mutation == own.mutation
    scores = [300.0, 9.0, 12.0, 10.0]
    founders_left = {"evo-lines": set(), "evo-own": set()}
    for generation in range(1, 9):  # tournaments are drawn: in some generations the leader takes all without the rule
        for name, exp in (("evo-lines", lines), ("evo-own", own)):
            members, after = _one_generation(exp, scores, generation=generation)
            founder = {m.record.index: m.record.index for m in members}
            kept = {founder.get(m.record.index, founder.get(m.record.parent)) for m in after}
            founders_left[name].add(len(kept))
            if name == "evo-lines":  # the leader's line and one of the floor's (they tie within the margin)
                assert 0 in kept and len(kept) >= 2, (generation, kept)
    assert min(founders_left["evo-lines"]) >= 2
    assert 1 in founders_left["evo-own"]


def test_the_explore_ablation_replaces_the_lowest_member_even_within_the_margin():
    from benchmarks.hpo.evo_strategy import VARIANTS, settings

    t = task("cartpole", quick=True)
    explore, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-explore"]))
    own, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-own"]))
    assert explore.selection.model_copy(update={"replace_worst": 0}) == own.selection and explore.replay == own.replay
    close = [380.0, 350.0, 360.0, 370.0]  # within a tenth of the target of each other
    members, frozen = _one_generation(own, close)
    assert all(m.record.born == 0 for m in frozen)
    _, moved = _one_generation(explore, close, members)
    assert [m.record.index for m in moved if m.record.born == 1] and 1 not in {m.record.index for m in moved}


def test_the_lines_explore_ablation_is_evo_lines_with_the_worst_member_replaced():
    """evo-lines-explore: evo-lines' selection plus replace_worst 1; within the margin it still makes a
    child, and with one founder far ahead a second founder's line survives the quota."""
    from benchmarks.hpo.evo_strategy import VARIANTS, settings

    t = task("cartpole", quick=True)
    both, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-lines-explore"]))
    lines, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-lines"]))
    assert both.selection.model_copy(update={"replace_worst": 0}) == lines.selection and both.replay == lines.replay
    assert both.selection.replace_worst == 1 and both.mutation == lines.mutation
    members, moved = _one_generation(both, [380.0, 350.0, 360.0, 370.0])
    assert [m for m in moved if m.record.born == 1] and 1 not in {m.record.index for m in moved}
    for generation in range(1, 9):
        members, after = _one_generation(both, [300.0, 9.0, 12.0, 10.0], generation=generation)
        founder = {m.record.index: m.record.index for m in members}
        kept = {founder.get(m.record.index, founder.get(m.record.parent)) for m in after}
        assert 0 in kept and len(kept) >= 2, (generation, kept)


def test_the_truncate_ablation_replaces_only_the_worst_member_by_a_clone_of_the_best():
    """evo-truncate, PBT's exploit rule: whatever the scores, exactly one child a generation, in the
    lowest-scoring member's slot, cloned from the best; the other members train on unmutated."""
    from benchmarks.hpo.evo_strategy import VARIANTS, settings

    for name in ("cartpole", "randomwalks-sparse"):
        t = task(name, quick=True)
        exp, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-truncate"]))
        plain, _ = load(t, seed=0, regime="scratch", **VARIANTS["evo"])
        assert exp.selection.model_copy(update={"truncation": 0}) == plain.selection and exp.mutation == plain.mutation
        for generation, scores in enumerate(([380.0, 350.0, 360.0, 370.0], [9.0, 500.0, 0.0, 480.0],
                                              [0.2, 0.1, 0.3, 0.05]), start=1):
            members, after = _one_generation(exp, scores, generation=generation)
            children = [m for m in after if m.record.born == generation]
            worst, best = (members[int(i)].index for i in (np.argmin(scores), np.argmax(scores)))
            assert len(children) == 1 and children[0].record.parent == best, (name, scores)
            assert sorted(m.index for m in after if m.record.born == 0) == sorted(
                m.index for m in members if m.index != worst)
            survivors = {m.index: m.agent.hparams for m in members}
            assert all(m.agent.hparams == survivors[m.index] for m in after if m.record.born == 0)


def test_the_truncate_hp_ablations_change_all_or_three_hyperparameters_of_a_child_and_nothing_else():
    from benchmarks.hpo.evo_strategy import VARIANTS, settings

    t = task("randomwalks-sparse", quick=True)
    exp, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-truncate-hp"]))
    truncate, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-truncate"]))
    assert exp.selection == truncate.selection
    child, parent = _only_child(exp, [0.2, 0.1, 0.3, 0.05])
    assert child.record.mutation["kind"] == "rl_hp" and child.agent.arch == parent.agent.arch
    mutable = [name for name, hp in exp.hparam_space.items() if hp.mutable]
    assert len(mutable) == 7 and all(child.agent.hparams[n] != parent.agent.hparams[n] for n in mutable)
    three, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-truncate-hp3"]))
    assert three.mutation.model_copy(update={"rl_hp_count": 100}) == exp.mutation and three.selection == exp.selection
    child, parent = _only_child(three, [0.2, 0.1, 0.3, 0.05])
    assert sum(child.agent.hparams[n] != parent.agent.hparams[n] for n in mutable) == 3


def _scratch_variant(task_name: str, name: str):
    """Seed 0's experiment of evo variant `name` on `task_name` (quick) from scratch."""
    from benchmarks.hpo.evo_strategy import VARIANTS, settings

    t = task(task_name, quick=True)
    return load(t, seed=0, regime="scratch", **settings(t, VARIANTS[name]))[0]


def test_the_own_ablations_are_truncate_hp_and_hp3_with_half_of_each_batch_from_the_members_own_rows():
    own, hp = (_scratch_variant("cartpole", n) for n in ("evo-truncate-hp-own", "evo-truncate-hp"))
    assert own.replay.own_share == 0.5 and hp.replay.own_share == 0.0
    assert own.spec.model_copy(update={"replay": hp.replay}) == hp.spec
    three_own, three = (_scratch_variant("cartpole", n) for n in ("evo-truncate-hp3-own", "evo-truncate-hp3"))
    assert three_own.spec.model_copy(update={"replay": three.replay}) == three.spec and three_own.replay == own.replay


def test_the_pbt_own_ablation_is_truncate_hp_own_with_pbts_resampling():
    pbt, own = (_scratch_variant("randomwalks-sparse", n) for n in ("evo-pbt-own", "evo-truncate-hp-own"))
    assert pbt.mutation.rl_hp_resample == 0.25 and own.mutation.rl_hp_resample == 0.0
    assert pbt.spec.model_copy(update={"mutation": own.mutation}) == own.spec
    # a child still changes every hyperparameter; some are drawn afresh where evo-truncate-hp-own's child,
    # made from the same random draws, grew or shrank them, and the others got the same step
    child, parent = _only_child(pbt, [0.2, 0.1, 0.3, 0.05])
    stepped, _ = _only_child(own, [0.2, 0.1, 0.3, 0.05])
    mutable = [name for name, hp in pbt.hparam_space.items() if hp.mutable]
    assert all(child.agent.hparams[n] != parent.agent.hparams[n] for n in mutable)
    redrawn = [n for n in mutable if child.agent.hparams[n] != stepped.agent.hparams[n]]
    assert 0 < len(redrawn) < len(mutable)


def test_the_budget_ends_the_runs_with_rungs_or_a_resting_elite_and_no_other():
    """A run with rungs or a resting elite gets the task's budget and as many generations as it may need
    (rungs first: a run with both is a rungs run); every other run is ended by its generations' count."""
    from benchmarks.hpo.evo_strategy import VARIANTS, budgeted_generations, resting_generations, settings

    t = task("cartpole", False)
    generations = {name: budgeted_generations(t, settings(t, VARIANTS[name]))
                   for name in ("evo", "evo-async", "evo-truncate-hp-own", "evo-rungs", "evo-champion-eval",
                                "evo-truncate-hp-own-rest", "evo-truncate-hp-own-rest-best")}
    assert generations["evo"] is generations["evo-async"] is generations["evo-truncate-hp-own"] is None
    assert generations["evo-rungs"] == generations["evo-champion-eval"] == 4 * t.generations
    assert generations["evo-truncate-hp-own-rest"] == generations["evo-truncate-hp-own-rest-best"] == resting_generations(t)
    assert budgeted_generations(t, {"population.rungs": [0.25, 0.5], "selection.rest_elite": True}) == 4 * t.generations
    assert resting_generations(t) not in (None, t.generations, 4 * t.generations)


def test_the_shared_rest_variant_changes_only_how_many_actors_share_the_cores():
    shared, rest = (_scratch_variant("randomwalks-sparse", n) for n in ("evo-truncate-hp-own-rest-shared",
                                                                         "evo-truncate-hp-own-rest"))
    assert shared.resources.num_workers == shared.population.size == 4 and shared.resources.cpus_per_member == 0.5
    assert rest.resources.num_workers == 2 and rest.resources.cpus_per_member == 1
    assert shared.spec.model_copy(update={"resources": rest.resources}) == rest.spec


def test_the_recipe_in_docs_experiments_is_the_benchmarks_evo_truncate_hp_own_rest():
    """docs/experiments.md names `evo-truncate-hp-own-rest` as a recipe a user copies: its TOML must be the variant's settings."""
    import textwrap

    import tomllib

    from benchmarks.hpo.evo_strategy import VARIANTS

    text = (Path(__file__).resolve().parents[1] / "docs" / "experiments.md").read_text()
    after = text[text.index("PBT's search inside evo"):]
    block = after[after.index("\n    [selection]") + 1:]
    block = block[:block.index("\n\n")]
    recipe = {f"{table}.{key}": value for table, values in tomllib.loads(textwrap.dedent(block)).items()
              for key, value in values.items()}
    assert recipe == VARIANTS["evo-truncate-hp-own-rest"]


def test_selection_counts_reads_children_of_the_plain_tournament_which_record_no_reason():
    """Plain `evo` records no `selected_by` (its mutations' JSON has no "details"): counted as "?", not a crash."""
    from types import SimpleNamespace

    from benchmarks.hpo.evo_strategy import selection_counts

    members = [{"mutation": None}, {"mutation": {"kind": "rl_hp"}},
               {"mutation": {"kind": "none", "details": {"selected_by": "score"}}}]
    assert selection_counts(SimpleNamespace(all_members=lambda: members)) == {"?": 1, "score": 1}


def test_the_no_selection_ablation_keeps_every_founder_unmutated_whatever_the_scores():
    """evo-noselect: a generation's end replaces and mutates nobody, even a member 500 points behind,
    so the founders train side by side and share only the store; everything else is evo's."""
    from benchmarks.hpo.evo_strategy import VARIANTS

    t = task("cartpole", quick=True)
    exp, _ = load(t, seed=0, regime="scratch", **VARIANTS["evo-noselect"])
    plain, _ = load(t, seed=0, regime="scratch", **VARIANTS["evo"])
    assert exp.hparam_space == plain.hparam_space and exp.population == plain.population
    members, after = _one_generation(exp, [500.0, 9.0, 480.0, 0.0])
    assert sorted(m.index for m in after) == sorted(m.index for m in members)  # nobody replaced
    assert all(m.record.born == 0 for m in after)
    before = {m.index: m.agent.hparams for m in members}
    assert all(m.agent.hparams == before[m.index] for m in after)  # nobody mutated
    # the plain tournament, given the same scores, replaces the member 500 points behind
    _, replaced = _one_generation(plain, [500.0, 9.0, 480.0, 0.0])
    assert any(m.record.born == 1 for m in replaced)


def test_the_fallback_strategy_sets_a_champion_margin_of_a_fifth_of_each_tasks_target():
    """evo-fallback is evo-champion plus selection.champion_margin, in the task's score units."""
    from benchmarks.hpo.evo_strategy import VARIANTS, settings

    for name, margin in (("cartpole", 95.0), ("randomwalks", 0.18)):
        t = task(name, quick=True)
        fallback, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-fallback"]))
        champion, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-champion"]))
        assert fallback.selection.champion and fallback.selection.champion_margin == pytest.approx(margin), name
        assert fallback.selection.model_copy(update={"champion_margin": None}) == champion.selection
        assert fallback.population == champion.population and fallback.mutation == champion.mutation


def test_summarise_reports_first_hit_and_the_final_best_not_the_peak():
    curve = [[100, 1.0, 10.0], [200, 2.0, 480.0], [300, 3.0, 300.0]]
    assert summarise(curve, 475) == {"steps_to_target": 200, "seconds_to_target": 2.0, "final_best": 300.0,
                                     "peak_best": 480.0}
    assert summarise(curve[:1], 475)["steps_to_target"] is None


def test_target_hold_counts_runs_that_reached_held_and_ended_at_the_target():
    from benchmarks.hpo.stats import target_hold

    def run(*bests, **extra):
        return {"curve": [[100 * (i + 1), float(i), b] for i, b in enumerate(bests)], **extra}

    runs = [run(10, 480, 500, 490),          # reached and held
            run(10, 500, 400, 480),          # reached, fell, ended back at the target: not held
            run(10, 500, 470),               # reached and fell
            run(10, 300, 474.9),             # never reached
            run(10, 500, error="exit 1"),    # a failed run is not counted
            {"curve": []}]
    assert target_hold(runs, 475) == {"runs": 4, "reached": 3, "held": 1, "final_at_target": 2}
    assert target_hold([], 475) == {"runs": 0, "reached": 0, "held": 0, "final_at_target": 0}


def test_tune_curve_takes_a_point_per_round_of_all_trials():
    pytest.importorskip("ray.tune", reason="the bench extra (ray[tune]) is not installed", exc_type=ImportError)
    from types import SimpleNamespace

    from benchmarks.hpo.tune_strategies import CurveRecorder

    rec = CurveRecorder(steps=10, population=2)
    a, b = SimpleNamespace(trial_id="a"), SimpleNamespace(trial_id="b")

    def report(trial, fitness):
        rec.on_trial_result(0, [], trial, {"steps_trained": 10, "fitness": fitness, "train_s": 0.0, "eval_s": 0.0,
                                           "hparams_used": {}})

    report(a, 5.0)
    report(a, 7.0)           # b's first iteration still in flight: no point yet
    assert rec.curve == []
    report(b, 1.0)
    assert [p[0] for p in rec.curve] == [30] and rec.curve[0][2] == 7.0
    report(b, 9.0)
    assert [p[0] for p in rec.curve] == [30, 40] and rec.curve[-1][2] == 9.0


def test_unknown_task_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="cartpole"):
        task("pong", quick=True)


def test_the_sparse_randomwalks_task_is_the_file_on_a_larger_graph_whose_data_rarely_reach_the_goal():
    """randomwalks-sparse: the randomwalks file, budget and search space with the graph changed (41
    nodes, edge p 0.06, walks up to 15 nodes); its data score far below the 21-node graph's."""
    from agents.ilql.tasks import make_task

    sparse, plain = task("randomwalks-sparse", quick=False), task("randomwalks", quick=False)
    assert sparse.budget == plain.budget and sparse.experiment == plain.experiment and sparse.target == 0.5
    exp, _ = load(sparse, seed=0, regime="scratch")
    base, _ = load(plain, seed=0, regime="scratch")
    assert (exp.task["n_nodes"], exp.task["p_edge"], exp.task["max_length"]) == (41, 0.06, 15)
    assert exp.hparam_space == base.hparam_space and founders(exp) == founders(base)
    assert sparse.to_json()["settings"] == {"agent.task.n_nodes": 41, "agent.task.p_edge": 0.06,
                                            "agent.task.max_length": 15}
    graph = make_task(exp.task)
    assert len(graph.start_nodes()) == 40 and graph.data_optimality() < 0.1 < make_task(base.task).data_optimality()


def check_report_schema(report: dict, budget_steps: bool = True) -> None:
    """The JSON `python -m benchmarks.hpo` writes: fields, one result per seed and strategy, curves
    [steps, seconds, best] ending at the same budget for everyone. Not the outcome."""
    assert set(report["machine"]) >= {"cpu_count", "loadavg_at_start", "versions"}
    assert report["task"]["budget"] > 0 and report["seeds"]
    for name, runs in report["strategies"].items():
        assert len(runs) == len(report["seeds"]), name
        for run in runs:
            assert "error" not in run, (name, run.get("error"), run.get("log_tail"))
            assert set(run) >= {"steps_to_target", "seconds_to_target", "final_best", "curve", "used", "loadavg_before"}
            assert run["curve"] and all(len(p) == 3 for p in run["curve"])
            steps = [p[0] for p in run["curve"]]
            assert steps == sorted(steps) and steps[-1] == report["task"]["budget"], name  # the same budget for all
            assert run["final_best"] == run["curve"][-1][2]
    assert report["strategies"]["evo"][0]["used"]["shared_replay"] is True
    assert set(report["ratios"]) == set(report["strategies"]) - {"evo"}


@pytest.mark.slow
@pytest.mark.timeout(3600)  # five strategies' quick runs: ~10 minutes idle, 20+ on a loaded 2-core machine
def test_quick_run_writes_the_report_schema(tmp_path):
    pytest.importorskip("ray.tune", reason="the bench extra (ray[tune]) is not installed", exc_type=ImportError)
    pytest.importorskip("GPy")
    out = tmp_path / "hpo.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.hpo", "--quick", "--json", str(out),
                           "--plot", str(tmp_path / "hpo.png")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=3500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["seeds"] == [0] and report["quick"] is True and report["task"]["target"] == 475.0
    assert set(report["strategies"]) == {"evo", "random", "pbt", "pb2", "agilerl"}
    check_report_schema(report)
    assert (tmp_path / "hpo.png").stat().st_size > 0


def test_the_scratch_regime_draws_every_founder_as_evo_does():
    from evo.agent import AgentContext
    from evo.population import initial_population

    t = task("cartpole", quick=True)
    exp, _ = load(t, seed=3, regime="scratch")
    assert exp.population.initial == "scratch"
    members = initial_population(exp, AgentContext(task=exp.task, seed=3))
    for member, start in zip(members, founders(exp), strict=True):
        assert {k: member.agent.hparams[k] for k in start} == start
    assert founders(exp)[0]["lr"] != exp.hparam_space["lr"].value  # member 0 is drawn too


def test_area_under_best_so_far_charges_late_hits():
    from benchmarks.hpo.stats import auc

    early, late = [[100, 1.0, 400.0], [400, 4.0, 400.0]], [[100, 1.0, 10.0], [400, 4.0, 400.0]]
    assert auc(early, 0, 400) == pytest.approx((0 * 100 + 400 * 300) / 400)
    assert auc(late, 0, 400) == pytest.approx((0 * 100 + 10 * 300) / 400)
    assert auc([[100, 1.0, 50.0], [200, 2.0, 20.0]], 0, 300) == pytest.approx((50 * 200) / 300)  # best so far
    assert auc(late, 1, 8.0) == pytest.approx((10 * 3 + 400 * 4) / 8)  # a point at the horizon counts after it


def test_bootstrap_interval_resolves_a_clear_difference_and_not_noise():
    from benchmarks.hpo.stats import bootstrap_difference, compare

    clear = bootstrap_difference([480, 490, 500, 470, 495], [100, 120, 90, 110, 105])
    assert clear["excludes_0"] and clear["ci95"][0] > 300
    noise = bootstrap_difference([100, 300, 200, 250, 150], [120, 280, 210, 240, 160])
    assert not noise["excludes_0"]
    runs = {"evo": [{"curve": [[100, 1.0, 400.0]], "final_best": 400.0}] * 3,
            "random": [{"curve": [[100, 9.0, 100.0]], "final_best": 100.0}] * 3}
    out = compare(runs, budget=100)
    assert out["evo-random"]["final_best"]["difference"] == 300.0 and out["horizon_seconds"] == 9.0


def test_pairing_by_seed_resolves_a_shift_that_the_seeds_spread_hides():
    """Every strategy of a seed starts from the same founders: a shift of +20 on every seed, under a
    spread of ±200 between seeds, is lost unpaired and resolved paired; seeds only one side ran, or
    ran without a value, are left out."""
    from benchmarks.hpo.stats import bootstrap_difference, compare, paired_difference

    peer = {0: 100.0, 1: 300.0, 2: 500.0, 3: 200.0, 4: 400.0, 5: 150.0, 6: 450.0}
    evo = {s: v + 20.0 for s, v in peer.items()}
    assert not bootstrap_difference(list(evo.values()), list(peer.values()))["excludes_0"]
    paired = paired_difference({**evo, 7: 999.0, 8: None}, {**peer, 8: 10.0, 9: 0.0})
    assert paired["seeds"] == list(range(7)) and paired["n"] == 7
    assert paired["mean"] == 20.0 and paired["excludes_0"] and paired["positive"] == 7 and paired["negative"] == 0
    assert paired["wilcoxon_p"] < 0.05
    mixed = paired_difference({0: 10.0, 1: -10.0, 2: 5.0, 3: -5.0}, {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0})
    assert not mixed["excludes_0"] and mixed["wilcoxon_p"] > 0.5 and (mixed["positive"], mixed["negative"]) == (2, 2)
    assert paired_difference({0: 1.0}, {1: 1.0})["n"] == 0 and paired_difference({0: 1.0}, {0: 1.0})["wilcoxon_p"] is None
    runs = {name: [{"seed": s, "curve": [[100, 1.0, v]], "final_best": v} for s, v in values.items()]
            for name, values in (("evo", evo), ("random", peer))}
    out = compare(runs, budget=100)["evo-random"]
    assert out["paired"]["final_best"]["mean"] == 20.0 and out["paired"]["final_best"]["excludes_0"]
    assert not out["final_best"]["excludes_0"]


def test_collect_reads_a_range_of_seeds_from_first_seed(tmp_path):
    """`--collect --first-seed 5 --seeds 2` reports seeds 5 and 6 only (a later session's seeds, apart),
    paired by seed; a negative first seed is refused."""
    logs = tmp_path / "logs"
    logs.mkdir()
    for name, shift in (("evo", 20.0), ("random", 0.0)):
        for seed in (4, 5, 6):
            best = 100.0 * seed + shift
            run = {"strategy": name, "seed": seed, "steps_to_target": None, "seconds_to_target": None, "final_best": best,
                   "curve": [[1000, 10.0, best]]}
            (logs / f"{name}_scratch_{seed}.json").write_text(json.dumps(run))
    cmd = [sys.executable, "-m", "benchmarks.hpo", "--collect", "--regime", "scratch", "--strategies", "evo,random",
           "--logs", str(logs), "--json", str(tmp_path / "out.json")]
    done = subprocess.run([*cmd, "--first-seed", "5", "--seeds", "2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["seeds"] == [5, 6] and [r["seed"] for r in report["strategies"]["evo"]] == [5, 6]
    paired = report["compare"]["evo"]["evo-random"]["paired"]["final_best"]
    assert paired["seeds"] == [5, 6] and paired["mean"] == 20.0
    assert report["target_hold"]["evo"] == {"runs": 2, "reached": 2, "held": 2, "final_at_target": 2}
    refused = subprocess.run([*cmd, "--first-seed", "-1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--first-seed" in refused.stderr


def test_the_shared_window_does_not_charge_a_later_first_report():
    """Two strategies that find the same members, one reporting its first point later: the plain areas
    differ (the late one is at the floor until it reports), the shared-window areas do not."""
    from benchmarks.hpo.stats import auc, compare

    prompt = [[800, 10.0, 0.95], [1600, 20.0, 0.97], [4000, 50.0, 0.98]]
    late = [[1000, 15.0, 0.95], [1600, 20.0, 0.97], [4000, 50.0, 0.98]]
    assert auc(late, 0, 4000, start=1000) == pytest.approx((0.95 * 600 + 0.97 * 2400) / 3000)
    assert auc(prompt, 0, 4000, start=1000) == pytest.approx(auc(late, 0, 4000, start=1000))  # a point before start counts
    out = compare({"evo": [{"curve": prompt, "final_best": 0.98}] * 3,
                   "random": [{"curve": late, "final_best": 0.98}] * 3}, budget=4000)
    assert out["shared_window_start"] == {"steps": 1000.0, "seconds": 15.0}
    diff = out["evo-random"]
    assert diff["auc_steps"]["difference"] > 0.04 and diff["auc_seconds"]["difference"] > 0.09
    assert diff["auc_steps_shared"]["difference"] == pytest.approx(0.0)
    assert diff["auc_seconds_shared"]["difference"] == pytest.approx(0.0)


def test_the_per_seed_horizon_scores_each_seed_as_if_collected_alone():
    """Seed 1 ran on a machine ten times slower: with one global horizon seed 0's runs are scored mostly on
    their final value (the pooled difference shrinks); auc_seconds_seed keeps each seed's own."""
    from benchmarks.hpo.stats import compare

    def runs(scale):  # evo reports at 1 and 10 s, random at 5 s, both at best 10: evo's area leads by 4 of 10
        return {"evo": [[100, 1.0 * scale, 10.0], [200, 10.0 * scale, 10.0]], "random": [[100, 5.0 * scale, 10.0]]}

    pooled = compare({name: [{"seed": seed, "curve": runs(scale)[name], "final_best": 10.0}
                             for seed, scale in ((0, 1), (1, 10))] for name in ("evo", "random")}, budget=200)
    alone = compare({name: [{"seed": 0, "curve": runs(1)[name], "final_best": 10.0}] for name in ("evo", "random")},
                    budget=200)
    assert alone["evo-random"]["paired"]["auc_seconds"]["mean"] == pytest.approx(4.0)
    assert pooled["evo-random"]["paired"]["auc_seconds"]["mean"] == pytest.approx((0.4 + 4.0) / 2)
    assert pooled["evo-random"]["paired"]["auc_seconds_seed"]["mean"] == pytest.approx(4.0)


def test_the_equal_reports_area_takes_away_what_extra_draws_add():
    """Two strategies whose members are equally good (fitness noise 0.1 around 0.5): one evaluates at 40
    points, one at 5. The plain area favours the frequent one (its best-so-far is a maximum over more
    draws); thinned to 5 reports (`at_reports`) both are maxima over 5 draws, and the lead is gone."""
    from benchmarks.hpo.stats import at_reports, compare

    rng = np.random.default_rng(0)

    def curve(points):  # evenly spaced over the budget (4,000) and over 100 s
        return [[4000 * k / points, 100 * k / points, 0.5 + 0.1 * rng.standard_normal()] for k in range(1, points + 1)]

    many = [{"seed": s, "curve": curve(40), "final_best": 0.5} for s in range(30)]
    few = [{"seed": s, "curve": curve(5), "final_best": 0.5} for s in range(30)]
    thinned = at_reports(many[0]["curve"], 4000)
    assert [p[0] for p in thinned] == [800, 1600, 2400, 3200, 4000]  # the last point at or before each fifth
    assert at_reports(few[0]["curve"], 4000) == few[0]["curve"]  # five reports already: unchanged
    assert at_reports([[3900, 99.0, 1.0]], 4000) == [[3900, 99.0, 1.0]]  # one point serves every fifth once
    diff = compare({"evo": many, "random": few}, budget=4000)["evo-random"]["paired"]
    assert diff["auc_seconds"]["excludes_0"] and diff["auc_seconds"]["mean"] > 0.05
    assert not diff["auc_seconds_reports"]["excludes_0"]
    assert abs(diff["auc_seconds_reports"]["mean"]) < 0.03


def test_an_async_curve_takes_a_point_every_population_of_rounds():
    from benchmarks.hpo.evo_strategy import CurveObserver

    obs = CurveObserver(steps_per_generation=100, population=2)
    for index, fitness in [(0, 10.0), (1, 30.0), (0, 20.0), (2, 15.0), (1, 5.0)]:
        obs.member_event(index, "done", {"fitness": fitness})
    obs.generation_done(0, [{"fitness": 99.0, "train_metrics": {}, "metrics": {}, "wall_s": 1.0}])
    assert [(p[0], p[2]) for p in obs.curve] == [(200, 30.0), (400, 20.0)]  # generations add no point
    sync = CurveObserver(steps_per_generation=100)
    for index in range(2):
        sync.member_event(index, "done", {"fitness": 1.0})
    sync.generation_done(0, [{"fitness": 7.0, "train_metrics": {}, "metrics": {}, "wall_s": 1.0}])
    assert [(p[0], p[2]) for p in sync.curve] == [(200, 7.0)]


def test_an_async_curve_with_rungs_counts_the_steps_of_every_part_and_none_past_the_budget():
    from benchmarks.hpo.evo_strategy import CurveObserver

    obs = CurveObserver(steps_per_generation=100, population=2, budget=300)
    # member 0: a full round in three parts (only the last evaluated); member 1: stopped at its first rung
    # (one part, no evaluation); member 1's successor: a full round in one event
    events = [(0, {"steps": 25}), (1, {"steps": 25}), (0, {"steps": 25}), (0, {"steps": 50, "fitness": 8.0}),
              (1, {"steps": 100, "fitness": 3.0}), (0, {"steps": 100, "fitness": 9.0}),
              (1, {"steps": 100, "fitness": 1.0})]
    for index, details in events:
        obs.member_event(index, "done", details)
    # with a budget, a point after every evaluated round (the best of the last 2) at the steps trained by
    # then, none past the budget
    assert [(p[0], p[2]) for p in obs.curve] == [(125, 8.0), (225, 8.0)]
    assert obs.trained == 425 and obs.rounds_done == 4


def test_a_sync_curve_with_a_budget_credits_no_generation_past_it():
    """evo-truncate-hp-own-rest-best rests only from the generation after a member is perfect, so a last
    generation can take the steps past the budget; that generation gets no point (it trained what the
    peers could not)."""
    from benchmarks.hpo.evo_strategy import CurveObserver

    obs = CurveObserver(steps_per_generation=100, budget=500)
    for generation, members in enumerate([2, 2, 1, 2]):  # 200, 400, 500 (one rested), 700: past the budget
        for index in range(members):
            obs.member_event(index, "done", {"fitness": 1.0})
        obs.generation_done(generation, [{"fitness": float(generation), "train_metrics": {}, "metrics": {}, "wall_s": 1.0}])
    assert [(p[0], p[2]) for p in obs.curve] == [(200, 0.0), (400, 1.0), (500, 2.0)]
    assert len(obs.profile) == 4 and obs.trained == 700  # the generation is still profiled


def test_the_rest_best_strategy_rests_at_each_tasks_best_possible_fitness():
    from benchmarks.hpo.common import TASKS, load, task
    from benchmarks.hpo.evo_strategy import VARIANTS, settings

    for name in TASKS:
        t = task(name, quick=True)
        exp, _ = load(t, seed=0, regime="scratch", **settings(t, VARIANTS["evo-truncate-hp-own-rest-best"]))
        assert exp.selection.rest_elite and exp.selection.rest_from == t.best_possible
    assert task("cartpole", quick=False).best_possible == 500.0  # CartPole-v1's 500-step limit


def test_a_resting_strategy_runs_the_generations_its_budget_pays_for_and_none_past_it():
    """evo-truncate-hp-own-rest trains every member in generation 0 and all but one after: it gets more
    generations than the others, and never spends past the budget every strategy has."""
    from benchmarks.hpo.common import TASKS, task
    from benchmarks.hpo.evo_strategy import resting_generations

    def spent(t, generations: int) -> int:
        return (t.population + (generations - 1) * (t.population - 1)) * t.steps_per_generation

    for name in TASKS:
        for quick in (False, True):
            t = task(name, quick)
            g = resting_generations(t)
            assert g >= t.generations and spent(t, g) <= t.budget < spent(t, g + 1), (name, quick, g)
    assert resting_generations(task("cartpole", False)) == 7  # 44,000 of 48,000 env steps


def test_the_ab_report_pairs_seeds_and_says_whether_the_curves_are_the_same(tmp_path):
    from benchmarks.hpo.ab import main

    def write(folder, seed, seconds, fitness=(0.2, 0.5)):
        folder.mkdir(exist_ok=True)
        curve = [[800 * (i + 1), s, f] for i, (s, f) in enumerate(zip(seconds, fitness))]
        run = {"strategy": "evo-x", "seed": seed, "final_best": fitness[-1], "curve": curve}
        (folder / f"evo-x_scratch_{seed}.json").write_text(json.dumps(run))

    before, after = tmp_path / "before", tmp_path / "after"
    write(before, 0, (10.0, 20.0))
    write(after, 0, (8.0, 16.0))  # the same curve, 1.25x sooner
    write(before, 1, (10.0, 30.0))
    write(after, 1, (9.0, 20.0), fitness=(0.2, 0.6))  # a different curve: said so
    write(before, 2, (5.0, 10.0))  # no run of seed 2 after: left out
    (after / "out_0.json").write_text(json.dumps({"benchmark": "hpo"}))  # a report, not a run: ignored
    out = tmp_path / "ab.json"
    assert main([str(before), str(after), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["seeds"] == [0, 1]
    assert [r["same_curve"] for r in report["per_seed"]] == [True, False] and not report["all_curves_same"]
    assert [r["ratio"] for r in report["per_seed"]] == pytest.approx([1.25, 1.5])
    assert report["median_ratio"] == pytest.approx(1.375) and report["total_ratio"] == pytest.approx(50 / 36)
    assert report["geometric_mean_ratio"] == pytest.approx(math.sqrt(1.25 * 1.5))
    low, high = report["ci95_geometric_mean_ratio"]
    assert 1.25 - 1e-9 <= low <= report["geometric_mean_ratio"] <= high <= 1.5 + 1e-9
    with pytest.raises(SystemExit):  # no seed in both
        main([str(before), str(tmp_path / "missing"), "--json", str(out)])
