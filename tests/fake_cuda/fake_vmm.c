/*
 * fake_vmm.c - the virtual memory management API on host memory (below).
 */
#include "fake_internal.h"

/*
 * cuMemAddressReserve / cuMemCreate / cuMemMap / cuMemSetAccess / cuMemUnmap /
 * cuMemRetainAllocationHandle / cuMemRelease / cuMemAddressFree on host
 * memory. A reservation is an anonymous PROT_NONE mapping; a physical
 * allocation is a memory file (memfd) counted against the device's memory
 * from cuMemCreate until every reference to its handle is released and it
 * is unmapped everywhere; cuMemMap maps the file over the
 * reservation with MAP_FIXED, still PROT_NONE ("calling cuMemMap does not
 * make the address accessible"), and cuMemSetAccess gives the owning
 * device's protection: touching a granule that is unmapped, or mapped
 * without access, faults as a GPU would. Rules enforced from cuda.h: sizes,
 * addresses and offsets are multiples of the granularity
 * (FAKECUDA_VMM_GRANULARITY, 2 MiB), the offset must be zero ("currently
 * must be zero"), a mapping goes only onto a reserved, unmapped range,
 * cuMemUnmap and cuMemSetAccess take whole mappings ("cannot unmap a
 * sub-range"; "a fully mapped address range"), flags must be zero.
 * Shareable handles of the file-descriptor type are the memory file
 * itself, so another process that imports one maps the same bytes (below,
 * cuMemExportToShareableHandle). Not modelled: fabric handles (the device
 * reports none), multicast, host-NUMA locations, peers'
 * access beyond bookkeeping (one address space: the owner's protection
 * applies; what each peer device was granted is kept per mapping and
 * answered by cuMemGetAccess, so tests can see access granted and taken
 * back), and
 * cuMemUnmap's synchronisation (the fake unmaps at once, the harsher
 * reading: memory still used by queued work is gone). FAKECUDA_VMM=0
 * makes the devices report no support and the calls CUDA_ERROR_NOT_SUPPORTED.
 * Lifetime: cuCtxDestroy "will not destroy memory allocations by
 * cuMemCreate()" (cuda.h), and neither does a primary context's reset or
 * last release (read off an H100: mappings made before cudaDeviceReset
 * could be unmapped after it). Where cuda.h leaves a misuse undefined (a
 * handle used after its last release, freeing a reservation that is still
 * mapped) the fake answers CUDA_ERROR_INVALID_VALUE: the real driver may do
 * worse, and the tests must not depend on either.
 */

static struct {
    bool configured, supported;
    uint64_t granularity;
    vmm_range *reserved, *mapped;
    size_t nreserved, capreserved, nmapped, capmapped;
    vmm_handle **handles; /* live physical allocations: a handle is valid iff listed */
    size_t nhandles, caphandles;
    const char *refuse; /* FAKECUDA_VMM_REFUSE: the call that fails */
} V;

/* Lock held. */
static void vmm_configure(void)
{
    if (V.configured)
        return;
    V.configured = true;
    const char *on = getenv("FAKECUDA_VMM");
    V.supported = !on || strcmp(on, "0") != 0;
    const char *g = getenv("FAKECUDA_VMM_GRANULARITY");
    V.granularity = g ? parse_bytes(g) : UINT64_C(2) << 20;
    if (V.granularity < 4096 || (V.granularity & (V.granularity - 1)))
        V.granularity = UINT64_C(2) << 20;
    V.refuse = getenv("FAKECUDA_VMM_REFUSE");
}

/* FAKECUDA_VMM_REFUSE=<cuMem... name>: that call fails although the device
 * reports virtual memory management, as cuMemSetAccess does on some WSL2
 * drivers (pytorch/pytorch#192330, where it returned CUDA_ERROR_UNKNOWN).
 * The fake returns CUDA_ERROR_NOT_SUPPORTED, which cuda.h lists among the
 * returns of all four calls (cuMemAddressReserve, cuMemCreate, cuMemMap,
 * cuMemSetAccess). =cuMemSetAccess:multi refuses only a range over more than
 * one mapping (CUDA_ERROR_INVALID_VALUE), as a driver reading "a fully mapped
 * address range" as one mapping would: cuda.h allows several ("containing all
 * allocations"), and PyTorch relies on it, but a pool that sets access so
 * must find out before it is made if a driver does not. */
