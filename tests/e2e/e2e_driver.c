/*
 * e2e_driver.c - a driver API program that finds libcuda the way XLA,
 * TensorFlow and Numba do: dlopen("libcuda.so.1") and dlsym on that handle,
 * never linking against it. Scenarios:
 *
 *   basic       pooled allocations, cuMemGetAddressRange_v2, cuMemGetInfo_v2
 *   badinput    NULL out-pointer, size 0, double free, interior, foreign, huge
 *   contexts    created contexts get their own pools; destroying one is safe
 *   context-churn  70 contexts, one after another, each destroyed after use:
 *               every one gets a pool (dead pools give their place up)
 *   async       cuMemAllocAsync / cuMemFreeAsync with stream-ordered reuse
 *   captures-gone  captures that end without cuStreamEndCapture (their
 *               stream destroyed, their created context destroyed, their
 *               primary context reset) are counted no more: a stream-ordered
 *               allocation and free then ask no capture question, as before
 *               any capture (the count said one was under way for good)
 *   forks-ended streams that joined a capture by a wait (forks) go with it
 *               when its origin's end ends it, where no question about them
 *               can tell: another thread's per-thread default stream (only
 *               its own thread could ask the driver), and a stream that
 *               joined a capture already invalidated (the driver gives no
 *               id for it); a pair then asks no capture question
 *   hooks-off   BFCSHIM_DRIVER_HOOKS=0: the driver door stays closed
 *   primary-release  the primary context's last cuDevicePrimaryCtxRelease
 *               destroys it and its pool; a retain after it gets a new pool
 *               (primary-v1: the same, and a cuDevicePrimaryCtxReset, which
 *               destroys it but keeps the hold taken before it, with the v1
 *               entry points of CUDA 7.0 from cuGetProcAddress below 11000)
 *   destroy-busy  (BFCSHIM_TRACE) a created context is destroyed while a
 *               thread waits inside its pool, behind a kernel that never
 *               ends: the destroy returns (the trace gives that pool's last
 *               events up, with one warning)
 *   destroy-primary  cuCtxDestroy on the primary context is refused, and
 *               the pool and its blocks stay
 *   destroy-primary-streams  the same before the pool exists: the context's
 *               streams stay known, and plain frees stay fenced against them
 *   fork-busy   a child forked while a parent thread waits inside a pool
 *               reads the statistics at once, that pool reported busy
 *   fork-in-sync  (growth over virtual memory, the immediate policy) work
 *               queued on a stream forks (a host function starting a
 *               process) while a trim waits for the context's work: the
 *               fork completes (it hung in the fork handler, which waited
 *               for the streams' lock the trimming thread held)
 *   primary-churn  four threads retain the primary context, allocate, free
 *               and release it, again and again: every block lies in a
 *               region the driver still has
 *   platform-zero  platform mode counts a 0-byte allocation a driver answered
 *               with a pointer as 0 bytes in use, before and after its free
 *   fake-lifetime  (driver door closed: the fake itself) cuCtxDestroy and a
 *               primary reset keep stream-ordered allocations and free the
 *               rest; a destroyed
 *               context still current to another thread is
 *               CUDA_ERROR_CONTEXT_IS_DESTROYED there (cuda.h's rules)
 *   fake-per-thread-streams  (driver door closed) a thread's per-thread
 *               default stream of a context stays the same stream while the
 *               context lives, through many resets of two devices' primary
 *               contexts (each reset leaves a dead one behind)
 *   fake-waits-in-flight  (driver door closed) a stream whose work waits
 *               for another stream's (cuStreamWaitEvent, or the legacy
 *               stream's implicit synchronisation) is not done, nor are its
 *               events, while that other work still runs in a second
 *               thread's completion
 *   fake-legacy-sync  (driver door closed) the legacy stream's implicit
 *               synchronisation: work on a blocking stream (a created one,
 *               the per-thread default stream) runs after the legacy
 *               stream's work queued before it, and legacy work after
 *               theirs; an event on a blocking stream waits for earlier
 *               legacy work; a legacy kernel that never ends holds blocking
 *               streams back, not non-blocking ones
 *   fake-pools  (driver door closed) a device's current pool must be its own;
 *               cuMemAllocFromPoolAsync allocates on the pool's device, not
 *               the stream's
 *   pool-stats  the default pool's attributes count the shim's pool (used:
 *               its bytes in use, reserved: its region, resettable high
 *               marks), a created pool's do not; trim; bad values refused
 *   pool-trim   (growth mode) cuMemPoolTrimTo on the default pool keeps at
 *               least the bytes asked ("guaranteed to have at least
 *               minBytesToKeep bytes reserved", cuda.h); to 0 it gives the
 *               shim's idle regions back
 *   pool-destroyed  the program's own pool made current, then destroyed:
 *               stream-ordered allocations are the shim's again
 *   fake-pool-stats  (driver door closed) the fake's pools keep freed memory
 *               until a synchronisation above the release threshold, and
 *               cuMemGetInfo counts it as taken; trim, high marks
 *   before-init  allocation calls made before cuInit get the driver's
 *               CUDA_ERROR_NOT_INITIALIZED, through the shim as from the
 *               driver itself (fake-before-init: the same with the driver
 *               door closed), and nothing is allocated; after cuInit all
 *               works, and a device ordinal that names no device is
 *               CUDA_ERROR_INVALID_DEVICE
 */
#include <cuda.h>
#include <dlfcn.h>

#include "e2e_cu.h"

#define MiB (UINT64_C(1) << 20)
#define LIMIT (768 * MiB)



static void start(int device) { e2e_cu_primary_current(device); }

static void basic(void)
{
    start(0);
    fakecuda_stats s0 = fake_stats();
    CUdeviceptr p[50];
    for (int i = 0; i < 50; i++) {
        p[i] = alloc_ok(1000 + (size_t)i * 777);
        fill((void *)(uintptr_t)p[i], 1000 + (size_t)i * 777, (unsigned char)i);
    }
    CHECK_EQ(regions_taken(fake_stats()) - regions_taken(s0), 1);

    /* The block, not the region it lies in. */
    CUdeviceptr base = 0;
    size_t size = 0;
    CHECK_EQ(D.MemGetAddressRange(&base, &size, p[7] + 100), CUDA_SUCCESS);
    CHECK_EQ(base, p[7]);
    CHECK_EQ(size, 1000 + 7 * 777);

    for (int i = 0; i < 50; i++) {
        CHECK(holds((void *)(uintptr_t)p[i], 1000 + (size_t)i * 777, (unsigned char)i));
        CHECK_EQ(D.MemFree(p[i]), CUDA_SUCCESS);
    }
    CHECK_EQ(D.MemGetAddressRange(&base, &size, p[7]), CUDA_ERROR_NOT_FOUND);
    CHECK_EQ(free_memory(), LIMIT);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
}

