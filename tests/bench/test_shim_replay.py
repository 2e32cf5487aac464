#!/usr/bin/env python3
"""The shim-level benchmarks, briefly, on one small trace: shim_replay's
figures must hang together (every allocation of the trace made and counted
by the pool, calls by entry point adding up to the totals, the steady window
inside the whole, the GPU model behind the host when told to be), its
smallest limit must be one the pool serves while 2 MiB less fails, and
shim_step_calls must count the shim's own calls per step as the difference
of its two runs. Not a timed test: no figure here depends on the machine.

usage: test_shim_replay.py SHIM_REPLAY SHIM_STEP_CALLS LIBBFCSHIM FAKE_CUDA_DIR TRACE
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testcheck  # noqa: E402

replay, step_calls, libbfcshim, fake_dir, trace = sys.argv[1:6]
# One device whose default pool (1.5 GiB) holds the trace (148 MiB) and is
# quick to preallocate.
env = testcheck.fake_cuda_env(fake_dir, LD_PRELOAD=libbfcshim, FAKECUDA_DEVICES="1",
                              FAKECUDA_MEM="2GiB")
check = testcheck.Checks()
MiB = 1 << 20


def run(*args, **extra):
    p = subprocess.run([replay, "--json", *args, trace], env=dict(env, **extra),
                       capture_output=True, text=True)
    if not check(p.returncode == 0, f"shim_replay {args}: status {p.returncode}: {p.stderr}"):
        sys.exit(1)
    return json.loads(p.stdout)


def consistent(d, what):
    """What every run's document must say about itself."""
    ps = d["pool_stats"]
    a, s = d["all"], d["steady"]
    check(d["events"] == d["trace_events"] and not d["capped"], f"{what}: every event replayed")
    check(d["failures"] == 0 and d["free_errors"] == 0, f"{what}: no failure")
    check(a["allocs"] == d["trace_allocs"] == ps["num_allocs"],
          f"{what}: allocations {a['allocs']}, trace {d['trace_allocs']}, "
          f"pool {ps['num_allocs']}")
    check(a["allocs"] + a["frees"] == a["events"] == d["events"], f"{what}: events add up")
    check(d["bench_calls"] == 0, f"{what}: {d['bench_calls']} driver calls outside the doors")
    check(ps["peak_bytes_in_use"] >= d["peak_live_bytes"], f"{what}: in use below live")
    check(ps["peak_mapped_bytes"] >= ps["peak_bytes_in_use"], f"{what}: mapped below in use")
    for name, w in (("all", a), ("steady", s)):
        counts = w["calls"]
        check(all(isinstance(c, int) and c >= 0 for e in counts.values() for c in e.values()),
              f"{what} {name}: counts are whole and not negative")
        total = sum(e["in_alloc"] + e["in_free"] for e in counts.values())
        check(total == w["shim_calls"], f"{what} {name}: entry points {total} != {w['shim_calls']}")
        per = w["shim_calls"] / w["allocs"]
        check(abs(per - w["shim_calls_per_alloc"]) < 1e-3, f"{what} {name}: per allocation")
        groups = sum(w["groups_per_alloc"].values())
        check(abs(groups - per) < 1e-3, f"{what} {name}: groups add up ({groups} != {per})")
        check(w["ns_alloc_median"] > 0 and w["ns_free_median"] > 0, f"{what} {name}: timed")
    # the steady window is the second half of the same replay
    check(s["first_event"] == d["events"] // 2 and s["events"] == d["events"] - s["first_event"],
          f"{what}: steady window")
    for e, c in s["calls"].items():
        check(e in a["calls"] and c["in_alloc"] <= a["calls"][e]["in_alloc"] and
              c["in_free"] <= a["calls"][e]["in_free"], f"{what}: steady {e} within all")
    check(s["fence_waits"] <= a["fence_waits"], f"{what}: steady waits within all")
    # What waits cost the modelled GPU (gpu_lag.h): kernels completed ahead
    # of the model, and launches that found nothing queued; with the GPU
    # caught up nothing is ever queued.
    for k in ("gpu_ran_ahead", "gpu_drained"):
        check(0 <= s[k] <= a[k] <= a["events"], f"{what}: {k} {s[k]} / {a[k]}")
        if d["lag"] == 0:
            check(a[k] == 0, f"{what}: {k} {a[k]} with nothing queued")
    # A wait is for work not yet done, so it completes queued kernels.
    check((a["fence_waits"] > 0) <= (a["gpu_ran_ahead"] > 0),
          f"{what}: {a['fence_waits']} waits ran nothing ahead")


