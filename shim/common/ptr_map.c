/* ptr_map.c - pointer -> value map for the trace parser (see ptr_map.h). */
#include "ptr_map.h"

#include "linear_probe.h"

#include <stdlib.h>

#define ADDR_MAP_MIN_BITS 10u

/* Trace pointers come from allocators: multiples of 256 or more, so the low
 * byte carries little; Fibonacci hashing spreads the rest over the top bits. */
static inline uint64_t slot_of(const ptr_map *m, uint64_t key)
{
    return ((key >> 8) * UINT64_C(0x9E3779B97F4A7C15)) >> m->shift;
}

static bool alloc_slots(ptr_map *m, unsigned bits)
{
    ptr_slot *t = calloc((size_t)1 << bits, sizeof *t);
    if (!t)
        return false;
    m->slots = t;
    m->mask = ((uint64_t)1 << bits) - 1;
    m->shift = 64u - bits;
    return true;
}

bool ptr_map_init(ptr_map *m)
{
    m->count = 0;
    return alloc_slots(m, ADDR_MAP_MIN_BITS);
}

void ptr_map_fini(ptr_map *m)
{
    free(m->slots);
    m->slots = NULL;
    m->count = 0;
}

static void insert_slot(ptr_map *m, uint64_t key, uint64_t val)
{
    uint64_t i = slot_of(m, key);
    while (m->slots[i].key)
        i = (i + 1) & m->mask;
    m->slots[i].key = key;
    m->slots[i].val = val;
}

bool ptr_map_grow(ptr_map *m, uint64_t n)
{
    unsigned bits = 64u - m->shift;
    while ((m->count + n) * 2 > ((uint64_t)1 << bits))
        bits++;
    ptr_map old = *m;
    if (!alloc_slots(m, bits))
        return false;
    for (uint64_t i = 0; i <= old.mask; i++)
        if (old.slots[i].key)
            insert_slot(m, old.slots[i].key, old.slots[i].val);
    free(old.slots);
    return true;
}

void ptr_map_put(ptr_map *m, uint64_t key, uint64_t val)
{
    insert_slot(m, key, val);
    m->count++;
}

uint64_t ptr_map_get(const ptr_map *m, uint64_t key)
{
    if (!key)
        return 0;
    for (uint64_t i = slot_of(m, key);; i = (i + 1) & m->mask) {
        if (m->slots[i].key == key)
            return m->slots[i].val;
        if (!m->slots[i].key)
            return 0;
    }
}

uint64_t ptr_map_take(ptr_map *m, uint64_t key)
{
    if (!key)
        return 0;
    uint64_t i = slot_of(m, key);
    while (m->slots[i].key != key) {
        if (!m->slots[i].key)
            return 0;
        i = (i + 1) & m->mask;
    }
    uint64_t val = m->slots[i].val;
    /* Backward-shift deletion (linear_probe.h). */
    uint64_t hole = i;
    for (uint64_t j = (i + 1) & m->mask; m->slots[j].key; j = (j + 1) & m->mask) {
        if (probe_may_fill_hole(hole, j, slot_of(m, m->slots[j].key))) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].key = 0;
    m->slots[hole].val = 0;
    m->count--;
    return val;
}
