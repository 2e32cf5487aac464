#!/usr/bin/env python3
"""A growing pool's peak over peak live, with and without its headroom.

    scripts/research/growth-headroom.py [--build build] [--headrooms 0,35] [--lags 0,100]
        [--streams 1,2] [--out FILE] TRACE...

For each trace, headroom (thousandths: bfc_options.growth_headroom,
BFCSHIM_GROWTH_HEADROOM times 1000) and GPU lag, two replays of a pool that
grows over virtual memory with room to spare:
  engine  `bfcshim replay --vmm --growth-headroom H --gpu-lag L` (its
          roomy growing run: every free fenced, the simulated GPU L events
          behind)
  shim    build/tests/shim_replay through the runtime door, the preloaded
          library on the fake driver, BFCSHIM_PREALLOCATE=false, kernels L
          operations behind the host (tests/bench/shim_replay.c), on the
          legacy stream (1) or on two non-blocking streams in turn (2: the
          pool is not ordered, frees wait for fences; the engine's lagged
          replay is this case, and is printed with streams 1 only)
and prints peak mapped / peak live (and, through the shim, the least a pool that
neither waits nor knows streams could hold at that lag), the allocations that moved granules to
stay within the headroom, the bytes moved (the engine: unmapped; the shim:
moved), and for the shim the driver calls per allocation in the steady
window (the replay's second half) and how many of them map or unmap. A
move costs about 100 us a granule on a GPU: moves in the steady window are
the cost a long job would keep paying. Longer traces: loop-trace.py.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GiB = float(1 << 30)


def engine(build, trace, h, lag):
    p = subprocess.run([os.path.join(build, "bfcshim"), "replay", "--vmm", "--json", "--repeat",
                        "1", "--growth-headroom", str(h), "--gpu-lag", str(lag), trace],
                       capture_output=True, text=True, check=True)
    d = json.loads(p.stdout.splitlines()[0])
    v = d["vmm"]
    return (v["peak_mapped_bytes"] / d["peak_live_bytes"], v["growth_moves"],
            v["released_bytes"] / GiB, d["peak_live_bytes"])


def shim(build, trace, h, lag, streams):
    env = dict(os.environ, LD_PRELOAD=os.path.join(build, "shim", "libbfcshim.so"),
               LD_LIBRARY_PATH=os.path.join(build, "tests", "fake_cuda"),
               BFCSHIM_PREALLOCATE="false", BFCSHIM_GROWTH_HEADROOM="%g" % (h / 1000.0))
    p = subprocess.run([os.path.join(build, "tests", "shim_replay"), "--json", "--lag", str(lag),
                        "--max-events", "1000000", "--door", "runtime", "--pool", "growing",
                        "--streams", str(streams), trace], env=env, capture_output=True, text=True, check=True)
    d = json.loads(p.stdout)
    ps, s = d["pool_stats"], d["steady"]
    return (ps["peak_mapped_bytes"] / d["peak_live_bytes"], ps["num_growth_moves"],
            ps["moved_bytes_total"] / GiB, s["shim_calls_per_alloc"],
            s["groups_per_alloc"]["map"], s["fence_waits"], s["gpu_drained"],
            d["blind_bound_bytes"] / d["peak_live_bytes"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--headrooms", default="0,35")
    ap.add_argument("--lags", default="0,100")
    ap.add_argument("--streams", default="1")
    ap.add_argument("--out")
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args()
    out = open(a.out, "w") if a.out else None

    def say(line):
        print(line)
        if out:
            out.write(line + "\n")
            out.flush()

    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    say("# scripts/research/growth-headroom.py --headrooms %s --lags %s --streams %s at %s%s"
        % (a.headrooms, a.lags, a.streams, rev, " (uncommitted changes)" if dirty else ""))
    say("# peak: peak mapped / peak live; moves: allocations that moved granules; moved GiB;"
        " shim steady window (second half): calls and map/unmap calls per allocation, fence waits,"
        " waits that left the modelled GPU nothing queued (drain: a bubble in a GPU-bound step)")
    say("# bound: the least a pool that neither waits for the GPU nor knows a block's stream"
        " holds at this lag (live plus what the last `lag` events freed: shim_replay.c); a"
        " one-stream pool is ordered and not bound by it")
    say("%-40s %2s %4s %4s %6s | %7s %5s %6s | %7s %7s %5s %6s %6s %6s %5s %5s" % (
        "trace", "st", "head", "lag", "live", "engine", "moves", "GiB", "shim", "bound", "moves",
        "GiB", "calls", "map", "waits", "drain"))
    for t in a.traces:
        name = os.path.basename(t)
        for st in [int(x) for x in a.streams.split(",")]:
            for lag in [int(x) for x in a.lags.split(",")]:
                for h in [int(x) for x in a.headrooms.split(",")]:
                    ep, em, eg, live = engine(a.build, t, h, lag)
                    sp, sm, sg, calls, maps, waits, drained, bound = shim(a.build, t, h, lag, st)
                    eng = ("%7.4f %5d %6.2f" % (ep, em, eg) if st == 1
                           else "%7s %5s %6s" % ("-", "-", "-"))
                    say("%-40s %2d %4d %4d %6.2f | %s | %7.4f %7.4f %5d %6.2f %6.3f %6.3f %5d %5d"
                        % (name[:40], st, h, lag, live / GiB, eng, sp, bound, sm, sg, calls, maps,
                           waits, drained))


if __name__ == "__main__":
    sys.exit(main())
