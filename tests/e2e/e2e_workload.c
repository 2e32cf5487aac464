/*
 * e2e_workload.c - a stand-in training job for `bfcshim run` and `bfcshim ab`
 * tests: a few "steps" of cudaMalloc/cudaFree through the runtime, printing
 * a loss and a throughput line per step as a real job would, and the
 * LD_PRELOAD it saw. Exits with the status given as its first argument.
 *
 *   e2e_workload EXIT_STATUS [STEPS]
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int status = argc > 1 ? atoi(argv[1]) : 0;
    int steps = argc > 2 ? atoi(argv[2]) : 3;
    const char *preload = getenv("LD_PRELOAD");
    printf("LD_PRELOAD=%s\n", preload ? preload : "");
    for (int s = 0; s < steps; s++) {
        void *p[20];
        for (int i = 0; i < 20; i++)
            if (cudaMalloc(&p[i], (size_t)(i + 1) << 20) != cudaSuccess) {
                fprintf(stderr, "cudaMalloc failed at step %d\n", s);
                return 1;
            }
        for (int i = 19; i >= 0; i--)
            cudaFree(p[i]);
        printf("step %d loss %.4f samples/s %.1f\n", s, 2.0 / (s + 1), 1000.0 + s);
        fflush(stdout);
    }
    return status;
}
