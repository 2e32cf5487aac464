/* trace_csv.c - RMM CSV trace parser (see trace_csv.h). */
#include "trace_csv.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef BFCSHIM_HAVE_ZLIB
#include <zlib.h>
#endif

#define FIELDS 6

bool trace_init(trace *t, const char *name)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->first_failure_at = SIZE_MAX;
    return ptr_map_init(&t->ptr_to_slot);
}

void trace_finish(trace *t)
{
    ptr_map_fini(&t->ptr_to_slot);
}

void trace_free(trace *t)
{
    trace_finish(t);
    free(t->ev);
    free(t->times);
    t->ev = NULL;
    t->times = NULL;
    t->nev = t->cap = 0;
}

__attribute__((format(printf, 2, 3))) static bool malformed(trace *t, const char *fmt, ...)
{
    int n = snprintf(t->error, sizeof t->error, "%s:%llu: ", t->name,
                     (unsigned long long)t->lines);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof t->error)
        vsnprintf(t->error + n, sizeof t->error - (size_t)n, fmt, ap);
    va_end(ap);
    return false;
}

/* A field: [s, e) with blanks trimmed. */
typedef struct field {
    const char *s;
    size_t n;
} field;

static bool field_is(field f, const char *word)
{
    return f.n == strlen(word) && memcmp(f.s, word, f.n) == 0;
}

static bool parse_u64(field f, int base, uint64_t *out)
{
    if (f.n == 0)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < f.n; i++) {
        unsigned d;
        char c = f.s[i];
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (base == 16 && c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else if (base == 16 && c >= 'A' && c <= 'F')
            d = (unsigned)(c - 'A' + 10);
        else
            return false;
        if (v > (UINT64_MAX - d) / (uint64_t)base)
            return false;
        v = v * (uint64_t)base + d;
    }
    *out = v;
    return true;
}

/* 0x-prefixed hex, a plain decimal, or a null spelling. */
static bool parse_number(field f, uint64_t *out)
{
    if (field_is(f, "(nil)") || field_is(f, "nil") || field_is(f, "NULL")) {
        *out = 0;
        return true;
    }
    if (f.n > 2 && f.s[0] == '0' && (f.s[1] == 'x' || f.s[1] == 'X'))
        return parse_u64((field){f.s + 2, f.n - 2}, 16, out);
    return parse_u64(f, 10, out);
}

/* HH:MM:SS:micro, each part decimal. */
static bool parse_time(field f, uint64_t *us)
{
    uint64_t part[4];
    int k = 0;
    size_t start = 0;
    for (size_t i = 0; i <= f.n; i++) {
        if (i == f.n || f.s[i] == ':') {
            if (k == 4 || !parse_u64((field){f.s + start, i - start}, 10, &part[k]))
                return false;
            k++;
            start = i + 1;
        }
    }
    if (k != 4 || part[1] > 59 || part[2] > 60 || part[0] > 1000000)
        return false;
    *us = ((part[0] * 60 + part[1]) * 60 + part[2]) * 1000000 + part[3];
    return true;
}

/* RMM's Time is the time of day: a time more than 12 hours before the
 * previous event's means the job ran past midnight (threads' events may
 * come a little out of order, never by hours). */
static uint64_t unwrap_midnight(trace *t, uint64_t us)
{
    const uint64_t day = UINT64_C(86400000000);
    bool any = t->allocs + t->frees + t->unmatched_frees + t->failed_allocs > 0;
    us += t->day_us;
    if (any && us + day / 2 < t->last_us) {
        t->day_us += day;
        us += day;
    }
    return us;
}

static bool push(trace *t, uint32_t kind, uint32_t slot, uint64_t size)
{
    if (t->nev == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4096;
        trace_event *e = realloc(t->ev, cap * sizeof *e);
        if (!e)
            return malformed(t, "out of host memory after %zu events", t->nev);
        t->ev = e;
        if (t->keep_times) {
            uint64_t *tm = realloc(t->times, cap * sizeof *tm);
            if (!tm)
                return malformed(t, "out of host memory after %zu events", t->nev);
            t->times = tm;
        }
        t->cap = cap;
    }
    if (t->keep_times)
        t->times[t->nev] = t->last_us; /* the line being parsed */
    t->ev[t->nev++] = (trace_event){.size = size, .slot = slot, .kind = kind};
    return true;
}

/* The map's value for a zero-size allocation's pointer: nothing to place,
 * but its free is matched (a driver may answer cuMemAlloc(0) with a
 * pointer, and platform mode records what the driver gave). */
