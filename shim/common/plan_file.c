/* plan_file.c - reading and writing placement plans (plan_file.h). */
#include "plan_file.h"
#include "env_vars.h"
#include "out_file.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PLAN_MAGIC "bfcshim-plan 1"

void plan_file_free(plan_file *plan)
{
    free(plan->entries);
    memset(plan, 0, sizeof *plan);
}

/* A decimal number at s, digits only: strtoull alone would take a sign
 * ("-1" is 2^64 - 1) and leading blanks. *end: just after it. */
static bool decimal(const char *s, uint64_t *value, const char **end)
{
    if (*s < '0' || *s > '9')
        return false;
    char *e;
    errno = 0;
    unsigned long long v = strtoull(s, &e, 10);
    if (errno)
        return false;
    *value = v;
    *end = e;
    return true;
}

/* The end of a line: a plan edited elsewhere may end its lines in CRLF. */
static bool line_end(const char *s)
{
    return *s == '\0' || *s == '\n' || (*s == '\r' && (s[1] == '\n' || s[1] == '\0'));
}

/* "name value" with value a decimal number. */
static bool header_line(const char *line, const char *name, uint64_t *value)
{
    size_t n = strlen(name);
    const char *end;
    return strncmp(line, name, n) == 0 && line[n] == ' ' && decimal(line + n + 1, value, &end) &&
           line_end(end);
}

/* "size offset", two decimal numbers and a single space between them. */
static bool entry_line(const char *line, bfc_plan_entry *e)
{
    const char *end;
    return decimal(line, &e->size, &end) && *end == ' ' && decimal(end + 1, &e->offset, &end) &&
           line_end(end);
}

bool plan_file_read(const char *path, plan_file *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return false;
    }
    char line[256];
    unsigned long lineno = 0;
    uint64_t entries = 0;
    bool ok = false;
    /* Each entry takes 4 bytes of the file at least ("1 0\n"): a count
     * past that is refused before its memory is asked for. */
    struct stat st;
    const uint64_t most = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode)
                              ? (uint64_t)st.st_size / 4
                              : UINT64_MAX;
    /* The header: magic, then granularity, pool_bytes and entries. */
    const char *want[] = {"granularity", "pool_bytes", "entries"};
    uint64_t *into[] = {&out->granularity, &out->pool_bytes, &entries};
    int have = -1; /* -1: the magic line is next */
    while (fgets(line, sizeof line, f)) {
        lineno++;
        /* A line the buffer cannot hold would be read as two, the second
         * blamed under the next line's number. */
        if (!strchr(line, '\n') && !feof(f)) {
            snprintf(err, errlen, "%s:%lu: a line longer than %zu bytes", path, lineno,
                     sizeof line - 2);
            goto out;
        }
        /* (a blank line as line_end reads one: CRLF's too) */
        if (line[0] == '#' || line_end(line))
            continue;
        if (have == -1) {
            /* The magic line whole: "bfcshim-plan 12" is another format. */
            if (strncmp(line, PLAN_MAGIC, strlen(PLAN_MAGIC)) != 0 ||
                !line_end(line + strlen(PLAN_MAGIC))) {
                snprintf(err, errlen, "%s:%lu: not a bfcshim plan (want '%s')", path, lineno,
                         PLAN_MAGIC);
                goto out;
            }
            have = 0;
            continue;
        }
        if (have < 3) {
            if (!header_line(line, want[have], into[have])) {
                snprintf(err, errlen, "%s:%lu: expected '%s N'", path, lineno, want[have]);
                goto out;
            }
            /* A granularity no pool can have (0 divided the replay's pool
             * size by zero): the range bfcshim plan writes and
             * BFCSHIM_ALIGNMENT accepts. */
            const uint64_t g = out->granularity;
            if (have == 0 && (g < ENV_ALIGNMENT_MIN || g > ENV_ALIGNMENT_MAX || (g & (g - 1)))) {
                snprintf(err, errlen, "%s:%lu: granularity %" PRIu64 ": not a power of two from "
                         "%u to %u (as bfcshim plan --granularity)", path, lineno, g,
                         ENV_ALIGNMENT_MIN, ENV_ALIGNMENT_MAX);
                goto out;
            }
            if (++have == 3) {
                if (entries > most) {
                    snprintf(err, errlen, "%s:%lu: %" PRIu64 " entries: more entries than the "
                             "file can hold", path, lineno, entries);
                    goto out;
                }
                if (entries > SIZE_MAX / sizeof *out->entries ||
                    !(out->entries = malloc((entries ? entries : 1) * sizeof *out->entries))) {
                    snprintf(err, errlen, "%s: %" PRIu64 " entries: out of host memory", path,
                             entries);
                    goto out;
                }
            }
            continue;
        }
        bfc_plan_entry e;
        if (!entry_line(line, &e)) {
            snprintf(err, errlen, "%s:%lu: expected 'size offset'", path, lineno);
            goto out;
        }
        if (out->n == entries) {
            snprintf(err, errlen, "%s:%lu: more entries than the %" PRIu64 " announced", path,
                     lineno, entries);
            goto out;
        }
        out->entries[out->n++] = e;
    }
    if (have < 3)
        snprintf(err, errlen, "%s: the header ends early (no '%s' line)", path,
                 have < 0 ? PLAN_MAGIC : want[have]);
    else if (out->n != entries)
        snprintf(err, errlen, "%s: %zu entries, the header announced %" PRIu64
                 " (a truncated file?)", path, out->n, entries);
    else
        ok = true;
out:
    fclose(f);
    if (!ok)
        plan_file_free(out);
    return ok;
}

bool plan_file_write(const char *path, const plan_file *plan)
{
    /* Not through a link planted at the name (out_file.h). */
    FILE *f = strcmp(path, "-") == 0 ? stdout : out_file_fopen(path, "w");
    if (!f)
        return false;
    fprintf(f, PLAN_MAGIC "\ngranularity %" PRIu64 "\npool_bytes %" PRIu64 "\nentries %zu\n",
            plan->granularity, plan->pool_bytes, plan->n);
    for (size_t i = 0; i < plan->n; i++)
        fprintf(f, "%" PRIu64 " %" PRIu64 "\n", plan->entries[i].size, plan->entries[i].offset);
    return out_file_close(f);
}

void plan_counts_text(const bfc_stats *st, char *buf, size_t len)
{
    snprintf(buf, len, "%" PRIu64 " allocations where it said, %" PRIu64 " places not free, %" PRIu64
                       " above it%s",
             st->num_planned, st->num_plan_misses, st->num_plan_spare,
             st->plan_abandoned ? "; abandoned: the run strayed from the recorded one" : "");
}
