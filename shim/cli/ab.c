/*
 * ab.c - `bfcshim ab [options] -- CMD ARGS`: the same job under the
 * framework's own allocator (arm A) and under the shim's BFC pool (arm B),
 * repeated and interleaved A B A B so that drift in the machine hits both
 * arms alike, then one table side by side (or --json).
 *
 * Arm A runs without the shim (--baseline none) or, by default, with it in
 * platform mode, which passes every call through and counts the driver
 * allocations. Arm B gets the shim options given here (--fraction ...).
 * Each run's statistics come from the shim's stats file (BFCSHIM_STATS_FILE
 * in a private temporary directory; with --stats-file, arm B's last run's
 * file is also copied there); peak device memory also comes from NVML
 * when it is installed. A number is taken from the job's output with
 * --metric REGEX (the first parenthesised group of the last matching line).
 */
#include <errno.h>
#include <math.h>
#include <regex.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "json_out.h"
#include "launch.h"
#include "nvml_peak.h"
#include "out_file.h"
#include "units.h"

typedef struct run_stats {
    double wall_s;
    int exit_status; /* 128 + signal when killed */
    bool has_metric, has_stats;
    double metric;
    uint64_t nvml_peak;
    /* from the shim's stats file */
    uint64_t driver_alloc_calls, driver_free_calls;
    uint64_t peak_device_bytes; /* pool bytes (bfc) or live passed-through bytes (platform) */
    uint64_t peak_bytes_in_use, num_allocs, num_ooms;
    bool stats_unwritten; /* --stats-file could not be written: the status says so */
} run_stats;

typedef struct arm {
    const char *name, *label;
    bool shim;
    env_list env;
    run_stats *runs;
    int nruns;
} arm;

typedef struct ab_opts {
    int repeat;
    bool interleave, json, verbose, nvml;
    const char *metric_name;
    regex_t metric;
    bool has_metric;
    const char *metric_pattern;
    char **cmd;
} ab_opts;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- the shim's stats file ----------------------------------------------------- */

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    while (s) {
        size_t got = fread(s + n, 1, cap - n - 1, f);
        n += got;
        if (n < cap - 1)
            break;
        char *t = realloc(s, cap *= 2);
        if (!t) {
            free(s);
            s = NULL;
        } else
            s = t;
    }
    fclose(f);
    if (s)
        s[n] = 0;
    return s;
}

/* Copies the file at `from` to `to` (replacing it, never through a link
 * planted there: out_file.h); false on failure. */
static bool copy_file(const char *from, const char *to)
{
    char *text = slurp(from);
    FILE *f = text ? out_file_fopen(to, "w") : NULL;
    bool ok = f && fputs(text, f) >= 0;
    if (f && !out_file_close(f))
        ok = false;
    free(text);
    return ok;
}

/* Sum of every number stored under "key" between from and to. The stats
 * file is ours (stats_file.c): flat numbers, keys never repeated within one
 * object. */
static uint64_t sum_key(const char *from, const char *to, const char *key)
{
    char pat[80];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    uint64_t sum = 0;
    for (const char *p = strstr(from, pat); p && p < to; p = strstr(p + 1, pat))
        sum += strtoull(p + strlen(pat), NULL, 10);
    return sum;
}

/* The text of a section: "pools": [...] or "platform": {...}. */
static const char *section(const char *doc, const char *name, const char **end)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", name);
    const char *p = strstr(doc, pat);
    if (!p) {
        *end = p;
        return NULL;
    }
    p += strlen(pat);
    char open = *p, close = open == '[' ? ']' : '}';
    int depth = 0;
    const char *q = p;
    for (; *q; q++) {
        depth += *q == open;
        depth -= *q == close;
        if (depth == 0)
            break;
    }
    *end = q;
    return p;
}

