/*
 * pools.c - one engine pool per CUDA context (a pointer of one context is
 * not valid in another; for the runtime, the context is the device's primary
 * one), created on first use.
 *
 * Regions come from the real cuMemAlloc_v2 with the pool's context current,
 * or, over virtual memory (BFCSHIM_VMM, vmm.c), from cuMemAddressReserve with
 * memory mapped behind them as blocks land.
 * The limit is BFCSHIM_MEM_LIMIT, else BFCSHIM_MEM_FRACTION of the device's
 * total memory; with BFCSHIM_PREALLOCATE the whole limit is taken when the
 * pool is created (the engine backs off by 10% steps if the device cannot
 * give it all).
 *
 * Lanes: every pool has a "plain" lane for frees that must wait for every
 * stream (cudaFree, cuMemFree) and a lane per stream for stream-ordered
 * frees, so that the freeing stream may reuse its blocks at once.
 *
 * A pool whose context goes away (cuCtxDestroy, primary context reset or
 * last release) is marked dead and forgotten but never freed: another thread
 * may still be inside it, and its memory went with the context anyway. Its
 * registry slot goes to the next new pool, so a program that makes and
 * destroys contexts again and again keeps its pools (the dead pool's
 * bookkeeping stays: a few KiB resident, its lane tables being untouched
 * zero pages), and the dead pool joins the retired list the statistics
 * report.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "array_room.h"
#include "plan_file.h"
#include "shim.h"
#include "units.h"

#define MAX_POOLS 64
#define LANE_SLOTS 65536u /* lanes are 16-bit handles in the engine */

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(shim_pool *) registry[MAX_POOLS];
static atomic_size_t npools;
static uint32_t next_serial; /* under reg_lock */

size_t pools_count(void) { return atomic_load(&npools); }

shim_pool *pools_at(size_t i)
{
    return i < MAX_POOLS ? atomic_load(&registry[i]) : NULL;
}

/* Dead pools whose registry slot a later pool took, oldest first: the
 * statistics still report them (a program that calls cudaDeviceReset
 * between jobs wants every job's figures), which costs nothing since a
 * dead pool is never freed. The first RETIRED_LISTED are kept; the others
 * are only counted, so that a program making and destroying contexts in a
 * loop does not grow its statistics without end. */
#define RETIRED_LISTED 64
static _Atomic(shim_pool *) retired[RETIRED_LISTED];
static atomic_size_t nretired, retired_unlisted;

size_t pools_retired_count(void) { return atomic_load(&nretired); }

shim_pool *pools_retired_at(size_t i)
{
    return i < RETIRED_LISTED ? atomic_load(&retired[i]) : NULL;
}

size_t pools_retired_unlisted(void) { return atomic_load(&retired_unlisted); }

/* Under reg_lock. */
static void retire(shim_pool *sp)
{
    size_t n = atomic_load(&nretired);
    if (n == RETIRED_LISTED) {
        atomic_fetch_add(&retired_unlisted, 1);
        return;
    }
    atomic_store(&retired[n], sp);
    atomic_store(&nretired, n + 1);
}

static int region_alloc(void *ctx, uint64_t size, bfc_addr *base)
{
    pools_context_needed(ctx);
    const real_driver *R = real_driver_get();
    CUdeviceptr p = 0;
    /* "Potentially unsafe" during a capture: in global mode another
     * thread's global-mode capture would refuse it and be invalidated
     * (e2e_fences region-during-capture); a region is rare, so always
     * relaxed (capture.c). */
    relaxed_scope rs = capture_relax_always(R);
    CUresult r = R->MemAlloc(&p, (size_t)size);
    capture_restore(R, rs);
    if (r != CUDA_SUCCESS) {
        shim_log(LOG_DEBUG, "cuMemAlloc_v2 of a %llu-byte region failed (%d)",
                 (unsigned long long)size, (int)r);
        return 1;
    }
    *base = p;
    return 0;
}

static void region_free(void *ctx, bfc_addr base, uint64_t size)
{
    (void)size;
    pools_context_needed(ctx);
    /* Free space of an ordered pool may still be read by work queued
     * before its last barrier (fences.c). */
    if (!fences_barrier_idle(ctx, true) && !atomic_load(&((shim_pool *)ctx)->keep_freed))
        shim_log(LOG_WARN, "a region goes back before the GPU could be waited for");
    const real_driver *R = real_driver_get();
    relaxed_scope rs = capture_relax_always(R); /* as region_alloc */
    R->MemFree(base);
    capture_restore(R, rs);
}

/* Is ctx the primary context of dev? (An inactive one is not ctx.) */
static bool is_primary(const real_driver *R, CUcontext ctx, CUdevice dev)
{
    CUcontext p = real_active_primary(R, dev);
    return p && p == ctx;
}

/* The row alignment the driver's cuMemAllocPitch uses on the pool's
 * device: the pitch it gives for a 1-byte row (one real allocation, freed at
 * once), learned at the pool's first pitched allocation, with the pool's
 * context current. CUDA documents only a lower bound (the texture pitch
 * alignment); when the probe cannot run, the larger of that and 512, what
 * devices report. */
static uint64_t learn_pitch_align(const real_driver *R, CUdevice dev)
{
    CUdeviceptr d = 0;
    size_t pitch = 0;
    if (R->MemAllocPitch && R->MemAllocPitch(&d, &pitch, 1, 1, 4) == CUDA_SUCCESS) {
        R->MemFree(d);
        if (pitch && !(pitch & (pitch - 1)))
            return pitch;
    }
    int tex = 0;
    if (R->DeviceGetAttribute &&
        R->DeviceGetAttribute(&tex, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, dev) ==
            CUDA_SUCCESS &&
        tex > 512 && !(tex & (tex - 1)))
        return (uint64_t)tex;
    return 512;
}

uint64_t pools_pitch_align(shim_pool *sp)
{
    uint64_t a = atomic_load_explicit(&sp->pitch_align, memory_order_acquire);
    if (a)
        return a;
    /* (The probe calls the real driver directly: no door sees it.) */
    a = learn_pitch_align(real_driver_get(), sp->dev);
    atomic_store_explicit(&sp->pitch_align, a, memory_order_release);
    return a;
}

/* Regions are whole multiples of 2 MiB, the driver's own granule. */
static const uint64_t granule = UINT64_C(2) << 20;

uint64_t pools_limit_for(uint64_t total)
{
    const shim_config *cfg = shim_config_get();
    uint64_t limit = cfg->mem_limit ? cfg->mem_limit : (uint64_t)(cfg->mem_fraction * (double)total);
    if (limit > total)
        limit = total;
    limit = limit / granule * granule;
    return limit < granule ? granule : limit;
}

void pools_lock_for_fork(bool lock)
{
    if (lock)
        pthread_mutex_lock(&reg_lock);
    else
        pthread_mutex_unlock(&reg_lock);
}

