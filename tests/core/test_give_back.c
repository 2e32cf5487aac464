/*
 * Give-back safety over virtual memory: seeded random runs in which the
 * device refuses some maps and the backend's idle question
 * (bfc_backend.release_ready) often answers "not now", checking that the
 * engine never unmaps memory that queued GPU work may still read.
 *
 *   test_give_back [--seeds A-B | --seed N] [--ops N] [--quiet]
 *
 * Memory is "dirty" from the moment it may still be read by work queued
 * before it became free, until release_ready next answers yes (the shim's
 * answer waits for that work, or for the last barrier: docs/design.md,
 * "Virtual memory" and "Reusable is not idle"). Two kinds of free make it
 * dirty:
 *   - a plain free (bfc_pool_free: the shim under
 *     BFCSHIM_FREE_POLICY=immediate): free at once, work may be queued;
 *   - a deferred free on a lazy lane whose fences complete as made without
 *     the memory being idle (an ordered pool's barrier, "Ordered pools: a
 *     barrier instead of a fence"): dirty once its fence reports done.
 * Frees fenced by events that complete when the simulated GPU reaches them
 * (bfc_pool_free_fenced, a reusable deferred lane) are idle when they
 * retire, and bfc_pool_retire reports only fences the GPU has passed.
 *
 * Each step is an allocation (now and then on the reusable lane), a free of
 * one of the four kinds, a trim, a loan or its end, an explicit seal of the
 * barrier lane or a retirement; the device refuses 0 to 14% of maps, 0 to
 * 9% of unmaps (a refused one unmaps the granules before a drawn one and
 * leaves the rest mapped: the shim's cuMemUnmap refused) and
 * release_ready says no 0 to 70% of the times it is asked, per seed. The
 * seed also draws the limit, preallocation, spread, release threshold,
 * fence interval, split threshold and placement.
 *
 * After every step:
 *   - no unmap since the last yes touched dirty memory (checked inside
 *     unmap, the step reports it);
 *   - every live block is mapped on the device, which saw no double map or
 *     unmap of unmapped memory (sim_device.track_maps), and no keep bracket
 *     is open or memory kept, and the pool counts as mapped (pool_bytes)
 *     what the device holds;
 *   - bfc_pool_check passes.
 * At the end the pool is destroyed (its unmaps are not gated: documented)
 * and the device holds nothing. Over the whole run, the faults must have
 * been injected (refused maps and unmaps, gates closed, yeses answered while memory
 * was dirty), or the run checked nothing.
 * A failure prints the seed and step; `--seed N --ops M` replays it.
 */
#include <getopt.h>
#include <string.h>

#include "pool_fixture.h"

#define GRAN (2 * MiB)
#define MAX_LIVE 4000

typedef struct range {
    bfc_addr lo, hi; /* [lo, hi) */
} range;

/* A deferred free on the barrier lane: its token is known once sealed (0
 * until then). */
typedef struct barrier_free {
    range r;
    uint64_t token;
} barrier_free;

/* A growable array of T. */
#define VEC(T)      \
    struct {        \
        T *at;      \
        size_t n, cap; \
    }

#define VEC_PUSH(v, x)                                                          \
    do {                                                                        \
        if ((v).n == (v).cap) {                                                 \
            (v).cap = (v).cap ? 2 * (v).cap : 64;                               \
            (v).at = realloc((v).at, (v).cap * sizeof *(v).at);                 \
            REQUIRE((v).at);                                                    \
        }                                                                       \
        (v).at[(v).n++] = (x);                                                  \
    } while (0)

typedef struct run {
    uint64_t seed, step;
    fixture f;
    bfc_backend sim; /* the simulated device's own callbacks */
    uint64_t op_rng, dev_rng; /* operations; the device's answers */
    unsigned map_fail_pct, gate_no_pct, unmap_fail_pct;
    /* The simulated GPU: the host's clock and how far the GPU has run. */
    uint64_t now, gpu_done;
    VEC(uint64_t) fenced_tick; /* fenced lane: its token's tick */
    VEC(uint64_t) seal_tick;   /* deferred lanes: the pool's token's tick */
    uint64_t fenced_token;     /* the fenced lane's last token */
    uint32_t fenced_lane, barrier_lane, reusable_lane;
    VEC(barrier_free) barrier_pending;
    VEC(range) dirty;
    bool destroying;   /* the pool's destroy unmaps regardless */
    bool violated;     /* an unmap touched dirty memory */
    range violation;   /* the first such unmap */
    bfc_addr live_addr[MAX_LIVE];
    uint64_t live_size[MAX_LIVE];
    size_t nlive;
    uint64_t lent;
    /* What was exercised. */
    uint64_t map_failures, gates_closed, gates_opened_dirty, unmaps, unmap_failures;
    uint64_t growth_moves, growth_moves_pending; /* num_growth_moves; with blocks pending */
} run;

