"""`evo dashboard [RUNS_DIR | RUN] [--host 127.0.0.1] [--port 8080]`, registered with the `evo`
command through the `evo.commands` entry-point group (pyproject.toml)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["register", "resolve_target"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# evo.runstore.DB_NAME, spelled out: every `evo` command loads this module to register `dashboard`,
# and importing the run store (torch, safetensors) would slow down `evo --help` by seconds
DB_NAME = "run.sqlite"


def register(subparsers: Any) -> Callable[[argparse.Namespace], int]:
    """Add the `dashboard` subcommand to `evo`'s parser; returns its handler."""
    p = subparsers.add_parser("dashboard", help="serve a live web dashboard of the runs (read-only)")
    p.add_argument("target", nargs="?", default="runs",
                   help="a runs directory (default: runs) or one run's directory (the page opens on it)")
    p.add_argument("--host", default="127.0.0.1",
                   help="interface to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--poll-ms", type=int, default=1500, help="how often the page checks for new generations")
    return serve


def resolve_target(target: str | Path) -> tuple[Path, str | None]:
    """(the runs directory, the run to open first or None) for a runs directory or a run directory."""
    path = Path(target)
    if (path / DB_NAME).is_file():
        return path.resolve().parent, path.resolve().name
    return path, None


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from dashboards.server import LOCAL_HOSTS, create_app

    runs_dir, run = resolve_target(args.target)
    if not runs_dir.is_dir():
        print(f"evo dashboard: {runs_dir} is neither a runs directory nor a run directory (no {DB_NAME})", file=sys.stderr)
        return 2
    hosts = list(LOCAL_HOSTS)
    if args.host not in LOOPBACK:
        hosts = ["*"] if args.host in ("0.0.0.0", "::") else [*hosts, args.host]
        print(f"evo dashboard: WARNING: listening on {args.host}, not 127.0.0.1: anyone who can reach this machine on "
              f"port {args.port} can read every run under {runs_dir.resolve()} (there is no login)", file=sys.stderr)
    app = create_app(runs_dir, default_run=run, hosts=hosts, poll_ms=args.poll_ms)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"evo dashboard: serving {runs_dir.resolve()} (read-only) at http://{shown}:{args.port}/ — Ctrl-C stops it",
          flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
