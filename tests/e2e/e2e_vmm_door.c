/*
 * e2e_vmm_door.c - the virtual memory door (shim/lib/door_vmm.c) seen by a
 * program that allocates as XLA 0.11.2 does: the driver opened with dlopen,
 * every function found with dlsym on that handle (or cuGetProcAddress), and
 * each buffer its own physical allocation (XLA_PYTHON_CLIENT_ALLOCATOR=
 * platform): granularity, cuMemCreate asking for a file-descriptor handle,
 * cuMemAddressReserve, cuMemMap, cuMemSetAccess; at a delete
 * cuCtxSynchronize, cuMemUnmap, cuMemRelease, cuMemAddressFree. The door
 * lends that memory the pool's limit (bytes_lent in the statistics) while
 * it lives, and only then; with BFCSHIM_VMM_DOOR=count it leaves it around
 * the pool and counts it (passthrough_vmm_*). Scenarios:
 *
 *   xla-platform  buffers of several sizes made and deleted in XLA's order:
 *                 the loan follows the live physical bytes at every step,
 *                 its peak and the number of creates too; a handle retained
 *                 from an address (cuMemRetainAllocationHandle, as NCCL's
 *                 buffer registration does) keeps its memory counted until
 *                 that reference is released too; contents survive
 *   procaddr      the same create and release reached through
 *                 cuGetProcAddress_v2, as PyTorch's expandable segments do
 *                 (through cudaGetDriverEntryPointByVersion)
 *   hooks-off     (BFCSHIM_DRIVER_HOOKS=0) nothing is counted
 *   saturate      hundreds of references to one allocation: counted until
 *                 the last is released
 *   (each of the above -count: the same under BFCSHIM_VMM_DOOR=count)
 *   budget        one limit for both doors: a preallocated pool gives back
 *                 free memory so that a create larger than what the device
 *                 has left succeeds (XLA's preallocation beside the
 *                 shim's: without the loan it failed); a create or a
 *                 cuMemAlloc past the limit fails with out of memory, the
 *                 pool intact, and succeeds once the other is released;
 *                 cuMemGetInfo and the statistics' free figures count
 *                 the loan
 *   race-create   (call_window.so preloaded ahead of the shim) a create in
 *                 another thread that the driver answers with the handle
 *                 value a release just gave back, before the release's
 *                 own bookkeeping ran: the new allocation keeps its loan
 *   race-retain   a release of the create's reference between a retain's
 *                 driver call and its bookkeeping: the retained reference
 *                 keeps the memory, and its loan
 *   threads       (a small limit) threads making and deleting buffers,
 *                 retaining and releasing references, while others
 *                 cuMemAlloc/cuMemFree, trim and ask cuMemGetInfo: every
 *                 loan ends, the limit holds throughout (for TSan)
 *   reset         memory made by cuMemCreate outlives a primary context's
 *                 reset (cuda.h): the context's next pool still counts it
 *   reset-alloc   (a 512 MiB limit) the same, the next pool made by a
 *                 cuMemAlloc: it counts the orphan from its first
 *                 allocation, not only at the program's next create
 *                 (found by an audit)
 *   death-alloc   (a 512 MiB limit) a created context's pool lends and
 *                 dies while the primary's pool exists, and the program
 *                 then only allocates: the primary's pool counts the
 *                 orphan from its next allocation (found by an audit)
 *   two-contexts  ... and a created context's destruction, after the
 *                 primary context's pool had lent too: the primary's pool
 *                 takes over the dead pool's loan at its next create
 *   create-takeover  the created context destroyed, and the primary's
 *                 pool's takeover scan made, between the driver's answer
 *                 to a create in it and the door's record of the create:
 *                 the record's loan is still taken over (found by an
 *                 audit)
 *   fork-adopt    a fork while that takeover's loan waits for fences: the
 *                 fork handler takes the streams' lock, then the door's;
 *                 the loan must not wait under the door's lock (the test's
 *                 own pthread_rwlock_rdlock holds the loan at the streams'
 *                 lock until the fork has begun; both waited for good)
 *   trim-growing  the pool the door made growing (the program's own memory
 *                 came first) gives its idle granules back at the program's
 *                 cuMemPoolTrimTo(default pool, 0) (found by an audit)
 *   retain-pooled cuMemRetainAllocationHandle on a pooled block (cuMemAlloc
 *                 memory to the program): CUDA_ERROR_INVALID_VALUE, as the
 *                 driver answers, never the handle of the pool's granule
 *   bad-create    creates the driver refuses (flags, type, a size off the
 *                 granularity, within and past the limit): its own code,
 *                 nothing lent, the pool untouched
 * (the last four were found by an audit; each failed before its fix)
 */
#include <cuda.h>
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "e2e_cu.h"
#include "shim_stats.h"

#define MiB ((size_t)1 << 20)

static size_t gran;

static CUmemAllocationProp exportable_on(int dev)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; /* as XLA asks */
    return p;
}

