/*
 * service.c - the one allocation service behind both doors.
 *
 * The doors translate between their API (CUresult or cudaError_t, CUdeviceptr
 * or void *) and this file, which decides: does this call belong to a pool,
 * which lane does a free go into under the free policy, and what does a bad
 * call get. The answers come back as svc_status, which each door maps to its
 * own error codes.
 *
 * Bad input never changes the pool: the engine checks every pointer against
 * its live index before touching anything, and each kind of mistake is logged
 * as one line naming the call, the pointer and what the pointer is.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "ptr_map.h"
#include "shim.h"
#include "units.h"

_Thread_local int shim_tls_bypass;

/* Not stepping aside (a call of our own, a forked child), and configured. */
static bool shim_present(void)
{
    if (shim_tls_bypass || atomic_load_explicit(&shim_forked_child, memory_order_relaxed))
        return false;
    shim_init();
    return true;
}

bool shim_active(void)
{
    return shim_present() && shim_config_get()->mode == MODE_BFC && real_driver_get() != NULL;
}

bool shim_driver_door(void)
{
    return shim_active() && shim_config_get()->driver_hooks;
}

/* Closing the driver door (BFCSHIM_DRIVER_HOOKS=0) stops it serving, not
 * recognising the pools' own pointers: cudaMalloc memory may be freed with
 * cuMemFree, and a pooled pointer handed to the real driver frees or
 * describes the whole region behind it (found by an audit: the first
 * block's cuMemFree freed a one-region pool's region). */
bool shim_pointer_door(void) { return shim_active(); }

/* Lookups (dlsym, cuGetProcAddress) ignore the calling thread's bypass: it
 * routes *calls* the shim makes itself, while a table filled during such a
 * call (cudart initialising inside the shim's first cudaFree(NULL)) is kept
 * for the whole run. The doors check the bypass when they are called. */
bool shim_driver_hooked(void)
{
    if (atomic_load_explicit(&shim_forked_child, memory_order_relaxed))
        return false;
    shim_init();
    return shim_config_get()->driver_hooks && real_driver_get() != NULL;
}

static shim_pool *current_pool_asked(const real_driver *R, void *unused, CUcontext *ctx)
{
    (void)unused;
    *ctx = NULL;
    if (R->CtxGetCurrent(ctx) != CUDA_SUCCESS || !*ctx)
        return NULL;
    return pool_for_context(*ctx, true);
}

shim_pool *svc_current_pool(void)
{
    const real_driver *R = real_driver_get();
    return R ? current_context_pool(R, current_pool_asked) : NULL;
}

bool svc_is_default_pool(shim_pool *sp, CUmemoryPool pool)
{
    const real_driver *R = real_driver_get();
    CUmemoryPool dflt = NULL;
    return R->DeviceGetDefaultMemPool &&
           R->DeviceGetDefaultMemPool(&dflt, sp->dev) == CUDA_SUCCESS && dflt == pool;
}

/* The pool each device's stream-ordered calls use, when the program set one
 * other than the default (NULL: the default, which the BFC pool serves). */
enum { TRACKED_DEVICES = 64 };
static _Atomic(CUmemoryPool) set_pool[TRACKED_DEVICES];

void svc_note_device_pool(CUdevice dev, CUmemoryPool pool)
{
    const real_driver *R = real_driver_get();
    CUmemoryPool dflt = NULL;
    if (dev < 0 || dev >= TRACKED_DEVICES || !R || !R->DeviceGetDefaultMemPool ||
        R->DeviceGetDefaultMemPool(&dflt, dev) != CUDA_SUCCESS)
        return;
    atomic_store(&set_pool[dev], pool == dflt ? NULL : pool);
}

void svc_note_pool_destroyed(CUmemoryPool pool)
{
    for (int dev = 0; pool && dev < TRACKED_DEVICES; dev++) {
        CUmemoryPool was = pool;
        atomic_compare_exchange_strong(&set_pool[dev], &was, NULL);
    }
}

bool svc_default_pool_current(CUdevice dev)
{
    return dev < 0 || dev >= TRACKED_DEVICES || atomic_load_explicit(&set_pool[dev],
                                                                      memory_order_relaxed) == NULL;
}

