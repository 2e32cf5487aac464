/*
 * fake_copies.c - copies, memsets and stream memory writes: stream work that
 * reads and writes the fake's device memory when its turn comes.
 */
#include "fake_internal.h"

/*
 * Copies. "API synchronization behavior" (driver API reference) says how a
 * copy relates to the host and to its stream:
 *   - "For transfers from pageable host memory to device memory, a stream
 *     sync is performed before the copy is initiated. The function will
 *     return once the pageable buffer has been copied to the staging memory
 *     for DMA transfer to device memory, but the DMA to final destination
 *     may not have completed."
 *   - "For transfers from device to either pageable or pinned host memory,
 *     the function returns only once the copy has completed."
 *   - "For transfers from device memory to device memory, no host-side
 *     synchronization is performed."
 *   - "For transfers from any host memory to any host memory, the function
 *     is fully synchronous with respect to the host."
 *   - "For transfers from pinned host memory to device memory, the
 *     function is synchronous with respect to the host."
 * The Async forms "might be synchronous with respect to host" between
 * device and pageable memory, are "fully synchronous" from host memory to
 * host memory, and "For all other transfers, the function should be fully
 * asynchronous". So every copy here is stream work, in order behind what
 * its stream has queued (the synchronous forms: the current context's
 * legacy stream, as cudart's cudaMemcpy is; their _ptds twins: the calling
 * thread's per-thread default stream). A pageable host source is read
 * into a staging buffer when the call is made, so the program may reuse it
 * at once, and a host destination is written before the call returns: the
 * call completes its stream up to the copy, as a host waiting on the GPU
 * would. Page-locked memory (cuMemHostAlloc) is where the Async forms are
 * asynchronous: such a source is read, and such a destination written,
 * only when the copy's turn comes, and the call does not wait (the program
 * must not touch the buffer before the stream has reached the copy); the
 * synchronous forms wait for the copy from or to it. A device destination
 * is written only when the copy's turn comes. The stream sync that the first rule performs before staging
 * is not modelled: completing earlier work there would only hide what a
 * program (or the shim) leaves queued, and the newer text says only
 * "might". During a capture the copy is the graph's and never runs.
 */
typedef struct async_copy {
    void *dst;
    const void *src;
    size_t n;
    void *staging; /* the host source, read at the call */
} async_copy;

static void run_copy(void *arg)
{
    async_copy *c = arg;
    memmove(c->dst, c->src, c->n);
    free(c->staging);
    free(c);
}

/* Lock held: is p device memory (an allocation, or a reservation of the
 * virtual memory API)? Anything else is the host's. */
static bool device_memory(const void *p)
{
    return find_alloc((uint64_t)(uintptr_t)p, true) || vmm_reserved((CUdeviceptr)(uintptr_t)p);
}

/* Lock held: may a copy use [p, p + n)? Where p lies in memory the driver
 * knows, the whole range must lie there too: inside one allocation, in
 * mapped virtual memory (over neighbouring mappings, as cuMemcpyPeerAsync
 * and the memsets take it), or inside one page-locked host allocation (the
 * fake's reading for host memory the device reaches; cuda.h does not say).
 * Pageable host memory is the program's, which the driver cannot check. */
static bool copy_range_ok(const void *p, size_t n)
{
    const uint64_t at = (uint64_t)(uintptr_t)p;
    const allocation *a = find_alloc(at, true);
    if (a)
        return n <= a->base + a->size - at;
    if (vmm_reserved(at))
        return vmm_mapped_on(at, n, -1);
    const host_allocation *h = find_host_alloc(at, true);
    return !h || n <= h->base + h->size - at;
}

/* Both ends of a copy are checked whole, before anything is queued (or the
 * legacy stream used, so a refused call invalidates no capture): a range
 * that runs past its allocation is CUDA_ERROR_INVALID_VALUE, as for the
 * memsets and cuMemcpyPeerAsync, rather than a copy that reads or writes
 * past the end. */
