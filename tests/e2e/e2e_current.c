/*
 * e2e_current.c - the pool a cudaMalloc or cuMemAlloc is served from follows
 * the calling thread's current context however it changes, while a steady
 * stream of allocations asks the driver nothing (the shim remembers the
 * answer per thread, shim/lib/current_context.c). Two fake devices; each
 * allocation's context is read back with cuPointerGetAttribute.
 *
 *   follows       every way a program makes a context current: cudaSetDevice,
 *                 cuCtxSetCurrent, push and pop (v2, and v1 through
 *                 cuGetProcAddress as an old binary gets them), a context
 *                 created (cuCtxCreate, the OpenGL and VDPAU creators) and
 *                 destroyed, found by linking, by dlsym and by
 *                 cuGetProcAddress; and 0 cuCtxGetCurrent per allocation
 *                 in between
 *   threads       two threads on two devices, interleaved: each keeps its own
 *   streams       a stream-ordered allocation on an explicit stream comes from
 *                 its context's pool, asking nothing in steady state on two
 *                 streams in turn; a
 *                 destroyed stream's handle given to a new stream of the
 *                 other device (FAKECUDA_REUSE_STREAM_HANDLES) is served there
 *   green-gone    a green context destroyed on another thread: an allocation
 *                 in its (dead) context is no longer served from the pool
 *   detach        CUDA 2.0's cuCtxDetach (PyCUDA's Context.detach): counting
 *                 down leaves the context, counting to nothing destroys and
 *                 pops it, and the context underneath serves (-off: asking
 *                 every time); detach-reuse: a new context under the
 *                 detached one's handle gets a pool of its own
 *   unseen-check  BFCSHIM_CONTEXT_CACHE=check: a change made where no hook
 *                 sees it (the fake's stand-in for a private table) is caught,
 *                 served right, counted and said once
 *   unseen-off    BFCSHIM_CONTEXT_CACHE=off: served right, asking every time
 *   detach        (audit) cuCtxDetach, the deprecated usage-count destroy that
 *                 PyCUDA's Context.detach calls, pops and destroys the
 *                 current context: the next allocation must come from the
 *                 context beneath (primary 0), not the destroyed one's pool
 *   detach-off    the same with BFCSHIM_CONTEXT_CACHE=off (passes: asking the
 *                 driver finds primary 0)
 *   detach-reuse  (audit, not from the remembering) after cuCtxDetach, a new
 *                 context under the destroyed one's handle is served from the
 *                 old pool, whose regions went with the old context
 *                 (BFCSHIM_VMM=off: cuMemAlloc regions die with their context)
 *   detach-stacked  (audit) the context pushed twice: the destroying
 *                 cuCtxDetach pops only the top, the dead handle stays
 *                 current beneath, so "still current" did not mean "only
 *                 counted down": the pool lived on, and a new context under
 *                 the handle was served from it, in no live allocation
 *                 (BFCSHIM_VMM=off)
 *   detach-id-fails  a cuCtxDetach that only counts down, the cuCtxGetId
 *                 after it failing with an earlier launch's error: the
 *                 context lives, and its pool and live block must too
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuGetProcAddress

#include "e2e_cu.h"
#include "e2e_green.h"

#define MiB (UINT64_C(1) << 20)

typedef CUresult (*ctx_fn)(CUcontext);
typedef CUresult (*ctx_out_fn)(CUcontext *);
typedef CUresult (*attr_fn)(void *, CUpointer_attribute, CUdeviceptr);

static attr_fn pointer_attribute;
static CUcontext primary[2];


/* Both devices' primary contexts, through the runtime; device 0's current. */
static void start(void)
{
    e2e_cu_load();
    void *h = e2e_open_libcuda();
    pointer_attribute = (attr_fn)e2e_dlsym(h, "cuPointerGetAttribute");
    for (int d = 1; d >= 0; d--) {
        CHECK_EQ(cudaSetDevice(d), cudaSuccess);
        CHECK_EQ(cudaFree(NULL), cudaSuccess);
        CHECK_EQ(cuCtxGetCurrent(&primary[d]), CUDA_SUCCESS);
    }
}

