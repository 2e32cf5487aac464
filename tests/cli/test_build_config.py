#!/usr/bin/env python3
"""test_build_config.py SOURCE_ROOT WORKDIR - a build without the CUDA
headers stops with a message naming them and the way out, instead of
quietly leaving the shim out; -Dshim=disabled builds the rest and says so."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testcheck  # noqa: E402

source, work = sys.argv[1:3]
testcheck.fresh_dir(work)
check = testcheck.Checks()


def setup(name, *args):
    return subprocess.run(["meson", "setup", os.path.join(work, name), source,
                           "-Dtests=false", "-Dtoolkit_include=/nonexistent/include", *args],
                          capture_output=True, text=True, timeout=300)


p = setup("default")
text = p.stdout + p.stderr
check(p.returncode != 0, "the default build fails without the headers")
for words in ("cuda.h", "cuda_runtime_api.h", "/nonexistent/include", "-Dtoolkit_include=",
              "nvidia-cuda-runtime", "-Dshim=disabled"):
    check(words in text, f"the message names {words}: {text[-1500:]}")
p = setup("disabled", "-Dshim=disabled")
check(p.returncode == 0, f"-Dshim=disabled configures: {p.stderr[-1500:]}")
check("not built (-Dshim=disabled)" in p.stdout, f"and says so: {p.stdout[-800:]}")
check.finish()
