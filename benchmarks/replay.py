"""Replay store benchmark: evo.replay side by side with TorchRL on the same data, in one process.

    python -m benchmarks.replay [--quick] --json OUT.json

Data: obs float32[8], action int64, reward float32, next_obs float32[8], done bool; inserts in
chunks of 1000 rows, a fixed fraction of which repeat earlier rows (to exercise dedup); sample
batches of 256. Each measurement alternates ours/theirs for several rounds and keeps each side's
best round (the least disturbed by other load on the machine). torch and numpy run one thread.

Fields (rates are per wall-clock second):
  insert_per_s              rows offered to ReplayStore.insert (hash + content-checked dedup + FIFO)
  sample_batches_per_s      uniform sample(256) calls
  per_sample_batches_per_s  prioritised sample(256) calls at 1M capacity (non-uniform priorities)
  per_update_batches_per_s  update_priorities of 256 keys, same store (extra)
  hash_rows_per_s           hash_rows over whole rows
  dedup_ratio_checked       duplicates / rows offered over the insert run; every duplicate was
                            confirmed by a bitwise comparison of its content (collisions counted apart)
  torchrl                   {insert_per_s, sample_batches_per_s, hash_rows_per_s (QueryModule:
                            SipHash + HashToInt), siphash_rows_per_s (bare SipHash)} or null
  ratios                    ours / torchrl for each, with the issue's targets
  numba, numba_warmup_s     whether the numba kernels ran (EVO_REPLAY_NUMBA=0 forces numpy)
                            and the seconds spent compiling / loading them before timing started
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from benchmarks import print_and_write

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from evo.replay import (
    Field,
    ReplayStore,
    Schema,
    _kernels,
    hash_rows,
)

CHUNK = 1000
BATCH = 256
SCHEMA = Schema({"obs": Field("float32", (8,)), "action": Field("int64"), "reward": Field("float32"),
                 "next_obs": Field("float32", (8,)), "done": Field("bool")})


def make_chunks(n_chunks: int, dup_fraction: float, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Chunks of CHUNK rows; ``dup_fraction`` of the rows of each chunk after the first repeat
    rows of earlier chunks (as when several members insert the same transitions)."""
    rng = np.random.default_rng(seed)
    chunks = []
    for i in range(n_chunks):
        c = {
            "obs": rng.standard_normal((CHUNK, 8), dtype=np.float32),
            "action": rng.integers(0, 4, CHUNK),
            "reward": rng.standard_normal(CHUNK, dtype=np.float32),
            "next_obs": rng.standard_normal((CHUNK, 8), dtype=np.float32),
            "done": rng.random(CHUNK) < 0.05,
        }
        if i and dup_fraction > 0:
            nd = int(CHUNK * dup_fraction)
            src = chunks[int(rng.integers(max(0, i - 20), i))]
            rows = rng.choice(CHUNK, nd, replace=False)
            at = rng.choice(CHUNK, nd, replace=False)
            for k in c:
                c[k][at] = src[k][rows]
        chunks.append(c)
    return chunks


def best_rate(fn, rounds: int) -> float:
    return max(fn() for _ in range(rounds))


def timed(fn, units: float) -> float:
    t = time.perf_counter()
    fn()
    return units / (time.perf_counter() - t)