static CUresult copy_on(void *dst, const void *src, size_t n, CUstream h, bool sync_form)
{
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s)
        LEAVE(sync_form ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE);
    if (n && (!copy_range_ok(dst, n) || !copy_range_ok(src, n)))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    CUresult r = work_usable(s);
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    if (n == 0)
        LEAVE(CUDA_SUCCESS);
    if (captured_instead(s)) {
        maybe_autocomplete_and_unlock(s);
        return CUDA_SUCCESS;
    }
    async_copy *c = malloc(sizeof *c);
    if (!c)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    *c = (async_copy){dst, src, n, NULL};
    const bool host_dst = !device_memory(dst), host_src = !device_memory(src);
    const bool locked_dst = host_dst && find_host_alloc((uint64_t)(uintptr_t)dst, true);
    const bool locked_src = host_src && find_host_alloc((uint64_t)(uintptr_t)src, true);
    /* The call returns once the copy is done: the synchronous forms to any
     * host memory and from page-locked memory; the Async ones to pageable
     * memory, and between host buffers (see above). */
    const bool wait = sync_form ? host_dst || locked_src
                                : (host_dst && !locked_dst) || (host_dst && host_src);
    if (host_src && !locked_src && !s->capturing) {
        c->staging = malloc(n);
        if (!c->staging) {
            free(c);
            LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        }
        memcpy(c->staging, src, n);
        c->src = c->staging;
    }
    submit(s, run_copy, c);
    if (wait && !s->capturing) {
        G.st.host_copy_waits++;
        complete_and_unlock(s);
        return CUDA_SUCCESS;
    }
    maybe_autocomplete_and_unlock(s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n)
{
    CALLED();
    return copy_on((void *)(uintptr_t)d, s, n, CU_STREAM_LEGACY, true);
}
EXPORT CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n)
{
    CALLED();
    return copy_on(d, (const void *)(uintptr_t)s, n, CU_STREAM_LEGACY, true);
}
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n)
{
    CALLED();
    return copy_on((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n, CU_STREAM_LEGACY, true);
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st)
{
    CALLED();
    return copy_on((void *)(uintptr_t)d, s, n, st, false);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st)
{
    CALLED();
    return copy_on(d, (const void *)(uintptr_t)s, n, st, false);
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
    CALLED();
    return copy_on((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n, st, false);
}

/* cuMemcpy and cuMemcpyAsync infer the kind from the pointers (unified
 * addressing), as the fake's copies all do. */
EXPORT CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n)
{
    CALLED();
    return copy_on((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n, CU_STREAM_LEGACY, true);
}
EXPORT CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
    CALLED();
    return copy_on((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n, st, false);
}

/* The per-thread default stream's copies: what cuda.h's macros name when a
 * program is built with CUDA_API_PER_THREAD_DEFAULT_STREAM (nvcc
 * --default-stream per-thread), and what cuGetProcAddress hands out with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (cudaTypedefs.h:
 * PFN_cuMemcpyHtoD_v7000_ptds, PFN_cuMemcpyHtoDAsync_v7000_ptsz, ...). The
 * synchronous forms (_ptds) queue on the calling thread's per-thread stream
 * instead of the legacy stream, under the same host-synchronisation rules;
 * the Async forms (_ptsz) read stream 0 as that stream too. */
EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void *s, size_t n)
{
    CALLED();
    return copy_on((void *)(uintptr_t)d, s, n, CU_STREAM_PER_THREAD, true);
}
EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *d, CUdeviceptr s, size_t n)
{
    CALLED();
    return copy_on(d, (const void *)(uintptr_t)s, n, CU_STREAM_PER_THREAD, true);
}
EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr d, CUdeviceptr s, size_t n)
{
    CALLED();
    return copy_on((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n, CU_STREAM_PER_THREAD,
                   true);
}
EXPORT CUresult cuMemcpy_ptds(CUdeviceptr d, CUdeviceptr s, size_t n)
{
    CALLED();
    return copy_on((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n, CU_STREAM_PER_THREAD,
                   true);
}
EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *s, size_t n, CUstream st)
{
    CALLED();
    return copy_on((void *)(uintptr_t)d, s, n, ptsz_stream(st), false);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *d, CUdeviceptr s, size_t n, CUstream st)
{
    CALLED();
    return copy_on(d, (const void *)(uintptr_t)s, n, ptsz_stream(st), false);
}
EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
    CALLED();
    return copy_on((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n,
                   ptsz_stream(st), false);
}
EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
    CALLED();
    return copy_on((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n,
                   ptsz_stream(st), false);
}

/* "Copies from device memory in one context to device memory in another
 * context" (cuMemcpyPeerAsync): a device-to-device copy on hStream, with no
 * host-side synchronisation, needing no peer access (the driver goes
 * through the host where there is none). Both contexts must be live
 * (CUDA_ERROR_INVALID_CONTEXT) and each address inside device memory of its
 * context's device, an allocation or a mapping, with the whole range there
 * (CUDA_ERROR_INVALID_VALUE). */
static bool device_range_of(CUdeviceptr p, size_t n, const fctx *c)
{
    const allocation *a = find_alloc(p, true);
    if (a)
        return a->dev == c->dev && n <= a->base + a->size - p;
    return vmm_mapped_on(p, n, c->dev);
}

static CUresult copy_peer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                          size_t n, CUstream h, bool sync_form)
{
    ENTER_API();
    const fctx *dc = (const fctx *)dst_ctx, *sc = (const fctx *)src_ctx;
    if (!dc || !sc || dc->magic != CTX_MAGIC || sc->magic != CTX_MAGIC || !dc->alive || !sc->alive)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    if (n && (!device_range_of(dst, n, dc) || !device_range_of(src, n, sc)))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_unlock(&G.lock);
    CUresult r = copy_on((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, h, sync_form);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&G.lock);
        G.st.peer_copies++;
        pthread_mutex_unlock(&G.lock);
    }
    return r;
}

EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                                  CUcontext src_ctx, size_t n, CUstream h)
{
    CALLED();
    return copy_peer(dst, dst_ctx, src, src_ctx, n, h, false);
}
EXPORT CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                                       CUcontext src_ctx, size_t n, CUstream h)
{
    CALLED();
    return copy_peer(dst, dst_ctx, src, src_ctx, n, ptsz_stream(h), false);
}

/* cuMemcpyPeer, the synchronous form ("\note_sync"): the same copy, queued
 * on the current context's legacy stream (its _ptds twin on the calling
 * thread's per-thread stream, PFN_cuMemcpyPeer_v7000_ptds), under the API
 * synchronization behavior's rule for device-to-device copies, "no
 * host-side synchronization is performed", as the fake's cuMemcpyDtoD. */
EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                             CUcontext src_ctx, size_t n)
{
    CALLED();
    return copy_peer(dst, dst_ctx, src, src_ctx, n, CU_STREAM_LEGACY, true);
}
EXPORT CUresult cuMemcpyPeer_ptds(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                                  CUcontext src_ctx, size_t n)
{
    CALLED();
    return copy_peer(dst, dst_ctx, src, src_ctx, n, CU_STREAM_PER_THREAD, true);
}

/* cuStreamWriteValue64: "Write a value to memory" as stream work, done when
 * the stream reaches it. Its pointer is a device pointer ("all memory
 * pointers passed as parameters to these operations are device pointers"):
 * device memory, or page-locked host memory (the device reaches it at its
 * host address here), with all 8 bytes inside it; the flags are
 * CUstreamWriteValue_flags. cuda.h lists CUDA_ERROR_INVALID_VALUE and
 * CUDA_ERROR_NOT_SUPPORTED only, so a bad stream is an invalid value too.
 * cuda.h does not state an alignment; the fake asks for 8 bytes, the
 * stricter reading (the hardware writes the value at once). */
typedef struct value_write {
    uint64_t *at;
    uint64_t value;
} value_write;

