"""Adopting an ablation's runs as the suite's rows (benchmarks/suite_adopt.py): what moves where, what
is checked first, and what is refused without changing anything."""

from __future__ import annotations

import copy
import json

import pytest

from benchmarks import suite, suite_adopt

TASK = "minatar_breakout"
FILE_NOW = (suite.ROOT / suite.TASKS[TASK]["file"]).read_text()
BATCH_NOW = 'batch_size = { value = 128, min = 32, max = 256, kind = "int" }'
#: the file as an earlier commit had it: batch 64, which an ablation's --set turned into the file's 128
FILE_THEN = FILE_NOW.replace(BATCH_NOW, 'batch_size = { value = 64, min = 32, max = 256, kind = "int" }')
OVERRIDES = {"agent.hparams.batch_size": {"value": 128, "min": 32, "max": 256, "kind": "int"}}


def run(seed: int, final: float, **extra) -> dict:
    curve = [[20_000, 100.0, final / 2], [200_000, 1000.0, final]]
    return {"seed": seed, "curve": curve, "partial": False, "final_best": final, "peak_best": final,
            "wall_s": 1000.0, "commit": "0123456789abcdef", "command": "python -m benchmarks.suite --set ...",
            "file_sha256": "feedfacecafe", **extra}


def rnd(mean: float) -> dict:
    return {"mean": mean, "std": 0.1, "episodes": 200, "repeats": 20}


def suite_results() -> dict:
    entry = {"runs": [run(0, 3.0), run(1, 3.5)], "random_by_seed": {"0": rnd(0.5), "1": rnd(0.4)},
             "random": rnd(0.5), "file": suite.TASKS[TASK]["file"], "anchor": suite.TASKS[TASK]["anchor"],
             "runs_note": "the earlier note"}
    entry["verdict"] = suite.verdict(TASK, entry)
    return {"tasks": {TASK: entry}}


def ablation(*runs: dict, overrides: dict | None = None, quick: bool = False) -> dict:
    return {"tasks": {TASK: {"runs": list(runs), "random_by_seed": {str(r["seed"]): rnd(0.45) for r in runs}}},
            "overrides": OVERRIDES if overrides is None else overrides, "quick": quick,
            "commit": "0123456789abcdef", "command": "python -m benchmarks.suite --set ..."}


def then(commit: str, path: str) -> str:
    assert path == suite.TASKS[TASK]["file"]
    return FILE_THEN


def test_the_file_is_as_the_tests_expect() -> None:
    assert BATCH_NOW in FILE_NOW  # the file took the ablation's batch; these tests build on that line


def test_an_ablation_run_becomes_the_row_of_its_seed_and_the_old_row_is_kept() -> None:
    results = suite_results()
    lines = suite_adopt.adopt(results, ablation(run(1, 6.0)), "abl.json", "batch128", "docs say why", read_file_at=then)
    entry = results["tasks"][TASK]
    assert [r["seed"] for r in entry["runs"]] == [0, 1]
    new = entry["runs"][1]
    assert new["final_best"] == 6.0 and "commit" not in new and "file_sha256" not in new
    prov = new["provenance"]
    assert prov["commit"] == "0123456" and prov["file_as_now"] is True and prov["adopted_from"] == "abl.json"
    assert "checked equal" in prov["evidence"] and prov["evidence"].endswith("docs say why")
    assert suite.made_cell(new, None) == "0123456"  # the table's "made at": the run's commit, the file as now
    # the replaced row and its random baseline are kept under the label; seed 0 is untouched
    assert [r["final_best"] for r in entry["runs_before_batch128"]] == [3.5]
    assert entry["random_by_seed_before_batch128"] == {"1": rnd(0.4)}
    assert entry["random_by_seed"]["1"] == rnd(0.45) and entry["random"] == rnd(0.5)
    assert entry["runs"][0]["final_best"] == 3.0
    # the verdict is computed again: 6.0 against 10 x the ablation's own random on that seed's starts
    assert entry["verdict"]["finals"] == [3.0, 6.0] and entry["verdict"]["x_random"] == [6.0, round(6.0 / 0.45, 2)]
    assert entry["verdict"]["met"] == [False, True]
    assert entry["runs_note"].startswith("seed 1: batch128, adopted from abl.json") and "the earlier note" in entry["runs_note"]
    assert lines[0] == f"{TASK} seed 1: final best 3.5 -> 6.0 (made at 0123456)"


def test_seed_zero_also_sets_the_tasks_random_and_a_new_seed_adds_a_row() -> None:
    results = suite_results()
    suite_adopt.adopt(results, ablation(run(0, 5.0), run(2, 4.0)), "abl.json", "batch128", read_file_at=then)
    entry = results["tasks"][TASK]
    assert [r["seed"] for r in entry["runs"]] == [0, 1, 2]
    assert entry["random"] == rnd(0.45)  # the task's random is seed 0's starts'
    assert [r["seed"] for r in entry["runs_before_batch128"]] == [0]  # seed 2 had no row to keep


