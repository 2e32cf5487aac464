/*
 * oom_report.c - what the user sees when the pool cannot serve an allocation.
 *
 * Always one log line with the figures that matter. Once per distinct
 * situation, a full report: the request and its rounded size, the pool's
 * limit and how it is used, the largest live allocations, the memory map,
 * and the hint that fits the situation. A situation is the device, the
 * request's power of two and whether the pool was full or fragmented: a job
 * that fails the same way a thousand times in a retry loop gets one report,
 * a job that fails in a new way gets another. The report goes to the log
 * (stderr by default) and, with BFCSHIM_OOM_REPORT=path, is appended there;
 * the trace (BFCSHIM_TRACE) is flushed so it ends at the failure.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "out_file.h"
#include "shim.h"
#include "units.h"

enum { MAX_SITUATIONS = 256, TOP_LIVE = 10, MAX_CHUNK_LINES = 2000 };

static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t seen[MAX_SITUATIONS];
static size_t nseen;

/* True the first time this situation is seen. */
static bool first_time(uint32_t key)
{
    bool fresh = true;
    pthread_mutex_lock(&seen_lock);
    for (size_t i = 0; i < nseen && fresh; i++)
        fresh = seen[i] != key;
    if (fresh && nseen < MAX_SITUATIONS)
        seen[nseen++] = key;
    pthread_mutex_unlock(&seen_lock);
    return fresh;
}

/* A situation whose report could not be made (no host memory) is reported
 * the next time it comes. */
static void forget_situation(uint32_t key)
{
    pthread_mutex_lock(&seen_lock);
    for (size_t i = 0; i < nseen; i++)
        if (seen[i] == key) {
            seen[i] = seen[--nseen];
            break;
        }
    pthread_mutex_unlock(&seen_lock);
}

static unsigned log2_floor(uint64_t x)
{
    return x ? 63u - (unsigned)__builtin_clzll(x) : 0;
}

/* Why an allocation failed: the pool's limit, its layout, or the device. */
typedef enum oom_cause {
    CAUSE_LIMIT,       /* in use + request exceeds the pool's limit */
    CAUSE_FRAGMENTED,  /* the pool holds enough unused bytes, not in one block */
    CAUSE_DEVICE_FULL, /* the pool may grow, but the device has no memory to give */
} oom_cause;

/* Over virtual memory free address space is not memory: what the pool
 * holds unused is its mapped bytes not in use (pending blocks, granules
 * shared with live ones), all else it had to map. */
static oom_cause cause_of(const bfc_stats *st, uint64_t rounded, bool vmm)
{
    /* what is lent to the program's own cuMemCreate memory is in use too */
    if (st->bytes_limit - st->bytes_in_use - st->bytes_lent < rounded)
        return CAUSE_LIMIT;
    uint64_t unused = vmm ? st->pool_bytes - st->bytes_in_use : st->free_bytes + st->pending_bytes;
    if (unused >= rounded)
        return CAUSE_FRAGMENTED;
    return CAUSE_DEVICE_FULL;
}

/* The device's free memory as the driver sees it (0 when it cannot say). */
static uint64_t device_free_bytes(void)
{
    const real_driver *R = real_driver_get();
    size_t f = 0, t = 0;
    return R && R->MemGetInfo(&f, &t) == CUDA_SUCCESS ? f : 0;
}

