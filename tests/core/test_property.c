/*
 * Property test: long seeded sequences of random operations against the
 * engine, each followed by the invariant checker and compared with a model.
 *
 *   test_property [--seeds A-B | --seed N] [--ops N] [--quiet] [--classic] [--no-queries]
 *                 [--growing-lazy]
 *
 * Each seed also draws the pool's configuration (preallocation or growth,
 * granularity, split threshold, two-ended placement, garbage collection,
 * limit, a device that refuses some requests, a fence callback or none,
 * virtual memory with its granule, address space and release threshold), so
 * a seed range covers the option space.
 *
 * What the model checks besides bfc_pool_check:
 *   - every allocation is aligned, inside the pool, and overlaps no live
 *     allocation and no pending block it may not reuse;
 *   - it is the best fit: the smallest free (or own-lane pending) chunk that
 *     fits, lowest address on ties (over virtual memory, aligned, a block
 *     that is not whole granules may take one of the next four larger free
 *     chunks where it pins fewer granules), carved from the end the policy says
 *     (against the older neighbour; a region edge oldest, except over
 *     virtual memory; aligned, a block of whole map granules at an end on
 *     a granule boundary, region edges included only before a preallocated
 *     pool's first overflow, and another block at the end that pins fewer
 *     new granules, before that overflow only in a chunk under two
 *     granules);
 *   - an OOM happens only when no chunk fits and the pool could not grow
 *     (vmm: only when too little of the limit is unmapped to map the block,
 *     and no free chunk holds it at an end with no more granules to map
 *     under what the carve takes than the limit leaves beside those blocks
 *     pin: then it goes there, aligned as the policy says where the room
 *     allows, the pool's last resort, num_limit_moves);
 *   - vmm: every allocation is mapped on the device, which saw no mapping
 *     twice, no unmapping of what was not mapped, no keep left on (or kept
 *     memory left over) after a call, and nothing left at the end;
 *     it mapped more only when pending frees could not hold it (or an epoch
 *     stayed unsealed, so they could not be waited for);
 *     when mapping the block where best fit puts it would pass the limit,
 *     it goes instead to the smallest free chunk holding it wholly on mapped
 *     granules (its low end, else its high end) if there is one;
 *   - with a plan (a third of the seeds: random sizes and places), an
 *     allocation goes to the place of the first unused entry of its size
 *     within 64 entries of the model's cursor exactly when that place is
 *     wholly free and the pool has one region; else, unless the model's
 *     stray score has abandoned the plan, to the high end of the smallest
 *     free chunk above the plan's extent that holds it (not over vmm); else
 *     where the rule above puts it;
 *   - bad frees (double, interior, foreign, stale) are refused with the right
 *     status and change no statistic;
 *   - deferred frees (lanes 3..5) are sealed by a later allocation (the
 *     fence interval's, or any that finds nothing free) and never retire
 *     while their epoch is unsealed;
 *   - bytes requested and live counts agree with the model;
 *   - loans (bfc_pool_lend up to, at and past what the limit has left;
 *     bfc_pool_end_loan, now and then of more than is lent): one past the
 *     limit is refused and changes nothing; one granted leaves the pool
 *     within the limit less the loan, one refused leaves it above that;
 *     bytes_lent and bytes_limit agree with the model, and every check of
 *     the limit above reads the limit less what is lent;
 *   - lazy lanes: an allocation seals a lazy epoch only when the pool needs
 *     memory (no fit, growth, more to map, a plan's place taken, or the
 *     lazy lanes' share due), and a growing pool whose lazy epochs hold
 *     1/32 of the bytes in use seals them all (a lazy lane closed with its
 *     seal refused still counts: its epoch stays lazy); a trim and an
 *     explicit seal try every open epoch;
 *   - closing a lane (plain, close_into, retire_into another deferred lane,
 *     reusable or not): close tries the seal, retire_into never does; the
 *     epoch moves only into an open, non-reusable target, whose pending
 *     bytes grow by exactly the epoch's, and a reusable one receives nothing;
 *   - a quarter of the seeds run under a limit that is no multiple of the
 *     granularity.
 *   - queries (a third stream): bfc_pool_lookup / bfc_pool_block at a live
 *     block's base, inside its request, past it in its chunk and at freed
 *     addresses; bfc_pool_largest_live against every allocated chunk;
 *     bfc_pool_free_space against the statistics and, over vmm, its largest
 *     free block against the model's search for room, then now and then
 *     an allocation of exactly that block; and plans installed, replaced
 *     or removed while blocks are live.
 * The extensions draw from a stream of their own; --classic leaves them out
 * and replays a seed exactly as before they existed; --no-queries leaves
 * out the queries and mid-run plans alone.
 * A failure prints the seed and step, so `--seed N --ops M` replays it.
 */
#include <getopt.h>
#include <string.h>

#include "pool_fixture.h"

#define MAX_LIVE 400
#define MAX_PENDING 4096
#define MAX_LANES 6
#define MAX_PLAN 96
#define MAX_LOANS 4
#define MAX_TRIED 64

typedef struct live_block {
    bfc_addr addr;
    uint64_t size, rounded;
} live_block;

typedef struct pending_range {
    bfc_addr lo, hi; /* [lo, hi) */
    uint32_t lane;
    uint64_t token;
} pending_range;

typedef struct model {
    live_block live[MAX_LIVE];
    size_t nlive;
    pending_range pend[MAX_PENDING];
    size_t npend;
    uint32_t lanes[MAX_LANES]; /* 0: slot closed; lanes 3.. take deferred frees */
    bool lane_reusable[MAX_LANES];
    uint64_t open_epoch[MAX_LANES]; /* deferred lanes: the pool's open token */
    uint64_t epoch_counter;         /* mirrors the pool's token counter */
    uint64_t next_token;
    uint64_t requested;
    bfc_addr freed[64]; /* recently freed addresses, for double frees */
    size_t nfreed;
    bool lazy[MAX_LANES]; /* bfc_pool_lane_set_lazy, as the model last set it */
    uint64_t loans[MAX_LOANS]; /* bfc_pool_lend's loans still in force */
    size_t nloans;
    uint64_t lent; /* their sum: what the pool's bytes_lent must say */
} model;

/* An entry of the seed's placement plan, if it has one. */
typedef struct plan_slot {
    uint64_t size, offset;
    bool gone; /* taken, or given up as left behind */
} plan_slot;

/* The plan's matching rules (core/plan.c), restated. */
#define PLAN_WINDOW 64
#define PLAN_STRAY_COST 8
#define PLAN_STRAY_LIMIT 64
#define PLAN_SPARE_WALK 256

typedef struct run {
    uint64_t seed, step, rng;
    fixture f;
    model m;
    uint64_t fence_done_upto, epoch_done_upto;
    bool with_fences;
    /* The rules of virtual memory apply to this allocation (vmm_rules). */
    bool vmm_rules;
    unsigned closed_open_epochs; /* entries of closed_open_epoch set */
    uint64_t ooms, allocs, frees, bad_frees, retires;
    plan_slot plan[MAX_PLAN];
    size_t nplan;
    uint64_t plan_pos, plan_stray, plan_extent; /* the cursor, stray score, extent */
    bool plan_abandoned;
    uint64_t planned, plan_misses; /* allocations at / not at their planned place */
    uint64_t plan_spare;           /* allocations placed above the extent */
    /* The extensions (loans, lazy lanes, closing into another lane, a limit
     * off the granularity) draw from their own stream, so that --classic
     * replays a seed exactly as before they existed (the regression seeds
     * in tests/meson.build name such runs). */
    bool classic;
    uint64_t xrng;
    bool loans_ever; /* a loan was made: the spare space may be unmapped */
    /* Lanes the pool asked fence_seal about during the current operation. */
    uint32_t tried[MAX_TRIED];
    unsigned ntried;
    /* For each: had fence_done already reported a token done during this
     * operation (a retirement may have changed the layout the model saw)? */
    bool tried_after_done[MAX_TRIED];
    bool done_seen;
    uint64_t loans, loan_ooms, lazy_seals, moved_epochs;
    /* A growing pool's moves (num_growth_moves), and those made with blocks
     * pending (only lazy lanes' open epochs may hold them then). */
    uint64_t growth_moves, growth_moves_pending;
    /* The queries and mid-run plans (op_query, op_replan) draw from a third
     * stream, so that the extensions' stream stays as it was. */
    uint64_t qrng;
    uint64_t forced_size; /* op_alloc's next size, when not 0 */
    uint64_t queries, largest_allocs, replans;
} run;

static run R;

#define DEFERRED_FIRST 3

static int model_lane_index(uint32_t lane)
{
    for (int i = 0; i < MAX_LANES; i++)
        if (R.m.lanes[i] == lane && lane != BFC_NO_LANE)
            return i;
    return -1;
}

/* The limit the pool works under: the configured one less what is lent
 * (bfc_pool_lend). */
static uint64_t eff_limit(void)
{
    return R.f.opt.limit_bytes - R.m.lent;
}

/* Did the pool ask fence_seal about `lane` during this operation? */
static bool seal_tried(uint32_t lane)
{
    for (unsigned i = 0; i < R.ntried; i++)
        if (R.tried[i] == lane)
            return true;
    return false;
}

/* Deferred lanes' tokens come from the pool's counter, explicit ones from
 * the model's: each kind has its own simulated GPU progress. A lane closed
 * by the model may still drain, so its kind is looked up in `deferred_ids`. */
static bool deferred_ids[65536];
/* A closed lane's epoch whose seal was refused: its token, by lane id;
 * and whether the lane was lazy when closed (it stays so in the pool: its
 * epoch is sealed when the memory is needed, and lanes_lazy_due counts what
 * it holds). */
static uint64_t closed_open_epoch[65536];
static bool closed_lazy[65536];

/* --growing-lazy: every seed a growing pool over virtual memory (its
 * headroom at the default, so that blocks landing past it move granules)
 * whose lanes start lazy, so that moves meet frees held in lazy epochs. */
static bool growing_lazy;
static uint32_t max_lane_id; /* the highest lane id opened this seed */

static bool fence_done(void *ctx, uint32_t lane, uint64_t token, bool wait)
{
    (void)ctx;
    uint64_t *done = deferred_ids[lane] ? &R.epoch_done_upto : &R.fence_done_upto;
    if (wait && token > *done)
        *done = token;
    R.done_seen |= token <= *done;
    return token <= *done;
}

static bool fence_seal(void *ctx, uint32_t lane, uint64_t token)
{
    (void)ctx;
    if (R.ntried < MAX_TRIED) {
        R.tried_after_done[R.ntried] = R.done_seen;
        R.tried[R.ntried++] = lane;
    }
    if (rng_below(&R.rng, 10) == 0)
        return false; /* e.g. a stream is capturing: try again later */
    int i = model_lane_index(lane);
    if (i >= 0 && R.m.open_epoch[i] == token)
        R.m.open_epoch[i] = 0;
    if (i < 0 && closed_open_epoch[lane] == token) {
        closed_open_epoch[lane] = 0;
        R.closed_open_epochs--;
    }
    return true;
}

/* Was `lane` first tried after a fence was reported done in this operation? */
static bool seal_tried_after_done(uint32_t lane)
{
    for (unsigned i = 0; i < R.ntried; i++)
        if (R.tried[i] == lane)
            return R.tried_after_done[i];
    return false;
}