static shim_pool *stream_pool_asked(const real_driver *R, void *s, CUcontext *ctx)
{
    *ctx = NULL;
    if (!R->StreamGetCtx || R->StreamGetCtx((CUstream)s, ctx) != CUDA_SUCCESS || !*ctx)
        return NULL;
    return pool_for_context(*ctx, true);
}

/* The pool of an explicit stream's context (remembered per thread:
 * current_context.c). */
static shim_pool *stream_pool(CUstream s)
{
    const real_driver *R = real_driver_get();
    return R ? stream_context_pool(R, s, stream_pool_asked) : NULL;
}

bool svc_explicit_stream(CUstream s)
{
    return s != NULL && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD;
}

shim_pool *svc_async_pool(CUstream s, bool per_thread, shim_pool *(*current)(void))
{
    /* Passed through: the driver answers a capture's allocation (the graph
     * owns it), and refuses one on a blocked legacy stream or a dead
     * handle (the program's own call; the shim asks nothing about it). */
    if (svc_stream_state_of(s, per_thread) != STREAM_USABLE)
        return NULL;
    return svc_explicit_stream(s) ? stream_pool(s) : current();
}

void svc_note_passthrough(void)
{
    atomic_fetch_add_explicit(&shim_passthrough_allocs, 1, memory_order_relaxed);
    const real_driver *R = real_driver_get();
    CUcontext cur = NULL;
    shim_pool *sp = R && R->CtxGetCurrent(&cur) == CUDA_SUCCESS && cur
                        ? pool_for_context(cur, false)
                        : NULL;
    if (sp)
        atomic_fetch_add_explicit(&sp->passthrough_allocs, 1, memory_order_relaxed);
}

/* ---- allocation ----------------------------------------------------------------- */

/* Runs the engine with the pool's context current where it needs one: it
 * may take a region, map granules and seal fences, whose CUDA calls act on
 * the current context (a stream-ordered call on another device's stream
 * arrives with another context current). Most allocations make no CUDA call
 * at all, so the context is entered only when the engine's first backend
 * call asks for it (pools_context_needed), not asked about on every
 * allocation: that was a cuCtxGetCurrent per allocation for nothing. */
static _Thread_local bool next_in_current_context;

void svc_next_alloc_in_current_context(void) { next_in_current_context = true; }

static bfc_status pool_alloc_in_context(shim_pool *sp, size_t size, uint32_t lane, bfc_addr *a)
{
    bool current = next_in_current_context;
    next_in_current_context = false;
    /* The door found sp as its current context's pool: entered, unless the
     * current context is a green context's, whose pool is its primary
     * context's (green_canonical): seals made there would record the
     * primary's lanes on the green default stream and take events of the
     * wrong context (found by an audit: a block handed out under the
     * primary's queued work, then every seal refused). */
    if (current && !green_is_current())
        return bfc_pool_alloc(sp->bfc, size, lane, a);
    pool_context_scope scope;
    pools_context_lazy_begin(sp, &scope);
    bfc_status st = bfc_pool_alloc(sp->bfc, size, lane, a);
    pools_context_lazy_end(&scope);
    return st;
}

svc_status svc_alloc(shim_pool *sp, size_t size, uint32_t lane, CUstream stream,
                     CUdeviceptr *out, const char *api)
{
    if (size > sp->limit / 2)
        preallocation_hint(sp, size, api, false);
    /* A pool died: loans it held of the program's memory, which outlives
     * it, count against this pool's limit before it serves (one load a call
     * while no pool dies). */
    if (__builtin_expect(pools_deaths() != atomic_load_explicit(&sp->deaths_seen,
                                                               memory_order_relaxed), 0))
        pools_take_over_loans(sp);
    bfc_addr a = 0;
    bfc_status st = pool_alloc_in_context(sp, size, lane, &a);
    if (st == BFC_OK) {
        *out = (CUdeviceptr)a;
        stats_poll_request();
        return SVC_OK;
    }
    if (st == BFC_ERR_BAD_LANE) /* a lane closed under us: take it without reuse */
        return svc_alloc(sp, size, BFC_NO_LANE, stream, out, api);
    /* The engine records its own events (out of memory among them) when the
     * pool is traced; the failures it refuses up front are recorded here. */
    if (st != BFC_ERR_OOM || !atomic_load(&sp->trace))
        record_alloc_failure(size, stream);
    switch (st) {
    case BFC_ERR_OOM:
        oom_report(sp, size, api);
        return SVC_OOM;
    case BFC_ERR_TOO_LARGE:
        shim_log(LOG_ERROR, "%s(%zu bytes): larger than any device; out of memory", api, size);
        return SVC_OOM;
    case BFC_ERR_HOST_MEMORY:
        shim_log(LOG_ERROR, "%s(%zu bytes): out of host memory for the pool's bookkeeping",
                 api, size);
        return SVC_OOM;
    default:
        shim_log(LOG_ERROR, "%s(%zu bytes): engine error %s", api, size, bfc_status_name(st));
        return SVC_INVALID;
    }
}

