"""Random search, PBT and PB2: the same agent as a Ray Tune trainable, with Tune's own schedulers.

Every trial is one member: the task's agent (same architecture, task and search space as evo's
run) built from a founder's hyperparameters (`common.founders`, the members evo starts from), with
a replay store of its own (no sharing between trials). One `step()` is one evo generation's worth
of training (`train(steps_per_generation)`) followed by the agent's own evaluation (the same
10-episode evaluation evo selects by), so PBT's `perturbation_interval = 1` iteration is one evo
generation. A checkpoint is the agent's state (`get_state`) plus a snapshot of its replay store:
when PBT/PB2 exploits, the trial continues as a whole copy of the donor, data included.

* random search: FIFO, no perturbation; 4 trials from the founders (member 0 the file's values,
  the others sampled from the ranges), each trained on its own for the whole budget;
* PBT: `PopulationBasedTraining` with its documented defaults (quantile_fraction 0.25,
  resample_probability 0.25, perturbation_factors (1.2, 0.8)), `hyperparam_mutations` = the same
  ranges (log-uniform where evo's are log scale); values outside a range are clipped and ints
  rounded by the trainable;
* PB2: `PB2` (GP bandit, needs GPy and scikit-learn) with `hyperparam_bounds` = the same ranges.

All trials run at once (0.5 CPU each, 4 trials on the 2-CPU local Ray), as PBT needs.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray import tune

from benchmarks.hpo.common import Task, founders, load, search_space

TRIAL_CPUS = 0.5


class MemberTrainable(tune.Trainable):
    """One member with its own replay store; config: {"setup": {...}, **hyperparameters}."""

    def setup(self, config: dict[str, Any]) -> None:
        import torch

        from evo.agent import AgentContext
        from evo.registry import agent_class
        from evo.replay import build_replay

        torch.set_num_threads(1)
        s = config["setup"]
        self.cls = agent_class(s["kind"])
        self.space = s["space"]          # name -> (min, max, kind)
        self.steps = int(s["steps"])
        spec = self.cls.replay_spec(s["task"])
        replay = build_replay(spec, int(s["seed"]) + 1000 * int(s["member"]), distributed=False) if spec else None
        self.context = AgentContext(task=s["task"], replay=replay, seed=int(s["seed"]))
        self.agent = self.cls.create(s["arch"], {**s["fixed"], **self._hparams(config)}, int(s["member_seed"]),
                                     int(s["member"]), self.context)

    def _hparams(self, config: dict[str, Any]) -> dict[str, Any]:
        """The searched hyperparameters of `config`, clipped to their ranges (ints rounded)."""
        out = {}
        for name, (lo, hi, kind) in self.space.items():
            x = min(max(float(config[name]), lo), hi)
            out[name] = int(round(x)) if kind == "int" else x
        return out

    def step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        metrics = self.agent.train(self.steps)
        t1 = time.perf_counter()
        ev = self.agent.evaluate()
        return {"fitness": float(ev.fitness), "steps_trained": self.steps, "train_s": t1 - t0,
                "eval_s": time.perf_counter() - t1, "updates": float(metrics.get("updates", 0.0)),
                "hparams_used": dict(self._hparams(self.config))}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        from evo.checkpoint import save_state

        save_state(Path(checkpoint_dir) / "agent", self.agent.get_state())
        if self.context.replay is not None:
            self.context.replay.snapshot(Path(checkpoint_dir) / "replay", keep=1)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        from evo.checkpoint import load_state

        state, _ = load_state(Path(checkpoint_dir) / "agent")
        if self.context.replay is not None and (Path(checkpoint_dir) / "replay").is_dir():
            self.context.replay.load_snapshot(Path(checkpoint_dir) / "replay")
        self.agent = self.cls.from_state(state, self.context)
        self.agent.set_hparams(self._hparams(self.config))  # the (possibly perturbed) config of this trial

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.config = new_config
        self.agent.set_hparams(self._hparams(new_config))
        return True


class CurveRecorder(tune.Callback):
    """Driver-side: every result of every trial, and the population curve.

    A curve point is taken when every trial has reported one more result (a "round", the Tune
    counterpart of an evo generation): steps = all steps the trials have reported so far, best = the
    best of each trial's latest evaluation. A point per single result would count one trial's steps
    while the others' steps in flight went uncounted, which favours Tune in steps to target."""

    def __init__(self, steps: int, population: int, on_point: Callable[[list], None] | None = None) -> None:
        self.on_point = on_point
        self.population = population
        self.start = time.perf_counter()
        self.latest: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.steps_total = 0
        self.curve: list[list[float]] = []
        self.results: list[dict[str, Any]] = []

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self.steps_total += int(result["steps_trained"])
        self.latest[trial.trial_id] = float(result["fitness"])
        self.counts[trial.trial_id] = self.counts.get(trial.trial_id, 0) + 1
        now = round(time.perf_counter() - self.start, 2)
        self.results.append({"trial": trial.trial_id, "iteration": result.get("training_iteration"),
                             "fitness": result["fitness"], "train_s": round(result["train_s"], 2),
                             "eval_s": round(result["eval_s"], 2), "hparams": result["hparams_used"], "t": now})
        rounds = min(self.counts.values()) if len(self.counts) == self.population else 0
        if rounds > len(self.curve):
            self.curve.append([self.steps_total, now, max(self.latest.values())])
            if self.on_point is not None:
                self.on_point(self.curve)


