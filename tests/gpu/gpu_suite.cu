/*
 * gpu_suite.cu - the shim on a real GPU, with the real driver and runtime.
 * Built with nvcc against the shared cudart (so the runtime door applies)
 * and run under LD_PRELOAD=libbfcshim.so by meson. Exits 77 (skip) when no
 * GPU or no driver is present, as in CI.
 *
 *   reuse        kernels fill blocks with patterns and verify them on several
 *                non-blocking streams while other streams free (cudaFree) and
 *                reallocate: any early reuse corrupts a pattern
 *   reuse-async  the same with cudaMallocAsync / cudaFreeAsync per stream
 *   capture      allocations inside a stream capture, the graph launched;
 *                plain allocations and frees meanwhile must not break it
 *   oom          out of memory with the runtime's last error, then recovery
 *   ipc          an IPC handle of a pooled block is refused
 *   last-error   a refused call leaves the code it returns as cudart's last
 *                error (a free on a destroyed stream, an IPC handle of a
 *                freed block); printed: cudaEventQuery(NULL)'s answer
 *   meminfo      cudaMemGetInfo reports what the pool can still give
 *   meminfo-agree    the runtime and the driver report the same free memory
 *                    (the runtime door must not adjust a figure twice)
 *
 * Early reuse, on the real driver. Each of these fills the pool around one
 * hole, so a new allocation can only land in the block just freed; a kernel
 * that is still queued when the block is freed writes into it late, and the
 * new owner's pattern is then found overwritten:
 *   stream-destroy   the stream running that kernel is destroyed (it returns
 *                    at once; the work goes on) before the cudaFree
 *   capture-pending  the stream begins a capture between the free and the
 *                    next allocation
 *   capture-fork     the stream joins another stream's capture between the
 *                    free and the next allocation (a wait on an event
 *                    recorded in it); printed: the fork's capture status
 *                    and the end's answer, as the fake models them
 *   fork-destroyed   ... and is destroyed while in it; printed: whether the
 *                    driver allows that, and what the end answers then
 *   capture-misuse   (no early-reuse check) what the programming guide
 *                    prohibits during a capture, on the real driver: each
 *                    answer and the capture's status after it printed and
 *                    checked against the fake's reading (querying or
 *                    synchronising the capturing stream, querying a
 *                    captured event, waiting on a non-captured event with
 *                    and without cudaEventWaitExternal; and on the legacy
 *                    stream while a blocking stream captures, a
 *                    stream-ordered allocation, a pooled block's free and
 *                    an event record: refused, the capture invalidated)
 *   reset            cudaDeviceReset with streams alive, then enough
 *                    allocations and frees to need the frees retired
 *   first-malloc     cudaMalloc is the program's first runtime call; then an
 *                    IPC handle of the pooled block must still be refused
 *   ptr-attr         cuPointerGetAttribute's range of a pooled block agrees
 *                    with cuMemGetAddressRange (the block, not the region);
 *                    its context is the current one and it is not legacy-IPC
 *                    capable (the shim refuses the handle); cuMemRetainAllocationHandle
 *                    of it is refused (CUDA_ERROR_INVALID_VALUE)
 *   destroy-primary  cuCtxDestroy on the primary context: the driver's answer
 *                    printed; refused, the pool and its blocks stay
 *   detach           cuCtxDetach, the usage-count release: one that only
 *                    counts down must leave the pool alive and its block
 *                    intact, and one that destroys a context pushed twice
 *                    must take the pool with it; nor may a detach of a
 *                    context not current (the rule) cost it its pool, if
 *                    the driver takes one. Printed, what the shim
 *                    assumes: a count-down leaves the context current; the
 *                    destroyed context stays current beneath, and
 *                    cuCtxGetId of it answers CUDA_ERROR_CONTEXT_IS_DESTROYED
 *   vmm-ptr-attr     what the driver answers for a mapped and a reserved
 *                    address of the virtual memory API, printed (the fake
 *                    answers as it reads cuda.h; this checks it), and
 *                    cuMemGetAddressRange's range: the mapping's
 *   vmm-retain       cuMemRetainAllocationHandle as the fake models it
 *                    (e2e_vmm retain): the handle that mapped an address;
 *                    unmapped, its memory stays and maps elsewhere with its
 *                    contents. Printed: microseconds per granule to move
 *                    memory that way against unmapping it and making new
 *                    (what the pool did under pressure before it kept them),
 *                    and moved with one access call over the run (the shim)
 *   pressure         (BFCSHIM_VMM=on, preallocated, a 64 MiB limit) a full
 *                    pool with holes; a block that fits none moves free
 *                    granules under it: the moved block and the blocks
 *                    around it keep what kernels wrote, and the stats say
 *                    what moved (e2e_vmm_pool moves on the real driver)
 *
 *   plugin           the library opened as the Python plug-ins open it
 *                    without LD_PRELOAD (it sees no stream of the program):
 *                    the late kernel runs on the program's non-blocking
 *                    stream, the block is freed with bfcshim_free
 *
 * Another thread's capture (the fake's e2e_fences global-capture and
 * ptsz-capture, on the real driver): while a second thread captures in
 * global mode, this thread frees a block under late work and allocates;
 * whatever the shim asks the driver on its behalf must leave the capture
 * valid, and the late kernel must not write into a block handed out again.
 *   global-capture   the capture is on a non-blocking stream of its own
 *   ptds-capture     the capture is on the thread's per-thread default stream
 *
 * Green contexts (driver API): the late kernel runs on a stream of a green
 * context (cuGreenCtxStreamCreate) with the device's primary context current
 * for the runtime, and is freed with cudaFree:
 *   green-stream     the late kernel's block must not be handed out while it
 *                    runs. Printed beside it, what the fake assumes: whether
 *                    cuEventRecord takes an event of the primary context on
 *                    the green stream (the fake refuses it), what
 *                    cuStreamGetCtx answers for it, whether an allocation
 *                    made with the green context current comes from the
 *                    same pool (no second pool), and whether a
 *                    cuGreenCtxRecordEvent made after a stream is destroyed
 *                    still waits for that stream's kernel (the fake says no).
 *                    Checked: a cuCtxSynchronize of the primary context
 *                    waits for the green stream's kernel (cuda.h)
 *
 * The current context, remembered (shim/lib/current_context.c), against the
 * real cudart:
 *   contexts     after each way of changing the current context (a created
 *                context pushed, cudaSetDevice, push and pop, cudaDeviceReset,
 *                a new thread, the created context destroyed) a cudaMalloc
 *                must come from the pool of the context the driver says is
 *                current. Every scenario also runs under
 *                BFCSHIM_CONTEXT_CACHE=check (meson.build) and fails if a
 *                remembered answer was ever wrong (a change through cudart's
 *                private tables, which no hook sees)
 *
 * Legacy-stream frees as legacy-stream actions (docs/design.md, "Stream-
 * ordered frees"):
 *   legacy-order  a late kernel on this thread's per-thread stream writes a
 *                 block, which is freed stream-ordered on the legacy stream;
 *                 another thread allocates on the legacy stream and writes
 *                 its block on its own per-thread stream. CUDA orders that
 *                 write after the late one (the free waits for every
 *                 blocking stream, the new work for the legacy stream), so
 *                 the block must end with the new owner's pattern. Run with
 *                 a non-blocking stream made first, so that the pool is not
 *                 ordered and the block comes back at once, behind the
 *                 shim's legacy-stream wait on an event already complete
 *                 (whether that is an action on the real driver is what this
 *                 asks; printed: whether the block was reused)
 *
 * Random programs (tests/e2e/e2e_race.c on the real driver):
 *   race         plain and stream-ordered allocations and frees, both doors,
 *                on the legacy, per-thread and created streams; blocks handed
 *                between streams behind events (or, between the legacy stream
 *                and a blocking one, behind its implicit synchronisation
 *                alone); streams destroyed with work
 *                queued. Every kernel first waits a random while (so queues
 *                build up), then checks that its block still holds the
 *                block's tag (one word per 256 bytes) and writes it again:
 *                a kernel that finds another block's tag ran after the
 *                memory was handed out while it was queued.
 *
 * Facts the fake must follow, read off the real driver (printed, and checked
 * only where the outcome is certain):
 *   reset-running    cudaDeviceReset while a kernel still writes a pooled
 *                    block: does the reset wait for it, does anything fault,
 *                    and does the next context work (with a VMM pool, the
 *                    shim gives the granules back around the real reset)
 *   unmap-running    cuMemUnmap of a mapping a running kernel writes (no
 *                    pool involved): does the unmap wait, does the kernel
 *                    fault (the fake assumes it does not wait)
 *   legacy-record    a record on the legacy stream after a late kernel on
 *                    one blocking stream, then a kernel on another blocking
 *                    stream: does that kernel wait for the late one? The
 *                    fake's answer is no (a record is no action there, the
 *                    stricter reading: the ordered pool's barrier records
 *                    and waits); a yes would let the barrier drop its wait
 *   attributes       every cuDeviceGetAttribute answer of device 0, to set
 *                    beside the fake's table (fake_driver.c, h100_attributes)
 *   pool-attributes  the default pool's figures under the shim (its pool
 *                    counted); a created pool's, from the real driver: used
 *                    and reserved after a free, before and after a sync
 *                    (fake_driver.c, "what memory pools hold")
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../shim_stats.h"

static int failures;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                          \
        }                                                                        \
    } while (0)
#define CUDA_OK(call) CHECK((call) == cudaSuccess)

__global__ void fill(unsigned *p, size_t n, unsigned pattern, unsigned spin)
{
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        unsigned v = pattern ^ (unsigned)i;
        for (unsigned k = 0; k < spin; k++) /* keeps the stream busy for a while */
            v = v * 1664525u + 1013904223u, v = (v - 1013904223u) * 4276115653u;
        p[i] = v;
    }
}

__global__ void verify(const unsigned *p, size_t n, unsigned pattern, unsigned long long *bad)
{
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        if (p[i] != (pattern ^ (unsigned)i))
            atomicAdd(bad, 1ull);
}

/* Waits `ns` nanoseconds of GPU time, then writes the pattern: a kernel that
 * is certainly still running when the host frees its block. */
__global__ void late_fill(unsigned *p, size_t n, unsigned pattern, unsigned long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - t0 < ns);
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = pattern ^ (unsigned)i;
}

/* Is there a GPU? Asked through the driver alone when the scenario needs
 * the runtime untouched (first-malloc), else as programs usually do. */
static bool gpu_present(bool runtime_may_start)
{
    int n = 0;
    if (runtime_may_start)
        return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        return false;
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
    CUresult (*count)(int *) = (CUresult(*)(int *))dlsym(h, "cuDeviceGetCount");
    return init && count && init(0) == CUDA_SUCCESS && count(&n) == CUDA_SUCCESS && n > 0;
}

static void warm_up_kernels(void)
{
    unsigned *w = NULL;
    unsigned long long *bad = NULL;
    CUDA_OK(cudaMalloc((void **)&w, 4096));
    CUDA_OK(cudaMalloc((void **)&bad, sizeof *bad));
    fill<<<1, 32>>>(w, 1024, 1u, 0);
    verify<<<1, 32>>>(w, 1024, 1u, bad);
    late_fill<<<1, 32>>>(w, 1024, 1u, 0);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaFree(w));
    CUDA_OK(cudaFree(bad));
}

static bool under_shim(void)
{
    return dlsym(RTLD_DEFAULT, "bfcshim_write_stats") != NULL;
}

enum { NSTREAMS = 4, ROUNDS = 300 };

static void reuse(bool async)
{
    cudaStream_t s[NSTREAMS] = {0};
    for (int i = 0; i < NSTREAMS; i++)
        CUDA_OK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
    if (failures)
        return;
    unsigned long long *bad;
    CUDA_OK(cudaMalloc(&bad, sizeof *bad));
    CUDA_OK(cudaMemset(bad, 0, sizeof *bad));
    CUDA_OK(cudaDeviceSynchronize());
    unsigned rng = 12345;
    for (int r = 0; r < ROUNDS; r++) {
        int k = r % NSTREAMS;
        rng = rng * 1103515245u + 12345u;
        size_t n = ((size_t)(rng >> 8) % (4u << 20)) / 4 + 1024; /* up to 4 MiB */
        unsigned *p = NULL;
        cudaError_t e = async ? cudaMallocAsync((void **)&p, n * 4, s[k])
                              : cudaMalloc((void **)&p, n * 4);
        CHECK(e == cudaSuccess);
        if (e != cudaSuccess)
            break;
        unsigned pattern = 0x9e3779b9u * (unsigned)(r + 1);
        fill<<<64, 256, 0, s[k]>>>(p, n, pattern, 64);
        verify<<<64, 256, 0, s[k]>>>(p, n, pattern, bad);
        /* Freed while the kernels may still run: the shim must not hand the
         * block to another stream before they finish. */
        CUDA_OK(async ? cudaFreeAsync(p, s[k]) : cudaFree(p));
    }
    CUDA_OK(cudaDeviceSynchronize());
    unsigned long long h = 0;
    CUDA_OK(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h == 0);
    if (h)
        fprintf(stderr, "%llu corrupted words\n", h);
    CUDA_OK(cudaFree(bad));
    for (int i = 0; i < NSTREAMS; i++)
        CUDA_OK(cudaStreamDestroy(s[i]));
}

