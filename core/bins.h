/*
 * bins.h - segregated bins of free chunks with a bitmap index.
 *
 * Size classes (TLSF-style two-level mapping, over units of 256 bytes):
 *   u = size / 256
 *   u < 32            -> bin u           (exact: one size per bin)
 *   u >= 32, f=log2 u -> bin (f-4)*32 + the next 5 bits of u below the top one
 * so bins below 16 KiB hold one size each and larger bins span at most 1/32
 * (3%) of their size. The bins cover exactly the sizes below BFC_SIZE_LIMIT
 * (2^48 bytes: 1152 bins), the sizes the pool handles; BIN_COUNT is derived
 * from it, so the pool's size check and the bins agree.
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

#include "bfc.h"
#include "chunk_tree.h"
#include "chunks.h"

#define BIN_SUB_BITS 5u
#define BIN_SUB_COUNT (1u << BIN_SUB_BITS)
/* Sizes below 2^L bytes are below 2^(L-8) units, whose top bit is at most
 * L-9; the bins of top bit f >= 5 are (f-4)*32 .. (f-4)*32+31, so the last
 * is (L-13)*32+31 and there are (L-12)*32. */
#define BIN_COUNT ((BFC_SIZE_LIMIT_BITS - 12u) << BIN_SUB_BITS)
#define BIN_WORDS (BIN_COUNT / 64u)
#define BIN_NONE UINT32_MAX

typedef struct bin_set {
    uint64_t summary;            /* bit w: words[w] != 0 */
    uint64_t words[BIN_WORDS];   /* bit b: bin b non-empty */
    uint32_t root[BIN_COUNT];    /* tree of each bin */
    uint32_t first[BIN_COUNT];   /* smallest (size, addr) of each bin */
} bin_set;

static inline unsigned bits_msb64(uint64_t x) { return 63u - (unsigned)__builtin_clzll(x); }
static inline unsigned bits_ctz64(uint64_t x) { return (unsigned)__builtin_ctzll(x); }

/* Bin of a size (a positive multiple of 256 below BFC_SIZE_LIMIT; a larger
 * one would index past the bins). Branch-free: with
 * f = top bit of (u | 32), bin = (f - 5) * 32 + (u >> (f - 5)); below 32
 * units f is 5 and the bin is u itself, and from 32 up the shifted value is
 * the 1 + 5 leading bits of u, so each power of two spans 32 bins. */
static inline uint32_t bin_index(uint64_t size)
{
    uint64_t u = size >> 8;
    unsigned shift = bits_msb64(u | BIN_SUB_COUNT) - BIN_SUB_BITS;
    return (shift << BIN_SUB_BITS) + (uint32_t)(u >> shift);
}

/* Smallest size that maps to bin b. */
uint64_t bin_min_size(uint32_t b);

void bins_init(bin_set *b);
/* Largest chunk in the set, or CHUNK_NIL. */
uint32_t bins_largest(const bin_set *b, const chunk_store *s);

/* The hot path: inline, so that an allocation is one function body. */

static inline void bins_mark(bin_set *b, uint32_t bin)
{
    b->words[bin >> 6] |= UINT64_C(1) << (bin & 63);
    b->summary |= UINT64_C(1) << (bin >> 6);
}

static inline void bins_unmark(bin_set *b, uint32_t bin)
{
    uint64_t w = b->words[bin >> 6] &= ~(UINT64_C(1) << (bin & 63));
    if (!w)
        b->summary &= ~(UINT64_C(1) << (bin >> 6));
}

/*
 * Most bins hold one chunk at a time (on the ~10^4-live-chunk benchmark, 76%
 * of insertions go into an empty bin and 76% of removals empty one), so the
 * one-node tree is built and taken apart here without the tree code: a black
 * root with no children is a valid red-black tree.
 */
/* Files c under `bin`, its size's bin. */
static inline void bins_insert_in(bin_set *b, chunk_store *s, uint32_t c, uint32_t bin)
{
    chunk *cc = chunk_at(s, c);
    if (b->root[bin] == CHUNK_NIL) {
        bins_mark(b, bin);
        cc->left = cc->right = cc->parent = CHUNK_NIL;
        cc->red = 0;
        b->root[bin] = b->first[bin] = c;
    } else {
        tree_insert(s, &b->root[bin], c);
        uint32_t f = b->first[bin];
        if (cc->size < chunk_at(s, f)->size ||
            (cc->size == chunk_at(s, f)->size && cc->addr < chunk_at(s, f)->addr))
            b->first[bin] = c;
    }
}

static inline void bins_insert(bin_set *b, chunk_store *s, uint32_t c)
{
    bins_insert_in(b, s, c, bin_index(chunk_at(s, c)->size));
}

