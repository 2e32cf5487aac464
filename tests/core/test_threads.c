/*
 * Threads hammering one pool: allocations, frees of their own and of other
 * threads' blocks, fenced frees into per-thread lanes, a progress thread that
 * retires fences, and a checker thread. An atomic ownership map over the
 * simulated address space (one byte per 256-byte unit) catches any byte
 * handed to two owners at once. Built for ThreadSanitizer too.
 *
 *   test_threads [--threads N] [--ops N] [--growth | --vmm]
 *
 * --vmm runs the pool over virtual memory with a 1 MiB release threshold, so
 * that granules are mapped and unmapped under contention too (the checker
 * thread proves every live byte mapped).
 */
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "pool_fixture.h"

#define SPAN (512 * MiB)
#define UNITS (SPAN / 256)
#define MAX_THREADS 16
#define MAILBOX 64

static atomic_uchar owner[UNITS];
static bfc_pool *pool;
static uint64_t base_addr;
static atomic_uint_fast64_t next_token, completed;
static atomic_bool stop;
static atomic_int violations;

static pthread_mutex_t mailbox_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { bfc_addr addr; uint64_t rounded; } mailbox[MAILBOX];
static int mailbox_n;

static bool fence_done(void *ctx, uint32_t lane, uint64_t token, bool wait)
{
    (void)ctx, (void)lane;
    if (wait) {
        uint64_t c = atomic_load(&completed);
        while (c < token && !atomic_compare_exchange_weak(&completed, &c, token))
            ;
        return true;
    }
    return token <= atomic_load(&completed);
}

static void claim(bfc_addr a, uint64_t n)
{
    for (uint64_t u = (a - base_addr) / 256; u < (a - base_addr + n) / 256; u++)
        if (atomic_exchange(&owner[u], 1) != 0) {
            fprintf(stderr, "byte unit %#llx handed out twice\n",
                    (unsigned long long)(base_addr + u * 256));
            atomic_fetch_add(&violations, 1);
            return;
        }
}

static void release(bfc_addr a, uint64_t n)
{
    for (uint64_t u = (a - base_addr) / 256; u < (a - base_addr + n) / 256; u++)
        atomic_store(&owner[u], 0);
}

typedef struct worker {
    pthread_t tid;
    uint64_t seed, ops;
    uint32_t lane;
    bfc_addr addr[256];
    uint64_t rounded[256];
    int n;
    uint64_t allocs, ooms;
} worker;

static void free_one(worker *w, int i, bool fenced)
{
    bfc_addr a = w->addr[i];
    release(a, w->rounded[i]);
    bfc_status s = fenced ? bfc_pool_free_fenced(pool, a, w->lane,
                                                 atomic_fetch_add(&next_token, 1) + 1)
                          : bfc_pool_free(pool, a);
    if (s != BFC_OK) {
        fprintf(stderr, "free failed: %s\n", bfc_status_name(s));
        atomic_fetch_add(&violations, 1);
    }
    w->addr[i] = w->addr[--w->n];
    w->rounded[i] = w->rounded[w->n];
}

static void *work(void *arg)
{
    worker *w = arg;
    uint64_t rng = w->seed;
    for (uint64_t op = 0; op < w->ops; op++) {
        uint64_t r = rng_below(&rng, 100);
        if (r < 50 && w->n < 256) {
            uint64_t size = rng_below(&rng, 4) == 0 ? rng_below(&rng, 1 * MiB) + 1
                                                    : rng_below(&rng, 8 * KiB) + 1;
            bfc_addr a;
            bool on_lane = rng_below(&rng, 2);
            bfc_status s = bfc_pool_alloc(pool, size, on_lane ? w->lane : BFC_NO_LANE, &a);
            if (s == BFC_OK) {
                uint64_t rounded = (size + 255) / 256 * 256;
                claim(a, rounded);
                w->addr[w->n] = a;
                w->rounded[w->n++] = rounded;
                w->allocs++;
            } else if (s == BFC_ERR_OOM) {
                w->ooms++;
            } else {
                atomic_fetch_add(&violations, 1);
            }
        } else if (r < 80 && w->n) {
            free_one(w, (int)rng_below(&rng, (uint64_t)w->n), rng_below(&rng, 3) == 0);
        } else if (r < 90 && w->n) {
            /* Hand a block to whichever thread looks in the mailbox next. */
            int i = (int)rng_below(&rng, (uint64_t)w->n);
            pthread_mutex_lock(&mailbox_lock);
            if (mailbox_n < MAILBOX) {
                mailbox[mailbox_n].addr = w->addr[i];
                mailbox[mailbox_n++].rounded = w->rounded[i];
                w->addr[i] = w->addr[--w->n];
                w->rounded[i] = w->rounded[w->n];
            }
            pthread_mutex_unlock(&mailbox_lock);
        } else {
            pthread_mutex_lock(&mailbox_lock);
            bool got = mailbox_n > 0;
            bfc_addr a = got ? mailbox[mailbox_n - 1].addr : 0;
            uint64_t n = got ? mailbox[--mailbox_n].rounded : 0;
            pthread_mutex_unlock(&mailbox_lock);
            if (got) {
                release(a, n);
                if (bfc_pool_free(pool, a) != BFC_OK)
                    atomic_fetch_add(&violations, 1);
            }
        }
    }
    while (w->n)
        free_one(w, 0, false);
    return NULL;
}

