/*
 * bench_lock.c - what the pool's one lock costs: nanoseconds per
 * allocate+free pair of a 512-byte block, with the pool used by one thread,
 * then by two threads at once (contended). Prints figures; not a test.
 */
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "bfc.h"
#include "lock.h"
#include "sim_device.h"

#define PAIRS 2000000

static bfc_pool *pool;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *pairs(void *arg)
{
    (void)arg;
    for (int i = 0; i < PAIRS; i++) {
        bfc_addr a;
        if (bfc_pool_alloc(pool, 512, BFC_NO_LANE, &a) == BFC_OK)
            bfc_pool_free(pool, a);
    }
    return NULL;
}

int main(void)
{
    sim_device dev;
    sim_device_init(&dev, UINT64_C(1) << 30);
    bfc_backend b = sim_device_backend(&dev);
    bfc_options o;
    bfc_options_init(&o);
    o.limit_bytes = UINT64_C(1) << 30;
    pool = bfc_pool_create(&o, &b);
    if (!pool || bfc_pool_reserve(pool) != BFC_OK)
        return 1;
    pairs(NULL); /* warm up */
    double t0 = now();
    pairs(NULL);
    double one = (now() - t0) * 1e9 / PAIRS;
    pthread_t t[2];
    t0 = now();
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, pairs, NULL);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    double two = (now() - t0) * 1e9 / (2.0 * PAIRS);
    bfc_lock l;
    bfc_lock_init(&l);
    t0 = now();
    for (int i = 0; i < PAIRS; i++) {
        bfc_lock_acquire(&l);
        __asm__ __volatile__("" ::: "memory");
        bfc_lock_release(&l);
    }
    printf("uncontended lock acquire+release: %.1f ns\n", (now() - t0) * 1e9 / PAIRS);
    printf("alloc+free pair, 512 B: %.1f ns one thread; %.1f ns per pair with two "
           "threads contending (aggregate %.1f M pairs/s)\n",
           one, two, 1e3 / two);
    bfc_pool_destroy(pool, true);
    return 0;
}
