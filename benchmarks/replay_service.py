"""Replay service benchmark: K client actors against one replay actor and against 2 and 4 shards.

    python -m benchmarks.replay_service [--quick] --json OUT.json

The peer is today's single replay actor (``shards = 1``, a ReplayService); the same clients then
run against a ShardedReplay of 2 and 4 actors, each sampled both ways — ``draw="one"`` (the
default: a whole batch from one shard chosen by its mass, one call) and ``draw="split"`` (a batch
split over every shard, N calls) — all in one run. Every store is built with the same settings
(uniform sampler, 200k rows of capacity, prefilled with 100k rows), and the configurations
alternate round by round; each keeps its best round (the least disturbed by other load on the
machine). Data: obs float32[8], action int64, reward float32, next_obs float32[8], done bool.

For each (K, configuration), K client actors (one logical CPU each) start together and for a fixed time
  * sample: call ``store.sample(256)`` in a loop;
  * insert: call ``store.insert`` with fresh chunks of 1000 rows (25% of them repeat earlier rows);
phases run apart (inserts do not depend on the draw: measured once per shard count). Fields per
(K, shards[, split]), aggregate over the K clients per wall-clock second:
  sample_batches_per_s, insert_rows_per_s
and, for the sample phase, CPU seconds per batch: ``client_cpu_ms`` (the K client processes),
``actor_cpu_ms`` (the replay actors' processes) and ``other_cpu_ms`` (the rest of the machine's busy
time: Ray's own processes and whatever else runs), read from /proc; ``model`` (docs/replay.md,
"Projection") is fitted from them. ``ratios``: each sharded figure over the 1-shard figure at the
same K. The target (issue 25): ``sample_batches_per_s`` at K = 4, 2 shards >= 1.0x one shard's on
this 2-core machine; ``cpus`` and ``load_avg`` record what this run had.
"""

from __future__ import annotations

