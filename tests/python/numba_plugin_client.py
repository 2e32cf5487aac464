#!/usr/bin/env python3
"""numba_plugin_client.py - real Numba with bfcshim's EMM plug-in
(NUMBA_CUDA_MEMORY_MANAGER=bfcshim.numba, set by the test) on the fake
driver: arrays on several streams, round trips, memory info, reset.
Prints one JSON line; the test decides what is right."""
import json
import os
import sys

import numpy as np
from numba import cuda

import bfcshim

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from numba_client import round_trips  # noqa: E402


def pooled_bytes():
    return sum(p["bytes_in_use"] for p in bfcshim.stats()["pools"])


def unseen_stream_reuse(ctx):
    """A block freed (Numba's deferred deallocation, through the plug-in's
    bfcshim_free) while work on a non-blocking stream the program made with
    the driver itself (as cuda.external_stream would wrap a PyTorch or CuPy
    stream) still uses it: the next allocation of its size, in a pool full
    but for it, must not get it before that work has run. Returns whether it
    did, and whether the work had run when the block came back."""
    import ctypes
    cu = ctypes.CDLL("libcuda.so.1")
    cu.fakecuda_api_table.restype = ctypes.POINTER(ctypes.c_void_p * 8)
    table = cu.fakecuda_api_table().contents
    work = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    launch = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, work, ctypes.c_void_p)(table[0])
    ran = []
    kernel = work(lambda arg: ran.append(True))
    stream = ctypes.c_void_p()
    assert cu.cuStreamCreate(ctypes.byref(stream), 1) == 0  # CU_STREAM_NON_BLOCKING
    mib = 1 << 20
    hole = cuda.device_array(mib, dtype=np.uint8)
    free, _ = bfcshim.mem_get_info(0)
    filler = cuda.device_array(free - mib // 2, dtype=np.uint8)  # only the hole is left
    assert launch(stream.value, kernel, None) == 0
    address = hole.device_ctypes_pointer.value
    del hole
    ctx.deallocations.clear()  # Numba's deferred frees run now
    again = cuda.device_array(mib, dtype=np.uint8)
    same = again.device_ctypes_pointer.value == address
    result = {"reused": same, "work_ran_first": bool(ran)}
    del again, filler
    ctx.deallocations.clear()
    fakecuda_complete_all = ctypes.CFUNCTYPE(None)(table[2])
    fakecuda_complete_all()
    cu.cuStreamDestroy_v2(stream)
    return result


def main():
    ctx = cuda.current_context()
    if os.environ.get("NUMBA_CLIENT_UNSEEN"):  # a fresh pool, one region
        print(json.dumps({"unseen_stream": unseen_stream_reuse(ctx)}), flush=True)
        return 0
    if os.environ.get("NUMBA_CLIENT_OOM"):  # what an array too large raises
        try:
            cuda.device_array(1 << 50, dtype=np.uint8)
            oom = {"error": None}
        except Exception as e:  # noqa: BLE001 - the test decides
            from numba.cuda.cudadrv.driver import CudaAPIError
            oom = {"error": type(e).__name__, "is_memory_error": isinstance(e, MemoryError),
                   "code": int(e.code) if isinstance(e, CudaAPIError) else None}
        print(json.dumps({"oom": oom, "after_ok": bool(cuda.to_device(np.arange(10)).copy_to_host()
                                                       .sum() == 45)}), flush=True)
        return 0
    out = {"manager": type(ctx.memory_manager).__module__ + "." +
           type(ctx.memory_manager).__name__}
    rounds, bad = round_trips(30, [cuda.stream() for _ in range(3)], 200000, 2)
    out.update(rounds=rounds, bad=bad)
    st = bfcshim.stats()
    out["num_allocs"] = sum(p["num_allocs"] for p in st["pools"])
    out["passthrough"] = st["passthrough_allocs"]
    out["in_use_after_loop"] = pooled_bytes()
    free, total = ctx.get_memory_info()
    out["memory_info"] = [free, total]
    out["bfcshim_info"] = list(bfcshim.mem_get_info(0))
    keep = cuda.device_array(1 << 20, dtype=np.uint8)
    out["in_use_kept"] = pooled_bytes()
    try:
        keep.get_ipc_handle()
        out["ipc"] = "allowed"
    except Exception as e:  # the plug-in refuses it
        out["ipc"] = str(e)
    ctx.reset()
    out["in_use_after_reset"] = pooled_bytes()
    del keep  # its finalizer must not free a second time
    again = cuda.to_device(np.arange(1000, dtype=np.int64))
    out["after_reset_ok"] = bool(np.array_equal(again.copy_to_host(), np.arange(1000)))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
