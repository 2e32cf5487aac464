/*
 * stats_file.c - the pools' statistics for people and programs.
 *
 *   BFCSHIM_STATS_FILE=path  JSON at exit (the contract in
 *                            docs/usage.md, "Statistics, traces and
 *                            out-of-memory reports"), and on
 *                            demand: create path.request (a regular
 *                            file of the process's own user) and the
 *                            next thousand allocations write it and
 *                            remove the request; or call
 *                            bfcshim_write_stats(path)
 *                            (exported; NULL means the configured path),
 *                            e.g. from Python with ctypes. No signal is
 *                            taken from the program. bfcshim_stats_json
 *                            gives the same document in memory.
 *   BFCSHIM_STATS=1          a one-screen summary on stderr at exit.
 *
 * Field names are TSL's AllocatorStats names where one exists.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json_out.h"
#include "out_file.h"
#include "plan_file.h"
#include "shim.h"
#include "units.h"

atomic_uint_fast64_t shim_passthrough_allocs;

/* The device's memory the program made itself with cuMemCreate, on the
 * pool of the device's primary context (a device's, not a context's:
 * listed once, so that pools add up); zeros on any other pool. */
static vmm_door_counts device_vmm_counts(const shim_pool *sp)
{
    vmm_door_counts vc = {0};
    if (sp->primary)
        vmm_door_get_counts((int)sp->dev, &vc);
    return vc;
}

/* A pool's figures for a report: its counters, and its free space as the
 * limit lets it be used (over virtual memory a free chunk is address space,
 * and st's free figures count it whole: bfc_pool_free_space). */
typedef struct pool_figures {
    bfc_stats st;
    bfc_free_space fs;
} pool_figures;

static void pool_json(json_out *j, shim_pool *sp, const pool_figures *f)
{
    if (!f) { /* held by a thread that did not let go (at exit, or at fork) */
        json_object_open(j, NULL);
        json_i64(j, "device", (int64_t)sp->dev);
        json_bool(j, "busy_at_exit", true);
        json_object_close(j);
        return;
    }
    const bfc_stats st = f->st;
    json_object_open(j, NULL);
    json_i64(j, "device", (int64_t)sp->dev);
    json_bool(j, "primary_context", sp->primary);
    json_bool(j, "alive", !atomic_load(&sp->dead));
    json_u64(j, "num_allocs", st.num_allocs);
    json_u64(j, "num_frees", st.num_frees);
    json_u64(j, "num_ooms", st.num_ooms);
    json_u64(j, "bytes_in_use", st.bytes_in_use);
    json_u64(j, "peak_bytes_in_use", st.peak_bytes_in_use);
    json_u64(j, "bytes_requested", st.bytes_requested);
    json_u64(j, "peak_bytes_requested", st.peak_bytes_requested);
    json_u64(j, "largest_alloc_size", st.largest_alloc_size);
    json_u64(j, "bytes_limit", st.bytes_limit);
    /* of the limit, what the program's own cuMemCreate memory holds
     * (door_vmm.c) */
    json_u64(j, "bytes_lent", st.bytes_lent);
    json_u64(j, "peak_bytes_lent", st.peak_bytes_lent);
    json_u64(j, "bytes_reserved", st.bytes_reserved);
    json_u64(j, "peak_bytes_reserved", st.peak_bytes_reserved);
    json_u64(j, "pool_bytes", st.pool_bytes);
    json_u64(j, "peak_pool_bytes", st.peak_pool_bytes);
    /* Over virtual memory pool_bytes is what is mapped; reserved_bytes the
     * address space behind it. */
    json_bool(j, "vmm", sp->vmm_granule != 0);
    json_bool(j, "vmm_spread", sp->vmm_spread); /* BFCSHIM_VMM_LAYOUT=spread */
    json_u64(j, "reserved_bytes", st.va_bytes);
    json_u64(j, "released_bytes_total", st.released_bytes_total);
    /* of those, what moved under a new block instead of leaving (vmm.c) */
    json_u64(j, "moved_bytes_total", atomic_load(&sp->vmm_moved_bytes));
    /* the windows in which memory moved (or new memory was mapped) under a
     * block no free space held, at the limit or past a growing pool's
     * headroom, and the time spent in them */
    json_u64(j, "num_pressure_maps", atomic_load(&sp->vmm_pressure_maps));
    json_u64(j, "pressure_map_us_total", atomic_load(&sp->vmm_pressure_ns) / 1000);
    json_u64(j, "num_map_calls", st.num_map_calls);
    json_u64(j, "num_unmap_calls", st.num_unmap_calls);
    json_u64(j, "num_mapped_refits", st.num_mapped_refits);
    json_u64(j, "num_growth_moves", st.num_growth_moves);
    /* the headroom those moves left (thousandths of the need) */
    json_u64(j, "growth_headroom", st.growth_headroom);
    /* blocks the limit could not back at their best fit, placed at an end
     * of another free chunk instead of failing */
    json_u64(j, "num_limit_moves", st.num_limit_moves);
    /* What the pool can hand out now (within its limit, less its loans);
     * over virtual memory the free address space beside it. */
    json_u64(j, "largest_free_block_bytes", f->fs.largest_free_block_bytes);
    json_u64(j, "free_bytes", f->fs.free_bytes);
    json_u64(j, "free_address_space_bytes", st.free_bytes);
    json_u64(j, "pending_bytes", st.pending_bytes);
    json_u64(j, "internal_fragmentation_bytes", st.internal_fragmentation_bytes);
    json_double(j, "fragmentation", f->fs.fragmentation);
    json_u64(j, "num_chunks", st.num_chunks);
    json_u64(j, "num_regions", st.num_regions);
    json_u64(j, "num_region_allocs", st.num_region_allocs);
    json_u64(j, "num_region_frees", st.num_region_frees);
    json_u64(j, "num_gc_runs", st.num_gc_runs);
    json_u64(j, "num_fence_waits", st.num_fence_waits);
    /* cuCtxSynchronize calls made for plain frees the library could not
     * fence with events (loaded without LD_PRELOAD: fences.c) */
    json_u64(j, "num_context_syncs", atomic_load(&sp->context_syncs));
    json_u64(j, "num_planned", st.num_planned);
    json_u64(j, "num_plan_misses", st.num_plan_misses);
    json_u64(j, "num_plan_spare", st.num_plan_spare);
    json_u64(j, "plan_abandoned", st.plan_abandoned);
    json_u64(j, "host_metadata_bytes", st.host_metadata_bytes);
    json_u64(j, "total_memory", sp->total_memory);
    json_u64(j, "prealloc_us", sp->prealloc_us);
    json_u64(j, "passthrough_allocs", atomic_load(&sp->passthrough_allocs));
    const vmm_door_counts vc = device_vmm_counts(sp);
    json_u64(j, "passthrough_vmm_bytes", vc.bytes);
    json_u64(j, "passthrough_vmm_peak_bytes", vc.peak_bytes);
    json_u64(j, "passthrough_vmm_creates", vc.creates);
    json_u64(j, "vmm_door_pooled_creates", vc.pooled_creates);
    json_u64(j, "vmm_door_refused", vc.refused);
    json_object_close(j);
}

