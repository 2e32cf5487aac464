"""gpucommon.py - what every GPU workload in scripts/gpu/ shares.

- NvmlPeak: whole-device used memory sampled every millisecond by a thread,
  through libnvidia-ml.so.1 with ctypes (no Python package needed). The peak
  is reported above the device's use when the sampler started, which the
  workloads do before their framework touches the GPU.
- shim_stats(): the shim's statistics, read in this process through its
  exported bfcshim_write_stats, or the bfcshim module when a plug-in loaded
  the library (None when neither is there).
- emit(): one line `RESULT {json}` on stdout that scripts/gpu-proof.sh
  collects, so every workload reports in the same shape.
"""
import ctypes
import hashlib
import json
import os
import sys
import tempfile
import threading
import time


class _MemInfo(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class NvmlPeak:
    """Samples device `index`'s used memory until stop(); peak_bytes is the
    largest reading minus the first one (the device before this job)."""

    def __init__(self, index=0, period_s=0.001):
        self.available = False
        self.baseline = self.peak = 0
        self._stop = threading.Event()
        try:
            self._lib = ctypes.CDLL("libnvidia-ml.so.1")
            if self._lib.nvmlInit_v2() != 0:
                return
            self._dev = ctypes.c_void_p()
            if self._lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self._dev)) != 0:
                return
        except OSError:
            return
        self.available = True
        self.baseline = self.peak = self._used()
        self._period = period_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _used(self):
        info = _MemInfo()
        if self._lib.nvmlDeviceGetMemoryInfo(self._dev, ctypes.byref(info)) != 0:
            return 0
        return info.used

    def _run(self):
        while not self._stop.is_set():
            u = self._used()
            if u > self.peak:
                self.peak = u
            time.sleep(self._period)

    def stop(self):
        if not self.available:
            return None
        self._stop.set()
        self._thread.join()
        u = self._used()
        if u > self.peak:
            self.peak = u
        return self.peak - self.baseline


def shim_stats():
    """The shim's stats document, or None when libbfcshim.so is not loaded.
    A plug-in (bfcshim.torch, .cupy, .numba) holds the library privately
    (RTLD_LOCAL): then the bfcshim module answers."""
    if "bfcshim" in sys.modules:
        try:
            return sys.modules["bfcshim"].stats()
        except Exception as e:  # the module is there but cannot reach a library
            print("bfcshim.stats() failed:", e, file=sys.stderr)
    try:
        write = ctypes.CDLL(None).bfcshim_write_stats
    except AttributeError:
        return None
    write.argtypes = [ctypes.c_char_p]
    write.restype = ctypes.c_int  # 0 on success
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        if write(path.encode()) != 0:
            return None
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def shim_totals(doc):
    """The numbers the reports compare, summed over the shim's pools."""
    if not doc:
        return None
    keys = ("num_allocs", "num_frees", "num_ooms", "peak_bytes_in_use", "bytes_in_use",
            "peak_pool_bytes", "num_region_allocs", "num_fence_waits", "passthrough_allocs",
            "num_map_calls", "num_unmap_calls", "num_mapped_refits", "num_growth_moves",
            "released_bytes_total",
            "moved_bytes_total", "num_pressure_maps", "pressure_map_us_total", "pool_bytes",
            # the program's own cuMemCreate memory, lent the pools' limits
            "bytes_lent", "peak_bytes_lent", "vmm_door_pooled_creates", "vmm_door_refused")
    out = {k: sum(p.get(k, 0) for p in doc.get("pools", [])) for k in keys}
    # a growing pool's headroom at the end (thousandths of its need): the
    # largest of the pools', not a sum
    out["growth_headroom"] = max((p.get("growth_headroom", 0) for p in doc.get("pools", [])),
                                 default=0)
    # what the program made itself with cuMemCreate around the pools
    # (BFCSHIM_VMM_DOOR=count, or no pool could lend): every device's, from
    # the top
    for k in ("passthrough_vmm_bytes", "passthrough_vmm_peak_bytes", "passthrough_vmm_creates"):
        out[k] = doc.get(k)
    # how often the doors asked the driver which context serves an
    # allocation, and (BFCSHIM_CONTEXT_CACHE=check) how often a remembered
    # answer was wrong: anything but 0 there is a bug to report
    for k in ("context_lookups", "context_cache_wrong"):
        out[k] = doc.get(k)
    # the slowest pool's start-up (its limit taken up front), not a sum
    out["prealloc_us"] = max((p.get("prealloc_us", 0) for p in doc.get("pools", [])), default=0)
    out["pools"] = len(doc.get("pools", []))
    out["allocator"] = doc.get("allocator")
    return out


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    if not n:
        return None
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def step_ms(times, what="step"):
    """Median, fastest and slowest of `times` (seconds), in milliseconds."""
    return {f"{what}_ms_median": 1e3 * median(times),
            f"{what}_ms_min": 1e3 * min(times),
            f"{what}_ms_max": 1e3 * max(times)}


def float_digest(values):
    """A short digest of floats that two runs share only when every value is
    bit-identical (each is written exactly, as hex)."""
    return hashlib.sha1(",".join(float(v).hex() for v in values).encode()).hexdigest()[:16]


def emit(result):
    """Prints the result line that gpu-proof.sh collects."""
    result.setdefault("shim_loaded", shim_stats() is not None)
    print("RESULT " + json.dumps(result, sort_keys=True), flush=True)


def emit_and_exit(result, wrong):
    """Prints the result line, then exits 1 when the job computed anything
    wrong (the line is written either way, for the tables)."""
    emit(result)
    if wrong:
        sys.exit(1)


def fail(msg):
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)
