/* Deferred frees: lanes, fence tokens, retirement, and the slow path that
 * polls and waits for fences. */
#include "pool_fixture.h"

/* A fence model: tokens up to `done` have completed; a wait completes the
 * token asked for, like cuEventSynchronize. */
typedef struct fences {
    sim_device *dev;
    uint64_t done;
    uint64_t polls, waits;
    uint32_t last_wait_lane;
    bool refuse_seal;
    bool refuse_wait; /* the owner cannot wait (cuEventSynchronize failed) */
    uint32_t refuse_lane; /* refuses to seal this lane only (0: none) */
    uint64_t seals, sealed_token[16];
    uint32_t sealed_lane[16];
} fences;

static fences fence_state;

static bool fence_done(void *ctx, uint32_t lane, uint64_t token, bool wait)
{
    (void)ctx;
    if (wait) {
        fence_state.waits++;
        fence_state.last_wait_lane = lane;
        if (fence_state.refuse_wait)
            return false;
        if (token > fence_state.done)
            fence_state.done = token;
        return true;
    }
    fence_state.polls++;
    return token <= fence_state.done;
}

static bool fence_seal(void *ctx, uint32_t lane, uint64_t token)
{
    (void)ctx;
    if (fence_state.refuse_seal || (fence_state.refuse_lane && lane == fence_state.refuse_lane))
        return false;
    if (fence_state.seals < 16) {
        fence_state.sealed_lane[fence_state.seals] = lane;
        fence_state.sealed_token[fence_state.seals] = token;
    }
    fence_state.seals++;
    return true;
}

static void start_with_fences(fixture *f)
{
    memset(&fence_state, 0, sizeof fence_state);
    bfc_backend b = sim_device_backend(&f->dev);
    b.fence_done = fence_done;
    b.fence_seal = fence_seal;
    fixture_start_with(f, &b);
}

static uint32_t open_lane(fixture *f, bool reusable)
{
    uint32_t id = 0;
    REQUIRE(bfc_pool_lane_open(f->pool, reusable, &id) == BFC_OK);
    CHECK(id != BFC_NO_LANE);
    return id;
}

static void pending_blocks_wait_for_their_fence(void)
{
    fixture f;
    fixture_begin(&f, 1 * MiB);
    fixture_start(&f); /* no fence callback: only retire frees them */
    uint32_t lane = open_lane(&f, true);
    bfc_addr a = must_alloc(&f, 1 * MiB);
    CHECK_EQ(bfc_pool_free_fenced(f.pool, a, lane, 5), BFC_OK);
    CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
    bfc_stats s = stats_of(&f);
    CHECK_EQ(s.pending_bytes, 1 * MiB);
    CHECK_EQ(s.bytes_in_use, 0);
    CHECK_EQ(s.num_frees, 1);
    bfc_addr b = 0;
    CHECK_EQ(bfc_pool_alloc(f.pool, 256, BFC_NO_LANE, &b), BFC_ERR_OOM);
    uint64_t t = 0;
    CHECK(bfc_pool_lane_oldest(f.pool, lane, &t));
    CHECK_EQ(t, 5);
    bfc_pool_retire(f.pool, lane, 4); /* not yet */
    CHECK_EQ(stats_of(&f).pending_bytes, 1 * MiB);
    bfc_pool_retire(f.pool, lane, 5);
    CHECK_EQ(stats_of(&f).pending_bytes, 0);
    CHECK(!bfc_pool_lane_oldest(f.pool, lane, &t));
    CHECK_EQ(must_alloc(&f, 1 * MiB), a);
    fixture_end(&f);
}

/* The slow path's wait for the oldest fence fails (the shim: a failed
 * cuEventSynchronize, a pool that keeps its freed blocks): the block stays
 * pending, and the allocation that needed it finds the pool full. Mutation
 * testing: lanes_wait_oldest retiring the token whatever the owner answered
 * survived every core and e2e test; here it hands the block out. */
static void a_failed_wait_keeps_the_block_pending(void)
{
    fixture f;
    fixture_begin(&f, 1 * MiB);
    start_with_fences(&f);
    uint32_t lane = open_lane(&f, false);
    bfc_addr a = must_alloc(&f, 1 * MiB);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, a, lane), BFC_OK);
    fence_state.refuse_wait = true;
    bfc_addr b = 0;
    CHECK_EQ(bfc_pool_alloc(f.pool, 1 * MiB, BFC_NO_LANE, &b), BFC_ERR_OOM);
    CHECK(fence_state.waits > 0);
    CHECK_EQ(stats_of(&f).pending_bytes, 1 * MiB);
    CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
    fence_state.refuse_wait = false;
    CHECK_EQ(must_alloc(&f, 1 * MiB), a);
    fixture_end(&f);
}

