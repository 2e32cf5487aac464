/*
 * fake_control.c - the table tests steer the fake with (fakecuda_api_table,
 * fake_cuda.h): launching and completing work, counts and statistics, and
 * hooks that run a test's code at a chosen moment.
 */
#include "fake_internal.h"

test_hook before_event_query, after_stream_destroy, after_mem_create, after_is_capturing;

static int ctl_launch(void *stream, fakecuda_work fn, void *arg)
{
    ENTER();
    fstream *s = stream_of((CUstream)stream);
    if (!s)
        LEAVE(-1);
    if (work_usable(s) != CUDA_SUCCESS)
        LEAVE(-1);
    /* A kernel launched on a capturing stream is the graph's: never run. */
    if (captured_instead(s)) {
        maybe_autocomplete_and_unlock(s);
        return 0;
    }
    submit(s, fn, arg);
    maybe_autocomplete_and_unlock(s);
    return 0;
}

static int ctl_launch_stuck(void *stream)
{
    ENTER();
    fstream *s = stream_of((CUstream)stream);
    if (!s || legacy_use(s) != CUDA_SUCCESS)
        LEAVE(-1);
    enqueue(s, (work_item){.seq = submit(s, NULL, NULL), .stuck = true});
    LEAVE(0);
}

static void ctl_complete(void *stream)
{
    ENTER();
    complete_and_unlock(ctl_stream_of((CUstream)stream));
}

static void ctl_complete_all(void)
{
    ENTER();
    complete_everything_and_unlock(NULL);
}

static uint64_t ctl_pending(void *stream)
{
    ENTER();
    fstream *s = ctl_stream_of((CUstream)stream);
    LEAVE(s ? s->submitted - s->completed : 0);
}

static uint64_t ctl_submitted(void *stream)
{
    ENTER();
    fstream *s = ctl_stream_of((CUstream)stream);
    LEAVE(s ? s->submitted : 0);
}

/* As ctl_complete, only up to position seq: the GPU has run the stream's
 * first seq operations (and what they wait for on other streams). */
static void ctl_complete_to(void *stream, uint64_t seq)
{
    ENTER();
    fstream *s = ctl_stream_of((CUstream)stream);
    work_item *w = NULL;
    size_t n = 0;
    if (s)
        gather(s, seq, &w, &n);
    unlock_and_run(w, n);
}

static size_t ctl_calls(fakecuda_call_count *out, size_t n)
{
    /* Slots are only ever added, each name set before the count grows. */
    size_t have = atomic_load(&ncall_slots);
    for (size_t i = 0; i < have && i < n; i++) {
        out[i].name = call_counts[i].name;
        out[i].calls = atomic_load_explicit(&call_counts[i].n, memory_order_relaxed);
    }
    return have;
}

/* The next cuEventQuery from any thread calls fn(arg) first (cuEventQuery
 * above): a test puts another thread's call between a library's decision
 * about the query (its capture mode) and the query itself. */
static void ctl_before_next_event_query(fakecuda_work fn, void *arg)
{
    test_hook_set(&before_event_query, fn, arg);
}

static void ctl_after_next_stream_destroy(fakecuda_work fn, void *arg)
{
    test_hook_set(&after_stream_destroy, fn, arg);
}

static void ctl_after_next_mem_create(fakecuda_work fn, void *arg)
{
    test_hook_set(&after_mem_create, fn, arg);
}

static void ctl_after_stream_is_capturing(uint64_t n, fakecuda_work fn, void *arg)
{
    test_hook_set_nth(&after_is_capturing, n, fn, arg);
}

static void ctl_stats(fakecuda_stats *out)
{
    ENTER();
    *out = G.st;
    pthread_mutex_unlock(&G.lock);
}

static void ctl_fail_alloc_after(uint64_t n)
{
    ENTER();
    G.fail_alloc_countdown = n;
    pthread_mutex_unlock(&G.lock);
}

static int ctl_fail_call(const char *name, uint64_t n, int code, int sticky)
{
    return failure_arm(name, n, (CUresult)code, sticky != 0);
}

static int ctl_is_device_pointer(uint64_t addr)
{
    ENTER();
    LEAVE(find_alloc(addr, true) != NULL || vmm_mapping_at(addr) != NULL);
}

static int ctl_set_current_unseen(void *ctx)
{
    return (int)set_current((CUcontext)ctx);
}

EXPORT const fakecuda_api *fakecuda_api_table(void);
static const fakecuda_api api = {
    .launch = ctl_launch,
    .complete = ctl_complete,
    .complete_all = ctl_complete_all,
    .pending = ctl_pending,
    .stats = ctl_stats,
    .fail_alloc_after = ctl_fail_alloc_after,
    .is_device_pointer = ctl_is_device_pointer,
    .launch_stuck = ctl_launch_stuck,
    .submitted = ctl_submitted,
    .complete_to = ctl_complete_to,
    .calls = ctl_calls,
    .before_next_event_query = ctl_before_next_event_query,
    .set_current_unseen = ctl_set_current_unseen,
    .after_next_stream_destroy = ctl_after_next_stream_destroy,
    .after_next_mem_create = ctl_after_next_mem_create,
    .fail_call = ctl_fail_call,
    .after_stream_is_capturing = ctl_after_stream_is_capturing,
};

EXPORT const fakecuda_api *fakecuda_api_table(void) { return &api; }
