/*
 * e2e_drvfail.c - the shim's safety machinery when the driver calls it makes
 * fail (the fake's fail_call, fake_cuda.h: one call of one entry point
 * answers a code cuda.h documents for it, or every call from then on, as
 * after a kernel's fault). A failure may cost memory or a host wait, never
 * a block handed out while work queued before its free may still use it.
 * Each scenario fills the pool around one 1 MiB hole, as e2e_fences does,
 * so the next 1 MiB allocation can only land in the block just freed.
 * Scenarios:
 *
 *   destroy-stand-in-create  a non-blocking stream with work queued on the
 *                    block is destroyed, and the stand-in's cuEventCreate
 *                    fails (CUDA_ERROR_OUT_OF_MEMORY); then the block is
 *                    freed and allocated again
 *   destroy-stand-in-record  the same, the stand-in's cuEventRecord failing
 *   destroy-after-stand-in-create  freed first, then the stream destroyed
 *                    with the stand-in failing
 *   destroy-is-capturing  the same, cuStreamIsCapturing failing at the
 *                    destroy (CUDA_ERROR_INVALID_VALUE): whether the stream
 *                    captures is not known
 *   destroy-sticky   the same with a faulted context: cuEventCreate and
 *                    cuStreamSynchronize answer CUDA_ERROR_ILLEGAL_ADDRESS
 *                    from the destroy on (no stand-in, no host wait): the
 *                    block may not come back at all
 *   destroy-no-wait  the stand-in's cuEventCreate and the host wait that
 *                    replaces it (cuStreamSynchronize) each fail once at the
 *                    destroy, later calls succeeding: no seal can cover the
 *                    destroyed stream's work, so the pool keeps its freed
 *                    blocks (fences_keep_freed) rather than hand the block
 *                    out under it
 *   legacy-lane-kept  a pool with a non-blocking stream: a block freed on
 *                    the legacy stream behind work on a blocking stream,
 *                    which is then destroyed with neither stand-in nor host
 *                    wait (the pool keeps its freed blocks): the block
 *                    comes back on the legacy stream in stream order, and
 *                    the new owner's work still runs after the old owner's
 *   destroy-no-wait-blocking  the same stream destroyed first, the block
 *                    freed with cudaFree and allocated on the legacy
 *                    stream: kept, or handed out only once that work ran
 *   ordered-trim-kept  an ordered pool growing over regions (cuMemFree not
 *                    synchronising): a block freed behind work on a
 *                    blocking stream, made free behind the barrier, then a
 *                    blocking stream destroyed with neither stand-in nor
 *                    host wait (the pool keeps its freed blocks), then a
 *                    trim: the block's region must not go back before the
 *                    old work ran (region_free's wait for the last barrier)
 *   foreign-free-sync  a device-0 block freed with cudaFreeAsync on a
 *                    device-1 stream behind work there (the shim waits for
 *                    that stream on the host: no device-0 fence covers it),
 *                    and that wait fails (cuStreamSynchronize answers
 *                    CUDA_ERROR_INVALID_CONTEXT, the event wait before it
 *                    too): the block must not come back under that work
 *   ordered-stream-wait  an ordered pool (no non-blocking stream) hands the
 *                    hole out at once behind its barrier, with the old
 *                    owner's work still queued; then a non-blocking stream
 *                    is made, whose cuStreamWaitEvent on the last barrier
 *                    fails, and so does the host wait that replaces it
 *                    (cuEventSynchronize, CUDA_ERROR_INVALID_CONTEXT): the
 *                    new owner's work on that stream must not run before
 *                    the old owner's (the stream may be refused instead)
 *   foreign-free-legacy-sync  the same with the block freed on stream 0
 *                    while device 1 is current (device 1's legacy stream,
 *                    found by the current context rather than by a stream
 *                    handle of its own)
 *   fence-query      a plain free behind work on a non-blocking stream, and
 *                    every cuEventQuery fails (CUDA_ERROR_INVALID_VALUE)
 *                    while the next allocation needs the block: a refused
 *                    query means "not known yet", never "complete" (the
 *                    host waits for the fence instead)
 *   pool-id-fails    (BFCSHIM_VMM=off) the cuCtxGetId asked when device 0's
 *                    pool is made fails; the primary context is then reset
 *                    (unseen with the driver door closed) and made again
 *                    under the same handle: the next allocation must not
 *                    come from the dead context's pool
 */
