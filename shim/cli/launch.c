/*
 * launch.c - see launch.h.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli.h"
#include "launch.h"
#include "units.h"

#ifndef BFCSHIM_LIBDIR
#define BFCSHIM_LIBDIR "lib"
#endif

bool env_add(env_list *e, const char *name, const char *value)
{
    size_t len = strlen(name) + strlen(value) + 2;
    char *s = malloc(len);
    if (!s)
        return false;
    snprintf(s, len, "%s=%s", name, value);
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 8;
        char **t = realloc(e->items, cap * sizeof *t);
        if (!t) {
            free(s);
            return false;
        }
        e->items = t;
        e->cap = cap;
    }
    e->items[e->n++] = s;
    return true;
}

bool env_add_assignment(env_list *e, const char *assignment)
{
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment)
        return false;
    char name[256];
    size_t n = (size_t)(eq - assignment);
    if (n >= sizeof name)
        return false;
    memcpy(name, assignment, n);
    name[n] = 0;
    return env_add(e, name, eq + 1);
}

void env_free(env_list *e)
{
    for (size_t i = 0; i < e->n; i++)
        free(e->items[i]);
    free(e->items);
    *e = (env_list){0};
}

void env_apply(const env_list *e)
{
    for (size_t i = 0; i < e->n; i++) {
        char *eq = strchr(e->items[i], '=');
        *eq = 0;
        setenv(e->items[i], eq + 1, 1);
        *eq = '=';
    }
}

static bool readable(const char *path) { return access(path, R_OK) == 0; }

const char *launch_find_shim(void)
{
    static char found[PATH_MAX];
    const char *env = getenv("BFCSHIM_LIBRARY");
    if (env && *env) {
        if (readable(env) && realpath(env, found))
            return found;
        fprintf(stderr, "bfcshim: BFCSHIM_LIBRARY=%s cannot be read\n", env);
        return NULL;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "bfcshim: cannot tell where this command lives; set BFCSHIM_LIBRARY\n");
        return NULL;
    }
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    *slash = 0;
    /* build tree, a flat install, the installed library directory */
    const char *const rel[] = {"/shim/libbfcshim.so", "/libbfcshim.so",
                               "/../" BFCSHIM_LIBDIR "/libbfcshim.so"};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        char cand[PATH_MAX + 64];
        snprintf(cand, sizeof cand, "%s%s", exe, rel[i]);
        if (readable(cand) && realpath(cand, found))
            return found;
    }
    fprintf(stderr,
            "bfcshim: libbfcshim.so is not next to %s/bfcshim (shim/ or ../%s/); "
            "set BFCSHIM_LIBRARY to its path\n",
            exe, BFCSHIM_LIBDIR);
    return NULL;
}

void launch_preload(const char *shim)
{
    const char *old = getenv("LD_PRELOAD");
    if (!old || !*old) {
        setenv("LD_PRELOAD", shim, 1);
        return;
    }
    if (strstr(old, shim))
        return;
    size_t len = strlen(shim) + strlen(old) + 2;
    char *v = malloc(len);
    if (!v)
        return;
    snprintf(v, len, "%s:%s", shim, old);
    setenv("LD_PRELOAD", v, 1);
    free(v);
}

const char launch_options_help[] =
    "  --fraction F         BFCSHIM_MEM_FRACTION: pool size as a fraction of the device\n"
    "  --limit SIZE         BFCSHIM_MEM_LIMIT: pool size cap, e.g. 40GiB\n"
    "  --no-preallocate     BFCSHIM_PREALLOCATE=false: grow the pool on demand\n"
    "  --platform           BFCSHIM_ALLOCATOR=platform: pass through, only count\n"
    "  --free-policy P      BFCSHIM_FREE_POLICY: fenced (default) or immediate\n"
    "  --no-gc              BFCSHIM_GC=false\n"
    "  --placement P        BFCSHIM_PLACEMENT: aligned (default), age or low\n"
    "  --stats-file PATH    BFCSHIM_STATS_FILE: JSON statistics at exit\n"
    "  --stats              BFCSHIM_STATS=1: a summary on stderr at exit\n"
    "  --trace PATH         BFCSHIM_TRACE: record allocations (RMM CSV)\n"
    "  --oom-report PATH    BFCSHIM_OOM_REPORT: append out-of-memory reports there\n"
    "  --log-level L        BFCSHIM_LOG_LEVEL: error, warn, info, debug\n"
    "  --log-file PATH      BFCSHIM_LOG_FILE\n"
    "  --no-driver-hooks    BFCSHIM_DRIVER_HOOKS=false: runtime symbols only\n"
    "  --env NAME=VALUE     any other variable for the program\n";

