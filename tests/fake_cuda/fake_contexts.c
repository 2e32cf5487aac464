/*
 * fake_contexts.c - cuInit, devices and contexts: CUDA_VISIBLE_DEVICES,
 * attributes, UUIDs and PCI ids; primary contexts (retain, release, reset)
 * and created ones (every version of cuCtxCreate), their destruction,
 * attach and detach, the current-context stack, peer access and
 * cuCtxSynchronize. What a context's end takes with it is kill_ctx's.
 */
#include "fake_internal.h"

/* Device p's UUID: distinct in its first bytes, so that a prefix of its
 * string form names one device, as CUDA_VISIBLE_DEVICES allows. */
static void device_uuid(int p, CUuuid *uuid)
{
    memset(uuid, 0, sizeof *uuid);
    uuid->bytes[0] = (char)(0xfa + p); /* "GPU-fa...", "GPU-fb...", ... */
    memcpy(uuid->bytes + 1, "kecudadevice", 12);
}

/* The machine's device that CUDA_VISIBLE_DEVICES entry `s` (up to `len`
 * bytes) names, or -1 for none. An index is read as strtoul reads it (the
 * driver accepts "1gpu" as 1); a UUID is "GPU-" and a prefix of its
 * string form that matches one device only. */
static int visible_entry(const char *s, size_t len)
{
    while (len && (*s == ' ' || *s == '\t'))
        s++, len--;
    if (len >= 4 && strncmp(s, "GPU-", 4) == 0) {
        int found = -1;
        for (int p = 0; p < G.nphys; p++) {
            CUuuid u;
            device_uuid(p, &u);
            char str[48];
            const unsigned char *b = (const unsigned char *)u.bytes;
            snprintf(str, sizeof str,
                     "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                     b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                     b[12], b[13], b[14], b[15]);
            if (len <= strlen(str) && strncmp(s, str, len) == 0) {
                if (found >= 0)
                    return -1; /* ambiguous */
                found = p;
            }
        }
        return found;
    }
    if (!len || *s < '0' || *s > '9')
        return -1;
    long v = 0;
    for (size_t i = 0; i < len && s[i] >= '0' && s[i] <= '9' && v <= MAX_DEVICES; i++)
        v = v * 10 + (s[i] - '0');
    return v < G.nphys ? (int)v : -1;
}

/* Lock held, at cuInit: makes the devices CUDA_VISIBLE_DEVICES leaves
 * visible the ordinals, in its order, and returns how many there are. "Only the devices whose index is present in the sequence are
 * visible to CUDA applications and they are enumerated in the order of the
 * sequence. If one of the indices is invalid, only the devices whose index
 * precedes the invalid index are visible" (CUDA C++ Programming Guide, CUDA
 * environment variables); UUIDs "work when you specify the first few
 * characters" (MPS guide). An entry naming a device already listed counts
 * as invalid here (the guide does not say; the fake's reading). Unset:
 * every device. Memory sizes and other processes' use (FAKECUDA_MEM,
 * FAKECUDA_OTHER_USED), names, UUIDs and PCI bus ids belong to the
 * machine's device and follow it to its new ordinal. */
static int apply_visible_devices(void)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v)
        return G.nphys;
    int phys[MAX_DEVICES], n = 0;
    bool listed[MAX_DEVICES] = {false};
    for (const char *e = v; n < G.nphys;) {
        const char *comma = strchr(e, ',');
        size_t len = comma ? (size_t)(comma - e) : strlen(e);
        int p = visible_entry(e, len);
        if (p < 0 || listed[p])
            break;
        listed[p] = true;
        phys[n++] = p;
        if (!comma)
            break;
        e = comma + 1;
    }
    if (n == 0)
        return 0; /* nothing changes: cuInit fails */
    uint64_t mem[MAX_DEVICES], other[MAX_DEVICES];
    memcpy(mem, G.mem, sizeof mem);
    memcpy(other, G.other_used, sizeof other);
    for (int d = 0; d < n; d++) {
        G.phys[d] = phys[d];
        G.mem[d] = mem[phys[d]];
        G.other_used[d] = other[phys[d]];
    }
    G.ndev = n;
    for (int d = 0; d < MAX_DEVICES; d++)
        G.pools[d].dev = d < n ? d : -1;
    return n;
}

