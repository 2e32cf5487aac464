/*
 * report.c - `bfcshim report TRACE.csv [--stats S.json] [--ab AB.json]`:
 * one self-contained HTML page (no network, no external files) showing
 *   - live bytes over time, the peak marked, and the largest allocations as
 *     stacked bands over time, zoomable (report_timeline.c);
 *   - the pool's occupancy map at the peak and at the first failure (hover:
 *     address, size, age), and at any of 24 moments under a time cursor,
 *     from replaying the trace through the engine (report_replay.c);
 *   - fragmentation over time: free bytes by hole size, the largest free
 *     block;
 *   - a histogram of allocation sizes;
 *   - the stats file and the `bfcshim ab --json` table when given.
 *
 * The page is report_page.html (embedded at build time by
 * scripts/embed_text.py) with the data as one JSON object in a
 * <script type="application/json"> element; its script draws SVG.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bfc.h"
#include "cli.h"
#include "json_check.h"
#include "json_out.h"
#include "out_file.h"
#include "report_replay.h"
#include "report_timeline.h"
#include "report_page.h"
#include "trace_csv.h"
#include "units.h"

enum { MAX_POINTS = 2000 };

/* Copies a JSON input into the page's data verbatim (it is our own
 * output, checked when loaded), or null when there is none. */
static void embed_text(FILE *out, const char *text, size_t n)
{
    if (!text) {
        fputs("null", out);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        /* keep "</script>" out of the data block */
        if (text[i] == '<')
            fputs("\\u003c", out);
        else
            fputc(text[i], out);
    }
}

/* The job's limit, from its statistics' "bytes_limit" (0: none). */
static uint64_t stats_limit(const char *text)
{
    const char *p = text ? strstr(text, "\"bytes_limit\": ") : NULL;
    return p ? strtoull(p + 15, NULL, 10) : 0;
}

/* A --stats or --ab input, read once: validated here, then embedded in the
 * page (and the limit taken from it) from the same bytes. */
typedef struct input_text {
    char *text; /* NUL-terminated; NULL when there is none */
    size_t n;
} input_text;

/* Reads `path`, which must be what it claims: well-formed JSON (the page's
 * script parses it) with the key its writer always puts there. Returns
 * false, with a message on stderr unless `quiet`, and *in empty otherwise. */
static bool load_input(const char *path, const char *option, const char *key, const char *what,
                       bool quiet, input_text *in)
{
    *in = (input_text){0};
    FILE *f = fopen(path, "r");
    if (!f) {
        if (!quiet)
            fprintf(stderr, "bfcshim report: %s %s: %s\n", option, path, strerror(errno));
        return false;
    }
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap);
    size_t got;
    while (text && (got = fread(text + n, 1, cap - 1 - n, f)) > 0)
        if ((n += got) == cap - 1 && cap < (SIZE_MAX >> 1)) {
            char *bigger = realloc(text, cap *= 2);
            if (!bigger)
                free(text);
            text = bigger;
        }
    fclose(f);
    if (text)
        text[n] = 0;
    char why[128] = "", needle[64];
    snprintf(needle, sizeof needle, "\"%s\"", key);
    bool json = text && json_check(text, n, why, sizeof why);
    bool ok = json && memmem(text, n, needle, strlen(needle)) != NULL;
    if (!ok && !quiet) {
        if (!json)
            fprintf(stderr, "bfcshim report: %s %s: not JSON (%s); expected %s\n", option, path,
                    text ? why : "out of host memory", what);
        else
            fprintf(stderr, "bfcshim report: %s %s: not %s (it has no \"%s\")\n", option,
                    path, what, key);
    }
    if (!ok) {
        free(text);
        return false;
    }
    *in = (input_text){text, n};
    return true;
}

#define STATS_WHAT "a bfcshim statistics file (BFCSHIM_STATS_FILE, bfcshim run --stats-file)"
#define AB_WHAT "a bfcshim ab --json result"

/* A file next to the trace with the same stem and another ending
 * (job.csv[.gz] -> job.json, job.frames.txt), when it can be read. */
static const char *sibling(const char *trace, const char *ending, char *buf, size_t len)
{
    snprintf(buf, len, "%s", trace);
    char *dot = strrchr(buf, '.');
    if (dot && strcmp(dot, ".gz") == 0) {
        *dot = 0;
        dot = strrchr(buf, '.');
    }
    char *slash = strrchr(buf, '/');
    if (!dot || (slash && dot < slash) || strcmp(dot, ending) == 0)
        return NULL;
    if ((size_t)(dot - buf) + strlen(ending) + 1 > len)
        return NULL;
    strcpy(dot, ending);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

/* Whether path is a frames file (snapshot2csv --frames), whose first line
 * is FRAMES_MAGIC: its lines are matched to allocations by their order
 * alone, so any other text would put wrong places on the chart without a
 * word. why (when not NULL) says what is wrong. */
#define FRAMES_MAGIC "# bfcshim frames v1"
static bool frames_file_ok(const char *path, char *why, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (why)
            snprintf(why, len, "%s", strerror(errno));
        return false;
    }
    char first[64] = "";
    bool read = fgets(first, sizeof first, f) != NULL;
    fclose(f);
    bool ok = strncmp(first, FRAMES_MAGIC, strlen(FRAMES_MAGIC)) == 0;
    if (!ok && why)
        snprintf(why, len, "not a frames file (%s; one starts with '%s', as "
                 "snapshot2csv --frames writes)", read ? "its first line differs" : "it is empty",
                 FRAMES_MAGIC);
    return ok;
}

