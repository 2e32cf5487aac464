/*
 * e2e_vmm_pool.c - the shim's pool over virtual memory (BFCSHIM_VMM), through
 * the real dynamic linker and the fake driver, whose VMM calls enforce
 * cuda.h's rules and whose memory faults where nothing is mapped. The program
 * uses the driver API as XLA does (libcuda.so.1 opened with dlopen), in
 * growth mode (auto leaves a preallocated pool on cuMemAlloc). Scenarios:
 *
 *   grow       blocks are served from one reservation with memory mapped as
 *              they land; they are usable; bfcshim_trim() unmaps what is
 *              free (the device gets it back, and the freed block faults)
 *   access     a block of 8 fresh granules is mapped granule by granule
 *              (cuMemUnmap cannot cut a mapping) but made accessible in one
 *              cuMemSetAccess over the run, as cuda.h allows (a fully mapped
 *              range of whole allocations); it is usable
 *   release    two contexts, a device too small for both: the second cannot
 *              have the memory the first freed until the first gives it
 *              back (bfcshim_trim), then it can
 *   threshold  (BFCSHIM_RELEASE_THRESHOLD=0) freed memory goes back to the
 *              device as soon as its fence completes, without a trim
 *   ctxdestroy cuCtxDestroy does not free cuMemCreate's memory: the shim
 *              unmaps its pool's granules when the context goes
 *   ctxdestroy-threads  the same in four threads at once: every dead
 *              pool's granules are given back, even one whose registry slot
 *              another thread's new pool took before the real call returned
 *              (traced, so that dying pools hand their trace channels to new
 *              ones across threads: for TSan)
 *   ctxdestroy-busy, reset-busy  the context goes (cuCtxDestroy; the
 *              primary's cuDevicePrimaryCtxReset) with work still queued on
 *              a pooled block: the driver finishes that work first, so the
 *              shim may unmap only after the real call (before, the work
 *              faulted: on an H100 the process's CUDA was lost)
 *   ctxdestroy-concurrent  while one thread's cuCtxDestroy still runs its
 *              context's work on a pooled block, another thread's teardown
 *              call (a refused cuCtxDestroy of the primary context) gives
 *              back no granules of the other's pool under the running work
 *   immediate-other-device  (two devices, BFCSHIM_FREE_POLICY=immediate,
 *              BFCSHIM_RELEASE_THRESHOLD=0) a plain free of a device-0 block
 *              made while device 1 is current gives its granules back only
 *              after device 0's queued work on it ran
 *   peers      (two devices) cuCtxEnablePeerAccess from device 1 to device
 *              0's context gives device 1 access to the pool's mappings,
 *              those already made and those made later; the fake's rules
 *              for the call (per context pair, flags 0, not itself, not
 *              another context of its own device); when the last context
 *              of device 1 disables it, every granule, and those mapped
 *              later, are closed to device 1 again
 *   peers-gone (two devices) a context of device 1 that enabled peer access
 *              is destroyed (cuCtxDestroy, cuDevicePrimaryCtxReset) without
 *              disabling it: its pairs go with it, so device 1 loses the
 *              access once no other context of it holds it
 *   capture    (BFCSHIM_FREE_POLICY=immediate, BFCSHIM_RELEASE_THRESHOLD=0)
 *              a free during a relaxed-mode stream capture would give its
 *              granules back, but under the immediate policy queued work
 *              may still use them, and the wait for it (cuCtxSynchronize)
 *              is refused while a stream of the context captures, and
 *              invalidates the capture: the release waits until no capture
 *              is under way, and the capture survives
 *   refused    (FAKECUDA_VMM_REFUSE=cuMemSetAccess) the device reports
 *              virtual memory management but refuses a call, as some WSL2
 *              drivers do: the shim's trial granules find out, the shim
 *              gives back what it took, logs why, and the pool uses cuMemAlloc
 *   refused-multi  (FAKECUDA_VMM_REFUSE=cuMemSetAccess:multi) a driver that
 *              sets access over one mapping per call only: the pool sets it
 *              over runs of granules, so its trial (two granules, access set
 *              once over both) finds out, and the pool uses cuMemAlloc
 *   off        (BFCSHIM_VMM=off) regions come from cuMemAlloc as before
 *   moves      (BFCSHIM_VMM=on, preallocated, 32 MiB) under pressure the
 *              pool unmaps free granules to map them under a block that
 *              landed past its mapped memory: the physical memory moves
 *              (each granule's handle retained before its unmap, and mapped
 *              again) instead of going back to the driver, so nothing is
 *              created after the start and the device's free memory never
 *              rises; the moved block and the blocks around it keep their
 *              contents; the stats say what moved
 *   growth-moves, growth-moves-off  (BFCSHIM_GROWTH_HEADROOM=0 for -off) a
 *              growing pool holds eight 4 MiB blocks, the most it has
 *              needed; every other one goes, and an 8 MiB block fits none
 *              of the holes. Four new granules would take the pool past its
 *              headroom (3.5%: 34 MiB), so three granules of the highest
 *              holes move behind the block (retained, unmapped, mapped
 *              again: the device's memory is the same) and one is made; the
 *              blocks keep their contents. With the headroom off, four are
 *              made
 *   spread     (BFCSHIM_VMM_LAYOUT=spread, otherwise as moves) the pool
 *              reserves twice its limit of address space from the start and
 *              maps the limit; the block that finds no hole lands in the
 *              unmapped half and free granules move behind it with no new
 *              reservation and no overflow message; the stats say spread
 *   short, short-off  (preallocated, 32 MiB on a device with 16 MiB free;
 *              short-off with BFCSHIM_VMM=off) the pool cannot take its
 *              limit up front: one warning says how much it took (over
 *              virtual memory nothing; one region what the device had), and
 *              allocations are served as memory allows
 *   trim-vs-teardown  (growing, two devices) trims from one thread while
 *              another ends contexts (a created one destroyed, a primary
 *              one's last release) with work queued on their pooled blocks:
 *              no dead handle used, no block unmapped under its work
 *   release-vs-stuck-trim  a trim while a kernel never ends returns (it
 *              gives back what is idle, never waits for the GPU); a non-last
 *              primary release and another thread's retain meanwhile too
 *   coarse-alignment  (device granule 64 KiB, BFCSHIM_ALIGNMENT=1MiB,
 *              preallocated) the pool maps in granules of the alignment and
 *              takes its whole limit up front
 */
