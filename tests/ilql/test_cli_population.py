"""A tiny ILQL population on randomwalks through the real `evo` command, then export of the elite."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_evo

EXPERIMENT = """
name = "rw_tiny"
seed = 0
backend = "inline"

[population]
size = 2
generations = 2
steps_per_generation = 30

[agent]
kind = "ilql"

[agent.task]
task = "randomwalks"
eval_samples = 1

[agent.arch]
n_layer = 1
n_embd = 32
n_head = 2
dim_feedfwd = 64
min_layers = 1
max_layers = 2

[agent.hparams]
lr = { value = 1e-3, min = 1e-4, max = 5e-3, scale = "log" }
batch_size = 32
inference_beta = { value = 10.0, min = 1.0, max = 100.0, scale = "log" }

[selection]
tournament_size = 2
elitism = true

[mutation]
no_mutation = 0.0
architecture = 0.5
new_layer = 0.5
parameters = 0.0
activation = 0.25
activation_choices = ["GELU", "ReLU"]
rl_hp = 0.25
"""


def test_randomwalks_population_runs_and_exports(tmp_path: Path) -> None:
    (tmp_path / "rw.toml").write_text(EXPERIMENT)
    env = {"OMP_NUM_THREADS": "1"}
    proc = run_evo(["run", "rw.toml"], tmp_path, env=env, check=True)
    assert "generation 2/2" in proc.stdout and "completed" in proc.stdout
    proc = run_evo(["export", "rw_tiny", "--out", "elite"], tmp_path, env=env, check=True)
    assert (tmp_path / "elite" / "hf" / "config.json").is_file()
    assert (tmp_path / "elite" / "hf" / "tokenizer.json").is_file()
