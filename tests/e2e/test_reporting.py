#!/usr/bin/env python3
"""What the shim writes for the user, checked from outside the process:
the stats file at exit (JSON, contract field names, right counts), the trace
(RMM CSV that `bfcshim replay` accepts, with the right events), the OOM
report file, the summary on stderr, and per-process traces across fork.

usage: test_reporting.py BFCSHIM E2E_RUNTIME LIBBFCSHIM FAKE_CUDA_DIR E2E_DRIVER WORKDIR
"""
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testcheck  # noqa: E402

bfcshim, program, lib, fake_dir, driver_program, work = sys.argv[1:7]
testcheck.fresh_dir(work)
check = testcheck.Checks()


def run(scenario, program=program, **env):
    e = testcheck.fake_cuda_env(fake_dir, LD_PRELOAD=lib,
                                BFCSHIM_LOG_FILE=os.path.join(work, scenario + ".log"), **env)
    p = subprocess.run([program, scenario], env=e, capture_output=True, text=True)
    check(p.returncode == 0, f"{scenario} exited {p.returncode}: {p.stderr[-2000:]}")
    return p


def replay(path):
    p = subprocess.run([bfcshim, "replay", "--json", "--repeat", "1", path],
                       capture_output=True, text=True)
    check(p.returncode == 0, f"replay {path}: {p.stderr}")
    return json.loads(p.stdout) if p.returncode == 0 else {}


# 1. stats at exit and the trace of the same run (scenario basic: 103
#    allocations and 103 frees in one preallocated region).
stats = os.path.join(work, "stats.json")
trace = os.path.join(work, "trace.csv")
run("basic", BFCSHIM_STATS_FILE=stats, BFCSHIM_TRACE=trace)
doc = json.load(open(stats))
check(doc["version"] == 1 and doc["allocator"] == "bfc", "stats header")
pools = doc["pools"]
check(len(pools) == 1, f"{len(pools)} pools")
pool = pools[0]
for key in ("device", "num_allocs", "num_frees", "bytes_in_use", "peak_bytes_in_use",
            "largest_alloc_size", "bytes_limit", "pool_bytes", "peak_pool_bytes",
            "largest_free_block_bytes", "num_ooms", "passthrough_allocs"):
    check(key in pool, f"stats field {key}")
check(pool["num_allocs"] == 103 and pool["num_frees"] == 103,
      f"allocs/frees {pool['num_allocs']}/{pool['num_frees']}")
check(pool["bytes_limit"] == 768 << 20 and pool["pool_bytes"] == 768 << 20, "limit")
check(pool["bytes_in_use"] == 0 and pool["peak_bytes_in_use"] >= 100 << 20, "in use")
check(doc["driver_alloc_calls"] == 1, f"driver calls {doc['driver_alloc_calls']}")

lines = open(trace).read().splitlines()
check(lines[0] == "Thread,Time,Action,Pointer,Size,Stream", "trace header")
check(len(lines) == 1 + 206, f"trace has {len(lines) - 1} events")
r = replay(trace)
check(r.get("allocs") == 103 and r.get("frees") == 103 and r.get("unmatched_frees") == 0,
      f"replayed trace: {r}")

# 2. the OOM report file: one report for two identical failures, with the
#    figures and the hint for a full pool.
report = os.path.join(work, "oom.txt")
run("oom", BFCSHIM_OOM_REPORT=report, BFCSHIM_TRACE=os.path.join(work, "oom.csv"))
text = open(report).read()
check(text.count("==== bfcshim out-of-memory report") == 1, "one report")
check("rounded to 100 MiB" in text and "diagnosis: the pool is full" in text, "report body")
check("BFCSHIM_MEM_FRACTION=0.79" in text, "the hint names the fraction that fits")
check("largest live allocations" in text and "Region 0 |" in text, "live list and map")
# The 700 MiB block holds more than half the 768 MiB limit: the report names
# the settings that keep a framework's own pool out of the shim's.
check("hint: allocation #1 (700 MiB) holds more than half the limit" in text and
      "TF_FORCE_GPU_ALLOW_GROWTH=true" in text, "the preallocation hint")
# A refused request of more than half the limit gets it too: the oom
# scenario's first 700 MiB, refused at a 600 MiB limit.
big = os.path.join(work, "oom-big.txt")
e = testcheck.fake_cuda_env(fake_dir, LD_PRELOAD=lib, BFCSHIM_MEM_LIMIT="600MiB",
                            BFCSHIM_OOM_REPORT=big,
                            BFCSHIM_LOG_FILE=os.path.join(work, "oom-big.log"))
subprocess.run([program, "oom"], env=e, capture_output=True, text=True)  # fails at once
big_text = open(big).read() if os.path.exists(big) else ""
check("hint: the request (700 MiB) is more than half the limit" in big_text and
      "TF_GPU_ALLOCATOR=cuda_malloc_async" in big_text,
      f"the preallocation hint for a refused request: {big_text[:1500]}")
oom_trace = open(os.path.join(work, "oom.csv")).read()
check(oom_trace.count(",allocate failure,") == 2, "failures in the trace")

