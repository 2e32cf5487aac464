/*
 * e2e_plugin.c - the C interface reached the way the Python plug-ins reach
 * it without LD_PRELOAD: libbfcshim.so opened with dlopen(RTLD_LOCAL), as
 * ctypes.CDLL does, so its exports interpose nothing and the library never
 * sees the program's streams. The program makes its streams through the
 * driver it opened itself (as Numba, or a PyTorch stream handed to Numba,
 * would). A plain free (bfcshim_free, the Numba plug-in's) must still not
 * hand its block to a new allocation while work on such a stream may use
 * it. Scenarios:
 *
 *   plain   a pool filled around one hole; work queued on an unseen
 *           non-blocking stream uses the hole; after bfcshim_free the next
 *           allocation of its size must not be the hole while that work is
 *           pending; one context synchronisation makes it reusable
 *   plain-global  the same with the library opened RTLD_GLOBAL before the
 *           driver: its cuStreamCreate is the global scope's, yet the
 *           program's dlsym is libc's, so it still sees no stream
 *   trim    (growth mode, over virtual memory) bfcshim_trim gives back a
 *           freed block only after the unseen stream's work on it ran
 *   trim-after-reset, free-after-reset, free-async-after-reset  the
 *           program resets the device unseen and allocates at the old
 *           block's address: bfcshim_trim, and a plug-in's late frees
 *           (plain and stream-ordered, on a stream of the dead context),
 *           reach neither that allocation nor a dead handle
 *   reused-handle  (FAKECUDA_REUSE_STREAM_HANDLES: the fake hands a
 *           destroyed stream's handle to the next stream made, as a real
 *           driver may) a block freed stream-ordered on a stream the
 *           program then destroys, its work still queued, is not taken in
 *           stream order by the new stream under the same handle (a
 *           pool filled around the block, as in plain)
 *   cross-context, cross-context-reused  (found by an audit) a stream-
 *           ordered free of a device-0 block on a device-1 stream, which
 *           the program then destroys (and, reused, makes again on device
 *           0 under the same handle): a plain allocation must not get the
 *           block while the destroyed stream's work is queued, nor touch
 *           the dead handle
 *   cross-context-dead  (found by an audit) the same free on the device-1
 *           stream after the program destroyed it, its work still queued:
 *           refused as CUDA refuses a dead handle, and the block not handed
 *           out under that work
 *   lane-growth  400 streams used once and destroyed unseen: the pool's
 *           metadata stops growing (a bounded lane table)
 *   query-during-capture  a block freed stream-ordered, its stream's work
 *           done, asked for again while the program captures a stream in
 *           global mode: the library sees no capture begin, so the event
 *           query that finds the block reusable must be made in relaxed
 *           mode, and the capture ends with its graph
 *   trim-during-capture  (BFCSHIM_FREE_POLICY=immediate, growing over
 *           virtual memory; found by an audit) bfcshim_trim of device 0's
 *           pool while the program captures on a device-1 stream in global
 *           mode: the context synchronisation that lets the memory go is
 *           made in relaxed mode, the capture ends with its graph, and the
 *           memory goes back (before: the capture was invalidated, nothing
 *           went back)
 *   legacy-lane  (found by the per-thread audit) work on a blocking stream
 *           uses a block, which is freed stream-ordered on the legacy
 *           stream and allocated there again (at once, in stream order),
 *           then used on another blocking stream: CUDA orders the new work
 *           after the old (the free is a legacy-stream action), so the
 *           plug-in's free must make the legacy stream act
 *   record-refused  a block recorded on a stream whose work still uses it,
 *           whose first free (PyTorch's, on the legacy stream while a
 *           blocking stream captures) is refused: the record still holds
 *           at the free that goes through (before, the refused free had
 *           forgotten it)
 *   record-capture-ends, record-legacy-capture-ends  a recorded block's
 *           stream-ordered free on a stream that captures (on the legacy
 *           stream while a blocking stream captures) when the free asks
 *           about it, the capture ended by another thread right after
 *           (the fake's after_stream_is_capturing): the free must not put
 *           the block in the stream's order without its wait for the
 *           recorded stream (before, a second question found the stream
 *           usable and it did: the next owner ran under the old work)
 *   record-other-current-{async,torch}-{pool,current}  a recorded
 *           device-0 block freed stream-ordered on handle 0 with device
 *           1's context current, a blocking stream capturing in the
 *           block's (pool) or the current context: bfcshim_free_async's 0
 *           is the current context's legacy stream, bfcshim_torch_free's
 *           the block's; the free on the blocked one is refused, the other
 *           goes through, and the block is neither lost nor handed out
 *           under the recorded stream's work (found by an audit: async-pool
 *           kept the block for good, the record having asked about the
 *           block's context's legacy stream)
 *   record-other-current-async-pool-legacy  async-pool with the handle
 *           CU_STREAM_LEGACY for 0 (the same stream; found by mutation
 *           testing: only 0 was tried)
 *   record-zero-other-current-async-{current,pool}  the async cases above,
 *           the block also recorded on handle 0 (some device's default
 *           stream): refused on the blocked current context's legacy
 *           stream, freed on a usable one, never kept for good
 *   torch-free-other-current  bfcshim_torch_free of a device-0 block on
 *           device 0's default stream (0, with its device) while device 1
 *           is current, no record, work on device 0's default stream still
 *           writing it: a plain allocation and one on another stream get it
 *           only after that work; device 0's default stream may at once, its
 *           next owner's work there running after the old
 *   record-current-async  a recorded block freed by bfcshim_free_async on
 *           handle 0 with its own context current: the legacy stream's
 *           next owner comes after the recorded non-blocking stream's work
 *           (found by mutation testing: nothing failed when every such
 *           free was handled as another context's)
 *   record-zero-other-device  record_stream(t, 0) meaning device 1's
 *           default stream, whose work reads the device-0 block: its next
 *           owner on its stream comes after that work
 *   record-zero-ctxid-fails  the same, one cuCtxGetId failing at the
 *           free (fail_call, CUDA_ERROR_ILLEGAL_ADDRESS): whether device
 *           0's pool's context, then device 1's, is still the pool's is not
 *           known. Found by an audit: the failure was read as "replaced":
 *           device 0's live pool was forgotten and its memory given back
 *           under the queued work (which faulted), and device 1's default
 *           stream was passed over (the next owner's work ran first)
 *   record-zero-reset  a block recorded on handle 0 (any device's default
 *           stream) freed after the program reset device 1 unseen and
 *           made its primary context again: the free neither hangs nor
 *           keeps the block
 *   record-threads  two threads record (on a stream, and on handle 0) and
 *           free blocks while a third makes and destroys streams, captures
 *           on a blocking one and resets device 1 unseen: no block comes
 *           back under its recorded stream's write, no deadlock (TSan)
 *   dlclose (BFCSHIM_TRACE) the host unloads the library after a pooled
 *           allocation and free: it stays loaded (the trace's writer
 *           thread runs its code; before, that thread faulted once the
 *           code was unmapped), and opened again it has the same pool
 *   cost    10,000 allocation and free pairs with nothing queued (a 256 MiB
 *           pool, at most 64 MiB live): the driver calls they cost
 *           (printed), none of them an event, and one context
 *           synchronisation only when the pool has nothing else to give
 *
 * LIBBFCSHIM names the library (set by meson).
 */
