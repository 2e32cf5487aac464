#!/usr/bin/env python3
"""driver_facts.py - what the real driver answers where the shim (and the
fake driver, tests/fake_cuda) assumes an answer; through libcuda.so.1 with
ctypes, so it needs no toolkit. Run natively for the driver's own answers
and under the shim (LD_PRELOAD) for the shim's.

  stream-ids      cuStreamGetId of the legacy and per-thread streams and of
                  created ones; whether a new stream takes a destroyed one's
                  handle value, and what cuStreamGetId answers for a
                  destroyed handle (in a child process: it may crash)
  ctx-ids         cuCtxGetId of the primary and a created context, and of a
                  created context after cuCtxDestroy (in a child process):
                  the plug-in asks it before each call (docs/limitations.md)
  relaxed-sync    cuCtxSynchronize while a stream captures in relaxed mode
                  (and in global mode): its answer, and whether the capture
                  is still valid after it
  free-async      cuMemFreeAsync stream ordering: a block freed on a stream
                  whose queue is still busy (memsets), then an allocation of
                  the same size on another stream and one on the same
                  stream: which addresses come back, and whether the other
                  stream's write was overwritten by the first stream's late
                  work (early reuse)
  free-sync       cuMemFree of a cuMemAlloc block (what cudaFree calls)
                  while a non-blocking and then a blocking stream is busy
                  with memsets: cuStreamQuery of the busy stream right
                  after the free (CUDA_ERROR_NOT_READY: the free did not
                  wait for it) and the free's time; cuda.h says only that
                  it "may perform implicit synchronization" (the fake's
                  FAKECUDA_FREE_NO_SYNC)
  legacy-destroyed  whether an action on the legacy stream waits for work
                  queued on a blocking stream destroyed before it: memsets
                  and an event eb on blocking stream b, cuStreamDestroy(b),
                  the action, then cuEventQuery(eb) (NOT_READY: it did not
                  wait); the action an event record (then
                  cuEventSynchronize of it) or a cuStreamWaitEvent on a
                  complete event (then cuStreamSynchronize of the legacy
                  stream); each beside the same with b alive (documented to
                  wait), and cuStreamSynchronize of the legacy stream alone
                  (no action) with b alive; whether that wait on a
                  complete event is an action at all (with b alive) is
                  wait_on_complete_event_is_action. Undocumented (the fake's
                  FAKECUDA_LEGACY_SKIPS_DESTROYED); the shim does not rely
                  on either answer (docs/design.md, "The barrier")

Each of the last two answers "waits", "does not wait" or "inconclusive"
(the queue drained before the question was put, or the control with b
alive did not wait), beside its raw codes and times.

Prints one `RESULT {json}` line (gpucommon.emit), every answer a CUresult
number (0 = CUDA_SUCCESS) or a value; a call the library lacks reads
"missing"."""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpucommon  # noqa: E402

P = ctypes.c_void_p
U64 = ctypes.c_uint64
cu = None


def fn(name, *argtypes):
    f = getattr(cu, name, None)
    if f is None:
        return None
    f.argtypes = list(argtypes)
    f.restype = ctypes.c_int
    return f


def call(name, *args, types=None):
    """The CUresult of cu<name>(*args), or "missing"."""
    f = fn(name, *(types or []))
    return "missing" if f is None else f(*args)


def setup():
    global cu
    cu = ctypes.CDLL("libcuda.so.1")
    assert call("cuInit", 0, types=[ctypes.c_uint]) == 0, "cuInit failed"
    dev = ctypes.c_int()
    call("cuDeviceGet", ctypes.byref(dev), 0, types=[P, ctypes.c_int])
    ctx = P()
    call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev, types=[P, ctypes.c_int])
    call("cuCtxSetCurrent", ctx, types=[P])
    return dev, ctx


def stream_create():
    s = P()
    r = call("cuStreamCreate", ctypes.byref(s), 1, types=[P, ctypes.c_uint])  # non-blocking
    return s if r == 0 else None


def stream_id(s):
    v = U64()
    r = call("cuStreamGetId", s, ctypes.byref(v), types=[P, P])
    return v.value if r == 0 else f"error {r}"


def ctx_id(c):
    v = U64()
    r = call("cuCtxGetId", c, ctypes.byref(v), types=[P, P])
    return v.value if r == 0 else f"error {r}"


def ctx_create(dev):
    c = P()
    r = call("cuCtxCreate_v2", ctypes.byref(c), 0, dev, types=[P, ctypes.c_uint, ctypes.c_int])
    if r == "missing":  # CUDA 13: cuCtxCreate_v4(ctx, params, flags, dev)
        r = call("cuCtxCreate_v4", ctypes.byref(c), None, 0, dev,
                 types=[P, P, ctypes.c_uint, ctypes.c_int])
    return (c, r)