#define FAIL_AT(...)                                                               \
    do {                                                                           \
        fprintf(stderr, "seed %" PRIu64 " step %" PRIu64 ": ", R.seed, R.step);    \
        fprintf(stderr, __VA_ARGS__);                                              \
        fputc('\n', stderr);                                                       \
        harness_failures++;                                                        \
    } while (0)

static bool overlaps(bfc_addr a, uint64_t n, bfc_addr b, uint64_t m)
{
    return a < b + m && b < a + n;
}

/* ---- configuration ---------------------------------------------------- */

static uint64_t draw_size(void);

/* A random plan: sizes the allocations will draw, places anywhere in the
 * limit or in its lower half (leaving spare space above); many overlap, so
 * misses are exercised as much as hits. Installing one again restarts the
 * pool's cursor and score, as the model's. */
static void install_plan(void)
{
    const uint64_t g = R.f.opt.granularity, limit = R.f.opt.limit_bytes;
    const uint64_t span = rng_below(&R.rng, 2) ? limit : limit / 2;
    bfc_plan_entry e[MAX_PLAN];
    R.nplan = 16 + rng_below(&R.rng, MAX_PLAN - 16);
    R.plan_pos = R.plan_stray = R.plan_extent = 0;
    R.plan_abandoned = false;
    for (size_t i = 0; i < R.nplan; i++) {
        uint64_t size;
        do
            size = (draw_size() + g - 1) / g * g;
        while (size == 0 || size > span);
        uint64_t offset = rng_below(&R.rng, (span - size) / g + 1) * g;
        R.plan[i] = (plan_slot){size, offset, false};
        e[i] = (bfc_plan_entry){size, offset};
        if (offset + size > R.plan_extent)
            R.plan_extent = offset + size;
    }
    if (bfc_pool_set_plan(R.f.pool, e, R.nplan) != BFC_OK)
        FAIL_AT("a valid plan of %zu entries was refused", R.nplan);
}

static bool plan_active(void)
{
    return R.nplan && !R.plan_abandoned && R.plan_pos < R.nplan;
}

/* The entry an allocation of `rounded` takes, or -1; with `commit`, takes
 * it and gives up the entries of the size left behind the cursor. */
static int plan_entry_for(uint64_t rounded, bool commit)
{
    if (R.plan_abandoned)
        return -1;
    for (size_t i = 0; i < R.nplan; i++) {
        plan_slot *e = &R.plan[i];
        if (e->gone || e->size != rounded)
            continue;
        if (i + PLAN_WINDOW < R.plan_pos) {
            e->gone = commit;
            continue;
        }
        if (i >= R.plan_pos + PLAN_WINDOW)
            return -1;
        if (commit) {
            e->gone = true;
            R.plan_pos = i + 1;
        }
        return (int)i;
    }
    return -1;
}

static void plan_record(bool placed)
{
    if (placed)
        R.plan_stray -= R.plan_stray > 0;
    else if (plan_active() && (R.plan_stray += PLAN_STRAY_COST) > PLAN_STRAY_LIMIT)
        R.plan_abandoned = true;
}

/* The spare search: from the chunk holding base + extent, at most
 * PLAN_SPARE_WALK chunks up, the smallest FREE one whose part above that
 * address holds the block (the first such on ties). */
typedef struct spare_search {
    bfc_addr base, lo;
    bool have_base;
    uint64_t rounded;
    unsigned walked;
    bool found;
    bfc_chunk_info best;
} spare_search;

static void spare_visitor(void *arg, const bfc_chunk_info *c)
{
    spare_search *ss = arg;
    if (c->region != 0)
        return;
    if (!ss->have_base) {
        ss->base = c->addr;
        ss->lo = c->addr + R.plan_extent;
        ss->have_base = true;
    }
    const bfc_addr end = c->addr + c->size;
    if (end <= ss->lo || ss->walked >= PLAN_SPARE_WALK)
        return;
    ss->walked++;
    if (c->kind == BFC_CHUNK_FREE && end - (c->addr > ss->lo ? c->addr : ss->lo) >= ss->rounded &&
        (!ss->found || c->size < ss->best.size)) {
        ss->best = *c;
        ss->found = true;
    }
}

typedef struct place_search {
    bfc_addr base; /* region 0's */
    bool have_base;
    uint64_t offset, rounded;
    bool free; /* [base + offset, + rounded) lies in one FREE chunk */
} place_search;

static void place_visitor(void *arg, const bfc_chunk_info *c)
{
    place_search *ps = arg;
    if (c->region != 0)
        return;
    if (!ps->have_base) { /* chunks come in address order */
        ps->base = c->addr;
        ps->have_base = true;
    }
    bfc_addr lo = ps->base + ps->offset;
    if (c->kind == BFC_CHUNK_FREE && lo >= c->addr && lo + ps->rounded <= c->addr + c->size)
        ps->free = true;
}

static void configure(void)
{
    uint64_t *rng = &R.rng;
    fixture *f = &R.f;
    static const uint64_t limits[] = {1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB};
    fixture_begin(f, limits[rng_below(rng, 4)]);
    f->opt.granularity = rng_below(rng, 4) == 0 ? 512 : 256;
    f->opt.region_granularity = rng_below(rng, 2) ? f->opt.granularity : 64 * KiB;
    f->opt.preallocate = rng_below(rng, 2);
    f->opt.initial_region_bytes = (rng_below(rng, 8) + 1) * 64 * KiB;
    static const uint64_t splits[] = {256, 1024, 16 * KiB};
    f->opt.min_split_bytes = splits[rng_below(rng, 3)];
    static const bfc_placement places[] = {BFC_PLACE_LOW, BFC_PLACE_BY_AGE, BFC_PLACE_ALIGNED,
                                           BFC_PLACE_ALIGNED};
    f->opt.placement = places[rng_below(rng, 4)];
    /* From "never above the granularity" to alignments that matter at
     * every size the test draws. */
    f->opt.align_bytes = (uint64_t)256 << rng_below(rng, 10);
    f->opt.tsl_split = rng_below(rng, 5) == 0;
    f->opt.garbage_collection = rng_below(rng, 4) != 0;
    f->opt.fence_interval = rng_below(rng, 3) == 0 ? 1 + (uint32_t)rng_below(rng, 16) : 1;
    f->opt.fence_bytes = rng_below(rng, 2) ? 0 : (1 + rng_below(rng, 8)) * 64 * KiB;
    if (rng_below(rng, 4) == 0)
        f->dev.refuse_above = f->opt.limit_bytes / 2;
    if (rng_below(rng, 4) == 0)
        f->dev.capacity = f->opt.limit_bytes * 3 / 4;
    f->dev.alignment = rng_below(rng, 2) ? 512 : 2 * MiB;
    R.with_fences = rng_below(rng, 2);
    /* A third of the seeds run over virtual memory: granules from 4 KiB to a
     * quarter of the limit, address space from half the limit (so that
     * reservations run out and more are made) to the default, and release
     * thresholds from "at once" to "never". The device tracks its own
     * mappings. */
    f->opt.vmm = rng_below(rng, 3) == 0 || growing_lazy;
    if (growing_lazy)
        f->opt.preallocate = false;
    if (f->opt.vmm) {
        const uint64_t grans[] = {4 * KiB, 64 * KiB, f->opt.limit_bytes / 4};
        f->opt.map_granularity = grans[rng_below(rng, 3)];
        if (f->opt.map_granularity < f->opt.granularity)
            f->opt.map_granularity = f->opt.granularity;
        const uint64_t vas[] = {0, f->opt.limit_bytes / 2, f->opt.limit_bytes * 3};
        f->opt.va_bytes = vas[rng_below(rng, 3)];
        f->opt.prealloc_spread = rng_below(rng, 2);
        const uint64_t thresholds[] = {UINT64_MAX, 0, f->opt.limit_bytes / 8};
        f->opt.release_threshold = thresholds[rng_below(rng, 3)];
        f->dev.track_maps = true;
        f->dev.alignment = f->opt.map_granularity;
    }
    /* A quarter of the seeds: a limit that is no multiple of the
     * granularity (nor of a map granule), a little above or below one
     * (bfc.h asks only that it be > 0; the pool holds whole granules, at
     * most the limit rounded down). */
    if (!R.classic && rng_below(&R.xrng, 4) == 0) {
        const uint64_t off = 1 + rng_below(&R.xrng, 3 * f->opt.granularity - 1);
        if (off % f->opt.granularity == 0 || rng_below(&R.xrng, 2))
            f->opt.limit_bytes -= off | 1;
        else
            f->opt.limit_bytes += off;
    }
    bfc_backend b = f->opt.vmm ? sim_device_vmm_backend(&f->dev) : sim_device_backend(&f->dev);
    if (R.with_fences)
        b.fence_done = fence_done;
    b.fence_seal = fence_seal;
    fixture_start_with(f, &b);
    if (rng_below(rng, 3) == 0)
        install_plan();
}

/* ---- model maintenance ------------------------------------------------- */

/* Removes [lo, hi) from the pending ranges of `lane` (a same-lane reuse). */
static void pending_subtract(uint32_t lane, bfc_addr lo, bfc_addr hi)
{
    model *m = &R.m;
    for (size_t i = 0; i < m->npend;) {
        pending_range p = m->pend[i];
        if (p.lane != lane || !overlaps(p.lo, p.hi - p.lo, lo, hi - lo)) {
            i++;
            continue;
        }
        m->pend[i] = m->pend[--m->npend];
        if (p.lo < lo && m->npend < MAX_PENDING)
            m->pend[m->npend++] = (pending_range){p.lo, lo, p.lane, p.token};
        if (hi < p.hi && m->npend < MAX_PENDING)
            m->pend[m->npend++] = (pending_range){hi, p.hi, p.lane, p.token};
    }
}

/* The pool may retire lanes on its slow path and by polling; resynchronise
 * from the oldest token each lane still holds. A block of an epoch that was
 * never sealed must still be there. */
static void pending_resync(void)
{
    model *m = &R.m;
    for (size_t i = 0; i < m->npend;) {
        uint64_t oldest = 0;
        bool any = bfc_pool_lane_oldest(R.f.pool, m->pend[i].lane, &oldest);
        if (!any || m->pend[i].token < oldest) {
            int k = model_lane_index(m->pend[i].lane);
            if (k >= DEFERRED_FIRST && m->open_epoch[k] &&
                m->pend[i].token >= m->open_epoch[k])
                FAIL_AT("lane %u retired token %" PRIu64 " of an unsealed epoch",
                        m->pend[i].lane, m->pend[i].token);
            m->pend[i] = m->pend[--m->npend];
        } else {
            i++;
        }
    }
}

typedef struct fit {
    bool found;
    bfc_chunk_info chunk;
    uint64_t prev_age, next_age; /* of its neighbours, as the policy sees them */
    bool prev_edge, next_edge;   /* is that neighbour a region edge? */
} fit;

/* Over virtual memory: the map granules under a block of `rounded` bytes
 * at `at` in fit f's chunk that no block beside the chunk covers already
 * (a neighbour that is a block, not a region edge, covers the granule its
 * edge shares with the chunk when that edge is not on a boundary). */
