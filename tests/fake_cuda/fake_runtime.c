/*
 * fake_runtime.c - a fake CUDA runtime, built as libcudart.so.13 with the
 * real library's symbol version node (cudaMalloc@@libcudart.so.13), for the
 * shim's end-to-end tests.
 *
 * It reaches the driver the way the real cudart (11.3 and later) does: it
 * dlopens libcuda.so.1, looks up cuGetProcAddress_v2 with dlsym, and gets
 * every other entry point through it, by base name and CUDA version, with the
 * per-thread flag for the _ptsz entry points. So the shim's dlsym override
 * and cuGetProcAddress routing are on the path exactly as with the real one.
 *
 * Semantics kept: a per-thread current device whose primary context is made
 * current on use; cudaFree(NULL) initialises and succeeds; cudaMalloc of 0
 * bytes succeeds with NULL; a per-thread last error set by every failing
 * call, returned and cleared by cudaGetLastError.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#undef cuGetProcAddress

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 8

typedef CUresult (*proc_fn)(const char *, void **, int, cuuint64_t,
                            CUdriverProcAddressQueryResult *);

/* The driver entry points, plain and per-thread-default-stream. */
static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxReset)(CUdevice);
    CUresult (*DeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*DeviceSetMemPool)(CUdevice, CUmemoryPool);
    CUresult (*MemPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*MemPoolSetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*MemPoolTrimTo)(CUmemoryPool, size_t);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*CtxGetStreamPriorityRange)(int *, int *);
    CUresult (*MemAllocAsync[2])(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemFreeAsync[2])(CUdeviceptr, CUstream);
    CUresult (*MemAllocFromPoolAsync[2])(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamCreateWithPriority)(CUstream *, unsigned, int);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize[2])(CUstream);
    CUresult (*StreamIsCapturing[2])(CUstream, CUstreamCaptureStatus *);
    CUresult (*StreamGetCaptureInfo[2])(CUstream, CUstreamCaptureStatus *, cuuint64_t *,
                                        CUgraph *, const CUgraphNode **,
                                        const CUgraphEdgeData **, size_t *);
    CUresult (*StreamBeginCapture[2])(CUstream, CUstreamCaptureMode);
    CUresult (*StreamBeginCaptureToGraph[2])(CUstream, CUgraph, const CUgraphNode *,
                                             const CUgraphEdgeData *, size_t,
                                             CUstreamCaptureMode);
    CUresult (*GraphCreate)(CUgraph *, unsigned);
    CUresult (*GraphDestroy)(CUgraph);
    CUresult (*StreamEndCapture[2])(CUstream, CUgraph *);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord[2])(CUevent, CUstream);
    CUresult (*EventQuery)(CUevent);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned int);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*LaunchHostFunc)(CUstream, CUhostFn, void *);
    CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*CtxEnablePeerAccess)(CUcontext, unsigned);
    CUresult (*CtxDisablePeerAccess)(CUcontext);
    CUresult (*Memcpy)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*DriverGetVersion)(int *);
} D;

/* The driver's cuGetProcAddress_v2 as this runtime found it (dlsym on its
 * libcuda handle): cudaGetDriverEntryPoint[ByVersion] answer through it. */
static proc_fn driver_proc;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cudaError_t init_error = cudaSuccess;
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary[MAX_DEVICES];
static CUcontext reset_primary[MAX_DEVICES]; /* current, inactive, until revived */
static int ndevices;

static _Thread_local int tls_device;
static _Thread_local cudaError_t tls_last_error;

static void resolve(proc_fn get, const char *name, void **slot, cuuint64_t flags)
{
    CUdriverProcAddressQueryResult st;
    if (get(name, slot, CUDA_VERSION, flags, &st) != CUDA_SUCCESS)
        *slot = NULL;
}

#define R(field, name) resolve(get, name, (void **)&D.field, 0)
#define RZ(field, name)                                                     \
    do {                                                                    \
        resolve(get, name, (void **)&D.field[0], 0);                        \
        resolve(get, name, (void **)&D.field[1],                            \
                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);             \
    } while (0)

