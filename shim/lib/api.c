/*
 * api.c - the explicit C interface of include/bfcshim.h: allocation on a
 * device and stream, memory info and trim, for programs and plug-ins that
 * call the library instead of (or besides) preloading it.
 *
 * It is a third door onto the same service as the runtime and driver doors:
 * the same per-context pools, lanes and error classes, so a Python plug-in
 * that dlopens the library in a preloaded process reaches the very pools the
 * preloaded doors serve (one copy of the library, one registry). Differences
 * from the doors, and why:
 *   - the caller names a device, not a current context: frameworks allocate
 *     for a device from threads where another device's context may be
 *     current, and the pool must be that device's primary context's;
 *   - when the library is not serving (platform mode, a forked child) the
 *     calls go to the real driver, so a plug-in needs no second code path;
 *   - results are plain CUresult values, which every language can read.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "bfcshim.h"
#include "shim.h"
#include "units.h"

SHIM_EXPORT int bfcshim_api_version(void) { return BFCSHIM_API_VERSION; }

SHIM_EXPORT int bfcshim_active(void) { return shim_active() ? 1 : 0; }

static CUresult fail(CUresult r, const char *api, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static CUresult fail(CUresult r, const char *api, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    shim_log(LOG_ERROR, "%s: %s", api, why);
    return r;
}

/* The context a call on `device` (and `stream`) means: an explicit stream's
 * own; else the current context when it is the device's (or device < 0);
 * else the device's primary context, which must be active (*is_current
 * false: another context is current, or none). */
static CUresult context_for(const real_driver *R, int device, CUstream s, CUcontext *out,
                            bool *is_current, const char *api)
{
    *is_current = false;
    if (device < -1)
        return fail(CUDA_ERROR_INVALID_VALUE, api,
                    "device %d: a device number, or -1 for the current context's device", device);
    if (svc_explicit_stream(s)) {
        if (!R->StreamGetCtx || R->StreamGetCtx(s, out) != CUDA_SUCCESS || !*out)
            return fail(CUDA_ERROR_INVALID_HANDLE, api, "stream %p is not a valid stream",
                        (void *)s);
        return CUDA_SUCCESS;
    }
    CUcontext cur = NULL;
    CUdevice dev = -1;
    if (R->CtxGetCurrent(&cur) == CUDA_SUCCESS && cur &&
        (device < 0 || (R->CtxGetDevice(&dev) == CUDA_SUCCESS && dev == device))) {
        *out = cur;
        *is_current = true;
        return CUDA_SUCCESS;
    }
    if (device >= 0 && (*out = real_active_primary(R, device)) != NULL)
        return CUDA_SUCCESS;
    if (device < 0)
        return fail(CUDA_ERROR_INVALID_CONTEXT, api,
                    "device -1 means the current context, and none is current");
    if (!streams_all_seen())
        return fail(CUDA_ERROR_INVALID_CONTEXT, api,
                    "device %d is not the current context's device: make a context of device "
                    "%d current first (loaded without LD_PRELOAD, the library cannot look up the "
                    "device's primary context without racing the program's own releases)",
                    device, device);
    return fail(CUDA_ERROR_INVALID_CONTEXT, api,
                "device %d has no active primary context (initialise CUDA on it first), or "
                "does not exist",
                device);
}

/* The driver, and the context the call means (context_for). */
static CUresult driver_and_context(int device, CUstream s, const real_driver **R,
                                   CUcontext *ctx, bool *is_current, const char *api)
{
    if (!(*R = real_driver_get()))
        return fail(CUDA_ERROR_NOT_INITIALIZED, api, "no CUDA driver (libcuda.so.1)");
    return context_for(*R, device, s, ctx, is_current, api);
}

/* Not served from a pool: the real driver's call in ctx, counted in
 * platform mode like the doors' pass-through calls. */
static CUresult pass_alloc(const real_driver *R, CUcontext ctx, size_t size, CUstream s,
                           bool stream_ordered, CUdeviceptr *out)
{
    bool pushed = real_ctx_enter(R, ctx);
    CUresult r = stream_ordered && R->MemAllocAsync[0] ? R->MemAllocAsync[0](out, size, s)
                                                        : R->MemAlloc(out, size);
    real_ctx_leave(R, pushed);
    if (r == CUDA_SUCCESS && platform_counting())
        platform_note_alloc(*out, size);
    return r;
}

/* The pool of ctx for a plug-in call. Where the library sees no context
 * go (loaded without LD_PRELOAD), a pool whose context was destroyed and
 * made again under the same handle (Numba's cuda.close(), a
 * cudaDeviceReset) is noticed here and replaced: its memory went with the
 * old context, and its events are dead handles. */
