#!/usr/bin/env bash
# scripts/demo.sh [OUTDIR] - what bfcshim does, in six steps, on a machine
# without a GPU: it builds the project, then runs a CUDA program under the
# shim on the fake GPU that comes with it, compares it with the native path,
# shows an out-of-memory report, writes the HTML report, replays real PyTorch
# traces through the engine, and says what to run next on a real GPU.
# Files go to OUTDIR (default demo-out/). BFCSHIM_BUILD names the build
# folder to use (default build/; scripts/check.sh passes its own).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${1:-demo-out}
build=${BFCSHIM_BUILD:-build}
scripts/deps.sh
[ -d "$build" ] || meson setup "$build" >/dev/null
meson compile -C "$build" >/dev/null
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=$(cd "$build" && pwd)
b=$build/bfcshim
job=$build/tests/e2e_workload # 4 steps of 20 cudaMalloc/cudaFree, 1 to 20 MiB
step() { printf '\n== %s\n   %s\n\n' "$1" "$2"; }

step "1/6 A CUDA program under the shim, on the fake GPU" \
    "bfcshim run --fake-gpu: a stand-in training loop (cudaMalloc/cudaFree through the runtime, LD_PRELOAD set by the command); its allocations come from one pool"
"$b" run --fake-gpu --stats --trace "$out/job.csv" --stats-file "$out/job.json" -- \
    "$job" 0 4 2>&1 | grep -v '^LD_PRELOAD='

step "2/6 The same program natively and under the shim" \
    "bfcshim ab: interleaved runs; the native arm still counts its calls (platform mode); the shim's arm makes one region call where the native one made 80"
"$b" ab --fake-gpu --repeat 3 --metric 'samples/s ([0-9.]+)' --metric-name samples/s -- \
    "$job" 0 4 2>&1 | grep -v -e '--fake-gpu:'

step "3/6 Out of memory in a 128 MiB pool" \
    "the job needs 210 MiB at once: the allocation fails with CUDA's own error, and the shim explains why (this step is meant to fail)"
"$b" run --fake-gpu --limit 128MiB --oom-report "$out/oom.txt" -- "$job" 0 1 2>&1 |
    grep -v -e "^LD_PRELOAD=" -e "--fake-gpu:" | head -16 || true
echo "   (the full report, with the memory map, is in $out/oom.txt)"

step "4/6 The HTML report of step 1" \
    "bfcshim report: live bytes over time, the pool's map at the peak (the job's own pool, from job.json next to job.csv), sizes, statistics; one file, offline"
"$b" report "$out/job.csv" -o "$out/report.html"
echo "   open $out/report.html in a browser"

step "5/6 The engine on real PyTorch traces" \
    "bfcshim replay: the smallest single pool that serves each trace (efficiency = peak live bytes / that pool; 1.0 is the limit), and the engine's speed"
traces=("$root"/tests/data/traces/h100-*.csv.gz)
"$b" replay --repeat 3 "${traces[@]}"
echo
echo "   The same traces under TSL's policy (TSL: the TensorFlow/XLA support library whose"
echo "   BFC allocator JAX and TensorFlow use: lowest-address best fit, split only at 2x):"
echo
"$b" replay --tsl --repeat 1 "${traces[@]}"

step "6/6 Next, on a machine with a GPU" \
    "the same commands without --fake-gpu, on your own job:"
cat <<'EOF'
   pip install .                                        # or: meson setup build && meson compile -C build
   bfcshim run --stats -- python train.py               # the job on the pool (75% of the GPU, taken once)
   bfcshim ab --metric 'loss ([0-9.]+)' -- python train.py   # A/B against the framework's own allocator
   bfcshim run --trace job.csv --stats-file job.json -- python train.py && bfcshim report job.csv
   PYTORCH_NO_CUDA_MEMORY_CACHING=1 bfcshim run -- python train.py   # the pool instead of PyTorch's cache
   docs/frameworks.md: PyTorch, CuPy and Numba plug-ins without LD_PRELOAD; JAX and TensorFlow
EOF