static void write_hint(FILE *f, const shim_config *cfg, const bfc_stats *st,
                       const bfc_free_space *fs, uint64_t rounded, oom_cause cause,
                       uint64_t total)
{
    char a[32], b[32], c[32], d[32];
    uint64_t room = st->bytes_limit - st->bytes_in_use - st->bytes_lent;
    switch (cause) {
    case CAUSE_FRAGMENTED:
        fprintf(f, "diagnosis: fragmentation. The pool has %s not in use but no single free "
                   "block of %s (the largest is %s",
                format_size(room, a, sizeof a), format_size(rounded, b, sizeof b),
                format_size(fs->largest_free_block_bytes, c, sizeof c));
        if (st->pending_bytes)
            fprintf(f, "; %s are freed blocks still waiting for stream work",
                    format_size(st->pending_bytes, a, sizeof a));
        fprintf(f, ").\nhint: keep BFCSHIM_PLACEMENT=aligned (the default: it keeps blocks of "
                   "different lifetimes apart and large blocks aligned); give the pool headroom above the job's peak with "
                   "a higher BFCSHIM_MEM_FRACTION; ");
        if (!cfg->preallocate && cfg->garbage_collection)
            fprintf(f, "growth mode already returns empty regions.\n");
        else
            fprintf(f, "or grow on demand (BFCSHIM_PREALLOCATE=false, BFCSHIM_GC=true) so that "
                       "emptied regions go back to the device and come back whole.\n");
        return;
    case CAUSE_DEVICE_FULL:
        fprintf(f, "diagnosis: the device has no memory left for the pool: it has %s free of "
                   "%s, and the pool holds %s of its %s limit (other processes or CUDA contexts "
                   "hold the rest).\n",
                format_size(device_free_bytes(), a, sizeof a), format_size(total, b, sizeof b),
                format_size(st->pool_bytes, c, sizeof c),
                format_size(st->bytes_limit, d, sizeof d));
        fprintf(f, "hint: free device memory elsewhere (nvidia-smi lists the processes), or "
                   "take the pool before others do (BFCSHIM_PREALLOCATE=true); a larger "
                   "BFCSHIM_MEM_FRACTION cannot help.\n");
        return;
    case CAUSE_LIMIT:
        break;
    }
    double need = (double)(st->bytes_in_use + rounded) / (double)total;
    fprintf(f, "diagnosis: the pool is full: %s in use of a %s limit.\n",
            format_size(st->bytes_in_use, a, sizeof a),
            format_size(st->bytes_limit, b, sizeof b));
    if (need <= 1.0 && st->bytes_limit < total)
        fprintf(f, "hint: raise the limit: this request needs at least "
                   "BFCSHIM_MEM_FRACTION=%.2f (now %.2g) of the device's %s, or a "
                   "BFCSHIM_MEM_LIMIT of %s or more.\n",
                need + 0.005, (double)st->bytes_limit / (double)total,
                format_size(total, c, sizeof c),
                format_size(st->bytes_in_use + rounded, a, sizeof a));
    else
        fprintf(f, "hint: the device cannot hold this much: free memory first (smaller batch, "
                   "activation checkpointing).\n");
    if (!cfg->preallocate && !cfg->garbage_collection)
        fprintf(f, "hint: BFCSHIM_GC=true would return empty regions before failing.\n");
}

/* Over virtual memory the pool's regions are reservations of address
 * space with memory mapped into them on demand: a free range of them is
 * not memory unless the limit lets the pool map it. Said once, so that the
 * map below (a free region larger than the limit, beside "the pool is
 * full") reads as what it is. */
static void write_address_space(FILE *f, const bfc_stats *st, const bfc_free_space *fs)
{
    char a[32], b[32], c[32], d[32];
    fprintf(f, "address space: %s reserved in %llu range(s), %s of it mapped; reserved but "
               "unmapped address space is not memory: free space below counts only as far as "
               "the %s limit lets the pool map it (%s of free address space lies beyond "
               "it)\n",
            format_size(st->va_bytes, a, sizeof a), (unsigned long long)st->num_regions,
            format_size(st->pool_bytes, b, sizeof b), format_size(st->bytes_limit, c, sizeof c),
            format_size(fs->beyond_limit_bytes, d, sizeof d));
}

/* The full report, from the statistics the failure was judged on. */
static void write_report(FILE *f, shim_pool *sp, const bfc_stats *st, const bfc_free_space *fs,
                         uint64_t rounded, oom_cause cause, size_t size, const char *api)
{
    const shim_config *cfg = shim_config_get();
    char a[32], b[32], c[32], d[32], e[32];
    fprintf(f, "==== bfcshim out-of-memory report (pid %d, device %d) ====\n", (int)getpid(),
            (int)sp->dev);
    fprintf(f, "request: %s(%zu bytes = %s), rounded to %s\n", api, size,
            format_size(size, a, sizeof a), format_size(rounded, b, sizeof b));
    fprintf(f, "pool: limit %s (%s of the device's %s), %s %s in %llu region(s)\n",
            format_size(st->bytes_limit, a, sizeof a),
            cfg->mem_limit ? "BFCSHIM_MEM_LIMIT" : "BFCSHIM_MEM_FRACTION",
            format_size(sp->total_memory, b, sizeof b), format_size(st->pool_bytes, c, sizeof c),
            sp->vmm_granule ? "mapped" : "held", (unsigned long long)st->num_regions);
    if (sp->vmm_granule)
        write_address_space(f, st, fs);
    fprintf(f, "in use %s (requested %s), free %s, pending %s, largest free block %s, "
               "fragmentation %.3f\n",
            format_size(st->bytes_in_use, a, sizeof a),
            format_size(st->bytes_requested, b, sizeof b), format_size(fs->free_bytes, c, sizeof c),
            format_size(st->pending_bytes, d, sizeof d),
            format_size(fs->largest_free_block_bytes, e, sizeof e), fs->fragmentation);
    write_hint(f, cfg, st, fs, rounded, cause, sp->total_memory);

    bfc_live_info top[TOP_LIVE];
    size_t n = bfc_pool_largest_live(sp->bfc, top, TOP_LIVE);
    fprintf(f, "largest live allocations (of %llu):\n",
            (unsigned long long)(st->num_allocs - st->num_frees));
    for (size_t i = 0; i < n; i++)
        fprintf(f, "  0x%llx  %10s  requested %llu, allocation #%llu\n",
                (unsigned long long)top[i].addr, format_size(top[i].size, a, sizeof a),
                (unsigned long long)top[i].requested, (unsigned long long)top[i].seq);
    preallocation_report_hint(f, st, n ? &top[0] : NULL, size, strcmp(api, "cuMemCreate") == 0);
    unsigned what = BFC_DUMP_SUMMARY | BFC_DUMP_BINS | BFC_DUMP_OCCUPANCY;
    if (st->num_chunks <= MAX_CHUNK_LINES)
        what |= BFC_DUMP_CHUNKS;
    fprintf(f, "memory map:\n");
    bfc_pool_dump(sp->bfc, f, what);
    fprintf(f, "==== end of report ====\n");
}

