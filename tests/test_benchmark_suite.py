"""The EfficientZero task suite (benchmarks/suite.py, experiments/suite/, docs/benchmarks.md).

By default: every task's whole pipeline once under `--quick` (the smoke test: an evo run, the
random policy on the same starts, the peer skipped, the verdict), `--reuse` keeping finished runs,
and the random baseline's starts. The learning thresholds are `slow` tests: the issue's targets."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from benchmarks import suite


def test_every_task_runs_quick_with_random_and_verdict(tmp_path):
    out = tmp_path / "suite.json"
    results = suite.main(["--quick", "--json", str(out), "--plot", str(tmp_path / "suite.png")])
    assert set(results["tasks"]) == set(suite.TASKS)
    on_disk = json.loads(out.read_text())
    assert on_disk["quick"] is True and on_disk["commit"]
    for name, entry in on_disk["tasks"].items():
        (run,) = entry["runs"]
        steps, wall, best = run["curve"][-1]
        assert steps == 2 * 64 and wall > 0 and np.isfinite(best), name
        assert not run["partial"] and run["final_best"] == best
        assert entry["random"]["episodes"] == 10 and np.isfinite(entry["random"]["mean"]), name
        assert "skipped" in entry["peer"], name
        assert entry["verdict"]["finals"] == [best] and entry["verdict"]["target"] is not None, name
        held = run["heldout"]  # the last elite and the best checkpoint, afresh on other starts
        assert held["episodes"] == 2 and held["seed"] == 1000 and held["random"]["episodes"] == 2, name
        assert held["last_elite"]["run_fitness"] == best and np.isfinite(held["best_checkpoint"]["fitness"]), name
        assert entry["verdict"]["heldout_finals"] == [held["last_elite"]["fitness"]], name
        assert entry["anchor"]["return"] is not None
        assert len(run["train_return"]) == len(run["curve"]) == 1, name  # the mean training return per generation
        # where it came from: the call's commit and command, and a digest of its experiment file
        assert run["commit"] == on_disk["commit"] and run["command"].startswith("python -m benchmarks.suite --quick")
        assert run["file_sha256"] == suite.file_digest((suite.ROOT / entry["file"]).read_text()), name
    assert (tmp_path / "suite.png").stat().st_size > 0
    # --reuse keeps a finished run (its curve is not recomputed)
    stamped = json.loads(out.read_text())
    stamped["tasks"]["cartpole"]["runs"][0]["curve"][-1][1] = 1234.5
    out.write_text(json.dumps(stamped))
    again = suite.main(["--quick", "--reuse", "--tasks", "cartpole", "--json", str(out)])
    assert again["tasks"]["cartpole"]["runs"][0]["curve"][-1][1] == 1234.5
    rows = suite.table(again).splitlines()
    assert len(rows) == 2 + len(suite.TASKS) and "| cartpole | 0 | 128 of 128 | 1234 |" in rows[2]
    assert rows[2].endswith(f"| {on_disk['commit'][:7]} |")  # made at this commit, with the file as it is


def test_the_table_says_which_runs_were_made_with_an_earlier_file() -> None:
    now = suite.file_digest((suite.ROOT / suite.TASKS["cartpole"]["file"]).read_text())
    assert suite.made_cell({"commit": "0123456789ab", "file_sha256": now}, now) == "0123456"
    assert suite.made_cell({"commit": "0123456789ab", "file_sha256": "feedfacecafe"}, now) == "0123456 (earlier file)"
    # runs from before runs recorded it: what is known of them (docs/benchmarks.md), else '?'
    assert suite.made_cell({"provenance": {"commit": "abcdef012345", "file_as_now": False}}, now) == "abcdef0 (earlier file)"
    assert suite.made_cell({}, now) == "?"


def test_random_policy_faces_the_evaluation_starts():
    """The random baseline starts from the evaluation seeds of the run: the same start observations
    a member's evaluation sees; a fixed action seed makes it repeatable."""
    from agents.efficientzero.agent import EfficientZeroAgent
    from agents.efficientzero.envs import EnvPool

    task = EfficientZeroAgent.validate_task({"env_id": "CartPole-v1"})
    a = suite.random_policy(task, 3, 10, 500)
    assert a == suite.random_policy(task, 3, 10, 500)
    assert 10 < a["mean"] < 60  # CartPole's random policy: about 22
    pool = EnvPool(task, 1)
    pool.reset_to(0, 3 * 7919 + 12345)
    first = pool.observations()[0]
    other = EnvPool(task, 1)
    other.reset_to(0, 4 * 7919 + 12345)
    assert not np.allclose(first, other.observations()[0])


