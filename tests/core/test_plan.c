/* test_plan.c - placement from a plan (core/plan.c). */
#include "pool_fixture.h"

static bfc_addr region_base(fixture *f)
{
    /* The first allocation of a fresh low-placement pool lands at the base. */
    bfc_addr a = must_alloc(f, 256);
    must_free(f, a);
    return a;
}

/* Each size's allocations go, in order, to that size's planned offsets,
 * whatever the sizes' interleaving; a size with no entry left falls back. */
static void allocations_go_where_the_plan_says(void)
{
    fixture f;
    fixture_begin(&f, 64 * MiB);
    fixture_start(&f);
    bfc_addr base = region_base(&f);
    const bfc_plan_entry plan[] = {
        {1 * MiB, 40 * MiB}, {4 * MiB, 8 * MiB}, {1 * MiB, 20 * MiB}, {4 * MiB, 60 * MiB},
    };
    CHECK_EQ(bfc_pool_set_plan(f.pool, plan, 4), BFC_OK);
    bfc_addr a = must_alloc(&f, 4 * MiB);   /* first 4 MiB: 8 MiB */
    bfc_addr b = must_alloc(&f, 1 * MiB);   /* first 1 MiB: 40 MiB */
    bfc_addr c = must_alloc(&f, 1 * MiB - 100); /* rounds to 1 MiB: the second, 20 MiB */
    bfc_addr d = must_alloc(&f, 4 * MiB);   /* 60 MiB: the region's last bytes */
    bfc_addr e = must_alloc(&f, 1 * MiB);   /* none left: low placement, the base */
    bfc_addr g = must_alloc(&f, 512 * KiB); /* a size the plan never saw */
    CHECK_EQ(a, base + 8 * MiB);
    CHECK_EQ(b, base + 40 * MiB);
    CHECK_EQ(c, base + 20 * MiB);
    CHECK_EQ(d, base + 60 * MiB);
    CHECK_EQ(e, base);
    CHECK_EQ(g, base + 1 * MiB);
    bfc_stats st;
    st = stats_of(&f);
    CHECK_EQ(st.num_planned, 4);
    CHECK_EQ(st.num_plan_misses, 0);
    bfc_addr all[] = {a, b, c, d, e, g};
    for (unsigned i = 0; i < 6; i++)
        must_free(&f, all[i]);
    st = stats_of(&f);
    CHECK_EQ(st.num_free_chunks, 1); /* everything merged back */
    fixture_end(&f);
}

/* A planned place that is not wholly free (a run that strayed) is counted
 * as a miss and the rule places the block; the next allocation of the size
 * still takes its own planned place. */
static void a_place_taken_falls_back_and_the_plan_goes_on(void)
{
    fixture f;
    fixture_begin(&f, 16 * MiB);
    fixture_start(&f);
    bfc_addr base = region_base(&f);
    bfc_addr squatter = must_alloc(&f, 3 * MiB); /* [0, 3 MiB): no plan yet */
    const bfc_plan_entry plan[] = {{2 * MiB, 2 * MiB}, {2 * MiB, 10 * MiB}};
    CHECK_EQ(bfc_pool_set_plan(f.pool, plan, 2), BFC_OK);
    bfc_addr a = must_alloc(&f, 2 * MiB); /* 2 MiB overlaps the squatter */
    bfc_addr b = must_alloc(&f, 2 * MiB);
    CHECK_EQ(a, base + 3 * MiB); /* low placement, after the squatter */
    CHECK_EQ(b, base + 10 * MiB);
    bfc_stats st;
    st = stats_of(&f);
    CHECK_EQ(st.num_planned, 1);
    CHECK_EQ(st.num_plan_misses, 1);
    /* The occurrence count restarts when a plan is installed again. */
    must_free(&f, b);
    CHECK_EQ(bfc_pool_set_plan(f.pool, plan, 2), BFC_OK);
    bfc_addr c = must_alloc(&f, 2 * MiB);
    CHECK_EQ(c, base + 5 * MiB); /* 2 MiB is taken by a: a miss again */
    bfc_addr d = must_alloc(&f, 2 * MiB);
    CHECK_EQ(d, base + 10 * MiB);
    must_free(&f, squatter);
    must_free(&f, a);
    must_free(&f, c);
    must_free(&f, d);
    fixture_end(&f);
}

/* A place at the start of a free chunk, one filling a free chunk exactly,
 * and one inside a chunk that holds several planned blocks. */
static void every_kind_of_carve_keeps_the_pool_whole(void)
{
    fixture f;
    fixture_begin(&f, 8 * MiB);
    fixture_start(&f);
    bfc_addr base = region_base(&f);
    const bfc_plan_entry plan[] = {
        {1 * MiB, 0}, {2 * MiB, 6 * MiB}, {1 * MiB, 3 * MiB}, {1 * MiB, 4 * MiB},
        {1 * MiB, 5 * MiB}, {1 * MiB, 2 * MiB}, {1 * MiB, 1 * MiB},
    };
    CHECK_EQ(bfc_pool_set_plan(f.pool, plan, 7), BFC_OK);
    bfc_addr x[7];
    x[0] = must_alloc(&f, 1 * MiB); /* the low end of the region */
    x[1] = must_alloc(&f, 2 * MiB); /* the high end */
    for (int i = 2; i < 7; i++)
        x[i] = must_alloc(&f, 1 * MiB); /* inside, then filling gaps exactly */
    const uint64_t want[] = {0, 6, 3, 4, 5, 2, 1};
    for (int i = 0; i < 7; i++)
        CHECK_EQ(x[i], base + want[i] * MiB);
    bfc_stats st;
    st = stats_of(&f);
    CHECK_EQ(st.num_planned, 7);
    CHECK_EQ(st.free_bytes, 0);
    CHECK_EQ(st.num_chunks, 7);
    for (int i = 0; i < 7; i++)
        must_free(&f, x[i]);
    fixture_end(&f);
}

