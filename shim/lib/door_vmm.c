/*
 * door_vmm.c - the virtual memory door: the program's own cuMemCreate,
 * cuMemRetainAllocationHandle and cuMemRelease.
 *
 * JAX 0.10.2 and later allocate every buffer this way, and PyTorch's
 * expandable segments grow this way (docs/frameworks.md). The door serves
 * that memory out of the pool's limit (docs/design.md, "The virtual memory
 * door"): before a device allocation is made, the pool of the current
 * context lends its size (bfc_pool_lend), giving back free memory of its
 * own if it must, and the allocation is then made by the driver, with the
 * properties the program asked for, so that every later call on the handle
 * (map, access, export, queries) is the driver's own and answers as CUDA
 * does. The loan ends when the allocation's last handle reference goes.
 * One limit thus covers the pool's blocks and the program's own physical
 * memory; a create the limit has no room for fails with
 * CUDA_ERROR_OUT_OF_MEMORY, as a device would, and is reported like any
 * pool out-of-memory. With BFCSHIM_VMM_DOOR=count, where no pool can lend
 * (no context current on that device, the pool could not be made) or for
 * memory that is not device memory of a device the counters have room
 * for, the allocation goes around the pool and is counted as passthrough
 * (passthrough_vmm_*), and the first such allocation on a device is named
 * in the log.
 *
 * A physical allocation lives from cuMemCreate until its last handle
 * reference goes: cuMemCreate's, and one per cuMemRetainAllocationHandle,
 * each ended by a cuMemRelease. (The driver keeps the memory until it is
 * also unmapped, and an imported copy keeps it until the importer lets it
 * go; XLA and PyTorch unmap before they release, so the figures are exact
 * for them, and err low, never high, for a program that releases a handle
 * it still has mapped.) The pools' own granules are made through the real
 * driver table, not through this door. Calls are rare (one per buffer or
 * segment), so a mutex over a small map is all the bookkeeping needs.
 */
#include <pthread.h>
#include <stdlib.h>

#include <string.h>

#include "ptr_map.h"
#include "shim.h"
#include "units.h"

