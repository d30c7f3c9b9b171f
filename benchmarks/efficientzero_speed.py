"""EfficientZero's learner: baseline, fast path and compiled fast path, side by side in one process.

    python -m benchmarks.efficientzero_speed [--quick] [--only learner,cartpole,minatar]
        [--arms baseline,fast,compiled] [--warm STEPS] [--allocator default|keep|ab [--rounds R]] --json OUT.json

Three arms: "baseline" (`learner.use_path("baseline")`, the step-by-step code), "fast" (the default
eager path; float64 equality with the baseline: tests/efficientzero/test_fast_path.py) and "compiled"
(the fast path with `task.compile = "on"`: `learner.compiled_loss`, tests/efficientzero/test_compile.py);
more when named in `--arms`: "bf16" (the fast path with `task.autocast = "bf16"`,
tests/efficientzero/test_autocast.py; `ratio_bf16_*`: bf16 / baseline, `ratio_bf16_fast_*`: bf16 / fast)
and "denormals" (the fast path with denormal floats kept, `EVO_DENORMALS=keep`, as before evo/denormals.py;
`ratio_flush_*`: fast / denormals); and with `--arch KEY=VALUE` (repeatable, e.g. `--arch width=32`)
"arch_fast" and "arch_compiled": the fast and compiled paths on a second member whose network differs from
the file's by those keys, trained and measured beside the first (`ratio_arch_fast_*`,
`ratio_arch_compiled_*`: to the file's baseline, i.e. what another default network would buy against the
issue's starting point; such a network learns differently: measure that with `benchmarks.efficientzero
--arch`). Every arm but "baseline" and "denormals" trains with denormals
flushed to zero, as members do; "baseline" keeps them, so it stays the code the issue started from.
Each section builds a member from an experiment file's defaults (its task, arch and hyperparameter
values), trains it until its replay is warm (`--warm STEPS`: that many env steps instead, e.g. to
measure a member late in training, where denormals appear on CPUs that pay for them), compiles (the
compiled arm's first update, timed and reported as `compile_seconds`, with whether inductor's disk
cache already held the graph: a cold compile, or a warm load), then alternates the arms in short
windows on that same member — baseline, fast, compiled, compiled, fast, baseline, ... — so load from
other processes falls on all alike:

* learner: `sample_batch` + `update` (the CartPole experiment: batch 128, unroll 5); updates per
  second, and the sampling's and the update's share;
* cartpole: `agent.train(steps)` of the CartPole experiment's member (self-play, search and its
  updates): env steps per second;
* minatar: the same for experiments/minatar_breakout_efficientzero.toml's conv member;
* minatar_suite (not in the default `--only`): the same for the suite's Breakout file
  (experiments/suite/minatar_breakout.toml: batch 128, 8 simulations), the member the suite's hours go to;
* spaceinvaders_suite (not in the default `--only`): the same for experiments/suite/minatar_spaceinvaders.toml;
* asterix_suite (not in the default `--only`): the same for experiments/suite/minatar_asterix.toml (batch 128);
* mainjob (not in the default `--only`): the main job end to end, `evo run
  experiments/cartpole_efficientzero.toml` (Ray, 4 members; `--quick`: 3 generations of the file's 6,
  `--generations N`: N)
  four times one after the other: compile "off", "on" with an empty inductor cache (cold), "on" again
  with that cache (warm), "off" again; each run's wall seconds, generation seconds, the members'
  summed `compile_seconds`, the distinct architectures trained, the elite's score and the load.

The allocator (evo/allocator.py) is a setting of the whole process, so it cannot alternate inside
one: `--allocator default` runs with glibc's malloc as it is (EVO_ALLOCATOR=default: how every figure
before it was measured), `keep` with freed memory kept (what members get), and `ab` runs the chosen
sections in child processes, default then keep, `--rounds` times (default 2), and reports each arm's
median over the rounds and its ratio to the baseline arm under the default allocator
(`ratio_vs_default_baseline`: "today's" member, the issue's yardstick).

Every window records wall seconds and this process's CPU seconds (`time.process_time`: on a loaded
machine the CPU seconds are the steadier measure of the work) and the load average; each side's
median and best are reported with the ratios of each arm to the baseline (`ratio_*`: fast / baseline,
as before; `ratio_compiled_*`: compiled / baseline; `ratio_compiled_fast_*`: compiled / fast). One
torch thread, as members train. `--cache-dir DIR` points inductor's cache elsewhere (an empty directory
measures a cold compile).

`--device cuda` builds the members on the GPU (their networks, search inference and batches; the
environments stay on the CPU) and waits for the GPU at the end of each window; there the wall clock is
the measure, since a process's CPU seconds count only its own side of the work.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.devices import checked_device, cpu_description, device_name, wait_for
from evo.allocator import allocator_state, keep_freed_memory
from evo.denormals import ENV as DENORMALS_ENV
from evo.denormals import flush_denormals
from evo.spec import parse_override

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = {"cartpole": "experiments/cartpole_efficientzero.toml",
               "minatar": "experiments/minatar_breakout_efficientzero.toml",
               # the suite's Breakout member (batch 128 since the fifty-first session): what the suite's hours are made of
               "minatar_suite": "experiments/suite/minatar_breakout.toml",
               # SpaceInvaders' suite file (batch 64): its one "auto" run was no quicker than float32
               "spaceinvaders_suite": "experiments/suite/minatar_spaceinvaders.toml",
               # Asterix's suite file (batch 128, like Breakout's): 1.26x in bf16; its one "auto" seed learned less
               "asterix_suite": "experiments/suite/minatar_asterix.toml"}


def build_member(name: str, seed: int = 0, arch: dict[str, Any] | None = None) -> Any:
    """The experiment's first member (the file's hyperparameter values), with a private store, on `DEVICE`;
    `arch` overrides keys of the file's `[agent.arch]`."""
    from evo.agent import AgentContext
    from evo.replay import build_replay
    from evo.spec import load_experiment

    overrides = {"seed": seed, **{f"agent.arch.{key}": value for key, value in (arch or {}).items()}}
    exp, _ = load_experiment(ROOT / EXPERIMENTS[name], overrides)
    replay = build_replay(exp.agent_class.replay_spec(exp.task), seed, distributed=False)
    return exp.agent_class.create(exp.arch, {n: hp.value for n, hp in exp.hparam_space.items()}, seed, 0,
                                  AgentContext(task=exp.task, replay=replay, seed=seed, device=DEVICE))


