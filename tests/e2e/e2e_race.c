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
 *     (cudaStreamWaitEvent), or, between the legacy stream and a blocking
 *     one, behind nothing but the legacy stream's implicit synchronisation;
 *   - streams destroyed with work queued, and replaced;
 *   - device resets, and created contexts destroyed, with work queued and
 *     blocks live (one thread only);
 *   - captures (relaxed mode) begun and ended on non-blocking streams with
 *     work queued, other streams allocating and freeing meanwhile, and other
 *     non-blocking streams with work queued forked into them (a wait on an
 *     event recorded in the capture) and joined back at its end; with one
 *     thread, the per-thread default stream forks in too (a blocking
 *     stream: the legacy stream is left alone until the end, which other
 *     threads' programs could not know);
 *   - completions of streams in any order, and synchronisations;
 *   - allocations and frees through the C interface of bfcshim.h as a
 *     third door (bfcshim_malloc, bfcshim_free, their stream-ordered
 *     twins and the PyTorch plug-in's pair), also freeing a block stream-ordered on its stream after that
 *     stream was destroyed, as the CuPy plug-in may; with `plugin`, the
 *     library is not preloaded but opened as the Python plug-ins open it
 *     (dlopen, RTLD_LOCAL, from LIBBFCSHIM): it then sees none of the
 *     program's streams, and only the C interface's blocks are pooled;
 *   - with `ordered`, created streams are blocking ones (every stream then
 *     keeps to the legacy stream's order, and a plain free is fenced by a
 *     barrier and reused at once), except in the second half of every fifth
 *     seed, where non-blocking streams end that state mid-program;
 *   - with `teardown`, two more threads make contexts of their own on
 *     device 0, use them (blocks, kernels) and destroy them with work
 *     queued, all the while;
 *   - with devices=N, blocks on N devices, each used on its own device's
 *     streams, with any device current where CUDA allows it: plain frees
 *     and stream-ordered calls on created streams name their device
 *     themselves (a block freed with another device current must still be
 *     fenced by its own device's streams); with contexts=N, N contexts
 *     created on device 0 join them as places of their own, each with its
 *     own pool, destroyed and made again now and then (one thread).
 * Every kernel checks that its block still holds the block's own tag, then
 * writes it again; the first kernel of a block writes the tag. A kernel that
 * finds another block's tag ran after the memory had been given to someone
 * else while it was queued: a race. Every capture must end valid.
 *
 * The programs keep CUDA's rules: a block is used on one stream at a time; a
 * stream-ordered free goes on its stream; a block whose stream is destroyed
 * is only freed plainly afterwards; a block from cuMemAllocAsync is freed
 * plainly only once its work is done (cuMemFree does not synchronise for
 * those), and as a plug-in so is every block the library does not pool
 * (cuMemFree only "may" synchronise for the others: cuda.h); nothing is
 * allocated into, freed into, used on or synchronised with a capturing
 * stream, and nothing synchronises the device during a capture.
 *
 * Tags are written and checked once per 256 bytes: every block starts on a
 * 512-byte boundary and is a multiple of it, so a block that overlaps
 * another covers at least one of its sampled words.
 *
 *   e2e_race SEED_FIRST-SEED_LAST OPS [threads=N] [devices=N] [contexts=N] [plugin]
 *            [teardown] [ordered] [expect-races]
 *   e2e_race SCENARIO      (meson's tests: seeds 1-20, 3000 operations; with
 *                          threads=3 when SCENARIO names "threads",
 *                          devices=2 when it names "devices", contexts=1
 *                          when it names "contexts", plugin, teardown and ordered
 *                          when it names them (seeds 1-8 with teardown;
 *                          at most E2E_RACE_SEEDS seeds when it is set),
 *                          expect-races when it names "immediate")
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

#define NSLOTS 5      /* stream slots per device: legacy, per-thread default, three created */
#define MAXDEV 4
#define MAXCTX 2
#define MAXPLACES (MAXDEV + MAXCTX)
#define MAXLIVE 48
#define STRIDE 32     /* words between sampled words: 256 bytes */

typedef struct block {
    uint64_t *mem;
    size_t bytes;
    uint64_t tag;
    int place;        /* the context it lives in (and its streams): see use_place */
    int home;         /* stream slot on that device */
    bool async;       /* from cudaMallocAsync or cuMemAllocAsync */
    bool api;         /* from the C interface (bfcshim.h) */
    bool orphan;      /* its stream was destroyed: only a plain free remains */
    cudaStream_t dead_home; /* an orphan's destroyed stream */
    /* Handed to the legacy stream implicitly, its last work still on the
     * blocking stream it came from: until a legacy operation, nothing
     * orders that work before another blocking stream's (see hand_over). */
    bool legacy_in_name_only;
    int name_only_from; /* that blocking stream's slot */
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
    CUresult (*CtxCreate)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice);
    CUresult (*CtxDestroy)(CUcontext);
    CUresult (*CtxSetCurrent)(CUcontext);
} cu;

/* The C interface of bfcshim.h: the preloaded library's, or (plugin) one
 * opened as the Python plug-ins open it; NULL members when there is none. */
static struct {
    int (*malloc)(void **, size_t, int);
    int (*free)(void *);
    int (*malloc_async)(void **, size_t, int, void *);
    int (*free_async)(void *, void *);
    /* the PyTorch plug-in's pair (CUDAPluggableAllocator's signatures) */
    void *(*torch_alloc)(ssize_t, int, void *);
    void (*torch_free)(void *, size_t, int, void *);
} api;
static bool plugin; /* the library is not preloaded: it sees no stream */
static bool handles_reused; /* FAKECUDA_REUSE_STREAM_HANDLES: the fake reuses stream handles */

static void load_api(void)
{
    void *h = RTLD_DEFAULT;
    if (plugin) {
        const char *path = getenv("LIBBFCSHIM");
        if (!path || !(h = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
            fprintf(stderr, "e2e_race: plugin: dlopen(LIBBFCSHIM=%s): %s\n",
                    path ? path : "(unset)", dlerror());
            exit(1);
        }
    }
    *(void **)&api.malloc = dlsym(h, "bfcshim_malloc");
    *(void **)&api.free = dlsym(h, "bfcshim_free");
    *(void **)&api.malloc_async = dlsym(h, "bfcshim_malloc_async");
    *(void **)&api.free_async = dlsym(h, "bfcshim_free_async");
    *(void **)&api.torch_alloc = dlsym(h, "bfcshim_torch_alloc");
    *(void **)&api.torch_free = dlsym(h, "bfcshim_torch_free");
    if (!api.malloc || !api.free || !api.malloc_async || !api.free_async || !api.torch_alloc ||
        !api.torch_free) {
        if (plugin) {
            fprintf(stderr, "e2e_race: plugin: the library lacks the C interface\n");
            exit(1);
        }
        memset(&api, 0, sizeof api);
    }
}

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
    *(void **)&cu.CtxCreate = dlsym(h, "cuCtxCreate_v4");
    *(void **)&cu.CtxDestroy = dlsym(h, "cuCtxDestroy_v2");
    *(void **)&cu.CtxSetCurrent = dlsym(h, "cuCtxSetCurrent");
    if (!cu.Alloc || !cu.Free || !cu.AllocAsync || !cu.FreeAsync || !cu.CtxCreate ||
        !cu.CtxDestroy || !cu.CtxSetCurrent) {
        fprintf(stderr, "e2e_race: libcuda.so.1 lacks an allocation call\n");
        exit(1);
    }
}

/* One program per thread, over `nplaces` places, each with its stream slots.
 * Slots 0 and 1 (the legacy and the per-thread default stream) are named by
 * handles that mean "of the current context", so a program makes the
 * block's place current before it uses them; created streams are used with
 * any place current, as CUDA allows (stream-ordered calls act on the
 * stream's context), and plain frees happen with whichever is current. */
static int ndev = 1;
/* Places 0 to ndev-1 are the devices' primary contexts (made current with
 * cudaSetDevice); the next nctx are contexts created on device 0
 * (cuCtxCreate, made current with cuCtxSetCurrent), each with a pool of its
 * own on the device the primary context's pool also uses. */
static int nctx, nplaces = 1;
static CUcontext created_ctx[MAXPLACES];
static _Thread_local cudaStream_t slot[MAXPLACES][NSLOTS];
static _Thread_local bool slot_non_blocking[MAXPLACES][NSLOTS];
static _Thread_local int current_place;
/* The slot whose stream is capturing (relaxed mode), or -1, and its place.
 * Only a non-blocking stream captures: a blocking one would forbid the
 * legacy stream to every thread, which other threads' programs do not
 * know. */
static _Thread_local int capturing = -1, capturing_place;
/* Slots of the capturing place forked into that capture (each waited on
 * an event recorded in it), a bit each: they capture too, with no begin of
 * their own, until the capture's end joins them back. Created non-blocking
 * slots, and with one thread the per-thread default stream (slot 1), whose
 * capture makes the legacy stream (slot 0) unusable meanwhile. */
static _Thread_local unsigned forked;
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

static void use_place(int d)
{
    if (d != current_place) {
        if (d < ndev)
            EXPECT(cudaSetDevice(d), cudaSuccess);
        else
            EXPECT(cu.CtxSetCurrent(created_ctx[d]), CUDA_SUCCESS);
        current_place = d;
    }
}

/* Makes d current when slot s's handle means "the current context's". */
static cudaStream_t stream_at(int d, int s)
{
    if (s < 2)
        use_place(d);
    return slot[d][s];
}

static bool is_capturing(int d, int s)
{
    return capturing >= 0 && capturing_place == d &&
           (capturing == s || (forked >> s & 1) || (s == 0 && (forked >> 1 & 1)));
}
/* Streams destroyed with work maybe still queued, and their places. */
typedef struct destroyed_stream {
    cudaStream_t stream;
    int place;
} destroyed_stream;
static _Thread_local destroyed_stream destroyed[1024];
static _Thread_local size_t ndestroyed;
static bool single_thread; /* contexts go away only then: they kill every thread's handles */
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

static void launch(block *b, bool first)
{
    b->legacy_in_name_only = false; /* a legacy kernel waits for the blocking streams */
    kernel *k = malloc(sizeof *k);
    *k = (kernel){.mem = b->mem, .bytes = b->bytes, .tag = b->tag, .first = first,
                  .seed = seed_now, .op = op_now};
    EXPECT(fakecuda()->launch(stream_at(b->place, b->home), run_kernel, k), 0);
}

static size_t random_size(void)
{
    /* 2 MiB: whole granules of the fake's default map granule, which the
     * default pool places by a rule of their own (granule boundaries). */
    static const size_t sizes[] = {512, 4096, 65536, 1u << 20, 2u << 20, 3u << 20};
    size_t n = sizes[pick(sizeof sizes / sizeof *sizes)];
    return n + (pick(4) ? 0 : 512 * pick(8)); /* some odd multiples of the granule */
}

static void new_block(bool async)
{
    if (nlive == MAXLIVE)
        return;
    const int place = (int)pick((size_t)nplaces);
    int home = (int)pick(NSLOTS);
    if (is_capturing(place, home)) /* an allocation there would be the graph's */
        home = 0;
    if (is_capturing(place, home)) /* the legacy stream, while a blocking fork captures */
        return;
    size_t n = random_size();
    void *p = NULL;
    /* 0 the runtime, 1 the driver, 2 the C interface; plugin: the C
     * interface's blocks are the only pooled ones, so most come from it. */
    const int door = plugin ? (pick(4) ? 2 : (int)pick(2)) : (int)pick(api.malloc ? 3 : 2);
    const bool driver = door == 1;
    /* A plain allocation comes from the current device; a stream-ordered
     * one from its stream's, whichever device is current. */
    if (!async)
        use_place(place);
    cudaStream_t st = stream_at(place, home);
    if (door == 2) {
        /* The device the place lives on; a created context, current, is
         * the one the interface takes for device 0. */
        int device = place < ndev ? place : 0;
        use_place(place);
        int r;
        if (async && pick(2)) { /* the PyTorch plug-in's entry point: NULL on failure */
            p = api.torch_alloc((ssize_t)n, device, st);
            r = p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            r = async ? api.malloc_async(&p, n, device, st) : api.malloc(&p, n, device);
        }
        if (r == CUDA_ERROR_OUT_OF_MEMORY)
            return;
        EXPECT(r, CUDA_SUCCESS);
        if (r != CUDA_SUCCESS)
            return;
    } else if (driver) {
        CUdeviceptr d = 0;
        CUresult r = async ? cu.AllocAsync(&d, n, (CUstream)st) : cu.Alloc(&d, n);
        if (r == CUDA_ERROR_OUT_OF_MEMORY)
            return; /* a full device: allowed */
        EXPECT(r, CUDA_SUCCESS);
        if (r != CUDA_SUCCESS)
            return;
        p = (void *)(uintptr_t)d;
    } else {
        cudaError_t e = async ? cudaMallocAsync(&p, n, st) : cudaMalloc(&p, n);
        if (e == cudaErrorMemoryAllocation)
            return;
        EXPECT(e, cudaSuccess);
        if (e != cudaSuccess)
            return;
    }
    block *b = &live[nlive++];
    *b = (block){.mem = p, .bytes = n, .tag = atomic_fetch_add(&next_tag, 1) + 1, .place = place,
                 .home = home, .async = async, .api = door == 2};
    static const char *const names[3][2] = {{"cudaMalloc", "cudaMallocAsync"},
                                            {"cuMemAlloc", "cuMemAllocAsync"},
                                            {"bfcshim_malloc", "bfcshim_malloc_async"}};
    trace("alloc tag %llu at %p, %zu bytes, %s, place %d (current %d), stream slot %d (%p)",
          (unsigned long long)b->tag, (void *)b->mem, n, names[door][async], place, current_place,
          home, (void *)st);
    launch(b, true);
}

static void free_block(size_t i, bool async)
{
    block *b = &live[i];
    const bool home_captures = is_capturing(b->place, b->home);
    /* While its stream captures, a block is not freed stream-ordered there
     * (a free node takes only graph allocations), and one from
     * cuMemAllocAsync is not freed plainly (its stream cannot be
     * synchronised); an orphan from cuMemAllocAsync waits for the device,
     * which no capture allows. */
    if (capturing >= 0 && b->async && (home_captures || b->orphan))
        return;
    if (home_captures)
        async = false;
    /* Any door frees a pooled block when the library is preloaded; as a
     * plug-in, the C interface's blocks are the only pooled ones, and only
     * it frees them. */
    const int door = plugin ? (b->api ? 2 : (int)pick(2)) : (int)pick(api.free ? 3 : 2);
    const bool driver = door == 1;
    const CUdeviceptr d = (CUdeviceptr)(uintptr_t)b->mem;
    /* The C interface may free an orphan on its destroyed stream (the CuPy
     * plug-in did): where the library sees streams it knows the stream is
     * gone, and remembers it as one of the block's context (among the last
     * 1024 destroyed, far more than a run here destroys between an orphan's
     * stream and its free). Not as a plug-in: then the caller must keep the stream alive
     * until the free (bfcshim.h), as the CuPy plug-in does. */
    /* Nor where the driver hands a destroyed stream's handle to the next
     * stream made (FAKECUDA_REUSE_STREAM_HANDLES): the handle then names
     * a live stream, and nothing can tell the two apart
     * (docs/limitations.md). */
    const bool on_dead_stream = async && b->orphan && door == 2 && !plugin && !handles_reused;
    async = async && !b->orphan;
    /* As a plug-in, the other doors' blocks are the driver's own, and
     * cuda.h's rules hold for them: a stream-ordered free is for
     * stream-ordered memory. */
    if (plugin && door != 2 && !b->async)
        async = false;
    static const char *const names[3][2] = {{"cudaFree", "cudaFreeAsync"},
                                            {"cuMemFree", "cuMemFreeAsync"},
                                            {"bfcshim_free", "bfcshim_free_async"}};
    trace("free tag %llu at %p, %s%s, place %d (current %d), stream slot %d (%p)",
          (unsigned long long)b->tag, (void *)b->mem, names[door][async || on_dead_stream],
          b->orphan ? " (orphan)" : "", b->place, current_place, b->home,
          (void *)slot[b->place][b->home]);
    if (on_dead_stream) {
        EXPECT(api.free_async(b->mem, b->dead_home), CUDA_SUCCESS);
    } else if (async && door == 2) {
        cudaStream_t st = stream_at(b->place, b->home);
        if (pick(2)) /* the PyTorch plug-in's free: stream-ordered, no result */
            api.torch_free(b->mem, b->bytes, b->place < ndev ? b->place : 0, st);
        else
            EXPECT(api.free_async(b->mem, st), CUDA_SUCCESS);
    } else if (async) {
        cudaStream_t st = stream_at(b->place, b->home);
        if (driver)
            EXPECT(cu.FreeAsync(d, (CUstream)st), CUDA_SUCCESS);
        else
            EXPECT(cudaFreeAsync(b->mem, st), cudaSuccess);
    } else {
        /* cuda.h, cuMemFree: no implicit synchronisation for a pointer from
         * cuMemAllocAsync; "callers must ensure that all accesses to these
         * pointer have completed". Other pointers may be freed with work
         * queued (the real free synchronises; the shim fences), and with
         * another device current (unified addressing names the block). */
        if (b->async && b->orphan) {
            use_place(b->place);
            device_synchronize();
        } else if (plugin && !b->api) {
            /* The driver's own memory, which no shim fences: cuMemFree
             * "may perform implicit synchronization" for cuMemAlloc's
             * (cuda.h), so a correct program waits for its work first, and
             * must for cuMemAllocAsync's. Its last work may be on another
             * stream than its home (handed over implicitly between the
             * legacy stream and a blocking one), which a stream's
             * synchronisation does not wait for. No capture runs as a
             * plug-in. */
            use_place(b->place);
            device_synchronize();
        } else if (b->async) {
            EXPECT(cudaStreamSynchronize(stream_at(b->place, b->home)), cudaSuccess);
        }
        if (door == 2)
            EXPECT(api.free(b->mem), CUDA_SUCCESS);
        else if (driver)
            EXPECT(cu.Free(d), CUDA_SUCCESS);
        else
            EXPECT(cudaFree(b->mem), cudaSuccess);
    }
    live[i] = live[--nlive];
}

/* Moves a block to another stream of its device, as a program hands a
 * tensor over: an event recorded on its stream (an event of the device's
 * context: that device current when it is made), the new stream waiting for
 * it (and the event destroyed at once: the wait keeps what it captured). Its
 * later kernels and a stream-ordered free go on the new stream; a block
 * reused there at once after that free is safe only if the wait orders the
 * old stream's work first. */
static bool blocking_slot(int d, int s) { return s == 1 || (s >= 2 && !slot_non_blocking[d][s]); }

static void hand_over(block *b)
{
    int to = (int)pick(NSLOTS);
    if (b->orphan || to == b->home || is_capturing(b->place, to) || is_capturing(b->place, b->home))
        return;
    /* Between the legacy stream and a blocking one no event is needed: each
     * operation of one waits for the other's work queued before it. Not
     * from one blocking stream to another through the legacy stream with no
     * legacy operation in between: blocking streams wait for the legacy
     * stream's work, not for each other's. (Passing through, a block's work
     * would be ordered by nothing, and its old allocation's kernels could
     * run after its new one's first: the shape of every race this program
     * reported with threads=3 before this rule, ~1 run in 800.) */
    const bool implicit = (b->home == 0 && blocking_slot(b->place, to) && !b->legacy_in_name_only) ||
                          (to == 0 && blocking_slot(b->place, b->home));
    if (implicit && pick(2)) {
        trace("tag %llu handed from stream slot %d to %d in place %d, implicitly",
              (unsigned long long)b->tag, b->home, to, b->place);
        b->legacy_in_name_only = to == 0;
        b->name_only_from = b->home;
        b->home = to;
        return;
    }
    use_place(b->place);
    cudaEvent_t ev;
    EXPECT(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
    EXPECT(cudaEventRecord(ev, slot[b->place][b->home]), cudaSuccess);
    EXPECT(cudaStreamWaitEvent(slot[b->place][to], ev, 0), cudaSuccess);
    EXPECT(cudaEventDestroy(ev), cudaSuccess);
    trace("tag %llu handed from stream slot %d to %d in place %d", (unsigned long long)b->tag,
          b->home, to, b->place);
    b->legacy_in_name_only = false; /* the record on the legacy stream was an operation */
    b->home = to;
}

/* `ordered`: created streams are blocking, so a pool keeps to the legacy
 * stream's order (its plain frees fenced by barriers, reused at once), until
 * the second half of every fifth seed, where non-blocking streams end that
 * state in the middle of the work. */
static bool ordered_only;
static unsigned ops_per_seed;

static bool may_be_non_blocking(void)
{
    return !ordered_only || (seed_now % 5 == 0 && op_now >= ops_per_seed / 2);
}

/* Puts a new created stream of place d in slot s. */
static void make_stream(int d, int s, bool non_blocking)
{
    non_blocking = non_blocking && may_be_non_blocking();
    use_place(d); /* a stream belongs to the context current when it is made */
    slot_non_blocking[d][s] = non_blocking;
    EXPECT(cudaStreamCreateWithFlags(&slot[d][s], non_blocking ? cudaStreamNonBlocking : 0),
           cudaSuccess);
}

/* Destroys a created stream with its work still queued (CUDA lets that work
 * finish), whichever place is current, and puts a new one of the same place
 * in its slot; its blocks become orphans. A block handed to the legacy
 * stream implicitly, its last work still on this stream, is handed over
 * with an event first: whether the legacy stream's implicit wait for "all
 * blocking streams" includes a destroyed one is not documented (the fake's
 * FAKECUDA_LEGACY_SKIPS_DESTROYED: it does not), so the block's next legacy
 * kernel could run before its work here (threads-devices reported that
 * under it, ~1 run in 6). Not while the legacy stream may not be used: the
 * stream is kept then. */
static void replace_stream(void)
{
    int d = (int)pick((size_t)nplaces), s = 2 + (int)pick(NSLOTS - 2);
    if (is_capturing(d, s))
        return;
    bool name_only = false;
    for (size_t i = 0; i < nlive; i++)
        name_only |= live[i].place == d && live[i].legacy_in_name_only &&
                     live[i].name_only_from == s;
    if (name_only) {
        if (is_capturing(d, 0))
            return;
        use_place(d);
        cudaEvent_t ev;
        EXPECT(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
        EXPECT(cudaEventRecord(ev, slot[d][s]), cudaSuccess);
        EXPECT(cudaStreamWaitEvent(slot[d][0], ev, 0), cudaSuccess);
        EXPECT(cudaEventDestroy(ev), cudaSuccess);
        for (size_t i = 0; i < nlive; i++)
            if (live[i].place == d && live[i].legacy_in_name_only && live[i].name_only_from == s) {
                trace("tag %llu handed from stream slot %d to 0 in place %d before its destroy",
                      (unsigned long long)live[i].tag, s, d);
                live[i].legacy_in_name_only = false;
            }
    }
    EXPECT(cudaStreamDestroy(slot[d][s]), cudaSuccess);
    if (ndestroyed < sizeof destroyed / sizeof *destroyed)
        destroyed[ndestroyed++] = (destroyed_stream){slot[d][s], d};
    for (size_t i = 0; i < nlive; i++)
        if (live[i].place == d && live[i].home == s && !live[i].orphan) {
            live[i].orphan = true;
            live[i].dead_home = slot[d][s];
        }
    make_stream(d, s, pick(2));
    trace("stream slot %d of place %d destroyed, now %p", s, d, (void *)slot[d][s]);
}

static void create_streams(int d)
{
    slot[d][0] = NULL;                /* the legacy default stream */
    slot[d][1] = cudaStreamPerThread; /* this thread's default stream */
    for (int s = 2; s < NSLOTS; s++)
        make_stream(d, s, s != 2);
}

/* A context that goes away with work queued on its streams (destroyed ones
 * too) and blocks live: cudaDeviceReset of a device's primary context, or
 * cuCtxDestroy of a created one, replaced by a new one. The driver finishes
 * the work, then the context, its streams and its memory go. The program
 * forgets the place's blocks and streams and starts over there; the shim
 * must not touch a dead handle (stale_handle_uses) and must serve the place
 * from a fresh pool, the other places' pools untouched. (CUDA would keep
 * stream-ordered blocks; the shim's pool goes with its context,
 * docs/limitations.md, so the program forgets those as well.) */
static void reset_place(int d)
{
    if (!single_thread || capturing >= 0)
        return;
    use_place(d);
    if (d < ndev) {
        EXPECT(cudaDeviceReset(), cudaSuccess);
    } else {
        EXPECT(cu.CtxDestroy(created_ctx[d]), CUDA_SUCCESS);
        EXPECT(cu.CtxCreate(&created_ctx[d], NULL, 0, 0), CUDA_SUCCESS); /* current now */
    }
    for (size_t i = 0; i < nlive;)
        if (live[i].place == d) {
            /* As a plug-in, the driver's own stream-ordered blocks outlive
             * their context (cuda.h), and would hold the device for good:
             * freed now (the reset finished their work). */
            if (plugin && live[i].async && !live[i].api)
                EXPECT(cu.Free((CUdeviceptr)(uintptr_t)live[i].mem), CUDA_SUCCESS);
            live[i] = live[--nlive];
        } else {
            i++;
        }
    for (size_t i = 0; i < ndestroyed;)
        if (destroyed[i].place == d)
            destroyed[i] = destroyed[--ndestroyed];
        else
            i++;
    if (d < ndev)
        EXPECT(cudaSetDevice(d), cudaSuccess); /* "any subsequent API call ... will reinitialize" */
    create_streams(d);
    trace("place %d reset", d);
}

/* Begins a capture (relaxed mode) on a non-blocking created stream, or ends
 * the one under way. Work queued there before the capture still runs while
 * no event can be recorded on the stream; blocks freed meanwhile elsewhere
 * must still wait for it. The capture must come out valid: nothing the
 * shim does on the program's behalf may invalidate it. */
static void toggle_capture(void)
{
    /* As a plug-in the library sees no capture, and the context
     * synchronisation a plain free may need would invalidate it
     * (docs/limitations.md): such programs do not capture here. */
    if (plugin)
        return;
    if (capturing >= 0) {
        cudaStream_t origin = slot[capturing_place][capturing];
        if (forked)
            use_place(capturing_place); /* an event of the streams' context */
        for (int s = 1; s < NSLOTS; s++) /* join every fork back */
            if (forked >> s & 1) {
                cudaEvent_t e;
                EXPECT(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
                EXPECT(cudaEventRecord(e, slot[capturing_place][s]), cudaSuccess);
                EXPECT(cudaStreamWaitEvent(origin, e, 0), cudaSuccess);
                EXPECT(cudaEventDestroy(e), cudaSuccess);
            }
        forked = 0;
        cudaGraph_t g;
        EXPECT(cudaStreamEndCapture(origin, &g), cudaSuccess);
        pthread_rwlock_unlock(&capture_gate);
        trace("capture on stream slot %d of place %d ended", capturing, capturing_place);
        capturing = -1;
        return;
    }
    int d = (int)pick((size_t)nplaces), s = 2 + (int)pick(NSLOTS - 2);
    if (!slot_non_blocking[d][s])
        return;
    pthread_rwlock_rdlock(&capture_gate);
    EXPECT(cudaStreamBeginCapture(slot[d][s], cudaStreamCaptureModeRelaxed), cudaSuccess);
    capturing = s;
    capturing_place = d;
    trace("capture on stream slot %d of place %d begun", s, d);
}

/* Forks a created non-blocking stream of the capturing place (or, with one
 * thread, the per-thread default stream) into the capture under way: it
 * waits on an event recorded on the origin, as multi-stream graph capture
 * (and NCCL) do. Its work queued before the fork still runs, and no begin
 * was made on it: blocks freed meanwhile must still wait for that work. */
static void fork_into_capture(void)
{
    const int d = capturing_place, s = 1 + (int)pick(NSLOTS - 1);
    const bool per_thread = s == 1 && single_thread;
    if (is_capturing(d, s) || !(slot_non_blocking[d][s] || per_thread))
        return;
    use_place(d); /* an event of the streams' context */
    cudaEvent_t e;
    EXPECT(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
    EXPECT(cudaEventRecord(e, slot[d][capturing]), cudaSuccess);
    EXPECT(cudaStreamWaitEvent(slot[d][s], e, 0), cudaSuccess);
    EXPECT(cudaEventDestroy(e), cudaSuccess);
    forked |= 1u << s;
    trace("stream slot %d of place %d forked into the capture", s, d);
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
            if (!b->orphan && !is_capturing(b->place, b->home))
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
        int d = (int)pick((size_t)nplaces);
        fakecuda()->complete(stream_at(d, (int)pick(NSLOTS)));
    } else if (r < 95) {
        if (capturing >= 0 && pick(2))
            fork_into_capture();
        else
            toggle_capture();
    } else if (r < 97) {
        if (ndestroyed)
            fakecuda()->complete(destroyed[pick(ndestroyed)].stream);
    } else if (r < 98) {
        replace_stream();
    } else if (r < 99) {
        if (pick(8))
            use_place((int)pick((size_t)nplaces)); /* a program moving on to another device */
        else
            reset_place((int)pick((size_t)nplaces));
    } else if (capturing < 0) { /* no synchronisation during a capture */
        int d = (int)pick((size_t)nplaces);
        if (pick(2)) {
            EXPECT(cudaStreamSynchronize(stream_at(d, (int)pick(NSLOTS))), cudaSuccess);
        } else {
            use_place(d);
            device_synchronize();
        }
    }
}

static void run_seed(unsigned seed, unsigned ops)
{
    seed_now = seed;
    rng_state = 0x9e3779b97f4a7c15ull * (seed + 1);
    for (int d = 0; d < nplaces; d++)
        create_streams(d);
    for (op_now = 0; op_now < ops; op_now++)
        one_op();
    if (capturing >= 0)
        toggle_capture();
    fakecuda()->complete_all();
    for (size_t i = 0; i < ndestroyed; i++)
        fakecuda()->complete(destroyed[i].stream);
    ndestroyed = 0;
    while (nlive)
        free_block(nlive - 1, false);
    for (int d = 0; d < nplaces; d++)
        for (int s = 2; s < NSLOTS; s++)
            EXPECT(cudaStreamDestroy(slot[d][s]), cudaSuccess);
    fakecuda()->complete_all();
}

/* `teardown`: a thread that makes a context of its own on device 0 again
 * and again, allocates in it (pooled: the driver door when preloaded, the C
 * interface as a plug-in), queues kernels, frees and allocates again, and
 * destroys the context with the kernels still queued. The driver runs them
 * inside cuCtxDestroy, each checking its block's tag: memory another
 * thread's teardown gave back or handed out meanwhile shows as a race, or
 * as a fault. Runs until the programs are done. */
static atomic_bool teardown_stop;
static _Atomic uint64_t teardowns;

static bool teardown_alloc(void **p, size_t n)
{
    CUdeviceptr d = 0;
    int r = plugin ? api.malloc(p, n, 0) : (int)cu.Alloc(&d, n);
    if (!plugin)
        *p = (void *)(uintptr_t)d;
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY)
        atomic_fetch_add(&failed_calls, 1);
    return r == CUDA_SUCCESS;
}

static void teardown_free(void *p)
{
    EXPECT(plugin ? api.free(p) : (int)cu.Free((CUdeviceptr)(uintptr_t)p), CUDA_SUCCESS);
}

static void teardown_launch(cudaStream_t st, void *mem, size_t bytes, uint64_t tag, bool first)
{
    kernel *k = malloc(sizeof *k);
    *k = (kernel){.mem = mem, .bytes = bytes, .tag = tag, .first = first, .seed = seed_now,
                  .op = op_now};
    EXPECT(fakecuda()->launch(st, run_kernel, k), 0);
}

static void *teardown_loop(void *arg)
{
    seed_now = (unsigned)(uintptr_t)arg;
    rng_state = 0x9e3779b97f4a7c15ull * (seed_now + 1);
    for (op_now = 0; !atomic_load(&teardown_stop); op_now++) {
        CUcontext c = NULL;
        if (cu.CtxCreate(&c, NULL, 0, 0) != CUDA_SUCCESS) { /* current now */
            atomic_fetch_add(&failed_calls, 1);
            break;
        }
        cudaStream_t st;
        EXPECT(cudaStreamCreateWithFlags(&st, pick(2) && !ordered_only ? cudaStreamNonBlocking : 0),
               cudaSuccess);
        for (int i = 0; i < 6; i++) {
            void *p = NULL;
            size_t n = random_size();
            if (!teardown_alloc(&p, n))
                continue;
            uint64_t tag = atomic_fetch_add(&next_tag, 1) + 1;
            teardown_launch(st, p, n, tag, true);
            teardown_launch(st, p, n, tag, false);
            if (pick(2))
                teardown_free(p); /* fenced: the next allocations must not get it yet */
            if (!pick(4))
                fakecuda()->complete(st);
        }
        EXPECT(cu.CtxDestroy(c), CUDA_SUCCESS); /* the kernels run in here */
        atomic_fetch_add(&teardowns, 1);
    }
    return NULL;
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
    unsigned first = 1, last = 20, ops = 3000, threads = 1, devices = 1, contexts = 0;
    bool expect_races = false, teardown = false;
    if (argc < 2) {
        fprintf(stderr, "usage: e2e_race FIRST-LAST OPS [threads=N] [devices=N] [contexts=N] [expect-races] | SCENARIO\n");
        return 2;
    }
    handles_reused = getenv("FAKECUDA_REUSE_STREAM_HANDLES") != NULL;
    if (sscanf(argv[1], "%u-%u", &first, &last) != 2) {
        threads = strstr(argv[1], "threads") ? 3 : 1;
        devices = strstr(argv[1], "devices") ? 2 : 1;
        contexts = strstr(argv[1], "contexts") ? 1 : 0;
        plugin = strstr(argv[1], "plugin") != NULL;
        teardown = strstr(argv[1], "teardown") != NULL;
        expect_races = strstr(argv[1], "immediate") != NULL;
        ordered_only = strstr(argv[1], "ordered") != NULL;
        if (teardown) /* the two tearing threads triple the work: fewer seeds */
            last = 8;
        /* E2E_RACE_SEEDS (meson sets it in sanitizer builds, where every
         * kernel costs five to fifteen times as much): fewer seeds. */
        const char *fewer = getenv("E2E_RACE_SEEDS");
        if (fewer && atoi(fewer) > 0 && (unsigned)atoi(fewer) < last)
            last = (unsigned)atoi(fewer);
    } else if (argc > 2) {
        ops = (unsigned)atoi(argv[2]);
    }
    for (int a = 3; a < argc; a++)
        if (strcmp(argv[a], "expect-races") == 0)
            expect_races = true;
        else if (strcmp(argv[a], "plugin") == 0)
            plugin = true;
        else if (strcmp(argv[a], "teardown") == 0)
            teardown = true;
        else if (strcmp(argv[a], "ordered") == 0)
            ordered_only = true;
        else if (sscanf(argv[a], "devices=%u", &devices) == 1) {
            if (devices < 1 || devices > MAXDEV) {
                fprintf(stderr, "e2e_race: devices=%u: 1 to %d\n", devices, MAXDEV);
                return 2;
            }
        } else if (sscanf(argv[a], "contexts=%u", &contexts) == 1) {
            if (contexts > MAXCTX) {
                fprintf(stderr, "e2e_race: contexts=%u: 0 to %d\n", contexts, MAXCTX);
                return 2;
            }
        } else if (sscanf(argv[a], "threads=%u", &threads) != 1 || threads < 1 || threads > 16) {
            fprintf(stderr, "e2e_race: bad argument %s\n", argv[a]);
            return 2;
        }
    ops_per_seed = ops;
    e2e_program = "e2e_race";
    tracing = getenv("E2E_RACE_TRACE") != NULL;
    pthread_rwlockattr_t gate_kind;
    pthread_rwlockattr_init(&gate_kind);
    pthread_rwlockattr_setkind_np(&gate_kind, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&capture_gate, &gate_kind);
    EXPECT(cudaFree(NULL), cudaSuccess);
    int count = 0;
    EXPECT(cudaGetDeviceCount(&count), cudaSuccess);
    if (count < (int)devices) {
        fprintf(stderr, "e2e_race: devices=%u, and the driver has %d (FAKECUDA_DEVICES)\n", devices,
                count);
        return 2;
    }
    ndev = (int)devices;
    nctx = (int)contexts;
    nplaces = ndev + nctx;
    single_thread = threads == 1;
    load_driver();
    load_api();
    for (int c = 0; c < nctx; c++) /* shared by the threads, each making it current */
        EXPECT(cu.CtxCreate(&created_ctx[ndev + c], NULL, 0, 0), CUDA_SUCCESS);
    EXPECT(cudaSetDevice(0), cudaSuccess); /* cuCtxCreate made the new one current */
    pthread_t tid[16];
    job jobs[16];
    for (unsigned t = 0; t < threads; t++) {
        jobs[t] = (job){first, last, ops, 1000 * t};
        if (t > 0)
            EXPECT(pthread_create(&tid[t], NULL, run_job, &jobs[t]), 0);
    }
    pthread_t churn[2];
    for (int t = 0; teardown && t < 2; t++)
        EXPECT(pthread_create(&churn[t], NULL, teardown_loop, (void *)(uintptr_t)(50000 + t)), 0);
    run_job(&jobs[0]);
    for (unsigned t = 1; t < threads; t++)
        EXPECT(pthread_join(tid[t], NULL), 0);
    atomic_store(&teardown_stop, true);
    for (int t = 0; teardown && t < 2; t++)
        EXPECT(pthread_join(churn[t], NULL), 0);
    /* Nothing is live and every stream is done: the whole pool must come
     * back. A fence that can never complete (an event recorded on a stream
     * that had begun capturing: a captured event) keeps its blocks pending
     * for good, and this allocation fails. The created contexts go first, so
     * that their pools' memory is the devices' again. */
    for (int c = 0; c < nctx; c++)
        EXPECT(cu.CtxDestroy(created_ctx[ndev + c]), CUDA_SUCCESS);
    current_place = -1;
    for (int d = 0; d < ndev; d++) {
        void *whole = NULL;
        use_place(d);
        if (plugin) { /* the pool is the C interface's */
            EXPECT(api.malloc(&whole, 24u << 20, d), CUDA_SUCCESS);
            EXPECT(api.free(whole), CUDA_SUCCESS);
            continue;
        }
        EXPECT(cudaMalloc(&whole, 24u << 20), cudaSuccess);
        EXPECT(cudaFree(whole), cudaSuccess);
    }
    fakecuda_stats st;
    fakecuda()->stats(&st);
    CHECK_EQ(st.stale_handle_uses, 0);
    CHECK_EQ(st.capture_invalidations, 0);
    e2e_failures += atomic_load(&failed_calls);
    printf("e2e_race: seeds %u-%u, %u operations each, %u thread(s), %d device(s), %d created "
           "context(s)%s%s: %llu kernels, %llu races\n",
           first, last, ops, threads, ndev, nctx, plugin ? ", as a plug-in" : "",
           teardown ? ", two tearing contexts down" : "",
           (unsigned long long)atomic_load(&kernels_run), (unsigned long long)atomic_load(&races));
    if (teardown)
        printf("e2e_race: %llu contexts torn down with work queued\n",
               (unsigned long long)atomic_load(&teardowns));
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
