/* addr_map.c - open-addressing map from address to chunk handle. */
#include "addr_map.h"

#include <stdlib.h>

#define ADDR_MAP_MIN_BITS 10u

/* Addresses are multiples of 256, so the low byte carries nothing;
 * Fibonacci hashing spreads the rest over the top bits. */
static inline uint64_t slot_of(const addr_map *m, uint64_t key)
{
    return ((key >> 8) * UINT64_C(0x9E3779B97F4A7C15)) >> m->shift;
}

static bool alloc_slots(addr_map *m, unsigned bits)
{
    addr_slot *t = calloc((size_t)1 << bits, sizeof *t);
    if (!t)
        return false;
    m->slots = t;
    m->mask = ((uint64_t)1 << bits) - 1;
    m->shift = 64u - bits;
    return true;
}

bool addr_map_init(addr_map *m)
{
    m->count = 0;
    return alloc_slots(m, ADDR_MAP_MIN_BITS);
}

void addr_map_fini(addr_map *m)
{
    free(m->slots);
    m->slots = NULL;
    m->count = 0;
}

static void insert_slot(addr_map *m, uint64_t key, uint32_t val)
{
    uint64_t i = slot_of(m, key);
    while (m->slots[i].key)
        i = (i + 1) & m->mask;
    m->slots[i].key = key;
    m->slots[i].val = val;
}

bool addr_map_reserve(addr_map *m, uint64_t n)
{
    uint64_t cap = m->mask + 1;
    if ((m->count + n) * 2 <= cap)
        return true;
    unsigned bits = 64u - m->shift;
    while ((m->count + n) * 2 > ((uint64_t)1 << bits))
        bits++;
    addr_map old = *m;
    if (!alloc_slots(m, bits))
        return false;
    for (uint64_t i = 0; i <= old.mask; i++)
        if (old.slots[i].key)
            insert_slot(m, old.slots[i].key, old.slots[i].val);
    free(old.slots);
    return true;
}

void addr_map_put(addr_map *m, uint64_t key, uint32_t val)
{
    insert_slot(m, key, val);
    m->count++;
}

uint32_t addr_map_get(const addr_map *m, uint64_t key)
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

uint32_t addr_map_take(addr_map *m, uint64_t key)
{
    if (!key)
        return 0;
    uint64_t i = slot_of(m, key);
    while (m->slots[i].key != key) {
        if (!m->slots[i].key)
            return 0;
        i = (i + 1) & m->mask;
    }
    uint32_t val = m->slots[i].val;
    /* Backward-shift deletion: pull later members of the probe run into the
     * hole whenever their home slot does not lie cyclically in (hole, j]. */
    uint64_t hole = i;
    for (uint64_t j = (i + 1) & m->mask; m->slots[j].key; j = (j + 1) & m->mask) {
        uint64_t home = slot_of(m, m->slots[j].key);
        int in_range = hole <= j ? (home > hole && home <= j)
                                 : (home > hole || home <= j);
        if (!in_range) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].key = 0;
    m->slots[hole].val = 0;
    m->count--;
    return val;
}
