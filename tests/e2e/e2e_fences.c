/*
 * e2e_fences.c - a plain cudaFree must never hand its block to a new
 * allocation while work queued before the free may still use it, whatever
 * happens to the streams meanwhile. Each scenario fills the pool around one
 * 1 MiB hole, so the next 1 MiB allocation can only land in the block just
 * freed; work queued on a stream before the free is still pending on the
 * fake GPU, and the allocation must not return that block until it has
 * completed (fakecuda's pending() says). Scenarios:
 *
 *   stream-destroy   the stream is destroyed (cuStreamDestroy returns at once,
 *                    its work goes on) before the free
 *   destroy-after    ... after the free, before the next allocation
 *   stream-destroy-v1  stream-destroy with the v1 cuStreamDestroy that
 *                    libcuda still exports for old binaries, found by dlsym
 *                    on libcuda's handle, by cuGetProcAddress below 4000 and
 *                    as the global symbol (driver door only)
 *   capture-begin    the stream begins a capture between the free and the
 *                    next allocation
 *   capture-to-graph the same with cudaStreamBeginCaptureToGraph, into a
 *                    graph the program made (CUDA 12.3's other way in)
 *   capture-fork     the stream joins another stream's capture between the
 *                    free and the next allocation, by waiting on an event
 *                    recorded in it (a fork: no begin on the stream itself)
 *   free-in-fork     ... and the block is freed while it is in the capture
 *   capture-fork-ptsz  capture-fork with the fork's wait made through
 *                    cuStreamWaitEvent_ptsz
 *   fork-destroyed   the fork is destroyed while in the capture (-async: the
 *                    block freed stream-ordered on it before the fork)
 *   stale-begun      the stream's earlier capture ended where the shim
 *                    could not see (libe2einterposer.so), then it is forked
 *                    into another: the stale entry stands in for nothing
 *   ptsz-fork        the thread's per-thread default stream is the fork
 *                    (-driver: through cuStreamWaitEvent_ptsz on stream 0)
 *   fork-unseen-end  a stream forks into a capture begun and ended where
 *                    the shim cannot see (libe2einterposer.so), while a
 *                    capture it counts is under way: once that one ends the
 *                    fork is counted no more, and a stream-ordered pair asks
 *                    no capture question
 *   legacy-capture   work on the legacy stream, then a blocking stream begins
 *                    capturing (the legacy stream becomes unusable): the
 *                    freed block waits for the capture's end
 *   ptsz-capture     another thread captures on its per-thread default stream:
 *                    the shim must not touch the legacy stream meanwhile
 *   global-capture   another thread captures in global mode: the shim's own
 *                    fence queries must neither break that capture nor take a
 *                    refused query as "complete"
 *   reset-streams    cudaDeviceReset with streams alive, then enough
 *                    allocations and frees that frees must retire; no stale
 *                    stream handle may be used (the real driver crashed)
 *   ctx-reuse        a created context is destroyed with streams alive and a
 *                    new one gets its handle value (ctx-reuse-v1: destroyed
 *                    with the v1 cuCtxDestroy, from cuGetProcAddress below
 *                    4000; driver door only)
 *   stream-device    stream-ordered allocations on a stream of device 1 while
 *                    device 0 is current: served from device 1's pool and
 *                    fenced there (else the blocks never retire)
 *   custom-pool      after cudaDeviceSetMemPool(dev, pool of the program's),
 *                    cudaMallocAsync on that device is the program's pool's;
 *                    cudaMallocFromPoolAsync naming the default pool is ours
 *   free-dead-stream, alloc-dead-stream  stream-ordered calls on a destroyed
 *                    stream are refused as CUDA refuses them, the shim asking
 *                    the driver nothing about the dead handle
 *                    (dead-stream-reborn: its handle given to a new stream
 *                    is served again; -unseen, with the driver door closed,
 *                    also a stream made where the shim does not see it;
 *                    -in-window, made by another thread as the driver
 *                    destroys the old one)
 *   stream-churn     streams made and destroyed on one thread while another
 *                    allocates and frees stream-ordered: all served (TSan)
 *   legacy-while-capturing, legacy-alloc-while-capturing  stream-ordered
 *                    calls on the legacy stream while a blocking stream
 *                    captures: refused, the capture invalidated (-new-thread:
 *                    the free made by a thread with no context current yet)
 *   capture-v1       a capture begun with CUDA 10.0's cuStreamBeginCapture
 *                    (dlsym, cuGetProcAddress at 10000): a stream-ordered
 *                    allocation on its stream is still the graph's
 *   ordered-reuse    no non-blocking stream: the block comes back at once,
 *                    its old work on a blocking stream still queued, and the
 *                    new owner's work on another blocking stream (the
 *                    per-thread one) runs after it (the seal's barrier)
 *   legacy-lane-ptsz  work on this thread's per-thread stream, a free on the
 *                    legacy stream, an allocation there by another thread
 *                    that uses the block on its own per-thread stream: the
 *                    implicit legacy-stream order must hold
 *   legacy-lane-destroyed  a pool with a non-blocking stream: work on a
 *                    blocking stream, a free on the legacy stream, the
 *                    stream destroyed, the block back on the legacy stream
 *                    in stream order: the new owner's work on the
 *                    per-thread stream still runs after the old owner's
 *   legacy-alloc-destroyed, -after  the stream destroyed before (after) a
 *                    cudaFree of the block, which is then allocated on the
 *                    legacy stream: its stand-in, not the legacy stream's
 *                    wait (which leaves destroyed streams out), covers it
 *   ordered-destroyed-then-non-blocking, ordered-destroyed-reused-then-
 *                    non-blocking  the same in an ordered pool that a
 *                    non-blocking stream ends before the allocation, or
 *                    after the block came back behind the barrier (and is
 *                    used on that stream)
 *   legacy-reuse-stuck-events, -ordered  a block freed on the legacy stream
 *                    behind a kernel that never ends, allocated there
 *                    again with the pool full: it comes back at once (in
 *                    stream order, as CUDA's), no host wait for the kernel
 *   ordered-stream-destroy  ordered-reuse with the old work's blocking
 *                    stream destroyed before the free, and the fake's
 *                    legacy stream not waiting for destroyed streams
 *                    (its default, FAKECUDA_LEGACY_SKIPS_DESTROYED): the
 *                    barrier must wait for the destroyed stream's stand-in
 *   ordered-region-trim  a growing pool over regions, a block freed behind
 *                    work on a blocking stream, then trimmed: its region
 *                    must not go back before that work ran (the fake's
 *                    cuMemFree not synchronising: FAKECUDA_FREE_NO_SYNC)
 *   ordered-then-non-blocking  the same on the legacy stream, then a
 *                    non-blocking stream is made and uses the block: its
 *                    work still runs after the old owner's
 *   ptsz-during-capture  another thread captures on its per-thread stream
 *                    (a blocking one: the legacy stream is unusable) while
 *                    this thread's per-thread stream uses the block and
 *                    frees it: no event the seal can make covers that work
 *   query-vs-begin   another thread begins a global-mode capture after
 *                    the shim chose the capture mode of a fence event query
 *                    (none under way: global) and before the query reaches
 *                    the driver (the fake's before_next_event_query): the
 *                    query must not break that capture
 *   ptsz-fork-vs-seal  another thread's per-thread default stream (a
 *                    blocking one) joins a capture by a wait (a fork) after
 *                    a plain seal asked whether a blocking stream captures
 *                    and before it records its event on the legacy stream
 *                    (the fake's before_next_event_query, inside the seal's
 *                    stand-in sweep): the seal must not record legacy work
 *                    into that capture (found by an audit: forks of the
 *                    per-thread stream took no lock a seal holds off, and
 *                    the legacy event invalidated the capture)
 *   bogus-end        another thread captures in global mode while this one
 *                    ends a capture on a stream that is not capturing, and
 *                    ends its own capture twice (the driver refuses both):
 *                    a fence query after them must still leave that capture
 *                    intact
 *   unseen-end       the same, with a capture the shim never saw begin (a
 *                    library preloaded after it, libe2einterposer.so, began
 *                    it through the driver's own function) ended through the
 *                    shim: that end matches no capture the shim counted
 *   other-device-ptsz0  a device-0 block freed on device 1's per-thread
 *                    stream named as stream 0 of cudaFreeAsync_ptsz (-driver:
 *                    cuMemFreeAsync_ptsz) after work queued there: that
 *                    stream, not device 1's legacy one, is waited for
 *   other-device-reset-free  a device-0 block freed with cudaFreeAsync on
 *                    stream 0 right after cudaDeviceReset of device 1, the
 *                    current device (its primary context current, inactive,
 *                    until the runtime's next call revives it, as that free
 *                    does): the free succeeds, and the block comes back,
 *                    after device 0's work that used it (found by an audit:
 *                    the wait for the dead context's stream failed, and the
 *                    block was kept for good)
 *   other-device-dead-stream, other-device-reset-stream  a device-0 block
 *                    used on a device-1 stream, freed stream-ordered on it
 *                    after the stream was destroyed (and 65 more after it,
 *                    past the dead handles the shim remembers) or device
 *                    1 reset: refused as CUDA refuses a dead handle, the
 *                    block never handed out under that stream's work
 *   other-device-legacy-after-ptsz  a device-0 block used on device 1's
 *                    per-thread stream, freed on device 1's legacy stream
 *                    (a legacy-stream action, which waits for it)
 *   other-device-blocking-after-legacy  used on device 1's legacy stream,
 *                    freed on a blocking stream of device 1 (which waits
 *                    for the legacy stream's work)
 *   ordered-other-device  the block comes back at once on device 0 (old
 *                    work queued on a blocking stream of device 0), and the
 *                    new owner's first use is on device 1's legacy stream
 *                    (a peer copy or a peer kernel writing into it), which
 *                    no barrier on device 0's legacy stream orders: it must
 *                    still run after the old owner's work
 *   ordered-then-other-device  the same with device 1's context made after
 *                    device 0's pool became ordered: a block reused behind
 *                    the barrier before it, and one freed after it, each
 *                    written from device 1 (mutation testing: neither the
 *                    end of the state nor its host wait was pinned)
 *   unseen-reset-streams  (audit; door closed) a non-blocking stream made,
 *                    then device 0's primary context reset unseen and made
 *                    again: no seal of the new pool may touch the dead
 *                    stream
 *   ordered-created-context  the same with a context created on device 0
 *                    (cuCtxCreate_v4): the shim must learn of it at its
 *                    creation, or device 0's pool stays ordered; -v1, -v2,
 *                    -v3: created by CUDA 2.0's cuCtxCreate, _v2 or _v3 as
 *                    cuGetProcAddress hands them out below _v4's version
 *                    (driver door only)
 *
 * Each also runs with BFCSHIM_DRIVER_HOOKS=0 (test names ending -hooks-off),
 * where only the runtime door sees the program: there the capturing threads
 * of ptsz-capture and global-capture use the runtime's calls, since the
 * driver's own are the program's business once the driver door is closed.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "e2e_rt.h"

#define MiB (UINT64_C(1) << 20)
#define LIMIT (768 * MiB)

/* A way to destroy a stream: the runtime's (NULL), or a driver entry
 * point. */
typedef CUresult (*destroy_fn)(CUstream);

/* The stream with work still queued is destroyed (by `destroy`, or
 * cudaStreamDestroy) before or after the free of the block that work uses. */
static void destroyed_stream_by(bool before_free, destroy_fn destroy)
{
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(fakecuda()->launch(s, write_pattern, p), 0);
    if (before_free && destroy)
        CHECK_EQ(destroy((CUstream)s), CUDA_SUCCESS); /* returns; the work goes on */
    else if (before_free)
        CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    if (!before_free)
        CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
    char *q = alloc_ok(MiB);
    expect_safe(p, q, s);
    fakecuda()->complete_all();
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
}

static void destroyed_stream(bool before_free) { destroyed_stream_by(before_free, NULL); }

static void stream_destroy(void) { destroyed_stream(true); }
static void destroy_after(void) { destroyed_stream(false); }

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t,
                           CUdriverProcAddressQueryResult *);

/* What cuGetProcAddress_v2 (found on libcuda's handle, as cudart finds it)
 * answers for `base` at `version`. */
static void *proc_at(const char *base, int version)
{
    gpa_fn gpa = (gpa_fn)dlsym(dlopen("libcuda.so.1", RTLD_NOW), "cuGetProcAddress_v2");
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    CHECK(gpa && gpa(base, &fn, version, 0, &st) == CUDA_SUCCESS && fn);
    return fn;
}

/* stream-destroy, the stream destroyed with the v1 cuStreamDestroy (CUDA
 * 2.0's, cudaTypedefs.h's PFN_cuStreamDestroy_v2000), as an old binary or
 * a binding asking cuGetProcAddress for an old version reaches it. */
static void stream_destroy_v1(void)
{
    destroy_fn ways[3] = {
        (destroy_fn)dlsym(dlopen("libcuda.so.1", RTLD_NOW), "cuStreamDestroy"),
        (destroy_fn)proc_at("cuStreamDestroy", 3020),
        (destroy_fn)dlsym(RTLD_DEFAULT, "cuStreamDestroy"), /* what a linked call binds to */
    };
    for (int i = 0; i < 3; i++) {
        CHECK(ways[i] != NULL);
        if (ways[i])
            destroyed_stream_by(true, ways[i]);
    }
}

/* into_graph: cudaStreamBeginCaptureToGraph into a graph of the program's,
 * which cudaStreamEndCapture then returns. */
