/*
 * capture.c - CUDA graph capture, as the pools must see it.
 *
 * Two rules (docs/design.md, "Fences"):
 *
 *   Before a stream begins capturing, a stand-in event is recorded on it,
 *   and on the legacy stream too when the stream is blocking (a per-thread
 *   default stream is): while the capture lasts no event can be recorded on
 *   the stream (the legacy stream is unusable), yet work queued before the
 *   capture still runs and may still read blocks freed before or during it.
 *   Plain-free fences wait for stand-ins (fences.c).
 *
 *   The shim makes its own "potentially unsafe" calls (fence event queries,
 *   host waits for events, streams and contexts, the refused allocation
 *   that sets the runtime's error, regions taken and given back) with the calling thread in
 *   CU_STREAM_CAPTURE_MODE_RELAXED whenever a capture may be under way. In
 *   the default global mode, another thread's global-mode capture makes the
 *   driver refuse them (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and invalidate
 *   that capture (cuThreadExchangeStreamCaptureMode's rules). The count of
 *   captures under way comes from the begin/end calls below.
 *
 *   Event queries are the frequent calls (an allocation may ask about a
 *   fence): capture_relax leaves the mode alone while the count is 0 and
 *   every begin is counted (two driver calls saved per query). Where begins
 *   can go unseen (loaded as a plug-in, or the driver door closed) the
 *   count says nothing, and every query is relaxed (e2e_plugin
 *   query-during-capture: a plug-in's query in global mode invalidated the
 *   program's capture). The query is made with the streams
 *   registry's lock held, from that read of the count to its answer (the
 *   read lock, or the write lock of the begin that records a stand-in).
 *   A begin is counted under the write lock, so no capture can begin in
 *   between. Were the count read without the lock, another thread could
 *   begin a global-mode capture after the 0 was read and before the query
 *   reached the driver, and the query would invalidate it (e2e_fences
 *   query-vs-begin). A pool's stand-in lock comes after the registry's
 *   (fences.c), as in before_begin, since the stand-in sweeps query too.
 *   Host waits, the refused allocation and regions are rare, and a wait may block
 *   for long under no lock a begin should wait for: they are always made in
 *   relaxed mode (capture_relax_always), whatever the count.
 *
 *   The same count saves the capture questions themselves (is this stream,
 *   is a blocking stream, capturing?) while it is 0 and every way to begin
 *   a capture is seen (capture_none): preloaded, with the driver door
 *   hooked, every begin passes here, the v1 cuStreamBeginCapture of old
 *   binaries included. A begin is counted before the real call and under
 *   the streams' write lock (before_begin), so that a seal or query holding
 *   the read lock, or a call the program orders after the begin, never
 *   finds 0 while the capture is under way; a begin that fails is taken
 *   back.
 *
 *   The count is of captures with an identity: each is an entry naming the
 *   stream it was begun on (a per-thread default stream by its thread and
 *   context), and only a call that ends that entry's capture takes it away.
 *   A bare number went down at any end the driver accepted, so an end of a
 *   capture the shim never counted (begun where it could not see, say by a
 *   library preloaded after it through the driver's own function) took away
 *   another thread's, and the next fence query, made in global mode,
 *   invalidated that live capture (e2e_fences unseen-end). What ends a
 *   capture, in cuda.h and in the fake driver:
 *     - cuStreamEndCapture answering CUDA_SUCCESS, or
 *       CUDA_ERROR_STREAM_CAPTURE_INVALIDATED or _UNJOINED (the capture is
 *       over, its graph lost); any other answer (not capturing, another
 *       thread's capture, a bad argument) leaves every capture as it was, so
 *       a stray end or a second end changes nothing (e2e_fences bogus-end);
 *     - a successful cuStreamDestroy (either version) of the capturing
 *       stream: the stream and its capture are gone. Counted on, that
 *       capture refused a green context's fences for good (e2e_green
 *       green-capture-destroyed) and kept every capture question asked;
 *     - the end of the stream's context (cuCtxDestroy, a primary context's
 *       reset or last release, a green context destroyed: capture_context_*).
 *   An invalidated capture (legacy-stream work, a refused unsafe call) is
 *   still under way until it is ended, and stays counted. A capture on a
 *   per-thread default stream whose thread exits, or one ended where the
 *   shim cannot see, stays counted: more questions asked, never fewer.
 *   An ending call first claims its entry (marks it), then makes the real
 *   call, then removes the entry if the capture ended, or gives it back:
 *   a begin on the same stream once the real end returned adds an entry of
 *   its own, which that removal cannot take, and a second end finds the
 *   entry claimed and takes nothing.
 *
 * Both doors have the calls: the driver's (reached by cudart through
 * cuGetProcAddress, and by programs through dlsym) do the work; the
 * runtime's do it only when the driver door is not hooked
 * (BFCSHIM_DRIVER_HOOKS=0), else cudart's own driver call would do it twice.
 */
