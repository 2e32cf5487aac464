/*
 * shim_stats.h - one number from the preloaded shim's statistics, for test
 * programs of every kind (the e2e programs over the fake driver, the GPU
 * suite under nvcc): bfcshim_stats_json, found with dlsym as a program that
 * never linked against the shim would find it.
 */
#ifndef BFCSHIM_TESTS_SHIM_STATS_H
#define BFCSHIM_TESTS_SHIM_STATS_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A number field of a stats JSON document, the first pool's (a boolean
 * one: 1 or 0); -1 when the field is missing. */
static inline long long shim_stats_field(const char *json, const char *name)
{
    char key[64];
    snprintf(key, sizeof key, "\"%s\":", name);
    const char *at = strstr(json, key);
    if (!at)
        return -1;
    at += strlen(key);
    while (*at == ' ')
        at++;
    if (strncmp(at, "true", 4) == 0 || strncmp(at, "false", 5) == 0)
        return at[0] == 't';
    return strtoll(at, NULL, 10);
}

/* The same from the preloaded shim's statistics now; -1 when the shim or
 * the field is missing. */
static inline long long shim_stat_number(const char *name)
{
    static char json[1 << 16];
    size_t (*stats_json)(char *, size_t) =
        (size_t (*)(char *, size_t))dlsym(RTLD_DEFAULT, "bfcshim_stats_json");
    if (!stats_json || !stats_json(json, sizeof json))
        return -1;
    return shim_stats_field(json, name);
}

/* The virtual memory door's figures (shim/lib/door_vmm.c), wherever its
 * memory goes: lent the pool's limit (the default) or, under
 * BFCSHIM_VMM_DOOR=count, around it (passthrough_vmm_*). */
static inline bool shim_vmm_door_pooled(void)
{
    const char *m = getenv("BFCSHIM_VMM_DOOR");
    return !(m && strcmp(m, "count") == 0);
}

/* A figure only a pool has: 0 while there is none (no pool, no loan). */
static inline long long shim_pool_figure(const char *name)
{
    long long v = shim_stat_number(name);
    return v < 0 && shim_stat_number("pool_bytes") < 0 ? 0 : v;
}

/* The door's live bytes; -1 when the other place holds any too. */
static inline long long shim_vmm_door_bytes(void)
{
    const bool pooled = shim_vmm_door_pooled();
    if ((pooled ? shim_stat_number("passthrough_vmm_bytes") : shim_pool_figure("bytes_lent")) != 0)
        return -1;
    return pooled ? shim_pool_figure("bytes_lent") : shim_stat_number("passthrough_vmm_bytes");
}

static inline long long shim_vmm_door_peak(void)
{
    return shim_vmm_door_pooled() ? shim_pool_figure("peak_bytes_lent")
                                  : shim_stat_number("passthrough_vmm_peak_bytes");
}

static inline long long shim_vmm_door_creates(void)
{
    return shim_stat_number(shim_vmm_door_pooled() ? "vmm_door_pooled_creates"
                                                   : "passthrough_vmm_creates");
}

#endif