static void run_value_write(void *arg)
{
    value_write *w = arg;
    *w->at = w->value;
    free(w);
}

static CUresult write_value64(CUstream h, CUdeviceptr addr, cuuint64_t value, unsigned flags)
{
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || (flags & ~(unsigned)CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER) || addr % 8)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    const allocation *a = find_alloc(addr, true);
    const host_allocation *ha = a ? NULL : find_host_alloc(addr, true);
    bool inside = a ? 8 <= a->base + a->size - addr
                  : ha ? 8 <= ha->base + ha->size - addr
                       : vmm_mapped_on(addr, 8, -1);
    if (!inside)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    CUresult r = work_usable(s);
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    if (captured_instead(s)) {
        maybe_autocomplete_and_unlock(s);
        return CUDA_SUCCESS;
    }
    value_write *w = malloc(sizeof *w);
    if (!w)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    *w = (value_write){(uint64_t *)(uintptr_t)addr, value};
    submit(s, run_value_write, w);
    G.st.stream_value_writes++;
    maybe_autocomplete_and_unlock(s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamWriteValue64_v2(CUstream h, CUdeviceptr addr, cuuint64_t value,
                                        unsigned int flags)
{
    CALLED();
    return write_value64(h, addr, value, flags);
}
EXPORT CUresult cuStreamWriteValue64_v2_ptsz(CUstream h, CUdeviceptr addr, cuuint64_t value,
                                             unsigned int flags)
{
    CALLED();
    return write_value64(ptsz_stream(h), addr, value, flags);
}

/* "The cudaMemset functions are asynchronous with respect to the host
 * except when the target memory is pinned host memory" (API
 * synchronization behavior): a memset of device memory is stream work, done
 * when its turn comes; the plain forms (cuMemsetD8, D16, D32) queue it on
 * the legacy stream (their _ptds twins on the per-thread default stream)
 * and, for page-locked host memory (at its device address, which is its
 * host address here), finish it before they return, after the work queued
 * before it. The Async forms are stream work whatever the memory. Pageable
 * memory is no device pointer, and the whole range must lie in one
 * allocation or mapped virtual memory: CUDA_ERROR_INVALID_VALUE, as is a
 * cuMemsetD16 destination that is not "two byte aligned" or a cuMemsetD32
 * one that is not "four byte aligned" (cuda.h), and
 * (as for cuStreamWriteValue64) a bad stream of an Async form, whose list
 * of codes has no invalid handle. A count of 0 still needs a device
 * pointer (cuda.h does not say; the stricter reading). Arguments are
 * checked before the legacy stream is used, so a refused call invalidates
 * no capture. During a capture the memset is the graph's and never runs
 * (captured_instead). */
typedef struct async_set {
    unsigned char *dst;
    uint32_t value;
    unsigned width; /* bytes per element: 1, 2 or 4 */
    size_t n;       /* elements a row */
    size_t pitch, rows; /* the 2D forms' (1 row otherwise) */
} async_set;

static void set_row(unsigned char *dst, uint32_t value, unsigned width, size_t n)
{
    if (width == 1) {
        memset(dst, (int)value, n);
    } else if (width == 2) {
        const uint16_t v = (uint16_t)value; /* the element as the host stores it */
        for (size_t i = 0; i < n; i++)
            memcpy(dst + i * 2, &v, 2);
    } else {
        for (size_t i = 0; i < n; i++)
            memcpy(dst + i * 4, &value, 4);
    }
}

static void run_set(void *arg)
{
    async_set *a = arg;
    for (size_t r = 0; r < a->rows; r++)
        set_row(a->dst + r * a->pitch, a->value, a->width, a->n);
    free(a);
}

/* Lock held: is [d, d + bytes) device memory the program may set: inside one
 * allocation, page-locked host allocation or mapped virtual memory? Sets
 * *locked for page-locked host memory. */
static bool settable(CUdeviceptr d, size_t bytes, bool *locked)
{
    const allocation *a = find_alloc(d, true);
    const host_allocation *ha = a ? NULL : find_host_alloc(d, true);
    *locked = ha != NULL;
    return a ? bytes <= a->base + a->size - d
           : ha ? bytes <= ha->base + ha->size - d
                : vmm_mapped_on(d, bytes, -1);
}

/* The bytes [d, d + *span) that `rows` rows of n elements of `width` bytes,
 * `pitch` bytes apart, cover; false when the pitch is misaligned or shorter
 * than a row (with more than one row), or the span overflows. */
static bool set_span(size_t n, unsigned width, size_t pitch, size_t rows, size_t *span)
{
    if (n > SIZE_MAX / width)
        return false;
    const size_t row = n * width;
    if (rows <= 1) {
        *span = row;
        return true;
    }
    if (pitch % width || pitch < row || rows - 1 > (SIZE_MAX - row) / pitch)
        return false;
    *span = (rows - 1) * pitch + row;
    return true;
}

static CUresult memset_on(CUstream h, CUdeviceptr d, uint32_t value, unsigned width, size_t n,
                          size_t pitch, size_t rows, bool sync_form)
{
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s)
        LEAVE(sync_form ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_VALUE);
    bool locked = false;
    size_t span = 0;
    if (d % width || !set_span(n, width, pitch, rows, &span) ||
        !settable(d, span ? span : 1, &locked))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (rows == 0)
        n = 0;
    CUresult r = work_usable(s);
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    if (n == 0)
        LEAVE(CUDA_SUCCESS);
    if (captured_instead(s)) {
        maybe_autocomplete_and_unlock(s);
        return CUDA_SUCCESS;
    }
    async_set *a = malloc(sizeof *a);
    if (!a)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    *a = (async_set){(unsigned char *)(uintptr_t)d, value, width, n, pitch, rows ? rows : 1};
    submit(s, run_set, a);
    G.st.memsets++;
    if (sync_form && locked && !s->capturing)
        complete_and_unlock(s);
    else
        maybe_autocomplete_and_unlock(s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
    CALLED();
    return memset_on(CU_STREAM_LEGACY, d, v, 1, n, 0, 1, true);
}
EXPORT CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n)
{
    CALLED();
    return memset_on(CU_STREAM_LEGACY, d, v, 2, n, 0, 1, true);
}
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n)
{
    CALLED();
    return memset_on(CU_STREAM_LEGACY, d, v, 4, n, 0, 1, true);
}
/* On the calling thread's per-thread default stream (cuda.h's
 * __CUDA_API_PTDS names; PFN_cuMemsetD8_v7000_ptds), as the copies above. */
EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n)
{
    CALLED();
    return memset_on(CU_STREAM_PER_THREAD, d, v, 1, n, 0, 1, true);
}
EXPORT CUresult cuMemsetD16_v2_ptds(CUdeviceptr d, unsigned short v, size_t n)
{
    CALLED();
    return memset_on(CU_STREAM_PER_THREAD, d, v, 2, n, 0, 1, true);
}
EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr d, unsigned int v, size_t n)
{
    CALLED();
    return memset_on(CU_STREAM_PER_THREAD, d, v, 4, n, 0, 1, true);
}
EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream h)
{
    CALLED();
    return memset_on(h, d, v, 1, n, 0, 1, false);
}
EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream h)
{
    CALLED();
    return memset_on(ptsz_stream(h), d, v, 1, n, 0, 1, false);
}
EXPORT CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream h)
{
    CALLED();
    return memset_on(h, d, v, 2, n, 0, 1, false);
}
EXPORT CUresult cuMemsetD16Async_ptsz(CUdeviceptr d, unsigned short v, size_t n, CUstream h)
{
    CALLED();
    return memset_on(ptsz_stream(h), d, v, 2, n, 0, 1, false);
}
EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream h)
{
    CALLED();
    return memset_on(h, d, v, 4, n, 0, 1, false);
}
EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int v, size_t n, CUstream h)
{
    CALLED();
    return memset_on(ptsz_stream(h), d, v, 4, n, 0, 1, false);
}