static bool read_stats(const char *path, run_stats *r)
{
    char *doc = slurp(path);
    if (!doc)
        return false;
    const char *pend, *pools = section(doc, "pools", &pend);
    const char *qend, *plat = section(doc, "platform", &qend);
    if (pools) {
        r->peak_device_bytes = sum_key(pools, pend, "peak_pool_bytes");
        r->peak_bytes_in_use = sum_key(pools, pend, "peak_bytes_in_use");
        r->num_allocs = sum_key(pools, pend, "num_allocs");
        r->num_ooms = sum_key(pools, pend, "num_ooms");
    }
    if (plat) {
        r->peak_device_bytes += sum_key(plat, qend, "peak_bytes_in_use");
        r->peak_bytes_in_use += sum_key(plat, qend, "peak_bytes_in_use");
        r->num_allocs += sum_key(plat, qend, "num_allocs");
    }
    const char *end = doc + strlen(doc);
    const char *top = qend ? qend : doc; /* the totals follow the sections */
    r->driver_alloc_calls = sum_key(top, end, "driver_alloc_calls");
    r->driver_free_calls = sum_key(top, end, "driver_free_calls");
    free(doc);
    return true;
}

/* ---- one run ---------------------------------------------------------------------- */

static void scan_line(const ab_opts *o, const char *line, run_stats *r)
{
    regmatch_t m[2];
    if (!o->has_metric || regexec(&o->metric, line, 2, m, 0) != 0)
        return;
    regmatch_t g = m[1].rm_so >= 0 ? m[1] : m[0];
    char num[64];
    size_t n = (size_t)(g.rm_eo - g.rm_so);
    if (n >= sizeof num)
        n = sizeof num - 1;
    memcpy(num, line + g.rm_so, n);
    num[n] = 0;
    char *end;
    double v = strtod(num, &end);
    if (end != num) {
        r->metric = v;
        r->has_metric = true;
    }
}

static bool run_one(const ab_opts *o, const arm *a, const char *shim, const char *stats_path,
                    run_stats *r)
{
    memset(r, 0, sizeof *r);
    int fds[2];
    if (pipe(fds) != 0)
        return false;
    unlink(stats_path);
    nvml_watch w;
    bool watching = o->nvml && nvml_watch_start(&w);
    double t0 = now_s();
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return false;
    }
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        env_apply(&a->env);
        if (a->shim) {
            setenv("BFCSHIM_STATS_FILE", stats_path, 1);
            launch_preload(shim);
        }
        execvp(o->cmd[0], o->cmd);
        fprintf(stderr, "bfcshim ab: cannot run %s: %s\n", o->cmd[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    FILE *in = fdopen(fds[0], "r");
    char line[8192];
    while (in && fgets(line, sizeof line, in)) {
        if (o->verbose)
            fputs(line, stderr);
        scan_line(o, line, r);
    }
    if (in)
        fclose(in);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    r->wall_s = now_s() - t0;
    r->exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (watching)
        r->nvml_peak = nvml_watch_stop(&w);
    r->has_stats = a->shim && read_stats(stats_path, r);
    const char *wanted = a->shim ? env_value(&a->env, "BFCSHIM_STATS_FILE") : NULL;
    if (r->has_stats && wanted && !copy_file(stats_path, wanted)) {
        cli_cannot_write("ab", wanted, errno);
        r->stats_unwritten = true;
    }
    return true;
}

/* ---- the table -------------------------------------------------------------------- */

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

typedef double (*field_fn)(const run_stats *);

/* Median, min and max of a field over an arm's runs (those that have it). */
static int summarise(const arm *a, field_fn f, bool (*has)(const run_stats *), double *med,
                     double *lo, double *hi)
{
    double v[256];
    int n = 0;
    for (int i = 0; i < a->nruns && n < 256; i++)
        if (!has || has(&a->runs[i]))
            v[n++] = f(&a->runs[i]);
    if (!n)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    *med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    *lo = v[0];
    *hi = v[n - 1];
    return n;
}

static double f_wall(const run_stats *r) { return r->wall_s; }
static double f_metric(const run_stats *r) { return r->metric; }
static double f_peak(const run_stats *r) { return (double)r->peak_device_bytes; }
static double f_nvml(const run_stats *r) { return (double)r->nvml_peak; }
static double f_inuse(const run_stats *r) { return (double)r->peak_bytes_in_use; }
static double f_dalloc(const run_stats *r) { return (double)r->driver_alloc_calls; }
static double f_dfree(const run_stats *r) { return (double)r->driver_free_calls; }
static double f_ooms(const run_stats *r) { return (double)r->num_ooms; }
static bool h_metric(const run_stats *r) { return r->has_metric; }
static bool h_stats(const run_stats *r) { return r->has_stats; }

typedef struct row {
    const char *name;
    field_fn f;
    bool (*has)(const run_stats *);
    bool bytes, spread;
} row;

static void cell(char *buf, size_t len, const arm *a, const row *rw)
{
    double med, lo, hi;
    if (!summarise(a, rw->f, rw->has, &med, &lo, &hi)) {
        snprintf(buf, len, "n/a");
        return;
    }
    char m[32], l[32], h[32];
    if (rw->bytes) {
        format_size((uint64_t)med, m, sizeof m);
        format_size((uint64_t)lo, l, sizeof l);
        format_size((uint64_t)hi, h, sizeof h);
    } else {
        snprintf(m, sizeof m, "%.4g", med);
        snprintf(l, sizeof l, "%.4g", lo);
        snprintf(h, sizeof h, "%.4g", hi);
    }
    if (rw->spread && lo != hi)
        snprintf(buf, len, "%s (%s-%s)", m, l, h);
    else
        snprintf(buf, len, "%s", m);
}

static void print_table(const ab_opts *o, arm *arms)
{
    const row rows[] = {
        {"wall time (s), median (range)", f_wall, NULL, false, true},
        {o->metric_name, f_metric, h_metric, false, true},
        {"peak device memory (shim)", f_peak, h_stats, true, true},
        {"peak device memory (NVML)", f_nvml, NULL, true, true},
        {"peak bytes in use (shim)", f_inuse, h_stats, true, true},
        {"driver allocation calls", f_dalloc, h_stats, false, true},
        {"driver free calls", f_dfree, h_stats, false, true},
        {"out-of-memory in the pool", f_ooms, h_stats, false, true},
    };
    printf("%-32s %-34s %-34s\n", "", arms[0].label, arms[1].label);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (rows[i].f == f_metric && !o->has_metric)
            continue;
        if (rows[i].f == f_nvml && !o->nvml)
            continue;
        char c0[128], c1[128];
        cell(c0, sizeof c0, &arms[0], &rows[i]);
        cell(c1, sizeof c1, &arms[1], &rows[i]);
        printf("%-32s %-34s %-34s\n", rows[i].name, c0, c1);
    }
    printf("%-32s", "exit status");
    for (int k = 0; k < 2; k++) {
        char s[64] = "";
        for (int i = 0; i < arms[k].nruns; i++) {
            size_t used = strlen(s);
            snprintf(s + used, sizeof s - used, "%s%d", i ? " " : "", arms[k].runs[i].exit_status);
        }
        printf(" %-34s", s);
    }
    printf("\n");
    if (!o->nvml)
        printf("(peak device memory from the shim's accounting only: NVML is not available)\n");
    else
        printf("(NVML: whole-device used memory above the idle baseline; shim: what its pools "
               "took from the device)\n");
}

