/*
 * e2e_ordered_race.c - races of the ordered state (fences.c) made certain
 * with lock_delay.so preloaded ahead of the shim (it holds one thread inside
 * a window of the shim's locking while the other runs). Scenario:
 *
 *   stream-during-pool  a non-blocking stream is made in one thread while
 *                       the first allocation of another thread creates the
 *                       context's pool: after both, the pool must not be
 *                       ordered (its plain frees must wait for that stream's
 *                       work). The stream's thread registers the stream
 *                       after the pool copied the registry, and looks at the
 *                       pool's state before the pool stores it.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "e2e.h"

#define MiB (UINT64_C(1) << 20)

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*CtxCreate)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice);
    CUresult (*CtxDestroy)(CUcontext);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
} D;

static struct {
    void (*arm)(void);
    void (*disarm)(void);
    int (*wait_window)(int);
    void (*done)(void);
} L;

static CUcontext ctx;
static CUstream made;
static int window_opened;

static void write_pattern(void *arg) { memset(arg, 0x5a, 2 * MiB); }

static void *stream_maker(void *arg)
{
    (void)arg;
    CHECK_EQ(D.CtxSetCurrent(ctx), CUDA_SUCCESS);
    window_opened = L.wait_window(5000);
    CHECK_EQ(D.StreamCreate(&made, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    L.done();
    return NULL;
}

static void stream_during_pool(void)
{
    CUdevice dev;
    CHECK_EQ(D.Init(0), CUDA_SUCCESS);
    CHECK_EQ(D.DeviceGet(&dev, 0), CUDA_SUCCESS);
    CHECK_EQ(D.CtxCreate(&ctx, NULL, 0, dev), CUDA_SUCCESS);
    pthread_t t;
    pthread_create(&t, NULL, stream_maker, NULL);
    CUdeviceptr p = 0, q = 0;
    L.arm();
    CHECK_EQ(D.MemAlloc(&p, 2 * MiB), CUDA_SUCCESS); /* the pool is made here */
    L.disarm();
    pthread_join(t, NULL);
    CHECK(window_opened);
    /* The pool's whole limit (BFCSHIM_MEM_LIMIT=2MiB) is p: the next
     * allocation can only be p, and only once the stream's work is done. */
    CHECK_EQ(fakecuda()->launch(made, write_pattern, (void *)(uintptr_t)p), 0);
    CHECK_EQ(D.MemFree(p), CUDA_SUCCESS);
    CHECK_EQ(D.MemAlloc(&q, 2 * MiB), CUDA_SUCCESS);
    if (q == p && fakecuda()->pending(made)) {
        fprintf(stderr, "the freed block was handed out with the non-blocking stream's work "
                        "still queued: the pool went ordered with that stream alive\n");
        e2e_failures++;
    }
    fakecuda()->complete_all();
    CHECK_EQ(D.MemFree(q), CUDA_SUCCESS);
    CHECK_EQ(D.StreamDestroy(made), CUDA_SUCCESS);
    CHECK_EQ(D.CtxDestroy(ctx), CUDA_SUCCESS);
}

int main(int argc, char **argv)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    L.arm = (void (*)(void))dlsym(RTLD_DEFAULT, "lock_delay_arm");
    L.disarm = (void (*)(void))dlsym(RTLD_DEFAULT, "lock_delay_disarm");
    L.wait_window = (int (*)(int))dlsym(RTLD_DEFAULT, "lock_delay_wait_window");
    L.done = (void (*)(void))dlsym(RTLD_DEFAULT, "lock_delay_done");
    if (!h || !L.arm || !L.disarm || !L.wait_window || !L.done) {
        fprintf(stderr, "needs libcuda.so.1 and lock_delay.so preloaded: skipped\n");
        return 77;
    }
#define LOOK(f, n) *(void **)&D.f = dlsym(h, n)
    LOOK(Init, "cuInit");
    LOOK(DeviceGet, "cuDeviceGet");
    LOOK(CtxCreate, "cuCtxCreate_v4");
    LOOK(CtxDestroy, "cuCtxDestroy_v2");
    LOOK(CtxSetCurrent, "cuCtxSetCurrent");
    LOOK(StreamCreate, "cuStreamCreate");
    LOOK(StreamDestroy, "cuStreamDestroy_v2");
    LOOK(MemAlloc, "cuMemAlloc_v2");
    LOOK(MemFree, "cuMemFree_v2");
    static const e2e_scenario scenarios[] = {
        {"stream-during-pool", stream_during_pool},
    };
    return e2e_main("e2e_ordered_race", scenarios, sizeof scenarios / sizeof scenarios[0], argc,
                    argv);
}
