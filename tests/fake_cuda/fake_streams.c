/*
 * fake_streams.c - streams, captures and events as entry points: creation and
 * destruction, ids and flags, synchronisation and queries, capture begin,
 * end and info (graphs are handles without nodes), cuStreamWaitEvent (which
 * forks a stream into a capture), events and host functions. The queues and
 * their completion are fake_driver.c's.
 */
#include "fake_internal.h"

/* cuStreamCreate: "Valid values for Flags are: CU_STREAM_DEFAULT ...
 * CU_STREAM_NON_BLOCKING" (cuStreamCreateWithPriority: "See cuStreamCreate
 * for a list of valid flags"); any other bit is refused with
 * CUDA_ERROR_INVALID_VALUE, in both return lists, rather than kept and
 * handed back by cuStreamGetFlags as if the driver knew it. */
static CUresult create_stream(CUstream *ph, unsigned flags)
{
    ENTER_API();
    fctx *c = current_ctx();
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    CUresult usable = ctx_usable(c);
    if (usable != CUDA_SUCCESS)
        LEAVE(usable);
    fstream *s = new_stream(c, flags, false);
    CUstream h = s ? stream_handle(s) : NULL;
    if (!h)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    *ph = h;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamCreate(CUstream *ph, unsigned int flags)
{
    CALLED();
    return create_stream(ph, flags);
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int priority)
{
    CALLED();
    (void)priority;
    return create_stream(ph, flags);
}

static CUresult stream_destroy(CUstream h)
{
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || s->legacy || s->per_thread)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    /* Returns at once: the queued work goes on and completes when the test
     * (or anything that waits for it) completes it, as on a GPU. */
    s->destroyed = true;
    stop_capturing(s);
    if (G.reuse_stream_handles) {
        stream_cell *cell = (stream_cell *)h;
        cell->next_free = G.free_cells;
        G.free_cells = cell;
    }
    LEAVE(CUDA_SUCCESS);
}

static CUresult stream_destroy_then_work(CUstream h)
{
    CUresult r = stream_destroy(h);
    test_hook_run(&after_stream_destroy);
    return r;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream h)
{
    CALLED();
    return stream_destroy_then_work(h);
}

/* The v1 entry point (the top of this file). cuda.h documents only the
 * _v2's rules; whether the old one waited for the stream's work is not
 * said any more, and the fake takes the reading harder on a client that
 * keeps books of streams: the same, returning at once while the work goes
 * on. */
EXPORT CUresult cuStreamDestroy(CUstream h)
{
    CALLED();
    return stream_destroy_then_work(h);
}

/* cuda.h: the Id "is unique for the life of the program"; the special
 * handles (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) have one too. A
 * destroyed stream's handle is "undefined behavior" there; the fake answers
 * CUDA_ERROR_INVALID_HANDLE, a listed code, and counts the stale use. */
static CUresult stream_get_id(CUstream h, unsigned long long *id)
{
    ENTER_API();
    if (!id)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    fstream *s = stream_of(h);
    if (!s)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    if (!s->id)
        s->id = ++G.next_stream_id;
    *id = s->id;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamGetId(CUstream h, unsigned long long *id)
{
    CALLED();
    return stream_get_id(h, id);
}

EXPORT CUresult cuStreamGetId_ptsz(CUstream h, unsigned long long *id)
{
    CALLED();
    return stream_get_id(ptsz_stream(h), id);
}

EXPORT CUresult cuStreamGetFlags(CUstream h, unsigned int *flags)
{
    CALLED();
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || !flags)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    *flags = s->flags;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamGetCtx(CUstream h, CUcontext *pctx)
{
    CALLED();
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || !pctx)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    *pctx = (CUcontext)s->ctx;
    LEAVE(CUDA_SUCCESS);
}

static CUresult stream_sync(CUstream h)
{
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    CUresult r = status_asked(s);
    if (r == CUDA_SUCCESS)
        r = unsafe_call();
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    G.st.stream_synchronize_calls++;
    pools_release_at_sync();
    complete_and_unlock(s);
    release_after_sync();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream h) { CALLED(); return stream_sync(h); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream h)
{
    CALLED();
    return stream_sync(ptsz_stream(h));
}

