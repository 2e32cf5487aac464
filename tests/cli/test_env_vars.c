/* The table of BFCSHIM_* variables (shim/common/env_vars.c): its choice
 * lists are in the order of the enums the library indexes with them, what
 * it accepts and refuses, the messages, and the nearest-name suggestion;
 * and the whole-number parser the command-line options share (units.c). */
#include <string.h>

#include "bfc.h"
#include "env_vars.h"
#include "harness.h"
#include "units.h"

static const env_var *must_find(const char *name)
{
    const env_var *v = env_var_find(name);
    REQUIRE(v != NULL);
    return v;
}

static void choices_are_in_enum_order(void)
{
    const env_var *place = must_find("BFCSHIM_PLACEMENT");
    for (int p = BFC_PLACE_BY_AGE; p <= BFC_PLACE_ALIGNED; p++)
        CHECK(strcmp(place->choices[p], bfc_placement_name((bfc_placement)p)) == 0);
    const env_var *level = must_find("BFCSHIM_LOG_LEVEL");
    const char *const levels[] = {"error", "warn", "info", "debug"}; /* LOG_ERROR.. */
    for (int i = 0; i < 4; i++)
        CHECK(strcmp(level->choices[i], levels[i]) == 0);
    CHECK_EQ(env_var_choice(must_find("BFCSHIM_ALLOCATOR"), "PLATFORM"), 1);
    CHECK_EQ(env_var_choice(must_find("BFCSHIM_CONFIG_ERRORS"), "fatal"), 0);
    CHECK_EQ(env_var_choice(must_find("BFCSHIM_FREE_POLICY"), "sometimes"), -1);
}

