/*
 * fences.c - the engine's fence callbacks, made of CUDA events.
 *
 * Sealing an epoch records events that complete when everything submitted
 * so far has finished where it matters:
 *   a stream's lane  one event on that stream: its later work is ordered after
 *                    the free, so only other streams need to wait for it;
 *   the plain lane   (cudaFree/cuMemFree: work on any stream may still use the
 *                    block) one event on the legacy stream, which waits for
 *                    every blocking stream and every per-thread stream, plus
 *                    one on each known non-blocking stream.
 * No device-wide synchronisation, and nothing that would break a capture
 * under way in another thread: a capturing stream gets no event (its work
 * has not run and will run only as a graph), and the legacy stream is left
 * alone while any blocking stream captures (legacy work would join the
 * capture and invalidate it); then each known non-capturing stream gets its
 * own event instead. A lane's own stream capturing means its seal is refused
 * and the epoch stays open until a later allocation.
 *
 * Done: cuEventQuery on each event (cuEventSynchronize when the engine must
 * wait). All of this runs with the engine's lock held, which also guards the
 * fence queues and the recycled events.
 */
#include <stdlib.h>
#include <string.h>

#include "shim.h"

typedef struct fence {
    uint64_t token;
    uint32_t nevents;
    CUevent ev[];
} fence;

struct fence_queue {
    fence **items; /* ring */
    size_t head, n, cap;
};

static bool capturing(const real_driver *R, CUstream s)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    return R->StreamIsCapturing(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

static CUevent take_event(shim_pool *sp, const real_driver *R)
{
    if (sp->nspare)
        return sp->spare_events[--sp->nspare];
    CUevent e = NULL;
    if (R->EventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return NULL;
    return e;
}

static void give_event(shim_pool *sp, const real_driver *R, CUevent e)
{
    if (sp->nspare == sp->capspare) {
        size_t cap = sp->capspare ? sp->capspare * 2 : 16;
        CUevent *t = realloc(sp->spare_events, cap * sizeof *t);
        if (!t) {
            R->EventDestroy(e);
            return;
        }
        sp->spare_events = t;
        sp->capspare = cap;
    }
    sp->spare_events[sp->nspare++] = e;
}

static bool queue_push(shim_pool *sp, uint32_t lane, fence *f)
{
    fence_queue *q = sp->fences[lane];
    if (!q && !(q = sp->fences[lane] = calloc(1, sizeof *q)))
        return false;
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 8;
        fence **t = malloc(cap * sizeof *t);
        if (!t)
            return false;
        for (size_t i = 0; i < q->n; i++)
            t[i] = q->items[(q->head + i) % q->cap];
        free(q->items);
        q->items = t;
        q->head = 0;
        q->cap = cap;
    }
    q->items[(q->head + q->n++) % q->cap] = f;
    return true;
}

/* The streams a seal of `lane` records on; false: not now (capture). */
static bool fence_streams(shim_pool *sp, const real_driver *R, uint32_t lane, CUstream **out,
                          uint32_t *nout)
{
    known_stream few[32], *known = few;
    size_t n = streams_of_context(sp->ctx, few, 32);
    if (n > 32) {
        known = malloc(n * sizeof *known);
        if (!known)
            return false;
        n = streams_of_context(sp->ctx, known, n);
    }
    bool blocking_capture = false;
    bool *cap = calloc(n ? n : 1, sizeof *cap);
    CUstream *list = malloc((n + 1) * sizeof *list);
    uint32_t k = 0;
    bool ok = cap && list;
    for (size_t i = 0; ok && i < n; i++) {
        cap[i] = capturing(R, known[i].stream);
        blocking_capture |= cap[i] && !known[i].non_blocking;
    }
    CUstream own = atomic_load_explicit(&sp->lane_stream[lane], memory_order_acquire);
    if (!ok) {
        /* no host memory: refuse */
    } else if (lane != sp->plain_lane) {
        /* One stream: refuse while it captures (or, for the legacy stream,
         * while a blocking stream does: legacy work would join it). */
        bool busy = own == CU_STREAM_LEGACY ? blocking_capture : capturing(R, own);
        ok = !busy;
        if (ok)
            list[k++] = own;
    } else {
        if (!blocking_capture)
            list[k++] = CU_STREAM_LEGACY;
        for (size_t i = 0; i < n; i++)
            if (!cap[i] && (known[i].non_blocking || blocking_capture))
                list[k++] = known[i].stream;
    }
    free(cap);
    if (known != few)
        free(known);
    if (!ok) {
        free(list);
        return false;
    }
    *out = list;
    *nout = k;
    return true;
}

bool fences_seal(void *ctx, uint32_t lane, uint64_t token)
{
    shim_pool *sp = ctx;
    const real_driver *R = real_driver_get();
    CUstream *streams = NULL;
    uint32_t n = 0;
    if (!fence_streams(sp, R, lane, &streams, &n))
        return false;
    fence *f = malloc(sizeof *f + n * sizeof(CUevent));
    bool ok = f != NULL;
    uint32_t made = 0;
    for (; ok && made < n; made++) {
        CUevent e = take_event(sp, R);
        if (!e || R->EventRecord(e, streams[made]) != CUDA_SUCCESS) {
            if (e)
                give_event(sp, R, e);
            ok = false;
            break;
        }
        f->ev[made] = e;
    }
    free(streams);
    if (ok) {
        f->token = token;
        f->nevents = n;
        ok = queue_push(sp, lane, f);
    }
    if (!ok) {
        for (uint32_t i = 0; f && i < made; i++)
            give_event(sp, R, f->ev[i]);
        free(f);
        static atomic_bool said;
        shim_log_once(&said, LOG_DEBUG, "a fence could not be recorded yet; its blocks wait");
    }
    return ok;
}

/* Removes the oldest fence of a queue, keeping its events for reuse. */
static void drop_head(shim_pool *sp, const real_driver *R, fence_queue *q)
{
    fence *f = q->items[q->head];
    q->head = (q->head + 1) % q->cap;
    q->n--;
    for (uint32_t i = 0; i < f->nevents; i++)
        give_event(sp, R, f->ev[i]);
    free(f);
}

bool fences_done(void *ctx, uint32_t lane, uint64_t token, bool wait)
{
    shim_pool *sp = ctx;
    const real_driver *R = real_driver_get();
    fence_queue *q = sp->fences[lane];
    /* Fences older than the token asked about cover no block any more (the
     * lane's own stream reused them before they retired): drop them. */
    while (q && q->n && q->items[q->head]->token < token)
        drop_head(sp, R, q);
    if (!q || !q->n || q->items[q->head]->token != token)
        return false;
    fence *f = q->items[q->head];
    for (uint32_t i = 0; i < f->nevents; i++) {
        CUresult r = wait ? R->EventSynchronize(f->ev[i]) : R->EventQuery(f->ev[i]);
        if (r == CUDA_ERROR_NOT_READY)
            return false;
        /* Any other error means the work can no longer be running (a lost
         * context, a destroyed stream's event): nothing to wait for. */
        if (r != CUDA_SUCCESS)
            shim_log(LOG_DEBUG, "fence event query returned %d; treating as complete", (int)r);
    }
    drop_head(sp, R, q);
    return true;
}
