/*
 * e2e_fake_rules.c - the fake driver's own answers where third-party
 * clients depend on them (Numba's test suite found each one), checked
 * against cuda.h and the driver API reference's "API synchronization
 * behavior". Run with the shim's driver door closed (BFCSHIM_DRIVER_HOOKS=0):
 * these are the fake's rules, not the shim's. Scenarios:
 *
 *   fake-copies    copies are stream work: a host source is read when the
 *                  call is made (the program may reuse it at once), a device
 *                  destination is written when the copy's turn comes, and a
 *                  copy to host memory returns only once it has completed,
 *                  so after its stream's earlier work; the synchronous forms
 *                  on the legacy stream; cuMemsetD8 is legacy-stream work
 *   fake-free-sync cuMemFree of cuMemAlloc's memory completes the device's
 *                  queued work first (a queued copy into the block lands
 *                  before the memory goes); cuMemFreeAsync's memory passed
 *                  to cuMemFree does not wait
 *   fake-event-timing  cuEventElapsedTime's codes (never recorded or
 *                  timing disabled: invalid handle; not complete: not
 *                  ready), cuEventCreate's flags, cuCtxGetStreamPriorityRange
 *   fake-stream-ids  cuStreamGetId: an id per stream, the special handles
 *                  included, "unique for the life of the program" (also when
 *                  FAKECUDA_REUSE_STREAM_HANDLES gives a destroyed stream's
 *                  handle to the next stream made, whose id is new); the
 *                  destroyed stream's queued work still runs, apart from the
 *                  new stream's; a NULL result is an invalid value
 *   fake-counts    the test-control table's own instruments: calls counted
 *                  per entry point, by the name called (a _ptsz twin and a
 *                  v1/_v2 pair apart, one count for a call whatever it
 *                  answered), none for test control; complete_to completes
 *                  a stream up to a position, the legacy stream's earlier
 *                  work with it where a blocking stream joined it
 *   fake-visible-devices, fake-visible-uuid, fake-visible-none
 *                  CUDA_VISIBLE_DEVICES, read at cuInit (meson sets it, with
 *                  FAKECUDA_MEM=1GiB,2GiB): "1"; "GPU-fb,0,7,1" (a UUID
 *                  prefix, an index, an invalid index that hides what
 *                  follows); "" (no device: cuInit fails)
 */
#include <cuda.h>
#include <dlfcn.h>

#include "e2e_cu.h"

#define MiB (UINT64_C(1) << 20)

/* Entry points this program needs beyond e2e_cu.h's. */
static struct {
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*CtxGetStreamPriorityRange)(int *, int *);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*StreamGetId)(CUstream, unsigned long long *);
} X;

/* Looked up without stopping the program: a scenario names what it lacks
 * (NEED) and fails alone. */
