/*
 * chunks.h - chunk records and the store that holds them.
 *
 * Every chunk is described by one 64-byte record in host memory, named by a
 * 32-bit index (a "handle") rather than a pointer: handles stay valid while
 * the store grows, and they halve the size of every link. Index 0 is never
 * handed out and means "none" (CHUNK_NIL); the bin trees also use record 0 as
 * their black sentinel, so it must stay zeroed apart from the parent link the
 * tree code scribbles on it.
 *
 * Records live in one array that doubles when it fills. An access is one
 * indexed load (a two-level slab table cost five instructions per access,
 * a sixth of all the engine's work). Growth does not copy: glibc's realloc
 * moves a large block by remapping its pages. The array starts on a cache
 * line, so that a record is one line: malloc only promises 16 bytes, and
 * glibc's large blocks start 16 bytes past a page, which put every record
 * across two lines. Fresh records are handed out
 * from a high-water mark instead of being threaded onto the free list, so
 * the array's untouched tail costs no memory. All growth happens in
 * chunk_store_reserve, which operations call before they take any record
 * pointer, so pointers stay valid for the rest of an operation. Host memory
 * follows the peak number of chunks, never the size of the regions.
 */
#ifndef BFCSHIM_CORE_CHUNKS_H
#define BFCSHIM_CORE_CHUNKS_H

#include <stdbool.h>
#include <stdint.h>

#define CHUNK_NIL 0u

enum chunk_state {
    CHUNK_UNUSED = 0,    /* record on the store's free list */
    CHUNK_FREE = 1,      /* in the pool's free bins */
    CHUNK_ALLOCATED = 2, /* in the live-address map */
    CHUNK_PENDING = 3,   /* in a lane, waiting for its fence token */
};

typedef struct chunk {
    uint64_t addr;
    uint64_t size;      /* multiple of the granularity */
    uint64_t requested; /* allocated / pending: bytes the caller asked for */
    uint64_t stamp;     /* allocated: allocation sequence; pending: token */
    uint32_t prev, next;          /* physical neighbours within the region */
    uint32_t left, right, parent; /* bin tree links while free or pending */
    uint32_t qprev, qnext;        /* lane FIFO while pending; free list while unused */
    uint16_t lane;                /* pending: the lane it waits in */
    uint8_t state;
    uint8_t red; /* bin tree colour */
} chunk;

_Static_assert(sizeof(chunk) == 64, "a chunk record should fill one cache line");

typedef struct chunk_store {
    chunk *base;        /* record i is base[i]; record 0 is the sentinel */
    void *raw;          /* what malloc returned; base is its first line boundary */
    uint32_t cap;       /* records the array holds */
    uint32_t high;      /* records ever handed out, sentinel included */
    uint32_t free_head; /* released records, linked through qnext */
    uint32_t used;      /* records handed out now (not counting record 0) */
} chunk_store;

static inline chunk *chunk_at(const chunk_store *s, uint32_t i)
{
    return &s->base[i];
}

/* Starts an empty store; record 0 is allocated here. Returns false on OOM. */
bool chunk_store_init(chunk_store *s);
void chunk_store_fini(chunk_store *s);

/* Records the store can hold without growing (including record 0). */
static inline uint64_t chunk_store_capacity(const chunk_store *s)
{
    return s->cap;
}

bool chunk_store_grow(chunk_store *s, uint32_t n);

/* Makes sure n more records can be taken without failing (or moving). */
static inline bool chunk_store_reserve(chunk_store *s, uint32_t n)
{
    return s->cap - 1 - s->used >= n || chunk_store_grow(s, n);
}

/* Takes a cleared record (links NIL, state UNUSED). The caller must have
 * reserved it. */
static inline uint32_t chunk_new(chunk_store *s)
{
    uint32_t i = s->free_head;
    if (i != CHUNK_NIL) {
        s->free_head = s->base[i].qnext;
        s->base[i].qnext = CHUNK_NIL;
    } else {
        i = s->high++;
        s->base[i] = (chunk){0};
    }
    s->used++;
    return i;
}

/* Returns a record to the free list, cleared: records on the list keep
 * every field zero but qnext, so chunk_new need not clear them. */
static inline void chunk_release(chunk_store *s, uint32_t i)
{
    s->base[i] = (chunk){.qnext = s->free_head};
    s->free_head = i;
    s->used--;
}

uint64_t chunk_store_host_bytes(const chunk_store *s);

#endif
