#!/usr/bin/env python3
"""test_config_errors.py BFCSHIM E2E_API FAKE_CUDA_DIR WORKDIR - what a user
with a bad setting sees. A malformed BFCSHIM_* value stops the program at
its first CUDA call with the variable, the value and what is accepted
(exit 78), also on stderr when the log goes to a file;
BFCSHIM_CONFIG_ERRORS=warn runs on with the defaults; an unknown BFCSHIM_*
name gets the nearest known one; `bfcshim run` refuses bad --env values and
options before starting anything, and `bfcshim ab` its --env-a and --env-b
values as well."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testcheck  # noqa: E402

bfcshim, program, fake_dir, work = sys.argv[1:5]
testcheck.fresh_dir(work)
check = testcheck.Checks()


def run(argv, **env):
    e = testcheck.fake_cuda_env(fake_dir, **env)
    return subprocess.run(argv, env=e, capture_output=True, text=True, timeout=120)


# 1. malformed values stop the program, each named with what is accepted
p = run([program, "plain"], BFCSHIM_MEM_FRACTION="1.5", BFCSHIM_PREALLOCATE="maybe")
check(p.returncode == 78, f"exit 78 (EX_CONFIG), got {p.returncode}: {p.stderr}")
check("plain: ok" not in p.stdout, "the program did not run on")
for words in ("BFCSHIM_MEM_FRACTION='1.5' is not a number from 0.000001 to 1",
              "BFCSHIM_PREALLOCATE='maybe' is not true or false",
              "stopping the program: 2 malformed", "BFCSHIM_CONFIG_ERRORS=warn"):
    check(words in p.stderr, f"stderr says {words!r}: {p.stderr}")

# 2. with the log in a file, stderr still says why the program stopped
log = os.path.join(work, "shim.log")
p = run([program, "plain"], BFCSHIM_FENCE_INTERVAL="0", BFCSHIM_LOG_FILE=log)
check(p.returncode == 78 and "listed in BFCSHIM_LOG_FILE" in p.stderr,
      f"stop line on stderr: {p.returncode} {p.stderr}")
text = open(log).read() if os.path.exists(log) else ""
check("BFCSHIM_FENCE_INTERVAL='0' is not a whole number from 1 to 4096" in text,
      f"details in the log file: {text}")

# ... a whole number is digits: no exponent, hex, sign, blank or fraction
for value in ("1e2", "0x10", " 5", "5.0", "+5"):
    p = run([program, "plain"], BFCSHIM_FENCE_INTERVAL=value)
    check(p.returncode == 78 and f"BFCSHIM_FENCE_INTERVAL='{value}' is not a whole number" in
          p.stderr, f"FENCE_INTERVAL={value!r} refused: {p.returncode} {p.stderr}")

# 3. the opt-out: defaults, one line per setting and one that says so
p = run([program, "plain"], BFCSHIM_MEM_FRACTION="lots", BFCSHIM_CONFIG_ERRORS="warn")
check(p.returncode == 0 and "plain: ok" in p.stdout, f"runs on: {p.returncode} {p.stderr}")
check("running on with the defaults" in p.stderr, f"and says so: {p.stderr}")

# 4. a misspelt name: a warning with the nearest known name, the program runs
p = run([program, "plain"], BFCSHIM_MEM_FRACTON="0.5")
check(p.returncode == 0, f"an unknown name is not fatal: {p.stderr}")
check("BFCSHIM_MEM_FRACTON is not a bfcshim variable" in p.stderr and
      "did you mean BFCSHIM_MEM_FRACTION?" in p.stderr, f"nearest name: {p.stderr}")
# ... also in the wrong case, which the environment tells apart
p = run([program, "plain"], bfcshim_mem_fraction="0.5")
check(p.returncode == 0, f"a lower-case name is not fatal: {p.stderr}")
check("bfcshim_mem_fraction is not a bfcshim variable" in p.stderr and
      "did you mean BFCSHIM_MEM_FRACTION?" in p.stderr, f"lower case: {p.stderr}")

# ... and a valid setting that cannot act here says so instead of doing
# nothing: a growing pool over virtual memory has no regions to size
p = run([program, "trim"], BFCSHIM_PREALLOCATE="false", BFCSHIM_INITIAL_REGION="64MiB")
check(p.returncode == 0, f"runs: {p.returncode} {p.stderr}")
check("BFCSHIM_INITIAL_REGION has no effect" in p.stderr and "BFCSHIM_VMM=off" in p.stderr,
      f"the initial region over virtual memory is said to do nothing: {p.stderr}")
p = run([program, "trim"], BFCSHIM_PREALLOCATE="false", BFCSHIM_VMM="off",
        BFCSHIM_INITIAL_REGION="64MiB")
check(p.returncode == 0 and "BFCSHIM_INITIAL_REGION" not in p.stderr,
      f"without virtual memory it acts, silently: {p.stderr}")

# 5. bfcshim run checks --env and options before launching
for argv, words in (
        (["--env", "BFCSHIM_MEM_FRACTION=2"], "--env BFCSHIM_MEM_FRACTION '2' is not a number"),
        (["--env", "BFCSHIM_FENCE_INTERVL=4"], "did you mean BFCSHIM_FENCE_INTERVAL?"),
        (["--fraction", "0"], "--fraction '0' is not a number from 0.000001 to 1"),
        (["--placement", "best"], "is not one of age, low, aligned"),
        (["--log-level", "loud"], "is not one of error, warn, info, debug")):
    p = run([bfcshim, "run", *argv, "--", program, "plain"])
    check(p.returncode == 2 and words in p.stderr and "plain: ok" not in p.stdout,
          f"bfcshim run {argv}: {p.returncode} {p.stderr}")
p = run([bfcshim, "run", "--env", "MY_VAR=1", "--env", "BFCSHIM_FENCE_BYTES=32MiB", "--",
         program, "plain"])
check(p.returncode == 0 and "plain: ok" in p.stdout, f"good --env values pass: {p.stderr}")

# 6. so does bfcshim ab, for each arm's variables (--env-a, --env-b) too: a
# bad one is refused before any run, not found as arm B's exit 78 in a table
for argv, words in (
        (["--env-b", "BFCSHIM_GC=maybe"], "--env-b BFCSHIM_GC 'maybe' is not true or false"),
        (["--env-a", "BFCSHIM_MEM_FRACTON=0.5"],
         "--env-a BFCSHIM_MEM_FRACTON: not a bfcshim variable; did you mean "
         "BFCSHIM_MEM_FRACTION?"),
        (["--env-b", "BFCSHIM_STATS_FILE=" + os.path.join(work, "no-such-dir", "s.json")],
         "the folder"),
        (["--env", "BFCSHIM_ALIGNMENT=3"], "--env BFCSHIM_ALIGNMENT '3' is not a power of two")):
    p = run([bfcshim, "ab", "--repeat", "1", *argv, "--", program, "plain"])
    check(p.returncode == 2 and words in p.stderr and "run 1/" not in p.stderr,
          f"bfcshim ab {argv}: {p.returncode} {p.stderr}")
p = run([bfcshim, "ab", "--repeat", "1", "--env-a", "MY_VAR=1", "--env-b",
         "BFCSHIM_FENCE_BYTES=32MiB", "--", program, "plain"])
# (arm A is the platform mode, where "plain" finds no pool: only B's exit counts)
check("exit status" in p.stdout and re.search(r"B: bfcshim pool \.\.\. .*exit 0", p.stderr),
      f"good --env-a/-b values pass: {p.stderr}")
# 7. the pool's creation line says where its size came from in the user's
# terms: a limit past the device is said to be capped (it read "MEM_LIMIT of
# 1.00 GiB", the device's size, as if that were the limit), and an
# out-of-memory hint gives a tiny fraction's value, not "now 0.00"
p = run([program, "plain"], BFCSHIM_LOG_LEVEL="info", BFCSHIM_MEM_LIMIT="40GiB")
check("pool of 1.00 GiB (BFCSHIM_MEM_LIMIT=40.0 GiB, capped at the device's 1.00 GiB)"
      in p.stderr, f"a capped limit is said to be capped: {p.stderr}")
p = run([program, "plain"], BFCSHIM_LOG_LEVEL="info", BFCSHIM_MEM_FRACTION="0.5")
check("pool of 512 MiB (BFCSHIM_MEM_FRACTION=0.5 of the device's 1.00 GiB)" in p.stderr,
      f"a fraction is named with its value: {p.stderr}")
p = run([program, "plain"], BFCSHIM_MEM_FRACTION="0.000001")
check("(now 0.002)" in p.stderr and "now 0.00)" not in p.stderr,
      f"the hint names the fraction in force: {p.stderr}")
check.finish()
