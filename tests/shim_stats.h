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

#endif