/*
 * BFCSHIM_VMM: the mapping granule when this pool goes over virtual memory,
 * else 0. auto and on: wherever the device supports it. A preallocated pool
 * over virtual memory is laid out as one region until nothing fits there
 * (bfc_options.prealloc_spread off), so it places and holds exactly what
 * one cuMemAlloc region would, and moves free memory where that region
 * would have failed (docs/results/benchmarks-history.md, "One region first");
 * BFCSHIM_VMM_LAYOUT=spread lays it out by the rules of virtual memory from
 * the start instead (create_pool). auto stays on
 * cuMemAlloc with more than 64 devices, where peers that enable access
 * could not all get it to the mappings (vmm.c); on says so once instead.
 */
static uint64_t use_vmm(const real_driver *R, const shim_config *cfg, CUdevice dev)
{
    if (cfg->vmm == VMM_OFF)
        return 0;
    uint64_t g = vmm_granularity(R, dev);
    int devices = 1;
    if (R->DeviceGetCount)
        R->DeviceGetCount(&devices);
    if (g && devices > 64) { /* vmm_peers has a bit for 64 devices */
        if (cfg->vmm == VMM_AUTO)
            return 0;
        static atomic_bool said;
        shim_log_once(&said, LOG_WARN,
                      "BFCSHIM_VMM=on with %d devices: some peers cannot be given access "
                      "to pooled memory; use BFCSHIM_VMM=off for peer-to-peer programs",
                      devices);
    }
    if (!g && cfg->vmm == VMM_ON)
        shim_log(LOG_WARN, "device %d: BFCSHIM_VMM=on, but the device or driver does not "
                           "support virtual memory management: regions from cuMemAlloc",
                 (int)dev);
    const char *step = "";
    CUresult r = g ? vmm_probe(R, dev, g, &step) : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS) {
        shim_log(LOG_WARN, "device %d: the driver reports virtual memory management, but %s "
                           "failed (%d) on two trial granules: regions from cuMemAlloc",
                 (int)dev, step, (int)r);
        return 0;
    }
    return g;
}

/*
 * BFCSHIM_PLAN: places from an offline packing of an earlier run (bfcshim
 * plan). A plan that cannot be read or does not fit this pool is said in
 * one line and left out: the pool runs on by its placement rule.
 */
static void install_plan(shim_pool *sp, const char *path, uint64_t granularity)
{
    char err[512];
    plan_file plan;
    if (!plan_file_read(path, &plan, err, sizeof err)) {
        shim_log(LOG_WARN, "device %d: BFCSHIM_PLAN not used: %s", (int)sp->dev, err);
        return;
    }
    char need[32], have[32];
    if (plan.granularity != granularity)
        shim_log(LOG_WARN, "device %d: BFCSHIM_PLAN %s not used: packed at a granularity of "
                           "%llu, the pool's (BFCSHIM_ALIGNMENT) is %llu",
                 (int)sp->dev, path, (unsigned long long)plan.granularity,
                 (unsigned long long)granularity);
    else if (bfc_pool_set_plan(sp->bfc, plan.entries, plan.n) != BFC_OK)
        shim_log(LOG_WARN, "device %d: BFCSHIM_PLAN %s not used: an entry is not a multiple "
                           "of the granularity, or out of host memory",
                 (int)sp->dev, path);
    else
        shim_log(plan.pool_bytes > sp->limit ? LOG_WARN : LOG_INFO,
                 "device %d: placement plan %s: %zu allocations, packed into %s (pool %s)%s",
                 (int)sp->dev, path, plan.n, format_size(plan.pool_bytes, need, sizeof need),
                 format_size(sp->limit, have, sizeof have),
                 plan.pool_bytes > sp->limit ? "; places past the pool's end go by the rule"
                                             : "");
    plan_file_free(&plan);
}

/* Takes a preallocated pool's limit up front and returns the bytes it
 * holds then. That is the pool's start-up cost (over virtual memory one
 * cuMemCreate and cuMemMap per granule), timed into prealloc_us. A device
 * with less free memory than the limit gives less, or nothing (over virtual
 * memory the address range is still reserved, and mapped on demand); the
 * caller warns, as the user asked for the memory up front. */
static uint64_t take_up_front(shim_pool *sp)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const bool reserved = bfc_pool_reserve(sp->bfc) == BFC_OK;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    bfc_stats st;
    bfc_pool_stats(sp->bfc, &st);
    if (!reserved || st.pool_bytes == 0)
        return 0; /* the pool grows: prealloc_us stays 0, as for one */
    const int64_t ns = (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000 + (t1.tv_nsec - t0.tv_nsec);
    sp->prealloc_us = (uint64_t)(ns / 1000);
    return st.pool_bytes;
}

/* ctx, a context of dev, is current; `primary`: it is dev's primary
 * context. */
