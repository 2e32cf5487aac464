#!/usr/bin/env bash
# scripts/bench.sh [OUT] - the figures of docs/benchmarks.md, reproducibly:
#   1. replay efficiency, ours vs TSL's policy, on generated training traces
#      (and ../shared/traces when present)
#   2. replay speed on a ~10^4-live-chunk training trace: ns/op over several
#      processes, and instructions per operation under callgrind
#   3. scaling from 10^3 to 10^6 live chunks: whole trace and steady state
#   4. the pool lock's cost (bench_lock)
#   5. what recording a trace (BFCSHIM_TRACE) costs per operation: paired
#      replays, and the extra instructions per operation under callgrind
# BENCH_SECTIONS="2 5" runs only those sections. Writes everything to OUT
# (default docs/results/bench-<commit>.txt) with the machine, compiler and
# commit. Needs ~2 GB of disk and ~15 minutes.
set -eu
cd "$(dirname "$0")/.."
scripts/deps.sh
[ -d build ] || meson setup build >/dev/null
meson compile -C build >/dev/null
B=$(pwd)/build/bfcshim
commit=$(git rev-parse --short HEAD)$(git diff --quiet || echo "-dirty")
out=${1:-docs/results/bench-$commit.txt}
work=build/bench-traces
mkdir -p "$work" "$(dirname "$out")"
exec > >(tee "$out") 2>&1

echo "# bfcshim benchmarks, commit $commit, $(date -u +%Y-%m-%d)"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB"
echo "kernel: $(uname -r); compiler: $(cc --version | head -1); build: $(meson introspect build --buildoptions | python3 -c 'import json,sys; o={x["name"]:x["value"] for x in json.load(sys.stdin)}; print(o["buildtype"], "lto" if o["b_lto"] else "no-lto")')"

# BENCH_SECTIONS="2 5" runs only those sections (default: all).
want() { [[ " ${BENCH_SECTIONS:-1 2 3 4 5} " == *" $1 "* ]]; }
gen() { # name args...
    local name=$1; shift
    [ -f "$work/$name.csv" ] || $B tracegen -o "$work/$name.csv" "$@" >/dev/null
}
# The ~10^4-live-chunk training trace that sections 2 and 5 time.
gen_1e4() {
    gen gpt-1e4 --model gpt --layers 160 --hidden 256 --heads 4 --batch 8 --seq 256 \
        --vocab 8192 --steps 6 --vary-seq
}
if want 1; then
echo; echo "## 1. efficiency"
for seed in 1 2 3; do
    gen gpt-s$seed --model gpt --steps 4 --seed $seed
    gen gptvar-s$seed --model gpt --vary-seq --steps 6 --seed $seed
    gen gptmed-s$seed --model gpt --layers 24 --hidden 1024 --batch 4 --seq 2048 --vary-seq --steps 5 --seed $seed
    gen gptdeep-s$seed --model gpt --layers 48 --hidden 512 --batch 16 --seq 512 --vary-seq --steps 4 --vocab 32000 --seed $seed
    gen resnet-s$seed --model resnet --steps 4 --seed $seed
    gen resnetdeep-s$seed --model resnet --steps 4 --batch 32 --blocks 6 --seed $seed
    gen resnetwide-s$seed --model resnet --steps 3 --batch 128 --blocks 2 --image 160 --seed $seed