static bool exiting;

/* At exit a pool held by another thread is waited for once, by the first
 * writer that finds it so (the trace's, else the first here), and named in
 * one log line; the other writers report it busy at once: each wait would
 * add EXIT_WAIT_MS to exit(). */
static void one_pool(shim_pool *sp, void (*fn)(void *arg, shim_pool *sp, const pool_figures *f),
                     void *arg)
{
    pool_figures f;
    if (atomic_load(&shim_forked_child)) {
        /* A forked child's pools are copies of the parent's, locks and all:
         * one held at fork() by a parent thread (inside an allocation,
         * waiting for the GPU) is held for good here, with no thread to
         * let go of it. Read what is free now, never wait. */
        if (!bfc_pool_report_within(sp->bfc, &f.st, &f.fs, 0)) {
            fn(arg, sp, NULL);
            return;
        }
    } else if (!exiting) {
        bfc_pool_report_within(sp->bfc, &f.st, &f.fs, UINT_MAX);
    } else if (atomic_load(&sp->held_at_exit)) {
        fn(arg, sp, NULL);
        return;
    } else if (!bfc_pool_report_within(sp->bfc, &f.st, &f.fs, EXIT_WAIT_MS)) {
        atomic_store(&sp->held_at_exit, true);
        shim_log(LOG_WARN, "device %d's pool was busy at exit (another thread holds it): its "
                           "statistics are left out",
                 (int)sp->dev);
        fn(arg, sp, NULL);
        return;
    }
    fn(arg, sp, &f);
}

/* Calls fn for every pool with its statistics (NULL: the pool was busy):
 * the dead pools that gave their place up first, oldest first, then the
 * registry's. */
