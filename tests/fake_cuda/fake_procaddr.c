/*
 * fake_procaddr.c - how callers find the driver's functions: cuGetProcAddress
 * (each entry point with the CUDA version that introduced it) and
 * cuGetExportTable, which the fake cannot serve.
 */
#include "fake_internal.h"

/* cuGetExportTable hands a CUDA runtime the driver's private tables, whose
 * layout is not published: the fake has none to give. The fake libcudart
 * never asks; a real runtime does, first thing: one linked into the
 * program statically (nvcc's default) or a real libcudart.so loaded in
 * place of the fake's. All its calls then fail with 801, which says
 * nothing of why, so the first request says it, once, naming the file the
 * caller lives in (the program itself when the runtime is linked in). */
EXPORT CUresult cuGetExportTable(const void **table, const CUuuid *id)
{
    CALLED();
    (void)table, (void)id;
    static atomic_bool said;
    if (!atomic_exchange(&said, true)) {
        Dl_info info;
        const void *caller = __builtin_return_address(0);
        const char *who = dladdr(caller, &info) && info.dli_fname && *info.dli_fname
                              ? info.dli_fname
                              : "the program";
        const bool library = strstr(who, "libcudart.so") != NULL;
        fprintf(stderr,
                "fake libcuda: %s %s, which asks the driver for private tables "
                "(cuGetExportTable) that the fake GPU cannot serve: its CUDA calls fail with "
                "801 \"operation not supported\"; %s\n",
                who,
                library ? "is a real CUDA runtime, loaded in place of the fake's libcudart"
                        : "has the CUDA runtime linked in statically (nvcc's default, "
                          "-cudart static)",
                library ? "a program that loads its own runtime cannot run on the fake GPU"
                        : "build it with nvcc -cudart shared to try it on the fake GPU");
    }
    return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status);

/* The deprecated cuCtxAttach and cuCtxDetach: their addresses, for the
 * table below, without the warning. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static CUresult (*const ctx_detach_entry)(CUcontext) = cuCtxDetach;
static CUresult (*const ctx_attach_entry)(CUcontext *, unsigned) = cuCtxAttach;
#pragma GCC diagnostic pop

/* Base name -> versions, newest first: what cudart asks for, as the real
 * driver serves it (cuMemAlloc at 3020 is cuMemAlloc_v2, and so on). */
typedef struct proc {
    const char *base;
    int since;      /* lowest cudaVersion that gets this entry */
    bool ptsz;      /* per-thread default stream variant (_ptsz or _ptds) */
    void *fn;
} proc;

