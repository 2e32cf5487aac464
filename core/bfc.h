/*
 * bfc.h - the bfcshim allocator engine: a best-fit-with-coalescing pool over
 * address ranges.
 *
 * The engine hands out sub-ranges of large "regions" that it obtains from a
 * backend (in the shim: cuMemAlloc of the real driver; in tests and replay: a
 * simulated address space). It never reads or writes the memory it manages
 * (device memory is not host-readable), so every piece of bookkeeping lives in
 * host memory that grows with the number of chunks, never with region size.
 *
 * Vocabulary
 *   region  a range obtained from the backend in one call; returned whole.
 *   chunk   a piece of a region: allocated, free, or pending. The chunks of a
 *           region tile it exactly, in address order.
 *   free    reusable by any allocation at once.
 *   pending freed by the owner but not yet safe for everyone: it waits in a
 *           "lane" until the owner reports its fence token complete. In the
 *           shim a lane is a CUDA stream and a token stands for CUDA events.
 *   lane    a FIFO of pending chunks. An allocation made *on* a reusable lane
 *           may take that lane's pending chunks at once (stream order makes
 *           that safe); nobody else may until they retire.
 *
 * Thread safety: every function that takes a pool locks that pool's one
 * mutex for its whole duration; pools are independent. The fence callback is
 * called with the lock held and must not call back into the pool.
 *
 * The engine has no global state and does no I/O except to FILE streams the
 * caller passes (dump, check).
 */
#ifndef BFCSHIM_CORE_BFC_H
#define BFCSHIM_CORE_BFC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint64_t bfc_addr;
typedef struct bfc_pool bfc_pool;

/* Smallest unit of size and alignment, as in TSL's BFC (kMinAllocationSize). */
#define BFC_MIN_GRANULARITY 256u
/* Every size the pool handles is below this (256 TiB): a request once
 * rounded to the granularity, a region, a chunk, a limit. The free bins
 * (bins.h) are sized from it and cover exactly these sizes; no device has that
 * much memory, and it keeps every size computation far from overflow. A
 * request that does not round to below it fails with BFC_ERR_TOO_LARGE: the
 * largest that can succeed is BFC_SIZE_LIMIT - granularity. */
#define BFC_SIZE_LIMIT_BITS 48u
#define BFC_SIZE_LIMIT (UINT64_C(1) << BFC_SIZE_LIMIT_BITS)
/* TSL's kMaxInternalFragmentation: its split rule always splits past this. */
#define BFC_TSL_MAX_INTERNAL_FRAGMENTATION (UINT64_C(128) << 20)
/* Lane 0 means "no lane": a plain allocation, or an immediate free. */
#define BFC_NO_LANE 0u

typedef enum bfc_status {
    BFC_OK = 0,
    BFC_ERR_OOM,           /* nothing fits and the backend gives no more */
    BFC_ERR_TOO_LARGE,     /* size that does not round to below BFC_SIZE_LIMIT */
    BFC_ERR_NOT_OWNED,     /* address in no region of this pool: route it elsewhere */
    BFC_ERR_NOT_ALLOCATED, /* inside a region but not the start of a live allocation */
    BFC_ERR_BAD_LANE,      /* lane not open, or not accepting frees */
    BFC_ERR_BAD_TOKEN,     /* fence tokens of a lane must not decrease */
    BFC_ERR_HOST_MEMORY,   /* host metadata could not be allocated; pool unchanged */
    BFC_ERR_INVALID,       /* bad options or arguments */
} bfc_status;

const char *bfc_status_name(bfc_status s);

/* What a tracing backend is told (bfc_backend.on_event). */
typedef enum bfc_event {
    BFC_EVENT_ALLOC,
    BFC_EVENT_FREE,
    BFC_EVENT_ALLOC_FAILED,
} bfc_event;

/*
 * Where regions come from. region_alloc must return a base aligned to at
 * least the pool's granularity and never 0; it returns 0 on success and any
 * other value on failure (the pool then backs off to a smaller size).
 */
