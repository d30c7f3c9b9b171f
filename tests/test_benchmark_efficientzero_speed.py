"""benchmarks.efficientzero_speed: each member section measures its experiment file's first member, and
--only names its sections when given an unknown one."""

from __future__ import annotations

import sys

import pytest

from benchmarks import efficientzero_speed as speed
from evo.spec import load_experiment


@pytest.mark.parametrize("section", sorted(speed.EXPERIMENTS))
def test_a_member_section_builds_its_files_first_member(section: str) -> None:
    exp, _ = load_experiment(speed.ROOT / speed.EXPERIMENTS[section], {"seed": 0})
    if exp.task["env_id"].startswith("MinAtar/"):
        pytest.importorskip("minatar")
    agent = speed.build_member(section)
    assert agent.task["env_id"] == exp.task["env_id"]
    assert {n: agent.hparams[n] for n in exp.hparam_space} == {n: hp.value for n, hp in exp.hparam_space.items()}
    assert agent.task["autocast"] == exp.task["autocast"]


def test_an_unknown_section_is_refused_with_the_known_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["efficientzero_speed", "--only", "asterix", "--arms", "fast"])
    with pytest.raises(SystemExit, match="unknown section 'asterix'.*asterix_suite"):
        speed.main()
