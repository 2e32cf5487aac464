/*
 * call_window.c - preloaded ahead of the shim by e2e_vmm_door's race
 * scenarios: runs a call of the test's in one window of the shim's locking,
 * so that an interleaving of two threads happens every time instead of
 * once in a million runs.
 *
 * While armed (call_window_arm, by the thread that will pass the window),
 * the first pthread_mutex_lock that thread makes after its first
 * pthread_mutex_unlock runs the armed call first, then locks. In the
 * virtual memory door that is the moment between the driver's answer (the
 * fake driver's lock released) and the door's own lock: what another
 * thread could do there, done by this one. The call runs disarmed, and at
 * most once; call_window_fired says whether it ran.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>

static atomic_int armed, fired;
static pthread_t armer;
static _Thread_local int unlocked;
static void (*call)(void *);
static void *call_arg;

__attribute__((visibility("default"))) void call_window_arm(void (*fn)(void *), void *arg)
{
    call = fn;
    call_arg = arg;
    armer = pthread_self();
    unlocked = 0;
    atomic_store(&fired, 0);
    atomic_store(&armed, 1);
}

/* 1 when the armed call ran; disarms either way. */
__attribute__((visibility("default"))) int call_window_fired(void)
{
    atomic_store(&armed, 0);
    return atomic_load(&fired);
}

static int mine(void) { return atomic_load(&armed) && pthread_equal(pthread_self(), armer); }

int pthread_mutex_unlock(pthread_mutex_t *m)
{
    static int (*real)(pthread_mutex_t *);
    if (!real)
        real = (int (*)(pthread_mutex_t *))dlsym(RTLD_NEXT, "pthread_mutex_unlock");
    int r = real(m);
    if (mine())
        unlocked = 1;
    return r;
}

int pthread_mutex_lock(pthread_mutex_t *m)
{
    static int (*real)(pthread_mutex_t *);
    if (!real)
        real = (int (*)(pthread_mutex_t *))dlsym(RTLD_NEXT, "pthread_mutex_lock");
    if (mine() && unlocked) {
        atomic_store(&armed, 0);
        atomic_store(&fired, 1);
        call(call_arg);
    }
    return real(m);
}
