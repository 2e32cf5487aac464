/*
 * shim_calls.c - driver calls by entry point, from the fake's table (see
 * shim_calls.h).
 */
#include "shim_calls.h"

#include <string.h>

static const char *const group_names[NGROUPS] = {
    "event record", "event query", "capture query", "sync", "map", "context", "event made",
    "other",
};

const char *call_group_name(call_group g) { return g < NGROUPS ? group_names[g] : "?"; }

static int starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

call_group call_group_of(const char *e)
{
    if (starts(e, "cuEventRecord") || strcmp(e, "cuGreenCtxRecordEvent") == 0)
        return GROUP_RECORD;
    if (strcmp(e, "cuEventQuery") == 0 || starts(e, "cuStreamQuery"))
        return GROUP_QUERY;
    if (starts(e, "cuStreamIsCapturing") || starts(e, "cuStreamGetCaptureInfo") ||
        strcmp(e, "cuThreadExchangeStreamCaptureMode") == 0)
        return GROUP_CAPTURE;
    if (strcmp(e, "cuEventSynchronize") == 0 || starts(e, "cuStreamSynchronize") ||
        strcmp(e, "cuCtxSynchronize") == 0)
        return GROUP_SYNC;
    /* Everything that takes memory from the device or gives it back, or
     * maps it: what a pool costs the driver besides its fences. */
    if (starts(e, "cuMemMap") || starts(e, "cuMemUnmap") || starts(e, "cuMemCreate") ||
        starts(e, "cuMemRelease") || starts(e, "cuMemSetAccess") ||
        starts(e, "cuMemAddress") || starts(e, "cuMemAlloc") || starts(e, "cuMemFree") ||
        starts(e, "cuMemRetainAllocationHandle") || starts(e, "cuMemGetAllocationGranularity"))
        return GROUP_MAP;
    if (starts(e, "cuCtx") || starts(e, "cuDevicePrimaryCtx") || starts(e, "cuStreamGetCtx"))
        return GROUP_CONTEXT;
    if (starts(e, "cuEventCreate") || starts(e, "cuEventDestroy"))
        return GROUP_EVENT;
    return GROUP_OTHER;
}

void call_meter_init(call_meter *m, const fakecuda_api *fake)
{
    memset(m, 0, sizeof *m);
    m->fake = fake;
}

void call_meter_start(call_meter *m) { m->nbefore = m->fake->calls(m->before, CALLS_MAX); }

void call_meter_stop(call_meter *m)
{
    m->nafter = m->fake->calls(m->after, CALLS_MAX);
    if (m->nafter > CALLS_MAX)
        m->nafter = CALLS_MAX;
    for (size_t i = m->nnames; i < m->nafter; i++)
        m->names[i] = m->after[i].name;
    if (m->nafter > m->nnames)
        m->nnames = m->nafter;
}

uint64_t call_meter_add(const call_meter *m, call_tally *t)
{
    uint64_t sum = 0;
    /* Slots only grow, in the same order: slot i before is slot i after. */
    for (size_t i = 0; i < m->nafter; i++) {
        uint64_t was = i < m->nbefore ? m->before[i].calls : 0;
        uint64_t d = m->after[i].calls - was;
        t->n[i] += d;
        sum += d;
    }
    return sum;
}

uint64_t call_tally_total(const call_tally *t)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < CALLS_MAX; i++)
        sum += t->n[i];
    return sum;
}

uint64_t call_tally_group(const call_meter *m, const call_tally *t, call_group g)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < m->nnames; i++)
        if (t->n[i] && call_group_of(m->names[i]) == g)
            sum += t->n[i];
    return sum;
}
