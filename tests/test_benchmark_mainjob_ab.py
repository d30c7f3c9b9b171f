"""benchmarks.mainjob_ab's refusals (its runs take minutes each: the measurement itself is not a test)."""

from __future__ import annotations

import subprocess
import sys

from benchmarks.mainjob_ab import ROOT


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.mainjob_ab", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_an_unknown_commit_is_refused_by_name_and_leaves_no_worktree() -> None:
    before = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    proc = run("--against", "no-such-commit-0123", "--pairs", "1")
    assert proc.returncode != 0 and "--against no-such-commit-0123: git worktree add failed" in proc.stderr
    assert subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout == before


def test_pairs_below_one_are_refused() -> None:
    proc = run("--against", "HEAD", "--pairs", "0")
    assert proc.returncode != 0 and "--pairs: expected >= 1, found 0" in proc.stderr
