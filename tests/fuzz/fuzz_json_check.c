/*
 * fuzz_json_check.c - libFuzzer target for the JSON checker
 * (shim/common/json_check.c), which vets the --stats and --ab files
 * `bfcshim report` embeds in its page. A refusal must say what and where
 * (inside the text); an accepted text must stay accepted with whitespace
 * around it and as the one element of an array (unless that nests it past
 * the limit), and must hold no raw control character or '<' outside a
 * string (the page escapes '<' only as JSON text allows it: in strings).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_check.h"

static void must(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_json_check: %s\n", what);
        abort();
    }
}

/* Deepest nesting of brackets outside strings; *bare: a byte outside a
 * string that no JSON token has. */
static int depth_of(const char *s, size_t n, bool *bare)
{
    int depth = 0, most = 0;
    bool in = false;
    *bare = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (in) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in = false;
            continue;
        }
        if (c == '"')
            in = true;
        else if (c == '[' || c == '{')
            most = ++depth > most ? depth : most;
        else if (c == ']' || c == '}')
            depth--;
        else if (!strchr(" \t\r\n,:-+.0123456789eEtruefalsn", c) || c == 0)
            *bare = true;
    }
    return most;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    char why[128] = "";
    if (!json_check(s, size, why, sizeof why)) {
        const char *at = strstr(why, " at byte ");
        must(at != NULL && at != why, "a refusal that does not say what and where");
        must(strtoull(at + 9, NULL, 10) <= size, "an error past the end of the text");
        return 0;
    }
    bool bare;
    const int depth = depth_of(s, size, &bare);
    must(!bare, "a byte outside strings that no JSON token has");
    must(depth <= 64, "nesting deeper than 64 accepted");

    char *wrapped = malloc(size + 4);
    must(wrapped != NULL, "host memory");
    wrapped[0] = '\n';
    memcpy(wrapped + 1, s, size);
    wrapped[size + 1] = ' ';
    must(json_check(wrapped, size + 2, NULL, 0), "refused with whitespace around it");
    wrapped[0] = '[';
    wrapped[size + 1] = ']';
    must(json_check(wrapped, size + 2, NULL, 0) == (depth < 64),
         "as an array's one element, judged otherwise");
    free(wrapped);
    return 0;
}
