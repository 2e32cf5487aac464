"""Helpers shared by the Python test scripts under tests/: a check that
counts and reports failures without stopping, a fresh work folder, and the
environment for programs run over the fake CUDA libraries."""
import os
import shutil
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
