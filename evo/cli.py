"""The `evo` command: run, resume, new, runs, leaderboard, lineage, export, evaluate (and subcommands other
packages add through the `evo.commands` entry-point group, e.g. `evo dashboard`).

Exit codes: 0 success; 1 a run failed; 2 bad input (experiment file, arguments, unknown run);
130 interrupted (the run stays resumable from its last completed generation).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

__all__ = ["main"]

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def _parser(plugins: dict[str, Callable[[argparse.Namespace], int]] | None = None) -> argparse.ArgumentParser:
    """The argument parser; `plugins`, when given, receives the handlers of plugin subcommands."""
    p = argparse.ArgumentParser(prog="evo", description="Evolve populations of RL agents.")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="start a population run from an experiment file")
    run.add_argument("experiment", help="experiment TOML file")
    run.add_argument("--name", help="run name (default: the experiment's name, suffixed if taken)")
    run.add_argument("--backend", choices=["ray", "inline"], help="override the experiment's backend")
    run.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")
    run.add_argument("--generations", type=int, help="override population.generations")
    run.add_argument("--seed", type=int, help="override the experiment's seed")
    run.add_argument("--runs-dir", default="runs", help="where run directories live (default: runs)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a field of the experiment, e.g. --set population.size=8 "
                          "--set agent.hparams.lr.max=0.01 (a TOML value; repeatable; recorded in the run)")

    res = sub.add_parser("resume", help="continue an interrupted run from its last completed generation")
    res.add_argument("run")
    res.add_argument("--backend", choices=["ray", "inline"])
    res.add_argument("--address")
    res.add_argument("--generations", type=int, help="run until this many generations are complete")
    res.add_argument("--runs-dir", default="runs")
    for p_ in (run, res):
        p_.add_argument("--quiet", action="store_true",
                        help="no live view: one line per generation, no third-party progress bars or warnings (run.log has them)")
        p_.add_argument("--log", nargs=2, action="append", metavar=("KIND", "DIR"), default=[],
                        help="also log to tensorboard|mlflow under DIR (repeatable): sets the experiment's [logging] KIND")

    new = sub.add_parser("new", help="print a commented experiment file for a gymnasium env or a JSONL file of episodes",
                         description="Print a commented experiment file with defaults that run, after checking the "
                                     "environment (gymnasium registry) or every line of the data as evo run would. "
                                     "E.g. evo new --env CartPole-v1 > mine.toml")
    what = new.add_mutually_exclusive_group(required=True)
    what.add_argument("--env", metavar="ENV_ID", help="a gymnasium environment id (EfficientZero)")
    what.add_argument("--jsonl", metavar="FILE", help="episodes, one JSON object a line (ILQL; docs/ilql.md)")
    new.add_argument("--agent", help="the agent kind (default: efficientzero for --env, ilql for --jsonl)")
    new.add_argument("--pretrained", metavar="DIR", help="with --jsonl: a local GPT-2-family model directory to start from")
    new.add_argument("--name", help="the experiment's name (default: from the env id or the file name)")
    new.add_argument("--out", "-o", metavar="FILE", help="write FILE (refuses to overwrite) instead of printing")

    ls = sub.add_parser("runs", help="list runs with status, generations done and best score")
    ls.add_argument("--runs-dir", default="runs")

    lb = sub.add_parser("leaderboard", help="the last generation's members, elite first")
    lb.add_argument("run")
    lb.add_argument("--top", type=int)
    lb.add_argument("--format", choices=["table", "csv", "json"], default="table")
    lb.add_argument("--all", action="store_true",
                    help="show every hyperparameter and architecture key (default: only those that vary)")
    lb.add_argument("--runs-dir", default="runs")

    ex = sub.add_parser("export", help="write the elite (or --member) as a self-contained directory")
    ex.add_argument("run")
    ex.add_argument("--out", required=True)
    ex.add_argument("--member", type=int)
    ex.add_argument("--best", action="store_true",
                    help="the run's highest-scored kept checkpoint (of --member, or of any member) instead of "
                         "the last generation's")
    ex.add_argument("--runs-dir", default="runs")

    ev = sub.add_parser("evaluate", help="evaluate the elite (or --member) afresh on held-out episodes")
    ev.add_argument("run")
    ev.add_argument("--member", type=int)
    pick = ev.add_mutually_exclusive_group()
    pick.add_argument("--generation", type=int, help="that generation's checkpoint (default: the newest kept)")
    pick.add_argument("--best", action="store_true", help="the run's highest-scored kept checkpoint")
    ev.add_argument("--episodes", type=int, help="episodes to evaluate (default: the experiment's eval_episodes)")
    ev.add_argument("--seed", type=int, help="evaluation seed (default: the run seed + 1000, starts the run "
                                              "never selected on)")
    ev.add_argument("--format", choices=["table", "json"], default="table")
    ev.add_argument("--runs-dir", default="runs")

    li = sub.add_parser("lineage", help="a member's chain of ancestors and mutations")
    li.add_argument("run")
    li.add_argument("--member", type=int, required=True)
    li.add_argument("--runs-dir", default="runs")
    if plugins is not None:
        plugins.update(_plugin_commands(sub))
    return p


def _plugin_commands(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Subcommands from the `evo.commands` entry-point group: each entry point is a callable that
    adds its subparser to `sub` and returns the handler. The engine never imports their packages."""
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {}
    for ep in entry_points(group="evo.commands"):
        if ep.name in COMMANDS or ep.name in handlers:
            continue
        try:
            handlers[ep.name] = ep.load()(sub)
        except Exception as exc:  # a broken plugin must not take the built-in commands down with it
            sub.add_parser(ep.name, help=f"unavailable: {type(exc).__name__}: {exc}")
            handlers[ep.name] = _unavailable(ep.name, ep.value, exc)
    return handlers