#define VMM_REFUSED(name) (V.refuse && strcmp(V.refuse, name) == 0)

#define VMM_ENTER()                                 \
    ENTER();                                        \
    vmm_configure();                                \
    if (!V.supported)                               \
        LEAVE(CUDA_ERROR_NOT_SUPPORTED)

static bool vmm_aligned(uint64_t v) { return v % V.granularity == 0; }

static bool vmm_push(vmm_range **a, size_t *n, size_t *cap, vmm_range r)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        vmm_range *t = realloc(*a, c * sizeof *t);
        if (!t)
            return false;
        *a = t;
        *cap = c;
    }
    (*a)[(*n)++] = r;
    return true;
}

/* The device a pinned-device allocation property names, or -1. */
static int vmm_prop_device(const CUmemAllocationProp *prop)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !is_device(prop->location.id))
        return -1;
    return prop->location.id;
}

/* The live allocation a handle names, or NULL (it is never dereferenced
 * unless listed: a released handle's memory is gone). */
static vmm_handle *vmm_handle_of(CUmemGenericAllocationHandle handle)
{
    for (size_t i = 0; i < V.nhandles; i++)
        if ((CUmemGenericAllocationHandle)(uintptr_t)V.handles[i] == handle)
            return V.handles[i];
    return NULL;
}

/* The physical memory goes back to the device. */
static void vmm_destroy(vmm_handle *h)
{
    for (size_t i = 0; i < V.nhandles; i++)
        if (V.handles[i] == h) {
            V.handles[i] = V.handles[--V.nhandles];
            break;
        }
    close(h->fd);
    if (!h->imported)
        G.st.bytes_in_use[h->dev] -= h->size;
    free(h);
}

/* Once every reference is released and every mapping unmapped. */
static void vmm_maybe_free(vmm_handle *h)
{
    if (!h->refs && !h->mappings)
        vmm_destroy(h);
}

/* Mapping m goes: its range becomes a bare reservation again. */
static void vmm_unmap_at(size_t m)
{
    vmm_range *r = &V.mapped[m];
    mmap((void *)(uintptr_t)r->base, r->size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    r->h->mappings--;
    *r = V.mapped[--V.nmapped];
}

/* The reservation holding [base, base + size), or NULL. */
static vmm_range *vmm_reservation(uint64_t base, uint64_t size)
{
    for (size_t i = 0; i < V.nreserved; i++)
        if (base >= V.reserved[i].base && base + size <= V.reserved[i].base + V.reserved[i].size &&
            base + size > base)
            return &V.reserved[i];
    return NULL;
}

/* Lock held: the mapping holding ptr (cuMemMap), or NULL. */
vmm_range *vmm_mapping_at(CUdeviceptr ptr)
{
    for (size_t i = 0; i < V.nmapped; i++)
        if (ptr - V.mapped[i].base < V.mapped[i].size)
            return &V.mapped[i];
    return NULL;
}

/* Lock held: the range of the mapping holding ptr; false if none does. */
bool vmm_mapping_range(CUdeviceptr ptr, CUdeviceptr *base, size_t *size)
{
    const vmm_range *m = vmm_mapping_at(ptr);
    if (m) {
        *base = m->base;
        *size = m->size;
    }
    return m != NULL;
}

/* Lock held: is [p, p + n) mapped throughout, by mappings of device dev's
 * memory (-1: any device's)? Neighbouring mappings of one reservation make
 * one range of addresses, as a pool's granules do. */
bool vmm_mapped_on(CUdeviceptr p, size_t n, int dev)
{
    for (CUdeviceptr at = p; at - p < n;) {
        const vmm_range *m = vmm_mapping_at(at);
        if (!m || (dev >= 0 && m->h->dev != dev))
            return false;
        at = m->base + m->size;
    }
    return n > 0;
}

/* Lock held: is ptr inside a reservation? */
bool vmm_reserved(CUdeviceptr ptr)
{
    return vmm_reservation(ptr, 1) != NULL;
}

/* Lock held: a pointer attribute of an address inside a reservation, as
 * cuPointerGetAttribute's text in cuda.h reads: MAPPED "indicates if this
 * pointer is in a valid address range that is mapped to a backing
 * allocation"; RANGE_START_ADDR and RANGE_SIZE are "not necessarily the
 * address [size] of the mapped region, but ... of the mappable address range
 * ptr references (e.g. from cuMemAddressReserve)"; DEVICE_ORDINAL is the
 * device "against which the memory was allocated" (the backing allocation's
 * location). Not stated there, and printed by the GPU suite's vmm-ptr-attr
 * to check: no context (NULL, as for stream-ordered allocations), and no
 * device pointer or device for an unmapped address. Attributes the fake
 * does not model are not supported. */
CUresult vmm_pointer_attribute(CUdeviceptr ptr, CUpointer_attribute attr, void *data)
{
    const vmm_range *r = vmm_reservation(ptr, 1), *m = vmm_mapping_at(ptr);
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)data = m ? CU_MEMORYTYPE_DEVICE : 0; break;
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = NULL; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = m != NULL; break;
    /* "suitable for cudaIpcGetMemHandle": memory from cuMemCreate is shared
     * through its own handles, never the legacy ones */
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = r->base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = r->size; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        if (!m)
            return CUDA_ERROR_INVALID_VALUE;
        *(CUdeviceptr *)data = ptr;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        if (!m)
            return CUDA_ERROR_INVALID_VALUE;
        *(int *)data = m->h->dev;
        break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
}

