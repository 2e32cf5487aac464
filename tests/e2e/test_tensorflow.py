#!/usr/bin/env python3
"""test_tensorflow.py LIBBFCSHIM FAKE_CUDA_DIR FAKE_CUDA12_DIR FAKE_NVML_DIR
SOURCE_ROOT WORKDIR - real TensorFlow 2.21 on the fake driver, alone and
under the shim, with each of its four ways to allocate GPU memory: its BFC
with one region per GPU (the default), its BFC growing region by region
(TF_FORCE_GPU_ALLOW_GROWTH=true), cuMemAlloc per tensor
(TF_GPU_ALLOCATOR=cuda_malloc) and the driver's stream-ordered pool
(TF_GPU_ALLOCATOR=cuda_malloc_async). The client (tensorflow_client.py)
puts, gets, drops and copies tensors between two GPUs.

Alone it checks the fake against code nobody here wrote: TensorFlow
registers two GPUs, every round trip comes back intact, and what TensorFlow
says it holds agrees with what the fake driver gave it.

Under the shim it prints, per allocator, what the shim pooled, and asserts
that every allocation TensorFlow makes is pooled: no cuMemAlloc and no
stream-ordered allocation reaches the driver, nothing passes through, and
the device holds nothing but the shim's pools.

TensorFlow 2.21 is built for CUDA 12: the fake runtime built as
libcudart.so.12 and empty libraries with the CUDA 12 math libraries'
sonames stand in for the real ones (tests/fake_cuda/cuda12). It lives in
its own virtual environment, made by scripts/framework-venv.sh tensorflow
(scripts/deps.sh --with-tests runs it); without it the test skips (77) and
says why."""
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
import testcheck  # noqa: E402

lib, fake_dir, cuda12_dir, nvml_dir, root, work = sys.argv[1:7]

ALLOCATORS = {
    "bfc": {},
    "growth": {"TF_FORCE_GPU_ALLOW_GROWTH": "true"},
    "cuda_malloc": {"TF_GPU_ALLOCATOR": "cuda_malloc"},
    "cuda_malloc_async": {"TF_GPU_ALLOCATOR": "cuda_malloc_async"},
}

python = testcheck.framework_python(root, "tensorflow", "TensorFlow 2.21")
testcheck.fresh_dir(work)
check = testcheck.Checks()
client = os.path.join(here, "tensorflow_client.py")
header = os.path.join(root, "tests", "fake_cuda", "fake_cuda.h")
SMALL = 64 << 10  # what TensorFlow keeps for itself after the drops, at most


def run(tag, allocator, **extra):
    """Runs the client; returns its JSON (empty on failure) and stderr."""
    env = testcheck.fake_cuda_env(
        fake_dir, LD_LIBRARY_PATH=os.pathsep.join([fake_dir, cuda12_dir, nvml_dir]),
        # TensorFlow waits on its streams' events: work must complete by itself.
        FAKECUDA_AUTOCOMPLETE="1",
        # Warnings and errors only (its INFO lines name CPU features).
        TF_CPP_MIN_LOG_LEVEL="1",
        **ALLOCATORS[allocator], **extra)
    return testcheck.run_json_client(check, tag, [python, client, header], env, work)


def tf_current(out, phase):
    """What TensorFlow says it holds, per GPU (None: cuda_malloc keeps no
    statistics)."""
    stats = out[phase]["tf"]
    return None if any(s is None for s in stats) else [s["current"] for s in stats]


def pooled(out, phase):
    """Per device: bytes the shim's pools serve, allocations, bytes they hold
    from the driver, bytes their limits lent."""
    per = {0: [0, 0, 0, 0], 1: [0, 0, 0, 0]}
    for p in (out[phase]["shim"] or {"pools": []})["pools"]:
        d = per.setdefault(p["device"], [0, 0, 0, 0])
        d[0] += p["bytes_in_use"]
        d[1] += p["num_allocs"]
        d[2] += p["pool_bytes"]
        d[3] += p.get("bytes_lent", 0)
    return per


