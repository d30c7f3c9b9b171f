"""The EfficientZero task suite: every task's evo run beside a random policy, a peer and an anchor.

    python -m benchmarks.suite [--quick] [--tasks cartpole mountaincar ...] [--seeds K] [--first-seed S]
                               [--set KEY=VALUE ...] [--reuse] [--max-minutes M]
                               [--no-peer | --peer-seeds K] --json OUT [--plot PNG]

Per task (experiments/suite/<task>.toml, population 4) and seed 0..K-1, an ordinary evo run
(RunStore under runs/suite/, the file's backend) records a curve point at every committed
generation: env steps summed over all members, seconds since `evolve` began, and the best member's
fitness, its mean return over the file's `eval_episodes` (10) greedy evaluation episodes. Beside
it, on the same evaluation starts (each run seed's own), **a random policy** (uniform actions, each
of the 10 starts played `RANDOM_REPEATS` (20) times under the same step cap; once under `--quick`),
**a peer** (AgileRL's DQN
population through benchmarks/hpo/agilerl_runner.py in `.venv-agilerl`, its shipped config with
the env id changed, and for MinAtar the MinAtar paper's DQN network as its image encoder, on the
same env-step budget, seed 0 or seeds 0..K-1 with `--peer-seeds K`, each evo seed judged against
the peer run of its own seed; skipped with the reason recorded if its venv cannot be made) and
**an anchor** (published numbers, `ANCHORS`). Verdicts against the issue's
targets are in each task's `verdict`.

Every finished run is then evaluated **held out** (`heldout`, `evo.heldout`): its last elite and its
best kept checkpoint (the highest score over the run), each on 50 fresh episodes from the run seed
+ 1000, beside a random policy on those starts. The curve's points score every member on the same
10 starts and keep the best, so they are biased up and noisy; the held-out numbers are neither, and
the verdict reports them beside the finals (`heldout_finals`, `heldout_met`, ...). Each run also
records `train_return`: the population's mean training-episode return per generation, which shows
whether the population learned or one member's evaluation got lucky.

`--reuse` continues from OUT: finished runs are kept (and get `heldout` and `train_return` if they
lack them and their RunStore under runs/suite/ still holds their curve); an interrupted run (its RunStore under
runs/suite/ and its curve in OUT) continues from its last committed generation, with its curve and
clock carried on. `--max-minutes` stops a run after the first generation past that many minutes of
wall time (the run is marked partial; `--reuse` goes on from there). `--quick` shrinks every task to
a population of 2, one generation of 64 steps per member, 2 evaluation episodes of at most 50 steps (and 2 held out),
inline backend, no peer: every task's whole pipeline in about a minute in all (the smoke test).

`--set KEY=VALUE` (repeatable, as `evo run --set`) changes every task's file for an ablation: the
overrides are recorded in OUT, the runs get their own RunStores (`_v<hash>` names), and `--reuse`
refuses an OUT made with other overrides. `--first-seed S` runs seeds S..S+K-1 (held-out seeds).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import tomllib

ROOT = Path(__file__).resolve().parents[1]
RUNS_DIR = ROOT / "runs" / "suite"

#: name -> (experiment file, issue-23 target, stretch, anchor)
TASKS: dict[str, dict[str, Any]] = {
    "cartpole": {"file": "experiments/suite/cartpole.toml", "target": 475.0, "stretch": 500.0,
                 "anchor": {"text": "SB3 DQN (rl-zoo) 500 at 50k env steps", "return": 500.0, "env_steps": 50_000}},
    "lunarlander": {"file": "experiments/suite/lunarlander.toml", "target": 150.0, "stretch": 200.0,
                    "anchor": {"text": "SB3 DQN (rl-zoo) 154 at 100k env steps, one agent", "return": 154.0,
                               "env_steps": 100_000}},
    "mountaincar": {"file": "experiments/suite/mountaincar.toml", "target": -130.0, "stretch": -110.0,
                    "anchor": {"text": "SB3 DQN (rl-zoo) -101 at 120k env steps; PPO stays at -200", "return": -101.0,
                               "env_steps": 120_000}},
    "minatar_breakout": {"file": "experiments/suite/minatar_breakout.toml", "target_x_random": 10.0, "stretch": 15.0,
                         "anchor": {"text": "gymnax PPO 28 at 10M env steps", "return": 28.0, "env_steps": 10_000_000}},
    "minatar_asterix": {"file": "experiments/suite/minatar_asterix.toml", "target_x_random": 4.0, "stretch": None,
                        "anchor": {"text": "gymnax PPO 15 at 10M env steps", "return": 15.0, "env_steps": 10_000_000}},
    "minatar_spaceinvaders": {"file": "experiments/suite/minatar_spaceinvaders.toml", "target_x_random": 4.0,
                              "stretch": None,
                              "anchor": {"text": "gymnax PPO 131 at 10M env steps", "return": 131.0,
                                         "env_steps": 10_000_000}},
}

def task_name(text: str) -> str:
    """A suite task's name from its name or its file's env id, any case (`MountainCar-v0` -> mountaincar)."""
    if text in TASKS:
        return text
    for name, spec in TASKS.items():
        env_id = tomllib.loads((ROOT / spec["file"]).read_text())["agent"]["task"]["env_id"]
        if text.lower() in (name, env_id.lower()):
            return name
    raise argparse.ArgumentTypeError(f"unknown task {text!r}: expected one of {list(TASKS)} or their env ids")


QUICK = {"population": {"size": 2, "generations": 1, "steps_per_generation": 64},
         "task": {"eval_episodes": 2, "eval_max_steps": 50, "min_replay": 32, "num_envs": 4},
         "hparams": {"num_simulations": 4, "batch_size": 16}}


# ---------------------------------------------------------------------------------------------
def load_task(name: str, seed: int, quick: bool, overrides: dict[str, Any] | None = None):
    """The task's experiment (with the benchmark's seed and `overrides`; shrunk under --quick) and its TOML text."""
    from evo.spec import apply_overrides, parse_experiment

    path = ROOT / TASKS[name]["file"]
    text = path.read_text()
    data = apply_overrides(tomllib.loads(text), overrides, str(path))
    if overrides:
        text += f"\n# benchmarks.suite --set: {json.dumps(overrides)}\n"
    data["seed"] = seed
    if quick:
        data["backend"] = "inline"
        data["population"].update(QUICK["population"])
        data["agent"]["task"].update(QUICK["task"])
        hp = data["agent"]["hparams"]
        for key, value in QUICK["hparams"].items():
            hp[key] = {**hp[key], "value": value, "min": min(hp[key].get("min", value), value)} \
                if isinstance(hp.get(key), dict) else value
        text += f"\n# benchmarks.suite --quick: {json.dumps(QUICK)}\n"
    return parse_experiment(data, str(path)), text


#: the random baseline plays each evaluation start this many times (independent action draws): one draw of
#: 10 episodes has a standard deviation of 40-50% of its mean on MinAtar Breakout and Asterix, which made it
#: the noisiest part of a "x random" verdict
RANDOM_REPEATS = 20


def random_baseline(task: dict[str, Any], run_seed: int, repeats: int = RANDOM_REPEATS) -> dict[str, Any]:
    """The suite's random baseline for a run: `random_policy` on at least 10 of the run's evaluation starts,
    each played `repeats` times, capped as the task's evaluations are."""
    return random_policy(task, run_seed, max(10, int(task["eval_episodes"])), int(task["eval_max_steps"]),
                         repeats=repeats)


