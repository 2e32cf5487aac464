#!/usr/bin/env python3
"""`bfcshim run` and `bfcshim ab` on a stand-in job (tests/e2e/e2e_workload.c)
over the fake CUDA libraries: the shim is found without a path, options
become variables, LD_PRELOAD is kept, exit statuses pass through, and ab's
table and JSON carry the right counts.

usage: test_run_ab.py BFCSHIM WORKLOAD FAKE_CUDA_DIR NVML_PROBE WORKDIR
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testcheck  # noqa: E402

bfcshim, workload, fake_dir, nvml_probe, work = sys.argv[1:6]
testcheck.fresh_dir(work)
env = testcheck.fake_cuda_env(fake_dir)
check = testcheck.Checks()


def sh(*args, **extra):
    return subprocess.run([bfcshim, *args], env=dict(env, **extra), capture_output=True,
                          text=True)


# run: the status passes through, options become variables, LD_PRELOAD kept.
stats = os.path.join(work, "run.json")
p = sh("run", "--fraction", "0.5", "--stats-file", stats, "--", workload, "3", "2",
       LD_PRELOAD="libm.so.6")
check(p.returncode == 3, f"run exit status {p.returncode}: {p.stderr}")
preload = p.stdout.splitlines()[0]
check("libbfcshim.so" in preload and preload.endswith(":libm.so.6"), f"run {preload}")
doc = json.load(open(stats))
check(doc["pools"][0]["bytes_limit"] == 512 << 20, "--fraction 0.5 reached the shim")
check(doc["pools"][0]["num_allocs"] == 40, "allocations counted")

p = sh("run", "--fraction", "2", "--", workload)
check(p.returncode == 2 and "--fraction '2'" in p.stderr, f"bad value: {p.stderr}")
# A statistics file in a folder that is not there: refused before the job
# runs (it would fail only at exit); the library says so at its start.
missing = os.path.join(work, "no-such-folder")
p = sh("run", "--stats-file", os.path.join(missing, "x.json"), "--", workload, "0", "2")
check(p.returncode == 2 and p.stdout == "" and
      f"--stats-file {missing}/x.json: the folder {missing} does not exist" in p.stderr,
      f"--stats-file into a missing folder: {p.returncode} {p.stderr}")
p = sh("run", "--", workload, "0", "2", BFCSHIM_STATS_FILE=os.path.join(missing, "y.json"))
said = [l for l in p.stderr.splitlines() if f"the folder {missing} does not exist" in l]
check(len(said) == 1 and "BFCSHIM_STATS_FILE" in said[0] and
      p.stderr.index(said[0]) < p.stderr.index("cannot create a file next to"),
      f"BFCSHIM_STATS_FILE into a missing folder said at the start: {p.stderr}")
# A file to write that names a folder that exists is refused as well, by run
# and by ab, before anything runs: the statistics would fail only at exit,
# after the whole job (ab: after every run, exit status 1). The library, given
# such a BFCSHIM_STATS_FILE, says so at its start.
folder = os.path.join(work, "a-folder")
os.makedirs(folder, exist_ok=True)
for cmd in ("run", "ab"):
    for opt in ("--stats-file", "--trace", "--oom-report", "--log-file"):
        for path in (folder, folder + "/"):
            p = sh(cmd, opt, path, "--", workload, "0", "2")
            check(p.returncode == 2 and p.stdout == "" and "bfcshim ab: run " not in p.stderr and
                  f"bfcshim {cmd}: {opt} {path}: " in p.stderr and "is a folder" in p.stderr,
                  f"{cmd} {opt} {path} (a folder): {p.returncode} {p.stderr[-300:]}")
p = sh("run", "--", workload, "0", "2", BFCSHIM_STATS_FILE=folder)
said = [l for l in p.stderr.splitlines() if "is a folder" in l]
check(len(said) == 1 and "BFCSHIM_STATS_FILE" in said[0] and "cannot be written" in p.stderr and
      p.stderr.index(said[0]) < p.stderr.index("cannot be written"),
      f"BFCSHIM_STATS_FILE naming a folder said at the start: {p.stderr}")
# A bad option is one line with the command's prefix, not the whole help.
for args, words in [(["--bogus", "--", workload], "bfcshim run: --bogus: unknown option"),
                    (["--fraction"], "bfcshim run: --fraction: needs a value"),
                    (["-x", "--", workload], "bfcshim run: -x: unknown option"),
                    ([], "bfcshim run: no command given")]:
    p = sh("run", *args)
    check(p.returncode == 2 and p.stderr.startswith(words) and len(p.stderr.splitlines()) == 1,
          f"run {args}: {p.returncode} {p.stderr!r}")
# The other commands say a bad option the same way (they printed their
# whole help, 9 to 66 lines, before).
for cmd, args, words in [("ab", ["--bogus"], "bfcshim ab: --bogus: unknown option"),
                         ("ab", ["--repeat"], "bfcshim ab: --repeat: needs a value"),
                         ("plan", ["--bogus"], "bfcshim plan: --bogus: unknown option"),
                         ("plan", ["-o"], "bfcshim plan: -o: needs a value"),
                         ("replay", ["--pool-size"], "bfcshim replay: --pool-size: needs a value"),
                         ("replay", ["-x"], "bfcshim replay: -x: unknown option"),
                         ("report", ["--bogus"], "bfcshim report: --bogus: unknown option"),
                         ("tracegen", ["--bogus"], "bfcshim tracegen: --bogus: unknown option")]:
    p = sh(cmd, *args)
    check(p.returncode == 2 and p.stderr.startswith(words) and len(p.stderr.splitlines()) == 1,
          f"{cmd} {args}: {p.returncode} {p.stderr!r}")
p = sh("run", "--")
check(p.returncode == 2 and "no command" in p.stderr, "no command")
p = sh("run", "--", os.path.join(work, "no-such-program"))
check(p.returncode == 127, f"missing program: {p.returncode}")
p = sh("run", "--", workload, BFCSHIM_LIBRARY="/nonexistent/libbfcshim.so")
check(p.returncode == 2 and "BFCSHIM_LIBRARY" in p.stderr, "unreadable BFCSHIM_LIBRARY")

# --fake-gpu: no LD_LIBRARY_PATH from the user; the command finds the fake
# CUDA libraries that come with it, for run and for both arms of ab.
bare = {k: v for k, v in env.items() if k != "LD_LIBRARY_PATH"}
stats = os.path.join(work, "fake.json")
p = subprocess.run([bfcshim, "run", "--fake-gpu", "--stats-file", stats, "--", workload, "0",
                    "2"], env=bare, capture_output=True, text=True)
check(p.returncode == 0 and "--fake-gpu: CUDA goes to the fake driver" in p.stderr,
      f"run --fake-gpu: {p.returncode} {p.stderr}")
check(os.path.exists(stats) and json.load(open(stats))["pools"][0]["num_allocs"] == 40,
      "the job's allocations were pooled on the fake device")
# The program's NVML is the fake one, of the same devices: it found none
# (or the machine's, of other devices) before --fake-gpu put the fake NVML's
# folder on the path. FAKECUDA_DEVICES=3 tells it from the default.
probe = subprocess.run([nvml_probe], env=bare, capture_output=True, text=True)
p = subprocess.run([bfcshim, "run", "--fake-gpu", "--", nvml_probe],
                   env=dict(bare, FAKECUDA_DEVICES="3"), capture_output=True, text=True)
check(p.returncode == 0 and p.stdout.splitlines()[-1:] == ["nvml init 0 count 0 3"] and
      "NVML to a fake NVML" in p.stderr,
      f"run --fake-gpu: the fake NVML (alone: {probe.stdout.strip()}): {p.stdout} {p.stderr}")
p = subprocess.run([bfcshim, "ab", "--fake-gpu", "--repeat", "1", "--json", "--", workload, "0",
                    "2"], env=bare, capture_output=True, text=True)
arms = json.loads(p.stdout)["arms"] if p.returncode == 0 else []
check(p.returncode == 0 and [[r["exit_status"] for r in a["runs"]] for a in arms] == [[0], [0]] and
      p.stderr.count("--fake-gpu:") == 1, f"ab --fake-gpu: both arms ran: {p.stderr}")

# ab --stats-file: arm B's statistics land where asked (ab reads each run's
# from a private file, which used to leave the user's path unwritten).
ab_stats = os.path.join(work, "ab-stats.json")
if os.path.exists(ab_stats):
    os.unlink(ab_stats)
p = sh("ab", "--repeat", "1", "--stats-file", ab_stats, "--", workload, "0", "2")
check(p.returncode == 0 and os.path.exists(ab_stats) and
      json.load(open(ab_stats))["pools"][0]["num_allocs"] == 40,
      f"ab --stats-file wrote arm B's statistics: {p.stderr[-300:]}")

# A --metric that never matches is a warning, not an empty row read as data.
p = sh("ab", "--repeat", "1", "--metric", r"tokens/s ([0-9.]+)", "--", workload, "0", "1")
check(p.returncode == 0 and "--metric 'tokens/s ([0-9.]+)' matched no line" in p.stderr,
      f"unmatched metric warned: {p.stderr[-500:]}")
# The warning names the option that shows the job's output: that option works
# (it named -v, which ab refused as unknown).
said = re.search(r"; (\S+) shows the output", p.stderr)
check(said is not None, f"the warning names an option: {p.stderr[-500:]}")
if said:
    p = sh("ab", "--repeat", "1", said.group(1), "--", workload, "0", "1")
    check(p.returncode == 0 and "step 0 loss" in p.stderr + p.stdout,
          f"ab {said.group(1)} shows the job's output: {p.returncode} {p.stderr[-300:]}")
p = sh("ab", "--repeat", "1", "--metric", r"samples/s ([0-9.]+)", "--", workload, "0", "1")
check("matched no line" not in p.stderr, "no warning when it matches")

# ab: A counts the driver calls the job makes itself, B takes one region.
p = sh("ab", "--repeat", "2", "--json", "--metric", r"samples/s ([0-9.]+)",
       "--env-b", "BFCSHIM_MEM_FRACTION=0.25", "--", workload, "0", "3")
check(p.returncode == 0, f"ab: {p.returncode} {p.stderr}")
check(p.stderr.count("bfcshim ab: run ") == 4, "progress lines")
order = [line.split(", ")[1].split(" ")[0] for line in p.stderr.splitlines()
         if line.startswith("bfcshim ab: run ")]
check(order == ["A:", "B:", "A:", "B:"], f"interleaved: {order}")
doc = json.loads(p.stdout)
a, b = doc["arms"]
check(len(a["runs"]) == 2 and len(b["runs"]) == 2, "two runs per arm")
for r in a["runs"]:
    check(r["driver_alloc_calls"] == 60 and r["exit_status"] == 0, f"arm A run {r}")
    check(r["metric"] == 1002.0, "metric from the last matching line")
for r in b["runs"]:
    check(r["driver_alloc_calls"] == 1 and r["peak_device_bytes"] == 256 << 20,
          f"arm B run {r}")
check(a["wall_s_median"] > 0 and b["metric_median"] == 1002.0, "medians")

# The table, a baseline without the shim, and a failing job.
p = sh("ab", "--repeat", "1", "--baseline", "none", "--", workload, "5", "1")
check(p.returncode == 1, f"failing job: ab exits 1, got {p.returncode}")
lines = p.stdout.splitlines()
calls = [l for l in lines if l.startswith("driver allocation calls")]
check(calls and calls[0].split()[3] == "n/a" and calls[0].split()[4] == "1",
      f"table row: {calls}")
status = [l for l in lines if l.startswith("exit status")]
check(status and status[0].split()[2:] == ["5", "5"], f"exit row: {status}")

check.finish()
