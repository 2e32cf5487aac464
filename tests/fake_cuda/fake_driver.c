/*
 * fake_driver.c - a fake CUDA driver, built as libcuda.so.1, so that the shim
 * is tested end to end through the real dynamic linker without a GPU. See
 * fake_cuda.h for what it models and how tests steer it.
 *
 * Model
 *   init      every call but cuInit, cuDriverGetVersion, cuGetProcAddress
 *             and the error strings answers CUDA_ERROR_NOT_INITIALIZED
 *             until cuInit(0) succeeds, as cuda.h lists for each call.
 *   devices   FAKECUDA_DEVICES of them, each with a memory size; "device
 *             memory" is host memory from mmap (MAP_NORESERVE), so large
 *             pools cost nothing until touched and tests can read patterns.
 *             An ordinal that names no device is CUDA_ERROR_INVALID_DEVICE
 *             wherever cuda.h lists that code for the call (is_device), an
 *             unknown attribute CUDA_ERROR_INVALID_VALUE. CUDA_VISIBLE_DEVICES
 *             is read at cuInit (indices, UUID prefixes; none visible:
 *             CUDA_ERROR_NO_DEVICE), and a device's memory size, UUID and
 *             PCI bus follow it to its visible ordinal.
 *   contexts  a primary context per device (retain/release/reset; a reset
 *             destroys it but keeps its retain count) and created ones; a
 *             per-thread current context.
 *   streams   each keeps a queue of work (host callbacks, event records)
 *             that completes only when a test calls complete(), or when a
 *             synchronise call forces it, as a host waiting on a GPU would.
 *             The legacy stream (0 or CU_STREAM_LEGACY) is per context and
 *             synchronises implicitly with its blocking streams, the
 *             per-thread default streams of every thread included ("the
 *             legacy stream first waits on all blocking streams, the
 *             operation is queued in the legacy stream, and then all
 *             blocking streams wait on the legacy stream"; the per-thread
 *             default stream is a blocking one: "Stream synchronization
 *             behavior", docs.nvidia.com/cuda/cuda-driver-api/
 *             stream-sync-behavior.html): each operation of either kind
 *             first waits for the other kind's work queued before it
 *             (implicit_join), and an event records those positions too.
 *             cuStreamDestroy returns at once and the stream's queued work
 *             goes on until it completes ("resources ... released
 *             automatically once the device has completed all work",
 *             cuda.h); the handle is invalid from then on.
 *   lifetime  cuCtxDestroy, cuDevicePrimaryCtxReset and the last primary
 *             release first finish the context's queued work (work that
 *             never ends is dropped). The headers say only that the reset
 *             happens "immediately" (cudaDeviceReset, cuda_runtime_api.h);
 *             the real driver waits for the work (measured on an H100,
 *             driver 580: cudaDeviceReset with a 300 ms kernel running
 *             returned after 415 ms; GPU suite reset-running,
 *             docs/results/gpu-a0d5924), and either way work already on the
 *             GPU goes on touching its memory: so here memory given back
 *             before the call is still touched by that work; then they
 *             destroy the context's streams, events and memory. A later
 *             use of such a handle ("undefined behavior", cuCtxDestroy in
 *             cuda.h) gets
 *             CUDA_ERROR_INVALID_HANDLE and is counted (stale_handle_uses:
 *             the real driver may crash instead; on an H100 a stale stream
 *             handle after cudaDeviceReset killed the process), unless
 *             FAKECUDA_REUSE_EVENT_HANDLES is set: then a dead event's handle
 *             (cuEventDestroy, or dead with its context) is given to the next
 *             event made, the most recently dead first, as a fresh event of
 *             the new one's context (never recorded), and a late use of the
 *             old handle silently reaches that event, as it may on a real
 *             driver, which promises nothing about handle values (streams:
 *             FAKECUDA_REUSE_STREAM_HANDLES, stream_cell). cuCtxDestroy
 *             keeps stream-ordered allocations ("not associated with any
 *             CUDA context"), and so does a reset or the last release
 *             ("cudaDeviceReset() will not destroy memory allocations by
 *             cudaMallocAsync()", cuda_runtime_api.h).
 *             A destroyed or inactive context still current to a thread
 *             gets CUDA_ERROR_CONTEXT_IS_DESTROYED there. A new context
 *             may get the old one's handle value (primary contexts always do;
 *             created ones reuse destroyed slots).
 *   green     green contexts: a converted context of their own, with its
 *             own default stream, sharing the primary context's memory;
 *             non-blocking streams; cuGreenCtxRecordEvent (see "green
 *             contexts" below for what cuda.h says and the fake does); a
 *             cuCtxSynchronize of the primary context waits for its green
 *             contexts' work too, as cuda.h says.
 *   vmm       cuMemAddressReserve/Create/Map/SetAccess/Unmap/Release on
 *             host memory: PROT_NONE reservations, memfd physical memory
 *             counted against the device, access enforced by page
 *             protection; a file-descriptor shareable handle is the memory
 *             file, which another process imports and maps (see "virtual
 *             memory management" below).
 *   capture   cuStreamBeginCapture marks a stream with its mode and thread;
 *             cuStreamBeginCaptureToGraph does the same into a graph made by
 *             cuGraphCreate, which cuStreamEndCapture then returns (graphs
 *             are handles without nodes; an invalidated capture returns
 *             NULL, as cuda.h says). A stream that waits on an event
 *             recorded in a capture joins it (a fork, the programming
 *             guide's cross-stream dependencies): it captures what it is
 *             given from then on, and the end on the origin stream ends
 *             every stream of the capture, failing with
 *             CUDA_ERROR_STREAM_CAPTURE_UNJOINED when a fork was not joined
 *             back (an end on a fork: _UNMATCHED). An invalidation
 *             invalidates the whole capture.
 *             Once a capture is invalidated its streams refuse further
 *             work (copies, memsets, host functions, kernels, records,
 *             waits, stream-ordered allocations and frees) and no stream
 *             joins it by a wait, with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
 *             until its end (the programming guide, "Invalidation").
 *             Legacy-stream work while a blocking stream captures
 *             invalidates that capture; cuStreamIsCapturing(CU_STREAM_LEGACY)
 *             then answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT. cuda.h
 *             calls some calls "potentially unsafe" during capture without
 *             listing them (its example is cudaMalloc); the fake's list is
 *             synchronous cuMemAlloc/cuMemFree, event and stream queries
 *             and synchronisation, and cuCtxSynchronize. They follow
 *             cuThreadExchangeStreamCaptureMode's rules: a thread in GLOBAL
 *             mode is refused (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) while
 *             it captures in a non-relaxed mode itself or another thread
 *             captures in GLOBAL mode, THREAD_LOCAL only for its own
 *             captures, RELAXED never. A refused call also invalidates the
 *             captures it conflicts with: cuda.h says so only for
 *             cuCtxRecordEvent (and its green-context twin); the fake
 *             applies that harsher reading to all. What the programming
 *             guide prohibits during a capture ("Prohibited and Unhandled
 *             Operations") is refused in every mode and invalidates the
 *             capture ("Invalidation"): querying or synchronising a
 *             capturing stream (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), the
 *             legacy stream while a blocking stream captures (_IMPLICIT),
 *             an event last recorded in a capture
 *             (CUDA_ERROR_CAPTURED_EVENT, "not permitted on an event which
 *             was last recorded in a capturing stream"; after that capture
 *             has ended, refused alone), and a capturing stream waiting on
 *             a non-captured event without CU_EVENT_WAIT_EXTERNAL
 *             (_ISOLATION; with it, the wait is a node of the graph).
 *   memory    cuMemGetInfo counts memory other processes use
 *             (FAKECUDA_OTHER_USED) and each live context's own overhead
 *             (FAKECUDA_CTX_OVERHEAD), which allocations cannot use either.
 *             Stream-ordered allocations come from the stream's device
 *             ("the memory pool current to the stream's device", cuda.h),
 *             cuMemAllocFromPoolAsync's from its pool's; a device's current
 *             pool must be its own; in a capture an allocation is the
 *             graph's, and cuMemFreeAsync there takes only such a graph
 *             allocation (anything else: CUDA_ERROR_INVALID_VALUE, the
 *             memory kept). cuMemFree of cuMemAlloc's memory first
 *             completes the device's queued work (the programming guide:
 *             cudaFree "causes the GPU to synchronize"); of stream-ordered
 *             memory, not.
 *   host      page-locked host memory (cuMemHostAlloc, cuMemFreeHost,
 *             cuMemHostGetDevicePointer): host memory the driver knows,
 *             at one address for host and device, owned by a context
 *             ("Page-locked host memory" below).
 *   copies    stream work, synchronous forms on the legacy stream (their
 *             _ptds twins on the per-thread default stream): a
 *             pageable host source is staged at the call, a pageable host
 *             destination written before the call returns, page-locked
 *             memory read and written when the copy's turn comes in the
 *             Async forms, device memory when the copy's turn comes; both
 *             ranges checked whole where the driver knows the memory;
 *             cuMemcpyPeer[Async] between devices; cuMemsetD8/D16/D32[Async]
 *             and their 2D forms
 *             and cuStreamWriteValue64 are stream work ("Copies" below).
 *   runtime   no private tables for a real CUDA runtime (cuGetExportTable:
 *             CUDA_ERROR_NOT_SUPPORTED, and one line naming the file that
 *             asked): a program with cudart linked in statically cannot
 *             run here, only one built with -cudart shared, on the fake
 *             libcudart.
 *   failures  FAKECUDA_FAIL_ALLOC / fail_alloc_after make one cuMemAlloc fail;
 *             FAKECUDA_VMM_REFUSE makes one virtual memory call always fail
 *             (or, =cuMemSetAccess:multi, set access over one mapping only).
 * Everything takes one global mutex; host callbacks run outside it.
 */
#include <cuda.h>
#undef cuGetProcAddress /* we define both the v1 and the _v2 entry point */
#undef cuEventElapsedTime /* likewise */
/* ... and these, whose v1 entry points (CUDA 2.0's and 7.0's: cudaTypedefs.h's
 * PFN_cuStreamDestroy_v2000, PFN_cuCtxDestroy_v2000,
 * PFN_cuCtxPushCurrent_v2000, PFN_cuCtxPopCurrent_v2000,
 * PFN_cuDevicePrimaryCtxRelease_v7000, PFN_cuDevicePrimaryCtxReset_v7000)
 * libcuda still exports for old binaries and hands to cuGetProcAddress
 * below the _v2's version. */
#undef cuStreamDestroy
#undef cuCtxDestroy
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
/* ... and cuCtxCreate, a macro for cuCtxCreate_v4: its v1 (CUDA 2.0's),
 * _v2 (3.2's) and _v3 (11.4's) are exported too (below). */
#undef cuCtxCreate
/* ... and cuStreamGetCaptureInfo, a macro for its _v3 (12.3's): the v1
 * (10.1's) and _v2 (11.3's) are exported too. */
#undef cuStreamGetCaptureInfo

#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 8
/* Memory pool handles encode their device: default pools are POOL_DEFAULT +
 * device, created ones POOL_CREATED + 16 * n + device. */
#define POOL_DEFAULT 0xF00D0000u
#define POOL_CREATED 0xBEEF0000u
#define MAX_CREATED_POOLS 64

/* ---- objects -------------------------------------------------------------- */

typedef struct work_item {
    uint64_t seq;
    fakecuda_work fn;
    void *arg;
    bool stuck; /* never completes: a kernel that does not end */
    /* cuStreamWaitEvent: nothing behind this item runs before the event's
     * stream positions have completed (a copy of its dependencies). */
    struct dep *waits;
    size_t nwaits;
} work_item;

typedef struct fstream {
    uint32_t magic;
    struct fctx *ctx;
    unsigned flags;
    bool legacy, per_thread;
    bool destroyed; /* cuStreamDestroy'd: handle invalid, queued work goes on */
    bool dead;      /* its context went away: handle invalid, work never runs */
    /* Operations submitted; completed (taken off the queue, callbacks
     * gathered to run), and the batch that last moved `completed` on;
     * settled: done for sure, every callback it needed, this stream's and
     * the ones its waits gathered from other streams, has run
     * (stream_done_to). */
    uint64_t submitted, completed, completed_batch, settled;
    work_item *queue;
    size_t nqueue, capqueue;
    CUstreamCaptureMode capture_mode;
    bool capturing, invalidated;
    unsigned capture_thread;
    struct fgraph *capture_graph; /* cuStreamBeginCaptureToGraph's, else NULL */
    bool capture_graph_own; /* capture_graph was made when cuStreamGetCaptureInfo asked */
    /* The capture sequence the stream is in while it captures: its own,
     * begun on it (capture_origin is the stream itself), or one it joined by
     * waiting on an event recorded in it (a fork; the origin's mode and
     * thread). cap_work: the graph nodes (captured work) it has added since;
     * waits and records add none, they only move dependencies. Its latest
     * event that another stream of the capture waited on was recorded when
     * it had added join_work nodes, at its position join_seq (submitted);
     * join_into: that stream, at position join_into_seq after the wait. A
     * fork is joined when it added nothing, or nothing after that record,
     * and the stream it joined into is the origin, or joined itself later
     * than that wait (fork_joined). */
    uint64_t capture_seq;
    struct fstream *capture_origin, *join_into;
    uint64_t cap_work, join_work, join_seq, join_into_seq;
    uint64_t id; /* cuStreamGetId: unique for the program's life (0: not asked yet) */
    struct fstream *next; /* all streams of the process (never freed) */
} fstream;

/* What a created stream's CUstream points to. cuda.h's cuStreamDestroy:
 * "In case the device is still doing work in the stream hStream when
 * cuStreamDestroy() is called, the function will return immediately and
 * the resources associated with hStream will be released automatically
 * once the device has completed all work"; nothing is promised about the
 * handle's value afterwards, and cuStreamGetId exists because handles do
 * not identify a stream for the program's life ("The Id is unique for the
 * life of the program"). The cell stands between the handle and the
 * stream so that the fake can take the least the text allows
 * (FAKECUDA_REUSE_STREAM_HANDLES: a destroyed stream's handle names the
 * next created stream at once, its old work still queued: the worst case);
 * by default cells are never reused, and a stale handle stays recognised
 * and counted. */
typedef struct stream_cell {
    uint32_t magic;
    struct fstream *s;
    struct stream_cell *next_free; /* reusable cells, most recently destroyed first */
} stream_cell;

typedef struct fctx {
    uint32_t magic;
    int dev;
    bool primary, alive;
    uint64_t id; /* cuCtxGetId: unique for the program's life, new each time it comes alive */
    int refcount;
    fstream legacy;
    struct fgreen *green; /* a green context's converted context: that green context */
} fctx;

/* A green context (cuGreenCtxCreate). Its converted context (cuCtxFromGreenCtx)
 * is a context of its own handle, with its own legacy stream (the green
 * context's default stream), sharing the primary context's memory. */
typedef struct fgreen {
    uint32_t magic;
    int dev;
    unsigned sm_count;
    fctx ctx;
    struct fgreen *next; /* all green contexts (never freed: handles stay comparable) */
} fgreen;

/* A graph: cuGraphCreate's, or one cuStreamEndCapture made. No nodes (the
 * fake runs no graphs); the handle is checked and its destruction seen. */
typedef struct fgraph {
    uint32_t magic;
    bool destroyed;
    struct fgraph *next; /* all graphs (never freed: stale handles stay readable) */
} fgraph;

/* A resource descriptor (cuDevResourceGenerateDesc): its SM count. */
struct CUdevResourceDesc_st {
    uint32_t magic;
    unsigned sm_count;
};

typedef struct dep {
    fstream *s;
    uint64_t seq;
} dep;

typedef struct fevent {
    uint32_t magic;
    fctx *ctx;
    bool recorded, captured, dead;
    bool destroyed;       /* dead by cuEventDestroy (not its context's end) */
    unsigned flags;       /* cuEventCreate's */
    /* A captured record's capture (its sequence and origin stream), and the
     * stream and position it was recorded at: a stream that waits on it
     * joins that capture (cuStreamWaitEvent). */
    uint64_t capture_seq;
    struct fstream *capture_origin, *rec_stream;
    uint64_t rec_work, rec_seq; /* the stream's cap_work and position */
    uint64_t recorded_ns; /* host time of the last record (cuEventElapsedTime) */
    size_t ndeps, capdeps;
    dep *deps; /* the stream positions it completes with (event_add_dep) */
    struct fevent *next; /* all events (never freed while the context lives) */
    struct fevent *next_free; /* FAKECUDA_REUSE_EVENT_HANDLES: dead events, most recent first */
} fevent;

typedef struct allocation {
    uint64_t base, size;
    int dev;
    fctx *ctx;
    bool stream_ordered; /* cuMemAllocAsync's: outlives cuCtxDestroy */
    bool graph;          /* made in a capture: a graph allocation (cuMemAllocAsync) */
    CUmemoryPool pool;   /* the memory pool it came from (NULL: none, or a graph's) */
    uint64_t buffer_id; /* "a process-wide unique ID" (CU_POINTER_ATTRIBUTE_BUFFER_ID) */
} allocation;

/* Page-locked host memory (cuMemHostAlloc): host memory the driver knows,
 * owned by the context that was current ("memory allocations by
 * cuMemAllocHost()" go with it, cuCtxDestroy). */
typedef struct host_allocation {
    uint64_t base, size;
    unsigned flags; /* CU_MEMHOSTALLOC_* */
    fctx *ctx;
    uint64_t buffer_id;
} host_allocation;

#define STREAM_MAGIC 0x5743414du
#define CELL_MAGIC 0x43454c4cu
#define CTX_MAGIC 0x43545843u
#define EVENT_MAGIC 0x45564e54u
#define GREEN_MAGIC 0x4752454eu
#define DESC_MAGIC 0x44455343u
#define GRAPH_MAGIC 0x47525048u
#define SM_COUNT 132 /* an H100 SXM's */

static struct {
    pthread_mutex_t lock;
    bool configured;
    atomic_bool initialised; /* cuInit(0) has succeeded */
    int ndev;          /* visible devices (CUDA_VISIBLE_DEVICES, at cuInit) */
    int nphys;         /* the machine's: FAKECUDA_DEVICES */
    int phys[MAX_DEVICES]; /* each visible ordinal's device on the machine */
    uint64_t mem[MAX_DEVICES];
    fctx primary[MAX_DEVICES];
    fstream *streams;
    stream_cell *free_cells;   /* FAKECUDA_REUSE_STREAM_HANDLES */
    bool reuse_stream_handles;
    bool stale_backtrace;      /* FAKECUDA_STALE_BACKTRACE */
    uint64_t next_stream_id;
    uint64_t next_capture_seq; /* the last capture sequence begun */
    fevent *events;
    fevent *free_events;       /* FAKECUDA_REUSE_EVENT_HANDLES */
    bool reuse_event_handles;
    fgreen *greens;
    fgraph *graphs;
    fctx *created[64]; /* contexts from cuCtxCreate (destroyed slots reused) */
    size_t ncreated;
    uint64_t other_used[MAX_DEVICES]; /* FAKECUDA_OTHER_USED */
    uint64_t ctx_overhead;            /* FAKECUDA_CTX_OVERHEAD, per live context */
    uint64_t next_ctx_id;             /* the last cuCtxGetId handed out */
    uint64_t pitch_align;             /* FAKECUDA_PITCH_ALIGN */
    uint64_t next_buffer_id;
    unsigned next_thread;
    allocation *allocs;
    size_t nallocs, capallocs;
    host_allocation *host_allocs;
    size_t nhost_allocs, caphost_allocs;
    uint64_t fail_alloc_countdown;
    bool autocomplete;
    bool zero_alloc; /* cuMemAlloc(0) succeeds (CUDA's refuses; nothing may depend on it) */
    fakecuda_stats st;
    pthread_cond_t stuck_cond; /* a host waiting on stuck work sleeps here */
    /* Batches of callbacks gathered and run (unlock_and_run): they run in
     * the order they were gathered. */
    uint64_t batches_gathered, batches_run;
    pthread_cond_t batch_cond;
    CUmemoryPool default_pool[MAX_DEVICES];
    CUmemoryPool current_pool[MAX_DEVICES]; /* cuDeviceSetMemPool's */
    unsigned npools_created;
    /* What each pool holds (pool_state): default pools first, by device,
     * then created ones in order. */
    struct fpool {
        uint64_t used, used_high, reserved, reserved_high, release_threshold;
        int reuse[3]; /* CU_MEMPOOL_ATTR_REUSE_*, 1 by default */
        int dev;      /* -1: no such pool yet */
        /* cuMemPoolSetAccess: other devices' access (bit i: device i) */
        uint64_t peer_read, peer_write;
    } pools[MAX_DEVICES + MAX_CREATED_POOLS];
    /* cuCtxEnablePeerAccess: the (current context, peer context) pairs
     * enabled, as cuda.h keeps them ("direct access of peerContext from the
     * current context"); a context that goes takes its pairs with it. */
    struct peer_pair {
        const struct fctx *from, *to;
    } peers[64];
    size_t npeers;
} G = {.lock = PTHREAD_MUTEX_INITIALIZER,
       .stuck_cond = PTHREAD_COND_INITIALIZER,
       .batch_cond = PTHREAD_COND_INITIALIZER};

/* Calls of each entry point (fakecuda_api.calls), whoever made them and
 * whatever they answered: a benchmark counts what a library above the
 * driver costs in driver calls without a GPU. Kept apart from G and its
 * lock: cuCtxGetCurrent and the other calls that take no lock must not
 * start taking one to be counted. Each entry point finds its slot by name
 * once (CALLED below); there are more slots than entry points, and
 * tests/fake_cuda/test_calls_counted.py checks that every one counts. */
