/*
 * fake_cuda.h - the test-control API of the fake CUDA driver
 * (tests/fake_cuda/libcuda.so.1). Test programs reach it with
 * fakecuda_api() without linking against it, as programs that never heard of
 * the shim would not.
 *
 * The fake driver serves "device memory" from host memory (mmap, so tests can
 * write and check patterns) and page-locked host memory, keeps several
 * devices with configurable memory,
 * primary and created contexts, streams whose work completes only when a test
 * says so, events, graph-capture state with CUDA's invalidation rules, and
 * failure injection. It counts the calls of each entry point (calls below),
 * so that a benchmark can count what a library above the driver costs in
 * driver calls without a GPU.
 *
 * Environment: FAKECUDA_DEVICES (2), FAKECUDA_MEM (per device, "1GiB"; a list
 * "1GiB,512MiB" sets each), FAKECUDA_FAIL_ALLOC=N (the Nth cuMemAlloc fails
 * with CUDA_ERROR_OUT_OF_MEMORY), FAKECUDA_AUTOCOMPLETE=1 (all work completes
 * at once, like an idle GPU), FAKECUDA_ZERO_ALLOC=1 (cuMemAlloc of 0 bytes
 * returns a pointer instead of CUDA_ERROR_INVALID_VALUE), FAKECUDA_OTHER_USED
 * (memory other processes hold on each device, "0"; a list sets each),
 * FAKECUDA_CTX_OVERHEAD (what each live context takes for itself, "0"),
 * FAKECUDA_PITCH_ALIGN (cuMemAllocPitch's row alignment, "128"),
 * FAKECUDA_VMM=0 (no virtual memory management), FAKECUDA_VMM_GRANULARITY
 * (its granularity, "2MiB"; FAKECUDA_FAIL_ALLOC counts cuMemCreate too),
 * FAKECUDA_VMM_REFUSE=<name> (cuMemAddressReserve, cuMemCreate, cuMemMap or
 * cuMemSetAccess fails with CUDA_ERROR_NOT_SUPPORTED while the device reports
 * virtual memory management, as cuMemSetAccess does on some WSL2 drivers),
 * FAKECUDA_REUSE_STREAM_HANDLES=1 (cuStreamCreate gives the most recently
 * destroyed stream's handle to the new stream at once, its old work still
 * queued: the driver promises nothing about handle values; by default a
 * destroyed stream's handle stays recognised as stale),
 * FAKECUDA_LEGACY_SKIPS_DESTROYED (default 1: the legacy stream's implicit
 * wait for every blocking stream leaves out destroyed ones, whose queued
 * work still runs: the stream synchronisation note does not say whether a
 * destroyed stream is among "all blocking streams", and the shim must be
 * safe either way; =0 takes the other reading, that it is),
 * FAKECUDA_FREE_NO_SYNC=1 (cuMemFree of cuMemAlloc's memory does not
 * complete the device's queued work first: cuda.h says only that it "may
 * perform implicit synchronization"; by default, and with =0, it does. Not
 * the default, unlike the switch above: the Programming Guide says cudaFree
 * "causes the GPU to synchronize across all executing CUDA streams",
 * cuda.h asks the caller to make sure no work still uses the memory only
 * for stream-ordered pointers, and Numba's own tests free memory their
 * queued copies still target (test_numba_suite crashes without the shim
 * under =1). The shim must not rely on it: scripts/check.sh runs the e2e
 * suite a second time under =1, and the tests that rely on it set =0),
 * FAKECUDA_REUSE_EVENT_HANDLES=1 (cuEventCreate gives the most recently dead
 * event's handle, one cuEventDestroy destroyed or one that died with its
 * context (cuCtxDestroy, the last cuDevicePrimaryCtxRelease,
 * cuDevicePrimaryCtxReset), to the new event: a fresh event of the new one's
 * context, never recorded, so a late use of the old handle reaches it,
 * uncounted, and a query answers for it; by default a dead event's handle
 * stays recognised as stale and its uses are counted in stale_handle_uses),
 * FAKECUDA_STALE_BACKTRACE=1 (each use of a dead handle, counted in
 * stale_handle_uses, also prints what it was, whose, and the caller's stack
 * on stderr: how a rare one is traced to the shim's path, with addr2line on
 * the library's offsets).
 */
