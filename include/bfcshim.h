/*
 * bfcshim.h - the C interface of libbfcshim.so.
 *
 * libbfcshim.so serves CUDA allocations from best-fit-with-coalescing pools,
 * one per CUDA context. Programs reach the pools in two ways, and both reach
 * the same pools:
 *
 *   - unmodified, through LD_PRELOAD: cudaMalloc, cuMemAlloc and their
 *     stream-ordered twins are served from the pools;
 *   - explicitly, through the functions below, which is how the Python
 *     plug-ins (Numba, CuPy, PyTorch) use the library without LD_PRELOAD.
 *     Link with -lbfcshim, or dlopen the library and look the names up.
 *
 * The library links against no CUDA library: it opens the driver
 * (libcuda.so.1) at the first call. Every function may be called from any
 * thread. The configuration comes from the BFCSHIM_* environment variables
 * (docs/configuration.md), read once at the first call.
 *
 * Results are CUDA driver error codes (CUresult values): 0 is success,
 * 1 (CUDA_ERROR_INVALID_VALUE) a bad argument or pointer, 2
 * (CUDA_ERROR_OUT_OF_MEMORY) a pool or device that cannot hold the request,
 * 3 (CUDA_ERROR_NOT_INITIALIZED) no CUDA driver, 201
 * (CUDA_ERROR_INVALID_CONTEXT) no active context for the device asked for.
 * A failure also writes one line to the log naming the call and the cause,
 * and leaves the pool as it was.
 *
 * Versioning: BFCSHIM_API_VERSION grows when functions are added;
 * bfcshim_api_version() says which version the loaded library implements.
 * Existing functions never change signature or meaning.
 */
#ifndef BFCSHIM_H
#define BFCSHIM_H

#include <stddef.h>
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

#define BFCSHIM_API_VERSION 2

/* The API version the loaded library implements (>= 1). */
int bfcshim_api_version(void);

/* 1 when allocations are served from the pools; 0 when the library passes
 * them to the driver (BFCSHIM_ALLOCATOR=platform, no driver, or a child
 * forked after the parent used CUDA). The functions below work either way. */
int bfcshim_active(void);

/* ---- allocation -------------------------------------------------------------
 *
 * `device` picks the pool: the current context's when it belongs to that
 * device (or device is -1), else the device's primary context, which must be
 * active (any CUDA runtime call on the device activates it). A device below
 * -1 is refused with CUDA_ERROR_INVALID_VALUE.
 *
 * bfcshim_malloc / bfcshim_free behave like cudaMalloc / cudaFree: a freed
 * block is handed out again only after the work queued on every stream of
 * the context when it was freed has finished. Size 0 succeeds with *ptr =
 * NULL and logs nothing, as cudaMalloc's and cudaMallocAsync's does, in
 * both functions (freeing NULL is a no-op).
 *
 * bfcshim_malloc_async / bfcshim_free_async behave like cudaMallocAsync /
 * cudaFreeAsync: the block may be used by work on `stream` (a CUstream or
 * cudaStream_t; NULL is the legacy default stream of the current context,
 * as theirs, whatever `device` says) and, once freed, is
 * handed out again at once to allocations on the same stream and to others
 * after the work queued on `stream` has finished. A block used on other
 * streams must be freed with bfcshim_free, or after those streams are
 * synchronised. An explicit stream's own context is used whatever `device`
 * says.
 */
int bfcshim_malloc(void **ptr, size_t size, int device);
int bfcshim_free(void *ptr);
int bfcshim_malloc_async(void **ptr, size_t size, int device, void *stream);
int bfcshim_free_async(void *ptr, void *stream);

/* PyTorch's CUDAPluggableAllocator entry points (stream-ordered, as above).
 * The allocation returns NULL when it fails. The free is called, as PyTorch
 * calls it, with the device and stream the block was allocated with: a NULL
 * (legacy) stream then names the default stream of the context the block
 * was allocated in, whichever context is current at the free. */
void *bfcshim_torch_alloc(ssize_t size, int device, void *stream);
void bfcshim_torch_free(void *ptr, size_t size, int device, void *stream);
/* PyTorch's record_stream function (API version 2): the block at ptr, as
 * bfcshim_torch_alloc returned it and not yet freed, is used by work on
 * `stream` too. Its bfcshim_torch_free then makes the freeing stream wait
 * for the work queued on every such stream so far (or, where that cannot be
 * done, frees it like bfcshim_free), so the block is never handed out under
 * that work. Any other pointer is logged and ignored. */
void bfcshim_torch_record_stream(void *ptr, void *stream);

/* ---- memory and statistics ---------------------------------------------------- */

/* What a program can still allocate on `device` and the device's total, as
 * cuMemGetInfo reports them under LD_PRELOAD: the pool's unused bytes plus
 * what the device can still add to the pool, within the pool's limit. */
int bfcshim_mem_get_info(int device, size_t *free_bytes, size_t *total_bytes);

/* The statistics of every pool as JSON (the BFCSHIM_STATS_FILE document,
 * docs/configuration.md), written into buf like snprintf: at most size bytes
 * including the terminating NUL; returns the document's length, so a return
 * >= size means the buffer was too small. Returns 0, with buf an empty
 * string, when the document cannot be made (no memory). */
size_t bfcshim_stats_json(char *buf, size_t size);

/* Writes the statistics to path (NULL: BFCSHIM_STATS_FILE); 0 on success,
 * -1 when the file cannot be written. */
int bfcshim_write_stats(const char *path);

/* Gives idle memory back to the device: every region of every pool that
 * holds no allocated block and no block still awaiting GPU work is freed
 * (blocks whose work has finished are recognised without waiting). Returns
 * the bytes released. With BFCSHIM_PREALLOCATE=true the pool's one region
 * goes back too when it is wholly idle, and is taken again at the next
 * allocation. A pool over virtual memory (BFCSHIM_VMM) gives back every
 * granule that lies wholly in free space, live blocks or not, and keeps its
 * address range; memory is mapped again as allocations need it. */
size_t bfcshim_trim(void);

#ifdef __cplusplus
}
#endif

#endif
