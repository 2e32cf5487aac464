/*
 * regions.c - obtaining regions from the backend and giving them back.
 *
 * Policy, as in TSL's BFC:
 *   - preallocation: the first region asks for the whole limit;
 *   - growth: regions start at initial_region_bytes and each new one is at
 *     least twice the largest so far, never less than the request, never past
 *     the limit;
 *   - back-off: when the backend refuses, ask again for 90% of the size, down
 *     to what the request itself needs (another process may hold memory);
 *   - garbage collection: regions that hold only one free chunk go back to
 *     the backend, so a later, larger region can take their place.
 * Region sizes are rounded to region_granularity (the driver hands memory out
 * in 2 MiB granules, so asking for less would only hide the waste).
 */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"
#include "placement.h"

int region_find(const bfc_pool *p, bfc_addr addr)
{
    uint32_t lo = 0, hi = p->nregions;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const region *r = &p->regions[mid];
        if (addr < r->base)
            hi = mid;
        else if (addr - r->base >= r->size)
            lo = mid + 1;
        else
            return (int)mid;
    }
    return -1;
}

static bool overlaps_existing(const bfc_pool *p, bfc_addr base, uint64_t size)
{
    for (uint32_t i = 0; i < p->nregions; i++) {
        const region *r = &p->regions[i];
        if (base < r->base + r->size && r->base < base + size)
            return true;
    }
    return false;
}

static bool regions_reserve(bfc_pool *p)
{
    if (p->nregions < p->regions_cap)
        return true;
    uint32_t cap = p->regions_cap ? p->regions_cap * 2 : 8;
    region *t = realloc(p->regions, cap * sizeof *t);
    if (!t)
        return false;
    p->regions = t;
    p->regions_cap = cap;
    return true;
}

static uint64_t first_request_bytes(const bfc_pool *p, uint64_t need, uint64_t avail)
{
    uint64_t want;
    if (p->nregions == 0 && p->opt.preallocate)
        want = avail;
    else
        want = need > p->next_region_bytes ? need : p->next_region_bytes;
    /* Clipped before it is rounded: an initial region near 2^64
     * (BFCSHIM_INITIAL_REGION takes any size) wrapped to 0 when rounded up. */
    if (want > avail)
        want = avail;
    want = round_up(want, p->opt.region_granularity);
    return want > avail ? avail : want;
}

/* Files a new region [base, base + size), one free chunk, in address order
 * (room for both reserved by the caller); returns it. */
static region *region_insert(bfc_pool *p, bfc_addr base, uint64_t size, uint64_t *backed)
{
    uint32_t c = chunk_new(&p->chunks);
    chunk *cc = C(p, c);
    cc->addr = base;
    cc->size = size;
    cc->state = CHUNK_FREE;
    bins_insert(&p->free_bins, &p->chunks, c);

    uint32_t at = 0;
    while (at < p->nregions && p->regions[at].base < base)
        at++;
    memmove(&p->regions[at + 1], &p->regions[at],
            (p->nregions - at) * sizeof(region));
    p->regions[at] =
        (region){.base = base, .size = size, .first = c, .backed = backed, .backed_to = base};
    p->nregions++;
    p->st.num_region_allocs++;
    p->st.va_bytes += size;
    return &p->regions[at];
}

/*
 * vmm: a new reservation of address space, va_bytes (or what the request
 * needs). It costs no device memory, so the limit does not apply here; it
 * applies when granules are mapped. With preallocation, the first
 * reservation maps the whole limit at once (or, when the device cannot give
 * that much now, nothing: the pool then grows on demand); laid out as one
 * region (as_one_region), it is the limit itself, and the next reservation
 * is the first overflow, from which on placement follows the rules of
 * virtual memory.
 */
static bool region_reserve_va(bfc_pool *p, uint64_t rounded)
{
    const uint64_t g = p->opt.map_granularity;
    if (rounded > p->opt.limit_bytes)
        return false; /* could never be mapped */
    /* The reservation is one free chunk at first: below BFC_SIZE_LIMIT, the
     * bins' range (g divides the limit, so the largest such is limit - g). */
    const uint64_t most = BFC_SIZE_LIMIT - g;
    const uint64_t need = round_up(rounded, g);
    if (need > most)
        return false;
    uint64_t want = round_up(p->opt.va_bytes ? p->opt.va_bytes : 2 * p->opt.limit_bytes, g);
    if (want > most)
        want = most;
    const bool first = p->nregions == 0;
    const uint64_t whole_limit = p->opt.limit_bytes / g * g; /* what can be mapped */
    if (first && p->as_one_region && whole_limit)
        want = whole_limit;
    if (want < need)
        want = need;
    bfc_addr base = 0;
    /* Address space is cheap but not unlimited: when the range is refused,
     * halve it, down to what the request needs. */
    while (p->backend.region_alloc(p->backend.ctx, want, &base) != 0) {
        p->st.num_region_alloc_failures++;
        if (want == need)
            return false;
        want = want / 2 / g * g > need ? want / 2 / g * g : need;
    }
    region r = {.base = base, .size = want};
    if (base == 0 || base % g != 0 || overlaps_existing(p, base, want) || !backing_init(p, &r)) {
        p->st.num_region_alloc_failures++;
        p->backend.region_free(p->backend.ctx, base, want);
        return false;
    }
    region *in = region_insert(p, base, want, r.backed);
    if (!first && p->as_one_region) {
        p->as_one_region = false;
        place_set_rules(p);
    }
    if (first && p->opt.preallocate) {
        const uint64_t whole = whole_limit < want ? whole_limit : want;
        if (whole)
            backing_map(p, in, base, base + whole);
    }
    return true;
}

