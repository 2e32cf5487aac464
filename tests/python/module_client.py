#!/usr/bin/env python3
"""module_client.py MODE WORKDIR - the bfcshim Python module in a process
on the fake driver. MODE: `plugin` (the library loaded by the module) or
`preloaded` (LD_PRELOAD set by the test: the module must use that copy, and
the driver door and the module must share one pool). Prints one JSON line
of what it saw; the test decides what is right."""
import ctypes
import json
import os
import sys

import bfcshim
from bfcshim import _library

mode, work = sys.argv[1:3]
cuda = ctypes.CDLL("libcuda.so.1")
ctx = ctypes.c_void_p()
assert cuda.cuInit(0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0

out = {"library": bfcshim.library_path(), "active": bfcshim.active()}
lib = _library.load()
MiB = 1 << 20
p = ctypes.c_void_p()
out["malloc"] = lib.bfcshim_malloc(ctypes.byref(p), 8 * MiB, 0)
# The program's own driver call: pooled only when the library is preloaded.
d = ctypes.c_uint64()
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
out["driver_alloc"] = cuda.cuMemAlloc_v2(ctypes.byref(d), 4 * MiB)
s = bfcshim.stats()
out["pools"] = len(s["pools"])
out["bytes_in_use"] = sum(q["bytes_in_use"] for q in s["pools"])
out["free_total"] = bfcshim.mem_get_info(0)
out["free_total_current"] = bfcshim.mem_get_info()
path = os.path.join(work, f"stats-{mode}.json")
bfcshim.write_stats(path)
out["written"] = json.load(open(path))["pools"][0]["num_allocs"]
os.environ.pop("BFCSHIM_STATS_FILE", None)
for bad in ("", os.path.join(work, "no-such-dir", "stats.json")):
    try:
        bfcshim.write_stats(bad)
        out.setdefault("bad_paths", []).append("no error")
    except Exception as e:  # noqa: BLE001 - the test decides
        out.setdefault("bad_paths", []).append(type(e).__name__)
out["free"] = lib.bfcshim_free(p)
cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
cuda.cuMemFree_v2(d)
cuda.cuCtxSynchronize()
out["trimmed"] = bfcshim.trim()
out["after_trim"] = bfcshim.stats()["pools"][0]["pool_bytes"]
try:
    bfcshim.mem_get_info(5)
    out["bad_device"] = "no error"
except RuntimeError as e:
    out["bad_device"] = f"{type(e).__name__}: {e}"
try:
    big = ctypes.c_void_p()
    _library.check(lib.bfcshim_malloc(ctypes.byref(big), 1 << 50, 0), "huge")
    out["oom"] = "no error"
except MemoryError as e:
    out["oom"] = str(e)
print(json.dumps(out), flush=True)
