"""`python -m evo.scheduler.watchdog DRIVER_PID TAG`: when the driver process ends (any way,
SIGKILL included), kill every process whose environment carries EVO_RAY_OWNER=TAG — the local
Ray cluster that driver started (evo.scheduler.cluster). Linux only (/proc); elsewhere it just
waits for the driver and exits.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from pathlib import Path

OWNER_ENV = "EVO_RAY_OWNER"


def wait_for_exit(pid: int, poll_s: float = 0.5) -> None:
    """Block until process `pid` has ended (a pidfd where the kernel has them: no PID-reuse race)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not poller.poll(60_000):
                pass
            return
        finally:
            os.close(fd)
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        time.sleep(poll_s)


def tagged_processes(tag: str, exclude: set[int] | None = None) -> list[int]:
    """PIDs of live processes (zombies have no environment left) started with EVO_RAY_OWNER=`tag`."""
    needle = f"{OWNER_ENV}={tag}".encode() + b"\0"
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if exclude and pid in exclude:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours
            continue
        if needle in environ or environ.endswith(needle[:-1]):
            out.append(pid)
    return out


def kill_tagged(tag: str, grace_s: float = 2.0, rounds: int = 5) -> int:
    """SIGTERM the tagged processes, SIGKILL what is left after `grace_s`; repeat while new ones
    appear (a dying raylet may still spawn a worker). Returns how many were signalled."""
    me = {os.getpid()}
    signalled: set[int] = set()
    for _ in range(rounds):
        pids = tagged_processes(tag, me)
        if not pids:
            break
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        signalled.update(pids)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and tagged_processes(tag, me):
            time.sleep(0.1)
        for pid in tagged_processes(tag, me):
            _signal(pid, signal.SIGKILL)
        time.sleep(0.2)
    return len(signalled)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m evo.scheduler.watchdog DRIVER_PID TAG", file=sys.stderr)
        return 2
    pid, tag = int(argv[0]), argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the driver is not for us
    wait_for_exit(pid)
    if sys.platform.startswith("linux"):
        kill_tagged(tag)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
