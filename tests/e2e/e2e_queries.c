/*
 * e2e_queries.c - what programs learn about pooled memory from the driver
 * and the runtime must be true. Scenarios:
 *
 *   first-malloc   cudaMalloc is the program's first CUDA call: the block is
 *                  pooled, and an IPC handle of it is refused (cudart must
 *                  have the shim's driver entry points, not the real ones);
 *                  first-malloc-hooks-off: the same through the runtime door
 *                  alone, before the driver is even initialised; and
 *                  once freed, an IPC handle of it is invalid value
 *   meminfo-once   with other processes on the device and a growing pool,
 *                  cudaMemGetInfo and cuMemGetInfo_v2 report the same free
 *                  memory: what the device can still add plus the pool's
 *                  unused bytes, counted once
 *   ptr-attr       cuPointerGetAttribute(s) describe the block, not the pool's
 *                  region, with a buffer id no other allocation ever had, the
 *                  pool's context and no legacy IPC (ptr-attr-vmm: the pool
 *                  over virtual memory, where the driver sees granules)
 *   ptr-attrs-freed  (and -vmm) cuPointerGetAttributes of a freed pooled
 *                  block: success and every attribute's NULL value, as for
 *                  any address that is no CUDA pointer
 *   device-full    out of memory because the device itself is full (other
 *                  processes hold it): the report says so and suggests no
 *                  larger BFCSHIM_MEM_FRACTION
 *
 * Run with the variables meson sets per scenario (tests/meson.build).
 */
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "e2e_rt.h"

#define MiB (UINT64_C(1) << 20)

static void *driver(const char *name)
{
    static void *h;
    if (!h)
        h = dlopen("libcuda.so.1", RTLD_NOW);
    void *f = h ? dlsym(h, name) : NULL;
    if (!f) {
        fprintf(stderr, "no %s in the driver\n", name);
        exit(1);
    }
    return f;
}

static void first_malloc(void)
{
    void *p = NULL;
    CHECK_EQ(cudaMalloc(&p, MiB), cudaSuccess); /* the first call of all */
    /* One region taken: the pool's (3/4 of the 1 GiB device). */
    CHECK_EQ(regions_taken(fake_stats()), 1);
    CHECK_EQ(fake_stats().bytes_in_use[0], 768 * MiB);
    cudaIpcMemHandle_t h;
    CHECK_EQ(cudaIpcGetMemHandle(&h, p), cudaErrorNotSupported);
    /* With the driver door closed the runtime door refuses without setting
     * the runtime's last error (docs/limitations.md). */
    CHECK_EQ(cudaGetLastError(), e2e_driver_door_closed() ? cudaSuccess : cudaErrorNotSupported);
    CHECK_ONE_LOG_LINE("refused");
    CHECK_EQ(fake_stats().ipc_handles, 0);
    CHECK_EQ(cudaFree(p), cudaSuccess);
    /* Freed, it is no allocation at all: invalid value, as CUDA answers for
     * any pointer it did not give out, with the last error, and a line
     * saying what the pointer is (found by an audit: refused as a pooled
     * block, cudaErrorNotSupported and a line calling it one). */
    fakecuda()->complete_all();
    CHECK_EQ(cudaIpcGetMemHandle(&h, p), cudaErrorInvalidValue);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_ONE_LOG_LINE("not the start of a live allocation");
    CHECK_EQ(fake_stats().ipc_handles, 0);
}

/* FAKECUDA_OTHER_USED=256MiB on the 1 GiB device, BFCSHIM_PREALLOCATE=false,
 * BFCSHIM_MEM_FRACTION=1: the pool may grow to the whole device, but only
 * 768 MiB exist for this process. */
static void meminfo_once(void)
{
    typedef CUresult (*info_fn)(size_t *, size_t *);
    info_fn info = (info_fn)driver("cuMemGetInfo_v2");
    void *a = NULL, *b = NULL;
    CHECK_EQ(cudaMalloc(&a, 64 * MiB), cudaSuccess);
    CHECK_EQ(cudaMalloc(&b, 64 * MiB), cudaSuccess);
    CHECK_EQ(cudaFree(b), cudaSuccess); /* now the pool holds unused bytes */
    size_t rf = 0, rt = 0, df = 0, dt = 0;
    CHECK_EQ(cudaMemGetInfo(&rf, &rt), cudaSuccess);
    CHECK_EQ(info(&df, &dt), CUDA_SUCCESS);
    /* Expected: the device's free memory plus what the pool holds unused. */
    uint64_t pool = fake_stats().bytes_in_use[0];
    uint64_t device_free = 1024 * MiB - 256 * MiB - pool;
    uint64_t expected = device_free + (pool - 64 * MiB);
    CHECK_EQ(rt, 1024 * MiB);
    CHECK_EQ(df, expected);
    CHECK_EQ(rf, expected);
    CHECK_EQ(cudaFree(a), cudaSuccess);
}

