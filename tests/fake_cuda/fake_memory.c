/*
 * fake_memory.c - device memory: the allocation table, cuMemAlloc and
 * cuMemFree (which synchronises, as cudaFree does), pitched allocations,
 * stream-ordered allocation and free, cuMemGetInfo, page-locked host
 * memory, address ranges, pointer attributes and IPC handles.
 */
#include "fake_internal.h"

allocation *find_alloc(uint64_t addr, bool interior)
{
    for (size_t i = 0; i < G.nallocs; i++) {
        allocation *a = &G.allocs[i];
        if (addr == a->base || (interior && addr - a->base < a->size))
            return a;
    }
    return NULL;
}

/* Lock held: device memory nobody can allocate: other processes' and the
 * live contexts' own. */
static uint64_t unavailable(int dev)
{
    uint64_t n = G.other_used[dev];
    for (int d = 0; d < G.ndev; d++)
        if (d == dev && G.primary[d].alive)
            n += G.ctx_overhead;
    for (size_t i = 0; i < G.ncreated; i++)
        if (G.created[i]->alive && G.created[i]->dev == dev)
            n += G.ctx_overhead;
    return n;
}

/* Lock held: bytes still free on a device. */

uint64_t device_free(int dev)
{
    uint64_t used = G.st.bytes_in_use[dev] + unavailable(dev) + pools_cached(dev);
    return used < G.mem[dev] ? G.mem[dev] - used : 0;
}

/* Lock held: an allocation in context c (the current one, or for a
 * stream-ordered one, the stream's: then `on` is that stream), on device
 * dev (-1: c's; a memory pool's device may be another). */

