"""Behaviour is unchanged by refactors: tiny EfficientZero and ILQL runs (inline, seed 3) give
exactly the recorded evaluation tables — fitness, scores, hyperparameters, architectures, lineage
and every loss metric, compared as JSON, so equal means equal to the last bit.

When a change of behaviour is intended, re-record with `python -m tests.golden.record` and say why
in the commit.
"""

from __future__ import annotations

import json

import pytest

from tests.golden.record import TINY, golden_path, run_table


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_run_matches_recording(name: str) -> None:
    expected = json.loads(golden_path(name).read_text())
    assert json.loads(json.dumps(run_table(name))) == expected
