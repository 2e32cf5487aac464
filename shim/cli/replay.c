/*
 * replay.c - `bfcshim replay`: allocation traces through the engine, no GPU.
 *
 *   bfcshim replay [--pool-size SIZE | --min-pool] [--json] [--repeat N]
 *                  [--vmm] [policy options] TRACE.csv...
 *
 * For each trace it
 *   1. finds the smallest single preallocated region, a multiple of the
 *      pool unit (64 KiB: see min_pool), that serves every allocation of the
 *      trace, and above which the larger sizes checked do too
 *      (min_pool_bytes). The lower bound is the trace's peak of live bytes,
 *      which no allocator can beat, so efficiency = peak_live_bytes /
 *      min_pool_bytes is 1.0 at best (fragmentation_gmlake, 1 - peak live /
 *      peak reserved as GMLake publishes it, is 1 - efficiency here, the pool
 *      being reserved whole);
 *   2. times the replay loop alone (parsing and pool set-up excluded) at the
 *      pool size of --pool-size, or at min_pool_bytes, --repeat times, and
 *      reports the median nanoseconds per operation (allocate or free).
 * Allocations that fail at the timed pool size are counted (`failures`) and
 * their frees skipped. --vmm adds the same trace over a pool on virtual
 * memory (replay_vmm.c). --plan gives every pool a placement plan
 * (`bfcshim plan`), as BFCSHIM_PLAN gives the shim's.
 */
#include <getopt.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <time.h>

#include "bfc.h"
#include "cli.h"
#include "json_out.h"
#include "out_file.h"
#include "plan_file.h"
#include "replay_vmm.h"
#include "sim_device.h"
#include "trace_csv.h"
#include "trace_log.h"
#include "units.h"

#define MIB (UINT64_C(1) << 20)
#define REPLAY_DEFAULT_POOL_UNIT (UINT64_C(64) << 10)

typedef struct replay_opts {
    uint64_t pool_size; /* 0: time at min_pool_bytes */
    int repeats;
    bool json;
    const char *dump_path; /* --dump-at-failure */
    bool bisect;           /* false with --no-min-pool */
    uint64_t warmup;       /* events replayed before the clock starts */
    const char *record;    /* --record: write a trace while timing, as BFCSHIM_TRACE does */
    bool vmm;              /* --vmm: also measure the pool over virtual memory */
    uint64_t gpu_lag;      /* --gpu-lag: --vmm's frees fenced, GPU this many events behind */
    /* --fence-lag: the one-region pool's frees deferred as the shim's plain
     * frees are (sealed by policy.fence_interval and fence_bytes), the GPU
     * this many events behind; 0: frees are immediate */
    uint64_t fence_lag;
    uint64_t pool_unit;    /* --pool-unit: min_pool_bytes is a multiple of it */
    const char *plan_path; /* --plan: every pool gets this placement plan */
    plan_file plan;
    bfc_options policy; /* granularity, split and placement knobs */
    int name_width;     /* the table's first column: the longest trace name */
} replay_opts;

/* --pool-unit, or the default. */
static uint64_t pool_unit(const replay_opts *o)
{
    return o->pool_unit ? o->pool_unit : REPLAY_DEFAULT_POOL_UNIT;
}

typedef struct run_result {
    uint64_t failures;
    uint64_t ops;
    uint64_t seals; /* --fence-lag: fences made (timed events only) */
    double seconds;
    bfc_stats stats;
} run_result;

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The timed loop over events [from, to), kept out of line so that callgrind
 * can count it alone (--toggle-collect=replay_loop). */
__attribute__((noinline)) uint64_t replay_loop(bfc_pool *pool, const trace *t, size_t from,
                                               size_t to, bfc_addr *slot_addr)
{
    uint64_t failures = 0;
    for (size_t i = from; i < to; i++) {
        const trace_event *e = &t->ev[i];
        if (e->kind == TRACE_ALLOC) {
            if (bfc_pool_alloc(pool, e->size, BFC_NO_LANE, &slot_addr[e->slot]) != BFC_OK) {
                slot_addr[e->slot] = 0;
                failures++;
            }
        } else {
            bfc_pool_free(pool, slot_addr[e->slot]);
        }
    }
    return failures;
}

uint64_t replay_lagging(bfc_pool *pool, sim_device *dev, uint32_t lane, lagging_frees how,
                        const trace *t, size_t from, size_t to, bfc_addr *slot_addr)
{
    uint64_t failures = 0;
    for (size_t i = from; i < to; i++) {
        const trace_event *e = &t->ev[i];
        dev->gpu_now = i + 1;
        if (e->kind == TRACE_ALLOC) {
            if (bfc_pool_alloc(pool, e->size, BFC_NO_LANE, &slot_addr[e->slot]) != BFC_OK) {
                slot_addr[e->slot] = 0;
                failures++;
            }
        } else if (slot_addr[e->slot] && how == FREES_DEFERRED) {
            bfc_pool_free_deferred(pool, slot_addr[e->slot], lane);
        } else if (slot_addr[e->slot]) {
            bfc_pool_free_fenced(pool, slot_addr[e->slot], lane, i + 1);
        }
    }
    return failures;
}

/* Events [from, to) of a run_once pool: replay_loop, or with --fence-lag
 * (a lane) replay_lagging's deferred frees. */
static uint64_t run_events(bfc_pool *pool, sim_device *dev, uint32_t lane, const trace *t,
                           size_t from, size_t to, bfc_addr *slot_addr)
{
    return lane == BFC_NO_LANE
               ? replay_loop(pool, t, from, to, slot_addr)
               : replay_lagging(pool, dev, lane, FREES_DEFERRED, t, from, to, slot_addr);
}

/* --record: the engine tells this hook of every event under its lock, and
 * it records them exactly as the shim does under BFCSHIM_TRACE, so the cost
 * of recording is the difference in ns_per_op. */
static void record_event(void *ctx, bfc_event ev, bfc_addr addr, uint64_t size, uint32_t lane)
{
    (void)lane;
    trace_channel_event(ctx, (rec_action)ev, addr, size, 0);
}

