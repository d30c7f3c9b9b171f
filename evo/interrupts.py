"""Ctrl-C and SIGTERM for a running driver, robust to code that swallows KeyboardInterrupt.

Python raises KeyboardInterrupt wherever the main thread is when the signal is handled. Where that is
inside a library's own signal check (Ray's blocking calls poll for signals from C++ and turn them
into a status) or a finalizer, the exception can be lost and the run goes on — a Ctrl-C ignored
(seen once in a full test run: `tests/test_faults_ray.py`'s interrupted run completed instead). The
handler here also records the request, and the loops that wait — the Ray scheduler's wait loop and
the generation loop — call `check()`, which raises it again there.
"""

from __future__ import annotations

import signal
from typing import Any

_requested: int | None = None


def _handler(signum: int, frame: Any) -> None:
    global _requested
    _requested = signum
    raise KeyboardInterrupt(f"signal {signum}")


def install() -> dict[int, Any]:
    """Handle SIGINT and SIGTERM (a run stops on either, resumably); returns the previous handlers for
    `restore`. Main thread only (Python's rule for signal handlers)."""
    global _requested
    _requested = None
    return {sig: signal.signal(sig, _handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def restore(previous: dict[int, Any]) -> None:
    global _requested
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    _requested = None


def check() -> None:
    """Raise KeyboardInterrupt if a stop was requested since `install` (a no-op otherwise)."""
    if _requested is not None:
        raise KeyboardInterrupt(f"signal {_requested}")