static void start(void)
{
    e2e_cu_load();
    e2e_cu_primary_current(0);
    CUmemAllocationProp p = exportable_on(0);
    CHECK_EQ(D.MemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
             CUDA_SUCCESS);
    CHECK(gran > 0);
}

typedef struct buffer {
    CUdeviceptr at;
    size_t size; /* rounded up to the granularity, as XLA rounds */
    CUmemGenericAllocationHandle h;
} buffer;

static buffer make(size_t want)
{
    buffer b = {0, (want + gran - 1) / gran * gran, 0};
    CUmemAllocationProp p = exportable_on(0);
    CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK_EQ(D.MemCreate(&b.h, b.size, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemAddressReserve(&b.at, b.size, gran, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemMap(b.at, b.size, 0, b.h, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemSetAccess(b.at, b.size, &a, 1), CUDA_SUCCESS);
    return b;
}

static void delete(buffer *b)
{
    CUresult (*sync)(void) = (CUresult (*)(void))e2e_dlsym(e2e_open_libcuda(), "cuCtxSynchronize");
    CHECK_EQ(sync(), CUDA_SUCCESS);
    CHECK_EQ(D.MemUnmap(b->at, b->size), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(b->h), CUDA_SUCCESS);
    CHECK_EQ(D.MemAddressFree(b->at, b->size), CUDA_SUCCESS);
    *b = (buffer){0};
}

static long long counted(void) { return shim_vmm_door_bytes(); }
static long long counted_peak(void) { return shim_vmm_door_peak(); }
static long long creates(void) { return shim_vmm_door_creates(); }

static void xla_platform(void)
{
    start();
    static const size_t wants[] = {1, 3 * MiB, 40 * MiB, 2 * MiB, 100 * MiB + 7};
    enum { N = sizeof wants / sizeof wants[0] };
    buffer b[N];
    long long live = 0, peak = 0;
    CHECK_EQ(counted(), 0);
    for (int i = 0; i < N; i++) {
        b[i] = make(wants[i]);
        live += (long long)b[i].size;
        peak = live > peak ? live : peak;
        CHECK_EQ(counted(), live);
        memset((void *)(uintptr_t)b[i].at, 0x40 + i, b[i].size);
    }
    CHECK_EQ(creates(), N);
    const CUmemGenericAllocationHandle first = b[0].h;
    /* NCCL's registration of a user buffer: a reference from an address. */
    CUmemGenericAllocationHandle again = 0;
    CHECK_EQ(D.MemRetainAllocationHandle(&again, (void *)(uintptr_t)(b[2].at + MiB)),
             CUDA_SUCCESS);
    CHECK_EQ(again, b[2].h);
    CHECK_EQ(counted(), live); /* the same memory, not more */
    for (int i = 0; i < N; i += 2) { /* every other buffer deleted */
        size_t size = b[i].size;
        delete(&b[i]);
        if (i != 2)
            live -= (long long)size;
        CHECK_EQ(counted(), live);
    }
    /* b[2]'s memory lives on in the retained reference (the driver keeps
     * it too: it may be mapped again); its release ends it. */
    CHECK_EQ(D.MemRelease(again), CUDA_SUCCESS);
    live -= 40 * MiB;
    CHECK_EQ(counted(), live);
    for (int i = 1; i < N; i += 2) {
        const unsigned char *bytes = (const unsigned char *)(uintptr_t)b[i].at;
        CHECK(bytes[0] == 0x40 + i && bytes[b[i].size - 1] == 0x40 + i);
        live -= (long long)b[i].size;
        delete(&b[i]);
        CHECK_EQ(counted(), live);
    }
    CHECK_EQ(counted(), 0);
    CHECK_EQ(counted_peak(), peak);
    /* A release the driver refuses (a handle already gone) changes nothing. */
    CHECK(D.MemRelease(first) != CUDA_SUCCESS);
    CHECK_EQ(counted(), 0);
}

static void procaddr(void)
{
    start();
    CUresult (*get)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
        (CUresult (*)(const char *, void **, int, cuuint64_t,
                      CUdriverProcAddressQueryResult *))e2e_dlsym(e2e_open_libcuda(),
                                                                  "cuGetProcAddress_v2");
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long) = NULL;
    CUresult (*release)(CUmemGenericAllocationHandle) = NULL;
    CHECK_EQ(get("cuMemCreate", (void **)&create, 12000, CU_GET_PROC_ADDRESS_DEFAULT, NULL),
             CUDA_SUCCESS);
    CHECK_EQ(get("cuMemRelease", (void **)&release, 12000, CU_GET_PROC_ADDRESS_DEFAULT, NULL),
             CUDA_SUCCESS);
    CUmemAllocationProp p = exportable_on(0);
    CUmemGenericAllocationHandle h = 0;
    CHECK_EQ(create(&h, 10 * gran, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(counted(), (long long)(10 * gran));
    CHECK_EQ(release(h), CUDA_SUCCESS);
    CHECK_EQ(counted(), 0);
    CHECK_EQ(creates(), 1);
}

/* (found by an audit) 300 retained references and 256 releases: 45 live,
 * the memory counted until the last. */
static void saturate(void)
{
    start();
    buffer b = make(4 * MiB);
    for (int i = 0; i < 300; i++) {
        CUmemGenericAllocationHandle h = 0;
        CHECK_EQ(D.MemRetainAllocationHandle(&h, (void *)(uintptr_t)b.at), CUDA_SUCCESS);
    }
    for (int i = 0; i < 256; i++) /* 301 references, 256 released: 45 live */
        CHECK_EQ(D.MemRelease(b.h), CUDA_SUCCESS);
    long long c = counted();
    fprintf(stderr, "45 references live, counted %lld of %zu\n", c, b.size);
    CHECK_EQ(c, (long long)b.size);
}

static void hooks_off(void)
{
    start();
    buffer b = make(8 * MiB);
    CHECK_EQ(shim_stat_number("passthrough_vmm_bytes"), 0);
    CHECK_EQ(shim_stat_number("bytes_lent"), -1); /* no pool was made */
    delete(&b);
    CHECK_EQ(shim_stat_number("passthrough_vmm_creates"), 0);
}

static void budget(void)
{
    start();
    /* A cuMemAlloc first: the pool takes its limit (768 MiB of the fake's
     * 1 GiB) up front. */
    CUdeviceptr small = 0;
    CHECK_EQ(D.MemAlloc(&small, MiB), CUDA_SUCCESS);
    const long long limit = shim_stat_number("bytes_limit");
    CHECK_EQ(limit, 768 * (long long)MiB);
    CHECK_EQ(shim_stat_number("pool_bytes"), limit);
    /* XLA's preallocation: more than the device has left (256 MiB) but
     * within the limit. The pool gives back what the loan needs. */
    buffer big = make(512 * MiB);
    CHECK_EQ(counted(), (long long)(512 * MiB));
    CHECK(shim_stat_number("pool_bytes") <= limit - (long long)(512 * MiB));
    memset((void *)(uintptr_t)big.at, 0x77, big.size);
    size_t free_b = 0, total_b = 0;
    CHECK_EQ(D.MemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK((long long)free_b <= limit - (long long)(512 * MiB) - (long long)MiB);
    /* So do the statistics: the largest block the pool could hand out now
     * (it was the free address space before: 767 MiB). */
    CHECK(shim_stat_number("largest_free_block_bytes") <= limit - (long long)(513 * MiB));
    CHECK(shim_stat_number("free_bytes") <= limit - (long long)(513 * MiB));
    CHECK(shim_stat_number("free_address_space_bytes") >= (long long)(766 * MiB));
    /* Past the limit, either door: out of memory, nothing changed. */
    CUmemAllocationProp p = exportable_on(0);
    CUmemGenericAllocationHandle h = 0;
    CHECK_EQ(D.MemCreate(&h, 300 * MiB, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(shim_stat_number("vmm_door_refused"), 1);
    CUdeviceptr mid = 0;
    CHECK_EQ(D.MemAlloc(&mid, 300 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(counted(), (long long)(512 * MiB));
    CHECK(((const unsigned char *)(uintptr_t)big.at)[big.size - 1] == 0x77);
    /* The create's memory goes: the limit is the pool's again. */
    delete(&big);
    CHECK_EQ(counted(), 0);
    CHECK_EQ(D.MemAlloc(&mid, 300 * MiB), CUDA_SUCCESS);
    CHECK_EQ(D.MemCreate(&h, 300 * MiB, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(counted(), (long long)(300 * MiB));
    CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(mid), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(small), CUDA_SUCCESS);
    CHECK_EQ(counted(), 0);
    CHECK_EQ(counted_peak(), (long long)(512 * MiB));
}

/* ---- races in the door's bookkeeping (call_window.so) ---------------------- */

static struct {
    void (*arm)(void (*)(void *), void *);
    int (*fired)(void);
} W;

static void window_load(void)
{
    *(void **)&W.arm = dlsym(RTLD_DEFAULT, "call_window_arm");
    *(void **)&W.fired = dlsym(RTLD_DEFAULT, "call_window_fired");
    if (!W.arm || !W.fired) {
        fprintf(stderr, "needs call_window.so preloaded: skipped\n");
        exit(77);
    }
}

/* Every call of the door once, so that the fake's first-call bookkeeping
 * (a lock of its own) is behind us when the window is armed. */
static void warm_up(void)
{
    buffer w = make(4 * MiB);
    CUmemGenericAllocationHandle r = 0;
    CHECK_EQ(D.MemRetainAllocationHandle(&r, (void *)(uintptr_t)w.at), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(r), CUDA_SUCCESS);
    delete(&w);
    CHECK_EQ(counted(), 0);
}

static CUmemGenericAllocationHandle made_in_window;

static void create_in_window(void *arg)
{
    CUmemAllocationProp p = exportable_on(0);
    CHECK_EQ(D.MemCreate(&made_in_window, *(size_t *)arg, &p, 0), CUDA_SUCCESS);
}

/* (found by an audit) cuMemRelease passes the call to the driver, then
 * takes the door's lock to end the loan. A create in between (another
 * thread, another device's allocator) that the driver answers with the
 * value it just freed finds the old record still there: its own loan ends
 * at once ("host memory ran out"), and the old record's later removal ends
 * the old one: a live allocation no pool counts. The fake's handles are
 * its records' addresses, which glibc hands out again when the size's
 * thread cache is full (the test fills it). */
static void race_create(void)
{
    window_load();
    start();
    warm_up();
    size_t size = 4 * MiB;
    CUmemAllocationProp p = exportable_on(0);
    CUmemGenericAllocationHandle h = 0;
    CHECK_EQ(D.MemCreate(&h, size, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(counted(), (long long)size);
    /* the fake's record: 32 bytes; fill that size's thread cache so that
     * its free goes to a bin calloc takes from */
    void *fill[7];
    for (int i = 0; i < 7; i++)
        fill[i] = malloc(32);
    for (int i = 0; i < 7; i++)
        free(fill[i]);
    W.arm(create_in_window, &size);
    CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS);
    const bool fired = W.fired();
    if (!fired) /* no lock taken after the driver answered: no window */
        create_in_window(&size);
    else if (made_in_window != h) {
        fprintf(stderr, "the driver did not hand the released value out again: skipped\n");
        exit(77);
    }
    fprintf(stderr, "released 0x%llx, created 0x%llx %s: counted %lld of %zu\n",
            (unsigned long long)h, (unsigned long long)made_in_window,
            fired ? "in the window" : "after the release", counted(), size);
    CHECK_EQ(counted(), (long long)size); /* the new allocation is live */
    CHECK_EQ(D.MemRelease(made_in_window), CUDA_SUCCESS);
    CHECK_EQ(counted(), 0);
}

static void release_in_window(void *arg)
{
    CHECK_EQ(D.MemRelease(*(CUmemGenericAllocationHandle *)arg), CUDA_SUCCESS);
}

/* (found by an audit) cuMemRetainAllocationHandle passes the call to the
 * driver, then counts the reference. A release of the last counted
 * reference in between (another thread: NCCL's deregistration, the
 * framework's free) ends the loan and drops the record, so the retained
 * reference, which keeps the memory alive, is never counted. */
static void race_retain(void)
{
    window_load();
    start();
    warm_up();
    buffer b = make(4 * MiB);
    CHECK_EQ(counted(), (long long)b.size);
    CUmemGenericAllocationHandle again = 0;
    W.arm(release_in_window, &b.h);
    CHECK_EQ(D.MemRetainAllocationHandle(&again, (void *)(uintptr_t)b.at), CUDA_SUCCESS);
    if (!W.fired())
        release_in_window(&b.h);
    CHECK_EQ(again, b.h);
    /* the retained reference and the mapping hold the memory */
    fprintf(stderr, "one reference live after the retain and the release: counted %lld of %zu\n",
            counted(), b.size);
    CHECK_EQ(counted(), (long long)b.size);
    CHECK_EQ(D.MemUnmap(b.at, b.size), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(again), CUDA_SUCCESS);
    CHECK_EQ(D.MemAddressFree(b.at, b.size), CUDA_SUCCESS);
    CHECK_EQ(counted(), 0);
}

/* ---- threads ------------------------------------------------------------- */

enum { ROUNDS = 300 };
static atomic_int door_refused, pool_refused, over_limit;

/* One snapshot of the statistics (one pool: the fields of one lock hold). */
static void limit_holds(void)
{
    static _Thread_local char json[1 << 16];
    size_t (*stats_json)(char *, size_t) =
        (size_t (*)(char *, size_t))dlsym(RTLD_DEFAULT, "bfcshim_stats_json");
    if (!stats_json || !stats_json(json, sizeof json))
        return;
    long long lent = shim_stats_field(json, "bytes_lent");
    long long pool = shim_stats_field(json, "pool_bytes");
    long long limit = shim_stats_field(json, "bytes_limit");
    if (lent >= 0 && pool >= 0 && limit > 0 && lent + pool > limit)
        atomic_fetch_add(&over_limit, 1);
}

static void *door_thread(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    e2e_cu_primary_current(0);
    for (int i = 0; i < ROUNDS; i++) {
        size_t want = (size_t)(1 + rand_r(&seed) % 4) * gran;
        CUmemAllocationProp p = exportable_on(0);
        CUmemGenericAllocationHandle h = 0;
        CUresult r = D.MemCreate(&h, want, &p, 0);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            atomic_fetch_add(&door_refused, 1);
            continue;
        }
        CHECK_EQ(r, CUDA_SUCCESS);
        CUdeviceptr at = 0;
        CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CHECK_EQ(D.MemAddressReserve(&at, want, gran, 0, 0), CUDA_SUCCESS);
        CHECK_EQ(D.MemMap(at, want, 0, h, 0), CUDA_SUCCESS);
        CHECK_EQ(D.MemSetAccess(at, want, &a, 1), CUDA_SUCCESS);
        CUmemGenericAllocationHandle again = 0;
        if (i % 3 == 0)
            CHECK_EQ(D.MemRetainAllocationHandle(&again, (void *)(uintptr_t)at), CUDA_SUCCESS);
        limit_holds();
        CHECK_EQ(D.MemUnmap(at, want), CUDA_SUCCESS);
        CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS);
        if (again)
            CHECK_EQ(D.MemRelease(again), CUDA_SUCCESS);
        CHECK_EQ(D.MemAddressFree(at, want), CUDA_SUCCESS);
    }
    return NULL;
}

static void *pool_thread(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    e2e_cu_primary_current(0);
    CUdeviceptr live[4] = {0};
    for (int i = 0; i < ROUNDS; i++) {
        int k = i % 4;
        if (live[k])
            CHECK_EQ(D.MemFree(live[k]), CUDA_SUCCESS);
        live[k] = 0;
        CUresult r = D.MemAlloc(&live[k], (size_t)(1 + rand_r(&seed) % 6) * MiB);
        if (r == CUDA_ERROR_OUT_OF_MEMORY)
            atomic_fetch_add(&pool_refused, 1);
        else
            CHECK_EQ(r, CUDA_SUCCESS);
        limit_holds();
    }
    for (int k = 0; k < 4; k++)
        if (live[k])
            CHECK_EQ(D.MemFree(live[k]), CUDA_SUCCESS);
    return NULL;
}

static void *trim_thread(void *arg)
{
    (void)arg;
    e2e_cu_primary_current(0);
    size_t (*trim)(void) = (size_t (*)(void))dlsym(RTLD_DEFAULT, "bfcshim_trim");
    for (int i = 0; i < ROUNDS; i++) {
        size_t f = 0, t = 0;
        CHECK_EQ(D.MemGetInfo(&f, &t), CUDA_SUCCESS);
        CHECK(f <= t);
        if (trim && i % 8 == 0)
            trim();
        limit_holds();
    }
    return NULL;
}

static void threads(void)
{
    start();
    CUdeviceptr first = 0; /* the pool first, preallocated: loans give back */
    CHECK_EQ(D.MemAlloc(&first, MiB), CUDA_SUCCESS);
    pthread_t t[5];
    CHECK_EQ(pthread_create(&t[0], NULL, door_thread, (void *)1), 0);
    CHECK_EQ(pthread_create(&t[1], NULL, door_thread, (void *)2), 0);
    CHECK_EQ(pthread_create(&t[2], NULL, pool_thread, (void *)3), 0);
    CHECK_EQ(pthread_create(&t[3], NULL, pool_thread, (void *)4), 0);
    CHECK_EQ(pthread_create(&t[4], NULL, trim_thread, NULL), 0);
    for (int i = 0; i < 5; i++)
        CHECK_EQ(pthread_join(t[i], NULL), 0);
    CHECK_EQ(D.MemFree(first), CUDA_SUCCESS);
    fprintf(stderr, "refused: %d creates, %d cuMemAlloc; limit passed %d times\n",
            atomic_load(&door_refused), atomic_load(&pool_refused), atomic_load(&over_limit));
    CHECK_EQ(counted(), 0);
    CHECK_EQ(atomic_load(&over_limit), 0);
}

/* (found by an audit) "cuCtxDestroy will not destroy memory allocations by
 * cuMemCreate()", and neither does a primary context's reset: the program's
 * buffer lives on, but its loan stays with the forgotten pool, and the
 * context's next pool lends its whole limit again. Two 512 MiB creates
 * then live at once under a 768 MiB limit. */
static void reset(void)
{
    start();
    buffer big = make(512 * MiB);
    CHECK_EQ(counted(), (long long)(512 * MiB));
    CUdevice d;
    CHECK_EQ(D.DeviceGet(&d, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxReset(d), CUDA_SUCCESS);
    e2e_cu_primary_current(0);
    memset((void *)(uintptr_t)big.at, 0x5a, big.size); /* still the program's */
    CUmemAllocationProp p = exportable_on(0);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = D.MemCreate(&h, 512 * MiB, &p, 0);
    fprintf(stderr, "a second 512 MiB create beside the first, limit %lld: %d; lent %lld\n",
            shim_stat_number("bytes_limit"), (int)r, shim_stat_number("bytes_lent"));
    if (r == CUDA_SUCCESS)
        CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS);
    CHECK_EQ(r, CUDA_ERROR_OUT_OF_MEMORY);
    delete(&big);
}

/* With a 512 MiB limit, and the program's 256 MiB buffer big outliving the
 * pool that lent it: the current context's pool counts it (a 384 MiB
 * allocation is out of memory, 128 MiB is not), and once big is deleted
 * the whole limit is the pool's again. */
static void orphan_counted(buffer big, const char *what)
{
    memset((void *)(uintptr_t)big.at, 0x5a, big.size); /* still the program's */
    CUdeviceptr p = 0;
    CUresult r = D.MemAlloc(&p, 384 * MiB);
    fprintf(stderr, "cuMemAlloc of 384 MiB beside the 256 MiB %s, limit 512 MiB: %d\n",
            what, (int)r);
    if (r == CUDA_SUCCESS)
        CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    CHECK_EQ(r, CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(D.MemAlloc(&p, 128 * MiB), CUDA_SUCCESS); /* what is left of the limit */
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    delete(&big); /* its loan ends: the whole limit is the pool's again */
    CHECK_EQ(D.MemAlloc(&p, 384 * MiB), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
}

/* reset-alloc (BFCSHIM_MEM_LIMIT=512MiB): the same orphan, but the
 * context's next pool is made by a plain cuMemAlloc, not by a create: it
 * must count the orphan from its first allocation on, not only once the
 * program creates again (found by an audit: the new pool served its whole
 * limit beside the 256 MiB the program still held). */
static void reset_alloc(void)
{
    start();
    buffer big = make(256 * MiB);
    CHECK_EQ(shim_stat_number("bytes_lent"), (long long)(256 * MiB));
    CUdevice d;
    CHECK_EQ(D.DeviceGet(&d, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxReset(d), CUDA_SUCCESS);
    e2e_cu_primary_current(0);
    orphan_counted(big, "create");
}

static CUmemAllocationProp plain_on(int dev)
{
    CUmemAllocationProp p = exportable_on(dev);
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    return p;
}

/* death-alloc (BFCSHIM_MEM_LIMIT=512MiB): the pool that should count the
 * orphan already exists when its lender dies (the primary context's, made
 * by a cuMemAlloc), and the program only allocates after: the orphan counts
 * from the live pool's next allocation (found by an audit: the primary's
 * pool served its whole limit beside the 256 MiB until the program's next
 * create). */
static void death_alloc(void)
{
    start();
    CUcontext primary = e2e_cu_primary_current(0);
    CUdeviceptr p = 0;
    CHECK_EQ(D.MemAlloc(&p, 8 * MiB), CUDA_SUCCESS); /* the primary's pool */
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    CUdevice d;
    CHECK_EQ(D.DeviceGet(&d, 0), CUDA_SUCCESS);
    CUcontext other = NULL;
    CHECK_EQ(D.CtxCreate(&other, NULL, 0, d), CUDA_SUCCESS); /* current now */
    buffer big = make(256 * MiB);                             /* the created context's pool lends */
    CHECK_EQ(D.CtxDestroy(other), CUDA_SUCCESS);              /* big lives on */
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    orphan_counted(big, "orphan");
}

static void two_contexts(void)
{
    start();
    CUcontext primary = e2e_cu_primary_current(0);
    CUdevice d;
    CHECK_EQ(D.DeviceGet(&d, 0), CUDA_SUCCESS);
    CUcontext other = NULL;
    CHECK_EQ(D.CtxCreate(&other, NULL, 0, d), CUDA_SUCCESS); /* current now */
    CUmemAllocationProp p = plain_on(0);
    CUmemGenericAllocationHandle a = 0, b = 0, c = 0;
    CHECK_EQ(D.MemCreate(&a, 400 * MiB, &p, 0), CUDA_SUCCESS); /* the created context's pool lends */
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    CHECK_EQ(D.MemCreate(&b, gran, &p, 0), CUDA_SUCCESS); /* the primary's pool lends */
    CHECK_EQ(D.CtxDestroy(other), CUDA_SUCCESS);           /* a lives on */
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    long long limit = shim_stat_number("bytes_limit");
    CUresult r = D.MemCreate(&c, 400 * MiB, &p, 0);
    fprintf(stderr, "limit %lld, lent %lld: a second 400 MiB create: %d\n", limit,
            shim_stat_number("bytes_lent"), (int)r);
    CHECK(limit < (long long)(800 * MiB + gran));
    CHECK_EQ(r, CUDA_ERROR_OUT_OF_MEMORY);
    if (r == CUDA_SUCCESS)
        CHECK_EQ(D.MemRelease(c), CUDA_SUCCESS);
    /* Once a's memory goes, the loan it took over goes with it. */
    CHECK_EQ(D.MemRelease(a), CUDA_SUCCESS);
    CHECK_EQ(D.MemCreate(&c, 400 * MiB, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(c), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(b), CUDA_SUCCESS);
}

/* create-takeover: what another thread does between the driver's answer to
 * a create in a created context and the door's record of it (the fake's
 * after_next_mem_create runs it there, on the creating thread): the
 * context is destroyed, and the primary context's next create takes over
 * the loans of the dead pool. The record is not in the door's map yet, so
 * that takeover cannot see it; once recorded, its loan is the dead pool's,
 * and the device's live pool lends its whole limit again unless a later
 * takeover finds it (found by an audit: a second 400 MiB create beside the
 * first succeeded under a 768 MiB limit). */
static struct {
    CUcontext other, primary;
    bool ran;
} takeover;

static void destroy_and_take_over(void *arg)
{
    (void)arg;
    CHECK_EQ(D.CtxDestroy(takeover.other), CUDA_SUCCESS); /* the create lives on */
    CHECK_EQ(D.CtxSetCurrent(takeover.primary), CUDA_SUCCESS);
    CUmemAllocationProp p = plain_on(0);
    CUmemGenericAllocationHandle w = 0;
    CHECK_EQ(D.MemCreate(&w, gran, &p, 0), CUDA_SUCCESS); /* the takeover's scan */
    CHECK_EQ(D.MemRelease(w), CUDA_SUCCESS);
    takeover.ran = true;
}

static void create_takeover(void)
{
    start();
    takeover.primary = e2e_cu_primary_current(0);
    CUdevice d;
    CHECK_EQ(D.DeviceGet(&d, 0), CUDA_SUCCESS);
    CUmemAllocationProp p = plain_on(0);
    CUmemGenericAllocationHandle a = 0, b = 0, c = 0;
    CHECK_EQ(D.MemCreate(&b, gran, &p, 0), CUDA_SUCCESS); /* the primary's pool */
    CHECK_EQ(D.CtxCreate(&takeover.other, NULL, 0, d), CUDA_SUCCESS); /* current now */
    /* The created context's pool made first: its making probes the driver
     * with creates of its own, and the window is the program's create's. */
    CHECK_EQ(D.MemCreate(&a, gran, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(a), CUDA_SUCCESS);
    fakecuda()->after_next_mem_create(destroy_and_take_over, NULL);
    CHECK_EQ(D.MemCreate(&a, 400 * MiB, &p, 0), CUDA_SUCCESS); /* the created one's lends */
    CHECK(takeover.ran); /* the primary's context current again */
    long long limit = shim_stat_number("bytes_limit");
    CUresult r = D.MemCreate(&c, 400 * MiB, &p, 0);
    fprintf(stderr, "limit %lld, lent %lld: a second 400 MiB create: %d\n", limit,
            shim_stat_number("bytes_lent"), (int)r);
    CHECK(limit < (long long)(800 * MiB + gran));
    if (r == CUDA_SUCCESS)
        CHECK_EQ(D.MemRelease(c), CUDA_SUCCESS);
    CHECK_EQ(r, CUDA_ERROR_OUT_OF_MEMORY);
    /* Once a's memory goes, the loan it took over goes with it. */
    CHECK_EQ(D.MemRelease(a), CUDA_SUCCESS);
    CHECK_EQ(D.MemCreate(&c, 400 * MiB, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(c), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(b), CUDA_SUCCESS);
    CHECK_EQ(shim_stat_number("bytes_lent"), 0);
}

/* fork-adopt: 1 makes the next pthread_rwlock_rdlock of the process (the
 * streams' read lock, which a loan's seal takes) let the forking thread go
 * and wait a while first, so that the fork handler takes the streams'
 * write lock meanwhile. */
static atomic_int hold_next_rdlock;
static e2e_phase fork_phase = E2E_PHASE_INIT;

int pthread_rwlock_rdlock(pthread_rwlock_t *l)
{
    static int (*real)(pthread_rwlock_t *);
    if (!real)
        real = (int (*)(pthread_rwlock_t *))dlsym(RTLD_NEXT, "pthread_rwlock_rdlock");
    if (atomic_exchange(&hold_next_rdlock, 0)) {
        e2e_phase_set(&fork_phase, 1);
        struct timespec t = {0, 300 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    return real(l);
}

static void *forker(void *arg)
{
    (void)arg;
    e2e_phase_wait(&fork_phase, 1);
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    waitpid(pid, NULL, 0);
    return NULL;
}

static void stuck(int sig)
{
    (void)sig;
    static const char m[] = "e2e_vmm_door fork-adopt: the fork and the door's takeover of "
                            "loans waited for each other\n";
    ssize_t w = write(2, m, sizeof m - 1);
    (void)w;
    _exit(3);
}

static void nothing(void *arg) { (void)arg; }

static void fork_adopt(void)
{
    start();
    CUcontext primary = e2e_cu_primary_current(0);
    /* The primary context's pool (preallocated) is all but full of a
     * pending block, so the takeover's loan must seal a fence to get
     * memory back. It is made before the lender dies: a pool made after
     * takes the loans over at once, with no fence to seal. */
    CUstream s = NULL;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr big = 0;
    CHECK_EQ(D.MemAlloc(&big, 8 * MiB), CUDA_SUCCESS); /* the pool */
    CHECK_EQ(D.MemFree(big), CUDA_SUCCESS);
    long long most = shim_stat_number("bytes_limit") - (long long)(8 * MiB);
    CHECK_EQ(D.MemAlloc(&big, (size_t)most), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->launch(s, nothing, NULL), 0);
    CHECK_EQ(D.MemFreeAsync(big, s), CUDA_SUCCESS);
    /* A created context's pool lends h, then dies with its context. */
    CUmemAllocationProp p = plain_on(0);
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    CUdevice d;
    CHECK_EQ(D.DeviceGet(&d, 0), CUDA_SUCCESS);
    CUcontext other = NULL;
    CHECK_EQ(D.CtxCreate(&other, NULL, 0, d), CUDA_SUCCESS); /* current now */
    CHECK_EQ(D.MemCreate(&h, 64 * MiB, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxDestroy(other), CUDA_SUCCESS); /* h lives on, its pool does not */
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, forker, NULL), 0);
    signal(SIGALRM, stuck);
    alarm(20);
    atomic_store(&hold_next_rdlock, 1);
    CUresult r = D.MemCreate(&h2, gran, &p, 0);
    alarm(0);
    bool unsealed = atomic_exchange(&hold_next_rdlock, 0);
    if (unsealed)
        e2e_phase_set(&fork_phase, 1); /* no seal took the lock: let the forker go */
    CHECK(!unsealed); /* the takeover's loan sealed, as the scenario needs */
    CHECK_EQ(pthread_join(t, NULL), 0);
    CHECK_EQ(r, CUDA_SUCCESS);
    if (r == CUDA_SUCCESS)
        CHECK_EQ(D.MemRelease(h2), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
}

/* trim-growing: the program's own memory first, so the door makes the
 * context's pool one that grows (whatever BFCSHIM_PREALLOCATE says); its
 * idle granules go back at the program's cuMemPoolTrimTo(default, 0), as a
 * growing pool's do (found by an audit: the preallocate setting alone kept
 * them). */
static void trim_growing(void)
{
    start();
    buffer own = make(64 * MiB);
    CUdeviceptr a = 0;
    CHECK_EQ(D.MemAlloc(&a, 32 * MiB), CUDA_SUCCESS);
    CHECK_EQ(shim_stat_number("prealloc_us"), 0); /* grew: nothing up front */
    long long held = shim_stat_number("pool_bytes");
    CHECK(held >= (long long)(32 * MiB));
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSynchronize(), CUDA_SUCCESS);
    CUmemoryPool dp = NULL;
    CHECK_EQ(D.DeviceGetDefaultMemPool(&dp, 0), CUDA_SUCCESS);
    uint64_t in_use = fake_stats().bytes_in_use[0];
    CHECK_EQ(D.MemPoolTrimTo(dp, 0), CUDA_SUCCESS);
    fprintf(stderr, "pool bytes %lld -> %lld; device bytes in use %llu -> %llu\n", held,
            shim_stat_number("pool_bytes"), (unsigned long long)in_use,
            (unsigned long long)fake_stats().bytes_in_use[0]);
    CHECK(shim_stat_number("pool_bytes") < held);
    CHECK(fake_stats().bytes_in_use[0] + 32 * MiB <= in_use);
    delete(&own);
}

static void retain_pooled(void)
{
    start();
    CUdeviceptr a = alloc_ok(8 * MiB);
    CUmemGenericAllocationHandle h = 0;
    CHECK_EQ(D.MemRetainAllocationHandle(&h, (void *)(uintptr_t)a), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemRetainAllocationHandle(&h, (void *)(uintptr_t)(a + 3 * MiB)),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(fake_stats().vmm_retain_calls, 0);
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
    /* The program's own memory still answers. */
    buffer b = make(gran);
    CHECK_EQ(D.MemRetainAllocationHandle(&h, (void *)(uintptr_t)b.at), CUDA_SUCCESS);
    CHECK(h == b.h);
    CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS);
    delete(&b);
}

static void bad_create(void)
{
    start();
    CUdeviceptr small = alloc_ok(MiB); /* the pool, preallocated */
    long long pool = shim_stat_number("pool_bytes"), refused = shim_stat_number("vmm_door_refused");
    long long limit = shim_stat_number("bytes_limit");
    CUmemAllocationProp p = plain_on(0), bad = plain_on(0);
    bad.type = CU_MEM_ALLOCATION_TYPE_INVALID;
    CUmemGenericAllocationHandle h = 0;
    CHECK_EQ(D.MemCreate(&h, (size_t)limit + gran + 4096, &p, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemCreate(&h, (size_t)limit / 2 + 4096, &p, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemCreate(&h, 2 * gran, &p, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemCreate(&h, 2 * gran, &bad, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(shim_stat_number("pool_bytes"), pool);
    CHECK_EQ(shim_stat_number("vmm_door_refused"), refused);
    CHECK_EQ(shim_stat_number("bytes_lent"), 0);
    /* A good one still lends. */
    CHECK_EQ(D.MemCreate(&h, 2 * gran, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(shim_stat_number("bytes_lent"), (long long)(2 * gran));
    CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(small), CUDA_SUCCESS);
}

int main(int argc, char **argv)
{
    static const e2e_scenario scenarios[] = {
        {"two-contexts", two_contexts},
        {"create-takeover", create_takeover},
        {"fork-adopt", fork_adopt},
        {"retain-pooled", retain_pooled},
        {"trim-growing", trim_growing},
        {"bad-create", bad_create},
        {"xla-platform", xla_platform},
        {"procaddr", procaddr},
        {"hooks-off", hooks_off},
        {"saturate", saturate},
        {"budget", budget},
        {"race-create", race_create},
        {"race-retain", race_retain},
        {"threads", threads},
        {"reset", reset},
        {"reset-alloc", reset_alloc},
        {"death-alloc", death_alloc}};
    return e2e_main("e2e_vmm_door", scenarios, sizeof scenarios / sizeof scenarios[0], argc,
                    argv);
}
