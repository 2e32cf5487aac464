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
 *             cuda.h); the handle is invalid from then on, and the legacy
 *             stream's implicit wait leaves that work out (whether "all
 *             blocking streams" includes a destroyed one is not
 *             documented; FAKECUDA_LEGACY_SKIPS_DESTROYED=0 includes it).
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
 *             has ended, refused alone, a cuStreamWaitEvent on it too), and
 *             a capturing stream waiting on
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
 *             fail_call makes the Nth call of one entry point from now
 *             answer a code cuda.h documents for it (or that call and
 *             every later one: a context lost to a kernel's fault);
 *             FAKECUDA_VMM_REFUSE makes one virtual memory call always fail
 *             (or, =cuMemSetAccess:multi, set access over one mapping only).
 * Everything takes one global mutex; host callbacks run outside it.
 *
 * Files
 *   fake_driver.c    this model; the state, call counts and configuration;
 *                    handles, captures, stream queues and their completion
 *   fake_internal.h  the objects and what the files share
 *   fake_contexts.c  cuInit, devices, contexts, peer access
 *   fake_streams.c   streams, captures, graphs, events, host functions
 *   fake_green.c     green contexts
 *   fake_memory.c    allocations, stream-ordered memory, host memory,
 *                    pointer attributes, IPC
 *   fake_mempools.c  stream-ordered memory pools
 *   fake_copies.c    copies, memsets, stream memory writes
 *   fake_vmm.c       virtual memory management
 *   fake_procaddr.c  cuGetProcAddress, cuGetExportTable
 *   fake_control.c   the test-control table (fake_cuda.h)
 */
#include "fake_internal.h"

/* The fake's state (fake_internal.h): G.lock guards it. */
struct fake_state G = {.lock = PTHREAD_MUTEX_INITIALIZER,
       .stuck_cond = PTHREAD_COND_INITIALIZER,
       .batch_cond = PTHREAD_COND_INITIALIZER};
struct call_count call_counts[CALL_SLOTS];
atomic_size_t ncall_slots;
static pthread_mutex_t call_slots_lock = PTHREAD_MUTEX_INITIALIZER;

/* The slot of entry point `name` + 1, made on its first call (0: the
 * table is full, and the call goes uncounted). */
unsigned call_slot(const char *name)
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

/*
 * Injected failures (fake_cuda.h's fail_call). Only the codes cuda.h lists
 * in an entry point's "\return" may be injected into it, and, where its
 * comment carries "\notefnerr" ("This function may also return error codes
 * from previous, asynchronous launches"), the errors a faulted kernel
 * leaves for every later call: CUDA_ERROR_ILLEGAL_ADDRESS ("This leaves the
 * process in an inconsistent state and any further CUDA work will return
 * the same error", cuda.h's CUresult) and CUDA_ERROR_LAUNCH_FAILED (the
 * same words). The _ptsz twins share their entry point's comment.
 */
#define DOC_COMMON CUDA_ERROR_DEINITIALIZED, CUDA_ERROR_NOT_INITIALIZED
static const struct documented {
    const char *name;
    bool notefnerr;
    CUresult codes[8];
} documented[] = {
    {"cuEventCreate", true,
     {DOC_COMMON, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY}},
    {"cuEventRecord", true,
     {DOC_COMMON, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE}},
    {"cuEventRecord_ptsz", true,
     {DOC_COMMON, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE}},
    {"cuGreenCtxRecordEvent", false,
     {DOC_COMMON, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE,
      CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED}},
    {"cuEventQuery", true,
     {DOC_COMMON, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_READY}},
    {"cuEventSynchronize", true,
     {DOC_COMMON, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE}},
    {"cuStreamWaitEvent", true, {DOC_COMMON, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE}},
    {"cuStreamWaitEvent_ptsz", true,
     {DOC_COMMON, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE}},
    {"cuCtxSynchronize", true, {DOC_COMMON, CUDA_ERROR_INVALID_CONTEXT}},
    {"cuStreamSynchronize", true, {DOC_COMMON, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE}},
    {"cuStreamSynchronize_ptsz", true,
     {DOC_COMMON, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE}},
    {"cuStreamIsCapturing", true,
     {DOC_COMMON, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT}},
    {"cuStreamIsCapturing_ptsz", true,
     {DOC_COMMON, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT}},
    {"cuStreamGetCaptureInfo_v3", true,
     {CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, CUDA_ERROR_LOSSY_QUERY}},
    {"cuStreamGetCaptureInfo_v3_ptsz", true,
     {CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, CUDA_ERROR_LOSSY_QUERY}},
    {"cuCtxGetId", true,
     {DOC_COMMON, CUDA_ERROR_CONTEXT_IS_DESTROYED, CUDA_ERROR_INVALID_CONTEXT,
      CUDA_ERROR_INVALID_VALUE}},
    {"cuStreamGetId", true, {CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_HANDLE}},
    {"cuStreamGetId_ptsz", true, {CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_HANDLE}},
    {"cuMemCreate", true,
     {DOC_COMMON, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_INVALID_DEVICE,
      CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_SUPPORTED}},
    {"cuMemMap", true,
     {DOC_COMMON, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_OUT_OF_MEMORY,
      CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_ILLEGAL_STATE}},
    {"cuMemUnmap", true,
     {DOC_COMMON, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_SUPPORTED}},
    {"cuMemSetAccess", true,
     {CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_NOT_SUPPORTED}},
};

static const struct documented *documented_for(const char *name, CUresult code)
{
    for (size_t i = 0; i < sizeof documented / sizeof documented[0]; i++) {
        const struct documented *d = &documented[i];
        if (strcmp(d->name, name) != 0)
            continue;
        if (d->notefnerr &&
            (code == CUDA_ERROR_ILLEGAL_ADDRESS || code == CUDA_ERROR_LAUNCH_FAILED))
            return d;
        for (size_t k = 0; k < sizeof d->codes / sizeof d->codes[0]; k++)
            if (d->codes[k] == code && code != CUDA_SUCCESS)
                return d;
        return NULL;
    }
    return NULL;
}

/* One rule per entry point: its countdown (the call that takes it to 0
 * fails), the code, and whether every later call fails too (fired). */
static struct failure_rule {
    const char *name; /* documented[]'s, or NULL: a free slot */
    uint64_t countdown;
    CUresult code;
    bool sticky, fired;
} rules[sizeof documented / sizeof documented[0]];
static pthread_mutex_t rules_lock = PTHREAD_MUTEX_INITIALIZER;
atomic_uint failures_armed;

int failure_arm(const char *name, uint64_t n, CUresult code, bool sticky)
{
    const struct documented *d = name ? documented_for(name, code) : NULL;
    if (name && n && !d)
        return -1;
    pthread_mutex_lock(&rules_lock);
    struct failure_rule *r = NULL, *free_slot = NULL;
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        if (rules[i].name && name && strcmp(rules[i].name, name) == 0)
            r = &rules[i];
        else if (!rules[i].name && !free_slot)
            free_slot = &rules[i];
    }
    if (r) { /* replaced, or cleared (n == 0) */
        *r = (struct failure_rule){0};
        atomic_fetch_sub(&failures_armed, 1);
    } else {
        r = free_slot;
    }
    if (n) {
        *r = (struct failure_rule){.name = d->name, .countdown = n, .code = code, .sticky = sticky};
        atomic_fetch_add(&failures_armed, 1);
    }
    pthread_mutex_unlock(&rules_lock);
    return 0;
}

