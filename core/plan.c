/*
 * plan.c - placement from a plan: where an offline packing of a recorded
 * run put each allocation.
 *
 * Online placement cannot see the future: on real traces the first training
 * step's peak decides the smallest pool, and no rule that only knows the
 * past reaches the offline packing's bound there (docs/benchmarks.md). A
 * job that runs again (the next epoch's process, a sweep, a serving
 * replica) repeats its allocation sequence, so a packing of one recorded
 * run is a lookahead for the next.
 *
 * Matching a run to its plan. The plan lists the recorded allocations in
 * order (entry i: a rounded size and an offset from the region's base). A
 * cursor `pos` says where in that list the run is: one past the entry the
 * last planned allocation took. An allocation takes the first entry of its
 * size, not yet taken, that lies within PLAN_WINDOW entries of the cursor
 * on either side; the cursor then moves to just past that entry. Entries
 * of the size left more than PLAN_WINDOW behind the cursor are given up.
 *   - An allocation the recording lacked (a cuBLAS workspace created in
 *     this run and not in that one) finds no entry near the cursor, or
 *     takes a nearby one of its size; the cursor stays, so the allocations
 *     after it find their own entries.
 *   - A recorded allocation the run lacks leaves an entry behind, given up
 *     once the run is PLAN_WINDOW entries past it.
 *   - Allocations that swap places near each other still meet their entries.
 * Keyed instead by (size, occurrence), as this file first was, one extra
 * allocation shifted every later block of its size onto its successor's
 * place for the rest of the run (0.914 against 1.000, docs/benchmarks.md).
 *
 * Allocations the plan does not place. An allocation with no entry near
 * the cursor, or whose planned range is not wholly free, is placed in the
 * spare space above the plan's extent (the highest byte any entry uses),
 * carved from the high end of the smallest free chunk there that holds it:
 * put by the rule in the middle of the planned layout, such a block sits
 * on places later entries need, and each of those displaced blocks
 * displaces more. Only when nothing above the extent holds it does the
 * rule place it.
 *
 * Giving up. A plan of another job (another batch size or model) matches
 * little; following it would scatter blocks over places packed for
 * different lifetimes. Each allocation the plan fails to place adds
 * PLAN_STRAY_COST to a stray score and each planned one takes 1 off; past
 * PLAN_STRAY_LIMIT the plan is abandoned (stats: plan_abandoned) and the
 * rule places everything from then on. A run that goes on past the end of
 * its plan (the cursor at the last entry) is not straying: the rule places
 * what follows, with no spare search.
 *
 *   classes[]  every planned size, sorted (binary search): its entries are
 *              offsets[first .. first + count) and seq[] (their positions
 *              in the recorded order), in recorded order; `next` is the
 *              first entry not yet taken or given up
 *   hint[]     per page of the region, a chunk that was at or near it:
 *              where the walk to the chunk holding an address starts.
 *              Hints go stale as chunks split and merge; a stale one costs
 *              only a longer walk, a recycled record is recognised by its
 *              state, and every lookup refreshes its page's hint. The
 *              table is sized for one region: a growing pool may give its
 *              region back and take another, and the table is then built
 *              again for the new one.
 *
 * A plan applies while the pool has one region (a preallocated pool, or a
 * growing one that has not grown): offsets name places in that region.
 */
#include <stdlib.h>

#include "pool_internal.h"
#include "placement.h"

/* How far (in entries) from the cursor an allocation looks for its entry.
 * Measured on real traces perturbed by swaps, drops and inserts (docs/
 * benchmarks.md): 16 to 256 differ little; 64 leaves room for a
 * framework's reordering of one layer's allocations. */
#define PLAN_WINDOW 64
/* Stray score: +PLAN_STRAY_COST per allocation the plan fails to place,
 * -1 per planned one; past PLAN_STRAY_LIMIT (nine failures in a row, or
 * more than one in nine for long) the plan is abandoned. */
#define PLAN_STRAY_COST 8
#define PLAN_STRAY_LIMIT 64
/* Chunks the spare search looks at above the plan's extent, at most: the
 * spare space holds the few blocks a run adds, and a miss must not cost a
 * walk over the whole pool. */
#define PLAN_SPARE_WALK 256

typedef struct plan_class {
    uint64_t size;
    uint32_t first, count, next;
} plan_class;

struct pool_plan {
    plan_class *classes;
    uint32_t nclasses;
    uint64_t *offsets;
    uint32_t *seq;
    uint64_t nentries;
    uint64_t pos;    /* the cursor: one past the entry last taken */
    uint64_t extent; /* highest byte offset any entry uses, plus one */
    uint32_t stray;  /* stray score */
    bool abandoned;
    uint32_t *hint;
    uint64_t npages;
    unsigned page_shift;
    bfc_addr hint_base; /* the region the hints cover */
    uint64_t hint_size;
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
    free(pl->seq);
    free(pl->hint);
    free(pl);
}

uint64_t plan_host_bytes(const pool_plan *pl)
{
    if (!pl)
        return 0;
    return sizeof *pl + pl->nclasses * sizeof *pl->classes +
           pl->nentries * (sizeof *pl->offsets + sizeof *pl->seq) + pl->npages * sizeof *pl->hint;
}

