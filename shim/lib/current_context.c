/*
 * current_context.c - which pool serves an allocation, remembered per thread
 * so that a steady stream of allocations asks the driver nothing.
 *
 * Two questions are remembered per thread (one answer for the current
 * context, one for each of the last few streams asked about):
 *   - the calling thread's current context (cudaMalloc, cuMemAlloc and the
 *     stream-ordered calls on the legacy or per-thread stream are served by
 *     its pool): cuCtxGetCurrent;
 *   - the context of the explicit stream a stream-ordered call names
 *     (cudaMallocAsync(&p, n, s)): cuStreamGetCtx.
 * Asking the driver was the one driver call left on a steady-state
 * allocation. The answers change only through calls the library interposes:
 *   - on the calling thread: cuCtxSetCurrent, cuCtxPushCurrent and
 *     cuCtxPopCurrent (both ABI versions), every cuCtxCreate and the OpenGL
 *     and VDPAU context creators (a new context is pushed). Their hooks
 *     forget this thread's current context (current_context_moved). The
 *     runtime's cudaSetDevice, and its first call on a thread, make the
 *     primary context current through the cuCtxSetCurrent cudart took from
 *     cuGetProcAddress: the same hook. (cudaSetDevice itself is not
 *     interposed: with two runtimes in a process, RTLD_NEXT would hand one
 *     runtime's call to the other.)
 *   - on any thread: a context destroyed (or detached to nothing), a
 *     primary context reset or released, a green context destroyed,
 *     cudaDeviceReset; a stream created or destroyed (a new stream may get a
 *     destroyed one's handle, in another context). A handle may then name a
 *     dead context or stream, or a new one at the same address, so these
 *     advance a process-wide epoch that every remembered answer carries
 *     (remembered_pools_stale); a pool marked dead is never trusted either.
 * cudart finds those driver calls through cuGetProcAddress and XLA, Numba
 * and TensorFlow through dlsym, both routed to the hooks. Where that routing
 * is not in place (the driver door closed, a forked child, the library
 * loaded as a plug-in rather than preloaded: streams_all_seen) nothing is
 * remembered; with the door closed (preloaded) the pool found is also
 * checked against its context's id, since a teardown through a dlsym'd
 * driver function goes unseen there (a plug-in checks in api.c).
 *
 * What cannot be seen: a change made through the driver's private tables
 * (cuGetExportTable). Public reimplementations of those tables name no call
 * that makes a context current, only ones that retain or create one.
 * BFCSHIM_CONTEXT_CACHE=check keeps asking, compares, and says so when a
 * remembered answer was wrong (the GPU checks run with it); =off always asks.
 */
#include "shim.h"

typedef struct remembered {
    void *key;     /* the stream asked about (NULL for the current context) */
    CUcontext ctx; /* the driver's answer */
    shim_pool *sp; /* its pool; NULL: nothing remembered */
    uint64_t epoch;
} remembered;

/* A thread's streams: a few, since programs alternate between streams (a
 * compute and a copy stream; allocations on each of two in turn). */
enum { STREAMS_REMEMBERED = 4 };

static _Thread_local remembered current, of_stream[STREAMS_REMEMBERED];
static _Thread_local unsigned next_stream_slot;
static atomic_uint_fast64_t epoch = 1;
atomic_uint_fast64_t shim_context_lookups, shim_context_cache_wrong;

void current_context_moved(void) { current.sp = NULL; }

/* Every remembered answer carries the epoch it was asked in, so advancing
 * it forgets them all, this thread's included. */
void remembered_pools_stale(void) { atomic_fetch_add_explicit(&epoch, 1, memory_order_acq_rel); }

/* Can every way the answers change reach a hook? */
static bool remembering(void)
{
    return shim_config_get()->context_cache != CONTEXT_CACHE_OFF && shim_driver_hooked() &&
           streams_all_seen();
}

