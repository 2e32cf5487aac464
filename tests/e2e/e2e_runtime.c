/*
 * e2e_runtime.c - a CUDA runtime program (linked against libcudart.so.13,
 * versioned references) run under the shim. One scenario per invocation:
 *
 *   basic       pooled allocations, pitch, size 0, cudaMemGetInfo, IPC refused
 *   badinput    double free, interior, foreign and NULL pointers, huge sizes
 *   oom         out of memory with the runtime's last-error behaviour, then recovery
 *   growth      growth mode with a region request that fails, then recovery
 *   streams     no early reuse across streams; stream-ordered reuse; no syncs
 *   immediate   BFCSHIM_FREE_POLICY=immediate reuses a plain free at once
 *   capture     frees and allocations while another stream captures
 *   threads     eight threads hammering the pool with checked patterns
 *   multidevice one pool per device; frees from the other device
 *   fork        fork after the pool exists, and before
 *   platform    BFCSHIM_ALLOCATOR=platform passes everything through
 *   garbage-env malformed variables: one line each, defaults, the program runs
 *   stats-now   statistics on demand: bfcshim_write_stats and the request file
 *   reset       cudaDeviceReset: the pool goes with the context, a new one follows
 *   plan        BFCSHIM_PLAN: allocations go where tests/data/e2e.plan says
 *   plan-bad    a plan that cannot be read: one line, and the rule places
 *   plan-stray  a run that matches nothing in the plan: the first eight
 *               strays go above the plan, the ninth abandons it
 *   pool-stats  the default pool's used, reserved and high marks count the
 *               shim's pool once, whichever door adjusts them (pool-stats-
 *               hooks-off: the runtime door, the driver door closed)
 *   peers       peer access through the runtime reaches the pool over virtual
 *               memory, and goes on disable and reset (peers-hooks-off:
 *               the runtime door, the driver door closed)
 *   mixed-doors cudaMalloc memory freed with cuMemFree, the driver door open
 *               and closed (-hooks-off; -one-region-hooks-off over one
 *               cuMemAlloc region): back to the pool, the pool intact
 *   exit-busy   the program exits while another thread holds the pool, waiting
 *               for a fence that never completes: exit must not hang (the
 *               stats and trace writers give a busy pool up)
 *
 * The fake device has 1 GiB (FAKECUDA_MEM), so the default pool is 768 MiB.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "e2e_rt.h"

#define MiB (UINT64_C(1) << 20)
#define LIMIT (768 * MiB)

/* ---- scenarios ----------------------------------------------------------------- */

static uint64_t pool_attr(cudaMemPool_t pool, enum cudaMemPoolAttr attr)
{
    uint64_t v = 12345; /* the attributes are cuuint64_t, 64 bits */
    CHECK_EQ(cudaMemPoolGetAttribute(pool, attr, &v), cudaSuccess);
    return v;
}

/* PyTorch's cudaMallocAsync backend reads memory_allocated, its peak and
 * memory_reserved from these attributes and resets the peaks with 0. */
