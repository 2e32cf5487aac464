/*
 * array_room.h - room for one more item in a growable array.
 *
 * The shim's registries (streams, green contexts, lanes, spare events,
 * stand-ins) and the command's lists grow the same way: doubling from a first
 * capacity, and when host memory runs out the caller keeps its old array and
 * chooses its own safe way out. This is that step, once.
 */
#ifndef BFCSHIM_COMMON_ARRAY_ROOM_H
#define BFCSHIM_COMMON_ARRAY_ROOM_H

#include <stddef.h>
#include <stdlib.h>

/* `items` holds n items of `size` bytes in room for *cap. Returns an array
 * with room for n + 1 (items itself, or a larger one it moved to, *cap
 * updated), or NULL when host memory runs out: items is then unchanged and
 * still the caller's. */
static inline void *array_room(void *items, size_t n, size_t *cap, size_t size, size_t first)
{
    if (n < *cap)
        return items;
    size_t grown = *cap ? *cap * 2 : first;
    void *t = realloc(items, grown * size);
    if (t)
        *cap = grown;
    return t;
}

#endif
