/*
 * green.c - green contexts (cuGreenCtxCreate): a device's primary context
 * with a share of its SMs, which programs use to run two kinds of work side
 * by side on one GPU. They share the primary context's memory, and that
 * matters to the pool twice:
 *
 *   memory  A green context's converted context (cuCtxFromGreenCtx) has a
 *           handle of its own but the primary context's memory. Allocations
 *           made while it is current come from the primary context's pool
 *           (green_canonical), not from a pool of their own that would take
 *           the whole limit a second time.
 *   fences  A green context's streams are non-blocking (cuGreenCtxStreamCreate
 *           requires it) and belong to the converted context, so neither the
 *           primary context's legacy stream nor its known streams wait for
 *           them, yet their kernels use the primary context's blocks. A plain
 *           free's fence adds one cuGreenCtxRecordEvent per live green
 *           context of the device, which "captures ... all the activities of
 *           the green context" and takes an event of the primary context. A
 *           stream-ordered free on a green context's stream is fenced the
 *           same way: an event of the pool's (primary) context may not be
 *           recorded on that stream (cuEventRecord wants both "from the same
 *           context"), and the green context's whole work covers the
 *           stream's.
 *
 * While a stream of a green context captures, cuGreenCtxRecordEvent fails
 * and invalidates that capture (cuda.h), so no such fence is made then: the
 * seal is refused and tried again at a later allocation, and the blocks
 * wait. Once every capture in the green context has ended, one event covers
 * all its work again, what was queued before the captures included, so its
 * streams need no stand-in when they begin capturing. The captures under way
 * in each green context are counted by the capture hooks (capture.c, which
 * tell green_capture_changed each capture's context): asking
 * the driver would mean making the green context current on the shim's
 * thread, and "a green context can be current to only one thread at a time".
 * For the same reason the shim never makes one current.
 *
 * A stream of a green context that is destroyed gets a stand-in: one
 * cuGreenCtxRecordEvent just before (cuda.h does not say that the green
 * context's later events still cover a destroyed stream's queued work). So
 * does a green context that is destroyed; its streams are dead handles then
 * ("will return CUDA_ERROR_CONTEXT_IS_DESTROYED") and leave the stream
 * registry. A stand-in the driver refuses is replaced by a host wait, and
 * when that fails too the pool keeps its freed blocks (cover).
 */
#include <stdlib.h>

#include "array_room.h"
#include "shim.h"

typedef struct green {
    CUgreenCtx g;
    CUcontext converted; /* cuCtxFromGreenCtx's answer */
    CUcontext primary;   /* its device's primary context, which it retains */
    CUdevice dev;
    int captures; /* under way in its streams */
} green;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static green *all;
static size_t nall, capall;
/* Read without the lock: most processes never make a green context, and
 * then every lookup below returns at once. */
static atomic_size_t live;

static bool none(void) { return atomic_load_explicit(&live, memory_order_acquire) == 0; }

bool green_any(void) { return !none(); }

/* Held across fork (after the captures' lock, which takes it inside), so
 * that a child never inherits it locked. No driver call is made under it. */
void green_lock_for_fork(bool hold)
{
    if (hold)
        pthread_mutex_lock(&lock);
    else
        pthread_mutex_unlock(&lock);
}

void green_created(CUgreenCtx g, CUdevice dev)
{
    const real_driver *R = real_driver_get();
    CUcontext converted = NULL, primary = NULL;
    if (!R || !R->CtxFromGreenCtx || R->CtxFromGreenCtx(&converted, g) != CUDA_SUCCESS ||
        !(primary = real_active_primary(R, dev))) {
        shim_log(LOG_WARN, "a green context could not be looked at: cudaFree may reuse memory "
                           "before its streams are done with it");
        return;
    }
    pthread_mutex_lock(&lock);
    green *t = array_room(all, nall, &capall, sizeof *all, 8);
    if (!t) {
        pthread_mutex_unlock(&lock);
        shim_log(LOG_WARN, "out of host memory tracking green contexts: cudaFree may "
                           "reuse memory before their streams are done with it");
        return;
    }
    all = t;
    all[nall++] = (green){g, converted, primary, dev, 0};
    atomic_store(&live, nall);
    pthread_mutex_unlock(&lock);
}