/* The 2D forms: Height rows of Width elements, dstPitch bytes apart
 * ("Unused if Height is 1"), under the same rules as the 1D forms above;
 * cuMemsetD2D16's "dstDevice and dstPitch offset must be two byte aligned",
 * cuMemsetD2D32's four. A pitch shorter than a row, with more than one row,
 * is an invalid value too (rows would overlap; cuda.h does not say: the
 * stricter reading), and the whole span, first row to last, must lie in one
 * allocation or mapped virtual memory. Height 0 sets nothing. */
EXPORT CUresult cuMemsetD2D8_v2(CUdeviceptr d, size_t pitch, unsigned char v, size_t n, size_t rows)
{
    CALLED();
    return memset_on(CU_STREAM_LEGACY, d, v, 1, n, pitch, rows, true);
}
EXPORT CUresult cuMemsetD2D8_v2_ptds(CUdeviceptr d, size_t pitch, unsigned char v, size_t n, size_t rows)
{
    CALLED();
    return memset_on(CU_STREAM_PER_THREAD, d, v, 1, n, pitch, rows, true);
}
EXPORT CUresult cuMemsetD2D8Async(CUdeviceptr d, size_t pitch, unsigned char v, size_t n, size_t rows,
                                 CUstream h)
{
    CALLED();
    return memset_on(h, d, v, 1, n, pitch, rows, false);
}
EXPORT CUresult cuMemsetD2D8Async_ptsz(CUdeviceptr d, size_t pitch, unsigned char v, size_t n, size_t rows,
                                      CUstream h)
{
    CALLED();
    return memset_on(ptsz_stream(h), d, v, 1, n, pitch, rows, false);
}

EXPORT CUresult cuMemsetD2D16_v2(CUdeviceptr d, size_t pitch, unsigned short v, size_t n, size_t rows)
{
    CALLED();
    return memset_on(CU_STREAM_LEGACY, d, v, 2, n, pitch, rows, true);
}
EXPORT CUresult cuMemsetD2D16_v2_ptds(CUdeviceptr d, size_t pitch, unsigned short v, size_t n, size_t rows)
{
    CALLED();
    return memset_on(CU_STREAM_PER_THREAD, d, v, 2, n, pitch, rows, true);
}
EXPORT CUresult cuMemsetD2D16Async(CUdeviceptr d, size_t pitch, unsigned short v, size_t n, size_t rows,
                                 CUstream h)
{
    CALLED();
    return memset_on(h, d, v, 2, n, pitch, rows, false);
}
EXPORT CUresult cuMemsetD2D16Async_ptsz(CUdeviceptr d, size_t pitch, unsigned short v, size_t n, size_t rows,
                                      CUstream h)
{
    CALLED();
    return memset_on(ptsz_stream(h), d, v, 2, n, pitch, rows, false);
}

EXPORT CUresult cuMemsetD2D32_v2(CUdeviceptr d, size_t pitch, unsigned int v, size_t n, size_t rows)
{
    CALLED();
    return memset_on(CU_STREAM_LEGACY, d, v, 4, n, pitch, rows, true);
}
EXPORT CUresult cuMemsetD2D32_v2_ptds(CUdeviceptr d, size_t pitch, unsigned int v, size_t n, size_t rows)
{
    CALLED();
    return memset_on(CU_STREAM_PER_THREAD, d, v, 4, n, pitch, rows, true);
}
EXPORT CUresult cuMemsetD2D32Async(CUdeviceptr d, size_t pitch, unsigned int v, size_t n, size_t rows,
                                 CUstream h)
{
    CALLED();
    return memset_on(h, d, v, 4, n, pitch, rows, false);
}
EXPORT CUresult cuMemsetD2D32Async_ptsz(CUdeviceptr d, size_t pitch, unsigned int v, size_t n, size_t rows,
                                      CUstream h)
{
    CALLED();
    return memset_on(ptsz_stream(h), d, v, 4, n, pitch, rows, false);
}