static void reuse_plain(void) { reuse(false); }
static void reuse_async(void) { reuse(true); }

static void capture(void)
{
    cudaStream_t s = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (failures)
        return;
    unsigned long long *bad;
    CUDA_OK(cudaMalloc(&bad, sizeof *bad));
    CUDA_OK(cudaMemset(bad, 0, sizeof *bad));
    CUDA_OK(cudaDeviceSynchronize());
    cudaGraph_t g;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    unsigned *p = NULL;
    CUDA_OK(cudaMallocAsync((void **)&p, 1 << 20, s)); /* the graph owns it */
    fill<<<64, 256, 0, s>>>(p, (1 << 20) / 4, 7u, 8);
    verify<<<64, 256, 0, s>>>(p, (1 << 20) / 4, 7u, bad);
    CUDA_OK(cudaFreeAsync(p, s));
    /* Meanwhile, plain allocations and frees (relaxed mode allows them). */
    for (int i = 0; i < 8; i++) {
        void *q = NULL;
        CUDA_OK(cudaMalloc(&q, 1 << 20));
        CUDA_OK(cudaFree(q));
    }
    CUDA_OK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t x;
    CUDA_OK(cudaGraphInstantiate(&x, g, 0));
    for (int i = 0; i < 3; i++)
        CUDA_OK(cudaGraphLaunch(x, s));
    CUDA_OK(cudaStreamSynchronize(s));
    unsigned long long h = 1;
    CUDA_OK(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h == 0);
    CUDA_OK(cudaGraphExecDestroy(x));
    CUDA_OK(cudaGraphDestroy(g));
    CUDA_OK(cudaFree(bad));
    CUDA_OK(cudaStreamDestroy(s));
}

static void oom(void)
{
    size_t f = 0, t = 0;
    CUDA_OK(cudaMemGetInfo(&f, &t));
    void *big = NULL, *more = NULL;
    /* More than the pool can give: refused with the runtime's error. */
    CHECK(cudaMalloc(&more, f + (64u << 20)) == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaSuccess);
    /* Fill it, fail, free, succeed. */
    CUDA_OK(cudaMalloc(&big, f - (256u << 20)));
    CHECK(cudaMalloc(&more, 512u << 20) == cudaErrorMemoryAllocation);
    cudaGetLastError();
    CUDA_OK(cudaFree(big));
    CUDA_OK(cudaMalloc(&more, 512u << 20));
    CUDA_OK(cudaFree(more));
}

static void ipc(void)
{
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, 1 << 20));
    cudaIpcMemHandle_t h;
    CHECK(cudaIpcGetMemHandle(&h, p) == cudaErrorNotSupported);
    cudaGetLastError();
    CUDA_OK(cudaFree(p));
}

/* The last error of a refused call, on the real cudart (docs/design.md,
 * the runtime door: fail() has the runtime record the code it returns by a
 * call that answers it: cudaEventQuery(NULL) for an invalid resource
 * handle). Printed: what cudaEventQuery(NULL) answers (the fake:
 * cudaErrorInvalidResourceHandle). Checked: a cudaFreeAsync of a pooled
 * block on a destroyed stream is refused with that code, the last error
 * says the same, and the block stays the program's. Also an IPC handle of
 * a freed pooled block: invalid value, and the last error says so. */
static unsigned long long count_bad_n(unsigned *q, size_t n, unsigned pattern);

static void last_error(void)
{
    cudaGetLastError();
    cudaError_t q = cudaEventQuery(NULL);
    printf("  cudaEventQuery(NULL): %d (the fake: %d)\n", (int)q,
           (int)cudaErrorInvalidResourceHandle);
    cudaGetLastError();
    cudaStream_t s = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamDestroy(s));
    unsigned *p = NULL;
    CUDA_OK(cudaMalloc((void **)&p, 1 << 20));
    CHECK(cudaFreeAsync(p, s) == cudaErrorInvalidResourceHandle);
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
    fill<<<64, 256>>>(p, (1 << 20) / 4, 13u, 0); /* still the program's */
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(count_bad_n(p, (1 << 20) / 4, 13u) == 0);
    CUDA_OK(cudaFree(p));
    cudaIpcMemHandle_t h;
    CHECK(cudaIpcGetMemHandle(&h, p) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
}

static void meminfo(void)
{
    size_t f0 = 0, t = 0, f1 = 0;
    CUDA_OK(cudaMemGetInfo(&f0, &t));
    CHECK(f0 <= (size_t)(0.75 * (double)t) + (2u << 20)); /* the default fraction */
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, 256u << 20));
    CUDA_OK(cudaMemGetInfo(&f1, &t));
    CHECK(f0 - f1 == (256u << 20));
    CUDA_OK(cudaFree(p));
}


/* ---- early reuse on the real driver ------------------------------------------ */

enum { HOLE = 64u << 20 };
static const unsigned long long LATE_NS = 300ull * 1000 * 1000; /* 300 ms */

/* Takes all the pool can give but one HOLE-sized hole, so the next HOLE
 * allocation after the hole is freed can only land in it. Returns the
 * filler (free it at the end) and the block in the hole. */
static void *fill_pool_but_hole(unsigned **hole)
{
    size_t f = 0, t = 0;
    CUDA_OK(cudaMemGetInfo(&f, &t));
    void *filler = NULL;
    *hole = NULL;
    CUDA_OK(cudaMalloc((void **)hole, HOLE));
    /* Leave less than a HOLE of slack, so a second HOLE cannot fit elsewhere. */
    size_t take = f > 2 * (size_t)HOLE ? f - HOLE - HOLE / 2 : 0;
    if (take)
        CUDA_OK(cudaMalloc(&filler, take));
    return filler;
}

/* Counts the n words of q that do not hold `pattern`. */
static unsigned long long count_bad_n(unsigned *q, size_t n, unsigned pattern)
{
    unsigned long long *bad = NULL, h = ~0ull;
    CUDA_OK(cudaMalloc((void **)&bad, sizeof *bad));
    CUDA_OK(cudaMemset(bad, 0, sizeof *bad));
    verify<<<256, 256>>>(q, n, pattern, bad);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaFree(bad));
    return h;
}

static unsigned long long count_bad(unsigned *q, unsigned pattern)
{
    return count_bad_n(q, HOLE / 4, pattern);
}

/* q was allocated after p was freed under late work; `running` says whether
 * the late kernel was still running when q was handed out. The freed block
 * must not be handed out while it runs (the shim must wait for it, or give
 * another block), and q must keep the pattern its own owner writes. */
static void expect_intact(unsigned *p, unsigned *q, cudaStream_t s2, bool running)
{
    const unsigned mine = 0xb1e55edu;
    printf("  new block %s the freed one; the late kernel was %s when it was handed out\n",
           q == p ? "is" : "is not", running ? "still running" : "done");
    CHECK(!(q == p && running));
    fill<<<256, 256, 0, s2>>>(q, HOLE / 4, mine, 0);
    CUDA_OK(cudaStreamSynchronize(s2));
    CUDA_OK(cudaDeviceSynchronize()); /* the late kernel has run by now */
    unsigned long long bad = count_bad(q, mine);
    printf("  %llu word(s) of the new block overwritten by the late kernel\n", bad);
    CHECK(bad == 0);
}

/* What happens to the late kernel's stream s1 between the free of its
 * block and the next allocation. */
typedef enum late_twist {
    DESTROY_BEFORE_FREE,   /* s1 destroyed (returns at once, the kernel goes on) */
    CAPTURE_BEFORE_ALLOC,  /* s1 begins capturing after the free */
    FORK_BEFORE_ALLOC,     /* s1 joins another stream's capture (a fork) */
    FORK_DESTROYED,        /* ... and is destroyed while in it */
} late_twist;

/* A capture begun on a stream of its own, s1 forked into it by a wait on
 * an event recorded there (what multi-stream graph capture and NCCL do).
 * Printed: what the driver says of the fork, which the fake models from the
 * programming guide (tests/fake_cuda, "capture"). */
static cudaStream_t fork_into_capture(cudaStream_t s1, cudaEvent_t *fork)
{
    cudaStream_t origin = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamBeginCapture(origin, cudaStreamCaptureModeRelaxed));
    CUDA_OK(cudaEventCreateWithFlags(fork, cudaEventDisableTiming));
    CUDA_OK(cudaEventRecord(*fork, origin));
    CUDA_OK(cudaStreamWaitEvent(s1, *fork, 0));
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone, ost = cudaStreamCaptureStatusNone;
    CUDA_OK(cudaStreamIsCapturing(s1, &st));
    printf("  the fork's capture status: %d (1: active)\n", (int)st);
    CHECK(st == cudaStreamCaptureStatusActive);
    /* The shim counts a fork under its capture sequence's id and takes it
     * away with that sequence's end (capture.c): the fake gives a fork its
     * origin's id; the driver must too. */
    unsigned long long origin_id = 0, fork_id = 0;
    CUDA_OK(cudaStreamGetCaptureInfo(origin, &ost, &origin_id));
    CUDA_OK(cudaStreamGetCaptureInfo(s1, &st, &fork_id));
    printf("  capture ids: origin %llu, fork %llu (must be one)\n", origin_id, fork_id);
    CHECK(origin_id != 0 && origin_id == fork_id);
    return origin;
}

/* Joins s1 back (unless it is gone) and ends the capture; prints what the
 * end answers, which must be success after a fork joined back in the
 * ordinary way (not after the fork was destroyed in it: what a real driver
 * does then is what the scenario finds out). */
static void end_forked_capture(cudaStream_t origin, cudaStream_t s1, bool ordinary)
{
    cudaEvent_t join = NULL;
    if (s1) {
        CUDA_OK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
        CUDA_OK(cudaEventRecord(join, s1));
        CUDA_OK(cudaStreamWaitEvent(origin, join, 0));
    }
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(origin, &g);
    printf("  the capture's end: %s (%d)%s\n", cudaGetErrorName(e), (int)e,
           s1 ? "" : ", its fork destroyed in it");
    cudaGetLastError();
    if (ordinary)
        CHECK(e == cudaSuccess);
    if (g)
        CUDA_OK(cudaGraphDestroy(g));
    if (join)
        CUDA_OK(cudaEventDestroy(join));
    CUDA_OK(cudaStreamDestroy(origin));
}

/* Two non-blocking streams; on the first, a kernel that writes the HOLE
 * block p late, and the event that says when it is done (NULL when
 * something failed). */
