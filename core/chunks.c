/* chunks.c - the array of chunk records (see chunks.h). */
#include "chunks.h"

#include <stdlib.h>
#include <string.h>

#define CHUNK_MIN_CAP 4096u
#define CHUNK_MAX_CAP UINT32_MAX /* handles are 32 bits */
#define CACHE_LINE 64u

/* The first cache line boundary at or after p. */
static chunk *line_up(void *p)
{
    uintptr_t a = (uintptr_t)p;
    return (chunk *)(void *)((a + CACHE_LINE - 1) & ~(uintptr_t)(CACHE_LINE - 1));
}

/* Room for cap records starting on a line: one line more than they need. */
static size_t array_bytes(uint64_t cap)
{
    return (size_t)cap * sizeof(chunk) + CACHE_LINE;
}

bool chunk_store_init(chunk_store *s)
{
    memset(s, 0, sizeof *s);
    s->raw = malloc(array_bytes(CHUNK_MIN_CAP));
    if (!s->raw)
        return false;
    s->base = line_up(s->raw);
    s->cap = CHUNK_MIN_CAP;
    s->base[0] = (chunk){0}; /* the sentinel */
    s->high = 1;
    return true;
}

void chunk_store_fini(chunk_store *s)
{
    free(s->raw);
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
    size_t offset = (size_t)((char *)s->base - (char *)s->raw);
    char *t = realloc(s->raw, array_bytes(cap));
    if (!t)
        return false;
    chunk *base = line_up(t);
    /* realloc keeps the bytes at the old offset from the block's start; a
     * block that moved to a different alignment must slide them onto the
     * line (only records ever handed out hold anything). */
    if ((size_t)((char *)base - t) != offset)
        memmove(base, t + offset, (size_t)s->high * sizeof(chunk));
    s->raw = t;
    s->base = base;
    s->cap = (uint32_t)cap;
    return true;
}

uint64_t chunk_store_host_bytes(const chunk_store *s)
{
    /* Only records ever handed out are touched; the rest is address space. */
    return (uint64_t)s->high * sizeof(chunk);
}