typedef struct bfc_backend {
    void *ctx;
    int (*region_alloc)(void *ctx, uint64_t size, bfc_addr *base);
    void (*region_free)(void *ctx, bfc_addr base, uint64_t size);
    /*
     * Optional. Asks whether fence `token` of `lane` has completed; with
     * wait=true it may block until it has. Returns true when complete. Called
     * with the pool locked: on the slow path (when nothing fits), and to poll
     * the oldest pending token once per allocation.
     */
    bool (*fence_done)(void *ctx, uint32_t lane, uint64_t token, bool wait);
    /*
     * Optional, for bfc_pool_free_deferred. Makes the fence for `token` of
     * `lane`: everything freed into that epoch must become reusable only
     * when work submitted up to now has finished (the shim records CUDA
     * events). Returns false when it cannot now; the epoch then stays open
     * and is tried again. Called with the pool locked.
     */
    bool (*fence_seal)(void *ctx, uint32_t lane, uint64_t token);
    /*
     * Optional, for tracing: told of every allocation (its address and the
     * requested size), every allocation that found no memory (address 0)
     * and every accepted free (size 0), with its lane, in the order the pool
     * served them. Called with the pool locked, so a recorder needs no lock
     * of its own and sees the pool's exact order; it must be quick and must
     * not call into the pool. Its context is event_ctx.
     */
    void (*on_event)(void *event_ctx, bfc_event ev, bfc_addr addr, uint64_t size,
                     uint32_t lane);
    void *event_ctx;
    /*
     * Required with bfc_options.vmm, unused without. region_alloc and
     * region_free then reserve and give back *address space* only (the shim:
     * cuMemAddressReserve), and these two put physical memory behind part of
     * it and take it away again (cuMemCreate + cuMemMap + cuMemSetAccess;
     * cuMemUnmap). Both ranges are multiples of map_granularity, inside one
     * region. map must leave any granule-aligned sub-range unmappable on its
     * own later (the shim makes one physical allocation per granule); it
     * returns the bytes it mapped from the start of the range: size, or,
     * when the device has no memory (or refuses), fewer (a multiple of
     * map_granularity), those granules mapped and usable, the rest not
     * mapped at all (the shim: a failed map whose rollback a cuMemUnmap
     * refused). The pool counts what map says is mapped (pool_bytes) and
     * gives it back as free space later. unmap is called only for
     * granules that lie wholly inside free space: no allocation uses them
     * and no fence on them is outstanding. It returns the bytes it unmapped
     * from the start of the range: size, or, when the device refuses a
     * granule, the granules before it (a multiple of map_granularity), the
     * refused one and those after it left mapped, their memory intact (the
     * shim: a cuMemUnmap that fails). The pool keeps those counted as
     * mapped (pool_bytes), free and usable, and stops that release (a
     * batch's gate closes: release_ready's "not now"); a later release tries
     * them again. Called with the pool locked.
     */
    uint64_t (*map)(void *ctx, bfc_addr addr, uint64_t size);
    uint64_t (*unmap)(void *ctx, bfc_addr addr, uint64_t size);
    /*
     * Optional (vmm): asked once before the pool gives back granules of free
     * space on its own initiative (past release_threshold, on
     * bfc_pool_trim, under pressure before an allocation fails). false keeps
     * them mapped for now; a later release asks again. For a backend whose
     * free space may still be touched by queued work (the shim under
     * BFCSHIM_FREE_POLICY=immediate) it waits for that work, and answers
     * false when it cannot wait now (a stream capture is under way). Not
     * asked when a region goes or bfc_pool_abandon_memory runs: those unmap
     * regardless. NULL: always ready. Called with the pool locked.
     */
    bool (*release_ready)(void *ctx);
    /*
     * Optional (vmm): keep(ctx, true) before the pool unmaps free space
     * only to map as much again elsewhere in the same call (an allocation
     * under pressure), keep(ctx, false) after. In between, unmap may keep
     * the physical memory it takes away, map should use kept memory before
     * it asks the device for more, and keep(ctx, false) gives back whatever
     * is still kept. The memory then moves instead of leaving the process
     * and being taken again: nothing else on the device (another process,
     * the driver's own allocations) can take it in between, and a move
     * costs no new physical allocation. Kept memory lives only inside that
     * one call; pool_bytes does not count it (the device holds at most
     * limit_bytes all the same: the pool maps no more than it unmapped plus
     * the room under the limit, and map uses kept memory first). NULL: every
     * unmap gives the memory back. Called with the pool locked.
     */
    void (*keep)(void *ctx, bool on);
} bfc_backend;

