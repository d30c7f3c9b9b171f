"""Temporally-extended exploration when collecting (`explore_epsilon`; selfplay.ExtendedExploration,
Dabney et al. 2021's ez-greedy): options of a random action held for a zeta-distributed number of steps."""

import numpy as np
import pytest

from agents.efficientzero.agent import EfficientZeroAgent
from agents.efficientzero.selfplay import ExtendedExploration, SelfPlay
from evo.replay import build_replay
from tests.efficientzero.test_selfplay import HP, TASK, RecordingReplay, _model


def test_durations_follow_the_truncated_zeta_law():
    explore = ExtendedExploration(0.5, mu=2.0, max_duration=50, num_actions=3)
    n = explore.durations(np.random.default_rng(0), 200_000)
    assert n.min() == 1 and n.max() == 50
    support = np.arange(1, 51, dtype=float)
    expected = support ** -2.0 / (support ** -2.0).sum()
    observed = np.bincount(n, minlength=51)[1:] / len(n)
    assert np.allclose(observed[:5], expected[:5], atol=0.004)   # P(1) = 0.62, P(2) = 0.16, ...
    assert abs(n.mean() - (support * expected).sum()) < 0.05     # heavy tail: mean 2.9 at this cap
    flat = ExtendedExploration(0.5, mu=0.0, max_duration=50, num_actions=3).durations(np.random.default_rng(0), 50_000)
    assert abs(flat.mean() - 25.5) < 0.3                            # mu = 0: uniform on 1..50


def test_options_hold_one_random_action_and_epsilon_zero_draws_nothing():
    rng = np.random.default_rng(1)
    explore = ExtendedExploration(0.1, mu=1.0, max_duration=40, num_actions=3)
    left, held = [0], [0]
    played = [int(explore.apply(np.array([1]), left, held, rng)[0]) for _ in range(20_000)]
    played = np.asarray(played)
    off = played != 1                      # the search always says 1: anything else is an option
    assert 0.05 < off.mean() < 0.6
    # runs of a non-search action are long: held options, not per-step dithering
    runs = np.diff(np.flatnonzero(np.diff(np.r_[0, off.astype(int), 0])))[::2]
    assert runs.mean() > 3.0, runs.mean()
    quiet = np.random.default_rng(2)
    state = quiet.bit_generator.state
    out = ExtendedExploration(0.0, 2.0, 100, 3).apply(np.array([2, 0]), [0, 0], [0, 0], quiet)
    assert out.tolist() == [2, 0] and quiet.bit_generator.state == state


def test_collection_plays_options_and_carries_them_in_the_state():
    store = build_replay(EfficientZeroAgent.replay_spec(TASK), 0, distributed=False)
    replay = RecordingReplay(store)
    selfplay = SelfPlay(TASK)
    hp = {**HP, "explore_epsilon": 1.0, "explore_duration_mu": 0.0, "explore_max_duration": 8}
    selfplay.collect(_model(), hp, np.random.default_rng(0), replay, 0, 40, lambda n: None)
    actions = np.concatenate([b["action"] for b in replay.inserts])
    assert len(actions) == 40
    changes = np.count_nonzero(np.diff(np.concatenate([b["action"] for b in replay.inserts[:1]])))
    assert changes < len(replay.inserts[0]["action"]) - 1   # held, not redrawn every step
    state = selfplay.state()
    assert len(state["repeat_left"]) == TASK["num_envs"]
    again = SelfPlay(TASK)
    again.load_state(state)
    assert again.repeat_left == selfplay.repeat_left and again.repeat_action == selfplay.repeat_action


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="explore_epsilon"):
        ExtendedExploration(1.5, 2.0, 10, 2)
    with pytest.raises(ValueError, match="explore_max_duration"):
        ExtendedExploration(0.1, 2.0, 0, 2)


def test_spread_gives_the_envs_an_ape_x_spectrum_of_epsilons():
    explore = ExtendedExploration(0.4, 1.0, 100, 3, num_envs=8, spread=7.0)
    assert np.allclose(explore.epsilons, 0.4 ** (1 + 7 * np.arange(8) / 7))
    assert explore.epsilons[0] == pytest.approx(0.4) and explore.epsilons[-1] == pytest.approx(0.4 ** 8)
    assert np.allclose(ExtendedExploration(0.3, 1.0, 100, 3, num_envs=4).epsilons, 0.3)  # spread 0: all alike
    rng = np.random.default_rng(3)
    left, held = [0] * 8, [0] * 8
    off = np.zeros(8)
    for _ in range(5_000):
        off += explore.apply(np.full(8, 7), left, held, rng) != 7   # the search says 7: never a random action
    assert off[0] > 0.5 * 5_000 and off[-1] < 0.05 * 5_000 and np.all(np.diff(off) <= 150)