#include <cuda.h>
#include <dlfcn.h>
#include <cuda_runtime_api.h>

#include "e2e_rt.h"

#define MiB (UINT64_C(1) << 20)

static void arm(const char *name, int code)
{
    CHECK_EQ(fakecuda()->fail_call(name, 1, code, 0), 0);
}

/* The rule armed for name is lifted (spent, or not reached). */
static void disarm(const char *name) { CHECK_EQ(fakecuda()->fail_call(name, 0, 0, 0), 0); }

/* A non-blocking stream with work queued on the hole is destroyed while
 * `fails` (the stand-in's call) answers `code`. */
static void destroyed_with_failure(bool before_free, const char *fails, int code)
{
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(fakecuda()->launch(s, write_pattern, p), 0);
    if (!before_free)
        CHECK_EQ(cudaFree(p), cudaSuccess);
    arm(fails, code);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess); /* returns; the work goes on */
    disarm(fails);
    if (before_free)
        CHECK_EQ(cudaFree(p), cudaSuccess);
    char *q = alloc_ok(MiB);
    expect_safe(p, q, s);
    fakecuda()->complete_all();
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
}

static void destroy_stand_in_create(void)
{
    destroyed_with_failure(true, "cuEventCreate", CUDA_ERROR_OUT_OF_MEMORY);
}

static void destroy_stand_in_record(void)
{
    destroyed_with_failure(true, "cuEventRecord", CUDA_ERROR_INVALID_VALUE);
}

static void destroy_after_stand_in_create(void)
{
    destroyed_with_failure(false, "cuEventCreate", CUDA_ERROR_OUT_OF_MEMORY);
}

static void destroy_is_capturing(void)
{
    destroyed_with_failure(true, "cuStreamIsCapturing", CUDA_ERROR_INVALID_VALUE);
}

static void destroy_sticky(void)
{
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(fakecuda()->launch(s, write_pattern, p), 0);
    static const char *const dead[] = {"cuEventCreate", "cuStreamSynchronize",
                                       "cuCtxSynchronize", "cuEventSynchronize"};
    for (size_t i = 0; i < sizeof dead / sizeof dead[0]; i++)
        CHECK_EQ(fakecuda()->fail_call(dead[i], 1, CUDA_ERROR_ILLEGAL_ADDRESS, 1), 0);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    void *q = NULL;
    cudaError_t e = cudaMalloc(&q, MiB); /* may fail: the block is not known idle */
    /* (refused: out of memory, or the event wait's CUDA_ERROR_INVALID_CONTEXT,
     * which cudaStreamCreateWithFlags answers as cudaErrorDeviceUninitialized) */
    CHECK(e == cudaSuccess || e == cudaErrorMemoryAllocation || e == cudaErrorDeviceUninitialized);
    expect_safe(p, q, s);
    for (size_t i = 0; i < sizeof dead / sizeof dead[0]; i++)
        disarm(dead[i]);
    fakecuda()->complete_all();
    if (q)
        CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
}

/* Mutation testing: with fences_keep_freed taken out of fences_stand_in,
 * destroy-sticky still passed (its sticky cuEventCreate failure refuses
 * every later seal too); here only the destroy's calls fail, and the next
 * seal, made of the legacy stream's event alone, completes at once. */
static void destroy_no_wait(void)
{
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(fakecuda()->launch(s, write_pattern, p), 0);
    arm("cuEventCreate", CUDA_ERROR_OUT_OF_MEMORY);
    arm("cuStreamSynchronize", CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess); /* returns; the work goes on */
    disarm("cuEventCreate");
    disarm("cuStreamSynchronize");
    CHECK_EQ(cudaFree(p), cudaSuccess);
    void *q = NULL;
    cudaError_t e = cudaMalloc(&q, MiB); /* may fail: the block is kept */
    CHECK(e == cudaSuccess || e == cudaErrorMemoryAllocation);
    expect_safe(p, q, s);
    fakecuda()->complete_all();
    if (q)
        CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
}

