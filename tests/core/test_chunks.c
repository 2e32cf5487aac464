/* The store of chunk records: every record on one cache line, and records
 * that survive the store's growth wherever realloc puts the array. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chunks.h"
#include "pool_fixture.h"

/*
 * The store grows with realloc, which only promises 16-byte alignment: a
 * grown array may start at another offset from a cache line than before,
 * and the store must then slide its records onto a line. Allocators rarely
 * do so on their own (glibc's large blocks are mapped, always 16 bytes past
 * a page), so this program wraps malloc, realloc and free (--wrap), and
 * while `shifting`, its realloc moves every block to one 16 bytes further
 * from a line than the last. While `refusing`, realloc fails (the store
 * can grow only through it), as when host memory runs out.
 */
void *__real_malloc(size_t n);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void *__wrap_realloc(void *p, size_t n);
void __wrap_free(void *p);

static bool shifting, refusing;
static int shifted_moves;
static struct {
    char *block, *user; /* what malloc gave, what realloc returned */
    size_t n;
} moved;
static struct {
    void *p;
    size_t n;
} last_malloc; /* while shifting: the store's first array */

void *__wrap_malloc(size_t n)
{
    void *p = __real_malloc(n);
    if (shifting) {
        last_malloc.p = p;
        last_malloc.n = n;
    }
    return p;
}

void *__wrap_realloc(void *p, size_t n)
{
    if (refusing)
        return NULL;
    if (!shifting || !p)
        return __real_realloc(p, n);
    size_t old = p == moved.user ? moved.n : p == last_malloc.p ? last_malloc.n : 0;
    REQUIRE(old > 0); /* a block this program did not see allocated */
    char *block = __real_malloc(n + 128);
    if (!block)
        return NULL;
    uintptr_t line = ((uintptr_t)block + 63) & ~(uintptr_t)63;
    char *user = (char *)line + ((uintptr_t)p + 16) % 64;
    memcpy(user, p, old < n ? old : n);
    __wrap_free(p);
    moved.block = block;
    moved.user = user;
    moved.n = n;
    shifted_moves++;
    return user;
}

void __wrap_free(void *p)
{
    if (p && p == moved.user) {
        p = moved.block;
        moved.user = moved.block = NULL;
    }
    __real_free(p);
}

static bool on_line(const chunk_store *s)
{
    return (uintptr_t)s->base % 64 == 0;
}

/* Takes n more records, each stamped with its handle, checking the array's
 * alignment whenever it grows; then checks every record's stamp. */
static void fill_and_check(chunk_store *s, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        const chunk *before = s->base;
        REQUIRE(chunk_store_reserve(s, 1));
        if (s->base != before)
            CHECK(on_line(s));
        uint32_t c = chunk_new(s);
        chunk_at(s, c)->addr = c;
        chunk_at(s, c)->stamp = ~(uint64_t)c;
    }
    uint32_t bad = 0;
    for (uint32_t c = 1; c < s->high; c++)
        bad += chunk_at(s, c)->addr != c || chunk_at(s, c)->stamp != ~(uint64_t)c;
    CHECK_EQ(bad, 0);
}

static void records_start_on_cache_lines(void)
{
    chunk_store s;
    REQUIRE(chunk_store_init(&s));
    CHECK(on_line(&s));
    fill_and_check(&s, 100000);
    chunk_store_fini(&s);
}

static void growth_to_another_offset_slides_the_records(void)
{
    shifting = true;
    chunk_store s;
    REQUIRE(chunk_store_init(&s));
    CHECK(on_line(&s));
    fill_and_check(&s, 5000);
    fill_and_check(&s, 30000);
    CHECK(shifted_moves >= 3); /* else this case tested nothing */
    chunk_store_fini(&s);
    shifting = false;
}

/* Deferred frees whose fences never complete, counting the seals made. */
static uint64_t seals;

static bool count_seal(void *ctx, uint32_t lane, uint64_t token)
{
    (void)ctx, (void)lane, (void)token;
    seals++;
    return true;
}

static bool never_done(void *ctx, uint32_t lane, uint64_t token, bool wait)
{
    (void)ctx, (void)lane, (void)token, (void)wait;
    return false;
}

/* BFC_ERR_HOST_MEMORY from an allocation leaves the pool as it was: the
 * records are reserved before the allocation seals epochs (the fence
 * interval's seal, a lazy lane's share) or retires anything. Each step
 * frees a block into a deferred lane and allocates again with realloc
 * refusing, until the store must grow for that allocation. */
static void refused_records_change_nothing(void)
{
    fixture f;
    fixture_begin(&f, 64 * MiB);
    f.opt.fence_interval = 1;
    bfc_backend b = sim_device_backend(&f.dev);
    b.fence_seal = count_seal;
    b.fence_done = never_done;
    fixture_start_with(&f, &b);
    uint32_t lane;
    REQUIRE(bfc_pool_lane_open(f.pool, false, &lane) == BFC_OK);
    /* The first allocation makes the region (its table grows by realloc). */
    bfc_addr first = 0;
    REQUIRE(bfc_pool_alloc(f.pool, 256, BFC_NO_LANE, &first) == BFC_OK);
    CHECK_EQ(bfc_pool_free_deferred(f.pool, first, lane), BFC_OK);
    bool refused = false;
    for (int i = 0; i < 100000 && !refused; i++) {
        bfc_stats before = stats_of(&f);
        const uint64_t seals_before = seals;
        bfc_addr a = 0;
        refusing = true;
        bfc_status s = bfc_pool_alloc(f.pool, 256, BFC_NO_LANE, &a);
        refusing = false;
        if (s == BFC_ERR_HOST_MEMORY) {
            refused = true;
            bfc_stats after = stats_of(&f);
            CHECK_EQ(seals, seals_before);
            CHECK_EQ(after.num_pending_chunks, before.num_pending_chunks);
            CHECK(memcmp(&before, &after, sizeof before) == 0);
            break;
        }
        REQUIRE(s == BFC_OK);
        CHECK_EQ(bfc_pool_free_deferred(f.pool, a, lane), BFC_OK);
    }
    CHECK(refused); /* else this case tested nothing */
    CHECK_EQ(bfc_pool_check(f.pool, stderr), 0);
    bfc_pool_destroy(f.pool, true);
    CHECK_EQ(f.dev.held, 0);
}

int main(void)
{
    RUN(records_start_on_cache_lines);
    RUN(growth_to_another_offset_slides_the_records);
    RUN(refused_records_change_nothing);
    return harness_result();
}