static void ptr_attr(void)
{
    typedef CUresult (*attr_fn)(void *, CUpointer_attribute, CUdeviceptr);
    typedef CUresult (*attrs_fn)(unsigned, CUpointer_attribute *, void **, CUdeviceptr);
    attr_fn attr = (attr_fn)driver("cuPointerGetAttribute");
    attrs_fn attrs = (attrs_fn)driver("cuPointerGetAttributes");
    char *a = NULL, *b = NULL;
    CHECK_EQ(cudaMalloc((void **)&a, 3 * MiB), cudaSuccess);
    CHECK_EQ(cudaMalloc((void **)&b, 5 * MiB + 100), cudaSuccess);
    CUdeviceptr inside = (CUdeviceptr)(uintptr_t)(b + 4096), start = 0;
    size_t size = 0;
    unsigned long long id_a = 0, id_b = 0, id_c = 0;
    int ordinal = -1;
    CHECK_EQ(attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, inside), CUDA_SUCCESS);
    CHECK_EQ(attr(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, inside), CUDA_SUCCESS);
    CHECK_EQ(start, (CUdeviceptr)(uintptr_t)b);
    CHECK_EQ(size, 5 * MiB + 100);
    CHECK_EQ(attr(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, inside), CUDA_SUCCESS);
    CHECK_EQ(ordinal, 0);
    /* The block's context is the pool's, as for cudaMalloc memory (over
     * virtual memory the driver names none), and no legacy IPC: the shim
     * refuses cuIpcGetMemHandle of a pooled block. */
    CUcontext ctx = NULL, cur = NULL;
    typedef CUresult (*cur_fn)(CUcontext *);
    CHECK_EQ(((cur_fn)driver("cuCtxGetCurrent"))(&cur), CUDA_SUCCESS);
    CHECK_EQ(attr(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, inside), CUDA_SUCCESS);
    CHECK(ctx == cur && cur != NULL);
    int ipc_capable = -1;
    CHECK_EQ(attr(&ipc_capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, inside),
             CUDA_SUCCESS);
    CHECK_EQ(ipc_capable, 0);
    unsigned type = 0; /* the rest comes from the driver's answer for the region */
    CHECK_EQ(attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, inside), CUDA_SUCCESS);
    CHECK_EQ(type, CU_MEMORYTYPE_DEVICE);
    CHECK_EQ(attr(&id_a, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)(uintptr_t)a),
             CUDA_SUCCESS);
    CHECK_EQ(attr(&id_b, CU_POINTER_ATTRIBUTE_BUFFER_ID, inside), CUDA_SUCCESS);
    CHECK(id_a != id_b);

    /* The several-attribute form agrees, the pool's answers and the
     * driver's mixed (a NULL entry is skipped). */
    CUpointer_attribute which[7] = {
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE,       CU_POINTER_ATTRIBUTE_BUFFER_ID,
        CU_POINTER_ATTRIBUTE_CONTEXT,          CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        CU_POINTER_ATTRIBUTE_MAPPED};
    CUdeviceptr s2 = 0;
    size_t z2 = 0;
    unsigned long long i2 = 0;
    unsigned t2 = 0;
    CUcontext c2 = NULL;
    int ipc2 = -1;
    void *out[7] = {&s2, &t2, &z2, &i2, &c2, &ipc2, NULL};
    CHECK_EQ(attrs(7, which, out, inside), CUDA_SUCCESS);
    CHECK_EQ(s2, start);
    CHECK_EQ(t2, CU_MEMORYTYPE_DEVICE);
    CHECK_EQ(z2, size);
    CHECK_EQ(i2, id_b);
    CHECK(c2 == cur);
    CHECK_EQ(ipc2, 0);
    /* Longer lists than the shim compacts at once (32; before, more than 64
     * went to the driver whole, which answered for the region), ending with an
     * attribute the pool answers: every entry answered as above. */
    enum { LONG = 71 };
    CUpointer_attribute many[LONG];
    void *many_out[LONG];
    CUdeviceptr starts[LONG];
    unsigned types[LONG];
    for (int i = 0; i < LONG; i++) {
        bool pooled = i % 2 == 0;
        many[i] = pooled ? CU_POINTER_ATTRIBUTE_RANGE_START_ADDR : CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
        starts[i] = 0;
        types[i] = 0;
        many_out[i] = pooled ? (void *)&starts[i] : (void *)&types[i];
    }
    CHECK_EQ(attrs(LONG, many, many_out, inside), CUDA_SUCCESS);
    for (int i = 0; i < LONG; i++)
        CHECK_EQ(i % 2 == 0 ? starts[i] : types[i], i % 2 == 0 ? start : CU_MEMORYTYPE_DEVICE);

    /* A freed block is no valid pointer any more, and the next allocation at
     * the same place gets a new id ("subsequent allocations do not reuse
     * IDs"). */
    CHECK_EQ(cudaFree(b), cudaSuccess);
    CHECK_EQ(attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, inside),
             CUDA_ERROR_INVALID_VALUE);
    fakecuda()->complete_all();
    char *c = NULL;
    CHECK_EQ(cudaMalloc((void **)&c, 5 * MiB + 100), cudaSuccess);
    CHECK_EQ(attr(&id_c, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)(uintptr_t)c),
             CUDA_SUCCESS);
    CHECK(id_c != id_b && id_c != id_a);
    CHECK_EQ(cudaFree(a), cudaSuccess);
    CHECK_EQ(cudaFree(c), cudaSuccess);
}

