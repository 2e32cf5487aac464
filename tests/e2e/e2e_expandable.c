/*
 * e2e_expandable.c - the virtual memory door (shim/lib/door_vmm.c) seen by a
 * program that allocates as PyTorch 2.11's expandable segments do
 * (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; c10/cuda/
 * CUDACachingAllocator.cpp, ExpandableSegment), finding the driver as
 * PyTorch does (c10/cuda/driver_api.cpp): never dlopen'd, never linked,
 * every function asked of the runtime by base name with
 * cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault,
 * &status), taken only when the status says found; a build against CUDA
 * before 12.5 asks cudaGetDriverEntryPoint instead, and one before 13.0
 * falls back to it when the first fails.
 *
 * A segment is one address range reserved at once (cuMemAddressReserve of
 * 1 1/8 the device's memory, in pages of 2 MiB for the small pool and
 * 20 MiB for the large), grown a page at a time: per page one cuMemCreate
 * (device memory, exportable: a fabric handle tried first, a file
 * descriptor when the device refuses it; GPUDirect RDMA capable where the
 * device says so) and one cuMemMap, then one cuMemSetAccess over all the
 * pages just mapped, for the device and each peer. It shrinks by whole pages:
 * a stream synchronisation, then per page cuMemUnmap and cuMemRelease. A
 * growth that runs out of memory releases the pages it made and reports
 * nothing mapped. The door lends this memory the pool's limit (bytes_lent;
 * under BFCSHIM_VMM_DOOR=count it counts it as passthrough_vmm_*) while it
 * lives, and only then; a growth past the limit fails as past the device.
 * Scenarios:
 *
 *   grow-shrink   a small and a large segment grow, shrink in the middle,
 *                 grow into the hole, gain a peer (access set over the
 *                 segment's mapped runs, each several mappings), and are
 *                 destroyed: the count follows the live pages at every
 *                 step, its peak and the creates too, the bytes survive, and
 *                 the functions handed out are the shim's doors
 *   oom           a growth past the device's memory: the pages it made are
 *                 released, the count is back where it was
 *   entry-point   the same reached through cudaGetDriverEntryPoint (builds
 *                 against CUDA before 12.5, and the fallback before 13.0)
 *   hooks-off     (BFCSHIM_DRIVER_HOOKS=0) the driver's own functions are
 *                 handed out and nothing is counted
 *   runtime-rules (no shim) the fake runtime's entry points keep
 *                 cuda_runtime_api.h's rules
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include "e2e.h"

#define MiB ((size_t)1 << 20)
#define SMALL_PAGE (2 * MiB)  /* PyTorch's kSmallBuffer */
#define LARGE_PAGE (20 * MiB) /* kLargeBuffer */
#define TORCH_DRIVER_VERSION 12000 /* what driver_api.h asks every function at */

/* The driver functions the expandable segments call, and the export and
 * import they share segments with (PyTorch's DriverAPI table requires a few
 * more, cuMemsetD32Async and cuStreamWriteValue32, which the fake driver
 * lacks: real PyTorch would stop there on it). */
static struct {
    CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                                  unsigned long long);
    CUresult (*MemAddressFree)(CUdeviceptr, size_t);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                          unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long);
    CUresult (*MemUnmap)(CUdeviceptr, size_t);
    CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle,
                                           CUmemAllocationHandleType, unsigned long long);
    CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *,
                                             CUmemAllocationHandleType);
} api;

typedef enum { BY_VERSION, DEPRECATED } lookup_kind;

/* cudaGetDriverEntryPoint is deprecated as of CUDA 13.0 (the header says
 * so, and the compiler with it), but PyTorch builds against older
 * toolkits call it, and the runtime still has it. */
static cudaError_t deprecated_entry_point(const char *name, void **fn, unsigned long long flags,
                                          enum cudaDriverEntryPointQueryResult *st)
{
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    return cudaGetDriverEntryPoint(name, fn, flags, st);
#pragma GCC diagnostic pop
}

/* One function by base name, as driver_api.cpp's get_symbol asks for it:
 * found only when the call succeeds, the status says found and a function
 * came back. */