static void foreign_free_sync(void)
{
    cudaStream_t s1 = NULL;
    char *p, *filler = hole_under_other_device_work(&s1, &p);
    arm("cuStreamWaitEvent", CUDA_ERROR_INVALID_CONTEXT);
    arm("cuStreamSynchronize", CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cudaFreeAsync(p, s1), cudaSuccess);
    disarm("cuStreamWaitEvent");
    disarm("cuStreamSynchronize");
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    void *q = NULL;
    cudaError_t e = cudaMalloc(&q, MiB);
    /* (refused: out of memory, or the event wait's CUDA_ERROR_INVALID_CONTEXT,
     * which cudaStreamCreateWithFlags answers as cudaErrorDeviceUninitialized) */
    CHECK(e == cudaSuccess || e == cudaErrorMemoryAllocation || e == cudaErrorDeviceUninitialized);
    if (q == p && !earlier_work_ran) {
        fprintf(stderr, "the block freed on device 1's stream came back before that "
                        "stream's work ran\n");
        e2e_failures++;
    }
    fakecuda()->complete_all();
    if (q)
        CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s1), cudaSuccess);
}

static void write_other(void *arg) { memset(arg, 0xa5, MiB); }

/* A blocking stream destroyed with neither stand-in nor host wait (the pool
 * keeps its freed blocks from then on), in a pool that is not ordered (a
 * non-blocking stream exists), where the legacy lane is taken in stream
 * order, which keeping freed blocks does not stop; the fake's legacy
 * stream does not wait for destroyed streams (its default). (lane) is:
 *   true   legacy-lane-kept: the block was freed on the legacy stream
 *          before the destroy (a legacy-stream action, ordered after the
 *          stream's work while it lived); it comes back there in stream
 *          order, and the new owner's work on this thread's per-thread
 *          stream must still run after the old owner's;
 *   false  destroy-no-wait-blocking: freed with cudaFree after the destroy
 *          and allocated on the legacy stream: refused or safe, never the
 *          block under the destroyed stream's work.
 * (found sound by the audit of the legacy lane's stream-order reuse) */
static void kept_on_legacy(bool lane)
{
    cudaStream_t nb, b;
    CHECK_EQ(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking), cudaSuccess);
    char *p, *filler = fill_but_hole(&p), *q = NULL;
    CHECK_EQ(cudaStreamCreate(&b), cudaSuccess); /* blocking */
    CHECK_EQ(fakecuda()->launch(b, write_pattern, p), 0);
    if (lane)
        CHECK_EQ(cudaFreeAsync(p, cudaStreamLegacy), cudaSuccess);
    arm("cuEventCreate", CUDA_ERROR_OUT_OF_MEMORY);
    arm("cuStreamSynchronize", CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cudaStreamDestroy(b), cudaSuccess); /* returns; the work goes on */
    disarm("cuEventCreate");
    disarm("cuStreamSynchronize");
    if (!lane)
        CHECK_EQ(cudaFree(p), cudaSuccess);
    cudaError_t e = cudaMallocAsync((void **)&q, MiB, cudaStreamLegacy);
    if (lane) {
        CHECK_EQ(e, cudaSuccess);
        CHECK(q == p); /* in stream order, at once */
        CHECK_EQ(fakecuda()->launch(cudaStreamPerThread, write_other, q), 0);
        fakecuda()->complete(cudaStreamPerThread); /* the new owner's work, first */
    } else {
        CHECK(e == cudaSuccess || e == cudaErrorMemoryAllocation);
        expect_safe(p, q, b);
    }
    fakecuda()->complete_all();
    if (lane && ((unsigned char)q[0] != 0xa5 || (unsigned char)q[MiB - 1] != 0xa5)) {
        fprintf(stderr, "the old owner's work ran after the new owner's\n");
        e2e_failures++;
    }
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
    if (q)
        CHECK_EQ(cudaFreeAsync(q, cudaStreamLegacy), cudaSuccess);
    CHECK_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(nb), cudaSuccess);
}

