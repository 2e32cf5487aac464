#!/usr/bin/env python3
"""numba_job.py - Numba's CUDA driver layer (code nobody here wrote: numba-cuda
reaches libcuda.so.1 through NVIDIA's cuda-bindings, which finds every entry
point with cuGetProcAddress) as a client of the shim's driver door.

Device arrays of many sizes on several streams, a kernel that writes a
pattern, round trips host -> device -> host, explicit frees, and
get_memory_info. Checks that every round trip is intact and, under the shim,
that Numba's allocations were served by the pool (the stats file counts them)
and that none passed through.

Prints one `RESULT {json}` line and exits 1 on a wrong value.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucommon  # noqa: E402


def binding_name():
    """Which binding Numba drives the driver through: the module its driver
    layer calls (numba-cuda 0.30 imports cuda.bindings.driver as `binding`;
    older releases drove libcuda through ctypes)."""
    from numba.cuda.cudadrv import driver
    binding = getattr(driver, "binding", None)
    return getattr(binding, "__name__", "ctypes") if binding is not None else "ctypes"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", default="?")
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()

    import numpy as np
    if not hasattr(np, "row_stack"):
        # numba 0.68 registers an overload for np.row_stack, which NumPy 2.4
        # removed (seen on the GPU image: numba 0.68.0 with numpy 2.5.2).
        # The alias lets it import; this job never calls it.
        np.row_stack = np.vstack
    from numba import cuda

    @cuda.jit
    def pattern(out, seed):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = (i * 2654435761 + seed) & 0xFFFFFFFF

    streams = [cuda.stream() for _ in range(4)]
    free0, total = cuda.current_context().get_memory_info()
    bad, t0 = 0, time.perf_counter()
    rng = np.random.default_rng(3)
    for r in range(args.rounds):
        s = streams[r % len(streams)]
        n = int(rng.integers(1, 1 << 22))
        host = rng.integers(0, 1 << 31, n, dtype=np.uint32)
        d = cuda.to_device(host, stream=s)
        back = d.copy_to_host(stream=s)
        e = cuda.device_array(n, dtype=np.uint32, stream=s)
        pattern[(n + 255) // 256, 256, s](e, r)
        got = e.copy_to_host(stream=s)
        s.synchronize()
        want = ((np.arange(n, dtype=np.uint64) * 2654435761 + r) & 0xFFFFFFFF).astype(np.uint32)
        bad += int(not np.array_equal(back, host)) + int(not np.array_equal(got, want))
        del d, e
    cuda.current_context().deallocations.clear()
    free1, _ = cuda.current_context().get_memory_info()
    shim = gpucommon.shim_totals(gpucommon.shim_stats())
    res = {
        "workload": "numba-driver",
        "arm": args.arm,
        "numba_binding": binding_name(),
        "rounds": args.rounds,
        "wrong_round_trips": bad,
        "seconds": time.perf_counter() - t0,
        "free_before": free0, "free_after": free1, "total": total,
        "shim": shim,
    }
    gpucommon.emit(res)
    if bad:
        sys.exit(1)
    if shim and (shim["num_allocs"] < args.rounds or shim["passthrough_allocs"]):
        print("error: Numba's allocations did not all reach the pool", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