#include <cuda.h>
#include <unistd.h>

#include "e2e_cu.h"

#define MiB ((size_t)1 << 20)

/* The C interface of the preloaded shim (include/bfcshim.h). */
static uint64_t (*trim)(void);

static CUcontext primary;

static void start(void)
{
    e2e_cu_load();
    *(void **)&trim = e2e_dlsym(RTLD_DEFAULT, "bfcshim_trim");
    primary = e2e_cu_primary_current(0);
}

static void fill_and_check(CUdeviceptr p, size_t n, unsigned char v)
{
    memset((void *)(uintptr_t)p, v, n);
    const unsigned char *b = (const unsigned char *)(uintptr_t)p;
    CHECK(b[0] == v && b[n / 2] == v && b[n - 1] == v);
}

static void grow(void)
{
    start();
    const uint64_t before = fake_stats().bytes_in_use[0];
    CUdeviceptr a = 0, b = 0, c = 0;
    CHECK_EQ(D.MemAlloc(&a, 3 * MiB), CUDA_SUCCESS);
    CHECK_EQ(D.MemAlloc(&b, 3 * MiB), CUDA_SUCCESS);
    CHECK_EQ(D.MemAlloc(&c, 1000), CUDA_SUCCESS);
    fakecuda_stats st = fake_stats();
    CHECK_EQ(st.vmm_reserve_calls, 2); /* the trial granules', then one for the pool */
    CHECK_EQ(st.mem_alloc_calls, 0);   /* no cuMemAlloc region */
    CHECK_EQ(shim_stat_number("prealloc_us"), 0); /* nothing was taken up front */
    uint64_t mapped = st.bytes_in_use[0] - before;
    CHECK(mapped >= 6 * MiB && mapped <= 10 * MiB && mapped % (2 * MiB) == 0);
    fill_and_check(a, 3 * MiB, 1);
    fill_and_check(b, 3 * MiB, 2);
    fill_and_check(c, 1000, 3);
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(b), CUDA_SUCCESS);
    uint64_t released = trim();
    CHECK(released >= 4 * MiB);
    CHECK_EQ(fake_stats().bytes_in_use[0], before + mapped - released);
    CHECK(fake_stats().vmm_unmap_calls >= 2);
    CHECK(e2e_touch_dies(a + MiB)); /* given back: nothing is mapped there now */
    fill_and_check(c, 1000, 4); /* the live block keeps its granule */
    /* Memory comes back on demand. */
    CUdeviceptr d = 0;
    CHECK_EQ(D.MemAlloc(&d, 5 * MiB), CUDA_SUCCESS);
    fill_and_check(d, 5 * MiB, 5);
    CHECK_EQ(D.MemFree(d), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(c), CUDA_SUCCESS);
}

static void access_run(void)
{
    start();
    CUdeviceptr small = 0, big = 0;
    CHECK_EQ(D.MemAlloc(&small, 1000), CUDA_SUCCESS); /* the pool, its trial granules */
    const fakecuda_stats before = fake_stats();
    CHECK_EQ(D.MemAlloc(&big, 16 * MiB), CUDA_SUCCESS);
    const fakecuda_stats after = fake_stats();
    CHECK_EQ(after.vmm_map_calls - before.vmm_map_calls, 8);
    CHECK_EQ(after.vmm_access_calls - before.vmm_access_calls, 1);
    fill_and_check(big, 16 * MiB, 7);
    CHECK_EQ(D.MemFree(big), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(small), CUDA_SUCCESS);
}

static void release(void)
{
    /* FAKECUDA_MEM=64MiB and BFCSHIM_MEM_FRACTION=1: each context's pool
     * may map the whole device, and only one can at a time. */
    start();
    CUcontext other = NULL;
    CHECK_EQ(D.CtxCreate(&other, NULL, 0, 0), CUDA_SUCCESS); /* now current */
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    CUdeviceptr a = 0;
    CHECK_EQ(D.MemAlloc(&a, 40 * MiB), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(other), CUDA_SUCCESS);
    CUdeviceptr b = 0;
    CHECK_EQ(D.MemAlloc(&b, 40 * MiB), CUDA_ERROR_OUT_OF_MEMORY); /* the first holds it */
    CHECK(trim() >= 40 * MiB); /* every pool gives back what is free */
    CHECK_EQ(D.MemAlloc(&b, 40 * MiB), CUDA_SUCCESS);
    fill_and_check(b, 40 * MiB, 6);
    CHECK_EQ(D.MemFree(b), CUDA_SUCCESS);
    CHECK_EQ(D.CtxDestroy(other), CUDA_SUCCESS);
}

