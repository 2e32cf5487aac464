/*
 * fake_internal.h - what the files of the fake CUDA driver share: its objects,
 * the global state (one mutex guards it), the entry-point macros and the
 * functions one file gives the others. fake_driver.c says what is modelled.
 */
#ifndef FAKE_INTERNAL_H
#define FAKE_INTERNAL_H
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
    bool host_fn; /* the program's cuLaunchHostFunc function, which may not call CUDA */
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

/* Calls of each entry point (fakecuda_api.calls), whoever made them and
 * whatever they answered: a benchmark counts what a library above the
 * driver costs in driver calls without a GPU. Kept apart from G and its
 * lock: cuCtxGetCurrent and the other calls that take no lock must not
 * start taking one to be counted. Each entry point finds its slot by name
 * once (CALLED below); there are more slots than entry points, and
 * tests/fake_cuda/test_calls_counted.py checks that every one counts. */
enum { CALL_SLOTS = 256 };

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
        if (atomic_load_explicit(&failures_armed, memory_order_relaxed)) {       \
            CUresult f_ = injected_failure(symbol);                              \
            if (f_ != CUDA_SUCCESS)                                              \
                return f_;                                                       \
        }                                                                        \
    } while (0)

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
        if (tls_in_host_fn)                           \
            return CUDA_ERROR_NOT_PERMITTED;          \
    } while (0)
#define ENTER_API() \
    NEED_INIT();    \
    ENTER()

/* The stream a _ptsz entry point is called on. cuda.h maps each
 * stream-taking entry point to its __CUDA_API_PTSZ twin under
 * CUDA_API_PER_THREAD_DEFAULT_STREAM (nvcc --default-stream per-thread), and
 * there stream 0 is the calling thread's per-thread default stream
 * (CU_STREAM_PER_THREAD); any other handle names itself. */
static inline CUstream ptsz_stream(CUstream s) { return s ? s : CU_STREAM_PER_THREAD; }

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

/* fake_driver.c */

struct fake_state {
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
    bool legacy_skips_destroyed; /* FAKECUDA_LEGACY_SKIPS_DESTROYED */
    bool free_no_sync;           /* FAKECUDA_FREE_NO_SYNC */
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
};
extern struct fake_state G;

struct call_count {
    const char *name;
    atomic_uint_fast64_t n;
};
extern struct call_count call_counts[CALL_SLOTS];

extern atomic_size_t ncall_slots;
unsigned call_slot(const char *name);

/* Injected failures (fake_cuda.h's fail_call): rules armed, and the answer
 * a counted call of entry point `symbol` gives instead of its own
 * (CUDA_SUCCESS: none, the call goes on). Checked by CALLED after the count,
 * before the call does anything. */
extern atomic_uint failures_armed;
CUresult injected_failure(const char *symbol);
int failure_arm(const char *name, uint64_t n, CUresult code, bool sticky);
extern _Thread_local fctx *tls_ctx_stack[16];
extern _Thread_local int tls_ctx_depth;
extern _Thread_local CUstreamCaptureMode tls_capture_mode;
extern _Thread_local bool tls_in_host_fn;
fctx *current_ctx(void);
CUresult ctx_usable(const fctx *c);
unsigned this_thread(void);
uint64_t now_ns(void);
uint64_t parse_bytes(const char *s);
void configure(void);
bool is_device(int d);
fstream *new_stream(fctx *c, unsigned flags, bool per_thread);
CUstream stream_handle(fstream *s);
void count_stale_use_of(const char *what, const fctx *owner, const char *how);
fstream *stream_of(CUstream h);
fstream *ctl_stream_of(CUstream h);
fevent *event_of(CUevent h);
bool live_capture(const fstream *s);
void invalidate_counted(fstream *o);
void stop_capturing(fstream *s);
void end_capture_sequence(uint64_t seq);
bool blocking_capture_in(const fctx *c);
CUresult legacy_use(fstream *s);
CUresult status_asked(fstream *s);
fstream *live_capture_of(const fevent *e);
CUresult captured_event_asked(const fevent *e);
CUresult capture_usable(const fstream *s);
CUresult work_usable(fstream *s);
CUresult unsafe_call(void);
void enqueue(fstream *s, work_item w);
dep *implicit_deps(const fstream *s, size_t *n);
uint64_t submit(fstream *s, fakecuda_work fn, void *arg);
void submit_host_fn(fstream *s, CUhostFn fn, void *arg);
bool captured_instead(fstream *s);
bool stream_done_to(const fstream *s, uint64_t seq);
void gather(fstream *s, uint64_t upto, work_item **all, size_t *nall);
void unlock_and_run(work_item *w, size_t n);
void complete_and_unlock(fstream *s);
bool completing_ctx(const fctx *c, const completion *w);
void complete_where_and_unlock(const completion *w);
void complete_everything_and_unlock(fctx *only);
void maybe_autocomplete_and_unlock(fstream *s);