static shim_pool *api_pool(CUcontext ctx)
{
    shim_pool *sp = pool_for_context(ctx, true);
    if (sp && !streams_all_seen() && pools_forget_if_replaced(sp))
        sp = pool_for_context(ctx, true);
    return sp;
}

/* The pool owning p for a plug-in free; NULL when none does, or (unseen)
 * when its context went since: the pointer went with it. */
static shim_pool *api_owner(CUdeviceptr p)
{
    shim_pool *sp = pool_owning(p);
    if (sp && !streams_all_seen() && pools_forget_if_replaced(sp))
        return NULL;
    return sp;
}

/* zero_is_devices: a legacy stream (0) names the default stream of the
 * context the allocation is made in (PyTorch's entry points), not the
 * current context's (cudaMallocAsync's, bfcshim_malloc_async's). */
static int api_alloc(void **ptr, size_t size, int device, CUstream s, bool stream_ordered,
                     bool zero_is_devices, const char *api)
{
    if (!ptr)
        return fail(CUDA_ERROR_INVALID_VALUE, api, "NULL result pointer");
    *ptr = NULL;
    /* cudaMalloc and cudaMallocAsync answer size 0 with success and no
     * memory, and the header promises their behaviour: NULL, no log line,
     * no pool or driver involved. */
    if (size == 0)
        return CUDA_SUCCESS;
    const real_driver *R;
    CUcontext ctx = NULL;
    bool is_current = false;
    CUresult r = driver_and_context(device, s, &R, &ctx, &is_current, api);
    if (r != CUDA_SUCCESS)
        return r;
    CUdeviceptr p = 0;
    shim_pool *sp = shim_active() ? api_pool(ctx) : NULL;
    /* Whether the stream is usable. PyTorch's 0 names the legacy stream of
     * ctx (zero_is_devices), which need not be current: asked with ctx
     * current, only while a capture may be under way and another context
     * is current (is_current: known already). Asked of the current
     * context's legacy stream instead, a capture blocking ctx's let the
     * pool serve an allocation CUDA refuses (and whose refusal invalidates
     * that capture), and one blocking the current context's sent a
     * servable allocation to the driver (e2e_api
     * torch-alloc-other-current-pool, -current; found by an audit; the
     * free side's twin is torch-legacy-capture). */
    svc_stream_state state = STREAM_USABLE;
    if (sp && stream_ordered) {
        const bool pushed = zero_is_devices && !is_current && (s == NULL || s == CU_STREAM_LEGACY) &&
                            !capture_none() && real_ctx_enter(R, ctx);
        state = svc_stream_state_of(s, false);
        real_ctx_leave(R, pushed);
    }
    if (!sp || state != STREAM_USABLE) {
        /* A capturing stream's allocation belongs to the graph, and the
         * driver refuses one on a blocked or dead stream (as at the doors);
         * no pool (not serving, or none could be made): the driver. */
        if (sp)
            svc_note_passthrough();
        r = pass_alloc(R, ctx, size, s, stream_ordered, &p);
    } else {
        /* 0 of bfcshim_malloc_async names the current context's legacy
         * stream, as cudaMallocAsync's (and bfcshim_free_async's) does:
         * with another context current than the pool's, not the stream the
         * pool's legacy lane stands for, whose blocks are then taken only
         * once their fence completed (e2e_api
         * malloc-async-other-device-zero: the block came back in the pool's
         * legacy stream order, and the current device's legacy stream,
         * which that order does not reach, ran its new owner's work before
         * the old). */
        const bool foreign_zero =
            !svc_explicit_stream(s) && !is_current && !zero_is_devices;
        uint32_t lane = stream_ordered && !foreign_zero ? pool_lane_for_alloc(sp, s, false)
                                                        : BFC_NO_LANE;
        r = svc_cuda_result(svc_alloc(sp, size, lane, s, &p, api));
    }
    if (r == CUDA_SUCCESS)
        *ptr = (void *)(uintptr_t)p;
    return (int)r;
}

/* device: the block's device as the caller names it (PyTorch's pluggable
 * allocator does), or -1. */
