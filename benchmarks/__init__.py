"""Side-by-side benchmarks, each run as `python -m benchmarks.NAME [--quick] --json OUT.json`."""

from __future__ import annotations

import json
from typing import Any


def print_and_write(result: dict[str, Any], path: str | None) -> None:
    """Print a benchmark's result as indented JSON and, given `--json PATH`, write the same to PATH."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        with open(path, "w") as fh:
            fh.write(text)
