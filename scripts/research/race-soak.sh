#!/usr/bin/env bash
# race-soak.sh [BUILD] [SCALE] - the e2e_race soak whose results
# docs/benchmarks.md quotes: the race programs (tests/e2e/e2e_race.c) in
# each configuration, many more seeds than the test suite runs, through the
# preloaded shim on fake devices of 48 MiB. One line per configuration:
# its environment and arguments, e2e_race's summary, the wall seconds.
# `immediate` frees at once and must find races (the detector works).
# SCALE (default 1) multiplies the seeds: 1 is about 2.8 million kernels,
# four minutes on the development VM. Writes to stdout; exit 1 if any
# configuration failed.
set -u
build=${1:-build}
scale=${2:-1}
root=$(cd "$(dirname "$0")/../.." && pwd)
b=$(cd "$root/$build" && pwd)
race=$b/tests/e2e_race
[ -x "$race" ] || { echo "race-soak: no $race (build first)" >&2; exit 2; }
export LD_PRELOAD=$b/shim/libbfcshim.so
export LD_LIBRARY_PATH=$b/tests:$b/tests/fake_cuda:$b/shim
export FAKECUDA_MEM=48MiB BFCSHIM_LOG_FILE=/dev/null
commit=$(git -C "$root" rev-parse --short HEAD)
dirty=$(git -C "$root" status --porcelain --untracked-files=no | grep -q . && echo -dirty)
echo "# e2e_race soak, commit $commit$dirty, $(uname -n), $(nproc) CPUs; fake devices of 48 MiB"
echo "# lines: configuration [environment and arguments]: summary (wall seconds); immediate must find races"
echo "# started $(date -u +%Y-%m-%dT%H:%M:%SZ)"
failed=0
run() { # NAME SEEDS ENV... -- ARGS...
    local name=$1 seeds=$(($2 * scale)) env=() args=()
    shift 2
    while [ $# -gt 0 ] && [ "$1" != -- ]; do env+=("$1"); shift; done
    shift
    args=("$@")
    local t0=$SECONDS out
    out=$(env "${env[@]}" "$race" "1-$seeds" 3000 "${args[@]}" 2>&1 | grep '^e2e_race' | tr '\n' ' ')
    local rc=${PIPESTATUS[0]}
    echo "$name [${env[*]} tests/e2e_race 1-$seeds 3000 ${args[*]}]: $out ($((SECONDS - t0)) s)"
    case $out in *"e2e_race: ok"*) ;; *) failed=1 ;; esac
    [ "$rc" = 0 ] || failed=1
}
run preallocated 400 FAKECUDA_DEVICES=1 --
run growth-vmm 250 FAKECUDA_DEVICES=1 BFCSHIM_PREALLOCATE=false --
run interval32 200 FAKECUDA_DEVICES=1 BFCSHIM_FENCE_INTERVAL=32 --
run devices2 200 FAKECUDA_DEVICES=2 -- devices=2
run contexts 200 FAKECUDA_DEVICES=1 -- contexts=1
run threads3 100 FAKECUDA_DEVICES=1 -- threads=3
run ordered 200 FAKECUDA_DEVICES=1 -- ordered
run ordered-threads3 100 FAKECUDA_DEVICES=1 -- threads=3 ordered
run threads4-devices-growth 60 FAKECUDA_DEVICES=2 BFCSHIM_PREALLOCATE=false -- threads=4 devices=2
run immediate 20 FAKECUDA_DEVICES=1 BFCSHIM_FREE_POLICY=immediate -- expect-races
echo "# ended $(date -u +%Y-%m-%dT%H:%M:%SZ)"
exit $failed