static cudaEvent_t start_late_kernel(unsigned *p, cudaStream_t *s1, cudaStream_t *s2)
{
    CUDA_OK(cudaStreamCreateWithFlags(s1, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(s2, cudaStreamNonBlocking));
    if (failures)
        return NULL;
    late_fill<<<256, 256, 0, *s1>>>(p, HOLE / 4, 0xdeadu, LATE_NS);
    CUDA_OK(cudaGetLastError());
    cudaEvent_t late_done = NULL;
    CUDA_OK(cudaEventCreateWithFlags(&late_done, cudaEventDisableTiming));
    CUDA_OK(cudaEventRecord(late_done, *s1));
    return late_done;
}

/* A kernel queued on s1 writes p late; p is freed meanwhile and the pool,
 * full but for p's hole, is asked for HOLE bytes again. */
static void late_reuse(late_twist twist)
{
    unsigned *p = NULL, *q = NULL;
    void *filler = fill_pool_but_hole(&p);
    cudaStream_t s1 = NULL, s2 = NULL;
    cudaEvent_t late_done = start_late_kernel(p, &s1, &s2);
    if (!late_done)
        return;
    if (twist == DESTROY_BEFORE_FREE) {
        /* "the function will return immediately and the resources
         * associated with hStream will be released automatically once the
         * device has completed all work in hStream" (cuStreamDestroy) */
        CUDA_OK(cudaStreamDestroy(s1));
        s1 = NULL;
    }
    CUDA_OK(cudaFree(p));
    if (twist == CAPTURE_BEFORE_ALLOC) /* only what follows is captured */
        CUDA_OK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeRelaxed));
    cudaStream_t origin = NULL;
    cudaEvent_t fork = NULL;
    if (twist == FORK_BEFORE_ALLOC || twist == FORK_DESTROYED)
        origin = fork_into_capture(s1, &fork);
    if (twist == FORK_DESTROYED) {
        cudaError_t e = cudaStreamDestroy(s1);
        printf("  destroying the fork in the capture: %s (%d)\n", cudaGetErrorName(e), (int)e);
        cudaGetLastError();
        if (e == cudaSuccess)
            s1 = NULL;
    }
    /* Allowed in relaxed mode; the pool may be full but for the hole while
     * a fork holds it back (out of memory then, retried after the end). */
    cudaError_t got = cudaMalloc((void **)&q, HOLE);
    bool running = cudaEventQuery(late_done) == cudaErrorNotReady;
    cudaGetLastError();
    if (twist == CAPTURE_BEFORE_ALLOC) {
        cudaGraph_t g = NULL;
        CUDA_OK(cudaStreamEndCapture(s1, &g));
        if (g)
            CUDA_OK(cudaGraphDestroy(g));
    }
    if (origin) {
        printf("  during the capture: %s\n", got == cudaSuccess ? "served" : "out of memory");
        end_forked_capture(origin, s1, twist == FORK_BEFORE_ALLOC);
        CUDA_OK(cudaEventDestroy(fork));
        if (got != cudaSuccess) {
            CUDA_OK(cudaMalloc((void **)&q, HOLE));
            running = cudaEventQuery(late_done) == cudaErrorNotReady;
            cudaGetLastError();
        }
    } else {
        CUDA_OK(got);
    }
    if (q)
        expect_intact(p, q, s2, running);
    CUDA_OK(cudaEventDestroy(late_done));
    CUDA_OK(cudaFree(q));
    CUDA_OK(cudaFree(filler));
    if (s1)
        CUDA_OK(cudaStreamDestroy(s1));
    CUDA_OK(cudaStreamDestroy(s2));
}

/* plugin: the library as the Python plug-ins load it without LD_PRELOAD
 * (dlopen, RTLD_LOCAL, from LIBBFCSHIM), so it sees none of the program's
 * streams. A kernel on a non-blocking stream of the program's still writes
 * a pooled block late when bfcshim_free (the Numba plug-in's free) frees
 * it; the next allocation of its size must not get it while that kernel
 * runs. Printed: the context synchronisations that cost.
 * Owed here: bfcshim_torch_record_stream on the real driver (a block freed
 * on stream A after a record on stream B whose kernel still reads it must
 * not be handed out under that kernel; checked on the fake driver by
 * e2e_api torch-record-stream), and a record_stream through a real
 * PyTorch's set_record_stream_fn. */
static void plugin(void)
{
    const char *path = getenv("LIBBFCSHIM");
    void *lib = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    CHECK(lib != NULL);
    if (!lib)
        return;
    int (*bmalloc)(void **, size_t, int) = (int (*)(void **, size_t, int))dlsym(lib, "bfcshim_malloc");
    int (*bfree)(void *) = (int (*)(void *))dlsym(lib, "bfcshim_free");
    int (*binfo)(int, size_t *, size_t *) =
        (int (*)(int, size_t *, size_t *))dlsym(lib, "bfcshim_mem_get_info");
    size_t (*bstats)(char *, size_t) = (size_t (*)(char *, size_t))dlsym(lib, "bfcshim_stats_json");
    CHECK(bmalloc && bfree && binfo && bstats);
    if (!bmalloc || !bfree || !binfo || !bstats)
        return;
    int dev = 0;
    CUDA_OK(cudaGetDevice(&dev));
    size_t f = 0, t = 0;
    unsigned *p = NULL, *q = NULL;
    void *filler = NULL;
    CHECK(bmalloc((void **)&p, HOLE, dev) == 0);
    CHECK(binfo(dev, &f, &t) == 0);
    if (f > 2 * (size_t)HOLE)
        CHECK(bmalloc(&filler, f - HOLE - HOLE / 2, dev) == 0);
    cudaStream_t s1 = NULL, s2 = NULL;
    cudaEvent_t late_done = start_late_kernel(p, &s1, &s2);
    if (!late_done)
        return;
    CHECK(bfree(p) == 0);
    CHECK(bmalloc((void **)&q, HOLE, dev) == 0);
    bool running = cudaEventQuery(late_done) == cudaErrorNotReady;
    cudaGetLastError();
    if (q)
        expect_intact(p, q, s2, running);
    static char doc[1 << 16];
    bstats(doc, sizeof doc);
    printf("  %lld context synchronisation(s) for plain frees\n",
           shim_stats_field(doc, "num_context_syncs"));
    CUDA_OK(cudaEventDestroy(late_done));
    CHECK(bfree(q) == 0);
    CHECK(bfree(filler) == 0);
    CUDA_OK(cudaStreamDestroy(s1));
    CUDA_OK(cudaStreamDestroy(s2));
}

static void stream_destroy(void) { late_reuse(DESTROY_BEFORE_FREE); }
static void capture_pending(void) { late_reuse(CAPTURE_BEFORE_ALLOC); }
static void capture_fork(void) { late_reuse(FORK_BEFORE_ALLOC); }
static void fork_destroyed(void) { late_reuse(FORK_DESTROYED); }

/* One prohibited call in a capture of its own on s: the driver's answer
 * and the capture's status after it, printed beside the fake's reading
 * (tests/fake_cuda, "capture"; e2e_fake_rules fake-capture-misuse), which
 * the checks hold the driver to. */
static void misuse_once(const char *what, cudaStream_t s, cudaError_t expected,
                        cudaError_t (*call)(cudaStream_t, void *), void *arg)
{
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    cudaError_t e = call(s, arg);
    cudaGetLastError();
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaError_t se = cudaStreamIsCapturing(s, &st);
    /* cuda.h promises an id only while the capture is active: printed,
     * whether the driver gives one for an invalidated capture (the shim
     * does not count on it; the fake writes none). */
    cudaStreamCaptureStatus ist = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    cudaError_t ie = cudaStreamGetCaptureInfo(s, &ist, &id);
    cudaGraph_t g = NULL;
    cudaError_t end = cudaStreamEndCapture(s, &g);
    cudaGetLastError();
    printf("  %s: %s (%d); then capturing %s %d, capture info %s %d id %llu, end %s (%d)\n",
           what, cudaGetErrorName(e), (int)e, cudaGetErrorName(se), (int)st,
           cudaGetErrorName(ie), (int)ist, id, cudaGetErrorName(end), (int)end);
    CHECK(e == expected);
    CHECK(st == cudaStreamCaptureStatusInvalidated);
    CHECK(end == cudaErrorStreamCaptureInvalidated && g == NULL);
    if (g)
        cudaGraphDestroy(g);
}

static cudaError_t query_stream(cudaStream_t s, void *) { return cudaStreamQuery(s); }
static cudaError_t sync_stream(cudaStream_t s, void *) { return cudaStreamSynchronize(s); }
static cudaError_t query_captured(cudaStream_t s, void *ev)
{
    cudaEventRecord((cudaEvent_t)ev, s);
    return cudaEventQuery((cudaEvent_t)ev);
}
static cudaError_t wait_queued(cudaStream_t s, void *ev)
{
    return cudaStreamWaitEvent(s, (cudaEvent_t)ev, 0);
}

/* Stream-ordered work on the legacy stream while a blocking stream
 * captures (s is that stream; the legacy stream joins it): an allocation
 * (passed through to the driver), a pooled block's free (the shim answers
 * by recording an event there, so that the driver refuses and invalidates
 * the capture as the free would: shim/lib/service.c, refused_stream_free),
 * and that event record itself. */
static cudaError_t alloc_on_legacy(cudaStream_t, void *)
{
    void *p = NULL;
    cudaError_t e = cudaMallocAsync(&p, 1 << 20, 0);
    if (e == cudaSuccess)
        fprintf(stderr, "capture-misuse: cudaMallocAsync on the legacy stream was served\n");
    return e;
}
static cudaError_t free_on_legacy(cudaStream_t, void *p) { return cudaFreeAsync(p, 0); }
static cudaError_t record_on_legacy(cudaStream_t, void *ev)
{
    return cudaEventRecord((cudaEvent_t)ev, 0);
}

/* What the programming guide prohibits during a capture ("Prohibited and
 * Unhandled Operations"), on the real driver: the fake refuses each and
 * invalidates the capture, in relaxed mode too; the shim must never make
 * such a call on the program's behalf. */
static void capture_misuse(void)
{
    cudaStream_t s = NULL, other = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    cudaEvent_t captured = NULL, queued = NULL;
    CUDA_OK(cudaEventCreateWithFlags(&captured, cudaEventDisableTiming));
    CUDA_OK(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming));
    CUDA_OK(cudaEventRecord(queued, other));
    misuse_once("cudaStreamQuery of the capturing stream", s, cudaErrorStreamCaptureUnsupported,
                query_stream, NULL);
    misuse_once("cudaStreamSynchronize of it", s, cudaErrorStreamCaptureUnsupported, sync_stream,
                NULL);
    misuse_once("cudaEventQuery of an event recorded in it", s, cudaErrorCapturedEvent,
                query_captured, captured);
    misuse_once("a wait on an event recorded outside it", s, cudaErrorStreamCaptureIsolation,
                wait_queued, queued);
    cudaStream_t blocking = NULL;
    CUDA_OK(cudaStreamCreate(&blocking));
    void *keep = NULL;
    CUDA_OK(cudaMalloc(&keep, 1 << 20));
    misuse_once("cudaMallocAsync on the legacy stream while a blocking stream captures", blocking,
                cudaErrorStreamCaptureImplicit, alloc_on_legacy, NULL);
    misuse_once("cudaFreeAsync of a pooled block there", blocking,
                cudaErrorStreamCaptureImplicit, free_on_legacy, keep);
    misuse_once("cudaEventRecord there", blocking, cudaErrorStreamCaptureImplicit,
                record_on_legacy, queued);
    CUDA_OK(cudaFree(keep)); /* refused above: still the program's */
    CUDA_OK(cudaStreamDestroy(blocking));
    /* With cudaEventWaitExternal the wait is a node, the capture valid. */
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    cudaError_t e = cudaStreamWaitEvent(s, queued, cudaEventWaitExternal);
    cudaGraph_t g = NULL;
    cudaError_t end = cudaStreamEndCapture(s, &g);
    printf("  the same wait with cudaEventWaitExternal: %s (%d), end %s (%d)\n",
           cudaGetErrorName(e), (int)e, cudaGetErrorName(end), (int)end);
    CHECK(e == cudaSuccess && end == cudaSuccess && g != NULL);
    if (g)
        cudaGraphDestroy(g);
    cudaGetLastError();
    CUDA_OK(cudaEventDestroy(captured));
    CUDA_OK(cudaEventDestroy(queued));
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaStreamDestroy(other));
}

static void reset(void)
{
    cudaStream_t s[4] = {0};
    for (int i = 0; i < 4; i++) {
        CUDA_OK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
        void *p = NULL;
        CUDA_OK(cudaMallocAsync(&p, 1 << 20, s[i]));
        CUDA_OK(cudaFreeAsync(p, s[i]));
    }
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, 1 << 20));
    CUDA_OK(cudaFree(p));
    CUDA_OK(cudaDeviceSynchronize());
    /* The streams die with the context; a new primary context (and pool)
     * follows at the next call, possibly under the same handle value. */
    CUDA_OK(cudaDeviceReset());
    size_t f = 0, t = 0;
    CUDA_OK(cudaMemGetInfo(&f, &t));
    size_t big = f / 3 & ~(size_t)0xfffff;
    /* Ten times what the pool can hold at once: only works if frees retire. */
    int ok = 0;
    for (int i = 0; i < 30; i++) {
        void *q = NULL;
        cudaError_t e = cudaMalloc(&q, big);
        if (e != cudaSuccess) {
            fprintf(stderr, "reset: allocation %d of %zu bytes failed (%d)\n", i, big, (int)e);
            cudaGetLastError();
            break;
        }
        fill<<<64, 256>>>((unsigned *)q, big / 4, (unsigned)i, 0);
        CUDA_OK(cudaFree(q));
        ok++;
    }
    CHECK(ok == 30);
    CUDA_OK(cudaDeviceSynchronize());
}