def random_policy(task: dict[str, Any], run_seed: int, episodes: int, cap: int, seed: int = 0,
                  repeats: int = 1) -> dict[str, Any]:
    """Uniform random actions on the evaluation starts of `run_seed` (as `SelfPlay.evaluation`: env i
    starts from seed `selfplay.evaluation_seed(run_seed, i)`), `cap` steps at most per episode; each start is
    played `repeats` times with independent actions. `mean`, `std` and `se` are over all
    `episodes * repeats` episodes (`repeats` 1 draws exactly what it did before the option)."""
    from agents.efficientzero.envs import EnvPool
    from agents.efficientzero.selfplay import evaluation_seed

    pool = EnvPool(task, episodes)
    rng = np.random.default_rng(seed)
    returns = np.zeros((repeats, episodes))
    for r in range(repeats):
        for i in range(episodes):
            pool.reset_to(i, evaluation_seed(run_seed, i))
            n = pool.envs[i].action_space.n
            for _ in range(cap):
                _, reward, term, trunc, _ = pool.step(i, int(rng.integers(n)))
                returns[r, i] += reward
                if term or trunc:
                    break
    out = {"mean": float(returns.mean()), "std": float(returns.std()), "episodes": episodes, "step_cap": cap}
    if repeats > 1:
        out.update(repeats=repeats, se=float(returns.std() / np.sqrt(returns.size)), run_seed=int(run_seed))
    return out


