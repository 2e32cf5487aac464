/* The live index (address -> chunk handle), against a direct-indexed model,
 * with addresses laid out as a pool lays them out. */
#include <string.h>

#include "harness.h"
#include "live_index.h"

#define KEYS 50000

static uint32_t model[KEYS]; /* handle, 0 when absent */

static uint64_t addr_of(uint32_t k)
{
    return UINT64_C(0x7f0000000000) + (uint64_t)k * 512;
}

static void random_insert_take_find_agree_with_model(void)
{
    chunk_store s;
    live_index x;
    REQUIRE(chunk_store_init(&s));
    REQUIRE(live_index_init(&x));
    uint64_t rng = 7, live = 0;
    for (int step = 0; step < 400000; step++) {
        uint32_t k = (uint32_t)rng_below(&rng, KEYS);
        switch (rng_below(&rng, 3)) {
        case 0:
            if (!model[k]) {
                REQUIRE(chunk_store_reserve(&s, 1) && live_index_reserve(&x, &s, 1));
                uint32_t c = chunk_new(&s);
                chunk_at(&s, c)->addr = addr_of(k);
                live_index_insert(&x, &s, c);
                model[k] = c;
                live++;
            }
            break;
        case 1: {
            uint32_t c = live_index_take(&x, &s, addr_of(k));
            CHECK_EQ(c, model[k]);
            if (c) {
                chunk_release(&s, c);
                live--;
            }
            model[k] = 0;
            break;
        }
        default:
            CHECK_EQ(live_index_find(&x, &s, addr_of(k)), model[k]);
        }
        CHECK_EQ(x.count, live);
        if (harness_failures)
            break;
    }
    for (uint32_t k = 0; k < KEYS; k++)
        CHECK_EQ(live_index_find(&x, &s, addr_of(k)), model[k]);
    /* Grown only when more than 1/LIVE_INDEX_MAX_LOAD full, so under twice
     * that many slots per entry (the 1024 allow for the run's peak), 4
     * bytes a slot. */
    CHECK(live_index_host_bytes(&x) <= 4 * 2 * LIVE_INDEX_MAX_LOAD * (live + 1024));
    CHECK_EQ(live_index_find(&x, &s, 0x1000), CHUNK_NIL);
    CHECK_EQ(live_index_take(&x, &s, 0x1000), CHUNK_NIL);
    live_index_fini(&x);
    chunk_store_fini(&s);
}

int main(void)
{
    RUN(random_insert_take_find_agree_with_model);
    return harness_result();
}
