#!/usr/bin/env python3
"""test_pip_install.py SOURCE_ROOT E2E_RUNTIME FAKE_CUDA_DIR WORKDIR - the
pip route a user takes: `pip install SOURCE_ROOT` into a fresh virtual
environment (meson-python builds the library, the command and the package),
then, from that install only: `bfcshim run` a CUDA program on the fake
driver, the module finding its own library, bfcshim.run(), the snapshot
converter as a module and as the bfcshim-snapshot2csv script, `bfcshim
demo` run to its end, and the installed header compiling."""
import json
import os
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
import testcheck  # noqa: E402

source, program, fake_dir, work = map(os.path.abspath, sys.argv[1:5])
testcheck.fresh_dir(work)
check = testcheck.Checks()
venv = os.path.join(work, "venv")
py = os.path.join(venv, "bin", "python")

subprocess.run([sys.executable, "-m", "venv", venv], check=True)
p = subprocess.run([py, "-m", "pip", "install", "--quiet", source], capture_output=True,
                   text=True, timeout=900)
if not check(p.returncode == 0, f"pip install failed ({p.returncode}):\n{p.stdout[-3000:]}\n"
             f"{p.stderr[-3000:]}"):
    check.finish()

version = open(os.path.join(source, "meson.build")).read().split("version : '")[1].split("'")[0]

# The licence's text travels with the installed package (MIT: "this
# permission notice shall be included in all copies").
p = subprocess.run([py, "-c", "import importlib.metadata as m; d = m.distribution('bfcshim'); "
                    "print(d.metadata.get('License-Expression'), "
                    "[f.name for f in d.files if f.name == 'LICENSE'])"],
                   capture_output=True, text=True)
check(p.returncode == 0 and p.stdout.split() == ["MIT", "['LICENSE']"],
      f"the installed package carries its licence: {p.stdout!r} {p.stderr[-500:]!r}")
cmd = os.path.join(venv, "bin", "bfcshim")
p = subprocess.run([cmd, "--version"], capture_output=True, text=True)
check(p.returncode == 0 and version in p.stdout, f"bfcshim --version: {p.stdout!r} {p.stderr!r}")
# The command's help names every command pip's bfcshim has: demo too, which
# the README sends the user to first (it is the package's, not the C
# command's, whose help this is).
for args in (["--help"], []):
    p = subprocess.run([cmd, *args], capture_output=True, text=True)
    check("\n  demo " in p.stdout + p.stderr and "\n  run " in p.stdout + p.stderr,
          f"bfcshim {' '.join(args)} lists demo: {p.stdout!r} {p.stderr!r}")

# The user's first run: an unmodified CUDA program under the installed shim,
# on the fake driver that comes in the package (--fake-gpu: no
# LD_LIBRARY_PATH of ours).
stats = os.path.join(work, "stats.json")
env = testcheck.fake_cuda_env(fake_dir, BFCSHIM_STATS_FILE=stats,
                              BFCSHIM_LOG_FILE=os.path.join(work, "run.log"))
env.pop("BFCSHIM_LIBRARY", None)
env.pop("LD_LIBRARY_PATH", None)
p = subprocess.run([cmd, "run", "--fake-gpu", "--", program, "basic"], env=env,
                   capture_output=True, text=True)
check(p.returncode == 0 and "bfcshim-fake-cuda" in p.stderr,
      f"bfcshim run --fake-gpu: {p.returncode} {p.stderr[-2000:]}")
check("NVML to a fake NVML" in p.stderr,
      f"the fake NVML comes in the package, on the program's path: {p.stderr[-2000:]}")
doc = json.load(open(stats)) if os.path.exists(stats) else {"pools": []}
check(len(doc["pools"]) == 1 and doc["pools"][0].get("num_allocs") == 103,
      f"the program's allocations came from the pool: {doc.get('pools')}")

