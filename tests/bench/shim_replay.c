/*
 * shim_replay - replays an RMM trace through the CUDA runtime under the
 * preloaded shim, on the fake driver, with a modelled GPU some operations
 * behind the host, and reports per allocation the driver calls the shim
 * made (by entry point), what each door call took, the pool's fence waits
 * and its peaks, beside the least any pool could hold at that lag without
 * waiting for the GPU or knowing streams (prefix_peaks). The driver calls are the figure that stands in for the
 * shim's cost on a GPU without one (issue 53): each is a trip into the
 * driver there, and their number does not move with the machine.
 *
 *   LD_PRELOAD=build/libbfcshim.so LD_LIBRARY_PATH=build/tests/fake_cuda \
 *     build/tests/shim_replay [options] TRACE.csv[.gz]
 *
 *   --door runtime|async|plugin|torch  cudaMalloc/cudaFree (default),
 *                          cudaMallocAsync/cudaFreeAsync, or the plug-in
 *                          interface's bfcshim_malloc_async/_free_async with
 *                          the library opened as a plug-in (dlopen of
 *                          $BFCSHIM_LIBRARY, RTLD_LOCAL; not preloaded): it
 *                          sees no stream and no capture, so its fences ask
 *                          more (relaxed capture mode, docs/limitations.md);
 *                          torch: the same library's PyTorch entry points,
 *                          bfcshim_torch_alloc/_free (device 0), as
 *                          PyTorch's pluggable allocator calls them
 *   --streams 1|2          1 (default): every call and kernel on the legacy
 *                          stream, the traces' stream 0; 2: two non-blocking
 *                          streams, allocations alternating between them,
 *                          each block's kernels and free on its own stream
 *   --lag N                the GPU runs N operations behind the host (0)
 *   --pool preallocated|growing  sets BFCSHIM_PREALLOCATE (true|false);
 *                          without it the shim's default (preallocated)
 *   --max-events N         replays the first N events only (printed)
 *   --steady F             the steady window is the replay from fraction F
 *                          of its events on (0.5): the pool made, warm
 *   --min-limit            also finds the smallest BFCSHIM_MEM_LIMIT with
 *                          which a preallocated pool serves the replay at
 *                          this lag: bisected to 2 MiB, one run of this
 *                          program per limit tried (success is taken to
 *                          grow with the limit: a bisection, not a proof)
 *   --json                 one JSON document instead of the table
 *
 * Each replayed allocation or free is one call into the shim's runtime door,
 * then one kernel on its stream (gpu_lag.h). Only the door calls are
 * metered (shim_calls.h): the kernels and completions go through the fake's
 * test control, which is no driver entry point, and the calls made between
 * door calls are counted apart (`bench_calls`, 0 when nothing else calls the
 * driver). Unless the environment says otherwise the fake has one device
 * of 40 GiB (FAKECUDA_DEVICES=1, FAKECUDA_MEM=40GiB), whose default pool
 * (30 GiB) holds every trace we have: not an H100's 80 GiB, because the
 * shim preallocates over virtual memory one cuMemCreate handle per 2 MiB
 * granule and the fake backs each with a file descriptor of its own, so a
 * 60 GiB pool would need 30,720 of them (the development VM allows
 * 20,000, and the shim then falls back to growing). Exit status: 0; 3 when an allocation
 * failed in a --probe run (the min-limit search's); 2 on bad use; 77 when
 * the driver is not the fake.
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../shim_stats.h"
#include "gpu_lag.h"
#include "json_out.h"
#include "shim_calls.h"
#include "trace_csv.h"
#include "units.h"

extern char **environ;

enum door { DOOR_RUNTIME, DOOR_ASYNC, DOOR_PLUGIN, DOOR_TORCH };

typedef struct options {
    enum door door;
    int streams;
    uint64_t lag;
    const char *pool; /* NULL: the shim's default */
    uint64_t max_events;
    double steady;
    bool min_limit, probe, json;
    const char *trace;
} options;