def blind_bound(lag):
    """Peak live plus what the last `lag` events freed (shim_replay's
    blind_bound_bytes), computed here from the trace apart from the C
    replay: at each allocation, live bytes plus those freed fewer than
    `lag` events before it."""
    import gzip
    with gzip.open(trace, "rt") as f:
        rows = f.read().splitlines()
    head = rows[0].split(",")
    act, ptr, size = head.index("Action"), head.index("Pointer"), head.index("Size")
    sizes, freed_at, live, peak = {}, [], 0, 0
    for row in rows[1:]:
        c = row.split(",")
        if c[act].startswith("alloc"):
            freed_at.append(0)
            live += int(c[size])
            sizes[c[ptr]] = int(c[size])
            pending = sum(freed_at[max(0, len(freed_at) - lag):-1]) if lag else 0
            peak = max(peak, live + pending)
        elif c[ptr] in sizes:
            freed_at.append(sizes[c[ptr]])
            live -= sizes.pop(c[ptr])
    return peak


def calls(w, entry):
    c = w["calls"].get(entry, {"in_alloc": 0, "in_free": 0})
    return c["in_alloc"] + c["in_free"]


FENCE_CALLS = ("cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuStreamIsCapturing",
               "cuStreamWaitEvent", "cuCtxSynchronize", "cuStreamSynchronize")


def fence_calls(w):
    return sum(calls(w, e) for e in FENCE_CALLS)


# The runtime door, the GPU caught up and 64 operations behind.
idle = run("--lag", "0")
consistent(idle, "lag 0")
behind = run("--lag", "64")
consistent(behind, "lag 64")
check(idle["lag"] == 0 and behind["lag"] == 64, "lags reported")
# What no pool could do without waiting or knowing streams: at lag 0 peak
# live itself; behind, the same figure computed here.
check(idle["blind_bound_bytes"] == idle["peak_live_bytes"] == blind_bound(0),
      f"lag 0 bound {idle['blind_bound_bytes']}, live {idle['peak_live_bytes']}")
check(behind["blind_bound_bytes"] == blind_bound(64) > behind["peak_live_bytes"],
      f"lag 64 bound {behind['blind_bound_bytes']}, computed {blind_bound(64)}")
# One stream: the pool is ordered (design.md, "Free policy"): a plain free's
# block comes back behind a barrier made only when the pool needs it, so
# the fence costs the same few calls at any lag, no event is ever asked
# about or waited for, and the pool holds the same memory.
for d, lag in ((idle, 0), (behind, 64)):
    for w in ("all", "steady"):
        check(calls(d[w], "cuEventQuery") + calls(d[w], "cuEventSynchronize") == 0 and
              d[w]["fence_waits"] == 0, f"lag {lag} {w}: no event asked about or waited for")
    s = d["steady"]
    check(fence_calls(s) <= 0.05 * s["allocs"],
          f"lag {lag} steady: {fence_calls(s)} fence calls for {s['allocs']} allocations")
check(fence_calls(idle["steady"]) == fence_calls(behind["steady"]), "fence calls depend on the lag")
for k in ("peak_bytes_in_use", "peak_mapped_bytes"):
    check(behind["pool_stats"][k] == idle["pool_stats"][k], f"{k} does not depend on the lag")
# Two non-blocking streams: events on both, found not done behind and asked
# about again.
two_idle = run("--streams", "2", "--lag", "0")
two_behind = run("--streams", "2", "--lag", "64")
for w in ("all", "steady"):
    check(calls(two_behind[w], "cuEventQuery") > calls(two_idle[w], "cuEventQuery"),
          f"two streams, lag 64 {w}: more event queries than at lag 0")

# Which pool serves a call is remembered (docs/design.md, "Which pool"): in
# the steady window no door asks the driver for the current context, nor,
# on two streams in turn, for a stream's.
CONTEXT_CALLS = ("cuCtxGetCurrent", "cuStreamGetCtx", "cuStreamGetCtx_v2")
for d, what in ((idle, "runtime door"), (two_behind, "runtime door, two streams")):
    check(sum(calls(d["steady"], e) for e in CONTEXT_CALLS) == 0,
          f"{what}: context lookups in the steady window")

