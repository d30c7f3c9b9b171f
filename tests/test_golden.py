"""Behaviour is unchanged by refactors: tiny EfficientZero and ILQL runs (inline, seed 3) give
the recorded evaluation tables — fitness, scores, hyperparameters, architectures, lineage and
evaluation metrics and counts exactly (compared as JSON), the network's training metrics (losses,
gradient norms, mean values) to 1% (they round differently on another CPU: tests/golden/record.py).

When a change of behaviour is intended, re-record with `python -m tests.golden.record` and say why
in the commit.
"""

from __future__ import annotations

import json

import pytest

from tests.golden.record import TINY, differences, golden_path, recorded_on_this_cpu, run_table


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_run_matches_recording(name: str) -> None:
    recorded = json.loads(golden_path(name).read_text())
    assert differences(recorded, run_table(name), same_cpu=recorded_on_this_cpu(name)) == []


def test_a_changed_decision_or_loss_is_a_difference() -> None:
    recorded = json.loads(golden_path("cartpole_efficientzero").read_text())
    assert differences(recorded, recorded) == []
    changed = json.loads(json.dumps(recorded))
    changed[4]["fitness"] += 1e-12  # a decision: exact
    changed[5]["train_metrics"]["loss_policy"] *= 1.02  # a loss off by 2%
    changed[6]["train_metrics"]["loss_value"] *= 1.001  # within 1%: rounding
    changed[7]["train_metrics"]["train_episodes"] += 0.001  # a count: exact
    found = differences(recorded, changed)
    assert len(found) == 3 and "row 4" in found[0] and "fitness" in found[0] and "loss_policy" in found[1], found
    assert "row 7" in found[2] and "train_episodes" in found[2], found
    assert differences(recorded, recorded[:-1]) == [f"{len(recorded) - 1} evaluations, recorded {len(recorded)}"]


def test_on_another_cpu_only_the_training_numbers_are_let_go() -> None:
    recorded = json.loads(golden_path("cartpole_efficientzero").read_text())
    changed = json.loads(json.dumps(recorded))
    changed[4]["train_metrics"]["loss_policy"] *= 1.12  # measured: up to 12% on an AMX Xeon
    changed[4]["train_metrics"]["train_episode_return"] += 0.75
    assert len(differences(recorded, changed)) == 2  # on the recording's CPU both count
    assert differences(recorded, changed, same_cpu=False) == []
    changed[5]["fitness"] += 1e-12  # a decision: exact on any CPU
    changed[6]["train_metrics"]["train_episodes"] += 1  # a count too
    found = differences(recorded, changed, same_cpu=False)
    assert len(found) == 2 and "fitness" in found[0] and "train_episodes" in found[1], found
