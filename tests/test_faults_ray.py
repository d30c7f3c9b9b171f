"""Faults with real processes and a real local Ray (docs/faults.md), through the real `evo` command.

* a member worker killed with SIGKILL mid-generation: the member is retried, the run completes with
  every generation evaluated exactly once, and — EfficientZero writing the shared replay store —
  the leaderboard and the store's insert counts equal the inline run's (nothing double-counted);
* SIGINT: status `interrupted`, exit 130, no Ray process of the run left; the driver killed with
  SIGKILL: no Ray process of the run left after a short grace; `evo resume` then completes with
  no generation missing or duplicated;
* `gpus_per_member = 1` on a CPU-only machine: exit 2 within seconds, nothing left "running";
* same seed, same leaderboard inline and on Ray with 1 and 2 workers (EfficientZero).

Which processes belong to a run: every process of the local cluster `evo run` starts carries
EVO_RAY_OWNER=<driver pid>-… in its environment (evo.scheduler.cluster); member workers are titled
`ray::_MemberWorker.run` while they train.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from evo.cli import main
from tests.conftest import REPO, TOY_EXPERIMENT, evo_command
from tests.golden.record import _untimed, tiny_experiment

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")


# ---- watching a run from outside ---------------------------------------------------------------
def session_pids(driver: int) -> list[int]:
    """Live processes of the local Ray cluster started by `evo` process `driver`."""
    needle = f"EVO_RAY_OWNER={driver}-".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def training_workers(driver: int) -> list[int]:
    out = []
    for pid in session_pids(driver):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::_MemberWorker.run"):
                out.append(pid)
        except OSError:
            pass
    return out


class EvoProcess:
    """The real `evo` command running in the background, its output in a file (never a pipe that
    a chatty run could fill and block on)."""

    def __init__(self, args: list[str], cwd: Path, log: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               "RAY_AUTH_MODE": "disabled"}
        self.log = cwd / log
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([*evo_command(), *args], cwd=cwd, env=env, stdout=out,
                                         stderr=subprocess.STDOUT)
        self.pid = self.proc.pid

    def tail(self) -> str:
        return self.log.read_text()[-3000:]

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"evo did not finish within {timeout:.0f} s:\n{self.tail()}") from None


def wait_until(predicate, timeout: float, what: str, run: EvoProcess | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if run is not None and run.proc.poll() is not None:
            raise AssertionError(f"evo exited {run.proc.returncode} while waiting for {what}:\n{run.tail()}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}" + (f":\n{run.tail()}" if run else ""))


def generations_done(run_dir: Path) -> int:
    try:
        with sqlite3.connect(f"{(run_dir / 'run.sqlite').as_uri()}?mode=ro", uri=True, timeout=1) as db:
            return int(db.execute("SELECT COUNT(*) FROM generations").fetchone()[0])
    except sqlite3.Error:
        return 0


def status(run_dir: Path) -> str:
    with sqlite3.connect(run_dir / "run.sqlite") as db:
        return db.execute("SELECT value FROM run WHERE key = 'status'").fetchone()[0]


def table(run_dir: Path) -> list[tuple]:
    """Every generation's evaluations, without wall-clock numbers: what must match between runs."""
    with sqlite3.connect(run_dir / "run.sqlite") as db:
        rows = db.execute("SELECT generation, idx, fitness, score, history, hparams, arch, metrics, train_metrics "
                          "FROM evaluations ORDER BY generation, idx").fetchall()
    return [(*r[:7], _untimed(json.loads(r[7])), _untimed(json.loads(r[8]))) for r in rows]


def failures(run_dir: Path) -> list[tuple]:
    with sqlite3.connect(run_dir / "run.sqlite") as db:
        return db.execute("SELECT generation, idx, attempt, kind, retried FROM failures "
                          "ORDER BY generation, idx, attempt").fetchall()


