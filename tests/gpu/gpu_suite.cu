/*
 * gpu_suite.cu - the shim on a real GPU, with the real driver and runtime.
 * Built with nvcc against the shared cudart (so the runtime door applies)
 * and run under LD_PRELOAD=libbfcshim.so by meson. Exits 77 (skip) when no
 * GPU or no driver is present, as in CI.
 *
 *   reuse        kernels fill blocks with patterns and verify them on several
 *                non-blocking streams while other streams free (cudaFree) and
 *                reallocate: any early reuse corrupts a pattern
 *   reuse-async  the same with cudaMallocAsync / cudaFreeAsync per stream
 *   capture      allocations inside a stream capture, the graph launched;
 *                plain allocations and frees meanwhile must not break it
 *   oom          out of memory with the runtime's last error, then recovery
 *   ipc          an IPC handle of a pooled block is refused
 *   meminfo      cudaMemGetInfo reports what the pool can still give
 */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                          \
        }                                                                        \
    } while (0)
#define CUDA_OK(call) CHECK((call) == cudaSuccess)

__global__ void fill(unsigned *p, size_t n, unsigned pattern, unsigned spin)
{
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        unsigned v = pattern ^ (unsigned)i;
        for (unsigned k = 0; k < spin; k++) /* keeps the stream busy for a while */
            v = v * 1664525u + 1013904223u, v = (v - 1013904223u) * 4276115653u;
        p[i] = v;
    }
}

__global__ void verify(const unsigned *p, size_t n, unsigned pattern, unsigned long long *bad)
{
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        if (p[i] != (pattern ^ (unsigned)i))
            atomicAdd(bad, 1ull);
}

static bool under_shim(void)
{
    return dlsym(RTLD_DEFAULT, "bfcshim_write_stats") != NULL;
}

enum { NSTREAMS = 4, ROUNDS = 300 };

static void reuse(bool async)
{
    cudaStream_t s[NSTREAMS];
    for (int i = 0; i < NSTREAMS; i++)
        CUDA_OK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
    unsigned long long *bad;
    CUDA_OK(cudaMalloc(&bad, sizeof *bad));
    CUDA_OK(cudaMemset(bad, 0, sizeof *bad));
    CUDA_OK(cudaDeviceSynchronize());
    unsigned rng = 12345;
    for (int r = 0; r < ROUNDS; r++) {
        int k = r % NSTREAMS;
        rng = rng * 1103515245u + 12345u;
        size_t n = ((size_t)(rng >> 8) % (4u << 20)) / 4 + 1024; /* up to 4 MiB */
        unsigned *p = NULL;
        cudaError_t e = async ? cudaMallocAsync((void **)&p, n * 4, s[k])
                              : cudaMalloc((void **)&p, n * 4);
        CHECK(e == cudaSuccess);
        if (e != cudaSuccess)
            break;
        unsigned pattern = 0x9e3779b9u * (unsigned)(r + 1);
        fill<<<64, 256, 0, s[k]>>>(p, n, pattern, 64);
        verify<<<64, 256, 0, s[k]>>>(p, n, pattern, bad);
        /* Freed while the kernels may still run: the shim must not hand the
         * block to another stream before they finish. */
        CUDA_OK(async ? cudaFreeAsync(p, s[k]) : cudaFree(p));
    }
    CUDA_OK(cudaDeviceSynchronize());
    unsigned long long h = 0;
    CUDA_OK(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h == 0);
    if (h)
        fprintf(stderr, "%llu corrupted words\n", h);
    CUDA_OK(cudaFree(bad));
    for (int i = 0; i < NSTREAMS; i++)
        CUDA_OK(cudaStreamDestroy(s[i]));
}

static void reuse_plain(void) { reuse(false); }
static void reuse_async(void) { reuse(true); }

static void capture(void)
{
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned long long *bad;
    CUDA_OK(cudaMalloc(&bad, sizeof *bad));
    CUDA_OK(cudaMemset(bad, 0, sizeof *bad));
    CUDA_OK(cudaDeviceSynchronize());
    cudaGraph_t g;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    unsigned *p = NULL;
    CUDA_OK(cudaMallocAsync((void **)&p, 1 << 20, s)); /* the graph owns it */
    fill<<<64, 256, 0, s>>>(p, (1 << 20) / 4, 7u, 8);
    verify<<<64, 256, 0, s>>>(p, (1 << 20) / 4, 7u, bad);
    CUDA_OK(cudaFreeAsync(p, s));
    /* Meanwhile, plain allocations and frees (relaxed mode allows them). */
    for (int i = 0; i < 8; i++) {
        void *q = NULL;
        CUDA_OK(cudaMalloc(&q, 1 << 20));
        CUDA_OK(cudaFree(q));
    }
    CUDA_OK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t x;
    CUDA_OK(cudaGraphInstantiate(&x, g, 0));
    for (int i = 0; i < 3; i++)
        CUDA_OK(cudaGraphLaunch(x, s));
    CUDA_OK(cudaStreamSynchronize(s));
    unsigned long long h = 1;
    CUDA_OK(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h == 0);
    CUDA_OK(cudaGraphExecDestroy(x));
    CUDA_OK(cudaGraphDestroy(g));
    CUDA_OK(cudaFree(bad));
    CUDA_OK(cudaStreamDestroy(s));
}

static void oom(void)
{
    size_t f = 0, t = 0;
    CUDA_OK(cudaMemGetInfo(&f, &t));
    void *big = NULL, *more = NULL;
    /* More than the pool can give: refused with the runtime's error. */
    CHECK(cudaMalloc(&more, f + (64u << 20)) == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaSuccess);
    /* Fill it, fail, free, succeed. */
    CUDA_OK(cudaMalloc(&big, f - (256u << 20)));
    CHECK(cudaMalloc(&more, 512u << 20) == cudaErrorMemoryAllocation);
    cudaGetLastError();
    CUDA_OK(cudaFree(big));
    CUDA_OK(cudaMalloc(&more, 512u << 20));
    CUDA_OK(cudaFree(more));
}

static void ipc(void)
{
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, 1 << 20));
    cudaIpcMemHandle_t h;
    CHECK(cudaIpcGetMemHandle(&h, p) == cudaErrorNotSupported);
    cudaGetLastError();
    CUDA_OK(cudaFree(p));
}

static void meminfo(void)
{
    size_t f0 = 0, t = 0, f1 = 0;
    CUDA_OK(cudaMemGetInfo(&f0, &t));
    CHECK(f0 <= (size_t)(0.75 * (double)t) + (2u << 20)); /* the default fraction */
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, 256u << 20));
    CUDA_OK(cudaMemGetInfo(&f1, &t));
    CHECK(f0 - f1 == (256u << 20));
    CUDA_OK(cudaFree(p));
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } scenarios[] = {{"reuse", reuse_plain}, {"reuse-async", reuse_async}, {"capture", capture},
                     {"oom", oom},           {"ipc", ipc},                 {"meminfo", meminfo}};
    if (argc != 2) {
        fprintf(stderr, "usage: gpu_suite SCENARIO\n");
        return 2;
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("no GPU: skipping\n");
        return 77;
    }
    if (!under_shim()) {
        fprintf(stderr, "gpu_suite: libbfcshim.so is not preloaded\n");
        return 1;
    }
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
        if (strcmp(argv[1], scenarios[i].name) == 0) {
            scenarios[i].fn();
            printf("%s: %s\n", argv[1], failures ? "FAILED" : "ok");
            return failures ? 1 : 0;
        }
    fprintf(stderr, "gpu_suite: no scenario '%s'\n", argv[1]);
    return 2;
}