/* Do whole mappings tile [base, base + size) exactly, without gaps? */
static bool vmm_whole_mappings(uint64_t base, uint64_t size)
{
    uint64_t at = base;
    while (at < base + size) {
        size_t i = 0;
        while (i < V.nmapped && V.mapped[i].base != at)
            i++;
        if (i == V.nmapped || V.mapped[i].base + V.mapped[i].size > base + size)
            return false;
        at += V.mapped[i].size;
    }
    return size > 0;
}

/* A physical allocation's memory file, named after the machine's device
 * that holds it, so that a process importing the file (a shareable handle)
 * knows the device, as the real driver knows its own objects. */
#define VMM_FILE_PREFIX "fakecuda-vmm-dev"

static int vmm_memory_file(int phys)
{
    char name[32];
    snprintf(name, sizeof name, VMM_FILE_PREFIX "%d", phys);
    return memfd_create(name, MFD_CLOEXEC);
}

/* Lock held: the visible device whose memory file fd is (one this fake
 * made, in this process or another), or -1. */
static int vmm_file_device(int fd)
{
    char link[64], target[128];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0)
        return -1;
    target[n] = 0;
    const char *prefix = "/memfd:" VMM_FILE_PREFIX;
    if (strncmp(target, prefix, strlen(prefix)) != 0)
        return -1;
    int phys = atoi(target + strlen(prefix));
    for (int d = 0; d < G.ndev; d++)
        if (G.phys[d] == phys)
            return d;
    return -2; /* a device this process does not see */
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option)
{
    CALLED();
    VMM_ENTER();
    if (!granularity || vmm_prop_device(prop) < 0 ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    *granularity = V.granularity;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags)
{
    CALLED();
    VMM_ENTER();
    if (VMM_REFUSED("cuMemAddressReserve"))
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    /* "The size and address parameters must be a multiple of the host page
     * size and the alignment must be a power of two or zero for default
     * alignment" (a non-zero addr is only a hint where to place the range,
     * but it too must be page-aligned); "flags - Currently unused, must be
     * zero". The default alignment, which cuda.h leaves open, is the
     * granularity here. */
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (!ptr || size == 0 || size % page || addr % page || flags ||
        (alignment & (alignment - 1)))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    size_t align = alignment > V.granularity ? alignment : V.granularity;
    uint8_t *p = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
    if (p == MAP_FAILED)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    uint8_t *base = (uint8_t *)(((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1));
    if (base > p)
        munmap(p, (size_t)(base - p));
    munmap(base + size, (size_t)(p + size + align - (base + size)));
    if (!vmm_push(&V.reserved, &V.nreserved, &V.capreserved,
                  (vmm_range){(uint64_t)(uintptr_t)base, size, NULL, PROT_NONE, 0, 0})) {
        munmap(base, size);
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    }
    G.st.vmm_reserve_calls++;
    *ptr = (CUdeviceptr)(uintptr_t)base;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CALLED();
    VMM_ENTER();
    size_t i = 0;
    while (i < V.nreserved && (V.reserved[i].base != ptr || V.reserved[i].size != size))
        i++;
    if (i == V.nreserved)
        LEAVE(CUDA_ERROR_INVALID_VALUE); /* "must match what was given" */
    for (size_t m = 0; m < V.nmapped; m++)
        if (V.mapped[m].base >= ptr && V.mapped[m].base < ptr + size)
            LEAVE(CUDA_ERROR_INVALID_VALUE); /* still mapped: unmap first */
    munmap((void *)(uintptr_t)ptr, size);
    V.reserved[i] = V.reserved[--V.nreserved];
    G.st.vmm_address_free_calls++;
    LEAVE(CUDA_SUCCESS);
}

/* VMM lock held: room in the handle table for one more; false when host
 * memory ran out. */
static bool vmm_handle_room(void)
{
    if (V.nhandles < V.caphandles)
        return true;
    size_t c = V.caphandles ? V.caphandles * 2 : 16;
    vmm_handle **t = realloc(V.handles, c * sizeof *t);
    if (!t)
        return false;
    V.handles = t;
    V.caphandles = c;
    return true;
}

static CUresult mem_create(CUmemGenericAllocationHandle *handle, size_t size,
                           const CUmemAllocationProp *prop, unsigned long long flags)
{
    VMM_ENTER();
    if (VMM_REFUSED("cuMemCreate"))
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    /* "The size of this allocation must be a multiple of the value given
     * via cuMemGetAllocationGranularity"; flags "for future use, must be
     * zero". */
    int dev = vmm_prop_device(prop);
    if (!handle || dev < 0 || size == 0 || !vmm_aligned(size) || flags)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* requestedHandleTypes: a file descriptor is "permitted only on POSIX
     * systems", Win32 handles are not, and a fabric handle needs a device
     * on a fabric with an IMEX channel, which the fake's are not
     * (HANDLE_TYPE_FABRIC_SUPPORTED reads 0): not supported, the answer
     * PyTorch and XLA take as "ask without it" (cuda.h lists it). Bits that
     * name no type are invalid. */
    const unsigned types = (unsigned)prop->requestedHandleTypes;
    const unsigned known = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_WIN32 |
                           CU_MEM_HANDLE_TYPE_WIN32_KMT | CU_MEM_HANDLE_TYPE_FABRIC;
    if (types & ~known)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (types & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    G.st.vmm_create_calls++;
    if (G.fail_alloc_countdown && --G.fail_alloc_countdown == 0)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    if (size > device_free(dev))
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    vmm_handle *h = calloc(1, sizeof *h);
    int fd = h ? vmm_memory_file(G.phys[dev]) : -1;
    const bool room = vmm_handle_room();
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 || !room) {
        if (fd >= 0)
            close(fd);
        free(h);
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    }
    *h = (vmm_handle){dev, fd, size, 0, 1, types, false};
    V.handles[V.nhandles++] = h;
    G.st.bytes_in_use[dev] += size;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    CALLED();
    CUresult r = mem_create(handle, size, prop, flags);
    test_hook_run(&after_mem_create);
    return r;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CALLED();
    VMM_ENTER();
    vmm_handle *h = vmm_handle_of(handle);
    if (!h || !h->refs)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    h->refs--;
    vmm_maybe_free(h); /* else when its last mapping goes */
    LEAVE(CUDA_SUCCESS);
}

/* "Given an address addr, returns the allocation handle of the backing
 * memory allocation ... the same handle value used to map the memory. If the
 * address requested is not mapped, the function will fail. The returned
 * handle must be released with corresponding number of calls to
 * cuMemRelease"; addr "can be any address in a range previously mapped by
 * cuMemMap". It is how a program keeps memory it is about to unmap: the
 * reference outlives the mapping. */
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    CALLED();
    VMM_ENTER();
    vmm_range *m = vmm_mapping_at((CUdeviceptr)(uintptr_t)addr);
    if (!handle || !m)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    m->h->refs++;
    G.st.vmm_retain_calls++;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)m->h;
    LEAVE(CUDA_SUCCESS);
}