#ifndef BFCSHIM_TESTS_FAKE_CUDA_H
#define BFCSHIM_TESTS_FAKE_CUDA_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct fakecuda_stats {
    uint64_t mem_alloc_calls;      /* cuMemAlloc_v2, cuMemAllocPitch_v2 */
    uint64_t mem_free_calls;       /* cuMemFree_v2 */
    uint64_t mem_alloc_async_calls;
    uint64_t mem_free_async_calls;
    uint64_t bytes_in_use[8];      /* per device, real allocations */
    uint64_t ctx_synchronize_calls;
    uint64_t stream_synchronize_calls;
    uint64_t event_synchronize_calls;
    uint64_t event_records;
    uint64_t legacy_stream_ops;    /* work submitted on the legacy stream */
    uint64_t capture_invalidations;
    uint64_t graph_allocs;         /* allocations made into a capture */
    uint64_t ipc_handles;
    uint64_t proc_address_lookups;
    uint64_t stale_handle_uses;    /* a destroyed stream's or event's handle used */
    uint64_t unsafe_calls_refused; /* potentially unsafe calls during a capture */
    uint64_t event_queries;        /* cuEventQuery calls that were answered */
    uint64_t vmm_reserve_calls;    /* cuMemAddressReserve */
    uint64_t vmm_address_free_calls; /* cuMemAddressFree that succeeded */
    uint64_t vmm_create_calls;     /* cuMemCreate (bytes_in_use counts what they hold) */
    uint64_t vmm_map_calls;        /* cuMemMap */
    uint64_t vmm_unmap_calls;      /* cuMemUnmap */
    uint64_t vmm_retain_calls;     /* cuMemRetainAllocationHandle that succeeded */
    uint64_t vmm_peer_grants;      /* cuMemSetAccess entries giving a peer device access */
    uint64_t vmm_access_calls;     /* cuMemSetAccess calls that succeeded */
    uint64_t peer_enables;         /* cuCtxEnablePeerAccess that succeeded */
    uint64_t implicit_joins;       /* operations made to wait by the legacy stream's rules */
    uint64_t host_copy_waits;      /* copies to host memory that completed their stream */
    uint64_t free_synchronizations; /* cuMemFree of cuMemAlloc's memory, which completes its device */
    uint64_t host_alloc_calls;     /* cuMemHostAlloc that succeeded */
    uint64_t host_free_calls;      /* cuMemFreeHost that succeeded */
    uint64_t host_bytes_in_use;    /* page-locked host memory held */
    uint64_t peer_copies;          /* cuMemcpyPeerAsync that succeeded */
    uint64_t stream_value_writes;  /* cuStreamWriteValue64 that succeeded */
    uint64_t pool_access_calls;    /* cuMemPoolSetAccess that succeeded */
    uint64_t memsets;              /* cuMemsetD8/D16/D32[Async] that queued work */
    uint64_t captured_ops;         /* copies, memsets, value writes, host functions captured */
    uint64_t capture_forks;        /* streams that joined a capture by waiting on its event */
} fakecuda_stats;

typedef void (*fakecuda_work)(void *arg);

/* How often one driver entry point was called, by its exported name. */
typedef struct fakecuda_call_count {
    const char *name;
    uint64_t calls;
} fakecuda_call_count;