static void vec_tick_set(uint64_t **at, size_t *n, size_t *cap, uint64_t token, uint64_t tick)
{
    while (*cap <= token) {
        *cap = *cap ? 2 * *cap : 256;
        *at = realloc(*at, *cap * sizeof **at);
        REQUIRE(*at);
    }
    while (*n <= token)
        (*at)[(*n)++] = UINT64_MAX; /* never made: never done */
    (*at)[token] = tick;
}
#define TICK_SET(v, token, tick) vec_tick_set(&(v).at, &(v).n, &(v).cap, (token), (tick))
#define TICK_OF(v, token) ((token) < (v).n ? (v).at[token] : UINT64_MAX)

static bool overlaps(range a, range b)
{
    return a.lo < b.hi && b.lo < a.hi;
}

static void mark_dirty(run *R, range r)
{
    VEC_PUSH(R->dirty, r);
}

/* ---- the backend: the simulated device, with faults and a GPU model ---- */

/* Every callback takes the run; those without faults pass to the device. */
static int gb_region_alloc(void *ctx, uint64_t size, bfc_addr *base)
{
    run *R = ctx;
    return R->sim.region_alloc(R->sim.ctx, size, base);
}

static void gb_region_free(void *ctx, bfc_addr base, uint64_t size)
{
    run *R = ctx;
    R->sim.region_free(R->sim.ctx, base, size);
}

static uint64_t gb_map(void *ctx, bfc_addr addr, uint64_t size)
{
    run *R = ctx;
    if (rng_below(&R->dev_rng, 100) < R->map_fail_pct) {
        R->map_failures++;
        return 0;
    }
    return R->sim.map(R->sim.ctx, addr, size);
}

/* A refused unmap unmaps the granules before a drawn one and leaves that
 * one and the rest mapped (the shim's cuMemUnmap refused), saying how far
 * it got. */
static uint64_t gb_unmap(void *ctx, bfc_addr addr, uint64_t size)
{
    run *R = ctx;
    const range u = {addr, addr + size};
    R->unmaps++;
    if (!R->destroying)
        for (size_t i = 0; i < R->dirty.n; i++)
            if (overlaps(u, R->dirty.at[i]) && !R->violated) {
                R->violated = true;
                R->violation = u;
            }
    if (!R->destroying && rng_below(&R->dev_rng, 100) < R->unmap_fail_pct) {
        R->unmap_failures++;
        size = rng_below(&R->dev_rng, size / GRAN) * GRAN;
        if (size == 0)
            return 0;
    }
    return R->sim.unmap(R->sim.ctx, addr, size);
}

/* Yes forgets every dirty range: the shim's yes waited for their work. */
static bool gb_release_ready(void *ctx)
{
    run *R = ctx;
    if (rng_below(&R->dev_rng, 100) < R->gate_no_pct) {
        R->gates_closed++;
        return false;
    }
    if (R->dirty.n)
        R->gates_opened_dirty++;
    R->dirty.n = 0;
    return true;
}

static void gb_keep(void *ctx, bool on)
{
    run *R = ctx;
    R->sim.keep(R->sim.ctx, on);
}

static bool gb_fence_seal(void *ctx, uint32_t lane, uint64_t token)
{
    run *R = ctx;
    TICK_SET(R->seal_tick, token, R->now);
    if (lane == R->barrier_lane)
        for (size_t i = 0; i < R->barrier_pending.n; i++)
            if (R->barrier_pending.at[i].token == 0)
                R->barrier_pending.at[i].token = token;
    return true;
}

/* The barrier lane's fences are done as made, and what they cover becomes
 * dirty as it retires; the others complete when the GPU reaches the tick
 * they were made at (a wait runs it there). */