/* "Given a CUDA memory handle, create a shareable memory allocation handle
 * that can be used to share the memory with other processes ... The
 * recipient process can convert the shareable handle back into a CUDA
 * memory handle using cuMemImportFromShareableHandle and map it with
 * cuMemMap"; flags "Reserved, must be zero". A file descriptor (an int at
 * shareableHandle) is a new descriptor of the allocation's memory file:
 * the program owns and closes it (PyTorch and NCCL do), and the memory
 * lives on in a process that imported it ("Once all shareable handles are
 * closed and the allocation is released, the allocated memory ... will be
 * released": the kernel keeps the file's pages while any descriptor or
 * mapping holds them). Only a type asked for at creation can be exported
 * (requestedHandleTypes); anything else is an invalid value. The device's
 * memory count goes down at the last release as before, not at the last
 * descriptor's close, which the fake cannot see. */
EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                             CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType handleType,
                                             unsigned long long flags)
{
    CALLED();
    VMM_ENTER();
    vmm_handle *h = vmm_handle_of(handle);
    if (!shareableHandle || !h || !h->refs || flags ||
        handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !(h->types & handleType))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    int fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        LEAVE(CUDA_ERROR_NOT_PERMITTED); /* the process may open no more files */
    *(int *)shareableHandle = fd;
    LEAVE(CUDA_SUCCESS);
}