ARMS = ("baseline", "fast", "compiled")
#: the second member's arms (`--arch`) and the path each runs
ARCH_ARMS = {"arch_fast": "fast", "arch_compiled": "compiled"}
EXTRA_ARMS = ("bf16", "denormals", *ARCH_ARMS)  # measured only when named in --arms
KEEPS_DENORMALS = ("baseline", "denormals")
DEVICE = "cpu"  # --device: where members' networks live
ARCH: dict[str, Any] = {}  # --arch: the arch_* arms' member's network, as keys over the file's [agent.arch]


@contextlib.contextmanager
def arm(agent: Any, name: str) -> Iterator[None]:
    """Run `agent` on arm `name`: its learner path, its `task.compile`, its `task.autocast` and whether
    denormals are kept (`EVO_DENORMALS`, read by `agent.train`; set here too for the learner section,
    which calls the learner directly)."""
    from agents.efficientzero import learner

    name = ARCH_ARMS.get(name, name)
    old = agent.task["compile"], agent.task["autocast"], os.environ.get(DENORMALS_ENV)
    agent.task["compile"] = "on" if name == "compiled" else "off"
    agent.task["autocast"] = "bf16" if name == "bf16" else "off"
    if name in KEEPS_DENORMALS:
        os.environ[DENORMALS_ENV] = "keep"
    else:
        os.environ.pop(DENORMALS_ENV, None)
    flush_denormals()
    try:
        with learner.use_path("baseline" if name == "baseline" else "fast"):
            yield
    finally:
        agent.task["compile"], agent.task["autocast"], env = old
        if env is None:
            os.environ.pop(DENORMALS_ENV, None)
        else:
            os.environ[DENORMALS_ENV] = env
        flush_denormals()


