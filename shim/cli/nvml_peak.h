/* nvml_peak.h - peak device memory during a run, from NVML if present. */
#ifndef BFCSHIM_CLI_NVML_PEAK_H
#define BFCSHIM_CLI_NVML_PEAK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct nvml_watch {
    pthread_t thread;
    atomic_bool stop;
    bool running;
    uint64_t baseline, peak;
} nvml_watch;

/* Is NVML loadable and does it see a device? */
bool nvml_available(void);
/* Starts sampling all devices' used memory; false without NVML. */
bool nvml_watch_start(nvml_watch *w);
/* Stops and returns the peak used memory above the baseline at start. */
uint64_t nvml_watch_stop(nvml_watch *w);

#endif
