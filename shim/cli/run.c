/*
 * run.c - `bfcshim run [options] -- CMD ARGS`: CMD with the shim preloaded.
 *
 * The options become BFCSHIM_* variables, the shim goes in front of any
 * LD_PRELOAD the user has, and the command replaces this process (exec), so
 * its exit status, signals and terminal are its own.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "launch.h"

static void run_usage(FILE *f)
{
    fprintf(f, "usage: bfcshim run [OPTIONS] -- CMD [ARGS...]\n\n"
               "Runs CMD with libbfcshim.so preloaded; exits with CMD's status.\n%s",
            launch_options_help);
}

int cmd_run(int argc, char **argv)
{
    static const struct option longopts[] = {LAUNCH_LONGOPTS,
                                              {"help", no_argument, 0, 'h'},
                                              {0, 0, 0, 0}};
    env_list env = {0};
    bool fake_gpu = false;
    int c;
    optind = 1;
    opterr = 0; /* cli_bad_option says it in one line */
    while ((c = getopt_long(argc, argv, "+:h", longopts, NULL)) != -1) {
        if (c == 'h') {
            run_usage(stdout);
            return 0;
        }
        int r = launch_option("run", c, optarg, &env);
        if (r < 0)
            return 2;
        if (r == 0)
            return cli_bad_option("run", argv, c);
        fake_gpu |= c == LOPT_FAKE_GPU;
    }
    if (optind >= argc) {
        fprintf(stderr, "bfcshim run: no command given: bfcshim run [OPTIONS] -- CMD [ARGS...]\n");
        return 2;
    }
    if (!launch_check_runtime("run", argv[optind], fake_gpu, &env))
        return 2;
    const char *shim = launch_find_shim();
    if (!shim)
        return 2;
    env_apply(&env);
    launch_preload(shim);
    execvp(argv[optind], argv + optind);
    fprintf(stderr, "bfcshim run: cannot run %s: %s\n", argv[optind], strerror(errno));
    return errno == ENOENT ? 127 : 126;
}