static void the_freeing_lane_reuses_at_once_others_do_not(void)
{
    fixture f;
    fixture_begin(&f, 1 * MiB);
    fixture_start(&f);
    uint32_t s1 = open_lane(&f, true), s2 = open_lane(&f, true);
    bfc_addr a = must_alloc(&f, 1 * MiB);
    CHECK_EQ(bfc_pool_free_fenced(f.pool, a, s1, 1), BFC_OK);
    bfc_addr b = 0;
    CHECK_EQ(bfc_pool_alloc(f.pool, 512 * KiB, s2, &b), BFC_ERR_OOM);
    CHECK_EQ(bfc_pool_alloc(f.pool, 512 * KiB, s1, &b), BFC_OK);
    CHECK_EQ(b, a);
    CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
    /* The remainder stays pending in s1 with the same token. */
    bfc_stats s = stats_of(&f);
    CHECK_EQ(s.pending_bytes, 512 * KiB);
    uint64_t t = 0;
    CHECK(bfc_pool_lane_oldest(f.pool, s1, &t));
    CHECK_EQ(t, 1);
    bfc_pool_retire(f.pool, s1, 1);
    CHECK_EQ(bfc_pool_alloc(f.pool, 512 * KiB, s2, &b), BFC_OK);
    CHECK_EQ(b, a + 512 * KiB);
    fixture_end(&f);
}

static void non_reusable_lanes_hold_blocks_for_everyone(void)
{
    fixture f;
    fixture_begin(&f, 1 * MiB);
    fixture_start(&f);
    uint32_t all = open_lane(&f, false);
    bfc_addr a = must_alloc(&f, 1 * MiB), b = 0;
    CHECK_EQ(bfc_pool_free_fenced(f.pool, a, all, 1), BFC_OK);
    CHECK_EQ(bfc_pool_alloc(f.pool, 256, all, &b), BFC_ERR_OOM);
    CHECK_EQ(bfc_pool_alloc(f.pool, 256, BFC_NO_LANE, &b), BFC_ERR_OOM);
    bfc_pool_retire(f.pool, all, 1);
    CHECK_EQ(must_alloc(&f, 256), a);
    fixture_end(&f);
}

static void tokens_must_not_go_backwards(void)
{
    fixture f;
    fixture_begin(&f, 1 * MiB);
    fixture_start(&f);
    uint32_t lane = open_lane(&f, true);
    bfc_addr a = must_alloc(&f, 4 * KiB), b = must_alloc(&f, 4 * KiB);
    CHECK_EQ(bfc_pool_free_fenced(f.pool, a, lane, 10), BFC_OK);
    CHECK_EQ(bfc_pool_free_fenced(f.pool, b, lane, 9), BFC_ERR_BAD_TOKEN);
    CHECK_EQ(stats_of(&f).bytes_in_use, 4 * KiB); /* b still allocated */
    CHECK_EQ(bfc_pool_free_fenced(f.pool, b, lane, 10), BFC_OK);
    CHECK_EQ(bfc_pool_free_fenced(f.pool, b, lane, 11), BFC_ERR_NOT_ALLOCATED);
    CHECK_EQ(bfc_pool_free_fenced(f.pool, 0x10, lane, 11), BFC_ERR_NOT_OWNED);
    CHECK_EQ(bfc_pool_free_fenced(f.pool, a, 99, 11), BFC_ERR_BAD_LANE);
    bfc_addr c = 0;
    CHECK_EQ(bfc_pool_alloc(f.pool, 256, 99, &c), BFC_ERR_BAD_LANE);
    char msg[256];
    bfc_pool_describe(f.pool, a, msg, sizeof msg);
    CHECK(strstr(msg, "waiting for stream work") != NULL);
    fixture_end(&f);
}

static void retirement_coalesces_with_free_neighbours(void)
{
    fixture f;
    fixture_begin(&f, 1 * MiB);
    fixture_start(&f);
    uint32_t lane = open_lane(&f, false);
    bfc_addr a = must_alloc(&f, 256 * KiB), b = must_alloc(&f, 256 * KiB),
             c = must_alloc(&f, 256 * KiB);
    must_free(&f, a);
    CHECK_EQ(bfc_pool_free_fenced(f.pool, b, lane, 1), BFC_OK);
    must_free(&f, c);
    /* a free | b pending | c + tail free: pending blocks never merge. */
    CHECK_EQ(stats_of(&f).num_free_chunks, 2);
    bfc_pool_retire(f.pool, lane, 1);
    bfc_stats s = stats_of(&f);
    CHECK_EQ(s.num_free_chunks, 1);
    CHECK_EQ(s.largest_free_block_bytes, 1 * MiB);
    fixture_end(&f);
}

