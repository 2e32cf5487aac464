/*
 * launch.h - what `bfcshim run` and `bfcshim ab` share: finding
 * libbfcshim.so without the user typing its path, turning command-line
 * options into BFCSHIM_* variables, and preloading the library while keeping
 * an LD_PRELOAD the user already has.
 */
#ifndef BFCSHIM_CLI_LAUNCH_H
#define BFCSHIM_CLI_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>

/* Environment changes for one child: NAME=VALUE strings (owned copies). */
typedef struct env_list {
    char **items;
    size_t n, cap;
} env_list;

bool env_add(env_list *e, const char *name, const char *value);
/* Adds "NAME=VALUE" given as one string; false if it has no '='. */
bool env_add_assignment(env_list *e, const char *assignment);
void env_free(env_list *e);
/* The value the list gives NAME (the last assignment wins), or NULL. */
const char *env_value(const env_list *e, const char *name);
/* Applies the list to this process's environment (in a child, before exec). */
void env_apply(const env_list *e);

/* The shim library: $BFCSHIM_LIBRARY, else next to the command (the build
 * tree: shim/libbfcshim.so), else where it was installed. NULL with a
 * message on stderr when none is found. */
const char *launch_find_shim(void);

/* The folder of the fake CUDA libraries (libcuda.so.1, libcudart.so.13) that
 * come with bfcshim: the build tree's tests/fake_cuda, or where they were
 * installed (LIBDIR/bfcshim-fake-cuda). NULL with a message when none. */
const char *launch_find_fake_cuda(void);

/* Sets LD_PRELOAD in this process's environment to the shim followed by
 * whatever was there (without listing the shim twice). */
void launch_preload(const char *shim);

/* Before `cmd` (run, ab) starts `prog`: a program with the CUDA runtime
 * linked in statically (cudart_link.h) cannot run on the fake GPU, which
 * is said in one line, and false is returned; with the driver door closed
 * (in `e` or the environment) none of its allocations would reach the
 * pool, which is said in one line of warning. True otherwise. */
bool launch_check_runtime(const char *cmd, const char *prog, bool fake_gpu, const env_list *e);

/*
 * The shim options of run and ab. Returns 1 when `opt` (a getopt val from
 * LAUNCH_LONGOPTS) was one of them and was applied to `e`, 0 when it is not
 * a shim option, -1 (after a message) for a bad value.
 */
enum {
    LOPT_FRACTION = 1000, LOPT_LIMIT, LOPT_NO_PREALLOC, LOPT_PLATFORM, LOPT_FREE_POLICY,
    LOPT_NO_GC, LOPT_STATS_FILE, LOPT_STATS, LOPT_TRACE, LOPT_OOM_REPORT, LOPT_LOG_LEVEL,
    LOPT_LOG_FILE, LOPT_NO_DRIVER_HOOKS, LOPT_PLACEMENT, LOPT_ENV, LOPT_FAKE_GPU,
};
#define LAUNCH_LONGOPTS                                                                  \
    {"fraction", required_argument, 0, LOPT_FRACTION},                                   \
        {"limit", required_argument, 0, LOPT_LIMIT},                                     \
        {"no-preallocate", no_argument, 0, LOPT_NO_PREALLOC},                            \
        {"platform", no_argument, 0, LOPT_PLATFORM},                                     \
        {"free-policy", required_argument, 0, LOPT_FREE_POLICY},                         \
        {"no-gc", no_argument, 0, LOPT_NO_GC},                                           \
        {"stats-file", required_argument, 0, LOPT_STATS_FILE},                           \
        {"stats", no_argument, 0, LOPT_STATS}, {"trace", required_argument, 0, LOPT_TRACE}, \
        {"oom-report", required_argument, 0, LOPT_OOM_REPORT},                           \
        {"log-level", required_argument, 0, LOPT_LOG_LEVEL},                             \
        {"log-file", required_argument, 0, LOPT_LOG_FILE},                               \
        {"no-driver-hooks", no_argument, 0, LOPT_NO_DRIVER_HOOKS},                       \
        {"placement", required_argument, 0, LOPT_PLACEMENT},                             \
        {"env", required_argument, 0, LOPT_ENV},                                         \
        {"fake-gpu", no_argument, 0, LOPT_FAKE_GPU}
int launch_option(const char *cmd, int opt, const char *arg, env_list *e);
/* NAME=VALUE given with `option` (--env, or ab's --env-a and --env-b): any
 * variable for the program; a BFCSHIM_* one must be a known name with a
 * value the library accepts. 1 added, 0 out of memory, -1 refused (said). */
int launch_env_assignment(const char *cmd, const char *option, const char *arg, env_list *e);
/* Usage lines for those options. */
extern const char launch_options_help[];

#endif