#include "array_room.h"
#include "shim.h"

/* A capture the hooks saw begin and have not seen end. */
typedef struct counted {
    CUstream s;       /* as the begin named it; CU_STREAM_PER_THREAD: the thread's */
    pthread_t thread; /* (a per-thread default stream's) */
    CUcontext ctx;    /* the stream's context, NULL when the driver could not say */
    uint64_t mark;    /* 0, BEGINNING, or the claim of a call ending the stream's */
    uint64_t ctx_mark; /* 0, or the claim of a call that may end the context */
    uint64_t seq;     /* the capture sequence's id (cuStreamGetCaptureInfo), 0: unknown */
    bool fork;        /* joined another stream's capture by a wait (forks below) */
} counted;

enum { BEGINNING = 1 }; /* a begin in flight: no ending call may claim it */

/* Leaf lock but for the green contexts' (green_capture_changed). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static counted *table;
static size_t ntable, captable;
static uint64_t last_mark = BEGINNING;
/* ntable, for reads without the lock */
static atomic_int underway;
/* A begin found no host memory for its entry: from then on the count is
 * not every capture, and is trusted no more. */
static atomic_bool untracked;

bool capture_underway(void)
{
    return atomic_load_explicit(&underway, memory_order_relaxed) > 0;
}

/* Does every capture begin pass the hooks below, so that the count is
 * every capture under way? Preloaded with the driver door hooked. */
static bool begins_counted(void)
{
    return shim_driver_hooked() && streams_all_seen() &&
           !atomic_load_explicit(&untracked, memory_order_relaxed);
}

bool capture_none(void)
{
    return atomic_load_explicit(&underway, memory_order_acquire) == 0 && begins_counted();
}

/* The key a capture call names: its stream, and for the calling thread's
 * per-thread default stream the thread and the current context. */
typedef struct capture_key {
    CUstream s;
    pthread_t thread;
    CUcontext ctx;
} capture_key;

/* The context of stream s (for the special handles, the calling thread's
 * current context), or NULL when the driver cannot say: no guess, since a
 * capture counted against the wrong green context would stop its fences or
 * let another's be made while it captures (green.c). */
static CUcontext context_of(const real_driver *R, CUstream s)
{
    CUcontext c = NULL;
    if (!R)
        return NULL;
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        R->CtxGetCurrent(&c);
    else if (!R->StreamGetCtx || R->StreamGetCtx(s, &c) != CUDA_SUCCESS)
        c = NULL;
    return c;
}

/* The key for stream s as a call names it (after named()); ctx only for
 * the per-thread default stream, the one handle that names a different
 * stream in each thread and context. */
static capture_key key_of(CUstream s)
{
    capture_key k = {s, pthread_self(), NULL};
    if (s == CU_STREAM_PER_THREAD)
        k.ctx = context_of(real_driver_get(), s);
    return k;
}

/* Lock held: is e the capture on k's stream? */
static bool same_stream(const counted *e, const capture_key *k)
{
    return e->s == k->s && (k->s != CU_STREAM_PER_THREAD ||
                            (pthread_equal(e->thread, k->thread) && e->ctx == k->ctx));
}

/* Lock held: drops entry i, and its count in its green context. */
static void drop(size_t i)
{
    green_capture_changed(table[i].ctx, -1);
    table[i] = table[--ntable];
    atomic_store_explicit(&underway, (int)ntable, memory_order_release);
}

/* Counts a begin on k's stream before the real call (the streams' write
 * lock held, before_begin) with an entry marked BEGINNING. Without room for
 * one, nothing is trusted to the count again. */
static void count_begin(const capture_key *k, CUcontext ctx, bool fork)
{
    pthread_mutex_lock(&lock);
    counted *t = array_room(table, ntable, &captable, sizeof *table, 8);
    if (t) {
        table = t;
        table[ntable++] = (counted){k->s, k->thread, ctx, BEGINNING, 0, 0, fork};
        atomic_store_explicit(&underway, (int)ntable, memory_order_release);
        green_capture_changed(ctx, +1);
    }
    pthread_mutex_unlock(&lock);
    if (!t) {
        atomic_store(&untracked, true);
        shim_log(LOG_WARN, "out of host memory counting stream captures: every fence query "
                           "is made in relaxed capture mode from now on");
    }
}

