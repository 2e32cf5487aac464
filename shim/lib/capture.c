/*
 * capture.c - CUDA graph capture, as the pools must see it.
 *
 * Two rules (docs/design.md, "Fences"):
 *
 *   Before a stream begins capturing, a stand-in event is recorded on it,
 *   and on the legacy stream too when the stream is blocking (a per-thread
 *   default stream is): while the capture lasts no event can be recorded on
 *   the stream (the legacy stream is unusable), yet work queued before the
 *   capture still runs and may still read blocks freed before or during it.
 *   Plain-free fences wait for stand-ins (fences.c).
 *
 *   The shim makes its own "potentially unsafe" calls (fence event queries,
 *   host waits for events, streams and contexts, the refused allocation
 *   that sets the runtime's error, regions taken and given back) with the calling thread in
 *   CU_STREAM_CAPTURE_MODE_RELAXED whenever a capture may be under way. In
 *   the default global mode, another thread's global-mode capture makes the
 *   driver refuse them (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and invalidate
 *   that capture (cuThreadExchangeStreamCaptureMode's rules). The count of
 *   captures under way comes from the begin/end calls below.
 *
 *   Event queries are the frequent calls (an allocation may ask about a
 *   fence): capture_relax leaves the mode alone while the count is 0 and
 *   every begin is counted (two driver calls saved per query). Where begins
 *   can go unseen (loaded as a plug-in, or the driver door closed) the
 *   count says nothing, and every query is relaxed (e2e_plugin
 *   query-during-capture: a plug-in's query in global mode invalidated the
 *   program's capture). The query is made with the streams
 *   registry's lock held, from that read of the count to its answer (the
 *   read lock, or the write lock of the begin that records a stand-in).
 *   A begin is counted under the write lock, so no capture can begin in
 *   between. Were the count read without the lock, another thread could
 *   begin a global-mode capture after the 0 was read and before the query
 *   reached the driver, and the query would invalidate it (e2e_fences
 *   query-vs-begin). A pool's stand-in lock comes after the registry's
 *   (fences.c), as in before_begin, since the stand-in sweeps query too.
 *   Host waits, the refused allocation and regions are rare, and a wait may block
 *   for long under no lock a begin should wait for: they are always made in
 *   relaxed mode (capture_relax_always), whatever the count.
 *
 *   The same count saves the capture questions themselves (is this stream,
 *   is a blocking stream, capturing?) while it is 0 and every way to begin
 *   a capture is seen (capture_none): preloaded, with the driver door
 *   hooked, every begin passes here, the v1 cuStreamBeginCapture of old
 *   binaries included. A begin is counted before the real call and under
 *   the streams' write lock (before_begin), so that a seal or query holding
 *   the read lock, or a call the program orders after the begin, never
 *   finds 0 while the capture is under way; a begin that fails is taken
 *   back.
 *
 * Both doors have the calls: the driver's (reached by cudart through
 * cuGetProcAddress, and by programs through dlsym) do the work; the
 * runtime's do it only when the driver door is not hooked
 * (BFCSHIM_DRIVER_HOOKS=0), else cudart's own driver call would do it twice.
 */
#include "shim.h"

static atomic_int underway;

bool capture_underway(void)
{
    return atomic_load_explicit(&underway, memory_order_relaxed) > 0;
}

/* Does every capture begin pass the hooks below, so that the count is
 * every capture under way? Preloaded with the driver door hooked. */
static bool begins_counted(void) { return shim_driver_hooked() && streams_all_seen(); }

bool capture_none(void)
{
    return atomic_load_explicit(&underway, memory_order_acquire) == 0 && begins_counted();
}

relaxed_scope capture_relax(const real_driver *R)
{
    relaxed_scope rs = {false, CU_STREAM_CAPTURE_MODE_GLOBAL};
    if ((atomic_load_explicit(&underway, memory_order_relaxed) > 0 || !begins_counted()) &&
        R->ThreadExchangeStreamCaptureMode) {
        rs.old = CU_STREAM_CAPTURE_MODE_RELAXED;
        rs.changed = R->ThreadExchangeStreamCaptureMode(&rs.old) == CUDA_SUCCESS;
    }
    return rs;
}

relaxed_scope capture_relax_always(const real_driver *R)
{
    relaxed_scope rs = {false, CU_STREAM_CAPTURE_MODE_RELAXED};
    if (R->ThreadExchangeStreamCaptureMode)
        rs.changed = R->ThreadExchangeStreamCaptureMode(&rs.old) == CUDA_SUCCESS;
    return rs;
}

void capture_restore(const real_driver *R, relaxed_scope rs)
{
    if (rs.changed)
        R->ThreadExchangeStreamCaptureMode(&rs.old);
}

/* The stream a capture call names: stream 0 of a _ptsz call is the calling
 * thread's per-thread default stream. */
