"""counters.py - what the framework clients (jax_client.py,
tensorflow_client.py) read besides the framework's own figures: the fake
driver's counters and, when the shim is preloaded, its statistics. Both are
read in the client's own process, at the moment the client chooses."""
import ctypes
import json
import re


def fake_stats_reader(header):
    """A function returning the fake driver's counters as a dict, the
    fields read from fake_cuda.h's fakecuda_stats (all uint64_t), so that
    this file needs no copy of the layout."""
    text = open(header).read()
    body = text[text.index("typedef struct fakecuda_stats {"):text.index("} fakecuda_stats;")]
    fields = []
    for name, count in re.findall(r"uint64_t\s+(\w+)(?:\[(\d+)\])?;", body):
        fields.append((name, ctypes.c_uint64 * int(count) if count else ctypes.c_uint64))
    stats_type = type("fakecuda_stats", (ctypes.Structure,), {"_fields_": fields})
    cu = ctypes.CDLL("libcuda.so.1")
    # fakecuda_api: launch, complete, complete_all, pending, stats, ...
    cu.fakecuda_api_table.restype = ctypes.POINTER(ctypes.c_void_p * 5)
    table = cu.fakecuda_api_table().contents
    stats_fn = ctypes.CFUNCTYPE(None, ctypes.POINTER(stats_type))(table[4])

    def read():
        st = stats_type()
        stats_fn(ctypes.byref(st))
        return {name: list(getattr(st, name)) if isinstance(getattr(st, name), ctypes.Array)
                else getattr(st, name) for name, _ in fields}
    return read


def shim_stats():
    """The preloaded shim's statistics, or None without it."""
    try:
        fn = ctypes.CDLL(None).bfcshim_stats_json
    except AttributeError:
        return None
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    need = fn(None, 0)
    buf = ctypes.create_string_buffer(need + 1)
    fn(buf, need + 1)
    return json.loads(buf.value.decode())
