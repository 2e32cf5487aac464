/*
 * config.c - the BFCSHIM_* environment variables, read once at first use (not
 * in a constructor: a program that never touches CUDA pays nothing).
 *
 * What each variable accepts is in one table shared with the command
 * (shim/common/env_vars.c). A malformed value stops the program, as JAX and
 * TensorFlow do with a bad setting: in a long job's logs a warning is lost,
 * and the user would silently get another pool than the one asked for. Each
 * bad variable gets one line naming it, its value and what is accepted, then
 * one line says the program stops (exit status 78, EX_CONFIG), on stderr
 * even when BFCSHIM_LOG_FILE sends the rest elsewhere.
 * BFCSHIM_CONFIG_ERRORS=warn keeps the defaults and runs on instead. A
 * BFCSHIM_* name the shim does not know gets a warning with the nearest
 * known name (a typo would otherwise do nothing, silently).
 *
 * docs/configuration.md lists every variable with its XLA, TF and PyTorch
 * counterpart.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "env_vars.h"
#include "out_file.h"
#include "shim.h"
#include "units.h"

extern char **environ;

static shim_config cfg;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int malformed;

/* The value of a known variable when it is set and valid; NULL when unset
 * or malformed (then logged and counted). */
static const char *valid(const char *name)
{
    const char *v = getenv(name);
    const env_var *var = env_var_find(name);
    char accepted[256];
    if (!v || !var)
        return NULL;
    if (env_var_check(var, v, accepted, sizeof accepted))
        return v;
    shim_log(LOG_ERROR, "%s='%s' is not %s", name, v, accepted);
    malformed++;
    return NULL;
}

static void get_bool(const char *name, bool *out)
{
    const char *v = valid(name);
    if (v)
        parse_bool(v, out);
}

static void get_size(const char *name, uint64_t *out)
{
    const char *v = valid(name);
    if (v)
        parse_size(v, out);
}

static void get_number(const char *name, double *out)
{
    const char *v = valid(name);
    if (v)
        *out = strtod(v, NULL);
}

static void get_choice(const char *name, int *out)
{
    const char *v = valid(name);
    if (v)
        *out = env_var_choice(env_var_find(name), v);
}

/* A file path, or NULL when unset, empty or malformed. */
static const char *get_path(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return NULL;
    char probe[4096];
    if (!valid(name))
        return NULL;
    if (!shim_expand_path(v, probe, sizeof probe)) {
        shim_log(LOG_ERROR, "%s='%s' is too long once %%p becomes the pid", name, v);
        malformed++;
        return NULL;
    }
    return v;
}

bool shim_expand_path(const char *pattern, char *out, size_t len)
{
    size_t k = 0;
    for (const char *p = pattern; *p; p++) {
        char pid[16];
        const char *piece = p[0] == '%' && p[1] == 'p' ? pid : NULL;
        if (piece) {
            snprintf(pid, sizeof pid, "%d", (int)getpid());
            p++;
        }
        size_t n = piece ? strlen(piece) : 1;
        if (k + n >= len)
            return false;
        memcpy(out + k, piece ? piece : p, n);
        k += n;
    }
    out[k] = 0;
    return true;
}

/* The statistics are written at exit: a folder missing now, or a path that
 * names a folder, is said now, while the job can still be stopped, not
 * after it has run. The path stays set, as the program may make the folder
 * (or remove the one in the way) before it ends. */
static void warn_missing_folder(const char *name, const char *pattern)
{
    char path[4096], folder[4096];
    if (pattern && shim_expand_path(pattern, path, sizeof path) &&
        out_file_folder_missing(path, folder, sizeof folder))
        shim_log(LOG_ERROR, "%s: the folder %s does not exist; nothing can be written there",
                 name, folder);
    else if (pattern && shim_expand_path(pattern, path, sizeof path) &&
             out_file_names_folder(path))
        shim_log(LOG_ERROR, "%s: %s is a folder; the file cannot be written there", name, path);
}

/* BFCSHIM_* names nobody reads, in any case (the environment tells
 * bfcshim_mem_fraction from BFCSHIM_MEM_FRACTION): a warning each, with
 * the nearest known name. */
static void warn_unknown_names(void)
{
    for (char **e = environ; e && *e; e++) {
        if (strncasecmp(*e, "BFCSHIM_", 8) != 0)
            continue;
        const char *eq = strchr(*e, '=');
        char name[128], upper[128];
        size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
        if (n >= sizeof name)
            n = sizeof name - 1;
        memcpy(name, *e, n);
        name[n] = 0;
        if (env_var_find(name))
            continue;
        for (size_t i = 0; i <= n; i++)
            upper[i] = (char)toupper((unsigned char)name[i]);
        char hint[160];
        shim_log(LOG_WARN, "%s is not a bfcshim variable and does nothing%s", name,
                 env_var_hint(upper, hint, sizeof hint));
    }
}