static void initialise(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    proc_fn get = h ? (proc_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
    if (!get) {
        init_error = cudaErrorInsufficientDriver;
        return;
    }
    R(Init, "cuInit");
    R(DeviceGetCount, "cuDeviceGetCount");
    R(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    R(DevicePrimaryCtxReset, "cuDevicePrimaryCtxReset");
    R(DeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool");
    R(DeviceSetMemPool, "cuDeviceSetMemPool");
    R(MemPoolGetAttribute, "cuMemPoolGetAttribute");
    R(MemPoolSetAttribute, "cuMemPoolSetAttribute");
    R(MemPoolTrimTo, "cuMemPoolTrimTo");
    R(Memcpy, "cuMemcpy");
    R(MemsetD8, "cuMemsetD8");
    R(CtxGetCurrent, "cuCtxGetCurrent");
    R(CtxSetCurrent, "cuCtxSetCurrent");
    R(CtxSynchronize, "cuCtxSynchronize");
    R(MemAlloc, "cuMemAlloc");
    R(MemFree, "cuMemFree");
    R(MemAllocPitch, "cuMemAllocPitch");
    R(MemGetInfo, "cuMemGetInfo");
    R(CtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange");
    RZ(MemAllocAsync, "cuMemAllocAsync");
    RZ(MemFreeAsync, "cuMemFreeAsync");
    RZ(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync");
    R(StreamCreate, "cuStreamCreate");
    R(StreamCreateWithPriority, "cuStreamCreateWithPriority");
    R(StreamDestroy, "cuStreamDestroy");
    RZ(StreamSynchronize, "cuStreamSynchronize");
    RZ(StreamIsCapturing, "cuStreamIsCapturing");
    RZ(StreamGetCaptureInfo, "cuStreamGetCaptureInfo");
    RZ(StreamBeginCapture, "cuStreamBeginCapture");
    RZ(StreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph");
    RZ(StreamEndCapture, "cuStreamEndCapture");
    R(GraphCreate, "cuGraphCreate");
    R(GraphDestroy, "cuGraphDestroy");
    R(EventCreate, "cuEventCreate");
    R(EventDestroy, "cuEventDestroy");
    RZ(EventRecord, "cuEventRecord");
    R(EventQuery, "cuEventQuery");
    R(StreamWaitEvent, "cuStreamWaitEvent");
    R(EventSynchronize, "cuEventSynchronize");
    R(LaunchHostFunc, "cuLaunchHostFunc");
    R(IpcGetMemHandle, "cuIpcGetMemHandle");
    R(CtxEnablePeerAccess, "cuCtxEnablePeerAccess");
    R(CtxDisablePeerAccess, "cuCtxDisablePeerAccess");
    R(DriverGetVersion, "cuDriverGetVersion");
    driver_proc = get;
    if (!D.Init || D.Init(0) != CUDA_SUCCESS || D.DeviceGetCount(&ndevices) != CUDA_SUCCESS)
        init_error = cudaErrorInitializationError;
}

/* Driver codes used here have the same numbers as the runtime's. */
static cudaError_t record(CUresult r)
{
    cudaError_t e = (cudaError_t)r;
    if (r == CUDA_ERROR_INVALID_CONTEXT)
        e = cudaErrorDeviceUninitialized;
    if (e != cudaSuccess)
        tls_last_error = e;
    return e;
}

/* Initialises the runtime and makes the current device's primary context
 * current on this thread unless a context already is. */
static cudaError_t enter(void)
{
    pthread_once(&once, initialise);
    if (init_error != cudaSuccess)
        return tls_last_error = init_error;
    CUcontext cur = NULL;
    D.CtxGetCurrent(&cur);
    pthread_mutex_lock(&ctx_lock);
    /* A context this runtime reset is current but dead: revive it. */
    if (cur && !(cur == reset_primary[tls_device] && !primary[tls_device])) {
        pthread_mutex_unlock(&ctx_lock);
        return cudaSuccess;
    }
    CUresult r = CUDA_SUCCESS;
    if (!primary[tls_device])
        r = D.DevicePrimaryCtxRetain(&primary[tls_device], tls_device);
    CUcontext c = primary[tls_device];
    pthread_mutex_unlock(&ctx_lock);
    if (r != CUDA_SUCCESS)
        return record(r);
    return record(D.CtxSetCurrent(c));
}

#define ENTER()                            \
    do {                                   \
        cudaError_t e_ = enter();          \
        if (e_ != cudaSuccess)             \
            return e_;                     \
    } while (0)

static CUstream S(cudaStream_t s) { return (CUstream)s; }

/* ---- devices and errors ------------------------------------------------------ */

EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    ENTER();
    if (!count)
        return record(CUDA_ERROR_INVALID_VALUE);
    *count = ndevices;
    return cudaSuccess;
}

/* Device dev's primary context in *c, retained by the runtime on first
 * use. */
static CUresult runtime_primary(int dev, CUcontext *c)
{
    pthread_mutex_lock(&ctx_lock);
    CUresult r = CUDA_SUCCESS;
    if (!primary[dev])
        r = D.DevicePrimaryCtxRetain(&primary[dev], dev);
    *c = primary[dev];
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

EXPORT cudaError_t cudaSetDevice(int dev)
{
    pthread_once(&once, initialise);
    if (dev < 0 || dev >= ndevices)
        return tls_last_error = cudaErrorInvalidDevice;
    tls_device = dev;
    CUcontext c = NULL;
    CUresult r = runtime_primary(dev, &c);
    return record(r != CUDA_SUCCESS ? r : D.CtxSetCurrent(c));
}

EXPORT cudaError_t cudaGetDevice(int *dev)
{
    if (!dev)
        return tls_last_error = cudaErrorInvalidValue;
    *dev = tls_device;
    return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    ENTER();
    return record(D.CtxSynchronize());
}

EXPORT cudaError_t cudaDeviceReset(void)
{
    ENTER();
    pthread_mutex_lock(&ctx_lock);
    if (primary[tls_device])
        reset_primary[tls_device] = primary[tls_device];
    primary[tls_device] = NULL;
    pthread_mutex_unlock(&ctx_lock);
    CUresult r = D.DevicePrimaryCtxReset(tls_device);
    /* "Any subsequent API call to this device will reinitialize the
     * device" (cuda_runtime_api.h): until then the reset primary context
     * stays current to the thread, inactive, as seen on an H100 (driver
     * 580: cuCtxGetCurrent gave a context, cuMemGetInfo answered
     * CONTEXT_IS_DESTROYED; GPU suite reset-running, gpu-91caa75). */
    return record(r);
}

/* Peer access between the devices' primary contexts (cuda_runtime_api.h):
 * cudaDeviceEnablePeerAccess makes "all allocations from peerDevice ...
 * accessible by the current device" until cudaDeviceDisablePeerAccess "or
 * either device is reset"; cudaErrorInvalidDevice "if cudaDeviceCanAccessPeer
 * indicates that the current device cannot directly access memory from
 * peerDevice" (here: itself, or no such device), cudaErrorInvalidValue "if
 * flags is not 0", cudaErrorPeerAccessAlreadyEnabled and
 * cudaErrorPeerAccessNotEnabled as the driver's pairs say. The primary
 * contexts' pair is the driver's (cuCtxEnablePeerAccess), which also drops
 * it when either context is reset. */
static cudaError_t peer_switch(int peer, unsigned flags, bool on)
{
    ENTER();
    if (peer < 0 || peer >= ndevices || peer == tls_device)
        return tls_last_error = cudaErrorInvalidDevice;
    if (on && flags != 0)
        return tls_last_error = cudaErrorInvalidValue;
    CUcontext c = NULL;
    CUresult r = runtime_primary(peer, &c);
    if (r == CUDA_SUCCESS)
        r = on ? D.CtxEnablePeerAccess(c, 0) : D.CtxDisablePeerAccess(c);
    return record(r);
}

EXPORT cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags)
{
    return peer_switch(peer, flags, true);
}

EXPORT cudaError_t cudaDeviceDisablePeerAccess(int peer) { return peer_switch(peer, 0, false); }

EXPORT cudaError_t cudaGetLastError(void)
{
    cudaError_t e = tls_last_error;
    tls_last_error = cudaSuccess;
    return e;
}

EXPORT cudaError_t cudaPeekAtLastError(void) { return tls_last_error; }

EXPORT const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "fake runtime error";
    }
}

EXPORT const char *cudaGetErrorName(cudaError_t e) { return cudaGetErrorString(e); }

EXPORT cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v)
        return tls_last_error = cudaErrorInvalidValue;
    *v = CUDART_VERSION;
    return cudaSuccess;
}

/* ---- memory ------------------------------------------------------------------ */

EXPORT cudaError_t cudaMalloc(void **p, size_t size)
{
    ENTER();
    if (!p)
        return record(CUDA_ERROR_INVALID_VALUE);
    if (size == 0) {
        *p = NULL;
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    CUresult r = D.MemAlloc(&d, size);
    if (r == CUDA_SUCCESS)
        *p = (void *)(uintptr_t)d;
    return record(r);
}

EXPORT cudaError_t cudaFree(void *p)
{
    ENTER(); /* cudaFree(NULL) is the classic way to initialise the runtime */
    if (!p)
        return cudaSuccess;
    return record(D.MemFree((CUdeviceptr)(uintptr_t)p));
}

EXPORT cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t width, size_t height)
{
    ENTER();
    if (!p || !pitch)
        return record(CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr d = 0;
    CUresult r = D.MemAllocPitch(&d, pitch, width, height, 4);
    if (r == CUDA_SUCCESS)
        *p = (void *)(uintptr_t)d;
    return record(r);
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    ENTER();
    return record(D.MemGetInfo(free_bytes, total));
}

/* The current device's range: its primary context's, as the driver says. */
EXPORT cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    ENTER();
    return record(D.CtxGetStreamPriorityRange(least, greatest));
}

static cudaError_t malloc_async(int z, void **p, size_t size, cudaStream_t s)
{
    ENTER();
    if (!p)
        return record(CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr d = 0;
    CUresult r = D.MemAllocAsync[z](&d, size, S(s));
    if (r == CUDA_SUCCESS)
        *p = (void *)(uintptr_t)d;
    return record(r);
}

static cudaError_t free_async(int z, void *p, cudaStream_t s)
{
    ENTER();
    return record(D.MemFreeAsync[z]((CUdeviceptr)(uintptr_t)p, S(s)));
}

static cudaError_t malloc_from_pool(int z, void **p, size_t size, cudaMemPool_t pool,
                                    cudaStream_t s)
{
    ENTER();
    if (!p)
        return record(CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr d = 0;
    CUresult r = D.MemAllocFromPoolAsync[z](&d, size, (CUmemoryPool)pool, S(s));
    if (r == CUDA_SUCCESS)
        *p = (void *)(uintptr_t)d;
    return record(r);
}

EXPORT cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s)
{
    return malloc_async(0, p, n, s);
}
EXPORT cudaError_t cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s);
EXPORT cudaError_t cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s)
{
    return malloc_async(1, p, n, s);
}
EXPORT cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { return free_async(0, p, s); }
EXPORT cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s);
EXPORT cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s) { return free_async(1, p, s); }
EXPORT cudaError_t cudaMallocFromPoolAsync(void **p, size_t n, cudaMemPool_t pool, cudaStream_t s)
{
    return malloc_from_pool(0, p, n, pool, s);
}
EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **p, size_t n, cudaMemPool_t pool,
                                                cudaStream_t s);
EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **p, size_t n, cudaMemPool_t pool,
                                                cudaStream_t s)
{
    return malloc_from_pool(1, p, n, pool, s);
}

EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int dev)
{
    ENTER();
    return record(D.DeviceGetDefaultMemPool((CUmemoryPool *)pool, dev));
}

EXPORT cudaError_t cudaDeviceSetMemPool(int dev, cudaMemPool_t pool)
{
    ENTER();
    return record(D.DeviceSetMemPool(dev, (CUmemoryPool)pool));
}

/* cudaMemPoolAttr's values are CUmemPool_attribute's. */
EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr,
                                           void *value)
{
    ENTER();
    return record(D.MemPoolGetAttribute((CUmemoryPool)pool, (CUmemPool_attribute)attr, value));
}

EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr,
                                           void *value)
{
    ENTER();
    return record(D.MemPoolSetAttribute((CUmemoryPool)pool, (CUmemPool_attribute)attr, value));
}

EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep)
{
    ENTER();
    return record(D.MemPoolTrimTo((CUmemoryPool)pool, keep));
}

/* As cudart does: the driver's copy and memset, on the legacy stream, with
 * their synchronization rules (fake_copies.c); the kind is
 * inferred from the pointers (unified addressing). */
EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    (void)kind;
    ENTER();
    return record(D.Memcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n));
}

