/*
 * e2e_race.c - a randomised race detector for reuse of freed memory.
 *
 * The defect that matters most in a GPU allocator is handing memory to a new
 * allocation while GPU work queued before the free may still use it. Here
 * legal CUDA programs do, in random order and on a device small enough that
 * memory is reused all the time:
 *   - allocations through both doors: the runtime (cudaMalloc,
 *     cudaMallocAsync) and the driver looked up with dlsym, as XLA and Numba
 *     reach it (cuMemAlloc_v2, cuMemAllocAsync);
 *   - "kernels" (fake driver work items) on each block's home stream: the
 *     legacy stream, the per-thread default stream or a created one;
 *   - frees, plain or stream-ordered on the home stream;
 *   - hand-overs of a block to another stream behind an event
 *     (cudaStreamWaitEvent);
 *   - streams destroyed with work queued, and replaced;
 *   - captures (relaxed mode) begun and ended on non-blocking streams with
 *     work queued, other streams allocating and freeing meanwhile;
 *   - completions of streams in any order, and synchronisations.
 * Every kernel checks that its block still holds the block's own tag, then
 * writes it again; the first kernel of a block writes the tag. A kernel that
 * finds another block's tag ran after the memory had been given to someone
 * else while it was queued: a race. Every capture must end valid.
 *
 * The programs keep CUDA's rules: a block is used on one stream at a time; a
 * stream-ordered free goes on its stream; a block whose stream is destroyed
 * is only freed plainly afterwards; a block from cuMemAllocAsync is freed
 * plainly only once its work is done (cuMemFree does not synchronise for
 * those); nothing is allocated into, freed into, used on or synchronised
 * with a capturing stream, and nothing synchronises the device during a
 * capture.
 *
 * Tags are written and checked once per 256 bytes: every block starts on a
 * 512-byte boundary and is a multiple of it, so a block that overlaps
 * another covers at least one of its sampled words.
 *
 *   e2e_race SEED_FIRST-SEED_LAST OPS [threads=N] [expect-races]
 *   e2e_race SCENARIO      (meson's tests: seeds 1-6, 3000 operations; with
 *                          threads=3 when SCENARIO starts with "threads",
 *                          expect-races when it is "immediate")
 *   (E2E_RACE_TRACE=1: log the calls)
 *
 * With threads=N, N threads run such programs at once on one pool, each with
 * its own streams (and its own per-thread default stream) and seeds; the
 * legacy stream is shared. Exits 0 when no kernel saw a race; with `expect-races` (run with
 * BFCSHIM_FREE_POLICY=immediate, which reuses plain frees at once) exits 0
 * only when one did: the detector itself can fail.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdatomic.h>

#include "e2e_rt.h"

#define NSLOTS 5      /* stream slots: legacy, per-thread default, three created */
#define MAXLIVE 48
#define STRIDE 32     /* words between sampled words: 256 bytes */

typedef struct block {
    uint64_t *mem;
    size_t bytes;
    uint64_t tag;
    int home;         /* stream slot */
    bool async;       /* from cudaMallocAsync or cuMemAllocAsync */
    bool orphan;      /* its stream was destroyed: only a plain free remains */
} block;

typedef struct kernel {
    uint64_t *mem;
    size_t bytes;
    uint64_t tag;
    bool first;
    unsigned seed, op; /* where it was launched, for the report */
} kernel;