def replay_counts(run_dir: Path, generation: int) -> dict[str, Any]:
    """The shared store as the run snapshotted it after `generation`: its insert counters and refcounts."""
    import numpy as np

    from evo.replay import ReplayStore

    store = ReplayStore.restore(run_dir / "replay" / f"g{generation:04d}")
    stats = {k: v for k, v in store.stats().items() if k != "samples"}  # reads of killed attempts count samples
    return {**stats, "refcounts": np.asarray(store._index.refcount).tolist()}


def evo_inline(args: list[str], cwd: Path, monkeypatch) -> int:
    monkeypatch.chdir(cwd)
    return main([*args, "--backend", "inline"])


# ---- experiments -------------------------------------------------------------------------------
def efficientzero(directory: Path, generations: int = 2, workers: int = 2) -> Path:
    """The golden tiny EfficientZero run (3 members), `generations` long, on `workers` Ray workers."""
    path = tiny_experiment("cartpole_efficientzero", directory)
    text = path.read_text().replace("generations = 3", f"generations = {generations}")
    text = text.replace('backend = "inline"', 'backend = "ray"')
    text += f"\n[resources]\nnum_workers = {workers}\n" if "[resources]" not in text else ""
    text = text.replace("num_workers = 2", f"num_workers = {workers}")
    path.write_text(text)
    return path


def randomwalks(directory: Path, generations: int = 2) -> Path:
    path = tiny_experiment("randomwalks_ilql", directory)
    text = path.read_text().replace("generations = 3", f"generations = {generations}")
    path.write_text(text.replace('backend = "inline"', 'backend = "ray"'))
    return path


def toy(directory: Path, train_sleep_s: float = 0.0) -> Path:
    """The toy experiment (4 members, 3 generations, 2 workers) with FaultyToyAgent; sleeping in
    train makes "mid-generation" a wide window, and changes no number."""
    text = TOY_EXPERIMENT.read_text().replace('kind = "tests.toy_agent:ToyAgent"', 'kind = "tests.fault_agents:FaultyToyAgent"')
    text = text.replace("n_val = 128\n", f"n_val = 128\ntrain_sleep_s = {train_sleep_s}\n")
    path = directory / "toy.toml"
    path.write_text(text.replace('backend = "inline"', 'backend = "ray"'))
    return path


# ---- a worker killed mid-generation --------------------------------------------------------------
def kill_a_worker_mid_generation(cwd: Path, experiment: Path, name: str) -> Path:
    run = EvoProcess(["run", experiment.name, "--name", name], cwd, f"{name}.log")
    victim = wait_until(lambda: training_workers(run.pid), 240, "a member worker training", run)[0]
    os.kill(victim, signal.SIGKILL)
    assert run.wait(400) == 0, run.tail()
    return cwd / "runs" / name


@pytest.mark.parametrize("agent", ["efficientzero", pytest.param("ilql", marks=pytest.mark.slow)])
def test_a_killed_worker_is_retried_and_nothing_is_lost_or_counted_twice(agent: str, tmp_path: Path, monkeypatch) -> None:
    experiment = efficientzero(tmp_path) if agent == "efficientzero" else randomwalks(tmp_path)
    assert evo_inline(["run", experiment.name, "--name", "inline"], tmp_path, monkeypatch) == 0
    killed = kill_a_worker_mid_generation(tmp_path, experiment, "killed")
    lost = [f for f in failures(killed) if f[3] == "lost"]
    assert lost and all(f[4] == 1 for f in lost), failures(killed)  # recorded, and retried
    # every generation's evaluations exactly once, and the very numbers of the uninterrupted inline run
    assert table(killed) == table(tmp_path / "runs" / "inline")
    if agent == "efficientzero":  # members wrote the shared store: the killed attempt's rows never arrived
        assert replay_counts(killed, 1) == replay_counts(tmp_path / "runs" / "inline", 1)


