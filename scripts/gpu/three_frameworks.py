#!/usr/bin/env python3
"""three_frameworks.py - PyTorch, JAX and CuPy in one process, passing arrays
to each other through DLPack (no copies), each doing its part of a
computation, checked on the host at the end of every round.

Without the shim each framework keeps its own allocator (PyTorch's cache,
JAX's BFC, CuPy's pool), and memory one has cached is lost to the others.
Under libbfcshim.so with PYTORCH_NO_CUDA_MEMORY_CACHING=1,
XLA_PYTHON_CLIENT_ALLOCATOR=platform and --cupy-pool off, all three are
served from the one pool: no framework can arrange this alone (JAX has no
external-allocator hook). Prints one `RESULT {json}` line with NVML's peak
and, under the shim, the pool's statistics.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucommon  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", default="?")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--cupy-pool", choices=("on", "off"), default="on")
    args = ap.parse_args()

    nvml = gpucommon.NvmlPeak()
    import cupy as cp
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    if args.cupy_pool == "off":
        cp.cuda.set_allocator(None)
    n = args.n
    g = torch.Generator(device="cuda").manual_seed(5)
    jmul = jax.jit(lambda a: jnp.tanh(a @ a.T) * 0.5)
    bad, sums, t0 = 0, [], time.perf_counter()
    for r in range(args.rounds):
        t = torch.randn(n, n, device="cuda", generator=g) / n ** 0.5  # PyTorch allocates
        j = jax.dlpack.from_dlpack(t)                                 # JAX reads it in place
        jr = jmul(j)                                                  # JAX allocates
        jr.block_until_ready()
        c = cp.from_dlpack(jr)                                        # CuPy reads JAX's buffer
        cr = cp.cumsum(c, axis=1) + r                                 # CuPy allocates
        back = torch.from_dlpack(cr)                                  # PyTorch reads CuPy's
        s = back[:, -1].sum().item()
        # the whole chain once on the host, for a small corner
        if r % 5 == 0:
            tc = t[:64].double().cpu().numpy()
            full = t.double().cpu().numpy()
            ref = np.cumsum(np.tanh(tc @ full.T) * 0.5, axis=1) + r
            got = back[:64].double().cpu().numpy()
            bad += int(not np.allclose(got, ref, rtol=2e-2, atol=2e-2))
        sums.append(s)
        del t, j, jr, c, cr, back
    torch.cuda.synchronize()
    res = {
        "workload": "three-frameworks",
        "arm": args.arm,
        "rounds": args.rounds,
        "n": n,
        "seconds": time.perf_counter() - t0,
        "checks_failed": bad,
        "sum_digest": gpucommon.float_digest(sums),
        "torch_peak_reserved": torch.cuda.max_memory_reserved(),
        "jax_allocator": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default"),
        "cupy_pool_total_bytes": cp.get_default_memory_pool().total_bytes(),
        "shim": gpucommon.shim_totals(gpucommon.shim_stats()),
        "nvml_peak_bytes": nvml.stop(),
    }
    gpucommon.emit_and_exit(res, bad)


if __name__ == "__main__":
    main()
