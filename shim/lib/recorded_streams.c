/*
 * recorded_streams.c - Tensor.record_stream for the PyTorch plug-in
 * (bfcshim_torch_record_stream, api.c): the streams besides its own that a
 * live block was used on, and what its stream-ordered free must do about
 * them so that the block is never handed out under their queued work.
 *
 * A side table keyed by block address (ptr_map), with its own lock: one
 * entry per recorded block, at most RS_STREAMS streams each (more: the block is freed
 * as a plain free, which waits for every stream of its context), forgotten
 * once the block's free goes through: a free that svc_free refuses (on the
 * legacy stream while a blocking stream captures, on a dead stream) leaves
 * the block the program's, and its entry in the table for the next free
 * (recorded_streams_after_free; e2e_plugin record-refused). An entry also holds the block's pool and allocation
 * sequence number, so that an entry left behind by a free that did not pass
 * here (another door, or its pool's context's end) is recognised as stale,
 * never applied to the next block at that address, and is forgotten when
 * the table is full (rs_sweep_locked). A free asks the table only while it
 * holds an entry or a record was dropped (one atomic load otherwise:
 * nothing for programs that never record).
 *
 * Other doors: a recorded block freed by cuMemFree/cudaFree(Async) of its
 * pointer (preloaded) ignores its record, and its entry goes stale. PyTorch
 * never does that: a tensor of a pluggable allocator is freed only through
 * the allocator's free function (CUDAPluggableAllocator::raw_delete), which
 * is bfcshim_torch_free; bfcshim_free and bfcshim_free_async pass here too.
 * (docs/limitations.md.)
 *
 * A record that cannot be kept (RS_MAX_LIVE live recorded blocks after the
 * sweep, or no host memory) is not lost: it raises a mark of the block's
 * pool (rs_drop_locked), the highest allocation sequence number of a block
 * with a dropped record. The block is known by address only, and sequence
 * numbers only grow, so every block of the pool allocated up to the mark
 * is freed as if so recorded (a stream of the pool's context: a plain
 * free; another context's: kept), and blocks allocated after it are not
 * concerned: the degrade ends with the blocks live at the drop, at the
 * cost of one lookup of the block at each free while any mark is set
 * (e2e_api torch-record-full). A sticky flag would fence every later free
 * for good; a count of dropped records could not tell which free ends one.
 *
 * Handle 0: PyTorch passes 0 for the default stream of every device (c10's
 * CUDAStream::stream() answers nullptr for a default stream), and its
 * set_record_stream_fn callback gets no device; Tensor.record_stream runs
 * under a guard of the tensor's device, so the current device does not tell
 * either. A record on 0 (or CU_STREAM_LEGACY) is therefore taken as the
 * legacy stream of any device: the block's own context's, and at the free
 * that of each other device's context that has a pool, as a recorded
 * stream of another context (PyTorch works on a device only with memory
 * allocated there; e2e_api torch-record-other-default, e2e_plugin
 * record-zero-other-device).
 *
 * At the free on stream S, for each recorded stream r other than S (cuda.h
 * references beside each case):
 *   - r usable, of any context: an event recorded on r (created in r's
 *     context: "hEvent and hStream must be from the same context",
 *     cuEventRecord) and cuStreamWaitEvent(S, event) ("hEvent may be from a
 *     different context or device than hStream"). S's later work, and S's
 *     lane fence that the pool's stream-ordered free records after it, then
 *     complete only after r's work submitted before the free: reuse on S in
 *     its order, and elsewhere after the fence, is safe. The event is
 *     destroyed at once ("resources will be released automatically once the
 *     device has completed hEvent", cuEventDestroy).
 *   - r capturing (no event may be recorded on it: it would be a node of
 *     the capture and S would join it), r the legacy stream while a blocking
 *     stream captures, or r destroyed (seen destroyed when preloaded; as a
 *     plug-in, the driver refuses the handle or names another stream by
 *     cuStreamGetId, "unique for the life of the program"), or r the
 *     per-thread default stream of some thread (not nameable from the
 *     freeing thread), or the entry full: the free becomes a plain one, whose
 *     fence covers every stream of the block's context, destroyed and
 *     capturing streams' earlier work included (stand-ins when preloaded;
 *     the blind fence's cuCtxSynchronize as a plug-in: docs/design.md, "Free
 *     policy, and why the default is safe").
 *   - the same for a stream of another context: the plain free does not
 *     cover it, so the block is kept (never handed out again; rare, logged).
 *     At the record, too: a per-thread stream, or a handle that cannot be
 *     told later, of another context keeps the block; another context's
 *     stream finding the entry full takes the slot of one of the block's
 *     context (the free becoming plain), else keeps the block; and a free
 *     already made plain still names another context's streams (its fence
 *     does not cover them: e2e_api torch-record-other-after-plain).
 * S itself unusable (capturing, blocked, dead): svc_free decides as for any
 * free (kept or refused), nothing is queued on S, and it decides on the
 * answer given here (svc_free_seen): S found usable by a second question
 * (a capture ended in between) would take the block in its order with no
 * wait queued. Handle 0 naming the current context's legacy stream
 * (bfcshim_free_async), or CU_STREAM_PER_THREAD its per-thread stream, in
 * another context than the block's: that stream is asked about first
 * (blocked: refused by svc_free, as CUDA refuses it; capturing: kept, as
 * any free on a capturing stream); usable, svc_free waits for it on the
 * host and frees into the plain lane, so the record is handled as for a
 * plain free, a record on handle 0 not waiting for the current context's
 * legacy stream a second time (the host wait covers it: a per-thread
 * stream is a blocking one, whose action waits for the legacy stream's
 * earlier work) (e2e_plugin record-other-current-*,
 * record-zero-other-current-*; e2e_api record-free-ptsz-other-current).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "ptr_map.h"
#include "shim.h"

enum { RS_STREAMS = 4, RS_MAX_LIVE = 2048 };

typedef struct rs_stream {
    CUstream s;              /* CU_STREAM_LEGACY: the block's context's legacy stream */
    CUcontext ctx;           /* s's context at the record */
    unsigned long long id;   /* cuStreamGetId at the record (0: unknown) */
} rs_stream;

