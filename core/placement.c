/*
 * placement.c - the placement rule: which chunk an allocation goes to
 * (place_fit), and which hole holds it on mapped memory near the limit
 * (place_on_mapped). Where in the chunk it then goes is decided inline, in
 * placement.h; placement from a recorded plan is plan.c's. The pool carves
 * where the policy says (pool.c).
 *
 * Which chunk, in order:
 *   1. best fit, lowest address on ties: the free bins, or the caller's
 *      lane when its pending chunks hold a smaller fit (best_fit);
 *   2. over virtual memory, a block that is not whole granules and would pin
 *      a granule more than its size needs there looks at the next few
 *      larger chunks for one where it pins fewer (fit_pinning_fewer);
 *   3. under BFC_PLACE_ALIGNED, the chunk must hold the block at its natural
 *      alignment (the granule, for a block of whole granules over virtual
 *      memory, where its best fit holds it so); else the best fit for the
 *      size plus the alignment, which can; else the best fit, unaligned.
 *      Alignment never turns a fit into an out-of-memory.
 *
 * Everything here takes the pool const and changes nothing, so a place the
 * pool then gives up (a block moved to mapped memory, a wait and a second
 * carve) leaves nothing to undo here.
 */
#include <string.h>

#include "placement.h"

/* The names of bfc_placement's values, for options and reports. */
static const char *const placement_names[] = {
    [BFC_PLACE_BY_AGE] = "age", [BFC_PLACE_LOW] = "low", [BFC_PLACE_ALIGNED] = "aligned"};

const char *bfc_placement_name(bfc_placement p)
{
    return (unsigned)p < sizeof placement_names / sizeof *placement_names ? placement_names[p]
                                                                          : "unknown";
}

bool bfc_placement_from_name(const char *name, bfc_placement *out)
{
    for (unsigned i = 0; i < sizeof placement_names / sizeof *placement_names; i++)
        if (strcmp(name, placement_names[i]) == 0) {
            *out = (bfc_placement)i;
            return true;
        }
    return false;
}

/* Granule placement (granule_mask) applies under BFC_PLACE_ALIGNED over
 * virtual memory, except while a preallocated pool is laid out as one
 * region, when only its two choices of end do (one_region_end_mask, and
 * end_rule_below kept to holes under two granules). */
void place_set_rules(bfc_pool *p)
{
    const bool aligned = p->opt.placement == BFC_PLACE_ALIGNED;
    const bool aligned_vmm = aligned && p->opt.vmm;
    p->place.align_from = aligned ? p->opt.align_bytes : UINT64_MAX;
    p->place.granule_mask =
        aligned_vmm && !p->as_one_region ? p->opt.map_granularity - 1 : UINT64_MAX;
    p->place.one_region_end_mask =
        aligned_vmm && p->as_one_region ? p->opt.map_granularity - 1 : UINT64_MAX;
    p->place.end_rule_below = !aligned_vmm      ? 0
                              : p->as_one_region ? 2 * p->opt.map_granularity
                                                 : UINT64_MAX;
}

/* The best candidate for `rounded` bytes: the free bins, or the caller's
 * lane, whichever holds the smaller fit (lower address on ties). */
static uint32_t best_fit(const bfc_pool *p, uint64_t rounded, uint32_t lane_id)
{
    uint32_t c = bins_best_fit(&p->free_bins, &p->chunks, rounded);
    if (lane_id != BFC_NO_LANE) {
        const bin_set *lb = p->lanes[lane_id].bins;
        uint32_t d = lb ? bins_best_fit(lb, &p->chunks, rounded) : CHUNK_NIL;
        if (d != CHUNK_NIL && (c == CHUNK_NIL || chunk_less(C(p, d), C(p, c))))
            c = d;
    }
    return c;
}

/* BFC_PLACE_ALIGNED without granule placement: the largest power of two
 * dividing the rounded size, capped at align_bytes, for blocks of
 * align_bytes or more; 0 for none. */
static uint64_t plain_alignment(const bfc_pool *p, uint64_t rounded)
{
    if (rounded < p->place.align_from)
        return 0;
    uint64_t a = rounded & (~rounded + 1); /* lowest set bit */
    if (a > p->place.align_from)
        a = p->place.align_from;
    return a > p->opt.granularity ? a : 0;
}

/* BFC_PLACE_ALIGNED: the alignment a block of `rounded` bytes is placed at,
 * or 0 for none; a block of whole granules, the granule. */