static void legacy_lane_kept(void) { kept_on_legacy(true); }
static void destroy_no_wait_blocking(void) { kept_on_legacy(false); }

static void ordered_stream_wait(void)
{
    char *p, *filler = fill_but_hole(&p);
    CHECK_EQ(fakecuda()->launch(NULL, write_pattern, p), 0); /* the legacy stream */
    CHECK_EQ(cudaFree(p), cudaSuccess);
    char *q = alloc_ok(MiB); /* (the hole at once when the pool is ordered) */
    arm("cuStreamWaitEvent", CUDA_ERROR_INVALID_CONTEXT);
    arm("cuEventSynchronize", CUDA_ERROR_INVALID_CONTEXT);
    cudaStream_t s = NULL;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    disarm("cuStreamWaitEvent");
    disarm("cuEventSynchronize");
    /* (refused: out of memory, or the event wait's CUDA_ERROR_INVALID_CONTEXT,
     * which cudaStreamCreateWithFlags answers as cudaErrorDeviceUninitialized) */
    CHECK(e == cudaSuccess || e == cudaErrorMemoryAllocation || e == cudaErrorDeviceUninitialized);
    if (e == cudaSuccess) {
        /* The new owner's work, run first: it must wait for the old one's. */
        CHECK_EQ(fakecuda()->launch(s, write_other, q), 0);
        fakecuda()->complete(s);
    }
    fakecuda()->complete_all();
    if (e == cudaSuccess && ((unsigned char)q[0] != 0xa5 || (unsigned char)q[MiB - 1] != 0xa5)) {
        fprintf(stderr, "the old owner's work ran after the new owner's on the new stream\n");
        e2e_failures++;
    }
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
    if (e == cudaSuccess)
        CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
}

/* foreign-free-legacy-sync. Mutation testing: with the block of a failed
 * wait for another context's legacy or per-thread stream put in the plain
 * lane anyway (pool_lane_for_free), no test failed; foreign-free-sync
 * covers only an explicit stream's handle (settle_foreign_stream). */
static void foreign_free_legacy_sync(void)
{
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    CHECK_EQ(cudaFree(NULL), cudaSuccess); /* device 1's context */
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    char *p, *filler = fill_but_hole(&p);
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    earlier_work_ran = false;
    CHECK_EQ(fakecuda()->launch(NULL, earlier_work, p), 0); /* device 1's legacy stream */
    arm("cuStreamWaitEvent", CUDA_ERROR_INVALID_CONTEXT);
    arm("cuStreamSynchronize", CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cudaFreeAsync(p, 0), cudaSuccess);
    disarm("cuStreamWaitEvent");
    disarm("cuStreamSynchronize");
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    void *q = NULL;
    cudaError_t e = cudaMalloc(&q, MiB);
    CHECK(e == cudaSuccess || e == cudaErrorMemoryAllocation);
    if (q == p && !earlier_work_ran) {
        fprintf(stderr, "the block freed on device 1's legacy stream came back before that "
                        "stream's work ran\n");
        e2e_failures++;
    }
    fakecuda()->complete_all();
    if (q)
        CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
}

/* A fence whose event query fails (every query, while armed): the block
 * stays pending until a successful answer, here the engine's host wait. */
