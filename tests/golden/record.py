"""Run the tiny golden experiments inline and write (or compare) their evaluation tables.

    python -m tests.golden.record            # rewrite tests/golden/*.json
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import tomli_w
import tomllib

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


def run_table(name: str) -> list[dict[str, Any]]:
    """Every generation's evaluations of the tiny run: the numbers a refactor must not change."""
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


def main() -> int:
    for name in (sys.argv[1:] or sorted(TINY)):
        table = run_table(name)
        golden_path(name).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(f"wrote {golden_path(name)} ({len(table)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