class StepBudget(tune.Stopper):
    """Stops a trial once it has itself trained its share of the budget (generations × steps), counted
    from its own results. Tune's `training_iteration` is not that count: an exploit restores the donor's
    iteration number, and a trial restored from a checkpoint behind its own iteration trains those
    iterations again (PB2 on randomwalks trained 4,400 of 4,000 updates when stopped on iterations)."""

    def __init__(self, per_trial: int) -> None:
        self.per_trial = per_trial
        self.trained: dict[str, int] = {}

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        self.trained[trial_id] = self.trained.get(trial_id, 0) + int(result["steps_trained"])
        return self.trained[trial_id] >= self.per_trial

    def stop_all(self) -> bool:
        return False


def _domain(hp: Any) -> Any:
    if hp.kind == "int":
        return tune.randint(int(hp.min), int(hp.max) + 1)
    return tune.loguniform(hp.min, hp.max) if hp.scale == "log" else tune.uniform(hp.min, hp.max)


def run(t: Task, seed: int, strategy: str, on_point: Callable[[list], None] | None = None,
        regime: str = "tuned") -> dict[str, Any]:
    from ray.tune.schedulers import FIFOScheduler, PopulationBasedTraining

    from evo.rng import member_seed
    from evo.scheduler.cluster import init_ray

    exp, _ = load(t, seed, regime)
    space = search_space(exp)
    starts = founders(exp)
    setup = {"kind": exp.agent_class.kind, "task": exp.task, "arch": exp.arch, "steps": t.steps_per_generation,
             "seed": seed, "space": {n: (float(hp.min), float(hp.max), hp.kind) for n, hp in space.items()},
             "fixed": {n: hp.value for n, hp in exp.hparam_space.items() if n not in space}}
    # one trial per founder: member index, its seed, and its starting values
    param_space = {
        "member": tune.grid_search(list(range(t.population))),
        "setup": tune.sample_from(lambda config: {**setup, "member": config["member"],
                                                   "member_seed": member_seed(seed, config["member"])}),
        **{n: tune.sample_from(lambda config, n=n: starts[config["member"]][n]) for n in space},
    }
    if strategy == "random":
        scheduler = FIFOScheduler()
        used = {"scheduler": "FIFO (no perturbation)", "hyperparameters": "founders: member 0 the file's values, "
                "the others sampled once from the ranges"}
    elif strategy == "pbt":
        scheduler = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=1,
                                            hyperparam_mutations={n: _domain(hp) for n, hp in space.items()})
        used = {"scheduler": "PopulationBasedTraining", "quantile_fraction": scheduler._quantile_fraction,
                "resample_probability": scheduler._resample_probability,
                "perturbation_factors": list(scheduler._perturbation_factors),
                "perturbation_interval": "1 iteration = one evo generation's steps per member"}
    elif strategy == "pb2":
        from ray.tune.schedulers.pb2 import PB2

        scheduler = PB2(time_attr="training_iteration", perturbation_interval=1,
                        hyperparam_bounds={n: [float(hp.min), float(hp.max)] for n, hp in space.items()})
        used = {"scheduler": "PB2", "quantile_fraction": scheduler._quantile_fraction,
                "perturbation_interval": "1 iteration = one evo generation's steps per member"}
    else:
        raise ValueError(f"unknown Tune strategy {strategy!r}")

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    init_ray(None, num_cpus=2)  # a local Ray of our own that dies with this process (evo.scheduler.cluster)
    import ray

    recorder = CurveRecorder(t.steps_per_generation, t.population, on_point)
    with tempfile.TemporaryDirectory(prefix="tune-hpo-") as storage:
        tuner = tune.Tuner(
            tune.with_resources(MemberTrainable, {"cpu": TRIAL_CPUS}),
            param_space=param_space,
            tune_config=tune.TuneConfig(metric="fitness", mode="max", scheduler=scheduler, num_samples=1),
            run_config=tune.RunConfig(name=f"{strategy}_{seed}", storage_path=storage, verbose=0,
                                      stop=StepBudget(t.generations * t.steps_per_generation), callbacks=[recorder],
                                      failure_config=tune.FailureConfig(max_failures=0),
                                      # PBT/PB2 exploit from the donor's latest checkpoint: one per iteration
                                      # (as Tune's PBT guide sets it); Tune warns that keeping 2 or fewer can break exploits
                                      checkpoint_config=tune.CheckpointConfig(
                                          checkpoint_frequency=0 if strategy == "random" else 1, num_to_keep=4)),
        )
        recorder.start = time.perf_counter()  # the clock starts once Ray is up, as for evo
        grid = tuner.fit()
        errors = [str(r.error) for r in grid if r.error is not None]
        # PBT/PB2 log each exploit (donor, recipient, old and new config) here: kept as evidence it happened
        exploits = [line.strip() for f in Path(storage).rglob("pbt_global.txt") for line in f.read_text().splitlines()
                    if line.strip()]
    ray.shutdown()
    used.update({"shared_replay": False, "replay": "one store per trial; copied with the weights on exploit",
                 "trial_cpus": TRIAL_CPUS, "concurrent_trials": t.population, "search_space": sorted(space),
                 "tune_version": ray.__version__})
    return {"curve": recorder.curve, "results": recorder.results, "used": used, "errors": errors,
            "exploits": len(exploits), "exploit_log": exploits[:50], "config_changes": _config_changes(recorder.results)}


def _config_changes(results: list[dict[str, Any]]) -> int:
    """Results whose hyperparameters differ from the same trial's previous result (a PBT/PB2 explore)."""
    last: dict[str, dict[str, Any]] = {}
    changes = 0
    for r in results:
        changes += r["trial"] in last and last[r["trial"]] != r["hparams"]
        last[r["trial"]] = r["hparams"]
    return changes