/* "CUDA_ERROR_NO_DEVICE: no CUDA-capable devices were detected" (cuda.h):
 * with none visible, cuInit fails and the driver stays uninitialised. The
 * environment is read once, at the first cuInit that succeeds, as the
 * driver reads it when it initialises (a process that sets
 * CUDA_VISIBLE_DEVICES after importing a framework, before its first CUDA
 * call, still gets its choice; Numba's test_runtime checks exactly that). */
EXPORT CUresult cuInit(unsigned int flags)
{
    CALLED();
    ENTER();
    if (flags)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!atomic_load(&G.initialised) && apply_visible_devices() == 0)
        LEAVE(CUDA_ERROR_NO_DEVICE);
    atomic_store(&G.initialised, true);
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDriverGetVersion(int *v)
{
    CALLED();
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = CUDA_VERSION;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    CALLED();
    ENTER_API();
    if (!count)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    *count = G.ndev;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    CALLED();
    ENTER_API();
    if (!dev || !is_device(ordinal))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    *dev = ordinal;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CALLED();
    NEED_INIT();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!is_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "Fake CUDA device %d", G.phys[dev]);
    return CUDA_SUCCESS;
}

/* A stable UUID per device (Numba names devices by it). */
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    CALLED();
    ENTER_API();
    if (!uuid)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    device_uuid(G.phys[dev], uuid);
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CALLED();
    ENTER_API();
    if (!bytes)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    *bytes = G.mem[dev];
    LEAVE(CUDA_SUCCESS);
}

/*
 * What cuDeviceGetAttribute answers: a device of compute capability 9.0 as
 * an H100 SXM5 reports it, so that clients which read the device (Numba's
 * occupancy and launch checks, a framework's feature tests) take the paths
 * they take on the GPUs this project targets, not the paths of a device that
 * answers 0 to everything. Two kinds of value:
 *   - the architecture's limits, from the CUDA C++ Programming Guide's table
 *     of compute capability 9.0 (threads, block and grid dimensions, shared
 *     memory and registers per block and per multiprocessor);
 *   - the product's, from the H100 SXM5 (132 multiprocessors, a 50 MiB L2,
 *     a 5120-bit memory bus, 1980 MHz boost and 2619 MHz memory clocks: XLA
 *     derives bandwidths from the clocks and warns when they are 0);
 *     cuDeviceGetName still says "Fake CUDA device".
 * Page-locked host memory from cuMemHostAlloc is modelled, so the device
 * can map host memory (CAN_MAP_HOST_MEMORY) and reach it at its host
 * address (CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, which makes
 * cuMemHostGetDevicePointer answer the host pointer itself: "if all devices
 * visible to the application have a non-zero value ... will match the
 * original pointer"), and 64-bit stream memory operations
 * (CAN_USE_64_BIT_STREAM_MEM_OPS, cuStreamWriteValue64) are there: XLA's
 * `vmm` allocator asks for all three, and an H100 reports them.
 * What the fake does not model answers 0 as "not supported", in cuda.h's
 * words for each attribute, so that a client takes the path it takes on a
 * device without the feature instead of calling an entry point the fake
 * lacks: managed memory (MANAGED_MEMORY, "can allocate managed memory": no
 * cuMemAllocManaged), stream priorities (STREAM_PRIORITIES_SUPPORTED:
 * cuCtxGetStreamPriorityRange answers [0, 0], as cuda.h says it does for
 * such a device, and cuStreamCreateWithPriority's priority is clamped to
 * it), fabric handles
 * and mempool IPC (a virtual memory allocation's file descriptor is
 * modelled: HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED reads 1, as on an
 * H100), and GPUDirect RDMA. Each device has
 * its own PCI bus id (one per device on real machines, and tools order
 * devices by it; cuDeviceGetPCIBusId writes the same one). tests/gpu/gpu_suite.cu `attributes` prints the real
 * device's answers for every attribute in this table.
 */
