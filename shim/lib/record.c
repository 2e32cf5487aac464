/*
 * record.c - BFCSHIM_TRACE: every pooled allocation, failed allocation and
 * free, in RMM's CSV, replayable by `bfcshim replay` (shim/common/trace_log.c
 * keeps it off the hot path).
 *
 * The file is opened at the first event, flushed at exit and on every OOM
 * report (so the trace that led to a failure is on disk even if the program
 * then dies), and with %p in its name each process gets its own. A child
 * forked after the trace opened stops recording unless the name has %p, in
 * which case it opens its own file at its first event.
 */
#include <errno.h>
#include <limits.h>
#include <string.h>

#include "shim.h"
#include "trace_log.h"

enum { UNOPENED, OPEN, OFF };

static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int state;
static _Atomic(trace_log *) active;

static trace_log *log_for_event(void)
{
    int st = atomic_load_explicit(&state, memory_order_acquire);
    if (st == OPEN)
        return atomic_load_explicit(&active, memory_order_relaxed);
    if (st == OFF)
        return NULL;
    const char *pattern = shim_config_get()->trace_path;
    pthread_mutex_lock(&open_lock);
    if (atomic_load(&state) == UNOPENED) {
        char path[4096];
        trace_log *t = pattern && shim_expand_path(pattern, path, sizeof path)
                           ? trace_log_open(path)
                           : NULL;
        if (pattern && !t)
            shim_log(LOG_ERROR, "BFCSHIM_TRACE=%s: cannot write the trace (%s); not recording",
                     pattern, strerror(errno));
        else if (t)
            shim_log(LOG_INFO, "recording allocations to %s", path);
        atomic_store_explicit(&active, t, memory_order_relaxed);
        atomic_store_explicit(&state, t ? OPEN : OFF, memory_order_release);
    }
    pthread_mutex_unlock(&open_lock);
    return atomic_load(&active);
}

void record_alloc(uint64_t ptr, uint64_t size, CUstream stream)
{
    trace_log *t = log_for_event();
    if (t)
        trace_log_event(t, REC_ALLOCATE, ptr, size, (uint64_t)(uintptr_t)stream);
}

void record_alloc_failure(uint64_t size, CUstream stream)
{
    trace_log *t = log_for_event();
    if (t)
        trace_log_event(t, REC_ALLOCATE_FAILURE, 0, size, (uint64_t)(uintptr_t)stream);
}

void record_free(uint64_t ptr, CUstream stream)
{
    trace_log *t = log_for_event();
    if (t)
        trace_log_event(t, REC_FREE, ptr, 0, (uint64_t)(uintptr_t)stream);
}

void record_flush(void)
{
    if (atomic_load_explicit(&state, memory_order_acquire) == OPEN)
        trace_log_flush(atomic_load(&active));
}

void record_after_fork_child(void)
{
    trace_log *t = atomic_exchange(&active, NULL);
    if (t)
        trace_log_abandon(t);
    const char *pattern = shim_config_get()->trace_path;
    bool own_file = pattern && strstr(pattern, "%p");
    pthread_mutex_init(&open_lock, NULL);
    atomic_store(&state, own_file ? UNOPENED : OFF);
}
