/*
 * e2e_green.c - green contexts (cuGreenCtxCreate) through the driver door.
 * A green context shares its primary context's memory, so its kernels use
 * the primary context's blocks, yet its streams are non-blocking and belong
 * to another context: the primary context's legacy stream does not wait for
 * them. A plain cuMemFree must still never hand its block to a new
 * allocation while work a green context queued before the free may use it.
 * Each fencing scenario fills the pool around one 1 MiB hole, so the next
 * 1 MiB allocation can only land in the block just freed, and queues work
 * that uses the block before freeing it. Scenarios:
 *
 *   shared-pool     allocations made while the green context is current come
 *                   from the primary context's pool (no second pool, which
 *                   would take the whole limit again)
 *   green-stream    work on a stream of cuGreenCtxStreamCreate
 *   green-default   work on the green context's default stream (the legacy
 *                   stream while it is current); freed plainly, and freed
 *                   with cuMemFreeAsync on that default stream
 *   green-default-after-pool  green-default with the pool made (and
 *                   ordered: a barrier instead of fences) before the green
 *                   context: the creation must end the ordered state
 *                   (mutation testing: without fences_ordered_end_device in
 *                   cuGreenCtxCreate the block came back under the work)
 *   green-capture   another stream of the green context captures when the
 *                   allocation comes: no fence may break that capture, and
 *                   none may pretend to cover the work
 *   green-destroy   the stream, then the green context, are destroyed
 *                   between the free and the allocation (no stale handle);
 *                   and the stream after a cuCtxDestroy of the converted
 *                   context, which is refused (green-capture and
 *                   green-async run once more after that refusal too: the
 *                   shim has forgotten the streams registered under the
 *                   converted context by then, and must fence them all
 *                   the same, since a green context's events cover them)
 *   green-async     cuMemFreeAsync on a green context's stream, the block
 *                   wanted by a stream of the primary context: it must come
 *                   back once the work is done (an event of the primary
 *                   context cannot be recorded on the green stream)
 *   green-async-capture-destroy  the green stream of a cuMemFreeAsync is
 *                   destroyed while another stream of its green context
 *                   captures (its lane's closing seal is refused then): the
 *                   block still comes back, no dead handle is used
 *   green-capture-destroyed  a stream of the green context is destroyed
 *                   while it captures, which ends its capture: the green
 *                   context's fences must be made again afterwards (a
 *                   capture still counted there refused them for good, and
 *                   a plain free never came back)
 *   green-second-capture-destroyed  a green stream with queued work begins
 *                   a capture while another of its green context's streams
 *                   captures, and is destroyed in it: its work from before
 *                   its begin must still be waited for
 *   green-fork      a green stream joins a capture begun on a primary
 *                   context's stream (a wait on an event recorded in it):
 *                   no fence may break that capture
 *   green-fork-destroyed  ... and is destroyed while in it: its work from
 *                   before the fork must still be waited for
 *   green-ptsz-fork  the green context's per-thread default stream (the
 *                   thread's CU_STREAM_PER_THREAD while the green context is
 *                   current) joins a capture begun on a primary context's
 *                   stream: no fence may break that capture (found by an
 *                   audit: the hooks counted forks of explicit streams only,
 *                   so the green context's count stayed 0 and a plain seal's
 *                   cuGreenCtxRecordEvent invalidated the capture)
 *   immediate-release  (BFCSHIM_FREE_POLICY=immediate, a growing pool over
 *                   virtual memory giving granules back at once) a plain
 *                   free under work queued on a green context's stream: the
 *                   granule goes back only after a cuCtxSynchronize of the
 *                   primary context, which waits for its green contexts too
 *                   (cuda.h); the work must find its block mapped (found by
 *                   an audit, where the fake did not wait for green contexts
 *                   there and the work found it unmapped)
 *   green-current-legacy, -legacy-nb, -stream, -async  work queued in the
 *                   primary context (legacy stream; with a non-blocking
 *                   stream made; on that stream, freed plainly or
 *                   stream-ordered), the next allocation made with the green
 *                   context current: not the block until the work ran, and
 *                   the block back after it (found by an audit)
 *   green-other-device  a device-0 block used on a stream of device 1's
 *                   green context and freed stream-ordered on it (device
 *                   0, device 1's green or primary context current): the
 *                   block comes back only after that work, no stale handle
 *   fake-green      (driver door closed: the fake itself) what cuda.h says
 *                   of green contexts, streams and events
 *   green-drvfail-destroy, -capture, -ctx-destroy  (the fake's fail_call)
 *                   a green stream with work on the hole is destroyed, or
 *                   begins a capture and is destroyed in it, or the green
 *                   context is destroyed with work on its default stream,
 *                   while the stand-in's cuGreenCtxRecordEvent fails and so
 *                   does the host wait that replaces it (cuStreamSynchronize,
 *                   cuCtxSynchronize): the block may be kept, never handed
 *                   out under that work (found by an audit: the failed wait
 *                   was ignored, and the block came back under the work;
 *                   the green context's was not even tried); each first
 *                   with the wait succeeding: the block comes back
 */
#include <cuda.h>
#include <dlfcn.h>

#include "e2e_cu.h"
#include "e2e_green.h"

#define MiB (UINT64_C(1) << 20)

static CUdevice dev0;
static CUcontext primary;