EXPORT cudaError_t cudaMemset(void *p, int v, size_t n)
{
    ENTER();
    return record(D.MemsetD8((CUdeviceptr)(uintptr_t)p, (unsigned char)v, n));
}

EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p)
{
    ENTER();
    return record(D.IpcGetMemHandle((CUipcMemHandle *)h, (CUdeviceptr)(uintptr_t)p));
}

/* ---- streams, events, capture --------------------------------------------------- */

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    ENTER();
    return record(D.StreamCreate((CUstream *)s, 0));
}

EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    ENTER();
    return record(D.StreamCreate((CUstream *)s, flags));
}

EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int prio)
{
    ENTER();
    return record(D.StreamCreateWithPriority((CUstream *)s, flags, prio));
}

EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    ENTER();
    return record(D.StreamDestroy(S(s)));
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    ENTER();
    return record(D.StreamSynchronize[0](S(s)));
}

EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st)
{
    ENTER();
    return record(D.StreamIsCapturing[0](S(s), (CUstreamCaptureStatus *)st));
}

/* CUDA 13's (the driver's _v3: cudaGraphEdgeData and CUgraphEdgeData
 * agree, below). */
static cudaError_t capture_info(int z, cudaStream_t s, enum cudaStreamCaptureStatus *st,
                                unsigned long long *id, cudaGraph_t *g,
                                const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
                                size_t *n)
{
    _Static_assert(sizeof(unsigned long long) == sizeof(cuuint64_t), "ids differ");
    ENTER();
    return record(D.StreamGetCaptureInfo[z](S(s), (CUstreamCaptureStatus *)st, (cuuint64_t *)id,
                                            (CUgraph *)g, (const CUgraphNode **)deps,
                                            (const CUgraphEdgeData **)edges, n));
}

