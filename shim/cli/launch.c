/*
 * launch.c - see launch.h.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "array_room.h"
#include "cli.h"
#include "cudart_link.h"
#include "env_vars.h"
#include "launch.h"
#include "out_file.h"

#ifndef BFCSHIM_LIBDIR
#define BFCSHIM_LIBDIR "lib"
#endif

const char *env_value(const env_list *e, const char *name)
{
    size_t len = strlen(name);
    for (size_t i = e->n; i-- > 0;)
        if (strncmp(e->items[i], name, len) == 0 && e->items[i][len] == '=')
            return e->items[i] + len + 1;
    return NULL;
}

bool env_add(env_list *e, const char *name, const char *value)
{
    size_t len = strlen(name) + strlen(value) + 2;
    char *s = malloc(len);
    if (!s)
        return false;
    snprintf(s, len, "%s=%s", name, value);
    char **t = array_room(e->items, e->n, &e->cap, sizeof *t, 8);
    if (!t) {
        free(s);
        return false;
    }
    e->items = t;
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

/* The folder this command lives in; false when /proc cannot say. */
static bool exe_dir(char *out, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", out, len - 1);
    if (n <= 0)
        return false;
    out[n] = 0;
    *strrchr(out, '/') = 0;
    return true;
}

/* The first of dir + rel[i] that can be read, resolved into found. */
static bool first_readable(const char *dir, const char *const *rel, size_t n, char *found)
{
    for (size_t i = 0; i < n; i++) {
        char cand[PATH_MAX + 64];
        snprintf(cand, sizeof cand, "%s%s", dir, rel[i]);
        if (readable(cand) && realpath(cand, found))
            return true;
    }
    return false;
}

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
    if (!exe_dir(exe, sizeof exe)) {
        fprintf(stderr, "bfcshim: cannot tell where this command lives; set BFCSHIM_LIBRARY\n");
        return NULL;
    }
    /* build tree, a flat install, the installed library directory */
    const char *const rel[] = {"/shim/libbfcshim.so", "/libbfcshim.so",
                               "/../" BFCSHIM_LIBDIR "/libbfcshim.so"};
    if (first_readable(exe, rel, sizeof rel / sizeof rel[0], found))
        return found;
    fprintf(stderr,
            "bfcshim: libbfcshim.so is not next to %s/bfcshim (shim/ or ../%s/); "
            "set BFCSHIM_LIBRARY to its path\n",
            exe, BFCSHIM_LIBDIR);
    return NULL;
}

const char *launch_find_fake_cuda(void)
{
    static char found[PATH_MAX];
    char exe[PATH_MAX];
    const char *const rel[] = {"/tests/fake_cuda/libcuda.so.1",
                               "/../" BFCSHIM_LIBDIR "/bfcshim-fake-cuda/libcuda.so.1"};
    if (exe_dir(exe, sizeof exe) && first_readable(exe, rel, sizeof rel / sizeof rel[0], found)) {
        *strrchr(found, '/') = 0;
        return found;
    }
    fprintf(stderr, "bfcshim: --fake-gpu: the fake CUDA libraries are neither in the build "
                    "tree (tests/fake_cuda) nor installed (../%s/bfcshim-fake-cuda) from this "
                    "command; build with -Dshim=enabled\n",
            BFCSHIM_LIBDIR);
    return NULL;
}

/* --fake-gpu: the fake driver and runtime first in the loader's path, and
 * the fake NVML (its nvml/ folder) after them: NVML must describe the
 * devices the program sees, so a framework that asks NVML before it uses a
 * GPU (JAX sees no GPU when nvmlInit_v2 fails) runs, and none meets the
 * real NVML, which is absent here or describes other devices. A copy
 * without the fake NVML (older installs) still gets the fake driver. */