static void values_accepted_and_refused(void)
{
    static const struct {
        const char *name, *value;
        bool ok;
    } cases[] = {
        {"BFCSHIM_MEM_FRACTION", "0.5", true},   {"BFCSHIM_MEM_FRACTION", "1", true},
        {"BFCSHIM_MEM_FRACTION", "1.5", false},  {"BFCSHIM_MEM_FRACTION", "0", false},
        {"BFCSHIM_MEM_FRACTION", "lots", false}, {"BFCSHIM_MEM_LIMIT", "40GiB", true},
        {"BFCSHIM_MEM_LIMIT", "0", false},       {"BFCSHIM_FENCE_BYTES", "0", true},
        {"BFCSHIM_ALIGNMENT", "4096", true},     {"BFCSHIM_ALIGNMENT", "768", false},
        {"BFCSHIM_ALIGNMENT", "128", false},     {"BFCSHIM_ALIGNMENT", "2MiB", false},
        {"BFCSHIM_FENCE_INTERVAL", "16", true},  {"BFCSHIM_FENCE_INTERVAL", "1.5", false},
        {"BFCSHIM_FENCE_INTERVAL", "5000", false}, {"BFCSHIM_PREALLOCATE", "No", true},
        {"BFCSHIM_PREALLOCATE", "maybe", false}, {"BFCSHIM_TRACE", "", false},
        {"BFCSHIM_PLACEMENT", "Aligned", true},  {"BFCSHIM_LIBRARY", "anything", true},
        {"BFCSHIM_GROWTH_HEADROOM", "0.035", true}, {"BFCSHIM_GROWTH_HEADROOM", "0", true},
        {"BFCSHIM_GROWTH_HEADROOM", "1.5", false},
        /* Blank is no number: strtod converts nothing and the bounds
         * allowed 0, so " " read as a headroom of 0. */
        {"BFCSHIM_GROWTH_HEADROOM", " ", false}, {"BFCSHIM_MEM_FRACTION", " ", false},
        {"BFCSHIM_GROWTH_HEADROOM", "0x", false}, {"BFCSHIM_MEM_FRACTION", "1e400", false},
        {"BFCSHIM_MEM_FRACTION", "nan", false},  {"BFCSHIM_MEM_LIMIT", "0x", false},
        {"BFCSHIM_MEM_LIMIT", "-1", false},      {"BFCSHIM_MEM_LIMIT", "1e400", false},
        {"BFCSHIM_MEM_LIMIT", "99999999999999999999", false},
        {"BFCSHIM_MEM_LIMIT", "17000000TiB", false},
        {"BFCSHIM_FENCE_INTERVAL", "0", false},  {"BFCSHIM_FENCE_INTERVAL", " ", false},
        /* Less than a byte is no size: "0.5" read as 0, which for these
         * means "none", the opposite of what a small value asks. */
        {"BFCSHIM_FENCE_BYTES", "0.5", false},   {"BFCSHIM_RELEASE_THRESHOLD", "0.5", false},
        {"BFCSHIM_FENCE_BYTES", "0.0", true},    {"BFCSHIM_FENCE_BYTES", "0.5KiB", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool ok = env_var_check(must_find(cases[i].name), cases[i].value, NULL, 0);
        if (ok != cases[i].ok)
            fprintf(stderr, "%s=%s: %d\n", cases[i].name, cases[i].value, ok);
        CHECK_EQ(ok, cases[i].ok);
    }
}

static void whole_numbers_in_bounds(void)
{
    uint64_t v = 7;
    CHECK(parse_whole_in("0", 0, 10, &v) && v == 0);
    CHECK(parse_whole_in("10", 0, 10, &v) && v == 10);
    CHECK(parse_whole_in("18446744073709551615", 0, UINT64_MAX, &v) && v == UINT64_MAX);
    v = 7;
    CHECK(!parse_whole_in("11", 0, 10, &v));
    CHECK(!parse_whole_in("0", 1, 10, &v));
    CHECK(!parse_whole_in("", 0, 10, &v));
    CHECK(!parse_whole_in("-1", 0, 10, &v));
    CHECK(!parse_whole_in("3x", 0, 10, &v));
    CHECK(!parse_whole_in("1.5", 0, 10, &v));
    CHECK_EQ(v, 7); /* untouched when refused */
}

static void messages_say_what_is_accepted(void)
{
    char why[256];
    CHECK(!env_var_check(must_find("BFCSHIM_MEM_FRACTION"), "2", why, sizeof why));
    CHECK(strstr(why, "a number from 0.000001 to 1, for the share of device memory") == why);
    CHECK(!env_var_check(must_find("BFCSHIM_ALIGNMENT"), "3", why, sizeof why));
    CHECK(strstr(why, "a power of two from 256 B to 1.00 MiB") == why);
    CHECK(!env_var_check(must_find("BFCSHIM_FREE_POLICY"), "x", why, sizeof why));
    CHECK(strstr(why, "one of fenced, immediate,") == why);
    char tiny[8];
    CHECK(!env_var_check(must_find("BFCSHIM_MEM_FRACTION"), "2", tiny, sizeof tiny));
    CHECK_EQ(strlen(tiny), sizeof tiny - 1); /* cut, terminated */
}

static void misspelt_names_get_the_nearest(void)
{
    CHECK(strcmp(env_var_closest("BFCSHIM_MEM_FRACTON"), "BFCSHIM_MEM_FRACTION") == 0);
    CHECK(strcmp(env_var_closest("BFCSHIM_PREALOCATE"), "BFCSHIM_PREALLOCATE") == 0);
    CHECK(strcmp(env_var_closest("BFCSHIM_STAT"), "BFCSHIM_STATS") == 0);
    CHECK(env_var_closest("BFCSHIM_SOMETHING_ELSE_ENTIRELY") == NULL);
    /* Only close names: three edits of a three-letter name is another name. */
    CHECK(env_var_closest("BFCSHIM_FOO") == NULL);
    CHECK(env_var_closest("BFCSHIM_X") == NULL);
    CHECK(strcmp(env_var_closest("BFCSHIM_FENCE_INTERVL"), "BFCSHIM_FENCE_INTERVAL") == 0);
    CHECK(strcmp(env_var_closest("BFCSHIM_MEM_FRAC"), "BFCSHIM_MEM_FRACTION") == 0);
    CHECK(env_var_find("BFCSHIM_MEM_FRACTON") == NULL);
}

int main(void)
{
    RUN(choices_are_in_enum_order);
    RUN(values_accepted_and_refused);
    RUN(whole_numbers_in_bounds);
    RUN(messages_say_what_is_accepted);
    RUN(misspelt_names_get_the_nearest);
    return harness_result();
}