static void *symbol(const char *name, lookup_kind how)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e;
    if (how == BY_VERSION) {
        e = cudaGetDriverEntryPointByVersion(name, &fn, TORCH_DRIVER_VERSION, cudaEnableDefault,
                                             &st);
    } else {
        e = deprecated_entry_point(name, &fn, cudaEnableDefault, &st);
    }
    if (e != cudaSuccess || st != cudaDriverEntryPointSuccess || !fn) {
        fprintf(stderr, "%s: not found (error %d, status %d)\n", name, (int)e, (int)st);
        exit(1); /* PyTorch asserts: nothing after it can run */
    }
    return fn;
}

static void load(lookup_kind how)
{
    /* PyTorch has initialised the runtime long before its allocator maps
     * anything. */
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
#define LOOK(field, name) *(void **)&api.field = symbol(name, how)
    LOOK(DeviceGetAttribute, "cuDeviceGetAttribute");
    LOOK(MemAddressReserve, "cuMemAddressReserve");
    LOOK(MemAddressFree, "cuMemAddressFree");
    LOOK(MemCreate, "cuMemCreate");
    LOOK(MemRelease, "cuMemRelease");
    LOOK(MemMap, "cuMemMap");
    LOOK(MemUnmap, "cuMemUnmap");
    LOOK(MemSetAccess, "cuMemSetAccess");
    LOOK(GetErrorString, "cuGetErrorString");
    LOOK(MemExportToShareableHandle, "cuMemExportToShareableHandle");
    LOOK(MemImportFromShareableHandle, "cuMemImportFromShareableHandle");
#undef LOOK
}

/* The handle type the process settled on: unset until the first growth,
 * which tries a fabric handle and falls back to a file descriptor. */
static CUmemAllocationHandleType handle_type;
static bool handle_type_known;

typedef struct segment {
    int dev, peer; /* peer: a second device granted access, or -1 */
    cudaStream_t stream;
    size_t page; /* segment_size_ */
    size_t npages; /* max_handles_ */
    CUdeviceptr base;
    CUmemGenericAllocationHandle *h;
    bool *mapped;
} segment;

/* What the client made that still lives, to compare with the shim's count. */
static long long live, peak;
static long long creates;

static long long counted(void) { return shim_vmm_door_bytes(); }

static void note(long long bytes)
{
    live += bytes;
    peak = live > peak ? live : peak;
}

static segment open_segment(int dev, size_t page, cudaStream_t stream)
{
    segment s = {dev, -1, stream, page, 0, 0, NULL, NULL};
    /* PyTorch reads cudaDeviceProp::totalGlobalMem; the fake runtime has no
     * cudaGetDeviceProperties, and cudaMemGetInfo's total is the same
     * figure (the device's, under the shim too). */
    size_t free_bytes = 0, total = 0;
    CHECK_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
    s.npages = (total + total / 8 + page - 1) / page;
    CHECK_EQ(api.MemAddressReserve(&s.base, s.page * s.npages, 0, 0, 0), CUDA_SUCCESS);
    s.h = calloc(s.npages, sizeof *s.h);
    s.mapped = calloc(s.npages, sizeof *s.mapped);
    if (!s.h || !s.mapped)
        exit(1);
    return s;
}

static CUdeviceptr page_at(const segment *s, size_t i) { return s->base + i * s->page; }

static void set_access(const segment *s, int dev, size_t first, size_t n)
{
    CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK_EQ(api.MemSetAccess(page_at(s, first), n * s->page, &a, 1), CUDA_SUCCESS);
}

/* Makes pages [first, first + n): true, or false with nothing made when the
 * device is out of memory (or, trying a fabric handle, refuses it). */
static bool create_pages(segment *s, size_t first, size_t n, CUresult *why)
{
    for (size_t i = first; i < first + n; i++) {
        CUmemAllocationProp p;
        memset(&p, 0, sizeof p);
        p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.requestedHandleTypes = handle_type;
        int rdma = 0;
        CHECK_EQ(api.DeviceGetAttribute(
                     &rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, s->dev),
                 CUDA_SUCCESS);
        if (rdma)
            p.allocFlags.gpuDirectRDMACapable = 1;
        p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = s->dev;
        CUresult r = api.MemCreate(&s->h[i], s->page, &p, 0);
        if (r != CUDA_SUCCESS) {
            *why = r;
            /* PyTorch gives back what this growth made, on out of memory;
             * a refused fabric handle fails on the first page. */
            for (size_t j = first; j < i; j++) {
                CHECK_EQ(api.MemRelease(s->h[j]), CUDA_SUCCESS);
                note(-(long long)s->page);
            }
            return false;
        }
        creates++;
        note((long long)s->page);
    }
    return true;
}

