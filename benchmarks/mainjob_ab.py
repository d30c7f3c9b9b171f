"""The main job end to end, this working tree against an earlier commit, runs alternated.

    python -m benchmarks.mainjob_ab --against REV [--pairs 2] [--generations N] [--experiment FILE]
        [--after-set KEY=VALUE ...] --json OUT.json

The issue's end-to-end yardstick (`./scripts/run-main.sh`: `evo run experiments/cartpole_efficientzero.toml`,
Ray, 4 members x 6 generations x 2,000 env steps) measured on both sides in one call: REV is checked out
into a temporary git worktree, and the two trees' main jobs run one after the other in ABBA order
(before, after, after, before, ...), so a load that drifts falls on both alike. Each run uses this
`.venv` with its own tree first on PYTHONPATH and as its working directory (every Ray worker inherits
both); the module path `evo` resolved to is recorded per run, so a run that picked up the wrong tree shows.
`--experiment FILE` (a path inside the repository, run from each tree) measures another experiment the same way;
`--after-set KEY=VALUE` (repeatable) passes `--set KEY=VALUE` to this tree's runs only (an opt-in setting
the earlier commit does not have, e.g. `agent.task.autocast="bf16"`).

Per run: wall and generation seconds, the members' own train and evaluation seconds summed (from its
run store; the train seconds also per generation), the elite's score and the load average. Summary:
each side's median and the ratios before / after (`speedup_*`: above 1 is faster now). The runs' elites
differ (float rounding, and the code under test may change what members sample), so read the scores as
a check that both learned.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "experiments/cartpole_efficientzero.toml"


def main_job_run(tree: Path, runs_dir: Path, name: str, extra: list[str] | None = None,
                 env: dict[str, str] | None = None, generations: int | None = None,
                 experiment: str = EXPERIMENT) -> dict[str, Any]:
    """One `evo run` of `tree`'s `experiment` (the main job's by default), with `tree` first on
    PYTHONPATH; a row of figures."""
    import evo

    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
           "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    evo_bin = Path(sys.executable).parent / "evo"
    cmd = [str(evo_bin), "run", str(tree / experiment), "--quiet", "--runs-dir", str(runs_dir), "--name", name,
           *(extra or [])]
    if generations:
        cmd += ["--generations", str(generations)]
    resolved = subprocess.run([sys.executable, "-c", "import evo; print(evo.__file__)"], env=env, cwd=tree,
                              capture_output=True, text=True).stdout.strip()
    load0 = os.getloadavg()
    w0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - w0
    elapsed = re.findall(r"([0-9.]+) s elapsed", proc.stdout)
    row: dict[str, Any] = {"name": name, "evo_module": resolved, "rc": proc.returncode, "wall_s": round(wall, 1),
                           "generations_s": float(elapsed[-1]) if elapsed else None,
                           "load_start": [round(x, 2) for x in load0], "load_end": [round(x, 2) for x in os.getloadavg()]}
    if proc.returncode != 0:
        row["stderr_tail"] = proc.stderr[-2000:]
        return row
    try:  # an old tree's run store, read by this tree's evo
        ev = evo.open_run(str(runs_dir / name)).evaluations()
    except Exception as err:  # the timings above still stand
        row["store_error"] = repr(err)
        return row
    arch_cols = [c for c in ev.columns if c.startswith("arch.")]
    row["distinct_architectures"] = int(ev[arch_cols].astype(str).drop_duplicates().shape[0])
    row["compile_seconds"] = round(float(ev.get("train.compile_seconds", ev["wall_s"] * 0).sum()), 1)
    row["member_train_s"] = None
    if "train.train_seconds" in ev:  # also per generation (every member trains the file's steps_per_generation)
        by_generation = ev.groupby("generation")["train.train_seconds"].sum()
        row["member_train_s"] = round(float(by_generation.sum()), 1)
        row["member_train_s_by_generation"] = [round(float(x), 1) for x in by_generation]
    row["member_eval_s"] = round(float(ev.get("metric.eval_seconds", ev["wall_s"] * 0).sum()), 1)
    row["best_score"] = float(ev["score"].max())
    return row


def _commit(tree: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the commit (or branch, tag) to measure against")
    parser.add_argument("--pairs", type=int, default=2, help="before/after pairs, alternated ABBA (default 2)")
    parser.add_argument("--generations", type=int, default=None, help="generations per run (default: the file's 6)")
    parser.add_argument("--experiment", default=EXPERIMENT, help=f"a file inside the repository (default: {EXPERIMENT})")
    parser.add_argument("--after-set", action="append", default=[], metavar="KEY=VALUE",
                        help="an `evo run --set` for this tree's runs only (repeatable)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.pairs < 1:
        raise SystemExit(f"--pairs: expected >= 1, found {args.pairs}")
    work = Path(tempfile.mkdtemp(prefix="evo-mainjob-ab-"))
    before = work / "before"
    made = subprocess.run(["git", "worktree", "add", "--detach", str(before), args.against], cwd=ROOT,
                          capture_output=True, text=True)
    if made.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise SystemExit(f"--against {args.against}: git worktree add failed: {made.stderr.strip()}")
    trees = {"before": before, "after": ROOT}
    out: dict[str, Any] = {"against": args.against, "experiment": args.experiment, "generations": args.generations,
                           "after_set": args.after_set,
                           "commits": {k: _commit(t) for k, t in trees.items()},
                           "dirty_after": bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                                              cwd=ROOT, capture_output=True, text=True).stdout.strip()),
                           "cpus": os.cpu_count(), "runs": []}
    try:
        for pair in range(args.pairs):
            for side in (("before", "after") if pair % 2 == 0 else ("after", "before")):
                extra = [a for kv in args.after_set for a in ("--set", kv)] if side == "after" else []
                row = {"side": side, **main_job_run(trees[side], work / "runs", f"{side}{pair}", extra,
                                                    generations=args.generations, experiment=args.experiment)}
                print("mainjob", json.dumps(row), flush=True)
                out["runs"].append(row)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    for key in ("generations_s", "member_train_s", "wall_s"):
        med = {side: statistics.median(r[key] for r in out["runs"] if r["side"] == side and r.get(key))
               for side in trees if any(r["side"] == side and r.get(key) for r in out["runs"])}
        out[f"median_{key}"] = med
        if len(med) == 2:
            out[f"speedup_{key}"] = round(med["before"] / med["after"], 3)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}))


if __name__ == "__main__":
    main()