/*
 * Placement: which end of the chosen chunk an allocation is carved from, and
 * (for BFC_PLACE_ALIGNED) at which address. A free chunk always has allocated
 * neighbours (or a region edge): free neighbours would have merged.
 *   BFC_PLACE_ALIGNED default: BFC_PLACE_BY_AGE's end, at an address that is
 *                     a multiple of the block's natural alignment: the
 *                     largest power of two that divides its rounded size,
 *                     capped at align_bytes, for blocks of align_bytes or
 *                     more. Small blocks that come and go leave odd offsets
 *                     behind; without alignment a large block placed after
 *                     one inherits the offset, and when it dies its hole is a
 *                     few hundred bytes short of the next block of the same
 *                     size. Aligned, same-sized blocks tile the holes they
 *                     leave. The best fit is kept when it can hold the block
 *                     aligned; otherwise the best fit for size + alignment -
 *                     granule (which always can); failing both, the block
 *                     goes unaligned into the best fit, so alignment never
 *                     turns a fit into an OOM. Measured on real traces in
 *                     docs/benchmarks.md (placement section).
 *                     Over virtual memory (vmm), a block that is a whole
 *                     number of map granules is placed on a granule
 *                     boundary instead, so that it shares no granule with
 *                     a neighbour: a free block then releases every granule
 *                     it spanned, and a live one pins no partly used granule
 *                     beside free space. An end of the chunk that lies on a
 *                     boundary takes it (no gap left below or above it);
 *                     else the boundary nearest BFC_PLACE_BY_AGE's end. Only
 *                     the best fit is placed so: when it cannot hold the block
 *                     on a boundary, the rule above applies to it. An end
 *                     that is a region edge does not count as one. Any
 *                     other block goes to the end of its chunk where it pins
 *                     fewer granules no block pins yet (a neighbour whose
 *                     edge lies inside a granule pins it already), and to
 *                     BFC_PLACE_BY_AGE's end when both pin as many.
 *   BFC_PLACE_BY_AGE  carve against the *older* neighbour, treating a region
 *                     edge as oldest (over virtual memory, youngest: past it
 *                     lies address space, and packing against live blocks
 *                     keeps mapped memory one pile) and a pending block as
 *                     youngest. A block
 *                     that has lived long is likely to live on; packing new
 *                     blocks against it leaves the free remainder beside the
 *                     neighbour that will die sooner, so the hole grows back.
 *   BFC_PLACE_LOW     always the low end, as TSL's BFC does.
 * Pending blocks reused by their own lane are carved as by BFC_PLACE_BY_AGE,
 * unaligned: the lane's FIFO keeps one remainder per reused block.
 */
typedef enum bfc_placement {
    BFC_PLACE_BY_AGE = 0,
    BFC_PLACE_LOW = 1,
    BFC_PLACE_ALIGNED = 2,
} bfc_placement;

/* Default cap (and threshold) of BFC_PLACE_ALIGNED's natural alignment,
 * chosen by cross-validation over the real traces (docs/benchmarks.md). */
#define BFC_DEFAULT_ALIGN_BYTES (UINT64_C(64) << 10)
/* The shim's defaults for deferred frees (bfc_options.fence_interval and
 * fence_bytes), which `bfcshim replay --fence-lag` models too, and the
 * largest interval it accepts. */
#define BFC_DEFAULT_FENCE_INTERVAL 1u
#define BFC_DEFAULT_FENCE_BYTES (UINT64_C(64) << 20)
#define BFC_MAX_FENCE_INTERVAL 4096u
/* bfc_options.growth_headroom and growth_headroom_step, in thousandths:
 * 3.5% over the pool's need, 0.5% more for each fifth of it moved beyond
 * what it grew meanwhile (docs/benchmarks.md, "A growing pool that moves
 * memory rather than grow", "The headroom rises by bytes moved"). */
#define BFC_DEFAULT_GROWTH_HEADROOM 35u
#define BFC_DEFAULT_GROWTH_HEADROOM_STEP 5u
/* Each at most this (the pool's need again); moves stop raising it there. */
#define BFC_MAX_GROWTH_HEADROOM 1000u

/* "aligned", "age", "low"; and back (false for an unknown name). */
const char *bfc_placement_name(bfc_placement p);
bool bfc_placement_from_name(const char *name, bfc_placement *out);