#: the last elite on 50 held-out episodes must clear this too, so that a lucky 10-episode evaluation does not
#: pass: the target itself, but for LunarLander, whose returns have a standard deviation near 120 (a 50-episode
#: mean's standard error ~17): its held-out elites scored 218.0, 212.6, 152.3 and 149.95 where the runs' own
#: finals met 150 (docs/benchmarks.md), so 100 there (random plays about -180)
HELDOUT_FLOOR = {"cartpole": 475.0, "mountaincar": -130.0, "lunarlander": 100.0}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cartpole", "mountaincar", "lunarlander"])
def test_suite_task_meets_its_target(tmp_path, name):
    """The issue's target on seed 0 at the file's budget, and a held-out floor (2 idle cores: CartPole
    about 4 minutes, MountainCar about 15, LunarLander about 15)."""
    results = suite.main(["--tasks", name, "--no-peer", "--json", str(tmp_path / "suite.json")])
    v = results["tasks"][name]["verdict"]
    assert v["complete"] and all(v["met"]), v
    assert v["heldout_finals"][0] >= HELDOUT_FLOOR[name], v


#: MinAtar Breakout's floor: the issue's target is 10x random, which the file meets on 3 of 3 seeds; the file
#: as it is (epsilon-greedy collection, absorbing terminal, batch 128) scored 13.33x, 14.46x and 16.34x random on
#: seeds 0-2 (docs/benchmarks.md), so 4x on seed 0 fails on a run that did not learn (random-like play: about 1x)
BREAKOUT_FLOOR_X_RANDOM = 4.0


@pytest.mark.slow
def test_minatar_breakout_beats_random_by_the_floor(tmp_path):
    """MinAtar Breakout, seed 0, the file's 200k env steps (about 75 minutes on 2 idle cores)."""
    results = suite.main(["--tasks", "minatar_breakout", "--no-peer", "--json", str(tmp_path / "suite.json")])
    v = results["tasks"]["minatar_breakout"]["verdict"]
    assert v["complete"] and v["x_random"][0] >= BREAKOUT_FLOOR_X_RANDOM, v


