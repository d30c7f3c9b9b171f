#!/usr/bin/env bash
# The main job: set up .venv, then evolve a population of EfficientZero agents on CartPole-v1
# (local Ray, SQLite run store under runs/). Extra arguments go to `evo run` (e.g. --backend inline).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
.venv/bin/evo run experiments/cartpole_efficientzero.toml "$@"