/* Removes c, which is filed under `bin` (its size's bin). */
static inline void bins_remove_from(bin_set *b, chunk_store *s, uint32_t c, uint32_t bin)
{
    chunk *cc = chunk_at(s, c);
    if (b->root[bin] == c && cc->left == CHUNK_NIL && cc->right == CHUNK_NIL) {
        b->root[bin] = b->first[bin] = CHUNK_NIL; /* the only chunk */
        bins_unmark(b, bin);
    } else {
        if (b->first[bin] == c)
            b->first[bin] = tree_next(s, c);
        tree_remove(s, &b->root[bin], c);
    }
}

static inline void bins_remove(bin_set *b, chunk_store *s, uint32_t c)
{
    bins_remove_from(b, s, c, bin_index(chunk_at(s, c)->size));
}

static inline int key_before(const chunk *a, const chunk *b)
{
    return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

/*
 * Re-keying without leaving the tree. Splits only shrink a chunk and merges
 * only grow one, so a changed key usually keeps its rank: then the node stays
 * where it is and the tree is not touched. Checking one in-order neighbour
 * (the predecessor for a shrink, the successor for a growth) is far cheaper
 * than a removal and an insertion with their rebalancing.
 */

/* c, in the set under `bin`, changes size to new_size at the same address. */
static inline __attribute__((always_inline)) void bins_resize_in(bin_set *b, chunk_store *s, uint32_t c, uint32_t bin,
                                  uint64_t new_size)
{
    chunk *cc = chunk_at(s, c);
    const uint32_t to = bin_index(new_size);
    bool keep = to == bin;
    if (keep) {
        const chunk probe = {.addr = cc->addr, .size = new_size};
        if (new_size < cc->size) {
            uint32_t pred = b->first[bin] == c ? CHUNK_NIL : tree_prev(s, c);
            keep = pred == CHUNK_NIL || key_before(chunk_at(s, pred), &probe);
        } else {
            uint32_t succ = tree_next(s, c);
            keep = succ == CHUNK_NIL || key_before(&probe, chunk_at(s, succ));
        }
    }
    if (keep) {
        cc->size = new_size;
        return;
    }
    bins_remove_from(b, s, c, bin);
    cc->size = new_size;
    bins_insert_in(b, s, c, to);
}

static inline void bins_resize(bin_set *b, chunk_store *s, uint32_t c, uint64_t new_size)
{
    bins_resize_in(b, s, c, bin_index(chunk_at(s, c)->size), new_size);
}

/* `by` (not in any set, its key set) takes the place of `old` (in the set),
 * whose key is smaller (a merge) or larger (a split's remainder). */
static inline __attribute__((always_inline)) void bins_substitute(bin_set *b, chunk_store *s, uint32_t old, uint32_t by)
{
    chunk *oc = chunk_at(s, old), *bc = chunk_at(s, by);
    const uint32_t bin = bin_index(oc->size), to = bin_index(bc->size);
    bool keep = to == bin;
    if (keep) {
        uint32_t pred = b->first[bin] == old ? CHUNK_NIL : tree_prev(s, old);
        uint32_t succ = tree_next(s, old);
        keep = (pred == CHUNK_NIL || key_before(chunk_at(s, pred), bc)) &&
               (succ == CHUNK_NIL || key_before(bc, chunk_at(s, succ)));
    }
    if (!keep) {
        bins_remove_from(b, s, old, bin);
        bins_insert_in(b, s, by, to);
        return;
    }
    tree_replace(s, &b->root[bin], old, by);
    if (b->first[bin] == old)
        b->first[bin] = by;
}

static inline uint32_t bins_next_nonempty(const bin_set *b, uint32_t from)
{
    if (from >= BIN_COUNT)
        return BIN_NONE;
    uint32_t w = from >> 6;
    uint64_t m = b->words[w] & (~UINT64_C(0) << (from & 63));
    if (m)
        return (w << 6) + bits_ctz64(m);
    uint64_t rest = w + 1 < 64 ? b->summary & (~UINT64_C(0) << (w + 1)) : 0;
    if (!rest)
        return BIN_NONE;
    w = bits_ctz64(rest);
    return (w << 6) + bits_ctz64(b->words[w]);
}

static inline uint32_t bins_best_fit(const bin_set *b, const chunk_store *s,
                                     uint64_t size)
{
    uint32_t bin = bin_index(size);
    uint32_t f = b->first[bin];
    if (f != CHUNK_NIL) {
        if (chunk_at(s, f)->size >= size)
            return f;
        uint32_t c = tree_lower_bound(s, b->root[bin], size);
        if (c != CHUNK_NIL)
            return c;
    }
    uint32_t next = bins_next_nonempty(b, bin + 1);
    return next == BIN_NONE ? CHUNK_NIL : b->first[next];
}


#endif
