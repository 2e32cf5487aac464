/*
 * shim.h - what the modules of libbfcshim.so share. Not installed.
 *
 *   door_runtime.c  door_driver.c      exported CUDA entry points (two doors;
 *   door_vmm.c                         the virtual memory door lends the pool's limit)
 *   api.c                              the C interface of bfcshim.h (third door)
 *          \            /
 *           service.c                  one allocation service: pools, policy,
 *              |                       error classes, platform accounting
 *   pools.c  fences.c  streams.c       per-context pools over the engine,
 *              |                       fences as CUDA events, known streams
 *   real.c                             the real driver and runtime functions
 *   dlsym_hook.c  procaddr.c           how dynamic lookups reach the doors
 *   config.c  log.c  lifecycle.c       settings, messages, init/fork/exit
 */
#ifndef BFCSHIM_LIB_SHIM_H
#define BFCSHIM_LIB_SHIM_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#undef cuGetProcAddress /* the v1 entry point keeps its own name */

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bfc.h"

#define SHIM_EXPORT __attribute__((visibility("default")))

/* ---- entry points the headers do not declare -------------------------------- */

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                          const CUgraphNode *dependencies,
                                          const CUgraphEdgeData *dependencyData,
                                          size_t numDependencies, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags);
cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                               const cudaGraphNode_t *dependencies,
                                               const cudaGraphEdgeData *dependencyData,
                                               size_t numDependencies,
                                               enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph);
cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);
cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                         cudaStream_t stream);

/* ---- configuration (config.c) -------------------------------------------------- */

typedef enum shim_mode { MODE_BFC, MODE_PLATFORM } shim_mode;
typedef enum free_policy { FREE_FENCED, FREE_IMMEDIATE } free_policy;
/* BFCSHIM_VMM, in the order of its choices in env_vars.c. */
typedef enum vmm_mode { VMM_AUTO, VMM_ON, VMM_OFF } vmm_mode;
/* BFCSHIM_VMM_LAYOUT, likewise: how a preallocated pool over virtual memory
 * is laid out (bfc_options.prealloc_spread). */
typedef enum vmm_layout { VMM_LAYOUT_ONE_REGION, VMM_LAYOUT_SPREAD } vmm_layout;
/* BFCSHIM_VMM_DOOR, likewise: the program's own cuMemCreate memory comes
 * out of the pool's limit (door_vmm.c), or is only counted beside it. */
typedef enum vmm_door_mode { VMM_DOOR_POOL, VMM_DOOR_COUNT } vmm_door_mode;
/* BFCSHIM_CONTEXT_CACHE, likewise (current_context.c). */
typedef enum context_cache_mode {
    CONTEXT_CACHE_ON,
    CONTEXT_CACHE_OFF,
    CONTEXT_CACHE_CHECK
} context_cache_mode;
enum { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG };

typedef struct shim_config {
    shim_mode mode;
    double mem_fraction;
    uint64_t mem_limit; /* 0: use the fraction */
    bool preallocate;
    bool garbage_collection;
    free_policy free_policy;
    uint64_t alignment;
    bfc_placement placement;
    uint64_t initial_region;
    bool initial_region_set; /* BFCSHIM_INITIAL_REGION given: warned of over virtual memory */
    uint32_t fence_interval; /* allocations between fence seals (engine option) */
    bool fence_interval_set; /* BFCSHIM_FENCE_INTERVAL given: unordered pools seal at it */
    uint64_t fence_bytes;    /* bytes freed that trigger a seal sooner (engine option) */
    bool driver_hooks;
    int log_level;
    const char *log_file;
    const char *trace_path;      /* BFCSHIM_TRACE; %p becomes the pid */
    const char *plan_path;       /* BFCSHIM_PLAN: a placement plan (bfcshim plan) */
    const char *stats_file;      /* BFCSHIM_STATS_FILE; %p becomes the pid */
    bool stats_summary;          /* BFCSHIM_STATS */
    const char *oom_report_path; /* BFCSHIM_OOM_REPORT; %p becomes the pid */
    vmm_mode vmm;                /* BFCSHIM_VMM */
    vmm_layout layout;           /* BFCSHIM_VMM_LAYOUT */
    vmm_door_mode vmm_door;      /* BFCSHIM_VMM_DOOR */
    context_cache_mode context_cache; /* BFCSHIM_CONTEXT_CACHE */
    uint64_t release_threshold;  /* BFCSHIM_RELEASE_THRESHOLD; UINT64_MAX: never */
    uint32_t growth_headroom;    /* BFCSHIM_GROWTH_HEADROOM, in thousandths (engine option) */
} shim_config;

/* Copies pattern into out with every %p replaced by the pid; false if it
 * does not fit. */
bool shim_expand_path(const char *pattern, char *out, size_t len);

/* Parses the BFCSHIM_* variables once; cheap and lock-free afterwards. */
const shim_config *shim_config_get(void);

/* ---- messages (log.c) -------------------------------------------------------------- */

