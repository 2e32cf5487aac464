"""cupy.cuda as far as bfcshim.cupy uses it. Streams behave as CuPy's: a
Stream owns its handle and destroys it when collected; an ExternalStream
wraps a handle someone else owns. `destroyed` lists the handles destroyed,
in order."""
import contextlib
import ctypes

from . import memory  # noqa: F401

_cu = ctypes.CDLL("libcuda.so.1")
destroyed = []
_allocator = None


class Device:
    def __init__(self, id=0):
        self.id = id


class Stream:
    def __init__(self, non_blocking=True):
        h = ctypes.c_void_p()
        assert _cu.cuStreamCreate(ctypes.byref(h), 1 if non_blocking else 0) == 0
        self.ptr = h.value

    def __del__(self):
        _cu.cuStreamDestroy_v2(ctypes.c_void_p(self.ptr))
        destroyed.append(self.ptr)


class ExternalStream:
    def __init__(self, ptr):
        self.ptr = ptr


class _Null:
    ptr = 0


_current = _Null()


def get_current_stream():
    return _current


def set_current_stream(s):
    global _current
    _current = s if s is not None else _Null()


class UnownedMemory:
    def __init__(self, ptr, size, owner, device_id):
        self.ptr, self.size, self._owner, self.device_id = ptr, size, owner, device_id


class MemoryPointer:
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset


def set_allocator(f):
    global _allocator
    _allocator = f


@contextlib.contextmanager
def using_allocator(f):
    global _allocator
    old, _allocator = _allocator, f
    try:
        yield
    finally:
        _allocator = old