/* The "GPU": completes every fence issued so far, over and over. */
static void *progress(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        atomic_store(&completed, atomic_load(&next_token));
        sched_yield();
    }
    return NULL;
}

static void *checker(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        if (bfc_pool_check(pool, stderr) != 0)
            atomic_fetch_add(&violations, 1);
        for (int i = 0; i < 1000 && !atomic_load(&stop); i++)
            sched_yield();
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int nthreads = 4;
    uint64_t ops = 200000;
    bool growth = false, vmm = false;
    static const struct option longopts[] = {{"threads", required_argument, 0, 't'},
                                             {"ops", required_argument, 0, 'n'},
                                             {"growth", no_argument, 0, 'g'},
                                             {"vmm", no_argument, 0, 'v'},
                                             {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 't': nthreads = atoi(optarg); break;
        case 'n': ops = strtoull(optarg, NULL, 0); break;
        case 'g': growth = true; break;
        case 'v': vmm = true; break;
        default: return 2;
        }
    }
    if (nthreads < 1 || nthreads > MAX_THREADS)
        return 2;
    harness_case = vmm ? "vmm" : growth ? "growth" : "preallocated";

    sim_device dev;
    sim_device_init(&dev, 64 * MiB);
    dev.alignment = 256;
    base_addr = dev.next;
    bfc_options opt;
    bfc_options_init(&opt);
    opt.limit_bytes = 64 * MiB;
    opt.preallocate = !growth;
    opt.region_granularity = 256;
    opt.garbage_collection = false; /* keeps every region inside SPAN */
    if (vmm) {
        opt.vmm = true;
        opt.preallocate = false;
        opt.map_granularity = 64 * KiB;
        opt.release_threshold = 1 * MiB;
        dev.alignment = opt.map_granularity;
    }
    bfc_backend b = vmm ? sim_device_vmm_backend(&dev) : sim_device_backend(&dev);
    b.fence_done = fence_done;
    pool = bfc_pool_create(&opt, &b);
    REQUIRE(pool);

    static worker w[MAX_THREADS];
    for (int i = 0; i < nthreads; i++) {
        w[i].seed = (uint64_t)i * 7919 + 1;
        w[i].ops = ops;
        REQUIRE(bfc_pool_lane_open(pool, true, &w[i].lane) == BFC_OK);
    }
    pthread_t prog, chk;
    pthread_create(&prog, NULL, progress, NULL);
    pthread_create(&chk, NULL, checker, NULL);
    for (int i = 0; i < nthreads; i++)
        pthread_create(&w[i].tid, NULL, work, &w[i]);
    uint64_t allocs = 0, ooms = 0;
    for (int i = 0; i < nthreads; i++) {
        pthread_join(w[i].tid, NULL);
        allocs += w[i].allocs;
        ooms += w[i].ooms;
    }
    atomic_store(&stop, true);
    pthread_join(prog, NULL);
    pthread_join(chk, NULL);
    for (int i = 0; i < mailbox_n; i++) {
        release(mailbox[i].addr, mailbox[i].rounded);
        CHECK_EQ(bfc_pool_free(pool, mailbox[i].addr), BFC_OK);
    }
    for (int i = 0; i < nthreads; i++)
        bfc_pool_retire(pool, w[i].lane, UINT64_MAX);
    bfc_stats s;
    bfc_pool_stats(pool, &s);
    CHECK_EQ(s.num_allocs, s.num_frees);
    CHECK_EQ(s.bytes_in_use, 0);
    CHECK_EQ(s.pending_bytes, 0);
    CHECK_EQ(atomic_load(&violations), 0);
    CHECK_EQ(bfc_pool_check(pool, stderr), 0);
    CHECK(dev.next - base_addr <= SPAN);
    printf("%d threads, %" PRIu64 " ops each: %" PRIu64 " allocations, %" PRIu64
           " OOMs, %s\n",
           nthreads, ops, allocs, ooms, harness_failures ? "FAILED" : "clean");
    if (vmm) {
        CHECK(s.num_unmap_calls > 0); /* the threshold did give granules back */
        printf("  %" PRIu64 " map and %" PRIu64 " unmap calls\n", s.num_map_calls,
               s.num_unmap_calls);
    }
    bfc_pool_destroy(pool, true);
    CHECK_EQ(dev.held, 0);
    return harness_result();
}
