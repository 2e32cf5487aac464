/*
 * backing.c - physical memory behind virtual regions (bfc_options.vmm).
 *
 * With vmm a region is address space, and each region keeps a bitmap with
 * one bit per map granule, set while physical memory is mapped there. The
 * rule the checker proves: every byte of an allocated or pending chunk lies
 * in a backed granule. Free chunks may be backed, partly backed or not at
 * all: best fit ignores backing (a hole is a hole, wherever its memory is),
 * and an allocation maps the granules its block lacks.
 *
 * A granule goes back only when it lies wholly inside one free chunk. A free
 * chunk's neighbours are never free, so a granule shared with an allocated
 * or pending block is never taken, and free space is memory that no queued
 * GPU work can touch (the shim's frees become free only after their fences),
 * which matters because unmapping does not wait for the GPU. A backend that
 * cannot promise that (the shim under its immediate free policy) is asked
 * first, once per batch of releases the pool chooses (release_ready).
 *
 * Runs of granules are mapped and unmapped with one backend call each, so
 * growing over a large block costs one call however many granules it spans.
 */
#include <stdlib.h>

#include "pool_internal.h"

static inline uint64_t granule_of(const region *r, uint64_t gran, bfc_addr a)
{
    return (a - r->base) >> bits_ctz64(gran); /* a power of two */
}

/* The first index in [from, to) whose bit is `value`, or `to`. Skips whole
 * words, so a long unbacked tail costs one load per 64 granules. */
static uint64_t bit_find(const uint64_t *w, uint64_t from, uint64_t to, bool value)
{
    uint64_t i = from;
    while (i < to) {
        uint64_t word = value ? w[i >> 6] : ~w[i >> 6];
        word &= ~UINT64_C(0) << (i & 63);
        if (word) {
            uint64_t at = (i & ~UINT64_C(63)) + bits_ctz64(word);
            return at < to ? at : to;
        }
        i = (i | 63) + 1;
    }
    return to;
}

/* The next run of `value` bits at or after *at, before `to`: true with the
 * run in [*at, *run_end); false when there is none. Every walk over
 * mapped or unmapped granules below goes run by run through this. */
static bool next_run(const uint64_t *w, uint64_t *at, uint64_t to, bool value,
                     uint64_t *run_end)
{
    *at = bit_find(w, *at, to, value);
    if (*at >= to)
        return false;
    *run_end = bit_find(w, *at, to, !value);
    return true;
}

/* The last index in [from, to) whose bit is `value`, or `to` when there is
 * none. Skips whole words, as bit_find does. */
static uint64_t bit_find_last(const uint64_t *w, uint64_t from, uint64_t to, bool value)
{
    uint64_t i = to;
    while (i > from) {
        uint64_t last = i - 1;
        uint64_t word = value ? w[last >> 6] : ~w[last >> 6];
        word &= ~UINT64_C(0) >> (63 - (last & 63)); /* bits 0..last%64 */
        if (word) {
            uint64_t at = (last & ~UINT64_C(63)) + 63 - (uint64_t)__builtin_clzll(word);
            return at >= from ? at : to;
        }
        i = last & ~UINT64_C(63);
    }
    return to;
}

/* Sets bits [from, to) to `value`. */
static void bit_fill(uint64_t *w, uint64_t from, uint64_t to, bool value)
{
    for (uint64_t i = from; i < to; i++) {
        if (value)
            w[i >> 6] |= UINT64_C(1) << (i & 63);
        else
            w[i >> 6] &= ~(UINT64_C(1) << (i & 63));
    }
}

bool backing_init(const bfc_pool *p, region *r)
{
    uint64_t granules = r->size / p->opt.map_granularity;
    r->backed = calloc((size_t)((granules + 63) / 64), sizeof *r->backed);
    r->backed_to = r->base;
    return r->backed != NULL;
}

/* Keeps backed_to (every granule below it mapped) after granules [i, j)
 * were mapped: a run that reaches the prefix extends it over every mapped
 * granule that follows. */
static void prefix_after_map(const bfc_pool *p, region *r, uint64_t i, uint64_t j)
{
    const uint64_t g = p->opt.map_granularity;
    if (r->base + i * g <= r->backed_to)
        r->backed_to = r->base + bit_find(r->backed, j, r->size / g, false) * g;
}

bool backing_covers(const bfc_pool *p, const region *r, bfc_addr lo, bfc_addr hi)
{
    const uint64_t g = p->opt.map_granularity;
    uint64_t first = granule_of(r, g, lo), end = granule_of(r, g, hi - 1) + 1, run_end;
    return !next_run(r->backed, &first, end, false, &run_end);
}

