/*
 * e2e_cu.h - the driver API as XLA, TensorFlow and Numba reach it, for the
 * e2e programs that use it: libcuda.so.1 opened with dlopen and every entry
 * point looked up on that handle, never linked (the shim interposes them).
 * One table, D, with every entry point those programs call, named after the
 * driver's function without its "cu" prefix and version suffix.
 */
#ifndef BFCSHIM_TESTS_E2E_CU_H
#define BFCSHIM_TESTS_E2E_CU_H

#include <cuda.h>

#include "e2e.h"

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxReset)(CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxCreate)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice);
    CUresult (*CtxDestroy)(CUcontext);
    CUresult (*CtxEnablePeerAccess)(CUcontext, unsigned);
    CUresult (*CtxDisablePeerAccess)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*MemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
    CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*DeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*DeviceSetMemPool)(CUdevice, CUmemoryPool);
    CUresult (*MemPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
    CUresult (*MemPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*MemPoolSetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*MemPoolTrimTo)(CUmemoryPool, size_t);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*CtxSynchronize)(void);
    CUresult (*StreamQuery)(CUstream);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventQuery)(CUevent);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamBeginCapture)(CUstream, CUstreamCaptureMode);
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *,
                                            CUmemAllocationGranularity_flags);
    CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                                  unsigned long long);
    CUresult (*MemAddressFree)(CUdeviceptr, size_t);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                          unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*MemRetainAllocationHandle)(CUmemGenericAllocationHandle *, void *);
    CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long);
    CUresult (*MemUnmap)(CUdeviceptr, size_t);
    CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*MemGetAccess)(unsigned long long *, const CUmemLocation *, CUdeviceptr);
    CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle,
                                           CUmemAllocationHandleType, unsigned long long);
    CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *,
                                             CUmemAllocationHandleType);
} D;

/* Opens libcuda.so.1 and fills D (exit 1 when a symbol is missing). */
static inline void e2e_cu_load(void)
{
    void *h = e2e_open_libcuda();
#define E2E_CU(field, name) *(void **)&D.field = e2e_dlsym(h, name)
    E2E_CU(Init, "cuInit");
    E2E_CU(DeviceGet, "cuDeviceGet");
    E2E_CU(DeviceGetAttribute, "cuDeviceGetAttribute");
    E2E_CU(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    E2E_CU(DevicePrimaryCtxReset, "cuDevicePrimaryCtxReset_v2");
    E2E_CU(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    E2E_CU(CtxSetCurrent, "cuCtxSetCurrent");
    E2E_CU(CtxCreate, "cuCtxCreate_v4");
    E2E_CU(CtxDestroy, "cuCtxDestroy_v2");
    E2E_CU(CtxEnablePeerAccess, "cuCtxEnablePeerAccess");
    E2E_CU(CtxDisablePeerAccess, "cuCtxDisablePeerAccess");
    E2E_CU(MemAlloc, "cuMemAlloc_v2");
    E2E_CU(MemFree, "cuMemFree_v2");
    E2E_CU(MemGetInfo, "cuMemGetInfo_v2");
    E2E_CU(MemGetAddressRange, "cuMemGetAddressRange_v2");
    E2E_CU(MemAllocAsync, "cuMemAllocAsync");
    E2E_CU(MemFreeAsync, "cuMemFreeAsync");
    E2E_CU(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync");
    E2E_CU(DeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool");
    E2E_CU(DeviceSetMemPool, "cuDeviceSetMemPool");
    E2E_CU(StreamCreate, "cuStreamCreate");
    E2E_CU(StreamDestroy, "cuStreamDestroy_v2");
    E2E_CU(StreamBeginCapture, "cuStreamBeginCapture_v2");
    E2E_CU(StreamEndCapture, "cuStreamEndCapture");
    E2E_CU(MemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    E2E_CU(MemAddressReserve, "cuMemAddressReserve");
    E2E_CU(MemAddressFree, "cuMemAddressFree");
    E2E_CU(MemCreate, "cuMemCreate");
    E2E_CU(MemRelease, "cuMemRelease");
    E2E_CU(MemRetainAllocationHandle, "cuMemRetainAllocationHandle");
    E2E_CU(MemMap, "cuMemMap");
    E2E_CU(MemUnmap, "cuMemUnmap");
    E2E_CU(MemSetAccess, "cuMemSetAccess");
    E2E_CU(MemGetAccess, "cuMemGetAccess");
    E2E_CU(MemExportToShareableHandle, "cuMemExportToShareableHandle");
    E2E_CU(MemImportFromShareableHandle, "cuMemImportFromShareableHandle");
    E2E_CU(MemPoolCreate, "cuMemPoolCreate");
    E2E_CU(MemPoolGetAttribute, "cuMemPoolGetAttribute");
    E2E_CU(MemPoolSetAttribute, "cuMemPoolSetAttribute");
    E2E_CU(MemPoolTrimTo, "cuMemPoolTrimTo");
    E2E_CU(StreamSynchronize, "cuStreamSynchronize");
    E2E_CU(CtxSynchronize, "cuCtxSynchronize");
    E2E_CU(StreamQuery, "cuStreamQuery");
    E2E_CU(EventCreate, "cuEventCreate");
    E2E_CU(EventRecord, "cuEventRecord");
    E2E_CU(EventQuery, "cuEventQuery");
    E2E_CU(EventDestroy, "cuEventDestroy_v2");
    E2E_CU(StreamWaitEvent, "cuStreamWaitEvent");
#undef E2E_CU
}

/* cuInit, and device `dev`'s primary context retained and made current
 * (returned). */
static inline CUcontext e2e_cu_primary_current(int dev)
{
    CUdevice d;
    CUcontext c = NULL;
    CHECK_EQ(D.Init(0), CUDA_SUCCESS);
    CHECK_EQ(D.DeviceGet(&d, dev), CUDA_SUCCESS);
    CHECK_EQ(D.DevicePrimaryCtxRetain(&c, d), CUDA_SUCCESS);
    CHECK_EQ(D.CtxSetCurrent(c), CUDA_SUCCESS);
    return c;
}

/* cuGetProcAddress_v2's answer for `base` at `version` (no per-thread
 * flag), found as cudart finds it: cuGetProcAddress_v2 by dlsym. */
static inline void *e2e_cu_proc(const char *base, int version)
{
    CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
        (CUresult(*)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))
            e2e_dlsym(e2e_open_libcuda(), "cuGetProcAddress_v2");
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    CHECK_EQ(gpa(base, &fn, version, 0, &st), CUDA_SUCCESS);
    CHECK(fn != NULL);
    return fn;
}

/* cuMemAlloc_v2 that must succeed (else the program stops, failed). */
static inline CUdeviceptr alloc_ok(size_t n)
{
    CUdeviceptr p = 0;
    CUresult r = D.MemAlloc(&p, n);
    if (r != CUDA_SUCCESS || !p)
        e2e_alloc_failed("cuMemAlloc_v2", n, (int)r);
    return p;
}

/* What cuMemGetInfo_v2 says is free. */
static inline size_t free_memory(void)
{
    size_t f = 0, t = 0;
    CHECK_EQ(D.MemGetInfo(&f, &t), CUDA_SUCCESS);
    return f;
}

#endif