static shim_pool *create_pool(const real_driver *R, CUcontext ctx, CUdevice dev, bool primary,
                              bool up_front)
{
    const shim_config *cfg = shim_config_get();
    size_t total = 0;
    if (R->DeviceTotalMem(&total, dev) != CUDA_SUCCESS || total == 0)
        return NULL;
    /* A context can be current and dead: after cudaDeviceReset the primary
     * context stays current, inactive, until the runtime's next call revives
     * it; cuCtxGetDevice still answers, but nothing can be allocated in it
     * (seen on an H100: a pool made then could not take a byte). */
    size_t device_free = 0, device_total = 0;
    CUresult usable = R->MemGetInfo(&device_free, &device_total);
    if (usable != CUDA_SUCCESS) {
        shim_log(LOG_DEBUG, "device %d: no pool for a context that cannot allocate (%d)",
                 (int)dev, (int)usable);
        return NULL;
    }
    uint64_t limit = pools_limit_for(total);
    /* The context's id is what tells, where the library sees no context go
     * (a plug-in, the door closed), that the pool's context was replaced
     * under the same handle (pools_context_identity). A pool made without
     * it could never be found replaced: after an unseen reset it would
     * serve the new context from the dead one's memory (e2e_drvfail
     * pool-id-fails-hooks-off). So when the driver has cuCtxGetId and
     * refuses it now, no pool is made: the call passes through unpooled,
     * and the next one asks again. Without cuCtxGetId (before 12.0) there
     * is no id to know. */
    unsigned long long ctx_id = 0;
    CUresult id_r = R->CtxGetId ? R->CtxGetId(ctx, &ctx_id) : CUDA_SUCCESS;
    if (id_r != CUDA_SUCCESS || (R->CtxGetId && !ctx_id)) {
        shim_log(LOG_DEBUG, "device %d: no pool for now: the context's id is not known (%d)",
                 (int)dev, (int)id_r);
        return NULL;
    }

    shim_pool *sp = calloc(1, sizeof *sp);
    if (!sp)
        return NULL;
    sp->ctx = ctx;
    sp->ctx_id = ctx_id;
    /* (the door closed: a context that died unseen with no pool left its
     * streams under the handle this one may have) */
    streams_forget_other_ids(ctx, sp->ctx_id);
    sp->dev = dev;
    sp->total_memory = total;
    sp->limit = limit;
    sp->primary = primary;
    pthread_mutex_init(&sp->lanes_lock, NULL);
    pthread_mutex_init(&sp->stand_in_lock, NULL);
    pthread_mutex_init(&sp->peers_lock, NULL);
    sp->lane_stream = calloc(LANE_SLOTS, sizeof *sp->lane_stream);
    sp->fences = calloc(LANE_SLOTS, sizeof *sp->fences);

    bfc_options o;
    bfc_options_init(&o);
    o.limit_bytes = limit;
    o.preallocate = up_front;
    o.initial_region_bytes = cfg->initial_region;
    o.region_granularity = granule;
    o.granularity = cfg->alignment;
    o.min_split_bytes = cfg->alignment;
    o.garbage_collection = cfg->garbage_collection;
    o.placement = cfg->placement;
    o.fence_interval = cfg->fence_interval;
    o.fence_bytes = cfg->fence_bytes;
    bfc_backend b = {.ctx = sp,
                     .region_alloc = region_alloc,
                     .region_free = region_free,
                     .fence_done = fences_done,
                     .fence_seal = fences_seal};
    sp->vmm_granule = use_vmm(R, cfg, dev);
    if (sp->vmm_granule) {
        /* One granule for the engine and for the driver calls (vmm.c): the
         * device's, or the blocks' alignment where that is coarser (both
         * powers of two, so a multiple of the device's, which cuMemCreate,
         * cuMemMap and cuMemAddressReserve take). Two granules that could
         * differ left reservations aligned to the device's granule under an
         * engine that needs the coarser one: nothing could be placed. */
        if (sp->vmm_granule < o.granularity)
            sp->vmm_granule = o.granularity;
        o.vmm = true;
        o.map_granularity = sp->vmm_granule;
        /* Spread: twice the limit of address space from the start, placed
         * by the rules of virtual memory. Replayed on the real traces it
         * needs less memory than one region first, but near its limit it
         * moves memory even where one region would serve the job: for a
         * job that would rather run slower than not fit. */
        o.prealloc_spread = cfg->layout == VMM_LAYOUT_SPREAD;
        sp->vmm_spread = o.prealloc_spread && up_front;
        o.release_threshold = cfg->release_threshold;
        o.growth_headroom = cfg->growth_headroom;
        vmm_backend(&b);
    }
    record_attach(sp, &b);
    if (sp->lane_stream && sp->fences)
        sp->bfc = bfc_pool_create(&o, &b);
    if (!sp->bfc || bfc_pool_lane_open(sp->bfc, false, &sp->plain_lane) != BFC_OK ||
        bfc_pool_lane_open(sp->bfc, true, &sp->legacy_lane) != BFC_OK) {
        bfc_pool_destroy(sp->bfc, true);
        free(sp->lane_stream);
        free(sp->fences);
        free(sp);
        return NULL;
    }
    atomic_store(&sp->lane_stream[sp->legacy_lane], CU_STREAM_LEGACY);

    const uint64_t taken = up_front ? take_up_front(sp) : 0;
    /* what the pool maps up front over virtual memory: whole granules */
    const uint64_t whole = sp->vmm_granule ? limit / sp->vmm_granule * sp->vmm_granule : limit;
    char lim[32], tot[32], got[32], asked[32], took[48] = "", why[128];
    if (taken && taken >= whole)
        snprintf(took, sizeof took, " (taken in %.1f ms)", (double)sp->prealloc_us / 1e3);
    /* Where the figure came from, in the user's own terms: a limit the
     * device cannot hold is said to be capped, not printed as if it were
     * the device's size. */
    format_size(total, tot, sizeof tot);
    if (!cfg->mem_limit)
        snprintf(why, sizeof why, "BFCSHIM_MEM_FRACTION=%g of the device's %s", cfg->mem_fraction,
                 tot);
    else if (cfg->mem_limit > total)
        snprintf(why, sizeof why, "BFCSHIM_MEM_LIMIT=%s, capped at the device's %s",
                 format_size(cfg->mem_limit, asked, sizeof asked), tot);
    else
        snprintf(why, sizeof why, "BFCSHIM_MEM_LIMIT of the device's %s", tot);
    shim_log(LOG_INFO, "device %d: pool of %s (%s), %s%s%s%s, free policy %s", (int)dev,
             format_size(limit, lim, sizeof lim), why,
             up_front ? "preallocated" : "growing on demand",
             sp->vmm_granule ? " over virtual memory" : "",
             sp->vmm_spread ? ", spread over twice its limit of address space" : "", took,
             cfg->free_policy == FREE_FENCED ? "fenced" : "immediate");
    /* A growing pool over virtual memory maps granules as blocks land in
     * one reserved range: it has no regions for an initial size to shape,
     * and a setting that silently did nothing would leave the user
     * believing it acted. */
    static atomic_bool said_initial;
    if (!up_front && sp->vmm_granule && cfg->initial_region_set)
        shim_log_once(&said_initial, LOG_WARN,
                      "BFCSHIM_INITIAL_REGION has no effect on a pool growing over virtual "
                      "memory (it maps granules as blocks land); it sizes the first region "
                      "only with BFCSHIM_VMM=off");
    if (up_front && !taken)
        shim_log(LOG_WARN, "device %d: could not take the %s pool up front; memory will be "
                           "taken as allocations need it",
                 (int)dev, lim);
    else if (up_front && taken < whole)
        shim_log(LOG_WARN, "device %d: took only %s of the %s pool up front (the device had no "
                           "more free memory); the rest will be taken as allocations need it",
                 (int)dev, format_size(taken, got, sizeof got), lim);
    if (cfg->plan_path)
        install_plan(sp, cfg->plan_path, o.granularity);
    return sp;
}

/* The live pool of ctx, or NULL; no lock (the registry's entries are
 * atomic, and a pool is never freed). */
static shim_pool *live_pool_of(CUcontext ctx)
{
    for (size_t i = 0, n = atomic_load(&npools); i < n; i++) {
        shim_pool *sp = atomic_load(&registry[i]);
        if (sp && sp->ctx == ctx && !atomic_load(&sp->dead))
            return sp;
    }
    return NULL;
}