/* A remembered answer the driver contradicts: said once, counted always. */
static void wrong(const char *what, CUcontext was, CUcontext now)
{
    static atomic_bool said;
    atomic_fetch_add_explicit(&shim_context_cache_wrong, 1, memory_order_relaxed);
    shim_log_once(&said, LOG_ERROR,
                  "BFCSHIM_CONTEXT_CACHE=check: %s changed from %p to %p through a call the "
                  "library does not see; set BFCSHIM_CONTEXT_CACHE=off and report it",
                  what, (void *)was, (void *)now);
}

/* The driver's answer now, for BFCSHIM_CONTEXT_CACHE=check. */
static bool driver_says(const real_driver *R, void *key, CUcontext *ctx)
{
    if (!key)
        return R->CtxGetCurrent(ctx) == CUDA_SUCCESS;
    return R->StreamGetCtx && R->StreamGetCtx((CUstream)key, ctx) == CUDA_SUCCESS;
}

/* m's pool when it answers the question about `key` and nothing since
 * could have changed the answer; else NULL. */
static shim_pool *recalled(const real_driver *R, const remembered *m, void *key, uint64_t now)
{
    if (!m->sp || m->key != key || m->epoch != now || atomic_load(&m->sp->dead))
        return NULL;
    if (shim_config_get()->context_cache != CONTEXT_CACHE_CHECK)
        return m->sp;
    CUcontext said = NULL;
    if (!driver_says(R, key, &said))
        return NULL;
    if (said == m->ctx)
        return m->sp;
    wrong(key ? "a stream's context" : "the current context", m->ctx, said);
    return NULL;
}

/* check: with the driver door closed, ask the pool's context for its id
 * (below); a free's question does not (current_context_pool_unchecked). */
static shim_pool *remembered_or_asked(const real_driver *R, remembered *m, void *key,
                                      pool_lookup ask, bool check)
{
    bool on = remembering();
    uint64_t now = atomic_load_explicit(&epoch, memory_order_acquire);
    shim_pool *sp = on ? recalled(R, m, key, now) : NULL;
    if (sp)
        return sp;
    /* The epoch is the one read before asking: a context or stream that
     * goes while the driver answers leaves this answer stale at once. */
    atomic_fetch_add_explicit(&shim_context_lookups, 1, memory_order_relaxed);
    CUcontext ctx = NULL;
    sp = ask(R, key, &ctx);
    /* With the driver door closed a context torn down through a driver
     * function found with dlsym goes unseen, and its pool would live on:
     * over virtual memory its memory outlives the context, but its events
     * are dead handles, which the driver may give to the program's next
     * events (e2e_fences unseen-reset-events-reused: such an event became
     * a fence, read complete, and a block came back under queued work).
     * So the pool's context is asked for its id, as a plug-in's is: one
     * driver call per allocation's lookup, and only there (the door open,
     * every teardown is seen). */
    if (sp && check && !shim_driver_hooked() && streams_all_seen() &&
        pools_forget_if_replaced(sp))
        sp = ask(R, key, &ctx);
    *m = (remembered){key, ctx, on ? sp : NULL, now};
    return sp;
}

shim_pool *current_context_pool(const real_driver *R, pool_lookup ask)
{
    return remembered_or_asked(R, &current, NULL, ask, true);
}

/* The same, for a free's question (is the block's pool the current
 * context's?): the pool found is not checked against its context's id, as
 * before 9d1427e; an allocation's lookup checks it (e2e_fences
 * hooks-off-free-cost: two cuCtxGetId per stream-ordered free). */
shim_pool *current_context_pool_unchecked(const real_driver *R, pool_lookup ask)
{
    return remembered_or_asked(R, &current, NULL, ask, false);
}

shim_pool *stream_context_pool(const real_driver *R, CUstream s, pool_lookup ask)
{
    /* s's own slot if it has one, else the next in turn */
    remembered *m = NULL;
    for (int i = 0; i < STREAMS_REMEMBERED && !m; i++)
        if (of_stream[i].sp && of_stream[i].key == (void *)s)
            m = &of_stream[i];
    if (!m)
        m = &of_stream[next_stream_slot++ % STREAMS_REMEMBERED];
    return remembered_or_asked(R, m, (void *)s, ask, true);
}