static void stop_or_run_on(bool fatal)
{
    if (!malformed)
        return;
    if (!fatal) {
        shim_log(LOG_WARN, "running on with the defaults in place of the %d malformed "
                           "setting(s) above (BFCSHIM_CONFIG_ERRORS=warn)",
                 malformed);
        return;
    }
    char line[320];
    int n = snprintf(line, sizeof line,
                     "bfcshim[%d]: error: stopping the program: %d malformed BFCSHIM_* "
                     "setting(s)%s. Fix them, or set BFCSHIM_CONFIG_ERRORS=warn to run on "
                     "with the defaults\n",
                     (int)getpid(), malformed,
                     shim_log_fd() == STDERR_FILENO ? " above" : ", listed in BFCSHIM_LOG_FILE");
    if (n > 0) {
        size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
        ssize_t w = write(STDERR_FILENO, line, len);
        if (shim_log_fd() != STDERR_FILENO)
            w = write(shim_log_fd(), line, len);
        (void)w;
    }
    _exit(78); /* EX_CONFIG */
}

static void parse(void)
{
    cfg = (shim_config){
        .mode = MODE_BFC,
        .mem_fraction = 0.75,
        .preallocate = true,
        .garbage_collection = true,
        .free_policy = FREE_FENCED,
        .alignment = ENV_ALIGNMENT_DEFAULT,
        .placement = BFC_PLACE_ALIGNED,
        .initial_region = UINT64_C(2) << 20,
        .fence_interval = BFC_DEFAULT_FENCE_INTERVAL,
        .fence_bytes = BFC_DEFAULT_FENCE_BYTES,
        .driver_hooks = true,
        .log_level = LOG_WARN,
        .vmm = VMM_AUTO,
        .layout = VMM_LAYOUT_ONE_REGION,
        .release_threshold = UINT64_MAX,
        .growth_headroom = BFC_DEFAULT_GROWTH_HEADROOM,
    };
    /* The log settings first, so that messages about the others go there. */
    cfg.log_file = get_path("BFCSHIM_LOG_FILE");
    get_choice("BFCSHIM_LOG_LEVEL", &cfg.log_level);
    int fatal = 0; /* index of "fatal" in the table's choices */
    get_choice("BFCSHIM_CONFIG_ERRORS", &fatal);

    int mode = cfg.mode;
    get_choice("BFCSHIM_ALLOCATOR", &mode);
    cfg.mode = (shim_mode)mode;
    get_number("BFCSHIM_MEM_FRACTION", &cfg.mem_fraction);
    get_size("BFCSHIM_MEM_LIMIT", &cfg.mem_limit);
    get_bool("BFCSHIM_PREALLOCATE", &cfg.preallocate);
    get_bool("BFCSHIM_GC", &cfg.garbage_collection);
    int vmm = (int)cfg.vmm;
    get_choice("BFCSHIM_VMM", &vmm);
    cfg.vmm = (vmm_mode)vmm;
    int layout = (int)cfg.layout;
    get_choice("BFCSHIM_VMM_LAYOUT", &layout);
    cfg.layout = (vmm_layout)layout;
    int door = (int)cfg.vmm_door;
    get_choice("BFCSHIM_VMM_DOOR", &door);
    cfg.vmm_door = (vmm_door_mode)door;
    get_size("BFCSHIM_RELEASE_THRESHOLD", &cfg.release_threshold);
    double headroom = -1;
    get_number("BFCSHIM_GROWTH_HEADROOM", &headroom);
    if (headroom >= 0) /* given, and valid: 0 to 1, in the engine's thousandths */
        cfg.growth_headroom = (uint32_t)(headroom * 1000 + 0.5);
    int policy = cfg.free_policy;
    get_choice("BFCSHIM_FREE_POLICY", &policy);
    cfg.free_policy = (free_policy)policy;
    get_size("BFCSHIM_ALIGNMENT", &cfg.alignment);
    int place = (int)cfg.placement; /* the table lists the engine's names in its order */
    get_choice("BFCSHIM_PLACEMENT", &place);
    cfg.placement = (bfc_placement)place;
    uint64_t first = 0;
    get_size("BFCSHIM_INITIAL_REGION", &first);
    cfg.initial_region_set = first > 0; /* given, and valid (above 0) */
    if (cfg.initial_region_set)
        cfg.initial_region = first;
    double every = -1;
    get_number("BFCSHIM_FENCE_INTERVAL", &every);
    cfg.fence_interval_set = every >= 0; /* given, and valid */
    if (cfg.fence_interval_set)
        cfg.fence_interval = (uint32_t)every;
    get_size("BFCSHIM_FENCE_BYTES", &cfg.fence_bytes);
    get_bool("BFCSHIM_DRIVER_HOOKS", &cfg.driver_hooks);
    int cache = (int)cfg.context_cache;
    get_choice("BFCSHIM_CONTEXT_CACHE", &cache);
    cfg.context_cache = (context_cache_mode)cache;
    cfg.trace_path = get_path("BFCSHIM_TRACE");
    cfg.plan_path = get_path("BFCSHIM_PLAN");
    cfg.stats_file = get_path("BFCSHIM_STATS_FILE");
    warn_missing_folder("BFCSHIM_STATS_FILE", cfg.stats_file);
    cfg.oom_report_path = get_path("BFCSHIM_OOM_REPORT");
    get_bool("BFCSHIM_STATS", &cfg.stats_summary);

    warn_unknown_names();
    stop_or_run_on(fatal == 0);
}

const shim_config *shim_config_get(void)
{
    pthread_once(&once, parse);
    return &cfg;
}
