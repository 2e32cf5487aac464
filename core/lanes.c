/*
 * lanes.c - deferred frees: chunks that wait for a fence before anyone else
 * may reuse them.
 *
 * Why: a GPU may still be running work that reads a block when the program
 * frees it. CUDA's stream-ordered pools let the freeing stream reuse such a
 * block at once (its later work is ordered after the free) and everyone else
 * only once the free has completed. A lane models one such stream: a FIFO of
 * pending chunks tagged with the owner's fence token. Tokens of a lane never
 * decrease, so a completed token retires a prefix of the FIFO.
 *
 * Pending chunks are not merged with anything: merging would have to pick one
 * token for memory freed at different times. They coalesce with their free
 * neighbours when they retire.
 */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

static lane *lane_get(bfc_pool *p, uint32_t id)
{
    if (id == BFC_NO_LANE || id >= p->nlanes || !p->lanes[id].open)
        return NULL;
    return &p->lanes[id];
}

bfc_status bfc_pool_lane_open(bfc_pool *p, bool reusable, uint32_t *out)
{
    bfc_status s = BFC_OK;
    bin_set *bins = NULL;
    bfc_lock_acquire(&p->lock);
    /* Slot 0 is BFC_NO_LANE; recycle the first closed slot, else append. */
    uint32_t id = 1;
    while (id < p->nlanes && p->lanes[id].open)
        id++;
    if (id > LANE_MAX) {
        s = BFC_ERR_INVALID;
        goto out;
    }
    if (id == p->lanes_cap) {
        uint32_t cap = p->lanes_cap * 2;
        lane *t = realloc(p->lanes, cap * sizeof *t);
        if (!t) {
            s = BFC_ERR_HOST_MEMORY;
            goto out;
        }
        memset(t + p->lanes_cap, 0, (cap - p->lanes_cap) * sizeof *t);
        p->lanes = t;
        p->lanes_cap = cap;
    }
    if (reusable) {
        bins = malloc(sizeof *bins);
        if (!bins) {
            s = BFC_ERR_HOST_MEMORY;
            goto out;
        }
        bins_init(bins);
    }
    if (id == p->nlanes)
        p->nlanes++;
    p->lanes[id] = (lane){.open = 1, .accepting = 1, .bins = bins};
    *out = id;
out:
    bfc_lock_release(&p->lock);
    return s;
}

static void lane_free_slot(lane *l)
{
    free(l->bins);
    memset(l, 0, sizeof *l);
}

/* Seals lane l's open epoch, if any; false if the backend refused. (An
 * epoch is never empty here: allocations seal before they reuse.) */
static bool seal(bfc_pool *p, uint32_t id, lane *l)
{
    if (!l->open_token)
        return true;
    if (!p->backend.fence_seal || !p->backend.fence_seal(p->backend.ctx, id, l->open_token))
        return false;
    l->open_token = 0;
    p->open_epochs--;
    if (!l->accepting && l->head == CHUNK_NIL)
        lane_free_slot(l);
    return true;
}

/* lazy_too: the pool needs the memory now (nothing fits, it would grow or
 * map more, a trim); else the fence interval's seal, which lazy lanes
 * skip. */
void lanes_seal_all(bfc_pool *p, bool lazy_too)
{
    for (uint32_t id = 1; id < p->nlanes && p->open_epochs; id++)
        if (p->lanes[id].open && (lazy_too || !p->lanes[id].lazy))
            seal(p, id, &p->lanes[id]);
    /* The fence interval counts from the last time everything was sealed,
     * whoever sealed it (the interval, the slow path, a trim). */
    p->allocs_since_fence = 0;
    p->bytes_since_fence = 0;
}

/* Held blocks are left out of every fit, and placing around them scatters
 * the live ones. A pool that grows maps memory for that: replayed on the
 * H100 GPT-2 small trace, a growing pool sealing only when nothing fit
 * mapped 1.92x the live bytes. So a growing pool seals its lazy lanes once
 * their open epochs hold 1/32 of the bytes in use (1.06x there, ResNet-50
 * 1.05x, at about 0.13 seals per allocation). A preallocated pool took its
 * memory already: holding blocks costs it nothing while it has room, and
 * it seals at that share only once the free space left without them is
 * under four times what they hold, near its limit, where scattering costs
 * fits (the smallest limit that serves the transformer-forward trace: 1.058x
 * its live bytes sealing only when nothing fit, 1.011x so; GPT-2-medium
 * 128 training 1.037x and 1.023x), and with room to spare it seals no
 * more (a pool of three times the live bytes: no seal on that trace). */
#define LAZY_HELD_SHARE 32
#define LAZY_ROOM_FACTOR 4

/* The bytes that lazy lanes with an open epoch hold: frees no fence has
 * been asked for yet, which return only once the lanes are sealed. */
