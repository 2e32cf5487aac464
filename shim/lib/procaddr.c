/*
 * procaddr.c - cuGetProcAddress routing, and the table of interposed driver
 * entry points.
 *
 * cudart (11.3 and later) asks cuGetProcAddress for every driver entry point
 * by base name and ABI version ("cuMemAlloc" at 3020 means cuMemAlloc_v2;
 * with the per-thread flag it means the _ptsz variant). Guessing that mapping
 * from names returned the wrong ABI for others. Instead we call the real
 * cuGetProcAddress and swap its answer, by pointer identity, for our door
 * when it is a function we interpose: the driver keeps choosing the version
 * and the stream flavour. dlsym lookups use the same table by name.
 */
#include <dlfcn.h>
#include <string.h>

#include "hooks.h"
#include "shim.h"

typedef struct hook {
    const char *name;
    void *ours;
    void *real;
} hook;

#define H(fn) {#fn, (void *)fn, NULL}
/* (cuCtxDetach is marked deprecated in cuda.h; its stand-in is needed all
 * the same) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static hook hooks[] = {
    H(cuMemAlloc_v2),
    H(cuMemFree_v2),
    H(cuMemAllocPitch_v2),
    H(cuMemGetInfo_v2),
    H(cuMemGetAddressRange_v2),
    H(cuMemAllocAsync),
    H(cuMemAllocAsync_ptsz),
    H(cuMemFreeAsync),
    H(cuMemFreeAsync_ptsz),
    H(cuMemAllocFromPoolAsync),
    H(cuMemAllocFromPoolAsync_ptsz),
    H(cuIpcGetMemHandle),
    H(cuPointerGetAttribute),
    H(cuPointerGetAttributes),
    H(cuStreamCreate),
    H(cuStreamCreateWithPriority),
    H(cuStreamDestroy_v2),
    /* v1 entry points (shim.h): libcuda still exports them for old binaries
     * and hands them to cuGetProcAddress below their _v2's version */
    {"cuStreamDestroy", (void *)shim_cuStreamDestroy_v1, NULL},
    {"cuCtxDestroy", (void *)shim_cuCtxDestroy_v1, NULL},
    {"cuDevicePrimaryCtxRelease", (void *)shim_cuDevicePrimaryCtxRelease_v1, NULL},
    {"cuDevicePrimaryCtxReset", (void *)shim_cuDevicePrimaryCtxReset_v1, NULL},
    {"cuStreamBeginCapture", (void *)shim_cuStreamBeginCapture_v1, NULL},
    {"cuStreamBeginCapture_ptsz", (void *)shim_cuStreamBeginCapture_v1_ptsz, NULL},
    H(cuStreamBeginCapture_v2),
    H(cuStreamBeginCapture_v2_ptsz),
    H(cuStreamBeginCaptureToGraph),
    H(cuStreamBeginCaptureToGraph_ptsz),
    H(cuStreamEndCapture),
    H(cuStreamEndCapture_ptsz),
    H(cuStreamWaitEvent),
    H(cuStreamWaitEvent_ptsz),
    H(cuCtxDestroy_v2),
    H(cuCtxDetach), /* deprecated in cuda.h, still exported (PyCUDA's detach) */
    {"cuCtxCreate", (void *)shim_cuCtxCreate_v1, NULL},
    H(cuCtxCreate_v2),
    H(cuCtxCreate_v3),
    H(cuCtxCreate_v4),
    {"cuGLCtxCreate", (void *)shim_cuGLCtxCreate_v1, NULL},
    H(cuGLCtxCreate_v2),
    {"cuVDPAUCtxCreate", (void *)shim_cuVDPAUCtxCreate_v1, NULL},
    H(cuVDPAUCtxCreate_v2),
    H(cuCtxSetCurrent),
    {"cuCtxPushCurrent", (void *)shim_cuCtxPushCurrent_v1, NULL},
    H(cuCtxPushCurrent_v2),
    {"cuCtxPopCurrent", (void *)shim_cuCtxPopCurrent_v1, NULL},
    H(cuCtxPopCurrent_v2),
    H(cuGreenCtxCreate),
    H(cuGreenCtxDestroy),
    H(cuGreenCtxStreamCreate),
    H(cuCtxEnablePeerAccess),
    H(cuCtxDisablePeerAccess),
    H(cuDeviceSetMemPool),
    H(cuMemPoolDestroy),
    H(cuMemPoolGetAttribute),
    H(cuMemPoolSetAttribute),
    H(cuMemPoolTrimTo),
    H(cuDevicePrimaryCtxRetain),
    H(cuDevicePrimaryCtxReset_v2),
    H(cuDevicePrimaryCtxRelease_v2),
    H(cuGetProcAddress),
    H(cuGetProcAddress_v2),
    H(cuMemCreate),
    H(cuMemRetainAllocationHandle),
    H(cuMemRelease),
};
#pragma GCC diagnostic pop
#define NHOOKS (sizeof hooks / sizeof hooks[0])

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void find_reals(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    for (size_t i = 0; h && i < NHOOKS; i++)
        hooks[i].real = real_dlsym(h, hooks[i].name);
}

void *hook_by_name(const char *name)
{
    for (size_t i = 0; i < NHOOKS; i++)
        if (strcmp(name, hooks[i].name) == 0)
            return hooks[i].ours;
    return NULL;
}

void *hook_by_real(void *real)
{
    pthread_once(&once, find_reals);
    for (size_t i = 0; i < NHOOKS; i++)
        if (hooks[i].real == real)
            return hooks[i].ours;
    return real;
}

SHIM_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                         cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
    const real_driver *R = real_driver_get();
    if (!R || !R->GetProcAddress_v2)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = R->GetProcAddress_v2(symbol, pfn, version, flags, st);
    if (r == CUDA_SUCCESS && pfn && *pfn && shim_driver_hooked())
        *pfn = hook_by_real(*pfn);
    return r;
}

SHIM_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                      cuuint64_t flags)
{
    const real_driver *R = real_driver_get();
    if (!R || !R->GetProcAddress)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = R->GetProcAddress(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn && shim_driver_hooked())
        *pfn = hook_by_real(*pfn);
    return r;
}
