/*
 * e2e_api.c - a program that uses the C interface of include/bfcshim.h,
 * linked against libbfcshim.so (no LD_PRELOAD), on the fake driver, which it
 * reaches by dlopen like the plug-ins' frameworks do. Scenarios:
 *
 *   plain      bfcshim_malloc/free on two devices: one pool each, a freed
 *              block is not handed out while any stream's queued work may
 *              still use it, and is once the work is done
 *   async      bfcshim_malloc_async/free_async and the PyTorch entry points:
 *              the freeing stream reuses at once, another stream only after
 *              the freeing stream's work; an explicit stream's context wins
 *              over `device`
 *   badinput   every bad call gets its CUresult and the pool stays intact
 *   zero       size 0 succeeds with NULL and no log line, as cudaMalloc
 *   trim       (growth mode) trim gives idle regions back to the device, not
 *              the ones holding live or still-queued blocks
 *   trim-unmap-fails  (growth mode) the driver refuses one cuMemUnmap during
 *              a trim: the trim reports what the device got back, the pool
 *              counts the refused granule mapped, the next trim gives it
 *              back
 *   map-rollback-unmap-fails  (growth mode) a map fails part way and the
 *              shim's rollback meets a refused cuMemUnmap: the pool counts
 *              the granule left mapped and gives it back later
 *   map-rollback-second-unmap-fails, map-rollback-grant-fails  the same,
 *              the rollback's second unmap refused; its first and the
 *              grant of what stays mapped refused (nothing of it handed out)
 *   stats      bfcshim_stats_json (size probe, content), mem_get_info
 *   platform   (BFCSHIM_ALLOCATOR=platform) every call reaches the driver
 *   torch-legacy  bfcshim_torch_free on device 0's default (legacy) stream
 *              with device 1 current: device 0's legacy lane, no driver
 *              question about the current context
 *   torch-legacy-capture  (found by the plug-in audit) the same free while
 *              a blocking stream of device 1, the current device, captures:
 *              device 0's legacy stream is not blocked, so the free must
 *              succeed and leave device 1's capture alone (before, the
 *              library asked about, and used, device 1's legacy stream:
 *              the capture was invalidated and the block lost)
 *   torch-alloc-other-current-{pool,current}  (found by an audit)
 *              bfcshim_torch_alloc on device 0's default stream with device
 *              1 current while a blocking stream captures in device 0's
 *              context (refused by the driver, the capture invalidated, as
 *              CUDA does) or in device 1's (served from the pool, the
 *              capture left alone)
 *   torch-record-stream  Tensor.record_stream through
 *              bfcshim_torch_record_stream: a tensor allocated and freed on
 *              stream A (non-blocking, and the legacy stream), recorded on
 *              stream B whose work is still queued, is handed out to another
 *              stream only after B's work, and to A only behind it in A's
 *              order
 *   torch-record-cases  recorded on the free's own stream (nothing done),
 *              twice on one stream and on a second (one wait each), on a
 *              stream destroyed before the free, on a capturing stream (the
 *              capture left intact), on another context's stream, and at a
 *              pointer that is no block start (refused, one log line)
 *   dead-stream-immediate  dead-stream under BFCSHIM_FREE_POLICY=immediate:
 *              a stream-ordered free on a destroyed stream, made plain, is
 *              still fenced (the policy's promise is about plain frees)
 *   torch-record-immediate  torch-record-cases under
 *              BFCSHIM_FREE_POLICY=immediate: a free made plain by a record
 *              still waits for its fence
 *   torch-record-stale  2100 recorded blocks freed through cuMemFree (their
 *              entries left behind): a later record is still honoured
 *   torch-record-full  a record dropped because 2048 live recorded blocks
 *              fill the table: its block is still not handed out under
 *              the recorded stream's work; a block allocated after the
 *              drop is freed with no driver call
 *   torch-record-other-default  record_stream(t, 0) meaning device 1's
 *              default stream (PyTorch passes 0 for every device's) with
 *              device 0 current: the free waits for device 1's legacy stream
 *   torch-record-other-after-plain  a block whose record already made its
 *              free a plain one (a per-thread stream; five streams, more
 *              than an entry holds) then recorded on device 1's stream with
 *              queued work: a plain free's fence covers only the block's
 *              context, so that stream must still be waited for
 *   torch-record-ptsz-other-device  recorded on CU_STREAM_PER_THREAD with
 *              device 1 current (device 1's per-thread stream, whose work
 *              reads the device-0 block): not handed out under that work
 *   record-free-ptsz-other-current  (found by an audit) a block recorded on
 *              a stream of its device freed by bfcshim_free_async on
 *              CU_STREAM_PER_THREAD with device 1 current, while device 0's
 *              per-thread stream captures: the free (on device 1's
 *              per-thread stream, usable) goes through, and the block comes
 *              back after the recorded stream's work
 *   torch-record-reused-handle  recorded on a stream destroyed before the
 *              free, its handle given to a new stream at once
 *              (FAKECUDA_REUSE_STREAM_HANDLES): the free must wait for the
 *              old stream's queued work, not for the new stream's
 *   free-async-other-dead, free-async-other-dead-ptsz, free-async-no-context
 *              bfcshim_free_async of a device-0 block on handle 0 (on
 *              CU_STREAM_PER_THREAD) with device 1's reset primary context
 *              current (with no context current): CUDA refuses it (no such
 *              stream); the block stays the program's, is not kept for
 *              good, and comes back once freed again and its work ran
 *   malloc-async-other-device-zero  bfcshim_malloc_async(device 0, 0)
 *              with device 1 current: 0 is the current device's legacy
 *              stream, so a block freed on device 0's, its work there still
 *              queued, does not come back in that stream's order (with
 *              device 0 current it does, at once)
 *   dead-stream  bfcshim_free_async on a stream destroyed since: no call on
 *              the dead handle, and the block is reused once its work is done
 *   dead-stream-other-device (-immediate)  the same with the stream of
 *              device 1 and the block of device 0, whose work on the dead
 *              stream still writes it: refused (CUDA refuses a dead
 *              handle), the block never handed out under that work
 *   stand-in-nomem  a destroyed stream's stand-in that host memory cannot
 *              keep, and whose wait then fails: the pool keeps its frees
 *   stats-nomem  bfcshim_stats_json when its document cannot be made (no
 *              memory for its stream): 0, and the buffer terminated
 *   stats-nomem-write  bfcshim_stats_json when host memory runs out while
 *              the document is written (every malloc and realloc of half
 *              the document's size or more fails): 0 and an empty buffer, never a document cut
 *              short reported whole, nor a copy from NULL (glibc's
 *              open_memstream, used before, drops a write it has no room
 *              for without setting the error flag, and its fclose answers 0
 *              when the final realloc fails, leaving the buffer NULL: the
 *              library crashed here). Skipped under the sanitizers, whose own
 *              malloc this program's would replace
 *   oom-report-nomem  the out-of-memory report when host memory runs out
 *              while it is formatted: no part of a report in
 *              BFCSHIM_OOM_REPORT's file, and the whole report the next
 *              time (skipped under the sanitizers, as above)
 */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>

#include "bfcshim.h"
#include "e2e.h"
#include "shim_stats.h"

#define MiB ((size_t)1 << 20)

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*DevicePrimaryCtxReset)(CUdevice);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*StreamBeginCapture)(CUstream, CUstreamCaptureMode);
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*GraphDestroy)(CUgraph);
} D;

static const fakecuda_api *F;

#define LOAD(field, name) *(void **)&D.field = e2e_dlsym(h, name)