bool svc_pitch(shim_pool *sp, size_t width, size_t height, unsigned element_size,
               size_t *pitch, size_t *bytes)
{
    if (width == 0 || height == 0 || (element_size != 4 && element_size != 8 &&
                                      element_size != 16))
        return false;
    const size_t a = (size_t)pools_pitch_align(sp);
    if (width > SIZE_MAX - (a - 1))
        return false;
    size_t p = (width + a - 1) & ~(a - 1);
    if (height > SIZE_MAX / p)
        return false;
    *pitch = p;
    *bytes = p * height;
    return true;
}

CUresult svc_cuda_result(svc_status st)
{
    switch (st) {
    case SVC_OK:
        return CUDA_SUCCESS;
    case SVC_OOM:
        return CUDA_ERROR_OUT_OF_MEMORY;
    case SVC_UNSUPPORTED:
        return CUDA_ERROR_NOT_SUPPORTED;
    case SVC_DEAD_STREAM:
        return CUDA_ERROR_INVALID_HANDLE;
    case SVC_CAPTURE_IMPLICIT:
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    case SVC_NO_CONTEXT:
        return CUDA_ERROR_INVALID_CONTEXT;
    case SVC_CONTEXT_DESTROYED:
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* ---- free ----------------------------------------------------------------------- */

static svc_status bad_pointer(shim_pool *sp, CUdeviceptr ptr, const char *api)
{
    char what[160];
    bfc_pool_describe(sp->bfc, ptr, what, sizeof what);
    shim_log(LOG_ERROR, "%s(0x%llx): not the start of a live allocation (%s); ignored", api,
             (unsigned long long)ptr, what);
    return SVC_INVALID;
}

/* Is ptr the start of a live block of sp? */
static bool block_start(shim_pool *sp, CUdeviceptr ptr)
{
    bfc_addr base;
    uint64_t size;
    return bfc_pool_lookup(sp->bfc, ptr, &base, &size) == BFC_OK && base == ptr;
}

/* A stream-ordered free of a block CUDA refuses, refused the same way: the
 * block stays the program's. On a destroyed stream, without the dead handle
 * reaching the driver. On the legacy stream while a blocking stream
 * captures, the legacy stream is used as the real free would use it (work
 * queued on it), so that the driver refuses and invalidates those captures
 * itself; should it accept (the capture ended meanwhile), SVC_OK: the free
 * goes on. */
static svc_status refused_stream_free(CUdeviceptr ptr, CUstream stream, svc_stream_state state,
                                      const char *api)
{
    if (state == STREAM_DEAD) {
        shim_log(LOG_ERROR, "%s(0x%llx) on stream %p, which was destroyed: refused, the block "
                            "is still the program's", api, (unsigned long long)ptr, (void *)stream);
        return SVC_DEAD_STREAM;
    }
    CUresult r = capture_legacy_use(real_driver_get());
    if (r == CUDA_SUCCESS)
        return SVC_OK; /* not blocked after all: freed as usual */
    shim_log(LOG_ERROR, "%s(0x%llx) on the legacy stream while a blocking stream captures: "
                        "refused (%d), the block is still the program's", api,
             (unsigned long long)ptr, (int)r);
    return r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ? SVC_CAPTURE_IMPLICIT : SVC_INVALID;
}

/* seen: the stream's state as the caller found it unusable and acted on
 * (svc_free_seen), or NULL: asked here. */
static svc_status free_in_state(CUdeviceptr ptr, free_kind kind, CUstream stream,
                                bool per_thread, const svc_stream_state *seen, const char *api)
{
    shim_pool *sp = pool_owning(ptr);
    if (!sp)
        return SVC_PASS;
    bfc_status st;
    const bool plain = kind == FREE_PLAIN || kind == FREE_PLAIN_FENCED;
    svc_stream_state state = seen ? *seen
                             : !plain ? svc_stream_state_of(stream, per_thread)
                                      : STREAM_USABLE;
    /* Refused or kept below, the block is not freed: a bad pointer is said
     * here (a freed one by the engine). */
    if (state != STREAM_USABLE && !block_start(sp, ptr))
        return bad_pointer(sp, ptr, api);
    if (state == STREAM_DEAD || state == STREAM_LEGACY_BLOCKED) {
        /* FREE_STREAM_DEVICE names the legacy stream of the pool's context,
         * which need not be current (PyTorch frees a device's tensors with
         * another device current), while the question above was about the
         * current context's: a blocking stream capturing there must
         * neither refuse the free nor see its capture invalidated by the
         * refusal's legacy-stream use (e2e_api torch-legacy-capture, found
         * by the plug-in audit: the capture failed and the block was
         * lost). Asked again, and refused if at all, with the pool's
         * context current: only on this rare path, so the common free
         * still asks nothing about the current context. */
        const real_driver *R = real_driver_get();
        const bool pushed = kind == FREE_STREAM_DEVICE && state == STREAM_LEGACY_BLOCKED && R &&
                            real_ctx_enter(R, sp->ctx);
        if (pushed && !seen) /* (seen: asked with the pool's context current) */
            state = svc_stream_state_of(stream, per_thread);
        svc_status refused =
            state == STREAM_USABLE ? SVC_OK : refused_stream_free(ptr, stream, state, api);
        if (pushed)
            real_ctx_leave(R, pushed);
        if (refused != SVC_OK)
            return refused;
        if (seen) {
            /* The legacy stream is usable after all (the capture ended
             * since the caller's question), but the caller queued nothing
             * on it for the block (recorded_streams_before_free): freed in
             * its order, the block could come back under a recorded
             * stream's work. Kept: rare, and safe (e2e_plugin
             * record-legacy-capture-ends). */
            static atomic_bool said;
            shim_log_once(&said, LOG_WARN,
                          "%s(0x%llx) on the legacy stream, whose blocking capture ended "
                          "during the free: the block is kept until exit (logged once)",
                          api, (unsigned long long)ptr);
            return SVC_OK;
        }
    }
    if (state == STREAM_CAPTURING) {
        /* The free becomes part of a graph that may run any number of times
         * later: the block can never be proven idle, so it is kept. */
        static atomic_bool said;
        shim_log_once(&said, LOG_WARN,
                      "%s of pooled memory on a capturing stream: the block is kept until exit "
                      "(allocate inside the capture to let the graph own it)",
                      api);
        return SVC_OK;
    }
    if (kind == FREE_PLAIN && shim_config_get()->free_policy == FREE_IMMEDIATE)
        st = bfc_pool_free(sp->bfc, ptr);
    else {
        CUresult refused = CUDA_SUCCESS;
        uint32_t lane = plain ? sp->plain_lane
                              : pool_lane_for_free(sp, stream, per_thread,
                                                   kind == FREE_STREAM_DEVICE, &refused);
        if (lane == BFC_NO_LANE && !block_start(sp, ptr))
            return bad_pointer(sp, ptr, api);
        if (lane == BFC_NO_LANE && refused != CUDA_SUCCESS) {
            /* No such stream, as CUDA answers (pool_lane_for_free): an
             * explicit handle whose context the driver cannot name
             * (destroyed where the shim could not see, or with its
             * context), or the legacy or per-thread handle while no live
             * context is current. */
            if (svc_explicit_stream(stream))
                shim_log(LOG_ERROR, "%s(0x%llx) on stream %p, which names no live stream (the "
                                    "driver answers %d: destroyed?): refused, the block is still "
                                    "the program's", api, (unsigned long long)ptr,
                         (void *)stream, (int)refused);
            else
                shim_log(LOG_ERROR, "%s(0x%llx) on the %s stream while %s: refused (%d), the "
                                    "block is still the program's", api, (unsigned long long)ptr,
                         stream == CU_STREAM_PER_THREAD || per_thread ? "per-thread" : "legacy",
                         refused == CUDA_ERROR_INVALID_CONTEXT ? "no context is current"
                                                               : "the current context is destroyed",
                         (int)refused);
            return refused == CUDA_ERROR_INVALID_HANDLE    ? SVC_DEAD_STREAM
                   : refused == CUDA_ERROR_INVALID_CONTEXT ? SVC_NO_CONTEXT
                                                           : SVC_CONTEXT_DESTROYED;
        }
        if (lane == BFC_NO_LANE) /* kept: another context's stream not waited for (logged) */
            return SVC_OK;
        /* A legacy-stream free must order other blocking streams' work as
         * CUDA's does: it is a legacy-stream action, and the shim queues
         * nothing for it.
         *   - Preloaded, in an ordered pool: the block goes to the plain
         *     lane, never taken in stream order, whose seal is a barrier on
         *     the legacy stream (that action, at no wait). Not the legacy
         *     lane: a pool leaves the state for good, and the legacy lane
         *     is taken in order outside it (pool_lane_for_alloc), where a
         *     block freed with no action would be handed out under other
         *     blocking streams' work (e2e_fences legacy-lane-ptsz).
         *   - Otherwise (not ordered, or loaded as a plug-in), allocations
         *     on the legacy stream take the legacy lane in stream order, as
         *     CUDA's do without a host wait (e2e_fences
         *     legacy-reuse-stuck-events: waiting for the lane's event hung
         *     behind a kernel CUDA does not wait for), so the free makes
         *     the legacy stream act first (fences_legacy_order), else the
         *     block waits for every stream (the plain lane).
         * FREE_STREAM_DEVICE, PyTorch's entry point, names the pool's
         * legacy stream with any context current, so it cannot act there
         * without asking: loaded as a plug-in it is left as it was
         * (PyTorch reuses a block on its own stream without such an order
         * itself); preloaded, the block waits for every stream. */
        if (lane == sp->legacy_lane &&
            (pool_legacy_by_barrier(sp) ||
             (kind == FREE_STREAM_DEVICE ? streams_all_seen() : !fences_legacy_order(sp))))
            lane = sp->plain_lane;
        st = bfc_pool_free_deferred(sp->bfc, ptr, lane);
        if (st == BFC_ERR_BAD_LANE) /* the stream's lane closed under us */
            st = bfc_pool_free_deferred(sp->bfc, ptr, sp->plain_lane);
    }
    if (st == BFC_OK)
        return SVC_OK;
    if (st == BFC_ERR_NOT_ALLOCATED)
        return bad_pointer(sp, ptr, api);
    shim_log(LOG_ERROR, "%s(0x%llx): engine error %s", api, (unsigned long long)ptr,
             bfc_status_name(st));
    return SVC_INVALID;
}

svc_status svc_free(CUdeviceptr ptr, free_kind kind, CUstream stream, bool per_thread,
                    const char *api)
{
    return free_in_state(ptr, kind, stream, per_thread, NULL, api);
}

svc_status svc_free_seen(CUdeviceptr ptr, free_kind kind, CUstream stream, bool per_thread,
                         svc_stream_state seen, const char *api)
{
    return free_in_state(ptr, kind, stream, per_thread, &seen, api);
}

/* ---- queries -------------------------------------------------------------------- */

/* Set when a figure has been adjusted in this thread's current query: cudart's
 * cudaMemGetInfo reaches the driver door's cuMemGetInfo_v2, and the runtime
 * door must not add the pool's unused bytes a second time. */
static _Thread_local bool meminfo_adjusted;

void svc_meminfo_begin(void) { meminfo_adjusted = false; }
bool svc_meminfo_adjusted(void) { return meminfo_adjusted; }

void svc_adjust_meminfo(size_t *free_bytes, size_t total)
{
    const real_driver *R = real_driver_get();
    CUcontext cur = NULL;
    if (!free_bytes || !R || R->CtxGetCurrent(&cur) != CUDA_SUCCESS || !cur)
        return;
    meminfo_adjusted = true;
    /* The program can still get what its pool has not handed out (pending
     * blocks become free soon) plus what the device can still add to the
     * pool, within the pool's limit. Before the first allocation, the limit. */
    shim_pool *sp = pool_for_context(cur, false);
    uint64_t device_free = *free_bytes, can_get;
    if (sp) {
        bfc_stats st;
        bfc_pool_stats(sp->bfc, &st);
        uint64_t unused = st.pool_bytes - st.bytes_in_use;
        /* (what the program's own cuMemCreate memory holds is lent out of
         * the limit: not the pool's to give) */
        can_get = st.bytes_limit - st.bytes_lent - st.bytes_in_use;
        if (device_free + unused < can_get)
            can_get = device_free + unused;
    } else {
        can_get = pools_limit_for(total);
        if (device_free < can_get)
            can_get = device_free;
    }
    *free_bytes = (size_t)can_get;
}

/* ---- the default pool's figures -------------------------------------------------- */

/*
 * The shim serves a device's default memory pool (cuMemAllocAsync while it
 * is current, cuMemAllocFromPoolAsync naming it) from its own pools, so a
 * program reading that pool's figures (PyTorch's cudaMallocAsync backend
 * reports memory_allocated and memory_reserved from them, CuPy's
 * MemoryAsyncPool its used and total bytes) must see the shim's memory
 * there, or it sees nothing. The shim's pools of the device add:
 *   - reserved: their pool_bytes (the region, which serves plain cudaMalloc
 *     too: one pool behind both);
 *   - used: their bytes in use, plain allocations included, so that
 *     reserved - used is what the pool has free;
 *   - the *_HIGH marks: their high-water marks, which the program's reset
 *     (setting the attribute to 0) restarts without touching the lifetime
 *     peaks of the shim's own statistics.
 * The driver's own figures for the pool (what it passed through) stay in
 * the sum. A trim to 0 also gives back what the shim's pools hold idle
 * (bfc_pool_trim: regions, over virtual memory granules), unless they are
 * preallocated: those keep what they took, over virtual memory too, as
 * one cuMemAlloc region does. A trim to more than 0 leaves them
 * be: cuda.h guarantees the pool "at least minBytesToKeep bytes reserved
 * after the operation", and the engine can give back only all it holds
 * idle, not an amount; holding on is within "or there is no more memory
 * that the allocator can safely release".
 */
static _Thread_local bool pool_query_done;

void svc_pool_query_begin(void) { pool_query_done = false; }
bool svc_pool_query_done(void) { return pool_query_done; }

/* The i-th live shim pool serving `pool` from index *i on, or NULL. */
static shim_pool *next_serving(CUmemoryPool pool, size_t *i)
{
    for (; *i < pools_count(); (*i)++) {
        shim_pool *sp = pools_at(*i);
        if (sp && !atomic_load(&sp->dead) && svc_is_default_pool(sp, pool)) {
            (*i)++;
            return sp;
        }
    }
    return NULL;
}

void svc_pool_get_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    pool_query_done = true;
    /* The reuse flags and the release threshold are the driver's alone. */
    if (!value || !pool ||
        (attr != CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT && attr != CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH &&
         attr != CU_MEMPOOL_ATTR_USED_MEM_CURRENT && attr != CU_MEMPOOL_ATTR_USED_MEM_HIGH))
        return;
    uint64_t add = 0;
    shim_pool *sp;
    for (size_t i = 0; (sp = next_serving(pool, &i));) {
        bfc_stats st;
        bfc_pool_stats(sp->bfc, &st);
        add += attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT ? st.pool_bytes
               : attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH  ? st.high_pool_bytes
               : attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT   ? st.bytes_in_use
                                                            : st.high_bytes_in_use;
    }
    *(cuuint64_t *)value += add;
}

void svc_pool_set_attribute(CUmemoryPool pool, CUmemPool_attribute attr)
{
    pool_query_done = true;
    /* The driver accepted it, so a high-water mark was set to 0: restarted. */
    unsigned which = attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH ? BFC_HIGH_POOL
                     : attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH   ? BFC_HIGH_IN_USE
                                                               : 0;
    shim_pool *sp;
    for (size_t i = 0; which && pool && (sp = next_serving(pool, &i));)
        bfc_pool_reset_highs(sp->bfc, which);
}

void svc_pool_trim(CUmemoryPool pool, size_t keep)
{
    pool_query_done = true;
    /* A preallocated pool holds its memory whichever way it is laid out
     * (BFCSHIM_PREALLOCATE is the promise not to give it back); only
     * bfcshim_trim() asks it to. Asked per pool: the virtual memory door
     * makes a growing one whatever the setting, for a program whose first
     * device memory is its own (JAX), and its idle granules go back at a
     * trim as any growing pool's (found by an audit: they never did). */
    shim_pool *sp;
    for (size_t i = 0; keep == 0 && pool && (sp = next_serving(pool, &i));) {
        bfc_options o;
        bfc_pool_options(sp->bfc, &o);
        if (!o.preallocate)
            pools_trim(sp, false);
    }
}

uint64_t svc_buffer_id(const shim_pool *sp, uint64_t seq)
{
    return UINT64_C(1) << 63 | (uint64_t)(sp->serial & 0x7fff) << 48 |
           (seq & ((UINT64_C(1) << 48) - 1));
}

svc_status svc_ipc_check(CUdeviceptr ptr, const char *api)
{
    shim_pool *sp = pool_owning(ptr);
    if (!sp)
        return SVC_PASS;
    /* An address of the pool's free space (a freed block) is no allocation
     * at all: invalid value, as CUDA answers for a pointer it never gave
     * out, not "unsupported" for a block (found by an audit). */
    if (bfc_pool_block(sp->bfc, ptr, NULL) != BFC_OK)
        return bad_pointer(sp, ptr, api);
    shim_log(LOG_ERROR,
             "%s(0x%llx): the pointer is a block inside a bfcshim pool region, which another "
             "process cannot open on its own; refused (run with BFCSHIM_ALLOCATOR=platform for "
             "programs that share memory by IPC)",
             api, (unsigned long long)ptr);
    return SVC_UNSUPPORTED;
}

svc_stream_state svc_stream_state_of(CUstream s, bool per_thread)
{
    if (streams_dead(s))
        return STREAM_DEAD;
    const real_driver *R = real_driver_get();
    if (!R || capture_none())
        return STREAM_USABLE;
    if (s == NULL && per_thread)
        s = CU_STREAM_PER_THREAD;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = R->StreamIsCapturing(s, &st);
    /* cuda.h: on the legacy stream while a blocking stream of its context
     * captures, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ("the legacy stream is
     * in an unusable state until the blocking stream capture is
     * terminated"). */
    if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
        return STREAM_LEGACY_BLOCKED;
    return r == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE ? STREAM_CAPTURING
                                                                      : STREAM_USABLE;
}

/* ---- platform mode -------------------------------------------------------------- */

/* In platform mode every call passes through; the shim still counts what is
 * live so that its statistics compare with the pool's. */
static pthread_mutex_t platform_lock = PTHREAD_MUTEX_INITIALIZER;
static ptr_map platform_live;
static bool platform_ready;
static platform_counts counts;

bool platform_counting(void)
{
    return !shim_tls_bypass && shim_config_get()->mode == MODE_PLATFORM;
}

/* An allocation seen at both doors (cudart's cudaMalloc reaching the driver
 * door's cuMemAlloc_v2) is one pointer: counted and recorded in the trace
 * once, by whichever door sees it first. */
void platform_note_alloc(CUdeviceptr ptr, size_t size)
{
    if (!ptr)
        return;
    pthread_mutex_lock(&platform_lock);
    if (!platform_ready)
        platform_ready = ptr_map_init(&platform_live);
    if (platform_ready && ptr_map_reserve(&platform_live, 1) &&
        !ptr_map_get(&platform_live, ptr)) {
        record_alloc(ptr, size, NULL);
        counts.num_allocs++;
        ptr_map_put(&platform_live, ptr, size + 1); /* 0 means absent to the map */
        counts.bytes_in_use += size;
        if (counts.bytes_in_use > counts.peak_bytes_in_use)
            counts.peak_bytes_in_use = counts.bytes_in_use;
        if (size > counts.largest_alloc_size)
            counts.largest_alloc_size = size;
    }
    pthread_mutex_unlock(&platform_lock);
}

void platform_note_free(CUdeviceptr ptr)
{
    if (!ptr)
        return;
    pthread_mutex_lock(&platform_lock);
    uint64_t stored = platform_ready ? ptr_map_take(&platform_live, ptr) : 0;
    if (stored) {
        record_free(ptr, NULL);
        counts.num_frees++;
        counts.bytes_in_use -= stored - 1;
    }
    pthread_mutex_unlock(&platform_lock);
}

void platform_get_counts(platform_counts *out)
{
    pthread_mutex_lock(&platform_lock);
    *out = counts;
    pthread_mutex_unlock(&platform_lock);
}

void platform_lock_for_fork(bool lock)
{
    if (lock)
        pthread_mutex_lock(&platform_lock);
    else
        pthread_mutex_unlock(&platform_lock);
}