bool capture_begun_on(CUstream s)
{
    if (s == CU_STREAM_PER_THREAD || atomic_load(&untracked))
        return false;
    bool found = false;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < ntable && !found; i++)
        found = table[i].s == s;
    pthread_mutex_unlock(&lock);
    return found;
}

static void drop_forks_of(uint64_t seq);

/* After the real begin (the streams' write lock held): a begin that failed
 * is taken back; one that succeeded is counted, with its sequence's id
 * (seq), and any older entry on the same stream was a capture that ended
 * where the shim could not see (a stream captures once at a time), unless
 * an ending call has claimed it and will settle it: that entry goes, and
 * the forks of its capture with it (else a per-thread fork of it, which no
 * other thread can ask about, stayed counted for good: e2e_fences
 * ptsz-fork-unseen-end, found by an audit). */
static void begin_done(const capture_key *k, bool ok, uint64_t seq)
{
    enum { FEW = 8 }; /* superseded captures whose forks go; more stay counted */
    uint64_t over[FEW];
    size_t nover = 0;
    pthread_mutex_lock(&lock);
    size_t mine = ntable;
    for (size_t i = 0; i < ntable && mine == ntable; i++)
        if (table[i].mark == BEGINNING && same_stream(&table[i], k))
            mine = i;
    if (mine < ntable && !ok) {
        drop(mine);
    } else if (mine < ntable) {
        table[mine].mark = 0;
        table[mine].seq = seq;
        for (size_t i = 0; i < ntable;)
            if (i != mine && table[i].mark == 0 && same_stream(&table[i], k)) {
                /* (not this capture's own id: a wait racing a begin on the
                 * same stream may supersede the begun entry with its fork) */
                if (!table[i].fork && table[i].seq && table[i].seq != seq && nover < FEW)
                    over[nover++] = table[i].seq;
                drop(i);
                if (mine == ntable) /* it moved into slot i */
                    mine = i;
            } else {
                i++;
            }
    }
    for (size_t j = 0; j < nover; j++)
        drop_forks_of(over[j]);
    pthread_mutex_unlock(&lock);
}

/* Claims what an ending call may end: the capture on k's stream (when k),
 * or those of context ctx (when !k), none in a begin or claimed by a call
 * of the same kind already. A stream's entry may be claimed by both kinds
 * at once: a context's claim must not keep a stream's end from taking it.
 * Returns the claim (0: nothing claimed). */
static uint64_t claim(const capture_key *k, CUcontext ctx)
{
    uint64_t m = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < ntable; i++) {
        counted *e = &table[i];
        uint64_t *field = k ? &e->mark : &e->ctx_mark;
        if (e->mark == BEGINNING || *field != 0 || (k ? !same_stream(e, k) : e->ctx != ctx))
            continue;
        if (!m)
            m = ++last_mark;
        *field = m;
    }
    pthread_mutex_unlock(&lock);
    return m;
}

static void askable_forks_ended(const real_driver *R);

/* Lock held: the forks of capture sequence seq go (it is over). */
static void drop_forks_of(uint64_t seq)
{
    for (size_t i = 0; i < ntable;)
        if (table[i].fork && table[i].seq == seq)
            drop(i); /* slot i holds the last entry now */
        else
            i++;
}

/* After a call that ended captures: what it claimed (m) goes, and with each
 * capture its forks, found by the sequence's id (the capture's end, its
 * origin's destruction, its context's end all end them); so do the forks
 * of sequence seq (an end that claimed nothing: a capture the hooks did not
 * see begin). Without this a destroyed origin left its forks counted, and a
 * green fork's context refused its fences until some later end (e2e_green
 * green-fork-origin-destroyed). Under the streams' write lock, as begins
 * and forks are counted, so that no fork is in flight here: a wait either
 * counted its fork, with its id, before, or joins nothing (the capture is
 * over) after. */
static void captures_ended(uint64_t m, uint64_t seq)
{
    streams_change_begin();
    pthread_mutex_lock(&lock);
    for (size_t i = 0; m && i < ntable;) {
        counted *e = &table[i];
        if (e->mark != m && e->ctx_mark != m) {
            i++;
            continue;
        }
        const uint64_t its = e->fork ? 0 : e->seq;
        drop(i);
        if (its) {
            drop_forks_of(its);
            i = 0; /* entries moved */
        }
    }
    if (seq)
        drop_forks_of(seq);
    pthread_mutex_unlock(&lock);
    const real_driver *R = real_driver_get();
    if (R)
        askable_forks_ended(R);
    streams_change_end();
}

