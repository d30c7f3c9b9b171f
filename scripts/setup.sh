#!/usr/bin/env bash
# Create .venv and install evo into it (idempotent: re-installs only when pyproject.toml changes).
# torch is installed first, pinned to the CPU build available here, so nothing pulls CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=${EVO_EXTRAS:-dev,dashboard,envs}   # dev: the test tools; dashboard: `evo dashboard`; envs: Atari, MinAtar
stamp=.venv/.evo-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $extras"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[$extras]" "torch==2.13.0"
  echo "$want" > "$stamp"
fi
