/*
 * env_vars.c - see env_vars.h. docs/configuration.md explains each variable;
 * this table is what the code enforces.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "bfc.h"
#include "env_vars.h"
#include "units.h"

const env_var env_vars[] = {
    {"BFCSHIM_ALLOCATOR", VAR_CHOICE, 0, 0, {"bfc", "platform"}, "the allocator that serves"},
    {"BFCSHIM_MEM_FRACTION", VAR_NUMBER, 1e-6, 1, {0},
     "the share of device memory the pool may take"},
    {"BFCSHIM_MEM_LIMIT", VAR_SIZE, 0, 0, {0}, "a cap on the pool's bytes"},
    {"BFCSHIM_PREALLOCATE", VAR_BOOL, 0, 0, {0}, "taking the whole pool at the first allocation"},
    {"BFCSHIM_GC", VAR_BOOL, 0, 0, {0}, "giving empty regions back before failing"},
    {"BFCSHIM_VMM", VAR_CHOICE, 0, 0, {"auto", "on", "off"},
     "building the pool over CUDA virtual memory"},
    {"BFCSHIM_VMM_LAYOUT", VAR_CHOICE, 0, 0, {"one-region", "spread"},
     "the layout of a preallocated pool over virtual memory"},
    {"BFCSHIM_VMM_DOOR", VAR_CHOICE, 0, 0, {"pool", "count"},
     "what the program's own cuMemCreate memory counts against"},
    {"BFCSHIM_RELEASE_THRESHOLD", VAR_SIZE_OR_0, 0, 0, {0},
     "the free mapped memory kept before it goes back to the device"},
    {"BFCSHIM_FREE_POLICY", VAR_CHOICE, 0, 0, {"fenced", "immediate"},
     "the moment freed blocks may be reused"},
    {"BFCSHIM_ALIGNMENT", VAR_POW2_SIZE, ENV_ALIGNMENT_MIN, ENV_ALIGNMENT_MAX, {0},
     "the alignment of every block"},
    {"BFCSHIM_PLACEMENT", VAR_CHOICE, 0, 0, {"age", "low", "aligned"},
     "the place of an allocation in a free block"},
    {"BFCSHIM_GROWTH_HEADROOM", VAR_NUMBER, 0, 1, {0},
     "how far a growing pool maps past its need before it moves memory"},
    {"BFCSHIM_INITIAL_REGION", VAR_SIZE, 0, 0, {0}, "the first region when not preallocating"},
    {"BFCSHIM_FENCE_INTERVAL", VAR_WHOLE, 1, BFC_MAX_FENCE_INTERVAL, {0}, "the allocations between fences"},
    {"BFCSHIM_FENCE_BYTES", VAR_SIZE_OR_0, 0, 0, {0}, "the freed bytes that fence sooner"},
    {"BFCSHIM_DRIVER_HOOKS", VAR_BOOL, 0, 0, {0}, "serving the driver API too"},
    {"BFCSHIM_CONTEXT_CACHE", VAR_CHOICE, 0, 0, {"on", "off", "check"},
     "remembering each thread's current context"},
    {"BFCSHIM_LOG_LEVEL", VAR_CHOICE, 0, 0, {"error", "warn", "info", "debug"},
     "how much the shim says"},
    {"BFCSHIM_LOG_FILE", VAR_PATH, 0, 0, {0}, "the shim's messages"},
    {"BFCSHIM_TRACE", VAR_PATH, 0, 0, {0}, "the allocation trace (RMM CSV)"},
    {"BFCSHIM_PLAN", VAR_PATH, 0, 0, {0}, "the placement plan (bfcshim plan)"},
    {"BFCSHIM_STATS_FILE", VAR_PATH, 0, 0, {0}, "the statistics at exit (JSON)"},
    {"BFCSHIM_STATS", VAR_BOOL, 0, 0, {0}, "a summary on stderr at exit"},
    {"BFCSHIM_OOM_REPORT", VAR_PATH, 0, 0, {0}, "out-of-memory reports"},
    {"BFCSHIM_CONFIG_ERRORS", VAR_CHOICE, 0, 0, {"fatal", "warn"}, "what a malformed setting does"},
    {"BFCSHIM_LIBRARY", VAR_TOOL, 0, 0, {0}, "the library bfcshim run preloads"},
    {"BFCSHIM_CHECK_ONLY", VAR_TOOL, 0, 0, {0}, "scripts/check.sh's configurations"},
};
const size_t env_vars_count = sizeof env_vars / sizeof env_vars[0];

const env_var *env_var_find(const char *name)
{
    for (size_t i = 0; i < env_vars_count; i++)
        if (strcmp(env_vars[i].name, name) == 0)
            return &env_vars[i];
    return NULL;
}

int env_var_choice(const env_var *v, const char *value)
{
    for (int i = 0; v->choices[i]; i++)
        if (strcasecmp(value, v->choices[i]) == 0)
            return i;
    return -1;
}

/* %g without a trailing exponent for the bounds people type: 1e-06 reads
 * worse than 0.000001. */