static const struct {
    CUdevice_attribute attrib;
    int value;
} h100_attributes[] = {
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 48 << 10},
    {CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 64 << 10},
    {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},
    {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
    {CU_DEVICE_ATTRIBUTE_INTEGRATED, 0},
    {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, CU_COMPUTEMODE_DEFAULT},
    {CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 32},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1},
    {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120},
    {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000},        /* kHz */
    {CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2619000}, /* kHz */
    {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 50 << 20},
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
    {CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 228 << 10},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536},
    {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 227 << 10},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32},
    {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0},
    {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT, 0},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 1},
};

EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    CALLED();
    NEED_INIT();
    /* No attribute is 0 or CU_DEVICE_ATTRIBUTE_MAX or beyond: an invalid
     * argument, CUDA_ERROR_INVALID_VALUE in cuda.h's list for the call. */
    if (!pi || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    if (!is_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *pi = 0;
    if (attrib == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) {
        const char *on = getenv("FAKECUDA_VMM");
        *pi = !on || strcmp(on, "0") != 0;
    } else if (attrib == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) {
        *pi = 0x10 * (G.phys[dev] + 1);
    } else {
        for (size_t i = 0; i < sizeof h100_attributes / sizeof h100_attributes[0]; i++)
            if (h100_attributes[i].attrib == attrib)
                *pi = h100_attributes[i].value;
    }
    return CUDA_SUCCESS;
}

/* "[domain]:[bus]:[device].[function] where domain, bus, device, and
 * function are all hexadecimal values", "13 characters including the
 * NULL-terminator" (cuda.h): domain 0, the bus that CU_DEVICE_ATTRIBUTE_
 * PCI_BUS_ID answers, device and function 0 (PCI_DEVICE_ID and
 * PCI_DOMAIN_ID answer 0), as "0000:10:00.0". `len` is "the maximum length
 * of the string that may be returned": a shorter buffer gets the string cut
 * there, still terminated. The fake NVML (tests/fake_cuda/nvml) knows
 * devices by the same ids. */
EXPORT CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev)
{
    CALLED();
    NEED_INIT();
    if (!bus_id || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!is_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(bus_id, (size_t)len, "%04x:%02x:%02x.%x", 0u, 0x10u * (unsigned)(G.phys[dev] + 1), 0u,
             0u);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CALLED();
    ENTER_API();
    if (!pctx)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    G.primary[dev].refcount++;
    if (!G.primary[dev].alive) /* a new context under the same handle */
        G.primary[dev].id = ++G.next_ctx_id;
    G.primary[dev].alive = true;
    *pctx = (CUcontext)&G.primary[dev];
    LEAVE(CUDA_SUCCESS);
}

/* Lock held (released and taken again while the queued work runs): a
 * context goes away with its streams (their queued work finished first, see
 * "lifetime" above), its events and its memory. Using those streams and
 * events after "will result in undefined behavior" (cuCtxDestroy, cuda.h):
 * the fake answers CUDA_ERROR_INVALID_HANDLE and counts it
 * (stale_handle_uses). */
static void destroy_ctx_memory(fctx *c);
static void peers_forget(const fctx *c);
void kill_ctx(fctx *c)
{
    /* The device finishes what the context queued before it goes (see
     * "lifetime" above); the callbacks run outside the lock, as always. */
    complete_everything_and_unlock(c);
    pthread_mutex_lock(&G.lock);
    for (fstream *s = G.streams; s; s = s->next)
        if (s->ctx == c) {
            s->dead = true;
            stop_capturing(s);
            s->nqueue = 0;
            s->completed = s->settled = s->submitted;
        }
    c->legacy.nqueue = 0;
    c->legacy.completed = c->legacy.settled = c->legacy.submitted;
    for (fevent *e = G.events; e; e = e->next)
        if (e->ctx == c && !e->dead)
            event_dies(e);
    destroy_ctx_memory(c);
    peers_forget(c);
    c->alive = false;
    /* A host thread waiting behind the work just dropped (a kernel that
     * never ends) returns now; woken only by the callbacks above, it could
     * look before the drop and wait for good. cuda.h does not say what a
     * wait already under way answers when its context is destroyed ("It is
     * the responsibility of the calling function to ensure that no API call
     * issues using ctx while cuCtxDestroy() is executing"). The real
     * destroy waits for the context's queued work ("lifetime" above), so
     * there such a wait ends with that work; what it does with work that
     * never ends is not measured (a GPU check is owed): the fake drops it
     * and ends the wait. */
    pthread_cond_broadcast(&G.stuck_cond);
}

/* Lock held: drops the allocations of a context, as CUDA does when it goes
 * (its page-locked host memory too: "memory allocations by ...
 * cuMemAllocHost()", cuCtxDestroy).
 * Stream-ordered and VMM allocations stay: cuCtxDestroy "will not destroy
 * memory allocations by cuMemCreate(), cuMemAllocAsync() and
 * cuMemAllocFromPoolAsync()" (they are "not associated with any CUDA
 * context", cuda.h), and "cudaDeviceReset() will not destroy memory
 * allocations by cudaMallocAsync()" (cuda_runtime_api.h). cuda.h's
 * "destroys and cleans up all resources associated with the current device"
 * (cuDevicePrimaryCtxReset) could be read to take cuMemCreate's too, but on
 * an H100 (driver 580) the shim unmapped its granules after cudaDeviceReset
 * without an error (gpu_vmm_reset-running at 91caa75). */
static void destroy_ctx_memory(fctx *c)
{
    for (size_t i = 0; i < G.nhost_allocs;) {
        if (G.host_allocs[i].ctx == c)
            host_free(&G.host_allocs[i]);
        else
            i++;
    }
    for (size_t i = 0; i < G.nallocs;) {
        if (G.allocs[i].ctx == c && !G.allocs[i].stream_ordered) {
            munmap((void *)(uintptr_t)G.allocs[i].base, G.allocs[i].size ? G.allocs[i].size : 1);
            G.st.bytes_in_use[G.allocs[i].dev] -= G.allocs[i].size;
            G.allocs[i] = G.allocs[--G.nallocs];
        } else {
            i++;
        }
    }
}

static CUresult primary_release(CUdevice dev)
{
    ENTER_API();
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    if (G.primary[dev].refcount == 0)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    /* After a reset the context is already gone (primary_reset): the last
     * release has nothing left to destroy. */
    if (--G.primary[dev].refcount == 0 && G.primary[dev].alive)
        kill_ctx(&G.primary[dev]);
    LEAVE(CUDA_SUCCESS);
}

/* A reset destroys the primary context's work, streams, events and memory
 * at once, whoever still holds it, and leaves it inactive; its retain count
 * stays: "Resetting the primary context does not release it, an
 * application that has retained the primary context should explicitly
 * release its usage", and "it is safe for other modules to call
 * cuDevicePrimaryCtxRelease() even after resetting the device" (cuda.h).
 * So the holders' releases still succeed, and a retain after the reset
 * makes the context active again (a new context under the same handle,
 * cuDevicePrimaryCtxRetain) without the earlier holders' counts lost: the
 * last of all the releases destroys it. */
static CUresult primary_reset(CUdevice dev)
{
    ENTER_API();
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    kill_ctx(&G.primary[dev]);
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CALLED();
    return primary_release(dev);
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CALLED();
    return primary_reset(dev);
}

/* The v1 entry points (CUDA 7.0's), under the _v2's rules (cuda.h
 * documents no other). */
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    CALLED();
    return primary_release(dev);
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    CALLED();
    return primary_reset(dev);
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CALLED();
    ENTER_API();
    if (!flags || !active)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    *flags = 0;
    *active = G.primary[dev].alive;
    LEAVE(CUDA_SUCCESS);
}

