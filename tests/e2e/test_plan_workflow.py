#!/usr/bin/env python3
"""The plan workflow as the documentation gives it, with default settings:
record a run (BFCSHIM_TRACE), run each `bfcshim plan -o ...` command that
README.md and docs/ show, word for word, then run the job again with
BFCSHIM_PLAN and check that the shim placed allocations by the plan. With
`bfcshim plan` packing at 256 B and the pool at 512 B, every such plan was
refused ("packed at another BFCSHIM_ALIGNMENT") and nothing was placed.

usage: test_plan_workflow.py BFCSHIM E2E_WORKLOAD FAKE_CUDA_DIR LIBBFCSHIM WORKDIR
"""
import glob
import json
import os
import re
import shlex
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
import testcheck  # noqa: E402

bfcshim, workload, fake_dir, lib, work = sys.argv[1:6]
testcheck.fresh_dir(work)
check = testcheck.Checks()
root = os.path.join(here, "..", "..")

# Every `bfcshim plan ... -o PLAN ... TRACE` the documentation shows.
commands = set()
for doc in [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md"))):
    for cmd in re.findall(r"`(bfcshim plan [^`]*)`", open(doc).read()):
        if " -o " in cmd:
            commands.add(cmd)
print("documented plan commands:", sorted(commands))
check(any(c.startswith("bfcshim plan -o plan trace.csv") for c in commands),
      f"README.md's command is among {sorted(commands)}")


def job(cwd, **env):
    """The stand-in training job under the shim, default settings but env."""
    e = testcheck.fake_cuda_env(fake_dir, LD_PRELOAD=lib, **env)
    p = subprocess.run([workload, "0", "3"], cwd=cwd, env=e, capture_output=True, text=True)
    check(p.returncode == 0, f"the job exited {p.returncode}: {p.stderr[-2000:]}")
    return p


for n, cmd in enumerate(sorted(commands)):
    argv = shlex.split(cmd)
    plan, trace = argv[argv.index("-o") + 1], argv[-1]
    d = testcheck.fresh_dir(os.path.join(work, str(n)))
    # Recorded under the name the command reads, which it then runs as given.
    job(d, BFCSHIM_TRACE=trace)
    p = subprocess.run([bfcshim] + argv[1:], cwd=d, capture_output=True, text=True)
    if not check(p.returncode == 0, f"`{cmd}` exited {p.returncode}: {p.stderr}"):
        continue
    log, stats = os.path.join(d, "shim.log"), os.path.join(d, "stats.json")
    job(d, BFCSHIM_PLAN=plan, BFCSHIM_STATS_FILE=stats, BFCSHIM_LOG_FILE=log)
    pool = json.load(open(stats))["pools"][0]
    check(pool["num_planned"] > 0 and pool["plan_abandoned"] == 0,
          f"`{cmd}`: the job placed {pool['num_planned']} allocations by the plan of "
          f"{pool['num_allocs']} (abandoned: {pool['plan_abandoned']}); log: "
          f"{open(log).read() if os.path.exists(log) else ''}")
    # bfcshim replay --plan P, as docs/benchmarks.md measures a plan first.
    p = subprocess.run([bfcshim, "replay", "--json", "--repeat", "1", "--plan", plan, trace],
                       cwd=d, capture_output=True, text=True)
    if check(p.returncode == 0, f"replay --plan {plan}: {p.stderr}"):
        r = json.loads(p.stdout)
        check(r["plan"]["planned"] > 0, f"replay --plan placed nothing: {r['plan']}")

check.finish()
