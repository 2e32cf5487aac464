#!/usr/bin/env python3
"""tensorflow_client.py FAKE_CUDA_H - real TensorFlow 2.21 (code nobody here
wrote) on the fake driver: host -> device -> host round trips of several
sizes and types, tensors dropped while others stay (each checked again at
the end: nothing overwrote them), copies between two GPUs. No math kernels
(the fake driver runs no device code): constants, identities and copies
only.

Run by tests/e2e/test_tensorflow.py with the fake libcuda, the fake
runtime built as libcudart.so.12, the empty CUDA 12 math libraries and the
fake NVML on the loader's path, and TF_GPU_ALLOCATOR /
TF_FORCE_GPU_ALLOW_GROWTH set. Prints one JSON line: the round trips, and at
the peak (every kept tensor live) and after the drops, what three parties
count: TensorFlow (each GPU's get_memory_info), the fake driver (its
counters, read through its control table) and, when preloaded, the shim
(bfcshim_stats_json). The test decides what is right."""
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from counters import fake_stats_reader, shim_stats  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def main():
    fake = fake_stats_reader(sys.argv[1])
    gpus = tf.config.list_physical_devices("GPU")
    names = [f"/GPU:{i}" for i in range(len(gpus))]
    rng = np.random.default_rng(13)
    # Not int32: TensorFlow keeps int32 tensors of a GPU in host memory.
    dtypes = [np.float32, np.int16, np.uint8, np.float64]
    # From a few hundred bytes to 20 MB: small chunks of TensorFlow's BFC,
    # and blocks past the shim's small/large threshold.
    sizes = [100, 12293, 300_000, 1_500_000, 5_000_000]
    kept, bad, rounds, dropped = [], 0, 0, 0

    def check(x, host):
        nonlocal bad, rounds
        back = x.numpy()
        rounds += 1
        if back.dtype != host.dtype or not np.array_equal(back, host):
            bad += 1

    for i in range(25):
        n, dtype = sizes[i % len(sizes)], dtypes[i % len(dtypes)]
        host = (rng.integers(0, 250, n) if dtype in (np.uint8, np.int16)
                else rng.standard_normal(n) * 1e6).astype(dtype)
        with tf.device(names[0]):
            x = tf.identity(tf.constant(host))
        check(x, host)
        if i % 3 == 0:
            kept.append((x, host))
        else:
            del x  # its memory goes back to TensorFlow's allocator
            dropped += 1
    gc.collect()

    # GPU to GPU, and back.
    peer_copies = 0
    if len(names) > 1:
        for x, host in list(kept[:4]):
            with tf.device(names[1]):
                y = tf.identity(x)
            check(y, host)
            with tf.device(names[0]):
                z = tf.identity(y)
            check(z, host)
            kept.append((y, host))
            del z
            dropped += 1
            peer_copies += 2
    gc.collect()

    def memory_info(name):
        # TF_GPU_ALLOCATOR=cuda_malloc keeps no statistics (ValueError).
        try:
            return tf.config.experimental.get_memory_info(name)
        except ValueError:
            return None

    def sample():
        # Drops reach the allocator when the last reference goes, but a
        # copy's memory may wait for its stream: read once TensorFlow's
        # figures have held for 100 ms (at most 5 s).
        last, steady, waited = None, 0, 0.0
        while steady < 5 and waited < 5.0:
            time.sleep(0.02)
            waited += 0.02
            now = [memory_info(n) for n in names]
            steady = steady + 1 if now == last else 0
            last = now
        return {"tf": [memory_info(n) for n in names],
                "fake": fake(), "shim": shim_stats()}

    peak = sample()
    kept_bytes = sum(host.nbytes for _, host in kept)
    corrupted = sum(int(not np.array_equal(x.numpy(), host)) for x, host in kept)
    devices = sorted({x.device for x, _ in kept})
    kept.clear()
    x = y = None  # the loops' last bindings: the last tensors would outlive the drops
    gc.collect()
    after = sample()
    print(json.dumps({"gpus": [g.name for g in gpus], "tensor_devices": devices,
                      "rounds": rounds, "bad": bad, "corrupted": corrupted,
                      "kept_bytes": kept_bytes, "dropped": dropped,
                      "peer_copies": peer_copies, "peak": peak, "after": after}), flush=True)
    return 1 if bad or corrupted else 0


if __name__ == "__main__":
    sys.exit(main())