static void print_json(const ab_opts *o, arm *arms)
{
    json_out j;
    json_begin(&j, stdout, true);
    json_object_open(&j, NULL);
    json_u64(&j, "version", 1);
    json_i64(&j, "repeat", o->repeat);
    json_bool(&j, "interleaved", o->interleave);
    json_bool(&j, "nvml", o->nvml);
    json_string(&j, "metric_name", o->has_metric ? o->metric_name : NULL);
    json_array_open(&j, "command");
    for (char **c = o->cmd; *c; c++)
        json_string(&j, NULL, *c);
    json_array_close(&j);
    json_array_open(&j, "arms");
    for (int k = 0; k < 2; k++) {
        const arm *a = &arms[k];
        json_object_open(&j, NULL);
        json_string(&j, "name", a->name);
        json_string(&j, "label", a->label);
        json_bool(&j, "shim", a->shim);
        double med, lo, hi;
        if (summarise(a, f_wall, NULL, &med, &lo, &hi))
            json_double(&j, "wall_s_median", med);
        if (summarise(a, f_metric, h_metric, &med, &lo, &hi))
            json_double(&j, "metric_median", med);
        json_array_open(&j, "runs");
        for (int i = 0; i < a->nruns; i++) {
            const run_stats *r = &a->runs[i];
            json_object_open(&j, NULL);
            json_double(&j, "wall_s", r->wall_s);
            json_i64(&j, "exit_status", r->exit_status);
            if (r->has_metric)
                json_double(&j, "metric", r->metric);
            else
                json_null(&j, "metric");
            if (o->nvml)
                json_u64(&j, "nvml_peak_bytes", r->nvml_peak);
            if (r->has_stats) {
                json_u64(&j, "peak_device_bytes", r->peak_device_bytes);
                json_u64(&j, "peak_bytes_in_use", r->peak_bytes_in_use);
                json_u64(&j, "driver_alloc_calls", r->driver_alloc_calls);
                json_u64(&j, "driver_free_calls", r->driver_free_calls);
                json_u64(&j, "num_allocs", r->num_allocs);
                json_u64(&j, "num_ooms", r->num_ooms);
            }
            json_object_close(&j);
        }
        json_array_close(&j);
        json_object_close(&j);
    }
    json_array_close(&j);
    json_object_close(&j);
    json_end(&j);
    printf("\n");
}

