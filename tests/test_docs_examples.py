"""Every Python and shell example in README.md and docs/*.md runs, so the docs cannot drift from the code.

Sybil (a maintained doctest-for-documents library) finds the fenced ```python and ```bash blocks.
Each document runs in order in its own scratch directory that looks like the repository root
(`experiments/`, `.venv`, `scripts/` are links to the real ones; `runs/` and other outputs land in
the scratch directory): Python blocks share one namespace per document, in this process; bash
blocks run in `bash -e`. A block that cannot run here says so just above it with Sybil's skip
directive and a reason, `<!-- skip: next "why" -->` — long trainings, servers that run until
stopped, several machines, set-up scripts. A block that runs but costs more than a few seconds
carries `<!-- skip: next if(FAST, reason="...") -->`: the default test skips it, the `slow` one runs
every runnable block. `<!-- invisible-code-block: python -->` blocks (not shown on a rendered page)
give a sketch the names it uses.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unittest
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
LINKED = ("experiments", ".venv", "scripts", "tests", "agents", "evo", "benchmarks", "dashboards", "pyproject.toml")
FENCE = re.compile(r"^```(python|bash|sh|shell|console)\s*$", re.MULTILINE)
SKIP = re.compile(r"<!--\s*skip:\s*next(.*?)-->")
SLOW = re.compile(r'^if\(FAST, reason="[^"]{15,}"\)$')
INVISIBLE = re.compile(r"<!--\s*invisible-code-block:")


def run_bash(example) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(["bash", "-e", "-c", example.parsed], cwd=os.getcwd(), env=env, capture_output=True,
                          text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"{example.path}, line {example.line}: exit {proc.returncode}\n{example.parsed}\n"
                             f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")


SYBIL = Sybil(parsers=[PythonCodeBlockParser(), CodeBlockParser("bash", run_bash), CodeBlockParser("sh", run_bash),
                       SkipParser()])


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in LINKED:
        if (REPO / name).exists():
            (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setattr(sys, "argv", ["docs-example"])
    return tmp_path


@pytest.mark.parametrize("path", DOCUMENTS, ids=[p.relative_to(REPO).as_posix() for p in DOCUMENTS])
def test_every_example_in_the_docs_runs(path: Path, scratch: Path) -> None:
    run_examples(path, fast=True)


@pytest.mark.slow
@pytest.mark.parametrize("path", DOCUMENTS, ids=[p.relative_to(REPO).as_posix() for p in DOCUMENTS])
def test_every_example_in_the_docs_runs_slow_ones_too(path: Path, scratch: Path) -> None:
    run_examples(path, fast=False)


def run_examples(path: Path, fast: bool) -> None:
    document = SYBIL.parse(path)
    document.namespace["FAST"] = fast
    examples = list(document.examples())
    for example in examples:
        try:
            example.evaluate()
        except unittest.SkipTest:
            continue
    blocks = len(FENCE.findall(path.read_text()))
    visible = sum(1 for e in examples if isinstance(e.parsed, str)) - len(INVISIBLE.findall(path.read_text()))
    assert visible == blocks, f"{path.name}: {blocks} python/bash blocks, Sybil found {visible}"


#: examples that cannot run here at all (each says why above its block); raise it only with a reason
#: (20: the four benchmark blocks of docs/benchmarks.md's async, early-stopping and suite sections run for minutes
#: to hours and write the committed results — run here, they overwrote benchmarks/results/)
MAX_SKIPPED = 20


def test_every_skip_says_why_and_the_list_stays_short() -> None:
    reasons = {}
    for path in DOCUMENTS:
        for match in SKIP.finditer(path.read_text()):
            reason = match.group(1).strip()
            if SLOW.match(reason):
                continue  # runs, in the slow test
            assert re.fullmatch(r'"[^"]{15,}"', reason), f"{path.name}: a skip needs a quoted reason, found {reason!r}"
            reasons.setdefault(path.name, []).append(reason)
    total = sum(len(r) for r in reasons.values())
    assert total <= MAX_SKIPPED, f"{total} examples skipped (at most {MAX_SKIPPED}): {reasons}"
