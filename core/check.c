/*
 * check.c - the invariant checker. Tests call it after every operation; it
 * walks every structure and recounts every statistic, so it is O(n log n) in
 * the number of chunks and meant for tests and debugging, not production.
 *
 * What it proves (see pool_internal.h for why each must hold):
 *   regions   sorted, disjoint, non-empty, summing to pool_bytes
 *   tiling    each region's chunk list starts at its base, links both ways,
 *             leaves no gap and ends exactly at its end
 *   chunks    sizes and addresses are multiples of the granularity, sizes
 *             below BFC_SIZE_LIMIT; a FREE chunk never has a FREE neighbour;
 *             an ALLOCATED chunk's size is its rounded request plus less
 *             than one split's worth
 *   indexes   each FREE chunk is in the free bins under its size class, each
 *             ALLOCATED one in the address map, each PENDING one in its
 *             lane's FIFO (and bins); nothing else is in any of them; bitmaps
 *             mark exactly the non-empty bins; trees are valid red-black trees
 *   lanes     FIFO links agree both ways; tokens never decrease; an open
 *             epoch is its lane's newest token (its blocks the FIFO's tail)
 *             and no newer than the pool's counter; a closed slot is blank
 *   store     every record is either handed out or on the free list
 *   backing   (vmm) every region has a bitmap and every byte of an allocated
 *             or pending chunk lies in a mapped granule; mapped granules add
 *             up to pool_bytes, regions to va_bytes
 *   stats     every counter equals a recount; peaks hold; loans stay within
 *             the limit and add up with it
 */
#include <inttypes.h>
#include <stdarg.h>

#include "chunk_tree.h"
#include "pool_internal.h"

#define MAX_REPORTS 8

typedef struct checker {
    FILE *err;
    size_t violations;
} checker;

__attribute__((format(printf, 2, 3))) static void fail(checker *k, const char *fmt, ...)
{
    if (k->err && k->violations < MAX_REPORTS) {
        va_list ap;
        va_start(ap, fmt);
        fputs("bfc check: ", k->err);
        vfprintf(k->err, fmt, ap);
        fputc('\n', k->err);
        va_end(ap);
    }
    k->violations++;
}

typedef struct recount {
    uint64_t chunks, free_chunks, free_bytes, alloc_chunks, alloc_bytes,
        requested, pending_chunks, pending_bytes, region_bytes, mapped_bytes;
} recount;

/* Is handle c reachable in the tree of its own size class? */
static bool in_bin(const bfc_pool *p, const bin_set *b, uint32_t c)
{
    const chunk *cc = C(p, c);
    uint32_t x = b->root[bin_index(cc->size)];
    while (x != CHUNK_NIL) {
        if (x == c)
            return true;
        x = chunk_less(cc, C(p, x)) ? C(p, x)->left : C(p, x)->right;
    }
    return false;
}

/* Checks one set of bins; *counted and *counted_bytes receive what its trees
 * hold, for the caller to compare with what should be there. */