# 2b. the same failure over virtual memory (the default above) and in one
#     region: the figures count only what the limit lets the pool back, so
#     they agree, and the report says what the reserved, unmapped address
#     space is. (Over virtual memory they once counted the whole reservation:
#     "free 1.57 GiB, largest free block 1.50 GiB" beside "the pool is full"
#     in a 768 MiB pool.)
vmm_log = open(os.path.join(work, "oom.log")).read()
one_region = os.path.join(work, "oom-one-region.txt")
run("oom", BFCSHIM_OOM_REPORT=one_region, BFCSHIM_VMM="off")
one_log = open(os.path.join(work, "oom.log")).read()  # written anew by each run


def figures(report_text):
    line = re.search(r"^in use .*$", report_text, re.M)
    return line.group(0) if line else None


vmm_text, one_text = text, open(one_region).read()
check(figures(vmm_text) is not None and figures(vmm_text) == figures(one_text),
      f"the same figures over virtual memory and in one region: {figures(vmm_text)!r} "
      f"against {figures(one_text)!r}")
check(figures(one_text) == "in use 700 MiB (requested 700 MiB), free 68.0 MiB, pending 0 B, "
      "largest free block 68.0 MiB, fragmentation 0.000", f"one region: {figures(one_text)!r}")
check(re.search(r"^LargestFreeBlock:\s+71303168$", vmm_text, re.M) is not None,
      "the map's LargestFreeBlock is the block the limit backs")
space = re.search(r"^address space: (.*)$", vmm_text, re.M)
check(space is not None and "not memory" in space.group(1) and
      "1.50 GiB of free address space lies beyond it" in space.group(1),
      f"the report says what the unmapped address space is: {space and space.group(0)}")
check("address space:" not in one_text, "one region has no address space line")
check(re.search(r"^Region \d+: 0x[0-9a-f]+, 1610612736 bytes of address space, 0 mapped$",
                vmm_text, re.M) is not None and
      re.search(r"^Region \d+ \|\.{100}\|$", vmm_text, re.M) is not None,
      "the map shows the unmapped reservation as address space")
for log in (vmm_log, one_log):
    check("(limit 768 MiB, in use 700 MiB, largest free block 68.0 MiB)" in log,
          f"the log line names the block the limit backs: {log[:400]!r}")

# 3. the summary on stderr.
p = run("basic", BFCSHIM_STATS="1")
check("device 0: limit 768 MiB" in p.stderr and "103 allocations, 103 frees" in p.stderr,
      f"summary: {p.stderr}")

# 3b. a plan the run strayed from: a line in the summary, a warning at exit.
here = os.path.dirname(os.path.abspath(__file__))
p = run("plan-stray", BFCSHIM_STATS="1", BFCSHIM_PLAN=os.path.join(here, "..", "data", "e2e.plan"),
        STATS_NOW=os.path.join(work, "plan-stray.json"))
check("plan: 0 allocations where it said, 0 places not free, 8 above it; abandoned" in p.stderr,
      f"plan in the summary: {p.stderr}")
log = open(os.path.join(work, "plan-stray.log")).read()
check("BFCSHIM_PLAN was abandoned" in log, f"warning at exit: {log}")

# 4. on demand (the program asks, and the request file).
run("stats-now", BFCSHIM_STATS_FILE=os.path.join(work, "req.json"),
    STATS_NOW=os.path.join(work, "now.json"))
check(json.load(open(os.path.join(work, "now.json")))["version"] == 1, "stats on demand")

# 5. platform mode counts what passes through, and traces each allocation
#    once though cudart's cudaMalloc reaches the driver door too.
platform_trace = os.path.join(work, "platform.csv")
run("platform", BFCSHIM_ALLOCATOR="platform", BFCSHIM_STATS_FILE=stats,
    BFCSHIM_TRACE=platform_trace)
doc = json.load(open(stats))
check(doc["allocator"] == "platform" and doc["pools"] == [], "platform: no pools")
check(doc["platform"]["num_allocs"] == 10 and doc["driver_alloc_calls"] == 10,
      f"platform counts {doc['platform']}")
actions = [l.split(",")[2] for l in open(platform_trace).read().splitlines()[1:]]
check(actions.count("allocate") == 10 and actions.count("free") == 10,
      f"platform trace: {actions.count('allocate')} allocations and "
      f"{actions.count('free')} frees recorded (10 each expected)")

# 5b. exit while another thread holds a pool, waiting for a fence that never
#     completes: the program exits at once, the stats name the busy pool and
#     the trace is written (without that pool's last events). Every writer
#     at exit (trace, stats file, summary) may find the pool held; it waits
#     for it once (100 ms), not once per writer: every wait names the pool
#     in the log, so one line is the check. How long the writers took is
#     printed, not bounded: under load (scripts/research/config-audit.py runs four
#     tests at once) it reached 0.37 s with one wait (one log line).
busy_stats = os.path.join(work, "busy.json")
busy_trace = os.path.join(work, "busy.csv")
busy_span = os.path.join(work, "busy-exit-span.txt")
t0 = time.monotonic()
run("exit-busy", BFCSHIM_STATS_FILE=busy_stats, BFCSHIM_TRACE=busy_trace, BFCSHIM_STATS="1",
    EXIT_SPAN=busy_span)