enum { CALL_SLOTS = 256 };
static struct {
    const char *name;
    atomic_uint_fast64_t n;
} call_counts[CALL_SLOTS];
static atomic_size_t ncall_slots;
static pthread_mutex_t call_slots_lock = PTHREAD_MUTEX_INITIALIZER;

/* The slot of entry point `name` + 1, made on its first call (0: the
 * table is full, and the call goes uncounted). */
static unsigned call_slot(const char *name)
{
    pthread_mutex_lock(&call_slots_lock);
    size_t n = atomic_load(&ncall_slots), i = 0;
    while (i < n && strcmp(call_counts[i].name, name) != 0)
        i++;
    if (i == n && n < CALL_SLOTS) {
        call_counts[n].name = name;
        atomic_store(&ncall_slots, n + 1);
    }
    pthread_mutex_unlock(&call_slots_lock);
    return i < CALL_SLOTS ? (unsigned)i + 1 : 0;
}

/* First statement of every entry point: counts the call under the entry
 * point's own name (__func__: cuEventRecord_ptsz apart from cuEventRecord),
 * or, for one whose C name is not its exported symbol (an __asm__ label),
 * under the symbol's (CALLED_AS). */
#define CALLED() CALLED_AS(__func__)
#define CALLED_AS(symbol)                                                        \
    do {                                                                         \
        static atomic_uint called_slot_;                                         \
        unsigned s_ = atomic_load_explicit(&called_slot_, memory_order_acquire); \
        if (!s_) {                                                               \
            s_ = call_slot(symbol);                                              \
            atomic_store_explicit(&called_slot_, s_, memory_order_release);      \
        }                                                                        \
        if (s_)                                                                  \
            atomic_fetch_add_explicit(&call_counts[s_ - 1].n, 1,                 \
                                      memory_order_relaxed);                     \
    } while (0)

static _Thread_local fctx *tls_ctx_stack[16];
static _Thread_local int tls_ctx_depth;
/* The calling thread's per-thread default streams, one per context. */
static _Thread_local struct {
    fctx *ctx;
    fstream *s;
} tls_ptds[MAX_DEVICES + 8];
static _Thread_local int tls_nptds;
static _Thread_local CUstreamCaptureMode tls_capture_mode; /* GLOBAL (0) by default */
static _Thread_local unsigned tls_thread;                  /* 0: not numbered yet */

static fctx *current_ctx(void)
{
    return tls_ctx_depth ? tls_ctx_stack[tls_ctx_depth - 1] : NULL;
}

/* May work be created in context c? A destroyed context, or a primary one
 * not (or no longer) active, that is still current is
 * CUDA_ERROR_CONTEXT_IS_DESTROYED ("the context current to the calling
 * thread has been destroyed using cuCtxDestroy, or is a primary context
 * which has not yet been initialized", cuda.h); none at all is
 * CUDA_ERROR_INVALID_CONTEXT. */
static CUresult ctx_usable(const fctx *c)
{
    return !c ? CUDA_ERROR_INVALID_CONTEXT : c->alive ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

/* Lock held: a small number naming the calling thread. */
static unsigned this_thread(void)
{
    if (!tls_thread)
        tls_thread = ++G.next_thread;
    return tls_thread;
}

/* Host time, for events' records (cuEventElapsedTime). */
static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static uint64_t parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1ull << 10;
    else if (*end == 'M' || *end == 'm')
        mul = 1ull << 20;
    else if (*end == 'G' || *end == 'g')
        mul = 1ull << 30;
    else if (*end == 'T' || *end == 't')
        mul = 1ull << 40;
    return (uint64_t)(v * (double)mul);
}

/* Lock held. */
static void configure(void)
{
    if (G.configured)
        return;
    G.configured = true;
    const char *n = getenv("FAKECUDA_DEVICES");
    G.ndev = n ? atoi(n) : 2;
    if (G.ndev < 0 || G.ndev > MAX_DEVICES)
        G.ndev = 2;
    G.nphys = G.ndev; /* until cuInit reads CUDA_VISIBLE_DEVICES */
    for (int d = 0; d < G.ndev; d++)
        G.phys[d] = d;
    for (size_t i = 0; i < MAX_DEVICES + MAX_CREATED_POOLS; i++)
        G.pools[i] = (struct fpool){.reuse = {1, 1, 1}, .dev = i < (size_t)G.ndev ? (int)i : -1};
    const char *m = getenv("FAKECUDA_MEM");
    uint64_t last = 1ull << 30;
    for (int d = 0; d < G.ndev; d++) {
        if (m && *m) {
            last = parse_bytes(m);
            const char *comma = strchr(m, ',');
            m = comma ? comma + 1 : NULL;
        }
        G.mem[d] = last;
        G.primary[d] = (fctx){.magic = CTX_MAGIC, .dev = d, .primary = true};
        G.primary[d].legacy = (fstream){.magic = STREAM_MAGIC, .ctx = &G.primary[d],
                                        .legacy = true};
        G.default_pool[d] = (CUmemoryPool)(uintptr_t)(POOL_DEFAULT + (unsigned)d);
        G.current_pool[d] = G.default_pool[d];
    }
    const char *o = getenv("FAKECUDA_OTHER_USED");
    last = 0;
    for (int d = 0; d < G.ndev; d++) {
        if (o && *o) {
            last = parse_bytes(o);
            const char *comma = strchr(o, ',');
            o = comma ? comma + 1 : NULL;
        }
        G.other_used[d] = last;
    }
    /* cuMemAllocPitch's row alignment: CUDA documents only that the pitch
     * "is guaranteed to match or exceed the alignment requirement for
     * texture binding" (CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 32
     * here), so a program (and the shim) must take the pitch it is given. */
    const char *pa = getenv("FAKECUDA_PITCH_ALIGN");
    G.pitch_align = pa ? parse_bytes(pa) : 128;
    if (G.pitch_align < 32 || (G.pitch_align & (G.pitch_align - 1)))
        G.pitch_align = 128;
    const char *ov = getenv("FAKECUDA_CTX_OVERHEAD");
    G.ctx_overhead = ov ? parse_bytes(ov) : 0;
    const char *f = getenv("FAKECUDA_FAIL_ALLOC");
    G.fail_alloc_countdown = f ? strtoull(f, NULL, 10) : 0;
    G.autocomplete = getenv("FAKECUDA_AUTOCOMPLETE") != NULL;
    G.zero_alloc = getenv("FAKECUDA_ZERO_ALLOC") != NULL;
    G.reuse_stream_handles = getenv("FAKECUDA_REUSE_STREAM_HANDLES") != NULL;
    G.reuse_event_handles = getenv("FAKECUDA_REUSE_EVENT_HANDLES") != NULL;
    G.stale_backtrace = getenv("FAKECUDA_STALE_BACKTRACE") != NULL;
}

#define ENTER()                        \
    pthread_mutex_lock(&G.lock);       \
    configure()
/* The answer is computed before the lock goes: it may read shared state
 * (LEAVE(event_done(e) ? ...)). */
#define LEAVE(r)                       \
    do {                               \
        __typeof__(r) leave_ = (r);    \
        pthread_mutex_unlock(&G.lock); \
        return leave_;                 \
    } while (0)

/* Every driver call but cuInit, cuDriverGetVersion, cuGetProcAddress and the
 * error strings is CUDA_ERROR_NOT_INITIALIZED before cuInit(0) succeeds:
 * cuda.h lists that code in the return list of every other call, and not in
 * those four (which work before cuInit: cudart finds cuInit itself through
 * cuGetProcAddress). A shim that calls the driver on its own, before the
 * program has initialised it, must see what a real driver says. */
#define NEED_INIT()                                   \
    do {                                              \
        if (!atomic_load(&G.initialised))             \
            return CUDA_ERROR_NOT_INITIALIZED;        \
    } while (0)
#define ENTER_API() \
    NEED_INIT();    \
    ENTER()

/* Does ordinal d name a device? Calls whose cuda.h return list has
 * CUDA_ERROR_INVALID_DEVICE answer that when it does not ("the device
 * ordinal supplied by the user does not correspond to a valid CUDA
 * device"); those that list only CUDA_ERROR_INVALID_VALUE (cuDeviceGetMemPool,
 * cuDeviceSetMemPool, cuMemPoolCreate) answer that. G.ndev may be read
 * without the lock once cuInit has returned: it is set before the flag. */
static bool is_device(int d)
{
    return d >= 0 && d < G.ndev;
}

/* Lock held: a new stream of context c (a created one with `flags`, or a
 * per-thread default stream), listed with all streams; NULL when host memory
 * runs out (CUDA_ERROR_OUT_OF_MEMORY, in the return lists of cuStreamCreate,
 * cuStreamCreateWithPriority and cuGreenCtxStreamCreate). */
static bool stream_done_to(const fstream *s, uint64_t seq);

/* Lock held: destroyed streams whose work is all done leave the list of
 * streams. Their records stay (a stale handle is still recognised and
 * counted), but joins on the legacy stream and completions walk the list,
 * and a long program creates and destroys thousands of streams. */
static void prune_streams(void)
{
    for (fstream **pp = &G.streams; *pp;) {
        fstream *o = *pp;
        if (o->destroyed && o->nqueue == 0 && stream_done_to(o, o->submitted))
            *pp = o->next;
        else
            pp = &o->next;
    }
}

static fstream *new_stream(fctx *c, unsigned flags, bool per_thread)
{
    prune_streams();
    fstream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    *s = (fstream){.magic = STREAM_MAGIC, .ctx = c, .flags = flags, .per_thread = per_thread,
                   .next = G.streams};
    G.streams = s;
    return s;
}

/* Lock held: the handle of a new created stream s (NULL when host memory
 * runs out): a destroyed stream's cell where handles are reused, else a new
 * one. */
static CUstream stream_handle(fstream *s)
{
    stream_cell *cell = G.free_cells;
    if (cell)
        G.free_cells = cell->next_free;
    else if (!(cell = calloc(1, sizeof *cell)))
        return NULL;
    *cell = (stream_cell){.magic = CELL_MAGIC, .s = s};
    return (CUstream)cell;
}

/* Lock held: the stream a created stream's handle names now (destroyed
 * ones included), or NULL when h is no stream handle at all. */
static fstream *cell_stream(CUstream h)
{
    const stream_cell *cell = (const stream_cell *)h;
    return cell->magic == CELL_MAGIC && cell->s->magic == STREAM_MAGIC ? cell->s : NULL;
}

/* Lock held: the calling thread's per-thread default stream in context c,
 * made on first use and listed with all streams (it is a blocking stream:
 * the legacy stream waits for it and it for the legacy stream). cuda.h's
 * CU_STREAM_PER_THREAD is "an implicit stream with per-thread
 * synchronization behavior": one stream per thread and context, the same
 * one at every use while the context lives, so work queued on it orders
 * what comes after. */
static fstream *per_thread_stream(fctx *c)
{
    if (!c)
        return NULL;
    int reuse = -1; /* an entry whose stream died with its context */
    for (int i = 0; i < tls_nptds; i++) {
        if (tls_ptds[i].s->dead)
            reuse = i;
        else if (tls_ptds[i].ctx == c)
            return tls_ptds[i].s;
    }
    /* Only dead entries are replaced: overwriting a live one would give its
     * context a second per-thread stream on the next use, and work queued
     * on the first would no longer order anything after it. */
    if (reuse < 0 && tls_nptds == (int)(sizeof tls_ptds / sizeof tls_ptds[0])) {
        fprintf(stderr, "fake libcuda: one thread uses per-thread default streams of more than "
                        "%d live contexts\n", tls_nptds);
        abort();
    }
    fstream *s = new_stream(c, 0, true);
    if (!s)
        return NULL; /* no host memory: the handle is refused */
    int slot = reuse >= 0 ? reuse : tls_nptds++;
    tls_ptds[slot].ctx = c;
    tls_ptds[slot].s = s;
    return s;
}

/* Lock held: counts a use of a dead handle; with FAKECUDA_STALE_BACKTRACE
 * set, also prints the caller's stack, to find which path of the shim made
 * a rare one (addresses in hidden functions: addr2line -e on the library). */
static void count_stale_use_of(const char *what, const fctx *owner, const char *how)
{
    G.st.stale_handle_uses++;
    if (G.stale_backtrace) {
        void *frames[32];
        const fctx *cur = current_ctx();
        fprintf(stderr, "fake: stale handle use %llu: %s (%s)",
                (unsigned long long)G.st.stale_handle_uses, what, how);
        if (owner) /* (a graph belongs to no context) */
            fprintf(stderr, " of context %p (device %d, %s, %s)", (const void *)owner, owner->dev,
                    owner->primary ? "primary" : "created", owner->alive ? "alive" : "gone");
        fprintf(stderr, ", current context %p:\n", (const void *)cur);
        backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
    }
}

/* Lock held: the stream a handle names, or NULL for a bad handle. Handles
 * of destroyed streams, or of streams whose context went away, are bad, and
 * counted: the real driver may crash on them. */
static fstream *stream_of(CUstream h)
{
    if (h == NULL || h == CU_STREAM_LEGACY) {
        fctx *c = current_ctx();
        return c && c->alive ? &c->legacy : NULL;
    }
    if (h == CU_STREAM_PER_THREAD)
        return per_thread_stream(current_ctx());
    fstream *s = cell_stream(h);
    if (!s)
        return NULL;
    if (s->destroyed || s->dead) {
        count_stale_use_of("stream", s->ctx, s->destroyed ? "destroyed" : "context killed");
        return NULL;
    }
    return s;
}

/* Lock held: for test control, which may still complete a destroyed
 * stream's work. */
static fstream *ctl_stream_of(CUstream h)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return stream_of(h);
    fstream *s = cell_stream(h);
    return s && !s->dead ? s : NULL;
}

/* Lock held: the event a handle names, or NULL (stale handles counted). */
static fevent *event_of(CUevent h)
{
    fevent *e = (fevent *)h;
    if (!e || e->magic != EVENT_MAGIC)
        return NULL;
    if (e->dead) {
        count_stale_use_of("event", e->ctx, e->destroyed ? "destroyed" : "context killed");
        return NULL;
    }
    return e;
}

static bool blocking(const fstream *s)
{
    return !s->legacy && !(s->flags & CU_STREAM_NON_BLOCKING);
}

static bool live_capture(const fstream *s)
{
    return s->capturing && !s->dead && !s->destroyed;
}

/* Lock held: invalidates the capture o is in, on every stream of it (the
 * origin and its forks): a capture is one graph, and cuStreamEndCapture on
 * its origin returns NULL for it whichever stream broke it. */
static void invalidate_capture(fstream *o)
{
    o->invalidated = true;
    if (!o->capture_seq)
        return;
    for (fstream *x = G.streams; x; x = x->next)
        if (x->capturing && x->capture_seq == o->capture_seq)
            x->invalidated = true;
}

/* Lock held: invalidate_capture, counted once per capture in the stats. */
static void invalidate_counted(fstream *o)
{
    if (!o->invalidated)
        G.st.capture_invalidations++;
    invalidate_capture(o);
}

static void end_capture_sequence(uint64_t seq);

/* Lock held: s stops capturing as it or its context goes; the origin of a
 * capture takes its forks with it (the fake's reading: cuda.h says nothing
 * of a capture whose origin stream is destroyed). */
static void stop_capturing(fstream *s)
{
    if (s->capturing && s->capture_origin == s)
        end_capture_sequence(s->capture_seq);
    s->capturing = false;
}

/* Lock held: capture sequence `seq` is over (ended, or its origin destroyed
 * or dead): every stream of it stops capturing. (Sequence numbers are never
 * reused.) */
static void end_capture_sequence(uint64_t seq)
{
    for (fstream *x = G.streams; x; x = x->next)
        if (x->capture_seq == seq) {
            x->capturing = false;
            x->capture_seq = 0;
            x->capture_origin = x->join_into = NULL;
        }
}

/* Lock held: does a blocking stream of c capture? */
static bool blocking_capture_in(const fctx *c)
{
    for (fstream *o = G.streams; o; o = o->next)
        if (o->ctx == c && blocking(o) && live_capture(o))
            return true;
    return false;
}

/* Lock held: the legacy stream of context c is used (work queued, or its
 * status asked) while a blocking stream of c may capture: each such capture
 * is invalidated, and the call fails with CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
 * (the programming guide: the legacy stream "at all times encompasses"
 * the blocking streams, so "any attempted use of the legacy stream is
 * invalid" while one of them captures). */
static CUresult legacy_blocked(const fctx *c)
{
    CUresult r = CUDA_SUCCESS;
    for (fstream *o = G.streams; o; o = o->next)
        if (o->ctx == c && blocking(o) && live_capture(o)) {
            invalidate_counted(o);
            r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        }
    return r;
}

/* Lock held. Work on the legacy stream joins every blocking stream: if one
 * of them is capturing, CUDA invalidates that capture and fails the call. */
static CUresult legacy_use(fstream *s)
{
    if (!s->legacy)
        return CUDA_SUCCESS;
    G.st.legacy_stream_ops++;
    return legacy_blocked(s->ctx);
}

/* Lock held: may s's execution status be asked or waited for? The
 * programming guide ("Prohibited and Unhandled Operations"): "It is invalid
 * to synchronize or query the execution status of a stream which is being
 * captured ... because they do not represent items scheduled for
 * execution", and the legacy stream, which "at all times encompasses" the
 * blocking streams, may not be queried or synchronised while one of them
 * captures; "When an invalid operation is attempted during stream capture,
 * any associated capture graphs are invalidated" ("Invalidation"). So in
 * every capture mode the call is refused and the capture invalidated:
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED for a capturing stream, and for
 * the legacy stream CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, the code
 * cuStreamIsCapturing answers there (which alone does not invalidate). */
