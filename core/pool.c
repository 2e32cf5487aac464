/*
 * pool.c - the pool's life cycle and its hot path: allocate, free, coalesce.
 *
 * The pool keeps the books; where a block goes is the placement policy's
 * (placement.h). Allocation: round the size up to the granularity; ask the
 * policy which chunk takes the block (place_fit: a free chunk, or one
 * pending in the caller's lane); if none does, go down the slow path
 * (retire completed fences; wait for fences when pending frees could hold
 * the request; grow; wait for the rest; garbage-collect empty regions, grow
 * again). Take the chunk whole when the remainder is not worth keeping,
 * else ask the policy where in it the block starts (place_in_free,
 * place_in_pending) and carve it there; the remainder, and the gap below an
 * aligned block, stay free. Over virtual memory, map what the block lacks,
 * after waiting for pending frees that could hold it, and under the limit
 * move it to mapped memory (place_on_mapped) before remapping. With a plan,
 * its place is tried first (place_by_plan, plan.c).
 *
 * Free: find the chunk by address, merge it with free neighbours at once, and
 * file the result in its bin. Everything that can fail (host memory for a new
 * record or a bigger address map) is reserved before anything changes, so a
 * failure leaves the pool exactly as it was.
 */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"
#include "placement.h"

const char *bfc_status_name(bfc_status s)
{
    switch (s) {
    case BFC_OK: return "ok";
    case BFC_ERR_OOM: return "out of memory";
    case BFC_ERR_TOO_LARGE: return "size too large";
    case BFC_ERR_NOT_OWNED: return "address not in this pool";
    case BFC_ERR_NOT_ALLOCATED: return "not the start of a live allocation";
    case BFC_ERR_BAD_LANE: return "lane not open";
    case BFC_ERR_BAD_TOKEN: return "fence token went backwards";
    case BFC_ERR_HOST_MEMORY: return "host memory exhausted";
    case BFC_ERR_INVALID: return "invalid argument";
    }
    return "unknown status";
}

void bfc_options_init(bfc_options *o)
{
    memset(o, 0, sizeof *o);
    o->preallocate = true;
    o->initial_region_bytes = UINT64_C(2) << 20;
    o->region_granularity = UINT64_C(2) << 20;
    o->granularity = BFC_MIN_GRANULARITY;
    o->min_split_bytes = BFC_MIN_GRANULARITY;
    o->tsl_split = false;
    o->garbage_collection = true;
    o->placement = BFC_PLACE_ALIGNED;
    o->align_bytes = BFC_DEFAULT_ALIGN_BYTES;
    o->map_granularity = UINT64_C(2) << 20;
    o->release_threshold = UINT64_MAX;
    o->growth_headroom = BFC_DEFAULT_GROWTH_HEADROOM;
    o->growth_headroom_step = BFC_DEFAULT_GROWTH_HEADROOM_STEP;
}

static bool is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

bfc_pool *bfc_pool_create(const bfc_options *opt, const bfc_backend *backend)
{
    if (!opt || !backend || !backend->region_alloc || !backend->region_free)
        return NULL;
    if (opt->limit_bytes == 0 || !is_pow2(opt->granularity) ||
        opt->granularity < BFC_MIN_GRANULARITY || opt->region_granularity == 0 ||
        opt->region_granularity % opt->granularity != 0 ||
        opt->granularity >= BFC_SIZE_LIMIT || opt->limit_bytes >= BFC_SIZE_LIMIT ||
        (opt->placement != BFC_PLACE_BY_AGE && opt->placement != BFC_PLACE_LOW &&
         opt->placement != BFC_PLACE_ALIGNED) ||
        (opt->placement == BFC_PLACE_ALIGNED && !is_pow2(opt->align_bytes)) ||
        (opt->vmm && (!backend->map || !backend->unmap || !is_pow2(opt->map_granularity) ||
                      opt->map_granularity < opt->granularity ||
                      opt->map_granularity >= BFC_SIZE_LIMIT ||
                      opt->va_bytes >= BFC_SIZE_LIMIT)) ||
        opt->growth_headroom > BFC_MAX_GROWTH_HEADROOM ||
        opt->growth_headroom_step > BFC_MAX_GROWTH_HEADROOM)
        return NULL;
    bfc_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->opt = *opt;
    if (p->opt.initial_region_bytes == 0)
        p->opt.initial_region_bytes = p->opt.region_granularity;
    p->backend = *backend;
    p->as_one_region = opt->vmm && opt->preallocate && !opt->prealloc_spread;
    place_set_rules(p);
    p->release_on_free = opt->vmm && opt->release_threshold != UINT64_MAX;
    p->next_region_bytes = p->opt.initial_region_bytes;
    p->st.bytes_limit = p->opt.limit_bytes;
    p->growth_headroom = opt->growth_headroom;
    bins_init(&p->free_bins);
    p->lanes_cap = 8;
    p->nlanes = 1;
    p->lanes = calloc(p->lanes_cap, sizeof *p->lanes);
    bfc_lock_init(&p->lock);
    if (!p->lanes || !chunk_store_init(&p->chunks) || !live_index_init(&p->live)) {
        free(p->lanes);
        chunk_store_fini(&p->chunks);
        live_index_fini(&p->live);
        free(p);
        return NULL;
    }
    return p;
}

void bfc_pool_destroy(bfc_pool *p, bool release_regions)
{
    if (!p)
        return;
    if (release_regions)
        region_release_all(p);
    for (uint32_t i = 0; i < p->nregions; i++)
        free(p->regions[i].backed);
    lanes_fini(p);
    plan_destroy(p->plan);
    free(p->regions);
    live_index_fini(&p->live);
    chunk_store_fini(&p->chunks);
    free(p);
}

void bfc_pool_lock(bfc_pool *p) { bfc_lock_acquire(&p->lock); }
bool bfc_pool_lock_within(bfc_pool *p, unsigned max_ms)
{
    return bfc_lock_acquire_within(&p->lock, max_ms);
}

void bfc_pool_unlock(bfc_pool *p) { bfc_lock_release(&p->lock); }

bfc_status bfc_pool_reserve(bfc_pool *p)
{
    bfc_lock_acquire(&p->lock);
    bfc_status s = BFC_OK;
    if (p->nregions == 0 && !region_extend(p, p->opt.granularity))
        s = BFC_ERR_OOM;
    bfc_lock_release(&p->lock);
    return s;
}

