/* lock.c - the contended path of the pool's lock (see lock.h). */
#include "lock.h"

#include <sched.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spins, then yields, then sleeps in growing steps until the lock is taken,
 * or (deadline_ns != 0) until the clock passes the deadline. */
static bool wait_for(bfc_lock *l, uint64_t deadline_ns)
{
    unsigned round = 0;
    long sleep_ns = 1000;
    for (;;) {
        /* Read until it looks free, then try: keeps the line shared while
         * waiting instead of bouncing it between cores. */
        while (atomic_load_explicit(&l->held, memory_order_relaxed)) {
            if (++round < 128) {
                cpu_relax();
            } else if (round < 256) {
                sched_yield();
            } else {
                if (deadline_ns && now_ns() >= deadline_ns)
                    return false;
                struct timespec ts = {0, sleep_ns};
                nanosleep(&ts, NULL);
                if (sleep_ns < 1000000)
                    sleep_ns *= 2;
            }
        }
        if (!atomic_exchange_explicit(&l->held, true, memory_order_acquire))
            return true;
    }
}

void bfc_lock_wait(bfc_lock *l) { wait_for(l, 0); }

bool bfc_lock_acquire_within(bfc_lock *l, unsigned max_ms)
{
    if (!atomic_exchange_explicit(&l->held, true, memory_order_acquire))
        return true;
    return wait_for(l, now_ns() + (uint64_t)max_ms * 1000000u);
}