/* Calls that did not answer as CUDA must (any thread). */
static atomic_int failed_calls;
#define EXPECT(call, want)                                                                \
    do {                                                                                 \
        long long got_ = (long long)(call), want_ = (long long)(want);                   \
        if (got_ != want_) {                                                             \
            fprintf(stderr, "%s:%d: %s == %lld, expected %lld\n", __FILE__, __LINE__,    \
                    #call, got_, want_);                                                 \
            atomic_fetch_add(&failed_calls, 1);                                          \
        }                                                                                \
    } while (0)

/* The driver's allocation calls, looked up as XLA and Numba do. */
static struct {
    CUresult (*Alloc)(CUdeviceptr *, size_t);
    CUresult (*Free)(CUdeviceptr);
    CUresult (*AllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*FreeAsync)(CUdeviceptr, CUstream);
} cu;

static void load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "e2e_race: no libcuda.so.1: %s\n", dlerror());
        exit(1);
    }
    *(void **)&cu.Alloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&cu.Free = dlsym(h, "cuMemFree_v2");
    *(void **)&cu.AllocAsync = dlsym(h, "cuMemAllocAsync");
    *(void **)&cu.FreeAsync = dlsym(h, "cuMemFreeAsync");
    if (!cu.Alloc || !cu.Free || !cu.AllocAsync || !cu.FreeAsync) {
        fprintf(stderr, "e2e_race: libcuda.so.1 lacks an allocation call\n");
        exit(1);
    }
}

/* One program per thread. */
static _Thread_local cudaStream_t slot[NSLOTS];
static _Thread_local bool slot_non_blocking[NSLOTS];
/* The slot whose stream is capturing (relaxed mode), or -1. Only a
 * non-blocking stream captures: a blocking one would forbid the legacy
 * stream to every thread, which other threads' programs do not know. */
static _Thread_local int capturing = -1;
/* A program may not synchronise the device while any thread captures (the
 * fake, reading cuda.h harshly, invalidates the capture, as
 * cuCtxRecordEvent's text says it does): captures hold this gate shared,
 * device synchronisations exclusively; writers first, so that captures
 * coming and going cannot starve a synchronisation. */
static pthread_rwlock_t capture_gate;

static void device_synchronize(void)
{
    pthread_rwlock_wrlock(&capture_gate);
    EXPECT(cudaDeviceSynchronize(), cudaSuccess);
    pthread_rwlock_unlock(&capture_gate);
}
static _Thread_local cudaStream_t destroyed[1024]; /* destroyed, work maybe still queued */
static _Thread_local size_t ndestroyed;
static _Thread_local block live[MAXLIVE];
static _Thread_local size_t nlive;
static _Thread_local unsigned seed_now, op_now;
static _Atomic uint64_t next_tag, races, kernels_run;
static bool tracing; /* E2E_RACE_TRACE, read once in main */

/* E2E_RACE_TRACE=1 logs every allocation, free and stream replacement, to
 * follow a race back to the calls that made it. */
static void trace(const char *fmt, ...)
{
    if (!tracing)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "seed %u op %u: ", seed_now, op_now);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static _Thread_local uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static size_t pick(size_t n) { return (size_t)(rnd() % n); }

/* Runs when the fake GPU reaches the work item, in whichever thread
 * completed its stream. */
static void run_kernel(void *arg)
{
    kernel *k = arg;
    size_t words = k->bytes / sizeof(uint64_t);
    for (size_t i = 0; i < words; i += STRIDE) {
        if (!k->first && k->mem[i] != k->tag) {
            if (atomic_fetch_add(&races, 1) < 5)
                fprintf(stderr,
                        "race: seed %u, op %u launched a kernel of block %p (%zu bytes, tag %llu) "
                        "that found tag %llu at offset %zu: the memory was reused while it was "
                        "queued\n",
                        k->seed, k->op, (void *)k->mem, k->bytes, (unsigned long long)k->tag,
                        (unsigned long long)k->mem[i], i * sizeof(uint64_t));
            break;
        }
    }
    for (size_t i = 0; i < words; i += STRIDE)
        k->mem[i] = k->tag;
    atomic_fetch_add(&kernels_run, 1);
    free(k);
}

static void launch(const block *b, bool first)
{
    kernel *k = malloc(sizeof *k);
    *k = (kernel){.mem = b->mem, .bytes = b->bytes, .tag = b->tag, .first = first,
                  .seed = seed_now, .op = op_now};
    EXPECT(fakecuda()->launch(slot[b->home], run_kernel, k), 0);
}

static size_t random_size(void)
{
    static const size_t sizes[] = {512, 4096, 65536, 1u << 20, 3u << 20};
    size_t n = sizes[pick(sizeof sizes / sizeof *sizes)];
    return n + (pick(4) ? 0 : 512 * pick(8)); /* some odd multiples of the granule */
}