static shim_pool *pool_get(CUcontext ctx, bool create, bool up_front)
{
    ctx = green_canonical(ctx); /* a green context allocates its primary's memory */
    shim_pool *found = live_pool_of(ctx);
    const real_driver *R = real_driver_get();
    if (found || !create || !R || !ctx)
        return found;
    /* The pool's context must be current while it is set up. Whether it is
     * primary is learnt before the registry's lock: learning it takes the
     * primary contexts' lock (real.c), which a hook holds while the driver
     * runs queued work, and work that forks takes the registry's lock in
     * the fork handler: after the primary lock there, so never before it
     * here. */
    bool pushed = real_ctx_enter(R, ctx);
    CUdevice dev = 0;
    if (R->CtxGetDevice(&dev) != CUDA_SUCCESS) {
        real_ctx_leave(R, pushed);
        return NULL;
    }
    bool primary = is_primary(R, ctx, dev);
    shim_pool *made = NULL;
    pthread_mutex_lock(&reg_lock);
    found = live_pool_of(ctx);
    size_t n = atomic_load(&npools);
    /* A new pool takes the first dead pool's slot, else a new one. Not the
     * slot of a pool over virtual memory whose granules are still to be
     * given back: the thread destroying its context gives them back after
     * the real call, and finds the pool in the registry (taken from it in
     * between, the pool kept its granules for good). */
    size_t slot = n;
    for (size_t i = 0; i < n && slot == n && !found; i++) {
        shim_pool *sp = atomic_load(&registry[i]);
        if (sp && atomic_load(&sp->dead) && (!sp->vmm_granule || atomic_load(&sp->given_back)))
            slot = i;
    }
    if (!found && slot == MAX_POOLS) {
        static atomic_bool said;
        shim_log_once(&said, LOG_WARN, "more than %d CUDA contexts alive at once: allocations "
                                       "in the others pass through unpooled", MAX_POOLS);
    } else if (!found) {
        found = made = create_pool(R, ctx, dev, primary, up_front);
        if (found) {
            found->serial = next_serial++;
            if (slot < n)
                retire(atomic_load(&registry[slot]));
            atomic_store(&registry[slot], found);
            if (slot == n)
                atomic_store(&npools, n + 1);
        }
    }
    pthread_mutex_unlock(&reg_lock);
    if (made) { /* published first: see fences_ordered_begin */
        fences_ordered_begin(made);
        pools_take_over_loans(made); /* the program's memory that outlived a context */
    }
    real_ctx_leave(R, pushed);
    return found;
}

shim_pool *pool_for_context(CUcontext ctx, bool create)
{
    return pool_get(ctx, create, shim_config_get()->preallocate);
}

shim_pool *pool_for_context_growing(CUcontext ctx) { return pool_get(ctx, true, false); }

/* By address alone: live pools own disjoint device memory (a pool whose
 * context went is dead before a new one can get its addresses), so no
 * question to the driver is needed (it was a cuCtxGetCurrent per free, for
 * a hint a range check answers). */
shim_pool *pool_owning(CUdeviceptr addr)
{
    size_t n = atomic_load(&npools);
    for (size_t i = 0; i < n; i++) {
        shim_pool *sp = atomic_load(&registry[i]);
        if (sp && !atomic_load(&sp->dead) && bfc_pool_owns(sp->bfc, addr))
            return sp;
    }
    return NULL;
}

static _Thread_local pool_context_scope lazy_context;

void pools_context_lazy_begin(shim_pool *sp, pool_context_scope *saved)
{
    *saved = lazy_context;
    lazy_context = (pool_context_scope){sp, false};
}

void pools_context_lazy_end(const pool_context_scope *saved)
{
    if (lazy_context.pushed)
        real_ctx_leave(real_driver_get(), true);
    lazy_context = *saved;
}

void pools_context_needed(shim_pool *sp)
{
    if (lazy_context.want != sp)
        return;
    lazy_context.want = NULL; /* entered from here on */
    lazy_context.pushed = real_ctx_enter(real_driver_get(), sp->ctx);
}

/* Which thread's teardown forgot a pool: the address of a thread-local,
 * unique among the threads alive. */
static _Thread_local char teardown_thread;

/* Is addr the start of a block a dead pool still lists as live? */
static bool dead_block(shim_pool *sp, CUdeviceptr addr)
{
    bfc_addr base = 0;
    uint64_t size = 0;
    return sp && atomic_load(&sp->dead) && bfc_pool_owns(sp->bfc, addr) &&
           bfc_pool_lookup(sp->bfc, addr, &base, &size) == BFC_OK && base == addr;
}

bool pools_dead_block(CUdeviceptr addr)
{
    size_t n = atomic_load(&npools);
    for (size_t i = 0; i < n; i++)
        if (dead_block(atomic_load(&registry[i]), addr))
            return true;
    for (size_t i = 0; i < pools_retired_count(); i++)
        if (dead_block(pools_retired_at(i), addr))
            return true;
    return false;
}

/* Pools forgotten so far (dead): the virtual memory door looks for loans
 * to take over only after one more (door_vmm.c, adopt_loans). */
static atomic_uint_fast64_t deaths;

uint64_t pools_deaths(void) { return atomic_load(&deaths); }

void pools_take_over_loans(shim_pool *sp)
{
    /* Marked seen only once taken over: an allocation on another thread
     * meanwhile waits for this takeover (door_vmm.c) rather than serving
     * the room the orphans need. */
    const uint64_t d = pools_deaths();
    vmm_door_take_over_loans(sp);
    atomic_store(&sp->deaths_seen, d);
}

/*
 * Trims and teardowns. A trim reaches every pool of a device from any
 * thread (cudaMemPoolTrimTo on a device's default pool, bfcshim_trim), also
 * a pool whose context another thread is tearing down: a trim that found
 * the pool alive went on pushing the dead context, recording events on its
 * dead streams and querying dead events (found by an audit: e2e_vmm_pool
 * trim-vs-teardown). So a trim enters the pool (counted in `trims`) only
 * while it is neither dead nor closing, and a teardown waits until no trim
 * is inside before its real call: one that forgets the pool first marks it
 * dead and then waits (pools_wait_dead_trims, outside the primary contexts'
 * lock where the teardown can), one that may forget it only after the call
 * holds it closing around the call (pools_hold_trims; a count, since two
 * threads may detach one context), and marks it dead before it lets go.
 * Both sides store, then load the other's mark (sequentially consistent),
 * so at least one sees the other; a trim reads closing before dead
 * (trim_enter).
 *
 * A program's trim never waits for the GPU while it is inside (the
 * engine's "give back what is idle now"; pools_trim_waits false): the
 * barrier of an ordered pool is queried, not waited for, so a teardown
 * waits for a few driver calls, not for queued work (a review found a
 * non-last primary release held, with every other thread's retain, behind
 * a trim waiting on a stuck kernel). What still waits: the immediate
 * policy's context synchronisation before memory goes back, a region's
 * cuMemFree without virtual memory, a plug-in's blind fences (no teardown
 * is seen there), and the virtual memory door's trim when the device is out
 * of memory.
 */
static _Thread_local bool trim_no_waits;

bool pools_trim_waits(void) { return !trim_no_waits; }

