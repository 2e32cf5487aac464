/*
 * e2e_green.h - green contexts (cuGreenCtxCreate) for the e2e programs that
 * make them: their entry points, looked up on libcuda's handle as XLA would
 * (the shim interposes some), and a green context with all of a device's
 * SMs.
 */
#ifndef BFCSHIM_TESTS_E2E_GREEN_H
#define BFCSHIM_TESTS_E2E_GREEN_H

#include "e2e_cu.h"

static struct {
    CUresult (*DeviceGetDevResource)(CUdevice, CUdevResource *, CUdevResourceType);
    CUresult (*DevResourceGenerateDesc)(CUdevResourceDesc *, CUdevResource *, unsigned);
    CUresult (*GreenCtxCreate)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned);
    CUresult (*GreenCtxDestroy)(CUgreenCtx);
    CUresult (*CtxFromGreenCtx)(CUcontext *, CUgreenCtx);
    CUresult (*GreenCtxStreamCreate)(CUstream *, CUgreenCtx, unsigned, int);
    CUresult (*GreenCtxRecordEvent)(CUgreenCtx, CUevent);
    CUresult (*StreamGetCtx)(CUstream, CUcontext *);
    CUresult (*StreamGetCtx_v2)(CUstream, CUcontext *, CUgreenCtx *);
    CUresult (*StreamGetGreenCtx)(CUstream, CUgreenCtx *);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventQuery)(CUevent);
} GR;

static inline void e2e_green_load(void)
{
    void *h = e2e_open_libcuda();
#define E2E_GR(field, name) *(void **)&GR.field = e2e_dlsym(h, name)
    E2E_GR(DeviceGetDevResource, "cuDeviceGetDevResource");
    E2E_GR(DevResourceGenerateDesc, "cuDevResourceGenerateDesc");
    E2E_GR(GreenCtxCreate, "cuGreenCtxCreate");
    E2E_GR(GreenCtxDestroy, "cuGreenCtxDestroy");
    E2E_GR(CtxFromGreenCtx, "cuCtxFromGreenCtx");
    E2E_GR(GreenCtxStreamCreate, "cuGreenCtxStreamCreate");
    E2E_GR(GreenCtxRecordEvent, "cuGreenCtxRecordEvent");
    E2E_GR(StreamGetCtx, "cuStreamGetCtx");
    E2E_GR(StreamGetCtx_v2, "cuStreamGetCtx_v2");
    E2E_GR(StreamGetGreenCtx, "cuStreamGetGreenCtx");
    E2E_GR(EventCreate, "cuEventCreate");
    E2E_GR(EventRecord, "cuEventRecord");
    E2E_GR(EventQuery, "cuEventQuery");
#undef E2E_GR
}

/* A green context with all of dev's SMs, and (converted not NULL) its
 * converted context. */
static inline CUgreenCtx e2e_green_make(CUdevice dev, CUcontext *converted)
{
    CUdevResource sms;
    CUdevResourceDesc desc = NULL;
    CUgreenCtx g = NULL;
    CHECK_EQ(GR.DeviceGetDevResource(dev, &sms, CU_DEV_RESOURCE_TYPE_SM), CUDA_SUCCESS);
    CHECK_EQ(GR.DevResourceGenerateDesc(&desc, &sms, 1), CUDA_SUCCESS);
    CHECK_EQ(GR.GreenCtxCreate(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_SUCCESS);
    if (converted)
        CHECK_EQ(GR.CtxFromGreenCtx(converted, g), CUDA_SUCCESS);
    return g;
}

#endif
