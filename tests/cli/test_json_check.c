/* The JSON recogniser the report checks its inputs with: well-formed texts
 * pass, every truncation of one fails, and the usual mistakes are named. */
#include <string.h>

#include "harness.h"
#include "json_check.h"

static bool ok(const char *s) { return json_check(s, strlen(s), NULL, 0); }

static void accepts_json(void)
{
    static const char stats[] = "{\"version\": 1, \"pools\": [{\"device\": 0, "
                                "\"bytes_limit\": 805306368, \"fragmentation\": 0.25, "
                                "\"alive\": true, \"x\": null}]}";
    const char *good[] = {
        "{}", "[]", "0", "-0.5e+10", "\"a\\u00e9\\n\"", "true", " null ", "[1, [2, {\"a\": []}]]",
        stats,
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        if (!ok(good[i]))
            fprintf(stderr, "refused: %s\n", good[i]);
        CHECK(ok(good[i]));
    }
}

static void refuses_the_rest(void)
{
    const char *bad[] = {
        "", "{", "{\"a\" 1}", "{\"a\": 1,}", "[1 2]", "01", "1.", "-", "tru", "\"abc",
        "\"a\tb\"", "\"\\x\"", "{1: 2}", "{} {}", "nul", "[\"\\u12g4\"]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (ok(bad[i]))
            fprintf(stderr, "accepted: %s\n", bad[i]);
        CHECK(!ok(bad[i]));
    }
    /* every proper prefix of a document is malformed */
    const char *doc = "{\"arms\": [{\"runs\": [{\"wall_s\": 1.5, \"metric\": null}]}]}";
    for (size_t n = 0; n < strlen(doc); n++)
        CHECK(!json_check(doc, n, NULL, 0));
    CHECK(json_check(doc, strlen(doc), NULL, 0));
}

static void says_what_and_where(void)
{
    char why[128];
    CHECK(!json_check("{\"a\": 1,}", 9, why, sizeof why));
    CHECK(strcmp(why, "an object key that is not a string at byte 8") == 0);
    char deep[200];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    CHECK(!json_check(deep, 200, why, sizeof why));
    CHECK(strstr(why, "nesting deeper than 64") == why);
}

int main(void)
{
    RUN(accepts_json);
    RUN(refuses_the_rest);
    RUN(says_what_and_where);
    return harness_result();
}
