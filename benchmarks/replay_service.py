"""Replay service benchmark: K client actors against one replay actor and against 2 and 4 shards.

    python -m benchmarks.replay_service [--quick] --json OUT.json

The peer is today's single replay actor (``shards = 1``, a ReplayService); the same clients then
run against a ShardedReplay of 2 and 4 actors, all in one run. Every store is built with the same
settings (uniform sampler, 200k rows of capacity, prefilled with 100k rows), and the
configurations alternate round by round; each keeps its best round (the least disturbed by other
load on the machine). Data: obs float32[8], action int64, reward float32, next_obs float32[8],
done bool.

For each (K, shards), K client actors (one logical CPU each) start together and for a fixed time
  * sample: call ``store.sample(256)`` in a loop;
  * insert: call ``store.insert`` with fresh chunks of 1000 rows (25% of them repeat earlier rows);
phases run apart. Fields per (K, shards), aggregate over the K clients per wall-clock second:
  sample_batches_per_s, insert_rows_per_s
and ``ratios``: each sharded figure over the 1-shard figure at the same K. The target (issue 12):
``sample_batches_per_s`` at K = 4 from 1 to 2 shards >= 1.7x, on a machine with cores to spare
(16); ``cpus`` and ``load_avg`` record what this run had. A sharded sample (or insert) is one call
to every shard, in parallel; a single actor's is one call.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from benchmarks import print_and_write

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from evo.replay import Field, ReplayService, Schema
from evo.replay.sharded import ShardedReplay

CHUNK = 1000
BATCH = 256
CAPACITY = 200_000
PREFILL = 100_000
DUP_FRACTION = 0.25
SHARDS = (1, 2, 4)
CLIENTS = (1, 2, 4)
SCHEMA = Schema({"obs": Field("float32", (8,)), "action": Field("int64"), "reward": Field("float32"),
                 "next_obs": Field("float32", (8,)), "done": Field("bool")})


def make_chunks(n: int, seed: int, dup_fraction: float = DUP_FRACTION) -> list[dict[str, np.ndarray]]:
    """``n`` chunks of CHUNK rows; after the first, ``dup_fraction`` of each chunk's rows repeat the previous chunk's."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, np.ndarray]] = []
    for i in range(n):
        c = {"obs": rng.standard_normal((CHUNK, 8), dtype=np.float32), "action": rng.integers(0, 4, CHUNK),
             "reward": rng.standard_normal(CHUNK, dtype=np.float32),
             "next_obs": rng.standard_normal((CHUNK, 8), dtype=np.float32), "done": rng.random(CHUNK) < 0.05}
        d = int(CHUNK * dup_fraction)
        if i and d:
            for k in c:
                c[k][:d] = out[-1][k][-d:]
        out.append(c)
    return out