static int add_fake_gpu(const char *cmd, env_list *e)
{
    const char *dir = launch_find_fake_cuda();
    if (!dir)
        return -1;
    char nvml[PATH_MAX + 64];
    snprintf(nvml, sizeof nvml, "%s/nvml/libnvidia-ml.so.1", dir);
    const bool with_nvml = readable(nvml);
    *strrchr(nvml, '/') = 0;
    const char *old = getenv("LD_LIBRARY_PATH");
    char path[PATH_MAX * 3];
    snprintf(path, sizeof path, "%s%s%s%s%s", dir, with_nvml ? ":" : "", with_nvml ? nvml : "",
             old && *old ? ":" : "", old ? old : "");
    static bool said; /* ab applies it to both arms: one message */
    if (!said)
        fprintf(stderr,
            "bfcshim %s: --fake-gpu: CUDA goes to the fake driver in %s: %s device(s) of %s "
            "in host memory (FAKECUDA_DEVICES, FAKECUDA_MEM)%s; no kernel runs, so this tries "
            "the allocator, not a workload\n",
            cmd, dir, getenv("FAKECUDA_DEVICES") ? getenv("FAKECUDA_DEVICES") : "2",
            getenv("FAKECUDA_MEM") ? getenv("FAKECUDA_MEM") : "1GiB",
            with_nvml ? ", NVML to a fake NVML of the same devices" : "");
    said = true;
    return env_add(e, "LD_LIBRARY_PATH", path) ? 1 : 0;
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

/* BFCSHIM_DRIVER_HOOKS as the child will see it: false, 0, no or off. */
static bool driver_door_closed(const env_list *e)
{
    const char *v = env_value(e, "BFCSHIM_DRIVER_HOOKS");
    if (!v)
        v = getenv("BFCSHIM_DRIVER_HOOKS");
    if (!v)
        return false;
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (strcasecmp(v, no[i]) == 0)
            return true;
    return false;
}

bool launch_check_runtime(const char *cmd, const char *prog, bool fake_gpu, const env_list *e)
{
    char path[PATH_MAX];
    const bool closed = driver_door_closed(e);
    if ((!fake_gpu && !closed) || cudart_link_of(prog, path, sizeof path) != CUDART_STATIC)
        return true;
    if (fake_gpu) {
        fprintf(stderr,
                "bfcshim %s: --fake-gpu: %s has the CUDA runtime linked in statically (nvcc's "
                "default, -cudart static); that runtime needs private tables of the driver "
                "(cuGetExportTable) that the fake GPU cannot serve, so each of its CUDA calls "
                "would fail with 801 \"operation not supported\": build it with nvcc -cudart "
                "shared to try it here (on a GPU it runs as it is, its allocations served "
                "through the driver door)\n",
                cmd, path);
        return false;
    }
    fprintf(stderr,
            "bfcshim %s: warning: %s has the CUDA runtime linked in statically (nvcc's default, "
            "-cudart static): the runtime door cannot see its cudaMalloc calls, and with the "
            "driver door closed (BFCSHIM_DRIVER_HOOKS=false) none of its allocations reach "
            "the pool; build it with nvcc -cudart shared, or leave the driver door open\n",
            cmd, path);
    return true;
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
    "  --env NAME=VALUE     any other variable for the program\n"
    "  --fake-gpu           run on bfcshim's fake CUDA driver (host memory, no kernels):\n"
    "                       try the shim without a GPU\n";

/* Adds NAME=VALUE for a variable of the shared table (env_vars.c), after
 * checking the value the way the library will: the command refuses what
 * would stop the program later. `option` names the flag in messages. */
static int add_checked(const char *cmd, const char *option, const char *name, const char *value,
                       env_list *e)
{
    char accepted[256];
    if (!env_var_check(env_var_find(name), value, accepted, sizeof accepted))
        return cli_bad_value(cmd, option, value, accepted), -1;
    /* A file the library writes into a folder that is not there, or in the
     * place of a folder, would fail when it is made (the statistics: at
     * exit, after the whole job). A folder named with %p (the pid) is the
     * library's to expand. */
    static const char *const written[] = {"BFCSHIM_STATS_FILE", "BFCSHIM_TRACE",
                                          "BFCSHIM_OOM_REPORT", "BFCSHIM_LOG_FILE"};
    for (size_t i = 0; i < sizeof written / sizeof *written; i++)
        if (strcmp(name, written[i]) == 0 &&
            (!strstr(value, "%p") || out_file_names_folder(value)) &&
            !cli_output_place_ok(cmd, option, value))
            return -1;
    return env_add(e, name, value) ? 1 : 0;
}

/* --env NAME=VALUE (launch.h). */
int launch_env_assignment(const char *cmd, const char *option, const char *arg, env_list *e)
{
    const char *eq = strchr(arg, '=');
    char name[256];
    size_t n = eq ? (size_t)(eq - arg) : 0;
    if (!eq || n == 0 || n >= sizeof name)
        return cli_bad_value(cmd, option, arg, "NAME=VALUE"), -1;
    memcpy(name, arg, n);
    name[n] = 0;
    if (strncmp(name, "BFCSHIM_", 8) == 0) {
        if (!env_var_find(name)) {
            char hint[160];
            fprintf(stderr, "bfcshim %s: %s %s: not a bfcshim variable%s\n", cmd, option, name,
                    env_var_hint(name, hint, sizeof hint));
            return -1;
        }
        char named[300];
        snprintf(named, sizeof named, "%s %s", option, name);
        return add_checked(cmd, named, name, eq + 1, e);
    }
    return env_add_assignment(e, arg) ? 1 : 0;
}

int launch_option(const char *cmd, int opt, const char *arg, env_list *e)
{
    int r = 1;
    switch (opt) {
    case LOPT_FRACTION: r = add_checked(cmd, "--fraction", "BFCSHIM_MEM_FRACTION", arg, e); break;
    case LOPT_LIMIT: r = add_checked(cmd, "--limit", "BFCSHIM_MEM_LIMIT", arg, e); break;
    case LOPT_NO_PREALLOC: r = env_add(e, "BFCSHIM_PREALLOCATE", "false"); break;
    case LOPT_PLATFORM: r = env_add(e, "BFCSHIM_ALLOCATOR", "platform"); break;
    case LOPT_FREE_POLICY:
        r = add_checked(cmd, "--free-policy", "BFCSHIM_FREE_POLICY", arg, e);
        break;
    case LOPT_NO_GC: r = env_add(e, "BFCSHIM_GC", "false"); break;
    case LOPT_PLACEMENT: r = add_checked(cmd, "--placement", "BFCSHIM_PLACEMENT", arg, e); break;
    case LOPT_STATS_FILE: r = add_checked(cmd, "--stats-file", "BFCSHIM_STATS_FILE", arg, e); break;
    case LOPT_STATS: r = env_add(e, "BFCSHIM_STATS", "1"); break;
    case LOPT_TRACE: r = add_checked(cmd, "--trace", "BFCSHIM_TRACE", arg, e); break;
    case LOPT_OOM_REPORT: r = add_checked(cmd, "--oom-report", "BFCSHIM_OOM_REPORT", arg, e); break;
    case LOPT_LOG_LEVEL: r = add_checked(cmd, "--log-level", "BFCSHIM_LOG_LEVEL", arg, e); break;
    case LOPT_LOG_FILE: r = add_checked(cmd, "--log-file", "BFCSHIM_LOG_FILE", arg, e); break;
    case LOPT_NO_DRIVER_HOOKS: r = env_add(e, "BFCSHIM_DRIVER_HOOKS", "false"); break;
    case LOPT_ENV: r = launch_env_assignment(cmd, "--env", arg, e); break;
    case LOPT_FAKE_GPU: r = add_fake_gpu(cmd, e); break;
    default: return 0;
    }
    if (r == 0) {
        fprintf(stderr, "bfcshim %s: out of memory\n", cmd);
        return -1;
    }
    return r;
}