typedef struct fakecuda_api {
    /* Queue host work on a stream: it runs when the stream's work completes
 * (on a capturing stream it is captured, and never runs, as a kernel).
 * complete() and pending() also take a destroyed stream's handle (its work
 * goes on after cuStreamDestroy until it completes). */
    int (*launch)(void *stream, fakecuda_work fn, void *arg);
    /* Complete everything submitted so far on one stream / on all streams. */
    void (*complete)(void *stream);
    void (*complete_all)(void);
    /* Operations submitted on a stream and not yet completed. */
    uint64_t (*pending)(void *stream);
    void (*stats)(fakecuda_stats *out);
    /* The Nth cuMemAlloc_v2 from now fails (0: none). */
    void (*fail_alloc_after)(uint64_t n);
    /* Is this address inside a live real allocation (cuMemAlloc) or a
     * mapping (cuMemMap)? */
    int (*is_device_pointer)(uint64_t addr);
    /* Queue work that never completes (a kernel that does not end): the
     * stream completes nothing past it, and cuEventSynchronize on an event
     * behind it blocks for good. */
    int (*launch_stuck)(void *stream);
    /* Operations submitted on a stream so far: the position of the last one,
     * which complete_to takes. */
    uint64_t (*submitted)(void *stream);
    /* Complete a stream's first `seq` operations (and the work on other
     * streams they wait for), as a GPU that is that far along: what the
     * host queued after them stays pending. */
    void (*complete_to)(void *stream, uint64_t seq);
    /* Calls of every driver entry point called at least once so far, each
     * counted under the name it is exported by (cuEventRecord_ptsz apart
     * from cuEventRecord), however it was reached (dlsym, cuGetProcAddress)
     * and whatever it answered; the test-control functions here are not
     * entry points and count nothing. Writes up to n entries, in the order
     * of first call, and returns how many there are. */
    size_t (*calls)(fakecuda_call_count *out, size_t n);
    /* The next cuEventQuery, from any thread, first calls fn(arg) on its
     * caller's thread, after the call is counted and before the driver's
     * lock is taken; then it answers as usual. Only one call runs it. For
     * putting another thread's call (a capture begun) between a library's
     * decisions about a query (its capture mode) and the query itself. */
    void (*before_next_event_query)(fakecuda_work fn, void *arg);
    /* Makes ctx current on the calling thread as cuCtxSetCurrent would, but
     * through no entry point: a change made through the driver's private
     * tables, which no interposer sees. Returns cuCtxSetCurrent's code. */
    int (*set_current_unseen)(void *ctx);
    /* The next cuStreamDestroy (either version), from any thread, calls
     * fn(arg) on its caller's thread once the stream is destroyed, outside
     * the driver's lock, before it returns: what another thread may do
     * between the driver's destroy and the caller's next step (make a
     * stream, which may get the destroyed one's handle). Only one call runs
     * it. */
    void (*after_next_stream_destroy)(fakecuda_work fn, void *arg);
    /* The next cuMemCreate, from any thread, calls fn(arg) on its caller's
     * thread once the driver answered, outside the driver's lock, before
     * it returns: what another thread may do between the driver's create
     * and the caller's bookkeeping of it (tear its context down, take over
     * the loans of dead pools). Only one call runs it. */
    void (*after_next_mem_create)(fakecuda_work fn, void *arg);
    /* The nth call from now (from any thread; n >= 1) of entry point
     * `name`, counted under that exported name as calls() counts it, is
     * counted and then answers `code` without doing anything; with sticky,
     * so does every later call of it, as after a kernel's fault. One rule
     * per entry point: arming again replaces it, n == 0 clears it. Only
     * codes cuda.h documents for that entry point (its \return list, and
     * CUDA_ERROR_ILLEGAL_ADDRESS or CUDA_ERROR_LAUNCH_FAILED where it notes
     * "error codes from previous, asynchronous launches"), for the entry
     * points fake_driver.c lists (cuEventCreate, cuEventRecord[_ptsz],
     * cuGreenCtxRecordEvent, cuEventQuery, cuEventSynchronize,
     * cuStreamWaitEvent[_ptsz], cuCtxSynchronize, cuStreamSynchronize[_ptsz],
     * cuStreamIsCapturing[_ptsz], cuStreamGetCaptureInfo_v3[_ptsz],
     * cuCtxGetId, cuStreamGetId[_ptsz], cuMemCreate, cuMemMap, cuMemUnmap,
     * cuMemSetAccess). Returns 0, or -1 (nothing armed) for another entry
     * point or code. */
    int (*fail_call)(const char *name, uint64_t n, int code, int sticky);
    /* The nth call from now (from any thread; n >= 1) of cuStreamIsCapturing
     * (that exported name; not its _ptsz twin) calls fn(arg) on its caller's
     * thread once the driver answered, outside the driver's lock, before
     * it returns: what another thread may do (end a capture) between a
     * library's question about a stream and what it does with the answer.
     * Only one call runs it; arming again replaces it, n == 0 clears it. */
    void (*after_stream_is_capturing)(uint64_t n, fakecuda_work fn, void *arg);
} fakecuda_api;

/* The fake driver's control table, or exit 77 (skip) when the loaded
 * libcuda.so.1 is not the fake. */
static inline const fakecuda_api *fakecuda(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        h = dlopen("libcuda.so.1", RTLD_NOW);
    const fakecuda_api *(*get)(void) =
        h ? (const fakecuda_api *(*)(void))dlsym(h, "fakecuda_api_table") : NULL;
    if (!get) {
        fprintf(stderr, "libcuda.so.1 is not the fake driver: skipping\n");
        exit(77);
    }
    return get();
}

#endif