void shim_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void shim_vlog(int level, const char *fmt, va_list ap);
/* Where messages go (stderr or BFCSHIM_LOG_FILE), for multi-line reports. */
int shim_log_fd(void);
/* Logs once per `flag` (a static atomic_flag-like bool), then stays quiet. */
void shim_log_once(atomic_bool *flag, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- the real CUDA (real.c) ------------------------------------------------------- */

typedef CUresult (*getproc_v2_fn)(const char *, void **, int, cuuint64_t,
                                  CUdriverProcAddressQueryResult *);
typedef CUresult (*getproc_v1_fn)(const char *, void **, int, cuuint64_t);

/* The real driver's functions, from libcuda itself and never through our own
 * exports, so nothing is pooled twice. [0] plain, [1] per-thread stream. */
typedef struct real_driver {
    getproc_v1_fn GetProcAddress;
    getproc_v2_fn GetProcAddress_v2;
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxGetDevice)(CUdevice *);
    CUresult (*CtxPushCurrent)(CUcontext);
    CUresult (*CtxPopCurrent)(CUcontext *);
    CUresult (*CtxDestroy)(CUcontext);
    CUresult (*CtxDestroyV1)(CUcontext); /* CUDA 2.0's, which libcuda still exports */
    CUresult (*CtxDetach)(CUcontext);    /* CUDA 2.0's usage count (PyCUDA's detach) */
    /* context creation, every version (door_driver.c): v1 and v2 take
     * (flags, dev), v3 an affinity list, v4 creation parameters */
    CUresult (*CtxCreateV1)(CUcontext *, unsigned, CUdevice);
    CUresult (*CtxCreateV2)(CUcontext *, unsigned, CUdevice);
    CUresult (*CtxCreateV3)(CUcontext *, CUexecAffinityParam *, int, unsigned, CUdevice);
    CUresult (*CtxCreateV4)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice);
    /* the interop creators (cudaGL.h, cudaVDPAU.h; v1 and v2 alike): they
     * push the new context too. VDPAU's device is a uint32_t handle. */
    CUresult (*GLCtxCreate[2])(CUcontext *, unsigned, CUdevice);
    CUresult (*VDPAUCtxCreate[2])(CUcontext *, unsigned, CUdevice, uint32_t, void *);
    /* making a context current (current_context.c), v1 push and pop too */
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxPushCurrentV1)(CUcontext);
    CUresult (*CtxPopCurrentV1)(CUcontext *);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*DeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*DeviceSetMemPool)(CUdevice, CUmemoryPool);
    CUresult (*MemPoolDestroy)(CUmemoryPool);
    CUresult (*MemPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*MemPoolSetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*MemPoolTrimTo)(CUmemoryPool, size_t);
    CUresult (*DevicePrimaryCtxGetState)(CUdevice, unsigned *, int *);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*DevicePrimaryCtxReset)(CUdevice);
    CUresult (*DevicePrimaryCtxReleaseV1)(CUdevice); /* CUDA 7.0's */
    CUresult (*DevicePrimaryCtxResetV1)(CUdevice);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*MemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
    CUresult (*MemAllocAsync[2])(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemFreeAsync[2])(CUdeviceptr, CUstream);
    CUresult (*MemAllocFromPoolAsync[2])(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamCreateWithPriority)(CUstream *, unsigned, int);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamDestroyV1)(CUstream); /* CUDA 2.0's */
    CUresult (*StreamGetCtx)(CUstream, CUcontext *);
    CUresult (*StreamGetId)(CUstream, unsigned long long *); /* optional (CUDA 12.0) */
    CUresult (*StreamGetFlags)(CUstream, unsigned *);
    CUresult (*StreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
    /* A capture's identity: cuStreamGetCaptureInfo's _v3 (CUDA 12.3), else
     * its v1 (10.1's: status and id), which libcuda still exports. */
    CUresult (*StreamGetCaptureInfoV3)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                       const CUgraphNode **, const CUgraphEdgeData **, size_t *);
    CUresult (*StreamGetCaptureInfoV1)(CUstream, CUstreamCaptureStatus *, cuuint64_t *);
    CUresult (*StreamBeginCapture[2])(CUstream, CUstreamCaptureMode);
    CUresult (*StreamBeginCaptureV1[2])(CUstream); /* v1: no mode (global) */
    CUresult (*StreamBeginCaptureToGraph[2])(CUstream, CUgraph, const CUgraphNode *,
                                             const CUgraphEdgeData *, size_t,
                                             CUstreamCaptureMode);
    CUresult (*StreamEndCapture[2])(CUstream, CUgraph *);
    CUresult (*ThreadExchangeStreamCaptureMode)(CUstreamCaptureMode *);
    CUresult (*PointerGetAttribute)(void *, CUpointer_attribute, CUdeviceptr);
    CUresult (*PointerGetAttributes)(unsigned, CUpointer_attribute *, void **, CUdeviceptr);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventQuery)(CUevent);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*CtxSynchronize)(void);
    CUresult (*CtxGetId)(CUcontext, unsigned long long *); /* optional (CUDA 12.0) */
    /* virtual memory management (vmm.c); optional */
    CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*MemAddressFree)(CUdeviceptr, size_t);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                          unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*MemRetainAllocationHandle)(CUmemGenericAllocationHandle *, void *); /* optional */
    CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long);
    CUresult (*MemUnmap)(CUdeviceptr, size_t);
    CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *,
                                            CUmemAllocationGranularity_flags);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*CtxEnablePeerAccess)(CUcontext, unsigned);
    CUresult (*CtxDisablePeerAccess)(CUcontext);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
    CUresult (*StreamWaitEventPtsz)(CUstream, CUevent, unsigned); /* the program's, hooked */
    /* green contexts (green.c); optional */
    CUresult (*GreenCtxCreate)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned);
    CUresult (*GreenCtxDestroy)(CUgreenCtx);
    CUresult (*GreenCtxStreamCreate)(CUstream *, CUgreenCtx, unsigned, int);
    CUresult (*GreenCtxRecordEvent)(CUgreenCtx, CUevent);
    CUresult (*CtxFromGreenCtx)(CUcontext *, CUgreenCtx);
} real_driver;

/* Loads libcuda.so.1 on first use; NULL if it cannot be found. */
const real_driver *real_driver_get(void);
/* One real driver function, or NULL when there is no driver or it lacks it. */
#define REAL(field) (real_driver_get() ? real_driver_get()->field : NULL)

/* Makes ctx current for the driver calls that follow, unless it already is;
 * returns whether it pushed, for real_ctx_leave. */
bool real_ctx_enter(const real_driver *R, CUcontext ctx);
void real_ctx_leave(const real_driver *R, bool pushed);
/* The handle of dev's primary context while it is active, else NULL:
 * retaining it to learn the handle would create it when it is not. NULL
 * too where the library is loaded as a plug-in (streams_all_seen false):
 * the retain and release that learn the handle would race the program's
 * own, which no hook serialises then. */
CUcontext real_active_primary(const real_driver *R, CUdevice dev);
/* Is ctx the active primary context of its device? Asked of the driver,
 * whether or not the context has a pool yet. */
bool real_is_primary(const real_driver *R, CUcontext ctx);
/* Held around every retain, release and reset of a primary context (real.c
 * says why); never taken with the pool registry's lock held, taken before a
 * pool's; not held across fork (a forked child gets a fresh one). */
void primary_lock(void);
void primary_unlock(void);
void primary_lock_after_fork_child(void);

/* The real dlsym (the override in dlsym_hook.c forwards to it). */
void *real_dlsym(void *handle, const char *symbol);

/* A real runtime function by name, looked up after this library
 * (RTLD_NEXT), cached in *slot. NULL when no runtime is loaded. */