/* Makes *c a new live context on dev (of green context g, or NULL), with
 * its legacy stream. */
void live_ctx(fctx *c, int dev, fgreen *g)
{
    *c = (fctx){.magic = CTX_MAGIC, .dev = dev, .alive = true, .refcount = 1, .green = g,
                .id = ++G.next_ctx_id};
    c->legacy = (fstream){.magic = STREAM_MAGIC, .ctx = c, .legacy = true};
}

/* Execution affinity, as cuCtxCreate_v3 and _v4 take it: an array of
 * `n` parameters, which "Must be 0 if execAffinityParams is NULL"
 * (CUctxCreateParams); an unknown type is an invalid value. The one type,
 * CU_EXEC_AFFINITY_TYPE_SM_COUNT, "is only supported under Volta+ MPS",
 * which the fake is not: CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY ("the
 * CUexecAffinityType passed to the API call is not supported by the active
 * device"). None at all is a regular context. */
static CUresult affinity_check(const CUexecAffinityParam *params, int n)
{
    if (n < 0 || (n > 0 && !params))
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < n; i++)
        if (params[i].type != CU_EXEC_AFFINITY_TYPE_SM_COUNT)
            return CUDA_ERROR_INVALID_VALUE;
    return n > 0 ? CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY : CUDA_SUCCESS;
}