def child(what):
    """A probe that may crash the process, in a child; its answer or how it died."""
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", what],
                           capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return {"outcome": "timed out (30 s)"}
    if p.returncode < 0:
        return {"outcome": f"killed by signal {-p.returncode}", "stderr": p.stderr[-300:]}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"outcome": f"exit {p.returncode}", "stderr": p.stderr[-300:]}


def child_main(what):
    dev, primary = setup()
    out = {}
    if what == "stream-destroyed":
        s = stream_create()
        out["id_alive"] = stream_id(s)
        out["destroy"] = call("cuStreamDestroy_v2", s, types=[P])
        out["id_after_destroy"] = stream_id(s)
    elif what == "ctx-destroyed":
        c, r = ctx_create(dev)
        out["create"] = r
        if r == 0:
            out["id_alive"] = ctx_id(c)
            out["destroy"] = call("cuCtxDestroy_v2", c, types=[P])
            out["id_after_destroy"] = ctx_id(c)
            c2, r2 = ctx_create(dev)
            out["next_create_same_handle"] = r2 == 0 and c2.value == c.value
            out["id_after_destroy_and_new"] = ctx_id(c)
            if r2 == 0:
                out["id_new"] = ctx_id(c2)
    print(json.dumps(out))


def stream_ids():
    out = {"legacy_null": stream_id(None), "legacy_0x1": stream_id(P(1)),
           "per_thread_0x2": stream_id(P(2))}
    a, b = stream_create(), stream_create()
    out["created"] = [stream_id(a), stream_id(b)]
    handle = a.value
    call("cuStreamDestroy_v2", a, types=[P])
    c = stream_create()
    out["new_stream_takes_destroyed_handle"] = c.value == handle
    out["new_stream_id"] = stream_id(c)
    for s in (b, c):
        call("cuStreamDestroy_v2", s, types=[P])
    out["destroyed_handle"] = child("stream-destroyed")
    return out


def ctx_ids(dev, primary):
    out = {"primary": ctx_id(primary), "current_null": ctx_id(None)}
    out["destroyed"] = child("ctx-destroyed")
    call("cuCtxSetCurrent", primary, types=[P])
    return out


def relaxed_sync():
    out = {}
    for mode, name in ((2, "relaxed"), (0, "global"), (1, "thread_local")):
        s = stream_create()
        r = {"begin": call("cuStreamBeginCapture_v2", s, mode, types=[P, ctypes.c_int])}
        r["ctx_synchronize"] = call("cuCtxSynchronize")
        st = ctypes.c_int(-1)
        call("cuStreamIsCapturing", s, ctypes.byref(st), types=[P, P])
        r["capture_status_after"] = {0: "none", 1: "active", 2: "invalidated"}.get(st.value,
                                                                                 st.value)
        g = P()
        r["end_capture"] = call("cuStreamEndCapture", s, ctypes.byref(g), types=[P, P])
        if g.value:
            call("cuGraphDestroy", g, types=[P])
        call("cuStreamDestroy_v2", s, types=[P])
        out[name] = r
    return out


