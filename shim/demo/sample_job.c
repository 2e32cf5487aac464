/*
 * sample_job.c - the demo's stand-in training job (bfcshim demo,
 * scripts/demo.sh), shipped in the Python package as bin/bfcshim-sample-job:
 * STEPS steps of 20 cudaMalloc/cudaFree through the CUDA runtime (1 to 20
 * MiB, 210 MiB live at each step's peak), timed from inside the job.
 *
 *   bfcshim-sample-job [STEPS]     (default 4)
 *
 * It prints a loss line for each of the first four steps and the last, then
 * the job's times split three ways, so that the pool's one-time setup is not
 * mistaken for its cost per allocation:
 *
 *   context: the first CUDA call (cudaFree(0): the fake or real context)
 *   first step: the first allocations; under the shim, taking the pool
 *               (the preallocation of BFCSHIM_MEM_FRACTION of the GPU)
 *   steady state: the mean time of the other steps, in us/step
 *
 * Built against the CUDA runtime's soname only (libcudart.so.13): `bfcshim
 * run --fake-gpu` puts the fake one first in the loader's path; on a GPU
 * machine the toolkit's serves it.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int step(int s)
{
    void *p[20];
    for (int i = 0; i < 20; i++) {
        cudaError_t e = cudaMalloc(&p[i], (size_t)(i + 1) << 20);
        if (e != cudaSuccess) {
            fprintf(stderr, "bfcshim-sample-job: cudaMalloc(%d MiB) failed at step %d: %s\n",
                    i + 1, s, cudaGetErrorString(e));
            return 1;
        }
    }
    for (int i = 19; i >= 0; i--)
        cudaFree(p[i]);
    return 0;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 4;
    if (steps < 1) {
        fprintf(stderr, "usage: bfcshim-sample-job [STEPS]   (STEPS >= 1)\n");
        return 2;
    }
    double t0 = now_ms();
    cudaError_t e = cudaFree(0);
    if (e != cudaSuccess) {
        fprintf(stderr, "bfcshim-sample-job: no CUDA device: %s\n", cudaGetErrorString(e));
        return 1;
    }
    double t1 = now_ms(), t2 = t1;
    for (int s = 0; s < steps; s++) {
        if (step(s) != 0)
            return 1;
        if (s == 0)
            t2 = now_ms();
        if (s < 4 || s == steps - 1)
            printf("step %d loss %.4f\n", s, 2.0 / (s + 1));
        fflush(stdout);
    }
    double t3 = now_ms();
    printf("context %.3f ms, first step %.3f ms", t1 - t0, t2 - t1);
    if (steps > 1)
        printf(", steady state %.2f us/step over %d steps", (t3 - t2) * 1e3 / (steps - 1),
               steps - 1);
    printf("\n");
    return 0;
}
