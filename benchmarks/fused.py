"""Fused population training vs the per-member loop, side by side in one process.

    python -m benchmarks.fused [--quick] [--compile] [--device cuda] --json OUT.json

* learner: EfficientZero gradient updates (CartPole experiment's networks, batch 128, unroll 5)
  for N members, one by one (torch.optim.Adam + clip_grad_norm_) vs one `FusedGroup.step`
  (and, with --compile, the fused step under torch.compile); the same batches for both.
  Fields per N: loop_updates_per_s, fused_updates_per_s, compiled_updates_per_s, ratio
  (fused / loop), max_abs_diff_f64 (largest parameter difference after 3 float64 updates from the
  same weights on the same batches).
* selfplay: MCTS searches per second (one search = one root) for N members x 8 roots
  (16 simulations): each member's own BatchedMCTS.run vs one search over all members' roots with
  the network vmapped over their stacked weights.
* generation: wall time (and process CPU time) of one generation (train + evaluate) of the CartPole
  experiment with N = 16 members on the inline backend, resources.fused false vs true (--quick:
  fewer steps, and two runs of each side in the order loop, fused, fused, loop, each keeping its best).

Timings alternate loop and fused in short windows and keep each side's best window, so load
from other processes on the machine hurts both sides alike. One torch thread.
`--device cuda`: the learner section's networks and batches live on the GPU, each timing window
waits for it (self-play and the generation stay on the CPU).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from typing import Any

import numpy as np
import torch

from agents.efficientzero import learner
from agents.efficientzero.agent import EfficientZeroAgent
from agents.efficientzero.fused import FusedEfficientZero, StackedSearchModel, search_members
from agents.efficientzero.mcts import BatchedMCTS, MCTSConfig
from benchmarks.devices import checked_device, cpu_name, device_name, wait_for
from evo.fused import FusedGroup, stack_batches

ARCH = {"variant": "mlp", "latent_size": 64, "width": 64, "blocks": [64], "lstm_hidden_size": 64,
        "value_support": 25, "reward_support": 5}
WEIGHTS = {"value_weight": 0.25, "policy_weight": 1.0, "value_prefix_weight": 1.0, "consistency_weight": 2.0}
B, K, H, A = 128, 5, 5, 2
DEVICE = "cpu"  # --device: where the learner section's networks and batches live


def best_rate(fn, work: float, windows: int, seconds: float) -> float:
    """The best of `windows` timing windows of about `seconds` each: work units per second."""
    best = 0.0
    for _ in range(windows):
        t, n = time.perf_counter(), 0
        while True:
            fn()
            n += 1
            wait_for(DEVICE)
            dt = time.perf_counter() - t
            if dt >= seconds:
                break
        best = max(best, n * work / dt)
    return best


def models(n: int, dtype: torch.dtype) -> list[torch.nn.Module]:
    arch = EfficientZeroAgent.validate_arch(ARCH)
    from agents.efficientzero.model import build_model

    return [build_model((4,), A, arch, torch.Generator().manual_seed(i)).to(dtype).to(DEVICE) for i in range(n)]


def batches(n: int, dtype: torch.dtype, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        out.append({"obs": torch.randn(B, K + 1, 4, generator=g, dtype=dtype),
                    "actions": torch.randint(0, A, (B, K), generator=g),
                    "value_target": torch.softmax(torch.randn(B, K + 1, 51, generator=g, dtype=dtype), -1),
                    "value_prefix_target": torch.softmax(torch.randn(B, K, 11, generator=g, dtype=dtype), -1),
                    "policy_target": torch.softmax(torch.randn(B, K + 1, A, generator=g, dtype=dtype), -1),
                    "valid": torch.ones(B, K + 1, dtype=dtype), "mask": torch.ones(B, K, dtype=dtype),
                    "weights": torch.rand(B, generator=g, dtype=dtype)})
    return [{k: v.to(DEVICE) for k, v in b.items()} for b in out]


class Loop:
    def __init__(self, nets: list[torch.nn.Module], lrs: list[float]) -> None:
        self.nets = nets
        self.opts = [torch.optim.Adam(m.parameters(), lr=lr, weight_decay=1e-4) for m, lr in zip(nets, lrs)]

    def step(self, data: list[dict[str, torch.Tensor]]) -> None:
        for m, opt, b in zip(self.nets, self.opts, data):
            terms = learner.loss_terms(m, dict(m.named_parameters()), dict(m.named_buffers()), b,
                                       {**WEIGHTS, "lstm_horizon_len": H})
            opt.zero_grad(set_to_none=True)
            terms["loss_total"].backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 10.0)
            opt.step()


def fused_group(nets: list[torch.nn.Module], lrs: list[float], compile: bool = False) -> FusedGroup:
    template = copy.deepcopy(nets[0])
    group = FusedGroup(template, len(nets), learner.fused_loss(template, H), scalars=WEIGHTS, compile=compile)
    for slot, (m, lr) in enumerate(zip(nets, lrs)):
        group.load(slot, m, lr=lr, weight_decay=1e-4, max_grad_norm=10.0)
    return group


def learner_point(n: int, compile: bool, windows: int, seconds: float) -> dict[str, Any]:
    lrs = [3e-3 * (1 + 0.1 * i) for i in range(n)]
    # exactness: 3 float64 updates from the same weights on the same batches
    nets64 = models(n, torch.float64)
    group64 = fused_group(nets64, lrs)
    loop64 = Loop([copy.deepcopy(m) for m in nets64], lrs)
    for step in range(3):
        data = batches(n, torch.float64, seed=step)
        loop64.step(data)
        group64.step(stack_batches(dict(enumerate(data)), n))
    diff = max(float((p - q).detach().abs().max()) for slot, m in enumerate(loop64.nets)
               for p, q in zip(m.parameters(), group64.read(slot).parameters()))
    # speed, float32
    nets = models(n, torch.float32)
    data = batches(n, torch.float32)
    loop, group = Loop(nets, lrs), fused_group(nets, lrs)
    stacked = stack_batches(dict(enumerate(data)), n)
    loop.step(data)
    group.step(stacked)  # warm-up
    compiled, compile_s = None, None
    if compile:  # compiled first (minutes on a busy CPU; torch's on-disk cache shortens a second run), timed with the others
        compiled = fused_group(nets, lrs, compile=True)
        t = time.perf_counter()
        compiled.step(stacked)
        compile_s = time.perf_counter() - t
    loop_rate = fused_rate = compiled_rate = 0.0
    for _ in range(windows):  # alternate, keep the best window of each
        loop_rate = max(loop_rate, best_rate(lambda: loop.step(data), n, 1, seconds))
        fused_rate = max(fused_rate, best_rate(lambda: group.step(stacked), n, 1, seconds))
        if compiled is not None:
            compiled_rate = max(compiled_rate, best_rate(lambda: compiled.step(stacked), n, 1, seconds))
    point: dict[str, Any] = {"members": n, "loop_updates_per_s": loop_rate, "fused_updates_per_s": fused_rate,
                             "compiled_updates_per_s": compiled_rate if compiled is not None else None,
                             "ratio": fused_rate / loop_rate, "max_abs_diff_f64": diff}
    if compiled is not None:
        point.update(compile_s=compile_s, compiled_ratio=compiled_rate / loop_rate)
    return point


def selfplay_point(n: int, roots: int, sims: int, windows: int, seconds: float) -> dict[str, Any]:
    nets = models(n, torch.float32)
    with torch.no_grad():
        for i, m in enumerate(nets):
            g = torch.Generator().manual_seed(100 + i)
            for p in m.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    group = fused_group(nets, [1e-3] * n)
    stacked = StackedSearchModel(group.stack.template, group.stack.params, group.stack.buffers, n)
    hp = {**{k: v.value for k, v in EfficientZeroAgent.default_hparams().items()}, "num_simulations": sims}
    obs = [np.random.default_rng(i).normal(size=(roots, 4)).astype(np.float32) for i in range(n)]
    rngs = [np.random.default_rng(i) for i in range(n)]
    mcts = BatchedMCTS(MCTSConfig.from_hparams(hp))
    loop = lambda: [mcts.run(m, torch.as_tensor(o), r, add_noise=True) for m, o, r in zip(nets, obs, rngs)]
    fused = lambda: search_members(stacked, obs, [hp] * n, rngs)
    loop()
    fused()
    loop_rate = fused_rate = 0.0
    for _ in range(windows):
        loop_rate = max(loop_rate, best_rate(loop, n * roots, 1, seconds))
        fused_rate = max(fused_rate, best_rate(fused, n * roots, 1, seconds))
    return {"members": n, "roots_per_member": roots, "simulations": sims, "loop_searches_per_s": loop_rate,
            "fused_searches_per_s": fused_rate, "ratio": fused_rate / loop_rate}


def generation_point(n: int, steps: int, repeats: int = 2) -> dict[str, Any]:
    """One generation of the CartPole experiment (its task, arch and hparams) with n members, loop
    and fused alternating (loop, fused, fused, loop, ...) so drifting load hits both alike; each
    side keeps its fastest run. Wall and process CPU seconds (the CPU time is what other processes
    on a shared machine disturb least)."""
    from evo.agent import AgentContext
    from evo.replay.protocol import build_replay
    from evo.scheduler.inline import InlineScheduler
    from evo.spec import load_experiment

    exp, _ = load_experiment("experiments/cartpole_efficientzero.toml", {"backend": "inline", "population.size": n})
    out: dict[str, Any] = {"members": n, "steps_per_generation": steps, "repeats": repeats}
    order = [side for r in range(repeats) for side in ((False, True) if r % 2 == 0 else (True, False))]
    for fused in order:
        replay = build_replay(EfficientZeroAgent.replay_spec(exp.task), 0, distributed=False)
        # the store holds min_replay rows from a warm-up member, so members learn from the first step
        ctx = AgentContext(task=exp.task, replay=replay, seed=0)
        warm = EfficientZeroAgent.create(exp.arch, {k: h.value for k, h in exp.hparam_space.items()}, 999, 999, ctx)
        warm.selfplay.collect(warm.model, warm.hparams, warm.rng, replay, 999, int(exp.task["min_replay"]), lambda k: None)
        agents = [EfficientZeroAgent.create(exp.arch, {k: h.value for k, h in exp.hparam_space.items()}, i, i, ctx)
                  for i in range(n)]
        scheduler = InlineScheduler(threads=1, context=ctx, fused=FusedEfficientZero() if fused else None)
        t, cpu = time.perf_counter(), time.process_time()
        results = scheduler.run_generation(agents, steps)
        wall, cpu = time.perf_counter() - t, time.process_time() - cpu
        assert not any(r.failed for r in results), [r.failure for r in results if r.failed]
        side = "fused" if fused else "loop"
        out[f"{side}_wall_s"] = min(wall, out.get(f"{side}_wall_s", wall))
        out[f"{side}_cpu_s"] = min(cpu, out.get(f"{side}_cpu_s", cpu))
        out.setdefault(f"{side}_wall_runs_s", []).append(wall)
        out[f"{side}_updates"] = sum(int(r.train_metrics.get("updates", 0)) for r in results)
    out["ratio"] = out["loop_wall_s"] / out["fused_wall_s"]
    out["cpu_ratio"] = out["loop_cpu_s"] / out["fused_cpu_s"]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 1, 4, 16; short windows; a short generation")
    parser.add_argument("--compile", action="store_true", help="also time the fused step under torch.compile")
    parser.add_argument("--skip", default="", help="comma-separated sections to skip: learner,selfplay,generation")
    parser.add_argument("--sizes", default="", help="comma-separated N for the learner and self-play (default: "
                        "1,4,16,64; --quick: 1,4,16 and 4,16)")
    parser.add_argument("--device", default="cpu", help="the learner section's device: cpu, cuda, cuda:N")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = checked_device(args.device)
    torch.set_num_threads(1)
    skip = set(filter(None, args.skip.split(",")))
    chosen = [int(x) for x in args.sizes.split(",") if x]
    sizes = chosen or ([1, 4, 16] if args.quick else [1, 4, 16, 64])
    windows, seconds = (2, 1.5) if args.quick else (3, 3.0)
    out: dict[str, Any] = {"machine": cpu_name(), "torch": torch.__version__,
                           "threads": torch.get_num_threads(), "quick": args.quick, "device": DEVICE,
                           "device_name": device_name(DEVICE)}
    if "learner" not in skip:
        out["learner"] = []
        for n in sizes:
            point = learner_point(n, args.compile, windows, seconds)
            print(json.dumps(point), flush=True)
            out["learner"].append(point)
    if "selfplay" not in skip:
        out["selfplay"] = []
        for n in chosen or ([4, 16] if args.quick else [1, 4, 16, 64]):
            point = selfplay_point(n, 8, 16, windows, seconds)
            print(json.dumps(point), flush=True)
            out["selfplay"].append(point)
    if "generation" not in skip:
        out["generation"] = generation_point(16, 64 if args.quick else 400, 2 if args.quick else 1)
        print(json.dumps(out["generation"]), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2, default=str)


if __name__ == "__main__":
    main()