uint64_t backing_count(const bfc_pool *p, const region *r)
{
    uint64_t granules = r->size / p->opt.map_granularity, n = 0;
    for (uint64_t i = 0; i < (granules + 63) / 64; i++)
        n += (uint64_t)__builtin_popcountll(r->backed[i]);
    return n * p->opt.map_granularity;
}

uint64_t backing_missing(const bfc_pool *p, const region *r, bfc_addr lo, bfc_addr hi)
{
    const uint64_t g = p->opt.map_granularity;
    uint64_t i = granule_of(r, g, lo), end = granule_of(r, g, hi - 1) + 1, j, missing = 0;
    for (; next_run(r->backed, &i, end, false, &j); i = j)
        missing += (j - i) * g;
    return missing;
}

void backing_pieces(const bfc_pool *p, const region *r, bfc_addr lo, bfc_addr hi,
                    backing_piece_fn fn, void *arg)
{
    const uint64_t g = p->opt.map_granularity;
    const uint64_t end = granule_of(r, g, hi - 1) + 1;
    for (uint64_t i = granule_of(r, g, lo); i < end;) {
        const bool mapped = (r->backed[i >> 6] >> (i & 63)) & 1;
        const uint64_t j = bit_find(r->backed, i, end, !mapped);
        const bfc_addr from = r->base + i * g, to = r->base + j * g;
        fn(arg, from > lo ? from : lo, to < hi ? to : hi, mapped);
        i = j;
    }
}

bool backing_map(bfc_pool *p, region *r, bfc_addr lo, bfc_addr hi)
{
    const uint64_t g = p->opt.map_granularity;
    const uint64_t first = granule_of(r, g, lo), end = granule_of(r, g, hi - 1) + 1;
    const uint64_t missing = backing_missing(p, r, lo, hi);
    uint64_t i, j;
    if (missing == 0)
        return true;
    if (missing > p->opt.limit_bytes - p->st.pool_bytes)
        return false;
    for (i = first; next_run(r->backed, &i, end, false, &j); i = j) {
        p->st.num_map_calls++;
        uint64_t done = p->backend.map(p->backend.ctx, r->base + i * g, (j - i) * g) / g;
        done = done < j - i ? done : j - i;
        /* What the backend says is mapped is counted, even when the run
         * failed (granules it could not take back); runs mapped before this
         * one stay too. Free space gives them back like any other granule. */
        bit_fill(r->backed, i, i + done, true);
        prefix_after_map(p, r, i, i + done);
        p->st.pool_bytes += done * g;
        if (i + done < j) {
            p->st.num_map_failures++;
            pool_note_pool_bytes(p);
            return false;
        }
    }
    pool_note_pool_bytes(p);
    return true;
}

/* May the pool give free space back now? Asked only when there is something
 * to give, and once per batch. */
static bool gate_open(bfc_pool *p, int *gate)
{
    if (*gate == 0)
        *gate = !p->backend.release_ready || p->backend.release_ready(p->backend.ctx) ? 1 : -1;
    return *gate > 0;
}

uint64_t backing_release(bfc_pool *p, region *r, bfc_addr lo, bfc_addr hi, int *gate)
{
    const uint64_t g = p->opt.map_granularity;
    /* Whole granules only: round the start up and the end down. */
    const uint64_t first = (lo - r->base + g - 1) / g, end = (hi - r->base) / g;
    uint64_t released = 0, i, j;
    for (i = first; next_run(r->backed, &i, end, true, &j); i = j) {
        if (gate && !gate_open(p, gate))
            break;
        p->st.num_unmap_calls++;
        uint64_t done = p->backend.unmap(p->backend.ctx, r->base + i * g, (j - i) * g) / g;
        done = done < j - i ? done : j - i;
        bit_fill(r->backed, i, i + done, false);
        if (done && r->base + i * g < r->backed_to)
            r->backed_to = r->base + i * g;
        released += done * g;
        if (i + done < j) {
            /* The device refused granule i + done: it and the rest of the
             * run stay mapped and counted, free space like any other (its
             * memory is intact). Unmapping more now would most likely be
             * refused too (a dead context refuses every call): this
             * release ends, and with it the batch. */
            if (gate)
                *gate = -1;
            break;
        }
    }
    p->st.pool_bytes -= released;
    p->st.released_bytes_total += released;
    return released;
}