static uint64_t natural_alignment(const bfc_pool *p, uint64_t rounded)
{
    if (whole_granules(p, rounded))
        return p->opt.map_granularity;
    return plain_alignment(p, rounded);
}

/* Can FREE chunk c hold `rounded` bytes at a multiple of `align`? */
static bool holds_aligned(const chunk *c, uint64_t rounded, uint64_t align)
{
    return round_up_pow2(c->addr, align) + rounded <= c->addr + c->size;
}

/* How many granules no block pins yet a block of `rounded` bytes pins at
 * the better end of FREE chunk c (over virtual memory). */
static uint64_t pins_at_better_end(const bfc_pool *p, const chunk *c, uint64_t rounded)
{
    const end_pins e = pins_at_ends(c, rounded, p->place.granule_mask);
    return e.low < e.high ? e.low : e.high;
}

/*
 * Over virtual memory, a block of `rounded` bytes that is not whole granules
 * and whose best fit c (FREE) would make it pin a granule more than it must:
 * of c and the next FEWER_PINS_CANDIDATES free chunks in size order, the
 * first where it pins the fewest. A small block placed in the smallest hole
 * that holds it can pin a granule of its own when that hole's edges lie on
 * granule boundaries, while a somewhat larger hole whose edge lies inside a
 * granule a block already pins holds it for nothing: once the pool
 * overflowed, that granule is memory it cannot move. Replayed on the 14 real
 * traces, GPT-2-medium 256 inference went from 0.9579 to 0.9792 of peak live
 * with 2 to 32 candidates, and no other trace lost (docs/benchmarks.md,
 * "Granule choices of end before the first overflow"); the walk runs only
 * when the best fit would pin a granule more than the block's size needs.
 */
enum { FEWER_PINS_CANDIDATES = 4 };

static __attribute__((noinline)) uint32_t fit_pinning_fewer(const bfc_pool *p, uint32_t c,
                                                            uint64_t rounded)
{
    uint64_t pins = pins_at_better_end(p, C(p, c), rounded);
    const uint64_t least = rounded >> bits_ctz64(p->place.granule_mask + 1);
    uint32_t pick = c, d = c;
    for (int i = 0; i < FEWER_PINS_CANDIDATES && pins > least; i++) {
        /* The next size up must stay in the bins' range. */
        if (C(p, d)->size >= BFC_SIZE_LIMIT - p->opt.granularity)
            break;
        d = bins_best_fit(&p->free_bins, &p->chunks, C(p, d)->size + p->opt.granularity);
        if (d == CHUNK_NIL)
            break;
        const uint64_t n = pins_at_better_end(p, C(p, d), rounded);
        if (n < pins) {
            pins = n;
            pick = d;
        }
    }
    return pick;
}

/*
 * The chunk an allocation of `rounded` bytes goes to, and in *align the
 * alignment to place it at (0: none). The best fit when it can hold the block
 * aligned; else the best fit for rounded + align - granule, which can (any
 * chunk that large can); else the best fit, unaligned. Pending chunks (own
 * lane) are taken unaligned. A block of whole granules (over virtual memory)
 * is aligned to the granule only where its best fit holds it so.
 */
uint32_t place_fit(const bfc_pool *p, uint64_t rounded, uint32_t lane_id, uint64_t *align)
{
    uint32_t c = best_fit(p, rounded, lane_id);
    if (p->place.granule_mask != UINT64_MAX && c != CHUNK_NIL && !whole_granules(p, rounded) &&
        C(p, c)->state == CHUNK_FREE)
        c = fit_pinning_fewer(p, c, rounded);
    uint64_t a = natural_alignment(p, rounded);
    *align = 0;
    if (c == CHUNK_NIL || a == 0 || C(p, c)->state != CHUNK_FREE)
        return c;
    if (!holds_aligned(C(p, c), rounded, a)) {
        /* Granule placement never sends a block to another chunk (measured:
         * a larger chunk taken for its boundary costs more than it saves):
         * the plain rule places it. */
        if (whole_granules(p, rounded))
            a = plain_alignment(p, rounded);
        if (a != 0 && !holds_aligned(C(p, c), rounded, a)) {
            uint32_t d = best_fit(p, rounded + a - p->opt.granularity, lane_id);
            if (d == CHUNK_NIL || C(p, d)->state != CHUNK_FREE)
                return c;
            c = d;
        }
    }
    *align = a;
    return c;
}

/* The end of what the pool's carve of `rounded` bytes at `at` in FREE
 * chunk x takes (carve_at in pool.c): a remainder above the block too small
 * to split off stays with it as slack (at its low end, the whole chunk). */
