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
 *                    one on each known non-blocking stream, plus every
 *                    stand-in event that has not completed (below), plus,
 *                    in a primary context's pool, one cuGreenCtxRecordEvent
 *                    per live green context of the device (green.c);
 *   a green stream's lane  that green context's event (green.c).
 * No device-wide synchronisation, and nothing that would break a capture
 * under way in another thread: a capturing stream gets no event (its work
 * has not run and will run only as a graph), and while any blocking stream
 * captures the plain and legacy lanes are not sealed at all (legacy work
 * would join the capture and invalidate it, and no event could stand for
 * other threads' per-thread default streams meanwhile; the driver tells us
 * by answering cuStreamIsCapturing(CU_STREAM_LEGACY) with
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, which also covers per-thread default
 * streams): their epochs stay open until the capture ends. A lane's own
 * stream capturing means its seal is refused the same way.
 *
 * Stand-ins. Work queued on a stream before it is destroyed still runs
 * (cuStreamDestroy returns at once), and work queued before a stream begins
 * capturing still runs while no event can be recorded on it. Either way the
 * stream drops out of the seals above while its old work may still read a
 * block freed before or after. So just before a stream is destroyed or
 * begins a capture, one event is recorded on it (and on the legacy stream
 * when a blocking stream begins capturing): a stand-in. Every plain seal
 * includes each stand-in that has not completed yet; a completed stand-in
 * is dropped once no fence refers to it. A stand-in the driver refuses is
 * replaced by a host wait for the stream; when that fails too, the pool
 * keeps its freed blocks for good (fences_keep_freed).
 *
 * Blind fences. Loaded as a plug-in without LD_PRELOAD, the library sees
 * none of the program's streams (streams_all_seen), so no set of events can
 * cover a plain free: a non-blocking stream it never heard of may still use
 * the block. A plain seal then records nothing and takes the next number of
 * the pool's blind count; the fence is complete once a cuCtxSynchronize of
 * the pool's context began after it was sealed (it waits for every stream
 * of the context, seen or not). That synchronisation is made only when the
 * engine must wait (nothing else serves an allocation) or on a trim, and
 * one covers every blind fence sealed before it: a plain free there costs
 * what the real cudaFree costs (it synchronises), and less, since one wait
 * serves many frees.
 *
 * Ordered pools. While no stream of the pool's context can run outside the
 * legacy stream's order (the library sees every stream, none of them is
 * non-blocking, no green context exists), the plain lane and the legacy
 * stream's lane need no event to wait for: "when an action is taken in the
 * legacy stream such as a kernel launch or cudaStreamWaitEvent(), the legacy
 * stream first waits on all blocking streams, the action is queued in the
 * legacy stream, and then all blocking streams wait on the legacy stream"
 * (CUDA's stream synchronisation behaviour; per-thread default streams are
 * blocking ones). So their seal is a barrier: an event recorded on the legacy
 * stream and a cuStreamWaitEvent of the legacy stream on it, after the
 * legacy stream was made to wait for every stand-in still pending (a
 * destroyed stream's queued work). Every use of a block submitted after the
 * seal, on any stream of the context, runs after every use submitted before
 * the free: the fence is complete when it is made, and the engine, told the
 * lanes are lazy, seals them only when it needs their memory. The first
 * non-blocking stream ends the state for good (it is made to wait for the
 * last barrier before it can run anything), and so does a green context
 * (the host waits for the last barrier: its default stream cannot be made
 * to wait without making it current). A block made reusable that way is not
 * idle: before the pool gives memory back (an unmap, a region freed) it
 * waits for the last barrier (fences_barrier_idle).
 *
 * Done: cuEventQuery on each event (cuEventSynchronize when the engine must
 * wait). In the default global capture mode another thread's global-mode
 * capture would refuse them and be invalidated (capture.c): a query is made
 * under the streams registry's lock, so that no capture begins between its
 * look at the count of captures under way and its answer, and in relaxed
 * mode while that count is not 0; a wait is always made in relaxed mode,
 * holding no lock a begin would wait for. Only CUDA_SUCCESS means
 * complete: an error (a refused query, a lost context) means "not known",
 * and the blocks stay pending. All of this runs with the engine's lock held,
 * which also guards the fence queues and the recycled events; the stand-ins
 * have their own lock. The order: the engine's lock, then the registry's,
 * then the stand-ins' (a begin records its stand-in under the registry's
 * write lock), never another way.
 */
#include <stdlib.h>
#include <string.h>

#include "array_room.h"
#include "shim.h"

