/*
 * current_context.c - the pool of the calling thread's current context,
 * remembered per thread so that an allocation asks the driver nothing.
 *
 * cudaMalloc and cuMemAlloc are served by the pool of the context current on
 * the calling thread. Asking the driver (cuCtxGetCurrent) was the one driver
 * call left on a steady-state allocation. The answer changes only through
 * calls the library interposes:
 *   - on the calling thread: cuCtxSetCurrent, cuCtxPushCurrent and
 *     cuCtxPopCurrent (both ABI versions), every cuCtxCreate and the OpenGL
 *     and VDPAU context creators (a new context is pushed), cudaSetDevice.
 *     Their hooks forget this thread's answer (current_context_moved).
 *   - on any thread: a context destroyed, a primary context reset or
 *     released, a green context destroyed, cudaDeviceReset. A handle may
 *     then name a dead context, or a new one at the same address, so these
 *     advance a process-wide epoch that every remembered answer carries
 *     (current_context_gone); a pool marked dead is never trusted either.
 * cudart finds those driver calls through cuGetProcAddress and XLA, Numba
 * and TensorFlow through dlsym, both routed to the hooks. Where that routing
 * is not in place (the driver door closed, a forked child, the library
 * loaded as a plug-in rather than preloaded) nothing is remembered.
 *
 * What cannot be seen: a change made through the driver's private tables
 * (cuGetExportTable). Public reimplementations of those tables name no call
 * that makes a context current, only ones that retain or create one.
 * BFCSHIM_CONTEXT_CACHE=check keeps asking, compares, and says so when a
 * remembered answer was wrong (the GPU checks run with it); =off always asks.
 */
#include "shim.h"

typedef struct remembered {
    CUcontext ctx;
    shim_pool *sp; /* NULL: nothing remembered */
    uint64_t epoch;
} remembered;

static _Thread_local remembered mine;
static atomic_uint_fast64_t epoch = 1;
atomic_uint_fast64_t shim_context_lookups, shim_context_cache_wrong;

void current_context_moved(void) { mine.sp = NULL; }

void current_context_gone(void)
{
    atomic_fetch_add_explicit(&epoch, 1, memory_order_acq_rel);
    mine.sp = NULL;
}

/* Can every way a context is made current reach a hook? */
static bool remembering(void)
{
    return shim_config_get()->context_cache != CONTEXT_CACHE_OFF && shim_driver_hooked() &&
           streams_all_seen();
}

/* A remembered answer the driver contradicts: said once, counted always. */
static void wrong(CUcontext was, CUcontext now)
{
    static atomic_bool said;
    atomic_fetch_add_explicit(&shim_context_cache_wrong, 1, memory_order_relaxed);
    shim_log_once(&said, LOG_ERROR,
                  "BFCSHIM_CONTEXT_CACHE=check: the current context changed from %p to %p "
                  "through a call the library does not see; set BFCSHIM_CONTEXT_CACHE=off "
                  "and report it",
                  (void *)was, (void *)now);
}

shim_pool *current_context_pool(const real_driver *R, current_context_lookup ask)
{
    bool on = remembering();
    uint64_t now = atomic_load_explicit(&epoch, memory_order_acquire);
    if (on && mine.sp && mine.epoch == now && !atomic_load(&mine.sp->dead)) {
        if (shim_config_get()->context_cache != CONTEXT_CACHE_CHECK)
            return mine.sp;
        CUcontext cur = NULL;
        bool answered = R->CtxGetCurrent(&cur) == CUDA_SUCCESS;
        if (answered && cur == mine.ctx)
            return mine.sp;
        if (answered)
            wrong(mine.ctx, cur);
    }
    /* The epoch is the one read before asking: a context that goes while
     * the driver answers leaves this answer stale at once. */
    atomic_fetch_add_explicit(&shim_context_lookups, 1, memory_order_relaxed);
    CUcontext ctx = NULL;
    shim_pool *sp = ask(R, &ctx);
    mine = (remembered){ctx, on ? sp : NULL, now};
    return sp;
}