static bool gb_fence_done(void *ctx, uint32_t lane, uint64_t token, bool wait)
{
    run *R = ctx;
    if (lane == R->barrier_lane) {
        for (size_t i = 0; i < R->barrier_pending.n;) {
            barrier_free *b = &R->barrier_pending.at[i];
            if (b->token && b->token <= token) {
                mark_dirty(R, b->r);
                *b = R->barrier_pending.at[--R->barrier_pending.n];
            } else {
                i++;
            }
        }
        return true;
    }
    const uint64_t tick = lane == R->fenced_lane ? TICK_OF(R->fenced_tick, token)
                                                 : TICK_OF(R->seal_tick, token);
    REQUIRE(tick != UINT64_MAX); /* asked about a fence never made */
    if (wait && tick > R->gpu_done)
        R->gpu_done = tick;
    return tick <= R->gpu_done;
}

/* ---- the run ---- */

static bool fail(run *R, const char *what)
{
    fprintf(stderr, "seed %" PRIu64 " step %" PRIu64 ": %s (replay: --seed %" PRIu64
                    " --ops %" PRIu64 ")\n",
            R->seed, R->step, what, R->seed, R->step + 1);
    harness_failures++;
    return false;
}

static void configure(run *R)
{
    uint64_t *g = &R->op_rng;
    bfc_options *o = &R->f.opt;
    R->map_fail_pct = rng_below(g, 3) == 0 ? 0 : (unsigned)rng_below(g, 15);
    R->unmap_fail_pct = rng_below(g, 3) == 0 ? 0 : (unsigned)rng_below(g, 10);
    R->gate_no_pct = (unsigned)rng_below(g, 71);
    o->vmm = true;
    o->map_granularity = GRAN;
    o->placement = rng_below(g, 3) == 0 ? BFC_PLACE_BY_AGE : BFC_PLACE_ALIGNED;
    o->preallocate = rng_below(g, 2);
    o->prealloc_spread = rng_below(g, 3) == 0;
    o->release_threshold = rng_below(g, 2) ? UINT64_MAX : rng_below(g, 4) * GRAN;
    o->fence_interval = 1 + (uint32_t)rng_below(g, 4);
    if (rng_below(g, 3) == 0)
        o->min_split_bytes = UINT64_C(1) << (8 + rng_below(g, 14));
    o->tsl_split = rng_below(g, 4) == 0;
}

static void start(run *R, uint64_t seed)
{
    memset(R, 0, sizeof *R);
    R->seed = seed;
    R->op_rng = seed * UINT64_C(2654435761) + 1;
    R->dev_rng = ~seed;
    fixture_begin(&R->f, 0);
    /* The engine's defaults, not the fixture's exact-address ones. */
    bfc_options_init(&R->f.opt);
    R->f.opt.limit_bytes = (16 + rng_below(&R->op_rng, 112)) * MiB;
    configure(R);
    R->f.dev.track_maps = true;
    R->sim = sim_device_vmm_backend(&R->f.dev);
    REQUIRE(!R->sim.fence_done && !R->sim.fence_seal && !R->sim.release_ready);
    bfc_backend b = R->sim;
    b.ctx = R;
    b.region_alloc = gb_region_alloc;
    b.region_free = gb_region_free;
    b.map = gb_map;
    b.unmap = gb_unmap;
    b.release_ready = gb_release_ready;
    b.fence_seal = gb_fence_seal;
    b.fence_done = gb_fence_done;
    b.keep = R->sim.keep ? gb_keep : NULL;
    fixture_start_with(&R->f, &b);
    bfc_pool *p = R->f.pool;
    REQUIRE(bfc_pool_lane_open(p, false, &R->fenced_lane) == BFC_OK);
    REQUIRE(bfc_pool_lane_open(p, false, &R->barrier_lane) == BFC_OK);
    REQUIRE(bfc_pool_lane_open(p, true, &R->reusable_lane) == BFC_OK);
    bfc_pool_lane_set_lazy(p, R->barrier_lane, true);
}

