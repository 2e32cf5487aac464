/*
 * replay_vmm.c - `bfcshim replay --vmm`: how much device memory a trace needs
 * when the pool is one growable virtual range (bfc_options.vmm), against the
 * two ways it can hold memory without virtual memory.
 *
 * For each trace it measures, on the simulated device:
 *   min_limit   the smallest limit on *mapped* bytes, to the map granule, at
 *               which the virtual-memory pool serves every allocation (under
 *               that limit it gives free granules back before failing: the
 *               memory the job needs with this allocator);
 *   unlimited   one run with room to spare and the chosen release threshold:
 *               the peak of mapped bytes and the map/unmap calls it took;
 *   regions     today's growth mode (regions doubling from 2 MiB, empty
 *               ones returned when nothing fits): the peak it holds with room
 *               to spare, and its own smallest limit;
 *   curve       mapped bytes (virtual memory, unlimited run), held bytes
 *               (growth-mode regions) and live bytes at 64 moments (every
 *               event of a shorter trace).
 * The single preallocated region is replay's own min_pool_bytes.
 *
 * With --gpu-lag N every free is a fenced free (one lane, the event's index
 * as its token) and the simulated GPU runs N events behind the host: a freed
 * block returns only once the GPU has passed its free, or when the pool waits
 * for it. This is how a framework that queues work ahead of the GPU frees
 * (PyTorch without its cache frees as soon as the host is done with a
 * tensor), and what decides whether a growing pool waits or grows.
 */
#include "cli.h"
#include "replay_vmm.h"
#include "sim_device.h"

/* Points on the curves: every event of a short trace, else 64. */
static size_t curve_points(const trace *t)
{
    return t->nev < VMM_CURVE_POINTS ? t->nev : VMM_CURVE_POINTS;
}

/* A pool over the simulated device, and with a lagging GPU the lane its
 * fenced frees go to. */
typedef struct sim_pool {
    sim_device dev;
    bfc_pool *pool;
    uint32_t lane; /* BFC_NO_LANE: frees are immediate */
} sim_pool;

static uint64_t run_events(sim_pool *sp, const trace *t, size_t from, size_t to,
                           bfc_addr *slot_addr)
{
    return sp->lane == BFC_NO_LANE ? replay_loop(sp->pool, t, from, to, slot_addr)
                                   : replay_lagging(sp->pool, &sp->dev, sp->lane, FREES_FENCED,
                                                    t, from, to, slot_addr);
}

/* One replay of the whole trace; returns allocations that failed. When
 * `curve_held` is given, samples the pool after every event of a short
 * trace, else after 64 evenly spaced ones. */
static uint64_t run_trace(sim_pool *sp, const trace *t, bfc_addr *slot_addr,
                          uint64_t *curve_held, uint64_t *curve_live, uint64_t *curve_at)
{
    bfc_pool *pool = sp->pool;
    if (!curve_held)
        return run_events(sp, t, 0, t->nev, slot_addr);
    const size_t points = curve_points(t);
    uint64_t failures = 0;
    size_t from = 0;
    for (size_t k = 0; k < points; k++) {
        size_t to = t->nev * (k + 1) / points;
        failures += run_events(sp, t, from, to, slot_addr);
        from = to;
        bfc_stats s;
        bfc_pool_stats(pool, &s);
        curve_held[k] = s.pool_bytes;
        if (curve_live)
            curve_live[k] = s.bytes_requested;
        if (curve_at)
            curve_at[k] = to;
    }
    return failures;
}

/* KIND_VMM grows its mapping; KIND_VMM_PREALLOCATED maps the whole limit
 * at creation (BFCSHIM_PREALLOCATE over virtual memory) and remaps free
 * granules under pressure. */
typedef enum pool_kind { KIND_VMM, KIND_VMM_PREALLOCATED, KIND_REGIONS } pool_kind;

/* A fresh pool of `kind` with limit `limit` over sp->dev, its GPU `gpu_lag`
 * events behind (0: frees are immediate); false if it cannot be made. */
