#!/usr/bin/env bash
# scripts/demo.sh - builds bfcshim and runs its main job on a machine without
# a GPU: the bundled synthetic training traces replayed through the engine,
# printed as an efficiency table, then the same traces under TSL's policy.
# With ../shared/traces present (the project's real traces), those too.
set -eu
cd "$(dirname "$0")/.."
scripts/deps.sh
[ -d build ] || meson setup build >/dev/null
meson compile -C build >/dev/null
traces=(tests/data/traces/*.csv.gz)
[ -d ../shared/traces ] && traces+=(../shared/traces/*.csv)
echo "bfcshim replay: smallest single pool that serves each trace (efficiency ="
echo "peak live bytes / min pool; 1.0 is the physical limit), and speed:"
./build/bfcshim replay "${traces[@]}"
echo
echo "The same traces under TSL's BFC policy (low placement, split only at 2x):"
./build/bfcshim replay --tsl --repeat 1 "${traces[@]}"
