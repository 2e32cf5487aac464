/* offline_pack.c - the offline packing of a trace (offline_pack.h). */
#include "offline_pack.h"

#include <stdbool.h>
#include <stdlib.h>

typedef struct block {
    uint64_t size, offset;
    size_t born, dies; /* event indices; dies = SIZE_MAX if never freed */
    uint32_t slot;
    /* The order of one pass: `first` blocks lead, then the larger key. */
    bool first;
    double key;
} block;

enum order { BY_SIZE, BY_LIFETIME, BY_AREA, ORDERS };

static double key_of(const block *b, enum order o)
{
    const double lifetime = (double)(b->dies - b->born);
    return o == BY_SIZE ? (double)b->size : o == BY_LIFETIME ? lifetime
                                                             : (double)b->size * lifetime;
}

/* `first` blocks, then the larger key; ties by birth, so every order is
 * deterministic. */
static int by_rank(const void *pa, const void *pb)
{
    const block *a = pa, *b = pb;
    if (a->first != b->first)
        return a->first ? -1 : 1;
    if (a->key != b->key)
        return a->key < b->key ? 1 : -1;
    return a->born < b->born ? -1 : a->born > b->born;
}

static int by_offset(const void *pa, const void *pb)
{
    const block *a = *(block *const *)pa, *b = *(block *const *)pb;
    return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* a + b, or UINT64_MAX where that would wrap: sizes up to 2^64 - 1 pack, and
 * a packing that does not fit in 64 bits says so by its top, not by a
 * wrapped small one. */
static uint64_t add_sat(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

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
        for (size_t j = 0; j < m && scratch[j]->offset < add_sat(at, b->size); j++)
            if (add_sat(scratch[j]->offset, scratch[j]->size) > at)
                at = add_sat(scratch[j]->offset, scratch[j]->size);
        b->offset = at;
        if (add_sat(at, b->size) > top)
            top = add_sat(at, b->size);
    }
    return top;
}

uint64_t offline_pack(const trace *t, uint64_t granularity, bfc_plan_entry *out)
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
            b->size = e->size > UINT64_MAX - (granularity - 1)
                          ? UINT64_MAX
                          : (e->size + granularity - 1) / granularity * granularity;
            b->born = i;
            b->dies = SIZE_MAX;
            b->slot = e->slot;
        } else {
            b->dies = i;
        }
    }
    /* Each order twice: first with the blocks still live at the trace's end
     * leading, so that they pack together at the bottom and a run going on
     * past the plan finds its free space in one piece above them; then
     * without. A later packing replaces an earlier one only when it is
     * strictly smaller. */
    for (int pass = 0; pass < 2 * ORDERS; pass++) {
        const bool survivors_first = pass < ORDERS;
        for (size_t i = 0; i < n; i++) {
            blocks[i].first = survivors_first && blocks[i].dies == SIZE_MAX;
            blocks[i].key = key_of(&blocks[i], (enum order)(pass % ORDERS));
        }
        qsort(blocks, n, sizeof *blocks, by_rank);
        uint64_t pool = pack(blocks, n, scratch);
        if (best == 0 || pool < best) {
            best = pool;
            for (size_t i = 0; i < n; i++)
                out[blocks[i].slot] = (bfc_plan_entry){blocks[i].size, blocks[i].offset};
        }
    }
out:
    free(blocks);
    free(scratch);
    return best;
}