static void new_block(bool async)
{
    if (nlive == MAXLIVE)
        return;
    int home = (int)pick(NSLOTS);
    if (home == capturing) /* an allocation there would be the graph's */
        home = 0;
    size_t n = random_size();
    void *p = NULL;
    const bool driver = pick(2);
    if (driver) {
        CUdeviceptr d = 0;
        CUresult r = async ? cu.AllocAsync(&d, n, (CUstream)slot[home]) : cu.Alloc(&d, n);
        if (r == CUDA_ERROR_OUT_OF_MEMORY)
            return; /* a full device: allowed */
        EXPECT(r, CUDA_SUCCESS);
        if (r != CUDA_SUCCESS)
            return;
        p = (void *)(uintptr_t)d;
    } else {
        cudaError_t e = async ? cudaMallocAsync(&p, n, slot[home]) : cudaMalloc(&p, n);
        if (e == cudaErrorMemoryAllocation)
            return;
        EXPECT(e, cudaSuccess);
        if (e != cudaSuccess)
            return;
    }
    block *b = &live[nlive++];
    *b = (block){.mem = p, .bytes = n, .tag = atomic_fetch_add(&next_tag, 1) + 1, .home = home, .async = async};
    trace("alloc tag %llu at %p, %zu bytes, %s, stream slot %d (%p)", (unsigned long long)b->tag,
          (void *)b->mem, n,
          driver ? (async ? "cuMemAllocAsync" : "cuMemAlloc") : (async ? "cudaMallocAsync" : "cudaMalloc"),
          home, (void *)slot[home]);
    launch(b, true);
}

static void free_block(size_t i, bool async)
{
    block *b = &live[i];
    /* While its stream captures, a block is not freed stream-ordered there
     * (a free node takes only graph allocations), and one from
     * cuMemAllocAsync is not freed plainly (its stream cannot be
     * synchronised); an orphan from cuMemAllocAsync waits for the device,
     * which no capture allows. */
    if (capturing >= 0 && b->async && (b->home == capturing || b->orphan))
        return;
    if (b->home == capturing)
        async = false;
    const bool driver = pick(2);
    const CUdeviceptr d = (CUdeviceptr)(uintptr_t)b->mem;
    async = async && !b->orphan;
    trace("free tag %llu at %p, %s%s, stream slot %d (%p)", (unsigned long long)b->tag,
          (void *)b->mem,
          driver ? (async ? "cuMemFreeAsync" : "cuMemFree") : (async ? "cudaFreeAsync" : "cudaFree"),
          b->orphan ? " (orphan)" : "", b->home, (void *)slot[b->home]);
    if (async) {
        if (driver)
            EXPECT(cu.FreeAsync(d, (CUstream)slot[b->home]), CUDA_SUCCESS);
        else
            EXPECT(cudaFreeAsync(b->mem, slot[b->home]), cudaSuccess);
    } else {
        /* cuda.h, cuMemFree: no implicit synchronisation for a pointer from
         * cuMemAllocAsync; "callers must ensure that all accesses to these
         * pointer have completed". Other pointers may be freed with work
         * queued (the real free synchronises; the shim fences). */
        if (b->async && b->orphan)
            device_synchronize();
        else if (b->async)
            EXPECT(cudaStreamSynchronize(slot[b->home]), cudaSuccess);
        if (driver)
            EXPECT(cu.Free(d), CUDA_SUCCESS);
        else
            EXPECT(cudaFree(b->mem), cudaSuccess);
    }
    live[i] = live[--nlive];
}

/* Moves a block to another stream, as a program hands a tensor over: an
 * event recorded on its stream, the new stream waiting for it (and the event
 * destroyed at once: the wait keeps what it captured). Its later kernels and
 * a stream-ordered free go on the new stream; a block reused there at once
 * after that free is safe only if the wait orders the old stream's work
 * first. */
