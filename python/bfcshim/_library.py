"""Finding and loading libbfcshim.so, and its C interface (bfcshim.h) as
ctypes functions.

There must be one copy of the library per process: the pools live in it,
and two copies would mean two sets of pools over one device. So a copy
already in the process (preloaded by ``bfcshim run`` or LD_PRELOAD, or
linked into the program) always wins; only when there is none is a copy
loaded, from BFCSHIM_LIBRARY or from this package. A loaded copy is opened
RTLD_LOCAL: its CUDA entry points then stay private, and only the plug-ins'
explicit calls reach the pools.
"""
import ctypes
import os
import threading

API_VERSION = 1  # the BFCSHIM_API_VERSION this module speaks

_DELETED = " (deleted)"  # /proc/self/maps: the file was removed or replaced since

_lock = threading.Lock()
_lib = None
_path = None


class LibraryError(RuntimeError):
    """libbfcshim.so cannot be found or is too old for this module."""


def packaged_path():
    """The library shipped inside this package (None when it is not there,
    e.g. in a source checkout)."""
    p = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libbfcshim.so")
    return p if os.path.exists(p) else None


def _loaded_copy():
    """The path of a libbfcshim.so already mapped into this process."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                name = line.rstrip("\n").split(None, 5)[-1]
                if os.path.basename(name.removesuffix(_DELETED)) == "libbfcshim.so":
                    return name
    except OSError:
        pass
    return None


def _declare(lib):
    c = ctypes
    sigs = {
        "bfcshim_api_version": (c.c_int, []),
        "bfcshim_active": (c.c_int, []),
        "bfcshim_malloc": (c.c_int, [c.POINTER(c.c_void_p), c.c_size_t, c.c_int]),
        "bfcshim_free": (c.c_int, [c.c_void_p]),
        "bfcshim_malloc_async": (c.c_int, [c.POINTER(c.c_void_p), c.c_size_t, c.c_int,
                                           c.c_void_p]),
        "bfcshim_free_async": (c.c_int, [c.c_void_p, c.c_void_p]),
        "bfcshim_mem_get_info": (c.c_int, [c.c_int, c.POINTER(c.c_size_t),
                                           c.POINTER(c.c_size_t)]),
        "bfcshim_stats_json": (c.c_size_t, [c.c_char_p, c.c_size_t]),
        "bfcshim_write_stats": (c.c_int, [c.c_char_p]),
        "bfcshim_trim": (c.c_size_t, []),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args


def load():
    """The process's libbfcshim.so as a ctypes library, loaded on first use.
    Raises LibraryError when there is none to load or it is too old."""
    global _lib, _path
    with _lock:
        if _lib is not None:
            return _lib
        path = _loaded_copy()
        mode = ctypes.RTLD_LOCAL
        if path is None:
            path = os.environ.get("BFCSHIM_LIBRARY") or packaged_path()
        if path is None:
            raise LibraryError(
                "libbfcshim.so not found: not preloaded, BFCSHIM_LIBRARY is not set, and this "
                "package has no lib/libbfcshim.so (install it with pip, or set "
                "BFCSHIM_LIBRARY to a built library)")
        try:
            # A mapped copy whose file went (an upgrade under a running job)
            # cannot be opened by name: the process's global scope reaches
            # it where it was preloaded or linked.
            lib = ctypes.CDLL(None if path.endswith(_DELETED) else path, mode=mode)
        except OSError as e:
            raise LibraryError(f"cannot load {path}: {e}") from None
        if not hasattr(lib, "bfcshim_api_version"):
            if path.endswith(_DELETED):
                raise LibraryError(f"{path}: the copy in this process, whose file was replaced "
                                   "since, is not reachable; restart the process")
            raise LibraryError(
                f"{path} predates the C interface (bfcshim.h); this module needs API version "
                f"{API_VERSION}: preload the library from the same release")
        version = lib.bfcshim_api_version()
        if version < API_VERSION:
            raise LibraryError(f"{path} implements API version {version}; this module needs "
                               f"{API_VERSION}")
        _declare(lib)
        _lib, _path = lib, path
        return lib


def path():
    """The path of the library in use (loading it if needed)."""
    load()
    return _path


class CudaError(RuntimeError):
    """A call of the library failed; ``code`` is the CUresult, ``name`` its
    name where known, and the message says what to do about it."""

    def __init__(self, what, code):
        self.code = code
        self.name = _CAUSES.get(code, (f"CUresult {code}", ""))[0]
        hint = _CAUSES.get(code, ("", "the shim's log says why"))[1]
        super().__init__(f"{what} failed: {self.name}: {hint}")


_FAKE_GPU = ("on a machine without a GPU, the fake GPU that comes with bfcshim "
             "tries it: bfcshim run --fake-gpu -- python ...")
# The codes the library returns for causes a user can act on.
_CAUSES = {
    1: ("CUDA_ERROR_INVALID_VALUE", "an argument was refused (the shim's log names it)"),
    3: ("CUDA_ERROR_NOT_INITIALIZED", "no CUDA driver could be loaded (libcuda.so.1); "
        + _FAKE_GPU),
    35: ("CUDA_ERROR_INSUFFICIENT_DRIVER", "the CUDA driver is older than the runtime; "
         + _FAKE_GPU),
    100: ("CUDA_ERROR_NO_DEVICE", "no CUDA device is visible (CUDA_VISIBLE_DEVICES?); "
          + _FAKE_GPU),
    101: ("CUDA_ERROR_INVALID_DEVICE", "no such device"),
    201: ("CUDA_ERROR_INVALID_CONTEXT", "no active CUDA context on that device: let the "
          "framework initialise CUDA there first (any CUDA call does), or the device does "
          "not exist"),
    400: ("CUDA_ERROR_INVALID_HANDLE", "the stream is not a valid stream"),
}


def check(code, what):
    """Raises for a nonzero CUresult from the library: MemoryError for out
    of memory, else CudaError (a RuntimeError) naming the cause."""
    if code == 2:
        raise MemoryError(f"{what}: out of memory (CUDA_ERROR_OUT_OF_MEMORY); the shim's log "
                          "has the pool's state")
    if code != 0:
        raise CudaError(what, code)