static void the_slow_path_polls_then_waits_oldest_first(void)
{
    fixture f;
    fixture_begin(&f, 1 * MiB);
    start_with_fences(&f);
    uint32_t s1 = open_lane(&f, true), s2 = open_lane(&f, true);
    bfc_addr a = must_alloc(&f, 512 * KiB), b = must_alloc(&f, 512 * KiB);
    CHECK_EQ(bfc_pool_free_fenced(f.pool, b, s2, 3), BFC_OK);
    CHECK_EQ(bfc_pool_free_fenced(f.pool, a, s1, 7), BFC_OK);
    /* Token 3 already done: a poll retires it, no wait needed. */
    fence_state.done = 3;
    CHECK_EQ(must_alloc(&f, 512 * KiB), b);
    CHECK_EQ(fence_state.waits, 0);
    CHECK(fence_state.polls > 0);
    /* Nothing done: the pool waits for the oldest token (7, lane s1). */
    CHECK_EQ(must_alloc(&f, 512 * KiB), a);
    CHECK_EQ(fence_state.waits, 1);
    CHECK_EQ(fence_state.last_wait_lane, s1);
    CHECK_EQ(stats_of(&f).num_fence_waits, 1);
    fixture_end(&f);
}

static void waiting_picks_the_oldest_token_across_lanes(void)
{
    fixture f;
    fixture_begin(&f, 1 * MiB);
    start_with_fences(&f);
    uint32_t s1 = open_lane(&f, true), s2 = open_lane(&f, true);
    bfc_addr a = must_alloc(&f, 512 * KiB), b = must_alloc(&f, 512 * KiB);
    CHECK_EQ(bfc_pool_free_fenced(f.pool, a, s1, 20), BFC_OK);
    CHECK_EQ(bfc_pool_free_fenced(f.pool, b, s2, 10), BFC_OK);
    CHECK_EQ(must_alloc(&f, 256 * KiB), b);
    CHECK_EQ(fence_state.last_wait_lane, s2);
    CHECK_EQ(fence_state.waits, 1);
    fixture_end(&f);
}

static void closed_lanes_drain_then_recycle(void)
{
    fixture f;
    fixture_begin(&f, 1 * MiB);
    fixture_start(&f);
    uint32_t lane = open_lane(&f, true);
    bfc_addr a = must_alloc(&f, 4 * KiB), b = 0;
    CHECK_EQ(bfc_pool_free_fenced(f.pool, a, lane, 1), BFC_OK);
    bfc_pool_lane_close(f.pool, lane);
    CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
    CHECK_EQ(bfc_pool_alloc(f.pool, 256, lane, &b), BFC_ERR_BAD_LANE);
    b = must_alloc(&f, 4 * KiB);
    CHECK_EQ(bfc_pool_free_fenced(f.pool, b, lane, 2), BFC_ERR_BAD_LANE);
    bfc_pool_retire(f.pool, lane, 1); /* drains, then frees the slot */
    CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
    uint32_t again = open_lane(&f, false);
    CHECK_EQ(again, lane); /* slot recycled */
    /* An empty lane closes at once. */
    bfc_pool_lane_close(f.pool, again);
    CHECK_EQ(open_lane(&f, true), lane);
    fixture_end(&f);
}

static void garbage_collection_keeps_regions_with_pending_blocks(void)
{
    fixture f;
    fixture_begin_growing(&f, 4 * MiB);
    fixture_start(&f);
    uint32_t lane = open_lane(&f, false);
    bfc_addr a = must_alloc(&f, 2 * MiB), b = 0;
    CHECK_EQ(bfc_pool_free_fenced(f.pool, a, lane, 1), BFC_OK);
    /* 3 MiB needs the pending region back; the GPU may still use it, so
     * garbage collection must leave it alone and the request fails. */
    CHECK_EQ(bfc_pool_alloc(f.pool, 3 * MiB, BFC_NO_LANE, &b), BFC_ERR_OOM);
    bfc_stats s = stats_of(&f);
    CHECK_EQ(s.num_region_frees, 0);
    CHECK_EQ(s.pending_bytes, 2 * MiB);
    CHECK_EQ(bfc_pool_trim(f.pool), 0);
    bfc_pool_retire(f.pool, lane, 1);
    CHECK_EQ(bfc_pool_alloc(f.pool, 3 * MiB, BFC_NO_LANE, &b), BFC_OK);
    CHECK_EQ(stats_of(&f).num_region_frees, 1);
    fixture_end(&f);
}

/* Growth is kept (a region stays until a trim or garbage collection);
 * waiting for the GPU only costs time. A pool that grows on demand must
 * wait for frees still pending when they hold enough bytes for the request,
 * not take a new region for it: on an H100, PyTorch without its cache in a
 * growing pool took 59.4 GiB in 9 regions for 15.6 GiB live, because the
 * CPU runs a step ahead of the GPU and every fence was still pending. */