/* Both devices' primary contexts active, device 0's current. */
static void start(void)
{
    void *h = e2e_open_libcuda();
    LOAD(Init, "cuInit");
    LOAD(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    LOAD(CtxSetCurrent, "cuCtxSetCurrent");
    LOAD(DevicePrimaryCtxReset, "cuDevicePrimaryCtxReset_v2");
    LOAD(StreamCreate, "cuStreamCreate");
    LOAD(StreamDestroy, "cuStreamDestroy_v2");
    LOAD(MemAlloc, "cuMemAlloc_v2");
    LOAD(MemFree, "cuMemFree_v2");
    LOAD(StreamBeginCapture, "cuStreamBeginCapture_v2");
    LOAD(StreamEndCapture, "cuStreamEndCapture");
    LOAD(GraphDestroy, "cuGraphDestroy");
    F = fakecuda();
    CUcontext c0, c1;
    CHECK_EQ(D.Init(0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
}

static void *must_alloc(size_t size, int device)
{
    void *p = NULL;
    int r = bfcshim_malloc(&p, size, device);
    if (r != 0 || !p) {
        fprintf(stderr, "bfcshim_malloc(%zu, %d) = %d\n", size, device, r);
        exit(1);
    }
    return p;
}

static void noop(void *arg) { (void)arg; }

/* Work on another stream that writes a 1 MiB block, and says it ran. */
static bool other_ran;
static void write_other(void *arg)
{
    memset(arg, 0x5a, MiB);
    other_ran = true;
}

/* Every call the fake driver took so far, by anyone. */
static uint64_t driver_calls(void)
{
    fakecuda_call_count c[256];
    size_t n = F->calls(c, 256);
    uint64_t total = 0;
    for (size_t i = 0; i < n && i < 256; i++)
        total += c[i].calls;
    return total;
}

/* Takes everything device 0's pool can hand out now (its free blocks, not
 * the freed ones it still holds: a preallocated pool fences those only when
 * it needs their memory), so that the next allocation must come from the
 * blocks freed earlier. Returns how many fillers fill[] got. */
enum { MAX_FILL = 16 };
static size_t fill_room(void **fill)
{
    static char json[1 << 16];
    size_t n = 0;
    for (; n < MAX_FILL; n++) {
        CHECK(bfcshim_stats_json(json, sizeof json) > 0);
        long long largest = shim_stats_field(json, "largest_free_block_bytes");
        if (largest < (long long)MiB)
            break;
        fill[n] = must_alloc((size_t)largest, 0);
    }
    return n;
}

static void unfill(void **fill, size_t n)
{
    for (size_t i = 0; i < n; i++)
        CHECK_EQ(bfcshim_free(fill[i]), 0);
}

static void plain(void)
{
    start();
    CHECK_EQ(bfcshim_api_version(), BFCSHIM_API_VERSION);
    CHECK_EQ(bfcshim_active(), 1);
    void *a = must_alloc(3 * MiB, 0);
    void *b = must_alloc(3 * MiB, 1); /* device 1: not current, but active */
    CHECK(F->is_device_pointer((uint64_t)(uintptr_t)a));
    fakecuda_stats st = fake_stats();
    CHECK(st.bytes_in_use[0] > 0 && st.bytes_in_use[1] > 0); /* one pool per device */
    CHECK(a != b);
    /* Work queued on a stream that may use `a`; a plain free then must not
     * give `a` to anyone until that work is done. */
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(F->launch(s, noop, NULL), 0);
    CHECK_EQ(bfcshim_free(a), 0);
    void *c = must_alloc(3 * MiB, 0);
    CHECK(c != a);
    F->complete_all();
    CHECK_EQ(bfcshim_free(c), 0);
    /* Idle now: once the pool needs them, the freed blocks come back. */
    void *fill[MAX_FILL];
    size_t n = fill_room(fill);
    void *d = must_alloc(3 * MiB, 0);
    CHECK(d == a || d == c);
    unfill(fill, n);
    CHECK_EQ(bfcshim_free(d), 0);
    CHECK_EQ(bfcshim_free(b), 0);
}

static void async(void)
{
    start();
    CUstream s1, s2;
    CHECK_EQ(D.StreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_EQ(bfcshim_malloc_async(&a, 2 * MiB, 0, s1), 0);
    CHECK_EQ(F->launch(s1, noop, NULL), 0);
    CHECK_EQ(bfcshim_free_async(a, s1), 0);
    /* Another stream must not get `a` while s1's work may use it. */
    CHECK_EQ(bfcshim_malloc_async(&b, 2 * MiB, 0, s2), 0);
    CHECK(b != a);
    /* The freeing stream may: its later work runs after its earlier work. */
    CHECK_EQ(bfcshim_malloc_async(&c, 2 * MiB, 0, s1), 0);
    CHECK(c == a);
    CHECK_EQ(bfcshim_free_async(c, s1), 0);
    CHECK_EQ(bfcshim_free_async(b, s2), 0);

    /* PyTorch's entry points: the same stream-ordered semantics. */
    void *t = bfcshim_torch_alloc(5 * MiB, 0, s1);
    CHECK(t != NULL);
    CHECK_EQ(F->launch(s1, noop, NULL), 0);
    bfcshim_torch_free(t, 5 * MiB, 0, s1);
    void *u = bfcshim_torch_alloc(5 * MiB, 0, s2);
    CHECK(u != NULL && u != t);
    void *v = bfcshim_torch_alloc(5 * MiB, 0, s1);
    CHECK(v == t);
    CHECK(bfcshim_torch_alloc(0, 0, s1) == NULL); /* an empty tensor */
    bfcshim_torch_free(u, 5 * MiB, 0, s2);
    bfcshim_torch_free(v, 5 * MiB, 0, s1);

    /* An explicit stream of device 0 names device 0's pool, whatever
     * `device` says: the memory must be usable by that stream's work. */
    uint64_t before = fake_stats().bytes_in_use[1];
    void *w = NULL;
    CHECK_EQ(bfcshim_malloc_async(&w, MiB, 1, s1), 0);
    CHECK_EQ(fake_stats().bytes_in_use[1], before);
    CHECK_EQ(bfcshim_free_async(w, s1), 0);
    F->complete_all();
}

/* PyTorch frees a block with its device and stream, the device's default
 * stream as NULL, from a thread whose current device may be another: the
 * block goes to its device's legacy lane, and the library asks the driver
 * nothing about the current context (before, one cuCtxGetCurrent at every
 * such free, and with another device current, a wait for that device's
 * legacy stream and the plain lane). */
static void torch_legacy(void)
{
    start();
    CUcontext c0 = NULL, c1 = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    CUstream s2;
    CHECK_EQ(D.StreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *t = bfcshim_torch_alloc(4 * MiB, 0, NULL);
    CHECK(t != NULL);
    CHECK_EQ(F->launch(CU_STREAM_LEGACY, noop, NULL), 0); /* device 0's legacy stream */
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    uint64_t asked = e2e_calls_of("cuCtxGetCurrent"), waits = e2e_calls_of("cuStreamSynchronize");
    bfcshim_torch_free(t, 4 * MiB, 0, NULL);
    CHECK_EQ(e2e_calls_of("cuCtxGetCurrent"), asked);
    CHECK_EQ(e2e_calls_of("cuStreamSynchronize"), waits);
    CHECK(F->pending(CU_STREAM_LEGACY) == 0); /* device 1's: nothing queued */
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    CHECK(F->pending(CU_STREAM_LEGACY) > 0); /* device 0's work still queued */
    /* Another stream waits for that work; so, with the library preloaded,
     * does the legacy stream: a free there is a legacy-stream action in
     * CUDA, which the lane's seal stands for, so the legacy lane is not
     * taken in stream order (e2e_fences legacy-lane-ptsz). */
    void *u = bfcshim_torch_alloc(4 * MiB, 0, s2);
    CHECK(u != NULL && u != t);
    void *v = bfcshim_torch_alloc(4 * MiB, 0, NULL);
    CHECK(v != NULL && v != t);
    bfcshim_torch_free(u, 4 * MiB, 0, s2);
    bfcshim_torch_free(v, 4 * MiB, 0, NULL);
    F->complete_all();
    CHECK_EQ(D.StreamDestroy(s2), CUDA_SUCCESS);
}

/* PyTorch's free of a device-0 tensor on device 0's default stream while a
 * blocking stream of device 1, the current device, captures (PyTorch frees
 * from whatever device is current; a capture of another framework, say
 * CuPy's, whose streams are blocking by default, is under way there). The
 * legacy stream the free names is device 0's, which no capture blocks: the
 * free goes through, and device 1's capture is not touched. */
static void torch_legacy_capture(void)
{
    start();
    CUcontext c0 = NULL, c1 = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    void *t = bfcshim_torch_alloc(4 * MiB, 0, NULL);
    CHECK(t != NULL);
    CHECK_EQ(F->launch(CU_STREAM_LEGACY, noop, NULL), 0); /* device 0's legacy stream */
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    CUstream cap;
    CHECK_EQ(D.StreamCreate(&cap, 0), CUDA_SUCCESS); /* blocking, device 1 */
    CHECK_EQ(D.StreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    const fakecuda_stats before = fake_stats();
    bfcshim_torch_free(t, 4 * MiB, 0, NULL);
    CUgraph g = NULL;
    CHECK_EQ(D.StreamEndCapture(cap, &g), CUDA_SUCCESS);
    if (fake_stats().capture_invalidations != before.capture_invalidations || !g) {
        fprintf(stderr, "freeing a device-0 block on device 0's legacy stream invalidated "
                        "device 1's capture\n");
        e2e_failures++;
    }
    if (g)
        CHECK_EQ(D.GraphDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(cap), CUDA_SUCCESS);
    /* The free went through (device 0's pool, the only one, counts it). */
    static char json[1 << 16];
    CHECK(bfcshim_stats_json(json, sizeof json) > 0);
    if (shim_stats_field(json, "num_frees") != 1) {
        fprintf(stderr, "the free was lost: the block is still allocated\n");
        e2e_failures++;
    }
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    F->complete_all();
}

/* torch-alloc-other-current-{pool,current}: PyTorch's allocation on device
 * 0's default stream (0, with its device) while device 1 is current and a
 * blocking stream captures in device 0's context (pool) or device 1's
 * (current). The stream the allocation names is device 0's legacy stream
 * (bfcshim.h), whatever is current. Blocked (pool), CUDA refuses the
 * allocation and invalidates the capture ("the legacy stream is in an
 * unusable state until the blocking stream capture is terminated",
 * cuStreamIsCapturing), and so must the library (the driver's own
 * refusal, passed through with device 0's context current). Not blocked
 * (current), the pool serves it, and device 1's capture is left alone.
 * Found by an audit: the library asked about the current context's legacy
 * stream, and served the first from the pool (the capture intact, the
 * block taken as in device 0's legacy order) while passing the second to
 * the driver. */
static void torch_alloc_other_current(bool pool_blocked)
{
    start();
    CUcontext c0 = NULL, c1 = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    void *t = bfcshim_torch_alloc(4 * MiB, 0, NULL); /* device 0's pool */
    CHECK(t != NULL);
    CHECK_EQ(D.CtxSetCurrent(pool_blocked ? c0 : c1), CUDA_SUCCESS);
    CUstream cap;
    CHECK_EQ(D.StreamCreate(&cap, 0), CUDA_SUCCESS); /* blocking, in the blocked context */
    CHECK_EQ(D.StreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    const fakecuda_stats before = fake_stats();
    static char json[1 << 16];
    CHECK(bfcshim_stats_json(json, sizeof json) > 0);
    const long long allocs = shim_stats_field(json, "num_allocs");
    void *u = bfcshim_torch_alloc(4 * MiB, 0, NULL);
    const fakecuda_stats after = fake_stats();
    CHECK(bfcshim_stats_json(json, sizeof json) > 0);
    const bool pooled = shim_stats_field(json, "num_allocs") == allocs + 1;
    fprintf(stderr, "%s blocked: u=%p pooled=%d driver allocations +%llu captures "
                    "invalidated +%llu\n", pool_blocked ? "device 0's (the pool's)" : "device 1's",
            u, pooled, (unsigned long long)(after.mem_alloc_async_calls -
                                            before.mem_alloc_async_calls),
            (unsigned long long)(after.capture_invalidations - before.capture_invalidations));
    if (pool_blocked) {
        if (u || after.capture_invalidations == before.capture_invalidations) {
            fprintf(stderr, "an allocation on device 0's legacy stream while a blocking stream "
                            "of device 0 captures was served: CUDA refuses it and invalidates "
                            "the capture\n");
            e2e_failures++;
        }
    } else {
        CHECK(u != NULL);
        CHECK(pooled);
        CHECK_EQ(after.mem_alloc_async_calls, before.mem_alloc_async_calls);
        CHECK_EQ(after.capture_invalidations, before.capture_invalidations);
    }
    CUgraph g = NULL;
    CHECK_EQ(D.CtxSetCurrent(pool_blocked ? c0 : c1), CUDA_SUCCESS);
    CUresult end = D.StreamEndCapture(cap, &g);
    CHECK(pool_blocked || (end == CUDA_SUCCESS && g));
    if (g)
        CHECK_EQ(D.GraphDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(cap), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    bfcshim_torch_free(u, 4 * MiB, 0, NULL);
    bfcshim_torch_free(t, 4 * MiB, 0, NULL);
    F->complete_all();
}

static void torch_alloc_other_current_pool(void) { torch_alloc_other_current(true); }
static void torch_alloc_other_current_current(void) { torch_alloc_other_current(false); }

/* A stream-ordered free on a stream destroyed since the allocation (CuPy
 * frees an array on its allocation stream, also after the Stream object was
 * collected first): the dead handle never reaches the driver, and the block
 * comes back once the dead stream's queued work is done. */
/* bfcshim_torch_record_stream, looked up at run time so that the scenarios
 * below also run (and show what goes wrong) against a library without it:
 * record_stream is then dropped, as PyTorch drops it when the allocator has
 * no such function. */
static void record_stream(void *ptr, CUstream s)
{
    static void (*fn)(void *, void *);
    static bool looked;
    if (!looked) {
        *(void **)&fn = dlsym(RTLD_DEFAULT, "bfcshim_torch_record_stream");
        looked = true;
        if (!fn)
            fprintf(stderr, "note: no bfcshim_torch_record_stream: record_stream is dropped\n");
    }
    if (fn)
        fn(ptr, (void *)s);
}

/* t was freed on stream `a` after being recorded on stream `b`, whose work
 * was still queued. Checks that the pool hands t out safely: to another
 * stream only once b's work is done, to `a` (in a's order) only with a's
 * later work behind b's. `who` names the case in a failure. */
static void check_not_under(void *t, CUstream a, CUstream b, CUstream other, const char *who)
{
    /* a's own allocation may get t at once, in a's order: then a's work
     * queued from now on must wait for b's. */
    void *u = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK(u != NULL);
    if (u == t) {
        CHECK_EQ(F->launch(a ? a : CU_STREAM_LEGACY, noop, NULL), 0);
        F->complete(a ? a : CU_STREAM_LEGACY);
        if (F->pending(b) > 0 && F->pending(a ? a : CU_STREAM_LEGACY) == 0) {
            fprintf(stderr, "%s: the recorded block went back to its stream with no wait "
                            "for the recorded stream's work\n", who);
            e2e_failures++;
        }
    }
    /* Freed again on a: a's queue holds whatever wait the first free put
     * there, before this free's own fence. */
    bfcshim_torch_free(u, 4 * MiB, 0, a);
    /* Another stream: t only once b's work has completed (the pool may
     * wait for it, which the fake does by completing it). */
    void *fill[MAX_FILL];
    size_t n = fill_room(fill);
    void *v = bfcshim_torch_alloc(4 * MiB, 0, other);
    CHECK(v != NULL);
    if (v == t && F->pending(b) > 0) {
        fprintf(stderr, "%s: the recorded block was handed to another stream while the "
                        "recorded stream's work was still queued\n", who);
        e2e_failures++;
    }
    unfill(fill, n);
    bfcshim_torch_free(v, 4 * MiB, 0, other);
    F->complete_all();
}

/* A tensor of stream A used by stream B (DataParallel's scatter, an NCCL
 * collective): PyTorch calls record_stream(B), then frees the tensor on A
 * while B's work may still read it. */
static void torch_record_stream(void)
{
    start();
    CUstream a, b, c;
    CHECK_EQ(D.StreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&c, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *t = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK(t != NULL);
    CHECK_EQ(F->launch(b, noop, NULL), 0); /* B reads t */
    record_stream(t, b);
    bfcshim_torch_free(t, 4 * MiB, 0, a);
    check_not_under(t, a, b, c, "non-blocking A");

    /* PyTorch's default stream: the legacy stream of device 0. */
    t = bfcshim_torch_alloc(4 * MiB, 0, NULL);
    CHECK(t != NULL);
    CHECK_EQ(F->launch(b, noop, NULL), 0);
    record_stream(t, b);
    bfcshim_torch_free(t, 4 * MiB, 0, NULL);
    check_not_under(t, NULL, b, c, "legacy A");
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
    CHECK_EQ(D.StreamDestroy(a), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(b), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(c), CUDA_SUCCESS);
}

static void torch_record_cases(void)
{
    start();
    CUstream a, b, c, cap;
    CHECK_EQ(D.StreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&c, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

    /* Recorded on its own stream: nothing to wait for, no driver call. */
    void *t = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK_EQ(F->launch(a, noop, NULL), 0);
    uint64_t waits = e2e_calls_of("cuStreamWaitEvent");
    uint64_t syncs = e2e_calls_of("cuStreamSynchronize") + e2e_calls_of("cuCtxSynchronize");
    record_stream(t, a);
    bfcshim_torch_free(t, 4 * MiB, 0, a);
    CHECK_EQ(e2e_calls_of("cuStreamWaitEvent"), waits);
    void *u = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK(u == t); /* reused at once in a's order, as without the record */
    CHECK_EQ(e2e_calls_of("cuStreamSynchronize") + e2e_calls_of("cuCtxSynchronize"), syncs);
    bfcshim_torch_free(u, 4 * MiB, 0, a);
    F->complete_all();

    /* Twice on b, once on c: both waited for, b once. */
    t = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK_EQ(F->launch(b, noop, NULL), 0);
    CHECK_EQ(F->launch(c, noop, NULL), 0);
    record_stream(t, b);
    record_stream(t, b);
    record_stream(t, c);
    waits = e2e_calls_of("cuStreamWaitEvent");
    bfcshim_torch_free(t, 4 * MiB, 0, a);
    if (e2e_calls_of("cuStreamWaitEvent") != waits + 2) {
        fprintf(stderr, "twice: %llu waits at the free, not 2\n",
                (unsigned long long)(e2e_calls_of("cuStreamWaitEvent") - waits));
        e2e_failures++;
    }
    CUstream d;
    CHECK_EQ(D.StreamCreate(&d, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(F->launch(b, noop, NULL), 0); /* after the free: not the block's concern */
    F->complete(c);
    check_not_under(t, a, c, d, "twice, the second stream");

    /* A recorded stream destroyed before the free: its queued work still
     * runs, and the block must wait for it. */
    CUstream e;
    CHECK_EQ(D.StreamCreate(&e, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    t = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK_EQ(F->launch(e, noop, NULL), 0);
    record_stream(t, e);
    CHECK_EQ(D.StreamDestroy(e), CUDA_SUCCESS);
    bfcshim_torch_free(t, 4 * MiB, 0, a);
    check_not_under(t, a, e, d, "destroyed");

    /* A recorded stream that captures at the free: its work queued before
     * the capture still runs; no event may be recorded on it (that would be
     * a node of the capture, and the waiting stream would join it). */
    CHECK_EQ(D.StreamCreate(&cap, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    t = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK_EQ(F->launch(cap, noop, NULL), 0);
    record_stream(t, cap);
    CHECK_EQ(D.StreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    const fakecuda_stats before = fake_stats();
    bfcshim_torch_free(t, 4 * MiB, 0, a);
    CUgraph g = NULL;
    CHECK_EQ(D.StreamEndCapture(cap, &g), CUDA_SUCCESS);
    if (fake_stats().capture_invalidations != before.capture_invalidations || !g) {
        fprintf(stderr, "capturing: the free touched the recorded stream's capture\n");
        e2e_failures++;
    }
    if (g)
        CHECK_EQ(D.GraphDestroy(g), CUDA_SUCCESS);
    check_not_under(t, a, cap, d, "capturing");

    /* Another context's stream (device 1): waited for too. */
    CUcontext c0 = NULL, c1 = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    CUstream other;
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    t = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK_EQ(F->launch(other, noop, NULL), 0);
    record_stream(t, other);
    bfcshim_torch_free(t, 4 * MiB, 0, a);
    check_not_under(t, a, other, d, "another context");

    /* Not a block start: refused with one log line, nothing else. */
    t = bfcshim_torch_alloc(4 * MiB, 0, a);
    int local;
    const fakecuda_stats quiet = fake_stats();
    record_stream((char *)t + 256, b);
    record_stream(&local, b);
    record_stream(NULL, b);
    CHECK_EQ(fake_stats().event_records, quiet.event_records);
    bfcshim_torch_free(t, 4 * MiB, 0, a);
    record_stream(t, b); /* freed: no longer a live block */
    u = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK(u == t); /* nothing was remembered for it */
    bfcshim_torch_free(u, 4 * MiB, 0, a);
    F->complete_all();
    CHECK_EQ(D.StreamDestroy(a), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(b), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(c), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(d), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(cap), CUDA_SUCCESS);
}

/* The recorded stream destroyed before the free, its handle given to the
 * next stream made (FAKECUDA_REUSE_STREAM_HANDLES): the handle names a new,
 * idle stream, and only the record's stream id tells (rs_usable). The old
 * stream's queued work must still be waited for. Mutation testing: without
 * the id check no test failed. */
static bool old_work_ran;
static void old_work(void *arg)
{
    (void)arg;
    old_work_ran = true;
}

static void torch_record_reused_handle(void)
{
    start();
    CUstream a, d, e, e2;
    CHECK_EQ(D.StreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&d, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&e, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *t = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK(t != NULL);
    old_work_ran = false;
    CHECK_EQ(F->launch(e, old_work, NULL), 0); /* e reads t */
    record_stream(t, e);
    CHECK_EQ(D.StreamDestroy(e), CUDA_SUCCESS); /* returns; the work goes on */
    CHECK_EQ(D.StreamCreate(&e2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK(e2 == e); /* the handle, reused */
    bfcshim_torch_free(t, 4 * MiB, 0, a);
    /* a's own allocation may get t at once, in a's order: a's later work
     * must then wait for the old stream's. */
    void *u = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK(u != NULL);
    if (u == t) {
        CHECK_EQ(F->launch(a, noop, NULL), 0);
        F->complete(a);
        if (!old_work_ran && F->pending(a) == 0) {
            fprintf(stderr, "the recorded block went back to its stream with no wait for "
                            "the destroyed recorded stream's work\n");
            e2e_failures++;
        }
    }
    bfcshim_torch_free(u, 4 * MiB, 0, a);
    /* Another stream: t only once that work ran. */
    void *fill[MAX_FILL];
    size_t n = fill_room(fill);
    void *v = bfcshim_torch_alloc(4 * MiB, 0, d);
    CHECK(v != NULL);
    if (v == t && !old_work_ran) {
        fprintf(stderr, "the recorded block was handed to another stream while the destroyed "
                        "recorded stream's work was still queued\n");
        e2e_failures++;
    }
    unfill(fill, n);
    bfcshim_torch_free(v, 4 * MiB, 0, d);
    F->complete_all();
    CHECK_EQ(D.StreamDestroy(a), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(d), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(e2), CUDA_SUCCESS);
}

/* The same cases under BFCSHIM_FREE_POLICY=immediate: a stream-ordered
 * free that a record makes plain (destroyed or capturing recorded stream)
 * must still wait for its fence, not be handed out at once as the policy's
 * own plain frees are (found by the record_stream audit: the destroyed and
 * capturing cases' blocks went back with no wait). */
static void torch_record_immediate(void) { torch_record_cases(); }

/* Recorded blocks freed through another door (the program's cuMemFree of
 * a tensor's pointer, both ways in at once) leave their entries behind;
 * more of them than the table's 2048 must not stop a later record from
 * being honoured (before: every later record was dropped, logged once, and
 * its block handed out under the recorded stream's work). */
static void torch_record_stale(void)
{
    start();
    CUstream a, b, c;
    CHECK_EQ(D.StreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&c, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    enum { N = 2100 };
    static void *blk[N];
    for (int i = 0; i < N; i++) {
        blk[i] = bfcshim_torch_alloc(64 * 1024, 0, a);
        CHECK(blk[i] != NULL);
        record_stream(blk[i], b);
    }
    for (int i = 0; i < N; i++)
        CHECK_EQ(D.MemFree((CUdeviceptr)(uintptr_t)blk[i]), CUDA_SUCCESS);
    F->complete_all();
    void *t = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK(t != NULL);
    CHECK_EQ(F->launch(b, noop, NULL), 0);
    record_stream(t, b);
    bfcshim_torch_free(t, 4 * MiB, 0, a);
    check_not_under(t, a, b, c, "after stale entries");
    CHECK_EQ(D.StreamDestroy(a), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(b), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(c), CUDA_SUCCESS);
}

/* More live recorded blocks than the table holds (2048): the record that
 * finds it full is dropped, and its block's free must still not hand it out
 * under the recorded stream's queued work (before: logged once, then freed
 * in its own stream's order as if never recorded). */
static void torch_record_full(void)
{
    start();
    CUstream a, b, c;
    CHECK_EQ(D.StreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&c, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    enum { N = 2048 };
    static void *blk[N];
    for (int i = 0; i < N; i++) {
        blk[i] = bfcshim_torch_alloc(64 * 1024, 0, a);
        CHECK(blk[i] != NULL);
        record_stream(blk[i], b);
    }
    void *t = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK(t != NULL);
    CHECK_EQ(F->launch(b, noop, NULL), 0);
    record_stream(t, b); /* the table is full of live blocks: dropped */
    bfcshim_torch_free(t, 4 * MiB, 0, a);
    check_not_under(t, a, b, c, "table full");
    for (int i = 0; i < N; i++)
        bfcshim_torch_free(blk[i], 64 * 1024, 0, a);
    F->complete_all();
    /* The degrade ends with the blocks live at the drop: a block allocated
     * since is freed as if nothing had been recorded, with no driver call
     * (found by an audit: for the rest of the run each such free asked for
     * the current context, under the streams' lock: 1 driver call more a
     * free). */
    void *later = bfcshim_torch_alloc(64 * 1024, 0, a);
    CHECK(later != NULL);
    const uint64_t calls = driver_calls();
    bfcshim_torch_free(later, 64 * 1024, 0, a);
    CHECK_EQ(driver_calls(), calls);
    CHECK_EQ(D.StreamDestroy(a), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(b), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(c), CUDA_SUCCESS);
}

/* record_stream(t, 0): PyTorch passes 0 for the default stream of EVERY
 * device (c10's CUDAStream::stream() answers nullptr for a default stream,
 * and set_record_stream_fn's callback gets no device), and Tensor.
 * record_stream runs under a guard of the tensor's device. A device-0
 * tensor read by work on device 1's default stream (peer access) is
 * recorded as 0 with device 0 current; its free must wait for device 1's
 * legacy stream too. */
static void torch_record_other_default(void)
{
    start();
    CUcontext c0 = NULL, c1 = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    void *one = must_alloc(MiB, 1); /* device 1 in use by the program */
    CUstream a;
    CHECK_EQ(D.StreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *t = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK(t != NULL);
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    CHECK_EQ(F->launch(CU_STREAM_LEGACY, noop, NULL), 0); /* device 1's default stream reads t */
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    record_stream(t, NULL); /* under the tensor's device guard: device 0 current */
    bfcshim_torch_free(t, 4 * MiB, 0, a);
    /* a's next allocation gets t in a's order: a's work from now on must
     * come after device 1's legacy stream's. (A block for another stream
     * is not asked for: fill_room reads the largest free block of both
     * devices' pools.) */
    void *u = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK(u == t);
    CHECK_EQ(F->launch(a, noop, NULL), 0);
    F->complete(a);
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    const uint64_t queued = F->pending(CU_STREAM_LEGACY);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    if (queued > 0 && F->pending(a) == 0) {
        fprintf(stderr, "recorded on 0: the block went back to its stream with no wait for "
                        "device 1's default stream's work\n");
        e2e_failures++;
    }
    bfcshim_torch_free(u, 4 * MiB, 0, a);
    F->complete_all();
    CHECK_EQ(bfcshim_free(one), 0);
    CHECK_EQ(D.StreamDestroy(a), CUDA_SUCCESS);
}

/* torch-record-ptsz-other-device: a device-0 tensor recorded on
 * CU_STREAM_PER_THREAD with device 1's context current names device 1's
 * per-thread stream (the calling thread's, in the current context), whose
 * work reads it. Not nameable at the free and of another context, it must
 * keep the block from being handed out under that work (found by an
 * audit: the record was taken as device 0's per-thread stream, the free
 * made plain, and the plain fence, which covers device 0's streams only,
 * let another stream's allocation get the block with device 1's work
 * queued). */
static bool ptsz_old_ran;
static void ptsz_old_work(void *arg)
{
    (void)arg;
    ptsz_old_ran = true;
}

static void torch_record_ptsz_other_device(void)
{
    start();
    CUcontext c0 = NULL, c1 = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    CUstream a, other;
    CHECK_EQ(D.StreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *t = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK(t != NULL);
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    ptsz_old_ran = false;
    CHECK_EQ(F->launch(CU_STREAM_PER_THREAD, ptsz_old_work, NULL), 0); /* device 1's, reads t */
    record_stream(t, CU_STREAM_PER_THREAD);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    bfcshim_torch_free(t, 4 * MiB, 0, a);
    void *fill[MAX_FILL];
    size_t n = fill_room(fill);
    void *q = bfcshim_torch_alloc(4 * MiB, 0, other);
    if (q == t && !ptsz_old_ran) {
        fprintf(stderr, "recorded on device 1's per-thread stream: the block was handed out "
                        "under that stream's queued work\n");
        e2e_failures++;
    }
    if (q)
        bfcshim_torch_free(q, 4 * MiB, 0, other);
    unfill(fill, n);
    F->complete_all();
    CHECK_EQ(D.StreamDestroy(a), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(other), CUDA_SUCCESS);
}

/* record-free-ptsz-other-current: a device-0 block recorded on device 0's
 * stream b, whose work still writes it, freed by bfcshim_free_async on
 * CU_STREAM_PER_THREAD with device 1 current, while this thread's
 * per-thread stream of device 0 captures. The free's stream is device 1's
 * per-thread stream ("the per-thread default stream of the current
 * context", as cudaFreeAsync's), which is usable: CUDA takes the free, and
 * so must the library, leaving device 0's capture alone; the block comes
 * back after b's work. Found by an audit: the record asked about (and
 * would have queued its wait on) device 0's per-thread stream, found it
 * capturing, and kept the block for good behind a CUDA_SUCCESS. */
static void record_free_ptsz_other_current(void)
{
    start();
    CUcontext c0 = NULL, c1 = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    CUstream b;
    CHECK_EQ(D.StreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *t = must_alloc(MiB, 0); /* device 0's pool: the first in the stats */
    void *one = must_alloc(MiB, 1);
    other_ran = false;
    CHECK_EQ(F->launch(b, write_other, t), 0);
    record_stream(t, b);
    CHECK_EQ(D.StreamBeginCapture(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_RELAXED),
             CUDA_SUCCESS); /* device 0's per-thread stream of this thread */
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    static char json[1 << 16];
    CHECK(bfcshim_stats_json(json, sizeof json) > 0);
    const long long frees = shim_stats_field(json, "num_frees");
    const uint64_t invalidated = fake_stats().capture_invalidations;
    CHECK_EQ(bfcshim_free_async(t, CU_STREAM_PER_THREAD), 0); /* device 1's */
    CHECK(bfcshim_stats_json(json, sizeof json) > 0);
    if (shim_stats_field(json, "num_frees") != frees + 1) {
        fprintf(stderr, "a free on device 1's usable per-thread stream kept the block for good "
                        "(device 0's per-thread stream captures)\n");
        e2e_failures++;
    }
    CHECK_EQ(fake_stats().capture_invalidations, invalidated);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    CUgraph g = NULL;
    CHECK_EQ(D.StreamEndCapture(CU_STREAM_PER_THREAD, &g), CUDA_SUCCESS);
    CHECK(g != NULL);
    if (g)
        CHECK_EQ(D.GraphDestroy(g), CUDA_SUCCESS);
    /* The block comes back (nothing else fits), and only after b's work. */
    void *fill[MAX_FILL];
    size_t n = fill_room(fill);
    void *q = NULL;
    CHECK_EQ(bfcshim_malloc(&q, MiB, 0), 0);
    if (q == t && !other_ran) {
        fprintf(stderr, "the recorded block was handed out under the recorded stream's "
                        "queued work\n");
        e2e_failures++;
    }
    unfill(fill, n);
    F->complete_all();
    if (q)
        CHECK_EQ(bfcshim_free(q), 0);
    CHECK_EQ(bfcshim_free(one), 0);
    CHECK_EQ(D.StreamDestroy(b), CUDA_SUCCESS);
}

/* A record that makes the free a plain one (the per-thread default stream,
 * not nameable at the free; more streams than an entry holds) must not
 * swallow a later record on another context's stream: the plain free's
 * fence covers every stream of the block's context only (before: the
 * later record was ignored, and the block handed out under device 1's
 * queued work). */
static void torch_record_other_after_plain(void)
{
    start();
    CUcontext c0 = NULL, c1 = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    CUstream other, a, d, s[4];
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&d, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    for (int i = 0; i < 4; i++)
        CHECK_EQ(D.StreamCreate(&s[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

    void *t = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK(t != NULL);
    record_stream(t, CU_STREAM_PER_THREAD); /* the free becomes a plain one */
    CHECK_EQ(F->launch(other, noop, NULL), 0); /* device 1 reads t */
    record_stream(t, other);
    bfcshim_torch_free(t, 4 * MiB, 0, a);
    check_not_under(t, a, other, d, "per-thread, then another context");

    t = bfcshim_torch_alloc(4 * MiB, 0, a);
    CHECK(t != NULL);
    for (int i = 0; i < 4; i++)
        record_stream(t, s[i]);
    CHECK_EQ(F->launch(other, noop, NULL), 0);
    record_stream(t, other); /* a fifth stream: the entry is full */
    bfcshim_torch_free(t, 4 * MiB, 0, a);
    check_not_under(t, a, other, d, "five streams, the fifth another context's");

    F->complete_all();
    for (int i = 0; i < 4; i++)
        CHECK_EQ(D.StreamDestroy(s[i]), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(a), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(d), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(other), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
}

static void dead_stream(void)
{
    start();
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_EQ(bfcshim_malloc_async(&a, 2 * MiB, 0, s), 0);
    CHECK_EQ(F->launch(s, noop, NULL), 0);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS); /* its work goes on */
    CHECK_EQ(bfcshim_free_async(a, s), 0);
    CHECK_EQ(bfcshim_malloc_async(&b, 2 * MiB, 0, NULL), 0);
    CHECK(b != a); /* the dead stream's work may still use a */
    F->complete_all();
    void *fill[MAX_FILL];
    size_t n = fill_room(fill);
    CHECK_EQ(bfcshim_malloc_async(&c, 2 * MiB, 0, NULL), 0);
    CHECK(c == a); /* and once it is done, a is free again */
    unfill(fill, n);
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
    CHECK_EQ(bfcshim_free(b), 0);
    CHECK_EQ(bfcshim_free(c), 0);
    F->complete_all();
}

/* dead-stream-other-device (-immediate): dead-stream with the block of
 * device 0 and the stream of device 1 (cudaFreeAsync allows any stream),
 * whose queued work still writes the block. The plain free dead-stream
 * makes of it is fenced by device 0's pool alone, which covers no stream
 * of device 1 (the destroyed stream's stand-in is device 1's pool's). The
 * handle names no stream: CUDA refuses the free, and so must the library,
 * the block staying the program's and never handed out under that work.
 * Found by an audit: the free succeeded and the block came back under it. */
static void dead_stream_other_device(void)
{
    start();
    CUcontext c0, c1;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    void *t = must_alloc(MiB, 0); /* device 0's pool: the first in the stats */
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *one = must_alloc(MiB, 1); /* device 1's pool, which takes the stand-in */
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    other_ran = false;
    CHECK_EQ(F->launch(s, write_other, t), 0);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS); /* its work goes on */
    CHECK_EQ(bfcshim_free_async(t, s), CUDA_ERROR_INVALID_HANDLE);
    void *fill[MAX_FILL];
    size_t n = fill_room(fill);
    void *q = NULL;
    if (bfcshim_malloc(&q, MiB, 0) == 0 && q == t && !other_ran) {
        fprintf(stderr, "a block freed on a dead stream of device 1 was handed out under that "
                        "stream's queued work\n");
        e2e_failures++;
    }
    unfill(fill, n);
    F->complete_all();
    if (q != t)
        CHECK_EQ(bfcshim_free(t), 0); /* refused: still the program's */
    if (q)
        CHECK_EQ(bfcshim_free(q), 0);
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
    CHECK_EQ(bfcshim_free(one), 0);
}

/* free-async-other-dead, free-async-other-dead-ptsz, free-async-no-context:
 * bfcshim_free_async's handle 0 (CU_STREAM_PER_THREAD) names the current
 * context's legacy (per-thread) stream, as cudaFreeAsync's does. When the
 * current context is device 1's primary context reset while current
 * (inactive: "a primary context which has not yet been initialized",
 * CUDA_ERROR_CONTEXT_IS_DESTROYED in cuda.h), or no context is current at
 * all (CUDA_ERROR_INVALID_CONTEXT), there is no such stream, and CUDA
 * refuses the free. The device-0 block, used by work queued on device 0's
 * legacy stream, must then stay the program's: not freed, and not kept for
 * good either (found by an audit: the shim's host wait for the dead
 * context's stream failed, and the block was kept until exit behind a
 * CUDA_SUCCESS). Freed again with device 0 current, it comes back to the
 * pool once that work ran, and never before. */
typedef struct free_on {
    void *t;
    CUstream zero;
    int r;
} free_on;

static void *free_async_thread(void *arg)
{
    free_on *f = arg; /* a thread of its own: no context current */
    f->r = bfcshim_free_async(f->t, f->zero);
    return NULL;
}

static bool dead_case_work_ran;
static void dead_case_work(void *arg)
{
    (void)arg;
    dead_case_work_ran = true;
}

static void free_async_other_dead_on(CUstream zero, bool no_context)
{
    start();
    CUcontext c0 = NULL, c1 = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    void *t = must_alloc(4 * MiB, 0); /* device 0's pool: the first in the stats */
    dead_case_work_ran = false;
    CHECK_EQ(F->launch(CU_STREAM_LEGACY, dead_case_work, NULL), 0); /* device 0's, using t */
    static char json[1 << 16];
    CHECK(bfcshim_stats_json(json, sizeof json) > 0);
    const long long frees = shim_stats_field(json, "num_frees");
    free_on f = {.t = t, .zero = zero, .r = -1};
    if (no_context) {
        pthread_t th;
        CHECK_EQ(pthread_create(&th, NULL, free_async_thread, &f), 0);
        pthread_join(th, NULL);
    } else {
        CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
        CHECK_EQ(D.DevicePrimaryCtxReset(1), CUDA_SUCCESS); /* c1 stays current, inactive */
        f.r = bfcshim_free_async(t, zero);
    }
    CHECK(bfcshim_stats_json(json, sizeof json) > 0);
    const bool freed = shim_stats_field(json, "num_frees") == frees + 1;
    fprintf(stderr, "bfcshim_free_async(%s) %s: %d, %s\n",
            zero == CU_STREAM_PER_THREAD ? "CU_STREAM_PER_THREAD" : "0",
            no_context ? "with no context current" : "with a reset context current", f.r,
            freed ? "freed" : "not freed");
    if (f.r == CUDA_SUCCESS && !freed) {
        fprintf(stderr, "the free succeeded but the block was kept: it never comes back\n");
        e2e_failures++;
    }
    CHECK(f.r != CUDA_SUCCESS); /* as CUDA: there is no such stream */
    CHECK(!freed);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    if (f.r != CUDA_SUCCESS) /* still the program's: freed again, where it can be */
        CHECK_EQ(bfcshim_free_async(t, NULL), 0);
    /* The rest of the pool taken, the next 4 MiB is t: back in the pool,
     * and handed out only after device 0's work that used it (the host
     * waits for it). */
    void *fill[MAX_FILL];
    size_t n = fill_room(fill);
    void *v = NULL;
    int r = bfcshim_malloc(&v, 4 * MiB, 0);
    if (r != 0 || v != t) {
        fprintf(stderr, "the block did not come back (%d)\n", r);
        e2e_failures++;
    } else if (!dead_case_work_ran) {
        fprintf(stderr, "the block came back before device 0's work that used it ran\n");
        e2e_failures++;
    }
    unfill(fill, n);
    if (v)
        CHECK_EQ(bfcshim_free(v), 0);
    F->complete_all();
}

static void free_async_other_dead(void) { free_async_other_dead_on(NULL, false); }
static void free_async_other_dead_ptsz(void)
{
    free_async_other_dead_on(CU_STREAM_PER_THREAD, false);
}
static void free_async_no_context(void) { free_async_other_dead_on(NULL, true); }

/* malloc-async-other-device-zero: bfcshim_malloc_async on handle 0 for
 * device 0 while device 1's context is current. Its 0 is "the legacy
 * default stream" as cudaMallocAsync's (bfcshim.h), which is the current
 * device's, as bfcshim_free_async's 0 is taken; it is not device 0's
 * legacy stream. A block freed on device 0's legacy stream, whose work
 * there still uses it, must then not come back in device 0's legacy
 * stream order: its new owner's work on device 1's legacy stream is not
 * ordered after that work (found by an audit: the block came back at once,
 * and device 1's work ran first). With device 0's context current, the
 * same allocation takes it at once, in its order. */
static bool zero_old_ran;
static void zero_old_work(void *arg)
{
    (void)arg;
    zero_old_ran = true;
}

static void malloc_async_other_device_zero(void)
{
    start();
    CUcontext c0 = NULL, c1 = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    for (int other = 1; other >= 0; other--) {
        void *t = NULL, *q = NULL;
        CHECK_EQ(bfcshim_malloc_async(&t, 4 * MiB, 0, NULL), 0);
        zero_old_ran = false;
        CHECK_EQ(F->launch(CU_STREAM_LEGACY, zero_old_work, NULL), 0); /* device 0's, using t */
        CHECK_EQ(bfcshim_free_async(t, NULL), 0); /* on device 0's legacy stream */
        if (other)
            CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
        void *fill[MAX_FILL];
        size_t n = fill_room(fill);
        CHECK_EQ(bfcshim_malloc_async(&q, 4 * MiB, 0, NULL), 0);
        CHECK(q == t); /* nothing else is free */
        if (other && q == t && !zero_old_ran) {
            fprintf(stderr, "with device 1 current, bfcshim_malloc_async(device 0, 0) got the "
                            "block in device 0's legacy stream order, before device 0's "
                            "work that used it ran\n");
            e2e_failures++;
        }
        if (!other)
            CHECK(!zero_old_ran); /* in its own legacy stream's order: at once */
        CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
        F->complete_all();
        unfill(fill, n);
        CHECK_EQ(bfcshim_free_async(q, NULL), 0);
        F->complete_all();
    }
}

static void badinput(void)
{
    start();
    void *p = NULL, *a = must_alloc(MiB, 0);
    char text[4096];
    bfcshim_stats_json(text, sizeof text);
    CHECK_EQ(bfcshim_malloc(NULL, MiB, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(bfcshim_malloc(&p, MiB, 7), CUDA_ERROR_INVALID_CONTEXT);
    CHECK(p == NULL);
    /* -1 is the current context's device; any other negative number is no
     * device at all, not the current one. */
    CHECK_EQ(bfcshim_malloc(&p, MiB, -7), CUDA_ERROR_INVALID_VALUE);
    CHECK(p == NULL);
    CHECK_EQ(bfcshim_malloc_async(&p, MiB, -2, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK(p == NULL);
    CHECK_EQ(bfcshim_malloc(&p, (size_t)1 << 50, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(bfcshim_free((char *)a + 256), CUDA_ERROR_INVALID_VALUE); /* interior */
    CHECK_EQ(bfcshim_free(a), 0);
    CHECK_EQ(bfcshim_free(a), CUDA_ERROR_INVALID_VALUE); /* twice */
    int local;
    CHECK(bfcshim_free(&local) != 0); /* not device memory at all */
    CHECK_EQ(bfcshim_free(NULL), 0);
    CHECK(bfcshim_torch_alloc(-1, 0, NULL) == NULL);
    size_t f = 0;
    CHECK_EQ(bfcshim_mem_get_info(0, NULL, &f), CUDA_ERROR_INVALID_VALUE);
    size_t t = 0;
    CHECK_EQ(bfcshim_mem_get_info(-3, &f, &t), CUDA_ERROR_INVALID_VALUE);
    /* The pool is intact: everything freed, one allocation served again. */
    char after[4096];
    bfcshim_stats_json(after, sizeof after);
    CHECK(strstr(after, "\"bytes_in_use\": 0") != NULL);
    void *b = must_alloc(MiB, 0);
    CHECK_EQ(bfcshim_free(b), 0);
}

/* Size 0, as cudaMalloc and cudaMallocAsync answer it: success with NULL,
 * nothing taken, nothing logged. bfcshim_malloc refused it as an invalid
 * value (with a log line that said cudaMalloc refuses it too). */
static void zero(void)
{
    shim_log_reset();
    start();
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(bfcshim_free(must_alloc(MiB, 0)), 0); /* the pool exists */
    void *p = (void *)1, *q = (void *)1, *r = (void *)1;
    CHECK_EQ(bfcshim_malloc(&p, 0, 0), 0);
    CHECK(p == NULL);
    CHECK_EQ(bfcshim_malloc_async(&q, 0, 0, s), 0);
    CHECK(q == NULL);
    CHECK_EQ(bfcshim_malloc_async(&r, 0, -1, NULL), 0);
    CHECK(r == NULL);
    CHECK_EQ(bfcshim_free(p), 0);
    CHECK_EQ(bfcshim_free_async(q, s), 0);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
    char text[4096];
    bfcshim_stats_json(text, sizeof text);
    CHECK(strstr(text, "\"num_allocs\": 1,") != NULL); /* nothing taken */
    CHECK(strstr(text, "\"bytes_in_use\": 0,") != NULL);
    /* The pool serves as before. */
    CHECK_EQ(bfcshim_free(must_alloc(MiB, 0)), 0);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
}

static void trim(void)
{
    start();
    void *a = must_alloc(64 * MiB, 0);
    void *keep = must_alloc(MiB, 1);
    uint64_t held = fake_stats().bytes_in_use[0];
    CHECK(held >= 64 * MiB);
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(F->launch(s, noop, NULL), 0);
    CHECK_EQ(bfcshim_free(a), 0);
    /* Queued work may still use `a`: nothing of device 0 goes back yet;
     * device 1's region holds a live block. */
    CHECK_EQ(bfcshim_trim(), 0);
    CHECK_EQ(fake_stats().bytes_in_use[0], held);
    F->complete_all();
    CHECK_EQ(bfcshim_trim(), held);
    CHECK_EQ(fake_stats().bytes_in_use[0], 0);
    CHECK(fake_stats().bytes_in_use[1] > 0);
    /* The pool grows again when asked. */
    void *b = must_alloc(64 * MiB, 0);
    CHECK_EQ(bfcshim_free(b), 0);
    CHECK_EQ(bfcshim_free(keep), 0);
}

/* Device 0's pool counts what the device holds for it (pool_bytes in the
 * stats document, the first such key after device 0's). */
static void expect_pool_bytes_dev0(uint64_t bytes)
{
    char text[16384];
    bfcshim_stats_json(text, sizeof text);
    char want[64];
    snprintf(want, sizeof want, "\"pool_bytes\": %llu,", (unsigned long long)bytes);
    const char *dev0 = strstr(text, "\"device\": 0,");
    CHECK(dev0 && strstr(dev0, want) == strstr(dev0, "\"pool_bytes\""));
}

/* The driver refuses one cuMemUnmap (CUDA_ERROR_NOT_PERMITTED, in cuda.h's
 * list for it): that granule stays mapped, and the pool must count it so:
 * trim reports what the device got back, and the next trim gives the rest.
 * (The pool counted the refused granule unmapped: trim said 64 MiB while
 * the device got back 62, and the pool could map past its limit by them.) */
static void trim_unmap_fails(void)
{
    start();
    void *a = must_alloc(64 * MiB, 0);
    void *keep = must_alloc(MiB, 1);
    const uint64_t held = fake_stats().bytes_in_use[0];
    CHECK(held >= 64 * MiB);
    CHECK_EQ(bfcshim_free(a), 0);
    CHECK_EQ(F->fail_call("cuMemUnmap", 2, CUDA_ERROR_NOT_PERMITTED, 0), 0);
    const size_t released = bfcshim_trim();
    const uint64_t left = fake_stats().bytes_in_use[0];
    CHECK(left > 0); /* the refused granule */
    CHECK_EQ(released, held - left);
    expect_pool_bytes_dev0(left); /* what the device holds */
    /* The refused granule is free memory the pool still maps: the next trim
     * gives it back. */
    CHECK_EQ(bfcshim_trim(), left);
    CHECK_EQ(fake_stats().bytes_in_use[0], 0);
    void *b = must_alloc(64 * MiB, 0);
    CHECK_EQ(bfcshim_free(b), 0);
    CHECK_EQ(bfcshim_free(keep), 0);
}

/* A map under the pool fails part way (cuMemMap refused on the third
 * granule of a 64 MiB block), and the shim's rollback of the granules it
 * had mapped meets a refused cuMemUnmap (CUDA_ERROR_NOT_PERMITTED, in
 * cuda.h's list for it): that granule stays mapped on the device, so the
 * pool must count it (pool_bytes as the device holds it) and give it back
 * like any free granule, here on a trim, leaving the device nothing. */
/* map-rollback-unmap-fails: the first cuMemUnmap of the rollback (its top
 * granule) refused; -second: the second refused, the top granule given
 * back and one fewer left mapped (the prefix reported is what stays
 * mapped, not what was mapped); -grant-fails: the first refused and the
 * cuMemSetAccess that makes the prefix usable refused too (CUDA_ERROR_
 * NOT_SUPPORTED, in cuda.h's list for it), so the prefix is lost to the
 * pool and none of it handed out. Each then hands out a small block,
 * written at once: touching memory mapped without access faults in the
 * fake as on a GPU. (-second and -grant-fails: found by mutation testing,
 * reporting the whole mapped part, leaving out the grant, or reporting an
 * ungranted prefix passed every test.) */
static void map_rollback_with(uint64_t unmap_nth, bool grant_fails)
{
    start();
    void *keep = must_alloc(MiB, 1);
    /* Device 0's pool made (its trial of the driver's calls done) and empty. */
    void *first = must_alloc(MiB, 0);
    CHECK_EQ(bfcshim_free(first), 0);
    bfcshim_trim();
    CHECK_EQ(fake_stats().bytes_in_use[0], 0);
    CHECK_EQ(F->fail_call("cuMemMap", 3, CUDA_ERROR_OUT_OF_MEMORY, 0), 0);
    CHECK_EQ(F->fail_call("cuMemUnmap", unmap_nth, CUDA_ERROR_NOT_PERMITTED, 0), 0);
    if (grant_fails)
        CHECK_EQ(F->fail_call("cuMemSetAccess", 1, CUDA_ERROR_NOT_SUPPORTED, 0), 0);
    void *a = NULL;
    int rc = bfcshim_malloc(&a, 64 * MiB, 0);
    F->fail_call("cuMemMap", 0, 0, 0);
    F->fail_call("cuMemUnmap", 0, 0, 0);
    F->fail_call("cuMemSetAccess", 0, 0, 0);
    const uint64_t held = fake_stats().bytes_in_use[0];
    if (!grant_fails)
        expect_pool_bytes_dev0(held); /* what the device holds */
    if (rc == 0)
        CHECK_EQ(bfcshim_free(a), 0);
    if (grant_fails) {
        /* The prefix without access stays mapped where the pool thinks
         * nothing is: a map there is refused (the pool does not place the
         * block elsewhere: it may fail). Whatever it hands out is usable. */
        void *small = NULL;
        if (bfcshim_malloc(&small, MiB, 0) == 0) {
            memset(small, 0x5a, MiB);
            CHECK_EQ(bfcshim_free(small), 0);
        }
        CHECK_EQ(bfcshim_free(keep), 0);
        return;
    }
    void *small = must_alloc(MiB, 0); /* in the granule left mapped */
    memset(small, 0x5a, MiB);
    CHECK_EQ(bfcshim_free(small), 0);
    bfcshim_trim();
    CHECK_EQ(fake_stats().bytes_in_use[0], 0); /* nothing lost on the device */
    void *b = must_alloc(64 * MiB, 0); /* and the range maps again */
    memset(b, 0xa5, 64 * MiB);
    CHECK_EQ(bfcshim_free(b), 0);
    CHECK_EQ(bfcshim_free(keep), 0);
}

static void map_rollback_unmap_fails(void) { map_rollback_with(1, false); }
static void map_rollback_second_unmap_fails(void) { map_rollback_with(2, false); }
static void map_rollback_grant_fails(void) { map_rollback_with(1, true); }

static void stats(void)
{
    start();
    void *a = must_alloc(5 * MiB, 0);
    size_t need = bfcshim_stats_json(NULL, 0);
    CHECK(need > 100);
    char small[16];
    CHECK_EQ(bfcshim_stats_json(small, sizeof small), need);
    CHECK_EQ(strlen(small), sizeof small - 1); /* cut, and terminated */
    char *doc = malloc(need + 1);
    CHECK_EQ(bfcshim_stats_json(doc, need + 1), need);
    CHECK(strstr(doc, "\"allocator\": \"bfc\"") != NULL);
    CHECK(strstr(doc, "\"bytes_in_use\": 5242880") != NULL);
    free(doc);
    size_t f = 0, t = 0;
    CHECK_EQ(bfcshim_mem_get_info(0, &f, &t), 0);
    CHECK_EQ(t, 1024 * MiB);
    /* BFCSHIM_MEM_LIMIT=512MiB (meson): what is left of the pool's limit. */
    CHECK_EQ(f, 512 * MiB - 5 * MiB);
    CHECK_EQ(bfcshim_mem_get_info(1, &f, &t), 0); /* no pool yet: the limit */
    CHECK_EQ(f, 512 * MiB);
    CHECK_EQ(bfcshim_free(a), 0);
}

static void platform(void)
{
    start();
    CHECK_EQ(bfcshim_active(), 0);
    uint64_t calls = fake_stats().mem_alloc_calls;
    void *a = must_alloc(MiB, 0), *b = must_alloc(MiB, 1);
    CHECK_EQ(fake_stats().mem_alloc_calls, calls + 2);
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *c = NULL;
    CHECK_EQ(bfcshim_malloc_async(&c, MiB, 0, s), 0);
    CHECK_EQ(fake_stats().mem_alloc_async_calls, 1);
    CHECK_EQ(bfcshim_free_async(c, s), 0);
    CHECK_EQ(bfcshim_free(a), 0);
    CHECK_EQ(bfcshim_free(b), 0);
    CHECK_EQ(fake_stats().mem_free_calls, 2);
    CHECK_EQ(bfcshim_trim(), 0);
    char doc[4096];
    bfcshim_stats_json(doc, sizeof doc);
    CHECK(strstr(doc, "\"num_allocs\": 3") != NULL); /* counted as passed through */
    F->complete_all();
}

/* The library's fopencookie is this one, the program's (stats-nomem): it
 * fails while fail_memstream is set, as without memory. */
static atomic_bool fail_memstream;

FILE *fopencookie(void *cookie, const char *mode, cookie_io_functions_t io)
{
    if (atomic_load(&fail_memstream)) {
        errno = ENOMEM;
        return NULL;
    }
    FILE *(*real)(void *, const char *, cookie_io_functions_t);
    *(void **)&real = dlsym(RTLD_NEXT, "fopencookie");
    return real ? real(cookie, mode, io) : NULL;
}

/* The library's malloc and realloc are these (stats-nomem-write): those of
 * fail_from bytes or more fail while fail_from is set, as without memory.
 * Not under a sanitizer: its runtime's malloc would be replaced by one that
 * hands out glibc's blocks, which its free then refuses. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FAIL_ALLOCS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FAIL_ALLOCS 0
#endif
#endif
#ifndef FAIL_ALLOCS
#define FAIL_ALLOCS 1
#endif

#if FAIL_ALLOCS
static atomic_size_t fail_from;
void *__libc_malloc(size_t);
void *__libc_realloc(void *, size_t);

void *malloc(size_t n)
{
    size_t f = atomic_load(&fail_from);
    if (f && n >= f) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_malloc(n);
}

void *realloc(void *p, size_t n)
{
    size_t f = atomic_load(&fail_from);
    if (f && n >= f) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_realloc(p, n);
}
#endif

static void stats_nomem_write(void)
{
#if !FAIL_ALLOCS
    exit(77); /* skipped */
#else
    start();
    void *a = must_alloc(MiB, 0);
    char whole[65536];
    const size_t len = bfcshim_stats_json(whole, sizeof whole);
    CHECK(len > 1024 && len < sizeof whole);
    char buf[65536];
    memset(buf, 'x', sizeof buf);
    atomic_store(&fail_from, len / 2); /* no block can hold the document */
    size_t got = bfcshim_stats_json(buf, sizeof buf);
    atomic_store(&fail_from, 0);
    CHECK(memchr(buf, 0, sizeof buf) != NULL);
    CHECK_EQ(got, 0); /* no document, rather than part of one */
    CHECK_EQ(strlen(buf), 0);
    /* The next call makes the whole document. */
    CHECK_EQ(bfcshim_stats_json(buf, sizeof buf), strlen(buf));
    CHECK(strlen(buf) > 1024 && strcmp(buf + strlen(buf) - 2, "}\n") == 0);
    CHECK_EQ(bfcshim_free(a), 0);
#endif
}

/* stand-in-nomem: a non-blocking stream with work queued on block a is
 * destroyed; the stand-in event is made, but host memory runs out before
 * the pool can remember it (the stand-ins' array cannot grow), so the host
 * waits for it at once, and that wait fails (cuEventSynchronize:
 * CUDA_ERROR_INVALID_CONTEXT, in cuda.h's list). Nothing covers the
 * stream's work then: a, freed after, must not be handed out while that
 * work is queued (the pool keeps its freed blocks). */
static void stand_in_nomem(void)
{
#if !FAIL_ALLOCS
    exit(77); /* skipped */
#else
    start();
    void *a = must_alloc(2 * MiB, 0);
    /* Sixteen stand-ins pending fill the stand-ins' array (8 pointers, then
     * 16): the next one needs 256 bytes, more than the fake's own blocks
     * for the event (its first dependency table is 128 bytes). */
    for (int i = 0; i < 16; i++) {
        CUstream t;
        CHECK_EQ(D.StreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
        CHECK_EQ(F->launch(t, noop, NULL), 0);
        CHECK_EQ(D.StreamDestroy(t), CUDA_SUCCESS);
    }
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(F->launch(s, noop, NULL), 0);
    CHECK_EQ(F->fail_call("cuEventSynchronize", 1, CUDA_ERROR_INVALID_CONTEXT, 0), 0);
    atomic_store(&fail_from, 256);
    const uint64_t waits = e2e_calls_of("cuEventSynchronize");
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS); /* its work goes on */
    atomic_store(&fail_from, 0);
    CHECK_EQ(e2e_calls_of("cuEventSynchronize"), waits + 1); /* the path was taken */
    CHECK_EQ(F->fail_call("cuEventSynchronize", 0, 0, 0), 0);
    CHECK_EQ(bfcshim_free(a), 0);
    void *fill[MAX_FILL];
    size_t n = fill_room(fill);
    void *b = NULL;
    int r = bfcshim_malloc(&b, 2 * MiB, 0);
    if (r == 0 && b == a && F->pending(s)) {
        fprintf(stderr, "the freed block was handed out with the destroyed stream's work "
                        "still queued\n");
        e2e_failures++;
    }
    F->complete_all();
    if (r == 0)
        CHECK_EQ(bfcshim_free(b), 0);
    unfill(fill, n);
#endif
}

/* oom-report-nomem (BFCSHIM_MEM_LIMIT=64MiB, BFCSHIM_OOM_REPORT set): host
 * memory runs out while the out-of-memory report is formatted. No part of
 * a report reaches the file, and the same situation once memory is back
 * gets the whole report (it is not taken as already said). */
static void oom_report_nomem(void)
{
#if !FAIL_ALLOCS
    exit(77); /* skipped */
#else
    start();
    const char *report = getenv("BFCSHIM_OOM_REPORT");
    CHECK(report != NULL);
    unlink(report);
    void *a = must_alloc(MiB, 0);
    void *p = NULL;
    atomic_store(&fail_from, 1024); /* the report is longer */
    int r = bfcshim_malloc(&p, 256 * MiB, 0);
    atomic_store(&fail_from, 0);
    CHECK(r != 0);
    char text[65536] = "";
    FILE *f = fopen(report, "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f)
        fclose(f);
    CHECK_EQ(n, 0);
    r = bfcshim_malloc(&p, 256 * MiB, 0);
    CHECK(r != 0);
    f = fopen(report, "r");
    CHECK(f != NULL);
    n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f)
        fclose(f);
    text[n] = 0;
    const char *end = "==== end of report ====\n";
    CHECK(n > strlen(end) && strcmp(text + n - strlen(end), end) == 0);
    CHECK_EQ(bfcshim_free(a), 0);
#endif
}

static void stats_nomem(void)
{
    start();
    void *a = must_alloc(MiB, 0);
    char buf[64];
    memset(buf, 'x', sizeof buf);
    atomic_store(&fail_memstream, true);
    size_t got = bfcshim_stats_json(buf, sizeof buf);
    atomic_store(&fail_memstream, false);
    CHECK_EQ(got, 0);
    CHECK(memchr(buf, 0, sizeof buf) != NULL); /* a C string, never the bytes before */
    CHECK_EQ(strlen(buf), 0);
    /* The next call makes the document as before. */
    CHECK(bfcshim_stats_json(buf, sizeof buf) > sizeof buf);
    CHECK_EQ(strlen(buf), sizeof buf - 1);
    CHECK_EQ(bfcshim_free(a), 0);
}

int main(int argc, char **argv)
{
    const char *s = argc > 1 ? argv[1] : "";
    static const struct {
        const char *name;
        void (*fn)(void);
    } scenarios[] = {{"plain", plain},   {"async", async},       {"badinput", badinput},
                     {"zero", zero},     {"trim", trim},         {"stats", stats},
                     {"trim-unmap-fails", trim_unmap_fails},
                     {"map-rollback-unmap-fails", map_rollback_unmap_fails},
                     {"map-rollback-second-unmap-fails", map_rollback_second_unmap_fails},
                     {"map-rollback-grant-fails", map_rollback_grant_fails},
                     {"platform", platform}, {"dead-stream", dead_stream},
                     {"torch-legacy", torch_legacy},
                     {"torch-legacy-capture", torch_legacy_capture},
                     {"torch-alloc-other-current-pool", torch_alloc_other_current_pool},
                     {"torch-alloc-other-current-current",
                      torch_alloc_other_current_current},
                     {"torch-record-stream", torch_record_stream},
                     {"torch-record-cases", torch_record_cases},
                     {"torch-record-immediate", torch_record_immediate},
                     {"dead-stream-immediate", dead_stream},
                     {"dead-stream-other-device", dead_stream_other_device},
                     {"dead-stream-other-device-immediate", dead_stream_other_device},
                     {"torch-record-stale", torch_record_stale},
                     {"torch-record-reused-handle", torch_record_reused_handle},
                     {"torch-record-full", torch_record_full},
                     {"torch-record-other-default", torch_record_other_default},
                     {"torch-record-other-after-plain", torch_record_other_after_plain},
                     {"torch-record-ptsz-other-device", torch_record_ptsz_other_device},
                     {"record-free-ptsz-other-current", record_free_ptsz_other_current},
                     {"free-async-other-dead", free_async_other_dead},
                     {"free-async-other-dead-ptsz", free_async_other_dead_ptsz},
                     {"free-async-no-context", free_async_no_context},
                     {"malloc-async-other-device-zero", malloc_async_other_device_zero},
                     {"stats-nomem", stats_nomem},
                     {"stats-nomem-write", stats_nomem_write},
                     {"stand-in-nomem", stand_in_nomem},
                     {"oom-report-nomem", oom_report_nomem}};
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
        if (strcmp(s, scenarios[i].name) == 0) {
            scenarios[i].fn();
            return e2e_done(s);
        }
    fprintf(stderr, "usage: e2e_api plain|async|badinput|zero|trim|trim-unmap-fails|map-rollback-unmap-fails|stats|platform|dead-stream|"
                    "torch-legacy|torch-legacy-capture|torch-alloc-other-current-pool|torch-alloc-other-current-current|torch-record-stream|torch-record-cases|torch-record-immediate|torch-record-stale|torch-record-full|torch-record-other-default|torch-record-other-after-plain|torch-record-ptsz-other-device|record-free-ptsz-other-current|dead-stream-immediate|dead-stream-other-device|dead-stream-other-device-immediate|free-async-other-dead|free-async-other-dead-ptsz|free-async-no-context|malloc-async-other-device-zero|stats-nomem|stats-nomem-write|stand-in-nomem|oom-report-nomem\n");
    return 2;
}
