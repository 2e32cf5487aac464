#!/usr/bin/env python3
"""numba_client.py - Numba's CUDA driver layer as a client nobody here wrote:
devices and what they report, device arrays on several streams, host <->
device round trips, device-to-device copies, frees, memory info. Prints one
JSON line; exits 0 when every round trip came back intact. Kernels are left
out: the fake driver runs no device code."""
import json
import sys

import numpy as np
from numba import cuda


def round_trips(count, streams, max_n, seed):
    """Host -> device -> device -> host, on the streams in turn; returns
    (rounds, wrong ones). The arrays are dropped each round (freed)."""
    rng = np.random.default_rng(seed)
    bad = rounds = 0
    for r in range(count):
        s = streams[r % len(streams)]
        n = int(rng.integers(1, max_n))
        host = rng.integers(0, 1 << 31, n, dtype=np.uint32)
        d = cuda.to_device(host, stream=s)
        e = cuda.device_array(n, dtype=np.uint32, stream=s)
        e.copy_to_device(d, stream=s)
        back = e.copy_to_host(stream=s)
        s.synchronize()
        bad += int(not np.array_equal(back, host))
        rounds += 1
        del d, e
    return rounds, bad


def main():
    devices = [d.id for d in cuda.gpus]
    dev = cuda.get_current_device()
    # What Numba reads of a device to size and check launches.
    device = {"cc": list(dev.compute_capability), "sms": dev.MULTIPROCESSOR_COUNT,
              "warp": dev.WARP_SIZE, "max_threads": dev.MAX_THREADS_PER_BLOCK,
              "uva": dev.UNIFIED_ADDRESSING,
              "pci_buses": sorted({d.PCI_BUS_ID for d in cuda.gpus})}
    streams = [cuda.stream() for _ in range(3)]
    free0, total = cuda.current_context().get_memory_info()
    rounds, bad = round_trips(40, streams, 300000, 1)
    cuda.current_context().deallocations.clear()
    free1, _ = cuda.current_context().get_memory_info()
    print(json.dumps({"devices": devices, "device": device, "rounds": rounds, "bad": bad,
                      "total": total, "free_before": free0, "free_after": free1}), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
