/*
 * pool_internal.h - the pool's data structures, shared by the modules of the
 * engine (pool.c, placement.c, regions.c, lanes.c, stats.c, dump.c, check.c).
 * Not part of the public API.
 *
 *   bfc_pool
 *   |-- regions[]     sorted by base; each names its lowest chunk, which never
 *   |                 changes (merges keep the lower record, splits add the
 *   |                 higher one), so a region's chunk list always starts there
 *   |-- chunks        the record store; records of one region form a doubly
 *   |                 linked list in address order (prev/next)
 *   |-- free_bins     every FREE chunk, by size class (bins.h)
 *   |-- live          every ALLOCATED chunk, by address (live_index.h)
 *   `-- lanes[]       each a FIFO of PENDING chunks, oldest token first, plus
 *                     its own bins when allocations on the lane may reuse them
 *
 * Invariants (checked by bfc_pool_check after every step in the tests):
 *   - the chunks of a region tile it exactly, in address order;
 *   - no two FREE chunks are neighbours (coalescing is eager); PENDING chunks
 *     are never merged until they retire;
 *   - each FREE chunk is in free_bins under bin_index(size), each ALLOCATED
 *     chunk in `live` under its address, each PENDING chunk in exactly its
 *     lane's FIFO (and its lane's bins when the lane is reusable);
 *   - the counters in `st` equal a recount.
 */
#ifndef BFCSHIM_CORE_POOL_INTERNAL_H
#define BFCSHIM_CORE_POOL_INTERNAL_H

#include "lock.h"

#include "bfc.h"
#include "bins.h"
#include "chunks.h"
#include "live_index.h"

#define LANE_MAX 65535u /* chunk.lane is 16 bits */

typedef struct pool_plan pool_plan; /* plan.c; its interface: placement.h */

typedef struct region {
    bfc_addr base;
    uint64_t size;
    uint32_t first; /* handle of the chunk at base */
    uint64_t *backed; /* vmm: one bit per map granule, set while mapped; else NULL */
    bfc_addr backed_to; /* vmm: every granule in [base, backed_to) is mapped */
} region;

typedef struct lane {
    uint8_t open;      /* slot in use */
    uint8_t accepting; /* not closed: takes frees and allocations */
    uint8_t lazy;      /* sealed only when the pool needs its memory */
    uint64_t open_token; /* deferred frees join this epoch until sealed; 0: none */
    uint32_t head, tail; /* FIFO of pending chunks, oldest first */
    uint64_t last_token;
    uint64_t count, bytes;
    bin_set *bins; /* NULL unless the lane is reusable */
} lane;

struct bfc_pool {
    bfc_lock lock;
    bfc_options opt;
    bfc_backend backend;
    chunk_store chunks;
    live_index live;
    bin_set free_bins;
    region *regions;
    uint32_t nregions, regions_cap;
    lane *lanes; /* slot 0 unused: BFC_NO_LANE */
    uint32_t nlanes, lanes_cap;
    uint64_t next_region_bytes; /* growth mode: size of the next region */
    uint64_t token_counter;     /* epochs of bfc_pool_free_deferred */
    uint32_t open_epochs;       /* lanes with an open epoch */
    uint32_t allocs_since_fence; /* allocations since open epochs were last sealed */
    uint64_t bytes_since_fence;  /* bytes freed into open epochs since then */
    /* The allocation path's question about the oldest fence backs off while
     * the answer stays "not yet" (lanes_poll_oldest): the polls it skips
     * before asking again, and the gap that the next "not yet" doubles. */
    uint32_t polls_to_skip, poll_gap;
    uint64_t alloc_seq;
    /* vmm, growing: the most bytes the pool has needed at once (in use,
     * pending and a block being placed), the headroom over it now, in
     * thousandths (bfc_options.growth_headroom, raised for each fifth of
     * the need that moves move beyond its growth), the need at the last
     * move, and the bytes moves have moved beyond the need's growth since
     * the headroom last rose (never below zero). */
    uint64_t growth_need;
    uint64_t need_at_move;
    uint64_t moved_at_need;
    uint32_t growth_headroom;
    /* The placement rules as the policy tests them, derived from opt (and
     * as_one_region) by place_set_rules; read only by the policy
     * (placement.h, placement.c). */
    struct {
        /* Blocks of align_from bytes or more are aligned (UINT64_MAX:
         * never). */
        uint64_t align_from;
        /* A block is whole map granules when its size has no bit of
         * granule_mask set (UINT64_MAX: never; only over virtual memory
         * under BFC_PLACE_ALIGNED). */
        uint64_t granule_mask;
        /* While a preallocated pool is laid out as one region (under
         * BFC_PLACE_ALIGNED), a block whose size has no bit of
         * one_region_end_mask set is whole map granules and goes to an end
         * of its chunk that lies on a granule boundary, when one does
         * (UINT64_MAX: never). */
        uint64_t one_region_end_mask;
        /* In a free chunk smaller than this, a block that is not whole map
         * granules goes to the end that pins fewer granules no block pins
         * yet (0: never). Over virtual memory, any chunk (UINT64_MAX); while
         * a preallocated pool is laid out as one region, chunks under two
         * granules. Such a hole holds at most one whole granule, and which
         * end a block takes there decides whether that granule stays free
         * to move at the first overflow; in larger holes the age rule's end
         * packs one region better, and the rule there remapped gigabytes
         * where one region serves (docs/benchmarks.md). */
        uint64_t end_rule_below;
    } place;
    /* vmm, preallocated, not spread (bfc_options.prealloc_spread): true
     * until the first overflow reservation; meanwhile the pool places as
     * one region does (no granule_mask, a region edge oldest) but for two
     * choices of end (place.one_region_end_mask, place.end_rule_below). */
    bool as_one_region;
    /* vmm with a release threshold (not "never"): frees check free mapped
     * bytes against it. */
    bool release_on_free;
    /* vmm: bfc_pool_abandon_memory ran; limit_bytes stays 0, loans ending
     * included. */
    bool abandoned;
    pool_plan *plan; /* bfc_pool_set_plan; NULL: none */
    /* Running counters; derived fields are filled in by bfc_pool_stats. */
    bfc_stats st;
};

