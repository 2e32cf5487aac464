#!/usr/bin/env python3
"""test_module.py LIBBFCSHIM FAKE_CUDA_DIR WORKDIR - the bfcshim Python
module (from the source tree) on the fake driver: loaded as a plug-in
(BFCSHIM_LIBRARY, no LD_PRELOAD) and in a preloaded process, where it must
use the preloaded copy so that one pool serves both the program's driver
calls and the module's."""
import json
import os
import shutil
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
import testcheck  # noqa: E402

lib, fake_dir, work = sys.argv[1:4]
testcheck.fresh_dir(work)
check = testcheck.Checks()
source = os.path.join(here, "..", "..", "python")
MiB = 1 << 20


def client(mode, **env):
    e = testcheck.fake_cuda_env(fake_dir, PYTHONPATH=source, BFCSHIM_MEM_LIMIT="256MiB",
                                BFCSHIM_PREALLOCATE="false",
                                BFCSHIM_LOG_FILE=os.path.join(work, mode + ".log"), **env)
    p = subprocess.run([sys.executable, os.path.join(here, "module_client.py"), mode, work],
                       env=e, capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"{mode}: client exited {p.returncode}: {p.stderr[-2000:]}")
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


plug = client("plugin", BFCSHIM_LIBRARY=lib)
check(os.path.samefile(plug.get("library", "/"), lib), f"plug-in loaded {plug.get('library')}")
check(plug.get("active") is True, "the plug-in's library serves from pools")
check(plug.get("malloc") == 0 and plug.get("driver_alloc") == 0, f"allocations: {plug}")
# Plug-in only: the program's own cuMemAlloc is not the pool's business.
check(plug.get("pools") == 1 and plug.get("bytes_in_use") == 8 * MiB,
      f"one pool holding the module's 8 MiB only: {plug}")
check(plug.get("free_total") == [256 * MiB - 8 * MiB, 1024 * MiB],
      f"mem_get_info(0) is the pool's view: {plug.get('free_total')}")
check(plug.get("free_total_current") == plug.get("free_total"), "device -1: the current one")
check(plug.get("written") == 1, "write_stats wrote the same statistics")
check(plug.get("bad_paths") == ["ValueError", "OSError"],
      f"write_stats(''): ValueError; an unwritable path: OSError: {plug.get('bad_paths')}")
# The library's line names the call that asked, not BFCSHIM_STATS_FILE (unset here).
plug_log = open(os.path.join(work, "plugin.log")).read()
check("bfcshim_write_stats: " in plug_log and "BFCSHIM_STATS_FILE" not in plug_log,
      f"the unwritable path's log line names bfcshim_write_stats: {plug_log[-600:]}")
check(plug.get("free") == 0 and plug.get("trimmed", 0) >= 8 * MiB and
      plug.get("after_trim") == 0, f"free then trim gives the region back: {plug}")
check("CudaError" in plug.get("bad_device", "") and
      "CUDA_ERROR_INVALID_CONTEXT" in plug.get("bad_device", ""),
      f"bad device: {plug.get('bad_device')}")
check("out of memory" in plug.get("oom", ""), f"huge allocation: {plug.get('oom')}")

pre = client("preloaded", LD_PRELOAD=lib)
check(os.path.samefile(pre.get("library", "/"), lib), "the preloaded copy is used")
check(pre.get("pools") == 1 and pre.get("bytes_in_use") == 12 * MiB,
      f"one pool serves the driver door and the module: {pre}")
check(pre.get("written") == 2, f"both allocations counted: {pre.get('written')}")
check(pre.get("after_trim") == 0, "trim after both frees")

# The preloaded file replaced since the process mapped it (an upgrade under a
# running job: /proc/self/maps says "(deleted)"): still the preloaded copy,
# never a second one with pools of its own.
gone = os.path.join(work, "replaced", "libbfcshim.so")
os.makedirs(os.path.dirname(gone))
shutil.copy(lib, gone)
e = testcheck.fake_cuda_env(fake_dir, PYTHONPATH=source, LD_PRELOAD=gone, BFCSHIM_LIBRARY=lib)
p = subprocess.run([sys.executable, "-c", f"import os; os.unlink({gone!r})\n"
                    "import bfcshim\nbfcshim.stats()\n"
                    "print(sum(1 for l in open('/proc/self/maps') if l.rstrip().endswith("
                    "'/libbfcshim.so')))"], env=e, capture_output=True, text=True)
check(p.returncode == 0 and p.stdout.split()[-1:] == ["0"],
      f"a replaced preloaded library: no second copy loaded: {p.stdout!r} {p.stderr[-800:]}")

# A library that is neither preloaded nor findable: a clear error.
e = testcheck.fake_cuda_env(fake_dir, PYTHONPATH=source)
e.pop("BFCSHIM_LIBRARY", None)
p = subprocess.run([sys.executable, "-c", "import bfcshim; bfcshim.stats()"], env=e,
                   capture_output=True, text=True)
check(p.returncode != 0 and "libbfcshim.so not found" in p.stderr,
      f"no library: {p.stderr[-500:]}")

# No CUDA driver at all (no libcuda.so.1 on the path): mem_get_info raises
# CudaError naming the cause and the way to try without a GPU.
e = dict(os.environ, PYTHONPATH=source, BFCSHIM_LIBRARY=lib, LD_LIBRARY_PATH="")
e.pop("LD_PRELOAD", None)
p = subprocess.run([sys.executable, "-c", "import bfcshim\ntry:\n    bfcshim.mem_get_info(0)\n"
                    "except bfcshim.CudaError as err:\n    print(type(err).__name__, err.name, err)"],
                   env=e, capture_output=True, text=True)
check(p.returncode == 0 and "CudaError CUDA_ERROR_NOT_INITIALIZED" in p.stdout and
      "--fake-gpu" in p.stdout, f"no driver: {p.stdout[-500:]} {p.stderr[-500:]}")
check("cannot open libcuda.so.1" in p.stderr and "--fake-gpu" in p.stderr,
      f"the library's one line says how to try without a GPU: {p.stderr[-500:]}")

# A plug-in imported without its framework says which package is missing.
for mod, name in (("cupy", "CuPy"), ("torch", "PyTorch")):
    p = subprocess.run([sys.executable, "-c", f"import bfcshim.{mod}"],
                       env=dict(e, PYTHONPATH=source + os.pathsep + os.path.join(work, "none")),
                       capture_output=True, text=True)
    if p.returncode == 0:
        continue  # the framework is installed here: nothing to say
    check(f"bfcshim.{mod} is the plug-in for {name}, which cannot be imported" in p.stderr,
          f"{mod} without its framework: {p.stderr[-500:]}")
check.finish()