def common(tag, out, stderr):
    check(len(out.get("gpus", [])) == 2 and
          any(d.endswith("GPU:0") for d in out.get("tensor_devices", [])) and
          any(d.endswith("GPU:1") for d in out.get("tensor_devices", [])),
          f"{tag}: TensorFlow registers two GPUs and places tensors on both: "
          f"{out.get('gpus')} {out.get('tensor_devices')}")
    check(out.get("rounds") == 33 and out.get("bad") == 0,
          f"{tag}: every round trip came back intact: {out.get('rounds')} rounds, "
          f"{out.get('bad')} wrong")
    check(out.get("corrupted") == 0 and out.get("kept_bytes", 0) > 0,
          f"{tag}: the kept tensors still hold their values: {out.get('corrupted')} changed")
    fake = out.get("peak", {}).get("fake", {})
    check(fake.get("peer_copies", 0) > 0,
          f"{tag}: GPU-to-GPU copies were peer copies: {fake.get('peer_copies')}")
    # A GPU's first tensor op zeroes with cuMemsetD32Async.
    check(fake.get("memsets", 0) > 0, f"{tag}: TensorFlow's memsets ran: {fake.get('memsets')}")
    errors = testcheck.glog_errors(stderr)
    check(not errors, f"{tag}: TensorFlow logged no errors: {errors[:5]}")