check(time.monotonic() - t0 < 10, f"exit took {time.monotonic() - t0:.1f} s")
span = float(open(busy_span).read()) if os.path.exists(busy_span) else None
check(span is not None, "exit-busy measured its writers at exit")
print(f"exit-busy: the writers at exit took {span} s (one wait is 0.1 s)")
busy_log = open(os.path.join(work, "exit-busy.log")).read()
check(busy_log.count("busy at exit") == 1, f"one line names the busy pool: {busy_log!r}")
doc = json.load(open(busy_stats)) if os.path.exists(busy_stats) else {"pools": []}
check([p.get("busy_at_exit") for p in doc["pools"]] == [True],
      f"the busy pool is named in the stats: {doc['pools']}")
check(os.path.exists(busy_trace), "the trace is written")

# 6. eight threads on their own streams: every thread in the trace, every
#    free after its allocation.
threads_trace = os.path.join(work, "threads.csv")
run("threads", BFCSHIM_TRACE=threads_trace)
rows = [l.split(",") for l in open(threads_trace).read().splitlines()[1:]]
check(len({r[0] for r in rows}) >= 8, f"{len({r[0] for r in rows})} threads in the trace")
check(len({r[5] for r in rows}) > 1, "streams recorded")
r = replay(threads_trace)
check(r.get("unmatched_frees") == 0 and r.get("allocs", 0) > 1000, f"threads trace: {r}")

# 7. %p: each process its own trace; the child forked before the pool
#    records its own allocations.
run("fork", BFCSHIM_TRACE=os.path.join(work, "fork-%p.csv"))
files = sorted(f for f in os.listdir(work) if f.startswith("fork-") and f.endswith(".csv"))
check(len(files) == 2, f"per-process traces: {files}")
for f in files:
    f = os.path.join(work, f)
    if len(open(f).read().splitlines()) > 1:
        replay(f)
    else:  # a process that allocated nothing: a trace with nothing to replay
        p = subprocess.run([bfcshim, "replay", f], capture_output=True, text=True)
        check(p.returncode == 1 and "no allocations" in p.stderr, f"replay {f}: {p.stderr}")

# 8. pools that die with their context: cudaDeviceReset with a block still
#    live, then a fresh pool. The old pool's events are in the trace, and its
#    live block is freed where the reset took it, so the replay matches
#    every free and the peak is one block, not two; the statistics list both
#    pools.
reset_trace = os.path.join(work, "reset.csv")
reset_stats = os.path.join(work, "reset.json")
run("reset", BFCSHIM_TRACE=reset_trace, BFCSHIM_STATS_FILE=reset_stats)
rows = [l.split(",") for l in open(reset_trace).read().splitlines()[1:]]
check([r[2] for r in rows] == ["allocate", "free", "allocate", "free"],
      f"reset trace: {[r[2] for r in rows]}")
check(len(rows) == 4 and rows[0][3] == rows[1][3], "the reset frees the old pool's block")
r = replay(reset_trace)
check(r.get("allocs") == 2 and r.get("unmatched_frees") == 0 and
      r.get("peak_live_bytes") == 1 << 20, f"reset trace replayed: {r}")
# The statistics keep the pool the reset took, though the next pool took
# its place: each served one allocation, and each made one region.
doc = json.load(open(reset_stats))
check([(p["alive"], p["num_allocs"]) for p in doc["pools"]] == [(False, 1), (True, 1)],
      f"reset stats: {[(p['alive'], p['num_allocs']) for p in doc['pools']]}")
check(doc["driver_alloc_calls"] == 2 and doc.get("dead_pools_not_listed") == 0,
      f"reset stats: {doc['driver_alloc_calls']} driver calls, "
      f"{doc.get('dead_pools_not_listed')} not listed")

# 8b. seventy contexts made and destroyed one after another (more than the
#     trace's eight channels): every pool's events are recorded.
churn_trace = os.path.join(work, "churn.csv")
churn_stats = os.path.join(work, "churn.json")
run("context-churn", program=driver_program, FAKECUDA_DEVICES="2", BFCSHIM_TRACE=churn_trace,
    BFCSHIM_STATS_FILE=churn_stats)
actions = [l.split(",")[2] for l in open(churn_trace).read().splitlines()[1:]]
check(actions.count("allocate") == 140 and actions.count("free") == 140,
      f"churn trace: {actions.count('allocate')} allocations, {actions.count('free')} frees")
r = replay(churn_trace)
check(r.get("allocs") == 140 and r.get("unmatched_frees") == 0, f"churn trace replayed: {r}")
# Seventy dead pools: the first 64 that gave their place up and the last
# one are listed, the other five counted.
doc = json.load(open(churn_stats))
check(len(doc["pools"]) == 65 and doc.get("dead_pools_not_listed") == 5 and
      not any(p["alive"] for p in doc["pools"]) and
      all(p["num_allocs"] == 2 for p in doc["pools"]),
      f"churn stats: {len(doc['pools'])} pools listed, {doc.get('dead_pools_not_listed')} not")

check.finish()
