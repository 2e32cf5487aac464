#!/usr/bin/env bash
# scripts/demo.sh [OUTDIR] - what bfcshim does, in six steps, on a machine
# without a GPU: it builds the project, then runs a sample CUDA program under
# the shim on the fake GPU that comes with it, compares it with the native
# path, shows an out-of-memory report, writes the HTML report, replays real
# PyTorch traces through the engine, and says what to run next on a real GPU.
# The steps are python/bfcshim/demo.py's, which `bfcshim demo` runs from a
# pip install; this script builds first and points it at the build tree.
# Files go to OUTDIR (default demo-out/). BFCSHIM_BUILD names the build
# folder to use (default build/; scripts/check.sh passes its own).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${1:-demo-out}
build=${BFCSHIM_BUILD:-build}
scripts/deps.sh

# The build, in a few progress lines rather than meson's hundreds (the first
# one takes minutes on a small machine); its whole output is in
# $build/demo-build.log, and its end is shown when it fails.
if [ ! -d "$build" ]; then
    echo "== building bfcshim in $build/ (the first time takes a few minutes; later runs only rebuild what changed)"
    mkdir -p "$build.tmp-log"
    if ! meson setup "$build" >"$build.tmp-log/setup.log" 2>&1; then
        tail -20 "$build.tmp-log/setup.log"; echo "demo: meson setup failed" >&2; exit 1
    fi
    mv "$build.tmp-log/setup.log" "$build/demo-setup.log"; rmdir "$build.tmp-log"
else
    echo "== building bfcshim in $build/ (up to date or nearly: only what changed is rebuilt)"
fi
log=$build/demo-build.log
started=$SECONDS
# ninja's lines are "[K/N] what": one line at each tenth of the N steps.
if ! meson compile -C "$build" 2>&1 | tee "$log" | awk -v t0="$started" '
        match($0, /^\[[0-9]+\/[0-9]+\]/) {
            split(substr($0, 2, RLENGTH - 2), kn, "/")
            tenth = int(kn[1] * 10 / kn[2])
            if (tenth > shown) {
                shown = tenth
                printf "   building: %d of %d steps (%d%%)\n", kn[1], kn[2], tenth * 10
                fflush()
            }
        }'; then
    tail -30 "$log"; echo "demo: the build failed (all of it: $log)" >&2; exit 1
fi
echo "   built in $((SECONDS - started)) s"

build=$(cd "$build" && pwd)
unset BFCSHIM_BUILD  # the shim warns about BFCSHIM_ names it does not know
PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" python3 -m bfcshim.demo \
    --command "$build/bfcshim" --sample "$build/shim/demo/bfcshim-sample-job" \
    --traces "$root"/tests/data/traces/h100-*.csv.gz -- "$out"
# pip install . builds the C library, the command, the sample job and the
# Python package with meson-python; `bfcshim demo` then runs these steps from
# the install. The CUDA headers must be present (README, "Install").
