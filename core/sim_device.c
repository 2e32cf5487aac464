/* sim_device.c - simulated device address space (see sim_device.h). */
#include "sim_device.h"

#include <stdlib.h>
#include <string.h>

void sim_device_init(sim_device *d, uint64_t capacity)
{
    memset(d, 0, sizeof *d);
    d->capacity = capacity;
    d->alignment = UINT64_C(2) << 20;
    d->next = UINT64_C(0x7f0000000000);
}

/* The next range of `size` bytes from the bump pointer. */
static bfc_addr bump(sim_device *d, uint64_t size)
{
    bfc_addr base = d->next;
    /* Leave a gap after each region so that neighbours are never adjacent:
     * the pool must not merge across regions. */
    d->next += (size + d->alignment - 1) / d->alignment * d->alignment + d->alignment;
    return base;
}

static int sim_alloc(void *ctx, uint64_t size, bfc_addr *base)
{
    sim_device *d = ctx;
    d->calls++;
    if ((d->fail_call && d->calls == d->fail_call) ||
        (d->refuse_above && size > d->refuse_above) || size > d->capacity - d->held)
        return 1;
    *base = bump(d, size);
    d->held += size;
    return 0;
}

static void sim_free(void *ctx, bfc_addr base, uint64_t size)
{
    sim_device *d = ctx;
    (void)base;
    d->frees++;
    d->held -= size;
}

bool sim_device_fence_done(void *ctx, uint32_t lane, uint64_t token, bool wait)
{
    sim_device *d = ctx;
    (void)lane;
    if (d->gpu_now > d->gpu_lag && d->gpu_now - d->gpu_lag > d->gpu_done)
        d->gpu_done = d->gpu_now - d->gpu_lag;
    if (wait && token > d->gpu_done)
        d->gpu_done = token;
    return token <= d->gpu_done;
}

bool sim_device_fence_seal(void *ctx, uint32_t lane, uint64_t token)
{
    sim_device *d = ctx;
    (void)lane;
    if (token >= d->seal_cap) {
        size_t cap = d->seal_cap ? d->seal_cap : 1024;
        while (cap <= token)
            cap *= 2;
        uint64_t *t = realloc(d->seal_tick, cap * sizeof *t);
        if (!t)
            return false;
        d->seal_tick = t;
        d->seal_cap = cap;
    }
    d->seal_tick[token] = d->gpu_now;
    d->seals++;
    return true;
}

bool sim_device_sealed_done(void *ctx, uint32_t lane, uint64_t token, bool wait)
{
    const sim_device *d = ctx;
    /* The engine asks only of tokens it sealed. */
    return token < d->seal_cap && sim_device_fence_done(ctx, lane, d->seal_tick[token], wait);
}

bfc_backend sim_device_backend(sim_device *d)
{
    return (bfc_backend){.ctx = d, .region_alloc = sim_alloc, .region_free = sim_free};
}

/* ---- virtual memory mode ------------------------------------------------ */

static int sim_reserve(void *ctx, uint64_t size, bfc_addr *base)
{
    sim_device *d = ctx;
    d->calls++;
    if (d->fail_call && d->calls == d->fail_call)
        return 1;
    *base = bump(d, size);
    return 0;
}

/* Bytes that mapped range m and [base, base + size) have in common. */
static uint64_t overlap(const struct sim_range *m, uint64_t base, uint64_t size)
{
    uint64_t lo = m->base > base ? m->base : base;
    uint64_t hi = m->base + m->size < base + size ? m->base + m->size : base + size;
    return lo < hi ? hi - lo : 0;
}

static void sim_unreserve(void *ctx, bfc_addr base, uint64_t size)
{
    sim_device *d = ctx;
    d->frees++;
    /* A reservation must be unmapped before it goes. */
    if (d->track_maps)
        for (size_t i = 0; i < d->nmaps; i++)
            if (overlap(&d->maps[i], base, size))
                d->misuse++;
}

