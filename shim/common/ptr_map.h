/*
 * ptr_map.h - pointer -> 64-bit value: which event allocated each live
 * pointer (trace parser), how large each pass-through allocation is
 * (the shim's platform mode).
 *
 * Open addressing with linear probing and backward-shift deletion (no
 * tombstones). Key 0 marks an empty slot: callers never insert 0.
 */
#ifndef BFCSHIM_COMMON_PTR_MAP_H
#define BFCSHIM_COMMON_PTR_MAP_H

#include <stdbool.h>
#include <stdint.h>

typedef struct ptr_slot {
    uint64_t key;
    uint64_t val;
} ptr_slot;

typedef struct ptr_map {
    ptr_slot *slots;
    uint64_t mask; /* capacity - 1; capacity is a power of two */
    uint64_t count;
    unsigned shift; /* 64 - log2(capacity) */
} ptr_map;

bool ptr_map_init(ptr_map *m);
void ptr_map_fini(ptr_map *m);
bool ptr_map_grow(ptr_map *m, uint64_t n);

/* Grows ahead of time so that the next `n` puts cannot fail. */
static inline bool ptr_map_reserve(ptr_map *m, uint64_t n)
{
    return (m->count + n) * 2 <= m->mask + 1 || ptr_map_grow(m, n);
}
/* Inserts key (not present). The caller must have reserved room. */
void ptr_map_put(ptr_map *m, uint64_t key, uint64_t val);
/* Value of key, or 0 when absent (so store nonzero values). */
uint64_t ptr_map_get(const ptr_map *m, uint64_t key);
/* Removes key and returns its value, or 0 when absent. */
uint64_t ptr_map_take(ptr_map *m, uint64_t key);

static inline uint64_t ptr_map_host_bytes(const ptr_map *m)
{
    return (m->mask + 1) * sizeof(ptr_slot);
}

#endif