#define PASS(field, ...) \
    (REAL(field) ? REAL(field)(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)

/* One physical allocation the program made: handle -> record (the map's
 * value is the record's address). */
typedef struct made {
    uint64_t size;
    int dev;
    uint64_t refs;     /* cuMemCreate's, and one per retain */
    shim_pool *lender; /* the pool whose limit it came out of; NULL: around it */
} made;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static ptr_map handles;
static bool handles_ready;
static vmm_door_counts counts[SHIM_MAX_DEVICES];
static atomic_bool named_around[SHIM_MAX_DEVICES], named_pooled[SHIM_MAX_DEVICES];

/* Device memory of a device the counters have room for. */
static bool counted_kind(const CUmemAllocationProp *prop, size_t size)
{
    return prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
           prop->location.id >= 0 && prop->location.id < SHIM_MAX_DEVICES && size > 0;
}

/* The pool that lends to a create of device `dev`'s memory: the current
 * context's, when that context is on `dev`. Made now if it has none yet,
 * as one that grows: a program whose first device memory is its own (JAX)
 * would otherwise have the pool take the whole limit up front only to
 * give it back as the program's creates came (XLA's first takes 75% of the
 * device). NULL: the memory goes around the pools. */
static shim_pool *lender_for(int dev)
{
    const real_driver *R = real_driver_get();
    CUcontext cur = NULL;
    CUdevice cur_dev = -1;
    if (shim_config_get()->vmm_door != VMM_DOOR_POOL || !R ||
        R->CtxGetCurrent(&cur) != CUDA_SUCCESS || !cur ||
        R->CtxGetDevice(&cur_dev) != CUDA_SUCCESS || (int)cur_dev != dev)
        return NULL;
    return pool_for_context_growing(cur);
}

static void name_once(int dev, size_t size, const shim_pool *lender)
{
    char b[32];
    if (lender && !atomic_exchange(&named_pooled[dev], true))
        shim_log(LOG_INFO, "cuMemCreate: the program makes device %d's memory itself through "
                           "CUDA's virtual memory API (JAX, PyTorch's expandable segments): "
                           "it comes out of the pool's limit (bytes_lent; %s so far; "
                           "BFCSHIM_VMM_DOOR=count leaves it outside; logged once per device)",
                 dev, format_size(size, b, sizeof b));
    if (!lender && !atomic_exchange(&named_around[dev], true))
        shim_log(LOG_WARN, "cuMemCreate: the program makes device %d's memory itself through "
                           "CUDA's virtual memory API (JAX, PyTorch's expandable segments): "
                           "%s so far goes around the pool, counted as passthrough_vmm_bytes "
                           "(logged once per device)",
                 dev, format_size(size, b, sizeof b));
}

/*
 * cuMemCreate memory outlives its context ("cuCtxDestroy will not destroy
 * memory allocations by cuMemCreate()", cuda.h; a primary context's reset
 * neither): when a pool dies with its context, the loans of the program's
 * memory still alive stay with it, and the device's next pool would lend
 * its whole limit again (e2e_vmm_door reset). So the first lend on a device
 * after any pool died, a pool made on it, and a live one's first allocation
 * after the death (vmm_door_take_over_loans), takes over the loans of dead
 * pools there, whichever
 * pool lent last (e2e_vmm_door two-contexts: a created context's pool died
 * after the primary context's had lent); a loan it has no room for stays
 * where it was, and the memory then counts nowhere until its release (said
 * once). The records are collected under the door's lock, but the new
 * loans are made outside it: a loan may wait for fences, which takes the
 * streams' read lock, and the fork handler takes the streams' write lock
 * before this one (e2e_vmm_door fork-adopt: both waited for good). A record
 * released meanwhile gives its new loan back.
 */
typedef struct orphan {
    CUmemGenericAllocationHandle h;
    made *m;
    uint64_t size;
    bool lent;
} orphan;

/* Lock held: the records of device dev whose lender died, into *out;
 * false when host memory ran out before the walk ended (*n holds what was
 * collected: those are taken over, the rest at the next scan). */
static bool collect_orphans_locked(int dev, orphan **out, size_t *n)
{
    size_t cap = 0;
    *out = NULL;
    *n = 0;
    for (uint64_t i = 0; handles_ready && i <= handles.mask; i++) {
        if (!handles.slots[i].key)
            continue;
        made *m = (made *)(uintptr_t)handles.slots[i].val;
        if (m->dev != dev || !m->lender || !atomic_load(&m->lender->dead))
            continue;
        if (*n == cap) {
            orphan *more = realloc(*out, (cap = cap ? 2 * cap : 8) * sizeof *more);
            if (!more)
                return false;
            *out = more;
        }
        (*out)[(*n)++] = (orphan){handles.slots[i].key, m, m->size, false};
    }
    return true;
}

/* Under lock: per device, the deaths the last complete scan saw, and
 * whether a takeover is lending now (a create on that device waits for it:
 * lending beside it, a create could take the room the orphans need, and
 * their memory would then count nowhere). */
static uint64_t scanned_deaths[SHIM_MAX_DEVICES];
static bool adopting[SHIM_MAX_DEVICES];
static pthread_cond_t adopted = PTHREAD_COND_INITIALIZER;

static void adopt_loans(shim_pool *sp)
{
    const int dev = (int)sp->dev;
    if (dev < 0 || dev >= SHIM_MAX_DEVICES)
        return;
    pthread_mutex_lock(&lock);
    while (adopting[dev])
        pthread_cond_wait(&adopted, &lock); /* not holding the lock meanwhile */
    const uint64_t deaths = pools_deaths();
    orphan *o = NULL;
    size_t n = 0;
    bool complete = true;
    if (scanned_deaths[dev] != deaths) {
        complete = collect_orphans_locked(dev, &o, &n);
        if (complete)
            scanned_deaths[dev] = deaths;
        adopting[dev] = n > 0;
    }
    pthread_mutex_unlock(&lock);
    if (!complete) {
        static atomic_bool said;
        shim_log_once(&said, LOG_WARN,
                      "device %d: host memory ran out while looking for the program's "
                      "cuMemCreate memory that outlived its context; the rest is looked "
                      "for at the next create",
                      dev);
    }
    if (!n) {
        free(o);
        return;
    }
    for (size_t i = 0; i < n; i++)
        o[i].lent = pools_lend(sp, o[i].size);
    uint64_t unadopted = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n; i++) {
        if (!o[i].lent) {
            unadopted += o[i].size;
            continue;
        }
        /* Still the same record, its loan still a dead pool's (a record
         * released meanwhile is gone from the map; one made since under a
         * reused handle has a live lender or none, or another device). */
        made *m = handles_ready ? (made *)(uintptr_t)ptr_map_get(&handles, o[i].h) : NULL;
        if (m == o[i].m && m->size == o[i].size && m->dev == dev && m->lender &&
            atomic_load(&m->lender->dead)) {
            bfc_pool_end_loan(m->lender->bfc, m->size);
            m->lender = sp;
        } else {
            bfc_pool_end_loan(sp->bfc, o[i].size);
        }
    }
    adopting[dev] = false;
    pthread_cond_broadcast(&adopted);
    pthread_mutex_unlock(&lock);
    free(o);
    if (unadopted) {
        static atomic_bool said;
        char b[32];
        shim_log_once(&said, LOG_WARN,
                      "device %d: %s of the program's own cuMemCreate memory outlived its "
                      "context and does not fit the new pool's limit: it is not counted "
                      "until released",
                      dev, format_size(unadopted, b, sizeof b));
    }
}

