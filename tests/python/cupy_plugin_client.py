#!/usr/bin/env python3
"""cupy_plugin_client.py - bfcshim.cupy over the CuPy stand-in (cupy_stub/)
on the fake driver, without LD_PRELOAD: arrays whose stream goes before
them. Prints one JSON line; the test decides what is right."""
import ctypes
import gc
import json

import cupy
import bfcshim.cupy

cu = ctypes.CDLL("libcuda.so.1")


def stale_handle_uses():
    """The fake driver's count of calls on destroyed handles."""
    cu.fakecuda_api_table.restype = ctypes.POINTER(ctypes.c_void_p * 8)
    table = cu.fakecuda_api_table().contents
    stats = (ctypes.c_uint64 * 64)()
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(table[4])(ctypes.addressof(stats))
    return stats[21]  # fakecuda_stats.stale_handle_uses


def main():
    assert cu.cuInit(0) == 0
    ctx = ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    out = {}
    # A CuPy Stream collected before its array.
    s = cupy.cuda.Stream()
    cupy.cuda.set_current_stream(s)
    m = bfcshim.cupy.malloc(1 << 20)
    cupy.cuda.set_current_stream(None)
    handle = s.ptr
    del s
    gc.collect()
    out["stream_kept_while_array_lives"] = handle not in cupy.cuda.destroyed
    del m
    gc.collect()
    out["stream_destroyed_after"] = handle in cupy.cuda.destroyed
    first_stale = stale_handle_uses()
    out["first_stale"] = first_stale
    # A stream CuPy does not own, destroyed by its owner before the array.
    raw = ctypes.c_void_p()
    assert cu.cuStreamCreate(ctypes.byref(raw), 1) == 0
    cupy.cuda.set_current_stream(cupy.cuda.ExternalStream(raw.value))
    m = bfcshim.cupy.malloc(1 << 20)
    cupy.cuda.set_current_stream(None)
    assert cu.cuStreamDestroy_v2(raw) == 0
    del m
    gc.collect()
    ext_stale = stale_handle_uses()
    # Later allocations: a lane opened for a dead handle would be asked
    # about at each of them.
    kept = [bfcshim.cupy.malloc(1 << 20) for _ in range(10)]
    out["stale_handle_uses"] = stale_handle_uses()
    out["ext_stale"] = ext_stale
    # Out of memory is CuPy's own error (code catching it, CuPy's included,
    # must see it), and a size CuPy could never ask for is refused as such.
    try:
        bfcshim.cupy.malloc(1 << 50)
        out["oom"] = "no error"
    except Exception as e:  # noqa: BLE001 - the test decides
        out["oom"] = f"{type(e).__module__}.{type(e).__qualname__}"
    try:
        bfcshim.cupy.malloc(-1)
        out["negative"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["negative"] = type(e).__name__
    out["in_use"] = sum(p["bytes_in_use"] for p in bfcshim.stats()["pools"])
    print(json.dumps(out), flush=True)
    del kept


main()
