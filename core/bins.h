/*
 * bins.h - segregated bins of free chunks with a bitmap index.
 *
 * Size classes (TLSF-style two-level mapping, over units of 256 bytes):
 *   u = size / 256
 *   u < 32            -> bin u           (exact: one size per bin)
 *   u >= 32, f=log2 u -> bin (f-4)*32 + the next 5 bits of u below the top one
 * so bins below 16 KiB hold one size each and larger bins span at most 1/32
 * (3%) of their size. 1152 bins cover sizes below 2^48 bytes.
 *
 * Finding the best fit for a size r:
 *   1. in r's own bin, the tree's lower bound of r (smallest size >= r, lowest
 *      address among equals); the cached smallest node answers at once when
 *      it already fits;
 *   2. otherwise the first non-empty bin above, found with two find-first-set
 *      steps over the bitmap (a summary word over 18 words), and its cached
 *      smallest node.
 * Every chunk in a higher bin is larger than every chunk in a lower one, so
 * this is exact best fit, as TSL's BFC defines it, but it never scans empty
 * bins and never walks a list: O(log k) for k chunks in one bin, O(1) for the
 * bitmap.
 */
#ifndef BFCSHIM_CORE_BINS_H
#define BFCSHIM_CORE_BINS_H

#include <stdint.h>

#include "chunks.h"

#define BIN_SUB_BITS 5u
#define BIN_SUB_COUNT (1u << BIN_SUB_BITS)
#define BIN_COUNT 1152u
#define BIN_WORDS (BIN_COUNT / 64u)
#define BIN_NONE UINT32_MAX

typedef struct bin_set {
    uint64_t summary;            /* bit w: words[w] != 0 */
    uint64_t words[BIN_WORDS];   /* bit b: bin b non-empty */
    uint32_t root[BIN_COUNT];    /* tree of each bin */
    uint32_t first[BIN_COUNT];   /* smallest (size, addr) of each bin */
    uint64_t count;              /* chunks in the set */
    uint64_t bytes;              /* their total size */
} bin_set;

static inline unsigned bits_msb64(uint64_t x) { return 63u - (unsigned)__builtin_clzll(x); }
static inline unsigned bits_ctz64(uint64_t x) { return (unsigned)__builtin_ctzll(x); }

/* Bin of a size (a positive multiple of 256 below 2^48). */
static inline uint32_t bin_index(uint64_t size)
{
    uint64_t u = size >> 8;
    if (u < BIN_SUB_COUNT)
        return (uint32_t)u;
    unsigned f = bits_msb64(u);
    uint32_t sub = (uint32_t)(u >> (f - BIN_SUB_BITS)) - BIN_SUB_COUNT;
    return (f - BIN_SUB_BITS + 1u) * BIN_SUB_COUNT + sub;
}

/* Smallest size that maps to bin b. */
uint64_t bin_min_size(uint32_t b);

void bins_init(bin_set *b);
void bins_insert(bin_set *b, chunk_store *s, uint32_t c);
void bins_remove(bin_set *b, chunk_store *s, uint32_t c);
/* Best fit for `size`, or CHUNK_NIL. */
uint32_t bins_best_fit(const bin_set *b, const chunk_store *s, uint64_t size);
/* Largest chunk in the set, or CHUNK_NIL. */
uint32_t bins_largest(const bin_set *b, const chunk_store *s);
/* First non-empty bin at or above `from`, or BIN_NONE. */
uint32_t bins_next_nonempty(const bin_set *b, uint32_t from);

#endif