/* A pool just made (by any door), and a live one at its first allocation
 * after a pool died (svc_alloc), takes over the loans dead pools of its
 * device still hold: waiting for the program's next create, a pool made by
 * a plain cuMemAlloc after a reset, or the primary context's pool after a
 * created context's death, served its whole limit beside the orphans
 * (e2e_vmm_door reset-alloc, death-alloc; found by an audit). Nothing to
 * do, one lock taken, while no pool died since the last scan. */
void vmm_door_take_over_loans(shim_pool *sp)
{
    if (shim_config_get()->vmm_door == VMM_DOOR_POOL)
        adopt_loans(sp);
}

static void counts_refused(int dev)
{
    pthread_mutex_lock(&lock);
    counts[dev].refused++;
    pthread_mutex_unlock(&lock);
}

/* Records a new allocation; false (nothing recorded) when host memory for
 * the record ran out. */
static bool note_created(CUmemGenericAllocationHandle h, size_t size, int dev, shim_pool *lender)
{
    made *m = malloc(sizeof *m);
    pthread_mutex_lock(&lock);
    if (!handles_ready)
        handles_ready = ptr_map_init(&handles);
    bool kept = m && handles_ready && h != 0 && ptr_map_get(&handles, h) == 0 &&
                ptr_map_reserve(&handles, 1);
    if (kept) {
        *m = (made){size, dev, 1, lender};
        ptr_map_put(&handles, h, (uint64_t)(uintptr_t)m);
        /* The lender died between its loan and this record: a takeover
         * may have scanned for that death already, without this record
         * (not in the map yet), and none would scan again before another
         * pool died; the loan would stay the dead pool's and the live pool
         * lend its whole limit beside it. The next create on the device
         * scans again (e2e_vmm_door create-takeover). A death after this
         * check counts in `deaths` after its mark, so a scan that sees
         * that count sees this record too. */
        if (lender && atomic_load(&lender->dead))
            scanned_deaths[dev] = UINT64_MAX;
        vmm_door_counts *c = &counts[dev];
        if (lender) {
            c->pooled_creates++;
        } else {
            c->bytes += size;
            c->creates++;
            if (c->bytes > c->peak_bytes)
                c->peak_bytes = c->bytes;
        }
    }
    pthread_mutex_unlock(&lock);
    if (!kept)
        free(m);
    return kept;
}