/* Adds a region able to hold `rounded` bytes. False when the limit or the
 * backend says no, or host memory runs out (then nothing changed). */
bool region_extend(bfc_pool *p, uint64_t rounded)
{
    if (p->opt.vmm)
        return regions_reserve(p) && chunk_store_reserve(&p->chunks, 1) &&
               region_reserve_va(p, rounded);
    /* Regions are whole granules (every chunk is), and the limit need not
     * be: a configured one, or what a loan leaves of it. Clipped to the
     * limit itself, the last region ended off the granularity, and a block
     * carved from its top started there. pool_bytes is whole granules and
     * at most the limit, so at most the limit rounded down. */
    const uint64_t g = p->opt.granularity;
    uint64_t avail = p->opt.limit_bytes / g * g - p->st.pool_bytes;
    if (rounded > avail)
        return false;
    if (!regions_reserve(p) || !chunk_store_reserve(&p->chunks, 1))
        return false;
    uint64_t need = round_up(rounded, p->opt.region_granularity);
    if (need > avail)
        need = avail;
    uint64_t want = first_request_bytes(p, need, avail);
    bfc_addr base = 0;
    for (;;) {
        if (p->backend.region_alloc(p->backend.ctx, want, &base) == 0) {
            if (base != 0 && base % p->opt.granularity == 0 &&
                !overlaps_existing(p, base, want))
                break;
            /* A region we cannot use: hand it straight back. */
            p->backend.region_free(p->backend.ctx, base, want);
        }
        p->st.num_region_alloc_failures++;
        if (want == need)
            return false;
        uint64_t smaller = want / 10 * 9 / p->opt.region_granularity *
                           p->opt.region_granularity;
        want = smaller > need ? smaller : need;
    }

    region_insert(p, base, want, NULL);
    p->st.pool_bytes += want;
    pool_note_pool_bytes(p);
    uint64_t grown = (want > p->next_region_bytes ? want : p->next_region_bytes);
    p->next_region_bytes = grown > UINT64_MAX / 2 ? grown : grown * 2;
    return true;
}

static void drop_region(bfc_pool *p, uint32_t i)
{
    region r = p->regions[i];
    memmove(&p->regions[i], &p->regions[i + 1],
            (p->nregions - i - 1) * sizeof(region));
    p->nregions--;
    if (r.backed) {
        backing_release_region(p, &r); /* unmapped before the range goes */
    } else {
        p->st.pool_bytes -= r.size;
        p->st.released_bytes_total += r.size;
    }
    p->st.va_bytes -= r.size;
    p->st.num_region_frees++;
    p->backend.region_free(p->backend.ctx, r.base, r.size);
}

/* Without vmm: regions holding one free chunk go back whole. With vmm the
 * address space stays (it costs nothing and keeps the pool one growing
 * region) and the granules of free space go back. */
uint64_t region_release_empty(bfc_pool *p)
{
    if (p->opt.vmm)
        return backing_release_free(p);
    uint64_t released = 0;
    for (uint32_t i = p->nregions; i-- > 0;) {
        const region *r = &p->regions[i];
        chunk *c = C(p, r->first);
        if (c->state != CHUNK_FREE || c->size != r->size)
            continue;
        uint64_t size = r->size;
        bins_remove(&p->free_bins, &p->chunks, r->first);
        chunk_release(&p->chunks, r->first);
        drop_region(p, i);
        released += size;
    }
    return released;
}

void region_release_all(bfc_pool *p)
{
    while (p->nregions)
        drop_region(p, p->nregions - 1);
}

uint32_t region_chunk_containing(const bfc_pool *p, int r, bfc_addr addr)
{
    uint32_t c = p->regions[r].first;
    while (c != CHUNK_NIL) {
        const chunk *cc = C(p, c);
        if (addr - cc->addr < cc->size)
            return c;
        c = cc->next;
    }
    return CHUNK_NIL;
}
