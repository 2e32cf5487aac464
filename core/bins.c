/* bins.c - bitmap-indexed bins of free chunks (see bins.h). */
#include "bins.h"

#include <string.h>

#include "chunk_tree.h"

_Static_assert(BIN_WORDS <= 64, "the summary word indexes every bitmap word");
_Static_assert(BIN_COUNT % 64 == 0, "bins fill whole bitmap words");

uint64_t bin_min_size(uint32_t b)
{
    if (b < 2 * BIN_SUB_COUNT)
        return (uint64_t)b << 8;
    unsigned f = b / BIN_SUB_COUNT + BIN_SUB_BITS - 1u;
    uint64_t u = (uint64_t)(BIN_SUB_COUNT + b % BIN_SUB_COUNT) << (f - BIN_SUB_BITS);
    return u << 8;
}

void bins_init(bin_set *b)
{
    memset(b, 0, sizeof *b);
}

static inline void mark(bin_set *b, uint32_t bin)
{
    b->words[bin >> 6] |= UINT64_C(1) << (bin & 63);
    b->summary |= UINT64_C(1) << (bin >> 6);
}

static inline void unmark(bin_set *b, uint32_t bin)
{
    uint64_t w = b->words[bin >> 6] &= ~(UINT64_C(1) << (bin & 63));
    if (!w)
        b->summary &= ~(UINT64_C(1) << (bin >> 6));
}

void bins_insert(bin_set *b, chunk_store *s, uint32_t c)
{
    const chunk *cc = chunk_at(s, c);
    uint32_t bin = bin_index(cc->size);
    if (b->root[bin] == CHUNK_NIL)
        mark(b, bin);
    tree_insert(s, &b->root[bin], c);
    uint32_t f = b->first[bin];
    if (f == CHUNK_NIL || cc->size < chunk_at(s, f)->size ||
        (cc->size == chunk_at(s, f)->size && cc->addr < chunk_at(s, f)->addr))
        b->first[bin] = c;
    b->count++;
    b->bytes += cc->size;
}

void bins_remove(bin_set *b, chunk_store *s, uint32_t c)
{
    uint64_t size = chunk_at(s, c)->size;
    uint32_t bin = bin_index(size);
    if (b->first[bin] == c)
        b->first[bin] = tree_next(s, c);
    tree_remove(s, &b->root[bin], c);
    if (b->root[bin] == CHUNK_NIL)
        unmark(b, bin);
    b->count--;
    b->bytes -= size;
}

uint32_t bins_next_nonempty(const bin_set *b, uint32_t from)
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

uint32_t bins_best_fit(const bin_set *b, const chunk_store *s, uint64_t size)
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

uint32_t bins_largest(const bin_set *b, const chunk_store *s)
{
    if (!b->summary)
        return CHUNK_NIL;
    uint32_t w = bits_msb64(b->summary);
    uint32_t bin = (w << 6) + bits_msb64(b->words[w]);
    return tree_last(s, b->root[bin]);
}