typedef struct bfc_options {
    /* The most bytes of regions the pool may hold at once (required, > 0,
     * below BFC_SIZE_LIMIT). */
    uint64_t limit_bytes;
    /* true: the first extension asks for the whole limit (XLA preallocation);
     * false: regions start at initial_region_bytes and double (growth mode). */
    bool preallocate;
    uint64_t initial_region_bytes; /* growth mode; default 2 MiB */
    /* Region sizes are rounded up to this (the driver's allocation granule);
     * default 2 MiB. Set 256 to simulate exact region sizes. */
    uint64_t region_granularity;
    /* Size rounding and alignment of every chunk: a power of two >= 256,
     * below BFC_SIZE_LIMIT. */
    uint64_t granularity;
    /* A free chunk is split only when the remainder is at least this many
     * bytes (and at least one granule). Default: 256 (always split). */
    uint64_t min_split_bytes;
    /* TSL's rule instead: split only when the chunk is at least twice the
     * request or the remainder is 128 MiB or more (up to 2x internal waste).
     * For comparisons; off by default. */
    bool tsl_split;
    /* On OOM, return regions that hold no allocated or pending chunk to the
     * backend and retry with one region that fits (TSL garbage collection). */
    bool garbage_collection;
    /* Where in the best-fitting free chunk an allocation goes (above). */
    bfc_placement placement;
    /* BFC_PLACE_ALIGNED: blocks of at least this many bytes start at a
     * multiple of min(align_bytes, the largest power of two dividing their
     * rounded size). A power of two; at or below the granularity it changes
     * nothing. Default BFC_DEFAULT_ALIGN_BYTES. */
    uint64_t align_bytes;
    /* Deferred frees: open epochs are sealed, and the oldest fence polled,
     * once every fence_interval allocations (0 or 1: every allocation), or
     * sooner, as soon as fence_bytes or more have been freed into them (0:
     * no such trigger), and always when nothing fits. A fence made later
     * covers more work, so any setting is safe; fewer fences (in the shim,
     * CUDA events) cost less time, and freed blocks held back longer cost
     * memory: the byte trigger keeps large frees from waiting. */
    uint32_t fence_interval;
    uint64_t fence_bytes;
    /*
     * Virtual memory mode (backend.map/unmap required). A region is address
     * space; physical memory is mapped behind it in map_granularity granules
     * when an allocation first lands on them, so one reservation grows as the
     * pool does and free space coalesces across growth steps. limit_bytes
     * then bounds the *mapped* bytes (pool_bytes), not the address space.
     * Granules lying wholly in free space are unmapped:
     *   - when more than release_threshold bytes of mapped memory are free
     *     (checked as frees merge: the merged block gives its granules back);
     *   - on bfc_pool_trim;
     *   - before an allocation fails for want of mapped memory (pressure).
     * With preallocate, the first region maps limit_bytes at once; how that
     * region is laid out is prealloc_spread's choice.
     */
    bool vmm;
    /* The unit of mapping (the driver's granularity): a power of two and a
     * multiple of granularity, below BFC_SIZE_LIMIT. Default 2 MiB. */
    uint64_t map_granularity;
    /* Address space of each reservation; 0: twice limit_bytes, so that a
     * fragmented address space still leaves room to place a block wherever
     * memory can be mapped. Rounded up to map_granularity, and capped at the
     * largest multiple of it below BFC_SIZE_LIMIT (a reservation is a chunk
     * while it is free). */
    uint64_t va_bytes;
    /* Free mapped bytes the pool keeps before giving granules back as frees
     * merge. Default UINT64_MAX: keep them until trim or pressure. */
    uint64_t release_threshold;
    /*
     * vmm with preallocate. false (default), overflow: the first
     * reservation is the limit itself, mapped whole, and blocks are placed
     * in it by the rules of one region (no granule placement, a region edge
     * oldest), so the pool serves exactly what one preallocated region
     * would and moves no memory while that is enough. Only when no free
     * chunk holds a block is more address space reserved (va_bytes); the
     * block lands there and free granules of the first region move behind
     * it (pressure), and the rules of virtual memory apply from then on.
     * true, spread: the first reservation is va_bytes and the rules of
     * virtual memory apply from the start; replayed, the real traces then
     * need less memory still, but a job near its limit remaps granules in
     * every step even where one region would have served it
     * (docs/benchmarks.md).
     */
    bool prealloc_spread;
    /*
     * vmm, growing (no preallocate): how far mapped bytes may run ahead of
     * the most the pool has needed at once (in use, pending and the block
     * being placed), in thousandths of that. An allocation whose block would
     * map past it first moves to mapped free memory that holds it, then
     * moves free granules behind it (unmapped where they lie, mapped there,
     * the memory kept in between), and grows only when neither is enough.
     * The bytes such moves of granules move beyond what the need grew
     * meanwhile add up, and each fifth of the need they reach raises the
     * headroom by growth_headroom_step, so a job whose steady state needs
     * more room stops moving memory, having moved at most its need's
     * growth and a fifth of its need for each step; moves while the need
     * still grows (a job's first step) count nothing. 0: map wherever
     * best fit lands. Defaults BFC_DEFAULT_GROWTH_HEADROOM and
     * BFC_DEFAULT_GROWTH_HEADROOM_STEP.
     */
    uint32_t growth_headroom;
    uint32_t growth_headroom_step;
} bfc_options;

/* Fills *o with the defaults above, limit_bytes left 0. */
void bfc_options_init(bfc_options *o);