/* Waits for fences, oldest first, until the request fits or none is left. */
static uint32_t fit_after_waits(bfc_pool *p, uint64_t rounded, uint32_t lane_id,
                                uint64_t *align)
{
    while (lanes_wait_oldest(p)) {
        uint32_t c = place_fit(p, rounded, lane_id, align);
        if (c != CHUNK_NIL)
            return c;
    }
    return CHUNK_NIL;
}

static uint32_t find_fit_slow(bfc_pool *p, uint64_t rounded, uint32_t lane_id,
                              uint64_t *align)
{
    uint32_t c;
    /* Epochs left open by the fence interval get their fences now: only a
     * sealed epoch can be waited for. */
    if (p->open_epochs)
        lanes_seal_all(p, true);
    if (lanes_poll(p) && (c = place_fit(p, rounded, lane_id, align)) != CHUNK_NIL)
        return c;
    /* A new region is kept; a wait costs only time (the GPU goes on with the
     * work queued after the fence). When pending frees hold enough bytes for
     * this request, wait for them before growing: the CPU often runs a whole
     * step ahead of the GPU, and growing past every pending free took a
     * growing pool to 3.8x the live bytes on an H100 (PyTorch, no cache). */
    if (p->st.pending_bytes >= rounded &&
        (c = fit_after_waits(p, rounded, lane_id, align)) != CHUNK_NIL)
        return c;
    if (region_extend(p, rounded))
        return place_fit(p, rounded, lane_id, align);
    if ((c = fit_after_waits(p, rounded, lane_id, align)) != CHUNK_NIL)
        return c;
    /* With vmm a new reservation never waits for memory: nothing to gain. */
    if (p->opt.garbage_collection && p->nregions > 0 && !p->opt.vmm) {
        p->st.num_gc_runs++;
        if (region_release_empty(p) > 0 && region_extend(p, rounded))
            return place_fit(p, rounded, lane_id, align);
    }
    return CHUNK_NIL;
}

/* Links record r into the address list right after c. */
static void link_after(bfc_pool *p, uint32_t c, uint32_t r)
{
    chunk *cc = C(p, c), *rc = C(p, r);
    rc->prev = c;
    rc->next = cc->next;
    if (cc->next != CHUNK_NIL)
        C(p, cc->next)->prev = r;
    cc->next = r;
}

/*
 * Takes `rounded` bytes at address `at` inside FREE chunk c (at > c's start,
 * at + rounded <= its end): c keeps the gap below `at`, the
 * allocation is a new record, and what lies above it becomes
 * a free chunk of its own when it is worth splitting off (else the
 * allocation keeps it as slack, as an unsplit chunk would). Uses up to two
 * records, reserved by the caller.
 */
static uint32_t take_free_at(bfc_pool *p, uint32_t c, uint64_t rounded, uint64_t at)
{
    bin_set *bins = &p->free_bins;
    chunk *cc = C(p, c);
    const uint64_t end = cc->addr + cc->size;
    uint64_t above = end - at - rounded;
    if (above && !worth_splitting(&p->opt, above + rounded, rounded))
        above = 0; /* too small to keep: slack of the allocation */
    const uint32_t a = chunk_new(&p->chunks);
    chunk *ac = C(p, a);
    live_index_prefetch(&p->live, at);
    ac->addr = at;
    ac->size = end - at - above;
    bins_resize_in(bins, &p->chunks, c, bin_index(cc->size), at - cc->addr);
    link_after(p, c, a);
    if (above) {
        const uint32_t r = chunk_new(&p->chunks);
        chunk *rc = C(p, r);
        rc->addr = end - above;
        rc->size = above;
        rc->state = CHUNK_FREE;
        link_after(p, a, r);
        bins_insert(bins, &p->chunks, r);
    }
    return a;
}

/* FREE chunk c whole, its remainder too small to keep. */
static inline __attribute__((always_inline)) uint32_t take_free_whole(bfc_pool *p, uint32_t c)
{
    live_index_prefetch(&p->live, C(p, c)->addr);
    bins_remove(&p->free_bins, &p->chunks, c);
    return c;
}

/* The two ends of a split of FREE chunk c, worth splitting, for `rounded`
 * bytes. A free chunk's neighbours are never free, so the remainder needs no
 * merging, and its key is smaller than c's: it usually takes c's place in
 * the tree as it stands (bins_resize, bins_substitute). Each uses one
 * record, reserved by the caller. */
static inline __attribute__((always_inline)) uint32_t take_free_high(bfc_pool *p, uint32_t c,
                                                                    uint64_t rounded)
{
    chunk *cc = C(p, c);
    const uint64_t rest = cc->size - rounded;
    const uint32_t r = chunk_new(&p->chunks);
    chunk *rc = C(p, r);
    live_index_prefetch(&p->live, cc->addr + rest);
    /* c keeps the low remainder (same address, smaller size); r is the
     * allocation. */
    bins_resize_in(&p->free_bins, &p->chunks, c, bin_index(cc->size), rest);
    rc->addr = cc->addr + rest;
    rc->size = rounded;
    link_after(p, c, r);
    return r;
}

static inline __attribute__((always_inline)) uint32_t take_free_low(bfc_pool *p, uint32_t c,
                                                                   uint64_t rounded)
{
    chunk *cc = C(p, c);
    const uint32_t r = chunk_new(&p->chunks);
    chunk *rc = C(p, r);
    live_index_prefetch(&p->live, cc->addr);
    /* c is the allocation, r the high remainder. */
    rc->addr = cc->addr + rounded;
    rc->size = cc->size - rounded;
    rc->state = CHUNK_FREE;
    bins_substitute(&p->free_bins, &p->chunks, c, r);
    cc->size = rounded;
    link_after(p, c, r);
    return c;
}

/*
 * Takes FREE chunk c for an allocation of `rounded` bytes and returns the
 * handle of the allocated piece; a remainder stays in the free bins, at
 * the end place_in_free chooses.
 */
static inline __attribute__((always_inline)) uint32_t take_free(bfc_pool *p, uint32_t c,
                                                               uint64_t rounded, uint64_t align)
{
    chunk *cc = C(p, c);
    if (!worth_splitting(&p->opt, cc->size, rounded))
        return take_free_whole(p, c);
    const bfc_addr at = place_in_free(p, cc, rounded, align);
    if (at + rounded == cc->addr + cc->size)
        return take_free_high(p, c, rounded);
    if (at == cc->addr)
        return take_free_low(p, c, rounded);
    return take_free_at(p, c, rounded, at);
}

