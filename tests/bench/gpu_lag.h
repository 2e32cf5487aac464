/*
 * gpu_lag.h - a modelled GPU that runs a fixed number of operations behind
 * the host, over the fake driver's streams (shim_replay).
 *
 * Each operation the host replays is followed by one kernel on its stream
 * (a work item through the fake's test control, which no driver entry point
 * sees). The model remembers where each kernel sits in its stream and, once
 * more than `lag` kernels are queued, completes the oldest up to its
 * position (fakecuda_api.complete_to), so the GPU has run all but the last
 * `lag` operations, across streams in the order the host issued them. With
 * lag 0 every kernel completes before the next operation, as on an idle GPU.
 * A host that waits (cuEventSynchronize, a synchronisation) completes work
 * ahead of the model, as a real wait would; the model then finds it done.
 *
 * What such a wait costs a GPU-bound job (one whose host, left alone, keeps
 * `lag` kernels queued) is not the wait but an empty queue: while kernels
 * stay queued behind the work waited for, the GPU runs on and the host's
 * lead alone shrinks; a wait that leaves nothing queued idles the GPU until
 * the host queues again. So the model counts the kernels that completed
 * ahead of it (`ran_ahead`: the host's lead lost to waits, in kernels) and,
 * before each launch, whether waits completed every queued kernel
 * (`drained`: one bubble in a GPU-bound job's step).
 */
#ifndef BFCSHIM_TESTS_BENCH_GPU_LAG_H
#define BFCSHIM_TESTS_BENCH_GPU_LAG_H

#include <stdbool.h>
#include <stdint.h>

#include "fake_cuda.h"

typedef struct gpu_lag {
    const fakecuda_api *fake;
    uint64_t lag;
    /* the kernels queued, oldest first: a ring of lag + 1 */
    struct queued_kernel {
        void *stream;
        uint64_t at;
    } *ring;
    uint64_t head, n;
    uint64_t ran_ahead, drained;
} gpu_lag;

bool gpu_lag_init(gpu_lag *g, const fakecuda_api *fake, uint64_t lag);
/* Launches the kernel of one operation on `stream`, then lets the GPU catch
 * up to `lag` operations behind; false if the fake refused the launch. */
bool gpu_lag_step(gpu_lag *g, void *stream);
/* The GPU finishes everything queued. */
void gpu_lag_drain(gpu_lag *g);
void gpu_lag_free(gpu_lag *g);

#endif