CUresult injected_failure(const char *symbol)
{
    CUresult code = CUDA_SUCCESS;
    pthread_mutex_lock(&rules_lock);
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        struct failure_rule *r = &rules[i];
        if (!r->name || strcmp(r->name, symbol) != 0)
            continue;
        if (r->fired || --r->countdown == 0) {
            code = r->code;
            r->fired = true;
            if (!r->sticky) { /* spent */
                *r = (struct failure_rule){0};
                atomic_fetch_sub(&failures_armed, 1);
            }
        }
        break;
    }
    pthread_mutex_unlock(&rules_lock);
    return code;
}

_Thread_local fctx *tls_ctx_stack[16];
_Thread_local int tls_ctx_depth;
/* The calling thread's per-thread default streams, one per context. */
static _Thread_local struct {
    fctx *ctx;
    fstream *s;
} tls_ptds[MAX_DEVICES + 8];
static _Thread_local int tls_nptds;
_Thread_local CUstreamCaptureMode tls_capture_mode; /* GLOBAL (0) by default */
/* Is the calling thread running a cuLaunchHostFunc host function? cuda.h:
 * "The host function must not make any CUDA API calls. Attempting to use a
 * CUDA API may result in CUDA_ERROR_NOT_PERMITTED, but this is not
 * required." The fake takes the harsher reading: every entry point that
 * checks initialisation (NEED_INIT) refuses such a call with that code, so
 * that a library which calls the driver from a host function (its own, or
 * one it wraps) is found here rather than deadlocking on a GPU. */