static void check_bin_set(const bfc_pool *p, const bin_set *b, const char *name,
                          uint8_t state, uint32_t lane_id, uint64_t *counted,
                          uint64_t *counted_bytes, checker *k)
{
    uint64_t count = 0, bytes = 0, summary = 0;
    for (uint32_t bin = 0; bin < BIN_COUNT; bin++) {
        uint32_t root = b->root[bin];
        bool marked = b->words[bin >> 6] >> (bin & 63) & 1;
        if (marked != (root != CHUNK_NIL))
            fail(k, "%s: bitmap bit of bin %u is %d but the bin is %s", name, bin,
                 marked, root ? "non-empty" : "empty");
        if (b->words[bin >> 6])
            summary |= UINT64_C(1) << (bin >> 6);
        if (root == CHUNK_NIL) {
            if (b->first[bin] != CHUNK_NIL)
                fail(k, "%s: empty bin %u caches first chunk %u", name, bin,
                     b->first[bin]);
            continue;
        }
        FILE *err = k->violations < MAX_REPORTS ? k->err : NULL;
        long n = tree_validate(&p->chunks, root, err);
        if (n < 0) {
            fail(k, "%s: bin %u tree is broken", name, bin);
            continue;
        }
        if (b->first[bin] != tree_first(&p->chunks, root))
            fail(k, "%s: bin %u caches first %u, tree says %u", name, bin,
                 b->first[bin], tree_first(&p->chunks, root));
        for (uint32_t c = tree_first(&p->chunks, root); c != CHUNK_NIL;
             c = tree_next(&p->chunks, c)) {
            const chunk *cc = C(p, c);
            if (bin_index(cc->size) != bin)
                fail(k, "%s: chunk %u of size %" PRIu64 " filed in bin %u, belongs in %u",
                     name, c, cc->size, bin, bin_index(cc->size));
            if (cc->state != state || (state == CHUNK_PENDING && cc->lane != lane_id))
                fail(k, "%s: bin %u holds chunk %u in state %u lane %u", name, bin, c,
                     cc->state, cc->lane);
            count++;
            bytes += cc->size;
        }
    }
    if (summary != b->summary)
        fail(k, "%s: summary word %#" PRIx64 ", bitmap says %#" PRIx64, name,
             b->summary, summary);
    *counted = count;
    *counted_bytes = bytes;
}

static void check_chunk(const bfc_pool *p, uint32_t c, recount *n, checker *k)
{
    const chunk *cc = C(p, c);
    const uint64_t g = p->opt.granularity;
    if (cc->size == 0 || cc->size % g || cc->addr % g)
        fail(k, "chunk %u at 0x%" PRIx64 " size %" PRIu64 " breaks granularity %" PRIu64,
             c, cc->addr, cc->size, g);
    if (cc->size >= BFC_SIZE_LIMIT) {
        /* No bin holds it; looking one up would index past the bins. */
        fail(k, "chunk %u at 0x%" PRIx64 " size %" PRIu64 " is not below BFC_SIZE_LIMIT", c,
             cc->addr, cc->size);
        return;
    }
    n->chunks++;
    switch (cc->state) {
    case CHUNK_FREE:
        n->free_chunks++;
        n->free_bytes += cc->size;
        if (cc->prev != CHUNK_NIL && C(p, cc->prev)->state == CHUNK_FREE)
            fail(k, "free chunks %u and %u are neighbours (not coalesced)", cc->prev, c);
        if (!in_bin(p, &p->free_bins, c))
            fail(k, "free chunk %u (size %" PRIu64 ") is not in its bin", c, cc->size);
        break;
    case CHUNK_ALLOCATED: {
        n->alloc_chunks++;
        n->alloc_bytes += cc->size;
        n->requested += cc->requested;
        uint64_t rounded = round_up(cc->requested, g);
        uint64_t slack = p->opt.min_split_bytes > g ? p->opt.min_split_bytes : g;
        if (p->opt.tsl_split) /* unsplit below 2x, or a remainder under 128 MiB */
            slack = rounded > BFC_TSL_MAX_INTERNAL_FRAGMENTATION
                        ? BFC_TSL_MAX_INTERNAL_FRAGMENTATION
                        : rounded;
        if (cc->requested == 0 || rounded > cc->size || cc->size - rounded >= slack)
            fail(k, "allocated chunk %u: size %" PRIu64 " for a request of %" PRIu64,
                 c, cc->size, cc->requested);
        if (live_index_find(&p->live, &p->chunks, cc->addr) != c)
            fail(k, "allocated chunk %u at 0x%" PRIx64 " missing from the address map",
                 c, cc->addr);
        break;
    }
    case CHUNK_PENDING: {
        n->pending_chunks++;
        n->pending_bytes += cc->size;
        const lane *l = cc->lane < p->nlanes ? &p->lanes[cc->lane] : NULL;
        if (!l || !l->open)
            fail(k, "pending chunk %u names lane %u, which is not open", c, cc->lane);
        else if (l->bins && !in_bin(p, l->bins, c))
            fail(k, "pending chunk %u is not in lane %u's bins", c, cc->lane);
        break;
    }
    default:
        fail(k, "chunk %u in a region has state %u", c, cc->state);
    }
}