static void load_more(void)
{
    void *h = e2e_open_libcuda();
#define X_CU(field, name) *(void **)&X.field = dlsym(h, name)
    X_CU(MemcpyHtoD, "cuMemcpyHtoD_v2");
    X_CU(MemcpyDtoH, "cuMemcpyDtoH_v2");
    X_CU(MemcpyDtoD, "cuMemcpyDtoD_v2");
    X_CU(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    X_CU(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    X_CU(MemsetD8, "cuMemsetD8_v2");
    X_CU(EventElapsedTime, "cuEventElapsedTime_v2");
    X_CU(CtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange");
    X_CU(DeviceGetCount, "cuDeviceGetCount");
    X_CU(DeviceTotalMem, "cuDeviceTotalMem_v2");
    X_CU(DeviceGetUuid, "cuDeviceGetUuid_v2");
    X_CU(StreamGetId, "cuStreamGetId");
#undef X_CU
}

#define NEED(fn)                                                                 \
    do {                                                                         \
        if (!X.fn) {                                                             \
            fprintf(stderr, "%s:%d: the driver has no %s\n", __FILE__, __LINE__, #fn); \
            e2e_failures++;                                                      \
            return;                                                              \
        }                                                                        \
    } while (0)

static void start(void)
{
    e2e_cu_load();
    load_more();
    CHECK_EQ(D.Init(0), CUDA_SUCCESS);
    CUdevice dev;
    CUcontext ctx;
    CHECK_EQ(D.DeviceGet(&dev, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(ctx), CUDA_SUCCESS);
}

/* The fake's device memory is host memory: what a block holds now. */
static unsigned char *bytes(CUdeviceptr d) { return (unsigned char *)(uintptr_t)d; }

/* A "kernel": host work that fills a block when its stream reaches it. */
typedef struct {
    CUdeviceptr d;
    size_t n;
    unsigned char v;
} kernel_fill;
static void run_fill(void *arg)
{
    kernel_fill *k = arg;
    memset(bytes(k->d), k->v, k->n);
}
static void nothing(void *arg) { (void)arg; }

static void fake_copies(void)
{
    start();
    enum { N = 4096 };
    CUdeviceptr a = alloc_ok(N), b = alloc_ok(N);
    unsigned char host[N];
    memset(bytes(a), 0, N);
    memset(bytes(b), 0, N);

    /* Host to device behind queued legacy work: the source is read now, the
     * block written when the work ahead of the copy is done. */
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, nothing, NULL), 0);
    fill(host, N, 0x11);
    CHECK_EQ(X.MemcpyHtoD(a, host, N), CUDA_SUCCESS);
    fill(host, N, 0x99); /* the program reuses its buffer at once */
    CHECK(holds(bytes(a), N, 0));
    fakecuda()->complete(CU_STREAM_LEGACY);
    CHECK(holds(bytes(a), N, 0x11));

    /* Device to device: no host-side synchronisation, legacy-stream order. */
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, nothing, NULL), 0);
    CHECK_EQ(X.MemcpyDtoD(b, a, N), CUDA_SUCCESS);
    CHECK(holds(bytes(b), N, 0));
    fakecuda()->complete(CU_STREAM_LEGACY);
    CHECK(holds(bytes(b), N, 0x11));

    /* A memset is legacy-stream work too; on host memory it is refused. */
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, nothing, NULL), 0);
    CHECK_EQ(X.MemsetD8(b, 0x22, N), CUDA_SUCCESS);
    CHECK(holds(bytes(b), N, 0x11));
    fakecuda()->complete(CU_STREAM_LEGACY);
    CHECK(holds(bytes(b), N, 0x22));
    CHECK_EQ(X.MemsetD8((CUdeviceptr)(uintptr_t)host, 0, N), CUDA_ERROR_INVALID_VALUE);

    /* Device to host returns once the copy has completed: after the kernel
     * queued before it, which it waited for. */
    fakecuda_stats before = fake_stats();
    kernel_fill k = {a, N, 0x33};
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, run_fill, &k), 0);
    CHECK_EQ(X.MemcpyDtoH(host, a, N), CUDA_SUCCESS);
    CHECK(holds(host, N, 0x33));
    CHECK_EQ(fake_stats().host_copy_waits - before.host_copy_waits, 1);
    CHECK_EQ(fakecuda()->pending(CU_STREAM_LEGACY), 0);

    /* The same on a created stream with the Async forms; a blocking stream
     * also waits for the legacy work before it, a non-blocking one does not. */
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->launch(s, nothing, NULL), 0);
    fill(host, N, 0x44);
    CHECK_EQ(X.MemcpyHtoDAsync(a, host, N, s), CUDA_SUCCESS);
    fill(host, N, 0);
    CHECK(holds(bytes(a), N, 0x33));
    CHECK_EQ(fakecuda()->launch_stuck(CU_STREAM_LEGACY), 0); /* not s's business */
    kernel_fill k2 = {a, N / 2, 0x55};
    CHECK_EQ(fakecuda()->launch(s, run_fill, &k2), 0);
    CHECK_EQ(X.MemcpyDtoHAsync(host, a, N, s), CUDA_SUCCESS);
    CHECK(holds(host, N / 2, 0x55) && holds(host + N / 2, N / 2, 0x44));
    CHECK_EQ(fakecuda()->pending(s), 0);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CUdevice d0;
    CHECK_EQ(D.DeviceGet(&d0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxReset(d0), CUDA_SUCCESS); /* drops the stuck work */
}