static void threshold(void)
{
    start();
    const uint64_t before = fake_stats().bytes_in_use[0];
    CUdeviceptr a = 0, b = 0;
    CHECK_EQ(D.MemAlloc(&a, 20 * MiB), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
    /* The free waits for its fence; the next allocation retires it, and
     * the merged free space goes back at once. */
    CHECK_EQ(D.MemAlloc(&b, 1000), CUDA_SUCCESS);
    CHECK(fake_stats().bytes_in_use[0] - before <= 2 * MiB);
    CHECK(e2e_touch_dies(a + 10 * MiB));
    CHECK_EQ(D.MemFree(b), CUDA_SUCCESS);
}

static void ctxdestroy(void)
{
    start();
    const uint64_t before = fake_stats().bytes_in_use[0];
    CUcontext other = NULL;
    CHECK_EQ(D.CtxCreate(&other, NULL, 0, 0), CUDA_SUCCESS);
    CUdeviceptr a = 0;
    CHECK_EQ(D.MemAlloc(&a, 10 * MiB), CUDA_SUCCESS);
    CHECK(fake_stats().bytes_in_use[0] >= before + 10 * MiB);
    CHECK_EQ(D.CtxDestroy(other), CUDA_SUCCESS); /* a leaks with its context */
    CHECK_EQ(fake_stats().bytes_in_use[0], before);
}

static void short_kernel(void *arg)
{
    (void)arg;
    nanosleep(&(struct timespec){.tv_nsec = 200 * 1000}, NULL);
}

/* One thread's share of ctxdestroy-threads: contexts made, used and
 * destroyed one after another, each with a short kernel still queued (the
 * driver finishes it inside cuCtxDestroy, so other threads go on meanwhile). */
static void *context_churn(void *arg)
{
    (void)arg;
    for (int i = 0; i < 100; i++) {
        CUcontext c = NULL;
        CUstream s = NULL;
        CUdeviceptr a = 0;
        if (D.CtxCreate(&c, NULL, 0, 0) != CUDA_SUCCESS || D.MemAlloc(&a, 3 * MiB) !=
                                                               CUDA_SUCCESS ||
            D.StreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
            fakecuda()->launch(s, short_kernel, NULL) != 0 || D.CtxDestroy(c) != CUDA_SUCCESS)
            return (void *)1;
    }
    return NULL;
}

/* The same from four threads at once: a pool can die (in one thread's
 * cuCtxDestroy) and lose its registry slot to another thread's new pool
 * before its granules are given back after the real call. */
static void ctxdestroy_threads(void)
{
    start();
    const uint64_t before = fake_stats().bytes_in_use[0];
    e2e_run_threads(4, context_churn);
    CHECK_EQ(fake_stats().bytes_in_use[0], before);
}

/* Work queued on a pooled block: it writes the block when it runs, and
 * records whether the block was still mapped then. */
typedef struct late_write {
    CUdeviceptr at;
    size_t size;
    bool ran, faulted;
} late_write;

static void write_late(void *arg)
{
    late_write *w = arg;
    w->faulted = e2e_touch_dies(w->at) || e2e_touch_dies(w->at + w->size - 1);
    if (!w->faulted)
        memset((void *)(uintptr_t)w->at, 0x5a, w->size);
    w->ran = true;
}

/* The pool's context (created, or the primary) goes while a stream of it
 * still has work on a pooled block. */
static void busy_teardown(bool created)
{
    start();
    const uint64_t before = fake_stats().bytes_in_use[0];
    CUcontext other = NULL;
    if (created)
        CHECK_EQ(D.CtxCreate(&other, NULL, 0, 0), CUDA_SUCCESS); /* now current */
    CUstream s = NULL;
    CHECK_EQ(D.StreamCreate(&s, 0), CUDA_SUCCESS);
    late_write w = {.size = 10 * MiB};
    CHECK_EQ(D.MemAlloc(&w.at, w.size), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->launch(s, write_late, &w), 0);
    if (created)
        CHECK_EQ(D.CtxDestroy(other), CUDA_SUCCESS);
    else
        CHECK_EQ(D.DevicePrimaryCtxReset(0), CUDA_SUCCESS);
    CHECK(w.ran);      /* the driver finished the work before the context went */
    CHECK(!w.faulted); /* with the block still mapped */
    CHECK_EQ(fake_stats().bytes_in_use[0], before); /* and then it went back */
}

static void ctxdestroy_busy(void) { busy_teardown(true); }

/* immediate-other-device: under the immediate policy with a release
 * threshold of 0, a plain free gives the block's granules back at once,
 * after waiting for the pool's context's work. The free is made while
 * device 1's context is current: the wait must be for device 0's work, on
 * which a kernel still writes the block. */
static void write_if_mapped(void *arg)
{
    /* No fork here (e2e_touch_dies): this work runs inside the shim's
     * cuCtxSynchronize, with the pool's lock held, which the shim's fork
     * handler would wait for. */
    late_write *w = arg;
    w->faulted = !fakecuda()->is_device_pointer(w->at) ||
                 !fakecuda()->is_device_pointer(w->at + w->size - 1);
    if (!w->faulted)
        memset((void *)(uintptr_t)w->at, 0x5a, w->size);
    w->ran = true;
}

/* trim-vs-teardown: one thread makes a context, queues work on a pooled
 * block of it, frees the block plainly (the next allocation seals the
 * fence: events on its stream) and ends the context, over and over: a
 * created context of device 0 destroyed, then device 1's primary context
 * retained and released for the last time; meanwhile the main thread trims
 * (device 0's default pool with cuMemPoolTrimTo to 0, and bfcshim_trim,
 * every pool). No call of the shim's may name a handle (context, stream,
 * event) the other thread's teardown has destroyed (found by an audit: a
 * trim that found the pool alive pushed the dead context, sealed on its
 * dead streams and queried its dead events), and no kernel may find its
 * block unmapped. */
static atomic_bool teardowns_done;
static atomic_int blocks_gone;

static void check_block(void *arg)
{
    CUdeviceptr at = (CUdeviceptr)(uintptr_t)arg;
    if (!fakecuda()->is_device_pointer(at) || !fakecuda()->is_device_pointer(at + 3 * MiB - 1))
        atomic_fetch_add(&blocks_gone, 1);
    else
        memset((void *)(uintptr_t)at, 0x5a, 3 * MiB);
}

/* Work on a pooled block of the current context, its plain free, and a
 * seal; 0, or the step that failed. */
static int use_and_free(void)
{
    CUstream s = NULL;
    CUdeviceptr p = 0, q = 0;
    if (D.StreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
        D.MemAlloc(&p, 3 * MiB) != CUDA_SUCCESS)
        return 1;
    for (int k = 0; k < 4; k++)
        if (fakecuda()->launch(s, check_block, (void *)(uintptr_t)p) != 0)
            return 2;
    fakecuda()->complete(s); /* these ran with the block live */
    if (fakecuda()->launch(s, check_block, (void *)(uintptr_t)p) != 0 ||
        D.MemFree(p) != CUDA_SUCCESS || D.MemAlloc(&q, MiB) != CUDA_SUCCESS)
        return 3;
    return D.MemFree(q) == CUDA_SUCCESS ? 0 : 4;
}

static void *teardowns(void *arg)
{
    (void)arg;
    intptr_t failed = 0;
    for (int i = 0; i < 60 && !failed; i++) {
        CUcontext c = NULL;
        if (D.CtxCreate(&c, NULL, 0, 0) != CUDA_SUCCESS)
            failed = 10;
        else if ((failed = use_and_free()) == 0 && D.CtxDestroy(c) != CUDA_SUCCESS)
            failed = 11;
        if (!failed && (D.DevicePrimaryCtxRetain(&c, 1) != CUDA_SUCCESS ||
                        D.CtxSetCurrent(c) != CUDA_SUCCESS))
            failed = 20;
        if (!failed && (failed = use_and_free()) == 0 &&
            (D.CtxSetCurrent(NULL) != CUDA_SUCCESS || D.DevicePrimaryCtxRelease(1) != CUDA_SUCCESS))
            failed = 21;
    }
    atomic_store(&teardowns_done, true);
    return (void *)failed;
}

static void trim_vs_teardown(void)
{
    start();
    CUdeviceptr keep = 0;
    CHECK_EQ(D.MemAlloc(&keep, MiB), CUDA_SUCCESS);
    CUmemoryPool dp = NULL;
    CHECK_EQ(D.DeviceGetDefaultMemPool(&dp, 0), CUDA_SUCCESS);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, teardowns, NULL), 0);
    uint64_t trims = 0;
    while (!atomic_load(&teardowns_done)) {
        if (trims++ & 1)
            trim();
        else
            CHECK_EQ(D.MemPoolTrimTo(dp, 0), CUDA_SUCCESS);
    }
    void *failed = NULL;
    CHECK_EQ(pthread_join(t, &failed), 0);
    CHECK_EQ((intptr_t)failed, 0);
    fprintf(stderr, "trims %llu; stale handle uses %llu; kernels that found their block gone %d\n",
            (unsigned long long)trims, (unsigned long long)fake_stats().stale_handle_uses,
            atomic_load(&blocks_gone));
    CHECK_EQ(atomic_load(&blocks_gone), 0);
    /* Before the guard: 39-124 stale uses a run. With it, until trim_enter
     * read closing before dead, a loaded TSan run in about fifty showed one
     * (a trim that read dead before a release's forget and closing after
     * its hold, and queried an event of the context just gone). */
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
    CHECK_EQ(D.MemFree(keep), CUDA_SUCCESS);
}