/*
 * Statistics. Names follow TSL's AllocatorStats where one exists
 * (num_allocs, bytes_in_use, peak_bytes_in_use, largest_alloc_size,
 * bytes_limit, bytes_reserved, peak_bytes_reserved, largest_free_block_bytes,
 * pool_bytes, peak_pool_bytes). bytes_in_use counts rounded chunk sizes, as in
 * TSL; bytes_requested counts what callers asked for.
 */
typedef struct bfc_stats {
    uint64_t num_allocs;
    uint64_t num_frees;
    uint64_t num_ooms;
    uint64_t bytes_in_use;
    uint64_t peak_bytes_in_use;
    uint64_t bytes_requested;
    uint64_t peak_bytes_requested;
    uint64_t largest_alloc_size;
    uint64_t bytes_limit;
    /* Of bytes_limit, what is lent to memory the pool does not place
     * (bfc_pool_lend): the pool maps at most bytes_limit - bytes_lent. */
    uint64_t bytes_lent;
    uint64_t peak_bytes_lent;
    uint64_t bytes_reserved;      /* = pool_bytes: held from the device */
    uint64_t peak_bytes_reserved; /* = peak_pool_bytes */
    uint64_t pool_bytes;
    uint64_t peak_pool_bytes;
    /* The same high-water marks since the last bfc_pool_reset_highs (since
     * creation until then): an owner that lets its users reset a peak
     * resets these, and the lifetime peaks above stay what they say. */
    uint64_t high_bytes_in_use;
    uint64_t high_pool_bytes;
    uint64_t largest_free_block_bytes;
    uint64_t free_bytes;    /* in free chunks */
    uint64_t pending_bytes; /* in pending chunks (freed, fence not done) */
    uint64_t internal_fragmentation_bytes; /* bytes_in_use - bytes_requested */
    double fragmentation; /* (free - largest free) / free, TSL's measure; 0 if no free */
    uint64_t num_chunks;
    uint64_t num_free_chunks;
    uint64_t num_pending_chunks;
    uint64_t num_regions;
    uint64_t num_region_allocs; /* successful backend region_alloc calls */
    uint64_t num_region_frees;  /* backend region_free calls */
    uint64_t num_region_alloc_failures;
    uint64_t num_gc_runs;
    uint64_t num_fence_waits; /* blocking fence_done calls on the slow path */
    uint64_t num_retired;     /* pending chunks that became free */
    /* Address space held in regions: pool_bytes without vmm. With vmm,
     * pool_bytes counts mapped bytes and this the reservations. */
    uint64_t va_bytes;
    uint64_t num_map_calls;   /* backend.map calls (vmm) */
    uint64_t num_unmap_calls; /* backend.unmap calls (vmm) */
    uint64_t num_map_failures;
    /* Allocations that landed on unmapped granules with the limit reached
     * (or a growing pool's headroom), moved to memory already mapped
     * instead of remapping (vmm). */
    uint64_t num_mapped_refits;
    /* Allocations of a growing pool that moved free granules behind their
     * block rather than map past the headroom (growth_headroom; vmm). */
    uint64_t num_growth_moves;
    /* A growing pool's headroom now, in thousandths: growth_headroom, plus
     * growth_headroom_step for each fifth of the need moved beyond what
     * the need grew meanwhile (vmm). */
    uint64_t growth_headroom;
    /* Allocations whose best fit could not be backed within the limit even
     * with every free granule given back, placed instead at an end of
     * another free chunk that could, on granules its neighbours pin (vmm). */
    uint64_t num_limit_moves;
    /* Bytes given back to the device so far: unmapped granules (vmm) and
     * returned regions. Under pressure a backend with keep may move
     * unmapped granules under the new block instead; they count here too. */
    uint64_t released_bytes_total;
    uint64_t host_metadata_bytes; /* host memory the engine holds for bookkeeping */
    /* With a plan (bfc_pool_set_plan): allocations placed where it said;
     * allocations it had a place for that was not free; allocations it did
     * not place that went to the spare space above its extent; and 1 once
     * the run strayed so far that the plan was abandoned. */
    uint64_t num_planned;
    uint64_t num_plan_misses;
    uint64_t num_plan_spare;
    uint64_t plan_abandoned;
} bfc_stats;

/* Creates a pool. Takes no memory from the backend until the first
 * allocation (or bfc_pool_reserve). Returns NULL on bad options or no memory. */
bfc_pool *bfc_pool_create(const bfc_options *opt, const bfc_backend *backend);

/* Destroys the pool; with release_regions, returns every region to the
 * backend first (live allocations included). */
void bfc_pool_destroy(bfc_pool *pool, bool release_regions);

