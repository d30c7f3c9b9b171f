"""Test-only Ray worker hook: refuse every write under one directory (tests/test_multinode.py).

`ray.init(runtime_env={"env_vars": {DRIVER_ONLY_ENV: DIR}, "worker_process_setup_hook":
"tests.driver_only.install"})` makes every worker process of the job (member actors, on every
node) install a Python audit hook that raises PermissionError on any attempt to create, open for
writing, rename, remove or connect SQLite to a path inside DIR. The driver installs none, so a run
directory under DIR can only be written by the driver: a worker that tried would fail its member.
"""

from __future__ import annotations

import os
import sys
from typing import Any

DRIVER_ONLY_ENV = "EVO_TEST_DRIVER_ONLY"

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATH_EVENTS = {  # audit event -> positions of its path arguments
    "os.mkdir": (0,), "os.rename": (0, 1), "os.remove": (0,), "os.rmdir": (0,), "os.truncate": (0,),
    "os.symlink": (1,), "os.link": (1,), "os.chmod": (0,), "shutil.rmtree": (0,), "shutil.copyfile": (1,),
    "shutil.move": (1,), "sqlite3.connect": (0,),
}


def _inside(path: Any, root: str) -> bool:
    if isinstance(path, int):  # a file descriptor: opened earlier, checked then
        return False
    try:
        text = os.fsdecode(path)
    except TypeError:
        return False
    if text.startswith("file:"):  # a SQLite URI
        text = text[5:].split("?", 1)[0]
    full = os.path.realpath(os.path.abspath(text))
    return full == root or full.startswith(root + os.sep)


def install() -> None:
    """Ray's worker_process_setup_hook: add the audit hook for DIR in this worker process."""
    root = os.environ.get(DRIVER_ONLY_ENV)
    if not root:
        return
    root = os.path.realpath(root)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writes and _inside(path, root):
                raise PermissionError(f"worker process {os.getpid()} may not write {path} (driver only)")
        elif event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                if i < len(args) and _inside(args[i], root):
                    raise PermissionError(f"worker process {os.getpid()} may not {event} {args[i]} (driver only)")

    sys.addaudithook(hook)
