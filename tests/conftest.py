"""Shared fixtures: the real `evo` command in a temp dir, and GPU tests that skip without CUDA."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOY_EXPERIMENT = REPO / "tests" / "experiments" / "toy.toml"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch is a hard dependency
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def evo_command() -> list[str]:
    exe = Path(sys.executable).parent / "evo"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "evo.cli"]


def run_evo(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300,
            check: bool = False) -> subprocess.CompletedProcess:
    """Run the real `evo` console script in `cwd`; the repo is on PYTHONPATH so test agents import."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                "RAY_AUTH_MODE": "disabled", **(env or {})}
    proc = subprocess.run([*evo_command(), *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"evo {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def evo_in_process(args: list[str], cwd: Path, capsys: pytest.CaptureFixture,
                   monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """`evo ARGS` in this process from `cwd` (the same code as the console script, without an
    interpreter start-up): (exit code, stdout, stderr)."""
    from evo.cli import main

    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def evolve_toy(runs_dir: Path, overrides: dict, name: str = "r", backend: str = "inline"):
    """The toy experiment with `overrides`, evolved in this process to its end in a new run store
    under `runs_dir` (no CLI): the store, for tests of the engine's loop itself."""
    from evo.population import evolve, start_backend
    from evo.runstore import RunStore
    from evo.spec import load_experiment

    exp, text = load_experiment(TOY_EXPERIMENT, overrides)
    store = RunStore.create(runs_dir, name, text, exp.to_json())
    scheduler, context = start_backend(exp, backend)
    try:
        evolve(exp, store, scheduler, context)
    finally:
        scheduler.close()
    return store


def small_cartpole_truncation_run(cwd: Path, seed: int, selection: dict | None = None, replay: dict | None = None) -> None:
    """The real `evo run` of the shipped CartPole EfficientZero file, shrunk (3 members × 2 generations
    of 160 steps, inline, truncation selection) with `selection` and `replay` settings added, then
    `evo resume` to a third generation: the run store is `cwd`/runs/cartpole_efficientzero."""
    import tomli_w
    import tomllib

    data = tomllib.loads((REPO / "experiments" / "cartpole_efficientzero.toml").read_text())
    data["population"].update({"size": 3, "generations": 2, "steps_per_generation": 160})
    data["agent"]["task"].update({"num_envs": 2, "eval_episodes": 4, "min_replay": 16})
    data["agent"]["hparams"].update({"batch_size": 32, "num_simulations": {"value": 4, "min": 2, "max": 8, "kind": "int"}})
    data["selection"] = {**data.get("selection", {}), "truncation": 1, "keep_unbeaten": False, "founder_lines": 0,
                         "replace_worst": 0, **(selection or {})}
    if replay:
        data["replay"] = dict(replay)
    data["backend"] = "inline"
    (cwd / "cartpole_efficientzero.toml").write_text(tomli_w.dumps(data))
    for args in (["run", "cartpole_efficientzero.toml", "--seed", str(seed)],
                 ["resume", "cartpole_efficientzero", "--generations", "3"]):
        proc = run_evo(args, cwd, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    shutil.copy(TOY_EXPERIMENT, tmp_path / "toy.toml")
    return tmp_path


@pytest.fixture(scope="session")
def toy_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs directory holding one finished tiny run, "toy" (tests/experiments/toy.toml: 3 generations
    of 4 members, inline), made once by the real `evo run` and shared by read-only tests."""
    cwd = tmp_path_factory.mktemp("toy_runs")
    shutil.copy(TOY_EXPERIMENT, cwd / "toy.toml")
    run_evo(["run", "toy.toml", "--backend", "inline", "--quiet"], cwd, check=True)
    return cwd / "runs"


@pytest.fixture(scope="module")
def ray_cluster():
    """A local 2-CPU Ray for one test module (starting Ray costs seconds: share it), shut down after."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024**2, log_to_driver=False,
             configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def one_torch_thread():
    """torch on one intra-op thread for the test: 2 threads on this 2-core machine stall tiny ops (DESIGN.md)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