_Thread_local bool tls_in_host_fn;
static _Thread_local unsigned tls_thread;                  /* 0: not numbered yet */

fctx *current_ctx(void)
{
    return tls_ctx_depth ? tls_ctx_stack[tls_ctx_depth - 1] : NULL;
}

/* May work be created in context c? A destroyed context, or a primary one
 * not (or no longer) active, that is still current is
 * CUDA_ERROR_CONTEXT_IS_DESTROYED ("the context current to the calling
 * thread has been destroyed using cuCtxDestroy, or is a primary context
 * which has not yet been initialized", cuda.h); none at all is
 * CUDA_ERROR_INVALID_CONTEXT. */
CUresult ctx_usable(const fctx *c)
{
    return !c ? CUDA_ERROR_INVALID_CONTEXT : c->alive ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

/* Lock held: a small number naming the calling thread. */
unsigned this_thread(void)
{
    if (!tls_thread)
        tls_thread = ++G.next_thread;
    return tls_thread;
}

/* Host time, for events' records (cuEventElapsedTime). */
uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

uint64_t parse_bytes(const char *s)
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

/* A switch between two readings of the documentation: unset, `dflt`; "0",
 * off; anything else, on. */
static bool env_reading(const char *name, bool dflt)
{
    const char *v = getenv(name);
    return v ? strcmp(v, "0") != 0 : dflt;
}

/* Lock held. */
void configure(void)
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
    /* Where the documentation allows two readings, the harder one for the
     * shim is the default and "0" selects the other, except for cuMemFree's
     * synchronisation, which real clients rely on (fake_cuda.h). */
    G.legacy_skips_destroyed = env_reading("FAKECUDA_LEGACY_SKIPS_DESTROYED", true);
    G.free_no_sync = env_reading("FAKECUDA_FREE_NO_SYNC", false);
    G.stale_backtrace = getenv("FAKECUDA_STALE_BACKTRACE") != NULL;
}

/* Does ordinal d name a device? Calls whose cuda.h return list has
 * CUDA_ERROR_INVALID_DEVICE answer that when it does not ("the device
 * ordinal supplied by the user does not correspond to a valid CUDA
 * device"); those that list only CUDA_ERROR_INVALID_VALUE (cuDeviceGetMemPool,
 * cuDeviceSetMemPool, cuMemPoolCreate) answer that. G.ndev may be read
 * without the lock once cuInit has returned: it is set before the flag. */
bool is_device(int d)
{
    return d >= 0 && d < G.ndev;
}

/* Lock held: a new stream of context c (a created one with `flags`, or a
 * per-thread default stream), listed with all streams; NULL when host memory
 * runs out (CUDA_ERROR_OUT_OF_MEMORY, in the return lists of cuStreamCreate,
 * cuStreamCreateWithPriority and cuGreenCtxStreamCreate). */

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