static CUresult do_alloc(fctx *c, int dev, CUdeviceptr *dptr, size_t size, const fstream *on,
                         CUmemoryPool pool)
{
    bool graph = on && on->capturing;
    if (!dptr || (size == 0 && !G.zero_alloc))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult usable = ctx_usable(c);
    if (usable != CUDA_SUCCESS)
        return usable;
    if (dev < 0)
        dev = c->dev;
    /* A green context shares its primary context's memory ("a normal
     * primary context but with the resources of the specified green
     * context", cuCtxFromGreenCtx): what it allocates is the primary's. */
    if (c->green)
        c = &G.primary[c->dev];
    if (!graph && G.fail_alloc_countdown && --G.fail_alloc_countdown == 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* "During stream capture, this function results in the creation of an
     * allocation node. In this case, the allocation is owned by the graph
     * instead of the memory pool" (cuMemAllocAsync). */
    if (graph)
        pool = NULL;
    /* What the pool keeps serves it first. */
    if (size > device_free(dev) + pool_kept_for(pool, on, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = mmap(NULL, size ? size : 1, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (G.nallocs == G.capallocs) {
        G.capallocs = G.capallocs ? G.capallocs * 2 : 64;
        G.allocs = realloc(G.allocs, G.capallocs * sizeof *G.allocs);
    }
    G.allocs[G.nallocs++] =
        (allocation){(uint64_t)(uintptr_t)p, size, dev, c, on != NULL, graph, pool,
                     ++G.next_buffer_id};
    G.st.bytes_in_use[dev] += size;
    pool_took(pool, size);
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

/* An allocation's host memory, unmapped when a stream reaches its
 * stream-ordered free (free_async). */
struct pending_free;
typedef struct unmap_later {
    uint64_t base, size;
    struct pending_free *pf; /* the pool's record of the free, or NULL */
} unmap_later;

static void unmap_when_reached(void *arg)
{
    unmap_later *u = arg;
    munmap((void *)(uintptr_t)u->base, u->size);
    if (u->pf)
        pending_free_reached(u->pf);
    free(u);
}

/* Lock held: forgets the allocation at dptr; its memory goes at once, or,
 * with `later` set, when *later is handed to unmap_when_reached. */
static CUresult do_free_ex(CUdeviceptr dptr, unmap_later **later)
{
    allocation *a = find_alloc(dptr, false);
    if (!a)
        return CUDA_ERROR_INVALID_VALUE;
    unmap_later *u = later ? malloc(sizeof *u) : NULL;
    if (u) {
        *u = (unmap_later){a->base, a->size ? a->size : 1, NULL};
        *later = u;
    } else {
        munmap((void *)(uintptr_t)a->base, a->size ? a->size : 1);
    }
    G.st.bytes_in_use[a->dev] -= a->size;
    pool_gave(a->pool, a->size);
    *a = G.allocs[--G.nallocs];
    return CUDA_SUCCESS;
}

static CUresult do_free(CUdeviceptr dptr) { return do_free_ex(dptr, NULL); }

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    CALLED();
    ENTER_API();
    G.st.mem_alloc_calls++;
    CUresult r = unsafe_call();
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    LEAVE(do_alloc(current_ctx(), -1, dptr, size, NULL, NULL));
}

/*
 * "Managing memory allocations using cudaMalloc and cudaFree causes the GPU
 * to synchronize across all executing CUDA streams" (CUDA Programming
 * Guide, "Stream-Ordered Memory Allocator"); cuMemFree "will not perform
 * any implicit synchronization when the pointer was allocated with
 * cuMemAllocAsync or cuMemAllocFromPoolAsync. ... For all other pointers,
 * this API may perform implicit synchronization" (cuda.h). So freeing
 * cuMemAlloc's memory first completes the work queued on its device (work
 * that never ends stays queued, as everywhere here), and a program may free
 * memory its queued copies still target, as Numba's deallocations do; the
 * stream-ordered kind is freed at once, whatever still uses it (the caller
 * must have made sure nothing does). cuMemFreeAsync is the stream-ordered
 * twin: "the memory is released back to the pool" when the stream reaches
 * the free ("Frees memory with stream ordered semantics", cuda.h), so work
 * queued on the stream before it still finds the memory (free_async).
 * "May": with FAKECUDA_FREE_NO_SYNC=1 the free does not synchronise, and
 * work still queued on the memory faults when it runs (the shim must not
 * rely on the synchronisation: scripts/check.sh runs the e2e suite under
 * it too).
 */
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CALLED();
    ENTER_API();
    G.st.mem_free_calls++;
    CUresult r = unsafe_call();
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    /* cudaFree(NULL) is a no-op in the runtime; the driver refuses 0. */
    if (!dptr)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    const allocation *a = find_alloc(dptr, false);
    if (a && !a->stream_ordered && !G.free_no_sync) {
        G.st.free_synchronizations++;
        complete_where_and_unlock(&(completion){NULL, a->dev, false});
        pthread_mutex_lock(&G.lock);
    }
    LEAVE(do_free(dptr));
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                   unsigned int elem)
{
    CALLED();
    NEED_INIT();
    if (!dptr || !pitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    ENTER();
    size_t p = (width + G.pitch_align - 1) & ~(size_t)(G.pitch_align - 1);
    G.st.mem_alloc_calls++;
    CUresult r = unsafe_call();
    if (r == CUDA_SUCCESS)
        r = do_alloc(current_ctx(), -1, dptr, p * height, NULL, NULL);
    if (r == CUDA_SUCCESS)
        *pitch = p;
    LEAVE(r);
}

/* pool: NULL for cuMemAllocAsync. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream h)
{
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    /* "cuMemAllocAsync allocates from the current mempool of the provided
     * stream's device" (cuda.h), whatever the calling thread's current
     * context; cuMemAllocFromPoolAsync from the pool's, which may be
     * another ("use cuMemAllocFromPoolAsync to specify asynchronous
     * allocations from a device different than the one the stream runs
     * on", cuDeviceSetMemPool). */
    int dev = pool ? pool_device(pool) : -1;
    if (pool && dev < 0)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    G.st.mem_alloc_async_calls++;
    /* An allocation on the legacy stream is work queued there, as a free
     * is: refused while a blocking stream captures, which is invalidated
     * (legacy_use: cuda.h's CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "a
     * disallowed implicit dependency on a current capture sequence from
     * cudaStreamLegacy"; the programming guide: "any attempted use of the
     * legacy stream is invalid" while a blocking stream captures). */
    CUresult r = s->capturing ? capture_usable(s) : legacy_use(s);
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    if (s->capturing)
        G.st.graph_allocs++;
    CUmemoryPool from = pool ? pool : G.current_pool[s->ctx->dev];
    LEAVE(do_alloc(s->ctx, dev, dptr, size, s, from));
}

static CUresult free_async(CUdeviceptr dptr, CUstream h)
{
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    G.st.mem_free_async_calls++;
    const allocation *a = find_alloc(dptr, false);
    if (!a)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* Captured, the free is a node of the graph, which the fake does not
     * run: it frees at once, as before. It takes only a graph allocation:
     * "During stream capture, this function results in the creation of a
     * free node and must therefore be passed the address of a graph
     * allocation" (cuMemFreeAsync, cuda.h), and the node "will return
     * CUDA_ERROR_INVALID_VALUE if the user attempts to free ... an address
     * that was not returned by an allocation node" (cuGraphAddMemFreeNode):
     * memory from a pool or cuMemAlloc is refused and stays live. (Whether
     * that invalidates the capture cuda.h does not say: it does not here.)
     * Otherwise the pool's bookkeeping changes now (the stream, in whose
     * order later allocations come, may reuse it at once), and the memory
     * stays mapped until the stream reaches the free: work queued before
     * it still uses it. */
    if (s->capturing) {
        CUresult usable = capture_usable(s);
        LEAVE(usable != CUDA_SUCCESS ? usable
              : a->graph             ? do_free(dptr)
                                     : CUDA_ERROR_INVALID_VALUE);
    }
    CUresult r = legacy_use(s);
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    const CUmemoryPool pool = a->pool;
    const uint64_t size = a->size;
    unmap_later *u = NULL;
    do_free_ex(dptr, &u);
    if (u) {
        u->pf = pending_free_add(pool, s, size);
        submit(s, unmap_when_reached, u);
    }
    maybe_autocomplete_and_unlock(s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s)
{
    CALLED();
    return alloc_async(d, n, NULL, s);
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s)
{
    CALLED();
    return alloc_async(d, n, NULL, ptsz_stream(s));
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr d, CUstream s) { CALLED(); return free_async(d, s); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s)
{
    CALLED();
    return free_async(d, ptsz_stream(s));
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
    CALLED();
    return alloc_async(d, n, p, s);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
    CALLED();
    return alloc_async(d, n, p, ptsz_stream(s));
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    CALLED();
    ENTER_API();
    fctx *c = current_ctx();
    if (!free_bytes || !total)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* A dead context answers nothing: "attempting to access ctx from those
     * threads will result in the error CUDA_ERROR_CONTEXT_IS_DESTROYED"
     * (cuCtxDestroy, cuda.h); on an H100 the reset primary context, still
     * current, answered cuMemGetInfo so (gpu-91caa75). */
    CUresult r = ctx_usable(c);
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    *total = G.mem[c->dev];
    *free_bytes = device_free(c->dev);
    LEAVE(CUDA_SUCCESS);
}

/*
 * Page-locked host memory: cuMemHostAlloc, cuMemFreeHost,
 * cuMemHostGetDevicePointer. Host memory the driver knows (XLA stages
 * every host transfer through a pool of it), allocated in the current
 * context and gone with it ("memory allocations by ... cuMemAllocHost()",
 * cuCtxDestroy; cuMemAllocHost is cuMemHostAlloc without flags). What
 * changes with it is how copies relate to the host ("Copies" below):
 * between device memory and page-locked memory the Async forms are "fully
 * asynchronous", so a page-locked source is read and a page-locked
 * destination written only when the copy's turn comes. The device reaches
 * it at the host address (unified addressing: "the device pointer that may
 * be used to access this host memory from those contexts is always equal
 * to the returned host pointer"). Not modelled: write-combined memory's
 * separate device address (CU_MEMHOSTALLOC_WRITECOMBINED is accepted and
 * answers the host address too), cuMemHostRegister.
 */
host_allocation *find_host_alloc(uint64_t addr, bool interior)
{
    for (size_t i = 0; i < G.nhost_allocs; i++) {
        host_allocation *h = &G.host_allocs[i];
        if (addr == h->base || (interior && addr - h->base < h->size))
            return h;
    }
    return NULL;
}

/* Lock held: forgets host allocation h and gives its memory back. */
void host_free(host_allocation *h)
{
    munmap((void *)(uintptr_t)h->base, h->size);
    G.st.host_bytes_in_use -= h->size;
    *h = G.host_allocs[--G.nhost_allocs];
}

/* cuda.h names no refusal of a size of 0 (cuMemAlloc's says "If bytesize
 * is 0, cuMemAlloc() returns CUDA_ERROR_INVALID_VALUE"); the fake refuses it
 * the same way, the stricter reading, so that no client comes to depend on
 * a pointer for nothing. Flags other than the three cuda.h names are
 * CUDA_ERROR_INVALID_VALUE. */
EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
    CALLED();
    ENTER_API();
    CUresult r = ctx_usable(current_ctx());
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    if (!pp || bytesize == 0 ||
        (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                             CU_MEMHOSTALLOC_WRITECOMBINED)))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    void *p = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    if (G.nhost_allocs == G.caphost_allocs) {
        size_t cap = G.caphost_allocs ? G.caphost_allocs * 2 : 16;
        host_allocation *grown = realloc(G.host_allocs, cap * sizeof *grown);
        if (!grown) {
            munmap(p, bytesize);
            LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        }
        G.host_allocs = grown;
        G.caphost_allocs = cap;
    }
    fctx *c = current_ctx();
    G.host_allocs[G.nhost_allocs++] = (host_allocation){
        (uint64_t)(uintptr_t)p, bytesize, flags, c->green ? &G.primary[c->dev] : c,
        ++G.next_buffer_id};
    G.st.host_alloc_calls++;
    G.st.host_bytes_in_use += bytesize;
    *pp = p;
    LEAVE(CUDA_SUCCESS);
}

/* "p, which must have been returned by a previous call to
 * cuMemAllocHost()": the start of a live allocation, else
 * CUDA_ERROR_INVALID_VALUE. The allocation names its context, so none need
 * be current. */
EXPORT CUresult cuMemFreeHost(void *p)
{
    CALLED();
    ENTER_API();
    host_allocation *h = find_host_alloc((uint64_t)(uintptr_t)p, false);
    if (!p || !h)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    host_free(h);
    G.st.host_free_calls++;
    LEAVE(CUDA_SUCCESS);
}

/* "Flags ... must be set to 0" (cuda.h). The call's own text says it "will
 * fail if the CU_MEMHOSTALLOC_DEVICEMAP flag was not specified", but on
 * devices with unified addressing, as the fake's are, cuda.h's "Automatic
 * Mapping of Host Allocated Host Memory" holds: such memory "is always
 * directly accessible from all contexts on all devices that support
 * unified addressing. This is the case regardless of whether or not the
 * flags CU_MEMHOSTALLOC_PORTABLE and CU_MEMHOSTALLOC_DEVICEMAP are
 * specified", at the host address. So any page-locked allocation has a
 * device pointer (XLA's `vmm` allocator asks for that of PORTABLE memory);
 * pageable memory has none. An address inside the buffer answers the
 * device address at the same offset. */
EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int flags)
{
    CALLED();
    ENTER_API();
    CUresult r = ctx_usable(current_ctx());
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    const host_allocation *h = find_host_alloc((uint64_t)(uintptr_t)p, true);
    if (!pdptr || !h || flags)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    *pdptr = (CUdeviceptr)(uintptr_t)p;
    LEAVE(CUDA_SUCCESS);
}