void *real_runtime(_Atomic(void *) *slot, const char *name);
/* Declares `var`, the real runtime function `name` of type `type`. */
#define REAL_RT(type, var, name)                  \
    static _Atomic(void *) var##_slot;            \
    type var = (type)real_runtime(&var##_slot, name)

/* ---- per-context pools (pools.c, fences.c, streams.c) --------------------------- */

typedef struct fence_queue fence_queue;

/* Contexts a pool over virtual memory remembers as having enabled peer
 * access to it (each pair of contexts enables it at most once). */
#define VMM_MAX_ENABLERS 64

typedef struct shim_pool {
    CUcontext ctx;
    CUdevice dev;
    bool primary;         /* ctx is the device's primary context */
    /* cuCtxGetId of ctx when the pool was made (0: unknown): a primary
     * context made again under the same handle has another */
    unsigned long long ctx_id;
    atomic_bool dead;     /* its context went away: no more use */
    /* work the fences no longer cover may still use freed blocks (a
     * stand-in could be neither recorded nor replaced by a host wait): no
     * fence is sealed or completes from then on, and freed blocks are kept
     * (fences.c, fences_keep_freed) */
    atomic_bool keep_freed;
    /* trims inside the pool now, and a teardown holding new ones off
     * (pools.c, "trims and teardowns") */
    atomic_int trims;
    atomic_int closing;
    atomic_bool given_back; /* (over virtual memory) its granules went back */
    /* pools_deaths() when this pool last looked for loans that dead pools
     * of its device still hold (service.c, svc_alloc) */
    atomic_uint_fast64_t deaths_seen;
    /* the thread whose teardown forgot it (pools.c): only that thread gives
     * its granules back, after its own real call returned */
    atomic_uintptr_t forgotten_by;
    bfc_pool *bfc;
    uint64_t total_memory, limit;
    /* how long taking the pool up front took (BFCSHIM_PREALLOCATE), in
     * microseconds; 0 for a pool that grows, or could not take it */
    uint64_t prealloc_us;
    uint32_t plain_lane;  /* frees that wait for every stream (cudaFree) */
    uint32_t legacy_lane; /* stream-ordered frees on the legacy stream */
    /* stream -> lane, for stream-ordered calls. Where the library does not
     * see every stream go (streams_all_seen), a handle may name another
     * stream after cuStreamDestroy: lanes are then keyed on cuStreamGetId
     * too (0 where streams are all seen). */
    pthread_mutex_t lanes_lock;
    struct lane_entry { CUstream stream; unsigned long long id; uint32_t lane; } *lanes;
    size_t nlanes, caplanes;
    /* lane -> stream and lane -> fences: read in engine callbacks, which run
     * with the engine's lock held; 65536 entries (lanes are 16-bit). */
    _Atomic(CUstream) *lane_stream;
    fence_queue **fences;
    /* recycled events, touched only under the engine's lock */
    CUevent *spare_events;
    size_t nspare, capspare;
    /* stand-in events (fences.c): for streams that stopped taking events
     * (destroyed, capturing) while their old work may still run */
    pthread_mutex_t stand_in_lock;
    struct stand_in **stand_ins;
    size_t nstand_ins, capstand_ins;
    /* blind fences (fences.c): plain-lane fences sealed while the program's
     * streams are not seen (streams_all_seen), numbered from 1, and the
     * number up to which a context synchronisation has covered them; and
     * how many such synchronisations the pool made */
    atomic_uint_fast64_t blind_sealed, blind_synced, context_syncs;
    /* ordered (fences.c): no stream of the context can run beside the
     * legacy stream's order (no non-blocking stream, no green context), so
     * a plain or legacy-lane seal is a barrier on the legacy stream that
     * every later use waits for, and its blocks are reusable at once; set
     * once the pool is published, cleared for good by the first stream that
     * escapes that order. last_barrier: the newest barrier's event, which
     * such a stream is made to wait for (written by seals under the
     * registry's read lock, read under its write lock) */
    atomic_bool ordered;
    CUevent last_barrier;
    bool barrier_idle; /* last_barrier seen complete (under the engine's lock) */
    /* an event recorded once on the legacy stream, which a stream-ordered
     * free there makes the legacy stream wait for (fences_legacy_order) */
    _Atomic(CUevent) legacy_order_event;
    /* recorded_streams.c: the highest allocation sequence number of a
     * block whose Tensor.record_stream was dropped (the table full, or no
     * host memory), 0 if none: on a stream of this pool's context (its
     * free is made plain), on handle 0 (also waits for every device's
     * legacy stream), on another context's stream (the block is kept).
     * Only ever raised; written under the table's lock */
    atomic_uint_fast64_t rs_drop_plain, rs_drop_legacy, rs_drop_keep;
    /* passthrough counters */
    atomic_uint_fast64_t passthrough_allocs;
    /* found held by another thread at exit (record.c, stats_file.c): the
     * writers after the first skip it rather than wait for it again */
    atomic_bool held_at_exit;
    /* the pool's number, never reused (a dead pool's registry slot is) */
    uint32_t serial;
    /* the driver's cuMemAllocPitch row alignment on this device, learned at
     * the first pitched allocation (0 until then; pools_pitch_align) */
    atomic_uint_fast64_t pitch_align;
    /* BFCSHIM_TRACE: this pool's channel, fed by the engine under its lock;
     * NULL when not traced or once the pool died (record_detach) */
    _Atomic(struct trace_channel *) trace;
    /* BFCSHIM_VMM: the mapping granule when the pool is over virtual
     * memory, else 0 */
    uint64_t vmm_granule;
    /* preallocated over virtual memory and laid out by its rules from the
     * start (BFCSHIM_VMM_LAYOUT=spread) */
    bool vmm_spread;
    /* over virtual memory: devices (bit i: device i < 64) that enabled peer
     * access to this pool's context; its mappings are made accessible to
     * them too (vmm.c). Read by the map callbacks under the engine's lock;
     * changed, with the contexts that enabled it, under peers_lock (taken
     * before the engine's lock, never inside it). */
    atomic_uint_fast64_t vmm_peers;
    pthread_mutex_t peers_lock;
    struct vmm_enabler {
        CUcontext ctx;
        int dev;
    } vmm_enablers[VMM_MAX_ENABLERS];
    size_t vmm_nenablers;
    /* devices that enabled access from more contexts than vmm_enablers
     * holds: they keep it for the pool's life */
    uint64_t vmm_peers_kept;
    /* over virtual memory, while the engine moves memory under pressure
     * (bfc_backend.keep): the handles of the granules unmapped meanwhile,
     * which the next maps use before cuMemCreate. Touched only in engine
     * callbacks, under the engine's lock; empty between its calls. */
    bool vmm_keeping;
    CUmemGenericAllocationHandle *vmm_kept;
    size_t vmm_nkept, vmm_capkept;
    /* bytes mapped again from kept handles, all told */
    atomic_uint_fast64_t vmm_moved_bytes;
    /* the engine's pressure windows (keep(true) to keep(false): the unmaps
     * and maps that move memory under a block), how many and their time;
     * vmm_keep_t0_ns is the open window's start, under the engine's lock */
    atomic_uint_fast64_t vmm_pressure_maps, vmm_pressure_ns;
    uint64_t vmm_keep_t0_ns;
    /* address ranges reserved (va_reserve, under the engine's lock): a
     * preallocated pool's second one is its first overflow */
    unsigned vmm_reservations;
} shim_pool;

/* ---- the pool over virtual memory (vmm.c) ----------------------------------------- */

/* The device's recommended mapping granule when it supports virtual memory
 * management and the driver has every call the pool needs; else 0. */
uint64_t vmm_granularity(const real_driver *R, CUdevice dev);
/* Runs the pool's whole cycle once on one granule of `dev` (reserve, create,
 * map, grant access, unmap, free; the device's context current): the result
 * of the first call that fails, named in *step, or CUDA_SUCCESS. */
CUresult vmm_probe(const real_driver *R, CUdevice dev, uint64_t granule, const char **step);
/* The current context's device was given peer access to `peer`'s memory
 * (cuCtxEnablePeerAccess succeeded, `enabled`) or gave it up
 * (cuCtxDisablePeerAccess succeeded): a pool of `peer` over virtual memory
 * makes its mappings, present and future, accessible to that device, and
 * closes them to it again once no context of the device holds the access,
 * as cudaMalloc's memory would. */
void vmm_peer_access(CUcontext peer, bool enabled);
/* Context `ctx` is gone (destroyed, or a primary context reset or released
 * for the last time): the peer access it enabled went with it, so each pool
 * over virtual memory drops it, and closes its mappings to a device none of
 * whose contexts holds the access any more. */
void vmm_context_gone(CUcontext ctx);
/* Fills the backend's region and map callbacks (its ctx is a pool whose
 * vmm_granule is set). */
void vmm_backend(bfc_backend *b);

/* The pool of a context, created on first use when `create`; NULL on failure
 * (then callers pass the call through). */
shim_pool *pool_for_context(CUcontext ctx, bool create);
/* The same, created if need be as a pool that grows whatever
 * BFCSHIM_PREALLOCATE says: made by the virtual memory door, whose program
 * brings its own memory (the pool would only give back what it took). */
shim_pool *pool_for_context_growing(CUcontext ctx);
/* The pool whose regions contain addr, or NULL. */
shim_pool *pool_owning(CUdeviceptr addr);
/* A context is about to go away (destroy, reset, last primary release):
 * forget its pool (its memory goes with it) and its streams. */
void pools_context_gone(CUcontext ctx);
/* Loaded without LD_PRELOAD the library sees no context go (no destroy,
 * reset or release reaches it): before a plug-in call uses sp, this asks
 * the driver whether sp's context is still the one the pool was made in
 * (cuCtxGetId). If not, the pool is forgotten, its memory given back (the
 * old context's work ended with it), and true returned. */
bool pools_forget_if_replaced(shim_pool *sp);
/* What the driver says of sp's context (cuCtxGetId): still the pool's
 * (CTX_SAME, also when no id can be asked for), replaced (another id, or
 * no live context under the handle: CUDA_ERROR_CONTEXT_IS_DESTROYED,
 * CUDA_ERROR_INVALID_CONTEXT), or not known (another failure: an earlier
 * launch's error, a driver shutting down), which is neither. */
typedef enum { CTX_SAME, CTX_REPLACED, CTX_UNKNOWN } ctx_identity;
ctx_identity pools_context_identity(const shim_pool *sp);
/* The same of context handle ctx, whose id was `was` (0: none known,
 * CTX_SAME). */
ctx_identity pools_identity_of(CUcontext ctx, unsigned long long was);
/* Is addr a block that a pool whose context went still lists as live (a
 * plug-in's late free, after the context took the memory)? */
bool pools_dead_block(CUdeviceptr addr);
/* How many pools have died (their context gone) so far. */
uint64_t pools_deaths(void);
/* Takes over the loans dead pools of sp's device hold (door_vmm.c), once
 * per death seen: svc_alloc calls it when pools_deaths() moved. */
void pools_take_over_loans(shim_pool *sp);
/* Is ctx the primary context of a live pool? */
bool pools_context_is_primary(CUcontext ctx);
/* The same for the device's primary context, if it is active. */
void pools_primary_gone(CUdevice dev);
/* After the real destroy or reset returned: the pools over virtual memory
 * that this thread forgot give their granules back (cuCtxDestroy keeps what
 * cuMemCreate made) when context_went (the driver said yes). Not before:
 * the driver finishes the context's queued work inside that call, and that
 * work may still touch the granules; and not another thread's, whose call
 * may still be running. */
void pools_give_back_forgotten(bool context_went);
/* Lazy context entry (pools.c): between begin and end, the calling
 * thread's first backend call for sp (pools_context_needed, at the top of
 * every backend callback that calls CUDA) makes sp's context current;
 * end restores the thread's context if that pushed one. Outside such a
 * scope pools_context_needed does nothing: the caller entered the context
 * itself. Scopes nest (the outer one is saved in `saved`). */
typedef struct pool_context_scope {
    shim_pool *want; /* the pool whose context is wanted, until entered */
    bool pushed;     /* entering pushed it: end pops */
} pool_context_scope;
void pools_context_lazy_begin(shim_pool *sp, pool_context_scope *saved);
void pools_context_lazy_end(const pool_context_scope *saved);
void pools_context_needed(shim_pool *sp);

/* Number of live pools, and the i-th (for stats and fork handlers). */
size_t pools_count(void);
shim_pool *pools_at(size_t i);
/* Dead pools whose registry slot a later pool took (the statistics report
 * them), oldest first, and how many more there were than the list keeps. */
size_t pools_retired_count(void);
shim_pool *pools_retired_at(size_t i);
size_t pools_retired_unlisted(void);
/* Gives back what the pool holds idle (bfc_pool_trim) in its context:
 * bytes released. */
uint64_t pools_trim(shim_pool *sp, bool may_wait);
/* Inside a trim that may not wait for the GPU (pools_trim(sp, false), the
 * program's): false. The backend's release gate then queries rather than
 * waits. */
bool pools_trim_waits(void);
/* Before the real call of a teardown that forgot its pools first: waits
 * until no trim is inside a forgotten pool. */
void pools_wait_dead_trims(void);
/* Around a real call that may end context ctx and whose pool is forgotten
 * only after it (a primary context's release, a detach): trims of another
 * thread are kept out of its pools and waited out first (hold true), and
 * let in again after (hold false). */
void pools_hold_trims(CUcontext ctx, bool hold);
/* Lends `bytes` of sp's limit to memory the program makes itself
 * (bfc_pool_lend, in the pool's context; door_vmm.c); false when the limit
 * has no room for it even after giving back what the pool may. */
bool pools_lend(shim_pool *sp, uint64_t bytes);
/* The row alignment of the driver's cuMemAllocPitch on the pool's device
 * (its context current). */
uint64_t pools_pitch_align(shim_pool *sp);
/* The pool limit for a device of `total` bytes, under the configuration. */
uint64_t pools_limit_for(uint64_t total);
/* For fork handlers: hold / release the pool registry. */
void pools_lock_for_fork(bool lock);

/* Is the legacy lane never taken in stream order, a legacy-stream free
 * going to the plain lane, whose barrier is the legacy-stream action CUDA's
 * free is? In an ordered pool, preloaded. pool_lane_for_alloc and svc_free
 * both ask, and must agree: a block in the legacy lane must have been freed
 * with its action (fences_legacy_order). */
bool pool_legacy_by_barrier(shim_pool *sp);
/* The lane for stream-ordered calls on `stream` (per_thread: the call is a
 * _ptsz one, so stream 0 is the per-thread stream). BFC_NO_LANE for a stream
 * whose blocks other threads' streams share (the per-thread stream): they
 * then wait for every stream. create=false: lookup only. */
uint32_t pool_lane_for_alloc(shim_pool *sp, CUstream stream, bool per_thread);
/* legacy_is_pools: the caller vouches that a legacy stream it names is the
 * pool's context's (FREE_STREAM_DEVICE). BFC_NO_LANE: another context's
 * stream that could not be waited for, whose work may still use the block:
 * the caller keeps it; or, with *refused set to the driver's code
 * (CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_CONTEXT_IS_DESTROYED, and for an
 * explicit handle CUDA_ERROR_INVALID_HANDLE), a legacy or per-thread handle
 * while no live context is current, or an explicit handle whose context
 * the driver cannot name: there is no such stream, and the caller refuses
 * the free as CUDA does. */
uint32_t pool_lane_for_free(shim_pool *sp, CUstream stream, bool per_thread, bool legacy_is_pools,
                            CUresult *refused);
/* Is c the pool's context (or a green context of it, whose streams use its
 * memory and are fenced as its own)? */
bool pools_context_is(const shim_pool *sp, CUcontext c);
/* The pool of the calling thread's current context, if one exists (never
 * made: a free must not make a pool); remembered per thread. */
shim_pool *pools_current_existing(const real_driver *R);
/* Seals the open epoch of stream s's lane in sp now, while s exists (a
 * plug-in's stream-ordered free where the library cannot see s destroyed:
 * a seal deferred to a later allocation could meet a dead handle). */
void pools_seal_stream_lane(shim_pool *sp, CUstream s);
/* A stream is about to be destroyed (its queued work runs on after the
 * destroy returns): while it still exists, a stand-in for that work, and its
 * lanes sealed and closed in every pool; then it leaves the registry. */
void pools_stream_destroyed(CUstream stream);

/* Engine callbacks (fences.c). */
bool fences_seal(void *ctx, uint32_t lane, uint64_t token);
bool fences_done(void *ctx, uint32_t lane, uint64_t token, bool wait);
/* Makes every blind fence sealed so far complete with one
 * cuCtxSynchronize of the pool's context, unless none is pending or a
 * capture forbids it now (then false). */
bool fences_sync_blind(shim_pool *sp);
/* Records a stand-in event on s (of sp's context, which is current): every
 * plain-free fence waits for it until it completes. When none can be
 * recorded, the host waits for s instead; when that fails too, the pool
 * keeps its freed blocks for good (fences_keep_freed). unknown: the driver
 * could not say whether s captures (no host wait then: it would invalidate
 * a capture). */
void fences_stand_in(shim_pool *sp, CUstream s, bool unknown);
/* From now on no fence of sp is sealed or completes: freed blocks are
 * kept, never reused (one log line, naming the driver's code r). */
void fences_keep_freed(shim_pool *sp, CUresult r);
/* The same for all the work of green context g (an event of sp's context,
 * which is current, recorded with cuGreenCtxRecordEvent); false if it could
 * not be recorded. */
bool fences_stand_in_green(shim_pool *sp, CUgreenCtx g);
/* Puts a newly published pool in the ordered state when its context allows
 * it (fences.c). */
void fences_ordered_begin(shim_pool *sp);
/* Are sp's lanes sealed only when it needs their memory (a preallocated
 * pool, no BFCSHIM_FENCE_INTERVAL), ordered or not? */
bool fences_lazy_pool(shim_pool *sp);
/* Does a blocking stream of the current context capture (asked of the
 * driver unless every begin is counted and none is under way)? A context
 * synchronisation then would be refused and invalidate that capture. */
bool fences_legacy_blocked(const real_driver *R);
/* A stream s that does not follow the legacy stream's order (non-blocking)
 * was made in ctx: pools of ctx leave the ordered state for good, and s
 * waits for their last barrier before any work of its own (on the device,
 * else on the host). Returns the code for the program when neither wait
 * could be made: s must not be used (streams_add destroys it). */
CUresult fences_ordered_stream_made(CUcontext ctx, CUstream s);
/* A green context was made on dev: its streams and default stream do not
 * follow the primary context's legacy stream, so every pool of the device
 * (dev -1: of every device, for a second context) leaves the ordered state,
 * and the host waits for their last barriers. */
void fences_ordered_end_device(CUdevice dev);
/* A context became known (a pool's, a primary context retained, one
 * created): once there is more than one, work of another context (a peer
 * copy, a kernel by peer access) may use a pool's blocks, which no barrier
 * on the pool's legacy stream orders, so no pool is ordered any more. */
void fences_context_seen(CUcontext ctx);
/* Engine's lock held, before memory leaves the pool (an unmap, a region
 * freed): a block an ordered seal made reusable is free of later work's
 * reach, not idle; its old work is done once the last barrier is. Waits
 * for it when `wait`; true when it is done (or there is none), never in a
 * pool that keeps its freed blocks (fences_keep_freed), which still waits. */
bool fences_barrier_idle(shim_pool *sp, bool wait);
/* Makes the pool's legacy stream take an action (a wait), as a real
 * stream-ordered free there would; the pool's context current. False when
 * it could not: the free then waits for every stream (the plain lane). */
bool fences_legacy_order(shim_pool *sp);

/* ---- graph capture (capture.c) ----------------------------------------------- */

/* The calling thread's capture mode, made relaxed around the shim's own
 * potentially unsafe driver calls (capture.c, header). */
typedef struct relaxed_scope {
    bool changed;
    CUstreamCaptureMode old;
} relaxed_scope;
/* Relaxed while any capture is under way, else left alone. Only with the
 * streams registry's lock held (either mode) from this call to the unsafe
 * call: otherwise a capture may begin in between. */
relaxed_scope capture_relax(const real_driver *R);
/* Relaxed whatever the count: for unsafe calls made without that lock. */
relaxed_scope capture_relax_always(const real_driver *R);
/* The host waits for stream s's queued work (cuStreamSynchronize), in
 * relaxed mode: in global mode another thread's global-mode capture would
 * refuse the wait and be invalidated. Never on a stream that captures (the
 * driver refuses that and invalidates its capture). */
CUresult capture_relaxed_stream_wait(const real_driver *R, CUstream s);
/* Work queued on the current context's legacy stream (an event recorded
 * there), as a stream-ordered call on it would queue: while a blocking
 * stream captures, the driver refuses it (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
 * and invalidates those captures, which is CUDA's answer to that call. */
CUresult capture_legacy_use(const real_driver *R);
/* Is any stream capture (begun through the shim's doors) under way? */
bool capture_underway(void);
void capture_lock_for_fork(bool hold);
/* A call that may end captures without cuStreamEndCapture: claims them
 * before the real call (a stream's destruction, a context's end), and
 * capture_ending_done takes them away after it if `gone` (the call
 * succeeded, and for a primary context's release, it was the last), else
 * gives them back. The claim may be 0 (nothing to end). */
uint64_t capture_stream_ending(CUstream s);
uint64_t capture_context_ending(CUcontext ctx);
void capture_ending_done(uint64_t claimed, bool gone);
/* No capture can be under way: none counted, and every begin is seen
 * (capture.c). Then no capture question need be asked of the driver. */
bool capture_none(void);
/* Is a capture on stream s (an explicit stream, not a per-thread one)
 * counted: begun, or joined by a wait on an event recorded in a capture (a
 * fork), where the hooks saw it and recorded its stand-in? A stream that
 * captures otherwise was forked or began where the shim could not see:
 * nothing stands in for its earlier work. */
bool capture_begun_on(CUstream s);
/* The v1 begins (capture.c), exported under libcuda's names: cuda.h makes
 * cuStreamBeginCapture a macro for _v2, so their C names differ. */
/* Context creation's versions before v4 (door_driver.c): cuda.h declares
 * only v4, under the macro name cuCtxCreate. */
CUresult shim_cuCtxCreate_v1(CUcontext *c, unsigned flags, CUdevice dev) __asm__("cuCtxCreate");
CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext *c, CUexecAffinityParam *params, int n, unsigned flags,
                        CUdevice dev);