/* Closing is read before dead: a teardown that holds trims off goes from
 * closing (dead not yet) to dead (closing no more), marking the pool dead
 * before it lets go. Read the other way round, a trim could read dead
 * before the mark and closing after the hold ended, and enter a pool whose
 * context had just gone (traced with FAKECUDA_STALE_BACKTRACE: a trim
 * queried a dead event of a primary context whose last release had
 * finished; e2e_vmm_pool trim-vs-teardown, about one loaded TSan run in
 * fifty). In this order a trim that reads closing 0 read it either before
 * the hold, which then sees the trim and waits, or after it ended, and
 * then reads dead. */
static bool trim_enter(shim_pool *sp)
{
    atomic_fetch_add(&sp->trims, 1);
    if (atomic_load(&sp->closing) <= 0 && !atomic_load(&sp->dead))
        return true;
    atomic_fetch_sub(&sp->trims, 1);
    return false;
}

static void trim_leave(shim_pool *sp) { atomic_fetch_sub(&sp->trims, 1); }

static void trims_wait_out(const shim_pool *sp)
{
    /* (In a forked child the count may hold trims of parent threads that
     * do not exist there: nothing to wait for.) */
    while (atomic_load(&sp->trims) > 0 && !atomic_load(&shim_forked_child))
        nanosleep(&(struct timespec){0, 100000}, NULL);
}

void pools_hold_trims(CUcontext ctx, bool hold)
{
    size_t n = atomic_load(&npools);
    for (size_t i = 0; ctx && i < n; i++) {
        shim_pool *sp = atomic_load(&registry[i]);
        if (!sp || sp->ctx != ctx)
            continue;
        if (hold) {
            atomic_fetch_add(&sp->closing, 1);
            trims_wait_out(sp);
        } else {
            /* (a pool made in between was never held: left at 0) */
            int c = atomic_load(&sp->closing);
            while (c > 0 && !atomic_compare_exchange_weak(&sp->closing, &c, c - 1))
                ;
        }
    }
}

void pools_wait_dead_trims(void)
{
    size_t n = atomic_load(&npools);
    for (size_t i = 0; i < n; i++) {
        shim_pool *sp = atomic_load(&registry[i]);
        if (sp && atomic_load(&sp->dead))
            trims_wait_out(sp);
    }
}

static void forget_if(bool (*match)(const shim_pool *, const void *), const void *arg)
{
    size_t n = atomic_load(&npools);
    for (size_t i = 0; i < n; i++) {
        shim_pool *sp = atomic_load(&registry[i]);
        if (sp && !atomic_load(&sp->dead) && match(sp, arg)) {
            atomic_store(&sp->forgotten_by, (uintptr_t)&teardown_thread);
            atomic_store(&sp->dead, true); /* trims keep out (pools_wait_dead_trims) */
            atomic_fetch_add(&deaths, 1);
            record_detach(sp);
            shim_log(LOG_INFO, "device %d: context gone, its pool is forgotten", (int)sp->dev);
        }
    }
}

/* Only the pools this thread's own teardown forgot: another thread's
 * cuCtxDestroy may still be running its context's queued work on the
 * granules of the pool it forgot, and unmapped now that work would fault.
 * A teardown the driver refused keeps the memory mapped (the context may
 * live on and use it) and lets the registry slot go: a leak, never a
 * fault. */
void pools_give_back_forgotten(bool context_went)
{
    size_t n = atomic_load(&npools);
    for (size_t i = 0; i < n; i++) {
        shim_pool *sp = atomic_load(&registry[i]);
        if (!sp || !sp->vmm_granule || !atomic_load(&sp->dead) ||
            atomic_load(&sp->forgotten_by) != (uintptr_t)&teardown_thread ||
            atomic_exchange(&sp->given_back, true))
            continue;
        if (context_went)
            bfc_pool_abandon_memory(sp->bfc);
        else
            shim_log(LOG_WARN, "device %d: the driver refused to tear the context down; its "
                               "forgotten pool's memory stays mapped", (int)sp->dev);
    }
}

static bool same_ctx(const shim_pool *sp, const void *arg)
{
    return sp->ctx == *(const CUcontext *)arg;
}

static bool same_pool(const shim_pool *sp, const void *arg) { return sp == arg; }

ctx_identity pools_identity_of(CUcontext ctx, unsigned long long was)
{
    const real_driver *R = real_driver_get();
    unsigned long long id = 0;
    if (!R || !R->CtxGetId || !was)
        return CTX_SAME;
    CUresult r = R->CtxGetId(ctx, &id);
    if (r == CUDA_SUCCESS)
        return id == was ? CTX_SAME : CTX_REPLACED;
    return r == CUDA_ERROR_CONTEXT_IS_DESTROYED || r == CUDA_ERROR_INVALID_CONTEXT ? CTX_REPLACED
                                                                                 : CTX_UNKNOWN;
}

ctx_identity pools_context_identity(const shim_pool *sp)
{
    return pools_identity_of(sp->ctx, sp->ctx_id);
}

bool pools_forget_if_replaced(shim_pool *sp)
{
    /* Only an answer that the context is not the pool's forgets it: a
     * failure that says nothing of the context (CTX_UNKNOWN) keeps the pool
     * and its memory, which live blocks and queued work may still use
     * (e2e_plugin record-zero-ctxid-fails: the pool was forgotten, and the
     * queued work found its block unmapped). */
    if (atomic_load(&sp->dead) || pools_context_identity(sp) != CTX_REPLACED)
        return false;
    shim_log(LOG_INFO, "device %d: the pool's context went without the library seeing it "
                       "(loaded without LD_PRELOAD, or the driver door closed); a new pool "
                       "serves its successor",
             (int)sp->dev);
    forget_if(same_pool, sp);
    /* Its streams died with it, unseen, and are registered under the
     * handle the new context may have: no seal may touch them (e2e_fences
     * unseen-reset-streams). */
    streams_forget_context_id(sp->ctx, sp->ctx_id);
    /* As every teardown does: a trim that entered before the mark leaves
     * before the memory goes (a trim never waits for the GPU inside). */
    pools_wait_dead_trims();
    pools_give_back_forgotten(true);
    return true;
}

static bool primary_of(const shim_pool *sp, const void *arg)
{
    return sp->primary && sp->dev == *(const CUdevice *)arg;
}

bool pools_context_is_primary(CUcontext ctx)
{
    shim_pool *sp = live_pool_of(ctx);
    return sp && sp->primary;
}

void pools_context_gone(CUcontext ctx)
{
    forget_if(same_ctx, &ctx);
    streams_forget_context(ctx);
}

void pools_primary_gone(CUdevice dev)
{
    forget_if(primary_of, &dev);
    /* Its streams are registered under its handle. */
    CUcontext ctx = real_active_primary(real_driver_get(), dev);
    if (ctx)
        streams_forget_context(ctx);
}

/* ---- lanes --------------------------------------------------------------------- */

