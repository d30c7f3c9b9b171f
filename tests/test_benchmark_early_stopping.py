"""benchmarks.early_stopping: its three arms per seed, and compute saved that is what the rungs stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import early_stopping


def test_the_toy_arms_report_saved_steps_that_the_rungs_stopped(tmp_path: Path) -> None:
    out = tmp_path / "es.json"
    assert early_stopping.main(["--quick", "--seeds", "1", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["task"] == "toy" and summary["seeds"] == 1 and len(summary["rows"]) == 1
    row = summary["rows"][0]
    plain, same_rounds, same_steps = row["plain"], row["rungs_same_rounds"], row["rungs_same_steps"]
    assert plain["env_steps"] == 6 * 4 * 30  # 6 slots x 4 rounds x the toy's 30 steps
    # what the same rounds saved is exactly what its rungs stopped: no round is left unfinished
    assert plain["env_steps"] - same_rounds["env_steps"] == same_rounds["rung_stats"]["env_steps_saved"] > 0
    assert row["saved_fraction"] == 1 - same_rounds["env_steps"] / plain["env_steps"]
    # the same steps: the saved steps went to more rounds, up to plain's budget and at most a round past it
    assert plain["env_steps"] <= same_steps["env_steps"] < plain["env_steps"] + 30
    for arm in (plain, same_rounds, same_steps):
        assert arm["member_s"] > 0 and arm["wall_s"] > 0


def test_reuse_keeps_finished_seeds(tmp_path: Path, capsys) -> None:
    out = tmp_path / "es.json"
    assert early_stopping.main(["--quick", "--seeds", "1", "--json", str(out)]) == 0
    first = json.loads(out.read_text())["rows"]
    capsys.readouterr()
    assert early_stopping.main(["--quick", "--seeds", "2", "--reuse", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["seed"] for r in rows] == [0, 1] and rows[0] == first[0]
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith('{"seed"')]
    assert [json.loads(line)["seed"] for line in printed] == [1]  # seed 0 was not run again


def test_reuse_refuses_another_tasks_results(tmp_path: Path) -> None:
    out = tmp_path / "es.json"
    out.write_text(json.dumps({"task": "cartpole", "rows": []}))
    with pytest.raises(SystemExit):
        early_stopping.main(["--quick", "--seeds", "1", "--reuse", "--json", str(out)])


def test_rungs_on_a_training_metric_without_the_same_steps_arm(tmp_path: Path) -> None:
    out = tmp_path / "es.json"
    assert early_stopping.main(["--quick", "--seeds", "1", "--rung-metric=-loss_mse", "--no-same-steps",
                                "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["rung_metric"] == "-loss_mse" and "rungs_same_steps_minus_plain" not in summary
    row = summary["rows"][0]
    assert "rungs_same_steps" not in row and set(summary["median_best"]) == {"plain", "rungs_same_rounds"}
    same_rounds = row["rungs_same_rounds"]
    assert row["plain"]["env_steps"] - same_rounds["env_steps"] == same_rounds["rung_stats"]["env_steps_saved"] > 0
    with pytest.raises(SystemExit):  # --reuse keeps only seeds judged the same way
        early_stopping.main(["--quick", "--seeds", "2", "--reuse", "--json", str(out)])
