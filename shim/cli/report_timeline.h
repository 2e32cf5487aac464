/*
 * report_timeline.h - the data of the report's allocation timeline (the
 * view PyTorch's memory_viz calls "active memory timeline"): the largest
 * allocations as bands over time, stacked on the page, and the bytes of
 * all the others as one band beneath them.
 */
#ifndef BFCSHIM_CLI_REPORT_TIMELINE_H
#define BFCSHIM_CLI_REPORT_TIMELINE_H

#include <stdbool.h>

#include "json_out.h"
#include "trace_csv.h"

enum {
    TIMELINE_BANDS = 300,   /* allocations drawn one by one: the largest */
    TIMELINE_SAMPLES = 2000 /* moments the page stacks them at */
};

/* Writes the member "timeline" into the open object of j: "event" of each
 * sample, "x" of each (its time when by_time, else its event: the x axis of
 * the page's other charts, report_write_x), "other" (live bytes outside the
 * bands at each sample)
 * and "bands": [alloc event, free event (events: never freed), size, first
 * sample, end sample, where it was made (or null)] in allocation order.
 * frames:
 * a frames file (scripts/snapshot2csv.py --frames: after a '#' line, one
 * line per allocation in trace order) or NULL. False when out of host
 * memory (then "timeline" is null). */
bool report_timeline_write(const trace *t, const char *frames, bool by_time, json_out *j);

#endif