done
traces=("$work"/gpt*-s?.csv "$work"/resnet*-s?.csv)
[ -d ../shared/traces ] && traces+=(../shared/traces/*.csv)
for policy in "" "--tsl"; do
    $B replay --json --repeat 1 $policy "${traces[@]}" > "$work/eff$policy.json"
done
python3 - "$work/eff.json" "$work/eff--tsl.json" <<'PY'
import json, os, sys
ours = [json.loads(l) for l in open(sys.argv[1])]
tsl = {r["trace"]: r for r in map(json.loads, open(sys.argv[2]))}
print(f"{'trace':40} {'peak live':>12} {'bfcshim':>8} {'TSL':>8}")
for r in ours:
    t = tsl[r["trace"]]
    print(f"{os.path.basename(r['trace']):40} {r['peak_live_bytes']/2**30:10.2f}Gi {r['efficiency']:8.4f} {t['efficiency']:8.4f}")
e = [r["efficiency"] for r in ours]; f = [tsl[r["trace"]]["efficiency"] for r in ours]
assert None not in e + f, "a trace without allocations"
print(f"{'min / mean':40} {'':12} {min(e):.4f}/{sum(e)/len(e):.4f} {min(f):.4f}/{sum(f)/len(f):.4f}")
PY

fi
if want 2; then
echo; echo "## 2. speed at ~10^4 live chunks (synthetic GPT training, 160 layers)"
gen_1e4
echo -n "ns/op, 7 processes x median of 9 replays:"
for i in 1 2 3 4 5 6 7; do
    $B replay --repeat 9 --no-min-pool --pool-size 8GiB "$work/gpt-1e4.csv" | awk 'NR>1{printf " %s", $8}'
done; echo
if command -v valgrind >/dev/null; then
    events=$($B replay --json --repeat 1 --no-min-pool --pool-size 8GiB "$work/gpt-1e4.csv" | python3 -c 'import json,sys; print(json.load(sys.stdin)["timed_events"])')
    valgrind --tool=callgrind --toggle-collect=replay_loop --callgrind-out-file="$work/cg.out" \
        $B replay --repeat 1 --no-min-pool --pool-size 8GiB "$work/gpt-1e4.csv" >/dev/null 2>"$work/cg.log"
    awk -v ev="$events" '/Collected/{printf "callgrind: %.0f instructions per operation (%d events)\n", $4/ev, ev}' "$work/cg.log"
fi

fi
if want 3; then
echo; echo "## 3. scaling (churn: N long-lived blocks, then max(2M, 10N) short-lived ops)"
echo "live      whole-trace ns/op   steady-state ns/op (setup of 3N events excluded)"
for n in 1000 10000 100000 1000000; do
    ops=$(( n * 10 > 2000000 ? n * 10 : 2000000 ))
    gen scale-$n --model churn --live $n --ops $ops
    whole=$($B replay --repeat 5 --no-min-pool --pool-size 64GiB "$work/scale-$n.csv" | awk 'NR>1{print $8}')
    steady=$($B replay --repeat 5 --no-min-pool --pool-size 64GiB --warmup-events $((3 * n)) "$work/scale-$n.csv" | awk 'NR>1{print $8}')
    printf "%-9s %-19s %s\n" "$n" "$whole" "$steady"
done

fi
if want 4; then
echo; echo "## 4. lock"
build/tests/bench_lock

fi
if want 5; then
gen_1e4
echo; echo "## 5. cost of recording a trace (BFCSHIM_TRACE's writer, via replay --record)"
echo "the 10^4-live trace; each process times 21 pairs of replays (plain, recording, in"
echo "alternating order) and reports the medians and the median of recording/plain - 1:"
for i in 1 2 3 4 5 6 7; do
    $B replay --json --repeat 21 --no-min-pool --pool-size 8GiB --record "$work/recorded.csv" "$work/gpt-1e4.csv"
done | python3 -c '
import json, sys, statistics
rows = [json.loads(l) for l in sys.stdin if l.strip()]
print("plain ns/op  recording ns/op  cost")
for r in rows:
    p, n, c = r["plain_ns_per_op"], r["ns_per_op"], r["recording_cost"]
    print(f"{p:11.1f}  {n:15.1f}  {100 * c:+5.1f}%")
c = [r["recording_cost"] for r in rows]
print(f"median cost over processes: {100 * statistics.median(c):+.1f}% (range {100 * min(c):+.1f}% to {100 * max(c):+.1f}%)")'
if command -v valgrind >/dev/null; then
    # One --record repeat is a plain and a recording replay: the difference
    # from a plain run's count is the recording replay's.
    events=$($B replay --json --repeat 1 --no-min-pool --pool-size 8GiB "$work/gpt-1e4.csv" | python3 -c 'import json,sys; print(json.load(sys.stdin)["timed_events"])')
    for arm in plain record; do
        extra=(); [ $arm = record ] && extra=(--record "$work/recorded.csv")
        valgrind --tool=callgrind --toggle-collect=replay_loop --callgrind-out-file="$work/cg-$arm.out" \
            $B replay --repeat 1 --no-min-pool --pool-size 8GiB "${extra[@]}" "$work/gpt-1e4.csv" >/dev/null 2>"$work/cg-$arm.log"
    done
    plain=$(awk '/Collected/{print $4}' "$work/cg-plain.log")
    both=$(awk '/Collected/{print $4}' "$work/cg-record.log")
    python3 -c "p, b, n = $plain, $both, $events; print(f'callgrind: {p / n:.0f} instructions per operation plain, {(b - p) / n:.0f} recording (+{(b - 2 * p) / n:.0f})')"
fi
fi