/* One window of the replay: all of it, or the steady part. */
typedef struct window {
    uint64_t first_event, events, allocs, frees;
    call_tally on_alloc, on_free;
    uint64_t *ns_alloc, *ns_free; /* each door call's time */
    uint64_t fence_waits_before, context_syncs_before, drained_before, ran_ahead_before;
    uint64_t fence_waits, context_syncs, gpu_drained, gpu_ran_ahead;
} window;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static _Noreturn void usage(const char *why)
{
    fprintf(stderr,
            "shim_replay: %s\nusage: shim_replay [--door runtime|async|plugin] [--streams 1|2] "
            "[--lag N] [--pool preallocated|growing] [--max-events N] [--steady F] "
            "[--min-limit] [--json] TRACE.csv[.gz]\n",
            why);
    exit(2);
}

static options parse(int argc, char **argv)
{
    options o = {.door = DOOR_RUNTIME, .streams = 1, .max_events = UINT64_MAX, .steady = 0.5};
    static const struct option longs[] = {
        {"door", required_argument, 0, 'd'},      {"streams", required_argument, 0, 's'},
        {"lag", required_argument, 0, 'l'},       {"pool", required_argument, 0, 'p'},
        {"max-events", required_argument, 0, 'm'}, {"steady", required_argument, 0, 'w'},
        {"min-limit", no_argument, 0, 'L'},       {"probe", no_argument, 0, 'P'},
        {"json", no_argument, 0, 'j'},            {0, 0, 0, 0},
    };
    int c;
    char *end;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'd':
            if (strcmp(optarg, "runtime") == 0)
                o.door = DOOR_RUNTIME;
            else if (strcmp(optarg, "async") == 0)
                o.door = DOOR_ASYNC;
            else if (strcmp(optarg, "plugin") == 0)
                o.door = DOOR_PLUGIN;
            else if (strcmp(optarg, "torch") == 0)
                o.door = DOOR_TORCH;
            else
                usage("--door is runtime, async, plugin or torch");
            break;
        case 's':
            o.streams = atoi(optarg);
            if (o.streams != 1 && o.streams != 2)
                usage("--streams is 1 or 2");
            break;
        case 'l':
            o.lag = strtoull(optarg, &end, 10);
            if (*end || o.lag > 1u << 24)
                usage("--lag is a number of operations up to 2^24");
            break;
        case 'p':
            if (strcmp(optarg, "preallocated") != 0 && strcmp(optarg, "growing") != 0)
                usage("--pool is preallocated or growing");
            o.pool = optarg;
            break;
        case 'm':
            o.max_events = strtoull(optarg, &end, 10);
            if (*end || o.max_events == 0)
                usage("--max-events is a positive number");
            break;
        case 'w':
            if (!parse_double_in(optarg, 0.0, 1.0, &o.steady))
                usage("--steady is a fraction in [0, 1]");
            break;
        case 'L':
            o.min_limit = true;
            break;
        case 'P':
            o.probe = true;
            break;
        case 'j':
            o.json = true;
            break;
        default:
            usage("unknown option");
        }
    }
    if (optind != argc - 1)
        usage("one trace expected");
    o.trace = argv[optind];
    return o;
}

/* The peak of live bytes over the first n events (the trace's own peak
 * covers all of them). */
/*
 * The first n events' peak live bytes, and the least that a pool which
 * neither waits for the GPU nor knows which stream will use a block could
 * hold at this lag: live bytes plus those freed in the last `lag` events,
 * at its peak. A plain free's block may still be read by any stream's
 * kernels queued before it, and the modelled GPU has run all but the last
 * `lag` of them (gpu_lag.h); so, without a host wait, no allocation can
 * safely take a block freed fewer than `lag` events before it, whatever
 * the placement. One stream's pool is not bound by it (the ordered pool
 * reuses in the legacy stream's order); two non-blocking streams' is,
 * unless the host waits for fences (which the pool counts).
 */