static void badinput(void)
{
    start(0);
    CUdeviceptr q = alloc_ok(MiB);
    fill((void *)(uintptr_t)q, MiB, 0x3c);

    CHECK_EQ(D.MemAlloc(NULL, 64), CUDA_ERROR_INVALID_VALUE);
    CHECK_ONE_LOG_LINE("NULL result pointer");
    CUdeviceptr z = 42;
    CHECK_EQ(D.MemAlloc(&z, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(z, 42);
    CHECK_ONE_LOG_LINE("size 0");

    CUdeviceptr p = alloc_ok(MiB);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(p), CUDA_ERROR_INVALID_VALUE);
    CHECK_ONE_LOG_LINE("not the start of a live allocation");
    CHECK_EQ(D.MemFree(q + 512), CUDA_ERROR_INVALID_VALUE);
    CHECK_ONE_LOG_LINE("inside the live allocation");
    CHECK_EQ(D.MemFree((CUdeviceptr)0x1000), CUDA_ERROR_INVALID_VALUE);
    CHECK_ONE_LOG_LINE("not a pooled pointer");

    CUdeviceptr h = 42;
    CHECK_EQ(D.MemAlloc(&h, (size_t)1 << 50), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(h, 42);
    CHECK_ONE_LOG_LINE("larger than any device");
    CHECK_EQ(D.MemAlloc(&h, 800 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_ONE_LOG_LINE("out of memory in the pool");

    CHECK(holds((void *)(uintptr_t)q, MiB, 0x3c));
    CHECK_EQ(D.MemFree(q), CUDA_SUCCESS);
    CUdeviceptr all = alloc_ok(LIMIT);
    CHECK_EQ(D.MemFree(all), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().bytes_in_use[0], LIMIT);
}

static void contexts(void)
{
    CHECK_EQ(D.Init(0), CUDA_SUCCESS);
    CUdevice d0, d1;
    CHECK_EQ(D.DeviceGet(&d0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DeviceGet(&d1, 1), CUDA_SUCCESS);
    CUcontext c0, c1;
    CHECK_EQ(D.CtxCreate(&c0, NULL, 0, d0), CUDA_SUCCESS);
    CUdeviceptr a = alloc_ok(MiB);
    CHECK_EQ(D.CtxCreate(&c1, NULL, 0, d1), CUDA_SUCCESS);
    CUdeviceptr b = alloc_ok(MiB);
    fakecuda_stats st = fake_stats();
    CHECK_EQ(st.bytes_in_use[0], LIMIT);
    CHECK_EQ(st.bytes_in_use[1], LIMIT);
    /* a belongs to c0's pool, found while c1 is current. */
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
    CHECK_EQ(D.CtxDestroy(c1), CUDA_SUCCESS); /* b went with it */
    CHECK_EQ(fake_stats().bytes_in_use[1], 0);
    (void)b;
    /* A new context on device 1 gets a fresh pool. */
    CHECK_EQ(D.CtxCreate(&c1, NULL, 0, d1), CUDA_SUCCESS);
    CUdeviceptr c = alloc_ok(2 * MiB);
    CHECK_EQ(fake_stats().bytes_in_use[1], LIMIT);
    CHECK_EQ(D.MemFree(c), CUDA_SUCCESS);
    CHECK_EQ(D.CtxDestroy(c1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxDestroy(c0), CUDA_SUCCESS);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
}

static void context_churn(void)
{
    CHECK_EQ(D.Init(0), CUDA_SUCCESS);
    CUdevice d0;
    CHECK_EQ(D.DeviceGet(&d0, 0), CUDA_SUCCESS);
    for (int i = 0; i < 70; i++) {
        CUcontext c;
        CHECK_EQ(D.CtxCreate(&c, NULL, 0, d0), CUDA_SUCCESS);
        fakecuda_stats s0 = fake_stats();
        CUdeviceptr a = alloc_ok(MiB), b = alloc_ok(MiB);
        /* one region call for both: they came from a pool */
        if (regions_taken(fake_stats()) - regions_taken(s0) != 1) {
            fprintf(stderr, "context %d: %llu regions taken for two blocks\n", i,
                    (unsigned long long)(regions_taken(fake_stats()) - regions_taken(s0)));
            e2e_failures++;
            break;
        }
        CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
        CHECK_EQ(D.MemFree(b), CUDA_SUCCESS);
        CHECK_EQ(D.CtxDestroy(c), CUDA_SUCCESS);
    }
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
}

/* The primary context's last release destroys it; the next retain makes
 * a new one, under the same handle. With release (and reset) the v1 entry
 * points when v1. */
static void primary_release_with(CUresult (*release)(CUdevice), CUresult (*reset)(CUdevice))
{
    CHECK_EQ(D.Init(0), CUDA_SUCCESS);
    CUcontext ctx = NULL, again = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(ctx), CUDA_SUCCESS);
    CUdeviceptr a = alloc_ok(MiB);
    fill((void *)(uintptr_t)a, MiB, 1);
    CHECK_EQ(fake_stats().bytes_in_use[0], LIMIT);
    CHECK_EQ(release(0), CUDA_SUCCESS); /* the region went with it */
    CHECK_EQ(fake_stats().bytes_in_use[0], 0);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(again), CUDA_SUCCESS);
    CUdeviceptr b = alloc_ok(MiB); /* from a new pool, in a new region */
    CHECK_EQ(fake_stats().bytes_in_use[0], LIMIT);
    fill((void *)(uintptr_t)b, MiB, 2);
    CHECK(holds((void *)(uintptr_t)b, MiB, 2));
    if (reset) {
        /* A reset destroys it too, while retained, but does not release it
         * (cuda.h): the hold from before it is still to be released. */
        CHECK_EQ(reset(0), CUDA_SUCCESS);
        CHECK_EQ(fake_stats().bytes_in_use[0], 0);
        CHECK_EQ(D.DevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
        CHECK_EQ(D.CtxSetCurrent(again), CUDA_SUCCESS);
        b = alloc_ok(MiB); /* a new pool again */
        CHECK_EQ(fake_stats().bytes_in_use[0], LIMIT);
        fill((void *)(uintptr_t)b, MiB, 3);
        CHECK(holds((void *)(uintptr_t)b, MiB, 3));
    }
    CHECK_EQ(D.MemFree(b), CUDA_SUCCESS);
    if (reset) {
        /* The hold the reset kept: not the last, so the context and its
         * pool stay, and the pool still serves. */
        CHECK_EQ(release(0), CUDA_SUCCESS);
        CHECK_EQ(fake_stats().bytes_in_use[0], LIMIT);
        b = alloc_ok(MiB);
        CHECK_EQ(fake_stats().bytes_in_use[0], LIMIT);
        CHECK_EQ(D.MemFree(b), CUDA_SUCCESS);
    }
    CHECK_EQ(release(0), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().bytes_in_use[0], 0);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
}

static void primary_release(void) { primary_release_with(D.DevicePrimaryCtxRelease, NULL); }

static void primary_v1(void)
{
    CUresult (*release)(CUdevice) =
        (CUresult(*)(CUdevice))e2e_cu_proc("cuDevicePrimaryCtxRelease", 10000);
    CUresult (*reset)(CUdevice) =
        (CUresult(*)(CUdevice))e2e_cu_proc("cuDevicePrimaryCtxReset", 10000);
    if (release && reset)
        primary_release_with(release, reset);
}

/* cuCtxDestroy refuses a primary context (the fake, as CUDA_ERROR_INVALID_
 * CONTEXT): the context lives on, and so must its pool and its blocks. */
static void destroy_primary(void)
{
    start(0);
    CUcontext primary = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
    CUdeviceptr a = alloc_ok(MiB);
    fill((void *)(uintptr_t)a, MiB, 7);
    fakecuda_stats s0 = fake_stats();
    CHECK_EQ(D.CtxDestroy(primary), CUDA_ERROR_INVALID_CONTEXT);
    CHECK(holds((void *)(uintptr_t)a, MiB, 7));
    CUdeviceptr b = alloc_ok(MiB); /* the same pool: no second region */
    CHECK_EQ(regions_taken(fake_stats()), regions_taken(s0));
    CHECK_EQ(fake_stats().bytes_in_use[0], LIMIT);
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(b), CUDA_SUCCESS);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
}

/* destroy-primary-streams: the same refused cuCtxDestroy before the
 * primary context has a pool, with a non-blocking stream alive in it. The
 * stream must stay known: a later plain free of a block its queued work
 * uses is fenced against it, so the block is not handed out again until
 * that work completed. */
static void write_mib(void *arg) { memset(arg, 0x5a, MiB); }

static void destroy_primary_streams(void)
{
    start(0);
    CUcontext primary = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
    CUstream s = NULL;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.CtxDestroy(primary), CUDA_ERROR_INVALID_CONTEXT); /* no pool yet */
    CUdeviceptr hole = alloc_ok(MiB);
    CUdeviceptr filler = alloc_ok(free_memory() - MiB / 2); /* only the hole is left */
    CHECK_EQ(fakecuda()->launch(s, write_mib, (void *)(uintptr_t)hole), 0);
    CHECK_EQ(D.MemFree(hole), CUDA_SUCCESS);
    CUdeviceptr q = alloc_ok(MiB);
    if (q == hole && fakecuda()->pending(s)) {
        fprintf(stderr, "the freed block was handed out under work still queued on a stream "
                        "of the primary context\n");
        e2e_failures++;
    }
    fakecuda()->complete_all();
    CHECK_EQ(D.MemFree(q), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(filler), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
}

/* destroy-busy: a thread of a created context leaves one hole, frees it
 * behind a kernel that never ends and asks for it again: it waits inside
 * the pool, holding it, for good. */
static CUcontext busy_ctx;
static atomic_int busy_waiting;

static void *busy_allocator(void *arg)
{
    (void)arg;
    CUstream s;
    CUdeviceptr p = 0, filler = 0, q = 0;
    if (D.CtxSetCurrent(busy_ctx) != CUDA_SUCCESS ||
        D.StreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
        D.MemAlloc(&p, MiB) != CUDA_SUCCESS || D.MemAlloc(&filler, LIMIT - MiB - MiB / 2) !=
                                                   CUDA_SUCCESS)
        return NULL;
    fakecuda()->launch_stuck(s);
    D.MemFree(p);
    atomic_store(&busy_waiting, 1);
    D.MemAlloc(&q, MiB); /* waits for the kernel */
    return NULL;
}

/* The context is destroyed meanwhile, with BFCSHIM_TRACE set: recording the
 * pool's end must not wait for the held pool for good. */
static void destroy_busy(void)
{
    CHECK_EQ(D.Init(0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxCreate(&busy_ctx, NULL, 0, 0), CUDA_SUCCESS);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, busy_allocator, NULL), 0);
    e2e_wait_inside_pool(&busy_waiting);
    alarm(30); /* a hang fails the test here */
    CHECK_EQ(D.CtxDestroy(busy_ctx), CUDA_SUCCESS);
    CHECK_ONE_LOG_LINE("was busy when its context went");
    pthread_join(t, NULL); /* the destroy dropped the kernel; the wait ends */
}

/* fork-busy: a thread waits inside a pool, holding it, when the program
 * forks; the child asks for the statistics (Python's bfcshim.stats() in a
 * multiprocessing worker): it must get them, the held pool reported busy,
 * not wait for a lock no thread of the child will ever let go. */
static void fork_busy(void)
{
    CHECK_EQ(D.Init(0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxCreate(&busy_ctx, NULL, 0, 0), CUDA_SUCCESS);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, busy_allocator, NULL), 0);
    e2e_wait_inside_pool(&busy_waiting);
    size_t (*stats_json)(char *, size_t) =
        (size_t (*)(char *, size_t))dlsym(RTLD_DEFAULT, "bfcshim_stats_json");
    CHECK(stats_json != NULL);
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        alarm(10); /* a hang kills the child */
        static char doc[1 << 16];
        size_t n = stats_json ? stats_json(doc, sizeof doc) : 0;
        _exit(n > 0 && strstr(doc, "\"busy_at_exit\": true") ? 0 : 3);
    }
    int status = 0;
    CHECK_EQ(waitpid(child, &status, 0), child);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "the child %s\n", WIFSIGNALED(status) ? "hung (killed by its alarm)"
                                                             : "did not see the pool busy");
        e2e_failures++;
    }
    alarm(30);
    CHECK_EQ(D.CtxDestroy(busy_ctx), CUDA_SUCCESS); /* drops the kernel: the wait ends */
    pthread_join(t, NULL);
}