/* After the ending call: what it claimed goes if the captures ended, else
 * it is given back. */
void capture_ending_done(uint64_t m, bool ended)
{
    if (!m)
        return;
    if (ended) {
        captures_ended(m, 0);
        return;
    }
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < ntable; i++) {
        counted *e = &table[i];
        e->mark = e->mark == m ? 0 : e->mark;
        e->ctx_mark = e->ctx_mark == m ? 0 : e->ctx_mark;
    }
    pthread_mutex_unlock(&lock);
}

uint64_t capture_stream_ending(CUstream s)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return 0; /* never destroyed */
    capture_key k = {s, pthread_self(), NULL};
    return claim(&k, NULL);
}

uint64_t capture_context_ending(CUcontext ctx)
{
    return ctx ? claim(NULL, ctx) : 0;
}

relaxed_scope capture_relax(const real_driver *R)
{
    relaxed_scope rs = {false, CU_STREAM_CAPTURE_MODE_GLOBAL};
    if ((atomic_load_explicit(&underway, memory_order_relaxed) > 0 || !begins_counted()) &&
        R->ThreadExchangeStreamCaptureMode) {
        rs.old = CU_STREAM_CAPTURE_MODE_RELAXED;
        rs.changed = R->ThreadExchangeStreamCaptureMode(&rs.old) == CUDA_SUCCESS;
    }
    return rs;
}

relaxed_scope capture_relax_always(const real_driver *R)
{
    relaxed_scope rs = {false, CU_STREAM_CAPTURE_MODE_RELAXED};
    if (R->ThreadExchangeStreamCaptureMode)
        rs.changed = R->ThreadExchangeStreamCaptureMode(&rs.old) == CUDA_SUCCESS;
    return rs;
}

void capture_restore(const real_driver *R, relaxed_scope rs)
{
    if (rs.changed)
        R->ThreadExchangeStreamCaptureMode(&rs.old);
}

CUresult capture_relaxed_stream_wait(const real_driver *R, CUstream s)
{
    if (!R->StreamSynchronize)
        return CUDA_ERROR_NOT_SUPPORTED;
    relaxed_scope rs = capture_relax_always(R);
    CUresult r = R->StreamSynchronize(s);
    capture_restore(R, rs);
    return r;
}

CUresult capture_legacy_use(const real_driver *R)
{
    if (!R)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUevent e = NULL;
    CUresult r = R->EventCreate(&e, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS)
        return r;
    r = R->EventRecord(e, CU_STREAM_LEGACY);
    R->EventDestroy(e);
    return r;
}

/* Can the driver name a capture (cuStreamGetCaptureInfo)? */
static bool identities_known(const real_driver *R)
{
    return R->StreamGetCaptureInfoV3 || R->StreamGetCaptureInfoV1;
}

/* Is the driver's answer for s (st) known, and while s's capture is active,
 * which sequence is it (*seq; else 0: cuda.h promises an id only for an
 * active capture, and an old driver may have no cuStreamGetCaptureInfo)?
 * A per-thread default stream is asked about on its own thread only. */
static bool capture_state(const real_driver *R, CUstream s, CUstreamCaptureStatus *st,
                          uint64_t *seq)
{
    cuuint64_t id = 0;
    CUresult r;
    *st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (R->StreamGetCaptureInfoV3)
        r = R->StreamGetCaptureInfoV3(s, st, &id, NULL, NULL, NULL, NULL);
    else if (R->StreamGetCaptureInfoV1)
        r = R->StreamGetCaptureInfoV1(s, st, &id);
    else
        r = R->StreamIsCapturing(s, st);
    *seq = r == CUDA_SUCCESS && *st == CU_STREAM_CAPTURE_STATUS_ACTIVE ? (uint64_t)id : 0;
    return r == CUDA_SUCCESS;
}

/* The stream a capture call names: stream 0 of a _ptsz call is the calling
 * thread's per-thread default stream. */
static CUstream named(CUstream s, int z)
{
    return s == NULL && z ? CU_STREAM_PER_THREAD : s;
}

/* Records the stand-ins for a stream about to stop taking events (it begins
 * capturing, or it is being destroyed). legacy_too: also one on the legacy
 * stream, which a blocking stream's capture makes unusable. */