static uint64_t granules_not_held(const fit *f, bfc_addr at, uint64_t rounded, uint64_t mg)
{
    const bfc_addr start = f->chunk.addr, end = f->chunk.addr + f->chunk.size;
    const bool low_held = !f->prev_edge && start % mg != 0;
    const bool high_held = !f->next_edge && end % mg != 0;
    uint64_t n = 0;
    for (bfc_addr gr = at / mg; gr <= (at + rounded - 1) / mg; gr++)
        if (!(low_held && gr == start / mg) && !(high_held && gr == (end - 1) / mg))
            n++;
    return n;
}

/* The fewer of granules_not_held at the two ends of f's chunk. */
static uint64_t pins_at_better_end(const fit *f, uint64_t rounded, uint64_t mg)
{
    const uint64_t low = granules_not_held(f, f->chunk.addr, rounded, mg);
    const uint64_t high = granules_not_held(f, f->chunk.addr + f->chunk.size - rounded, rounded, mg);
    return low < high ? low : high;
}

/* Over virtual memory: is [at, at + size) wholly mapped on the device, and
 * how many bytes of its granules are not? */
static bool mapped_on_device(bfc_addr at, uint64_t size)
{
    const uint64_t mg = R.f.opt.map_granularity;
    const bfc_addr lo = at / mg * mg, hi = (at + size + mg - 1) / mg * mg;
    return sim_device_mapped(&R.f.dev, lo, hi - lo);
}

static uint64_t unmapped_on_device(bfc_addr at, uint64_t size)
{
    const uint64_t mg = R.f.opt.map_granularity;
    uint64_t n = 0;
    for (bfc_addr gr = at / mg * mg; gr < at + size; gr += mg)
        n += sim_device_mapped(&R.f.dev, gr, mg) ? 0 : mg;
    return n;
}

/* Over virtual memory, near the limit: the smallest free chunk (lowest
 * address on ties) that holds `rounded` bytes wholly on mapped memory, at
 * its low end, else its high end, each at `align` and then unaligned; where
 * a block goes rather than have granules remapped under it. */
typedef struct mapped_search {
    uint64_t rounded, align;
    bool found;
    uint64_t size;
    bfc_addr at;
} mapped_search;

static bool mapped_end(const bfc_chunk_info *c, uint64_t rounded, uint64_t align, bfc_addr *at)
{
    const bfc_addr end = c->addr + c->size;
    bfc_addr lo = align ? (c->addr + align - 1) / align * align : c->addr;
    if (lo + rounded <= end && mapped_on_device(lo, rounded)) {
        *at = lo;
        return true;
    }
    bfc_addr hi = end - rounded;
    if (align)
        hi = hi / align * align;
    if (hi >= c->addr && hi != lo && mapped_on_device(hi, rounded)) {
        *at = hi;
        return true;
    }
    return false;
}

static void mapped_visitor(void *arg, const bfc_chunk_info *c)
{
    mapped_search *s = arg;
    bfc_addr at;
    if (c->kind != BFC_CHUNK_FREE || c->size < s->rounded || (s->found && c->size >= s->size))
        return;
    if (mapped_end(c, s->rounded, s->align, &at) ||
        (s->align && mapped_end(c, s->rounded, 0, &at))) {
        s->found = true;
        s->size = c->size;
        s->at = at;
    }
}

/* Over virtual memory, the pool's last resort (place_within_room): with
 * every free granule given back, only granules that allocated and pending
 * chunks touch stay mapped; the smallest free chunk (lowest address on
 * ties) that holds the block at its low end, else its high end (at its
 * natural alignment first, else unaligned), with no more granules to map
 * under what the carve there takes than the limit has room for. */
typedef struct room_search {
    uint64_t rounded, mg;
    uint64_t pinned;        /* bytes of granules non-free chunks touch */
    uint64_t next_uncounted; /* granule index: those below are counted */
    bool counting;          /* first pass: count pinned granules */
    uint64_t room;
    uint64_t align;  /* the block's natural alignment, tried first */
    bool bare;       /* the block alone, not what a carve takes with it */
    bool found, low; /* low: at the chunk's low end */
    uint64_t size;
    bfc_addr at;
} room_search;

/* Granules of [lo, lo + n) in free chunk c that no neighbour pins. */
static uint64_t room_missing(const bfc_chunk_info *c, bfc_addr lo, uint64_t n, uint64_t mg)
{
    const bfc_addr end = c->addr + c->size;
    uint64_t k = 0;
    for (uint64_t gr = lo / mg; gr <= (lo + n - 1) / mg; gr++)
        if (!(c->addr % mg && gr == c->addr / mg) && !(end % mg && gr == (end - 1) / mg))
            k++;
    return k * mg;
}

/* The engine's worth_splitting, restated. */
static bool splits(uint64_t size, uint64_t rounded)
{
    const bfc_options *o = &R.f.opt;
    const uint64_t rest = size - rounded;
    if (o->tsl_split)
        return size >= 2 * rounded || rest >= BFC_TSL_MAX_INTERNAL_FRAGMENTATION;
    return rest >= (o->min_split_bytes > o->granularity ? o->min_split_bytes : o->granularity);
}

/* What the engine's carve at `at` in free chunk c takes: a remainder above
 * too small to split off stays with the block (at the low end, the whole
 * chunk). */
static uint64_t carved_size(const bfc_chunk_info *c, uint64_t rounded, bfc_addr at)
{
    const bfc_addr end = c->addr + c->size;
    if (at == c->addr)
        return splits(c->size, rounded) ? rounded : c->size;
    const uint64_t above = end - at - rounded;
    return above && !splits(above + rounded, rounded) ? end - at : rounded;
}

/* Free chunk c holds the block at its low end, else its high end, each at
 * alignment `align`, with what the carve takes there within the room. */
static bool room_place(room_search *rs, const bfc_chunk_info *c, uint64_t align)
{
    const bfc_addr end = c->addr + c->size;
    const bfc_addr lo = align ? (c->addr + align - 1) / align * align : c->addr;
    if (lo + rs->rounded <= end &&
        room_missing(c, lo, rs->bare ? rs->rounded : carved_size(c, rs->rounded, lo), rs->mg) <=
            rs->room) {
        rs->found = true, rs->size = c->size, rs->at = lo, rs->low = true;
        return true;
    }
    bfc_addr hi = end - rs->rounded;
    if (align)
        hi = hi / align * align;
    if (hi >= c->addr && hi != lo &&
        room_missing(c, hi, rs->bare ? rs->rounded : carved_size(c, rs->rounded, hi), rs->mg) <=
            rs->room) {
        rs->found = true, rs->size = c->size, rs->at = hi, rs->low = false;
        return true;
    }
    return false;
}

static void room_visitor(void *arg, const bfc_chunk_info *c)
{
    room_search *rs = arg;
    const uint64_t mg = rs->mg;
    if (rs->counting) {
        if (c->kind == BFC_CHUNK_FREE)
            return;
        uint64_t first = c->addr / mg;
        const uint64_t end = (c->addr + c->size + mg - 1) / mg;
        if (first < rs->next_uncounted)
            first = rs->next_uncounted;
        if (end > first)
            rs->pinned += (end - first) * mg;
        rs->next_uncounted = end;
        return;
    }
    if (c->kind != BFC_CHUNK_FREE || c->size < rs->rounded || (rs->found && c->size >= rs->size))
        return;
    if (!room_place(rs, c, rs->align) && rs->align)
        room_place(rs, c, 0);
}

/* bare: the block alone, unaligned (bfc_pool_free_space's figure); else
 * what the engine's carve takes, at `align` first. */
static room_search within_room(uint64_t rounded, uint64_t align, bool bare)
{
    room_search rs = {.rounded = rounded,
                      .mg = R.f.opt.map_granularity,
                      .counting = true,
                      .align = bare ? 0 : align,
                      .bare = bare};
    bfc_pool_visit(R.f.pool, room_visitor, &rs);
    rs.counting = false;
    rs.room = eff_limit() > rs.pinned ? eff_limit() - rs.pinned : 0;
    bfc_pool_visit(R.f.pool, room_visitor, &rs);
    return rs;
}

typedef struct fit_search {
    uint64_t rounded;
    uint32_t lane;
    fit best;
    bool have_last, best_is_last;
    bfc_chunk_info last; /* previous chunk in address order */
} fit_search;

static bool model_lane_reusable(uint32_t lane)
{
    for (int i = 0; i < MAX_LANES; i++)
        if (R.m.lanes[i] == lane && lane != BFC_NO_LANE)
            return R.m.lane_reusable[i];
    return false;
}

/* Region edge: oldest (over virtual memory youngest); allocated: its
 * sequence; pending: youngest. */
static uint64_t age_of(const bfc_chunk_info *c)
{
    return c->kind == BFC_CHUNK_ALLOCATED ? c->seq : UINT64_MAX;
}

static uint64_t edge_age(void)
{
    return R.vmm_rules ? UINT64_MAX : 0;
}

/* Over virtual memory, granule placement and a youngest region edge apply,
 * except in a preallocated pool laid out as one region (not
 * prealloc_spread) until its first overflow reservation, its second
 * region. */
static bool vmm_rules(void)
{
    const bfc_options *o = &R.f.opt;
    if (!o->vmm)
        return false;
    return !o->preallocate || o->prealloc_spread || stats_of(&R.f).num_region_allocs >= 2;
}

static void fit_visitor(void *arg, const bfc_chunk_info *c)
{
    fit_search *s = arg;
    bool same_region = s->have_last && s->last.region == c->region;
    if (s->best_is_last) { /* c follows the current best */
        s->best.next_age = same_region ? age_of(c) : edge_age();
        s->best.next_edge = !same_region;
    }
    s->best_is_last = false;
    bool usable = c->kind == BFC_CHUNK_FREE ||
                  (c->kind == BFC_CHUNK_PENDING && c->lane == s->lane &&
                   model_lane_reusable(s->lane));
    if (usable && c->size >= s->rounded &&
        (!s->best.found || c->size < s->best.chunk.size ||
         (c->size == s->best.chunk.size && c->addr < s->best.chunk.addr))) {
        s->best.found = true;
        s->best.chunk = *c;
        s->best.prev_age = same_region ? age_of(&s->last) : edge_age();
        s->best.prev_edge = !same_region;
        s->best.next_age = edge_age(); /* a region edge unless a chunk follows */
        s->best.next_edge = true;
        s->best_is_last = true;
    }
    s->last = *c;
    s->have_last = true;
}

typedef struct extent_search {
    bfc_addr addr;
    uint64_t size;
} extent_search;

static void extent_visitor(void *arg, const bfc_chunk_info *c)
{
    extent_search *e = arg;
    if (c->kind == BFC_CHUNK_ALLOCATED && c->addr == e->addr)
        e->size = c->size;
}

/* Size of the allocated chunk that starts at addr. */
static uint64_t chunk_extent(bfc_addr addr)
{
    extent_search e = {addr, 0};
    bfc_pool_visit(R.f.pool, extent_visitor, &e);
    return e.size;
}

/* The engine's BFC_PLACE_ALIGNED rule, restated: blocks of align_bytes or
 * more start at a multiple of the largest power of two dividing their
 * rounded size, at most align_bytes; 0 when that is no more than the
 * granularity. */