/* What names stream s for its lane: the handle alone where the library
 * sees every stream destroyed (the lane closes then), else the handle and
 * cuStreamGetId, "unique for the life of the program": a real driver may
 * give a destroyed stream's handle to the next stream made, while the
 * destroyed one's work still runs, and that stream must not take the
 * blocks in stream order. False when the id cannot be had (a driver
 * before CUDA 12.0): no lane then, the safe way. */
static bool stream_key(CUstream s, unsigned long long *id)
{
    *id = 0;
    if (streams_all_seen())
        return true;
    const real_driver *R = real_driver_get();
    return R && R->StreamGetId && R->StreamGetId(s, id) == CUDA_SUCCESS && *id;
}

/* Lanes lock held: the entry of handle s, or NULL. An entry of the handle
 * under another id (its stream went, unseen) leaves the table, and its lane
 * goes to *stale for the caller to retire outside the lock. */
static struct lane_entry *lane_entry_of(shim_pool *sp, CUstream s, unsigned long long id,
                                        uint32_t *stale)
{
    for (size_t i = 0; i < sp->nlanes; i++) {
        if (sp->lanes[i].stream != s)
            continue;
        if (sp->lanes[i].id == id)
            return &sp->lanes[i];
        *stale = sp->lanes[i].lane;
        sp->lanes[i] = sp->lanes[--sp->nlanes];
        return NULL;
    }
    return NULL;
}

/* A lane whose stream went unseen, its handle now another stream's: no
 * event may be recorded for it; an unsealed epoch (a seal refused at the
 * free) joins the plain lane, whose fence covers every stream. */
static void retire_stale_lane(shim_pool *sp, uint32_t stale)
{
    if (stale == BFC_NO_LANE)
        return;
    static atomic_bool said;
    shim_log_once(&said, LOG_INFO, "a stream handle was reused for a new stream after the old "
                                   "one was destroyed: the old stream's blocks wait for its work "
                                   "(logged once)");
    bfc_pool_lane_retire_into(sp->bfc, stale, sp->plain_lane);
}

static bool lane_lookup(shim_pool *sp, CUstream s, unsigned long long id, uint32_t *lane)
{
    uint32_t stale = BFC_NO_LANE;
    pthread_mutex_lock(&sp->lanes_lock);
    const struct lane_entry *e = lane_entry_of(sp, s, id, &stale);
    if (e)
        *lane = e->lane;
    pthread_mutex_unlock(&sp->lanes_lock);
    retire_stale_lane(sp, stale);
    return e != NULL;
}

/* Where streams go unseen, a lane is kept only for a stream of the pool's
 * own context (an event of the pool's context cannot be recorded on
 * another context's stream: cuEventRecord refuses, and an epoch nobody can
 * seal would wait for a seal on a handle that may die or name another
 * stream: the plain lane serves those), and at most UNSEEN_LANES of them
 * (a stream destroyed unseen never closes its lane; the oldest entry is
 * retired to make room, which is always safe). */
#define UNSEEN_LANES 16

bool pools_context_is(const shim_pool *sp, CUcontext c)
{
    return c && (c == sp->ctx || green_canonical(c) == sp->ctx);
}

/* What the driver says of an explicit stream's context (cuStreamGetCtx),
 * asked at most once per call: a handle that names no stream is asked about
 * once, not twice. */
typedef struct stream_ctx {
    bool asked;
    CUresult r;
    CUcontext c;
} stream_ctx;

static CUresult ask_stream_ctx(CUstream s, stream_ctx *q)
{
    if (!q->asked) {
        const real_driver *R = real_driver_get();
        q->asked = true;
        q->c = NULL;
        q->r = R && R->StreamGetCtx ? R->StreamGetCtx(s, &q->c) : CUDA_ERROR_NOT_SUPPORTED;
    }
    return q->r;
}

/* A lane is opened only for a stream of the pool's own context (asked once,
 * when the lane opens): a stream-ordered free on another context's stream
 * (another device's, a created context's) cannot be fenced by the pool's
 * events (an event is recorded only on a stream of its context), and is
 * settled instead (settle_foreign_stream). */
static bool lane_worth_opening(shim_pool *sp, CUstream s, stream_ctx *q)
{
    return ask_stream_ctx(s, q) == CUDA_SUCCESS && pools_context_is(sp, q->c);
}

/* The lane of an explicit stream handle, opened on first use; BFC_NO_LANE if
 * one cannot be had. q: what the driver said of s's context, if asked. */
static uint32_t stream_lane(shim_pool *sp, CUstream s, stream_ctx *q)
{
    uint32_t lane;
    unsigned long long id;
    if (!stream_key(s, &id))
        return BFC_NO_LANE;
    if (lane_lookup(sp, s, id, &lane))
        return lane;
    if (!lane_worth_opening(sp, s, q) || bfc_pool_lane_open(sp->bfc, true, &lane) != BFC_OK)
        return BFC_NO_LANE;
    if (fences_lazy_pool(sp)) /* sealed when the pool needs its memory */
        bfc_pool_lane_set_lazy(sp->bfc, lane, true);
    atomic_store_explicit(&sp->lane_stream[lane], s, memory_order_release);
    uint32_t stale = BFC_NO_LANE, evicted = BFC_NO_LANE;
    pthread_mutex_lock(&sp->lanes_lock);
    const struct lane_entry *e = lane_entry_of(sp, s, id, &stale);
    uint32_t existing = e ? e->lane : BFC_NO_LANE;
    if (existing == BFC_NO_LANE && !streams_all_seen() && sp->nlanes >= UNSEEN_LANES) {
        evicted = sp->lanes[0].lane;
        sp->lanes[0] = sp->lanes[--sp->nlanes];
    }
    if (existing == BFC_NO_LANE) {
        struct lane_entry *t = array_room(sp->lanes, sp->nlanes, &sp->caplanes, sizeof *t, 16);
        if (t)
            sp->lanes = t;
    }
    if (existing == BFC_NO_LANE && sp->nlanes < sp->caplanes)
        sp->lanes[sp->nlanes++] = (struct lane_entry){s, id, lane};
    else if (existing == BFC_NO_LANE)
        existing = sp->plain_lane; /* no host memory: be safe, wait for all */
    pthread_mutex_unlock(&sp->lanes_lock);
    retire_stale_lane(sp, stale);
    if (evicted != BFC_NO_LANE)
        bfc_pool_lane_retire_into(sp->bfc, evicted, sp->plain_lane);
    if (existing != BFC_NO_LANE) { /* another thread won, or no room */
        bfc_pool_lane_close(sp->bfc, lane);
        return existing;
    }
    return lane;
}

static bool per_thread_stream(CUstream s, bool per_thread_call)
{
    return s == CU_STREAM_PER_THREAD || (s == NULL && per_thread_call);
}

bool pool_legacy_by_barrier(shim_pool *sp)
{
    return streams_all_seen() && atomic_load_explicit(&sp->ordered, memory_order_acquire);
}

