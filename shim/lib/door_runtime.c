/*
 * door_runtime.c - the runtime API door: cudaMalloc and friends.
 *
 * Exported unversioned, these bind to a program's references to
 * cudaMalloc@libcudart.so.12 or .13 alike (an unversioned definition
 * satisfies a versioned reference), so one build serves both toolkits. The
 * real functions come from the next library in lookup order (RTLD_NEXT).
 *
 * The door serves pooled calls itself rather than relying on cudart to reach
 * the driver door, so it works with BFCSHIM_DRIVER_HOOKS=0 too. Two runtime
 * behaviours must survive that:
 *   - initialisation: the runtime makes the device's primary context current
 *     on first use; when no context is current we let the real cudaFree(NULL)
 *     do exactly that;
 *   - the last error: a failing runtime call also sets the per-thread error
 *     cudaGetLastError returns. The door cannot set it directly, so on a
 *     failure it makes the real runtime fail the same way with a call that
 *     has no other effect: cudaMalloc of an impossible size (out of memory)
 *     or into a NULL result pointer (invalid value), cudaEventQuery(NULL)
 *     (invalid resource handle), cudaStreamIsCapturing on the legacy stream
 *     (capture implicit), with the driver door bypassed for this thread.
 */
#include <stdint.h>

#include "shim.h"

typedef cudaError_t (*malloc_fn)(void **, size_t);
typedef cudaError_t (*free_fn)(void *);
typedef cudaError_t (*malloc_async_fn)(void **, size_t, cudaStream_t);
typedef cudaError_t (*free_async_fn)(void *, cudaStream_t);
typedef cudaError_t (*malloc_pool_fn)(void **, size_t, cudaMemPool_t, cudaStream_t);
typedef cudaError_t (*pitch_fn)(void **, size_t *, size_t, size_t);
typedef cudaError_t (*meminfo_fn)(size_t *, size_t *);
typedef cudaError_t (*ipc_fn)(cudaIpcMemHandle_t *, void *);
typedef cudaError_t (*stream_create_fn)(cudaStream_t *);
typedef cudaError_t (*stream_create_flags_fn)(cudaStream_t *, unsigned);
typedef cudaError_t (*stream_create_prio_fn)(cudaStream_t *, unsigned, int);
typedef cudaError_t (*stream_destroy_fn)(cudaStream_t);
typedef cudaError_t (*device_reset_fn)(void);
typedef cudaError_t (*get_device_fn)(int *);
typedef cudaError_t (*peer_enable_fn)(int, unsigned);
typedef cudaError_t (*peer_disable_fn)(int);
typedef cudaError_t (*event_query_fn)(cudaEvent_t);
typedef cudaError_t (*is_capturing_fn)(cudaStream_t, enum cudaStreamCaptureStatus *);

/* No runtime behind us (a static cudart, or none): nothing to call. */
#define NO_RUNTIME cudaErrorInsufficientDriver

static cudaError_t real_malloc(void **p, size_t size)
{
    REAL_RT(malloc_fn, f, "cudaMalloc");
    return f ? f(p, size) : NO_RUNTIME;
}

static cudaError_t real_free(void *p)
{
    REAL_RT(free_fn, f, "cudaFree");
    return f ? f(p) : NO_RUNTIME;
}

/* Sets the runtime's last error to `e` (see the header comment). A
 * cudaMalloc is "potentially unsafe": in the default global mode it would
 * invalidate another thread's global-mode capture (e2e_fences ptsz-capture,
 * out of memory while a blocking stream captures), so it is made in relaxed
 * mode, always: a capture may begin between a look at the count and the
 * call (capture.c), and a failed allocation is rare. */