static bool make_pool(sim_pool *sp, pool_kind kind, const bfc_options *policy, uint64_t limit,
                      uint64_t gpu_lag)
{
    sim_device *dev = &sp->dev;
    sim_device_init(dev, limit);
    bfc_options o = *policy;
    o.limit_bytes = limit;
    o.preallocate = kind == KIND_VMM_PREALLOCATED;
    bfc_backend b;
    if (kind != KIND_REGIONS) {
        o.vmm = true;
        dev->alignment = o.map_granularity;
        b = sim_device_vmm_backend(dev);
    } else {
        o.vmm = false;
        o.region_granularity = UINT64_C(2) << 20; /* the driver's granule */
        o.garbage_collection = true;
        b = sim_device_backend(dev);
    }
    sp->lane = BFC_NO_LANE;
    if (gpu_lag) {
        dev->gpu_lag = gpu_lag;
        b.fence_done = sim_device_fence_done;
    }
    sp->pool = bfc_pool_create(&o, &b);
    if (sp->pool && gpu_lag && bfc_pool_lane_open(sp->pool, false, &sp->lane) != BFC_OK) {
        bfc_pool_destroy(sp->pool, true);
        sp->pool = NULL;
    }
    if (!sp->pool)
        sim_device_fini(dev);
    return sp->pool != NULL;
}

/* Replays the trace in a fresh pool; fills *st (and *created, when given,
 * with the physical memory the device made for it) and returns the failures
 * (UINT64_MAX when no pool could be made). */
static uint64_t replay_in(const trace *t, pool_kind kind, const bfc_options *policy,
                          uint64_t gpu_lag, uint64_t limit, bfc_addr *slot_addr, bfc_stats *st,
                          uint64_t *created, uint64_t *curve_held, uint64_t *curve_live,
                          uint64_t *curve_at)
{
    sim_pool sp;
    if (!make_pool(&sp, kind, policy, limit, gpu_lag))
        return UINT64_MAX;
    uint64_t failures = run_trace(&sp, t, slot_addr, curve_held, curve_live, curve_at);
    bfc_pool_stats(sp.pool, st);
    if (created)
        *created = sp.dev.created_bytes;
    if (sp.lane != BFC_NO_LANE)
        bfc_pool_lane_close(sp.pool, sp.lane);
    bfc_pool_destroy(sp.pool, true);
    sim_device_fini(&sp.dev);
    return failures;
}

typedef struct serves_ctx {
    const trace *t;
    pool_kind kind;
    const bfc_options *policy;
    uint64_t gpu_lag;
    bfc_addr *slot_addr;
} serves_ctx;

static bool serves_at(void *ctx, uint64_t limit)
{
    serves_ctx *c = ctx;
    bfc_stats st;
    return replay_in(c->t, c->kind, c->policy, c->gpu_lag, limit, c->slot_addr, &st, NULL, NULL,
                     NULL, NULL) == 0;
}

/* The smallest limit, in multiples of `unit`, at which a pool of `kind`
 * serves the whole trace; 0 when even `cap` does not. */
static uint64_t min_limit(const trace *t, pool_kind kind, const bfc_options *policy,
                          uint64_t gpu_lag, uint64_t unit, uint64_t cap, bfc_addr *slot_addr)
{
    serves_ctx c = {t, kind, policy, gpu_lag, slot_addr};
    return cli_smallest_serving(t->peak_live_bytes, unit, cap, serves_at, &c);
}

void replay_vmm_dump_at_failure(const trace *t, const bfc_options *policy, uint64_t min,
                                bfc_addr *slot_addr, FILE *f)
{
    const uint64_t gran = policy->map_granularity;
    if (min <= gran) {
        fprintf(f, "%s: the smallest limit over virtual memory is %s: nothing to show\n",
                t->name, min ? "one granule" : "not found (or measured with --gpu-lag)");
        return;
    }
    sim_pool sp;
    if (!make_pool(&sp, KIND_VMM_PREALLOCATED, policy, min - gran, 0))
        return;
    replay_dump_first_failure(sp.pool, t, slot_addr, "a pool preallocated over virtual memory",
                              min - gran, f);
    bfc_pool_destroy(sp.pool, true);
    sim_device_fini(&sp.dev);
}

