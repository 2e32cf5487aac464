/*
 * config.c - the BFCSHIM_* environment variables, read once at first use (not
 * in a constructor: a program that never touches CUDA pays nothing).
 *
 * Each variable has one parser. A malformed value gets one message naming the
 * variable, the value and what is accepted; the default stays and the program
 * runs on. docs/configuration.md lists every variable with its XLA, TF and
 * PyTorch counterpart.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <stdio.h>

#include "shim.h"
#include "units.h"

static shim_config cfg;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void bad(const char *name, const char *value, const char *accepted, const char *dflt)
{
    shim_log(LOG_ERROR, "%s='%s' is not %s; using %s", name, value, accepted, dflt);
}

static void get_bool(const char *name, bool *out)
{
    const char *v = getenv(name);
    if (v && !parse_bool(v, out))
        bad(name, v, "true/false (or 1/0, yes/no, on/off)", *out ? "true" : "false");
}

static void get_size(const char *name, uint64_t *out, const char *dflt)
{
    const char *v = getenv(name);
    uint64_t x;
    if (!v)
        return;
    if (parse_size(v, &x) && x > 0)
        *out = x;
    else
        bad(name, v, "a size such as 40GiB, 512MiB or 1073741824", dflt);
}

/* One of `names`, or the default (index 0 of the accepted list stays). */
static void get_choice(const char *name, const char *const *names, int n, int *out)
{
    const char *v = getenv(name);
    if (!v)
        return;
    for (int i = 0; i < n; i++)
        if (strcasecmp(v, names[i]) == 0) {
            *out = i;
            return;
        }
    char accepted[128] = "one of";
    for (int i = 0; i < n; i++) {
        strncat(accepted, i ? ", " : " ", sizeof accepted - strlen(accepted) - 1);
        strncat(accepted, names[i], sizeof accepted - strlen(accepted) - 1);
    }
    bad(name, v, accepted, names[*out]);
}

/* A file path, or NULL when unset or empty. */
static const char *get_path(const char *name)
{
    const char *v = getenv(name);
    char probe[4096];
    if (!v || !*v)
        return NULL;
    if (!shim_expand_path(v, probe, sizeof probe)) {
        bad(name, v, "a path shorter than 4096 bytes", "none");
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

static void parse(void)
{
    cfg = (shim_config){
        .mode = MODE_BFC,
        .mem_fraction = 0.75,
        .preallocate = true,
        .garbage_collection = true,
        .free_policy = FREE_FENCED,
        .alignment = 512,
        .placement = BFC_PLACE_ALIGNED,
        .initial_region = UINT64_C(2) << 20,
        .fence_interval = 1,
        .fence_bytes = UINT64_C(64) << 20,
        .driver_hooks = true,
        .log_level = LOG_WARN,
    };
    /* The log settings first, so that messages about the others go there. */
    static const char *const levels[] = {"error", "warn", "info", "debug"};
    cfg.log_file = getenv("BFCSHIM_LOG_FILE");
    get_choice("BFCSHIM_LOG_LEVEL", levels, 4, &cfg.log_level);

    static const char *const modes[] = {"bfc", "platform"};
    int mode = cfg.mode;
    get_choice("BFCSHIM_ALLOCATOR", modes, 2, &mode);
    cfg.mode = (shim_mode)mode;

    const char *v = getenv("BFCSHIM_MEM_FRACTION");
    if (v && !parse_double_in(v, 1e-6, 1.0, &cfg.mem_fraction))
        bad("BFCSHIM_MEM_FRACTION", v, "a number above 0 and at most 1", "0.75");
    get_size("BFCSHIM_MEM_LIMIT", &cfg.mem_limit, "no limit beyond the fraction");
    get_bool("BFCSHIM_PREALLOCATE", &cfg.preallocate);
    get_bool("BFCSHIM_GC", &cfg.garbage_collection);

    static const char *const policies[] = {"fenced", "immediate"};
    int policy = cfg.free_policy;
    get_choice("BFCSHIM_FREE_POLICY", policies, 2, &policy);
    cfg.free_policy = (free_policy)policy;

    uint64_t align = cfg.alignment;
    get_size("BFCSHIM_ALIGNMENT", &align, "512");
    if (align < 256 || align > (UINT64_C(1) << 20) || (align & (align - 1)))
        bad("BFCSHIM_ALIGNMENT", getenv("BFCSHIM_ALIGNMENT"),
            "a power of two from 256 to 1MiB", "512");
    else
        cfg.alignment = align;

    /* The engine's names, in bfc_placement's order, so that the index is
     * the value. */
    const char *const places[] = {bfc_placement_name(BFC_PLACE_BY_AGE),
                                  bfc_placement_name(BFC_PLACE_LOW),
                                  bfc_placement_name(BFC_PLACE_ALIGNED)};
    int place = (int)cfg.placement;
    get_choice("BFCSHIM_PLACEMENT", places, 3, &place);
    cfg.placement = (bfc_placement)place;

    get_size("BFCSHIM_INITIAL_REGION", &cfg.initial_region, "2MiB");

    double every = cfg.fence_interval;
    v = getenv("BFCSHIM_FENCE_INTERVAL");
    if (v && (!parse_double_in(v, 1, 4096, &every) || every != (double)(uint32_t)every))
        bad("BFCSHIM_FENCE_INTERVAL", v, "a whole number from 1 to 4096", "1");
    else
        cfg.fence_interval = (uint32_t)every;
    v = getenv("BFCSHIM_FENCE_BYTES");
    uint64_t fb = 0;
    if (v && strcmp(v, "0") == 0)
        cfg.fence_bytes = 0;
    else if (v && parse_size(v, &fb))
        cfg.fence_bytes = fb;
    else if (v)
        bad("BFCSHIM_FENCE_BYTES", v, "a size such as 64MiB, or 0 for none", "64MiB");
    get_bool("BFCSHIM_DRIVER_HOOKS", &cfg.driver_hooks);

    cfg.trace_path = get_path("BFCSHIM_TRACE");
    cfg.stats_file = get_path("BFCSHIM_STATS_FILE");
    cfg.oom_report_path = get_path("BFCSHIM_OOM_REPORT");
    get_bool("BFCSHIM_STATS", &cfg.stats_summary);
}

const shim_config *shim_config_get(void)
{
    pthread_once(&once, parse);
    return &cfg;
}
