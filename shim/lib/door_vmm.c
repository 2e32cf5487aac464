/*
 * door_vmm.c - the virtual memory door: the program's own cuMemCreate,
 * cuMemRetainAllocationHandle and cuMemRelease.
 *
 * JAX 0.10.2 and later allocate every buffer this way, and PyTorch's
 * expandable segments grow this way (docs/frameworks.md). Physical memory
 * made here is not served from the pools yet (docs/design.md, "The virtual
 * memory door", says what pooled handles will be); until it is, this door
 * makes sure that memory is never invisible: each device's physical bytes
 * made by the program are counted while they live (passthrough_vmm_* in the
 * statistics and the exit summary), and the first such allocation on a
 * device is named in the log.
 *
 * A physical allocation lives from cuMemCreate until its last handle
 * reference goes: cuMemCreate's, and one per cuMemRetainAllocationHandle,
 * each ended by a cuMemRelease. (The driver keeps the memory until it is
 * also unmapped; XLA and PyTorch unmap before they release, so the count
 * is exact for them, and errs low, never high, for a program that releases
 * a handle it still has mapped.) The pools' own granules are made through
 * the real driver table, not through this door, and are not counted here.
 * Calls are rare (one per buffer or segment), so a mutex over a small map
 * is all the bookkeeping needs.
 */
#include <pthread.h>
#include <stdlib.h>

#include <string.h>

#include "ptr_map.h"
#include "shim.h"
#include "units.h"

#define PASS(field, ...) \
    (REAL(field) ? REAL(field)(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)

/* One physical allocation the program made: handle -> record (the map's
 * value is the record's address). */
typedef struct made {
    uint64_t size;
    int dev;
    uint64_t refs; /* cuMemCreate's, and one per retain */
} made;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static ptr_map handles;
static bool handles_ready;
static vmm_door_counts counts[SHIM_MAX_DEVICES];
static atomic_bool named[SHIM_MAX_DEVICES];

/* Device memory of a device the counters have room for. */
static bool counted_kind(const CUmemAllocationProp *prop, size_t size)
{
    return prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
           prop->location.id >= 0 && prop->location.id < SHIM_MAX_DEVICES && size > 0;
}

static void note_created(CUmemGenericAllocationHandle h, size_t size, int dev)
{
    made *m = malloc(sizeof *m);
    pthread_mutex_lock(&lock);
    if (!handles_ready)
        handles_ready = ptr_map_init(&handles);
    bool kept = m && handles_ready && h != 0 && ptr_map_get(&handles, h) == 0 &&
                ptr_map_reserve(&handles, 1);
    if (kept) {
        *m = (made){size, dev, 1};
        ptr_map_put(&handles, h, (uint64_t)(uintptr_t)m);
        vmm_door_counts *c = &counts[dev];
        c->bytes += size;
        c->creates++;
        if (c->bytes > c->peak_bytes)
            c->peak_bytes = c->bytes;
    }
    pthread_mutex_unlock(&lock);
    if (!kept) {
        free(m);
        return; /* no host memory for the entry: uncounted, never miscounted */
    }
    if (!atomic_exchange(&named[dev], true)) {
        char b[32];
        shim_log(LOG_WARN, "cuMemCreate: the program makes device %d's memory itself through "
                           "CUDA's virtual memory API (JAX, PyTorch's expandable segments): "
                           "%s so far goes around the pool, counted as passthrough_vmm_bytes "
                           "(logged once per device)",
                 dev, format_size(size, b, sizeof b));
    }
}

/* One more (retain) or one fewer (release) reference to h, if counted. */
static void note_reference(CUmemGenericAllocationHandle h, bool more)
{
    made *gone = NULL;
    pthread_mutex_lock(&lock);
    made *m = handles_ready ? (made *)(uintptr_t)ptr_map_get(&handles, h) : NULL;
    if (m && more) {
        m->refs++;
    } else if (m && --m->refs == 0) {
        ptr_map_take(&handles, h);
        counts[m->dev].bytes -= m->size;
        gone = m;
    }
    pthread_mutex_unlock(&lock);
    free(gone);
}

SHIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags)
{
    CUresult r = PASS(MemCreate, handle, size, prop, flags);
    if (r == CUDA_SUCCESS && handle && shim_driver_door() && counted_kind(prop, size))
        note_created(*handle, size, prop->location.id);
    return r;
}

SHIM_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
                                                 void *addr)
{
    CUresult r = PASS(MemRetainAllocationHandle, handle, addr);
    if (r == CUDA_SUCCESS && handle && shim_driver_door())
        note_reference(*handle, true);
    return r;
}

SHIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult r = PASS(MemRelease, handle);
    if (r == CUDA_SUCCESS && shim_driver_door())
        note_reference(handle, false);
    return r;
}

void vmm_door_get_counts(int dev, vmm_door_counts *out)
{
    *out = (vmm_door_counts){0};
    if (dev < 0 || dev >= SHIM_MAX_DEVICES)
        return;
    pthread_mutex_lock(&lock);
    *out = counts[dev];
    pthread_mutex_unlock(&lock);
}

/* Held across fork, so that a child's copy is never locked for good. */
void vmm_door_lock_for_fork(bool hold)
{
    if (hold)
        pthread_mutex_lock(&lock);
    else
        pthread_mutex_unlock(&lock);
}

/* A forked child holds none of its parent's device memory (CUDA does not
 * carry contexts across fork): it starts counting from nothing. The
 * records stay (their handles mean nothing here) and are never freed. */
void vmm_door_after_fork_child(void)
{
    memset(counts, 0, sizeof counts);
    handles_ready = false;
    handles = (ptr_map){0};
}

void vmm_door_total(vmm_door_counts *out)
{
    *out = (vmm_door_counts){0};
    pthread_mutex_lock(&lock);
    for (int d = 0; d < SHIM_MAX_DEVICES; d++) {
        out->bytes += counts[d].bytes;
        out->peak_bytes += counts[d].peak_bytes;
        out->creates += counts[d].creates;
    }
    pthread_mutex_unlock(&lock);
}