static inline chunk *C(const bfc_pool *p, uint32_t i)
{
    return chunk_at(&p->chunks, i);
}

/* Free space is what the regions hold beyond live and pending chunks; the
 * bins keep no counters of their own (they cost ~10 instructions an
 * operation to maintain, for figures read once per stats call). */
static inline uint64_t pool_free_bytes(const bfc_pool *p)
{
    return p->st.va_bytes - p->st.bytes_in_use - p->st.pending_bytes;
}

static inline uint64_t pool_free_chunks(const bfc_pool *p)
{
    return p->chunks.used - p->live.count - p->st.num_pending_chunks;
}

/* bfc_pool_free_space for a caller holding the lock (stats.c). */
void pool_free_space_locked(const bfc_pool *p, const bfc_stats *st, bfc_free_space *out);

/* After pool_bytes grew: raise its high-water marks (peak >= high). */
static inline void pool_note_pool_bytes(bfc_pool *p)
{
    if (p->st.pool_bytes > p->st.high_pool_bytes) {
        p->st.high_pool_bytes = p->st.pool_bytes;
        if (p->st.pool_bytes > p->st.peak_pool_bytes)
            p->st.peak_pool_bytes = p->st.pool_bytes;
    }
}

static inline uint64_t round_up(uint64_t x, uint64_t to)
{
    return (x + to - 1) / to * to;
}

/* The hot path's rounding: the granularity is a power of two. */
static inline uint64_t round_up_pow2(uint64_t x, uint64_t to)
{
    return (x + to - 1) & ~(to - 1);
}

/* Is the remainder of splitting `size` for `rounded` worth keeping? The
 * pool's carves ask it (pool.c); the last resort's search asks it too, to
 * see what a carve there would take (place_within_room). */
static inline bool worth_splitting(const bfc_options *o, uint64_t size, uint64_t rounded)
{
    uint64_t rest = size - rounded;
    if (o->tsl_split)
        return size >= 2 * rounded || rest >= BFC_TSL_MAX_INTERNAL_FRAGMENTATION;
    return rest >= (o->min_split_bytes > o->granularity ? o->min_split_bytes
                                                         : o->granularity);
}

