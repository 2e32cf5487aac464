/*
 * plan_file.h - placement plans on disk: written by `bfcshim plan`, read by
 * the shim (BFCSHIM_PLAN) and by `bfcshim replay --plan`.
 *
 * A text file, so that a person can read and diff it:
 *   bfcshim-plan 1
 *   granularity 256
 *   pool_bytes 17008416512
 *   entries 7012
 *   <size> <offset>          one line per allocation, in recorded order
 * Sizes are rounded to the granularity, a power of two from 256 to 1 MiB
 * (BFCSHIM_ALIGNMENT's range; any other is refused as it is read); offsets
 * count from the pool's region base; pool_bytes is the region the packing
 * needs. Lines starting with '#' are comments.
 *
 * Also the one line that says how a run followed its plan, so that the
 * shim's summary and `bfcshim replay` say it in the same words.
 */
#ifndef BFCSHIM_COMMON_PLAN_FILE_H
#define BFCSHIM_COMMON_PLAN_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bfc.h"

typedef struct plan_file {
    uint64_t granularity;
    uint64_t pool_bytes;
    bfc_plan_entry *entries;
    size_t n;
} plan_file;

/* Reads a plan; false with a one-line reason in err ("file:line: what"). */
bool plan_file_read(const char *path, plan_file *out, char *err, size_t errlen);
/* Writes one; false with errno set. */
bool plan_file_write(const char *path, const plan_file *plan);
void plan_file_free(plan_file *plan);

/* How a pool followed its plan, from its statistics: "N allocations where it
 * said, K places not free, S above it", and "; abandoned: ..." when it was.
 * Writes at most len bytes, terminated. */
void plan_counts_text(const bfc_stats *st, char *buf, size_t len);

#endif