/* Threads that each retain the primary context, use a block and release
 * the context: whenever the last release destroys it, the next retain
 * makes a new one under the same handle, and its blocks must come from a
 * region of the new context. */
static void *primary_user(void *arg)
{
    (void)arg;
    for (int i = 0; i < 300; i++) {
        CUcontext ctx = NULL;
        CUdeviceptr p = 0;
        if (D.DevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
            D.CtxSetCurrent(ctx) != CUDA_SUCCESS || D.MemAlloc(&p, MiB) != CUDA_SUCCESS)
            return (void *)1;
        if (!fakecuda()->is_device_pointer(p))
            return (void *)2; /* a block of a region the driver no longer has */
        if (D.MemFree(p) != CUDA_SUCCESS || D.CtxSetCurrent(NULL) != CUDA_SUCCESS ||
            D.DevicePrimaryCtxRelease(0) != CUDA_SUCCESS)
            return (void *)3;
    }
    return NULL;
}

static void primary_churn(void)
{
    CHECK_EQ(D.Init(0), CUDA_SUCCESS);
    e2e_run_threads(4, primary_user);
    CHECK_EQ(fake_stats().bytes_in_use[0], 0);
}

static void async(void)
{
    start(0);
    CUstream s, t;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    fakecuda_stats s0 = fake_stats();
    CUdeviceptr a = 0, b = 0, c = 0;
    CHECK_EQ(D.MemAllocAsync(&a, MiB, s), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->launch(s, NULL, NULL), 0);
    CHECK_EQ(D.MemFreeAsync(a, s), CUDA_SUCCESS);
    CHECK_EQ(D.MemAllocAsync(&b, MiB, t), CUDA_SUCCESS);
    CHECK(b != a); /* t may not see s's free before s's work is done */
    CHECK_EQ(D.MemAllocAsync(&c, MiB, s), CUDA_SUCCESS);
    CHECK(c == a); /* s may: its own order protects it */
    CHECK_EQ(fake_stats().mem_alloc_async_calls, s0.mem_alloc_async_calls);
    CHECK_EQ(D.MemFreeAsync(b, t), CUDA_SUCCESS);
    CHECK_EQ(D.MemFreeAsync(c, s), CUDA_SUCCESS);
    fakecuda()->complete_all();
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(t), CUDA_SUCCESS);
    CUdeviceptr all = alloc_ok(LIMIT);
    CHECK_EQ(D.MemFree(all), CUDA_SUCCESS);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
}