def torchrl_side():
    try:
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, ReplayBuffer
        from torchrl.data.map import QueryModule, SipHash
    except Exception as exc:  # torchrl is the optional `bench` extra
        print(f"torchrl not importable ({exc.__class__.__name__}: {exc}); reporting null", file=sys.stderr)
        return None
    torch.set_num_threads(1)
    return torch, TensorDict, LazyTensorStorage, ReplayBuffer, QueryModule, SipHash


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller run (~1 minute)")
    ap.add_argument("--json", default=None, help="write results here")
    ap.add_argument("--dup-fraction", type=float, default=0.25)
    args = ap.parse_args(argv)
    quick = args.quick
    rounds = 3 if quick else 5
    ins_cap = 200_000 if quick else 1_000_000
    n_chunks = 300 if quick else 1500  # rows offered per insert round
    sample_iters = 2000 if quick else 5000
    per_cap = 1_000_000
    # numba kernels: compile (or load from numba's on-disk cache) before any timing
    t0 = time.perf_counter()
    if _kernels.enabled():  # the generic kernels, then this schema's specialisations (insert, sample)
        _kernels.warmup()
        w = ReplayStore(SCHEMA, capacity=4 * CHUNK, sampler="prioritized", seed=0)
        for c in make_chunks(3, 0.5, seed=9):
            w.insert(c)
        w.sample(BATCH)
        del w
    jit_s = time.perf_counter() - t0
    chunks = make_chunks(n_chunks, args.dup_fraction)
    trl = torchrl_side()
    res: dict = {"quick": quick, "python": platform.python_version(), "numpy": np.__version__,
                 "cpus": os.cpu_count(), "chunk": CHUNK, "batch": BATCH, "dup_fraction": args.dup_fraction,
                 "insert_capacity": ins_cap, "per_capacity": per_cap,
                 "numba": _kernels.enabled(), "numba_warmup_s": jit_s}

    # ---- insert (hash + dedup + FIFO eviction), alternating with TorchRL's plain extend
    if trl:
        torch, TensorDict, LazyTensorStorage, ReplayBuffer, QueryModule, SipHash = trl
        tds = [TensorDict({k: torch.from_numpy(v) for k, v in c.items()}, batch_size=[CHUNK]) for c in chunks]
    ours_ins, theirs_ins, store = [], [], None
    for _ in range(rounds):
        store = ReplayStore(SCHEMA, capacity=ins_cap, seed=0)
        ours_ins.append(timed(lambda store=store: [store.insert(c) for c in chunks], n_chunks * CHUNK))
        if trl:
            rb = ReplayBuffer(storage=LazyTensorStorage(ins_cap), batch_size=BATCH)
            theirs_ins.append(timed(lambda rb=rb: [rb.extend(td) for td in tds], n_chunks * CHUNK))
    st = store.stats()
    res["insert_per_s"] = max(ours_ins)
    res["dedup_ratio_checked"] = st["duplicates"] / st["rows_inserted"]
    res["insert_stats"] = st

    # ---- uniform sampling from the filled stores
    ours_s, theirs_s = [], []
    for _ in range(rounds):
        ours_s.append(timed(lambda store=store: [store.sample(BATCH) for _ in range(sample_iters)], sample_iters))
        if trl:
            theirs_s.append(timed(lambda: [rb.sample() for _ in range(sample_iters)], sample_iters))
    res["sample_batches_per_s"] = max(ours_s)

    # ---- hashing
    ours_h, theirs_h, theirs_sip = [], [], []
    hchunks = chunks[: min(len(chunks), 200)]
    for _ in range(rounds):
        ours_h.append(timed(lambda: [hash_rows(SCHEMA, c) for c in hchunks], len(hchunks) * CHUNK))
        if trl:
            qm = QueryModule(in_keys=list(SCHEMA.fields), index_key="index", hash_module=SipHash())
            few = tds[:20]
            theirs_h.append(timed(lambda qm=qm, few=few: [qm(td.clone()) for td in few], len(few) * CHUNK))
            sip = SipHash()
            flat = [torch.cat([td[k].reshape(CHUNK, -1).view(torch.uint8) for k in SCHEMA.fields], 1) for td in few]
            theirs_sip.append(timed(lambda sip=sip, flat=flat: [sip(x) for x in flat], len(few) * CHUNK))
    res["hash_rows_per_s"] = max(ours_h)
    del store

    # ---- prioritised sampling at 1M capacity
    per = ReplayStore(SCHEMA, capacity=per_cap, sampler="prioritized", alpha=0.6, beta=0.4, seed=0)
    fill = make_chunks(per_cap // CHUNK, 0.0, seed=1)
    keys = np.concatenate([per.insert(c) for c in fill])
    del fill
    rng = np.random.default_rng(2)
    for i in range(0, keys.size, 100_000):  # non-uniform priorities over the whole tree
        per.update_priorities(keys[i : i + 100_000], rng.exponential(1.0, min(100_000, keys.size - i)) + 1e-3)
    res["per_sample_batches_per_s"] = best_rate(
        lambda per=per: timed(lambda: [per.sample(BATCH) for _ in range(sample_iters)], sample_iters), rounds)
    upd_keys = [keys[rng.integers(0, keys.size, BATCH)] for _ in range(200)]
    upd_p = rng.exponential(1.0, (200, BATCH)) + 1e-3
    res["per_update_batches_per_s"] = best_rate(
        lambda per=per: timed(lambda: [per.update_priorities(upd_keys[i], upd_p[i]) for i in range(200)], 200), rounds)
    del per, keys

    if trl:
        t = {"insert_per_s": max(theirs_ins), "sample_batches_per_s": max(theirs_s),
             "hash_rows_per_s": max(theirs_h), "siphash_rows_per_s": max(theirs_sip)}
        res["torchrl"] = t
        res["ratios"] = {
            "insert_vs_torchrl": res["insert_per_s"] / t["insert_per_s"],
            "sample_vs_torchrl": res["sample_batches_per_s"] / t["sample_batches_per_s"],
            "hash_vs_querymodule": res["hash_rows_per_s"] / t["hash_rows_per_s"],
            "hash_vs_siphash": res["hash_rows_per_s"] / t["siphash_rows_per_s"],
            "targets": {"insert_vs_torchrl": 1.0, "sample_vs_torchrl": 1.5, "hash_vs_querymodule": 5.0,
                        "per_sample_batches_per_s": 10_000},
        }
    else:
        res["torchrl"] = None
        res["ratios"] = None
    print_and_write(res, args.json)
    return res


if __name__ == "__main__":
    main()