static cudaError_t fail(cudaError_t e)
{
    const real_driver *R = real_driver_get();
    relaxed_scope rs = {false, CU_STREAM_CAPTURE_MODE_GLOBAL};
    if (R)
        rs = capture_relax_always(R);
    shim_tls_bypass++;
    void *p = NULL;
    if (e == cudaErrorMemoryAllocation) {
        real_malloc(&p, SIZE_MAX & ~(size_t)0xfffff);
    } else if (e == cudaErrorInvalidResourceHandle) {
        /* A refused free on a destroyed stream: the dead handle must not
         * reach the runtime, so an event no runtime ever made stands in
         * (found by an audit: the last error said cudaErrorInvalidValue). */
        REAL_RT(event_query_fn, query, "cudaEventQuery");
        if (query)
            query(NULL);
    } else if (e == cudaErrorStreamCaptureImplicit) {
        /* cuda.h: asking about the legacy stream while a blocking stream
         * captures answers this, and invalidates nothing. */
        REAL_RT(is_capturing_fn, capturing, "cudaStreamIsCapturing");
        enum cudaStreamCaptureStatus st;
        if (capturing)
            capturing(cudaStreamLegacy, &st);
    } else {
        real_malloc(NULL, 1);
    }
    shim_tls_bypass--;
    if (R)
        capture_restore(R, rs);
    return e;
}

static cudaError_t result_of(svc_status st)
{
    switch (st) {
    case SVC_OK:
        return cudaSuccess;
    case SVC_OOM:
        return fail(cudaErrorMemoryAllocation);
    case SVC_DEAD_STREAM:
        return fail(cudaErrorInvalidResourceHandle);
    case SVC_CAPTURE_IMPLICIT:
        return fail(cudaErrorStreamCaptureImplicit);
    case SVC_NO_CONTEXT: /* (the runtime makes one current first: not seen here) */
    case SVC_CONTEXT_DESTROYED:
        return fail(cudaErrorContextIsDestroyed);
    default:
        return fail(cudaErrorInvalidValue);
    }
}

/* Lets the runtime make its context current and live, as any runtime call
 * would; returns that context, or NULL. */
static CUcontext runtime_context_started(const real_driver *R)
{
    CUcontext cur = NULL;
    shim_tls_bypass++;
    cudaError_t e = real_free(NULL);
    shim_tls_bypass--;
    if (e != cudaSuccess || R->CtxGetCurrent(&cur) != CUDA_SUCCESS)
        return NULL;
    return cur;
}

/* The pool of the runtime's current context, starting the runtime first if
 * no context is current, or if the current one cannot have a pool: after
 * cudaDeviceReset the primary context stays current but inactive until the
 * runtime's next call revives it, and a cudaMalloc may be that call. Before
 * the runtime's first call the driver is not even initialised, and
 * cuCtxGetCurrent answers CUDA_ERROR_NOT_INITIALIZED: that too means "no
 * context yet", not "no pool" (a program whose first call is cudaMalloc). */
static shim_pool *runtime_pool_asked(const real_driver *R, void *unused, CUcontext *ctx)
{
    (void)unused;
    CUcontext cur = NULL;
    if (R->CtxGetCurrent(&cur) != CUDA_SUCCESS)
        cur = NULL;
    shim_pool *sp = cur ? pool_for_context(cur, true) : NULL;
    if (!sp && (cur = runtime_context_started(R)) != NULL)
        sp = pool_for_context(cur, true);
    *ctx = cur;
    return sp;
}

/* ... remembered per thread while no call could have changed the answer
 * (current_context.c). */
static shim_pool *runtime_pool(void)
{
    const real_driver *R = real_driver_get();
    return R ? current_context_pool(R, runtime_pool_asked) : NULL;
}

static cudaError_t counted_alloc(cudaError_t e, void **p, size_t size)
{
    if (e == cudaSuccess && p && platform_counting())
        platform_note_alloc((CUdeviceptr)(uintptr_t)*p, size);
    return e;
}

static cudaError_t counted_free(cudaError_t e, void *p)
{
    if (e == cudaSuccess && platform_counting())
        platform_note_free((CUdeviceptr)(uintptr_t)p);
    return e;
}

/* No pool owns p: the real free, with the driver door stepping aside (it
 * would only ask the pools again, and complain a second time). */
static cudaError_t pass_foreign_free(void *p)
{
    shim_tls_bypass++;
    cudaError_t e = real_free(p);
    shim_tls_bypass--;
    return e;
}

static cudaError_t foreign_result(cudaError_t e, const char *api, void *p)
{
    if (e != cudaSuccess && e != cudaErrorCudartUnloading)
        shim_log(LOG_ERROR, "%s(%p): not a pooled pointer, and the runtime refused it (%d)", api,
                 p, (int)e);
    return e;
}

/* ---- plain allocation ------------------------------------------------------------ */

