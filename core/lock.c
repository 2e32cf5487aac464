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

void bfc_lock_wait(bfc_lock *l)
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
                struct timespec ts = {0, sleep_ns};
                nanosleep(&ts, NULL);
                if (sleep_ns < 1000000)
                    sleep_ns *= 2;
            }
        }
        if (!atomic_exchange_explicit(&l->held, true, memory_order_acquire))
            return;
    }
}