def test_epsilon_anneals_from_its_start_to_its_floor_as_a_dqn():
    explore = ExtendedExploration(0.1, 2.0, 1, 4, epsilon_start=1.0, decay_steps=1000)
    assert [explore.epsilon_at(t) for t in (0, 500, 1000, 5000)] == pytest.approx([1.0, 0.55, 0.1, 0.1])
    rng, left, held = np.random.default_rng(4), [0], [0]
    # the search says 3; a random action is 3 a quarter of the time, so 3/4 of the explored steps show
    early = np.mean([explore.apply(np.array([3]), left, held, rng, step=0)[0] != 3 for _ in range(8000)])
    late = np.mean([explore.apply(np.array([3]), left, held, rng, step=1000)[0] != 3 for _ in range(8000)])
    assert abs(early - 0.75) < 0.03 and abs(late - 0.075) < 0.015, (early, late)
    # no schedule (decay_steps 0, the default): the same draws as before the schedule existed, at any step
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    plain = ExtendedExploration(0.3, 2.0, 10, 3, num_envs=4, spread=2.0)
    scheduled_off = ExtendedExploration(0.3, 2.0, 10, 3, num_envs=4, spread=2.0, epsilon_start=0.9, decay_steps=0)
    for step in range(300):
        assert plain.apply(np.zeros(4, int), [0] * 4, [0] * 4, a).tolist() == \
            scheduled_off.apply(np.zeros(4, int), [0] * 4, [0] * 4, b, step=step * 1000).tolist()
    assert a.bit_generator.state == b.bit_generator.state
    with pytest.raises(ValueError, match="explore_epsilon_start"):
        ExtendedExploration(0.1, 2.0, 1, 2, epsilon_start=1.2, decay_steps=10)
    with pytest.raises(ValueError, match="explore_decay_steps"):
        ExtendedExploration(0.1, 2.0, 1, 2, decay_steps=-1)


@pytest.mark.parametrize("fused", [False, True], ids=["alone", "fused"])
def test_the_schedule_runs_on_the_members_env_steps_across_train_calls(fused, one_torch_thread):
    """ε from 1 to 0 over a member's first 64 env steps, collecting on the search's argmax otherwise: the
    first call's actions often differ from the search's choice, the second call's (steps 64..127) never,
    alone and in a fused group (a schedule restarted at every call would explore again)."""
    from agents.efficientzero.fused import FusedEfficientZero
    from tests.efficientzero.test_agent import TASK as AGENT_TASK
    from tests.efficientzero.test_agent import make

    recording = RecordingReplay(build_replay(EfficientZeroAgent.replay_spec(AGENT_TASK), 0, distributed=False))
    agent = make(replay=recording, hp={"collect_temperature": 0.0, "explore_epsilon": 0.0, "explore_max_duration": 1,
                                       "explore_epsilon_start": 1.0, "explore_decay_steps": 64})
    off_argmax = []
    for _ in range(2):
        recording.inserts.clear()
        if fused:
            FusedEfficientZero().train([agent], 64)
        else:
            agent.train(64)
        rows = {k: np.concatenate([b[k] for b in recording.inserts]) for k in ("action", "policy")}
        assert len(rows["action"]) == 64
        off_argmax.append(int(np.count_nonzero(rows["action"] != rows["policy"].argmax(1))))
    assert off_argmax[0] >= 5 and off_argmax[1] == 0, off_argmax
    assert agent.env_steps == 128


def _mountaincar_goals(hp_over: dict, steps: int, seed: int) -> tuple[int, int]:
    """(episodes that reached the flag, episodes) in `steps` env steps of an untrained member's collection."""
    import torch

    from agents.efficientzero.model import build_model

    task = EfficientZeroAgent.validate_task({"env_id": "MountainCar-v0", "num_envs": 8, "replay_capacity": 20_000})
    store = build_replay(EfficientZeroAgent.replay_spec(task), seed, distributed=False)
    model = build_model((2,), 3, EfficientZeroAgent.validate_arch({"latent_size": 16, "width": 16, "blocks": [16],
                                                                    "lstm_hidden_size": 16, "proj_size": 16}),
                        torch.Generator().manual_seed(seed))
    hp = {**{k: v.value for k, v in EfficientZeroAgent.default_hparams().items()}, "num_simulations": 2, **hp_over}
    finished = SelfPlay(task).collect(model, hp, np.random.default_rng(seed), store, 0, steps, lambda n: None)
    return sum(r > -200 for r in finished), len(finished)


def test_mountaincar_collection_reaches_the_flag_only_with_extended_exploration(one_torch_thread):
    """The suite's failure (experiments/suite/mountaincar.toml before exploration: 992 training
    episodes, none at the flag): an untrained member's search plays close to uniformly and a uniform
    random policy practically never reaches the flag in 200 steps; options of a held action do."""
    explore = {"explore_epsilon": 0.2, "explore_duration_mu": 1.0}   # experiments/suite/mountaincar.toml's
    goals, episodes = _mountaincar_goals(explore, 8_000, seed=1)
    assert episodes >= 32 and goals >= 1, (goals, episodes)  # measured: 2 of 40 (seeds 0, 2: 1 of 40)
    assert _mountaincar_goals({"explore_epsilon": 0.0}, 8_000, seed=1)[0] == 0  # 0 of 40 at seeds 0-2


@pytest.mark.slow
def test_one_member_learns_mountaincar_with_extended_exploration(one_torch_thread):
    """benchmarks.explore_probe's "ε 0.2, μ 1" member (the suite file's settings, seed 0): measured
    −187.3 at 20k, −148.3 at 25k, −105.8 at 30k env steps (docs/efficientzero.md, "Exploration");
    without exploration every evaluation and training episode to 30k was −200. About 4 minutes."""
    from benchmarks.explore_probe import probe

    log = probe("slow-test", 40_000, 5_000, {"explore_epsilon": 0.2, "explore_duration_mu": 1.0})["log"]
    assert sum(row["goal"] for row in log) >= 1
    assert max(row["eval"] for row in log) >= -150.0, log