/* Lock held: the entry of the green context whose converted context is c. */
static green *by_converted(CUcontext c)
{
    for (size_t i = 0; c && i < nall; i++)
        if (all[i].converted == c)
            return &all[i];
    return NULL;
}

/* A copy of that entry, taken under the lock (.g NULL when there is none):
 * for work that records events or waits, which must not hold the lock. */
static green copy_by_converted(CUcontext c)
{
    pthread_mutex_lock(&lock);
    green *e = by_converted(c);
    green copy = e ? *e : (green){0};
    pthread_mutex_unlock(&lock);
    return copy;
}

/* The converted context stream s belongs to (for the special handles, the
 * calling thread's current context), or NULL. Unlike capture_stand_in, no
 * guess from the current context when the driver cannot say: a capture
 * counted against the wrong green context would stop its fences, or let
 * another's be made while it captures. */
static CUcontext context_of(const real_driver *R, CUstream s)
{
    CUcontext c = NULL;
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        R->CtxGetCurrent(&c);
    else if (!R->StreamGetCtx || R->StreamGetCtx(s, &c) != CUDA_SUCCESS)
        c = NULL;
    return c;
}

/* Records a stand-in for green context e's work in its primary context's
 * pool. */
static bool stand_in(const real_driver *R, const green *e)
{
    shim_pool *sp = pool_for_context(e->primary, false);
    if (!sp)
        return true; /* nothing was ever freed there */
    bool pushed = real_ctx_enter(R, sp->ctx);
    bool ok = fences_stand_in_green(sp, e->g);
    real_ctx_leave(R, pushed);
    return ok;
}

/* Covers what green context e's stream s (NULL: the whole green context)
 * queued so far, in e's primary context's pool: a stand-in, unless
 * no_event (the green context captures: an event would break that capture),
 * else a host wait (for s: cuStreamSynchronize; for the whole green context:
 * cuCtxSynchronize of the primary context, which "if the current context is
 * the primary context, green contexts that have been created will also be
 * synchronized", cuda.h; not while any capture is under way, which it would
 * break). When neither can be made, the pool keeps its freed blocks for good
 * (fences_keep_freed): work nothing covers may still use them. */
static void cover(const real_driver *R, const green *e, CUstream s, bool no_event)
{
    shim_pool *sp = pool_for_context(e->primary, false);
    if (!sp)
        return; /* nothing was ever freed there */
    if (!no_event && stand_in(R, e))
        return;
    CUresult r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (s) {
        r = capture_relaxed_stream_wait(R, s);
    } else if (R->CtxSynchronize && capture_none()) {
        bool pushed = real_ctx_enter(R, sp->ctx);
        relaxed_scope rs = capture_relax_always(R);
        r = R->CtxSynchronize();
        capture_restore(R, rs);
        real_ctx_leave(R, pushed);
    }
    if (r != CUDA_SUCCESS)
        fences_keep_freed(sp, r);
}

