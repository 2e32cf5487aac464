/*
 * bench_vmm - what the pool over virtual memory costs per operation once
 * nothing is mapped or unmapped any more, against one preallocated region.
 *
 *   build/tests/bench_vmm [--repeat N] [--only region|vmm] TRACE.csv[.gz]...
 *   build/tests/bench_vmm [--repeat N] --pressure PCT TRACE.csv[.gz]...
 *
 * For each trace and each pool (region: preallocated, the default; vmm:
 * growth over virtual memory, release threshold never), one replay of the
 * whole trace warms the pool up (the vmm pool maps what the trace needs),
 * then N more replays are timed, each ending by freeing what the trace left
 * live. Prints the median nanoseconds per operation and the map/unmap calls
 * made during the timed replays (0 expected for vmm: the steady state this
 * measures). Instructions of the timed replays alone:
 *   valgrind --tool=callgrind --toggle-collect=timed_replay build/tests/bench_vmm ...
 *
 * --pressure PCT measures the other state instead: a pool preallocated over
 * virtual memory whose limit is the trace's peak live bytes plus PCT
 * percent (in whole granules), where blocks keep landing on unmapped
 * granules and the engine moves them to mapped memory (num_mapped_refits,
 * one walk over the chunks each) or remaps free granules. The simulated
 * device maps at no cost, so the figure is the host's share of that work
 * alone; the GPU's share is `gpu_vmm-retain`'s time per granule moved. One
 * region preallocated at the same limit is replayed beside it (it may fail
 * where the pool over virtual memory does not).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bfc.h"
#include "sim_device.h"
#include "trace_csv.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One replay; frees what the trace leaves live. */
static void replay(bfc_pool *pool, const trace *t, bfc_addr *slot)
{
    for (size_t i = 0; i < t->nev; i++) {
        const trace_event *e = &t->ev[i];
        if (e->kind == TRACE_ALLOC) {
            if (bfc_pool_alloc(pool, e->size, BFC_NO_LANE, &slot[e->slot]) != BFC_OK)
                slot[e->slot] = 0;
        } else {
            bfc_pool_free(pool, slot[e->slot]);
            slot[e->slot] = 0;
        }
    }
    for (size_t s = 0; s < t->nslots; s++) {
        bfc_pool_free(pool, slot[s]);
        slot[s] = 0;
    }
}

/* The timed replays only, under a name of their own, so that callgrind can
 * count them alone (--toggle-collect=timed_replay) without the warm-up,
 * whose mapping is not the steady state this measures. */
__attribute__((noinline)) static void timed_replay(bfc_pool *pool, const trace *t,
                                                   bfc_addr *slot)
{
    replay(pool, t, slot);
}

/* pressure_pct < 0: the steady state (a roomy limit, vmm growing); else the
 * limit is peak live + pressure_pct percent and a vmm pool is preallocated. */