bfc_status plan_create(const bfc_pool *p, const bfc_plan_entry *e, size_t n, pool_plan **out)
{
    const uint64_t g = p->opt.granularity;
    if (n > UINT32_MAX)
        return BFC_ERR_INVALID; /* positions are 32-bit */
    for (size_t i = 0; i < n; i++)
        if (e[i].size == 0 || e[i].size % g || e[i].offset % g ||
            e[i].size >= BFC_SIZE_LIMIT || e[i].offset >= BFC_SIZE_LIMIT - e[i].size)
            return BFC_ERR_INVALID;
    pool_plan *pl = calloc(1, sizeof *pl);
    const bfc_plan_entry **sorted = malloc((n ? n : 1) * sizeof *sorted);
    if (pl) {
        pl->offsets = malloc((n ? n : 1) * sizeof *pl->offsets);
        pl->classes = malloc((n ? n : 1) * sizeof *pl->classes);
        pl->seq = malloc((n ? n : 1) * sizeof *pl->seq);
    }
    if (!pl || !sorted || !pl->offsets || !pl->classes || !pl->seq) {
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
        pl->seq[i] = (uint32_t)(sorted[i] - e);
        if (sorted[i]->offset + sorted[i]->size > pl->extent)
            pl->extent = sorted[i]->offset + sorted[i]->size;
    }
    pl->nentries = n;
    free(sorted);
    *out = pl;
    return BFC_OK;
}

/* The hint table covers the region the plan applies to; built on first use,
 * once the pool has its region, and again if that region was replaced. At
 * most 2^16 pages: 256 KiB of hints. */
static bool plan_pages(pool_plan *pl, const region *r)
{
    if (pl->hint && pl->hint_base == r->base && pl->hint_size == r->size)
        return true;
    free(pl->hint);
    pl->hint = NULL;
    pl->npages = 0;
    unsigned shift = 21;
    while ((r->size >> shift) >= (UINT64_C(1) << 16))
        shift++;
    pl->page_shift = shift;
    pl->npages = (r->size >> shift) + 1;
    pl->hint = calloc(pl->npages, sizeof *pl->hint);
    if (!pl->hint) {
        pl->npages = 0;
        return false;
    }
    pl->hint_base = r->base;
    pl->hint_size = r->size;
    return true;
}

/* Following the plan: not abandoned, and the cursor not past its end. */
static bool plan_active(const pool_plan *pl)
{
    return !pl->abandoned && pl->pos < pl->nentries;
}

void plan_record(pool_plan *pl, bool placed)
{
    if (placed)
        pl->stray -= pl->stray > 0;
    else if (plan_active(pl) && (pl->stray += PLAN_STRAY_COST) > PLAN_STRAY_LIMIT)
        pl->abandoned = true;
}

bool plan_abandoned(const pool_plan *pl) { return pl && pl->abandoned; }

bool plan_next(pool_plan *pl, uint64_t rounded, uint64_t *offset)
{
    if (pl->abandoned)
        return false;
    uint32_t lo = 0, hi = pl->nclasses;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (pl->classes[mid].size < rounded)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < pl->nclasses && pl->classes[lo].size == rounded) {
        plan_class *k = &pl->classes[lo];
        const uint32_t *seq = pl->seq + k->first;
        while (k->next < k->count && seq[k->next] + (uint64_t)PLAN_WINDOW < pl->pos)
            k->next++; /* left behind: the run lacked these */
        if (k->next < k->count && seq[k->next] < pl->pos + PLAN_WINDOW) {
            pl->pos = seq[k->next] + 1;
            *offset = pl->offsets[k->first + k->next++];
            return true;
        }
    }
    return false;
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

uint32_t plan_spare_chunk(const bfc_pool *p, pool_plan *pl, uint64_t rounded, bfc_addr *at)
{
    /* Over vmm only while the pool is laid out as one region, whose spare
     * space is mapped; once it overflowed, the spare space is unmapped
     * address space, and the rule's preference for mapped memory matters
     * more. */
    if (p->opt.vmm && !p->as_one_region)
        return CHUNK_NIL;
    const region *r = &p->regions[0];
    if (!plan_active(pl) || pl->extent >= r->size || !plan_pages(pl, r))
        return CHUNK_NIL;
    const bfc_addr lo = r->base + pl->extent;
    uint32_t best = CHUNK_NIL;
    unsigned walked = 0;
    for (uint32_t c = chunk_holding(p, pl, r, lo); c != CHUNK_NIL && walked < PLAN_SPARE_WALK;
         c = C(p, c)->next, walked++) {
        const chunk *cc = C(p, c);
        const uint64_t end = cc->addr + cc->size;
        if (cc->state == CHUNK_FREE && end - (cc->addr > lo ? cc->addr : lo) >= rounded &&
            (best == CHUNK_NIL || cc->size < C(p, best)->size))
            best = c;
    }
    if (best != CHUNK_NIL)
        *at = C(p, best)->addr + C(p, best)->size - rounded;
    return best;
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