static void pool_stats(void)
{
    CHECK_EQ(cudaFree(NULL), cudaSuccess);
    cudaMemPool_t pool;
    CHECK_EQ(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *a = NULL, *b = NULL;
    CHECK_EQ(cudaMallocAsync(&a, 5 * MiB, s), cudaSuccess);
    CHECK_EQ(cudaMallocAsync(&b, 2 * MiB, s), cudaSuccess);
    CHECK_EQ(pool_attr(pool, cudaMemPoolAttrUsedMemCurrent), 7 * MiB);
    CHECK_EQ(pool_attr(pool, cudaMemPoolAttrReservedMemCurrent), LIMIT);
    CHECK_EQ(cudaFreeAsync(a, s), cudaSuccess);
    CHECK_EQ(pool_attr(pool, cudaMemPoolAttrUsedMemCurrent), 2 * MiB);
    CHECK_EQ(pool_attr(pool, cudaMemPoolAttrUsedMemHigh), 7 * MiB);
    uint64_t zero = 0;
    CHECK_EQ(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero), cudaSuccess);
    CHECK_EQ(pool_attr(pool, cudaMemPoolAttrUsedMemHigh), 2 * MiB);
    CHECK_EQ(cudaMemPoolTrimTo(pool, 0), cudaSuccess);
    CHECK_EQ(pool_attr(pool, cudaMemPoolAttrReservedMemHigh), LIMIT);
    CHECK_EQ(cudaFreeAsync(b, s), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
}

static void basic(void)
{
    CHECK_EQ(cudaFree(NULL), cudaSuccess);
    fakecuda_stats s0 = fake_stats();
    char *p[100];
    for (int i = 0; i < 100; i++) {
        size_t n = 256 + (size_t)i * 4099;
        p[i] = alloc_ok(n);
        fill(p[i], n, (unsigned char)i);
    }
    for (int i = 0; i < 100; i++)
        CHECK(holds(p[i], 256 + (size_t)i * 4099, (unsigned char)i));
    for (int i = 0; i < 100; i++)
        CHECK_EQ(cudaFree(p[i]), cudaSuccess);
    fakecuda_stats s1 = fake_stats();
    /* One region for a hundred allocations, none returned. */
    CHECK_EQ(regions_taken(s1) - regions_taken(s0), 1);
    CHECK_EQ(s1.mem_free_calls - s0.mem_free_calls, 0);
    CHECK_EQ(s1.bytes_in_use[0], LIMIT);

    void *z = (void *)1;
    CHECK_EQ(cudaMalloc(&z, 0), cudaSuccess); /* legal, and NULL */
    CHECK(z == NULL);

    void *q = NULL;
    size_t pitch = 0;
    /* The driver's pitch (the fake rounds rows to FAKECUDA_PITCH_ALIGN, 128
     * by default), whatever the shim would have guessed. */
    CHECK_EQ(cudaMallocPitch(&q, &pitch, 1100, 10), cudaSuccess);
    CHECK_EQ(pitch, 1152);
    fill(q, pitch * 10, 7);
    /* The pool's first pitched allocation asks the driver its pitch once
     * (one allocation, freed at once); later ones cost it nothing. */
    CHECK_EQ(fake_stats().mem_alloc_calls, s1.mem_alloc_calls + 1);
    CHECK_EQ(fake_stats().mem_free_calls, s1.mem_free_calls + 1);
    void *q2 = NULL;
    size_t pitch2 = 0;
    CHECK_EQ(cudaMallocPitch(&q2, &pitch2, 100, 3), cudaSuccess);
    CHECK_EQ(pitch2, 128);
    CHECK_EQ(fake_stats().mem_alloc_calls, s1.mem_alloc_calls + 1);
    CHECK_EQ(cudaFree(q2), cudaSuccess);

    /* What the program can still get: the pool's limit less what it holds. */
    size_t before = free_memory();
    CHECK_EQ(before, LIMIT - 11776); /* 10 rows of 1152, rounded to 512 */
    char *big = alloc_ok(100 * MiB);
    CHECK_EQ(free_memory(), before - 100 * MiB);
    size_t t = 0, f = 0;
    CHECK_EQ(cudaMemGetInfo(&f, &t), cudaSuccess);
    CHECK_EQ(t, 1024 * MiB);

    /* IPC of a block inside a pool region cannot work: refused loudly. */
    cudaIpcMemHandle_t h;
    CHECK_EQ(cudaIpcGetMemHandle(&h, big), cudaErrorNotSupported);
    CHECK_EQ(cudaGetLastError(), cudaErrorNotSupported);
    CHECK_ONE_LOG_LINE("IPC");
    CHECK_EQ(cudaFree(big), cudaSuccess);
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(free_memory(), LIMIT);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
}

static void badinput(void)
{
    char *p = alloc_ok(MiB), *q = alloc_ok(MiB);
    fill(q, MiB, 0xab);
    size_t base_free = free_memory();

    CHECK_EQ(cudaFree(p), cudaSuccess);
    CHECK_EQ(cudaFree(p), cudaErrorInvalidValue); /* double free */
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_EQ(cudaGetLastError(), cudaSuccess);
    CHECK_ONE_LOG_LINE("not the start of a live allocation");

    CHECK_EQ(cudaFree(q + 256), cudaErrorInvalidValue); /* interior pointer */
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_ONE_LOG_LINE("inside the live allocation");

    char *host = malloc(64); /* a pointer no pool and no driver knows */
    CHECK(cudaFree(host) != cudaSuccess);
    CHECK(cudaGetLastError() != cudaSuccess);
    CHECK_ONE_LOG_LINE("not a pooled pointer");
    free(host);

    CHECK_EQ(cudaMalloc(NULL, 16), cudaErrorInvalidValue); /* NULL out-pointer */
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_ONE_LOG_LINE("NULL");

    /* cudaMallocPitch's the same (an audit: the runtime's answer, no line) */
    size_t pitch = 0;
    void *pp = NULL;
    CHECK_EQ(cudaMallocPitch(NULL, &pitch, 64, 4), cudaErrorInvalidValue);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_ONE_LOG_LINE("NULL");
    CHECK_EQ(cudaMallocPitch(&pp, NULL, 64, 4), cudaErrorInvalidValue);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_ONE_LOG_LINE("NULL");

    void *z = (void *)1;
    CHECK_EQ(cudaMalloc(&z, 0), cudaSuccess); /* size 0 is legal: no complaint */
    CHECK(z == NULL);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);

    void *h = (void *)1;
    CHECK_EQ(cudaMalloc(&h, (size_t)1 << 50), cudaErrorMemoryAllocation); /* huge */
    CHECK(h == (void *)1);
    CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_ONE_LOG_LINE("larger than any device");
    CHECK_EQ(cudaMalloc(&h, SIZE_MAX), cudaErrorMemoryAllocation); /* rounding overflows */
    CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_ONE_LOG_LINE("larger than any device");

    /* The pool is intact: q kept its bytes, nothing leaked, all works. */
    CHECK(holds(q, MiB, 0xab));
    CHECK_EQ(free_memory(), base_free + MiB);
    CHECK_EQ(cudaFree(q), cudaSuccess);
    CHECK_EQ(free_memory(), LIMIT);
    char *all = alloc_ok(LIMIT);
    CHECK_EQ(cudaFree(all), cudaSuccess);
    CHECK_EQ(fake_stats().bytes_in_use[0], LIMIT); /* still the one region */
}

