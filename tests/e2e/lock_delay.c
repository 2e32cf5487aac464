/*
 * lock_delay.c - preloaded ahead of the shim by e2e_ordered_race: widens one
 * window of the shim's locking so that a race between two threads happens
 * every time rather than once in a million runs.
 *
 * While armed (lock_delay_arm, by the thread that will hit the window), the
 * first pthread_mutex_unlock that thread makes inside a section it holds a
 * pthread_rwlock write lock for opens the window: the other thread is told
 * (lock_delay_wait_window returns) and the arming thread waits until it
 * says it is done (lock_delay_done) or 300 ms pass, then goes on. In the
 * shim that is fences_ordered_begin: the registry's copy under the streams'
 * write lock, and the store of the ordered state after it.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

static atomic_int armed, window, done;
static pthread_t armer;
static _Thread_local pthread_rwlock_t *writing;

__attribute__((visibility("default"))) void lock_delay_arm(void)
{
    armer = pthread_self();
    atomic_store(&window, 0);
    atomic_store(&done, 0);
    atomic_store(&armed, 1);
}

__attribute__((visibility("default"))) void lock_delay_disarm(void) { atomic_store(&armed, 0); }

/* 1 once the window opened; 0 after `ms` without. */
__attribute__((visibility("default"))) int lock_delay_wait_window(int ms)
{
    for (int i = 0; i < ms * 10 && !atomic_load(&window); i++)
        nanosleep(&(struct timespec){0, 100000}, NULL);
    return atomic_load(&window);
}

__attribute__((visibility("default"))) void lock_delay_done(void) { atomic_store(&done, 1); }

static int mine(void) { return atomic_load(&armed) && pthread_equal(pthread_self(), armer); }

int pthread_rwlock_wrlock(pthread_rwlock_t *l)
{
    static int (*real)(pthread_rwlock_t *);
    if (!real)
        real = (int (*)(pthread_rwlock_t *))dlsym(RTLD_NEXT, "pthread_rwlock_wrlock");
    int r = real(l);
    if (r == 0 && mine())
        writing = l;
    return r;
}

int pthread_rwlock_unlock(pthread_rwlock_t *l)
{
    static int (*real)(pthread_rwlock_t *);
    if (!real)
        real = (int (*)(pthread_rwlock_t *))dlsym(RTLD_NEXT, "pthread_rwlock_unlock");
    if (writing == l)
        writing = NULL;
    return real(l);
}

int pthread_mutex_unlock(pthread_mutex_t *m)
{
    static int (*real)(pthread_mutex_t *);
    if (!real)
        real = (int (*)(pthread_mutex_t *))dlsym(RTLD_NEXT, "pthread_mutex_unlock");
    int r = real(m);
    if (writing && mine() && !atomic_exchange(&window, 1)) {
        for (int i = 0; i < 3000 && !atomic_load(&done); i++)
            nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    return r;
}
