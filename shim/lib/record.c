/*
 * record.c - BFCSHIM_TRACE: every pooled allocation, failed allocation and
 * free, in RMM's CSV, replayable by `bfcshim replay` (shim/common/trace_log.c
 * keeps it off the hot path).
 *
 * Each pool records through its own channel from the engine's on_event
 * hook, under the pool's lock: no second lock per event, and the trace
 * keeps exactly the order in which the pool served allocations and frees
 * (a free always precedes another thread's reuse of the address).
 * Pass-through allocations (platform mode) and failures the engine reports
 * before taking its lock go through the log's own, locked channel.
 *
 * The file is opened when the first pool is made or the first event comes,
 * flushed at exit and on every OOM report (so the trace that led to a
 * failure is on disk even if the program then dies), and with %p in its
 * name each process gets its own. A child forked after the trace opened
 * stops recording unless the name has %p, in which case it opens its own.
 */
#include <errno.h>
#include <limits.h>
#include <string.h>

#include "out_file.h"
#include "shim.h"
#include "trace_log.h"

enum { UNOPENED, OPEN, OFF };

/* How long a context's destruction waits for its pool to record its end. */
enum { DETACH_WAIT_MS = 5000 };

static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int state;
static _Atomic(trace_log *) active;
static char active_path[4096]; /* its file, for the message when writing fails */

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
        char path[4096], why[160];
        bool named = pattern && shim_expand_path(pattern, path, sizeof path);
        trace_log *t = named ? trace_log_open(path) : NULL;
        if (t) {
            snprintf(active_path, sizeof active_path, "%s", path);
            shim_log(LOG_INFO, "recording allocations to %s", path);
        } else if (named) {
            out_file_why(path, errno, why, sizeof why);
            shim_log(LOG_ERROR, "BFCSHIM_TRACE: %s %s; not recording", path, why);
        } else if (pattern) {
            shim_log(LOG_ERROR, "BFCSHIM_TRACE=%s is too long once %%p becomes the pid; not "
                                "recording", pattern);
        }
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

/* The engine's on_event hook (pool locked): the lane's stream is the one
 * the program named (0 for plain calls and the per-thread stream). */
static void pool_event(void *ctx, bfc_event ev, bfc_addr addr, uint64_t size, uint32_t lane)
{
    shim_pool *sp = ctx;
    trace_channel *c = atomic_load_explicit(&sp->trace, memory_order_relaxed);
    if (!c) /* the pool died with its context (record_detach) */
        return;
    CUstream stream = lane != BFC_NO_LANE && lane != sp->plain_lane
                          ? atomic_load_explicit(&sp->lane_stream[lane], memory_order_relaxed)
                          : NULL;
    trace_channel_event(c, (rec_action)ev, addr, size, (uint64_t)(uintptr_t)stream);
}

bool record_attach(shim_pool *sp, bfc_backend *b)
{
    trace_log *t = log_for_event();
    if (!t)
        return false;
    trace_channel *c = trace_log_channel_open(t);
    if (!c) {
        static atomic_bool said;
        shim_log_once(&said, LOG_WARN, "BFCSHIM_TRACE: more than 8 pools alive at once; the "
                                       "others are not recorded");
        return false;
    }
    atomic_store(&sp->trace, c);
    b->on_event = pool_event;
    b->event_ctx = sp;
    return true;
}

static void free_if_live(void *arg, const bfc_chunk_info *chunk)
{
    if (chunk->kind == BFC_CHUNK_ALLOCATED)
        trace_channel_event(arg, REC_FREE, chunk->addr, 0, 0);
}

/*
 * A pool whose context is gone: the blocks still live in it went with the
 * context, so the trace frees them here (without that, a replay would keep
 * them to its end and meet their addresses again when a later pool's
 * region reuses them). Its events go to the writer now and its channel to
 * the next pool: a dead pool's slot in the registry is taken by the next
 * one, and its partial buffer would never be flushed.
 */
void record_detach(shim_pool *sp)
{
    if (!atomic_load(&sp->trace))
        return;
    /* Another thread may hold the pool while it waits for the GPU, which
     * can take a while, or for ever (a kernel that never ends): the context
     * must still be allowed to go. Given up, the pool keeps its channel. */
    if (!bfc_pool_lock_within(sp->bfc, DETACH_WAIT_MS)) {
        shim_log(LOG_WARN, "BFCSHIM_TRACE: device %d's pool was busy when its context went; "
                           "its last events are not in the trace", (int)sp->dev);
        return;
    }
    trace_channel *c = atomic_exchange(&sp->trace, NULL);
    if (c) {
        bfc_pool_visit_locked(sp->bfc, free_if_live, c);
        trace_channel_close(c);
    }
    bfc_pool_unlock(sp->bfc);
}

static void flush(bool at_exit)
{
    if (atomic_load_explicit(&state, memory_order_acquire) != OPEN)
        return;
    /* Each pool's partial buffer, under the lock its events take. At exit a
     * pool held for good (a thread waiting for a GPU that never finishes)
     * keeps its last partial buffer rather than hang exit(). */
    for (size_t i = 0; i < pools_count(); i++) {
        shim_pool *sp = pools_at(i);
        if (!sp || !atomic_load(&sp->trace))
            continue;
        if (!at_exit)
            bfc_pool_lock(sp->bfc);
        else if (!bfc_pool_lock_within(sp->bfc, EXIT_WAIT_MS)) {
            atomic_store(&sp->held_at_exit, true);
            shim_log(LOG_WARN, "BFCSHIM_TRACE: device %d's pool was busy at exit; its last "
                               "events are not in the trace", (int)sp->dev);
            continue;
        }
        trace_channel *c = atomic_load(&sp->trace); /* detached meanwhile: already flushed */
        if (c)
            trace_channel_flush(c);
        bfc_pool_unlock(sp->bfc);
    }
    /* A write that failed (a full disk) leaves the file without events:
     * said once, as the user would otherwise replay a trace cut short. */
    int err = trace_log_flush(atomic_load(&active));
    static atomic_bool said;
    if (err)
        shim_log_once(&said, LOG_ERROR, "BFCSHIM_TRACE: %s cannot be written (%s); the trace "
                                        "misses events", active_path, strerror(err));
}

void record_flush(void) { flush(false); }
void record_flush_at_exit(void) { flush(true); }

void record_after_fork_child(void)
{
    /* The child has no writer thread and the parent owns the file: the log
     * is forgotten, never written or freed (another thread of the parent may
     * have held its lock at fork time). */
    atomic_store(&active, NULL);
    const char *pattern = shim_config_get()->trace_path;
    bool own_file = pattern && strstr(pattern, "%p");
    pthread_mutex_init(&open_lock, NULL);
    atomic_store(&state, own_file ? UNOPENED : OFF);
}
