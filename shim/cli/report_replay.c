/*
 * report_replay.c - see report_replay.h.
 *
 * One pass of the trace through the engine in a simulated device. Maps are
 * the pool's chunks in address order; runs of chunks smaller than one pixel
 * of the page's map (12 rows of 1000) are merged into one entry, so that a
 * map stays a few thousand entries however many chunks the pool holds, and
 * the page stays light on traces of a million events. The fragmentation
 * series walks the chunks at FRAG_POINTS evenly spaced events.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "report_replay.h"
#include "sim_device.h"

/* ---- maps ------------------------------------------------------------------------ */

typedef struct entry {
    uint64_t offset, size, seq, requested;
    uint32_t region;
    bfc_chunk_kind kind;
} entry;

typedef struct map_writer {
    json_out *j;
    bfc_addr base;
    bool started;
    uint64_t pixel; /* chunks under this many bytes are merged */
    /* the run of small chunks being merged, and the bytes of each kind in it */
    entry run;
    bool in_run;
    uint64_t kind_bytes[3];
} map_writer;

static void emit(map_writer *m, const entry *e)
{
    /* [offset, size, kind, seq, requested, region] */
    json_array_open(m->j, NULL);
    json_u64(m->j, NULL, e->offset);
    json_u64(m->j, NULL, e->size);
    json_u64(m->j, NULL, (uint64_t)e->kind);
    json_u64(m->j, NULL, e->seq);
    json_u64(m->j, NULL, e->requested);
    json_u64(m->j, NULL, e->region);
    json_array_close(m->j);
}

/* A merged run shows as the kind that covers most of its bytes. */
static void flush_run(map_writer *m)
{
    if (!m->in_run)
        return;
    unsigned best = 0;
    for (unsigned k = 1; k < 3; k++)
        if (m->kind_bytes[k] > m->kind_bytes[best])
            best = k;
    m->run.kind = (bfc_chunk_kind)best;
    emit(m, &m->run);
    m->in_run = false;
    memset(m->kind_bytes, 0, sizeof m->kind_bytes);
}

static void visit_chunk(void *arg, const bfc_chunk_info *c)
{
    map_writer *m = arg;
    if (!m->started) {
        m->base = c->addr; /* chunks come in address order */
        m->started = true;
    }
    entry e = {c->addr - m->base, c->size, c->seq, c->requested, c->region, c->kind};
    if (m->in_run && (c->size >= m->pixel || c->region != m->run.region))
        flush_run(m);
    if (c->size >= m->pixel) {
        emit(m, &e);
        return;
    }
    if (!m->in_run) {
        m->run = e;
        m->in_run = true;
    } else {
        m->run.size += c->size;
        m->run.requested += c->requested;
        m->run.seq = c->seq > m->run.seq ? c->seq : m->run.seq;
    }
    if ((unsigned)c->kind < 3)
        m->kind_bytes[c->kind] += c->size;
}

void report_write_x(json_out *j, const char *key, const trace *t, bool by_time, size_t event)
{
    if (by_time)
        json_double(j, key, (double)(t->times[event] - t->first_us) / 1e6);
    else
        json_u64(j, key, event);
}

static void write_map(json_out *j, const report_replay *r, bfc_pool *pool, const char *label,
                      size_t event, uint64_t request, uint64_t newest_seq)
{
    bfc_stats st;
    bfc_pool_stats(pool, &st);
    json_object_open(j, NULL);
    json_string(j, "label", label);
    json_u64(j, "event", event);
    if (event < r->t->nev)
        report_write_x(j, "x", r->t, r->by_time, event);
    if (request)
        json_u64(j, "request", request);
    else
        json_null(j, "request");
    json_u64(j, "pool_bytes", st.pool_bytes);
    json_u64(j, "bytes_in_use", st.bytes_in_use);
    json_u64(j, "largest_free_block_bytes", st.largest_free_block_bytes);
    json_u64(j, "newest_seq", newest_seq);
    json_array_open(j, "chunks");
    map_writer m = {.j = j, .pixel = st.pool_bytes / 12000 + 1};
    bfc_pool_visit(pool, visit_chunk, &m);
    flush_run(&m);
    json_array_close(j);
    json_u64(j, "base", m.base);
    json_object_close(j);
}

/* ---- fragmentation --------------------------------------------------------------- */

typedef struct frag_sample {
    uint64_t free_by_class[HOLE_CLASSES];
    uint64_t largest, pending;
} frag_sample;

static unsigned hole_class(uint64_t size)
{
    const uint64_t MiB = UINT64_C(1) << 20;
    return size < MiB ? 0 : size < 16 * MiB ? 1 : size < 256 * MiB ? 2 : 3;
}

static void visit_hole(void *arg, const bfc_chunk_info *c)
{
    frag_sample *s = arg;
    if (c->kind == BFC_CHUNK_FREE) {
        s->free_by_class[hole_class(c->size)] += c->size;
        if (c->size > s->largest)
            s->largest = c->size;
    } else if (c->kind == BFC_CHUNK_PENDING) {
        s->pending += c->size;
    }
}

/* ---- the pass -------------------------------------------------------------------- */

/* Replays one event; false when the pool cannot serve an allocation (its
 * slot then holds nothing, and a later free of it is a no-op). */