/* ExpandableSegment::map over pages [first, first + n): true when mapped,
 * false when out of memory (nothing then mapped, nothing left made). */
static bool grow(segment *s, size_t first, size_t n)
{
    CUresult why = CUDA_SUCCESS;
    bool made;
    if (handle_type_known) {
        made = create_pages(s, first, n, &why);
    } else {
        /* The first growth settles the type: fabric kept unless the device
         * refuses it for another reason than memory. */
        handle_type = CU_MEM_HANDLE_TYPE_FABRIC;
        made = create_pages(s, first, n, &why);
        if (!made && why != CUDA_ERROR_OUT_OF_MEMORY) {
            handle_type = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
            made = create_pages(s, first, n, &why);
        }
        handle_type_known = true;
    }
    if (!made) {
        CHECK_EQ(why, CUDA_ERROR_OUT_OF_MEMORY);
        return false;
    }
    for (size_t i = first; i < first + n; i++) {
        CHECK_EQ(api.MemMap(page_at(s, i), s->page, 0, s->h[i], 0), CUDA_SUCCESS);
        s->mapped[i] = true;
    }
    set_access(s, s->dev, first, n);
    if (s->peer >= 0)
        set_access(s, s->peer, first, n);
    return true;
}

/* ExpandableSegment::unmap over pages [first, first + n): the stream's work
 * done first ("MemUnmap and MemRelease do not appear to synchronize"). */
static void shrink(segment *s, size_t first, size_t n)
{
    CHECK_EQ(cudaStreamSynchronize(s->stream), cudaSuccess);
    for (size_t i = first; i < first + n; i++) {
        CHECK(s->mapped[i]);
        CHECK_EQ(api.MemUnmap(page_at(s, i), s->page), CUDA_SUCCESS);
        CHECK_EQ(api.MemRelease(s->h[i]), CUDA_SUCCESS);
        s->mapped[i] = false;
        note(-(long long)s->page);
    }
}

/* fn over each run of mapped pages, as forEachAllocatedRange. */
static void each_run(segment *s, void (*fn)(segment *, size_t, size_t))
{
    for (size_t i = 0; i < s->npages;) {
        if (!s->mapped[i]) {
            i++;
            continue;
        }
        size_t end = i;
        while (end < s->npages && s->mapped[end])
            end++;
        fn(s, i, end - i);
        i = end;
    }
}

static void peer_access(segment *s, size_t first, size_t n) { set_access(s, s->peer, first, n); }

/* addPeer: access for the peer over every run mapped so far, and for the
 * pages mapped later. */
static void add_peer(segment *s, int peer)
{
    s->peer = peer;
    each_run(s, peer_access);
}

/* The segment's destructor: every run unmapped, the range given back. */
static void close_segment(segment *s)
{
    each_run(s, shrink);
    CHECK_EQ(api.MemAddressFree(s->base, s->page * s->npages), CUDA_SUCCESS);
    free(s->h);
    free(s->mapped);
}

static void fill_page(const segment *s, size_t i, unsigned char v)
{
    memset((void *)(uintptr_t)page_at(s, i), v, s->page);
}

static bool page_holds(const segment *s, size_t i, unsigned char v)
{
    return holds((const void *)(uintptr_t)page_at(s, i), s->page, v);
}

/* The functions handed out are the shim's doors, the ones the preloaded
 * library defines under the driver's names. */
static void check_doors(void)
{
    CHECK(dlsym(RTLD_DEFAULT, "bfcshim_stats_json") != NULL);
    CHECK((void *)api.MemCreate == dlsym(RTLD_DEFAULT, "cuMemCreate"));
    CHECK((void *)api.MemRelease == dlsym(RTLD_DEFAULT, "cuMemRelease"));
}

