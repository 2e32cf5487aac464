/*
 * plan.c - `bfcshim plan`: the offline packing of a recorded trace, as a
 * bound and as a placement plan for the next run.
 *
 *   bfcshim plan [--granularity B] [-o PLAN] [--json] TRACE.csv[.gz]
 *
 * The granularity defaults to the pool's default alignment (env_vars.h): the
 * shim uses only a plan packed at its own BFCSHIM_ALIGNMENT.
 *
 * Online placement decides where each block goes knowing only the past; a
 * packing that knows every lifetime (offline_pack.c) shows how small a pool
 * could be, and, written as a plan (plan_file.h), tells a later run of the
 * same job where each allocation goes: BFCSHIM_PLAN=PLAN for the shim,
 * `bfcshim replay --plan PLAN` to measure it first.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "env_vars.h"
#include "json_out.h"
#include "offline_pack.h"
#include "plan_file.h"
#include "units.h"

static void plan_usage(FILE *f)
{
    fprintf(f,
            "usage: bfcshim plan [--granularity BYTES] [-o PLAN] [--json] TRACE.csv[.gz]\n"
            "\n"
            "Packs the trace's allocations offline (every lifetime known in advance) and\n"
            "reports the pool that packing needs: the bound online placement is measured\n"
            "against. With -o, writes it as a placement plan for a later run of the same\n"
            "job: BFCSHIM_PLAN=PLAN (preallocated pool), or bfcshim replay --plan PLAN.\n"
            "  -o, --output PLAN   write the plan there (- for standard output)\n"
            "  --granularity B     size rounding: the pool's BFCSHIM_ALIGNMENT, which must\n"
            "                      match for the plan to be used (%u, its default)\n"
            "  --json              print the figures as one JSON object\n",
            ENV_ALIGNMENT_DEFAULT);
}

int cmd_plan(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"output", required_argument, 0, 'o'},
        {"granularity", required_argument, 0, 'g'},
        {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *out_path = NULL;
    uint64_t granularity = ENV_ALIGNMENT_DEFAULT;
    bool json = false;
    int c;
    optind = 1;
    opterr = 0; /* cli_bad_option says it in one line */
    while ((c = getopt_long(argc, argv, ":o:h", longopts, NULL)) != -1) {
        uint64_t v;
        switch (c) {
        case 'o': out_path = optarg; break;
        case 'g':
            if (!parse_power_of_two_in(optarg, ENV_ALIGNMENT_MIN, ENV_ALIGNMENT_MAX, &v))
                return cli_bad_value("plan", "--granularity", optarg,
                                     "a power of two from 256 to 1MiB, as BFCSHIM_ALIGNMENT");
            granularity = v;
            break;
        case 'j': json = true; break;
        case 'h': plan_usage(stdout); return 0;
        default: return cli_bad_option("plan", argv, c);
        }
    }
    if (optind != argc - 1) {
        plan_usage(stderr);
        return 2;
    }
    const char *path = argv[optind];
    trace t;
    if (!trace_load(&t, path)) {
        fprintf(stderr, "bfcshim plan: %s\n", t.error);
        trace_free(&t);
        return 1;
    }
    int status = 1;
    plan_file plan = {.granularity = granularity, .n = t.nslots};
    if (t.nslots == 0) {
        fprintf(stderr, "bfcshim plan: %s: no allocations to plan\n", path);
        goto out;
    }
    plan.entries = calloc(t.nslots, sizeof *plan.entries);
    plan.pool_bytes = plan.entries ? offline_pack(&t, granularity, plan.entries) : 0;
    if (plan.pool_bytes == 0) {
        fprintf(stderr, "bfcshim plan: %s: out of host memory\n", path);
        goto out;
    }
    if (out_path && !plan_file_write(out_path, &plan)) {
        cli_cannot_write("plan", out_path, errno);
        goto out;
    }
    const uint64_t pool = plan.pool_bytes;
    const double eff = (double)t.peak_live_bytes / (double)pool;
    /* The figures go to stderr when the plan itself goes to stdout. */
    FILE *report = out_path && !strcmp(out_path, "-") ? stderr : stdout;
    if (json) {
        json_out j;
        json_begin(&j, report, false);
        json_object_open(&j, NULL);
        json_string(&j, "trace", path);
        json_u64(&j, "allocations", t.nslots);
        json_u64(&j, "peak_live_bytes", t.peak_live_bytes);
        json_u64(&j, "offline_pool_bytes", pool);
        json_double(&j, "offline_efficiency", eff);
        json_u64(&j, "granularity", granularity);
        if (out_path)
            json_string(&j, "plan", out_path);
        else
            json_null(&j, "plan");
        json_object_close(&j);
        json_end(&j);
    } else {
        char a[32], b[32];
        fprintf(report,
                "%s: %zu allocations, peak live %s; packed offline into %s (efficiency %.4f)%s%s\n",
                path, (size_t)t.nslots, format_size(t.peak_live_bytes, a, sizeof a),
                format_size(pool, b, sizeof b), eff, out_path ? "; plan written to " : "",
                out_path ? out_path : "");
    }
    status = 0;
out:
    plan_file_free(&plan);
    trace_free(&t);
    return status;
}