static CUresult status_asked(fstream *s)
{
    if (live_capture(s)) {
        invalidate_counted(s);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return s->legacy ? legacy_blocked(s->ctx) : CUDA_SUCCESS;
}

/* Lock held: the origin of the capture e was last recorded in, while that
 * capture is under way; else NULL. */
static fstream *live_capture_of(const fevent *e)
{
    fstream *o = e->capture_origin;
    return e->recorded && e->captured && o && live_capture(o) && o->capture_seq == e->capture_seq
               ? o
               : NULL;
}

/* Lock held: e was last recorded in a capture. Asking about it or waiting
 * for it is refused in every mode (CUDA_ERROR_CAPTURED_EVENT, "not
 * permitted on an event which was last recorded in a capturing stream")
 * and, while that capture is under way, invalidates it (the guide's rule
 * above: "a captured event" does not represent work scheduled either). */
static CUresult captured_event_asked(const fevent *e)
{
    fstream *o = live_capture_of(e);
    if (o)
        invalidate_counted(o);
    return CUDA_ERROR_CAPTURED_EVENT;
}

/* Lock held: may work be given to s? Not while it is in a capture that was
 * invalidated: "When a capture graph is invalidated, further use of any
 * streams which are being captured or captured events associated with the
 * graph is invalid and will return an error, until stream capture is
 * ended" (the programming guide, "Invalidation"), the error cuda.h names
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ("the current capture sequence on
 * the stream has been invalidated due to a previous error"). Nothing is
 * queued or captured, and the call changes nothing else. */
static CUresult capture_usable(const fstream *s)
{
    return live_capture(s) && s->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
                                             : CUDA_SUCCESS;
}

/* Lock held: may the calling thread make a "potentially unsafe" call now
 * (cuThreadExchangeStreamCaptureMode's rules)? If not, the captures it
 * conflicts with are invalidated and the call is refused. */
static CUresult unsafe_call(void)
{
    if (tls_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    unsigned me = this_thread();
    CUresult r = CUDA_SUCCESS;
    for (fstream *o = G.streams; o; o = o->next) {
        if (!live_capture(o))
            continue;
        bool mine = o->capture_thread == me;
        bool conflict = mine ? o->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED
                             : o->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                                   tls_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
        if (conflict) {
            invalidate_counted(o);
            G.st.unsafe_calls_refused++;
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    return r;
}

/* Lock held: appends item w (its seq set by the caller) to s's queue. */
static void enqueue(fstream *s, work_item w)
{
    if (s->nqueue == s->capqueue) {
        s->capqueue = s->capqueue ? s->capqueue * 2 : 16;
        s->queue = realloc(s->queue, s->capqueue * sizeof *s->queue);
    }
    s->queue[s->nqueue++] = w;
}

/* Lock held: has stream o work queued that a new operation of the legacy
 * stream in its context must wait for? Blocking streams do, destroyed ones
 * too (their queued work goes on), captured work does not run. */
static bool legacy_must_wait_for(const fstream *o, const fctx *c)
{
    return o->ctx == c && blocking(o) && !o->dead && !live_capture(o) &&
           !stream_done_to(o, o->submitted);
}

/* Lock held: appends (o, seq) to the growing array *deps of *n. */
static void push_dep(dep **deps, size_t *n, fstream *o, uint64_t seq)
{
    if ((*n & (*n - 1)) == 0) { /* 0, 1, 2, 4, ...: full, double it */
        *deps = realloc(*deps, (*n ? 2 * *n : 1) * sizeof **deps);
        if (!*deps) {
            fprintf(stderr, "fake libcuda: out of memory for the legacy stream's waits\n");
            abort();
        }
    }
    (*deps)[(*n)++] = (dep){o, seq};
}

/* Lock held: the legacy stream's implicit synchronisation: "the legacy
 * stream first waits on all blocking streams, the operation is queued in the
 * legacy stream, and then all blocking streams wait on the legacy stream"
 * (stream-sync-behavior, docs.nvidia.com/cuda/cuda-driver-api/
 * stream-sync-behavior.html). So a new operation of a blocking stream runs
 * after the legacy stream's work queued before it, and one of the legacy
 * stream after every blocking stream's. Returns those stream positions (a
 * malloc'd array, NULL when there are none), their number in *n. Captured
 * operations wait for nothing: "all operations pushed into the stream will
 * not be executed, but will instead be captured into a graph"
 * (cuStreamBeginCapture, cuda.h). */
static dep *implicit_deps(const fstream *s, size_t *n)
{
    dep *deps = NULL;
    *n = 0;
    if (live_capture(s))
        return NULL;
    if (s->legacy) {
        for (fstream *o = G.streams; o; o = o->next)
            if (legacy_must_wait_for(o, s->ctx))
                push_dep(&deps, n, o, o->submitted);
    } else if (blocking(s)) {
        fstream *l = &s->ctx->legacy;
        if (!stream_done_to(l, l->submitted))
            push_dep(&deps, n, l, l->submitted);
    }
    return deps;
}

/* Lock held: before a new operation of s, a wait item (as cuStreamWaitEvent
 * makes) for the positions implicit_deps names. */
static void implicit_join(fstream *s)
{
    size_t n;
    dep *waits = implicit_deps(s, &n);
    if (n == 0)
        return;
    G.st.implicit_joins++;
    enqueue(s, (work_item){.seq = ++s->submitted, .waits = waits, .nwaits = n});
}

/* Lock held: appends work and returns its sequence number. */
static uint64_t submit(fstream *s, fakecuda_work fn, void *arg)
{
    implicit_join(s);
    uint64_t seq = ++s->submitted;
    if (fn)
        enqueue(s, (work_item){.seq = seq, .fn = fn, .arg = arg});
    return seq;
}

/* Lock held: an operation the program issues on a capturing stream "will
 * not be executed, but will instead be captured into a graph"
 * (cuStreamBeginCapture, cuda.h): it takes its place in the stream and
 * never runs here (the fake launches no graphs). True when s captures and
 * the operation was taken so; the caller then frees its payload. */
static bool captured_instead(fstream *s)
{
    if (!live_capture(s))
        return false;
    submit(s, NULL, NULL);
    s->cap_work++;
    G.st.captured_ops++;
    return true;
}

/* Lock held: has s done its first `seq` operations, with every callback
 * they needed run? Not only its own: a wait on s (cuStreamWaitEvent, the
 * legacy stream's joins) gathers other streams' callbacks into the same
 * batch, and until those have run, s's later operations have not either
 * (cuStreamWaitEvent "makes all future work submitted to hStream wait for
 * all work captured in hEvent", and cuStreamQuery answers CUDA_SUCCESS only
 * "if all operations in the stream ... have completed", cuda.h).
 * Batches run in the order they were gathered, so once the batch that last
 * moved `completed` on has run, so has every callback up to `completed`.
 * (A later gather whose batch has not run yet keeps the answer "no" a
 * little longer, never "yes" too soon.) */
static bool stream_done_to(const fstream *s, uint64_t seq)
{
    if (seq <= s->settled)
        return true;
    return s->completed >= seq && G.batches_run > s->completed_batch;
}

/* Lock held: the batch that callbacks gathered now will run in: the next
 * turn (unlock_and_run), or inside a callback, the batch running now, which
 * a nested batch is part of. */
static _Thread_local bool in_callbacks;
static uint64_t batch_being_gathered(void)
{
    return in_callbacks ? G.batches_run : G.batches_gathered;
}

/* Lock held: s is about to complete further, in the batch being gathered.
 * What its last batch completed is settled once that batch has run. */
static void completing(fstream *s)
{
    if (G.batches_run > s->completed_batch)
        s->settled = s->completed;
    s->completed_batch = batch_being_gathered();
}

/* Lock held: appends callback w to *all. */
static void append_work(work_item **all, size_t *nall, const work_item *w)
{
    *all = realloc(*all, (*nall + 1) * sizeof **all);
    (*all)[(*nall)++] = *w;
}

/* Lock held: completes s up to `upto` and appends its callbacks to *all, in
 * the order the GPU would run them. Nothing on a stream completes past work
 * that never ends, nor past a wait (cuStreamWaitEvent) whose event cannot
 * complete: the streams a wait depends on are completed first, their
 * callbacks ahead of the work behind the wait. Items leave the queue one at
 * a time, so that a dependency reaching back into s finds it already
 * completed as far as it needs. */
static void gather(fstream *s, uint64_t upto, work_item **all, size_t *nall)
{
    if (upto > s->submitted)
        upto = s->submitted;
    if (s->completed < upto)
        completing(s);
    while (s->completed < upto) {
        if (s->nqueue == 0 || s->queue[0].seq > upto) {
            s->completed = upto;
            break;
        }
        work_item w = s->queue[0];
        if (w.seq - 1 > s->completed)
            s->completed = w.seq - 1;
        if (w.stuck)
            break;
        if (w.nwaits) {
            bool done = true;
            for (size_t i = 0; i < w.nwaits; i++) {
                gather(w.waits[i].s, w.waits[i].seq, all, nall);
                done = done && w.waits[i].s->completed >= w.waits[i].seq;
            }
            if (!done)
                break;
            free(w.waits);
        } else if (w.fn) {
            append_work(all, nall, &w);
        }
        memmove(s->queue, s->queue + 1, (s->nqueue - 1) * sizeof *s->queue);
        s->nqueue--;
        s->completed = w.seq;
    }
}

/* Lock held: a batch of callbacks has run: a host waiting for work to be
 * done looks again. */
static void callbacks_ran(void) { pthread_cond_broadcast(&G.stuck_cond); }

/* Lock held on entry, released on return: runs callbacks w (gathered under
 * the lock) outside it, after every batch gathered before them has run.
 * Threads complete streams concurrently; without the turns, a thread could
 * run a stream's later work while another still runs its earlier work, or
 * return from a synchronisation while the work it waits for runs in another
 * thread. cuda.h, cuLaunchHostFunc: a host function "will be called after
 * currently enqueued work and will block work added after it", and "host
 * functions without a mandated order (such as in independent streams)
 * execute in undefined order and may be serialized": the turns serialise
 * them, in an order that keeps each stream's. An empty batch waits its turn
 * too. Until a callback has run, its work does not count as done
 * (stream_done_to): cuEventQuery answers CUDA_SUCCESS only "if all captured
 * work has been completed". "The host function must not make any CUDA API
 * calls" (cuLaunchHostFunc); if a test's does, its batch runs at once
 * rather than wait for its own turn to end, as part of the batch running
 * (batch_being_gathered): what it completes counts as done once that batch
 * has run. */
static void unlock_and_run(work_item *w, size_t n)
{
    if (in_callbacks) {
        pthread_mutex_unlock(&G.lock);
        for (size_t i = 0; i < n; i++)
            w[i].fn(w[i].arg);
        pthread_mutex_lock(&G.lock);
        callbacks_ran();
        pthread_mutex_unlock(&G.lock);
        free(w);
        return;
    }
    uint64_t turn = G.batches_gathered++;
    while (G.batches_run != turn)
        pthread_cond_wait(&G.batch_cond, &G.lock);
    pthread_mutex_unlock(&G.lock);
    in_callbacks = true;
    for (size_t i = 0; i < n; i++)
        w[i].fn(w[i].arg);
    in_callbacks = false;
    pthread_mutex_lock(&G.lock);
    G.batches_run++;
    callbacks_ran();
    pthread_cond_broadcast(&G.batch_cond);
    pthread_mutex_unlock(&G.lock);
    free(w);
}

/* Lock held on entry, released on return: completes s fully and runs its
 * callbacks. */
static void complete_and_unlock(fstream *s)
{
    work_item *w = NULL;
    size_t n = 0;
    if (s)
        gather(s, s->submitted, &w, &n);
    unlock_and_run(w, n);
}

/* What a completion covers: context `only`, else the contexts of device
 * `dev`, else (dev < 0) every context. With `greens`, a primary context
 * `only` covers the green contexts of its device too, as a cuCtxSynchronize
 * of it does: "If the current context is the primary context, green
 * contexts that have been created will also be synchronized" (cuda.h,
 * cuCtxSynchronize). */
typedef struct completion {
    const fctx *only;
    int dev;
    bool greens;
} completion;

static bool completing_ctx(const fctx *c, const completion *w)
{
    if (!w->only)
        return w->dev < 0 || c->dev == w->dev;
    return c == w->only || (w->greens && w->only->primary && c->green && c->dev == w->only->dev);
}

/* Lock held on entry, released on return: completes every stream of the
 * contexts completing_ctx names and runs the callbacks. */
static void complete_where_and_unlock(const completion *w)
{
    work_item *all = NULL;
    size_t nall = 0;
    for (int d = 0; d < G.ndev; d++)
        if (completing_ctx(&G.primary[d], w))
            gather(&G.primary[d].legacy, UINT64_MAX, &all, &nall);
    for (size_t i = 0; i < G.ncreated; i++)
        if (completing_ctx(G.created[i], w))
            gather(&G.created[i]->legacy, UINT64_MAX, &all, &nall);
    for (fgreen *g = G.greens; g; g = g->next)
        if (completing_ctx(&g->ctx, w))
            gather(&g->ctx.legacy, UINT64_MAX, &all, &nall);
    for (fstream *s = G.streams; s; s = s->next)
        if (completing_ctx(s->ctx, w) && !s->dead)
            gather(s, UINT64_MAX, &all, &nall);
    unlock_and_run(all, nall);
}

/* Lock held on entry, released on return: completes every stream (of one
 * context, or all) and runs the callbacks. */
static void complete_everything_and_unlock(fctx *only)
{
    complete_where_and_unlock(&(completion){only, -1, false});
}

/* Lock held: completes s if the fake runs with FAKECUDA_AUTOCOMPLETE. */
static void maybe_autocomplete_and_unlock(fstream *s)
{
    if (G.autocomplete && s)
        complete_and_unlock(s);
    else
        pthread_mutex_unlock(&G.lock);
}

/* ---- allocations ---------------------------------------------------------- */

static allocation *find_alloc(uint64_t addr, bool interior)
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
static uint64_t pools_cached(int dev);

static uint64_t device_free(int dev)
{
    uint64_t used = G.st.bytes_in_use[dev] + unavailable(dev) + pools_cached(dev);
    return used < G.mem[dev] ? G.mem[dev] - used : 0;
}

/* Lock held: an allocation in context c (the current one, or for a
 * stream-ordered one, the stream's: then `on` is that stream), on device
 * dev (-1: c's; a memory pool's device may be another). */
static void pool_took(CUmemoryPool pool, uint64_t size);
static void pool_gave(CUmemoryPool pool, uint64_t size);
static uint64_t pool_kept_for(CUmemoryPool pool, const fstream *on, uint64_t size);

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

static void pending_free_reached(struct pending_free *pf);

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

/* ---- initialisation, devices, contexts ------------------------------------- */

/* Device p's UUID: distinct in its first bytes, so that a prefix of its
 * string form names one device, as CUDA_VISIBLE_DEVICES allows. */
static void device_uuid(int p, CUuuid *uuid)
{
    memset(uuid, 0, sizeof *uuid);
    uuid->bytes[0] = (char)(0xfa + p); /* "GPU-fa...", "GPU-fb...", ... */
    memcpy(uuid->bytes + 1, "kecudadevice", 12);
}

/* The machine's device that CUDA_VISIBLE_DEVICES entry `s` (up to `len`
 * bytes) names, or -1 for none. An index is read as strtoul reads it (the
 * driver accepts "1gpu" as 1); a UUID is "GPU-" and a prefix of its
 * string form that matches one device only. */
static int visible_entry(const char *s, size_t len)
{
    while (len && (*s == ' ' || *s == '\t'))
        s++, len--;
    if (len >= 4 && strncmp(s, "GPU-", 4) == 0) {
        int found = -1;
        for (int p = 0; p < G.nphys; p++) {
            CUuuid u;
            device_uuid(p, &u);
            char str[48];
            const unsigned char *b = (const unsigned char *)u.bytes;
            snprintf(str, sizeof str,
                     "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                     b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                     b[12], b[13], b[14], b[15]);
            if (len <= strlen(str) && strncmp(s, str, len) == 0) {
                if (found >= 0)
                    return -1; /* ambiguous */
                found = p;
            }
        }
        return found;
    }
    if (!len || *s < '0' || *s > '9')
        return -1;
    long v = 0;
    for (size_t i = 0; i < len && s[i] >= '0' && s[i] <= '9' && v <= MAX_DEVICES; i++)
        v = v * 10 + (s[i] - '0');
    return v < G.nphys ? (int)v : -1;
}

/* Lock held, at cuInit: makes the devices CUDA_VISIBLE_DEVICES leaves
 * visible the ordinals, in its order, and returns how many there are. "Only the devices whose index is present in the sequence are
 * visible to CUDA applications and they are enumerated in the order of the
 * sequence. If one of the indices is invalid, only the devices whose index
 * precedes the invalid index are visible" (CUDA C++ Programming Guide, CUDA
 * environment variables); UUIDs "work when you specify the first few
 * characters" (MPS guide). An entry naming a device already listed counts
 * as invalid here (the guide does not say; the fake's reading). Unset:
 * every device. Memory sizes and other processes' use (FAKECUDA_MEM,
 * FAKECUDA_OTHER_USED), names, UUIDs and PCI bus ids belong to the
 * machine's device and follow it to its new ordinal. */
static int apply_visible_devices(void)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v)
        return G.nphys;
    int phys[MAX_DEVICES], n = 0;
    bool listed[MAX_DEVICES] = {false};
    for (const char *e = v; n < G.nphys;) {
        const char *comma = strchr(e, ',');
        size_t len = comma ? (size_t)(comma - e) : strlen(e);
        int p = visible_entry(e, len);
        if (p < 0 || listed[p])
            break;
        listed[p] = true;
        phys[n++] = p;
        if (!comma)
            break;
        e = comma + 1;
    }
    if (n == 0)
        return 0; /* nothing changes: cuInit fails */
    uint64_t mem[MAX_DEVICES], other[MAX_DEVICES];
    memcpy(mem, G.mem, sizeof mem);
    memcpy(other, G.other_used, sizeof other);
    for (int d = 0; d < n; d++) {
        G.phys[d] = phys[d];
        G.mem[d] = mem[phys[d]];
        G.other_used[d] = other[phys[d]];
    }
    G.ndev = n;
    for (int d = 0; d < MAX_DEVICES; d++)
        G.pools[d].dev = d < n ? d : -1;
    return n;
}

/* "CUDA_ERROR_NO_DEVICE: no CUDA-capable devices were detected" (cuda.h):
 * with none visible, cuInit fails and the driver stays uninitialised. The
 * environment is read once, at the first cuInit that succeeds, as the
 * driver reads it when it initialises (a process that sets
 * CUDA_VISIBLE_DEVICES after importing a framework, before its first CUDA
 * call, still gets its choice; Numba's test_runtime checks exactly that). */
EXPORT CUresult cuInit(unsigned int flags)
{
    CALLED();
    ENTER();
    if (flags)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!atomic_load(&G.initialised) && apply_visible_devices() == 0)
        LEAVE(CUDA_ERROR_NO_DEVICE);
    atomic_store(&G.initialised, true);
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDriverGetVersion(int *v)
{
    CALLED();
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = CUDA_VERSION;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    CALLED();
    ENTER_API();
    if (!count)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    *count = G.ndev;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    CALLED();
    ENTER_API();
    if (!dev || !is_device(ordinal))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    *dev = ordinal;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CALLED();
    NEED_INIT();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!is_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "Fake CUDA device %d", G.phys[dev]);
    return CUDA_SUCCESS;
}

/* A stable UUID per device (Numba names devices by it). */
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    CALLED();
    ENTER_API();
    if (!uuid)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    device_uuid(G.phys[dev], uuid);
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CALLED();
    ENTER_API();
    if (!bytes)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    *bytes = G.mem[dev];
    LEAVE(CUDA_SUCCESS);
}

/*
 * What cuDeviceGetAttribute answers: a device of compute capability 9.0 as
 * an H100 SXM5 reports it, so that clients which read the device (Numba's
 * occupancy and launch checks, a framework's feature tests) take the paths
 * they take on the GPUs this project targets, not the paths of a device that
 * answers 0 to everything. Two kinds of value:
 *   - the architecture's limits, from the CUDA C++ Programming Guide's table
 *     of compute capability 9.0 (threads, block and grid dimensions, shared
 *     memory and registers per block and per multiprocessor);
 *   - the product's, from the H100 SXM5 (132 multiprocessors, a 50 MiB L2,
 *     a 5120-bit memory bus, 1980 MHz boost and 2619 MHz memory clocks: XLA
 *     derives bandwidths from the clocks and warns when they are 0);
 *     cuDeviceGetName still says "Fake CUDA device".
 * Page-locked host memory from cuMemHostAlloc is modelled, so the device
 * can map host memory (CAN_MAP_HOST_MEMORY) and reach it at its host
 * address (CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, which makes
 * cuMemHostGetDevicePointer answer the host pointer itself: "if all devices
 * visible to the application have a non-zero value ... will match the
 * original pointer"), and 64-bit stream memory operations
 * (CAN_USE_64_BIT_STREAM_MEM_OPS, cuStreamWriteValue64) are there: XLA's
 * `vmm` allocator asks for all three, and an H100 reports them.
 * What the fake does not model answers 0 as "not supported", in cuda.h's
 * words for each attribute, so that a client takes the path it takes on a
 * device without the feature instead of calling an entry point the fake
 * lacks: managed memory (MANAGED_MEMORY, "can allocate managed memory": no
 * cuMemAllocManaged), stream priorities (STREAM_PRIORITIES_SUPPORTED:
 * cuCtxGetStreamPriorityRange answers [0, 0], as cuda.h says it does for
 * such a device, and cuStreamCreateWithPriority's priority is clamped to
 * it), fabric handles
 * and mempool IPC (a virtual memory allocation's file descriptor is
 * modelled: HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED reads 1, as on an
 * H100), and GPUDirect RDMA. Each device has
 * its own PCI bus id (one per device on real machines, and tools order
 * devices by it; cuDeviceGetPCIBusId writes the same one). tests/gpu/gpu_suite.cu `attributes` prints the real
 * device's answers for every attribute in this table.
 */
static const struct {
    CUdevice_attribute attrib;
    int value;
} h100_attributes[] = {
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 48 << 10},
    {CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 64 << 10},
    {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},
    {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
    {CU_DEVICE_ATTRIBUTE_INTEGRATED, 0},
    {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, CU_COMPUTEMODE_DEFAULT},
    {CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 32},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1},
    {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120},
    {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000},        /* kHz */
    {CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2619000}, /* kHz */
    {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 50 << 20},
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
    {CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 228 << 10},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536},
    {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 227 << 10},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32},
    {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0},
    {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT, 0},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 1},
};

EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    CALLED();
    NEED_INIT();
    /* No attribute is 0 or CU_DEVICE_ATTRIBUTE_MAX or beyond: an invalid
     * argument, CUDA_ERROR_INVALID_VALUE in cuda.h's list for the call. */
    if (!pi || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    if (!is_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *pi = 0;
    if (attrib == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) {
        const char *on = getenv("FAKECUDA_VMM");
        *pi = !on || strcmp(on, "0") != 0;
    } else if (attrib == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) {
        *pi = 0x10 * (G.phys[dev] + 1);
    } else {
        for (size_t i = 0; i < sizeof h100_attributes / sizeof h100_attributes[0]; i++)
            if (h100_attributes[i].attrib == attrib)
                *pi = h100_attributes[i].value;
    }
    return CUDA_SUCCESS;
}

/* "[domain]:[bus]:[device].[function] where domain, bus, device, and
 * function are all hexadecimal values", "13 characters including the
 * NULL-terminator" (cuda.h): domain 0, the bus that CU_DEVICE_ATTRIBUTE_
 * PCI_BUS_ID answers, device and function 0 (PCI_DEVICE_ID and
 * PCI_DOMAIN_ID answer 0), as "0000:10:00.0". `len` is "the maximum length
 * of the string that may be returned": a shorter buffer gets the string cut
 * there, still terminated. The fake NVML (tests/fake_cuda/nvml) knows
 * devices by the same ids. */
EXPORT CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev)
{
    CALLED();
    NEED_INIT();
    if (!bus_id || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!is_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(bus_id, (size_t)len, "%04x:%02x:%02x.%x", 0u, 0x10u * (unsigned)(G.phys[dev] + 1), 0u,
             0u);
    return CUDA_SUCCESS;
}

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
static int pool_device(CUmemoryPool pool)
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

/* ---- what memory pools hold ------------------------------------------------ */

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

static void pool_took(CUmemoryPool pool, uint64_t size)
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

static void pool_gave(CUmemoryPool pool, uint64_t size)
{
    struct fpool *f = pool_state(pool);
    if (f)
        f->used -= size;
}

/*
 * Frees the pool has taken back but whose memory it may not yet hand to
 * anyone: a cuMemFreeAsync's bytes, from the call until its stream reaches
 * the free. The stream-ordered allocator "is free to reallocate the memory
 * as long as it can guarantee that compliant memory accesses will not
 * overlap temporally" (cuda.h, CUDA_MALLOC_ASYNC overview), so:
 *   - the freeing stream itself may reuse them at once (stream order);
 *   - another stream only where a reuse policy allows it:
 *     CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES ("insert new stream
 *     dependencies in order to establish the stream ordering required to
 *     reuse a piece of memory released by cuMemFreeAsync") before the free
 *     is reached; after it, ..._REUSE_ALLOW_OPPORTUNISTIC ("reuse of
 *     already completed frees when there is no dependency") or that one.
 *     ..._REUSE_FOLLOW_EVENT_DEPENDENCIES needs the allocating stream's
 *     dependency on the free, which the fake does not trace: the harsher
 *     reading, it never grants reuse by itself. With a policy off, the
 *     other stream's allocation needs memory of its own (out of memory
 *     where the device has none), as it would on a GPU.
 *   - cuMemPoolTrimTo and the release at a synchronisation cannot give
 *     them back: "The allocator cannot release OS allocations that back
 *     outstanding asynchronous allocations", and "Allocations that have
 *     been asynchronously freed but whose completion has not been observed
 *     on the host (eg. by a synchronize) can count as outstanding": here
 *     they do, until their stream reaches the free (the harsher reading: a
 *     program that trims to make room must first wait for its frees).
 * A free reached while neither opportunistic nor internal reuse is allowed
 * stays bound to its stream until the memory is trimmed away.
 * The record is marked by the stream's work (outside the lock), read and
 * dropped under the lock.
 */
typedef struct pending_free {
    struct pending_free *next;
    CUmemoryPool pool;
    const fstream *stream; /* compared, never dereferenced */
    uint64_t size;
    _Atomic bool reached;
} pending_free;

static pending_free *pending_frees;

static void pending_free_reached(pending_free *pf)
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
static uint64_t pool_kept_for(CUmemoryPool pool, const fstream *on, uint64_t size)
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
static pending_free *pending_free_add(CUmemoryPool pool, const fstream *s, uint64_t size)
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
static uint64_t pools_cached(int dev)
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
static void pools_release_at_sync(void)
{
    for (size_t i = 0; i < MAX_DEVICES + MAX_CREATED_POOLS; i++)
        if (G.pools[i].dev >= 0)
            pool_trim(pool_handle_at(i), G.pools[i].release_threshold);
}

/* Lock not held: the release at the end of a synchronisation. */
static void release_after_sync(void)
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
static bool access_flags_known(CUmemAccess_flags f)
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

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CALLED();
    ENTER_API();
    if (!pctx)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    G.primary[dev].refcount++;
    if (!G.primary[dev].alive) /* a new context under the same handle */
        G.primary[dev].id = ++G.next_ctx_id;
    G.primary[dev].alive = true;
    *pctx = (CUcontext)&G.primary[dev];
    LEAVE(CUDA_SUCCESS);
}