static uint64_t natural_alignment(uint64_t rounded)
{
    const bfc_options *o = &R.f.opt;
    if (o->placement != BFC_PLACE_ALIGNED || rounded < o->align_bytes)
        return 0;
    uint64_t a = 1;
    while (!(rounded & a))
        a <<= 1;
    if (a > o->align_bytes)
        a = o->align_bytes;
    return a > o->granularity ? a : 0;
}

static bool holds_aligned(const bfc_chunk_info *c, uint64_t rounded, uint64_t align)
{
    return (c->addr + align - 1) / align * align + rounded <= c->addr + c->size;
}

/* ---- operations --------------------------------------------------------- */

static uint64_t pending_bytes_of(uint32_t id);
static uint64_t pending_bytes_with(uint32_t id, uint64_t token);

static uint64_t draw_size(void)
{
    if (R.forced_size) {
        const uint64_t size = R.forced_size;
        R.forced_size = 0;
        return size;
    }
    uint64_t *rng = &R.rng, limit = R.f.opt.limit_bytes;
    switch (rng_below(rng, 22)) {
    case 20:
    case 21: { /* clustered: a few shapes with small variations, as tensors are */
        static const uint64_t shapes[] = {20 * KiB, 100 * KiB, 1 * MiB, 3 * MiB};
        uint64_t base = shapes[rng_below(rng, 4)];
        return base + rng_below(rng, base / 25) + 1;
    }
    case 0: return 0;
    case 1: return limit + rng_below(rng, limit) + 1; /* never fits */
    case 2: return (uint64_t)1 << rng_below(rng, 20);   /* powers of two */
    case 3: /* over virtual memory, whole granules half the time */
        if (R.f.opt.vmm && rng_below(rng, 2)) {
            uint64_t mg = R.f.opt.map_granularity;
            return (rng_below(rng, limit / 4 / mg) + 1) * mg;
        }
        /* fall through */
    case 4: return rng_below(rng, limit / 4) + 1;      /* large */
    case 5:
    case 6:
    case 7: return rng_below(rng, 256 * KiB) + 1;      /* medium */
    default: return rng_below(rng, 4 * KiB) + 1;       /* small */
    }
}

static uint32_t draw_lane(void)
{
    if (rng_below(&R.rng, 3) == 0)
        return BFC_NO_LANE;
    uint32_t id = R.m.lanes[rng_below(&R.rng, MAX_LANES)];
    return id;
}

/* Where the best fit s->best puts a block of `rounded` bytes: its end by
 * the policy's rule, at `align` (0: none); `whole`: a block of whole map
 * granules over virtual memory. */
static bfc_addr best_fit_place(const fit_search *s, uint64_t rounded, uint64_t align, bool whole)
{
    const uint64_t g = R.f.opt.granularity, mg = R.f.opt.map_granularity;
    const bfc_options *o = &R.f.opt;
    uint64_t size = s->best.chunk.size, rest = size - rounded;
    bool split = o->tsl_split
                     ? size >= 2 * rounded || rest >= BFC_TSL_MAX_INTERNAL_FRAGMENTATION
                     : rest >= (o->min_split_bytes > g ? o->min_split_bytes : g);
    bool high = split && o->placement != BFC_PLACE_LOW &&
                s->best.next_age < s->best.prev_age;
    bfc_addr lo = s->best.chunk.addr, hi = s->best.chunk.addr + size - rounded;
    /* Over virtual memory any other block takes the end where it needs
     * fewer granules that no neighbouring block already covers (the
     * age rule's end when both need as many); before a preallocated
     * pool's first overflow, only in a chunk smaller than two granules. */
    const bool one_region = R.f.opt.vmm && !R.vmm_rules && R.f.opt.placement == BFC_PLACE_ALIGNED;
    const bool end_rule = R.vmm_rules ? R.f.opt.placement == BFC_PLACE_ALIGNED && !whole
                                      : one_region && size < 2 * mg && rounded % mg != 0;
    if (split && end_rule && s->best.chunk.kind == BFC_CHUNK_FREE) {
        uint64_t at_low = granules_not_held(&s->best, lo, rounded, mg);
        uint64_t at_high = granules_not_held(&s->best, hi, rounded, mg);
        if (at_low != at_high)
            high = at_high < at_low;
    }
    /* A whole-granule block takes an end of its chunk that lies on a
     * granule boundary against a block (the age rule's when both do). */
    bool low_on = !s->best.prev_edge && lo % mg == 0;
    bool high_on = !s->best.next_edge && (hi + rounded) % mg == 0;
    if (split && align && whole && (low_on || high_on)) {
        if (low_on != high_on)
            high = high_on;
        align = 0;
    }
    /* Before a preallocated pool's first overflow, the same for a block of
     * whole map granules, region edges counted as boundaries. */
    const bool one_region_whole = one_region && rounded % mg == 0;
    low_on = lo % mg == 0;
    high_on = (hi + rounded) % mg == 0;
    if (split && align && one_region_whole && (low_on || high_on)) {
        if (low_on != high_on)
            high = high_on;
        align = 0;
    }
    if (split && align) {
        lo = (lo + align - 1) / align * align;
        hi = hi / align * align;
    }
    return high ? hi : lo;
}