static void check_regions(const bfc_pool *p, recount *n, checker *k)
{
    for (uint32_t r = 0; r < p->nregions; r++) {
        const region *rg = &p->regions[r];
        n->region_bytes += rg->size;
        if (rg->size == 0)
            fail(k, "region %u is empty", r);
        if (p->opt.vmm != (rg->backed != NULL))
            fail(k, "region %u %s a mapping bitmap", r, rg->backed ? "has" : "lacks");
        if (rg->backed) {
            if (rg->base % p->opt.map_granularity || rg->size % p->opt.map_granularity)
                fail(k, "region %u is not made of whole map granules", r);
            n->mapped_bytes += backing_count(p, rg);
            if (rg->backed_to < rg->base || rg->backed_to > rg->base + rg->size ||
                (rg->backed_to > rg->base && !backing_covers(p, rg, rg->base, rg->backed_to)))
                fail(k, "region %u: mapped prefix to 0x%" PRIx64 " is not all mapped", r,
                     rg->backed_to);
        }
        if (r > 0 && p->regions[r - 1].base + p->regions[r - 1].size > rg->base)
            fail(k, "regions %u and %u overlap or are out of order", r - 1, r);
        uint32_t c = rg->first, prev = CHUNK_NIL;
        uint64_t at = rg->base, steps = 0;
        while (c != CHUNK_NIL) {
            const chunk *cc = C(p, c);
            if (++steps > p->chunks.used) {
                fail(k, "region %u: chunk list does not end (cycle)", r);
                return;
            }
            if (cc->prev != prev)
                fail(k, "region %u: chunk %u has prev %u, expected %u", r, c, cc->prev,
                     prev);
            if (cc->addr != at)
                fail(k, "region %u: chunk %u starts at 0x%" PRIx64 ", expected 0x%" PRIx64,
                     r, c, cc->addr, at);
            check_chunk(p, c, n, k);
            if (rg->backed && cc->state != CHUNK_FREE && cc->addr == at &&
                cc->addr + cc->size <= rg->base + rg->size &&
                !backing_covers(p, rg, cc->addr, cc->addr + cc->size))
                fail(k, "region %u: %s chunk %u at 0x%" PRIx64 " (%" PRIu64
                     " bytes) is not wholly mapped",
                     r, cc->state == CHUNK_PENDING ? "pending" : "allocated", c, cc->addr,
                     cc->size);
            at = cc->addr + cc->size;
            prev = c;
            c = cc->next;
        }
        if (at != rg->base + rg->size)
            fail(k, "region %u: chunks end at 0x%" PRIx64 ", region at 0x%" PRIx64, r, at,
                 rg->base + rg->size);
    }
}