static uint64_t carved_end(const bfc_pool *p, const chunk *x, uint64_t rounded, bfc_addr at)
{
    const uint64_t end = x->addr + x->size;
    if (at == x->addr)
        return worth_splitting(&p->opt, x->size, rounded) ? at + rounded : end;
    const uint64_t above = end - at - rounded;
    return above && !worth_splitting(&p->opt, above + rounded, rounded) ? end : at + rounded;
}

/* Whether a block of `rounded` bytes at `at` in FREE chunk x of region r
 * would do: the two searches below differ only in this. */
typedef bool (*place_ok)(const bfc_pool *p, const region *r, const chunk *x, uint64_t rounded,
                         bfc_addr at, uint64_t room);

/* Wholly on mapped granules (the slack a carve keeps may not be: it is
 * mapped where the block lands, under the limit when it fits). */
static bool on_mapped(const bfc_pool *p, const region *r, const chunk *x, uint64_t rounded,
                      bfc_addr at, uint64_t room)
{
    (void)x;
    (void)room;
    return backing_covers(p, r, at, at + rounded);
}

/* With at most `room` bytes of unmapped granules under what the carve
 * there takes, slack included. */
static bool within_room(const bfc_pool *p, const region *r, const chunk *x, uint64_t rounded,
                        bfc_addr at, uint64_t room)
{
    return backing_missing(p, r, at, carved_end(p, x, rounded, at)) <= room;
}

/* FREE chunk x holds `rounded` bytes where ok says so: at *at, its low
 * end, else its high end, each at alignment `align`. */
static bool end_that_does(const bfc_pool *p, const region *r, const chunk *x, uint64_t rounded,
                          uint64_t align, uint64_t room, place_ok ok, bfc_addr *at)
{
    const uint64_t end = x->addr + x->size;
    const uint64_t lo = align ? round_up_pow2(x->addr, align) : x->addr;
    if (lo + rounded <= end && ok(p, r, x, rounded, lo, room)) {
        *at = lo;
        return true;
    }
    uint64_t hi = end - rounded;
    if (align)
        hi &= ~(align - 1);
    if (hi >= x->addr && hi != lo && ok(p, r, x, rounded, hi, room)) {
        *at = hi;
        return true;
    }
    return false;
}

/* The smallest FREE chunk that holds `rounded` bytes at an end where ok
 * says so, at the block's natural alignment if it holds it so there, else
 * unaligned (alignment never turns a fit into a failure), with the block's
 * place in *at; CHUNK_NIL when none. One walk over the chunks: both
 * callers are out of line, where a remap or a failure would cost far more. */
static uint32_t smallest_that_does(const bfc_pool *p, uint64_t rounded, uint64_t room,
                                   place_ok ok, bfc_addr *at)
{
    const uint64_t align = natural_alignment(p, rounded);
    uint32_t best = CHUNK_NIL;
    bfc_addr best_at = 0;
    for (uint32_t ri = 0; ri < p->nregions; ri++)
        for (uint32_t x = p->regions[ri].first; x != CHUNK_NIL; x = C(p, x)->next) {
            const chunk *xc = C(p, x);
            const region *r = &p->regions[ri];
            bfc_addr a;
            if (xc->state != CHUNK_FREE || xc->size < rounded ||
                (best != CHUNK_NIL && xc->size >= C(p, best)->size))
                continue;
            if (end_that_does(p, r, xc, rounded, align, room, ok, &a) ||
                (align && end_that_does(p, r, xc, rounded, 0, room, ok, &a))) {
                best = x;
                best_at = a;
            }
        }
    *at = best_at;
    return best;
}

/* vmm, near the limit: the chunk that holds the block wholly on mapped
 * granules (a move instead of a remap). */
uint32_t place_on_mapped(const bfc_pool *p, uint64_t rounded, bfc_addr *at)
{
    return smallest_that_does(p, rounded, 0, on_mapped, at);
}

/*
 * vmm, the last resort before an out-of-memory: best fit ignores backing,
 * so the chunk it chose may need more granules mapped than the limit has
 * room for while another chunk holds the block at an end on granules its
 * neighbours pin (bfc_pool_free_space's largest free block is the largest
 * such).
 */
uint32_t place_within_room(const bfc_pool *p, uint64_t rounded, uint64_t room, bfc_addr *at)
{
    return smallest_that_does(p, rounded, room, within_room, at);
}
