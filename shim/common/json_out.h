/*
 * json_out.h - a minimal streaming JSON writer to a FILE *: enough for the
 * stats file, replay results and the A/B report, with correct string escaping
 * and commas placed for the caller.
 */
#ifndef BFCSHIM_COMMON_JSON_OUT_H
#define BFCSHIM_COMMON_JSON_OUT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define JSON_MAX_DEPTH 16

typedef struct json_out {
    FILE *f;
    int depth;
    bool need_comma[JSON_MAX_DEPTH];
    bool pretty;
} json_out;

void json_begin(json_out *j, FILE *f, bool pretty);
void json_object_open(json_out *j, const char *key);  /* key NULL inside arrays */
void json_object_close(json_out *j);
void json_array_open(json_out *j, const char *key);
void json_array_close(json_out *j);
void json_u64(json_out *j, const char *key, uint64_t v);
void json_i64(json_out *j, const char *key, int64_t v);
void json_double(json_out *j, const char *key, double v); /* NaN/inf -> null */
void json_bool(json_out *j, const char *key, bool v);
void json_string(json_out *j, const char *key, const char *v); /* NULL -> null */
void json_null(json_out *j, const char *key);
/* A value already written as JSON (by another json_out, say), as it is. */
void json_raw(json_out *j, const char *key, const char *text);
/* Ends the document with a newline. */
void json_end(json_out *j);

#endif
