#!/usr/bin/env python3
"""test_numba_suite.py LIBBFCSHIM FAKE_CUDA_DIR WORKDIR - Numba's own CUDA
driver tests (numba.cuda.tests.cudadrv, code nobody here wrote) against the
fake driver, alone and under the shim.

Alone, they check the fake: each test passes, or is skipped by Numba, or
fails only for want of something the fake does not model (kernels, page-
locked or managed host memory; docs/limitations.md), named by the entry
point it lacks. Under the shim, each test ends as it did alone, Numba's
allocations come from the pool, and nothing is logged as an error. Skips
(77) without numba-cuda and the test helpers Numba's suite imports (pytest,
filecheck; scripts/deps.sh --with-tests installs them)."""
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
sys.path.insert(0, here)
import testcheck  # noqa: E402
from numba_suite_modules import MODULES  # noqa: E402

lib, fake_dir, work = sys.argv[1:4]
testcheck.require_module("numba.cuda.testing", "numba-cuda's test helpers")
testcheck.fresh_dir(work)
check = testcheck.Checks()
runner = os.path.join(here, "numba_suite_runner.py")

# What the fake does not model, by the entry point Numba finds missing
# (page-locked memory from cuMemHostAlloc is modelled; registering the
# program's own memory is not).
NOT_MODELLED = {
    "cuLibraryLoadData": "kernels (modules, libraries, launches)",
    "cuMemHostRegister_v2": "registered host memory",
    "cuMemAllocManaged": "managed memory",
}

# Tests that exercise what the fake was fixed to do: they must pass.
MUST_PASS = [
    # cuEventElapsedTime and cuCtxGetStreamPriorityRange
    "test_events.TestCudaEvent.test_event_elapsed",
    "test_events.TestCudaEvent.test_event_elapsed_stream",
    # CUDA_VISIBLE_DEVICES read at cuInit
    "test_runtime.TestVisibleDevices.test_visible_devices_set_after_import",
    # copies queued behind frees (the fake crashed in a later synchronisation)
    "test_deallocations.TestDeallocation.test_max_pending_bytes",
    "test_select_device.TestSelectDevice.test_select_device",
    # page-locked host memory (cuMemHostAlloc; mapped: its device pointer,
    # its range, a memset through it)
    "test_host_alloc.TestHostAlloc.test_host_alloc_driver",
    "test_host_alloc.TestHostAlloc.test_host_alloc_mapped",
]


def not_modelled(reason):
    return next((what for key, what in NOT_MODELLED.items() if key in reason), None)


# Modules run in a process of their own: a test that fails for want of
# what the fake does not model may leave driver state behind that a real
# driver would keep too. test_cuda_driver's graph-builder tests begin a
# global-mode capture and, with no kernels on the fake, never end it; in the
# same process every later cuCtxSynchronize is then refused
# (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, test_select_device failed so).
ISOLATED = ["test_cuda_driver"]


def run(tag, **env):
    e = testcheck.fake_cuda_env(fake_dir, **env)
    rest = [m for m in MODULES if m not in ISOLATED]
    tests = {}
    for i, modules in enumerate([rest] + [[m] for m in ISOLATED if m in MODULES]):
        out = os.path.join(work, f"{tag}-{i}.json")
        p = subprocess.run([sys.executable, runner, out] + modules, env=e, capture_output=True,
                           text=True, timeout=900, cwd=work)
        check(p.returncode == 0 and os.path.exists(out),
              f"{tag} {modules[0]}...: the suite ran to its end (exit {p.returncode}): "
              f"{p.stderr[-3000:]}")
        if os.path.exists(out):
            tests.update({t["id"]: t for t in json.load(open(out))["tests"]})
    return tests


def short(test_id):
    return test_id.replace("numba.cuda.tests.cudadrv.", "")


# Alone, with the fake's cuMemFree synchronising (FAKECUDA_FREE_NO_SYNC=0,
# whatever the environment says: scripts/check.sh runs the e2e suite again
# under =1): Numba frees memory its queued copies still target
# (test_deallocations), as the Programming Guide's "cudaFree causes the GPU
# to synchronize" allows. Under the shim, whichever reading is set.
alone = run("alone", FAKECUDA_FREE_NO_SYNC="0")
passed = [t for t in alone.values() if t["outcome"] == "ok"]
unexplained = [f"{short(t['id'])}: {t['reason']}" for t in alone.values()
               if t["outcome"] in ("error", "fail") and not not_modelled(t["reason"])]
check(not unexplained, "alone, every failure is something the fake does not model:\n  " +
      "\n  ".join(unexplained))
check(len(passed) >= 100, f"alone, most of the suite passes ({len(passed)} of {len(alone)})")
for name in MUST_PASS:
    t = alone.get("numba.cuda.tests.cudadrv." + name, {})
    check(t.get("outcome") == "ok", f"alone, {name} passes: {t}")
by_reason = {}
for t in alone.values():
    what = not_modelled(t["reason"]) if t["outcome"] in ("error", "fail") else None
    if what:
        by_reason[what] = by_reason.get(what, 0) + 1
print(f"alone: {len(passed)} passed, {sum(t['outcome'] == 'skip' for t in alone.values())} "
      f"skipped by Numba, not modelled: {by_reason}")

stats = os.path.join(work, "stats.json")
log = os.path.join(work, "shim.log")
shim = run("shim", LD_PRELOAD=lib, BFCSHIM_STATS_FILE=stats, BFCSHIM_LOG_FILE=log)
changed = [f"{short(k)}: {alone[k]['outcome']} alone, {shim.get(k, {}).get('outcome')} "
           f"under the shim: {shim.get(k, {}).get('reason')}"
           for k in alone if shim.get(k, {}).get("outcome") != alone[k]["outcome"]]
check(shim and not changed, "under the shim, each test ends as it did alone:\n  " +
      "\n  ".join(changed))
doc = json.load(open(stats)) if os.path.exists(stats) else {"pools": []}
allocs = sum(p.get("num_allocs", 0) for p in doc.get("pools", []))
check(allocs > 0 and doc.get("passthrough_allocs") == 0,
      f"Numba's allocations came from the pool ({allocs}, "
      f"{doc.get('passthrough_allocs')} passed through)")
text = open(log).read() if os.path.exists(log) else ""
check("error" not in text.lower(), f"no errors logged: {text[-1500:]}")
check.finish()
