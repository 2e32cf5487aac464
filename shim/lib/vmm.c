/*
 * vmm.c - the engine's backend over CUDA's virtual memory management API
 * (BFCSHIM_VMM): a pool region is an address range from cuMemAddressReserve,
 * and the engine maps physical memory behind it granule by granule.
 *
 * One physical allocation (cuMemCreate) per granule: cuMemUnmap cannot cut a
 * mapping in two, and the engine gives back any granule that lies wholly in
 * free space. Each handle is released as soon as it is mapped; the memory
 * stays until its mapping goes ("freed when all outstanding mappings to the
 * memory are unmapped and when all outstanding references to the handle ...
 * are also released", cuda.h on cuMemRelease), so the shim keeps no table of
 * handles. Under pressure the engine unmaps free granules only to map as
 * many where a block landed (bfc_backend.keep): then each granule's handle
 * is retained before its unmap (cuMemRetainAllocationHandle) and the maps
 * that follow use those handles before cuMemCreate, so the memory moves
 * without going back to the driver, where another process or the driver
 * itself could take it, and a move creates nothing; what is left when the
 * engine's call ends is released.
 *
 * Access is granted to the pool's own device (cuMemMap alone makes
 * nothing accessible), one cuMemSetAccess over each run of granules mapped
 * together, and to every device that enabled peer access to the
 * pool's context (cuCtxEnablePeerAccess, which the driver door intercepts;
 * cudaDeviceEnablePeerAccess reaches it through cudart's lookup): already
 * mapped granules at that moment, later ones as they are mapped. When the
 * last context of that device disables its access (cuCtxDisablePeerAccess),
 * the device loses it on every granule again, as it would on cudaMalloc's
 * memory: a program that forgets to enable access faults with the pool as
 * without it.
 *
 * cuMemUnmap does not wait for the GPU. The engine unmaps only free space,
 * and under the default free policy a block becomes free only after its
 * fences completed, or, in an ordered pool, once the last barrier did
 * (release_ready). Under BFCSHIM_FREE_POLICY=immediate a freed block is free
 * at once, so before the engine gives free space back (release_ready) the
 * context's work is waited for; while a stream capture is under way that
 * wait (cuCtxSynchronize) is refused and would invalidate the capture, so
 * the granules stay mapped until a later release finds no capture.
 *
 * The callbacks run with the engine's lock held and the pool's context
 * current (the doors make it current before they allocate).
 */
#include <string.h>
#include <time.h>

#include "array_room.h"
#include "shim.h"
#include "units.h"

static CUmemAllocationProp device_prop(CUdevice dev)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)dev;
    return prop;
}

uint64_t vmm_granularity(const real_driver *R, CUdevice dev)
{
    if (!R->MemAddressReserve || !R->MemAddressFree || !R->MemCreate || !R->MemRelease ||
        !R->MemMap || !R->MemUnmap || !R->MemSetAccess || !R->MemGetAllocationGranularity ||
        !R->DeviceGetAttribute)
        return 0;
    int supported = 0;
    if (R->DeviceGetAttribute(&supported,
                              CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                              dev) != CUDA_SUCCESS ||
        !supported)
        return 0;
    CUmemAllocationProp prop = device_prop(dev);
    size_t g = 0;
    if (R->MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) !=
            CUDA_SUCCESS ||
        g == 0 || (g & (g - 1)))
        return 0;
    return g;
}

/* One read-write entry of an access list. */
static CUmemAccessDesc read_write(int dev)
{
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return d;
}

/* Puts one physical granule of `prop` behind [at, at + g): cuMemCreate,
 * cuMemMap, and the handle released at once (the mapping keeps the memory;
 * its unmap frees it). On failure *step names the call that failed. */