static void fence_query(void)
{
    char *p, *filler = fill_but_hole(&p);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(fakecuda()->launch(s, write_pattern, p), 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    CHECK_EQ(fakecuda()->fail_call("cuEventQuery", 1, CUDA_ERROR_INVALID_VALUE, 1), 0);
    char *q = alloc_ok(MiB);
    disarm("cuEventQuery");
    expect_safe(p, q, s);
    fakecuda()->complete_all();
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(cudaFree(filler), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
}

/* pool-id-fails (BFCSHIM_VMM=off: cuMemAlloc regions die with their
 * context): the cuCtxGetId asked when device 0's pool is made fails
 * (CUDA_ERROR_ILLEGAL_ADDRESS: an earlier launch's error, which cuda.h
 * notes for it); then the primary context is reset where the shim does
 * not see it (through dlsym: with the driver door closed, unseen) and made
 * again under the same handle. The next allocation must come from live
 * memory, not from the dead context's pool, which a pool without an id
 * could never be found to be. */
static void pool_id_fails(void)
{
    CHECK_EQ(cudaFree(NULL), cudaSuccess); /* the primary context, no pool yet */
    CHECK_EQ(fakecuda()->fail_call("cuCtxGetId", 1, CUDA_ERROR_ILLEGAL_ADDRESS, 0), 0);
    char *p = alloc_ok(MiB);
    disarm("cuCtxGetId");
    CHECK_EQ(cudaFree(p), cudaSuccess);
    unseen_primary_reset(0);
    char *q = alloc_ok(MiB);
    if (!fakecuda()->is_device_pointer((uint64_t)(uintptr_t)q)) {
        fprintf(stderr, "after the context was made again, 0x%llx was served from the dead "
                        "context's pool\n", (unsigned long long)(uintptr_t)q);
        e2e_failures++;
    }
    CHECK_EQ(cudaFree(q), cudaSuccess);
}

/* ordered-trim-kept: a pool that keeps its freed blocks still gives back
 * an idle region only once the work queued before its last barrier ran. */
static void ordered_trim_kept(void)
{
    void *p = NULL, *big = NULL;
    CHECK_EQ(cudaMalloc(&p, MiB), cudaSuccess); /* the first region */
    cudaStream_t b, d;
    CHECK_EQ(cudaStreamCreate(&b), cudaSuccess); /* blocking: the pool stays ordered */
    CHECK_EQ(fakecuda()->launch(b, write_pattern, p), 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    /* too large for the first region: the slow path seals the free (a
     * barrier), and the block's region is all free */
    CHECK_EQ(cudaMalloc(&big, 16 * MiB), cudaSuccess);
    CHECK_EQ(cudaStreamCreate(&d), cudaSuccess);
    arm("cuEventCreate", CUDA_ERROR_OUT_OF_MEMORY);
    arm("cuStreamSynchronize", CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cudaStreamDestroy(d), cudaSuccess); /* the pool keeps its freed blocks */
    disarm("cuEventCreate");
    disarm("cuStreamSynchronize");
    cudaMemPool_t pool;
    CHECK_EQ(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
    CHECK_EQ(cudaMemPoolTrimTo(pool, 0), cudaSuccess);
    if (!fakecuda()->is_device_pointer((uint64_t)(uintptr_t)p) && fakecuda()->pending(b)) {
        fprintf(stderr, "the block's region went back with %llu operation(s) still queued "
                        "on it\n", (unsigned long long)fakecuda()->pending(b));
        _exit(1); /* (that work would fault) */
    }
    fakecuda()->complete_all();
    CHECK_EQ(cudaFree(big), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(b), cudaSuccess);
}

int main(int argc, char **argv)
{
    static const e2e_scenario scenarios[] = {
        {"destroy-stand-in-create", destroy_stand_in_create},
        {"destroy-stand-in-record", destroy_stand_in_record},
        {"destroy-after-stand-in-create", destroy_after_stand_in_create},
        {"destroy-is-capturing", destroy_is_capturing},
        {"destroy-sticky", destroy_sticky},
        {"destroy-no-wait", destroy_no_wait},
        {"foreign-free-sync", foreign_free_sync},
        {"ordered-stream-wait", ordered_stream_wait},
        {"foreign-free-legacy-sync", foreign_free_legacy_sync},
        {"fence-query", fence_query},
        {"pool-id-fails", pool_id_fails},
        {"ordered-trim-kept", ordered_trim_kept},
        {"legacy-lane-kept", legacy_lane_kept},
        {"destroy-no-wait-blocking", destroy_no_wait_blocking},
    };
    return e2e_main("e2e_drvfail", scenarios, sizeof scenarios / sizeof scenarios[0], argc, argv);
}