CUresult shim_cuStreamBeginCapture_v1(CUstream s) __asm__("cuStreamBeginCapture");
CUresult shim_cuStreamBeginCapture_v1_ptsz(CUstream s) __asm__("cuStreamBeginCapture_ptsz");
/* The v1 entry points of calls the driver door keeps books by
 * (door_driver.c), exported under libcuda's names: cuda.h makes those
 * names macros for the _v2. */
CUresult shim_cuStreamDestroy_v1(CUstream s) __asm__("cuStreamDestroy");
CUresult shim_cuCtxDestroy_v1(CUcontext ctx) __asm__("cuCtxDestroy");
CUresult shim_cuCtxPushCurrent_v1(CUcontext ctx) __asm__("cuCtxPushCurrent");
CUresult shim_cuCtxPopCurrent_v1(CUcontext *ctx) __asm__("cuCtxPopCurrent");
/* The interop context creators (door_driver.c), declared here: their
 * headers (cudaGL.h, cudaVDPAU.h) need OpenGL's and VDPAU's. */
CUresult cuGLCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice dev);
CUresult shim_cuGLCtxCreate_v1(CUcontext *c, unsigned flags, CUdevice dev)
    __asm__("cuGLCtxCreate");
CUresult cuVDPAUCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice dev, uint32_t vdp_device,
                             void *vdp_get_proc_address);