EXPORT cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, enum cudaStreamCaptureStatus *st,
                                            unsigned long long *id, cudaGraph_t *g,
                                            const cudaGraphNode_t **deps,
                                            const cudaGraphEdgeData **edges, size_t *n)
{
    return capture_info(0, s, st, id, g, deps, edges, n);
}

EXPORT cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t s,
                                                 enum cudaStreamCaptureStatus *st,
                                                 unsigned long long *id, cudaGraph_t *g,
                                                 const cudaGraphNode_t **deps,
                                                 const cudaGraphEdgeData **edges, size_t *n);
EXPORT cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t s,
                                                 enum cudaStreamCaptureStatus *st,
                                                 unsigned long long *id, cudaGraph_t *g,
                                                 const cudaGraphNode_t **deps,
                                                 const cudaGraphEdgeData **edges, size_t *n)
{
    return capture_info(1, s, st, id, g, deps, edges, n);
}

EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    ENTER();
    return record(D.StreamBeginCapture[0](S(s), (CUstreamCaptureMode)mode));
}

EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    ENTER();
    return record(D.StreamBeginCapture[1](S(s), (CUstreamCaptureMode)mode));
}

/* cudaGraphEdgeData (driver_types.h) and CUgraphEdgeData (cuda.h) declare
 * the same fields in the same order: from_port, to_port, type, reserved[5]. */
_Static_assert(sizeof(cudaGraphEdgeData) == sizeof(CUgraphEdgeData),
               "cudaGraphEdgeData and CUgraphEdgeData differ");
static cudaError_t begin_to_graph(int z, cudaStream_t s, cudaGraph_t g,
                                  const cudaGraphNode_t *deps, const cudaGraphEdgeData *edges,
                                  size_t n, enum cudaStreamCaptureMode mode)
{
    ENTER();
    return record(D.StreamBeginCaptureToGraph[z](S(s), (CUgraph)g, (const CUgraphNode *)deps,
                                                  (const CUgraphEdgeData *)edges, n,
                                                  (CUstreamCaptureMode)mode));
}

EXPORT cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t s, cudaGraph_t g,
                                                 const cudaGraphNode_t *deps,
                                                 const cudaGraphEdgeData *edges, size_t n,
                                                 enum cudaStreamCaptureMode mode)
{
    return begin_to_graph(0, s, g, deps, edges, n, mode);
}

EXPORT cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t s, cudaGraph_t g,
                                                      const cudaGraphNode_t *deps,
                                                      const cudaGraphEdgeData *edges, size_t n,
                                                      enum cudaStreamCaptureMode mode)
{
    return begin_to_graph(1, s, g, deps, edges, n, mode);
}

EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    ENTER();
    return record(D.StreamEndCapture[0](S(s), (CUgraph *)g));
}

EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t *g)
{
    ENTER();
    return record(D.StreamEndCapture[1](S(s), (CUgraph *)g));
}

EXPORT cudaError_t cudaGraphCreate(cudaGraph_t *g, unsigned int flags)
{
    ENTER();
    return record(D.GraphCreate((CUgraph *)g, flags));
}

EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    ENTER();
    return record(D.GraphDestroy((CUgraph)g));
}

EXPORT cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    ENTER();
    return record(D.EventCreate((CUevent *)e, 0));
}

EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    ENTER();
    return record(D.EventCreate((CUevent *)e, flags));
}

EXPORT cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    ENTER();
    return record(D.EventDestroy((CUevent)e));
}

EXPORT cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    ENTER();
    return record(D.EventRecord[0]((CUevent)e, S(s)));
}

EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    ENTER();
    return record(D.StreamWaitEvent(S(s), (CUevent)e, flags));
}

EXPORT cudaError_t cudaEventQuery(cudaEvent_t e)
{
    ENTER();
    return record(D.EventQuery((CUevent)e));
}

EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    ENTER();
    return record(D.EventSynchronize((CUevent)e));
}

EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data)
{
    ENTER();
    return record(D.LaunchHostFunc(S(s), (CUhostFn)fn, data));
}

/* ---- driver entry points --------------------------------------------------------- */

/*
 * cudaGetDriverEntryPoint and cudaGetDriverEntryPointByVersion
 * (cuda_runtime_api.h, "Driver Entry Point Access"): the driver function for
 * a base name ("cuMemAlloc" for cuMemAlloc_v2), for a CUDA version (the
 * runtime's own, CUDART_VERSION, for the first), as the driver's
 * cuGetProcAddress chooses it. The runtime asks the cuGetProcAddress_v2 it
 * found with dlsym on its libcuda handle, as the real cudart does, so that
 * whatever answers that lookup (a preloaded shim's dlsym) answers these too;
 * PyTorch finds its virtual memory functions this way (c10/cuda/
 * driver_api.cpp). The rules kept from the header:
 *   - cudaSuccess with the function, or with NULL when the symbol is
 *     unknown or no version of it is old enough, and the optional
 *     driverStatus saying which (cudaDriverEntryPointQueryResult);
 *   - cudaErrorInvalidValue for a missing symbol or result, unknown flags,
 *     and (ByVersion) "If the specified CUDA version is greater than the
 *     driver version";
 *   - cudaEnableDefault means the per-thread versions when "compiled with
 *     --default-stream per-thread ... or the macro
 *     CUDA_API_PER_THREAD_DEFAULT_STREAM": such code calls the _ptsz entry
 *     points (the header maps both names), so the plain ones mean legacy.
 */
static cudaError_t entry_point(const char *symbol, void **fn, int version,
                               unsigned long long flags,
                               enum cudaDriverEntryPointQueryResult *status, bool ptsz)
{
    pthread_once(&once, initialise);
    if (init_error != cudaSuccess)
        return tls_last_error = init_error;
    cuuint64_t how;
    switch (flags) {
    case cudaEnableDefault:
        how = ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                   : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
        break;
    case cudaEnableLegacyStream: how = CU_GET_PROC_ADDRESS_LEGACY_STREAM; break;
    case cudaEnablePerThreadDefaultStream: how = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM; break;
    default: return tls_last_error = cudaErrorInvalidValue;
    }
    int driver = 0;
    if (!symbol || !fn || D.DriverGetVersion(&driver) != CUDA_SUCCESS || version > driver)
        return tls_last_error = cudaErrorInvalidValue;
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = driver_proc(symbol, fn, version, how, &found);
    if (r != CUDA_SUCCESS)
        *fn = NULL;
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_FOUND)
        return record(r);
    if (status)
        *status = r == CUDA_SUCCESS ? cudaDriverEntryPointSuccess
                  : found == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                      ? cudaDriverEntryPointVersionNotSufficent
                      : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn, unsigned long long flags,
                                           enum cudaDriverEntryPointQueryResult *status)
{
    return entry_point(symbol, fn, CUDART_VERSION, flags, status, false);
}
EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **fn,
                                                unsigned long long flags,
                                                enum cudaDriverEntryPointQueryResult *status);
EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **fn,
                                                unsigned long long flags,
                                                enum cudaDriverEntryPointQueryResult *status)
{
    return entry_point(symbol, fn, CUDART_VERSION, flags, status, true);
}

EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn,
                                                    unsigned int version,
                                                    unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *status)
{
    return entry_point(symbol, fn, version > INT_MAX ? INT_MAX : (int)version, flags, status,
                       false);
}
EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(
    const char *symbol, void **fn, unsigned int version, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *status);
EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(
    const char *symbol, void **fn, unsigned int version, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *status)
{
    return entry_point(symbol, fn, version > INT_MAX ? INT_MAX : (int)version, flags, status,
                       true);
}

/* ---- what nvcc's generated code calls -------------------------------------------- */

/*
 * A program built by nvcc registers its device code with the runtime before
 * main (__cudaRegisterFatBinary, then __cudaRegisterFunction per kernel and
 * __cudaRegisterVar per device variable) and launches a kernel through
 * __cudaPushCallConfiguration, __cudaPopCallConfiguration, __cudaGetKernel
 * and __cudaLaunchKernel (crt/host_runtime.h, crt/device_functions.h).
 * Without them such a program died in the loader before main ("undefined
 * symbol: __cudaRegisterFatBinary"), even one with no kernel, so "build it
 * with -cudart shared" led nowhere. The fake runs no kernels: registration
 * is accepted and forgotten, so that the program starts and its memory
 * calls work, and a launch fails with cudaErrorNotSupported (the last error
 * too), said once on stderr.
 */
static void *fatbin_slot;

EXPORT void **__cudaRegisterFatBinary(void *fat_cubin)
{
    (void)fat_cubin;
    return &fatbin_slot;
}

EXPORT void __cudaRegisterFatBinaryEnd(void **handle) { (void)handle; }

EXPORT void __cudaUnregisterFatBinary(void **handle) { (void)handle; }

EXPORT void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun,
                                   const char *device_name, int thread_limit, uint3 *tid,
                                   uint3 *bid, dim3 *block_dim, dim3 *grid_dim, int *warp_size)
{
    (void)handle, (void)host_fun, (void)device_fun, (void)device_name, (void)thread_limit;
    (void)tid, (void)bid, (void)block_dim, (void)grid_dim, (void)warp_size;
}

EXPORT void __cudaRegisterVar(void **handle, char *host_var, char *device_address,
                              const char *device_name, int ext, size_t size, int constant,
                              int global)
{
    (void)handle, (void)host_var, (void)device_address, (void)device_name, (void)ext;
    (void)size, (void)constant, (void)global;
}

EXPORT unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared_mem,
                                            struct CUstream_st *stream)
{
    (void)grid, (void)block, (void)shared_mem, (void)stream;
    return 0;
}

EXPORT cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared_mem,
                                              void *stream)
{
    const dim3 one = {1, 1, 1};
    if (grid)
        *grid = one;
    if (block)
        *block = one;
    if (shared_mem)
        *shared_mem = 0;
    if (stream)
        *(cudaStream_t *)stream = NULL;
    return cudaSuccess;
}

EXPORT cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *fun)
{
    if (kernel)
        *kernel = (cudaKernel_t)(uintptr_t)fun;
    return cudaSuccess;
}

static cudaError_t no_kernels(void)
{
    static atomic_bool said;
    if (!atomic_exchange(&said, true))
        fprintf(stderr, "fake libcudart: a kernel launch fails with cudaErrorNotSupported: the "
                        "fake GPU runs no kernels (it tries the allocator, not a workload)\n");
    return tls_last_error = cudaErrorNotSupported;
}

EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args,
                                      size_t shared_mem, cudaStream_t stream)
{
    (void)kernel, (void)grid, (void)block, (void)args, (void)shared_mem, (void)stream;
    return no_kernels();
}

EXPORT cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block,
                                           void **args, size_t shared_mem, cudaStream_t stream)
{
    (void)kernel, (void)grid, (void)block, (void)args, (void)shared_mem, (void)stream;
    return no_kernels();
}

EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
                                    size_t shared_mem, cudaStream_t stream)
{
    (void)func, (void)grid, (void)block, (void)args, (void)shared_mem, (void)stream;
    return no_kernels();
}