static void op_alloc(void)
{
    model *m = &R.m;
    if (m->nlive == MAX_LIVE)
        return;
    uint64_t size = draw_size();
    uint32_t lane = draw_lane();
    uint64_t g = R.f.opt.granularity;
    uint64_t rounded = (size + g - 1) / g * g;
    fit_search s = {.rounded = rounded, .lane = lane};
    R.vmm_rules = vmm_rules();
    if (size && size <= BFC_SIZE_LIMIT - g)
        bfc_pool_visit(R.f.pool, fit_visitor, &s);
    /* Aligned placement: over virtual memory, a block of whole map granules
     * goes to the best fit on a granule boundary if it holds it there.
     * Otherwise the best fit if it holds the block aligned, else the best
     * fit for rounded + align - granule if that one is free, else the best
     * fit unaligned. */
    const uint64_t mg = R.f.opt.map_granularity;
    const bool whole = R.vmm_rules && R.f.opt.placement == BFC_PLACE_ALIGNED && rounded % mg == 0;
    /* Over virtual memory (aligned), a block that is not whole granules and
     * would pin more granules at its best fit than its size needs goes to
     * the first of that chunk and the next four larger free chunks (by size,
     * lowest address on ties) where it pins the fewest. */
    if (s.best.found && R.vmm_rules && R.f.opt.placement == BFC_PLACE_ALIGNED && !whole &&
        s.best.chunk.kind == BFC_CHUNK_FREE) {
        uint64_t pins = pins_at_better_end(&s.best, rounded, mg);
        fit cand = s.best;
        for (int i = 0; i < 4 && pins > rounded / mg; i++) {
            fit_search next = {.rounded = cand.chunk.size + g, .lane = BFC_NO_LANE};
            bfc_pool_visit(R.f.pool, fit_visitor, &next);
            if (!next.best.found)
                break;
            cand = next.best;
            const uint64_t n = pins_at_better_end(&cand, rounded, mg);
            if (n < pins) {
                pins = n;
                s.best = cand;
            }
        }
    }
    uint64_t align = natural_alignment(rounded);
    if (whole && s.best.found && s.best.chunk.kind == BFC_CHUNK_FREE &&
        holds_aligned(&s.best.chunk, rounded, mg)) {
        align = mg;
    } else if (s.best.found && align && s.best.chunk.kind == BFC_CHUNK_FREE &&
        !holds_aligned(&s.best.chunk, rounded, align)) {
        fit_search wider = {.rounded = rounded + align - g, .lane = lane};
        bfc_pool_visit(R.f.pool, fit_visitor, &wider);
        if (wider.best.found && wider.best.chunk.kind == BFC_CHUNK_FREE)
            s.best = wider.best;
        else
            align = 0;
    }
    if (s.best.found && s.best.chunk.kind != BFC_CHUNK_FREE)
        align = 0;
    bfc_stats before = stats_of(&R.f);
    /* The plan's place for it, whether that place is wholly free now, and
     * the spare space's chunk for it. */
    const bool valid = size && size <= BFC_SIZE_LIMIT - g;
    const int k = valid ? plan_entry_for(rounded, false) : -1;
    place_search ps = {.offset = k >= 0 ? R.plan[k].offset : 0, .rounded = rounded};
    if (k >= 0)
        bfc_pool_visit(R.f.pool, place_visitor, &ps);
    spare_search ss = {.rounded = rounded};
    if (valid && R.nplan)
        bfc_pool_visit(R.f.pool, spare_visitor, &ss);

    /* Where the best fit puts the block and, over virtual memory, whether
     * mapping it there would pass the limit (seen before the call maps or
     * unmaps anything). Then, rather than have granules remapped, it goes
     * to memory already mapped when a free chunk holds it so. An unsplit
     * chunk's slack may need a granule more than the block, so a move the
     * block alone does not explain must still go where the search says. */
    const bfc_addr best_place = s.best.found ? best_fit_place(&s, rounded, align, whole) : 0;
    room_search rs = {0};
    if (R.f.opt.vmm && valid)
        rs = within_room(rounded, whole ? mg : natural_alignment(rounded), false);
    bool owed = false;
    mapped_search ms = {.rounded = rounded, .align = whole ? mg : natural_alignment(rounded)};
    if (R.f.opt.vmm && s.best.found && s.best.chunk.kind == BFC_CHUNK_FREE) {
        owed = unmapped_on_device(best_place, rounded) > eff_limit() - before.pool_bytes;
        bfc_pool_visit(R.f.pool, mapped_visitor, &ms);
    }
    /* Lazy lanes (bfc_pool_lane_set_lazy): their open epochs, what their
     * lanes hold (lanes_lazy_due counts every pending byte of such a lane)
     * and what the epochs themselves hold (no retirement can take that). */
    uint32_t lazy_ids[MAX_LANES];
    unsigned nlazy = 0;
    uint64_t held = 0, held_open = 0;
    for (int i = DEFERRED_FIRST; i < MAX_LANES; i++) {
        if (!m->lanes[i] || !m->lazy[i] || !m->open_epoch[i])
            continue;
        lazy_ids[nlazy++] = m->lanes[i];
        held += pending_bytes_of(m->lanes[i]);
        for (size_t k = 0; k < m->npend; k++)
            if (m->pend[k].lane == m->lanes[i] && m->pend[k].token == m->open_epoch[i])
                held_open += m->pend[k].hi - m->pend[k].lo;
    }
    /* Closed lanes that were lazy and whose epoch is still open (its seal
     * was refused at the close) count as lazy lanes too. */
    uint32_t closed_lazy_ids[MAX_TRIED];
    unsigned nclosed_lazy = 0;
    for (uint32_t id = 1; id <= max_lane_id && R.closed_open_epochs; id++) {
        if (!closed_open_epoch[id] || !closed_lazy[id] || nclosed_lazy == MAX_TRIED)
            continue;
        closed_lazy_ids[nclosed_lazy++] = id;
        held += pending_bytes_of(id);
        for (size_t k = 0; k < m->npend; k++)
            if (m->pend[k].lane == id && m->pend[k].token == closed_open_epoch[id])
                held_open += m->pend[k].hi - m->pend[k].lo;
    }
    const uint64_t room = before.pool_bytes - before.bytes_in_use - before.pending_bytes;
    const bool lazy_due = held * 32 > before.bytes_in_use &&
                          (!R.f.opt.preallocate || room < held * 4);
    /* Over virtual memory: would the best fit need more mapped? (Asked
     * before the call maps anything.) */
    const bool best_mapped =
        !R.f.opt.vmm || (s.best.found && mapped_on_device(s.best.chunk.addr, s.best.chunk.size));
    R.ntried = 0;
    R.done_seen = false;
    bfc_addr a = 0xdead00;
    bfc_status st = bfc_pool_alloc(R.f.pool, size, lane, &a);
    bfc_stats after_call = stats_of(&R.f);
    if (after_call.num_growth_moves != before.num_growth_moves) {
        R.growth_moves++;
        R.growth_moves_pending += before.pending_bytes != 0;
    }
    /* A lazy epoch is sealed only when the pool needs its memory (bfc.h):
     * nothing served the block where it stood, the pool grew or would map
     * more, the plan's place was taken, or the lazy lanes held their share
     * (1/32 of the bytes in use; in a preallocated pool, with under four
     * times that free beside them); never at the fence interval. A growing
     * pool whose lazy epochs alone hold the share seals every one of them. */
    bool lazy_tried = false, after_done = false;
    for (unsigned i = 0; i < nlazy; i++) {
        lazy_tried |= seal_tried(lazy_ids[i]);
        after_done |= seal_tried_after_done(lazy_ids[i]);
    }
    for (unsigned i = 0; i < nclosed_lazy; i++) {
        lazy_tried |= seal_tried(closed_lazy_ids[i]);
        after_done |= seal_tried_after_done(closed_lazy_ids[i]);
    }
    if (lazy_tried) {
        R.lazy_seals++;
        /* Over virtual memory, a retirement at the allocation's start (the
         * fence interval's poll) may free and unmap memory beside the best
         * fit, so the block lands on granules to map: a lazy seal tried
         * after such a retirement is not the model's to judge. */
        const bool needed =
            lazy_due || st != BFC_OK || !s.best.found || (valid && R.nplan && before.num_regions == 1) ||
            after_call.num_region_allocs != before.num_region_allocs ||
            !best_mapped || (R.f.opt.vmm && after_done);
        if (!needed)
            FAIL_AT("alloc %" PRIu64 " sealed a lazy epoch (%" PRIu64 " held, %" PRIu64
                    " in use) though its memory was not needed",
                    rounded, held, before.bytes_in_use);
    }
    if (valid && (st == BFC_OK || st == BFC_ERR_OOM) && !R.f.opt.preallocate &&
        held_open * 32 > before.bytes_in_use)
        for (unsigned i = 0; i < nlazy; i++)
            if (!seal_tried(lazy_ids[i]))
                FAIL_AT("alloc %" PRIu64 " left lazy lane %u's epoch unsealed with %" PRIu64
                        " of %" PRIu64 " bytes in use held", rounded, lazy_ids[i], held_open,
                        before.bytes_in_use);
    if (valid && (st == BFC_OK || st == BFC_ERR_OOM) && !R.f.opt.preallocate &&
        held_open * 32 > before.bytes_in_use)
        for (unsigned i = 0; i < nclosed_lazy; i++)
            if (!seal_tried(closed_lazy_ids[i]))
                FAIL_AT("alloc %" PRIu64 " left closed lazy lane %u's epoch unsealed with %" PRIu64
                        " of %" PRIu64 " bytes in use held", rounded, closed_lazy_ids[i],
                        held_open, before.bytes_in_use);
    const bool consults = (valid && R.nplan && before.num_regions == 1) && st != BFC_ERR_BAD_LANE;
    const bool consulted = consults && k >= 0;
    const bool planned = after_call.num_planned != before.num_planned;
    const bool spared = after_call.num_plan_spare != before.num_plan_spare;
    if (consults) {
        if (plan_entry_for(rounded, true) != k)
            FAIL_AT("the model's plan entry changed while peeking");
        plan_record(planned);
    }
    if (consulted)
        *(planned ? &R.planned : &R.plan_misses) += 1;
    R.plan_spare += spared;
    if (after_call.plan_abandoned != R.plan_abandoned)
        FAIL_AT("the pool says the plan is %sabandoned, the model %s",
                after_call.plan_abandoned ? "" : "not ", R.plan_abandoned ? "does" : "does not");
    /* A place free before stays free (retiring only frees more), though
     * over virtual memory it may not be mappable (a miss); one that was not
     * free may have been freed by a retirement at the allocation's start. */
    const bool retired_early = after_call.num_retired != before.num_retired;
    const bool refit = after_call.num_mapped_refits != before.num_mapped_refits;
    /* The spare space: not over virtual memory, except while a preallocated
     * pool is laid out as one region; its region is the limit, so only a
     * device that refuses memory can keep the block from being mapped
     * there (then the rule places it). */
    const bool spare_allowed = !R.f.opt.vmm || !R.vmm_rules;
    /* Over vmm, spare space a release threshold unmapped is left to the
     * rule while pending frees could hold the block (the rule waits for
     * them before it maps): then the spare is not certain. Pending bytes
     * only fall during the call, so `before` decides conservatively. */
    const bool spare_certain =
        spare_allowed && !(R.f.opt.vmm && (R.f.dev.capacity < R.f.opt.limit_bytes || R.loans_ever ||
                                           R.f.dev.refuse_above ||
                                           before.pending_bytes >= rounded));
    const bool could_spare = consults && !planned && spare_allowed && plan_active() && ss.found;
    const bool want_spare = could_spare && spare_certain;
    if (planned && !consulted)
        FAIL_AT("alloc %" PRIu64 " was placed by a plan that had no place for it", rounded);
    else if (planned && a != ps.base + ps.offset)
        FAIL_AT("planned alloc %" PRIu64 " got %#llx, the plan says %#llx", rounded,
                (unsigned long long)a, (unsigned long long)(ps.base + ps.offset));
    else if (consulted && ps.free && !planned &&
             !(R.f.opt.vmm && after_call.num_plan_misses != before.num_plan_misses))
        FAIL_AT("alloc %" PRIu64 " ignored its planned place %#llx, which was free", rounded,
                (unsigned long long)(ps.base + ps.offset));
    else if (planned && !ps.free && !retired_early)
        FAIL_AT("alloc %" PRIu64 " took planned place %#llx, which was not free", rounded,
                (unsigned long long)(ps.base + ps.offset));
    else if (spared && (planned || !consults || !spare_allowed))
        FAIL_AT("alloc %" PRIu64 " went to the spare space without straying from a plan",
                rounded);
    else if (!retired_early && (spared ? !could_spare : want_spare))
        FAIL_AT("alloc %" PRIu64 " %s the spare space above the plan's extent %#llx", rounded,
                spared ? "took" : "did not take", (unsigned long long)ss.lo);
    else if (!retired_early && spared && a != ss.best.addr + ss.best.size - rounded)
        FAIL_AT("spare alloc %" PRIu64 " got %#llx, the top of chunk %#llx+%" PRIu64
                " is %#llx", rounded, (unsigned long long)a, (unsigned long long)ss.best.addr,
                ss.best.size, (unsigned long long)(ss.best.addr + ss.best.size - rounded));
    if (size == 0) {
        if (st != BFC_OK || a != 0)
            FAIL_AT("alloc(0) gave %s, %#llx", bfc_status_name(st), (unsigned long long)a);
        return;
    }
    if (st == BFC_ERR_OOM) {
        R.ooms++;
        bfc_stats after = stats_of(&R.f);
        if (R.f.opt.vmm) {
            /* A fit in address space proves nothing: memory must be
             * mapped. Free space was given back first, so what stays mapped
             * is pinned by live and pending blocks, and the block could not
             * be mapped: it needs at most its chunk (the request plus what
             * the split rule leaves as slack) plus two partial granules. */
            const bfc_options *o = &R.f.opt;
            bool device_refuses = R.f.dev.capacity < o->limit_bytes || R.f.dev.refuse_above;
            uint64_t slack = o->tsl_split ? rounded : o->min_split_bytes;
            if (!device_refuses &&
                eff_limit() - after.pool_bytes >= rounded + slack + 2 * o->map_granularity)
                FAIL_AT("OOM for %" PRIu64 " bytes with %" PRIu64 " of the limit unmapped",
                        rounded, eff_limit() - after.pool_bytes);
            /* Only granules blocks pin cause an OOM: none while a free
             * chunk holds the block at an end, what the carve there takes
             * (an unsplit remainder with it) within the limit's room (a
             * plan's place never moves). */
            if (!device_refuses && rs.found && after.num_retired == before.num_retired &&
                !(R.nplan && before.num_regions == 1))
                FAIL_AT("OOM for %" PRIu64 " bytes though free chunk of %" PRIu64 " holds it at %#llx"
                        " within the limit (%" PRIu64 " pinned)", rounded, rs.size,
                        (unsigned long long)rs.at, rs.pinned);
        } else if (s.best.found && after.num_retired == before.num_retired) {
            FAIL_AT("OOM for %" PRIu64 " bytes though chunk %#llx of %" PRIu64 " fits",
                    rounded, (unsigned long long)s.best.chunk.addr, s.best.chunk.size);
        }
        if (a != 0xdead00)
            FAIL_AT("failed alloc wrote its out-pointer");
        if (after.num_ooms != before.num_ooms + 1)
            FAIL_AT("num_ooms did not count the failure");
        if (!R.f.opt.vmm && after.largest_free_block_bytes >= rounded)
            FAIL_AT("OOM while a free block of %" PRIu64 " >= %" PRIu64 " exists",
                    after.largest_free_block_bytes, rounded);
        pending_resync();
        return;
    }
    if (st != BFC_OK) {
        FAIL_AT("alloc(%" PRIu64 ") gave %s", size, bfc_status_name(st));
        return;
    }
    R.allocs++;
    if (R.f.opt.vmm) {
        uint64_t mg = R.f.opt.map_granularity;
        bfc_addr lo = a / mg * mg, hi = (a + rounded + mg - 1) / mg * mg;
        if (!sim_device_mapped(&R.f.dev, lo, hi - lo))
            FAIL_AT("allocation %#llx of %" PRIu64 " is not wholly mapped on the device",
                    (unsigned long long)a, rounded);
        /* Mapping more is the last resort: with every epoch sealed, the
         * pool waited for pending frees while they could hold the block. */
        bool all_sealed = R.with_fences && !R.closed_open_epochs;
        for (int i = 0; i < MAX_LANES; i++)
            all_sealed = all_sealed && !m->open_epoch[i];
        bfc_stats now = stats_of(&R.f);
        if (all_sealed && !planned && now.pool_bytes > before.pool_bytes &&
            now.pending_bytes >= rounded)
            FAIL_AT("mapped %" PRIu64 " more bytes for %" PRIu64 " with %" PRIu64
                    " bytes still pending",
                    now.pool_bytes - before.pool_bytes, rounded, now.pending_bytes);
    }
    if (a % g != 0 || !bfc_pool_owns(R.f.pool, a) ||
        !bfc_pool_owns(R.f.pool, a + rounded - 1))
        FAIL_AT("allocation %#llx of %" PRIu64 " is misaligned or outside the pool",
                (unsigned long long)a, rounded);
    /* Best fit: when a fit existed before, the block must come from it,
     * unless the allocation first retired blocks whose fences completed. */
    bool retired = stats_of(&R.f).num_retired != before.num_retired;
    if (s.best.found && !retired && !planned && !spared) {
        bfc_addr expect = best_place;
        /* A move to mapped memory (owed, ms: above) goes where the search
         * says, and only where it found a place. */
        const bool limit_moved = after_call.num_limit_moves != before.num_limit_moves;
        if (limit_moved) {
            /* The last resort: where the model's search says. */
            if (!rs.found)
                FAIL_AT("alloc %" PRIu64 " moved within the limit where the model finds no room",
                        rounded);
            expect = rs.at;
        } else if (R.f.opt.vmm && after_call.num_plan_misses != before.num_plan_misses &&
                   after_call.num_unmap_calls != before.num_unmap_calls) {
            /* The plan's place could not be mapped even under pressure,
             * which gave back free granules first (design.md: pressure
             * unmaps before it fails): the mapped fit the model saw may be
             * gone. The block goes where the rule puts it, or to mapped
             * memory the model no longer knows. */
            if (refit)
                expect = a;
        } else if (R.f.opt.vmm && s.best.chunk.kind == BFC_CHUNK_FREE) {
            if (refit ? !ms.found : owed && ms.found)
                FAIL_AT("alloc %" PRIu64 " %s to mapped memory (%s a mapped fit)", rounded,
                        refit ? "moved" : "did not move", ms.found ? "with" : "without");
            if (refit && ms.found)
                expect = ms.at;
        } else if (refit) {
            FAIL_AT("alloc %" PRIu64 " moved to mapped memory from a pending chunk", rounded);
        }
        if (a != expect)
            FAIL_AT("alloc %" PRIu64 " got %#llx, best fit says %#llx (chunk %#llx+%" PRIu64
                    ")", rounded, (unsigned long long)a, (unsigned long long)expect,
                    (unsigned long long)s.best.chunk.addr, s.best.chunk.size);
    }
    for (size_t i = 0; i < m->nlive; i++)
        if (overlaps(a, rounded, m->live[i].addr, m->live[i].rounded))
            FAIL_AT("allocation %#llx overlaps live block %#llx", (unsigned long long)a,
                    (unsigned long long)m->live[i].addr);
    /* Before the pool's retirements are folded in: the block may reuse only
     * what is pending on its own lane. */
    for (size_t i = 0; i < m->npend; i++) {
        const pending_range *p = &m->pend[i];
        if (overlaps(a, rounded, p->lo, p->hi - p->lo) && p->lane != lane &&
            !retired)
            FAIL_AT("allocation %#llx on lane %u reuses a block pending on lane %u",
                    (unsigned long long)a, lane, p->lane);
    }
    /* What the block really covers (an unsplit chunk is larger than the
     * request) is no longer pending on its lane; then fold in retirements. */
    if (lane != BFC_NO_LANE)
        pending_subtract(lane, a, a + chunk_extent(a));
    pending_resync();
    for (size_t i = 0; i < m->npend; i++) {
        const pending_range *p = &m->pend[i];
        if (overlaps(a, rounded, p->lo, p->hi - p->lo))
            FAIL_AT("allocation %#llx on lane %u overlaps a block still pending on lane %u",
                    (unsigned long long)a, lane, p->lane);
    }
    m->live[m->nlive++] = (live_block){a, size, rounded};
    m->requested += size;
}