/* cuda.h: "Returns the base address in *pbase and size in *psize of the
 * allocation by cuMemAlloc() or cuMemAllocPitch() that contains the input
 * pointer dptr", and lists CUDA_ERROR_NOT_FOUND among the returns. It says
 * nothing of memory mapped with cuMemMap; the fake answers there as the
 * driver is reported to (libfabric's hmem_cuda relies on it: "only returns
 * the size of the individual segment containing the pointer"): the one
 * mapping that holds dptr, not the reservation and not neighbouring mappings
 * of it; tests/gpu vmm-ptr-attr checks that on a GPU. A reserved, unmapped
 * address holds no allocation: NOT_FOUND. The shim answers for its own
 * blocks itself, so this only reaches a program's own mappings. Nor does
 * it say anything of page-locked host memory, whose device address is its
 * host address here: the fake answers its allocation, as Numba's
 * test_host_alloc_mapped expects of the device pointer of mapped memory
 * (a test numba-cuda runs on GPUs). */
EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)
{
    CALLED();
    ENTER_API();
    CUdeviceptr b = 0;
    size_t n = 0;
    allocation *a = find_alloc(dptr, true);
    const host_allocation *h = a ? NULL : find_host_alloc(dptr, true);
    if (a) {
        b = a->base;
        n = a->size;
    } else if (h) {
        b = h->base;
        n = h->size;
    } else if (!vmm_mapping_range(dptr, &b, &n)) {
        LEAVE(CUDA_ERROR_NOT_FOUND);
    }
    if (base)
        *base = b;
    if (size)
        *size = n;
    LEAVE(CUDA_SUCCESS);
}