static CUresult map_granule(const real_driver *R, CUdeviceptr at, uint64_t g,
                            const CUmemAllocationProp *prop, const char **step)
{
    CUmemGenericAllocationHandle h = 0;
    CUresult r;
    *step = "cuMemCreate";
    if ((r = R->MemCreate(&h, (size_t)g, prop, 0)) != CUDA_SUCCESS)
        return r;
    *step = "cuMemMap";
    r = R->MemMap(at, (size_t)g, 0, h, 0);
    R->MemRelease(h);
    return r;
}

/* A driver may report virtual memory management and still refuse one of
 * its calls (cuMemSetAccess under WSL2, pytorch/pytorch#192330): the pool
 * would then fail its first allocation. Two granules taken through every
 * call the pool makes, as it makes them (each its own mapping, access set
 * once over both: set_access), find that out before the pool is made. */
CUresult vmm_probe(const real_driver *R, CUdevice dev, uint64_t granule, const char **step)
{
    CUdeviceptr va = 0;
    CUmemAllocationProp prop = device_prop(dev);
    CUmemAccessDesc rw = read_write((int)dev);
    const size_t g = (size_t)granule;
    CUresult r;
    *step = "cuMemAddressReserve";
    if ((r = R->MemAddressReserve(&va, 2 * g, g, 0, 0)) != CUDA_SUCCESS)
        return r;
    int mapped = 0;
    while (mapped < 2 && (r = map_granule(R, va + (CUdeviceptr)mapped * g, granule, &prop,
                                          step)) == CUDA_SUCCESS)
        mapped++;
    if (r == CUDA_SUCCESS) {
        *step = "cuMemSetAccess";
        r = R->MemSetAccess(va, 2 * g, &rw, 1);
    }
    for (int i = 0; i < mapped; i++) {
        CUresult u = R->MemUnmap(va + (CUdeviceptr)i * g, g);
        if (r == CUDA_SUCCESS && u != CUDA_SUCCESS) {
            *step = "cuMemUnmap";
            r = u;
        }
    }
    R->MemAddressFree(va, 2 * g);
    return r;
}

static int va_reserve(void *ctx, uint64_t size, bfc_addr *base)
{
    shim_pool *sp = ctx;
    pools_context_needed(sp);
    CUdeviceptr p = 0;
    CUresult r = real_driver_get()->MemAddressReserve(&p, (size_t)size, (size_t)sp->vmm_granule,
                                                      0, 0);
    if (r != CUDA_SUCCESS) {
        shim_log(LOG_WARN, "device %d: cuMemAddressReserve of %llu bytes failed (%d)",
                 (int)sp->dev, (unsigned long long)size, (int)r);
        return 1;
    }
    *base = p;
    /* A preallocated pool reserves its limit, laid out as one region, and
     * more address space only when no free chunk holds a block: from now
     * on free memory moves to where blocks land (which one cuMemAlloc
     * region could not do: it would have failed here). Said once, as it
     * costs time and means the job runs at its limit. (Spread out, the
     * pool moves memory from the start: nothing new to say.) */
    if (++sp->vmm_reservations == 2 && shim_config_get()->preallocate && !sp->vmm_spread) {
        char lim[32];
        shim_log(LOG_INFO, "device %d: the preallocated pool of %s is full or fragmented: "
                           "free memory now moves to where blocks land (remapping; raise "
                           "BFCSHIM_MEM_FRACTION or BFCSHIM_MEM_LIMIT to avoid it)",
                 (int)sp->dev, format_size(sp->limit, lim, sizeof lim));
    }
    return 0;
}

static void va_free(void *ctx, bfc_addr base, uint64_t size)
{
    pools_context_needed(ctx);
    real_driver_get()->MemAddressFree(base, (size_t)size);
}

/* Keeps a retained handle for the maps that follow; false when host memory
 * runs out (the caller releases it: the memory goes back). */
static bool push_kept(shim_pool *sp, CUmemGenericAllocationHandle h)
{
    CUmemGenericAllocationHandle *t =
        array_room(sp->vmm_kept, sp->vmm_nkept, &sp->vmm_capkept, sizeof *t, 64);
    if (!t)
        return false;
    sp->vmm_kept = t;
    sp->vmm_kept[sp->vmm_nkept++] = h;
    return true;
}