/* Takes PENDING chunk c (reused by its own lane); a remainder stays pending
 * in the lane's FIFO at c's place, with c's token. */
static uint32_t take_pending(bfc_pool *p, uint32_t c, uint64_t rounded)
{
    chunk *cc = C(p, c);
    const uint32_t lane_id = cc->lane, fifo_prev = cc->qprev;
    const uint64_t token = cc->stamp;
    lane_detach(p, c);
    if (!worth_splitting(&p->opt, cc->size, rounded))
        return c;
    const uint64_t rest = cc->size - rounded;
    const bool high = place_in_pending(p, cc, rounded) != cc->addr;
    const uint32_t r = chunk_new(&p->chunks);
    chunk *rc = C(p, r);
    uint32_t taken = c, left = r;
    if (high) {
        rc->addr = cc->addr + rest;
        rc->size = rounded;
        cc->size = rest;
        taken = r;
        left = c;
    } else {
        rc->addr = cc->addr + rounded;
        rc->size = rest;
        cc->size = rounded;
    }
    link_after(p, c, r);
    lane_attach_after(p, left, lane_id, token, fifo_prev);
    return taken;
}

/* The region holding `addr`, which a chunk's address always is: with one
 * region (every preallocated pool) no search. */
static inline region *region_of(const bfc_pool *p, bfc_addr addr)
{
    return &p->regions[p->nregions == 1 ? 0 : region_find(p, addr)];
}

/* vmm: does every granule under chunk c have memory behind it? */
static bool block_mapped(const bfc_pool *p, uint32_t c)
{
    bfc_addr lo = C(p, c)->addr, hi = lo + C(p, c)->size;
    /* The steady state: the block ends in the first region's mapped prefix
     * (regions are sorted, so it lies in that region). */
    if (hi <= p->regions[0].backed_to)
        return true;
    const region *r = region_of(p, lo);
    return backing_fast_covers(p, r, lo, hi) || backing_covers(p, r, lo, hi);
}

static inline __attribute__((always_inline)) uint32_t mark_allocated(bfc_pool *p, uint32_t c,
                                                                    uint64_t size)
{
    chunk *cc = C(p, c);
    cc->state = CHUNK_ALLOCATED;
    cc->requested = size;
    cc->stamp = ++p->alloc_seq;
    return c;
}

/* Carves an allocation of `size` (`rounded`) bytes from fit c, free or
 * pending, and returns it, allocated and stamped. It and take_free are
 * forced inline: with a second caller (carve_again) the compiler made
 * take_free a call, 4% more instructions per operation in replay. */
static inline __attribute__((always_inline)) uint32_t carve(bfc_pool *p, uint32_t c,
                                                           uint64_t rounded, uint64_t align,
                                                           uint64_t size)
{
    c = C(p, c)->state == CHUNK_PENDING ? take_pending(p, c, rounded)
                                        : take_free(p, c, rounded, align);
    return mark_allocated(p, c, size);
}

/* Takes `rounded` bytes at `at` inside FREE chunk c, for a plan. */
static uint32_t carve_at(bfc_pool *p, uint32_t c, uint64_t rounded, bfc_addr at, uint64_t size)
{
    const chunk *cc = C(p, c);
    if (at > cc->addr)
        c = take_free_at(p, c, rounded, at);
    else if (worth_splitting(&p->opt, cc->size, rounded))
        c = take_free_low(p, c, rounded);
    else
        c = take_free_whole(p, c);
    return mark_allocated(p, c, size);
}

/*
 * The plan's place for this allocation, carved, or CHUNK_NIL when the plan
 * has no entry for it near its cursor or the place is not wholly free
 * (plan.c). The caller makes sure the pool has its one region.
 */
static uint32_t carve_planned(bfc_pool *p, uint64_t rounded, uint64_t size)
{
    uint64_t offset;
    bfc_addr at;
    if (!plan_next(p->plan, rounded, &offset))
        return CHUNK_NIL;
    uint32_t c = plan_free_chunk_at(p, p->plan, offset, rounded, &at);
    /* The place may be pending in a lazy lane (sealed only when its memory
     * is needed): it is needed now. */
    if (c == CHUNK_NIL && p->open_epochs) {
        lanes_seal_all(p, true);
        if (lanes_poll(p))
            c = plan_free_chunk_at(p, p->plan, offset, rounded, &at);
    }
    if (c == CHUNK_NIL) {
        p->st.num_plan_misses++;
        return CHUNK_NIL;
    }
    return carve_at(p, c, rounded, at, size);
}

static bool back_allocation(bfc_pool *p, uint32_t *cp, bool may_move, uint64_t rounded,
                            uint64_t size, uint32_t lane_id);
static void undo_carve(bfc_pool *p, uint32_t c);

/* An allocation the plan did not place, carved in the spare space above the
 * plan's extent (plan_spare_chunk), out of the planned layout's way, and
 * mapped there as a planned place is; CHUNK_NIL when nothing there holds
 * it. */
static uint32_t carve_spare(bfc_pool *p, uint64_t rounded, uint64_t size)
{
    bfc_addr at;
    uint32_t c = plan_spare_chunk(p, p->plan, rounded, &at);
    if (c == CHUNK_NIL)
        return CHUNK_NIL;
    c = carve_at(p, c, rounded, at, size);
    /* Over vmm the spare space may be unmapped (a release threshold gave
     * it back). While pending frees could hold the block, mapping there
     * would skip the wait for them that the rule's path makes before it
     * maps (refit_before_mapping): the rule places it instead. */
    if (p->opt.vmm && !block_mapped(p, c)) {
        if (p->st.pending_bytes >= rounded) {
            undo_carve(p, c);
            return CHUNK_NIL;
        }
        if (!back_allocation(p, &c, false, rounded, size, BFC_NO_LANE))
            return CHUNK_NIL; /* (back_allocation made it free again) */
    }
    p->st.num_plan_spare++;
    return c;
}

/* Gives the just-carved allocation c back to free space and carves the
 * request again: what c was cut from is free again, so a fit exists. */
