#!/usr/bin/env python3
"""jax_client.py FAKE_CUDA_H - real JAX (jax, jaxlib and the CUDA 13 plug-in,
code nobody here wrote) on the fake driver: host -> device -> host round
trips of several sizes and types, deletes, arrays kept while others come and
go (each checked again at the end: nothing overwrote them), copies between
two devices. Kernels are left out (the fake driver runs no device code, and
jax.jit needs modules).

Run by tests/e2e/test_jax.py with the JAX virtual environment's Python, the
fake libcuda, libcudart and NVML on the loader's path and
XLA_PYTHON_CLIENT_ALLOCATOR set. Prints one JSON line: the round trips,
and at the peak (every kept array live) and after the deletes, what three
parties count: XLA (each device's memory_stats()), the fake driver (its
counters, read through its control table) and, when preloaded, the shim
(bfcshim_stats_json). The test decides what is right."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from counters import fake_stats_reader, shim_stats  # noqa: E402

import jax._src.hardware_utils as hardware_utils  # noqa: E402

# JAX tries CUDA only where /dev/nvidia0, /dev/nvidiactl or /dev/dxg exists;
# the fake driver has none of them.
hardware_utils.has_visible_nvidia_gpu = lambda: True

import jax  # noqa: E402
import numpy as np  # noqa: E402


def main():
    fake = fake_stats_reader(sys.argv[1])
    devices = jax.devices()
    rng = np.random.default_rng(11)
    dtypes = [np.float32, np.int32, np.uint8, np.int16]  # 64-bit types need jax_enable_x64
    # From a few hundred bytes to 20 MB: small blocks, and blocks past the
    # 2 MiB granule of the virtual memory API.
    sizes = [100, 12293, 300_000, 1_500_000, 5_000_000]
    kept, bad, rounds, deleted = [], 0, 0, 0

    def check(x, host):
        nonlocal bad, rounds
        back = jax.device_get(x)
        rounds += 1
        if back.dtype != host.dtype or not np.array_equal(back, host):
            bad += 1

    for i in range(25):
        n, dtype = sizes[i % len(sizes)], dtypes[i % len(dtypes)]
        host = (rng.integers(0, 250, n) if dtype in (np.uint8, np.int16) else rng.standard_normal(n) * 1e6
                ).astype(dtype)
        x = jax.device_put(host, devices[0])
        check(x, host)
        if i % 3 == 0:
            kept.append((x, host))
        else:
            x.delete()  # its memory goes back while the kept ones stay
            deleted += 1

    # Device to device (cuMemcpyPeerAsync), and back.
    peer_copies = 0
    if len(devices) > 1:
        for x, host in list(kept[:4]):
            y = jax.device_put(x, devices[1])
            check(y, host)
            z = jax.device_put(y, devices[0])
            check(z, host)
            kept.append((y, host))
            z.delete()
            deleted += 1
            peer_copies += 2

    def in_use():
        return [(d.memory_stats() or {}).get("bytes_in_use") for d in devices]

    def sample():
        # XLA gives a deleted array's memory back once its streams have
        # reached the delete, from a thread of its own: memory_stats() may
        # lag the deletes just made (a CI run read 20 MB that were on their
        # way back). Read once XLA's figures have held for 100 ms (at most
        # 5 s), so that the three parties are counted at one moment.
        last, steady, waited = in_use(), 0, 0.0
        while steady < 5 and waited < 5.0:
            time.sleep(0.02)
            waited += 0.02
            now = in_use()
            steady = steady + 1 if now == last else 0
            last = now
        return {"xla": [d.memory_stats() for d in devices], "fake": fake(), "shim": shim_stats()}

    peak = sample()
    kept_bytes = sum(host.nbytes for _, host in kept)
    # Everything kept still holds what was put there: no later allocation
    # was handed memory that a live array owned.
    corrupted = 0
    for x, host in kept:
        corrupted += int(not np.array_equal(jax.device_get(x), host))
    for x, _ in kept:
        x.delete()
    after = sample()
    print(json.dumps({"devices": [str(d) for d in devices],
                      "platforms": sorted({d.platform for d in devices}),
                      "rounds": rounds, "bad": bad, "corrupted": corrupted,
                      "kept": len(kept), "kept_bytes": kept_bytes, "deleted": deleted,
                      "peer_copies": peer_copies, "peak": peak, "after": after}), flush=True)
    return 1 if bad or corrupted else 0


if __name__ == "__main__":
    sys.exit(main())