/* release-vs-stuck-trim: a trim while the GPU runs a kernel that does not
 * end (NCCL waiting for a peer) gives back what is idle and returns; a
 * non-last primary release meanwhile, and another thread's retain, return
 * too (found by a review: the trim waited for the GPU inside the pool, and
 * the release, holding the primary contexts' lock, waited for the trim). */
static atomic_int trim_returned, release_returned, retain_returned;

static void *trim_once(void *arg)
{
    (void)arg;
    trim();
    atomic_store(&trim_returned, 1);
    return NULL;
}

static void *release_once(void *arg)
{
    (void)arg;
    CHECK_EQ(D.DevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    atomic_store(&release_returned, 1);
    return NULL;
}

static void *retain_once(void *arg)
{
    (void)arg;
    CUcontext c = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c, 0), CUDA_SUCCESS);
    atomic_store(&retain_returned, 1);
    return NULL;
}

/* Waits up to 2 s for *flag. */
static int within_2s(atomic_int *flag)
{
    for (int i = 0; i < 200 && !atomic_load(flag); i++)
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    return atomic_load(flag);
}

static void release_vs_stuck_trim(void)
{
    start();
    CUcontext c = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c, 0), CUDA_SUCCESS); /* a second reference */
    CUdeviceptr p = 0;
    CHECK_EQ(D.MemAlloc(&p, 8 * MiB), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->launch_stuck(NULL), 0);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    pthread_t t[3];
    CHECK_EQ(pthread_create(&t[0], NULL, trim_once, NULL), 0);
    CHECK(within_2s(&trim_returned));
    CHECK_EQ(pthread_create(&t[1], NULL, release_once, NULL), 0);
    CHECK_EQ(pthread_create(&t[2], NULL, retain_once, NULL), 0);
    CHECK(within_2s(&release_returned) && within_2s(&retain_returned));
    fprintf(stderr, "trim returned %d, the non-last release %d, another thread's retain %d\n",
            atomic_load(&trim_returned), atomic_load(&release_returned),
            atomic_load(&retain_returned));
    fflush(stderr);
    /* The kernel never ends: whatever still waits for it never returns,
     * and is let go rather than joined. */
    atomic_int *returned[3] = {&trim_returned, &release_returned, &retain_returned};
    for (int i = 0; i < 3; i++)
        if (atomic_load(returned[i]))
            pthread_join(t[i], NULL);
        else
            pthread_detach(t[i]);
    _exit(e2e_done("release-vs-stuck-trim"));
}

static void immediate_other_device(void)
{
    start();
    const uint64_t before = fake_stats().bytes_in_use[0];
    CUstream s = NULL;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    late_write w = {.size = 10 * MiB};
    CHECK_EQ(D.MemAlloc(&w.at, w.size), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->launch(s, write_if_mapped, &w), 0);
    CUcontext one = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&one, 1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(one), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(w.at), CUDA_SUCCESS);
    fakecuda()->complete_all();
    CHECK(w.ran);
    CHECK(!w.faulted); /* the granules went back only after the kernel ran */
    CHECK_EQ(fake_stats().bytes_in_use[0], before);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRelease(1), CUDA_SUCCESS);
}