static uint32_t carve_again(bfc_pool *p, uint32_t c, uint64_t rounded, uint64_t size,
                            uint32_t lane_id)
{
    undo_carve(p, c);
    uint64_t align;
    c = place_fit(p, rounded, lane_id, &align);
    return carve(p, c, rounded, align, size);
}

/*
 * One step of making pending frees free before mapping more: the first step
 * (*polled false) retires what the GPU has finished without waiting, sealing
 * open epochs first (only a sealed epoch has a fence to wait for); a step
 * that retires nothing that way waits for the oldest fence. false: nothing
 * was retired and nothing is left to wait for.
 */
static bool retire_or_wait(bfc_pool *p, bool *polled)
{
    if (!*polled) {
        *polled = true;
        if (p->open_epochs)
            lanes_seal_all(p, true);
        if (lanes_poll(p))
            return true;
    }
    return lanes_wait_oldest(p);
}

/*
 * vmm: allocation c landed on unmapped granules. Over one growing
 * reservation a fit almost never lacks, so nothing else stops the pool from
 * mapping past every pending free while the CPU runs ahead of the GPU
 * (28-33 GiB mapped for 15.6 GiB live on an H100, PyTorch without its
 * cache). Before mapping, the way growth by regions does before growing
 * (find_fit_slow): retire what the GPU has finished, then, while pending
 * frees could hold the block, wait for the oldest fence and carve again,
 * until the block lands on mapped memory. Returns the allocation to back.
 */
static uint32_t refit_before_mapping(bfc_pool *p, uint32_t c, uint64_t rounded, uint64_t size,
                                     uint32_t lane_id)
{
    bool polled = false;
    while (p->st.pending_bytes >= rounded && !block_mapped(p, c)) {
        if (!retire_or_wait(p, &polled))
            break;
        c = carve_again(p, c, rounded, size, lane_id);
    }
    return c;
}

/*
 * vmm, near the limit: allocation c landed on unmapped granules that the
 * limit forbids mapping, so free granules elsewhere would be unmapped to
 * make room (a remap, tens of microseconds a granule on a GPU). When some
 * other free chunk holds the block on memory already mapped
 * (place_on_mapped), the block goes there instead (num_mapped_refits). Else
 * c is carved again where it was, and the remap is paid. Out of line, so
 * the allocation path pays nothing for it until memory runs short.
 */
static __attribute__((noinline)) uint32_t refit_on_mapped(bfc_pool *p, uint32_t c,
                                                           uint64_t rounded, uint64_t size,
                                                           uint32_t lane_id)
{
    undo_carve(p, c);
    bfc_addr at;
    const uint32_t best = place_on_mapped(p, rounded, &at);
    if (best != CHUNK_NIL) {
        p->st.num_mapped_refits++;
        return carve_at(p, best, rounded, at, size);
    }
    uint64_t a;
    c = place_fit(p, rounded, lane_id, &a);
    return carve(p, c, rounded, a, size);
}

/*
 * vmm, pressure: [lo, hi) of region r could not be mapped. When the limit
 * forbids it, gives back that shortfall of free space, from the free chunks
 * least likely to be needed again, rather than all of it, which every later
 * block landing there would have to map again. When that is not enough, or
 * the device refused whatever the limit, everything free goes; then what
 * the GPU has finished retires without waiting (a poll, as before growing),
 * and only then does the pool wait, oldest fence first, until the mapping
 * succeeds or nothing is left to try. The caller brackets this with the
 * backend's keep, so what is unmapped here moves rather than leaves.
 */
static bool map_under_pressure(bfc_pool *p, region *r, bfc_addr lo, bfc_addr hi)
{
    uint64_t missing = backing_missing(p, r, lo, hi);
    uint64_t room = p->opt.limit_bytes - p->st.pool_bytes;
    if (missing > room && backing_release_some(p, missing - room, NULL) >= missing - room &&
        backing_map(p, r, lo, hi))
        return true;
    /* Mapped bytes when the last attempt failed: try again only once some
     * went back (here, or by the threshold as retirements free blocks). */
    uint64_t failed_at = p->st.pool_bytes;
    bool polled = false;
    for (;;) {
        backing_release_free(p);
        if (p->st.pool_bytes < failed_at) {
            if (backing_map(p, r, lo, hi))
                return true;
            failed_at = p->st.pool_bytes;
        }
        if (!retire_or_wait(p, &polled))
            return false;
    }
}

/*
 * vmm, growing: block *cp landed on unmapped granules. Best fit ignores
 * backing, so a pool that only grows maps new memory for a large block while
 * the holes freed elsewhere stay mapped, none large enough for it: replayed,
 * 6% over peak live on the H100 GPT-2 jobs, whose 1.5 GiB logits no hole
 * held. When the mapping would take the pool past its headroom over the most
 * it has needed at once, the block first moves to mapped free memory that
 * holds it (refit_on_mapped: nothing to map), then free granules move behind
 * it, the shortfall only, from the largest holes (as under pressure), and
 * only what that leaves is mapped new, by the caller. A move costs about
 * 100 us a granule on a GPU; a job whose steady state needs more room than
 * the headroom would move memory in every step, so the bytes moves move
 * beyond what the need grew meanwhile add up (moved_at_need: each move adds
 * what it moved less what the need grew since the move before, never going
 * below zero), and each fifth of the need they reach raises the headroom by
 * its step: moves die out. The guard counts bytes, the cost, not moves:
 * when each move made once the need had stopped growing raised it, the few
 * moves that settle the layout after the first step (the GPT-2 job on two
 * streams: four moves of 0.08-0.38 GiB, 2% of its 15.6 GiB need each)
 * raised it four times, and the peak followed the cap to 5.5% over peak
 * live; counted in bytes, 4.0% (replayed 30 and 100 steps long, the same 16
 * moves, none after step 30). The price: a job moves at most its need's
 * growth, and a fifth of its need for each step of headroom it turns out
 * to need (GPT-2: 3 GiB, about 0.15 s, once). Moves while the need still
 * grows by what they move (a job's first step reaching its peak) count
 * nothing: each of those raised the headroom once, and the peak followed
 * the raised cap (GPT-2: 5.7% over peak live). Growth beyond a move takes
 * back what moves before it added (a perturbed copy of the GPT-2 trace
 * moves 0.5 GiB in its first step before its need's last 1.3 GiB: counted,
 * its peak went from 3.8% to 5.3% over peak live), but never starts the
 * count again: then a need that grew by a granule every few steady moves
 * kept the headroom where it was while memory moved in every step. Never
 * waits for a fence, and does nothing while blocks are pending for the GPU
 * (below); the release gate may wait for the last barrier, as every
 * release does. Out of line: the steady state, which maps nothing, never
 * gets here.
 */
