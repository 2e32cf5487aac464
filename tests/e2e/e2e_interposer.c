/*
 * e2e_interposer.c - another interposer, as a user may stack with bfcshim
 * (a container's vGPU layer, a profiler): a preloaded library with its own
 * cuMemAlloc_v2 that forwards to the next definition, found the usual way,
 * with dlsym(RTLD_NEXT, ...). Built as libe2einterposer.so for e2e_stacked.
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
