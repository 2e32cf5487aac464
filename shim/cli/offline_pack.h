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
 * longest-lived first, largest area first), each once with the blocks still
 * live at the trace's end leading and once without, and the smallest pool
 * is kept.
 * O(n^2 log n) for n allocations: seconds at 10^4.
 */
#ifndef BFCSHIM_CLI_OFFLINE_PACK_H
#define BFCSHIM_CLI_OFFLINE_PACK_H

#include <stdint.h>

#include "bfc.h"
#include "trace_csv.h"

/* Packs t's allocations; out[i] receives the i-th allocation's rounded size
 * and offset (t->nslots entries: a plan in recorded order). Returns the pool
 * size the packing needs, or 0 when host memory runs out (or the trace
 * allocates nothing). Sizes and offsets saturate at UINT64_MAX: a packing
 * that needs 2^64 bytes or more returns UINT64_MAX. */
uint64_t offline_pack(const trace *t, uint64_t granularity, bfc_plan_entry *out);

#endif