/* "Imports an allocation from a requested shareable handle type": for a
 * file descriptor, osHandle is the descriptor itself ((void *)(uintptr_t)
 * fd, as PyTorch and NCCL pass it), which the caller keeps and may close
 * at once (the fake holds a descriptor of its own). The handle stands for
 * the exporter's memory: mapped, it shows the same bytes in both
 * processes, and it is not device memory this process allocated. "If the
 * current process cannot support the memory described by this shareable
 * handle, this API will error as CUDA_ERROR_NOT_SUPPORTED": memory of a
 * device this process does not see, and fabric handles (no fabric here).
 * A descriptor that is not an exported allocation is an invalid value. */
EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                               void *osHandle,
                                               CUmemAllocationHandleType shHandleType)
{
    CALLED();
    VMM_ENTER();
    if (shHandleType == CU_MEM_HANDLE_TYPE_FABRIC)
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    if (!handle || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    const int theirs = (int)(intptr_t)osHandle;
    const int dev = vmm_file_device(theirs);
    struct stat st;
    if (dev == -1 || fstat(theirs, &st) != 0 || st.st_size <= 0 ||
        !vmm_aligned((uint64_t)st.st_size))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (dev < 0)
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    vmm_handle *h = calloc(1, sizeof *h);
    int fd = h ? fcntl(theirs, F_DUPFD_CLOEXEC, 0) : -1;
    const bool room = vmm_handle_room();
    if (fd < 0 || !room) {
        if (fd >= 0)
            close(fd);
        free(h);
        LEAVE(CUDA_ERROR_NOT_PERMITTED); /* no descriptor or no room for one more */
    }
    *h = (vmm_handle){dev, fd, (uint64_t)st.st_size, 0, 1,
                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, true};
    V.handles[V.nhandles++] = h;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    CALLED();
    VMM_ENTER();
    if (VMM_REFUSED("cuMemMap"))
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    /* "ptr, size, and offset must be a multiple of the value given via
     * cuMemGetAllocationGranularity"; offset "currently must be zero"; the
     * range "must be an address reservation previously reserved with
     * cuMemAddressReserve"; offset + size within the allocation. */
    vmm_handle *h = vmm_handle_of(handle);
    if (!h || !h->refs || size == 0 || offset != 0 || flags || !vmm_aligned(ptr) ||
        !vmm_aligned(size) || size > h->size || !vmm_reservation(ptr, size))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    for (size_t m = 0; m < V.nmapped; m++)
        if (ptr < V.mapped[m].base + V.mapped[m].size && V.mapped[m].base < ptr + size)
            LEAVE(CUDA_ERROR_INVALID_VALUE); /* "only ... reservations that are not mapped" */
    void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, 0);
    if (p == MAP_FAILED)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    if (!vmm_push(&V.mapped, &V.nmapped, &V.capmapped, (vmm_range){ptr, size, h, PROT_NONE, 0, 0})) {
        mmap(p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    }
    h->mappings++;
    G.st.vmm_map_calls++;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CALLED();
    VMM_ENTER();
    if (!vmm_whole_mappings(ptr, size))
        LEAVE(CUDA_ERROR_INVALID_VALUE); /* "cannot unmap a sub-range" */
    for (size_t m = 0; m < V.nmapped;) {
        vmm_range *r = &V.mapped[m];
        if (r->base >= ptr && r->base < ptr + size) {
            vmm_handle *h = r->h;
            vmm_unmap_at(m); /* a bare reservation again: inaccessible */
            vmm_maybe_free(h);
        } else {
            m++;
        }
    }
    G.st.vmm_unmap_calls++;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count)
{
    CALLED();
    VMM_ENTER();
    if (VMM_REFUSED("cuMemSetAccess"))
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    if (!desc || count == 0 || !vmm_whole_mappings(ptr, size))
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (VMM_REFUSED("cuMemSetAccess:multi")) {
        size_t covered = 0;
        for (size_t m = 0; m < V.nmapped; m++)
            covered += V.mapped[m].base >= ptr && V.mapped[m].base < ptr + size;
        if (covered > 1)
            LEAVE(CUDA_ERROR_INVALID_VALUE);
    }
    for (size_t k = 0; k < count; k++)
        if (desc[k].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !is_device(desc[k].location.id))
            LEAVE(CUDA_ERROR_INVALID_DEVICE);
    /* Flags other than CUmemAccess_flags' three ("Default, make the address
     * range not accessible", "Make the address range read accessible",
     * "Make the address range read-write accessible") are an invalid value,
     * refused before any is applied, as cuMemPoolSetAccess refuses them:
     * not read as "no access". */
    for (size_t k = 0; k < count; k++)
        if (!access_flags_known(desc[k].flags))
            LEAVE(CUDA_ERROR_INVALID_VALUE);
    for (size_t m = 0; m < V.nmapped; m++) {
        vmm_range *r = &V.mapped[m];
        if (r->base < ptr || r->base >= ptr + size)
            continue;
        for (size_t k = 0; k < count; k++) {
            if (desc[k].location.id != r->h->dev) {
                /* A peer's access: one address space here, so only kept
                 * for cuMemGetAccess and counted. cuMemSetAccess "set[s]
                 * the access flags for each location specified in desc",
                 * so a later entry replaces an earlier grant, and
                 * CU_MEM_ACCESS_FLAGS_PROT_NONE "make[s] the address range
                 * not accessible": it takes the access back (cuda.h). */
                const uint64_t bit = UINT64_C(1) << desc[k].location.id;
                const unsigned long long f = desc[k].flags;
                r->peer_read = f & CU_MEM_ACCESS_FLAGS_PROT_READ ? r->peer_read | bit
                                                                 : r->peer_read & ~bit;
                r->peer_write = f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? r->peer_write | bit
                                                                        : r->peer_write & ~bit;
                if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE)
                    G.st.vmm_peer_grants++;
                continue;
            }
            r->prot = desc[k].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                      : desc[k].flags == CU_MEM_ACCESS_FLAGS_PROT_READ ? PROT_READ
                                                                       : PROT_NONE;
            mprotect((void *)(uintptr_t)r->base, r->size, r->prot);
        }
    }
    G.st.vmm_access_calls++;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
                               CUdeviceptr ptr)
{
    CALLED();
    VMM_ENTER();
    if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* cuda.h lists CUDA_ERROR_INVALID_DEVICE for cuMemGetAccess: a location
     * that names no device. */
    if (!is_device(location->id))
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    const vmm_range *r = vmm_mapping_at(ptr);
    if (!r)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* "the access flags set for the given location": the owner's from its
     * protection, a peer's from what was granted to it. */
    bool rd, wr;
    if (location->id != r->h->dev) {
        const uint64_t bit = UINT64_C(1) << location->id;
        rd = (r->peer_read & bit) != 0;
        wr = (r->peer_write & bit) != 0;
    } else {
        rd = (r->prot & PROT_READ) != 0;
        wr = (r->prot & PROT_WRITE) != 0;
    }
    *flags = wr ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
             : rd ? CU_MEM_ACCESS_FLAGS_PROT_READ
                  : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    LEAVE(CUDA_SUCCESS);
}