/* FAKECUDA_OTHER_USED=1000MiB of the 1 GiB device, BFCSHIM_PREALLOCATE=false. */
static void device_full(void)
{
    void *p = NULL;
    CHECK_EQ(cudaMalloc(&p, 64 * MiB), cudaErrorMemoryAllocation);
    CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
    char log[16384];
    FILE *f = fopen(getenv("BFCSHIM_LOG_FILE"), "r");
    size_t n = f ? fread(log, 1, sizeof log - 1, f) : 0;
    log[n] = 0;
    if (f)
        fclose(f);
    CHECK(strstr(log, "diagnosis: the device has no memory left for the pool: it has 24.0 MiB "
                      "free of 1.00 GiB, and the pool holds 0 B of its 768 MiB limit") != NULL);
    CHECK(strstr(log, "diagnosis: fragmentation") == NULL);
    CHECK(strstr(log, "hint: raise the limit") == NULL);
    /* What fits in the device's remaining 24 MiB still works. */
    CHECK_EQ(cudaMalloc(&p, 8 * MiB), cudaSuccess);
    CHECK_EQ(cudaFree(p), cudaSuccess);
}

/* ptr-attrs-freed (and -vmm): a freed pooled block is no CUDA pointer:
 * cuPointerGetAttributes answers CUDA_SUCCESS with "default NULL values"
 * (cuda.h) for every attribute, not the region's (found by an audit: a
 * freed block read as mapped device memory). */
static void ptr_attrs_freed(void)
{
    typedef CUresult (*attrs_fn)(unsigned, CUpointer_attribute *, void **, CUdeviceptr);
    attrs_fn attrs = (attrs_fn)driver("cuPointerGetAttributes");
    char *a = NULL;
    CHECK_EQ(cudaMalloc((void **)&a, 3 * MiB), cudaSuccess);
    CHECK_EQ(cudaFree(a), cudaSuccess);
    fakecuda()->complete_all();
    CUpointer_attribute which[4] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                    CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                    CU_POINTER_ATTRIBUTE_MAPPED,
                                    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR};
    unsigned type = 99;
    CUdeviceptr dp = 99, start = 99;
    int mapped = 99;
    void *out[4] = {&type, &dp, &mapped, &start};
    CHECK_EQ(attrs(4, which, out, (CUdeviceptr)(uintptr_t)(a + 4096)), CUDA_SUCCESS);
    CHECK_EQ(type, 0);
    CHECK_EQ(dp, 0);
    CHECK_EQ(mapped, 0);
    CHECK_EQ(start, 0);
    /* A live block still answers as its own. */
    char *b = NULL;
    CHECK_EQ(cudaMalloc((void **)&b, MiB), cudaSuccess);
    CHECK_EQ(attrs(4, which, out, (CUdeviceptr)(uintptr_t)b), CUDA_SUCCESS);
    CHECK_EQ(type, CU_MEMORYTYPE_DEVICE);
    CHECK_EQ(start, (CUdeviceptr)(uintptr_t)b);
    CHECK_EQ(cudaFree(b), cudaSuccess);
}

int main(int argc, char **argv)
{
    static const e2e_scenario scenarios[] = {
        {"first-malloc", first_malloc},
        {"meminfo-once", meminfo_once},
        {"ptr-attr", ptr_attr},
        {"ptr-attr-vmm", ptr_attr},
        {"device-full", device_full},
        {"ptr-attrs-freed", ptr_attrs_freed},
        {"ptr-attrs-freed-vmm", ptr_attrs_freed},
    };
    return e2e_main("e2e_queries", scenarios, sizeof scenarios / sizeof scenarios[0], argc, argv);
}