/* ---- the command ------------------------------------------------------------------ */

static void ab_usage(FILE *f)
{
    fprintf(f,
            "usage: bfcshim ab [OPTIONS] -- CMD [ARGS...]\n\n"
            "Runs CMD under the framework's own allocator (A) and the bfcshim pool (B),\n"
            "interleaved A B A B, and prints a side-by-side table.\n"
            "  --repeat N           runs per arm (3)\n"
            "  --baseline MODE      arm A: platform (the shim passes everything through\n"
            "                       and counts; default) or none (no shim at all)\n"
            "  --env-a NAME=VALUE   extra variable for arm A (repeatable)\n"
            "  --env-b NAME=VALUE   extra variable for arm B, e.g.\n"
            "                       PYTORCH_NO_CUDA_MEMORY_CACHING=1\n"
            "  --metric REGEX       a number from the job's output: the first (group) of\n"
            "                       the last line matching the extended regex\n"
            "  --metric-name NAME   its label in the table (\"metric\")\n"
            "  --sequential         A A A B B B instead of interleaving\n"
            "  --json               the results as JSON (for `bfcshim report --ab`)\n"
            "  -v, --verbose        show the job's output\n"
            "Options for arm B's shim:\n%s",
            launch_options_help);
}

enum { AB_REPEAT = 2000, AB_BASELINE, AB_ENV_A, AB_ENV_B, AB_METRIC, AB_METRIC_NAME,
       AB_SEQUENTIAL, AB_JSON };

