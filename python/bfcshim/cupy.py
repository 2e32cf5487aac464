"""CuPy's device memory from the bfcshim pool, without LD_PRELOAD.

    import bfcshim.cupy
    bfcshim.cupy.install()            # every later CuPy allocation
    with bfcshim.cupy.pool():         # or only inside a scope
        x = cupy.zeros(1 << 20)

CuPy's own memory pool is then bypassed (``cupy.get_default_memory_pool()``
stays empty). Blocks are stream-ordered like CuPy's pool: each is allocated
on the current stream and, when its array is collected, freed on that
stream, so that stream reuses it at once and others after the stream's
queued work has finished (the stream is kept alive until then). An array
allocated on a stream CuPy does not own (``ExternalStream``) is freed as by
``cudaFree`` instead, since its owner may destroy that stream first. An array
used on another stream needs the same synchronisation it needs under CuPy's
pool.
"""
import contextlib
import ctypes
import operator
import weakref

try:
    import cupy
except ImportError as e:  # say which package the plug-in is for
    raise ImportError(f"bfcshim.cupy is the plug-in for CuPy, which cannot be imported "
                      f"here ({e}): pip install cupy-cuda13x, or the cupy package of your CUDA") from e

from . import _library

__all__ = ["malloc", "install", "pool"]


def _free(lib, address, stream):
    # A stream CuPy owns is kept alive by this call's arguments until now
    # (below), so its handle is still valid here. One CuPy does not own
    # (ExternalStream: a PyTorch stream, a raw handle) may have been
    # destroyed by its owner since: the block is then freed as by cudaFree,
    # which waits for every stream's queued work and touches no handle.
    if isinstance(stream, cupy.cuda.ExternalStream):
        lib.bfcshim_free(address)
    else:
        lib.bfcshim_free_async(address, stream.ptr)


class _Block:
    """Owns one pooled block; freeing happens when CuPy drops its last
    reference (CuPy's UnownedMemory keeps this object alive until then).

    The finalizer holds the allocation's Stream object: a Stream collected
    before its arrays would otherwise destroy its handle, and the free would
    name a dead stream (the real driver may crash on one)."""

    __slots__ = ("address", "__weakref__")

    def __init__(self, lib, address, stream):
        self.address = address
        weakref.finalize(self, _free, lib, address, stream)


def malloc(nbytes):
    """A CuPy allocator function (``cupy.cuda.set_allocator(malloc)``).
    Out of memory raises ``cupy.cuda.memory.OutOfMemoryError`` (a
    ``MemoryError``), as CuPy's own pool does."""
    nbytes = operator.index(nbytes)
    if nbytes < 0:
        raise ValueError(f"bfcshim.cupy.malloc: negative size {nbytes}")
    device = cupy.cuda.Device().id
    if nbytes == 0:
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, device), 0)
    lib = _library.load()
    stream = cupy.cuda.get_current_stream()
    ptr = ctypes.c_void_p()
    try:
        _library.check(lib.bfcshim_malloc_async(ctypes.byref(ptr), nbytes, device, stream.ptr),
                       f"bfcshim_malloc_async({nbytes} bytes)")
    except MemoryError as e:  # the cause keeps the shim's hint
        raise cupy.cuda.memory.OutOfMemoryError(nbytes, -1) from e
    block = _Block(lib, ptr.value, stream)
    mem = cupy.cuda.UnownedMemory(ptr.value, nbytes, block, device)
    return cupy.cuda.MemoryPointer(mem, 0)


def install():
    """Makes the bfcshim pool CuPy's allocator for the rest of the process."""
    _library.load()
    cupy.cuda.set_allocator(malloc)


@contextlib.contextmanager
def pool():
    """CuPy allocations inside the ``with`` block come from the bfcshim pool."""
    _library.load()
    with cupy.cuda.using_allocator(malloc):
        yield
