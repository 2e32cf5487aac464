"""cupy.cuda.memory's out-of-memory error, as CuPy defines it."""


class OutOfMemoryError(MemoryError):
    def __init__(self, size, total, limit=0):
        self._size, self._total, self._limit = size, total, limit
        msg = f"Out of memory allocating {size:,} bytes"
        if limit:
            msg += f" (allocated so far: {total:,} bytes, limit set to: {limit:,} bytes)."
        elif total != -1:
            msg += f" (allocated so far: {total:,} bytes)."
        super().__init__(msg)