def free_async(size, rounds):
    s1, s2 = stream_create(), stream_create()
    a, b, c = U64(), U64(), U64()
    st = [P, ctypes.c_size_t, P]
    out = {"size": size, "busy_memsets": rounds}
    r = call("cuMemAllocAsync", ctypes.byref(a), size, s1, types=st)
    if r != 0:
        return {"alloc": r}
    ms = [U64, ctypes.c_uint, ctypes.c_size_t, P]
    for _ in range(rounds):
        call("cuMemsetD32Async", a, 0x11111111, size // 4, s1, types=ms)
    out["free"] = call("cuMemFreeAsync", a, s1, types=[U64, P])
    out["alloc_other_stream"] = call("cuMemAllocAsync", ctypes.byref(b), size, s2, types=st)
    out["first_stream_busy_then"] = call("cuStreamQuery", s1, types=[P]) == 600
    out["other_stream_got_same_address"] = b.value == a.value
    call("cuMemsetD32Async", b, 0x22222222, size // 4, s2, types=ms)
    out["alloc_same_stream"] = call("cuMemAllocAsync", ctypes.byref(c), size, s1, types=st)
    out["same_stream_got_same_address"] = c.value == a.value
    t0 = time.perf_counter()
    call("cuStreamSynchronize", s1, types=[P])
    call("cuStreamSynchronize", s2, types=[P])
    out["sync_ms"] = 1e3 * (time.perf_counter() - t0)
    words = (ctypes.c_uint32 * 2)()
    last = (ctypes.c_uint32 * 1)()
    hd = [P, U64, ctypes.c_size_t]
    call("cuMemcpyDtoH_v2", ctypes.cast(words, P), b, 8, types=hd)
    call("cuMemcpyDtoH_v2", ctypes.cast(last, P), U64(b.value + size - 4), 4, types=hd)
    seen = {hex(words[0]), hex(last[0])}
    out["other_stream_block_reads"] = sorted(seen)
    # the first stream's pattern there: its late memsets wrote into the
    # block the other stream was given (neither pattern: not measured)
    out["early_reuse"] = (True if hex(0x11111111) in seen else
                          False if seen == {hex(0x22222222)} else "unknown")
    for p, s in ((b, s2), (c, s1)):
        call("cuMemFreeAsync", p, s, types=[U64, P])
    call("cuCtxSynchronize")
    return out


NOT_READY = 600  # CUDA_ERROR_NOT_READY
LEGACY = P(1)    # CU_STREAM_LEGACY


def busy_queue(s, ptr, size, rounds):
    """Queues `rounds` memsets of `size` bytes at ptr on s; the last code."""
    ms = [U64, ctypes.c_uint, ctypes.c_size_t, P]
    r = 0
    for _ in range(rounds):
        r = call("cuMemsetD32Async", ptr, 0x33333333, size // 4, s, types=ms) or r
    return r


def free_sync(size, rounds):
    """cuMemFree of an unrelated cuMemAlloc block while a stream is busy."""
    st = [P, ctypes.c_size_t]
    busy = U64()
    r = call("cuMemAlloc_v2", ctypes.byref(busy), size, types=st)
    if r != 0:
        return {"alloc": r}
    out = {"size": size, "busy_memsets": rounds}
    for name, flags in (("non_blocking", 1), ("blocking", 0)):
        s = P()
        o = {"create": call("cuStreamCreate", ctypes.byref(s), flags, types=[P, ctypes.c_uint])}
        other = U64()
        o["alloc"] = call("cuMemAlloc_v2", ctypes.byref(other), 2 << 20, types=st)
        if o["create"] != 0 or o["alloc"] != 0:
            out[name] = o
            continue
        o["memset"] = busy_queue(s, busy, size, rounds)
        o["query_before"] = call("cuStreamQuery", s, types=[P])
        t0 = time.perf_counter()
        o["free"] = call("cuMemFree_v2", other, types=[U64])
        o["free_ms"] = 1e3 * (time.perf_counter() - t0)
        o["query_after"] = call("cuStreamQuery", s, types=[P])
        t0 = time.perf_counter()
        o["sync"] = call("cuStreamSynchronize", s, types=[P])
        o["drain_ms"] = 1e3 * (time.perf_counter() - t0)  # what was left after the free
        o["answer"] = ("inconclusive" if o["query_before"] != NOT_READY or o["free"] != 0 else
                       "does not wait" if o["query_after"] == NOT_READY else
                       "waits" if o["query_after"] == 0 else "inconclusive")
        call("cuStreamDestroy_v2", s, types=[P])
        out[name] = o
    call("cuMemFree_v2", busy, types=[U64])
    answers = {out[k].get("answer") for k in ("non_blocking", "blocking")}
    out["answer"] = answers.pop() if len(answers) == 1 else "differs by stream"
    return out


def legacy_case(busy, size, rounds, action, destroy, done):
    """Blocking stream b busy, event eb after its memsets, b destroyed or
    not, then `action` on the legacy stream and the host's wait for it:
    whether eb was complete then."""
    o = {}
    b, eb, el = P(), P(), P()
    o["create"] = call("cuStreamCreate", ctypes.byref(b), 0, types=[P, ctypes.c_uint])
    ev = [P, ctypes.c_uint]
    call("cuEventCreate", ctypes.byref(eb), 2, types=ev)  # CU_EVENT_DISABLE_TIMING
    call("cuEventCreate", ctypes.byref(el), 2, types=ev)
    o["memset"] = busy_queue(b, busy, size, rounds)
    o["record_b"] = call("cuEventRecord", eb, b, types=[P, P])
    if destroy:
        o["destroy"] = call("cuStreamDestroy_v2", b, types=[P])
    o["query_before"] = call("cuEventQuery", eb, types=[P])
    t0 = time.perf_counter()
    if action == "record":
        o["action"] = call("cuEventRecord", el, LEGACY, types=[P, P])
        o["host_wait"] = call("cuEventSynchronize", el, types=[P])
    elif action == "wait":
        o["action"] = call("cuStreamWaitEvent", LEGACY, done, 0, types=[P, P, ctypes.c_uint])
        o["host_wait"] = call("cuStreamSynchronize", LEGACY, types=[P])
    else:  # no action: the host's wait alone
        o["host_wait"] = call("cuStreamSynchronize", LEGACY, types=[P])
    o["host_wait_ms"] = 1e3 * (time.perf_counter() - t0)
    o["query_after"] = call("cuEventQuery", eb, types=[P])
    o["waits"] = (None if o["query_before"] != NOT_READY or o["host_wait"] != 0 else
                  o["query_after"] == 0 if o["query_after"] in (0, NOT_READY) else None)
    call("cuEventSynchronize", eb, types=[P])
    if not destroy:
        call("cuStreamDestroy_v2", b, types=[P])
    for e in (eb, el):
        call("cuEventDestroy_v2", e, types=[P])
    return o


def legacy_destroyed(size, rounds):
    """Does an action on the legacy stream wait for a destroyed blocking
    stream's queued work? Each action against the same with b alive."""
    busy = U64()
    r = call("cuMemAlloc_v2", ctypes.byref(busy), size, types=[P, ctypes.c_size_t])
    if r != 0:
        return {"alloc": r}
    idle, done = P(), P()
    call("cuStreamCreate", ctypes.byref(idle), 1, types=[P, ctypes.c_uint])
    call("cuEventCreate", ctypes.byref(done), 2, types=[P, ctypes.c_uint])
    call("cuEventRecord", done, idle, types=[P, P])
    call("cuEventSynchronize", done, types=[P])  # complete before every wait on it
    out = {"size": size, "busy_memsets": rounds}
    call("cuCtxSynchronize")
    alone = legacy_case(busy, size, rounds, None, False, done)
    out["sync_alone_alive"] = alone
    for action in ("record", "wait"):
        v = {}
        for state, destroy in (("alive", False), ("destroyed", True)):
            call("cuCtxSynchronize")
            v[state] = legacy_case(busy, size, rounds, action, destroy, done)
        w = v["destroyed"]["waits"]
        # the control must wait (documented), and for the wait variant the
        # host's stream synchronisation alone must not, or it answers instead
        sound = v["alive"]["waits"] is True and (action != "wait" or alone["waits"] is False)
        v["answer"] = ("inconclusive" if not sound or w is None else
                       "waits" if w else "does not wait")
        out[action] = v
    # docs/benchmarks.md leaves owed whether a cuStreamWaitEvent on a
    # complete event is still a legacy-stream action: it is when the live
    # control of the wait variant waits and the synchronisation alone not
    live, syn = out["wait"]["alive"]["waits"], alone["waits"]
    out["wait_on_complete_event_is_action"] = (None if live is None or syn is not False else
                                               live)
    answers = {out[a]["answer"] for a in ("record", "wait")} - {"inconclusive"}
    out["answer"] = (answers.pop() if len(answers) == 1 else
                     "inconclusive" if not answers else "differs by action")
    call("cuCtxSynchronize")
    call("cuEventDestroy_v2", done, types=[P])
    call("cuStreamDestroy_v2", idle, types=[P])
    call("cuMemFree_v2", busy, types=[U64])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", default="native")
    ap.add_argument("--child")
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--busy", type=int, default=200, help="memsets queued before the free")
    args = ap.parse_args()
    if args.child:
        return child_main(args.child)
    res = {"workload": "driver-facts", "arm": args.arm}
    try:
        dev, primary = setup()
    except (OSError, AssertionError) as e:
        res["error"] = f"{type(e).__name__}: {e}"
        gpucommon.emit_and_exit(res, True)
    size = int(args.size.lower().rstrip("ib").rstrip("m")) << 20 if args.size.lower().endswith(
        ("mib", "mb", "m")) else int(args.size)
    for name, probe in (("stream_ids", stream_ids), ("ctx_ids", lambda: ctx_ids(dev, primary)),
                        ("relaxed_sync", relaxed_sync),
                        ("free_async", lambda: free_async(size, args.busy)),
                        ("free_sync", lambda: free_sync(size, args.busy)),
                        ("legacy_destroyed", lambda: legacy_destroyed(size, args.busy))):
        try:
            res[name] = probe()
        except Exception as e:  # one probe's failure must not lose the others
            res[name] = {"error": f"{type(e).__name__}: {e}"}
        print(name, json.dumps(res[name]), flush=True)
    wrong = isinstance(res.get("free_async"), dict) and res["free_async"].get("early_reuse") is True
    gpucommon.emit_and_exit(res, wrong and args.arm != "native")


if __name__ == "__main__":
    main()