static void growth_waits_for_pending_frees_before_a_new_region(void)
{
    fixture f;
    fixture_begin_growing(&f, 64 * MiB);
    start_with_fences(&f);
    uint32_t lane = open_lane(&f, false);
    bfc_addr a = must_alloc(&f, 2 * MiB);
    CHECK_EQ(bfc_pool_free_fenced(f.pool, a, lane, 1), BFC_OK);
    CHECK_EQ(must_alloc(&f, 2 * MiB), a); /* after a wait, in the same region */
    bfc_stats s = stats_of(&f);
    CHECK_EQ(s.num_region_allocs, 1);
    CHECK_EQ(s.num_fence_waits, 1);
    /* When pending frees cannot hold the request, the pool grows at once. */
    bfc_addr b = must_alloc(&f, 2 * MiB);
    CHECK_EQ(bfc_pool_free_fenced(f.pool, b, lane, 2), BFC_OK);
    must_alloc(&f, 4 * MiB);
    s = stats_of(&f);
    CHECK_EQ(s.num_region_allocs, 3);
    CHECK_EQ(s.num_fence_waits, 1);
    fixture_end(&f);
}

/* Trim is the user's "give memory back now": it seals open epochs and
 * retires what the fences already report done, but never waits for the GPU,
 * and a region with a block still pending stays. */
static void trim_retires_completed_frees_without_waiting(void)
{
    fixture f;
    fixture_begin_growing(&f, 4 * MiB);
    start_with_fences(&f);
    uint32_t lane = open_lane(&f, true);
    bfc_addr a = must_alloc(&f, 2 * MiB);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, a, lane), BFC_OK); /* open epoch */
    CHECK_EQ(bfc_pool_trim(f.pool), 0); /* sealed now, fence not yet done */
    CHECK_EQ(fence_state.seals, 1);
    CHECK_EQ(fence_state.waits, 0);
    CHECK_EQ(stats_of(&f).pending_bytes, 2 * MiB);
    fence_state.done = fence_state.sealed_token[0];
    CHECK_EQ(bfc_pool_trim(f.pool), 2 * MiB);
    bfc_stats s = stats_of(&f);
    CHECK_EQ(s.pool_bytes, 0);
    CHECK_EQ(s.pending_bytes, 0);
    CHECK_EQ(s.num_region_frees, 1);
    CHECK_EQ(fence_state.waits, 0);
    CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
    /* The pool grows again on demand. */
    CHECK(must_alloc(&f, 1 * MiB) != 0);
    fixture_end(&f);
}

static void deferred_frees_share_an_epoch_sealed_at_the_next_allocation(void)
{
    fixture f;
    fixture_begin(&f, 1 * MiB);
    start_with_fences(&f);
    uint32_t lane = open_lane(&f, false);
    bfc_addr a = must_alloc(&f, 256 * KiB), b = must_alloc(&f, 256 * KiB),
             c = must_alloc(&f, 256 * KiB);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, a, lane), BFC_OK);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, b, lane), BFC_OK);
    CHECK_EQ(fence_state.seals, 0); /* nothing sealed until someone allocates */
    uint64_t t = 0;
    CHECK(bfc_pool_lane_oldest(f.pool, lane, &t));
    CHECK_EQ(t, 1);
    must_alloc(&f, 4 * KiB); /* seals epoch 1 (a and b), polls it: not done */
    CHECK_EQ(fence_state.seals, 1);
    CHECK_EQ(fence_state.sealed_lane[0], lane);
    CHECK_EQ(fence_state.sealed_token[0], 1);
    CHECK_EQ(stats_of(&f).pending_bytes, 512 * KiB);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, c, lane), BFC_OK); /* epoch 2 */
    fence_state.done = 1; /* the GPU finishes epoch 1 */
    /* Seals epoch 2; after epoch 1's "not yet" the poll skips this one. */
    must_alloc(&f, 4 * KiB);
    CHECK_EQ(fence_state.seals, 2);
    CHECK_EQ(fence_state.sealed_token[1], 2);
    CHECK_EQ(stats_of(&f).pending_bytes, 768 * KiB);
    must_alloc(&f, 4 * KiB); /* polls: retires epoch 1 */
    bfc_stats s = stats_of(&f);
    CHECK_EQ(s.pending_bytes, 256 * KiB);
    CHECK_EQ(s.num_fence_waits, 0);
    CHECK(bfc_pool_lane_oldest(f.pool, lane, &t));
    CHECK_EQ(t, 2);
    fixture_end(&f);
}

/* While the GPU is behind, the allocation path's question about the oldest
 * fence backs off: after each "not yet" it skips twice as many allocations
 * as before, up to 16; an answer that retires starts again at every
 * allocation. What the pool needs is not held back: the slow path asks
 * whatever the gap. */