SHIM_EXPORT cudaError_t cudaMalloc(void **p, size_t size)
{
    shim_pool *sp;
    bool active = shim_active();
    if (active && !p)
        shim_log(LOG_ERROR, "cudaMalloc(NULL, %zu): NULL result pointer", size);
    /* NULL result pointers and size 0 get the runtime's own answers. */
    if (!active || !p || size == 0 || !(sp = runtime_pool()))
        return counted_alloc(real_malloc(p, size), p, size);
    CUdeviceptr d = 0;
    svc_next_alloc_in_current_context();
    svc_status st = svc_alloc(sp, size, BFC_NO_LANE, NULL, &d, "cudaMalloc");
    if (st == SVC_OK)
        *p = (void *)(uintptr_t)d;
    return result_of(st);
}

SHIM_EXPORT cudaError_t cudaFree(void *p)
{
    if (!shim_active() || !p)
        return counted_free(real_free(p), p);
    svc_status st = svc_free((CUdeviceptr)(uintptr_t)p, FREE_PLAIN, NULL, false, "cudaFree");
    if (st == SVC_PASS)
        return foreign_result(pass_foreign_free(p), "cudaFree", p);
    return result_of(st);
}

SHIM_EXPORT cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t width, size_t height)
{
    REAL_RT(pitch_fn, f, "cudaMallocPitch");
    shim_pool *sp;
    bool active = shim_active();
    if (active && (!p || !pitch)) /* (the runtime's own answer follows, as cudaMalloc's) */
        shim_log(LOG_ERROR, "cudaMallocPitch(%p, %p, %zu x %zu): NULL result pointer", (void *)p,
                 (void *)pitch, width, height);
    if (!active || !p || !pitch || !(sp = runtime_pool())) {
        cudaError_t e = f ? f(p, pitch, width, height) : NO_RUNTIME;
        return counted_alloc(e, p, e == cudaSuccess && pitch ? *pitch * height : 0);
    }
    size_t rows = 0, bytes = 0;
    if (!svc_pitch(sp, width, height, 4, &rows, &bytes)) {
        shim_log(LOG_ERROR, "cudaMallocPitch(%zu x %zu): zero or overflowing size", width,
                 height);
        return fail(cudaErrorInvalidValue);
    }
    CUdeviceptr d = 0;
    svc_next_alloc_in_current_context();
    svc_status st = svc_alloc(sp, bytes, BFC_NO_LANE, NULL, &d, "cudaMallocPitch");
    if (st == SVC_OK) {
        *p = (void *)(uintptr_t)d;
        *pitch = rows;
    }
    return result_of(st);
}

SHIM_EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    REAL_RT(meminfo_fn, f, "cudaMemGetInfo");
    svc_meminfo_begin();
    cudaError_t e = f ? f(free_bytes, total) : NO_RUNTIME;
    if (e == cudaSuccess && total && shim_active() && !svc_meminfo_adjusted())
        svc_adjust_meminfo(free_bytes, *total);
    return e;
}

SHIM_EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *p)
{
    REAL_RT(ipc_fn, f, "cudaIpcGetMemHandle");
    /* With the driver door open, cudart's own cuIpcGetMemHandle refuses the
     * pointer and the runtime records the error as usual. */
    svc_status st = shim_active() && !shim_driver_door()
                        ? svc_ipc_check((CUdeviceptr)(uintptr_t)p, "cudaIpcGetMemHandle")
                        : SVC_PASS;
    if (st == SVC_UNSUPPORTED)
        return cudaErrorNotSupported;
    if (st != SVC_PASS) /* the pool's free space: never the real call (the region's handle) */
        return fail(cudaErrorInvalidValue);
    return f ? f(handle, p) : NO_RUNTIME;
}

/* ---- stream-ordered allocation --------------------------------------------------- */

/* A stream-ordered allocation the pool does not serve (capture: the graph
 * owns it), counted once. */
static cudaError_t pass_alloc_async(malloc_async_fn f, void **p, size_t size, cudaStream_t s)
{
    svc_note_passthrough();
    shim_tls_bypass++;
    cudaError_t e = f ? f(p, size, s) : NO_RUNTIME;
    shim_tls_bypass--;
    return e;
}

