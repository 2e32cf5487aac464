#!/usr/bin/env python3
"""test_jax.py LIBBFCSHIM FAKE_CUDA_DIR FAKE_NVML_DIR SOURCE_ROOT WORKDIR - real
JAX 0.11.2 (jax, jaxlib, jax-cuda13-plugin, jax-cuda13-pjrt) on the fake
driver, alone and under the shim, for XLA_PYTHON_CLIENT_ALLOCATOR = default
(with XLA_PYTHON_CLIENT_PREALLOCATE=false), platform and cuda_async: round
trips, deletes, two devices with copies between them (jax_client.py).

Alone it checks the fake against code nobody here wrote: XLA finds two GPUs,
every round trip comes back intact, and what XLA says it holds is what the
fake driver says was taken (its own virtual memory for default and platform,
the stream-ordered pool for cuda_async), staged through page-locked host
memory, copied between devices with cuMemcpyPeerAsync.

Under the shim it prints, per allocator, what the shim pooled and what went
past it to the driver, and asserts that every byte XLA allocates comes from
the pool: cuda_async is served from the pool's blocks (none of it reaches
the driver); default and platform, which XLA allocates with
cuMemCreate/cuMemMap, come out of the pool's limit through the virtual
memory door (bytes_lent: XLA's own BFC pool, per device, for default), with
nothing counted as passthrough, and round-trip intact with nothing
corrupted.

JAX lives in its own virtual environment (Python >= 3.12), made by
scripts/framework-venv.sh jax (scripts/deps.sh --with-tests runs it); without it the
test skips (77) and says why."""
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
import testcheck  # noqa: E402

lib, fake_dir, nvml_dir, root, work = sys.argv[1:6]

ALLOCATORS = {
    "default": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    "platform": {},
    "cuda_async": {},
}

python = testcheck.framework_python(root, "jax", "JAX 0.11.2")
testcheck.fresh_dir(work)
check = testcheck.Checks()
client = os.path.join(here, "jax_client.py")
header = os.path.join(root, "tests", "fake_cuda", "fake_cuda.h")


def run(tag, allocator, **extra):
    """Runs the client; returns its JSON (empty on failure) and stderr."""
    env = testcheck.fake_cuda_env(
        fake_dir, LD_LIBRARY_PATH=os.pathsep.join([fake_dir, nvml_dir]),
        # XLA polls its streams for completion: work must complete by itself.
        FAKECUDA_AUTOCOMPLETE="1",
        JAX_PLATFORMS="cuda",
        # The plug-in's Python check opens cuDNN, cuBLAS, cuFFT, cuPTI and
        # cuSPARSE; put/get/delete/copies need none of them.
        JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1",
        XLA_PYTHON_CLIENT_ALLOCATOR=allocator,
        **ALLOCATORS[allocator], **extra)
    return testcheck.run_json_client(check, tag, [python, client, header], env, work)


def xla_live(out, phase):
    """Bytes XLA holds for live arrays, all devices: its memory_stats where
    the allocator keeps them (default, cuda_async), else what the client
    kept (platform has none)."""
    stats = out[phase]["xla"]
    if all(s and "bytes_in_use" in s for s in stats):
        return sum(s["bytes_in_use"] for s in stats)
    return out["kept_bytes"] if phase == "peak" else 0


def pooled(out, phase):
    """What the shim's pools serve (bytes in use, allocations) and hold
    from the driver (pool_bytes), all devices."""
    shim = out[phase]["shim"] or {"pools": []}
    pools = shim["pools"]
    return (sum(p["bytes_in_use"] for p in pools), sum(p["num_allocs"] for p in pools),
            sum(p["pool_bytes"] for p in pools))


def lent(out, phase):
    """What the pools' limits lent to XLA's own cuMemCreate memory, per
    device (the virtual memory door)."""
    per = [0, 0]
    for p in (out[phase]["shim"] or {"pools": []})["pools"]:
        per[p["device"]] += p.get("bytes_lent", 0)
    return per


def outside(out, phase):
    """Device memory the fake driver gave out that is neither the shim's
    pools nor lent by them: what reached the driver past the shim."""
    return (sum(out[phase]["fake"]["bytes_in_use"]) - pooled(out, phase)[2] -
            sum(lent(out, phase)))