import argparse
import os
import pickle
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

    def pid(self) -> int:
        return os.getpid()

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


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _busy_cpu_s() -> float:
    """Seconds every CPU of the machine spent not idle, since boot (/proc/stat)."""
    try:
        with open("/proc/stat") as fh:
            vals = [int(x) for x in fh.readline().split()[1:]]
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
        return (sum(vals[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return 0.0


def start_store(shards: int):
    kw = {"capacity": CAPACITY, "sampler": "uniform", "seed": 0}
    store = ReplayService.start(SCHEMA, **kw) if shards == 1 else ShardedReplay.start(SCHEMA, shards, **kw)
    for c in make_chunks(PREFILL // CHUNK, seed=7, dup_fraction=0.0):
        store.insert(c)
    return store


def actor_pids(store) -> list[int]:
    info = store.info()
    return [i["pid"] for i in (info if isinstance(info, list) else [info])]


def run_phase(ray, clients, store, phase: str, seconds: float, pids: dict) -> tuple[float, dict]:
    """Aggregate rate (batches or rows per second) of ``clients`` running ``phase`` together, and the
    CPU seconds the clients, the replay actors and the rest of the machine spent meanwhile."""
    start_at = time.time() + 1.0  # every client past its setup before the clock starts
    if phase == "sample":
        refs = [c.sample_for.remote(store, seconds, start_at) for c in clients]
    else:
        refs = [c.insert_for.remote(store, seconds, start_at) for c in clients]
    time.sleep(max(0.0, start_at - time.time()))
    procs = [pids[c] for c in clients] + actor_pids(store)
    before = [_proc_cpu_s(p) for p in procs] + [_busy_cpu_s()]
    out = ray.get(refs)
    after = [_proc_cpu_s(p) for p in procs] + [_busy_cpu_s()]
    d = [a - b for a, b in zip(after, before)]
    k = len(clients)
    cpu = {"clients": sum(d[:k]), "actors": sum(d[k:-1]), "busy": d[-1]}
    return sum(n for n, _ in out) / max(t for _, t in out), {**cpu, "count": sum(n for n, _ in out)}


def in_process_sample_ms() -> float:
    """Milliseconds of one ``sample(256)`` from an in-process store like the benchmark's: the store's
    own work in a call, without Ray (best of 5 rounds of 200)."""
    from evo.replay import ReplayStore

    store = ReplayStore(SCHEMA, capacity=CAPACITY, sampler="uniform", seed=0)
    for c in make_chunks(PREFILL // CHUNK, seed=7, dup_fraction=0.0):
        store.insert(c)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(200):
            store.sample(BATCH)
        best = min(best, (time.perf_counter() - t0) / 200)
    return 1e3 * best


def _per_call(obs: list[tuple[float, int]]) -> tuple[float, float]:
    """(base, per call) with value = base + calls * per call, from (value, calls) observations: the
    one-call value is the smallest one-call observation (the least disturbed, as the best round is),
    the per-call part the median extra per extra call of the others; base = one-call value - per call."""
    one = min(v for v, n in obs if n == 1)
    extra = [(v - one) / (n - 1) for v, n in obs if n > 1]
    per = max(0.0, float(np.median(extra))) if extra else 0.0
    return one - per, per


def model_rate(m: dict, cores: float, clients: int, shards: int, draw: str) -> float:
    """Batches per second the per-call cost model predicts (docs/replay.md, "Projection"): the least of
    what the clients can ask for (each waits for its batch: K / latency), what the cores our processes
    get can run (client and actor CPU per batch) and what the replay actors can answer (each runs one
    call at a time: one-shard draws spread batches over the shards, a split batch calls every shard).
    ``cores``: the machine's; our processes get ``m["core_share"]`` of them."""
    calls = 1 if draw == "one" or shards == 1 else shards
    latency_ms = m["latency_ms"][0] + calls * m["latency_ms"][1]
    cpu_ms = m["client_cpu_ms"][0] + calls * (m["client_cpu_ms"][1] + m["actor_ms_per_call"])
    actors = (shards if calls == 1 else 1) * 1e3 / m["actor_ms_per_call"]
    return min(clients * 1e3 / latency_ms, cores * m["core_share"] * 1e3 / cpu_ms, actors)


def fit_model(res: dict) -> dict:
    """Per-call costs from this run's rows, then the model's predictions for this machine's cores (to
    check against the measured table) and for 16. Latency: the K = 1 rows (one client waiting for each
    batch) against the calls per batch; client CPU: the same rows; actor CPU per call: the median over
    every row. ``core_share``: the share of the machine's cores the clients and actors got when they
    saturated it (K = 4, one actor: their CPU seconds per second / cores) — the rest went to Ray's own
    processes and to whatever else ran (``other_cpu_ms``); the projection assumes the same share."""
    t = res["results"]
    rows = list(t.values())
    ncalls = [1 if r["draw"] != "split" else r["shards"] for r in rows]
    k1 = [(r, n) for r, n in zip(rows, ncalls) if r["clients"] == 1]
    latency = _per_call([(1e3 / r["sample_batches_per_s"], n) for r, n in k1])
    client = _per_call([(r["client_cpu_ms"], n) for r, n in k1])
    sat = t[f"K{max(CLIENTS)}_shards1"]
    here = res["cpus"]
    m = {"latency_ms": latency, "client_cpu_ms": client,
         "actor_ms_per_call": float(np.median([r["actor_cpu_ms"] / n for r, n in zip(rows, ncalls)])),
         "core_share": (sat["client_cpu_ms"] + sat["actor_cpu_ms"]) * sat["sample_batches_per_s"] / 1e3 / here,
         "store_work_ms": res.get("in_process_sample_ms")}
    pred: dict[str, dict] = {}
    errors = []
    for key, r in t.items():
        draw = r["draw"] or "one"
        mine = model_rate(m, here, r["clients"], r["shards"], draw)
        pred[key] = {"measured": r["sample_batches_per_s"], f"model_{here}_cores": mine,
                     "model_16_cores": model_rate(m, 16, r["clients"], r["shards"], draw)}
        errors.append(abs(mine / r["sample_batches_per_s"] - 1))
    m["predictions"] = pred
    m["median_abs_error_here"] = float(np.median(errors))
    m["K4_shards2_vs_1_here"] = pred["K4_shards2"][f"model_{here}_cores"] / pred["K4_shards1"][f"model_{here}_cores"]
    m["K4_shards2_vs_1_at_16_cores"] = pred["K4_shards2"]["model_16_cores"] / pred["K4_shards1"]["model_16_cores"]
    m["K4_shards4_vs_1_at_16_cores"] = pred["K4_shards4"]["model_16_cores"] / pred["K4_shards1"]["model_16_cores"]
    return m


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
    ray.init(address="local", num_cpus=max(cpus, max(CLIENTS)), include_dashboard=False, log_to_driver=False,
             configure_logging=False, object_store_memory=512 * 1024**2)
    res: dict = {"quick": args.quick, "python": platform.python_version(), "numpy": np.__version__,
                 "ray": ray.__version__, "cpus": cpus, "batch": BATCH, "chunk": CHUNK, "capacity": CAPACITY,
                 "prefill": PREFILL, "dup_fraction": DUP_FRACTION, "seconds_per_measurement": seconds,
                 "rounds": rounds, "load_avg_start": load_avg()}
    try:
        actor = ray.remote(num_cpus=1)(Client)
        clients = [actor.remote(i) for i in range(max(CLIENTS))]
        ray.get([c.ready.remote() for c in clients])
        pids = dict(zip(clients, ray.get([c.pid.remote() for c in clients])))
        stores = {s: start_store(s) for s in SHARDS}
        configs = {(s, "one"): stores[s] for s in SHARDS}  # shards = 1: the ReplayService itself
        for s in SHARDS[1:]:
            split = pickle.loads(pickle.dumps(stores[s]))  # the same shard actors, drawn the other way
            split.draw = "split"
            configs[(s, "split")] = split
        res["in_process_sample_ms"] = in_process_sample_ms()
        best: dict[tuple, float] = {}
        cpu: dict[tuple, dict] = {}
        for _ in range(rounds):
            for k in CLIENTS:
                for (s, draw), store in configs.items():  # alternate configurations within a round
                    for phase in ("sample", "insert") if draw == "one" else ("sample",):
                        rate, used = run_phase(ray, clients[:k], store, phase, seconds, pids)
                        if rate > best.get((k, s, draw, phase), 0.0):
                            best[(k, s, draw, phase)], cpu[(k, s, draw, phase)] = rate, used
        table = {}
        for k in CLIENTS:
            for (s, draw) in configs:
                row = {"clients": k, "shards": s, "draw": draw if s > 1 else None,
                       "sample_batches_per_s": best[(k, s, draw, "sample")]}
                if draw == "one":
                    row["insert_rows_per_s"] = best[(k, s, draw, "insert")]
                used = cpu[(k, s, draw, "sample")]
                n = max(1, used["count"])
                row.update({"client_cpu_ms": 1e3 * used["clients"] / n, "actor_cpu_ms": 1e3 * used["actors"] / n,
                            "other_cpu_ms": 1e3 * max(0.0, used["busy"] - used["clients"] - used["actors"]) / n})
                table[f"K{k}_shards{s}" + ("_split" if draw == "split" else "")] = row
        res["results"] = table
        ratios = {}
        for k in CLIENTS:
            for (s, draw) in configs:
                if s == 1:
                    continue
                r = {"sample": best[(k, s, draw, "sample")] / best[(k, 1, "one", "sample")]}
                if draw == "one":
                    r["insert"] = best[(k, s, draw, "insert")] / best[(k, 1, "one", "insert")]
                ratios[f"K{k}_shards{s}" + ("_split" if draw == "split" else "") + "_vs_1"] = r
        res["ratios"] = ratios
        res["target"] = {"K4_shards2_vs_1_sample": 1.0, "measured": ratios["K4_shards2_vs_1"]["sample"],
                         "split": ratios["K4_shards2_split_vs_1"]["sample"],
                         "note": "on this machine (see cpus and load_avg); 1.7x is the projection's for 16 cores"}
        res["model"] = fit_model(res)
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
