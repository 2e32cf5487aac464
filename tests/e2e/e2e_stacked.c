/*
 * e2e_stacked.c - bfcshim stacked with another interposer
 * (libe2einterposer.so), preloaded after it: LD_PRELOAD="libbfcshim.so
 * libe2einterposer.so". dlsym(RTLD_NEXT, ...) from the other library must be
 * answered relative to *it* (the next definition after it: the driver's),
 * never with its own function (which would recurse); a lookup on libcuda's
 * own handle still gets the shim's door, which serves from the pool.
 */
#include <cuda.h>

#include "e2e.h"

#define MiB (UINT64_C(1) << 20)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);

int main(void)
{
    shim_log_reset();
    fakecuda();
    void *(*next)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "interposer_next");
    void *(*own)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "interposer_own");
    CHECK(next && own);
    if (!next || !own)
        return e2e_done("e2e_stacked");
    /* In the global scope, as cudart opens it: RTLD_NEXT searches only that. */
    void *libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    void *found = next();
    CHECK(found != own());
    /* After the other interposer comes the driver itself. */
    Dl_info info;
    CHECK(found && dladdr(found, &info) && strstr(info.dli_fname, "libcuda.so"));

    /* A lookup on libcuda's handle (XLA, Numba) still reaches the pool. */
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(libcuda, "cuInit");
    CUresult (*get)(CUdevice *, int) = (CUresult(*)(CUdevice *, int))dlsym(libcuda, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult(*)(CUcontext *, CUdevice))dlsym(libcuda, "cuDevicePrimaryCtxRetain");
    CUresult (*set)(CUcontext) = (CUresult(*)(CUcontext))dlsym(libcuda, "cuCtxSetCurrent");
    alloc_fn alloc = (alloc_fn)dlsym(libcuda, "cuMemAlloc_v2");
    CUdevice dev;
    CUcontext ctx;
    CHECK_EQ(init(0), CUDA_SUCCESS);
    CHECK_EQ(get(&dev, 0), CUDA_SUCCESS);
    CHECK_EQ(retain(&ctx, dev), CUDA_SUCCESS);
    CHECK_EQ(set(ctx), CUDA_SUCCESS);
    fakecuda_stats s0 = fake_stats();
    CUdeviceptr p = 0, q = 0;
    CHECK_EQ(alloc(&p, MiB), CUDA_SUCCESS);
    CHECK_EQ(alloc(&q, MiB), CUDA_SUCCESS);
    CHECK_EQ(regions_taken(fake_stats()) - regions_taken(s0), 1); /* the pool's region */
    return e2e_done("e2e_stacked");
}