static void prefix_peaks(const trace *t, size_t n, uint64_t lag, uint64_t *peak_live,
                         uint64_t *peak_blind)
{
    uint64_t *size = calloc(t->nslots ? t->nslots : 1, sizeof *size);
    uint64_t *freed = calloc(n ? n : 1, sizeof *freed); /* by event: bytes freed there */
    uint64_t live = 0, pending = 0;
    *peak_live = *peak_blind = 0;
    for (size_t i = 0; size && freed && i < n; i++) {
        /* pending: freed at events (i - lag, i) */
        if (lag && i >= 1)
            pending += freed[i - 1];
        if (lag && i >= lag)
            pending -= freed[i - lag];
        const trace_event *e = &t->ev[i];
        if (e->kind == TRACE_ALLOC) {
            live += e->size;
            size[e->slot] = e->size;
            if (live > *peak_live)
                *peak_live = live;
            if (live + pending > *peak_blind)
                *peak_blind = live + pending;
        } else {
            live -= size[e->slot];
            freed[i] = size[e->slot];
            size[e->slot] = 0;
        }
    }
    free(freed);
    free(size);
}

/* ---- the smallest limit: this program again, one run per limit -------------- */

/* Runs this program with --probe and BFCSHIM_MEM_LIMIT=limit, the pool
 * preallocated, its output discarded: true if every allocation was served. */
static bool probe_fits(int argc, char **argv, uint64_t limit)
{
    char **args = calloc((size_t)argc + 2, sizeof *args);
    size_t nenv = 0;
    while (environ[nenv])
        nenv++;
    char **env = calloc(nenv + 3, sizeof *env);
    if (!args || !env) {
        fprintf(stderr, "shim_replay: out of memory\n");
        exit(1);
    }
    int k = 0;
    args[k++] = argv[0];
    args[k++] = "--probe";
    for (int i = 1; i < argc; i++)
        args[k++] = argv[i];
    size_t e = 0;
    for (size_t i = 0; i < nenv; i++)
        if (strncmp(environ[i], "BFCSHIM_MEM_LIMIT=", 18) != 0 &&
            strncmp(environ[i], "BFCSHIM_PREALLOCATE=", 20) != 0)
            env[e++] = environ[i];
    char lim[64];
    snprintf(lim, sizeof lim, "BFCSHIM_MEM_LIMIT=%llu", (unsigned long long)limit);
    env[e++] = lim;
    env[e++] = "BFCSHIM_PREALLOCATE=true";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, args, env);
    posix_spawn_file_actions_destroy(&fa);
    free(args);
    free(env);
    int status = 0;
    if (rc != 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        (WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 3)) {
        fprintf(stderr, "shim_replay: a probe at %llu bytes did not run to its end\n",
                (unsigned long long)limit);
        exit(1);
    }
    return WEXITSTATUS(status) == 0;
}

typedef struct limit_search {
    uint64_t bytes, probes;
} limit_search;

/* Up from the peak live bytes by a doubling step, then halving the bracket,
 * over multiples of the 2 MiB unit (the shim's limits are whole granules). */
static limit_search smallest_limit(int argc, char **argv, uint64_t peak_live)
{
    const uint64_t unit = 2u << 20;
    limit_search s = {0, 0};
    uint64_t fail = 0, ok = (peak_live + unit - 1) / unit * unit, step = unit;
    for (;;) {
        s.probes++;
        if (probe_fits(argc, argv, ok))
            break;
        fail = ok;
        ok += step;
        step *= 2;
    }
    while (fail && ok - fail > unit) {
        uint64_t mid = fail + (ok - fail) / 2 / unit * unit;
        s.probes++;
        if (probe_fits(argc, argv, mid))
            ok = mid;
        else
            fail = mid;
    }
    s.bytes = ok;
    return s;
}

/* ---- output ---------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static uint64_t median(uint64_t *v, uint64_t n)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, cmp_u64);
    return v[n / 2];
}

static double mean(const uint64_t *v, uint64_t n)
{
    double s = 0;
    for (uint64_t i = 0; i < n; i++)
        s += (double)v[i];
    return n ? s / (double)n : 0;
}

static double per(uint64_t x, uint64_t allocs) { return allocs ? (double)x / (double)allocs : 0; }

typedef struct results {
    const options *o;
    const trace *t;
    uint64_t events, failures, free_errors, bench_calls, peak_live, peak_blind;
    window all, steady;
    const call_meter *m;
    /* the pool's statistics at the end */
    long long num_allocs, peak_in_use, peak_mapped, reserved, limit, map_calls, unmap_calls,
        growth_moves, moved, growth_headroom, ooms, vmm, prealloc_us;
    limit_search min_limit;
} results;