static void number(char *buf, size_t len, double v)
{
    if (v != 0 && v < 1e-3)
        snprintf(buf, len, "%.6f", v);
    else
        snprintf(buf, len, "%g", v);
}

static bool check(const env_var *v, const char *value)
{
    bool b;
    uint64_t size;
    double d;
    switch (v->kind) {
    case VAR_BOOL: return parse_bool(value, &b);
    case VAR_SIZE: return parse_size(value, &size) && size > 0;
    case VAR_SIZE_OR_0: return parse_size(value, &size);
    case VAR_POW2_SIZE:
        return parse_size(value, &size) && size >= v->lo && size <= v->hi &&
               (size & (size - 1)) == 0;
    case VAR_NUMBER: return parse_double_in(value, v->lo, v->hi, &d);
    case VAR_WHOLE: { /* digits only, as the message says (units.h) */
        uint64_t w;
        return parse_whole_in(value, (uint64_t)v->lo, (uint64_t)v->hi, &w);
    }
    case VAR_CHOICE: return env_var_choice(v, value) >= 0;
    case VAR_PATH: return *value != 0 && strlen(value) < 4000;
    case VAR_TOOL: return true;
    }
    return false;
}

static void describe(const env_var *v, char *out, size_t len)
{
    char lo[32], hi[32];
    number(lo, sizeof lo, v->lo);
    number(hi, sizeof hi, v->hi);
    char what[160] = "";
    switch (v->kind) {
    case VAR_BOOL: snprintf(what, sizeof what, "true or false (1/0, yes/no, on/off)"); break;
    case VAR_SIZE:
        snprintf(what, sizeof what, "a size above 0 such as 40GiB, 512MiB or 1073741824");
        break;
    case VAR_SIZE_OR_0: snprintf(what, sizeof what, "a size such as 64MiB, or 0 for none"); break;
    case VAR_POW2_SIZE: {
        char a[32], b[32];
        snprintf(what, sizeof what, "a power of two from %s to %s",
                 format_size((uint64_t)v->lo, a, sizeof a),
                 format_size((uint64_t)v->hi, b, sizeof b));
        break;
    }
    case VAR_NUMBER: snprintf(what, sizeof what, "a number from %s to %s", lo, hi); break;
    case VAR_WHOLE: snprintf(what, sizeof what, "a whole number from %s to %s", lo, hi); break;
    case VAR_CHOICE:
        snprintf(what, sizeof what, "one of");
        for (int i = 0; v->choices[i]; i++) {
            size_t k = strlen(what);
            snprintf(what + k, sizeof what - k, "%s%s", i ? ", " : " ", v->choices[i]);
        }
        break;
    case VAR_PATH: snprintf(what, sizeof what, "a file path shorter than 4000 bytes"); break;
    case VAR_TOOL: snprintf(what, sizeof what, "any value"); break;
    }
    snprintf(out, len, "%s, for %s", what, v->meaning);
}

bool env_var_check(const env_var *v, const char *value, char *accepted, size_t len)
{
    if (check(v, value))
        return true;
    if (accepted && len)
        describe(v, accepted, len);
    return false;
}

/* Levenshtein distance, capped: names are short. */
static size_t distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 99;
    size_t row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *env_var_hint(const char *name, char *buf, size_t len)
{
    const char *near = env_var_closest(name);
    snprintf(buf, len, "%s%s%s", near ? "; did you mean " : "", near ? near : "", near ? "?" : "");
    return buf;
}

const char *env_var_closest(const char *name)
{
    /* Only a close name is worth suggesting: every name shares BFCSHIM_,
     * so a fixed distance (it was 3) matched short names to anything short
     * (BFCSHIM_FOO -> BFCSHIM_GC). The edits allowed grow with the part
     * after the prefix, a third of it, at most 3; a name cut short (a
     * prefix of a known one, 4 characters past BFCSHIM_ or more) is close
     * too. */
    const size_t prefix = strncmp(name, "BFCSHIM_", 8) == 0 ? 8 : 0;
    const size_t own = strlen(name) - prefix;
    size_t allowed = own / 3 < 3 ? own / 3 : 3;
    const char *best = NULL;
    size_t best_d = allowed + 1;
    for (size_t i = 0; i < env_vars_count; i++) {
        size_t d = distance(name, env_vars[i].name);
        if (d < best_d) {
            best_d = d;
            best = env_vars[i].name;
        }
    }
    for (size_t i = 0; !best && own >= 4 && i < env_vars_count; i++)
        if (strncmp(env_vars[i].name, name, strlen(name)) == 0)
            best = env_vars[i].name;
    return best;
}
