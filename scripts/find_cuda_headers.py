#!/usr/bin/env python3
"""find_cuda_headers.py CPU_FAMILY MAJOR EXPLICIT [SYSTEM_ROOT...] - the
folder that holds both cuda.h and cuda_runtime_api.h of CUDA MAJOR, for
shim/meson.build (run_command, with the Python that runs the build).

Prints the folder found on the first line (empty when none) and then one
line per place looked at, with what was there, for meson's summary and its
error message. Always exits 0: meson decides what a missing folder means.

EXPLICIT (-Dtoolkit_include), when not empty, is the only place looked at.
Otherwise, in this order, the first folder that qualifies wins:
  1. $CUDA_HOME, then $CUDA_PATH (a toolkit's root: PyTorch's
     cpp_extension convention; conda's activation sets CUDA_HOME);
  2. the toolkit of the nvcc on PATH (BIN/.., as found and with links
     resolved: /usr/bin/nvcc gives /usr, Debian's packaged headers);
  3. SYSTEM_ROOT... (meson.build lists them: /usr/local/cuda, the newest
     /usr/local/cuda-MAJOR.*, /opt/cuda, /usr);
  4. the Python environments: $CONDA_PREFIX (a conda toolkit), then the
     site-packages of $VIRTUAL_ENV, of $CONDA_PREFIX and of the Python
     running this script, for the PyPI header wheel nvidia-cuda-runtime
     (nvidia/cuMAJOR/include; CUDA 12's nvidia-cuda-runtime-cu12 used
     nvidia/cuda_runtime/include). Under pip's build isolation that Python
     is the user's interpreter with the build's own packages on sys.path:
     its prefix (sysconfig's purelib) is still the user's environment.
Each root is tried as ROOT/include and ROOT/targets/TRIPLE/include (the
toolkit's and conda's layout). A folder qualifies when both headers are in
it and both say CUDA MAJOR (CUDA_VERSION, CUDART_VERSION)."""
import glob
import os
import re
import shutil
import site
import sys
import sysconfig

cpu, major, explicit, *system_roots = sys.argv[1:]
major = int(major)
# The toolkit's targets/ folder names (cuda-installation-guide-linux:
# x86_64-linux; sbsa-linux for Arm servers, aarch64-linux for Jetson).
triples = {"x86_64": ["x86_64-linux"], "aarch64": ["sbsa-linux", "aarch64-linux"]}.get(cpu, [])

seen = set()
searched = []


def version(path, macro):
    """The value of '#define MACRO N' in the header at path, or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            m = re.search(r"^\s*#\s*define\s+" + macro + r"\s+(\d+)", f.read(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def dotted(v):
    return f"{v // 1000}.{v % 1000 // 10}"


def check(folder, why):
    """Records folder and what is in it; True when it qualifies."""
    folder = os.path.normpath(folder)
    if folder in seen:
        return False
    seen.add(folder)
    where = f"{folder} ({why})"
    if not os.path.isdir(folder):
        searched.append(f"{where}: no such folder")
        return False
    missing = [h for h in ("cuda.h", "cuda_runtime_api.h")
               if not os.path.isfile(os.path.join(folder, h))]
    if missing:
        searched.append(f"{where}: no {' and no '.join(missing)}")
        return False
    drv = version(os.path.join(folder, "cuda.h"), "CUDA_VERSION")
    rt = version(os.path.join(folder, "cuda_runtime_api.h"), "CUDART_VERSION")
    if drv is None or rt is None:
        searched.append(f"{where}: no CUDA_VERSION in cuda.h or CUDART_VERSION in "
                        "cuda_runtime_api.h")
        return False
    if drv // 1000 != major or rt // 1000 != major:
        searched.append(f"{where}: CUDA {dotted(drv)} (runtime {dotted(rt)}), "
                        f"the shim needs CUDA {major}")
        return False
    searched.append(f"{where}: CUDA {dotted(drv)}")
    return True


def numbers(path):
    return [int(n) for n in re.findall(r"\d+", path)]


def includes(root):
    return [os.path.join(root, "include")] + \
        [os.path.join(root, "targets", t, "include") for t in triples]


def candidates():
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            for d in includes(os.environ[var]):
                yield d, var
    nvcc = shutil.which("nvcc")
    if nvcc:
        for path in (nvcc, os.path.realpath(nvcc)):
            for d in includes(os.path.dirname(os.path.dirname(path))):
                yield d, "nvcc on PATH: " + nvcc
    for pattern in system_roots:
        # a pattern (/usr/local/cuda-13.*): the newest version first
        for root in sorted(glob.glob(pattern), key=numbers, reverse=True):
            for d in includes(root):
                yield d, "usual place"
    conda = os.environ.get("CONDA_PREFIX")
    if conda:
        for d in includes(conda):
            yield d, "CONDA_PREFIX"
    sites = []
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        if os.environ.get(var):
            sites += [(s, var) for s in sorted(glob.glob(
                os.path.join(os.environ[var], "lib", "python3*", "site-packages")))]
    here = [sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
    try:
        here += site.getsitepackages()
    except AttributeError:  # an old virtualenv's site module
        pass
    sites += [(s, "Python " + sys.executable) for s in here + sys.path
              if s.endswith(("site-packages", "dist-packages"))]  # Debian's
    for s, why in sites:
        for sub in (f"cu{major}", "cuda_runtime"):
            yield os.path.join(s, "nvidia", sub, "include"), why


found = ""
if explicit:
    if check(explicit, "-Dtoolkit_include"):
        found = os.path.normpath(explicit)
else:
    for folder, why in candidates():
        if check(folder, why):
            found = os.path.normpath(folder)
            break
print(found)
print("\n".join(searched))