static void fake_free_sync(void)
{
    start();
    enum { N = 1 << 20 };
    static unsigned char host[N];
    CUdeviceptr a = alloc_ok(N);
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    /* A copy into the block, queued and never waited for, then the block
     * freed: the free completes it first (without that, the fake unmapped
     * the block under the queued copy, which crashed when a later
     * synchronisation ran it: Numba's test_deallocations, then
     * test_select_device). */
    CHECK_EQ(fakecuda()->launch(s, nothing, NULL), 0);
    fill(host, N, 0x5a);
    CHECK_EQ(X.MemcpyHtoDAsync(a, host, N, s), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->pending(s), 2);
    fakecuda_stats before = fake_stats();
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().free_synchronizations - before.free_synchronizations, 1);
    CHECK_EQ(fakecuda()->pending(s), 0);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);

    /* Stream-ordered memory: "Callers must ensure that all accesses to
     * these pointer have completed before invoking cuMemFree" (cuda.h), so
     * nothing waits. */
    CUdeviceptr p = 0;
    CHECK_EQ(D.MemAllocAsync(&p, N, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->launch(s, nothing, NULL), 0);
    before = fake_stats();
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().free_synchronizations - before.free_synchronizations, 0);
    CHECK_EQ(fakecuda()->pending(s), 1);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
}

static void fake_event_timing(void)
{
    start();
    CUevent e = NULL, timed0, timed1, untimed;
    /* Flags: only the three cuda.h lists; interprocess with timing off. */
    CHECK_EQ(D.EventCreate(&e, 0x80), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.EventCreate(&e, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.EventCreate(&e, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(e), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&timed0, CU_EVENT_BLOCKING_SYNC), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&timed1, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&untimed, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    float ms = -1;
    NEED(EventElapsedTime);
    NEED(CtxGetStreamPriorityRange);
    /* Never recorded: invalid handle. */
    CHECK_EQ(X.EventElapsedTime(&ms, timed0, timed1), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(D.EventRecord(timed0, CU_STREAM_LEGACY), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(untimed, CU_STREAM_LEGACY), CUDA_SUCCESS);
    /* Timing disabled on either: invalid handle. */
    CHECK_EQ(X.EventElapsedTime(&ms, timed0, untimed), CUDA_ERROR_INVALID_HANDLE);
    /* The end behind work not yet done: not ready. */
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, nothing, NULL), 0);
    CHECK_EQ(D.EventRecord(timed1, CU_STREAM_LEGACY), CUDA_SUCCESS);
    CHECK_EQ(X.EventElapsedTime(&ms, timed0, timed1), CUDA_ERROR_NOT_READY);
    fakecuda()->complete(CU_STREAM_LEGACY);
    CHECK_EQ(X.EventElapsedTime(&ms, timed0, timed1), CUDA_SUCCESS);
    CHECK(ms >= 0 && ms < 60000);
    CHECK_EQ(X.EventElapsedTime(NULL, timed0, timed1), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.EventDestroy(timed0), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(timed1), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(untimed), CUDA_SUCCESS);
    /* No stream priorities on the fake's devices (attribute 0): [0, 0]. */
    int v = -1, least = -1, greatest = -1;
    CHECK_EQ(D.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 0),
             CUDA_SUCCESS);
    CHECK_EQ(v, 0);
    CHECK_EQ(X.CtxGetStreamPriorityRange(&least, &greatest), CUDA_SUCCESS);
    CHECK_EQ(least, 0);
    CHECK_EQ(greatest, 0);
    CHECK_EQ(X.CtxGetStreamPriorityRange(NULL, NULL), CUDA_SUCCESS);
}

/* Calls of entry point `name` so far (0: never called). */
static uint64_t calls_of(const char *name)
{
    fakecuda_call_count c[256];
    size_t n = fakecuda()->calls(c, 256);
    for (size_t i = 0; i < n && i < 256; i++)
        if (strcmp(c[i].name, name) == 0)
            return c[i].calls;
    return 0;
}

