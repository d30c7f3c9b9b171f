"""The Atari Pong experiment file starts from a fresh clone and trains: a member built from the file's
own task and architecture (search and batch cut to CPU size) collects and learns a few hundred steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evo.agent import AgentContext
from evo.replay import build_replay
from evo.spec import load_experiment

EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "atari_pong_efficientzero.toml"


def test_the_atari_file_is_a_valid_experiment():
    exp, _ = load_experiment(EXPERIMENT)
    assert exp.task["env_id"] == "ALE/Pong-v5" and exp.task["atari"]["frame_skip"] == 4
    assert exp.population.steps_per_generation * exp.population.generations == 100_000
    assert exp.resources.gpus_per_member > 0


@pytest.mark.slow
def test_the_atari_experiment_trains_a_few_hundred_steps_on_cpu():
    exp, _ = load_experiment(EXPERIMENT)
    task = {**exp.task, "num_envs": 2, "min_replay": 64, "segment_length": 32, "eval_episodes": 1, "eval_max_steps": 50}
    cls = exp.agent_class
    store = build_replay(cls.replay_spec(task), 0, distributed=False)
    hp = {name: h.value for name, h in exp.hparam_space.items()}
    hp.update(num_simulations=4, batch_size=16, replay_ratio=0.1, reanalyse_ratio=0.0)
    agent = cls.create(exp.arch, hp, 0, 0, AgentContext(task=task, replay=store, seed=0))
    metrics = agent.train(300)
    assert metrics["env_steps"] == 300 and metrics["updates"] > 0 and np.isfinite(metrics["loss_total"])
    assert store.sample(1).data["obs"].dtype == np.uint8
    ev = agent.evaluate()
    assert np.isfinite(ev.fitness) and ev.metrics["eval_length"] <= 50
