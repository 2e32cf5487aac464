/*
 * e2e_vmm.c - the fake driver's virtual memory management, held to the
 * rules cuda.h states, before any pool is built on it. Scenarios:
 *
 *   map          reserve, create, map, set access, use; the device's memory
 *                counts what cuMemCreate holds; granularity from the query;
 *                cuMemGetAddressRange answers with the one mapping holding
 *                the address (adjacent ones apart), and NOT_FOUND where
 *                nothing is mapped
 *   rules        misaligned, non-zero offset, overlapping, partial unmap,
 *                partial set-access, free of a mapped reservation, double
 *                release, too large, failure injection: each refused with
 *                the documented code and nothing changed
 *   release      physical memory goes back when released *and* unmapped;
 *                another context then gets it
 *   retain       cuMemRetainAllocationHandle, from any address of a
 *                mapping, gives the handle that mapped it and one more
 *                reference: the memory outlives its unmap until that
 *                reference is released too, and maps again elsewhere with
 *                its contents; an unmapped address is refused
 *   fault        a child touching an unmapped granule, or a mapped one
 *                without access, dies; with access it lives
 *   lifetime     cuCtxDestroy leaves a VMM allocation, and so does a primary
 *                context's reset (as an H100 does): the mapping stays usable
 *                until it is unmapped and released
 *   unsupported  (FAKECUDA_VMM=0) no support reported, calls refused
 */
#include <cuda.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "e2e_cu.h"

#define MiB ((size_t)1 << 20)


static size_t gran; /* the granularity */

static CUmemAllocationProp prop_on(int dev)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}

static CUmemAccessDesc rw_on(int dev)
{
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = dev;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return a;
}

static void start(void)
{
    e2e_cu_load();
    e2e_cu_primary_current(0);
    CUmemAllocationProp p = prop_on(0);
    gran = 0;
    D.MemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}