/* Lock held (released and taken again while the queued work runs): a
 * context goes away with its streams (their queued work finished first, see
 * "lifetime" above), its events and its memory. Using those streams and
 * events after "will result in undefined behavior" (cuCtxDestroy, cuda.h):
 * the fake answers CUDA_ERROR_INVALID_HANDLE and counts it
 * (stale_handle_uses). */
static void destroy_ctx_memory(fctx *c);
static void peers_forget(const fctx *c);
static void event_dies(fevent *e);
static void kill_ctx(fctx *c)
{
    /* The device finishes what the context queued before it goes (see
     * "lifetime" above); the callbacks run outside the lock, as always. */
    complete_everything_and_unlock(c);
    pthread_mutex_lock(&G.lock);
    for (fstream *s = G.streams; s; s = s->next)
        if (s->ctx == c) {
            s->dead = true;
            stop_capturing(s);
            s->nqueue = 0;
            s->completed = s->settled = s->submitted;
        }
    c->legacy.nqueue = 0;
    c->legacy.completed = c->legacy.settled = c->legacy.submitted;
    for (fevent *e = G.events; e; e = e->next)
        if (e->ctx == c && !e->dead)
            event_dies(e);
    destroy_ctx_memory(c);
    peers_forget(c);
    c->alive = false;
    /* A host thread waiting behind the work just dropped (a kernel that
     * never ends) returns now; woken only by the callbacks above, it could
     * look before the drop and wait for good. cuda.h does not say what a
     * wait already under way answers when its context is destroyed ("It is
     * the responsibility of the calling function to ensure that no API call
     * issues using ctx while cuCtxDestroy() is executing"). The real
     * destroy waits for the context's queued work ("lifetime" above), so
     * there such a wait ends with that work; what it does with work that
     * never ends is not measured (a GPU check is owed): the fake drops it
     * and ends the wait. */
    pthread_cond_broadcast(&G.stuck_cond);
}

static void host_free(struct host_allocation *h);

/* Lock held: drops the allocations of a context, as CUDA does when it goes
 * (its page-locked host memory too: "memory allocations by ...
 * cuMemAllocHost()", cuCtxDestroy).
 * Stream-ordered and VMM allocations stay: cuCtxDestroy "will not destroy
 * memory allocations by cuMemCreate(), cuMemAllocAsync() and
 * cuMemAllocFromPoolAsync()" (they are "not associated with any CUDA
 * context", cuda.h), and "cudaDeviceReset() will not destroy memory
 * allocations by cudaMallocAsync()" (cuda_runtime_api.h). cuda.h's
 * "destroys and cleans up all resources associated with the current device"
 * (cuDevicePrimaryCtxReset) could be read to take cuMemCreate's too, but on
 * an H100 (driver 580) the shim unmapped its granules after cudaDeviceReset
 * without an error (gpu_vmm_reset-running at 91caa75). */
static void destroy_ctx_memory(fctx *c)
{
    for (size_t i = 0; i < G.nhost_allocs;) {
        if (G.host_allocs[i].ctx == c)
            host_free(&G.host_allocs[i]);
        else
            i++;
    }
    for (size_t i = 0; i < G.nallocs;) {
        if (G.allocs[i].ctx == c && !G.allocs[i].stream_ordered) {
            munmap((void *)(uintptr_t)G.allocs[i].base, G.allocs[i].size ? G.allocs[i].size : 1);
            G.st.bytes_in_use[G.allocs[i].dev] -= G.allocs[i].size;
            G.allocs[i] = G.allocs[--G.nallocs];
        } else {
            i++;
        }
    }
}

static CUresult primary_release(CUdevice dev)
{
    ENTER_API();
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    if (G.primary[dev].refcount == 0)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    /* After a reset the context is already gone (primary_reset): the last
     * release has nothing left to destroy. */
    if (--G.primary[dev].refcount == 0 && G.primary[dev].alive)
        kill_ctx(&G.primary[dev]);
    LEAVE(CUDA_SUCCESS);
}

/* A reset destroys the primary context's work, streams, events and memory
 * at once, whoever still holds it, and leaves it inactive; its retain count
 * stays: "Resetting the primary context does not release it, an
 * application that has retained the primary context should explicitly
 * release its usage", and "it is safe for other modules to call
 * cuDevicePrimaryCtxRelease() even after resetting the device" (cuda.h).
 * So the holders' releases still succeed, and a retain after the reset
 * makes the context active again (a new context under the same handle,
 * cuDevicePrimaryCtxRetain) without the earlier holders' counts lost: the
 * last of all the releases destroys it. */
static CUresult primary_reset(CUdevice dev)
{
    ENTER_API();
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    kill_ctx(&G.primary[dev]);
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CALLED();
    return primary_release(dev);
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CALLED();
    return primary_reset(dev);
}

/* The v1 entry points (CUDA 7.0's), under the _v2's rules (cuda.h
 * documents no other). */
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    CALLED();
    return primary_release(dev);
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev);
EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    CALLED();
    return primary_reset(dev);
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CALLED();
    ENTER_API();
    if (!flags || !active)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    *flags = 0;
    *active = G.primary[dev].alive;
    LEAVE(CUDA_SUCCESS);
}

/* Makes *c a new live context on dev (of green context g, or NULL), with
 * its legacy stream. */
static void live_ctx(fctx *c, int dev, fgreen *g)
{
    *c = (fctx){.magic = CTX_MAGIC, .dev = dev, .alive = true, .refcount = 1, .green = g,
                .id = ++G.next_ctx_id};
    c->legacy = (fstream){.magic = STREAM_MAGIC, .ctx = c, .legacy = true};
}

/* Execution affinity, as cuCtxCreate_v3 and _v4 take it: an array of
 * `n` parameters, which "Must be 0 if execAffinityParams is NULL"
 * (CUctxCreateParams); an unknown type is an invalid value. The one type,
 * CU_EXEC_AFFINITY_TYPE_SM_COUNT, "is only supported under Volta+ MPS",
 * which the fake is not: CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY ("the
 * CUexecAffinityType passed to the API call is not supported by the active
 * device"). None at all is a regular context. */
static CUresult affinity_check(const CUexecAffinityParam *params, int n)
{
    if (n < 0 || (n > 0 && !params))
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < n; i++)
        if (params[i].type != CU_EXEC_AFFINITY_TYPE_SM_COUNT)
            return CUDA_ERROR_INVALID_VALUE;
    return n > 0 ? CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY : CUDA_SUCCESS;
}

/* Every cuCtxCreate version makes a context the same way: on dev, current
 * to the calling thread (pushed, so cuCtxPopCurrent restores the one it
 * supplanted), with a usage count of 1. Scheduling flags are not
 * modelled. */
static CUresult create_ctx(CUcontext *pctx, CUdevice dev)
{
    ENTER_API();
    if (!pctx)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    /* A destroyed context's slot (and so its handle value) is reused, as
     * the real driver may. */
    fctx *c = NULL;
    for (size_t i = 0; i < G.ncreated && !c; i++)
        if (!G.created[i]->alive)
            c = G.created[i];
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c)
            LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        if (G.ncreated < 64)
            G.created[G.ncreated++] = c;
    }
    live_ctx(c, dev, NULL);
    if (tls_ctx_depth < 16)
        tls_ctx_stack[tls_ctx_depth++] = c;
    *pctx = (CUcontext)c;
    LEAVE(CUDA_SUCCESS);
}

/* cuCtxCreate in CUDA 13 headers is cuCtxCreate_v4, with creation
 * parameters (PFN_cuCtxCreate_v12050): execution affinity as for _v3;
 * CUDA in Graphics mode (cigParams) "will fail with
 * CUDA_ERROR_NOT_SUPPORTED if CIG is not supported by the device", as on
 * the fake's devices. */
EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                               CUdevice dev)
{
    CALLED();
    (void)flags;
    NEED_INIT();
    if (params && params->cigParams)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = params ? affinity_check(params->execAffinityParams,
                                         params->numExecAffinityParams)
                        : CUDA_SUCCESS;
    return r != CUDA_SUCCESS ? r : create_ctx(pctx, dev);
}

/* The older versions libcuda still exports for binaries built against
 * older headers, handed out by cuGetProcAddress below _v4's version
 * (cudaTypedefs.h): CUDA 11.4's _v3 with execution affinity
 * (PFN_cuCtxCreate_v11040), CUDA 3.2's _v2 (PFN_cuCtxCreate_v3020) and CUDA
 * 2.0's cuCtxCreate (PFN_cuCtxCreate_v2000), both (pctx, flags, dev):
 * declared only under __CUDA_API_VERSION_INTERNAL in cuda.h. */
EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                               unsigned int flags, CUdevice dev);
EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                               unsigned int flags, CUdevice dev)
{
    CALLED();
    (void)flags;
    NEED_INIT();
    CUresult r = affinity_check(params, n);
    return r != CUDA_SUCCESS ? r : create_ctx(pctx, dev);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CALLED();
    (void)flags;
    return create_ctx(pctx, dev);
}

EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CALLED();
    (void)flags;
    return create_ctx(pctx, dev);
}

/* The interop creators (cudaGL.h, cudaVDPAU.h): "Creates a new CUDA
 * context, initializes OpenGL [VDPAU] interoperability, and associates the
 * CUDA context with the calling thread", so the context is made and pushed
 * as cuCtxCreate's; the fake has no OpenGL or VDPAU to interoperate with.
 * cuGLCtxCreate v1 is CUDA 2.0's (PFN_cuGLCtxCreate_v2000), _v2 CUDA 3.2's
 * (_v3020); cuVDPAUCtxCreate v1 CUDA 3.1's (_v3010), _v2 (_v3020). VDPAU's
 * needs its VdpGetProcAddress (INVALID_VALUE without it). */
EXPORT CUresult cuGLCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
EXPORT CUresult cuGLCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CALLED();
    (void)flags;
    return create_ctx(pctx, dev);
}

EXPORT CUresult cuGLCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
EXPORT CUresult cuGLCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CALLED();
    (void)flags;
    return create_ctx(pctx, dev);
}

static CUresult vdpau_create(CUcontext *pctx, CUdevice dev, void *vdp_get_proc_address)
{
    return vdp_get_proc_address ? create_ctx(pctx, dev) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuVDPAUCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev,
                                 uint32_t vdp_device, void *vdp_get_proc_address);
EXPORT CUresult cuVDPAUCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev,
                                 uint32_t vdp_device, void *vdp_get_proc_address)
{
    CALLED();
    (void)flags, (void)vdp_device;
    return vdpau_create(pctx, dev, vdp_get_proc_address);
}

EXPORT CUresult cuVDPAUCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev,
                                    uint32_t vdp_device, void *vdp_get_proc_address);
EXPORT CUresult cuVDPAUCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev,
                                    uint32_t vdp_device, void *vdp_get_proc_address)
{
    CALLED();
    (void)flags, (void)vdp_device;
    return vdpau_create(pctx, dev, vdp_get_proc_address);
}

static CUresult ctx_destroy(CUcontext ctx)
{
    ENTER_API();
    fctx *c = (fctx *)ctx;
    /* A green context's converted context is "a normal primary context"
     * (cuCtxFromGreenCtx), refused here as the primary ones are; it goes with
     * cuGreenCtxDestroy. */
    if (!c || c->magic != CTX_MAGIC || c->primary || c->green || !c->alive)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    kill_ctx(c);
    /* "If ctx is current to the calling thread then ctx will also be popped
     * from the current thread's context stack" (cuda.h): only from its top;
     * deeper in the stack (or on another thread's) the dead handle stays,
     * and calls made with it current fail. */
    if (tls_ctx_depth && tls_ctx_stack[tls_ctx_depth - 1] == c)
        tls_ctx_depth--;
    LEAVE(CUDA_SUCCESS); /* the struct stays: handles may still be compared */
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CALLED();
    return ctx_destroy(ctx);
}

/* The v1 entry point, under the _v2's rules (cuda.h documents no other). */
EXPORT CUresult cuCtxDestroy(CUcontext ctx);
EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    CALLED();
    return ctx_destroy(ctx);
}

/* The deprecated usage-count pair (CUDA 2.0's, still exported by libcuda;
 * PyCUDA's Context.attach/detach call them). cuCtxAttach "increments the
 * usage count of the context" current to the calling thread; cuCtxDetach
 * "decrements the usage count of the context ctx, and destroys the context
 * if the usage count goes to 0. The context must be ... current to the
 * calling thread" (cuda.h). A destroying detach pops it, as cuCtxDestroy of
 * the current context does (PyCUDA: "pop is implicit in detach"). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
EXPORT CUresult cuCtxAttach(CUcontext *pctx, unsigned int flags);
EXPORT CUresult cuCtxAttach(CUcontext *pctx, unsigned int flags)
{
    CALLED();
    NEED_INIT();
    fctx *c = current_ctx();
    if (!pctx || flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (!c || !c->alive)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!c->primary && !c->green)
        c->refcount++;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDetach(CUcontext ctx);
EXPORT CUresult cuCtxDetach(CUcontext ctx)
{
    CALLED();
    NEED_INIT();
    fctx *c = (fctx *)ctx;
    if (!c || c != current_ctx() || c->primary || c->green || !c->alive)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (--c->refcount > 0)
        return CUDA_SUCCESS;
    return ctx_destroy(ctx);
}
/* their addresses, for cuGetProcAddress's table (no warning there) */
static CUresult (*const ctx_detach_entry)(CUcontext) = cuCtxDetach;
static CUresult (*const ctx_attach_entry)(CUcontext *, unsigned) = cuCtxAttach;
#pragma GCC diagnostic pop

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CALLED();
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)current_ctx();
    return CUDA_SUCCESS;
}

/* "If there exists a CUDA context stack on the calling CPU thread, this will
 * replace the top of that stack with ctx. If ctx is NULL then this will be
 * equivalent to popping the top of the calling CPU thread's CUDA context
 * stack" (cuda.h). */
static CUresult set_current(CUcontext ctx)
{
    fctx *c = (fctx *)ctx;
    if (c && c->magic != CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!c) {
        if (tls_ctx_depth)
            tls_ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (tls_ctx_depth == 0)
        tls_ctx_depth = 1;
    tls_ctx_stack[tls_ctx_depth - 1] = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CALLED();
    NEED_INIT();
    return set_current(ctx);
}

static CUresult push_current(CUcontext ctx)
{
    fctx *c = (fctx *)ctx;
    /* cuda.h lists CUDA_ERROR_INVALID_CONTEXT for a context that is not a
     * valid one; the fake's reading: a destroyed context is not (a reset
     * primary context still is: it is revived where it is used). Pushed
     * contexts come off by "cuCtxDestroy() or cuCtxPopCurrent()", cuda.h.
     * (Whether it lives is asked under the lock: another thread may retain
     * or destroy it meanwhile.) */
    if (!c || c->magic != CTX_MAGIC || tls_ctx_depth == 16)
        return CUDA_ERROR_INVALID_CONTEXT;
    ENTER();
    if (!c->alive && !c->primary)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    tls_ctx_stack[tls_ctx_depth++] = c;
    LEAVE(CUDA_SUCCESS);
}

static CUresult pop_current(CUcontext *pctx)
{
    if (!tls_ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    fctx *c = tls_ctx_stack[--tls_ctx_depth];
    if (pctx)
        *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    CALLED();
    NEED_INIT();
    return push_current(ctx);
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CALLED();
    NEED_INIT();
    return pop_current(pctx);
}

/* The v1 entry points (CUDA 2.0's, still exported by libcuda for old
 * binaries), under the _v2's rules (cuda.h documents no other). */
EXPORT CUresult cuCtxPushCurrent(CUcontext ctx);
EXPORT CUresult cuCtxPushCurrent(CUcontext ctx)
{
    CALLED();
    NEED_INIT();
    return push_current(ctx);
}

EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx);
EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx)
{
    CALLED();
    NEED_INIT();
    return pop_current(pctx);
}

/* "This function will return '0' in both *leastPriority and
 * *greatestPriority if the current context's device does not support stream
 * priorities" (cuda.h), as the fake's devices do not
 * (CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED 0). Either pointer may be
 * NULL. */
EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    CALLED();
    NEED_INIT();
    fctx *c = current_ctx();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (least)
        *least = 0;
    if (greatest)
        *greatest = 0;
    return CUDA_SUCCESS;
}

/* "The Id is unique for the life of the program": a primary context made
 * again under its old handle gets a new one. */
EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id)
{
    CALLED();
    ENTER_API();
    fctx *c = ctx ? (fctx *)ctx : current_ctx();
    if (!id)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!c || c->magic != CTX_MAGIC)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    if (!c->alive)
        LEAVE(CUDA_ERROR_CONTEXT_IS_DESTROYED);
    *id = c->id;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxGetDevice(CUdevice *dev)
{
    CALLED();
    NEED_INIT();
    fctx *c = current_ctx();
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    *dev = c->dev;
    return CUDA_SUCCESS;
}

/* Peer access, from cuda.h: cuDeviceCanAccessPeer reports whether "contexts
 * on dev are capable of directly accessing memory from contexts on
 * peerDev" (here any two distinct devices; a device is not its own peer).
 * cuCtxEnablePeerAccess returns CUDA_ERROR_INVALID_CONTEXT "if there is no
 * current context, peerContext is not a valid context, or if the current
 * context is peerContext", CUDA_ERROR_INVALID_VALUE "if Flags is not 0",
 * CUDA_ERROR_PEER_ACCESS_UNSUPPORTED if cuDeviceCanAccessPeer says no (two
 * contexts of one device), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED "if
 * direct access of peerContext from the current context has already been
 * enabled", and CUDA_ERROR_TOO_MANY_PEERS when resources run out (here 64
 * pairs). cuCtxDisablePeerAccess returns CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
 * "if direct peer access has not yet been enabled". Memory is one host
 * address space here, so access itself is not enforced between devices
 * (cuMemSetAccess's peer entries are counted, see below). */
EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    CALLED();
    ENTER_API();
    if (!can)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!is_device(dev) || !is_device(peer))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    *can = dev != peer;
    LEAVE(CUDA_SUCCESS);
}

/* Lock held: the index of the pair (from, to), or npeers. */
static size_t peer_find(const fctx *from, const fctx *to)
{
    size_t i = 0;
    while (i < G.npeers && (G.peers[i].from != from || G.peers[i].to != to))
        i++;
    return i;
}

/* Lock held: context c goes, and every pair naming it. */
static void peers_forget(const fctx *c)
{
    for (size_t i = 0; i < G.npeers;)
        if (G.peers[i].from == c || G.peers[i].to == c)
            G.peers[i] = G.peers[--G.npeers];
        else
            i++;
}

