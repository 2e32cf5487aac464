/*
 * trace_csv.h - reading RMM logging CSV traces into replayable events.
 *
 * Format (rapidsai/rmm logging_resource_adaptor):
 *   Thread,Time,Action,Pointer,Size,Stream
 *   0,23:19:47:416286,allocate,0x7feac2200000,5242880,0
 * Action is `allocate`, `free` or `allocate failure`; Time is HH:MM:SS:us;
 * Pointer is hex (0x..., or (nil)); Stream is a number (decimal or hex).
 *
 * Parsing resolves every free to the allocation it ends, so the replay loop
 * touches no hash table of its own: events name allocation slots.
 *   - a free of a pointer that is not live is counted and skipped;
 *   - an allocation of a pointer that is still live means the trace lost the
 *     earlier free (windows of longer runs do): the earlier block is assumed
 *     leaked, counted, and the pointer now names the new block;
 *   - `allocate failure` lines and zero-size allocations are counted, skipped;
 *   - an allocation that takes the live bytes past 2^64 - 1 is malformed
 *     (every figure of the trace would wrap); any size alone is accepted;
 *   - anything else malformed stops parsing with "name:line: what".
 * trace_load refuses a file without one row of data (empty, or the header
 * alone) and names a gzip file that is cut short or damaged as such, not
 * by the half line it ends with.
 */
#ifndef BFCSHIM_CLI_TRACE_CSV_H
#define BFCSHIM_CLI_TRACE_CSV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ptr_map.h"

enum { TRACE_ALLOC = 0, TRACE_FREE = 1 };

typedef struct trace_event {
    uint64_t size; /* allocations: bytes */
    uint32_t slot; /* the allocation this event makes or ends */
    uint32_t kind;
} trace_event;

typedef struct trace {
    char name[256];
    trace_event *ev;
    size_t nev, cap;
    uint32_t nslots;
    uint64_t lines;
    uint64_t allocs, frees;
    uint64_t unmatched_frees;   /* frees of pointers never (or no longer) live */
    uint64_t failed_allocs;     /* `allocate failure` lines */
    uint64_t zero_size_allocs;
    uint64_t leaked_reuses;     /* allocations of a still-live pointer */
    uint64_t live_bytes, peak_live_bytes;
    uint64_t total_alloc_bytes; /* saturates at UINT64_MAX */
    uint64_t first_us, last_us; /* time of the first and last event */
    uint64_t day_us;            /* days crossed so far, in microseconds */
    bool saw_header;
    /* trace_load_with_times: the time of every event (us, parallel to ev).
     * Always: where the first `allocate failure` line fell (the number of
     * events before it, SIZE_MAX if none) and what it asked for. */
    bool keep_times;
    uint64_t *times;
    size_t first_failure_at;
    uint64_t first_failure_size;
    ptr_map ptr_to_slot;       /* parsing: live pointer -> allocate event + 1 */
    char error[320];            /* set when a line is malformed */
} trace;

bool trace_init(trace *t, const char *name);
/* Feeds one line (without or with its newline). Returns false on a malformed
 * line (t->error says why) or when host memory runs out. */
bool trace_feed_line(trace *t, const char *line, size_t len);
/* Drops the parsing state; the events stay. */
void trace_finish(trace *t);
void trace_free(trace *t);

/* Reads a whole file (gzip-compressed when built with zlib). Returns false
 * with t->error set on I/O or format errors. */
bool trace_load(trace *t, const char *path);
/* The same, keeping every event's time in t->times. */
bool trace_load_with_times(trace *t, const char *path);

#endif