#define P(base, since, fn) {base, since, false, (void *)(fn)}
#define PZ(base, since, fn) {base, since, true, (void *)(fn)}
static const proc procs[] = {
    P("cuInit", 2000, cuInit),
    P("cuDriverGetVersion", 2020, cuDriverGetVersion),
    P("cuDeviceGet", 2000, cuDeviceGet),
    P("cuDeviceGetCount", 2000, cuDeviceGetCount),
    P("cuDeviceGetName", 2000, cuDeviceGetName),
    P("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    P("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    P("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool),
    P("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
    P("cuMemPoolCreate", 11020, cuMemPoolCreate),
    P("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    P("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
    P("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
    P("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    P("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    P("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    P("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset),
    P("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    P("cuCtxCreate", 12050, cuCtxCreate_v4),
    P("cuCtxCreate", 11040, cuCtxCreate_v3),
    P("cuCtxCreate", 3020, cuCtxCreate_v2),
    P("cuCtxCreate", 2000, cuCtxCreate),
    P("cuGLCtxCreate", 3020, cuGLCtxCreate_v2),
    P("cuGLCtxCreate", 2000, cuGLCtxCreate),
    P("cuVDPAUCtxCreate", 3020, cuVDPAUCtxCreate_v2),
    P("cuVDPAUCtxCreate", 3010, cuVDPAUCtxCreate),
    P("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    P("cuCtxDestroy", 2000, cuCtxDestroy),
    P("cuCtxDetach", 2000, ctx_detach_entry),
    P("cuCtxAttach", 2000, ctx_attach_entry),
    P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    P("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    P("cuCtxPushCurrent", 2000, cuCtxPushCurrent),
    P("cuCtxPopCurrent", 2000, cuCtxPopCurrent),
    P("cuCtxGetDevice", 2000, cuCtxGetDevice),
    P("cuCtxGetId", 12000, cuCtxGetId),
    P("cuCtxGetStreamPriorityRange", 5050, cuCtxGetStreamPriorityRange),
    P("cuCtxSynchronize", 2000, cuCtxSynchronize),
    P("cuCtxEnablePeerAccess", 4000, cuCtxEnablePeerAccess),
    P("cuCtxDisablePeerAccess", 4000, cuCtxDisablePeerAccess),
    P("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
    P("cuStreamCreate", 2000, cuStreamCreate),
    P("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
    P("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    P("cuStreamDestroy", 2000, cuStreamDestroy),
    P("cuStreamGetFlags", 5050, cuStreamGetFlags),
    P("cuStreamGetId", 12000, cuStreamGetId),
    PZ("cuStreamGetId", 12000, cuStreamGetId_ptsz),
    P("cuStreamGetCtx", 12050, cuStreamGetCtx_v2),
    P("cuStreamGetCtx", 9020, cuStreamGetCtx),
    P("cuStreamGetGreenCtx", 12040, cuStreamGetGreenCtx),
    P("cuDeviceGetDevResource", 12040, cuDeviceGetDevResource),
    P("cuDevResourceGenerateDesc", 12040, cuDevResourceGenerateDesc),
    P("cuGreenCtxCreate", 12040, cuGreenCtxCreate),
    P("cuGreenCtxDestroy", 12040, cuGreenCtxDestroy),
    P("cuCtxFromGreenCtx", 12040, cuCtxFromGreenCtx),
    P("cuGreenCtxStreamCreate", 12050, cuGreenCtxStreamCreate),
    P("cuGreenCtxRecordEvent", 12040, cuGreenCtxRecordEvent),
    P("cuStreamQuery", 2000, cuStreamQuery),
    PZ("cuStreamQuery", 7000, cuStreamQuery_ptsz),
    P("cuStreamGetPriority", 5050, cuStreamGetPriority),
    PZ("cuStreamGetPriority", 7000, cuStreamGetPriority_ptsz),
    P("cuStreamWaitEvent", 3020, cuStreamWaitEvent),
    PZ("cuStreamWaitEvent", 7000, cuStreamWaitEvent_ptsz),
    P("cuStreamSynchronize", 2000, cuStreamSynchronize),
    PZ("cuStreamSynchronize", 7000, cuStreamSynchronize_ptsz),
    P("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
    PZ("cuStreamIsCapturing", 10000, cuStreamIsCapturing_ptsz),
    P("cuStreamGetCaptureInfo", 12030, cuStreamGetCaptureInfo_v3),
    PZ("cuStreamGetCaptureInfo", 12030, cuStreamGetCaptureInfo_v3_ptsz),
    P("cuStreamGetCaptureInfo", 11030, cuStreamGetCaptureInfo_v2),
    PZ("cuStreamGetCaptureInfo", 11030, cuStreamGetCaptureInfo_v2_ptsz),
    P("cuStreamGetCaptureInfo", 10010, cuStreamGetCaptureInfo),
    PZ("cuStreamGetCaptureInfo", 10010, cuStreamGetCaptureInfo_ptsz),
    P("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
    PZ("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2_ptsz),
    P("cuStreamBeginCapture", 10000, cuStreamBeginCapture_v1),
    PZ("cuStreamBeginCapture", 10000, cuStreamBeginCapture_v1_ptsz),
    P("cuStreamBeginCaptureToGraph", 12030, cuStreamBeginCaptureToGraph),
    PZ("cuStreamBeginCaptureToGraph", 12030, cuStreamBeginCaptureToGraph_ptsz),
    P("cuStreamEndCapture", 10000, cuStreamEndCapture),
    PZ("cuStreamEndCapture", 10000, cuStreamEndCapture_ptsz),
    P("cuGraphCreate", 10000, cuGraphCreate),
    P("cuGraphDestroy", 10000, cuGraphDestroy),
    P("cuEventCreate", 2000, cuEventCreate),
    P("cuEventDestroy", 4000, cuEventDestroy_v2),
    P("cuEventRecord", 2000, cuEventRecord),
    PZ("cuEventRecord", 7000, cuEventRecord_ptsz),
    P("cuEventRecordWithFlags", 11010, cuEventRecordWithFlags),
    PZ("cuEventRecordWithFlags", 11010, cuEventRecordWithFlags_ptsz),
    P("cuEventQuery", 2000, cuEventQuery),
    P("cuEventSynchronize", 2000, cuEventSynchronize),
    P("cuEventElapsedTime", 12080, cuEventElapsedTime_v2),
    P("cuEventElapsedTime", 2000, cuEventElapsedTime),
    P("cuLaunchHostFunc", 10000, cuLaunchHostFunc),
    PZ("cuLaunchHostFunc", 10000, cuLaunchHostFunc_ptsz),
    P("cuMemAlloc", 3020, cuMemAlloc_v2),
    P("cuMemFree", 3020, cuMemFree_v2),
    P("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    P("cuMemAllocAsync", 11020, cuMemAllocAsync),
    PZ("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
    P("cuMemFreeAsync", 11020, cuMemFreeAsync),
    PZ("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
    P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    PZ("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz),
    P("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    P("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    P("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    P("cuPointerGetAttributes", 7000, cuPointerGetAttributes),
    P("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
    P("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
    P("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2),
    P("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
    P("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2),
    PZ("cuMemcpyHtoD", 7000, cuMemcpyHtoD_v2_ptds),
    PZ("cuMemcpyDtoH", 7000, cuMemcpyDtoH_v2_ptds),
    PZ("cuMemcpyDtoD", 7000, cuMemcpyDtoD_v2_ptds),
    P("cuMemsetD8", 3020, cuMemsetD8_v2),
    PZ("cuMemsetD8", 7000, cuMemsetD8_v2_ptds),
    P("cuMemsetD16", 3020, cuMemsetD16_v2),
    PZ("cuMemsetD16", 7000, cuMemsetD16_v2_ptds),
    P("cuMemsetD32", 3020, cuMemsetD32_v2),
    PZ("cuMemsetD32", 7000, cuMemsetD32_v2_ptds),
    P("cuMemsetD8Async", 3020, cuMemsetD8Async),
    PZ("cuMemsetD8Async", 7000, cuMemsetD8Async_ptsz),
    P("cuMemsetD16Async", 3020, cuMemsetD16Async),
    PZ("cuMemsetD16Async", 7000, cuMemsetD16Async_ptsz),
    P("cuMemsetD32Async", 3020, cuMemsetD32Async),
    PZ("cuMemsetD32Async", 7000, cuMemsetD32Async_ptsz),
    P("cuMemsetD2D8", 3020, cuMemsetD2D8_v2),
    PZ("cuMemsetD2D8", 7000, cuMemsetD2D8_v2_ptds),
    P("cuMemsetD2D8Async", 3020, cuMemsetD2D8Async),
    PZ("cuMemsetD2D8Async", 7000, cuMemsetD2D8Async_ptsz),
    P("cuMemsetD2D16", 3020, cuMemsetD2D16_v2),
    PZ("cuMemsetD2D16", 7000, cuMemsetD2D16_v2_ptds),
    P("cuMemsetD2D16Async", 3020, cuMemsetD2D16Async),
    PZ("cuMemsetD2D16Async", 7000, cuMemsetD2D16Async_ptsz),
    P("cuMemsetD2D32", 3020, cuMemsetD2D32_v2),
    PZ("cuMemsetD2D32", 7000, cuMemsetD2D32_v2_ptds),
    P("cuMemsetD2D32Async", 3020, cuMemsetD2D32Async),
    PZ("cuMemsetD2D32Async", 7000, cuMemsetD2D32Async_ptsz),
    P("cuMemcpy", 4000, cuMemcpy),
    PZ("cuMemcpy", 7000, cuMemcpy_ptds),
    P("cuMemcpyAsync", 4000, cuMemcpyAsync),
    PZ("cuMemcpyAsync", 7000, cuMemcpyAsync_ptsz),
    P("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2),
    PZ("cuMemcpyHtoDAsync", 7000, cuMemcpyHtoDAsync_v2_ptsz),
    P("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2),
    PZ("cuMemcpyDtoHAsync", 7000, cuMemcpyDtoHAsync_v2_ptsz),
    P("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2),
    PZ("cuMemcpyDtoDAsync", 7000, cuMemcpyDtoDAsync_v2_ptsz),
    P("cuGetErrorString", 6000, cuGetErrorString),
    P("cuGetErrorName", 6000, cuGetErrorName),
    P("cuGetExportTable", 3000, cuGetExportTable),
    P("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId),
    P("cuMemHostAlloc", 2020, cuMemHostAlloc),
    P("cuMemFreeHost", 2000, cuMemFreeHost),
    P("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
    P("cuMemcpyPeer", 4000, cuMemcpyPeer),
    PZ("cuMemcpyPeer", 7000, cuMemcpyPeer_ptds),
    P("cuMemcpyPeerAsync", 4000, cuMemcpyPeerAsync),
    PZ("cuMemcpyPeerAsync", 7000, cuMemcpyPeerAsync_ptsz),
    P("cuMemPoolSetAccess", 11020, cuMemPoolSetAccess),
    P("cuMemPoolGetAccess", 11020, cuMemPoolGetAccess),
    P("cuStreamWriteValue64", 12000, cuStreamWriteValue64_v2),
    PZ("cuStreamWriteValue64", 12000, cuStreamWriteValue64_v2_ptsz),
    P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    P("cuMemAddressReserve", 10020, cuMemAddressReserve),
    P("cuMemAddressFree", 10020, cuMemAddressFree),
    P("cuMemCreate", 10020, cuMemCreate),
    P("cuMemRelease", 10020, cuMemRelease),
    P("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle),
    P("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
    P("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
    P("cuMemMap", 10020, cuMemMap),
    P("cuMemUnmap", 10020, cuMemUnmap),
    P("cuMemSetAccess", 10020, cuMemSetAccess),
    P("cuMemGetAccess", 10020, cuMemGetAccess),
    P("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    P("cuGetProcAddress", 11030, cuGetProcAddress),
};

static CUresult get_proc_address(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&G.lock);
    G.st.proc_address_lookups++;
    pthread_mutex_unlock(&G.lock);
    bool want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const proc *best = NULL;
    bool known = false;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        const proc *p = &procs[i];
        if (strcmp(p->base, symbol) != 0)
            continue;
        known = true;
        if (p->since > version)
            continue;
        /* Prefer the per-thread variant when asked, else the plain one;
         * among those, the first listed (newest) that the version allows. */
        if (!best || (p->ptsz == want_ptsz && best->ptsz != want_ptsz))
            best = p;
    }
    if (best && best->ptsz && !want_ptsz)
        best = NULL;
    *pfn = best ? best->fn : NULL;
    if (status)
        *status = best ? CU_GET_PROC_ADDRESS_SUCCESS
                  : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                          : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    CALLED();
    return get_proc_address(symbol, pfn, version, flags, status);
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    CALLED();
    return get_proc_address(symbol, pfn, version, flags, NULL);
}
