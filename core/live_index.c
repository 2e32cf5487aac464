/* live_index.c - live chunks by address (see live_index.h). */
#include "live_index.h"

#include <stdlib.h>

#define LIVE_INDEX_MIN_BITS 10u
/* Inserts between a record's prefetch and its use in a rehash: enough to
 * cover a miss to L3 at ~20 ns an insert. */
#define REHASH_PREFETCH_AHEAD 16u

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
    /* The rehash reads the record of every live chunk for its address, in
     * the old table's order, which is random in the record array: one cache
     * miss per chunk, and a mispredicted branch per occupied slot when the
     * loop tests each one. So the handles are first packed to the front of
     * the old table without a branch, and the records are then prefetched a
     * few inserts ahead. Measured on the replay benchmark (~10^4 live
     * chunks, six growths a run): the rehash took about half the time,
     * 2% of the whole run. */
    uint64_t kept = 0;
    for (uint64_t i = 0; i <= old.mask; i++) {
        const uint32_t h = old.slots[i];
        old.slots[kept] = h;
        kept += h != CHUNK_NIL;
    }
    for (uint64_t i = 0; i < kept; i++) {
        if (i + REHASH_PREFETCH_AHEAD < kept)
            __builtin_prefetch(chunk_at(s, old.slots[i + REHASH_PREFETCH_AHEAD]));
        live_index_insert(x, s, old.slots[i]);
    }
    free(old.slots);
    return true;
}
