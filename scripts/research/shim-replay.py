#!/usr/bin/env python3
"""Issue 53's measurement: driver calls per allocation, fence waits and peaks
of the preloaded shim on the fake driver, over every real trace.

    scripts/research/shim-replay.py [--build build] [--lags 0,100,1000] [--max-events N]
        [--variants NAME,...] [--out FILE] [TRACE...]

Runs build/tests/shim_replay (tests/bench/shim_replay.c) over the real
traces (tests/data/traces/h100-*, ../shared/traces/real/*, and
../shared/traces/*.csv: the synthetic ones are left out) in these variants:

    runtime-prealloc   cudaMalloc/cudaFree, the default preallocated pool,
                       every lag; the smallest preallocated limit at lags 0
                       and the second lag (--min-limit)
    runtime-growing    the same, BFCSHIM_PREALLOCATE=false, every lag
    async-prealloc     cudaMallocAsync/cudaFreeAsync on the legacy stream
    runtime-2streams   cudaMalloc/cudaFree, kernels on two non-blocking
                       streams, allocations alternating between them
    async-2streams     cudaMallocAsync/cudaFreeAsync the same way
    plugin-prealloc    bfcshim_malloc_async/_free_async on the legacy
                       stream, the library opened as a plug-in (not
                       preloaded: it sees no stream and no capture)
    plugin-2streams    the same on two non-blocking streams
    torch-prealloc     bfcshim_torch_alloc/_free (PyTorch's pluggable
                       allocator's calls, device 0) on the legacy stream,
                       the library opened as a plug-in
(the last six at the first two lags; the smallest limit for
runtime-prealloc and runtime-2streams at those two), then
build/tests/shim_step_calls
(arm B: a PyTorch-shaped step with every block cached). One run at a time:
the development VM has two cores, shared.

The realistic lag is 100 operations: at that lag `bfcshim replay --vmm
--gpu-lag` reproduced the growth-mode regions the H100 mapped for the
GPT-2 trace (docs/benchmarks.md, "A growing pool with the GPU behind the
host"); 1000 is the stress case. Each trace is capped at --max-events
(100000; none of ours is longer, and the cap is printed).

Writes a table (the steady window: the second half of each replay) and the
issue's goals, computed, to stdout and to --out (default
docs/results/shim-replay-<commit>.txt).
"""
import argparse
import glob
import json
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GiB = float(1 << 30)
GROUPS = ["event record", "event query", "capture query", "sync", "map", "context",
          "event made", "other"]
SHORT = ["record", "query", "captur", "sync", "map", "ctx", "evmade", "other"]
VARIANTS = [
    ("runtime-prealloc", ["--door", "runtime", "--pool", "preallocated"], "all"),
    ("runtime-growing", ["--door", "runtime", "--pool", "growing"], "all"),
    ("async-prealloc", ["--door", "async", "--pool", "preallocated"], "two"),
    ("runtime-2streams", ["--door", "runtime", "--streams", "2", "--pool", "preallocated"], "two"),
    ("async-2streams", ["--door", "async", "--streams", "2", "--pool", "preallocated"], "two"),
    ("plugin-prealloc", ["--door", "plugin", "--pool", "preallocated"], "two"),
    ("plugin-2streams", ["--door", "plugin", "--streams", "2", "--pool", "preallocated"], "two"),
    ("torch-prealloc", ["--door", "torch", "--pool", "preallocated"], "two"),
]


def real_traces():
    shared = os.path.join(os.path.dirname(ROOT), "shared", "traces")
    found = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "traces", "h100-*.csv.gz")))
    found += sorted(glob.glob(os.path.join(shared, "real", "*.csv.gz")))
    found += sorted(glob.glob(os.path.join(shared, "*.csv")))
    return found


def env_for(build, plugin=False):
    """The replay's environment: the shim preloaded, or for the plug-in
    door named in BFCSHIM_LIBRARY for the program to open itself."""
    env = dict(os.environ)
    lib = os.path.join(build, "shim", "libbfcshim.so")
    env.pop("LD_PRELOAD", None)
    env["BFCSHIM_LIBRARY" if plugin else "LD_PRELOAD"] = lib
    env["LD_LIBRARY_PATH"] = os.path.join(build, "tests", "fake_cuda")
    return env


