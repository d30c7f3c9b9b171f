"""The real `evo` command end to end: run, leaderboard, lineage, export, agents.load, resume, crashes.

Runs go through the installed `evo` console script in a temp dir; read-only queries of finished
runs call `evo.cli.main` in-process (same code, no interpreter start-up) to keep the suite fast.
Crashes are real SIGKILLs in each window of a generation's commit (evo/runstore.py, EVO_FAULT).
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import tomllib

import agents
from tests.conftest import REPO, TOY_EXPERIMENT, run_evo
from tests.conftest import evo_in_process as evo


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted reference run ("ref", seed 7, inline) that other runs are compared with."""
    cwd = tmp_path_factory.mktemp("cli")
    shutil.copy(TOY_EXPERIMENT, cwd / "toy.toml")
    proc = run_evo(["run", "toy.toml", "--name", "ref", "--backend", "inline"], cwd, check=True)
    assert "generation 3/3" in proc.stdout and "run ref completed" in proc.stdout
    return cwd


def board(cwd: Path, run: str, capsys, monkeypatch) -> list[dict]:
    """The leaderboard as JSON, but the member-seconds of each row's compute: measured, not decided."""
    code, out, err = evo(["leaderboard", run, "--format", "json"], cwd, capsys, monkeypatch)
    assert code == 0, err
    rows = json.loads(out)
    for row in rows:
        if row.get("compute"):
            row["compute"].pop("member_s")
    return rows


def evaluations(run_dir: Path) -> list[tuple]:
    """Every evaluation row but its wall time; `checkpoint` shows which trained states pruning kept."""
    with sqlite3.connect(run_dir / "run.sqlite") as db:
        return db.execute("SELECT generation, idx, fitness, score, history, metrics, hparams, arch, checkpoint, digest "
                          "FROM evaluations ORDER BY generation, idx").fetchall()


def committed(run_dir: Path) -> list[int]:
    with sqlite3.connect(run_dir / "run.sqlite") as db:
        return [g for (g,) in db.execute("SELECT generation FROM generations ORDER BY generation")]


def members_on_disk(run_dir: Path, generation: int, phase: str) -> int:
    folder = run_dir / "checkpoints" / f"g{generation:04d}" / phase
    return len(list(folder.iterdir())) if folder.is_dir() else 0


def test_leaderboard_formats(runs: Path, capsys, monkeypatch) -> None:
    rows = board(runs, "ref", capsys, monkeypatch)
    assert len(rows) == 4 and [r["rank"] for r in rows] == [1, 2, 3, 4]
    assert rows == sorted(rows, key=lambda r: -r["score"])
    assert {"score", "score_std", "fitness", "hparams", "arch", "age", "parent", "last_mutation"} <= set(rows[0])
    code, table, _ = evo(["leaderboard", "ref", "--top", "2"], runs, capsys, monkeypatch)
    assert code == 0 and "rank" in table and "hyperparameters" in table and "±" in table
    code, text, _ = evo(["leaderboard", "ref", "--format", "csv"], runs, capsys, monkeypatch)
    assert [int(r["member"]) for r in csv.DictReader(io.StringIO(text))] == [r["member"] for r in rows]
    code, listing, _ = evo(["runs"], runs, capsys, monkeypatch)
    assert "ref" in listing and "completed" in listing and "3/3" in listing


def test_lineage_walks_back_to_a_founder(runs: Path, capsys, monkeypatch) -> None:
    rows = board(runs, "ref", capsys, monkeypatch)
    child = max(rows, key=lambda r: r["member"])
    assert child["parent"] is not None
    code, text, _ = evo(["lineage", "ref", "--member", str(child["member"])], runs, capsys, monkeypatch)
    assert code == 0
    assert f"member {child['member']:>4}" in text and "founder" in text and "mutation:" in text
    code, _, err = evo(["lineage", "ref", "--member", "999"], runs, capsys, monkeypatch)
    assert code == 2 and "no member 999" in err