typedef struct rs_entry {
    uintptr_t ptr; /* 0: empty slot */
    shim_pool *sp;
    uint64_t seq;  /* the block's allocation sequence number in sp */
    bool plain;    /* free it as a plain free */
    bool keep;     /* an unnameable stream of another context: never hand it out */
    bool legacy_any; /* recorded on handle 0: some device's legacy stream */
    unsigned n;
    rs_stream st[RS_STREAMS];
} rs_entry;

static pthread_mutex_t rs_lock = PTHREAD_MUTEX_INITIALIZER;
static ptr_map rs_blocks; /* block address -> its rs_entry (malloc'd) */
static bool rs_ready;
static size_t rs_degraded;     /* pools with a dropped record's mark (never fewer) */
/* rs_blocks.count + rs_degraded, read without the lock by frees: 0 while
 * no free has anything to ask */
static atomic_size_t rs_live;

static void rs_publish_locked(void)
{
    atomic_store_explicit(&rs_live, (rs_ready ? rs_blocks.count : 0) + rs_degraded,
                          memory_order_relaxed);
}

/* With rs_lock held: the record of stream rec (legacy_any: handle 0) for
 * block seq of sp could not be kept. Every block of sp allocated up to seq
 * (the dropped one among them) is freed as if so recorded, by its
 * allocation sequence number: a stream of sp's context, a plain free; on
 * handle 0, also a wait for every other device's legacy stream; another
 * context's stream, kept. Blocks allocated after the drop are not
 * concerned. */
static void rs_drop_locked(shim_pool *sp, uint64_t seq, const rs_stream *rec, bool legacy_any)
{
    if (!atomic_load(&sp->rs_drop_plain) && !atomic_load(&sp->rs_drop_keep)) {
        rs_degraded++;
        rs_publish_locked();
    }
    atomic_uint_fast64_t *mark = rec->ctx == sp->ctx ? &sp->rs_drop_plain : &sp->rs_drop_keep;
    if (atomic_load(mark) < seq)
        atomic_store(mark, seq);
    if (legacy_any && atomic_load(&sp->rs_drop_legacy) < seq)
        atomic_store(&sp->rs_drop_legacy, seq);
}

/* Does entry e still name a live block: its pool still owns the address
 * (a forgotten pool is never dereferenced), and the block there is the one
 * recorded (same start and allocation sequence number)? */
static bool rs_entry_live(const rs_entry *e)
{
    bfc_live_info li;
    return pool_owning((CUdeviceptr)e->ptr) == e->sp &&
           bfc_pool_block(e->sp->bfc, (CUdeviceptr)e->ptr, &li) == BFC_OK &&
           li.addr == (CUdeviceptr)e->ptr && li.seq == e->seq;
}