static void oom(void)
{
    char *a = alloc_ok(700 * MiB);
    void *b = (void *)1;
    CHECK_EQ(cudaMalloc(&b, 100 * MiB), cudaErrorMemoryAllocation);
    CHECK(b == (void *)1);
    CHECK_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
    CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_EQ(cudaGetLastError(), cudaSuccess);
    CHECK_ONE_LOG_LINE("out of memory");
    CHECK_EQ(e2e_reports, 1); /* the full report, once */
    /* The same failure again: the line, not the report. */
    CHECK_EQ(cudaMalloc(&b, 100 * MiB), cudaErrorMemoryAllocation);
    CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_ONE_LOG_LINE("out of memory");
    CHECK_EQ(e2e_reports, 0);
    /* After freeing, the same request succeeds. */
    CHECK_EQ(cudaFree(a), cudaSuccess);
    CHECK_EQ(cudaMalloc(&b, 100 * MiB), cudaSuccess);
    CHECK_EQ(cudaFree(b), cudaSuccess);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
}

static void growth(void)
{
    /* BFCSHIM_PREALLOCATE=false: regions come as needed. */
    char *a = alloc_ok(MiB);
    CHECK(fake_stats().bytes_in_use[0] < LIMIT);
    fakecuda()->fail_alloc_after(1); /* the next region request fails */
    void *b = NULL;
    cudaError_t e = cudaMalloc(&b, 300 * MiB);
    if (e == cudaSuccess) /* the engine backed off to a smaller region */
        CHECK_EQ(cudaFree(b), cudaSuccess);
    else {
        CHECK_EQ(e, cudaErrorMemoryAllocation);
        CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
    }
    CHECK_EQ(cudaMalloc(&b, 300 * MiB), cudaSuccess); /* the device is fine again */
    CHECK_EQ(cudaFree(b), cudaSuccess);
    CHECK_EQ(cudaFree(a), cudaSuccess);
}

