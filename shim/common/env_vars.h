/*
 * env_vars.h - every BFCSHIM_* variable, what values it accepts, and the
 * nearest known name to a misspelt one. One table, read by the library
 * (which stops a program whose settings are malformed) and by the command
 * (which refuses them on its command line before launching anything), so
 * the two can never disagree about what is valid.
 */
#ifndef BFCSHIM_COMMON_ENV_VARS_H
#define BFCSHIM_COMMON_ENV_VARS_H

#include <stdbool.h>
#include <stddef.h>

/* BFCSHIM_ALIGNMENT: the pool's default size and alignment granule, and the
 * range it accepts. `bfcshim plan` packs at the same default and accepts
 * the same range: a pool takes only a plan packed at its own alignment, so a
 * plan made with default settings must be one a pool with default settings
 * uses. */
#define ENV_ALIGNMENT_DEFAULT 512u
#define ENV_ALIGNMENT_MIN 256u
#define ENV_ALIGNMENT_MAX (1u << 20)

typedef enum env_var_kind {
    VAR_BOOL,      /* true/false, 1/0, yes/no, on/off */
    VAR_SIZE,      /* a byte size above 0: 40GiB, 512MiB, 1073741824 */
    VAR_SIZE_OR_0, /* a byte size, or 0 for none */
    VAR_POW2_SIZE, /* a power-of-two size in [lo, hi] */
    VAR_NUMBER,    /* a real number in [lo, hi] */
    VAR_WHOLE,     /* a whole number in [lo, hi] */
    VAR_CHOICE,    /* one of choices (any case) */
    VAR_PATH,      /* a file path; %p becomes the pid */
    VAR_TOOL,      /* read by the command or scripts, not the library */
} env_var_kind;

typedef struct env_var {
    const char *name;
    env_var_kind kind;
    double lo, hi;
    /* VAR_CHOICE, NULL-terminated, in the order of the enum the library
     * maps them to (the index is the value) */
    const char *choices[5];
    const char *meaning;    /* a noun phrase for messages: "..., for MEANING" */
} env_var;

extern const env_var env_vars[];
extern const size_t env_vars_count;

/* The entry of a name, or NULL when it is not a bfcshim variable. */
const env_var *env_var_find(const char *name);

/* The index of `value` among v's choices (any case), or -1. */
int env_var_choice(const env_var *v, const char *value);

/* Is value acceptable for v? When not, `accepted` (if given) receives what
 * is, e.g. "a number from 0.000001 to 1, for the share of device memory the
 * pool may take". */
bool env_var_check(const env_var *v, const char *value, char *accepted, size_t len);

/* The known name nearest to `name`, or NULL when none is close: at most a
 * third of the part after BFCSHIM_ in edits (3 at most), or a known name
 * that `name` begins (4 characters past BFCSHIM_ or more). */
const char *env_var_closest(const char *name);

/* "; did you mean NAME?" for the nearest known name, or "" when none is
 * near: the tail of a message about an unknown name. Returns buf. */
const char *env_var_hint(const char *name, char *buf, size_t len);

#endif
