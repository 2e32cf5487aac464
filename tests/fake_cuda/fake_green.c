/*
 * fake_green.c - green contexts: device resources, descriptors, green
 * contexts, their converted contexts and streams.
 */
#include "fake_internal.h"

/*
 * What cuda.h says, and the fake does:
 * - cuDeviceGetDevResource gives the device's SM resource (SM_COUNT SMs);
 *   cuDevResourceGenerateDesc makes a descriptor of SM resources.
 * - cuGreenCtxCreate requires CU_GREEN_CTX_DEFAULT_STREAM and "will retain
 *   the primary context on device dev, which will is released when the
 *   green context is destroyed"; it does not make the green context current.
 * - cuCtxFromGreenCtx gives its converted context: a context of its own
 *   handle, whose legacy stream is the green context's default stream, and
 *   which shares the primary context's memory (do_alloc).
 * - cuGreenCtxStreamCreate requires CU_STREAM_NON_BLOCKING and "ignores the
 *   context that is current"; cuStreamGetCtx of such a stream is the
 *   converted context, cuStreamGetCtx_v2 the primary one and the green one.
 * - cuEventRecord needs the event and the stream "from the same context": an
 *   event made in the primary context is refused on a green context's
 *   stream (the harsher of the two readings). cuGreenCtxRecordEvent takes an
 *   event of "the same primary context" (the primary or a green context of
 *   the device) and captures "all the activities of the green context": its
 *   default stream's and its live streams' work. A destroyed stream's queued
 *   work is left out (cuda.h does not say it is an activity of the green
 *   context any more: the harsher reading). While a stream of it captures
 *   it answers CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates those
 *   captures.
 * - cuGreenCtxDestroy: its streams are not destroyed, but "any subsequent API
 *   calls involving these streams (including cuStreamDestroy) will return
 *   CUDA_ERROR_CONTEXT_IS_DESTROYED". cuda.h does not say that the call waits
 *   for the green context's work: here it does not (the harsher reading),
 *   and that work completes later, as a destroyed stream's does.
 */

/* Lock held: the green context a handle names, or NULL. */
static fgreen *green_of(CUgreenCtx h)
{
    fgreen *g = (fgreen *)h;
    return g && g->magic == GREEN_MAGIC ? g : NULL;
}

/* Only SM resources are modelled; another type is
 * CUDA_ERROR_INVALID_RESOURCE_TYPE, in cuda.h's list for the call. The
 * partition size and alignment are not a device's measured values (the GPU
 * suite's green-stream prints an H100's): they keep cuda.h's rule that
 * "smCount is a multiple of" smCoscheduledAlignment. */
EXPORT CUresult cuDeviceGetDevResource(CUdevice dev, CUdevResource *res, CUdevResourceType type)
{
    CALLED();
    NEED_INIT();
    if (!res)
        return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_DEV_RESOURCE_TYPE_SM)
        return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    if (!is_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    memset(res, 0, sizeof *res);
    res->type = CU_DEV_RESOURCE_TYPE_SM;
    res->sm.smCount = SM_COUNT;
    res->sm.minSmPartitionSize = 2;
    res->sm.smCoscheduledAlignment = 2;
    return CUDA_SUCCESS;
}

/* Several SM resources "must be outputs ... from the same split API
 * instance, otherwise CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION is returned"
 * (cuda.h): the fake has no split (cuDevSmResourceSplitByCount), so a
 * descriptor holds one resource. */
