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

/* ---- damage to lanes, mappings, loans ------------------------------------
 * Each case builds its own small pool, requires it healthy, breaks one
 * thing, requires a report, mends it and requires silence again. */

#define CAUGHT(f, what, apply, undo)                                           \
    do {                                                                       \
        CHECK_EQ(violations(f), 0);                                            \
        apply;                                                                 \
        if (violations(f) == 0)                                                \
            fprintf(stderr, "not reported: %s\n", what);                       \
        CHECK(violations(f) > 0);                                              \
        undo;                                                                  \
        CHECK_EQ(violations(f), 0);                                            \
    } while (0)

static bool seal_ok(void *ctx, uint32_t lane, uint64_t token)
{
    (void)ctx, (void)lane, (void)token;
    return true;
}

/* The chunk that starts at addr (any state). */
static uint32_t chunk_at_addr(bfc_pool *p, bfc_addr addr)
{
    int r = region_find(p, addr);
    REQUIRE(r >= 0);
    uint32_t c = region_chunk_containing(p, r, addr);
    REQUIRE(c != CHUNK_NIL && C(p, c)->addr == addr);
    return c;
}

/* [x live][y pending, lane token 1][z pending, token 2][w live][rest free],
 * on a lane that is not reusable; and a deferred lane (reusable) holding a
 * sealed epoch [u] and an open one [v]. */
typedef struct lane_pool {
    fixture f;
    uint32_t fenced, deferred;
    uint32_t y, z, u, v; /* chunk handles */
} lane_pool;

static void build_lanes(lane_pool *lp)
{
    fixture *f = &lp->f;
    fixture_begin(f, 64 * MiB);
    f->opt.preallocate = false; /* room under the limit to lend */
    bfc_backend b = sim_device_backend(&f->dev);
    b.fence_seal = seal_ok;
    fixture_start_with(f, &b);
    REQUIRE(bfc_pool_lane_open(f->pool, false, &lp->fenced) == BFC_OK);
    REQUIRE(bfc_pool_lane_open(f->pool, true, &lp->deferred) == BFC_OK);
    bfc_addr x = must_alloc(f, 1 * MiB), y = must_alloc(f, 1 * MiB),
             z = must_alloc(f, 1 * MiB), w = must_alloc(f, 1 * MiB),
             u = must_alloc(f, 1 * MiB), v = must_alloc(f, 1 * MiB),
             keep = must_alloc(f, 1 * MiB);
    (void)x, (void)w, (void)keep;
    REQUIRE(bfc_pool_free_fenced(f->pool, y, lp->fenced, 1) == BFC_OK);
    REQUIRE(bfc_pool_free_fenced(f->pool, z, lp->fenced, 2) == BFC_OK);
    REQUIRE(bfc_pool_free_deferred(f->pool, u, lp->deferred) == BFC_OK);
    REQUIRE(bfc_pool_seal_lane(f->pool, lp->deferred));
    REQUIRE(bfc_pool_free_deferred(f->pool, v, lp->deferred) == BFC_OK);
    bfc_pool *p = f->pool;
    lp->y = chunk_at_addr(p, y);
    lp->z = chunk_at_addr(p, z);
    lp->u = chunk_at_addr(p, u);
    lp->v = chunk_at_addr(p, v);
    REQUIRE(C(p, lp->y)->state == CHUNK_PENDING && C(p, lp->v)->state == CHUNK_PENDING);
    REQUIRE(p->lanes[lp->deferred].open_token == C(p, lp->v)->stamp);
    CHECK_EQ(bfc_pool_check(p, stderr), 0);
}

static void end_lanes(lane_pool *lp)
{
    fixture_end(&lp->f);
}