void cli_policy_tsl(bfc_options *policy)
{
    policy->placement = BFC_PLACE_LOW;
    policy->tsl_split = true;
}

bfc_pool *replay_pool_create(sim_device *dev, const bfc_options *policy, uint64_t pool_bytes,
                             bfc_backend *backend)
{
    sim_device_init(dev, pool_bytes);
    bfc_backend defaults = sim_device_backend(dev);
    backend->ctx = defaults.ctx;
    backend->region_alloc = defaults.region_alloc;
    backend->region_free = defaults.region_free;
    bfc_options opt = *policy;
    opt.limit_bytes = pool_bytes;
    opt.preallocate = true;
    opt.region_granularity = opt.granularity;
    opt.garbage_collection = false;
    bfc_pool *pool = bfc_pool_create(&opt, backend);
    if (pool && bfc_pool_reserve(pool) != BFC_OK) {
        bfc_pool_destroy(pool, true);
        pool = NULL;
    }
    return pool;
}

/* replay_pool_create, with the --plan's plan installed. */
static bfc_pool *pool_for(const replay_opts *o, sim_device *dev, uint64_t pool_bytes,
                          bfc_backend *backend)
{
    bfc_pool *pool = replay_pool_create(dev, &o->policy, pool_bytes, backend);
    if (pool && o->plan_path &&
        bfc_pool_set_plan(pool, o->plan.entries, o->plan.n) != BFC_OK) {
        bfc_pool_destroy(pool, true);
        pool = NULL;
    }
    return pool;
}

/* One replay in a fresh pool of exactly `pool_bytes`, preallocated; with
 * `rec` (not NULL), every event of the run is recorded. */
static bool run_once(const trace *t, const replay_opts *o, uint64_t pool_bytes,
                     bfc_addr *slot_addr, run_result *r, trace_channel *rec)
{
    sim_device dev;
    bfc_backend backend = {.on_event = rec ? record_event : NULL, .event_ctx = rec};
    if (o->fence_lag) {
        backend.fence_seal = sim_device_fence_seal;
        backend.fence_done = sim_device_sealed_done;
    }
    bfc_pool *pool = pool_for(o, &dev, pool_bytes, &backend);
    uint32_t lane = BFC_NO_LANE;
    if (pool && o->fence_lag && bfc_pool_lane_open(pool, false, &lane) != BFC_OK) {
        bfc_pool_destroy(pool, true);
        pool = NULL;
    }
    if (!pool) {
        sim_device_fini(&dev);
        return false;
    }
    dev.gpu_lag = o->fence_lag;
    size_t warm = o->warmup < t->nev ? (size_t)o->warmup : t->nev;
    r->failures = run_events(pool, &dev, lane, t, 0, warm, slot_addr);
    const uint64_t seals0 = dev.seals; /* stays 0 without --fence-lag */
    double t0 = now_seconds();
    r->failures += run_events(pool, &dev, lane, t, warm, t->nev, slot_addr);
    r->seconds = now_seconds() - t0;
    r->seals = dev.seals - seals0;
    r->ops = t->nev - warm;
    bfc_pool_stats(pool, &r->stats);
    bfc_pool_destroy(pool, true);
    sim_device_fini(&dev);
    return true;
}

static bool serves_all(const trace *t, const replay_opts *o, uint64_t pool_bytes,
                       bfc_addr *slot_addr)
{
    run_result r;
    return run_once(t, o, pool_bytes, slot_addr, &r, NULL) && r.failures == 0;
}

uint64_t cli_smallest_serving(uint64_t peak, uint64_t unit, uint64_t cap,
                              bool (*serves)(void *ctx, uint64_t bytes), void *ctx)
{
    /* No pool the engine makes holds a peak at or above BFC_SIZE_LIMIT (and
     * nothing below then wraps). */
    if (peak == 0 || peak >= BFC_SIZE_LIMIT)
        return 0;
    uint64_t lo = (peak + unit - 1) / unit - 1; /* in units: fails */
    uint64_t hi = lo + 1, step = 1;
    cap = cap / unit > hi ? cap / unit : hi;
    /* Up from the peak by a growing step, then bisect the bracket. */
    while (!serves(ctx, hi * unit)) {
        if (hi == cap)
            return 0;
        lo = hi;
        hi = hi + step > cap ? cap : hi + step;
        step *= 2;
    }
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (serves(ctx, mid * unit))
            hi = mid;
        else
            lo = mid;
    }
    return hi * unit;
}

typedef struct serves_ctx {
    const trace *t;
    const replay_opts *o;
    bfc_addr *slot_addr;
} serves_ctx;

static bool serves_all_at(void *ctx, uint64_t bytes)
{
    serves_ctx *c = ctx;
    return serves_all(c->t, c->o, bytes, c->slot_addr);
}

/*
 * Smallest pool, a multiple of the pool unit (64 KiB unless --pool-unit
 * says otherwise), that serves the whole trace, and above which larger
 * pools were seen to serve it too (highest_failing_above). Returns 0 only
 * for a trace without allocations.
 *
 * Why a unit coarser than the granule: the shim's regions are multiples of
 * 2 MiB, so their top edge lies on aligned placement's 64 KiB grid. A pool
 * of any other size has a nook under its top edge that only small blocks
 * fit in, and where they land then changes every later hole: the search
 * at 256-byte steps found pools the shim never makes, a few of which the
 * default rule served by luck while larger ones failed (docs/results/benchmarks-history.md,
 * "Sizes the shim makes"). Why the check above: success is not monotone in
 * the size (one block placed elsewhere moves every later hole), and a
 * figure under which a larger pool still fails would promise too much.
 */
#define NEAR_WINDOW (UINT64_C(2) << 20) /* every unit checked */
#define FAR_PROBES 64                   /* spread over the next 1/128 of the pool */

/* The largest pool above `bytes`, among those checked, that fails; 0 if none.
 * Checked: every unit of the next 2 MiB, then 64 sizes spread evenly up to
 * bytes/128 above (bands of failure on the real traces were 1 to 8 MiB wide,
 * up to 26 MiB above the bisected size of a 6 GiB trace). A check, not a
 * proof: the bands of one trace lie where they lie. From the largest size
 * down, so the first failure is the answer and each size is replayed once. */