static cudaError_t malloc_async(int z, void **p, size_t size, cudaStream_t s, const char *api)
{
    REAL_RT(malloc_async_fn, f0, "cudaMallocAsync");
    REAL_RT(malloc_async_fn, f1, "cudaMallocAsync_ptsz");
    malloc_async_fn f = z ? f1 : f0;
    if (!shim_active() || !p || size == 0)
        return counted_alloc(f ? f(p, size, s) : NO_RUNTIME, p, size);
    /* The stream's device, not the current one; and its default pool only. */
    shim_pool *sp = svc_async_pool((CUstream)s, z, runtime_pool);
    if (!sp || !svc_default_pool_current(sp->dev))
        return pass_alloc_async(f, p, size, s);
    CUdeviceptr d = 0;
    if (!svc_explicit_stream((CUstream)s)) /* (runtime_pool's) */
        svc_next_alloc_in_current_context();
    svc_status st = svc_alloc(sp, size, pool_lane_for_alloc(sp, (CUstream)s, z), (CUstream)s, &d, api);
    if (st == SVC_OK)
        *p = (void *)(uintptr_t)d;
    return result_of(st);
}

/* A stream-ordered free on the legacy or per-thread stream names the
 * runtime's current context's: on a thread that has made no runtime call
 * yet, the runtime makes the device's primary context current first, as its
 * own cudaFreeAsync would (and then, while a blocking stream captures,
 * refuses the free; without a context the shim's question about the legacy
 * stream was answered CUDA_ERROR_INVALID_CONTEXT and the free taken: found
 * by an audit, e2e_fences legacy-while-capturing-new-thread). Remembered per
 * thread: no driver call while the current context has a pool. */
static void runtime_context_for_free(cudaStream_t s)
{
    const real_driver *R = real_driver_get();
    if (!R || svc_explicit_stream((CUstream)s) || pools_current_existing(R))
        return;
    CUcontext cur = NULL;
    if (R->CtxGetCurrent(&cur) != CUDA_SUCCESS || !cur)
        runtime_context_started(R);
}

static cudaError_t free_async(int z, void *p, cudaStream_t s, const char *api)
{
    REAL_RT(free_async_fn, f0, "cudaFreeAsync");
    REAL_RT(free_async_fn, f1, "cudaFreeAsync_ptsz");
    free_async_fn f = z ? f1 : f0;
    if (!shim_active() || !p)
        return counted_free(f ? f(p, s) : NO_RUNTIME, p);
    runtime_context_for_free(s);
    svc_status st = svc_free((CUdeviceptr)(uintptr_t)p, FREE_STREAM, (CUstream)s, z, api);
    if (st == SVC_CONTEXT_DESTROYED || st == SVC_NO_CONTEXT) {
        /* No live context current (a primary context reset by
         * cudaDeviceReset stays current, inactive): the runtime's own free
         * would first revive it, as its next call does, and free on its
         * stream. So does the door, and asks again; where the runtime
         * cannot, its error (and last error) is the answer. */
        shim_tls_bypass++;
        cudaError_t e = real_free(NULL);
        shim_tls_bypass--;
        if (e != cudaSuccess)
            return e;
        st = svc_free((CUdeviceptr)(uintptr_t)p, FREE_STREAM, (CUstream)s, z, api);
    }
    if (st == SVC_PASS) {
        shim_tls_bypass++;
        cudaError_t e = f ? f(p, s) : NO_RUNTIME;
        shim_tls_bypass--;
        return foreign_result(e, api, p);
    }
    return result_of(st);
}

static cudaError_t malloc_from_pool(int z, void **p, size_t size, cudaMemPool_t pool,
                                    cudaStream_t s, const char *api)
{
    REAL_RT(malloc_pool_fn, f0, "cudaMallocFromPoolAsync");
    REAL_RT(malloc_pool_fn, f1, "cudaMallocFromPoolAsync_ptsz");
    malloc_pool_fn f = z ? f1 : f0;
    if (!shim_active() || !p || size == 0)
        return f ? f(p, size, pool, s) : NO_RUNTIME;
    shim_pool *sp = svc_async_pool((CUstream)s, z, runtime_pool);
    if (!sp || !svc_is_default_pool(sp, (CUmemoryPool)pool)) {
        svc_note_passthrough();
        shim_tls_bypass++; /* counted here, not again in the driver door */
        cudaError_t e = f ? f(p, size, pool, s) : NO_RUNTIME;
        shim_tls_bypass--;
        return e;
    }
    CUdeviceptr d = 0;
    if (!svc_explicit_stream((CUstream)s)) /* (runtime_pool's) */
        svc_next_alloc_in_current_context();
    svc_status st = svc_alloc(sp, size, pool_lane_for_alloc(sp, (CUstream)s, z), (CUstream)s, &d, api);
    if (st == SVC_OK)
        *p = (void *)(uintptr_t)d;
    return result_of(st);
}