def test_export_then_agents_load_without_the_run(runs: Path, capsys, monkeypatch) -> None:
    rows = board(runs, "ref", capsys, monkeypatch)
    out = runs / "exported"
    proc = run_evo(["export", "ref", "--out", str(out)], runs, check=True)  # the real command
    assert f"exported member {rows[0]['member']}" in proc.stdout
    assert (out / "agent" / "tensors.safetensors").is_file() and (out / "README.md").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["info"]["member"] == rows[0]["member"] and config["hparams"] == rows[0]["hparams"]
    moved = runs / "elsewhere"
    shutil.copytree(out, moved)
    shutil.rmtree(out)
    agent = agents.load(moved)  # nothing but the exported directory
    assert agent.index == rows[0]["member"]
    assert agent.evaluate().fitness == pytest.approx(rows[0]["fitness"], abs=1e-7)
    code, _, err = evo(["export", "ref", "--out", str(runs / "o2"), "--member", "12345"], runs, capsys, monkeypatch)
    assert code == 2 and "no such member" in err


def test_same_seed_same_leaderboard_to_the_last_bit(runs: Path, capsys, monkeypatch) -> None:
    run_evo(["run", "toy.toml", "--name", "again", "--backend", "inline"], runs, check=True)
    run_evo(["run", "toy.toml", "--name", "seed8", "--backend", "inline", "--seed", "8", "--generations", "1"], runs, check=True)
    assert evaluations(runs / "runs" / "again") == evaluations(runs / "runs" / "ref")
    assert board(runs, "again", capsys, monkeypatch) == board(runs, "ref", capsys, monkeypatch)
    assert [e[2] for e in evaluations(runs / "runs" / "seed8")] != [e[2] for e in evaluations(runs / "runs" / "ref")[:4]]


# window -> (environment of the killed run, committed generations it leaves, what is on disk then)
CRASH_WINDOWS = {
    # inside the toy agent's 7th train() call (generation 1): nothing of generation 1 is on disk
    "in_train": ({"EVO_TOY_KILL_AT_TRAIN": "7"}, [0], {(1, "trained"): 0, (2, "start"): 0}),
    # generation 1's trained states and generation 2's start states written, not committed
    "after_checkpoints": ({"EVO_FAULT": "after_checkpoints:1"}, [0], {(1, "trained"): 4, (2, "start"): 4}),
    # generation 1 committed; the start states it made obsolete not yet pruned
    "after_commit": ({"EVO_FAULT": "after_commit:1"}, [0, 1], {(1, "start"): 4, (2, "start"): 4}),
}


@pytest.mark.parametrize("window", sorted(CRASH_WINDOWS))
def test_kill_and_resume_loses_and_duplicates_nothing(runs: Path, window: str, capsys, monkeypatch) -> None:
    env, done, on_disk = CRASH_WINDOWS[window]
    name = f"crash{sorted(CRASH_WINDOWS).index(window)}"  # short: `evo runs` may abbreviate long names
    killed = run_evo(["run", "toy.toml", "--name", name, "--backend", "inline"], runs, env=env)
    assert killed.returncode == -9, killed.stderr
    run_dir = runs / "runs" / name
    assert committed(run_dir) == done  # the window was hit: exactly this much is durable ...
    assert {where: members_on_disk(run_dir, *where) for where in on_disk} == on_disk  # ... and this is on disk
    code, listing, _ = evo(["runs"], runs, capsys, monkeypatch)
    assert any(name in line and f"{len(done)}/3" in line for line in listing.splitlines())
    proc = run_evo(["resume", name], runs, check=True)
    assert f"generation {len(done)} of 3" in proc.stdout
    assert evaluations(run_dir) == evaluations(runs / "runs" / "ref")  # each generation once, same numbers
    assert board(runs, name, capsys, monkeypatch) == board(runs, "ref", capsys, monkeypatch)  # same elite


