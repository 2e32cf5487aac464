/*
 * placement.h - the placement policy: where in the pool an allocation goes.
 *
 * The engine keeps the pool and the policy apart, as TLSF keeps its mapping
 * functions apart from its block handling. The pool (pool.c, with the
 * chunks, bins, regions, backing and lanes it owns) keeps the books: it
 * carves, merges, maps and waits. The policy decides every place: which
 * chunk a block goes to, where in that chunk, and, over virtual memory near
 * the limit, which hole holds it on mapped memory: the rule (placement.c,
 * and the inline part below) and a recorded run's layout (plan.c). It reads
 * the pool and changes nothing but its own state (a plan's cursor), so a
 * rule can be read, measured and replaced without touching the code that
 * keeps the pool consistent.
 *
 * One allocation asks the policy twice: place_fit (which chunk), then
 * place_in_free or place_in_pending (where in it); the pool carves there.
 * Whether a chunk is split at all is the pool's (worth_splitting in pool.c):
 * it decides how a chunk is cut, not where a block goes, and it is asked
 * first, since a block that takes a chunk whole needs no place inside it.
 *
 * The rules' fields (p->place, pool_internal.h) are derived once from the
 * options by place_set_rules, so that the hot path tests one field for each.
 * Why each rule is what it is: placement.c, and docs/design.md ("Policies,
 * and why").
 */
#ifndef BFCSHIM_CORE_PLACEMENT_H
#define BFCSHIM_CORE_PLACEMENT_H

#include "pool_internal.h"

/* placement.c */

/* Derives p->place from the options and the pool's layout (as_one_region):
 * at creation, and again when the first overflow ends the one-region
 * layout. */
void place_set_rules(bfc_pool *p);

/* The chunk an allocation of `rounded` bytes goes to (FREE, or PENDING in
 * the caller's lane `lane_id`), and in *align the alignment to place it at
 * (0: none); CHUNK_NIL when no chunk holds it. */
uint32_t place_fit(const bfc_pool *p, uint64_t rounded, uint32_t lane_id, uint64_t *align);

/* vmm, near the limit: the FREE chunk that holds `rounded` bytes wholly on
 * mapped granules, with the block's place in *at; CHUNK_NIL when none. */
uint32_t place_on_mapped(const bfc_pool *p, uint64_t rounded, bfc_addr *at);
/* vmm: the smallest FREE chunk that holds `rounded` bytes at one of its
 * ends with at most `room` bytes of granules to map there, with the
 * block's place in *at; CHUNK_NIL when none. */
uint32_t place_within_room(const bfc_pool *p, uint64_t rounded, uint64_t room, bfc_addr *at);

/* plan.c: placement from a recorded run's layout. The pool tries the plan's
 * place before the rule's (place_by_plan in pool.c), while it has one
 * region. */
bfc_status plan_create(const bfc_pool *p, const bfc_plan_entry *e, size_t n, pool_plan **out);
void plan_destroy(pool_plan *pl);
uint64_t plan_host_bytes(const pool_plan *pl);
/* The offset of the entry near the cursor for an allocation of `rounded`
 * bytes, taken; false when there is none. */
bool plan_next(pool_plan *pl, uint64_t rounded, uint64_t *offset);
/* The FREE chunk holding [base + offset, + rounded) of the pool's one
 * region (the caller checks there is one), with *at = base + offset;
 * CHUNK_NIL when that range is not wholly free. */
uint32_t plan_free_chunk_at(const bfc_pool *p, pool_plan *pl, uint64_t offset,
                            uint64_t rounded, bfc_addr *at);

/* Whether the allocation the plan was consulted for went to its planned
 * place: the stray score that abandons a plan of another job. */
void plan_record(pool_plan *pl, bool placed);
bool plan_abandoned(const pool_plan *pl);
/* For an allocation the plan did not place: a FREE chunk in the spare
 * space above the plan's extent whose part there holds `rounded`, with *at
 * the high end's place; CHUNK_NIL when none (or the plan is abandoned or
 * finished, or the pool has overflowed into address space, whose spare
 * space is unmapped). */