#define GROWTH_RISE_PER_NEED_MOVED 5u
static __attribute__((noinline)) void stay_within_headroom(bfc_pool *p, uint32_t *cp,
                                                           uint64_t rounded, uint64_t size,
                                                           uint32_t lane_id)
{
    const uint64_t need = p->st.bytes_in_use + p->st.pending_bytes + rounded;
    if (need > p->growth_need)
        p->growth_need = need;
    /* need < 2 * BFC_SIZE_LIMIT (2^49: in use and pending are mapped,
     * under a limit below 2^48, plus a block below it) and the headroom
     * below twice BFC_MAX_GROWTH_HEADROOM thousandths: no overflow. */
    const uint64_t cap = round_up(p->growth_need + p->growth_need / 1000 * p->growth_headroom,
                                  p->opt.map_granularity);
    uint32_t c = *cp;
    region *r = region_of(p, C(p, c)->addr);
    uint64_t missing = backing_missing(p, r, C(p, c)->addr, C(p, c)->addr + C(p, c)->size);
    if (p->st.pool_bytes + missing <= cap)
        return;
    /* Not while blocks are pending for the GPU: what it still holds comes
     * back by itself, and moving memory meanwhile fights the lag (replayed
     * with two non-blocking streams 100 operations behind: 26 GiB moved
     * over 30 steps of the GPT-2 job and ten times the fence waits, where
     * growing costs neither). Frees that only lazy lanes hold (an ordered
     * pool's: no fence asked for yet) do not come back by themselves, and
     * when they are fewer than the shortfall they could not make it up
     * even sealed: they do not stop a move (before, a few KiB of them
     * kept the GPT-2 job's logits from moving). Only their open epochs
     * count: a lazy lane's sealed epochs are pending for the GPU. */
    const uint64_t shortfall = p->st.pool_bytes + missing - cap;
    if (p->st.pending_bytes &&
        (p->st.pending_bytes >= shortfall || lanes_lazy_open_bytes(p) < p->st.pending_bytes))
        return;
    *cp = c = refit_on_mapped(p, c, rounded, size, lane_id);
    const bfc_addr lo = C(p, c)->addr, hi = lo + C(p, c)->size;
    r = region_of(p, lo);
    missing = backing_missing(p, r, lo, hi);
    if (missing == 0 || p->st.pool_bytes + missing <= cap)
        return;
    /* Moves, never gives back: a pool that grew past its cap while blocks
     * were pending unmaps no more than the block maps. */
    const uint64_t over = p->st.pool_bytes + missing - cap;
    if (p->backend.keep)
        p->backend.keep(p->backend.ctx, true);
    const uint64_t want = over < missing ? over : missing;
    const uint64_t released = backing_release_some(p, want, NULL);
    if (released) {
        p->st.num_growth_moves++;
        /* What moved: what free space gave back, which the block maps.
         * Fewer than wanted when free space holds fewer mapped granules
         * (the caller maps the rest new: growth, not a move); more only
         * when the release, short of memory for its sort, gave back all
         * free space (what the block does not map leaves at keep(false)).
         * Not `want`: a move that moved one granule of two counted two,
         * and raised the headroom for memory the pool mapped new. */
        const uint64_t moved = released < want ? released : want;
        /* The count takes back what the need grew since the last move
         * (above); growth_need only grows: no underflow. */
        const uint64_t grew = p->growth_need - p->need_at_move;
        p->need_at_move = p->growth_need;
        p->moved_at_need += moved;
        p->moved_at_need = p->moved_at_need > grew ? p->moved_at_need - grew : 0;
        if (p->moved_at_need >= p->growth_need / GROWTH_RISE_PER_NEED_MOVED) {
            p->moved_at_need = 0;
            if (p->growth_headroom < BFC_MAX_GROWTH_HEADROOM)
                p->growth_headroom += p->opt.growth_headroom_step;
        }
        backing_map(p, r, lo, hi); /* what it cannot map, the caller maps */
    }
    if (p->backend.keep)
        p->backend.keep(p->backend.ctx, false);
}

/*
 * vmm, the last resort: the block could not be backed where best fit put
 * it, even with every free granule given back (map_under_pressure). Those
 * left mapped are pinned by live and pending blocks, and another free chunk
 * may hold the block at an end on granules its neighbours pin, mapping no
 * more than the limit has room for (place_within_room): it goes there
 * (num_limit_moves), so that only granules pinned by blocks cause an
 * out-of-memory, never where best fit put the block in address space (the
 * search weighs what the carve takes, an unsplit remainder included, so
 * the mapping below fails only when the device refuses).
 */
static bool back_within_room(bfc_pool *p, uint32_t *cp, uint64_t rounded, uint64_t size)
{
    /* The granules the failed block held are free again: they go too (the
     * caller's keep moves them rather than give them back). */
    backing_release_free(p);
    bfc_addr at;
    const uint32_t x = place_within_room(p, rounded, p->opt.limit_bytes - p->st.pool_bytes, &at);
    if (x == CHUNK_NIL)
        return false;
    const uint32_t c = carve_at(p, x, rounded, at, size);
    const bfc_addr lo = C(p, c)->addr, hi = lo + C(p, c)->size;
    if (!backing_map(p, region_of(p, lo), lo, hi)) {
        pool_make_free(p, c);
        return false;
    }
    p->st.num_limit_moves++;
    *cp = c;
    return true;
}

/*
 * vmm: maps what just-carved chunk *cp lacks. The caller found it not wholly
 * mapped (block_mapped); out of line, so the steady state pays only that
 * test. When the limit forbids the mapping and the block may move (it is
 * not a plan's place), it first moves to mapped memory if any holds it
 * (refit_on_mapped, which updates *cp); then it maps under pressure (the
 * chunk itself is allocated, so its own granules stay). When nothing works
 * the chunk returns to free space (merging back into what it was cut from)
 * and the allocation fails. Pending chunks are always backed, so a block
 * taken from its own lane never gets here with anything to map.
 */
