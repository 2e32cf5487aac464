/*
 * shim_calls.h - the driver calls a stretch of a program makes, by entry
 * point, counted on the fake driver (fakecuda_api.calls), for the
 * shim-level benchmarks (shim_replay, shim_step_calls).
 *
 * A meter takes the fake's table before and after the stretch; the calls in
 * between are added to tallies. Bracketing only the calls into the shim's
 * doors counts what the shim makes there and nothing of what the program
 * does around them, so no subtraction is needed.
 */
#ifndef BFCSHIM_TESTS_BENCH_SHIM_CALLS_H
#define BFCSHIM_TESTS_BENCH_SHIM_CALLS_H

#include <stdint.h>

#include "fake_cuda.h"

/* As many as the fake has slots for (CALL_SLOTS in fake_internal.h). */
enum { CALLS_MAX = 128 };

/* What an entry point is for, as issue 53 asks them counted. */
typedef enum call_group {
    GROUP_RECORD,  /* cuEventRecord*, cuGreenCtxRecordEvent: fences sealed */
    GROUP_QUERY,   /* cuEventQuery, cuStreamQuery: fences asked about */
    GROUP_CAPTURE, /* cuStreamIsCapturing*, cuThreadExchangeStreamCaptureMode */
    GROUP_SYNC,    /* cuEventSynchronize, cuStreamSynchronize*, cuCtxSynchronize */
    GROUP_MAP,     /* memory from the device: cuMemMap, cuMemCreate, cuMemAlloc ... */
    GROUP_CONTEXT, /* cuCtxGetCurrent, push/pop, cuStreamGetCtx ... */
    GROUP_EVENT,   /* cuEventCreate, cuEventDestroy: events made and dropped */
    GROUP_OTHER,
    NGROUPS
} call_group;

const char *call_group_name(call_group g);
call_group call_group_of(const char *entry);

/* Calls per entry point, indexed by the fake's slot (stable for the run);
 * names[i] is slot i's entry point, once seen. */
typedef struct call_tally {
    uint64_t n[CALLS_MAX];
} call_tally;

typedef struct call_meter {
    const fakecuda_api *fake;
    fakecuda_call_count before[CALLS_MAX], after[CALLS_MAX];
    size_t nbefore, nafter;
    const char *names[CALLS_MAX];
    size_t nnames;
} call_meter;

void call_meter_init(call_meter *m, const fakecuda_api *fake);
/* Takes the table before and after the stretch. */
void call_meter_start(call_meter *m);
void call_meter_stop(call_meter *m);
/* Adds the last stretch's calls to t; returns how many there were. */
uint64_t call_meter_add(const call_meter *m, call_tally *t);

uint64_t call_tally_total(const call_tally *t);
uint64_t call_tally_group(const call_meter *m, const call_tally *t, call_group g);

#endif
