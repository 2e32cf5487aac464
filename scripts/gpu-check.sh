#!/usr/bin/env bash
# scripts/gpu-check.sh [OUTDIR] - on a machine with a GPU: the correctness
# part of scripts/gpu-proof.sh alone: the versions, the build (with its
# fallbacks for images whose compiler cannot do LTO) and the GPU suite
# (tests/gpu) against the real driver and runtime. Output under OUTDIR
# (default docs/results/gpu-<commit>). The whole proof, frameworks and
# timings included: scripts/gpu-proof.sh.
set -u
cd "$(dirname "$0")/.." || exit 1
GPU_PROOF_STEPS="env build suite" exec scripts/gpu-proof.sh "$@"
