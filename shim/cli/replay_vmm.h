/* replay_vmm.h - replay --vmm: the memory a trace needs from a pool over
 * virtual memory, against growth-mode regions (replay_vmm.c). */
#ifndef BFCSHIM_CLI_REPLAY_VMM_H
#define BFCSHIM_CLI_REPLAY_VMM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "bfc.h"
#include "trace_csv.h"

#define VMM_CURVE_POINTS 64
#define PREALLOC_POINTS 5 /* limits the preallocated pool is replayed at */

typedef struct replay_vmm_report {
    /* Smallest limit on mapped bytes that serves the trace (0: none found),
     * and the map/unmap calls a run at that limit makes. */
    uint64_t min_limit_bytes;
    uint64_t tight_map_calls, tight_unmap_calls;
    /* The pool preallocated over virtual memory (the whole limit mapped at
     * creation): its smallest limit, and at that limit [0], 1% above it
     * [1], at one region's smallest pool [2] (where the default on one
     * cuMemAlloc region serves the trace with no mapping at all) and 2% and
     * 5% above that [3], [4] (how far above one region's limit remapping
     * goes on), each 0 when below [0]: the map/unmap calls, the bytes
     * unmapped to be mapped elsewhere, the allocations moved to mapped
     * memory instead (num_mapped_refits), failures (0 expected), and the
     * physical memory the device made after the start (what moved under
     * pressure was kept, not made again: bfc_backend.keep). */
    uint64_t prealloc_min_limit_bytes;
    uint64_t prealloc_limit[PREALLOC_POINTS], prealloc_failures[PREALLOC_POINTS],
        prealloc_map_calls[PREALLOC_POINTS], prealloc_unmap_calls[PREALLOC_POINTS],
        prealloc_unmapped_bytes[PREALLOC_POINTS], prealloc_created_bytes[PREALLOC_POINTS],
        prealloc_mapped_refits[PREALLOC_POINTS];
    /* One run with room to spare, at the policy's release threshold;
     * growth_moves: allocations that moved free granules rather than map
     * past the growth headroom. */
    uint64_t peak_mapped_bytes, map_calls, unmap_calls, released_bytes, growth_moves;
    uint64_t fence_waits, regions_fence_waits; /* --gpu-lag: the host blocked */
    uint64_t unlimited_failures;
    /* Growth-mode regions (no virtual memory), with room to spare. */
    uint64_t regions_peak_bytes, regions_count, regions_failures;
    uint64_t regions_min_limit_bytes;
    /* Samples of the unlimited runs: after event curve_event[i] the virtual
     * pool mapped curve_mapped[i], growth mode held curve_regions[i], and
     * curve_live[i] bytes were requested and live; curve_points of them. */
    size_t curve_points;
    uint64_t curve_event[VMM_CURVE_POINTS], curve_mapped[VMM_CURVE_POINTS],
        curve_regions[VMM_CURVE_POINTS], curve_live[VMM_CURVE_POINTS];
} replay_vmm_report;

/* Fills *out for trace t under `policy` (its placement, split rule,
 * map_granularity and release_threshold), frees fenced on a simulated GPU
 * `gpu_lag` events behind the host (0: frees are immediate); slot_addr
 * holds one address per slot of the trace, as for replay's own runs;
 * one_region_bytes is replay's smallest single region (0: not measured). */
void replay_vmm_measure(const trace *t, const bfc_options *policy, uint64_t gpu_lag,
                        uint64_t one_region_bytes, bfc_addr *slot_addr, replay_vmm_report *out);

/* Writes to f the memory map of the pool preallocated over virtual memory
 * (frees immediate) at the first allocation that fails one map granule
 * below its smallest limit, min_limit (replay_vmm_report's
 * prealloc_min_limit_bytes, measured with frees immediate; 0: none): where,
 * at the limit, blocks pin granules. */
void replay_vmm_dump_at_failure(const trace *t, const bfc_options *policy, uint64_t min_limit,
                                bfc_addr *slot_addr, FILE *f);

#endif
