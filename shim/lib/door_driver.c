/*
 * door_driver.c - the driver API door: cuMemAlloc_v2 and friends.
 *
 * Programs reach these by linking against libcuda (the preload wins), by
 * dlsym on their own libcuda handle (dlsym_hook.c) or through
 * cuGetProcAddress (procaddr.c); cudart reaches them the last way, so the
 * runtime calls of a program with a static cudart land here too.
 *
 * Every function passes straight through when the door is closed
 * (BFCSHIM_DRIVER_HOOKS=0, platform mode, a forked child, or a call the
 * shim itself makes into the real runtime), when no context is current, and
 * for pointers no pool owns. Only the _v2 ABI of the allocation calls exists
 * here: the v1 entry points (cuMemAlloc, cuMemFree, cuMemAllocPitch,
 * cuMemGetInfo, cuMemGetAddressRange) take 32-bit device pointers and
 * sizes, which cannot name the pool's blocks, and no current toolkit emits
 * references to them: they reach the driver untouched. The v1 entry points
 * of the calls that keep books (cuStreamDestroy, cuCtxDestroy,
 * cuDevicePrimaryCtxRelease and _Reset; cuCtxCreate and
 * cuStreamBeginCapture elsewhere) take the _v2's arguments and are hooked
 * like them: libcuda still exports them and hands them to cuGetProcAddress
 * below the _v2's version, and one that slipped by would leave a dead
 * stream registered or a dead context's pool in use.
 *
 * The stream calls only register streams (streams.c) so that plain frees
 * can be fenced on every stream; the context calls forget pools whose memory
 * went away with their context.
 */
#include "shim.h"

/* The real function's answer, or CUDA_ERROR_NOT_INITIALIZED when there is
 * no driver. */
#define PASS(field, ...) \
    (REAL(field) ? REAL(field)(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)

static CUresult refuse(const char *api, const char *why)
{
    shim_log(LOG_ERROR, "%s: %s", api, why);
    return CUDA_ERROR_INVALID_VALUE;
}

/* A pointer no pool owns goes to the real free; when that refuses it too, the
 * user hears which pointer it was. */
static CUresult foreign_result(CUresult r, const char *api, CUdeviceptr p)
{
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED)
        shim_log(LOG_ERROR, "%s(0x%llx): not a pooled pointer, and the driver refused it (%d)",
                 api, (unsigned long long)p, (int)r);
    return r;
}

/* Platform mode passes everything through but still counts what is live. */
static CUresult counted_alloc(CUresult r, CUdeviceptr *dptr, size_t size)
{
    if (r == CUDA_SUCCESS && dptr && platform_counting())
        platform_note_alloc(*dptr, size);
    return r;
}

static CUresult counted_free(CUresult r, CUdeviceptr p)
{
    if (r == CUDA_SUCCESS && platform_counting())
        platform_note_free(p);
    return r;
}

/* ---- plain allocation ------------------------------------------------------------ */

SHIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    shim_pool *sp;
    if (!shim_driver_door() || !(sp = svc_current_pool()))
        return counted_alloc(PASS(MemAlloc, dptr, size), dptr, size);
    if (!dptr)
        return refuse("cuMemAlloc_v2", "NULL result pointer");
    if (size == 0)
        return refuse("cuMemAlloc_v2", "size 0 (the driver refuses it too)");
    svc_next_alloc_in_current_context();
    return svc_cuda_result(svc_alloc(sp, size, BFC_NO_LANE, NULL, dptr, "cuMemAlloc_v2"));
}

SHIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
    if (!shim_pointer_door() || p == 0)
        return counted_free(PASS(MemFree, p), p);
    svc_status st = svc_free(p, FREE_PLAIN, NULL, false, "cuMemFree_v2");
    if (st == SVC_PASS)
        return foreign_result(PASS(MemFree, p), "cuMemFree_v2", p);
    return svc_cuda_result(st);
}

SHIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                        size_t height, unsigned element_size)
{
    shim_pool *sp;
    if (!shim_driver_door() || !(sp = svc_current_pool())) {
        CUresult r = PASS(MemAllocPitch, dptr, pitch, width, height, element_size);
        return counted_alloc(r, dptr, r == CUDA_SUCCESS && pitch ? *pitch * height : 0);
    }
    size_t p = 0, bytes = 0;
    if (!dptr || !pitch)
        return refuse("cuMemAllocPitch_v2", "NULL result pointer");
    if (!svc_pitch(sp, width, height, element_size, &p, &bytes))
        return refuse("cuMemAllocPitch_v2", "zero width or height, element size not 4, 8 or "
                                            "16, or a size that overflows");
    svc_next_alloc_in_current_context();
    CUresult r =
        svc_cuda_result(svc_alloc(sp, bytes, BFC_NO_LANE, NULL, dptr, "cuMemAllocPitch_v2"));
    if (r == CUDA_SUCCESS)
        *pitch = p;
    return r;
}

/* ---- queries --------------------------------------------------------------------- */

SHIM_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    CUresult r = PASS(MemGetInfo, free_bytes, total);
    if (r == CUDA_SUCCESS && total && shim_driver_door())
        svc_adjust_meminfo(free_bytes, *total);
    return r;
}

/* The real call would answer with the whole pool region. */
SHIM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    shim_pool *sp;
    if (!shim_pointer_door() || !(sp = pool_owning(p)))
        return PASS(MemGetAddressRange, base, size, p);
    bfc_addr b = 0;
    uint64_t n = 0;
    if (bfc_pool_lookup(sp->bfc, p, &b, &n) != BFC_OK)
        return CUDA_ERROR_NOT_FOUND;
    if (base)
        *base = (CUdeviceptr)b;
    if (size)
        *size = (size_t)n;
    return CUDA_SUCCESS;
}

/* What a pointer attribute is for a pooled pointer, where the pool knows
 * better than the driver, which sees only the region (a cuMemAlloc region,
 * or granules mapped over virtual memory): the block's range and buffer id;
 * the pool's context and device, as for the cudaMalloc memory the block
 * stands for (over virtual memory the driver may name no context); and no
 * legacy IPC (cuIpcGetMemHandle of a pooled block is refused, so a library
 * that asks first, as UCX does, takes another way instead of failing). The
 * rest (memory type, mapping, access) is the region's, asked of the driver.
 * `live` is false for a pointer into the region outside any live block: no
 * valid CUDA pointer. */
static bool pooled_attribute(const shim_pool *sp, const bfc_live_info *b, bool live,
                             CUpointer_attribute attr, void *data)
{
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = live ? (CUdeviceptr)b->addr : 0;
        return true;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = live ? (size_t)b->requested : 0;
        return true;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = live ? svc_buffer_id(sp, b->seq) : 0;
        return true;
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = live ? sp->ctx : NULL;
        return true;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = live ? (int)sp->dev : -1;
        return true;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(int *)data = 0;
        return true;
    default:
        return false;
    }
}

SHIM_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p)
{
    shim_pool *sp;
    if (!shim_pointer_door() || !data || !(sp = pool_owning(p)))
        return PASS(PointerGetAttribute, data, attr, p);
    bfc_live_info b;
    /* "If ptr is not a valid CUDA pointer then CUDA_ERROR_INVALID_VALUE" */
    if (bfc_pool_block(sp->bfc, p, &b) != BFC_OK)
        return CUDA_ERROR_INVALID_VALUE;
    if (pooled_attribute(sp, &b, true, attr, data))
        return CUDA_SUCCESS;
    return PASS(PointerGetAttribute, data, attr, p);
}

/* The pool answers its attributes; the driver is asked only for the others
 * (compacted into arrays of their own, ATTRS_MAX at a time), so an
 * attribute the driver would refuse for the region, but the pool can
 * answer, does not fail the call. */
enum { ATTRS_MAX = 32 };

