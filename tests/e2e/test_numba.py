#!/usr/bin/env python3
"""test_numba.py LIBBFCSHIM FAKE_CUDA_DIR WORKDIR - Numba's CUDA driver layer
(NVIDIA's cuda-bindings underneath: every entry point through
cuGetProcAddress) against the fake driver, alone and under the shim.

Alone it checks the fake against code nobody here wrote; under the shim,
that every device allocation Numba makes is pooled (none passes through),
the data round-trips intact and the process exits cleanly. Skips (77) when
Numba cannot be imported (scripts/deps.sh --with-tests installs it)."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testcheck  # noqa: E402

lib, fake_dir, work = sys.argv[1:4]
testcheck.require_module("numba.cuda", "numba-cuda")
testcheck.fresh_dir(work)
check = testcheck.Checks()
client = os.path.join(os.path.dirname(os.path.abspath(__file__)), "numba_client.py")


def run(**env):
    e = testcheck.fake_cuda_env(fake_dir, **env)
    p = subprocess.run([sys.executable, client], env=e, capture_output=True, text=True,
                       timeout=300)
    check(p.returncode == 0, f"client exited {p.returncode}: {p.stderr[-2000:]}")
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


alone = run()
check(alone.get("devices") == [0, 1], f"two fake devices seen: {alone.get('devices')}")
# The fake reports a compute capability 9.0 device as an H100 does (before,
# 0 for every attribute but a few), each device on its own PCI bus.
dev = alone.get("device", {})
check(dev.get("cc") == [9, 0] and dev.get("sms") == 132 and dev.get("warp") == 32 and
      dev.get("max_threads") == 1024 and dev.get("uva") == 1, f"the device as Numba reads it: {dev}")
check(len(dev.get("pci_buses", [])) == 2, f"one PCI bus per device: {dev.get('pci_buses')}")
check(alone.get("rounds") == 40 and alone.get("bad") == 0, f"round trips alone: {alone}")

stats = os.path.join(work, "stats.json")
shim = run(LD_PRELOAD=lib, BFCSHIM_STATS_FILE=stats,
           BFCSHIM_LOG_FILE=os.path.join(work, "shim.log"))
check(shim.get("rounds") == 40 and shim.get("bad") == 0, f"round trips under the shim: {shim}")
doc = json.load(open(stats)) if os.path.exists(stats) else {"pools": []}
pools = doc.get("pools", [])
allocs = sum(p.get("num_allocs", 0) for p in pools)
check(len(pools) == 1 and allocs >= 80, f"Numba's arrays came from one pool ({allocs} allocations)")
check(doc.get("passthrough_allocs") == 0, f"nothing passed through: {doc.get('passthrough_allocs')}")
# What Numba asks the device for is the pool's limit less what is in use.
check(shim.get("free_before", 0) <= 768 << 20 < alone.get("free_before", 0),
      f"get_memory_info under the shim: {shim.get('free_before')}")
log = open(os.path.join(work, "shim.log")).read() if os.path.exists(
    os.path.join(work, "shim.log")) else ""
check("error" not in log, f"no errors logged: {log[-1500:]}")
check.finish()
