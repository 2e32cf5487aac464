"""Numba's device memory from the bfcshim pool: an External Memory
Management plug-in (NBEP 7).

Use it by environment, before Numba creates its context::

    NUMBA_CUDA_MEMORY_MANAGER=bfcshim.numba python app.py

or from code, before the first allocation::

    from numba import cuda
    import bfcshim.numba
    cuda.set_memory_manager(bfcshim.numba.BfcshimMemoryManager)

Device allocations come from the pool of the context's device (the same pool
the preloaded library serves when it is also in the process); pinned and
mapped host memory stay with Numba. A block freed here is handed out again
only after the work queued on every stream when it was freed has finished,
so Numba's deferred-deallocation machinery has nothing to protect:
``defer_cleanup`` keeps Numba's meaning for host memory and changes nothing
for device memory.
"""
import ctypes
import threading
import weakref

try:
    from numba.cuda import HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer
    from numba.cuda.cudadrv import driver as _driver
except ImportError as e:  # say which package the plug-in is for
    raise ImportError(f"bfcshim.numba is the plug-in for numba-cuda, which cannot be imported "
                      f"here ({e}): pip install numba-cuda") from e

from . import _library, mem_get_info

__all__ = ["BfcshimMemoryManager", "OutOfMemoryError"]

try:  # the code as Numba's driver reports it (an enum over cuda.bindings)
    _OUT_OF_MEMORY = _driver.binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY
except AttributeError:
    _OUT_OF_MEMORY = 2


class OutOfMemoryError(_driver.CudaAPIError, MemoryError):
    """The pool cannot hold an array: Numba's own out-of-memory error
    (``CudaAPIError`` with ``code`` CUDA_ERROR_OUT_OF_MEMORY, as Numba's
    memory manager raises it), and a ``MemoryError``."""


class BfcshimMemoryManager(HostOnlyCUDAMemoryManager):
    """Numba EMM plug-in serving device memory from bfcshim's pool."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._live = {}  # address -> size, of what this context's arrays hold
        self._live_lock = threading.Lock()

    def initialize(self):
        _library.load()  # a missing library fails here, not at the first array

    def _device(self):
        return self.context.device.id

    def memalloc(self, size):
        lib = _library.load()
        ptr = ctypes.c_void_p()
        try:
            _library.check(lib.bfcshim_malloc(ctypes.byref(ptr), size, self._device()),
                           f"bfcshim_malloc({size} bytes)")
        except MemoryError as e:
            raise OutOfMemoryError(_OUT_OF_MEMORY, str(e)) from None
        address = ptr.value
        with self._live_lock:
            self._live[address] = size
        live, lock = self._live, self._live_lock

        def finalizer():
            # Runs when the array's memory is collected, or not at all if
            # reset() freed it first.
            with lock:
                owned = live.pop(address, None) is not None
            if owned:
                lib.bfcshim_free(address)

        return MemoryPointer(weakref.proxy(self.context), ctypes.c_void_p(address), size,
                             finalizer=finalizer)

    def get_memory_info(self):
        free, total = mem_get_info(self._device())
        return MemoryInfo(free=free, total=total)

    def get_ipc_handle(self, memory):
        raise RuntimeError(
            "bfcshim: IPC of pooled memory is refused: the block lies inside a pool region that "
            "also holds other arrays, and a handle would expose the region, not the block. Use "
            "Numba's default memory manager for arrays shared between processes.")

    def reset(self):
        """The context is being reset: every array it allocated is freed (as
        Numba's own manager does), then idle regions go back to the device."""
        super().reset()
        with self._live_lock:
            addresses = list(self._live)
            self._live.clear()
        lib = _library.load()
        for address in addresses:
            lib.bfcshim_free(address)
        lib.bfcshim_trim()

    @property
    def interface_version(self):
        return 1


# What NUMBA_CUDA_MEMORY_MANAGER=bfcshim.numba looks up.
_numba_memory_manager = BfcshimMemoryManager
