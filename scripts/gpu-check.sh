#!/usr/bin/env bash
# scripts/gpu-check.sh [OUT] - on a machine with a GPU: builds from this
# checkout and runs the GPU suite (tests/gpu) against the real driver and
# runtime, plus the whole fake-CUDA suite for comparison, and writes the raw
# output with the device, driver and CUDA versions and the commit to OUT
# (default docs/results/gpu-<commit>.txt).
set -u
cd "$(dirname "$0")/.."
commit=$(git rev-parse --short HEAD)$(git diff --quiet || echo "-dirty")
out=${1:-docs/results/gpu-$commit.txt}
mkdir -p "$(dirname "$out")"
exec > >(tee "$out") 2>&1
echo "# bfcshim GPU checks, commit $commit, $(date -u +%Y-%m-%d)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
nvcc --version 2>&1 | tail -1
[ -d build-gpu ] || meson setup build-gpu >/dev/null
meson compile -C build-gpu >/dev/null || { echo "build failed"; exit 1; }
meson test -C build-gpu --suite gpu --print-errorlogs -v
status=$?
meson test -C build-gpu --suite e2e --suite cli | tail -8
exit $status