static bool one_of(const char *v, const char *a, const char *b)
{
    return strcasecmp(v, a) == 0 || strcasecmp(v, b) == 0;
}

int launch_option(const char *cmd, int opt, const char *arg, env_list *e)
{
    double d;
    uint64_t size;
    bool ok = true;
    switch (opt) {
    case LOPT_FRACTION:
        if (!parse_double_in(arg, 1e-6, 1.0, &d))
            return cli_bad_value(cmd, "--fraction", arg, "a number above 0 and at most 1"),
                   -1;
        ok = env_add(e, "BFCSHIM_MEM_FRACTION", arg);
        break;
    case LOPT_LIMIT:
        if (!parse_size(arg, &size) || size == 0)
            return cli_bad_value(cmd, "--limit", arg, "a size such as 40GiB"), -1;
        ok = env_add(e, "BFCSHIM_MEM_LIMIT", arg);
        break;
    case LOPT_NO_PREALLOC: ok = env_add(e, "BFCSHIM_PREALLOCATE", "false"); break;
    case LOPT_PLATFORM: ok = env_add(e, "BFCSHIM_ALLOCATOR", "platform"); break;
    case LOPT_FREE_POLICY:
        if (!one_of(arg, "fenced", "immediate"))
            return cli_bad_value(cmd, "--free-policy", arg, "fenced or immediate"), -1;
        ok = env_add(e, "BFCSHIM_FREE_POLICY", arg);
        break;
    case LOPT_NO_GC: ok = env_add(e, "BFCSHIM_GC", "false"); break;
    case LOPT_PLACEMENT: {
        bfc_placement known;
        if (!bfc_placement_from_name(arg, &known))
            return cli_bad_value(cmd, "--placement", arg, "aligned, age or low"), -1;
        ok = env_add(e, "BFCSHIM_PLACEMENT", arg);
        break;
    }
    case LOPT_STATS_FILE: ok = env_add(e, "BFCSHIM_STATS_FILE", arg); break;
    case LOPT_STATS: ok = env_add(e, "BFCSHIM_STATS", "1"); break;
    case LOPT_TRACE: ok = env_add(e, "BFCSHIM_TRACE", arg); break;
    case LOPT_OOM_REPORT: ok = env_add(e, "BFCSHIM_OOM_REPORT", arg); break;
    case LOPT_LOG_LEVEL:
        if (!one_of(arg, "error", "warn") && !one_of(arg, "info", "debug"))
            return cli_bad_value(cmd, "--log-level", arg, "error, warn, info or debug"), -1;
        ok = env_add(e, "BFCSHIM_LOG_LEVEL", arg);
        break;
    case LOPT_LOG_FILE: ok = env_add(e, "BFCSHIM_LOG_FILE", arg); break;
    case LOPT_NO_DRIVER_HOOKS: ok = env_add(e, "BFCSHIM_DRIVER_HOOKS", "false"); break;
    case LOPT_ENV:
        if (!env_add_assignment(e, arg))
            return cli_bad_value(cmd, "--env", arg, "NAME=VALUE"), -1;
        break;
    default: return 0;
    }
    if (!ok) {
        fprintf(stderr, "bfcshim %s: out of memory\n", cmd);
        return -1;
    }
    return 1;
}