typedef struct report_opts {
    const char *trace, *output, *stats, *ab, *title, *frames;
    input_text stats_text, ab_text; /* the two files, as loaded */
    uint64_t pool_size;
    const bfc_options *compare; /* --compare: another policy, or NULL */
    const char *compare_name;
} report_opts;

/* Text that goes into the page's data block may not contain '<' (it would
 * end the <script> element). */
static const char *no_tags(const char *s, char *buf, size_t len)
{
    snprintf(buf, len, "%s", s);
    for (char *p = buf; *p; p++)
        if (*p == '<')
            *p = '_';
    return buf;
}

/* Is the time axis worth drawing? A trace the shim records has times at the
 * coarse clock's resolution (4 ms): a short job's events share one or a
 * few of them, and plotting by time would pile them into a column or two.
 * Times are used when they change at least 20 times from one event to the
 * next (once every four events in a short trace); otherwise the chart goes
 * by event order, which is exact. */
static bool times_usable(const trace *t)
{
    if (!t->times || t->nev < 2 || t->last_us <= t->first_us)
        return false;
    size_t changes = 0, want = t->nev / 4 < 20 ? t->nev / 4 : 20;
    for (size_t i = 1; i < t->nev && changes < want; i++)
        changes += t->times[i] != t->times[i - 1];
    return changes >= want && changes >= 1;
}