static void hand_over(block *b)
{
    int to = (int)pick(NSLOTS);
    if (b->orphan || to == b->home || to == capturing || b->home == capturing)
        return;
    cudaEvent_t ev;
    EXPECT(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
    EXPECT(cudaEventRecord(ev, slot[b->home]), cudaSuccess);
    EXPECT(cudaStreamWaitEvent(slot[to], ev, 0), cudaSuccess);
    EXPECT(cudaEventDestroy(ev), cudaSuccess);
    trace("tag %llu handed from stream slot %d to %d", (unsigned long long)b->tag, b->home, to);
    b->home = to;
}

/* Destroys a created stream with its work still queued (CUDA lets that work
 * finish) and puts a new one in its slot; its blocks become orphans. */
static void replace_stream(void)
{
    int s = 2 + (int)pick(NSLOTS - 2);
    if (s == capturing)
        return;
    EXPECT(cudaStreamDestroy(slot[s]), cudaSuccess);
    if (ndestroyed < sizeof destroyed / sizeof *destroyed)
        destroyed[ndestroyed++] = slot[s];
    for (size_t i = 0; i < nlive; i++)
        if (live[i].home == s)
            live[i].orphan = true;
    slot_non_blocking[s] = pick(2);
    EXPECT(cudaStreamCreateWithFlags(&slot[s], slot_non_blocking[s] ? cudaStreamNonBlocking : 0),
           cudaSuccess);
    trace("stream slot %d destroyed, now %p", s, (void *)slot[s]);
}

/* Begins a capture (relaxed mode) on a non-blocking created stream, or ends
 * the one under way. Work queued there before the capture still runs while
 * no event can be recorded on the stream; blocks freed meanwhile elsewhere
 * must still wait for it. The capture must come out valid: nothing the
 * shim does on the program's behalf may invalidate it. */
static void toggle_capture(void)
{
    if (capturing >= 0) {
        cudaGraph_t g;
        EXPECT(cudaStreamEndCapture(slot[capturing], &g), cudaSuccess);
        pthread_rwlock_unlock(&capture_gate);
        trace("capture on stream slot %d ended", capturing);
        capturing = -1;
        return;
    }
    int s = 2 + (int)pick(NSLOTS - 2);
    if (!slot_non_blocking[s])
        return;
    pthread_rwlock_rdlock(&capture_gate);
    EXPECT(cudaStreamBeginCapture(slot[s], cudaStreamCaptureModeRelaxed), cudaSuccess);
    capturing = s;
    trace("capture on stream slot %d begun", s);
}

static void one_op(void)
{
    unsigned r = (unsigned)pick(100);
    if (r < 22)
        new_block(false);
    else if (r < 36)
        new_block(true);
    else if (r < 55) {
        if (nlive) {
            block *b = &live[pick(nlive)];
            if (!b->orphan && b->home != capturing)
                launch(b, false);
        }
    } else if (r < 60) {
        if (nlive)
            hand_over(&live[pick(nlive)]);
    } else if (r < 74) {
        if (nlive)
            free_block(pick(nlive), false);
    } else if (r < 86) {
        if (nlive)
            free_block(pick(nlive), true);
    } else if (r < 93) {
        fakecuda()->complete(slot[pick(NSLOTS)]);
    } else if (r < 95) {
        toggle_capture();
    } else if (r < 97) {
        if (ndestroyed)
            fakecuda()->complete(destroyed[pick(ndestroyed)]);
    } else if (r < 99) {
        replace_stream();
    } else if (capturing < 0) { /* no synchronisation during a capture */
        if (pick(2))
            EXPECT(cudaStreamSynchronize(slot[pick(NSLOTS)]), cudaSuccess);
        else
            device_synchronize();
    }
}

static void run_seed(unsigned seed, unsigned ops)
{
    seed_now = seed;
    rng_state = 0x9e3779b97f4a7c15ull * (seed + 1);
    slot[0] = NULL;                 /* the legacy default stream */
    slot[1] = cudaStreamPerThread;  /* this thread's default stream */
    for (int s = 2; s < NSLOTS; s++) {
        slot_non_blocking[s] = s != 2;
        EXPECT(cudaStreamCreateWithFlags(&slot[s], slot_non_blocking[s] ? cudaStreamNonBlocking : 0),
               cudaSuccess);
    }
    for (op_now = 0; op_now < ops; op_now++)
        one_op();
    if (capturing >= 0)
        toggle_capture();
    fakecuda()->complete_all();
    for (size_t i = 0; i < ndestroyed; i++)
        fakecuda()->complete(destroyed[i]);
    ndestroyed = 0;
    while (nlive)
        free_block(nlive - 1, false);
    for (int s = 2; s < NSLOTS; s++)
        EXPECT(cudaStreamDestroy(slot[s]), cudaSuccess);
    fakecuda()->complete_all();
}

typedef struct job {
    unsigned first, last, ops, offset;
} job;

/* A thread's programs: seeds first..last, numbered from `offset` so that
 * threads differ. */
static void *run_job(void *arg)
{
    const job *j = arg;
    EXPECT(cudaFree(NULL), cudaSuccess); /* the runtime makes the primary context current */
    for (unsigned s = j->first; s <= j->last; s++)
        run_seed(j->offset + s, j->ops);
    return NULL;
}

int main(int argc, char **argv)
{
    unsigned first = 1, last = 6, ops = 3000, threads = 1;
    bool expect_races = false;
    if (argc < 2) {
        fprintf(stderr, "usage: e2e_race FIRST-LAST OPS [threads=N] [expect-races] | SCENARIO\n");
        return 2;
    }
    if (sscanf(argv[1], "%u-%u", &first, &last) != 2) {
        threads = strncmp(argv[1], "threads", 7) == 0 ? 3 : 1;
        expect_races = strcmp(argv[1], "immediate") == 0;
    } else if (argc > 2) {
        ops = (unsigned)atoi(argv[2]);
    }
    for (int a = 3; a < argc; a++)
        if (strcmp(argv[a], "expect-races") == 0)
            expect_races = true;
        else if (sscanf(argv[a], "threads=%u", &threads) != 1 || threads < 1 || threads > 16) {
            fprintf(stderr, "e2e_race: bad argument %s\n", argv[a]);
            return 2;
        }
    e2e_program = "e2e_race";
    tracing = getenv("E2E_RACE_TRACE") != NULL;
    pthread_rwlockattr_t gate_kind;
    pthread_rwlockattr_init(&gate_kind);
    pthread_rwlockattr_setkind_np(&gate_kind, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&capture_gate, &gate_kind);
    EXPECT(cudaFree(NULL), cudaSuccess);
    load_driver();
    pthread_t tid[16];
    job jobs[16];
    for (unsigned t = 0; t < threads; t++) {
        jobs[t] = (job){first, last, ops, 1000 * t};
        if (t > 0)
            EXPECT(pthread_create(&tid[t], NULL, run_job, &jobs[t]), 0);
    }
    run_job(&jobs[0]);
    for (unsigned t = 1; t < threads; t++)
        EXPECT(pthread_join(tid[t], NULL), 0);
    /* Nothing is live and every stream is done: the whole pool must come
     * back. A fence that can never complete (an event recorded on a stream
     * that had begun capturing: a captured event) keeps its blocks pending
     * for good, and this allocation fails. */
    void *whole = NULL;
    EXPECT(cudaMalloc(&whole, 24u << 20), cudaSuccess);
    EXPECT(cudaFree(whole), cudaSuccess);
    fakecuda_stats st;
    fakecuda()->stats(&st);
    CHECK_EQ(st.stale_handle_uses, 0);
    CHECK_EQ(st.capture_invalidations, 0);
    e2e_failures += atomic_load(&failed_calls);
    printf("e2e_race: seeds %u-%u, %u operations each, %u thread(s): %llu kernels, %llu races\n",
           first, last, ops, threads, (unsigned long long)atomic_load(&kernels_run),
           (unsigned long long)atomic_load(&races));
    if (expect_races) {
        if (!atomic_load(&races)) {
            fprintf(stderr, "e2e_race: expected the detector to see races and it saw none\n");
            e2e_failures++;
        }
    } else {
        CHECK_EQ(atomic_load(&races), 0);
    }
    return e2e_done("e2e_race");
}