void replay_vmm_measure(const trace *t, const bfc_options *policy, uint64_t gpu_lag,
                        uint64_t one_region_bytes, bfc_addr *slot_addr, replay_vmm_report *out)
{
    *out = (replay_vmm_report){0};
    if (t->peak_live_bytes == 0)
        return;
    const uint64_t gran = policy->map_granularity;
    /* Room to spare: four times the peak plus 1 GiB serves every real trace
     * (checked: a run that still fails is reported, not hidden). */
    const uint64_t most = BFC_SIZE_LIMIT - gran; /* the largest limit a pool takes */
    const uint64_t roomy = t->peak_live_bytes < (most - (UINT64_C(1) << 30)) / 4
                               ? 4 * t->peak_live_bytes + (UINT64_C(1) << 30)
                               : most;

    out->min_limit_bytes = min_limit(t, KIND_VMM, policy, gpu_lag, gran, roomy, slot_addr);
    if (out->min_limit_bytes) {
        bfc_stats st;
        replay_in(t, KIND_VMM, policy, gpu_lag, out->min_limit_bytes, slot_addr, &st, NULL, NULL,
                  NULL, NULL);
        out->tight_map_calls = st.num_map_calls;
        out->tight_unmap_calls = st.num_unmap_calls;
    }

    out->prealloc_min_limit_bytes =
        min_limit(t, KIND_VMM_PREALLOCATED, policy, gpu_lag, gran, roomy, slot_addr);
    if (out->prealloc_min_limit_bytes) {
        bfc_stats st;
        /* At the smallest limit, with 1% to spare, and where one region
         * just serves the trace (whole granules) and 2% and 5% above that:
         * how much remapping a job near its limit pays, and what it pays
         * at limits that the pool on one region meets with no remapping
         * at all. */
        const uint64_t min = out->prealloc_min_limit_bytes;
        const uint64_t above[PREALLOC_POINTS] = {min, min + min / 100, one_region_bytes,
                                                 one_region_bytes + one_region_bytes / 50,
                                                 one_region_bytes + one_region_bytes / 20};
        for (int k = 0; k < PREALLOC_POINTS; k++) {
            const uint64_t at = (above[k] + gran - 1) / gran * gran;
            if (at < min)
                continue; /* one region not measured, or below the smallest limit */
            uint64_t created = 0;
            out->prealloc_failures[k] = replay_in(t, KIND_VMM_PREALLOCATED, policy, gpu_lag, at,
                                                  slot_addr, &st, &created, NULL, NULL, NULL);
            /* The limit is whole granules: all of it was made at start. */
            out->prealloc_created_bytes[k] = created > at ? created - at : 0;
            out->prealloc_limit[k] = at;
            out->prealloc_map_calls[k] = st.num_map_calls;
            out->prealloc_unmap_calls[k] = st.num_unmap_calls;
            out->prealloc_unmapped_bytes[k] = st.released_bytes_total;
            out->prealloc_mapped_refits[k] = st.num_mapped_refits;
        }
    }

    bfc_stats st;
    out->unlimited_failures = replay_in(t, KIND_VMM, policy, gpu_lag, roomy, slot_addr, &st, NULL,
                                        out->curve_mapped, out->curve_live, out->curve_event);
    out->curve_points = curve_points(t);
    out->peak_mapped_bytes = st.peak_pool_bytes;
    out->map_calls = st.num_map_calls;
    out->unmap_calls = st.num_unmap_calls;
    out->released_bytes = st.released_bytes_total;
    out->growth_moves = st.num_growth_moves;
    out->fence_waits = st.num_fence_waits;

    out->regions_failures = replay_in(t, KIND_REGIONS, policy, gpu_lag, roomy, slot_addr, &st, NULL,
                                      out->curve_regions, NULL, NULL);
    out->regions_peak_bytes = st.peak_pool_bytes;
    out->regions_count = st.num_region_allocs;
    out->regions_fence_waits = st.num_fence_waits;
    out->regions_min_limit_bytes =
        min_limit(t, KIND_REGIONS, policy, gpu_lag, UINT64_C(2) << 20, roomy, slot_addr);
}
