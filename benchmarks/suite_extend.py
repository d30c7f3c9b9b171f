"""Past the budget: carry a finished suite run on to more generations and report what it reached.

    python -m benchmarks.suite_extend RUN --generations G --json OUT [--runs-dir DIR]

A suite run stops at its task's budget (issue 23), and a miss there can be a run cut off while still
learning or one that has levelled off. Only the same run carried on tells them apart. This resumes the
RunStore RUN (a name under runs/suite/, or a path) to G generations with `evo resume`'s code, on the
run's own backend and settings. It then reports:

* every generation's best member and env steps (all members), as the suite's curve;
* the population's mean training return (`benchmarks.suite.train_returns`);
* random on the run's own evaluation starts, as the suite measures it (`benchmarks.suite.random_baseline`: at least
  10 starts, each played 20 times), and each best as a multiple of it;
* the last elite and the best checkpoint held out (50 fresh episodes; `benchmarks.suite.heldout`).

The suite's verdicts stay at the budget; this is a diagnosis of a miss, not a row. A run that already has
G generations is only reported; one stopped part way (an extension interrupted) goes on from its last
completed generation, as `evo resume` does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import suite


def store_path(run: str, runs_dir: Path) -> Path:
    """RUN as a RunStore directory: a path to one, or a name under `runs_dir`."""
    path = Path(run)
    path = path if (path / "run.sqlite").exists() else runs_dir / run
    if not (path / "run.sqlite").exists():
        raise SystemExit(f"{run}: no RunStore there or under {runs_dir}")
    return path


def report(path: Path, heldout_episodes: int) -> dict[str, Any]:
    """The run's curve per generation, its training returns, random on its starts and the held-out pair."""
    from evo.runstore import RunStore
    from evo.spec import parse_experiment

    store = RunStore.open(path, read_only=True)
    try:
        exp = parse_experiment(store.experiment(), f"{store.path}/experiment")
        done = store.last_completed_generation() + 1
        best = suite.best_per_generation(store)
        per_generation = exp.population.size * exp.population.steps_per_generation
        rnd = suite.random_baseline(exp.task, exp.seed)
        curve = [[(g + 1) * per_generation, best[g]] for g in range(done)]
        return {"run": store.name, "seed": exp.seed, "generations": done, "env_steps_per_generation": per_generation,
                "curve": curve, "train_return": suite.train_returns(store), "random": rnd,
                "x_random": [round(b / rnd["mean"], 2) if rnd["mean"] > 0 else None for _, b in curve],
                "heldout": suite.heldout(store, exp, heldout_episodes)}
    finally:
        store.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a RunStore name under --runs-dir, or its path")
    parser.add_argument("--generations", type=int, required=True, help="carry the run on until this many are complete")
    parser.add_argument("--runs-dir", type=Path, default=suite.RUNS_DIR, help="where RUN is (default runs/suite)")
    parser.add_argument("--json", required=True, help="write the report here")
    parser.add_argument("--heldout-episodes", type=int, default=suite.HELDOUT_EPISODES)
    args = parser.parse_args(argv)
    if args.generations < 1:
        parser.error(f"--generations: expected at least 1, found {args.generations}")

    from benchmarks.hpo.common import machine
    from evo.api import resume
    from evo.runstore import RunStore

    path = store_path(args.run, args.runs_dir)
    store = RunStore.open(path, read_only=True)
    try:
        before = store.last_completed_generation() + 1
    finally:
        store.close()
    load_start, started = os.getloadavg(), time.perf_counter()
    if args.generations > before:
        resume(path.name, path.parent, generations=args.generations, quiet=True,
               announce=lambda text: print(text, file=sys.stderr))
    seconds = time.perf_counter() - started
    out = report(path, args.heldout_episodes)
    out.update(generations_before=before, extension_wall_s=round(seconds, 1), loadavg_start=list(load_start),
               loadavg_end=list(os.getloadavg()), command="python -m benchmarks.suite_extend " + " ".join(
                   sys.argv[1:] if argv is None else argv), commit=suite._commit(), machine=machine())
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    held = out["heldout"]
    print(f"{out['run']}: {out['generations']} generations ({before} before); best per generation "
          f"{[b for _, b in out['curve']]}; x random {out['x_random'][-1]} (random {out['random']['mean']:.3f}); "
          f"held out {held['last_elite']['fitness']:.2f} (random {held['random']['mean']:.2f}); {seconds:.0f} s")
    return out


if __name__ == "__main__":
    main()