/* Unmaps [addr, addr + size) of pool sp one granule at a time, as mapped;
 * while the engine moves memory, keeps each granule's physical memory
 * (its handle retained first) for the maps that follow. A refusal is said
 * (once per call, naming the device, as every other message here does):
 * the device does not get that memory back. With `stop`, the first refusal
 * ends the call, the granules from there on left mapped; without, every
 * granule is tried. Returns the bytes unmapped before the first refusal
 * (bfc_backend.unmap's answer: cuMemUnmap refused leaves the mapping as it
 * was, so those granules stay mapped and intact). */
static uint64_t unmap_granules(shim_pool *sp, const real_driver *R, bfc_addr addr, uint64_t size,
                               bool stop)
{
    const uint64_t g = sp->vmm_granule;
    const bool keeping = sp->vmm_keeping && R->MemRetainAllocationHandle;
    CUresult first = CUDA_SUCCESS;
    uint64_t stuck = 0, done = size;
    for (uint64_t off = 0; off < size; off += g) {
        CUmemGenericAllocationHandle h = 0;
        bool retained = keeping &&
                        R->MemRetainAllocationHandle(&h, (void *)(uintptr_t)(addr + off)) ==
                            CUDA_SUCCESS;
        CUresult r = R->MemUnmap(addr + off, (size_t)g);
        if (retained && (r != CUDA_SUCCESS || !push_kept(sp, h)))
            R->MemRelease(h);
        if (r != CUDA_SUCCESS) {
            if (first == CUDA_SUCCESS) {
                first = r;
                done = off;
            }
            stuck += stop ? size - off : g;
            if (stop)
                break;
        }
    }
    if (stuck)
        shim_log(LOG_WARN,
                 "device %d: cuMemUnmap failed (%d): %llu bytes at 0x%llx stay mapped%s",
                 (int)sp->dev, (int)first, (unsigned long long)stuck,
                 (unsigned long long)(addr + done),
                 stop ? " (the pool keeps them, free, and tries again later)" : "");
    return done;
}

/* The access list of the pool's mappings: its own device, and every device
 * that enabled peer access to its context (at most 64 more). Returns the
 * number of entries. */
static size_t access_list(shim_pool *sp, CUmemAccessDesc desc[65])
{
    size_t n = 0;
    desc[n++] = read_write((int)sp->dev);
    uint64_t peers = atomic_load(&sp->vmm_peers);
    if (sp->dev >= 0 && sp->dev < 64)
        peers &= ~(UINT64_C(1) << sp->dev);
    for (; peers; peers &= peers - 1)
        desc[n++] = read_write(__builtin_ctzll(peers));
    return n;
}

/* Sets the n entries of desc on [addr, addr + size), a run of whole
 * granules, each its own mapping, in one call: cuda.h asks for "a fully
 * mapped address range containing all allocations", which a run of whole
 * mappings is (PyTorch's expandable segments set access so across their
 * handles). One call a run, not one a granule: a move under pressure maps
 * hundreds of granules a step. */
static CUresult set_access(const real_driver *R, bfc_addr addr, uint64_t size,
                           const CUmemAccessDesc *desc, size_t n)
{
    return R->MemSetAccess(addr, (size_t)size, desc, n);
}

/* Makes [addr, addr + size) accessible per the pool's access list. */
static CUresult grant(shim_pool *sp, const real_driver *R, bfc_addr addr, uint64_t size)
{
    CUmemAccessDesc desc[65];
    size_t n = access_list(sp, desc);
    return set_access(R, addr, size, desc, n);
}

static void grant_run(void *arg, bfc_addr addr, uint64_t size)
{
    shim_pool *sp = arg;
    CUresult r = grant(sp, real_driver_get(), addr, size);
    if (r != CUDA_SUCCESS)
        shim_log(LOG_WARN, "device %d: giving peers access to 0x%llx (%llu bytes) failed (%d)",
                 (int)sp->dev, (unsigned long long)addr, (unsigned long long)size, (int)r);
}