static void the_poll_backs_off_while_the_gpu_is_behind(void)
{
    fixture f;
    fixture_begin(&f, 1 * MiB);
    start_with_fences(&f);
    uint32_t lane = open_lane(&f, false);
    bfc_addr a = must_alloc(&f, 256 * KiB);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, a, lane), BFC_OK);
    /* Skipping 1, 2, 4, 8, 16, 16 allocations between them: polls at
     * allocations 1, 3, 6, 11, 20, 37 and 54. */
    uint64_t polls_at[8], n = 0, before = fence_state.polls;
    for (uint64_t i = 1; i <= 64; i++) {
        must_alloc(&f, 256);
        if (fence_state.polls != before && n < 8)
            polls_at[n++] = i;
        before = fence_state.polls;
    }
    CHECK_EQ(n, 7);
    static const uint64_t want[] = {1, 3, 6, 11, 20, 37, 54};
    for (uint64_t i = 0; i < n && i < 7; i++)
        CHECK_EQ(polls_at[i], want[i]);
    CHECK_EQ(fence_state.seals, 1);
    CHECK_EQ(stats_of(&f).pending_bytes, 256 * KiB);
    /* The GPU passes the fence; the next poll (at 71) retires it, and the
     * one after a retirement asks again at once. */
    fence_state.done = 1;
    for (uint64_t i = 65; i <= 79; i++)
        must_alloc(&f, 256);
    CHECK_EQ(stats_of(&f).pending_bytes, 0);
    bfc_addr b = must_alloc(&f, 256 * KiB);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, b, lane), BFC_OK);
    before = fence_state.polls;
    must_alloc(&f, 256); /* seals b's epoch and asks: not yet */
    CHECK_EQ(fence_state.polls, before + 1);
    /* Memory the pool needs: nothing fits 600 KiB but b's block with its
     * neighbours; the slow path asks though the gap says skip. */
    fence_state.done = 2;
    before = fence_state.polls;
    CHECK(must_alloc(&f, 600 * KiB) != 0);
    CHECK(fence_state.polls > before);
    CHECK_EQ(fence_state.waits, 0);
    CHECK_EQ(stats_of(&f).pending_bytes, 0);
    CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
    fixture_end(&f);
}

/* fence_interval 4: the 4th allocation after a deferred free seals and
 * polls, the ones before leave the epoch open; an allocation that finds
 * nothing free seals at once (else it could not wait). */
/* A 1 MiB pool with fence_interval 4 and a deferring lane: blocks a and b
 * of `size` bytes, a freed deferred, then three allocations of 4 KiB (three
 * of the four the interval counts). Returns the lane; *b is b. */
static uint32_t three_allocations_after_a_deferred_free(fixture *f, uint64_t size, bfc_addr *b)
{
    fixture_begin(f, 1 * MiB);
    f->opt.fence_interval = 4;
    start_with_fences(f);
    uint32_t lane = open_lane(f, false);
    bfc_addr a = must_alloc(f, size);
    *b = must_alloc(f, size);
    CHECK_EQ(bfc_pool_free_deferred(f->pool, a, lane), BFC_OK);
    for (int i = 0; i < 3; i++)
        must_alloc(f, 4 * KiB);
    return lane;
}

static void the_fence_interval_batches_seals_and_the_slow_path_seals_at_once(void)
{
    fixture f;
    bfc_addr b;
    uint32_t lane = three_allocations_after_a_deferred_free(&f, 256 * KiB, &b);
    CHECK_EQ(fence_state.seals, 0);
    CHECK_EQ(fence_state.polls, 0);
    must_alloc(&f, 4 * KiB); /* the 4th: seals epoch 1 and polls it */
    CHECK_EQ(fence_state.seals, 1);
    CHECK_EQ(fence_state.sealed_token[0], 1);
    CHECK_EQ(fence_state.polls, 1);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, b, lane), BFC_OK); /* epoch 2, open */
    /* 1 MiB pool: 496 KiB are free, so 512 KiB only fit by waiting for a
     * and b; the slow path seals epoch 2 first, then waits oldest first. */
    bfc_addr c = 0;
    CHECK_EQ(bfc_pool_alloc(f.pool, 512 * KiB, BFC_NO_LANE, &c), BFC_OK);
    CHECK_EQ(fence_state.seals, 2);
    CHECK_EQ(fence_state.sealed_token[1], 2);
    CHECK(fence_state.waits >= 1);
    CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
    fixture_end(&f);
}

/* A trim seals every open epoch, so the interval starts again there: with
 * fence_interval 4, a free after the trim is sealed at the 4th allocation
 * after it, not sooner because allocations before the trim were counted. */