static int write_report(const report_opts *o, trace *t)
{
    char title[256], name[256];
    /* sizes of each allocation slot, for frees */
    uint64_t *slot_size = calloc(t->nslots ? t->nslots : 1, sizeof *slot_size);
    if (!slot_size) {
        fprintf(stderr, "bfcshim report: out of host memory\n");
        return 1;
    }
    /* Live bytes after every event, in one pass: the peak, and for the
     * series at most MAX_POINTS points, each its bucket's maximum so that
     * no peak disappears. */
    size_t step = t->nev / MAX_POINTS + 1, npoints = t->nev ? (t->nev - 1) / step + 1 : 0;
    uint64_t *bucket_max = calloc(npoints ? npoints : 1, sizeof *bucket_max);
    if (!bucket_max) {
        fprintf(stderr, "bfcshim report: out of host memory\n");
        free(slot_size);
        return 1;
    }
    size_t peak_at = 0;
    uint64_t live = 0, peak = 0;
    for (size_t i = 0; i < t->nev; i++) {
        const trace_event *e = &t->ev[i];
        if (e->kind == TRACE_ALLOC) {
            slot_size[e->slot] = e->size;
            live += e->size;
        } else {
            live -= slot_size[e->slot];
        }
        if (live > bucket_max[i / step])
            bucket_max[i / step] = live;
        if (live > peak) {
            peak = live;
            peak_at = i;
        }
    }

    const bool by_time = times_usable(t);

    bfc_options policy;
    bfc_options_init(&policy);
    /* Which pool the maps show, said plainly on the page: the maps are a
     * replay, and free space in the smallest pool is not the job's. */
    const char *pool_source = "--pool-size", *pool_kind = "given";
    uint64_t pool_bytes = o->pool_size;
    if (!pool_bytes && (pool_bytes = stats_limit(o->stats_text.text))) {
        pool_source = "bytes_limit of the job's statistics";
        pool_kind = "job";
    }
    if (!pool_bytes) {
        pool_bytes = replay_min_pool_bytes(t, &policy);
        pool_source = "the smallest pool that serves the trace";
        pool_kind = "smallest";
    }
    if (!pool_bytes)
        pool_bytes = UINT64_C(1) << 20;

    FILE *out = out_file_fopen(o->output, "w"); /* not through a planted link */
    if (!out) {
        cli_cannot_write("report", o->output, errno);
        free(bucket_max);
        free(slot_size);
        return 1;
    }
    fputs(report_page_head, out);
    json_out j;
    json_begin(&j, out, false);
    json_object_open(&j, NULL);
    json_u64(&j, "version", 1);
    json_string(&j, "title", no_tags(o->title ? o->title : t->name, title, sizeof title));
    json_string(&j, "trace", no_tags(t->name, name, sizeof name));
    json_u64(&j, "events", t->nev);
    json_u64(&j, "allocs", t->allocs);
    json_u64(&j, "frees", t->frees);
    json_u64(&j, "failed_allocs", t->failed_allocs);
    json_u64(&j, "peak_live_bytes", peak);
    json_u64(&j, "peak_event", peak_at);
    json_bool(&j, "has_times", by_time);
    json_u64(&j, "pool_bytes", pool_bytes);
    json_string(&j, "pool_source", pool_source);
    json_string(&j, "pool_kind", pool_kind);

    json_object_open(&j, "series");
    json_array_open(&j, "x");
    for (size_t i = 0; i < t->nev; i += step) {
        size_t last = i + step - 1 < t->nev ? i + step - 1 : t->nev - 1;
        report_write_x(&j, NULL, t, by_time, last);
    }
    json_array_close(&j);
    json_array_open(&j, "live");
    for (size_t k = 0; k < npoints; k++)
        json_u64(&j, NULL, bucket_max[k]);
    json_array_close(&j);
    json_u64(&j, "peak_index", peak_at / step);
    report_write_x(&j, "peak_x", t, by_time, peak_at);
    json_object_close(&j);

    /* size histogram by powers of two, every bucket from the smallest used
     * to the largest (empty ones too, so that the axis stays logarithmic) */
    uint64_t count[64] = {0}, bytes[64] = {0};
    unsigned lo_bucket = 63, hi_bucket = 0;
    for (size_t i = 0; i < t->nev; i++)
        if (t->ev[i].kind == TRACE_ALLOC) {
            unsigned b = t->ev[i].size ? 63u - (unsigned)__builtin_clzll(t->ev[i].size) : 0;
            count[b]++;
            bytes[b] += t->ev[i].size;
            lo_bucket = b < lo_bucket ? b : lo_bucket;
            hi_bucket = b > hi_bucket ? b : hi_bucket;
        }
    json_array_open(&j, "hist");
    for (unsigned b = lo_bucket; b <= hi_bucket; b++) { /* none when nothing was allocated */
        json_object_open(&j, NULL);
        json_u64(&j, "lo", UINT64_C(1) << b);
        json_u64(&j, "count", count[b]);
        json_u64(&j, "bytes", bytes[b]);
        json_object_close(&j);
    }
    json_array_close(&j);

    /* the largest allocations as bands over time */
    report_timeline_write(t, o->frames, by_time, &j);

    /* the maps, the time cursor's maps and the fragmentation series */
    report_replay rr = {t, &policy, pool_bytes, peak_at, by_time, true};
    report_replay_write(&rr, &j);
    json_string(&j, "policy", bfc_placement_name(policy.placement));

    /* The same trace under another policy, in the same pool, side by side,
     * with the smallest pool each needs. */
    if (o->compare) {
        json_object_open(&j, "compare");
        json_u64(&j, "base_min_pool_bytes", strcmp(pool_kind, "smallest") == 0
                                                ? pool_bytes
                                                : replay_min_pool_bytes(t, &policy));
        json_string(&j, "policy", o->compare_name);
        json_u64(&j, "min_pool_bytes", replay_min_pool_bytes(t, o->compare));
        report_replay other = {t, o->compare, pool_bytes, peak_at, by_time, false};
        report_replay_write(&other, &j);
        json_object_close(&j);
    } else {
        json_null(&j, "compare");
    }

    json_end(&j); /* the object stays open: the embedded files follow */
    fputs(", \"stats\": ", out);
    embed_text(out, o->stats_text.text, o->stats_text.n);
    fputs(", \"ab\": ", out);
    embed_text(out, o->ab_text.text, o->ab_text.n);
    fputs("}", out);
    fputs(report_page_tail, out);
    /* A page cut short by a full disk is said, not reported as written. */
    bool ok = out_file_close(out);
    int err = errno;
    free(bucket_max);
    free(slot_size);
    if (!ok) {
        cli_cannot_write("report", o->output, err);
        return 1;
    }
    char a[32], b[32];
    fprintf(stderr, "bfcshim report: %s: %zu events, peak %s live; pool of %s (%s)\n",
            o->output, t->nev, format_size(peak, a, sizeof a),
            format_size(pool_bytes, b, sizeof b), pool_source);
    return 0;
}

static void report_usage(FILE *f)
{
    fprintf(f, "usage: bfcshim report TRACE.csv[.gz] [-o OUT.html] [--stats STATS.json]\n"
               "                      [--ab AB.json] [--pool-size SIZE] [--title TEXT]\n"
               "                      [--frames FRAMES.txt] [--compare POLICY]\n\n"
               "Writes one self-contained HTML page: live bytes over time with the peak,\n"
               "the pool's occupancy map at the peak and at the first failure (replayed\n"
               "through the engine at SIZE, else the stats file's limit, else the smallest\n"
               "pool that serves the trace), the allocation size histogram, the statistics\n"
               "(BFCSHIM_STATS_FILE) and the A/B table (bfcshim ab --json); with --compare,\n"
               "the same trace under another placement (aligned, age, low, or tsl: TSL's\n"
               "BFC policy) in the same pool, side by side.\n");
}

