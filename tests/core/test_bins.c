/* Size classes and the bitmap index of free bins. */
#include "bfc.h"
#include "bins.h"
#include "chunk_tree.h"
#include "harness.h"

static void size_classes_are_ordered_and_tight(void)
{
    /* Exact bins below 64 units, then at most 1/32 spread per bin. */
    for (uint64_t s = 256; s < (UINT64_C(64) << 8); s += 256)
        CHECK_EQ(bin_min_size(bin_index(s)), s);
    uint64_t rng = 1;
    uint32_t prev_bin = 0;
    for (uint64_t u = 1; u < (UINT64_C(1) << 20); u++) {
        uint32_t b = bin_index(u << 8);
        CHECK(b >= prev_bin);
        CHECK(b <= prev_bin + 1);
        prev_bin = b;
    }
    for (int i = 0; i < 200000; i++) {
        uint64_t size = (rng_below(&rng, (BFC_SIZE_LIMIT >> 8) - 1) + 1) << 8;
        uint32_t b = bin_index(size);
        CHECK(b < BIN_COUNT);
        CHECK(bin_min_size(b) <= size);
        if (b + 1 < BIN_COUNT)
            CHECK(size < bin_min_size(b + 1));
        /* Spread within a bin: at most 1/32 of its lower bound. */
        if (b + 1 < BIN_COUNT)
            CHECK(bin_min_size(b + 1) - bin_min_size(b) <= bin_min_size(b) / 32 + 256);
    }
    /* The bins end exactly at the limit: its last size is in the last bin,
     * and the limit itself would be one past it. */
    CHECK_EQ(bin_index(BFC_SIZE_LIMIT - 256), BIN_COUNT - 1);
    CHECK_EQ(bin_index(BFC_SIZE_LIMIT), BIN_COUNT);
    for (uint32_t b = 1; b < BIN_COUNT; b++)
        CHECK_EQ(bin_index(bin_min_size(b)), b);
}

static chunk_store store;

static uint32_t make_chunk(uint64_t addr, uint64_t size)
{
    REQUIRE(chunk_store_reserve(&store, 1));
    uint32_t c = chunk_new(&store);
    chunk_at(&store, c)->addr = addr;
    chunk_at(&store, c)->size = size;
    return c;
}

static void best_fit_is_smallest_then_lowest_address(void)
{
    REQUIRE(chunk_store_init(&store));
    bin_set *b = malloc(sizeof *b);
    REQUIRE(b);
    bins_init(b);
    CHECK_EQ(bins_best_fit(b, &store, 256), CHUNK_NIL);
    CHECK_EQ(bins_largest(b, &store), CHUNK_NIL);

    uint32_t big = make_chunk(0x100000, 1 << 20);
    uint32_t mid_hi = make_chunk(0x900000, 20480);
    uint32_t mid_lo = make_chunk(0x500000, 20480);
    uint32_t mid_odd = make_chunk(0x700000, 20736); /* same bin as 20480 */
    uint32_t small = make_chunk(0x200000, 512);
    bins_insert(b, &store, big);
    bins_insert(b, &store, mid_hi);
    bins_insert(b, &store, mid_lo);
    bins_insert(b, &store, mid_odd);
    bins_insert(b, &store, small);
    CHECK_EQ(bin_index(20480), bin_index(20736));

    CHECK_EQ(bins_best_fit(b, &store, 256), small);
    CHECK_EQ(bins_best_fit(b, &store, 512), small);
    CHECK_EQ(bins_best_fit(b, &store, 768), mid_lo);     /* lowest of two equals */
    CHECK_EQ(bins_best_fit(b, &store, 20480), mid_lo);
    CHECK_EQ(bins_best_fit(b, &store, 20736), mid_odd);  /* inside the bin */
    CHECK_EQ(bins_best_fit(b, &store, 20992), big);      /* next bin up */
    CHECK_EQ(bins_best_fit(b, &store, (1 << 20) + 256), CHUNK_NIL);
    CHECK_EQ(bins_largest(b, &store), big);

    bins_remove(b, &store, mid_lo);
    CHECK_EQ(bins_best_fit(b, &store, 768), mid_hi);
    bins_remove(b, &store, mid_hi);
    bins_remove(b, &store, mid_odd);
    CHECK_EQ(bins_best_fit(b, &store, 768), big);
    CHECK_EQ(bins_best_fit(b, &store, 256), small); /* the two left */
    CHECK_EQ(bins_largest(b, &store), big);
    bins_remove(b, &store, big);
    bins_remove(b, &store, small);
    CHECK_EQ(b->summary, 0);
    for (uint32_t w = 0; w < BIN_WORDS; w++)
        CHECK_EQ(b->words[w], 0);
    free(b);
    chunk_store_fini(&store);
}

static void bitmap_search_crosses_words(void)
{
    REQUIRE(chunk_store_init(&store));
    bin_set *b = malloc(sizeof *b);
    REQUIRE(b);
    bins_init(b);
    uint64_t huge = UINT64_C(1) << 40;
    uint32_t c = make_chunk(0x10000000, huge);
    bins_insert(b, &store, c);
    CHECK(bin_index(huge) / 64 > 1);
    CHECK_EQ(bins_next_nonempty(b, 0), bin_index(huge));
    CHECK_EQ(bins_next_nonempty(b, bin_index(huge) + 1), BIN_NONE);
    CHECK_EQ(bins_next_nonempty(b, BIN_COUNT), BIN_NONE);
    CHECK_EQ(bins_best_fit(b, &store, 256), c);
    free(b);
    chunk_store_fini(&store);
}

int main(void)
{
    RUN(size_classes_are_ordered_and_tight);
    RUN(best_fit_is_smallest_then_lowest_address);
    RUN(bitmap_search_crosses_words);
    return harness_result();
}