/* The driver's entry points, looked up the way programs do (through the
 * shim's dlsym, which hands out its own where it has one). */
static void *driver_fn(const char *name)
{
    static void *h;
    if (!h)
        h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    return h ? dlsym(h, name) : NULL;
}

static void first_malloc(void)
{
    /* main made no runtime call for this scenario: this is the first. */
    unsigned *p = NULL;
    CUDA_OK(cudaMalloc((void **)&p, 1 << 20));
    fill<<<64, 256>>>(p, (1 << 20) / 4, 5u, 0);
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(count_bad_n(p, (1 << 20) / 4, 5u) == 0);
    cudaIpcMemHandle_t h;
    cudaError_t e = cudaIpcGetMemHandle(&h, p);
    printf("  cudaIpcGetMemHandle of a pooled block: %d (%s)\n", (int)e, cudaGetErrorName(e));
    CHECK(e == cudaErrorNotSupported);
    cudaGetLastError();
    CUDA_OK(cudaFree(p));
}

/* cuCtxDestroy on the primary context: what the driver answers (the fake
 * refuses it with CUDA_ERROR_INVALID_CONTEXT), and the pool must stay with
 * the context as long as the context lives: a block made before still holds
 * its pattern, and one made after comes from the same pool. */
static void destroy_primary(void)
{
    auto retain = (decltype(&cuDevicePrimaryCtxRetain))driver_fn("cuDevicePrimaryCtxRetain");
    auto release = (decltype(&cuDevicePrimaryCtxRelease))driver_fn("cuDevicePrimaryCtxRelease_v2");
    auto destroy = (decltype(&cuCtxDestroy))driver_fn("cuCtxDestroy_v2");
    auto stats = (size_t (*)(char *, size_t))dlsym(RTLD_DEFAULT, "bfcshim_stats_json");
    CHECK(retain && release && destroy && stats);
    if (!retain || !release || !destroy || !stats)
        return;
    unsigned *p = NULL, *q = NULL;
    CUDA_OK(cudaMalloc((void **)&p, 1 << 20));
    fill<<<64, 256>>>(p, (1 << 20) / 4, 9u, 0);
    CUDA_OK(cudaDeviceSynchronize());
    CUcontext primary = NULL;
    CHECK(retain(&primary, 0) == CUDA_SUCCESS);
    CUresult r = destroy(primary);
    printf("  cuCtxDestroy of the primary context: %d (the fake: %d)\n", (int)r,
           (int)CUDA_ERROR_INVALID_CONTEXT);
    if (r != CUDA_SUCCESS) {
        CHECK(count_bad_n(p, (1 << 20) / 4, 9u) == 0);
        CUDA_OK(cudaMalloc((void **)&q, 1 << 20));
        static char doc[1 << 16];
        stats(doc, sizeof doc);
        int alive = 0;
        for (const char *at = doc; (at = strstr(at, "\"alive\": true")); at++)
            alive++;
        printf("  pools alive after it: %d\n", alive);
        CHECK(alive == 1);
        CUDA_OK(cudaFree(q));
        CUDA_OK(cudaFree(p));
        CHECK(release(0) == CUDA_SUCCESS);
    }
}

/* Pools alive in the shim's statistics. */
static int pools_alive(void)
{
    static auto stats = (size_t (*)(char *, size_t))dlsym(RTLD_DEFAULT, "bfcshim_stats_json");
    static char doc[1 << 16];
    if (!stats || !stats(doc, sizeof doc))
        return -1;
    int alive = 0;
    for (const char *at = doc; (at = strstr(at, "\"alive\": true")); at++)
        alive++;
    return alive;
}

/* cuCtxDetach (the header). The shim decides whether a detach destroyed
 * from the current context afterwards (popped: gone) and, while it is still
 * current, from cuCtxGetId asked before and after (docs/design.md, the
 * driver door): both are readings of the fake's that only a real driver
 * can confirm. */
static void detach(void)
{
    typedef CUresult (*create_fn)(CUcontext *, unsigned, CUdevice);
    typedef CUresult (*attach_fn)(CUcontext *, unsigned);
    typedef CUresult (*ctx_fn)(CUcontext);
    typedef CUresult (*pop_fn)(CUcontext *);
    typedef CUresult (*id_fn)(CUcontext, unsigned long long *);
    auto create = (create_fn)driver_fn("cuCtxCreate_v2");
    auto attach = (attach_fn)driver_fn("cuCtxAttach");
    auto det = (ctx_fn)driver_fn("cuCtxDetach");
    auto push = (ctx_fn)driver_fn("cuCtxPushCurrent_v2");
    auto pop = (pop_fn)driver_fn("cuCtxPopCurrent_v2");
    auto current = (pop_fn)driver_fn("cuCtxGetCurrent");
    auto get_id = (id_fn)driver_fn("cuCtxGetId");
    CHECK(create && attach && det && push && pop && current && get_id);
    if (!create || !attach || !det || !push || !pop || !current || !get_id)
        return;
    CUDA_OK(cudaFree(0)); /* the primary context's pool is not the point */
    const int before = pools_alive();
    CUcontext c = NULL, a = NULL, cur = NULL;
    CHECK(create(&c, 0, 0) == CUDA_SUCCESS); /* made and pushed */
    unsigned *p = NULL;
    CUDA_OK(cudaMalloc((void **)&p, 1 << 20));
    fill<<<64, 256>>>(p, (1 << 20) / 4, 11u, 0);
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(pools_alive() == before + 1);
    CHECK(attach(&a, 0) == CUDA_SUCCESS && a == c); /* usage count 2 */
    CUresult r = det(c);                            /* 1: counts down */
    CHECK(current(&cur) == CUDA_SUCCESS);
    printf("  a detach that counts down: %d; the context %s current (the shim and the fake: "
           "stays)\n",
           (int)r, cur == c ? "stays" : "is no longer");
    CHECK(r == CUDA_SUCCESS);
    CHECK(pools_alive() == before + 1);
    if (cur != c)
        CHECK(push(c) == CUDA_SUCCESS);
    CHECK(count_bad_n(p, (1 << 20) / 4, 11u) == 0);
    CUDA_OK(cudaFree(p));
    /* Not current: cuda.h says it must be. A driver that counts it down
     * anyway must not cost it its pool (the shim asks its id then). */
    CHECK(attach(&a, 0) == CUDA_SUCCESS); /* 2 */
    CHECK(pop(&a) == CUDA_SUCCESS && a == c);
    r = det(c);
    printf("  a detach of a context not current: %d (the fake refuses it: %d)\n", (int)r,
           (int)CUDA_ERROR_INVALID_CONTEXT);
    CHECK(pools_alive() == before + 1);
    CHECK(push(c) == CUDA_SUCCESS);
    if (r != CUDA_SUCCESS)
        CHECK(det(c) == CUDA_SUCCESS); /* back to 1 */
    CHECK(push(c) == CUDA_SUCCESS); /* pushed twice */
    r = det(c);                     /* 0: destroys, pops one */
    cur = NULL;
    CUresult rc = current(&cur);
    unsigned long long id = 0;
    CUresult ri = get_id(c, &id);
    printf("  a destroying detach of a context pushed twice: %d; then the current context is "
           "%s (%d), cuCtxGetId of it answers %d (the fake: it, %d)\n",
           (int)r, cur == c ? "it" : "another", (int)rc, (int)ri,
           (int)CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CHECK(r == CUDA_SUCCESS);
    CHECK(pools_alive() == before);
    /* Off the stack (at most the two pushes). */
    for (int i = 0; i < 2 && cur == c; i++)
        if (pop(&a) != CUDA_SUCCESS || current(&cur) != CUDA_SUCCESS)
            break;
}

/* The driver's own answer (cuCtxGetCurrent is not interposed) against the
 * context of the pool a cudaMalloc came from (the shim's answer for its
 * blocks). */
static void allocates_in_current(const char *after)
{
    static auto current = (decltype(&cuCtxGetCurrent))driver_fn("cuCtxGetCurrent");
    static auto attr = (decltype(&cuPointerGetAttribute))driver_fn("cuPointerGetAttribute");
    void *p = NULL;
    CUcontext cur = NULL, owner = NULL;
    CUDA_OK(cudaMalloc(&p, 1 << 20));
    CHECK(current(&cur) == CUDA_SUCCESS);
    CHECK(attr(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, (CUdeviceptr)p) == CUDA_SUCCESS);
    CUDA_OK(cudaMemset(p, 7, 1 << 20));
    CUDA_OK(cudaDeviceSynchronize());
    if (owner != cur) {
        fprintf(stderr, "after %s: cudaMalloc served from %p's pool, %p is current\n", after,
                (void *)owner, (void *)cur);
        failures++;
    }
    CUDA_OK(cudaFree(p));
}

static void *new_thread_allocates(void *)
{
    allocates_in_current("a new thread's first call");
    return NULL;
}

static void contexts(void)
{
    auto create = (CUresult(*)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice))driver_fn(
        "cuCtxCreate_v4");
    auto destroy = (decltype(&cuCtxDestroy))driver_fn("cuCtxDestroy_v2");
    auto push = (decltype(&cuCtxPushCurrent))driver_fn("cuCtxPushCurrent_v2");
    auto pop = (decltype(&cuCtxPopCurrent))driver_fn("cuCtxPopCurrent_v2");
    CHECK(create && destroy && push && pop);
    if (!create || !destroy || !push || !pop)
        return;
    allocates_in_current("start");
    CUcontext made = NULL, popped = NULL;
    CHECK(create(&made, NULL, 0, 0) == CUDA_SUCCESS);
    allocates_in_current("cuCtxCreate");
    CUDA_OK(cudaSetDevice(0));
    allocates_in_current("cudaSetDevice(0) over a created context");
    CHECK(push(made) == CUDA_SUCCESS);
    allocates_in_current("cuCtxPushCurrent");
    CHECK(pop(&popped) == CUDA_SUCCESS);
    allocates_in_current("cuCtxPopCurrent");
    CHECK(push(made) == CUDA_SUCCESS);
    CUDA_OK(cudaDeviceReset());
    allocates_in_current("cudaDeviceReset with a created context current");
    CHECK(pop(&popped) == CUDA_SUCCESS);
    CUDA_OK(cudaDeviceReset());
    allocates_in_current("cudaDeviceReset");
    pthread_t t;
    pthread_create(&t, NULL, new_thread_allocates, NULL);
    pthread_join(t, NULL);
    CHECK(destroy(made) == CUDA_SUCCESS);
    allocates_in_current("cuCtxDestroy of a context not current");
    printf("  context lookups %lld, remembered answers found wrong %lld\n",
           shim_stat_number("context_lookups"), shim_stat_number("context_cache_wrong"));
}

static void ptr_attr(void)
{
    auto attr = (decltype(&cuPointerGetAttribute))driver_fn("cuPointerGetAttribute");
    auto range = (decltype(&cuMemGetAddressRange))driver_fn("cuMemGetAddressRange_v2");
    CHECK(attr && range);
    if (!attr || !range)
        return;
    void *a = NULL, *b = NULL;
    CUDA_OK(cudaMalloc(&a, 3u << 20));
    CUDA_OK(cudaMalloc(&b, 5u << 20));
    CUdeviceptr inside = (CUdeviceptr)(uintptr_t)b + 4096, base = 0, start = 0;
    size_t size = 0, rsize = 0;
    CHECK(range(&base, &size, inside) == CUDA_SUCCESS);
    CHECK(attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, inside) == CUDA_SUCCESS);
    CHECK(attr(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, inside) == CUDA_SUCCESS);
    printf("  cuMemGetAddressRange: 0x%llx + %zu; cuPointerGetAttribute: 0x%llx + %zu\n",
           (unsigned long long)base, size, (unsigned long long)start, rsize);
    CHECK(base == (CUdeviceptr)(uintptr_t)b);
    CHECK(start == base);
    CHECK(rsize == size);
    /* The pool's context (as for cudaMalloc memory) and no legacy IPC. */
    auto current = (decltype(&cuCtxGetCurrent))driver_fn("cuCtxGetCurrent");
    CUcontext ctx = NULL, cur = NULL;
    int ipc = -1;
    CHECK(current && current(&cur) == CUDA_SUCCESS);
    CHECK(attr(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, inside) == CUDA_SUCCESS);
    CHECK(attr(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, inside) == CUDA_SUCCESS);
    printf("  context %p (current %p), legacy IPC capable %d\n", (void *)ctx, (void *)cur, ipc);
    CHECK(ctx == cur);
    CHECK(ipc == 0);
    /* cudaMalloc memory has no allocation handle: the driver refuses
     * cuMemRetainAllocationHandle on it, and so does the shim for pooled
     * memory, whose granules it maps itself (printed: the answer). */
    auto retain = (decltype(&cuMemRetainAllocationHandle))driver_fn("cuMemRetainAllocationHandle");
    CHECK(retain != NULL);
    if (retain) {
        CUmemGenericAllocationHandle h = 0;
        CUresult rr = retain(&h, b);
        printf("  cuMemRetainAllocationHandle of cudaMalloc memory: %d\n", (int)rr);
        CHECK(rr == CUDA_ERROR_INVALID_VALUE);
        CUDA_OK(cudaMemset(b, 0, 5u << 20)); /* still mapped */
    }
    CUDA_OK(cudaFree(a));
    CUDA_OK(cudaFree(b));
}