fstream *new_stream(fctx *c, unsigned flags, bool per_thread)
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
CUstream stream_handle(fstream *s)
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
void count_stale_use_of(const char *what, const fctx *owner, const char *how)
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
fstream *stream_of(CUstream h)
{
    if (h == NULL || h == CU_STREAM_LEGACY) {
        fctx *c = current_ctx();
        return c && c->alive ? &c->legacy : NULL;
    }
    if (h == CU_STREAM_PER_THREAD) {
        /* As the legacy stream: none in a destroyed or inactive context
         * (cuda.h, CUDA_ERROR_CONTEXT_IS_DESTROYED: "the context current to
         * the calling thread has been destroyed using cuCtxDestroy, or is a
         * primary context which has not yet been initialized"; the special
         * handles name the current context's streams, cuStreamGetCtx).
         * Before, a per-thread stream was made for it, and work queued
         * there was taken. */
        fctx *c = current_ctx();
        return c && c->alive ? per_thread_stream(c) : NULL;
    }
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
fstream *ctl_stream_of(CUstream h)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return stream_of(h);
    fstream *s = cell_stream(h);
    return s && !s->dead ? s : NULL;
}

/* Lock held: the event a handle names, or NULL (stale handles counted). */
fevent *event_of(CUevent h)
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

bool live_capture(const fstream *s)
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
void invalidate_counted(fstream *o)
{
    if (!o->invalidated)
        G.st.capture_invalidations++;
    invalidate_capture(o);
}

/* Lock held: s stops capturing as it or its context goes; the origin of a
 * capture takes its forks with it (the fake's reading: cuda.h says nothing
 * of a capture whose origin stream is destroyed). */
void stop_capturing(fstream *s)
{
    if (s->capturing && s->capture_origin == s)
        end_capture_sequence(s->capture_seq);
    s->capturing = false;
}

/* Lock held: capture sequence `seq` is over (ended, or its origin destroyed
 * or dead): every stream of it stops capturing. (Sequence numbers are never
 * reused.) */
void end_capture_sequence(uint64_t seq)
{
    for (fstream *x = G.streams; x; x = x->next)
        if (x->capture_seq == seq) {
            x->capturing = false;
            x->capture_seq = 0;
            x->capture_origin = x->join_into = NULL;
        }
}