/* With rs_lock held, the table full: forgets the entries whose blocks went
 * through another door (a program's cuMemFree or cudaFree of a tensor's
 * pointer), or with their pool's context, which no free here takes away.
 * Without it they filled the table for good, and every later record was
 * dropped (e2e_api torch-record-stale). */
static void rs_sweep_locked(void)
{
    uint64_t stale[RS_MAX_LIVE];
    size_t n = 0;
    for (uint64_t i = 0; i <= rs_blocks.mask && n < RS_MAX_LIVE; i++)
        if (rs_blocks.slots[i].key &&
            !rs_entry_live((const rs_entry *)(uintptr_t)rs_blocks.slots[i].val))
            stale[n++] = rs_blocks.slots[i].key;
    for (size_t k = 0; k < n; k++)
        free((rs_entry *)(uintptr_t)ptr_map_take(&rs_blocks, stale[k]));
    rs_publish_locked();
}

/* Makes e's free a plain one, whose fence covers every stream of the
 * block's context: its streams of that context need no name any more, and
 * leave their slots to another context's. */
static void rs_make_plain(rs_entry *e)
{
    unsigned n = 0;
    for (unsigned k = 0; k < e->n; k++)
        if (e->st[k].ctx != e->sp->ctx)
            e->st[n++] = e->st[k];
    e->n = n;
    e->plain = true;
}

void recorded_stream_add(shim_pool *sp, CUdeviceptr p, uint64_t seq, CUstream s,
                         const char *api)
{
    const real_driver *R = real_driver_get();
    rs_stream rec = {.s = s ? s : CU_STREAM_LEGACY, .ctx = sp->ctx};
    /* PyTorch passes 0 for the default stream of every device, and no
     * device (c10's CUDAStream::stream()): some device's legacy stream */
    const bool legacy_any = rec.s == CU_STREAM_LEGACY;
    /* Not nameable at the free: some thread's per-thread stream, or a
     * handle whose identity cannot be told later */
    bool nameless = s == CU_STREAM_PER_THREAD;
    if (nameless) {
        /* The calling thread's per-thread stream in the current context,
         * which need not be the block's: another context's is covered by
         * no plain fence of the pool (e2e_api torch-record-ptsz-other-device:
         * taken as the block's context's, the block came back under device
         * 1's per-thread work). With no context current it names no stream;
         * not known which, another context's (kept). */
        CUcontext cur = NULL;
        if (R->CtxGetCurrent(&cur) != CUDA_SUCCESS)
            rec.ctx = NULL;
        else if (cur)
            rec.ctx = green_canonical(cur);
    }
    if (!nameless && svc_explicit_stream(s)) {
        if (!R->StreamGetCtx || R->StreamGetCtx(s, &rec.ctx) != CUDA_SUCCESS || !rec.ctx) {
            shim_log(LOG_ERROR, "%s(0x%llx, %p): not a valid stream; ignored", api,
                     (unsigned long long)p, (void *)s);
            return;
        }
        /* The id tells a later question about the handle whether it still
         * names this stream. Without ids, and without seeing destroys, a
         * handle could name another stream by the free. */
        if (!R->StreamGetId || R->StreamGetId(s, &rec.id) != CUDA_SUCCESS)
            nameless = !streams_all_seen();
    }
    /* A plain free's fence covers every stream of the block's context
     * only: a stream of another context is waited for by name, or the
     * block is kept. */
    const bool mine = rec.ctx == sp->ctx;
    pthread_mutex_lock(&rs_lock);
    rs_entry *e = NULL;
    if (rs_ready || (rs_ready = ptr_map_init(&rs_blocks)))
        e = (rs_entry *)(uintptr_t)ptr_map_get(&rs_blocks, p);
    if (e && (e->sp != sp || e->seq != seq)) /* stale: a block freed elsewhere */
        *e = (rs_entry){.ptr = e->ptr, .sp = sp, .seq = seq};
    if (!e) {
        if (rs_ready && rs_blocks.count >= RS_MAX_LIVE)
            rs_sweep_locked();
        if (rs_ready && rs_blocks.count >= RS_MAX_LIVE) {
            rs_drop_locked(sp, seq, &rec, legacy_any);
            pthread_mutex_unlock(&rs_lock);
            static atomic_bool said;
            shim_log_once(&said, LOG_ERROR,
                          "%s: more than %d live blocks recorded on other streams; the "
                          "blocks of this pool allocated so far are freed as plain frees, or "
                          "kept (logged once)", api, RS_MAX_LIVE);
            return;
        }
        if (!rs_ready || !ptr_map_reserve(&rs_blocks, 1) || !(e = calloc(1, sizeof *e))) {
            rs_drop_locked(sp, seq, &rec, legacy_any);
            pthread_mutex_unlock(&rs_lock);
            shim_log(LOG_ERROR, "%s: no host memory for the recorded streams' table; the "
                                "blocks of this pool allocated so far are freed as plain "
                                "frees, or kept", api);
            return;
        }
        *e = (rs_entry){.ptr = (uintptr_t)p, .sp = sp, .seq = seq};
        ptr_map_put(&rs_blocks, p, (uintptr_t)e);
        rs_publish_locked();
    }
    e->legacy_any |= legacy_any;
    bool known = false;
    for (unsigned k = 0; k < e->n; k++)
        known |= e->st[k].s == rec.s && e->st[k].id == rec.id;
    if (nameless) {
        if (mine)
            e->plain = true;
        else
            e->keep = true;
    } else if (!known && !(mine && e->plain)) {
        /* (a stream of the block's context is covered once the free is
         * plain; another context's is not, whatever the entry holds) */
        if (e->n == RS_STREAMS && !mine)
            rs_make_plain(e); /* room for it, if the entry holds one of its context */
        if (e->n < RS_STREAMS)
            e->st[e->n++] = rec;
        else if (mine)
            e->plain = true;
        else
            e->keep = true;
    }
    pthread_mutex_unlock(&rs_lock);
}

