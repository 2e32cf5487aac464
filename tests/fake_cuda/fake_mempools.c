/*
 * fake_mempools.c - stream-ordered memory pools: each device's default pool
 * and created ones, the device's current pool, what each pool holds (used
 * and reserved bytes, their high marks), its release threshold and trims,
 * its attributes and other devices' access.
 */
#include "fake_internal.h"

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CALLED();
    ENTER_API();
    if (!pool)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    *pool = G.default_pool[dev];
    LEAVE(CUDA_SUCCESS);
}

/* Memory pool handles: what a pool allocates comes from its
 * device like any other allocation (POOL_DEFAULT, POOL_CREATED). */

/* Lock held: the device of a pool handle, or -1 if the fake never made it. */
int pool_device(CUmemoryPool pool)
{
    uintptr_t v = (uintptr_t)pool;
    if (v >= POOL_DEFAULT && v < POOL_DEFAULT + (unsigned)G.ndev)
        return (int)(v - POOL_DEFAULT);
    if (v >= POOL_CREATED + 16u && v < POOL_CREATED + 16u * (G.npools_created + 1u) &&
        (int)(v % 16u) < G.ndev &&
        G.pools[MAX_DEVICES + (v - POOL_CREATED) / 16u - 1u].dev >= 0) /* not destroyed */
        return (int)(v % 16u);
    return -1;
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    CALLED();
    ENTER_API();
    if (!pool || !props)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* Pools of host memory (CU_MEM_LOCATION_TYPE_HOST, _HOST_NUMA: "not
     * IPC capable and ::CUmemPoolProps::handleTypes must be 0") are not
     * modelled: not supported. Otherwise the pool is of a device's pinned
     * memory; any other allocation type or location is an invalid value
     * ("Specifying ::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT as the
     * ::CUmemPoolProps::CUmemLocation::type will result in
     * ::CUDA_ERROR_INVALID_VALUE", cuMemPoolCreate), as is a device that is
     * not there. handleTypes as for cuMemCreate: a file descriptor, or
     * none ("CU_MEM_HANDLE_TYPE_NONE creates a memory pool that will not
     * support IPC"); Win32 and fabric handles are not supported here, bits
     * that name no type are invalid. */
    if (props->location.type == CU_MEM_LOCATION_TYPE_HOST ||
        props->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA)
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    if (props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !is_device(props->location.id))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    const unsigned known = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_WIN32 |
                           CU_MEM_HANDLE_TYPE_WIN32_KMT | CU_MEM_HANDLE_TYPE_FABRIC;
    if ((unsigned)props->handleTypes & ~known)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if ((unsigned)props->handleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    if (G.npools_created == MAX_CREATED_POOLS)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    G.pools[MAX_DEVICES + G.npools_created] =
        (struct fpool){.reuse = {1, 1, 1}, .dev = props->location.id};
    *pool = (CUmemoryPool)(uintptr_t)(POOL_CREATED + ++G.npools_created * 16u +
                                      (unsigned)props->location.id);
    LEAVE(CUDA_SUCCESS);
}

/* cuda.h: "Destroying the current mempool of a device sets the default
 * mempool of that device as the current mempool for that device. A
 * device's default memory pool cannot be destroyed." The handle is then no
 * pool (its slot's device -1). Its allocations stay valid until freed
 * ("released automatically once there are no more outstanding
 * allocations"); the fake keeps no account of the dead pool's cache. */
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    CALLED();
    ENTER_API();
    int dev = pool_device(pool);
    if (dev < 0 || pool == G.default_pool[dev])
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (G.current_pool[dev] == pool)
        G.current_pool[dev] = G.default_pool[dev];
    G.pools[MAX_DEVICES + ((uintptr_t)pool - POOL_CREATED) / 16u - 1u].dev = -1;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    CALLED();
    ENTER_API();
    /* "The memory pool must be local to the specified device." */
    if (!is_device(dev) || pool_device(pool) != dev)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    G.current_pool[dev] = pool;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CALLED();
    ENTER_API();
    if (!pool || !is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    *pool = G.current_pool[dev];
    LEAVE(CUDA_SUCCESS);
}

/*
 * A pool's reserved memory is "backing memory currently allocated for the
 * mempool" (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, cuda.h): its live
 * allocations' bytes plus what they freed and it kept. It keeps freed memory
 * up to its release threshold: "When more than the release threshold bytes
 * of memory are held by the memory pool, the allocator will try to release
 * memory back to the OS on the next call to stream, event or context
 * synchronize. (default 0)" (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD). A trim
 * gives back down to minBytesToKeep and never below: "If the pool has less
 * than minBytesToKeep reserved, the TrimTo operation is a no-op. Otherwise
 * the pool will be guaranteed to have at least minBytesToKeep bytes
 * reserved", and "The allocator cannot release OS allocations that back
 * outstanding asynchronous allocations" (cuMemPoolTrimTo). Freed memory
 * whose free the host has not yet observed "can count as outstanding"
 * there; here it does until its stream reaches the free (pending_free,
 * below), and only then may a trim or a synchronisation give it back. Backing
 * memory is the device's, so what a pool keeps is not free to cuMemGetInfo,
 * and serves the pool's next allocations. Exact bytes: "The OS allocations
 * may happen at different granularity from the user allocations", and the
 * real pool reserves in larger pieces (the GPU suite's `pool-attributes`
 * prints what it does).
 */

/* Lock held: the state of a pool handle the fake made, or NULL. */
static struct fpool *pool_state(CUmemoryPool pool)
{
    uintptr_t v = (uintptr_t)pool;
    int dev = pool ? pool_device(pool) : -1;
    if (dev < 0)
        return NULL;
    if (v >= POOL_DEFAULT && v < POOL_DEFAULT + (unsigned)G.ndev)
        return &G.pools[dev];
    return &G.pools[MAX_DEVICES + (v - POOL_CREATED) / 16u - 1];
}

void pool_took(CUmemoryPool pool, uint64_t size)
{
    struct fpool *f = pool_state(pool);
    if (!f)
        return;
    f->used += size;
    if (f->used > f->used_high)
        f->used_high = f->used;
    if (f->used > f->reserved)
        f->reserved = f->used;
    if (f->reserved > f->reserved_high)
        f->reserved_high = f->reserved;
}

void pool_gave(CUmemoryPool pool, uint64_t size)
{
    struct fpool *f = pool_state(pool);
    if (f)
        f->used -= size;
}

static pending_free *pending_frees;

void pending_free_reached(pending_free *pf)
{
    atomic_store(&pf->reached, true);
}

/* Lock held: may stream `on` reuse pf's bytes now? */
static bool pending_reusable_by(const pending_free *pf, const fstream *on)
{
    const struct fpool *f = pool_state(pf->pool);
    if (!f || pf->stream == on)
        return true;
    const bool internal = f->reuse[CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES -
                                   CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
    const bool opportunistic = f->reuse[CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC -
                                        CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
    return internal || (opportunistic && atomic_load(&pf->reached));
}

/* Lock held: drops the records nobody needs any more (reached and free to
 * all, or of a pool that is gone); with `pool`, also that pool's reached
 * ones (its memory was trimmed). */
static void pending_frees_prune(CUmemoryPool trimmed)
{
    for (pending_free **at = &pending_frees; *at;) {
        pending_free *pf = *at;
        const bool reached = atomic_load(&pf->reached);
        if (!pool_state(pf->pool) || (reached && pending_reusable_by(pf, NULL)) ||
            (reached && pf->pool == trimmed)) {
            *at = pf->next;
            if (reached) /* else the stream's work still holds it */
                free(pf);
            continue;
        }
        at = &pf->next;
    }
}

/* Lock held: bytes of pool's frees its streams have not reached. */
static uint64_t pool_outstanding_frees(CUmemoryPool pool)
{
    uint64_t n = 0;
    for (const pending_free *pf = pending_frees; pf; pf = pf->next)
        if (pf->pool == pool && !atomic_load(&pf->reached))
            n += pf->size;
    return n;
}

/* Lock held: bytes one pool keeps without using them that an allocation of
 * `size` on stream `on` may take (0 for NULL: a graph's allocation). The
 * bytes it takes from its own stream's frees are theirs no longer. */
uint64_t pool_kept_for(CUmemoryPool pool, const fstream *on, uint64_t size)
{
    const struct fpool *f = pool_state(pool);
    if (!f)
        return 0;
    pending_frees_prune(NULL);
    uint64_t kept = f->reserved - f->used, bound = 0;
    for (const pending_free *pf = pending_frees; pf; pf = pf->next)
        if (pf->pool == pool && !pending_reusable_by(pf, on))
            bound += pf->size;
    uint64_t free_to_all = kept > bound ? kept - bound : 0;
    /* Take the unbound bytes first, then the stream's own frees. */
    uint64_t from_own = size > free_to_all ? size - free_to_all : 0;
    for (pending_free *pf = pending_frees; pf && from_own; pf = pf->next)
        if (pf->pool == pool && pf->stream == on) {
            uint64_t t = pf->size < from_own ? pf->size : from_own;
            pf->size -= t;
            from_own -= t;
        }
    return free_to_all;
}

/* Lock held: records a stream-ordered free of `size` bytes of pool on
 * stream s; NULL when it needs no record (no pool, host memory short: then
 * the free is as good as reached). */
pending_free *pending_free_add(CUmemoryPool pool, const fstream *s, uint64_t size)
{
    if (!pool_state(pool) || !size)
        return NULL;
    pending_free *pf = malloc(sizeof *pf);
    if (!pf)
        return NULL;
    pf->pool = pool;
    pf->stream = s;
    pf->size = size;
    atomic_init(&pf->reached, false);
    pf->next = pending_frees;
    pending_frees = pf;
    return pf;
}

/* Lock held: bytes the pools of dev keep without using them. */
uint64_t pools_cached(int dev)
{
    uint64_t n = 0;
    for (size_t i = 0; i < MAX_DEVICES + MAX_CREATED_POOLS; i++)
        if (G.pools[i].dev == dev)
            n += G.pools[i].reserved - G.pools[i].used;
    return n;
}

/* Lock held: a pool keeps at most what it uses, what its unreached frees
 * hold (outstanding, above) and `keep` more. */
static void pool_trim(CUmemoryPool pool, uint64_t keep)
{
    struct fpool *f = pool_state(pool);
    if (!f)
        return;
    pending_frees_prune(NULL);
    const uint64_t floor = f->used + pool_outstanding_frees(pool);
    if (f->reserved > keep) {
        f->reserved = keep > floor ? keep : floor < f->reserved ? floor : f->reserved;
        pending_frees_prune(pool);
    }
}

/* The handle of pool slot i (default pools first, then created ones). */
static CUmemoryPool pool_handle_at(size_t i)
{
    return i < MAX_DEVICES ? (CUmemoryPool)(uintptr_t)(POOL_DEFAULT + i)
                           : (CUmemoryPool)(uintptr_t)(POOL_CREATED + (i - MAX_DEVICES + 1) * 16u +
                                                       (unsigned)G.pools[i].dev);
}

/* Lock held: at a synchronisation, each pool gives back what it keeps above
 * its release threshold. Its unreached frees stay (pool_trim): a
 * synchronisation calls it again once its wait is over (release_after_sync),
 * when the frees the wait reached are no longer outstanding. */
void pools_release_at_sync(void)
{
    for (size_t i = 0; i < MAX_DEVICES + MAX_CREATED_POOLS; i++)
        if (G.pools[i].dev >= 0)
            pool_trim(pool_handle_at(i), G.pools[i].release_threshold);
}

/* Lock not held: the release at the end of a synchronisation. */
void release_after_sync(void)
{
    pthread_mutex_lock(&G.lock);
    pools_release_at_sync();
    pthread_mutex_unlock(&G.lock);
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    CALLED();
    ENTER_API();
    if (!pool_state(pool))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    pool_trim(pool, keep);
    LEAVE(CUDA_SUCCESS);
}

/* Lock held: the pool's reuse flag or 64-bit figure an attribute names
 * (NULL: not that kind). */
static int *pool_reuse_flag(struct fpool *f, CUmemPool_attribute attr)
{
    return attr >= CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES &&
                   attr <= CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES
               ? &f->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES]
               : NULL;
}

static uint64_t *pool_figure(struct fpool *f, CUmemPool_attribute attr)
{
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: return &f->release_threshold;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: return &f->reserved;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: return &f->reserved_high;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: return &f->used;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: return &f->used_high;
    default: return NULL;
    }
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CALLED();
    ENTER_API();
    struct fpool *f = pool_state(pool);
    int *flag = f ? pool_reuse_flag(f, attr) : NULL;
    uint64_t *figure = f ? pool_figure(f, attr) : NULL;
    if (!value || (!flag && !figure))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (flag)
        *(int *)value = *flag;
    else
        *(cuuint64_t *)value = *figure;
    LEAVE(CUDA_SUCCESS);
}

/* The current figures are read-only (cuMemPoolSetAttribute lists only the
 * flags, the threshold and the high marks); the high-water marks take only
 * 0 ("It is illegal to set this attribute to a non-zero value", cuda.h;
 * "High watermark can only be reset to zero"), which restarts them at the
 * current value. */
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CALLED();
    ENTER_API();
    struct fpool *f = pool_state(pool);
    int *flag = f ? pool_reuse_flag(f, attr) : NULL;
    if (!value || !f)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (flag)
        *flag = *(int *)value != 0;
    else if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
        f->release_threshold = *(cuuint64_t *)value;
    else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH && *(cuuint64_t *)value == 0)
        f->reserved_high = f->reserved;
    else if (attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH && *(cuuint64_t *)value == 0)
        f->used_high = f->used;
    else
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    LEAVE(CUDA_SUCCESS);
}

/*
 * Access to a pool's memory from other devices ("Controls visibility of
 * pools between devices", cuMemPoolSetAccess). Each descriptor sets one
 * device's access, a later one replacing an earlier grant, as
 * cuMemSetAccess does; PROT_NONE takes it back. The pool's own device keeps
 * read-write access: "By default, allocations are accessible from the
 * device where the allocations are located. This access cannot be revoked"
 * (CUDA Programming Guide, stream-ordered allocator, multi-GPU access), so
 * asking for less there is refused. cuda.h lists CUDA_ERROR_INVALID_VALUE
 * as the only refusal, and the fake answers it for every bad argument (a
 * pool the fake never made, a location that is no device, unknown flags).
 * Memory is one host address space here: the grants are kept for
 * cuMemPoolGetAccess and counted, not enforced.
 */
bool access_flags_known(CUmemAccess_flags f)
{
    return f == CU_MEM_ACCESS_FLAGS_PROT_NONE || f == CU_MEM_ACCESS_FLAGS_PROT_READ ||
           f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
    CALLED();
    ENTER_API();
    struct fpool *f = pool_state(pool);
    if (!f || (!map && count))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* All checked before any is applied: a refused call changes nothing. */
    for (size_t k = 0; k < count; k++)
        if (map[k].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !is_device(map[k].location.id) ||
            !access_flags_known(map[k].flags) ||
            (map[k].location.id == f->dev && map[k].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
            LEAVE(CUDA_ERROR_INVALID_VALUE);
    for (size_t k = 0; k < count; k++) {
        if (map[k].location.id == f->dev)
            continue;
        const uint64_t bit = UINT64_C(1) << map[k].location.id;
        const CUmemAccess_flags fl = map[k].flags;
        f->peer_read = fl != CU_MEM_ACCESS_FLAGS_PROT_NONE ? f->peer_read | bit : f->peer_read & ~bit;
        f->peer_write = fl == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? f->peer_write | bit
                                                                 : f->peer_write & ~bit;
    }
    G.st.pool_access_calls++;
    LEAVE(CUDA_SUCCESS);
}

/* "the accessibility of the pool's memory from the specified location":
 * read-write for its own device, what cuMemPoolSetAccess granted for
 * others (none at first). */
EXPORT CUresult cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool pool,
                                   CUmemLocation *location)
{
    CALLED();
    ENTER_API();
    struct fpool *f = pool_state(pool);
    if (!f || !flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !is_device(location->id))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    const uint64_t bit = UINT64_C(1) << location->id;
    *flags = location->id == f->dev || (f->peer_write & bit) ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
             : (f->peer_read & bit)                          ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                                             : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    LEAVE(CUDA_SUCCESS);
}