/* Bad entries are refused with the pool and its old plan intact; a place
 * past the region's end is a miss, not an error; n = 0 removes the plan. */
static void bad_plans_are_refused_and_change_nothing(void)
{
    fixture f;
    fixture_begin(&f, 4 * MiB);
    fixture_start(&f);
    bfc_addr base = region_base(&f);
    const bfc_plan_entry good[] = {{1 * MiB, 2 * MiB}, {1 * MiB, 8 * MiB}};
    const bfc_plan_entry odd_offset[] = {{1 * MiB, 100}};
    const bfc_plan_entry odd_size[] = {{1000, 0}};
    const bfc_plan_entry zero_size[] = {{0, 0}};
    const bfc_plan_entry overflow[] = {{1 * MiB, UINT64_MAX - 255}};
    CHECK_EQ(bfc_pool_set_plan(f.pool, good, 2), BFC_OK);
    CHECK_EQ(bfc_pool_set_plan(f.pool, odd_offset, 1), BFC_ERR_INVALID);
    CHECK_EQ(bfc_pool_set_plan(f.pool, odd_size, 1), BFC_ERR_INVALID);
    CHECK_EQ(bfc_pool_set_plan(f.pool, zero_size, 1), BFC_ERR_INVALID);
    CHECK_EQ(bfc_pool_set_plan(f.pool, overflow, 1), BFC_ERR_INVALID);
    CHECK_EQ(bfc_pool_set_plan(f.pool, NULL, 1), BFC_ERR_INVALID);
    bfc_addr a = must_alloc(&f, 1 * MiB);
    bfc_addr b = must_alloc(&f, 1 * MiB); /* planned at 8 MiB: outside 4 MiB */
    CHECK_EQ(a, base + 2 * MiB);
    CHECK_EQ(b, base + 3 * MiB); /* the rule's best fit: the 1 MiB above a */
    bfc_stats st;
    st = stats_of(&f);
    CHECK_EQ(st.num_planned, 1);
    CHECK_EQ(st.num_plan_misses, 1);
    CHECK_EQ(bfc_pool_set_plan(f.pool, NULL, 0), BFC_OK);
    bfc_addr c = must_alloc(&f, 1 * MiB);
    CHECK_EQ(c, base);
    st = stats_of(&f);
    CHECK_EQ(st.num_plan_misses, 1);
    must_free(&f, a);
    must_free(&f, b);
    must_free(&f, c);
    fixture_end(&f);
}

/* Once a growing pool has a second region, offsets no longer name one
 * place: the plan stands aside. */
static void a_second_region_sets_the_plan_aside(void)
{
    fixture f;
    fixture_begin_growing(&f, 64 * MiB);
    fixture_start(&f);
    bfc_addr base = region_base(&f);
    const bfc_plan_entry plan[] = {{1 * MiB, 1 * MiB}, {4 * MiB, 0}, {1 * MiB, 0}};
    CHECK_EQ(bfc_pool_set_plan(f.pool, plan, 3), BFC_OK);
    bfc_addr a = must_alloc(&f, 1 * MiB);
    CHECK_EQ(a, base + 1 * MiB);
    bfc_addr big = must_alloc(&f, 4 * MiB); /* no room in 2 MiB: a second region */
    bfc_addr b = must_alloc(&f, 1 * MiB); /* planned at 0, free: not consulted */
    CHECK_EQ(b, base); /* (the rule's best fit is there too) */
    bfc_stats st;
    st = stats_of(&f);
    CHECK_EQ(st.num_regions, 2);
    CHECK_EQ(st.num_planned, 1);
    CHECK_EQ(st.num_plan_misses, 1); /* big: 4 MiB at 0 overruns 2 MiB */
    must_free(&f, a);
    must_free(&f, big);
    must_free(&f, b);
    fixture_end(&f);
}

/* Host memory the plan holds is counted. */
static void the_plan_counts_in_host_memory(void)
{
    fixture f;
    fixture_begin(&f, 64 * MiB);
    fixture_start(&f);
    bfc_stats before, after;
    before = stats_of(&f);
    bfc_plan_entry plan[100];
    for (int i = 0; i < 100; i++)
        plan[i] = (bfc_plan_entry){256 * (uint64_t)(i % 7 + 1), 256 * (uint64_t)i};
    CHECK_EQ(bfc_pool_set_plan(f.pool, plan, 100), BFC_OK);
    after = stats_of(&f);
    CHECK(after.host_metadata_bytes >= before.host_metadata_bytes + 100 * 8);
    fixture_end(&f);
}

int main(void)
{
    RUN(allocations_go_where_the_plan_says);
    RUN(a_place_taken_falls_back_and_the_plan_goes_on);
    RUN(every_kind_of_carve_keeps_the_pool_whole);
    RUN(bad_plans_are_refused_and_change_nothing);
    RUN(a_second_region_sets_the_plan_aside);
    RUN(the_plan_counts_in_host_memory);
    return harness_result();
}
