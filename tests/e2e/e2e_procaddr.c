/*
 * e2e_procaddr.c - a program linked against libcuda.so.1 that takes its
 * allocation entry points from cuGetProcAddress (as cuda-python, Numba's
 * newer bindings and cudart itself do), by base name and ABI version, with
 * and without the per-thread default stream flag; and calls cuMemAlloc_v2
 * directly as a linked program would. The v1 entry points of the calls the
 * shim keeps books by (cuStreamDestroy, cuCtxDestroy,
 * cuDevicePrimaryCtxRelease and _Reset, cuStreamBeginCapture) and the
 * older cuCtxCreate versions (cuCtxCreate, _v2, _v3), which libcuda still
 * exports and hands to cuGetProcAddress below their newest version's,
 * reach the shim every way too.
 */
#include <cuda.h>
#undef cuGetProcAddress

#include "e2e.h"

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);

#define MiB (UINT64_C(1) << 20)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);

static void *proc(const char *name, int version, cuuint64_t flags)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    CHECK_EQ(cuGetProcAddress_v2(name, &fn, version, flags, &st), CUDA_SUCCESS);
    CHECK_EQ(st, CU_GET_PROC_ADDRESS_SUCCESS);
    CHECK(fn != NULL);
    return fn;
}

int main(void)
{
    shim_log_reset();
    fakecuda();
    CUdevice dev;
    CUcontext ctx;
    CHECK_EQ(cuInit(0), CUDA_SUCCESS);
    CHECK_EQ(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    CHECK_EQ(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    CHECK_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    fakecuda_stats s0 = fake_stats();

    /* "cuMemAlloc" at 3020 and later is the _v2 ABI; the driver picks it. */
    alloc_fn a = (alloc_fn)proc("cuMemAlloc", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
    free_fn f = (free_fn)proc("cuMemFree", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
    void *v1 = NULL;
    CHECK_EQ(cuGetProcAddress("cuMemAlloc", &v1, 12000, CU_GET_PROC_ADDRESS_DEFAULT),
             CUDA_SUCCESS);
    CHECK(v1 == (void *)a); /* both entry points route alike */

    CUdeviceptr p[20];
    for (int i = 0; i < 20; i++)
        CHECK_EQ(a(&p[i], MiB + (size_t)i), CUDA_SUCCESS);
    CUdeviceptr direct = 0;
    CHECK_EQ(cuMemAlloc_v2(&direct, MiB), CUDA_SUCCESS); /* linked call */
    CHECK_EQ(regions_taken(fake_stats()) - regions_taken(s0), 1);
    for (int i = 0; i < 20; i++)
        CHECK_EQ(f(p[i]), CUDA_SUCCESS);
    CHECK_EQ(cuMemFree_v2(direct), CUDA_SUCCESS);

    /* The per-thread flavour: the driver hands out the _ptsz function, and
     * the shim's stand-in for it treats stream 0 as the per-thread stream. */
    alloc_async_fn aa = (alloc_async_fn)proc("cuMemAllocAsync", 12000,
                                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    free_async_fn fa = (free_async_fn)proc("cuMemFreeAsync", 12000,
                                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    alloc_async_fn plain = (alloc_async_fn)proc("cuMemAllocAsync", 12000,
                                                CU_GET_PROC_ADDRESS_DEFAULT);
    CHECK(aa != plain);
    CUdeviceptr x = 0;
    CHECK_EQ(aa(&x, MiB, NULL), CUDA_SUCCESS);
    CHECK_EQ(fa(x, NULL), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().mem_alloc_async_calls, s0.mem_alloc_async_calls);

    /* The v1 entry points: by cuGetProcAddress below the _v2's version,
     * by dlsym on libcuda's handle, and as a linked call binds (the global
     * symbol), each is the shim's. */
    static const struct {
        const char *name;
        int version;
        const char *exported; /* what that version is called in libcuda */
    } old[] = {{"cuStreamDestroy", 3020, "cuStreamDestroy"},
               {"cuCtxDestroy", 3020, "cuCtxDestroy"},
               {"cuDevicePrimaryCtxRelease", 10020, "cuDevicePrimaryCtxRelease"},
               {"cuDevicePrimaryCtxReset", 10020, "cuDevicePrimaryCtxReset"},
               {"cuStreamBeginCapture", 10000, "cuStreamBeginCapture"},
               {"cuCtxCreate", 2000, "cuCtxCreate"},
               {"cuCtxCreate", 3020, "cuCtxCreate_v2"},
               {"cuCtxCreate", 11040, "cuCtxCreate_v3"}};
    void *libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) {
        void *ways[3] = {proc(old[i].name, old[i].version, CU_GET_PROC_ADDRESS_DEFAULT),
                         dlsym(libcuda, old[i].exported), dlsym(RTLD_DEFAULT, old[i].exported)};
        for (int w = 0; w < 3; w++) {
            Dl_info info;
            bool shim = ways[w] && dladdr(ways[w], &info) && info.dli_fname &&
                        strstr(info.dli_fname, "libbfcshim");
            if (!shim) {
                fprintf(stderr, "%s (way %d) is not the shim's: %s\n", old[i].exported, w,
                        ways[w] && dladdr(ways[w], &info) ? info.dli_fname : "(none)");
                e2e_failures++;
            }
        }
    }

    /* A function the shim does not interpose comes back untouched. */
    void *sync = proc("cuCtxSynchronize", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
    CHECK(sync == (void *)cuCtxSynchronize);
    CHECK_EQ(shim_log_lines(NULL, 0), 0);
    return e2e_done("e2e_procaddr");
}
