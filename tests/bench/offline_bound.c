/*
 * offline_bound - how small a pool could serve a trace if every allocation's
 * lifetime were known in advance: the gap that online placement leaves.
 *
 *   zcat trace.csv.gz | build/tests/offline_bound
 *
 * Reads an RMM-format trace on stdin and packs it as `bfcshim plan` does
 * (shim/cli/offline_pack.c: greedy orders, sizes rounded to 256
 * bytes). The result is an achievable pool, so peak / pool is a lower bound
 * on what an offline planner reaches; peak itself is the absolute limit.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offline_pack.h"

int main(void)
{
    trace t;
    char line[1024];
    if (!trace_init(&t, "stdin"))
        return 2;
    while (fgets(line, sizeof line, stdin))
        if (!trace_feed_line(&t, line, strlen(line))) {
            fprintf(stderr, "offline_bound: %s\n", t.error);
            return 2;
        }
    trace_finish(&t);
    bfc_plan_entry *placed = calloc(t.nslots ? t.nslots : 1, sizeof *placed);
    uint64_t pool = placed ? offline_pack(&t, 256, placed) : 0;
    if (t.nslots && !pool) {
        fprintf(stderr, "offline_bound: out of host memory\n");
        return 2;
    }
    printf("{\"allocations\": %" PRIu32 ", \"peak_live_bytes\": %" PRIu64
           ", \"offline_pool_bytes\": %" PRIu64 ", \"offline_efficiency\": %.4f}\n",
           t.nslots, t.peak_live_bytes, pool, pool ? (double)t.peak_live_bytes / (double)pool : 1.0);
    free(placed);
    trace_free(&t);
    return 0;
}