#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

#include "e2e.h"

#define MiB ((size_t)1 << 20)

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*DevicePrimaryCtxReset)(CUdevice);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*StreamBeginCapture)(CUstream, CUstreamCaptureMode);
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*GraphDestroy)(CUgraph);
} D;

static struct {
    int (*malloc)(void **, size_t, int);
    int (*free)(void *);
    int (*mem_get_info)(int, size_t *, size_t *);
    size_t (*trim)(void);
    size_t (*stats_json)(char *, size_t);
    int (*free_async)(void *, void *);
    int (*malloc_async)(void **, size_t, int, void *);
    void *(*torch_alloc)(ssize_t, int, void *);
    void (*torch_free)(void *, size_t, int, void *);
    void (*torch_record_stream)(void *, void *);
} B;

static const fakecuda_api *F;
static void *lib; /* the library's handle (dlclose scenario) */

/* The library as a plug-in (RTLD_LOCAL), the driver as a framework opens
 * it, device 0's primary context current. */
static void start(void)
{
    const char *path = getenv("LIBBFCSHIM");
    /* PLUGIN_GLOBAL: opened RTLD_GLOBAL before the driver (ctypes with
     * mode=RTLD_GLOBAL): its cuStreamCreate is then the global scope's, but
     * the program's dlsym is still libc's, so it still sees no stream. */
    int scope = getenv("PLUGIN_GLOBAL") ? RTLD_GLOBAL : RTLD_LOCAL;
    lib = path ? dlopen(path, RTLD_NOW | scope) : NULL;
    if (!lib) {
        fprintf(stderr, "dlopen(LIBBFCSHIM=%s): %s\n", path ? path : "(unset)", dlerror());
        exit(1);
    }
    *(void **)&B.malloc = e2e_dlsym(lib, "bfcshim_malloc");
    *(void **)&B.free = e2e_dlsym(lib, "bfcshim_free");
    *(void **)&B.mem_get_info = e2e_dlsym(lib, "bfcshim_mem_get_info");
    *(void **)&B.trim = e2e_dlsym(lib, "bfcshim_trim");
    *(void **)&B.stats_json = e2e_dlsym(lib, "bfcshim_stats_json");
    *(void **)&B.free_async = e2e_dlsym(lib, "bfcshim_free_async");
    *(void **)&B.malloc_async = e2e_dlsym(lib, "bfcshim_malloc_async");
    *(void **)&B.torch_alloc = e2e_dlsym(lib, "bfcshim_torch_alloc");
    *(void **)&B.torch_free = e2e_dlsym(lib, "bfcshim_torch_free");
    *(void **)&B.torch_record_stream = e2e_dlsym(lib, "bfcshim_torch_record_stream");
    void *cu = e2e_open_libcuda();
    *(void **)&D.Init = e2e_dlsym(cu, "cuInit");
    *(void **)&D.DevicePrimaryCtxRetain = e2e_dlsym(cu, "cuDevicePrimaryCtxRetain");
    *(void **)&D.CtxSetCurrent = e2e_dlsym(cu, "cuCtxSetCurrent");
    *(void **)&D.StreamCreate = e2e_dlsym(cu, "cuStreamCreate");
    *(void **)&D.StreamDestroy = e2e_dlsym(cu, "cuStreamDestroy_v2");
    *(void **)&D.DevicePrimaryCtxReset = e2e_dlsym(cu, "cuDevicePrimaryCtxReset_v2");
    *(void **)&D.MemAlloc = e2e_dlsym(cu, "cuMemAlloc_v2");
    *(void **)&D.StreamBeginCapture = e2e_dlsym(cu, "cuStreamBeginCapture_v2");
    *(void **)&D.StreamEndCapture = e2e_dlsym(cu, "cuStreamEndCapture");
    *(void **)&D.GraphDestroy = e2e_dlsym(cu, "cuGraphDestroy");
    F = fakecuda();
    CUcontext c0;
    CHECK_EQ(D.Init(0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
}

static void *must_alloc(size_t size)
{
    void *p = NULL;
    int r = B.malloc(&p, size, 0);
    if (r != 0 || !p)
        e2e_alloc_failed("bfcshim_malloc", size, r);
    return p;
}

static size_t pool_free_bytes(void)
{
    size_t f = 0, t = 0;
    CHECK_EQ(B.mem_get_info(0, &f, &t), 0);
    return f;
}

/* A field of the first pool in bfcshim_stats_json. */
static long long pool_stat(const char *name)
{
    static char text[1 << 16];
    B.stats_json(text, sizeof text);
    return shim_stats_field(text, name);
}

static void write_mib(void *arg) { memset(arg, 0x5a, MiB); }

static void plain(void)
{
    start();
    void *hole = must_alloc(MiB);
    void *filler = must_alloc(pool_free_bytes() - MiB / 2); /* only the hole is left */
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(F->launch(s, write_mib, hole), 0);
    const fakecuda_stats s0 = fake_stats();
    CHECK_EQ(B.free(hole), 0);
    void *q = must_alloc(MiB);
    if (q == hole && F->pending(s)) {
        fprintf(stderr, "the freed block was handed out with work still queued on a stream "
                        "the library never saw\n");
        e2e_failures++;
    }
    CHECK(q == hole); /* once that work is done, the hole is free again */
    /* What it cost: one context synchronisation, no event. */
    CHECK_EQ(fake_stats().ctx_synchronize_calls - s0.ctx_synchronize_calls, 1);
    CHECK_EQ(fake_stats().event_records, s0.event_records);
    CHECK_EQ(pool_stat("num_context_syncs"), 1);
    CHECK_EQ(B.free(q), 0);
    CHECK_EQ(B.free(filler), 0);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    F->complete_all();
}

/* dlclose: a host that unloads its plug-in while the pools (and the trace's
 * writer thread, BFCSHIM_TRACE) live. The library must stay: the writer
 * runs its code, the pools keep the driver's memory, and its exit handler
 * reports at the process's exit. Opened again, it is the same library
 * with the same pool. */
static void unload(void)
{
    start();
    void *p = must_alloc(MiB);
    CHECK_EQ(B.free(p), 0);
    CHECK_EQ(dlclose(lib), 0);
    /* a few of the writer's ticks (4 ms): unmapped, its next one faults */
    nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    lib = dlopen(getenv("LIBBFCSHIM"), RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL);
    if (!lib)
        return;
    *(void **)&B.stats_json = e2e_dlsym(lib, "bfcshim_stats_json");
    CHECK_EQ(pool_stat("num_allocs"), 1); /* the pool from before the dlclose */
}

/* Writes the block if it is still mapped when the work runs. No fork here
 * (e2e_touch_dies): this runs inside the shim's cuCtxSynchronize. */
typedef struct late_write {
    void *at;
    bool ran, faulted;
} late_write;

static void write_if_mapped(void *arg)
{
    late_write *w = arg;
    uintptr_t at = (uintptr_t)w->at;
    w->faulted = !F->is_device_pointer(at) || !F->is_device_pointer(at + 8 * MiB - 1);
    if (!w->faulted)
        memset(w->at, 0x5a, 8 * MiB);
    w->ran = true;
}

/* The program resets the device behind the library's back (Numba's
 * cuda.close(), a cudaDeviceReset: the library, not preloaded, sees
 * neither), makes its primary context again and allocates 8 MiB with the
 * driver, at the address where the pool's block was: returns it. */
static CUdeviceptr reset_and_take_the_address(void)
{
    CUcontext c0;
    CHECK_EQ(D.DevicePrimaryCtxReset(0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    CUdeviceptr mine = 0;
    CHECK_EQ(D.MemAlloc(&mine, 8 * MiB), CUDA_SUCCESS);
    return mine;
}

static void expect_still_mapped(CUdeviceptr mine, const char *who)
{
    if (!F->is_device_pointer(mine) || !F->is_device_pointer(mine + 8 * MiB - 1)) {
        fprintf(stderr, "%s freed the program's own allocation 0x%llx\n", who,
                (unsigned long long)mine);
        e2e_failures++;
    }
}

/* trim-after-reset: bfcshim_trim must not give back the old pool's region,
 * which went with the old context (its address is the program's now). */
static void trim_after_reset(void)
{
    start();
    CHECK_EQ(B.free(must_alloc(8 * MiB)), 0);
    CUdeviceptr mine = reset_and_take_the_address();
    const fakecuda_stats s0 = fake_stats();
    B.trim();
    expect_still_mapped(mine, "bfcshim_trim");
    CHECK_EQ(fake_stats().mem_free_calls, s0.mem_free_calls);
}

/* free-after-reset, free-async-after-reset: a plug-in's late free of a
 * block whose context went must reach neither the driver (it would free
 * the program's allocation now at that address) nor a dead stream. */
static void free_after_reset_with(bool async)
{
    start();
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *p = must_alloc(8 * MiB);
    void *q = must_alloc(MiB);
    CUdeviceptr mine = reset_and_take_the_address();
    const fakecuda_stats s0 = fake_stats();
    for (int i = 0; i < 2; i++) { /* the first late free forgets the pool, the second finds it dead */
        void *late = i ? q : p;
        CHECK_EQ(async ? B.free_async(late, s) : B.free(late), CUDA_SUCCESS);
    }
    const fakecuda_stats s1 = fake_stats();
    expect_still_mapped(mine, "the plug-in's free");
    CHECK_EQ(s1.stale_handle_uses, s0.stale_handle_uses);
    CHECK_EQ(s1.mem_free_calls, s0.mem_free_calls);
    CHECK_EQ(s1.mem_free_async_calls, s0.mem_free_async_calls);
}

static void free_after_reset(void) { free_after_reset_with(false); }
static void free_async_after_reset(void) { free_after_reset_with(true); }

static void trim(void)
{
    start();
    const uint64_t before = fake_stats().bytes_in_use[0];
    late_write w = {.at = must_alloc(8 * MiB)};
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(F->launch(s, write_if_mapped, &w), 0);
    CHECK_EQ(B.free(w.at), 0);
    CHECK(B.trim() >= 8 * MiB); /* after one context synchronisation */
    CHECK(w.ran);
    CHECK(!w.faulted);
    CHECK_EQ(fake_stats().bytes_in_use[0], before);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
}

static void *must_alloc_on(CUstream s, size_t size)
{
    void *p = NULL;
    int r = B.malloc_async(&p, size, 0, s);
    if (r != 0 || !p)
        e2e_alloc_failed("bfcshim_malloc_async", size, r);
    return p;
}

static void write_once(void *arg)
{
    late_write *w = arg;
    memset(w->at, 0x5a, MiB);
    w->ran = true;
}

static void reused_handle(void)
{
    start();
    CUstream old, made;
    CHECK_EQ(D.StreamCreate(&old, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *block = must_alloc_on(old, MiB);
    void *filler = must_alloc(pool_free_bytes() - MiB / 2); /* only the block is left */
    late_write w = {.at = block};
    CHECK_EQ(F->launch(old, write_once, &w), 0);
    CHECK_EQ(B.free_async(block, old), 0);
    CHECK_EQ(D.StreamDestroy(old), CUDA_SUCCESS); /* its work goes on */
    CHECK_EQ(D.StreamCreate(&made, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK(made == old); /* the fake reuses the handle at once */
    void *q = must_alloc_on(made, MiB);
    if (q == block && !w.ran) { /* (F->pending(old) would ask about the new stream) */
        fprintf(stderr, "a new stream under a destroyed stream's handle took, in stream order, "
                        "a block that the destroyed stream's queued work still uses\n");
        e2e_failures++;
    }
    CHECK(q == block); /* after waiting for that work: nothing else was free */
    CHECK_EQ(B.free_async(q, made), 0);
    CHECK_EQ(B.free(filler), 0);
    CHECK_EQ(D.StreamDestroy(made), CUDA_SUCCESS);
    F->complete_all();
}

/* A stream-ordered free on a stream of another context (device 1's
 * stream, device 0's block: cudaFreeAsync allows any stream). The seal at
 * the free records device 0's event on device 1's stream and is refused
 * (cuEventRecord: same context or CUDA_ERROR_INVALID_HANDLE), so the epoch
 * stays open on a lane keyed on that handle. The program destroys the
 * stream (unseen) and makes one on device 0, which the driver gives the
 * same handle; no stream-ordered call names that handle again, so the lane
 * is never retired. A plain allocation's seal-all then records the stale
 * lane's fence on the new stream: its completion says nothing about the
 * destroyed stream's queued work, and the block is handed out under it. */
/* The start of the cross-context scenarios: a non-blocking stream of device
 * 1 (returned), device 0 current again, a 1 MiB block of device 0's pool
 * with only it left free beside the filler, and work queued on device 1's
 * stream that writes the block later (*w). */
static CUstream block_under_other_device_work(void **block, void **filler, late_write *w)
{
    CUcontext c0, c1;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    CUstream other;
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    *block = must_alloc(MiB);
    *filler = must_alloc(pool_free_bytes() - MiB / 2); /* only the block is left */
    *w = (late_write){.at = *block};
    CHECK_EQ(F->launch(other, write_once, w), 0);
    return other;
}

static void cross_context_reused(void)
{
    start();
    void *block, *filler;
    late_write w;
    CUstream made, other = block_under_other_device_work(&block, &filler, &w);
    CHECK_EQ(B.free_async(block, other), 0);
    CHECK_EQ(D.StreamDestroy(other), CUDA_SUCCESS); /* its work goes on */
    CHECK_EQ(D.StreamCreate(&made, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS); /* device 0 */
    fprintf(stderr, "handle reused: %s\n", made == other ? "yes" : "no");
    const fakecuda_stats s0 = fake_stats();
    void *q = NULL;
    int r = B.malloc(&q, MiB, 0);
    const fakecuda_stats s1 = fake_stats();
    fprintf(stderr, "plain malloc: r=%d q==block=%d work ran=%d stale handle uses +%llu\n", r,
            q == block, w.ran, (unsigned long long)(s1.stale_handle_uses - s0.stale_handle_uses));
    if (q == block && !w.ran) {
        fprintf(stderr, "the block was handed out while the destroyed stream's "
                        "queued work still uses it\n");
        e2e_failures++;
    }
    if (s1.stale_handle_uses != s0.stale_handle_uses) {
        fprintf(stderr, "the library used a destroyed stream's handle\n");
        e2e_failures++;
    }
    F->complete_all();
    if (q)
        B.free(q);
    B.free(filler);
    D.StreamDestroy(made);
}

/* cross-context-dead: a stream-ordered free of a device-0 block on a
 * device-1 stream the program destroyed (unseen) with its work still
 * queued. The handle names no stream: CUDA refuses the free, and so must
 * the library, the block staying the program's. Found by an audit: the
 * library asked the dead handle's context, was refused, and put the block
 * in the plain lane with no wait and a success; that lane's fence (a
 * cuCtxSynchronize of device 0's context) does not wait for device 1's
 * work, and the block came back under it. */
static void cross_context_dead(void)
{
    start();
    void *block, *filler;
    late_write w;
    CUstream other = block_under_other_device_work(&block, &filler, &w);
    CHECK_EQ(D.StreamDestroy(other), CUDA_SUCCESS); /* its work goes on */
    const uint64_t stale = fake_stats().stale_handle_uses;
    CHECK_EQ(B.free_async(block, other), CUDA_ERROR_INVALID_HANDLE);
    /* the library's questions about the handle (whether it captures, its
     * id, its context: as a plug-in it sees no stream go), where the
     * program's own free would have handed it to the driver */
    CHECK(fake_stats().stale_handle_uses <= stale + 3);
    void *q = NULL;
    if (B.malloc(&q, MiB, 0) == CUDA_SUCCESS && q == block && !w.ran) {
        fprintf(stderr, "a block freed on a dead stream of device 1 was handed out while "
                        "that stream's queued work still uses it\n");
        e2e_failures++;
    }
    F->complete_all();
    if (q != block)
        CHECK_EQ(B.free(block), 0); /* refused: still the program's */
    if (q)
        CHECK_EQ(B.free(q), 0);
    q = must_alloc(MiB); /* back: nothing else fits */
    CHECK_EQ(B.free(q), 0);
    CHECK_EQ(B.free(filler), 0);
}

/* Lanes of streams destroyed unseen, whose handles are never reused,
 * cannot be closed at the destroy: the table keeps a bounded number, not
 * one lane (and its bins) per stream ever used. */
static void lane_growth(void)
{
    start();
    long long first = -1, before = -1;
    for (int i = 0; i < 400; i++) {
        CUstream s;
        CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
        void *p = must_alloc_on(s, MiB);
        CHECK_EQ(B.free_async(p, s), 0);
        CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
        if (i == 0)
            first = pool_stat("host_metadata_bytes");
        if (i == 199)
            before = pool_stat("host_metadata_bytes");
    }
    long long after = pool_stat("host_metadata_bytes");
    fprintf(stderr, "host_metadata_bytes after 1 stream: %lld, 200: %lld, 400: %lld\n", first,
            before, after);
    /* Bounded: the table keeps a few lanes, not one per stream ever used. */
    if (after > before + 4096) {
        fprintf(stderr, "lanes of streams destroyed unseen keep growing the pool's metadata\n");
        e2e_failures++;
    }
}

static void nothing(void *arg) { (void)arg; }

static void write_a5(void *arg) { memset(arg, 0xa5, MiB); }

/* Block q's next owner writes it on stream s as early as the driver allows
 * (then `also` runs, or all the rest): the work queued before the block
 * went back must have run first, so the new owner's bytes are the last. */
static void expect_new_owner_last(void *q, CUstream s, CUstream also, const char *what)
{
    CHECK_EQ(F->launch(s, write_a5, q), 0);
    F->complete(s);
    if (also)
        F->complete(also);
    else
        F->complete_all();
    const unsigned char *c = q;
    if (c[0] != 0xa5 || c[MiB - 1] != 0xa5) {
        fprintf(stderr, "%s: the earlier work ran after the block's next owner's\n", what);
        e2e_failures++;
    }
}

static void legacy_lane(void)
{
    start();
    CUstream old, next;
    CHECK_EQ(D.StreamCreate(&old, 0), CUDA_SUCCESS); /* blocking, both */
    CHECK_EQ(D.StreamCreate(&next, 0), CUDA_SUCCESS);
    void *block = must_alloc_on(CU_STREAM_LEGACY, MiB);
    CHECK_EQ(F->launch(old, write_mib, block), 0); /* 0x5a, the old owner's */
    CHECK_EQ(B.free_async(block, CU_STREAM_LEGACY), 0);
    void *q = must_alloc_on(CU_STREAM_LEGACY, MiB);
    CHECK(q == block); /* in stream order, at once */
    expect_new_owner_last(q, next, NULL, "legacy lane");
    CHECK_EQ(B.free_async(q, CU_STREAM_LEGACY), 0);
    CHECK_EQ(D.StreamDestroy(old), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(next), CUDA_SUCCESS);
    F->complete_all();
}

/* A tensor on device 0's default stream, recorded on stream b whose work
 * (0x5a) still uses it, freed by PyTorch on the legacy stream while a
 * blocking stream of device 0 captures: the free is refused
 * (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) and the block stays the program's.
 * Freed again once the capture is over, the record must still hold: the
 * legacy stream's next allocation may get the block in stream order, and
 * its work (0xa5) must then run after b's. */
static void record_refused(void)
{
    start();
    CUstream b, cap;
    CHECK_EQ(D.StreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&cap, 0), CUDA_SUCCESS); /* blocking */
    void *t = must_alloc_on(NULL, MiB);
    CHECK_EQ(F->launch(b, write_mib, t), 0); /* 0x5a, b's */
    B.torch_record_stream(t, b);
    CHECK_EQ(D.StreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    const uint64_t frees = (uint64_t)pool_stat("num_frees");
    B.torch_free(t, MiB, 0, NULL); /* refused */
    CHECK_EQ((uint64_t)pool_stat("num_frees"), frees);
    CUgraph g = NULL;
    D.StreamEndCapture(cap, &g); /* invalidated by the refusal's legacy use */
    if (g)
        CHECK_EQ(D.GraphDestroy(g), CUDA_SUCCESS);
    B.torch_free(t, MiB, 0, NULL); /* again: now it goes through */
    void *q = must_alloc_on(NULL, MiB);
    if (q == t)
        expect_new_owner_last(q, CU_STREAM_LEGACY, NULL, "after a refused free");
    F->complete_all();
    B.torch_free(q, MiB, 0, NULL);
    CHECK_EQ(D.StreamDestroy(b), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(cap), CUDA_SUCCESS);
    F->complete_all();
}

/* record-capture-ends, record-legacy-capture-ends: the free's stream S
 * (a stream of its own; the legacy stream, blocked by a blocking stream's
 * capture) is unusable when the free asks about it for the record, and
 * nothing is queued on it; another thread ends the capture right after
 * that question (the fake's after_stream_is_capturing hook). The free must
 * act on that answer, not on a later one finding S usable: a block freed
 * in S's stream order with no wait for b, the recorded stream whose work
 * (0x5a) still uses it, comes back to S's next allocation under that
 * work. */
typedef struct capture_end {
    CUstream s;
    CUgraph g;
    bool ran;
} capture_end;

static void end_capture(void *arg)
{
    capture_end *c = arg;
    c->ran = true;
    CHECK_EQ(D.StreamEndCapture(c->s, &c->g), CUDA_SUCCESS);
}

static void record_capture_ends_on(bool legacy)
{
    start();
    CUstream a, b, cap;
    CHECK_EQ(D.StreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&cap, 0), CUDA_SUCCESS); /* blocking */
    CUstream s = legacy ? NULL : a; /* the free's */
    void *t = must_alloc_on(s, MiB);
    CHECK_EQ(F->launch(b, write_mib, t), 0); /* 0x5a, b's */
    B.torch_record_stream(t, b);
    capture_end c = {.s = legacy ? cap : a};
    CHECK_EQ(D.StreamBeginCapture(c.s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    F->after_stream_is_capturing(1, end_capture, &c);
    B.torch_free(t, MiB, 0, s);
    F->after_stream_is_capturing(0, NULL, NULL);
    CHECK(c.ran);
    if (c.g)
        CHECK_EQ(D.GraphDestroy(c.g), CUDA_SUCCESS);
    void *q = must_alloc_on(s, MiB);
    if (q == t)
        expect_new_owner_last(q, legacy ? CU_STREAM_LEGACY : a, NULL,
                              legacy ? "legacy stream's capture ended after the question"
                                     : "capture ended after the question");
    F->complete_all();
    B.torch_free(q, MiB, 0, s);
    CHECK_EQ(D.StreamDestroy(a), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(b), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(cap), CUDA_SUCCESS);
    F->complete_all();
}

static void record_capture_ends(void) { record_capture_ends_on(false); }
static void record_legacy_capture_ends(void) { record_capture_ends_on(true); }

/* record_stream(t, 0) as PyTorch's plug-in makes it: 0 is the default
 * stream of any device (no device is passed), here device 1's, whose work
 * reads the device-0 block; the library loaded as a plug-in (its pools are
 * not known as primary contexts'). The block's next owner on its stream
 * must come after device 1's legacy stream's work. */
static void record_zero_other_device_with(uint64_t id_fails)
{
    start();
    CUstream a;
    CHECK_EQ(D.StreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *t = must_alloc_on(a, MiB);
    CUcontext c0, c1;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    void *one = NULL;
    CHECK_EQ(B.malloc(&one, MiB, 1), 0); /* device 1's pool */
    CHECK_EQ(F->launch(CU_STREAM_LEGACY, write_mib, t), 0); /* 0x5a, device 1's default stream */
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    B.torch_record_stream(t, NULL); /* under the tensor's device guard */
    if (id_fails) /* the id_fails'th cuCtxGetId of the free fails */
        CHECK_EQ(F->fail_call("cuCtxGetId", id_fails, CUDA_ERROR_ILLEGAL_ADDRESS, 0), 0);
    B.torch_free(t, MiB, 0, a);
    CHECK_EQ(F->fail_call("cuCtxGetId", 0, 0, 0), 0);
    void *q = must_alloc_on(a, MiB);
    if (q == t)
        expect_new_owner_last(q, a, NULL, "recorded on 0 (device 1's default stream)");
    F->complete_all();
    B.torch_free(q, MiB, 0, a);
    CHECK_EQ(D.StreamDestroy(a), CUDA_SUCCESS);
}

static void record_zero_other_device(void) { record_zero_other_device_with(0); }

/* record-zero-ctxid-fails: the same, while one cuCtxGetId of the free
 * answers CUDA_ERROR_ILLEGAL_ADDRESS (fail_call; once, though a real fault's
 * would stay), which says nothing of the context: the first (is device 0's
 * pool's context still its own?) and then the second (device 1's, whose
 * default stream's work may still read the block). */
static void record_zero_ctxid_fails(void)
{
    record_zero_other_device_with(1);
    record_zero_other_device_with(2);
}

/* record-other-current-*: a device-0 block, recorded on device 0's stream b
 * whose work (0x5a) still uses it, freed stream-ordered on handle 0 while
 * device 1's context is current and a blocking stream captures in one of
 * the two contexts (that context's legacy stream blocked; cuda.h,
 * cuStreamIsCapturing: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT). Which legacy
 * stream the free names depends on the entry point: bfcshim_free_async's
 * 0 is the current context's, as cudaFreeAsync's (bfcshim.h), and
 * bfcshim_torch_free's with the block's device is the block's context's.
 * A free on the blocked one is refused, the block the program's (freed
 * again once the capture ended); a free on the other goes through, and
 * leaves the capture alone. Either way the block is not lost (the pool
 * filled around it, the next allocation on device 0's legacy stream gets
 * it), and that owner comes after b's work. Found by an audit: with the
 * pool's context blocked, bfcshim_free_async's record asked about that
 * context's legacy stream, and the block was kept for good. */
static void record_other_current_on(bool torch, bool pool_blocked, CUstream zero,
                                    bool also_zero)
{
    start();
    CUcontext c0, c1;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    CUstream b, cap;
    CHECK_EQ(D.StreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *t = must_alloc_on(NULL, MiB); /* device 0's pool: the first in the stats */
    void *filler = must_alloc(pool_free_bytes() - MiB / 2); /* only the block is left */
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    void *one = NULL;
    CHECK_EQ(B.malloc(&one, MiB, 1), 0); /* device 1's pool */
    CHECK_EQ(D.CtxSetCurrent(pool_blocked ? c0 : c1), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&cap, 0), CUDA_SUCCESS); /* blocking, in the blocked context */
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    CHECK_EQ(F->launch(b, write_mib, t), 0); /* 0x5a, b's */
    B.torch_record_stream(t, b);
    if (also_zero) /* and on 0: some device's default stream */
        B.torch_record_stream(t, NULL);
    CHECK_EQ(D.StreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    const uint64_t frees = (uint64_t)pool_stat("num_frees");
    const uint64_t invalidated = fake_stats().capture_invalidations;
    /* the free's legacy stream: the blocked one? */
    const bool refused = torch == pool_blocked;
    int r = CUDA_SUCCESS;
    if (torch)
        B.torch_free(t, MiB, 0, NULL);
    else
        r = B.free_async(t, zero);
    const bool freed = (uint64_t)pool_stat("num_frees") == frees + 1;
    fprintf(stderr, "%s, %s blocked: r=%d freed=%d captures invalidated +%llu\n",
            torch ? "bfcshim_torch_free" : "bfcshim_free_async",
            pool_blocked ? "the pool's context" : "the current context", r, freed,
            (unsigned long long)(fake_stats().capture_invalidations - invalidated));
    if (refused) {
        CHECK(!torch ? r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : true);
        CHECK(!freed);
    } else {
        CHECK_EQ(r, CUDA_SUCCESS);
        CHECK_EQ(fake_stats().capture_invalidations, invalidated);
        if (!freed) {
            fprintf(stderr, "a free on a usable legacy stream: the block was kept, not freed\n");
            e2e_failures++;
        }
    }
    CUgraph g = NULL;
    D.StreamEndCapture(cap, &g); /* invalidated by a refusal's legacy use */
    if (g)
        CHECK_EQ(D.GraphDestroy(g), CUDA_SUCCESS);
    if (refused) { /* again, the capture over: now it goes through */
        if (torch)
            B.torch_free(t, MiB, 0, NULL);
        else
            CHECK_EQ(B.free_async(t, zero), CUDA_SUCCESS);
        CHECK_EQ((uint64_t)pool_stat("num_frees"), frees + 1);
    }
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    void *q = must_alloc_on(NULL, MiB); /* the block: nothing else is free */
    CHECK(q == t);
    if (q == t)
        expect_new_owner_last(q, CU_STREAM_LEGACY, NULL, "freed with another context current");
    F->complete_all();
    B.torch_free(q, MiB, 0, NULL);
    CHECK_EQ(B.free(filler), 0);
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    CHECK_EQ(B.free(one), 0);
    CHECK_EQ(D.StreamDestroy(cap), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(b), CUDA_SUCCESS);
    F->complete_all();
}

static void record_other_current_with(bool torch, bool pool_blocked)
{
    record_other_current_on(torch, pool_blocked, NULL, false);
}

static void record_other_current_async_pool(void) { record_other_current_with(false, true); }
/* bfcshim_free_async's CU_STREAM_LEGACY names the current context's legacy
 * stream as its 0 does (cuda.h, CU_STREAM_LEGACY: "the legacy stream";
 * cudaFreeAsync's stream is the current device's) */
static void record_other_current_async_pool_legacy(void)
{
    record_other_current_on(false, true, CU_STREAM_LEGACY, false);
}
/* record-zero-other-current-async-{current,pool}: the same, the block also
 * recorded on handle 0 (any device's default stream, device 1's among
 * them). Found by an audit: the record's wait for device 1's default
 * stream was asked about and queued before the free's own stream was: with
 * device 1's legacy stream blocked (current), the free CUDA refuses was
 * taken and the block kept for good; with device 0's blocked (pool), the
 * wait had nowhere to be queued, and the block was kept for good though
 * the free goes through (svc_free waits for device 1's legacy stream on
 * the host, which covers that record). */
static void record_zero_other_current_async_current(void)
{
    record_other_current_on(false, false, NULL, true);
}
static void record_zero_other_current_async_pool(void)
{
    record_other_current_on(false, true, NULL, true);
}
static void record_other_current_async_current(void) { record_other_current_with(false, false); }
static void record_other_current_torch_pool(void) { record_other_current_with(true, true); }
static void record_other_current_torch_current(void) { record_other_current_with(true, false); }

/* record-current-async: a recorded block freed by bfcshim_free_async on
 * handle 0 with the block's own context current, the usual case: a
 * stream-ordered free on that context's legacy stream, which must wait for
 * the recorded non-blocking stream b (whose work, 0x5a, still uses the
 * block; a non-blocking stream is not ordered by the legacy stream, cuda.h
 * CU_STREAM_NON_BLOCKING) before the legacy stream's next allocation gets
 * the block in its order. */
static void record_current_async(void)
{
    start();
    CUstream b;
    CHECK_EQ(D.StreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *t = must_alloc_on(NULL, MiB);
    CHECK_EQ(F->launch(b, write_mib, t), 0); /* 0x5a, b's */
    B.torch_record_stream(t, b);
    CHECK_EQ(B.free_async(t, NULL), CUDA_SUCCESS);
    void *q = must_alloc_on(NULL, MiB);
    if (q == t)
        expect_new_owner_last(q, CU_STREAM_LEGACY, NULL, "freed async with its context current");
    F->complete_all();
    CHECK_EQ(B.free_async(q, NULL), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(b), CUDA_SUCCESS);
    F->complete_all();
}

/* torch-free-other-current: PyTorch frees a device-0 tensor with its
 * device and its (default) stream, 0, while device 1's context is current,
 * and no record_stream: the free names device 0's legacy stream without
 * asking which context is current (FREE_STREAM_DEVICE), whose queued work
 * (0x5a) still writes the block. The pool filled around it, the next
 * allocation of its size is the block or nothing. `how`: 0, a plain
 * allocation; 1, one on another stream of device 0 (device 1 still
 * current); both must come after that work (a host wait for it, here); 2,
 * PyTorch's next allocation on device 0's default stream, which may take
 * the block at once in its order, its next owner's work then running after
 * the old. */
static bool torch_old_ran;
static void torch_old_work(void *arg)
{
    write_mib(arg);
    torch_old_ran = true;
}

static void torch_free_other_current_how(int how)
{
    start();
    CUcontext c0, c1;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    CUstream b;
    CHECK_EQ(D.StreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *t = must_alloc_on(NULL, MiB); /* device 0's pool: the first in the stats */
    void *filler = must_alloc(pool_free_bytes() - MiB / 2); /* only the block is left */
    torch_old_ran = false;
    CHECK_EQ(F->launch(CU_STREAM_LEGACY, torch_old_work, t), 0); /* device 0's */
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    B.torch_free(t, MiB, 0, NULL);
    /* (as a plug-in, an allocation for a device whose context is not
     * current is refused, but for an explicit stream's) */
    if (how != 1)
        CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    void *q = NULL;
    if (how == 0)
        CHECK_EQ(B.malloc(&q, MiB, 0), 0);
    else if (how == 1)
        CHECK_EQ(B.malloc_async(&q, MiB, 0, b), 0);
    else
        q = B.torch_alloc(MiB, 0, NULL);
    CHECK(q == t); /* nothing else is free */
    if (q == t && how <= 1 && !torch_old_ran) {
        fprintf(stderr, "freed by PyTorch with device 1 current: handed out (%s) before "
                        "device 0's default stream's work that used it ran\n",
                how == 0 ? "plain" : "another stream");
        e2e_failures++;
    }
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    if (q == t && how >= 2) /* the new owner on device 0's default stream */
        expect_new_owner_last(q, CU_STREAM_LEGACY, NULL, "torch free, another context current");
    F->complete_all();
    if (q)
        CHECK_EQ(B.free(q), 0);
    CHECK_EQ(B.free(filler), 0);
    CHECK_EQ(D.StreamDestroy(b), CUDA_SUCCESS);
}

static void torch_free_other_current(void)
{
    for (int how = 0; how < 3; how++)
        torch_free_other_current_how(how);
}

/* A block recorded on handle 0 (some device's default stream) is freed
 * after the program reset device 1 unseen and made its primary context
 * again, device 1's pool's context gone:
 * the free, which looks at every other device's pool, must neither hang
 * (a replaced pool forgotten there waited for the streams' users, the
 * free itself among them) nor keep the block for that dead context. */
static void record_zero_reset(void)
{
    start();
    void *t = must_alloc_on(NULL, MiB); /* device 0's pool: the first in the stats */
    CUcontext c0, c1;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    void *one = NULL;
    CHECK_EQ(B.malloc(&one, MiB, 1), 0); /* device 1's pool */
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    B.torch_record_stream(t, NULL);
    CHECK_EQ(D.DevicePrimaryCtxReset(1), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS); /* made again */
    alarm(60); /* a hang fails the scenario */
    const uint64_t frees = (uint64_t)pool_stat("num_frees");
    B.torch_free(t, MiB, 0, NULL);
    alarm(0);
    if ((uint64_t)pool_stat("num_frees") != frees + 1) {
        fprintf(stderr, "recorded on 0, device 1 reset: the block was not freed\n");
        e2e_failures++;
    }
    F->complete_all();
}

/* Two threads record blocks (on a stream of their own, every other one on
 * handle 0 too) and free them while a third makes and destroys streams,
 * captures on a blocking stream (the legacy stream blocked meanwhile) and
 * resets device 1 unseen under the handle-0 frees' walk of the pools.
 * Each worker checks that a block it gets back at once on its own stream
 * is not under the recorded stream's queued write; run under TSan for the
 * locks' order. */
static atomic_bool rt_stop;
static CUcontext rt_c0;

static void *rt_worker(void *arg)
{
    const bool zero = arg != NULL;
    CHECK_EQ(D.CtxSetCurrent(rt_c0), CUDA_SUCCESS);
    CUstream a, b;
    CHECK_EQ(D.StreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    for (int i = 0; i < 400; i++) {
        void *t = must_alloc_on(a, MiB);
        CHECK_EQ(F->launch(b, write_mib, t), 0);
        B.torch_record_stream(t, b);
        if (zero && i % 2)
            B.torch_record_stream(t, NULL);
        B.torch_free(t, MiB, 0, a);
        void *q = must_alloc_on(a, MiB);
        if (q == t)
            expect_new_owner_last(q, a, b, "threads");
        B.torch_free(q, MiB, 0, a);
        if (i % 16 == 0)
            F->complete_all();
    }
    F->complete_all();
    CHECK_EQ(D.StreamDestroy(a), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(b), CUDA_SUCCESS);
    return NULL;
}

static void *rt_churn(void *arg)
{
    (void)arg;
    CHECK_EQ(D.CtxSetCurrent(rt_c0), CUDA_SUCCESS);
    for (int i = 0; !atomic_load(&rt_stop); i++) {
        CUstream s;
        CHECK_EQ(D.StreamCreate(&s, i % 3 ? CU_STREAM_NON_BLOCKING : 0), CUDA_SUCCESS);
        CHECK_EQ(F->launch(s, nothing, NULL), 0);
        if (i % 5 == 0 && D.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) ==
                              CUDA_SUCCESS) {
            CUgraph g = NULL;
            D.StreamEndCapture(s, &g); /* maybe invalidated by a free's legacy use */
            if (g)
                D.GraphDestroy(g);
        }
        CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
        if (i % 7 == 0) {
            CUcontext c1;
            CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
            CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
            void *one = NULL;
            if (B.malloc(&one, MiB, 1) == 0)
                B.free(one);
            if (i % 21 == 0)
                D.DevicePrimaryCtxReset(1); /* unseen: its pool goes stale */
            CHECK_EQ(D.CtxSetCurrent(rt_c0), CUDA_SUCCESS);
        }
    }
    return NULL;
}

static void record_threads(void)
{
    start();
    CHECK_EQ(D.DevicePrimaryCtxRetain(&rt_c0, 0), CUDA_SUCCESS);
    alarm(240); /* a deadlock fails the scenario */
    pthread_t w0, w1, ch;
    CHECK_EQ(pthread_create(&ch, NULL, rt_churn, NULL), 0);
    CHECK_EQ(pthread_create(&w0, NULL, rt_worker, NULL), 0);
    CHECK_EQ(pthread_create(&w1, NULL, rt_worker, (void *)1), 0);
    pthread_join(w0, NULL);
    pthread_join(w1, NULL);
    atomic_store(&rt_stop, true);
    pthread_join(ch, NULL);
    alarm(0);
    F->complete_all();
}

static void query_during_capture(void)
{
    start();
    CUstream s, cap;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&cap, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *block = must_alloc_on(s, MiB);
    CHECK_EQ(F->launch(s, nothing, NULL), 0);
    CHECK_EQ(B.free_async(block, s), 0); /* behind an event on s */
    F->complete(s);
    const fakecuda_stats before = fake_stats();
    CHECK_EQ(D.StreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    /* A plain allocation of the block's size: the pool asks whether the
     * event completed (it has) and hands the block out. */
    void *q = must_alloc(MiB);
    CHECK(q == block);
    CHECK(fake_stats().event_queries > before.event_queries);
    CUgraph g = NULL;
    CHECK_EQ(D.StreamEndCapture(cap, &g), CUDA_SUCCESS);
    CHECK(g != NULL);
    CHECK_EQ(fake_stats().capture_invalidations, before.capture_invalidations);
    if (g)
        CHECK_EQ(D.GraphDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(B.free(q), 0);
    CHECK_EQ(D.StreamDestroy(cap), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
}

static void trim_during_capture(void)
{
    start();
    CUcontext c0, c1;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    CUstream cap;
    CHECK_EQ(D.StreamCreate(&cap, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    void *p = must_alloc(64 * MiB);
    CHECK_EQ(B.free(p), 0);
    const fakecuda_stats before = fake_stats();
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    CHECK_EQ(D.StreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    CHECK(B.trim() >= 64 * MiB);
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    CUgraph g = NULL;
    CHECK_EQ(D.StreamEndCapture(cap, &g), CUDA_SUCCESS);
    CHECK(g != NULL);
    if (g)
        CHECK_EQ(D.GraphDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().capture_invalidations, before.capture_invalidations);
    CHECK_EQ(D.StreamDestroy(cap), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
}

static void cost(void)
{
    start();
    enum { PAIRS = 10000, LIVE = 8 };
    void *live[LIVE] = {0};
    const fakecuda_stats s0 = fake_stats();
    uint64_t x = 12345;
    for (int i = 0; i < PAIRS; i++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        int k = (int)(x >> 60) % LIVE;
        if (live[k])
            CHECK_EQ(B.free(live[k]), 0);
        live[k] = must_alloc(((x >> 20) % (8 * MiB)) + 1); /* 4 MiB on average */
    }
    for (int k = 0; k < LIVE; k++)
        CHECK_EQ(B.free(live[k]), 0);
    const fakecuda_stats s1 = fake_stats();
    uint64_t syncs = s1.ctx_synchronize_calls - s0.ctx_synchronize_calls;
    printf("cost: %d plain frees, %llu context synchronisations (%.4f a free), %llu event "
           "records, %llu event queries\n",
           PAIRS, (unsigned long long)syncs, (double)syncs / PAIRS,
           (unsigned long long)(s1.event_records - s0.event_records),
           (unsigned long long)(s1.event_queries - s0.event_queries));
    CHECK_EQ(s1.event_records, s0.event_records);
    /* A synchronisation only when the pool had nothing else to give: each
     * frees what the pool holds beyond the LIVE blocks (at most 64 MiB of
     * the 256 MiB pool), about 48 frees' worth. */
    CHECK(syncs > 0 && syncs < PAIRS / 20);
}

int main(int argc, char **argv)
{
    static const e2e_scenario scenarios[] = {
        {"plain", plain},
        {"plain-global", plain},
        {"trim", trim},
        {"trim-after-reset", trim_after_reset},
        {"free-after-reset", free_after_reset},
        {"free-async-after-reset", free_async_after_reset},
        {"reused-handle", reused_handle},
        {"cross-context-reused", cross_context_reused},
        {"cross-context", cross_context_reused},
        {"cross-context-dead", cross_context_dead},
        {"lane-growth", lane_growth},
        {"query-during-capture", query_during_capture},
        {"trim-during-capture", trim_during_capture},
        {"legacy-lane", legacy_lane},
        {"record-refused", record_refused},
        {"record-capture-ends", record_capture_ends},
        {"record-legacy-capture-ends", record_legacy_capture_ends},
        {"record-other-current-async-pool", record_other_current_async_pool},
        {"record-other-current-async-pool-legacy", record_other_current_async_pool_legacy},
        {"record-other-current-async-current", record_other_current_async_current},
        {"record-zero-other-current-async-current", record_zero_other_current_async_current},
        {"torch-free-other-current", torch_free_other_current},
        {"record-zero-other-current-async-pool", record_zero_other_current_async_pool},
        {"record-current-async", record_current_async},
        {"record-other-current-torch-pool", record_other_current_torch_pool},
        {"record-other-current-torch-current", record_other_current_torch_current},
        {"record-zero-reset", record_zero_reset},
        {"record-zero-other-device", record_zero_other_device},
        {"record-zero-ctxid-fails", record_zero_ctxid_fails},
        {"record-threads", record_threads},
        {"cost", cost},
        {"dlclose", unload}};
    return e2e_main("e2e_plugin", scenarios, sizeof scenarios / sizeof scenarios[0], argc, argv);
}
