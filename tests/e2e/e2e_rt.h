/*
 * e2e_rt.h - helpers for the end-to-end programs that use the CUDA runtime
 * (e2e_runtime, e2e_fences, e2e_queries).
 */
#ifndef BFCSHIM_TESTS_E2E_RT_H
#define BFCSHIM_TESTS_E2E_RT_H

#include <cuda_runtime_api.h>

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

#endif