void capture_stand_in(CUstream s, bool legacy_too)
{
    const real_driver *R = real_driver_get();
    if (!R || !shim_active())
        return;
    CUcontext ctx = NULL;
    if (s == CU_STREAM_PER_THREAD || s == NULL || s == CU_STREAM_LEGACY ||
        !R->StreamGetCtx || R->StreamGetCtx(s, &ctx) != CUDA_SUCCESS)
        R->CtxGetCurrent(&ctx);
    /* A green context's stream needs none here (before_begin_as records its
     * green context's), and making its context current here would make it
     * current to two threads. */
    if (green_converted(ctx))
        return;
    /* No pool in the stream's context: nothing has been freed there. */
    shim_pool *sp = ctx ? pool_for_context(ctx, false) : NULL;
    if (!sp)
        return;
    bool pushed = real_ctx_enter(R, ctx);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    /* A stream that already captures has had its stand-in (its work since
     * is a graph's, and an event on it would be a captured one). When the
     * driver cannot say, a stand-in all the same: captured, it never
     * completes and the plain lane's blocks wait (memory, not safety). */
    CUresult r = R->StreamIsCapturing(s, &st);
    if (r != CUDA_SUCCESS || st == CU_STREAM_CAPTURE_STATUS_NONE)
        fences_stand_in(sp, s, r != CUDA_SUCCESS);
    /* (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: a blocking stream captures, and
     * its stand-in covered the legacy stream's work then) */
    if (legacy_too) {
        r = R->StreamIsCapturing(CU_STREAM_LEGACY, &st);
        if (r != CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
            fences_stand_in(sp, CU_STREAM_LEGACY, r != CUDA_SUCCESS);
    }
    real_ctx_leave(R, pushed);
}

/* Is s a blocking stream (one the legacy stream synchronises with)? */
static bool blocking_stream(const real_driver *R, CUstream s)
{
    if (s == CU_STREAM_PER_THREAD)
        return true;
    unsigned flags = 0;
    return R->StreamGetFlags && R->StreamGetFlags(s, &flags) == CUDA_SUCCESS &&
           !(flags & CU_STREAM_NON_BLOCKING);
}

/* Every capture begins between before_begin and began, the streams' change
 * lock held (streams.c): no seal may ask whether s captures before the
 * begin and record its event on s after it (the event would be a captured
 * one, which never completes). The begin is counted first (the header). */
static capture_key before_begin_as(CUstream s, bool fork)
{
    streams_change_begin();
    const real_driver *R = real_driver_get();
    capture_key k = key_of(s);
    CUcontext ctx = k.s == CU_STREAM_PER_THREAD ? k.ctx : context_of(R, s);
    count_begin(&k, ctx, fork);
    if (ctx && green_converted(ctx))
        green_stream_capturing(ctx, s);
    if (R)
        capture_stand_in(s, blocking_stream(R, s));
    return k;
}

static capture_key before_begin(CUstream s) { return before_begin_as(s, false); }

/* After a begin (r): counted with its sequence's id, which the driver gives
 * while the capture is active (one question per begin, a rare call). */
static CUresult began(CUresult r, const capture_key *k)
{
    const real_driver *R = real_driver_get();
    CUstreamCaptureStatus st;
    uint64_t seq = 0;
    if (r == CUDA_SUCCESS && R)
        capture_state(R, k->s, &st, &seq);
    begin_done(k, r == CUDA_SUCCESS, seq);
    streams_change_end();
    return r;
}

/* Around an EndCapture: the capture it may end is claimed before the real
 * call, and its sequence's id learnt (forks of a capture the hooks did not
 * see begin are counted all the same, and go with it). It ended when the
 * call succeeds or reports it invalidated or unjoined; other answers (not
 * capturing, wrong thread, a bad argument) leave it on. */
typedef struct ending {
    uint64_t claimed, seq;
} ending;

static ending before_end(CUstream s)
{
    capture_key k = key_of(s);
    ending e = {claim(&k, NULL), 0};
    const real_driver *R = real_driver_get();
    CUstreamCaptureStatus st;
    if (R && !capture_none())
        capture_state(R, s, &st, &e.seq);
    return e;
}

static void ended(int r, ending e)
{
    const bool over = r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||
                      r == CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
    if (over && (e.claimed || !capture_none()))
        captures_ended(e.claimed, e.seq);
    else
        capture_ending_done(e.claimed, false);
}

/*
 * Forks. A stream joins a capture without a begin when it waits on an event
 * recorded in it: "when a captured event is waited on by a stream, it
 * places the stream in capture mode" (the programming guide's cross-stream
 * dependencies; multi-stream graph capture and NCCL do it). Its work queued
 * before the wait still runs and may read blocks freed plainly, and from the
 * wait on no event can be recorded on it: exactly a begin's situation. So
 * while a capture may be under way, a wait on a stream that is not
 * capturing (an explicit one, or the calling thread's per-thread default
 * stream) is made like a begin (before_begin_as: the streams' write lock,
 * an entry, a stand-in on the stream), and the entry stays only if the
 * stream captures after it (the event was a captured one). Seals then skip
 * the fork, its stand-in covering its earlier work (capture_begun_on), its
 * green context knows it captures, a blocking fork's capture keeps seals
 * off the legacy stream (they look under the streams' read lock, which the
 * wait's write lock excludes: e2e_fences ptsz-fork-vs-seal), and its
 * destruction or its context's end takes it away as a begun capture's.
 *
 * Its capture ends with the origin's, which the hooks see only as the
 * origin's end (or destruction, or its context's end): a fork is counted
 * with its capture sequence's id (cuStreamGetCaptureInfo, asked after the
 * wait, one question per fork), and every ending of that sequence takes it
 * away (captures_ended), on whichever thread. A per-thread default stream
 * could not be asked about from another thread, so before ids these forks
 * were not counted at all, and a seal broke their captures (e2e_green
 * green-ptsz-fork, e2e_fences ptsz-fork-vs-seal). A fork with no id (a
 * driver without cuStreamGetCaptureInfo, or a capture already invalidated
 * when the stream joined it, whose id cuda.h does not promise) is asked
 * about after each end instead, as is every explicit stream's fork (one
 * whose capture ended unseen) and the ending thread's own per-thread
 * stream's (askable_forks_ended); a per-thread default stream is counted
 * only where ids are known; another thread's that the shim cannot match
 * to an ending (it joined an invalidated capture, or one begun unseen and
 * invalidated before its end) stays counted until that thread ends a
 * capture or captures on it again (more questions asked, never fewer). A
 * capture whose entry a later begin on its stream supersedes (it ended
 * unseen) takes its forks with it (begin_done). With no capture under way (capture_none)
 * a wait costs one atomic load here.
 */
/* Lock-free: may a wait make s join a capture (a capture may be under way,
 * s is a stream that can be counted, and it does not capture yet)? */
static bool may_fork(const real_driver *R, CUstream s)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    return !capture_none() && R && s != NULL && s != CU_STREAM_LEGACY &&
           (s != CU_STREAM_PER_THREAD || identities_known(R)) &&
           R->StreamIsCapturing(s, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE;
}

/* After the wait: the entry stays, with its sequence's id, if s captures
 * now. */
static void waited(const real_driver *R, CUstream s, const capture_key *k)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    uint64_t seq = 0;
    const bool forked = capture_state(R, s, &st, &seq) && st != CU_STREAM_CAPTURE_STATUS_NONE;
    begin_done(k, forked, seq);
    streams_change_end();
}