/* The virtual memory API, looked up as programs do. */
typedef struct vmm_api {
    decltype(&cuMemAddressReserve) reserve;
    decltype(&cuMemCreate) create;
    decltype(&cuMemMap) map;
    decltype(&cuMemSetAccess) access;
    decltype(&cuMemUnmap) unmap;
    decltype(&cuMemRelease) release;
    decltype(&cuMemAddressFree) va_free;
    decltype(&cuMemGetAllocationGranularity) granularity;
} vmm_api;

static bool vmm_api_load(vmm_api *v)
{
    v->reserve = (decltype(&cuMemAddressReserve))driver_fn("cuMemAddressReserve");
    v->create = (decltype(&cuMemCreate))driver_fn("cuMemCreate");
    v->map = (decltype(&cuMemMap))driver_fn("cuMemMap");
    v->access = (decltype(&cuMemSetAccess))driver_fn("cuMemSetAccess");
    v->unmap = (decltype(&cuMemUnmap))driver_fn("cuMemUnmap");
    v->release = (decltype(&cuMemRelease))driver_fn("cuMemRelease");
    v->va_free = (decltype(&cuMemAddressFree))driver_fn("cuMemAddressFree");
    v->granularity = (decltype(&cuMemGetAllocationGranularity))driver_fn(
        "cuMemGetAllocationGranularity");
    bool ok = v->reserve && v->create && v->map && v->access && v->unmap && v->release &&
              v->va_free && v->granularity;
    CHECK(ok);
    return ok;
}

/* Device memory of the current device, as cuMemCreate takes it. */
static CUmemAllocationProp device_memory_prop(void)
{
    int dev = 0;
    CUDA_OK(cudaGetDevice(&dev));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    return prop;
}

/* Reserves `reserved` bytes and maps the first `mapped` of them, read-write
 * for the current device; false (counted) if any step failed. */
static bool vmm_mapped(const vmm_api *v, size_t reserved, size_t mapped, CUdeviceptr *va,
                       CUmemGenericAllocationHandle *h)
{
    int before = failures;
    CUmemAllocationProp prop = device_memory_prop();
    CHECK(v->reserve(va, reserved, 0, 0, 0) == CUDA_SUCCESS);
    CHECK(v->create(h, mapped, &prop, 0) == CUDA_SUCCESS);
    CHECK(v->map(*va, mapped, 0, *h, 0) == CUDA_SUCCESS);
    CUmemAccessDesc acc;
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(v->access(*va, mapped, &acc, 1) == CUDA_SUCCESS);
    return failures == before;
}

/* What the real driver says about addresses of the virtual memory API, one
 * mapped and one only reserved (no pool involved: the shim passes these
 * through). The fake driver answers as printed here (fake_driver.c,
 * vmm_pointer_attribute); only what cuda.h promises is checked. */
static void vmm_ptr_attr(void)
{
    auto attr = (decltype(&cuPointerGetAttribute))driver_fn("cuPointerGetAttribute");
    CHECK(attr != NULL);
    vmm_api v;
    if (!vmm_api_load(&v) || !attr)
        return;
    CUmemAllocationProp prop = device_memory_prop();
    const int dev = prop.location.id;
    size_t g = 0;
    CHECK(v.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    if (!vmm_mapped(&v, 2 * g, g, &va, &h))
        return;
    for (int k = 0; k < 2; k++) {
        CUdeviceptr at = va + (k ? g + 4096 : 4096);
        CUcontext ctx = (CUcontext)1;
        unsigned type = 99;
        int ordinal = -7, mapped = -7, ipc = -7;
        CUdeviceptr start = 1;
        size_t size = 1;
        CUresult rc = attr(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, at);
        CUresult rt = attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, at);
        CUresult ro = attr(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, at);
        CUresult rm = attr(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, at);
        CUresult ri = attr(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, at);
        CUresult rs = attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, at);
        CUresult rz = attr(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, at);
        printf("  %s address (reservation 0x%llx + %zu, granule %zu): context %d/%p, "
               "memory type %d/%u, ordinal %d/%d, mapped %d/%d, legacy IPC %d/%d, "
               "range %d/0x%llx + %d/%zu\n",
               k ? "reserved, unmapped" : "mapped", (unsigned long long)va, 2 * g, g, (int)rc,
               (void *)ctx, (int)rt, type, (int)ro, ordinal, (int)rm, mapped, (int)ri, ipc,
               (int)rs, (unsigned long long)start, (int)rz, size);
        if (k == 0) { /* "mapped to a backing allocation" (cuda.h, MAPPED) */
            CHECK(rm == CUDA_SUCCESS && mapped == 1);
            CHECK(rt == CUDA_SUCCESS && type == CU_MEMORYTYPE_DEVICE);
            CHECK(ro == CUDA_SUCCESS && ordinal == dev);
        }
    }
    /* cuMemGetAddressRange: the mapping that holds the address (libfabric
     * relies on that: "only returns the size of the individual segment
     * containing the pointer"); the fake answers so, and NOT_FOUND for an
     * address only reserved. */
    auto range = (decltype(&cuMemGetAddressRange))driver_fn("cuMemGetAddressRange_v2");
    CHECK(range != NULL);
    for (int k = 0; range && k < 2; k++) {
        CUdeviceptr base = 1;
        size_t size = 1;
        CUresult r = range(&base, &size, va + (k ? g + 4096 : 4096));
        printf("  cuMemGetAddressRange of the %s address: %d, 0x%llx + %zu (the fake: %d)\n",
               k ? "reserved, unmapped" : "mapped", (int)r, (unsigned long long)base, size,
               k ? (int)CUDA_ERROR_NOT_FOUND : 0);
        if (k == 0)
            CHECK(r == CUDA_SUCCESS && base == va && size == g);
        else
            CHECK(r != CUDA_SUCCESS);
    }
    CHECK(v.unmap(va, g) == CUDA_SUCCESS);
    CHECK(v.release(h) == CUDA_SUCCESS);
    CHECK(v.va_free(va, 2 * g) == CUDA_SUCCESS);
}

static double now_ms(void);

/* cuMemRetainAllocationHandle on the real driver (no pool involved), as the
 * fake models it from cuda.h and as the pool moves memory under pressure. */
static void vmm_retain(void)
{
    auto retain = (decltype(&cuMemRetainAllocationHandle))driver_fn("cuMemRetainAllocationHandle");
    vmm_api v;
    CHECK(retain != NULL);
    if (!vmm_api_load(&v) || !retain)
        return;
    CUmemAllocationProp prop = device_memory_prop();
    size_t g = 0;
    CHECK(v.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS);
    enum { N = 64 };
    CUdeviceptr a = 0, b = 0;
    CHECK(v.reserve(&a, N * g, 0, 0, 0) == CUDA_SUCCESS);
    CHECK(v.reserve(&b, N * g, 0, 0, 0) == CUDA_SUCCESS);
    CUmemAccessDesc acc;
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (int i = 0; i < N; i++) {
        CUmemGenericAllocationHandle h = 0;
        CHECK(v.create(&h, g, &prop, 0) == CUDA_SUCCESS);
        CHECK(v.map(a + i * g, g, 0, h, 0) == CUDA_SUCCESS);
        CHECK(v.release(h) == CUDA_SUCCESS); /* as the shim does: the mapping holds it */
        CHECK(v.access(a + i * g, g, &acc, 1) == CUDA_SUCCESS);
    }
    fill<<<256, 256>>>((unsigned *)a, N * g / 4, 0x3c3cu, 0);
    CUDA_OK(cudaDeviceSynchronize());
    if (failures)
        return;
    /* Any address of a mapping names the handle that mapped it. */
    CUmemGenericAllocationHandle h1 = 0, h2 = 0;
    CHECK(retain(&h1, (void *)(uintptr_t)(a + 5 * g)) == CUDA_SUCCESS);
    CHECK(retain(&h2, (void *)(uintptr_t)(a + 6 * g - 1)) == CUDA_SUCCESS);
    printf("  retained from the start and the last byte of one granule: %s handle\n",
           h1 == h2 ? "the same" : "different");
    CHECK(h1 == h2);
    CHECK(v.release(h1) == CUDA_SUCCESS && v.release(h2) == CUDA_SUCCESS);
    CUmemGenericAllocationHandle none = 0;
    CUresult unmapped = retain(&none, (void *)(uintptr_t)(b + g));
    printf("  retain of a reserved, unmapped address: %d (the fake: %d)\n", (int)unmapped,
           (int)CUDA_ERROR_INVALID_VALUE);
    CHECK(unmapped != CUDA_SUCCESS);
    /* Move every granule from a to b: retain, unmap, map, access, release. */
    size_t free0 = 0, free1 = 0, total = 0;
    CUDA_OK(cudaMemGetInfo(&free0, &total));
    double t0 = now_ms();
    for (int i = 0; i < N; i++) {
        CUmemGenericAllocationHandle h = 0;
        CHECK(retain(&h, (void *)(uintptr_t)(a + i * g)) == CUDA_SUCCESS);
        CHECK(v.unmap(a + i * g, g) == CUDA_SUCCESS);
        CHECK(v.map(b + i * g, g, 0, h, 0) == CUDA_SUCCESS);
        CHECK(v.access(b + i * g, g, &acc, 1) == CUDA_SUCCESS);
        CHECK(v.release(h) == CUDA_SUCCESS);
    }
    double moved_us = (now_ms() - t0) * 1e3 / N;
    CUDA_OK(cudaMemGetInfo(&free1, &total));
    printf("  free memory before and after moving %d granules: %zu, %zu bytes\n", N, free0,
           free1);
    CHECK(count_bad_n((unsigned *)b, N * g / 4, 0x3c3cu) == 0); /* the same memory */
    /* Back from b to a the old way: unmap (the memory goes), create, map,
     * access, release. */
    t0 = now_ms();
    for (int i = 0; i < N; i++) {
        CUmemGenericAllocationHandle h = 0;
        CHECK(v.unmap(b + i * g, g) == CUDA_SUCCESS);
        CHECK(v.create(&h, g, &prop, 0) == CUDA_SUCCESS);
        CHECK(v.map(a + i * g, g, 0, h, 0) == CUDA_SUCCESS);
        CHECK(v.access(a + i * g, g, &acc, 1) == CUDA_SUCCESS);
        CHECK(v.release(h) == CUDA_SUCCESS);
    }
    double made_us = (now_ms() - t0) * 1e3 / N;
    /* From a to b once more as the shim moves memory now: one access call
     * over the whole run of mappings (cuda.h: "a fully mapped address range
     * containing all allocations"). */
    fill<<<256, 256>>>((unsigned *)a, N * g / 4, 0x5a5au, 0);
    CUDA_OK(cudaDeviceSynchronize());
    t0 = now_ms();
    CUmemGenericAllocationHandle moving[N];
    for (int i = 0; i < N; i++) {
        moving[i] = 0;
        CHECK(retain(&moving[i], (void *)(uintptr_t)(a + i * g)) == CUDA_SUCCESS);
        CHECK(v.unmap(a + i * g, g) == CUDA_SUCCESS);
        CHECK(v.map(b + i * g, g, 0, moving[i], 0) == CUDA_SUCCESS);
    }
    CHECK(v.access(b, N * g, &acc, 1) == CUDA_SUCCESS);
    for (int i = 0; i < N; i++)
        CHECK(v.release(moving[i]) == CUDA_SUCCESS);
    double run_us = (now_ms() - t0) * 1e3 / N;
    CHECK(count_bad_n((unsigned *)b, N * g / 4, 0x5a5au) == 0);
    printf("  per %zu-byte granule: moved (retain, unmap, map, access, release) %.1f us; "
           "given back and made again (unmap, create, map, access, release) %.1f us; "
           "moved with one access call over the %d granules %.1f us\n",
           g, moved_us, made_us, N, run_us);
    for (int i = 0; i < N; i++)
        CHECK(v.unmap(b + i * g, g) == CUDA_SUCCESS);
    CHECK(v.va_free(a, N * g) == CUDA_SUCCESS);
    CHECK(v.va_free(b, N * g) == CUDA_SUCCESS);
}