static CUresult peer_switch(CUcontext peer, unsigned flags, bool on)
{
    ENTER_API();
    fctx *c = current_ctx(), *p = (fctx *)peer;
    if (!c || !p || p->magic != CTX_MAGIC || !p->alive || (on && p == c))
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    if (on && flags)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    size_t i = peer_find(c, p);
    if (!on) {
        if (i == G.npeers)
            LEAVE(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
        G.peers[i] = G.peers[--G.npeers];
        LEAVE(CUDA_SUCCESS);
    }
    if (p->dev == c->dev)
        LEAVE(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    if (i < G.npeers)
        LEAVE(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    if (G.npeers == sizeof G.peers / sizeof G.peers[0])
        LEAVE(CUDA_ERROR_TOO_MANY_PEERS);
    G.peers[G.npeers++] = (struct peer_pair){c, p};
    G.st.peer_enables++;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags)
{
    CALLED();
    return peer_switch(peer, flags, true);
}

EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peer)
{
    CALLED();
    return peer_switch(peer, 0, false);
}

EXPORT CUresult cuCtxSynchronize(void)
{
    CALLED();
    ENTER_API();
    fctx *c = current_ctx();
    if (!c)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    G.st.ctx_synchronize_calls++;
    pools_release_at_sync();
    const completion waited_for = {c, -1, true}; /* its green contexts too */
    /* Synchronising a context while one of the streams it waits for
     * captures is refused and invalidates those captures, whatever the
     * modes. cuda.h does not say so for cuCtxSynchronize; it does for the
     * other context-wide call, cuCtxRecordEvent ("will return
     * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED if the specified context hCtx
     * has a stream in the capture mode ... will invalidate all the
     * conflicting captures"), and the fake takes that harsher reading. */
    CUresult r = unsafe_call();
    for (fstream *o = G.streams; o; o = o->next)
        if (completing_ctx(o->ctx, &waited_for) && live_capture(o)) {
            invalidate_counted(o);
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    complete_where_and_unlock(&waited_for);
    release_after_sync();
    return CUDA_SUCCESS;
}

/* ---- streams and events ------------------------------------------------------ */

static CUresult create_stream(CUstream *ph, unsigned flags)
{
    ENTER_API();
    fctx *c = current_ctx();
    if (!ph)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    CUresult usable = ctx_usable(c);
    if (usable != CUDA_SUCCESS)
        LEAVE(usable);
    fstream *s = new_stream(c, flags, false);
    CUstream h = s ? stream_handle(s) : NULL;
    if (!h)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    *ph = h;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamCreate(CUstream *ph, unsigned int flags)
{
    CALLED();
    return create_stream(ph, flags);
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int priority)
{
    CALLED();
    (void)priority;
    return create_stream(ph, flags);
}

static CUresult stream_destroy(CUstream h)
{
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || s->legacy || s->per_thread)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    /* Returns at once: the queued work goes on and completes when the test
     * (or anything that waits for it) completes it, as on a GPU. */
    s->destroyed = true;
    stop_capturing(s);
    if (G.reuse_stream_handles) {
        stream_cell *cell = (stream_cell *)h;
        cell->next_free = G.free_cells;
        G.free_cells = cell;
    }
    LEAVE(CUDA_SUCCESS);
}

/* The test's work for after the next cuStreamDestroy
 * (ctl_after_next_stream_destroy). */
static _Atomic(fakecuda_work) after_destroy_work;
static void *_Atomic after_destroy_arg;

static CUresult stream_destroy_then_work(CUstream h)
{
    CUresult r = stream_destroy(h);
    fakecuda_work w = atomic_exchange(&after_destroy_work, NULL);
    if (w)
        w(atomic_load(&after_destroy_arg));
    return r;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream h)
{
    CALLED();
    return stream_destroy_then_work(h);
}

/* The v1 entry point (the top of this file). cuda.h documents only the
 * _v2's rules; whether the old one waited for the stream's work is not
 * said any more, and the fake takes the reading harder on a client that
 * keeps books of streams: the same, returning at once while the work goes
 * on. */
EXPORT CUresult cuStreamDestroy(CUstream h);
EXPORT CUresult cuStreamDestroy(CUstream h)
{
    CALLED();
    return stream_destroy_then_work(h);
}

/* cuda.h: the Id "is unique for the life of the program"; the special
 * handles (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) have one too. A
 * destroyed stream's handle is "undefined behavior" there; the fake answers
 * CUDA_ERROR_INVALID_HANDLE, a listed code, and counts the stale use. */
static CUresult stream_get_id(CUstream h, unsigned long long *id)
{
    ENTER_API();
    if (!id)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    fstream *s = stream_of(h);
    if (!s)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    if (!s->id)
        s->id = ++G.next_stream_id;
    *id = s->id;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamGetId(CUstream h, unsigned long long *id)
{
    CALLED();
    return stream_get_id(h, id);
}

EXPORT CUresult cuStreamGetId_ptsz(CUstream h, unsigned long long *id)
{
    CALLED();
    return stream_get_id(h ? h : CU_STREAM_PER_THREAD, id);
}

EXPORT CUresult cuStreamGetFlags(CUstream h, unsigned int *flags)
{
    CALLED();
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || !flags)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    *flags = s->flags;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamGetCtx(CUstream h, CUcontext *pctx)
{
    CALLED();
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || !pctx)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    *pctx = (CUcontext)s->ctx;
    LEAVE(CUDA_SUCCESS);
}

static CUresult stream_sync(CUstream h)
{
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    CUresult r = status_asked(s);
    if (r == CUDA_SUCCESS)
        r = unsafe_call();
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    G.st.stream_synchronize_calls++;
    pools_release_at_sync();
    complete_and_unlock(s);
    release_after_sync();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream h) { CALLED(); return stream_sync(h); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream h)
{
    CALLED();
    return stream_sync(h ? h : CU_STREAM_PER_THREAD);
}

EXPORT CUresult cuStreamQuery(CUstream h)
{
    CALLED();
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    CUresult r = status_asked(s);
    if (r == CUDA_SUCCESS)
        r = unsafe_call();
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    LEAVE(stream_done_to(s, s->submitted) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
}

static CUresult is_capturing(CUstream h, CUstreamCaptureStatus *status)
{
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || !status)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* "if this is called on CU_STREAM_LEGACY while a blocking stream in
     * the same context is capturing, it will return
     * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT" (not invalidating it) */
    if (s->legacy && blocking_capture_in(s->ctx))
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    *status = !s->capturing  ? CU_STREAM_CAPTURE_STATUS_NONE
              : s->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                               : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *st)
{
    CALLED();
    return is_capturing(h, st);
}
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus *st)
{
    CALLED();
    return is_capturing(h ? h : CU_STREAM_PER_THREAD, st);
}

/* Lock held: a new graph. */
static fgraph *graph_new(void)
{
    fgraph *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    *g = (fgraph){.magic = GRAPH_MAGIC, .next = G.graphs};
    G.graphs = g;
    return g;
}

/* Lock held: the live graph a handle names, or NULL (stale handles
 * counted). */
static fgraph *graph_of(CUgraph h)
{
    fgraph *g = (fgraph *)h;
    if (!g || g->magic != GRAPH_MAGIC)
        return NULL;
    if (g->destroyed) {
        count_stale_use_of("graph", NULL, "destroyed");
        return NULL;
    }
    return g;
}

EXPORT CUresult cuGraphCreate(CUgraph *out, unsigned int flags)
{
    CALLED();
    ENTER_API();
    if (!out || flags != 0) /* "flags - Graph creation flags, must be 0" */
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    fgraph *g = graph_new();
    if (!g)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    *out = (CUgraph)g;
    LEAVE(CUDA_SUCCESS);
}

/* cuda.h lists CUDA_ERROR_INVALID_VALUE for a graph it cannot destroy. */
EXPORT CUresult cuGraphDestroy(CUgraph h)
{
    CALLED();
    ENTER_API();
    fgraph *g = graph_of(h);
    if (!g)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    g->destroyed = true;
    LEAVE(CUDA_SUCCESS);
}

/* cuStreamGetCaptureInfo, all three versions (CUDA 10.1's status and id;
 * 11.3's graph and dependencies; 12.3's edge data). cuda.h: the status is
 * required; the rest is "valid data ... only if the call returns
 * CUDA_SUCCESS [and] the returned capture status is
 * CU_STREAM_CAPTURE_STATUS_ACTIVE", so for a stream that does not capture,
 * or whose capture was invalidated, the fake writes nothing else (a caller
 * that reads an id then reads what it left there). The id is "an id for
 * the capture sequence, which is unique over the lifetime of the process":
 * the fake's sequence number, the same on the origin and every stream that
 * joined it (one sequence). The graph is the one being captured into: the
 * program's (cuStreamBeginCaptureToGraph), else one made now and handed
 * over at the end. The fake's graphs have no nodes, so the dependency set
 * is empty (and no edge data: never CUDA_ERROR_LOSSY_QUERY). On the legacy
 * stream while a blocking stream captures: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
 * as cuStreamIsCapturing (neither invalidates). */
static CUresult capture_info(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id,
                             CUgraph *graph, const CUgraphNode **deps,
                             const CUgraphEdgeData **edges, size_t *ndeps)
{
    ENTER_API();
    fstream *s = stream_of(h);
    /* "If edgeData_out is non-NULL then dependencies_out must be as well" */
    if (!s || !st || (edges && !deps))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (s->legacy && blocking_capture_in(s->ctx))
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    *st = !s->capturing  ? CU_STREAM_CAPTURE_STATUS_NONE
          : s->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                           : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (*st != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        LEAVE(CUDA_SUCCESS);
    if (id)
        *id = s->capture_seq;
    fstream *origin = s->capture_origin;
    if (graph && !origin->capture_graph) {
        origin->capture_graph = graph_new();
        if (!origin->capture_graph)
            LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        origin->capture_graph_own = true;
    }
    if (graph)
        *graph = (CUgraph)origin->capture_graph;
    if (deps)
        *deps = NULL;
    if (edges)
        *edges = NULL;
    if (ndeps)
        *ndeps = 0;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamGetCaptureInfo(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id)
{
    CALLED();
    return capture_info(h, st, id, NULL, NULL, NULL, NULL);
}
EXPORT CUresult cuStreamGetCaptureInfo_ptsz(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id)
{
    CALLED();
    return capture_info(h ? h : CU_STREAM_PER_THREAD, st, id, NULL, NULL, NULL, NULL);
}
EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id,
                                          CUgraph *graph, const CUgraphNode **deps,
                                          size_t *ndeps)
{
    CALLED();
    return capture_info(h, st, id, graph, deps, NULL, ndeps);
}
EXPORT CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream h, CUstreamCaptureStatus *st,
                                               cuuint64_t *id, CUgraph *graph,
                                               const CUgraphNode **deps, size_t *ndeps)
{
    CALLED();
    return capture_info(h ? h : CU_STREAM_PER_THREAD, st, id, graph, deps, NULL, ndeps);
}
EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id,
                                          CUgraph *graph, const CUgraphNode **deps,
                                          const CUgraphEdgeData **edges, size_t *ndeps)
{
    CALLED();
    return capture_info(h, st, id, graph, deps, edges, ndeps);
}
EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus *st,
                                               cuuint64_t *id, CUgraph *graph,
                                               const CUgraphNode **deps,
                                               const CUgraphEdgeData **edges, size_t *ndeps)
{
    CALLED();
    return capture_info(h ? h : CU_STREAM_PER_THREAD, st, id, graph, deps, edges, ndeps);
}

/* Lock held (LEAVE releases it): both begins; into_graph is
 * cuStreamBeginCaptureToGraph's graph, or NULL. A mode outside the enum is
 * refused (both calls list CUDA_ERROR_INVALID_VALUE). */
static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, fgraph *into_graph)
{
    fstream *s = stream_of(h);
    if (mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!s || s->legacy) /* the legacy stream cannot be captured */
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    if (s->capturing)
        LEAVE(CUDA_ERROR_ILLEGAL_STATE);
    s->capturing = true;
    s->invalidated = false;
    s->capture_mode = mode;
    s->capture_thread = this_thread();
    s->capture_graph = into_graph;
    s->capture_graph_own = false;
    s->capture_seq = ++G.next_capture_seq;
    s->capture_origin = s;
    s->join_into = NULL;
    s->cap_work = s->join_work = s->join_seq = s->join_into_seq = 0;
    LEAVE(CUDA_SUCCESS);
}

static CUresult begin_plain(CUstream h, CUstreamCaptureMode mode)
{
    ENTER_API();
    return begin_capture(h, mode, NULL);
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode)
{
    CALLED();
    return begin_plain(h, mode);
}
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode)
{
    CALLED();
    return begin_plain(h ? h : CU_STREAM_PER_THREAD, mode);
}

/* CUDA 10.0's begin, before capture modes (cudaTypedefs.h's
 * PFN_cuStreamBeginCapture_v10000): libcuda still exports it for old
 * binaries and cuGetProcAddress hands it out below 10010. It captures in
 * the mode every capture had then, the default: global. Exported under its
 * own names; cuda.h makes cuStreamBeginCapture a macro for _v2. */