static CUresult stream_query(CUstream h)
{
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    CUresult r = status_asked(s);
    if (r == CUDA_SUCCESS)
        r = unsafe_call();
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    LEAVE(stream_done_to(s, s->submitted) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
}

EXPORT CUresult cuStreamQuery(CUstream h) { CALLED(); return stream_query(h); }
EXPORT CUresult cuStreamQuery_ptsz(CUstream h)
{
    CALLED();
    return stream_query(ptsz_stream(h));
}

/* cuStreamGetPriority: the priority of a stream made by cuStreamCreate,
 * cuStreamCreateWithPriority or cuGreenCtxStreamCreate, "the clamped
 * priority" where it was made with one outside cuCtxGetStreamPriorityRange.
 * The fake's range is [0, 0] (fake_contexts.c), so every stream's clamped
 * priority is 0; the special handles answer the default priority, 0 too.
 * A bad stream is CUDA_ERROR_INVALID_HANDLE, no place for the answer
 * CUDA_ERROR_INVALID_VALUE (both listed). */
static CUresult stream_get_priority(CUstream h, int *priority)
{
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    if (!priority)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    *priority = 0;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamGetPriority(CUstream h, int *priority)
{
    CALLED();
    return stream_get_priority(h, priority);
}
EXPORT CUresult cuStreamGetPriority_ptsz(CUstream h, int *priority)
{
    CALLED();
    return stream_get_priority(ptsz_stream(h), priority);
}

static CUresult is_capturing(CUstream h, CUstreamCaptureStatus *status)
{
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || !status)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* "if this is called on CU_STREAM_LEGACY while a blocking stream in
     * the same context is capturing, it will return
     * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT" (not invalidating it) */
    if (s->legacy && blocking_capture_in(s->ctx))
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    *status = !s->capturing  ? CU_STREAM_CAPTURE_STATUS_NONE
              : s->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                               : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *st)
{
    CALLED();
    CUresult r = is_capturing(h, st);
    test_hook_run(&after_is_capturing); /* answered, outside the driver's lock */
    return r;
}
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus *st)
{
    CALLED();
    return is_capturing(ptsz_stream(h), st);
}

/* Lock held: a new graph. */
static fgraph *graph_new(void)
{
    fgraph *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    *g = (fgraph){.magic = GRAPH_MAGIC, .next = G.graphs};
    G.graphs = g;
    return g;
}

/* Lock held: the live graph a handle names, or NULL (stale handles
 * counted). */
static fgraph *graph_of(CUgraph h)
{
    fgraph *g = (fgraph *)h;
    if (!g || g->magic != GRAPH_MAGIC)
        return NULL;
    if (g->destroyed) {
        count_stale_use_of("graph", NULL, "destroyed");
        return NULL;
    }
    return g;
}

EXPORT CUresult cuGraphCreate(CUgraph *out, unsigned int flags)
{
    CALLED();
    ENTER_API();
    if (!out || flags != 0) /* "flags - Graph creation flags, must be 0" */
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    fgraph *g = graph_new();
    if (!g)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    *out = (CUgraph)g;
    LEAVE(CUDA_SUCCESS);
}

/* cuda.h lists CUDA_ERROR_INVALID_VALUE for a graph it cannot destroy. */
EXPORT CUresult cuGraphDestroy(CUgraph h)
{
    CALLED();
    ENTER_API();
    fgraph *g = graph_of(h);
    if (!g)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    g->destroyed = true;
    LEAVE(CUDA_SUCCESS);
}

/* cuStreamGetCaptureInfo, all three versions (CUDA 10.1's status and id;
 * 11.3's graph and dependencies; 12.3's edge data). cuda.h: the status is
 * required; the rest is "valid data ... only if the call returns
 * CUDA_SUCCESS [and] the returned capture status is
 * CU_STREAM_CAPTURE_STATUS_ACTIVE", so for a stream that does not capture,
 * or whose capture was invalidated, the fake writes nothing else (a caller
 * that reads an id then reads what it left there). The id is "an id for
 * the capture sequence, which is unique over the lifetime of the process":
 * the fake's sequence number, the same on the origin and every stream that
 * joined it (one sequence). The graph is the one being captured into: the
 * program's (cuStreamBeginCaptureToGraph), else one made now and handed
 * over at the end. The fake's graphs have no nodes, so the dependency set
 * is empty (and no edge data: never CUDA_ERROR_LOSSY_QUERY). On the legacy
 * stream while a blocking stream captures: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
 * as cuStreamIsCapturing (neither invalidates). */