static CUcontext context_of(CUdeviceptr p)
{
    CUcontext c = NULL;
    CHECK_EQ(pointer_attribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, p), CUDA_SUCCESS);
    return c;
}

/* A cudaMalloc and a cuMemAlloc on this thread come from `want`'s pool. */
static void served_in(CUcontext want, const char *after)
{
    void *p = NULL;
    CUdeviceptr d = 0;
    CHECK_EQ(cudaMalloc(&p, MiB), cudaSuccess);
    CHECK_EQ(D.MemAlloc(&d, MiB), CUDA_SUCCESS);
    if (context_of((CUdeviceptr)p) != want || context_of(d) != want) {
        fprintf(stderr, "after %s: served in %p / %p, the current context is %p\n", after,
                (void *)context_of((CUdeviceptr)p), (void *)context_of(d), (void *)want);
        e2e_failures++;
    }
    CHECK_EQ(cudaFree(p), cudaSuccess);
    CHECK_EQ(D.MemFree(d), CUDA_SUCCESS);
}

/* The cuCtxGetCurrent calls n cudaMalloc/cudaFree pairs make. */
static uint64_t lookups_over(int n)
{
    uint64_t before = e2e_calls_of("cuCtxGetCurrent");
    for (int i = 0; i < n; i++) {
        void *p = NULL;
        CHECK_EQ(cudaMalloc(&p, 4096), cudaSuccess);
        CHECK_EQ(cudaFree(p), cudaSuccess);
    }
    return e2e_calls_of("cuCtxGetCurrent") - before;
}

/* Steady state: a hundred allocations and frees ask the driver nothing. */
static void asks_nothing(void) { CHECK_EQ(lookups_over(100), 0); }

/* Pushes device `dev`'s primary context over the current one (the other
 * device's), then pops it, allocating after each. */
static void push_pop(ctx_fn push, ctx_out_fn pop, int dev, const char *how)
{
    char what[96];
    CUcontext popped = NULL;
    CHECK_EQ(push(primary[dev]), CUDA_SUCCESS);
    snprintf(what, sizeof what, "cuCtxPushCurrent%s", how);
    served_in(primary[dev], what);
    CHECK_EQ(pop(&popped), CUDA_SUCCESS);
    CHECK(popped == primary[dev]);
    snprintf(what, sizeof what, "cuCtxPopCurrent%s", how);
    served_in(primary[1 - dev], what);
}

