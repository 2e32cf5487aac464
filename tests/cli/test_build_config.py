#!/usr/bin/env python3
"""test_build_config.py SOURCE_ROOT WORKDIR - a build without the CUDA
headers stops with a message naming them, the places searched and the way
out, instead of quietly leaving the shim out; -Dshim=disabled builds the
rest and says so. Without -Dtoolkit_include the build finds the headers
where users have them (scripts/find_cuda_headers.py): in stand-in folders
named by CUDA_HOME, CUDA_PATH, an nvcc on PATH, a virtual environment's or
conda's prefix, and the summary names the folder taken."""
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testcheck  # noqa: E402

source, work = sys.argv[1:3]
testcheck.fresh_dir(work)
check = testcheck.Checks()


def setup(name, *args, toolkit="/nonexistent/include", env=None):
    opt = [f"-Dtoolkit_include={toolkit}"] if toolkit is not None else []
    return subprocess.run(["meson", "setup", os.path.join(work, name), source,
                           "-Dtests=false", *opt, *args],
                          capture_output=True, text=True, timeout=300, env=env)


p = setup("default")
text = p.stdout + p.stderr
check(p.returncode != 0, "the default build fails without the headers")
for words in ("cuda.h", "cuda_runtime_api.h", "/nonexistent/include (-Dtoolkit_include): no such",
              "-Dtoolkit_include=", "nvidia-cuda-runtime", "CUDA_HOME", "-Dshim=disabled"):
    check(words in text, f"the message names {words}: {text[-1500:]}")
p = setup("disabled", "-Dshim=disabled")
check(p.returncode == 0, f"-Dshim=disabled configures: {p.stderr[-1500:]}")
check("not built (-Dshim=disabled)" in p.stdout, f"and says so: {p.stdout[-800:]}")
p = setup("auto", "-Dshim=auto")
check(p.returncode == 0 and "not built (no CUDA 13 headers" in p.stdout
      and "/nonexistent/include (-Dtoolkit_include): no such folder" in p.stdout,
      f"-Dshim=auto configures without the shim, saying where it looked: {p.stdout[-800:]}")

# Stand-in headers: has_header asks only whether the file is there, and the
# probe reads the version macros (cuda.h's CUDA_VERSION, cuda_runtime_api.h's
# CUDART_VERSION), so two lines do, with or without a toolkit here. They
# live outside the source tree (the build folder may be in it, and meson
# refuses an include folder there given by absolute path).
fake = tempfile.mkdtemp(prefix="bfcshim-build-config-")


def headers(folder, version=13000, which=("cuda.h", "cuda_runtime_api.h")):
    os.makedirs(folder, exist_ok=True)
    macro = {"cuda.h": "CUDA_VERSION", "cuda_runtime_api.h": "CUDART_VERSION"}
    for h in which:
        with open(os.path.join(folder, h), "w") as f:
            f.write(f"#pragma once\n#define {macro[h]} {version}\n")
    return folder


def nvcc_in(folder):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "nvcc")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexit 1\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


# The environment of a user with none of the variables and no nvcc: PATH
# keeps what the build needs (meson, the compiler, python3) minus any
# folder with an nvcc in it; first on it, a folder of the test's own.
bin_dir = os.path.join(fake, "bin")
os.makedirs(bin_dir, exist_ok=True)
plain = {k: v for k, v in os.environ.items()
         if k not in ("CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX", "VIRTUAL_ENV")}
plain["PATH"] = os.pathsep.join([bin_dir] + [
    d for d in os.environ.get("PATH", "").split(os.pathsep)
    if d and not os.path.exists(os.path.join(d, "nvcc"))])


def summary_folder(p):
    """The folder of the summary's line 'CUDA headers: FOLDER (why): CUDA x.y'."""
    for line in p.stdout.splitlines():
        if line.strip().startswith("CUDA headers"):
            return line.split(":", 1)[1].strip().split(" (")[0]
    return None


def finds(name, want, *args, **env_vars):
    env = dict(plain, **env_vars)
    p = setup(name, *args, toolkit=None, env=env)
    got = summary_folder(p)
    ok = check(p.returncode == 0 and got == os.path.normpath(want),
               f"{name}: the headers in {want}, got {got} (exit {p.returncode}):\n"
               f"{p.stdout[-1500:]}{p.stderr[-1500:]}")
    return p if ok else None