static void fake_counts(void)
{
    start();
    void *h = e2e_open_libcuda();
    CUresult (*record_ptsz)(CUevent, CUstream) =
        (CUresult (*)(CUevent, CUstream))e2e_dlsym(h, "cuEventRecord_ptsz");
    CUresult (*elapsed_v1)(float *, CUevent, CUevent) =
        (CUresult (*)(float *, CUevent, CUevent))e2e_dlsym(h, "cuEventElapsedTime");
    NEED(EventElapsedTime);
    CUevent e;
    CHECK_EQ(D.EventCreate(&e, 0), CUDA_SUCCESS);
    uint64_t rec = calls_of("cuEventRecord"), rec_z = calls_of("cuEventRecord_ptsz");
    uint64_t query = calls_of("cuEventQuery");
    uint64_t el = calls_of("cuEventElapsedTime"), el2 = calls_of("cuEventElapsedTime_v2");
    CHECK_EQ(D.EventRecord(e, CU_STREAM_LEGACY), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(e, CU_STREAM_LEGACY), CUDA_SUCCESS);
    CHECK_EQ(record_ptsz(e, NULL), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(NULL), CUDA_ERROR_INVALID_HANDLE); /* a refused call counts too */
    float ms;
    CHECK_EQ(elapsed_v1(&ms, e, e), CUDA_SUCCESS); /* (the v1 calls no v2 of its own) */
    CHECK_EQ(calls_of("cuEventRecord") - rec, 2);
    CHECK_EQ(calls_of("cuEventRecord_ptsz") - rec_z, 1);
    CHECK_EQ(calls_of("cuEventQuery") - query, 1);
    CHECK_EQ(calls_of("cuEventElapsedTime") - el, 1);
    CHECK_EQ(calls_of("cuEventElapsedTime_v2") - el2, 0);
    /* Test control is no entry point: launches and completions count
     * nothing anywhere. */
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, 0), CUDA_SUCCESS); /* blocking */
    fakecuda_call_count before[256], after[256];
    size_t nb = fakecuda()->calls(before, 256);
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, nothing, NULL), 0);
    uint64_t legacy_at = fakecuda()->submitted(CU_STREAM_LEGACY);
    /* Each launch on s joins the legacy stream's pending work (a wait item
     * of its own, an operation too): positions are read after each. */
    uint64_t at[3];
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(fakecuda()->launch(s, nothing, NULL), 0);
        at[i] = fakecuda()->submitted(s);
    }
    CHECK(at[0] < at[1] && at[1] < at[2]);
    /* Up to the first: the two behind it stay pending, and the legacy
     * work it waited for is done. */
    fakecuda()->complete_to(s, at[0]);
    CHECK_EQ(fakecuda()->pending(s), at[2] - at[0]);
    CHECK_EQ(fakecuda()->pending(CU_STREAM_LEGACY), 0);
    CHECK(legacy_at >= 1);
    fakecuda()->complete_to(s, at[1]);
    CHECK_EQ(fakecuda()->pending(s), at[2] - at[1]);
    fakecuda()->complete_to(s, at[0]); /* behind: nothing moves back */
    CHECK_EQ(fakecuda()->pending(s), at[2] - at[1]);
    fakecuda()->complete_to(s, UINT64_MAX); /* past the end: all of it */
    CHECK_EQ(fakecuda()->pending(s), 0);
    size_t na = fakecuda()->calls(after, 256);
    CHECK_EQ(na, nb);
    for (size_t i = 0; i < na && i < nb; i++)
        CHECK_EQ(after[i].calls, before[i].calls);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(e), CUDA_SUCCESS);
}

/* Visible device `ordinal` is the machine's device `machine` of `mem`
 * bytes: its memory, UUID ("GPU-fa..." is device 0's) and PCI bus (0x10
 * per device) follow it. */
static void set_flag(void *arg) { *(bool *)arg = true; }