SHIM_EXPORT CUresult cuPointerGetAttributes(unsigned n, CUpointer_attribute *attrs, void **data,
                                            CUdeviceptr p)
{
    shim_pool *sp;
    if (!attrs || !data || !shim_pointer_door() || !(sp = pool_owning(p)))
        return PASS(PointerGetAttributes, n, attrs, data, p);
    bfc_live_info b = {0};
    bool live = bfc_pool_block(sp->bfc, p, &b) == BFC_OK;
    /* Free space of a pool (a freed block) is no CUDA pointer to the
     * program: cuda.h, "the attributes are assigned default NULL values and
     * CUDA_SUCCESS is returned", as the driver assigns them for an address
     * it never gave out (NULL), not the values of the region behind it
     * (found by an audit: a freed block read as mapped device memory). */
    if (!live)
        return PASS(PointerGetAttributes, n, attrs, data, (CUdeviceptr)0);
    CUpointer_attribute rest[ATTRS_MAX];
    void *rest_data[ATTRS_MAX];
    unsigned nrest = 0;
    CUresult r = CUDA_SUCCESS;
    for (unsigned i = 0; i < n && r == CUDA_SUCCESS; i++) {
        if (data[i] && pooled_attribute(sp, &b, live, attrs[i], data[i]))
            continue;
        rest[nrest] = attrs[i];
        rest_data[nrest++] = data[i];
        if (nrest == ATTRS_MAX) {
            r = PASS(PointerGetAttributes, nrest, rest, rest_data, p);
            nrest = 0;
        }
    }
    if (r == CUDA_SUCCESS && nrest)
        r = PASS(PointerGetAttributes, nrest, rest, rest_data, p);
    return r;
}

SHIM_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr p)
{
    if (shim_pointer_door()) {
        svc_status st = svc_ipc_check(p, "cuIpcGetMemHandle");
        if (st != SVC_PASS)
            return svc_cuda_result(st);
    }
    return PASS(IpcGetMemHandle, handle, p);
}

/* ---- stream-ordered allocation --------------------------------------------------- */

/* z: 0 for the plain entry point, 1 for _ptsz (stream 0 is per-thread). */
static CUresult alloc_async(int z, CUdeviceptr *dptr, size_t size, CUstream s, const char *api)
{
    if (!shim_driver_door() || size == 0 || !dptr)
        return counted_alloc(PASS(MemAllocAsync[z], dptr, size, s), dptr, size);
    /* The stream's device, not the current one; and its default pool only. */
    shim_pool *sp = svc_async_pool(s, z, svc_current_pool);
    if (!sp || !svc_default_pool_current(sp->dev)) {
        svc_note_passthrough();
        return PASS(MemAllocAsync[z], dptr, size, s);
    }
    if (!svc_explicit_stream(s)) /* (svc_current_pool's) */
        svc_next_alloc_in_current_context();
    return svc_cuda_result(svc_alloc(sp, size, pool_lane_for_alloc(sp, s, z), s, dptr, api));
}

static CUresult free_async(int z, CUdeviceptr p, CUstream s, const char *api)
{
    if (!shim_pointer_door() || p == 0)
        return counted_free(PASS(MemFreeAsync[z], p, s), p);
    svc_status st = svc_free(p, FREE_STREAM, s, z, api);
    if (st == SVC_PASS)
        return foreign_result(PASS(MemFreeAsync[z], p, s), api, p);
    return svc_cuda_result(st);
}

static CUresult alloc_from_pool(int z, CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                CUstream s, const char *api)
{
    if (!shim_driver_door() || size == 0 || !dptr)
        return PASS(MemAllocFromPoolAsync[z], dptr, size, pool, s);
    shim_pool *sp = svc_async_pool(s, z, svc_current_pool);
    if (!sp || !svc_is_default_pool(sp, pool)) {
        svc_note_passthrough();
        return PASS(MemAllocFromPoolAsync[z], dptr, size, pool, s);
    }
    if (!svc_explicit_stream(s)) /* (svc_current_pool's) */
        svc_next_alloc_in_current_context();
    return svc_cuda_result(svc_alloc(sp, size, pool_lane_for_alloc(sp, s, z), s, dptr, api));
}

SHIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s)
{
    return alloc_async(0, dptr, size, s, "cuMemAllocAsync");
}

SHIM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s)
{
    return alloc_async(1, dptr, size, s, "cuMemAllocAsync_ptsz");
}

SHIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    return free_async(0, p, s, "cuMemFreeAsync");
}

SHIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
    return free_async(1, p, s, "cuMemFreeAsync_ptsz");
}

SHIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                             CUstream s)
{
    return alloc_from_pool(0, dptr, size, pool, s, "cuMemAllocFromPoolAsync");
}

SHIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size,
                                                  CUmemoryPool pool, CUstream s)
{
    return alloc_from_pool(1, dptr, size, pool, s, "cuMemAllocFromPoolAsync_ptsz");
}

/* ---- streams and contexts -------------------------------------------------------- */

/* Streams are registered whether or not the pool is active yet: a plain free
 * later must know every stream that might still use its block. */