EXPORT CUresult cuDevResourceGenerateDesc(CUdevResourceDesc *desc, CUdevResource *res,
                                          unsigned int n)
{
    CALLED();
    NEED_INIT();
    if (!desc || !res || n == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (res[0].type != CU_DEV_RESOURCE_TYPE_SM)
        return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    if (res[0].sm.smCount == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (n > 1)
        return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    struct CUdevResourceDesc_st *d = calloc(1, sizeof *d);
    if (!d)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *d = (struct CUdevResourceDesc_st){DESC_MAGIC, res[0].sm.smCount};
    *desc = d;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *ph, CUdevResourceDesc desc, CUdevice dev,
                                 unsigned int flags)
{
    CALLED();
    ENTER_API();
    if (!ph || !desc || desc->magic != DESC_MAGIC || !(flags & CU_GREEN_CTX_DEFAULT_STREAM) ||
        desc->sm_count > SM_COUNT)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    fgreen *g = calloc(1, sizeof *g);
    if (!g)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    G.primary[dev].refcount++;
    if (!G.primary[dev].alive)
        G.primary[dev].id = ++G.next_ctx_id;
    G.primary[dev].alive = true;
    *g = (fgreen){.magic = GREEN_MAGIC, .dev = dev, .sm_count = desc->sm_count, .next = G.greens};
    live_ctx(&g->ctx, dev, g);
    G.greens = g;
    *ph = (CUgreenCtx)g;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx h)
{
    CALLED();
    ENTER_API();
    fgreen *g = green_of(h);
    if (!g)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    if (!g->ctx.alive)
        LEAVE(CUDA_ERROR_CONTEXT_IS_DESTROYED);
    /* Handles die; queued work goes on (see above). */
    g->ctx.alive = false;
    for (fstream *s = G.streams; s; s = s->next)
        if (s->ctx == &g->ctx) {
            s->destroyed = true;
            stop_capturing(s);
        }
    if (G.primary[g->dev].refcount > 0 && --G.primary[g->dev].refcount == 0)
        kill_ctx(&G.primary[g->dev]);
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxFromGreenCtx(CUcontext *pctx, CUgreenCtx h)
{
    CALLED();
    ENTER_API();
    if (!pctx)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    fgreen *g = green_of(h);
    if (!g || !g->ctx.alive)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    *pctx = (CUcontext)&g->ctx;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuGreenCtxStreamCreate(CUstream *ph, CUgreenCtx h, unsigned int flags,
                                       int priority)
{
    CALLED();
    (void)priority;
    ENTER_API();
    /* "CU_STREAM_NON_BLOCKING must be specified", and cuStreamCreate's list
     * of valid flags holds nothing else: exactly that flag. */
    if (!ph || flags != CU_STREAM_NON_BLOCKING)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    fgreen *g = green_of(h);
    if (!g || !g->ctx.alive)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    fstream *s = new_stream(&g->ctx, flags, false);
    CUstream made = s ? stream_handle(s) : NULL;
    if (!made)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    *ph = made;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamGetGreenCtx(CUstream h, CUgreenCtx *pg)
{
    CALLED();
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || !pg)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    *pg = (CUgreenCtx)s->ctx->green;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamGetCtx_v2(CUstream h, CUcontext *pctx, CUgreenCtx *pg)
{
    CALLED();
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || !pctx || !pg)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    fctx *c = s->ctx;
    *pctx = (CUcontext)(c->green ? &G.primary[c->dev] : c);
    *pg = (CUgreenCtx)c->green;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuGreenCtxRecordEvent(CUgreenCtx h, CUevent ev)
{
    CALLED();
    ENTER_API();
    fgreen *g = green_of(h);
    if (!g || !g->ctx.alive)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    fevent *e = event_of(ev);
    /* "hEvent and hCtx must be from the same primary context" */
    if (!e || e->ctx->dev != g->dev || !(e->ctx->primary || e->ctx->green))
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    CUresult r = CUDA_SUCCESS;
    for (fstream *o = G.streams; o; o = o->next)
        if (o->ctx == &g->ctx && live_capture(o)) {
            invalidate_counted(o);
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    G.st.event_records++;
    e->recorded = true;
    e->recorded_ns = now_ns();
    e->captured = false;
    e->ndeps = 0;
    event_add_dep(e, &g->ctx.legacy, g->ctx.legacy.submitted);
    /* Every live stream of the green context (see above). */
    for (fstream *o = G.streams; o; o = o->next)
        if (o->ctx == &g->ctx && !o->dead && !o->destroyed)
            event_add_dep(e, o, o->submitted);
    if (G.autocomplete)
        complete_everything_and_unlock(&g->ctx);
    else
        pthread_mutex_unlock(&G.lock);
    return CUDA_SUCCESS;
}