/* Lock held: one attribute of the allocation a (NULL: not a CUDA pointer,
 * which gets the "default NULL values" cuPointerGetAttributes documents). */
static CUresult pointer_attribute(const allocation *a, CUdeviceptr ptr, CUpointer_attribute attr,
                                  void *data)
{
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)data = a ? CU_MEMORYTYPE_DEVICE : 0; break;
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = a ? (CUcontext)a->ctx : NULL; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = a ? ptr : 0; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = a ? a->dev : -1; break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = a ? a->buffer_id : 0;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = a != NULL; break;
    /* "1 if this pointer maps to an allocation that is suitable for
     * cudaIpcGetMemHandle" (cuda.h); cuIpcGetMemHandle takes "an existing
     * device memory allocation created with cuMemAlloc" */
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data = a != NULL; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = a ? a->base : 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = a ? a->size : 0; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
}

/* Lock held: an attribute of page-locked host memory, as cuda.h describes
 * each for host memory: MEMORY_TYPE "CU_MEMORYTYPE_HOST"; CONTEXT "the
 * CUcontext in which ptr was allocated"; DEVICE_POINTER and HOST_POINTER the
 * address itself (unified addressing: "the host and device pointer ... will
 * be the same"); the allocation's range and buffer id; MAPPED, since it is
 * backed. Not suitable for cudaIpcGetMemHandle, which takes device memory. */