def test_ray_run_killed_before_commit_resumes_to_the_inline_leaderboard(runs: Path, capsys, monkeypatch) -> None:
    """The Ray backend reproduces the inline run (the toy's members share no mutable state), also
    across a SIGKILL of the driver after generation 1's checkpoints were written."""
    killed = run_evo(["run", "toy.toml", "--backend", "ray", "--name", "onray"], runs, timeout=240,
                     env={"EVO_FAULT": "after_checkpoints:1"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    run_dir = runs / "runs" / "onray"
    assert committed(run_dir) == [0] and members_on_disk(run_dir, 1, "trained") == 4
    proc = run_evo(["resume", "onray"], runs, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ray backend" in proc.stdout
    assert evaluations(run_dir) == evaluations(runs / "runs" / "ref")
    out = runs / "from_ray"
    code, _, err = evo(["export", "onray", "--out", str(out)], runs, capsys, monkeypatch)
    assert code == 0, err
    rows = board(runs, "onray", capsys, monkeypatch)
    assert agents.load(out).evaluate().fitness == pytest.approx(rows[0]["fitness"], abs=1e-7)


def test_resume_extends_a_finished_run(runs: Path) -> None:
    run_evo(["run", "toy.toml", "--name", "short", "--generations", "2", "--backend", "inline"], runs, check=True)
    assert "already has 2 of 2" in run_evo(["resume", "short"], runs, check=True).stdout
    run_evo(["resume", "short", "--generations", "3"], runs, check=True)
    assert evaluations(runs / "runs" / "short") == evaluations(runs / "runs" / "ref")


def test_taken_name_gets_a_suffix_and_damaged_checkpoint_is_refused(tmp_path: Path, capsys, monkeypatch) -> None:
    shutil.copy(TOY_EXPERIMENT, tmp_path / "toy.toml")
    for _ in range(2):
        run_evo(["run", "toy.toml", "--generations", "1", "--backend", "inline"], tmp_path, check=True)
    assert (tmp_path / "runs" / "toy").is_dir() and (tmp_path / "runs" / "toy-2").is_dir()
    rows = board(tmp_path, "toy", capsys, monkeypatch)
    f = tmp_path / "runs" / "toy" / "checkpoints" / "g0000" / "trained" / f"m{rows[0]['member']:05d}" / "tensors.safetensors"
    f.write_bytes(f.read_bytes()[:-7])
    proc = run_evo(["export", "toy", "--out", str(tmp_path / "o")], tmp_path)
    assert proc.returncode == 1
    assert "refusing a damaged checkpoint" in proc.stderr and "truncated or altered" in proc.stderr
    assert not (tmp_path / "o" / "config.json").exists()


def test_unknown_run_is_a_usage_error(tmp_path: Path, capsys, monkeypatch) -> None:
    code, _, err = evo(["leaderboard", "nope"], tmp_path, capsys, monkeypatch)
    assert code == 2 and "no run 'nope'" in err


# ---- --set overrides -----------------------------------------------------------------------------
def test_set_overrides_are_typed_validated_recorded_and_resumed(tmp_path: Path, capsys, monkeypatch) -> None:
    shutil.copy(TOY_EXPERIMENT, tmp_path / "toy.toml")
    code, out, err = evo(["run", "toy.toml", "--backend", "inline", "--generations", "1", "--quiet",
                          "--set", "population.size=3", "--set", "agent.hparams.lr.max=0.01",
                          "--set", "mutation.activation_choices=['ReLU', 'Tanh']"], tmp_path, capsys, monkeypatch)
    assert code == 0, err
    rows = board(tmp_path, "toy", capsys, monkeypatch)
    assert len(rows) == 3
    with sqlite3.connect(tmp_path / "runs" / "toy" / "run.sqlite") as db:
        stored = json.loads(db.execute("SELECT value FROM run WHERE key = 'experiment'").fetchone()[0])
    assert stored["population"]["size"] == 3 and stored["agent"]["hparams"]["lr"]["max"] == 0.01
    assert stored["mutation"]["activation_choices"] == ["ReLU", "Tanh"]
    code, out, err = evo(["resume", "toy", "--generations", "2", "--quiet"], tmp_path, capsys, monkeypatch)
    assert code == 0 and "run toy: 2 generations of 3 members" in out, err  # resume runs the stored (overridden) spec
    assert len(board(tmp_path, "toy", capsys, monkeypatch)) == 3


@pytest.mark.parametrize(("setting", "expected"), [
    ("population.size=0", "toy.toml: population.size: expected greater than or equal to 1, found 0 "
                          "(set by the override population.size=0)"),
    ("population.size=many", "toy.toml: population.size: expected a valid integer"),
    ("populaton.size=8", "toy.toml: populaton: unknown field"),
    ("agent.hparams.lr.max=[0.1,", "--set: agent.hparams.lr.max: expected a TOML value"),
    ("agent.hparams.nope=1", "toy.toml: agent.hparams.nope: unknown hyperparameter"),
    ("population.size.x=1", "toy.toml: population.size.x: cannot set a key inside population.size, which is 4"),
    ("population.size", "--set: expected KEY=VALUE"),
])
def test_bad_set_exits_2_naming_the_key_and_creates_nothing(tmp_path: Path, setting: str, expected: str,
                                                           capsys, monkeypatch) -> None:
    shutil.copy(TOY_EXPERIMENT, tmp_path / "toy.toml")
    code, out, err = evo(["run", "toy.toml", "--set", setting], tmp_path, capsys, monkeypatch)
    assert code == 2 and err.startswith(f"evo: {expected}"), err
    assert not (tmp_path / "runs").exists()


# ---- evo new ------------------------------------------------------------------------------------------
TINY_EZ = ["--set", "population.size=2", "--set", "population.steps_per_generation=64", "--set", "agent.task.num_envs=2",
           "--set", "agent.task.eval_episodes=1", "--set", "agent.task.eval_max_steps=50"]


def test_evo_new_env_writes_a_commented_file_that_runs(tmp_path: Path, capsys, monkeypatch) -> None:
    code, text, err = evo(["new", "--env", "CartPole-v1"], tmp_path, capsys, monkeypatch)
    assert code == 0, err
    data = tomllib.loads(text)
    assert data["agent"]["kind"] == "efficientzero" and data["agent"]["task"]["env_id"] == "CartPole-v1"
    assert sum(line.lstrip().startswith("#") or " # " in line for line in text.splitlines()) >= 20  # commented
    (tmp_path / "mine.toml").write_text(text)
    code, out, err = evo(["run", "mine.toml", "--backend", "inline", "--generations", "1", "--quiet", *TINY_EZ],
                         tmp_path, capsys, monkeypatch)
    assert code == 0, err
    assert len(board(tmp_path, data["name"], capsys, monkeypatch)) == 2


def test_evo_new_gives_every_vector_env_the_same_settings_and_stops_at_its_threshold(tmp_path: Path, capsys,
                                                                                       monkeypatch) -> None:
    # issue 23's "works" default: a file made for one task and pointed at another by its env id alone
    # learns there too; so `evo new` differs between tasks in env_id and name only, and stops at the
    # task's own threshold (the budget is sized for the hardest of them)
    files = {}
    for env_id in ("CartPole-v1", "MountainCar-v0", "LunarLander-v3"):
        code, text, err = evo(["new", "--env", env_id], tmp_path, capsys, monkeypatch)
        assert code == 0, err
        files[env_id] = tomllib.loads(text)
    for env_id, data in files.items():
        assert data["population"]["stop_at_score"] == "task" and data["agent"]["task"]["env_id"] == env_id
        del data["name"], data["agent"]["task"]["env_id"]
    assert files["CartPole-v1"] == files["MountainCar-v0"] == files["LunarLander-v3"]


@pytest.mark.parametrize(("args", "expected"), [
    (["--env", "CartPol-v1"], "--env: agent.task.env_id: not a registered gymnasium environment"),
    (["--env", "Pendulum-v1"], "efficientzero needs a discrete action space"),
    (["--env", "CartPole-v1", "--agent", "ilql"], "--agent: agent.kind: expected one of ['efficientzero']"),
    (["--jsonl", "missing.jsonl"], "--jsonl: agent.task.path: no such file: missing.jsonl"),
    (["--jsonl", "bad.jsonl"], "bad.jsonl line 2, segments: expected a non-empty list"),
    (["--jsonl", "good.jsonl", "--pretrained", "nowhere"], "--pretrained: agent.arch.pretrained: expected a local model"),
])
def test_evo_new_refuses_bad_input_with_exit_2_and_writes_nothing(tmp_path: Path, args: list[str], expected: str,
                                                                  capsys, monkeypatch) -> None:
    lines = (REPO / "experiments" / "data" / "wordle_games.jsonl").read_text().splitlines()[:3]
    (tmp_path / "good.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "bad.jsonl").write_text(lines[0] + "\n" + '{"segments": [], "terminal": true}\n')
    code, out, err = evo(["new", *args, "--out", "mine.toml"], tmp_path, capsys, monkeypatch)
    assert code == 2 and err.startswith("evo: ") and expected in err, err
    assert out == "" and not (tmp_path / "mine.toml").exists()
    code, out, err = evo(["new", *args], tmp_path, capsys, monkeypatch)  # to stdout: nothing printed either
    assert code == 2 and out == ""


def test_evo_new_jsonl_runs_and_out_refuses_to_overwrite(tmp_path: Path, capsys, monkeypatch) -> None:
    lines = (REPO / "experiments" / "data" / "wordle_games.jsonl").read_text().splitlines()[:200]
    (tmp_path / "games.jsonl").write_text("\n".join(lines) + "\n")
    code, _, err = evo(["new", "--jsonl", "games.jsonl", "--out", "mine.toml"], tmp_path, capsys, monkeypatch)
    assert code == 0 and "wrote mine.toml" in err
    data = tomllib.loads((tmp_path / "mine.toml").read_text())
    assert data["agent"]["kind"] == "ilql" and data["agent"]["task"]["path"] == "games.jsonl"
    code, _, err = evo(["new", "--jsonl", "games.jsonl", "--out", "mine.toml"], tmp_path, capsys, monkeypatch)
    assert code == 2 and "mine.toml exists" in err
    code, out, err = evo(["run", "mine.toml", "--backend", "inline", "--generations", "1", "--quiet",
                          "--set", "population.size=2", "--set", "population.steps_per_generation=5"],
                         tmp_path, capsys, monkeypatch)
    assert code == 0, err
    assert len(board(tmp_path, "games_ilql", capsys, monkeypatch)) == 2


def test_quiet_hides_hugging_face_loading_bars_that_a_plain_run_shows(tmp_path: Path, capsys, monkeypatch) -> None:
    """ILQL from a pretrained model loads it once per member: transformers draws a "Loading weights"
    progress bar each time. `--quiet` keeps them (and its warnings) off the console."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from agents.ilql.tasks.wordle import write_jsonl

    write_jsonl(tmp_path / "games.jsonl", n_games=30)
    model, eot = tmp_path / "tiny-gpt2", "<|endoftext|>"  # a tiny GPT-2 and its own BPE, as tests/ilql/test_pretrained.py
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator((tmp_path / "games.jsonl").read_text().splitlines(), vocab_size=300, special_tokens=[eot])
    PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=eot, eos_token=eot, unk_token=eot).save_pretrained(model)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=256, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                               eos_token_id=0)).save_pretrained(model)
    code, _, err = evo(["new", "--jsonl", "games.jsonl", "--pretrained", str(model), "--out", "mine.toml"],
                       tmp_path, capsys, monkeypatch)
    assert code == 0, err
    tiny = ["--backend", "inline", "--generations", "1", "--set", "population.size=2",
            "--set", "population.steps_per_generation=2"]
    code, out, err = evo(["run", "mine.toml", "--name", "plain", *tiny], tmp_path, capsys, monkeypatch)
    assert code == 0 and "Loading weights" in err, err  # what a plain run shows (the bar, per member)
    code, out, err = evo(["run", "mine.toml", "--name", "quiet", "--quiet", *tiny], tmp_path, capsys, monkeypatch)
    assert code == 0 and err == "", err
    assert [line.split(":")[0] for line in out.splitlines()] == ["run quiet", "generation 1/1", "run quiet completed"]