static void remember_freed(bfc_addr a)
{
    model *m = &R.m;
    m->freed[m->nfreed++ % 64] = a;
}

static void op_free(bool fenced)
{
    model *m = &R.m;
    if (!m->nlive)
        return;
    size_t i = rng_below(&R.rng, m->nlive);
    live_block b = m->live[i];
    bfc_status st;
    uint32_t lane = BFC_NO_LANE;
    uint64_t token = 0;
    if (fenced) {
        int k = (int)rng_below(&R.rng, MAX_LANES);
        lane = R.m.lanes[k];
        if (!lane)
            return;
        if (k >= DEFERRED_FIRST && !R.with_fences) {
            /* Deferred frees need a fence callback to ever retire (the shim
             * always has one); without, free plainly. */
            fenced = false;
            lane = BFC_NO_LANE;
            st = bfc_pool_free(R.f.pool, b.addr);
        } else if (k >= DEFERRED_FIRST) {
            token = m->open_epoch[k] ? m->open_epoch[k] : m->epoch_counter + 1;
            st = bfc_pool_free_deferred(R.f.pool, b.addr, lane);
            if (st == BFC_OK && !m->open_epoch[k])
                m->open_epoch[k] = ++m->epoch_counter;
        } else {
            token = ++m->next_token;
            st = bfc_pool_free_fenced(R.f.pool, b.addr, lane, token);
        }
    } else {
        st = bfc_pool_free(R.f.pool, b.addr);
    }
    if (st != BFC_OK) {
        FAIL_AT("free of live %#llx gave %s", (unsigned long long)b.addr,
                bfc_status_name(st));
        return;
    }
    R.frees++;
    m->live[i] = m->live[--m->nlive];
    m->requested -= b.size;
    if (fenced && m->npend < MAX_PENDING)
        m->pend[m->npend++] = (pending_range){b.addr, b.addr + b.rounded, lane, token};
    remember_freed(b.addr);
}

static void op_bad_free(void)
{
    model *m = &R.m;
    bfc_addr a = 0;
    bfc_status want_owned = BFC_ERR_NOT_ALLOCATED;
    switch (rng_below(&R.rng, 3)) {
    case 0: /* interior of a live block */
        if (!m->nlive)
            return;
        {
            live_block b = m->live[rng_below(&R.rng, m->nlive)];
            a = b.addr + 1 + rng_below(&R.rng, b.rounded - 1);
        }
        break;
    case 1: /* something freed earlier (may be live again: then skip) */
        if (!m->nfreed)
            return;
        a = m->freed[rng_below(&R.rng, m->nfreed < 64 ? m->nfreed : 64)];
        for (size_t i = 0; i < m->nlive; i++)
            if (m->live[i].addr == a)
                return;
        break;
    default: /* foreign */
        a = 0x1000 + rng_below(&R.rng, 1u << 20) * 256;
        want_owned = BFC_ERR_NOT_OWNED;
    }
    bfc_stats before = stats_of(&R.f);
    int kind = (int)rng_below(&R.rng, 3);
    bfc_status st = kind == 1 && m->lanes[0]
                        ? bfc_pool_free_fenced(R.f.pool, a, m->lanes[0], m->next_token)
                    : kind == 2 && m->lanes[DEFERRED_FIRST]
                        ? bfc_pool_free_deferred(R.f.pool, a, m->lanes[DEFERRED_FIRST])
                        : bfc_pool_free(R.f.pool, a);
    bool owned = bfc_pool_owns(R.f.pool, a);
    bfc_status expect = owned ? BFC_ERR_NOT_ALLOCATED : BFC_ERR_NOT_OWNED;
    (void)want_owned;
    if (st != expect)
        FAIL_AT("bad free of %#llx gave %s, expected %s", (unsigned long long)a,
                bfc_status_name(st), bfc_status_name(expect));
    bfc_stats after = stats_of(&R.f);
    if (memcmp(&before, &after, sizeof before) != 0)
        FAIL_AT("a refused free changed the statistics");
    R.bad_frees++;
}

static void op_lanes(void)
{
    model *m = &R.m;
    int i = (int)rng_below(&R.rng, MAX_LANES);
    if (m->lanes[i]) {
        const uint32_t id = m->lanes[i];
        const uint64_t epoch = m->open_epoch[i];
        /* Plain close (classic), or close_into / retire_into a deferred
         * lane's slot (only deferred lanes take epochs: their tokens come
         * from the pool's counter): open or not, reusable or not, or this
         * very lane. */
        const unsigned mode = R.classic ? 0 : (unsigned)rng_below(&R.xrng, 3);
        const int t = DEFERRED_FIRST + (int)rng_below(&R.xrng, MAX_LANES - DEFERRED_FIRST);
        const uint32_t into = m->lanes[t];
        const bool takes = into && t != i && !m->lane_reusable[t];
        const uint64_t into_before = pending_bytes_of(into);
        const uint64_t epoch_bytes = epoch ? pending_bytes_with(id, epoch) : 0;
        R.ntried = 0;
        if (mode == 0)
            bfc_pool_lane_close(R.f.pool, id); /* seals an open epoch */
        else if (mode == 1)
            bfc_pool_lane_close_into(R.f.pool, id, into);
        else
            bfc_pool_lane_retire_into(R.f.pool, id, into);
        if (epoch && mode != 2 && !seal_tried(id))
            FAIL_AT("closing lane %u did not try to seal its open epoch", id);
        if (mode == 2 && seal_tried(id))
            FAIL_AT("retire_into sealed lane %u, whose stream is gone", id);
        /* Refused (close_into) or never tried (retire_into): the epoch goes
         * to a target that takes it, with that lane's open token (or the
         * next of the counter); else it stays, for a later seal. */
        const bool moved = m->open_epoch[i] && mode != 0 && takes;
        const uint64_t want_into = into_before + (moved ? epoch_bytes : 0);
        if (into && pending_bytes_of(into) != want_into)
            FAIL_AT("closing lane %u %s lane %u (%s): %" PRIu64 " bytes pending there, "
                    "expected %" PRIu64, id, mode == 1 ? "into" : mode == 2 ? "retired into" : "beside",
                    into, m->lane_reusable[t] ? "reusable" : "not reusable",
                    pending_bytes_of(into), want_into);
        if (moved) {
            const uint64_t token = m->open_epoch[t] ? m->open_epoch[t] : ++m->epoch_counter;
            m->open_epoch[t] = token;
            for (size_t k = 0; k < m->npend; k++)
                if (m->pend[k].lane == id && m->pend[k].token == epoch) {
                    m->pend[k].lane = into;
                    m->pend[k].token = token;
                }
            m->open_epoch[i] = 0;
            R.moved_epochs++;
        }
        if (m->open_epoch[i]) { /* the seal was refused: a later one seals it */
            closed_open_epoch[id] = m->open_epoch[i];
            closed_lazy[id] = m->lazy[i];
            R.closed_open_epochs++;
        }
        m->lanes[i] = 0; /* its pending ranges stay until retired */
        m->open_epoch[i] = 0;
        m->lazy[i] = false;
    } else {
        bool reusable = rng_below(&R.rng, 3) != 0;
        uint32_t id = 0;
        if (bfc_pool_lane_open(R.f.pool, reusable, &id) != BFC_OK) {
            FAIL_AT("lane_open failed");
            return;
        }
        /* A recycled id must not still hold pending ranges of a closed lane. */
        for (size_t k = 0; k < m->npend; k++)
            if (m->pend[k].lane == id)
                FAIL_AT("lane %u reopened while it still holds pending blocks", id);
        m->lanes[i] = id;
        m->lane_reusable[i] = reusable;
        m->open_epoch[i] = 0;
        m->lazy[i] = false; /* lanes start eager, a recycled slot too */
        if (growing_lazy) {
            m->lazy[i] = true;
            bfc_pool_lane_set_lazy(R.f.pool, id, true);
        }
        closed_lazy[id] = false;
        if (id > max_lane_id)
            max_lane_id = id;
        deferred_ids[id] = i >= DEFERRED_FIRST;
    }
}