/* Lock held: one more (retain) or one fewer (release) reference to h, if
 * recorded. The last one ends the allocation: its passthrough count here,
 * its loan by the caller (returned, out of the map: free it). */
static made *note_reference_locked(CUmemGenericAllocationHandle h, bool more)
{
    made *m = handles_ready ? (made *)(uintptr_t)ptr_map_get(&handles, h) : NULL;
    if (m && more) {
        m->refs++;
    } else if (m && --m->refs == 0) {
        ptr_map_take(&handles, h);
        if (!m->lender)
            counts[m->dev].bytes -= m->size;
        return m;
    }
    return NULL;
}

static void end_allocation(made *gone)
{
    if (gone && gone->lender)
        bfc_pool_end_loan(gone->lender->bfc, gone->size);
    free(gone);
}

/* A create the driver refuses anyway: flags other than 0 ("for future use,
 * must be zero now"), an invalid type, properties the granularity query
 * refuses, or a size that is not a multiple of their minimum granularity
 * (cuda.h). It goes to the driver untouched, which answers with its own
 * code: bad input lends nothing and leaves the pool as it was (before, an
 * unaligned size lent first, which gave back the pool's free memory or
 * failed with CUDA_ERROR_OUT_OF_MEMORY and an out-of-memory report where
 * CUDA says CUDA_ERROR_INVALID_VALUE: e2e_vmm_door bad-create). */
static bool driver_refuses(size_t size, const CUmemAllocationProp *prop, unsigned long long flags)
{
    if (flags != 0 || prop->type == CU_MEM_ALLOCATION_TYPE_INVALID)
        return true;
    size_t g = 0;
    if (!REAL(MemGetAllocationGranularity))
        return false; /* cannot tell: the loan decides, as before */
    return REAL(MemGetAllocationGranularity)(&g, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
               CUDA_SUCCESS ||
           g == 0 || size % g != 0;
}

SHIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags)
{
    if (!handle || !shim_driver_door() || !counted_kind(prop, size))
        return PASS(MemCreate, handle, size, prop, flags);
    if (driver_refuses(size, prop, flags)) {
        CUresult r = PASS(MemCreate, handle, size, prop, flags);
        /* A driver that takes it after all: counted around the pool, never
         * unseen. */
        if (r == CUDA_SUCCESS && note_created(*handle, size, prop->location.id, NULL))
            name_once(prop->location.id, size, NULL);
        return r;
    }
    const int dev = prop->location.id;
    shim_pool *sp = lender_for(dev);
    if (sp) {
        adopt_loans(sp);
        preallocation_hint(sp, size, "cuMemCreate", true); /* before the loan */
    }
    if (sp && !pools_lend(sp, size)) {
        counts_refused(dev);
        oom_report(sp, size, "cuMemCreate");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = PASS(MemCreate, handle, size, prop, flags);
    /* Within the limit, yet the device has no room: the pool may hold free
     * memory that the loan did not need to give back (it gives back only
     * what the limit asks); give back all of it and try once more. */
    if (r == CUDA_ERROR_OUT_OF_MEMORY && sp && pools_trim(sp, true) > 0)
        r = PASS(MemCreate, handle, size, prop, flags);
    if (r != CUDA_SUCCESS) {
        if (sp)
            bfc_pool_end_loan(sp->bfc, size);
        return r;
    }
    if (!note_created(*handle, size, dev, sp)) {
        /* Unrecorded, the loan would never end: the memory goes uncounted
         * instead (host memory ran out), never counted twice. */
        if (sp)
            bfc_pool_end_loan(sp->bfc, size);
        return r;
    }
    name_once(dev, size, sp);
    return r;
}

/* The driver's call and the bookkeeping under one hold of the lock: a
 * release's handle value may be handed out again by the driver as soon as
 * it answers, and a create in another thread must not find the old record
 * (it would end its own loan); a retain's reference must be counted before
 * another thread's release can end the allocation (e2e_vmm_door
 * race-create, race-retain). */
SHIM_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
                                                 void *addr)
{
    if (!shim_driver_door())
        return PASS(MemRetainAllocationHandle, handle, addr);
    /* The pool's memory is cuMemAlloc memory to the program, which has no
     * allocation handle (CUDA_ERROR_INVALID_VALUE from the driver): the
     * handle of the granule behind it would let the program keep, export
     * or map the pool's memory past its block and the limit (found by an
     * audit: e2e_vmm_door retain-pooled). */
    if (pool_owning((CUdeviceptr)(uintptr_t)addr)) {
        static atomic_bool said;
        shim_log_once(&said, LOG_WARN,
                      "cuMemRetainAllocationHandle(%p): the address is a pooled block's "
                      "(cudaMalloc/cuMemAlloc memory), which has no allocation handle: "
                      "CUDA_ERROR_INVALID_VALUE, as the driver answers for such memory "
                      "(logged once)",
                      addr);
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&lock);
    CUresult r = PASS(MemRetainAllocationHandle, handle, addr);
    if (r == CUDA_SUCCESS && handle)
        note_reference_locked(*handle, true);
    pthread_mutex_unlock(&lock);
    return r;
}

SHIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    if (!shim_driver_door())
        return PASS(MemRelease, handle);
    made *gone = NULL;
    pthread_mutex_lock(&lock);
    CUresult r = PASS(MemRelease, handle);
    if (r == CUDA_SUCCESS)
        gone = note_reference_locked(handle, false);
    pthread_mutex_unlock(&lock);
    end_allocation(gone);
    return r;
}

void vmm_door_get_counts(int dev, vmm_door_counts *out)
{
    *out = (vmm_door_counts){0};
    if (dev < 0 || dev >= SHIM_MAX_DEVICES)
        return;
    pthread_mutex_lock(&lock);
    *out = counts[dev];
    pthread_mutex_unlock(&lock);
}

/* Held across fork, so that a child's copy is never locked for good. */
void vmm_door_lock_for_fork(bool hold)
{
    if (hold)
        pthread_mutex_lock(&lock);
    else
        pthread_mutex_unlock(&lock);
}

/* A forked child holds none of its parent's device memory (CUDA does not
 * carry contexts across fork): it starts counting from nothing. The
 * records stay (their handles mean nothing here) and are never freed. */
void vmm_door_after_fork_child(void)
{
    memset(counts, 0, sizeof counts);
    /* no thread of the child is taking over loans, and the parent's are
     * not the child's */
    memset(adopting, 0, sizeof adopting);
    memset(scanned_deaths, 0, sizeof scanned_deaths);
    pthread_cond_init(&adopted, NULL); /* the parent's waiters are not here */
    /* loans made before the fork are the parent's: forgotten with the
     * records */
    handles_ready = false;
    handles = (ptr_map){0};
}

void vmm_door_total(vmm_door_counts *out)
{
    *out = (vmm_door_counts){0};
    pthread_mutex_lock(&lock);
    for (int d = 0; d < SHIM_MAX_DEVICES; d++) {
        out->bytes += counts[d].bytes;
        out->peak_bytes += counts[d].peak_bytes;
        out->creates += counts[d].creates;
        out->pooled_creates += counts[d].pooled_creates;
        out->refused += counts[d].refused;
    }
    pthread_mutex_unlock(&lock);
}