CUresult shim_cuVDPAUCtxCreate_v1(CUcontext *c, unsigned flags, CUdevice dev,
                                  uint32_t vdp_device, void *vdp_get_proc_address)
    __asm__("cuVDPAUCtxCreate");
CUresult shim_cuDevicePrimaryCtxRelease_v1(CUdevice dev) __asm__("cuDevicePrimaryCtxRelease");
CUresult shim_cuDevicePrimaryCtxReset_v1(CUdevice dev) __asm__("cuDevicePrimaryCtxReset");
void capture_restore(const real_driver *R, relaxed_scope rs);
/* A stream stops taking events (it is destroyed, or begins capturing):
 * records its stand-in, and the legacy stream's when legacy_too. */
void capture_stand_in(CUstream s, bool legacy_too);

/* Green contexts (green.c): they share their primary context's memory. */
void green_created(CUgreenCtx g, CUdevice dev);
/* Before the real destroy: a stand-in for its work; its streams forgotten.
 * Returns its device, or -1 if it was not known; *converted its converted
 * context (NULL if not known). */
int green_destroying(CUgreenCtx g, CUcontext *converted);
/* Before a stream is destroyed: true if it is a green context's, whose
 * stand-in is then recorded (capture_stand_in's cannot be). */
bool green_stream_destroyed(CUstream s);
/* Stream s of converted context `converted` is about to capture (a begin,
 * or a wait that may fork it into a capture, counted already): one stand-in
 * for the green context's work so far, since once it captures no green
 * event can be recorded, and a stream of it destroyed meanwhile is covered
 * by no later one; where none can be recorded (another of its streams
 * captures), the host waits for s (capture.c's before_begin_as). */
