/*
 * offline_pack.h - packing a trace's allocations with every lifetime known:
 * the bound online placement is measured against, and the plan that
 * `bfcshim plan` writes.
 *
 * Each allocation is a rectangle: its lifetime in events by its size
 * (rounded to the granularity). Rectangles are placed one at a time at the
 * lowest offset where they overlap no rectangle already placed that is live
 * at the same time. Finding the optimum is NP-hard (dynamic storage
 * allocation); greedy orders come close, so three are tried (largest first,
 * longest-lived first, largest area first) and the smallest pool is kept.
 * O(n^2 log n) for n allocations: seconds at 10^4.
 */
#ifndef BFCSHIM_CLI_OFFLINE_PACK_H
#define BFCSHIM_CLI_OFFLINE_PACK_H

#include <stdint.h>

#include "trace_csv.h"

/* Packs t's allocations; offsets[i] receives the offset of the i-th
 * allocation (t->nslots entries). Returns the pool size the packing needs,
 * or 0 when host memory runs out (or the trace allocates nothing). */
uint64_t offline_pack(const trace *t, uint64_t granularity, uint64_t *offsets);

#endif