static void start(void)
{
    CHECK_EQ(D.Init(0), CUDA_SUCCESS);
    CHECK_EQ(D.DeviceGet(&dev0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&primary, dev0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
}

/* A green context with all of device 0's SMs, and its converted context. */
static CUgreenCtx make_green(CUcontext *converted) { return e2e_green_make(dev0, converted); }

static CUstream green_stream(CUgreenCtx g)
{
    CUstream s = NULL;
    CHECK_EQ(GR.GreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
    return s;
}

/* cuCtxDestroy of g's converted context, "a normal primary context"
 * (cuCtxFromGreenCtx): refused, and the context and the streams made in it
 * live on. */
static void destroy_refused(CUgreenCtx g)
{
    CUcontext converted = NULL;
    CHECK_EQ(GR.CtxFromGreenCtx(&converted, g), CUDA_SUCCESS);
    CHECK_EQ(D.CtxDestroy(converted), CUDA_ERROR_INVALID_CONTEXT);
}

/* The 1 MiB block *hole, and a filler that leaves less than 1 MiB anywhere
 * else in the pool. */
static CUdeviceptr fill_but_hole(CUdeviceptr *hole)
{
    *hole = alloc_ok(MiB);
    return alloc_ok(free_memory() - MiB / 2);
}

/* The work the tests queue: it writes the block, as a kernel would, and
 * says when it has run. */
static bool work_ran;
static void write_pattern(void *arg)
{
    memset((void *)(uintptr_t)arg, 0x5a, MiB);
    work_ran = true;
}

static void queue_work(CUstream s, CUdeviceptr p)
{
    work_ran = false;
    CHECK_EQ(fakecuda()->launch(s, write_pattern, (void *)(uintptr_t)p), 0);
}

/* Does block q (1 MiB, as every block here) take memory of the 1 MiB hole? */
static bool overlaps_hole(CUdeviceptr hole, CUdeviceptr q)
{
    return q < hole + MiB && hole < q + MiB;
}

/* q was allocated after the hole was freed under the queued work: if it
 * takes any of the hole's memory, that work must have run first. */
static void expect_safe(CUdeviceptr hole, CUdeviceptr q)
{
    if (overlaps_hole(hole, q) && !work_ran) {
        fprintf(stderr, "the freed block was handed out while work queued before its free "
                        "had not run\n");
        e2e_failures++;
    }
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
}

/* q, allocated after the hole p was freed under queued work, was handed
 * out only after that work and lies in the hole; then q and the filler
 * go back. */
static void hole_came_back(CUdeviceptr p, CUdeviceptr q, CUdeviceptr filler)
{
    expect_safe(p, q);
    CHECK(overlaps_hole(p, q));
    fakecuda()->complete_all();
    CHECK_EQ(D.MemFree(q), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(filler), CUDA_SUCCESS);
}

/* The hole, freed under the queued work, is wanted again; then the work is
 * let run and everything given back. */
static void take_hole_again(CUdeviceptr hole, CUdeviceptr filler)
{
    CUdeviceptr q = alloc_ok(MiB);
    expect_safe(hole, q);
    fakecuda()->complete_all();
    CHECK_EQ(D.MemFree(q), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(filler), CUDA_SUCCESS);
}

static void shared_pool(void)
{
    start();
    CUdeviceptr p = alloc_ok(MiB); /* makes the primary context's pool */
    fakecuda_stats s0 = fake_stats();
    CUcontext converted = NULL;
    CUgreenCtx g = make_green(&converted);
    CHECK(converted != NULL && converted != primary);
    CHECK_EQ(D.CtxSetCurrent(converted), CUDA_SUCCESS);
    CUdeviceptr q = alloc_ok(MiB);
    fakecuda_stats s1 = fake_stats();
    /* Served by the pool already there: no new region, nothing more taken
     * from the device. */
    CHECK_EQ(regions_taken(s1), regions_taken(s0));
    CHECK_EQ(s1.bytes_in_use[0], s0.bytes_in_use[0]);
    CUdeviceptr base = 0;
    size_t size = 0;
    CHECK_EQ(D.MemGetAddressRange(&base, &size, q), CUDA_SUCCESS);
    CHECK_EQ(base, q);
    CHECK_EQ(D.MemFree(q), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
}

/* What happens between the free and the next allocation: nothing, the
 * green stream is destroyed, or the stream and then the green context. */
typedef enum twist { NO_TWIST, STREAM_GONE, CONTEXT_GONE, REFUSED_THEN_STREAM_GONE } twist;

/* Work on a green stream writes the hole, which is freed plainly. */
static void on_green_stream_with(twist t)
{
    start();
    CUgreenCtx g = make_green(NULL);
    CUstream s = green_stream(g);
    if (t == REFUSED_THEN_STREAM_GONE) {
        destroy_refused(g);
        t = STREAM_GONE;
    }
    CUdeviceptr p, filler = fill_but_hole(&p);
    queue_work(s, p);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    if (t != NO_TWIST)
        CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS); /* returns; the work goes on */
    if (t == CONTEXT_GONE)
        CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
    take_hole_again(p, filler);
    if (t == NO_TWIST)
        CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    if (t != CONTEXT_GONE)
        CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().capture_invalidations, 0);
}

static void on_green_stream(void) { on_green_stream_with(NO_TWIST); }

/* Work on the green context's default stream; freed plainly from the
 * primary context, or stream-ordered on that default stream. */
static void on_green_default(bool async)
{
    start();
    CUcontext converted = NULL;
    CUgreenCtx g = make_green(&converted);
    CUdeviceptr p, filler = fill_but_hole(&p);
    CHECK_EQ(D.CtxSetCurrent(converted), CUDA_SUCCESS);
    queue_work(NULL, p); /* the legacy stream: the green context's default stream */
    if (async)
        CHECK_EQ(D.MemFreeAsync(p, NULL), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    if (!async)
        CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    take_hole_again(p, filler);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
}

static void green_default(void)
{
    on_green_default(false);
    on_green_default(true);
}

/* The pool is made, and ordered (a barrier on the legacy stream instead of
 * fences: no non-blocking stream, no green context yet), before the green
 * context: its creation must end that state, since the green context's
 * default stream is not in the primary context's legacy-stream order. Work
 * there writes the hole, which is freed plainly from the primary context. */
static void green_default_after_pool(void)
{
    start();
    CUdeviceptr p, filler = fill_but_hole(&p);
    CUdeviceptr r = alloc_ok(MiB / 4); /* the pool ordered, serving */
    CHECK_EQ(D.MemFree(r), CUDA_SUCCESS);
    CUcontext converted = NULL;
    CUgreenCtx g = make_green(&converted);
    CHECK_EQ(D.CtxSetCurrent(converted), CUDA_SUCCESS);
    queue_work(NULL, p); /* the green context's default stream */
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    take_hole_again(p, filler);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
}

static void green_capture_with(bool refused_destroy)
{
    start();
    CUgreenCtx g = make_green(NULL);
    CUstream s = green_stream(g), c = green_stream(g);
    if (refused_destroy)
        destroy_refused(g);
    CUdeviceptr p, filler = fill_but_hole(&p);
    queue_work(s, p);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    CHECK_EQ(D.StreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    /* Nothing fits but the freed block, and no fence covering the green
     * context can be made while it captures: out of memory is the honest
     * answer, the freed block with its work pending the wrong one. */
    CUdeviceptr q = 0;
    CUresult r = D.MemAlloc(&q, MiB);
    CHECK(r == CUDA_SUCCESS || r == CUDA_ERROR_OUT_OF_MEMORY);
    if (r == CUDA_SUCCESS) {
        expect_safe(p, q);
        CHECK_EQ(D.MemFree(q), CUDA_SUCCESS);
    }
    CHECK_EQ(fake_stats().capture_invalidations, 0);
    CUgraph graph;
    CHECK_EQ(D.StreamEndCapture(c, &graph), CUDA_SUCCESS);
    /* Once the capture is over, the fence is made and the block's memory
     * comes back (after its work, which the allocation waits for if it
     * must). Where in the hole and the half MiB beside it the new block
     * goes is the placement rule's choice: a pool over virtual memory that
     * reserved overflow address space for the allocation above places by
     * the rules of virtual memory from then on. */
    q = alloc_ok(MiB);
    hole_came_back(p, q, filler);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(c), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
}

static void green_capture(void)
{
    green_capture_with(false);
    green_capture_with(true);
}

/* While a fork of the capture on t holds the block freed under its work:
 * an allocation may not take the block early (it may find no memory). */
static void allocate_during_fork(CUdeviceptr p)
{
    CUdeviceptr q = 0;
    CUresult r = D.MemAlloc(&q, MiB);
    CHECK(r == CUDA_SUCCESS || r == CUDA_ERROR_OUT_OF_MEMORY);
    if (r == CUDA_SUCCESS) {
        expect_safe(p, q);
        CHECK_EQ(D.MemFree(q), CUDA_SUCCESS);
    }
}

/* The fork joined back (join recorded on it), the capture on t ended: the
 * hole comes back. */
static void join_end_and_take_hole(CUstream t, CUevent join, CUdeviceptr p, CUdeviceptr filler)
{
    CHECK_EQ(D.StreamWaitEvent(t, join, 0), CUDA_SUCCESS);
    CUgraph graph = NULL;
    CHECK_EQ(D.StreamEndCapture(t, &graph), CUDA_SUCCESS);
    hole_came_back(p, alloc_ok(MiB), filler);
}

/* A capture begun on t, and s forked into it (a wait on an event recorded
 * there). */
static void begin_and_fork(CUstream t, CUstream s)
{
    CHECK_EQ(D.StreamBeginCapture(t, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CUevent fork = NULL;
    CHECK_EQ(D.EventCreate(&fork, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(fork, t), CUDA_SUCCESS);
    CHECK_EQ(D.StreamWaitEvent(s, fork, 0), CUDA_SUCCESS);
}

/* A green stream joins a capture begun on a stream of the primary context
 * (a fork: it waits on an event recorded in the capture). Were it not
 * counted in its green context, a plain seal would make
 * cuGreenCtxRecordEvent, which "will invalidate all the conflicting
 * captures" (cuda.h): the program's capture must come through intact (the
 * audit of 0fac580 found it invalidated). */
static void green_fork(void)
{
    start();
    CUcontext converted = NULL;
    CUgreenCtx g = make_green(&converted);
    CUstream s = green_stream(g), t = NULL;
    CHECK_EQ(D.StreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr p, filler = fill_but_hole(&p);
    queue_work(s, p);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    fakecuda_stats s0 = fake_stats();
    CHECK_EQ(D.StreamBeginCapture(t, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CUevent fork = NULL, join = NULL;
    CHECK_EQ(D.EventCreate(&fork, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(converted), CUDA_SUCCESS); /* (the join is recorded on s) */
    CHECK_EQ(D.EventCreate(&join, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(fork, t), CUDA_SUCCESS);
    CHECK_EQ(D.StreamWaitEvent(s, fork, 0), CUDA_SUCCESS);
    allocate_during_fork(p);
    CHECK_EQ(fake_stats().capture_invalidations, s0.capture_invalidations);
    CHECK_EQ(D.EventRecord(join, s), CUDA_SUCCESS);
    join_end_and_take_hole(t, join, p, filler);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(t), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
}

/* green-fork, with the green stream destroyed while it is in the capture:
 * its stand-in (cuGreenCtxRecordEvent) is refused while it captures, so is
 * the host wait (cuStreamSynchronize of a capturing stream), and later green
 * events leave a destroyed stream's work out; only a stand-in recorded when
 * it joined the capture covers its earlier work (the audit of 0fac580
 * found the block handed out early). */
static void green_fork_destroyed(void)
{
    start();
    CUgreenCtx g = make_green(NULL);
    CUstream s = green_stream(g), t = NULL;
    CHECK_EQ(D.StreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr p, filler = fill_but_hole(&p);
    queue_work(s, p);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    begin_and_fork(t, s);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CUdeviceptr q = 0;
    CUresult r = D.MemAlloc(&q, MiB);
    CHECK(r == CUDA_SUCCESS || r == CUDA_ERROR_OUT_OF_MEMORY);
    if (r == CUDA_SUCCESS)
        expect_safe(p, q);
    CUgraph graph = NULL;
    D.StreamEndCapture(t, &graph);
    if (r != CUDA_SUCCESS) {
        q = alloc_ok(MiB);
        expect_safe(p, q);
    }
    fakecuda()->complete_all();
    CHECK_EQ(D.MemFree(q), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(filler), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(t), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
}

/* green-fork with the green context's per-thread default stream as the
 * fork: with the converted context current, CU_STREAM_PER_THREAD names a
 * (blocking) stream of the green context, and a wait on an event recorded
 * in the capture makes it join. capture.c's may_fork leaves the
 * per-thread handle out, so the fork is not counted in its green context,
 * and the next plain seal records cuGreenCtxRecordEvent, which "will
 * invalidate all the conflicting captures" (cuda.h; the fake does). */
static void green_ptsz_fork(void)
{
    start();
    CUcontext converted = NULL;
    CUgreenCtx g = make_green(&converted);
    CUstream t = NULL;
    CHECK_EQ(D.StreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr p, filler = fill_but_hole(&p);
    CHECK_EQ(D.CtxSetCurrent(converted), CUDA_SUCCESS);
    queue_work(CU_STREAM_PER_THREAD, p); /* the green context's per-thread stream */
    CUevent join = NULL;
    CHECK_EQ(D.EventCreate(&join, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    fakecuda_stats s0 = fake_stats();
    CHECK_EQ(D.StreamBeginCapture(t, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CUevent fork = NULL;
    CHECK_EQ(D.EventCreate(&fork, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(fork, t), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(converted), CUDA_SUCCESS);
    CHECK_EQ(D.StreamWaitEvent(CU_STREAM_PER_THREAD, fork, 0), CUDA_SUCCESS); /* the fork */
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    const uint64_t green_records = e2e_calls_of("cuGreenCtxRecordEvent");
    allocate_during_fork(p);
    fakecuda_stats s1 = fake_stats();
    if (s1.capture_invalidations != s0.capture_invalidations)
        fprintf(stderr, "a fence the shim made while the green context's per-thread stream "
                        "was in the capture invalidated it (%llu invalidation(s), %llu "
                        "cuGreenCtxRecordEvent call(s) in the allocation)\n",
                (unsigned long long)(s1.capture_invalidations - s0.capture_invalidations),
                (unsigned long long)(e2e_calls_of("cuGreenCtxRecordEvent") - green_records));
    CHECK_EQ(s1.capture_invalidations, s0.capture_invalidations);
    CHECK_EQ(D.CtxSetCurrent(converted), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(join, CU_STREAM_PER_THREAD), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    join_end_and_take_hole(t, join, p, filler);
    CHECK_EQ(D.StreamDestroy(t), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
}

/* green-fork, but the capture ends by the destroy of its origin stream
 * (which ends every stream of it) rather than by an end: the fork's entry
 * must go with it, or the green context's fences stay refused. */
static void green_fork_origin_destroyed(void)
{
    start();
    CUgreenCtx g = make_green(NULL);
    CUstream s = green_stream(g), t = NULL;
    CHECK_EQ(D.StreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr p, filler = fill_but_hole(&p);
    begin_and_fork(t, s);
    CHECK_EQ(D.StreamDestroy(t), CUDA_SUCCESS); /* the capture ends with it */
    queue_work(s, p);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    fakecuda()->complete_all();
    CUdeviceptr q = 0;
    CUresult r = D.MemAlloc(&q, MiB);
    if (r != CUDA_SUCCESS)
        fprintf(stderr, "the freed block never came back after the fork's capture ended by "
                        "its origin's destroy (%d)\n", (int)r);
    CHECK_EQ(r, CUDA_SUCCESS);
    if (r == CUDA_SUCCESS)
        CHECK_EQ(D.MemFree(q), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(filler), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().capture_invalidations, 0);
}

static void green_destroy(void)
{
    on_green_stream_with(STREAM_GONE);
    on_green_stream_with(CONTEXT_GONE);
    on_green_stream_with(REFUSED_THEN_STREAM_GONE);
}

static void green_async_with(bool refused_destroy)
{
    start();
    CUgreenCtx g = make_green(NULL);
    CUstream s = green_stream(g), t = NULL;
    if (refused_destroy)
        destroy_refused(g);
    CHECK_EQ(D.StreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr p = 0;
    CHECK_EQ(D.MemAllocAsync(&p, MiB, s), CUDA_SUCCESS);
    CUdeviceptr filler = alloc_ok(free_memory() - MiB / 2);
    queue_work(s, p);
    CHECK_EQ(D.MemFreeAsync(p, s), CUDA_SUCCESS);
    /* Another stream wants the block: it may have it once the green
     * stream's work is done (the allocation may wait for it), never before. */
    CUdeviceptr q = 0;
    CHECK_EQ(D.MemAllocAsync(&q, MiB, t), CUDA_SUCCESS);
    expect_safe(p, q);
    CHECK_EQ(q, p);
    fakecuda()->complete_all();
    CHECK_EQ(D.MemFreeAsync(q, t), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(filler), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(t), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().capture_invalidations, 0);
}

static void green_async(void)
{
    green_async_with(false);
    green_async_with(true);
}

/* green-async-capture-destroy: a block freed stream-ordered on a green
 * stream, which is then destroyed while another stream of its green
 * context captures: the lane's closing seal cannot be made then (no green
 * event during a capture). The block must come back all the same once the
 * capture is over, and the dead stream's handle must never be used. */
static void green_async_capture_destroy(void)
{
    start();
    CUgreenCtx g = make_green(NULL);
    CUstream s = green_stream(g), c = green_stream(g), t = NULL;
    CHECK_EQ(D.StreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr p = 0;
    CHECK_EQ(D.MemAllocAsync(&p, MiB, s), CUDA_SUCCESS);
    CUdeviceptr filler = alloc_ok(free_memory() - MiB / 2);
    queue_work(s, p);
    CHECK_EQ(D.MemFreeAsync(p, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CUgraph graph;
    CHECK_EQ(D.StreamEndCapture(c, &graph), CUDA_SUCCESS);
    CUdeviceptr q = 0;
    CHECK_EQ(D.MemAllocAsync(&q, MiB, t), CUDA_SUCCESS);
    expect_safe(p, q);
    CHECK(overlaps_hole(p, q)); /* the block came back */
    fakecuda()->complete_all();
    CHECK_EQ(D.MemFreeAsync(q, t), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(filler), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(c), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(t), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().capture_invalidations, 0);
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
}

/* green-capture-destroyed: the capture on c ends with c's destruction; the
 * block freed under work on s must then come back once that work is done,
 * which takes a fence covering the green context. */
static void green_capture_destroyed(void)
{
    start();
    CUgreenCtx g = make_green(NULL);
    CUstream s = green_stream(g), c = green_stream(g);
    CUdeviceptr p, filler = fill_but_hole(&p);
    queue_work(s, p);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    CHECK_EQ(D.StreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(c), CUDA_SUCCESS);
    CUdeviceptr q = 0;
    CHECK_EQ(D.MemAlloc(&q, MiB), CUDA_SUCCESS); /* (waits for the work if it must) */
    hole_came_back(p, q, filler);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().capture_invalidations, 0);
}

/* green-second-capture-destroyed: stream d of the green context queues
 * work on the block and it is freed while stream c captures (so no green
 * event can be recorded); then d begins a capture of its own and is
 * destroyed in it. The driver refuses to wait for a capturing stream, and
 * the green context's event after c's end does not cover a destroyed
 * stream's work (the fake's harsher reading of cuda.h): the host must have
 * waited for d's work when d began. (Before, d's destroy asked the driver
 * to synchronise the capturing d, which it refused, and the block was
 * handed out under d's work.) */
static void green_second_capture_destroyed(void)
{
    start();
    CUgreenCtx g = make_green(NULL);
    CUstream c = green_stream(g), d = green_stream(g);
    CUdeviceptr p, filler = fill_but_hole(&p);
    CHECK_EQ(D.StreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    queue_work(d, p);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    CHECK_EQ(D.StreamBeginCapture(d, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(d), CUDA_SUCCESS);
    CUgraph graph = NULL;
    CHECK_EQ(D.StreamEndCapture(c, &graph), CUDA_SUCCESS);
    CHECK(graph != NULL);
    CUdeviceptr q = 0;
    CHECK_EQ(D.MemAlloc(&q, MiB), CUDA_SUCCESS);
    hole_came_back(p, q, filler);
    CHECK_EQ(D.StreamDestroy(c), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().capture_invalidations, 0);
}

/* Work that writes its block if the block is still mapped, and says whether
 * it found it so. */
typedef struct late_write {
    CUdeviceptr at;
    bool ran, unmapped;
} late_write;

static void write_if_mapped(void *arg)
{
    late_write *w = arg;
    w->unmapped = !fakecuda()->is_device_pointer(w->at) ||
                  !fakecuda()->is_device_pointer(w->at + MiB - 1);
    if (!w->unmapped)
        memset((void *)(uintptr_t)w->at, 0x5a, MiB);
    w->ran = true;
}

static void immediate_release(void)
{
    start();
    CUgreenCtx g = e2e_green_make(dev0, NULL);
    CUstream s = NULL;
    CHECK_EQ(GR.GreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
    late_write w = {.at = alloc_ok(MiB)};
    CHECK_EQ(fakecuda()->launch(s, write_if_mapped, &w), 0);
    uint64_t unmaps = fake_stats().vmm_unmap_calls;
    CHECK_EQ(D.MemFree(w.at), CUDA_SUCCESS);
    /* its granule went back (release threshold 0): after the green work */
    CHECK(fake_stats().vmm_unmap_calls > unmaps);
    CHECK(w.ran);
    fakecuda()->complete_all();
    CHECK(w.ran && !w.unmapped);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
}

/* An allocation made with the green context's converted context current,
 * after a free under work queued in the primary context (its legacy stream
 * and a plain free; a non-blocking stream and a plain or stream-ordered
 * free): its pool is the primary's, whose seals must run with the primary
 * context current (found by an audit: the legacy lane's barrier went on
 * the green default stream, so the block came back under the primary's
 * work; and events made in the converted context were refused on primary
 * streams and recycled, so every later seal failed and no free came back). */
static void alloc_green_current(int kind)
{
    start();
    CUcontext converted = NULL;
    CUgreenCtx g = make_green(&converted);
    CUstream nb = NULL;
    if (kind != 0)
        CHECK_EQ(D.StreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr p, filler = fill_but_hole(&p);
    queue_work(kind <= 1 ? NULL : nb, p);
    if (kind == 3)
        CHECK_EQ(D.MemFreeAsync(p, nb), CUDA_SUCCESS);
    else
        CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(converted), CUDA_SUCCESS);
    CUdeviceptr q = 0;
    CUresult r = D.MemAlloc(&q, MiB);
    if (r == CUDA_SUCCESS)
        expect_safe(p, q);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    fakecuda()->complete_all();
    if (r == CUDA_SUCCESS)
        CHECK_EQ(D.MemFree(q), CUDA_SUCCESS);
    /* and the block comes back once the work is done */
    CUdeviceptr q2 = 0;
    CHECK_EQ(D.MemAlloc(&q2, MiB), CUDA_SUCCESS);
    if (q2)
        CHECK_EQ(D.MemFree(q2), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(filler), CUDA_SUCCESS);
    if (nb)
        CHECK_EQ(D.StreamDestroy(nb), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
}

static void green_current_legacy(void) { alloc_green_current(0); }
static void green_current_legacy_nb(void) { alloc_green_current(1); }
static void green_current_stream(void) { alloc_green_current(2); }
static void green_current_async(void) { alloc_green_current(3); }

/* The fake driver's green contexts, against cuda.h (driver door closed). */
static void fake_green(void)
{
    start();
    CUdevResource sms;
    CUdevResourceDesc desc = NULL;
    CUgreenCtx g = NULL;
    CHECK_EQ(GR.DeviceGetDevResource(dev0, &sms, CU_DEV_RESOURCE_TYPE_SM), CUDA_SUCCESS);
    CHECK(sms.sm.smCount > 0);
    CHECK(sms.sm.smCoscheduledAlignment && sms.sm.smCount % sms.sm.smCoscheduledAlignment == 0);
    CUdevResource other;
    CHECK_EQ(GR.DeviceGetDevResource(dev0, &other, CU_DEV_RESOURCE_TYPE_INVALID),
             CUDA_ERROR_INVALID_RESOURCE_TYPE);
    /* Two SM resources that are not one split's outputs */
    CUdevResource two[2] = {sms, sms};
    CHECK_EQ(GR.DevResourceGenerateDesc(&desc, two, 2), CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    CHECK_EQ(GR.DevResourceGenerateDesc(&desc, &sms, 1), CUDA_SUCCESS);
    /* "CU_GREEN_CTX_DEFAULT_STREAM is required" */
    CHECK_EQ(GR.GreenCtxCreate(&g, desc, dev0, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(GR.GreenCtxCreate(&g, desc, 99, CU_GREEN_CTX_DEFAULT_STREAM),
             CUDA_ERROR_INVALID_DEVICE);
    CHECK_EQ(GR.GreenCtxCreate(&g, desc, dev0, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_SUCCESS);
    CUcontext converted = NULL, cur = NULL;
    CHECK_EQ(GR.CtxFromGreenCtx(&converted, g), CUDA_SUCCESS);
    CHECK(converted != primary);
    /* "The API does not set the green context current" */
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    /* "CU_STREAM_NON_BLOCKING must be specified" */
    CUstream s = NULL;
    CHECK_EQ(GR.GreenCtxStreamCreate(&s, g, 0, 0), CUDA_ERROR_INVALID_VALUE);
    /* and nothing cuStreamCreate's list of valid flags lacks */
    CHECK_EQ(GR.GreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING | 0x2, 0),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(GR.GreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
    CUgreenCtx got = NULL;
    CHECK_EQ(GR.StreamGetCtx(s, &cur), CUDA_SUCCESS);
    CHECK(cur == converted);
    CHECK_EQ(GR.StreamGetCtx_v2(s, &cur, &got), CUDA_SUCCESS);
    CHECK(cur == primary && got == g);
    CHECK_EQ(GR.StreamGetGreenCtx(s, &got), CUDA_SUCCESS);
    CHECK(got == g);
    /* Memory made with the green context current is the primary's. */
    CHECK_EQ(D.CtxSetCurrent(converted), CUDA_SUCCESS);
    CUdeviceptr p = 0;
    CHECK_EQ(D.MemAlloc(&p, MiB), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    /* An event of the primary context cannot be recorded on the green
     * stream; cuGreenCtxRecordEvent takes it and covers the stream's work
     * and the default stream's. */
    CUevent e = NULL;
    CHECK_EQ(GR.EventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(GR.EventRecord(e, s), CUDA_ERROR_INVALID_HANDLE);
    queue_work(s, p);
    CHECK_EQ(GR.GreenCtxRecordEvent(g, e), CUDA_SUCCESS);
    CHECK_EQ(GR.EventQuery(e), CUDA_ERROR_NOT_READY);
    fakecuda()->complete(s);
    CHECK_EQ(GR.EventQuery(e), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(converted), CUDA_SUCCESS);
    queue_work(NULL, p);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxRecordEvent(g, e), CUDA_SUCCESS);
    CHECK_EQ(GR.EventQuery(e), CUDA_ERROR_NOT_READY);
    fakecuda()->complete_all();
    CHECK_EQ(GR.EventQuery(e), CUDA_SUCCESS);
    /* While a stream of the green context captures: refused, and the
     * capture is invalidated. */
    fakecuda_stats s0 = fake_stats();
    CHECK_EQ(D.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxRecordEvent(g, e), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK_EQ(fake_stats().capture_invalidations, s0.capture_invalidations + 1);
    CUgraph graph;
    CHECK_EQ(D.StreamEndCapture(s, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* "If the current context is the primary context, green contexts that
     * have been created will also be synchronized" (cuCtxSynchronize):
     * their work completes; while one of their streams captures, the
     * synchronisation is refused (the harsher reading, as for the
     * context's own streams) and the capture invalidated. */
    queue_work(s, p);
    CHECK_EQ(D.CtxSynchronize(), CUDA_SUCCESS);
    CHECK(work_ran);
    CHECK_EQ(fakecuda()->pending(s), 0);
    s0 = fake_stats();
    CHECK_EQ(D.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK_EQ(fake_stats().capture_invalidations, s0.capture_invalidations + 1);
    CHECK_EQ(D.StreamEndCapture(s, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* The green context's own synchronisation does not reach the primary
     * context's work. */
    queue_work(NULL, p);
    CHECK_EQ(D.CtxSetCurrent(converted), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSynchronize(), CUDA_SUCCESS);
    CHECK(!work_ran);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSynchronize(), CUDA_SUCCESS);
    CHECK(work_ran);
    /* A destroyed stream's queued work is no longer the green context's
     * (the harsher reading): only a stand-in recorded before covers it. */
    queue_work(s, p);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxRecordEvent(g, e), CUDA_SUCCESS);
    CHECK_EQ(GR.EventQuery(e), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->pending(s), 1);
    fakecuda()->complete_all();
    /* Destroyed: its memory stays (it is the primary's), handles die. */
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CHECK_EQ(GR.GreenCtxRecordEvent(g, e), CUDA_ERROR_INVALID_CONTEXT);
    CHECK(fakecuda()->is_device_pointer(p));
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
}

/* green-other-device: a device-0 block used by work on a stream of a green
 * context of device 1 (peer access), then freed stream-ordered on that
 * stream (cuMemFreeAsync allows any stream), with device 0's primary
 * context current, device 1's green context current, or device 1's
 * primary context current. No lane of device 0's pool can fence a stream
 * of another device, so the shim makes that stream act (an event recorded
 * on it, a green context's event, and waited for there) and waits for it on
 * the host: the block must not come back under the work, and no handle may
 * be used in a context that cannot take it (an audit's check: safe; fails
 * when the foreign stream is not waited for). */
static void green_other_device(void)
{
    for (int current = 0; current < 3; current++) {
        start();
        CUdevice dev1;
        CHECK_EQ(D.DeviceGet(&dev1, 1), CUDA_SUCCESS);
        CUcontext converted1 = NULL, primary1 = NULL;
        CUgreenCtx g1 = e2e_green_make(dev1, &converted1);
        CHECK_EQ(D.DevicePrimaryCtxRetain(&primary1, dev1), CUDA_SUCCESS);
        CUstream s1 = green_stream(g1);
        CUdeviceptr p, filler = fill_but_hole(&p);
        const uint64_t stale = fake_stats().stale_handle_uses;
        queue_work(s1, p);
        CHECK_EQ(D.CtxSetCurrent(current == 0   ? primary
                                 : current == 1 ? converted1
                                                : primary1),
                 CUDA_SUCCESS);
        CHECK_EQ(D.MemFreeAsync(p, s1), CUDA_SUCCESS);
        CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
        CUdeviceptr q = alloc_ok(MiB);
        expect_safe(p, q);
        fprintf(stderr, "current %d: the work %s before the next allocation; %s the hole\n",
                current, work_ran ? "ran" : "had not run", q == p ? "it took" : "not");
        CHECK_EQ(fake_stats().stale_handle_uses, stale);
        fakecuda()->complete_all();
        CHECK_EQ(D.MemFree(q), CUDA_SUCCESS);
        CHECK_EQ(D.MemFree(filler), CUDA_SUCCESS);
        CHECK_EQ(D.StreamDestroy(s1), CUDA_SUCCESS);
        CHECK_EQ(GR.GreenCtxDestroy(g1), CUDA_SUCCESS);
        CHECK_EQ(D.DevicePrimaryCtxRelease(dev1), CUDA_SUCCESS);
        CHECK_EQ(fake_stats().capture_invalidations, 0);
    }
}

/* The green-drvfail scenarios: the next call of the stand-in's entry point
 * answers `code`, and with wait_fails so does the next of each host wait's
 * (fail_call); code 0 clears them. */
static void fail_next(bool wait_fails, int code)
{
    static const char *const names[] = {"cuGreenCtxRecordEvent", "cuStreamSynchronize",
                                        "cuCtxSynchronize"};
    for (size_t i = 0; i < (wait_fails || !code ? 3 : 1); i++)
        CHECK_EQ(fakecuda()->fail_call(names[i], code ? 1 : 0, code, 0), 0);
}

/* The hole, freed once nothing but what the shim did when the stand-in
 * failed covers the work on it, is wanted again: not while the work is
 * queued. When the host could wait, the work has run and the hole comes
 * back; else the allocation may fail (the pool keeps its freed blocks). */
static void hole_not_under_work(CUdeviceptr p, CUdeviceptr filler, bool waited)
{
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    CUdeviceptr q = 0;
    CUresult r = D.MemAlloc(&q, MiB);
    CHECK(r == CUDA_SUCCESS || (!waited && r == CUDA_ERROR_OUT_OF_MEMORY));
    if (r == CUDA_SUCCESS)
        expect_safe(p, q);
    if (waited)
        CHECK(work_ran && overlaps_hole(p, q));
    fakecuda()->complete_all();
    if (r == CUDA_SUCCESS)
        CHECK_EQ(D.MemFree(q), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(filler), CUDA_SUCCESS);
}

/* green-drvfail-destroy: the green stream is destroyed. Each scenario runs
 * twice: the host wait succeeds, then fails too (the pool keeps its freed
 * blocks from then on). */
static void green_drvfail_destroy_with(bool wait_fails)
{
    start();
    CUgreenCtx g = make_green(NULL);
    CUstream s = green_stream(g);
    CUdeviceptr p, filler = fill_but_hole(&p);
    queue_work(s, p);
    fail_next(wait_fails, CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS); /* returns; the work goes on */
    fail_next(wait_fails, 0);
    hole_not_under_work(p, filler, !wait_fails);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().capture_invalidations, 0);
}

static void green_drvfail_destroy(void)
{
    green_drvfail_destroy_with(false);
    green_drvfail_destroy_with(true);
}

/* green-drvfail-capture: the green stream begins a capture (no event can
 * be recorded on it from then on, nor can it be waited for) and is
 * destroyed in it, which ends the capture. */
static void green_drvfail_capture_with(bool wait_fails)
{
    start();
    CUgreenCtx g = make_green(NULL);
    CUstream s = green_stream(g);
    CUdeviceptr p, filler = fill_but_hole(&p);
    queue_work(s, p);
    fail_next(wait_fails, CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(D.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    fail_next(wait_fails, 0);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    hole_not_under_work(p, filler, !wait_fails);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
}

static void green_drvfail_capture(void)
{
    green_drvfail_capture_with(false);
    green_drvfail_capture_with(true);
}

/* green-drvfail-ctx-destroy: work on the green context's default stream,
 * then the green context is destroyed (cuda.h does not say that it waits
 * for that work: the fake does not). */
static void green_drvfail_ctx_destroy_with(bool wait_fails)
{
    start();
    CUcontext converted = NULL;
    CUgreenCtx g = make_green(&converted);
    CUdeviceptr p, filler = fill_but_hole(&p);
    CHECK_EQ(D.CtxSetCurrent(converted), CUDA_SUCCESS);
    queue_work(NULL, p);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    fail_next(wait_fails, CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(GR.GreenCtxDestroy(g), CUDA_SUCCESS);
    fail_next(wait_fails, 0);
    hole_not_under_work(p, filler, !wait_fails);
    CHECK_EQ(fake_stats().capture_invalidations, 0);
}

static void green_drvfail_ctx_destroy(void)
{
    green_drvfail_ctx_destroy_with(false);
    green_drvfail_ctx_destroy_with(true);
}

int main(int argc, char **argv)
{
    static const e2e_scenario scenarios[] = {
        {"shared-pool", shared_pool},     {"green-stream", on_green_stream},
        {"green-default", green_default}, {"green-capture", green_capture},
        {"green-default-after-pool", green_default_after_pool},
        {"green-destroy", green_destroy}, {"green-async", green_async},
        {"green-async-capture-destroy", green_async_capture_destroy},
        {"green-capture-destroyed", green_capture_destroyed},
        {"green-second-capture-destroyed", green_second_capture_destroyed},
        {"fake-green", fake_green},
        {"immediate-release", immediate_release},
        {"green-current-legacy", green_current_legacy},
        {"green-current-legacy-nb", green_current_legacy_nb},
        {"green-current-stream", green_current_stream},
        {"green-current-async", green_current_async},
        {"green-fork", green_fork},
        {"green-fork-destroyed", green_fork_destroyed},
        {"green-ptsz-fork", green_ptsz_fork},
        {"green-fork-origin-destroyed", green_fork_origin_destroyed},
        {"green-other-device", green_other_device},
        {"green-drvfail-destroy", green_drvfail_destroy},
        {"green-drvfail-capture", green_drvfail_capture},
        {"green-drvfail-ctx-destroy", green_drvfail_ctx_destroy},
    };
    e2e_cu_load();
    e2e_green_load();
    return e2e_main("e2e_green", scenarios, sizeof scenarios / sizeof scenarios[0], argc, argv);
}