static CUresult host_pointer_attribute(const host_allocation *h, CUdeviceptr ptr,
                                       CUpointer_attribute attr, void *data)
{
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)data = CU_MEMORYTYPE_HOST; break;
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = (CUcontext)h->ctx; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = ptr; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: *(void **)data = (void *)(uintptr_t)ptr; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = h->ctx->dev; break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = h->buffer_id; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = 1; break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = h->base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = h->size; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr)
{
    CALLED();
    ENTER_API();
    allocation *a = find_alloc(ptr, true);
    const host_allocation *h = a ? NULL : find_host_alloc(ptr, true);
    if (data && h)
        LEAVE(host_pointer_attribute(h, ptr, attr, data));
    if (data && !a && vmm_reserved(ptr))
        LEAVE(vmm_pointer_attribute(ptr, attr, data));
    /* "If ptr is not a valid CUDA pointer then CUDA_ERROR_INVALID_VALUE" */
    if (!data || !a)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    LEAVE(pointer_attribute(a, ptr, attr, data));
}

EXPORT CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs, void **data,
                                       CUdeviceptr ptr)
{
    CALLED();
    ENTER_API();
    if (!attrs || !data)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    allocation *a = find_alloc(ptr, true);
    const host_allocation *h = a ? NULL : find_host_alloc(ptr, true);
    bool vmm = !a && !h && vmm_reserved(ptr);
    for (unsigned i = 0; i < n; i++)
        if (data[i] && (h     ? host_pointer_attribute(h, ptr, attrs[i], data[i])
                        : vmm ? vmm_pointer_attribute(ptr, attrs[i], data[i])
                              : pointer_attribute(a, ptr, attrs[i], data[i])) != CUDA_SUCCESS)
            LEAVE(CUDA_ERROR_INVALID_VALUE);
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr dptr)
{
    CALLED();
    ENTER_API();
    allocation *a = find_alloc(dptr, true);
    if (!h || !a)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* Like the real driver: the handle names the whole allocation. */
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &a->base, sizeof a->base);
    G.st.ipc_handles++;
    LEAVE(CUDA_SUCCESS);
}