static void op_alloc(run *R)
{
    uint64_t *g = &R->op_rng;
    if (R->nlive == MAX_LIVE)
        return;
    uint64_t size = rng_below(g, 4) == 0   ? (1 + rng_below(g, 8)) * GRAN
                    : rng_below(g, 3) == 0 ? 1 + rng_below(g, 6 * MiB)
                                           : 1 + rng_below(g, 256 * KiB);
    uint32_t lane = rng_below(g, 5) == 0 ? R->reusable_lane : BFC_NO_LANE;
    bfc_addr a = 0;
    bfc_stats before;
    bfc_pool_stats(R->f.pool, &before);
    const bfc_status st = bfc_pool_alloc(R->f.pool, size, lane, &a);
    bfc_stats after;
    bfc_pool_stats(R->f.pool, &after);
    if (after.num_growth_moves != before.num_growth_moves) {
        R->growth_moves++;
        R->growth_moves_pending += before.pending_bytes != 0;
    }
    if (st != BFC_OK)
        return; /* refused maps and loans make OOMs ordinary here */
    R->live_addr[R->nlive] = a;
    R->live_size[R->nlive++] = size;
}

/* Frees a random live block one of four ways. */
static void op_free(run *R)
{
    uint64_t *g = &R->op_rng;
    bfc_pool *p = R->f.pool;
    if (R->nlive == 0)
        return;
    size_t i = (size_t)rng_below(g, R->nlive);
    const bfc_addr a = R->live_addr[i];
    R->nlive--;
    R->live_addr[i] = R->live_addr[R->nlive];
    R->live_size[i] = R->live_size[R->nlive];
    bfc_live_info info;
    REQUIRE(bfc_pool_block(p, a, &info) == BFC_OK);
    const range chunk = {a, a + info.size};
    switch (rng_below(g, 4)) {
    case 0: /* immediate: queued work may still read it */
        mark_dirty(R, chunk);
        REQUIRE(bfc_pool_free(p, a) == BFC_OK);
        break;
    case 1: /* an event fence at the host's clock */
        TICK_SET(R->fenced_tick, ++R->fenced_token, R->now);
        REQUIRE(bfc_pool_free_fenced(p, a, R->fenced_lane, R->fenced_token) == BFC_OK);
        break;
    case 2: /* the barrier lane */
        VEC_PUSH(R->barrier_pending, ((barrier_free){chunk, 0}));
        REQUIRE(bfc_pool_free_deferred(p, a, R->barrier_lane) == BFC_OK);
        break;
    default: /* the reusable lane, event fences */
        REQUIRE(bfc_pool_free_deferred(p, a, R->reusable_lane) == BFC_OK);
        break;
    }
}

/* The owner reports the fenced lane done up to the last fence the GPU has
 * passed. */
static void op_retire(run *R)
{
    uint64_t t = R->fenced_token;
    while (t && TICK_OF(R->fenced_tick, t) > R->gpu_done)
        t--;
    if (t)
        bfc_pool_retire(R->f.pool, R->fenced_lane, t);
}

static void step(run *R)
{
    uint64_t *g = &R->op_rng;
    bfc_pool *p = R->f.pool;
    R->now++;
    if (rng_below(g, 3) == 0 && R->gpu_done < R->now)
        R->gpu_done += rng_below(g, 5);
    const uint64_t k = rng_below(g, 100);
    if (k < 50) {
        op_alloc(R);
    } else if (k < 90) {
        op_free(R);
    } else if (k < 93) {
        bfc_pool_trim(p);
    } else if (k < 95) {
        const uint64_t want = rng_below(g, 8) * MiB;
        if (bfc_pool_lend(p, want) == BFC_OK)
            R->lent += want;
    } else if (k < 97) {
        const uint64_t back = rng_below(g, R->lent + 1);
        bfc_pool_end_loan(p, back);
        R->lent -= back;
    } else if (k < 98) {
        bfc_pool_seal_lane(p, R->barrier_lane);
    } else {
        op_retire(R);
    }
}

/* The checks after every step; false (reported) on the first that fails. */
static bool step_clean(run *R)
{
    char what[160];
    if (R->violated) {
        snprintf(what, sizeof what,
                 "unmapped [0x%" PRIx64 ", 0x%" PRIx64 ") while memory in it may be in use "
                 "(freed since release_ready last said yes)",
                 R->violation.lo, R->violation.hi);
        return fail(R, what);
    }
    for (size_t i = 0; i < R->nlive; i++) {
        const bfc_addr lo = R->live_addr[i] / GRAN * GRAN;
        const bfc_addr hi = (R->live_addr[i] + R->live_size[i] + GRAN - 1) / GRAN * GRAN;
        if (!sim_device_mapped(&R->f.dev, lo, hi - lo)) {
            snprintf(what, sizeof what, "live block 0x%" PRIx64 " not mapped", R->live_addr[i]);
            return fail(R, what);
        }
    }
    if (R->f.dev.misuse)
        return fail(R, "the device saw a double map or an unmap of unmapped memory");
    if (R->f.dev.keeping || R->f.dev.kept)
        return fail(R, "a keep bracket was left open, or memory kept after the call");
    bfc_stats st;
    bfc_pool_stats(R->f.pool, &st);
    if (st.pool_bytes != R->f.dev.held) {
        snprintf(what, sizeof what, "the pool counts %" PRIu64 " bytes mapped, the device holds %" PRIu64,
                 st.pool_bytes, R->f.dev.held);
        return fail(R, what);
    }
    if (bfc_pool_check(R->f.pool, stderr) != 0)
        return fail(R, "bfc_pool_check");
    return true;
}

