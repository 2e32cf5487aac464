/* chunks.c - the array of chunk records (see chunks.h). */
#include "chunks.h"

#include <stdlib.h>
#include <string.h>

#define CHUNK_MIN_CAP 4096u
#define CHUNK_MAX_CAP UINT32_MAX /* handles are 32 bits */

bool chunk_store_init(chunk_store *s)
{
    memset(s, 0, sizeof *s);
    s->base = malloc(CHUNK_MIN_CAP * sizeof(chunk));
    if (!s->base)
        return false;
    s->cap = CHUNK_MIN_CAP;
    s->base[0] = (chunk){0}; /* the sentinel */
    s->high = 1;
    return true;
}

void chunk_store_fini(chunk_store *s)
{
    free(s->base);
    memset(s, 0, sizeof *s);
}

bool chunk_store_grow(chunk_store *s, uint32_t n)
{
    uint64_t need = (uint64_t)s->used + 1 + n, cap = s->cap;
    while (cap < need)
        cap *= 2;
    if (cap > CHUNK_MAX_CAP) {
        if (need > CHUNK_MAX_CAP)
            return false;
        cap = CHUNK_MAX_CAP;
    }
    if (cap == s->cap)
        return true;
    chunk *t = realloc(s->base, cap * sizeof(chunk));
    if (!t)
        return false;
    s->base = t;
    s->cap = (uint32_t)cap;
    return true;
}

uint64_t chunk_store_host_bytes(const chunk_store *s)
{
    /* Only records ever handed out are touched; the rest is address space. */
    return (uint64_t)s->high * sizeof(chunk);
}