static void streams(void)
{
    cudaStream_t A, B;
    CHECK_EQ(cudaStreamCreateWithFlags(&A, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaStreamCreate(&B), cudaSuccess);
    fakecuda_stats s0 = fake_stats();

    /* A plain free must wait for work on any stream, here a non-blocking
     * one the legacy stream does not cover. */
    char *x = alloc_ok(MiB);
    CHECK_EQ(fakecuda()->launch(A, write_pattern, x), 0);
    CHECK_EQ(cudaFree(x), cudaSuccess);
    char *y[8];
    for (int i = 0; i < 8; i++) {
        y[i] = alloc_ok(MiB);
        CHECK(y[i] != x);
    }
    /* Nothing waited for the device. */
    fakecuda_stats s1 = fake_stats();
    CHECK_EQ(s1.ctx_synchronize_calls, s0.ctx_synchronize_calls);
    CHECK_EQ(s1.stream_synchronize_calls, s0.stream_synchronize_calls);
    CHECK_EQ(s1.event_synchronize_calls, s0.event_synchronize_calls);
    for (int i = 0; i < 8; i++)
        CHECK_EQ(cudaFree(y[i]), cudaSuccess);

    /* Once A finished, x's bytes come back without any waiting. */
    fakecuda()->complete(A);
    CHECK(holds(x, MiB, 0x5a));
    char *all = alloc_ok(LIMIT);
    CHECK_EQ(fake_stats().event_synchronize_calls, s0.event_synchronize_calls);
    CHECK_EQ(cudaFree(all), cudaSuccess);
    fakecuda()->complete_all();

    /* Stream-ordered: the freeing stream reuses at once, another does not. */
    void *z = NULL, *w = NULL, *v = NULL;
    CHECK_EQ(cudaMallocAsync(&z, MiB, A), cudaSuccess);
    CHECK_EQ(fakecuda()->launch(A, write_pattern, z), 0);
    CHECK_EQ(cudaFreeAsync(z, A), cudaSuccess);
    CHECK_EQ(cudaMallocAsync(&v, MiB, B), cudaSuccess);
    CHECK(v != z);
    CHECK_EQ(cudaMallocAsync(&w, MiB, A), cudaSuccess);
    CHECK(w == z);
    CHECK_EQ(fake_stats().mem_alloc_async_calls, s0.mem_alloc_async_calls);
    CHECK_EQ(cudaFreeAsync(w, A), cudaSuccess);
    CHECK_EQ(cudaFreeAsync(v, B), cudaSuccess);
    fakecuda()->complete_all();

    /* A destroyed stream's pending blocks still retire. */
    CHECK_EQ(cudaMallocAsync(&z, MiB, A), cudaSuccess);
    CHECK_EQ(cudaFreeAsync(z, A), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(A), cudaSuccess);
    fakecuda()->complete_all();
    all = alloc_ok(LIMIT);
    CHECK_EQ(cudaFree(all), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(B), cudaSuccess);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
}

static void immediate(void)
{
    cudaStream_t A;
    CHECK_EQ(cudaStreamCreateWithFlags(&A, cudaStreamNonBlocking), cudaSuccess);
    char *x = alloc_ok(MiB);
    CHECK_EQ(fakecuda()->launch(A, write_pattern, x), 0);
    CHECK_EQ(cudaFree(x), cudaSuccess);
    char *y = alloc_ok(MiB);
    CHECK(y == x); /* XLA-style: the program promised ordering itself */
    fakecuda()->complete_all();
    CHECK_EQ(cudaFree(y), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(A), cudaSuccess);
}

static void capture(void)
{
    cudaStream_t B, C;
    CHECK_EQ(cudaStreamCreate(&B), cudaSuccess);
    CHECK_EQ(cudaStreamCreateWithFlags(&C, cudaStreamNonBlocking), cudaSuccess);
    char *kept = alloc_ok(MiB);
    fakecuda_stats s0 = fake_stats();
    CHECK_EQ(cudaStreamBeginCapture(B, cudaStreamCaptureModeRelaxed), cudaSuccess);

    /* Plain frees and allocations elsewhere must not touch the legacy
     * stream (its work would join B's capture and invalidate it). */
    for (int i = 0; i < 4; i++) {
        char *x = alloc_ok(MiB);
        CHECK_EQ(cudaFree(x), cudaSuccess);
    }
    void *g = NULL;
    CHECK_EQ(cudaMallocAsync(&g, MiB, B), cudaSuccess); /* graph-owned: passed through */
    CHECK_EQ(fake_stats().graph_allocs, s0.graph_allocs + 1);
    CHECK_EQ(cudaFreeAsync(g, B), cudaSuccess);
    CHECK_EQ(cudaFreeAsync(kept, B), cudaSuccess); /* a pooled block freed into a graph */
    CHECK_ONE_LOG_LINE("capturing stream");

    cudaGraph_t graph;
    CHECK_EQ(cudaStreamEndCapture(B, &graph), cudaSuccess);
    CHECK_EQ(fake_stats().capture_invalidations, s0.capture_invalidations);
    fakecuda()->complete_all();
    /* The block freed into the graph is never reused (the graph may run again). */
    CHECK_EQ(free_memory(), LIMIT - MiB);
    CHECK_EQ(cudaStreamDestroy(B), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(C), cudaSuccess);
}

typedef struct worker {
    int id;
    int failures;
} worker;

static void *hammer(void *arg)
{
    worker *w = arg;
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        w->failures++;
        return NULL;
    }
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(w->id + 1);
    char *live[16] = {0};
    size_t size[16] = {0};
    for (int i = 0; i < 3000; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int k = (int)(rng % 16);
        if (live[k]) {
            if (!holds(live[k], size[k], (unsigned char)(w->id * 16 + k)))
                w->failures++;
            cudaError_t e = (rng >> 20) & 1 ? cudaFreeAsync(live[k], s) : cudaFree(live[k]);
            w->failures += e != cudaSuccess;
            live[k] = NULL;
        } else {
            size[k] = 1 + (size_t)((rng >> 8) % (2 * MiB));
            void *p = NULL;
            cudaError_t e = (rng >> 21) & 1 ? cudaMallocAsync(&p, size[k], s)
                                            : cudaMalloc(&p, size[k]);
            if (e != cudaSuccess || !p) {
                w->failures++;
                continue;
            }
            live[k] = p;
            fill(p, size[k], (unsigned char)(w->id * 16 + k));
        }
    }
    for (int k = 0; k < 16; k++)
        if (live[k])
            w->failures += cudaFree(live[k]) != cudaSuccess;
    w->failures += cudaStreamDestroy(s) != cudaSuccess;
    return NULL;
}