SHIM_EXPORT cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s)
{
    return malloc_async(0, p, size, s, "cudaMallocAsync");
}

SHIM_EXPORT cudaError_t cudaMallocAsync_ptsz(void **p, size_t size, cudaStream_t s)
{
    return malloc_async(1, p, size, s, "cudaMallocAsync_ptsz");
}

SHIM_EXPORT cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    return free_async(0, p, s, "cudaFreeAsync");
}

SHIM_EXPORT cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s)
{
    return free_async(1, p, s, "cudaFreeAsync_ptsz");
}

SHIM_EXPORT cudaError_t cudaMallocFromPoolAsync(void **p, size_t size, cudaMemPool_t pool,
                                                cudaStream_t s)
{
    return malloc_from_pool(0, p, size, pool, s, "cudaMallocFromPoolAsync");
}

SHIM_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **p, size_t size, cudaMemPool_t pool,
                                                     cudaStream_t s)
{
    return malloc_from_pool(1, p, size, pool, s, "cudaMallocFromPoolAsync_ptsz");
}

/* ---- streams and devices --------------------------------------------------------- */

/* Registered here as well as in the driver door, which may be closed. */
static cudaError_t registered(cudaError_t e, cudaStream_t *s)
{
    if (e != cudaSuccess || !s)
        return e;
    CUresult r = streams_add((CUstream)*s);
    if (r == CUDA_SUCCESS)
        return e;
    *s = NULL; /* (destroyed: fences_ordered_stream_made) */
    /* (streams_add's codes, as cudart answers them: a lost context is no
     * shortage of memory. fences_ordered_stream_made's are unreachable from
     * here while only a hooked driver door lets a pool be ordered (fences.c's
     * ordered check); cuCtxGetId's, refused with the driver door closed, are
     * not: e2e_fences unseen-reset-streams-id-fails.) */
    return r == CUDA_ERROR_ILLEGAL_ADDRESS ? cudaErrorIllegalAddress
           : r == CUDA_ERROR_CONTEXT_IS_DESTROYED ? cudaErrorContextIsDestroyed
           : r == CUDA_ERROR_LAUNCH_FAILED ? cudaErrorLaunchFailure
           : r == CUDA_ERROR_INVALID_CONTEXT ? cudaErrorDeviceUninitialized
           : r == CUDA_ERROR_DEINITIALIZED ? cudaErrorCudartUnloading
           : r == CUDA_ERROR_NOT_INITIALIZED ? cudaErrorInitializationError
                                             : cudaErrorMemoryAllocation;
}

SHIM_EXPORT cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    REAL_RT(stream_create_fn, f, "cudaStreamCreate");
    return registered(f ? f(s) : NO_RUNTIME, s);
}

SHIM_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    REAL_RT(stream_create_flags_fn, f, "cudaStreamCreateWithFlags");
    return registered(f ? f(s, flags) : NO_RUNTIME, s);
}

SHIM_EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int prio)
{
    REAL_RT(stream_create_prio_fn, f, "cudaStreamCreateWithPriority");
    return registered(f ? f(s, flags, prio) : NO_RUNTIME, s);
}

SHIM_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    REAL_RT(stream_destroy_fn, f, "cudaStreamDestroy");
    /* With the driver door hooked, cudart's cuStreamDestroy does this. */
    if (shim_driver_hooked())
        return f ? f(s) : NO_RUNTIME;
    pools_stream_destroyed((CUstream)s);
    uint64_t claimed = capture_stream_ending((CUstream)s);
    cudaError_t e = f ? f(s) : NO_RUNTIME;
    capture_ending_done(claimed, e == cudaSuccess);
    if (e != cudaSuccess)
        streams_destroy_refused((CUstream)s);
    return e;
}