#define ZERO_SIZE_SLOT UINT32_MAX

static bool on_alloc(trace *t, uint64_t ptr, uint64_t size)
{
    if (size == 0) {
        t->zero_size_allocs++;
        if (ptr && ptr_map_reserve(&t->ptr_to_slot, 1)) {
            ptr_map_take(&t->ptr_to_slot, ptr);
            ptr_map_put(&t->ptr_to_slot, ptr, ZERO_SIZE_SLOT);
        }
        return true;
    }
    if (ptr == 0)
        return malformed(t, "allocate of %llu bytes returned a null pointer",
                         (unsigned long long)size);
    if (t->nev >= UINT32_MAX - 1)
        return malformed(t, "more than 2^32 events");
    /* A still-live pointer: the trace lost the earlier block's free, so that
     * block stays live to the end and the pointer now names the new one. */
    uint64_t was = ptr_map_take(&t->ptr_to_slot, ptr);
    if (was && was != ZERO_SIZE_SLOT)
        t->leaked_reuses++;
    if (!ptr_map_reserve(&t->ptr_to_slot, 1))
        return malformed(t, "out of host memory");
    /* Live bytes past 2^64 - 1 are no recording of a real job, and would
     * wrap the peak and every figure made of it: refused, naming the line.
     * The total only bounds a search (replay.c): it saturates. */
    if (size > UINT64_MAX - t->live_bytes)
        return malformed(t, "allocate of %llu bytes takes the live bytes (%llu) past 2^64 - 1",
                         (unsigned long long)size, (unsigned long long)t->live_bytes);
    ptr_map_put(&t->ptr_to_slot, ptr, (uint32_t)t->nev + 1);
    t->allocs++;
    t->total_alloc_bytes = size > UINT64_MAX - t->total_alloc_bytes ? UINT64_MAX
                                                                     : t->total_alloc_bytes + size;
    t->live_bytes += size;
    if (t->live_bytes > t->peak_live_bytes)
        t->peak_live_bytes = t->live_bytes;
    return push(t, TRACE_ALLOC, t->nslots++, size);
}

static bool on_free(trace *t, uint64_t ptr)
{
    /* The map holds the index + 1 of the event that allocated ptr. */
    uint64_t e1 = ptr ? ptr_map_take(&t->ptr_to_slot, ptr) : 0;
    if (!e1) {
        t->unmatched_frees++;
        return true;
    }
    if (e1 == ZERO_SIZE_SLOT)
        return true;
    const trace_event *a = &t->ev[e1 - 1];
    t->frees++;
    t->live_bytes -= a->size;
    return push(t, TRACE_FREE, a->slot, 0);
}

bool trace_feed_line(trace *t, const char *line, size_t len)
{
    t->lines++;
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r' ||
                   line[len - 1] == ' ' || line[len - 1] == '\t'))
        len--;
    if (len == 0)
        return true;
    field f[FIELDS];
    size_t nf = 0, start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || line[i] == ',') {
            if (nf == FIELDS)
                return malformed(t, "more than %d comma-separated fields", FIELDS);
            const char *s = line + start;
            size_t n = i - start;
            while (n && (*s == ' ' || *s == '\t'))
                s++, n--;
            while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
                n--;
            f[nf++] = (field){s, n};
            start = i + 1;
        }
    }
    if (!t->saw_header && t->nev == 0 && t->allocs == 0 && field_is(f[0], "Thread")) {
        t->saw_header = true;
        if (nf != FIELDS || !field_is(f[1], "Time") || !field_is(f[2], "Action") ||
            !field_is(f[3], "Pointer") || !field_is(f[4], "Size") ||
            !field_is(f[5], "Stream"))
            return malformed(t, "header is not Thread,Time,Action,Pointer,Size,Stream");
        return true;
    }
    if (nf != FIELDS)
        return malformed(t, "expected %d comma-separated fields "
                            "(Thread,Time,Action,Pointer,Size,Stream), found %zu",
                         FIELDS, nf);
    if (f[0].n == 0)
        return malformed(t, "empty Thread field");
    uint64_t us, ptr, size, stream;
    if (!parse_time(f[1], &us))
        return malformed(t, "Time '%.*s' is not HH:MM:SS:microseconds", (int)f[1].n, f[1].s);
    if (!parse_number(f[3], &ptr))
        return malformed(t, "Pointer '%.*s' is not a hex address", (int)f[3].n, f[3].s);
    if (!parse_u64(f[4], 10, &size))
        return malformed(t, "Size '%.*s' is not a byte count", (int)f[4].n, f[4].s);
    if (!parse_number(f[5], &stream))
        return malformed(t, "Stream '%.*s' is not a number", (int)f[5].n, f[5].s);
    us = unwrap_midnight(t, us);
    if (t->allocs + t->frees + t->unmatched_frees + t->failed_allocs == 0)
        t->first_us = us;
    t->last_us = us;
    if (field_is(f[2], "allocate"))
        return on_alloc(t, ptr, size);
    if (field_is(f[2], "free"))
        return on_free(t, ptr);
    if (field_is(f[2], "allocate failure")) {
        if (t->failed_allocs++ == 0) {
            t->first_failure_at = t->nev;
            t->first_failure_size = size;
        }
        return true;
    }
    return malformed(t, "Action '%.*s' is not allocate, free or allocate failure",
                     (int)f[2].n, f[2].s);
}