/* Every cuCtxCreate version makes a context the same way: on dev, current
 * to the calling thread (pushed, so cuCtxPopCurrent restores the one it
 * supplanted), with a usage count of 1. Scheduling flags are not
 * modelled. */
static CUresult create_ctx(CUcontext *pctx, CUdevice dev)
{
    ENTER_API();
    if (!pctx)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!is_device(dev))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    /* A destroyed context's slot (and so its handle value) is reused, as
     * the real driver may. */
    fctx *c = NULL;
    for (size_t i = 0; i < G.ncreated && !c; i++)
        if (!G.created[i]->alive)
            c = G.created[i];
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c)
            LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        if (G.ncreated < 64)
            G.created[G.ncreated++] = c;
    }
    live_ctx(c, dev, NULL);
    if (tls_ctx_depth < 16)
        tls_ctx_stack[tls_ctx_depth++] = c;
    *pctx = (CUcontext)c;
    LEAVE(CUDA_SUCCESS);
}

/* cuCtxCreate in CUDA 13 headers is cuCtxCreate_v4, with creation
 * parameters (PFN_cuCtxCreate_v12050): execution affinity as for _v3;
 * CUDA in Graphics mode (cigParams) "will fail with
 * CUDA_ERROR_NOT_SUPPORTED if CIG is not supported by the device", as on
 * the fake's devices. */
EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                               CUdevice dev)
{
    CALLED();
    (void)flags;
    NEED_INIT();
    if (params && params->cigParams)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = params ? affinity_check(params->execAffinityParams,
                                         params->numExecAffinityParams)
                        : CUDA_SUCCESS;
    return r != CUDA_SUCCESS ? r : create_ctx(pctx, dev);
}

/* The older versions libcuda still exports for binaries built against
 * older headers, handed out by cuGetProcAddress below _v4's version
 * (cudaTypedefs.h): CUDA 11.4's _v3 with execution affinity
 * (PFN_cuCtxCreate_v11040), CUDA 3.2's _v2 (PFN_cuCtxCreate_v3020) and CUDA
 * 2.0's cuCtxCreate (PFN_cuCtxCreate_v2000), both (pctx, flags, dev):
 * declared only under __CUDA_API_VERSION_INTERNAL in cuda.h. */
EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                               unsigned int flags, CUdevice dev)
{
    CALLED();
    (void)flags;
    NEED_INIT();
    CUresult r = affinity_check(params, n);
    return r != CUDA_SUCCESS ? r : create_ctx(pctx, dev);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CALLED();
    (void)flags;
    return create_ctx(pctx, dev);
}

EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CALLED();
    (void)flags;
    return create_ctx(pctx, dev);
}

/* The interop creators (cudaGL.h, cudaVDPAU.h): "Creates a new CUDA
 * context, initializes OpenGL [VDPAU] interoperability, and associates the
 * CUDA context with the calling thread", so the context is made and pushed
 * as cuCtxCreate's; the fake has no OpenGL or VDPAU to interoperate with.
 * cuGLCtxCreate v1 is CUDA 2.0's (PFN_cuGLCtxCreate_v2000), _v2 CUDA 3.2's
 * (_v3020); cuVDPAUCtxCreate v1 CUDA 3.1's (_v3010), _v2 (_v3020). VDPAU's
 * needs its VdpGetProcAddress (INVALID_VALUE without it). */
EXPORT CUresult cuGLCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CALLED();
    (void)flags;
    return create_ctx(pctx, dev);
}

EXPORT CUresult cuGLCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CALLED();
    (void)flags;
    return create_ctx(pctx, dev);
}

static CUresult vdpau_create(CUcontext *pctx, CUdevice dev, void *vdp_get_proc_address)
{
    return vdp_get_proc_address ? create_ctx(pctx, dev) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuVDPAUCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev,
                                 uint32_t vdp_device, void *vdp_get_proc_address)
{
    CALLED();
    (void)flags, (void)vdp_device;
    return vdpau_create(pctx, dev, vdp_get_proc_address);
}

EXPORT CUresult cuVDPAUCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev,
                                    uint32_t vdp_device, void *vdp_get_proc_address)
{
    CALLED();
    (void)flags, (void)vdp_device;
    return vdpau_create(pctx, dev, vdp_get_proc_address);
}

static CUresult ctx_destroy(CUcontext ctx)
{
    ENTER_API();
    fctx *c = (fctx *)ctx;
    /* A green context's converted context is "a normal primary context"
     * (cuCtxFromGreenCtx), refused here as the primary ones are; it goes with
     * cuGreenCtxDestroy. */
    if (!c || c->magic != CTX_MAGIC || c->primary || c->green || !c->alive)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    kill_ctx(c);
    /* "If ctx is current to the calling thread then ctx will also be popped
     * from the current thread's context stack" (cuda.h): only from its top;
     * deeper in the stack (or on another thread's) the dead handle stays,
     * and calls made with it current fail. */
    if (tls_ctx_depth && tls_ctx_stack[tls_ctx_depth - 1] == c)
        tls_ctx_depth--;
    LEAVE(CUDA_SUCCESS); /* the struct stays: handles may still be compared */
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CALLED();
    return ctx_destroy(ctx);
}

/* The v1 entry point, under the _v2's rules (cuda.h documents no other). */
EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    CALLED();
    return ctx_destroy(ctx);
}