static const char *door_name(enum door d)
{
    static const char *const names[] = {"runtime", "async", "plugin", "torch"};
    return names[d];
}

static void window_json(json_out *j, const char *key, const results *r, window *w)
{
    json_object_open(j, key);
    json_u64(j, "first_event", w->first_event);
    json_u64(j, "events", w->events);
    json_u64(j, "allocs", w->allocs);
    json_u64(j, "frees", w->frees);
    json_u64(j, "ns_alloc_median", median(w->ns_alloc, w->allocs));
    json_double(j, "ns_alloc_mean", mean(w->ns_alloc, w->allocs));
    json_u64(j, "ns_free_median", median(w->ns_free, w->frees));
    json_double(j, "ns_free_mean", mean(w->ns_free, w->frees));
    json_u64(j, "fence_waits", w->fence_waits);
    json_u64(j, "context_syncs", w->context_syncs);
    json_u64(j, "gpu_ran_ahead", w->gpu_ran_ahead);
    json_u64(j, "gpu_drained", w->gpu_drained);
    uint64_t total = call_tally_total(&w->on_alloc) + call_tally_total(&w->on_free);
    json_u64(j, "shim_calls", total);
    json_double(j, "shim_calls_per_alloc", per(total, w->allocs));
    json_object_open(j, "groups_per_alloc");
    for (int g = 0; g < NGROUPS; g++)
        json_double(j, call_group_name((call_group)g),
                    per(call_tally_group(r->m, &w->on_alloc, (call_group)g) +
                            call_tally_group(r->m, &w->on_free, (call_group)g),
                        w->allocs));
    json_object_close(j);
    /* every entry point the shim called: in its allocations, in its frees */
    json_object_open(j, "calls");
    for (size_t i = 0; i < r->m->nnames; i++) {
        if (!w->on_alloc.n[i] && !w->on_free.n[i])
            continue;
        json_object_open(j, r->m->names[i]);
        json_u64(j, "in_alloc", w->on_alloc.n[i]);
        json_u64(j, "in_free", w->on_free.n[i]);
        json_object_close(j);
    }
    json_object_close(j);
    json_object_close(j);
}

static void print_json(results *r)
{
    json_out j;
    json_begin(&j, stdout, false);
    json_object_open(&j, NULL);
    json_string(&j, "trace", r->t->name);
    json_string(&j, "door", door_name(r->o->door));
    json_u64(&j, "streams", (uint64_t)r->o->streams);
    json_u64(&j, "lag", r->o->lag);
    json_string(&j, "pool", r->o->pool ? r->o->pool : "default");
    json_string(&j, "fake_mem", getenv("FAKECUDA_MEM"));
    json_u64(&j, "trace_events", r->t->nev);
    json_u64(&j, "trace_allocs", r->t->allocs);
    json_u64(&j, "events", r->events);
    json_bool(&j, "capped", r->events < r->t->nev);
    json_u64(&j, "failures", r->failures);
    json_u64(&j, "free_errors", r->free_errors);
    json_u64(&j, "bench_calls", r->bench_calls);
    json_u64(&j, "peak_live_bytes", r->peak_live);
    json_u64(&j, "blind_bound_bytes", r->peak_blind);
    json_object_open(&j, "pool_stats");
    json_i64(&j, "num_allocs", r->num_allocs);
    json_i64(&j, "num_ooms", r->ooms);
    json_i64(&j, "peak_bytes_in_use", r->peak_in_use);
    json_i64(&j, "peak_mapped_bytes", r->peak_mapped);
    json_i64(&j, "reserved_bytes", r->reserved);
    json_i64(&j, "bytes_limit", r->limit);
    json_i64(&j, "num_map_calls", r->map_calls);
    json_i64(&j, "num_unmap_calls", r->unmap_calls);
    json_i64(&j, "num_growth_moves", r->growth_moves);
    json_i64(&j, "moved_bytes_total", r->moved);
    json_i64(&j, "growth_headroom", r->growth_headroom);
    json_bool(&j, "vmm", r->vmm == 1);
    json_i64(&j, "prealloc_us", r->prealloc_us);
    json_object_close(&j);
    if (r->o->min_limit) {
        json_u64(&j, "min_limit_bytes", r->min_limit.bytes);
        json_u64(&j, "min_limit_probes", r->min_limit.probes);
    }
    window_json(&j, "all", r, &r->all);
    window_json(&j, "steady", r, &r->steady);
    json_object_close(&j);
    json_end(&j);
}