/* The capture questions a stream-ordered allocation and free on s ask. */
static uint64_t questions_of_a_pair(CUstream s)
{
    uint64_t q0 = e2e_calls_of("cuStreamIsCapturing");
    CUdeviceptr p = 0;
    CHECK_EQ(D.MemAllocAsync(&p, MiB, s), CUDA_SUCCESS);
    CHECK_EQ(D.MemFreeAsync(p, s), CUDA_SUCCESS);
    return e2e_calls_of("cuStreamIsCapturing") - q0;
}

/* A relaxed capture begun on s (a stream, or the calling thread's
 * per-thread default stream of the current context). */
static void capturing(CUstream s)
{
    CHECK_EQ(D.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
}

static void captures_gone(void)
{
    CHECK_EQ(D.Init(0), CUDA_SUCCESS);
    CUdevice d0, d1;
    CHECK_EQ(D.DeviceGet(&d0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DeviceGet(&d1, 1), CUDA_SUCCESS);
    CUcontext p1 = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&p1, d1), CUDA_SUCCESS);
    CUcontext p0 = e2e_cu_primary_current(0);
    CUstream s, d;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    uint64_t none = questions_of_a_pair(s); /* no capture ever */
    CHECK_EQ(none, 0);
    /* A stream destroyed while it captures. */
    CHECK_EQ(D.StreamCreate(&d, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    capturing(d);
    CHECK(questions_of_a_pair(s) > none); /* (one is under way: asked) */
    CHECK_EQ(D.StreamDestroy(d), CUDA_SUCCESS);
    /* A created context destroyed while a stream of it and the per-thread
     * default stream capture. */
    CUcontext c = NULL;
    CUstream e;
    CHECK_EQ(D.CtxCreate(&c, NULL, 0, d0), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&e, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    capturing(e);
    capturing(CU_STREAM_PER_THREAD);
    CHECK_EQ(D.CtxDestroy(c), CUDA_SUCCESS);
    /* Device 1's primary context reset while its per-thread default stream
     * captures. */
    CHECK_EQ(D.CtxSetCurrent(p1), CUDA_SUCCESS);
    capturing(CU_STREAM_PER_THREAD);
    CHECK_EQ(D.DevicePrimaryCtxReset(d1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(p0), CUDA_SUCCESS);
    CHECK_EQ(questions_of_a_pair(s), none);
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
    CHECK_EQ(fake_stats().capture_invalidations, 0);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
}

/* forks-ended: a thread whose per-thread default stream joins the capture
 * `origin` began (event `fork`), joins back (event `join`), and stays alive
 * until told, so that only it could ask the driver about that stream. */
typedef struct ptsz_joiner {
    CUcontext ctx;
    CUevent fork, join;
    e2e_phase step; /* 1: joined and back; 2: please go */
    CUresult wait_result, record_result;
} ptsz_joiner;

static void *ptsz_join_thread(void *arg)
{
    ptsz_joiner *j = arg;
    D.CtxSetCurrent(j->ctx);
    j->wait_result = D.StreamWaitEvent(CU_STREAM_PER_THREAD, j->fork, 0);
    j->record_result = D.EventRecord(j->join, CU_STREAM_PER_THREAD);
    e2e_phase_set(&j->step, 1);
    e2e_phase_wait(&j->step, 2);
    return NULL;
}

static void forks_ended(void)
{
    CHECK_EQ(D.Init(0), CUDA_SUCCESS);
    CUcontext p0 = e2e_cu_primary_current(0);
    CUstream s, origin, side;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&origin, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&side, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUevent fork, join;
    CHECK_EQ(D.EventCreate(&fork, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&join, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    const uint64_t none = questions_of_a_pair(s);
    CHECK_EQ(none, 0);
    const uint64_t inv0 = fake_stats().capture_invalidations;

    /* Another thread's per-thread default stream. */
    capturing(origin);
    CHECK_EQ(D.EventRecord(fork, origin), CUDA_SUCCESS);
    ptsz_joiner j = {.ctx = p0, .fork = fork, .join = join, .step = E2E_PHASE_INIT};
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, ptsz_join_thread, &j), 0);
    e2e_phase_wait(&j.step, 1);
    CHECK_EQ(j.wait_result, CUDA_SUCCESS);
    CHECK_EQ(j.record_result, CUDA_SUCCESS);
    CHECK_EQ(D.StreamWaitEvent(origin, join, 0), CUDA_SUCCESS);
    CUgraph g = NULL;
    CHECK_EQ(D.StreamEndCapture(origin, &g), CUDA_SUCCESS);
    CHECK_EQ(questions_of_a_pair(s), none); /* the fork went with the end */
    e2e_phase_set(&j.step, 2);
    pthread_join(t, NULL);

    /* A stream that tries to join a capture already invalidated (a query
     * of the capturing stream is refused and invalidates it): "further use
     * of any streams which are being captured or captured events
     * associated with the graph is invalid and will return an error"
     * (the programming guide, "Invalidation"), so neither the record nor
     * the wait is taken, and no fork of it stays counted. */
    capturing(origin);
    CHECK_EQ(D.EventRecord(fork, origin), CUDA_SUCCESS);
    CHECK_EQ(D.StreamQuery(origin), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK_EQ(D.EventRecord(join, origin), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK_EQ(D.StreamWaitEvent(side, fork, 0), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK_EQ(D.StreamEndCapture(origin, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK_EQ(questions_of_a_pair(s), none);
    CHECK_EQ(fake_stats().capture_invalidations, inv0 + 1);

    CHECK_EQ(D.EventDestroy(fork), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(join), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(side), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(origin), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
}

static void hooks_off(void)
{
    start(0);
    fakecuda_stats s0 = fake_stats();
    CUdeviceptr p[10];
    for (int i = 0; i < 10; i++)
        p[i] = alloc_ok(MiB);
    for (int i = 0; i < 10; i++)
        CHECK_EQ(D.MemFree(p[i]), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().mem_alloc_calls - s0.mem_alloc_calls, 10);
}

static void platform_zero(void)
{
    /* The fake answers cuMemAlloc(0) with a pointer (FAKECUDA_ZERO_ALLOC). */
    start(0);
    CUdeviceptr zero = 0, one = 0;
    CHECK_EQ(D.MemAlloc(&zero, 0), CUDA_SUCCESS);
    CHECK(zero != 0);
    CHECK_EQ(D.MemAlloc(&one, MiB), CUDA_SUCCESS);
    char text[8192];
    e2e_stats_now(text, sizeof text);
    CHECK(strstr(text, "\"num_allocs\": 2,") != NULL);
    CHECK(strstr(text, "\"bytes_in_use\": 1048576,") != NULL);
    CHECK_EQ(D.MemFree(zero), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(one), CUDA_SUCCESS);
    e2e_stats_now(text, sizeof text);
    CHECK(strstr(text, "\"num_frees\": 2,") != NULL);
    CHECK(strstr(text, "\"bytes_in_use\": 0,") != NULL);
    CHECK(strstr(text, "\"peak_bytes_in_use\": 1048576,") != NULL);
    if (e2e_failures)
        fprintf(stderr, "%s\n", text);
}

/* Another thread, with ctx current, tries to allocate once told to. */
typedef struct late_user {
    CUcontext ctx;
    e2e_phase step; /* 1: ctx is current there, 2: please allocate, 3: done */
    CUresult result;
} late_user;

static void *late_user_thread(void *arg)
{
    late_user *u = arg;
    D.CtxSetCurrent(u->ctx);
    e2e_phase_set(&u->step, 1);
    e2e_phase_wait(&u->step, 2);
    CUdeviceptr p = 0;
    u->result = D.MemAlloc(&p, MiB);
    e2e_phase_set(&u->step, 3);
    return NULL;
}

static void fake_lifetime(void)
{
    CHECK_EQ(D.Init(0), CUDA_SUCCESS);
    CUdevice d0;
    CHECK_EQ(D.DeviceGet(&d0, 0), CUDA_SUCCESS);
    CUcontext c;
    CHECK_EQ(D.CtxCreate(&c, NULL, 0, d0), CUDA_SUCCESS);
    late_user u = {.ctx = c, .step = E2E_PHASE_INIT};
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, late_user_thread, &u), 0);
    e2e_phase_wait(&u.step, 1);
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr plain = alloc_ok(MiB), ordered = 0;
    CHECK_EQ(D.MemAllocAsync(&ordered, 2 * MiB, s), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().bytes_in_use[0], 3 * MiB);
    CHECK_EQ(D.CtxDestroy(c), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().bytes_in_use[0], 2 * MiB); /* `plain` went with c */
    (void)plain;
    e2e_phase_set(&u.step, 2);
    e2e_phase_wait(&u.step, 3);
    CHECK_EQ(pthread_join(t, NULL), 0);
    CHECK_EQ(u.result, CUDA_ERROR_CONTEXT_IS_DESTROYED);
    /* cuMemFree takes a stream-ordered allocation too, from any context. */
    start(0);
    CHECK_EQ(D.MemFree(ordered), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().bytes_in_use[0], 0);
    /* A primary context's reset keeps them too ("cudaDeviceReset() will not
     * destroy memory allocations by cudaMallocAsync()", cuda_runtime_api.h). */
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    plain = alloc_ok(MiB);
    CHECK_EQ(D.MemAllocAsync(&ordered, 2 * MiB, s), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxReset(d0), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().bytes_in_use[0], 2 * MiB);
    start(0);
    CHECK_EQ(D.MemFree(ordered), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().bytes_in_use[0], 0);
}

static void nothing(void *arg) { (void)arg; }

static void fake_per_thread_streams(void)
{
    for (int round = 0; round < 40; round++) {
        for (int d = 0; d < 2; d++) {
            start(d);
            CHECK_EQ(fakecuda()->launch(CU_STREAM_PER_THREAD, nothing, NULL), 0);
        }
        /* Each device's per-thread stream still holds this round's work: the
         * handle must name the stream it was queued on, not a new one. */
        for (int d = 0; d < 2; d++) {
            start(d);
            CHECK_EQ(D.StreamQuery(CU_STREAM_PER_THREAD), CUDA_ERROR_NOT_READY);
        }
        fakecuda()->complete_all();
        CUdevice dev;
        CHECK_EQ(D.DeviceGet(&dev, round % 2), CUDA_SUCCESS);
        CHECK_EQ(D.DevicePrimaryCtxReset(dev), CUDA_SUCCESS);
    }
}

/* Host work that notes the order in which it ran. */
static char ran[16];
static int nran;
static void note(void *arg) { ran[nran++] = *(const char *)arg; }

static void fake_legacy_sync(void)
{
    start(0);
    CUstream b, nb;
    CHECK_EQ(D.StreamCreate(&b, 0), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    /* A blocking stream's work waits for the legacy work before it. */
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, note, "L"), 0);
    CHECK_EQ(fakecuda()->launch(b, note, "b"), 0);
    CHECK_EQ(fakecuda()->launch(nb, note, "n"), 0);
    fakecuda()->complete(b);
    CHECK_EQ(nran, 2);
    CHECK_EQ(memcmp(ran, "Lb", 2), 0);
    CHECK_EQ(D.StreamQuery(CU_STREAM_LEGACY), CUDA_SUCCESS);
    CHECK_EQ(D.StreamQuery(nb), CUDA_ERROR_NOT_READY); /* not joined */
    fakecuda()->complete(nb);
    /* Legacy work waits for the blocking streams' work before it, the
     * per-thread default stream's included. */
    nran = 0;
    CHECK_EQ(fakecuda()->launch(b, note, "b"), 0);
    CHECK_EQ(fakecuda()->launch(CU_STREAM_PER_THREAD, note, "p"), 0);
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, note, "L"), 0);
    fakecuda()->complete(CU_STREAM_LEGACY);
    CHECK_EQ(nran, 3);
    CHECK_EQ(ran[2], 'L');
    /* An event on an idle blocking stream still waits for legacy work. */
    CUevent e;
    CHECK_EQ(D.EventCreate(&e, 0), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, note, "L"), 0);
    CHECK_EQ(D.EventRecord(e, b), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(e), CUDA_ERROR_NOT_READY);
    fakecuda()->complete(CU_STREAM_LEGACY);
    CHECK_EQ(D.EventQuery(e), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(e), CUDA_SUCCESS);
    /* A legacy kernel that never ends holds the blocking streams back. */
    nran = 0;
    CHECK_EQ(fakecuda()->launch_stuck(CU_STREAM_LEGACY), 0);
    CHECK_EQ(fakecuda()->launch(b, note, "b"), 0);
    CHECK_EQ(fakecuda()->launch(nb, note, "n"), 0);
    fakecuda()->complete(b);
    fakecuda()->complete(nb);
    CHECK_EQ(nran, 1);
    CHECK_EQ(ran[0], 'n');
    CHECK_EQ(D.StreamQuery(b), CUDA_ERROR_NOT_READY);
    fakecuda_stats st = fake_stats();
    CHECK_EQ(st.implicit_joins, 3); /* b after L, L after b and p, b after the stuck L */
    /* The reset drops the work that never ends. */
    CUdevice d0;
    CHECK_EQ(D.DeviceGet(&d0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxReset(d0), CUDA_SUCCESS);
}

/* Host work that holds its stream's completion until the main thread lets
 * it go. */
static e2e_phase in_flight = E2E_PHASE_INIT;
static void held_work(void *arg)
{
    (void)arg;
    e2e_phase_set(&in_flight, 1);
    e2e_phase_wait(&in_flight, 2);
}

/* A second thread: completes stream s with device 0's primary context
 * current (the legacy stream's handle names the current context's). CHECK
 * is the main thread's: a context it could not make current is its result,
 * after it has let the main thread go on. */
static void *complete_stream(void *s)
{
    CUdevice dev;
    CUcontext ctx;
    if (D.DeviceGet(&dev, 0) != CUDA_SUCCESS || D.DevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS) {
        e2e_phase_set(&in_flight, 1);
        return "no primary context";
    }
    void *why = NULL;
    if (D.CtxSetCurrent(ctx) == CUDA_SUCCESS) {
        fakecuda()->complete(s);
    } else {
        why = "its context could not be made current";
        e2e_phase_set(&in_flight, 1);
    }
    D.DevicePrimaryCtxRelease(dev);
    return why;
}

/* Stream `later` waits for work on `first`: with an event, or (first the
 * legacy stream, later a blocking one) by the legacy stream's implicit
 * synchronisation. A second thread completes `later`, which runs first's
 * work, held, in that thread; meanwhile `later` and an event on it must not
 * look done, even though `later` has no work of its own left to run. A
 * waiting stream's event said "done" here while the work it waits for was
 * still running elsewhere, and the shim reused memory that work then wrote
 * (e2e_race threads, about once in 500 runs). */
static void wait_in_flight(CUstream first, CUstream later, bool by_event)
{
    in_flight.phase = 0;
    CHECK_EQ(fakecuda()->launch(later, nothing, NULL), 0);
    fakecuda()->complete(later); /* its own work has all run */
    CHECK_EQ(fakecuda()->launch(first, held_work, NULL), 0);
    /* The operation of `later` that waits: for an event on `first`, or for
     * an event already complete, the wait joining `first` implicitly. */
    CUevent on_first = NULL, on_later = NULL;
    CHECK_EQ(D.EventCreate(&on_first, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(on_first, by_event ? first : later), CUDA_SUCCESS);
    CHECK_EQ(D.StreamWaitEvent(later, on_first, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&on_later, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(on_later, later), CUDA_SUCCESS);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, complete_stream, later), 0);
    e2e_phase_wait(&in_flight, 1); /* first's work runs in that thread */
    CHECK_EQ(D.EventQuery(on_later), CUDA_ERROR_NOT_READY);
    CHECK_EQ(D.StreamQuery(later), CUDA_ERROR_NOT_READY);
    CHECK_EQ(D.StreamQuery(first), CUDA_ERROR_NOT_READY);
    e2e_phase_set(&in_flight, 2);
    void *why = NULL;
    CHECK_EQ(pthread_join(t, &why), 0);
    CHECK(why == NULL);
    CHECK_EQ(D.EventQuery(on_later), CUDA_SUCCESS);
    CHECK_EQ(D.StreamQuery(later), CUDA_SUCCESS);
    CHECK_EQ(D.StreamQuery(first), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(on_first), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(on_later), CUDA_SUCCESS);
}

static void fake_waits_in_flight(void)
{
    start(0);
    CUstream a, b, blocking;
    CHECK_EQ(D.StreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&blocking, 0), CUDA_SUCCESS);
    wait_in_flight(a, b, true);
    wait_in_flight(CU_STREAM_LEGACY, blocking, false);
    wait_in_flight(blocking, CU_STREAM_LEGACY, false);
    CHECK_EQ(D.StreamDestroy(a), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(b), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(blocking), CUDA_SUCCESS);
}

static void fake_pools(void)
{
    start(0);
    CUdevice d1;
    CHECK_EQ(D.DeviceGet(&d1, 1), CUDA_SUCCESS);
    CUmemoryPool pool1 = NULL;
    CHECK_EQ(D.DeviceGetDefaultMemPool(&pool1, d1), CUDA_SUCCESS);
    /* "The memory pool must be local to the specified device." */
    CHECK_EQ(D.DeviceSetMemPool(0, pool1), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.DeviceSetMemPool(d1, pool1), CUDA_SUCCESS);
    CUstream s; /* on device 0 */
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr p = 0;
    CHECK_EQ(D.MemAllocFromPoolAsync(&p, MiB, pool1, s), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().bytes_in_use[0], 0);
    CHECK_EQ(fake_stats().bytes_in_use[1], MiB);
    CHECK_EQ(D.MemFreeAsync(p, s), CUDA_SUCCESS);
    CHECK_EQ(D.MemAllocFromPoolAsync(&p, MiB, (CUmemoryPool)(uintptr_t)0x1234, s),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
}

static cuuint64_t pool_attr(CUmemoryPool pool, CUmemPool_attribute attr)
{
    cuuint64_t v = 12345;
    CHECK_EQ(D.MemPoolGetAttribute(pool, attr, &v), CUDA_SUCCESS);
    return v;
}

#define USED(p) pool_attr(p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
#define USED_HIGH(p) pool_attr(p, CU_MEMPOOL_ATTR_USED_MEM_HIGH)
#define RESERVED(p) pool_attr(p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
#define RESERVED_HIGH(p) pool_attr(p, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)

/* Device 0's context current, its default memory pool, and a non-blocking
 * stream to allocate from it on (the pool scenarios' start). */
static CUmemoryPool default_pool_and_stream(CUstream *s)
{
    start(0);
    CUmemoryPool dflt = NULL;
    CHECK_EQ(D.DeviceGetDefaultMemPool(&dflt, 0), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    return dflt;
}

static void pool_stats(void)
{
    CUstream s;
    CUmemoryPool dflt = default_pool_and_stream(&s), mine = NULL;
    CUdeviceptr a = 0, b = 0;
    CHECK_EQ(D.MemAllocAsync(&a, 3 * MiB, s), CUDA_SUCCESS);
    b = alloc_ok(MiB); /* plain: the same pool serves it */
    /* The pool is the whole region the fake handed the shim. */
    CHECK_EQ(RESERVED(dflt), fake_stats().bytes_in_use[0]);
    CHECK(RESERVED(dflt) >= 4 * MiB);
    CHECK_EQ(RESERVED_HIGH(dflt), RESERVED(dflt));
    CHECK_EQ(USED(dflt), 4 * MiB);
    CHECK_EQ(USED_HIGH(dflt), 4 * MiB);
    CHECK_EQ(D.MemFreeAsync(a, s), CUDA_SUCCESS);
    CHECK_EQ(USED(dflt), MiB);
    CHECK_EQ(USED_HIGH(dflt), 4 * MiB);
    /* 0 restarts a high mark at the current value; anything else, and the
     * current figures, are refused and change nothing. */
    cuuint64_t zero = 0, five = 5;
    CHECK_EQ(D.MemPoolSetAttribute(dflt, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &five),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemPoolSetAttribute(dflt, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &zero),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(USED_HIGH(dflt), 4 * MiB);
    CHECK_EQ(D.MemPoolSetAttribute(dflt, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero), CUDA_SUCCESS);
    CHECK_EQ(USED_HIGH(dflt), MiB);
    CHECK_EQ(D.MemPoolSetAttribute(dflt, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero),
             CUDA_SUCCESS);
    CHECK_EQ(RESERVED_HIGH(dflt), RESERVED(dflt));
    /* The shim's own statistics keep the lifetime peak. */
    CHECK_EQ(shim_stat_number("peak_bytes_in_use"), (long long)(4 * MiB));
    /* A trim gives back nothing a preallocated region can keep. */
    uint64_t before = RESERVED(dflt);
    CHECK_EQ(D.MemPoolTrimTo(dflt, 0), CUDA_SUCCESS);
    CHECK_EQ(RESERVED(dflt), before);
    /* A pool of the program's own is the driver's alone. */
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CHECK_EQ(D.MemPoolCreate(&mine, &props), CUDA_SUCCESS);
    CUdeviceptr c = 0;
    CHECK_EQ(D.MemAllocFromPoolAsync(&c, 2 * MiB, mine, s), CUDA_SUCCESS);
    CHECK_EQ(USED(mine), 2 * MiB);
    CHECK_EQ(USED(dflt), MiB);
    CHECK_EQ(D.MemFreeAsync(c, s), CUDA_SUCCESS);
    /* Bad handles and pointers: the driver's answer. */
    cuuint64_t v = 0;
    CHECK_EQ(D.MemPoolGetAttribute(dflt, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, NULL),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemPoolGetAttribute((CUmemoryPool)(uintptr_t)0x1234,
                                   CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemFree(b), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
}

/* pool-destroyed: the program's own pool, made current and destroyed:
 * cuda.h, "Destroying the current mempool of a device sets the default
 * mempool of that device as the current mempool", so stream-ordered
 * allocations are the default pool's again, which the shim serves (found
 * by an audit: they went to the driver for the rest of the run). */
static void pool_destroyed(void)
{
    CUstream s;
    CUmemoryPool dflt = default_pool_and_stream(&s);
    CUdeviceptr warm = 0;
    CHECK_EQ(D.MemAlloc(&warm, MiB), CUDA_SUCCESS); /* the shim's pool exists */
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    CUmemoryPool mine = NULL;
    CHECK_EQ(D.MemPoolCreate(&mine, &props), CUDA_SUCCESS);
    CHECK_EQ(D.DeviceSetMemPool(0, mine), CUDA_SUCCESS);
    typedef CUresult (*destroy_fn)(CUmemoryPool);
    typedef CUresult (*get_fn)(CUmemoryPool *, CUdevice);
    destroy_fn destroy = (destroy_fn)e2e_dlsym(e2e_open_libcuda(), "cuMemPoolDestroy");
    get_fn get = (get_fn)e2e_dlsym(e2e_open_libcuda(), "cuDeviceGetMemPool");
    CHECK_EQ(destroy(mine), CUDA_SUCCESS);
    CHECK_EQ(destroy(mine), CUDA_ERROR_INVALID_VALUE); /* no pool now */
    CHECK_EQ(destroy(dflt), CUDA_ERROR_INVALID_VALUE); /* "cannot be destroyed" */
    CUmemoryPool now = NULL;
    CHECK_EQ(get(&now, 0), CUDA_SUCCESS);
    CHECK(now == dflt);
    const uint64_t before = fake_stats().bytes_in_use[0];
    CUdeviceptr p = 0;
    CHECK_EQ(D.MemAllocAsync(&p, MiB, s), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().bytes_in_use[0], before); /* pooled: no driver memory */
    CHECK_EQ(D.MemFreeAsync(p, s), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(warm), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
}

static void pool_trim(void)
{
    CUstream s;
    CUmemoryPool dflt = default_pool_and_stream(&s);
    CUdeviceptr small = alloc_ok(MiB), big = 0;
    CHECK_EQ(D.MemAllocAsync(&big, 64 * MiB, s), CUDA_SUCCESS); /* a region of its own */
    CHECK_EQ(D.MemFreeAsync(big, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    const uint64_t held = RESERVED(dflt);
    CHECK(held >= 65 * MiB);
    CHECK_EQ(D.MemPoolTrimTo(dflt, MiB), CUDA_SUCCESS);
    CHECK(RESERVED(dflt) >= MiB);
    CHECK_EQ(RESERVED(dflt), held); /* the shim gives back all or nothing */
    CHECK_EQ(D.MemPoolTrimTo(dflt, 0), CUDA_SUCCESS);
    CHECK(RESERVED(dflt) < held - 32 * MiB);
    CHECK_EQ(USED(dflt), MiB);
    CHECK_EQ(D.MemFree(small), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
}

/* fork-in-sync: queued work that forks (a host function starting a
 * process, as Python code in a host function may) runs while the shim
 * waits for the GPU in a trim (the immediate policy's cuCtxSynchronize
 * before memory goes back). On a GPU the host function runs on the
 * driver's thread while the trimming thread waits for it; the fake runs
 * it in the waiting thread itself: either way the fork handlers must not
 * wait for a lock the waiting thread holds. */
static void fork_and_reap(void *arg)
{
    int *status = arg;
    fflush(NULL);
    pid_t child = fork();
    if (child == 0)
        _exit(7);
    if (child < 0 || waitpid(child, status, 0) != child)
        *status = -1;
}

static void fork_in_sync(void)
{
    CUstream s;
    CUmemoryPool dflt = default_pool_and_stream(&s);
    CUdeviceptr big = alloc_ok(64 * MiB);
    int status = -1;
    CHECK_EQ(fakecuda()->launch(s, fork_and_reap, &status), 0);
    alarm(20); /* a hang fails the test here */
    CHECK_EQ(D.MemFree(big), CUDA_SUCCESS);
    CHECK_EQ(D.MemPoolTrimTo(dflt, 0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSynchronize(), CUDA_SUCCESS);
    alarm(0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 7);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
}

/* The fake's pools, as cuda.h describes them (no shim in the way). */
static void fake_pool_stats(void)
{
    CUstream s;
    CUmemoryPool dflt = default_pool_and_stream(&s);
    size_t free0 = 0, free1 = 0, total = 0;
    CHECK_EQ(D.MemGetInfo(&free0, &total), CUDA_SUCCESS);
    CUdeviceptr a = 0, b = alloc_ok(MiB); /* plain memory is no pool's */
    CHECK_EQ(D.MemAllocAsync(&a, 3 * MiB, s), CUDA_SUCCESS);
    CHECK_EQ(USED(dflt), 3 * MiB);
    CHECK_EQ(RESERVED(dflt), 3 * MiB);
    CHECK_EQ(D.MemFreeAsync(a, s), CUDA_SUCCESS);
    /* Freed, kept until the next synchronisation: still taken on the device. */
    CHECK_EQ(USED(dflt), 0);
    CHECK_EQ(RESERVED(dflt), 3 * MiB);
    CHECK_EQ(D.MemGetInfo(&free1, &total), CUDA_SUCCESS);
    CHECK_EQ(free0 - free1, 4 * MiB);
    CHECK_EQ(D.MemAllocAsync(&a, 2 * MiB, s), CUDA_SUCCESS); /* served by what it kept */
    CHECK_EQ(RESERVED(dflt), 3 * MiB);
    CHECK_EQ(D.MemFreeAsync(a, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(RESERVED(dflt), 0);
    CHECK_EQ(RESERVED_HIGH(dflt), 3 * MiB);
    CHECK_EQ(USED_HIGH(dflt), 3 * MiB);
    /* Above a release threshold it keeps memory past synchronisations,
     * until a trim. */
    cuuint64_t threshold = 8 * MiB, zero = 0, one = 1;
    CHECK_EQ(D.MemPoolSetAttribute(dflt, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold),
             CUDA_SUCCESS);
    CHECK_EQ(pool_attr(dflt, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 8 * MiB);
    CHECK_EQ(D.MemAllocAsync(&a, 2 * MiB, s), CUDA_SUCCESS);
    CHECK_EQ(D.MemFreeAsync(a, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(RESERVED(dflt), 2 * MiB);
    CHECK_EQ(D.MemPoolTrimTo(dflt, MiB), CUDA_SUCCESS);
    CHECK_EQ(RESERVED(dflt), MiB);
    CHECK_EQ(D.MemPoolTrimTo(dflt, 0), CUDA_SUCCESS);
    CHECK_EQ(RESERVED(dflt), 0);
    /* High marks: only 0 restarts them; the current figures are read-only. */
    CHECK_EQ(D.MemPoolSetAttribute(dflt, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &one),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemPoolSetAttribute(dflt, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &zero),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemPoolSetAttribute(dflt, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero),
             CUDA_SUCCESS);
    CHECK_EQ(RESERVED_HIGH(dflt), 0);
    int reuse = -1;
    CHECK_EQ(D.MemPoolGetAttribute(dflt, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &reuse),
             CUDA_SUCCESS);
    CHECK_EQ(reuse, 1);
    CHECK_EQ(D.MemFree(b), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
}

static void before_init(void)
{
    CUdeviceptr p = 0;
    size_t free_b = 0, total_b = 0;
    CUstream legacy = NULL;
    CHECK_EQ(D.MemAlloc(&p, MiB), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_EQ(p, 0);
    CHECK_EQ(D.MemFree((CUdeviceptr)0x10000), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_EQ(D.MemGetInfo(&free_b, &total_b), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_EQ(D.MemAllocAsync(&p, MiB, legacy), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_EQ(D.MemFreeAsync((CUdeviceptr)0x10000, legacy), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_EQ(fake_stats().bytes_in_use[0], 0);
    int v = -1;
    CHECK_EQ(D.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 0),
             CUDA_ERROR_NOT_INITIALIZED);
    start(0);
    CHECK_EQ(D.MemAlloc(&p, MiB), CUDA_SUCCESS);
    CHECK(p != 0);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    /* A device ordinal that names no device, an attribute that is none. */
    CHECK_EQ(D.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 99),
             CUDA_ERROR_INVALID_DEVICE);
    CHECK_EQ(D.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
    CUcontext ctx = NULL;
    CUmemoryPool pool = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&ctx, 99), CUDA_ERROR_INVALID_DEVICE);
    CHECK_EQ(D.DeviceGetDefaultMemPool(&pool, 99), CUDA_ERROR_INVALID_DEVICE);
    /* cuDeviceSetMemPool lists only CUDA_ERROR_INVALID_VALUE (cuda.h). */
    CHECK_EQ(D.DeviceGetDefaultMemPool(&pool, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DeviceSetMemPool(99, pool), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 0),
             CUDA_SUCCESS);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } scenarios[] = {
        {"basic", basic}, {"badinput", badinput}, {"contexts", contexts},
        {"async", async}, {"hooks-off", hooks_off}, {"platform-zero", platform_zero},
        {"captures-gone", captures_gone}, {"forks-ended", forks_ended},
        {"context-churn", context_churn}, {"fake-lifetime", fake_lifetime},
        {"primary-release", primary_release}, {"primary-churn", primary_churn},
        {"primary-v1", primary_v1},
        {"destroy-primary", destroy_primary},
        {"destroy-primary-streams", destroy_primary_streams}, {"destroy-busy", destroy_busy},
        {"fork-busy", fork_busy},
        {"fake-pools", fake_pools}, {"before-init", before_init},
        {"fake-per-thread-streams", fake_per_thread_streams},
        {"fake-legacy-sync", fake_legacy_sync},
        {"fake-waits-in-flight", fake_waits_in_flight},
        {"pool-stats", pool_stats}, {"fake-pool-stats", fake_pool_stats},
        {"pool-trim", pool_trim},
        {"fork-in-sync", fork_in_sync},
        {"pool-destroyed", pool_destroyed},
        {"fake-before-init", before_init},
    };
    if (argc != 2) {
        fprintf(stderr, "usage: e2e_driver SCENARIO\n");
        return 2;
    }
    e2e_program = "e2e_driver";
    shim_log_reset();
    fakecuda();
    e2e_cu_load();
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
        if (strcmp(argv[1], scenarios[i].name) == 0) {
            scenarios[i].fn();
            return e2e_done(argv[1]);
        }
    fprintf(stderr, "e2e_driver: no scenario '%s'\n", argv[1]);
    return 2;
}