static void a_trim_starts_the_fence_interval_again(void)
{
    fixture f;
    bfc_addr b;
    uint32_t lane = three_allocations_after_a_deferred_free(&f, 64 * KiB, &b); /* 3 of 4 */
    bfc_pool_trim(f.pool); /* seals epoch 1 */
    CHECK_EQ(fence_state.seals, 1);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, b, lane), BFC_OK); /* epoch 2 */
    for (int i = 0; i < 3; i++)
        must_alloc(&f, 4 * KiB);
    CHECK_EQ(fence_state.seals, 1); /* 3 allocations since the trim */
    must_alloc(&f, 4 * KiB);
    CHECK_EQ(fence_state.seals, 2);
    fixture_end(&f);
}

/* fence_bytes 512 KiB with a long interval: small frees wait for the
 * interval, a free that brings the open bytes to 512 KiB is fenced at the
 * next allocation. */
static void the_fence_bytes_trigger_fences_large_frees_at_once(void)
{
    fixture f;
    fixture_begin(&f, 4 * MiB);
    f.opt.fence_interval = 1000;
    f.opt.fence_bytes = 512 * KiB;
    start_with_fences(&f);
    uint32_t lane = open_lane(&f, false);
    bfc_addr small = must_alloc(&f, 64 * KiB), big = must_alloc(&f, 512 * KiB);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, small, lane), BFC_OK);
    must_alloc(&f, 4 * KiB);
    CHECK_EQ(fence_state.seals, 0); /* 64 KiB open: below the trigger */
    CHECK_EQ(bfc_pool_free_deferred(f.pool, big, lane), BFC_OK);
    must_alloc(&f, 4 * KiB); /* 576 KiB open: fenced now */
    CHECK_EQ(fence_state.seals, 1);
    CHECK_EQ(fence_state.sealed_token[0], 1);
    must_alloc(&f, 4 * KiB); /* nothing new freed: no fence */
    CHECK_EQ(fence_state.seals, 1);
    fixture_end(&f);
}

static void a_refused_seal_keeps_the_epoch_open(void)
{
    fixture f;
    fixture_begin(&f, 1 * MiB);
    start_with_fences(&f);
    uint32_t lane = open_lane(&f, false);
    bfc_addr a = must_alloc(&f, 512 * KiB);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, a, lane), BFC_OK);
    fence_state.refuse_seal = true; /* e.g. every stream is capturing */
    fence_state.done = UINT64_MAX;  /* even a completed-looking token ... */
    bfc_addr b = 0;
    /* ... is not retired: its fence was never made. The slow path cannot
     * wait for it either, so the request that needs it fails. */
    CHECK_EQ(bfc_pool_alloc(f.pool, 768 * KiB, BFC_NO_LANE, &b), BFC_ERR_OOM);
    CHECK_EQ(stats_of(&f).pending_bytes, 512 * KiB);
    CHECK_EQ(fence_state.waits, 0);
    CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
    fence_state.refuse_seal = false; /* the next allocation seals and retires */
    CHECK_EQ(bfc_pool_alloc(f.pool, 768 * KiB, BFC_NO_LANE, &b), BFC_OK);
    CHECK_EQ(fence_state.seals, 1);
    fixture_end(&f);
}

/* A lane whose stream goes away while its epoch cannot be sealed: the
 * epoch joins another lane's (the shim's plain lane), whose fence then
 * covers it, and the closed lane is gone once empty. */
static void a_refused_closing_seal_moves_the_epoch(void)
{
    fixture f;
    fixture_begin(&f, 1 * MiB);
    start_with_fences(&f);
    uint32_t plain = open_lane(&f, false), lane = open_lane(&f, true);
    bfc_addr a = must_alloc(&f, 256 * KiB), b = must_alloc(&f, 256 * KiB);
    bfc_addr c = must_alloc(&f, 256 * KiB);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, c, plain), BFC_OK); /* plain's epoch: token 1 */
    CHECK_EQ(bfc_pool_free_deferred(f.pool, a, lane), BFC_OK);  /* the lane's: token 2 */
    CHECK_EQ(bfc_pool_free_deferred(f.pool, b, lane), BFC_OK);
    fence_state.refuse_lane = lane;
    bfc_pool_lane_close_into(f.pool, lane, plain);
    CHECK_EQ(fence_state.seals, 0);
    CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
    CHECK_EQ(stats_of(&f).pending_bytes, 768 * KiB);
    /* The next allocation seals plain's epoch (token 1 now covers a and
     * b too), and only that: the closed lane has nothing left to seal. */
    fence_state.done = 1;
    bfc_addr d = 0;
    CHECK_EQ(bfc_pool_alloc(f.pool, 768 * KiB, BFC_NO_LANE, &d), BFC_OK);
    CHECK_EQ(fence_state.seals, 1);
    CHECK_EQ(fence_state.sealed_lane[0], plain);
    CHECK_EQ(fence_state.sealed_token[0], 1);
    CHECK_EQ(stats_of(&f).pending_bytes, 0);
    CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
    fixture_end(&f);
}