/* The streams' write lock held: the forks that no longer capture and can be
 * asked about are taken away: explicit streams' (those without an id, and
 * any whose capture ended where the hooks could not see), and the calling
 * thread's own per-thread default stream's in its current context (one
 * that joined a capture the hooks did not see begin, which was invalidated
 * before its end: that end learns no id; e2e_fences
 * ptsz-fork-unseen-begin-invalidated, found by an audit). Another
 * thread's per-thread fork goes only with its capture's id, or that
 * thread's later capture on it: no other thread can ask the driver about
 * it. The driver is asked outside the table's lock. */
static void askable_forks_ended(const real_driver *R)
{
    const pthread_t self = pthread_self();
    CUcontext cur = NULL; /* (one question per ending: a rare call) */
    if (R->CtxGetCurrent(&cur) != CUDA_SUCCESS)
        cur = NULL;
    for (size_t i = 0;; i++) {
        pthread_mutex_lock(&lock);
        for (; i < ntable; i++) {
            const counted *e = &table[i];
            if (e->fork && e->mark == 0 &&
                (e->s != CU_STREAM_PER_THREAD ||
                 (cur && e->ctx == cur && pthread_equal(e->thread, self))))
                break;
        }
        const bool found = i < ntable;
        const counted seen = found ? table[i] : (counted){0};
        pthread_mutex_unlock(&lock);
        if (!found)
            break;
        CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
        if (R->StreamIsCapturing(seen.s, &st) == CUDA_SUCCESS &&
            st != CU_STREAM_CAPTURE_STATUS_NONE)
            continue;
        pthread_mutex_lock(&lock);
        const counted *e = i < ntable ? &table[i] : NULL;
        if (e && e->fork && e->mark == 0 && e->s == seen.s && pthread_equal(e->thread, seen.thread) &&
            e->ctx == seen.ctx)
            drop(i--); /* slot i holds the last entry now */
        pthread_mutex_unlock(&lock);
    }
}