/* Pending bytes the pool holds on lane `id` (0: none). */
typedef struct lane_bytes {
    uint32_t lane;
    uint64_t token; /* 0: any */
    uint64_t bytes;
} lane_bytes;

static void lane_bytes_visitor(void *arg, const bfc_chunk_info *c)
{
    lane_bytes *lb = arg;
    if (c->kind == BFC_CHUNK_PENDING && c->lane == lb->lane && (!lb->token || c->seq == lb->token))
        lb->bytes += c->size;
}

/* The pool's chunks, not the model's ranges: a block's chunk may be larger
 * than its rounded size (an unsplit remainder), and the ranges record the
 * rounded size only (enough for overlaps). */
static uint64_t pending_bytes_with(uint32_t id, uint64_t token)
{
    lane_bytes lb = {id, token, 0};
    if (id)
        bfc_pool_visit(R.f.pool, lane_bytes_visitor, &lb);
    return lb.bytes;
}

static uint64_t pending_bytes_of(uint32_t id)
{
    return pending_bytes_with(id, 0);
}

/* Makes a deferred lane lazy or eager again (or names a closed slot, which
 * changes nothing), or seals one explicitly: a seal must be tried then. */
static void op_lazy(void)
{
    model *m = &R.m;
    const int i = DEFERRED_FIRST + (int)rng_below(&R.xrng, MAX_LANES - DEFERRED_FIRST);
    if (!m->lanes[i])
        return;
    if (rng_below(&R.xrng, 4) == 0) {
        R.ntried = 0;
        const bool had = m->open_epoch[i];
        const bool sealed = bfc_pool_seal_lane(R.f.pool, m->lanes[i]);
        if (had && !seal_tried(m->lanes[i]))
            FAIL_AT("an explicit seal of lane %u was not tried", m->lanes[i]);
        if (sealed != !m->open_epoch[i])
            FAIL_AT("seal_lane said %d, the epoch is %s", sealed,
                    m->open_epoch[i] ? "open" : "sealed");
        return;
    }
    m->lazy[i] = !m->lazy[i];
    bfc_pool_lane_set_lazy(R.f.pool, m->lanes[i], m->lazy[i]);
}

/* Lends part of the limit (bfc_pool_lend: up to all that is left, or past
 * it) or ends a loan (now and then more than is lent: clipped). */
static void op_loan(void)
{
    model *m = &R.m;
    if (m->nloans && rng_below(&R.xrng, 2)) {
        if (rng_below(&R.xrng, 8) == 0) { /* every loan, and more */
            bfc_pool_end_loan(R.f.pool, m->lent + 1 + rng_below(&R.xrng, R.f.opt.limit_bytes));
            m->nloans = 0;
            m->lent = 0;
        } else {
            const size_t i = rng_below(&R.xrng, m->nloans);
            bfc_pool_end_loan(R.f.pool, m->loans[i]);
            m->lent -= m->loans[i];
            m->loans[i] = m->loans[--m->nloans];
        }
        return;
    }
    if (m->nloans == MAX_LOANS)
        return;
    const uint64_t left = eff_limit();
    uint64_t bytes;
    switch (rng_below(&R.xrng, 5)) {
    case 0: bytes = left; break;                                        /* all of it */
    case 1: bytes = left + 1 + rng_below(&R.xrng, R.f.opt.limit_bytes); break; /* past it */
    case 2: bytes = rng_below(&R.xrng, left + 1); break;
    default: bytes = rng_below(&R.xrng, left / 8 + 1); break;
    }
    const bfc_stats before = stats_of(&R.f);
    R.ntried = 0;
    const bfc_status st = bfc_pool_lend(R.f.pool, bytes);
    const bfc_stats after = stats_of(&R.f);
    if (bytes > left) {
        /* More than the limit has left: refused, and nothing touched. */
        if (st != BFC_ERR_OOM)
            FAIL_AT("lend of %" PRIu64 " with %" PRIu64 " left gave %s", bytes, left,
                    bfc_status_name(st));
        if (memcmp(&before, &after, sizeof before) != 0)
            FAIL_AT("a loan past the limit changed the statistics");
    } else if (st == BFC_OK) {
        if (after.pool_bytes > left - bytes)
            FAIL_AT("lent %" PRIu64 " of %" PRIu64 " left, the pool still holds %" PRIu64,
                    bytes, left, after.pool_bytes);
        m->loans[m->nloans++] = bytes;
        m->lent += bytes;
        R.loans_ever = true;
        R.loans++;
    } else if (st == BFC_ERR_OOM) {
        /* Refused only when even after giving back what it could the pool
         * holds more than the loan leaves it. */
        if (after.pool_bytes <= left - bytes)
            FAIL_AT("lend of %" PRIu64 " refused though the pool holds %" PRIu64 " of %" PRIu64
                    " left", bytes, after.pool_bytes, left);
        R.loan_ooms++;
        R.loans_ever = true; /* it may have given memory back */
    } else {
        FAIL_AT("lend of %" PRIu64 " gave %s", bytes, bfc_status_name(st));
    }
    pending_resync(); /* it retires, and may wait */
}

/* The queries a report or an error message makes, against the model:
 * bfc_pool_lookup / bfc_pool_block at a live block's base, inside its
 * request and past it (its rounded slack), and at freed addresses;
 * bfc_pool_largest_live against every allocated chunk; bfc_pool_free_space
 * against bfc_stats (without vmm they are the same figures; over vmm the
 * free chunks split into free_bytes and beyond_limit_bytes). Then, now and
 * then, an allocation of the largest free block it reported: bfc.h says one
 * free chunk holds it with the memory the limit lets the pool use, so only
 * a device that refuses memory may fail it. */
typedef struct alloc_sizes {
    uint64_t sizes[MAX_LIVE + 1];
    size_t n;
} alloc_sizes;

static void alloc_sizes_visitor(void *arg, const bfc_chunk_info *c)
{
    alloc_sizes *as = arg;
    if (c->kind == BFC_CHUNK_ALLOCATED && as->n <= MAX_LIVE)
        as->sizes[as->n++] = c->size;
}

static void op_query(void)
{
    model *m = &R.m;
    R.queries++;
    if (m->nlive) {
        const live_block b = m->live[rng_below(&R.qrng, m->nlive)];
        const uint64_t extent = chunk_extent(b.addr);
        bfc_live_info li;
        bfc_addr base = 0;
        uint64_t size = 0;
        bfc_status st = bfc_pool_block(R.f.pool, b.addr, &li);
        if (st != BFC_OK || li.addr != b.addr || li.requested != b.size || li.size != extent)
            FAIL_AT("block(%#llx) gave %s, %#llx, %" PRIu64 " of %" PRIu64 "; model %" PRIu64
                    " of %" PRIu64, (unsigned long long)b.addr, bfc_status_name(st),
                    (unsigned long long)li.addr, li.requested, li.size, b.size, extent);
        const uint64_t in = rng_below(&R.qrng, b.size);
        st = bfc_pool_lookup(R.f.pool, b.addr + in, &base, &size);
        if (st != BFC_OK || base != b.addr || size != b.size)
            FAIL_AT("lookup(%#llx + %" PRIu64 ") gave %s, %#llx, %" PRIu64,
                    (unsigned long long)b.addr, in, bfc_status_name(st),
                    (unsigned long long)base, size);
        if (extent > b.size) {
            const uint64_t past = b.size + rng_below(&R.qrng, extent - b.size);
            st = bfc_pool_lookup(R.f.pool, b.addr + past, &base, &size);
            if (st != BFC_ERR_NOT_ALLOCATED)
                FAIL_AT("lookup(%#llx + %" PRIu64 "), past the request of %" PRIu64
                        " in a chunk of %" PRIu64 ", gave %s", (unsigned long long)b.addr,
                        past, b.size, extent, bfc_status_name(st));
        }
    }
    if (m->nfreed) {
        const bfc_addr a = m->freed[rng_below(&R.qrng, m->nfreed < 64 ? m->nfreed : 64)];
        bool live = false;
        for (size_t i = 0; i < m->nlive; i++)
            live |= m->live[i].addr <= a && a < m->live[i].addr + m->live[i].size;
        const bfc_status st = bfc_pool_lookup(R.f.pool, a, NULL, NULL);
        const bfc_status want =
            live ? BFC_OK : bfc_pool_owns(R.f.pool, a) ? BFC_ERR_NOT_ALLOCATED : BFC_ERR_NOT_OWNED;
        if (st != want)
            FAIL_AT("lookup of freed %#llx gave %s, expected %s", (unsigned long long)a,
                    bfc_status_name(st), bfc_status_name(want));
    }
    /* The largest live blocks: the n largest chunks, largest first. */
    {
        static alloc_sizes as;
        as.n = 0;
        bfc_pool_visit(R.f.pool, alloc_sizes_visitor, &as);
        bfc_live_info top[8];
        const size_t want = 1 + rng_below(&R.qrng, 8);
        const size_t got = bfc_pool_largest_live(R.f.pool, top, want);
        if (got != (as.n < want ? as.n : want))
            FAIL_AT("largest_live(%zu) gave %zu of %zu live", want, got, as.n);
        for (size_t i = 0; i < got && i < 8; i++) {
            if (i && top[i].size > top[i - 1].size)
                FAIL_AT("largest_live: %" PRIu64 " after %" PRIu64, top[i].size,
                        top[i - 1].size);
            bool found = false;
            for (size_t k = 0; k < m->nlive; k++)
                found |= m->live[k].addr == top[i].addr && m->live[k].size == top[i].requested;
            if (!found || chunk_extent(top[i].addr) != top[i].size)
                FAIL_AT("largest_live gave %#llx (%" PRIu64 " of %" PRIu64
                        "), no such live block", (unsigned long long)top[i].addr,
                        top[i].requested, top[i].size);
        }
        if (got) {
            size_t above = 0; /* chunks larger than the smallest reported */
            for (size_t k = 0; k < as.n; k++)
                above += as.sizes[k] > top[got - 1].size;
            if (above > got)
                FAIL_AT("largest_live(%zu) left out a chunk larger than %" PRIu64, want,
                        top[got - 1].size);
        }
    }
    bfc_free_space fs;
    bfc_pool_free_space(R.f.pool, &fs);
    const bfc_stats st = stats_of(&R.f);
    if (!R.f.opt.vmm ? fs.free_bytes != st.free_bytes ||
                           fs.largest_free_block_bytes != st.largest_free_block_bytes ||
                           fs.beyond_limit_bytes != 0
                     : fs.free_bytes + fs.beyond_limit_bytes != st.free_bytes ||
                           fs.largest_free_block_bytes > fs.free_bytes ||
                           fs.largest_free_block_bytes > st.largest_free_block_bytes)
        FAIL_AT("free_space says %" PRIu64 " free (largest %" PRIu64 ", %" PRIu64
                " beyond the limit), stats %" PRIu64 " (largest %" PRIu64 ")",
                fs.free_bytes, fs.largest_free_block_bytes, fs.beyond_limit_bytes,
                st.free_bytes, st.largest_free_block_bytes);
    /* Over vmm the largest free block is the largest the last resort finds
     * room for (place_within_room, restated as within_room). */
    if (R.f.opt.vmm && fs.largest_free_block_bytes &&
        (!within_room(fs.largest_free_block_bytes, 0, true).found ||
         within_room(fs.largest_free_block_bytes + R.f.opt.granularity, 0, true).found))
        FAIL_AT("free_space says the largest free block is %" PRIu64
                ", the model's search for room disagrees", fs.largest_free_block_bytes);
    const bool device_refuses = R.f.dev.capacity < R.f.opt.limit_bytes || R.f.dev.refuse_above;
    if (fs.largest_free_block_bytes && !device_refuses && m->nlive < MAX_LIVE &&
        rng_below(&R.qrng, 2)) {
        R.forced_size = fs.largest_free_block_bytes;
        R.largest_allocs++;
        op_alloc();
        R.forced_size = 0;
    }
}

