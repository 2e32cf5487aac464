#!/bin/sh
# run_fuzzer.sh FUZZER SECONDS [SEED_DIR] - a short libFuzzer session in a
# scratch corpus (seeded from SEED_DIR), for CI. Exit status is libFuzzer's.
set -eu
fuzzer=$1 seconds=$2 seeds=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "$seeds" ]; then cp "$seeds"/* "$work"/; fi
"$fuzzer" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 "$work"