uint64_t lanes_lazy_held(const bfc_pool *p)
{
    uint64_t held = 0;
    for (uint32_t id = 1; id < p->nlanes; id++) {
        const lane *l = &p->lanes[id];
        if (l->open && l->lazy && l->open_token)
            held += l->bytes;
    }
    return held;
}

/* The bytes of lazy lanes' open epochs alone: lanes_lazy_held less what
 * their sealed epochs hold, whose fences were asked for (pending for the
 * GPU, they come back by themselves). An open epoch is its lane's FIFO
 * tail, the chunks stamped with its token (move_open_epoch). */
uint64_t lanes_lazy_open_bytes(const bfc_pool *p)
{
    uint64_t held = 0;
    for (uint32_t id = 1; id < p->nlanes; id++) {
        const lane *l = &p->lanes[id];
        if (!l->open || !l->lazy || !l->open_token)
            continue;
        for (uint32_t c = l->tail; c != CHUNK_NIL && C(p, c)->stamp == l->open_token;
             c = C(p, c)->qprev)
            held += C(p, c)->size;
    }
    return held;
}

bool lanes_lazy_due(const bfc_pool *p)
{
    const uint64_t held = lanes_lazy_held(p);
    if (held * LAZY_HELD_SHARE <= p->st.bytes_in_use)
        return false;
    if (!p->opt.preallocate)
        return true;
    const uint64_t room = p->st.pool_bytes - p->st.bytes_in_use - p->st.pending_bytes;
    return room < held * LAZY_ROOM_FACTOR;
}

bool bfc_pool_seal_lane(bfc_pool *p, uint32_t id)
{
    bfc_lock_acquire(&p->lock);
    lane *l = lane_get(p, id);
    bool ok = !l || seal(p, id, l);
    bfc_lock_release(&p->lock);
    return ok;
}

/* Lock held: moves lane l's open (unsealed) epoch into lane `into`'s open
 * epoch, opening one there if need be. The epoch's chunks are the tail of
 * l's FIFO (they carry its open token); they keep their order. */
static void move_open_epoch(bfc_pool *p, lane *l, uint32_t into, lane *to)
{
    bool opening = !to->open_token;
    uint64_t token = opening ? p->token_counter + 1 : to->open_token;
    uint32_t c = l->tail;
    while (c != CHUNK_NIL && C(p, c)->stamp == l->open_token)
        c = C(p, c)->qprev;
    c = c == CHUNK_NIL ? l->head : C(p, c)->qnext; /* the epoch's first chunk */
    while (c != CHUNK_NIL) {
        uint32_t next = C(p, c)->qnext;
        lane_detach(p, c);
        lane_attach_after(p, c, into, token, to->tail);
        c = next;
    }
    to->last_token = token;
    if (opening) {
        p->token_counter = token;
        to->open_token = token;
        p->open_epochs++;
    }
    l->open_token = 0;
    p->open_epochs--;
}

/* The lane that may take lane id's open epoch: `into` when it is open and
 * not reusable. A reusable lane's own allocations take its pending blocks
 * at once, in stream order, before any fence: blocks moved there would go
 * to its stream while the closed lane's work may still use them. Its fence
 * covering the closed lane's work does not help them. */
static lane *epoch_target(bfc_pool *p, uint32_t id, uint32_t into)
{
    lane *to = into != id ? lane_get(p, into) : NULL;
    return to && !to->bins ? to : NULL;
}

void bfc_pool_lane_close_into(bfc_pool *p, uint32_t id, uint32_t into)
{
    bfc_lock_acquire(&p->lock);
    lane *l = lane_get(p, id);
    lane *to = epoch_target(p, id, into);
    if (l) {
        /* If the seal is refused, the epoch goes to `into` (its fence must
         * cover this lane's stream too), else it seals before a later
         * allocation, if it ever can. */
        if (!seal(p, id, l) && to && to->accepting)
            move_open_epoch(p, l, into, to);
        l->accepting = 0;
        if (l->head == CHUNK_NIL && !l->open_token)
            lane_free_slot(l);
    }
    bfc_lock_release(&p->lock);
}

void bfc_pool_lane_retire_into(bfc_pool *p, uint32_t id, uint32_t into)
{
    bfc_lock_acquire(&p->lock);
    lane *l = lane_get(p, id);
    lane *to = epoch_target(p, id, into);
    if (l) {
        /* `into` is the owner's plain lane, open for the pool's life; it
         * takes the epoch even if it stopped accepting frees, so that no
         * seal is ever made for this lane again. */
        if (l->open_token && to)
            move_open_epoch(p, l, into, to);
        l->accepting = 0;
        if (l->head == CHUNK_NIL && !l->open_token)
            lane_free_slot(l);
    }
    bfc_lock_release(&p->lock);
}