def test_tasks_are_named_by_suite_name_or_env_id():
    assert [suite.task_name(t) for t in ("MountainCar-v0", "mountaincar", "MinAtar/Breakout-v1", "CartPole-v1")] == \
        ["mountaincar", "mountaincar", "minatar_breakout", "cartpole"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown task"):
        suite.task_name("Pong")


def test_each_seed_is_judged_against_the_peer_run_of_its_seed():
    """`--peer-seeds K` stores seeds 1..K-1 beside seed 0's peer run; the verdict and the table pair
    every evo seed with the peer's run of the same seed, and fall back to seed 0's where there is none."""
    def curve(final):
        return [[1000, 1.0, final - 1.0], [2000, 2.0, final]]

    entry = {"runs": [{"seed": s, "curve": curve(f), "final_best": f, "budget": 2000} for s, f in
                      [(0, 500.0), (1, 451.4), (2, 400.3)]],
             "random": {"mean": 23.3}, "anchor": {"text": "anchor", "return": 500.0},
             "peer": {"curve": curve(497.6), "final_best": 497.6},
             "peer_more": [{"seed": 1, "curve": curve(375.3), "final_best": 375.3}]}
    v = suite.verdict("cartpole", entry)
    assert v["peer_finals"] == [497.6, 375.3, 497.6]
    assert v["above_peer"] == [True, True, False]
    entry["verdict"] = v
    rows = suite.table({"tasks": {"cartpole": entry}}).splitlines()[2:]
    assert ["497.6 (seed 0)" in rows[0], "375.3 (seed 1)" in rows[1], "497.6 (seed 0)" in rows[2]] == [True] * 3
    # a peer that was skipped gives no above/below verdict
    entry["peer"], entry["peer_more"] = {"skipped": "--no-peer"}, []
    assert "above_peer" not in suite.verdict("cartpole", entry)


def test_set_overrides_an_ablation_with_its_own_runs_and_first_seed(tmp_path):
    """`--set` changes the task's file for the run (recorded in the JSON and in the run's stored
    experiment), gives the runs their own names, and `--reuse` refuses a JSON of other overrides;
    `--first-seed` runs held-out seeds."""
    out = tmp_path / "ablation.json"
    argv = ["--quick", "--tasks", "cartpole", "--first-seed", "3", "--set", "agent.hparams.replay_ratio=0.5",
            "--set", "population.steps_per_generation=48", "--json", str(out)]
    results = suite.main(argv)
    assert results["overrides"] == {"agent.hparams.replay_ratio": 0.5, "population.steps_per_generation": 48}
    (run,) = results["tasks"]["cartpole"]["runs"]
    assert run["seed"] == 3 and run["curve"][-1][0] == 2 * 64  # --quick sets the steps after the overrides
    exp, text = suite.load_task("cartpole", 3, False, results["overrides"])
    assert exp.hparam_space["replay_ratio"].value == 0.5 and exp.seed == 3
    assert "benchmarks.suite --set" in text
    assert suite.variant_suffix(results["overrides"]).startswith("_v") and suite.variant_suffix({}) == ""
    with pytest.raises(SystemExit):
        suite.main(["--quick", "--reuse", "--tasks", "cartpole", "--json", str(out)])
    with pytest.raises(SystemExit):
        suite.main(["--quick", "--tasks", "cartpole", "--set", "population", "--json", str(out)])


def test_reuse_adds_held_out_and_train_returns_only_from_the_runs_own_store(tmp_path, monkeypatch):
    """An earlier call's finished run gets its held-out evaluation and its mean training returns from its
    RunStore under runs/suite/, but not from a store that is gone or holds another run (a later call may
    reuse the name)."""
    from evo.runstore import EvaluatedMember, RunStore
    from evo.testing.runstore_contract import evaluated, founders

    monkeypatch.setattr(suite, "RUNS_DIR", tmp_path)
    gone = {"seed": 0, "curve": [[1000, 1.0, 20.0]]}
    suite.add_from_store("cartpole", gone, None)
    assert "no longer on this machine" in gone["heldout"]["skipped"] and "train_return" not in gone
    store = RunStore.create(tmp_path, "cartpole_s0", "name='x'", {})
    population = founders([0, 1])
    store.save_initial_population(population)
    trained = [EvaluatedMember(e.record, f, f, {}, train, e.state) for e, f, train in
               zip(evaluated(population, 0), [30.0, 9.0], [{"train_episode_return": 1.5}, {"train_episode_return": 4.0}])]
    store.commit_generation(0, trained, population, wall_s=1.0)
    # a member that finished no episode in its generation is left out of that generation's mean
    trained = [EvaluatedMember(e.record, f, f, {}, train, e.state) for e, f, train in
               zip(evaluated(population, 1), [31.0, 8.0], [{"train_episode_return": 2.0}, {}])]
    store.commit_generation(1, trained, population, wall_s=1.0)
    assert suite.train_returns(store) == [2.75, 2.0]
    store.close()
    other = {"seed": 0, "curve": [[1000, 1.0, 20.0]]}  # its curve's best (20) is not the store's (30)
    suite.add_from_store("cartpole", other, None)
    assert "holds another run" in other["heldout"]["skipped"] and "train_return" not in other
    own = {"seed": 0, "curve": [[1000, 1.0, 30.0], [2000, 2.0, 31.0]], "heldout": {"skipped": "kept as it was"}}
    suite.add_from_store("cartpole", own, None)
    assert own["train_return"] == [2.75, 2.0] and own["heldout"] == {"skipped": "kept as it was"}
    assert "| 2.75 → 2.00 |" in suite.table({"tasks": {"cartpole": {"runs": [own], "anchor": {"text": "-"}}}})


def test_a_continued_run_counts_its_env_steps_on_from_the_last_point():
    # `--reuse` continuing a partial run: the next generation's point is at the old steps plus one
    # generation's (a fresh count from 0 mislabelled MountainCar's continued points as 40,000...)
    from benchmarks.hpo.evo_strategy import CurveObserver

    observer = CurveObserver(steps_per_generation=100)
    observer.carry_on([[400, 10.0, -150.0], [800, 20.0, -120.0]])
    for index in range(4):
        observer.member_event(index, "done", {"fitness": -110.0})
    observer.generation_done(2, [{"fitness": -110.0, "train_metrics": {}, "metrics": {}, "wall_s": 1.0}])
    assert [p[0] for p in observer.curve] == [400, 800, 1200] and observer.curve[-1][1] >= 20.0


def test_random_baseline_repeats_each_start_and_each_seed_is_judged_on_its_own_starts():
    """One draw of 10 random episodes is too noisy to divide by (40-50% of its mean on MinAtar
    Breakout): `repeats` plays each start again with fresh actions, and a verdict judges each seed's
    final against random on that seed's starts (`random_by_seed`), falling back to the task's."""
    from agents.efficientzero.agent import EfficientZeroAgent

    task = EfficientZeroAgent.validate_task({"env_id": "CartPole-v1"})
    once = suite.random_policy(task, 3, 10, 500)
    assert "repeats" not in once  # one draw: as before the option
    many = suite.random_policy(task, 3, 10, 500, repeats=8)
    assert many["repeats"] == 8 and many["episodes"] == 10 and many["run_seed"] == 3
    assert 0 < many["se"] < many["std"] and 10 < many["mean"] < 60
    # the first repeat is the single draw: the same actions on the same starts
    assert suite.random_policy(task, 3, 10, 500, repeats=1) == once

    def run(seed, final):
        return {"seed": seed, "curve": [[1000, 1.0, final]], "final_best": final, "budget": 1000}

    entry = {"runs": [run(0, 4.0), run(1, 4.0)], "random": {"mean": 0.5},
             "random_by_seed": {"1": {"mean": 0.25, "repeats": 20, "se": 0.02, "episodes": 10}},
             "anchor": {"text": "anchor", "return": 28.0}}
    v = suite.verdict("minatar_breakout", entry)  # target 10x random
    assert v["targets"] == [5.0, 2.5] and v["met"] == [False, True] and v["x_random"] == [8.0, 16.0]
    entry["verdict"] = v
    rows = suite.table({"tasks": {"minatar_breakout": entry}}).splitlines()[2:]
    assert "| 0.5 |" in rows[0] and "| 0.25 ± 0.02 (200 ep) |" in rows[1]
    assert "| 5.0 | no |" in rows[0] and "| 2.5 | yes |" in rows[1]


def test_greedy_play_counts_a_trained_members_actions(tmp_path):
    """benchmarks.greedy_play (the Asterix diagnosis): a member trained to each checkpoint, its search
    played greedily, deeper and sampled, with the share of each action, beside a random policy."""
    from benchmarks import greedy_play

    out = tmp_path / "play.json"
    result = greedy_play.main(["experiments/suite/cartpole.toml", "64", '{"num_simulations": 4}',
                               "--episodes", "2", "--json", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["overrides"] == {"num_simulations": 4} and result["episodes"] == 2
    (row,) = result["checkpoints"]
    assert row["env_steps"] == 64
    plays = [result["random"], *row["plays"]]
    assert [(p["simulations"], p["temperature"]) for p in row["plays"]] == [(4, 0.0), (32, 0.0), (4, 1.0)]
    for p in plays:
        assert abs(sum(p["action_share"]) - 1.0) < 0.01 and len(p["action_share"]) == 2
        assert p["length"] >= 8 and p["return"] == p["length"]  # CartPole: +1 a step
        assert 0.0 <= p["tied_share"] <= 1.0
    assert result["random"]["tied_share"] == 0.0  # no search, no ties


@pytest.mark.parametrize("game", ["Breakout", "Asterix", "SpaceInvaders"])
def test_the_peer_sees_minatar_as_evo_members_do(game):
    """AgileRL's runner (its own venv, no evo imports) serves MinAtar images channel-first as uint8 0/255,
    the layout its CNN encoder reads: the same arrays an evo member gets from the same seed, and the MinAtar
    paper's network as the encoder (the shipped DQN config has none for images)."""
    from agents.efficientzero.envs import make_env as evo_env
    from benchmarks.hpo import agilerl_runner as runner

    env_id = f"MinAtar/{game}-v1"
    peer, ours = runner.make_env(env_id), evo_env({"env_id": env_id})
    assert peer.observation_space == ours.observation_space and peer.observation_space.shape[1:] == (10, 10)
    for seed in (0, 1):
        obs, _ = peer.reset(seed=seed)
        assert peer.observation_space.contains(obs) and obs.max() == 255
        np.testing.assert_array_equal(obs, ours.reset(seed=seed)[0])
        for action in (1, 2, 0):
            np.testing.assert_array_equal(peer.step(action)[0], ours.step(action)[0])
    config = runner.net_config(env_id)
    assert config["encoder_config"] == {"channel_size": [16], "kernel_size": [3], "stride_size": [1]}
    assert runner.net_config("CartPole-v1") is runner.NET_CONFIG
