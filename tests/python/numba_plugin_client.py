#!/usr/bin/env python3
"""numba_plugin_client.py - real Numba with bfcshim's EMM plug-in
(NUMBA_CUDA_MEMORY_MANAGER=bfcshim.numba, set by the test) on the fake
driver: arrays on several streams, round trips, memory info, reset.
Prints one JSON line; the test decides what is right."""
import json
import sys

import numpy as np
from numba import cuda

import bfcshim


def pooled_bytes():
    return sum(p["bytes_in_use"] for p in bfcshim.stats()["pools"])


def main():
    ctx = cuda.current_context()
    out = {"manager": type(ctx.memory_manager).__module__ + "." +
           type(ctx.memory_manager).__name__}
    rng = np.random.default_rng(2)
    streams = [cuda.stream() for _ in range(3)]
    bad = rounds = 0
    for r in range(30):
        s = streams[r % len(streams)]
        n = int(rng.integers(1, 200000))
        host = rng.integers(0, 1 << 31, n, dtype=np.uint32)
        d = cuda.to_device(host, stream=s)
        e = cuda.device_array(n, dtype=np.uint32, stream=s)
        e.copy_to_device(d, stream=s)
        back = e.copy_to_host(stream=s)
        s.synchronize()
        bad += int(not np.array_equal(back, host))
        rounds += 1
        del d, e
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
