"""Helpers shared by the Python test scripts under tests/: a check that
counts and reports failures without stopping, a fresh work folder, the
environment for programs run over the fake CUDA libraries, and the running
of the real-framework clients."""
import json
import os
import shutil
import subprocess
import sys


class Checks:
    def __init__(self):
        self.failures = 0

    def __call__(self, cond, what):
        if not cond:
            self.failures += 1
            print("FAIL:", what)
        return cond

    def finish(self):
        print("failures:", self.failures)
        sys.exit(1 if self.failures else 0)


def fresh_dir(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def fake_cuda_env(fake_dir, **extra):
    """The environment of a program that should find the fake libcuda and
    libcudart; no LD_PRELOAD unless given."""
    env = dict(os.environ, LD_LIBRARY_PATH=fake_dir, FAKECUDA_DEVICES="2", FAKECUDA_MEM="1GiB",
               ASAN_OPTIONS="verify_asan_link_order=0:detect_leaks=0")
    env.pop("LD_PRELOAD", None)
    env.update(extra)
    return env


def require_module(name, what):
    """Exits 77 (a visible skip) when `name` cannot be imported."""
    import importlib
    try:
        importlib.import_module(name)
    except Exception as e:  # ImportError, or a broken install
        print(f"{what} is not importable ({type(e).__name__}: {e}): skipping")
        sys.exit(77)


def run_json_client(check, tag, cmd, env, work, timeout=300):
    """Runs a client that prints one JSON line last (the framework clients:
    tests/e2e/jax_client.py, tensorflow_client.py); keeps its stderr in
    WORK/TAG.stderr, checks it exited 0, and returns its JSON (empty when
    it printed none) and its stderr."""
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    with open(os.path.join(work, f"{tag}.stderr"), "w") as f:
        f.write(p.stderr)
    check(p.returncode == 0, f"{tag}: client exited {p.returncode}: {p.stderr[-3000:]}")
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    return (json.loads(lines[-1]) if lines else {}), p.stderr


def glog_errors(stderr):
    """The error lines of a program logging as glog does (E<date>...: XLA,
    TensorFlow)."""
    return [line for line in stderr.splitlines()
            if len(line) > 1 and line[0] == "E" and line[1].isdigit()]


def framework_python(root, framework, what):
    """The Python of FRAMEWORK's environment (scripts/framework-venv.sh); exits
    77 (a visible skip) saying why when there is none."""
    venv = subprocess.run([os.path.join(root, "scripts", "framework-venv.sh"), framework,
                           "--find"], capture_output=True, text=True).stdout.strip()
    python = os.path.join(venv, "bin", "python") if venv else ""
    if not python or not os.path.exists(python):
        print(f"no {what} environment (scripts/framework-venv.sh {framework} makes one; "
              "scripts/deps.sh --with-tests runs it): skipping")
        sys.exit(77)
    return python

