/*
 * e2e_rt.h - helpers for the end-to-end programs that use the CUDA runtime
 * (e2e_runtime, e2e_fences, e2e_queries, e2e_drvfail, e2e_race).
 */
#ifndef BFCSHIM_TESTS_E2E_RT_H
#define BFCSHIM_TESTS_E2E_RT_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include "e2e.h"

/* cudaMalloc that must succeed: a failure ends the program, failed. */
static inline char *alloc_ok(size_t n)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess || !p)
        e2e_alloc_failed("cudaMalloc", n, (int)e);
    return p;
}

/* What cudaMemGetInfo says the program can still get. */
static inline size_t free_memory(void)
{
    size_t f = 0, t = 0;
    CHECK_EQ(cudaMemGetInfo(&f, &t), cudaSuccess);
    return f;
}

/*
 * The one-hole setting of the programs that check reuse under queued work
 * (e2e_fences, e2e_drvfail): the pool is filled around one 1 MiB hole, so
 * the next 1 MiB allocation can only land in the block just freed, and
 * work queued before the free must have run by then.
 */
#define E2E_HOLE (UINT64_C(1) << 20)

/* The 1 MiB block *hole, and a filler that leaves less than 1 MiB anywhere
 * else in the pool. */
static inline char *fill_but_hole(char **hole)
{
    *hole = alloc_ok(E2E_HOLE);
    return alloc_ok(free_memory() - E2E_HOLE / 2);
}

/* The work the tests queue on the hole: it writes it, as a kernel would. */
static inline void write_pattern(void *arg) { memset(arg, 0x5a, E2E_HOLE); }

/* The same, saying that it ran: work whose queue the check cannot read (a
 * fork's captured operations stay queued, another device's stream went). */
static bool earlier_work_ran;
static inline void earlier_work(void *arg)
{
    write_pattern(arg);
    earlier_work_ran = true;
}

/* A non-blocking stream of device 1 (*s1), device 0's pool filled around
 * its hole (*hole; returns the filler), and earlier_work queued on *s1 on
 * the hole; device 1 is current on return. */
static inline char *hole_under_other_device_work(cudaStream_t *s1, char **hole)
{
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    CHECK_EQ(cudaStreamCreateWithFlags(s1, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    char *filler = fill_but_hole(hole);
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    earlier_work_ran = false;
    CHECK_EQ(fakecuda()->launch(*s1, earlier_work, *hole), 0);
    return filler;
}

/* q was allocated after the hole was freed under work queued on `s`: if it
 * is the hole, that work must have completed first; and the shim never
 * touched a stale handle on the way. */
static inline void expect_safe(const char *hole, const char *q, void *s)
{
    uint64_t left = fakecuda()->pending(s);
    if (q == hole && left) {
        fprintf(stderr, "the freed block was handed out with %llu operation(s) still "
                        "queued before its free\n", (unsigned long long)left);
        e2e_failures++;
    }
    CHECK_EQ(fake_stats().stale_handle_uses, 0);
}

/* Device dev's primary context reset, then retained again and made current,
 * through driver functions found with dlsym: with the driver door closed
 * (BFCSHIM_DRIVER_HOOKS=0) the shim sees none of it, and the new context
 * may have the dead one's handle. */
static inline void unseen_primary_reset(CUdevice dev)
{
    typedef CUresult (*reset_fn)(CUdevice);
    typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
    typedef CUresult (*setcur_fn)(CUcontext);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    reset_fn reset = (reset_fn)dlsym(h, "cuDevicePrimaryCtxReset_v2");
    retain_fn retain = (retain_fn)dlsym(h, "cuDevicePrimaryCtxRetain");
    setcur_fn setcur = (setcur_fn)dlsym(h, "cuCtxSetCurrent");
    CHECK(reset && retain && setcur);
    CHECK_EQ(reset(dev), CUDA_SUCCESS);
    CUcontext c = NULL;
    CHECK_EQ(retain(&c, dev), CUDA_SUCCESS);
    CHECK_EQ(setcur(c), CUDA_SUCCESS);
}

#endif