struct revoke_arg {
    shim_pool *sp;
    int dev;
};

/* Withdraws device `arg->dev`'s access from one mapped range. */
static void revoke_run(void *arg, bfc_addr addr, uint64_t size)
{
    const struct revoke_arg *a = arg;
    CUmemAccessDesc none = read_write(a->dev);
    none.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    CUresult r = set_access(real_driver_get(), addr, size, &none, 1);
    if (r != CUDA_SUCCESS)
        shim_log(LOG_WARN, "device %d: taking peer device %d's access to 0x%llx (%llu bytes) failed (%d)",
                 (int)a->sp->dev, a->dev, (unsigned long long)addr, (unsigned long long)size, (int)r);
}

/* The pool over virtual memory of `peer`, and the current context's device
 * (< 64); NULL when there is none or the device cannot be named. */
static shim_pool *peer_pool(const real_driver *R, CUcontext peer, CUdevice *me)
{
    shim_pool *sp = pool_for_context(peer, false);
    if (!sp || !sp->vmm_granule || !R || R->CtxGetDevice(me) != CUDA_SUCCESS || *me < 0 ||
        *me >= 64)
        return NULL;
    return sp;
}

/* Runs fn on every mapped range of the pool, under the engine's lock (no
 * mapping is made meanwhile, and every later one reads the access list as it
 * is now) and with the pool's context current, which cuMemSetAccess needs. */
static void each_mapped_range(const real_driver *R, shim_pool *sp,
                              void (*fn)(void *, bfc_addr, uint64_t), void *arg)
{
    bool pushed = real_ctx_enter(R, sp->ctx);
    bfc_pool_each_mapped(sp->bfc, fn, arg);
    real_ctx_leave(R, pushed);
}

/* peers_lock held: withdraws device dev's access unless one of its
 * contexts still holds it (cuda.h keeps access per pair of contexts, the
 * pool per device) or it is kept for good. Returns whether it withdrew. */
static bool revoke_if_unheld(const real_driver *R, shim_pool *sp, int dev)
{
    const uint64_t bit = UINT64_C(1) << dev;
    for (size_t i = 0; i < sp->vmm_nenablers; i++)
        if (sp->vmm_enablers[i].dev == dev)
            return false;
    if (!(atomic_load(&sp->vmm_peers) & bit) || (sp->vmm_peers_kept & bit))
        return false;
    atomic_fetch_and(&sp->vmm_peers, ~bit);
    struct revoke_arg a = {sp, dev};
    each_mapped_range(R, sp, revoke_run, &a);
    return true;
}

/* peers_lock held: forgets context ctx's pair (a context has one device,
 * and enables access to a peer once); whether it was known, and its device
 * in *dev. */
static bool enabler_remove(shim_pool *sp, CUcontext ctx, int *dev)
{
    for (size_t i = 0; i < sp->vmm_nenablers; i++)
        if (sp->vmm_enablers[i].ctx == ctx) {
            *dev = sp->vmm_enablers[i].dev;
            sp->vmm_enablers[i] = sp->vmm_enablers[--sp->vmm_nenablers];
            return true;
        }
    return false;
}

static void log_access(const shim_pool *sp, int dev, bool given)
{
    shim_log(LOG_INFO, given ? "device %d: pooled memory made accessible to peer device %d"
                             : "device %d: peer device %d no longer has access to pooled memory",
             (int)sp->dev, dev);
}