static bool replay_event(bfc_pool *pool, const trace_event *e, bfc_addr *slot_addr,
                         uint64_t *seq)
{
    if (e->kind == TRACE_FREE) {
        bfc_pool_free(pool, slot_addr[e->slot]);
        slot_addr[e->slot] = 0;
        return true;
    }
    if (bfc_pool_alloc(pool, e->size, BFC_NO_LANE, &slot_addr[e->slot]) == BFC_OK) {
        (*seq)++;
        return true;
    }
    slot_addr[e->slot] = 0;
    return false;
}

bool report_replay_write(const report_replay *r, json_out *j)
{
    const trace *t = r->t;
    bfc_addr *slot_addr = calloc(t->nslots ? t->nslots : 1, sizeof *slot_addr);
    size_t nsamples = t->nev < FRAG_POINTS ? t->nev : FRAG_POINTS;
    frag_sample *frag = calloc(nsamples ? nsamples : 1, sizeof *frag);
    size_t *frag_event = calloc(nsamples ? nsamples : 1, sizeof *frag_event);
    /* The cursor's maps are taken in the same pass but belong to a later
     * member of the page's object: they are written aside, into memory. */
    char *cursor_text = NULL;
    size_t cursor_len = 0, ncursor = t->nev < CURSOR_MAPS ? t->nev : CURSOR_MAPS, next = 0;
    FILE *cursor_file = r->cursor ? open_memstream(&cursor_text, &cursor_len) : NULL;
    json_out cj;
    if (cursor_file) {
        json_begin(&cj, cursor_file, false);
        json_array_open(&cj, NULL);
    }
    sim_device dev;
    bfc_backend backend = {0};
    bfc_pool *pool = slot_addr && frag && frag_event && (cursor_file || !r->cursor)
                         ? replay_pool_create(&dev, r->policy, r->pool_bytes, &backend)
                         : NULL;
    uint64_t seq = 0, failures = 0;
    size_t done = 0;

    /* Maps at the failure and the peak go in "maps" as the pass reaches
     * them; fragmentation samples are collected for after. */
    json_array_open(j, "maps");
    bool failure_shown = false;
    for (size_t i = 0; pool && i < t->nev; i++) {
        const trace_event *e = &t->ev[i];
        if (!failure_shown && i == t->first_failure_at) {
            write_map(j, r, pool, "at the job's first allocation failure", i, t->first_failure_size,
                      seq);
            failure_shown = true;
        }
        if (!replay_event(pool, e, slot_addr, &seq)) {
            failures++;
            if (!failure_shown) {
                write_map(j, r, pool, "at the first allocation this pool cannot serve", i, e->size,
                          seq);
                failure_shown = true;
            }
        }
        if (i == r->peak_at)
            write_map(j, r, pool, "at the peak of live bytes", i, 0, seq);
        /* sample k is taken after event (k + 1) * nev / nsamples - 1 */
        while (done < nsamples && i + 1 >= (done + 1) * t->nev / nsamples) {
            frag_event[done] = i;
            bfc_pool_visit(pool, visit_hole, &frag[done]);
            done++;
        }
        if (cursor_file && next < ncursor && i + 1 >= (next + 1) * t->nev / ncursor) {
            write_map(&cj, r, pool, "at the cursor", i, 0, seq);
            next++;
        }
    }
    if (pool && !failure_shown && t->first_failure_at == t->nev) /* the last line failed */
        write_map(j, r, pool, "at the job's first allocation failure", t->nev,
                  t->first_failure_size, seq);
    json_array_close(j);
    json_u64(j, "replay_failures", failures);
    bool ok = pool != NULL;
    if (pool)
        bfc_pool_destroy(pool, true);

    json_object_open(j, "frag");
    json_array_open(j, "x");
    for (size_t k = 0; k < done; k++)
        report_write_x(j, NULL, t, r->by_time, frag_event[k]);
    json_array_close(j);
    json_array_open(j, "event");
    for (size_t k = 0; k < done; k++)
        json_u64(j, NULL, frag_event[k]);
    json_array_close(j);
    json_array_open(j, "largest");
    for (size_t k = 0; k < done; k++)
        json_u64(j, NULL, frag[k].largest);
    json_array_close(j);
    json_array_open(j, "pending");
    for (size_t k = 0; k < done; k++)
        json_u64(j, NULL, frag[k].pending);
    json_array_close(j);
    json_array_open(j, "free_by_class"); /* one array per class */
    for (unsigned c = 0; c < HOLE_CLASSES; c++) {
        json_array_open(j, NULL);
        for (size_t k = 0; k < done; k++)
            json_u64(j, NULL, frag[k].free_by_class[c]);
        json_array_close(j);
    }
    json_array_close(j);
    json_object_close(j);

    if (cursor_file) {
        json_array_close(&cj);
        ok = fclose(cursor_file) == 0 && ok;
        json_raw(j, "cursor_maps", cursor_text ? cursor_text : "[]");
        free(cursor_text);
    } else if (r->cursor) {
        json_raw(j, "cursor_maps", "[]");
        ok = false;
    }
    free(frag_event);
    free(frag);
    free(slot_addr);
    return ok;
}
