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

/* One kind of damage: `apply` breaks the pool, `undo` mends it exactly. Both
 * get the pool, the live block below the free one (a) and the live block
 * above it (c), and a word to keep what undo needs. */
typedef struct damage {
    const char *name;
    void (*apply)(bfc_pool *p, bfc_addr a, bfc_addr c, uint32_t *kept);
    void (*undo)(bfc_pool *p, bfc_addr a, bfc_addr c, uint32_t *kept);
} damage;

/* A free chunk dropped from its bin: a free that forgot to file it. */
static void drop_from_bin(bfc_pool *p, bfc_addr a, bfc_addr c, uint32_t *kept)
{
    (void)c;
    *kept = free_chunk_after(p, a);
    bins_remove(&p->free_bins, &p->chunks, *kept);
}

static void refile_in_bin(bfc_pool *p, bfc_addr a, bfc_addr c, uint32_t *kept)
{
    (void)a, (void)c;
    bins_insert(&p->free_bins, &p->chunks, *kept);
}

/* A live chunk filed as free: a double free that got past the live index. */
static void file_live_as_free(bfc_pool *p, bfc_addr a, bfc_addr c, uint32_t *kept)
{
    (void)a;
    *kept = live_index_find(&p->live, &p->chunks, c);
    bins_insert(&p->free_bins, &p->chunks, *kept);
}

static void unfile_live(bfc_pool *p, bfc_addr a, bfc_addr c, uint32_t *kept)
{
    (void)a, (void)c;
    bins_remove(&p->free_bins, &p->chunks, *kept);
}

/* c freed without merging into the free chunk below it, every counter
 * updated as a free would: only the layout is wrong. */
static void free_without_merging(bfc_pool *p, bfc_addr a, bfc_addr c, uint32_t *kept)
{
    (void)a;
    uint32_t live = *kept = live_index_take(&p->live, &p->chunks, c);
    C(p, live)->state = CHUNK_FREE;
    p->st.bytes_in_use -= C(p, live)->size;
    p->st.bytes_requested -= C(p, live)->requested;
    p->st.num_frees++;
    bins_insert(&p->free_bins, &p->chunks, live);
}

static void allocate_again(bfc_pool *p, bfc_addr a, bfc_addr c, uint32_t *kept)
{
    (void)a, (void)c;
    uint32_t live = *kept;
    bins_remove(&p->free_bins, &p->chunks, live);
    C(p, live)->state = CHUNK_ALLOCATED;
    p->st.bytes_in_use += C(p, live)->size;
    p->st.bytes_requested += C(p, live)->requested;
    p->st.num_frees--;
    REQUIRE(live_index_reserve(&p->live, &p->chunks, 1));
    live_index_insert(&p->live, &p->chunks, live);
}

/* A free chunk's size changed behind the bins' back: its bin, its
 * neighbour's address and the totals disagree. */
static void shrink_free(bfc_pool *p, bfc_addr a, bfc_addr c, uint32_t *kept)
{
    (void)c;
    *kept = free_chunk_after(p, a);
    C(p, *kept)->size -= 256;
}

static void unshrink_free(bfc_pool *p, bfc_addr a, bfc_addr c, uint32_t *kept)
{
    (void)a, (void)c;
    C(p, *kept)->size += 256;
}

/* Counters that drifted from the structures. */
static void drift_in_use(bfc_pool *p, bfc_addr a, bfc_addr c, uint32_t *kept)
{
    (void)a, (void)c, (void)kept;
    p->st.bytes_in_use += 256;
}

static void undrift_in_use(bfc_pool *p, bfc_addr a, bfc_addr c, uint32_t *kept)
{
    (void)a, (void)c, (void)kept;
    p->st.bytes_in_use -= 256;
}

static void drift_pending(bfc_pool *p, bfc_addr a, bfc_addr c, uint32_t *kept)
{
    (void)a, (void)c, (void)kept;
    p->st.num_pending_chunks++;
}

static void undrift_pending(bfc_pool *p, bfc_addr a, bfc_addr c, uint32_t *kept)
{
    (void)a, (void)c, (void)kept;
    p->st.num_pending_chunks--;
}

static const damage damages[] = {
    {"a free chunk missing from its bin", drop_from_bin, refile_in_bin},
    {"a live chunk filed as free", file_live_as_free, unfile_live},
    {"two free neighbours left unmerged", free_without_merging, allocate_again},
    {"a size changed behind the bins' back", shrink_free, unshrink_free},
    {"bytes_in_use drifted", drift_in_use, undrift_in_use},
    {"num_pending_chunks drifted", drift_pending, undrift_pending},
};

static void every_damage_is_reported_and_its_repair_passes(void)
{
    for (size_t i = 0; i < sizeof damages / sizeof *damages; i++) {
        fixture f;
        bfc_addr a, c;
        uint32_t kept = 0;
        build(&f, &a, &c);
        damages[i].apply(f.pool, a, c, &kept);
        if (violations(&f) == 0)
            fprintf(stderr, "not reported: %s\n", damages[i].name);
        CHECK(violations(&f) > 0);
        damages[i].undo(f.pool, a, c, &kept);
        CHECK_EQ(violations(&f), 0);
        must_free(&f, c);
        fixture_end(&f);
    }
}

int main(void)
{
    RUN(every_damage_is_reported_and_its_repair_passes);
    return harness_result();
}
