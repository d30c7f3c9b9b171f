"""Environment variables set for a while, then put back as they were."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

__all__ = ["environ_restored"]


@contextlib.contextmanager
def environ_restored(names: Iterable[str]) -> Iterator[None]:
    """On exit, each of `names` is as it was on entry: its value again, or unset if it was unset —
    whatever the block set, changed or removed meanwhile."""
    before = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