# The module finds the library inside the package, and runs programs.
script = f"""
import json, bfcshim
r = bfcshim.run([{program!r}, "basic"], fake_gpu=True, env={{"BFCSHIM_FENCE_BYTES": "32MiB"}},
                capture_output=True, text=True)
print(json.dumps({{"library": bfcshim.library_path(), "rc": r.returncode,
                  "version": bfcshim.__version__}}))
"""
p = subprocess.run([py, "-c", script], env=env, capture_output=True, text=True, cwd=work)
check(p.returncode == 0, f"module: {p.stderr[-2000:]}")
out = json.loads(p.stdout.splitlines()[-1]) if p.returncode == 0 else {}
check(out.get("library", "").startswith(os.path.realpath(venv)) or
      out.get("library", "").startswith(venv), f"the package's own library: {out}")
check(out.get("rc") == 0 and out.get("version") == version, f"bfcshim.run and version: {out}")

p = subprocess.run([py, "-m", "bfcshim.snapshot2csv", "--help"], capture_output=True, text=True)
check(p.returncode == 0 and "snapshot" in p.stdout, f"python -m bfcshim.snapshot2csv: {p.stderr}")
script = os.path.join(venv, "bin", "bfcshim-snapshot2csv")
if check(os.path.exists(script), f"pip installs the bfcshim-snapshot2csv script ({script})"):
    p = subprocess.run([script, "--help"], capture_output=True, text=True)
    check(p.returncode == 0 and "bfcshim-snapshot2csv" in p.stdout and "snapshot" in p.stdout,
          f"the bfcshim-snapshot2csv script: {p.returncode} {p.stdout!r} {p.stderr!r}")

# The demo from the install alone: its sample job and traces come in the
# package, the fake GPU too (no source tree, no build tree).
demo_out = os.path.join(work, "demo-out")
demo_env = {k: v for k, v in env.items() if k not in ("BFCSHIM_LOG_FILE", "BFCSHIM_STATS_FILE")}
t = time.monotonic()
p = subprocess.run([cmd, "demo", demo_out], env=demo_env, capture_output=True, text=True, cwd=work,
                   timeout=300)
print(f"bfcshim demo: exit {p.returncode} in {time.monotonic() - t:.1f} s")
check(p.returncode == 0 and "\n== 6/6" in p.stdout and "efficiency" in p.stdout,
      f"bfcshim demo ran to its end: {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-2000:]}")
check("us/step" in p.stdout and "What the numbers mean" in p.stdout and
      "out of memory in the pool" in p.stdout, f"bfcshim demo's steps 2 and 3: {p.stdout[-4000:]}")
check(os.path.getsize(os.path.join(demo_out, "report.html")) > 0
      if os.path.exists(os.path.join(demo_out, "report.html")) else False,
      "bfcshim demo wrote report.html")
# An output folder that cannot be made (a file is in the way) is one line
# naming it, not a Python traceback, and nothing runs.
in_the_way = os.path.join(work, "a-file")
open(in_the_way, "w").close()
for out in (in_the_way, os.path.join(in_the_way, "sub")):
    p = subprocess.run([cmd, "demo", out], env=demo_env, capture_output=True, text=True, cwd=work,
                       timeout=300)
    check(p.returncode != 0 and p.stdout == "" and len(p.stderr.splitlines()) == 1 and
          p.stderr.startswith(f"bfcshim demo: {out}: "),
          f"bfcshim demo {out} (cannot be made): {p.returncode} {p.stdout[-300:]!r} "
          f"{p.stderr[-1000:]!r}")

# The installed header is usable by a C program.
p = subprocess.run([py, "-c", "import bfcshim, os; print(os.path.dirname(bfcshim.library_path()))"],
                   env=env, capture_output=True, text=True)
include = os.path.join(os.path.dirname(p.stdout.strip()), "include")
test_c = os.path.join(work, "uses_header.c")
with open(test_c, "w") as f:
    f.write("#include <bfcshim.h>\n"
            "int main(void) { return bfcshim_api_version() == BFCSHIM_API_VERSION ? 0 : 1; }\n")
p = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-fsyntax-only", "-I", include, test_c],
                   capture_output=True, text=True)
check(p.returncode == 0, f"the installed bfcshim.h compiles: {p.stderr}")
check.finish()