static void follows(void)
{
    start();
    served_in(primary[0], "start");
    asks_nothing();

    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    served_in(primary[1], "cudaSetDevice(1)");
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    served_in(primary[0], "cudaSetDevice(0)");

    /* linked, as a program built with -lcuda calls them */
    CHECK_EQ(cuCtxSetCurrent(primary[1]), CUDA_SUCCESS);
    served_in(primary[1], "cuCtxSetCurrent (linked)");
    CHECK_EQ(cuCtxPushCurrent_v2(primary[0]), CUDA_SUCCESS);
    served_in(primary[0], "cuCtxPushCurrent_v2 (linked)");
    CUcontext popped = NULL;
    CHECK_EQ(cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
    served_in(primary[1], "cuCtxPopCurrent_v2 (linked)");

    /* through dlsym, as XLA and Numba find them */
    CHECK_EQ(D.CtxSetCurrent(primary[0]), CUDA_SUCCESS);
    served_in(primary[0], "cuCtxSetCurrent (dlsym)");
    void *h = e2e_open_libcuda();
    push_pop((ctx_fn)e2e_dlsym(h, "cuCtxPushCurrent_v2"),
             (ctx_out_fn)e2e_dlsym(h, "cuCtxPopCurrent_v2"), 1, "_v2 (dlsym)");

    /* through cuGetProcAddress, as cudart finds them; v1 as an old binary */
    ctx_fn set = (ctx_fn)e2e_cu_proc("cuCtxSetCurrent", 4000);
    CHECK_EQ(set(primary[1]), CUDA_SUCCESS);
    served_in(primary[1], "cuCtxSetCurrent (cuGetProcAddress)");
    push_pop((ctx_fn)e2e_cu_proc("cuCtxPushCurrent", 2000),
             (ctx_out_fn)e2e_cu_proc("cuCtxPopCurrent", 2000), 0, " v1 (cuGetProcAddress)");
    push_pop((ctx_fn)e2e_cu_proc("cuCtxPushCurrent", 4000),
             (ctx_out_fn)e2e_cu_proc("cuCtxPopCurrent", 4000), 0, " v2 (cuGetProcAddress)");

    /* the interop creators push theirs too, every version, every way */
    typedef CUresult (*gl_create_fn)(CUcontext *, unsigned, CUdevice);
    typedef CUresult (*vdpau_create_fn)(CUcontext *, unsigned, CUdevice, uint32_t, void *);
    static const struct {
        const char *name;
        int version;
        bool vdpau;
    } interop[] = {{"cuGLCtxCreate", 2000, false}, {"cuGLCtxCreate", 3020, false},
                   {"cuVDPAUCtxCreate", 3010, true}, {"cuVDPAUCtxCreate", 3020, true}};
    for (size_t i = 0; i < sizeof interop / sizeof interop[0]; i++) {
        void *fn = e2e_cu_proc(interop[i].name, interop[i].version);
        for (int way = 0; way < 2; way++) { /* cuGetProcAddress, then dlsym */
            if (way == 1)
                fn = e2e_dlsym(h, interop[i].version > 3010 ? (interop[i].vdpau
                                                                   ? "cuVDPAUCtxCreate_v2"
                                                                   : "cuGLCtxCreate_v2")
                                                             : interop[i].name);
            CUcontext c = NULL;
            CUresult r = interop[i].vdpau
                             ? ((vdpau_create_fn)fn)(&c, 0, 0, 1, (void *)e2e_cu_proc)
                             : ((gl_create_fn)fn)(&c, 0, 0);
            CHECK_EQ(r, CUDA_SUCCESS);
            char what[64];
            snprintf(what, sizeof what, "%s at %d (%s)", interop[i].name, interop[i].version,
                     way ? "dlsym" : "cuGetProcAddress");
            served_in(c, what);
            CHECK_EQ(D.CtxDestroy(c), CUDA_SUCCESS);
            served_in(primary[1], "the interop context destroyed");
        }
    }

    /* a created context is pushed; destroyed, it is popped */
    CUcontext made = NULL;
    CHECK_EQ(D.CtxCreate(&made, NULL, 0, 0), CUDA_SUCCESS);
    served_in(made, "cuCtxCreate");
    asks_nothing();
    CHECK_EQ(D.CtxDestroy(made), CUDA_SUCCESS);
    served_in(primary[1], "cuCtxDestroy of the current context");
    asks_nothing();
}

/* Two threads, each on its own device, allocating in turn. */
typedef struct turn {
    int dev;
    e2e_phase *phase;
    int wrong;
} turn;

static void *take_turns(void *arg)
{
    turn *t = arg;
    CHECK_EQ(cudaSetDevice(t->dev), cudaSuccess);
    for (int i = 0; i < 200; i++) {
        e2e_phase_wait(t->phase, 2 * i + t->dev);
        void *p = NULL;
        if (cudaMalloc(&p, 4096) != cudaSuccess || context_of((CUdeviceptr)p) != primary[t->dev])
            t->wrong++;
        cudaFree(p);
        e2e_phase_set(t->phase, 2 * i + t->dev + 1);
    }
    return NULL;
}

static void threads(void)
{
    start();
    e2e_phase phase = E2E_PHASE_INIT;
    turn t[2] = {{0, &phase, 0}, {1, &phase, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, take_turns, &t[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ(t[0].wrong, 0);
    CHECK_EQ(t[1].wrong, 0);
}

/* ---- explicit streams ------------------------------------------------------------ */

static CUcontext served_on(cudaStream_t s)
{
    void *p = NULL;
    CHECK_EQ(cudaMallocAsync(&p, MiB, s), cudaSuccess);
    CUcontext c = context_of((CUdeviceptr)p);
    CHECK_EQ(cudaFreeAsync(p, s), cudaSuccess);
    return c;
}

static void streams(void)
{
    start();
    cudaStream_t s0 = NULL, s1 = NULL, again = NULL;
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    CHECK_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ(cudaSetDevice(0), cudaSuccess);
    CHECK_EQ(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking), cudaSuccess);
    /* the stream's context, whatever context is current */
    CHECK(served_on(s1) == primary[1]);
    CHECK(served_on(s0) == primary[0]);
    CHECK(served_on(s1) == primary[1]);
    uint64_t before = e2e_calls_of("cuStreamGetCtx") + e2e_calls_of("cuStreamGetCtx_v2") +
                      e2e_calls_of("cuCtxGetCurrent");
    for (int i = 0; i < 100; i++) { /* in turn, as two streams' work does */
        void *p = NULL;
        cudaStream_t s = i % 2 ? s1 : s0;
        CHECK_EQ(cudaMallocAsync(&p, 4096, s), cudaSuccess);
        CHECK_EQ(cudaFreeAsync(p, s), cudaSuccess);
    }
    CHECK_EQ(e2e_calls_of("cuStreamGetCtx") + e2e_calls_of("cuStreamGetCtx_v2") +
                 e2e_calls_of("cuCtxGetCurrent") - before,
             0);
    /* s1's handle names the next stream made, on device 0 */
    CHECK_EQ(cudaStreamSynchronize(s1), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s1), cudaSuccess);
    CHECK_EQ(cudaStreamCreateWithFlags(&again, cudaStreamNonBlocking), cudaSuccess);
    CHECK(again == s1);
    CHECK(served_on(again) == primary[0]);
    CHECK_EQ(cudaStreamSynchronize(again), cudaSuccess);
    CHECK_EQ(cudaStreamSynchronize(s0), cudaSuccess);
}

/* ---- a green context destroyed under a thread that has it current ---------- */

static void *destroy_green(void *g)
{
    return (void *)(intptr_t)GR.GreenCtxDestroy((CUgreenCtx)g);
}

static void green_gone(void)
{
    start();
    e2e_green_load();
    CUcontext converted = NULL;
    CUgreenCtx g = e2e_green_make(0, &converted);
    CHECK_EQ(D.CtxSetCurrent(converted), CUDA_SUCCESS);
    /* a green context allocates its primary context's memory */
    CUdeviceptr d = 0;
    CHECK_EQ(D.MemAlloc(&d, MiB), CUDA_SUCCESS);
    CHECK(context_of(d) == primary[0]);
    CHECK_EQ(D.MemFree(d), CUDA_SUCCESS);
    pthread_t th;
    void *r = NULL;
    pthread_create(&th, NULL, destroy_green, g);
    pthread_join(th, &r);
    CHECK_EQ((intptr_t)r, CUDA_SUCCESS);
    /* This thread's current context is now a destroyed one: the driver
     * refuses an allocation in it, and so must the pool. */
    d = 0;
    CUresult got = D.MemAlloc(&d, MiB);
    if (got == CUDA_SUCCESS) {
        fprintf(stderr, "cuMemAlloc in a destroyed green context served 0x%llx\n",
                (unsigned long long)d);
        e2e_failures++;
    }
}

/* ---- a change no hook sees ------------------------------------------------------ */

static void unseen(bool checking)
{
    start();
    served_in(primary[0], "start");
    CHECK_EQ(fakecuda()->set_current_unseen(primary[1]), CUDA_SUCCESS);
    served_in(primary[1], "a change through no entry point");
    /* both modes keep asking: one question per allocation */
    CHECK_EQ(lookups_over(10), 10);
    CHECK_EQ(shim_stat_number("context_cache_wrong"), checking ? 1 : 0);
    char said[4096];
    CHECK_EQ(shim_log_lines(said, sizeof said), checking ? 1 : 0);
    CHECK(!checking || strstr(said, "changed from") != NULL);
}

static void unseen_check(void) { unseen(true); }
static void unseen_off(void) { unseen(false); }

/* ---- cuCtxDetach: a destroy (and pop) no hook sees (audit) ------------------- */

typedef CUresult (*detach_fn)(CUcontext);

static detach_fn ctx_detach(void)
{
    return (detach_fn)e2e_dlsym(e2e_open_libcuda(), "cuCtxDetach");
}

static void detach(void)
{
    start();
    served_in(primary[0], "start");
    CUcontext made = NULL;
    CHECK_EQ(D.CtxCreate(&made, NULL, 0, 1), CUDA_SUCCESS); /* pushed over primary 0 */
    served_in(made, "cuCtxCreate");
    /* attached once more, a detach only counts down: made stays, pool and all */
    CUresult (*attach)(CUcontext *, unsigned) =
        (CUresult(*)(CUcontext *, unsigned))e2e_dlsym(e2e_open_libcuda(), "cuCtxAttach");
    CUcontext same = NULL;
    CHECK_EQ(attach(&same, 0), CUDA_SUCCESS);
    CHECK(same == made);
    CHECK_EQ(ctx_detach()(made), CUDA_SUCCESS); /* usage 2 -> 1 */
    served_in(made, "a cuCtxDetach that only counted down");
    CHECK_EQ(ctx_detach()(made), CUDA_SUCCESS); /* usage 1 -> 0: destroyed and popped */
    CUcontext now = NULL;
    CHECK_EQ(cuCtxGetCurrent(&now), CUDA_SUCCESS);
    CHECK(now == primary[0]);
    served_in(primary[0], "cuCtxDetach of the current context");
}

/* A cuMemAlloc in the context made under a destroyed one's handle must
 * come from live memory, not from the destroyed context's pool (`whose`). */
static void served_live(const char *whose)
{
    CUdeviceptr d = 0;
    CHECK_EQ(D.MemAlloc(&d, MiB), CUDA_SUCCESS);
    if (!fakecuda()->is_device_pointer((uint64_t)d)) {
        fprintf(stderr, "cuMemAlloc in the new context served 0x%llx, in no live allocation "
                        "(%s)\n", (unsigned long long)d, whose);
        e2e_failures++;
    }
}

static void detach_reuse(void)
{
    start();
    CUcontext made = NULL, again = NULL;
    CHECK_EQ(D.CtxCreate(&made, NULL, 0, 1), CUDA_SUCCESS);
    served_in(made, "cuCtxCreate");
    CHECK_EQ(ctx_detach()(made), CUDA_SUCCESS);
    CHECK_EQ(D.CtxCreate(&again, NULL, 0, 1), CUDA_SUCCESS);
    CHECK(again == made); /* the fake reuses a destroyed context's handle */
    served_live("the detached context's pool");
}

/* The destroying detach of a context current twice on this thread's stack
 * pops only the top copy (cuda.h: "if ctx is current to the calling thread
 * then ctx will also be popped"), and the handle stays current beneath,
 * dead: whether the detach destroyed cannot be read from the current
 * context. */
static void detach_stacked(void)
{
    start();
    CUresult (*push)(CUcontext) = (ctx_fn)e2e_dlsym(e2e_open_libcuda(), "cuCtxPushCurrent_v2");
    CUresult (*pop)(CUcontext *) = (ctx_out_fn)e2e_dlsym(e2e_open_libcuda(), "cuCtxPopCurrent_v2");
    CUcontext made = NULL, again = NULL, popped = NULL;
    CHECK_EQ(D.CtxCreate(&made, NULL, 0, 1), CUDA_SUCCESS); /* pushed over primary 0 */
    CHECK_EQ(push(made), CUDA_SUCCESS);                      /* and once more */
    served_in(made, "cuCtxCreate");
    CHECK_EQ(ctx_detach()(made), CUDA_SUCCESS); /* usage 1 -> 0: destroyed, top popped */
    CHECK_EQ(pop(&popped), CUDA_SUCCESS);       /* the dead copy beneath */
    CHECK(popped == made);
    CHECK_EQ(D.CtxCreate(&again, NULL, 0, 1), CUDA_SUCCESS);
    CHECK(again == made); /* the fake reuses a destroyed context's handle */
    served_live("the pool of the context a stacked cuCtxDetach destroyed");
}

/* A cuCtxDetach that only counts down, while the cuCtxGetId asked after it
 * fails with an earlier launch's error (CUDA_ERROR_ILLEGAL_ADDRESS: cuda.h
 * notes "error codes from previous, asynchronous launches" for it), which
 * says nothing of the context: it lives on, and so must its pool and the
 * memory of its live block. */
static void detach_id_fails(void)
{
    start();
    CUcontext made = NULL, same = NULL;
    CHECK_EQ(D.CtxCreate(&made, NULL, 0, 1), CUDA_SUCCESS); /* pushed over primary 0 */
    CUdeviceptr live = 0;
    CHECK_EQ(D.MemAlloc(&live, MiB), CUDA_SUCCESS);
    CUresult (*attach)(CUcontext *, unsigned) =
        (CUresult(*)(CUcontext *, unsigned))e2e_dlsym(e2e_open_libcuda(), "cuCtxAttach");
    CHECK_EQ(attach(&same, 0), CUDA_SUCCESS);
    CHECK(same == made);
    const uint64_t asked = e2e_calls_of("cuCtxGetId");
    /* the detach's second: the one asked after the real call */
    CHECK_EQ(fakecuda()->fail_call("cuCtxGetId", 2, CUDA_ERROR_ILLEGAL_ADDRESS, 0), 0);
    CHECK_EQ(ctx_detach()(made), CUDA_SUCCESS); /* usage 2 -> 1 */
    CHECK_EQ(fakecuda()->fail_call("cuCtxGetId", 0, 0, 0), 0);
    CHECK_EQ(e2e_calls_of("cuCtxGetId"), asked + 2);
    if (!fakecuda()->is_device_pointer((uint64_t)live)) {
        fprintf(stderr, "the live block of a context a cuCtxDetach only counted down lost its "
                        "memory\n");
        e2e_failures++;
    }
    served_in(made, "a cuCtxDetach that only counted down");
    CHECK_EQ(D.MemFree(live), CUDA_SUCCESS);
    CHECK_EQ(ctx_detach()(made), CUDA_SUCCESS); /* usage 1 -> 0 */
}

int main(int argc, char **argv)
{
    static const e2e_scenario scenarios[] = {
        {"follows", follows},
        {"threads", threads},
        {"streams", streams},
        {"green-gone", green_gone},
        {"unseen-check", unseen_check},
        {"unseen-off", unseen_off},
        {"detach", detach},
        {"detach-off", detach},
        {"detach-reuse", detach_reuse},
        {"detach-stacked", detach_stacked},
        {"detach-id-fails", detach_id_fails},
    };
    return e2e_main("e2e_current", scenarios, sizeof scenarios / sizeof scenarios[0], argc, argv);
}
