#!/usr/bin/env bash
# The `gpu` tests and the GPU benchmarks on a CUDA machine that reaches no package registry but whose
# python3 already holds a CUDA build of torch (numpy, numba, pandas, pytest...): how they first ran, on an
# NVIDIA H200 on 2026-11-26 (docs/testing.md). Where pip works, use `./scripts/test.sh -m gpu` instead.
#
#   ./scripts/gpu-offline.sh prepare   # here, with pip and a registry: wheels into .whl/ (Python 3.12, x86-64)
#   ./scripts/gpu-offline.sh run       # there: install .whl/ into /tmp/site, run the checks, results in $OUT
#
# `prepare` downloads what such an image lacks (Ray, gymnasium, pydantic, MinAtar, ...) and repacks Ray
# without its libraries evo never imports (RLlib, Data, Serve, Train, Tune, its Java jars and the
# dashboard's web client): the whole wheel is 79 MB, the repacked one ~28 MB, so the tree and its wheels
# travel to a remote machine under a 64 MiB limit. evo is not installed there, so `run` writes a
# dist-info naming evo's agent entry points (the registry finds `efficientzero`, `ilql` through them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION=${PY_VERSION:-3.12}
case "${1:-}" in
prepare)
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  mkdir -p .whl
  platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  for pkg in ray==2.60.0 gymnasium==1.4.0 farama-notifications pydantic==2.14.4 pydantic_core==2.50.5 \
             annotated-types typing-inspection tomli-w jsonschema jsonschema-specifications referencing rpds-py \
             minatar==1.0.15; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
      "${platforms[@]}" -d .whl "$pkg"
  done
  tmp=$(mktemp -d)
  (cd "$tmp" && unzip -q "$OLDPWD"/.whl/ray-*.whl \
     && rm -rf ray/jars ray/rllib ray/data ray/serve ray/llm ray/train ray/tune ray/dashboard/client \
     && tar -cf - ray ray-*.dist-info | xz -T2 -6 > "$OLDPWD/.whl/ray-slim.tar.xz")
  rm -rf "$tmp" .whl/ray-*.whl
  du -sh .whl
  ;;
run)
  OUT=${OUT:-$PWD/gpu-out}
  mkdir -p /tmp/site "$OUT"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  tar -xJf .whl/ray-slim.tar.xz -C /tmp/site
  d=/tmp/site/evo-0.1.0.dist-info
  mkdir -p "$d"
  printf 'Metadata-Version: 2.1\nName: evo\nVersion: 0.1.0\n' > "$d/METADATA"
  printf '[evo.agents]\nefficientzero = agents.efficientzero:EfficientZeroAgent\nilql = agents.ilql:ILQLAgent\n' \
    > "$d/entry_points.txt"
  export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
  nvidia-smi -L || true
  set +e
  # the files holding the gpu-marked tests (the others import the dashboard's and loggers' extras)
  timeout 300 python3 -m pytest -p no:cacheprovider -m gpu -q -rA tests/test_gpu.py tests/efficientzero/test_device.py \
    tests/test_api.py tests/test_benchmark_devices.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -12
  tests=${PIPESTATUS[0]}
  timeout 120 python3 -m benchmarks.efficientzero_speed --quick --device cuda --arms baseline,fast \
    --json "$OUT/efficientzero_speed_cuda.json" 2>&1 | tail -4
  timeout 90 python3 -m benchmarks.efficientzero_speed --quick --device cpu --arms baseline,fast \
    --json "$OUT/efficientzero_speed_cpu.json" 2>&1 | tail -4
  timeout 120 python3 -m benchmarks.fused --quick --skip selfplay,generation --sizes 1,4,16,64 --device cuda \
    --json "$OUT/fused_cuda.json" 2>&1 | tail -4
  exit "$tests"
  ;;
*)
  echo "usage: $0 prepare|run" >&2
  exit 2
  ;;
esac