/* Under a preallocated pool over virtual memory with a 64 MiB limit. */
static void pressure(void)
{
    enum { MAXB = 64 };
    const size_t B = (size_t)4 << 20;
    unsigned *blk[MAXB] = {0};
    int n = 0;
    while (n < MAXB && cudaMalloc((void **)&blk[n], B) == cudaSuccess) {
        fill<<<64, 256>>>(blk[n], B / 4, 0x100u + n, 0);
        n++;
    }
    cudaGetLastError(); /* the allocation that found the pool full */
    printf("  %d blocks of 4 MiB fill the pool\n", n);
    CHECK(n >= 8);
    CUDA_OK(cudaDeviceSynchronize());
    for (int i = 0; i < n; i += 2)
        CUDA_OK(cudaFree(blk[i]));
    long long moved0 = shim_stat_number("moved_bytes_total");
    unsigned *big = NULL;
    const size_t BIG = 4 * B; /* fits no 4 MiB hole */
    CUDA_OK(cudaMalloc((void **)&big, BIG));
    if (!big)
        return;
    fill<<<256, 256>>>(big, BIG / 4, 0xb16u, 0);
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(count_bad_n(big, BIG / 4, 0xb16u) == 0);
    for (int i = 1; i < n; i += 2)
        CHECK(count_bad_n(blk[i], B / 4, 0x100u + i) == 0);
    long long moved = shim_stat_number("moved_bytes_total") - moved0;
    printf("  moved under the new block: %lld bytes (map calls %lld, unmap calls %lld)\n", moved,
           shim_stat_number("num_map_calls"), shim_stat_number("num_unmap_calls"));
    CHECK(moved >= (long long)BIG);
    CUDA_OK(cudaFree(big));
    for (int i = 1; i < n; i += 2)
        CUDA_OK(cudaFree(blk[i]));
}

/* ---- another thread's capture -------------------------------------------------- */

typedef struct capturer {
    bool per_thread;                /* capture on cudaStreamPerThread */
    volatile int step;              /* 1: capturing, 2: please end, 3: ended */
    cudaError_t begin, end, launch; /* what the capturing thread saw */
} capturer;

static void wait_step(volatile int *step, int want)
{
    while (__atomic_load_n(step, __ATOMIC_ACQUIRE) < want)
        sched_yield();
}

static void *capture_thread(void *arg)
{
    capturer *c = (capturer *)arg;
    cudaStream_t s = cudaStreamPerThread;
    if (!c->per_thread)
        CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned *w = NULL;
    CUDA_OK(cudaMalloc((void **)&w, 4096)); /* before the capture */
    c->begin = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    fill<<<1, 32, 0, s>>>(w, 1024, 3u, 0);
    c->launch = cudaGetLastError();
    __atomic_store_n(&c->step, 1, __ATOMIC_RELEASE);
    wait_step(&c->step, 2);
    cudaGraph_t g = NULL;
    c->end = cudaStreamEndCapture(s, &g);
    if (g)
        CUDA_OK(cudaGraphDestroy(g));
    __atomic_store_n(&c->step, 3, __ATOMIC_RELEASE);
    CUDA_OK(cudaFree(w));
    if (!c->per_thread)
        CUDA_OK(cudaStreamDestroy(s));
    return NULL;
}

static void other_thread_capture(bool per_thread)
{
    unsigned *p = NULL;
    void *filler = fill_pool_but_hole(&p);
    cudaStream_t s1 = NULL, s2 = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    void *small = NULL;
    CUDA_OK(cudaMalloc(&small, 1 << 20));
    CUDA_OK(cudaFree(small)); /* freed with no work pending */
    cudaEvent_t late_done = NULL;
    CUDA_OK(cudaEventCreateWithFlags(&late_done, cudaEventDisableTiming));
    if (failures)
        return;
    late_fill<<<256, 256, 0, s1>>>(p, HOLE / 4, 0xdeadu, LATE_NS);
    CUDA_OK(cudaEventRecord(late_done, s1));
    CUDA_OK(cudaFree(p)); /* freed with work pending */

    capturer c = {per_thread, 0, cudaSuccess, cudaSuccess, cudaSuccess};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, capture_thread, &c) == 0);
    wait_step(&c.step, 1);
    /* While the other thread captures in global mode: pooled allocations
     * and frees here, then the block whose work is still pending. */
    int served = 0;
    for (int i = 0; i < 4; i++) {
        void *x = NULL;
        if (cudaMalloc(&x, 1 << 19) == cudaSuccess) {
            served++;
            CUDA_OK(cudaFree(x));
        }
    }
    unsigned *q = NULL;
    cudaError_t e = cudaMalloc((void **)&q, HOLE);
    __atomic_store_n(&c.step, 2, __ATOMIC_RELEASE);
    wait_step(&c.step, 3);
    pthread_join(t, NULL);
    /* Asked after the capture (a query could count as unsafe during it): if
     * the late kernel runs now, it ran when q was handed out. */
    bool running = cudaEventQuery(late_done) == cudaErrorNotReady;
    cudaGetLastError();
    printf("  %d of 4 allocations served during the capture; the hole: %s; capture: "
           "begin %s, launch %s, end %s\n",
           served, cudaGetErrorName(e), cudaGetErrorName(c.begin), cudaGetErrorName(c.launch),
           cudaGetErrorName(c.end));
    CHECK(served == 4);
    CHECK(c.begin == cudaSuccess && c.launch == cudaSuccess);
    CHECK(c.end == cudaSuccess); /* not invalidated by this thread's calls */
    if (e == cudaSuccess)
        expect_intact(p, q, s2, running);
    else
        q = NULL;
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaEventDestroy(late_done));
    if (q)
        CUDA_OK(cudaFree(q));
    CUDA_OK(cudaFree(filler));
    CUDA_OK(cudaStreamDestroy(s1));
    CUDA_OK(cudaStreamDestroy(s2));
}

static void global_capture(void) { other_thread_capture(false); }
static void ptds_capture(void) { other_thread_capture(true); }

/* ---- facts for the fake ------------------------------------------------------------ */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Device memory in use, all processes (nvidia-smi), in MiB; -1 if unknown. */
static long used_mib(void)
{
    FILE *f = popen("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0", "r");
    long mib = -1;
    if (f) {
        if (fscanf(f, "%ld", &mib) != 1)
            mib = -1;
        pclose(f);
    }
    return mib;
}

static void reset_running(void)
{
    auto get_current = (decltype(&cuCtxGetCurrent))driver_fn("cuCtxGetCurrent");
    auto state = (decltype(&cuDevicePrimaryCtxGetState))driver_fn("cuDevicePrimaryCtxGetState");
    auto info = (decltype(&cuMemGetInfo))driver_fn("cuMemGetInfo_v2");
    CHECK(get_current && state && info);
    /* Over virtual memory (growth) the pool maps BIG for p; those granules
     * must go back with the context. */
    const bool vmm = getenv("BFCSHIM_VMM") && strcmp(getenv("BFCSHIM_VMM"), "on") == 0;
    const size_t BIG = vmm ? (size_t)8 << 30 : HOLE;
    unsigned *p = NULL;
    cudaStream_t s = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_OK(cudaMalloc((void **)&p, BIG));
    if (failures)
        return;
    CUDA_OK(cudaDeviceSynchronize());
    long used_with_p = used_mib();
    late_fill<<<256, 256, 0, s>>>(p, HOLE / 4, 0xdeadu, LATE_NS);
    CUDA_OK(cudaGetLastError());
    double t0 = now_ms();
    cudaError_t r = cudaDeviceReset(); /* p, s and the kernel's context go */
    double dt = now_ms() - t0;
    cudaError_t after = cudaGetLastError();
    printf("  cudaDeviceReset with a %.0f ms kernel running: %s after %.1f ms; last error "
           "then %s\n",
           LATE_NS / 1e6, cudaGetErrorName(r), dt, cudaGetErrorName(after));
    CHECK(r == cudaSuccess);
    /* What the driver says before any runtime call revives the context. */
    CUcontext cur = NULL;
    unsigned flags = 0;
    int active = -1;
    size_t f = 0, t = 0;
    CUresult cr = get_current ? get_current(&cur) : CUDA_ERROR_NOT_FOUND;
    CUresult sr = state ? state(0, &flags, &active) : CUDA_ERROR_NOT_FOUND;
    CUresult ir = info ? info(&f, &t) : CUDA_ERROR_NOT_FOUND;
    printf("  after the reset: cuCtxGetCurrent %d (%s context), primary active %d (%d), "
           "cuMemGetInfo %d\n",
           (int)cr, cur ? "a" : "no", active, (int)sr, (int)ir);
    /* The next context and its pool work; cudaMalloc is the first call. */
    unsigned *q = NULL;
    CUDA_OK(cudaMalloc((void **)&q, HOLE));
    if (!q)
        return;
    fill<<<256, 256>>>(q, HOLE / 4, 0x5eedu, 0);
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(count_bad(q, 0x5eedu) == 0);
    long used_after = used_mib();
    printf("  device memory used: %ld MiB with p, %ld MiB after the reset and q\n", used_with_p,
           used_after);
    if (vmm && used_with_p >= 0 && used_after >= 0)
        CHECK(used_after < used_with_p - 4096); /* p's 8 GiB went back */
    CUDA_OK(cudaFree(q));
}

static void unmap_running(void)
{
    vmm_api v;
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    if (!vmm_api_load(&v) || !vmm_mapped(&v, HOLE, HOLE, &va, &h))
        return;
    cudaStream_t s = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t done = NULL;
    CUDA_OK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    late_fill<<<256, 256, 0, s>>>((unsigned *)va, HOLE / 4, 0xdeadu, LATE_NS);
    CUDA_OK(cudaEventRecord(done, s));
    double t0 = now_ms();
    CUresult u = v.unmap(va, HOLE);
    double dt = now_ms() - t0;
    bool running = cudaEventQuery(done) == cudaErrorNotReady;
    cudaGetLastError();
    cudaError_t sync = cudaStreamSynchronize(s);
    printf("  cuMemUnmap of a mapping a %.0f ms kernel writes: %d after %.1f ms (the kernel "
           "then %s); the stream then: %s\n",
           LATE_NS / 1e6, (int)u, dt, running ? "still running" : "done",
           cudaGetErrorName(sync));
    CHECK(u == CUDA_SUCCESS);
    v.release(h);
    v.va_free(va, HOLE);
    /* A fault leaves the context unusable: nothing more is checked after it. */
    if (sync == cudaSuccess) {
        CUDA_OK(cudaEventDestroy(done));
        CUDA_OK(cudaStreamDestroy(s));
    }
}

static void meminfo_agree(void)
{
    auto info = (decltype(&cuMemGetInfo))driver_fn("cuMemGetInfo_v2");
    CHECK(info != NULL);
    if (!info)
        return;
    void *p = NULL, *q = NULL;
    CUDA_OK(cudaMalloc(&p, 256u << 20));
    CUDA_OK(cudaMalloc(&q, 256u << 20));
    CUDA_OK(cudaFree(q)); /* the pool now holds unused bytes */
    size_t rf = 0, rt = 0, df = 0, dt = 0;
    CUDA_OK(cudaMemGetInfo(&rf, &rt));
    CHECK(info(&df, &dt) == CUDA_SUCCESS);
    printf("  free: runtime %zu, driver %zu (total %zu)\n", rf, df, rt);
    /* Nothing else allocates between the two calls in this process; another
     * process on the device may, so allow a little. */
    CHECK(rt == dt);
    CHECK(rf <= df + (8u << 20) && df <= rf + (8u << 20));
    CHECK(rf <= rt);
    CUDA_OK(cudaFree(p));
}

/* ---- green contexts ------------------------------------------------------------ */

