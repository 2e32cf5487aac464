/*
 * first_program.cu - the program a user writes first, knowing nothing of
 * bfcshim: cudaMalloc is its first CUDA call, a kernel squares a vector, the
 * result comes back and is checked, everything is freed.
 *
 * Built twice by meson: with nvcc's default static cudart (the runtime is
 * inside the executable, so only the driver door can serve it: cudart finds
 * the driver with dlopen + dlsym("cuGetProcAddress_v2")) and with the shared
 * cudart (the runtime door). tests/gpu/check_first_program.py runs each
 * under the shim and checks from the stats file that the pool served it.
 * Exits 77 when there is no GPU or no driver.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

__global__ void square(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * x[i];
}

int main(void)
{
    const int n = 1 << 22;
    float *d = NULL;
    cudaError_t e = cudaMalloc((void **)&d, n * sizeof(float));
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        printf("no GPU (%s): skipping\n", cudaGetErrorName(e));
        return 77;
    }
    if (e != cudaSuccess) {
        fprintf(stderr, "cudaMalloc: %s\n", cudaGetErrorString(e));
        return 1;
    }
    float *h = (float *)malloc(n * sizeof(float));
    for (int i = 0; i < n; i++)
        h[i] = (float)(i % 1000);
    int bad = 0;
    if (cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
        bad++;
    square<<<(n + 255) / 256, 256>>>(d, n);
    if (cudaGetLastError() != cudaSuccess)
        bad++;
    if (cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
        bad++;
    for (int i = 0; i < n; i++)
        if (h[i] != (float)(i % 1000) * (float)(i % 1000)) {
            bad++;
            break;
        }
    if (cudaFree(d) != cudaSuccess)
        bad++;
    free(h);
    printf("first_program: %s\n", bad ? "WRONG" : "ok");
    return bad ? 1 : 0;
}
