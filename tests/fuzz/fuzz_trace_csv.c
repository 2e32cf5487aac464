/*
 * fuzz_trace_csv.c - libFuzzer target for the RMM CSV parser: any input is
 * split into lines and fed to it. Whatever it accepts must be a well-formed
 * event list (every free names an earlier allocation's slot, counts add up),
 * which is then replayed through a pool with the invariant checker on.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bfc.h"
#include "sim_device.h"
#include "trace_csv.h"

static void must(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_trace_csv: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    trace t;
    must(trace_init(&t, "fuzz"), "init");
    const char *s = (const char *)data;
    bool ok = true;
    size_t start = 0;
    for (size_t i = 0; ok && i <= size; i++)
        if (i == size || s[i] == '\n') {
            ok = trace_feed_line(&t, s + start, i - start);
            start = i + 1;
        }
    trace_finish(&t);
    if (!ok) {
        must(strncmp(t.error, "fuzz:", 5) == 0, "error without the trace's name");
        trace_free(&t);
        return 0;
    }
    must(t.nev == t.allocs + t.frees, "events do not add up");
    bool *live = calloc(t.nslots + 1, 1);
    uint64_t bytes = 0, peak = 0;
    uint64_t *sizes = calloc(t.nslots + 1, sizeof *sizes);
    must(live && sizes, "host memory");
    for (size_t i = 0; i < t.nev; i++) {
        const trace_event *e = &t.ev[i];
        must(e->slot < t.nslots, "slot out of range");
        if (e->kind == TRACE_ALLOC) {
            must(!live[e->slot] && e->size > 0, "slot reused or zero size");
            live[e->slot] = true;
            sizes[e->slot] = e->size;
            bytes += e->size;
            if (bytes > peak)
                peak = bytes;
        } else {
            must(live[e->slot], "free of a slot that is not live");
            live[e->slot] = false;
            bytes -= sizes[e->slot];
        }
    }
    must(peak == t.peak_live_bytes, "peak live bytes disagree");

    /* Replay it (small sizes only, so that inputs stay cheap). */
    sim_device dev;
    sim_device_init(&dev, UINT64_C(1) << 40);
    bfc_backend b = sim_device_backend(&dev);
    bfc_options o;
    bfc_options_init(&o);
    o.limit_bytes = UINT64_C(1) << 24;
    o.region_granularity = 256;
    bfc_pool *pool = bfc_pool_create(&o, &b);
    bfc_addr *addr = calloc(t.nslots + 1, sizeof *addr);
    must(pool && addr, "pool");
    for (size_t i = 0; i < t.nev; i++) {
        const trace_event *e = &t.ev[i];
        if (e->kind == TRACE_ALLOC) {
            bfc_status st = bfc_pool_alloc(pool, e->size, BFC_NO_LANE, &addr[e->slot]);
            must(st == BFC_OK || st == BFC_ERR_OOM || st == BFC_ERR_TOO_LARGE, "alloc status");
            if (st != BFC_OK)
                addr[e->slot] = 0;
        } else {
            must(bfc_pool_free(pool, addr[e->slot]) == BFC_OK, "free status");
        }
    }
    must(bfc_pool_check(pool, stderr) == 0, "invariant violated");
    bfc_pool_destroy(pool, true);
    free(addr), free(live), free(sizes);
    trace_free(&t);
    return 0;
}
