"""AgileRL in a virtual environment of its own, made on first use, and its runner as a subprocess.

AgileRL 2.58 pins versions of several packages evo also uses, so it never shares evo's
environment: `ensure_venv` makes `.venv-agilerl/` (git-ignored) with `python -m venv`, installs
the CPU torch first (the local 2.13 wheel, within evo's own torch bound), then `agilerl==2.58` and
`peft` (AgileRL 2.58 imports peft at import time but declares it only in its `all` extra), and
the Box2D wheel with pygame (LunarLander-v3 for benchmarks.suite; AgileRL's own box2d extra pins
box2d-py, which needs swig to build — the same choice as evo's `envs` extra) and minatar (the suite's
MinAtar games).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.hpo.common import ROOT, Task

VENV = ROOT / ".venv-agilerl"
RUNNER = Path(__file__).with_name("agilerl_runner.py")
PACKAGES = [["torch>=2.4,<2.14"], ["agilerl==2.58", "peft==0.21.0", "box2d>=2.3.10", "pygame>=2.1", "minatar>=1.0.15"]]
# evo steps per member between AgileRL's evolution steps: one evo generation (a multiple of its 16 envs)
NUM_ENVS = 16


def python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv(log: Any = sys.stderr) -> Path:
    """AgileRL's venv, made (minutes, once) if it is missing or lacks agilerl, Box2D or MinAtar."""
    check = [str(python()), "-c", "import agilerl.training.train_off_policy, Box2D, minatar"]
    if python().exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python()
    print(f"creating {VENV} for AgileRL (once; a few minutes)", file=log, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    for group in PACKAGES:  # torch first, so agilerl's resolver keeps the CPU build
        subprocess.run([str(python()), "-m", "pip", "install", "-q", *group], check=True)
    subprocess.run(check, check=True)
    return python()


def run(t: Task, seed: int) -> dict[str, Any]:
    if t.name != "cartpole":
        raise ValueError("AgileRL runs on CartPole only (its DQN is an online agent; randomwalks is offline)")
    if t.steps_per_generation % NUM_ENVS:
        raise ValueError(f"steps per generation must be a multiple of AgileRL's {NUM_ENVS} envs")
    exe = ensure_venv()
    with tempfile.TemporaryDirectory(prefix="agilerl-hpo-") as tmp:
        out = Path(tmp) / "curve.json"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["WANDB_MODE"] = "disabled"
        proc = subprocess.run([str(exe), str(RUNNER), "--seed", str(seed), "--budget", str(t.budget),
                               "--evo-steps", str(t.steps_per_generation), "--out", str(out)],
                              cwd=tmp, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"AgileRL runner failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        result = json.loads(out.read_text())
    result["used"] = {"algorithm": "DQN (AgileRL)", "hpo": "AgileRL evolutionary HPO: tournament selection + mutations",
                      "config": "shipped configs/training/dqn/dqn.yaml, ENV_NAME CartPole-v1, EVO_STEPS = one evo "
                                "generation per member, no TARGET_SCORE early stop, no W&B",
                      "shared_replay": True, **result.pop("settings", {})}
    return result