uint32_t plan_spare_chunk(const bfc_pool *p, pool_plan *pl, uint64_t rounded, bfc_addr *at);

/*
 * Where in a chunk: place_in_free and place_in_pending, with the rules they
 * apply. Inline here rather than in placement.c: they run on every carve,
 * and as a call place_in_free took replay_loop from 313 to 326
 * instructions per operation (callgrind, scripts/bench.sh's gpt-1e4).
 */

/* BFC_PLACE_ALIGNED over virtual memory: is a block of `rounded` bytes a
 * whole number of map granules, to be placed on a granule boundary? */
static inline bool whole_granules(const bfc_pool *p, uint64_t rounded)
{
    return (rounded & p->place.granule_mask) == 0;
}

/* The age of a region edge. An edge never moves: oldest. But over virtual
 * memory an edge borders address space, not memory: youngest, so that
 * blocks pack against live ones and mapped memory grows as one pile rather
 * than two at opposite ends of the reservation. A preallocated pool laid
 * out as one region (as_one_region) is memory up to both edges: oldest.
 * (Aligned placement's small blocks counted an edge as youngest too until
 * it was measured in pools of the sizes the shim makes, where that lost:
 * docs/benchmarks.md.) */
static inline uint64_t edge_age(const bfc_pool *p)
{
    return p->opt.vmm && !p->as_one_region ? UINT64_MAX : 0;
}

/* How long a neighbour of a free chunk is expected to stay: a region edge
 * as old as edge_age says, an allocated block as old as its sequence
 * number, a pending block is about to become free (youngest). */
static inline uint64_t neighbour_age(const bfc_pool *p, uint32_t n)
{
    if (n == CHUNK_NIL)
        return edge_age(p);
    const chunk *c = C(p, n);
    return c->state == CHUNK_ALLOCATED ? c->stamp : UINT64_MAX;
}

/* The age rule: should the allocation go at the high end of chunk c? */
static inline bool by_age_high(const bfc_pool *p, const chunk *c)
{
    return p->opt.placement != BFC_PLACE_LOW &&
           neighbour_age(p, c->next) < neighbour_age(p, c->prev);
}

typedef struct end_pins {
    uint64_t low, high;
} end_pins;

/* BFC_PLACE_ALIGNED over virtual memory: how many granules (mask: the map
 * granule's) a block at [lo, hi) inside FREE chunk c would pin that no block
 * pins yet. The neighbours of a free chunk are blocks (or a region edge),
 * and a neighbour that ends or starts inside a granule already pins it;
 * every other granule under the block could have gone back to the driver. */
static inline uint64_t granules_pinned_anew(const chunk *c, uint64_t lo, uint64_t hi,
                                            uint64_t mask)
{
    const uint64_t end = c->addr + c->size;
    const uint64_t first = lo & ~mask, last = (hi - 1) & ~mask; /* granules under the block */
    uint64_t n = ((last - first) >> bits_ctz64(mask + 1)) + 1;
    const bool low_pinned = c->prev != CHUNK_NIL && (c->addr & mask) != 0;
    const bool high_pinned = c->next != CHUNK_NIL && (end & mask) != 0;
    const uint64_t low_granule = c->addr & ~mask, high_granule = (end - 1) & ~mask;
    if (low_pinned && first == low_granule)
        n--;
    if (high_pinned && last == high_granule && !(low_pinned && high_granule == low_granule))
        n--;
    return n;
}

/* The granules granules_pinned_anew counts for a block of `rounded` bytes at
 * the low end of FREE chunk c, and at its high end. */
static inline end_pins pins_at_ends(const chunk *c, uint64_t rounded, uint64_t mask)
{
    const uint64_t end = c->addr + c->size;
    return (end_pins){granules_pinned_anew(c, c->addr, c->addr + rounded, mask),
                      granules_pinned_anew(c, end - rounded, end, mask)};
}