SHIM_EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags)
{
    CUresult r = PASS(StreamCreate, s, flags);
    if (r == CUDA_SUCCESS && s && (r = streams_add(*s)) != CUDA_SUCCESS)
        *s = NULL;
    return r;
}

SHIM_EXPORT CUresult cuStreamCreateWithPriority(CUstream *s, unsigned flags, int priority)
{
    CUresult r = PASS(StreamCreateWithPriority, s, flags, priority);
    if (r == CUDA_SUCCESS && s && (r = streams_add(*s)) != CUDA_SUCCESS)
        *s = NULL;
    return r;
}

/* The real call f, or CUDA_ERROR_NOT_INITIALIZED when the driver lacks it. */
#define CALL(f, ...) ((f) ? (f)(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)

/* Both versions of the destroy (f): the v1 that old binaries and
 * cuGetProcAddress below 4000 reach takes the same arguments, and a stream
 * it destroys unseen would stay registered, a handle the next seal records
 * on after it died (e2e_fences stream-destroy-v1). A stream destroyed while
 * it captures takes its capture with it (capture.c). */
static CUresult stream_destroy(CUresult (*f)(CUstream), CUstream s)
{
    pools_stream_destroyed(s);
    uint64_t claimed = capture_stream_ending(s);
    CUresult r = CALL(f, s);
    capture_ending_done(claimed, r == CUDA_SUCCESS);
    if (r != CUDA_SUCCESS)
        streams_destroy_refused(s);
    return r;
}

SHIM_EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
    return stream_destroy(REAL(StreamDestroy), s);
}

SHIM_EXPORT CUresult shim_cuStreamDestroy_v1(CUstream s)
{
    return stream_destroy(REAL(StreamDestroyV1), s);
}

SHIM_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    CUresult r = PASS(DeviceSetMemPool, dev, pool);
    if (r == CUDA_SUCCESS)
        svc_note_device_pool(dev, pool);
    return r;
}

/* cuda.h: "Destroying the current mempool of a device sets the default
 * mempool of that device as the current mempool for that device": the
 * shim serves that device's stream-ordered allocations again (found by an
 * audit: after a program destroyed its current pool, every later one went
 * to the driver for the rest of the run, outside the limit and the
 * statistics). */
SHIM_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    CUresult r = PASS(MemPoolDestroy, pool);
    if (r == CUDA_SUCCESS)
        svc_note_pool_destroyed(pool);
    return r;
}

/* The default pool's figures include the shim's pools, which serve it. */
SHIM_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                           void *value)
{
    CUresult r = PASS(MemPoolGetAttribute, pool, attr, value);
    if (r == CUDA_SUCCESS && shim_driver_door())
        svc_pool_get_attribute(pool, attr, value);
    return r;
}

SHIM_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                           void *value)
{
    CUresult r = PASS(MemPoolSetAttribute, pool, attr, value);
    if (r == CUDA_SUCCESS && shim_driver_door())
        svc_pool_set_attribute(pool, attr);
    return r;
}

SHIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    CUresult r = PASS(MemPoolTrimTo, pool, keep);
    if (r == CUDA_SUCCESS && shim_driver_door())
        svc_pool_trim(pool, keep);
    return r;
}

/* Both versions of the destroy (f), as for streams (the v1: CUDA 2.0's,
 * e2e_fences ctx-reuse-v1). */
static CUresult ctx_destroy(CUresult (*f)(CUcontext), CUcontext ctx)
{
    /* A created context's pool is forgotten before the call, so that no new
     * context under the same handle can meet it. A primary context is
     * refused (CUDA_ERROR_INVALID_CONTEXT: its life is the primary calls')
     * and lives on with its pool and its streams; should a driver destroy it
     * after all, they go after the call, the retains held off meanwhile.
     * Whether it is primary is the driver's answer, not the pools': a
     * primary context without a pool yet has streams all the same, and
     * forgetting them before a refused call left later plain frees unfenced
     * against their work (e2e_driver destroy-primary-streams). */
    /* Asked under the primary contexts' lock: a retain in another thread
     * between the question and the forgetting could make the primary
     * context active under this handle. */
    primary_lock();
    bool primary = pools_context_is_primary(ctx) || real_is_primary(real_driver_get(), ctx);
    uint64_t claimed = capture_context_ending(ctx); /* its streams' captures */
    if (!primary) {
        pools_context_gone(ctx);
        primary_unlock(); /* a created context's destroy may take long: not held */
        pools_wait_dead_trims();
    } else {
        pools_hold_trims(ctx, true);
    }
    CUresult r = CALL(f, ctx);
    remembered_pools_stale();
    if (primary && r == CUDA_SUCCESS)
        pools_context_gone(ctx);
    if (primary)
        pools_hold_trims(ctx, false);
    pools_give_back_forgotten(r == CUDA_SUCCESS);
    capture_ending_done(claimed, r == CUDA_SUCCESS);
    if (r == CUDA_SUCCESS)
        vmm_context_gone(ctx); /* the peer access it enabled went with it */
    if (primary)
        primary_unlock();
    return r;
}

