#!/usr/bin/env python3
"""test_cupy_plugin.py LIBBFCSHIM FAKE_CUDA_DIR WORKDIR - the CuPy plug-in
(bfcshim.cupy) without LD_PRELOAD, over a stand-in for CuPy (real CuPy
needs the real CUDA runtime, which cannot run on the fake driver; its GPU
run is scripts/gpu-proof.sh's step plugins). An array frees on its
allocation stream: that stream must still exist then, and one CuPy does not
own is not named at all."""
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
import testcheck  # noqa: E402

lib, fake_dir, work = sys.argv[1:4]
testcheck.fresh_dir(work)
check = testcheck.Checks()
source = os.path.join(here, "..", "..", "python")
log = os.path.join(work, "plugin.log")
env = testcheck.fake_cuda_env(fake_dir, BFCSHIM_LIBRARY=lib, BFCSHIM_LOG_FILE=log,
                              PYTHONPATH=os.pathsep.join([os.path.join(here, "cupy_stub"),
                                                          source]))
p = subprocess.run([sys.executable, os.path.join(here, "cupy_plugin_client.py")], env=env,
                   capture_output=True, text=True, timeout=300)
check(p.returncode == 0, f"client exited {p.returncode}: {p.stderr[-2000:]}")
lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
out = json.loads(lines[-1]) if lines else {}
check(out.get("stream_kept_while_array_lives") is True,
      f"a Stream collected before its array lives until the array is freed: {out}")
check(out.get("stream_destroyed_after") is True, f"and goes after it: {out}")
check(out.get("stale_handle_uses") == 0, f"no call on a destroyed stream: {out}")
check(out.get("in_use") == 10 << 20, f"the two arrays were freed, the ten kept: {out}")
check(out.get("oom") == "cupy.cuda.memory.OutOfMemoryError",
      f"out of memory raises CuPy's OutOfMemoryError: {out}")
check(out.get("negative") == "ValueError", f"a negative size is a ValueError: {out}")
check.finish()