def alternate(agents: Callable[[str], Any], work: Callable[[str], None], units: float, rounds: int,
              arms: tuple[str, ...] = ARMS) -> dict[str, Any]:
    """`rounds` rounds of one window per arm, in the order of `arms` and then reversed (baseline,
    fast, compiled, compiled, fast, baseline, ...); `work(arm)` does `units` of work (updates, env
    steps) on that arm's member, `agents(arm)`, already set up."""
    windows: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
    for r in range(rounds):
        for name in (arms if r % 2 == 0 else arms[::-1]):
            with arm(agents(name), name):
                load = os.getloadavg()[0]
                w0, c0 = time.perf_counter(), time.process_time()
                work(name)
                wait_for(DEVICE)
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            windows[name].append({"wall_s": wall, "cpu_s": cpu, "load1": load,
                                  "per_s_wall": units / wall, "per_s_cpu": units / max(cpu, 1e-9)})
    out: dict[str, Any] = {"units_per_window": units, "rounds": rounds}
    for name, ws in windows.items():
        out[name] = {f"{stat}_{clock}": round(fn([w[f"per_s_{clock}"] for w in ws]), 2)
                     for stat, fn in (("median", statistics.median), ("best", max)) for clock in ("wall", "cpu")}
        out[name]["windows"] = [{k: round(v, 4) for k, v in w.items()} for w in ws]
    ratios = {"ratio": ("fast", "baseline"), "ratio_compiled": ("compiled", "baseline"),
              "ratio_compiled_fast": ("compiled", "fast"), "ratio_bf16": ("bf16", "baseline"),
              "ratio_bf16_fast": ("bf16", "fast"), "ratio_flush": ("fast", "denormals"),
              "ratio_arch_fast": ("arch_fast", "baseline"), "ratio_arch_compiled": ("arch_compiled", "baseline")}
    for prefix, (num, den) in ratios.items():
        if num in out and den in out:
            for stat in ("median", "best"):
                for clock in ("wall", "cpu"):
                    key = f"{stat}_{clock}"
                    out[f"{prefix}_{key}"] = round(out[num][key] / out[den][key], 3)
    return out


def compile_now(agent: Any, prefix: str = "") -> dict[str, Any]:
    """The compiled arm's first update, timed: a cold compile when inductor's cache lacks the graph,
    else a load from it (dynamo's trace included). `prefix` goes before every key."""
    from agents.efficientzero import learner

    cache = learner.compile_cache_dir()
    entries = sum(len(files) for _, _, files in os.walk(cache)) if os.path.isdir(cache) else 0
    before = learner.compile_stats()
    w0 = time.perf_counter()
    with arm(agent, "compiled"):
        agent.update()
    wall = time.perf_counter() - w0
    after = learner.compile_stats()
    out = {"compile_seconds": round(after["compile_seconds"] - before["compile_seconds"], 2),
           "first_update_wall_s": round(wall, 2), "cache_dir": cache, "cache_files_before": entries,
           "new_graphs": int(after["compiled_graphs"] - before["compiled_graphs"]),
           "compile_failures": int(after["compile_failures"]), "load1": os.getloadavg()[0]}
    return {prefix + key: value for key, value in out.items()}


def members(name: str, arms: tuple[str, ...], warm: int) -> Callable[[str], Any]:
    """The section's members, each trained `warm` env steps and compiled when a compiled arm runs on
    it: the file's own, and with `--arch` a second one of that network (`ARCH`) for the arch_* arms.
    Returns arm -> member."""
    own = build_member(name)
    own.train(warm)  # compiled below, by `compile_members`
    second = None
    if any(a in ARCH_ARMS for a in arms):
        second = build_member(name, arch=ARCH)
        second.train(warm)
    return lambda arm_name: second if arm_name in ARCH_ARMS else own


def compile_members(agents: Callable[[str], Any], arms: tuple[str, ...]) -> dict[str, Any]:
    """`compile_now` for each member a compiled arm runs on (arch_compiled's keys prefixed "arch_")."""
    out: dict[str, Any] = {}
    if "compiled" in arms:
        out.update(compile_now(agents("compiled")))
    if "arch_compiled" in arms:
        out.update(compile_now(agents("arch_compiled"), "arch_"))
    out.update({"arch": ARCH} if any(a in ARCH_ARMS for a in arms) else {})
    return out


def learner_section(quick: bool, arms: tuple[str, ...], warm: int | None = None) -> dict[str, Any]:
    from agents.efficientzero import learner

    agents = members("cartpole", arms, warm if warm is not None else 400 if quick else 1500)
    torch.set_num_threads(1)
    compiled = compile_members(agents, arms)
    n = 20 if quick else 50
    parts = {a: [0.0, 0.0] for a in arms}

    def work(name: str) -> None:
        agent, part = agents(name), parts[name]
        for _ in range(n):
            t0 = time.process_time()
            batch = learner.sample_batch(agent.replay, agent.target_model, agent.hparams, agent.rng)
            t1 = time.process_time()
            learner.update(agent.model, agent.target_model, agent.optimizer, agent.replay, batch, agent.hparams,
                           agent.updates + 1, compile=agent.task["compile"] == "on", autocast=agent.task["autocast"])
            agent.updates += 1
            part[0] += t1 - t0
            part[1] += time.process_time() - t1

    out = {**alternate(agents, work, n, 4 if quick else 8, arms), **compiled}
    for name, (sample, update) in parts.items():
        count = n * len(out[name]["windows"])
        out[name]["sample_cpu_ms"] = round(sample / count * 1e3, 3)
        out[name]["update_cpu_ms"] = round(update / count * 1e3, 3)
    return out


