"""PyTorch's CUDA memory from the bfcshim pool, without LD_PRELOAD, through
``torch.cuda.memory.CUDAPluggableAllocator``.

    import bfcshim.torch
    bfcshim.torch.install()           # before the first CUDA tensor

or, for a scope, with a PyTorch that has ``torch.cuda.MemPool``::

    pool = bfcshim.torch.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        x = torch.empty(1 << 20, device="cuda")

What the pluggable path loses: ``torch.cuda.memory_stats``, ``memory_summary``,
``_snapshot``/memory_viz and ``empty_cache`` know nothing of the pool; use
``bfcshim.stats()``, ``bfcshim.trim()`` and ``BFCSHIM_TRACE`` instead.
PyTorch calls the free with the stream the block was allocated on, so blocks
are stream-ordered like in its caching allocator. ``Tensor.record_stream(s)``
(DataParallel's scatter, NCCL process groups, FSDP) reaches the library
through the allocator's ``set_record_stream_fn`` where PyTorch has it: the
free then makes the tensor's stream wait for the work queued on ``s`` so far,
so the block is not handed out under it. Where PyTorch lacks it, ``install()``
warns once and record_stream is dropped: make the tensor's stream wait for
the other stream (``t_stream.wait_stream(s)``) before the tensor is freed.
Alternatively, run the unmodified program under ``bfcshim run`` with
``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, which keeps PyTorch's own statistics of
what it asked for.
"""
try:
    import torch
except ImportError as e:  # say which package the plug-in is for
    raise ImportError(f"bfcshim.torch is the plug-in for PyTorch, which cannot be imported "
                      f"here ({e}): pip install torch") from e

import ctypes
import warnings

from . import _library

__all__ = ["allocator", "install", "mem_pool"]

_allocator = None


def allocator():
    """The CUDAPluggableAllocator over the bfcshim pool (one per process)."""
    global _allocator
    if _allocator is None:
        a = torch.cuda.memory.CUDAPluggableAllocator(
            _library.path(), "bfcshim_torch_alloc", "bfcshim_torch_free")
        _wire_record_stream(a)
        _allocator = a
    return _allocator


def _wire_record_stream(a):
    """Hands PyTorch bfcshim_torch_record_stream as the allocator's
    record_stream function, or says once why Tensor.record_stream is not
    honoured. Returns whether it was wired."""
    native = a.allocator() if hasattr(a, "allocator") else None
    setter = getattr(native, "set_record_stream_fn", None)
    fn = getattr(_library.load(), "bfcshim_torch_record_stream", None)
    if setter is not None and fn is not None:
        setter(ctypes.cast(fn, ctypes.c_void_p).value)
        return True
    why = (f"torch {getattr(torch, '__version__', '?')}'s CUDAPluggableAllocator has no "
           "set_record_stream_fn" if setter is None else
           f"{_library.path()} has no bfcshim_torch_record_stream (an older library)")
    warnings.warn(f"bfcshim.torch: {why}, so Tensor.record_stream is not honoured: a tensor "
                  "used on another stream must have its own stream wait for that stream "
                  "(its_stream.wait_stream(other)) before it is freed, or run the program "
                  "under `bfcshim run` with PYTORCH_NO_CUDA_MEMORY_CACHING=1 instead",
                  RuntimeWarning, stacklevel=3)
    return False


def install():
    """Makes the bfcshim pool PyTorch's CUDA allocator. Must run before
    PyTorch allocates its first CUDA tensor."""
    try:
        torch.cuda.memory.change_current_allocator(allocator())
    except RuntimeError as e:
        raise RuntimeError(
            "bfcshim.torch.install() must run before PyTorch's CUDA allocator is initialised "
            "(before the first CUDA tensor); or use bfcshim.torch.mem_pool() for a scope, or "
            f"`bfcshim run` for the whole program ({e})") from None


def mem_pool():
    """A ``torch.cuda.MemPool`` served by the bfcshim pool, for
    ``torch.cuda.use_mem_pool``. PyTorch still caches the pool's blocks on
    top (freed blocks go back to the pool at ``torch.cuda.empty_cache``)."""
    if not hasattr(torch.cuda, "MemPool"):
        raise RuntimeError(f"torch {torch.__version__} has no torch.cuda.MemPool: use install()")
    return torch.cuda.MemPool(allocator().allocator())