home = os.path.join(fake, "home")
headers(os.path.join(home, "include"))
cpath = os.path.join(fake, "cudapath")
headers(os.path.join(cpath, "include"))
finds("cuda_home", os.path.join(home, "include"), CUDA_HOME=home, CUDA_PATH=cpath)
finds("cuda_path", os.path.join(cpath, "include"), CUDA_PATH=cpath)
# CUDA 12's headers are passed over, and the summary says the next one taken.
cu12 = os.path.join(fake, "cu12")
headers(os.path.join(cu12, "include"), version=12090)
finds("cuda12_skipped", os.path.join(cpath, "include"), CUDA_HOME=cu12, CUDA_PATH=cpath)
# Both headers from one folder: cuda.h alone in CUDA_HOME is passed over.
half = os.path.join(fake, "half")
headers(os.path.join(half, "include"), which=("cuda.h",))
finds("one_folder", os.path.join(cpath, "include"), CUDA_HOME=half, CUDA_PATH=cpath)
# A toolkit's targets/ layout, which conda's packages use.
triple = {"x86_64": "x86_64-linux", "aarch64": "sbsa-linux"}.get(platform.machine())
if triple:
    conda_tk = os.path.join(fake, "condatk")
    headers(os.path.join(conda_tk, "targets", triple, "include"))
    finds("targets", os.path.join(conda_tk, "targets", triple, "include"), CUDA_HOME=conda_tk)
# nvcc on PATH: its toolkit (bin/..), also through a link to it.
tk = os.path.join(fake, "cuda-13.9")
headers(os.path.join(tk, "include"))
nvcc = nvcc_in(os.path.join(tk, "bin"))
finds("nvcc", os.path.join(tk, "include"),
      PATH=os.pathsep.join([os.path.join(tk, "bin"), plain["PATH"]]))
os.symlink(nvcc, os.path.join(bin_dir, "nvcc"))
finds("nvcc_link", os.path.join(tk, "include"))
os.unlink(os.path.join(bin_dir, "nvcc"))
# -Dtoolkit_include comes first and alone: over CUDA_HOME, and when it is
# wrong the build stops rather than taking another.
p = setup("explicit", toolkit=os.path.join(cpath, "include"), env=dict(plain, CUDA_HOME=home))
check(p.returncode == 0 and summary_folder(p) == os.path.join(cpath, "include"),
      f"-Dtoolkit_include wins over CUDA_HOME: {p.stdout[-1500:]}{p.stderr[-1500:]}")
p = setup("explicit_cuda12", toolkit=os.path.join(cu12, "include"), env=dict(plain, CUDA_HOME=home))
text = p.stdout + p.stderr
check(p.returncode != 0 and "CUDA 12.9" in text and "needs CUDA 13" in text
      and os.path.join(cu12, "include") in text,
      f"-Dtoolkit_include with CUDA 12's headers stops the build, saying so: {text[-1500:]}")

# The Python environments, after the usual places (/usr/local/cuda, ...),
# which may hold a toolkit here: the probe itself, with no usual places.
probe = os.path.join(source, "scripts", "find_cuda_headers.py")


def probe_finds(what, want, python=sys.executable, **env_vars):
    p = subprocess.run([python, probe, platform.machine(), "13", ""],
                       capture_output=True, text=True, env=dict(plain, **env_vars), timeout=60)
    got = p.stdout.split("\n")[0]
    check(p.returncode == 0 and got == want, f"{what}: {want}, got {got!r}:\n{p.stdout}{p.stderr}")


venv = os.path.join(fake, "venv")
site = os.path.join(venv, "lib", "python3.99", "site-packages")
headers(os.path.join(site, "nvidia", "cuda_runtime", "include"), version=12090)  # CUDA 12's wheel
headers(os.path.join(site, "nvidia", "cu13", "include"))
probe_finds("VIRTUAL_ENV's header wheel", os.path.join(site, "nvidia", "cu13", "include"),
            VIRTUAL_ENV=venv)
conda = os.path.join(fake, "conda")
headers(os.path.join(conda, "include"))
probe_finds("CONDA_PREFIX", os.path.join(conda, "include"), CONDA_PREFIX=conda, VIRTUAL_ENV=venv)
# The Python that runs the build, as under pip's build isolation: the
# environment is not activated (no VIRTUAL_ENV), its interpreter runs meson.
real = os.path.join(fake, "realvenv")
if subprocess.run([sys.executable, "-m", "venv", "--without-pip", real]).returncode == 0:
    vpy = os.path.join(real, "bin", "python")
    purelib = subprocess.run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True).stdout.strip()
    headers(os.path.join(purelib, "nvidia", "cu13", "include"))
    probe_finds("the running Python's header wheel", os.path.join(purelib, "nvidia", "cu13", "include"),
                python=vpy)
shutil.rmtree(fake, ignore_errors=True)
check.finish()