static void each_pool(void (*fn)(void *arg, shim_pool *sp, const pool_figures *f), void *arg)
{
    for (size_t i = 0; i < pools_retired_count(); i++) {
        shim_pool *sp = pools_retired_at(i);
        if (sp)
            one_pool(sp, fn, arg);
    }
    for (size_t i = 0; i < pools_count(); i++) {
        shim_pool *sp = pools_at(i);
        if (sp)
            one_pool(sp, fn, arg);
    }
}

typedef struct json_walk {
    json_out *j;
    uint64_t driver_allocs, driver_frees;
} json_walk;

static void pool_json_counted(void *arg, shim_pool *sp, const pool_figures *f)
{
    json_walk *w = arg;
    if (f) {
        w->driver_allocs += f->st.num_region_allocs;
        w->driver_frees += f->st.num_region_frees;
    }
    pool_json(w->j, sp, f);
}

static void write_json(FILE *f)
{
    const shim_config *cfg = shim_config_get();
    json_out j;
    json_begin(&j, f, true);
    json_object_open(&j, NULL);
    json_u64(&j, "version", 1);
    json_i64(&j, "pid", (int64_t)getpid());
    json_string(&j, "allocator", cfg->mode == MODE_BFC ? "bfc" : "platform");
    json_string(&j, "free_policy", cfg->free_policy == FREE_FENCED ? "fenced" : "immediate");
    json_walk w = {&j, atomic_load(&shim_passthrough_allocs), 0};
    json_array_open(&j, "pools");
    each_pool(pool_json_counted, &w);
    json_array_close(&j);
    json_u64(&j, "dead_pools_not_listed", pools_retired_unlisted());
    platform_counts pc;
    platform_get_counts(&pc);
    json_object_open(&j, "platform");
    json_u64(&j, "num_allocs", pc.num_allocs);
    json_u64(&j, "num_frees", pc.num_frees);
    json_u64(&j, "bytes_in_use", pc.bytes_in_use);
    json_u64(&j, "peak_bytes_in_use", pc.peak_bytes_in_use);
    json_u64(&j, "largest_alloc_size", pc.largest_alloc_size);
    json_object_close(&j);
    /* What the device saw: regions (and pass-through calls) in bfc mode,
     * every call in platform mode. */
    json_u64(&j, "driver_alloc_calls", w.driver_allocs + pc.num_allocs);
    json_u64(&j, "driver_free_calls", w.driver_frees + pc.num_frees);
    json_u64(&j, "passthrough_allocs", atomic_load(&shim_passthrough_allocs));
    /* How often a door asked the driver which context is current (the rest
     * were remembered), and remembered answers found wrong under
     * BFCSHIM_CONTEXT_CACHE=check. */
    json_u64(&j, "context_lookups", atomic_load(&shim_context_lookups));
    json_u64(&j, "context_cache_wrong", atomic_load(&shim_context_cache_wrong));
    /* Every device's, pools or not (JAX may use a device no pool serves). */
    vmm_door_counts vc;
    vmm_door_total(&vc);
    json_u64(&j, "passthrough_vmm_bytes", vc.bytes);
    json_u64(&j, "passthrough_vmm_peak_bytes", vc.peak_bytes);
    json_u64(&j, "passthrough_vmm_creates", vc.creates);
    json_u64(&j, "vmm_door_pooled_creates", vc.pooled_creates);
    json_u64(&j, "vmm_door_refused", vc.refused);
    json_object_close(&j);
    json_end(&j);
}

/* A FIFO, a device or a link of the user's own (out_file_in_place): the
 * stats go into it, as into the log file. Opened without blocking, so that
 * a FIFO nobody reads is refused (ENXIO) rather than hang the exit. */
static bool write_in_place(const char *path, const char *who)
{
    char why[160];
    int fd = out_file_open(path, O_TRUNC | O_NONBLOCK);
    FILE *f = NULL;
    if (fd >= 0) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        f = fdopen(fd, "w");
        if (!f) {
            int e = errno;
            close(fd);
            errno = e;
        }
    }
    if (f) {
        write_json(f);
        if (out_file_close(f))
            return true;
    }
    out_file_why(path, errno, why, sizeof why);
    shim_log(LOG_ERROR, "%s: %s %s; not written", who, path, why);
    return false;
}