static CUresult capture_info(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id,
                             CUgraph *graph, const CUgraphNode **deps,
                             const CUgraphEdgeData **edges, size_t *ndeps)
{
    ENTER_API();
    fstream *s = stream_of(h);
    /* "If edgeData_out is non-NULL then dependencies_out must be as well" */
    if (!s || !st || (edges && !deps))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (s->legacy && blocking_capture_in(s->ctx))
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    *st = !s->capturing  ? CU_STREAM_CAPTURE_STATUS_NONE
          : s->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                           : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (*st != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        LEAVE(CUDA_SUCCESS);
    if (id)
        *id = s->capture_seq;
    fstream *origin = s->capture_origin;
    if (graph && !origin->capture_graph) {
        origin->capture_graph = graph_new();
        if (!origin->capture_graph)
            LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        origin->capture_graph_own = true;
    }
    if (graph)
        *graph = (CUgraph)origin->capture_graph;
    if (deps)
        *deps = NULL;
    if (edges)
        *edges = NULL;
    if (ndeps)
        *ndeps = 0;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamGetCaptureInfo(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id)
{
    CALLED();
    return capture_info(h, st, id, NULL, NULL, NULL, NULL);
}
EXPORT CUresult cuStreamGetCaptureInfo_ptsz(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id)
{
    CALLED();
    return capture_info(ptsz_stream(h), st, id, NULL, NULL, NULL, NULL);
}
EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id,
                                          CUgraph *graph, const CUgraphNode **deps,
                                          size_t *ndeps)
{
    CALLED();
    return capture_info(h, st, id, graph, deps, NULL, ndeps);
}
EXPORT CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream h, CUstreamCaptureStatus *st,
                                               cuuint64_t *id, CUgraph *graph,
                                               const CUgraphNode **deps, size_t *ndeps)
{
    CALLED();
    return capture_info(ptsz_stream(h), st, id, graph, deps, NULL, ndeps);
}
EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id,
                                          CUgraph *graph, const CUgraphNode **deps,
                                          const CUgraphEdgeData **edges, size_t *ndeps)
{
    CALLED();
    return capture_info(h, st, id, graph, deps, edges, ndeps);
}
EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus *st,
                                               cuuint64_t *id, CUgraph *graph,
                                               const CUgraphNode **deps,
                                               const CUgraphEdgeData **edges, size_t *ndeps)
{
    CALLED();
    return capture_info(ptsz_stream(h), st, id, graph, deps, edges, ndeps);
}

/* Lock held (LEAVE releases it): both begins; into_graph is
 * cuStreamBeginCaptureToGraph's graph, or NULL. A mode outside the enum is
 * refused (both calls list CUDA_ERROR_INVALID_VALUE). */
static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, fgraph *into_graph)
{
    fstream *s = stream_of(h);
    if (mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!s || s->legacy) /* the legacy stream cannot be captured */
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    if (s->capturing)
        LEAVE(CUDA_ERROR_ILLEGAL_STATE);
    s->capturing = true;
    s->invalidated = false;
    s->capture_mode = mode;
    s->capture_thread = this_thread();
    s->capture_graph = into_graph;
    s->capture_graph_own = false;
    s->capture_seq = ++G.next_capture_seq;
    s->capture_origin = s;
    s->join_into = NULL;
    s->cap_work = s->join_work = s->join_seq = s->join_into_seq = 0;
    LEAVE(CUDA_SUCCESS);
}

static CUresult begin_plain(CUstream h, CUstreamCaptureMode mode)
{
    ENTER_API();
    return begin_capture(h, mode, NULL);
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode)
{
    CALLED();
    return begin_plain(h, mode);
}
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode)
{
    CALLED();
    return begin_plain(ptsz_stream(h), mode);
}

/* CUDA 10.0's begin, before capture modes (cudaTypedefs.h's
 * PFN_cuStreamBeginCapture_v10000): libcuda still exports it for old
 * binaries and cuGetProcAddress hands it out below 10010. It captures in
 * the mode every capture had then, the default: global. Exported under its
 * own names; cuda.h makes cuStreamBeginCapture a macro for _v2. */
