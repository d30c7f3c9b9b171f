"""The `evo` command: run, resume, runs, leaderboard, lineage, export (and subcommands other
packages add through the `evo.commands` entry-point group, e.g. `evo dashboard`).

Exit codes: 0 success; 1 a run failed; 2 bad input (experiment file, arguments, unknown run);
130 interrupted (the run stays resumable from its last completed generation).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from evo import interrupts

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

    res = sub.add_parser("resume", help="continue an interrupted run from its last completed generation")
    res.add_argument("run")
    res.add_argument("--backend", choices=["ray", "inline"])
    res.add_argument("--address")
    res.add_argument("--generations", type=int, help="run until this many generations are complete")
    res.add_argument("--runs-dir", default="runs")
    for p_ in (run, res):
        p_.add_argument("--quiet", action="store_true", help="no live view: one line per generation (for logs)")
        p_.add_argument("--log", nargs=2, action="append", metavar=("KIND", "DIR"), default=[],
                        help="also log to tensorboard|mlflow under DIR (repeatable): sets the experiment's [logging] KIND")

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
    ex.add_argument("--runs-dir", default="runs")

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


def _free_name(runs_dir: Path, name: str) -> str:
    if not (runs_dir / name).exists():
        return name
    n = 2
    while (runs_dir / f"{name}-{n}").exists():
        n += 1
    return f"{name}-{n}"


def _execute(store: Any, exp: Any, backend: str, address: str | None, generations: int | None,
             args: argparse.Namespace | None = None) -> int:
    from evo.display import RunDisplay
    from evo.faults import ResourceRequestError
    from evo.loggers import make_loggers
    from evo.observer import ObserverGroup
    from evo.population import evolve, start_backend

    total = generations or exp.population.generations
    display = RunDisplay(store.name, total, exp.population.size, backend,
                         steps_per_generation=exp.population.steps_per_generation,
                         quiet=bool(getattr(args, "quiet", False)))
    loggers = make_loggers(store, exp)
    scheduler, status = None, "failed"
    store.set(driver=f"{socket.gethostname()}:{os.getpid()}")  # `evo runs` tells a dead driver's run from a live one
    previous_handlers = interrupts.install()  # Ctrl-C and SIGTERM stop a run, resumably
    try:
        scheduler, context = start_backend(exp, backend, address)
        with display:
            evolve(exp, store, scheduler, context, total, observer=ObserverGroup([display, *loggers]))
        status = "completed"
    except ResourceRequestError as exc:  # nothing ran: an impossible request is bad input (exit 2)
        print(f"evo: {exc}", file=sys.stderr)
        _discard_if_unstarted(store)
        return EXIT_USAGE
    except KeyboardInterrupt:
        status = "interrupted"
        store.set(status="interrupted")
        print(f"\ninterrupted; resume with: evo resume {store.name}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        store.set(status="failed", error=f"{type(exc).__name__}: {exc}")
        print(f"evo: run {store.name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        print(f"the last completed generation is kept; after fixing the cause: evo resume {store.name}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        interrupts.restore(previous_handlers)
        if scheduler is not None:
            scheduler.close()
        for logger in loggers:
            logger.close(status)
    best = store.evaluations()
    if best:
        print(f"run {store.name} completed: {store.last_completed_generation() + 1} generations, "
              f"elite member {best[0]['index']} score {best[0]['score']:.4g} — {store.path}")
    return 0


def _discard_if_unstarted(store: Any) -> None:
    """A run that never saved its founders holds nothing: remove its directory (`evo run` made it a
    moment ago), so no half-made run is listed. A resumed run is left as it was."""
    if store.population(0):
        return
    path = store.path
    store.close()
    shutil.rmtree(path, ignore_errors=True)
    print(f"nothing was started; {path} removed", file=sys.stderr)


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
    from evo.loggers import check_logging
    from evo.runstore import RunStore
    from evo.spec import load_experiment

    overrides: dict[str, Any] = {}
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.generations is not None:
        overrides["population.generations"] = args.generations
    if args.backend is not None:
        overrides["backend"] = args.backend
    overrides.update(_log_overrides(args))
    exp, text = load_experiment(args.experiment, overrides)
    check_logging(exp, str(args.experiment))
    runs_dir = Path(args.runs_dir)
    name = args.name or _free_name(runs_dir, exp.name)
    store = RunStore.create(runs_dir, name, text, exp.to_json(), source=str(args.experiment))
    store.set(backend=exp.backend)
    return _execute(store, exp, exp.backend, args.address, None, args)


def _log_overrides(args: argparse.Namespace) -> dict[str, str]:
    """`--log KIND DIR` is the experiment's `[logging] KIND = "DIR"` (checked like the file's own)."""
    return {f"logging.{kind}": directory for kind, directory in args.log}


def cmd_resume(args: argparse.Namespace) -> int:
    from evo.loggers import check_logging
    from evo.runstore import RunStore
    from evo.spec import parse_experiment

    store = RunStore.open(args.run, args.runs_dir)
    overrides = {"population.generations": args.generations} if args.generations else {}
    overrides.update(_log_overrides(args))
    exp = parse_experiment(store.experiment(), f"{store.path}/experiment", overrides)
    check_logging(exp, f"{store.path}/experiment")
    done = store.last_completed_generation() + 1
    total = exp.population.generations
    # an async run ends after population.size x generations member-rounds (evo.steady), not on generations
    finished = (int(store.get("rounds_done") or 0) >= exp.population.size * total if exp.population.mode == "async"
                else done >= total)
    if finished:
        print(f"run {store.name} already has {done} of {total} generations; pass --generations N to extend it")
        return 0
    backend = args.backend or store.get("backend") or exp.backend
    if args.generations:
        data = store.experiment()
        data["population"]["generations"] = args.generations
        store.set(experiment=json.dumps(data, sort_keys=True))
    print(f"resuming {store.name} at generation {done} of {total}")
    return _execute(store, exp, backend, args.address, total, args)


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
        row, out = export_member(store, args.out, args.member)
    except SpecError:  # the run's experiment no longer parses: bad input, as everywhere else
        raise
    except ValueError as exc:  # the agent cannot write part of its export (e.g. no HF equivalent)
        print(f"evo: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"exported member {row['index']} (generation {row['generation']}, score {row['score']:.4g}) to {out}")
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


COMMANDS = {"run": cmd_run, "resume": cmd_resume, "runs": cmd_runs, "leaderboard": cmd_leaderboard,
            "export": cmd_export, "lineage": cmd_lineage}


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
