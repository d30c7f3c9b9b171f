"""Bad experiment files: a clear message naming file, field, expected and found; exit 2; no run dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from evo.cli import main
from evo.spec import SpecError, load_experiment
from tests.conftest import TOY_EXPERIMENT, run_evo

GOOD = TOY_EXPERIMENT.read_text()


def _variant(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new, 1)


BAD_FILES = {
    "unknown_agent": (_variant('kind = "tests.toy_agent:ToyAgent"', 'kind = "alphago"'),
                      "agent.kind: expected one of ['efficientzero', 'ilql'] or 'package.module:Class', found 'alphago'"),
    "min_gt_max": (_variant('lr = { value = 3e-3, min = 1e-4, max = 3e-2', 'lr = { value = 3e-3, min = 1e-1, max = 3e-2'),
                   "agent.hparams.lr.min: expected min <= max, found min=0.1 > max=0.03"),
    "negative_population": (_variant("size = 4", "size = -3"),
                            "population.size: expected greater than or equal to 1, found -3"),
    "unknown_mutation_kind": (_variant("rl_hp = 0.2", "rl_hp = 0.2\nteleport = 0.5"),
                              "mutation.teleport: unknown field"),
    "malformed_toml": (GOOD.replace("[population]", "[population"), "malformed TOML"),
    "wrong_type": (_variant("generations = 3", 'generations = "many"'),
                   "population.generations: expected a valid integer"),
    "unknown_hparam": (_variant("[agent.hparams]", "[agent.hparams]\nmomentum = 0.9"),
                       "agent.hparams.momentum: unknown hyperparameter"),
    "unknown_activation": (_variant('activation_choices = ["ReLU"', 'activation_choices = ["Swishy", "ReLU"'),
                           "mutation.activation_choices: expected activations from"),
    "bad_task": (_variant("n_val = 128", "n_val = 0"), "agent.task.n_val: expected a positive integer, found 0"),
    "tournament_too_big": (_variant("tournament_size = 2", "tournament_size = 9"),
                           "selection.tournament_size: expected at most population.size (4), found 9"),
    "missing_kind": (GOOD.replace("[agent]\nkind", "[agent]\nkinds", 1), "agent.kind: required field is missing"),
    "own_share_above_one": (GOOD + "\n[replay]\nown_share = 1.5\n",
                            "replay.own_share: expected less than or equal to 1, found 1.5"),
    "replace_worst_without_keep_unbeaten": (_variant("tournament_size = 2", "tournament_size = 2\nreplace_worst = 1"),
                                            "selection.replace_worst: expected population.mode = 'sync' and "
                                            "selection.keep_unbeaten = true"),
    "replace_worst_whole_population": (_variant("tournament_size = 2", "tournament_size = 2\nkeep_unbeaten = true\n"
                                                "replace_worst = 4"),
                                       "selection.replace_worst: expected fewer than population.size (4), found 4"),
    "truncation_with_keep_unbeaten": (_variant("tournament_size = 2", "tournament_size = 2\nkeep_unbeaten = true\n"
                                               "truncation = 1"),
                                      "selection.truncation: expected population.mode = 'sync' and no tournament rule"),
    "truncation_above_half": (_variant("tournament_size = 2", "tournament_size = 2\ntruncation = 3"),
                              "selection.truncation: expected at most half of population.size (4), found 3"),
    "bad_backend": (_variant('backend = "inline"', 'backend = "slurm"'), "backend: expected 'ray' or 'inline', found 'slurm'"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_exits_2_with_clear_message_and_no_run(tmp_path: Path, case: str, capsys, monkeypatch) -> None:
    text, message = BAD_FILES[case]
    (tmp_path / f"{case}.toml").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert main(["run", f"{case}.toml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"evo: {case}.toml: "), err
    assert message in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("case", ["malformed_toml", "min_gt_max"])
def test_bad_file_through_the_real_command(tmp_path: Path, case: str) -> None:
    text, message = BAD_FILES[case]
    (tmp_path / f"{case}.toml").write_text(text)
    proc = run_evo(["run", f"{case}.toml"], tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_missing_file(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "absent.toml"]) == 2
    assert "absent.toml: file not found" in capsys.readouterr().err


def test_in_process_error_carries_fields() -> None:
    with pytest.raises(SpecError) as exc:
        load_experiment(TOY_EXPERIMENT, overrides={"population.size": 0})
    assert exc.value.field == "population.size" and str(TOY_EXPERIMENT) == exc.value.source


def test_good_file_resolves_agent_tables() -> None:
    exp, text = load_experiment(TOY_EXPERIMENT)
    assert text == GOOD
    assert exp.hparam_space["lr"].scale == "log" and exp.hparam_space["batch_size"].kind == "int"
    assert exp.arch["max_blocks"] == 3 and exp.task["n_val"] == 128
    assert exp.agent_class.__name__ == "ToyAgent"  # resolved once, here