static void check_lanes(const bfc_pool *p, checker *k)
{
    uint32_t open_epochs = 0;
    if (p->nlanes == 0 || p->lanes[0].open)
        fail(k, "lane slot 0 must exist and stay closed");
    for (uint32_t id = 1; id < p->nlanes; id++) {
        const lane *l = &p->lanes[id];
        if (!l->open) {
            /* A recycled slot must open as bfc_pool_lane_open makes it:
             * eager, accepting, no tokens behind it. */
            if (l->head || l->tail || l->count || l->bytes || l->bins || l->open_token ||
                l->accepting || l->lazy || l->last_token)
                fail(k, "closed lane %u still holds state", id);
            continue;
        }
        uint64_t count = 0, bytes = 0, token = 0;
        uint32_t prev = CHUNK_NIL;
        for (uint32_t c = l->head; c != CHUNK_NIL; c = C(p, c)->qnext) {
            const chunk *cc = C(p, c);
            if (++count > p->chunks.used) {
                fail(k, "lane %u: FIFO does not end (cycle)", id);
                return;
            }
            if (cc->state != CHUNK_PENDING || cc->lane != id)
                fail(k, "lane %u: FIFO holds chunk %u in state %u of lane %u", id, c,
                     cc->state, cc->lane);
            if (cc->qprev != prev)
                fail(k, "lane %u: chunk %u has qprev %u, expected %u", id, c, cc->qprev,
                     prev);
            if (cc->stamp < token || cc->stamp > l->last_token)
                fail(k, "lane %u: token %" PRIu64 " out of order", id, cc->stamp);
            token = cc->stamp;
            bytes += cc->size;
            prev = c;
        }
        if (l->tail != prev)
            fail(k, "lane %u: tail %u, FIFO ends at %u", id, l->tail, prev);
        if (count != l->count || bytes != l->bytes)
            fail(k, "lane %u: FIFO holds %" PRIu64 " chunks / %" PRIu64
                 " bytes, counters say %" PRIu64 " / %" PRIu64,
                 id, count, bytes, l->count, l->bytes);
        if (l->bins) {
            char name[32];
            snprintf(name, sizeof name, "lane %u bins", id);
            uint64_t in_bins, bytes_in_bins;
            check_bin_set(p, l->bins, name, CHUNK_PENDING, id, &in_bins, &bytes_in_bins, k);
            if (in_bins != l->count || bytes_in_bins != l->bytes)
                fail(k, "lane %u: bins hold %" PRIu64 " chunks / %" PRIu64
                     " bytes, FIFO %" PRIu64 " / %" PRIu64,
                     id, in_bins, bytes_in_bins, l->count, l->bytes);
        }
        if (!l->accepting && l->head == CHUNK_NIL && !l->open_token)
            fail(k, "lane %u is closed and empty but its slot was not recycled", id);
        if (l->open_token) {
            open_epochs++;
            /* The open epoch is the lane's newest token (deferred frees and
             * moved epochs both set last_token to it), so with the FIFO in
             * token order its blocks are the FIFO's tail: a seal fences
             * them all, and move_open_epoch finds them there. It was drawn
             * from the pool's counter, which never goes back. */
            if (l->open_token != l->last_token || l->open_token > p->token_counter)
                fail(k, "lane %u: open epoch %" PRIu64 " is not its newest token %" PRIu64
                     " (counter %" PRIu64 ")", id, l->open_token, l->last_token,
                     p->token_counter);
        }
    }
    if (open_epochs != p->open_epochs)
        fail(k, "%u lanes have open epochs, the pool counts %u", open_epochs, p->open_epochs);
}

static void check_store(const bfc_pool *p, checker *k)
{
    uint64_t spare = 0;
    for (uint32_t c = p->chunks.free_head; c != CHUNK_NIL; c = C(p, c)->qnext) {
        if (c >= p->chunks.high || C(p, c)->state != CHUNK_UNUSED) {
            fail(k, "record %u on the store's free list is in use or never handed out", c);
            return;
        }
        if (++spare > p->chunks.high) {
            fail(k, "store free list does not end (cycle)");
            return;
        }
    }
    if (spare + p->chunks.used + 1 != p->chunks.high)
        fail(k, "store: %" PRIu64 " spare + %u used + sentinel != %u handed out", spare,
             p->chunks.used, p->chunks.high);
    if (p->chunks.high > p->chunks.cap)
        fail(k, "store: %u records handed out, capacity %u", p->chunks.high, p->chunks.cap);
    const chunk *nil = C(p, CHUNK_NIL);
    if (nil->red || nil->left || nil->right || nil->size || nil->addr)
        fail(k, "the sentinel record was modified");
}