def member_section(name: str, quick: bool, arms: tuple[str, ...], warm: int | None = None) -> dict[str, Any]:
    from evo.spec import load_experiment

    # (warm-up steps beyond min_replay, window steps --quick, window steps)
    steps = (150, 300, 1000) if name == "cartpole" else (100, 150, 400)  # the MinAtar conv members' steps cost more
    exp, _ = load_experiment(ROOT / EXPERIMENTS[name], {"seed": 0})
    warm = max(warm if warm is not None else 0, int(exp.task["min_replay"]) + steps[0])
    agents = members(name, arms, warm)  # past min_replay: every window learns
    compiled = compile_members(agents, arms)
    window = steps[1] if quick else steps[2]
    return {"steps_per_window": window, "warm_steps": warm,
            **alternate(agents, lambda arm_name: agents(arm_name).train(window), window, 2 if quick else 4, arms),
            **compiled}


def main_job_section(quick: bool, generations: int | None = None) -> dict[str, Any]:
    import tempfile

    from benchmarks.mainjob_ab import main_job_run

    work = Path(tempfile.mkdtemp(prefix="evo-mainjob-"))
    cache = work / "inductor-cache"  # empty: the first "on" run compiles cold
    runs: list[dict[str, Any]] = []
    for i, (name, compile_mode) in enumerate((("off", "off"), ("on_cold", "on"), ("on_warm", "on"), ("off", "off"))):
        row = {"arm": name, "compile": compile_mode,
               **main_job_run(ROOT, work / "runs", f"run{i}-{name}", ["--set", f'agent.task.compile="{compile_mode}"'],
                              {"TORCHINDUCTOR_CACHE_DIR": str(cache)}, generations or (3 if quick else None))}
        print("mainjob", json.dumps(row), flush=True)
        runs.append(row)
    out: dict[str, Any] = {"runs": runs, "work_dir": str(work)}
    off = [r["generations_s"] for r in runs if r["compile"] == "off" and r["generations_s"]]
    for arm_name in ("on_cold", "on_warm"):
        on = [r["generations_s"] for r in runs if r["arm"] == arm_name and r["generations_s"]]
        if off and on:
            out[f"ratio_{arm_name}_generations"] = round(statistics.mean(off) / on[0], 3)
    return out