static void finish(run *R)
{
    harness_case = "destroy";
    R->destroying = true;
    fixture_end(&R->f); /* checks, destroys, device holds no bytes */
    CHECK_EQ(R->f.dev.nmaps, 0);
    sim_device_fini(&R->f.dev);
    free(R->fenced_tick.at);
    free(R->seal_tick.at);
    free(R->barrier_pending.at);
    free(R->dirty.at);
}

static run R;

int main(int argc, char **argv)
{
    uint64_t first = 1, last = 100, ops = 2000;
    bool quiet = false;
    static const struct option longopts[] = {
        {"seed", required_argument, 0, 's'}, {"seeds", required_argument, 0, 'S'},
        {"ops", required_argument, 0, 'n'},  {"quiet", no_argument, 0, 'q'},
        {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 's': first = last = strtoull(optarg, NULL, 0); break;
        case 'S':
            if (sscanf(optarg, "%" SCNu64 "-%" SCNu64, &first, &last) != 2) {
                fprintf(stderr, "--seeds wants A-B\n");
                return 2;
            }
            break;
        case 'n': ops = strtoull(optarg, NULL, 0); break;
        case 'q': quiet = true; break;
        default: return 2;
        }
    }
    uint64_t gmoves = 0, gmoves_pending = 0;
    uint64_t steps = 0, map_failures = 0, gates_closed = 0, gates_opened_dirty = 0, unmaps = 0,
             unmap_failures = 0;
    for (uint64_t seed = first; seed <= last && !harness_failures; seed++) {
        start(&R, seed);
        for (R.step = 0; R.step < ops; R.step++) {
            step(&R);
            if (!step_clean(&R))
                break;
        }
        finish(&R);
        steps += R.step;
        map_failures += R.map_failures;
        gates_closed += R.gates_closed;
        gates_opened_dirty += R.gates_opened_dirty;
        unmaps += R.unmaps;
        unmap_failures += R.unmap_failures;
        gmoves += R.growth_moves;
        gmoves_pending += R.growth_moves_pending;
        if (!quiet)
            printf("seed %" PRIu64 ": %u%% maps refused, %u%% unmaps refused, gate closed %u%%: %" PRIu64
                   " refusals, %" PRIu64 " gates closed, %" PRIu64 " unmaps (%" PRIu64
                   " refused) %s\n",
                   seed, R.map_fail_pct, R.unmap_fail_pct, R.gate_no_pct, R.map_failures,
                   R.gates_closed, R.unmaps, R.unmap_failures, harness_failures ? "FAILED" : "clean");
    }
    printf("give_back: %" PRIu64 " steps over seeds %" PRIu64 "-%" PRIu64 ", %" PRIu64
           " maps refused, %" PRIu64 " gates closed, %" PRIu64 " opened over dirty memory, %" PRIu64
           " unmaps (%" PRIu64 " refused), %s\n",
           steps, first, last, map_failures, gates_closed, gates_opened_dirty, unmaps, unmap_failures,
           harness_failures ? "FAILED" : "all clean");
    printf("give_back: %" PRIu64 " allocations moved granules to stay within a growing pool's"
           " headroom, %" PRIu64 " of them with blocks pending\n",
           gmoves, gmoves_pending);
    /* A run long enough to mean anything must have met every fault. */
    if (!harness_failures && steps >= 10000) {
        CHECK(map_failures > 0);
        CHECK(unmap_failures > 0);
        CHECK(gates_closed > 0);
        CHECK(gates_opened_dirty > 0);
    }
    return harness_result();
}