/* Takes the first region now (preallocation at start-up) unless the pool
 * already holds one. Returns BFC_OK or BFC_ERR_OOM. */
bfc_status bfc_pool_reserve(bfc_pool *pool);

/*
 * Allocates `size` bytes. Size 0 succeeds with *out = 0 and takes nothing (as
 * cudaMalloc does). `lane` is BFC_NO_LANE or an open lane whose pending
 * chunks this allocation may reuse. On failure *out is left unchanged.
 */
bfc_status bfc_pool_alloc(bfc_pool *pool, uint64_t size, uint32_t lane,
                          bfc_addr *out);

/*
 * A placement plan: for each allocation of a recorded run, in order, its
 * rounded size and the offset from the pool's region base where an offline
 * packing put it (`bfcshim plan`). Installed, each allocation takes the
 * first unused entry of its size within 64 entries of where the run is in
 * the plan, and goes to that place when the range is wholly free. What the
 * plan does not place goes above the highest planned byte when it fits
 * there, else where the placement rule puts it; a run that strays far
 * from the plan abandons it (plan.c says how). The plan applies while the
 * pool has one region. Sizes and offsets must be multiples of the
 * granularity, each entry must end below BFC_SIZE_LIMIT, and n < 2^32 (else
 * BFC_ERR_INVALID, and the pool keeps its plan). The entries are copied; n = 0 removes the plan. Each call starts
 * the run at the plan's first entry.
 */
typedef struct bfc_plan_entry {
    uint64_t size;
    uint64_t offset;
} bfc_plan_entry;

bfc_status bfc_pool_set_plan(bfc_pool *pool, const bfc_plan_entry *entries, size_t n);

/* Frees the allocation that starts at addr; the memory is reusable at once.
 * addr 0 is a no-op that succeeds. Bad pointers change nothing. */
bfc_status bfc_pool_free(bfc_pool *pool, bfc_addr addr);

/*
 * Frees the allocation at addr into `lane`, where it waits until fence
 * `token` completes (bfc_pool_retire, or the backend's fence_done on the slow
 * path). Tokens given to one lane must not decrease. The engine picks the
 * oldest token across lanes first when it must wait, so owners should draw
 * tokens from one counter per pool.
 */
bfc_status bfc_pool_free_fenced(bfc_pool *pool, bfc_addr addr, uint32_t lane,
                                uint64_t token);

/*
 * Frees the allocation at addr into `lane`'s open epoch, the engine choosing
 * the token: the first deferred free after a seal opens a new epoch with the
 * next token of the pool's counter. Before an allocation (every
 * fence_interval-th one, and whenever nothing fits) the pool seals every
 * open epoch (backend.fence_seal), so a fence is always made *after* the
 * frees it covers, and polls the oldest sealed token (fence_done without
 * waiting). Token choice and free happen under the pool lock, so no free can
 * slip in after its epoch's fence. Do not mix with bfc_pool_free_fenced on
 * the same lane.
 */
bfc_status bfc_pool_free_deferred(bfc_pool *pool, bfc_addr addr, uint32_t lane);

/* Seals the lane's open epoch now, if any (before its stream goes away).
 * Returns false when the backend could not seal it. */
bool bfc_pool_seal_lane(bfc_pool *pool, uint32_t lane);

/* Opens a lane. reusable: allocations on this lane may take its pending
 * chunks before they retire. */
bfc_status bfc_pool_lane_open(bfc_pool *pool, bool reusable, uint32_t *lane);

/* A lazy lane's open epoch is sealed only when the pool needs its memory:
 * when nothing else serves an allocation, before the pool grows or maps
 * more, on a trim or an explicit seal, and once the lazy lanes hold 1/32 of
 * the bytes in use in a pool that grows, or in a preallocated one whose
 * other free space is under four times that (lanes.c); never at the fence
 * interval. For an
 * owner whose seal makes an epoch reusable at once (its fence orders every
 * later use after the frees) but costs calls to make: then waiting to seal
 * loses no memory and saves a seal on nearly every allocation. Lanes start
 * eager. */
void bfc_pool_lane_set_lazy(bfc_pool *pool, uint32_t lane, bool lazy);

/* Closes a lane: it accepts no more frees or allocations; its open epoch is
 * sealed, its pending chunks still wait for their tokens, and the lane's slot
 * is recycled once empty. */
void bfc_pool_lane_close(bfc_pool *pool, uint32_t lane);
/* The same, but when the backend refuses to seal the lane's open epoch now
 * (its stream is going away, and a later seal could not name it), that
 * epoch's chunks move into lane `into`'s open epoch instead, whose fence
 * the owner makes cover the closed lane's work too. `into` must not be
 * reusable (its allocations would take the moved blocks before any fence);
 * a reusable one is ignored, as a closed one is: the epoch stays and is
 * sealed later, if it ever can be. */