static void green_stream(void)
{
    auto get_res = (decltype(&cuDeviceGetDevResource))driver_fn("cuDeviceGetDevResource");
    auto gen_desc = (decltype(&cuDevResourceGenerateDesc))driver_fn("cuDevResourceGenerateDesc");
    auto create = (decltype(&cuGreenCtxCreate))driver_fn("cuGreenCtxCreate");
    auto destroy = (decltype(&cuGreenCtxDestroy))driver_fn("cuGreenCtxDestroy");
    auto convert = (decltype(&cuCtxFromGreenCtx))driver_fn("cuCtxFromGreenCtx");
    auto stream_create = (decltype(&cuGreenCtxStreamCreate))driver_fn("cuGreenCtxStreamCreate");
    auto record_green = (decltype(&cuGreenCtxRecordEvent))driver_fn("cuGreenCtxRecordEvent");
    auto event_create = (decltype(&cuEventCreate))driver_fn("cuEventCreate");
    auto event_record = (decltype(&cuEventRecord))driver_fn("cuEventRecord");
    auto event_query = (decltype(&cuEventQuery))driver_fn("cuEventQuery");
    auto event_destroy = (decltype(&cuEventDestroy))driver_fn("cuEventDestroy_v2");
    auto stream_ctx = (decltype(&cuStreamGetCtx))driver_fn("cuStreamGetCtx");
    auto stream_destroy = (decltype(&cuStreamDestroy))driver_fn("cuStreamDestroy_v2");
    auto get_current = (decltype(&cuCtxGetCurrent))driver_fn("cuCtxGetCurrent");
    auto set_current = (decltype(&cuCtxSetCurrent))driver_fn("cuCtxSetCurrent");
    auto mem_alloc = (decltype(&cuMemAlloc))driver_fn("cuMemAlloc_v2");
    auto mem_free = (decltype(&cuMemFree))driver_fn("cuMemFree_v2");
    CHECK(get_res && gen_desc && create && destroy && convert && stream_create && record_green &&
          event_create && event_record && event_query && event_destroy && stream_ctx &&
          stream_destroy && get_current && set_current && mem_alloc && mem_free);
    if (failures)
        return;
    CUDA_OK(cudaFree(0)); /* the primary context, current */
    CUcontext primary = NULL, converted = NULL, of_stream = NULL;
    CHECK(get_current(&primary) == CUDA_SUCCESS && primary);
    CUdevResource sms;
    CUdevResourceDesc desc = NULL;
    CUgreenCtx g = NULL;
    CUresult r = get_res(0, &sms, CU_DEV_RESOURCE_TYPE_SM);
    if (r == CUDA_SUCCESS)
        r = gen_desc(&desc, &sms, 1);
    if (r == CUDA_SUCCESS)
        r = create(&g, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM);
    printf("  green context of %u SMs (minimum partition %u, co-scheduled alignment %u): %d\n",
           sms.sm.smCount, sms.sm.minSmPartitionSize, sms.sm.smCoscheduledAlignment, (int)r);
    CHECK(r == CUDA_SUCCESS);
    CUstream gs = NULL, gs2 = NULL;
    CHECK(convert(&converted, g) == CUDA_SUCCESS);
    CHECK(stream_create(&gs, g, CU_STREAM_NON_BLOCKING, 0) == CUDA_SUCCESS);
    CHECK(stream_create(&gs2, g, CU_STREAM_NON_BLOCKING, 0) == CUDA_SUCCESS);
    if (failures)
        return;
    CHECK(stream_ctx(gs, &of_stream) == CUDA_SUCCESS);
    printf("  cuStreamGetCtx of a green stream: %s\n",
           of_stream == converted ? "the converted context"
           : of_stream == primary ? "the primary context" : "another context");
    CUevent e = NULL;
    CHECK(event_create(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    printf("  cuEventRecord of a primary-context event on the green stream: %d (the fake: %d)\n",
           (int)event_record(e, gs), (int)CUDA_ERROR_INVALID_HANDLE);
    /* An allocation with the green context current: from the same pool? */
    size_t f0 = 0, f1 = 0, t = 0;
    CUDA_OK(cudaMemGetInfo(&f0, &t));
    CHECK(set_current(converted) == CUDA_SUCCESS);
    CUdeviceptr d = 0;
    CHECK(mem_alloc(&d, 1 << 20) == CUDA_SUCCESS);
    CHECK(set_current(primary) == CUDA_SUCCESS);
    CUDA_OK(cudaMemGetInfo(&f1, &t));
    printf("  1 MiB allocated with the green context current: obtainable memory %.0f -> %.0f "
           "MiB\n", f0 / 1048576.0, f1 / 1048576.0);
    CHECK(f0 - f1 < ((size_t)64 << 20)); /* not a second pool's limit */
    CHECK(mem_free(d) == CUDA_SUCCESS);

    /* The late kernel on the green stream; cudaFree; the hole wanted again. */
    unsigned *p = NULL, *q = NULL;
    void *filler = fill_pool_but_hole(&p);
    cudaStream_t s2 = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    late_fill<<<256, 256, 0, (cudaStream_t)gs>>>(p, HOLE / 4, 0xdeadu, LATE_NS);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaFree(p));
    CUDA_OK(cudaMalloc((void **)&q, HOLE));
    CUevent late_done = NULL;
    CHECK(event_create(&late_done, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    CHECK(record_green(g, late_done) == CUDA_SUCCESS);
    bool running = event_query(late_done) == CUDA_ERROR_NOT_READY;
    if (q)
        expect_intact(p, q, s2, running);
    CUDA_OK(cudaFree(q));
    CUDA_OK(cudaFree(filler));

    /* "If the current context is the primary context, green contexts that
     * have been created will also be synchronized" (cuCtxSynchronize): the
     * fake follows it, and the immediate free policy's release rests on
     * it (e2e_green immediate-release). */
    auto ctx_sync = (decltype(&cuCtxSynchronize))driver_fn("cuCtxSynchronize");
    CHECK(ctx_sync != NULL);
    CUDA_OK(cudaMalloc((void **)&p, HOLE));
    late_fill<<<256, 256, 0, (cudaStream_t)gs>>>(p, HOLE / 4, 0xdeadu, LATE_NS);
    CUDA_OK(cudaGetLastError());
    CHECK(ctx_sync && ctx_sync() == CUDA_SUCCESS);
    CHECK(record_green(g, e) == CUDA_SUCCESS);
    bool waited = event_query(e) == CUDA_SUCCESS;
    printf("  cuCtxSynchronize of the primary context waited for a %.0f ms kernel on the green "
           "stream: %s (cuda.h, the fake: yes)\n", LATE_NS / 1e6, waited ? "yes" : "no");
    CHECK(waited);
    CUDA_OK(cudaFree(p));

    /* Does the green context's event still cover a destroyed stream? */
    CUDA_OK(cudaMalloc((void **)&p, HOLE));
    late_fill<<<256, 256, 0, (cudaStream_t)gs2>>>(p, HOLE / 4, 0xdeadu, LATE_NS);
    CUDA_OK(cudaGetLastError());
    CHECK(stream_destroy(gs2) == CUDA_SUCCESS);
    CHECK(record_green(g, e) == CUDA_SUCCESS);
    printf("  cuGreenCtxRecordEvent after the stream running a %.0f ms kernel was destroyed: "
           "%s (the fake: not covered)\n", LATE_NS / 1e6,
           event_query(e) == CUDA_ERROR_NOT_READY ? "covered" : "not covered");
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaFree(p));
    CHECK(event_destroy(e) == CUDA_SUCCESS);
    CHECK(event_destroy(late_done) == CUDA_SUCCESS);
    CHECK(stream_destroy(gs) == CUDA_SUCCESS);
    CUDA_OK(cudaStreamDestroy(s2));
    CHECK(destroy(g) == CUDA_SUCCESS);
}

/* Every attribute cuda.h names, as the real device answers it: the fake
 * answers as an H100 SXM5 of compute capability 9.0. */
/* The default pool's figures under the shim count its pool (what PyTorch's
 * cudaMallocAsync backend reports as allocated and reserved); a pool of the
 * program's own passes through, and prints what the real driver does with
 * freed memory before and after a synchronisation, and its reservation
 * granule, to check the fake's model (fake_driver.c, "what memory pools
 * hold") against. */
static void pool_attributes(void)
{
    CUDA_OK(cudaFree(0));
    cudaMemPool_t dflt, mine;
    CUDA_OK(cudaDeviceGetDefaultMemPool(&dflt, 0));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto attr = [](cudaMemPool_t p, cudaMemPoolAttr a) {
        uint64_t v = 0;
        CUDA_OK(cudaMemPoolGetAttribute(p, a, &v));
        return (unsigned long long)v;
    };
    void *a = nullptr;
    CUDA_OK(cudaMallocAsync(&a, 3 << 20, s));
    CHECK(attr(dflt, cudaMemPoolAttrUsedMemCurrent) >= (3u << 20));
    CHECK(attr(dflt, cudaMemPoolAttrReservedMemCurrent) >= (3u << 20));
    CUDA_OK(cudaFreeAsync(a, s));
    uint64_t zero = 0;
    CUDA_OK(cudaMemPoolSetAttribute(dflt, cudaMemPoolAttrUsedMemHigh, &zero));
    printf("  default pool: used %llu, high after reset %llu, reserved %llu\n",
           attr(dflt, cudaMemPoolAttrUsedMemCurrent), attr(dflt, cudaMemPoolAttrUsedMemHigh),
           attr(dflt, cudaMemPoolAttrReservedMemCurrent));
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    CUDA_OK(cudaMemPoolCreate(&mine, &props));
    CUDA_OK(cudaMallocFromPoolAsync(&a, 3 << 20, mine, s));
    printf("  own pool, 3 MiB live: used %llu reserved %llu\n",
           attr(mine, cudaMemPoolAttrUsedMemCurrent), attr(mine, cudaMemPoolAttrReservedMemCurrent));
    CUDA_OK(cudaFreeAsync(a, s));
    printf("  freed, before a sync: used %llu reserved %llu\n",
           attr(mine, cudaMemPoolAttrUsedMemCurrent), attr(mine, cudaMemPoolAttrReservedMemCurrent));
    CUDA_OK(cudaStreamSynchronize(s));
    printf("  after the sync: used %llu reserved %llu\n",
           attr(mine, cudaMemPoolAttrUsedMemCurrent), attr(mine, cudaMemPoolAttrReservedMemCurrent));
    CUDA_OK(cudaMemPoolDestroy(mine));
    CUDA_OK(cudaStreamDestroy(s));
}

static void attributes(void)
{
    auto get = (decltype(&cuDeviceGetAttribute))driver_fn("cuDeviceGetAttribute");
    CUDA_OK(cudaFree(0)); /* the runtime has initialised the driver */
    const CUdevice dev = 0;
    int refused = 0;
    for (int a = 1; a < CU_DEVICE_ATTRIBUTE_MAX; a++) {
        int v = 0;
        CUresult r = get(&v, (CUdevice_attribute)a, dev);
        if (r == CUDA_SUCCESS)
            printf("  attribute %3d: %d\n", a, v);
        else
            refused++;
    }
    printf("  (%d attribute numbers refused)\n", refused);
    int warp = 0;
    CHECK(get(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev) == CUDA_SUCCESS);
    CHECK(warp == 32);
}

/* race: waits `ns` of GPU time, then checks (unless first) and writes the
 * block's tag in one word per 256 bytes. */
__global__ void tag_block(unsigned long long *p, size_t words, unsigned long long tag, int first,
                          unsigned long long ns, unsigned long long *bad)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - t0 < ns);
    for (size_t i = (blockIdx.x * blockDim.x + threadIdx.x) * 32; i < words;
         i += (size_t)gridDim.x * blockDim.x * 32) {
        if (!first && p[i] != tag)
            atomicAdd(bad, 1ull);
        p[i] = tag;
    }
}

enum { RACE_SLOTS = 5, RACE_LIVE = 48, RACE_OPS = 4000 };

struct race_block {
    unsigned long long *p;
    size_t bytes;
    unsigned long long tag;
    int home;
    bool async, orphan;
};

static struct {
    cudaStream_t slot[RACE_SLOTS];
    bool non_blocking[RACE_SLOTS];
    race_block live[RACE_LIVE];
    int nlive;
    unsigned long long next_tag, kernels, *bad;
    unsigned rng;
    CUresult (*cu_alloc)(CUdeviceptr *, size_t);
    CUresult (*cu_free)(CUdeviceptr);
} R;

static unsigned race_pick(unsigned n)
{
    R.rng = R.rng * 1103515245u + 12345u;
    return (R.rng >> 8) % n;
}

static void race_kernel(const race_block *b, bool first)
{
    unsigned long long ns = race_pick(4) ? 0 : 1000ull * race_pick(300); /* up to 0.3 ms */
    tag_block<<<8, 128, 0, R.slot[b->home]>>>(b->p, b->bytes / 8, b->tag, first, ns, R.bad);
    R.kernels++;
}