static uint64_t highest_failing_above(serves_ctx *c, uint64_t bytes, uint64_t unit)
{
    const uint64_t far = bytes / 128;
    uint64_t checked = 0;
    if (far > NEAR_WINDOW) {
        for (int i = FAR_PROBES; i >= 1; i--) {
            uint64_t above = NEAR_WINDOW + (far - NEAR_WINDOW) / FAR_PROBES * (uint64_t)i;
            above = above / unit * unit;
            if (above <= NEAR_WINDOW || above == checked)
                continue;
            checked = above;
            if (!serves_all_at(c, bytes + above))
                return bytes + above;
        }
    }
    for (uint64_t above = NEAR_WINDOW / unit * unit; above >= unit; above -= unit)
        if (!serves_all_at(c, bytes + above))
            return bytes + above;
    return 0;
}

static uint64_t min_pool(const trace *t, const replay_opts *o, bfc_addr *slot_addr)
{
    const uint64_t unit = pool_unit(o);
    /* Always enough: every byte ever allocated, rounded, twice over (TSL's
     * split rule may hand out up to twice a request), plus the 128 MiB past
     * which it always splits. */
    uint64_t cap = 2 * (t->total_alloc_bytes + t->allocs * unit) +
                   BFC_TSL_MAX_INTERNAL_FRAGMENTATION + unit;
    /* No larger pool can be made (limits are below BFC_SIZE_LIMIT); past
     * it the sum above may also have wrapped. */
    if (t->total_alloc_bytes >= BFC_SIZE_LIMIT || t->allocs >= BFC_SIZE_LIMIT / unit ||
        cap >= BFC_SIZE_LIMIT)
        cap = BFC_SIZE_LIMIT - unit;
    serves_ctx c = {t, o, slot_addr};
    uint64_t bytes = cli_smallest_serving(t->peak_live_bytes, unit, cap, serves_all_at, &c);
    uint64_t failing;
    while (bytes && (failing = highest_failing_above(&c, bytes, unit)) != 0)
        bytes = cli_smallest_serving(failing + 1, unit, cap, serves_all_at, &c);
    return bytes;
}

uint64_t replay_min_pool_bytes(const trace *t, const bfc_options *policy)
{
    replay_opts o = {.repeats = 1, .bisect = true, .policy = *policy};
    bfc_addr *slot_addr = calloc(t->nslots ? t->nslots : 1, sizeof *slot_addr);
    uint64_t bytes = slot_addr ? min_pool(t, &o, slot_addr) : 0;
    free(slot_addr);
    return bytes;
}

void replay_dump_first_failure(bfc_pool *pool, const trace *t, bfc_addr *slot_addr,
                               const char *what, uint64_t size, FILE *f)
{
    for (size_t i = 0; i < t->nev; i++) {
        const trace_event *e = &t->ev[i];
        if (e->kind == TRACE_FREE) {
            bfc_pool_free(pool, slot_addr[e->slot]);
        } else if (bfc_pool_alloc(pool, e->size, BFC_NO_LANE, &slot_addr[e->slot]) != BFC_OK) {
            fprintf(f, "%s: event %zu: allocation of %llu bytes fails in %s of %llu:\n",
                    t->name, i, (unsigned long long)e->size, what, (unsigned long long)size);
            bfc_pool_dump(pool, f, BFC_DUMP_SUMMARY | BFC_DUMP_OCCUPANCY | BFC_DUMP_CHUNKS);
            return;
        }
    }
}

/* Replays in a pool one pool unit below the minimum and writes the memory
 * map at the first allocation that fails: where the fragmentation is. With
 * --vmm, the preallocated pool over virtual memory's map one granule below
 * its smallest limit (vmm_min_limit, as --vmm measured it) follows. */