typedef cudaError_t (*set_pool_fn)(int, cudaMemPool_t);
typedef cudaError_t (*pool_attr_fn)(cudaMemPool_t, enum cudaMemPoolAttr, void *);
typedef cudaError_t (*pool_trim_fn)(cudaMemPool_t, size_t);

/* The default pool's figures include the shim's pools (service.c). With the
 * driver door hooked, cudart's own driver call already adjusted them. */
SHIM_EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr,
                                                void *value)
{
    REAL_RT(pool_attr_fn, f, "cudaMemPoolGetAttribute");
    svc_pool_query_begin();
    cudaError_t e = f ? f(pool, attr, value) : NO_RUNTIME;
    if (e == cudaSuccess && shim_active() && !svc_pool_query_done())
        svc_pool_get_attribute((CUmemoryPool)pool, (CUmemPool_attribute)attr, value);
    return e;
}

SHIM_EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr,
                                                void *value)
{
    REAL_RT(pool_attr_fn, f, "cudaMemPoolSetAttribute");
    svc_pool_query_begin();
    cudaError_t e = f ? f(pool, attr, value) : NO_RUNTIME;
    if (e == cudaSuccess && shim_active() && !svc_pool_query_done())
        svc_pool_set_attribute((CUmemoryPool)pool, (CUmemPool_attribute)attr);
    return e;
}

SHIM_EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep)
{
    REAL_RT(pool_trim_fn, f, "cudaMemPoolTrimTo");
    svc_pool_query_begin();
    cudaError_t e = f ? f(pool, keep) : NO_RUNTIME;
    if (e == cudaSuccess && shim_active() && !svc_pool_query_done())
        svc_pool_trim((CUmemoryPool)pool, keep);
    return e;
}

SHIM_EXPORT cudaError_t cudaDeviceSetMemPool(int dev, cudaMemPool_t pool)
{
    REAL_RT(set_pool_fn, f, "cudaDeviceSetMemPool");
    cudaError_t e = f ? f(dev, pool) : NO_RUNTIME;
    /* With the driver door hooked, cudart's cuDeviceSetMemPool tells us. */
    if (e == cudaSuccess && !shim_driver_hooked())
        svc_note_device_pool((CUdevice)dev, (CUmemoryPool)pool);
    return e;
}

SHIM_EXPORT cudaError_t cudaDeviceReset(void)
{
    REAL_RT(device_reset_fn, f, "cudaDeviceReset");
    REAL_RT(get_device_fn, get_device, "cudaGetDevice");
    int dev = 0;
    CUcontext ctx = NULL;
    if (get_device && get_device(&dev) == cudaSuccess) {
        ctx = real_active_primary(real_driver_get(), (CUdevice)dev);
        pools_primary_gone((CUdevice)dev);
        pools_wait_dead_trims();
    }
    uint64_t claimed = capture_context_ending(ctx); /* (cudart's own reset may claim first) */
    cudaError_t e = f ? f() : NO_RUNTIME;
    remembered_pools_stale();
    pools_give_back_forgotten(e == cudaSuccess);
    capture_ending_done(claimed, e == cudaSuccess);
    if (e == cudaSuccess)
        vmm_context_gone(ctx); /* "either device is reset" ends its peer access */
    return e;
}

/* Peer access over virtual memory: a pool grants it mapping by mapping
 * (vmm.c). With the driver door hooked, cudart's own cuCtxEnablePeerAccess
 * reaches the door, which tells the pool; with it closed only this door
 * sees the call, and tells the pool of the peer device's primary context,
 * whose memory the current device may now reach. */
static void peer_access_seen(int peer, bool enabled)
{
    if (!shim_driver_hooked())
        vmm_peer_access(real_active_primary(real_driver_get(), (CUdevice)peer), enabled);
}

SHIM_EXPORT cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags)
{
    REAL_RT(peer_enable_fn, f, "cudaDeviceEnablePeerAccess");
    cudaError_t e = f ? f(peer, flags) : NO_RUNTIME;
    if (e == cudaSuccess)
        peer_access_seen(peer, true);
    return e;
}

SHIM_EXPORT cudaError_t cudaDeviceDisablePeerAccess(int peer)
{
    REAL_RT(peer_disable_fn, f, "cudaDeviceDisablePeerAccess");
    cudaError_t e = f ? f(peer) : NO_RUNTIME;
    if (e == cudaSuccess)
        peer_access_seen(peer, false);
    return e;
}