/* A stand-in event, shared by the fences that include it. */
typedef struct stand_in {
    CUevent ev;
    uint32_t refs; /* fences that include it */
    bool done;     /* seen complete */
    bool legacy_waits; /* an ordered seal made the legacy stream wait for it */
} stand_in;

typedef struct fence {
    uint64_t token;
    uint64_t blind;     /* 0, or its number among the pool's blind fences */
    uint32_t nevents;   /* recorded for this fence, recycled with it */
    uint32_t ndone;     /* events [0, ndone) were seen complete: not asked again */
    uint32_t nstandins; /* shared stand-ins, after the events */
    CUevent ev[];
} fence;

static stand_in **fence_stand_ins(fence *f)
{
    return (stand_in **)(f->ev + f->nevents);
}

struct fence_queue {
    fence **items; /* ring */
    size_t head, n, cap;
};

static bool capturing(const real_driver *R, CUstream s)
{
    if (capture_none()) /* every begin is counted, and none is under way */
        return false;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    return R->StreamIsCapturing(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Does a blocking stream of the current context capture? The driver says so
 * for every such stream, per-thread default streams of any thread included,
 * when asked about the legacy stream. */
bool fences_legacy_blocked(const real_driver *R)
{
    if (capture_none())
        return false;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    return R->StreamIsCapturing(CU_STREAM_LEGACY, &st) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
}

/* Is the fence event complete? Only a successful answer counts; waiting
 * blocks the host until it is. A query takes the registry's read lock
 * unless the thread holds the registry's lock already: so a thread that
 * holds a pool's stand-in lock must have taken the registry's first (the
 * header's order). A wait takes no lock: it may last, and a begin would
 * wait for it (and the seals of every other thread behind that begin). */
static bool event_done(const real_driver *R, CUevent e, bool wait)
{
    CUresult r;
    if (wait) {
        relaxed_scope rs = capture_relax_always(R);
        r = R->EventSynchronize(e);
        capture_restore(R, rs);
    } else {
        bool took = streams_use_enter();
        relaxed_scope rs = capture_relax(R);
        r = R->EventQuery(e);
        capture_restore(R, rs);
        streams_use_leave(took);
    }
    if (r == CUDA_SUCCESS)
        return true;
    if (r != CUDA_ERROR_NOT_READY) {
        static atomic_bool said;
        shim_log_once(&said, LOG_DEBUG,
                      "a fence event query returned %d: its blocks stay pending", (int)r);
    }
    return false;
}

/* ---- stand-ins ------------------------------------------------------------------ */

/* Registry lock and stand-in lock held: forgets completed stand-ins no
 * fence refers to, and returns how many are still pending (each then goes
 * into the next plain fence). */
static size_t stand_ins_pending(shim_pool *sp, const real_driver *R)
{
    size_t pending = 0;
    for (size_t i = 0; i < sp->nstand_ins;) {
        stand_in *si = sp->stand_ins[i];
        if (!si->done)
            si->done = event_done(R, si->ev, false);
        if (si->done && si->refs == 0) {
            R->EventDestroy(si->ev);
            free(si);
            sp->stand_ins[i] = sp->stand_ins[--sp->nstand_ins];
            continue;
        }
        pending += !si->done;
        i++;
    }
    return pending;
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
    CUevent *t = array_room(sp->spare_events, sp->nspare, &sp->capspare, sizeof *t, 16);
    if (!t) {
        R->EventDestroy(e);
        return;
    }
    sp->spare_events = t;
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

/* Keeps stand-in event e (recorded) until it completes and no fence refers
 * to it. */
/* Host memory ran out before stand-in e could be kept: the host waits for
 * it now (correctness first). When that wait fails nothing covers the
 * stream's work: the pool keeps its freed blocks (fences_keep_freed), as
 * when neither a stand-in nor a wait can be made (e2e_api stand-in-nomem:
 * the failed wait was ignored, and the block came back under the destroyed
 * stream's work). */
static void wait_stand_in_now(shim_pool *sp, const real_driver *R, CUevent e)
{
    relaxed_scope rs = capture_relax_always(R);
    CUresult r = R->EventSynchronize(e);
    capture_restore(R, rs);
    R->EventDestroy(e);
    if (r != CUDA_SUCCESS)
        fences_keep_freed(sp, r);
}

static void keep_stand_in(shim_pool *sp, const real_driver *R, CUevent e)
{
    stand_in *si = calloc(1, sizeof *si);
    if (!si) {
        wait_stand_in_now(sp, R, e);
        return;
    }
    si->ev = e;
    /* (the registry's lock before the stand-ins', for the sweep's queries:
     * a begin holds the write lock here already, a destroy holds none) */
    bool took = streams_use_enter();
    pthread_mutex_lock(&sp->stand_in_lock);
    /* Programs without plain frees never seal the plain lane: sweep here
     * too, so completed stand-ins do not pile up. */
    stand_ins_pending(sp, R);
    stand_in **t = array_room(sp->stand_ins, sp->nstand_ins, &sp->capstand_ins, sizeof *t, 8);
    if (!t) {
        pthread_mutex_unlock(&sp->stand_in_lock);
        streams_use_leave(took);
        /* Without room to remember it, wait for it now (this only
         * happens when host memory runs out). */
        free(si);
        wait_stand_in_now(sp, R, e);
        return;
    }
    sp->stand_ins = t;
    sp->stand_ins[sp->nstand_ins++] = si;
    pthread_mutex_unlock(&sp->stand_in_lock);
    streams_use_leave(took);
}

/* Records e on green context g's whole work when g is set, else on s. */
static CUresult record(const real_driver *R, CUevent e, CUstream s, CUgreenCtx g)
{
    return g ? R->GreenCtxRecordEvent(g, e) : R->EventRecord(e, s);
}

/* A stand-in on stream s, or on green context g's whole work. */
static bool stand_in_on(shim_pool *sp, CUstream s, CUgreenCtx g)
{
    const real_driver *R = real_driver_get();
    CUevent e = NULL;
    if (!R || (g && !R->GreenCtxRecordEvent) ||
        R->EventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return false;
    if (record(R, e, s, g) != CUDA_SUCCESS) {
        R->EventDestroy(e);
        return false;
    }
    keep_stand_in(sp, R, e);
    return true;
}

void fences_keep_freed(shim_pool *sp, CUresult r)
{
    if (atomic_exchange(&sp->keep_freed, true))
        return;
    shim_log(LOG_ERROR, "device %d: queued work could be neither fenced nor waited for "
                        "(the driver answered %d): freed memory of this pool is kept from "
                        "now on, never reused", (int)sp->dev, (int)r);
}

void fences_stand_in(shim_pool *sp, CUstream s, bool unknown)
{
    if (stand_in_on(sp, s, NULL))
        return;
    /* No event: the host waits for what it would have covered, before the
     * stream goes or begins capturing. */
    const real_driver *R = real_driver_get();
    CUresult r = !R ? CUDA_ERROR_NOT_INITIALIZED
                 : unknown ? CUDA_ERROR_UNKNOWN
                           : capture_relaxed_stream_wait(R, s);
    if (r != CUDA_SUCCESS) {
        fences_keep_freed(sp, r);
        return;
    }
    static atomic_bool said;
    shim_log_once(&said, LOG_DEBUG, "a stand-in event could not be recorded: the host waited "
                                    "for the stream instead");
}

bool fences_stand_in_green(shim_pool *sp, CUgreenCtx g) { return stand_in_on(sp, NULL, g); }

/* Writes into out (room for n + 1) the streams a seal of `lane` records
 * on, given the context's n known streams (gathered for the plain lane
 * only); returns how many, or -1 when it cannot seal now (capture). Only
 * the plain lane and the legacy stream's lane need to know which streams
 * capture. */
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
    /* Seals run with the pool's context current (the shim pushes it before
     * entering the engine), so one question covers every blocking stream of
     * the context, per-thread default streams included. */
    /* While a blocking stream captures, legacy work would join the capture,
     * and no event can stand for the other blocking streams' work: the
     * per-thread default streams of other threads are in no registry, and
     * work they queue after the capture began is covered by no stand-in
     * (e2e_fences ptsz-during-capture). Neither lane is sealed until the
     * capture ends. */
    if (fences_legacy_blocked(R))
        return -1;
    out[0] = CU_STREAM_LEGACY;
    if (lane != sp->plain_lane)
        return 1;
    /* A non-blocking stream that captures takes no event: its earlier work
     * is covered by the stand-in recorded when it began capturing, or when
     * a wait the hooks saw forked it into a capture (capture.c). One that
     * captures with neither counted (a fork the hooks could not see, with
     * the driver door closed; a begin they could not see, once the shim
     * asks at all) has no stand-in, and its work from before the capture
     * may still use the block: the plain lane waits until that capture ends
     * (e2e_fences capture-fork, where the block was handed out with the
     * fork's earlier work still queued before forks were hooked). */
    int k = 1;
    for (size_t i = 0; i < n; i++) {
        if (!known[i].non_blocking)
            continue;
        if (!capturing(R, known[i].stream))
            out[k++] = known[i].stream;
        else if (!capture_begun_on(known[i].stream))
            return -1;
    }
    return k;
}

/* Seals run on most allocations that follow frees: the common case (up to
 * 32 known streams) touches no heap but the fence itself. */
enum { FEW_STREAMS = 32 };

/* A plain seal while the program's streams are not seen: no event could
 * cover them, so the fence waits for a context synchronisation. */
static bool seal_blind(shim_pool *sp, uint32_t lane, uint64_t token)
{
    fence *f = malloc(sizeof *f);
    if (!f)
        return false;
    *f = (fence){.token = token};
    f->blind = atomic_load(&sp->blind_sealed) + 1;
    if (!queue_push(sp, lane, f)) {
        free(f);
        return false;
    }
    atomic_store(&sp->blind_sealed, f->blind);
    return true;
}

bool fences_sync_blind(shim_pool *sp)
{
    const real_driver *R = real_driver_get();
    uint64_t upto = atomic_load(&sp->blind_sealed);
    if (!R || !R->CtxSynchronize || atomic_load(&sp->blind_synced) >= upto)
        return false;
    bool pushed = real_ctx_enter(R, sp->ctx);
    /* Not while a blocking stream of the context captures: the wait would
     * be refused and invalidate the capture (the blocks wait for a later
     * try). Relaxed mode keeps another thread's global-mode capture from
     * refusing it. */
    bool ok = false;
    if (!fences_legacy_blocked(R)) {
        relaxed_scope rs = capture_relax_always(R); /* a host wait (event_done) */
        ok = R->CtxSynchronize() == CUDA_SUCCESS;
        capture_restore(R, rs);
    }
    real_ctx_leave(R, pushed);
    if (!ok)
        return false;
    atomic_fetch_add(&sp->context_syncs, 1);
    /* Raise the mark to upto, never lower it (another thread's sync may
     * have covered more meanwhile). */
    uint64_t was = atomic_load(&sp->blind_synced);
    while (was < upto && !atomic_compare_exchange_weak(&sp->blind_synced, &was, upto))
        ;
    return true;
}

/* ---- ordered pools ------------------------------------------------------------- */

/*
 * The seal of an ordered pool's plain or legacy lane, under the registry's
 * read lock, while no blocking stream captures (legacy work would join the
 * capture): a barrier on the legacy stream (header).
 */
static bool seal_ordered(shim_pool *sp, const real_driver *R, uint32_t lane, uint64_t token)
{
    /* A stand-in's stream may be gone (destroyed with work queued), and
     * whether the legacy stream still waits for such work is not written
     * anywhere: make it wait, once per stand-in. */
    pthread_mutex_lock(&sp->stand_in_lock);
    stand_ins_pending(sp, R);
    for (size_t i = 0; i < sp->nstand_ins; i++) {
        stand_in *si = sp->stand_ins[i];
        if (si->done || si->legacy_waits)
            continue;
        if (R->StreamWaitEvent(CU_STREAM_LEGACY, si->ev, 0) != CUDA_SUCCESS) {
            pthread_mutex_unlock(&sp->stand_in_lock);
            return false;
        }
        si->legacy_waits = true;
    }
    pthread_mutex_unlock(&sp->stand_in_lock);
    fence *f = malloc(sizeof *f);
    CUevent e = f ? take_event(sp, R) : NULL;
    if (!e || R->EventRecord(e, CU_STREAM_LEGACY) != CUDA_SUCCESS ||
        R->StreamWaitEvent(CU_STREAM_LEGACY, e, 0) != CUDA_SUCCESS) {
        if (e) /* not recycled: a refused record may mean an event of the wrong context */
            R->EventDestroy(e);
        free(f);
        return false;
    }
    /* Complete as made: no event to ask about. */
    *f = (fence){.token = token};
    if (!queue_push(sp, lane, f)) {
        give_event(sp, R, e);
        free(f);
        return false;
    }
    if (sp->last_barrier)
        give_event(sp, R, sp->last_barrier);
    sp->last_barrier = e;
    sp->barrier_idle = false;
    return true;
}

/*
 * Where allocations on the legacy stream take the legacy lane in stream
 * order (a pool that is not ordered, or the library loaded as a plug-in;
 * pool_lane_for_alloc), a stream-ordered free there must be what CUDA's
 * is, a legacy-stream action: "the legacy stream first waits on all
 * blocking streams, the action is queued in the legacy stream, and then
 * all blocking streams wait on the legacy stream", so work that used the
 * block on any blocking stream (another thread's per-thread default
 * stream, say) before the free runs before work on any blocking stream
 * after the allocation. The shim queues nothing for the free itself, so it
 * makes the action: the legacy stream waits for an event recorded there
 * once (the wait, not the record, is the action), before the block enters
 * the lane, so that no allocation can take the block before the action is
 * queued (e2e_fences legacy-lane-ptsz, found by the per-thread audit). In
 * an ordered pool the free goes to the plain lane instead, whose barrier
 * is the action (svc_free).
 *
 * Whether the legacy stream waits for a destroyed stream's queued work is
 * not documented (the fake says no), and this reuse does not depend on it:
 * nothing but such a free puts a block in the lane (a plain free's block,
 * a destroyed stream's epoch, go to the plain lane, whose fence includes
 * the stand-ins), and the program orders every earlier use before the
 * free by what CUDA documents (an event, a host wait, or a legacy-stream
 * action queued while that use's blocking stream lived, this wait among
 * them), all queued before the wait. Nor does a pool that keeps its freed
 * blocks stop it: no fence is asked (e2e_fences legacy-lane-destroyed,
 * legacy-alloc-destroyed; e2e_drvfail legacy-lane-kept,
 * destroy-no-wait-blocking).
 */
bool fences_legacy_order(shim_pool *sp)
{
    const real_driver *R = real_driver_get();
    if (!R || !R->StreamWaitEvent)
        return false;
    CUevent e = atomic_load_explicit(&sp->legacy_order_event, memory_order_acquire);
    if (!e) {
        CUevent made = NULL;
        if (R->EventCreate(&made, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
            return false;
        if (R->EventRecord(made, CU_STREAM_LEGACY) != CUDA_SUCCESS) {
            R->EventDestroy(made);
            return false;
        }
        CUevent none = NULL;
        if (atomic_compare_exchange_strong(&sp->legacy_order_event, &none, made)) {
            e = made;
        } else { /* another thread's is there */
            R->EventDestroy(made);
            e = none;
        }
    }
    return R->StreamWaitEvent(CU_STREAM_LEGACY, e, 0) == CUDA_SUCCESS;
}

bool fences_barrier_idle(shim_pool *sp, bool wait)
{
    /* The wait comes first, even in a pool that keeps its freed blocks:
     * nothing goes back by choice then (release_ready: false), but a
     * region the engine gives back all the same (region_free) must not go
     * before the work queued ahead of the last barrier (e2e_drvfail
     * ordered-trim-kept: it went back with that work queued). */
    if (sp->last_barrier && !sp->barrier_idle)
        sp->barrier_idle = event_done(real_driver_get(), sp->last_barrier, wait);
    const bool idle = !sp->last_barrier || sp->barrier_idle;
    return idle && !atomic_load_explicit(&sp->keep_freed, memory_order_relaxed);
}

/* The one context known so far, until a second one makes `several` true
 * for good (fences_context_seen). */
static _Atomic(CUcontext) sole_context;
static atomic_bool several_contexts;

/*
 * Which pools' plain and legacy lanes are lazy (sealed only when the pool
 * needs their memory, or once they hold a share of what is in use:
 * bfc_pool_lane_set_lazy): an ordered pool's, whose barrier makes a sealed
 * block reusable at once, and a preallocated pool's in any state. A
 * preallocated pool took its memory already: while it has room, sealing
 * later costs it nothing, and near its limit the engine seals at a share
 * of what is held. Its event fences are then made far less often. Replayed
 * with two non-blocking streams (docs/benchmarks.md): 2.7-4.9 -> 1.00-2.70
 * shim calls per allocation at GPU lags 0 and 100 over 13 real traces,
 * about half the host waits for fences near the limit, the smallest limit
 * that serves the single-stream default's (within 1%, 2.7% on one small
 * trace); at lag 1000 about 5% more calls. Later sealing
 * is as safe as sealing at once (a fence still covers every free before
 * it: a larger fence interval). A growing pool that is not ordered seals
 * at the interval: lazily it waited for fences more often at lag 100 (304
 * host waits against 140 on ResNet-50) for the same peak. So does a pool
 * for which the user set BFCSHIM_FENCE_INTERVAL: that is asking for seals
 * at an interval. The lanes of explicit streams (stream-ordered frees)
 * follow the same rule (fences_lazy_pool, pools.c): a stream takes its
 * own lane's blocks in stream order whether sealed or not, so laziness
 * only delays other streams' reuse (two non-blocking streams, async door:
 * 2.1-3.8 -> 1.0-1.8 calls per allocation; figures in docs/benchmarks.md).
 */
bool fences_lazy_pool(shim_pool *sp)
{
    if (shim_config_get()->fence_interval_set)
        return false;
    bfc_options o;
    bfc_pool_options(sp->bfc, &o);
    return o.preallocate;
}

static bool lanes_lazy_for(shim_pool *sp)
{
    return atomic_load(&sp->ordered) || fences_lazy_pool(sp);
}

static void set_lanes_lazy(shim_pool *sp, bool lazy)
{
    bfc_pool_lane_set_lazy(sp->bfc, sp->plain_lane, lazy);
    bfc_pool_lane_set_lazy(sp->bfc, sp->legacy_lane, lazy);
}

static void ordered_begin(shim_pool *sp);

void fences_ordered_begin(shim_pool *sp)
{
    ordered_begin(sp);
    if (lanes_lazy_for(sp))
        set_lanes_lazy(sp, true);
}

static void ordered_begin(shim_pool *sp)
{
    const real_driver *R = real_driver_get();
    fences_context_seen(sp->ctx);
    /* Preloaded with the driver door hooked: every stream and every context
     * made is seen. */
    if (!R || !R->StreamWaitEvent || shim_config_get()->free_policy != FREE_FENCED ||
        !streams_all_seen() || !shim_driver_hooked() || green_any() ||
        atomic_load(&several_contexts))
        return;
    /* Under the write lock, so that a non-blocking stream made meanwhile is
     * either in the registry now or finds this pool ordered (it was
     * published before) and ends the state. */
    streams_change_begin();
    known_stream few[FEW_STREAMS];
    size_t n = streams_of_context(sp->ctx, few, FEW_STREAMS);
    bool escapes = n > FEW_STREAMS; /* (many streams: not worth a look) */
    for (size_t i = 0; i < n && !escapes; i++)
        escapes = few[i].non_blocking;
    /* (several_contexts read under the lock: fences_context_seen sets it
     * before it looks for ordered pools, each under the lock) */
    if (!escapes && !green_any() && !atomic_load(&several_contexts))
        atomic_store(&sp->ordered, true);
    streams_change_end();
}

/* Write lock held: takes sp out of the ordered state; returns its last
 * barrier (NULL: none was made, or it was not ordered). */
static CUevent end_ordered(shim_pool *sp, bool *was)
{
    *was = atomic_exchange(&sp->ordered, false);
    return *was ? sp->last_barrier : NULL;
}

/* Outside every lock, once the pool is no longer ordered: its lanes are
 * sealed at the interval again, unless they stay lazy (lanes_lazy_for). */
static void lanes_eager(shim_pool *sp)
{
    if (!lanes_lazy_for(sp))
        set_lanes_lazy(sp, false);
}

CUresult fences_ordered_stream_made(CUcontext ctx, CUstream s)
{
    const real_driver *R = real_driver_get();
    shim_pool *sp = R ? pool_for_context(ctx, false) : NULL;
    if (!sp)
        return CUDA_SUCCESS;
    /* The state is asked under the write lock, not before: a pool made
     * meanwhile stores it under that lock after copying the registry, and
     * a look before the store, with the stream registered after the copy,
     * would leave the pool ordered with this stream alive (e2e_ordered_race
     * stream-during-pool). */
    streams_change_begin(); /* no seal in flight: last_barrier is the last */
    bool was;
    CUevent b = end_ordered(sp, &was);
    /* Blocks reused after that barrier may still have old work queued
     * before it: s runs nothing until it is done. If the wait cannot be
     * made, the host waits instead; if that fails too, s may not be used
     * (the caller destroys it): blocks handed out behind the barrier
     * cannot be taken back. */
    CUresult r = CUDA_SUCCESS;
    if (b && R->StreamWaitEvent(s, b, 0) != CUDA_SUCCESS) {
        relaxed_scope rs = capture_relax_always(R);
        r = R->EventSynchronize(b);
        capture_restore(R, rs);
    }
    streams_change_end();
    if (was) {
        lanes_eager(sp);
        shim_log(LOG_DEBUG, "device %d: a non-blocking stream: plain frees are fenced with "
                            "events from now on", (int)sp->dev);
    }
    if (r == CUDA_SUCCESS)
        return r;
    shim_log(LOG_ERROR, "device %d: a new non-blocking stream could be made to wait for the "
                        "pool's last barrier neither on the device nor on the host (the driver "
                        "answered %d): the stream is refused", (int)sp->dev, (int)r);
    /* (cuStreamCreate's codes, cuda.h: the errors of earlier launches, a
     * lost context, or none of them: out of memory) */
    return r == CUDA_ERROR_ILLEGAL_ADDRESS || r == CUDA_ERROR_LAUNCH_FAILED ||
                   r == CUDA_ERROR_INVALID_CONTEXT || r == CUDA_ERROR_DEINITIALIZED ||
                   r == CUDA_ERROR_NOT_INITIALIZED
               ? r
               : CUDA_ERROR_OUT_OF_MEMORY;
}

/* The host waits for the last barriers, since the work that may now reach
 * the pools' blocks (another context's, a green context's default stream)
 * cannot be made to wait on the device. */
void fences_ordered_end_device(CUdevice dev)
{
    const real_driver *R = real_driver_get();
    for (size_t i = 0, n = pools_count(); R && i < n; i++) {
        shim_pool *sp = pools_at(i);
        /* (ordered is asked under the lock: see fences_ordered_stream_made) */
        if (!sp || (dev >= 0 && sp->dev != dev))
            continue;
        streams_change_begin();
        bool was;
        CUevent b = end_ordered(sp, &was);
        if (b)
            event_done(R, b, true);
        streams_change_end();
        if (was)
            lanes_eager(sp);
    }
}

void fences_context_seen(CUcontext ctx)
{
    ctx = green_canonical(ctx);
    if (!ctx || atomic_load(&several_contexts))
        return;
    CUcontext first = NULL;
    if (atomic_compare_exchange_strong(&sole_context, &first, ctx) || first == ctx)
        return;
    atomic_store(&several_contexts, true); /* before the pools are looked at */
    static atomic_bool said;
    shim_log_once(&said, LOG_DEBUG, "a second CUDA context: plain frees are fenced with events "
                                    "from now on");
    fences_ordered_end_device(-1);
}

bool fences_seal(void *ctx, uint32_t lane, uint64_t token)
{
    shim_pool *sp = ctx;
    if (atomic_load_explicit(&sp->keep_freed, memory_order_relaxed))
        return false; /* (fences_keep_freed) */
    pools_context_needed(sp);
    const real_driver *R = real_driver_get();
    /* Only the plain lane fences other streams than its own. */
    bool plain = lane == sp->plain_lane;
    if (plain && !streams_all_seen())
        return seal_blind(sp, lane, token);
    known_stream few[FEW_STREAMS], *known = few;
    CUstream few_out[FEW_STREAMS + 1], *streams = few_out;
    /* From the questions about the streams (which exist, which capture) to
     * the events recorded on them, no stream goes away and none begins a
     * capture: another thread's destroy or begin waits (streams.c). An
     * event recorded on a stream that began capturing after the question
     * would be a captured event that never completes, and its blocks would
     * stay pending for good. */
    streams_use_begin();
    /* (While a blocking stream captures, neither a barrier nor events:
     * fence_streams refuses the seal below.) */
    if (atomic_load_explicit(&sp->ordered, memory_order_relaxed) &&
        (plain || lane == sp->legacy_lane) && !fences_legacy_blocked(R)) {
        bool ok = seal_ordered(sp, R, lane, token);
        streams_use_end();
        return ok;
    }
    size_t nknown = plain ? streams_of_context(sp->ctx, few, FEW_STREAMS) : 0;
    if (nknown > FEW_STREAMS) {
        known = malloc(nknown * sizeof *known);
        streams = malloc((nknown + 1) * sizeof *streams);
        if (!known || !streams) {
            free(known);
            free(streams);
            streams_use_end();
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
    /* Green contexts' work (green.c): for the plain lane, one event per
     * green context of the device; for a lane whose stream is a green
     * context's, that context's event stands for the stream's, on which an
     * event of this context cannot be recorded. */
    CUgreenCtx *greens = NULL;
    int ngreen = found < 0 ? 0 : green_fence_targets(R, sp, plain,
                                                    atomic_load_explicit(&sp->lane_stream[lane],
                                                                         memory_order_acquire),
                                                    &greens);
    if (found < 0 || ngreen < 0) {
        streams_use_end();
        if (streams != few_out)
            free(streams);
        return false;
    }
    if (!plain && ngreen > 0)
        found = 0;
    uint32_t n = (uint32_t)found, ng = (uint32_t)ngreen;
    /* The plain lane also waits for every stand-in still pending. */
    if (plain)
        pthread_mutex_lock(&sp->stand_in_lock);
    size_t nsi = plain ? stand_ins_pending(sp, R) : 0;
    fence *f = malloc(sizeof *f + (n + ng) * sizeof(CUevent) + nsi * sizeof(stand_in *));
    bool ok = f != NULL;
    if (ok) {
        f->blind = 0;
        f->nevents = n + ng;
        f->ndone = 0;
        f->nstandins = 0;
    }
    uint32_t made = 0;
    for (; ok && made < n + ng; made++) {
        CUevent e = take_event(sp, R);
        if (!e || record(R, e, made < n ? streams[made] : NULL,
                         made < n ? NULL : greens[made - n]) != CUDA_SUCCESS) {
            if (e) /* not recycled: a refused record may mean an event of the wrong context */
                R->EventDestroy(e);
            ok = false;
            break;
        }
        f->ev[made] = e;
    }
    streams_use_end();
    if (streams != few_out)
        free(streams);
    free(greens);
    if (ok) {
        stand_in **si = fence_stand_ins(f);
        /* The stand-in list is read under stand_in_lock, which only the
         * plain lane takes; for other lanes nsi is 0 and the list is not
         * touched (another thread may be adding to it). */
        for (size_t i = 0; f->nstandins < nsi && i < sp->nstand_ins; i++)
            if (!sp->stand_ins[i]->done) {
                sp->stand_ins[i]->refs++;
                si[f->nstandins++] = sp->stand_ins[i];
            }
        f->token = token;
        ok = queue_push(sp, lane, f);
        if (!ok)
            for (uint32_t i = 0; i < f->nstandins; i++)
                si[i]->refs--;
    }
    if (plain)
        pthread_mutex_unlock(&sp->stand_in_lock);
    if (!ok) {
        for (uint32_t i = 0; f && i < made; i++)
            give_event(sp, R, f->ev[i]);
        free(f);
        static atomic_bool said;
        shim_log_once(&said, LOG_DEBUG, "a fence could not be recorded yet; its blocks wait");
    }
    return ok;
}

/* Removes the oldest fence of a queue, keeping its events for reuse and
 * letting go of its stand-ins. */
static void drop_head(shim_pool *sp, const real_driver *R, fence_queue *q)
{
    fence *f = q->items[q->head];
    q->head = (q->head + 1) % q->cap;
    q->n--;
    for (uint32_t i = 0; i < f->nevents; i++)
        give_event(sp, R, f->ev[i]);
    if (f->nstandins) {
        pthread_mutex_lock(&sp->stand_in_lock);
        stand_in **si = fence_stand_ins(f);
        for (uint32_t i = 0; i < f->nstandins; i++)
            si[i]->refs--;
        pthread_mutex_unlock(&sp->stand_in_lock);
    }
    free(f);
}

bool fences_done(void *ctx, uint32_t lane, uint64_t token, bool wait)
{
    shim_pool *sp = ctx;
    if (atomic_load_explicit(&sp->keep_freed, memory_order_relaxed))
        return false; /* (fences_keep_freed) */
    pools_context_needed(sp);
    const real_driver *R = real_driver_get();
    fence_queue *q = sp->fences[lane];
    /* Fences older than the token asked about cover no block any more (the
     * lane's own stream reused them before they retired): drop them. */
    while (q && q->n && q->items[q->head]->token < token)
        drop_head(sp, R, q);
    if (!q || !q->n || q->items[q->head]->token != token)
        return false;
    fence *f = q->items[q->head];
    /* (fences_sync_blind answers false also when another thread's sync,
     * a trim's, covered the fence meanwhile: look again) */
    if (f->blind && atomic_load(&sp->blind_synced) < f->blind &&
        (!wait || !fences_sync_blind(sp)) && atomic_load(&sp->blind_synced) < f->blind)
        return false;
    /* Queries: the registry's read lock once for all of them, taken before
     * the stand-ins' lock (event_done). Waits take none. */
    bool took = !wait && streams_use_enter();
    bool all = true;
    /* (a completed event stays complete: it is recorded again only once
     * its fence is gone) */
    for (; f->ndone < f->nevents; f->ndone++)
        if (!(all = event_done(R, f->ev[f->ndone], wait)))
            break;
    if (all && f->nstandins) {
        pthread_mutex_lock(&sp->stand_in_lock);
        stand_in **si = fence_stand_ins(f);
        for (uint32_t i = 0; i < f->nstandins && all; i++)
            if (!si[i]->done)
                all = si[i]->done = event_done(R, si[i]->ev, wait);
        pthread_mutex_unlock(&sp->stand_in_lock);
    }
    streams_use_leave(took);
    if (!all)
        return false;
    drop_head(sp, R, q);
    return true;
}