bool stats_write_file(const char *pattern, const char *who)
{
    char path[4096], tmp[4200], why[160];
    if (!pattern || !shim_expand_path(pattern, path, sizeof path))
        return false;
    if (out_file_in_place(path))
        return write_in_place(path, who);
    /* Written aside and renamed, so a reader never sees half a file. The
     * temporary is a new file of a name nobody could know ahead
     * (out_file.h): a predictable one (it was PATH.tmp<pid>) let another
     * user plant a link there and have the job write through it. */
    int fd = out_file_temp(path, ".tmp", 0644, tmp, sizeof tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        shim_log(LOG_ERROR, "%s: cannot create a file next to %s (%s); not written", who, path,
                 strerror(e));
        return false;
    }
    write_json(f);
    bool ok = out_file_close(f) && out_file_replace(tmp, path);
    if (!ok) {
        out_file_why(path, errno, why, sizeof why);
        unlink(tmp);
        shim_log(LOG_ERROR, "%s: %s %s; not written", who, path, why);
    }
    return ok;
}

SHIM_EXPORT int bfcshim_write_stats(const char *path)
{
    /* The log names what the caller asked for: a path given here is not
     * BFCSHIM_STATS_FILE's. */
    return stats_write_file(path ? path : shim_config_get()->stats_file,
                            path ? "bfcshim_write_stats" : "BFCSHIM_STATS_FILE") ? 0 : -1;
}

SHIM_EXPORT size_t bfcshim_stats_json(char *buf, size_t size)
{
    out_mem d = {0};
    /* A C string whatever happens: empty when the document cannot be made
     * whole (no memory), the 0 returned saying so (a document is never
     * empty); never part of one. */
    if (buf && size)
        buf[0] = 0;
    FILE *f = out_mem_open(&d);
    if (!f)
        return 0;
    write_json(f);
    /* Every write, the last flush's included: the error flag and fclose. */
    const bool ok = out_file_close(f) && d.len > 0;
    if (ok && buf && size) {
        size_t n = d.len < size - 1 ? d.len : size - 1;
        memcpy(buf, d.text, n);
        buf[n] = 0;
    }
    free(d.text);
    return ok ? d.len : 0;
}

/* Whether the request file req (lstat'ed into st) may ask for the stats:
 * only a regular file of this process's own user. Anyone else who can
 * write the directory could otherwise make the job write at will, and a
 * link would make the unlink below remove the link, not the request. A
 * refusal is logged once per file (it stays: the file is not ours to
 * remove), not at every poll. */
static bool request_is_ours(const char *req, const struct stat *st)
{
    char why[120];
    if (S_ISLNK(st->st_mode))
        snprintf(why, sizeof why, "is a symbolic link");
    else if (!S_ISREG(st->st_mode))
        snprintf(why, sizeof why, "is not a regular file");
    else if (st->st_uid != geteuid())
        snprintf(why, sizeof why, "is owned by uid %u, not %u", (unsigned)st->st_uid,
                 (unsigned)geteuid());
    else
        return true;
    static atomic_uint_fast64_t refused; /* the last file refused: its inode, device mixed in */
    uint64_t id = (uint64_t)st->st_ino ^ (uint64_t)st->st_dev << 48;
    if (atomic_exchange(&refused, id) != id)
        shim_log(LOG_ERROR, "BFCSHIM_STATS_FILE: %s %s; ignored", req, why);
    return false;
}

void stats_poll_request(void)
{
    static _Thread_local unsigned calls __attribute__((tls_model("initial-exec")));
    if (++calls % 1024)
        return;
    const char *pattern = shim_config_get()->stats_file;
    char path[4096], req[4200];
    if (!pattern || !shim_expand_path(pattern, path, sizeof path))
        return;
    snprintf(req, sizeof req, "%s.request", path);
    struct stat st;
    if (lstat(req, &st) == 0 && request_is_ours(req, &st) && unlink(req) == 0)
        stats_write_file(pattern, "BFCSHIM_STATS_FILE");
}

