/*
 * gpu_lag.c - a GPU `lag` operations behind the host (see gpu_lag.h).
 */
#include "gpu_lag.h"

#include <stdlib.h>

bool gpu_lag_init(gpu_lag *g, const fakecuda_api *fake, uint64_t lag)
{
    *g = (gpu_lag){.fake = fake, .lag = lag};
    g->ring = calloc(lag + 1, sizeof *g->ring);
    return g->ring != NULL;
}

/* Has a queued kernel completed? Once its stream's completed prefix
 * (submitted - pending) reaches its position. */
static bool completed(const gpu_lag *g, const struct queued_kernel *k)
{
    return k->at <= g->fake->submitted(k->stream) - g->fake->pending(k->stream);
}

/* Did host waits complete every queued kernel (gpu_lag.h)? Any one still
 * queued keeps the GPU busy. */
static void count_drained(gpu_lag *g)
{
    uint64_t cap = g->lag + 1;
    for (uint64_t i = g->n; i-- > 0;)
        if (!completed(g, &g->ring[(g->head + i) % cap]))
            return;
    g->drained += g->n != 0;
}

bool gpu_lag_step(gpu_lag *g, void *stream)
{
    count_drained(g);
    /* A kernel with no host work: it only takes a place in the stream. */
    if (g->fake->launch(stream, NULL, NULL) != 0)
        return false;
    uint64_t cap = g->lag + 1;
    g->ring[(g->head + g->n++) % cap] = (struct queued_kernel){stream, g->fake->submitted(stream)};
    while (g->n > g->lag) {
        struct queued_kernel k = g->ring[g->head];
        g->head = (g->head + 1) % cap;
        g->n--;
        g->ran_ahead += completed(g, &k);
        g->fake->complete_to(k.stream, k.at);
    }
    return true;
}

void gpu_lag_drain(gpu_lag *g)
{
    g->fake->complete_all();
    g->head = g->n = 0;
}

void gpu_lag_free(gpu_lag *g)
{
    free(g->ring);
    g->ring = NULL;
}