static bool load(trace *t, const char *path, bool keep_times);

bool trace_load(trace *t, const char *path) { return load(t, path, false); }
bool trace_load_with_times(trace *t, const char *path) { return load(t, path, true); }

static bool load(trace *t, const char *path, bool keep_times)
{
    bool ready = trace_init(t, path);
    t->keep_times = keep_times;
    if (!ready) {
        snprintf(t->error, sizeof t->error, "%s: out of host memory", path);
        return false;
    }
    bool ok = true;
    char *line = NULL;
#ifdef BFCSHIM_HAVE_ZLIB
    /* gzopen reads uncompressed files unchanged, so one path serves both. */
    gzFile gz = gzopen(path, "rb");
    if (!gz) {
        snprintf(t->error, sizeof t->error, "%s: %s", path, strerror(errno));
        trace_finish(t);
        return false;
    }
    gzbuffer(gz, 1 << 20);
    enum { LINE_MAX_BYTES = 1 << 16 };
    line = malloc(LINE_MAX_BYTES);
    if (!line)
        ok = malformed(t, "out of host memory");
    while (ok && gzgets(gz, line, LINE_MAX_BYTES)) {
        size_t n = strlen(line);
        if (n == LINE_MAX_BYTES - 1 && line[n - 1] != '\n')
            ok = malformed(t, "line longer than %d bytes", LINE_MAX_BYTES);
        else
            ok = trace_feed_line(t, line, n);
    }
    int gzerr = 0;
    const char *gzmsg = gzerror(gz, &gzerr);
    if (!gzdirect(gz) && (gzerr == Z_BUF_ERROR || gzerr == Z_DATA_ERROR)) {
        /* zlib hands over what it could inflate before the damage, so the
         * last line fed may be cut short and fail as CSV: the file, not
         * that line, is what is wrong, whatever the feed said. */
        size_t skip = strlen(path); /* zlib's message starts "path: " */
        if (strncmp(gzmsg, path, skip) == 0 && strncmp(gzmsg + skip, ": ", 2) == 0)
            gzmsg += skip + 2;
        snprintf(t->error, sizeof t->error, "%s: truncated or corrupt gzip file (%s)", path,
                 gzmsg);
        ok = false;
    } else if (ok && gzerr != Z_OK && gzerr != Z_STREAM_END) {
        snprintf(t->error, sizeof t->error, "%s: read error: %s", path, gzmsg);
        ok = false;
    }
    gzclose(gz);
#else
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(t->error, sizeof t->error, "%s: %s", path, strerror(errno));
        trace_finish(t);
        return false;
    }
    size_t cap = 0;
    ssize_t n;
    while (ok && (n = getline(&line, &cap, f)) >= 0)
        ok = trace_feed_line(t, line, (size_t)n);
    if (ok && ferror(f)) {
        snprintf(t->error, sizeof t->error, "%s: read error", path);
        ok = false;
    }
    fclose(f);
#endif
    free(line);
    /* A file without one row of data would replay and report as a row of
     * zeros, which reads as a measurement: it is refused instead. */
    if (ok && t->nev == 0 && t->failed_allocs == 0 && t->unmatched_frees == 0 &&
        t->zero_size_allocs == 0) {
        snprintf(t->error, sizeof t->error, "%s: no allocations: the file %s", path,
                 t->saw_header ? "has only the header line" : "is empty");
        ok = false;
    }
    trace_finish(t);
    return ok;
}