static __attribute__((noinline)) bool back_allocation(bfc_pool *p, uint32_t *cp, bool may_move,
                                                      uint64_t rounded, uint64_t size,
                                                      uint32_t lane_id)
{
    if (may_move && p->growth_headroom && !p->opt.preallocate)
        stay_within_headroom(p, cp, rounded, size, lane_id);
    uint32_t c = *cp;
    bfc_addr lo = C(p, c)->addr, hi = lo + C(p, c)->size;
    region *r = region_of(p, lo);
    if (backing_map(p, r, lo, hi))
        return true;
    /* Only when the limit forbade the mapping (a device that refused keeps
     * what it mapped, and missing bytes still fit under the limit). */
    if (may_move && backing_missing(p, r, lo, hi) > p->opt.limit_bytes - p->st.pool_bytes) {
        *cp = c = refit_on_mapped(p, c, rounded, size, lane_id);
        /* Wherever the block lies now: moved, it is mapped, unless an
         * unsplit remainder it took reaches an unmapped granule; that is
         * mapped in the region the block moved to, under the limit if it
         * fits (the pressure path below assumes it does not). Not moved,
         * the limit still forbids and this maps nothing. */
        lo = C(p, c)->addr;
        hi = lo + C(p, c)->size;
        r = region_of(p, lo);
        if (backing_map(p, r, lo, hi))
            return true;
    }
    if (p->backend.keep)
        p->backend.keep(p->backend.ctx, true);
    bool mapped = map_under_pressure(p, r, lo, hi);
    if (!mapped) {
        /* The limit forbade it (not a device that refused, which keeps
         * what it mapped): the block may fit elsewhere. */
        const bool limit = may_move && backing_missing(p, r, lo, hi) >
                                           p->opt.limit_bytes - p->st.pool_bytes;
        pool_make_free(p, c);
        if (limit)
            mapped = back_within_room(p, cp, rounded, size);
    }
    if (p->backend.keep)
        p->backend.keep(p->backend.ctx, false);
    return mapped;
}

/*
 * The allocation placed as the plan says: at its planned place
 * (num_planned), else in the spare space above the plan; CHUNK_NIL leaves
 * it to the rule. A plan applies while the pool has one region: its
 * offsets name places there. Each allocation that consults it records
 * whether it went to its planned place (the stray score, plan.c). Out of
 * line: without a plan the allocation path pays one predicted branch.
 */
static __attribute__((noinline)) uint32_t place_by_plan(bfc_pool *p, uint64_t rounded,
                                                        uint64_t size)
{
    if (p->nregions != 1)
        return CHUNK_NIL;
    uint32_t c = carve_planned(p, rounded, size);
    if (c != CHUNK_NIL && p->opt.vmm && !block_mapped(p, c) &&
        !back_allocation(p, &c, false, rounded, size, BFC_NO_LANE)) {
        /* The planned place could not be mapped; the rule may find mapped
         * memory. */
        p->st.num_plan_misses++;
        c = CHUNK_NIL;
    }
    plan_record(p->plan, c != CHUNK_NIL);
    if (c == CHUNK_NIL)
        return carve_spare(p, rounded, size);
    p->st.num_planned++;
    return c;
}

bfc_status bfc_pool_alloc(bfc_pool *p, uint64_t size, uint32_t lane_id,
                          bfc_addr *out)
{
    if (size == 0) {
        *out = 0;
        return BFC_OK;
    }
    /* The rounded size must be below BFC_SIZE_LIMIT, the bins' range: the
     * limit is a multiple of the granularity, so the largest size that
     * rounds to below it is one granule under it. Checked before rounding,
     * which cannot overflow then. */
    if (size > BFC_SIZE_LIMIT - p->opt.granularity)
        return BFC_ERR_TOO_LARGE;
    const uint64_t rounded = round_up_pow2(size, p->opt.granularity);
    bfc_status s = BFC_OK;
    bfc_lock_acquire(&p->lock);
    if (lane_id != BFC_NO_LANE &&
        (lane_id >= p->nlanes || !p->lanes[lane_id].accepting)) {
        s = BFC_ERR_BAD_LANE;
        goto out;
    }
    /* Two records for an aligned carve's gap and remainder, one for a new
     * region, one map slot: reserved before anything changes (the seals
     * and retirements below included), so that a failure leaves the pool
     * as it was. Retiring only gives records back. */
    if (!chunk_store_reserve(&p->chunks, 3) || !live_index_reserve(&p->live, &p->chunks, 1)) {
        s = BFC_ERR_HOST_MEMORY;
        goto out;
    }
    /* Deferred frees: fence what was freed since the last fencing, and
     * retire what the GPU has finished since (every fence_interval-th
     * allocation, or once fence_bytes were freed; the slow path does both
     * whenever nothing fits). */
    if ((p->open_epochs || p->st.num_pending_chunks) &&
        (++p->allocs_since_fence >= p->opt.fence_interval ||
         (p->opt.fence_bytes && p->bytes_since_fence >= p->opt.fence_bytes))) {
        p->allocs_since_fence = 0;
        p->bytes_since_fence = 0;
        if (p->open_epochs)
            lanes_seal_all(p, false);
        if (p->st.num_pending_chunks)
            lanes_poll_oldest(p);
    }
    /* Lazy lanes of a growing pool: their memory is needed once they hold
     * a share of what is in use (lanes.c). */
    if (p->open_epochs && lanes_lazy_due(p)) {
        lanes_seal_all(p, true);
        lanes_poll(p);
    }
    uint32_t c = CHUNK_NIL;
    if (__builtin_expect(p->plan != NULL, 0))
        c = place_by_plan(p, rounded, size);
    if (c == CHUNK_NIL) {
        uint64_t align;
        c = place_fit(p, rounded, lane_id, &align);
        if (c == CHUNK_NIL)
            c = find_fit_slow(p, rounded, lane_id, &align);
        if (c == CHUNK_NIL)
            goto oom;
        c = carve(p, c, rounded, align, size);
        if (p->opt.vmm) {
            c = refit_before_mapping(p, c, rounded, size, lane_id);
            if (!block_mapped(p, c) && !back_allocation(p, &c, true, rounded, size, lane_id))
                goto oom;
        }
    }
    chunk *cc = C(p, c);
    live_index_insert(&p->live, &p->chunks, c);

    bfc_stats *st = &p->st;
    st->num_allocs++;
    st->bytes_in_use += cc->size;
    st->bytes_requested += size;
    /* peak >= high, so one comparison in the common case. */
    if (st->bytes_in_use > st->high_bytes_in_use) {
        st->high_bytes_in_use = st->bytes_in_use;
        if (st->bytes_in_use > st->peak_bytes_in_use)
            st->peak_bytes_in_use = st->bytes_in_use;
    }
    if (st->bytes_requested > st->peak_bytes_requested)
        st->peak_bytes_requested = st->bytes_requested;
    if (size > st->largest_alloc_size)
        st->largest_alloc_size = size;
    *out = cc->addr;
    if (p->backend.on_event)
        p->backend.on_event(p->backend.event_ctx, BFC_EVENT_ALLOC, cc->addr, size, lane_id);
    goto out;
oom:
    p->st.num_ooms++;
    s = BFC_ERR_OOM;
    if (p->backend.on_event)
        p->backend.on_event(p->backend.event_ctx, BFC_EVENT_ALLOC_FAILED, 0, size, lane_id);
out:
    bfc_lock_release(&p->lock);
    return s;
}

