/* The trace parser's pointer map, against a direct-indexed model. */
#include <string.h>

#include "ptr_map.h"
#include "harness.h"

#define KEYS 50000

static uint32_t model[KEYS]; /* value + 0 when absent */

static void random_put_take_get_agree_with_model(void)
{
    ptr_map m;
    REQUIRE(ptr_map_init(&m));
    uint64_t rng = 7;
    uint64_t live = 0;
    for (int step = 0; step < 400000; step++) {
        uint32_t k = (uint32_t)rng_below(&rng, KEYS);
        /* Keys clustered in address space, as pool addresses are. */
        uint64_t key = UINT64_C(0x7f0000000000) + (uint64_t)k * 512;
        switch (rng_below(&rng, 3)) {
        case 0:
            if (!model[k]) {
                REQUIRE(ptr_map_reserve(&m, 1));
                uint32_t v = (uint32_t)rng_below(&rng, 1u << 30) + 1;
                ptr_map_put(&m, key, v);
                model[k] = v;
                live++;
            }
            break;
        case 1:
            CHECK_EQ(ptr_map_take(&m, key), model[k]);
            if (model[k])
                live--;
            model[k] = 0;
            break;
        default:
            CHECK_EQ(ptr_map_get(&m, key), model[k]);
        }
        CHECK_EQ(m.count, live);
        if (harness_failures)
            break;
    }
    for (uint32_t k = 0; k < KEYS; k++)
        CHECK_EQ(ptr_map_get(&m, UINT64_C(0x7f0000000000) + (uint64_t)k * 512), model[k]);
    CHECK(ptr_map_host_bytes(&m) <= 4 * 16 * (live + 1024));
    CHECK_EQ(ptr_map_get(&m, 0), 0);
    CHECK_EQ(ptr_map_take(&m, 0), 0);
    ptr_map_fini(&m);
}

int main(void)
{
    RUN(random_put_take_get_agree_with_model);
    return harness_result();
}
