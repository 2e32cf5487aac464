/* bins.c - bitmap-indexed bins of free chunks (see bins.h). */
#include "bins.h"

#include <string.h>


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

uint32_t bins_largest(const bin_set *b, const chunk_store *s)
{
    if (!b->summary)
        return CHUNK_NIL;
    uint32_t w = bits_msb64(b->summary);
    uint32_t bin = (w << 6) + bits_msb64(b->words[w]);
    return tree_last(s, b->root[bin]);
}