def run(cmd, env):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("%s: status %d\n%s" % (" ".join(cmd), p.returncode, p.stderr))
    return json.loads(p.stdout)


def row(name, variant, d):
    s, ps = d["steady"], d["pool_stats"]
    g = s["groups_per_alloc"]
    live = d["peak_live_bytes"]
    lim = d.get("min_limit_bytes")
    return ("%-44s %-16s %5d %6d %7.3f " % (name[:44], variant, d["lag"], s["allocs"],
                                            s["shim_calls_per_alloc"]) +
            " ".join("%6.3f" % g[k] for k in GROUPS) +
            " %5d %5d %6d %7.2f %7.2f %7.2f %7.2f %s" % (
                s["fence_waits"], d["all"]["fence_waits"], s["ns_alloc_median"], live / GiB,
                ps["peak_bytes_in_use"] / GiB, ps["peak_mapped_bytes"] / GiB,
                ps["reserved_bytes"] / GiB,
                "%7.3f (%.4f)" % (lim / GiB, lim / live) if lim else "      -"))


HEADER = ("%-44s %-16s %5s %6s %7s " % ("trace", "variant", "lag", "allocs", "calls") +
          " ".join("%6s" % k for k in SHORT) +
          " %5s %5s %6s %7s %7s %7s %7s %s" % ("waits", "(all)", "ns", "live", "in use",
                                               "mapped", "reserv", "min limit (x live)"))


def entries(d):
    """The steady window's calls per allocation by entry point, most first:
    NAME TOTAL (IN_ALLOC+IN_FREE)."""
    s = d["steady"]
    per = sorted(((c["in_alloc"] + c["in_free"]) / s["allocs"], e, c["in_alloc"] / s["allocs"],
                  c["in_free"] / s["allocs"]) for e, c in s["calls"].items())
    return ", ".join("%s %.3f (%.3f+%.3f)" % (e, t, a, f) for t, e, a, f in reversed(per))


