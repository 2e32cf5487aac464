#!/usr/bin/env python3
"""numba_suite.py --arm ARM --out FILE.json - Numba's own CUDA driver-layer
tests (the modules tests/e2e/test_numba_suite.py runs on the fake) on the
real driver, through tests/e2e/numba_suite_runner.py in a child process that
inherits this one's environment (LD_PRELOAD for the shim's arm).

On a GPU every test should pass, kernels included; the shim's arm should end
each test as the native arm does (summarize.py compares them). Prints one
`RESULT {json}` line: counts by outcome and the tests that did not pass,
with their reasons; exits 1 when the suite could not run to its end."""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucommon  # noqa: E402

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "tests", "e2e"))
from numba_suite_modules import MODULES  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--arm", required=True)
ap.add_argument("--out", required=True)
a = ap.parse_args()
runner = os.path.join(root, "tests", "e2e", "numba_suite_runner.py")
p = subprocess.run([sys.executable, runner, a.out] + MODULES,
                   capture_output=True, text=True, timeout=500)
tests = json.load(open(a.out))["tests"] if os.path.exists(a.out) else []
counts = {}
for t in tests:
    counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
not_ok = {t["id"].replace("numba.cuda.tests.cudadrv.", ""): t["reason"][:200]
          for t in tests if t["outcome"] in ("error", "fail")}
gpucommon.emit({"arm": a.arm, "suite_exit": p.returncode, "counts": counts,
                "not_ok": not_ok, "stderr_tail": p.stderr[-800:] if p.returncode else ""})
sys.exit(0 if p.returncode == 0 and tests else 1)