void green_stream_capturing(CUcontext converted, CUstream s);
/* Captures on streams of context c (NULL: unknown) began (by > 0) or
 * ended (by < 0); called with capture.c's lock held. */
void green_capture_changed(CUcontext c, int by);
void green_lock_for_fork(bool hold);
/* The context whose pool serves ctx: a green context's converted context
 * maps to its primary context; any other context to itself. */
CUcontext green_canonical(CUcontext ctx);
/* Is ctx a green context's converted context? */
bool green_converted(CUcontext ctx);
/* Has any green context been made and not destroyed? */
bool green_any(void);
/* Is the calling thread's current context a green context's? */
bool green_is_current(void);
/* The green contexts a seal must record cuGreenCtxRecordEvent on: for the
 * plain lane (plain) every live one on sp's device when sp is the primary
 * context's pool; for a stream lane, the green context of its stream `own`.
 * Returns how many (*out: malloc'd, the caller frees), or -1 when one of
 * them has a capture under way (no fence can be made now). */
int green_fence_targets(const real_driver *R, const shim_pool *sp, bool plain, CUstream own,
                        CUgreenCtx **out);

/* Streams we have seen created and not destroyed (streams.c). Returns
 * CUDA_SUCCESS, or the code the program's stream creation answers when the
 * new stream could not be ordered after the pools' last barriers
 * (fences_ordered_stream_made), or, with the driver door closed, its
 * context's id could not be had: it has been destroyed then. */
CUresult streams_add(CUstream s);
/* Is every stream the program makes seen here, i.e. is the library
 * interposing (preloaded) rather than loaded as a plug-in? */
bool streams_all_seen(void);
/* Is s a stream seen created and not yet destroyed? */
bool streams_known(CUstream s);
/* Before the stream is destroyed: gone from the registry (and buried:
 * streams_dead), and no copy taken under streams_use_begin is still in use
 * when this returns. */
void streams_remove(CUstream s);
/* The context went away: its streams are dead handles now. */
void streams_forget_context(CUcontext ctx);
void streams_forget_context_id(CUcontext ctx, unsigned long long id);
/* A pool is made for ctx (id `id`): streams under ctx with another id go. */
void streams_forget_other_ids(CUcontext ctx, unsigned long long id);
/* The driver refused to destroy s (after streams_remove): it is not dead. */
void streams_destroy_refused(CUstream s);
/* Was s seen destroyed and not made again since? Such a handle must not
 * reach the driver: a stream-ordered free naming it is refused as CUDA
 * refuses it (CUDA_ERROR_INVALID_HANDLE). */
bool streams_dead(CUstream s);
/* The context s had if s is one of the last 1024 streams destroyed (not
 * made again since, as the registry saw), registered with one; else NULL.
 * Answers also with the driver door closed, where streams_dead does not. */
CUcontext streams_dead_context(CUstream s);
typedef struct known_stream {
    CUstream stream;
    bool non_blocking;
} known_stream;
/* Copies up to n streams of context ctx into out; returns how many exist.
 * The handles may be passed to the driver only between streams_use_begin
 * and streams_use_end around the copy. */
size_t streams_of_context(CUcontext ctx, known_stream *out, size_t n);
void streams_use_begin(void);
void streams_use_end(void);
/* Around a change no seal may straddle (a capture beginning): waits for the
 * seals in flight and holds off new ones. */
void streams_change_begin(void);
void streams_change_end(void);
void streams_lock_for_fork(bool hold);
void streams_use_after_fork_child(void);
/* streams_use_begin unless the calling thread holds the lock already (in
 * either mode); returns whether it took it, for streams_use_leave. */
bool streams_use_enter(void);
void streams_use_leave(bool took);

/* ---- the allocation service (service.c) ---------------------------------------- */

