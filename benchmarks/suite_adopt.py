"""Adopt an ablation's runs as the suite's rows once a task's file has taken the ablation's settings.

    python -m benchmarks.suite_adopt --json benchmarks/results/suite.json --label batch128 \\
        [--why TEXT] [--dry-run] ABLATION.json [ABLATION.json ...]

An ablation (`python -m benchmarks.suite --set KEY=VALUE ... --json benchmarks/results/suite_ablations/X.json`)
runs a task's file with overrides. When the file then takes those settings, its runs are runs of the file
as it is now and can stand as the suite's rows. This does that move, and checks it:

* every run to adopt is finished (not partial, not `--quick`);
* the ablation's experiment (the file at the commit the run was made at, plus the ablation's `--set`
  overrides) parses to the same experiment as the file does now (`evo.spec.parse_experiment`, compared on
  `Experiment.to_json()`); otherwise it refuses, naming the keys that differ;
* one difference is allowed, because it is none: a run made with `task.autocast = "bf16"` is a run of a
  file that says "auto" when the run's machine (its JSON's "machine": a CPU with AVX-512 BF16 or AMX) and
  the file (a conv member, eager, float32, on the CPU) make "auto" bf16 (`auto_ran_as_bf16`);
* the agent code (agents/, evo/) that changed between the run's commit and now is listed, as a warning:
  the experiment is the same, the code that ran it may not be.

The suite's row of the same seed (and its random baseline) is kept under `runs_before_<label>` (and
`random_by_seed_before_<label>`); the adopted run takes the ablation's random baseline of its seed (the
same evaluation starts, its own draw of random actions) and a `provenance` {commit, command, file_as_now,
adopted_from, evidence}. The task's `verdict` is computed again. The table's "made at" column then shows
the run's commit (`benchmarks.suite.made_cell`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomllib

from benchmarks import suite

FileAt = Callable[[str, str], str]


class AdoptError(ValueError):
    """A run that cannot be adopted: the message says which and why."""


def file_at(commit: str, path: str) -> str:
    """The text of `path` (relative to the repository root) at `commit`."""
    proc = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=suite.ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AdoptError(f"{path} at commit {commit[:12]}: git show failed ({proc.stderr.strip()})")
    return proc.stdout


def code_changed_since(commit: str) -> list[str]:
    """The files under agents/ and evo/ that differ between `commit` and the working tree (empty when git cannot say)."""
    proc = subprocess.run(["git", "diff", "--name-only", commit, "--", "agents", "evo"], cwd=suite.ROOT,
                          capture_output=True, text=True)
    return proc.stdout.split() if proc.returncode == 0 else []


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


AUTOCAST = "agent.task.autocast"
#: the CPU flags with which `task.autocast = "auto"` is "bf16" (agents.efficientzero.learner.effective_autocast)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def auto_ran_as_bf16(experiment: dict[str, Any], machine: dict[str, Any] | None) -> bool:
    """Whether `task.autocast = "auto"` in `experiment` (an `Experiment.to_json()`) means "bf16" on `machine`
    (a benchmark JSON's "machine"): a conv member, eager, float32, on the CPU, which has bf16 instructions.
    Then a run made there with "bf16" ran what the file's "auto" runs."""
    flat = _flatten(experiment)
    flags = ((machine or {}).get("cpu") or {}).get("flags") or []
    return (flat.get("agent.arch.variant") == "conv" and flat.get("agent.task.compile", "off") == "off"
            and flat.get("agent.task.dtype", "float32") == "float32"
            and not flat.get("resources.gpus_per_member") and any(f in flags for f in BF16_CPU_FLAGS))


AUTO_NOTE = "; its autocast 'bf16' is what the file's 'auto' runs on its machine, a CPU with bf16 instructions"


def experiment_difference(task: str, text_then: str, overrides: dict[str, Any],
                          machine: dict[str, Any] | None = None) -> tuple[list[str], bool]:
    """The dotted keys whose values differ between `text_then` with `overrides` and the task's file now
    ("key: then -> now"), empty when the two parse to the same experiment; and whether `task.autocast`
    "bf16" then was counted equal to "auto" now, as it is where the run's `machine` makes "auto" bf16
    (`auto_ran_as_bf16`)."""
    from evo.spec import SpecError, parse_experiment

    path = suite.TASKS[task]["file"]
    try:
        then = parse_experiment(tomllib.loads(text_then), f"{path} (then)", overrides).to_json()
    except (SpecError, tomllib.TOMLDecodeError) as exc:  # the file then, or its overrides, no longer parse today
        raise AdoptError(f"{path} as it was, with --set {json.dumps(overrides)}, does not parse today: {exc}") from None
    now = parse_experiment(tomllib.loads((suite.ROOT / path).read_text()), path).to_json()
    a, b = _flatten(then), _flatten(now)
    auto_as_bf16 = a.get(AUTOCAST) == "bf16" and b.get(AUTOCAST) == "auto" and auto_ran_as_bf16(now, machine)
    if auto_as_bf16:
        a[AUTOCAST] = "auto"
    return [f"{key}: {a.get(key, '<absent>')!r} -> {b.get(key, '<absent>')!r}"
            for key in sorted(set(a) | set(b)) if a.get(key, "<absent>") != b.get(key, "<absent>")], auto_as_bf16


def adopt(results: dict[str, Any], ablation: dict[str, Any], source: str, label: str, why: str = "",
          read_file_at: FileAt | None = None) -> list[str]:
    """Move every finished run of `ablation` into `results` as its task's row of that seed (see the module's
    docstring); returns one line per adopted run. Raises `AdoptError` before changing anything when a run
    cannot be adopted. `read_file_at(commit, path)` gives a file's text at a commit (default: `file_at`, git)."""
    read_file_at = read_file_at or file_at
    if not label or not label.replace("_", "").isalnum():
        raise AdoptError(f"--label: expected letters, digits and underscores (e.g. batch128), found {label!r}")
    if ablation.get("quick"):
        raise AdoptError(f"{source}: made with --quick; its runs are smoke tests, not rows")
    overrides = ablation.get("overrides") or {}
    plan: list[tuple[str, dict[str, Any], dict[str, Any], bool]] = []
    for task, abl_entry in ablation.get("tasks", {}).items():
        if task not in suite.TASKS:
            raise AdoptError(f"{source}: unknown task {task!r}; the suite's are {list(suite.TASKS)}")
        for run in abl_entry.get("runs", []):
            where = f"{source}: {task} seed {run.get('seed')}"
            if run.get("partial") or not run.get("curve"):
                raise AdoptError(f"{where} is partial; finish it (--reuse) before adopting it")
            commits = (run.get("began_at_commit"), run.get("commit") or ablation.get("commit"))
            auto_as_bf16 = False
            for commit in dict.fromkeys(c for c in commits if c):  # a continued run: where it began, then where it ended
                differ, auto_as_bf16 = experiment_difference(task, read_file_at(commit, suite.TASKS[task]["file"]),
                                                             overrides, ablation.get("machine"))
                if differ:
                    raise AdoptError(f"{where} is not a run of the file as it is now (its file at {commit[:7]} with "
                                     f"--set {json.dumps(overrides)}): " + "; ".join(differ))
            # the same experiment evaluates on the same starts: without the ablation's own random baseline of
            # the seed (files made before runs measured one per seed), the suite's of that seed stands
            random = (abl_entry.get("random_by_seed") or {}).get(str(run["seed"])) or \
                (results.get("tasks", {}).get(task, {}).get("random_by_seed") or {}).get(str(run["seed"]))
            if random is None:
                raise AdoptError(f"{where}: neither it nor the suite has a random baseline of its seed")
            plan.append((task, run, random, auto_as_bf16))
    if not plan:
        raise AdoptError(f"{source}: no runs to adopt")
    lines = []
    for task, run, random, auto_as_bf16 in plan:
        entry = results.setdefault("tasks", {}).setdefault(task, {"runs": [], "file": suite.TASKS[task]["file"],
                                                                   "anchor": suite.TASKS[task]["anchor"]})
        seed = run["seed"]
        old = next((r for r in entry.get("runs", []) if r["seed"] == seed), None)
        if old is not None and old.get("curve") == run["curve"]:
            lines.append(f"{task} seed {seed}: already the suite's row (the same curve); left as it is")
            continue
        if old is not None:
            entry.setdefault(f"runs_before_{label}", []).append(old)
            old_random = entry.get("random_by_seed", {}).get(str(seed))
            if old_random is not None:
                entry.setdefault(f"random_by_seed_before_{label}", {})[str(seed)] = old_random
        new = {k: v for k, v in run.items() if k not in ("commit", "command", "file_sha256")}
        commit = run.get("commit") or ablation.get("commit") or "?"
        new["provenance"] = {
            "commit": commit[:7], "command": run.get("command") or ablation.get("command"), "file_as_now": True,
            "adopted_from": source,
            "evidence": f"adopted by benchmarks.suite_adopt --label {label}: its file at {commit[:7]} with --set "
                        f"{json.dumps(overrides)} parses to the file as it is now (checked equal"
                        + (AUTO_NOTE if auto_as_bf16 else "")
                        + ")" + (f"; {why}" if why else ""),
        }
        entry["runs"] = sorted([r for r in entry.get("runs", []) if r["seed"] != seed] + [new], key=lambda r: r["seed"])
        entry.setdefault("random_by_seed", {})[str(seed)] = random
        if seed == 0:  # the task's random baseline is seed 0's starts' (benchmarks.suite)
            entry["random"] = dict(random)
        note = f"seed {seed}: {label}, adopted from {source}"
        if old is not None:
            note += f" (the row before it in runs_before_{label}, its random baseline in random_by_seed_before_{label})"
        entry["runs_note"] = note + (". " + entry["runs_note"] if entry.get("runs_note") else "")
        entry["verdict"] = suite.verdict(task, entry)
        before = "none" if old is None else f"{old.get('final_best')}"
        lines.append(f"{task} seed {seed}: final best {before} -> {new.get('final_best')} (made at {commit[:7]})")
        changed = code_changed_since(commit) if commit != "?" else []
        if changed:
            lines.append(f"  warning: agents/ or evo/ changed since {commit[:7]}: {', '.join(changed[:8])}"
                         + (f" and {len(changed) - 8} more" if len(changed) > 8 else ""))
    return lines


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AdoptError(f"{path}: cannot read it as JSON ({exc})") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ablations", nargs="+", help="benchmarks.suite --json files made with --set")
    parser.add_argument("--json", required=True, help="the suite's results (benchmarks/results/suite.json)")
    parser.add_argument("--label", required=True, help="names the kept rows: runs_before_LABEL")
    parser.add_argument("--why", default="", help="a sentence for each run's provenance (e.g. the docs section)")
    parser.add_argument("--dry-run", action="store_true", help="check and report; write nothing")
    args = parser.parse_args(argv)
    out = Path(args.json)
    tasks: set[str] = set()
    try:
        results = read_json(out)
        for path in args.ablations:
            ablation = read_json(Path(path))
            tasks.update(ablation.get("tasks", {}))
            resolved = Path(path).resolve()
            source = str(resolved.relative_to(suite.ROOT)) if resolved.is_relative_to(suite.ROOT) else path
            for line in adopt(results, ablation, source, args.label, args.why):
                print(line)
    except AdoptError as exc:
        print(f"suite_adopt: {exc}", file=sys.stderr)
        return 2
    for task in sorted(tasks):
        v = results["tasks"][task]["verdict"]
        print(f"{task}: finals {v['finals']}, x random {v.get('x_random')}, met {v.get('met')}")
    if args.dry_run:
        print("--dry-run: nothing written")
        return 0
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}; now: python -m benchmarks.suite --table --json {out} --plot docs/img/suite.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
