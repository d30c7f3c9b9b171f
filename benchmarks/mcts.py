"""Batched MCTS throughput on a CartPole-sized EfficientZero model.

    python -m benchmarks.mcts [--quick] --json OUT.json

For 8 and 64 roots and 25 and 50 simulations: searches per second (`search_per_s`, one search
= one root) and `tree_fraction`, the share of search time spent outside the network (selection,
expansion, backup, buffers). The network time is measured by timing the model calls inside the
search; the rest is tree work. One torch thread (the 2-core default stalls).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from agents.efficientzero.agent import EfficientZeroAgent
from agents.efficientzero.mcts import BatchedMCTS, MCTSConfig
from agents.efficientzero.model import build_model
from benchmarks.devices import cpu_name


class TimedModel:
    """Wraps a model and accumulates the wall time of every network call."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.action_space_size = model.action_space_size
        self.value_support = model.value_support
        self.reward_support = model.reward_support
        self.support_step = model.support_step
        self.seconds = 0.0

    def _timed(self, fn, *args):
        t = time.perf_counter()
        out = fn(*args)
        self.seconds += time.perf_counter() - t
        return out

    def represent(self, obs):
        return self._timed(self.model.represent, obs)

    def predict(self, latent):
        return self._timed(self.model.predict, latent)

    def dynamics(self, latent, action, hidden):
        return self._timed(self.model.dynamics, latent, action, hidden)

    def initial_hidden(self, batch):
        return self._timed(self.model.initial_hidden, batch)


def measure(roots: int, sims: int, seconds: float, model: torch.nn.Module) -> dict:
    mcts = BatchedMCTS(MCTSConfig(num_simulations=sims))
    rng = np.random.default_rng(0)
    obs = torch.randn(roots, 4, generator=torch.Generator().manual_seed(0))
    mcts.run(model, obs, rng, add_noise=True)  # warm-up (numba compile, allocator)
    timed = TimedModel(model)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or n < 3:
        mcts.run(timed, obs, rng, add_noise=True)
        n += 1
    total = time.perf_counter() - start
    return {"roots": roots, "num_simulations": sims, "searches": n * roots, "seconds": round(total, 3),
            "search_per_s": round(n * roots / total, 1), "batch_ms": round(1000 * total / n, 3),
            "network_s": round(timed.seconds, 3), "tree_fraction": round(1 - timed.seconds / total, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about a minute in total")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    arch = EfficientZeroAgent.validate_arch({})
    model = build_model((4,), 2, arch, torch.Generator().manual_seed(0)).eval()
    seconds = 3.0 if args.quick else 12.0
    results = []
    with torch.no_grad():
        for roots in (8, 64):
            for sims in (25, 50):
                r = measure(roots, sims, seconds, model)
                print(json.dumps(r), flush=True)
                results.append(r)
    out = {"benchmark": "mcts", "quick": args.quick, "model": "CartPole MLP (latent 64, LSTM 64, support 51/11)",
           "torch_threads": 1, "machine": cpu_name(), "results": results}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
