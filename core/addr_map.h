/*
 * addr_map.h - live allocations by address: an open-addressing hash table
 * from a chunk's start address to its handle.
 *
 * This replaces TSL's per-region handle array (4 bytes per 256 bytes of
 * region, 1.25 GB of host memory for an 80 GB pool) with 16 bytes per slot,
 * at most half the slots used: host memory follows the number of live
 * allocations, whatever the size of the regions.
 *
 * Linear probing with backward-shift deletion (no tombstones, so lookups stay
 * short after long runs of frees). Key 0 marks an empty slot; no region ever
 * starts at address 0.
 */
#ifndef BFCSHIM_CORE_ADDR_MAP_H
#define BFCSHIM_CORE_ADDR_MAP_H

#include <stdbool.h>
#include <stdint.h>

typedef struct addr_slot {
    uint64_t key;
    uint32_t val;
    uint32_t pad;
} addr_slot;

typedef struct addr_map {
    addr_slot *slots;
    uint64_t mask; /* capacity - 1; capacity is a power of two */
    uint64_t count;
    unsigned shift; /* 64 - log2(capacity) */
} addr_map;

bool addr_map_init(addr_map *m);
void addr_map_fini(addr_map *m);
/* Grows ahead of time so that the next `n` puts cannot fail. */
bool addr_map_reserve(addr_map *m, uint64_t n);
/* Inserts key (not present). The caller must have reserved room. */
void addr_map_put(addr_map *m, uint64_t key, uint32_t val);
/* Handle for key, or 0. */
uint32_t addr_map_get(const addr_map *m, uint64_t key);
/* Removes key and returns its handle, or 0 when absent. */
uint32_t addr_map_take(addr_map *m, uint64_t key);

static inline uint64_t addr_map_host_bytes(const addr_map *m)
{
    return (m->mask + 1) * sizeof(addr_slot);
}

#endif
