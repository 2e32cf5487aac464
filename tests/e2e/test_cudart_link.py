#!/usr/bin/env python3
"""A program built by nvcc with its default static cudart cannot run on the
fake GPU (the runtime inside it asks the driver for private tables,
cuGetExportTable, that the fake cannot serve, and every CUDA call fails with
801 "operation not supported"): `bfcshim run --fake-gpu` and `ab --fake-gpu`
refuse it in one line that says why and how to relink, and the fake driver
says the same once when such a program reaches it by another way. The same
program built with -cudart shared runs there, its allocation pooled. With
the driver door closed, `bfcshim run` warns that none of a static
program's allocations would reach the pool.

usage: test_cudart_link.py BFCSHIM LIBBFCSHIM FAKE_CUDA_DIR WORKDIR [STATIC SHARED]
Skips (77) without the two programs (no nvcc in the toolkit).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testcheck  # noqa: E402

bfcshim, lib, fake_dir, work = sys.argv[1:5]
if len(sys.argv) < 7:
    print("nvcc was not found when the project was configured: the nvcc-built programs are "
          "missing; skipping")
    sys.exit(77)
static, shared = sys.argv[5:7]
testcheck.fresh_dir(work)
check = testcheck.Checks()
env = dict(os.environ)
env.pop("LD_PRELOAD", None)
env.pop("LD_LIBRARY_PATH", None)  # no driver unless --fake-gpu brings the fake
env.update(BFCSHIM_LIBRARY=lib)


def run(*args, **extra):
    return subprocess.run(list(args), env=dict(env, **extra), capture_output=True, text=True,
                          timeout=120)


def ours(stderr):
    """The command's own lines other than --fake-gpu's note."""
    return [l for l in stderr.splitlines()
            if l.startswith("bfcshim ") and "CUDA goes to the fake driver" not in l]


# bfcshim run/ab --fake-gpu refuse the static program, in one line, before it
# starts (it would fail with 801 and no word why).
for cmd in (["run"], ["ab", "--repeat", "1"]):
    p = run(bfcshim, *cmd, "--fake-gpu", "--", static)
    lines = ours(p.stderr)
    check(p.returncode == 2 and p.stdout == "" and len(lines) == 1 and static in lines[0] and
          "linked in statically" in lines[0] and "-cudart shared" in lines[0] and
          "801" in lines[0], f"{cmd[0]} --fake-gpu {static}: {p.returncode} {p.stderr!r}")

# Built with -cudart shared, it runs on the fake libcudart, its allocation
# pooled, and nothing is said of it.
stats = os.path.join(work, "shared.json")
p = run(bfcshim, "run", "--fake-gpu", "--stats-file", stats, "--", shared)
check(p.returncode == 0 and "cudart_link: ok" in p.stdout and not ours(p.stderr) and
      "fake libcuda:" not in p.stderr, f"run --fake-gpu {shared}: {p.returncode} {p.stderr!r}")
pools = json.load(open(stats))["pools"] if os.path.exists(stats) else []
check(sum(pl["num_allocs"] for pl in pools) == 1, f"the shared program's cudaMalloc pooled: {pools}")

# Programs without a runtime of their own, or with the shared one, pass.
for prog in ("/bin/true", "true"):
    p = run(bfcshim, "run", "--fake-gpu", "--", prog)
    check(p.returncode == 0 and not ours(p.stderr), f"run --fake-gpu {prog}: {p.stderr!r}")

# Reached another way (the shim preloaded by hand, the fake first in the
# loader's path), the fake driver says it once: the program fails as before,
# now with the reason.
p = run(static, **testcheck.fake_cuda_env(fake_dir, LD_PRELOAD=lib))
fake_lines = [l for l in p.stderr.splitlines() if l.startswith("fake libcuda:")]
check(p.returncode != 0 and "801" in p.stderr and len(fake_lines) == 1 and
      static in fake_lines[0] and "linked in statically" in fake_lines[0] and
      "-cudart shared" in fake_lines[0], f"{static} on the fake directly: {p.stderr!r}")

# On a GPU it runs as it is, through the driver door; with the door closed
# its allocations would pass the pool by: a warning, and the program runs.
# (Here there is no driver: the program fails on its own.)
for how in (["--no-driver-hooks"], ["--env", "BFCSHIM_DRIVER_HOOKS=off"]):
    p = run(bfcshim, "run", *how, "--", static)
    lines = ours(p.stderr)
    check(p.returncode != 2 and len(lines) == 1 and lines[0].startswith("bfcshim run: warning:") and
          "none of its allocations reach the pool" in lines[0],
          f"run {how} {static}: {p.returncode} {p.stderr!r}")
p = run(bfcshim, "run", "--", static)
check(not ours(p.stderr), f"run {static} with the driver door open: nothing said: {p.stderr!r}")

check.finish()