def common(tag, out, stderr):
    check(out.get("platforms") == ["gpu"] and len(out.get("devices", [])) == 2,
          f"{tag}: XLA sees two CUDA devices: {out.get('devices')} {out.get('platforms')}")
    check(out.get("rounds") == 33 and out.get("bad") == 0,
          f"{tag}: every round trip came back intact: {out.get('rounds')} rounds, "
          f"{out.get('bad')} wrong")
    check(out.get("corrupted") == 0 and out.get("kept", 0) > 0,
          f"{tag}: the {out.get('kept')} arrays kept still hold their values: "
          f"{out.get('corrupted')} changed")
    fake = out.get("peak", {}).get("fake", {})
    check(fake.get("peer_copies", 0) >= out.get("peer_copies", 1),
          f"{tag}: device-to-device puts were peer copies: {fake.get('peer_copies')} of "
          f"{out.get('peer_copies')}")
    check(fake.get("host_alloc_calls", 0) > 0,
          f"{tag}: XLA staged through page-locked host memory: {fake.get('host_alloc_calls')}")
    errors = testcheck.glog_errors(stderr)
    check(not errors, f"{tag}: XLA logged no errors: {errors[:5]}")


results = {}
for allocator in ALLOCATORS:
    # Alone: the fake's fidelity against XLA's own accounts.
    tag = f"{allocator}-alone"
    out, err = run(tag, allocator)
    if out:
        common(tag, out, err)
        fake_peak, fake_after = out["peak"]["fake"], out["after"]["fake"]
        xla_peak = out["peak"]["xla"]
        if allocator == "default":
            # XLA's BFC grows in regions it maps itself and keeps them.
            check(fake_peak["vmm_create_calls"] > 0 and fake_peak["mem_alloc_calls"] == 0,
                  f"{tag}: XLA's BFC took virtual memory: {fake_peak['vmm_create_calls']} "
                  f"cuMemCreate, {fake_peak['mem_alloc_calls']} cuMemAlloc")
            check([s["pool_bytes"] for s in xla_peak] == fake_peak["bytes_in_use"][:2],
                  f"{tag}: what XLA's BFC holds is what the device gave it: "
                  f"{[s['pool_bytes'] for s in xla_peak]} vs {fake_peak['bytes_in_use'][:2]}")
            check(xla_live(out, "after") == 0, f"{tag}: XLA holds nothing after the deletes")
        elif allocator == "platform":
            check(fake_peak["vmm_create_calls"] >= out["rounds"] - out["peer_copies"],
                  f"{tag}: one cuMemCreate per buffer: {fake_peak['vmm_create_calls']}")
            check(sum(fake_peak["bytes_in_use"]) >= out["kept_bytes"] and
                  sum(fake_after["bytes_in_use"]) == 0,
                  f"{tag}: the device holds the kept arrays, and nothing once they are "
                  f"deleted: {fake_peak['bytes_in_use'][:2]}, {fake_after['bytes_in_use'][:2]}")
        else:
            check(fake_peak["mem_alloc_async_calls"] >= out["rounds"] - out["peer_copies"],
                  f"{tag}: stream-ordered allocations: {fake_peak['mem_alloc_async_calls']}")
            check([s["bytes_in_use"] for s in xla_peak] == fake_peak["bytes_in_use"][:2] and
                  sum(fake_after["bytes_in_use"]) == 0,
                  f"{tag}: what XLA holds is what the device's pools gave out: "
                  f"{[s['bytes_in_use'] for s in xla_peak]} vs {fake_peak['bytes_in_use'][:2]}")

    # Under the shim.
    tag = f"{allocator}-shim"
    stats = os.path.join(work, f"{tag}.json")
    log = os.path.join(work, f"{tag}.log")
    out, err = run(tag, allocator, LD_PRELOAD=lib, BFCSHIM_STATS_FILE=stats,
                   BFCSHIM_LOG_FILE=log)
    if not out:
        continue
    common(tag, out, err)
    check(out["peak"]["shim"] is not None, f"{tag}: the shim is loaded")
    text = open(log).read() if os.path.exists(log) else ""
    check("error" not in text.lower(), f"{tag}: the shim logged no errors: {text[-1500:]}")
    in_use, allocs, held = pooled(out, "peak")
    past = outside(out, "peak")
    live = xla_live(out, "peak")
    passthrough = (out["peak"]["shim"] or {}).get("passthrough_allocs")
    fake_peak = out["peak"]["fake"]
    results[allocator] = {"xla_live_bytes": live, "pooled_allocs": allocs,
                          "pooled_bytes_in_use": in_use, "pool_bytes": held,
                          "outside_pool_bytes": past, "passthrough_allocs": passthrough,
                          "driver_vmm_creates": fake_peak["vmm_create_calls"],
                          "driver_async_allocs": fake_peak["mem_alloc_async_calls"]}
    print(f"{allocator} under the shim, at the peak: XLA holds {live} B for live arrays; "
          f"pooled: {allocs} allocations, {in_use} B in use of {held} B; past the pool to "
          f"the driver: {past} B (the driver saw {fake_peak['vmm_create_calls']} cuMemCreate, "
          f"the shim's own granules included, and {fake_peak['mem_alloc_async_calls']} "
          f"cuMemAllocAsync); shim pass-through counter {passthrough}")
    check(passthrough == 0, f"{tag}: nothing the shim saw passed through: {passthrough}")
    # Nothing goes around the pool: the virtual memory door lends XLA's own
    # physical memory the pool's limit while it lives.
    vmm = (out["peak"]["shim"] or {}).get("passthrough_vmm_bytes")
    lent_peak = lent(out, "peak")
    results[allocator]["passthrough_vmm_bytes"] = vmm
    results[allocator]["bytes_lent"] = lent_peak
    check(vmm == 0, f"{tag}: nothing counted as around the pool: passthrough_vmm_bytes {vmm}")
    if allocator == "default":
        # XLA's BFC grows in regions it makes with cuMemCreate: each device's
        # loan is what XLA's own statistics say its pool holds.
        xla_pools = [s["pool_bytes"] for s in out["peak"]["xla"]]
        check(lent_peak == xla_pools, f"{tag}: the loans are XLA's pools, device by device: "
              f"{lent_peak} vs {xla_pools}")
    elif allocator == "platform":
        check(sum(lent_peak) >= out["kept_bytes"],
              f"{tag}: the loans hold XLA's arrays: {lent_peak} for {out['kept_bytes']}")
    check(lent(out, "after") == [0, 0] or allocator == "default",
          f"{tag}: after the deletes nothing is lent: {lent(out, 'after')}")
    if allocator == "cuda_async":
        # Served today through the shim's stream-ordered door.
        check(fake_peak["mem_alloc_async_calls"] == 0 and allocs >= out["rounds"] -
              out["peer_copies"], f"{tag}: every stream-ordered allocation was pooled "
              f"({allocs}; {fake_peak['mem_alloc_async_calls']} reached the driver)")
        check(live <= in_use < live + (1 << 20),
              f"{tag}: the pools serve what XLA holds, rounded up: {in_use} for {live}")
        check(past == 0, f"{tag}: no device memory outside the pools: {past}")
        check(xla_live(out, "after") == 0 and pooled(out, "after")[0] == 0,
              f"{tag}: after the deletes XLA holds nothing and the pools serve nothing: "
              f"{xla_live(out, 'after')}, {pooled(out, 'after')[0]}")
        # The stats file written at exit agrees with what was read in the run.
        doc = json.load(open(stats)) if os.path.exists(stats) else {"pools": []}
        check(sum(p["num_allocs"] for p in doc["pools"]) >= allocs and
              sum(p["bytes_in_use"] for p in doc["pools"]) == 0,
              f"{tag}: the stats file counts the same allocations, none left in use: "
              f"{[(p['num_allocs'], p['bytes_in_use']) for p in doc['pools']]}")

    # Every byte XLA allocates comes from the pool: the device's memory is all
    # the pools' or lent by them, and together they hold at least what XLA
    # holds.
    check(past == 0 and held + sum(lent_peak) > 0 and in_use + sum(lent_peak) >= live > 0,
          f"{tag}: every byte XLA allocates comes from the pool ({past} B outside it; "
          f"{in_use} B served and {sum(lent_peak)} B lent for {live} B live)")

with open(os.path.join(work, "summary.json"), "w") as f:
    json.dump(results, f, indent=1)
check.finish()
