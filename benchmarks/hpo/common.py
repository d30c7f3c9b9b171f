"""What every strategy of the HPO benchmark shares: the task, the budget, the founders, the curve.

Budget unit: the `steps` argument of `Agent.train` — environment steps for EfficientZero on
CartPole (every member's training interactions, summed over the population), gradient updates for
ILQL on randomwalks. Fitness evaluations are not in the budget (for any strategy); their time is in
the wall clock of the strategies that evaluate to select (all of them do).
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Task:
    name: str
    experiment: str            # the evo experiment file (agent, task, arch, search space, selection, mutation)
    target: float              # CartPole: mean return over 10 evaluation episodes; randomwalks: optimality
    unit: str                  # what one budget step is
    population: int
    generations: int           # curve points; also PBT's perturbations and AgileRL's evolution steps
    steps_per_generation: int  # per member
    settings: tuple[tuple[str, Any], ...] = ()  # experiment settings the task changes in its file (dotted keys)
    best_possible: float | None = None  # the highest fitness there is (CartPole-v1: 500 steps; optimality: 1)

    @property
    def budget(self) -> int:
        """Total steps of all members together."""
        return self.population * self.generations * self.steps_per_generation

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "settings": dict(self.settings), "budget": self.budget}


def task(name: str, quick: bool) -> Task:
    if name == "cartpole":
        # full: the main experiment's 4 × 6 × 2000; quick: 4 × 2 × 256
        return Task("cartpole", "experiments/cartpole_efficientzero.toml", 475.0, "env steps", 4,
                    2 if quick else 6, 256 if quick else 2000, best_possible=500.0)
    if name == "randomwalks":
        return Task("randomwalks", "experiments/randomwalks_ilql.toml", 0.9, "gradient updates", 4,
                    2 if quick else 5, 50 if quick else 200, best_possible=1.0)
    if name == "randomwalks-sparse":
        # randomwalks on a larger, sparser graph whose data rarely reach the goal (41 nodes, edge p 0.06,
        # walks <= 15 nodes: 5% of the 1000 walks reach it, data optimality 0.05 against 0.35 on the
        # 21-node graph). Every founder set solves the 21-node graph within the budget, so no search can
        # lead there; here founders drawn from the same ranges ended at 0.08-0.41 (peaks up to 0.57; the
        # four founders of seeds 0 and 1, each trained alone for a quarter of the budget), so the
        # hyperparameters found decide the score. Target: half-optimal walks, 10x the data's
        return Task("randomwalks-sparse", "experiments/randomwalks_ilql.toml", 0.5, "gradient updates", 4,
                    2 if quick else 5, 50 if quick else 200,
                    (("agent.task.n_nodes", 41), ("agent.task.p_edge", 0.06), ("agent.task.max_length", 15)),
                    best_possible=1.0)
    raise ValueError(f"--task: expected one of {list(TASKS)}, found {name!r}")


TASKS = ("cartpole", "randomwalks", "randomwalks-sparse")


REGIMES = {"tuned": "sample", "scratch": "scratch"}  # --regime -> population.initial


def load(t: Task, seed: int, regime: str = "tuned", **overrides: Any):
    """The task's experiment with the benchmark's seed, budget and founders (see `founders`): in the
    "tuned" regime member 0 starts from the file's tuned values, in "scratch" every founder is drawn."""
    from evo.spec import load_experiment

    exp, text = load_experiment(ROOT / t.experiment, {
        "seed": seed, "population.size": t.population, "population.generations": t.generations,
        "population.steps_per_generation": t.steps_per_generation, "population.initial": REGIMES[regime],
        **dict(t.settings), **overrides})
    return exp, text


def search_space(exp) -> dict[str, Any]:
    """The mutable hyperparameters of the experiment (name → HParam): the one space every strategy searches."""
    return {name: hp for name, hp in exp.hparam_space.items() if hp.mutable}


def founders(exp) -> list[dict[str, Any]]:
    """The starting hyperparameters of each member, exactly as evo's `initial_population` draws them with
    `population.initial = "sample"` (member 0 the file's values, the others sampled from the ranges)
    or "scratch" (all sampled). Random search, PBT and PB2 start from these same members."""
    out = []
    for index in range(exp.population.size):
        values = {name: hp.value for name, hp in exp.hparam_space.items()}
        if index > 0 or exp.population.initial == "scratch":
            rng = np.random.default_rng(np.random.SeedSequence([exp.seed, index, 0x1417]))
            values.update({name: hp.sample(rng) for name, hp in exp.hparam_space.items() if hp.mutable})
        out.append(values)
    return out


def summarise(curve: list[list[float]], target: float) -> dict[str, Any]:
    """steps_to_target / seconds_to_target (first curve point at or above the target; None if never),
    final_best (the best member's evaluation at the end of the budget), peak_best."""
    hit = next((p for p in curve if p[2] >= target), None)
    return {"steps_to_target": hit[0] if hit else None, "seconds_to_target": hit[1] if hit else None,
            "final_best": curve[-1][2] if curve else None, "peak_best": max((p[2] for p in curve), default=None)}


def machine() -> dict[str, Any]:
    import importlib.metadata as md

    def version(name: str) -> str | None:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    from benchmarks.devices import cpu_description  # here, not at the top: it imports torch, which this module does not

    return {"cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "cpu": cpu_description(), "python": platform.python_version(), "loadavg_at_start": list(os.getloadavg()),
            "versions": {k: version(k) for k in ("torch", "ray", "gymnasium", "numpy", "GPy", "scikit-learn")}}