static void race_alloc(void)
{
    if (R.nlive == RACE_LIVE)
        return;
    static const size_t sizes[] = {4096, 65536, 1 << 20, 4 << 20};
    size_t n = sizes[race_pick(4)] + 512 * race_pick(4);
    int home = (int)race_pick(RACE_SLOTS);
    bool async = race_pick(3) == 0, driver = !async && race_pick(2);
    void *p = NULL;
    if (driver) {
        CUdeviceptr d = 0;
        CUresult r = R.cu_alloc(&d, n);
        if (r == CUDA_ERROR_OUT_OF_MEMORY)
            return;
        CHECK(r == CUDA_SUCCESS);
        p = (void *)(uintptr_t)d;
    } else {
        cudaError_t e = async ? cudaMallocAsync(&p, n, R.slot[home]) : cudaMalloc(&p, n);
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            return;
        }
        CHECK(e == cudaSuccess);
    }
    if (!p)
        return;
    race_block *b = &R.live[R.nlive++];
    *b = {(unsigned long long *)p, n, ++R.next_tag, home, async, false};
    race_kernel(b, true);
}

static void race_free(int i, bool ordered)
{
    race_block *b = &R.live[i];
    if (ordered && !b->orphan) {
        CUDA_OK(cudaFreeAsync(b->p, R.slot[b->home]));
    } else {
        /* cuMemFree does not synchronise for stream-ordered allocations:
         * their work must be done first (cuda.h). */
        if (b->async)
            CUDA_OK(b->orphan ? cudaDeviceSynchronize() : cudaStreamSynchronize(R.slot[b->home]));
        if (race_pick(2))
            CHECK(R.cu_free((CUdeviceptr)(uintptr_t)b->p) == CUDA_SUCCESS);
        else
            CUDA_OK(cudaFree(b->p));
    }
    R.live[i] = R.live[--R.nlive];
}

/* Makes stream slot k anew, blocking (synchronising with the legacy
 * stream) or not. */
static void race_make_stream(int k, bool non_blocking)
{
    R.non_blocking[k] = non_blocking;
    CUDA_OK(cudaStreamCreateWithFlags(&R.slot[k], non_blocking ? cudaStreamNonBlocking
                                                               : cudaStreamDefault));
}

static void race(void)
{
    R.rng = 20261124u;
    *(void **)&R.cu_alloc = driver_fn("cuMemAlloc_v2");
    *(void **)&R.cu_free = driver_fn("cuMemFree_v2");
    CHECK(R.cu_alloc && R.cu_free);
    CUDA_OK(cudaMalloc(&R.bad, sizeof *R.bad));
    CUDA_OK(cudaMemset(R.bad, 0, sizeof *R.bad));
    R.slot[0] = 0;                    /* the legacy stream */
    R.slot[1] = cudaStreamPerThread;
    for (int k = 2; k < RACE_SLOTS; k++)
        race_make_stream(k, k != 2);
    CUDA_OK(cudaDeviceSynchronize());
    if (failures)
        return;
    unsigned long long handed = 0, implicit = 0, replaced = 0;
    for (int op = 0; op < RACE_OPS; op++) {
        unsigned r = race_pick(100);
        if (r < 35) {
            race_alloc();
        } else if (r < 60) {
            if (R.nlive && !R.live[r % R.nlive].orphan)
                race_kernel(&R.live[r % R.nlive], false);
        } else if (r < 65) {
            race_block *b = R.nlive ? &R.live[race_pick(R.nlive)] : NULL;
            int to = (int)race_pick(RACE_SLOTS);
            if (b && !b->orphan && to != b->home) {
                /* Between the legacy stream and a blocking one, half the
                 * time with no event: the legacy stream's implicit
                 * synchronisation orders them. */
                bool legacy_and_blocking = (b->home == 0 && !R.non_blocking[to]) ||
                                           (to == 0 && !R.non_blocking[b->home]);
                if (legacy_and_blocking && race_pick(2)) {
                    implicit++;
                } else {
                    cudaEvent_t ev;
                    CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
                    CUDA_OK(cudaEventRecord(ev, R.slot[b->home]));
                    CUDA_OK(cudaStreamWaitEvent(R.slot[to], ev, 0));
                    CUDA_OK(cudaEventDestroy(ev));
                    handed++;
                }
                b->home = to;
            }
        } else if (r < 96) {
            if (R.nlive)
                race_free((int)race_pick(R.nlive), r >= 82);
        } else if (r < 98) {
            int k = 2 + (int)race_pick(RACE_SLOTS - 2);
            CUDA_OK(cudaStreamDestroy(R.slot[k])); /* its queued kernels go on */
            for (int i = 0; i < R.nlive; i++)
                if (R.live[i].home == k)
                    R.live[i].orphan = true;
            race_make_stream(k, race_pick(2));
            replaced++;
        } else if (r < 99) {
            CUDA_OK(cudaStreamSynchronize(R.slot[race_pick(RACE_SLOTS)]));
        }
        if (failures)
            break;
    }
    CUDA_OK(cudaDeviceSynchronize());
    while (R.nlive)
        race_free(R.nlive - 1, false);
    CUDA_OK(cudaDeviceSynchronize());
    unsigned long long bad = 0;
    CUDA_OK(cudaMemcpy(&bad, R.bad, sizeof bad, cudaMemcpyDeviceToHost));
    printf("race: %d operations, %llu allocations, %llu kernels, %llu hand-overs behind an event "
           "and %llu implicit, %llu streams replaced: %llu words found with another block's tag\n",
           (int)RACE_OPS, R.next_tag, R.kernels, handed, implicit, replaced, bad);
    CHECK(bad == 0);
    CUDA_OK(cudaFree(R.bad));
    for (int k = 2; k < RACE_SLOTS; k++)
        CUDA_OK(cudaStreamDestroy(R.slot[k]));
}

/* legacy-order (the header) */
typedef struct legacy_taker {
    unsigned *q;
    size_t n;
    unsigned pattern;
} legacy_taker;

static void *take_on_legacy(void *arg)
{
    legacy_taker *t = (legacy_taker *)arg;
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaMallocAsync((void **)&t->q, t->n * 4, cudaStreamLegacy));
    if (t->q)
        fill<<<64, 256, 0, cudaStreamPerThread>>>(t->q, t->n, t->pattern, 0);
    CUDA_OK(cudaStreamSynchronize(cudaStreamPerThread));
    return NULL;
}

static void legacy_order(void)
{
    cudaStream_t nb;
    CUDA_OK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking)); /* the pool is not ordered */
    unsigned long long *bad = NULL;
    CUDA_OK(cudaMalloc((void **)&bad, sizeof *bad));
    CUDA_OK(cudaMemset(bad, 0, sizeof *bad));
    const size_t n = (size_t)1 << 20;
    int reused = 0;
    for (int round = 0; round < 4; round++) {
        unsigned *p = NULL;
        CUDA_OK(cudaMallocAsync((void **)&p, n * 4, cudaStreamLegacy));
        CUDA_OK(cudaDeviceSynchronize());
        late_fill<<<64, 256, 0, cudaStreamPerThread>>>(p, n, 0x1111u + round, 200ull * 1000 * 1000);
        CUDA_OK(cudaFreeAsync(p, cudaStreamLegacy));
        legacy_taker t = {NULL, n, 0x2222u + (unsigned)round};
        pthread_t th;
        CHECK(pthread_create(&th, NULL, take_on_legacy, &t) == 0);
        pthread_join(th, NULL);
        CUDA_OK(cudaDeviceSynchronize());
        if (!t.q)
            break;
        reused += t.q == p;
        verify<<<64, 256>>>(t.q, n, t.pattern, bad);
        CUDA_OK(cudaFreeAsync(t.q, cudaStreamLegacy));
    }
    CUDA_OK(cudaDeviceSynchronize());
    unsigned long long h = 0;
    CUDA_OK(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
    printf("legacy-order: block reused at once in %d of 4 rounds; %llu words with the old "
           "owner's late write\n", reused, h);
    CHECK(h == 0);
    CUDA_OK(cudaFree(bad));
    CUDA_OK(cudaStreamDestroy(nb));
}

__global__ void copy_word(const unsigned *src, unsigned *dst) { *dst = *src; }

/* legacy-record (the header) */
static void legacy_record(void)
{
    cudaStream_t a, b;
    CUDA_OK(cudaStreamCreate(&a)); /* blocking streams */
    CUDA_OK(cudaStreamCreate(&b));
    unsigned *w = NULL;
    CUDA_OK(cudaMalloc((void **)&w, 2 * sizeof *w));
    CUDA_OK(cudaMemset(w, 0, 2 * sizeof *w));
    cudaEvent_t e;
    CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CUDA_OK(cudaDeviceSynchronize());
    late_fill<<<1, 1, 0, a>>>(w, 1, 1u, 200ull * 1000 * 1000); /* w[0] = 1, 200 ms late */
    CUDA_OK(cudaEventRecord(e, cudaStreamLegacy));
    copy_word<<<1, 1, 0, b>>>(w, w + 1);
    CUDA_OK(cudaDeviceSynchronize());
    unsigned h[2] = {0, 0};
    CUDA_OK(cudaMemcpy(h, w, sizeof h, cudaMemcpyDeviceToHost));
    printf("legacy-record: a blocking stream's kernel after a record on the legacy stream %s "
           "for another blocking stream's earlier kernel (the fake: does not wait)\n",
           h[1] == 1 ? "WAITED" : "did not wait");
    CHECK(h[0] == 1);
    CUDA_OK(cudaEventDestroy(e));
    CUDA_OK(cudaFree(w));
    CUDA_OK(cudaStreamDestroy(a));
    CUDA_OK(cudaStreamDestroy(b));
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } scenarios[] = {
        {"reuse", reuse_plain},       {"reuse-async", reuse_async},
        {"capture", capture},         {"oom", oom},
        {"ipc", ipc},                 {"meminfo", meminfo},
        {"last-error", last_error},
        {"meminfo-agree", meminfo_agree},
        {"stream-destroy", stream_destroy},
        {"capture-pending", capture_pending},
        {"capture-fork", capture_fork},
        {"fork-destroyed", fork_destroyed},
        {"capture-misuse", capture_misuse},
        {"reset", reset},             {"first-malloc", first_malloc},
        {"ptr-attr", ptr_attr},       {"vmm-ptr-attr", vmm_ptr_attr},
        {"vmm-retain", vmm_retain},   {"pressure", pressure},
        {"destroy-primary", destroy_primary},
        {"detach", detach},
        {"legacy-record", legacy_record},
        {"global-capture", global_capture},
        {"ptds-capture", ptds_capture},
        {"reset-running", reset_running},
        {"unmap-running", unmap_running},
        {"green-stream", green_stream},
        {"attributes", attributes},
        {"pool-attributes", pool_attributes},
        {"race", race},
        {"plugin", plugin},
        {"contexts", contexts},
        {"legacy-order", legacy_order},
    };
    if (argc != 2) {
        fprintf(stderr, "usage: gpu_suite SCENARIO\n");
        return 2;
    }
    if (!gpu_present(strcmp(argv[1], "first-malloc") != 0)) {
        printf("no GPU: skipping\n");
        return 77;
    }
    /* plugin opens the library itself, as a plug-in, never preloaded. */
    bool as_plugin = strcmp(argv[1], "plugin") == 0;
    if (under_shim() == as_plugin) {
        fprintf(stderr, "gpu_suite: libbfcshim.so is %s\n",
                as_plugin ? "preloaded, and plugin needs it not to be" : "not preloaded");
        return 1;
    }
    /* A crash must not take the output with it. */
    setvbuf(stdout, NULL, _IONBF, 0);
    /* Every kernel once, before the scenario: CUDA loads a kernel's module
     * at its first launch (lazy loading), which can wait for the device to
     * be idle and so serialise the kernels an early-reuse scenario needs to
     * overlap. (first-malloc must make cudaMalloc its first call.) */
    if (strcmp(argv[1], "first-malloc") != 0)
        warm_up_kernels();
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
        if (strcmp(argv[1], scenarios[i].name) == 0) {
            scenarios[i].fn();
            /* BFCSHIM_CONTEXT_CACHE=check (meson.build): a remembered current
             * context the driver contradicted, in any scenario */
            const char *cache = getenv("BFCSHIM_CONTEXT_CACHE");
            if (!as_plugin && cache && strcmp(cache, "check") == 0)
                CHECK(shim_stat_number("context_cache_wrong") == 0);
            printf("%s: %s\n", argv[1], failures ? "FAILED" : "ok");
            return failures ? 1 : 0;
        }
    fprintf(stderr, "gpu_suite: no scenario '%s'\n", argv[1]);
    return 2;
}