EXPORT CUresult cuStreamBeginCapture_v1(CUstream h)
{
    CALLED_AS("cuStreamBeginCapture");
    return begin_plain(h, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
EXPORT CUresult cuStreamBeginCapture_v1_ptsz(CUstream h)
{
    CALLED_AS("cuStreamBeginCapture_ptsz");
    return begin_plain(ptsz_stream(h), CU_STREAM_CAPTURE_MODE_GLOBAL);
}

/* "dependencies - ... Can be NULL if numDependencies is 0"; the fake's
 * graphs have no nodes, so any named dependency is one it cannot check and
 * is taken as given. */
static CUresult begin_to_graph(CUstream h, CUgraph hg, const CUgraphNode *deps, size_t ndeps,
                               CUstreamCaptureMode mode)
{
    ENTER_API();
    fgraph *g = graph_of(hg);
    if (!g || (ndeps && !deps))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    return begin_capture(h, mode, g);
}

EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream h, CUgraph g, const CUgraphNode *deps,
                                            const CUgraphEdgeData *edges, size_t n,
                                            CUstreamCaptureMode mode)
{
    CALLED();
    (void)edges;
    return begin_to_graph(h, g, deps, n, mode);
}
EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream h, CUgraph g, const CUgraphNode *deps,
                                                 const CUgraphEdgeData *edges, size_t n,
                                                 CUstreamCaptureMode mode)
{
    CALLED();
    (void)edges;
    return begin_to_graph(ptsz_stream(h), g, deps, n, mode);
}

/* Is fork o (a stream of origin's capture) joined back into the origin? It
 * added no node of its own, or none since the record of an event that
 * another stream of the capture waited on, and that stream is the origin
 * or joined after the wait, and so on to the origin. Each hop leaves a
 * stream of the capture, so a chain longer than the streams there is a
 * cycle of waits, which joins nothing. */
static bool fork_joined(const fstream *o, const fstream *origin)
{
    if (o->cap_work == 0)
        return true;
    if (o->join_work != o->cap_work)
        return false;
    size_t streams = 0;
    for (const fstream *x = G.streams; x; x = x->next)
        streams += live_capture(x) && x->capture_seq == origin->capture_seq;
    for (size_t hops = 0; o != origin; hops++) {
        const fstream *into = o->join_into;
        if (hops > streams || !into || (into != origin && o->join_into_seq > into->join_seq))
            return false;
        o = into;
    }
    return true;
}

/* "cuStreamEndCapture must still be called in the same stream where
 * cuStreamBeginCapture was called; this is the origin stream", and every
 * other stream of the capture "must also be joined back to the origin
 * stream"; all of them leave capture mode at the end, and an unjoined fork
 * fails "the overall capture operation" (the programming guide's
 * cross-stream dependencies; cuda.h: CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
 * "the capture was not initiated in this stream", and _UNJOINED, "the
 * capture sequence contains a fork that was not joined to the primary
 * stream"). A fork's end is refused and changes nothing. */
static CUresult end_capture(CUstream h, CUgraph *graph)
{
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || !s->capturing)
        LEAVE(CUDA_ERROR_ILLEGAL_STATE);
    if (s->capture_origin != s)
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    /* "If mode is not CU_STREAM_CAPTURE_MODE_RELAXED, cuStreamEndCapture
     * must be called on this stream from the same thread." */
    if (s->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED && s->capture_thread != this_thread())
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    bool unjoined = false;
    for (fstream *o = G.streams; o; o = o->next)
        if (o != s && live_capture(o) && o->capture_seq == s->capture_seq && !fork_joined(o, s))
            unjoined = true;
    const bool invalidated = s->invalidated;
    end_capture_sequence(s->capture_seq);
    /* "If capture was invalidated ... then a NULL graph will be returned";
     * a capture into an existing graph returns that graph. */
    fgraph *g = invalidated || unjoined ? NULL : s->capture_graph ? s->capture_graph : graph_new();
    /* A graph made for cuStreamGetCaptureInfo goes with a failed capture
     * ("the graph handle may be invalidated before end of capture for
     * certain errors"). */
    if (!g && s->capture_graph_own)
        s->capture_graph->destroyed = true;
    s->capture_graph = NULL;
    s->capture_graph_own = false;
    if (graph)
        *graph = (CUgraph)g;
    LEAVE(invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
          : unjoined  ? CUDA_ERROR_STREAM_CAPTURE_UNJOINED
                      : CUDA_SUCCESS);
}