static int api_free(void *ptr, CUstream s, bool stream_ordered, int device, const char *api)
{
    if (!ptr)
        return CUDA_SUCCESS;
    const real_driver *R = real_driver_get();
    if (!R)
        return fail(CUDA_ERROR_NOT_INITIALIZED, api, "no CUDA driver (libcuda.so.1)");
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
    /* The owner, looked up once (a pool whose context went unseen is
     * forgotten here first). A plug-in's finalizer may free a block after
     * its context went (the program reset the device, or released its
     * primary context, first): the memory went with the context, and the
     * address may be someone else's allocation now. Nothing to do, and
     * nothing for the driver. */
    shim_pool *owner = shim_active() ? api_owner(p) : NULL;
    if (shim_active() && !owner && pools_dead_block(p)) {
        static atomic_bool said;
        shim_log_once(&said, LOG_INFO, "%s(%p): its pool's context went first; the block went "
                                       "with it (logged once)", api, ptr);
        return CUDA_SUCCESS;
    }
    /* A plug-in may free on a stream the program destroyed since (CuPy
     * frees an array on its allocation stream, also after a Stream object
     * collected before its arrays). A dead handle must not reach the driver
     * nor open a lane; where the library sees every stream and saw this one
     * destroyed as a stream of the block's context (one of the last 1024
     * destroyed), the free becomes a plain one, which waits for everything
     * queued before it, the dead stream's work included (its stand-in, of
     * the block's pool), under every policy: the immediate one's promise is
     * about plain frees, not this stream-ordered one (e2e_api
     * dead-stream-immediate). Another context's dead stream is covered by
     * no fence of the block's pool (its stand-in, if any, is its own
     * context's pool's), and the context of a handle not remembered is not
     * known: those frees are refused, as CUDA refuses a dead handle, the
     * block staying the program's (e2e_api dead-stream-other-device: made
     * plain, the block came back under the dead stream's queued work;
     * found by an audit). With the driver door closed a handle the registry
     * does not know may be a live stream made through a driver function
     * found by dlsym: svc_free asks the driver about it, and refuses it if
     * it names no stream. */
    bool fenced = false;
    if (stream_ordered && svc_explicit_stream(s) && owner && streams_all_seen() &&
        !streams_known(s)) {
        if (pools_context_is(owner, streams_dead_context(s))) {
            static atomic_bool said;
            shim_log_once(&said, LOG_INFO,
                          "%s on stream %p, which is not a live stream (destroyed?): freed as "
                          "bfcshim_free (logged once)", api, (void *)s);
            stream_ordered = false;
            s = NULL;
            fenced = true;
        } else if (shim_driver_hooked()) {
            return fail(CUDA_ERROR_INVALID_HANDLE, api,
                        "%p on stream %p, which is not a live stream of the block's context "
                        "(destroyed?): refused, the block is still the program's", ptr,
                        (void *)s);
        }
    }
    /* Streams the block was recorded on (Tensor.record_stream): their work
     * queued so far is waited for by the free's stream, or the free becomes
     * a plain one, or the block is kept (recorded_streams.c). One atomic
     * load when nothing is recorded. */
    void *held = NULL; /* the block's record, until the free's outcome is known */
    /* the free's stream as the record's decision found it unusable: the
     * free acts on that answer (svc_free_seen), never on a later one */
    svc_stream_state unusable = STREAM_USABLE;
    /* A legacy stream the caller names with the block's device is the one
     * of the context the block was allocated in (bfcshim.h: PyTorch frees
     * on the device and stream it allocated with, in primary contexts
     * only), its pool's: nothing to ask, whatever context is current. */
    const bool device_named = owner && device >= 0 && owner->dev == device;
    if (owner) {
        rs_verdict v = recorded_streams_before_free(owner, p, stream_ordered, s, device_named,
                                                    api, &unusable, &held);
        if (v == RS_KEEP) {
            recorded_streams_after_free(held, true);
            return CUDA_SUCCESS;
        }
        if (v == RS_PLAIN) {
            /* Fenced under every policy: the immediate one's promise (the
             * program freed nothing still in use) is not kept by a
             * stream-ordered free (e2e_api torch-record-immediate). */
            stream_ordered = false;
            s = NULL;
            fenced = true;
        }
    }
    free_kind kind = fenced            ? FREE_PLAIN_FENCED
                     : !stream_ordered ? FREE_PLAIN
                     : device_named    ? FREE_STREAM_DEVICE
                                       : FREE_STREAM;
    svc_status st = !shim_active()                ? SVC_PASS
                    : unusable != STREAM_USABLE ? svc_free_seen(p, kind, s, false, unusable, api)
                                                : svc_free(p, kind, s, false, api);
    if (held) /* refused (capturing legacy stream, dead stream): still recorded */
        recorded_streams_after_free(held, st == SVC_OK);
    /* Where the library cannot see the stream destroyed (loaded without
     * LD_PRELOAD), the free's epoch is sealed now, while the caller
     * guarantees the stream exists: a seal at a later allocation could meet
     * a dead handle (the CuPy plug-in keeps its Stream only until here). */
    if (st == SVC_OK && owner && stream_ordered && svc_explicit_stream(s) && !streams_all_seen())
        pools_seal_stream_lane(owner, s);
    if (st != SVC_PASS)
        return (int)svc_cuda_result(st);
    /* Not pooled: the driver's memory (passed through, or the caller's). */
    CUresult r = stream_ordered && R->MemFreeAsync[0] ? R->MemFreeAsync[0](p, s) : R->MemFree(p);
    if (r == CUDA_SUCCESS && platform_counting())
        platform_note_free(p);
    if (r != CUDA_SUCCESS)
        return fail(r, api, "%p is not a pooled pointer, and the driver refused it (%d)", ptr,
                    (int)r);
    return CUDA_SUCCESS;
}

