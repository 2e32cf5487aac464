/*
 * live_index.h - live allocations by address: an open-addressing hash set of
 * chunk handles, keyed by the address stored in each chunk's record.
 *
 * This replaces TSL's per-region handle array (4 bytes per 256 bytes of
 * region: 1.25 GB of host memory for an 80 GB pool) with 4 bytes per slot, at
 * most a quarter of the slots used (LIVE_INDEX_MAX_LOAD): host memory
 * follows the number of live allocations, whatever the size of the regions.
 *
 * Why a quarter and not a half: a probe that runs past its home slot costs a
 * branch misprediction and a read of another chunk record, and every
 * allocation and free probes once. At a load of 1/8 to 1/4 instead of 1/4 to
 * 1/2, replay on the ~10^4-live-chunk benchmark took 7% less time (10% fewer
 * mispredicted branches under callgrind), for 8 to 16 more bytes per live
 * allocation (measured: 74.5 -> 85.0 bytes per chunk; docs/benchmarks.md,
 * "Replay speed").
 *
 * Slots hold only handles. A lookup compares the address in the record a slot
 * names; the free path needs that record next anyway, so the comparison costs
 * no extra cache miss, and the table is a quarter of the size it would be
 * with the key beside the handle (it stays in L2 at 10^4 live allocations and
 * in L3 at 10^6).
 *
 * Linear probing with backward-shift deletion (no tombstones, so lookups stay
 * short after long runs of frees). Handle 0 marks an empty slot.
 */
#ifndef BFCSHIM_CORE_LIVE_INDEX_H
#define BFCSHIM_CORE_LIVE_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "chunks.h"
#include "linear_probe.h"

/* The table grows (doubling) before more than 1/LIVE_INDEX_MAX_LOAD of its
 * slots would be used. */
#define LIVE_INDEX_MAX_LOAD 4u

typedef struct live_index {
    uint32_t *slots;
    uint64_t mask; /* capacity - 1; capacity is a power of two */
    uint64_t count;
    unsigned shift; /* 64 - log2(capacity) */
} live_index;

/* Addresses are multiples of 256, so the low byte carries nothing;
 * Fibonacci hashing spreads the rest over the top bits. */
static inline uint64_t live_index_home(const live_index *x, uint64_t addr)
{
    return ((addr >> 8) * UINT64_C(0x9E3779B97F4A7C15)) >> x->shift;
}

bool live_index_init(live_index *x);
void live_index_fini(live_index *x);
bool live_index_grow(live_index *x, const chunk_store *s, uint64_t n);

/* Grows ahead of time so that the next `n` inserts cannot fail. */
static inline bool live_index_reserve(live_index *x, const chunk_store *s, uint64_t n)
{
    return (x->count + n) * LIVE_INDEX_MAX_LOAD <= x->mask + 1 || live_index_grow(x, s, n);
}

/* Starts loading the slot where addr's probe begins, so that the miss on a
 * large table overlaps other work. */
static inline void live_index_prefetch(const live_index *x, uint64_t addr)
{
    __builtin_prefetch(&x->slots[live_index_home(x, addr)], 1);
}

/* Adds chunk c (not present) under the address in its record. The caller
 * must have reserved room. */
static inline void live_index_insert(live_index *x, const chunk_store *s, uint32_t c)
{
    uint64_t i = live_index_home(x, chunk_at(s, c)->addr);
    while (x->slots[i])
        i = (i + 1) & x->mask;
    x->slots[i] = c;
    x->count++;
}

/* The slot where addr's probe stops: the one naming the chunk whose record
 * holds addr, else the empty slot that ends the run. */
static inline uint64_t live_index_slot_of(const live_index *x, const chunk_store *s,
                                          uint64_t addr)
{
    uint64_t i = live_index_home(x, addr);
    uint32_t c;
    while ((c = x->slots[i]) != CHUNK_NIL && chunk_at(s, c)->addr != addr)
        i = (i + 1) & x->mask;
    return i;
}

/* The chunk whose record holds addr, or CHUNK_NIL. */
static inline uint32_t live_index_find(const live_index *x, const chunk_store *s, uint64_t addr)
{
    return x->slots[live_index_slot_of(x, s, addr)];
}

/* Removes and returns the chunk at addr, or CHUNK_NIL. Inline: every free
 * calls it, and the call cost 2% of replay's instructions. */
static inline uint32_t live_index_take(live_index *x, const chunk_store *s, uint64_t addr)
{
    const uint64_t i = live_index_slot_of(x, s, addr);
    const uint32_t c = x->slots[i];
    if (c == CHUNK_NIL)
        return CHUNK_NIL;
    /* Backward-shift deletion (linear_probe.h). */
    uint64_t hole = i;
    for (uint64_t j = (i + 1) & x->mask; x->slots[j]; j = (j + 1) & x->mask) {
        uint64_t home = live_index_home(x, chunk_at(s, x->slots[j])->addr);
        if (probe_may_fill_hole(hole, j, home)) {
            x->slots[hole] = x->slots[j];
            hole = j;
        }
    }
    x->slots[hole] = CHUNK_NIL;
    x->count--;
    return c;
}

static inline uint64_t live_index_host_bytes(const live_index *x)
{
    return (x->mask + 1) * sizeof(uint32_t);
}

#endif