/* Unlinks and recycles record r, which follows c in its region. */
static void unlink_next(bfc_pool *p, uint32_t c, uint32_t r)
{
    chunk *cc = C(p, c), *rc = C(p, r);
    cc->next = rc->next;
    if (rc->next != CHUNK_NIL)
        C(p, rc->next)->prev = c;
    chunk_release(&p->chunks, r);
}

/* Turns a detached chunk (just freed or just retired) into a free one,
 * merging it with free neighbours; the lower record survives a merge. The
 * merged chunk's key only grows, so it usually keeps the tree position of
 * the neighbour it absorbed (bins_resize, bins_substitute). Forced inline
 * into bfc_pool_free, the hot caller; pool_make_free serves the others. */
static inline __attribute__((always_inline)) void make_free(bfc_pool *p, uint32_t c, bool release)
{
    bin_set *bins = &p->free_bins;
    chunk *cc = C(p, c);
    cc->state = CHUNK_FREE;
    cc->requested = 0;
    cc->stamp = 0;
    const uint32_t n = cc->next, v = cc->prev;
    const bool next_free = n != CHUNK_NIL && C(p, n)->state == CHUNK_FREE;
    const bool prev_free = v != CHUNK_NIL && C(p, v)->state == CHUNK_FREE;
    if (next_free) {
        if (prev_free) { /* n disappears, v grows over c and n */
            bins_remove(bins, &p->chunks, n);
            cc->size += C(p, n)->size;
        } else { /* c absorbs n and takes its place */
            cc->size += C(p, n)->size;
            bins_substitute(bins, &p->chunks, n, c);
        }
        unlink_next(p, c, n);
    }
    if (prev_free) {
        bins_resize(bins, &p->chunks, v, C(p, v)->size + cc->size);
        unlink_next(p, v, c);
        c = v;
    } else if (!next_free) {
        bins_insert(bins, &p->chunks, c);
    }
    /* vmm: mapped memory beyond the threshold goes back as soon as a whole
     * granule of it is free. The unsigned sum only overstates what is free
     * (granules shared with live blocks), which merely asks sooner. */
    if (release && p->release_on_free &&
        p->st.pool_bytes - p->st.bytes_in_use - p->st.pending_bytes > p->opt.release_threshold)
        backing_after_free(p, c);
}

void pool_make_free(bfc_pool *p, uint32_t c)
{
    make_free(p, c, true);
}

/* Gives back a block just carved for the allocation in progress, to carve
 * it again elsewhere. No release: the threshold is for frees, and
 * unmapping here would take the mapped memory the next carve looks for
 * (refit_on_mapped) and map it again. */
static void undo_carve(bfc_pool *p, uint32_t c)
{
    make_free(p, c, false);
}

bfc_status bfc_pool_free(bfc_pool *p, bfc_addr addr)
{
    if (addr == 0)
        return BFC_OK;
    bfc_lock_acquire(&p->lock);
    uint32_t c;
    const bfc_status s = pool_take_live(p, addr, &c);
    if (s == BFC_OK) {
        make_free(p, c, true);
        if (p->backend.on_event)
            p->backend.on_event(p->backend.event_ctx, BFC_EVENT_FREE, addr, 0, BFC_NO_LANE);
    }
    bfc_lock_release(&p->lock);
    return s;
}

uint64_t bfc_pool_trim(bfc_pool *p)
{
    bfc_lock_acquire(&p->lock);
    /* Frees still in an open epoch have no fence yet: seal them, then retire
     * whatever the owner already reports done. Never wait: trimming is a
     * request to give back what is idle now, not to stall on the GPU. */
    lanes_seal_all(p, true);
    lanes_poll(p);
    uint64_t released = region_release_empty(p);
    bfc_lock_release(&p->lock);
    return released;
}

/*
 * The loan shrinks the limit the pool's mechanics read (opt.limit_bytes),
 * so every "room under the limit" (mapping, growth, free space as the limit
 * lets it be used) accounts for it without knowing loans exist;
 * st.bytes_limit keeps the configured limit.
 */
bfc_status bfc_pool_lend(bfc_pool *p, uint64_t bytes)
{
    bfc_status s = BFC_OK;
    bfc_lock_acquire(&p->lock);
    if (bytes > p->opt.limit_bytes) {
        s = BFC_ERR_OOM;
    } else {
        const uint64_t most = p->opt.limit_bytes - bytes; /* what the pool may hold then */
        bool polled = false, refused = false;
        while (p->st.pool_bytes > most) {
            if (p->opt.vmm)
                backing_release_some(p, p->st.pool_bytes - most, &refused);
            else
                region_release_empty(p);
            /* A closed gate (release_ready: "not now") keeps whatever the
             * fences would retire mapped too: waiting for them cannot help,
             * only hold the lock. */
            if (p->st.pool_bytes > most && (refused || !retire_or_wait(p, &polled))) {
                s = BFC_ERR_OOM;
                break;
            }
        }
    }
    if (s == BFC_OK) {
        p->opt.limit_bytes -= bytes;
        p->st.bytes_lent += bytes;
        if (p->st.bytes_lent > p->st.peak_bytes_lent)
            p->st.peak_bytes_lent = p->st.bytes_lent;
    }
    bfc_lock_release(&p->lock);
    return s;
}

