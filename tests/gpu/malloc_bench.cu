/*
 * malloc_bench.cu - what one allocation and free cost on the real driver:
 * cudaMalloc+cudaFree and cudaMallocAsync+cudaFreeAsync pairs, 512 B to
 * 1 GiB. Run it natively and under LD_PRELOAD=libbfcshim.so; the same
 * binary, so the difference is the shim (or the driver) alone.
 *
 * The first allocation is timed alone and printed first (api "first
 * cudaMalloc"): under the shim it takes the pool, which over virtual memory
 * maps the whole preallocated limit granule by granule, so it is the pool's
 * start-up cost; natively, the driver's first allocation.
 *
 * Each pair is timed on its own (host clock: both calls return to the host;
 * a native cudaFree may synchronise, which is part of its cost) after a
 * warm-up that also makes the shim take its pool; the median and the 10th
 * and 90th percentiles of up to 2000 pairs (or 0.5 s) per size are printed
 * as one JSON object per line. A kernel touches each block, so the pairs are
 * not freed untouched (which a driver could shortcut).
 */
#include <algorithm>
#include <chrono>
#include <cuda_runtime.h>
#include <stdio.h>
#include <vector>

__global__ void touch(char *p) { p[threadIdx.x] = 1; }

static double now_us()
{
    return std::chrono::duration<double, std::micro>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

static void report(const char *api, size_t size, std::vector<double> &t)
{
    std::sort(t.begin(), t.end());
    size_t n = t.size();
    printf("{\"api\": \"%s\", \"size\": %zu, \"pairs\": %zu, \"us_median\": %.3f, "
           "\"us_p10\": %.3f, \"us_p90\": %.3f}\n",
           api, size, n, t[n / 2], t[n / 10], t[n * 9 / 10]);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    const char *label = argc > 1 ? argv[1] : "run";
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no GPU: skipping\n");
        return 77;
    }
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
        return 1;
    void *w = NULL;
    double t0 = now_us();
    if (cudaMalloc(&w, 1 << 20) != cudaSuccess) /* the shim's pool is taken here */
        return 1;
    std::vector<double> first{now_us() - t0};
    cudaFree(w);
    fprintf(stderr, "malloc_bench (%s)\n", label);
    report("first cudaMalloc", 1 << 20, first);
    const size_t sizes[] = {512, 4096, 65536, 1u << 20, 16u << 20, 256u << 20, 1u << 30};
    for (int async = 0; async < 2; async++)
        for (size_t size : sizes) {
            std::vector<double> t;
            double t_end = now_us() + 500e3;
            for (int i = 0; i < 2000 + 5 && now_us() < t_end; i++) {
                void *p = NULL;
                double t0 = now_us();
                cudaError_t e = async ? cudaMallocAsync(&p, size, s) : cudaMalloc(&p, size);
                if (e != cudaSuccess) {
                    fprintf(stderr, "allocation of %zu failed: %s\n", size, cudaGetErrorName(e));
                    return 1;
                }
                double t1 = now_us();
                touch<<<1, 32, 0, s>>>((char *)p);
                double t2 = now_us();
                e = async ? cudaFreeAsync(p, s) : cudaFree(p);
                double t3 = now_us();
                if (e != cudaSuccess)
                    return 1;
                if (i >= 5) /* warm-up pairs are not counted */
                    t.push_back((t1 - t0) + (t3 - t2));
            }
            cudaStreamSynchronize(s);
            report(async ? "cudaMallocAsync+cudaFreeAsync" : "cudaMalloc+cudaFree", size, t);
        }
    cudaStreamDestroy(s);
    return 0;
}
