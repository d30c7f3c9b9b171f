"""Run the tiny golden experiments inline and write (or compare) their evaluation tables.

    python -m tests.golden.record            # rewrite tests/golden/*.json

Every golden run happens in a fresh process with the CPU kernels pinned (`PINNED_CPU_ENV`), and a
table matches its recording when every decision is identical — members, lineage, fitness, scores,
hyperparameters, architectures, mutations, evaluation metrics, counts — and the network's training
metrics (losses, gradient norms, mean values) agree to `TRAIN_METRICS_RTOL` (`differences`). Why
not all to the bit: a CI machine is not always the machine that recorded the table, and float
rounding depends on the CPU's instruction set.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import tomli_w
import tomllib

from benchmarks.devices import read_cpuinfo

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

#: small budgets, fixed seed 3, three generations; every mutation kind has a chance
TINY: dict[str, dict[str, dict[str, Any]]] = {
    "cartpole_efficientzero": {
        "": {"seed": 3, "backend": "inline"},
        "population": {"size": 3, "generations": 3, "steps_per_generation": 64},
        "agent.task": {"num_envs": 2, "eval_episodes": 2, "min_replay": 16},
        "agent.hparams": {"batch_size": 32, "num_simulations": {"value": 4, "min": 2, "max": 8, "kind": "int"}},
        "mutation": {"no_mutation": 0.1, "architecture": 0.4, "parameters": 0.2, "rl_hp": 0.3},
        # the file keeps unbeaten members; at this budget most scores tie, so with it nearly every slot
        # would continue unmutated and the recording would exercise almost no mutation
        "selection": {"keep_unbeaten": False},
    },
    "randomwalks_ilql": {
        "": {"seed": 3, "backend": "inline"},
        "population": {"size": 3, "generations": 3, "steps_per_generation": 4},
        "agent.task": {"eval_samples": 2, "eval_bc": False},
        "agent.hparams": {"batch_size": 16},
        "mutation": {"no_mutation": 0.1, "architecture": 0.4, "parameters": 0.2, "rl_hp": 0.3},
    },
}


def tiny_experiment(name: str, directory: Path) -> Path:
    data = tomllib.loads((REPO / "experiments" / f"{name}.toml").read_text())
    for section, values in TINY[name].items():
        target = data
        for part in filter(None, section.split(".")):
            target = target.setdefault(part, {})
        target.update(values)
    path = directory / f"{name}.toml"
    path.write_text(tomli_w.dumps(data))
    return path


#: torch's vectorised kernels (ATen), MKL's BLAS and oneDNN choose their code paths by the CPU (AVX2,
#: AVX-512, AMX), and the float rounding differs between them. Unpinned, the ILQL table recorded on
#: one CI machine decoded differently (3 of 9 fitnesses) on a Sapphire Rapids one; pinned to AVX2,
#: which every x86-64 machine here has, all its decisions matched. Read at import: set before torch
#: loads, so golden runs happen in a child process (`run_table`).
PINNED_CPU_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"}

#: The training metrics that are the network's own numbers (means over a member's updates: losses,
#: gradient norms, mean Q/V/weights, target values) are compared to this relative tolerance, all else
#: (counts of steps, updates and episodes, training returns, every decision) exactly: even pinned,
#: EfficientZero's losses differed by up to 1.9e-3 relative between those two machines (every
#: action, fitness and mutation the same). A change of behaviour shows up in the decisions, or as a
#: loss off by more than 1%.
TRAIN_METRICS_RTOL = 1e-2
ROUNDED_TRAIN_METRICS = ("loss", "grad_norm", "mean_", "target_value")  # name prefixes

#: On another CPU even pinned kernels can round differently enough to move training: on an AMX Xeon the
#: EfficientZero table recorded elsewhere had every decision (fitness, scores, lineage, mutations,
#: evaluation metrics) the same, but losses up to 12% apart and two training returns different. So each
#: recording names its CPU (`RECORDED_ON`), and on another CPU these training numbers are not compared;
#: everything else still is, exactly. A recording with no CPU named is compared in full, as before.
CPU_DEPENDENT_TRAIN_METRICS = ROUNDED_TRAIN_METRICS + ("train_episode_return",)
RECORDED_ON = HERE / "recorded_on.json"


def run_table(name: str) -> list[dict[str, Any]]:
    """Every generation's evaluations of the tiny run, made in a child process with the CPU kernels
    pinned (`PINNED_CPU_ENV`): the numbers a refactor must not change."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "table.json"
        env = {**os.environ, **PINNED_CPU_ENV,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        child = subprocess.run([sys.executable, "-m", "tests.golden.record", "--table", name, str(out)], cwd=REPO,
                               env=env, capture_output=True, text=True, timeout=900)
        if child.returncode != 0:
            raise RuntimeError(f"golden run {name} exited {child.returncode}:\n{child.stderr[-3000:]}")
        return json.loads(out.read_text())


def _run_table_here(name: str) -> list[dict[str, Any]]:
    from evo.cli import main
    from evo.runstore import RunStore

    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_experiment(name, Path(tmp))
        code = main(["run", str(path), "--runs-dir", str(Path(tmp) / "runs")])
        if code != 0:
            raise RuntimeError(f"golden run {name} exited {code}")
        store = RunStore.open(name, Path(tmp) / "runs")
        try:
            return evaluation_table(store)
        finally:
            store.close()


def evaluation_table(store: Any) -> list[dict[str, Any]]:
    """A run store's evaluations, every generation, as the golden files hold them (JSON-normalised)."""
    rows = []
    for generation in range(store.last_completed_generation() + 1):
        for ev in store.evaluations(generation):
            rows.append({
                "generation": generation, "index": ev["index"], "parent": ev["parent"],
                "born": ev["born"], "fitness": ev["fitness"], "score": ev["score"],
                "history": ev["history"], "hparams": ev["hparams"], "arch": ev["arch"],
                "mutation_kind": (ev["mutation"] or {}).get("kind"),
                "metrics": _untimed(ev["metrics"]), "train_metrics": _untimed(ev["train_metrics"]),
            })
    return json.loads(json.dumps(rows))


def _untimed(metrics: dict[str, float]) -> dict[str, float]:
    """Metrics without wall-clock ones (those differ between any two runs)."""
    return {k: v for k, v in metrics.items() if "second" not in k and not k.endswith(("_s", "per_s"))}


def golden_path(name: str) -> Path:
    return HERE / f"{name}.json"


def recorded_on_this_cpu(name: str) -> bool:
    """Whether `name`'s recording was made on this machine's CPU (True when the recording names none)."""
    recorded = json.loads(RECORDED_ON.read_text()).get(name) if RECORDED_ON.exists() else None
    return recorded is None or recorded == read_cpuinfo()


def differences(recorded: list[dict[str, Any]], table: list[dict[str, Any]], same_cpu: bool = True) -> list[str]:
    """How `table` departs from the `recorded` one: any field that differs, except the network's
    training metrics (ROUNDED_TRAIN_METRICS) within TRAIN_METRICS_RTOL, and, when not `same_cpu`, the
    CPU-dependent training numbers (CPU_DEPENDENT_TRAIN_METRICS) at all. Empty when they match."""
    if len(recorded) != len(table):
        return [f"{len(table)} evaluations, recorded {len(recorded)}"]
    found = []
    for row, (old, new) in enumerate(zip(recorded, table)):
        where = f"row {row} (generation {old.get('generation')}, member {old.get('index')})"
        for key in sorted(set(old) | set(new)):
            a, b = old.get(key), new.get(key)
            if key == "train_metrics" and isinstance(a, dict) and isinstance(b, dict):
                found += [f"{where} train_metrics.{m}: recorded {a.get(m)!r}, now {b.get(m)!r}"
                          for m in sorted(set(a) | set(b)) if not _close(m, a.get(m), b.get(m))
                          and (same_cpu or not m.startswith(CPU_DEPENDENT_TRAIN_METRICS))]
            elif a != b:
                found.append(f"{where} {key}: recorded {a!r}, now {b!r}")
    return found


def _close(name: str, a: Any, b: Any) -> bool:
    if name.startswith(ROUNDED_TRAIN_METRICS) and isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=TRAIN_METRICS_RTOL, abs_tol=1e-9)
    return a == b


def main() -> int:
    if sys.argv[1:2] == ["--table"]:  # the child process of `run_table`
        name, out = sys.argv[2:4]
        Path(out).write_text(json.dumps(_run_table_here(name)))
        return 0
    for name in (sys.argv[1:] or sorted(TINY)):
        table = run_table(name)
        golden_path(name).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        cpus = json.loads(RECORDED_ON.read_text()) if RECORDED_ON.exists() else {}
        RECORDED_ON.write_text(json.dumps({**cpus, name: read_cpuinfo()}, indent=1, sort_keys=True) + "\n")
        print(f"wrote {golden_path(name)} ({len(table)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