SHIM_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) { return ctx_destroy(REAL(CtxDestroy), ctx); }

SHIM_EXPORT CUresult shim_cuCtxDestroy_v1(CUcontext ctx)
{
    return ctx_destroy(REAL(CtxDestroyV1), ctx);
}

/* The deprecated usage-count release (CUDA 2.0; PyCUDA's Context.detach):
 * it destroys the context when the count reaches 0, and the context must be
 * current to the caller, so a destroying detach also pops it. Whether it
 * destroyed is learnt afterwards: popped from the thread's stack, it went;
 * still current, it may have gone too, since a destroying detach pops only
 * the top of the stack and a context pushed twice stays current beneath,
 * dead (e2e_current detach-stacked: taken for a count-down, its pool served
 * the next context made under the handle). Then its id ("unique for the
 * life of the program"), asked before and after, decides: another one, or
 * no live context under the handle (CUDA_ERROR_CONTEXT_IS_DESTROYED,
 * CUDA_ERROR_INVALID_CONTEXT), means it went; another failure says nothing
 * and keeps the pool (pools_identity_of). Without cuCtxGetId (a driver before 12.0) the
 * current context alone decides. Gone, it goes as a destroy's does (pool,
 * streams, captures, peer mappings), after the real call: the program
 * detaches only a context it has finished with. Either way the remembered
 * current context is forgotten (e2e_current detach, detach-reuse). */
SHIM_EXPORT CUresult cuCtxDetach(CUcontext ctx)
{
    const real_driver *R = real_driver_get();
    uint64_t claimed = capture_context_ending(ctx);
    pools_hold_trims(ctx, true); /* maybe the last reference */
    unsigned long long id = 0;
    bool by_id = ctx && R && R->CtxGetId && R->CtxGetId(ctx, &id) == CUDA_SUCCESS && id;
    CUcontext cur = NULL;
    const bool was_current = ctx && R && R->CtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx;
    CUresult r = PASS(CtxDetach, ctx);
    /* Popped (current before, not after): gone. Still current, or never
     * current (a driver that lets a program break the rule and count down a
     * context it has not made current must not cost that context its
     * pool): gone only if its id says so. The question is then asked of the
     * thread's current context, which the driver must answer
     * (CUDA_ERROR_CONTEXT_IS_DESTROYED), or of a context the program should
     * not have detached; never of a handle popped off the stack. Only an
     * answer says "gone" (another id, or no live context under the handle):
     * a failure that says nothing of the context (an earlier launch's
     * error) keeps its pool, which live blocks may still use (e2e_current
     * detach-id-fails: the pool was forgotten and the live block's memory
     * given back). Without cuCtxGetId, as before 12.0, the current context
     * alone decides. */
    cur = NULL;
    bool popped = r == CUDA_SUCCESS && ctx && R && R->CtxGetCurrent(&cur) == CUDA_SUCCESS &&
                  cur != ctx && (was_current || !by_id);
    bool gone = popped || (r == CUDA_SUCCESS && by_id && pools_identity_of(ctx, id) == CTX_REPLACED);
    remembered_pools_stale();
    if (gone)
        pools_context_gone(ctx);
    pools_hold_trims(ctx, false);
    pools_give_back_forgotten(gone);
    capture_ending_done(claimed, gone);
    if (gone)
        vmm_context_gone(ctx);
    return r;
}

/* Peer access reaches pooled memory through the real call for regions from
 * cuMemAlloc; over virtual memory the pool must grant it mapping by mapping. */
SHIM_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags)
{
    CUresult r = PASS(CtxEnablePeerAccess, peer, flags);
    if (r == CUDA_SUCCESS)
        vmm_peer_access(peer, true);
    return r;
}