static void threads(void)
{
    CHECK_EQ(cudaFree(NULL), cudaSuccess);
    pthread_t t[8];
    worker w[8];
    for (int i = 0; i < 8; i++) {
        w[i] = (worker){i, 0};
        pthread_create(&t[i], NULL, hammer, &w[i]);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ(w[i].failures, 0);
    }
    CHECK_EQ(regions_taken(fake_stats()), 1);
    CHECK_EQ(free_memory(), LIMIT);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
}

static void multidevice(void)
{
    int n = 0;
    CHECK_EQ(cudaGetDeviceCount(&n), cudaSuccess);
    CHECK_EQ(n, 2);
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    char *a = alloc_ok(MiB);
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    char *b = alloc_ok(MiB);
    fakecuda_stats st = fake_stats();
    CHECK_EQ(regions_taken(st), 2); /* one region per device */
    CHECK_EQ(st.bytes_in_use[0], LIMIT);
    CHECK_EQ(st.bytes_in_use[1], LIMIT);
    CHECK_EQ(cudaFree(a), cudaSuccess); /* device 0's block, device 1 current */
    CHECK_EQ(cudaFree(b), cudaSuccess);
    CHECK_EQ(free_memory(), LIMIT);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
}

static int child_allocations(uint64_t expect_calls)
{
    fakecuda_stats s0 = fake_stats();
    int bad = 0;
    for (int i = 0; i < 5; i++) {
        void *p = NULL;
        bad += cudaMalloc(&p, MiB) != cudaSuccess;
        bad += cudaFree(p) != cudaSuccess;
    }
    bad += regions_taken(fake_stats()) - regions_taken(s0) != expect_calls;
    return bad ? 1 : 0;
}