def random_for(entry: dict[str, Any], seed: int) -> dict[str, Any]:
    """The random baseline a run of `seed` is judged against: measured on that seed's own evaluation
    starts (`random_by_seed`) where there is one, else the task's (seed 0's starts, as before)."""
    return entry.get("random_by_seed", {}).get(str(seed)) or entry.get("random", {})


#: held-out evaluation of a finished run: this many fresh episodes from the run seed + HELDOUT_SEED_OFFSET
HELDOUT_EPISODES = 50


def heldout(store, exp, episodes: int) -> dict[str, Any]:
    """A finished run's last elite and its best kept checkpoint (highest score over the run),
    evaluated afresh on `episodes` episodes from starts the run never selected on (`evo.heldout`),
    with a random policy on the same starts. The run's own curve scores every member on the same 10
    starts and keeps the best: its final is a maximum of noisy estimates; this is not."""
    from evo.heldout import HELDOUT_SEED_OFFSET, evaluate_member

    seed = exp.seed + HELDOUT_SEED_OFFSET
    keep = ("member", "generation", "fitness", "run_fitness", "run_score", "seconds")
    last = evaluate_member(store, episodes=episodes, seed=seed)
    row = store.trained_checkpoint(best=True)[0]
    # often the last elite is the best checkpoint too: its evaluation (greedy, fixed starts) is not run twice
    best = last if (row["index"], row["generation"]) == (last["member"], last["generation"]) else \
        evaluate_member(store, best=True, episodes=episodes, seed=seed)
    return {"episodes": episodes, "seed": seed,
            "last_elite": {k: last[k] for k in keep} | {"std": last["metrics"].get("eval_return_std")},
            "best_checkpoint": {k: best[k] for k in keep} | {"std": best["metrics"].get("eval_return_std")},
            "random": random_policy(exp.task, seed, episodes, int(exp.task["eval_max_steps"]))}


class _Stop(Exception):
    """--max-minutes reached after a committed generation."""


def variant_suffix(overrides: dict[str, Any] | None) -> str:
    """'' for the files as they are, else `_v` + 8 hex digits of the overrides (a RunStore of its own)."""
    if not overrides:
        return ""
    import hashlib

    return "_v" + hashlib.sha256(json.dumps(overrides, sort_keys=True).encode()).hexdigest()[:8]


def store_name(name: str, seed: int, quick: bool, overrides: dict[str, Any] | None) -> str:
    """The RunStore's name of a task's run under RUNS_DIR."""
    return f"{name}_s{seed}{variant_suffix(overrides)}{'_quick' if quick else ''}"


def train_returns(store) -> list[float | None]:
    """The population's mean training-episode return (`train_episode_return`, the episodes a member played
    while collecting) per committed generation; None for a generation where no member finished an episode.
    The curve's final is the best of the members' greedy evaluations, a maximum of noisy estimates; this mean
    over every member shows whether the population as a whole learned (a take-off) or one member got lucky."""
    done = store.last_completed_generation() + 1
    by_gen: list[list[float]] = [[] for _ in range(done)]
    for row in store.all_evaluations():
        value = row["train_metrics"].get("train_episode_return")
        if row["generation"] < done and value is not None:
            by_gen[row["generation"]].append(float(value))
    return [round(float(np.mean(v)), 4) if v else None for v in by_gen]