static CUstream named(CUstream s, int z)
{
    return s == NULL && z ? CU_STREAM_PER_THREAD : s;
}

/* Records the stand-ins for a stream about to stop taking events (it begins
 * capturing, or it is being destroyed). legacy_too: also one on the legacy
 * stream, which a blocking stream's capture makes unusable. */
void capture_stand_in(CUstream s, bool legacy_too)
{
    const real_driver *R = real_driver_get();
    if (!R || !shim_active())
        return;
    CUcontext ctx = NULL;
    if (s == CU_STREAM_PER_THREAD || s == NULL || s == CU_STREAM_LEGACY ||
        !R->StreamGetCtx || R->StreamGetCtx(s, &ctx) != CUDA_SUCCESS)
        R->CtxGetCurrent(&ctx);
    /* A green context's stream needs none (green.c), and making its context
     * current here would make it current to two threads. */
    if (green_converted(ctx))
        return;
    /* No pool in the stream's context: nothing has been freed there. */
    shim_pool *sp = ctx ? pool_for_context(ctx, false) : NULL;
    if (!sp)
        return;
    bool pushed = real_ctx_enter(R, ctx);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    /* A stream that already captures has had its stand-in (its work since
     * is a graph's, and an event on it would be a captured one). */
    if (R->StreamIsCapturing(s, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE)
        fences_stand_in(sp, s);
    if (legacy_too && R->StreamIsCapturing(CU_STREAM_LEGACY, &st) == CUDA_SUCCESS)
        fences_stand_in(sp, CU_STREAM_LEGACY);
    real_ctx_leave(R, pushed);
}

/* Is s a blocking stream (one the legacy stream synchronises with)? */
static bool blocking_stream(const real_driver *R, CUstream s)
{
    if (s == CU_STREAM_PER_THREAD)
        return true;
    unsigned flags = 0;
    return R->StreamGetFlags && R->StreamGetFlags(s, &flags) == CUDA_SUCCESS &&
           !(flags & CU_STREAM_NON_BLOCKING);
}

/* Every capture begins between before_begin and began, the streams' change
 * lock held (streams.c): no seal may ask whether s captures before the
 * begin and record its event on s after it (the event would be a captured
 * one, which never completes). */
static void before_begin(CUstream s)
{
    streams_change_begin();
    atomic_fetch_add_explicit(&underway, 1, memory_order_acq_rel); /* see the header */
    const real_driver *R = real_driver_get();
    if (R)
        capture_stand_in(s, blocking_stream(R, s));
}

static CUresult began(CUresult r, CUstream s)
{
    if (r != CUDA_SUCCESS)
        atomic_fetch_sub_explicit(&underway, 1, memory_order_acq_rel);
    streams_change_end();
    if (r == CUDA_SUCCESS)
        green_capture_changed(s, +1);
    return r;
}

/* A capture ends when EndCapture succeeds or reports it invalidated or
 * unjoined; other answers (not capturing, wrong thread) leave it on. */
static void ended(int r, CUstream s)
{
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED &&
        r != CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
        return;
    green_capture_changed(s, -1);
    int n = atomic_load_explicit(&underway, memory_order_relaxed);
    while (n > 0 && !atomic_compare_exchange_weak(&underway, &n, n - 1))
        ;
}

/* ---- driver door ------------------------------------------------------------------ */

static CUresult begin(int z, CUstream s, CUstreamCaptureMode mode)
{
    CUresult (*f)(CUstream, CUstreamCaptureMode) = REAL(StreamBeginCapture[z]);
    if (!f)
        return CUDA_ERROR_NOT_INITIALIZED;
    before_begin(named(s, z));
    return began(f(s, mode), named(s, z));
}

static CUresult begin_to_graph(int z, CUstream s, CUgraph g, const CUgraphNode *deps,
                               const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode)
{
    CUresult (*f)(CUstream, CUgraph, const CUgraphNode *, const CUgraphEdgeData *, size_t,
                  CUstreamCaptureMode) = REAL(StreamBeginCaptureToGraph[z]);
    if (!f)
        return CUDA_ERROR_NOT_INITIALIZED;
    before_begin(named(s, z));
    return began(f(s, g, deps, edges, n, mode), named(s, z));
}

static CUresult end(int z, CUstream s, CUgraph *g)
{
    CUresult (*f)(CUstream, CUgraph *) = REAL(StreamEndCapture[z]);
    if (!f)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = f(s, g);
    ended(r, named(s, z));
    return r;
}

SHIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
    return begin(0, s, mode);
}

/* The v1 begin (CUDA 10.0's, no mode: global), which cuda.h now maps to
 * _v2 but libcuda still exports for old binaries and hands out to
 * cuGetProcAddress for versions before 10.1 (names in shim.h). */
static CUresult begin_v1(int z, CUstream s)
{
    CUresult (*f)(CUstream) = REAL(StreamBeginCaptureV1[z]);
    if (!f)
        return CUDA_ERROR_NOT_INITIALIZED;
    before_begin(named(s, z));
    return began(f(s), named(s, z));
}

