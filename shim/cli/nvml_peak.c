/*
 * nvml_peak.c - peak device memory while a child runs, from NVML when the
 * machine has it (libnvidia-ml.so.1, loaded at run time: bfcshim never
 * links against it and works without it).
 *
 * NVML is asked for each device's used memory every 20 ms; the peak of the
 * sum, less what was in use before the run started, is what the run took.
 * That counts the whole device (other processes too), so `bfcshim ab` says
 * so next to the figure; the shim's own accounting is reported beside it.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "nvml_peak.h"

typedef struct {
    unsigned long long total, free, used;
} nvml_memory;

static struct {
    bool ok;
    unsigned count;
    void *dev[16];
    int (*get_memory)(void *, nvml_memory *);
} nv;

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void)
{
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    int (*count)(unsigned *) = (int (*)(unsigned *))dlsym(h, "nvmlDeviceGetCount_v2");
    int (*handle)(unsigned, void **) =
        (int (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    nv.get_memory = (int (*)(void *, nvml_memory *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    if (!init || !count || !handle || !nv.get_memory || init() != 0 || count(&nv.count) != 0)
        return;
    if (nv.count > 16)
        nv.count = 16;
    for (unsigned i = 0; i < nv.count; i++)
        if (handle(i, &nv.dev[i]) != 0)
            return;
    nv.ok = nv.count > 0;
}

bool nvml_available(void)
{
    pthread_once(&once, load);
    return nv.ok;
}

static uint64_t used_now(void)
{
    uint64_t sum = 0;
    for (unsigned i = 0; i < nv.count; i++) {
        nvml_memory m;
        if (nv.get_memory(nv.dev[i], &m) == 0)
            sum += m.used;
    }
    return sum;
}

static void *sampler(void *arg)
{
    nvml_watch *w = arg;
    const struct timespec period = {0, 20 * 1000 * 1000};
    while (!atomic_load(&w->stop)) {
        uint64_t u = used_now();
        if (u > w->peak)
            w->peak = u;
        nanosleep(&period, NULL);
    }
    return NULL;
}

bool nvml_watch_start(nvml_watch *w)
{
    memset(w, 0, sizeof *w);
    if (!nvml_available())
        return false;
    w->baseline = w->peak = used_now();
    w->running = pthread_create(&w->thread, NULL, sampler, w) == 0;
    return w->running;
}

uint64_t nvml_watch_stop(nvml_watch *w)
{
    if (!w->running)
        return 0;
    atomic_store(&w->stop, true);
    pthread_join(w->thread, NULL);
    w->running = false;
    return w->peak > w->baseline ? w->peak - w->baseline : 0;
}