void vmm_peer_access(CUcontext peer, bool enabled)
{
    const real_driver *R = real_driver_get();
    CUdevice me = 0;
    CUcontext cur = NULL;
    shim_pool *sp = peer_pool(R, peer, &me);
    if (!sp || R->CtxGetCurrent(&cur) != CUDA_SUCCESS)
        return;
    const uint64_t bit = UINT64_C(1) << me;
    bool changed = true;
    pthread_mutex_lock(&sp->peers_lock);
    if (enabled) {
        if (sp->vmm_nenablers < VMM_MAX_ENABLERS) {
            sp->vmm_enablers[sp->vmm_nenablers++] = (struct vmm_enabler){cur, (int)me};
        } else if (!(sp->vmm_peers_kept & bit)) {
            sp->vmm_peers_kept |= bit;
            shim_log(LOG_WARN, "device %d: more than %d contexts enabled peer access to pooled "
                               "memory; device %d keeps its access while the pool lives",
                     (int)sp->dev, VMM_MAX_ENABLERS, (int)me);
        }
        /* Granted again on every enable: harmless, and the list is sure. */
        atomic_fetch_or(&sp->vmm_peers, bit);
        each_mapped_range(R, sp, grant_run, sp);
    } else {
        int dev = (int)me;
        changed = enabler_remove(sp, cur, &dev) && revoke_if_unheld(R, sp, dev);
    }
    pthread_mutex_unlock(&sp->peers_lock);
    if (changed)
        log_access(sp, (int)me, enabled);
}

void vmm_context_gone(CUcontext ctx)
{
    const real_driver *R = real_driver_get();
    if (!R || !ctx)
        return;
    for (size_t i = 0, n = pools_count(); i < n; i++) {
        shim_pool *sp = pools_at(i);
        if (!sp || !sp->vmm_granule || atomic_load(&sp->dead))
            continue;
        int dev = 0;
        bool withdrawn = false;
        pthread_mutex_lock(&sp->peers_lock);
        while (enabler_remove(sp, ctx, &dev))
            withdrawn |= revoke_if_unheld(R, sp, dev);
        pthread_mutex_unlock(&sp->peers_lock);
        if (withdrawn)
            log_access(sp, dev, false);
    }
}

/* Puts physical memory behind one granule at `at`: a kept granule's
 * (moved) when the engine is moving memory and one is left, else a new one. */
static CUresult map_one(shim_pool *sp, const real_driver *R, CUdeviceptr at,
                        const CUmemAllocationProp *prop, const char **step)
{
    if (!sp->vmm_nkept)
        return map_granule(R, at, sp->vmm_granule, prop, step);
    CUmemGenericAllocationHandle h = sp->vmm_kept[--sp->vmm_nkept];
    *step = "cuMemMap";
    CUresult r = R->MemMap(at, (size_t)sp->vmm_granule, 0, h, 0);
    R->MemRelease(h); /* the mapping holds it now; on failure it goes */
    if (r == CUDA_SUCCESS)
        atomic_fetch_add(&sp->vmm_moved_bytes, sp->vmm_granule);
    return r;
}

/* bfc_backend.map: all of [addr, addr + size) mapped and made accessible,
 * or, on a failure, rolled back. The rollback unmaps from the top down and
 * ends at a refused cuMemUnmap (the mapping stays as it was): that granule
 * and those below it stay mapped, a prefix the engine is told of so that it
 * counts them (pool_bytes as the device holds them) and gives them back
 * later as free space; before, they were lost to the pool and a later map
 * over them was refused. They are usable only once accessible: when
 * cuMemSetAccess refuses them too, they are reported unmapped (lost, as
 * before, rather than handed out to fault). */
static uint64_t map_range(void *ctx, bfc_addr addr, uint64_t size)
{
    shim_pool *sp = ctx;
    pools_context_needed(sp);
    const real_driver *R = real_driver_get();
    const uint64_t g = sp->vmm_granule;
    CUmemAllocationProp prop = device_prop(sp->dev);
    CUresult r = CUDA_SUCCESS;
    const char *step;
    uint64_t done = 0;
    for (; done < size; done += g)
        if ((r = map_one(sp, R, addr + done, &prop, &step)) != CUDA_SUCCESS)
            break;
    if (r == CUDA_SUCCESS) {
        step = "cuMemSetAccess";
        if ((r = grant(sp, R, addr, size)) == CUDA_SUCCESS)
            return size;
    }
    /* What was mapped goes back (to the kept granules while memory moves). */
    uint64_t left = done;
    while (left > 0 && unmap_granules(sp, R, addr + left - g, g, true) == g)
        left -= g;
    shim_log(LOG_DEBUG, "device %d: mapping %llu bytes at 0x%llx failed at %s (%d)",
             (int)sp->dev, (unsigned long long)size, (unsigned long long)addr, step, (int)r);
    if (left && grant(sp, R, addr, left) != CUDA_SUCCESS) {
        shim_log(LOG_WARN, "device %d: %llu bytes at 0x%llx stay mapped but inaccessible: "
                           "the pool cannot use them",
                 (int)sp->dev, (unsigned long long)left, (unsigned long long)addr);
        return 0;
    }
    return left;
}

