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

bool gpu_lag_step(gpu_lag *g, void *stream)
{
    /* A kernel with no host work: it only takes a place in the stream. */
    if (g->fake->launch(stream, NULL, NULL) != 0)
        return false;
    uint64_t cap = g->lag + 1;
    g->ring[(g->head + g->n++) % cap] = (struct queued_kernel){stream, g->fake->submitted(stream)};
    while (g->n > g->lag) {
        struct queued_kernel k = g->ring[g->head];
        g->head = (g->head + 1) % cap;
        g->n--;
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