static bool track_add(sim_device *d, uint64_t base, uint64_t size)
{
    for (size_t i = 0; i < d->nmaps; i++)
        if (overlap(&d->maps[i], base, size)) {
            d->misuse++; /* mapped twice */
            return false;
        }
    if (d->nmaps == d->capmaps) {
        size_t cap = d->capmaps ? d->capmaps * 2 : 64;
        struct sim_range *t = realloc(d->maps, cap * sizeof *t);
        if (!t)
            return false;
        d->maps = t;
        d->capmaps = cap;
    }
    d->maps[d->nmaps++] = (struct sim_range){base, size};
    return true;
}

/* Takes [base, base + size) out of the mapped ranges, splitting where it
 * cuts one; every byte of it must have been mapped. */
static void track_remove(sim_device *d, uint64_t base, uint64_t size)
{
    uint64_t covered = 0;
    for (size_t i = 0; i < d->nmaps;) {
        struct sim_range m = d->maps[i];
        uint64_t common = overlap(&m, base, size);
        if (!common) {
            i++;
            continue;
        }
        covered += common;
        uint64_t lo = m.base > base ? m.base : base, hi = lo + common;
        d->maps[i] = d->maps[--d->nmaps];
        if (m.base < lo)
            track_add(d, m.base, lo - m.base);
        if (hi < m.base + m.size)
            track_add(d, hi, m.base + m.size - hi);
    }
    if (covered != size)
        d->misuse++; /* unmapped what was not mapped */
}

/* Physical memory behind a map: kept memory first (while keeping), then
 * the device's. */
static uint64_t sim_map(void *ctx, bfc_addr addr, uint64_t size)
{
    sim_device *d = ctx;
    d->map_calls++;
    if (d->fail_map && d->map_calls == d->fail_map) {
        if (!d->fail_map_after)
            return 0;
        size = d->fail_map_after < size ? d->fail_map_after : size; /* the rest fails */
    }
    const uint64_t moved = size < d->kept ? size : d->kept, fresh = size - moved;
    if (fresh > d->capacity - d->held || (d->refuse_above && size > d->refuse_above))
        return 0;
    if (d->track_maps && !track_add(d, addr, size))
        return 0;
    d->kept -= moved;
    d->moved_bytes += moved;
    d->created_bytes += fresh;
    d->held += fresh;
    return size;
}

static uint64_t sim_unmap(void *ctx, bfc_addr addr, uint64_t size)
{
    sim_device *d = ctx;
    d->unmap_calls++;
    if (d->fail_unmap && d->unmap_calls == d->fail_unmap)
        size = d->fail_unmap_after < size ? d->fail_unmap_after : size; /* the rest stays */
    if (d->track_maps)
        track_remove(d, addr, size);
    if (d->keeping)
        d->kept += size; /* still held */
    else
        d->held -= size;
    return size;
}

static void sim_keep(void *ctx, bool on)
{
    sim_device *d = ctx;
    if (d->keeping == on)
        d->misuse++; /* brackets must pair */
    d->keeping = on;
    d->keep_calls++;
    if (!on) {
        d->held -= d->kept;
        d->kept = 0;
    }
}

bfc_backend sim_device_vmm_backend(sim_device *d)
{
    return (bfc_backend){.ctx = d, .region_alloc = sim_reserve, .region_free = sim_unreserve,
                         .map = sim_map, .unmap = sim_unmap, .keep = sim_keep};
}

bool sim_device_mapped(const sim_device *d, uint64_t addr, uint64_t size)
{
    /* Ranges never overlap, so the bytes they cover add up. */
    uint64_t covered = 0;
    for (size_t i = 0; i < d->nmaps; i++)
        covered += overlap(&d->maps[i], addr, size);
    return covered == size;
}

void sim_device_fini(sim_device *d)
{
    free(d->maps);
    d->maps = NULL;
    d->nmaps = d->capmaps = 0;
    free(d->seal_tick);
    d->seal_tick = NULL;
    d->seal_cap = 0;
}