/* Does s capture (or sit in an invalidated capture)? */
static bool stream_captures(const real_driver *R, CUstream s)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    return R->StreamIsCapturing(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

void green_stream_capturing(CUcontext converted, CUstream s)
{
    const real_driver *R = real_driver_get();
    if (none() || !R)
        return;
    green copy = copy_by_converted(converted);
    if (!copy.g)
        return;
    /* The capture about to begin is counted already (capture.c's
     * before_begin_as), and s does not capture yet. While another of its
     * streams captures, no event can be recorded on the green context (it
     * would invalidate that capture): the green context's fences wait for
     * the end, and that capture's stand-in covers what came before it; what
     * s queued since then only a later event of the green context covers,
     * and not if s is destroyed before it (the header). Once s captures the
     * driver refuses to wait for it (the programming guide: "It is invalid
     * to synchronize ... a stream which is being captured"), so the host
     * waits for that work now: rare, two streams of one green context in
     * captures at once. */
    cover(R, &copy, s, copy.captures > 1);
}

bool green_stream_destroyed(CUstream s)
{
    const real_driver *R = real_driver_get();
    if (none() || !R)
        return false;
    green copy = copy_by_converted(context_of(R, s));
    if (!copy.g)
        return false;
    /* While the green context captures no event covers it: wait for the
     * stream instead (rare: a stream destroyed during another's capture).
     * A stream destroyed in its own capture needs neither, and could not
     * be waited for (green_stream_capturing): its work from before its
     * begin was covered then, by a stand-in or a wait, and what it captured
     * never runs. */
    if (copy.captures > 0 && stream_captures(R, s))
        return true;
    cover(R, &copy, s, copy.captures > 0);
    return true;
}

int green_destroying(CUgreenCtx g, CUcontext *converted)
{
    *converted = NULL;
    if (none())
        return -1;
    green found = {0};
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nall; i++)
        if (all[i].g == g) {
            found = all[i];
            all[i] = all[--nall];
            break;
        }
    atomic_store(&live, nall);
    pthread_mutex_unlock(&lock);
    const real_driver *R = real_driver_get();
    if (!found.g || !R)
        return -1;
    *converted = found.converted;
    /* (While it captures, the event would fail and break the capture, and
     * so would the host wait.) */
    if (found.captures > 0)
        shim_log(LOG_WARN, "a green context was destroyed while its work could not be "
                           "fenced: blocks it used may be reused early");
    else
        cover(R, &found, NULL, false);
    streams_forget_context(found.converted);
    return found.dev;
}

void green_capture_changed(CUcontext c, int by)
{
    if (none() || !c)
        return;
    pthread_mutex_lock(&lock);
    green *e = by_converted(c);
    if (e)
        e->captures = e->captures + by > 0 ? e->captures + by : 0;
    pthread_mutex_unlock(&lock);
}

CUcontext green_canonical(CUcontext ctx)
{
    if (!ctx || none())
        return ctx;
    pthread_mutex_lock(&lock);
    green *e = by_converted(ctx);
    CUcontext out = e ? e->primary : ctx;
    pthread_mutex_unlock(&lock);
    return out;
}

bool green_converted(CUcontext ctx)
{
    return green_canonical(ctx) != ctx;
}

bool green_is_current(void)
{
    const real_driver *R = real_driver_get();
    CUcontext cur = NULL;
    if (none() || !R || R->CtxGetCurrent(&cur) != CUDA_SUCCESS)
        return false;
    return green_converted(cur);
}

int green_fence_targets(const real_driver *R, const shim_pool *sp, bool plain, CUstream own,
                        CUgreenCtx **out)
{
    *out = NULL;
    if (none() || !R->GreenCtxRecordEvent)
        return 0;
    CUcontext of_own = NULL;
    if (!plain) {
        /* A stream lane: only an explicit stream can be a green context's
         * (the special handles' lanes never hold a green context's frees:
         * pool_lane_for_free sends those to the plain lane). */
        if (own == NULL || own == CU_STREAM_LEGACY || own == CU_STREAM_PER_THREAD ||
            !(of_own = context_of(R, own)))
            return 0;
    } else if (!sp->primary) {
        return 0; /* green contexts share only the primary context's memory */
    }
    pthread_mutex_lock(&lock);
    CUgreenCtx *g = malloc(nall * sizeof *g);
    int k = g ? 0 : -1;
    for (size_t i = 0; g && i < nall && k >= 0; i++) {
        if (plain ? all[i].dev != sp->dev : all[i].converted != of_own)
            continue;
        if (all[i].captures > 0)
            k = -1;
        else
            g[k++] = all[i].g;
    }
    pthread_mutex_unlock(&lock);
    if (k <= 0)
        free(g);
    else
        *out = g;
    return k;
}