SHIM_EXPORT CUresult shim_cuStreamBeginCapture_v1(CUstream s) { return begin_v1(0, s); }
SHIM_EXPORT CUresult shim_cuStreamBeginCapture_v1_ptsz(CUstream s) { return begin_v1(1, s); }

SHIM_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode)
{
    return begin(1, s, mode);
}

SHIM_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                 const CUgraphEdgeData *edges, size_t n,
                                                 CUstreamCaptureMode mode)
{
    return begin_to_graph(0, s, g, deps, edges, n, mode);
}

SHIM_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g,
                                                      const CUgraphNode *deps,
                                                      const CUgraphEdgeData *edges, size_t n,
                                                      CUstreamCaptureMode mode)
{
    return begin_to_graph(1, s, g, deps, edges, n, mode);
}

SHIM_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { return end(0, s, g); }

SHIM_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) { return end(1, s, g); }

/* ---- runtime door ----------------------------------------------------------------- */

typedef cudaError_t (*rt_begin_fn)(cudaStream_t, enum cudaStreamCaptureMode);
typedef cudaError_t (*rt_begin_to_graph_fn)(cudaStream_t, cudaGraph_t, const cudaGraphNode_t *,
                                            const cudaGraphEdgeData *, size_t,
                                            enum cudaStreamCaptureMode);
typedef cudaError_t (*rt_end_fn)(cudaStream_t, cudaGraph_t *);

/* With the driver door hooked, cudart's own driver calls (above) do the
 * work; otherwise the runtime calls must. */
static bool runtime_does_it(void) { return !shim_driver_hooked(); }

/* The runtime's begin and end: stand-ins and counting only when the driver
 * door does not see cudart's own driver call. (The runtime's capture error
 * codes have the driver's numbers.) */
static cudaError_t rt_begin(rt_begin_fn f, cudaStream_t s, enum cudaStreamCaptureMode mode,
                            int z)
{
    if (!f)
        return cudaErrorInsufficientDriver;
    if (!runtime_does_it())
        return f(s, mode);
    before_begin(named((CUstream)s, z));
    return (cudaError_t)began((CUresult)f(s, mode), named((CUstream)s, z));
}

static cudaError_t rt_begin_to_graph(rt_begin_to_graph_fn f, cudaStream_t s, cudaGraph_t g,
                                     const cudaGraphNode_t *deps,
                                     const cudaGraphEdgeData *edges, size_t n,
                                     enum cudaStreamCaptureMode mode, int z)
{
    if (!f)
        return cudaErrorInsufficientDriver;
    if (!runtime_does_it())
        return f(s, g, deps, edges, n, mode);
    before_begin(named((CUstream)s, z));
    return (cudaError_t)began((CUresult)f(s, g, deps, edges, n, mode), named((CUstream)s, z));
}

static cudaError_t rt_end(rt_end_fn f, cudaStream_t s, cudaGraph_t *g, int z)
{
    if (!f)
        return cudaErrorInsufficientDriver;
    cudaError_t e = f(s, g);
    if (runtime_does_it())
        ended((int)e, named((CUstream)s, z));
    return e;
}

SHIM_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    REAL_RT(rt_begin_fn, f, "cudaStreamBeginCapture");
    return rt_begin(f, s, mode, 0);
}

SHIM_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s,
                                                    enum cudaStreamCaptureMode mode)
{
    REAL_RT(rt_begin_fn, f, "cudaStreamBeginCapture_ptsz");
    return rt_begin(f, s, mode, 1);
}

SHIM_EXPORT cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t s, cudaGraph_t g,
                                                      const cudaGraphNode_t *deps,
                                                      const cudaGraphEdgeData *edges, size_t n,
                                                      enum cudaStreamCaptureMode mode)
{
    REAL_RT(rt_begin_to_graph_fn, f, "cudaStreamBeginCaptureToGraph");
    return rt_begin_to_graph(f, s, g, deps, edges, n, mode, 0);
}

SHIM_EXPORT cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t s, cudaGraph_t g,
                                                           const cudaGraphNode_t *deps,
                                                           const cudaGraphEdgeData *edges,
                                                           size_t n,
                                                           enum cudaStreamCaptureMode mode)
{
    REAL_RT(rt_begin_to_graph_fn, f, "cudaStreamBeginCaptureToGraph_ptsz");
    return rt_begin_to_graph(f, s, g, deps, edges, n, mode, 1);
}

SHIM_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    REAL_RT(rt_end_fn, f, "cudaStreamEndCapture");
    return rt_end(f, s, g, 0);
}

SHIM_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t *g)
{
    REAL_RT(rt_end_fn, f, "cudaStreamEndCapture_ptsz");
    return rt_end(f, s, g, 1);
}