SHIM_EXPORT int bfcshim_malloc(void **ptr, size_t size, int device)
{
    return api_alloc(ptr, size, device, NULL, false, false, "bfcshim_malloc");
}

SHIM_EXPORT int bfcshim_free(void *ptr)
{
    return api_free(ptr, NULL, false, -1, "bfcshim_free");
}

SHIM_EXPORT int bfcshim_malloc_async(void **ptr, size_t size, int device, void *stream)
{
    return api_alloc(ptr, size, device, (CUstream)stream, true, false, "bfcshim_malloc_async");
}

SHIM_EXPORT int bfcshim_free_async(void *ptr, void *stream)
{
    return api_free(ptr, (CUstream)stream, true, -1, "bfcshim_free_async");
}

/* PyTorch asks for size 0 never through its caching allocator, but a
 * pluggable allocator sees what the program asks: an empty tensor gets NULL,
 * which PyTorch accepts for 0 bytes, and no error is logged. */
SHIM_EXPORT void *bfcshim_torch_alloc(ssize_t size, int device, void *stream)
{
    void *p = NULL;
    if (size > 0)
        api_alloc(&p, (size_t)size, device, (CUstream)stream, true, true, "bfcshim_torch_alloc");
    else if (size < 0)
        fail(CUDA_ERROR_INVALID_VALUE, "bfcshim_torch_alloc", "negative size %zd", size);
    return p;
}

SHIM_EXPORT void bfcshim_torch_free(void *ptr, size_t size, int device, void *stream)
{
    (void)size; /* the pool knows it */
    api_free(ptr, (CUstream)stream, true, device, "bfcshim_torch_free");
}

/* Tensor.record_stream(stream) of a tensor at ptr (PyTorch's
 * set_record_stream_fn): remembered for the block's free. Not a live block's
 * start: one log line, nothing else. */
SHIM_EXPORT void bfcshim_torch_record_stream(void *ptr, void *stream)
{
    const char *api = "bfcshim_torch_record_stream";
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
    if (!ptr || !shim_active() || !real_driver_get()) {
        if (ptr && !shim_active()) {
            static atomic_bool said;
            shim_log_once(&said, LOG_WARN, "%s: the library is not serving (platform mode or "
                                           "a forked child): not honoured (logged once)", api);
        }
        return;
    }
    shim_pool *owner = api_owner(p);
    bfc_live_info li;
    if (!owner || bfc_pool_block(owner->bfc, p, &li) != BFC_OK || li.addr != p) {
        shim_log(LOG_ERROR, "%s(%p, %p): not the start of a live pooled allocation; ignored",
                 api, ptr, stream);
        return;
    }
    recorded_stream_add(owner, p, li.seq, (CUstream)stream, api);
}

SHIM_EXPORT int bfcshim_mem_get_info(int device, size_t *free_bytes, size_t *total_bytes)
{
    const char *api = "bfcshim_mem_get_info";
    if (!free_bytes || !total_bytes)
        return fail(CUDA_ERROR_INVALID_VALUE, api, "NULL result pointer");
    const real_driver *R;
    CUcontext ctx = NULL;
    bool is_current = false;
    CUresult r = driver_and_context(device, NULL, &R, &ctx, &is_current, api);
    if (r != CUDA_SUCCESS)
        return r;
    bool pushed = real_ctx_enter(R, ctx);
    r = R->MemGetInfo(free_bytes, total_bytes);
    if (r == CUDA_SUCCESS && shim_active())
        svc_adjust_meminfo(free_bytes, *total_bytes); /* the pool of ctx, now current */
    real_ctx_leave(R, pushed);
    return (int)r;
}

SHIM_EXPORT size_t bfcshim_trim(void)
{
    const real_driver *R = real_driver_get();
    if (!R || !shim_active())
        return 0;
    uint64_t released = 0;
    for (size_t i = 0; i < pools_count(); i++) {
        shim_pool *sp = pools_at(i);
        /* (a pool whose context went unseen is forgotten, not trimmed: its
         * regions went with the context, their addresses maybe reused) */
        if (!sp || atomic_load(&sp->dead) || (!streams_all_seen() && pools_forget_if_replaced(sp)))
            continue;
        released += pools_trim(sp, false);
    }
    char b[32];
    shim_log(LOG_INFO, "bfcshim_trim: %s given back to the device",
             format_size(released, b, sizeof b));
    return (size_t)released;
}