typedef enum svc_status {
    SVC_OK,
    SVC_PASS,     /* not for the pool: call the real function */
    SVC_OOM,      /* out of memory: report written, error returned */
    SVC_INVALID,  /* a bad pointer or argument: logged once */
    SVC_UNSUPPORTED,
    SVC_DEAD_STREAM,       /* a stream-ordered call on a destroyed stream */
    SVC_CAPTURE_IMPLICIT,  /* on the legacy stream while a blocking stream captures */
    SVC_NO_CONTEXT,        /* on the legacy or per-thread stream with no context current */
    SVC_CONTEXT_DESTROYED, /* ... with a destroyed (or reset) context current */
} svc_status;

/* FREE_STREAM_DEVICE: stream-ordered, by a caller that named the block's
 * device (PyTorch's pluggable allocator), so that a legacy stream it names
 * is the one of the context the block was allocated in, the owning pool's,
 * whatever context is current: no need to ask the driver which one is. */
/* FREE_PLAIN_FENCED: a plain free that waits for its fence under every
 * free policy, BFCSHIM_FREE_POLICY=immediate included: a stream-ordered
 * free made plain because its block was recorded on a stream no event can
 * be waited for (recorded_streams.c), whose work may still use it. */
typedef enum free_kind { FREE_PLAIN, FREE_PLAIN_FENCED, FREE_STREAM, FREE_STREAM_DEVICE } free_kind;

/* The driver API's code for a service answer (the driver door and the C
 * interface; the runtime door has its own, with the last error set). */
CUresult svc_cuda_result(svc_status st);

/* Is the shim serving allocations (bfc mode, not a forked child, ...)? */
bool shim_active(void);
/* Do the driver door's functions serve from the pools (bfc mode, driver
 * hooks on)? */
bool shim_driver_door(void);
/* Do the driver door's pointer-taking calls (free, address range, pointer
 * attributes, IPC handle) recognise pooled pointers? Whenever the shim
 * serves, the driver door open or not. */
bool shim_pointer_door(void);
/* Do dlsym and cuGetProcAddress hand out the driver door? Whenever driver
 * hooks are on: in bfc mode to serve, in platform mode to count what
 * programs that find the driver by dlsym (XLA, TensorFlow, Numba) allocate. */
bool shim_driver_hooked(void);

/* The pool of the current context (created on first use); NULL when no
 * context is current or no pool can be made: then pass the call through. */
shim_pool *svc_current_pool(void);

/* ---- which pool serves an allocation, remembered (current_context.c) ------- */

/* How a door learns its pool when nothing is remembered: asks the driver
 * about `key` (a stream; NULL: the calling thread's current context), sets
 * *ctx to the context it found, returns its pool or NULL. */
typedef shim_pool *(*pool_lookup)(const real_driver *R, void *key, CUcontext *ctx);
/* The pool serving the calling thread's current context / explicit stream
 * s's context: the one remembered when no call since could have changed
 * it, else ask's answer (then remembered). */
shim_pool *current_context_pool(const real_driver *R, pool_lookup ask);
shim_pool *current_context_pool_unchecked(const real_driver *R, pool_lookup ask);
shim_pool *stream_context_pool(const real_driver *R, CUstream s, pool_lookup ask);
/* After a call that may have changed the calling thread's current context
 * (cuCtxSetCurrent, push, pop, a context created). */
void current_context_moved(void);
/* After a call that may have ended a context or stream any thread
 * remembers, or made one under a handle that was another's (a destroy, a
 * primary context's reset or release, cudaDeviceReset, a stream made). */
void remembered_pools_stale(void);
/* Times a door asked the driver for a context; remembered answers the
 * driver contradicted (BFCSHIM_CONTEXT_CACHE=check). */
extern atomic_uint_fast64_t shim_context_lookups, shim_context_cache_wrong;
/* Is `pool` the device's default memory pool (which the BFC pool stands in
 * for)? Other pools belong to the program: their calls pass through. */
bool svc_is_default_pool(shim_pool *sp, CUmemoryPool pool);
/* The pool a stream-ordered allocation on s would serve from, before the
 * door checks which memory pool the call means; NULL to pass it through.
 * None while s captures (the graph owns what it allocates); for an explicit
 * stream, its context's (a stream belongs to one device, whatever context is
 * current), created on first use; else current(), the door's pool of the
 * current context. */
shim_pool *svc_async_pool(CUstream s, bool per_thread, shim_pool *(*current)(void));
/* Is s a stream handle of the program's own, not 0 (the legacy or the
 * per-thread stream) or their named constants? */
bool svc_explicit_stream(CUstream s);
/* Does the device still allocate stream-ordered memory from its default
 * pool? cuDeviceSetMemPool (both doors) tells us when it stops. */
bool svc_default_pool_current(CUdevice dev);
void svc_note_device_pool(CUdevice dev, CUmemoryPool pool);
/* The program destroyed its pool `pool`: a device it was current for has
 * its default pool current again (cuda.h), which the shim serves. */
void svc_note_pool_destroyed(CUmemoryPool pool);
/* `stream` is only recorded in the trace; the lane decides reuse. */
/* Said by a door right before svc_alloc when it found sp as the pool of the
 * calling thread's current context (svc_current_pool, the runtime's): the
 * engine's CUDA calls then need no context switch, and none is asked for. */
void svc_next_alloc_in_current_context(void);
svc_status svc_alloc(shim_pool *sp, size_t size, uint32_t lane, CUstream stream,
                     CUdeviceptr *out, const char *api);
/* What a stream-ordered call on s meets: nothing in the way; a capture (its
 * allocations pass through, its frees are kept: the graph owns them); the
 * legacy stream while a blocking stream of its context captures, where CUDA
 * refuses stream-ordered work and invalidates those captures; or a stream
 * seen destroyed. */
typedef enum svc_stream_state {
    STREAM_USABLE,
    STREAM_CAPTURING,
    STREAM_LEGACY_BLOCKED,
    STREAM_DEAD,
} svc_stream_state;
/* Tensor.record_stream (recorded_streams.c): stream s used the live block
 * at p (allocation sequence number seq of pool sp); remembered until the
 * block's free. */
void recorded_stream_add(shim_pool *sp, CUdeviceptr p, uint64_t seq, CUstream s,
                         const char *api);
/* Before the free of p (a block of sp) on stream s (stream_ordered) or
 * plain: queues on s the waits for the streams the block was recorded on.
 * legacy_is_pools: handle 0 names the legacy stream of sp's context (the
 * caller named the block's device: FREE_STREAM_DEVICE), not the current
 * context's.
 * RS_PLAIN: free it as a plain free instead; RS_KEEP: do not free it (never
 * safe to hand out). *held: the block's record (NULL: none), which the
 * caller hands to recorded_streams_after_free once it knows whether the
 * block was freed (forgotten) or the free refused (kept for the next free).
 * *unusable: s's state where the record's decision found it unusable
 * (nothing queued on it), which the free must then act on without asking
 * again (svc_free_seen); STREAM_USABLE otherwise (usable, or not asked).
 * One atomic load while nothing is recorded. */
