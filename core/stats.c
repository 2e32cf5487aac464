/*
 * stats.c - a snapshot of the pool's counters plus the figures derived from
 * its structures (largest free block, fragmentation, host memory held).
 */
#include "pool_internal.h"

void pool_stats_locked(const bfc_pool *p, bfc_stats *out)
{
    *out = p->st;
    uint32_t largest = bins_largest(&p->free_bins, &p->chunks);
    out->largest_free_block_bytes = largest == CHUNK_NIL ? 0 : C(p, largest)->size;
    out->free_bytes = pool_free_bytes(p);
    out->num_free_chunks = pool_free_chunks(p);
    out->num_chunks = p->chunks.used;
    out->num_regions = p->nregions;
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

bool bfc_pool_stats_within(bfc_pool *p, bfc_stats *out, unsigned max_ms)
{
    if (!bfc_lock_acquire_within(&p->lock, max_ms))
        return false;
    pool_stats_locked(p, out);
    bfc_lock_release(&p->lock);
    return true;
}