static int wait_child(pid_t pid)
{
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

static void forks(void)
{
    /* Forked before CUDA was touched: the child gets its own pool. */
    pid_t pid = fork();
    if (pid == 0)
        _exit(child_allocations(1));
    CHECK_EQ(wait_child(pid), 0);

    char *p = alloc_ok(MiB);
    fill(p, MiB, 3);
    /* Forked with a pool: the child passes every call through (its parent's
     * pool is not its to use). */
    pid = fork();
    if (pid == 0)
        _exit(child_allocations(5));
    CHECK_EQ(wait_child(pid), 0);
    CHECK(holds(p, MiB, 3));
    CHECK_EQ(cudaFree(p), cudaSuccess);
    CHECK_EQ(regions_taken(fake_stats()), 1);
}

static void platform(void)
{
    fakecuda_stats s0 = fake_stats();
    void *p[10];
    for (int i = 0; i < 10; i++)
        CHECK_EQ(cudaMalloc(&p[i], MiB), cudaSuccess);
    for (int i = 0; i < 10; i++)
        CHECK_EQ(cudaFree(p[i]), cudaSuccess);
    fakecuda_stats s1 = fake_stats();
    CHECK_EQ(s1.mem_alloc_calls - s0.mem_alloc_calls, 10);
    CHECK_EQ(s1.mem_free_calls - s0.mem_free_calls, 10);
    size_t f = 0, t = 0;
    CHECK_EQ(cudaMemGetInfo(&f, &t), cudaSuccess);
    CHECK_EQ(f, t); /* the device's own answer */
}

static void garbage_env(void)
{
    /* The runner sets BFCSHIM_MEM_FRACTION=lots and BFCSHIM_PREALLOCATE=maybe,
     * with BFCSHIM_CONFIG_ERRORS=warn (else the program would stop: the
     * Python test test_config_errors checks that). */
    char *p = alloc_ok(MiB);
    char log[4096];
    CHECK_EQ(shim_log_lines(log, sizeof log), 3);
    CHECK(strstr(log, "BFCSHIM_MEM_FRACTION='lots' is not a number from 0.000001 to 1") != NULL);
    CHECK(strstr(log, "BFCSHIM_PREALLOCATE='maybe'") != NULL);
    CHECK(strstr(log, "running on with the defaults") != NULL);
    CHECK_EQ(fake_stats().bytes_in_use[0], LIMIT); /* defaults: 0.75, preallocated */
    CHECK_EQ(cudaFree(p), cudaSuccess);
}

static void reset(void)
{
    char *p = alloc_ok(MiB);
    CHECK_EQ(fake_stats().bytes_in_use[0], LIMIT);
    CHECK_EQ(cudaDeviceReset(), cudaSuccess); /* the region went with the context */
    CHECK_EQ(fake_stats().bytes_in_use[0], 0);
    char *q = alloc_ok(MiB); /* a fresh pool, even if the context handle is reused */
    CHECK_EQ(fake_stats().bytes_in_use[0], LIMIT);
    fill(q, MiB, 9);
    CHECK(holds(q, MiB, 9));
    CHECK_EQ(free_memory(), LIMIT - MiB);
    /* The old pointer is stale: refused with one line, whether it now lies
     * outside every pool or (address space being reused) inside the new
     * pool's region but not at a live block. */
    if (p != q) {
        CHECK(cudaFree(p) != cudaSuccess);
        CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
        CHECK_ONE_LOG_LINE("cudaFree(");
        CHECK(holds(q, MiB, 9));
    }
    CHECK_EQ(cudaFree(q), cudaSuccess);
}

static atomic_int stuck_thread_ready;

/* Leaves only a 1 MiB hole, frees it behind work that never ends, and asks
 * for it again: the pool's slow path waits for the fence, for good. */
static void *stuck_allocator(void *arg)
{
    (void)arg;
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
        return NULL;
    void *p = NULL, *filler = NULL, *q = NULL;
    if (cudaMalloc(&p, MiB) != cudaSuccess || cudaMalloc(&filler, LIMIT - MiB - MiB / 2) !=
                                                  cudaSuccess)
        return NULL;
    fakecuda()->launch_stuck(s);
    cudaFree(p);
    atomic_store(&stuck_thread_ready, 1);
    cudaMalloc(&q, MiB); /* never returns */
    return NULL;
}

static double exit_started; /* exit-busy: when main returned */

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The executable's destructors run after every atexit handler, the shim's
 * writers included: with $EXIT_SPAN set, exit-busy writes there how long
 * those writers took. */
__attribute__((destructor)) static void exit_span(void)
{
    const char *path = getenv("EXIT_SPAN");
    if (!path || exit_started == 0)
        return;
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%.3f\n", monotonic_s() - exit_started);
        fclose(f);
    }
}