static void captured_after_free(bool into_graph)
{
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(fakecuda()->launch(s, write_pattern, p), 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    fakecuda_stats s0 = fake_stats();
    cudaGraph_t mine = NULL, g = NULL;
    if (into_graph) {
        CHECK_EQ(cudaGraphCreate(&mine, 0), cudaSuccess);
        CHECK_EQ(cudaStreamBeginCaptureToGraph(s, mine, NULL, NULL, 0,
                                               cudaStreamCaptureModeRelaxed),
                 cudaSuccess);
    } else {
        CHECK_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    }
    char *q = alloc_ok(MiB); /* allowed in relaxed mode */
    expect_safe(p, q, s);
    CHECK_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
    CHECK(g != NULL);
    if (into_graph)
        CHECK(g == mine);
    CHECK_EQ(cudaGraphDestroy(g), cudaSuccess);
    CHECK_EQ(fake_stats().capture_invalidations, s0.capture_invalidations);
    fakecuda()->complete_all();
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
}

/* Work queued on `side` before it joins a capture by waiting on an event
 * recorded in it (a fork) still runs, and no event can be recorded on side
 * while it captures; no begin was made on side, so nothing stood in for
 * that work when the capture began. The free of the block that work uses
 * comes back only once side is out of the capture (joined, the capture
 * ended) and its work done. */
/* q (1 MiB) was allocated after the hole was freed under earlier_work (the
 * fork's, or another device's): if it overlaps the hole, that work must
 * have run. (A fork's captured operations stay in its queue, never run:
 * pending() counts them; so the work says when it ran.) */
static void expect_earlier_work_done(const char *hole, const char *q)
{
    if (q < hole + MiB && hole < q + MiB && !earlier_work_ran) {
        fprintf(stderr, "the freed block was handed out before work queued before its free "
                        "ran\n");
        e2e_failures++;
    }
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
}

/* The side stream's own fork and join calls through the driver's
 * per-thread entry points, as a program built with --default-stream
 * per-thread makes them (cuStreamWaitEvent_ptsz, cuEventRecord_ptsz: stream
 * 0 is the calling thread's per-thread stream); NULL where the runtime's
 * calls make them. */
typedef struct ptsz_calls {
    CUresult (*wait)(CUstream, CUevent, unsigned);
    CUresult (*record)(CUevent, CUstream);
} ptsz_calls;

static ptsz_calls ptsz_driver_calls(void)
{
    void *h = e2e_open_libcuda();
    ptsz_calls c = {(CUresult(*)(CUstream, CUevent, unsigned))e2e_dlsym(h, "cuStreamWaitEvent_ptsz"),
                    (CUresult(*)(CUevent, CUstream))e2e_dlsym(h, "cuEventRecord_ptsz")};
    return c;
}

/* `side`, with its earlier work, joins the capture begun on `origin` by a
 * wait on event `e` recorded there (side's wait through `via`, or the
 * runtime's when NULL). */
static void fork_into(cudaStream_t origin, cudaStream_t side, cudaEvent_t e,
                      const ptsz_calls *via)
{
    CHECK_EQ(cudaEventRecord(e, origin), cudaSuccess);
    if (via)
        CHECK_EQ(via->wait((CUstream)side, (CUevent)e, 0), CUDA_SUCCESS);
    else
        CHECK_EQ(cudaStreamWaitEvent(side, e, 0), cudaSuccess);
}

/* An allocation while the fork captures (allowed in relaxed mode). The pool
 * is full but for the hole: either the hole comes back with the fork's
 * earlier work done, or nothing does (out of memory). The block, or NULL. */
static char *alloc_during_fork(const char *hole)
{
    char *q = NULL;
    cudaError_t e = cudaMalloc((void **)&q, MiB);
    if (e == cudaSuccess) {
        expect_earlier_work_done(hole, q);
        return q;
    }
    CHECK_EQ(e, cudaErrorMemoryAllocation);
    CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
    return NULL;
}

/* `side` joins back into `origin` by event `e` (side's record through
 * `via`, or the runtime's when NULL), and the capture ends valid. */
static void join_and_end(cudaStream_t origin, cudaStream_t side, cudaEvent_t e,
                         const ptsz_calls *via)
{
    if (via)
        CHECK_EQ(via->record((CUevent)e, (CUstream)side), CUDA_SUCCESS);
    else
        CHECK_EQ(cudaEventRecord(e, side), cudaSuccess);
    CHECK_EQ(cudaStreamWaitEvent(origin, e, 0), cudaSuccess);
    cudaGraph_t g = NULL;
    CHECK_EQ(cudaStreamEndCapture(origin, &g), cudaSuccess);
    CHECK(g != NULL);
    if (g)
        CHECK_EQ(cudaGraphDestroy(g), cudaSuccess);
}

/* Out of the capture: the hole comes back (q, when the capture gave none)
 * after the fork's earlier work; then everything goes. */
static void after_fork(const char *hole, char *q, char *filler)
{
    if (!q) {
        q = alloc_ok(MiB);
        expect_earlier_work_done(hole, q);
    }
    fakecuda()->complete_all();
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
}

/* One round with the hole freed under `side`'s earlier work: side forked
 * into the capture begun on `origin`, an allocation meanwhile, side joined
 * back and the capture ended, then the hole after it (after_fork). */
static void fork_round(cudaStream_t origin, cudaStream_t side, const char *hole, char *filler,
                       const ptsz_calls *via)
{
    cudaEvent_t fork, join;
    CHECK_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
    CHECK_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
    fork_into(origin, side, fork, via);
    char *q = alloc_during_fork(hole);
    join_and_end(origin, side, join, via);
    after_fork(hole, q, filler);
    CHECK_EQ(cudaEventDestroy(fork), cudaSuccess);
    CHECK_EQ(cudaEventDestroy(join), cudaSuccess);
}

/* wait_via: the fork's wait through the driver's per-thread entry point
 * (NULL: the runtime's); the join is the runtime's either way. */
static void forked_after_free_by(bool free_before_fork, const ptsz_calls *wait_via)
{
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t origin, side;
    CHECK_EQ(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
    earlier_work_ran = false;
    CHECK_EQ(fakecuda()->launch(side, earlier_work, p), 0);
    if (free_before_fork)
        CHECK_EQ(cudaFree(p), cudaSuccess);
    fakecuda_stats s0 = fake_stats();
    CHECK_EQ(cudaStreamBeginCapture(origin, cudaStreamCaptureModeRelaxed), cudaSuccess);
    cudaEvent_t fork, join;
    CHECK_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
    CHECK_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
    fork_into(origin, side, fork, wait_via);
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    CHECK_EQ(cudaStreamIsCapturing(side, &st), cudaSuccess);
    CHECK_EQ(st, cudaStreamCaptureStatusActive);
    CHECK_EQ(fake_stats().capture_forks, s0.capture_forks + 1);
    if (!free_before_fork)
        CHECK_EQ(cudaFree(p), cudaSuccess);
    char *q = alloc_during_fork(p);
    join_and_end(origin, side, join, NULL);
    CHECK_EQ(cudaStreamIsCapturing(side, &st), cudaSuccess);
    CHECK_EQ(st, cudaStreamCaptureStatusNone);
    CHECK_EQ(fake_stats().capture_invalidations, s0.capture_invalidations);
    after_fork(p, q, filler);
    CHECK_EQ(cudaEventDestroy(fork), cudaSuccess);
    CHECK_EQ(cudaEventDestroy(join), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(side), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(origin), cudaSuccess);
}

/* The fork is destroyed while it is in the capture (before the origin ends
 * it): no stand-in can be recorded on a stream that captures, and the
 * destroy takes it out of the registry, so only the stand-in of the fork
 * itself covers the work it queued before (found by the audit of 0fac580,
 * which had none). async: the block was freed stream-ordered on the fork
 * before it joined the capture (its lane is closed into the plain lane at
 * the destroy). */
static void fork_destroyed_by(bool async)
{
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t origin, side;
    CHECK_EQ(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
    earlier_work_ran = false;
    CHECK_EQ(fakecuda()->launch(side, earlier_work, p), 0);
    if (async)
        CHECK_EQ(cudaFreeAsync(p, side), cudaSuccess);
    else
        CHECK_EQ(cudaFree(p), cudaSuccess);
    CHECK_EQ(cudaStreamBeginCapture(origin, cudaStreamCaptureModeRelaxed), cudaSuccess);
    cudaEvent_t fork;
    CHECK_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
    fork_into(origin, side, fork, NULL);
    CHECK_EQ(cudaStreamDestroy(side), cudaSuccess); /* its earlier work goes on */
    char *q = alloc_during_fork(p);
    cudaGraph_t g = NULL;
    cudaStreamEndCapture(origin, &g); /* (whether a real driver fails it: unknown) */
    if (g)
        CHECK_EQ(cudaGraphDestroy(g), cudaSuccess);
    after_fork(p, q, filler);
    CHECK_EQ(cudaEventDestroy(fork), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(origin), cudaSuccess);
}

static void fork_destroyed(void) { fork_destroyed_by(false); }
static void fork_destroyed_async(void) { fork_destroyed_by(true); }

/* libe2einterposer.so's begin and end: the driver's own functions, which
 * the shim does not see (the scenarios run "stacked", tests/meson.build). */
typedef struct unseen_calls {
    CUresult (*begin)(CUstream, CUstreamCaptureMode);
    CUresult (*end)(CUstream, CUgraph *);
} unseen_calls;

static bool find_unseen(unseen_calls *u)
{
    *(void **)&u->begin = dlsym(RTLD_DEFAULT, "interposer_begin_capture");
    *(void **)&u->end = dlsym(RTLD_DEFAULT, "interposer_end_capture");
    CHECK(u->begin && u->end);
    dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL); /* (for the library's RTLD_NEXT) */
    return u->begin && u->end;
}

static void end_unseen(const unseen_calls *u, cudaStream_t origin)
{
    CUgraph g = NULL;
    CHECK_EQ(u->end((CUstream)origin, &g), CUDA_SUCCESS);
    CHECK_EQ(cudaGraphDestroy((cudaGraph_t)g), cudaSuccess);
}

/* `side` began a capture the hooks counted, and that capture was ended
 * where the shim cannot see (by a library preloaded after it, through the
 * driver's own function): its entry stays in capture.c's table. Later side
 * is forked into another capture: the stale entry must not pass for a
 * stand-in of its work since (the audit of 0fac580). */
static void stale_begun(void)
{
    unseen_calls u;
    if (!find_unseen(&u))
        return;
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t origin, side;
    CHECK_EQ(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaStreamBeginCapture(side, cudaStreamCaptureModeRelaxed), cudaSuccess);
    end_unseen(&u, side);
    earlier_work_ran = false;
    CHECK_EQ(fakecuda()->launch(side, earlier_work, p), 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    CHECK_EQ(cudaStreamBeginCapture(origin, cudaStreamCaptureModeRelaxed), cudaSuccess);
    fork_round(origin, side, p, filler, NULL);
    CHECK_EQ(cudaStreamDestroy(side), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(origin), cudaSuccess);
}

/* The capture questions (cuStreamIsCapturing) a stream-ordered allocation
 * and free on s ask: none while the shim knows no capture is under way. */
static uint64_t pair_questions(cudaStream_t s)
{
    const uint64_t q0 = e2e_calls_of("cuStreamIsCapturing");
    void *p = NULL;
    CHECK_EQ(cudaMallocAsync(&p, MiB, s), cudaSuccess);
    CHECK_EQ(cudaFreeAsync(p, s), cudaSuccess);
    return e2e_calls_of("cuStreamIsCapturing") - q0;
}

/* `to` forks into origin's capture (a wait on ev[0] recorded there) and
 * joins back (origin waits on ev[1] recorded on `to`). */
static void fork_and_join(cudaStream_t origin, cudaStream_t to, cudaEvent_t ev[2])
{
    CHECK_EQ(cudaEventRecord(ev[0], origin), cudaSuccess);
    CHECK_EQ(cudaStreamWaitEvent(to, ev[0], 0), cudaSuccess);
    CHECK_EQ(cudaEventRecord(ev[1], to), cudaSuccess);
    CHECK_EQ(cudaStreamWaitEvent(origin, ev[1], 0), cudaSuccess);
}

/* n non-blocking streams and two events, then `none`: the capture
 * questions of a pair on the first stream with no capture under way (0). */
static void unseen_setup(cudaStream_t *st, int n, cudaEvent_t ev[2])
{
    for (int i = 0; i < n; i++)
        CHECK_EQ(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking), cudaSuccess);
    for (int i = 0; i < 2; i++)
        CHECK_EQ(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming), cudaSuccess);
    CHECK_EQ(pair_questions(st[0]), 0);
}

/* Every capture has ended: a pair asks no capture question (nothing stays
 * counted), no capture was invalidated but `invalidated`; then all goes. */
static void nothing_counted(cudaStream_t *st, int n, cudaEvent_t ev[2], uint64_t invalidated)
{
    CHECK_EQ(pair_questions(st[0]), 0);
    CHECK_EQ(fake_stats().capture_invalidations, invalidated);
    for (int i = 0; i < 2; i++)
        CHECK_EQ(cudaEventDestroy(ev[i]), cudaSuccess);
    for (int i = 0; i < n; i++)
        CHECK_EQ(cudaStreamDestroy(st[i]), cudaSuccess);
}

static void end_seen(cudaStream_t origin, cudaError_t want)
{
    cudaGraph_t g = NULL;
    CHECK_EQ(cudaStreamEndCapture(origin, &g), want);
    if (g)
        CHECK_EQ(cudaGraphDestroy(g), cudaSuccess);
}

static void fork_unseen_end(void)
{
    unseen_calls u;
    if (!find_unseen(&u))
        return;
    cudaStream_t st[4]; /* a pair's, counted, origin, side */
    cudaEvent_t ev[2];
    unseen_setup(st, 4, ev);
    const uint64_t inv0 = fake_stats().capture_invalidations;
    /* A capture the shim counts, so that the wait below is taken for a
     * possible fork; then the unseen one, and its fork. */
    CHECK_EQ(cudaStreamBeginCapture(st[1], cudaStreamCaptureModeRelaxed), cudaSuccess);
    CHECK_EQ(u.begin((CUstream)st[2], CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    fork_and_join(st[2], st[3], ev);
    end_unseen(&u, st[2]);
    end_seen(st[1], cudaSuccess); /* the fork goes with the end the shim sees */
    nothing_counted(st, 4, ev, inv0);
}

/* ptsz-fork-unseen-end (found by an audit): this thread's per-thread
 * default stream forks into a capture the shim saw begin (counted with the
 * capture's id), which ends where the shim cannot see; the origin then
 * begins and ends again where it sees. That begin tells the shim the first
 * capture is over (begin_done drops the origin's stale entry): the forks of
 * that capture must go too. They did not: no other thread could ask about
 * a per-thread stream, and the fork stayed counted for good. */
static void ptsz_fork_unseen_end(void)
{
    unseen_calls u;
    if (!find_unseen(&u))
        return;
    cudaStream_t st[2]; /* a pair's, origin */
    cudaEvent_t ev[2];
    unseen_setup(st, 2, ev);
    const uint64_t inv0 = fake_stats().capture_invalidations;
    CHECK_EQ(cudaStreamBeginCapture(st[1], cudaStreamCaptureModeRelaxed), cudaSuccess);
    fork_and_join(st[1], cudaStreamPerThread, ev);
    end_unseen(&u, st[1]);
    CHECK_EQ(cudaStreamBeginCapture(st[1], cudaStreamCaptureModeRelaxed), cudaSuccess);
    end_seen(st[1], cudaSuccess);
    nothing_counted(st, 2, ev, inv0);
}

/* ptsz-fork-unseen-begin-invalidated (found by an audit): a capture begun
 * where the shim cannot see, while one it counts is under way (so the wait
 * below is taken for a possible fork); this thread's per-thread default
 * stream forks into it while it is active (counted with its id) and joins
 * back; then the capture is invalidated (a query of the capturing origin)
 * and its origin ended where the shim sees. That end learns no id (cuda.h
 * gives one only while the capture is active), so the ending thread's own
 * per-thread fork must be asked about: it was not, and stayed counted. */
static void ptsz_fork_unseen_begin_invalidated(void)
{
    unseen_calls u;
    if (!find_unseen(&u))
        return;
    cudaStream_t st[3]; /* a pair's, counted, origin */
    cudaEvent_t ev[2];
    unseen_setup(st, 3, ev);
    const uint64_t inv0 = fake_stats().capture_invalidations;
    CHECK_EQ(cudaStreamBeginCapture(st[1], cudaStreamCaptureModeRelaxed), cudaSuccess);
    CHECK_EQ(u.begin((CUstream)st[2], CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    fork_and_join(st[2], cudaStreamPerThread, ev);
    /* Refused while origin captures, and the capture is invalidated. */
    typedef CUresult (*query_fn)(CUstream);
    query_fn query = (query_fn)dlsym(RTLD_DEFAULT, "cuStreamQuery");
    CHECK(query != NULL);
    if (query)
        CHECK_EQ(query((CUstream)st[2]), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_seen(st[2], cudaErrorStreamCaptureInvalidated);
    end_seen(st[1], cudaSuccess);
    nothing_counted(st, 3, ev, inv0 + 1);
}

/* This thread's per-thread default stream (a blocking one) is the fork: no
 * stand-in, but the legacy stream is unusable while it captures, and the
 * plain lane waits for the capture's end. -driver: the fork and the join
 * through the driver's per-thread entry points on stream 0 (ptsz_calls):
 * the shim's _ptsz wait hook must serve as its plain twin does. */
static void per_thread_forked(const ptsz_calls *via)
{
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t origin;
    CHECK_EQ(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking), cudaSuccess);
    earlier_work_ran = false;
    CHECK_EQ(fakecuda()->launch(cudaStreamPerThread, earlier_work, p), 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    CHECK_EQ(cudaStreamBeginCapture(origin, cudaStreamCaptureModeRelaxed), cudaSuccess);
    const fakecuda_stats s0 = fake_stats();
    fork_round(origin, via ? NULL : cudaStreamPerThread, p, filler, via);
    CHECK_EQ(fake_stats().capture_forks, s0.capture_forks + 1);
    CHECK_EQ(fake_stats().capture_invalidations, s0.capture_invalidations);
    CHECK_EQ(cudaStreamDestroy(origin), cudaSuccess);
}

static void ptsz_fork(void) { per_thread_forked(NULL); }

static void ptsz_fork_driver(void)
{
    const ptsz_calls via = ptsz_driver_calls();
    per_thread_forked(&via);
}

static void capture_fork(void) { forked_after_free_by(true, NULL); }
static void free_in_fork(void) { forked_after_free_by(false, NULL); }

/* capture-fork-ptsz: the fork's wait is cuStreamWaitEvent_ptsz on the
 * stream (the shim's _ptsz twin of its wait hook). */
static void capture_fork_ptsz(void)
{
    const ptsz_calls via = ptsz_driver_calls();
    forked_after_free_by(true, &via);
}

static void capture_begin(void) { captured_after_free(false); }
static void capture_to_graph(void) { captured_after_free(true); }

static void legacy_capture(void)
{
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t b;
    CHECK_EQ(cudaStreamCreate(&b), cudaSuccess); /* blocking */
    CHECK_EQ(fakecuda()->launch(NULL, write_pattern, p), 0); /* the legacy stream */
    CHECK_EQ(cudaFree(p), cudaSuccess);
    fakecuda_stats s0 = fake_stats();
    CHECK_EQ(cudaStreamBeginCapture(b, cudaStreamCaptureModeRelaxed), cudaSuccess);
    /* No plain free comes back while a blocking stream captures (another
     * thread's per-thread stream could still use it, e2e_fences
     * ptsz-during-capture): the hole is not handed out, the pool is full. */
    char *q = NULL;
    CHECK_EQ(cudaMalloc((void **)&q, MiB), cudaErrorMemoryAllocation);
    cudaGetLastError();
    cudaGraph_t g;
    CHECK_EQ(cudaStreamEndCapture(b, &g), cudaSuccess);
    CHECK_EQ(fake_stats().capture_invalidations, s0.capture_invalidations);
    /* Once it ended, the hole comes back after its work. */
    q = alloc_ok(MiB);
    expect_safe(p, q, NULL);
    fakecuda()->complete_all();
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(b), cudaSuccess);
}

/* Another thread captures on its per-thread default stream (or in global
 * mode on a stream of its own) until told to stop. */
typedef struct capturer {
    bool per_thread;
    enum cudaStreamCaptureMode mode;
    e2e_phase step; /* 1: capturing, 2: please end, 3: ended */
    /* what the thread saw, checked by the main thread */
    CUresult begin_result, end_result;
    cudaError_t setup_result;
    /* on_cue: after its setup the thread says so (cue 1) and begins only
     * when told (cue 2) */
    bool on_cue;
    e2e_phase cue;
} capturer;

static void *capture_thread(void *arg)
{
    capturer *c = arg;
    typedef CUresult (*begin_fn)(CUstream, CUstreamCaptureMode);
    typedef CUresult (*end_fn)(CUstream, CUgraph *);
    /* [runtime][per thread]. The runtime's calls have the driver's shape,
     * and its capture error codes the driver's numbers. */
    static const char *const begins[2][2] = {
        {"cuStreamBeginCapture_v2", "cuStreamBeginCapture_v2_ptsz"},
        {"cudaStreamBeginCapture", "cudaStreamBeginCapture_ptsz"}};
    static const char *const ends[2][2] = {{"cuStreamEndCapture", "cuStreamEndCapture_ptsz"},
                                           {"cudaStreamEndCapture", "cudaStreamEndCapture_ptsz"}};
    const bool runtime = e2e_driver_door_closed();
    void *h = runtime ? RTLD_DEFAULT : dlopen("libcuda.so.1", RTLD_NOW);
    CUstream s = NULL;
    begin_fn begin = (begin_fn)dlsym(h, begins[runtime][c->per_thread]);
    end_fn end = (end_fn)dlsym(h, ends[runtime][c->per_thread]);
    c->setup_result = cudaFree(NULL); /* this thread's context */
    if (!c->per_thread && c->setup_result == cudaSuccess)
        c->setup_result = cudaStreamCreateWithFlags((cudaStream_t *)&s, cudaStreamNonBlocking);
    if (c->on_cue) {
        e2e_phase_set(&c->cue, 1);
        e2e_phase_wait(&c->cue, 2);
    }
    c->begin_result = begin(s, (CUstreamCaptureMode)c->mode);
    e2e_phase_set(&c->step, 1);
    e2e_phase_wait(&c->step, 2);
    CUgraph g;
    c->end_result = end(s, &g);
    e2e_phase_set(&c->step, 3);
    if (s)
        cudaStreamDestroy((cudaStream_t)s);
    return NULL;
}

/* Starts c's thread and returns once its capture has begun. */
static pthread_t capture_begun(capturer *c)
{
    pthread_t t;
    pthread_create(&t, NULL, capture_thread, c);
    e2e_phase_wait(&c->step, 1);
    return t;
}

/* The other thread's capture was neither refused a call nor invalidated
 * since s0, and it ends (its thread joined) as it began: intact. */
static void capture_ends_intact(capturer *c, pthread_t t, const fakecuda_stats *s0)
{
    CHECK_EQ(fake_stats().capture_invalidations, s0->capture_invalidations);
    CHECK_EQ(fake_stats().unsafe_calls_refused, s0->unsafe_calls_refused);
    e2e_phase_set(&c->step, 2);
    e2e_phase_wait(&c->step, 3);
    pthread_join(t, NULL);
    CHECK_EQ(c->setup_result, cudaSuccess);
    CHECK_EQ(c->begin_result, CUDA_SUCCESS);
    CHECK_EQ(c->end_result, CUDA_SUCCESS);
}

/* The work done, the scenario's blocks (q may be NULL) and stream gone:
 * everything comes back. */
static void all_comes_back(void *q, char *filler, cudaStream_t s)
{
    fakecuda()->complete_all();
    if (q)
        CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
    char *all = alloc_ok(free_memory());
    CHECK_EQ(cudaFree(all), cudaSuccess);
}

static void other_thread_capture(bool per_thread, enum cudaStreamCaptureMode mode)
{
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    /* A block freed with its work done, and one freed with work pending. */
    char *done = alloc_ok(MiB / 4);
    CHECK_EQ(cudaFree(done), cudaSuccess);
    CHECK_EQ(fakecuda()->launch(s, write_pattern, p), 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);

    capturer c = {.per_thread = per_thread, .mode = mode, .step = E2E_PHASE_INIT};
    pthread_t t = capture_begun(&c);
    fakecuda_stats s0 = fake_stats();
    /* While the other thread captures: allocations and plain frees here.
     * Under a blocking capture nothing freed comes back until it ends, so
     * the later ones may find the pool full; the first fits. */
    for (int i = 0; i < 4; i++) {
        char *x = NULL;
        cudaError_t e = cudaMalloc((void **)&x, MiB / 8);
        if (i == 0)
            CHECK_EQ(e, cudaSuccess);
        if (e == cudaSuccess)
            CHECK_EQ(cudaFree(x), cudaSuccess);
        else
            cudaGetLastError();
    }
    /* Not while its work is pending: the hole is not free yet. */
    void *q = NULL;
    if (cudaMalloc(&q, MiB) == cudaSuccess)
        expect_safe(p, q, s);
    else
        cudaGetLastError();
    capture_ends_intact(&c, t, &s0);
    all_comes_back(q, filler, s);
}

static void ptsz_capture(void) { other_thread_capture(true, cudaStreamCaptureModeGlobal); }
static void global_capture(void) { other_thread_capture(false, cudaStreamCaptureModeGlobal); }

static void reset_streams(void)
{
    cudaStream_t s[4];
    for (int i = 0; i < 4; i++) {
        CHECK_EQ(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking), cudaSuccess);
        void *p = NULL;
        CHECK_EQ(cudaMallocAsync(&p, MiB, s[i]), cudaSuccess);
        CHECK_EQ(cudaFreeAsync(p, s[i]), cudaSuccess);
    }
    char *x = alloc_ok(MiB);
    CHECK_EQ(cudaFree(x), cudaSuccess);
    fakecuda()->complete_all();
    /* The streams die with the context; the new primary context has the
     * same handle value in the fake (the real driver may do the same). */
    CHECK_EQ(cudaDeviceReset(), cudaSuccess);
    size_t big = LIMIT / 3;
    int ok = 0;
    for (int i = 0; i < 30; i++) {
        void *q = NULL;
        if (cudaMalloc(&q, big) != cudaSuccess) {
            fprintf(stderr, "allocation %d of %zu bytes failed after the reset\n", i, big);
            cudaGetLastError();
            break;
        }
        CHECK_EQ(cudaFree(q), cudaSuccess);
        ok++;
    }
    CHECK_EQ(ok, 30);
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
}

/* v1: the context destroyed with the v1 cuCtxDestroy (CUDA 2.0's), as
 * cuGetProcAddress hands it out below 4000. */
static void ctx_reuse_with(bool v1)
{
    typedef CUresult (*create_fn)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice);
    typedef CUresult (*destroy_fn)(CUcontext);
    typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
    typedef CUresult (*free_fn)(CUdeviceptr);
    typedef CUresult (*stream_fn)(CUstream *, unsigned);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    create_fn create = (create_fn)dlsym(h, "cuCtxCreate_v4");
    destroy_fn destroy = v1 ? (destroy_fn)proc_at("cuCtxDestroy", 3020)
                            : (destroy_fn)dlsym(h, "cuCtxDestroy_v2");
    alloc_fn mem_alloc = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
    free_fn mem_free = (free_fn)dlsym(h, "cuMemFree_v2");
    stream_fn stream_create = (stream_fn)dlsym(h, "cuStreamCreate");
    CHECK_EQ(cudaFree(NULL), cudaSuccess);
    CUcontext a = NULL, b = NULL;
    CUstream s;
    CUdeviceptr p = 0;
    CHECK_EQ(create(&a, NULL, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(stream_create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(mem_alloc(&p, MiB), CUDA_SUCCESS);
    CHECK_EQ(mem_free(p), CUDA_SUCCESS);
    CHECK_EQ(destroy(a), CUDA_SUCCESS);
    CHECK_EQ(create(&b, NULL, 0, 0), CUDA_SUCCESS);
    CHECK(a == b); /* the fake reuses the slot: the shim must not confuse them */
    for (int i = 0; i < 8; i++) {
        CHECK_EQ(mem_alloc(&p, MiB), CUDA_SUCCESS);
        CHECK_EQ(mem_free(p), CUDA_SUCCESS);
    }
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
    CHECK_EQ(destroy(b), CUDA_SUCCESS);
}

static void ctx_reuse(void) { ctx_reuse_with(false); }
static void ctx_reuse_v1(void) { ctx_reuse_with(true); }

static int device_of(void *p)
{
    typedef CUresult (*attr_fn)(void *, CUpointer_attribute, CUdeviceptr);
    attr_fn attr = (attr_fn)dlsym(dlopen("libcuda.so.1", RTLD_NOW), "cuPointerGetAttribute");
    int dev = -1;
    if (attr(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
        return -1;
    return dev;
}

static void stream_device(void)
{
    cudaStream_t s1;
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    CHECK_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    CHECK_EQ(cudaFree(NULL), cudaSuccess);
    /* 40 x 64 MiB through a 768 MiB pool: only works if the frees retire. */
    int ok = 0;
    for (int i = 0; i < 40; i++) {
        void *p = NULL;
        if (cudaMallocAsync(&p, 64 * MiB, s1) != cudaSuccess) {
            cudaGetLastError();
            fprintf(stderr, "allocation %d on device 1's stream failed\n", i);
            break;
        }
        if (i == 0)
            CHECK_EQ(device_of(p), 1);
        CHECK_EQ(cudaFreeAsync(p, s1), cudaSuccess);
        fakecuda()->complete(s1);
        ok++;
    }
    CHECK_EQ(ok, 40);
    CHECK_EQ(fake_stats().bytes_in_use[0], 0); /* no pool on device 0 */
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
    CHECK_EQ(cudaStreamDestroy(s1), cudaSuccess);
}

/* A block of device 0 freed stream-ordered on a stream of device 1 (its
 * legacy stream, its per-thread default stream, or an explicit stream, then
 * destroyed with its work queued, or not): the work device 1 queued before
 * the free must run before the block is handed out again, and the block
 * must come back once it has (found by an audit: the free went into device
 * 0's pool's lanes, whose fences cannot order device 1's streams; the block
 * came back under that work, or never). `how`: 0 legacy then cudaMalloc, 1
 * legacy then cudaMallocAsync, 2 per-thread, 3 explicit, 4 explicit
 * destroyed before the next allocation. */
static void free_on_other_device(int how)
{
    cudaStream_t s1 = NULL;
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    CHECK_EQ(cudaFree(NULL), cudaSuccess);
    if (how >= 3)
        CHECK_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    char *p, *filler = fill_but_hole(&p);
    void *on = how <= 1 ? NULL : how == 2 ? (void *)CU_STREAM_PER_THREAD : (void *)s1;
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    earlier_work_ran = false;
    CHECK_EQ(fakecuda()->launch(on, earlier_work, p), 0);
    CHECK_EQ(cudaFreeAsync(p, how <= 1 ? 0 : how == 2 ? cudaStreamPerThread : s1), cudaSuccess);
    if (how == 4)
        CHECK_EQ(cudaStreamDestroy(s1), cudaSuccess); /* returns; the work goes on */
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    char *q = NULL;
    if (how == 1)
        CHECK_EQ(cudaMallocAsync((void **)&q, MiB, 0), cudaSuccess);
    else
        CHECK_EQ(cudaMalloc((void **)&q, MiB), cudaSuccess);
    expect_earlier_work_done(p, q);
    fakecuda()->complete_all();
    CHECK_EQ(cudaFree(q), cudaSuccess);
    /* every block back: the hole is allocatable again */
    CHECK_EQ(cudaMalloc((void **)&q, MiB), cudaSuccess);
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
    if (how == 3)
        CHECK_EQ(cudaStreamDestroy(s1), cudaSuccess);
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
}

/* After a device-0 block p was freed on a device-1 stream behind work that
 * uses it: device 0's next allocation of its size must not be p before that
 * work ran; then every block comes back, and the filler goes. */
static void expect_other_device_free_safe(char *p, char *filler)
{
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    char *q = NULL;
    CHECK_EQ(cudaMalloc((void **)&q, MiB), cudaSuccess);
    expect_earlier_work_done(p, q);
    fakecuda()->complete_all();
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaMalloc((void **)&q, MiB), cudaSuccess); /* every block back */
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
}

/* The same per-thread default stream, named as a program built with
 * --default-stream per-thread names it: stream 0 of cudaFreeAsync_ptsz
 * (how 0) or cuMemFreeAsync_ptsz (how 1), which the runtime and driver
 * read as the calling thread's per-thread stream, not the legacy one
 * (found by the per-thread audit: the shim waited for device 1's legacy
 * stream instead, which had nothing queued, and handed the block out
 * under the per-thread stream's work). */
static void free_on_other_device_ptsz0(int how)
{
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    CHECK_EQ(cudaFree(NULL), cudaSuccess);
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    char *p, *filler = fill_but_hole(&p);
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    earlier_work_ran = false;
    CHECK_EQ(fakecuda()->launch((void *)CU_STREAM_PER_THREAD, earlier_work, p), 0);
    if (how == 0) {
        cudaError_t (*free_ptsz)(void *, cudaStream_t) = (cudaError_t (*)(void *, cudaStream_t))
            e2e_dlsym(RTLD_DEFAULT, "cudaFreeAsync_ptsz");
        CHECK_EQ(free_ptsz(p, 0), cudaSuccess);
    } else {
        CUresult (*free_ptsz)(CUdeviceptr, CUstream) = (CUresult (*)(CUdeviceptr, CUstream))
            e2e_dlsym(dlopen("libcuda.so.1", RTLD_NOW), "cuMemFreeAsync_ptsz");
        CHECK_EQ(free_ptsz((CUdeviceptr)(uintptr_t)p, NULL), CUDA_SUCCESS);
    }
    expect_other_device_free_safe(p, filler);
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
}

/* The implicit order on another device (found by the review of the
 * legacy-stream change): a device-0 block used on device 1 by one kind of
 * stream, then freed on device 1 on the other kind, with nothing queued on
 * the stream it is freed on. how 0: used on device 1's per-thread stream
 * (a blocking one), freed on device 1's legacy stream: the free is a
 * legacy-stream action, which waits for every blocking stream. how 1: used
 * on device 1's legacy stream, freed on a blocking stream of device 1,
 * whose work waits for the legacy stream's. Either way CUDA orders the
 * free after the use; synchronising the free's stream alone waits for
 * nothing. */
static void free_on_other_device_implicit(int how)
{
    cudaStream_t b = NULL;
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    CHECK_EQ(cudaFree(NULL), cudaSuccess);
    if (how == 1)
        CHECK_EQ(cudaStreamCreate(&b), cudaSuccess); /* blocking */
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    char *p, *filler = fill_but_hole(&p);
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    earlier_work_ran = false;
    CHECK_EQ(fakecuda()->launch(how == 0 ? (void *)CU_STREAM_PER_THREAD : (void *)CU_STREAM_LEGACY,
                                earlier_work, p),
             0);
    CHECK_EQ(cudaFreeAsync(p, how == 0 ? cudaStreamLegacy : b), cudaSuccess);
    expect_other_device_free_safe(p, filler);
    if (b) {
        CHECK_EQ(cudaSetDevice(1), cudaSuccess);
        CHECK_EQ(cudaStreamDestroy(b), cudaSuccess);
        CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    }
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
}

static void other_device_legacy_after_ptsz(void) { free_on_other_device_implicit(0); }
static void other_device_blocking_after_legacy(void) { free_on_other_device_implicit(1); }

static void other_device_ptsz0(void) { free_on_other_device_ptsz0(0); }

/* A device-0 block used by work on device 1's stream s1, then freed
 * stream-ordered on s1 after s1 went: destroyed (cuStreamDestroy returns
 * at once and its work goes on; then GRAVES_PLUS more streams destroyed,
 * past the 64 dead handles the shim remembers, so that it no longer knows
 * s1 for dead), or with its context (device 1 reset, which finishes its
 * work first). The handle names no stream: CUDA refuses the free (the
 * fake: cudaErrorInvalidResourceHandle, cuStreamGetCtx's answer), and so
 * must the shim, the block staying the program's, never handed out under
 * s1's work, and freed normally later. Found by an audit: cuStreamGetCtx
 * failed and the block went to device 0's plain lane with no wait and a
 * cudaSuccess; device 0's fences do not cover device 1's streams, and the
 * block came back under s1's queued work. */
enum { GRAVES_PLUS = 65 };

static void free_on_gone_other_stream(bool reset)
{
    cudaStream_t s1;
    char *p, *filler = hole_under_other_device_work(&s1, &p);
    if (reset) {
        CHECK_EQ(cudaDeviceReset(), cudaSuccess);
    } else {
        CHECK_EQ(cudaStreamDestroy(s1), cudaSuccess); /* returns; the work goes on */
        for (int i = 0; i < GRAVES_PLUS; i++) {
            cudaStream_t t;
            CHECK_EQ(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking), cudaSuccess);
            CHECK(t != s1);
            CHECK_EQ(cudaStreamDestroy(t), cudaSuccess);
        }
    }
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    const uint64_t stale = fake_stats().stale_handle_uses;
    CHECK_EQ(cudaFreeAsync(p, s1), cudaErrorInvalidResourceHandle);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
    /* the shim's questions about the handle (with the driver door closed,
     * where a capture may begin unseen, whether it captures; then its
     * context), where the program's own free would have handed it to the
     * driver */
    CHECK(fake_stats().stale_handle_uses <= stale + 2);
    char *q = NULL;
    if (cudaMalloc((void **)&q, MiB) == cudaSuccess) {
        if (q < p + MiB && p < q + MiB && !earlier_work_ran) {
            fprintf(stderr, "a block freed on a dead stream of device 1 was handed out "
                            "under that stream's queued work\n");
            e2e_failures++;
        }
        CHECK_EQ(cudaFree(q), cudaSuccess);
    } else {
        cudaGetLastError(); /* the pool is full: the block is still the program's */
    }
    fakecuda()->complete_all();
    if (q != p)
        CHECK_EQ(cudaFree(p), cudaSuccess); /* refused, it is still the program's */
    q = alloc_ok(MiB); /* and back once freed: the hole again (nothing else fits) */
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
}

static void other_device_dead_stream(void) { free_on_gone_other_stream(false); }
static void other_device_reset_stream(void) { free_on_gone_other_stream(true); }

static void other_device_reset_free(void)
{
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    CHECK_EQ(cudaFree(NULL), cudaSuccess);
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    char *p, *filler = fill_but_hole(&p);
    earlier_work_ran = false;
    CHECK_EQ(fakecuda()->launch(NULL, earlier_work, p), 0); /* device 0's legacy stream */
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    CHECK_EQ(cudaDeviceReset(), cudaSuccess); /* device 1's context: current, inactive */
    CHECK_EQ(cudaFreeAsync(p, 0), cudaSuccess);
    expect_other_device_free_safe(p, filler); /* with device 0 current */
}
static void other_device_ptsz0_driver(void) { free_on_other_device_ptsz0(1); }

static void other_device_legacy(void) { free_on_other_device(0); }
static void other_device_legacy_async(void) { free_on_other_device(1); }
static void other_device_ptsz(void) { free_on_other_device(2); }
static void other_device_stream(void) { free_on_other_device(3); }
static void other_device_stream_destroyed(void) { free_on_other_device(4); }

/* Found by an audit (both failed before, the first asking the driver about
 * the dead handle).
 * free-dead-stream: a stream-ordered free on a stream already destroyed:
 * CUDA refuses it (cudaErrorInvalidResourceHandle: the fake, alone), at
 * both doors, and nothing but the program's own calls may use the dead
 * handle; the block is still the program's. */
static void free_dead_stream(void)
{
    typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
    free_async_fn driver_free =
        (free_async_fn)dlsym(dlopen("libcuda.so.1", RTLD_NOW), "cuMemFreeAsync");
    CHECK(driver_free != NULL);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    char *p = alloc_ok(MiB);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
    uint64_t stale = fake_stats().stale_handle_uses;
    CHECK_EQ(cudaFreeAsync(p, s), cudaErrorInvalidResourceHandle);
    /* and the runtime's last error says the same (an audit: it said
     * cudaErrorInvalidValue, the only error but out of memory the runtime
     * door could set) */
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
    /* the driver door's (with it closed, the fake's own answer) */
    CHECK_EQ(driver_free((CUdeviceptr)(uintptr_t)p, (CUstream)s), CUDA_ERROR_INVALID_HANDLE);
    CHECK(fake_stats().stale_handle_uses <= stale + 2); /* the program's own calls, at most */
    CHECK_EQ(cudaFree(p), cudaSuccess); /* refused, it is still the program's */
}

/* alloc-dead-stream: a stream-ordered allocation on a destroyed stream is
 * the driver's to refuse (the program's own call), and the shim asks
 * nothing about the handle. */
static void alloc_dead_stream(void)
{
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *p = NULL;
    CHECK_EQ(cudaMallocAsync(&p, MiB, s), cudaSuccess); /* its lane opens */
    CHECK_EQ(cudaFreeAsync(p, s), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
    uint64_t stale = fake_stats().stale_handle_uses;
    void *q = NULL;
    CHECK_EQ(cudaMallocAsync(&q, MiB, s), cudaErrorInvalidResourceHandle);
    cudaGetLastError();
    CHECK(q == NULL);
    CHECK(fake_stats().stale_handle_uses <= stale + 1);
}

/* Stream t, live under a handle a destroyed stream had, is served: its
 * stream-ordered allocation is the pool's, and it takes that block and
 * `pooled` (a block of the pool) back; then it is synchronised. */
static void expect_reborn_served(cudaStream_t t, void *pooled)
{
    uint64_t driver_allocs = fake_stats().mem_alloc_async_calls;
    void *p = NULL;
    CHECK_EQ(cudaMallocAsync(&p, MiB, t), cudaSuccess);
    CHECK_EQ(fake_stats().mem_alloc_async_calls, driver_allocs); /* the pool's */
    CHECK_EQ(cudaFreeAsync(p, t), cudaSuccess);
    CHECK_EQ(cudaFreeAsync(pooled, t), cudaSuccess);
    CHECK_EQ(cudaStreamSynchronize(t), cudaSuccess);
}

/* dead-stream-reborn (FAKECUDA_REUSE_STREAM_HANDLES: the fake gives the
 * next stream a destroyed one's handle, as a real driver may): the handle
 * names a live stream again, and its stream-ordered calls are served. */
static void dead_stream_reborn(void)
{
    cudaStream_t s, again;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
    CHECK_EQ(cudaStreamCreateWithFlags(&again, cudaStreamNonBlocking), cudaSuccess);
    CHECK(again == s);
    uint64_t stale = fake_stats().stale_handle_uses;
    expect_reborn_served(again, alloc_ok(MiB));
    CHECK_EQ(cudaStreamDestroy(again), cudaSuccess);
    CHECK_EQ(fake_stats().stale_handle_uses, stale);
}

/* dead-stream-reborn-in-window (FAKECUDA_REUSE_STREAM_HANDLES): another
 * thread's stream made between the driver's destroy of s and the shim's
 * next step gets s's handle (the fake runs the creation there); it is
 * live, and served (found by an audit: buried after the destroy, it was
 * refused for good). */
static void make_stream_into(void *out)
{
    CHECK_EQ(cudaStreamCreateWithFlags((cudaStream_t *)out, cudaStreamNonBlocking), cudaSuccess);
}

static void dead_stream_reborn_in_window(void)
{
    cudaStream_t s, t = NULL;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *pooled = alloc_ok(MiB);
    fakecuda()->after_next_stream_destroy(make_stream_into, &t);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
    CHECK(t == s);
    expect_reborn_served(t, pooled);
    CHECK_EQ(cudaStreamDestroy(t), cudaSuccess);
}

/* dead-stream-reborn-unseen (the driver door closed,
 * FAKECUDA_REUSE_STREAM_HANDLES): a stream made through a driver function
 * found by dlsym, unseen there, gets a destroyed runtime stream's handle;
 * it is live, and its stream-ordered calls are served, not refused. */
static void dead_stream_reborn_unseen(void)
{
    typedef CUresult (*create_fn)(CUstream *, unsigned);
    typedef CUresult (*destroy_fn)(CUstream);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    create_fn create = (create_fn)dlsym(h, "cuStreamCreate");
    destroy_fn destroy = (destroy_fn)dlsym(h, "cuStreamDestroy_v2");
    CHECK(create != NULL && destroy != NULL);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
    CUstream again = NULL;
    CHECK_EQ(create(&again, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK(again == (CUstream)s);
    expect_reborn_served((cudaStream_t)again, alloc_ok(MiB));
    CHECK_EQ(destroy(again), CUDA_SUCCESS);
}

/* unseen-reset-events[-reused] (the driver door closed, a pool over virtual
 * memory, whose memory outlives its context): the program resets device 0's
 * primary context through a driver function it found with dlsym (unseen
 * there), retains it again and makes events of its own. The pool lives on
 * with its spare events, dead with the old context. With
 * FAKECUDA_REUSE_EVENT_HANDLES (-reused) the program's events get their
 * handles, as a real driver may give them: the next seal records the
 * program's event as its fence (take_event, fences.c), and once the program
 * records that event on an idle stream of its own, the fence reads complete
 * and a block freed behind queued legacy-stream work came back under that
 * work (found with the fake's event handle reuse; it failed until, with the
 * door closed, the pool of a context torn down unseen is noticed as a
 * plug-in's is: pools_forget_if_replaced at each lookup). */
static void exp_nothing(void *a) { (void)a; }

static void unseen_reset_events(void)
{
    typedef CUresult (*evc_fn)(CUevent *, unsigned);
    typedef CUresult (*evr_fn)(CUevent, CUstream);
    typedef CUresult (*sc_fn)(CUstream *, unsigned);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    evc_fn evc = (evc_fn)dlsym(h, "cuEventCreate");
    evr_fn evr = (evr_fn)dlsym(h, "cuEventRecord");
    sc_fn sc = (sc_fn)dlsym(h, "cuStreamCreate");
    CHECK(evc && evr && sc);
    /* Seals whose fences completed: their events become the pool's spares. */
    for (int i = 0; i < 4; i++)
        CHECK_EQ(cudaFree(alloc_ok(MiB)), cudaSuccess);
    char *keep = alloc_ok(MiB);
    unseen_primary_reset(0); /* unseen: the door is closed */
    enum { NEV = 16 };
    CUevent mine[NEV];
    for (int i = 0; i < NEV; i++)
        CHECK_EQ(evc(&mine[i], CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    char *b = alloc_ok(MiB);
    CHECK_EQ(fakecuda()->launch(NULL, exp_nothing, NULL), 0); /* work on b, queued */
    CHECK_EQ(cudaFree(b), cudaSuccess);
    char *sealed = alloc_ok(MiB); /* seals the free (BFCSHIM_FENCE_INTERVAL=1) */
    CUstream idle;
    CHECK_EQ(sc(&idle, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    for (int i = 0; i < NEV; i++) /* the program's own use of its events */
        CHECK_EQ(evr(mine[i], idle), CUDA_SUCCESS);
    /* Fill the pool (BFCSHIM_MEM_LIMIT): b may come back only once the
     * work queued on it has run. */
    for (int i = 0; i < 12; i++) {
        void *d = NULL;
        if (cudaMalloc(&d, MiB) != cudaSuccess)
            break;
        if (d == (void *)b && fakecuda()->pending(NULL) != 0) {
            fprintf(stderr, "b (%p) handed out again while the work queued on it is pending\n",
                    (void *)b);
            e2e_failures++;
        }
    }
    (void)keep;
    (void)sealed;
}

/* unseen-reset-streams (audit; the driver door closed): a non-blocking
 * stream made through the runtime (registered), then device 0's primary
 * context reset through a driver function found with dlsym (unseen), made
 * again under the same handle. The old pool is noticed and forgotten at the
 * next allocation (pools_forget_if_replaced), but the dead context's
 * streams stayed registered under its handle, the new context's: every
 * seal of the new pool recorded an event on the dead stream (the fake
 * counts the stale use; an H100 crashed on one after cudaDeviceReset).
 * -no-pool (audit of a7cd432): nothing allocated before the reset, so the
 * dead context had no pool and no replacement is ever noticed: its stream
 * must still leave the registry before the new context's pool seals. */
static void reset_streams_unseen_id(bool pool_before, bool id_fails)
{
    cudaStream_t s = NULL;
    if (id_fails) {
        CHECK_EQ(cudaFree(NULL), cudaSuccess); /* the context made: the next id asked is s's */
        CHECK_EQ(fakecuda()->fail_call("cuCtxGetId", 1, CUDA_ERROR_INVALID_CONTEXT, 0), 0);
        /* refused as the driver refused the id (cudart's code for it), the
         * stream destroyed: nothing left to outlive the reset */
        CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                 cudaErrorDeviceUninitialized);
        CHECK(s == NULL);
        CHECK_EQ(fakecuda()->fail_call("cuCtxGetId", 0, 0, 0), 0);
    } else {
        CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    }
    if (pool_before)
        CHECK_EQ(cudaFree(alloc_ok(MiB)), cudaSuccess);
    unseen_primary_reset(0); /* unseen: the door is closed; s dies */
    for (int i = 0; i < 4; i++) /* seals of the new pool (BFCSHIM_FENCE_INTERVAL=1) */
        CHECK_EQ(cudaFree(alloc_ok(MiB)), cudaSuccess);
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
}

static void unseen_reset_streams(void) { reset_streams_unseen_id(true, false); }
static void unseen_reset_streams_no_pool(void) { reset_streams_unseen_id(false, false); }
/* -id-fails: the driver refuses s's context id as s is registered
 * (cuCtxGetId's CUDA_ERROR_INVALID_CONTEXT, in cuda.h's list). Registered
 * with id 0, "unknown", neither sweep by id took it out, and the new
 * context's pool sealed on the dead handle (stale_handle_uses 6): the
 * creation is refused instead. */
static void unseen_reset_streams_id_fails(void) { reset_streams_unseen_id(true, true); }
static void unseen_reset_streams_no_pool_id_fails(void) { reset_streams_unseen_id(false, true); }

/* unseen-destroy-id-fails (FAKECUDA_REUSE_STREAM_HANDLES): a stream destroyed
 * unseen (cuStreamDestroy_v2 found with dlsym, the door closed) stays
 * registered; the next stream made gets its handle (the fake's reuse), and
 * the driver refuses that stream's context id. The refusal destroys the new
 * stream (cuda.h: a handle names nothing once cuStreamDestroy returned), so
 * the entry the missed destroy left under the handle must go too: else
 * every seal of the pool records on the dead handle (stale_handle_uses).
 * And the refused stream is destroyed, not leaked: the next stream made
 * gets its handle again. Found by mutation testing: neither the
 * streams_remove nor the cuStreamDestroy of the refusal was tested. */
static void unseen_destroy_id_fails(void)
{
    typedef CUresult (*destroy_fn)(CUstream);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    destroy_fn destroy = (destroy_fn)dlsym(h, "cuStreamDestroy_v2");
    CHECK(destroy != NULL);
    CHECK_EQ(cudaFree(alloc_ok(MiB)), cudaSuccess); /* the pool and its context */
    cudaStream_t old = NULL, s = NULL, again = NULL;
    CHECK_EQ(cudaStreamCreateWithFlags(&old, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(destroy((CUstream)old), CUDA_SUCCESS); /* unseen */
    CHECK_EQ(fakecuda()->fail_call("cuCtxGetId", 1, CUDA_ERROR_INVALID_CONTEXT, 0), 0);
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
             cudaErrorDeviceUninitialized);
    CHECK_EQ(fakecuda()->fail_call("cuCtxGetId", 0, 0, 0), 0);
    for (int i = 0; i < 4; i++) /* seals (BFCSHIM_FENCE_INTERVAL=1) */
        CHECK_EQ(cudaFree(alloc_ok(MiB)), cudaSuccess);
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
    CHECK_EQ(cudaStreamCreateWithFlags(&again, cudaStreamNonBlocking), cudaSuccess);
    if (again != old) {
        fprintf(stderr, "the refused stream was not destroyed: its handle is not reused\n");
        e2e_failures++;
    }
    CHECK_EQ(cudaStreamDestroy(again), cudaSuccess);
}

/* hooks-off-free-cost (review of 9d1427e): with the driver door closed a
 * stream-ordered free on the legacy stream asks the current context's pool
 * (pool_lane_for_free, runtime_context_for_free) and, through the
 * replaced-context check, costs a cuCtxGetId each time although nothing
 * changed: the check was meant for allocations only (one per allocation). */
static void hooks_off_free_cost(void)
{
    enum { N = 8 };
    void *d[N];
    for (int i = 0; i < N; i++)
        CHECK_EQ(cudaMalloc(&d[i], MiB), cudaSuccess);
    uint64_t before = e2e_calls_of("cuCtxGetId");
    for (int i = 0; i < N; i++)
        CHECK_EQ(cudaFreeAsync(d[i], 0), cudaSuccess);
    uint64_t asked = e2e_calls_of("cuCtxGetId") - before;
    if (asked != 0) {
        fprintf(stderr, "%d stream-ordered frees asked cuCtxGetId %llu times\n", N,
                (unsigned long long)asked);
        e2e_failures++;
    }
}

/* stream-churn: streams made and destroyed on one thread (the dead-handle
 * filter and slots rewritten) while another allocates and frees
 * stream-ordered on its own live stream (read without the lock): every
 * call served (for TSan). */
static atomic_int churn_stop;

static void *churn(void *arg)
{
    (void)arg;
    for (int i = 0; i < 2000 && !atomic_load(&churn_stop); i++) {
        cudaStream_t x;
        if (cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking) == cudaSuccess)
            CHECK_EQ(cudaStreamDestroy(x), cudaSuccess);
    }
    return NULL;
}

static void stream_churn(void)
{
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, churn, NULL), 0);
    int refused = 0;
    for (int i = 0; i < 2000; i++) {
        void *p = NULL;
        if (cudaMallocAsync(&p, 4096, s) != cudaSuccess || cudaFreeAsync(p, s) != cudaSuccess)
            refused++;
        if (i % 64 == 0)
            fakecuda()->complete_all();
    }
    atomic_store(&churn_stop, 1);
    CHECK_EQ(pthread_join(t, NULL), 0);
    CHECK_EQ(refused, 0);
    CHECK_EQ(cudaStreamSynchronize(s), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
}

/* legacy-while-capturing: a stream-ordered free on the legacy stream while
 * a blocking stream captures: CUDA refuses it
 * (cudaErrorStreamCaptureImplicit) and invalidates the capture (the shim
 * took it into the pool before: svc_stream_capturing read the legacy
 * stream's CAPTURE_IMPLICIT as "not capturing"); an allocation there
 * likewise (legacy-alloc-while-capturing). */
static void legacy_while_capturing(void)
{
    cudaStream_t b;
    CHECK_EQ(cudaStreamCreate(&b), cudaSuccess); /* blocking */
    void *keep = alloc_ok(MiB);
    CHECK_EQ(cudaStreamBeginCapture(b, cudaStreamCaptureModeRelaxed), cudaSuccess);
    CHECK_EQ(cudaFreeAsync(keep, 0), cudaErrorStreamCaptureImplicit);
    CHECK_EQ(cudaGetLastError(), cudaErrorStreamCaptureImplicit); /* (as free-dead-stream) */
    cudaGraph_t g = NULL;
    CHECK_EQ(cudaStreamEndCapture(b, &g), cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
    CHECK_EQ(cudaStreamDestroy(b), cudaSuccess);
    CHECK_EQ(cudaFree(keep), cudaSuccess); /* refused, it is still the program's */
}

/* legacy-while-capturing-new-thread: the same free made by a thread that
 * has made no CUDA call yet: the runtime makes the device's context current
 * first, then refuses (found by an audit: the shim's question about the
 * legacy stream, asked with no context current, read "no capture"). */
static void *free_on_legacy(void *p)
{
    return (void *)(intptr_t)cudaFreeAsync(p, 0);
}

static void legacy_while_capturing_new_thread(void)
{
    cudaStream_t b;
    CHECK_EQ(cudaStreamCreate(&b), cudaSuccess); /* blocking */
    void *keep = alloc_ok(MiB);
    CHECK_EQ(cudaStreamBeginCapture(b, cudaStreamCaptureModeRelaxed), cudaSuccess);
    pthread_t t;
    void *res = NULL;
    CHECK_EQ(pthread_create(&t, NULL, free_on_legacy, keep), 0);
    CHECK_EQ(pthread_join(t, &res), 0);
    CHECK_EQ((int)(intptr_t)res, cudaErrorStreamCaptureImplicit);
    cudaGraph_t g = NULL;
    CHECK_EQ(cudaStreamEndCapture(b, &g), cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
    CHECK_EQ(cudaStreamDestroy(b), cudaSuccess);
    CHECK_EQ(cudaFree(keep), cudaSuccess); /* refused, it is still the program's */
}

static void legacy_alloc_while_capturing(void)
{
    cudaStream_t b;
    CHECK_EQ(cudaStreamCreate(&b), cudaSuccess); /* blocking */
    CHECK_EQ(cudaFree(alloc_ok(MiB)), cudaSuccess); /* the pool is made */
    CHECK_EQ(cudaStreamBeginCapture(b, cudaStreamCaptureModeRelaxed), cudaSuccess);
    void *p = NULL;
    CHECK_EQ(cudaMallocAsync(&p, MiB, 0), cudaErrorStreamCaptureImplicit);
    CHECK_EQ(cudaGetLastError(), cudaErrorStreamCaptureImplicit);
    CHECK(p == NULL);
    cudaGraph_t g = NULL;
    CHECK_EQ(cudaStreamEndCapture(b, &g), cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
    CHECK_EQ(cudaStreamDestroy(b), cudaSuccess);
}

static void custom_pool(void)
{
    typedef CUresult (*create_fn)(CUmemoryPool *, const CUmemPoolProps *);
    create_fn create = (create_fn)dlsym(dlopen("libcuda.so.1", RTLD_NOW), "cuMemPoolCreate");
    CHECK_EQ(cudaFree(NULL), cudaSuccess);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *pooled = NULL, *mine = NULL;
    CHECK_EQ(cudaMallocAsync(&pooled, MiB, s), cudaSuccess); /* the default pool: ours */
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemoryPool pool = NULL;
    CHECK_EQ(create(&pool, &props), CUDA_SUCCESS);
    CHECK_EQ(cudaDeviceSetMemPool(0, (cudaMemPool_t)pool), cudaSuccess);
    fakecuda_stats s0 = fake_stats();
    CHECK_EQ(cudaMallocAsync(&mine, MiB, s), cudaSuccess);
    CHECK_EQ(fake_stats().mem_alloc_async_calls, s0.mem_alloc_async_calls + 1);
    CHECK_EQ(cudaFreeAsync(mine, s), cudaSuccess);
    CHECK_EQ(fake_stats().mem_free_async_calls, s0.mem_free_async_calls + 1);
    /* Asking for the default pool by name is still ours, whichever pool is
     * current, on an explicit stream as on the legacy one. */
    CUmemoryPool dflt = NULL;
    CHECK_EQ(cudaDeviceGetDefaultMemPool((cudaMemPool_t *)&dflt, 0), cudaSuccess);
    s0 = fake_stats();
    CHECK_EQ(cudaMallocFromPoolAsync(&mine, MiB, (cudaMemPool_t)dflt, s), cudaSuccess);
    CHECK_EQ(cudaFreeAsync(mine, s), cudaSuccess);
    CHECK_EQ(cudaMallocFromPoolAsync(&mine, MiB, (cudaMemPool_t)dflt, NULL), cudaSuccess);
    CHECK_EQ(cudaFreeAsync(mine, NULL), cudaSuccess);
    CHECK_EQ(fake_stats().mem_alloc_async_calls, s0.mem_alloc_async_calls);
    CHECK_EQ(cudaDeviceSetMemPool(0, (cudaMemPool_t)dflt), cudaSuccess);
    s0 = fake_stats();
    CHECK_EQ(cudaMallocAsync(&mine, MiB, s), cudaSuccess); /* ours again */
    CHECK_EQ(fake_stats().mem_alloc_async_calls, s0.mem_alloc_async_calls);
    CHECK_EQ(cudaFreeAsync(mine, s), cudaSuccess);
    CHECK_EQ(cudaFreeAsync(pooled, s), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
}

/* A capture begun with CUDA 10.0's cuStreamBeginCapture (no mode), found
 * by dlsym and by cuGetProcAddress below 10010: the shim counts every
 * capture to skip its own capture questions while none is under way, so it
 * must see this one. A stream-ordered allocation on the capturing stream
 * belongs to the graph: it passes through to the driver. */
static void capture_v1(void)
{
    typedef CUresult (*begin_v1_fn)(CUstream);
    typedef CUresult (*end_fn)(CUstream, CUgraph *);
    typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    end_fn end = (end_fn)dlsym(h, "cuStreamEndCapture");
    gpa_fn gpa = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
    begin_v1_fn by_dlsym = (begin_v1_fn)dlsym(h, "cuStreamBeginCapture"), by_gpa = NULL;
    CUdriverProcAddressQueryResult found;
    CHECK(gpa && gpa("cuStreamBeginCapture", (void **)&by_gpa, 10000, 0, &found) ==
                     CUDA_SUCCESS);
    CHECK(end && by_dlsym && by_gpa);
    CHECK_EQ(cudaFree(NULL), cudaSuccess);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    begin_v1_fn begins[2] = {by_dlsym, by_gpa};
    const uint64_t begun = e2e_calls_of("cuStreamBeginCapture");
    for (int i = 0; i < 2 && by_dlsym && by_gpa && end; i++) {
        CHECK_EQ(begins[i]((CUstream)s), CUDA_SUCCESS);
        fakecuda_stats s0 = fake_stats();
        void *p = NULL;
        CHECK_EQ(cudaMallocAsync(&p, MiB, s), cudaSuccess);
        CHECK_EQ(fake_stats().mem_alloc_async_calls, s0.mem_alloc_async_calls + 1);
        CHECK_EQ(cudaFreeAsync(p, s), cudaSuccess);
        CUgraph g = NULL;
        CHECK_EQ(end((CUstream)s, &g), CUDA_SUCCESS);
        CHECK(g != NULL);
        CHECK_EQ(fake_stats().capture_invalidations, s0.capture_invalidations);
        CHECK_EQ(cudaGraphDestroy((cudaGraph_t)g), cudaSuccess);
    }
    /* Counted under the symbol called, not the fake's C name for it. */
    CHECK_EQ(e2e_calls_of("cuStreamBeginCapture"), begun + 2);
    CHECK_EQ(e2e_calls_of("cuStreamBeginCapture_v1"), 0);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
}

/* Ordered pools (no non-blocking stream): a plain free's block is reused at
 * once behind a barrier on the legacy stream, which every blocking stream's
 * later work waits for. */
static void write_other(void *arg) { memset(arg, 0xa5, MiB); }

/* The new owner's work ran after the old owner's: the block holds its
 * pattern. */
static void expect_new_owner_last(const char *q)
{
    if ((unsigned char)q[0] != 0xa5 || (unsigned char)q[MiB - 1] != 0xa5) {
        fprintf(stderr, "the old owner's work ran after the new owner's\n");
        e2e_failures++;
    }
}

/* Old work on a blocking stream, new work on another (this thread's
 * per-thread default stream), completed first: the barrier makes it wait,
 * though blocking streams do not wait for each other. No wait of the host:
 * the old work is still queued when the block comes back. */
static void ordered_reuse(void)
{
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t b;
    CHECK_EQ(cudaStreamCreate(&b), cudaSuccess); /* blocking */
    CHECK_EQ(fakecuda()->launch(b, write_pattern, p), 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    fakecuda_stats s0 = fake_stats();
    char *q = alloc_ok(MiB);
    if (e2e_driver_door_closed()) {
        /* Contexts the program makes through the driver are not seen: no
         * pool is ordered, and the block comes back once its work is done. */
        expect_safe(p, q, b);
    } else {
        CHECK(q == p); /* reused at once, in order */
        CHECK_EQ(fakecuda()->pending(b), 1);
        CHECK_EQ(fake_stats().event_synchronize_calls, s0.event_synchronize_calls);
    }
    CHECK_EQ(fakecuda()->launch(cudaStreamPerThread, write_other, q), 0);
    fakecuda()->complete(cudaStreamPerThread);
    fakecuda()->complete_all();
    expect_new_owner_last(q);
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(b), cudaSuccess);
}

/* ordered-stream-destroy: the old work is on a blocking stream destroyed
 * before the free, the fake's legacy stream not waiting for destroyed
 * streams (its default; FAKECUDA_LEGACY_SKIPS_DESTROYED=0 takes the other
 * reading, a reading the stream synchronisation note allows too). The
 * barrier must still order the new owner after it: the legacy stream
 * waits for the destroyed stream's stand-in explicitly (seal_ordered).
 * Mutation testing: without that wait no test failed while the fake's
 * default was the other reading, which made it redundant. */
static void ordered_stream_destroy(void)
{
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t b;
    CHECK_EQ(cudaStreamCreate(&b), cudaSuccess); /* blocking */
    CHECK_EQ(fakecuda()->launch(b, write_pattern, p), 0);
    CHECK_EQ(cudaStreamDestroy(b), cudaSuccess); /* returns; the work goes on */
    CHECK_EQ(cudaFree(p), cudaSuccess);
    char *q = alloc_ok(MiB);
    if (!e2e_driver_door_closed())
        CHECK(q == p); /* reused at once behind the barrier */
    CHECK_EQ(fakecuda()->launch(cudaStreamPerThread, write_other, q), 0);
    fakecuda()->complete(cudaStreamPerThread);
    fakecuda()->complete_all();
    if (q == p)
        expect_new_owner_last(q);
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
}

/* ordered-region-trim: a growing pool over cuMemAlloc regions, ordered, and
 * the fake's cuMemFree not synchronising (FAKECUDA_FREE_NO_SYNC, a reading
 * cuda.h's "may perform implicit synchronization" allows). A block freed
 * behind work on a blocking stream, then a trim: the barrier makes the
 * block reusable at once, its region is idle, and it goes back with
 * cuMemFree. Not before the old work ran (region_free waits for the last
 * barrier). Mutation testing: without that wait no test failed, the
 * fake's cuMemFree completing the device's work itself. */
static void ordered_region_trim(void)
{
    char *p = alloc_ok(MiB);
    cudaStream_t b;
    CHECK_EQ(cudaStreamCreate(&b), cudaSuccess); /* blocking */
    CHECK_EQ(fakecuda()->launch(b, write_pattern, p), 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    cudaMemPool_t pool;
    CHECK_EQ(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
    CHECK_EQ(cudaMemPoolTrimTo(pool, 0), cudaSuccess);
    if (!fakecuda()->is_device_pointer((uint64_t)(uintptr_t)p) && fakecuda()->pending(b)) {
        fprintf(stderr, "the block's region went back with %llu operation(s) still queued "
                        "on it\n", (unsigned long long)fakecuda()->pending(b));
        _exit(1); /* (that work would fault) */
    }
    CHECK(!fakecuda()->is_device_pointer((uint64_t)(uintptr_t)p)); /* it went back */
    fakecuda()->complete_all();
    CHECK_EQ(cudaStreamDestroy(b), cudaSuccess);
}

/* A block freed stream-ordered on the legacy stream after work on a
 * blocking stream (this thread's per-thread default stream) used it, then
 * allocated on the legacy stream by another thread, which uses it on its
 * own per-thread default stream. Legal: the free, as a legacy-stream
 * action, waits for every blocking stream, and the other thread's
 * per-thread work waits for the legacy stream's allocation ("the legacy
 * stream first waits on all blocking streams, the action is queued in the
 * legacy stream, and then all blocking streams wait on the legacy
 * stream"). The shim queues nothing on the legacy stream for either call,
 * so taking the legacy lane's block at once leaves no such order: the new
 * owner's work must still run after the old owner's (found by the
 * per-thread audit). */
static void *legacy_alloc_on_ptsz(void *arg)
{
    char **q = arg;
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    CHECK_EQ(cudaMallocAsync((void **)q, MiB, cudaStreamLegacy), cudaSuccess);
    CHECK_EQ(fakecuda()->launch(cudaStreamPerThread, write_other, *q), 0);
    fakecuda()->complete(cudaStreamPerThread); /* the new owner's work, first */
    return NULL;
}

static void legacy_lane_ptsz(void)
{
    char *p, *filler = fill_but_hole(&p), *q = NULL;
    CHECK_EQ(fakecuda()->launch(cudaStreamPerThread, write_pattern, p), 0);
    CHECK_EQ(cudaFreeAsync(p, cudaStreamLegacy), cudaSuccess);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, legacy_alloc_on_ptsz, &q), 0);
    pthread_join(t, NULL);
    fakecuda()->complete_all();
    if (q)
        expect_new_owner_last(q);
    CHECK_EQ(cudaFreeAsync(q, cudaStreamLegacy), cudaSuccess);
    CHECK_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
}

/* Stream-ordered reuse on the legacy stream needs no host wait in CUDA: a
 * block freed there is the next allocation's there at once, in stream
 * order, whatever the GPU still has queued (found by the review of the
 * legacy-stream change). The pool is full but for the hole, the legacy
 * stream runs a kernel that does not end (a persistent kernel the host
 * releases later), and a non-blocking stream exists (how 0: the pool is
 * not ordered, so the legacy lane's seal is an event that must complete)
 * or not (how 1: an ordered pool's barrier). The allocation must come
 * back, not wait for the kernel. */
static void legacy_reuse_stuck(int how)
{
    cudaStream_t nb = NULL;
    if (how == 0)
        CHECK_EQ(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking), cudaSuccess);
    char *p, *filler = fill_but_hole(&p), *q = NULL;
    CHECK_EQ(fakecuda()->launch_stuck(CU_STREAM_LEGACY), 0);
    CHECK_EQ(cudaFreeAsync(p, cudaStreamLegacy), cudaSuccess);
    alarm(20); /* a hang fails the test here */
    CHECK_EQ(cudaMallocAsync((void **)&q, MiB, cudaStreamLegacy), cudaSuccess);
    alarm(0);
    CHECK(q != NULL);
    (void)filler; /* the kernel never ends: nothing is given back */
    if (nb)
        (void)nb;
    _exit(e2e_failures ? 1 : 0);
}

static void legacy_reuse_stuck_events(void) { legacy_reuse_stuck(0); }
static void legacy_reuse_stuck_ordered(void) { legacy_reuse_stuck(1); }

/* A block reused behind a barrier, then a non-blocking stream, which does
 * not wait for the legacy stream, made and given the block: its work must
 * still come after the old owner's (it waits for the last barrier). */
static void ordered_then_non_blocking(void)
{
    char *p, *filler = fill_but_hole(&p);
    CHECK_EQ(fakecuda()->launch(NULL, write_pattern, p), 0); /* the legacy stream */
    CHECK_EQ(cudaFree(p), cudaSuccess);
    char *q = alloc_ok(MiB);
    CHECK(q == p);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(fakecuda()->launch(s, write_other, q), 0);
    fakecuda()->complete(s);
    fakecuda()->complete_all();
    expect_new_owner_last(q);
    /* From now on a plain free waits for its events: the block is not
     * handed out while the non-blocking stream's work is queued. */
    CHECK_EQ(fakecuda()->launch(s, write_pattern, q), 0);
    CHECK_EQ(cudaFree(q), cudaSuccess);
    char *r = alloc_ok(MiB);
    expect_safe(q, r, s);
    fakecuda()->complete_all();
    CHECK_EQ(cudaFree(r), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
}

/* A destroyed blocking stream's work and the legacy stream, in a pool that
 * is not ordered (a non-blocking stream exists), where an allocation on the
 * legacy stream takes the legacy lane's blocks in stream order; the fake's
 * legacy stream does not wait for destroyed streams (its default,
 * FAKECUDA_LEGACY_SKIPS_DESTROYED). (how) is:
 *   0  legacy-lane-destroyed: the block is freed on the legacy stream
 *      while the blocking stream lives (the free, a legacy-stream action,
 *      is ordered after its work), the stream is destroyed, and the block
 *      comes back on the legacy stream at once; the new owner uses it on
 *      this thread's per-thread stream, whose work waits for the legacy
 *      stream's: it must still run after the old owner's;
 *   1  legacy-alloc-destroyed: the stream is destroyed, then the block is
 *      freed with cudaFree (which synchronises in CUDA: a correct program)
 *      and allocated on the legacy stream: the plain lane's fence must
 *      cover the destroyed stream's work (its stand-in), not the legacy
 *      stream's wait, which leaves it out;
 *   2  legacy-alloc-destroyed-after: the same, destroyed after the free;
 *   3  ordered-destroyed-then-non-blocking: 1 in a pool that is ordered
 *      until a non-blocking stream is made between the free and the
 *      allocation (the free waits in the plain lane, unsealed);
 *   4  ordered-destroyed-reused-then-non-blocking: the block comes back
 *      behind the ordered pool's barrier (which waits for the stand-in),
 *      then a non-blocking stream is made and the new owner uses it there.
 * (found sound by the audit of the legacy lane's stream-order reuse) */
static void legacy_destroyed(int how)
{
    cudaStream_t nb = NULL, b;
    if (how <= 2)
        CHECK_EQ(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking), cudaSuccess);
    char *p, *filler = fill_but_hole(&p), *q = NULL;
    CHECK_EQ(cudaStreamCreate(&b), cudaSuccess); /* blocking */
    CHECK_EQ(fakecuda()->launch(b, write_pattern, p), 0);
    if (how == 0) {
        CHECK_EQ(cudaFreeAsync(p, cudaStreamLegacy), cudaSuccess);
        CHECK_EQ(cudaStreamDestroy(b), cudaSuccess); /* returns; the work goes on */
        CHECK_EQ(cudaMallocAsync((void **)&q, MiB, cudaStreamLegacy), cudaSuccess);
        CHECK(q == p); /* in stream order, at once */
        CHECK_EQ(fakecuda()->pending(b), 1);
    } else if (how == 4) {
        CHECK_EQ(cudaStreamDestroy(b), cudaSuccess);
        CHECK_EQ(cudaFree(p), cudaSuccess);
        q = alloc_ok(MiB);
        if (!e2e_driver_door_closed())
            CHECK(q == p); /* at once, behind the barrier */
        CHECK_EQ(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking), cudaSuccess);
    } else {
        if (how != 2)
            CHECK_EQ(cudaStreamDestroy(b), cudaSuccess);
        CHECK_EQ(cudaFree(p), cudaSuccess);
        if (how == 2)
            CHECK_EQ(cudaStreamDestroy(b), cudaSuccess);
        if (how == 3)
            CHECK_EQ(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking), cudaSuccess);
        CHECK_EQ(cudaMallocAsync((void **)&q, MiB, cudaStreamLegacy), cudaSuccess);
        expect_safe(p, q, b);
    }
    /* The new owner's work, run first: it must come after the old one's. */
    cudaStream_t user = how == 4 ? nb : cudaStreamPerThread;
    CHECK_EQ(fakecuda()->launch(user, write_other, q), 0);
    fakecuda()->complete(user);
    fakecuda()->complete_all();
    if (q == p)
        expect_new_owner_last(q);
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
    if (how == 4)
        CHECK_EQ(cudaFree(q), cudaSuccess);
    else
        CHECK_EQ(cudaFreeAsync(q, cudaStreamLegacy), cudaSuccess);
    CHECK_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(nb), cudaSuccess);
}

static void legacy_lane_destroyed(void) { legacy_destroyed(0); }
static void legacy_alloc_destroyed(void) { legacy_destroyed(1); }
static void legacy_alloc_destroyed_after(void) { legacy_destroyed(2); }
static void ordered_destroyed_then_non_blocking(void) { legacy_destroyed(3); }
static void ordered_destroyed_reused_then_non_blocking(void) { legacy_destroyed(4); }

/* The new owner's first use is on another device's stream (a peer write:
 * cudaMemcpyPeerAsync into it, or a kernel with peer access). Device 1's
 * streams do not wait for device 0's legacy stream, so a barrier there
 * orders nothing for them: the old owner's work must be done before the
 * block comes back, as with an event fence (or the real cudaFree, which
 * synchronises). */
/* A driver function found with dlsym, as XLA and Numba find them. */
typedef CUresult (*ctx_fn)(CUcontext);
typedef CUresult (*ctx_out_fn)(CUcontext *);
#define drv(name, type) ((type)dlsym(dlopen("libcuda.so.1", RTLD_NOW), name))

/* The other context: device 1's primary one (made by the runtime), or one
 * created on device 0 beside the primary one, which may reach the pool's
 * memory by a peer copy: by cuCtxCreate_v4 found by dlsym, or by an older
 * version as cuGetProcAddress hands it out below _v4's (CUDA 2.0's
 * cuCtxCreate, 3.2's _v2, 11.4's _v3), each of which the shim must see. */
typedef enum { OTHER_DEVICE, CREATED_V1, CREATED_V2, CREATED_V3, CREATED_V4 } other_kind;

/* Creates a context on device 0 with cuCtxCreate's version `how`; it is
 * current afterwards. */
static CUcontext create_with(other_kind how)
{
    typedef CUresult (*create_v1_fn)(CUcontext *, unsigned, CUdevice);
    typedef CUresult (*create_v3_fn)(CUcontext *, CUexecAffinityParam *, int, unsigned, CUdevice);
    typedef CUresult (*create_v4_fn)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice);
    CUcontext c = NULL;
    CUresult r = CUDA_ERROR_NOT_FOUND;
    if (how == CREATED_V4) {
        create_v4_fn f = (create_v4_fn)dlsym(dlopen("libcuda.so.1", RTLD_NOW), "cuCtxCreate_v4");
        r = f ? f(&c, NULL, 0, 0) : r;
    } else if (how == CREATED_V3) {
        create_v3_fn f = (create_v3_fn)proc_at("cuCtxCreate", 11040);
        r = f ? f(&c, NULL, 0, 0, 0) : r;
    } else {
        create_v1_fn f = (create_v1_fn)proc_at("cuCtxCreate", how == CREATED_V1 ? 2000 : 3020);
        r = f ? f(&c, 0, 0) : r;
    }
    CHECK_EQ(r, CUDA_SUCCESS);
    return c;
}

static CUcontext other_context(other_kind how)
{
    if (how == OTHER_DEVICE) {
        CHECK_EQ(cudaSetDevice(1), cudaSuccess);
        CHECK_EQ(cudaFree(NULL), cudaSuccess);
        CUcontext c = NULL;
        CHECK_EQ(drv("cuCtxGetCurrent", ctx_out_fn)(&c), CUDA_SUCCESS);
        CHECK_EQ(cudaSetDevice(0), cudaSuccess);
        return c;
    }
    CHECK_EQ(cudaFree(NULL), cudaSuccess); /* the driver initialised */
    CUcontext c = create_with(how);        /* current now */
    CHECK_EQ(cudaSetDevice(0), cudaSuccess); /* the primary again */
    return c;
}

/* The new owner's write into q on the legacy stream of context `other`,
 * run before the rest of the GPU's work. */
static void write_from(CUcontext other, char *q)
{
    CHECK_EQ(drv("cuCtxPushCurrent_v2", ctx_fn)(other), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->launch(NULL, write_other, q), 0);
    fakecuda()->complete(NULL);
    CUcontext popped;
    CHECK_EQ(drv("cuCtxPopCurrent_v2", ctx_out_fn)(&popped), CUDA_SUCCESS);
    fakecuda()->complete_all();
}

static void ordered_other_context(other_kind how)
{
    CUcontext other = other_context(how);
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t b;
    CHECK_EQ(cudaStreamCreate(&b), cudaSuccess); /* blocking, device 0 */
    CHECK_EQ(fakecuda()->launch(b, write_pattern, p), 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    char *q = alloc_ok(MiB);
    write_from(other, q); /* the peer write of the new owner */
    if (q == p)
        expect_new_owner_last(q);
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(b), cudaSuccess);
    if (how != OTHER_DEVICE && other)
        CHECK_EQ(drv("cuCtxDestroy_v2", ctx_fn)(other), CUDA_SUCCESS);
}

static void ordered_other_device(void) { ordered_other_context(OTHER_DEVICE); }

static void ordered_created_context(void) { ordered_other_context(CREATED_V4); }
static void ordered_created_context_v1(void) { ordered_other_context(CREATED_V1); }
static void ordered_created_context_v2(void) { ordered_other_context(CREATED_V2); }
static void ordered_created_context_v3(void) { ordered_other_context(CREATED_V3); }

/* ordered-then-other-device: the second context (device 1's) comes after
 * device 0's pool entered the ordered state. First a block reused behind a
 * barrier, its old work still queued, is written from device 1 once that
 * context exists: the host must wait for the last barrier when the state
 * ends (fences_ordered_end_device). Then a block freed behind new work is
 * reused and written from device 1: the state must have ended
 * (fences_context_seen), the barrier ordering nothing for device 1. */
static void ordered_then_other_device(void)
{
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t b;
    CHECK_EQ(cudaStreamCreate(&b), cudaSuccess); /* blocking, device 0 */
    CHECK_EQ(fakecuda()->launch(b, write_pattern, p), 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    char *q = alloc_ok(MiB);
    if (!e2e_driver_door_closed())
        CHECK(q == p); /* reused at once behind the barrier */
    CUcontext other = other_context(OTHER_DEVICE);
    write_from(other, q);
    expect_new_owner_last(q);
    CHECK_EQ(fakecuda()->launch(b, write_pattern, q), 0);
    CHECK_EQ(cudaFree(q), cudaSuccess);
    char *r = alloc_ok(MiB);
    write_from(other, r);
    if (r == q)
        expect_new_owner_last(r);
    CHECK_EQ(cudaFree(r), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(b), cudaSuccess);
}

/* Waits up to ms milliseconds for phase `phase`; true if it came. */
static bool phase_wait_for(e2e_phase *p, int phase, long ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&p->lock);
    int r = 0;
    while (p->phase < phase && r == 0)
        r = pthread_cond_timedwait(&p->cond, &p->lock, &until);
    bool came = p->phase >= phase;
    pthread_mutex_unlock(&p->lock);
    return came;
}

static atomic_bool cue_given;

/* The other thread's cue, given from inside the shim's next cuEventQuery
 * (after it chose the query's capture mode): cue 2 tells it to act (begin a
 * capture, fork a stream), step 1 says it did. */
typedef struct cue_pair {
    e2e_phase *cue, *step;
} cue_pair;

/* A shim that holds such an act off until its query (or seal) is made
 * keeps the thread waiting, so the query goes on after half a second; one
 * that does not lets it act (microseconds), and its query or seal then
 * meets the capture. (A machine too slow to act within half a second would
 * only let a faulty shim pass, never fail a sound one.) */
static void act_now(void *arg)
{
    cue_pair *c = arg;
    atomic_store(&cue_given, true);
    e2e_phase_set(c->cue, 2);
    phase_wait_for(c->step, 1, 500);
}

/* An allocation whose fence query (the pool seals the plain lane and asks
 * about its fence: the hole's work is pending) gives the other thread its
 * cue; served from the space left beside the filler. Returns it once the
 * other thread has acted. */
static char *allocate_on_cue(e2e_phase *cue, e2e_phase *step)
{
    cue_pair c = {cue, step};
    fakecuda()->before_next_event_query(act_now, &c);
    char *x = NULL;
    CHECK_EQ(cudaMalloc((void **)&x, MiB / 8), cudaSuccess);
    CHECK(atomic_load(&cue_given)); /* (else the scenario tests nothing) */
    if (!atomic_load(&cue_given)) {
        fakecuda()->before_next_event_query(NULL, NULL); /* (c is going) */
        e2e_phase_set(cue, 2);
    }
    e2e_phase_wait(step, 1);
    return x;
}

/* ptsz-fork-vs-seal: a thread that begins a capture on a non-blocking
 * stream of its own (relaxed), records an event in it, and on cue 2 makes
 * its per-thread default stream wait on that event: a fork of a blocking
 * stream, which makes the legacy stream unusable until the capture ends. */
typedef struct ptsz_forker {
    e2e_phase cue;  /* 1: capture begun, event recorded; 2: please fork */
    e2e_phase step; /* 1: forked; 2: please join and end; 3: ended */
    cudaError_t begin_result, fork_result, end_result;
} ptsz_forker;

static void *ptsz_fork_thread(void *arg)
{
    ptsz_forker *f = arg;
    cudaStream_t origin = NULL;
    cudaEvent_t fork = NULL, join = NULL;
    CHECK_EQ(cudaFree(NULL), cudaSuccess); /* this thread's context */
    CHECK_EQ(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
    CHECK_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
    f->begin_result = cudaStreamBeginCapture(origin, cudaStreamCaptureModeRelaxed);
    CHECK_EQ(cudaEventRecord(fork, origin), cudaSuccess);
    e2e_phase_set(&f->cue, 1);
    e2e_phase_wait(&f->cue, 2);
    f->fork_result = cudaStreamWaitEvent(cudaStreamPerThread, fork, 0);
    e2e_phase_set(&f->step, 1);
    e2e_phase_wait(&f->step, 2);
    CHECK_EQ(cudaEventRecord(join, cudaStreamPerThread), cudaSuccess);
    CHECK_EQ(cudaStreamWaitEvent(origin, join, 0), cudaSuccess);
    cudaGraph_t g = NULL;
    f->end_result = cudaStreamEndCapture(origin, &g);
    e2e_phase_set(&f->step, 3);
    cudaStreamDestroy(origin);
    return NULL;
}

static void ptsz_fork_vs_seal(void)
{
    char *p, *filler = fill_but_hole(&p);
    /* A non-blocking stream: the pool is not ordered, so a plain free is
     * fenced with events, among them one on the legacy stream. */
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(fakecuda()->launch(s, write_pattern, p), 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    ptsz_forker f = {.cue = E2E_PHASE_INIT, .step = E2E_PHASE_INIT};
    pthread_t t;
    pthread_create(&t, NULL, ptsz_fork_thread, &f);
    /* Its begin recorded a stand-in on its stream, which the next plain
     * seal sweeps (a query) after its look at the legacy stream and before
     * its events. */
    e2e_phase_wait(&f.cue, 1);
    fakecuda_stats s0 = fake_stats();
    char *x = allocate_on_cue(&f.cue, &f.step); /* the fork comes in its seal */
    fakecuda_stats s1 = fake_stats();
    if (s1.capture_invalidations != s0.capture_invalidations)
        fprintf(stderr, "the seal recorded legacy-stream work while another thread's "
                        "per-thread stream was in a capture: %llu invalidation(s), %llu "
                        "legacy stream op(s)\n",
                (unsigned long long)(s1.capture_invalidations - s0.capture_invalidations),
                (unsigned long long)(s1.legacy_stream_ops - s0.legacy_stream_ops));
    CHECK_EQ(s1.capture_invalidations, s0.capture_invalidations);
    e2e_phase_set(&f.step, 2);
    e2e_phase_wait(&f.step, 3);
    pthread_join(t, NULL);
    CHECK_EQ(f.begin_result, cudaSuccess);
    CHECK_EQ(f.fork_result, cudaSuccess);
    CHECK_EQ(f.end_result, cudaSuccess);
    all_comes_back(x, filler, s);
}

static void query_vs_begin(void)
{
    char *p, *filler = fill_but_hole(&p);
    /* A non-blocking stream: the pool is not ordered, so a plain free is
     * fenced with events, which the next allocation asks about. */
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(fakecuda()->launch(s, write_pattern, p), 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    capturer c = {.per_thread = false, .mode = cudaStreamCaptureModeGlobal,
                  .step = E2E_PHASE_INIT, .on_cue = true, .cue = E2E_PHASE_INIT};
    pthread_t t;
    pthread_create(&t, NULL, capture_thread, &c);
    e2e_phase_wait(&c.cue, 1); /* its context and stream made, no capture yet */
    fakecuda_stats s0 = fake_stats();
    char *x = allocate_on_cue(&c.cue, &c.step); /* the begin comes in its query */
    capture_ends_intact(&c, t, &s0);
    all_comes_back(x, filler, s);
}

/* While another thread captures in global mode, ends_elsewhere(idle) ends
 * captures on stream `idle` that are not that one; then a plain free's
 * fence is asked about (the free's work still pending on a non-blocking
 * stream: the pool is not ordered, so the next allocation seals and
 * queries). In global mode that query would be refused and would break the
 * other thread's capture: the shim must still count that capture, whatever
 * the ends before said. */
static void ends_then_query(void (*ends_elsewhere)(cudaStream_t idle))
{
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t s, idle;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(fakecuda()->launch(s, write_pattern, p), 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    capturer c = {.per_thread = false, .mode = cudaStreamCaptureModeGlobal,
                  .step = E2E_PHASE_INIT};
    pthread_t t = capture_begun(&c);
    fakecuda_stats s0 = fake_stats();
    ends_elsewhere(idle);
    uint64_t queries = e2e_calls_of("cuEventQuery");
    char *x = NULL;
    CHECK_EQ(cudaMalloc((void **)&x, MiB / 8), cudaSuccess);
    CHECK(e2e_calls_of("cuEventQuery") > queries); /* (else the scenario tests nothing) */
    capture_ends_intact(&c, t, &s0);
    all_comes_back(x, filler, s);
    CHECK_EQ(cudaStreamDestroy(idle), cudaSuccess);
}

/* An end on a stream that is not capturing, and a capture ended twice: the
 * driver refuses the stray ends (CUDA_ERROR_ILLEGAL_STATE here), and none of
 * them ends the other thread's capture. */
static void stray_ends(cudaStream_t idle)
{
    cudaGraph_t g = NULL;
    CHECK_EQ(cudaStreamEndCapture(idle, &g), cudaErrorIllegalState);
    CHECK_EQ(cudaStreamBeginCapture(idle, cudaStreamCaptureModeRelaxed), cudaSuccess);
    CHECK_EQ(cudaStreamEndCapture(idle, &g), cudaSuccess);
    CHECK_EQ(cudaGraphDestroy(g), cudaSuccess);
    CHECK_EQ(cudaStreamEndCapture(idle, &g), cudaErrorIllegalState);
    cudaGetLastError();
}

static void bogus_end(void) { ends_then_query(stray_ends); }

/* A relaxed capture begun where the shim cannot see it (by a library
 * preloaded after the shim, through the driver's own function) and ended
 * through the shim: the end succeeds, yet no capture the shim counted
 * ended. */
static void unseen_capture_ended(cudaStream_t idle)
{
    unseen_calls u;
    if (!find_unseen(&u))
        return;
    CHECK_EQ(u.begin((CUstream)idle, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    end_seen(idle, cudaSuccess);
}

static void unseen_end(void) { ends_then_query(unseen_capture_ended); }

/* While another thread captures on its per-thread default stream (a
 * blocking stream: the legacy stream takes no event), this thread's own
 * per-thread default stream, which is in no registry, uses a block that is
 * then freed. */
static void ptsz_during_capture(void)
{
    char *p, *filler = fill_but_hole(&p);
    capturer c = {.per_thread = true, .mode = cudaStreamCaptureModeRelaxed,
                  .step = E2E_PHASE_INIT};
    pthread_t t = capture_begun(&c);
    CHECK_EQ(fakecuda()->launch(cudaStreamPerThread, write_pattern, p), 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    void *q = NULL;
    if (cudaMalloc(&q, MiB) == cudaSuccess)
        expect_safe(p, q, cudaStreamPerThread);
    else
        cudaGetLastError();
    e2e_phase_set(&c.step, 2);
    e2e_phase_wait(&c.step, 3);
    pthread_join(t, NULL);
    fakecuda()->complete_all();
    if (q)
        CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
}

/* (BFCSHIM_VMM=off, growing) A region taken while another thread captures
 * in global mode: the shim's own cuMemAlloc is "potentially unsafe" and,
 * made in global mode, was refused and invalidated that capture (found by
 * the capture-query audit); it is made in relaxed mode. */
static void region_during_capture(void)
{
    char *first = alloc_ok(MiB); /* the pool, and its first region */
    capturer c = {.per_thread = false, .mode = cudaStreamCaptureModeGlobal,
                  .step = E2E_PHASE_INIT};
    pthread_t t = capture_begun(&c);
    fakecuda_stats s0 = fake_stats();
    char *big = alloc_ok(64 * MiB); /* past the first region: a new one */
    CHECK(fake_stats().mem_alloc_calls > s0.mem_alloc_calls);
    capture_ends_intact(&c, t, &s0);
    CHECK_EQ(cudaFree(big), cudaSuccess);
    CHECK_EQ(cudaFree(first), cudaSuccess);
}

int main(int argc, char **argv)
{
    static const e2e_scenario scenarios[] = {
        {"stream-destroy", stream_destroy}, {"destroy-after", destroy_after},
        {"stream-destroy-v1", stream_destroy_v1}, {"ctx-reuse-v1", ctx_reuse_v1},
        {"capture-begin", capture_begin},   {"capture-to-graph", capture_to_graph},
        {"legacy-capture", legacy_capture},
        {"ptsz-capture", ptsz_capture},     {"global-capture", global_capture},
        {"reset-streams", reset_streams},   {"ctx-reuse", ctx_reuse},
        {"stream-device", stream_device},   {"custom-pool", custom_pool},
        {"free-dead-stream", free_dead_stream},
        {"legacy-while-capturing", legacy_while_capturing},
        {"legacy-alloc-while-capturing", legacy_alloc_while_capturing},
        {"alloc-dead-stream", alloc_dead_stream},
        {"dead-stream-reborn", dead_stream_reborn},
        {"dead-stream-reborn-unseen", dead_stream_reborn_unseen},
        {"unseen-reset-events", unseen_reset_events},
        {"unseen-reset-events-reused", unseen_reset_events},
        {"unseen-reset-streams", unseen_reset_streams},
        {"unseen-reset-streams-no-pool", unseen_reset_streams_no_pool},
        {"unseen-reset-streams-id-fails", unseen_reset_streams_id_fails},
        {"unseen-reset-streams-no-pool-id-fails", unseen_reset_streams_no_pool_id_fails},
        {"unseen-destroy-id-fails", unseen_destroy_id_fails},
        {"hooks-off-free-cost", hooks_off_free_cost},
        {"dead-stream-reborn-in-window", dead_stream_reborn_in_window},
        {"stream-churn", stream_churn},
        {"legacy-while-capturing-new-thread", legacy_while_capturing_new_thread},
        {"other-device-legacy", other_device_legacy},
        {"other-device-legacy-async", other_device_legacy_async},
        {"other-device-ptsz", other_device_ptsz},
        {"other-device-ptsz0", other_device_ptsz0},
        {"other-device-reset-free", other_device_reset_free},
        {"other-device-ptsz0-driver", other_device_ptsz0_driver},
        {"other-device-legacy-after-ptsz", other_device_legacy_after_ptsz},
        {"other-device-blocking-after-legacy", other_device_blocking_after_legacy},
        {"other-device-stream", other_device_stream},
        {"other-device-stream-destroyed", other_device_stream_destroyed},
        {"other-device-dead-stream", other_device_dead_stream},
        {"other-device-reset-stream", other_device_reset_stream},
        {"capture-v1", capture_v1},
        {"legacy-lane-ptsz", legacy_lane_ptsz},
        {"legacy-lane-destroyed", legacy_lane_destroyed},
        {"legacy-alloc-destroyed", legacy_alloc_destroyed},
        {"legacy-alloc-destroyed-after", legacy_alloc_destroyed_after},
        {"ordered-destroyed-then-non-blocking", ordered_destroyed_then_non_blocking},
        {"ordered-destroyed-reused-then-non-blocking",
         ordered_destroyed_reused_then_non_blocking},
        {"legacy-reuse-stuck-events", legacy_reuse_stuck_events},
        {"legacy-reuse-stuck-ordered", legacy_reuse_stuck_ordered},
        {"ordered-reuse", ordered_reuse},   {"ordered-then-non-blocking", ordered_then_non_blocking},
        {"ordered-stream-destroy", ordered_stream_destroy},
        {"ordered-region-trim", ordered_region_trim},
        {"ordered-other-device", ordered_other_device},
        {"ordered-then-other-device", ordered_then_other_device},
        {"ordered-created-context", ordered_created_context},
        {"ordered-created-context-v1", ordered_created_context_v1},
        {"ordered-created-context-v2", ordered_created_context_v2},
        {"ordered-created-context-v3", ordered_created_context_v3},
        {"ptsz-during-capture", ptsz_during_capture},
        {"query-vs-begin", query_vs_begin},
        {"ptsz-fork-vs-seal", ptsz_fork_vs_seal},
        {"bogus-end", bogus_end},           {"unseen-end", unseen_end},
        {"region-during-capture", region_during_capture},
        {"ptsz-fork-driver", ptsz_fork_driver},
        {"capture-fork-ptsz", capture_fork_ptsz},
        {"capture-fork", capture_fork},     {"free-in-fork", free_in_fork},
        {"fork-destroyed", fork_destroyed}, {"fork-destroyed-async", fork_destroyed_async},
        {"stale-begun", stale_begun},       {"fork-unseen-end", fork_unseen_end},
        {"ptsz-fork-unseen-end", ptsz_fork_unseen_end},
        {"ptsz-fork-unseen-begin-invalidated", ptsz_fork_unseen_begin_invalidated},       {"ptsz-fork", ptsz_fork},
    };
    return e2e_main("e2e_fences", scenarios, sizeof scenarios / sizeof scenarios[0], argc, argv);
}