# ---- Ctrl-C, then the driver killed, then resumed -------------------------------------------------
def interrupt_kill_resume(cwd: Path, experiment: Path, reference: Path, name: str) -> None:
    run = EvoProcess(["run", experiment.name, "--name", name], cwd, f"{name}-1.log")
    run_dir = cwd / "runs" / name
    wait_until(lambda: generations_done(run_dir) >= 1 and training_workers(run.pid), 300, "generation 1 training", run)
    os.kill(run.pid, signal.SIGINT)
    t0 = time.monotonic()
    assert run.wait(60) == 130, run.tail()
    assert time.monotonic() - t0 < 30, "Ctrl-C must stop the run within seconds"
    assert status(run_dir) == "interrupted" and "evo resume chaos" in run.tail()
    wait_until(lambda: not session_pids(run.pid), 20, "the interrupted run's Ray processes to exit")

    run = EvoProcess(["resume", name], cwd, f"{name}-2.log")
    done = generations_done(run_dir)
    wait_until(lambda: training_workers(run.pid), 300, "the resumed run training", run)
    os.kill(run.pid, signal.SIGKILL)
    run.proc.wait()
    # the watchdog ends the local cluster with its driver: nothing of that session survives
    wait_until(lambda: not session_pids(run.pid), 20, "no Ray process of the SIGKILLed run")
    assert generations_done(run_dir) <= done + 1

    run = EvoProcess(["resume", name], cwd, f"{name}-3.log")
    assert run.wait(400) == 0, run.tail()
    assert status(run_dir) == "completed"
    assert table(run_dir) == table(reference)  # no generation missing, none twice, same numbers


@pytest.mark.parametrize("agent", ["toy", pytest.param("efficientzero", marks=pytest.mark.slow),
                                   pytest.param("ilql", marks=pytest.mark.slow)])
def test_interrupt_then_driver_killed_then_resume(agent: str, tmp_path: Path, monkeypatch) -> None:
    if agent == "toy":
        toy(tmp_path)
        assert evo_inline(["run", "toy.toml", "--name", "reference"], tmp_path, monkeypatch) == 0
        experiment = toy(tmp_path, train_sleep_s=2.0)  # the same numbers, slower
    else:
        experiment = efficientzero(tmp_path, generations=3) if agent == "efficientzero" else randomwalks(tmp_path, 3)
        assert evo_inline(["run", experiment.name, "--name", "reference"], tmp_path, monkeypatch) == 0
    interrupt_kill_resume(tmp_path, experiment, tmp_path / "runs" / "reference", "chaos")


# ---- resources ----------------------------------------------------------------------------------
def test_a_gpu_request_on_a_cpu_only_machine_fails_fast(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    text = toy(tmp_path).read_text().replace("num_workers = 2", "num_workers = 2\ngpus_per_member = 1")
    (tmp_path / "toy.toml").write_text(text)
    t0 = time.monotonic()
    run = EvoProcess(["run", "toy.toml", "--name", "gpu"], tmp_path, "gpu.log")
    assert run.wait(60) == 2 and time.monotonic() - t0 < 30, run.tail()
    log = run.tail()
    assert "resources.gpus_per_member" in log and "asked for 1 GPU per member" in log and "no GPU" in log
    assert not (tmp_path / "runs" / "gpu").exists()  # nothing left that `evo runs` would call running


# ---- same seed, same leaderboard: inline, Ray x1, Ray x2 ------------------------------------------------
@pytest.mark.slow
def test_efficientzero_leaderboard_is_the_same_inline_and_on_one_or_two_workers(tmp_path: Path, monkeypatch) -> None:
    efficientzero(tmp_path)
    assert evo_inline(["run", "cartpole_efficientzero.toml", "--name", "inline"], tmp_path, monkeypatch) == 0
    for workers in (1, 2):
        efficientzero(tmp_path, workers=workers)
        run = EvoProcess(["run", "cartpole_efficientzero.toml", "--name", f"ray{workers}"], tmp_path, f"ray{workers}.log")
        assert run.wait(400) == 0, run.tail()
        assert table(tmp_path / "runs" / f"ray{workers}") == table(tmp_path / "runs" / "inline")
        assert replay_counts(tmp_path / "runs" / f"ray{workers}", 1) == replay_counts(tmp_path / "runs" / "inline", 1)