results = {}
for allocator in ALLOCATORS:
    # Alone: the fake's fidelity against TensorFlow's own accounts.
    tag = f"{allocator}-alone"
    out, err = run(tag, allocator)
    if out:
        common(tag, out, err)
        peak, after = out["peak"]["fake"], out["after"]["fake"]
        held_peak, held_after = peak["bytes_in_use"][:2], after["bytes_in_use"][:2]
        tf_peak = tf_current(out, "peak")
        if allocator == "bfc":
            # One region per GPU at its first tensor, kept for good.
            check(peak["mem_alloc_calls"] == 2 and held_after == held_peak,
                  f"{tag}: one cuMemAlloc per GPU, never freed: {peak['mem_alloc_calls']}, "
                  f"{held_peak} -> {held_after}")
            check(all(t <= h for t, h in zip(tf_peak, held_peak)),
                  f"{tag}: TensorFlow's tensors fit its regions: {tf_peak} in {held_peak}")
        elif allocator == "growth":
            check(peak["mem_alloc_calls"] > 2 and
                  all(t <= h for t, h in zip(tf_peak, held_peak)),
                  f"{tag}: regions grow with the tensors: {peak['mem_alloc_calls']} "
                  f"cuMemAlloc, {tf_peak} in {held_peak}")
        elif allocator == "cuda_malloc":
            check(peak["mem_alloc_calls"] >= out["rounds"] - out["peer_copies"] and
                  sum(held_peak) >= out["kept_bytes"] and sum(held_after) < SMALL,
                  f"{tag}: a cuMemAlloc per tensor, freed with it: {peak['mem_alloc_calls']} "
                  f"calls, {held_peak} -> {held_after}")
        else:
            check(peak["mem_alloc_async_calls"] >= out["rounds"] - out["peer_copies"],
                  f"{tag}: stream-ordered allocations: {peak['mem_alloc_async_calls']}")
            check(tf_peak == held_peak and sum(held_after) < SMALL,
                  f"{tag}: what TensorFlow holds is what the device's pools gave out: "
                  f"{tf_peak} vs {held_peak}, after {held_after}")

    # Under the shim.
    tag = f"{allocator}-shim"
    stats = os.path.join(work, f"{tag}.json")
    log = os.path.join(work, f"{tag}.log")
    out, err = run(tag, allocator, LD_PRELOAD=lib, BFCSHIM_STATS_FILE=stats,
                   BFCSHIM_LOG_FILE=log, BFCSHIM_LOG_LEVEL="info")
    if not out:
        continue
    common(tag, out, err)
    shim = out["peak"]["shim"]
    check(shim is not None, f"{tag}: the shim is loaded")
    if shim is None:
        continue
    text = open(log).read() if os.path.exists(log) else ""
    check("error" not in text.lower(), f"{tag}: the shim logged no errors: {text[-1500:]}")
    # TensorFlow's own BFC region, one request for most of the pool's limit,
    # is named once (at info level) with the settings that leave allocation
    # to the pool; the other allocators make no such request.
    hint = text.count("TF_FORCE_GPU_ALLOW_GROWTH=true")
    check(hint == (1 if allocator == "bfc" else 0),
          f"{tag}: the preallocation hint logged {hint} times: {text[-1500:]}")
    fake = out["peak"]["fake"]
    per = pooled(out, "peak")
    held = fake["bytes_in_use"][:2]
    outside = [held[d] - per[d][2] - per[d][3] for d in (0, 1)]
    tf_peak = tf_current(out, "peak")
    results[allocator] = {"tf_current_bytes": tf_peak, "kept_bytes": out["kept_bytes"],
                          "pooled_allocs": [per[d][1] for d in (0, 1)],
                          "pooled_bytes_in_use": [per[d][0] for d in (0, 1)],
                          "pool_bytes": [per[d][2] for d in (0, 1)],
                          "outside_pool_bytes": outside,
                          "driver_mem_allocs": fake["mem_alloc_calls"],
                          "driver_async_allocs": fake["mem_alloc_async_calls"],
                          "passthrough_allocs": shim.get("passthrough_allocs")}
    print(f"{allocator} under the shim, at the peak: TensorFlow holds {tf_peak} B "
          f"({out['kept_bytes']} B kept); pooled per GPU: "
          f"{[per[d][1] for d in (0, 1)]} allocations, {[per[d][0] for d in (0, 1)]} B in use "
          f"of {[per[d][2] for d in (0, 1)]} B; outside the pools: {outside} B; the driver "
          f"saw {fake['mem_alloc_calls']} cuMemAlloc and {fake['mem_alloc_async_calls']} "
          f"cuMemAllocAsync")
    # Every allocation pooled: none reached the driver's allocators, none
    # passed through, and the device holds only what the pools hold.
    check(fake["mem_alloc_calls"] == 0 and fake["mem_alloc_async_calls"] == 0,
          f"{tag}: no allocation reached the driver: {fake['mem_alloc_calls']} cuMemAlloc, "
          f"{fake['mem_alloc_async_calls']} cuMemAllocAsync")
    check(shim.get("passthrough_allocs") == 0 and shim.get("passthrough_vmm_bytes") == 0,
          f"{tag}: nothing passed through: {shim.get('passthrough_allocs')} allocations, "
          f"{shim.get('passthrough_vmm_bytes')} B of virtual memory")
    check(outside == [0, 0], f"{tag}: no device memory outside the pools: {outside}")
    in_use = [per[d][0] for d in (0, 1)]
    if allocator == "bfc":
        # The region TensorFlow sizes from cuMemGetInfo is one pooled block.
        check([per[d][1] for d in (0, 1)] == [1, 1] and
              all(t <= u for t, u in zip(tf_peak, in_use)),
              f"{tag}: one pooled region per GPU holds the tensors: "
              f"{[per[d][1] for d in (0, 1)]}, {tf_peak} in {in_use}")
    elif allocator == "growth":
        check(all(per[d][1] >= 1 for d in (0, 1)) and
              all(t <= u for t, u in zip(tf_peak, in_use)),
              f"{tag}: pooled regions hold the tensors: {tf_peak} in {in_use}")
    else:
        # A pooled block per tensor, given back with it.
        check(sum(per[d][1] for d in (0, 1)) >= out["rounds"] - out["peer_copies"] and
              sum(in_use) >= out["kept_bytes"],
              f"{tag}: a pooled block per tensor: {[per[d][1] for d in (0, 1)]} blocks, "
              f"{in_use} B for {out['kept_bytes']} B kept")
        if tf_peak is not None:
            check(all(t <= u < t + (1 << 20) for t, u in zip(tf_peak, in_use)),
                  f"{tag}: the pools serve what TensorFlow holds, rounded up: "
                  f"{in_use} for {tf_peak}")
        after = pooled(out, "after")
        check(sum(after[d][0] for d in (0, 1)) < SMALL,
              f"{tag}: after the drops the pools serve next to nothing: "
              f"{[after[d][0] for d in (0, 1)]}")

with open(os.path.join(work, "summary.json"), "w") as f:
    json.dump(results, f, indent=1)
check.finish()
