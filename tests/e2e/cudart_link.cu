/*
 * cudart_link.cu - the smallest CUDA program a user might bring: a block
 * allocated, a pattern copied through it, freed. No kernel, so that the
 * fake GPU (which runs none) can run it whole.
 *
 * Built by nvcc twice (tests/meson.build): with its default static cudart,
 * which the fake GPU cannot serve (bfcshim run and the fake driver say so),
 * and with -cudart shared, which runs there on the fake libcudart, pooled.
 * tests/e2e/test_cudart_link.py runs both.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    enum { N = 1 << 20 };
    static char in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = (char)(i * 7);
    void *d = NULL;
    cudaError_t e = cudaMalloc(&d, N);
    if (e != cudaSuccess) {
        fprintf(stderr, "cudaMalloc: %d %s\n", (int)e, cudaGetErrorString(e));
        return 1;
    }
    if (cudaMemcpy(d, in, N, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(out, d, N, cudaMemcpyDeviceToHost) != cudaSuccess || memcmp(in, out, N) != 0 ||
        cudaFree(d) != cudaSuccess) {
        fprintf(stderr, "cudart_link: the copy through device memory went wrong\n");
        return 1;
    }
    printf("cudart_link: ok\n");
    return 0;
}