/* fake_contexts.c */
void kill_ctx(fctx *c);
void live_ctx(fctx *c, int dev, fgreen *g);
CUresult set_current(CUcontext ctx);

/* fake_mempools.c */
int pool_device(CUmemoryPool pool);
void pool_took(CUmemoryPool pool, uint64_t size);
void pool_gave(CUmemoryPool pool, uint64_t size);
void pending_free_reached(pending_free *pf);
uint64_t pool_kept_for(CUmemoryPool pool, const fstream *on, uint64_t size);
pending_free *pending_free_add(CUmemoryPool pool, const fstream *s, uint64_t size);
uint64_t pools_cached(int dev);
void pools_release_at_sync(void);
void release_after_sync(void);
bool access_flags_known(CUmemAccess_flags f);

/* fake_memory.c */
allocation *find_alloc(uint64_t addr, bool interior);
uint64_t device_free(int dev);
host_allocation *find_host_alloc(uint64_t addr, bool interior);
void host_free(host_allocation *h);

/* fake_streams.c */
void event_dies(fevent *e);
void event_add_dep(fevent *e, fstream *s, uint64_t seq);

/* fake_vmm.c */
vmm_range *vmm_mapping_at(CUdeviceptr ptr);
bool vmm_mapping_range(CUdeviceptr ptr, CUdeviceptr *base, size_t *size);
bool vmm_mapped_on(CUdeviceptr p, size_t n, int dev);
bool vmm_reserved(CUdeviceptr ptr);
CUresult vmm_pointer_attribute(CUdeviceptr ptr, CUpointer_attribute attr, void *data);

/* fake_control.c: a test's work, run once at a chosen point of one entry
 * point (fake_cuda.h: before_next_event_query, after_next_stream_destroy,
 * after_next_mem_create, after_stream_is_capturing), outside the driver's
 * lock: the work may make other threads call the driver and wait for them.
 * countdown: the call that takes it to 0 runs the work (1 for the next). */
typedef struct test_hook {
    _Atomic(fakecuda_work) work;
    void *_Atomic arg;
    atomic_uint_fast64_t countdown;
} test_hook;
extern test_hook before_event_query, after_stream_destroy, after_mem_create,
    after_is_capturing;

/* Arms h to run fn(arg) in the nth call from now (n >= 1); n == 0 clears
 * it. */
static inline void test_hook_set_nth(test_hook *h, uint64_t n, fakecuda_work fn, void *arg)
{
    atomic_store(&h->work, NULL);
    atomic_store(&h->countdown, n);
    atomic_store(&h->arg, arg);
    if (n)
        atomic_store(&h->work, fn);
}

/* The same for the next call. */
static inline void test_hook_set(test_hook *h, fakecuda_work fn, void *arg)
{
    test_hook_set_nth(h, 1, fn, arg);
}

/* Taken by one call alone: the one that takes the countdown to 0. */
static inline void test_hook_run(test_hook *h)
{
    if (!atomic_load(&h->work) || atomic_fetch_sub(&h->countdown, 1) != 1)
        return;
    fakecuda_work w = atomic_exchange(&h->work, NULL);
    if (w)
        w(atomic_load(&h->arg));
}

/* Entry points cuda.h does not declare under these names (the _ptsz and
 * _ptds twins, the versions before the newest), for cuGetProcAddress's
 * table. */
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev);
EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                               unsigned int flags, CUdevice dev);
EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
EXPORT CUresult cuGLCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
EXPORT CUresult cuGLCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
EXPORT CUresult cuVDPAUCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev,
                                 uint32_t vdp_device, void *vdp_get_proc_address);
