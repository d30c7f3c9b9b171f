#!/usr/bin/env bash
# Set up .venv and run the default test suite (slow and gpu tests are deselected; see README).
# Extra arguments go to pytest, e.g. `./scripts/test.sh -m slow` or `./scripts/test.sh tests/replay`.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh || exit 1
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# lint first: a tree ruff rejects fails the test command (rules in pyproject.toml)
.venv/bin/ruff check . || { echo "scripts/test.sh: ruff found problems (see above)" >&2; exit 1; }
.venv/bin/python -m pytest "$@"
code=$?
if [ "$code" -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests — treating that as a failure" >&2
  exit 1
fi
exit "$code"
