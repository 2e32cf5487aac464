import ctypes
import os

current = None


class _Native:
    """torch._C._cuda_CUDAAllocator: the C++ CUDAPluggableAllocator."""

    def __init__(self, alloc, free):
        self.alloc, self.free, self.record_stream = alloc, free, None


if not os.environ.get("TORCH_STUB_NO_RECORD_STREAM"):
    def _set_record_stream_fn(self, func_ptr):
        # As Module.cpp's binding: a function pointer, an int
        assert isinstance(func_ptr, int)
        self.record_stream = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(func_ptr)

    _Native.set_record_stream_fn = _set_record_stream_fn


class CUDAPluggableAllocator:
    def __init__(self, path, alloc_fn_name, free_fn_name):
        lib = ctypes.CDLL(path)
        self._allocator = _Native(getattr(lib, alloc_fn_name), getattr(lib, free_fn_name))

    def allocator(self):
        return self._allocator


def change_current_allocator(a):
    global current
    current = a
