/*
 * real.c - the real CUDA functions the shim calls.
 *
 * Driver: libcuda.so.1 is opened on first need (never linked: a NEEDED entry
 * would break programs whose environment lacks it), and every function is
 * looked up in it with the real dlsym, so the table never points at our own
 * exports. If cuMemAlloc_v2 turns out to live in some other object, another
 * interposer sits in front of libcuda: we say so once and stack on top.
 *
 * Runtime: functions are looked up lazily with dlsym(RTLD_NEXT, ...), which
 * from this library finds the program's libcudart (the next definition after
 * ours). A program with a static cudart has none; its driver calls still
 * reach us through the driver door.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "shim.h"

static real_driver drv;
static bool drv_ok;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

/* POSIX lets a dlsym result become a function pointer; memcpy does it
 * without a cast per field type. */
#define LOOK(field, name)                          \
    do {                                           \
        void *p_ = real_dlsym(h, name);            \
        memcpy(&drv.field, &p_, sizeof p_);        \
    } while (0)

static void load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    if (!h)
        h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        shim_log(LOG_WARN, "cannot open libcuda.so.1 (%s): passing every call through (no GPU "
                           "here? bfcshim run --fake-gpu -- PROGRAM tries the shim on the fake "
                           "GPU that comes with it)",
                 dlerror());
        return;
    }
    LOOK(GetProcAddress, "cuGetProcAddress");
    LOOK(GetProcAddress_v2, "cuGetProcAddress_v2");
    LOOK(CtxGetCurrent, "cuCtxGetCurrent");
    LOOK(CtxGetDevice, "cuCtxGetDevice");
    LOOK(CtxPushCurrent, "cuCtxPushCurrent_v2");
    LOOK(CtxPopCurrent, "cuCtxPopCurrent_v2");
    LOOK(CtxDestroy, "cuCtxDestroy_v2");
    LOOK(CtxDestroyV1, "cuCtxDestroy");
    LOOK(CtxDetach, "cuCtxDetach");
    LOOK(DeviceTotalMem, "cuDeviceTotalMem_v2");
    LOOK(DeviceGetAttribute, "cuDeviceGetAttribute");
    LOOK(DeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool");
    LOOK(DeviceSetMemPool, "cuDeviceSetMemPool");
    LOOK(MemPoolDestroy, "cuMemPoolDestroy");
    LOOK(MemPoolGetAttribute, "cuMemPoolGetAttribute");
    LOOK(MemPoolSetAttribute, "cuMemPoolSetAttribute");
    LOOK(MemPoolTrimTo, "cuMemPoolTrimTo");
    LOOK(DevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState");
    LOOK(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    LOOK(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    LOOK(DevicePrimaryCtxReset, "cuDevicePrimaryCtxReset_v2");
    LOOK(DevicePrimaryCtxReleaseV1, "cuDevicePrimaryCtxRelease");
    LOOK(DevicePrimaryCtxResetV1, "cuDevicePrimaryCtxReset");
    LOOK(MemAlloc, "cuMemAlloc_v2");
    LOOK(MemFree, "cuMemFree_v2");
    LOOK(MemAllocPitch, "cuMemAllocPitch_v2");
    LOOK(MemGetInfo, "cuMemGetInfo_v2");
    LOOK(MemGetAddressRange, "cuMemGetAddressRange_v2");
    LOOK(MemAllocAsync[0], "cuMemAllocAsync");
    LOOK(MemAllocAsync[1], "cuMemAllocAsync_ptsz");
    LOOK(MemFreeAsync[0], "cuMemFreeAsync");
    LOOK(MemFreeAsync[1], "cuMemFreeAsync_ptsz");
    LOOK(MemAllocFromPoolAsync[0], "cuMemAllocFromPoolAsync");
    LOOK(MemAllocFromPoolAsync[1], "cuMemAllocFromPoolAsync_ptsz");
    LOOK(IpcGetMemHandle, "cuIpcGetMemHandle");
    LOOK(StreamCreate, "cuStreamCreate");
    LOOK(StreamCreateWithPriority, "cuStreamCreateWithPriority");
    LOOK(StreamDestroy, "cuStreamDestroy_v2");
    LOOK(StreamDestroyV1, "cuStreamDestroy");
    LOOK(StreamGetCtx, "cuStreamGetCtx");
    LOOK(StreamGetId, "cuStreamGetId");
    LOOK(StreamGetFlags, "cuStreamGetFlags");
    LOOK(StreamIsCapturing, "cuStreamIsCapturing");
    LOOK(StreamGetCaptureInfoV3, "cuStreamGetCaptureInfo_v3");
    LOOK(StreamGetCaptureInfoV1, "cuStreamGetCaptureInfo");
    LOOK(StreamBeginCapture[0], "cuStreamBeginCapture_v2");
    LOOK(StreamBeginCapture[1], "cuStreamBeginCapture_v2_ptsz");
    LOOK(StreamBeginCaptureV1[0], "cuStreamBeginCapture");
    LOOK(StreamBeginCaptureV1[1], "cuStreamBeginCapture_ptsz");
    LOOK(StreamBeginCaptureToGraph[0], "cuStreamBeginCaptureToGraph");
    LOOK(StreamBeginCaptureToGraph[1], "cuStreamBeginCaptureToGraph_ptsz");
    LOOK(StreamEndCapture[0], "cuStreamEndCapture");
    LOOK(StreamEndCapture[1], "cuStreamEndCapture_ptsz");
    LOOK(ThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
    LOOK(PointerGetAttribute, "cuPointerGetAttribute");
    LOOK(PointerGetAttributes, "cuPointerGetAttributes");
    LOOK(EventCreate, "cuEventCreate");
    LOOK(EventDestroy, "cuEventDestroy_v2");
    LOOK(EventRecord, "cuEventRecord");
    LOOK(EventQuery, "cuEventQuery");
    LOOK(EventSynchronize, "cuEventSynchronize");
    LOOK(CtxSynchronize, "cuCtxSynchronize");
    LOOK(CtxGetId, "cuCtxGetId");
    LOOK(CtxCreateV1, "cuCtxCreate");
    LOOK(CtxCreateV2, "cuCtxCreate_v2");
    LOOK(CtxCreateV3, "cuCtxCreate_v3");
    LOOK(CtxCreateV4, "cuCtxCreate_v4");
    LOOK(GLCtxCreate[0], "cuGLCtxCreate");
    LOOK(GLCtxCreate[1], "cuGLCtxCreate_v2");
    LOOK(VDPAUCtxCreate[0], "cuVDPAUCtxCreate");
    LOOK(VDPAUCtxCreate[1], "cuVDPAUCtxCreate_v2");
    LOOK(CtxSetCurrent, "cuCtxSetCurrent");
    LOOK(CtxPushCurrentV1, "cuCtxPushCurrent");
    LOOK(CtxPopCurrentV1, "cuCtxPopCurrent");
    LOOK(MemAddressReserve, "cuMemAddressReserve");
    LOOK(MemAddressFree, "cuMemAddressFree");
    LOOK(MemCreate, "cuMemCreate");
    LOOK(MemRelease, "cuMemRelease");
    LOOK(MemRetainAllocationHandle, "cuMemRetainAllocationHandle");
    LOOK(MemMap, "cuMemMap");
    LOOK(MemUnmap, "cuMemUnmap");
    LOOK(MemSetAccess, "cuMemSetAccess");
    LOOK(MemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    LOOK(DeviceGetCount, "cuDeviceGetCount");
    LOOK(CtxEnablePeerAccess, "cuCtxEnablePeerAccess");
    LOOK(CtxDisablePeerAccess, "cuCtxDisablePeerAccess");
    LOOK(StreamSynchronize, "cuStreamSynchronize");
    LOOK(StreamWaitEvent, "cuStreamWaitEvent");
    LOOK(StreamWaitEventPtsz, "cuStreamWaitEvent_ptsz");
    LOOK(GreenCtxCreate, "cuGreenCtxCreate");
    LOOK(GreenCtxDestroy, "cuGreenCtxDestroy");
    LOOK(GreenCtxStreamCreate, "cuGreenCtxStreamCreate");
    LOOK(GreenCtxRecordEvent, "cuGreenCtxRecordEvent");
    LOOK(CtxFromGreenCtx, "cuCtxFromGreenCtx");

    /* Everything the pools need must be there; the rest only widens what
     * can be passed through. */
    drv_ok = drv.CtxGetCurrent && drv.CtxGetDevice && drv.CtxPushCurrent && drv.CtxPopCurrent &&
             drv.DeviceTotalMem && drv.MemAlloc && drv.MemFree && drv.MemGetInfo &&
             drv.StreamIsCapturing && drv.EventCreate && drv.EventDestroy && drv.EventRecord &&
             drv.EventQuery && drv.EventSynchronize;
    if (!drv_ok) {
        shim_log(LOG_WARN, "libcuda.so.1 lacks functions the pool needs: passing every call "
                           "through");
        return;
    }
    Dl_info info;
    if (dladdr((void *)drv.MemAlloc, &info) && info.dli_fname) {
        const char *base = strrchr(info.dli_fname, '/');
        base = base ? base + 1 : info.dli_fname;
        if (strncmp(base, "libcuda.so", 10) != 0)
            shim_log(LOG_WARN,
                     "cuMemAlloc_v2 is defined in %s, not in libcuda: another CUDA "
                     "interposer is loaded; bfcshim stacks on top of it",
                     info.dli_fname);
    }
}

const real_driver *real_driver_get(void)
{
    pthread_once(&drv_once, load_driver);
    return drv_ok ? &drv : NULL;
}

bool real_ctx_enter(const real_driver *R, CUcontext ctx)
{
    CUcontext cur = NULL;
    R->CtxGetCurrent(&cur);
    return cur != ctx && R->CtxPushCurrent(ctx) == CUDA_SUCCESS;
}

void real_ctx_leave(const real_driver *R, bool pushed)
{
    CUcontext popped = NULL;
    if (pushed)
        R->CtxPopCurrent(&popped);
}

/*
 * Primary contexts are retained, released and reset one call at a time, the
 * program's calls and the shim's own alike. A release learns whether it was
 * the last (the context then went, and its pool must go) by asking the
 * driver after the call. A retain by another thread in between would make
 * a new context under the same handle: the answer would be "active", and
 * the old pool, whose regions went with the old context, would serve the
 * new one (e2e_driver primary-churn). The shim's own retain and release
 * below could likewise be a last release that nobody sees. Reentrant (the
 * hooks that hold it call real_active_primary) by a depth count of the
 * thread's own. Not taken around fork: the call it guards runs queued work,
 * and work that forks (a host function, or the fake's inline callbacks)
 * would take the registry's lock after it, where pool creation takes them
 * the other way. A forked child gets a fresh one instead.
 */
static pthread_mutex_t primary_mutex = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local unsigned primary_depth __attribute__((tls_model("initial-exec")));

void primary_lock(void)
{
    if (primary_depth++ == 0)
        pthread_mutex_lock(&primary_mutex);
}

void primary_unlock(void)
{
    if (--primary_depth == 0)
        pthread_mutex_unlock(&primary_mutex);
}

void primary_lock_after_fork_child(void)
{
    /* Another thread of the parent may have held it: it has no copy here.
     * Forked inside a hook that holds it, this thread will release it. */
    pthread_mutex_init(&primary_mutex, NULL);
    if (primary_depth)
        pthread_mutex_lock(&primary_mutex);
}

CUcontext real_active_primary(const real_driver *R, CUdevice dev)
{
    unsigned flags = 0;
    int active = 0;
    CUcontext ctx = NULL;
    if (!R || !R->DevicePrimaryCtxGetState || !R->DevicePrimaryCtxRetain ||
        !R->DevicePrimaryCtxRelease)
        return NULL;
    /* The retain and release below are safe only while the program's own
     * retains, releases and resets wait for the primary lock, i.e. reach
     * the shim's hooks. Loaded as a plug-in they do not: a program's reset
     * or last release between our retain and our release would leave our
     * release the last one, destroying the context the program just made
     * current again (e2e_race plugin-teardown saw its calls answered
     * CUDA_ERROR_CONTEXT_IS_DESTROYED). Then the handle stays unknown. */
    if (!streams_all_seen())
        return NULL;
    primary_lock();
    if (R->DevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && active &&
        R->DevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS)
        R->DevicePrimaryCtxRelease(dev);
    else
        ctx = NULL;
    primary_unlock();
    return ctx;
}

bool real_is_primary(const real_driver *R, CUcontext ctx)
{
    CUdevice dev = -1;
    if (!R || !ctx)
        return false;
    bool pushed = real_ctx_enter(R, ctx);
    CUcontext cur = NULL;
    bool known = R->CtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx &&
                 R->CtxGetDevice(&dev) == CUDA_SUCCESS;
    real_ctx_leave(R, pushed);
    return known && real_active_primary(R, dev) == ctx;
}

void *real_runtime(_Atomic(void *) *slot, const char *name)
{
    void *f = atomic_load_explicit(slot, memory_order_acquire);
    if (!f) {
        f = real_dlsym(RTLD_NEXT, name);
        atomic_store_explicit(slot, f, memory_order_release);
    }
    return f;
}