def goals(results, lags, out):
    realistic = lags[1] if len(lags) > 1 else lags[0]
    out("\n# Goals (issue 53), steady window; realistic lag %d" % realistic)
    out("# 1. shim driver calls per allocation <= 0.05, single-stream real traces:")
    for (name, variant, lag), d in sorted(results.items()):
        if variant in ("runtime-prealloc", "async-prealloc", "runtime-growing") and \
                lag in (0, realistic):
            c = d["steady"]["shim_calls_per_alloc"]
            out("#    %-44s %-16s lag %4d: %.3f %s" % (name[:44], variant, lag, c,
                                                     "ok" if c <= 0.05 else "over"))
    out("#    two streams (allocations alternating between two non-blocking streams):")
    for (name, variant, lag), d in sorted(results.items()):
        if variant in ("runtime-2streams", "async-2streams", "plugin-2streams") and \
                lag in (0, realistic):
            out("#    %-44s %-16s lag %4d: %.3f" % (name[:44], variant, lag,
                                                 d["steady"]["shim_calls_per_alloc"]))
    out("# 2. smallest preallocated limit at lag %d within 1%% of lag 0:" % realistic)
    for (name, variant, lag), d in sorted(results.items()):
        if variant == "runtime-prealloc" and lag == realistic and "min_limit_bytes" in d:
            base = results[(name, variant, 0)]["min_limit_bytes"]
            r = d["min_limit_bytes"] / base
            out("#    %-44s %.4f %s" % (name[:44], r, "ok" if r <= 1.01 else "over"))
    out("# 3. growing: peak mapped at lag %d within 1%% of lag 0; within 5%% of peak live "
        "(traces of 1 GiB or more):" % realistic)
    for (name, variant, lag), d in sorted(results.items()):
        if variant == "runtime-growing" and lag == realistic:
            base = results[(name, variant, 0)]["pool_stats"]["peak_mapped_bytes"]
            mapped = d["pool_stats"]["peak_mapped_bytes"]
            live = d["peak_live_bytes"]
            big = live >= (1 << 30)
            out("#    %-44s vs lag 0 %.4f %-4s  vs live %.4f %s" % (
                name[:44], mapped / base, "ok" if mapped <= 1.01 * base else "over",
                mapped / live,
                ("ok" if mapped <= 1.05 * live else "over") if big else "(under 1 GiB)"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--lags", default="0,100,1000")
    ap.add_argument("--max-events", type=int, default=100000)
    ap.add_argument("--variants", help="only these (comma-separated); all by default")
    ap.add_argument("--out")
    ap.add_argument("traces", nargs="*")
    a = ap.parse_args()
    lags = [int(x) for x in a.lags.split(",")]
    traces = a.traces or real_traces()
    env, plugin_env = env_for(a.build), env_for(a.build, plugin=True)
    replay = os.path.join(a.build, "tests", "shim_replay")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    out_path = a.out or os.path.join(ROOT, "docs", "results", "shim-replay-%s.txt" % commit)
    lines = []

    def out(text):
        print(text, flush=True)
        lines.append(text)

    out("# scripts/research/shim-replay.py --lags %s --max-events %d at %s%s" % (
        a.lags, a.max_events, commit, " (uncommitted changes)" if dirty else ""))
    out("# machine: %s, %d cores, %s; the fake driver (tests/fake_cuda), one 40 GiB device "
        "(30 GiB default pool), 2 MiB granules" % (platform.node(), os.cpu_count() or 0,
                                                   platform.platform()))
    out("# steady window: each replay's second half. calls: shim driver calls per allocation,"
        " then by group (record, query, capture, sync, map, context, events made, other);")
    out("# waits: fence waits in the steady window (and the whole replay); ns: median ns per "
        "cudaMalloc; sizes in GiB: peak live (trace), peak in use, peak mapped, reserved;")
    out("# min limit: the smallest BFCSHIM_MEM_LIMIT a preallocated pool serves the replay "
        "with (bisected to 2 MiB)")
    out(HEADER)
    results, details = {}, []
    for t in traces:
        name = os.path.basename(t)
        for variant, args, which in VARIANTS:
            if a.variants and variant not in a.variants.split(","):
                continue
            for i, lag in enumerate(lags):
                if which == "two" and i > 1:
                    continue
                extra = (["--min-limit"] if variant in ("runtime-prealloc", "runtime-2streams")
                         and i <= 1 else [])
                d = run([replay, "--json", "--lag", str(lag), "--max-events",
                         str(a.max_events)] + args + extra + [t],
                        plugin_env if "plugin" in args or "torch" in args else env)
                if d["capped"]:
                    out("# %s capped at %d of %d events" % (name, d["events"],
                                                            d["trace_events"]))
                if d["bench_calls"]:
                    out("# %s %s lag %d: %d driver calls outside the shim's doors" % (
                        name, variant, lag, d["bench_calls"]))
                if d["failures"]:
                    out("# %s %s lag %d: %d allocations failed" % (name, variant, lag,
                                                                 d["failures"]))
                results[(name, variant, lag)] = d
                out(row(name, variant, d))
                details.append("# %s %s %d: %s" % (name.split(".")[0], variant, lag, entries(d)))
    goals(results, lags, out)
    out("\n# Steady window, shim driver calls per allocation by entry point: total "
        "(made in cudaMalloc + made in cudaFree, or their async twins)")
    for line in details:
        out(line)
    step = run([os.path.join(a.build, "tests", "shim_step_calls"), "--json"], env)
    out("\n# Arm B (build/tests/shim_step_calls): a PyTorch-shaped step, every block cached")
    out("# mix per step: %s" % json.dumps(step["mix_per_step"]))
    out("# interposed: %s" % ", ".join(k for k, v in step["interposed"].items()
                                      if v is True or v == "yes"))
    out("# interposed calls per step %d; driver calls per step %.2f with the shim, %.2f "
        "without; the shim's %.2f" % (step["interposed_calls_per_step"],
                                      step["driver_calls_per_step"],
                                      sum(step["per_step_without_shim"].values()),
                                      step["shim_driver_calls_per_step"]))
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("written:", out_path)


if __name__ == "__main__":
    main()