int cmd_report(int argc, char **argv)
{
    enum { R_STATS = 3000, R_AB, R_POOL, R_TITLE, R_FRAMES, R_COMPARE };
    static const struct option longopts[] = {{"output", required_argument, 0, 'o'},
                                             {"stats", required_argument, 0, R_STATS},
                                             {"ab", required_argument, 0, R_AB},
                                             {"pool-size", required_argument, 0, R_POOL},
                                             {"title", required_argument, 0, R_TITLE},
                                             {"frames", required_argument, 0, R_FRAMES},
                                             {"compare", required_argument, 0, R_COMPARE},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    report_opts o = {.output = "bfcshim-report.html"};
    bfc_options compare;
    int c;
    optind = 1;
    opterr = 0; /* cli_bad_option says it in one line */
    while ((c = getopt_long(argc, argv, ":o:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'o': o.output = optarg; break;
        case R_STATS: o.stats = optarg; break;
        case R_AB: o.ab = optarg; break;
        case R_TITLE: o.title = optarg; break;
        case R_FRAMES: o.frames = optarg; break;
        case R_COMPARE:
            /* the engine's placements, and TSL's policy as replay --tsl has it */
            bfc_options_init(&compare);
            if (strcmp(optarg, "tsl") == 0)
                cli_policy_tsl(&compare);
            else if (!bfc_placement_from_name(optarg, &compare.placement)) {
                return cli_bad_value("report", "--compare", optarg, "aligned, age, low or tsl");
            }
            o.compare = &compare;
            o.compare_name = optarg;
            break;
        case R_POOL:
            if (!parse_size(optarg, &o.pool_size) || o.pool_size == 0)
                return cli_bad_value("report", "--pool-size", optarg, "a size such as 40GiB");
            break;
        case 'h': report_usage(stdout); return 0;
        default: return cli_bad_option("report", argv, c);
        }
    }
    if (optind == argc) {
        fprintf(stderr, "bfcshim report: no trace given: bfcshim report [OPTIONS] "
                        "TRACE.csv[.gz]; bfcshim report --help lists the options\n");
        return 2;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "bfcshim report: one trace at a time, not %d\n", argc - optind);
        return 2;
    }
    o.trace = argv[optind];
    if (!cli_output_place_ok("report", "-o", o.output))
        return 2;
    if (o.stats && !load_input(o.stats, "--stats", "pools", STATS_WHAT, false, &o.stats_text))
        return 2;
    if (o.ab && !load_input(o.ab, "--ab", "arms", AB_WHAT, false, &o.ab_text)) {
        free(o.stats_text.text);
        return 2;
    }
    /* What the job wrote next to its trace: its statistics (bfcshim run
     * --stats-file job.json) and where its allocations were made
     * (snapshot2csv --frames job.frames.txt). */
    char stats_next[4096], frames_next[4096];
    if (!o.stats && (o.stats = sibling(o.trace, ".json", stats_next, sizeof stats_next))) {
        if (load_input(o.stats, "", "pools", STATS_WHAT, true, &o.stats_text))
            fprintf(stderr, "bfcshim report: the job's statistics from %s, next to the trace\n",
                    o.stats);
        else
            o.stats = NULL;
    }
    bool frames_next_to_trace = false;
    if (!o.frames && (o.frames = sibling(o.trace, ".frames.txt", frames_next,
                                         sizeof frames_next))) {
        frames_next_to_trace = true;
        char why[200];
        if (frames_file_ok(o.frames, why, sizeof why)) {
            fprintf(stderr, "bfcshim report: where allocations were made, from %s\n",
                    o.frames);
        } else {
            /* Nobody asked for this file: the report goes on without it. */
            fprintf(stderr, "bfcshim report: %s, next to the trace: %s; not used\n", o.frames,
                    why);
            o.frames = NULL;
        }
    }
    char why[200];
    if (o.frames && !frames_next_to_trace && !frames_file_ok(o.frames, why, sizeof why)) {
        fprintf(stderr, "bfcshim report: --frames %s: %s\n", o.frames, why);
        free(o.stats_text.text);
        free(o.ab_text.text);
        return 2;
    }
    trace t;
    int status = 1;
    if (trace_load_with_times(&t, o.trace))
        status = write_report(&o, &t);
    else
        fprintf(stderr, "bfcshim report: %s\n", t.error);
    trace_free(&t);
    free(o.stats_text.text);
    free(o.ab_text.text);
    return status;
}
