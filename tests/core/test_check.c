/* The invariant checker must catch what it claims to: each case builds a
 * healthy pool, damages one structure the way a bug would, and requires a
 * report. Without these, a checker that found nothing would pass the
 * property test as well as a correct engine does. */
#include <stdio.h>

#include "pool_fixture.h"
#include "pool_internal.h"

/* Three live blocks with a free one between the first two:
 *   [a live][b free][c live][d live][rest free] */
static void build(fixture *f, bfc_addr *a, bfc_addr *c)
{
    fixture_begin(f, 64 * MiB);
    fixture_start(f);
    bfc_addr b, d;
    *a = must_alloc(f, 1 * MiB);
    b = must_alloc(f, 2 * MiB);
    *c = must_alloc(f, 1 * MiB);
    d = must_alloc(f, 1 * MiB);
    (void)d;
    must_free(f, b);
    CHECK_EQ(bfc_pool_check(f->pool, stderr), 0);
}

static uint32_t free_chunk_after(bfc_pool *p, bfc_addr live)
{
    uint32_t c = live_index_find(&p->live, &p->chunks, live);
    REQUIRE(c != CHUNK_NIL);
    uint32_t n = C(p, c)->next;
    REQUIRE(n != CHUNK_NIL && C(p, n)->state == CHUNK_FREE);
    return n;
}

static size_t violations(fixture *f)
{
    /* The damage is reported on /dev/null: the count is what matters. */
    FILE *quiet = fopen("/dev/null", "w");
    size_t v = bfc_pool_check(f->pool, quiet);
    if (quiet)
        fclose(quiet);
    return v;
}

static void free_chunk_missing_from_the_bins(void)
{
    fixture f;
    bfc_addr a, c;
    build(&f, &a, &c);
    bfc_pool *p = f.pool;
    uint32_t hole = free_chunk_after(p, a);
    bins_remove(&p->free_bins, &p->chunks, hole);
    CHECK(violations(&f) > 0);
    bins_insert(&p->free_bins, &p->chunks, hole); /* repaired, for a clean teardown */
    CHECK_EQ(violations(&f), 0);
    fixture_end(&f);
}

static void live_chunk_filed_as_free(void)
{
    fixture f;
    bfc_addr a, c;
    build(&f, &a, &c);
    bfc_pool *p = f.pool;
    uint32_t live = live_index_find(&p->live, &p->chunks, c);
    bins_insert(&p->free_bins, &p->chunks, live);
    CHECK(violations(&f) > 0);
    bins_remove(&p->free_bins, &p->chunks, live);
    CHECK_EQ(violations(&f), 0);
    fixture_end(&f);
}

static void two_free_neighbours_left_unmerged(void)
{
    fixture f;
    bfc_addr a, c;
    build(&f, &a, &c);
    bfc_pool *p = f.pool;
    /* Mark c free without merging it into the hole below it. */
    uint32_t live = live_index_take(&p->live, &p->chunks, c);
    C(p, live)->state = CHUNK_FREE;
    p->st.bytes_in_use -= C(p, live)->size;
    p->st.bytes_requested -= C(p, live)->requested;
    p->st.num_frees++;
    bins_insert(&p->free_bins, &p->chunks, live);
    CHECK(violations(&f) > 0);
    /* Undone, then freed properly. */
    bins_remove(&p->free_bins, &p->chunks, live);
    C(p, live)->state = CHUNK_ALLOCATED;
    p->st.bytes_in_use += C(p, live)->size;
    p->st.bytes_requested += C(p, live)->requested;
    p->st.num_frees--;
    REQUIRE(live_index_reserve(&p->live, &p->chunks, 1));
    live_index_insert(&p->live, &p->chunks, live);
    CHECK_EQ(violations(&f), 0);
    must_free(&f, c);
    fixture_end(&f);
}

static void size_changed_behind_the_bins_back(void)
{
    fixture f;
    bfc_addr a, c;
    build(&f, &a, &c);
    bfc_pool *p = f.pool;
    uint32_t hole = free_chunk_after(p, a);
    C(p, hole)->size -= 256; /* its bin, its neighbour's address and the totals disagree */
    CHECK(violations(&f) > 0);
    C(p, hole)->size += 256;
    CHECK_EQ(violations(&f), 0);
    fixture_end(&f);
}

static void counter_drift(void)
{
    fixture f;
    bfc_addr a, c;
    build(&f, &a, &c);
    bfc_pool *p = f.pool;
    p->st.bytes_in_use += 256;
    CHECK(violations(&f) > 0);
    p->st.bytes_in_use -= 256;
    p->st.num_pending_chunks++;
    CHECK(violations(&f) > 0);
    p->st.num_pending_chunks--;
    CHECK_EQ(violations(&f), 0);
    fixture_end(&f);
}

int main(void)
{
    RUN(free_chunk_missing_from_the_bins);
    RUN(live_chunk_filed_as_free);
    RUN(two_free_neighbours_left_unmerged);
    RUN(size_changed_behind_the_bins_back);
    RUN(counter_drift);
    return harness_result();
}