static void exit_busy(void)
{
    pthread_t t;
    pthread_create(&t, NULL, stuck_allocator, NULL);
    e2e_wait_inside_pool(&stuck_thread_ready);
    alarm(20); /* a hang at exit fails the test here, not at meson's timeout */
    /* main returns: exit() runs the shim's writers with the pool held. */
    exit_started = monotonic_s();
}

/* BFCSHIM_STATS_FILE is set by the runner; $STATS_NOW names another path. */
static void stats_now(void)
{
    char *p = alloc_ok(MiB);
    char text[8192];
    e2e_stats_now(text, sizeof text);
    CHECK(strstr(text, "\"num_allocs\": 1,") != NULL);

    /* The request file: the next thousand allocations answer it. */
    const char *file = getenv("BFCSHIM_STATS_FILE");
    char req[4200];
    snprintf(req, sizeof req, "%s.request", file);
    remove(file);
    FILE *r = fopen(req, "w");
    CHECK(r != NULL);
    if (r)
        fclose(r);
    for (int i = 0; i < 1100; i++) {
        char *q = alloc_ok(4096);
        CHECK_EQ(cudaFree(q), cudaSuccess);
    }
    CHECK(access(req, F_OK) != 0); /* answered and removed */
    CHECK(access(file, F_OK) == 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);
}

/* The plan puts the first 1 MiB at 8 MiB, the second at 0, 2 MiB at 4 MiB:
 * the pool's log says it took the plan, and the blocks lie where it said,
 * measured from the second (the region's base). A fourth allocation of a
 * size the plan has no place left for is placed by the rule. */
static void plan(void)
{
    char log[4096];
    char *a = alloc_ok(MiB), *base = alloc_ok(MiB), *c = alloc_ok(2 * MiB);
    CHECK(a == base + 8 * MiB);
    CHECK(c == base + 4 * MiB);
    CHECK(shim_log_lines(log, sizeof log) == 0 || strstr(log, "placement plan") != NULL);
    char *d = alloc_ok(MiB);
    CHECK(d != a && d != base && (d + MiB <= c || d >= c + 2 * MiB));
    memset(a, 1, MiB); /* the fake's device memory is host memory */
    memset(d, 2, MiB);
    CHECK(a[0] == 1 && a[MiB - 1] == 1 && d[0] == 2 && d[MiB - 1] == 2);
    char *all[] = {a, base, c, d};
    for (int i = 0; i < 4; i++)
        CHECK_EQ(cudaFree(all[i]), cudaSuccess);
}

static void plan_bad(void)
{
    char *a = alloc_ok(MiB);
    CHECK_ONE_LOG_LINE("BFCSHIM_PLAN not used");
    CHECK_EQ(cudaFree(a), cudaSuccess);
}

/* tests/data/e2e.plan has 1 and 2 MiB blocks only; 256 KiB blocks find no
 * entry. The stray score reaches 64 at the eighth (each placed above the
 * plan's 10 MiB extent) and passes it at the ninth, which abandons the plan;
 * from then on the rule places everything, even a size the plan has.
 * test_reporting checks the summary and the warning at exit. */
static void plan_stray(void)
{
    char *p[11];
    for (int i = 0; i < 10; i++)
        p[i] = alloc_ok(256 * 1024);
    p[10] = alloc_ok(MiB);
    char text[8192];
    e2e_stats_now(text, sizeof text);
    CHECK(strstr(text, "\"num_plan_spare\": 8,") != NULL);
    CHECK(strstr(text, "\"plan_abandoned\": 1,") != NULL);
    CHECK(strstr(text, "\"num_planned\": 0,") != NULL);
    for (int i = 0; i < 11; i++)
        CHECK_EQ(cudaFree(p[i]), cudaSuccess);
}

/* cuMemGetAccess, from the driver the program's runtime opened: the flags
 * device `dev` has on the mapping holding p. */
static unsigned long long access_of(int dev, const void *p)
{
    typedef CUresult (*get_access_fn)(unsigned long long *, const CUmemLocation *, CUdeviceptr);
    static get_access_fn get_access;
    if (!get_access)
        get_access = (get_access_fn)e2e_dlsym(e2e_open_libcuda(), "cuMemGetAccess");
    CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev};
    unsigned long long flags = 99;
    CHECK_EQ(get_access(&flags, &loc, (CUdeviceptr)(uintptr_t)p), CUDA_SUCCESS);
    return flags;
}

