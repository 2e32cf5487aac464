#!/usr/bin/env python3
"""test_numba_plugin.py LIBBFCSHIM FAKE_CUDA_DIR WORKDIR - the Numba EMM
plug-in (bfcshim.numba) driven by real Numba on the fake driver, without
LD_PRELOAD and with it (then the plug-in and the preloaded doors must share
one pool). Skips (77) when numba-cuda cannot be imported."""
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
import testcheck  # noqa: E402

lib, fake_dir, work = sys.argv[1:4]
testcheck.require_module("numba.cuda", "numba-cuda")
testcheck.fresh_dir(work)
check = testcheck.Checks()
source = os.path.join(here, "..", "..", "python")
MiB = 1 << 20


def run(name, **env):
    log = os.path.join(work, name + ".log")
    e = testcheck.fake_cuda_env(fake_dir, PYTHONPATH=source, BFCSHIM_LIBRARY=lib,
                                NUMBA_CUDA_MEMORY_MANAGER="bfcshim.numba",
                                BFCSHIM_MEM_LIMIT="512MiB", BFCSHIM_LOG_FILE=log, **env)
    p = subprocess.run([sys.executable, os.path.join(here, "numba_plugin_client.py")], env=e,
                       capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"{name}: client exited {p.returncode}: {p.stderr[-2000:]}")
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    text = open(log).read() if os.path.exists(log) else ""
    return (json.loads(lines[-1]) if lines else {}), text


for name, extra in (("plugin", {}), ("preloaded", {"LD_PRELOAD": lib})):
    out, log = run(name, **extra)
    check(out.get("manager") == "bfcshim.numba.BfcshimMemoryManager",
          f"{name}: Numba uses the plug-in: {out.get('manager')}")
    check(out.get("rounds") == 30 and out.get("bad") == 0, f"{name}: round trips: {out}")
    # 60 arrays in the loop, one kept, one after reset: all from the pool.
    check(out.get("num_allocs", 0) >= 60, f"{name}: arrays pooled: {out.get('num_allocs')}")
    check(out.get("passthrough") == 0, f"{name}: nothing passed through")
    check(out.get("in_use_after_loop") == 0, f"{name}: collected arrays were freed: {out}")
    check(out.get("memory_info") == out.get("bfcshim_info") and
          out.get("memory_info", [0])[0] <= 512 * MiB,
          f"{name}: get_memory_info is the pool's view: {out.get('memory_info')}")
    check(out.get("in_use_kept", 0) >= MiB, f"{name}: a live array holds pool memory")
    check("IPC of pooled memory is refused" in out.get("ipc", ""), f"{name}: ipc: {out.get('ipc')}")
    check(out.get("in_use_after_reset") == 0, f"{name}: reset freed the context's arrays")
    check(out.get("after_reset_ok") is True, f"{name}: allocation after reset")
    check("error" not in log, f"{name}: no errors logged (no double free): {log[-1500:]}")
# A block freed under work on a non-blocking stream the program made with the
# driver itself: without LD_PRELOAD the library never sees that stream, and
# the block must still not be handed out before the work ran (it was, before
# the plug-in fence waited for a context synchronisation). One region, so
# that the pool can be filled around the block exactly.
for name, extra in (("plugin-unseen", {}), ("preloaded-unseen", {"LD_PRELOAD": lib})):
    out, log = run(name, NUMBA_CLIENT_UNSEEN="1", BFCSHIM_VMM="off", **extra)
    unseen = out.get("unseen_stream", {})
    check(unseen.get("work_ran_first") is True or unseen.get("reused") is False,
          f"{name}: a block freed under work on a stream the library may not see was handed "
          f"out again before that work ran: {unseen}")
    check(unseen.get("reused") is True, f"{name}: the block came back after the work: {unseen}")
# Out of memory is Numba's own error, CudaAPIError with
# CUDA_ERROR_OUT_OF_MEMORY, as under Numba's memory manager (code catching it
# must see it), and still a MemoryError.
for name, extra in (("plugin-oom", {}), ("preloaded-oom", {"LD_PRELOAD": lib})):
    out, _ = run(name, NUMBA_CLIENT_OOM="1", **extra)
    check(out.get("oom", {}).get("code") == 2 and out["oom"].get("is_memory_error") is True,
          f"{name}: out of memory raises CudaAPIError(CUDA_ERROR_OUT_OF_MEMORY), a "
          f"MemoryError: {out}")
    check(out.get("after_ok") is True, f"{name}: the pool serves after it: {out}")
check.finish()