void bfc_pool_end_loan(bfc_pool *p, uint64_t bytes)
{
    bfc_lock_acquire(&p->lock);
    if (bytes > p->st.bytes_lent)
        bytes = p->st.bytes_lent; /* never more than was lent */
    p->st.bytes_lent -= bytes;
    if (!p->abandoned)
        p->opt.limit_bytes += bytes;
    bfc_lock_release(&p->lock);
}

uint64_t bfc_pool_abandon_memory(bfc_pool *p)
{
    uint64_t released = 0;
    bfc_lock_acquire(&p->lock);
    if (p->opt.vmm) {
        for (uint32_t i = 0; i < p->nregions; i++) {
            region *r = &p->regions[i];
            released += backing_release(p, r, r->base, r->base + r->size, NULL);
        }
        p->opt.limit_bytes = 0; /* nothing is mapped again */
        p->abandoned = true;    /* not even when a loan ends */
    }
    bfc_lock_release(&p->lock);
    return released;
}

bool bfc_pool_owns(bfc_pool *p, bfc_addr addr)
{
    bfc_lock_acquire(&p->lock);
    bool owned = region_find(p, addr) >= 0;
    bfc_lock_release(&p->lock);
    return owned;
}

bfc_status bfc_pool_block(bfc_pool *p, bfc_addr addr, bfc_live_info *out)
{
    bfc_status s = BFC_OK;
    bfc_lock_acquire(&p->lock);
    uint32_t c = live_index_find(&p->live, &p->chunks, addr);
    if (c == CHUNK_NIL) {
        int r = region_find(p, addr);
        if (r < 0) {
            s = BFC_ERR_NOT_OWNED;
        } else {
            c = region_chunk_containing(p, r, addr);
            /* Bytes past the request but inside the rounded chunk are not
             * part of the allocation. */
            if (c == CHUNK_NIL || C(p, c)->state != CHUNK_ALLOCATED ||
                addr - C(p, c)->addr >= C(p, c)->requested) {
                c = CHUNK_NIL;
                s = BFC_ERR_NOT_ALLOCATED;
            }
        }
    }
    if (c != CHUNK_NIL && out) {
        const chunk *cc = C(p, c);
        *out = (bfc_live_info){.addr = cc->addr, .size = cc->size,
                               .requested = cc->requested, .seq = cc->stamp};
    }
    bfc_lock_release(&p->lock);
    return s;
}

bfc_status bfc_pool_lookup(bfc_pool *p, bfc_addr addr, bfc_addr *base, uint64_t *size)
{
    bfc_live_info b;
    bfc_status s = bfc_pool_block(p, addr, &b);
    if (s == BFC_OK) {
        if (base)
            *base = b.addr;
        if (size)
            *size = b.requested;
    }
    return s;
}

void bfc_pool_describe(bfc_pool *p, bfc_addr addr, char *buf, size_t len)
{
    bfc_lock_acquire(&p->lock);
    int r = region_find(p, addr);
    uint32_t c = r < 0 ? CHUNK_NIL : region_chunk_containing(p, r, addr);
    if (c == CHUNK_NIL) {
        snprintf(buf, len, "0x%llx is not in any region of the pool",
                 (unsigned long long)addr);
    } else {
        const chunk *cc = C(p, c);
        unsigned long long a = addr, base = cc->addr, size = cc->size,
                           off = addr - cc->addr;
        switch (cc->state) {
        case CHUNK_ALLOCATED:
            if (off == 0)
                snprintf(buf, len, "0x%llx is a live allocation of %llu bytes", a,
                         (unsigned long long)cc->requested);
            else
                snprintf(buf, len,
                         "0x%llx is %llu bytes inside the live allocation 0x%llx "
                         "(%llu bytes), not its start",
                         a, off, base, (unsigned long long)cc->requested);
            break;
        case CHUNK_PENDING:
            snprintf(buf, len,
                     "0x%llx is not allocated: it lies in block 0x%llx (%llu bytes) "
                     "freed earlier and waiting for stream work (double free?)",
                     a, base, size);
            break;
        default:
            snprintf(buf, len,
                     "0x%llx is not allocated: it lies in free block 0x%llx "
                     "(%llu bytes)%s",
                     a, base, size, off == 0 ? " (double free?)" : "");
            break;
        }
    }
    bfc_lock_release(&p->lock);
}

void bfc_pool_options(bfc_pool *p, bfc_options *out)
{
    bfc_lock_acquire(&p->lock);
    *out = p->opt;
    bfc_lock_release(&p->lock);
}

size_t bfc_pool_largest_live(bfc_pool *p, bfc_live_info *out, size_t n)
{
    size_t have = 0;
    if (n == 0)
        return 0;
    bfc_lock_acquire(&p->lock);
    for (uint64_t i = 0; i <= p->live.mask; i++) {
        if (p->live.slots[i] == CHUNK_NIL)
            continue;
        const chunk *cc = C(p, p->live.slots[i]);
        if (have == n && cc->size <= out[n - 1].size)
            continue;
        /* Insertion into the sorted prefix, dropping the smallest if full. */
        size_t j = have < n ? have++ : n - 1;
        while (j > 0 && out[j - 1].size < cc->size) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = (bfc_live_info){.addr = cc->addr, .size = cc->size,
                                 .requested = cc->requested, .seq = cc->stamp};
    }
    bfc_lock_release(&p->lock);
    return have;
}

void bfc_pool_visit(bfc_pool *p, bfc_chunk_visitor fn, void *arg)
{
    bfc_lock_acquire(&p->lock);
    bfc_pool_visit_locked(p, fn, arg);
    bfc_lock_release(&p->lock);
}

void bfc_pool_visit_locked(bfc_pool *p, bfc_chunk_visitor fn, void *arg)
{
    for (uint32_t r = 0; r < p->nregions; r++) {
        for (uint32_t c = p->regions[r].first; c != CHUNK_NIL; c = C(p, c)->next) {
            const chunk *cc = C(p, c);
            bfc_chunk_info info = {
                .addr = cc->addr,
                .size = cc->size,
                .requested = cc->requested,
                .seq = cc->stamp,
                .region = r,
                .lane = cc->lane,
                .kind = cc->state == CHUNK_ALLOCATED ? BFC_CHUNK_ALLOCATED
                        : cc->state == CHUNK_PENDING ? BFC_CHUNK_PENDING
                                                     : BFC_CHUNK_FREE,
            };
            fn(arg, &info);
        }
    }
}