def best_per_generation(store) -> dict[int, float]:
    """The best member's fitness of every generation the store has evaluations of (the suite's curve points)."""
    best: dict[int, float] = {}
    for row in store.all_evaluations():
        best[row["generation"]] = max(best.get(row["generation"], -np.inf), row["fitness"])
    return best


def add_from_store(name: str, run: dict[str, Any], overrides: dict[str, Any] | None) -> None:
    """What a finished run of an earlier call (--reuse) lacks — `heldout`, `train_return` — from its
    RunStore under RUNS_DIR, or in `heldout` the reason it cannot be had."""
    from evo.runstore import RunStore

    path = RUNS_DIR / store_name(name, run["seed"], False, overrides)
    if not path.exists():
        if run.get("heldout") is None:
            run["heldout"] = {"skipped": f"its RunStore ({path}) is no longer on this machine"}
        return
    exp, _ = load_task(name, run["seed"], False, overrides)
    store = RunStore.open(path, read_only=True)
    try:
        # the store must hold this very run (a later call of another JSON may have reused its name)
        best = best_per_generation(store)
        if [best.get(g) for g in range(len(run["curve"]))] != [p[2] for p in run["curve"]]:
            if run.get("heldout") is None:
                run["heldout"] = {"skipped": f"{path} holds another run than this curve"}
            return
        if run.get("heldout") is None:
            run["heldout"] = heldout(store, exp, HELDOUT_EPISODES)
        if run.get("train_return") is None:
            run["train_return"] = train_returns(store)
    finally:
        store.close()


