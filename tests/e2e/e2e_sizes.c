/*
 * e2e_sizes.c - sizes no device has, through every door of the preloaded
 * shim: around every power of two from 2^40 to 2^64 (2^k - 1024 .. 2^k +
 * 1024, with the sizes that round onto 2^k at the default 512 B and at
 * 1 MiB), and SIZE_MAX. Each call must give CUDA's out-of-memory code
 * (cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY; NULL from the
 * PyTorch entry point), write one log line and leave the pool as it was:
 * nothing in use, and an ordinary allocation and free through the same door
 * still work. From 2^48 - 511 to 2^48 every door crashed: the sizes passed
 * the engine's check and rounded onto 2^48, one past its last size class.
 *
 *   sweep      the default pool (preallocated, over virtual memory)
 *   sweep-one-region, sweep-growth, sweep-align-1m: the same, the pool on
 *              one cuMemAlloc region, growing on demand, or at a 1 MiB
 *              alignment (meson sets the variables)
 */
#include <cuda_runtime_api.h>
#include <sys/types.h>

#include "e2e_cu.h"

#define MiB ((size_t)1 << 20)

static struct {
    int (*malloc_)(void **, size_t, int);
    int (*free_)(void *);
    int (*malloc_async)(void **, size_t, int, void *);
    int (*free_async)(void *, void *);
    void *(*torch_alloc)(ssize_t, int, void *);
    void (*torch_free)(void *, size_t, int, void *);
} A; /* include/bfcshim.h, as a program that never linked it finds it */

static cudaStream_t stream;

/* One door: allocate `size`, answering CUDA's code (0 for success) and the
 * pointer; and its free. */
typedef struct door {
    const char *name;
    int oom; /* the door's out-of-memory code */
    bool pitch;
    int (*alloc)(size_t size, void **p);
    int (*free_)(void *p);
} door;

static int rt_malloc(size_t n, void **p) { return cudaMalloc(p, n); }
static int rt_free(void *p) { return cudaFree(p); }
static int rt_malloc_async(size_t n, void **p) { return cudaMallocAsync(p, n, stream); }
static int rt_free_async(void *p) { return cudaFreeAsync(p, stream); }
static int rt_pitch(size_t n, void **p)
{
    size_t pitch = 0;
    return cudaMallocPitch(p, &pitch, n, 1);
}
static int cu_malloc(size_t n, void **p) { return D.MemAlloc((CUdeviceptr *)p, n); }
static int cu_free(void *p) { return D.MemFree((CUdeviceptr)p); }
static int cu_malloc_async(size_t n, void **p)
{
    return D.MemAllocAsync((CUdeviceptr *)p, n, (CUstream)stream);
}
static int cu_free_async(void *p) { return D.MemFreeAsync((CUdeviceptr)p, (CUstream)stream); }
static int api_malloc(size_t n, void **p) { return A.malloc_(p, n, 0); }
static int api_free(void *p) { return A.free_(p); }
static int api_malloc_async(size_t n, void **p) { return A.malloc_async(p, n, 0, stream); }
static int api_free_async(void *p) { return A.free_async(p, stream); }
/* bfcshim_torch_alloc takes a signed size: the sizes above SSIZE_MAX reach
 * it negative and are refused as such (one line, NULL all the same). */
static int torch_alloc(size_t n, void **p)
{
    *p = A.torch_alloc((ssize_t)n, 0, stream);
    return *p ? 0 : 2;
}
static int torch_free(void *p)
{
    A.torch_free(p, 0, 0, stream);
    return 0;
}

