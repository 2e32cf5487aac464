/*
 * sim_device.h - a simulated device address space to back a pool without a
 * GPU: trace replay, tests, benchmarks. It hands out address ranges from a
 * bump pointer (never reused, so a stale address is always foreign), keeps
 * at most `capacity` bytes out at once, and can be told to refuse requests,
 * the way a real driver does when another process holds memory.
 */
#ifndef BFCSHIM_CORE_SIM_DEVICE_H
#define BFCSHIM_CORE_SIM_DEVICE_H

#include "bfc.h"

typedef struct sim_device {
    uint64_t capacity;  /* bytes that may be out at once */
    uint64_t held;      /* bytes out now */
    uint64_t next;      /* next base address */
    uint64_t alignment; /* of every base; default 2 MiB */
    uint64_t refuse_above; /* refuse any single request larger than this (0: none) */
    uint64_t fail_call;    /* refuse the Nth region_alloc call (1-based; 0: none) */
    uint64_t calls, frees; /* region_alloc / region_free calls so far */
} sim_device;

/* A device of `capacity` bytes whose addresses start high, like a GPU's. */
void sim_device_init(sim_device *d, uint64_t capacity);

/* A backend over d (fence_done left NULL). */
bfc_backend sim_device_backend(sim_device *d);

#endif