/* A lane's epoch moved into another lane (its stream is going away) waits
 * for that lane's fence, but a reusable target's own allocations may reuse
 * its pending blocks at once, in stream order: the moved blocks would go to
 * the target's stream while the dying stream's work may still use them. So
 * a reusable lane takes no such epoch: closing seals it later, as with no
 * target, and nothing on the other lane gets the block before its fence. */
static void an_epoch_never_moves_into_a_reusable_lane(void)
{
    for (int retire = 0; retire < 2; retire++) {
        fixture f;
        fixture_begin(&f, 1 * MiB);
        start_with_fences(&f);
        uint32_t other = open_lane(&f, true), lane = open_lane(&f, true);
        bfc_addr a = must_alloc(&f, 512 * KiB), keep = must_alloc(&f, 256 * KiB);
        CHECK_EQ(bfc_pool_free_deferred(f.pool, a, lane), BFC_OK);
        fence_state.refuse_lane = lane;
        if (retire)
            bfc_pool_lane_retire_into(f.pool, lane, other);
        else
            bfc_pool_lane_close_into(f.pool, lane, other);
        CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
        /* No fence is done: the only free space left is 256 KiB, and the
         * block freed on `lane` must not serve `other`. */
        bfc_addr b = 0;
        bfc_status s = bfc_pool_alloc(f.pool, 512 * KiB, other, &b);
        CHECK(s != BFC_OK || b != a);
        CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
        if (s == BFC_OK)
            must_free(&f, b);
        must_free(&f, keep);
        bfc_pool_lane_close(f.pool, other);
        fixture_end(&f);
    }
}

static void closing_a_lane_seals_its_epoch(void)
{
    fixture f;
    fixture_begin(&f, 1 * MiB);
    start_with_fences(&f);
    uint32_t lane = open_lane(&f, true);
    bfc_addr a = must_alloc(&f, 4 * KiB), b = must_alloc(&f, 4 * KiB);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, a, lane), BFC_OK);
    bfc_pool_lane_close(f.pool, lane);
    CHECK_EQ(fence_state.seals, 1);
    /* An allocation on a lane seals first, then may reuse what the lane
     * freed: its own stream runs after the free in any case. */
    uint32_t l2 = open_lane(&f, true);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, b, l2), BFC_OK);
    bfc_addr c = 0;
    CHECK_EQ(bfc_pool_alloc(f.pool, 4 * KiB, l2, &c), BFC_OK);
    CHECK_EQ(fence_state.seals, 2);
    CHECK_EQ(c, b);
    bfc_pool_lane_close(f.pool, l2); /* nothing open: no fence to make */
    CHECK_EQ(fence_state.seals, 2);
    CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
    fence_state.done = UINT64_MAX;
    must_alloc(&f, 256);
    fixture_end(&f);
}

static void many_lanes(void)
{
    fixture f;
    fixture_begin(&f, 64 * MiB);
    fixture_start(&f);
    uint32_t ids[100];
    for (int i = 0; i < 100; i++)
        ids[i] = open_lane(&f, i % 2);
    for (int i = 0; i < 100; i++) {
        bfc_addr a = must_alloc(&f, 64 * KiB);
        CHECK_EQ(bfc_pool_free_fenced(f.pool, a, ids[i], (uint64_t)i), BFC_OK);
    }
    CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
    for (int i = 0; i < 100; i++)
        bfc_pool_lane_close(f.pool, ids[i]);
    for (int i = 0; i < 100; i++)
        bfc_pool_retire(f.pool, ids[i], UINT64_MAX);
    bfc_stats s = stats_of(&f);
    CHECK_EQ(s.pending_bytes, 0);
    CHECK_EQ(s.num_free_chunks, 1);
    fixture_end(&f);
}

/* A lazy lane is sealed only when the pool needs its memory: no seal at the
 * fence interval (1 here: every allocation) while the pool has room, one
 * when nothing else fits, and then its blocks serve the allocation as soon
 * as the owner reports the fence complete (here at once, as an ordering
 * fence is). */