static uint64_t release_free_gated(bfc_pool *p, int *gate)
{
    uint64_t released = 0;
    for (uint32_t ri = 0; ri < p->nregions; ri++) {
        region *r = &p->regions[ri];
        for (uint32_t c = r->first; c != CHUNK_NIL; c = C(p, c)->next) {
            const chunk *cc = C(p, c);
            if (cc->state == CHUNK_FREE && cc->size >= p->opt.map_granularity)
                released += backing_release(p, r, cc->addr, cc->addr + cc->size, gate);
            if (*gate < 0)
                return released;
        }
    }
    return released;
}

uint64_t backing_release_free(bfc_pool *p)
{
    int gate = 0;
    return release_free_gated(p, &gate);
}

/* Gives back at most `want` bytes (whole granules, rounded up) of the mapped
 * granules of free chunk c of region r, from its top down; returns the
 * bytes. */
static uint64_t release_top_of(bfc_pool *p, region *r, uint32_t c, uint64_t want, int *gate)
{
    const uint64_t g = p->opt.map_granularity;
    const chunk *cc = C(p, c);
    const uint64_t first = (cc->addr - r->base + g - 1) / g, end = (cc->addr + cc->size - r->base) / g;
    /* Walk down over mapped granules until enough lie above `from`. */
    uint64_t from = end, found = 0;
    while (found < want) {
        uint64_t at = bit_find_last(r->backed, first, from, true);
        if (at == from)
            break;
        from = at;
        found += g;
    }
    if (from == end)
        return 0;
    return backing_release(p, r, r->base + from * g, r->base + end * g, gate);
}

/* A free chunk that may give granules back, as the order needs it. */
typedef struct release_candidate {
    uint64_t size, addr;
    uint32_t c, region;
} release_candidate;

static int larger_chunk_first(const void *a, const void *b)
{
    const release_candidate *x = a, *y = b;
    if (x->size != y->size)
        return x->size > y->size ? -1 : 1;
    return x->addr > y->addr ? -1 : x->addr < y->addr; /* then the higher */
}

uint64_t backing_release_some(bfc_pool *p, uint64_t want, bool *refused)
{
    size_t n = 0, cap = 64;
    int gate = 0;
    uint64_t released = 0;
    release_candidate *order = malloc(cap * sizeof *order);
    if (!order) {
        released = release_free_gated(p, &gate);
        goto out;
    }
    for (uint32_t ri = 0; ri < p->nregions; ri++)
        for (uint32_t c = p->regions[ri].first; c != CHUNK_NIL; c = C(p, c)->next) {
            const chunk *cc = C(p, c);
            if (cc->state != CHUNK_FREE || cc->size < p->opt.map_granularity)
                continue;
            if (n == cap) {
                release_candidate *more = realloc(order, 2 * cap * sizeof *order);
                if (!more) {
                    free(order);
                    released = release_free_gated(p, &gate);
                    goto out;
                }
                order = more;
                cap *= 2;
            }
            order[n++] = (release_candidate){cc->size, cc->addr, c, ri};
        }
    qsort(order, n, sizeof *order, larger_chunk_first);
    for (size_t k = 0; k < n && released < want && gate >= 0; k++)
        released += release_top_of(p, &p->regions[order[k].region], order[k].c, want - released,
                                   &gate);
    free(order);
out:
    if (refused)
        *refused = gate < 0;
    return released;
}

void backing_after_free(bfc_pool *p, uint32_t c)
{
    const chunk *cc = C(p, c);
    if (cc->size < p->opt.map_granularity)
        return;
    int r = region_find(p, cc->addr), gate = 0;
    backing_release(p, &p->regions[r], cc->addr, cc->addr + cc->size, &gate);
}

void backing_release_region(bfc_pool *p, region *r)
{
    backing_release(p, r, r->base, r->base + r->size, NULL);
    free(r->backed);
    r->backed = NULL;
}

void bfc_pool_each_mapped(bfc_pool *p, void (*fn)(void *arg, bfc_addr addr, uint64_t size),
                          void *arg)
{
    bfc_lock_acquire(&p->lock);
    const uint64_t g = p->opt.map_granularity;
    for (uint32_t ri = 0; p->opt.vmm && ri < p->nregions; ri++) {
        const region *r = &p->regions[ri];
        uint64_t i, j;
        for (i = 0; next_run(r->backed, &i, r->size / g, true, &j); i = j)
            fn(arg, r->base + i * g, (j - i) * g);
    }
    bfc_lock_release(&p->lock);
}