/* Lock held: does a blocking stream of c capture? */
bool blocking_capture_in(const fctx *c)
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
CUresult legacy_use(fstream *s)
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
CUresult status_asked(fstream *s)
{
    if (live_capture(s)) {
        invalidate_counted(s);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return s->legacy ? legacy_blocked(s->ctx) : CUDA_SUCCESS;
}

/* Lock held: the origin of the capture e was last recorded in, while that
 * capture is under way; else NULL. */
fstream *live_capture_of(const fevent *e)
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
CUresult captured_event_asked(const fevent *e)
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
CUresult capture_usable(const fstream *s)
{
    return live_capture(s) && s->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
                                             : CUDA_SUCCESS;
}

/* Lock held: may work (a copy, a memset, a host function, a kernel) be
 * queued on s? The legacy stream's rule first (legacy_use: counted, and a
 * blocking stream's capture invalidated), then an invalidated capture's
 * refusal (capture_usable). */
CUresult work_usable(fstream *s)
{
    CUresult r = legacy_use(s);
    return r == CUDA_SUCCESS ? capture_usable(s) : r;
}

/* Lock held: may the calling thread make a "potentially unsafe" call now
 * (cuThreadExchangeStreamCaptureMode's rules)? If not, the captures it
 * conflicts with are invalidated and the call is refused. */
CUresult unsafe_call(void)
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
void enqueue(fstream *s, work_item w)
{
    if (s->nqueue == s->capqueue) {
        s->capqueue = s->capqueue ? s->capqueue * 2 : 16;
        s->queue = realloc(s->queue, s->capqueue * sizeof *s->queue);
    }
    s->queue[s->nqueue++] = w;
}

/* Lock held: has stream o work queued that a new operation of the legacy
 * stream in its context must wait for? Blocking streams do, destroyed ones
 * (whose queued work goes on) only with FAKECUDA_LEGACY_SKIPS_DESTROYED=0,
 * captured work does not run. */
static bool legacy_must_wait_for(const fstream *o, const fctx *c)
{
    /* (a destroyed stream's queued work: whether the legacy stream waits
     * for it is not documented: "the legacy default stream ... waits on all
     * blocking streams" (stream synchronisation behaviour) names no
     * destroyed ones, and cuStreamDestroy says only that its work
     * completes (cuda.h); not waited for, the harder reading for the shim,
     * unless FAKECUDA_LEGACY_SKIPS_DESTROYED=0 takes the other) */
    return o->ctx == c && blocking(o) && !o->dead && !live_capture(o) &&
           !(G.legacy_skips_destroyed && o->destroyed) &&
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
dep *implicit_deps(const fstream *s, size_t *n)
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
uint64_t submit(fstream *s, fakecuda_work fn, void *arg)
{
    implicit_join(s);
    uint64_t seq = ++s->submitted;
    if (fn)
        enqueue(s, (work_item){.seq = seq, .fn = fn, .arg = arg});
    return seq;
}

/* Lock held: appends the program's host function fn (cuLaunchHostFunc),
 * which runs with its CUDA calls refused (tls_in_host_fn). */
void submit_host_fn(fstream *s, CUhostFn fn, void *arg)
{
    implicit_join(s);
    enqueue(s, (work_item){.seq = ++s->submitted, .fn = (fakecuda_work)fn, .arg = arg,
                           .host_fn = true});
}

/* Outside the lock: runs callback w, a host function with its CUDA calls
 * refused. */
static void run_work(const work_item *w)
{
    tls_in_host_fn = w->host_fn;
    w->fn(w->arg);
    tls_in_host_fn = false;
}

/* Lock held: an operation the program issues on a capturing stream "will
 * not be executed, but will instead be captured into a graph"
 * (cuStreamBeginCapture, cuda.h): it takes its place in the stream and
 * never runs here (the fake launches no graphs). True when s captures and
 * the operation was taken so; the caller then frees its payload. */
bool captured_instead(fstream *s)
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
bool stream_done_to(const fstream *s, uint64_t seq)
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
void gather(fstream *s, uint64_t upto, work_item **all, size_t *nall)
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
 * calls" (cuLaunchHostFunc): a program's host function has its calls
 * refused (tls_in_host_fn); a test's work (fakecuda_api's launch) may make
 * them, and then their batch runs at once
 * rather than wait for its own turn to end, as part of the batch running
 * (batch_being_gathered): what it completes counts as done once that batch
 * has run. */
void unlock_and_run(work_item *w, size_t n)
{
    if (in_callbacks) {
        pthread_mutex_unlock(&G.lock);
        for (size_t i = 0; i < n; i++)
            run_work(&w[i]);
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
        run_work(&w[i]);
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
void complete_and_unlock(fstream *s)
{
    work_item *w = NULL;
    size_t n = 0;
    if (s)
        gather(s, s->submitted, &w, &n);
    unlock_and_run(w, n);
}

bool completing_ctx(const fctx *c, const completion *w)
{
    if (!w->only)
        return w->dev < 0 || c->dev == w->dev;
    return c == w->only || (w->greens && w->only->primary && c->green && c->dev == w->only->dev);
}

/* Lock held on entry, released on return: completes every stream of the
 * contexts completing_ctx names and runs the callbacks. */
void complete_where_and_unlock(const completion *w)
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
void complete_everything_and_unlock(fctx *only)
{
    complete_where_and_unlock(&(completion){only, -1, false});
}

/* Lock held: completes s if the fake runs with FAKECUDA_AUTOCOMPLETE. */
void maybe_autocomplete_and_unlock(fstream *s)
{
    if (G.autocomplete && s)
        complete_and_unlock(s);
    else
        pthread_mutex_unlock(&G.lock);
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