CUresult cuStreamBeginCapture_v1(CUstream h) __asm__("cuStreamBeginCapture");
CUresult cuStreamBeginCapture_v1_ptsz(CUstream h) __asm__("cuStreamBeginCapture_ptsz");
EXPORT CUresult cuStreamBeginCapture_v1(CUstream h)
{
    CALLED_AS("cuStreamBeginCapture");
    return begin_plain(h, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
EXPORT CUresult cuStreamBeginCapture_v1_ptsz(CUstream h)
{
    CALLED_AS("cuStreamBeginCapture_ptsz");
    return begin_plain(h ? h : CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

/* "dependencies - ... Can be NULL if numDependencies is 0"; the fake's
 * graphs have no nodes, so any named dependency is one it cannot check and
 * is taken as given. */
static CUresult begin_to_graph(CUstream h, CUgraph hg, const CUgraphNode *deps, size_t ndeps,
                               CUstreamCaptureMode mode)
{
    ENTER_API();
    fgraph *g = graph_of(hg);
    if (!g || (ndeps && !deps))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    return begin_capture(h, mode, g);
}

EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream h, CUgraph g, const CUgraphNode *deps,
                                            const CUgraphEdgeData *edges, size_t n,
                                            CUstreamCaptureMode mode)
{
    CALLED();
    (void)edges;
    return begin_to_graph(h, g, deps, n, mode);
}
EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream h, CUgraph g, const CUgraphNode *deps,
                                                 const CUgraphEdgeData *edges, size_t n,
                                                 CUstreamCaptureMode mode)
{
    CALLED();
    (void)edges;
    return begin_to_graph(h ? h : CU_STREAM_PER_THREAD, g, deps, n, mode);
}

/* Is fork o (a stream of origin's capture) joined back into the origin? It
 * added no node of its own, or none since the record of an event that
 * another stream of the capture waited on, and that stream is the origin
 * or joined after the wait, and so on to the origin. Each hop leaves a
 * stream of the capture, so a chain longer than the streams there is a
 * cycle of waits, which joins nothing. */
static bool fork_joined(const fstream *o, const fstream *origin)
{
    if (o->cap_work == 0)
        return true;
    if (o->join_work != o->cap_work)
        return false;
    size_t streams = 0;
    for (const fstream *x = G.streams; x; x = x->next)
        streams += live_capture(x) && x->capture_seq == origin->capture_seq;
    for (size_t hops = 0; o != origin; hops++) {
        const fstream *into = o->join_into;
        if (hops > streams || !into || (into != origin && o->join_into_seq > into->join_seq))
            return false;
        o = into;
    }
    return true;
}

/* "cuStreamEndCapture must still be called in the same stream where
 * cuStreamBeginCapture was called; this is the origin stream", and every
 * other stream of the capture "must also be joined back to the origin
 * stream"; all of them leave capture mode at the end, and an unjoined fork
 * fails "the overall capture operation" (the programming guide's
 * cross-stream dependencies; cuda.h: CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
 * "the capture was not initiated in this stream", and _UNJOINED, "the
 * capture sequence contains a fork that was not joined to the primary
 * stream"). A fork's end is refused and changes nothing. */
static CUresult end_capture(CUstream h, CUgraph *graph)
{
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || !s->capturing)
        LEAVE(CUDA_ERROR_ILLEGAL_STATE);
    if (s->capture_origin != s)
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    /* "If mode is not CU_STREAM_CAPTURE_MODE_RELAXED, cuStreamEndCapture
     * must be called on this stream from the same thread." */
    if (s->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED && s->capture_thread != this_thread())
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    bool unjoined = false;
    for (fstream *o = G.streams; o; o = o->next)
        if (o != s && live_capture(o) && o->capture_seq == s->capture_seq && !fork_joined(o, s))
            unjoined = true;
    const bool invalidated = s->invalidated;
    end_capture_sequence(s->capture_seq);
    /* "If capture was invalidated ... then a NULL graph will be returned";
     * a capture into an existing graph returns that graph. */
    fgraph *g = invalidated || unjoined ? NULL : s->capture_graph ? s->capture_graph : graph_new();
    /* A graph made for cuStreamGetCaptureInfo goes with a failed capture
     * ("the graph handle may be invalidated before end of capture for
     * certain errors"). */
    if (!g && s->capture_graph_own)
        s->capture_graph->destroyed = true;
    s->capture_graph = NULL;
    s->capture_graph_own = false;
    if (graph)
        *graph = (CUgraph)g;
    LEAVE(invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
          : unjoined  ? CUDA_ERROR_STREAM_CAPTURE_UNJOINED
                      : CUDA_SUCCESS);
}

EXPORT CUresult cuStreamEndCapture(CUstream h, CUgraph *g) { CALLED(); return end_capture(h, g); }
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream h, CUgraph *g)
{
    CALLED();
    return end_capture(h ? h : CU_STREAM_PER_THREAD, g);
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    CALLED();
    NEED_INIT();
    if (!mode || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = tls_capture_mode;
    tls_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

static bool event_done(const fevent *e);

/* Lock held: h waits on e, last recorded in a capture still under way: "a
 * captured event represents a set of nodes in a capture graph. When a
 * captured event is waited on by a stream, it places the stream in capture
 * mode if it is not already" (the programming guide's cross-stream
 * dependencies): s joins the capture as a fork, in the origin's mode and
 * thread, and what it queues from now on is the graph's, not run; the
 * event's stream is joined into s as far as the record. The legacy stream
 * cannot join a capture (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "a disallowed
 * implicit dependency on a current capture sequence from cudaStreamLegacy",
 * and the capture is invalidated, as legacy work on a capturing blocking
 * stream does), nor can a stream of another capture
 * (CUDA_ERROR_STREAM_CAPTURE_MERGE, "a merge of two independent capture
 * sequences"): both the fake's reading of cuda.h's codes. */
static CUresult wait_on_capture(fstream *s, fevent *e)
{
    fstream *origin = e->capture_origin;
    if (s->legacy) {
        invalidate_counted(origin);
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    }
    if (live_capture(s) && s->capture_seq != e->capture_seq)
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_MERGE);
    if (!live_capture(s)) {
        s->capturing = true;
        s->invalidated = origin->invalidated;
        s->capture_mode = origin->capture_mode;
        s->capture_thread = origin->capture_thread;
        s->capture_graph = NULL;
        s->capture_seq = e->capture_seq;
        s->capture_origin = origin;
        s->join_into = NULL;
        s->cap_work = s->join_work = s->join_seq = s->join_into_seq = 0;
        G.st.capture_forks++;
    }
    submit(s, NULL, NULL); /* the wait: a node of the graph */
    fstream *from = e->rec_stream;
    if (from != s && live_capture(from) && from->capture_seq == s->capture_seq) {
        from->join_into = s;
        from->join_work = e->rec_work;
        from->join_seq = e->rec_seq;
        from->join_into_seq = s->submitted;
    }
    LEAVE(CUDA_SUCCESS);
}

/* "Makes all future work submitted to hStream wait for all work captured in
 * hEvent" (cuda.h): the work the event's last record covers, on whatever
 * streams, completes before anything submitted to hStream after this call.
 * An event never recorded, or one whose work is done, adds nothing; on a
 * capturing stream the wait is the graph's, not the stream's. An event last
 * recorded in a capture under way makes the stream join it
 * (wait_on_capture); one recorded in a capture that has ended adds
 * nothing.
 *
 * A capturing stream may not wait on work that was queued rather than
 * captured: "It is invalid to wait on a non-captured event from a stream
 * which is being captured without specifying the cudaEventWaitExternal
 * flag" (the programming guide, "Prohibited and Unhandled Operations"),
 * and an invalid operation invalidates the capture. The code is
 * CUDA_ERROR_STREAM_CAPTURE_ISOLATION ("a dependency would have been
 * created which crosses the capture sequence boundary"): the fake's reading
 * of cuda.h's codes. With CU_EVENT_WAIT_EXTERNAL the wait is a node of the
 * graph ("captured in the graph as an external event node"); outside a
 * capture that flag "is invalid" (CUDA_ERROR_INVALID_VALUE, as for a flag
 * cuda.h does not name). An event never recorded carries no work, so
 * waiting on it crosses nothing (the fake's reading). */
EXPORT CUresult cuStreamWaitEvent(CUstream h, CUevent ev, unsigned int flags)
{
    CALLED();
    ENTER_API();
    fstream *s = stream_of(h);
    fevent *e = event_of(ev);
    if (!s || !e)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    const bool external = flags & CU_EVENT_WAIT_EXTERNAL;
    if ((flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL) || (external && !live_capture(s)))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* Neither a stream of an invalidated capture nor an event recorded in
     * one may be used (capture_usable): no stream joins such a capture. */
    const fstream *joined = live_capture_of(e);
    CUresult usable = capture_usable(s);
    if (usable == CUDA_SUCCESS && joined)
        usable = capture_usable(joined);
    if (usable != CUDA_SUCCESS)
        LEAVE(usable);
    if (external) {
        submit(s, NULL, NULL); /* the external wait: a node of the graph */
        LEAVE(CUDA_SUCCESS);
    }
    if (live_capture_of(e))
        return wait_on_capture(s, e);
    if (live_capture(s) && e->recorded && !e->captured) {
        invalidate_counted(s);
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    }
    CUresult r = legacy_use(s);
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    uint64_t seq = submit(s, NULL, NULL);
    if (e->recorded && !e->captured && !s->capturing && !event_done(e)) {
        work_item w = {.seq = seq, .waits = malloc(e->ndeps * sizeof(dep))};
        for (size_t i = 0; i < e->ndeps; i++)
            if (e->deps[i].s->completed < e->deps[i].seq)
                w.waits[w.nwaits++] = e->deps[i];
        enqueue(s, w);
    }
    LEAVE(CUDA_SUCCESS);
}

/* "CU_EVENT_INTERPROCESS must be specified along with
 * CU_EVENT_DISABLE_TIMING"; no other flag is valid (cuEventCreate, cuda.h). */
EXPORT CUresult cuEventCreate(CUevent *ph, unsigned int flags)
{
    CALLED();
    ENTER_API();
    fctx *c = current_ctx();
    const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (!ph || (flags & ~known) ||
        ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    CUresult usable = ctx_usable(c);
    if (usable != CUDA_SUCCESS)
        LEAVE(usable);
    fevent *e = G.free_events;
    if (e) {
        /* FAKECUDA_REUSE_EVENT_HANDLES: the most recently dead event's handle
         * names a fresh event (never recorded, of context c); it stays in the
         * list of all events, and its dependency table is kept for reuse. */
        G.free_events = e->next_free;
        *e = (fevent){.magic = EVENT_MAGIC, .ctx = c, .flags = flags, .next = e->next,
                      .deps = e->deps, .capdeps = e->capdeps};
    } else {
        if (!(e = calloc(1, sizeof *e)))
            LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        e->magic = EVENT_MAGIC;
        e->ctx = c;
        e->flags = flags;
        e->next = G.events;
        G.events = e;
    }
    *ph = (CUevent)e;
    LEAVE(CUDA_SUCCESS);
}

/* Lock held: live event e dies (cuEventDestroy, or its context's end). Its
 * handle stays recognised as stale, unless FAKECUDA_REUSE_EVENT_HANDLES is
 * set: then the next cuEventCreate may hand it out again (the most recently
 * dead first), as the real driver may, since it promises nothing about
 * handle values; a late use of it then reaches the new event, uncounted. */
static void event_dies(fevent *e)
{
    e->dead = true;
    if (G.reuse_event_handles) {
        e->next_free = G.free_events;
        G.free_events = e;
    }
}

EXPORT CUresult cuEventDestroy_v2(CUevent h)
{
    CALLED();
    ENTER_API();
    fevent *e = event_of(h);
    if (!e)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    /* Kept in the list (other events' records never point at it), only
     * marked: a later use is a stale handle (or, with
     * FAKECUDA_REUSE_EVENT_HANDLES, reaches the next event made). */
    e->destroyed = true;
    event_dies(e);
    LEAVE(CUDA_SUCCESS);
}

/* Lock held: e completes once s has completed its first `seq` operations.
 * Grows without a limit: an event on the legacy stream waits for every
 * blocking stream, and a program may have any number (a fixed table that
 * dropped the rest would let the event complete before work it must wait
 * for, and the shim's fences with it). */
static void event_add_dep(fevent *e, fstream *s, uint64_t seq)
{
    if (e->ndeps == e->capdeps) {
        e->capdeps = e->capdeps ? 2 * e->capdeps : 8;
        e->deps = realloc(e->deps, e->capdeps * sizeof *e->deps);
        if (!e->deps) {
            fprintf(stderr, "fake libcuda: out of memory for an event's dependencies\n");
            abort();
        }
    }
    e->deps[e->ndeps++] = (dep){s, seq};
}

static CUresult event_record(CUevent h, CUstream sh)
{
    ENTER_API();
    fevent *e = event_of(h);
    fstream *s = stream_of(sh);
    if (!e || !s)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    /* "hEvent and hStream must be from the same context otherwise
     * CUDA_ERROR_INVALID_HANDLE is returned" (cuEventRecord, cuda.h) */
    if (e->ctx != s->ctx)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    CUresult r = legacy_use(s);
    if (r == CUDA_SUCCESS)
        r = capture_usable(s);
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    G.st.event_records++;
    e->recorded = true;
    e->recorded_ns = now_ns();
    e->captured = s->capturing;
    e->capture_seq = s->capturing ? s->capture_seq : 0;
    e->capture_origin = s->capturing ? s->capture_origin : NULL;
    e->rec_stream = s;
    e->rec_work = s->cap_work;
    e->rec_seq = s->submitted;
    e->ndeps = 0;
    /* Complete once the work submitted before it is: an event on an idle
     * stream is complete at once, as on an idle GPU. The record is an
     * operation like any other: on the legacy stream it also waits for
     * every blocking stream (destroyed ones too: their queued work goes on),
     * on a blocking one for the legacy stream (implicit_deps). Those are
     * the event's own dependencies, not a wait item, so that it completes
     * only once their callbacks have run too (stream_done_to). */
    event_add_dep(e, s, s->submitted);
    size_t n;
    dep *implicit = implicit_deps(s, &n);
    for (size_t i = 0; i < n; i++)
        event_add_dep(e, implicit[i].s, implicit[i].seq);
    free(implicit);
    maybe_autocomplete_and_unlock(s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent h, CUstream s) { CALLED(); return event_record(h, s); }
EXPORT CUresult cuEventRecord_ptsz(CUevent h, CUstream s)
{
    CALLED();
    return event_record(h, s ? s : CU_STREAM_PER_THREAD);
}

/* Lock held. */
static bool event_done(const fevent *e)
{
    for (size_t i = 0; i < e->ndeps; i++)
        if (!stream_done_to(e->deps[i].s, e->deps[i].seq))
            return false;
    return true;
}

/* The test's work for the next cuEventQuery (ctl_before_next_event_query). */
static _Atomic(fakecuda_work) next_query_work;
static void *_Atomic next_query_arg;

EXPORT CUresult cuEventQuery(CUevent h)
{
    CALLED();
    /* Taken by one query alone, and run before the driver's lock: the work
     * may make other threads call the driver (begin a capture) and wait
     * for them. */
    fakecuda_work w = atomic_exchange(&next_query_work, NULL);
    if (w)
        w(atomic_load(&next_query_arg));
    ENTER_API();
    fevent *e = event_of(h);
    if (!e)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    if (e->captured)
        LEAVE(captured_event_asked(e));
    CUresult r = unsafe_call();
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    G.st.event_queries++;
    LEAVE(!e->recorded || event_done(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
}

/*
 * cuda.h: "If cuEventRecord() has not been called on either event then
 * CUDA_ERROR_INVALID_HANDLE is returned. If cuEventRecord() has been called
 * on both events but one or both of them has not yet been completed (that
 * is, cuEventQuery() would return CUDA_ERROR_NOT_READY on at least one of
 * the events), CUDA_ERROR_NOT_READY is returned. If either event was created
 * with the CU_EVENT_DISABLE_TIMING flag, then this function will return
 * CUDA_ERROR_INVALID_HANDLE." The fake's GPU takes no time to run work, so
 * the time between two events is the host time between their records; an
 * event recorded in a capture has no time (CUDA_ERROR_INVALID_HANDLE, the
 * listed code nearest "not a recorded event"). _v2 (CUDA 12.8) answers as
 * the first version here: they differ in what the GPU measures, not in the
 * rules above.
 */
static CUresult elapsed_time(float *ms, CUevent start, CUevent end)
{
    ENTER_API();
    fevent *a = event_of(start), *b = event_of(end);
    if (!a || !b)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    if (!ms)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!a->recorded || !b->recorded || a->captured || b->captured ||
        ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING))
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    if (!event_done(a) || !event_done(b))
        LEAVE(CUDA_ERROR_NOT_READY);
    /* "a resolution of around 0.5 microseconds" */
    const double us = ((double)b->recorded_ns - (double)a->recorded_ns) / 1000.0;
    *ms = (float)((double)(int64_t)(us * 2.0) / 2000.0);
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end)
{
    CALLED();
    return elapsed_time(ms, start, end);
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    CALLED();
    return elapsed_time(ms, start, end);
}

EXPORT CUresult cuEventSynchronize(CUevent h)
{
    CALLED();
    ENTER_API();
    fevent *e = event_of(h);
    if (!e)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    if (e->captured)
        LEAVE(captured_event_asked(e));
    CUresult r = unsafe_call();
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    G.st.event_synchronize_calls++;
    pools_release_at_sync();
    /* The host waits: the GPU catches up to everything the event needs,
     * and behind work that never ends, the host waits for good. */
    work_item *all = NULL;
    size_t nall = 0;
    for (size_t i = 0; i < e->ndeps; i++)
        gather(e->deps[i].s, e->deps[i].seq, &all, &nall);
    unlock_and_run(all, nall);
    pthread_mutex_lock(&G.lock);
    while (!event_done(e))
        pthread_cond_wait(&G.stuck_cond, &G.lock);
    pools_release_at_sync(); /* the frees the wait reached too */
    pthread_mutex_unlock(&G.lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void *data)
{
    CALLED();
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || !fn)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    CUresult r = legacy_use(s);
    if (r == CUDA_SUCCESS)
        r = capture_usable(s);
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    if (!captured_instead(s)) /* (captured: a host node of the graph) */
        submit(s, (fakecuda_work)fn, data);
    maybe_autocomplete_and_unlock(s);
    return CUDA_SUCCESS;
}

/* ---- green contexts ----------------------------------------------------------- */

/*
 * What cuda.h says, and the fake does:
 * - cuDeviceGetDevResource gives the device's SM resource (SM_COUNT SMs);
 *   cuDevResourceGenerateDesc makes a descriptor of SM resources.
 * - cuGreenCtxCreate requires CU_GREEN_CTX_DEFAULT_STREAM and "will retain
 *   the primary context on device dev, which will is released when the
 *   green context is destroyed"; it does not make the green context current.
 * - cuCtxFromGreenCtx gives its converted context: a context of its own
 *   handle, whose legacy stream is the green context's default stream, and
 *   which shares the primary context's memory (do_alloc).
 * - cuGreenCtxStreamCreate requires CU_STREAM_NON_BLOCKING and "ignores the
 *   context that is current"; cuStreamGetCtx of such a stream is the
 *   converted context, cuStreamGetCtx_v2 the primary one and the green one.
 * - cuEventRecord needs the event and the stream "from the same context": an
 *   event made in the primary context is refused on a green context's
 *   stream (the harsher of the two readings). cuGreenCtxRecordEvent takes an
 *   event of "the same primary context" (the primary or a green context of
 *   the device) and captures "all the activities of the green context": its
 *   default stream's and its live streams' work. A destroyed stream's queued
 *   work is left out (cuda.h does not say it is an activity of the green
 *   context any more: the harsher reading). While a stream of it captures
 *   it answers CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates those
 *   captures.
 * - cuGreenCtxDestroy: its streams are not destroyed, but "any subsequent API
 *   calls involving these streams (including cuStreamDestroy) will return
 *   CUDA_ERROR_CONTEXT_IS_DESTROYED". cuda.h does not say that the call waits
 *   for the green context's work: here it does not (the harsher reading),
 *   and that work completes later, as a destroyed stream's does.
 */

/* Lock held: the green context a handle names, or NULL. */
static fgreen *green_of(CUgreenCtx h)
{
    fgreen *g = (fgreen *)h;
    return g && g->magic == GREEN_MAGIC ? g : NULL;
}

/* Only SM resources are modelled; another type is
 * CUDA_ERROR_INVALID_RESOURCE_TYPE, in cuda.h's list for the call. The
 * partition size and alignment are not a device's measured values (the GPU
 * suite's green-stream prints an H100's): they keep cuda.h's rule that
 * "smCount is a multiple of" smCoscheduledAlignment. */
EXPORT CUresult cuDeviceGetDevResource(CUdevice dev, CUdevResource *res, CUdevResourceType type)
{
    CALLED();
    NEED_INIT();
    if (!res)
        return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_DEV_RESOURCE_TYPE_SM)
        return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    if (!is_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    memset(res, 0, sizeof *res);
    res->type = CU_DEV_RESOURCE_TYPE_SM;
    res->sm.smCount = SM_COUNT;
    res->sm.minSmPartitionSize = 2;
    res->sm.smCoscheduledAlignment = 2;
    return CUDA_SUCCESS;
}

/* Several SM resources "must be outputs ... from the same split API
 * instance, otherwise CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION is returned"
 * (cuda.h): the fake has no split (cuDevSmResourceSplitByCount), so a
 * descriptor holds one resource. */
EXPORT CUresult cuDevResourceGenerateDesc(CUdevResourceDesc *desc, CUdevResource *res,
                                          unsigned int n)
{
    CALLED();
    NEED_INIT();
    if (!desc || !res || n == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (res[0].type != CU_DEV_RESOURCE_TYPE_SM)
        return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    if (res[0].sm.smCount == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (n > 1)
        return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    struct CUdevResourceDesc_st *d = calloc(1, sizeof *d);
    if (!d)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *d = (struct CUdevResourceDesc_st){DESC_MAGIC, res[0].sm.smCount};
    *desc = d;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *ph, CUdevResourceDesc desc, CUdevice dev,
                                 unsigned int flags)
{
    CALLED();
    ENTER_API();
    if (!ph || !desc || desc->magic != DESC_MAGIC || !(flags & CU_GREEN_CTX_DEFAULT_STREAM) ||
        desc->sm_count > SM_COUNT)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    fgreen *g = calloc(1, sizeof *g);
    if (!g)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    G.primary[dev].refcount++;
    if (!G.primary[dev].alive)
        G.primary[dev].id = ++G.next_ctx_id;
    G.primary[dev].alive = true;
    *g = (fgreen){.magic = GREEN_MAGIC, .dev = dev, .sm_count = desc->sm_count, .next = G.greens};
    live_ctx(&g->ctx, dev, g);
    G.greens = g;
    *ph = (CUgreenCtx)g;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx h)
{
    CALLED();
    ENTER_API();
    fgreen *g = green_of(h);
    if (!g)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    if (!g->ctx.alive)
        LEAVE(CUDA_ERROR_CONTEXT_IS_DESTROYED);
    /* Handles die; queued work goes on (see above). */
    g->ctx.alive = false;
    for (fstream *s = G.streams; s; s = s->next)
        if (s->ctx == &g->ctx) {
            s->destroyed = true;
            stop_capturing(s);
        }
    if (G.primary[g->dev].refcount > 0 && --G.primary[g->dev].refcount == 0)
        kill_ctx(&G.primary[g->dev]);
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxFromGreenCtx(CUcontext *pctx, CUgreenCtx h)
{
    CALLED();
    ENTER_API();
    if (!pctx)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    fgreen *g = green_of(h);
    if (!g || !g->ctx.alive)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    *pctx = (CUcontext)&g->ctx;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuGreenCtxStreamCreate(CUstream *ph, CUgreenCtx h, unsigned int flags,
                                       int priority)
{
    CALLED();
    (void)priority;
    ENTER_API();
    if (!ph || !(flags & CU_STREAM_NON_BLOCKING))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    fgreen *g = green_of(h);
    if (!g || !g->ctx.alive)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    fstream *s = new_stream(&g->ctx, flags, false);
    CUstream made = s ? stream_handle(s) : NULL;
    if (!made)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    *ph = made;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamGetGreenCtx(CUstream h, CUgreenCtx *pg)
{
    CALLED();
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || !pg)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    *pg = (CUgreenCtx)s->ctx->green;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamGetCtx_v2(CUstream h, CUcontext *pctx, CUgreenCtx *pg)
{
    CALLED();
    ENTER_API();
    fstream *s = stream_of(h);
    if (!s || !pctx || !pg)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    fctx *c = s->ctx;
    *pctx = (CUcontext)(c->green ? &G.primary[c->dev] : c);
    *pg = (CUgreenCtx)c->green;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuGreenCtxRecordEvent(CUgreenCtx h, CUevent ev)
{
    CALLED();
    ENTER_API();
    fgreen *g = green_of(h);
    if (!g || !g->ctx.alive)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    fevent *e = event_of(ev);
    /* "hEvent and hCtx must be from the same primary context" */
    if (!e || e->ctx->dev != g->dev || !(e->ctx->primary || e->ctx->green))
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    CUresult r = CUDA_SUCCESS;
    for (fstream *o = G.streams; o; o = o->next)
        if (o->ctx == &g->ctx && live_capture(o)) {
            invalidate_counted(o);
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    G.st.event_records++;
    e->recorded = true;
    e->recorded_ns = now_ns();
    e->captured = false;
    e->ndeps = 0;
    event_add_dep(e, &g->ctx.legacy, g->ctx.legacy.submitted);
    /* Every live stream of the green context (see above). */
    for (fstream *o = G.streams; o; o = o->next)
        if (o->ctx == &g->ctx && !o->dead && !o->destroyed)
            event_add_dep(e, o, o->submitted);
    if (G.autocomplete)
        complete_everything_and_unlock(&g->ctx);
    else
        pthread_mutex_unlock(&G.lock);
    return CUDA_SUCCESS;
}

/* ---- memory ---------------------------------------------------------------------- */

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
    if (a && !a->stream_ordered) {
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
    return alloc_async(d, n, NULL, s ? s : CU_STREAM_PER_THREAD);
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr d, CUstream s) { CALLED(); return free_async(d, s); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s)
{
    CALLED();
    return free_async(d, s ? s : CU_STREAM_PER_THREAD);
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
    CALLED();
    return alloc_async(d, n, p, s);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
    CALLED();
    return alloc_async(d, n, p, s ? s : CU_STREAM_PER_THREAD);
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
static host_allocation *find_host_alloc(uint64_t addr, bool interior)
{
    for (size_t i = 0; i < G.nhost_allocs; i++) {
        host_allocation *h = &G.host_allocs[i];
        if (addr == h->base || (interior && addr - h->base < h->size))
            return h;
    }
    return NULL;
}

/* Lock held: forgets host allocation h and gives its memory back. */
static void host_free(host_allocation *h)
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

static bool vmm_mapping_range(CUdeviceptr ptr, CUdeviceptr *base, size_t *size);

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

static bool vmm_reserved(CUdeviceptr ptr);
static CUresult vmm_pointer_attribute(CUdeviceptr ptr, CUpointer_attribute attr, void *data);

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

static bool vmm_mapped_on(CUdeviceptr p, size_t n, int dev);

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
    CUresult r = legacy_use(s);
    if (r == CUDA_SUCCESS)
        r = capture_usable(s);
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
    return copy_on((void *)(uintptr_t)d, s, n, st ? st : CU_STREAM_PER_THREAD, false);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *d, CUdeviceptr s, size_t n, CUstream st)
{
    CALLED();
    return copy_on(d, (const void *)(uintptr_t)s, n, st ? st : CU_STREAM_PER_THREAD, false);
}
EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
    CALLED();
    return copy_on((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n,
                   st ? st : CU_STREAM_PER_THREAD, false);
}
EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
    CALLED();
    return copy_on((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n,
                   st ? st : CU_STREAM_PER_THREAD, false);
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
    return copy_peer(dst, dst_ctx, src, src_ctx, n, h ? h : CU_STREAM_PER_THREAD, false);
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
    CUresult r = legacy_use(s);
    if (r == CUDA_SUCCESS)
        r = capture_usable(s);
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
    return write_value64(h ? h : CU_STREAM_PER_THREAD, addr, value, flags);
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
    CUresult r = legacy_use(s);
    if (r == CUDA_SUCCESS)
        r = capture_usable(s);
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
    return memset_on(h ? h : CU_STREAM_PER_THREAD, d, v, 1, n, 0, 1, false);
}
EXPORT CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream h)
{
    CALLED();
    return memset_on(h, d, v, 2, n, 0, 1, false);
}
EXPORT CUresult cuMemsetD16Async_ptsz(CUdeviceptr d, unsigned short v, size_t n, CUstream h)
{
    CALLED();
    return memset_on(h ? h : CU_STREAM_PER_THREAD, d, v, 2, n, 0, 1, false);
}
EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream h)
{
    CALLED();
    return memset_on(h, d, v, 4, n, 0, 1, false);
}
EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int v, size_t n, CUstream h)
{
    CALLED();
    return memset_on(h ? h : CU_STREAM_PER_THREAD, d, v, 4, n, 0, 1, false);
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
    return memset_on(h ? h : CU_STREAM_PER_THREAD, d, v, 1, n, pitch, rows, false);
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
    return memset_on(h ? h : CU_STREAM_PER_THREAD, d, v, 2, n, pitch, rows, false);
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
    return memset_on(h ? h : CU_STREAM_PER_THREAD, d, v, 4, n, pitch, rows, false);
}

static CUresult error_string(CUresult e, const char **s)
{
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    *s = e == CUDA_SUCCESS ? "no error"
         : e == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory"
         : e == CUDA_ERROR_INVALID_VALUE ? "invalid argument"
                                         : "fake driver error";
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult e, const char **s) { CALLED(); return error_string(e, s); }

EXPORT CUresult cuGetErrorName(CUresult e, const char **s) { CALLED(); return error_string(e, s); }

/* cuGetExportTable hands a CUDA runtime the driver's private tables, whose
 * layout is not published: the fake has none to give. The fake libcudart
 * never asks; a real runtime does, first thing: one linked into the
 * program statically (nvcc's default) or a real libcudart.so loaded in
 * place of the fake's. All its calls then fail with 801, which says
 * nothing of why, so the first request says it, once, naming the file the
 * caller lives in (the program itself when the runtime is linked in). */
EXPORT CUresult cuGetExportTable(const void **table, const CUuuid *id)
{
    CALLED();
    (void)table, (void)id;
    static atomic_bool said;
    if (!atomic_exchange(&said, true)) {
        Dl_info info;
        const void *caller = __builtin_return_address(0);
        const char *who = dladdr(caller, &info) && info.dli_fname && *info.dli_fname
                              ? info.dli_fname
                              : "the program";
        const bool library = strstr(who, "libcudart.so") != NULL;
        fprintf(stderr,
                "fake libcuda: %s %s, which asks the driver for private tables "
                "(cuGetExportTable) that the fake GPU cannot serve: its CUDA calls fail with "
                "801 \"operation not supported\"; %s\n",
                who,
                library ? "is a real CUDA runtime, loaded in place of the fake's libcudart"
                        : "has the CUDA runtime linked in statically (nvcc's default, "
                          "-cudart static)",
                library ? "a program that loads its own runtime cannot run on the fake GPU"
                        : "build it with nvcc -cudart shared to try it on the fake GPU");
    }
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- virtual memory management ------------------------------------------------- */

/*
 * cuMemAddressReserve / cuMemCreate / cuMemMap / cuMemSetAccess / cuMemUnmap /
 * cuMemRetainAllocationHandle / cuMemRelease / cuMemAddressFree on host
 * memory. A reservation is an anonymous PROT_NONE mapping; a physical
 * allocation is a memory file (memfd) counted against the device's memory
 * from cuMemCreate until every reference to its handle is released and it
 * is unmapped everywhere; cuMemMap maps the file over the
 * reservation with MAP_FIXED, still PROT_NONE ("calling cuMemMap does not
 * make the address accessible"), and cuMemSetAccess gives the owning
 * device's protection: touching a granule that is unmapped, or mapped
 * without access, faults as a GPU would. Rules enforced from cuda.h: sizes,
 * addresses and offsets are multiples of the granularity
 * (FAKECUDA_VMM_GRANULARITY, 2 MiB), the offset must be zero ("currently
 * must be zero"), a mapping goes only onto a reserved, unmapped range,
 * cuMemUnmap and cuMemSetAccess take whole mappings ("cannot unmap a
 * sub-range"; "a fully mapped address range"), flags must be zero.
 * Shareable handles of the file-descriptor type are the memory file
 * itself, so another process that imports one maps the same bytes (below,
 * cuMemExportToShareableHandle). Not modelled: fabric handles (the device
 * reports none), multicast, host-NUMA locations, peers'
 * access beyond bookkeeping (one address space: the owner's protection
 * applies; what each peer device was granted is kept per mapping and
 * answered by cuMemGetAccess, so tests can see access granted and taken
 * back), and
 * cuMemUnmap's synchronisation (the fake unmaps at once, the harsher
 * reading: memory still used by queued work is gone). FAKECUDA_VMM=0
 * makes the devices report no support and the calls CUDA_ERROR_NOT_SUPPORTED.
 * Lifetime: cuCtxDestroy "will not destroy memory allocations by
 * cuMemCreate()" (cuda.h), and neither does a primary context's reset or
 * last release (read off an H100: mappings made before cudaDeviceReset
 * could be unmapped after it). Where cuda.h leaves a misuse undefined (a
 * handle used after its last release, freeing a reservation that is still
 * mapped) the fake answers CUDA_ERROR_INVALID_VALUE: the real driver may do
 * worse, and the tests must not depend on either.
 */
/* A physical allocation. refs counts the references to its handle:
 * cuMemCreate's, and one per cuMemRetainAllocationHandle ("must be released
 * with corresponding number of calls to cuMemRelease"); the memory lasts
 * while a reference or a mapping does. */
typedef struct vmm_handle {
    int dev, fd;
    uint64_t size;
    unsigned mappings, refs;
    unsigned types;   /* the shareable handle types asked for at creation */
    bool imported;    /* another allocation's memory, imported: not this
                         process's device memory to count */
} vmm_handle;

typedef struct vmm_range {
    uint64_t base, size;
    vmm_handle *h; /* mappings */
    int prot;      /* mappings: the owner's access */
    uint64_t peer_read, peer_write; /* mappings: other devices' access (bit i: device i) */
} vmm_range;

static struct {
    bool configured, supported;
    uint64_t granularity;
    vmm_range *reserved, *mapped;
    size_t nreserved, capreserved, nmapped, capmapped;
    vmm_handle **handles; /* live physical allocations: a handle is valid iff listed */
    size_t nhandles, caphandles;
    const char *refuse; /* FAKECUDA_VMM_REFUSE: the call that fails */
} V;

/* Lock held. */
static void vmm_configure(void)
{
    if (V.configured)
        return;
    V.configured = true;
    const char *on = getenv("FAKECUDA_VMM");
    V.supported = !on || strcmp(on, "0") != 0;
    const char *g = getenv("FAKECUDA_VMM_GRANULARITY");
    V.granularity = g ? parse_bytes(g) : UINT64_C(2) << 20;
    if (V.granularity < 4096 || (V.granularity & (V.granularity - 1)))
        V.granularity = UINT64_C(2) << 20;
    V.refuse = getenv("FAKECUDA_VMM_REFUSE");
}

/* FAKECUDA_VMM_REFUSE=<cuMem... name>: that call fails although the device
 * reports virtual memory management, as cuMemSetAccess does on some WSL2
 * drivers (pytorch/pytorch#192330, where it returned CUDA_ERROR_UNKNOWN).
 * The fake returns CUDA_ERROR_NOT_SUPPORTED, which cuda.h lists among the
 * returns of all four calls (cuMemAddressReserve, cuMemCreate, cuMemMap,
 * cuMemSetAccess). =cuMemSetAccess:multi refuses only a range over more than
 * one mapping (CUDA_ERROR_INVALID_VALUE), as a driver reading "a fully mapped
 * address range" as one mapping would: cuda.h allows several ("containing all
 * allocations"), and PyTorch relies on it, but a pool that sets access so
 * must find out before it is made if a driver does not. */
#define VMM_REFUSED(name) (V.refuse && strcmp(V.refuse, name) == 0)

#define VMM_ENTER()                                 \
    ENTER();                                        \
    vmm_configure();                                \
    if (!V.supported)                               \
        LEAVE(CUDA_ERROR_NOT_SUPPORTED)

static bool vmm_aligned(uint64_t v) { return v % V.granularity == 0; }

static bool vmm_push(vmm_range **a, size_t *n, size_t *cap, vmm_range r)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        vmm_range *t = realloc(*a, c * sizeof *t);
        if (!t)
            return false;
        *a = t;
        *cap = c;
    }
    (*a)[(*n)++] = r;
    return true;
}

/* The device a pinned-device allocation property names, or -1. */
static int vmm_prop_device(const CUmemAllocationProp *prop)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !is_device(prop->location.id))
        return -1;
    return prop->location.id;
}

/* The live allocation a handle names, or NULL (it is never dereferenced
 * unless listed: a released handle's memory is gone). */
static vmm_handle *vmm_handle_of(CUmemGenericAllocationHandle handle)
{
    for (size_t i = 0; i < V.nhandles; i++)
        if ((CUmemGenericAllocationHandle)(uintptr_t)V.handles[i] == handle)
            return V.handles[i];
    return NULL;
}

/* The physical memory goes back to the device. */
static void vmm_destroy(vmm_handle *h)
{
    for (size_t i = 0; i < V.nhandles; i++)
        if (V.handles[i] == h) {
            V.handles[i] = V.handles[--V.nhandles];
            break;
        }
    close(h->fd);
    if (!h->imported)
        G.st.bytes_in_use[h->dev] -= h->size;
    free(h);
}

/* Once every reference is released and every mapping unmapped. */
static void vmm_maybe_free(vmm_handle *h)
{
    if (!h->refs && !h->mappings)
        vmm_destroy(h);
}

/* Mapping m goes: its range becomes a bare reservation again. */
static void vmm_unmap_at(size_t m)
{
    vmm_range *r = &V.mapped[m];
    mmap((void *)(uintptr_t)r->base, r->size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    r->h->mappings--;
    *r = V.mapped[--V.nmapped];
}

/* The reservation holding [base, base + size), or NULL. */
static vmm_range *vmm_reservation(uint64_t base, uint64_t size)
{
    for (size_t i = 0; i < V.nreserved; i++)
        if (base >= V.reserved[i].base && base + size <= V.reserved[i].base + V.reserved[i].size &&
            base + size > base)
            return &V.reserved[i];
    return NULL;
}

/* Lock held: the mapping holding ptr (cuMemMap), or NULL. */
static vmm_range *vmm_mapping_at(CUdeviceptr ptr)
{
    for (size_t i = 0; i < V.nmapped; i++)
        if (ptr - V.mapped[i].base < V.mapped[i].size)
            return &V.mapped[i];
    return NULL;
}

/* Lock held: the range of the mapping holding ptr; false if none does. */
static bool vmm_mapping_range(CUdeviceptr ptr, CUdeviceptr *base, size_t *size)
{
    const vmm_range *m = vmm_mapping_at(ptr);
    if (m) {
        *base = m->base;
        *size = m->size;
    }
    return m != NULL;
}

/* Lock held: is [p, p + n) mapped throughout, by mappings of device dev's
 * memory (-1: any device's)? Neighbouring mappings of one reservation make
 * one range of addresses, as a pool's granules do. */
static bool vmm_mapped_on(CUdeviceptr p, size_t n, int dev)
{
    for (CUdeviceptr at = p; at - p < n;) {
        const vmm_range *m = vmm_mapping_at(at);
        if (!m || (dev >= 0 && m->h->dev != dev))
            return false;
        at = m->base + m->size;
    }
    return n > 0;
}

/* Lock held: is ptr inside a reservation? */
static bool vmm_reserved(CUdeviceptr ptr)
{
    return vmm_reservation(ptr, 1) != NULL;
}

/* Lock held: a pointer attribute of an address inside a reservation, as
 * cuPointerGetAttribute's text in cuda.h reads: MAPPED "indicates if this
 * pointer is in a valid address range that is mapped to a backing
 * allocation"; RANGE_START_ADDR and RANGE_SIZE are "not necessarily the
 * address [size] of the mapped region, but ... of the mappable address range
 * ptr references (e.g. from cuMemAddressReserve)"; DEVICE_ORDINAL is the
 * device "against which the memory was allocated" (the backing allocation's
 * location). Not stated there, and printed by the GPU suite's vmm-ptr-attr
 * to check: no context (NULL, as for stream-ordered allocations), and no
 * device pointer or device for an unmapped address. Attributes the fake
 * does not model are not supported. */
static CUresult vmm_pointer_attribute(CUdeviceptr ptr, CUpointer_attribute attr, void *data)
{
    const vmm_range *r = vmm_reservation(ptr, 1), *m = vmm_mapping_at(ptr);
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)data = m ? CU_MEMORYTYPE_DEVICE : 0; break;
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = NULL; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = m != NULL; break;
    /* "suitable for cudaIpcGetMemHandle": memory from cuMemCreate is shared
     * through its own handles, never the legacy ones */
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = r->base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = r->size; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        if (!m)
            return CUDA_ERROR_INVALID_VALUE;
        *(CUdeviceptr *)data = ptr;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        if (!m)
            return CUDA_ERROR_INVALID_VALUE;
        *(int *)data = m->h->dev;
        break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
}

/* Do whole mappings tile [base, base + size) exactly, without gaps? */
static bool vmm_whole_mappings(uint64_t base, uint64_t size)
{
    uint64_t at = base;
    while (at < base + size) {
        size_t i = 0;
        while (i < V.nmapped && V.mapped[i].base != at)
            i++;
        if (i == V.nmapped || V.mapped[i].base + V.mapped[i].size > base + size)
            return false;
        at += V.mapped[i].size;
    }
    return size > 0;
}

/* A physical allocation's memory file, named after the machine's device
 * that holds it, so that a process importing the file (a shareable handle)
 * knows the device, as the real driver knows its own objects. */
#define VMM_FILE_PREFIX "fakecuda-vmm-dev"

static int vmm_memory_file(int phys)
{
    char name[32];
    snprintf(name, sizeof name, VMM_FILE_PREFIX "%d", phys);
    return memfd_create(name, MFD_CLOEXEC);
}

/* Lock held: the visible device whose memory file fd is (one this fake
 * made, in this process or another), or -1. */
static int vmm_file_device(int fd)
{
    char link[64], target[128];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0)
        return -1;
    target[n] = 0;
    const char *prefix = "/memfd:" VMM_FILE_PREFIX;
    if (strncmp(target, prefix, strlen(prefix)) != 0)
        return -1;
    int phys = atoi(target + strlen(prefix));
    for (int d = 0; d < G.ndev; d++)
        if (G.phys[d] == phys)
            return d;
    return -2; /* a device this process does not see */
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option)
{
    CALLED();
    VMM_ENTER();
    if (!granularity || vmm_prop_device(prop) < 0 ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    *granularity = V.granularity;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags)
{
    CALLED();
    VMM_ENTER();
    if (VMM_REFUSED("cuMemAddressReserve"))
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    /* "The size and address parameters must be a multiple of the host page
     * size and the alignment must be a power of two or zero for default
     * alignment" (a non-zero addr is only a hint where to place the range,
     * but it too must be page-aligned); "flags - Currently unused, must be
     * zero". The default alignment, which cuda.h leaves open, is the
     * granularity here. */
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (!ptr || size == 0 || size % page || addr % page || flags ||
        (alignment & (alignment - 1)))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    size_t align = alignment > V.granularity ? alignment : V.granularity;
    uint8_t *p = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
    if (p == MAP_FAILED)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    uint8_t *base = (uint8_t *)(((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1));
    if (base > p)
        munmap(p, (size_t)(base - p));
    munmap(base + size, (size_t)(p + size + align - (base + size)));
    if (!vmm_push(&V.reserved, &V.nreserved, &V.capreserved,
                  (vmm_range){(uint64_t)(uintptr_t)base, size, NULL, PROT_NONE, 0, 0})) {
        munmap(base, size);
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    }
    G.st.vmm_reserve_calls++;
    *ptr = (CUdeviceptr)(uintptr_t)base;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CALLED();
    VMM_ENTER();
    size_t i = 0;
    while (i < V.nreserved && (V.reserved[i].base != ptr || V.reserved[i].size != size))
        i++;
    if (i == V.nreserved)
        LEAVE(CUDA_ERROR_INVALID_VALUE); /* "must match what was given" */
    for (size_t m = 0; m < V.nmapped; m++)
        if (V.mapped[m].base >= ptr && V.mapped[m].base < ptr + size)
            LEAVE(CUDA_ERROR_INVALID_VALUE); /* still mapped: unmap first */
    munmap((void *)(uintptr_t)ptr, size);
    V.reserved[i] = V.reserved[--V.nreserved];
    G.st.vmm_address_free_calls++;
    LEAVE(CUDA_SUCCESS);
}

/* VMM lock held: room in the handle table for one more; false when host
 * memory ran out. */
static bool vmm_handle_room(void)
{
    if (V.nhandles < V.caphandles)
        return true;
    size_t c = V.caphandles ? V.caphandles * 2 : 16;
    vmm_handle **t = realloc(V.handles, c * sizeof *t);
    if (!t)
        return false;
    V.handles = t;
    V.caphandles = c;
    return true;
}

static CUresult mem_create(CUmemGenericAllocationHandle *handle, size_t size,
                           const CUmemAllocationProp *prop, unsigned long long flags)
{
    VMM_ENTER();
    if (VMM_REFUSED("cuMemCreate"))
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    /* "The size of this allocation must be a multiple of the value given
     * via cuMemGetAllocationGranularity"; flags "for future use, must be
     * zero". */
    int dev = vmm_prop_device(prop);
    if (!handle || dev < 0 || size == 0 || !vmm_aligned(size) || flags)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* requestedHandleTypes: a file descriptor is "permitted only on POSIX
     * systems", Win32 handles are not, and a fabric handle needs a device
     * on a fabric with an IMEX channel, which the fake's are not
     * (HANDLE_TYPE_FABRIC_SUPPORTED reads 0): not supported, the answer
     * PyTorch and XLA take as "ask without it" (cuda.h lists it). Bits that
     * name no type are invalid. */
    const unsigned types = (unsigned)prop->requestedHandleTypes;
    const unsigned known = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_WIN32 |
                           CU_MEM_HANDLE_TYPE_WIN32_KMT | CU_MEM_HANDLE_TYPE_FABRIC;
    if (types & ~known)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (types & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    G.st.vmm_create_calls++;
    if (G.fail_alloc_countdown && --G.fail_alloc_countdown == 0)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    if (size > device_free(dev))
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    vmm_handle *h = calloc(1, sizeof *h);
    int fd = h ? vmm_memory_file(G.phys[dev]) : -1;
    const bool room = vmm_handle_room();
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 || !room) {
        if (fd >= 0)
            close(fd);
        free(h);
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    }
    *h = (vmm_handle){dev, fd, size, 0, 1, types, false};
    V.handles[V.nhandles++] = h;
    G.st.bytes_in_use[dev] += size;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    LEAVE(CUDA_SUCCESS);
}

/* The test's work for after the next cuMemCreate
 * (ctl_after_next_mem_create). */
static _Atomic(fakecuda_work) after_create_work;
static void *_Atomic after_create_arg;

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    CALLED();
    CUresult r = mem_create(handle, size, prop, flags);
    fakecuda_work w = atomic_exchange(&after_create_work, NULL);
    if (w)
        w(atomic_load(&after_create_arg));
    return r;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CALLED();
    VMM_ENTER();
    vmm_handle *h = vmm_handle_of(handle);
    if (!h || !h->refs)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    h->refs--;
    vmm_maybe_free(h); /* else when its last mapping goes */
    LEAVE(CUDA_SUCCESS);
}

/* "Given an address addr, returns the allocation handle of the backing
 * memory allocation ... the same handle value used to map the memory. If the
 * address requested is not mapped, the function will fail. The returned
 * handle must be released with corresponding number of calls to
 * cuMemRelease"; addr "can be any address in a range previously mapped by
 * cuMemMap". It is how a program keeps memory it is about to unmap: the
 * reference outlives the mapping. */
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    CALLED();
    VMM_ENTER();
    vmm_range *m = vmm_mapping_at((CUdeviceptr)(uintptr_t)addr);
    if (!handle || !m)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    m->h->refs++;
    G.st.vmm_retain_calls++;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)m->h;
    LEAVE(CUDA_SUCCESS);
}

/* "Given a CUDA memory handle, create a shareable memory allocation handle
 * that can be used to share the memory with other processes ... The
 * recipient process can convert the shareable handle back into a CUDA
 * memory handle using cuMemImportFromShareableHandle and map it with
 * cuMemMap"; flags "Reserved, must be zero". A file descriptor (an int at
 * shareableHandle) is a new descriptor of the allocation's memory file:
 * the program owns and closes it (PyTorch and NCCL do), and the memory
 * lives on in a process that imported it ("Once all shareable handles are
 * closed and the allocation is released, the allocated memory ... will be
 * released": the kernel keeps the file's pages while any descriptor or
 * mapping holds them). Only a type asked for at creation can be exported
 * (requestedHandleTypes); anything else is an invalid value. The device's
 * memory count goes down at the last release as before, not at the last
 * descriptor's close, which the fake cannot see. */
EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                             CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType handleType,
                                             unsigned long long flags)
{
    CALLED();
    VMM_ENTER();
    vmm_handle *h = vmm_handle_of(handle);
    if (!shareableHandle || !h || !h->refs || flags ||
        handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !(h->types & handleType))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    int fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        LEAVE(CUDA_ERROR_NOT_PERMITTED); /* the process may open no more files */
    *(int *)shareableHandle = fd;
    LEAVE(CUDA_SUCCESS);
}

/* "Imports an allocation from a requested shareable handle type": for a
 * file descriptor, osHandle is the descriptor itself ((void *)(uintptr_t)
 * fd, as PyTorch and NCCL pass it), which the caller keeps and may close
 * at once (the fake holds a descriptor of its own). The handle stands for
 * the exporter's memory: mapped, it shows the same bytes in both
 * processes, and it is not device memory this process allocated. "If the
 * current process cannot support the memory described by this shareable
 * handle, this API will error as CUDA_ERROR_NOT_SUPPORTED": memory of a
 * device this process does not see, and fabric handles (no fabric here).
 * A descriptor that is not an exported allocation is an invalid value. */
EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                               void *osHandle,
                                               CUmemAllocationHandleType shHandleType)
{
    CALLED();
    VMM_ENTER();
    if (shHandleType == CU_MEM_HANDLE_TYPE_FABRIC)
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    if (!handle || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    const int theirs = (int)(intptr_t)osHandle;
    const int dev = vmm_file_device(theirs);
    struct stat st;
    if (dev == -1 || fstat(theirs, &st) != 0 || st.st_size <= 0 ||
        !vmm_aligned((uint64_t)st.st_size))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (dev < 0)
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    vmm_handle *h = calloc(1, sizeof *h);
    int fd = h ? fcntl(theirs, F_DUPFD_CLOEXEC, 0) : -1;
    const bool room = vmm_handle_room();
    if (fd < 0 || !room) {
        if (fd >= 0)
            close(fd);
        free(h);
        LEAVE(CUDA_ERROR_NOT_PERMITTED); /* no descriptor or no room for one more */
    }
    *h = (vmm_handle){dev, fd, (uint64_t)st.st_size, 0, 1,
                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, true};
    V.handles[V.nhandles++] = h;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    CALLED();
    VMM_ENTER();
    if (VMM_REFUSED("cuMemMap"))
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    /* "ptr, size, and offset must be a multiple of the value given via
     * cuMemGetAllocationGranularity"; offset "currently must be zero"; the
     * range "must be an address reservation previously reserved with
     * cuMemAddressReserve"; offset + size within the allocation. */
    vmm_handle *h = vmm_handle_of(handle);
    if (!h || !h->refs || size == 0 || offset != 0 || flags || !vmm_aligned(ptr) ||
        !vmm_aligned(size) || size > h->size || !vmm_reservation(ptr, size))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    for (size_t m = 0; m < V.nmapped; m++)
        if (ptr < V.mapped[m].base + V.mapped[m].size && V.mapped[m].base < ptr + size)
            LEAVE(CUDA_ERROR_INVALID_VALUE); /* "only ... reservations that are not mapped" */
    void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, 0);
    if (p == MAP_FAILED)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    if (!vmm_push(&V.mapped, &V.nmapped, &V.capmapped, (vmm_range){ptr, size, h, PROT_NONE, 0, 0})) {
        mmap(p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    }
    h->mappings++;
    G.st.vmm_map_calls++;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CALLED();
    VMM_ENTER();
    if (!vmm_whole_mappings(ptr, size))
        LEAVE(CUDA_ERROR_INVALID_VALUE); /* "cannot unmap a sub-range" */
    for (size_t m = 0; m < V.nmapped;) {
        vmm_range *r = &V.mapped[m];
        if (r->base >= ptr && r->base < ptr + size) {
            vmm_handle *h = r->h;
            vmm_unmap_at(m); /* a bare reservation again: inaccessible */
            vmm_maybe_free(h);
        } else {
            m++;
        }
    }
    G.st.vmm_unmap_calls++;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count)
{
    CALLED();
    VMM_ENTER();
    if (VMM_REFUSED("cuMemSetAccess"))
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    if (!desc || count == 0 || !vmm_whole_mappings(ptr, size))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (VMM_REFUSED("cuMemSetAccess:multi")) {
        size_t covered = 0;
        for (size_t m = 0; m < V.nmapped; m++)
            covered += V.mapped[m].base >= ptr && V.mapped[m].base < ptr + size;
        if (covered > 1)
            LEAVE(CUDA_ERROR_INVALID_VALUE);
    }
    for (size_t k = 0; k < count; k++)
        if (desc[k].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !is_device(desc[k].location.id))
            LEAVE(CUDA_ERROR_INVALID_DEVICE);
    /* Flags other than CUmemAccess_flags' three ("Default, make the address
     * range not accessible", "Make the address range read accessible",
     * "Make the address range read-write accessible") are an invalid value,
     * refused before any is applied, as cuMemPoolSetAccess refuses them:
     * not read as "no access". */
    for (size_t k = 0; k < count; k++)
        if (!access_flags_known(desc[k].flags))
            LEAVE(CUDA_ERROR_INVALID_VALUE);
    for (size_t m = 0; m < V.nmapped; m++) {
        vmm_range *r = &V.mapped[m];
        if (r->base < ptr || r->base >= ptr + size)
            continue;
        for (size_t k = 0; k < count; k++) {
            if (desc[k].location.id != r->h->dev) {
                /* A peer's access: one address space here, so only kept
                 * for cuMemGetAccess and counted. cuMemSetAccess "set[s]
                 * the access flags for each location specified in desc",
                 * so a later entry replaces an earlier grant, and
                 * CU_MEM_ACCESS_FLAGS_PROT_NONE "make[s] the address range
                 * not accessible": it takes the access back (cuda.h). */
                const uint64_t bit = UINT64_C(1) << desc[k].location.id;
                const unsigned long long f = desc[k].flags;
                r->peer_read = f & CU_MEM_ACCESS_FLAGS_PROT_READ ? r->peer_read | bit
                                                                 : r->peer_read & ~bit;
                r->peer_write = f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? r->peer_write | bit
                                                                        : r->peer_write & ~bit;
                if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE)
                    G.st.vmm_peer_grants++;
                continue;
            }
            r->prot = desc[k].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                      : desc[k].flags == CU_MEM_ACCESS_FLAGS_PROT_READ ? PROT_READ
                                                                       : PROT_NONE;
            mprotect((void *)(uintptr_t)r->base, r->size, r->prot);
        }
    }
    G.st.vmm_access_calls++;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
                               CUdeviceptr ptr)
{
    CALLED();
    VMM_ENTER();
    if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* cuda.h lists CUDA_ERROR_INVALID_DEVICE for cuMemGetAccess: a location
     * that names no device. */
    if (!is_device(location->id))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    const vmm_range *r = vmm_mapping_at(ptr);
    if (!r)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* "the access flags set for the given location": the owner's from its
     * protection, a peer's from what was granted to it. */
    bool rd, wr;
    if (location->id != r->h->dev) {
        const uint64_t bit = UINT64_C(1) << location->id;
        rd = (r->peer_read & bit) != 0;
        wr = (r->peer_write & bit) != 0;
    } else {
        rd = (r->prot & PROT_READ) != 0;
        wr = (r->prot & PROT_WRITE) != 0;
    }
    *flags = wr ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
             : rd ? CU_MEM_ACCESS_FLAGS_PROT_READ
                  : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    LEAVE(CUDA_SUCCESS);
}