void bfc_pool_lane_set_lazy(bfc_pool *p, uint32_t id, bool lazy)
{
    bfc_lock_acquire(&p->lock);
    lane *l = lane_get(p, id);
    if (l)
        l->lazy = lazy;
    bfc_lock_release(&p->lock);
}

void bfc_pool_lane_close(bfc_pool *p, uint32_t id) { bfc_pool_lane_close_into(p, id, BFC_NO_LANE); }

/* Unlinks a pending chunk from its lane's FIFO and bins. */
void lane_detach(bfc_pool *p, uint32_t c)
{
    chunk *cc = C(p, c);
    lane *l = &p->lanes[cc->lane];
    if (l->bins)
        bins_remove(l->bins, &p->chunks, c);
    if (cc->qprev != CHUNK_NIL)
        C(p, cc->qprev)->qnext = cc->qnext;
    else
        l->head = cc->qnext;
    if (cc->qnext != CHUNK_NIL)
        C(p, cc->qnext)->qprev = cc->qprev;
    else
        l->tail = cc->qprev;
    cc->qprev = cc->qnext = CHUNK_NIL;
    l->count--;
    l->bytes -= cc->size;
    p->st.pending_bytes -= cc->size;
    p->st.num_pending_chunks--;
}

/* Makes c pending in lane `id` with `token`, placed in the FIFO right after
 * `after` (CHUNK_NIL: at the head). Callers keep tokens in order: a new free
 * goes after the tail, a split remainder where its parent was. */
void lane_attach_after(bfc_pool *p, uint32_t c, uint32_t id, uint64_t token,
                       uint32_t after)
{
    lane *l = &p->lanes[id];
    chunk *cc = C(p, c);
    cc->state = CHUNK_PENDING;
    cc->lane = (uint16_t)id;
    cc->stamp = token;
    cc->requested = 0;
    cc->qprev = after;
    cc->qnext = after != CHUNK_NIL ? C(p, after)->qnext : l->head;
    if (cc->qnext != CHUNK_NIL)
        C(p, cc->qnext)->qprev = c;
    else
        l->tail = c;
    if (after != CHUNK_NIL)
        C(p, after)->qnext = c;
    else
        l->head = c;
    if (l->bins)
        bins_insert(l->bins, &p->chunks, c);
    l->count++;
    l->bytes += cc->size;
    p->st.pending_bytes += cc->size;
    p->st.num_pending_chunks++;
}

/* The common part of fenced and deferred frees; lock held, lane valid. */
static bfc_status free_into(bfc_pool *p, bfc_addr addr, uint32_t id, lane *l,
                            uint64_t token)
{
    uint32_t c;
    const bfc_status s = pool_take_live(p, addr, &c);
    if (s == BFC_OK) {
        lane_attach_after(p, c, id, token, l->tail);
        l->last_token = token;
        if (p->backend.on_event)
            p->backend.on_event(p->backend.event_ctx, BFC_EVENT_FREE, addr, 0, id);
    }
    return s;
}

bfc_status bfc_pool_free_fenced(bfc_pool *p, bfc_addr addr, uint32_t id,
                                uint64_t token)
{
    if (addr == 0)
        return BFC_OK;
    bfc_status s;
    bfc_lock_acquire(&p->lock);
    lane *l = lane_get(p, id);
    if (!l || !l->accepting)
        s = BFC_ERR_BAD_LANE;
    else if (token < l->last_token)
        s = BFC_ERR_BAD_TOKEN;
    else
        s = free_into(p, addr, id, l, token);
    bfc_lock_release(&p->lock);
    return s;
}

bfc_status bfc_pool_free_deferred(bfc_pool *p, bfc_addr addr, uint32_t id)
{
    if (addr == 0)
        return BFC_OK;
    bfc_status s;
    bfc_lock_acquire(&p->lock);
    lane *l = lane_get(p, id);
    if (!l || !l->accepting) {
        s = BFC_ERR_BAD_LANE;
    } else {
        bool opening = !l->open_token;
        uint64_t token = opening ? p->token_counter + 1 : l->open_token;
        uint64_t before = l->bytes;
        s = free_into(p, addr, id, l, token);
        p->bytes_since_fence += l->bytes - before;
        if (s == BFC_OK && opening) {
            p->token_counter = token;
            l->open_token = token;
            p->open_epochs++;
        }
    }
    bfc_lock_release(&p->lock);
    return s;
}

void lane_retire_locked(bfc_pool *p, uint32_t id, uint64_t completed)
{
    lane *l = lane_get(p, id);
    if (!l)
        return;
    while (l->head != CHUNK_NIL && C(p, l->head)->stamp <= completed) {
        uint32_t c = l->head;
        lane_detach(p, c);
        pool_make_free(p, c);
        p->st.num_retired++;
        /* The GPU moved on: the next fence may be done too (lanes_poll_oldest). */
        p->polls_to_skip = p->poll_gap = 0;
    }
    if (!l->accepting && l->head == CHUNK_NIL && !l->open_token)
        lane_free_slot(l);
}