static void pool_summary(void *arg, shim_pool *sp, const pool_figures *pf)
{
    FILE *f = arg;
    const bfc_stats *st = pf ? &pf->st : NULL;
    char a[32], b[32], c[32];
    if (!st) {
        fprintf(f, "  device %d: busy at exit (a thread held the pool, waiting for the GPU)\n",
                (int)sp->dev);
        return;
    }
    fprintf(f, "  device %d%s: limit %s, pool %s (peak %s), %llu region call(s)\n",
            (int)sp->dev, atomic_load(&sp->dead) ? " (context gone)" : "",
            format_size(st->bytes_limit, a, sizeof a), format_size(st->pool_bytes, b, sizeof b),
            format_size(st->peak_pool_bytes, c, sizeof c),
            (unsigned long long)st->num_region_allocs);
    if (sp->prealloc_us)
        fprintf(f, "    taken up front in %.1f ms\n", (double)sp->prealloc_us / 1e3);
    if (sp->vmm_granule)
        fprintf(f, "    over virtual memory: %s of address space, %llu map and %llu unmap "
                   "call(s), %s unmapped (%s of it moved under new blocks)\n",
                format_size(st->va_bytes, a, sizeof a), (unsigned long long)st->num_map_calls,
                (unsigned long long)st->num_unmap_calls,
                format_size(st->released_bytes_total, b, sizeof b),
                format_size(atomic_load(&sp->vmm_moved_bytes), c, sizeof c));
    fprintf(f, "    in use %s, peak %s, largest allocation %s\n",
            format_size(st->bytes_in_use, a, sizeof a),
            format_size(st->peak_bytes_in_use, b, sizeof b),
            format_size(st->largest_alloc_size, c, sizeof c));
    fprintf(f, "    %llu allocations, %llu frees, %llu out of memory; largest free block %s, "
               "fragmentation %.3f, %llu fence wait(s)\n",
            (unsigned long long)st->num_allocs, (unsigned long long)st->num_frees,
            (unsigned long long)st->num_ooms,
            format_size(pf->fs.largest_free_block_bytes, a, sizeof a), pf->fs.fragmentation,
            (unsigned long long)st->num_fence_waits);
    const vmm_door_counts vc = device_vmm_counts(sp);
    if (st->peak_bytes_lent)
        fprintf(f, "    lent to the program's own cuMemCreate memory: %s now, peak %s "
                   "(%llu allocation(s), %llu refused)\n",
                format_size(st->bytes_lent, a, sizeof a),
                format_size(st->peak_bytes_lent, b, sizeof b),
                (unsigned long long)vc.pooled_creates, (unsigned long long)vc.refused);
    if (vc.creates)
        fprintf(f, "    around the pool: %s made by the program with cuMemCreate (peak %s, "
                   "%llu allocation(s)), not pooled\n",
                format_size(vc.bytes, a, sizeof a), format_size(vc.peak_bytes, b, sizeof b),
                (unsigned long long)vc.creates);
    if (st->num_planned || st->num_plan_misses || st->num_plan_spare || st->plan_abandoned) {
        char plan[160];
        plan_counts_text(st, plan, sizeof plan);
        fprintf(f, "    plan: %s\n", plan);
    }
}

/* A plan the run strayed from is worth a warning, not only a line in the
 * summary: the user gets the rule's placement, not the plan's, and a plan
 * made from this run (or the job as recorded) would serve it. */
static void plan_verdict(void *arg, shim_pool *sp, const pool_figures *f)
{
    (void)arg;
    const bfc_stats *st = f ? &f->st : NULL;
    if (st && st->plan_abandoned)
        shim_log(LOG_WARN,
                 "device %d: BFCSHIM_PLAN was abandoned: this run strayed from the recorded "
                 "one (%llu allocations placed as planned before); record this run "
                 "(BFCSHIM_TRACE) and make a new plan",
                 (int)sp->dev, (unsigned long long)st->num_planned);
}

void stats_write_summary(int fd)
{
    FILE *f = fdopen(dup(fd), "w");
    if (!f)
        return;
    fprintf(f, "bfcshim[%d]: allocator %s\n", (int)getpid(),
            shim_config_get()->mode == MODE_BFC ? "bfc" : "platform");
    each_pool(pool_summary, f);
    if (pools_retired_unlisted())
        fprintf(f, "  and %zu more pool(s) whose context went, not listed\n",
                pools_retired_unlisted());
    platform_counts pc;
    platform_get_counts(&pc);
    char a[32];
    if (pc.num_allocs)
        fprintf(f, "  passed through: %llu allocations, %llu frees, peak %s live\n",
                (unsigned long long)pc.num_allocs, (unsigned long long)pc.num_frees,
                format_size(pc.peak_bytes_in_use, a, sizeof a));
    fclose(f);
}

void stats_at_exit(void)
{
    const shim_config *cfg = shim_config_get();
    exiting = true;
    if (cfg->plan_path)
        each_pool(plan_verdict, NULL);
    if (cfg->stats_file)
        stats_write_file(cfg->stats_file, "BFCSHIM_STATS_FILE");
    if (cfg->stats_summary)
        stats_write_summary(STDERR_FILENO);
}
