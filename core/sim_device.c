/* sim_device.c - simulated device address space (see sim_device.h). */
#include "sim_device.h"

#include <string.h>

void sim_device_init(sim_device *d, uint64_t capacity)
{
    memset(d, 0, sizeof *d);
    d->capacity = capacity;
    d->alignment = UINT64_C(2) << 20;
    d->next = UINT64_C(0x7f0000000000);
}

static int sim_alloc(void *ctx, uint64_t size, bfc_addr *base)
{
    sim_device *d = ctx;
    d->calls++;
    if ((d->fail_call && d->calls == d->fail_call) ||
        (d->refuse_above && size > d->refuse_above) || size > d->capacity - d->held)
        return 1;
    *base = d->next;
    /* Leave a gap after each region so that neighbours are never adjacent:
     * the pool must not merge across regions. */
    d->next += (size + d->alignment - 1) / d->alignment * d->alignment + d->alignment;
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

bfc_backend sim_device_backend(sim_device *d)
{
    return (bfc_backend){.ctx = d, .region_alloc = sim_alloc, .region_free = sim_free};
}