/* BFC_PLACE_ALIGNED over virtual memory, a block of `rounded` bytes that is
 * not whole granules (those go on boundaries: place_in_free) in FREE chunk c:
 * 1 to put it at c's high end, 0 at its low end, when that end pins fewer
 * new granules; -1 when both pin as many (the age rule chooses). Small
 * blocks then gather in granules that blocks already hold, instead of
 * pinning a granule of their own at the other end of a hole. */
static inline int end_pinning_fewer(const chunk *c, uint64_t rounded, uint64_t mask)
{
    if ((rounded & mask) == 0)
        return -1;
    const end_pins e = pins_at_ends(c, rounded, mask);
    return e.low == e.high ? -1 : e.high < e.low;
}

/*
 * BFC_PLACE_ALIGNED, a block of whole map granules in FREE chunk c: 1 to put
 * it at c's high end, 0 at its low end, when that end lies on a granule
 * boundary, so that the block leaves no gap and shares no granule with the
 * free remainder; when both ends do, `high` (the age rule's end); -1 when
 * neither does.
 *
 * Over virtual memory a region edge does not count (`edges` false): past it
 * lies address space, and packing there would start a second pile of mapped
 * memory. While a preallocated pool is laid out as one region the edges
 * are memory like any other (`edges` true), and this choice of end is one of
 * the two granule rules there (the other: end_rule_below): it moves no block
 * off its best fit and leaves no gap, so the region serves about what one
 * cuMemAlloc region would, but the
 * blocks most likely to stay (whole-granule tensors) already sit on the
 * boundaries the first overflow can remap around. Without it, 2-8 MiB
 * blocks placed 64 KiB past a boundary pinned a granule more than they
 * filled (docs/results/benchmarks-history.md, "Whole-granule blocks at a boundary end").
 */
static inline int end_on_granule_boundary(const bfc_pool *p, const chunk *c, bool high,
                                          bool edges)
{
    const uint64_t mask = p->opt.map_granularity - 1, end = c->addr + c->size;
    const bool low_on = (edges || c->prev != CHUNK_NIL) && (c->addr & mask) == 0;
    const bool high_on = (edges || c->next != CHUNK_NIL) && (end & mask) == 0;
    if (!low_on && !high_on)
        return -1;
    return low_on == high_on ? high : high_on;
}

/*
 * Where in FREE chunk c, worth splitting for `rounded` bytes and chosen by
 * place_fit with `align`, the block starts: c's low end, its high end (c's
 * end - rounded), or an aligned address inside, which leaves a gap below.
 */
static inline __attribute__((always_inline)) bfc_addr place_in_free(const bfc_pool *p,
                                                                    const chunk *c,
                                                                    uint64_t rounded,
                                                                    uint64_t align)
{
    const uint64_t end = c->addr + c->size;
    bool high = by_age_high(p, c);
    if (c->size < p->place.end_rule_below) { /* over virtual memory only */
        const int fewer = end_pinning_fewer(c, rounded, p->opt.map_granularity - 1);
        if (fewer >= 0)
            high = fewer;
    }
    if (!align)
        return high ? end - rounded : c->addr;
    /* The aligned address nearest the chosen end; place_fit made sure one
     * exists. At either end of c the carve puts the block there; inside, it
     * leaves a gap on each side. */
    uint64_t at = high ? (end - rounded) & ~(align - 1) : round_up_pow2(c->addr, align);
    int on = -1;
    if (whole_granules(p, rounded))
        on = end_on_granule_boundary(p, c, high, false);
    else if ((rounded & p->place.one_region_end_mask) == 0)
        on = end_on_granule_boundary(p, c, high, true);
    if (on >= 0)
        at = on ? end - rounded : c->addr;
    return at;
}

/* The same for PENDING chunk c, reused by its own lane: its low or its high
 * end, by age, never aligned (the lane's FIFO keeps one remainder per
 * block). */
static inline bfc_addr place_in_pending(const bfc_pool *p, const chunk *c, uint64_t rounded)
{
    return by_age_high(p, c) ? c->addr + c->size - rounded : c->addr;
}

#endif