void oom_report(shim_pool *sp, size_t size, const char *api)
{
    const shim_config *cfg = shim_config_get();
    bfc_stats st;
    bfc_pool_stats(sp->bfc, &st);
    bfc_free_space fs;
    bfc_pool_free_space(sp->bfc, &fs);
    bfc_options o;
    bfc_pool_options(sp->bfc, &o);
    uint64_t rounded = ((uint64_t)size + o.granularity - 1) / o.granularity * o.granularity;
    /* Over virtual memory a free block is address space: what counts is
     * what is mapped. The line names the largest block the limit lets the
     * pool back, the same figure as without virtual memory. */
    oom_cause cause = cause_of(&st, rounded, sp->vmm_granule != 0);
    char req[32], lim[32], use[32], big[32], lent[96] = "";
    if (st.bytes_lent) {
        char l[32];
        snprintf(lent, sizeof lent, " (%s of it the program's own cuMemCreate memory)",
                 format_size(st.bytes_lent, l, sizeof l));
    }
    shim_log(LOG_ERROR,
             "%s(%zu bytes = %s) on device %d: out of memory %s (limit %s, in use %s%s, "
             "largest free block %s). %s",
             api, size, format_size(size, req, sizeof req), (int)sp->dev,
             cause == CAUSE_DEVICE_FULL ? "on the device" : "in the pool",
             format_size(st.bytes_limit, lim, sizeof lim),
             format_size(st.bytes_in_use + st.bytes_lent, use, sizeof use), lent,
             format_size(fs.largest_free_block_bytes, big, sizeof big),
             cause == CAUSE_DEVICE_FULL
                 ? "Other processes or contexts hold the device's memory"
                 : "Raise BFCSHIM_MEM_FRACTION or BFCSHIM_MEM_LIMIT, or free memory and retry");
    record_flush();
    uint32_t key = (uint32_t)sp->dev << 8 | log2_floor(size) << 2 | (uint32_t)cause;
    if (!first_time(key))
        return;
    /* Formatted once, then written whole to each destination. */
    out_mem m = {0};
    FILE *mem = out_mem_open(&m);
    if (mem)
        write_report(mem, sp, &st, &fs, rounded, cause, size, api);
    if (!mem || !out_file_close(mem)) { /* a line, never part of a report */
        free(m.text);
        forget_situation(key);
        shim_log(LOG_ERROR, "%s(%zu bytes): no host memory to make the out-of-memory report; "
                            "it is made the next time", api, size);
        return;
    }
    const char *text = m.text;
    const size_t len = m.len;
    ssize_t w = write(shim_log_fd(), text, len);
    (void)w;
    char path[4096], why[160];
    if (cfg->oom_report_path && shim_expand_path(cfg->oom_report_path, path, sizeof path)) {
        /* Never appended to through a link another user could have
         * planted (out_file.h); the report is in the log all the same. */
        FILE *f = out_file_fopen(path, "a");
        if (f) {
            /* A report the file could not take (a full disk) is said as
             * one it could not open is: it is in the log all the same. */
            fwrite(text, 1, len, f);
            if (!out_file_close(f)) {
                out_file_why(path, errno, why, sizeof why);
                shim_log(LOG_ERROR, "BFCSHIM_OOM_REPORT: %s %s; not written", path, why);
            }
        } else {
            out_file_why(path, errno, why, sizeof why);
            shim_log(LOG_ERROR, "BFCSHIM_OOM_REPORT: %s %s; not written", path, why);
        }
    }
    free(m.text);
}
