"""bfcshim: a best-fit-with-coalescing GPU memory pool for CUDA programs.

Two ways in, one set of pools per process:

- unmodified programs, through LD_PRELOAD: ``bfcshim run -- python train.py``
  (or :func:`run` from Python) serves every cudaMalloc/cuMemAlloc of
  PyTorch, JAX, CuPy, Numba or TensorFlow from the pool;
- plug-ins, without LD_PRELOAD: :mod:`bfcshim.numba`, :mod:`bfcshim.cupy`
  and :mod:`bfcshim.torch` install the pool as the framework's allocator
  through its official interface.

The functions here read the live pools' statistics and act on them, in
whichever way the library came into the process. Configuration is by
environment (BFCSHIM_MEM_FRACTION, BFCSHIM_PREALLOCATE, ...), read at the
first CUDA allocation the library serves.
"""
import ctypes
import json
import os
import subprocess
import sys

from . import _library
from ._library import CudaError, LibraryError

__all__ = ["stats", "write_stats", "trim", "mem_get_info", "active", "library_path",
           "command_path", "run", "LibraryError", "CudaError", "__version__"]

try:
    from ._version import version as __version__
except ImportError:  # a source checkout, not an installed package
    __version__ = "0+unknown"


def library_path():
    """Path of the libbfcshim.so this process uses (the preloaded copy if
    there is one, else BFCSHIM_LIBRARY or the package's own)."""
    return _library.path()


def active():
    """True when allocations are served from the pools (False in platform
    mode, or when no CUDA driver can be opened)."""
    return bool(_library.load().bfcshim_active())


def stats():
    """The statistics of the process's pools as a dict, with the keys of the
    BFCSHIM_STATS_FILE document: ``allocator``, ``pools`` (one dict per
    context: ``device``, ``alive`` (False once the context went),
    ``bytes_in_use``, ``peak_bytes_in_use``, ``pool_bytes``,
    ``largest_free_block_bytes``, ``fragmentation``, ...),
    ``platform``, ``passthrough_allocs``, ..."""
    lib = _library.load()
    for _ in range(4):  # the document may grow between the two calls
        need = lib.bfcshim_stats_json(None, 0)
        buf = ctypes.create_string_buffer(need + 4096)
        got = lib.bfcshim_stats_json(buf, len(buf))
        if need == 0 or got == 0:  # bfcshim.h: the document could not be made
            raise MemoryError("bfcshim_stats_json: no memory for the statistics document")
        if got < len(buf):
            return json.loads(buf.value.decode())
    raise RuntimeError("bfcshim_stats_json: the document kept growing")


def write_stats(path=None):
    """Writes the statistics document to ``path`` (default: the
    BFCSHIM_STATS_FILE path; ``%p`` becomes the pid)."""
    if path is None:  # the library's, read at its first call
        where = os.environ.get("BFCSHIM_STATS_FILE")
        if not where:
            raise ValueError("write_stats: no path given and BFCSHIM_STATS_FILE is not set")
        arg = None
    else:
        arg = os.fsencode(path)
        if not arg:
            raise ValueError("write_stats: the path is empty")
        where = os.fsdecode(arg)
    if _library.load().bfcshim_write_stats(arg) != 0:
        raise OSError(f"bfcshim_write_stats: cannot write {where} (the shim's log says why)")


def trim():
    """Gives idle pool memory back to the device: every region holding no
    live block and no block still awaiting queued GPU work, and, in a pool
    over virtual memory (BFCSHIM_VMM), every granule lying wholly in free
    space. Returns the bytes released (0 in platform mode)."""
    return int(_library.load().bfcshim_trim())


def mem_get_info(device=-1):
    """(free, total) for ``device`` as the pool sees it: what can still be
    allocated (the pool's unused bytes plus what the device can add within
    the pool's limit) and the device's total memory. -1: the current
    context's device."""
    lib = _library.load()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _library.check(lib.bfcshim_mem_get_info(device, ctypes.byref(free), ctypes.byref(total)),
                   "bfcshim_mem_get_info")
    return free.value, total.value


def command_path():
    """The packaged ``bfcshim`` command (``bfcshim/bin/bfcshim``)."""
    p = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "bfcshim")
    if not os.path.exists(p):
        raise LibraryError(f"the bfcshim command is not installed in this package ({p})")
    return p


def run(argv, env=None, fake_gpu=False, **options):
    """Runs ``argv`` under the shim (``bfcshim run -- argv``) and returns its
    subprocess.CompletedProcess. ``env`` adds environment variables (such as
    ``{"BFCSHIM_MEM_FRACTION": "0.5"}``, checked like ``bfcshim run --env``);
    ``fake_gpu`` runs it on the fake CUDA driver that comes with bfcshim
    (host memory, no kernels: for trying the shim without a GPU); other
    keyword arguments go to subprocess.run."""
    if isinstance(argv, str):
        raise TypeError("run: give the command as a list of arguments")
    flags = ["--fake-gpu"] if fake_gpu else []
    for name, value in (env or {}).items():
        flags += ["--env", f"{name}={value}"]
    # The command finds the library next to itself; a BFCSHIM_LIBRARY in the
    # environment wins.
    return subprocess.run([command_path(), "run", *flags, "--", *argv], **options)


def _main():
    """``python -m bfcshim`` and pip's ``bfcshim``: the bfcshim command, and
    ``bfcshim demo`` (:mod:`bfcshim.demo`), which only the package has."""
    if sys.argv[1:2] == ["demo"]:
        from . import demo
        sys.exit(demo.main(sys.argv[2:]))
    os.execv(command_path(), ["bfcshim", *sys.argv[1:]])
