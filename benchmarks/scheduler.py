"""The Ray backend's overhead over training itself: one population's generation inline and on Ray.

    python -m benchmarks.scheduler [--quick] [--workers W] [--prefetch P] --json OUT.json

The population: 8 EfficientZero members of the CartPole experiment (experiments/
cartpole_efficientzero.toml: its task, architecture and hyperparameters; 4 evaluation episodes),
sharing one replay store that a warm-up member filled to `min_replay` rows first, so members
learn from their first step. Each member collects `--steps` environment steps per generation
(default 640; 160 with --quick), chosen so one member's train + evaluate takes ≥ 2 s on an idle
machine here (320 steps measured 1.6 s idle; the figure is `mean_member_train_evaluate_s`).

The same 8 start states run one generation on the inline backend (one process, one member after
another) and `--generations` generations on the Ray backend (W actors, default min(8, CPUs), a
replay service actor), timed after the actors have started and warmed up (`ray_startup_s` is
reported on its own). Fields:

* `inline_generation_s`: wall seconds of the inline generation.
* `ray_generation_s`: wall seconds of a Ray generation, as the driver sees it (`run_generation`
  from call to return: putting states, dispatch, waiting, getting results, rebuilding members,
  committing replay writes); the mean over the timed generations.
* `member_s`: the sum over members of the seconds each spent inside train + evaluate, timed in the
  worker (`attempt_member`); the mean over the timed generations.
* `overhead_fraction` = 1 − member_s / (W × ray_generation_s), pooled over the timed generations
  (their member seconds over their actor-seconds): the share of the W actors' generation time not
  spent inside a member's train or evaluate — scheduling, moving states, rebuilding members on
  either side, committing replay writes, and actors left idle at the end of a generation (8
  members on W actors: the last round may leave some waiting). Target < 0.05. Each generation's
  own figures are under `generations`.
* `state_transfer_s`: driver seconds per generation spent moving member states: `get_state` +
  `ray.put` of the start states, `ray.get` of the results, `from_state` of the trained members
  (the mean over the timed generations).
* `ray_speedup` = inline_generation_s / ray_generation_s (at most W).
* Where the W × ray_generation_s actor-seconds not in train/evaluate went, from each member's
  worker-side span (wall clock, one machine): `idle_head_s` (generation start to an actor's first
  member: putting states, dispatch, rebuilding the member in the actor), `idle_between_s` (between
  one member's evaluate and the next's train on the same actor: `get_state` in the actor, results
  back, the driver's `ray.get` + `from_state`, the next dispatch), `idle_tail_s` (an actor's last
  member to the generation's end: waiting for the slowest member, then `commit_s`, the driver
  committing the members' replay writes). `critical_overhead_fraction` = 1 − (busiest actor's
  train/evaluate seconds) / ray_generation_s: the overhead on the critical path, without the
  waiting caused by members of unequal length. These are per generation, under `generations`; the
  top level holds their means (`critical_overhead_fraction_mean`).

Load from other processes on the machine stretches members and wall alike; `load_average` is
recorded before and after. One torch thread per process.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch

from agents.efficientzero.agent import EfficientZeroAgent
from benchmarks.devices import cpu_name
from evo.agent import AgentContext
from evo.replay.protocol import Replay
from evo.spec import load_experiment

MEMBERS = 8


def experiment() -> Any:
    exp, _ = load_experiment("experiments/cartpole_efficientzero.toml", {"population.size": MEMBERS})
    exp.task["eval_episodes"] = 4
    return exp


def fill(exp: Any, replay: Replay) -> None:
    """`min_replay` rows from a warm-up member, so every member learns from its first step."""
    ctx = AgentContext(task=exp.task, replay=replay, seed=0)
    warm = EfficientZeroAgent.create(exp.arch, {k: h.value for k, h in exp.hparam_space.items()}, 999, 999, ctx)
    warm.selfplay.collect(warm.model, warm.hparams, warm.rng, replay, 999, int(exp.task["min_replay"]), lambda k: None)


def start_states(exp: Any) -> list[dict[str, Any]]:
    ctx = AgentContext(task=exp.task, seed=0)
    hp = {k: h.value for k, h in exp.hparam_space.items()}
    return [EfficientZeroAgent.create(exp.arch, hp, i, i, ctx).get_state() for i in range(MEMBERS)]


def check(results: list[Any]) -> None:
    failed = [r.failure for r in results if r.failed]
    if failed:
        raise RuntimeError(f"members failed: {failed}")


def inline_generation(exp: Any, states: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    from evo.scheduler.inline import InlineScheduler

    replay = InlineScheduler.build_replay(EfficientZeroAgent.replay_spec(exp.task), 0)
    fill(exp, replay)
    ctx = AgentContext(task=exp.task, replay=replay, seed=0)
    scheduler = InlineScheduler(threads=1, context=ctx)
    agents = [EfficientZeroAgent.from_state(s, ctx) for s in states]
    t = time.perf_counter()
    results = scheduler.run_generation(agents, steps)
    wall = time.perf_counter() - t
    check(results)
    return {"inline_generation_s": wall, "inline_member_s": sum(r.wall_s for r in results)}


def ray_generations(exp: Any, states: list[dict[str, Any]], steps: int, workers: int, generations: int,
                    prefetch: int) -> dict[str, Any]:
    import ray

    from evo.scheduler.ray import RayScheduler, init_ray

    init_ray(num_cpus=os.cpu_count() or 1)
    replay = RayScheduler.build_replay(EfficientZeroAgent.replay_spec(exp.task), 0)
    scheduler = None
    try:
        fill(exp, replay)
        ctx = AgentContext(task=exp.task, replay=replay, seed=0)
        t = time.perf_counter()
        scheduler = RayScheduler(EfficientZeroAgent, ctx, workers, cpus_per_member=1.0, prefetch=prefetch)
        info = scheduler.worker_info()  # started and warmed up: generations time members, not start-up
        startup = time.perf_counter() - t
        agents = [EfficientZeroAgent.from_state(s, ctx) for s in states]
        timings = []
        for generation in range(generations):
            results = scheduler.run_generation(agents, steps, generation=generation)
            check(results)
            timings.append(dict(scheduler.last_timing))
            agents = [r.agent for r in results]
        per_gen = []
        for tm in timings:
            per_gen.append({"wall_s": tm["wall_s"], "member_s": tm["member_s"],
                            "overhead_fraction": 1 - tm["member_s"] / (workers * tm["wall_s"]),
                            "state_transfer_s": tm["state_transfer_s"], "put_s": tm["put_s"], "get_s": tm["get_s"],
                            "rebuild_s": tm["rebuild_s"], "worker_load_s": tm["worker_load_s"],
                            "worker_save_s": tm["worker_save_s"], "commit_s": tm["commit_s"], **idle_breakdown(tm)})
        mean = {k: sum(g[k] for g in per_gen) / len(per_gen) for k in per_gen[0]}
        return {"ray_generation_s": mean["wall_s"], "member_s": mean["member_s"],
                "overhead_fraction": 1 - mean["member_s"] / (workers * mean["wall_s"]),
                "state_transfer_s": mean["state_transfer_s"],
                **{k: mean[k] for k in ("idle_head_s", "idle_between_s", "idle_tail_s", "commit_s", "put_s", "get_s",
                                        "rebuild_s")},
                "critical_overhead_fraction_mean": mean["critical_overhead_fraction"],
                "ray_startup_s": startup, "warm_up_s": [round(i["warm_up_s"], 3) for i in info],
                "generations": per_gen}
    finally:
        if scheduler is not None:
            scheduler.close()
        ray.shutdown()


def idle_breakdown(timing: dict[str, Any]) -> dict[str, float]:
    """Actor-seconds of one Ray generation outside train/evaluate, split by where they fall (module
    docstring), from the members' worker-side spans (pid, start, end)."""
    by_actor: dict[int, list[tuple[float, float]]] = {}
    for pid, start, end in timing["spans"].values():
        by_actor.setdefault(pid, []).append((start, end))
    head = between = tail = 0.0
    busiest = 0.0
    for spans in by_actor.values():
        spans.sort()
        head += spans[0][0] - timing["began_at"]
        tail += timing["ended_at"] - spans[-1][1]
        between += sum(b[0] - a[1] for a, b in zip(spans, spans[1:]))
        busiest = max(busiest, sum(end - start for start, end in spans))
    wall = timing["ended_at"] - timing["began_at"]
    return {"idle_head_s": head, "idle_between_s": between, "idle_tail_s": tail,
            "critical_overhead_fraction": 1 - busiest / wall}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="160 env steps per member (under 2 s idle: a smoke run), 2 Ray generations")
    parser.add_argument("--steps", type=int, default=None, help="env steps per member per generation")
    parser.add_argument("--workers", type=int, default=min(MEMBERS, os.cpu_count() or 1))
    parser.add_argument("--generations", type=int, default=None, help="Ray generations timed (default 3; 2 with --quick)")
    parser.add_argument("--prefetch", type=int, default=2, help="members in flight per actor (RayScheduler.prefetch)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    steps = args.steps or (160 if args.quick else 640)
    generations = args.generations or (2 if args.quick else 3)
    exp = experiment()
    states = start_states(exp)
    out: dict[str, Any] = {"machine": cpu_name(), "cpus": os.cpu_count(),
                           "torch": torch.__version__, "threads": torch.get_num_threads(), "quick": args.quick,
                           "agent": "efficientzero (CartPole-v1)", "members": MEMBERS, "steps_per_member": steps,
                           "workers": args.workers, "prefetch": args.prefetch, "load_average_before": os.getloadavg()}
    out.update(inline_generation(exp, states, steps))
    print(json.dumps({k: out[k] for k in ("inline_generation_s", "inline_member_s")}), flush=True)
    out.update(ray_generations(exp, states, steps, args.workers, generations, args.prefetch))
    out["ray_speedup"] = out["inline_generation_s"] / out["ray_generation_s"]
    out["mean_member_train_evaluate_s"] = out["inline_member_s"] / MEMBERS
    out["load_average_after"] = os.getloadavg()
    out["target_overhead_fraction"] = 0.05
    out["target_met"] = out["overhead_fraction"] < 0.05
    print(json.dumps({k: v for k, v in out.items() if k != "generations"}, default=str), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2, default=str)


if __name__ == "__main__":
    main()