def test_a_run_of_another_experiment_is_refused_naming_the_keys_and_nothing_changes() -> None:
    results = suite_results()
    before = copy.deepcopy(results)
    lr = {"agent.hparams.lr": {"value": 1e-3, "min": 1e-4, "max": 1e-2, "scale": "log"}}
    with pytest.raises(suite_adopt.AdoptError) as err:
        suite_adopt.adopt(results, ablation(run(0, 9.0), overrides=lr), "abl.json", "lr", read_file_at=then)
    message = str(err.value)
    assert "seed 0 is not a run of the file as it is now" in message
    assert "agent.hparams.batch_size.value: 64 -> 128" in message and "agent.hparams.lr.value: 0.001 -> 0.003" in message
    assert results == before


def test_every_commit_of_a_continued_run_is_checked() -> None:
    seen = []

    def file_at(commit: str, path: str) -> str:  # the run began under another learning rate, then went on under 3e-3
        seen.append(commit)
        return FILE_THEN.replace("lr = { value = 3e-3", "lr = { value = 1e-3") if commit == "b" * 16 else FILE_THEN

    results = suite_results()
    with pytest.raises(suite_adopt.AdoptError, match="its file at bbbbbbb .*agent.hparams.lr.value"):
        suite_adopt.adopt(results, ablation(run(1, 6.0, began_at_commit="b" * 16)), "abl.json", "b", read_file_at=file_at)
    assert seen == ["b" * 16]
    seen.clear()
    suite_adopt.adopt(results, ablation(run(1, 6.0, began_at_commit="c" * 16)), "abl.json", "c", read_file_at=file_at)
    assert seen == ["c" * 16, "0123456789abcdef"]


@pytest.mark.parametrize("bad, why", [
    (lambda: ablation(run(1, 6.0, partial=True)), "is partial; finish it"),
    (lambda: ablation(run(1, 6.0), quick=True), "made with --quick"),
    (lambda: {"tasks": {"pong": {"runs": [run(0, 1.0)]}}, "overrides": {}}, "unknown task 'pong'"),
    (lambda: {"tasks": {}, "overrides": {}}, "no runs to adopt"),
])
def test_runs_that_cannot_be_rows_are_refused(bad, why) -> None:
    results = suite_results()
    before = copy.deepcopy(results)
    with pytest.raises(suite_adopt.AdoptError, match=why):
        suite_adopt.adopt(results, bad(), "abl.json", "x", read_file_at=then)
    assert results == before
    with pytest.raises(suite_adopt.AdoptError, match="--label"):
        suite_adopt.adopt(results, ablation(run(1, 6.0)), "abl.json", "two words", read_file_at=then)


def test_without_its_own_random_baseline_the_suites_of_that_seed_stands() -> None:
    results = suite_results()
    abl = ablation(run(1, 6.0))
    del abl["tasks"][TASK]["random_by_seed"]  # files made before runs measured one per seed
    suite_adopt.adopt(results, abl, "abl.json", "x", read_file_at=then)
    assert results["tasks"][TASK]["random_by_seed"]["1"] == rnd(0.4)
    del results["tasks"][TASK]["random_by_seed"]
    with pytest.raises(suite_adopt.AdoptError, match="neither it nor the suite has a random baseline"):
        suite_adopt.adopt(results, ablation(run(2, 6.0)) | {"tasks": {TASK: {"runs": [run(2, 6.0)]}}}, "abl.json", "y",
                          read_file_at=then)


def test_adopting_the_row_again_leaves_it_as_it_is() -> None:
    results = suite_results()
    suite_adopt.adopt(results, ablation(run(1, 6.0)), "abl.json", "x", read_file_at=then)
    once = copy.deepcopy(results)
    lines = suite_adopt.adopt(results, ablation(run(1, 6.0)), "abl.json", "x", read_file_at=then)
    assert results == once and lines == [f"{TASK} seed 1: already the suite's row (the same curve); left as it is"]