static void fake_stream_ids(void)
{
    start();
    NEED(StreamGetId);
    const fakecuda_api *F = fakecuda();
    bool reuse = getenv("FAKECUDA_REUSE_STREAM_HANDLES") != NULL;
    unsigned long long a = 0, b = 0, legacy = 0, per_thread = 0, again = 0;
    CUstream s1, s2;
    CHECK_EQ(D.StreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(X.StreamGetId(s1, &a), CUDA_SUCCESS);
    CHECK_EQ(X.StreamGetId(s1, &again), CUDA_SUCCESS);
    CHECK_EQ(a, again);
    CHECK_EQ(X.StreamGetId(NULL, &legacy), CUDA_SUCCESS);
    CHECK_EQ(X.StreamGetId(CU_STREAM_PER_THREAD, &per_thread), CUDA_SUCCESS);
    CHECK(legacy != a && per_thread != a && legacy != per_thread);
    CHECK_EQ(X.StreamGetId(s1, NULL), CUDA_ERROR_INVALID_VALUE);
    bool ran = false;
    CHECK_EQ(F->launch(s1, set_flag, &ran), 0);
    CHECK_EQ(D.StreamDestroy(s1), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(s2 == s1, reuse);
    CHECK_EQ(X.StreamGetId(s2, &b), CUDA_SUCCESS);
    CHECK(b != a && b != legacy && b != per_thread);
    /* The new stream is empty: its work does not wait behind the old. */
    bool ran2 = false;
    CHECK_EQ(F->launch(s2, set_flag, &ran2), 0);
    F->complete(s2);
    CHECK(ran2);
    CHECK(!ran);
    F->complete_all();
    CHECK(ran);
    CHECK_EQ(D.StreamDestroy(s2), CUDA_SUCCESS);
}

static void check_visible(int ordinal, int machine, size_t mem)
{
    size_t total = 0;
    CHECK_EQ(X.DeviceTotalMem(&total, ordinal), CUDA_SUCCESS);
    CHECK_EQ(total, mem);
    CUuuid u;
    CHECK_EQ(X.DeviceGetUuid(&u, ordinal), CUDA_SUCCESS);
    CHECK_EQ((unsigned char)u.bytes[0], 0xfa + machine);
    int bus = 0;
    CHECK_EQ(D.DeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, ordinal), CUDA_SUCCESS);
    CHECK_EQ(bus, 0x10 * (machine + 1));
}

static void fake_visible_devices(void) /* CUDA_VISIBLE_DEVICES=1 */
{
    start();
    int n = 0;
    CHECK_EQ(X.DeviceGetCount(&n), CUDA_SUCCESS);
    CHECK_EQ(n, 1);
    check_visible(0, 1, 2048 * MiB);
    CUdevice d;
    CHECK_EQ(D.DeviceGet(&d, 1), CUDA_ERROR_INVALID_DEVICE);
    /* Allocations count against the device that is visible. */
    CUdeviceptr p = alloc_ok(64 * MiB);
    CHECK(free_memory() <= 1984 * MiB && free_memory() > 1024 * MiB);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
}

static void fake_visible_uuid(void) /* CUDA_VISIBLE_DEVICES=GPU-fb,0,7,1 */
{
    start();
    int n = 0;
    CHECK_EQ(X.DeviceGetCount(&n), CUDA_SUCCESS);
    CHECK_EQ(n, 2);
    check_visible(0, 1, 2048 * MiB);
    check_visible(1, 0, 1024 * MiB);
}

static void fake_visible_none(void) /* CUDA_VISIBLE_DEVICES= */
{
    e2e_cu_load();
    load_more();
    CHECK_EQ(D.Init(0), CUDA_ERROR_NO_DEVICE);
    int n = -1;
    CHECK_EQ(X.DeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
}

int main(int argc, char **argv)
{
    static const e2e_scenario scenarios[] = {
        {"fake-copies", fake_copies},
        {"fake-free-sync", fake_free_sync},
        {"fake-event-timing", fake_event_timing},
        {"fake-stream-ids", fake_stream_ids},
        {"fake-stream-ids-reuse", fake_stream_ids},
        {"fake-counts", fake_counts},
        {"fake-visible-devices", fake_visible_devices},
        {"fake-visible-uuid", fake_visible_uuid},
        {"fake-visible-none", fake_visible_none},
    };
    return e2e_main("e2e_fake_rules", scenarios, sizeof scenarios / sizeof scenarios[0], argc,
                    argv);
}