int cmd_ab(int argc, char **argv)
{
    static const struct option longopts[] = {
        LAUNCH_LONGOPTS,
        {"repeat", required_argument, 0, AB_REPEAT},
        {"baseline", required_argument, 0, AB_BASELINE},
        {"env-a", required_argument, 0, AB_ENV_A},
        {"env-b", required_argument, 0, AB_ENV_B},
        {"metric", required_argument, 0, AB_METRIC},
        {"metric-name", required_argument, 0, AB_METRIC_NAME},
        {"sequential", no_argument, 0, AB_SEQUENTIAL},
        {"json", no_argument, 0, AB_JSON},
        {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    ab_opts o = {.repeat = 3, .interleave = true, .metric_name = "metric"};
    arm arms[2] = {{.name = "A", .label = "A: native (counted)", .shim = true},
                   {.name = "B", .label = "B: bfcshim pool", .shim = true}};
    int status = 2;
    bool fake_gpu = false;
    int c;
    char *end;
    optind = 1;
    env_add(&arms[0].env, "BFCSHIM_ALLOCATOR", "platform");
    opterr = 0; /* cli_bad_option says it in one line */
    while ((c = getopt_long(argc, argv, "+:hv", longopts, NULL)) != -1) {
        switch (c) {
        case 'h': ab_usage(stdout); status = 0; goto out;
        case AB_REPEAT:
            o.repeat = (int)strtol(optarg, &end, 10);
            if (*end || o.repeat < 1 || o.repeat > 100) {
                cli_bad_value("ab", "--repeat", optarg, "a count from 1 to 100");
                goto out;
            }
            break;
        case AB_BASELINE:
            if (!strcmp(optarg, "none")) {
                arms[0].shim = false;
                arms[0].label = "A: native (no shim)";
                env_free(&arms[0].env);
            } else if (strcmp(optarg, "platform") != 0) {
                cli_bad_value("ab", "--baseline", optarg, "platform or none");
                goto out;
            }
            break;
        case AB_ENV_A:
        case AB_ENV_B: {
            /* Checked as --env is: a bad BFCSHIM_* value would otherwise
             * show up only as the arm's exit status 78 in the table. */
            int r = launch_env_assignment("ab", c == AB_ENV_A ? "--env-a" : "--env-b", optarg,
                                          &arms[c == AB_ENV_B].env);
            if (r == 0)
                fprintf(stderr, "bfcshim ab: out of memory\n");
            if (r <= 0)
                goto out;
            break;
        }
        case AB_METRIC: {
            int e = regcomp(&o.metric, optarg, REG_EXTENDED);
            if (e) {
                char msg[128];
                regerror(e, &o.metric, msg, sizeof msg);
                fprintf(stderr, "bfcshim ab: --metric '%s': %s\n", optarg, msg);
                goto out;
            }
            o.has_metric = true;
            o.metric_pattern = optarg;
            break;
        }
        case AB_METRIC_NAME: o.metric_name = optarg; break;
        case AB_SEQUENTIAL: o.interleave = false; break;
        case AB_JSON: o.json = true; break;
        case 'v': o.verbose = true; break; /* the metric warning names -v */
        default: {
            /* --fake-gpu is where both arms run; every other option shapes
             * the shim's arm only. */
            if (c == LOPT_FAKE_GPU && launch_option("ab", c, optarg, &arms[0].env) < 0)
                goto out;
            fake_gpu |= c == LOPT_FAKE_GPU;
            int r = launch_option("ab", c, optarg, &arms[1].env);
            if (r == 0)
                cli_bad_option("ab", argv, c);
            if (r <= 0)
                goto out;
        }
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "bfcshim ab: no command given\n");
        ab_usage(stderr);
        goto out;
    }
    o.cmd = argv + optind;
    /* The shim's arm decides: the native arm runs with the driver door
     * open, but on the fake GPU neither can run such a program. */
    if (!launch_check_runtime("ab", o.cmd[0], fake_gpu, &arms[1].env))
        goto out;
    const char *shim = launch_find_shim();
    if (!shim)
        goto out;
    char dir[] = "/tmp/bfcshim-ab-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "bfcshim ab: cannot make a temporary directory: %s\n", strerror(errno));
        goto out;
    }
    o.nvml = nvml_available();
    for (int k = 0; k < 2; k++)
        arms[k].runs = calloc((size_t)o.repeat, sizeof(run_stats));
    int total = 2 * o.repeat;
    for (int i = 0; i < total; i++) {
        int k = o.interleave ? i % 2 : i / o.repeat;
        arm *a = &arms[k];
        char stats[sizeof dir + 32];
        snprintf(stats, sizeof stats, "%s/%s%d.json", dir, a->name, a->nruns);
        fprintf(stderr, "bfcshim ab: run %d/%d, %s ...", i + 1, total, a->label);
        fflush(stderr);
        if (!a->runs || !run_one(&o, a, shim, stats, &a->runs[a->nruns])) {
            fprintf(stderr, " could not start\n");
            goto cleanup;
        }
        const run_stats *r = &a->runs[a->nruns++];
        fprintf(stderr, " %.2f s, exit %d\n", r->wall_s, r->exit_status);
        unlink(stats);
    }
    if (o.json)
        print_json(&o, arms);
    else
        print_table(&o, arms);
    /* A pattern that never matched leaves an empty row that reads like a
     * result: say so. */
    bool matched = false;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < arms[k].nruns; i++)
            matched |= arms[k].runs[i].has_metric;
    if (o.has_metric && !matched)
        fprintf(stderr,
                "bfcshim ab: warning: --metric '%s' matched no line of the job's output in any "
                "run (it needs a parenthesised number, e.g. 'samples/s ([0-9.]+)'; -v shows "
                "the output)\n",
                o.metric_pattern);
    /* The comparison worked; a job that failed is in the table, and in the
     * status: 1 when any run did not exit 0, or its --stats-file could not
     * be written (said above: a file cut short must not pass for one). */
    status = 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < arms[k].nruns; i++)
            if (arms[k].runs[i].exit_status != 0 || arms[k].runs[i].stats_unwritten)
                status = 1;
cleanup:
    rmdir(dir);
out:
    for (int k = 0; k < 2; k++) {
        env_free(&arms[k].env);
        free(arms[k].runs);
    }
    if (o.has_metric)
        regfree(&o.metric);
    return status;
}