void bfc_pool_lane_close_into(bfc_pool *pool, uint32_t lane, uint32_t into);
/* Closes a lane whose stream is gone and whose handle may already name
 * another stream: no seal is attempted (it would fence the wrong stream's
 * work); the open epoch, if any, moves into lane `into`'s open epoch, whose
 * fence the owner makes cover every stream. Sealed epochs keep their
 * tokens. As for bfc_pool_lane_close_into, a reusable `into` is ignored. */
void bfc_pool_lane_retire_into(bfc_pool *pool, uint32_t lane, uint32_t into);

/* Makes every chunk of `lane` whose token is <= `completed` free. */
void bfc_pool_retire(bfc_pool *pool, uint32_t lane, uint64_t completed);

/* Oldest pending token of a lane; false when the lane holds nothing. */
bool bfc_pool_lane_oldest(bfc_pool *pool, uint32_t lane, uint64_t *token);

/* Returns every region that holds no allocated or pending chunk to the
 * backend (with vmm: unmaps every granule that lies wholly in free space and
 * keeps the address space), after sealing open epochs and retiring the
 * fences the backend already reports done (it never waits for one); returns
 * the number of bytes released. */
uint64_t bfc_pool_trim(bfc_pool *pool);

/*
 * Loans: part of the limit lent to memory that the owner makes itself and
 * the pool never places (the shim's virtual memory door: physical
 * allocations a program makes with cuMemCreate and maps at its own
 * addresses), so that one limit covers both. bfc_pool_lend makes room for
 * `bytes` under the limit: it gives back free memory as pressure does (free
 * granules over virtual memory, largest free chunks first; empty regions
 * otherwise), retiring what the GPU finished and, only when that is not
 * enough, waiting for the oldest fences, never handing back memory whose
 * fence is not done. BFC_ERR_OOM when even then the pool holds more than
 * the limit less the loan allows (nothing changed). The loan lasts until
 * bfc_pool_end_loan gives the same bytes back; meanwhile the pool maps (or
 * holds in regions) at most bytes_limit - bytes_lent.
 */
bfc_status bfc_pool_lend(bfc_pool *pool, uint64_t bytes);
void bfc_pool_end_loan(bfc_pool *pool, uint64_t bytes);

/* vmm: the pool's context is going away and its memory must go with it
 * (cuCtxDestroy does not free what cuMemCreate made). Unmaps every granule,
 * live allocations included, and makes every later mapping fail; the
 * address space stays reserved. Only for a pool that will never be used
 * again, which other threads may still be leaving (so it is not destroyed).
 * Returns the bytes unmapped; 0 without vmm. */
uint64_t bfc_pool_abandon_memory(bfc_pool *pool);

/* vmm: calls fn for every run of mapped granules, in address order, with the
 * pool locked, so that no mapping is made or removed meanwhile (the shim
 * grants a peer device access to what is already mapped). fn must not call
 * into the pool. Nothing without vmm. */
void bfc_pool_each_mapped(bfc_pool *pool, void (*fn)(void *arg, bfc_addr addr, uint64_t size),
                          void *arg);

/* True when addr lies inside one of the pool's regions. */
bool bfc_pool_owns(bfc_pool *pool, bfc_addr addr);


/* Writes one line describing what addr is to the pool (for error messages):
 * "live allocation", "interior of ...", "inside free block ...", ... */
void bfc_pool_describe(bfc_pool *pool, bfc_addr addr, char *buf, size_t len);

void bfc_pool_stats(bfc_pool *pool, bfc_stats *out);

/*
 * Free space as the limit lets the pool use it. Without vmm a free chunk is
 * memory, and these are bfc_stats' figures. Over virtual memory a free chunk
 * is address space: the pool can put memory behind it only while the
 * granules it maps, with those that live and pending blocks pin (a granule
 * any of their bytes touch), stay within limit_bytes; free granules it holds
 * elsewhere move under a block that needs them (pressure). So:
 *   free_bytes                free bytes in pinned granules, plus as many
 *                             whole free granules as the limit has room for
 *                             beside the pinned ones;
 *   largest_free_block_bytes  the largest block one free chunk can hold at
 *                             either end with that memory (every byte of it
 *                             backed, no pending block waited for);
 *   fragmentation             (free - largest) / free, as in bfc_stats;
 *   beyond_limit_bytes        free address space no memory can be put
 *                             behind: the free chunks' bytes past free_bytes.
 * bfc_stats, by contrast, counts every free chunk whole. Walks every chunk:
 * for reports, not for a hot path.
 */