static void print_entry_rows(const results *r)
{
    /* each entry point either window saw, by calls over the whole replay */
    size_t order[CALLS_MAX], n = 0;
    for (size_t i = 0; i < r->m->nnames; i++)
        if (r->all.on_alloc.n[i] || r->all.on_free.n[i])
            order[n++] = i;
    for (size_t a = 1; a < n; a++)
        for (size_t b = a; b > 0; b--) {
            size_t x = order[b - 1], y = order[b];
            if (r->all.on_alloc.n[x] + r->all.on_free.n[x] >=
                r->all.on_alloc.n[y] + r->all.on_free.n[y])
                break;
            order[b - 1] = y;
            order[b] = x;
        }
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k];
        printf("  %-34s %-13s %8.4f %8.4f %10.4f %8.4f %8.4f\n", r->m->names[i],
               call_group_name(call_group_of(r->m->names[i])),
               per(r->all.on_alloc.n[i], r->all.allocs), per(r->all.on_free.n[i], r->all.allocs),
               per(r->steady.on_alloc.n[i] + r->steady.on_free.n[i], r->steady.allocs),
               per(r->steady.on_alloc.n[i], r->steady.allocs),
               per(r->steady.on_free.n[i], r->steady.allocs));
    }
}

static void print_table(results *r)
{
    char a[32], b[32], c[32], d[32], e[32];
    printf("shim_replay %s: door %s, %d stream%s, lag %llu, pool %s, fake device %s\n",
           r->t->name, door_name(r->o->door), r->o->streams, r->o->streams > 1 ? "s" : "",
           (unsigned long long)r->o->lag, r->o->pool ? r->o->pool : "default",
           getenv("FAKECUDA_MEM"));
    printf("events %llu of %zu%s; failures %llu, free errors %llu; driver calls outside the "
           "shim's doors %llu\n",
           (unsigned long long)r->events, r->t->nev,
           r->events < r->t->nev ? " (capped by --max-events)" : "",
           (unsigned long long)r->failures, (unsigned long long)r->free_errors,
           (unsigned long long)r->bench_calls);
    printf("%-36s %14s %14s\n", "", "all", "steady");
    printf("%-36s %14llu %14llu\n", "allocations", (unsigned long long)r->all.allocs,
           (unsigned long long)r->steady.allocs);
    printf("%-36s %14llu %14llu\n", "ns per allocation (median)",
           (unsigned long long)median(r->all.ns_alloc, r->all.allocs),
           (unsigned long long)median(r->steady.ns_alloc, r->steady.allocs));
    printf("%-36s %14llu %14llu\n", "ns per free (median)",
           (unsigned long long)median(r->all.ns_free, r->all.frees),
           (unsigned long long)median(r->steady.ns_free, r->steady.frees));
    printf("%-36s %14llu %14llu\n", "fence waits", (unsigned long long)r->all.fence_waits,
           (unsigned long long)r->steady.fence_waits);
    printf("%-36s %14llu %14llu\n", "kernels waits ran ahead", (unsigned long long)r->all.gpu_ran_ahead,
           (unsigned long long)r->steady.gpu_ran_ahead);
    printf("%-36s %14llu %14llu\n", "queue drained by waits", (unsigned long long)r->all.gpu_drained,
           (unsigned long long)r->steady.gpu_drained);
    printf("%-36s %14.4f %14.4f\n", "shim driver calls per allocation",
           per(call_tally_total(&r->all.on_alloc) + call_tally_total(&r->all.on_free),
               r->all.allocs),
           per(call_tally_total(&r->steady.on_alloc) + call_tally_total(&r->steady.on_free),
               r->steady.allocs));
    for (int g = 0; g < NGROUPS; g++)
        printf("  %-34s %14.4f %14.4f\n", call_group_name((call_group)g),
               per(call_tally_group(r->m, &r->all.on_alloc, (call_group)g) +
                       call_tally_group(r->m, &r->all.on_free, (call_group)g),
                   r->all.allocs),
               per(call_tally_group(r->m, &r->steady.on_alloc, (call_group)g) +
                       call_tally_group(r->m, &r->steady.on_free, (call_group)g),
                   r->steady.allocs));
    printf("per allocation, by entry point        group          all: in alloc  in free"
           "  steady: sum in alloc  in free\n");
    print_entry_rows(r);
    printf("peak live %s (trace); pool: peak in use %s, peak mapped %s, reserved %s, "
           "limit %s; maps %lld, unmaps %lld\n",
           format_size(r->peak_live, a, sizeof a),
           format_size((uint64_t)r->peak_in_use, b, sizeof b),
           format_size((uint64_t)r->peak_mapped, c, sizeof c),
           format_size((uint64_t)r->reserved, d, sizeof d),
           format_size((uint64_t)r->limit, e, sizeof e), r->map_calls, r->unmap_calls);
    printf("peak mapped / peak live %.4f; the pool was %s\n",
           r->peak_live ? (double)r->peak_mapped / (double)r->peak_live : 0,
           r->prealloc_us > 0 ? "taken up front (preallocated)" : "grown as needed");
    printf("a pool that neither waits nor knows a block's stream holds at least %.4f x peak "
           "live at this lag (live plus what the last %llu events freed)\n",
           r->peak_live ? (double)r->peak_blind / (double)r->peak_live : 0,
           (unsigned long long)r->o->lag);
    if (r->o->min_limit)
        printf("smallest preallocated limit %s (%llu bytes, %.4f x peak live; %llu runs)\n",
               format_size(r->min_limit.bytes, a, sizeof a),
               (unsigned long long)r->min_limit.bytes,
               r->peak_live ? (double)r->min_limit.bytes / (double)r->peak_live : 0,
               (unsigned long long)r->min_limit.probes);
}