/* The deprecated usage-count pair (CUDA 2.0's, still exported by libcuda;
 * PyCUDA's Context.attach/detach call them). cuCtxAttach "increments the
 * usage count of the context" current to the calling thread; cuCtxDetach
 * "decrements the usage count of the context ctx, and destroys the context
 * if the usage count goes to 0. The context must be ... current to the
 * calling thread" (cuda.h). A destroying detach pops it, as cuCtxDestroy of
 * the current context does (PyCUDA: "pop is implicit in detach"). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
EXPORT CUresult cuCtxAttach(CUcontext *pctx, unsigned int flags);
EXPORT CUresult cuCtxAttach(CUcontext *pctx, unsigned int flags)
{
    CALLED();
    NEED_INIT();
    fctx *c = current_ctx();
    if (!pctx || flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (!c || !c->alive)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!c->primary && !c->green)
        c->refcount++;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDetach(CUcontext ctx);
EXPORT CUresult cuCtxDetach(CUcontext ctx)
{
    CALLED();
    NEED_INIT();
    fctx *c = (fctx *)ctx;
    if (!c || c != current_ctx() || c->primary || c->green || !c->alive)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (--c->refcount > 0)
        return CUDA_SUCCESS;
    return ctx_destroy(ctx);
}
#pragma GCC diagnostic pop

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CALLED();
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)current_ctx();
    return CUDA_SUCCESS;
}

/* "If there exists a CUDA context stack on the calling CPU thread, this will
 * replace the top of that stack with ctx. If ctx is NULL then this will be
 * equivalent to popping the top of the calling CPU thread's CUDA context
 * stack" (cuda.h). */
CUresult set_current(CUcontext ctx)
{
    fctx *c = (fctx *)ctx;
    if (c && c->magic != CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!c) {
        if (tls_ctx_depth)
            tls_ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (tls_ctx_depth == 0)
        tls_ctx_depth = 1;
    tls_ctx_stack[tls_ctx_depth - 1] = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CALLED();
    NEED_INIT();
    return set_current(ctx);
}

static CUresult push_current(CUcontext ctx)
{
    fctx *c = (fctx *)ctx;
    /* cuda.h lists CUDA_ERROR_INVALID_CONTEXT for a context that is not a
     * valid one; the fake's reading: a destroyed context is not (a reset
     * primary context still is: it is revived where it is used). Pushed
     * contexts come off by "cuCtxDestroy() or cuCtxPopCurrent()", cuda.h.
     * (Whether it lives is asked under the lock: another thread may retain
     * or destroy it meanwhile.) */
    if (!c || c->magic != CTX_MAGIC || tls_ctx_depth == 16)
        return CUDA_ERROR_INVALID_CONTEXT;
    ENTER();
    if (!c->alive && !c->primary)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    tls_ctx_stack[tls_ctx_depth++] = c;
    LEAVE(CUDA_SUCCESS);
}

static CUresult pop_current(CUcontext *pctx)
{
    if (!tls_ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    fctx *c = tls_ctx_stack[--tls_ctx_depth];
    if (pctx)
        *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    CALLED();
    NEED_INIT();
    return push_current(ctx);
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CALLED();
    NEED_INIT();
    return pop_current(pctx);
}

/* The v1 entry points (CUDA 2.0's, still exported by libcuda for old
 * binaries), under the _v2's rules (cuda.h documents no other). */
EXPORT CUresult cuCtxPushCurrent(CUcontext ctx)
{
    CALLED();
    NEED_INIT();
    return push_current(ctx);
}

EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx)
{
    CALLED();
    NEED_INIT();
    return pop_current(pctx);
}

/* "This function will return '0' in both *leastPriority and
 * *greatestPriority if the current context's device does not support stream
 * priorities" (cuda.h), as the fake's devices do not
 * (CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED 0). Either pointer may be
 * NULL. */
EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    CALLED();
    NEED_INIT();
    fctx *c = current_ctx();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (least)
        *least = 0;
    if (greatest)
        *greatest = 0;
    return CUDA_SUCCESS;
}

/* "The Id is unique for the life of the program": a primary context made
 * again under its old handle gets a new one. */
EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id)
{
    CALLED();
    ENTER_API();
    fctx *c = ctx ? (fctx *)ctx : current_ctx();
    if (!id)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!c || c->magic != CTX_MAGIC)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    if (!c->alive)
        LEAVE(CUDA_ERROR_CONTEXT_IS_DESTROYED);
    *id = c->id;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxGetDevice(CUdevice *dev)
{
    CALLED();
    NEED_INIT();
    fctx *c = current_ctx();
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    *dev = c->dev;
    return CUDA_SUCCESS;
}