/* Peer access through the runtime, the pool over virtual memory: device 1
 * enabling access to device 0 reaches device 0's granules whichever door
 * learns of it (peers: cudart's cuCtxEnablePeerAccess through the driver
 * door; peers-hooks-off: the runtime door, the driver door closed), and
 * loses it on disable and on its reset ("either device is reset"). Failed
 * before the runtime door intercepted the calls: with the driver door
 * closed, device 1 never had access to pooled memory. */
static void peers(void)
{
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    char *a = alloc_ok(3 * MiB);
    CHECK_EQ(access_of(1, a), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    CHECK_EQ(cudaDeviceEnablePeerAccess(1, 0), cudaErrorInvalidDevice); /* itself */
    CHECK_EQ(cudaDeviceEnablePeerAccess(0, 1), cudaErrorInvalidValue);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_EQ(cudaDeviceEnablePeerAccess(0, 0), cudaSuccess);
    CHECK_EQ(cudaDeviceEnablePeerAccess(0, 0), cudaErrorPeerAccessAlreadyEnabled);
    CHECK_EQ(cudaGetLastError(), cudaErrorPeerAccessAlreadyEnabled);
    CHECK_EQ(access_of(1, a), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    char *b = alloc_ok(8 * MiB); /* maps more: device 1 may reach it too */
    CHECK_EQ(access_of(1, b), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    CHECK_EQ(cudaDeviceDisablePeerAccess(0), cudaSuccess);
    CHECK_EQ(cudaDeviceDisablePeerAccess(0), cudaErrorPeerAccessNotEnabled);
    CHECK_EQ(access_of(1, a), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(access_of(1, b), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(access_of(0, b), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    /* Enabled again, then device 1 is reset: the access goes with it. */
    CHECK_EQ(cudaDeviceEnablePeerAccess(0, 0), cudaSuccess);
    CHECK_EQ(access_of(1, b), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(cudaDeviceReset(), cudaSuccess);
    CHECK_EQ(access_of(1, a), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(access_of(1, b), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    fill(b, 8 * MiB, 3);
    CHECK(holds(b, 8 * MiB, 3));
    CHECK_EQ(cudaFree(a), cudaSuccess);
    CHECK_EQ(cudaFree(b), cudaSuccess);
}

/* mixed-doors (-hooks-off, -one-region-hooks-off): cudaMalloc's memory
 * freed with the driver's cuMemFree (one allocation, two APIs, as CUDA
 * allows), the driver door open or closed: each block goes back to the
 * pool, and the pool's memory stays (found by an audit: with the door
 * closed the real cuMemFree got the pooled pointer; the first block's freed
 * a one-region pool's whole region, and the next use of the pool crashed). */
static void mixed_doors(void)
{
    typedef CUresult (*free_fn)(CUdeviceptr);
    free_fn cu_free = (free_fn)dlsym(RTLD_DEFAULT, "cuMemFree_v2");
    CHECK(cu_free != NULL);
    if (!cu_free)
        return;
    const size_t sizes[] = {64 * MiB, MiB, 4096, 3 * MiB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char *p = alloc_ok(sizes[i]);
        CHECK_EQ(cu_free((CUdeviceptr)(uintptr_t)p), CUDA_SUCCESS);
    }
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
    char *half = alloc_ok(LIMIT / 2);
    memset(half, 1, LIMIT / 2); /* the pool's memory is still there */
    CHECK_EQ(cudaFree(half), cudaSuccess);
}

int main(int argc, char **argv)
{
    static const e2e_scenario scenarios[] = {
        {"basic", basic},         {"badinput", badinput},       {"oom", oom},
        {"growth", growth},       {"streams", streams},         {"immediate", immediate},
        {"capture", capture},     {"threads", threads},         {"multidevice", multidevice},
        {"fork", forks},          {"platform", platform},       {"garbage-env", garbage_env},
        {"stats-now", stats_now}, {"reset", reset},           {"exit-busy", exit_busy},
        {"plan", plan},           {"plan-bad", plan_bad},       {"plan-stray", plan_stray},
        {"pool-stats", pool_stats}, {"peers", peers},
        {"mixed-doors", mixed_doors},
    };
    return e2e_main("e2e_runtime", scenarios, sizeof scenarios / sizeof scenarios[0], argc, argv);
}
