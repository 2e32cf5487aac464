/*
 * lifecycle.c - start, fork and exit.
 *
 * Start: nothing runs at load time. The first CUDA call that reaches a door
 * reads the configuration and installs the fork handlers (shim_init), so a
 * program that never uses CUDA, or a tool run under a preloaded environment,
 * pays nothing.
 *
 * Fork: CUDA cannot be used in a child forked after the parent initialised
 * it, and the pools belong to the parent's contexts. A child forked while
 * pools exist therefore passes every call through (the driver then gives the
 * child its own error); a child forked before any pool existed (a data
 * loader worker started before CUDA was touched, or multiprocessing's fork
 * start method) keeps the shim and makes its own pools. The handlers hold
 * the shim's locks across fork, so the child never inherits one held by a
 * thread that does not exist there.
 *
 * Exit: the trace is flushed and the stats file and summary are written
 * (BFCSHIM_TRACE, BFCSHIM_STATS_FILE, BFCSHIM_STATS).
 *
 * Exit and unload: pools are never torn down. At exit the driver releases
 * the process's memory itself, and a destructor freeing regions could run
 * after the driver has shut down or while another thread still allocates.
 * The library is never unloaded: preloaded, and also as a plug-in, whose
 * dlclose is a no-op (linked -z nodelete): the trace's writer thread runs
 * its code, and an atexit handler of a library that could be unloaded runs
 * at its dlclose, while the host may still use the pools.
 */
#include <stdlib.h>

#include "shim.h"

atomic_bool shim_forked_child;

static pthread_once_t once = PTHREAD_ONCE_INIT;

/* Only locks never held across a driver call that may wait for queued
 * work: work that forks (a host function) runs while its waiter holds
 * whatever it holds, and a handler waiting for one of those hangs the
 * fork (e2e_driver fork-in-sync: the streams' use lock, held around a
 * trim's cuCtxSynchronize). Such locks are made afresh in the child
 * instead (the primary contexts' lock, the streams' use lock). */
static void before_fork(void)
{
    pools_lock_for_fork(true);
    streams_lock_for_fork(true);
    capture_lock_for_fork(true);
    green_lock_for_fork(true);
    platform_lock_for_fork(true);
    vmm_door_lock_for_fork(true);
}

static void after_fork_parent(void)
{
    vmm_door_lock_for_fork(false);
    platform_lock_for_fork(false);
    green_lock_for_fork(false);
    capture_lock_for_fork(false);
    streams_lock_for_fork(false);
    pools_lock_for_fork(false);
}

static void after_fork_child(void)
{
    vmm_door_lock_for_fork(false);
    vmm_door_after_fork_child();
    platform_lock_for_fork(false);
    green_lock_for_fork(false);
    capture_lock_for_fork(false);
    streams_lock_for_fork(false);
    streams_use_after_fork_child();
    pools_lock_for_fork(false);
    primary_lock_after_fork_child();
    record_after_fork_child();
    if (pools_count() > 0)
        atomic_store(&shim_forked_child, true);
}

/* Reports at exit read the pools' statistics and flush the trace; they make
 * no CUDA call (the driver may be shutting down), and they give up a pool
 * that another thread holds for good (waiting for a GPU that never
 * finishes) instead of hanging exit(). */
static void at_exit(void)
{
    if (atomic_load(&shim_forked_child))
        return; /* the parent reports */
    record_flush_at_exit();
    stats_at_exit();
}

static void init_once(void)
{
    const shim_config *cfg = shim_config_get();
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    atexit(at_exit);
    shim_log(LOG_DEBUG, "loaded: allocator %s, driver door %s",
             cfg->mode == MODE_BFC ? "bfc" : "platform", cfg->driver_hooks ? "on" : "off");
}

void shim_init(void) { pthread_once(&once, init_once); }
