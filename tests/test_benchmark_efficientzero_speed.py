"""benchmarks.efficientzero_speed: each member section measures its experiment file's first member, --only
names its sections when given an unknown one, and --arch measures a second network beside the file's."""

from __future__ import annotations

import sys
from types import SimpleNamespace

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


def test_arch_builds_a_second_member_of_that_network_with_the_files_hyperparameters() -> None:
    own = speed.build_member("cartpole")
    other = speed.build_member("cartpole", arch={"width": 32, "latent_size": 32, "blocks": [32]})
    assert (own.arch["width"], own.arch["latent_size"], own.arch["blocks"]) == (64, 64, [64])
    assert (other.arch["width"], other.arch["latent_size"], other.arch["blocks"]) == (32, 32, [32])
    assert other.arch["lstm_hidden_size"] == own.arch["lstm_hidden_size"]  # keys not named stay the file's
    assert other.hparams == own.hparams
    assert sum(p.numel() for p in other.model.parameters()) < sum(p.numel() for p in own.model.parameters())


@pytest.mark.parametrize("argv, message", [
    (["--arms", "baseline,arch_fast"], "--arch KEY=VALUE and the arms arch_fast"),
    (["--arms", "baseline,fast", "--arch", "width=32"], "--arch KEY=VALUE and the arms arch_fast"),
])
def test_arch_and_the_arch_arms_are_refused_one_without_the_other(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                                  message: str) -> None:
    monkeypatch.setattr(sys, "argv", ["efficientzero_speed", "--only", "learner", *argv])
    with pytest.raises(SystemExit, match=message):
        speed.main()


def test_an_arch_arm_runs_on_the_second_member_and_is_reported_against_the_baseline() -> None:
    agents = {name: SimpleNamespace(task={"compile": "off", "autocast": "off"}) for name in ("baseline", "arch_compiled")}
    seen: list[tuple[str, str, str]] = []

    def work(name: str) -> None:  # what each window's arm set on each member
        seen.append((name, agents["baseline"].task["compile"], agents["arch_compiled"].task["compile"]))

    out = speed.alternate(agents.__getitem__, work, 1.0, 2, ("baseline", "arch_compiled"))
    assert seen == [("baseline", "off", "off"), ("arch_compiled", "off", "on"), ("arch_compiled", "off", "on"),
                    ("baseline", "off", "off")]
    assert {"ratio_arch_compiled_median_cpu", "ratio_arch_compiled_median_wall"} <= set(out)
