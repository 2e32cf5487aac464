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
 *   fake-event-handles  a dead event's handle (cuEventDestroy, or dead with
 *                  its context: cuCtxDestroy, cuDevicePrimaryCtxReset) is
 *                  stale, its uses refused and counted; with
 *                  FAKECUDA_REUSE_EVENT_HANDLES (-reuse) the next event made
 *                  gets it, the most recently dead first, and is a fresh
 *                  event: never recorded (a query answers done though the
 *                  old record is still pending), its own flags, of the
 *                  context current at its creation; a late use of the old
 *                  handle reaches it, uncounted
 *   fake-counts    the test-control table's own instruments: calls counted
 *                  per entry point, by the name called (a _ptsz twin and a
 *                  v1/_v2 pair apart, one count for a call whatever it
 *                  answered), none for test control; complete_to completes
 *                  a stream up to a position, the legacy stream's earlier
 *                  work with it where a blocking stream joined it
 *   fake-fail-call  fail_call, the injected failures: the nth call from now
 *                  of one entry point answers a code cuda.h documents for
 *                  it (counted, doing nothing: no event recorded), the
 *                  calls before and after it as usual; sticky, every call
 *                  from the nth on (a faulted context); codes cuda.h does
 *                  not list for the entry point refused; counted per entry
 *                  point (a _ptsz twin apart) and exactly once under
 *                  concurrent callers
 *   fake-v1-entry-points  the v1 cuStreamDestroy, cuCtxDestroy,
 *                  cuDevicePrimaryCtxRelease and cuDevicePrimaryCtxReset that
 *                  libcuda still exports for old binaries: cuGetProcAddress
 *                  hands them out below their _v2's version (the _v2 from
 *                  it on), each is counted under its own name and answers
 *                  as its _v2 (a stream destroyed with work queued returns
 *                  at once, the work goes on)
 *   fake-host-memory  page-locked host memory (cuMemHostAlloc,
 *                  cuMemFreeHost, cuMemHostGetDevicePointer): arguments,
 *                  pointer attributes as host memory, copies from and to it
 *                  asynchronous in the Async forms and synchronous in the
 *                  others, a memset of it synchronous, gone with its context
 *   fake-peer-copy cuMemcpyPeerAsync between two devices' memory: stream
 *                  work without host synchronisation (cuMemcpyPeer: on the
 *                  legacy stream, no host wait either); contexts and ranges
 *                  checked, a range over neighbouring mappings accepted
 *   fake-pool-access  cuMemPoolSetAccess / cuMemPoolGetAccess: grants kept
 *                  per device, the owner's access not revocable, arguments
 *   fake-pool-reuse  cuMemPoolCreate's properties (a device's pinned memory;
 *                  host pools, Win32 and fabric handles not supported); a
 *                  stream-ordered free's memory serves its own stream at
 *                  once, another stream before the free is reached only with
 *                  ALLOW_INTERNAL_DEPENDENCIES, after it with
 *                  ALLOW_OPPORTUNISTIC; cuMemPoolTrimTo keeps what unreached
 *                  frees hold
 *   fake-vmm-args  cuMemAddressReserve's address hint page-aligned,
 *                  cuMemSetAccess's flags one of the three; a handle
 *                  released while mapped keeps its memory until unmapped
 *   fake-stream-write  cuStreamWriteValue64 (and the attribute that announces
 *                  it): stream work, device or page-locked memory only,
 *                  aligned, flags
 *   fake-memset    cuMemsetD32, cuMemsetD8Async, cuMemsetD32Async (TensorFlow
 *                  zeroes its first tensors with cuMemsetD32Async): stream
 *                  work on the stream named, every 32-bit element set, the
 *                  range inside one allocation, four-byte alignment, bad
 *                  streams, captured (not run); the 2D forms (cuMemsetD2D8,
 *                  cuMemsetD2D16Async, cuMemsetD2D32Async): rows a pitch
 *                  apart, the gaps untouched, pitch and alignment rules
 *   fake-capture-fork  a stream that waits on an event recorded in a capture
 *                  joins it (the programming guide's cross-stream
 *                  dependencies): it reports capturing, what it queues is
 *                  captured, not run; the end on the origin ends both and
 *                  succeeds once the fork is joined back (directly or
 *                  through another fork), else it answers
 *                  CUDA_ERROR_STREAM_CAPTURE_UNJOINED with no graph; an end
 *                  on the fork is CUDA_ERROR_STREAM_CAPTURE_UNMATCHED and
 *                  changes nothing; legacy-stream work invalidates a
 *                  capture through a blocking fork; the legacy stream cannot
 *                  join (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), nor can a
 *                  stream of another capture (_MERGE)
 *   fake-capture-misuse  what the programming guide prohibits during a
 *                  capture is refused and invalidates it, in every mode:
 *                  querying or synchronising the capturing stream
 *                  (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), a captured
 *                  event (CUDA_ERROR_CAPTURED_EVENT; after the end, refused
 *                  alone), the legacy stream while a blocking stream
 *                  captures (_IMPLICIT), waiting on a non-captured event
 *                  without CU_EVENT_WAIT_EXTERNAL (_ISOLATION)
 *   fake-capture-free-async  cuMemFreeAsync into a capture takes only a
 *                  graph allocation (one made in a capture): memory from the
 *                  pool or cuMemAlloc is an invalid value and stays live
 *   fake-capture-invalidated-use  once a capture is invalidated, its
 *                  stream refuses further work (copies, memsets, kernels,
 *                  records, waits, stream-ordered allocations and frees)
 *                  and no stream joins it by a wait, each with
 *                  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, until it is ended
 *   fake-capture-info  cuStreamGetCaptureInfo (v1, _v2, _v3, each with its
 *                  _ptsz twin, and from cuGetProcAddress by version): the
 *                  status, and only while the capture is active its
 *                  sequence's id (the origin's and a fork's alike, another
 *                  capture's not) and its graph (the program's for
 *                  cuStreamBeginCaptureToGraph; else the one the end then
 *                  returns, or destroyed if the capture fails); an empty
 *                  dependency set; _IMPLICIT for the legacy stream while a
 *                  blocking stream (a per-thread one too) captures, not
 *                  invalidating; no status pointer, or edge data without
 *                  dependencies: an invalid value
 *   fake-ptds      the per-thread default stream's synchronous copies and
 *                  memsets (cuMemcpyHtoD_v2_ptds ... cuMemsetD32_v2_ptds, as
 *                  cuda.h names them under CUDA_API_PER_THREAD_DEFAULT_STREAM)
 *                  and Async copies (_ptsz): work on the calling thread's
 *                  per-thread stream, not the legacy stream, and what
 *                  cuGetProcAddress hands out with the per-thread flag;
 *                  cuMemsetD16
 *   fake-copy-ranges  every copy form checks the whole of both ranges: an
 *                  end past its allocation, page-locked allocation or
 *                  mapped virtual memory is an invalid value, nothing copied
 *                  or queued; a range over neighbouring mappings is whole
 *   fake-primary-reset  cuDevicePrimaryCtxReset (_v2 and v1) destroys the
 *                  primary context and its memory but keeps its retain
 *                  count: the holders' releases succeed, and after a retain
 *                  revives it only the last release destroys it; while
 *                  reset and current, it has no legacy or per-thread stream
 *   fake-ctx-stack  cuCtxDestroy pops a context only when it is current (the
 *                  top of the thread's stack); deeper, its dead handle
 *                  stays, and a pop reaches it; a destroyed context cannot
 *                  be pushed again
 *   fake-ctx-create-versions  cuCtxCreate (CUDA 2.0's), _v2, _v3 (execution
 *                  affinity) and _v4 (creation parameters): each exported
 *                  and handed out by cuGetProcAddress from its version on,
 *                  each makes a current, usable context on its device;
 *                  affinity (MPS only) and CIG mode refused as unsupported
 *   fake-pci-bus-id   cuDeviceGetPCIBusId against CU_DEVICE_ATTRIBUTE_PCI_BUS_ID
 *   fake-nvml, fake-nvml-visible  the fake NVML (tests/fake_cuda/nvml,
 *                  on the loader's path for these two only): init counted,
 *                  calls refused before it, the driver version and its
 *                  buffer, each CUDA device found by the bus id the fake
 *                  driver gives it (with CUDA_VISIBLE_DEVICES=1, which NVML
 *                  ignores, too), the three bus id formats, PCIe link, MIG
 *                  mode, the NVLink count field, NVLink state and capability
 *                  (not supported) and fabric info (not in a fabric)
 *   fake-stream-flags  cuStreamCreate and cuStreamCreateWithPriority take
 *                  only CU_STREAM_DEFAULT and CU_STREAM_NON_BLOCKING (anything
 *                  else: an invalid value, no stream); an out-of-range
 *                  priority is clamped; cuStreamGetFlags gives the flags back
 *   fake-host-func cuLaunchHostFunc: the stream is not done until the
 *                  function ran; a bad stream is an invalid handle; a CUDA
 *                  call made from the function is CUDA_ERROR_NOT_PERMITTED;
 *                  in a capture, a node of the graph, never run
 *   fake-stream-order  what was already as CUDA says, kept so: a wait takes
 *                  the event's record at the call, its flags 0 or external
 *                  (in a capture only); non-blocking streams apart from the
 *                  legacy stream, blocking and per-thread ones behind it; a
 *                  wait on another device's event legal and ordering;
 *                  cuCtxSynchronize its own context only; a destroyed
 *                  stream's work and the event behind it complete later
 *   fake-more-stream-calls  cuEventRecordWithFlags (DEFAULT: a record;
 *                  an unknown flag, or EXTERNAL outside a capture: invalid
 *                  value; EXTERNAL in a capture: a node, the event
 *                  untouched), cuStreamQuery_ptsz, cuStreamGetPriority (the
 *                  clamped priority, 0) and cuLaunchHostFunc_ptsz, with
 *                  stream 0 the per-thread stream in the _ptsz twins, and
 *                  what cuGetProcAddress hands out for them
 *   fake-legacy-record  a record on the legacy stream covers every
 *                  blocking stream's earlier work, but later blocking-stream
 *                  work does not wait for it (the stricter reading: the
 *                  shim's barrier must wait, not only record)
 *   fake-legacy-destroyed  legacy-stream work does not wait for a
 *                  blocking stream destroyed with work queued (that work
 *                  still runs), only for live ones; with
 *                  FAKECUDA_LEGACY_SKIPS_DESTROYED=0 (-waits) it does
 *   fake-wait-ended-capture  cuStreamWaitEvent on an event last recorded
 *                  in a capture that has ended: CUDA_ERROR_CAPTURED_EVENT, a
 *                  capturing waiter's capture invalidated
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
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*Memcpy)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*CtxGetStreamPriorityRange)(int *, int *);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*StreamGetId)(CUstream, unsigned long long *);
    CUresult (*DeviceGetPCIBusId)(char *, int, CUdevice);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned);
    CUresult (*PointerGetAttribute)(void *, CUpointer_attribute, CUdeviceptr);
    CUresult (*PointerGetAttributes)(unsigned, CUpointer_attribute *, void **, CUdeviceptr);
    CUresult (*MemcpyPeerAsync)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
    CUresult (*MemcpyPeer)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t);
    CUresult (*MemPoolSetAccess)(CUmemoryPool, const CUmemAccessDesc *, size_t);
    CUresult (*MemPoolGetAccess)(CUmemAccess_flags *, CUmemoryPool, CUmemLocation *);
    CUresult (*StreamWriteValue64)(CUstream, CUdeviceptr, cuuint64_t, unsigned);
    CUresult (*MemsetD32)(CUdeviceptr, unsigned, size_t);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*MemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
    CUresult (*MemsetD2D8)(CUdeviceptr, size_t, unsigned char, size_t, size_t);
    CUresult (*MemsetD2D16Async)(CUdeviceptr, size_t, unsigned short, size_t, size_t, CUstream);
    CUresult (*MemsetD2D32Async)(CUdeviceptr, size_t, unsigned, size_t, size_t, CUstream);
    CUresult (*GraphDestroy)(CUgraph);
    CUresult (*StreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*GetProcAddress)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);
    /* cuStreamGetCaptureInfo's three versions and their _ptsz twins */
    CUresult (*CaptureInfoV1[2])(CUstream, CUstreamCaptureStatus *, cuuint64_t *);
    CUresult (*CaptureInfoV2[2])(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                 const CUgraphNode **, size_t *);
    CUresult (*CaptureInfoV3[2])(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                 const CUgraphNode **, const CUgraphEdgeData **, size_t *);
    CUresult (*StreamBeginCaptureToGraph)(CUstream, CUgraph, const CUgraphNode *,
                                          const CUgraphEdgeData *, size_t, CUstreamCaptureMode);
    CUresult (*GraphCreate)(CUgraph *, unsigned);
    CUresult (*MemPoolDestroy)(CUmemoryPool);
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
    X_CU(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    X_CU(Memcpy, "cuMemcpy");
    X_CU(MemcpyAsync, "cuMemcpyAsync");
    X_CU(MemsetD8, "cuMemsetD8_v2");
    X_CU(EventElapsedTime, "cuEventElapsedTime_v2");
    X_CU(CtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange");
    X_CU(DeviceGetCount, "cuDeviceGetCount");
    X_CU(DeviceTotalMem, "cuDeviceTotalMem_v2");
    X_CU(DeviceGetUuid, "cuDeviceGetUuid_v2");
    X_CU(StreamGetId, "cuStreamGetId");
    X_CU(DeviceGetPCIBusId, "cuDeviceGetPCIBusId");
    X_CU(MemHostAlloc, "cuMemHostAlloc");
    X_CU(MemFreeHost, "cuMemFreeHost");
    X_CU(MemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
    X_CU(PointerGetAttribute, "cuPointerGetAttribute");
    X_CU(PointerGetAttributes, "cuPointerGetAttributes");
    X_CU(MemcpyPeerAsync, "cuMemcpyPeerAsync");
    X_CU(MemcpyPeer, "cuMemcpyPeer");
    X_CU(MemPoolSetAccess, "cuMemPoolSetAccess");
    X_CU(MemPoolGetAccess, "cuMemPoolGetAccess");
    X_CU(StreamWriteValue64, "cuStreamWriteValue64_v2");
    X_CU(MemsetD32, "cuMemsetD32_v2");
    X_CU(MemsetD8Async, "cuMemsetD8Async");
    X_CU(MemsetD32Async, "cuMemsetD32Async");
    X_CU(MemsetD2D8, "cuMemsetD2D8_v2");
    X_CU(MemsetD2D16Async, "cuMemsetD2D16Async");
    X_CU(MemsetD2D32Async, "cuMemsetD2D32Async");
    X_CU(GraphDestroy, "cuGraphDestroy");
    X_CU(StreamIsCapturing, "cuStreamIsCapturing");
    X_CU(EventSynchronize, "cuEventSynchronize");
    X_CU(GetProcAddress, "cuGetProcAddress_v2");
    X_CU(CaptureInfoV1[0], "cuStreamGetCaptureInfo");
    X_CU(CaptureInfoV1[1], "cuStreamGetCaptureInfo_ptsz");
    X_CU(CaptureInfoV2[0], "cuStreamGetCaptureInfo_v2");
    X_CU(CaptureInfoV2[1], "cuStreamGetCaptureInfo_v2_ptsz");
    X_CU(CaptureInfoV3[0], "cuStreamGetCaptureInfo_v3");
    X_CU(CaptureInfoV3[1], "cuStreamGetCaptureInfo_v3_ptsz");
    X_CU(StreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph");
    X_CU(GraphCreate, "cuGraphCreate");
    X_CU(MemPoolDestroy, "cuMemPoolDestroy");
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
    e2e_cu_primary_current(0);
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
static uint64_t calls_of(const char *name) { return e2e_calls_of(name); }

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

static uint64_t stale_uses(void)
{
    fakecuda_stats st;
    fakecuda()->stats(&st);
    return st.stale_handle_uses;
}

static void fake_event_handles(void)
{
    start();
    NEED(EventElapsedTime);
    const fakecuda_api *F = fakecuda();
    const bool reuse = getenv("FAKECUDA_REUSE_EVENT_HANDLES") != NULL;
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

    /* cuEventDestroy: an event recorded behind work not yet done dies; the
     * next event made gets its handle (reuse) or a new one. */
    CUevent old = NULL, fresh = NULL;
    CHECK_EQ(D.EventCreate(&old, 0), CUDA_SUCCESS);
    CHECK_EQ(F->launch(s, nothing, NULL), 0);
    CHECK_EQ(D.EventRecord(old, s), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(old), CUDA_ERROR_NOT_READY);
    CHECK_EQ(D.EventDestroy(old), CUDA_SUCCESS);
    uint64_t stale = stale_uses();
    CHECK_EQ(D.EventCreate(&fresh, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(fresh == old, reuse);
    /* The old handle: stale (counted), or the fresh event, which was never
     * recorded, so done at once, though the old record is still pending. */
    CHECK_EQ(D.EventQuery(old), reuse ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(stale_uses() - stale, reuse ? 0 : 1);
    CHECK_EQ(D.EventQuery(fresh), CUDA_SUCCESS);
    CHECK_EQ(F->pending(s), 1);
    /* Its own flags (timing disabled), its own records. */
    float ms = -1;
    CHECK_EQ(D.EventRecord(fresh, s), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(fresh), CUDA_ERROR_NOT_READY);
    F->complete(s);
    CHECK_EQ(D.EventQuery(fresh), CUDA_SUCCESS);
    CHECK_EQ(X.EventElapsedTime(&ms, fresh, fresh), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(D.EventDestroy(fresh), CUDA_SUCCESS);
    if (!reuse)
        CHECK_EQ(D.EventDestroy(old), CUDA_ERROR_INVALID_HANDLE);

    /* The most recently destroyed first. */
    CUevent a, b, c1, c2;
    CHECK_EQ(D.EventCreate(&a, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&b, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(a), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(b), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&c1, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&c2, 0), CUDA_SUCCESS);
    CHECK_EQ(c1 == b, reuse);
    CHECK_EQ(c2 == a, reuse);
    CHECK(c1 != c2);
    CHECK_EQ(D.EventDestroy(c1), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(c2), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&c1, 0), CUDA_SUCCESS); /* takes c2's cell again */
    CHECK_EQ(c1 == a, reuse);
    CHECK_EQ(D.EventDestroy(c1), CUDA_SUCCESS);

    /* Dead with its context (cuCtxDestroy), recorded behind work that never
     * ends: the handle goes to an event of the context current now, the
     * primary one, where it records and completes as its own. */
    CUdevice d1;
    CHECK_EQ(D.DeviceGet(&d1, 1), CUDA_SUCCESS);
    CUcontext primary = e2e_cu_primary_current(0), created = NULL;
    CHECK_EQ(D.CtxCreate(&created, NULL, 0, d1), CUDA_SUCCESS);
    CUstream cs;
    CUevent in_ctx = NULL, after = NULL;
    CHECK_EQ(D.StreamCreate(&cs, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&in_ctx, 0), CUDA_SUCCESS);
    CHECK_EQ(F->launch_stuck(cs), 0);
    CHECK_EQ(D.EventRecord(in_ctx, cs), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(in_ctx, s), CUDA_ERROR_INVALID_HANDLE); /* another context's stream */
    CHECK_EQ(D.CtxDestroy(created), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&after, 0), CUDA_SUCCESS);
    CHECK_EQ(after == in_ctx, reuse);
    CHECK_EQ(D.EventQuery(after), CUDA_SUCCESS);
    CHECK_EQ(F->launch(s, nothing, NULL), 0);
    CHECK_EQ(D.EventRecord(after, s), CUDA_SUCCESS); /* of the primary context now */
    CHECK_EQ(D.EventQuery(in_ctx), reuse ? CUDA_ERROR_NOT_READY : CUDA_ERROR_INVALID_HANDLE);
    F->complete(s);
    CHECK_EQ(D.EventQuery(after), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(after), CUDA_SUCCESS);

    /* Dead with a primary context that cuDevicePrimaryCtxReset destroys. */
    CUcontext p1 = NULL;
    CUevent in_p1 = NULL, again = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&p1, d1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(p1), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&in_p1, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(in_p1, CU_STREAM_LEGACY), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxReset(d1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    stale = stale_uses();
    CHECK_EQ(D.EventCreate(&again, 0), CUDA_SUCCESS);
    CHECK_EQ(again == in_p1, reuse);
    CHECK_EQ(D.EventQuery(in_p1), reuse ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(stale_uses() - stale, reuse ? 0 : 1);
    CHECK_EQ(D.EventDestroy(again), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRelease(d1), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
}

/* cuGetProcAddress hands out what dlsym finds under the versioned name. */
static void same_through_proc_address(const char *base, const char *exported)
{
    void *fn = NULL;
    CHECK_EQ(X.GetProcAddress(base, &fn, 13000, 0, NULL), CUDA_SUCCESS);
    CHECK(fn && fn == dlsym(e2e_open_libcuda(), exported));
}

/* What cuGetProcAddress answers for `base` at `version`: the function
 * dlsym finds under `exported`. */
static void proc_at(const char *base, int version, const char *exported)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CHECK_EQ(X.GetProcAddress(base, &fn, version, 0, &st), CUDA_SUCCESS);
    CHECK_EQ(st, CU_GET_PROC_ADDRESS_SUCCESS);
    CHECK(fn && fn == dlsym(e2e_open_libcuda(), exported));
}

static void fake_v1_entry_points(void)
{
    start();
    NEED(GetProcAddress);
    proc_at("cuStreamDestroy", 3020, "cuStreamDestroy");
    proc_at("cuStreamDestroy", 4000, "cuStreamDestroy_v2");
    proc_at("cuCtxDestroy", 2000, "cuCtxDestroy");
    proc_at("cuCtxDestroy", 4000, "cuCtxDestroy_v2");
    proc_at("cuDevicePrimaryCtxRelease", 10020, "cuDevicePrimaryCtxRelease");
    proc_at("cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2");
    proc_at("cuDevicePrimaryCtxReset", 7000, "cuDevicePrimaryCtxReset");
    proc_at("cuDevicePrimaryCtxReset", 12000, "cuDevicePrimaryCtxReset_v2");
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    CHECK_EQ(X.GetProcAddress("cuDevicePrimaryCtxReset", &fn, 6050, 0, &st),
             CUDA_ERROR_NOT_FOUND);
    CHECK_EQ(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    void *h = e2e_open_libcuda();
    CUresult (*stream_destroy)(CUstream) = (CUresult(*)(CUstream))e2e_dlsym(h, "cuStreamDestroy");
    CUresult (*ctx_destroy)(CUcontext) = (CUresult(*)(CUcontext))e2e_dlsym(h, "cuCtxDestroy");
    CUresult (*release)(CUdevice) = (CUresult(*)(CUdevice))e2e_dlsym(h, "cuDevicePrimaryCtxRelease");
    CUresult (*reset)(CUdevice) = (CUresult(*)(CUdevice))e2e_dlsym(h, "cuDevicePrimaryCtxReset");
    uint64_t v1 = calls_of("cuStreamDestroy"), v2 = calls_of("cuStreamDestroy_v2");
    /* A stream with work queued: destroyed at once, the work goes on. */
    CUstream s;
    bool ran = false;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->launch(s, set_flag, &ran), 0);
    CHECK_EQ(stream_destroy(s), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->pending(s), 1);
    CHECK(!ran);
    CHECK_EQ(stream_destroy(s), CUDA_ERROR_INVALID_HANDLE); /* (a stale use, counted) */
    fakecuda()->complete_all();
    CHECK(ran);
    CHECK_EQ(calls_of("cuStreamDestroy") - v1, 2);
    CHECK_EQ(calls_of("cuStreamDestroy_v2") - v2, 0);
    /* A created context goes; a primary one is refused. */
    CUcontext c = NULL, primary = NULL;
    CUdevice d0;
    CHECK_EQ(D.DeviceGet(&d0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&primary, d0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxCreate(&c, NULL, 0, d0), CUDA_SUCCESS);
    CHECK_EQ(ctx_destroy(c), CUDA_SUCCESS);
    CHECK_EQ(ctx_destroy(primary), CUDA_ERROR_INVALID_CONTEXT);
    /* The primary context: the last release destroys it; a reset too. */
    unsigned flags = 0;
    int active = 0;
    CUresult (*get_state)(CUdevice, unsigned *, int *) =
        (CUresult(*)(CUdevice, unsigned *, int *))e2e_dlsym(h, "cuDevicePrimaryCtxGetState");
    CHECK_EQ(D.CtxSetCurrent(NULL), CUDA_SUCCESS);
    CHECK_EQ(release(d0), CUDA_SUCCESS); /* start()'s retain */
    CHECK_EQ(get_state(d0, &flags, &active), CUDA_SUCCESS);
    CHECK_EQ(active, 1);
    CHECK_EQ(release(d0), CUDA_SUCCESS); /* the one above: the last */
    CHECK_EQ(get_state(d0, &flags, &active), CUDA_SUCCESS);
    CHECK_EQ(active, 0);
    CHECK_EQ(release(d0), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&primary, d0), CUDA_SUCCESS);
    CHECK_EQ(reset(d0), CUDA_SUCCESS);
    CHECK_EQ(get_state(d0, &flags, &active), CUDA_SUCCESS);
    CHECK_EQ(active, 0);
    CHECK_EQ(release(99), CUDA_ERROR_INVALID_DEVICE);
    CHECK_EQ(reset(99), CUDA_ERROR_INVALID_DEVICE);
}

static void fake_host_memory(void)
{
    start();
    NEED(MemHostAlloc);
    NEED(MemFreeHost);
    NEED(MemHostGetDevicePointer);
    NEED(PointerGetAttribute);
    NEED(PointerGetAttributes);
    NEED(GetProcAddress);
    same_through_proc_address("cuMemHostAlloc", "cuMemHostAlloc");
    same_through_proc_address("cuMemFreeHost", "cuMemFreeHost");
    same_through_proc_address("cuMemHostGetDevicePointer", "cuMemHostGetDevicePointer_v2");
    CUdevice d0;
    CHECK_EQ(D.DeviceGet(&d0, 0), CUDA_SUCCESS);
    int can = 0;
    CHECK_EQ(D.DeviceGetAttribute(&can, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, d0), CUDA_SUCCESS);
    CHECK_EQ(can, 1);
    enum { N = 1 << 16 };

    /* Arguments: cuda.h's codes. */
    void *p = NULL;
    CHECK_EQ(X.MemHostAlloc(NULL, N, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemHostAlloc(&p, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemHostAlloc(&p, N, 0x80), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.CtxSetCurrent(NULL), CUDA_SUCCESS);
    CHECK_EQ(X.MemHostAlloc(&p, N, 0), CUDA_ERROR_INVALID_CONTEXT);
    CUcontext ctx;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&ctx, d0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(ctx), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRelease(d0), CUDA_SUCCESS); /* start() holds one too */
    fakecuda_stats before = fake_stats();

    /* Memory the program writes at once, known to the driver as host
     * memory of this context. */
    void *pinned = NULL, *mapped = NULL;
    CHECK_EQ(X.MemHostAlloc(&pinned, N, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
    CHECK_EQ(X.MemHostAlloc(&mapped, N, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
    if (!pinned || !mapped)
        return;
    fill(pinned, N, 0x01);
    CHECK_EQ(fake_stats().host_bytes_in_use - before.host_bytes_in_use, 2 * N);
    const CUdeviceptr at = (CUdeviceptr)(uintptr_t)pinned + 100;
    unsigned type = 0;
    CUcontext owner = NULL;
    CUdeviceptr dev_ptr = 0, start_addr = 0;
    void *host_ptr = NULL;
    size_t range = 0;
    int ordinal = -1, is_mapped = 0;
    CHECK_EQ(X.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, at), CUDA_SUCCESS);
    CHECK_EQ(type, CU_MEMORYTYPE_HOST);
    CHECK_EQ(X.PointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, at), CUDA_SUCCESS);
    CHECK(owner == ctx);
    CHECK_EQ(X.PointerGetAttribute(&host_ptr, CU_POINTER_ATTRIBUTE_HOST_POINTER, at), CUDA_SUCCESS);
    CHECK(host_ptr == (void *)(uintptr_t)at);
    CHECK_EQ(X.PointerGetAttribute(&dev_ptr, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, at), CUDA_SUCCESS);
    CHECK_EQ(dev_ptr, at);
    CHECK_EQ(X.PointerGetAttribute(&start_addr, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, at),
             CUDA_SUCCESS);
    CHECK(start_addr == (CUdeviceptr)(uintptr_t)pinned);
    CHECK_EQ(X.PointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, at), CUDA_SUCCESS);
    CHECK_EQ(range, N);
    /* The plural form agrees; a device block next to it stays device memory. */
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                   CU_POINTER_ATTRIBUTE_MAPPED};
    void *data[] = {&type, &ordinal, &is_mapped};
    type = 0;
    CHECK_EQ(X.PointerGetAttributes(3, attrs, data, at), CUDA_SUCCESS);
    CHECK(type == CU_MEMORYTYPE_HOST && ordinal == 0 && is_mapped == 1);
    CUdeviceptr dev = alloc_ok(N);
    CHECK_EQ(X.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dev), CUDA_SUCCESS);
    CHECK_EQ(type, CU_MEMORYTYPE_DEVICE);
    unsigned long long id_host = 0, id_dev = 0;
    CHECK_EQ(X.PointerGetAttribute(&id_host, CU_POINTER_ATTRIBUTE_BUFFER_ID, at), CUDA_SUCCESS);
    CHECK_EQ(X.PointerGetAttribute(&id_dev, CU_POINTER_ATTRIBUTE_BUFFER_ID, dev), CUDA_SUCCESS);
    CHECK(id_host && id_dev && id_host != id_dev);

    /* The device pointer of page-locked memory is its host address, inside
     * it too, with or without CU_MEMHOSTALLOC_DEVICEMAP (unified
     * addressing: "regardless of whether or not the flags ... are
     * specified"); pageable memory has none. */
    CUdeviceptr dp = 0;
    CHECK_EQ(X.MemHostGetDevicePointer(&dp, (char *)mapped + 8, 0), CUDA_SUCCESS);
    CHECK(dp == (CUdeviceptr)(uintptr_t)mapped + 8);
    CHECK_EQ(X.MemHostGetDevicePointer(&dp, mapped, 1), CUDA_ERROR_INVALID_VALUE);
    dp = 0;
    CHECK_EQ(X.MemHostGetDevicePointer(&dp, pinned, 0), CUDA_SUCCESS);
    CHECK(dp == (CUdeviceptr)(uintptr_t)pinned);
    static unsigned char pageable[N];
    CHECK_EQ(X.MemHostGetDevicePointer(&dp, pageable, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemHostGetDevicePointer(NULL, mapped, 0), CUDA_ERROR_INVALID_VALUE);

    /* Async copies from page-locked memory read it when their turn comes,
     * and copies to it write it then: the call does not wait. */
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    fill(bytes(dev), N, 0);
    CHECK_EQ(fakecuda()->launch(s, nothing, NULL), 0);
    CHECK_EQ(X.MemcpyHtoDAsync(dev, pinned, N, s), CUDA_SUCCESS);
    fill(pinned, N, 0x02); /* before the stream reached the copy: it sees this */
    CHECK(holds(bytes(dev), N, 0));
    CHECK_EQ(fakecuda()->pending(s), 2);
    fakecuda()->complete(s);
    CHECK(holds(bytes(dev), N, 0x02));
    kernel_fill k = {dev, N, 0x03};
    CHECK_EQ(fakecuda()->launch(s, run_fill, &k), 0);
    before = fake_stats();
    CHECK_EQ(X.MemcpyDtoHAsync(pinned, dev, N, s), CUDA_SUCCESS);
    CHECK(holds(pinned, N, 0x02));
    CHECK_EQ(fakecuda()->pending(s), 2);
    CHECK_EQ(fake_stats().host_copy_waits, before.host_copy_waits);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK(holds(pinned, N, 0x03));
    /* The synchronous form from page-locked memory is "synchronous with
     * respect to the host": done when the call returns, after the work
     * queued before it. */
    fill(pinned, N, 0x04);
    kernel_fill k2 = {dev, N, 0x05};
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, run_fill, &k2), 0);
    CHECK_EQ(X.MemcpyHtoD(dev, pinned, N), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->pending(CU_STREAM_LEGACY), 0);
    CHECK(holds(bytes(dev), N, 0x04));
    /* A memset of it (through its device address) is done when the call
     * returns, after the legacy stream's earlier work. */
    kernel_fill k3 = {(CUdeviceptr)(uintptr_t)mapped, N, 0x06};
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, run_fill, &k3), 0);
    CHECK_EQ(X.MemsetD8((CUdeviceptr)(uintptr_t)mapped + 16, 0x07, N - 16), CUDA_SUCCESS);
    CHECK(holds(mapped, 16, 0x06) && holds((char *)mapped + 16, N - 16, 0x07));
    CHECK_EQ(fakecuda()->pending(CU_STREAM_LEGACY), 0);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(dev), CUDA_SUCCESS);

    /* Freed by its start only, once. */
    before = fake_stats();
    CHECK_EQ(X.MemFreeHost((char *)pinned + 8), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemFreeHost(pageable), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemFreeHost(pinned), CUDA_SUCCESS);
    CHECK_EQ(X.MemFreeHost(pinned), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                   (CUdeviceptr)(uintptr_t)pinned),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(before.host_bytes_in_use - fake_stats().host_bytes_in_use, N);

    /* Gone with its context ("memory allocations by ... cuMemAllocHost()",
     * cuCtxDestroy), like cuMemAlloc's. */
    CUcontext created;
    CHECK_EQ(D.CtxCreate(&created, NULL, 0, d0), CUDA_SUCCESS);
    void *doomed = NULL;
    CHECK_EQ(X.MemHostAlloc(&doomed, N, 0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxDestroy(created), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(ctx), CUDA_SUCCESS);
    CHECK_EQ(X.MemFreeHost(doomed), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemFreeHost(mapped), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().host_bytes_in_use, 0);
}

/* Two devices, a primary context current on each in turn. */
static CUcontext device_ctx(int ordinal)
{
    CUdevice d;
    CUcontext c = NULL;
    CHECK_EQ(D.DeviceGet(&d, ordinal), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c, d), CUDA_SUCCESS);
    return c;
}

/* Two neighbouring granules of device dev's memory mapped at the start of a
 * three-granule reservation (*va, their handles in h), read-write for dev,
 * and a two-granule allocation *big holding 0x62: a range over both
 * mappings is one range of addresses, one past the second is not device
 * memory. Returns the granule. */
static size_t two_mapped_granules(int dev, CUdeviceptr *va, CUmemGenericAllocationHandle h[2],
                                  CUdeviceptr *big)
{
    const size_t g = 2 << 20;
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev}};
    CHECK_EQ(D.MemAddressReserve(va, 3 * g, 0, 0, 0), CUDA_SUCCESS);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(D.MemCreate(&h[i], g, &prop, 0), CUDA_SUCCESS);
        CHECK_EQ(D.MemMap(*va + (size_t)i * g, g, 0, h[i], 0), CUDA_SUCCESS);
    }
    CUmemAccessDesc rw = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK_EQ(D.MemSetAccess(*va, 2 * g, &rw, 1), CUDA_SUCCESS);
    CHECK_EQ(D.MemAlloc(big, 2 * g), CUDA_SUCCESS);
    fill(bytes(*big), 2 * g, 0x62);
    return g;
}

static void fake_peer_copy(void)
{
    start();
    NEED(MemcpyPeerAsync);
    same_through_proc_address("cuMemcpyPeerAsync", "cuMemcpyPeerAsync");
    enum { N = 1 << 16 };
    CUcontext c0 = device_ctx(0), c1 = device_ctx(1);
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    CUdeviceptr b1 = alloc_ok(N);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    CUdeviceptr a0 = alloc_ok(N);
    fill(bytes(a0), N, 0x61);
    fill(bytes(b1), N, 0);
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

    /* Device to device: queued behind the stream's work, no host wait. */
    CHECK_EQ(fakecuda()->launch(s, nothing, NULL), 0);
    fakecuda_stats before = fake_stats();
    CHECK_EQ(X.MemcpyPeerAsync(b1, c1, a0, c0, N, s), CUDA_SUCCESS);
    CHECK(holds(bytes(b1), N, 0));
    CHECK_EQ(fakecuda()->pending(s), 2);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK(holds(bytes(b1), N, 0x61));
    CHECK_EQ(fake_stats().peer_copies - before.peer_copies, 1);
    CHECK_EQ(fake_stats().host_copy_waits, before.host_copy_waits);

    /* cuMemcpyPeer: the same copy on the current context's legacy stream,
     * device to device, so no host wait either; its ranges checked alike. */
    NEED(MemcpyPeer);
    same_through_proc_address("cuMemcpyPeer", "cuMemcpyPeer");
    fill(bytes(b1), N, 0);
    before = fake_stats();
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, nothing, NULL), 0);
    CHECK_EQ(X.MemcpyPeer(b1, c1, a0, c0, N), CUDA_SUCCESS);
    CHECK(holds(bytes(b1), N, 0));
    CHECK_EQ(fakecuda()->pending(CU_STREAM_LEGACY), 2);
    CHECK_EQ(fakecuda()->pending(s), 0);
    fakecuda()->complete(CU_STREAM_LEGACY);
    CHECK(holds(bytes(b1), N, 0x61));
    CHECK_EQ(fake_stats().peer_copies - before.peer_copies, 1);
    CHECK_EQ(fake_stats().host_copy_waits, before.host_copy_waits);
    CHECK_EQ(X.MemcpyPeer(b1 + 8, c1, a0, c0, N), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemcpyPeer(b1, NULL, a0, c0, N), CUDA_ERROR_INVALID_CONTEXT);

    /* Each address must be its context's device memory, whole. */
    CHECK_EQ(X.MemcpyPeerAsync(b1, c0, a0, c0, N, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemcpyPeerAsync(b1, c1, a0, c1, N, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemcpyPeerAsync(b1 + 8, c1, a0, c0, N, s), CUDA_ERROR_INVALID_VALUE);
    static unsigned char host[N];
    CHECK_EQ(X.MemcpyPeerAsync(b1, c1, (CUdeviceptr)(uintptr_t)host, c0, N, s),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemcpyPeerAsync(b1, c1, a0, c0, 0, s), CUDA_SUCCESS);
    /* Contexts: none, or one that is gone. */
    CHECK_EQ(X.MemcpyPeerAsync(b1, NULL, a0, c0, N, s), CUDA_ERROR_INVALID_CONTEXT);
    CUcontext created;
    CUdevice d1;
    CHECK_EQ(D.DeviceGet(&d1, 1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxCreate(&created, NULL, 0, d1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxDestroy(created), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c0), CUDA_SUCCESS);
    CHECK_EQ(X.MemcpyPeerAsync(b1, created, a0, c0, N, s), CUDA_ERROR_INVALID_CONTEXT);

    /* Virtual memory: a range over two neighbouring mappings of device 1's
     * memory is one range of addresses (a pool's granules are mapped so);
     * one that runs past the last mapping is not device memory. */
    CUdeviceptr va = 0, big = 0;
    CUmemGenericAllocationHandle h[2];
    const size_t g = two_mapped_granules(1, &va, h, &big);
    CHECK_EQ(X.MemcpyPeerAsync(va + g / 2, c1, big, c0, g, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK(holds(bytes(va + g / 2), g, 0x62));
    CHECK_EQ(X.MemcpyPeerAsync(va + g, c1, big, c0, 2 * g, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemcpyPeerAsync(va, c0, big, c0, g, s), CUDA_ERROR_INVALID_VALUE);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(D.MemUnmap(va + (size_t)i * g, g), CUDA_SUCCESS);
        CHECK_EQ(D.MemRelease(h[i]), CUDA_SUCCESS);
    }
    CHECK_EQ(D.MemAddressFree(va, 3 * g), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(big), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(a0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(b1), CUDA_SUCCESS);
}

static CUmemAccessDesc access_of(int device, CUmemAccess_flags flags)
{
    CUmemAccessDesc d = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device},
                         .flags = flags};
    return d;
}

static CUmemAccess_flags pool_access(CUmemoryPool pool, int device)
{
    CUmemLocation where = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device};
    CUmemAccess_flags f = (CUmemAccess_flags)-1;
    CHECK_EQ(X.MemPoolGetAccess(&f, pool, &where), CUDA_SUCCESS);
    return f;
}

static void fake_pool_access(void)
{
    start();
    NEED(MemPoolSetAccess);
    NEED(MemPoolGetAccess);
    same_through_proc_address("cuMemPoolSetAccess", "cuMemPoolSetAccess");
    CUdevice d0;
    CHECK_EQ(D.DeviceGet(&d0, 0), CUDA_SUCCESS);
    CUmemoryPool pool;
    CHECK_EQ(D.DeviceGetDefaultMemPool(&pool, d0), CUDA_SUCCESS);
    CHECK_EQ(pool_access(pool, 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(pool_access(pool, 1), CU_MEM_ACCESS_FLAGS_PROT_NONE);

    /* A grant, replaced by a later one, taken back. */
    fakecuda_stats before = fake_stats();
    CUmemAccessDesc both[] = {access_of(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
                              access_of(1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)};
    CHECK_EQ(X.MemPoolSetAccess(pool, both, 2), CUDA_SUCCESS);
    CHECK_EQ(pool_access(pool, 1), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CUmemAccessDesc read = access_of(1, CU_MEM_ACCESS_FLAGS_PROT_READ);
    CHECK_EQ(X.MemPoolSetAccess(pool, &read, 1), CUDA_SUCCESS);
    CHECK_EQ(pool_access(pool, 1), CU_MEM_ACCESS_FLAGS_PROT_READ);
    CUmemAccessDesc none = access_of(1, CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(X.MemPoolSetAccess(pool, &none, 1), CUDA_SUCCESS);
    CHECK_EQ(pool_access(pool, 1), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(fake_stats().pool_access_calls - before.pool_access_calls, 3);
    CHECK_EQ(X.MemPoolSetAccess(pool, NULL, 0), CUDA_SUCCESS);

    /* Refused, and nothing changed: the owner's access ("cannot be
     * revoked"), a device that is not there, unknown flags, a pool the
     * driver never made, descriptors missing. */
    CUmemAccessDesc bad[] = {access_of(1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
                             access_of(0, CU_MEM_ACCESS_FLAGS_PROT_READ)};
    CHECK_EQ(X.MemPoolSetAccess(pool, bad, 2), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(pool_access(pool, 1), CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CHECK_EQ(pool_access(pool, 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CUmemAccessDesc nowhere = access_of(7, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(X.MemPoolSetAccess(pool, &nowhere, 1), CUDA_ERROR_INVALID_VALUE);
    CUmemAccessDesc odd = access_of(1, (CUmemAccess_flags)2);
    CHECK_EQ(X.MemPoolSetAccess(pool, &odd, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemPoolSetAccess((CUmemoryPool)(uintptr_t)0x1234, both, 2),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemPoolSetAccess(pool, NULL, 1), CUDA_ERROR_INVALID_VALUE);
    CUmemLocation where = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 9};
    CUmemAccess_flags f;
    CHECK_EQ(X.MemPoolGetAccess(&f, pool, &where), CUDA_ERROR_INVALID_VALUE);

    /* A created pool on device 1 has its own grants. */
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1}};
    CUmemoryPool made;
    CHECK_EQ(D.MemPoolCreate(&made, &props), CUDA_SUCCESS);
    CHECK_EQ(pool_access(made, 1), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CUmemAccessDesc to0 = access_of(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(X.MemPoolSetAccess(made, &to0, 1), CUDA_SUCCESS);
    CHECK_EQ(pool_access(made, 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(pool_access(pool, 1), CU_MEM_ACCESS_FLAGS_PROT_NONE);
}

static cuuint64_t pool_figure(CUmemoryPool pool, CUmemPool_attribute attr)
{
    cuuint64_t v = 0;
    CHECK_EQ(D.MemPoolGetAttribute(pool, attr, &v), CUDA_SUCCESS);
    return v;
}

static void set_reuse(CUmemoryPool pool, CUmemPool_attribute attr, int on)
{
    CHECK_EQ(D.MemPoolSetAttribute(pool, attr, &on), CUDA_SUCCESS);
}

/* cuMemPoolCreate's properties, and what a stream-ordered free's memory may
 * serve before its stream reaches it: the freeing stream at once, another
 * only as the reuse policies allow; a trim cannot give it back until then
 * ("cannot release OS allocations that back outstanding asynchronous
 * allocations"; unobserved frees "can count as outstanding", cuda.h). */
static void fake_pool_reuse(void)
{
    start();
    NEED(MemPoolDestroy);
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemoryPool pool;
    CUmemPoolProps bad = props;
    bad.location.type = CU_MEM_LOCATION_TYPE_INVALID;
    CHECK_EQ(D.MemPoolCreate(&pool, &bad), CUDA_ERROR_INVALID_VALUE);
    bad = props;
    bad.allocType = CU_MEM_ALLOCATION_TYPE_INVALID;
    CHECK_EQ(D.MemPoolCreate(&pool, &bad), CUDA_ERROR_INVALID_VALUE);
    bad = props;
    bad.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
    CHECK_EQ(D.MemPoolCreate(&pool, &bad), CUDA_ERROR_INVALID_VALUE);
    bad = props;
    bad.location.type = CU_MEM_LOCATION_TYPE_HOST; /* host pools: not modelled */
    CHECK_EQ(D.MemPoolCreate(&pool, &bad), CUDA_ERROR_NOT_SUPPORTED);
    bad = props;
    bad.handleTypes = (CUmemAllocationHandleType)0x100;
    CHECK_EQ(D.MemPoolCreate(&pool, &bad), CUDA_ERROR_INVALID_VALUE);
    bad = props;
    bad.handleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    CHECK_EQ(D.MemPoolCreate(&pool, &bad), CUDA_ERROR_NOT_SUPPORTED);
    bad = props;
    bad.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemoryPool ipc;
    CHECK_EQ(D.MemPoolCreate(&ipc, &bad), CUDA_SUCCESS);
    CHECK_EQ(X.MemPoolDestroy(ipc), CUDA_SUCCESS);

    CHECK_EQ(D.MemPoolCreate(&pool, &props), CUDA_SUCCESS);
    cuuint64_t keep_all = UINT64_MAX;
    CHECK_EQ(D.MemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all),
             CUDA_SUCCESS);
    set_reuse(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 0);
    set_reuse(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, 0);
    CUstream s1, s2;
    CHECK_EQ(D.StreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    size_t fr, total;
    CHECK_EQ(D.MemGetInfo(&fr, &total), CUDA_SUCCESS);
    const size_t n = fr - fr % MiB; /* all the device has */
    CUdeviceptr a, b;
    CHECK_EQ(D.MemAllocFromPoolAsync(&a, n, pool, s1), CUDA_SUCCESS);
    CHECK_EQ(D.MemFreeAsync(a, s1), CUDA_SUCCESS);

    /* Queued on s1, not reached: s2 may not have it (no policy allows). */
    CHECK_EQ(D.MemAllocFromPoolAsync(&b, n, pool, s2), CUDA_ERROR_OUT_OF_MEMORY);
    /* ... nor may a trim give it back. */
    CHECK_EQ(D.MemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    CHECK_EQ(pool_figure(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), n);
    /* s1 itself may, in stream order. */
    CHECK_EQ(D.MemAllocFromPoolAsync(&b, n, pool, s1), CUDA_SUCCESS);
    CHECK_EQ(D.MemFreeAsync(b, s1), CUDA_SUCCESS);
    /* Internal dependencies let s2 have it before s1 reaches the free. */
    set_reuse(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 1);
    CHECK_EQ(D.MemAllocFromPoolAsync(&b, n, pool, s2), CUDA_SUCCESS);
    CHECK_EQ(D.MemFreeAsync(b, s2), CUDA_SUCCESS);
    set_reuse(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 0);
    CHECK_EQ(D.MemAllocFromPoolAsync(&b, n, pool, s1), CUDA_ERROR_OUT_OF_MEMORY);
    /* Reached (synchronised): opportunistic reuse serves any stream. */
    CHECK_EQ(D.StreamSynchronize(s2), CUDA_SUCCESS);
    CHECK_EQ(pool_figure(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), n);
    set_reuse(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, 1);
    CHECK_EQ(D.MemAllocFromPoolAsync(&b, n, pool, s1), CUDA_SUCCESS);
    CHECK_EQ(D.MemFreeAsync(b, s1), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s1), CUDA_SUCCESS);
    /* Every free reached: the trim gives it all back. */
    CHECK_EQ(D.MemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    CHECK_EQ(pool_figure(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
    CHECK_EQ(D.StreamDestroy(s1), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s2), CUDA_SUCCESS);
    CHECK_EQ(X.MemPoolDestroy(pool), CUDA_SUCCESS);
}

/* Virtual memory arguments cuda.h rules out: a reservation's address hint
 * that is no multiple of the page size ("The size and address parameters
 * must be a multiple of the host page size"), access flags that are none
 * of CUmemAccess_flags' (refused, not read as no access); and what it
 * allows: a handle released while mapped keeps its memory until unmapped. */
static void fake_vmm_args(void)
{
    start();
    const CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                      .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    size_t g = 0;
    CHECK_EQ(D.MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
             CUDA_SUCCESS);
    CUdeviceptr va = 0;
    CHECK_EQ(D.MemAddressReserve(&va, g, 0, (CUdeviceptr)(0x7f0000000000ull + 1), 0),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemAddressReserve(&va, g, 0, 0, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h;
    CHECK_EQ(D.MemCreate(&h, g, &prop, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemMap(va, g, 0, h, 0), CUDA_SUCCESS);
    CUmemAccessDesc odd = {.location = prop.location, .flags = (CUmemAccess_flags)2};
    CHECK_EQ(D.MemSetAccess(va, g, &odd, 1), CUDA_ERROR_INVALID_VALUE);
    CUmemAccessDesc rw = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK_EQ(D.MemSetAccess(va, g, &rw, 1), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS); /* the mapping keeps the memory */
    memset(bytes(va), 0x5a, g);
    CHECK_EQ(bytes(va)[g - 1], 0x5a);
    CHECK_EQ(D.MemUnmap(va, g), CUDA_SUCCESS);
    CHECK_EQ(D.MemAddressFree(va, g), CUDA_SUCCESS);
}

static void fake_stream_write(void)
{
    start();
    NEED(StreamWriteValue64);
    NEED(MemHostAlloc);
    same_through_proc_address("cuStreamWriteValue64", "cuStreamWriteValue64_v2");
    CUdevice d0;
    CHECK_EQ(D.DeviceGet(&d0, 0), CUDA_SUCCESS);
    int ops = 0;
    CHECK_EQ(D.DeviceGetAttribute(&ops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, d0),
             CUDA_SUCCESS);
    CHECK_EQ(ops, 1);
    enum { N = 4096 };
    CUdeviceptr dev = alloc_ok(N);
    fill(bytes(dev), N, 0);
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

    /* Written when the stream reaches it. */
    const uint64_t v = UINT64_C(0x0123456789abcdef);
    CHECK_EQ(fakecuda()->launch(s, nothing, NULL), 0);
    CHECK_EQ(X.StreamWriteValue64(s, dev + 64, v, CU_STREAM_WRITE_VALUE_DEFAULT), CUDA_SUCCESS);
    CHECK_EQ(*(uint64_t *)(uintptr_t)(dev + 64), 0);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(*(uint64_t *)(uintptr_t)(dev + 64), v);
    /* Into page-locked host memory too, at its device address. */
    void *pinned = NULL;
    CHECK_EQ(X.MemHostAlloc(&pinned, N, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
    CHECK_EQ(X.StreamWriteValue64(s, (CUdeviceptr)(uintptr_t)pinned + N - 8, v,
                                  CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER),
             CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(*(uint64_t *)((char *)pinned + N - 8), v);

    /* Refused: pageable memory, past the end, unaligned, unknown flags, a
     * stream that is gone. */
    static uint64_t pageable[4];
    CHECK_EQ(X.StreamWriteValue64(s, (CUdeviceptr)(uintptr_t)pageable, v, 0),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.StreamWriteValue64(s, dev + N, v, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.StreamWriteValue64(s, dev + 4, v, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.StreamWriteValue64(s, dev, v, 2), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(fake_stats().stream_value_writes, 2);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(X.StreamWriteValue64(s, dev, v, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemFreeHost(pinned), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(dev), CUDA_SUCCESS);
}

static void fake_pci_bus_id(void)
{
    start();
    NEED(DeviceGetPCIBusId);
    char id[16];
    for (int ordinal = 0; ordinal < 2; ordinal++) {
        CUdevice d;
        int bus = -1;
        CHECK_EQ(D.DeviceGet(&d, ordinal), CUDA_SUCCESS);
        CHECK_EQ(D.DeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d), CUDA_SUCCESS);
        char want[16];
        snprintf(want, sizeof want, "0000:%02x:00.0", (unsigned)bus);
        CHECK_EQ(X.DeviceGetPCIBusId(id, sizeof id, d), CUDA_SUCCESS);
        CHECK(strcmp(id, want) == 0);
        CHECK_EQ(strlen(id) + 1, 13); /* "13 characters including the NULL-terminator" */
    }
    /* A short buffer gets the string cut, terminated. */
    memset(id, 'x', sizeof id);
    CHECK_EQ(X.DeviceGetPCIBusId(id, 5, 0), CUDA_SUCCESS);
    CHECK(strcmp(id, "0000") == 0);
    CHECK_EQ(X.DeviceGetPCIBusId(id, sizeof id, 2), CUDA_ERROR_INVALID_DEVICE);
    CHECK_EQ(X.DeviceGetPCIBusId(NULL, 13, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.DeviceGetPCIBusId(id, 0, 0), CUDA_ERROR_INVALID_VALUE);
}

/* NVML, as a framework reaches it: dlopen by soname, each function by
 * name. Types as nvml.h has them (int results, opaque device handles). */
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType, nvmlReturn;
    union {
        double d;
        unsigned int ui;
        unsigned long long ull;
    } value;
} nvml_field_value;

static struct {
    int (*Init)(void);
    int (*Shutdown)(void);
    const char *(*ErrorString)(int);
    int (*SystemGetDriverVersion)(char *, unsigned);
    int (*DeviceGetCount)(unsigned *);
    int (*DeviceGetHandleByIndex)(unsigned, void **);
    int (*DeviceGetHandleByPciBusId)(const char *, void **);
    int (*DeviceGetCurrPcieLinkGeneration)(void *, unsigned *);
    int (*DeviceGetCurrPcieLinkWidth)(void *, unsigned *);
    int (*DeviceGetMigMode)(void *, unsigned *, unsigned *);
    int (*DeviceGetFieldValues)(void *, int, nvml_field_value *);
    int (*DeviceGetNvLinkState)(void *, unsigned, unsigned *);
    int (*DeviceGetNvLinkCapability)(void *, unsigned, unsigned, unsigned *);
    int (*DeviceGetGpuFabricInfoV)(void *, void *);
} N;

/* nvmlGpuFabricInfo_v3_t as nvml.h lays it out (40 bytes; v2 is its first
 * 36), with its version words (size | version << 24). */
typedef struct {
    unsigned version;
    unsigned char cluster_uuid[16];
    int status;
    unsigned clique_id;
    unsigned char state;
    unsigned health_mask;
    unsigned char health_summary;
} nvml_fabric_info;
#define FABRIC_V2 (36u | 2u << 24)
#define FABRIC_V3 (40u | 3u << 24)

enum { NVML_OK = 0, NVML_UNINITIALIZED = 1, NVML_INVALID_ARGUMENT = 2, NVML_NOT_SUPPORTED = 3,
       NVML_NOT_FOUND = 6, NVML_INSUFFICIENT_SIZE = 7, NVML_VERSION_MISMATCH = 25 };

static bool load_nvml(void)
{
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "no libnvidia-ml.so.1 on the loader's path: %s\n", dlerror());
        e2e_failures++;
        return false;
    }
#define N_FN(field, name) *(void **)&N.field = e2e_dlsym(h, name)
    N_FN(Init, "nvmlInit_v2");
    N_FN(Shutdown, "nvmlShutdown");
    N_FN(ErrorString, "nvmlErrorString");
    N_FN(SystemGetDriverVersion, "nvmlSystemGetDriverVersion");
    N_FN(DeviceGetCount, "nvmlDeviceGetCount_v2");
    N_FN(DeviceGetHandleByIndex, "nvmlDeviceGetHandleByIndex_v2");
    N_FN(DeviceGetHandleByPciBusId, "nvmlDeviceGetHandleByPciBusId_v2");
    N_FN(DeviceGetCurrPcieLinkGeneration, "nvmlDeviceGetCurrPcieLinkGeneration");
    N_FN(DeviceGetCurrPcieLinkWidth, "nvmlDeviceGetCurrPcieLinkWidth");
    N_FN(DeviceGetMigMode, "nvmlDeviceGetMigMode");
    N_FN(DeviceGetFieldValues, "nvmlDeviceGetFieldValues");
    N_FN(DeviceGetNvLinkState, "nvmlDeviceGetNvLinkState");
    N_FN(DeviceGetNvLinkCapability, "nvmlDeviceGetNvLinkCapability");
    N_FN(DeviceGetGpuFabricInfoV, "nvmlDeviceGetGpuFabricInfoV");
#undef N_FN
    return true;
}

/* NVML's handle of the device at the bus id the fake driver gives CUDA
 * device `ordinal`, and that of NVML's device `nvml_index`: the same. */
static void check_nvml_device(int ordinal, unsigned nvml_index)
{
    char bus[16];
    CHECK_EQ(X.DeviceGetPCIBusId(bus, sizeof bus, ordinal), CUDA_SUCCESS);
    void *by_bus = NULL, *by_index = NULL;
    CHECK_EQ(N.DeviceGetHandleByPciBusId(bus, &by_bus), NVML_OK);
    CHECK_EQ(N.DeviceGetHandleByIndex(nvml_index, &by_index), NVML_OK);
    CHECK(by_bus && by_bus == by_index);
    /* NVML's own long form (8 hex digits of domain), and bus:device.function. */
    char longer[32], shorter[16];
    snprintf(longer, sizeof longer, "0000%s", bus);
    snprintf(shorter, sizeof shorter, "%s", bus + 5);
    void *h = NULL;
    CHECK_EQ(N.DeviceGetHandleByPciBusId(longer, &h), NVML_OK);
    CHECK(h == by_bus);
    h = NULL;
    CHECK_EQ(N.DeviceGetHandleByPciBusId(shorter, &h), NVML_OK);
    CHECK(h == by_bus);
}

static void nvml_checks(int cuda_devices, const unsigned *nvml_index_of)
{
    start();
    NEED(DeviceGetPCIBusId);
    if (!load_nvml())
        return;
    /* Nothing answers before nvmlInit but the error strings. */
    unsigned n = 0;
    CHECK_EQ(N.DeviceGetCount(&n), NVML_UNINITIALIZED);
    CHECK_EQ(N.Shutdown(), NVML_UNINITIALIZED);
    CHECK(strcmp(N.ErrorString(NVML_NOT_FOUND), "Not Found") == 0);
    CHECK_EQ(N.Init(), NVML_OK);
    CHECK_EQ(N.Init(), NVML_OK); /* counted: two shutdowns to end it */

    char version[80];
    CHECK_EQ(N.SystemGetDriverVersion(version, 4), NVML_INSUFFICIENT_SIZE);
    CHECK_EQ(N.SystemGetDriverVersion(version, sizeof version), NVML_OK);
    unsigned major = 0;
    CHECK(sscanf(version, "%u.", &major) == 1 && major >= 525);
    /* NVML sees the machine's devices, whatever CUDA_VISIBLE_DEVICES says. */
    CHECK_EQ(N.DeviceGetCount(&n), NVML_OK);
    CHECK_EQ(n, 2);
    for (int d = 0; d < cuda_devices; d++)
        check_nvml_device(d, nvml_index_of[d]);
    void *h = NULL;
    CHECK_EQ(N.DeviceGetHandleByPciBusId("0000:77:00.0", &h), NVML_NOT_FOUND);
    CHECK_EQ(N.DeviceGetHandleByPciBusId("bus 16", &h), NVML_INVALID_ARGUMENT);
    CHECK_EQ(N.DeviceGetHandleByIndex(2, &h), NVML_INVALID_ARGUMENT);

    CHECK_EQ(N.DeviceGetHandleByIndex(0, &h), NVML_OK);
    unsigned gen = 0, width = 0, mig = 9, pending = 9;
    CHECK_EQ(N.DeviceGetCurrPcieLinkGeneration(h, &gen), NVML_OK);
    CHECK_EQ(N.DeviceGetCurrPcieLinkWidth(h, &width), NVML_OK);
    CHECK(gen == 5 && width == 16);
    CHECK_EQ(N.DeviceGetMigMode(h, &mig, &pending), NVML_OK);
    CHECK(mig == 0 && pending == 0);
    CHECK_EQ(N.DeviceGetCurrPcieLinkWidth((void *)&n, &width), NVML_INVALID_ARGUMENT);
    nvml_field_value f[2] = {{.fieldId = 91, .nvmlReturn = -1}, {.fieldId = 1, .nvmlReturn = -1}};
    CHECK_EQ(sizeof f[0], 40);
    CHECK_EQ(N.DeviceGetFieldValues(h, 2, f), NVML_OK);
    CHECK(f[0].nvmlReturn == NVML_OK && f[0].valueType == 1 && f[0].value.ui == 0);
    CHECK_EQ(f[1].nvmlReturn, NVML_NOT_SUPPORTED);
    /* A PCIe card: no NVLink state or capability, no fabric (XLA and
     * TensorFlow ask each device; a missing function is an error line). */
    unsigned active = 7, cap = 7;
    CHECK_EQ(N.DeviceGetNvLinkState(h, 0, &active), NVML_NOT_SUPPORTED);
    CHECK_EQ(N.DeviceGetNvLinkState(h, 0, NULL), NVML_INVALID_ARGUMENT);
    CHECK_EQ(N.DeviceGetNvLinkCapability(h, 0, 0, &cap), NVML_NOT_SUPPORTED);
    CHECK_EQ(N.DeviceGetNvLinkState((void *)&n, 0, &active), NVML_INVALID_ARGUMENT);
    CHECK(active == 7 && cap == 7);
    CHECK_EQ(sizeof(nvml_fabric_info), 40);
    nvml_fabric_info fi;
    memset(&fi, 0xee, sizeof fi);
    fi.version = FABRIC_V3;
    CHECK_EQ(N.DeviceGetGpuFabricInfoV(h, &fi), NVML_OK);
    CHECK(fi.state == 0 && fi.status == NVML_OK && fi.clique_id == 0 && fi.health_mask == 0 &&
          fi.health_summary == 0 && fi.cluster_uuid[15] == 0);
    memset(&fi, 0xee, sizeof fi);
    fi.version = FABRIC_V2;
    CHECK_EQ(N.DeviceGetGpuFabricInfoV(h, &fi), NVML_OK);
    CHECK(fi.state == 0 && fi.health_summary == 0xee); /* v2 ends before it */
    fi.version = 40u | 9u << 24;
    CHECK_EQ(N.DeviceGetGpuFabricInfoV(h, &fi), NVML_VERSION_MISMATCH);
    CHECK_EQ(N.DeviceGetGpuFabricInfoV(h, NULL), NVML_INVALID_ARGUMENT);

    CHECK_EQ(N.Shutdown(), NVML_OK);
    CHECK_EQ(N.DeviceGetCount(&n), NVML_OK);
    CHECK_EQ(N.Shutdown(), NVML_OK);
    CHECK_EQ(N.DeviceGetCount(&n), NVML_UNINITIALIZED);
}

static void fake_nvml(void)
{
    static const unsigned same[] = {0, 1};
    nvml_checks(2, same);
}

static void fake_nvml_visible(void) /* CUDA_VISIBLE_DEVICES=1 */
{
    static const unsigned second[] = {1};
    nvml_checks(1, second);
}

/* Visible device `ordinal` is the machine's device `machine` of `mem`
 * bytes: its memory, UUID ("GPU-fa..." is device 0's) and PCI bus (0x10
 * per device) follow it. */
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

/* Every 32-bit element of [p, p + 4n) holds v. */
static bool holds32(CUdeviceptr p, size_t n, uint32_t v)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t got;
        memcpy(&got, bytes(p) + 4 * i, 4);
        if (got != v)
            return false;
    }
    return true;
}

static CUstreamCaptureStatus capture_status(CUstream s)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CHECK_EQ(X.StreamIsCapturing(s, &st), CUDA_SUCCESS);
    return st;
}

/* e records on `from`, `to` waits on it. */
static CUresult record_then_wait(CUevent e, CUstream from, CUstream to)
{
    CUresult r = D.EventRecord(e, from);
    return r != CUDA_SUCCESS ? r : D.StreamWaitEvent(to, e, 0);
}

/* A fork joined back, then made to wait on the origin once more and given
 * nothing else to do: its only dependencies are the origin's own nodes,
 * already upstream of the end, so no work is unjoined (the audit of
 * fc66a80 found the fake answering UNJOINED). */
static void fake_fork_rewait(void)
{
    start();
    CUstream origin, side;
    CHECK_EQ(D.StreamCreate(&origin, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&side, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUevent ev[3];
    for (int i = 0; i < 3; i++)
        CHECK_EQ(D.EventCreate(&ev[i], CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(record_then_wait(ev[0], origin, side), CUDA_SUCCESS); /* fork */
    CHECK_EQ(record_then_wait(ev[1], side, origin), CUDA_SUCCESS); /* join */
    CHECK_EQ(record_then_wait(ev[2], origin, side), CUDA_SUCCESS); /* wait again */
    CUgraph g = NULL;
    CHECK_EQ(D.StreamEndCapture(origin, &g), CUDA_SUCCESS);
    if (g)
        CHECK_EQ(X.GraphDestroy(g), CUDA_SUCCESS);
}

/* The capture begun on `origin` ends valid, with a graph. */
static void end_capture_ok(CUstream origin)
{
    CUgraph g = NULL;
    CHECK_EQ(D.StreamEndCapture(origin, &g), CUDA_SUCCESS);
    CHECK(g != NULL);
    if (g)
        CHECK_EQ(X.GraphDestroy(g), CUDA_SUCCESS);
}

/* The capture begun on `origin` was invalidated: its end says so and
 * returns no graph. */
static void end_capture_invalidated(CUstream origin)
{
    CUgraph g = (CUgraph)&g;
    CHECK_EQ(D.StreamEndCapture(origin, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(g == NULL);
}

/* The programming guide's prohibited operations during a capture: each is
 * refused and invalidates the capture, in relaxed mode too. */
static void fake_capture_misuse(void)
{
    start();
    NEED(StreamIsCapturing);
    NEED(EventSynchronize);
    NEED(GraphDestroy);
    CUstream s, other, blocking;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&blocking, 0), CUDA_SUCCESS);
    CUevent captured, queued, never;
    CHECK_EQ(D.EventCreate(&captured, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&queued, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&never, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(queued, other), CUDA_SUCCESS);
    const uint64_t inv0 = fake_stats().capture_invalidations;

    /* Each prohibited call in a capture of its own: refused, and the
     * capture's end finds it invalidated. */
    const struct {
        enum { QUERY_STREAM, SYNC_STREAM, QUERY_EVENT, SYNC_EVENT, ALLOC_ON, FREE_ON, RECORD_ON } op;
        CUstream capturing, asked; /* asked: the stream queried or synchronised */
        CUresult want;
    } misuses[] = {
        {QUERY_STREAM, s, s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED},
        {SYNC_STREAM, s, s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED},
        {QUERY_EVENT, s, NULL, CUDA_ERROR_CAPTURED_EVENT}, /* recorded in the capture */
        {SYNC_EVENT, s, NULL, CUDA_ERROR_CAPTURED_EVENT},
        /* the legacy stream while a blocking stream captures */
        {QUERY_STREAM, blocking, CU_STREAM_LEGACY, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT},
        {SYNC_STREAM, blocking, NULL, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT},
        /* stream-ordered work there, as any: a stream-ordered allocation or
         * free, an event recorded (how the shim refuses a pooled free) */
        {ALLOC_ON, blocking, CU_STREAM_LEGACY, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT},
        {FREE_ON, blocking, NULL, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT},
        {RECORD_ON, blocking, CU_STREAM_LEGACY, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT},
    };
    CUdeviceptr kept = 0;
    CHECK_EQ(D.MemAllocAsync(&kept, 4096, other), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(other), CUDA_SUCCESS);
    const size_t nmisuses = sizeof misuses / sizeof misuses[0];
    for (size_t i = 0; i < nmisuses; i++) {
        CUstream c = misuses[i].capturing;
        CHECK_EQ(D.StreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
        CUresult r = CUDA_SUCCESS;
        switch (misuses[i].op) {
        case QUERY_STREAM: r = D.StreamQuery(misuses[i].asked); break;
        case SYNC_STREAM: r = D.StreamSynchronize(misuses[i].asked); break;
        case ALLOC_ON: {
            CUdeviceptr p = 0;
            r = D.MemAllocAsync(&p, 4096, misuses[i].asked);
            CHECK(p == 0);
            break;
        }
        case FREE_ON: r = D.MemFreeAsync(kept, misuses[i].asked); break;
        case RECORD_ON: r = D.EventRecord(never, misuses[i].asked); break;
        case QUERY_EVENT:
        case SYNC_EVENT:
            CHECK_EQ(D.EventRecord(captured, c), CUDA_SUCCESS);
            r = misuses[i].op == QUERY_EVENT ? D.EventQuery(captured) : X.EventSynchronize(captured);
            break;
        }
        CHECK_EQ(r, misuses[i].want);
        CHECK_EQ(capture_status(c), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
        end_capture_invalidated(c);
    }
    CHECK_EQ(fake_stats().capture_invalidations, inv0 + nmisuses);
    CHECK_EQ(D.MemFreeAsync(kept, other), CUDA_SUCCESS); /* refused above: still live */

    /* Not prohibited: a captured event asked about after its capture ended
     * (refused, nothing left to invalidate); the capture status of the
     * legacy stream while a blocking stream captures; the legacy stream
     * queried while only a non-blocking stream captures. */
    CHECK_EQ(D.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(captured, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamQuery(CU_STREAM_LEGACY), CUDA_SUCCESS);
    end_capture_ok(s);
    CHECK_EQ(D.EventQuery(captured), CUDA_ERROR_CAPTURED_EVENT);
    CHECK_EQ(D.StreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CUstreamCaptureStatus st;
    CHECK_EQ(X.StreamIsCapturing(CU_STREAM_LEGACY, &st), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    end_capture_ok(blocking);
    CHECK_EQ(fake_stats().capture_invalidations, inv0 + nmisuses);

    /* A capturing stream waiting on work queued outside the capture: not
     * without CU_EVENT_WAIT_EXTERNAL, which makes the wait a node; an
     * event never recorded carries no work to wait for. The flag outside
     * a capture, or an unknown flag, is refused and changes nothing. */
    CHECK_EQ(D.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(D.StreamWaitEvent(s, never, 0), CUDA_SUCCESS);
    CHECK_EQ(D.StreamWaitEvent(s, queued, CU_EVENT_WAIT_EXTERNAL), CUDA_SUCCESS);
    CHECK_EQ(capture_status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CHECK_EQ(D.StreamWaitEvent(s, queued, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    end_capture_invalidated(s);
    CHECK_EQ(D.StreamWaitEvent(other, queued, CU_EVENT_WAIT_EXTERNAL), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.StreamWaitEvent(other, queued, 0x2), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.StreamWaitEvent(other, queued, 0), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().capture_invalidations, inv0 + nmisuses + 1);

    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(other), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(blocking), CUDA_SUCCESS);
}

/* cuMemFreeAsync "During stream capture ... results in the creation of a
 * free node and must therefore be passed the address of a graph
 * allocation" (cuda.h); cuGraphAddMemFreeNode, the node it makes, "will
 * return CUDA_ERROR_INVALID_VALUE if the user attempts to free ... an
 * address that was not returned by an allocation node". So a free into a
 * capture of memory the pool (or cuMemAlloc) gave out is refused and the
 * memory stays live; an allocation made in a capture (a graph allocation)
 * may be freed in one. Whether the refusal also invalidates the capture
 * cuda.h does not say: not checked. */
static void fake_capture_free_async(void)
{
    start();
    NEED(GraphDestroy);
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr pooled = 0, plain = 0, graph_owned = 0;
    CHECK_EQ(D.MemAllocAsync(&pooled, 4096, s), CUDA_SUCCESS);
    CHECK_EQ(D.MemAlloc(&plain, 4096), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    const uint64_t frees0 = fake_stats().mem_free_async_calls;

    CHECK_EQ(D.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(D.MemFreeAsync(pooled, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemFreeAsync(plain, s), CUDA_ERROR_INVALID_VALUE);
    CHECK(fakecuda()->is_device_pointer(pooled));
    CHECK(fakecuda()->is_device_pointer(plain));
    CHECK_EQ(D.MemAllocAsync(&graph_owned, 4096, s), CUDA_SUCCESS);
    CHECK_EQ(D.MemFreeAsync(graph_owned, s), CUDA_SUCCESS);
    CUgraph g = NULL;
    (void)D.StreamEndCapture(s, &g);
    if (g)
        CHECK_EQ(X.GraphDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().mem_free_async_calls, frees0 + 3);

    /* Outside the capture both go as usual. */
    CHECK_EQ(D.MemFreeAsync(pooled, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(plain), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
}

/* The programming guide ("Invalidation"): "When a capture graph is
 * invalidated, further use of any streams which are being captured or
 * captured events associated with the graph is invalid and will return an
 * error, until stream capture is ended"; cuda.h's code for it,
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: "the current capture sequence on
 * the stream has been invalidated due to a previous error". So once a
 * prohibited call has invalidated a capture, work given to its stream (a
 * copy, a memset, a host function, a kernel, an event record, a wait, a
 * stream-ordered allocation or free) is refused, as is a wait on an event
 * recorded in it (no stream joins an invalidated capture); after the end
 * the stream takes work again. */
static void fake_capture_invalidated_use(void)
{
    start();
    NEED(MemcpyDtoDAsync);
    NEED(MemsetD8Async);
    NEED(StreamIsCapturing);
    CUstream s, other;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr a = 0, b = 0, graph_owned = 0;
    CHECK_EQ(D.MemAlloc(&a, 4096), CUDA_SUCCESS);
    CHECK_EQ(D.MemAlloc(&b, 4096), CUDA_SUCCESS);
    CUevent in_capture, later, never;
    CHECK_EQ(D.EventCreate(&in_capture, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&later, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&never, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);

    CHECK_EQ(D.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(D.MemAllocAsync(&graph_owned, 4096, s), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(in_capture, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamQuery(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); /* invalidates */
    CHECK_EQ(capture_status(s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);

    const CUresult inv = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    CHECK_EQ(X.MemcpyDtoDAsync(a, b, 64, s), inv);
    CHECK_EQ(X.MemsetD8Async(a, 7, 64, s), inv);
    CHECK_EQ(D.EventRecord(later, s), inv);
    CHECK_EQ(D.StreamWaitEvent(s, never, 0), inv);
    CUdeviceptr p = 0;
    CHECK_EQ(D.MemAllocAsync(&p, 4096, s), inv);
    CHECK(p == 0);
    CHECK_EQ(D.MemFreeAsync(graph_owned, s), inv);
    bool ran = false;
    CHECK(fakecuda()->launch(s, set_flag, &ran) != 0);
    /* A stream waiting on an event recorded in the invalidated capture:
     * refused, and it does not join the capture. */
    CHECK_EQ(D.StreamWaitEvent(other, in_capture, 0), inv);
    CHECK_EQ(capture_status(other), CU_STREAM_CAPTURE_STATUS_NONE);
    end_capture_invalidated(s);

    /* Ended: the stream takes work again. */
    CHECK_EQ(X.MemsetD8Async(a, 7, 64, s), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(later, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK(bytes(a)[63] == 7);
    CHECK(!ran);
    CHECK_EQ(D.MemFree(a), CUDA_SUCCESS);
    CHECK_EQ(D.MemFree(b), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(other), CUDA_SUCCESS);
}

static void fake_capture_fork(void)
{
    start();
    NEED(StreamIsCapturing);
    NEED(GraphDestroy);
    enum { N = 4096 };
    CUdeviceptr dev = alloc_ok(N);
    memset(bytes(dev), 0, N);
    CUstream origin, side, third, other, blocking;
    CHECK_EQ(D.StreamCreate(&origin, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&side, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&third, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&blocking, 0), CUDA_SUCCESS);
    CUevent ev[4];
    for (int i = 0; i < 4; i++)
        CHECK_EQ(D.EventCreate(&ev[i], CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CUgraph g = NULL;

    /* A fork joined back: side captures until the origin's end. Work side
     * queued before the fork still runs; what it queues after is the
     * graph's. */
    kernel_fill before = {dev, 16, 0x11}, during = {dev + 16, 16, 0x22};
    CHECK_EQ(fakecuda()->launch(side, run_fill, &before), 0);
    fakecuda_stats s0 = fake_stats();
    CHECK_EQ(D.StreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(capture_status(side), CU_STREAM_CAPTURE_STATUS_NONE);
    CHECK_EQ(record_then_wait(ev[0], origin, side), CUDA_SUCCESS);
    CHECK_EQ(capture_status(side), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CHECK_EQ(fake_stats().capture_forks, s0.capture_forks + 1);
    CHECK_EQ(fakecuda()->launch(side, run_fill, &during), 0);
    CHECK_EQ(X.MemsetD8Async(dev + 32, 0x33, 16, side), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().captured_ops, s0.captured_ops + 2);
    /* An end on the fork is not the capture's: refused, nothing changes. */
    CHECK_EQ(D.StreamEndCapture(side, &g), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    CHECK_EQ(capture_status(side), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CHECK_EQ(record_then_wait(ev[1], side, origin), CUDA_SUCCESS); /* the join */
    end_capture_ok(origin);
    CHECK_EQ(capture_status(side), CU_STREAM_CAPTURE_STATUS_NONE);
    CHECK_EQ(capture_status(origin), CU_STREAM_CAPTURE_STATUS_NONE);
    CHECK_EQ(D.StreamSynchronize(side), CUDA_SUCCESS);
    CHECK(holds(bytes(dev), 16, 0x11));
    CHECK(holds(bytes(dev) + 16, 32, 0)); /* captured: never run */
    CHECK_EQ(fake_stats().capture_invalidations, s0.capture_invalidations);

    /* Work after the join leaves the fork unjoined: the capture fails, both
     * streams leave it. */
    CHECK_EQ(D.StreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(record_then_wait(ev[0], origin, side), CUDA_SUCCESS);
    CHECK_EQ(record_then_wait(ev[1], side, origin), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->launch(side, run_fill, &during), 0);
    g = (CUgraph)&g;
    CHECK_EQ(D.StreamEndCapture(origin, &g), CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
    CHECK(g == NULL);
    CHECK_EQ(capture_status(side), CU_STREAM_CAPTURE_STATUS_NONE);
    CHECK_EQ(capture_status(origin), CU_STREAM_CAPTURE_STATUS_NONE);

    /* A fork of a fork, joined through it. */
    CHECK_EQ(D.StreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(record_then_wait(ev[0], origin, side), CUDA_SUCCESS);
    CHECK_EQ(record_then_wait(ev[1], side, third), CUDA_SUCCESS);
    CHECK_EQ(capture_status(third), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CHECK_EQ(record_then_wait(ev[2], third, side), CUDA_SUCCESS);
    CHECK_EQ(record_then_wait(ev[3], side, origin), CUDA_SUCCESS);
    end_capture_ok(origin);
    CHECK_EQ(capture_status(third), CU_STREAM_CAPTURE_STATUS_NONE);
    /* ... and one whose work joined side only after side's own join: that
     * work is unjoined. A fork that added no work has nothing to join. */
    CHECK_EQ(D.StreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(record_then_wait(ev[0], origin, side), CUDA_SUCCESS);
    CHECK_EQ(record_then_wait(ev[1], side, third), CUDA_SUCCESS);
    CHECK_EQ(X.MemsetD8Async(dev + 32, 0x33, 16, third), CUDA_SUCCESS);
    CHECK_EQ(record_then_wait(ev[3], side, origin), CUDA_SUCCESS);
    CHECK_EQ(record_then_wait(ev[2], third, side), CUDA_SUCCESS);
    CHECK_EQ(D.StreamEndCapture(origin, &g), CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
    CHECK_EQ(D.StreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(record_then_wait(ev[0], origin, side), CUDA_SUCCESS);
    CHECK_EQ(record_then_wait(ev[1], side, third), CUDA_SUCCESS);
    end_capture_ok(origin);

    /* Another capture's stream cannot wait on this one's event, nor can the
     * legacy stream (which invalidates the capture). */
    CHECK_EQ(D.StreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(D.StreamBeginCapture(other, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(ev[0], origin), CUDA_SUCCESS);
    CHECK_EQ(D.StreamWaitEvent(other, ev[0], 0), CUDA_ERROR_STREAM_CAPTURE_MERGE);
    CHECK_EQ(D.StreamEndCapture(other, &g), CUDA_SUCCESS);
    CHECK_EQ(X.GraphDestroy(g), CUDA_SUCCESS);
    s0 = fake_stats();
    CHECK_EQ(D.StreamWaitEvent(CU_STREAM_LEGACY, ev[0], 0), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    CHECK_EQ(capture_status(origin), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CHECK_EQ(fake_stats().capture_invalidations, s0.capture_invalidations + 1);
    g = (CUgraph)&g;
    CHECK_EQ(D.StreamEndCapture(origin, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(g == NULL);

    /* A blocking fork: legacy-stream work invalidates the whole capture. */
    CHECK_EQ(D.StreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(record_then_wait(ev[0], origin, blocking), CUDA_SUCCESS);
    CHECK_EQ(record_then_wait(ev[1], blocking, origin), CUDA_SUCCESS);
    CHECK_EQ(X.MemsetD8(dev, 0, 1), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    CHECK_EQ(capture_status(origin), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CHECK_EQ(D.StreamEndCapture(origin, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK_EQ(capture_status(blocking), CU_STREAM_CAPTURE_STATUS_NONE);

    /* An event of a capture that has ended joins nothing: a wait on it is
     * refused (fake-wait-ended-capture). */
    CHECK_EQ(D.StreamWaitEvent(side, ev[0], 0), CUDA_ERROR_CAPTURED_EVENT);
    CHECK_EQ(capture_status(side), CU_STREAM_CAPTURE_STATUS_NONE);

    for (int i = 0; i < 4; i++)
        CHECK_EQ(D.EventDestroy(ev[i]), CUDA_SUCCESS);
    CUstream all[] = {origin, side, third, other, blocking};
    for (int i = 0; i < 5; i++)
        CHECK_EQ(D.StreamDestroy(all[i]), CUDA_SUCCESS);
    fakecuda()->complete_all();
    CHECK_EQ(D.MemFree(dev), CUDA_SUCCESS);
}

static void fake_memset(void)
{
    start();
    NEED(MemsetD32);
    NEED(MemsetD8Async);
    NEED(MemsetD32Async);
    NEED(MemHostAlloc);
    NEED(GetProcAddress);
    same_through_proc_address("cuMemsetD32", "cuMemsetD32_v2");
    same_through_proc_address("cuMemsetD32Async", "cuMemsetD32Async");
    same_through_proc_address("cuMemsetD8Async", "cuMemsetD8Async");
    enum { N = 4096 };
    CUdeviceptr dev = alloc_ok(N);
    memset(bytes(dev), 0, N);
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

    /* Stream work on the stream named: not before the work queued ahead of
     * it, not held back by the legacy stream (s does not block). */
    const uint32_t v = 0x3f800000u; /* 1.0f: the element, not a byte */
    fakecuda_stats before = fake_stats();
    CHECK_EQ(fakecuda()->launch(s, nothing, NULL), 0);
    CHECK_EQ(X.MemsetD32Async(dev + 8, v, 100, s), CUDA_SUCCESS);
    CHECK(holds(bytes(dev), N, 0));
    fakecuda()->complete(CU_STREAM_LEGACY);
    CHECK(holds(bytes(dev), N, 0));
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK(holds(bytes(dev), 8, 0));
    CHECK(holds32(dev + 8, 100, v));
    CHECK(holds(bytes(dev) + 8 + 400, N - 8 - 400, 0));
    CHECK_EQ(fake_stats().memsets - before.memsets, 1);

    /* The byte form on a stream; the plain 32-bit form on the legacy
     * stream, behind its queued work. */
    CHECK_EQ(X.MemsetD8Async(dev, 0x5a, N, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK(holds(bytes(dev), N, 0x5a));
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, nothing, NULL), 0);
    CHECK_EQ(X.MemsetD32(dev, 0x01020304u, N / 4), CUDA_SUCCESS);
    CHECK(holds(bytes(dev), N, 0x5a));
    fakecuda()->complete(CU_STREAM_LEGACY);
    CHECK(holds32(dev, N / 4, 0x01020304u));

    /* Page-locked host memory, at its device address: the Async form is
     * still stream work. */
    void *pinned = NULL;
    CHECK_EQ(X.MemHostAlloc(&pinned, N, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
    memset(pinned, 0, N);
    CHECK_EQ(fakecuda()->launch(s, nothing, NULL), 0);
    CHECK_EQ(X.MemsetD32Async((CUdeviceptr)(uintptr_t)pinned, v, N / 4, s), CUDA_SUCCESS);
    CHECK(holds(pinned, N, 0));
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK(holds32((CUdeviceptr)(uintptr_t)pinned, N / 4, v));

    /* Refused, nothing written: not four-byte aligned, past the end of the
     * allocation, pageable memory, a stream that is gone. Zero elements
     * succeed and write nothing. */
    before = fake_stats();
    memset(bytes(dev), 0, N);
    CHECK_EQ(X.MemsetD32Async(dev + 2, v, 4, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemsetD32(dev + 1, v, 4), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemsetD32Async(dev + N - 8, v, 3, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemsetD8Async(dev + 1, 1, N, s), CUDA_ERROR_INVALID_VALUE);
    static uint32_t pageable[16];
    CHECK_EQ(X.MemsetD32Async((CUdeviceptr)(uintptr_t)pageable, v, 16, s),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemsetD32Async(dev, v, 0, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK(holds(bytes(dev), N, 0));
    CHECK_EQ(fake_stats().memsets - before.memsets, 0);

    /* Captured, not run: the graph owns it (the fake launches no graphs). */
    before = fake_stats();
    CHECK_EQ(D.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(X.MemsetD32Async(dev, v, N / 4, s), CUDA_SUCCESS);
    CUgraph g = NULL;
    CHECK_EQ(D.StreamEndCapture(s, &g), CUDA_SUCCESS);
    CHECK(g != NULL);
    if (g)
        CHECK_EQ(X.GraphDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK(holds(bytes(dev), N, 0));
    CHECK_EQ(fake_stats().captured_ops - before.captured_ops, 1);

    /* The 2D forms: rows of Width elements, dstPitch apart, the gaps
     * between rows untouched; stream work as the 1D forms. */
    NEED(MemsetD2D8);
    NEED(MemsetD2D16Async);
    NEED(MemsetD2D32Async);
    same_through_proc_address("cuMemsetD2D8", "cuMemsetD2D8_v2");
    same_through_proc_address("cuMemsetD2D32Async", "cuMemsetD2D32Async");
    memset(bytes(dev), 0, N);
    before = fake_stats();
    CHECK_EQ(fakecuda()->launch(s, nothing, NULL), 0);
    CHECK_EQ(X.MemsetD2D32Async(dev + 64, 256, v, 8, 4, s), CUDA_SUCCESS);
    CHECK(holds(bytes(dev), N, 0));
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    for (int r = 0; r < 4; r++) {
        CHECK(holds32(dev + 64 + (CUdeviceptr)r * 256, 8, v));
        CHECK(holds(bytes(dev) + 64 + r * 256 + 32, 256 - 32, 0));
    }
    CHECK(holds(bytes(dev), 64, 0));
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, nothing, NULL), 0);
    CHECK_EQ(X.MemsetD2D8(dev, 100, 0x7e, 10, 3), CUDA_SUCCESS); /* the legacy stream */
    CHECK(holds(bytes(dev), 10, 0));
    fakecuda()->complete(CU_STREAM_LEGACY);
    CHECK(holds(bytes(dev), 10, 0x7e) && holds(bytes(dev) + 100, 10, 0x7e) &&
          holds(bytes(dev) + 200, 10, 0x7e) && holds(bytes(dev) + 10, 54, 0));
    CHECK_EQ(fake_stats().memsets - before.memsets, 2);
    /* Refused: a pitch or pointer not two-byte aligned for D2D16, a pitch
     * shorter than a row, a last row past the allocation. One row ignores
     * the pitch; zero rows set nothing. */
    before = fake_stats();
    CHECK_EQ(X.MemsetD2D16Async(dev, 101, 1, 8, 2, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemsetD2D16Async(dev + 1, 100, 1, 8, 2, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemsetD2D32Async(dev, 16, v, 8, 2, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemsetD2D32Async(dev, 1024, v, 8, 5, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemsetD2D32Async(dev, 1024, v, 8, 4, s), CUDA_SUCCESS);
    CHECK_EQ(X.MemsetD2D16Async(dev, 3, 1, 8, 1, s), CUDA_SUCCESS);
    CHECK_EQ(X.MemsetD2D16Async(dev, 16, 1, 8, 0, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().memsets - before.memsets, 2);

    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    /* A bad stream: cuMemsetD32Async lists no invalid handle. */
    CHECK_EQ(X.MemsetD32Async(dev, v, 4, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemFreeHost(pinned), CUDA_SUCCESS);
}

/* The per-thread default stream's synchronous copies and memsets (_ptds) and
 * Async copies (_ptsz), as dlsym finds them. */
static struct {
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*Memcpy)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*MemsetD16)(CUdeviceptr, unsigned short, size_t);
    CUresult (*MemsetD32)(CUdeviceptr, unsigned, size_t);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
} PT;

/* What cuGetProcAddress answers for `base` at `version` with the per-thread
 * flag: the function dlsym finds under `exported`. */
static void proc_ptds_at(const char *base, int version, const char *exported)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CHECK_EQ(X.GetProcAddress(base, &fn, version, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                              &st),
             CUDA_SUCCESS);
    CHECK_EQ(st, CU_GET_PROC_ADDRESS_SUCCESS);
    void *want = dlsym(e2e_open_libcuda(), exported);
    if (!fn || fn != want)
        fprintf(stderr, "cuGetProcAddress(%s, %d, per-thread) is not %s\n", base, version,
                exported);
    CHECK(fn && fn == want);
}

/* Every 16-bit element of [p, p + 2n) holds v. */
static bool holds16(CUdeviceptr p, size_t n, uint16_t v)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t got;
        memcpy(&got, bytes(p) + 2 * i, 2);
        if (got != v)
            return false;
    }
    return true;
}

/* Queued on the calling thread's per-thread default stream, behind `nothing`
 * there: pending until that stream completes, the legacy stream untouched. */
static void check_on_per_thread_stream(uint64_t legacy_ops_before)
{
    CHECK_EQ(fakecuda()->pending(CU_STREAM_PER_THREAD), 2);
    CHECK_EQ(fakecuda()->pending(CU_STREAM_LEGACY), 0);
    CHECK_EQ(fake_stats().legacy_stream_ops, legacy_ops_before);
}

static void fake_ptds(void)
{
    start();
    NEED(GetProcAddress);
    void *h = e2e_open_libcuda();
#define PT_CU(field, name) *(void **)&PT.field = dlsym(h, name)
    PT_CU(MemcpyHtoD, "cuMemcpyHtoD_v2_ptds");
    PT_CU(MemcpyDtoH, "cuMemcpyDtoH_v2_ptds");
    PT_CU(MemcpyDtoD, "cuMemcpyDtoD_v2_ptds");
    PT_CU(Memcpy, "cuMemcpy_ptds");
    PT_CU(MemsetD8, "cuMemsetD8_v2_ptds");
    PT_CU(MemsetD16, "cuMemsetD16_v2_ptds");
    PT_CU(MemsetD32, "cuMemsetD32_v2_ptds");
    PT_CU(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2_ptsz");
#undef PT_CU
    const char *missing = !PT.MemcpyHtoD ? "cuMemcpyHtoD_v2_ptds"
                          : !PT.MemcpyDtoH ? "cuMemcpyDtoH_v2_ptds"
                          : !PT.MemcpyDtoD ? "cuMemcpyDtoD_v2_ptds"
                          : !PT.Memcpy ? "cuMemcpy_ptds"
                          : !PT.MemsetD8 ? "cuMemsetD8_v2_ptds"
                          : !PT.MemsetD16 ? "cuMemsetD16_v2_ptds"
                          : !PT.MemsetD32 ? "cuMemsetD32_v2_ptds"
                          : !PT.MemcpyHtoDAsync ? "cuMemcpyHtoDAsync_v2_ptsz"
                                                : NULL;
    if (missing) {
        fprintf(stderr, "the driver has no %s\n", missing);
        e2e_failures++;
        return;
    }
    /* cuGetProcAddress with the per-thread flag: the _ptds / _ptsz twins
     * from CUDA 7.0 on (cudaTypedefs.h's PFN_..._v7000_ptds), the legacy
     * stream's below it and without the flag. */
    proc_ptds_at("cuMemcpyHtoD", 13000, "cuMemcpyHtoD_v2_ptds");
    proc_ptds_at("cuMemcpyDtoH", 13000, "cuMemcpyDtoH_v2_ptds");
    proc_ptds_at("cuMemcpyDtoD", 13000, "cuMemcpyDtoD_v2_ptds");
    proc_ptds_at("cuMemcpy", 13000, "cuMemcpy_ptds");
    proc_ptds_at("cuMemsetD8", 13000, "cuMemsetD8_v2_ptds");
    proc_ptds_at("cuMemsetD16", 13000, "cuMemsetD16_v2_ptds");
    proc_ptds_at("cuMemsetD32", 13000, "cuMemsetD32_v2_ptds");
    proc_ptds_at("cuMemsetD16Async", 13000, "cuMemsetD16Async_ptsz");
    proc_ptds_at("cuMemcpyAsync", 13000, "cuMemcpyAsync_ptsz");
    proc_ptds_at("cuMemcpyHtoDAsync", 13000, "cuMemcpyHtoDAsync_v2_ptsz");
    proc_ptds_at("cuMemcpyDtoHAsync", 13000, "cuMemcpyDtoHAsync_v2_ptsz");
    proc_ptds_at("cuMemcpyDtoDAsync", 13000, "cuMemcpyDtoDAsync_v2_ptsz");
    proc_ptds_at("cuMemcpyHtoD", 6050, "cuMemcpyHtoD_v2");
    proc_ptds_at("cuMemsetD32", 6050, "cuMemsetD32_v2");
    same_through_proc_address("cuMemcpyHtoD", "cuMemcpyHtoD_v2");
    same_through_proc_address("cuMemsetD16", "cuMemsetD16_v2");
    same_through_proc_address("cuMemsetD16Async", "cuMemsetD16Async");

    enum { N = 4096 };
    CUdeviceptr a = alloc_ok(N), b = alloc_ok(N);
    memset(bytes(a), 0, N);
    memset(bytes(b), 0, N);
    unsigned char host[N];
    const uint64_t legacy_ops = fake_stats().legacy_stream_ops;
    const uint64_t calls = calls_of("cuMemcpyHtoD_v2_ptds");

    /* Host to device: the source read at the call, the block written when
     * the per-thread stream reaches the copy. */
    CHECK_EQ(fakecuda()->launch(CU_STREAM_PER_THREAD, nothing, NULL), 0);
    fill(host, N, 0x11);
    CHECK_EQ(PT.MemcpyHtoD(a, host, N), CUDA_SUCCESS);
    fill(host, N, 0x99);
    CHECK(holds(bytes(a), N, 0));
    check_on_per_thread_stream(legacy_ops);
    fakecuda()->complete(CU_STREAM_PER_THREAD);
    CHECK(holds(bytes(a), N, 0x11));
    CHECK_EQ(calls_of("cuMemcpyHtoD_v2_ptds") - calls, 1);

    /* Device to device, both forms: no host synchronisation. */
    CHECK_EQ(fakecuda()->launch(CU_STREAM_PER_THREAD, nothing, NULL), 0);
    CHECK_EQ(PT.MemcpyDtoD(b, a, N / 2), CUDA_SUCCESS);
    check_on_per_thread_stream(legacy_ops);
    CHECK_EQ(PT.Memcpy(b + N / 2, a + N / 2, N / 2), CUDA_SUCCESS);
    CHECK(holds(bytes(b), N, 0));
    fakecuda()->complete(CU_STREAM_PER_THREAD);
    CHECK(holds(bytes(b), N, 0x11));

    /* Device to host returns once the copy is done: after the per-thread
     * stream's kernel before it, which it waited for. */
    kernel_fill k = {a, N, 0x33};
    CHECK_EQ(fakecuda()->launch(CU_STREAM_PER_THREAD, run_fill, &k), 0);
    CHECK_EQ(PT.MemcpyDtoH(host, a, N), CUDA_SUCCESS);
    CHECK(holds(host, N, 0x33));
    CHECK_EQ(fakecuda()->pending(CU_STREAM_PER_THREAD), 0);

    /* The memsets, each behind the per-thread stream's work; the 16-bit
     * form sets every element and wants two-byte alignment. */
    CHECK_EQ(fakecuda()->launch(CU_STREAM_PER_THREAD, nothing, NULL), 0);
    CHECK_EQ(PT.MemsetD8(a, 0x22, N), CUDA_SUCCESS);
    check_on_per_thread_stream(legacy_ops);
    CHECK(holds(bytes(a), N, 0x33));
    fakecuda()->complete(CU_STREAM_PER_THREAD);
    CHECK(holds(bytes(a), N, 0x22));
    CHECK_EQ(fakecuda()->launch(CU_STREAM_PER_THREAD, nothing, NULL), 0);
    CHECK_EQ(PT.MemsetD16(a, 0x1234, N / 2), CUDA_SUCCESS);
    check_on_per_thread_stream(legacy_ops);
    fakecuda()->complete(CU_STREAM_PER_THREAD);
    CHECK(holds16(a, N / 2, 0x1234));
    CHECK_EQ(PT.MemsetD16(a + 1, 0x1234, 4), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(fakecuda()->launch(CU_STREAM_PER_THREAD, nothing, NULL), 0);
    CHECK_EQ(PT.MemsetD32(a, 0x01020304u, N / 4), CUDA_SUCCESS);
    check_on_per_thread_stream(legacy_ops);
    fakecuda()->complete(CU_STREAM_PER_THREAD);
    CHECK(holds32(a, N / 4, 0x01020304u));

    /* The Async twin reads stream 0 as the per-thread stream. */
    CHECK_EQ(fakecuda()->launch(CU_STREAM_PER_THREAD, nothing, NULL), 0);
    fill(host, N, 0x44);
    CHECK_EQ(PT.MemcpyHtoDAsync(a, host, N, NULL), CUDA_SUCCESS);
    check_on_per_thread_stream(legacy_ops);
    fakecuda()->complete(CU_STREAM_PER_THREAD);
    CHECK(holds(bytes(a), N, 0x44));

    /* Without a current context: the synchronous forms' invalid context. */
    CHECK_EQ(D.CtxSetCurrent(NULL), CUDA_SUCCESS);
    CHECK_EQ(PT.MemsetD8(a, 0, N), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(PT.MemcpyHtoD(a, host, N), CUDA_ERROR_INVALID_CONTEXT);
    e2e_cu_primary_current(0);
}

/* What cuStreamGetCaptureInfo says about s: `version` 1, 2 or 3 (each
 * through its _ptsz twin when z, with s as that call names it), its id and
 * graph left as they were unless the capture is active. */
typedef struct capture_info {
    CUresult r;
    CUstreamCaptureStatus st;
    cuuint64_t id;
    CUgraph graph;
    size_t ndeps;
} capture_info;

enum { UNTOUCHED_ID = 0xdeadbeef };
static char untouched_graph; /* its address: a graph handle nothing wrote */
#define UNTOUCHED_GRAPH ((CUgraph)(void *)&untouched_graph)

static capture_info info_of(int version, int z, CUstream s)
{
    capture_info i = {CUDA_SUCCESS, (CUstreamCaptureStatus)99, UNTOUCHED_ID, UNTOUCHED_GRAPH,
                      99};
    const CUgraphNode *deps = NULL;
    const CUgraphEdgeData *edges = NULL;
    if (version == 1)
        i.r = X.CaptureInfoV1[z](s, &i.st, &i.id);
    else if (version == 2)
        i.r = X.CaptureInfoV2[z](s, &i.st, &i.id, &i.graph, &deps, &i.ndeps);
    else
        i.r = X.CaptureInfoV3[z](s, &i.st, &i.id, &i.graph, &deps, &edges, &i.ndeps);
    if (i.r == CUDA_SUCCESS && i.st == CU_STREAM_CAPTURE_STATUS_ACTIVE && version > 1)
        CHECK(deps == NULL && edges == NULL && i.ndeps == 0); /* the fake's graphs: no nodes */
    return i;
}

/* Every version and twin says s is active in capture `id` (into `graph`,
 * when given); returns the id. */
static cuuint64_t active_in(CUstream s, bool per_thread, cuuint64_t id, CUgraph graph)
{
    for (int v = 1; v <= 3; v++)
        for (int z = 0; z < 2; z++) {
            if (per_thread != (s == CU_STREAM_PER_THREAD || z))
                continue; /* the other stream's twin */
            capture_info i = info_of(v, z, z && s == CU_STREAM_PER_THREAD ? NULL : s);
            CHECK_EQ(i.r, CUDA_SUCCESS);
            CHECK_EQ(i.st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
            CHECK(i.id != UNTOUCHED_ID && i.id != 0);
            if (!id)
                id = i.id;
            CHECK_EQ(i.id, id);
            if (v > 1 && graph)
                CHECK(i.graph == graph);
        }
    return id;
}

/* Every version says s is in status st, and writes nothing else. */
static void not_active(CUstream s, CUstreamCaptureStatus st)
{
    for (int v = 1; v <= 3; v++) {
        capture_info i = info_of(v, 0, s);
        CHECK_EQ(i.r, CUDA_SUCCESS);
        CHECK_EQ(i.st, st);
        CHECK_EQ(i.id, UNTOUCHED_ID);
        CHECK(i.graph == UNTOUCHED_GRAPH);
    }
}

static void fake_capture_info(void)
{
    start();
    NEED(CaptureInfoV1[0]);
    NEED(CaptureInfoV1[1]);
    NEED(CaptureInfoV2[0]);
    NEED(CaptureInfoV2[1]);
    NEED(CaptureInfoV3[0]);
    NEED(CaptureInfoV3[1]);
    NEED(GetProcAddress);
    NEED(GraphDestroy);
    NEED(GraphCreate);
    NEED(StreamBeginCaptureToGraph);
    proc_at("cuStreamGetCaptureInfo", 10010, "cuStreamGetCaptureInfo");
    proc_at("cuStreamGetCaptureInfo", 11030, "cuStreamGetCaptureInfo_v2");
    proc_at("cuStreamGetCaptureInfo", 12030, "cuStreamGetCaptureInfo_v3");
    proc_ptds_at("cuStreamGetCaptureInfo", 10010, "cuStreamGetCaptureInfo_ptsz");
    proc_ptds_at("cuStreamGetCaptureInfo", 11030, "cuStreamGetCaptureInfo_v2_ptsz");
    proc_ptds_at("cuStreamGetCaptureInfo", 12030, "cuStreamGetCaptureInfo_v3_ptsz");
    CUstream origin, side, other, blocking;
    CHECK_EQ(D.StreamCreate(&origin, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&side, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&blocking, 0), CUDA_SUCCESS);
    CUevent ev[2];
    for (int i = 0; i < 2; i++)
        CHECK_EQ(D.EventCreate(&ev[i], CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    const uint64_t inv0 = fake_stats().capture_invalidations;

    /* Arguments. */
    cuuint64_t id = 0;
    const CUgraphNode *deps = NULL;
    const CUgraphEdgeData *edges = NULL;
    CHECK_EQ(X.CaptureInfoV1[0](origin, NULL, &id), CUDA_ERROR_INVALID_VALUE);
    CUstreamCaptureStatus st;
    CHECK_EQ(X.CaptureInfoV3[0](origin, &st, NULL, NULL, NULL, &edges, NULL),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.CaptureInfoV3[0](origin, &st, NULL, NULL, &deps, &edges, NULL), CUDA_SUCCESS);
    not_active(origin, CU_STREAM_CAPTURE_STATUS_NONE);

    /* A capture and its fork: one sequence, one id, one graph, which the
     * end returns; another capture's id differs. */
    CHECK_EQ(D.StreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    capture_info first = info_of(2, 0, origin);
    CHECK_EQ(first.st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    cuuint64_t seq = active_in(origin, false, 0, first.graph);
    CHECK_EQ(record_then_wait(ev[0], origin, side), CUDA_SUCCESS); /* the fork */
    active_in(side, false, seq, first.graph);
    CHECK_EQ(D.StreamBeginCapture(other, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    cuuint64_t other_seq = active_in(other, false, 0, NULL);
    CHECK(other_seq != seq);
    CHECK_EQ(record_then_wait(ev[1], side, origin), CUDA_SUCCESS); /* the join */
    CUgraph g = NULL;
    CHECK_EQ(D.StreamEndCapture(origin, &g), CUDA_SUCCESS);
    CHECK(g == first.graph);
    if (g)
        CHECK_EQ(X.GraphDestroy(g), CUDA_SUCCESS);
    not_active(origin, CU_STREAM_CAPTURE_STATUS_NONE);
    not_active(side, CU_STREAM_CAPTURE_STATUS_NONE);
    end_capture_ok(other);

    /* Into the program's graph. */
    CUgraph mine = NULL;
    CHECK_EQ(X.GraphCreate(&mine, 0), CUDA_SUCCESS);
    CHECK_EQ(X.StreamBeginCaptureToGraph(origin, mine, NULL, NULL, 0,
                                         CU_STREAM_CAPTURE_MODE_RELAXED),
             CUDA_SUCCESS);
    CHECK(active_in(origin, false, 0, mine) != seq);
    CHECK_EQ(D.StreamEndCapture(origin, &g), CUDA_SUCCESS);
    CHECK(g == mine);

    /* Invalidated: the status says so, nothing else is written; the graph
     * asked for while it was active goes with it. */
    CHECK_EQ(D.StreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    capture_info lost = info_of(3, 0, origin);
    CHECK_EQ(lost.st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CHECK_EQ(D.StreamQuery(origin), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); /* invalidates */
    not_active(origin, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    end_capture_invalidated(origin);
    CHECK_EQ(X.GraphDestroy(lost.graph), CUDA_ERROR_INVALID_VALUE);

    /* The legacy stream while a blocking stream captures, or this thread's
     * per-thread default stream (blocking too): refused, not invalidating. */
    CHECK_EQ(D.StreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    for (int v = 1; v <= 3; v++) {
        CHECK_EQ(info_of(v, 0, CU_STREAM_LEGACY).r, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
        CHECK_EQ(info_of(v, 0, NULL).r, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    }
    end_capture_ok(blocking);
    CHECK_EQ(D.StreamBeginCapture(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_RELAXED),
             CUDA_SUCCESS);
    active_in(CU_STREAM_PER_THREAD, true, 0, NULL);
    CHECK_EQ(info_of(1, 0, CU_STREAM_LEGACY).r, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    end_capture_ok(CU_STREAM_PER_THREAD);
    not_active(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_STATUS_NONE);
    CHECK_EQ(fake_stats().capture_invalidations, inv0 + 1);

    for (int i = 0; i < 2; i++)
        CHECK_EQ(D.EventDestroy(ev[i]), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(origin), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(side), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(other), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(blocking), CUDA_SUCCESS);
}

/* Every copy checks the whole of both its ranges, as the memsets and
 * cuMemcpyPeerAsync do: a range that starts inside an allocation and runs
 * past its end is CUDA_ERROR_INVALID_VALUE, and nothing is copied or queued.
 * The allocations are smaller than their page, so the old fake's copy past
 * the end wrote into mapped memory instead of crashing. */
static void fake_copy_ranges(void)
{
    start();
    NEED(Memcpy);
    NEED(MemcpyAsync);
    NEED(MemcpyDtoDAsync);
    NEED(MemHostAlloc);
    NEED(MemFreeHost);
    enum { N = 1000, PAGE = 4096 };
    CUdeviceptr a = alloc_ok(N), b = alloc_ok(N);
    memset(bytes(a), 0x0a, N);
    memset(bytes(b), 0x0b, N);
    static unsigned char host[PAGE];
    fill(host, PAGE, 0x77);
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    const size_t half = N / 2;

    /* The end of the destination, then of the source, past the allocation:
     * each copy form refuses. */
    CHECK_EQ(X.MemcpyHtoD(a + half, host, N), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemcpyDtoH(host, a + half, N), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemcpyDtoD(b, a + half, N), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemcpyDtoD(b + half, a, N), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.Memcpy(b + half, a, N), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.Memcpy(b, a + half, N), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemcpyHtoDAsync(a + half, host, N, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemcpyDtoHAsync(host, a + half, N, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemcpyDtoDAsync(b + half, a, N, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemcpyAsync(b, a + half, N, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(fakecuda()->pending(s), 0);
    CHECK_EQ(fakecuda()->pending(CU_STREAM_LEGACY), 0);
    CHECK(holds(bytes(a), N, 0x0a));
    CHECK(holds(bytes(b), N, 0x0b));
    CHECK(holds(host, PAGE, 0x77));
    /* Up to the last byte is fine. */
    CHECK_EQ(X.MemcpyDtoD(b + half, a + half, N - half), CUDA_SUCCESS);
    fakecuda()->complete(CU_STREAM_LEGACY);
    CHECK(holds(bytes(b), half, 0x0b) && holds(bytes(b) + half, N - half, 0x0a));

    /* Page-locked host memory is memory the driver knows: whole too. */
    void *pinned = NULL;
    CHECK_EQ(X.MemHostAlloc(&pinned, N, 0), CUDA_SUCCESS);
    memset(pinned, 0x0c, N);
    unsigned char *pin = pinned;
    CHECK_EQ(X.MemcpyDtoH(pin + half, a, N), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemcpyHtoDAsync(a, pin + half, N, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(fakecuda()->pending(s), 0);
    CHECK(holds(pin, N, 0x0c));
    CHECK(holds(bytes(a), N, 0x0a));
    CHECK_EQ(X.MemFreeHost(pinned), CUDA_SUCCESS);

    /* Virtual memory: over two neighbouring mappings is one range; past the
     * last mapping (into the reservation's unmapped rest) is not device
     * memory. Refused before it is queued: the stuck kernel ahead keeps the
     * old fake's copy from running into the unmapped pages. */
    CUdeviceptr va = 0, big = 0;
    CUmemGenericAllocationHandle h[2];
    const size_t g = two_mapped_granules(0, &va, h, &big);
    CHECK_EQ(X.MemcpyDtoDAsync(va + g / 2, big, g, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK(holds(bytes(va + g / 2), g, 0x62));
    CHECK_EQ(fakecuda()->launch_stuck(s), 0);
    CHECK_EQ(X.MemcpyDtoDAsync(va + g, big, 2 * g, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(X.MemcpyDtoDAsync(big, va + g, 2 * g, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(fakecuda()->pending(s), 1);
    CUdevice d0;
    CHECK_EQ(D.DeviceGet(&d0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxReset(d0), CUDA_SUCCESS); /* drops the stuck work */
}

/* cuCtxDestroy pops only a current context (cuda.h: "If ctx is current to
 * the calling thread then ctx will also be popped"); a dead handle deeper
 * in the stack stays there. */
static void fake_ctx_stack(void)
{
    start(); /* primary 0 current */
    CUresult (*push)(CUcontext) =
        (CUresult(*)(CUcontext))e2e_dlsym(e2e_open_libcuda(), "cuCtxPushCurrent_v2");
    CUresult (*pop)(CUcontext *) =
        (CUresult(*)(CUcontext *))e2e_dlsym(e2e_open_libcuda(), "cuCtxPopCurrent_v2");
    CUresult (*current)(CUcontext *) =
        (CUresult(*)(CUcontext *))e2e_dlsym(e2e_open_libcuda(), "cuCtxGetCurrent");
    CUcontext primary = NULL, a = NULL, b = NULL, now = NULL;
    CHECK_EQ(current(&primary), CUDA_SUCCESS);
    CHECK_EQ(D.CtxCreate(&a, NULL, 0, 0), CUDA_SUCCESS); /* stack: primary, a */
    CHECK_EQ(D.CtxCreate(&b, NULL, 0, 0), CUDA_SUCCESS); /* primary, a, b */
    CHECK_EQ(D.CtxDestroy(a), CUDA_SUCCESS);             /* not current: stays */
    CHECK_EQ(current(&now), CUDA_SUCCESS);
    CHECK(now == b);
    CHECK_EQ(D.CtxDestroy(b), CUDA_SUCCESS); /* current: popped, a's dead handle on top */
    CHECK_EQ(current(&now), CUDA_SUCCESS);
    CHECK(now == a);
    CHECK_EQ(pop(&now), CUDA_SUCCESS);
    CHECK(now == a);
    CHECK_EQ(current(&now), CUDA_SUCCESS);
    CHECK(now == primary);
    CHECK_EQ(push(a), CUDA_ERROR_INVALID_CONTEXT); /* destroyed */
    CHECK_EQ(current(&now), CUDA_SUCCESS);
    CHECK(now == primary);
}

/* cuDevicePrimaryCtxReset destroys the primary context but "does not
 * release it" (cuda.h): the holders' releases still succeed, and after a
 * retain makes it active again only the last of all the releases destroys
 * it. Device 1's primary context, which start() does not hold. */
static void fake_primary_reset(void)
{
    start();
    CUdevice d1;
    CHECK_EQ(D.DeviceGet(&d1, 1), CUDA_SUCCESS);
    void *h = e2e_open_libcuda();
    CUresult (*get_state)(CUdevice, unsigned *, int *) =
        (CUresult(*)(CUdevice, unsigned *, int *))e2e_dlsym(h, "cuDevicePrimaryCtxGetState");
    CUresult (*reset_v1)(CUdevice) = (CUresult(*)(CUdevice))e2e_dlsym(h, "cuDevicePrimaryCtxReset");
    unsigned flags = 0;
    int active = -1;

    /* Two holders; a reset destroys the context and its memory at once. */
    CUcontext c = NULL;
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c, d1), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c, d1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c), CUDA_SUCCESS);
    CUdeviceptr before_reset = alloc_ok(4096);
    CHECK_EQ(D.DevicePrimaryCtxReset(d1), CUDA_SUCCESS);
    CHECK_EQ(get_state(d1, &flags, &active), CUDA_SUCCESS);
    CHECK_EQ(active, 0);
    CHECK(!fakecuda()->is_device_pointer(before_reset));
    CUdeviceptr p = 0;
    CHECK_EQ(D.MemAlloc(&p, 4096), CUDA_ERROR_CONTEXT_IS_DESTROYED); /* still current */
    /* Nor has it a legacy or per-thread stream any more (before, the fake
     * made a per-thread stream for the inactive context, and took work) */
    CHECK(D.StreamSynchronize(CU_STREAM_LEGACY) != CUDA_SUCCESS);
    CHECK(D.StreamSynchronize(CU_STREAM_PER_THREAD) != CUDA_SUCCESS);
    CHECK(fakecuda()->launch(CU_STREAM_PER_THREAD, nothing, NULL) != 0);

    /* A retain makes it active again; the two earlier holds still count. */
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c, d1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c), CUDA_SUCCESS);
    p = alloc_ok(4096);
    for (int held = 2; held > 0; held--) {
        CHECK_EQ(D.DevicePrimaryCtxRelease(d1), CUDA_SUCCESS);
        CHECK_EQ(get_state(d1, &flags, &active), CUDA_SUCCESS);
        CHECK_EQ(active, 1);
        CHECK(fakecuda()->is_device_pointer(p));
    }
    CHECK_EQ(D.DevicePrimaryCtxRelease(d1), CUDA_SUCCESS); /* the last */
    CHECK_EQ(get_state(d1, &flags, &active), CUDA_SUCCESS);
    CHECK_EQ(active, 0);
    CHECK(!fakecuda()->is_device_pointer(p));
    CHECK_EQ(D.DevicePrimaryCtxRelease(d1), CUDA_ERROR_INVALID_CONTEXT);

    /* A holder may release after the reset ("safe for other modules"), the
     * v1 reset the same. */
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c, d1), CUDA_SUCCESS);
    CHECK_EQ(reset_v1(d1), CUDA_SUCCESS);
    CHECK_EQ(get_state(d1, &flags, &active), CUDA_SUCCESS);
    CHECK_EQ(active, 0);
    CHECK_EQ(D.DevicePrimaryCtxRelease(d1), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRelease(d1), CUDA_ERROR_INVALID_CONTEXT);
    /* Resetting a context nobody holds is no error, and holds nothing. */
    CHECK_EQ(D.DevicePrimaryCtxReset(d1), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRelease(d1), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(D.CtxSetCurrent(NULL), CUDA_SUCCESS);
}

/* cuCtxCreate's versions, as dlsym finds them under their exported names. */
typedef CUresult (*create_v1_fn)(CUcontext *, unsigned, CUdevice);
typedef CUresult (*create_v3_fn)(CUcontext *, CUexecAffinityParam *, int, unsigned, CUdevice);
typedef CUresult (*create_v4_fn)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice);

/* A context just made by one version of cuCtxCreate: current, on device 1,
 * usable, and popping it brings back the one it supplanted (`before`). */
static void check_created(CUcontext c, CUcontext before)
{
    void *h = e2e_open_libcuda();
    CUresult (*get_current)(CUcontext *) = (CUresult(*)(CUcontext *))e2e_dlsym(h, "cuCtxGetCurrent");
    CUresult (*get_device)(CUdevice *) = (CUresult(*)(CUdevice *))e2e_dlsym(h, "cuCtxGetDevice");
    CUresult (*pop)(CUcontext *) = (CUresult(*)(CUcontext *))e2e_dlsym(h, "cuCtxPopCurrent_v2");
    CUcontext cur = NULL;
    CUdevice dev = -1;
    CHECK_EQ(get_current(&cur), CUDA_SUCCESS);
    CHECK(cur == c && c != before);
    CHECK_EQ(get_device(&dev), CUDA_SUCCESS);
    CHECK_EQ(dev, 1);
    CUdeviceptr p = alloc_ok(4096);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    CHECK_EQ(pop(&cur), CUDA_SUCCESS);
    CHECK(cur == c);
    CHECK_EQ(get_current(&cur), CUDA_SUCCESS);
    CHECK(cur == before);
    CHECK_EQ(D.CtxDestroy(c), CUDA_SUCCESS);
}

static void fake_ctx_create_versions(void)
{
    start();
    NEED(GetProcAddress);
    void *h = e2e_open_libcuda();
    create_v1_fn v1 = (create_v1_fn)dlsym(h, "cuCtxCreate");
    create_v1_fn v2 = (create_v1_fn)dlsym(h, "cuCtxCreate_v2");
    create_v3_fn v3 = (create_v3_fn)dlsym(h, "cuCtxCreate_v3");
    create_v4_fn v4 = (create_v4_fn)dlsym(h, "cuCtxCreate_v4");
    if (!v1 || !v2 || !v3 || !v4) {
        fprintf(stderr, "the driver lacks a cuCtxCreate version: v1 %p, v2 %p, v3 %p, v4 %p\n",
                (void *)(uintptr_t)v1, (void *)(uintptr_t)v2, (void *)(uintptr_t)v3,
                (void *)(uintptr_t)v4);
        e2e_failures++;
        return;
    }
    /* cuGetProcAddress: each version from its own (cudaTypedefs.h's
     * PFN_cuCtxCreate_v2000, _v3020, _v11040, _v12050). */
    proc_at("cuCtxCreate", 2000, "cuCtxCreate");
    proc_at("cuCtxCreate", 3010, "cuCtxCreate");
    proc_at("cuCtxCreate", 3020, "cuCtxCreate_v2");
    proc_at("cuCtxCreate", 11030, "cuCtxCreate_v2");
    proc_at("cuCtxCreate", 11040, "cuCtxCreate_v3");
    proc_at("cuCtxCreate", 12040, "cuCtxCreate_v3");
    proc_at("cuCtxCreate", 12050, "cuCtxCreate_v4");
    proc_at("cuCtxCreate", 13000, "cuCtxCreate_v4");

    /* Each makes a context on the device named, current, usable, counted
     * under its own name. */
    CUcontext primary = e2e_cu_primary_current(0), c = NULL;
    CUdevice d1;
    CHECK_EQ(D.DeviceGet(&d1, 1), CUDA_SUCCESS);
    const uint64_t n1 = calls_of("cuCtxCreate"), n2 = calls_of("cuCtxCreate_v2"),
                   n3 = calls_of("cuCtxCreate_v3");
    CHECK_EQ(v1(&c, 0, d1), CUDA_SUCCESS);
    check_created(c, primary);
    CHECK_EQ(v2(&c, CU_CTX_SCHED_BLOCKING_SYNC, d1), CUDA_SUCCESS);
    check_created(c, primary);
    CHECK_EQ(v3(&c, NULL, 0, 0, d1), CUDA_SUCCESS);
    check_created(c, primary);
    CHECK_EQ(calls_of("cuCtxCreate") - n1, 1);
    CHECK_EQ(calls_of("cuCtxCreate_v2") - n2, 1);
    CHECK_EQ(calls_of("cuCtxCreate_v3") - n3, 1);

    /* Refused, no context made: no device, no place for the handle;
     * execution affinity (only under MPS) and CIG mode, which the fake's
     * devices do not support; affinity arguments that do not agree. */
    CUexecAffinityParam sm = {.type = CU_EXEC_AFFINITY_TYPE_SM_COUNT, .param.smCount.val = 8};
    CUexecAffinityParam bad = {.type = CU_EXEC_AFFINITY_TYPE_MAX};
    CHECK_EQ(v1(&c, 0, 99), CUDA_ERROR_INVALID_DEVICE);
    CHECK_EQ(v2(NULL, 0, d1), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(v3(&c, NULL, 0, 0, 99), CUDA_ERROR_INVALID_DEVICE);
    CHECK_EQ(v3(&c, &sm, 1, 0, d1), CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY);
    CHECK_EQ(v3(&c, &bad, 1, 0, d1), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(v3(&c, NULL, 1, 0, d1), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(v3(&c, &sm, -1, 0, d1), CUDA_ERROR_INVALID_VALUE);
    CUctxCreateParams with_sm = {.execAffinityParams = &sm, .numExecAffinityParams = 1};
    CUctxCigParam cig = {0};
    CUctxCreateParams with_cig = {.cigParams = &cig};
    CUctxCreateParams none = {0};
    CHECK_EQ(v4(&c, &with_sm, 0, d1), CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY);
    CHECK_EQ(v4(&c, &with_cig, 0, d1), CUDA_ERROR_NOT_SUPPORTED);
    CUcontext cur = NULL;
    CUresult (*get_current)(CUcontext *) = (CUresult(*)(CUcontext *))e2e_dlsym(h, "cuCtxGetCurrent");
    CHECK_EQ(get_current(&cur), CUDA_SUCCESS);
    CHECK(cur == primary);
    CHECK_EQ(v4(&c, &none, 0, d1), CUDA_SUCCESS); /* no affinity, no CIG: a regular one */
    check_created(c, primary);
}

/* Host functions that note their run, or what a CUDA call made from one
 * answered. */
static int host_runs;
static void count_run(void *arg) { (void)arg; host_runs++; }
static CUresult host_fn_api_answer = CUDA_SUCCESS;
static void host_fn_calls_cuda(void *arg)
{
    host_fn_api_answer = D.EventQuery(*(CUevent *)arg);
}

static void fake_stream_flags(void)
{
    start();
    void *h = e2e_open_libcuda();
    CUresult (*create_prio)(CUstream *, unsigned, int) =
        (CUresult(*)(CUstream *, unsigned, int))e2e_dlsym(h, "cuStreamCreateWithPriority");
    CUresult (*get_flags)(CUstream, unsigned *) =
        (CUresult(*)(CUstream, unsigned *))e2e_dlsym(h, "cuStreamGetFlags");
    CUstream s = NULL, nb, blk;
    unsigned flags = 99;
    /* cuStreamCreate: "Valid values for Flags are: CU_STREAM_DEFAULT ...
     * CU_STREAM_NON_BLOCKING"; cuStreamCreateWithPriority takes the same. */
    CHECK_EQ(D.StreamCreate(&s, 0x2), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.StreamCreate(&s, 0x80), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(create_prio(&s, 0x2, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK(s == NULL);
    /* A priority out of range is clamped, not refused. */
    CHECK_EQ(create_prio(&nb, CU_STREAM_NON_BLOCKING, -1000), CUDA_SUCCESS);
    CHECK_EQ(get_flags(nb, &flags), CUDA_SUCCESS);
    CHECK_EQ(flags, CU_STREAM_NON_BLOCKING);
    CHECK_EQ(D.StreamCreate(&blk, CU_STREAM_DEFAULT), CUDA_SUCCESS);
    CHECK_EQ(get_flags(blk, &flags), CUDA_SUCCESS);
    CHECK_EQ(flags, CU_STREAM_DEFAULT);
    CHECK_EQ(D.StreamDestroy(nb), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(blk), CUDA_SUCCESS);
}

static void fake_host_func(void)
{
    start();
    CUresult (*host_func)(CUstream, CUhostFn, void *) =
        (CUresult(*)(CUstream, CUhostFn, void *))e2e_dlsym(e2e_open_libcuda(), "cuLaunchHostFunc");
    CUstream blk, gone;
    CUevent e;
    CUgraph g;
    CHECK_EQ(D.StreamCreate(&blk, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    /* Queued: the stream is not done until the function has run. */
    host_runs = 0;
    CHECK_EQ(host_func(blk, count_run, NULL), CUDA_SUCCESS);
    CHECK_EQ(D.StreamQuery(blk), CUDA_ERROR_NOT_READY);
    CHECK_EQ(host_runs, 0);
    CHECK_EQ(D.StreamSynchronize(blk), CUDA_SUCCESS);
    CHECK_EQ(host_runs, 1);
    CHECK_EQ(D.StreamQuery(blk), CUDA_SUCCESS);
    /* A bad stream: CUDA_ERROR_INVALID_HANDLE, the code cuda.h lists. */
    CHECK_EQ(D.StreamCreate(&gone, 0), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(gone), CUDA_SUCCESS);
    CHECK_EQ(host_func(gone, count_run, NULL), CUDA_ERROR_INVALID_HANDLE);
    /* "The host function must not make any CUDA API calls. Attempting to
     * use a CUDA API may result in CUDA_ERROR_NOT_PERMITTED": here it
     * does; after the function, calls are answered again. */
    host_fn_api_answer = CUDA_SUCCESS;
    CHECK_EQ(host_func(blk, host_fn_calls_cuda, &e), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(blk), CUDA_SUCCESS);
    CHECK_EQ(host_fn_api_answer, CUDA_ERROR_NOT_PERMITTED);
    CHECK_EQ(D.EventQuery(e), CUDA_SUCCESS);
    /* In a capture it is a node of the graph: never run. */
    host_runs = 0;
    CHECK_EQ(D.StreamBeginCapture(blk, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(host_func(blk, count_run, NULL), CUDA_SUCCESS);
    CHECK_EQ(D.StreamEndCapture(blk, &g), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(blk), CUDA_SUCCESS);
    CHECK_EQ(host_runs, 0);
    NEED(GraphDestroy);
    CHECK_EQ(X.GraphDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(e), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(blk), CUDA_SUCCESS);
}

/* What the fake already did as CUDA says, kept as it is: a wait takes the
 * event's record at the time of the call; non-blocking streams do not
 * order with the legacy stream, blocking and per-thread ones do; a wait on
 * another device's event is legal and orders; cuCtxSynchronize covers its
 * own context only; a destroyed stream's work and the events behind it
 * still complete. */
static void fake_stream_order(void)
{
    start();
    CUstream nb, blk, other, s1;
    CUevent e, e1;
    CHECK_EQ(D.StreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&blk, 0), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&other, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    /* Wait flags: 0 or CU_EVENT_WAIT_EXTERNAL, that one only in a capture. */
    CHECK_EQ(D.StreamWaitEvent(blk, e, 0x2), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.StreamWaitEvent(blk, e, CU_EVENT_WAIT_EXTERNAL), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.EventQuery(e), CUDA_SUCCESS); /* never recorded: empty */
    /* "cuStreamWaitEvent() use[s] the most recently captured state at the
     * time of the API call": a later record on an idle stream changes
     * nothing for the wait. */
    host_runs = 0;
    CHECK_EQ(fakecuda()->launch(nb, nothing, NULL), 0);
    CHECK_EQ(D.EventRecord(e, nb), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(e), CUDA_ERROR_NOT_READY);
    CHECK_EQ(D.StreamWaitEvent(other, e, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(e, blk), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(e), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->launch(other, count_run, NULL), 0);
    CHECK_EQ(D.StreamQuery(other), CUDA_ERROR_NOT_READY);
    CHECK_EQ(fakecuda()->pending(nb), 1);
    fakecuda()->complete(other);
    CHECK_EQ(host_runs, 1);
    CHECK_EQ(fakecuda()->pending(nb), 0); /* the GPU ran nb to get there */
    /* Non-blocking: not behind legacy work; blocking: behind it. */
    host_runs = 0;
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, count_run, NULL), 0);
    CHECK_EQ(fakecuda()->launch(nb, nothing, NULL), 0);
    fakecuda()->complete(nb);
    CHECK_EQ(host_runs, 0);
    CHECK_EQ(fakecuda()->launch(blk, nothing, NULL), 0);
    fakecuda()->complete(blk);
    CHECK_EQ(host_runs, 1);
    /* The per-thread default stream is a blocking one. */
    CHECK_EQ(fakecuda()->launch(CU_STREAM_PER_THREAD, nothing, NULL), 0);
    CHECK_EQ(D.EventRecord(e, CU_STREAM_LEGACY), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(e), CUDA_ERROR_NOT_READY);
    fakecuda()->complete(CU_STREAM_PER_THREAD);
    CHECK_EQ(D.EventQuery(e), CUDA_SUCCESS);
    /* Another device's context: its event may be waited on ("hEvent may be
     * from a different context or device than hStream"), not recorded on
     * this context's stream. */
    CUcontext primary = e2e_cu_primary_current(0), c1;
    CUdevice d1;
    CHECK_EQ(D.DeviceGet(&d1, 1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxCreate(&c1, NULL, 0, d1), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&s1, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&e1, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(e, s1), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(fakecuda()->launch(s1, nothing, NULL), 0);
    CHECK_EQ(D.EventRecord(e1, s1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(e1), CUDA_ERROR_NOT_READY);
    CHECK_EQ(D.StreamWaitEvent(blk, e1, 0), CUDA_SUCCESS);
    host_runs = 0;
    CHECK_EQ(fakecuda()->launch(blk, count_run, NULL), 0);
    CHECK_EQ(D.CtxSynchronize(), CUDA_SUCCESS); /* reaches s1 through the wait */
    CHECK_EQ(host_runs, 1);
    CHECK_EQ(D.EventQuery(e1), CUDA_SUCCESS);
    /* cuCtxSynchronize: "the current context's tasks", not c1's. */
    CHECK_EQ(fakecuda()->launch(s1, nothing, NULL), 0);
    CHECK_EQ(D.CtxSynchronize(), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->pending(s1), 1);
    /* A stream and event of c1 go together whatever is current. */
    CHECK_EQ(D.EventRecord(e1, s1), CUDA_SUCCESS);
    /* Destroyed with work queued: returns at once, the work and the event
     * behind it complete later; the handle is gone. */
    CHECK_EQ(D.CtxSetCurrent(c1), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s1), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(e1), CUDA_ERROR_NOT_READY);
    CHECK_EQ(D.EventRecord(e1, s1), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(D.CtxSynchronize(), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(e1), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(e1), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(primary), CUDA_SUCCESS);
    CHECK_EQ(D.CtxDestroy(c1), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(e), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(nb), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(blk), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(other), CUDA_SUCCESS);
}

/* The entry points a program may reach the driver by that the shim passes
 * through (cuda.h's CUDA_API_PER_THREAD_DEFAULT_STREAM list maps each to a
 * _ptsz twin): cuEventRecordWithFlags, cuStreamQuery_ptsz,
 * cuStreamGetPriority, cuLaunchHostFunc_ptsz. */
static void fake_more_stream_calls(void)
{
    start();
    NEED(GetProcAddress);
    void *h = e2e_open_libcuda();
    CUresult (*record_flags[2])(CUevent, CUstream, unsigned);
    CUresult (*query_ptsz)(CUstream);
    CUresult (*priority[2])(CUstream, int *);
    CUresult (*host_func_ptsz)(CUstream, CUhostFn, void *);
    CUresult (*create_prio)(CUstream *, unsigned, int);
    *(void **)&record_flags[0] = e2e_dlsym(h, "cuEventRecordWithFlags");
    *(void **)&record_flags[1] = e2e_dlsym(h, "cuEventRecordWithFlags_ptsz");
    *(void **)&query_ptsz = e2e_dlsym(h, "cuStreamQuery_ptsz");
    *(void **)&priority[0] = e2e_dlsym(h, "cuStreamGetPriority");
    *(void **)&priority[1] = e2e_dlsym(h, "cuStreamGetPriority_ptsz");
    *(void **)&host_func_ptsz = e2e_dlsym(h, "cuLaunchHostFunc_ptsz");
    *(void **)&create_prio = e2e_dlsym(h, "cuStreamCreateWithPriority");
    /* cuGetProcAddress hands them out (cudaTypedefs.h's versions). */
    proc_at("cuEventRecordWithFlags", 11010, "cuEventRecordWithFlags");
    proc_ptds_at("cuEventRecordWithFlags", 11010, "cuEventRecordWithFlags_ptsz");
    proc_at("cuStreamQuery", 2000, "cuStreamQuery");
    proc_ptds_at("cuStreamQuery", 7000, "cuStreamQuery_ptsz");
    proc_at("cuStreamGetPriority", 5050, "cuStreamGetPriority");
    proc_ptds_at("cuStreamGetPriority", 7000, "cuStreamGetPriority_ptsz");
    proc_ptds_at("cuLaunchHostFunc", 10000, "cuLaunchHostFunc_ptsz");

    CUstream blk, prio;
    CUevent e;
    CUgraph g;
    CHECK_EQ(D.StreamCreate(&blk, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    /* CU_EVENT_RECORD_DEFAULT is cuEventRecord: the event waits for the
     * stream's work. */
    CHECK_EQ(fakecuda()->launch(blk, nothing, NULL), 0);
    CHECK_EQ(record_flags[0](e, blk, CU_EVENT_RECORD_DEFAULT), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(e), CUDA_ERROR_NOT_READY);
    fakecuda()->complete(blk);
    CHECK_EQ(D.EventQuery(e), CUDA_SUCCESS);
    /* An unknown flag, and EXTERNAL outside a capture ("invalid outside of
     * stream capture"): invalid values, the event untouched. */
    CHECK_EQ(fakecuda()->launch(blk, nothing, NULL), 0);
    CHECK_EQ(record_flags[0](e, blk, 0x2), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(record_flags[0](e, blk, CU_EVENT_RECORD_EXTERNAL), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.EventQuery(e), CUDA_SUCCESS);
    /* _ptsz: stream 0 is the per-thread stream, which does not wait for
     * another blocking stream's work (the legacy stream would). */
    CHECK_EQ(record_flags[1](e, NULL, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(e), CUDA_SUCCESS);
    CHECK_EQ(record_flags[0](e, NULL, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(e), CUDA_ERROR_NOT_READY);
    fakecuda()->complete(blk);
    CHECK_EQ(D.EventQuery(e), CUDA_SUCCESS);
    /* EXTERNAL in a capture: a node of the graph; the event is neither
     * recorded now nor a captured event. */
    CHECK_EQ(fakecuda()->launch(blk, nothing, NULL), 0);
    CHECK_EQ(D.EventRecord(e, blk), CUDA_SUCCESS);
    CHECK_EQ(D.StreamBeginCapture(blk, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(record_flags[0](e, blk, CU_EVENT_RECORD_EXTERNAL), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(e), CUDA_ERROR_NOT_READY); /* still the record before */
    CHECK_EQ(capture_status(blk), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CHECK_EQ(D.StreamEndCapture(blk, &g), CUDA_SUCCESS);
    CHECK(g != NULL);
    NEED(GraphDestroy);
    CHECK_EQ(X.GraphDestroy(g), CUDA_SUCCESS);
    fakecuda()->complete(blk);
    CHECK_EQ(D.EventQuery(e), CUDA_SUCCESS);
    /* cuStreamQuery_ptsz: stream 0 is the per-thread stream. */
    CHECK_EQ(fakecuda()->launch(blk, nothing, NULL), 0);
    CHECK_EQ(query_ptsz(NULL), CUDA_SUCCESS);
    CHECK_EQ(query_ptsz(blk), CUDA_ERROR_NOT_READY);
    fakecuda()->complete(blk);
    CHECK_EQ(fakecuda()->launch(CU_STREAM_PER_THREAD, nothing, NULL), 0);
    CHECK_EQ(query_ptsz(NULL), CUDA_ERROR_NOT_READY);
    fakecuda()->complete(CU_STREAM_PER_THREAD);
    CHECK_EQ(query_ptsz(NULL), CUDA_SUCCESS);
    /* cuLaunchHostFunc_ptsz: on the per-thread stream, queued. */
    host_runs = 0;
    CHECK_EQ(host_func_ptsz(NULL, count_run, NULL), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->pending(CU_STREAM_PER_THREAD), 1);
    CHECK_EQ(fakecuda()->pending(CU_STREAM_LEGACY), 0);
    CHECK_EQ(host_runs, 0);
    fakecuda()->complete(CU_STREAM_PER_THREAD);
    CHECK_EQ(host_runs, 1);
    CHECK_EQ(host_func_ptsz(blk, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    /* cuStreamGetPriority: the clamped priority; the range is [0, 0]. */
    int p = 7;
    CHECK_EQ(create_prio(&prio, CU_STREAM_NON_BLOCKING, -1000), CUDA_SUCCESS);
    for (int z = 0; z < 2; z++) {
        p = 7;
        CHECK_EQ(priority[z](prio, &p), CUDA_SUCCESS);
        CHECK_EQ(p, 0);
        p = 7;
        CHECK_EQ(priority[z](NULL, &p), CUDA_SUCCESS);
        CHECK_EQ(p, 0);
        CHECK_EQ(priority[z](prio, NULL), CUDA_ERROR_INVALID_VALUE);
    }
    CHECK_EQ(D.StreamDestroy(prio), CUDA_SUCCESS);
    CHECK_EQ(priority[0](prio, &p), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(D.EventDestroy(e), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(blk), CUDA_SUCCESS);
}

/* A record on the legacy stream waits for every blocking stream's work
 * before it (its event completes after a's), but is no action that later
 * blocking-stream work waits for: the stream synchronisation note names
 * kernel launches and cudaStreamWaitEvent as the legacy stream's actions,
 * and whether a record is one is not documented, so the fake takes the
 * reading that makes the shim's life harder (the ordered pool's barrier
 * must wait for its event, not only record it: e2e_fences ordered-reuse
 * fails without the wait). A non-blocking stream never waits. */
static void fake_legacy_record(void)
{
    start();
    CUstream a, b, nb;
    CUevent e;
    CHECK_EQ(D.StreamCreate(&a, 0), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&b, 0), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    host_runs = 0;
    CHECK_EQ(fakecuda()->launch(a, count_run, NULL), 0);
    CHECK_EQ(D.EventRecord(e, CU_STREAM_LEGACY), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(e), CUDA_ERROR_NOT_READY); /* it covers a's work */
    CHECK_EQ(fakecuda()->launch(nb, nothing, NULL), 0);
    fakecuda()->complete(nb);
    CHECK_EQ(host_runs, 0);
    CHECK_EQ(fakecuda()->launch(b, nothing, NULL), 0);
    fakecuda()->complete(b);
    CHECK_EQ(host_runs, 0); /* b's later work did not wait for the record */
    CHECK_EQ(D.EventQuery(e), CUDA_ERROR_NOT_READY);
    fakecuda()->complete(a);
    CHECK_EQ(host_runs, 1);
    CHECK_EQ(D.EventQuery(e), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(e), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(a), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(b), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(nb), CUDA_SUCCESS);
}

/* Whether the legacy stream's implicit wait ("the legacy stream first waits
 * on all blocking streams", stream synchronisation behaviour) includes a
 * blocking stream destroyed with work queued is not documented: cuda.h
 * says only that cuStreamDestroy returns at once and the stream's resources
 * go "once the device has completed all work" in it. The fake's default is
 * the harder reading for the shim, that it does not (only an explicit wait
 * orders that work: e2e_fences ordered-stream-destroy);
 * FAKECUDA_LEGACY_SKIPS_DESTROYED=0 takes the other. A live blocking
 * stream is waited for either way. */
static void fake_legacy_destroyed(void)
{
    start();
    const char *reading = getenv("FAKECUDA_LEGACY_SKIPS_DESTROYED");
    const bool waits = reading && strcmp(reading, "0") == 0;
    CUstream live, gone;
    CHECK_EQ(D.StreamCreate(&live, 0), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&gone, 0), CUDA_SUCCESS);
    host_runs = 0;
    CHECK_EQ(fakecuda()->launch(gone, count_run, NULL), 0);
    CHECK_EQ(D.StreamDestroy(gone), CUDA_SUCCESS);
    CHECK_EQ(fakecuda()->launch(live, count_run, NULL), 0);
    CHECK_EQ(fakecuda()->launch(CU_STREAM_LEGACY, nothing, NULL), 0);
    fakecuda()->complete(CU_STREAM_LEGACY); /* and what it waits for */
    CHECK_EQ(fakecuda()->pending(CU_STREAM_LEGACY), 0);
    CHECK_EQ(fakecuda()->pending(live), 0);
    CHECK_EQ(fakecuda()->pending(gone), waits ? 0 : 1);
    CHECK_EQ(host_runs, waits ? 2 : 1);
    fakecuda()->complete(gone); /* its work goes on after the destroy */
    CHECK_EQ(host_runs, 2);
    CHECK_EQ(D.StreamDestroy(live), CUDA_SUCCESS);
}

/* cuStreamWaitEvent on an event last recorded in a capture that has
 * ended: CUDA_ERROR_CAPTURED_EVENT, as a query of it; a capturing waiter's
 * capture is invalidated. A later plain record makes it usable again. */
static void fake_wait_ended_capture(void)
{
    start();
    CUstream s, other;
    CUevent e;
    CUgraph g;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(D.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(e, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamEndCapture(s, &g), CUDA_SUCCESS);
    NEED(GraphDestroy);
    CHECK_EQ(X.GraphDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(e), CUDA_ERROR_CAPTURED_EVENT);
    CHECK_EQ(D.StreamWaitEvent(other, e, 0), CUDA_ERROR_CAPTURED_EVENT);
    CHECK_EQ(capture_status(other), CU_STREAM_CAPTURE_STATUS_NONE);
    CHECK_EQ(D.StreamBeginCapture(other, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(D.StreamWaitEvent(other, e, 0), CUDA_ERROR_CAPTURED_EVENT);
    CHECK_EQ(capture_status(other), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CHECK_EQ(D.StreamEndCapture(other, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK_EQ(D.EventRecord(e, s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamWaitEvent(other, e, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(e), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(other), CUDA_SUCCESS);
}

/* fail_call (fake_cuda.h): one counted call fails with a documented code. */
typedef struct {
    atomic_uint failed;
    int calls;
} fail_race;

static void *create_events(void *arg)
{
    fail_race *r = arg;
    e2e_cu_primary_current(0);
    for (int i = 0; i < r->calls; i++) {
        CUevent e = NULL;
        CUresult res = D.EventCreate(&e, CU_EVENT_DISABLE_TIMING);
        if (res == CUDA_ERROR_OUT_OF_MEMORY)
            atomic_fetch_add(&r->failed, 1);
        else {
            CHECK_EQ(res, CUDA_SUCCESS);
            CHECK_EQ(D.EventDestroy(e), CUDA_SUCCESS);
        }
    }
    return NULL;
}

static void fake_fail_call(void)
{
    start();
    const fakecuda_api *f = fakecuda();
    /* Codes cuda.h does not list for the entry point, and entry points
     * without a table entry, are refused. */
    CHECK_EQ(f->fail_call("cuEventRecord", 1, CUDA_ERROR_OUT_OF_MEMORY, 0), -1);
    CHECK_EQ(f->fail_call("cuEventCreate", 1, CUDA_ERROR_NOT_READY, 0), -1);
    CHECK_EQ(f->fail_call("cuEventCreate", 1, CUDA_SUCCESS, 0), -1);
    CHECK_EQ(f->fail_call("cuGreenCtxRecordEvent", 1, CUDA_ERROR_ILLEGAL_ADDRESS, 0), -1);
    CHECK_EQ(f->fail_call("cuMemcpyHtoD_v2", 1, CUDA_ERROR_INVALID_VALUE, 0), -1);
    /* The second cuEventCreate from now fails, once. */
    CHECK_EQ(f->fail_call("cuEventCreate", 2, CUDA_ERROR_OUT_OF_MEMORY, 0), 0);
    uint64_t made = calls_of("cuEventCreate");
    CUevent a = NULL, b = NULL, c = NULL;
    CHECK_EQ(D.EventCreate(&a, 0), CUDA_SUCCESS);
    CHECK_EQ(D.EventCreate(&b, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(b == NULL);
    CHECK_EQ(D.EventCreate(&c, 0), CUDA_SUCCESS);
    CHECK_EQ(calls_of("cuEventCreate") - made, 3); /* the failed one counted too */
    /* A failed record records nothing: the event keeps its earlier state
     * (never recorded: complete), though the stream has work queued. */
    CUstream s;
    CHECK_EQ(D.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(f->launch(s, nothing, NULL), 0);
    CHECK_EQ(f->fail_call("cuEventRecord", 1, CUDA_ERROR_INVALID_CONTEXT, 0), 0);
    CHECK_EQ(D.EventRecord(a, s), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(D.EventQuery(a), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(a, s), CUDA_SUCCESS);
    CHECK_EQ(D.EventQuery(a), CUDA_ERROR_NOT_READY);
    /* Counted per entry point: cuEventRecord_ptsz is its own. */
    void *h = e2e_open_libcuda();
    CUresult (*record_ptsz)(CUevent, CUstream) =
        (CUresult (*)(CUevent, CUstream))e2e_dlsym(h, "cuEventRecord_ptsz");
    CHECK_EQ(f->fail_call("cuEventRecord", 1, CUDA_ERROR_INVALID_HANDLE, 0), 0);
    CHECK_EQ(record_ptsz(c, NULL), CUDA_SUCCESS);
    CHECK_EQ(D.EventRecord(c, CU_STREAM_LEGACY), CUDA_ERROR_INVALID_HANDLE);
    /* Sticky: the first query from now and every later one answer the
     * faulted context's error, until cleared (n = 0). */
    CHECK_EQ(f->fail_call("cuEventQuery", 1, CUDA_ERROR_ILLEGAL_ADDRESS, 1), 0);
    for (int i = 0; i < 3; i++)
        CHECK_EQ(D.EventQuery(a), CUDA_ERROR_ILLEGAL_ADDRESS);
    f->complete_all();
    CHECK_EQ(D.EventQuery(a), CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK_EQ(f->fail_call("cuEventQuery", 0, 0, 0), 0);
    CHECK_EQ(D.EventQuery(a), CUDA_SUCCESS);
    /* Arming again replaces the rule. */
    CHECK_EQ(f->fail_call("cuStreamSynchronize", 1, CUDA_ERROR_INVALID_HANDLE, 0), 0);
    CHECK_EQ(f->fail_call("cuStreamSynchronize", 2, CUDA_ERROR_LAUNCH_FAILED, 0), 0);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_ERROR_LAUNCH_FAILED);
    CHECK_EQ(D.StreamSynchronize(s), CUDA_SUCCESS);
    /* Concurrent callers: exactly one of 2 x 500 calls fails. */
    fail_race r = {.calls = 500};
    CHECK_EQ(f->fail_call("cuEventCreate", 700, CUDA_ERROR_OUT_OF_MEMORY, 0), 0);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        CHECK_EQ(pthread_create(&t[i], NULL, create_events, &r), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    CHECK_EQ(atomic_load(&r.failed), 1);
    CHECK_EQ(D.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(a), CUDA_SUCCESS);
    CHECK_EQ(D.EventDestroy(c), CUDA_SUCCESS);
}

int main(int argc, char **argv)
{
    static const e2e_scenario scenarios[] = {
        {"fake-copies", fake_copies},
        {"fake-free-sync", fake_free_sync},
        {"fake-event-timing", fake_event_timing},
        {"fake-stream-ids", fake_stream_ids},
        {"fake-stream-ids-reuse", fake_stream_ids},
        {"fake-event-handles", fake_event_handles},
        {"fake-event-handles-reuse", fake_event_handles},
        {"fake-counts", fake_counts},
        {"fake-fail-call", fake_fail_call},
        {"fake-v1-entry-points", fake_v1_entry_points},
        {"fake-host-memory", fake_host_memory},
        {"fake-peer-copy", fake_peer_copy},
        {"fake-pool-access", fake_pool_access},
        {"fake-pool-reuse", fake_pool_reuse},
        {"fake-vmm-args", fake_vmm_args},
        {"fake-stream-write", fake_stream_write},
        {"fake-memset", fake_memset},
        {"fake-fork-rewait", fake_fork_rewait},
        {"fake-capture-fork", fake_capture_fork},
        {"fake-capture-misuse", fake_capture_misuse},
        {"fake-capture-free-async", fake_capture_free_async},
        {"fake-capture-invalidated-use", fake_capture_invalidated_use},
        {"fake-capture-info", fake_capture_info},
        {"fake-ptds", fake_ptds},
        {"fake-copy-ranges", fake_copy_ranges},
        {"fake-primary-reset", fake_primary_reset},
        {"fake-ctx-stack", fake_ctx_stack},
        {"fake-ctx-create-versions", fake_ctx_create_versions},
        {"fake-pci-bus-id", fake_pci_bus_id},
        {"fake-nvml", fake_nvml},
        {"fake-nvml-visible", fake_nvml_visible},
        {"fake-visible-devices", fake_visible_devices},
        {"fake-visible-uuid", fake_visible_uuid},
        {"fake-visible-none", fake_visible_none},
        {"fake-stream-flags", fake_stream_flags},
        {"fake-host-func", fake_host_func},
        {"fake-stream-order", fake_stream_order},
        {"fake-more-stream-calls", fake_more_stream_calls},
        {"fake-legacy-record", fake_legacy_record},
        {"fake-legacy-destroyed", fake_legacy_destroyed},
        {"fake-legacy-destroyed-waits", fake_legacy_destroyed},
        {"fake-wait-ended-capture", fake_wait_ended_capture},
    };
    return e2e_main("e2e_fake_rules", scenarios, sizeof scenarios / sizeof scenarios[0], argc,
                    argv);
}
