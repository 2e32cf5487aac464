#!/usr/bin/env python3
"""cupy_job.py - a CuPy job for A/B runs of the allocator.

Each iteration builds arrays of several sizes (matrix products, element-wise
kernels, reductions, a sort), checks one result against NumPy on the host
and drops everything, so each array is one allocation and one free.
--pool off sends every array to cudaMalloc/cudaFree
(cupy.cuda.set_allocator(None)), which the shim then serves; --pool on keeps
CuPy's own memory pool.

Prints one `RESULT {json}` line: median iteration time after warm-up, a
digest of the checksums, NVML's peak, CuPy's pool figures, the shim's
statistics when it is loaded.
"""
import argparse
import hashlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucommon  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", default="?")
    ap.add_argument("--pool", choices=("on", "off", "bfcshim"), default="on",
                    help="CuPy's pool, none (cudaMalloc), or bfcshim.cupy's plug-in")
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()

    nvml = gpucommon.NvmlPeak()
    import cupy as cp
    import numpy as np

    if args.pool == "off":
        cp.cuda.set_allocator(None)
    elif args.pool == "bfcshim":
        import bfcshim.cupy  # PYTHONPATH=python, BFCSHIM_LIBRARY (scripts/gpu-proof.sh)
        bfcshim.cupy.install()
    rng = np.random.default_rng(7)
    host = rng.standard_normal((2048, 2048), dtype=np.float32)
    times, sums, exact, bad = [], [], [], 0
    for it in range(args.warmup + args.iters):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        a = cp.asarray(host)
        b = a @ a.T
        c = cp.tanh(b[: 512 + it % 7 * 128]) * 0.5 + 1.0
        d = cp.sort(c.ravel())
        v = cp.cumsum(d[:: 3 + it % 5])
        small = [cp.arange(n, dtype=cp.float32) * it for n in (1, 100, 4097, 65536, 1 << 20)]
        total = float(v[-1]) + sum(float(s.sum()) for s in small)
        # integers: the same bits whatever the allocator or kernel choice
        ints = cp.sort((cp.arange(1 << 20, dtype=cp.int64) * 2654435761 + it) % 1000003)
        exact.append(int(cp.cumsum(ints)[-1]) ^ int(ints[12345]))
        cp.cuda.Device().synchronize()
        dt = time.perf_counter() - t0
        if it == 0:  # the product checked once against NumPy
            ref = host @ host.T
            got = cp.asnumpy(b)
            bad += int(not np.allclose(got, ref, rtol=1e-3, atol=1e-2))
        sums.append(total)
        del a, b, c, d, v, small, ints
        if it >= args.warmup:
            times.append(dt)
    pool = cp.get_default_memory_pool()
    res = {
        "workload": "cupy-mix",
        "arm": args.arm,
        "cupy": cp.__version__,
        "pool": args.pool,
        "iter_ms_median": 1e3 * gpucommon.median(times),
        "iter_ms_min": 1e3 * min(times),
        "checks_failed": bad,
        "exact_digest": hashlib.sha1(",".join(map(str, exact)).encode()).hexdigest()[:16],
        # float sums: cuBLAS may pick other kernels for other addresses
        "sum_digest": gpucommon.float_digest(sums),
        "cupy_pool_total_bytes": pool.total_bytes(),
        "shim": gpucommon.shim_totals(gpucommon.shim_stats()),
        "nvml_peak_bytes": nvml.stop(),
    }
    gpucommon.emit_and_exit(res, bad)


if __name__ == "__main__":
    main()