/* ---- the replay ---------------------------------------------------------------- */

static bool window_init(window *w, uint64_t first, uint64_t events)
{
    *w = (window){.first_event = first};
    w->ns_alloc = malloc((events ? events : 1) * sizeof *w->ns_alloc);
    w->ns_free = malloc((events ? events : 1) * sizeof *w->ns_free);
    return w->ns_alloc && w->ns_free;
}

/* The plug-in door's library, opened by main (--door plugin), and what the
 * replay calls in it; NULL when preloaded. */
static struct {
    int (*malloc_async)(void **, size_t, int, void *);
    int (*free_async)(void *, void *);
    void *(*torch_alloc)(ssize_t, int, void *);
    void (*torch_free)(void *, size_t, int, void *);
    size_t (*stats_json)(char *, size_t);
} plugin;

static bool plugin_open(void)
{
    const char *lib = getenv("BFCSHIM_LIBRARY");
    void *h = lib ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!h) {
        fprintf(stderr, "shim_replay: --door plugin opens $BFCSHIM_LIBRARY: %s\n",
                lib ? dlerror() : "not set");
        return false;
    }
    *(void **)&plugin.malloc_async = dlsym(h, "bfcshim_malloc_async");
    *(void **)&plugin.free_async = dlsym(h, "bfcshim_free_async");
    *(void **)&plugin.torch_alloc = dlsym(h, "bfcshim_torch_alloc");
    *(void **)&plugin.torch_free = dlsym(h, "bfcshim_torch_free");
    *(void **)&plugin.stats_json = dlsym(h, "bfcshim_stats_json");
    return plugin.malloc_async && plugin.free_async && plugin.torch_alloc && plugin.torch_free &&
           plugin.stats_json;
}