def run_evo(name: str, seed: int, quick: bool, previous: dict[str, Any] | None, max_minutes: float | None,
            on_point, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """One evo run of the task (continued from its RunStore when `previous` holds a partial curve)."""
    from benchmarks.hpo.evo_strategy import CurveObserver
    from evo.population import evolve, start_backend
    from evo.runstore import RunStore

    exp, text = load_task(name, seed, quick, overrides)
    run_name = store_name(name, seed, quick, overrides)
    tmp = tempfile.TemporaryDirectory(prefix="evo-suite-") if quick else None
    runs_dir = Path(tmp.name) if tmp else RUNS_DIR
    runs_dir.mkdir(parents=True, exist_ok=True)
    curve = list(previous["curve"]) if previous else []
    if curve and (runs_dir / run_name).exists():
        store = RunStore.open(run_name, runs_dir)
        done = store.last_completed_generation() + 1
        curve = curve[:done]  # generations past the JSON's last point are re-counted from the store below
    else:
        if (runs_dir / run_name).exists():  # a stale store without a curve: start over
            import shutil

            shutil.rmtree(runs_dir / run_name)
        store = RunStore.create(runs_dir, run_name, text, exp.to_json())
        curve = []
    load_start = os.getloadavg()
    scheduler, context = start_backend(exp, exp.backend)
    observer = CurveObserver(exp.population.steps_per_generation)
    observer.carry_on(curve)
    started = time.perf_counter()

    def point(c: list) -> None:
        on_point({"seed": seed, "curve": c, "partial": True})
        if max_minutes is not None and time.perf_counter() - started > 60 * max_minutes:
            raise _Stop

    observer.on_point = point
    partial, held, train = False, None, None
    try:
        try:
            evolve(exp, store, scheduler, context, observer=observer)
        except _Stop:
            partial = observer.curve[-1][0] < exp.population.size * exp.population.generations * \
                exp.population.steps_per_generation
        finally:
            scheduler.close()
        if not partial:
            held = heldout(store, exp, 2 if quick else HELDOUT_EPISODES)
        train = train_returns(store)
    finally:
        store.close()
        if tmp is not None:
            tmp.cleanup()
    c = observer.curve
    return {"seed": seed, "curve": c, "partial": partial, "wall_s": c[-1][1] if c else None, "heldout": held,
            "file_sha256": file_digest((ROOT / TASKS[name]["file"]).read_text()),  # the file, before --quick/--set
            "train_return": train, "final_best": c[-1][2] if c else None, "peak_best": max((p[2] for p in c), default=None),
            "budget": exp.population.size * exp.population.generations * exp.population.steps_per_generation,
            "population": exp.population.size, "backend": exp.backend,
            "loadavg_start": [round(x, 2) for x in load_start], "loadavg_end": [round(x, 2) for x in os.getloadavg()]}


def file_digest(text: str) -> str:
    """A short digest of an experiment file's text: a run records its file's, so a table can tell a row made
    with the file as it is now from one made with an earlier version of it."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def run_peer(name: str, seed: int, env_id: str, budget: int, steps_per_generation: int) -> dict[str, Any]:
    """AgileRL's DQN population on `env_id` (its MinAtar network for MinAtar ids), or {"skipped": why}."""
    from benchmarks.hpo import agilerl_peer

    evo_steps = max(agilerl_peer.NUM_ENVS, steps_per_generation // agilerl_peer.NUM_ENVS * agilerl_peer.NUM_ENVS)
    try:
        exe = agilerl_peer.ensure_venv()
    except Exception as exc:  # no network, no wheel: the peer is skipped, said so
        return {"skipped": f"AgileRL's venv could not be made ({type(exc).__name__}: {exc})"}
    with tempfile.TemporaryDirectory(prefix="agilerl-suite-") as tmp:
        out = Path(tmp) / "curve.json"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["WANDB_MODE"] = "disabled"
        load_start = os.getloadavg()
        proc = subprocess.run([str(exe), str(agilerl_peer.RUNNER), "--seed", str(seed), "--budget", str(budget),
                               "--evo-steps", str(evo_steps), "--env-id", env_id, "--out", str(out)],
                              cwd=tmp, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            return {"skipped": f"AgileRL runner failed (exit {proc.returncode}): {proc.stderr[-600:]}"}
        result = json.loads(out.read_text())
    curve = result["curve"]
    network = ", the MinAtar paper's network as its encoder" if env_id.startswith("MinAtar/") else ""
    return {"algorithm": f"DQN (AgileRL 2.58, shipped configs/training/dqn/dqn.yaml, env id changed{network})",
            "curve": curve, "final_best": curve[-1][2] if curve else None,
            "peak_best": max((p[2] for p in curve), default=None), "wall_s": curve[-1][1] if curve else None,
            "loadavg_start": [round(x, 2) for x in load_start], "loadavg_end": [round(x, 2) for x in os.getloadavg()]}


def target_for(spec: dict[str, Any], random_mean: float | None) -> float | None:
    """A task's target: its fixed one, or `target_x_random` times a random baseline's mean (None without one)."""
    if "target" in spec:
        return spec["target"]
    return None if random_mean is None else spec["target_x_random"] * max(random_mean, 1e-9)


def verdict(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets against the runs: per seed, did the final best reach the target (and stretch)?"""
    spec = TASKS[name]
    runs = [r for r in entry.get("runs", []) if r.get("curve")]
    # a "x random" target is judged per seed, against random on that seed's own evaluation starts
    rnds = [random_for(entry, r["seed"]).get("mean") for r in runs]
    targets = [target_for(spec, r) for r in rnds]
    rnd = entry.get("random", {}).get("mean")
    target = target_for(spec, rnd)
    finals = [r["final_best"] for r in runs]
    out: dict[str, Any] = {"target": target, "targets": targets, "finals": finals,
                           "met": [None if t is None else f >= t for f, t in zip(finals, targets)]
                           if target is not None else None,
                           "stretch_met": [f >= spec["stretch"] for f in finals] if spec.get("stretch") else None,
                           "complete": bool(runs) and not any(r.get("partial") for r in runs)}
    if rnd is not None:
        out["x_random"] = [round(f / r, 2) if r is not None and r > 0 else None for f, r in zip(finals, rnds)]
    held = [r["heldout"] if "last_elite" in (r.get("heldout") or {}) else None for r in runs]
    if any(held):
        # judged as the finals are, on the fresh episodes (the x-random target against random on those starts)
        held_targets = [None if h is None else target_for(spec, h["random"]["mean"]) for h in held]
        out["heldout_finals"] = [None if h is None else h["last_elite"]["fitness"] for h in held]
        out["heldout_best_checkpoint"] = [None if h is None else h["best_checkpoint"]["fitness"] for h in held]
        out["heldout_met"] = [None if h is None else h["last_elite"]["fitness"] >= t for h, t in zip(held, held_targets)]
        out["heldout_best_met"] = [None if h is None else h["best_checkpoint"]["fitness"] >= t
                                   for h, t in zip(held, held_targets)]
    peers = [peer_for(entry, r["seed"]) for r in runs]
    if peers and all(p.get("final_best") is not None for p in peers):
        out["peer_finals"] = [p["final_best"] for p in peers]
        out["above_peer"] = [f > p["final_best"] for f, p in zip(finals, peers)]
    return out


def peer_for(entry: dict[str, Any], seed: int) -> dict[str, Any]:
    """The peer's run of `seed` where `--peer-seeds` ran one, else seed 0's (`entry["peer"]`)."""
    return next((p for p in entry.get("peer_more", []) if p.get("seed") == seed), entry.get("peer", {}))


def plot(results: dict[str, Any], path: str) -> None:
    """Per task, the best member's mean evaluation return against env steps (top row) and against wall
    seconds (bottom row), with each peer run, the random policy, the target and the anchor: a point where
    the anchor's env steps fall on the axis, else its text (MinAtar's anchors are at 10M steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in results["tasks"] if results["tasks"][n].get("runs")]
    if not names:
        return
    fig, axes = plt.subplots(2, len(names), figsize=(4.2 * len(names), 6.6), squeeze=False)
    for col, name in enumerate(names):
        entry = results["tasks"][name]
        for row, (x, xlabel) in enumerate([(0, "env steps (all members)"), (1, "wall seconds")]):
            ax = axes[row][col]
            for run in entry["runs"]:
                c = np.asarray(run["curve"])
                if len(c):
                    ax.plot(c[:, x], c[:, 2], marker="o", ms=3, label=f"evo EZ seed {run['seed']}")
            for peer in [entry.get("peer", {}), *entry.get("peer_more", [])]:
                if peer.get("curve"):
                    c = np.asarray(peer["curve"])
                    ax.plot(c[:, x], c[:, 2], ls="--", label=f"AgileRL DQN seed {peer.get('seed', 0)}")
            if "random" in entry:
                ax.axhline(entry["random"]["mean"], color="grey", ls=":", label="random")
            target = entry.get("verdict", {}).get("target")
            if target is not None:
                ax.axhline(target, color="green", ls="-.", lw=0.8, label="target")
            anchor = entry.get("anchor") or {}
            if row == 0 and anchor.get("env_steps"):
                right = max([float(np.asarray(r["curve"])[:, 0].max()) for r in entry["runs"] if r.get("curve")] or [0.0])
                if anchor["env_steps"] <= 1.5 * right:
                    ax.plot([anchor["env_steps"]], [anchor["return"]], marker="*", ms=10, color="black", ls="",
                            label=f"anchor: {anchor['text']}")
                else:
                    ax.text(0.02, 0.98, f"anchor (off the axis): {anchor['text']}", transform=ax.transAxes,
                            fontsize=6, va="top")
            ax.set_title(name)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("best member, mean eval return")
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(results: dict[str, Any]) -> str:
    """The results as a markdown table (docs/benchmarks.md): one row per task and seed."""
    rows = ["| task | seed | env steps (all members) | wall s | best member, final (peak) | random | peer final "
            "| anchor | target | met | held-out: last elite / best checkpoint (random) | load at start/end "
            "| mean train return, first → last generation | made at |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, entry in results["tasks"].items():
        v = entry.get("verdict", {})
        runs = [r for r in entry.get("runs", []) if r.get("curve")]
        path = ROOT / entry.get("file", "")
        current = file_digest(path.read_text()) if path.is_file() else None  # the task's file as it is now
        targets = (v.get("targets") or [v.get("target")] * len(runs)) if v else [None] * len(runs)
        for run, seed_target in zip(runs, targets):
            peer = peer_for(entry, run["seed"])
            peer_text = f"{peer['final_best']:.1f} (seed {peer.get('seed', 0)})" if peer.get("final_best") is not None \
                else f"skipped ({peer.get('skipped', 'not run')[:40]})"
            steps, wall, best = run["curve"][-1]
            peak = max(p[2] for p in run["curve"])
            met = "partial" if run.get("partial") else ("yes" if seed_target is not None and best >= seed_target
                                                        else "no")
            target = f"{seed_target:.1f}" if seed_target is not None else "?"
            rows.append(f"| {name} | {run['seed']} | {steps:,} of {run.get('budget', 0):,} | {wall:.0f} "
                        f"| {best:.1f} ({peak:.1f}) "
                        f"| {random_cell(random_for(entry, run['seed']))} | {peer_text} "
                        f"| {entry['anchor']['text']} | {target} | {met} | {heldout_cell(run.get('heldout'))} "
                        f"| {run.get('loadavg_start', ['?'])[0]} / {run.get('loadavg_end', ['?'])[0]} "
                        f"| {train_cell(run.get('train_return'))} | {made_cell(run, current)} |")
    return "\n".join(rows)


def made_cell(run: dict[str, Any], current: str | None) -> str:
    """'1a2b3c4' (the commit the run was made at), with '(earlier file)' when its experiment file is not the
    file as it is now (`current`: that file's `file_digest`); '?' where the run recorded neither (runs made
    before runs recorded them; see docs/benchmarks.md for what is known of those)."""
    commit = run.get("commit") or (run.get("provenance") or {}).get("commit")
    text = commit[:7] if commit else "?"
    digest = run.get("file_sha256")
    if digest is None:
        as_now = (run.get("provenance") or {}).get("file_as_now")
        return text if as_now is None else text + ("" if as_now else " (earlier file)")
    return text + ("" if current is not None and current == digest else " (earlier file)")


def random_cell(rnd: dict[str, Any]) -> str:
    """'0.41 ± 0.03 (200 ep)' for a random baseline of repeats, '0.5' for a single draw of 10 episodes."""
    if "mean" not in rnd:
        return "?"
    if rnd.get("repeats", 1) > 1:
        return f"{rnd['mean']:.2f} ± {rnd['se']:.2f} ({rnd['episodes'] * rnd['repeats']} ep)"
    return f"{rnd['mean']:.1f}"


def train_cell(train: list[float | None] | None) -> str:
    """'0.40 → 1.48' for a run's mean training returns per generation, '?' where none were recorded."""
    known = [t for t in train or [] if t is not None]
    return f"{known[0]:.2f} → {known[-1]:.2f}" if known else "?"


def heldout_cell(held: dict[str, Any] | None) -> str:
    """'191.7 / 168.9 (-180.2), 50 ep' for a run's held-out evaluation, or why there is none."""
    if not held:
        return "not run"
    if "last_elite" not in held:
        return "its run store is not kept"
    last, best = held["last_elite"], held["best_checkpoint"]
    return (f"{last['fitness']:.1f} / {best['fitness']:.1f} (gen {best['generation']}) "
            f"({held['random']['mean']:.1f}), {held['episodes']} ep")


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or None
    except OSError:
        return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every task tiny (the smoke test; about a minute)")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), type=task_name,
                        help=f"suite names ({', '.join(TASKS)}) or their env ids (MountainCar-v0, MinAtar/Breakout-v1)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds S..S+K-1 per task (S: --first-seed)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of every task's file (as `evo run --set`), recorded in --json")
    parser.add_argument("--reuse", action="store_true", help="continue from --json: keep finished runs, go on with partial ones")
    parser.add_argument("--max-minutes", type=float, default=None, help="stop a run after the generation past this")
    parser.add_argument("--no-peer", action="store_true", help="skip AgileRL (recorded as skipped)")
    parser.add_argument("--peer-seeds", type=int, default=1,
                        help="AgileRL seeds 0..K-1 (each evo seed is compared with the peer's run of the same seed)")
    parser.add_argument("--json", required=True)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--table", action="store_true", help="print --json's results as a markdown table and stop")
    args = parser.parse_args(argv)
    from evo.spec import SpecError, parse_override

    try:
        overrides = dict(parse_override(text) for text in args.set)
    except SpecError as exc:
        parser.error(str(exc))
    if args.table:
        results = json.loads(Path(args.json).read_text())
        print(table(results))
        if args.plot:
            plot(results, args.plot)
        return results
    import torch

    torch.set_num_threads(1)
    from benchmarks.hpo.common import machine

    out = Path(args.json)
    results: dict[str, Any] = {"tasks": {}}
    if args.reuse and out.exists():
        results = json.loads(out.read_text())
        if results.get("overrides", {}) != overrides:
            parser.error(f"--reuse: {out} was made with --set {results.get('overrides', {})}, not {overrides}")
    results["overrides"] = overrides
    results.update({"command": "python -m benchmarks.suite " + " ".join(sys.argv[1:] if argv is None else argv),
                    "commit": _commit(), "quick": args.quick, "machine": machine()})

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1))

    repeats = 1 if args.quick else RANDOM_REPEATS

    def stale(known: dict[str, Any] | None) -> bool:  # a random baseline to measure (again)
        return args.quick or known is None or known.get("repeats", 1) < repeats

    for name in args.tasks:
        entry = results["tasks"].setdefault(name, {"runs": []})
        entry.update({"file": TASKS[name]["file"], "anchor": TASKS[name]["anchor"]})
        t0 = time.perf_counter()
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            prev = next((r for r in entry["runs"] if r["seed"] == seed), None)
            if prev is not None and not prev.get("partial"):
                if (prev.get("heldout") is None or prev.get("train_return") is None) and not args.quick:
                    add_from_store(name, prev, overrides)
                    save()
                continue

            def on_point(partial_run: dict[str, Any], seed: int = seed, entry: dict = entry) -> None:
                entry["runs"] = [r for r in entry["runs"] if r["seed"] != seed] + [partial_run]
                save()

            run = run_evo(name, seed, args.quick, prev, args.max_minutes, on_point, overrides)
            # where the run came from: this call's commit and command (and the commit a continued run began at)
            run.update({"commit": results["commit"], "command": results["command"]})
            if prev is not None and prev.get("commit") not in (None, results["commit"]):
                run["began_at_commit"] = prev.get("began_at_commit", prev["commit"])
            entry["runs"] = sorted([r for r in entry["runs"] if r["seed"] != seed] + [run], key=lambda r: r["seed"])
            print(f"suite {name} seed {seed}: final best {run['final_best']} after {run['curve'][-1][0]} env steps, "
                  f"{run['wall_s']} s{' (partial)' if run['partial'] else ''}", flush=True)
            save()
        exp, _ = load_task(name, 0, args.quick, overrides)
        by_seed = entry.setdefault("random_by_seed", {})
        for run in entry["runs"]:  # each seed's runs evaluate on that seed's starts
            if stale(by_seed.get(str(run["seed"]))):
                by_seed[str(run["seed"])] = random_baseline(exp.task, run["seed"], repeats)
        if stale(entry.get("random")):  # the task's (seed 0's starts): measured above where seed 0 ran
            if "random" in entry and not args.quick and "random_single_draw" not in entry:
                entry["random_single_draw"] = entry["random"]  # kept: the verdicts before RANDOM_REPEATS used it
            known = by_seed.get(str(exp.seed))
            entry["random"] = dict(known) if known else random_baseline(exp.task, exp.seed, repeats)
        budget = exp.population.size * exp.population.generations * exp.population.steps_per_generation
        if args.quick or args.no_peer:
            entry["peer"] = {"skipped": "--quick" if args.quick else "--no-peer"}
        else:
            if not entry.get("peer", {}).get("curve"):
                entry["peer"] = run_peer(name, 0, exp.task["env_id"], budget, exp.population.steps_per_generation)
            more = [p for p in entry.get("peer_more", []) if p.get("curve")]
            for seed in range(1, args.peer_seeds):
                if not any(p["seed"] == seed for p in more):
                    more.append({"seed": seed, **run_peer(name, seed, exp.task["env_id"], budget,
                                                          exp.population.steps_per_generation)})
                    entry["peer_more"] = sorted(more, key=lambda p: p["seed"])
                    save()
        entry["budget"] = budget
        entry["verdict"] = verdict(name, entry)
        entry["task_wall_s_this_call"] = round(time.perf_counter() - t0, 1)
        save()
    if args.plot:
        plot(results, args.plot)
    return results


if __name__ == "__main__":
    main()