static void measure(const trace *t, bool vmm, int repeats, bfc_addr *slot, double pressure_pct)
{
    sim_device dev;
    bfc_options o;
    bfc_options_init(&o);
    uint64_t limit = 4 * t->peak_live_bytes + (UINT64_C(1) << 30);
    if (pressure_pct >= 0) {
        const uint64_t g = o.map_granularity;
        limit = (uint64_t)((double)t->peak_live_bytes * (1.0 + pressure_pct / 100.0));
        limit = (limit + g - 1) / g * g;
    }
    sim_device_init(&dev, limit);
    o.limit_bytes = limit;
    o.preallocate = !vmm || pressure_pct >= 0;
    o.vmm = vmm;
    o.region_granularity = o.granularity;
    dev.alignment = o.map_granularity;
    bfc_backend b = vmm ? sim_device_vmm_backend(&dev) : sim_device_backend(&dev);
    bfc_pool *pool = bfc_pool_create(&o, &b);
    if (!pool) {
        fprintf(stderr, "bench_vmm: no pool\n");
        exit(1);
    }
    bfc_stats start, before, after;
    bfc_pool_stats(pool, &start);
    replay(pool, t, slot); /* warm-up */
    bfc_pool_stats(pool, &before);
    double *ns = calloc((size_t)repeats, sizeof *ns);
    for (int r = 0; r < repeats; r++) {
        double t0 = now();
        timed_replay(pool, t, slot);
        ns[r] = (now() - t0) * 1e9 / (double)t->nev;
    }
    bfc_pool_stats(pool, &after);
    qsort(ns, (size_t)repeats, sizeof *ns, cmp);
    const char *name = strrchr(t->name, '/') ? strrchr(t->name, '/') + 1 : t->name;
    const unsigned long long maps = after.num_map_calls - before.num_map_calls,
                             unmaps = after.num_unmap_calls - before.num_unmap_calls;
    if (pressure_pct < 0) {
        printf("%-50s %-6s %8.1f ns/op  %6llu maps %6llu unmaps in the timed replays\n", name,
               vmm ? "vmm" : "region", ns[repeats / 2], maps, unmaps);
    } else {
        /* The first replay (the warm-up, from a fresh pool) apart from
         * each later one (from the layout the one before left): a training
         * job's first steps against its steady state. */
        const unsigned long long n = (unsigned long long)repeats;
        printf("%-50s %-6s limit %.2f GiB (peak +%.1f%%) %8.1f ns/op  first replay: %llu failed, "
               "%.2f GiB remapped; each later one: %llu failed, %llu moved to mapped memory, "
               "%llu maps, %llu unmaps, %.2f GiB remapped\n",
               name, vmm ? "vmm" : "region", (double)limit / (1 << 30), pressure_pct,
               ns[repeats / 2], (unsigned long long)(before.num_ooms - start.num_ooms),
               (double)(before.released_bytes_total - start.released_bytes_total) / (1 << 30),
               (unsigned long long)(after.num_ooms - before.num_ooms) / n,
               (unsigned long long)(after.num_mapped_refits - before.num_mapped_refits) / n,
               maps / n, unmaps / n,
               (double)(after.released_bytes_total - before.released_bytes_total) / n /
                   (1 << 30));
    }
    free(ns);
    bfc_pool_destroy(pool, true);
    sim_device_fini(&dev);
}

int main(int argc, char **argv)
{
    int repeats = 9;
    bool region = true, vmm = true; /* --only: one of them (for callgrind) */
    double pressure_pct = -1;
    static const struct option longopts[] = {{"repeat", required_argument, 0, 'r'},
                                             {"only", required_argument, 0, 'o'},
                                             {"pressure", required_argument, 0, 'p'},
                                             {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        char *end = NULL;
        if (c == 'o' && (strcmp(optarg, "region") == 0 || strcmp(optarg, "vmm") == 0)) {
            region = strcmp(optarg, "region") == 0;
            vmm = !region;
        } else if (c == 'p' && (pressure_pct = strtod(optarg, &end)) >= 0 && *end == '\0') {
            continue;
        } else if (c != 'r' || (repeats = atoi(optarg)) < 1) {
            fprintf(stderr, "usage: bench_vmm [--repeat N] [--only region|vmm] "
                            "[--pressure PCT] TRACE...\n");
            return 2;
        }
    }
    for (int i = optind; i < argc; i++) {
        trace t;
        if (!trace_load(&t, argv[i])) {
            fprintf(stderr, "bench_vmm: %s\n", t.error);
            trace_free(&t);
            return 1;
        }
        bfc_addr *slot = calloc(t.nslots ? t.nslots : 1, sizeof *slot);
        if (region)
            measure(&t, false, repeats, slot, pressure_pct);
        if (vmm)
            measure(&t, true, repeats, slot, pressure_pct);
        free(slot);
        trace_free(&t);
    }
    return 0;
}
