/*
 * report_timeline.c - see report_timeline.h.
 *
 * The events are cut into S equal buckets and each bucket is sampled at
 * the event after which its live bytes are highest, so that the stack
 * follows the live-bytes chart's envelope and no peak is lost. A band is
 * live at the samples in [first, end): the first sample at or after its
 * allocation, up to the first at or after its free (samples are in event
 * order). An allocation that lives between two samples would vanish; it is
 * given one sample so that short-lived large blocks (workspaces) still show
 * as spikes. "other" counts only what is truly live at each sample, so the
 * stack's height is the live bytes there, spikes aside.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report_timeline.h"

#include "report_replay.h"

typedef struct band {
    size_t alloc_ev, free_ev;
    uint64_t size;
    size_t ordinal; /* among the trace's allocations: its line in a frames file */
    char *where;    /* that line, when there is a frames file */
} band;

/* Larger first; among equals, the longer-lived. */
static int by_size_desc(const void *a, const void *b)
{
    const band *x = a, *y = b;
    if (x->size != y->size)
        return x->size < y->size ? 1 : -1;
    size_t lx = x->free_ev - x->alloc_ev, ly = y->free_ev - y->alloc_ev;
    return lx < ly ? 1 : lx > ly ? -1 : 0;
}

static int by_alloc(const void *a, const void *b)
{
    const band *x = a, *y = b;
    return x->alloc_ev < y->alloc_ev ? -1 : x->alloc_ev > y->alloc_ev;
}

/* Reads the lines of the frames file that belong to the bands (sorted by
 * allocation, so by ordinal too): one pass, keeping only those. A file that
 * cannot be read leaves them NULL. */
static void read_frames(const char *path, band *bands, size_t nb)
{
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return;
    char *line = NULL;
    size_t cap = 0, ordinal = 0, b = 0;
    ssize_t len;
    while (b < nb && (len = getline(&line, &cap, f)) >= 0) {
        if (line[0] == '#')
            continue;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        while (b < nb && bands[b].ordinal < ordinal)
            b++;
        if (b < nb && bands[b].ordinal == ordinal && strcmp(line, "-") != 0)
            bands[b].where = strdup(line);
        ordinal++;
    }
    free(line);
    fclose(f);
}

/* The first sample taken at or after event e (S when none): samples[] is
 * increasing. */
static size_t sample_at_or_after(const size_t *samples, size_t S, size_t e)
{
    size_t lo = 0, hi = S;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (samples[mid] < e)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

bool report_timeline_write(const trace *t, const char *frames, bool by_time, json_out *j)
{
    size_t S = t->nev < TIMELINE_SAMPLES ? t->nev : TIMELINE_SAMPLES;
    band *all = calloc(t->allocs ? t->allocs : 1, sizeof *all);
    size_t *open = calloc(t->nslots ? t->nslots : 1, sizeof *open); /* slot -> band + 1 */
    uint64_t *live = calloc(S ? S : 1, sizeof *live);                /* at each sample */
    size_t *sample = calloc(S ? S : 1, sizeof *sample);              /* its event */
    int64_t *banded = calloc(S + 1, sizeof *banded);                 /* difference array */
    if (!all || !open || !live || !sample || !banded) {
        free(all), free(open), free(live), free(sample), free(banded);
        json_null(j, "timeline");
        return false;
    }
    size_t n = 0;
    uint64_t now = 0;
    for (size_t i = 0; i < t->nev; i++) {
        const trace_event *e = &t->ev[i];
        if (e->kind == TRACE_ALLOC) {
            if (n < t->allocs) {
                all[n] = (band){i, t->nev, e->size, n, NULL};
                open[e->slot] = ++n;
            }
            now += e->size;
        } else if (open[e->slot]) {
            band *b = &all[open[e->slot] - 1];
            b->free_ev = i;
            now -= b->size;
            open[e->slot] = 0;
        }
        size_t k = i * S / t->nev; /* bucket k holds events [k * nev / S, (k + 1) * nev / S) */
        if (i == (k * t->nev + S - 1) / S || now > live[k]) {
            live[k] = now;
            sample[k] = i;
        }
    }
    qsort(all, n, sizeof *all, by_size_desc);
    size_t nb = n < TIMELINE_BANDS ? n : TIMELINE_BANDS;
    qsort(all, nb, sizeof *all, by_alloc);
    read_frames(frames, all, nb);

    json_object_open(j, "timeline");
    json_array_open(j, "event");
    for (size_t k = 0; k < S; k++)
        json_u64(j, NULL, sample[k]);
    json_array_close(j);
    /* Where each sample lies on the page's x axis, the one the live-bytes
     * and fragmentation charts use (their times, or events), so that the
     * three line up under one cursor. */
    json_array_open(j, "x");
    for (size_t k = 0; k < S; k++)
        report_write_x(j, NULL, t, by_time, sample[k]);
    json_array_close(j);
    json_array_open(j, "bands");
    for (size_t b = 0; b < nb; b++) {
        size_t first = sample_at_or_after(sample, S, all[b].alloc_ev);
        size_t end = sample_at_or_after(sample, S, all[b].free_ev);
        banded[first] += (int64_t)all[b].size; /* truly live in [first, end) */
        banded[end > first ? end : first] -= (int64_t)all[b].size;
        json_array_open(j, NULL);
        json_u64(j, NULL, all[b].alloc_ev);
        json_u64(j, NULL, all[b].free_ev);
        json_u64(j, NULL, all[b].size);
        json_u64(j, NULL, first);
        json_u64(j, NULL, end > first ? end : first + 1 <= S ? first + 1 : S);
        json_string(j, NULL, all[b].where); /* NULL: null */
        free(all[b].where);
        json_array_close(j);
    }
    json_array_close(j);
    json_array_open(j, "other");
    int64_t in_bands = 0;
    for (size_t k = 0; k < S; k++) {
        in_bands += banded[k];
        json_u64(j, NULL, live[k] > (uint64_t)in_bands ? live[k] - (uint64_t)in_bands : 0);
    }
    json_array_close(j);
    json_object_close(j);
    free(all), free(open), free(live), free(sample), free(banded);
    return true;
}