static uint64_t unmap_range(void *ctx, bfc_addr addr, uint64_t size)
{
    pools_context_needed(ctx);
    return unmap_granules(ctx, real_driver_get(), addr, size, true);
}

/* The engine moves memory between keep(true) and keep(false): unmapped
 * granules are kept for the maps that follow, and what is left at the end
 * goes back to the device. */
static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void keep(void *ctx, bool on)
{
    shim_pool *sp = ctx;
    pools_context_needed(sp);
    sp->vmm_keeping = on;
    if (on) {
        sp->vmm_keep_t0_ns = now_ns();
        return;
    }
    const real_driver *R = real_driver_get();
    for (size_t i = 0; i < sp->vmm_nkept; i++)
        R->MemRelease(sp->vmm_kept[i]);
    free(sp->vmm_kept);
    sp->vmm_kept = NULL;
    sp->vmm_nkept = sp->vmm_capkept = 0;
    /* the window's time, the kept granules' release included */
    atomic_fetch_add(&sp->vmm_pressure_ns, now_ns() - sp->vmm_keep_t0_ns);
    atomic_fetch_add(&sp->vmm_pressure_maps, 1);
}

/* Asked once before the engine gives free space back on its own. Under the
 * fenced policy free space is idle once the last ordered barrier is
 * (fences.c: an ordered seal makes blocks reusable before their old work
 * ran); under the immediate one
 * queued work may still use it: wait for the pool's context's work, unless a
 * capture is under way. From the test to the end of the wait no capture can
 * begin (streams_use_begin: a begin waits), so the wait never invalidates
 * one. */
static bool release_ready(void *ctx)
{
    shim_pool *sp = ctx;
    pools_context_needed(sp);
    if (shim_config_get()->free_policy != FREE_IMMEDIATE)
        return fences_barrier_idle(sp, pools_trim_waits());
    streams_use_begin();
    bool ready = false;
    /* The pool's context, not the caller's: a free arrives with whichever
     * context the program has current (another device's, e2e_vmm_pool
     * immediate-other-device). Where capture begins go unseen (a plug-in,
     * the driver door closed) the count says nothing: the driver is asked
     * whether a blocking stream of the context captures, and the wait is
     * made in relaxed mode, as fences_sync_blind does. */
    const real_driver *R = real_driver_get();
    bool pushed = real_ctx_enter(R, sp->ctx);
    if (capture_underway() || fences_legacy_blocked(R)) {
        shim_log(LOG_DEBUG,
                 "device %d: free memory stays mapped: a stream capture is under way, and "
                 "under BFCSHIM_FREE_POLICY=immediate it may only go back after a "
                 "cuCtxSynchronize, which a capture forbids",
                 (int)sp->dev);
    } else if (R->CtxSynchronize) {
        relaxed_scope rs = capture_relax_always(R);
        ready = R->CtxSynchronize() == CUDA_SUCCESS;
        capture_restore(R, rs);
    }
    real_ctx_leave(R, pushed);
    streams_use_end();
    return ready;
}

void vmm_backend(bfc_backend *b)
{
    b->region_alloc = va_reserve;
    b->region_free = va_free;
    b->map = map_range;
    b->unmap = unmap_range;
    b->release_ready = release_ready;
    b->keep = keep;
}