static bool dump_at_failure(const trace *t, const replay_opts *o, uint64_t min_bytes,
                            uint64_t vmm_min_limit, bfc_addr *slot_addr)
{
    /* Not appended to through a link planted at the name (out_file.h). */
    FILE *f = strcmp(o->dump_path, "-") == 0 ? stderr : out_file_fopen(o->dump_path, "a");
    if (!f) {
        cli_cannot_write("replay", o->dump_path, errno);
        return false;
    }
    const uint64_t unit = pool_unit(o);
    const uint64_t below = min_bytes - unit;
    if (min_bytes <= unit) {
        fprintf(f, "%s: the minimum pool is one pool unit: nothing to show\n", t->name);
        goto out;
    }
    sim_device dev;
    bfc_backend backend = {0};
    bfc_pool *pool = pool_for(o, &dev, below, &backend);
    if (!pool)
        goto out;
    replay_dump_first_failure(pool, t, slot_addr, "a pool", below, f);
    bfc_pool_destroy(pool, true);
    if (o->vmm)
        replay_vmm_dump_at_failure(t, &o->policy, o->gpu_lag ? 0 : vmm_min_limit, slot_addr, f);
out:;
    /* A map cut short by a full disk is said, and fails the command. */
    bool ok = out_file_close(f);
    if (!ok)
        cli_cannot_write("replay", o->dump_path, errno);
    return ok;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v. */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static double ns_per_op(const run_result *r)
{
    return r->ops ? r->seconds * 1e9 / (double)r->ops : 0.0;
}

typedef struct trace_report {
    const trace *t;
    uint64_t min_pool_bytes, timed_pool_bytes;
    double efficiency, ns_per_op;
    /* --record: ns_per_op is the recording replays'; these are the plain
     * ones' median and the median over pairs of recording / plain - 1. */
    double plain_ns_per_op, recording_cost;
    run_result timed;
    replay_vmm_report vmm; /* --vmm */
} trace_report;

static void json_u64_array(json_out *j, const char *name, const uint64_t *v, size_t n)
{
    json_array_open(j, name);
    for (size_t i = 0; i < n; i++)
        json_u64(j, NULL, v[i]);
    json_array_close(j);
}

/* Peak live over `bytes`: the efficiency of a pool of that size (0: none). */
static double efficiency_of(const trace *t, uint64_t bytes)
{
    return bytes ? (double)t->peak_live_bytes / (double)bytes : 0.0;
}

static void print_vmm_json(json_out *j, const trace_report *r, const replay_opts *o)
{
    const replay_vmm_report *v = &r->vmm;
    json_object_open(j, "vmm");
    json_u64(j, "map_granularity", o->policy.map_granularity);
    json_u64(j, "gpu_lag_events", o->gpu_lag);
    if (o->policy.release_threshold == UINT64_MAX)
        json_null(j, "release_threshold");
    else
        json_u64(j, "release_threshold", o->policy.release_threshold);
    json_u64(j, "growth_headroom", o->policy.growth_headroom);
    json_u64(j, "min_limit_bytes", v->min_limit_bytes);
    json_double(j, "efficiency", efficiency_of(r->t, v->min_limit_bytes));
    json_u64(j, "min_limit_map_calls", v->tight_map_calls);
    json_u64(j, "min_limit_unmap_calls", v->tight_unmap_calls);
    json_u64(j, "prealloc_min_limit_bytes", v->prealloc_min_limit_bytes);
    json_double(j, "prealloc_efficiency", efficiency_of(r->t, v->prealloc_min_limit_bytes));
    json_u64_array(j, "prealloc_limit", v->prealloc_limit, PREALLOC_POINTS);
    json_u64_array(j, "prealloc_failures", v->prealloc_failures, PREALLOC_POINTS);
    json_u64_array(j, "prealloc_map_calls", v->prealloc_map_calls, PREALLOC_POINTS);
    json_u64_array(j, "prealloc_unmap_calls", v->prealloc_unmap_calls, PREALLOC_POINTS);
    json_u64_array(j, "prealloc_unmapped_bytes", v->prealloc_unmapped_bytes, PREALLOC_POINTS);
    json_u64_array(j, "prealloc_created_bytes", v->prealloc_created_bytes, PREALLOC_POINTS);
    json_u64_array(j, "prealloc_mapped_refits", v->prealloc_mapped_refits, PREALLOC_POINTS);
    json_u64(j, "peak_mapped_bytes", v->peak_mapped_bytes);
    json_double(j, "peak_mapped_efficiency", efficiency_of(r->t, v->peak_mapped_bytes));
    json_u64(j, "map_calls", v->map_calls);
    json_u64(j, "unmap_calls", v->unmap_calls);
    json_u64(j, "released_bytes", v->released_bytes);
    json_u64(j, "growth_moves", v->growth_moves);
    json_u64(j, "fence_waits", v->fence_waits);
    json_u64(j, "failures", v->unlimited_failures);
    json_u64(j, "regions_peak_bytes", v->regions_peak_bytes);
    json_u64(j, "regions_min_limit_bytes", v->regions_min_limit_bytes);
    json_double(j, "regions_efficiency", efficiency_of(r->t, v->regions_min_limit_bytes));
    json_u64(j, "regions", v->regions_count);
    json_u64(j, "regions_fence_waits", v->regions_fence_waits);
    json_u64(j, "regions_failures", v->regions_failures);
    json_u64_array(j, "curve_event", v->curve_event, v->curve_points);
    json_u64_array(j, "curve_mapped", v->curve_mapped, v->curve_points);
    json_u64_array(j, "curve_regions", v->curve_regions, v->curve_points);
    json_u64_array(j, "curve_live", v->curve_live, v->curve_points);
    json_object_close(j);
}

static void print_vmm_row(const trace_report *r)
{
    const replay_vmm_report *v = &r->vmm;
    char a[32], b[32], c[32], d[32], e[32];
    printf("  vmm: min limit %s (%.4f), peak mapped %s (%.4f, %llu maps, %llu unmaps); "
           "growth-mode regions: min limit %s (%.4f), peak %s in %llu regions\n",
           format_size(v->min_limit_bytes, a, sizeof a), efficiency_of(r->t, v->min_limit_bytes),
           format_size(v->peak_mapped_bytes, b, sizeof b),
           efficiency_of(r->t, v->peak_mapped_bytes), (unsigned long long)v->map_calls,
           (unsigned long long)v->unmap_calls, format_size(v->regions_min_limit_bytes, c, sizeof c),
           efficiency_of(r->t, v->regions_min_limit_bytes),
           format_size(v->regions_peak_bytes, d, sizeof d),
           (unsigned long long)v->regions_count);
    printf("  vmm preallocated: min limit %s (%.4f), unmapped to map elsewhere %s there, "
           "%s with 1%% more; made after the start %s, %s\n",
           format_size(v->prealloc_min_limit_bytes, a, sizeof a),
           efficiency_of(r->t, v->prealloc_min_limit_bytes),
           format_size(v->prealloc_unmapped_bytes[0], b, sizeof b),
           format_size(v->prealloc_unmapped_bytes[1], c, sizeof c),
           format_size(v->prealloc_created_bytes[0], d, sizeof d),
           format_size(v->prealloc_created_bytes[1], e, sizeof e));
}

static void print_json(const trace_report *r, const replay_opts *o)
{
    json_out j;
    json_begin(&j, stdout, false);
    json_object_open(&j, NULL);
    json_string(&j, "trace", r->t->name);
    json_u64(&j, "events", r->t->nev);
    json_u64(&j, "allocs", r->t->allocs);
    json_u64(&j, "frees", r->t->frees);
    json_u64(&j, "unmatched_frees", r->t->unmatched_frees);
    json_u64(&j, "trace_failed_allocs", r->t->failed_allocs);
    json_u64(&j, "leaked_reuses", r->t->leaked_reuses);
    json_u64(&j, "peak_live_bytes", r->t->peak_live_bytes);
    if (r->min_pool_bytes)
        json_u64(&j, "min_pool_bytes", r->min_pool_bytes);
    else
        json_null(&j, "min_pool_bytes");
    if (r->min_pool_bytes)
        json_double(&j, "efficiency", r->efficiency);
    else
        json_null(&j, "efficiency");
    /* GMLake's figure (1 - peak active / peak reserved), for comparisons. */
    if (r->min_pool_bytes)
        json_double(&j, "fragmentation_gmlake", 1.0 - r->efficiency);
    else
        json_null(&j, "fragmentation_gmlake");
    json_double(&j, "ns_per_op", r->ns_per_op);
    if (o->record) {
        json_double(&j, "plain_ns_per_op", r->plain_ns_per_op);
        json_double(&j, "recording_cost", r->recording_cost);
    }
    json_u64(&j, "failures", r->timed.failures);
    json_u64(&j, "pool_bytes", r->timed_pool_bytes);
    json_u64(&j, "peak_bytes_in_use", r->timed.stats.peak_bytes_in_use);
    json_u64(&j, "repeats", (uint64_t)o->repeats);
    json_u64(&j, "warmup_events", o->warmup);
    json_u64(&j, "timed_events", r->timed.ops);
    json_u64(&j, "pool_unit", pool_unit(o));
    json_object_open(&j, "policy");
    json_u64(&j, "granularity", o->policy.granularity);
    json_u64(&j, "min_split_bytes", o->policy.min_split_bytes);
    json_string(&j, "placement", bfc_placement_name(o->policy.placement));
    json_u64(&j, "align_bytes", o->policy.placement == BFC_PLACE_ALIGNED ? o->policy.align_bytes : 0);
    json_bool(&j, "tsl_split", o->policy.tsl_split);
    json_object_close(&j);
    if (o->vmm)
        print_vmm_json(&j, r, o);
    if (o->fence_lag) {
        json_object_open(&j, "fences");
        json_u64(&j, "gpu_lag_events", o->fence_lag);
        json_u64(&j, "interval", o->policy.fence_interval);
        json_u64(&j, "bytes", o->policy.fence_bytes);
        json_u64(&j, "seals", r->timed.seals);
        json_u64(&j, "allocs", r->timed.stats.num_allocs);
        json_u64(&j, "fence_waits", r->timed.stats.num_fence_waits);
        json_object_close(&j);
    }
    if (o->plan_path) {
        json_object_open(&j, "plan");
        json_string(&j, "file", o->plan_path);
        json_u64(&j, "entries", o->plan.n);
        json_u64(&j, "pool_bytes", o->plan.pool_bytes);
        json_u64(&j, "planned", r->timed.stats.num_planned);
        json_u64(&j, "misses", r->timed.stats.num_plan_misses);
        json_u64(&j, "spare", r->timed.stats.num_plan_spare);
        json_bool(&j, "abandoned", r->timed.stats.plan_abandoned != 0);
        json_object_close(&j);
    }
    json_object_close(&j);
    json_end(&j);
}

/* A trace's name in the table: its file name without the folder. */
static const char *short_name(const char *path)
{
    const char *name = strrchr(path, '/');
    return name ? name + 1 : path;
}

static void print_header(const replay_opts *o)
{
    printf("%-*s %9s %9s %11s %11s %10s %8s %8s\n", o->name_width, "trace", "events", "allocs",
           "peak live", "min pool", "efficiency", "ns/op", "failures");
}

static void print_row(const trace_report *r, const replay_opts *o)
{
    char live[32], pool[32];
    const char *name = short_name(r->t->name);
    char eff[16] = "-";
    if (r->min_pool_bytes)
        snprintf(eff, sizeof eff, "%.4f", r->efficiency);
    else
        snprintf(pool, sizeof pool, "-");
    printf("%-*s %9zu %9llu %11s %11s %10s %8.1f %8llu\n", o->name_width, name, r->t->nev,
           (unsigned long long)r->t->allocs,
           format_size(r->t->peak_live_bytes, live, sizeof live),
           r->min_pool_bytes ? format_size(r->min_pool_bytes, pool, sizeof pool) : pool, eff,
           r->ns_per_op, (unsigned long long)r->timed.failures);
}

static int replay_one(const char *path, const replay_opts *o, bool first)
{
    trace t;
    if (!trace_load(&t, path)) {
        fprintf(stderr, "bfcshim replay: %s\n", t.error);
        trace_free(&t);
        return 1;
    }
    bfc_addr *slot_addr = calloc(t.nslots ? t.nslots : 1, sizeof *slot_addr);
    if (!slot_addr) {
        fprintf(stderr, "bfcshim replay: %s: out of host memory\n", path);
        trace_free(&t);
        return 1;
    }
    trace_report r = {.t = &t};
    r.min_pool_bytes = o->bisect ? min_pool(&t, o, slot_addr) : 0;
    r.efficiency = efficiency_of(&t, r.min_pool_bytes);
    if (o->vmm)
        replay_vmm_measure(&t, &o->policy, o->gpu_lag, r.min_pool_bytes, slot_addr, &r.vmm);
    bool written = true; /* the outputs asked for (--dump-at-failure, --record) */
    if (o->dump_path && o->bisect)
        written = dump_at_failure(&t, o, r.min_pool_bytes, r.vmm.prealloc_min_limit_bytes,
                                  slot_addr);
    r.timed_pool_bytes = o->pool_size ? o->pool_size : r.min_pool_bytes;
    if (r.timed_pool_bytes == 0)
        r.timed_pool_bytes = MIB;

    double *ns = calloc((size_t)o->repeats, sizeof *ns);
    double *plain_ns = calloc((size_t)o->repeats, sizeof *plain_ns);
    double *cost = calloc((size_t)o->repeats, sizeof *cost);
    int ok_runs = 0;
    /* One recording for all repeats, as a process keeps one for its life. */
    trace_log *rec = NULL;
    trace_channel *channel = NULL;
    if (o->record && !(rec = trace_log_open(o->record))) {
        cli_cannot_write("replay", o->record, errno);
        written = false;
    }
    if (rec)
        channel = trace_log_channel_open(rec);
    for (int i = 0; ns && plain_ns && cost && i < o->repeats && (channel || !o->record); i++) {
        if (!o->record) {
            if (!run_once(&t, o, r.timed_pool_bytes, slot_addr, &r.timed, NULL))
                break;
            ns[ok_runs++] = ns_per_op(&r.timed);
            continue;
        }
        /* --record: a plain and a recording replay side by side, in
         * alternating order, so that the machine's drift (which moves this
         * VM's figures by 30% between processes) falls on both alike. The
         * writer drains between pairs, untimed: in a real program it keeps
         * up, and its backlog must not slow the next plain replay. */
        double pair[2];
        bool ran = true;
        for (int k = 0; k < 2 && ran; k++) {
            bool recording = (k == 0) == (i % 2 == 1);
            ran = run_once(&t, o, r.timed_pool_bytes, slot_addr, &r.timed,
                           recording ? channel : NULL);
            pair[recording] = ns_per_op(&r.timed);
        }
        if (!ran)
            break;
        trace_channel_flush(channel);
        trace_log_flush(rec); /* (a write that failed is said at the close) */
        plain_ns[ok_runs] = pair[0];
        cost[ok_runs] = pair[0] > 0 ? pair[1] / pair[0] - 1 : 0;
        ns[ok_runs++] = pair[1];
    }
    /* A recording that lost events (a full disk) is said, and fails the
     * command: it used to end as if the file were whole. */
    int rec_error = trace_log_close(rec);
    if (rec_error) {
        cli_cannot_write("replay", o->record, rec_error);
        written = false;
    }
    int status = written ? 0 : 1;
    if (ok_runs == 0 && o->record && !rec) {
        status = 1; /* said above: nothing ran without the recording */
    } else if (ok_runs == 0) {
        fprintf(stderr, "bfcshim replay: %s: could not create a pool of %llu bytes\n", path,
                (unsigned long long)r.timed_pool_bytes);
        status = 1;
    } else {
        r.ns_per_op = median(ns, ok_runs);
        if (o->record) {
            r.plain_ns_per_op = median(plain_ns, ok_runs);
            r.recording_cost = median(cost, ok_runs);
        }
        if (o->json) {
            print_json(&r, o);
        } else {
            if (first)
                print_header(o);
            print_row(&r, o);
            if (o->vmm)
                print_vmm_row(&r);
            if (o->fence_lag)
                printf("  fences (lag %llu events, every %u allocations or %llu bytes): %llu "
                       "for %llu allocations, %llu waits\n",
                       (unsigned long long)o->fence_lag, o->policy.fence_interval,
                       (unsigned long long)o->policy.fence_bytes,
                       (unsigned long long)r.timed.seals,
                       (unsigned long long)r.timed.stats.num_allocs,
                       (unsigned long long)r.timed.stats.num_fence_waits);
            if (o->record)
                printf("  recording: %.1f ns/op plain, %+.1f%% (median of %d pairs)\n",
                       r.plain_ns_per_op, 100 * r.recording_cost, ok_runs);
            if (o->plan_path) {
                char plan[160];
                plan_counts_text(&r.timed.stats, plan, sizeof plan);
                printf("  plan (of %llu allocations): %s\n", (unsigned long long)t.allocs, plan);
            }
        }
        if (t.unmatched_frees || t.leaked_reuses)
            fprintf(stderr,
                    "bfcshim replay: %s: %llu frees of pointers not live in the trace "
                    "skipped, %llu blocks assumed leaked\n",
                    path, (unsigned long long)t.unmatched_frees,
                    (unsigned long long)t.leaked_reuses);
    }
    free(ns);
    free(plain_ns);
    free(cost);
    free(slot_addr);
    trace_free(&t);
    return status;
}

static void replay_usage(FILE *f)
{
    fprintf(f,
            "usage: bfcshim replay [--pool-size SIZE | --min-pool] [--json] [--repeat N]\n"
            "                      [--granularity BYTES] [--min-split BYTES]\n"
            "                      [--placement aligned|age|low] [--align BYTES] [--tsl]\n"
            "                      [--plan PLAN] TRACE.csv[.gz]...\n"
            "\n"
            "Replays RMM-format allocation traces through the BFC engine with no GPU.\n"
            "  --min-pool          time the replay at the smallest pool that serves the\n"
            "                      trace (default)\n"
            "  --pool-size SIZE    time it at SIZE instead (e.g. 40GiB) and count failures\n"
            "  --no-min-pool       with --pool-size: skip the bisection (min_pool_bytes and\n"
            "                      efficiency are then null): for timing very large traces\n"
            "  --json              one JSON object per trace, one per line\n"
            "  --repeat N          timed replays per trace; the median is reported (5)\n"
            "  --warmup-events N   replay the first N events of each run before starting\n"
            "                      the clock (steady-state figures; default 0)\n"
            "  --pool-unit B       min_pool_bytes is a multiple of B (64KiB: the shim's\n"
            "                      regions are multiples of 2 MiB; 256 for the finest\n"
            "                      search), and every pool up to 2 MiB larger, and 64\n"
            "                      up to 1/128 larger, serve the trace too\n"
            "  --granularity B     size rounding, a power of two >= 256 (256)\n"
            "  --min-split B       split a free chunk only if B bytes or more remain (256)\n"
            "  --placement P       aligned (default): as age, and blocks of 64 KiB or more\n"
            "                      start at their natural alignment (the largest power of\n"
            "                      two dividing the size, up to --align);\n"
            "                      age: carve against the older neighbour;\n"
            "                      low: always the low end (TSL)\n"
            "  --align B           aligned placement's cap and threshold, a power of two\n"
            "                      (64KiB)\n"
            "  --tsl               TSL's policy: low placement, split only at 2x or 128 MiB\n"
            "  --plan PLAN         place as the plan says (bfcshim plan -o PLAN), as\n"
            "                      BFCSHIM_PLAN does; JSON adds how many went there.\n"
            "                      The granularity is the plan's unless given\n"
            "  --dump-at-failure F append to F (- for stderr) the pool's memory map at the\n"
            "                      first failure in a pool one unit below the minimum\n"
            "                      (with --vmm, then the preallocated pool over virtual\n"
            "                      memory's, one granule below its smallest limit)\n"
            "  --record F          measure what recording costs: each repeat is a pair of\n"
            "                      replays, one plain and one recording every event to F\n"
            "                      as BFCSHIM_TRACE would; ns_per_op is the recording\n"
            "                      one's, plain_ns_per_op and recording_cost (median of\n"
            "                      recording / plain - 1 over the pairs) are added\n"
            "  --vmm               also measure the pool over virtual memory: the smallest\n"
            "                      limit on mapped bytes that serves the trace, the peak\n"
            "                      mapped with room to spare, map/unmap calls, against\n"
            "                      growth-mode regions (JSON adds curves over time)\n"
            "  --prealloc-spread   with --vmm: lay the preallocated pool out over twice\n"
            "                      its limit of address space from the start, with the\n"
            "                      rules of virtual memory (default: one region of the\n"
            "                      limit, more address space only when nothing fits)\n"
            "  --map-granularity B the mapping granule, a power of two (2MiB)\n"
            "  --release-threshold B  free mapped bytes kept before granules go back as\n"
            "                      frees merge (default: never; 0: at once)\n"
            "  --growth-headroom N a growing pool over virtual memory maps at most N\n"
            "                      thousandths past the most it needed at once before\n"
            "                      it moves free granules instead (35; 0: never moves)\n"
            "  --gpu-lag N         with --vmm: every free is fenced and the simulated GPU\n"
            "                      runs N events behind (a framework queueing ahead of\n"
            "                      the GPU); freed blocks return as it catches up or\n"
            "                      when the pool waits (default 0: frees are immediate)\n"
            "  --fence-lag N       the one-region pool's frees are deferred as the shim's\n"
            "                      plain frees are: fenced at later allocations, reused\n"
            "                      once the simulated GPU, N events behind, passes the\n"
            "                      fence or the pool waits for it; adds the fences made\n"
            "                      (CUDA events in the shim) and the waits\n"
            "  --fence-interval K  with --fence-lag: fence once every K allocations, as\n"
            "                      BFCSHIM_FENCE_INTERVAL (1)\n"
            "  --fence-bytes B     with --fence-lag: fence sooner once B bytes were freed,\n"
            "                      as BFCSHIM_FENCE_BYTES (64MiB; 0: never)\n");
}

int cmd_replay(int argc, char **argv)
{
    replay_opts o = {.repeats = 5, .bisect = true};
    bfc_options_init(&o.policy);
    o.policy.fence_interval = BFC_DEFAULT_FENCE_INTERVAL;
    o.policy.fence_bytes = BFC_DEFAULT_FENCE_BYTES;
    enum { OPT_GRAN = 256, OPT_SPLIT, OPT_PLACE, OPT_ALIGN, OPT_TSL, OPT_DUMP, OPT_NO_MIN,
           OPT_WARM, OPT_RECORD, OPT_VMM, OPT_MAP_GRAN, OPT_RELEASE, OPT_GPU_LAG, OPT_PLAN,
           OPT_FENCE_LAG, OPT_FENCE_INTERVAL, OPT_FENCE_BYTES, OPT_POOL_UNIT, OPT_SPREAD,
           OPT_HEADROOM };
    static const struct option longopts[] = {
        {"pool-size", required_argument, 0, 'p'}, {"min-pool", no_argument, 0, 'm'},
        {"json", no_argument, 0, 'j'},           {"repeat", required_argument, 0, 'r'},
        {"granularity", required_argument, 0, OPT_GRAN},
        {"min-split", required_argument, 0, OPT_SPLIT},
        {"placement", required_argument, 0, OPT_PLACE},
        {"align", required_argument, 0, OPT_ALIGN},
        {"tsl", no_argument, 0, OPT_TSL},
        {"dump-at-failure", required_argument, 0, OPT_DUMP},
        {"no-min-pool", no_argument, 0, OPT_NO_MIN},
        {"warmup-events", required_argument, 0, OPT_WARM},
        {"record", required_argument, 0, OPT_RECORD},
        {"vmm", no_argument, 0, OPT_VMM},
        {"prealloc-spread", no_argument, 0, OPT_SPREAD},
        {"map-granularity", required_argument, 0, OPT_MAP_GRAN},
        {"release-threshold", required_argument, 0, OPT_RELEASE},
        {"growth-headroom", required_argument, 0, OPT_HEADROOM},
        {"gpu-lag", required_argument, 0, OPT_GPU_LAG},
        {"plan", required_argument, 0, OPT_PLAN},
        {"fence-lag", required_argument, 0, OPT_FENCE_LAG},
        {"fence-interval", required_argument, 0, OPT_FENCE_INTERVAL},
        {"fence-bytes", required_argument, 0, OPT_FENCE_BYTES},
        {"pool-unit", required_argument, 0, OPT_POOL_UNIT},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    int c;
    bool min_pool_flag = false, fence_knob = false, gran_given = false;
    optind = 1;
    opterr = 0; /* cli_bad_option says it in one line */
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        uint64_t v = 0;
        switch (c) {
        case 'p':
            if (!parse_size(optarg, &v) || v == 0)
                return cli_bad_value("replay", "--pool-size", optarg, "a size like 40GiB");
            o.pool_size = v;
            break;
        case 'm': min_pool_flag = true; break;
        case 'j': o.json = true; break;
        case 'r':
            o.repeats = atoi(optarg);
            if (o.repeats < 1 || o.repeats > 1000)
                return cli_bad_value("replay", "--repeat", optarg, "1 to 1000");
            break;
        case OPT_GRAN:
            if (!parse_power_of_two_in(optarg, 256, UINT64_C(1) << 20, &v))
                return cli_bad_value("replay", "--granularity", optarg,
                                     "a power of two from 256 to 1MiB");
            o.policy.granularity = v;
            gran_given = true;
            break;
        case OPT_SPLIT:
            if (!parse_size(optarg, &v))
                return cli_bad_value("replay", "--min-split", optarg, "a size");
            o.policy.min_split_bytes = v;
            break;
        case OPT_PLACE:
            if (!bfc_placement_from_name(optarg, &o.policy.placement))
                return cli_bad_value("replay", "--placement", optarg, "aligned, age or low");
            break;
        case OPT_ALIGN:
            if (!parse_power_of_two_in(optarg, 256, UINT64_C(1) << 30, &v))
                return cli_bad_value("replay", "--align", optarg,
                                     "a power of two from 256 to 1GiB");
            o.policy.align_bytes = v;
            break;
        case OPT_TSL: cli_policy_tsl(&o.policy); break;
        case OPT_DUMP: o.dump_path = optarg; break;
        case OPT_NO_MIN: o.bisect = false; break;
        case OPT_RECORD: o.record = optarg; break;
        case OPT_VMM: o.vmm = true; break;
        case OPT_SPREAD: o.policy.prealloc_spread = true; break;
        case OPT_PLAN: o.plan_path = optarg; break;
        case OPT_MAP_GRAN:
            if (!parse_power_of_two_in(optarg, 4096, UINT64_C(1) << 30, &v))
                return cli_bad_value("replay", "--map-granularity", optarg,
                                     "a power of two from 4KiB to 1GiB");
            o.policy.map_granularity = v;
            break;
        case OPT_RELEASE:
            if (!parse_size(optarg, &v))
                return cli_bad_value("replay", "--release-threshold", optarg, "a size");
            o.policy.release_threshold = v;
            break;
        case OPT_HEADROOM:
            if (!parse_whole_in(optarg, 0, BFC_MAX_GROWTH_HEADROOM, &v))
                return cli_bad_value("replay", "--growth-headroom", optarg,
                                     "thousandths from 0 to 1000");
            o.policy.growth_headroom = (uint32_t)v;
            break;
        case OPT_WARM:
            if (!parse_whole_in(optarg, 0, UINT64_MAX, &o.warmup))
                return cli_bad_value("replay", "--warmup-events", optarg, "an event count");
            break;
        case OPT_GPU_LAG:
            if (!parse_whole_in(optarg, 0, UINT64_MAX, &o.gpu_lag))
                return cli_bad_value("replay", "--gpu-lag", optarg, "an event count");
            break;
        case OPT_FENCE_LAG:
            if (!parse_whole_in(optarg, 1, UINT64_MAX, &o.fence_lag))
                return cli_bad_value("replay", "--fence-lag", optarg, "an event count above 0");
            break;
        case OPT_FENCE_INTERVAL:
            if (!parse_whole_in(optarg, 1, BFC_MAX_FENCE_INTERVAL, &v))
                return cli_bad_value("replay", "--fence-interval", optarg, "1 to 4096");
            o.policy.fence_interval = (uint32_t)v;
            fence_knob = true;
            break;
        case OPT_FENCE_BYTES:
            if (!parse_size(optarg, &v))
                return cli_bad_value("replay", "--fence-bytes", optarg, "a size");
            o.policy.fence_bytes = v;
            fence_knob = true;
            break;
        case OPT_POOL_UNIT:
            if (!parse_power_of_two_in(optarg, 256, UINT64_C(1) << 30, &v))
                return cli_bad_value("replay", "--pool-unit", optarg,
                                     "a power of two from 256 to 1GiB");
            o.pool_unit = v;
            break;
        case 'h': replay_usage(stdout); return 0;
        default: return cli_bad_option("replay", argv, c);
        }
    }
    if (min_pool_flag && o.pool_size) {
        fprintf(stderr, "bfcshim replay: --pool-size and --min-pool exclude each other\n");
        return 2;
    }
    if (!o.bisect && (!o.pool_size || min_pool_flag)) {
        fprintf(stderr, "bfcshim replay: --no-min-pool needs --pool-size\n");
        return 2;
    }
    if (o.gpu_lag && !o.vmm) {
        fprintf(stderr, "bfcshim replay: --gpu-lag needs --vmm\n");
        return 2;
    }
    if (fence_knob && !o.fence_lag) {
        fprintf(stderr, "bfcshim replay: --fence-interval and --fence-bytes need --fence-lag\n");
        return 2;
    }
    if (o.fence_lag && (o.vmm || o.dump_path)) {
        fprintf(stderr, "bfcshim replay: --fence-lag applies to the one-region replay, "
                        "without --vmm or --dump-at-failure\n");
        return 2;
    }
    if (o.plan_path && o.vmm) {
        fprintf(stderr, "bfcshim replay: --plan applies to the one-region replay, not --vmm\n");
        return 2;
    }
    if ((o.dump_path && !cli_output_place_ok("replay", "--dump-at-failure", o.dump_path)) ||
        (o.record && !cli_output_place_ok("replay", "--record", o.record)))
        return 2;
    if (optind == argc) {
        fprintf(stderr, "bfcshim replay: no trace given: bfcshim replay [OPTIONS] "
                        "TRACE.csv[.gz]...; bfcshim replay --help lists the options\n");
        return 2;
    }
    if (o.plan_path) {
        char err[512];
        if (!plan_file_read(o.plan_path, &o.plan, err, sizeof err)) {
            fprintf(stderr, "bfcshim replay: --plan %s\n", err);
            return 2;
        }
        /* A plan is packed at the pool's alignment, which the shim's default
         * (512) and the replay's (256) differ in: without --granularity the
         * replay takes the plan's, as a pool that uses the plan has it. */
        if (!gran_given)
            o.policy.granularity = o.plan.granularity;
        if (o.plan.granularity != o.policy.granularity) {
            fprintf(stderr, "bfcshim replay: --plan %s was packed at a granularity of %llu, "
                            "the replay's is %llu\n", o.plan_path,
                    (unsigned long long)o.plan.granularity,
                    (unsigned long long)o.policy.granularity);
            plan_file_free(&o.plan);
            return 2;
        }
    }
    if (o.pool_unit && o.pool_unit < o.policy.granularity) {
        fprintf(stderr, "bfcshim replay: --pool-unit must be at least the granularity\n");
        plan_file_free(&o.plan);
        return 2;
    }
    if (o.pool_size)
        o.pool_size = (o.pool_size + o.policy.granularity - 1) / o.policy.granularity *
                      o.policy.granularity;
    /* Names are never cut: the column is as wide as the longest. */
    o.name_width = 5;
    for (int i = optind; i < argc; i++) {
        int n = (int)strlen(short_name(argv[i]));
        o.name_width = n > o.name_width ? n : o.name_width;
    }
    int status = 0;
    for (int i = optind; i < argc; i++)
        status |= replay_one(argv[i], &o, i == optind);
    plan_file_free(&o.plan);
    return status;
}