uint32_t pool_lane_for_alloc(shim_pool *sp, CUstream s, bool per_thread)
{
    /* The per-thread default stream has one handle for many streams: its
     * pending blocks are not reusable by handle. */
    if (per_thread_stream(s, per_thread))
        return BFC_NO_LANE;
    /* With a green context current the legacy stream is its default
     * stream, not the one the pool's legacy lane stands for. Nor is the
     * legacy lane taken in an ordered pool (preloaded): a legacy-stream
     * free there goes to the plain lane, whose barrier is the legacy-stream
     * action CUDA's free is (svc_free; e2e_fences legacy-lane-ptsz). Else
     * each such free made the legacy stream act before the block entered
     * the lane, and the lane is taken at once, in stream order, with no
     * host wait, as CUDA's pool does (e2e_fences legacy-reuse-stuck-events:
     * waiting for the lane's event hung behind a kernel that CUDA's reuse
     * does not wait for). The ordered state is left for good, so a block in
     * the legacy lane was freed with its action. */
    if (s == NULL || s == CU_STREAM_LEGACY)
        return green_is_current() || pool_legacy_by_barrier(sp) ? BFC_NO_LANE : sp->legacy_lane;
    stream_ctx q = {0};
    uint32_t lane = stream_lane(sp, s, &q);
    return lane == sp->plain_lane ? BFC_NO_LANE : lane;
}

/* Waits on the host for stream s of another context than the pool's, whose
 * work no fence of the pool orders (relaxed: the library may not see a
 * begin, and another thread may capture). ctx: s's context, pushed for the
 * event below; NULL when it is current (the legacy and per-thread
 * handles).
 *
 * The free CUDA would queue on s is ordered after more than s's own queue:
 * on the legacy stream it is a legacy-stream action, which "first waits on
 * all blocking streams" (per-thread default streams of every thread
 * included), and on a blocking stream it waits for the legacy stream's
 * earlier work. The shim queues nothing for the free, so synchronising s
 * alone waited for neither (e2e_fences other-device-legacy-after-ptsz,
 * other-device-blocking-after-legacy: the block came back under device
 * 1's work on the other kind of stream). So s first takes an action of its
 * own, a wait for an event recorded on it (the wait, not the record, is
 * the action), and the host then waits for s. */