void bfc_pool_retire(bfc_pool *p, uint32_t id, uint64_t completed)
{
    bfc_lock_acquire(&p->lock);
    lane_retire_locked(p, id, completed);
    bfc_lock_release(&p->lock);
}

bool bfc_pool_lane_oldest(bfc_pool *p, uint32_t id, uint64_t *token)
{
    bfc_lock_acquire(&p->lock);
    lane *l = lane_get(p, id);
    bool any = l && l->head != CHUNK_NIL;
    if (any)
        *token = C(p, l->head)->stamp;
    bfc_lock_release(&p->lock);
    return any;
}

/* A lane's oldest token, if it has been sealed (only sealed tokens have a
 * fence to ask about). */
static bool sealed_head(const bfc_pool *p, const lane *l, uint64_t *token)
{
    if (!l->open || l->head == CHUNK_NIL)
        return false;
    *token = C(p, l->head)->stamp;
    return !l->open_token || *token < l->open_token;
}

/* Slow path, step 1: retire every token the owner already reports complete.
 * Returns true when anything retired. */
bool lanes_poll(bfc_pool *p)
{
    if (!p->backend.fence_done)
        return false;
    bool any = false;
    uint64_t t;
    for (uint32_t id = 1; id < p->nlanes; id++) {
        lane *l = &p->lanes[id];
        while (sealed_head(p, l, &t) && p->backend.fence_done(p->backend.ctx, id, t, false)) {
            lane_retire_locked(p, id, t);
            any = true;
        }
    }
    return any;
}

/* The lane whose sealed head token is the oldest, or 0. */
static uint32_t oldest_lane(const bfc_pool *p, uint64_t *token)
{
    uint32_t best = 0;
    uint64_t t;
    for (uint32_t id = 1; id < p->nlanes; id++)
        if (sealed_head(p, &p->lanes[id], &t) && (best == 0 || t < *token)) {
            best = id;
            *token = t;
        }
    return best;
}

/* The allocation path's non-blocking question about the oldest fence (at
 * every fence_interval-th allocation), so that pending memory returns to the
 * free bins as the GPU catches up instead of piling up until the slow path.
 * While the GPU is behind, the answer is "not yet" until it passes the
 * fence: asked at every allocation, a fence made 100 allocations ahead of
 * the GPU was asked about 100 times. So each "not yet" doubles the polls
 * skipped before the next question, up to POLL_GAP_MAX, and any retirement
 * starts again at every poll (lane_retire_locked): a fence the GPU passes
 * late is asked about a few times, and its memory returns at most
 * POLL_GAP_MAX polls late by this path. The slow path (nothing fits, the
 * pool would grow or map, a lazy lane is due) asks about every fence
 * whatever the gap, so memory the pool needs is never held back by it. */
#define POLL_GAP_MAX 16

void lanes_poll_oldest(bfc_pool *p)
{
    if (p->polls_to_skip) {
        p->polls_to_skip--;
        return;
    }
    uint64_t t = 0;
    uint32_t id = p->backend.fence_done ? oldest_lane(p, &t) : 0;
    if (!id)
        return;
    if (p->backend.fence_done(p->backend.ctx, id, t, false)) {
        lane_retire_locked(p, id, t);
        return;
    }
    p->poll_gap = p->poll_gap == 0 ? 1 : p->poll_gap < POLL_GAP_MAX / 2 ? 2 * p->poll_gap : POLL_GAP_MAX;
    p->polls_to_skip = p->poll_gap;
}

/* Slow path, step 3: wait for the oldest token of all lanes and retire it.
 * Returns false when nothing is pending or the owner could not wait. */
bool lanes_wait_oldest(bfc_pool *p)
{
    uint64_t t = 0;
    uint32_t id = p->backend.fence_done ? oldest_lane(p, &t) : 0;
    if (!id)
        return false;
    p->st.num_fence_waits++;
    if (!p->backend.fence_done(p->backend.ctx, id, t, true))
        return false;
    lane_retire_locked(p, id, t);
    return true;
}

void lanes_fini(bfc_pool *p)
{
    for (uint32_t id = 1; id < p->nlanes; id++)
        free(p->lanes[id].bins);
    free(p->lanes);
    p->lanes = NULL;
    p->nlanes = p->lanes_cap = 0;
}

uint64_t lanes_host_bytes(const bfc_pool *p)
{
    uint64_t bytes = (uint64_t)p->lanes_cap * sizeof(lane);
    for (uint32_t id = 1; id < p->nlanes; id++)
        if (p->lanes[id].bins)
            bytes += sizeof(bin_set);
    return bytes;
}