/* ... and taken back mapping by mapping, where cuMemAlloc's regions lose it
 * in the real call. */
SHIM_EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peer)
{
    CUresult r = PASS(CtxDisablePeerAccess, peer);
    if (r == CUDA_SUCCESS)
        vmm_peer_access(peer, false);
    return r;
}

/* Both versions of the reset (f; the v1: CUDA 7.0's, e2e_driver
 * primary-v1). */
static CUresult primary_reset(CUresult (*f)(CUdevice), CUdevice dev)
{
    primary_lock();
    CUcontext ctx = real_active_primary(real_driver_get(), dev);
    uint64_t claimed = capture_context_ending(ctx);
    pools_primary_gone(dev);
    pools_wait_dead_trims();
    CUresult r = CALL(f, dev);
    remembered_pools_stale();
    pools_give_back_forgotten(r == CUDA_SUCCESS);
    capture_ending_done(claimed, r == CUDA_SUCCESS);
    if (r == CUDA_SUCCESS)
        vmm_context_gone(ctx);
    primary_unlock();
    return r;
}

SHIM_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return primary_reset(REAL(DevicePrimaryCtxReset), dev);
}

SHIM_EXPORT CUresult shim_cuDevicePrimaryCtxReset_v1(CUdevice dev)
{
    return primary_reset(REAL(DevicePrimaryCtxResetV1), dev);
}

/* Only to take the primary contexts' lock (real.c): a retain must not slip
 * in between another thread's release and its look at what remains. */
SHIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    primary_lock();
    CUresult r = PASS(DevicePrimaryCtxRetain, ctx, dev);
    primary_unlock();
    if (r == CUDA_SUCCESS && ctx)
        fences_context_seen(*ctx);
    return r;
}

/* Contexts created: only told to the fences (a second context ends the
 * ordered state, fences.c). Every version, since a program built against
 * any toolkit may call any of them. */
static CUresult created(CUresult r, CUcontext *c)
{
    current_context_moved(); /* the new context is pushed */
    if (r == CUDA_SUCCESS && c)
        fences_context_seen(*c);
    return r;
}

SHIM_EXPORT CUresult shim_cuCtxCreate_v1(CUcontext *c, unsigned flags, CUdevice dev)
{
    return created(PASS(CtxCreateV1, c, flags, dev), c);
}

SHIM_EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice dev)
{
    return created(PASS(CtxCreateV2, c, flags, dev), c);
}

SHIM_EXPORT CUresult cuCtxCreate_v3(CUcontext *c, CUexecAffinityParam *params, int n,
                                    unsigned flags, CUdevice dev)
{
    return created(PASS(CtxCreateV3, c, params, n, flags, dev), c);
}

SHIM_EXPORT CUresult cuCtxCreate_v4(CUcontext *c, CUctxCreateParams *params, unsigned flags,
                                    CUdevice dev)
{
    return created(PASS(CtxCreateV4, c, params, flags, dev), c);
}

/* The interop creators, both versions of each: contexts like any other. */
SHIM_EXPORT CUresult shim_cuGLCtxCreate_v1(CUcontext *c, unsigned flags, CUdevice dev)
{
    return created(PASS(GLCtxCreate[0], c, flags, dev), c);
}

SHIM_EXPORT CUresult cuGLCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice dev)
{
    return created(PASS(GLCtxCreate[1], c, flags, dev), c);
}

SHIM_EXPORT CUresult shim_cuVDPAUCtxCreate_v1(CUcontext *c, unsigned flags, CUdevice dev,
                                              uint32_t vdp_device, void *vdp_get_proc_address)
{
    return created(PASS(VDPAUCtxCreate[0], c, flags, dev, vdp_device, vdp_get_proc_address), c);
}

SHIM_EXPORT CUresult cuVDPAUCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice dev,
                                         uint32_t vdp_device, void *vdp_get_proc_address)
{
    return created(PASS(VDPAUCtxCreate[1], c, flags, dev, vdp_device, vdp_get_proc_address), c);
}

/* ---- the current context: hooked only to forget what current_context.c
 * remembers, whether or not the call succeeded (forgetting is always
 * safe). ---- */

static CUresult moved(CUresult r)
{
    current_context_moved();
    return r;
}