EXPORT CUresult cuStreamEndCapture(CUstream h, CUgraph *g) { CALLED(); return end_capture(h, g); }
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream h, CUgraph *g)
{
    CALLED();
    return end_capture(ptsz_stream(h), g);
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    CALLED();
    NEED_INIT();
    if (!mode || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = tls_capture_mode;
    tls_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

static bool event_done(const fevent *e);

/* Lock held: h waits on e, last recorded in a capture still under way: "a
 * captured event represents a set of nodes in a capture graph. When a
 * captured event is waited on by a stream, it places the stream in capture
 * mode if it is not already" (the programming guide's cross-stream
 * dependencies): s joins the capture as a fork, in the origin's mode and
 * thread, and what it queues from now on is the graph's, not run; the
 * event's stream is joined into s as far as the record. The legacy stream
 * cannot join a capture (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "a disallowed
 * implicit dependency on a current capture sequence from cudaStreamLegacy",
 * and the capture is invalidated, as legacy work on a capturing blocking
 * stream does), nor can a stream of another capture
 * (CUDA_ERROR_STREAM_CAPTURE_MERGE, "a merge of two independent capture
 * sequences"): both the fake's reading of cuda.h's codes. */
static CUresult wait_on_capture(fstream *s, fevent *e)
{
    fstream *origin = e->capture_origin;
    if (s->legacy) {
        invalidate_counted(origin);
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    }
    if (live_capture(s) && s->capture_seq != e->capture_seq)
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_MERGE);
    if (!live_capture(s)) {
        s->capturing = true;
        s->invalidated = origin->invalidated;
        s->capture_mode = origin->capture_mode;
        s->capture_thread = origin->capture_thread;
        s->capture_graph = NULL;
        s->capture_seq = e->capture_seq;
        s->capture_origin = origin;
        s->join_into = NULL;
        s->cap_work = s->join_work = s->join_seq = s->join_into_seq = 0;
        G.st.capture_forks++;
    }
    submit(s, NULL, NULL); /* the wait: a node of the graph */
    fstream *from = e->rec_stream;
    if (from != s && live_capture(from) && from->capture_seq == s->capture_seq) {
        from->join_into = s;
        from->join_work = e->rec_work;
        from->join_seq = e->rec_seq;
        from->join_into_seq = s->submitted;
    }
    LEAVE(CUDA_SUCCESS);
}

/* "Makes all future work submitted to hStream wait for all work captured in
 * hEvent" (cuda.h): the work the event's last record covers, on whatever
 * streams, completes before anything submitted to hStream after this call.
 * An event never recorded, or one whose work is done, adds nothing; on a
 * capturing stream the wait is the graph's, not the stream's. An event last
 * recorded in a capture under way makes the stream join it
 * (wait_on_capture); one recorded in a capture that has ended is refused
 * (CUDA_ERROR_CAPTURED_EVENT, below).
 *
 * A capturing stream may not wait on work that was queued rather than
 * captured: "It is invalid to wait on a non-captured event from a stream
 * which is being captured without specifying the cudaEventWaitExternal
 * flag" (the programming guide, "Prohibited and Unhandled Operations"),
 * and an invalid operation invalidates the capture. The code is
 * CUDA_ERROR_STREAM_CAPTURE_ISOLATION ("a dependency would have been
 * created which crosses the capture sequence boundary"): the fake's reading
 * of cuda.h's codes. With CU_EVENT_WAIT_EXTERNAL the wait is a node of the
 * graph ("captured in the graph as an external event node"); outside a
 * capture that flag "is invalid" (CUDA_ERROR_INVALID_VALUE, as for a flag
 * cuda.h does not name). An event never recorded carries no work, so
 * waiting on it crosses nothing (the fake's reading). */
static CUresult stream_wait_event(CUstream h, CUevent ev, unsigned int flags)
{
    ENTER_API();
    fstream *s = stream_of(h);
    fevent *e = event_of(ev);
    if (!s || !e)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    const bool external = flags & CU_EVENT_WAIT_EXTERNAL;
    if ((flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL) || (external && !live_capture(s)))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* Neither a stream of an invalidated capture nor an event recorded in
     * one may be used (capture_usable): no stream joins such a capture. */
    const fstream *joined = live_capture_of(e);
    CUresult usable = capture_usable(s);
    if (usable == CUDA_SUCCESS && joined)
        usable = capture_usable(joined);
    if (usable != CUDA_SUCCESS)
        LEAVE(usable);
    if (external) {
        submit(s, NULL, NULL); /* the external wait: a node of the graph */
        LEAVE(CUDA_SUCCESS);
    }
    if (live_capture_of(e))
        return wait_on_capture(s, e);
    /* An event last recorded in a capture that has ended stands for nodes
     * of a graph, not for work scheduled ("It is invalid to synchronize or
     * query the execution status of ... a captured event, because they do
     * not represent items scheduled for execution", the programming
     * guide's "Prohibited and Unhandled Operations"), and cuda.h's
     * CUDA_ERROR_CAPTURED_EVENT is "the operation is not permitted on an
     * event which was last recorded in a capturing stream": a wait on it is
     * refused with that code, as cuEventQuery and cuEventSynchronize are
     * (the fake's reading; nothing is queued). A capturing waiter's capture
     * is invalidated, as by any invalid operation in it. */
    if (e->recorded && e->captured) {
        if (live_capture(s))
            invalidate_counted(s);
        LEAVE(CUDA_ERROR_CAPTURED_EVENT);
    }
    if (live_capture(s) && e->recorded && !e->captured) {
        invalidate_counted(s);
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    }
    CUresult r = legacy_use(s);
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    uint64_t seq = submit(s, NULL, NULL);
    if (e->recorded && !e->captured && !s->capturing && !event_done(e)) {
        work_item w = {.seq = seq, .waits = malloc(e->ndeps * sizeof(dep))};
        for (size_t i = 0; i < e->ndeps; i++)
            if (e->deps[i].s->completed < e->deps[i].seq)
                w.waits[w.nwaits++] = e->deps[i];
        enqueue(s, w);
    }
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamWaitEvent(CUstream h, CUevent ev, unsigned int flags)
{
    CALLED();
    return stream_wait_event(h, ev, flags);
}

/* CU_STREAM_PER_THREAD: "an implicit stream with per-thread
 * synchronization behavior" (cuda.h); ptsz_stream says when it is meant. */
EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream h, CUevent ev, unsigned int flags)
{
    CALLED();
    return stream_wait_event(ptsz_stream(h), ev, flags);
}

/* "CU_EVENT_INTERPROCESS must be specified along with
 * CU_EVENT_DISABLE_TIMING"; no other flag is valid (cuEventCreate, cuda.h). */
EXPORT CUresult cuEventCreate(CUevent *ph, unsigned int flags)
{
    CALLED();
    ENTER_API();
    fctx *c = current_ctx();
    const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (!ph || (flags & ~known) ||
        ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    CUresult usable = ctx_usable(c);
    if (usable != CUDA_SUCCESS)
        LEAVE(usable);
    fevent *e = G.free_events;
    if (e) {
        /* FAKECUDA_REUSE_EVENT_HANDLES: the most recently dead event's handle
         * names a fresh event (never recorded, of context c); it stays in the
         * list of all events, and its dependency table is kept for reuse. */
        G.free_events = e->next_free;
        *e = (fevent){.magic = EVENT_MAGIC, .ctx = c, .flags = flags, .next = e->next,
                      .deps = e->deps, .capdeps = e->capdeps};
    } else {
        if (!(e = calloc(1, sizeof *e)))
            LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        e->magic = EVENT_MAGIC;
        e->ctx = c;
        e->flags = flags;
        e->next = G.events;
        G.events = e;
    }
    *ph = (CUevent)e;
    LEAVE(CUDA_SUCCESS);
}

/* Lock held: live event e dies (cuEventDestroy, or its context's end). Its
 * handle stays recognised as stale, unless FAKECUDA_REUSE_EVENT_HANDLES is
 * set: then the next cuEventCreate may hand it out again (the most recently
 * dead first), as the real driver may, since it promises nothing about
 * handle values; a late use of it then reaches the new event, uncounted. */
void event_dies(fevent *e)
{
    e->dead = true;
    if (G.reuse_event_handles) {
        e->next_free = G.free_events;
        G.free_events = e;
    }
}

EXPORT CUresult cuEventDestroy_v2(CUevent h)
{
    CALLED();
    ENTER_API();
    fevent *e = event_of(h);
    if (!e)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    /* Kept in the list (other events' records never point at it), only
     * marked: a later use is a stale handle (or, with
     * FAKECUDA_REUSE_EVENT_HANDLES, reaches the next event made). */
    e->destroyed = true;
    event_dies(e);
    LEAVE(CUDA_SUCCESS);
}

/* Lock held: e completes once s has completed its first `seq` operations.
 * Grows without a limit: an event on the legacy stream waits for every
 * blocking stream, and a program may have any number (a fixed table that
 * dropped the rest would let the event complete before work it must wait
 * for, and the shim's fences with it). */
void event_add_dep(fevent *e, fstream *s, uint64_t seq)
{
    if (e->ndeps == e->capdeps) {
        e->capdeps = e->capdeps ? 2 * e->capdeps : 8;
        e->deps = realloc(e->deps, e->capdeps * sizeof *e->deps);
        if (!e->deps) {
            fprintf(stderr, "fake libcuda: out of memory for an event's dependencies\n");
            abort();
        }
    }
    e->deps[e->ndeps++] = (dep){s, seq};
}

/* Both records: cuEventRecord's and cuEventRecordWithFlags's (flags 0 is
 * CU_EVENT_RECORD_DEFAULT, the same record). cuEventRecordWithFlags, cuda.h:
 * flags are CU_EVENT_RECORD_DEFAULT and CU_EVENT_RECORD_EXTERNAL ("Event is
 * captured in the graph as an external event node when performing stream
 * capture. This flag is invalid outside of stream capture"): any other bit,
 * or EXTERNAL on a stream that does not capture, is CUDA_ERROR_INVALID_VALUE
 * (a listed code). An external record in a capture is a node of the graph,
 * which records the event when the graph runs (the fake launches no
 * graphs): the event is left as it was, neither recorded now nor a
 * captured event that streams could join the capture by. */
static CUresult event_record(CUevent h, CUstream sh, unsigned flags)
{
    ENTER_API();
    fevent *e = event_of(h);
    fstream *s = stream_of(sh);
    if (!e || !s)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    /* "hEvent and hStream must be from the same context otherwise
     * CUDA_ERROR_INVALID_HANDLE is returned" (cuEventRecord, cuda.h) */
    if (e->ctx != s->ctx)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    const bool external = flags & CU_EVENT_RECORD_EXTERNAL;
    if ((flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL) || (external && !live_capture(s)))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    CUresult r = work_usable(s);
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    if (external) {
        captured_instead(s); /* the external record: a node of the graph */
        LEAVE(CUDA_SUCCESS);
    }
    G.st.event_records++;
    e->recorded = true;
    e->recorded_ns = now_ns();
    e->captured = s->capturing;
    e->capture_seq = s->capturing ? s->capture_seq : 0;
    e->capture_origin = s->capturing ? s->capture_origin : NULL;
    e->rec_stream = s;
    e->rec_work = s->cap_work;
    e->rec_seq = s->submitted;
    e->ndeps = 0;
    /* Complete once the work submitted before it is: an event on an idle
     * stream is complete at once, as on an idle GPU. The record is an
     * operation like any other: on the legacy stream it also waits for
     * every blocking stream (not destroyed ones, whose queued work goes on:
     * legacy_must_wait_for; they too with FAKECUDA_LEGACY_SKIPS_DESTROYED=0),
     * on a blocking one for the legacy stream (implicit_deps). Those are
     * the event's own dependencies, not a wait item, so that it completes
     * only once their callbacks have run too (stream_done_to). It takes no
     * place of its own on the legacy stream, so later blocking-stream work
     * does not wait for it: the stream synchronisation note names kernel
     * launches and cudaStreamWaitEvent as the legacy stream's actions, and
     * whether a record is one is not documented; this is the reading that
     * makes a shim's life harder (e2e_fences ordered-reuse fails when the
     * ordered pool's barrier records without waiting; fake-legacy-record). */
    event_add_dep(e, s, s->submitted);
    size_t n;
    dep *implicit = implicit_deps(s, &n);
    for (size_t i = 0; i < n; i++)
        event_add_dep(e, implicit[i].s, implicit[i].seq);
    free(implicit);
    maybe_autocomplete_and_unlock(s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent h, CUstream s) { CALLED(); return event_record(h, s, 0); }
EXPORT CUresult cuEventRecord_ptsz(CUevent h, CUstream s)
{
    CALLED();
    return event_record(h, ptsz_stream(s), 0);
}

/* CUDA 11.1's record with flags (event_record above). */
EXPORT CUresult cuEventRecordWithFlags(CUevent h, CUstream s, unsigned int flags)
{
    CALLED();
    return event_record(h, s, flags);
}
EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent h, CUstream s, unsigned int flags)
{
    CALLED();
    return event_record(h, ptsz_stream(s), flags);
}

/* Lock held. */
static bool event_done(const fevent *e)
{
    for (size_t i = 0; i < e->ndeps; i++)
        if (!stream_done_to(e->deps[i].s, e->deps[i].seq))
            return false;
    return true;
}

EXPORT CUresult cuEventQuery(CUevent h)
{
    CALLED();
    test_hook_run(&before_event_query); /* before the driver's lock */
    ENTER_API();
    fevent *e = event_of(h);
    if (!e)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    if (e->captured)
        LEAVE(captured_event_asked(e));
    CUresult r = unsafe_call();
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    G.st.event_queries++;
    LEAVE(!e->recorded || event_done(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
}

/*
 * cuda.h: "If cuEventRecord() has not been called on either event then
 * CUDA_ERROR_INVALID_HANDLE is returned. If cuEventRecord() has been called
 * on both events but one or both of them has not yet been completed (that
 * is, cuEventQuery() would return CUDA_ERROR_NOT_READY on at least one of
 * the events), CUDA_ERROR_NOT_READY is returned. If either event was created
 * with the CU_EVENT_DISABLE_TIMING flag, then this function will return
 * CUDA_ERROR_INVALID_HANDLE." The fake's GPU takes no time to run work, so
 * the time between two events is the host time between their records; an
 * event recorded in a capture has no time (CUDA_ERROR_INVALID_HANDLE, the
 * listed code nearest "not a recorded event"). _v2 (CUDA 12.8) answers as
 * the first version here: they differ in what the GPU measures, not in the
 * rules above.
 */
static CUresult elapsed_time(float *ms, CUevent start, CUevent end)
{
    ENTER_API();
    fevent *a = event_of(start), *b = event_of(end);
    if (!a || !b)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    if (!ms)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!a->recorded || !b->recorded || a->captured || b->captured ||
        ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING))
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    if (!event_done(a) || !event_done(b))
        LEAVE(CUDA_ERROR_NOT_READY);
    /* "a resolution of around 0.5 microseconds" */
    const double us = ((double)b->recorded_ns - (double)a->recorded_ns) / 1000.0;
    *ms = (float)((double)(int64_t)(us * 2.0) / 2000.0);
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end)
{
    CALLED();
    return elapsed_time(ms, start, end);
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    CALLED();
    return elapsed_time(ms, start, end);
}

EXPORT CUresult cuEventSynchronize(CUevent h)
{
    CALLED();
    ENTER_API();
    fevent *e = event_of(h);
    if (!e)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    if (e->captured)
        LEAVE(captured_event_asked(e));
    CUresult r = unsafe_call();
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    G.st.event_synchronize_calls++;
    pools_release_at_sync();
    /* The host waits: the GPU catches up to everything the event needs,
     * and behind work that never ends, the host waits for good. */
    work_item *all = NULL;
    size_t nall = 0;
    for (size_t i = 0; i < e->ndeps; i++)
        gather(e->deps[i].s, e->deps[i].seq, &all, &nall);
    unlock_and_run(all, nall);
    pthread_mutex_lock(&G.lock);
    while (!event_done(e))
        pthread_cond_wait(&G.stuck_cond, &G.lock);
    pools_release_at_sync(); /* the frees the wait reached too */
    pthread_mutex_unlock(&G.lock);
    return CUDA_SUCCESS;
}

static CUresult launch_host_func(CUstream h, CUhostFn fn, void *data)
{
    ENTER_API();
    fstream *s = stream_of(h);
    /* A bad stream is CUDA_ERROR_INVALID_HANDLE, the code cuda.h lists (not
     * CUDA_ERROR_INVALID_VALUE, which it does not); no function is the
     * runtime's cudaErrorInvalidValue. */
    if (!s)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    if (!fn)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    CUresult r = work_usable(s);
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    if (!captured_instead(s)) /* (captured: a host node of the graph) */
        submit_host_fn(s, fn, data);
    maybe_autocomplete_and_unlock(s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void *data)
{
    CALLED();
    return launch_host_func(h, fn, data);
}
EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream h, CUhostFn fn, void *data)
{
    CALLED();
    return launch_host_func(ptsz_stream(h), fn, data);
}