/* Held across fork, so that a child that keeps the shim never inherits the
 * table locked by a thread it does not have (the streams' use lock, which
 * covered begins, is not held across fork: streams.c). No driver call is
 * made under it. */
void capture_lock_for_fork(bool hold)
{
    if (hold)
        pthread_mutex_lock(&lock);
    else
        pthread_mutex_unlock(&lock);
}

/* ---- driver door ------------------------------------------------------------------ */

static CUresult begin(int z, CUstream s, CUstreamCaptureMode mode)
{
    CUresult (*f)(CUstream, CUstreamCaptureMode) = REAL(StreamBeginCapture[z]);
    if (!f)
        return CUDA_ERROR_NOT_INITIALIZED;
    capture_key k = before_begin(named(s, z));
    return began(f(s, mode), &k);
}

static CUresult begin_to_graph(int z, CUstream s, CUgraph g, const CUgraphNode *deps,
                               const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode)
{
    CUresult (*f)(CUstream, CUgraph, const CUgraphNode *, const CUgraphEdgeData *, size_t,
                  CUstreamCaptureMode) = REAL(StreamBeginCaptureToGraph[z]);
    if (!f)
        return CUDA_ERROR_NOT_INITIALIZED;
    capture_key k = before_begin(named(s, z));
    return began(f(s, g, deps, edges, n, mode), &k);
}

static CUresult end(int z, CUstream s, CUgraph *g)
{
    CUresult (*f)(CUstream, CUgraph *) = REAL(StreamEndCapture[z]);
    if (!f)
        return CUDA_ERROR_NOT_INITIALIZED;
    ending e = before_end(named(s, z));
    CUresult r = f(s, g);
    ended(r, e);
    return r;
}

SHIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
    return begin(0, s, mode);
}

/* The v1 begin (CUDA 10.0's, no mode: global), which cuda.h now maps to
 * _v2 but libcuda still exports for old binaries and hands out to
 * cuGetProcAddress for versions before 10.1 (names in shim.h). */
static CUresult begin_v1(int z, CUstream s)
{
    CUresult (*f)(CUstream) = REAL(StreamBeginCaptureV1[z]);
    if (!f)
        return CUDA_ERROR_NOT_INITIALIZED;
    capture_key k = before_begin(named(s, z));
    return began(f(s), &k);
}

SHIM_EXPORT CUresult shim_cuStreamBeginCapture_v1(CUstream s) { return begin_v1(0, s); }
SHIM_EXPORT CUresult shim_cuStreamBeginCapture_v1_ptsz(CUstream s) { return begin_v1(1, s); }

SHIM_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode)
{
    return begin(1, s, mode);
}

SHIM_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                 const CUgraphEdgeData *edges, size_t n,
                                                 CUstreamCaptureMode mode)
{
    return begin_to_graph(0, s, g, deps, edges, n, mode);
}

SHIM_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g,
                                                      const CUgraphNode *deps,
                                                      const CUgraphEdgeData *edges, size_t n,
                                                      CUstreamCaptureMode mode)
{
    return begin_to_graph(1, s, g, deps, edges, n, mode);
}

static CUresult wait_event(int z, CUstream s, CUevent e, unsigned flags)
{
    const real_driver *R = real_driver_get();
    CUresult (*f)(CUstream, CUevent, unsigned) =
        !R ? NULL : z ? R->StreamWaitEventPtsz : R->StreamWaitEvent;
    if (!f)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUstream n = named(s, z);
    if (!may_fork(R, n))
        return f(s, e, flags);
    capture_key k = before_begin_as(n, true);
    CUresult r = f(s, e, flags);
    waited(R, n, &k);
    return r;
}

SHIM_EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags)
{
    return wait_event(0, s, e, flags);
}

SHIM_EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned flags)
{
    return wait_event(1, s, e, flags);
}

SHIM_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { return end(0, s, g); }

SHIM_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) { return end(1, s, g); }

/* ---- runtime door ----------------------------------------------------------------- */

typedef cudaError_t (*rt_begin_fn)(cudaStream_t, enum cudaStreamCaptureMode);
typedef cudaError_t (*rt_begin_to_graph_fn)(cudaStream_t, cudaGraph_t, const cudaGraphNode_t *,
                                            const cudaGraphEdgeData *, size_t,
                                            enum cudaStreamCaptureMode);
