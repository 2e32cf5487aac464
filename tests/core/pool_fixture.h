/* pool_fixture.h - a pool over a simulated device, for the engine's tests. */
#ifndef BFCSHIM_TESTS_POOL_FIXTURE_H
#define BFCSHIM_TESTS_POOL_FIXTURE_H

#include <string.h>

#include "bfc.h"
#include "harness.h"
#include "sim_device.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)

typedef struct fixture {
    sim_device dev;
    bfc_options opt;
    bfc_pool *pool;
} fixture;

/* Defaults for tests: exact region sizes, preallocation, GC on, and low-end
 * placement, so that the tests of other rules can name exact addresses (the
 * placement tests and the property test cover the default, aligned
 * placement, and age placement).
 * Callers change f->opt / f->dev between fixture_begin and fixture_start. */
static inline void fixture_begin(fixture *f, uint64_t limit)
{
    memset(f, 0, sizeof *f);
    sim_device_init(&f->dev, UINT64_C(1) << 46);
    bfc_options_init(&f->opt);
    f->opt.limit_bytes = limit;
    f->opt.region_granularity = 256;
    f->opt.placement = BFC_PLACE_LOW;
}

/* The same for a pool that grows on demand in 2 MiB regions, from one. */
static inline void fixture_begin_growing(fixture *f, uint64_t limit)
{
    fixture_begin(f, limit);
    f->opt.preallocate = false;
    f->opt.initial_region_bytes = 2 * MiB;
    f->opt.region_granularity = 2 * MiB;
}

static inline void fixture_start(fixture *f)
{
    bfc_backend b = sim_device_backend(&f->dev);
    f->pool = bfc_pool_create(&f->opt, &b);
    REQUIRE(f->pool);
}

static inline void fixture_start_with(fixture *f, const bfc_backend *b)
{
    f->pool = bfc_pool_create(&f->opt, b);
    REQUIRE(f->pool);
}

static inline void fixture_end(fixture *f)
{
    CHECK_EQ(bfc_pool_check(f->pool, stderr), 0);
    bfc_pool_destroy(f->pool, true);
    CHECK_EQ(f->dev.held, 0);
}

static inline bfc_addr must_alloc(fixture *f, uint64_t size)
{
    bfc_addr a = 0;
    bfc_status s = bfc_pool_alloc(f->pool, size, BFC_NO_LANE, &a);
    if (s != BFC_OK)
        fprintf(stderr, "[%s] alloc of %llu failed: %s\n", harness_case,
                (unsigned long long)size, bfc_status_name(s));
    REQUIRE(s == BFC_OK);
    CHECK_EQ(bfc_pool_check(f->pool, stderr), 0);
    return a;
}

static inline void must_free(fixture *f, bfc_addr a)
{
    CHECK_EQ(bfc_pool_free(f->pool, a), BFC_OK);
    CHECK_EQ(bfc_pool_check(f->pool, stderr), 0);
}

static inline bfc_stats stats_of(fixture *f)
{
    bfc_stats s;
    bfc_pool_stats(f->pool, &s);
    return s;
}

#endif