class Client:
    """One client process: samples or inserts in a loop from a common start time for a fixed time."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.round = 0

    def ready(self) -> bool:
        return True

    def sample_for(self, store, seconds: float, start_at: float) -> tuple[int, float]:
        store.sample(BATCH)  # connect (first call) before the clock starts
        time.sleep(max(0.0, start_at - time.time()))
        t0 = time.perf_counter()
        n = 0
        while time.perf_counter() - t0 < seconds:
            store.sample(BATCH)
            n += 1
        return n, time.perf_counter() - t0

    def insert_for(self, store, seconds: float, start_at: float) -> tuple[int, float]:
        """Chunks made from a small pool of base chunks, each with its own action offset (so its rows
        are new) and its first 25% copied from the previous chunk (duplicates)."""
        self.round += 1
        base = make_chunks(16, seed=1_000_003 * self.round + self.index, dup_fraction=0.0)
        d = int(CHUNK * DUP_FRACTION)
        offset = (self.round * 64 + self.index) << 32  # no two clients or rounds share rows
        prev = None
        time.sleep(max(0.0, start_at - time.time()))
        t0 = time.perf_counter()
        n = 0
        while time.perf_counter() - t0 < seconds:
            c = dict(base[n // CHUNK % len(base)])
            c["action"] = c["action"] + (offset + n)
            if prev is not None and d:
                c = {k: np.concatenate([prev[k][-d:], v[d:]]) for k, v in c.items()}
            store.insert(c)
            prev = c
            n += CHUNK
        return n, time.perf_counter() - t0


def start_store(shards: int):
    kw = {"capacity": CAPACITY, "sampler": "uniform", "seed": 0}
    store = ReplayService.start(SCHEMA, **kw) if shards == 1 else ShardedReplay.start(SCHEMA, shards, **kw)
    for c in make_chunks(PREFILL // CHUNK, seed=7, dup_fraction=0.0):
        store.insert(c)
    return store


def run_phase(ray, clients, store, phase: str, seconds: float) -> float:
    """Aggregate rate (batches or rows per second) of ``clients`` running ``phase`` together."""
    start_at = time.time() + 1.0  # every client past its setup before the clock starts
    if phase == "sample":
        refs = [c.sample_for.remote(store, seconds, start_at) for c in clients]
    else:
        refs = [c.insert_for.remote(store, seconds, start_at) for c in clients]
    out = ray.get(refs)
    return sum(n for n, _ in out) / max(t for _, t in out)


def load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one round of 2 s per measurement (~2 minutes)")
    ap.add_argument("--json", default=None, help="write results here")
    args = ap.parse_args(argv)
    seconds, rounds = (2.0, 1) if args.quick else (4.0, 3)

    import ray

    cpus = os.cpu_count() or 1
    # one logical CPU per client even where the machine has fewer cores (recorded in `cpus`)
    ray.init(num_cpus=max(cpus, max(CLIENTS)), include_dashboard=False, log_to_driver=False,
             configure_logging=False, object_store_memory=512 * 1024**2)
    res: dict = {"quick": args.quick, "python": platform.python_version(), "numpy": np.__version__,
                 "ray": ray.__version__, "cpus": cpus, "batch": BATCH, "chunk": CHUNK, "capacity": CAPACITY,
                 "prefill": PREFILL, "dup_fraction": DUP_FRACTION, "seconds_per_measurement": seconds,
                 "rounds": rounds, "load_avg_start": load_avg()}
    try:
        actor = ray.remote(num_cpus=1)(Client)
        clients = [actor.remote(i) for i in range(max(CLIENTS))]
        ray.get([c.ready.remote() for c in clients])
        stores = {s: start_store(s) for s in SHARDS}
        best: dict[tuple[int, int, str], float] = {}
        for _ in range(rounds):
            for k in CLIENTS:
                for s in SHARDS:  # alternate configurations within a round
                    for phase in ("sample", "insert"):
                        rate = run_phase(ray, clients[:k], stores[s], phase, seconds)
                        best[(k, s, phase)] = max(best.get((k, s, phase), 0.0), rate)
        table = {}
        for k in CLIENTS:
            for s in SHARDS:
                table[f"K{k}_shards{s}"] = {"clients": k, "shards": s,
                                            "sample_batches_per_s": best[(k, s, "sample")],
                                            "insert_rows_per_s": best[(k, s, "insert")]}
        res["results"] = table
        res["ratios"] = {
            f"K{k}_shards{s}_vs_1": {
                "sample": best[(k, s, "sample")] / best[(k, 1, "sample")],
                "insert": best[(k, s, "insert")] / best[(k, 1, "insert")]}
            for k in CLIENTS for s in SHARDS if s > 1}
        res["target"] = {"K4_shards2_vs_1_sample": 1.7, "measured": res["ratios"]["K4_shards2_vs_1"]["sample"],
                         "note": "for a 16-core machine; see cpus and load_avg"}
        res["store_stats"] = {f"shards{s}": stores[s].stats() for s in SHARDS}
        for st in stores.values():
            st.stop()
    finally:
        res["load_avg_end"] = load_avg()
        ray.shutdown()
    print_and_write(res, args.json)
    return res


if __name__ == "__main__":
    main()
