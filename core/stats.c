/*
 * stats.c - a snapshot of the pool's counters plus the figures derived from
 * its structures (largest free block, fragmentation, host memory held).
 */
#include "pool_internal.h"
#include "placement.h"

void pool_stats_locked(const bfc_pool *p, bfc_stats *out)
{
    *out = p->st;
    uint32_t largest = bins_largest(&p->free_bins, &p->chunks);
    out->largest_free_block_bytes = largest == CHUNK_NIL ? 0 : C(p, largest)->size;
    out->free_bytes = pool_free_bytes(p);
    out->num_free_chunks = pool_free_chunks(p);
    out->num_chunks = p->chunks.used;
    out->num_regions = p->nregions;
    out->growth_headroom = p->growth_headroom;
    out->bytes_reserved = out->pool_bytes;
    out->peak_bytes_reserved = out->peak_pool_bytes;
    out->internal_fragmentation_bytes = out->bytes_in_use - out->bytes_requested;
    out->fragmentation =
        out->free_bytes == 0
            ? 0.0
            : (double)(out->free_bytes - out->largest_free_block_bytes) /
                  (double)out->free_bytes;
    out->host_metadata_bytes = sizeof *p + chunk_store_host_bytes(&p->chunks) +
                               live_index_host_bytes(&p->live) +
                               (uint64_t)p->regions_cap * sizeof(region) +
                               lanes_host_bytes(p) + plan_host_bytes(p->plan);
    out->plan_abandoned = plan_abandoned(p->plan);
}

/* One free chunk over virtual memory, as the limit sees it: its bytes in
 * granules that a neighbour pins (`low` and `high`: the parts before the
 * first and after the last granule boundary inside it) and its whole
 * granules between. A free chunk's neighbours are never free, so a part
 * of a granule it does not fill is a neighbour's; region edges lie on
 * boundaries. */
typedef struct free_parts {
    uint64_t low, high, whole;
} free_parts;

static free_parts parts_of(const region *r, const chunk *cc, uint64_t g)
{
    const uint64_t lo = cc->addr - r->base, hi = lo + cc->size;
    const uint64_t up = round_up(lo, g), down = hi / g * g;
    if (down <= up) /* no whole granule: every byte shares one with a neighbour */
        return (free_parts){cc->size, 0, 0};
    return (free_parts){up - lo, hi - down, (down - up) / g};
}

void pool_free_space_locked(const bfc_pool *p, const bfc_stats *st, bfc_free_space *out)
{
    if (!p->opt.vmm) {
        *out = (bfc_free_space){st->free_bytes, st->largest_free_block_bytes, st->fragmentation,
                                0};
        return;
    }
    const uint64_t g = p->opt.map_granularity;
    /* First the granules live and pending blocks pin, which the limit must
     * hold whatever else is mapped; chunks come in address order, so a
     * granule two blocks share is counted once. */
    uint64_t pinned = 0, free_in_pinned = 0, whole = 0;
    for (uint32_t ri = 0; ri < p->nregions; ri++) {
        const region *r = &p->regions[ri];
        uint64_t next_uncounted = 0; /* granule index */
        for (uint32_t c = r->first; c != CHUNK_NIL; c = C(p, c)->next) {
            const chunk *cc = C(p, c);
            if (cc->state == CHUNK_FREE) {
                free_parts fp = parts_of(r, cc, g);
                free_in_pinned += fp.low + fp.high;
                whole += fp.whole;
                continue;
            }
            uint64_t first = (cc->addr - r->base) / g;
            const uint64_t end = (cc->addr + cc->size - r->base + g - 1) / g;
            if (first < next_uncounted)
                first = next_uncounted;
            if (end > first)
                pinned += (end - first) * g;
            next_uncounted = end;
        }
    }
    /* Whole free granules the limit can back beside the pinned ones. */
    const uint64_t room = p->opt.limit_bytes > pinned ? (p->opt.limit_bytes - pinned) / g : 0;
    out->free_bytes = free_in_pinned + (whole < room ? whole : room) * g;
    uint64_t largest = 0;
    for (uint32_t ri = 0; ri < p->nregions; ri++) {
        const region *r = &p->regions[ri];
        for (uint32_t c = r->first; c != CHUNK_NIL; c = C(p, c)->next) {
            const chunk *cc = C(p, c);
            if (cc->state != CHUNK_FREE)
                continue;
            free_parts fp = parts_of(r, cc, g);
            /* The whole chunk when the limit backs all its granules; else a
             * block at one end: that end's pinned part and `room` granules. */
            const uint64_t end_part = fp.low > fp.high ? fp.low : fp.high;
            const uint64_t holds = fp.whole <= room ? cc->size : end_part + room * g;
            if (holds > largest)
                largest = holds;
        }
    }
    out->largest_free_block_bytes = largest;
    out->fragmentation =
        out->free_bytes == 0
            ? 0.0
            : (double)(out->free_bytes - largest) / (double)out->free_bytes;
    out->beyond_limit_bytes = st->free_bytes - out->free_bytes;
}

void bfc_pool_free_space(bfc_pool *p, bfc_free_space *out)
{
    bfc_lock_acquire(&p->lock);
    bfc_stats st;
    pool_stats_locked(p, &st);
    pool_free_space_locked(p, &st, out);
    bfc_lock_release(&p->lock);
}

void bfc_pool_stats(bfc_pool *p, bfc_stats *out)
{
    bfc_lock_acquire(&p->lock);
    pool_stats_locked(p, out);
    bfc_lock_release(&p->lock);
}

void bfc_pool_reset_highs(bfc_pool *p, unsigned which)
{
    bfc_lock_acquire(&p->lock);
    if (which & BFC_HIGH_IN_USE)
        p->st.high_bytes_in_use = p->st.bytes_in_use;
    if (which & BFC_HIGH_POOL)
        p->st.high_pool_bytes = p->st.pool_bytes;
    bfc_lock_release(&p->lock);
}

bool bfc_pool_report_within(bfc_pool *p, bfc_stats *st, bfc_free_space *fs, unsigned max_ms)
{
    if (!bfc_lock_acquire_within(&p->lock, max_ms))
        return false;
    pool_stats_locked(p, st);
    pool_free_space_locked(p, st, fs);
    bfc_lock_release(&p->lock);
    return true;
}

bool bfc_pool_stats_within(bfc_pool *p, bfc_stats *out, unsigned max_ms)
{
    if (!bfc_lock_acquire_within(&p->lock, max_ms))
        return false;
    pool_stats_locked(p, out);
    bfc_lock_release(&p->lock);
    return true;
}
