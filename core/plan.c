/*
 * plan.c - placement from a plan: where an offline packing of a recorded
 * run put each allocation.
 *
 * Online placement cannot see the future: on real traces the first training
 * step's peak decides the smallest pool, and no rule that only knows the
 * past reaches the offline packing's bound there (docs/benchmarks.md). A
 * job that runs again (the next epoch's process, a sweep, a serving
 * replica) repeats its allocation sequence, so a packing of one recorded
 * run is a lookahead for the next. The plan names, for the n-th allocation
 * of each rounded size, an offset from the base of the pool's region.
 *
 * Keyed by (size, occurrence) rather than by position in the sequence, the
 * plan survives a run that interleaves sizes differently or adds an
 * allocation here and there: only the sizes whose counts drift lose their
 * places. When the planned range is not wholly free (the run has strayed)
 * or the plan has no entry left for the size, the allocation falls back to
 * the pool's placement rule; nothing is ever refused because of a plan.
 *
 *   classes[]  every planned size, sorted (binary search): its entries are
 *              offsets[first .. first + count), in recorded order, and
 *              `next` counts the allocations of that size so far
 *   hint[]     per page of the region, a chunk that was at or near it:
 *              where the walk to the chunk holding an address starts.
 *              Hints go stale as chunks split and merge; a stale one costs
 *              only a longer walk, a recycled record is recognised by its
 *              state, and every lookup refreshes its page's hint.
 *
 * A plan applies while the pool has one region (a preallocated pool, or a
 * growing one that has not grown): offsets name places in that region.
 */
#include <stdlib.h>

#include "pool_internal.h"

typedef struct plan_class {
    uint64_t size;
    uint32_t first, count, next;
} plan_class;

struct pool_plan {
    plan_class *classes;
    uint32_t nclasses;
    uint64_t *offsets;
    uint64_t nentries;
    uint32_t *hint;
    uint64_t npages;
    unsigned page_shift;
};

static int by_size_then_order(const void *a, const void *b)
{
    const bfc_plan_entry *x = *(const bfc_plan_entry *const *)a;
    const bfc_plan_entry *y = *(const bfc_plan_entry *const *)b;
    if (x->size != y->size)
        return x->size < y->size ? -1 : 1;
    return x < y ? -1 : x > y; /* recorded order among equal sizes */
}

void plan_destroy(pool_plan *pl)
{
    if (!pl)
        return;
    free(pl->classes);
    free(pl->offsets);
    free(pl->hint);
    free(pl);
}

uint64_t plan_host_bytes(const pool_plan *pl)
{
    if (!pl)
        return 0;
    return sizeof *pl + pl->nclasses * sizeof *pl->classes +
           pl->nentries * sizeof *pl->offsets + pl->npages * sizeof *pl->hint;
}

bfc_status plan_create(const bfc_pool *p, const bfc_plan_entry *e, size_t n, pool_plan **out)
{
    const uint64_t g = p->opt.granularity;
    for (size_t i = 0; i < n; i++)
        if (e[i].size == 0 || e[i].size % g || e[i].offset % g ||
            e[i].size > BFC_MAX_ALLOC_BYTES || e[i].offset > BFC_MAX_ALLOC_BYTES - e[i].size)
            return BFC_ERR_INVALID;
    pool_plan *pl = calloc(1, sizeof *pl);
    const bfc_plan_entry **sorted = malloc((n ? n : 1) * sizeof *sorted);
    if (pl) {
        pl->offsets = malloc((n ? n : 1) * sizeof *pl->offsets);
        pl->classes = malloc((n ? n : 1) * sizeof *pl->classes);
    }
    if (!pl || !sorted || !pl->offsets || !pl->classes) {
        free(sorted);
        plan_destroy(pl);
        return BFC_ERR_HOST_MEMORY;
    }
    for (size_t i = 0; i < n; i++)
        sorted[i] = &e[i];
    qsort(sorted, n, sizeof *sorted, by_size_then_order);
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || sorted[i]->size != sorted[i - 1]->size)
            pl->classes[pl->nclasses++] = (plan_class){.size = sorted[i]->size,
                                                       .first = (uint32_t)i};
        pl->classes[pl->nclasses - 1].count++;
        pl->offsets[i] = sorted[i]->offset;
    }
    pl->nentries = n;
    free(sorted);
    *out = pl;
    return BFC_OK;
}

/* The hint table covers the region the plan applies to; built on first use,
 * once the pool has its region. At most 2^16 pages: 256 KiB of hints. */
static bool plan_pages(pool_plan *pl, const region *r)
{
    if (pl->hint)
        return true;
    unsigned shift = 21;
    while ((r->size >> shift) >= (UINT64_C(1) << 16))
        shift++;
    pl->page_shift = shift;
    pl->npages = (r->size >> shift) + 1;
    pl->hint = calloc(pl->npages, sizeof *pl->hint);
    return pl->hint != NULL;
}

bool plan_next(pool_plan *pl, uint64_t rounded, uint64_t *offset)
{
    uint32_t lo = 0, hi = pl->nclasses;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (pl->classes[mid].size < rounded)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == pl->nclasses || pl->classes[lo].size != rounded)
        return false;
    plan_class *k = &pl->classes[lo];
    if (k->next >= k->count)
        return false;
    *offset = pl->offsets[k->first + k->next++];
    return true;
}

/* The chunk of region r holding address a, walked to from the page's hint. */
static uint32_t chunk_holding(const bfc_pool *p, pool_plan *pl, const region *r, bfc_addr a)
{
    uint32_t *hint = &pl->hint[(a - r->base) >> pl->page_shift];
    uint32_t c = *hint;
    if (c == CHUNK_NIL || c >= p->chunks.high || C(p, c)->state == CHUNK_UNUSED ||
        C(p, c)->addr - r->base >= r->size)
        c = r->first;
    while (C(p, c)->addr > a)
        c = C(p, c)->prev;
    while (a - C(p, c)->addr >= C(p, c)->size)
        c = C(p, c)->next;
    *hint = c;
    return c;
}

uint32_t plan_free_chunk_at(const bfc_pool *p, pool_plan *pl, uint64_t offset,
                            uint64_t rounded, bfc_addr *at)
{
    const region *r = &p->regions[0];
    if (offset >= r->size || rounded > r->size - offset ||
        !plan_pages(pl, r))
        return CHUNK_NIL;
    const bfc_addr lo = r->base + offset;
    const uint32_t c = chunk_holding(p, pl, r, lo);
    const chunk *cc = C(p, c);
    if (cc->state != CHUNK_FREE || lo + rounded > cc->addr + cc->size)
        return CHUNK_NIL;
    *at = lo;
    return c;
}

bfc_status bfc_pool_set_plan(bfc_pool *p, const bfc_plan_entry *e, size_t n)
{
    if (n && !e)
        return BFC_ERR_INVALID;
    pool_plan *pl = NULL;
    /* Built outside the lock: a large plan sorts for milliseconds. */
    bfc_status s = n ? plan_create(p, e, n, &pl) : BFC_OK;
    if (s != BFC_OK)
        return s;
    bfc_lock_acquire(&p->lock);
    pool_plan *old = p->plan;
    p->plan = pl;
    bfc_lock_release(&p->lock);
    plan_destroy(old);
    return BFC_OK;
}