/* Is the recorded stream r still the stream recorded, and not capturing?
 * With its context current. */
static bool rs_usable(const real_driver *R, const rs_stream *r)
{
    if (svc_explicit_stream(r->s)) {
        if (streams_all_seen() ? !streams_known(r->s) : false)
            return false; /* seen destroyed */
        unsigned long long id = 0;
        if (r->id && (!R->StreamGetId || R->StreamGetId(r->s, &id) != CUDA_SUCCESS ||
                      id != r->id))
            return false; /* destroyed, its handle maybe another stream's now */
    }
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    /* CUDA_ERROR_STREAM_CAPTURE_IMPLICIT on the legacy stream: a blocking
     * stream captures, the legacy stream is unusable (cuda.h) */
    return R->StreamIsCapturing(r->s, &cs) == CUDA_SUCCESS && cs == CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Makes s (of sp's context, current) wait for r's work submitted so far. */
static bool rs_wait(const real_driver *R, shim_pool *sp, CUstream s, const rs_stream *r)
{
    bool pushed = real_ctx_enter(R, r->ctx);
    CUevent ev = NULL;
    CUresult res = R->EventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    if (res == CUDA_SUCCESS)
        res = R->EventRecord(ev, r->s);
    real_ctx_leave(R, pushed);
    if (res == CUDA_SUCCESS) {
        pushed = real_ctx_enter(R, sp->ctx);
        res = R->StreamWaitEvent(s ? s : CU_STREAM_LEGACY, ev, 0);
        real_ctx_leave(R, pushed);
    }
    if (ev)
        R->EventDestroy(ev);
    return res == CUDA_SUCCESS;
}

rs_verdict recorded_streams_before_free(shim_pool *sp, CUdeviceptr p, bool stream_ordered,
                                        CUstream s, bool legacy_is_pools, const char *api,
                                        svc_stream_state *unusable, void **held)
{
    *held = NULL;
    *unusable = STREAM_USABLE;
    if (atomic_load_explicit(&rs_live, memory_order_relaxed) == 0)
        return RS_AS_ASKED;
    rs_entry e = {0};
    pthread_mutex_lock(&rs_lock);
    rs_entry *taken = rs_ready ? (rs_entry *)(uintptr_t)ptr_map_take(&rs_blocks, p) : NULL;
    rs_publish_locked();
    pthread_mutex_unlock(&rs_lock);
    if (taken)
        e = *taken;
    const bool live = e.ptr && e.sp == sp && rs_entry_live(&e);
    if (taken && !live) { /* a stale one (not this block's) */
        free(taken);
        taken = NULL;
    }
    /* Held until the caller says whether the free went through: a refused
     * one leaves the block the program's, recorded as before
     * (recorded_streams_after_free; e2e_plugin record-refused). */
    *held = taken;
    /* Dropped records (rs_drop_locked): the block is one of them if it was
     * allocated no later than the last drop in its pool. */
    const uint64_t drop_plain = atomic_load(&sp->rs_drop_plain),
                   drop_keep = atomic_load(&sp->rs_drop_keep);
    if (!live) {
        /* A block allocated after the last drop is not concerned: freed
         * as if nothing had been recorded, with no question (before, each
         * such free asked for the current context under the streams' lock
         * for the rest of the run: 1 driver call more a free, e2e_api
         * torch-record-full). */
        bfc_live_info li;
        if ((!drop_plain && !drop_keep) || bfc_pool_block(sp->bfc, p, &li) != BFC_OK ||
            li.addr != p ||
            (li.seq > drop_plain && li.seq > drop_keep &&
             li.seq > atomic_load(&sp->rs_drop_legacy)))
            return RS_AS_ASKED;
        e = (rs_entry){.ptr = (uintptr_t)p, .sp = sp, .seq = li.seq};
    }
    const real_driver *R = real_driver_get();
    if (!R)
        return RS_AS_ASKED;
    e.plain |= e.seq <= drop_plain;
    e.legacy_any |= e.seq <= atomic_load(&sp->rs_drop_legacy);
    bool plain = e.plain, keep = e.keep || e.seq <= drop_keep;
    /* Handle 0 not named with the block's device is the current context's
     * legacy stream (bfcshim_free_async, as cudaFreeAsync). In another
     * context than the block's, svc_free asks about that stream, waits for
     * it on the host and puts the block in the plain lane
     * (pool_lane_for_free, on the same question: is the current context's
     * pool sp?), whose fence covers every stream of the block's context:
     * the record is then handled as for a plain free, its streams of other
     * contexts waited for on the block's context's legacy stream, which
     * that fence comes after. As a stream-ordered free on that legacy
     * stream, the record asked about the wrong context's: blocked there
     * (a capture in the block's context, none in the current one), the
     * block was kept for good although the free goes through
     * (e2e_plugin record-other-current-async-pool). */
    /* That stream is the free's own, asked about first, in its context
     * (current; nothing pushed yet): blocked by a capture there, the free
     * is svc_free's to refuse as CUDA does, on this answer, nothing queued
     * (e2e_plugin record-zero-other-current-async-current: the record's
     * wait for each device's default stream, this one among them, found it
     * blocked first, and the free CUDA refuses was taken and its block
     * kept for good). Usable, svc_free's host wait covers its work, so
     * the record on handle 0 does not wait for it again (`current` below;
     * ...-async-pool: with the block's context's legacy stream blocked,
     * that wait had nowhere to be queued, and the block was kept for good
     * though the free goes through). */
    /* So is CU_STREAM_PER_THREAD, the current context's per-thread stream
     * (for any caller: legacy_is_pools speaks for a legacy stream only),
     * on the same question as pool_lane_for_free's. Asked in the block's
     * context instead, a capture on that context's per-thread stream of
     * this thread kept the block for good, though the free, on a usable
     * stream of the current context, goes through (e2e_api
     * record-free-ptsz-other-current, found by an audit). */
    shim_pool *current = NULL;
    const bool legacy = s == NULL || s == CU_STREAM_LEGACY;
    if (stream_ordered && !svc_explicit_stream(s) && !(legacy && legacy_is_pools) &&
        (current = pools_current_existing(R)) != sp) {
        const svc_stream_state own = svc_stream_state_of(s, false);
        if (own != STREAM_USABLE) {
            *unusable = own;
            return RS_AS_ASKED;
        }
        stream_ordered = false; /* (never RS_PLAIN: svc_free's host wait is needed) */
    } else {
        current = NULL;
    }
    /* Questions and records under the streams' read lock: no stream of
     * this registry is destroyed, and no seen capture begins, in between
     * (a capture begun unseen, as a plug-in, is the program's race). */
    bool took = streams_use_enter();
    bool pushed = real_ctx_enter(R, sp->ctx);
    /* The stream to queue the waits on: the free's own; for a plain free,
     * the legacy stream of the block's context, which its fence (a legacy
     * stream event, or a cuCtxSynchronize) comes after. Unusable (capturing,
     * blocked, dead): a stream-ordered free is svc_free's to keep or refuse,
     * as any; nothing is queued on it. */
    CUstream target = stream_ordered ? s : NULL;
    const svc_stream_state target_state = svc_stream_state_of(target, false);
    bool target_ok = target_state == STREAM_USABLE;
    if (stream_ordered && !target_ok) {
        plain = false;
        /* svc_free must decide on this answer, not ask again: a capture
         * ending in between (another thread's; unseen as a plug-in, and no
         * lock here holds an end back) would find s usable and free the
         * block in s's order, s never made to wait for the recorded
         * streams (e2e_plugin record-capture-ends,
         * record-legacy-capture-ends). */
        *unusable = target_state;
    }
    for (unsigned k = 0; k < e.n && (target_ok || !stream_ordered); k++) {
        const rs_stream *r = &e.st[k];
        const bool mine = r->ctx == sp->ctx;
        if (stream_ordered && (r->s == s || (!s && r->s == CU_STREAM_LEGACY)))
            continue; /* the free's own stream */
        if (!stream_ordered && mine)
            continue; /* the plain free's fence covers every stream of the context */
        bool in = real_ctx_enter(R, r->ctx);
        bool usable = rs_usable(R, r);
        real_ctx_leave(R, in);
        if (usable && target_ok && rs_wait(R, sp, target, r))
            continue;
        if (mine)
            plain = true;
        else
            keep = true;
    }
    /* Handle 0 may have named any device's legacy stream: that of each
     * other device's context with a pool (PyTorch works on a device only
     * with memory it allocated there; as a plug-in the library does not
     * know a pool's context to be the primary one, PyTorch's) is waited for
     * as a recorded stream of another context. A pool whose context went
     * unseen (reset without LD_PRELOAD) is passed over, its work gone with
     * it; asked, not forgotten here: forgetting waits for the streams'
     * users, this free among them (e2e_plugin record-zero-reset hung). */
    for (size_t i = 0; e.legacy_any && !keep && (target_ok || !stream_ordered) &&
                       i < pools_count(); i++) {
        shim_pool *q = pools_at(i);
        if (!q || q == sp || q == current || q->dev == sp->dev || atomic_load(&q->dead))
            continue;
        /* (not known whether it is still q's: its stream cannot be waited
         * for, nor passed over) */
        ctx_identity same = streams_all_seen() ? CTX_SAME : pools_context_identity(q);
        if (same == CTX_REPLACED)
            continue;
        if (same == CTX_UNKNOWN) {
            keep = true;
            break;
        }
        const rs_stream r = {.s = CU_STREAM_LEGACY, .ctx = q->ctx};
        bool in = real_ctx_enter(R, r.ctx);
        bool usable = rs_usable(R, &r);
        real_ctx_leave(R, in);
        if (!usable || !target_ok || !rs_wait(R, sp, target, &r))
            keep = true;
    }
    real_ctx_leave(R, pushed);
    streams_use_leave(took);
    if (keep) {
        static atomic_bool said;
        shim_log_once(&said, LOG_WARN,
                      "%s(0x%llx): recorded on another context's stream that is destroyed or "
                      "capturing, or whose record was dropped: the block is kept until exit "
                      "(logged once)",
                      api, (unsigned long long)p);
        return RS_KEEP;
    }
    return plain && stream_ordered ? RS_PLAIN : RS_AS_ASKED;
}

void recorded_streams_after_free(void *held, bool freed)
{
    rs_entry *e = held;
    if (!e)
        return;
    if (!freed && rs_entry_live(e)) {
        /* Refused: the block is still the program's, and its record too.
         * Back in the table; where another record of it came in between,
         * or no host memory, its streams are dropped records (safe). */
        pthread_mutex_lock(&rs_lock);
        if (rs_ready && !ptr_map_get(&rs_blocks, e->ptr) && ptr_map_reserve(&rs_blocks, 1)) {
            ptr_map_put(&rs_blocks, e->ptr, (uintptr_t)e);
            rs_publish_locked();
            e = NULL;
        } else {
            const rs_stream own = {.s = CU_STREAM_LEGACY, .ctx = e->sp->ctx};
            rs_drop_locked(e->sp, e->seq, &own, e->legacy_any);
            for (unsigned k = 0; k < e->n; k++)
                rs_drop_locked(e->sp, e->seq, &e->st[k], false);
            if (e->keep) /* (a context that is not the pool's: the keep mark) */
                rs_drop_locked(e->sp, e->seq, &(const rs_stream){.ctx = NULL}, false);
        }
        pthread_mutex_unlock(&rs_lock);
    }
    free(e);
}