def test_the_command_line_checks_writes_and_refuses(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(suite_adopt, "file_at", then)
    out, abl = tmp_path / "suite.json", tmp_path / "abl.json"
    out.write_text(json.dumps(suite_results()))
    abl.write_text(json.dumps(ablation(run(1, 6.0))))
    argv = ["--json", str(out), "--label", "batch128", str(abl)]
    assert suite_adopt.main([*argv, "--dry-run"]) == 0
    assert json.loads(out.read_text()) == suite_results() and "nothing written" in capsys.readouterr().out
    assert suite_adopt.main(argv) == 0
    written = json.loads(out.read_text())["tasks"][TASK]
    assert written["runs"][1]["provenance"]["adopted_from"] == str(abl)
    assert "x random [6.0, 13.33]" in capsys.readouterr().out
    abl.write_text(json.dumps(ablation(run(0, 9.0), overrides={})))  # batch 64: not the file as now
    assert suite_adopt.main(argv) == 2
    assert "agent.hparams.batch_size.value: 64 -> 128" in capsys.readouterr().err
    assert json.loads(out.read_text())["tasks"][TASK] == written


def test_unreadable_input_and_a_file_that_no_longer_parses_are_clear_errors(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "suite.json"
    out.write_text(json.dumps(suite_results()))
    assert suite_adopt.main(["--json", str(out), "--label", "x", str(tmp_path / "missing.json")]) == 2
    assert "missing.json: cannot read it as JSON" in capsys.readouterr().err
    monkeypatch.setattr(suite_adopt, "file_at", lambda commit, path: FILE_THEN.replace("[population]", "[populaton]"))
    abl = tmp_path / "abl.json"
    abl.write_text(json.dumps(ablation(run(1, 6.0))))
    assert suite_adopt.main(["--json", str(out), "--label", "x", str(abl)]) == 2
    assert "does not parse today" in capsys.readouterr().err
    assert json.loads(out.read_text()) == suite_results()


def with_autocast(text: str, mode: str | None) -> str:
    """`text` with its [agent.task] autocast line replaced by `mode` (none when None)."""
    lines = [line for line in text.splitlines() if not line.startswith("autocast =")]
    if mode is not None:
        lines.insert(lines.index("[agent.task]") + 1, f'autocast = "{mode}"')
    return "\n".join(lines) + "\n"


BF16_CPU = {"cpu": {"model": "AMD EPYC", "flags": ["avx2", "avx512f", "avx512_bf16"]}}


def test_a_bf16_run_is_a_run_of_a_file_that_says_auto_where_auto_means_bf16(tmp_path, monkeypatch) -> None:
    """The run's machine decides: "auto" is bf16 for this conv member on a CPU with bf16 instructions only."""
    path = tmp_path / suite.TASKS[TASK]["file"]
    path.parent.mkdir(parents=True)
    path.write_text(with_autocast(FILE_NOW, "auto"))
    monkeypatch.setattr(suite, "ROOT", tmp_path)
    file_then = with_autocast(FILE_THEN, None)
    bf16 = {**OVERRIDES, "agent.task.autocast": "bf16"}
    results = suite_results()
    suite_adopt.adopt(results, ablation(run(1, 6.0), overrides=bf16) | {"machine": BF16_CPU}, "abl.json", "auto",
                      read_file_at=lambda commit, p: file_then)
    evidence = results["tasks"][TASK]["runs"][1]["provenance"]["evidence"]
    assert "its autocast 'bf16' is what the file's 'auto' runs on its machine" in evidence
    before = copy.deepcopy(results)
    avx2 = {"cpu": {"model": "Intel Xeon", "flags": ["avx2", "avx512f"]}}
    for machine in (avx2, None):  # "auto" is off there, or nothing says what the machine was
        abl = ablation(run(2, 6.0), overrides=bf16) | ({"machine": machine} if machine else {})
        with pytest.raises(suite_adopt.AdoptError, match="agent.task.autocast: 'bf16' -> 'auto'"):
            suite_adopt.adopt(results, abl, "abl.json", "auto", read_file_at=lambda commit, p: file_then)
    assert results == before
    # a float32 run is not a run of the "auto" file, even on that machine
    with pytest.raises(suite_adopt.AdoptError, match="agent.task.autocast: '<absent>' -> 'auto'"):
        suite_adopt.adopt(results, ablation(run(2, 6.0)) | {"machine": BF16_CPU}, "abl.json", "auto",
                          read_file_at=lambda commit, p: file_then)


@pytest.mark.parametrize("change, means_bf16", [
    ({}, True),
    ({"agent.arch.variant": "mlp"}, False),
    ({"agent.task.compile": "on"}, False),
    ({"agent.task.dtype": "float64"}, False),
    ({"resources.gpus_per_member": 0.5}, False),
])
def test_auto_means_bf16_only_for_an_eager_float32_conv_member_on_the_cpu(change, means_bf16) -> None:
    experiment = {"agent": {"arch": {"variant": "conv"}, "task": {"autocast": "auto"}}, "resources": {}}
    for key, value in change.items():
        section, *middle, name = key.split(".")
        node = experiment[section]
        for part in middle:
            node = node.setdefault(part, {})
        node[name] = value
    assert suite_adopt.auto_ran_as_bf16(experiment, BF16_CPU) is means_bf16
    assert suite_adopt.auto_ran_as_bf16(experiment, {"cpu": {"flags": ["avx2", "amx_bf16"]}}) is means_bf16
    assert not suite_adopt.auto_ran_as_bf16(experiment, {"cpu": {"flags": ["avx2"]}})