typedef enum rs_verdict { RS_AS_ASKED, RS_PLAIN, RS_KEEP } rs_verdict;
rs_verdict recorded_streams_before_free(shim_pool *sp, CUdeviceptr p, bool stream_ordered,
                                        CUstream s, bool legacy_is_pools, const char *api,
                                        svc_stream_state *unusable, void **held);
void recorded_streams_after_free(void *held, bool freed);
svc_status svc_free(CUdeviceptr ptr, free_kind kind, CUstream stream, bool per_thread,
                    const char *api);
/* svc_free of a stream-ordered free whose stream a caller already found
 * unusable (*seen: capturing, blocked or dead) and acted on (queued nothing
 * on it): decided on that answer, never freed in the stream's order; where
 * the refusal finds the legacy stream usable after all, the block is kept. */
svc_status svc_free_seen(CUdeviceptr ptr, free_kind kind, CUstream stream, bool per_thread,
                         svc_stream_state seen, const char *api);
/* Adjusts the device's free memory by what the current context's pool can
 * still give. A query that passes through both doors is adjusted once: the
 * runtime door calls svc_meminfo_begin, then the real runtime (which may
 * reach the driver door), and adjusts only if !svc_meminfo_adjusted(). */
void svc_adjust_meminfo(size_t *free_bytes, size_t total);
void svc_meminfo_begin(void);
bool svc_meminfo_adjusted(void);
/* A device's default memory pool, as the program sees it, is the pools the
 * shim serves it from (service.c, "the default pool's figures"): after the
 * real call succeeded on `pool`, these add the shim's figures to an
 * attribute read, restart the shim's high-water marks with the driver's,
 * and trim the shim's pools with the driver's; for any other pool they do
 * nothing. A query that passes through both doors is adjusted once, as for
 * meminfo: the runtime door calls svc_pool_query_begin, then the real
 * runtime, and adjusts only if !svc_pool_query_done(). */
void svc_pool_get_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
void svc_pool_set_attribute(CUmemoryPool pool, CUmemPool_attribute attr);
void svc_pool_trim(CUmemoryPool pool, size_t keep);
void svc_pool_query_begin(void);
bool svc_pool_query_done(void);
/* The process-wide unique buffer id of a pooled block (CUDA's
 * CU_POINTER_ATTRIBUTE_BUFFER_ID promise): the top bit set, then the pool's
 * serial number and the block's allocation sequence number. */
uint64_t svc_buffer_id(const shim_pool *sp, uint64_t seq);
/* IPC of a pooled pointer cannot be right: refuses it loudly. */
svc_status svc_ipc_check(CUdeviceptr ptr, const char *api);
svc_stream_state svc_stream_state_of(CUstream s, bool per_thread);
/* Platform mode bookkeeping: counts what passes through. platform_counting:
 * is this call one to count (platform mode, not the shim's own call)? */
bool platform_counting(void);
void platform_note_alloc(CUdeviceptr ptr, size_t size);
void platform_note_free(CUdeviceptr ptr);
typedef struct platform_counts {
    uint64_t num_allocs, num_frees, bytes_in_use, peak_bytes_in_use, largest_alloc_size;
} platform_counts;
void platform_get_counts(platform_counts *out);
void platform_lock_for_fork(bool lock);

/* The virtual memory door (door_vmm.c): physical memory the program makes
 * with cuMemCreate, per device. bytes, peak_bytes, creates: what went
 * around the pools (passthrough_vmm_*), while it lives; pooled_creates:
 * the allocations that came out of a pool's limit (their bytes are the
 * pool's bytes_lent); refused: creates the limit had no room for. */
#define SHIM_MAX_DEVICES 64
typedef struct vmm_door_counts {
    uint64_t bytes, peak_bytes, creates;
    uint64_t pooled_creates, refused;
} vmm_door_counts;
void vmm_door_get_counts(int dev, vmm_door_counts *out);
/* Sums over devices (peak: the sum of each device's peak). */
void vmm_door_total(vmm_door_counts *out);
void vmm_door_take_over_loans(shim_pool *sp);
void vmm_door_lock_for_fork(bool hold);
void vmm_door_after_fork_child(void);
/* Pitch and size of a pitched allocation: the width rounded up to the row
 * alignment the real driver uses on the pool's device; false when the
 * arguments are invalid or overflow. */
bool svc_pitch(shim_pool *sp, size_t width, size_t height, unsigned element_size,
               size_t *pitch, size_t *bytes);

/* Per-thread: set while the shim itself calls into the real runtime, so the
 * driver door lets those calls through untouched. */
extern _Thread_local int shim_tls_bypass;

/* Allocations passed to the real driver while the pool is active (capture,
 * other memory pools, no pool for the context). */
extern atomic_uint_fast64_t shim_passthrough_allocs;
/* Counts one such allocation (globally and in the current context's pool). */
void svc_note_passthrough(void);

/* ---- what the shim tells the user (record.c, stats_file.c, oom_report.c,
 * preallocation_hint.c) --- */

/* At exit another thread may hold a pool for good (waiting for a GPU that
 * never finishes): the trace and statistics writers give that pool up after
 * this long, and say so, rather than hang exit(). */
enum { EXIT_WAIT_MS = 100 };

/* BFCSHIM_TRACE: pools record through the engine's on_event hook, attached
 * here when a trace is wanted (false: not traced); pass-through calls and
 * failures outside the engine through these. */
bool record_attach(shim_pool *sp, bfc_backend *b);
/* The pool's context is gone: its live blocks are freed in the trace and
 * its channel is handed to the next pool. */
void record_detach(shim_pool *sp);
void record_alloc(uint64_t ptr, uint64_t size, CUstream stream);
void record_alloc_failure(uint64_t size, CUstream stream);
void record_free(uint64_t ptr, CUstream stream);
void record_flush(void);
/* The same at exit: a pool another thread holds for good is given up. */
void record_flush_at_exit(void);
void record_after_fork_child(void);

/* BFCSHIM_STATS_FILE / BFCSHIM_STATS. */
bool stats_write_file(const char *path, const char *who);
void stats_write_summary(int fd);
/* Called on the allocation path: writes the stats file when the user asked
 * for it by creating STATS_FILE.request (checked every 1024 allocations). */
void stats_poll_request(void);
void stats_at_exit(void);

/* An allocation the pool cannot serve: one line always; the full report
 * (memory map, largest blocks, hint) once per distinct situation. */
void oom_report(shim_pool *sp, size_t size, const char *api);
/* A request over half the pool's limit: a framework's own preallocation,
 * named once with the settings that avoid it (vmm: a cuMemCreate, XLA's
 * way; else an allocation from the pool, TensorFlow's). The report's
 * version: the refused request, a live block (the largest, or NULL) or the
 * loans over half the limit. */
void preallocation_hint(const shim_pool *sp, size_t size, const char *api, bool vmm);
void preallocation_report_hint(FILE *f, const bfc_stats *st, const bfc_live_info *largest,
                               size_t request, bool vmm);

/* ---- lifecycle (lifecycle.c) --------------------------------------------------- */

void shim_init(void);
extern atomic_bool shim_forked_child;

#endif
