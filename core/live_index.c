/* live_index.c - live chunks by address (see live_index.h). */
#include "live_index.h"

#include <stdlib.h>

#define LIVE_INDEX_MIN_BITS 10u

static bool alloc_slots(live_index *x, unsigned bits)
{
    uint32_t *t = calloc((size_t)1 << bits, sizeof *t);
    if (!t)
        return false;
    x->slots = t;
    x->mask = ((uint64_t)1 << bits) - 1;
    x->shift = 64u - bits;
    return true;
}

bool live_index_init(live_index *x)
{
    x->count = 0;
    return alloc_slots(x, LIVE_INDEX_MIN_BITS);
}

void live_index_fini(live_index *x)
{
    free(x->slots);
    x->slots = NULL;
    x->count = 0;
}

bool live_index_grow(live_index *x, const chunk_store *s, uint64_t n)
{
    unsigned bits = 64u - x->shift;
    while ((x->count + n) * LIVE_INDEX_MAX_LOAD > ((uint64_t)1 << bits))
        bits++;
    live_index old = *x;
    if (!alloc_slots(x, bits))
        return false;
    x->count = 0;
    for (uint64_t i = 0; i <= old.mask; i++)
        if (old.slots[i])
            live_index_insert(x, s, old.slots[i]);
    free(old.slots);
    return true;
}
