/*
 * main.c - the `bfcshim` command: one binary, one subcommand per task.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "out_file.h"

#ifndef BFCSHIM_VERSION
#define BFCSHIM_VERSION "unknown"
#endif

int cli_bad_option(const char *cmd, char **argv, int c)
{
    /* getopt_long leaves optind past the word it refused (for a missing
     * value, past the option that wanted it); a short option may sit
     * inside a word of several (-xh), so it is named alone. */
    const char *word = optind > 0 ? argv[optind - 1] : "?";
    const char *what = c == ':' ? "needs a value" : "unknown option";
    if (optopt > 0 && optopt < 256 && !(word[0] == '-' && word[1] == '-'))
        fprintf(stderr, "bfcshim %s: -%c: %s; bfcshim %s --help lists the options\n", cmd,
                optopt, what, cmd);
    else
        fprintf(stderr, "bfcshim %s: %s: %s; bfcshim %s --help lists the options\n", cmd, word,
                what, cmd);
    return 2;
}

int cli_bad_value(const char *cmd, const char *option, const char *value,
                  const char *accepted)
{
    fprintf(stderr, "bfcshim %s: %s '%s' is not %s\n", cmd, option, value, accepted);
    return 2;
}

void cli_cannot_write(const char *cmd, const char *path, int err)
{
    char why[160];
    out_file_why(path, err, why, sizeof why);
    fprintf(stderr, "bfcshim %s: %s %s\n", cmd, path, why);
}

bool cli_output_place_ok(const char *cmd, const char *option, const char *path)
{
    char folder[4096];
    if (strcmp(path, "-") == 0)
        return true;
    if (out_file_names_folder(path)) {
        fprintf(stderr, "bfcshim %s: %s %s: that is a folder; name a file in it\n", cmd, option,
                path);
        return false;
    }
    if (out_file_folder_missing(path, folder, sizeof folder)) {
        fprintf(stderr, "bfcshim %s: %s %s: the folder %s does not exist\n", cmd, option, path,
                folder);
        return false;
    }
    return true;
}

const char *cli_option_name(const struct option *opts, int val)
{
    static char buf[64];
    for (; opts->name; opts++)
        if (opts->val == val) {
            snprintf(buf, sizeof buf, "--%s", opts->name);
            return buf;
        }
    return "option";
}

static const struct {
    const char *name;
    int (*run)(int, char **);
    const char *what;
} commands[] = {
    {"run", cmd_run, "run a program with the shim preloaded"},
    {"ab", cmd_ab, "compare a program under its own allocator and under the shim"},
    {"replay", cmd_replay, "replay allocation traces through the engine (no GPU)"},
    {"report", cmd_report, "turn a trace (and stats, and ab results) into an HTML page"},
    {"tracegen", cmd_tracegen, "write a synthetic training-step allocation trace"},
    {"plan", cmd_plan, "pack a trace offline: the bound, and a placement plan"},
};

/* The demo is the Python package's (it runs this command, a sample job
 * and the fake GPU that pip installs with it): listed here all the same,
 * since the README sends a new user to it first. */
static const char demo_what[] = "what bfcshim does, in six steps, on the fake GPU (pip's "
                                "bfcshim; scripts/demo.sh in a checkout)";

static void usage(FILE *f)
{
    fprintf(f, "usage: bfcshim COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].what);
    fprintf(f, "  %-10s %s\n", "demo", demo_what);
    fprintf(f, "  %-10s %s\n\n'bfcshim COMMAND --help' describes each.\n", "version",
            "print the version");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("bfcshim %s\n", BFCSHIM_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    if (!strcmp(cmd, "demo")) { /* pip's bfcshim runs it before this command */
        fprintf(stderr, "bfcshim demo: comes with the Python package (pip install .); in a "
                        "source tree, run scripts/demo.sh\n");
        return 2;
    }
    fprintf(stderr, "bfcshim: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