static CUresult wait_for_foreign_stream(const real_driver *R, CUstream s, CUcontext ctx)
{
    bool pushed = ctx ? real_ctx_enter(R, ctx) : false;
    CUevent e = NULL;
    if (R->StreamWaitEvent && R->EventCreate(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS) {
        if (R->EventRecord(e, s) == CUDA_SUCCESS)
            R->StreamWaitEvent(s, e, 0);
        R->EventDestroy(e);
    }
    CUresult r = capture_relaxed_stream_wait(R, s);
    real_ctx_leave(R, pushed);
    return r;
}

/* Not waited for: its work may still use the block, which no fence of the
 * pool covers: the caller keeps it (BFC_NO_LANE). */
static void say_kept(CUstream s, CUresult r)
{
    shim_log(LOG_ERROR, "a stream-ordered free on stream %p of another context: waiting "
                        "for that stream failed (%d); the block is kept until exit",
             (void *)s, (int)r);
}

/* A stream-ordered free on an explicit stream no lane serves: a stream of
 * the pool's context without a lane (plug-in, no stream id, or no room)
 * goes to the plain lane, whose fence covers every stream of the context;
 * a stream of another context (a device-0 block freed on a device-1
 * stream, which cudaFreeAsync allows; no lane opens for it) is not covered
 * by any fence of the pool (an event of the pool's context cannot be
 * recorded on it, and the plain lane's fences cover only the pool's own
 * context), so its work is waited for now, while the caller vouches for
 * the stream. Rare, and correct.
 *
 * A handle whose context the driver cannot name (cuStreamGetCtx:
 * CUDA_ERROR_INVALID_HANDLE, _INVALID_CONTEXT, _CONTEXT_IS_DESTROYED) names
 * no live stream: destroyed unseen (a plug-in), or beyond the dead handles
 * streams.c remembers, or with its context. CUDA refuses the free, and so
 * does the shim (*refused, the block staying the program's). Taken as the
 * pool's own, the block went to the plain lane with no wait, though the
 * stream may have been another context's, whose queued work no fence of
 * the pool covers (a destroyed stream's work goes on: cuStreamDestroy
 * "will return immediately"): e2e_fences other-device-dead-stream,
 * e2e_plugin cross-context-dead, found by an audit. Any other failure (an
 * earlier launch's error) keeps the block, with one line. */
static bool settle_foreign_stream(shim_pool *sp, CUstream s, stream_ctx *q, CUresult *refused)
{
    const real_driver *R = real_driver_get();
    if (!R || !R->StreamGetCtx || !R->StreamSynchronize)
        return true;
    CUresult g = ask_stream_ctx(s, q);
    if (g == CUDA_ERROR_INVALID_HANDLE || g == CUDA_ERROR_INVALID_CONTEXT ||
        g == CUDA_ERROR_CONTEXT_IS_DESTROYED) {
        *refused = g;
        return false;
    }
    if (g != CUDA_SUCCESS) {
        shim_log(LOG_ERROR, "a stream-ordered free on stream %p: the driver cannot say whose "
                            "stream it is (%d); the block is kept until exit",
                 (void *)s, (int)g);
        return false;
    }
    if (pools_context_is(sp, q->c))
        return true;
    CUresult r = wait_for_foreign_stream(R, s, q->c);
    if (r != CUDA_SUCCESS)
        say_kept(s, r);
    return r == CUDA_SUCCESS;
}

/* The pool of the calling thread's current context, if it has one (never
 * made here: a free must not make a pool). */
static shim_pool *existing_current_pool(const real_driver *R, void *key, CUcontext *ctx)
{
    (void)key;
    *ctx = NULL;
    if (R->CtxGetCurrent(ctx) != CUDA_SUCCESS || !*ctx)
        return NULL;
    return pool_for_context(*ctx, false);
}

shim_pool *pools_current_existing(const real_driver *R)
{
    return current_context_pool_unchecked(R, existing_current_pool);
}

uint32_t pool_lane_for_free(shim_pool *sp, CUstream s, bool per_thread, bool legacy_is_pools,
                            CUresult *refused)
{
    *refused = CUDA_SUCCESS;
    /* The legacy and per-thread handles name the current context's
     * streams: in another context than the pool's (another device current),
     * its work is ordered by no fence of the pool; that stream is waited
     * for on the host, and the block goes to the plain lane
     * (found by an audit: the block came back under device 1's queued
     * work). The current context is remembered: no driver call in the
     * common case; and none where the caller named the block's device, whose
     * legacy stream it means (PyTorch's pluggable allocator: loaded as a
     * plug-in, the library remembers nothing, and asked at every free). */
    bool legacy = s == NULL || s == CU_STREAM_LEGACY;
    if (!svc_explicit_stream(s) && !(legacy_is_pools && legacy && !per_thread)) {
        const real_driver *R = real_driver_get();
        if (R && pools_current_existing(R) != sp) {
            /* (stream 0 of a _ptsz call is the per-thread stream: waited
             * for as 0, cuStreamSynchronize waited for the legacy stream,
             * which need not have joined it; e2e_fences
             * other-device-ptsz0, found by the per-thread audit) */
            CUstream named = per_thread_stream(s, per_thread) ? CU_STREAM_PER_THREAD : s;
            CUresult r = wait_for_foreign_stream(R, named, NULL);
            if (r == CUDA_SUCCESS)
                return sp->plain_lane;
            /* No such stream: no context is current, or the current one
             * was destroyed or is a primary context reset since (inactive).
             * CUDA refuses a free there (cuda.h: CUDA_ERROR_INVALID_CONTEXT,
             * CUDA_ERROR_CONTEXT_IS_DESTROYED), and so does the shim, the
             * block staying the program's: kept, it was lost for good
             * behind a CUDA_SUCCESS (e2e_api free-async-other-dead, -ptsz,
             * free-async-no-context; found by an audit). Asked only now
             * that the wait failed: nothing on the common path. Any other
             * answer keeps the block, as before: the stream may be there
             * and its work still use the block (e2e_drvfail
             * foreign-free-legacy-sync). */
            unsigned long long id = 0;
            CUresult why = R->CtxGetId ? R->CtxGetId(NULL, &id) : CUDA_SUCCESS;
            if (why == CUDA_ERROR_INVALID_CONTEXT || why == CUDA_ERROR_CONTEXT_IS_DESTROYED)
                *refused = why;
            else
                say_kept(named, r);
            return BFC_NO_LANE;
        }
    }
    /* A block freed on a per-thread stream waits for every stream: the
     * legacy stream's fence covers the per-thread ones. */
    if (per_thread_stream(s, per_thread))
        return sp->plain_lane;
    /* A green context's default stream: its frees wait for every stream,
     * the green contexts' included (the plain lane's fence). */
    if (s == NULL || s == CU_STREAM_LEGACY)
        return green_is_current() ? sp->plain_lane : sp->legacy_lane;
    stream_ctx q = {0};
    uint32_t lane = stream_lane(sp, s, &q);
    if (lane != BFC_NO_LANE)
        return lane;
    return settle_foreign_stream(sp, s, &q, refused) ? sp->plain_lane : BFC_NO_LANE;
}

void pools_seal_stream_lane(shim_pool *sp, CUstream s)
{
    uint32_t lane;
    unsigned long long id;
    const real_driver *R = real_driver_get();
    if (!R || !stream_key(s, &id) || !lane_lookup(sp, s, id, &lane))
        return;
    bool pushed = real_ctx_enter(R, sp->ctx);
    bool sealed = bfc_pool_seal_lane(sp->bfc, lane);
    real_ctx_leave(R, pushed);
    if (sealed)
        return;
    /* Refused (the stream began a capture, say): no later seal may name
     * this handle, which the caller vouches for only now. The lane leaves
     * the table and its epoch joins the plain lane. */
    uint32_t gone = BFC_NO_LANE;
    pthread_mutex_lock(&sp->lanes_lock);
    for (size_t i = 0; i < sp->nlanes; i++)
        if (sp->lanes[i].lane == lane) {
            gone = lane;
            sp->lanes[i] = sp->lanes[--sp->nlanes];
            break;
        }
    pthread_mutex_unlock(&sp->lanes_lock);
    if (gone != BFC_NO_LANE)
        bfc_pool_lane_retire_into(sp->bfc, gone, sp->plain_lane);
}

void pools_stream_destroyed(CUstream s)
{
    if (!green_stream_destroyed(s))
        capture_stand_in(s, false);
    const real_driver *R = real_driver_get();
    size_t n = atomic_load(&npools);
    for (size_t i = 0; R && i < n; i++) {
        shim_pool *sp = atomic_load(&registry[i]);
        if (!sp || atomic_load(&sp->dead))
            continue;
        uint32_t lane = BFC_NO_LANE;
        pthread_mutex_lock(&sp->lanes_lock);
        for (size_t k = 0; k < sp->nlanes; k++)
            if (sp->lanes[k].stream == s) {
                lane = sp->lanes[k].lane;
                sp->lanes[k] = sp->lanes[--sp->nlanes];
                break;
            }
        pthread_mutex_unlock(&sp->lanes_lock);
        if (lane == BFC_NO_LANE)
            continue;
        /* Closing seals the lane's open epoch: an event on the stream while
         * it still exists, recorded in the pool's context. If that cannot
         * be made now (a green stream while its green context captures),
         * the epoch joins the plain lane, whose fence includes the stand-in
         * just recorded for this stream's work (and the green contexts'),
         * rather than wait for a seal on a handle about to die
         * (e2e_green green-async-capture-destroy). */
        bool pushed = real_ctx_enter(R, sp->ctx);
        bfc_pool_lane_close_into(sp->bfc, lane, sp->plain_lane);
        real_ctx_leave(R, pushed);
    }
    streams_remove(s);
}

bool pools_lend(shim_pool *sp, uint64_t bytes)
{
    /* Granules go back with cuMemUnmap, regions with cuMemFree, in the
     * pool's context. */
    const real_driver *R = real_driver_get();
    bool pushed = real_ctx_enter(R, sp->ctx);
    bfc_status s = bfc_pool_lend(sp->bfc, bytes);
    /* Plain frees the program's unseen streams may still use wait for a
     * context synchronisation (blind fences): made only when the loan
     * needs them, as before an allocation fails. */
    if (s == BFC_ERR_OOM && fences_sync_blind(sp))
        s = bfc_pool_lend(sp->bfc, bytes);
    real_ctx_leave(R, pushed);
    return s == BFC_OK;
}

uint64_t pools_trim(shim_pool *sp, bool may_wait)
{
    if (!trim_enter(sp))
        return 0;
    bool had = trim_no_waits;
    trim_no_waits = !may_wait;
    /* Regions go back with cuMemFree, granules with cuMemUnmap, and fences
     * are recorded in the pool's context. */
    const real_driver *R = real_driver_get();
    bool pushed = real_ctx_enter(R, sp->ctx);
    uint64_t released = bfc_pool_trim(sp->bfc);
    /* Plain frees the program's unseen streams may still use (blind fences,
     * fences.c) wait for a context synchronisation; a trim, which the
     * caller asked for, makes it (the first trim sealed them), then gives
     * back what that freed. */
    if (fences_sync_blind(sp))
        released += bfc_pool_trim(sp->bfc);
    real_ctx_leave(R, pushed);
    trim_no_waits = had;
    trim_leave(sp);
    return released;
}