typedef cudaError_t (*rt_end_fn)(cudaStream_t, cudaGraph_t *);

/* With the driver door hooked, cudart's own driver calls (above) do the
 * work; otherwise the runtime calls must. */
static bool runtime_does_it(void) { return !shim_driver_hooked(); }

/* The runtime's begin and end: stand-ins and counting only when the driver
 * door does not see cudart's own driver call. (The runtime's capture error
 * codes have the driver's numbers.) */
static cudaError_t rt_begin(rt_begin_fn f, cudaStream_t s, enum cudaStreamCaptureMode mode,
                            int z)
{
    if (!f)
        return cudaErrorInsufficientDriver;
    if (!runtime_does_it())
        return f(s, mode);
    capture_key k = before_begin(named((CUstream)s, z));
    return (cudaError_t)began((CUresult)f(s, mode), &k);
}

static cudaError_t rt_begin_to_graph(rt_begin_to_graph_fn f, cudaStream_t s, cudaGraph_t g,
                                     const cudaGraphNode_t *deps,
                                     const cudaGraphEdgeData *edges, size_t n,
                                     enum cudaStreamCaptureMode mode, int z)
{
    if (!f)
        return cudaErrorInsufficientDriver;
    if (!runtime_does_it())
        return f(s, g, deps, edges, n, mode);
    capture_key k = before_begin(named((CUstream)s, z));
    return (cudaError_t)began((CUresult)f(s, g, deps, edges, n, mode), &k);
}

static cudaError_t rt_end(rt_end_fn f, cudaStream_t s, cudaGraph_t *g, int z)
{
    if (!f)
        return cudaErrorInsufficientDriver;
    if (!runtime_does_it())
        return f(s, g);
    ending en = before_end(named((CUstream)s, z));
    cudaError_t e = f(s, g);
    ended((int)e, en);
    return e;
}

SHIM_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    REAL_RT(rt_begin_fn, f, "cudaStreamBeginCapture");
    return rt_begin(f, s, mode, 0);
}

SHIM_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s,
                                                    enum cudaStreamCaptureMode mode)
{
    REAL_RT(rt_begin_fn, f, "cudaStreamBeginCapture_ptsz");
    return rt_begin(f, s, mode, 1);
}

SHIM_EXPORT cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t s, cudaGraph_t g,
                                                      const cudaGraphNode_t *deps,
                                                      const cudaGraphEdgeData *edges, size_t n,
                                                      enum cudaStreamCaptureMode mode)
{
    REAL_RT(rt_begin_to_graph_fn, f, "cudaStreamBeginCaptureToGraph");
    return rt_begin_to_graph(f, s, g, deps, edges, n, mode, 0);
}

SHIM_EXPORT cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t s, cudaGraph_t g,
                                                           const cudaGraphNode_t *deps,
                                                           const cudaGraphEdgeData *edges,
                                                           size_t n,
                                                           enum cudaStreamCaptureMode mode)
{
    REAL_RT(rt_begin_to_graph_fn, f, "cudaStreamBeginCaptureToGraph_ptsz");
    return rt_begin_to_graph(f, s, g, deps, edges, n, mode, 1);
}

typedef cudaError_t (*rt_wait_fn)(cudaStream_t, cudaEvent_t, unsigned);

static cudaError_t rt_wait_event(rt_wait_fn f, cudaStream_t s, cudaEvent_t e, unsigned flags,
                                 int z)
{
    if (!f)
        return cudaErrorInsufficientDriver;
    const real_driver *R = real_driver_get();
    CUstream n = named((CUstream)s, z);
    if (!runtime_does_it() || !may_fork(R, n))
        return f(s, e, flags);
    capture_key k = before_begin_as(n, true);
    cudaError_t r = f(s, e, flags);
    waited(R, n, &k);
    return r;
}

SHIM_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    REAL_RT(rt_wait_fn, f, "cudaStreamWaitEvent");
    return rt_wait_event(f, s, e, flags, 0);
}

SHIM_EXPORT cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    REAL_RT(rt_wait_fn, f, "cudaStreamWaitEvent_ptsz");
    return rt_wait_event(f, s, e, flags, 1);
}

SHIM_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    REAL_RT(rt_end_fn, f, "cudaStreamEndCapture");
    return rt_end(f, s, g, 0);
}

SHIM_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t *g)
{
    REAL_RT(rt_end_fn, f, "cudaStreamEndCapture_ptsz");
    return rt_end(f, s, g, 1);
}
