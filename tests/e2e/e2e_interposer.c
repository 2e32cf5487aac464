/*
 * e2e_interposer.c - another interposer, as a user may stack with bfcshim
 * (a container's vGPU layer, a profiler): a preloaded library with its own
 * cuMemAlloc_v2 that forwards to the next definition, found the usual way,
 * with dlsym(RTLD_NEXT, ...). Built as libe2einterposer.so for e2e_stacked,
 * and for e2e_fences unseen-end, where it begins a capture through the
 * driver's own function, which the shim, preloaded before it, never sees.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>

#define EXPORT __attribute__((visibility("default")))

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);

static int calls;

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    alloc_fn next = (alloc_fn)dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    if (!next || next == cuMemAlloc_v2) /* its own function back: recursion */
        return CUDA_ERROR_UNKNOWN;
    calls++;
    return next(p, n);
}

/* What dlsym(RTLD_NEXT) answers this library, and how often it forwarded.
 * Not a tail call: dlsym would then see this function's caller as its own
 * and search after the program instead. */
EXPORT void *interposer_next(void)
{
    void *volatile next = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    return next;
}
EXPORT void *interposer_own(void) { return (void *)cuMemAlloc_v2; }
EXPORT int interposer_calls(void) { return calls; }

/* Begins a capture with the next definition of cuStreamBeginCapture_v2
 * after this library: the driver's, past the shim (libcuda must be in the
 * global scope, as cudart opens it). */
typedef CUresult (*begin_fn)(CUstream, CUstreamCaptureMode);
EXPORT CUresult interposer_begin_capture(CUstream s, CUstreamCaptureMode mode)
{
    begin_fn next = (begin_fn)dlsym(RTLD_NEXT, "cuStreamBeginCapture_v2");
    return next ? next(s, mode) : CUDA_ERROR_NOT_FOUND;
}

/* Ends a capture with the next definition of cuStreamEndCapture after this
 * library (the driver's, past the shim): an end the shim never sees
 * (e2e_fences stale-begun). */
typedef CUresult (*end_fn)(CUstream, CUgraph *);
EXPORT CUresult interposer_end_capture(CUstream s, CUgraph *g)
{
    end_fn next = (end_fn)dlsym(RTLD_NEXT, "cuStreamEndCapture");
    return next ? next(s, g) : CUDA_ERROR_NOT_FOUND;
}
