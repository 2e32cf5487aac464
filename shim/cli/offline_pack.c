/* offline_pack.c - the offline packing of a trace (offline_pack.h). */
#include "offline_pack.h"

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct block {
    uint64_t size, offset;
    size_t born, dies; /* event indices; dies = SIZE_MAX if never freed */
    uint32_t slot;
} block;

static size_t lifetime(const block *b) { return b->dies - b->born; }

typedef int (*block_order)(const void *, const void *);

/* In the first pass over the orders, blocks still live at the trace's end
 * come first: they pack together at the bottom, so that a run going on
 * past the plan finds its free space in one piece above them. */
static bool survivors_first;

/* The larger key first; ties by birth, so every order is deterministic. */
static int by_key(double ka, double kb, const block *a, const block *b)
{
    const bool ea = a->dies == SIZE_MAX, eb = b->dies == SIZE_MAX;
    if (survivors_first && ea != eb)
        return ea ? -1 : 1;
    if (ka != kb)
        return ka < kb ? 1 : -1;
    return a->born < b->born ? -1 : a->born > b->born;
}

static int by_size(const void *pa, const void *pb)
{
    const block *a = pa, *b = pb;
    return by_key((double)a->size, (double)b->size, a, b);
}

static int by_lifetime(const void *pa, const void *pb)
{
    const block *a = pa, *b = pb;
    return by_key((double)lifetime(a), (double)lifetime(b), a, b);
}

static int by_area(const void *pa, const void *pb)
{
    const block *a = pa, *b = pb;
    return by_key((double)a->size * (double)lifetime(a), (double)b->size * (double)lifetime(b),
                  a, b);
}

static int by_offset(const void *pa, const void *pb)
{
    const block *a = *(block *const *)pa, *b = *(block *const *)pb;
    return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Places blocks[0..n) in their current order; returns the pool size. */
static uint64_t pack(block *blocks, size_t n, block **scratch)
{
    uint64_t top = 0;
    for (size_t i = 0; i < n; i++) {
        block *b = &blocks[i];
        size_t m = 0;
        for (size_t j = 0; j < i; j++)
            if (blocks[j].born < b->dies && b->born < blocks[j].dies)
                scratch[m++] = &blocks[j];
        qsort(scratch, m, sizeof *scratch, by_offset);
        uint64_t at = 0;
        for (size_t j = 0; j < m && scratch[j]->offset < at + b->size; j++)
            if (scratch[j]->offset + scratch[j]->size > at)
                at = scratch[j]->offset + scratch[j]->size;
        b->offset = at;
        if (at + b->size > top)
            top = at + b->size;
    }
    return top;
}

uint64_t offline_pack(const trace *t, uint64_t granularity, uint64_t *offsets)
{
    const size_t n = t->nslots;
    if (n == 0)
        return 0;
    block *blocks = calloc(n, sizeof *blocks);
    block **scratch = malloc(n * sizeof *scratch);
    uint64_t best = 0;
    if (!blocks || !scratch)
        goto out;
    for (size_t i = 0; i < t->nev; i++) {
        const trace_event *e = &t->ev[i];
        block *b = &blocks[e->slot];
        if (e->kind == TRACE_ALLOC) {
            b->size = (e->size + granularity - 1) / granularity * granularity;
            b->born = i;
            b->dies = SIZE_MAX;
            b->slot = e->slot;
        } else {
            b->dies = i;
        }
    }
    static const block_order orders[] = {by_size, by_lifetime, by_area};
    const size_t norders = sizeof orders / sizeof orders[0];
    /* Survivors first, then not; a later packing replaces an earlier one
     * only when it is strictly smaller. */
    for (size_t k = 0; k < 2 * norders; k++) {
        survivors_first = k < norders;
        qsort(blocks, n, sizeof *blocks, orders[k % norders]);
        uint64_t pool = pack(blocks, n, scratch);
        if (best == 0 || pool < best) {
            best = pool;
            for (size_t i = 0; i < n; i++)
                offsets[blocks[i].slot] = blocks[i].offset;
        }
    }
out:
    free(blocks);
    free(scratch);
    return best;
}