/* ctxdestroy-concurrent: one thread's cuCtxDestroy is still finishing its
 * context's work on a pooled block (the kernel waits for the main thread)
 * while the main thread makes a teardown call of its own. That call must
 * not give back the other context's granules: its pool is forgotten, but
 * its work still runs. The main thread's call is a cuCtxDestroy of the
 * primary context, which the driver refuses at once; a teardown that
 * completes callbacks would wait its turn behind the running kernel (the
 * fake runs host work one batch at a time, as cuda.h allows), but the
 * shim's give-back follows every teardown hook, refused or not. */
static e2e_phase concurrent = E2E_PHASE_INIT;

static void write_when_told(void *arg)
{
    e2e_phase_set(&concurrent, 1); /* the kernel runs, inside cuCtxDestroy */
    e2e_phase_wait(&concurrent, 2);
    write_late(arg);
}

static void *destroy_busy_context(void *arg)
{
    late_write *w = arg;
    CUcontext c = NULL;
    CUstream s = NULL;
    if (D.CtxCreate(&c, NULL, 0, 0) != CUDA_SUCCESS || D.StreamCreate(&s, 0) != CUDA_SUCCESS ||
        D.MemAlloc(&w->at, w->size) != CUDA_SUCCESS ||
        fakecuda()->launch(s, write_when_told, w) != 0)
        return (void *)1;
    return D.CtxDestroy(c) == CUDA_SUCCESS ? NULL : (void *)2;
}

static void ctxdestroy_concurrent(void)
{
    start();
    const uint64_t before = fake_stats().bytes_in_use[0];
    late_write w = {.size = 10 * MiB};
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, destroy_busy_context, &w), 0);
    e2e_phase_wait(&concurrent, 1);
    CHECK_EQ(D.CtxDestroy(primary), CUDA_ERROR_INVALID_CONTEXT);
    e2e_phase_set(&concurrent, 2);
    void *why = NULL;
    pthread_join(t, &why);
    CHECK(why == NULL);
    CHECK(w.ran);
    CHECK(!w.faulted); /* its granules stayed mapped until its own destroy returned */
    CHECK_EQ(fake_stats().bytes_in_use[0], before); /* and then they went back */
}
static void reset_busy(void) { busy_teardown(false); }

/* What device `dev` may do with the mapping at ptr (cuMemGetAccess). */
static unsigned long long access_of(int dev, CUdeviceptr ptr)
{
    CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev};
    unsigned long long flags = 99;
    CHECK_EQ(D.MemGetAccess(&flags, &loc, ptr), CUDA_SUCCESS);
    return flags;
}

