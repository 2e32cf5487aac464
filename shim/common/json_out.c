/* json_out.c - streaming JSON writer (see json_out.h). */
#include "json_out.h"

#include <inttypes.h>
#include <math.h>

void json_begin(json_out *j, FILE *f, bool pretty)
{
    j->f = f;
    j->depth = 0;
    j->need_comma[0] = false;
    j->pretty = pretty;
}

static void put_escaped(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            /* '<' too: the report embeds JSON in a <script> element, which
             * any "</" would end; \u003c means the same to every reader. */
            if (*p < 0x20 || *p == '<')
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

/* Separator, newline and indentation before a member, then its key. */
static void member(json_out *j, const char *key)
{
    if (j->need_comma[j->depth])
        fputs(j->pretty ? "," : ", ", j->f);
    j->need_comma[j->depth] = true;
    if (j->pretty && j->depth > 0) {
        fputc('\n', j->f);
        for (int i = 0; i < j->depth; i++)
            fputs("  ", j->f);
    }
    if (key) {
        put_escaped(j->f, key);
        fputs(": ", j->f);
    }
}

static void open_container(json_out *j, const char *key, char c)
{
    member(j, key);
    fputc(c, j->f);
    if (j->depth + 1 < JSON_MAX_DEPTH)
        j->depth++;
    j->need_comma[j->depth] = false;
}

static void close_container(json_out *j, char c)
{
    bool had_members = j->need_comma[j->depth];
    if (j->depth > 0)
        j->depth--;
    if (j->pretty && had_members) {
        fputc('\n', j->f);
        for (int i = 0; i < j->depth; i++)
            fputs("  ", j->f);
    }
    fputc(c, j->f);
}

void json_object_open(json_out *j, const char *key) { open_container(j, key, '{'); }
void json_object_close(json_out *j) { close_container(j, '}'); }
void json_array_open(json_out *j, const char *key) { open_container(j, key, '['); }
void json_array_close(json_out *j) { close_container(j, ']'); }

void json_u64(json_out *j, const char *key, uint64_t v)
{
    member(j, key);
    fprintf(j->f, "%" PRIu64, v);
}

void json_i64(json_out *j, const char *key, int64_t v)
{
    member(j, key);
    fprintf(j->f, "%" PRId64, v);
}

void json_double(json_out *j, const char *key, double v)
{
    member(j, key);
    if (isfinite(v))
        fprintf(j->f, "%.6g", v);
    else
        fputs("null", j->f);
}

void json_bool(json_out *j, const char *key, bool v)
{
    member(j, key);
    fputs(v ? "true" : "false", j->f);
}

void json_string(json_out *j, const char *key, const char *v)
{
    member(j, key);
    if (v)
        put_escaped(j->f, v);
    else
        fputs("null", j->f);
}

void json_null(json_out *j, const char *key)
{
    member(j, key);
    fputs("null", j->f);
}

void json_raw(json_out *j, const char *key, const char *text)
{
    member(j, key);
    fputs(text, j->f);
}

void json_end(json_out *j)
{
    fputc('\n', j->f);
    fflush(j->f);
}