def _unavailable(name: str, target: str, exc: Exception) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        print(f"evo {name}: cannot load {target}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return handler


def _status_cell(runs_dir: str, run: dict[str, Any]) -> str:
    """The run's status, "died" for a run marked running whose driver on this host is gone (killed),
    and its member failures (docs/faults.md)."""
    from evo.runstore import RunStore

    text = run["status"]
    try:
        store = RunStore.open(run["name"], runs_dir)
    except Exception:  # listing must never fail on one odd run directory
        return text
    try:
        host, _, pid = (store.get("driver") or "").rpartition(":")
        if text == "running" and host == socket.gethostname() and pid.isdigit() and not _alive(int(pid)):
            text = "died (driver gone)"
        failed = store.failures()
    finally:
        store.close()
    if failed:
        final = sum(1 for f in failed if not f.retried)
        retried = len(failed) - final
        text += " · " + ", ".join(part for part in (f"{final} failed" if final else "",
                                                    f"{retried} retried" if retried else "") if part)
    return text


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cmd_run(args: argparse.Namespace) -> int:
    from evo.api import start
    from evo.spec import parse_override

    overrides = dict(parse_override(text) for text in args.set)
    overrides.update(_log_overrides(args))
    return _finish(lambda: start(args.experiment, overrides=overrides, runs_dir=args.runs_dir, name=args.name,
                                 backend=args.backend, address=args.address, generations=args.generations,
                                 seed=args.seed, display="lines" if args.quiet else "auto", quiet=args.quiet))


def _finish(go: Callable[[], Any]) -> int:
    """Run `go` (evo.api's start or resume) and turn its outcome into a message and an exit code."""
    from evo.api import RunFailed, RunInterrupted

    try:
        run = go()
    except RunInterrupted as exc:
        print(f"\ninterrupted; resume with: evo resume {exc.run.name}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except RunFailed as exc:
        name = exc.run.name
        print(f"evo: run {name} failed: {type(exc.cause).__name__}: {exc.cause}", file=sys.stderr)
        print(f"the last completed generation is kept; after fixing the cause: evo resume {name}", file=sys.stderr)
        return EXIT_FAILED
    if run is not None:
        summary = run.summary()
        if summary["status"] == "completed" and summary["best_score"] is not None:
            from evo.api import stop_reason

            board = run.leaderboard(top=1)
            stopped = f" (stopped early: {stop_reason(summary['stopped_at_score'])})" if summary["stopped_at_score"] else ""
            print(f"run {summary['name']} completed: {summary['generations_done']} generations{stopped}, "
                  f"elite member {board['member'][0]} score {board['score'][0]:.4g} — {run.path}")
    return 0


def _log_overrides(args: argparse.Namespace) -> dict[str, str]:
    """`--log KIND DIR` is the experiment's `[logging] KIND = "DIR"` (checked like the file's own)."""
    return {f"logging.{kind}": directory for kind, directory in args.log}


def cmd_resume(args: argparse.Namespace) -> int:
    from evo.api import resume

    done: list[bool] = []

    def announce(text: str) -> None:
        print(text)
        done.append(text.startswith("run "))  # "already has N of N generations": nothing was run

    def go() -> Any:
        run = resume(args.run, args.runs_dir, generations=args.generations, backend=args.backend, address=args.address,
                     log=dict(args.log), display="lines" if args.quiet else "auto", quiet=args.quiet, announce=announce)
        return None if done and done[0] else run
    return _finish(go)


def cmd_new(args: argparse.Namespace) -> int:
    from evo.scaffold import new_experiment

    if args.out and Path(args.out).exists():
        print(f"evo: {args.out} exists; choose another --out or remove it", file=sys.stderr)
        return EXIT_USAGE
    text = new_experiment(env=args.env, jsonl=args.jsonl, agent=args.agent, pretrained=args.pretrained,
                          name=args.name, file=args.out or "mine.toml")
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}; run it with: evo run {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from evo.runstore import RunStore

    runs = RunStore.list_runs(args.runs_dir)
    if not runs:
        print(f"no runs in {args.runs_dir}")
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for col in ("run", "agent", "status", "generations", "best score", "diversity (last generation)", "updated"):
        table.add_column(col)
    for r in runs:
        best = "-" if r["best_score"] is None else f"{r['best_score']:.4g}"
        diversity = "-" if r.get("diversity") is None else r["diversity"].summary()
        table.add_row(r["name"], str(r["agent"]), _status_cell(args.runs_dir, r),
                      f"{r['generations_done']}/{r['generations']}", best,
                      diversity, time.strftime("%Y-%m-%d %H:%M", time.localtime(r["updated_at"])))
    Console(width=140).print(table)
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from evo.leaderboard import diversity_line, leaderboard_rows, render
    from evo.runstore import RunStore

    store = RunStore.open(args.run, args.runs_dir)
    rows = leaderboard_rows(store, args.top)
    if not rows and args.format == "table":
        print(f"run {store.name}: no completed generation yet (status {store.status})")
        return 0
    title = f"{store.name} — after {store.last_completed_generation() + 1} generations ({store.status})"
    diversity = diversity_line(store)  # flags members whose parameters are bit-identical
    title += f" · {diversity}" if diversity else ""
    # the table shows what differs between members; the full leaderboard (every row) decides what differs
    everyone = rows if args.top is None else leaderboard_rows(store)
    sys.stdout.write(render(rows, args.format, title, show_all=args.all, population=everyone))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from evo.export import export_member
    from evo.runstore import RunStore
    from evo.spec import SpecError

    store = RunStore.open(args.run, args.runs_dir)
    try:
        row, out = export_member(store, args.out, args.member, best=args.best)
    except SpecError:  # the run's experiment no longer parses: bad input, as everywhere else
        raise
    except ValueError as exc:  # the agent cannot write part of its export (e.g. no HF equivalent)
        print(f"evo: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"exported member {row['index']} (generation {row['generation']}, score {row['score']:.4g}) to {out}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from evo.heldout import evaluate_member
    from evo.runstore import RunStore

    store = RunStore.open(args.run, args.runs_dir, read_only=True)
    try:
        result = evaluate_member(store, args.member, generation=args.generation, best=args.best,
                                 episodes=args.episodes, seed=args.seed)
    except ValueError as exc:
        print(f"evo: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        store.close()
    if args.format == "json":
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0
    episodes = "" if result["episodes"] is None else f" over {result['episodes']} episodes"
    print(f"member {result['member']} (generation {result['generation']}): fitness {result['fitness']:.4g}{episodes} "
          f"from seed {result['seed']}; the run scored it {result['run_score']:.4g} "
          f"(fitness {result['run_fitness']:.4g}) ({result['seconds']:.1f} s)")
    return 0


def cmd_lineage(args: argparse.Namespace) -> int:
    from evo.records import MutationRecord
    from evo.runstore import RunStore

    store = RunStore.open(args.run, args.runs_dir)
    for m in store.lineage(args.member):
        best = "-" if m["best_score"] is None else f"{m['best_score']:.4g}"
        record = MutationRecord.from_json(m["mutation"])
        origin = "founder" if m["parent"] is None or record is None else f"child of {m['parent']} via {record.summary()}"
        print(f"member {m['index']:>4}  born gen {m['born']:>3}  best score {best:>10}  {origin}")
        if m["mutation"]:
            print(f"      mutation: {json.dumps(m['mutation'], sort_keys=True, default=str)}")
    return 0


COMMANDS = {"run": cmd_run, "resume": cmd_resume, "new": cmd_new, "runs": cmd_runs, "leaderboard": cmd_leaderboard,
            "export": cmd_export, "evaluate": cmd_evaluate, "lineage": cmd_lineage}


def main(argv: list[str] | None = None) -> int:
    from evo.checkpoint import CheckpointError
    from evo.runstore import RunStoreError
    from evo.spec import SpecError

    plugins: dict[str, Callable[[argparse.Namespace], int]] = {}
    args = _parser(plugins).parse_args(argv)
    try:
        return {**plugins, **COMMANDS}[args.command](args)
    except (SpecError, RunStoreError) as exc:
        print(f"evo: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CheckpointError as exc:
        print(f"evo: refusing a damaged checkpoint: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