static void expect(checker *k, const char *what, uint64_t counter, uint64_t recount)
{
    if (counter != recount)
        fail(k, "stat %s is %" PRIu64 ", recount says %" PRIu64, what, counter, recount);
}

static void check_stats(const bfc_pool *p, const recount *n, checker *k)
{
    const bfc_stats *s = &p->st;
    expect(k, "bytes_in_use", s->bytes_in_use, n->alloc_bytes);
    expect(k, "bytes_requested", s->bytes_requested, n->requested);
    expect(k, "pool_bytes", s->pool_bytes, p->opt.vmm ? n->mapped_bytes : n->region_bytes);
    expect(k, "va_bytes", s->va_bytes, n->region_bytes);
    expect(k, "pending_bytes", s->pending_bytes, n->pending_bytes);
    expect(k, "num_pending_chunks", s->num_pending_chunks, n->pending_chunks);
    expect(k, "live allocations (num_allocs - num_frees)", s->num_allocs - s->num_frees,
           n->alloc_chunks);
    expect(k, "address map entries", p->live.count, n->alloc_chunks);
    expect(k, "records handed out", p->chunks.used, n->chunks);
    expect(k, "free chunks (derived)", pool_free_chunks(p), n->free_chunks);
    expect(k, "free bytes (derived)", pool_free_bytes(p), n->free_bytes);
    if (s->peak_bytes_in_use < s->bytes_in_use || s->peak_pool_bytes < s->pool_bytes ||
        s->peak_bytes_requested < s->bytes_requested)
        fail(k, "a peak is below its current value");
    if (s->high_bytes_in_use < s->bytes_in_use || s->high_pool_bytes < s->pool_bytes ||
        s->high_bytes_in_use > s->peak_bytes_in_use || s->high_pool_bytes > s->peak_pool_bytes)
        fail(k, "a high-water mark is below its current value or above its peak");
    if (s->pool_bytes > p->opt.limit_bytes)
        fail(k, "pool holds %" PRIu64 " bytes, above its limit %" PRIu64, s->pool_bytes,
             p->opt.limit_bytes);
    /* Loans: never more than the configured limit, and the peak holds. */
    if (s->bytes_lent > s->bytes_limit || s->peak_bytes_lent < s->bytes_lent)
        fail(k, "%" PRIu64 " bytes lent (peak %" PRIu64 ") of a limit of %" PRIu64,
             s->bytes_lent, s->peak_bytes_lent, s->bytes_limit);
    if (!p->abandoned && p->opt.limit_bytes + s->bytes_lent != s->bytes_limit)
        fail(k, "limit %" PRIu64 " and loans %" PRIu64 " do not add up to the configured %" PRIu64,
             p->opt.limit_bytes, s->bytes_lent, s->bytes_limit);
    if (n->alloc_bytes + n->free_bytes + n->pending_bytes != n->region_bytes)
        fail(k, "allocated + free + pending bytes do not add up to the regions");
}

size_t bfc_pool_check(bfc_pool *p, FILE *err)
{
    checker k = {.err = err, .violations = 0};
    recount n = {0};
    bfc_lock_acquire(&p->lock);
    check_regions(p, &n, &k);
    uint64_t in_bins, bytes_in_bins;
    check_bin_set(p, &p->free_bins, "free bins", CHUNK_FREE, 0, &in_bins, &bytes_in_bins, &k);
    if (in_bins != n.free_chunks || bytes_in_bins != n.free_bytes)
        fail(&k, "free bins hold %" PRIu64 " chunks / %" PRIu64 " bytes, the regions %" PRIu64
             " free chunks / %" PRIu64 " bytes", in_bins, bytes_in_bins, n.free_chunks,
             n.free_bytes);
    check_lanes(p, &k);
    check_store(p, &k);
    check_stats(p, &n, &k);
    bfc_lock_release(&p->lock);
    return k.violations;
}