/* A mapped, accessible range of n granules on device 0 at base + at. */
static CUmemGenericAllocationHandle map_rw(CUdeviceptr base, size_t at, size_t n)
{
    CUmemAllocationProp p = prop_on(0);
    CUmemAccessDesc a = rw_on(0);
    CUmemGenericAllocationHandle h = 0;
    CHECK_EQ(D.MemCreate(&h, n * gran, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemMap(base + at, n * gran, 0, h, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemSetAccess(base + at, n * gran, &a, 1), CUDA_SUCCESS);
    return h;
}

static void map(void)
{
    start();
    int vmm = 0;
    CHECK_EQ(D.DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
             CUDA_SUCCESS);
    CHECK_EQ(vmm, 1);
    CHECK_EQ(gran, 2 * MiB);
    /* Under the shim the first create makes the context's pool (which
     * probes the device with a map of its own): made here, so that the
     * counts below are the program's. */
    CUmemAllocationProp p0 = prop_on(0);
    CUmemGenericAllocationHandle first = 0;
    CHECK_EQ(D.MemCreate(&first, gran, &p0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(first), CUDA_SUCCESS);
    const uint64_t maps_before = fake_stats().vmm_map_calls;
    CUdeviceptr base = 0;
    CHECK_EQ(D.MemAddressReserve(&base, 8 * gran, 0, 0, 0), CUDA_SUCCESS);
    CHECK(base % gran == 0);
    uint64_t before = fake_stats().bytes_in_use[0];
    CUmemGenericAllocationHandle a = map_rw(base, 0, 2), b = map_rw(base, 4 * gran, 2);
    CHECK_EQ(fake_stats().bytes_in_use[0], before + 4 * gran); /* physical memory, counted */
    memset((void *)(uintptr_t)base, 0x5a, 2 * gran);
    memset((void *)(uintptr_t)(base + 4 * gran), 0xa5, 2 * gran);
    CHECK(((unsigned char *)(uintptr_t)base)[2 * gran - 1] == 0x5a);
    CHECK(((unsigned char *)(uintptr_t)(base + 4 * gran))[0] == 0xa5);
    /* cuMemGetAddressRange names the one mapping holding the address, not
     * the reservation; an address only reserved is in no allocation. */
    CUdeviceptr rb = 0;
    size_t rs = 0;
    CHECK_EQ(D.MemGetAddressRange(&rb, &rs, base + gran + 100), CUDA_SUCCESS);
    CHECK(rb == base && rs == 2 * gran);
    CHECK_EQ(D.MemGetAddressRange(&rb, &rs, base + 5 * gran), CUDA_SUCCESS);
    CHECK(rb == base + 4 * gran && rs == 2 * gran);
    CHECK_EQ(D.MemGetAddressRange(&rb, &rs, base + 3 * gran), CUDA_ERROR_NOT_FOUND);
    unsigned long long flags = 0;
    CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    CHECK_EQ(D.MemGetAccess(&flags, &loc, base + gran), CUDA_SUCCESS);
    CHECK_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    /* Map, unmap and map again: a fresh mapping starts without access and
     * shows the same physical memory (what a pool regrowing would see). */
    CHECK_EQ(D.MemUnmap(base, 2 * gran), CUDA_SUCCESS);
    CHECK_EQ(D.MemMap(base + 2 * gran, 2 * gran, 0, a, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemGetAccess(&flags, &loc, base + 2 * gran), CUDA_SUCCESS);
    CHECK_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CUmemAccessDesc rw = rw_on(0);
    CHECK_EQ(D.MemSetAccess(base + 2 * gran, 2 * gran, &rw, 1), CUDA_SUCCESS);
    CHECK(((unsigned char *)(uintptr_t)(base + 2 * gran))[gran] == 0x5a);
    /* Two adjacent mappings are one contiguous range for set-access and
     * unmap, and still two allocations for cuMemGetAddressRange. */
    CHECK_EQ(D.MemGetAddressRange(&rb, &rs, base + 4 * gran - 1), CUDA_SUCCESS);
    CHECK(rb == base + 2 * gran && rs == 2 * gran);
    CHECK_EQ(D.MemSetAccess(base + 2 * gran, 4 * gran, &rw, 1), CUDA_SUCCESS);
    CHECK_EQ(D.MemUnmap(base + 2 * gran, 4 * gran), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(a), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(b), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().bytes_in_use[0], before);
    CHECK_EQ(D.MemAddressFree(base, 8 * gran), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().vmm_map_calls - maps_before, 3);
}

static void rules(void)
{
    start();
    CUmemAllocationProp p = prop_on(0), bad = prop_on(7);
    CUmemAccessDesc rw = rw_on(0);
    size_t g = 0;
    CHECK_EQ(D.MemGetAllocationGranularity(&g, &bad, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
             CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr base = 0, other = 0;
    CHECK_EQ(D.MemAddressReserve(&base, 8 * gran, 0, 0, 1), CUDA_ERROR_INVALID_VALUE); /* flags */
    /* alignment not a power of two */
    CHECK_EQ(D.MemAddressReserve(&base, 8 * gran, 3 * gran, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemAddressReserve(&base, 8 * gran, 0, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemAddressReserve(&other, 2 * gran, 0, 0, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    CHECK_EQ(D.MemCreate(&h, gran + 4096, &p, 0), CUDA_ERROR_INVALID_VALUE); /* not granular */
    CHECK_EQ(D.MemCreate(&h, 2 * gran, &bad, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemCreate(&h, (size_t)64 << 30, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(D.MemCreate(&h, 2 * gran, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemMap(base + 4096, gran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);  /* misaligned */
    CHECK_EQ(D.MemMap(base, 2 * gran, gran, h, 0), CUDA_ERROR_INVALID_VALUE);  /* offset != 0 */
    CHECK_EQ(D.MemMap(base, 4 * gran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);     /* past the handle */
    /* past the range */
    CHECK_EQ(D.MemMap(base + 7 * gran, 2 * gran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemMap(base, 2 * gran, 0, h, 1), CUDA_ERROR_INVALID_VALUE);     /* flags */
    CHECK_EQ(D.MemMap(base, 2 * gran, 0, h, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemMap(base + gran, gran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);  /* already mapped */
    CHECK_EQ(D.MemUnmap(base, gran), CUDA_ERROR_INVALID_VALUE);                /* a sub-range */
    CHECK_EQ(D.MemSetAccess(base, 3 * gran, &rw, 1), CUDA_ERROR_INVALID_VALUE); /* not all mapped */
    CUmemAccessDesc peer7 = rw_on(7);
    CHECK_EQ(D.MemSetAccess(base, 2 * gran, &peer7, 1), CUDA_ERROR_INVALID_DEVICE);
    CHECK_EQ(D.MemAddressFree(base, 8 * gran), CUDA_ERROR_INVALID_VALUE);      /* still mapped */
    CHECK_EQ(D.MemAddressFree(base, 4 * gran), CUDA_ERROR_INVALID_VALUE);      /* not its size */
    CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(h), CUDA_ERROR_INVALID_VALUE);                    /* twice */
    CHECK_EQ(D.MemMap(other, 2 * gran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);    /* released handle */
    /* failure injection reaches cuMemCreate */
    fakecuda()->fail_alloc_after(1);
    CHECK_EQ(D.MemCreate(&h2, 2 * gran, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(D.MemCreate(&h2, 2 * gran, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(h2), CUDA_SUCCESS);
    /* The mapping made earlier is intact and usable after all of that. */
    CHECK_EQ(D.MemSetAccess(base, 2 * gran, &rw, 1), CUDA_SUCCESS);
    memset((void *)(uintptr_t)base, 1, 2 * gran);
    CHECK_EQ(D.MemUnmap(base, 2 * gran), CUDA_SUCCESS);
    CHECK_EQ(D.MemAddressFree(base, 8 * gran), CUDA_SUCCESS);
    CHECK_EQ(D.MemAddressFree(other, 2 * gran), CUDA_SUCCESS);
}

static void release(void)
{
    start();
    CUmemAllocationProp p = prop_on(0);
    size_t free0 = 0, total = 0, free1 = 0;
    CHECK_EQ(D.MemGetInfo(&free0, &total), CUDA_SUCCESS);
    size_t most = (free0 / gran) * gran; /* everything the device has */
    CUdeviceptr base = 0;
    CHECK_EQ(D.MemAddressReserve(&base, most, 0, 0, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h = map_rw(base, 0, most / gran), h2 = 0;
    CHECK_EQ(D.MemCreate(&h2, gran, &p, 0), CUDA_ERROR_OUT_OF_MEMORY); /* the device is full */
    /* Released but still mapped: the memory stays (and stays usable). */
    CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS);
    memset((void *)(uintptr_t)base, 3, gran);
    CHECK_EQ(D.MemCreate(&h2, gran, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    /* Unmapped too: it goes back, and another context gets all of it. */
    CHECK_EQ(D.MemUnmap(base, most), CUDA_SUCCESS);
    CHECK_EQ(D.MemGetInfo(&free1, &total), CUDA_SUCCESS);
    CHECK_EQ(free1, free0);
    CUcontext other;
    CHECK_EQ(D.CtxCreate(&other, NULL, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemCreate(&h2, most, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(h2), CUDA_SUCCESS);
    CHECK_EQ(D.MemAddressFree(base, most), CUDA_SUCCESS);
}

static void retain(void)
{
    start();
    CUmemAllocationProp p = prop_on(0);
    CUmemAccessDesc rw = rw_on(0);
    size_t free0 = 0, free1 = 0, total = 0;
    CUdeviceptr base = 0;
    CHECK_EQ(D.MemAddressReserve(&base, 8 * gran, 0, 0, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h = 0, kept = 0, again = 0, h2 = 0;
    CHECK_EQ(D.MemCreate(&h, gran, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemMap(base, gran, 0, h, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS); /* the mapping alone holds it now */
    CHECK_EQ(D.MemSetAccess(base, gran, &rw, 1), CUDA_SUCCESS);
    memset((void *)(uintptr_t)base, 0x7e, gran);
    /* Not mapped: refused. */
    CHECK_EQ(D.MemRetainAllocationHandle(&kept, (void *)(uintptr_t)(base + gran)),
             CUDA_ERROR_INVALID_VALUE);
    /* Any address of the mapping names the same handle. */
    CHECK_EQ(D.MemRetainAllocationHandle(&kept, (void *)(uintptr_t)(base + gran - 1)),
             CUDA_SUCCESS);
    CHECK_EQ(kept, h);
    CHECK_EQ(D.MemRetainAllocationHandle(&again, (void *)(uintptr_t)base), CUDA_SUCCESS);
    CHECK_EQ(again, h);
    CHECK_EQ(D.MemRelease(again), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().vmm_retain_calls, 2);
    /* Unmapped, the retained reference keeps the memory. */
    CHECK_EQ(D.MemGetInfo(&free0, &total), CUDA_SUCCESS);
    CHECK_EQ(D.MemUnmap(base, gran), CUDA_SUCCESS);
    CHECK_EQ(D.MemGetInfo(&free1, &total), CUDA_SUCCESS);
    CHECK_EQ(free1, free0);
    /* It maps elsewhere, contents and all, and needs access again. */
    CHECK_EQ(D.MemMap(base + 5 * gran, gran, 0, kept, 0), CUDA_SUCCESS);
    CHECK(e2e_touch_dies(base + 5 * gran));
    CHECK_EQ(D.MemSetAccess(base + 5 * gran, gran, &rw, 1), CUDA_SUCCESS);
    CHECK(((unsigned char *)(uintptr_t)(base + 5 * gran))[gran / 2] == 0x7e);
    /* One release per reference: the last one leaves the mapping holding
     * it, and a further release is refused. */
    CHECK_EQ(D.MemRelease(kept), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(kept), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemMap(base, gran, 0, kept, 0), CUDA_ERROR_INVALID_VALUE); /* no reference left */
    CHECK_EQ(D.MemGetInfo(&free1, &total), CUDA_SUCCESS);
    CHECK_EQ(free1, free0);
    /* Unmapped with no reference: it goes back to the device. */
    CHECK_EQ(D.MemUnmap(base + 5 * gran, gran), CUDA_SUCCESS);
    CHECK_EQ(D.MemGetInfo(&free1, &total), CUDA_SUCCESS);
    CHECK_EQ(free1, free0 + gran);
    CHECK_EQ(D.MemRetainAllocationHandle(&h2, (void *)(uintptr_t)(base + 5 * gran)),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemAddressFree(base, 8 * gran), CUDA_SUCCESS);
}

/* Runs fn in a child; returns whether it died (signal or failing exit:
 * under ASan a fault is reported and the child exits instead). */
static void fault(void)
{
    start();
    CUmemAllocationProp p = prop_on(0);
    CUdeviceptr base = 0;
    CHECK_EQ(D.MemAddressReserve(&base, 4 * gran, 0, 0, 0), CUDA_SUCCESS);
    CHECK(e2e_touch_dies(base)); /* reserved, nothing mapped */
    CUmemGenericAllocationHandle h = 0;
    CHECK_EQ(D.MemCreate(&h, gran, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemMap(base, gran, 0, h, 0), CUDA_SUCCESS);
    CHECK(e2e_touch_dies(base + 100)); /* mapped, no access yet */
    CUmemAccessDesc rw = rw_on(0);
    CHECK_EQ(D.MemSetAccess(base, gran, &rw, 1), CUDA_SUCCESS);
    CHECK(!e2e_touch_dies(base + 100)); /* accessible */
    CHECK(e2e_touch_dies(base + gran)); /* the next granule is not mapped */
    CHECK_EQ(D.MemUnmap(base, gran), CUDA_SUCCESS);
    CHECK(e2e_touch_dies(base + 100)); /* unmapped again */
    CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS);
    CHECK_EQ(D.MemAddressFree(base, 4 * gran), CUDA_SUCCESS);
}

static void lifetime(void)
{
    start();
    uint64_t before = fake_stats().bytes_in_use[0];
    CUdeviceptr base = 0;
    CHECK_EQ(D.MemAddressReserve(&base, 4 * gran, 0, 0, 0), CUDA_SUCCESS);
    /* Made while a created context is current, which then goes: the
     * allocation is no context's, and stays. */
    CUcontext created;
    CHECK_EQ(D.CtxCreate(&created, NULL, 0, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h = map_rw(base, 0, 2);
    CHECK_EQ(D.CtxDestroy(created), CUDA_SUCCESS);
    memset((void *)(uintptr_t)base, 9, 2 * gran);
    CHECK_EQ(fake_stats().bytes_in_use[0], before + 2 * gran);
    /* The primary context's reset leaves it too. */
    CHECK_EQ(D.DevicePrimaryCtxReset(0), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().bytes_in_use[0], before + 2 * gran);
    CHECK(!e2e_touch_dies(base));
    CHECK_EQ(D.MemUnmap(base, 2 * gran), CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().bytes_in_use[0], before); /* released and unmapped: back */
    CHECK_EQ(D.MemAddressFree(base, 4 * gran), CUDA_SUCCESS);
}

static void unsupported(void)
{
    start();
    int vmm = 1;
    CHECK_EQ(D.DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
             CUDA_SUCCESS);
    CHECK_EQ(vmm, 0);
    CUdeviceptr base = 0;
    CHECK_EQ(D.MemAddressReserve(&base, 4 * MiB, 0, 0, 0), CUDA_ERROR_NOT_SUPPORTED);
}

int main(int argc, char **argv)
{
    const char *s = argc > 1 ? argv[1] : "";
    static const struct {
        const char *name;
        void (*fn)(void);
    } scenarios[] = {{"map", map},     {"rules", rules},         {"release", release},
                     {"retain", retain}, {"fault", fault}, {"lifetime", lifetime},
                     {"unsupported", unsupported}};
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
        if (strcmp(s, scenarios[i].name) == 0) {
            scenarios[i].fn();
            return e2e_done(s);
        }
    fprintf(stderr, "usage: e2e_vmm map|rules|release|fault|lifetime|unsupported\n");
    return 2;
}