/* A plan installed, replaced or removed while blocks are live (the shim
 * installs one whenever a run's plan file appears): each call restarts the
 * cursor; n = 0 removes it. */
static void op_replan(void)
{
    R.replans++;
    if (R.nplan && rng_below(&R.qrng, 3) == 0) {
        if (bfc_pool_set_plan(R.f.pool, NULL, 0) != BFC_OK)
            FAIL_AT("removing the plan was refused");
        R.nplan = 0;
        R.plan_pos = R.plan_stray = R.plan_extent = 0;
        R.plan_abandoned = false;
        return;
    }
    /* install_plan draws from the main stream: lend it this one's. */
    const uint64_t saved = R.rng;
    R.rng = R.qrng;
    install_plan();
    R.qrng = R.rng;
    R.rng = saved;
}

/* Retires tokens the simulated GPU has completed, in every lane the pool
 * knows, as the shim would from its event queries. */
static void op_progress(void)
{
    model *m = &R.m;
    if (m->next_token > R.fence_done_upto)
        R.fence_done_upto += rng_below(&R.rng, m->next_token - R.fence_done_upto + 1);
    if (m->epoch_counter > R.epoch_done_upto)
        R.epoch_done_upto += rng_below(&R.rng, m->epoch_counter - R.epoch_done_upto + 1);
    /* Closed lanes still drain: walk the model's pending ranges' lanes. */
    uint32_t seen[MAX_PENDING];
    size_t nseen = 0;
    for (size_t i = 0; i < m->npend; i++) {
        if (deferred_ids[m->pend[i].lane])
            continue; /* the pool polls deferred lanes itself */
        bool dup = false;
        for (size_t k = 0; k < nseen; k++)
            dup |= seen[k] == m->pend[i].lane;
        if (!dup)
            seen[nseen++] = m->pend[i].lane;
    }
    for (size_t k = 0; k < nseen; k++)
        bfc_pool_retire(R.f.pool, seen[k], R.fence_done_upto);
    R.retires++;
    pending_resync();
}

static void check_model(void)
{
    size_t v = bfc_pool_check(R.f.pool, stderr);
    if (v)
        FAIL_AT("invariant checker found %zu violation(s)", v);
    bfc_stats s = stats_of(&R.f);
    if (s.bytes_requested != R.m.requested || s.num_allocs - s.num_frees != R.m.nlive)
        FAIL_AT("stats say %" PRIu64 " bytes / %" PRIu64 " live, model %" PRIu64 " / %zu",
                s.bytes_requested, s.num_allocs - s.num_frees, R.m.requested, R.m.nlive);
    if (s.pool_bytes > eff_limit() || R.f.dev.held != s.pool_bytes)
        FAIL_AT("pool holds %" PRIu64 " (device says %" PRIu64 "), limit %" PRIu64
                " less %" PRIu64 " lent", s.pool_bytes, R.f.dev.held, R.f.opt.limit_bytes,
                R.m.lent);
    if (s.bytes_lent != R.m.lent || s.bytes_limit != R.f.opt.limit_bytes ||
        s.peak_bytes_lent < s.bytes_lent)
        FAIL_AT("stats say %" PRIu64 " of %" PRIu64 " lent (peak %" PRIu64 "), model %" PRIu64
                " of %" PRIu64, s.bytes_lent, s.bytes_limit, s.peak_bytes_lent, R.m.lent,
                R.f.opt.limit_bytes);
    if (R.f.dev.misuse)
        FAIL_AT("the device saw %" PRIu64 " bad map/unmap/unreserve call(s)", R.f.dev.misuse);
    if (R.f.dev.keeping || R.f.dev.kept)
        FAIL_AT("the device still keeps %" PRIu64 " unmapped bytes after the call", R.f.dev.kept);
}

static bool classic;
static bool no_queries; /* --no-queries: replays a seed as before op_query existed */

static void run_seed(uint64_t seed, uint64_t ops)
{
    memset(&R, 0, sizeof R);
    memset(deferred_ids, 0, sizeof deferred_ids);
    memset(closed_open_epoch, 0, sizeof closed_open_epoch);
    memset(closed_lazy, 0, sizeof closed_lazy);
    max_lane_id = 0;
    R.seed = seed;
    R.rng = seed * 0x2545F4914F6CDD1Dull + 1;
    R.xrng = seed * 0x9E3779B97F4A7C15ull + 7;
    R.qrng = seed * 0xD1B54A32D192ED03ull + 11;
    R.classic = classic;
    configure();
    for (R.step = 0; R.step < ops && !harness_failures; R.step++) {
        /* The extensions' operations, one step in 25, drawn from their own
         * stream before the step's own (which then runs as it always did). */
        if (!R.classic && rng_below(&R.xrng, 25) == 0) {
            if (rng_below(&R.xrng, 2))
                op_loan();
            else
                op_lazy();
            check_model();
        }
        /* Queries and mid-run plans, one step in 40, from the third stream. */
        if (!R.classic && !no_queries && rng_below(&R.qrng, 40) == 0) {
            if (rng_below(&R.qrng, 6))
                op_query();
            else
                op_replan();
            check_model();
        }
        uint64_t r = rng_below(&R.rng, 1000);
        bool crowded = R.m.nlive > MAX_LIVE * 3 / 4;
        if (r < (crowded ? 250u : 460u))
            op_alloc();
        else if (r < 760)
            op_free(false);
        else if (r < 860)
            op_free(true);
        else if (r < 930)
            op_progress();
        else if (r < 960)
            op_bad_free();
        else if (r < 980)
            op_lanes();
        else if (r < 999) {
            uint64_t open[MAX_LANES];
            for (int i = 0; i < MAX_LANES; i++)
                open[i] = R.m.open_epoch[i] ? R.m.lanes[i] : 0;
            R.ntried = 0;
            bfc_pool_trim(R.f.pool); /* seals epochs and retires what is done */
            /* Every open epoch, lazy or not, is offered a seal. */
            for (int i = 0; i < MAX_LANES; i++)
                if (open[i] && !seal_tried((uint32_t)open[i]))
                    FAIL_AT("trim did not try to seal lane %u's open epoch", (unsigned)open[i]);
            pending_resync();
            /* and restart some high-water marks (the checker holds them
             * between current and peak) */
            bfc_pool_reset_highs(R.f.pool, (unsigned)rng_below(&R.rng, 4));
        }
        else {
            /* Now and then free everything: back to one chunk per region;
             * a seed with a plan starts it again. */
            while (R.m.nlive)
                op_free(false);
            if (R.nplan)
                install_plan();
        }
        check_model();
    }
    bfc_pool_destroy(R.f.pool, true);
    if (R.f.dev.held != 0 || R.f.dev.nmaps != 0 || R.f.dev.misuse)
        FAIL_AT("device still holds %" PRIu64 " bytes in %zu mappings after destroy (%" PRIu64
                " bad calls)", R.f.dev.held, R.f.dev.nmaps, R.f.dev.misuse);
    sim_device_fini(&R.f.dev);
}

int main(int argc, char **argv)
{
    uint64_t first = 1, last = 8, ops = 20000;
    bool quiet = false;
    static const struct option longopts[] = {
        {"seed", required_argument, 0, 's'}, {"seeds", required_argument, 0, 'S'},
        {"ops", required_argument, 0, 'n'},  {"quiet", no_argument, 0, 'q'},
        {"classic", no_argument, 0, 'c'},   {"no-queries", no_argument, 0, 'Q'},
        {"growing-lazy", no_argument, 0, 'g'},
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
        case 'c': classic = true; break;
        case 'Q': no_queries = true; break;
        case 'g': growing_lazy = true; break;
        default: return 2;
        }
    }
    uint64_t total = 0, ooms = 0, bad = 0, planned = 0, plan_misses = 0, spare = 0, abandoned = 0;
    uint64_t loans = 0, loan_ooms = 0, lazy_seals = 0, moved = 0, gmoves = 0, gmoves_pending = 0;
    uint64_t queries = 0, largest_allocs = 0, replans = 0;
    for (uint64_t seed = first; seed <= last && !harness_failures; seed++) {
        run_seed(seed, ops);
        total += R.step;
        ooms += R.ooms;
        bad += R.bad_frees;
        planned += R.planned;
        plan_misses += R.plan_misses;
        spare += R.plan_spare;
        abandoned += R.plan_abandoned;
        loans += R.loans;
        loan_ooms += R.loan_ooms;
        lazy_seals += R.lazy_seals;
        moved += R.moved_epochs;
        gmoves += R.growth_moves;
        gmoves_pending += R.growth_moves_pending;
        queries += R.queries;
        largest_allocs += R.largest_allocs;
        replans += R.replans;
        if (!quiet)
            printf("seed %" PRIu64 ": %" PRIu64 " ops (%" PRIu64 " allocs, %" PRIu64
                   " frees, %" PRIu64 " OOMs, %" PRIu64 " bad frees) %s\n",
                   seed, R.step, R.allocs, R.frees, R.ooms, R.bad_frees,
                   harness_failures ? "FAILED" : "clean");
    }
    printf("property: %" PRIu64 " operations over seeds %" PRIu64 "-%" PRIu64
           ", %" PRIu64 " OOMs, %" PRIu64 " refused bad frees, %" PRIu64
           " planned placements (%" PRIu64 " places not free, %" PRIu64
           " strays placed above the plan, %" PRIu64 " plans abandoned), %s\n",
           total, first, last, ooms, bad, planned, plan_misses, spare, abandoned,
           harness_failures ? "FAILED" : "all clean");
    printf("property: %" PRIu64 " loans made, %" PRIu64 " refused, %" PRIu64
           " allocations that sealed a lazy epoch, %" PRIu64 " epochs moved by closing into a lane\n",
           loans, loan_ooms, lazy_seals, moved);
    printf("property: %" PRIu64 " allocations that moved granules to stay within a growing"
           " pool's headroom, %" PRIu64 " of them with blocks pending\n",
           gmoves, gmoves_pending);
    printf("property: %" PRIu64 " queries (%" PRIu64 " allocations of the largest free block),"
           " %" PRIu64 " plans installed or removed mid-run\n",
           queries, largest_allocs, replans);
    return harness_result();
}
