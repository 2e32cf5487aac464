/*
 * harness.h - the few macros every test program uses. A test program runs
 * its cases in order, prints one line per failed check, and exits 0 when
 * all passed, 1 otherwise, 77 (meson's "skipped") when it cannot run here.
 */
#ifndef BFCSHIM_TESTS_HARNESS_H
#define BFCSHIM_TESTS_HARNESS_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

static int harness_failures;
static const char *harness_case = "";

#define EXIT_SKIP 77

#define CHECK(cond)                                                                \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "%s:%d: [%s] check failed: %s\n", __FILE__, __LINE__, \
                    harness_case, #cond);                                          \
            harness_failures++;                                                    \
        }                                                                          \
    } while (0)

#define CHECK_EQ(a, b)                                                             \
    do {                                                                           \
        uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                           \
        if (a_ != b_) {                                                            \
            fprintf(stderr, "%s:%d: [%s] %s == %s failed: %" PRIu64 " vs %" PRIu64 \
                            " (0x%" PRIx64 " vs 0x%" PRIx64 ")\n",                 \
                    __FILE__, __LINE__, harness_case, #a, #b, a_, b_, a_, b_);     \
            harness_failures++;                                                    \
        }                                                                          \
    } while (0)

/* Stops the program: for states after which nothing else would be meaningful. */
#define REQUIRE(cond)                                                              \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "%s:%d: [%s] required: %s\n", __FILE__, __LINE__,      \
                    harness_case, #cond);                                          \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

#define RUN(fn)                      \
    do {                             \
        harness_case = #fn;          \
        fn();                        \
    } while (0)

static inline int harness_result(void)
{
    if (harness_failures)
        fprintf(stderr, "%d check(s) failed\n", harness_failures);
    return harness_failures ? 1 : 0;
}

/* splitmix64: small, seedable, good enough to drive randomised tests. */
static inline uint64_t rng_next(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static inline uint64_t rng_below(uint64_t *state, uint64_t n)
{
    return n ? rng_next(state) % n : 0;
}

#endif