SHIM_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) { return moved(PASS(CtxSetCurrent, ctx)); }

SHIM_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    return moved(PASS(CtxPushCurrent, ctx));
}

SHIM_EXPORT CUresult shim_cuCtxPushCurrent_v1(CUcontext ctx)
{
    return moved(PASS(CtxPushCurrentV1, ctx));
}

SHIM_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *ctx) { return moved(PASS(CtxPopCurrent, ctx)); }

SHIM_EXPORT CUresult shim_cuCtxPopCurrent_v1(CUcontext *ctx)
{
    return moved(PASS(CtxPopCurrentV1, ctx));
}

/* After a call that released dev's primary context `ctx` (learnt while it
 * was still alive, its captures claimed then): if that was the last
 * reference, the context is gone. */
static void after_primary_release(const real_driver *R, CUdevice dev, CUcontext ctx, CUresult r,
                                  uint64_t claimed)
{
    unsigned flags = 0;
    int active = 0;
    bool gone = r == CUDA_SUCCESS && ctx &&
                R->DevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && !active;
    if (gone) {
        pools_primary_gone(dev); /* the pool (the context is no longer active) */
        pools_context_gone(ctx); /* and the streams under its handle */
        pools_give_back_forgotten(true);
        vmm_context_gone(ctx);
    }
    capture_ending_done(claimed, gone);
}

/* Both versions of the release (f; the v1: CUDA 7.0's, e2e_driver
 * primary-v1). */
static CUresult primary_release(CUresult (*f)(CUdevice), CUdevice dev)
{
    /* The last release destroys the primary context: learn its handle while
     * it is still alive, in case this is the last. */
    const real_driver *R = real_driver_get();
    primary_lock();
    CUcontext ctx = real_active_primary(R, dev);
    uint64_t claimed = capture_context_ending(ctx);
    pools_hold_trims(ctx, true); /* maybe the last: no other thread's trim inside */
    CUresult r = CALL(f, dev);
    remembered_pools_stale();
    after_primary_release(R, dev, ctx, r, claimed);
    pools_hold_trims(ctx, false);
    primary_unlock();
    return r;
}

SHIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return primary_release(REAL(DevicePrimaryCtxRelease), dev);
}

SHIM_EXPORT CUresult shim_cuDevicePrimaryCtxRelease_v1(CUdevice dev)
{
    return primary_release(REAL(DevicePrimaryCtxReleaseV1), dev);
}

/* Green contexts (green.c): they share the primary context's pool, and a
 * plain free's fence must cover their streams, which the primary context's
 * legacy stream does not wait for. */
SHIM_EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *g, CUdevResourceDesc desc, CUdevice dev,
                                      unsigned flags)
{
    primary_lock(); /* it retains the primary context */
    CUresult r = PASS(GreenCtxCreate, g, desc, dev, flags);
    primary_unlock();
    if (r == CUDA_SUCCESS && g) {
        green_created(*g, dev);
        fences_ordered_end_device(dev);
    }
    return r;
}

SHIM_EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx g)
{
    /* It releases the primary context it retained: maybe the last. */
    const real_driver *R = real_driver_get();
    CUcontext converted = NULL;
    int dev = green_destroying(g, &converted);
    /* Its streams' captures end with it (they belong to its converted
     * context), and the primary context's if this was its last reference. */
    uint64_t own = capture_context_ending(converted);
    primary_lock();
    CUcontext ctx = dev >= 0 ? real_active_primary(R, dev) : NULL;
    uint64_t claimed = capture_context_ending(ctx);
    pools_hold_trims(ctx, true);
    CUresult r = PASS(GreenCtxDestroy, g);
    remembered_pools_stale();
    capture_ending_done(own, r == CUDA_SUCCESS);
    if (dev >= 0)
        after_primary_release(R, dev, ctx, r, claimed);
    else
        capture_ending_done(claimed, false);
    pools_hold_trims(ctx, false);
    primary_unlock();
    return r;
}

SHIM_EXPORT CUresult cuGreenCtxStreamCreate(CUstream *s, CUgreenCtx g, unsigned flags,
                                            int priority)
{
    CUresult r = PASS(GreenCtxStreamCreate, s, g, flags, priority);
    if (r == CUDA_SUCCESS && s && (r = streams_add(*s)) != CUDA_SUCCESS)
        *s = NULL;
    return r;
}