EXPORT CUresult cuVDPAUCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev,
                                    uint32_t vdp_device, void *vdp_get_proc_address);
EXPORT CUresult cuCtxDestroy(CUcontext ctx);
EXPORT CUresult cuCtxPushCurrent(CUcontext ctx);
EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx);
EXPORT CUresult cuStreamDestroy(CUstream h);
CUresult cuStreamBeginCapture_v1(CUstream h) __asm__("cuStreamBeginCapture");
CUresult cuStreamBeginCapture_v1_ptsz(CUstream h) __asm__("cuStreamBeginCapture_ptsz");
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s);
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s);
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s);
EXPORT CUresult cuStreamGetId_ptsz(CUstream h, unsigned long long *id);
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream h);
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus *st);
EXPORT CUresult cuStreamGetCaptureInfo(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id);
EXPORT CUresult cuStreamGetCaptureInfo_ptsz(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id);
EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id,
                                          CUgraph *graph, const CUgraphNode **deps,
                                          size_t *ndeps);
EXPORT CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream h, CUstreamCaptureStatus *st,
                                               cuuint64_t *id, CUgraph *graph,
                                               const CUgraphNode **deps, size_t *ndeps);
EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus *st,
                                               cuuint64_t *id, CUgraph *graph,
                                               const CUgraphNode **deps,
                                               const CUgraphEdgeData **edges, size_t *ndeps);
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode);
EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream h, CUgraph g, const CUgraphNode *deps,
                                                 const CUgraphEdgeData *edges, size_t n,
                                                 CUstreamCaptureMode mode);
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream h, CUgraph *g);
EXPORT CUresult cuEventRecord_ptsz(CUevent h, CUstream s);
EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream h, CUevent ev, unsigned int flags);
EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent h, CUstream s, unsigned int flags);
EXPORT CUresult cuStreamQuery_ptsz(CUstream h);
EXPORT CUresult cuStreamGetPriority_ptsz(CUstream h, int *priority);
EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream h, CUhostFn fn, void *data);
EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end);
EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void *s, size_t n);
EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *d, CUdeviceptr s, size_t n);
EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr d, CUdeviceptr s, size_t n);
EXPORT CUresult cuMemcpy_ptds(CUdeviceptr d, CUdeviceptr s, size_t n);
EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *s, size_t n, CUstream st);
EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *d, CUdeviceptr s, size_t n, CUstream st);
EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st);
EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st);
EXPORT CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                                       CUcontext src_ctx, size_t n, CUstream h);
EXPORT CUresult cuMemcpyPeer_ptds(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                                  CUcontext src_ctx, size_t n);
EXPORT CUresult cuStreamWriteValue64_v2_ptsz(CUstream h, CUdeviceptr addr, cuuint64_t value,
                                             unsigned int flags);
EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n);
EXPORT CUresult cuMemsetD16_v2_ptds(CUdeviceptr d, unsigned short v, size_t n);
EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr d, unsigned int v, size_t n);
EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream h);
EXPORT CUresult cuMemsetD16Async_ptsz(CUdeviceptr d, unsigned short v, size_t n, CUstream h);
EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int v, size_t n, CUstream h);
EXPORT CUresult cuMemsetD2D8_v2_ptds(CUdeviceptr d, size_t pitch, unsigned char v, size_t n, size_t rows);
EXPORT CUresult cuMemsetD2D8Async_ptsz(CUdeviceptr d, size_t pitch, unsigned char v, size_t n, size_t rows,
                                      CUstream h);
EXPORT CUresult cuMemsetD2D16_v2_ptds(CUdeviceptr d, size_t pitch, unsigned short v, size_t n, size_t rows);
EXPORT CUresult cuMemsetD2D16Async_ptsz(CUdeviceptr d, size_t pitch, unsigned short v, size_t n, size_t rows,
                                      CUstream h);
EXPORT CUresult cuMemsetD2D32_v2_ptds(CUdeviceptr d, size_t pitch, unsigned int v, size_t n, size_t rows);
EXPORT CUresult cuMemsetD2D32Async_ptsz(CUdeviceptr d, size_t pitch, unsigned int v, size_t n, size_t rows,
                                      CUstream h);

#endif
