/*
 * offline_bound - how small a pool could serve a trace if every allocation's
 * lifetime were known in advance: the gap that online placement leaves.
 *
 *   zcat trace.csv.gz | build/tests/offline_bound
 *
 * Reads an RMM-format trace (Thread,Time,Action,Pointer,Size,Stream) on
 * stdin, rounds sizes up to 256 bytes as the engine does, and packs the
 * allocations offline: each is a rectangle (its lifetime in events by its
 * size), and rectangles are placed one by one at the lowest offset where
 * they overlap no already-placed rectangle that is live at the same time.
 * Finding the optimum is NP-hard (dynamic storage allocation); greedy orders
 * come close, so three are tried (largest first, longest-lived first, largest
 * area first) and the smallest pool is reported. The result is an
 * achievable pool, so peak / pool is a lower bound on what an offline
 * planner reaches; peak itself is the absolute limit.
 *
 * O(n^2 log n) for n allocations: seconds for the project's traces.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct block {
    uint64_t size, offset;
    long born, dies; /* event indices; dies = LONG_MAX if never freed */
} block;

typedef struct open_block {
    char ptr[40];
    long index;
} open_block;

static int order;

static long lifetime(const block *b) { return b->dies - b->born; }

static int by_order(const void *pa, const void *pb)
{
    const block *a = pa, *b = pb;
    double ka, kb;
    switch (order) {
    case 0: ka = (double)a->size, kb = (double)b->size; break;
    case 1: ka = (double)lifetime(a), kb = (double)lifetime(b); break;
    default: ka = (double)a->size * lifetime(a), kb = (double)b->size * lifetime(b); break;
    }
    if (ka != kb)
        return ka < kb ? 1 : -1;
    return a->born < b->born ? -1 : a->born > b->born;
}

static int by_offset(const void *pa, const void *pb)
{
    const block *a = *(block *const *)pa, *b = *(block *const *)pb;
    return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Places blocks[0..n) in the current order; returns the pool size. */
static uint64_t pack(block *blocks, long n, block **scratch)
{
    uint64_t top = 0;
    for (long i = 0; i < n; i++) {
        block *b = &blocks[i];
        long m = 0;
        for (long j = 0; j < i; j++)
            if (blocks[j].born < b->dies && b->born < blocks[j].dies)
                scratch[m++] = &blocks[j];
        qsort(scratch, (size_t)m, sizeof *scratch, by_offset);
        uint64_t at = 0;
        for (long j = 0; j < m && scratch[j]->offset < at + b->size; j++)
            if (scratch[j]->offset + scratch[j]->size > at)
                at = scratch[j]->offset + scratch[j]->size;
        b->offset = at;
        if (at + b->size > top)
            top = at + b->size;
    }
    return top;
}

int main(void)
{
    char line[1024];
    long n = 0, cap = 1024, nopen = 0, open_cap = 1024, event = 0;
    block *blocks = malloc((size_t)cap * sizeof *blocks);
    open_block *open = malloc((size_t)open_cap * sizeof *open);
    uint64_t live = 0, peak = 0;
    if (!blocks || !open || !fgets(line, sizeof line, stdin)) {
        fprintf(stderr, "offline_bound: no trace on stdin\n");
        return 2;
    }
    while (fgets(line, sizeof line, stdin)) {
        char *field[6] = {line};
        int k = 1;
        for (char *s = line; *s && k < 6; s++)
            if (*s == ',') {
                *s = 0;
                field[k++] = s + 1;
            }
        if (k < 5) {
            fprintf(stderr, "offline_bound: line %ld: expected 6 fields\n", event + 2);
            return 2;
        }
        if (strcmp(field[2], "allocate") == 0) {
            uint64_t size = strtoull(field[4], NULL, 10);
            size = size ? (size + 255) / 256 * 256 : 256;
            if (n == cap && !(blocks = realloc(blocks, (size_t)(cap *= 2) * sizeof *blocks)))
                return 2;
            if (nopen == open_cap && !(open = realloc(open, (size_t)(open_cap *= 2) * sizeof *open)))
                return 2;
            blocks[n] = (block){.size = size, .born = event, .dies = LONG_MAX};
            snprintf(open[nopen].ptr, sizeof open[nopen].ptr, "%s", field[3]);
            open[nopen++].index = n++;
            live += size;
            if (live > peak)
                peak = live;
        } else if (strcmp(field[2], "free") == 0) {
            for (long i = nopen - 1; i >= 0; i--)
                if (strcmp(open[i].ptr, field[3]) == 0) {
                    blocks[open[i].index].dies = event;
                    live -= blocks[open[i].index].size;
                    open[i] = open[--nopen];
                    break;
                }
        }
        event++;
    }
    block **scratch = malloc((size_t)(n ? n : 1) * sizeof *scratch);
    if (!scratch)
        return 2;
    uint64_t best = UINT64_MAX;
    for (order = 0; order < 3; order++) {
        qsort(blocks, (size_t)n, sizeof *blocks, by_order);
        uint64_t pool = pack(blocks, n, scratch);
        if (pool < best)
            best = pool;
    }
    printf("{\"allocations\": %ld, \"peak_live_bytes\": %" PRIu64
           ", \"offline_pool_bytes\": %" PRIu64 ", \"offline_efficiency\": %.4f}\n",
           n, peak, n ? best : 0, n ? (double)peak / (double)best : 1.0);
    free(scratch);
    free(blocks);
    free(open);
    return 0;
}