static void a_lazy_lane_is_sealed_only_when_its_memory_is_needed(void)
{
    fixture f;
    fixture_begin(&f, 64 * MiB);
    start_with_fences(&f);
    uint32_t lane = open_lane(&f, false);
    bfc_pool_lane_set_lazy(f.pool, lane, true);
    bfc_addr filler = must_alloc(&f, 63 * MiB);
    bfc_addr a = must_alloc(&f, 256 * KiB), b = must_alloc(&f, 256 * KiB);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, a, lane), BFC_OK);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, b, lane), BFC_OK);
    for (int i = 0; i < 8; i++)
        must_alloc(&f, 4 * KiB);
    CHECK_EQ(fence_state.seals, 0);
    CHECK_EQ(fence_state.polls, 0); /* nothing sealed: nothing to ask about */
    CHECK_EQ(stats_of(&f).pending_bytes, 512 * KiB);
    /* 480 KiB free: 512 KiB only fits with a and b, so it seals, and the
     * owner says done at once. */
    fence_state.done = UINT64_MAX;
    bfc_addr c = 0;
    CHECK_EQ(bfc_pool_alloc(f.pool, 512 * KiB, BFC_NO_LANE, &c), BFC_OK);
    CHECK_EQ(fence_state.seals, 1);
    CHECK_EQ(fence_state.sealed_lane[0], lane);
    CHECK_EQ(stats_of(&f).num_fence_waits, 0);
    CHECK_EQ(stats_of(&f).pending_bytes, 0);
    /* Made eager again, the lane is sealed at the next allocation. */
    bfc_pool_lane_set_lazy(f.pool, lane, false);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, c, lane), BFC_OK);
    must_alloc(&f, 4 * KiB);
    CHECK_EQ(fence_state.seals, 2);
    /* A trim seals a lazy lane too. */
    bfc_pool_lane_set_lazy(f.pool, lane, true);
    bfc_addr d = must_alloc(&f, 64 * KiB);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, d, lane), BFC_OK);
    must_alloc(&f, 4 * KiB);
    CHECK_EQ(fence_state.seals, 2);
    bfc_pool_trim(f.pool);
    CHECK_EQ(fence_state.seals, 3);
    (void)filler;
    CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
    fixture_end(&f);
}

/* In a pool that grows, a lazy lane is also sealed once its open epoch holds
 * 1/32 of the bytes in use (held blocks would be mapped for); a
 * preallocated pool with room (27 MiB free here, over four times the 2.5
 * MiB held) holds them until it needs them, and near its limit seals at the
 * share too. */
static void a_growing_pool_seals_a_lazy_lane_holding_a_share_of_its_use(void)
{
    /* 0: preallocated with room; 1: growing; 2: preallocated near its
     * limit (40 MiB: under 6 MiB free besides the held 2.5 MiB) */
    for (int kind = 0; kind < 3; kind++) {
        const bool growing = kind == 1;
        fixture f;
        if (growing)
            fixture_begin_growing(&f, 64 * MiB);
        else
            fixture_begin(&f, kind == 2 ? 40 * MiB : 64 * MiB);
        start_with_fences(&f);
        uint32_t lane = open_lane(&f, false);
        bfc_pool_lane_set_lazy(f.pool, lane, true);
        bfc_addr big = must_alloc(&f, 32 * MiB), small = must_alloc(&f, 512 * KiB),
                 more = must_alloc(&f, 2 * MiB);
        CHECK_EQ(bfc_pool_free_deferred(f.pool, small, lane), BFC_OK);
        must_alloc(&f, 4 * KiB); /* 512 KiB held: under 1/32 of ~34 MiB */
        CHECK_EQ(fence_state.seals, 0);
        CHECK_EQ(bfc_pool_free_deferred(f.pool, more, lane), BFC_OK);
        must_alloc(&f, 4 * KiB); /* 2.5 MiB held: over 1/32 of 32 MiB */
        CHECK_EQ(fence_state.seals, kind > 0 ? 1u : 0u);
        (void)big;
        CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
        fixture_end(&f);
    }
}

int main(void)
{
    RUN(pending_blocks_wait_for_their_fence);
    RUN(a_failed_wait_keeps_the_block_pending);
    RUN(the_freeing_lane_reuses_at_once_others_do_not);
    RUN(non_reusable_lanes_hold_blocks_for_everyone);
    RUN(tokens_must_not_go_backwards);
    RUN(retirement_coalesces_with_free_neighbours);
    RUN(the_slow_path_polls_then_waits_oldest_first);
    RUN(waiting_picks_the_oldest_token_across_lanes);
    RUN(closed_lanes_drain_then_recycle);
    RUN(garbage_collection_keeps_regions_with_pending_blocks);
    RUN(growth_waits_for_pending_frees_before_a_new_region);
    RUN(trim_retires_completed_frees_without_waiting);
    RUN(deferred_frees_share_an_epoch_sealed_at_the_next_allocation);
    RUN(the_poll_backs_off_while_the_gpu_is_behind);
    RUN(the_fence_interval_batches_seals_and_the_slow_path_seals_at_once);
    RUN(a_trim_starts_the_fence_interval_again);
    RUN(the_fence_bytes_trigger_fences_large_frees_at_once);
    RUN(a_refused_seal_keeps_the_epoch_open);
    RUN(a_refused_closing_seal_moves_the_epoch);
    RUN(an_epoch_never_moves_into_a_reusable_lane);
    RUN(closing_a_lane_seals_its_epoch);
    RUN(many_lanes);
    RUN(a_lazy_lane_is_sealed_only_when_its_memory_is_needed);
    RUN(a_growing_pool_seals_a_lazy_lane_holding_a_share_of_its_use);
    return harness_result();
}