static const door doors[] = {
    {"cudaMalloc", cudaErrorMemoryAllocation, false, rt_malloc, rt_free},
    {"cudaMallocAsync", cudaErrorMemoryAllocation, false, rt_malloc_async, rt_free_async},
    {"cudaMallocPitch", cudaErrorMemoryAllocation, true, rt_pitch, rt_free},
    {"cuMemAlloc_v2", CUDA_ERROR_OUT_OF_MEMORY, false, cu_malloc, cu_free},
    {"cuMemAllocAsync", CUDA_ERROR_OUT_OF_MEMORY, false, cu_malloc_async, cu_free_async},
    {"bfcshim_malloc", CUDA_ERROR_OUT_OF_MEMORY, false, api_malloc, api_free},
    {"bfcshim_malloc_async", CUDA_ERROR_OUT_OF_MEMORY, false, api_malloc_async, api_free_async},
    {"bfcshim_torch_alloc", 2, false, torch_alloc, torch_free},
};

static void load(void)
{
    e2e_cu_load();
#define API(field, name) *(void **)&A.field = e2e_dlsym(RTLD_DEFAULT, name)
    API(malloc_, "bfcshim_malloc");
    API(free_, "bfcshim_free");
    API(malloc_async, "bfcshim_malloc_async");
    API(free_async, "bfcshim_free_async");
    API(torch_alloc, "bfcshim_torch_alloc");
    API(torch_free, "bfcshim_torch_free");
#undef API
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    CHECK_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
}

/* The sizes: 2^k + d for k = 40..64 (2^64 + d wraps to SIZE_MAX + 1 + d)
 * and d from -1024 to 1024, around 512 and 1 MiB granules' edges. */
static size_t sweep_sizes(size_t *out)
{
    static const long long d[] = {-1024, -513, -512, -511, -256, -1, 0, 1, 511, 1024};
    size_t n = 0;
    for (unsigned k = 40; k <= 64; k++)
        for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
            if (k == 64 && d[i] >= 0)
                continue;
            const size_t p = k == 64 ? 0 : (size_t)1 << k;
            out[n++] = p + (size_t)d[i];
        }
    out[n++] = ((size_t)1 << 48) - MiB; /* one 1 MiB granule under the limit */
    out[n++] = ((size_t)1 << 48) - MiB + 1;
    out[n++] = SIZE_MAX / 2;
    out[n++] = SIZE_MAX;
    return n;
}

static void sweep(void)
{
    load();
    size_t sizes[400];
    const size_t nsizes = sweep_sizes(sizes);
    for (size_t di = 0; di < sizeof doors / sizeof doors[0]; di++) {
        const door *o = &doors[di];
        for (size_t i = 0; i < nsizes; i++) {
            /* A pitch is the width rounded up to the driver's row alignment:
             * widths near SIZE_MAX overflow that and are invalid values. */
            if (o->pitch && sizes[i] > SIZE_MAX / 2)
                continue;
            void *p = NULL;
            const int r = o->alloc(sizes[i], &p);
            const int lines = shim_log_lines(NULL, 0);
            if (r != o->oom || p != NULL || lines != 1)
                fprintf(stderr, "%s(%zu): %d, %p, %d log lines\n", o->name, sizes[i], r, p,
                        lines);
            CHECK_EQ(r, o->oom);
            CHECK(p == NULL);
            CHECK_EQ(lines, 1);
        }
        CHECK_EQ(shim_stat_number("bytes_in_use"), 0);
        /* The pool still serves, through the same door. */
        void *p = NULL;
        CHECK_EQ(o->alloc(MiB, &p), 0);
        CHECK(p != NULL && fakecuda()->is_device_pointer((uint64_t)(uintptr_t)p));
        CHECK_EQ(shim_stat_number("bytes_in_use"), (long long)MiB);
        CHECK_EQ(o->free_(p), 0);
        CHECK_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        CHECK_EQ(shim_stat_number("bytes_in_use"), 0);
        CHECK_EQ(shim_log_lines(NULL, 0), 0);
    }
    CHECK_EQ(shim_stat_number("num_allocs"), (long long)(sizeof doors / sizeof doors[0]));
}

int main(int argc, char **argv)
{
    static const e2e_scenario scenarios[] = {
        {"sweep", sweep}, {"sweep-growth", sweep}, {"sweep-align-1m", sweep}};
    return e2e_main("e2e_sizes", scenarios, sizeof scenarios / sizeof scenarios[0], argc, argv);
}