# The other variants hang together too.
for args in (["--door", "async"], ["--door", "async", "--streams", "2"],
             ["--pool", "growing", "--lag", "64"],
             ["--pool", "growing", "--lag", "64", "--streams", "2"]):
    d = run(*args)
    consistent(d, " ".join(args))
    if args[-1] == "2" and "growing" in args:
        # frees wait for fences there while the GPU is behind: the model
        # sees the waits run kernels ahead of it
        check(d["all"]["fence_waits"] > 0 and d["all"]["gpu_ran_ahead"] > 0,
              f"{' '.join(args)}: waits {d['all']['fence_waits']}, "
              f"ran ahead {d['all']['gpu_ran_ahead']}")
        # and below the bound only by what those waits ran ahead
        check(d["blind_bound_bytes"] > d["peak_live_bytes"],
              f"{' '.join(args)}: bound {d['blind_bound_bytes']}")
    if "async" in args:
        check(sum(calls(d["steady"], e) for e in CONTEXT_CALLS) == 0,
              f"{' '.join(args)}: context lookups in the steady window")

# The plug-in door: the library opened by the program, not preloaded (and
# refused when preloaded, where it would measure the preloaded copy).
plugin_env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
plugin_env["BFCSHIM_LIBRARY"] = libbfcshim
by_door = {}
for args in (["--door", "plugin"], ["--door", "plugin", "--streams", "2", "--lag", "64"],
             ["--door", "torch"]):
    p = subprocess.run([replay, "--json", *args, trace], env=plugin_env, capture_output=True,
                       text=True)
    if check(p.returncode == 0, f"shim_replay {args}: status {p.returncode}: {p.stderr}"):
        by_door[" ".join(args)] = d = json.loads(p.stdout)
        consistent(d, " ".join(args))
# PyTorch's entry points name the block's device at the free: no question
# about the current context there, where the generic plug-in free asks one.
if len(by_door) == 3:
    asked = {k: calls(d["steady"], "cuCtxGetCurrent") for k, d in by_door.items()}
    check(asked["--door torch"] < asked["--door plugin"],
          f"cuCtxGetCurrent per allocation: torch {asked['--door torch']}, "
          f"plugin {asked['--door plugin']}")
p = subprocess.run([replay, "--door", "plugin", trace], env=env, capture_output=True, text=True)
check(p.returncode == 2 and "not preloaded" in p.stderr,
      f"--door plugin under LD_PRELOAD: status {p.returncode}")
growing = run("--pool", "growing")
check(growing["pool_stats"]["prealloc_us"] == 0 and idle["pool_stats"]["prealloc_us"] > 0,
      "--pool growing grows, the default preallocates")

# A capped replay says so.
capped = run("--max-events", "100")
check(capped["events"] == 100 and capped["capped"] and capped["all"]["events"] == 100,
      "--max-events 100")

# The smallest limit: served there, not 2 MiB below (the bisection's last
# failing probe), and never below the peak live bytes.
found = run("--lag", "64", "--min-limit")
lim = found["min_limit_bytes"]
check(lim % (2 * MiB) == 0 and lim >= found["peak_live_bytes"], f"min limit {lim}")
at = run("--lag", "64", "--pool", "preallocated", BFCSHIM_MEM_LIMIT=str(lim))
check(at["pool_stats"]["bytes_limit"] == lim, "the limit reached the pool")
below = subprocess.run([replay, "--lag", "64", "--pool", "preallocated", "--json", trace],
                       env=dict(env, BFCSHIM_MEM_LIMIT=str(lim - 2 * MiB)),
                       capture_output=True, text=True)
check(below.returncode == 0 and json.loads(below.stdout)["failures"] > 0,
      f"2 MiB below the smallest limit fails: {below.stderr[-300:]}")

# Arm B: the step's calls with and without the shim, and the shim's share.
p = subprocess.run([step_calls, "--steps", "3", "--json"], env=env, capture_output=True,
                   text=True)
check(p.returncode == 0, f"shim_step_calls: status {p.returncode}: {p.stderr}")
b = json.loads(p.stdout)
with_ = b["per_step_with_shim"]
without = b["per_step_without_shim"]
check(with_ and without, "both runs counted")
check(abs(sum(with_.values()) - b["driver_calls_per_step"]) < 1e-6, "per-step total")
share = sum(with_.values()) - sum(without.values())
check(abs(share - b["shim_driver_calls_per_step"]) < 1e-6, "the shim's share is the difference")
check(b["interposed"]["cudaMalloc"] is True and b["interposed"]["cuMemAlloc"] == "yes",
      "the allocation calls are interposed")
# A step that reaches the shim nowhere costs it no driver call.
if b["interposed_calls_per_step"] == 0:
    check(b["shim_driver_calls_per_step"] == 0, "no interposed call, no shim driver call")

check.finish()