/* (size, address) order shared by every bin. */
static inline int chunk_less(const chunk *a, const chunk *b)
{
    return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

/* regions.c */
int region_find(const bfc_pool *p, bfc_addr addr); /* index or -1 */
bool region_extend(bfc_pool *p, uint64_t rounded);
uint64_t region_release_empty(bfc_pool *p);
void region_release_all(bfc_pool *p);
/* The chunk containing addr inside region r (a walk of the region). */
uint32_t region_chunk_containing(const bfc_pool *p, int r, bfc_addr addr);

/* backing.c (vmm only) */
bool backing_init(const bfc_pool *p, region *r);
/* Is every granule touching [lo, hi) mapped? */
bool backing_covers(const bfc_pool *p, const region *r, bfc_addr lo, bfc_addr hi);
/* Mapped bytes of the region, by recount. */
uint64_t backing_count(const bfc_pool *p, const region *r);
/* The steady state's test, inline on the allocation path: does [lo, hi)
 * end in the region's mapped prefix (mapped memory grows as one pile from
 * the base, see edge_age in placement.h), or lie within one bitmap word (64
 * granules) whose granules are all mapped? */
static inline bool backing_fast_covers(const bfc_pool *p, const region *r, bfc_addr lo,
                                       bfc_addr hi)
{
    if (hi <= r->backed_to)
        return true;
    const unsigned shift = bits_ctz64(p->opt.map_granularity);
    const uint64_t first = (lo - r->base) >> shift, last = (hi - 1 - r->base) >> shift;
    if ((first >> 6) != (last >> 6))
        return false;
    const uint64_t mask = (~UINT64_C(0) >> (63 - (last - first))) << (first & 63);
    return (r->backed[first >> 6] & mask) == mask;
}
/* Maps the granules touching [lo, hi) that are not mapped; false when the
 * limit or the backend refuses. */
bool backing_map(bfc_pool *p, region *r, bfc_addr lo, bfc_addr hi);
/* Unmaps the mapped granules lying wholly inside [lo, hi); returns bytes.
 * gate: NULL to unmap regardless (a region going, memory abandoned); else a
 * release the pool chose, which asks backend.release_ready first, once per
 * batch: *gate starts at 0 and keeps the answer (1 yes, -1 no). */
uint64_t backing_release(bfc_pool *p, region *r, bfc_addr lo, bfc_addr hi, int *gate);
/* The same for every free chunk of the pool. */
uint64_t backing_release_free(bfc_pool *p);
/* Under pressure: gives back `want` bytes (rounded up to granules) or as
 * many as there are, from the largest free chunks first, each from its top.
 * Best fit fills the smallest hole that holds a block, so the largest
 * free chunks are the last to be carved again: their granules are the ones
 * least likely to be mapped again soon. Returns the bytes; *refused
 * (unless NULL) says whether release_ready said "not now", so that nothing
 * more can go back in this call. */
uint64_t backing_release_some(bfc_pool *p, uint64_t want, bool *refused);
/* Bytes of the granules under [lo, hi) that are not mapped. */
uint64_t backing_missing(const bfc_pool *p, const region *r, bfc_addr lo, bfc_addr hi);
/* Calls fn for the pieces of [lo, hi) that lie on runs of mapped and of
 * unmapped granules, in address order (they tile [lo, hi)): what a dump
 * says of free address space. */
typedef void (*backing_piece_fn)(void *arg, bfc_addr lo, bfc_addr hi, bool mapped);
void backing_pieces(const bfc_pool *p, const region *r, bfc_addr lo, bfc_addr hi,
                    backing_piece_fn fn, void *arg);
/* Free chunk c just formed and more than release_threshold is free: give
 * back its whole granules. */
void backing_after_free(bfc_pool *p, uint32_t c);
/* Unmaps everything the region has mapped and drops its bitmap. */
void backing_release_region(bfc_pool *p, region *r);

/* stats.c */
void pool_stats_locked(const bfc_pool *p, bfc_stats *out);

/* pool.c */
void pool_make_free(bfc_pool *p, uint32_t c);

/* The first step of every free, plain or into a lane: takes the live chunk
 * at addr out of the live index and its bytes out of the counters. Returns
 * BFC_OK with the chunk in *c, or why addr is not a live allocation. Inline:
 * it is on the free path. */
static inline bfc_status pool_take_live(bfc_pool *p, bfc_addr addr, uint32_t *c)
{
    *c = live_index_take(&p->live, &p->chunks, addr);
    if (*c == CHUNK_NIL)
        return region_find(p, addr) < 0 ? BFC_ERR_NOT_OWNED : BFC_ERR_NOT_ALLOCATED;
    const chunk *cc = C(p, *c);
    p->st.num_frees++;
    p->st.bytes_in_use -= cc->size;
    p->st.bytes_requested -= cc->requested;
    return BFC_OK;
}

/* lanes.c */
void lane_detach(bfc_pool *p, uint32_t c);
void lane_attach_after(bfc_pool *p, uint32_t c, uint32_t lane_id,
                       uint64_t token, uint32_t after);
bool lanes_poll(bfc_pool *p);
void lanes_poll_oldest(bfc_pool *p);
bool lanes_wait_oldest(bfc_pool *p);
/* Seals every open epoch; the fence interval counts again from here. */
void lanes_seal_all(bfc_pool *p, bool lazy_too);
bool lanes_lazy_due(const bfc_pool *p);
uint64_t lanes_lazy_held(const bfc_pool *p);
uint64_t lanes_lazy_open_bytes(const bfc_pool *p);
void lanes_fini(bfc_pool *p);
uint64_t lanes_host_bytes(const bfc_pool *p);
void lane_retire_locked(bfc_pool *p, uint32_t id, uint64_t completed);

#endif
