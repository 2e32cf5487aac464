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
    /* vmm (sim_device_vmm_backend): regions are address space only; held
     * counts mapped bytes. With track_maps set, every mapped range is kept
     * and each call checked against them (maps only onto unmapped space,
     * unmaps only what is mapped); `misuse` counts violations. */
    uint64_t map_calls, unmap_calls;
    /* bfc_backend.keep: between keep(true) and keep(false) unmapped memory
     * stays held (kept) and maps use it first. created_bytes counts what
     * maps took from the device, moved_bytes what they took from kept
     * memory; keep_calls counts both brackets. */
    bool keeping;
    uint64_t kept, created_bytes, moved_bytes, keep_calls;
    uint64_t fail_map;        /* refuse the Nth map call (1-based; 0: none) */
    /* ... after mapping its first fail_map_after bytes (a granule multiple;
     * 0: none), which it reports mapped (the shim: a failed map whose
     * rollback a cuMemUnmap refused). */
    uint64_t fail_map_after;
    /* The Nth unmap call (1-based; 0: none) unmaps only its first
     * fail_unmap_after bytes (a granule multiple) and leaves the rest. */
    uint64_t fail_unmap, fail_unmap_after;
    bool track_maps;
    uint64_t misuse;
    struct sim_range {
        uint64_t base, size;
    } *maps;
    size_t nmaps, capmaps;
    /* A GPU running behind the host (sim_device_fence_done). The owner
     * advances `gpu_now`, the host's clock in its own ticks (replay: one per
     * trace event), and gives fences that clock's value as tokens; a fence
     * completes once the GPU, `gpu_lag` ticks behind, reaches it. A wait
     * blocks the host until the GPU has run up to the token. */
    uint64_t gpu_now, gpu_lag, gpu_done;
    /* Deferred frees (bfc_pool_free_deferred, as the shim's plain frees):
     * the engine's tokens are its own counter, so a seal keeps the host's
     * clock for its token (seal_tick[token]), and that tick is what the GPU
     * must reach. `seals` counts them: in the shim each is a CUDA event
     * recorded per stream, the cost the fence interval trades for memory. */
    uint64_t *seal_tick;
    size_t seal_cap;
    uint64_t seals;
} sim_device;

/* A device of `capacity` bytes whose addresses start high, like a GPU's. */
void sim_device_init(sim_device *d, uint64_t capacity);

/* A backend over d (fence_done left NULL). */
bfc_backend sim_device_backend(sim_device *d);

/* A backend for bfc_options.vmm: region_alloc reserves address space (never
 * refused for capacity), map/unmap take and give back d's capacity, and
 * keep holds what is unmapped for the maps that follow (see above). */
bfc_backend sim_device_vmm_backend(sim_device *d);

/* bfc_backend.fence_done for the lagging GPU above (ctx: the device). */
bool sim_device_fence_done(void *ctx, uint32_t lane, uint64_t token, bool wait);

/* bfc_backend.fence_seal and fence_done for deferred frees on the lagging
 * GPU above: a seal takes the host's clock (gpu_now) as its fence; false
 * only when host memory runs out (the blocks then wait, as in the shim). */
bool sim_device_fence_seal(void *ctx, uint32_t lane, uint64_t token);
bool sim_device_sealed_done(void *ctx, uint32_t lane, uint64_t token, bool wait);

/* track_maps: is all of [addr, addr + size) mapped? */
bool sim_device_mapped(const sim_device *d, uint64_t addr, uint64_t size);

/* Frees the map list (track_maps) and the seal ticks. */
void sim_device_fini(sim_device *d);

#endif