/* Peer access, from cuda.h: cuDeviceCanAccessPeer reports whether "contexts
 * on dev are capable of directly accessing memory from contexts on
 * peerDev" (here any two distinct devices; a device is not its own peer).
 * cuCtxEnablePeerAccess returns CUDA_ERROR_INVALID_CONTEXT "if there is no
 * current context, peerContext is not a valid context, or if the current
 * context is peerContext", CUDA_ERROR_INVALID_VALUE "if Flags is not 0",
 * CUDA_ERROR_PEER_ACCESS_UNSUPPORTED if cuDeviceCanAccessPeer says no (two
 * contexts of one device), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED "if
 * direct access of peerContext from the current context has already been
 * enabled", and CUDA_ERROR_TOO_MANY_PEERS when resources run out (here 64
 * pairs). cuCtxDisablePeerAccess returns CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
 * "if direct peer access has not yet been enabled". Memory is one host
 * address space here, so access itself is not enforced between devices
 * (cuMemSetAccess's peer entries are counted, see below). */
EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    CALLED();
    ENTER_API();
    if (!can)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (!is_device(dev) || !is_device(peer))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    *can = dev != peer;
    LEAVE(CUDA_SUCCESS);
}

/* Lock held: the index of the pair (from, to), or npeers. */
static size_t peer_find(const fctx *from, const fctx *to)
{
    size_t i = 0;
    while (i < G.npeers && (G.peers[i].from != from || G.peers[i].to != to))
        i++;
    return i;
}

/* Lock held: context c goes, and every pair naming it. */
static void peers_forget(const fctx *c)
{
    for (size_t i = 0; i < G.npeers;)
        if (G.peers[i].from == c || G.peers[i].to == c)
            G.peers[i] = G.peers[--G.npeers];
        else
            i++;
}

static CUresult peer_switch(CUcontext peer, unsigned flags, bool on)
{
    ENTER_API();
    fctx *c = current_ctx(), *p = (fctx *)peer;
    if (!c || !p || p->magic != CTX_MAGIC || !p->alive || (on && p == c))
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    if (on && flags)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    size_t i = peer_find(c, p);
    if (!on) {
        if (i == G.npeers)
            LEAVE(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
        G.peers[i] = G.peers[--G.npeers];
        LEAVE(CUDA_SUCCESS);
    }
    if (p->dev == c->dev)
        LEAVE(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    if (i < G.npeers)
        LEAVE(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    if (G.npeers == sizeof G.peers / sizeof G.peers[0])
        LEAVE(CUDA_ERROR_TOO_MANY_PEERS);
    G.peers[G.npeers++] = (struct peer_pair){c, p};
    G.st.peer_enables++;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags)
{
    CALLED();
    return peer_switch(peer, flags, true);
}

EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peer)
{
    CALLED();
    return peer_switch(peer, 0, false);
}

EXPORT CUresult cuCtxSynchronize(void)
{
    CALLED();
    ENTER_API();
    fctx *c = current_ctx();
    if (!c)
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    G.st.ctx_synchronize_calls++;
    pools_release_at_sync();
    const completion waited_for = {c, -1, true}; /* its green contexts too */
    /* Synchronising a context while one of the streams it waits for
     * captures is refused and invalidates those captures, whatever the
     * modes. cuda.h does not say so for cuCtxSynchronize; it does for the
     * other context-wide call, cuCtxRecordEvent ("will return
     * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED if the specified context hCtx
     * has a stream in the capture mode ... will invalidate all the
     * conflicting captures"), and the fake takes that harsher reading. */
    CUresult r = unsafe_call();
    for (fstream *o = G.streams; o; o = o->next)
        if (completing_ctx(o->ctx, &waited_for) && live_capture(o)) {
            invalidate_counted(o);
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    complete_where_and_unlock(&waited_for);
    release_after_sync();
    return CUDA_SUCCESS;
}