static void peers(void)
{
    start();
    CUdeviceptr a = 0, b = 0;
    CHECK_EQ(D.MemAlloc(&a, 3 * MiB), CUDA_SUCCESS); /* device 0's pool: two granules */
    CHECK_EQ(fake_stats().vmm_reserve_calls, 2); /* the trial granules', the pool's */
    CHECK_EQ(fake_stats().vmm_peer_grants, 0);
    CUcontext one = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&one, 1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(one), CUDA_SUCCESS);
    CHECK_EQ(access_of(1, a), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(D.CtxEnablePeerAccess(primary, 0), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().peer_enables, 1);
    CHECK_EQ(fake_stats().vmm_peer_grants, 2); /* each mapped granule */
    CHECK_EQ(access_of(1, a), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    const uint64_t grants = fake_stats().vmm_peer_grants;
    CHECK_EQ(D.CtxEnablePeerAccess(primary, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    CHECK_EQ(D.CtxEnablePeerAccess(primary, 1), CUDA_ERROR_INVALID_VALUE); /* flags must be 0 */
    /* cuda.h keeps the pairs per context: another context of device 1 may
     * enable access to the same peer; a context is not its own peer. */
    CUcontext two = NULL;
    CHECK_EQ(D.CtxCreate(&two, NULL, 0, 1), CUDA_SUCCESS); /* now current */
    CHECK_EQ(D.CtxEnablePeerAccess(primary, 0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxEnablePeerAccess(two, 0), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(D.CtxEnablePeerAccess(one, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED); /* same device */
    /* `two` gives its access up; device 1 keeps it while `one` holds it. */
    CHECK_EQ(D.CtxDisablePeerAccess(primary), CUDA_SUCCESS);
    CHECK_EQ(D.CtxDisablePeerAccess(primary), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    CHECK_EQ(access_of(1, a), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(D.CtxDestroy(two), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    const uint64_t granted = fake_stats().vmm_peer_grants;
    CHECK_EQ(granted, grants + 2); /* the second enable grants the two granules again */
    CHECK_EQ(D.MemAlloc(&b, 4 * MiB), CUDA_SUCCESS); /* maps more: granted as made */
    CHECK(fake_stats().vmm_peer_grants >= granted + 2);
    CHECK_EQ(access_of(1, b), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    fill_and_check(b, 4 * MiB, 8);
    /* The last context of device 1 gives its access up: every granule, and
     * the granules mapped later, are closed to device 1 again, as
     * cudaMalloc's memory would be. Device 0 keeps its own. */
    CHECK_EQ(D.CtxSetCurrent(one), CUDA_SUCCESS);
    CHECK_EQ(D.CtxDisablePeerAccess(primary), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    CHECK_EQ(access_of(1, a), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(access_of(1, b), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(access_of(0, b), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    const uint64_t before_c = fake_stats().vmm_peer_grants;
    CUdeviceptr c = 0;
    CHECK_EQ(D.MemAlloc(&c, 8 * MiB), CUDA_SUCCESS); /* maps more */
    CHECK_EQ(access_of(1, c), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(fake_stats().vmm_peer_grants, before_c);
    fill_and_check(b, 4 * MiB, 9);
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(b), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(c), CUDA_SUCCESS);
}

/* A context that enabled peer access goes without disabling it: cuda.h's
 * pairs of contexts go with it (cuCtxDestroy, or the primary context's
 * reset), so its device loses the access it gave, unless another of its
 * contexts still holds it. */
/* A new context of device 1 that enables access to device 0's primary
 * context; the primary is current again on return. */
static CUcontext enabling_context(void)
{
    CUcontext made = NULL;
    CHECK_EQ(D.CtxCreate(&made, NULL, 0, 1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxEnablePeerAccess(primary, 0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    return made;
}

/* Destroys `made` without disabling, and makes the primary current again. */
static void destroy_context(CUcontext made)
{
    CHECK_EQ(D.CtxDestroy(made), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
}

static void peers_gone(void)
{
    start();
    CUdeviceptr a = 0, b = 0;
    CHECK_EQ(D.MemAlloc(&a, 3 * MiB), CUDA_SUCCESS);
    /* A created context of device 1 enables access and is destroyed. */
    CUcontext made = enabling_context();
    CHECK_EQ(access_of(1, a), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    destroy_context(made);
    CHECK_EQ(access_of(1, a), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(D.MemAlloc(&b, 4 * MiB), CUDA_SUCCESS); /* maps more: not for device 1 */
    CHECK_EQ(access_of(1, b), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    /* Two contexts of device 1 enable it; the created one goes, the primary
     * keeps the device's access until its reset. */
    CUcontext one = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&one, 1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(one), CUDA_SUCCESS);
    CHECK_EQ(D.CtxEnablePeerAccess(primary, 0), CUDA_SUCCESS);
    destroy_context(enabling_context());
    CHECK_EQ(access_of(1, a), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(access_of(1, b), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(D.DevicePrimaryCtxReset(1), CUDA_SUCCESS);
    CHECK_EQ(access_of(1, a), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(access_of(1, b), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(access_of(0, b), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    fill_and_check(b, 4 * MiB, 10);
    /* A new context of device 1 may enable it again. */
    made = enabling_context();
    CHECK_EQ(access_of(1, b), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    destroy_context(made);
    CHECK_EQ(access_of(1, b), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(b), CUDA_SUCCESS);
}

static void capture(void)
{
    start();
    const uint64_t before = fake_stats().bytes_in_use[0];
    CUstream s = NULL;
    CHECK_EQ(D.StreamCreate(&s, 0), CUDA_SUCCESS);
    CUdeviceptr a = 0;
    CHECK_EQ(D.MemAlloc(&a, 20 * MiB), CUDA_SUCCESS);
    CHECK_EQ(D.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS); /* legal in relaxed mode */
    CHECK(fake_stats().bytes_in_use[0] >= before + 20 * MiB); /* still mapped */
    CHECK_EQ(trim(), 0);                                   /* not now either */
    CUgraph g = NULL;
    CHECK_EQ(D.StreamEndCapture(s, &g), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().capture_invalidations, 0);
    CHECK(trim() >= 20 * MiB); /* no capture now: the context is synchronised, then unmapped */
    CHECK(fake_stats().bytes_in_use[0] <= before + 2 * MiB);
    CHECK(e2e_touch_dies(a + 10 * MiB));
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
}

/* The pool's trial finds a call the driver refuses (FAKECUDA_VMM_REFUSE)
 * and the pool goes on cuMemAlloc, saying why; `call (code)` is what the
 * log must name. */
static void refused_with(const char *call_and_code)
{
    shim_log_reset();
    start();
    const uint64_t before = fake_stats().bytes_in_use[0];
    CUdeviceptr a = 0;
    CHECK_EQ(D.MemAlloc(&a, 3 * MiB), CUDA_SUCCESS);
    fakecuda_stats st = fake_stats();
    CHECK_EQ(st.vmm_reserve_calls, 1); /* the trial granules only */
    CHECK_EQ(st.vmm_create_calls, 2);
    CHECK(st.mem_alloc_calls >= 1);    /* the pool is on cuMemAlloc */
    CHECK(st.bytes_in_use[0] >= before + 3 * MiB);
    fill_and_check(a, 3 * MiB, 6);
    char log[4096], want[128];
    shim_log_lines(log, sizeof log);
    snprintf(want, sizeof want, "%s on two trial granules", call_and_code);
    if (!strstr(log, want)) {
        fprintf(stderr, "expected the fallback (%s) in the log, got:\n%s", want, log);
        e2e_failures++;
    }
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().vmm_unmap_calls, 2); /* the trial granules went back */
}

static void refused(void) { refused_with("cuMemSetAccess failed (801)"); }

/* A driver that sets access over one mapping at a time only: the pool sets
 * it over runs of granules, each its own mapping, so the trial does too. */
static void refused_multi(void) { refused_with("cuMemSetAccess failed (1)"); }

static void off(void)
{
    start();
    CUdeviceptr a = 0;
    CHECK_EQ(D.MemAlloc(&a, 3 * MiB), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().vmm_reserve_calls, 0);
    CHECK(fake_stats().mem_alloc_calls >= 1);
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
}

/* moves and spread: FAKECUDA_MEM=64MiB, BFCSHIM_MEM_FRACTION=0.5, so 32 MiB
 * mapped at once, filled with eight 4 MiB blocks, returned in b in address
 * order, each filled with 10 + its index. Taking the limit up front is
 * timed: the stats JSON says how long it took, and so does the pool's log
 * line, which must contain `made`. */
static fakecuda_stats fill_the_pool(CUdeviceptr b[8], const char *made)
{
    shim_log_reset();
    start();
    for (int i = 0; i < 8; i++)
        CHECK_EQ(D.MemAlloc(&b[i], 4 * MiB), CUDA_SUCCESS);
    const fakecuda_stats full = fake_stats();
    CHECK_EQ(full.vmm_create_calls, 2 + 16); /* the trial granules, then the limit */
    CHECK_EQ(full.vmm_reserve_calls, 2);     /* the trial granules', the pool's */
    CHECK(shim_stat_number("prealloc_us") > 0);
    char log[1024];
    shim_log_lines(log, sizeof log);
    CHECK(strstr(log, made) != NULL);
    for (int i = 1; i < 8; i++)
        for (int j = i; j > 0 && b[j] < b[j - 1]; j--) {
            CUdeviceptr t = b[j];
            b[j] = b[j - 1];
            b[j - 1] = t;
        }
    for (int i = 0; i < 8; i++)
        fill_and_check(b[i], 4 * MiB, (unsigned char)(10 + i));
    return full;
}

/* Frees every other block of fill_the_pool's, leaving four 4 MiB holes,
 * and allocates an 8 MiB block, which fits none of them: it lands in
 * address space past the mapped memory, and four of the holes' granules
 * move behind it. Returns the block; the blocks left keep their contents. */
static CUdeviceptr block_past_the_holes(const CUdeviceptr b[8])
{
    for (int i = 0; i < 8; i += 2)
        CHECK_EQ(D.MemFree(b[i]), CUDA_SUCCESS);
    CUdeviceptr big = 0;
    CHECK_EQ(D.MemAlloc(&big, 8 * MiB), CUDA_SUCCESS);
    fill_and_check(big, 8 * MiB, 99);
    for (int i = 1; i < 8; i += 2) {
        const unsigned char *p = (const unsigned char *)(uintptr_t)b[i];
        CHECK(p[0] == 10 + i && p[4 * MiB - 1] == 10 + i);
    }
    CHECK_EQ(shim_stat_number("moved_bytes_total"), (long long)(8 * MiB));
    /* the move happened in a timed pressure window */
    CHECK(shim_stat_number("num_pressure_maps") >= 1);
    return big;
}

static void moves(void)
{
    CUdeviceptr b[8];
    const fakecuda_stats full = fill_the_pool(b, "preallocated over virtual memory (taken in ");
    /* The pool places them as one region would, side by side, so that
     * every other one leaves a hole. */
    for (int i = 0; i < 8; i++)
        CHECK_EQ(b[i], b[0] + (CUdeviceptr)i * 4 * MiB);
    /* The pool reserves overflow address space for the block. */
    const CUdeviceptr big = block_past_the_holes(b);
    const fakecuda_stats after = fake_stats();
    CHECK_EQ(after.vmm_create_calls, full.vmm_create_calls); /* nothing new was made */
    CHECK_EQ(after.vmm_retain_calls, 4);
    CHECK_EQ(after.vmm_unmap_calls - full.vmm_unmap_calls, 4);
    CHECK(big < b[0] || big >= b[0] + 32 * MiB);
    CHECK_EQ(after.vmm_reserve_calls, 3); /* and the overflow's, said once (info) */
    char log[4096];
    shim_log_lines(log, sizeof log);
    const char *said = strstr(log, "free memory now moves to where blocks land");
    CHECK(said != NULL && strstr(said + 1, "free memory now moves") == NULL);
    CHECK_EQ(after.bytes_in_use[0], full.bytes_in_use[0]);
    /* Two of the holes are address space now (the higher ones: equal
     * sizes, the higher first). */
    CHECK(e2e_touch_dies(b[6] + MiB));
    CHECK(e2e_touch_dies(b[4] + MiB));
    CHECK_EQ(shim_stat_number("released_bytes_total"), (long long)(8 * MiB));
    CHECK_EQ(shim_stat_number("pool_bytes"), (long long)(32 * MiB));
    /* A second overflow needs no new reservation and says nothing more. */
    CUdeviceptr big2 = 0;
    CHECK_EQ(D.MemAlloc(&big2, 8 * MiB), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().vmm_reserve_calls, 3);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
    CHECK_EQ(D.MemFree(big2), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(big), CUDA_SUCCESS);
    for (int i = 1; i < 8; i += 2)
        CHECK_EQ(D.MemFree(b[i]), CUDA_SUCCESS);
}

static void growth_moves(void)
{
    start();
    const bool off = getenv("BFCSHIM_GROWTH_HEADROOM") != NULL;
    CUdeviceptr b[8];
    for (int i = 0; i < 8; i++) {
        CHECK_EQ(D.MemAlloc(&b[i], 4 * MiB), CUDA_SUCCESS);
        fill_and_check(b[i], 4 * MiB, (unsigned char)(10 + i));
    }
    for (int i = 1; i < 8; i++)
        CHECK_EQ(b[i], b[0] + (CUdeviceptr)i * 4 * MiB); /* one pile */
    CHECK_EQ(shim_stat_number("pool_bytes"), (long long)(32 * MiB));
    const fakecuda_stats full = fake_stats();
    for (int i = 0; i < 8; i += 2)
        CHECK_EQ(D.MemFree(b[i]), CUDA_SUCCESS);
    CUdeviceptr big = 0;
    CHECK_EQ(D.MemAlloc(&big, 8 * MiB), CUDA_SUCCESS);
    CHECK_EQ(big, b[7] + 4 * MiB);
    fill_and_check(big, 8 * MiB, 99);
    for (int i = 1; i < 8; i += 2) {
        const unsigned char *p = (const unsigned char *)(uintptr_t)b[i];
        CHECK(p[0] == 10 + i && p[4 * MiB - 1] == 10 + i);
    }
    const fakecuda_stats after = fake_stats();
    CHECK_EQ(shim_stat_number("num_growth_moves"), off ? 0 : 1);
    CHECK_EQ(shim_stat_number("num_limit_moves"), 0); /* reported; no block needed one */
    CHECK_EQ(after.vmm_create_calls - full.vmm_create_calls, off ? 4 : 1);
    CHECK_EQ(after.vmm_retain_calls - full.vmm_retain_calls, off ? 0 : 3);
    CHECK_EQ(shim_stat_number("moved_bytes_total"), (long long)(off ? 0 : 6 * MiB));
    CHECK_EQ(shim_stat_number("pool_bytes"), (long long)((off ? 40 : 34) * MiB));
    CHECK_EQ(after.bytes_in_use[0] - full.bytes_in_use[0], (off ? 8 : 2) * MiB);
    /* The highest hole went whole, the next its top granule. */
    CHECK_EQ(e2e_touch_dies(b[6] + MiB), !off);
    CHECK_EQ(e2e_touch_dies(b[4] + 3 * MiB), !off);
    CHECK(!e2e_touch_dies(b[4] + MiB));
    CHECK_EQ(D.MemFree(big), CUDA_SUCCESS);
    for (int i = 1; i < 8; i += 2)
        CHECK_EQ(D.MemFree(b[i]), CUDA_SUCCESS);
}

/* As moves, spread out (BFCSHIM_VMM_LAYOUT=spread): 32 MiB mapped at once
 * in a reservation of 64 MiB, placed by the rules of virtual memory. */
static void spread(void)
{
    CUdeviceptr b[8];
    const fakecuda_stats full = fill_the_pool(
        b, "preallocated over virtual memory, spread over twice its limit of address space "
           "(taken in ");
    CHECK_EQ(shim_stat_number("vmm_spread"), 1);
    CHECK_EQ(shim_stat_number("reserved_bytes"), (long long)(64 * MiB));
    CHECK_EQ(shim_stat_number("pool_bytes"), (long long)(32 * MiB));
    /* The block lands in address space the pool already has. */
    const CUdeviceptr big = block_past_the_holes(b);
    const fakecuda_stats after = fake_stats();
    CHECK_EQ(after.vmm_reserve_calls, 2);
    CHECK_EQ(after.vmm_create_calls, full.vmm_create_calls);
    CHECK_EQ(after.bytes_in_use[0], full.bytes_in_use[0]);
    char log[4096];
    shim_log_lines(log, sizeof log);
    CHECK(strstr(log, "free memory now moves") == NULL);
    CHECK_EQ(D.MemFree(big), CUDA_SUCCESS);
    for (int i = 1; i < 8; i += 2)
        CHECK_EQ(D.MemFree(b[i]), CUDA_SUCCESS);
}

/* FAKECUDA_MEM=64MiB with 48 MiB used by another process,
 * BFCSHIM_MEM_FRACTION=0.5: a 32 MiB preallocated pool on a device with
 * 16 MiB free. The user asked for the memory up front and does not get it
 * all: one warning says so (over virtual memory nothing is mapped up front;
 * one region takes what the device has), the start-up time reads 0 when
 * nothing was taken, and allocations are served as memory allows. */
static void short_of_memory(void)
{
    const bool vmm = getenv("BFCSHIM_VMM") == NULL;
    shim_log_reset();
    start();
    CUdeviceptr a = 0;
    CHECK_EQ(D.MemAlloc(&a, 4 * MiB), CUDA_SUCCESS);
    fill_and_check(a, 4 * MiB, 7);
    CHECK_ONE_LOG_LINE(vmm ? "could not take the 32.0 MiB pool up front"
                           : "took only 16.0 MiB of the 32.0 MiB pool up front");
    CHECK(vmm ? shim_stat_number("prealloc_us") == 0 : shim_stat_number("prealloc_us") > 0);
    CUdeviceptr b = 0;
    CHECK_EQ(D.MemAlloc(&b, 8 * MiB), CUDA_SUCCESS);
    fill_and_check(b, 8 * MiB, 8);
    fill_and_check(a, 4 * MiB, 7);
    CHECK_EQ(D.MemFree(b), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
}

/* FAKECUDA_VMM_GRANULARITY=64KiB, BFCSHIM_ALIGNMENT=1MiB, a 30 MiB pool
 * preallocated: the blocks' alignment is coarser than the device's
 * granule, so the pool maps in 1 MiB granules (a multiple of the device's,
 * which cuMemCreate and cuMemMap take). It takes its whole limit up front,
 * without a warning, and serves from it. */
static void coarse_alignment(void)
{
    shim_log_reset();
    start();
    CUdeviceptr a = 0;
    CHECK_EQ(D.MemAlloc(&a, 4 * MiB), CUDA_SUCCESS);
    if (!a)
        return;
    fill_and_check(a, 4 * MiB, 9);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
    CHECK_EQ(shim_stat_number("pool_bytes"), (long long)(30 * MiB));
    CHECK(shim_stat_number("prealloc_us") > 0);
    CHECK_EQ(fake_stats().vmm_reserve_calls, 2); /* the trial granules', the pool's */
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
}

int main(int argc, char **argv)
{
    const char *s = argc > 1 ? argv[1] : "";
    static const struct {
        const char *name;
        void (*fn)(void);
    } scenarios[] = {{"grow", grow},
                     {"access", access_run},
                     {"release", release},
                     {"threshold", threshold},
                     {"ctxdestroy", ctxdestroy},
                     {"ctxdestroy-threads", ctxdestroy_threads},
                     {"ctxdestroy-busy", ctxdestroy_busy},
                     {"ctxdestroy-concurrent", ctxdestroy_concurrent},
                     {"immediate-other-device", immediate_other_device},
                     {"trim-vs-teardown", trim_vs_teardown},
                     {"release-vs-stuck-trim", release_vs_stuck_trim},
                     {"reset-busy", reset_busy},
                     {"peers", peers},
                     {"peers-gone", peers_gone},
                     {"capture", capture},
                     {"refused", refused},
                     {"refused-multi", refused_multi},
                     {"off", off},
                     {"moves", moves},
                     {"growth-moves", growth_moves},
                     {"growth-moves-off", growth_moves},
                     {"spread", spread},
                     {"short", short_of_memory},
                     {"short-off", short_of_memory},
                     {"coarse-alignment", coarse_alignment}};
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
        if (strcmp(s, scenarios[i].name) == 0) {
            scenarios[i].fn();
            return e2e_done(s);
        }
    fprintf(stderr, "usage: e2e_vmm_pool SCENARIO (");
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
        fprintf(stderr, "%s%s", i ? "|" : "", scenarios[i].name);
    fprintf(stderr, ")\n");
    return 2;
}
