/* chunks.c - slab-backed store of chunk records (see chunks.h). */
#include "chunks.h"

#include <stdlib.h>
#include <string.h>

/* Slabs are added one at a time; their pointer table doubles. The top index
 * must fit in 32 bits, so the store stops at 2^32 - 1 records. */
#define CHUNK_MAX_SLABS (UINT32_C(1) << (32 - CHUNK_SLAB_SHIFT))

static bool add_slab(chunk_store *s)
{
    if (s->nslabs == CHUNK_MAX_SLABS)
        return false;
    if (s->nslabs == s->slabs_cap) {
        uint32_t cap = s->slabs_cap ? s->slabs_cap * 2 : 8;
        chunk **t = realloc(s->slabs, (size_t)cap * sizeof *t);
        if (!t)
            return false;
        s->slabs = t;
        s->slabs_cap = cap;
    }
    chunk *slab = calloc(CHUNK_SLAB_SIZE, sizeof *slab);
    if (!slab)
        return false;
    uint32_t base = s->nslabs << CHUNK_SLAB_SHIFT;
    s->slabs[s->nslabs++] = slab;
    /* Thread the new records onto the free list in ascending order so that
     * records handed out close in time sit close in memory. Record 0 of the
     * first slab is the sentinel and never joins the list. */
    uint32_t first = base == 0 ? 1 : 0;
    for (uint32_t i = CHUNK_SLAB_SIZE; i-- > first;) {
        slab[i].qnext = s->free_head;
        s->free_head = base + i;
    }
    return true;
}

bool chunk_store_init(chunk_store *s)
{
    memset(s, 0, sizeof *s);
    return add_slab(s);
}

void chunk_store_fini(chunk_store *s)
{
    for (uint32_t i = 0; i < s->nslabs; i++)
        free(s->slabs[i]);
    free(s->slabs);
    memset(s, 0, sizeof *s);
}

bool chunk_store_grow(chunk_store *s, uint32_t n)
{
    /* Free records = capacity - 1 (sentinel) - used. */
    while (chunk_store_capacity(s) - 1 - s->used < n)
        if (!add_slab(s))
            return false;
    return true;
}

uint64_t chunk_store_host_bytes(const chunk_store *s)
{
    return (uint64_t)s->nslabs * CHUNK_SLAB_SIZE * sizeof(chunk) +
           (uint64_t)s->slabs_cap * sizeof(chunk *);
}