def allocator_ab(args: argparse.Namespace) -> dict[str, Any]:
    """The sections in child processes, `--allocator default` then `keep`, `args.rounds` times; each
    (allocator, section, arm): the median over rounds of the per-process medians (CPU and wall), and its
    ratio to the default allocator's baseline arm."""
    import subprocess
    import sys
    import tempfile

    children: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="evo-alloc-ab-") as tmp:
        for r in range(args.rounds):
            for mode in ("default", "keep") if r % 2 == 0 else ("keep", "default"):
                path = Path(tmp) / f"{r}-{mode}.json"
                cmd = [sys.executable, "-m", "benchmarks.efficientzero_speed", "--only", args.only, "--arms", args.arms,
                       "--allocator", mode, "--device", args.device, "--json", str(path),
                       *(["--quick"] if args.quick else [])]
                if args.cache_dir:
                    cmd += ["--cache-dir", args.cache_dir]
                if args.warm is not None:
                    cmd += ["--warm", str(args.warm)]
                for text in args.arch:
                    cmd += ["--arch", text]
                env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
                env.pop("EVO_ALLOCATOR", None)  # the child's --allocator decides, not this shell's opt-out
                subprocess.run(cmd, cwd=ROOT, env=env, check=True)
                children.append({"round": r, "allocator": mode, **json.loads(path.read_text())})
    summary: dict[str, Any] = {}
    for section in [s.strip() for s in args.only.split(",") if s.strip()]:
        rows: dict[str, Any] = {}
        for mode in ("default", "keep"):
            for arm_name in args.arms.split(","):
                got = [c[section][arm_name] for c in children if c["allocator"] == mode and arm_name in c.get(section, {})]
                if got:
                    rows[f"{arm_name}_{mode}"] = {clock: round(statistics.median(g[f"median_{clock}"] for g in got), 2)
                                                  for clock in ("cpu", "wall")}
        base = rows.get("baseline_default")
        for row in rows.values() if base else ():
            row["ratio_vs_default_baseline"] = {clock: round(row[clock] / base[clock], 3) for clock in ("cpu", "wall")}
        summary[section] = rows
    return {"allocator": "ab", "rounds": args.rounds, "quick": args.quick, "sections": args.only, "arms": args.arms,
            "summary": summary, "children": children, "loadavg_end": list(os.getloadavg())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about a minute on an idle 2-core machine")
    parser.add_argument("--only", default="learner,cartpole,minatar", help="comma-separated sections")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated, of " + ",".join(ARMS + EXTRA_ARMS))
    parser.add_argument("--cache-dir", default=None, help="inductor's cache (TORCHINDUCTOR_CACHE_DIR) for this run")
    parser.add_argument("--generations", type=int, default=None, help="mainjob: generations per run (default: "
                        "the experiment's 6, 3 with --quick)")
    parser.add_argument("--allocator", default="keep", choices=("default", "keep", "ab"),
                        help="glibc malloc as it is, freed memory kept (evo/allocator.py), or both in child processes")
    parser.add_argument("--rounds", type=int, default=2, help="--allocator ab: default/keep process pairs")
    parser.add_argument("--device", default="cpu", help="where members' networks live: cpu, cuda, cuda:N")
    parser.add_argument("--warm", type=int, default=None, help="env steps each member trains before the windows "
                        "(default: the learner 1,500, 400 --quick; members past min_replay + 100-150)")
    parser.add_argument("--arch", action="append", default=[], metavar="KEY=VALUE",
                        help="the arch_* arms' network: a key of the file's [agent.arch] (TOML value), repeatable")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    global DEVICE, ARCH
    DEVICE = checked_device(args.device)
    ARCH = dict(parse_override(text) for text in args.arch)
    arms = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    if not arms or any(a not in ARMS + EXTRA_ARMS for a in arms):
        raise SystemExit(f"--arms: expected some of {','.join(ARMS + EXTRA_ARMS)}, found {args.arms!r}")
    if bool(ARCH) != any(a in ARCH_ARMS for a in arms):
        raise SystemExit("--arch KEY=VALUE and the arms arch_fast / arch_compiled go together: --arch sets the network "
                         "those arms' member trains")
    if args.allocator == "ab":
        out = allocator_ab(args)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
        print(json.dumps(out["summary"], indent=1))
        return
    if args.allocator == "default":
        os.environ["EVO_ALLOCATOR"] = "default"
    keep_freed_memory()  # honours EVO_ALLOCATOR, so allocator_state() below says which one ran
    if args.cache_dir:
        from agents.efficientzero import learner

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = learner._USER_CACHE_DIR = os.path.abspath(args.cache_dir)
    torch.set_num_threads(1)
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    out: dict[str, Any] = {"quick": args.quick, "arms": list(arms), "torch": torch.__version__,
                           "allocator": args.allocator, "allocator_state": allocator_state(),
                           "python": platform.python_version(), "device": DEVICE,
                           "device_name": device_name(DEVICE),
                           "cpu_description": (cpu := cpu_description()), "cpu": cpu["model"], "cpus": os.cpu_count(),
                           "warm": args.warm, "arch": ARCH,
                           "loadavg_start": list(os.getloadavg())}
    t0 = time.perf_counter()
    for section in sections:
        if section == "learner":
            out["learner"] = learner_section(args.quick, arms, args.warm)
        elif section == "mainjob":
            out["mainjob"] = main_job_section(args.quick, args.generations)
        elif section in EXPERIMENTS:
            try:
                out[section] = member_section(section, args.quick, arms, args.warm)
            except ImportError as err:  # MinAtar not installed: say so, measure the rest
                out[section] = {"skipped": str(err)}
        else:
            raise SystemExit(f"--only: unknown section {section!r}; expected learner, {', '.join(EXPERIMENTS)}, mainjob")
        summary = {k: v for k, v in out[section].items()
                   if k.startswith(("ratio_median_cpu", "ratio_on"))
                   or (k.startswith(("ratio_compiled", "ratio_bf16", "ratio_flush", "ratio_arch")) and "median_cpu" in k)
                   or k in ("skipped", "compile_seconds", "cache_files_before")}
        print(section, json.dumps(summary), flush=True)
    out["loadavg_end"] = list(os.getloadavg())
    out["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k not in EXPERIMENTS and k not in ("learner", "mainjob")}))


if __name__ == "__main__":
    main()
