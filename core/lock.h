/*
 * lock.h - the pool's lock: a test-and-set lock that costs two atomic
 * instructions when nobody else holds it.
 *
 * Why not pthread_mutex_t: an uncontended lock/unlock pair cost ~55
 * instructions in glibc, a tenth of a whole allocation. The pool's critical
 * sections are short (a few hundred instructions), so waiting briefly by
 * spinning is cheaper than sleeping; a waiter that spins too long yields its
 * CPU, then sleeps in growing steps up to 1 ms, so a holder that blocks (the
 * slow path may wait for a GPU fence) does not burn other threads' CPUs.
 *
 * Fairness is not guaranteed; in practice allocations come from one or two
 * framework threads per device. Cost measured in docs/benchmarks.md.
 */
#ifndef BFCSHIM_CORE_LOCK_H
#define BFCSHIM_CORE_LOCK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct bfc_lock {
    atomic_bool held;
} bfc_lock;

void bfc_lock_wait(bfc_lock *l); /* the contended path, lock.c */
/* Takes the lock unless someone holds it for max_ms more; false then. */
bool bfc_lock_acquire_within(bfc_lock *l, unsigned max_ms);

static inline void bfc_lock_init(bfc_lock *l)
{
    atomic_init(&l->held, false);
}

static inline void bfc_lock_acquire(bfc_lock *l)
{
    if (!atomic_exchange_explicit(&l->held, true, memory_order_acquire))
        return;
    bfc_lock_wait(l);
}

static inline void bfc_lock_release(bfc_lock *l)
{
    atomic_store_explicit(&l->held, false, memory_order_release);
}

#endif
