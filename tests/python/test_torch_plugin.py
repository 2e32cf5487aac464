#!/usr/bin/env python3
"""test_torch_plugin.py LIBBFCSHIM WORKDIR - what of the PyTorch plug-in can
run without a GPU (real cudart cannot run on the fake driver): PyTorch's
CUDAPluggableAllocator opens the library and resolves bfcshim_torch_alloc /
bfcshim_torch_free, and install() swaps PyTorch's allocator before its
first CUDA tensor. Training through the plug-in is a GPU check
(scripts/gpu-proof.sh, step plugins). Skips (77) without torch."""
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
import testcheck  # noqa: E402

lib, work = sys.argv[1:3]
testcheck.fresh_dir(work)
check = testcheck.Checks()
env = dict(os.environ, PYTHONPATH=os.path.join(here, "..", "..", "python"),
           BFCSHIM_LIBRARY=lib)
env.pop("LD_PRELOAD", None)
probe = subprocess.run([sys.executable, "-c", "import torch.cuda.memory as m; "
                        "m.CUDAPluggableAllocator"], env=env, capture_output=True, text=True)
if probe.returncode != 0:
    print(f"torch with CUDAPluggableAllocator is not importable: skipping\n{probe.stderr[-500:]}")
    sys.exit(77)

script = """
import bfcshim.torch, torch
a = bfcshim.torch.allocator()
assert a is bfcshim.torch.allocator(), "one allocator per process"
bfcshim.torch.install()
print("installed", type(a).__name__)
"""
p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                   timeout=300)
check(p.returncode == 0 and "installed CUDAPluggableAllocator" in p.stdout,
      f"allocator and install: {p.returncode} {p.stdout} {p.stderr[-2000:]}")

# A library that cannot be loaded is named at allocator() time, not at the
# first tensor.
env_bad = dict(env, BFCSHIM_LIBRARY="/nonexistent/libbfcshim.so")
p = subprocess.run([sys.executable, "-c", "import bfcshim.torch; bfcshim.torch.allocator()"],
                   env=env_bad, capture_output=True, text=True, timeout=300)
check(p.returncode != 0 and "cannot load /nonexistent/libbfcshim.so" in p.stderr,
      f"a missing library is named: {p.stderr[-800:]}")
check.finish()