/* ---- cuGetProcAddress --------------------------------------------------------- */

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status);

/* Base name -> versions, newest first: what cudart asks for, as the real
 * driver serves it (cuMemAlloc at 3020 is cuMemAlloc_v2, and so on). */
typedef struct proc {
    const char *base;
    int since;      /* lowest cudaVersion that gets this entry */
    bool ptsz;      /* per-thread default stream variant (_ptsz or _ptds) */
    void *fn;
} proc;

#define P(base, since, fn) {base, since, false, (void *)(fn)}
#define PZ(base, since, fn) {base, since, true, (void *)(fn)}
static const proc procs[] = {
    P("cuInit", 2000, cuInit),
    P("cuDriverGetVersion", 2020, cuDriverGetVersion),
    P("cuDeviceGet", 2000, cuDeviceGet),
    P("cuDeviceGetCount", 2000, cuDeviceGetCount),
    P("cuDeviceGetName", 2000, cuDeviceGetName),
    P("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    P("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    P("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool),
    P("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
    P("cuMemPoolCreate", 11020, cuMemPoolCreate),
    P("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    P("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
    P("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
    P("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    P("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    P("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    P("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset),
    P("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    P("cuCtxCreate", 12050, cuCtxCreate_v4),
    P("cuCtxCreate", 11040, cuCtxCreate_v3),
    P("cuCtxCreate", 3020, cuCtxCreate_v2),
    P("cuCtxCreate", 2000, cuCtxCreate),
    P("cuGLCtxCreate", 3020, cuGLCtxCreate_v2),
    P("cuGLCtxCreate", 2000, cuGLCtxCreate),
    P("cuVDPAUCtxCreate", 3020, cuVDPAUCtxCreate_v2),
    P("cuVDPAUCtxCreate", 3010, cuVDPAUCtxCreate),
    P("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    P("cuCtxDestroy", 2000, cuCtxDestroy),
    P("cuCtxDetach", 2000, ctx_detach_entry),
    P("cuCtxAttach", 2000, ctx_attach_entry),
    P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    P("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    P("cuCtxPushCurrent", 2000, cuCtxPushCurrent),
    P("cuCtxPopCurrent", 2000, cuCtxPopCurrent),
    P("cuCtxGetDevice", 2000, cuCtxGetDevice),
    P("cuCtxGetId", 12000, cuCtxGetId),
    P("cuCtxGetStreamPriorityRange", 5050, cuCtxGetStreamPriorityRange),
    P("cuCtxSynchronize", 2000, cuCtxSynchronize),
    P("cuCtxEnablePeerAccess", 4000, cuCtxEnablePeerAccess),
    P("cuCtxDisablePeerAccess", 4000, cuCtxDisablePeerAccess),
    P("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
    P("cuStreamCreate", 2000, cuStreamCreate),
    P("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
    P("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    P("cuStreamDestroy", 2000, cuStreamDestroy),
    P("cuStreamGetFlags", 5050, cuStreamGetFlags),
    P("cuStreamGetId", 12000, cuStreamGetId),
    PZ("cuStreamGetId", 12000, cuStreamGetId_ptsz),
    P("cuStreamGetCtx", 12050, cuStreamGetCtx_v2),
    P("cuStreamGetCtx", 9020, cuStreamGetCtx),
    P("cuStreamGetGreenCtx", 12040, cuStreamGetGreenCtx),
    P("cuDeviceGetDevResource", 12040, cuDeviceGetDevResource),
    P("cuDevResourceGenerateDesc", 12040, cuDevResourceGenerateDesc),
    P("cuGreenCtxCreate", 12040, cuGreenCtxCreate),
    P("cuGreenCtxDestroy", 12040, cuGreenCtxDestroy),
    P("cuCtxFromGreenCtx", 12040, cuCtxFromGreenCtx),
    P("cuGreenCtxStreamCreate", 12050, cuGreenCtxStreamCreate),
    P("cuGreenCtxRecordEvent", 12040, cuGreenCtxRecordEvent),
    P("cuStreamQuery", 2000, cuStreamQuery),
    P("cuStreamWaitEvent", 3020, cuStreamWaitEvent),
    P("cuStreamSynchronize", 2000, cuStreamSynchronize),
    PZ("cuStreamSynchronize", 7000, cuStreamSynchronize_ptsz),
    P("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
    PZ("cuStreamIsCapturing", 10000, cuStreamIsCapturing_ptsz),
    P("cuStreamGetCaptureInfo", 12030, cuStreamGetCaptureInfo_v3),
    PZ("cuStreamGetCaptureInfo", 12030, cuStreamGetCaptureInfo_v3_ptsz),
    P("cuStreamGetCaptureInfo", 11030, cuStreamGetCaptureInfo_v2),
    PZ("cuStreamGetCaptureInfo", 11030, cuStreamGetCaptureInfo_v2_ptsz),
    P("cuStreamGetCaptureInfo", 10010, cuStreamGetCaptureInfo),
    PZ("cuStreamGetCaptureInfo", 10010, cuStreamGetCaptureInfo_ptsz),
    P("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
    PZ("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2_ptsz),
    P("cuStreamBeginCapture", 10000, cuStreamBeginCapture_v1),
    PZ("cuStreamBeginCapture", 10000, cuStreamBeginCapture_v1_ptsz),
    P("cuStreamBeginCaptureToGraph", 12030, cuStreamBeginCaptureToGraph),
    PZ("cuStreamBeginCaptureToGraph", 12030, cuStreamBeginCaptureToGraph_ptsz),
    P("cuStreamEndCapture", 10000, cuStreamEndCapture),
    PZ("cuStreamEndCapture", 10000, cuStreamEndCapture_ptsz),
    P("cuGraphCreate", 10000, cuGraphCreate),
    P("cuGraphDestroy", 10000, cuGraphDestroy),
    P("cuEventCreate", 2000, cuEventCreate),
    P("cuEventDestroy", 4000, cuEventDestroy_v2),
    P("cuEventRecord", 2000, cuEventRecord),
    PZ("cuEventRecord", 7000, cuEventRecord_ptsz),
    P("cuEventQuery", 2000, cuEventQuery),
    P("cuEventSynchronize", 2000, cuEventSynchronize),
    P("cuEventElapsedTime", 12080, cuEventElapsedTime_v2),
    P("cuEventElapsedTime", 2000, cuEventElapsedTime),
    P("cuLaunchHostFunc", 10000, cuLaunchHostFunc),
    P("cuMemAlloc", 3020, cuMemAlloc_v2),
    P("cuMemFree", 3020, cuMemFree_v2),
    P("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    P("cuMemAllocAsync", 11020, cuMemAllocAsync),
    PZ("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
    P("cuMemFreeAsync", 11020, cuMemFreeAsync),
    PZ("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
    P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    PZ("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz),
    P("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    P("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    P("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    P("cuPointerGetAttributes", 7000, cuPointerGetAttributes),
    P("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
    P("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
    P("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2),
    P("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
    P("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2),
    PZ("cuMemcpyHtoD", 7000, cuMemcpyHtoD_v2_ptds),
    PZ("cuMemcpyDtoH", 7000, cuMemcpyDtoH_v2_ptds),
    PZ("cuMemcpyDtoD", 7000, cuMemcpyDtoD_v2_ptds),
    P("cuMemsetD8", 3020, cuMemsetD8_v2),
    PZ("cuMemsetD8", 7000, cuMemsetD8_v2_ptds),
    P("cuMemsetD16", 3020, cuMemsetD16_v2),
    PZ("cuMemsetD16", 7000, cuMemsetD16_v2_ptds),
    P("cuMemsetD32", 3020, cuMemsetD32_v2),
    PZ("cuMemsetD32", 7000, cuMemsetD32_v2_ptds),
    P("cuMemsetD8Async", 3020, cuMemsetD8Async),
    PZ("cuMemsetD8Async", 7000, cuMemsetD8Async_ptsz),
    P("cuMemsetD16Async", 3020, cuMemsetD16Async),
    PZ("cuMemsetD16Async", 7000, cuMemsetD16Async_ptsz),
    P("cuMemsetD32Async", 3020, cuMemsetD32Async),
    PZ("cuMemsetD32Async", 7000, cuMemsetD32Async_ptsz),
    P("cuMemsetD2D8", 3020, cuMemsetD2D8_v2),
    PZ("cuMemsetD2D8", 7000, cuMemsetD2D8_v2_ptds),
    P("cuMemsetD2D8Async", 3020, cuMemsetD2D8Async),
    PZ("cuMemsetD2D8Async", 7000, cuMemsetD2D8Async_ptsz),
    P("cuMemsetD2D16", 3020, cuMemsetD2D16_v2),
    PZ("cuMemsetD2D16", 7000, cuMemsetD2D16_v2_ptds),
    P("cuMemsetD2D16Async", 3020, cuMemsetD2D16Async),
    PZ("cuMemsetD2D16Async", 7000, cuMemsetD2D16Async_ptsz),
    P("cuMemsetD2D32", 3020, cuMemsetD2D32_v2),
    PZ("cuMemsetD2D32", 7000, cuMemsetD2D32_v2_ptds),
    P("cuMemsetD2D32Async", 3020, cuMemsetD2D32Async),
    PZ("cuMemsetD2D32Async", 7000, cuMemsetD2D32Async_ptsz),
    P("cuMemcpy", 4000, cuMemcpy),
    PZ("cuMemcpy", 7000, cuMemcpy_ptds),
    P("cuMemcpyAsync", 4000, cuMemcpyAsync),
    PZ("cuMemcpyAsync", 7000, cuMemcpyAsync_ptsz),
    P("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2),
    PZ("cuMemcpyHtoDAsync", 7000, cuMemcpyHtoDAsync_v2_ptsz),
    P("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2),
    PZ("cuMemcpyDtoHAsync", 7000, cuMemcpyDtoHAsync_v2_ptsz),
    P("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2),
    PZ("cuMemcpyDtoDAsync", 7000, cuMemcpyDtoDAsync_v2_ptsz),
    P("cuGetErrorString", 6000, cuGetErrorString),
    P("cuGetErrorName", 6000, cuGetErrorName),
    P("cuGetExportTable", 3000, cuGetExportTable),
    P("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId),
    P("cuMemHostAlloc", 2020, cuMemHostAlloc),
    P("cuMemFreeHost", 2000, cuMemFreeHost),
    P("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
    P("cuMemcpyPeer", 4000, cuMemcpyPeer),
    PZ("cuMemcpyPeer", 7000, cuMemcpyPeer_ptds),
    P("cuMemcpyPeerAsync", 4000, cuMemcpyPeerAsync),
    PZ("cuMemcpyPeerAsync", 7000, cuMemcpyPeerAsync_ptsz),
    P("cuMemPoolSetAccess", 11020, cuMemPoolSetAccess),
    P("cuMemPoolGetAccess", 11020, cuMemPoolGetAccess),
    P("cuStreamWriteValue64", 12000, cuStreamWriteValue64_v2),
    PZ("cuStreamWriteValue64", 12000, cuStreamWriteValue64_v2_ptsz),
    P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    P("cuMemAddressReserve", 10020, cuMemAddressReserve),
    P("cuMemAddressFree", 10020, cuMemAddressFree),
    P("cuMemCreate", 10020, cuMemCreate),
    P("cuMemRelease", 10020, cuMemRelease),
    P("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle),
    P("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
    P("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
    P("cuMemMap", 10020, cuMemMap),
    P("cuMemUnmap", 10020, cuMemUnmap),
    P("cuMemSetAccess", 10020, cuMemSetAccess),
    P("cuMemGetAccess", 10020, cuMemGetAccess),
    P("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    P("cuGetProcAddress", 11030, cuGetProcAddress),
};

static CUresult get_proc_address(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&G.lock);
    G.st.proc_address_lookups++;
    pthread_mutex_unlock(&G.lock);
    bool want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const proc *best = NULL;
    bool known = false;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        const proc *p = &procs[i];
        if (strcmp(p->base, symbol) != 0)
            continue;
        known = true;
        if (p->since > version)
            continue;
        /* Prefer the per-thread variant when asked, else the plain one;
         * among those, the first listed (newest) that the version allows. */
        if (!best || (p->ptsz == want_ptsz && best->ptsz != want_ptsz))
            best = p;
    }
    if (best && best->ptsz && !want_ptsz)
        best = NULL;
    *pfn = best ? best->fn : NULL;
    if (status)
        *status = best ? CU_GET_PROC_ADDRESS_SUCCESS
                  : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                          : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    CALLED();
    return get_proc_address(symbol, pfn, version, flags, status);
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    CALLED();
    return get_proc_address(symbol, pfn, version, flags, NULL);
}

/* ---- test control ------------------------------------------------------------ */

static int ctl_launch(void *stream, fakecuda_work fn, void *arg)
{
    ENTER();
    fstream *s = stream_of((CUstream)stream);
    if (!s)
        LEAVE(-1);
    if (legacy_use(s) != CUDA_SUCCESS || capture_usable(s) != CUDA_SUCCESS)
        LEAVE(-1);
    /* A kernel launched on a capturing stream is the graph's: never run. */
    if (captured_instead(s)) {
        maybe_autocomplete_and_unlock(s);
        return 0;
    }
    submit(s, fn, arg);
    maybe_autocomplete_and_unlock(s);
    return 0;
}

static int ctl_launch_stuck(void *stream)
{
    ENTER();
    fstream *s = stream_of((CUstream)stream);
    if (!s || legacy_use(s) != CUDA_SUCCESS)
        LEAVE(-1);
    enqueue(s, (work_item){.seq = submit(s, NULL, NULL), .stuck = true});
    LEAVE(0);
}

static void ctl_complete(void *stream)
{
    ENTER();
    complete_and_unlock(ctl_stream_of((CUstream)stream));
}

static void ctl_complete_all(void)
{
    ENTER();
    complete_everything_and_unlock(NULL);
}

static uint64_t ctl_pending(void *stream)
{
    ENTER();
    fstream *s = ctl_stream_of((CUstream)stream);
    LEAVE(s ? s->submitted - s->completed : 0);
}

static uint64_t ctl_submitted(void *stream)
{
    ENTER();
    fstream *s = ctl_stream_of((CUstream)stream);
    LEAVE(s ? s->submitted : 0);
}

/* As ctl_complete, only up to position seq: the GPU has run the stream's
 * first seq operations (and what they wait for on other streams). */
static void ctl_complete_to(void *stream, uint64_t seq)
{
    ENTER();
    fstream *s = ctl_stream_of((CUstream)stream);
    work_item *w = NULL;
    size_t n = 0;
    if (s)
        gather(s, seq, &w, &n);
    unlock_and_run(w, n);
}

static size_t ctl_calls(fakecuda_call_count *out, size_t n)
{
    /* Slots are only ever added, each name set before the count grows. */
    size_t have = atomic_load(&ncall_slots);
    for (size_t i = 0; i < have && i < n; i++) {
        out[i].name = call_counts[i].name;
        out[i].calls = atomic_load_explicit(&call_counts[i].n, memory_order_relaxed);
    }
    return have;
}

/* The next cuEventQuery from any thread calls fn(arg) first (cuEventQuery
 * above): a test puts another thread's call between a library's decision
 * about the query (its capture mode) and the query itself. */
static void ctl_before_next_event_query(fakecuda_work fn, void *arg)
{
    atomic_store(&next_query_arg, arg);
    atomic_store(&next_query_work, fn);
}

static void ctl_after_next_stream_destroy(fakecuda_work fn, void *arg)
{
    atomic_store(&after_destroy_arg, arg);
    atomic_store(&after_destroy_work, fn);
}

static void ctl_after_next_mem_create(fakecuda_work fn, void *arg)
{
    atomic_store(&after_create_arg, arg);
    atomic_store(&after_create_work, fn);
}

static void ctl_stats(fakecuda_stats *out)
{
    ENTER();
    *out = G.st;
    pthread_mutex_unlock(&G.lock);
}

static void ctl_fail_alloc_after(uint64_t n)
{
    ENTER();
    G.fail_alloc_countdown = n;
    pthread_mutex_unlock(&G.lock);
}

static int ctl_is_device_pointer(uint64_t addr)
{
    ENTER();
    LEAVE(find_alloc(addr, true) != NULL || vmm_mapping_at(addr) != NULL);
}

static int ctl_set_current_unseen(void *ctx)
{
    return (int)set_current((CUcontext)ctx);
}

EXPORT const fakecuda_api *fakecuda_api_table(void);
static const fakecuda_api api = {
    .launch = ctl_launch,
    .complete = ctl_complete,
    .complete_all = ctl_complete_all,
    .pending = ctl_pending,
    .stats = ctl_stats,
    .fail_alloc_after = ctl_fail_alloc_after,
    .is_device_pointer = ctl_is_device_pointer,
    .launch_stuck = ctl_launch_stuck,
    .submitted = ctl_submitted,
    .complete_to = ctl_complete_to,
    .calls = ctl_calls,
    .before_next_event_query = ctl_before_next_event_query,
    .set_current_unseen = ctl_set_current_unseen,
    .after_next_stream_destroy = ctl_after_next_stream_destroy,
    .after_next_mem_create = ctl_after_next_mem_create,
};

EXPORT const fakecuda_api *fakecuda_api_table(void) { return &api; }