static void replay(lookup_kind how)
{
    load(how);
    check_doors();
    cudaStream_t stream = NULL;
    CHECK_EQ(cudaStreamCreate(&stream), cudaSuccess);
    CHECK_EQ(counted(), 0);

    segment small = open_segment(0, SMALL_PAGE, stream);
    segment large = open_segment(0, LARGE_PAGE, stream);
    CHECK(grow(&small, 0, 1)); /* the first small block */
    CHECK_EQ(counted(), live);
    /* The fake device is on no fabric: its refusal is not counted, and the
     * segments ask for file descriptors, as on a GPU outside a fabric. */
    CHECK_EQ(handle_type, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CHECK(grow(&large, 0, 3)); /* a 50 MiB tensor: three pages */
    CHECK_EQ(counted(), live);
    CHECK(grow(&large, 3, 2)); /* the next one extends the segment */
    CHECK_EQ(counted(), live);
    for (size_t i = 0; i < 5; i++)
        fill_page(&large, i, (unsigned char)(0x50 + i));
    fill_page(&small, 0, 0x5f);

    /* empty_cache: the tensors on pages 1 and 2 freed, their pages go. */
    shrink(&large, 1, 2);
    CHECK_EQ(counted(), live);
    CHECK(e2e_touch_dies(page_at(&large, 1)));

    /* A new tensor fits the hole. */
    CHECK(grow(&large, 1, 1));
    CHECK_EQ(counted(), live);

    /* Peer access enabled: granted over runs [0, 2) and [3, 5), each a
     * cuMemSetAccess over two mappings; the next growth grants it too. */
    add_peer(&large, 1);
    CHECK(grow(&large, 5, 1));
    CHECK_EQ(counted(), live);

    CHECK(page_holds(&large, 0, 0x50) && page_holds(&large, 3, 0x53) &&
          page_holds(&large, 4, 0x54) && page_holds(&small, 0, 0x5f));
    CHECK_EQ(shim_vmm_door_creates(), creates);

    close_segment(&large);
    CHECK_EQ(counted(), live);
    close_segment(&small);
    CHECK_EQ(live, 0);
    CHECK_EQ(counted(), 0);
    CHECK_EQ(shim_vmm_door_peak(), peak);
    CHECK_EQ(shim_vmm_door_creates(), creates);
    CHECK_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

static void grow_shrink(void) { replay(BY_VERSION); }

static void entry_point(void) { replay(DEPRECATED); }

/* The large segment grows past the device (FAKECUDA_MEM): the growth that
 * fails leaves nothing behind, in the driver or in the count. */
static void oom(void)
{
    load(BY_VERSION);
    cudaStream_t stream = NULL;
    CHECK_EQ(cudaStreamCreate(&stream), cudaSuccess);
    segment large = open_segment(0, LARGE_PAGE, stream);
    CHECK(grow(&large, 0, 4));
    const long long before = live;
    CHECK_EQ(counted(), before);
    /* More pages than the device has memory left: some are made, then one
     * fails. */
    size_t free_bytes = 0, total = 0;
    CHECK_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
    size_t want = total / LARGE_PAGE;
    CHECK(4 + want <= large.npages);
    CHECK(!grow(&large, 4, want));
    CHECK_EQ(live, before);
    CHECK_EQ(counted(), before);
    CHECK(creates > 4); /* the failed growth did make pages, then gave them back */
    CHECK_EQ(shim_vmm_door_creates(), creates);
    /* and the memory is the driver's again: a smaller growth fits */
    CHECK(grow(&large, 4, 2));
    CHECK_EQ(counted(), live);
    close_segment(&large);
    CHECK_EQ(counted(), 0);
}

/* BFCSHIM_DRIVER_HOOKS=0: the entry points are the driver's own, and the
 * door counts nothing. */
static void hooks_off(void)
{
    load(BY_VERSION);
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(driver != NULL);
    if (driver)
        CHECK((void *)api.MemCreate == dlsym(driver, "cuMemCreate"));
    cudaStream_t stream = NULL;
    CHECK_EQ(cudaStreamCreate(&stream), cudaSuccess);
    segment large = open_segment(0, LARGE_PAGE, stream);
    CHECK(grow(&large, 0, 2));
    CHECK_EQ(counted(), 0);
    close_segment(&large);
    CHECK_EQ(shim_stat_number("passthrough_vmm_creates"), 0);
}

/* The fake runtime's cudaGetDriverEntryPoint[ByVersion], with no shim: the
 * driver's functions as cuGetProcAddress picks them (cuda_runtime_api.h). */
static void runtime_rules(void)
{
    void *driver = e2e_open_libcuda();
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult st = 99;
    /* the newest ABI the version allows: cuMemAlloc at 3020 is _v2 */
    CHECK_EQ(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000, cudaEnableDefault, &st),
             cudaSuccess);
    CHECK_EQ(st, cudaDriverEntryPointSuccess);
    CHECK(fn == dlsym(driver, "cuMemAlloc_v2"));
    /* the status is optional */
    CHECK_EQ(cudaGetDriverEntryPointByVersion("cuMemCreate", &fn, 12000, cudaEnableDefault, NULL),
             cudaSuccess);
    CHECK(fn == dlsym(driver, "cuMemCreate"));
    CHECK_EQ(deprecated_entry_point("cuMemCreate", &fn, cudaEnableDefault, &st), cudaSuccess);
    CHECK(fn == dlsym(driver, "cuMemCreate") && st == cudaDriverEntryPointSuccess);
    /* the stream flavour: default and legacy give the plain function,
     * per-thread the _ptsz one; the _ptsz entry point's default is
     * per-thread (what code built with per-thread default streams calls) */
    CHECK_EQ(cudaGetDriverEntryPointByVersion("cuMemAllocAsync", &fn, 12000, cudaEnableDefault,
                                              &st), cudaSuccess);
    CHECK(fn == dlsym(driver, "cuMemAllocAsync"));
    CHECK_EQ(cudaGetDriverEntryPointByVersion("cuMemAllocAsync", &fn, 12000,
                                              cudaEnableLegacyStream, &st), cudaSuccess);
    CHECK(fn == dlsym(driver, "cuMemAllocAsync"));
    CHECK_EQ(cudaGetDriverEntryPointByVersion("cuMemAllocAsync", &fn, 12000,
                                              cudaEnablePerThreadDefaultStream, &st),
             cudaSuccess);
    CHECK(fn == dlsym(driver, "cuMemAllocAsync_ptsz"));
    cudaError_t (*by_version_ptsz)(const char *, void **, unsigned, unsigned long long,
                                   enum cudaDriverEntryPointQueryResult *) =
        (cudaError_t (*)(const char *, void **, unsigned, unsigned long long,
                         enum cudaDriverEntryPointQueryResult *))
            dlsym(RTLD_DEFAULT, "cudaGetDriverEntryPointByVersion_ptsz");
    CHECK(by_version_ptsz != NULL);
    if (by_version_ptsz) {
        CHECK_EQ(by_version_ptsz("cuMemAllocAsync", &fn, 12000, cudaEnableDefault, &st),
                 cudaSuccess);
        CHECK(fn == dlsym(driver, "cuMemAllocAsync_ptsz"));
    }
    /* not found: success, NULL, and the status says why */
    fn = (void *)1;
    CHECK_EQ(cudaGetDriverEntryPointByVersion("cuNoSuchThing", &fn, 12000, cudaEnableDefault, &st),
             cudaSuccess);
    CHECK(fn == NULL && st == cudaDriverEntryPointSymbolNotFound);
    fn = (void *)1;
    CHECK_EQ(cudaGetDriverEntryPointByVersion("cuMemCreate", &fn, 10000, cudaEnableDefault, &st),
             cudaSuccess); /* cuMemCreate came in CUDA 10.2 */
    CHECK(fn == NULL && st == cudaDriverEntryPointVersionNotSufficent);
    /* invalid: no symbol, no result, unknown flags, a version above the
     * driver's; the last error says so */
    int driver_version = 0;
    CUresult (*get_version)(int *) = (CUresult (*)(int *))dlsym(driver, "cuDriverGetVersion");
    CHECK_EQ(get_version(&driver_version), CUDA_SUCCESS);
    CHECK_EQ(cudaGetDriverEntryPointByVersion(NULL, &fn, 12000, cudaEnableDefault, &st),
             cudaErrorInvalidValue);
    CHECK_EQ(cudaGetDriverEntryPointByVersion("cuMemCreate", NULL, 12000, cudaEnableDefault, &st),
             cudaErrorInvalidValue);
    CHECK_EQ(cudaGetDriverEntryPointByVersion("cuMemCreate", &fn, 12000, 4, &st),
             cudaErrorInvalidValue);
    CHECK_EQ(cudaGetDriverEntryPointByVersion("cuMemCreate", &fn, (unsigned)driver_version + 10,
                                              cudaEnableDefault, &st),
             cudaErrorInvalidValue);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_EQ(cudaGetLastError(), cudaSuccess);
}

int main(int argc, char **argv)
{
    static const e2e_scenario scenarios[] = {
        {"grow-shrink", grow_shrink},
        {"oom", oom},
        {"entry-point", entry_point},
        {"hooks-off", hooks_off},
        {"runtime-rules", runtime_rules}};
    return e2e_main("e2e_expandable", scenarios, sizeof scenarios / sizeof scenarios[0], argc,
                    argv);
}