typedef struct bfc_free_space {
    uint64_t free_bytes;
    uint64_t largest_free_block_bytes;
    double fragmentation;
    uint64_t beyond_limit_bytes;
} bfc_free_space;
void bfc_pool_free_space(bfc_pool *pool, bfc_free_space *out);
/* Restarts high_bytes_in_use (BFC_HIGH_IN_USE) and/or high_pool_bytes
 * (BFC_HIGH_POOL) at their current values. */
enum { BFC_HIGH_IN_USE = 1, BFC_HIGH_POOL = 2 };
void bfc_pool_reset_highs(bfc_pool *pool, unsigned which);
/* The same, or false when another thread holds the pool for max_ms more. */
bool bfc_pool_stats_within(bfc_pool *pool, bfc_stats *out, unsigned max_ms);
/* Statistics and free space (bfc_pool_free_space) taken under one hold of
 * the pool, or false as bfc_pool_stats_within. */
bool bfc_pool_report_within(bfc_pool *pool, bfc_stats *st, bfc_free_space *fs, unsigned max_ms);
void bfc_pool_options(bfc_pool *pool, bfc_options *out);

/* Up to n live allocations, largest first: base, rounded size, requested
 * size, allocation sequence number (age). Returns how many were written. */
typedef struct bfc_live_info {
    bfc_addr addr;
    uint64_t size;
    uint64_t requested;
    uint64_t seq;
} bfc_live_info;
size_t bfc_pool_largest_live(bfc_pool *pool, bfc_live_info *out, size_t n);

/* Finds the live allocation containing addr (its base, sizes and allocation
 * sequence number: no two allocations of a pool share one). Costs a hash
 * lookup when addr is a base, a walk of its region otherwise. */
bfc_status bfc_pool_block(bfc_pool *pool, bfc_addr addr, bfc_live_info *out);
/* The same, only its base and requested size. */
bfc_status bfc_pool_lookup(bfc_pool *pool, bfc_addr addr, bfc_addr *base,
                           uint64_t *size);

/* Calls fn for every chunk of every region in address order (pool locked). */
typedef enum bfc_chunk_kind {
    BFC_CHUNK_FREE,
    BFC_CHUNK_ALLOCATED,
    BFC_CHUNK_PENDING,
} bfc_chunk_kind;
typedef struct bfc_chunk_info {
    bfc_addr addr;
    uint64_t size;
    uint64_t requested; /* allocated and pending chunks */
    uint64_t seq;       /* allocated: allocation sequence; pending: token */
    uint32_t region;    /* index of the region in address order */
    uint32_t lane;      /* pending chunks */
    bfc_chunk_kind kind;
} bfc_chunk_info;
typedef void (*bfc_chunk_visitor)(void *arg, const bfc_chunk_info *chunk);
void bfc_pool_visit(bfc_pool *pool, bfc_chunk_visitor fn, void *arg);
/* The same, for a caller holding the pool's lock (bfc_pool_lock): one that
 * must see the chunks and act on what it saw with no allocation between. */
void bfc_pool_visit_locked(bfc_pool *pool, bfc_chunk_visitor fn, void *arg);

/* Memory-map dump for OOM reports and debugging. */
enum {
    BFC_DUMP_SUMMARY = 1u << 0,   /* stats in TSL's DebugString layout */
    BFC_DUMP_BINS = 1u << 1,      /* one line per non-empty bin */
    BFC_DUMP_CHUNKS = 1u << 2,    /* every chunk */
    BFC_DUMP_OCCUPANCY = 1u << 3, /* a 100-column map per region */
    BFC_DUMP_ALL = 0xfu,
};
void bfc_pool_dump(bfc_pool *pool, FILE *out, unsigned what);

/*
 * Checks every structural invariant (see check.c) and that the statistics
 * equal a recount. Returns the number of violations; describes up to a few of
 * them on `err` when it is not NULL.
 */
size_t bfc_pool_check(bfc_pool *pool, FILE *err);

/* Hold / release the pool's lock: for fork handlers, and around
 * bfc_pool_visit_locked. */
void bfc_pool_lock(bfc_pool *pool);
void bfc_pool_unlock(bfc_pool *pool);
/* The same, giving up when another thread holds the lock for max_ms more
 * (it may be waiting for a GPU that never finishes): for exit-time reports. */
bool bfc_pool_lock_within(bfc_pool *pool, unsigned max_ms);

#ifdef __cplusplus
}
#endif
#endif
