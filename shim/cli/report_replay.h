/*
 * report_replay.h - the part of `bfcshim report` that replays the trace
 * through the engine: the pool's maps (at the peak, at the first failure,
 * and at evenly spaced moments for the page's time cursor) and the
 * fragmentation series (free space by hole size, the largest free block).
 */
#ifndef BFCSHIM_CLI_REPORT_REPLAY_H
#define BFCSHIM_CLI_REPORT_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bfc.h"
#include "json_out.h"
#include "trace_csv.h"

enum {
    CURSOR_MAPS = 24,  /* maps for the time cursor */
    FRAG_POINTS = 400, /* samples of the fragmentation series */
    HOLE_CLASSES = 4,  /* < 1 MiB, 1-16 MiB, 16-256 MiB, >= 256 MiB */
};

typedef struct report_replay {
    const trace *t;
    const bfc_options *policy;
    uint64_t pool_bytes;
    size_t peak_at; /* the event after which live bytes peak */
    bool by_time;   /* x values are seconds since the first event, else event indexes */
    bool cursor;    /* also the time cursor's maps */
} report_replay;

/* An event's x on the page: seconds since the first event when by_time, else
 * its index (key NULL inside arrays). */
void report_write_x(json_out *j, const char *key, const trace *t, bool by_time, size_t event);

/* Writes the members "maps", "frag", "replay_failures" and, with cursor,
 * "cursor_maps" into the open object of j. False when the engine could not
 * be set up (then the members are written empty). */
bool report_replay_write(const report_replay *r, json_out *j);

#endif
