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

/* Writes into out (room for n + 1) the streams a seal of `lane` records
 * on, given the context's n known streams; returns how many, or -1 when it
 * cannot seal now (capture). Only the plain lane and the legacy stream's
 * lane need to know which streams capture. */
static int fence_streams(shim_pool *sp, const real_driver *R, uint32_t lane,
                         const known_stream *known, size_t n, CUstream *out)
{
    CUstream own = atomic_load_explicit(&sp->lane_stream[lane], memory_order_acquire);
    if (lane != sp->plain_lane && own != CU_STREAM_LEGACY) {
        if (capturing(R, own)) /* one stream: not while it captures */
            return -1;
        out[0] = own;
        return 1;
    }
    bool blocking_capture = false;
    for (size_t i = 0; i < n && !blocking_capture; i++)
        blocking_capture = !known[i].non_blocking && capturing(R, known[i].stream);
    if (lane != sp->plain_lane) {
        /* The legacy stream's lane: legacy work would join the capture. */
        if (blocking_capture)
            return -1;
        out[0] = own;
        return 1;
    }
    int k = 0;
    if (!blocking_capture)
        out[k++] = CU_STREAM_LEGACY;
    for (size_t i = 0; i < n; i++)
        if ((known[i].non_blocking || blocking_capture) && !capturing(R, known[i].stream))
            out[k++] = known[i].stream;
    return k;
}

/* Seals run on most allocations that follow frees: the common case (up to
 * 32 known streams) touches no heap but the fence itself. */
enum { FEW_STREAMS = 32 };

bool fences_seal(void *ctx, uint32_t lane, uint64_t token)
{
    shim_pool *sp = ctx;
    const real_driver *R = real_driver_get();
    known_stream few[FEW_STREAMS], *known = few;
    CUstream few_out[FEW_STREAMS + 1], *streams = few_out;
    size_t nknown = streams_of_context(sp->ctx, few, FEW_STREAMS);
    if (nknown > FEW_STREAMS) {
        known = malloc(nknown * sizeof *known);
        streams = malloc((nknown + 1) * sizeof *streams);
        if (!known || !streams) {
            free(known);
            free(streams);
            return false;
        }
        /* (a stream made since the count is not copied, nor fenced: it has
         * no work older than the frees) */
        size_t now = streams_of_context(sp->ctx, known, nknown);
        if (now < nknown)
            nknown = now;
    }
    int found = fence_streams(sp, R, lane, known, nknown, streams);
    if (known != few)
        free(known);
    if (found < 0) {
        if (streams != few_out)
            free(streams);
        return false;
    }
    uint32_t n = (uint32_t)found;
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
    if (streams != few_out)
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