static void lane_damage_is_reported(void)
{
    lane_pool lp;
    build_lanes(&lp);
    fixture *f = &lp.f;
    bfc_pool *p = f->pool;
    lane *fl = &p->lanes[lp.fenced], *dl = &p->lanes[lp.deferred];
    chunk *y = C(p, lp.y), *z = C(p, lp.z), *u = C(p, lp.u), *v = C(p, lp.v);
    uint64_t t;
    uint8_t st;

    /* A pending chunk marked free behind its lane's back: a retirement
     * that skipped the FIFO (anyone could then take it before its fence). */
    CAUGHT(f, "a pending chunk marked free", (st = y->state, y->state = CHUNK_FREE),
           y->state = st);
    /* A pending chunk merged with its pending neighbour: one token for
     * blocks freed at different times. */
    CAUGHT(f, "a pending chunk grown over its neighbour", y->size += 256, y->size -= 256);
    /* The lane FIFO out of token order. */
    CAUGHT(f, "a lane FIFO out of token order", (t = y->stamp, y->stamp = z->stamp + 1),
           y->stamp = t);
    /* The open epoch's token on an older block: its blocks are no longer the
     * FIFO's tail (a seal would fence the wrong ones). */
    CAUGHT(f, "an open epoch's block not at the tail of its lane",
           (t = u->stamp, u->stamp = v->stamp, v->stamp = t),
           (t = u->stamp, u->stamp = v->stamp, v->stamp = t));
    CAUGHT(f, "an open epoch older than the lane's newest token",
           (t = dl->open_token, dl->open_token = u->stamp), dl->open_token = t);
    /* A token the pool's counter never handed out. */
    CAUGHT(f, "an open epoch past the token counter", p->token_counter--, p->token_counter++);
    /* Lane counters that drifted from the FIFO. */
    CAUGHT(f, "a lane's byte count off by a granule", fl->bytes += 256, fl->bytes -= 256);
    CAUGHT(f, "the pool's count of open epochs off by one", p->open_epochs++, p->open_epochs--);
    /* Stats off by one. */
    CAUGHT(f, "pending_bytes off by one", p->st.pending_bytes++, p->st.pending_bytes--);
    CAUGHT(f, "num_frees off by one", p->st.num_frees++, p->st.num_frees--);
    CAUGHT(f, "bytes_requested off by one", p->st.bytes_requested--, p->st.bytes_requested++);
    CAUGHT(f, "peak_pool_bytes below pool_bytes", p->st.peak_pool_bytes--,
           p->st.peak_pool_bytes++);
    /* Loans: the peak below the current loan, a loan past the limit. */
    REQUIRE(bfc_pool_lend(p, 1 * MiB) == BFC_OK);
    CAUGHT(f, "peak_bytes_lent below bytes_lent", p->st.peak_bytes_lent--,
           p->st.peak_bytes_lent++);
    CAUGHT(f, "a loan not taken off the limit", p->opt.limit_bytes++, p->opt.limit_bytes--);
    bfc_pool_end_loan(p, 1 * MiB);
    /* A closed slot left lazy: the next lane opened there would start lazy. */
    uint32_t spare;
    REQUIRE(bfc_pool_lane_open(p, false, &spare) == BFC_OK);
    bfc_pool_lane_close(p, spare);
    CAUGHT(f, "a closed lane slot left lazy", p->lanes[spare].lazy = 1, p->lanes[spare].lazy = 0);
    bfc_pool_retire(p, lp.fenced, 2);
    REQUIRE(bfc_pool_seal_lane(p, lp.deferred));
    bfc_pool_retire(p, lp.deferred, p->token_counter);
    end_lanes(&lp);
}

/* Over virtual memory: a granule's bit that disagrees with the device. */
static void granule_damage_is_reported(void)
{
    fixture f;
    fixture_begin(&f, 16 * MiB);
    f.opt.vmm = true;
    f.opt.preallocate = false;
    f.opt.map_granularity = 64 * KiB;
    bfc_backend b = sim_device_vmm_backend(&f.dev);
    fixture_start_with(&f, &b);
    bfc_addr a = must_alloc(&f, 100 * KiB);
    bfc_pool *p = f.pool;
    region *r = &p->regions[0];
    const uint64_t bit = (a - r->base) / f.opt.map_granularity;
    uint64_t *word = &r->backed[bit / 64], mask = UINT64_C(1) << (bit % 64);
    bfc_addr to = r->backed_to;
    /* A granule under a live block marked unmapped (the prefix moved down
     * with it, so only the bitmap speaks). */
    CAUGHT(&f, "a live block's granule marked unmapped",
           (*word &= ~mask, r->backed_to = r->base), (*word |= mask, r->backed_to = to));
    /* A granule past everything mapped marked mapped. */
    const uint64_t far = r->size / f.opt.map_granularity - 1;
    uint64_t *fw = &r->backed[far / 64], fm = UINT64_C(1) << (far % 64);
    REQUIRE(!(*fw & fm));
    CAUGHT(&f, "a free granule marked mapped", *fw |= fm, *fw &= ~fm);
    must_free(&f, a);
    fixture_end(&f);
}

int main(void)
{
    RUN(every_damage_is_reported_and_its_repair_passes);
    RUN(lane_damage_is_reported);
    RUN(granule_damage_is_reported);
    return harness_result();
}
