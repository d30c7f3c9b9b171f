"""Loading a large `task = "jsonl"` file into the shared replay store: rows per second and memory.

    python -m benchmarks.ilql_jsonl [--episodes 100000] [--file F.jsonl] [--tokenizer char|DIR] --json OUT.json

Writes (or reuses) a JSONL file of Wordle games (agents.ilql.tasks.wordle.write_jsonl, text form;
`--distinct` games repeated up to `--episodes` lines: every line is still its own replay row),
then times the two passes a run makes in its driver: `validate_task` (reads and checks every line,
measures the longest episode) and `build_replay` (encodes the file chunk by chunk and inserts the
rows). Memory: the process's peak resident size before and after each pass (ru_maxrss), and the
bytes the store's rows take. The file is never held whole: peak growth should stay near the store's
own size plus one chunk.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agents.ilql.agent import ILQLAgent
from evo.replay import build_replay


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ilql_jsonl", description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--file", default="/tmp/evo_bench_wordle.jsonl", help="written if missing or of another size")
    parser.add_argument("--tokenizer", default="char")
    parser.add_argument("--chunk-rows", type=int, default=4096)
    parser.add_argument("--distinct", type=int, default=5000,
                        help="distinct games generated (the expert is slow); the file repeats them up to --episodes")
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args(argv)

    path = Path(args.file)
    lines = sum(1 for _ in open(path)) if path.exists() else 0
    write_s = 0.0
    if lines != args.episodes:  # in a child process, so its memory never counts in this one's peak
        t0 = time.perf_counter()
        base = path.with_suffix(".base.jsonl")
        n_base = min(args.episodes, args.distinct)
        subprocess.run([sys.executable, "-m", "agents.ilql.tasks.wordle", str(base), "--n-games", str(n_base)],
                       check=True, stdout=subprocess.DEVNULL)
        games = base.read_text().splitlines(keepends=True)
        with open(path, "w") as f:
            for i in range(args.episodes):
                f.write(games[i % n_base])
        base.unlink()
        write_s = time.perf_counter() - t0
    table = {"task": "jsonl", "path": str(path), "tokenizer": args.tokenizer, "chunk_rows": args.chunk_rows}

    rss0 = _rss_mib()
    t0 = time.perf_counter()
    task = ILQLAgent.validate_task(table)
    validate_s = time.perf_counter() - t0
    peak_validate = _peak_mib()
    spec = ILQLAgent.replay_spec(task)
    t0 = time.perf_counter()
    store = build_replay(spec, 0, distributed=False)
    load_s = time.perf_counter() - t0
    peak_load = _peak_mib()
    n = len(store)
    row_bytes = sum(f.row_bytes for f in spec.schema.fields.values())
    result = {
        "episodes": n, "file_mib": path.stat().st_size / 2**20, "write_s": write_s,
        "max_tokens": task["scan"]["max_tokens"], "max_actions": task["scan"]["max_actions"],
        "validate_s": validate_s, "validate_rows_per_s": n / validate_s,
        "load_s": load_s, "load_rows_per_s": n / load_s,
        "row_bytes": row_bytes, "rows_mib": n * row_bytes / 2**20,
        "rss_before_mib": rss0, "peak_after_validate_mib": peak_validate, "peak_after_load_mib": peak_load,
        "rss_after_load_mib": _rss_mib(),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}",
    }
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
