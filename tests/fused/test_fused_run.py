"""A run with `resources.fused = true` gives the leaderboard the unfused run gives (float64):
same members, parents, fitness, scores, hyperparameters and architectures every generation, and
loss metrics equal to rounding. Members that share an architecture train as one fused group; a
member whose architecture mutated trains alone. On Ray, an actor trains a chunk of a group fused
(evo.fused.remote) and the leaderboard is the inline one."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import tomli_w
import tomllib

from tests.golden.record import REPO, TINY


@functools.cache
def leaderboard(fused: bool, backend: str = "inline") -> list[dict]:
    from evo.cli import main
    from evo.runstore import RunStore

    data = tomllib.loads((REPO / "experiments" / "cartpole_efficientzero.toml").read_text())
    for section, values in TINY["cartpole_efficientzero"].items():
        target = data
        for part in filter(None, section.split(".")):
            target = target.setdefault(part, {})
        target.update(values)
    data["population"].update({"size": 3, "generations": 2, "steps_per_generation": 64})
    data["agent"]["task"].update({"dtype": "float64", "segment_length": 16})
    data.setdefault("resources", {}).update({"fused": fused, "cpus_per_member": 1})
    data["backend"] = backend
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.toml"
        path.write_text(tomli_w.dumps(data))
        assert main(["run", str(path), "--runs-dir", str(Path(tmp) / "runs")]) == 0
        store = RunStore.open(data["name"], Path(tmp) / "runs")
        rows = [dict(ev, generation=g) for g in range(store.last_completed_generation() + 1) for ev in store.evaluations(g)]
        store.close()
    return rows


def same_leaderboard(loop: list[dict], fused: list[dict]) -> None:
    assert len(loop) == len(fused) == 6
    sizes = [ev["train_metrics"].get("fused_group_size", 1.0) for ev in fused]
    assert max(sizes) >= 2  # some members really trained fused
    for a, b in zip(loop, fused):
        for key in ("generation", "index", "parent", "fitness", "score", "history", "hparams", "arch"):
            assert json.dumps(a[key], sort_keys=True) == json.dumps(b[key], sort_keys=True), key
        for name, value in a["train_metrics"].items():
            if "loss" in name:
                assert abs(value - b["train_metrics"][name]) < 1e-8, name


def test_fused_run_gives_the_unfused_leaderboard_f64() -> None:
    same_leaderboard(leaderboard(False), leaderboard(True))


def test_fused_on_ray_gives_the_inline_leaderboard_f64(ray_cluster) -> None:
    """2 actors, 3 members of one architecture in generation 0: one actor trains two of them fused,
    the other the third alone; every member ends as the inline fused run has it."""
    ray_run = leaderboard(True, "ray")
    same_leaderboard(leaderboard(True), ray_run)
    assert [ev["train_metrics"].get("fused_group_size", 1.0) for ev in ray_run[:3]].count(2.0) == 2