/* A number of the pool's statistics, from the preloaded library or the
 * plug-in's. */
static long long stat_n(const char *name)
{
    static char json[1 << 16];
    if (!plugin.stats_json)
        return shim_stat_number(name);
    return plugin.stats_json(json, sizeof json) ? shim_stats_field(json, name) : -1;
}

static uint64_t stat_u(const char *name)
{
    long long v = stat_n(name);
    return v < 0 ? 0 : (uint64_t)v;
}

int main(int argc, char **argv)
{
    options o = parse(argc, argv);
    /* Before the first CUDA call, which reads them. */
    setenv("FAKECUDA_DEVICES", "1", 0);
    setenv("FAKECUDA_MEM", "40GiB", 0);
    /* (a probe's pool is preallocated whatever the run it probes for) */
    if (o.pool && !o.probe)
        setenv("BFCSHIM_PREALLOCATE", strcmp(o.pool, "growing") == 0 ? "false" : "true", 1);
    const fakecuda_api *fake = fakecuda();
    bool preloaded = dlsym(RTLD_DEFAULT, "bfcshim_stats_json") != NULL;
    bool as_plugin = o.door == DOOR_PLUGIN || o.door == DOOR_TORCH;
    if (as_plugin ? preloaded || !plugin_open() : !preloaded) {
        fprintf(stderr, "shim_replay: libbfcshim.so must be %s\n",
                as_plugin ? "opened as a plug-in ($BFCSHIM_LIBRARY), not preloaded"
                                      : "preloaded");
        return 2;
    }
    static trace t;
    if (!trace_init(&t, o.trace) || !trace_load(&t, o.trace)) {
        fprintf(stderr, "shim_replay: %s\n", t.error);
        return 2;
    }
    const uint64_t events = o.max_events < t.nev ? o.max_events : t.nev;
    const uint64_t steady_from = (uint64_t)(o.steady * (double)events);
    results r = {.o = &o, .t = &t, .events = events};
    prefix_peaks(&t, events, o.lag, &r.peak_live, &r.peak_blind);
    void **ptr = calloc(t.nslots ? t.nslots : 1, sizeof *ptr);
    unsigned char *on = calloc(t.nslots ? t.nslots : 1, 1);
    gpu_lag gpu;
    if (!ptr || !on || !window_init(&r.all, 0, events) ||
        !window_init(&r.steady, steady_from, events) || !gpu_lag_init(&gpu, fake, o.lag)) {
        fprintf(stderr, "shim_replay: out of memory\n");
        return 1;
    }

    /* The program's start, unmetered: the runtime makes its context, and
     * the streams are made (and seen by the shim). */
    cudaStream_t streams[2] = {0, 0};
    if (cudaFree(NULL) != cudaSuccess) {
        fprintf(stderr, "shim_replay: the runtime did not start\n");
        return 1;
    }
    for (int s = 0; o.streams == 2 && s < 2; s++)
        if (cudaStreamCreateWithFlags(&streams[s], cudaStreamNonBlocking) != cudaSuccess) {
            fprintf(stderr, "shim_replay: no stream\n");
            return 1;
        }

    static call_meter door, gap;
    call_meter_init(&door, fake);
    call_meter_init(&gap, fake);
    r.m = &door;
    call_tally outside = {{0}};
    uint64_t nth_alloc = 0;
    call_meter_start(&gap);
    for (uint64_t i = 0; i < events; i++) {
        const trace_event *e = &t.ev[i];
        window *w[2] = {&r.all, i >= steady_from ? &r.steady : NULL};
        if (i == steady_from) {
            r.steady.fence_waits_before = stat_u("num_fence_waits");
            r.steady.context_syncs_before = stat_u("num_context_syncs");
            r.steady.drained_before = gpu.drained;
            r.steady.ran_ahead_before = gpu.ran_ahead;
        }
        bool alloc = e->kind == TRACE_ALLOC;
        if (alloc)
            on[e->slot] = (unsigned char)(nth_alloc++ % (uint64_t)o.streams);
        else if (!ptr[e->slot])
            continue; /* its allocation failed */
        cudaStream_t s = streams[on[e->slot]];
        call_meter_stop(&gap);
        r.bench_calls += call_meter_add(&gap, &outside);
        call_meter_start(&door);
        uint64_t t0 = now_ns();
        cudaError_t rc;
        if (o.door == DOOR_TORCH) { /* NULL when it fails, as PyTorch sees it */
            if (alloc)
                ptr[e->slot] = plugin.torch_alloc((ssize_t)e->size, 0, s);
            else
                plugin.torch_free(ptr[e->slot], e->size, 0, s);
            rc = !alloc || ptr[e->slot] ? cudaSuccess : cudaErrorMemoryAllocation;
        } else if (o.door == DOOR_PLUGIN) /* CUresult codes; only success matters */
            rc = (alloc ? plugin.malloc_async(&ptr[e->slot], e->size, 0, s)
                        : plugin.free_async(ptr[e->slot], s)) == 0
                     ? cudaSuccess
                     : cudaErrorMemoryAllocation;
        else if (alloc)
            rc = o.door == DOOR_RUNTIME ? cudaMalloc(&ptr[e->slot], e->size)
                                        : cudaMallocAsync(&ptr[e->slot], e->size, s);
        else
            rc = o.door == DOOR_RUNTIME ? cudaFree(ptr[e->slot]) : cudaFreeAsync(ptr[e->slot], s);
        uint64_t ns = now_ns() - t0;
        call_meter_stop(&door);
        call_meter_start(&gap);
        for (int k = 0; k < 2; k++) {
            if (!w[k])
                continue;
            w[k]->events++;
            if (alloc) {
                w[k]->ns_alloc[w[k]->allocs++] = ns;
                call_meter_add(&door, &w[k]->on_alloc);
            } else {
                w[k]->ns_free[w[k]->frees++] = ns;
                call_meter_add(&door, &w[k]->on_free);
            }
        }
        if (alloc && rc != cudaSuccess) {
            ptr[e->slot] = NULL;
            r.failures++;
            if (o.probe)
                return 3;
        } else if (!alloc) {
            r.free_errors += rc != cudaSuccess;
            ptr[e->slot] = NULL;
        }
        if (!gpu_lag_step(&gpu, s)) {
            fprintf(stderr, "shim_replay: the fake refused a kernel\n");
            return 1;
        }
    }
    r.all.gpu_drained = gpu.drained;
    r.all.gpu_ran_ahead = gpu.ran_ahead;
    r.steady.gpu_drained = gpu.drained - r.steady.drained_before;
    r.steady.gpu_ran_ahead = gpu.ran_ahead - r.steady.ran_ahead_before;
    gpu_lag_drain(&gpu);
    if (o.probe)
        return 0;

    r.all.fence_waits = stat_u("num_fence_waits");
    r.all.context_syncs = stat_u("num_context_syncs");
    r.steady.fence_waits = r.all.fence_waits - r.steady.fence_waits_before;
    r.steady.context_syncs = r.all.context_syncs - r.steady.context_syncs_before;
    r.num_allocs = stat_n("num_allocs");
    r.ooms = stat_n("num_ooms");
    r.peak_in_use = stat_n("peak_bytes_in_use");
    r.peak_mapped = stat_n("peak_pool_bytes");
    r.reserved = stat_n("reserved_bytes");
    r.limit = stat_n("bytes_limit");
    r.map_calls = stat_n("num_map_calls");
    r.unmap_calls = stat_n("num_unmap_calls");
    r.growth_moves = stat_n("num_growth_moves");
    r.moved = stat_n("moved_bytes_total");
    r.growth_headroom = stat_n("growth_headroom");
    r.vmm = stat_n("vmm");
    r.prealloc_us = stat_n("prealloc_us");
    if (o.min_limit)
        r.min_limit = smallest_limit(argc, argv, r.peak_live);
    if (o.json)
        print_json(&r);
    else
        print_table(&r);
    gpu_lag_free(&gpu);
    return 0;
}
