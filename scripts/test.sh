#!/usr/bin/env bash
# Set up .venv and run the default test suite (slow and gpu tests are deselected; see README).
# Extra arguments go to pytest, e.g. `./scripts/test.sh -m slow` or `./scripts/test.sh tests/replay`.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh || exit 1
# the dashboard's browser tests drive Debian's Chromium (never a browser downloaded at test time)
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "scripts/test.sh: installing Debian's chromium for the dashboard's browser tests" >&2
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; } >/dev/null \
      || { echo "scripts/test.sh: could not install chromium (apt-get failed)" >&2; exit 1; }
  else
    echo "scripts/test.sh: /usr/bin/chromium is missing; install it: sudo apt-get install chromium chromium-driver" >&2
    exit 1
  fi
fi
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# lint first: a tree ruff rejects fails the test command (rules in pyproject.toml)
.venv/bin/ruff check . || { echo "scripts/test.sh: ruff found problems (see above)" >&2; exit 1; }
# two pytest workers, a test file to each (pytest-xdist): most tests wait on Ray or subprocesses, so
# one core sat idle in a serial run (measured: 14 CPU-minutes in 17.5 minutes on 2 cores). A file
# stays on one worker: its module fixtures (a Ray cluster) start once. EVO_TEST_WORKERS=0: serial.
.venv/bin/python -m pytest -n "${EVO_TEST_WORKERS:-2}" --dist loadfile "$@"
code=$?
if [ "$code" -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests — treating that as a failure" >&2
  exit 1
fi
exit "$code"
