/*
 * fuzz_units.c - libFuzzer target for the parsers of settings people type:
 * sizes, whole and real numbers, booleans (shim/common/units.c), and every
 * BFCSHIM_* variable's check and name hint (shim/common/env_vars.c), which
 * the shim's configuration and the bfcshim command's options go through.
 * The input, up to its first NUL, is the text. What is accepted must be
 * what units.h promises: a size reads back the same printed in digits, and
 * within format_size's rounding printed by it; a whole number is decimal
 * digits only, of the value they spell; a real number lies in its range.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env_vars.h"
#include "units.h"

static void must(int cond, const char *what, const char *text)
{
    if (!cond) {
        fprintf(stderr, "fuzz_units: %s: '%s'\n", what, text);
        abort();
    }
}

/* The value of text when it is decimal digits only and fits 64 bits. */
static bool digits_only(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    if (!*s)
        return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
            return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return true;
}

static void check_size(const char *text)
{
    uint64_t v, again, exact;
    if (!parse_size(text, &v))
        return;
    char buf[64];
    /* digits alone: the value itself */
    const char *p = text;
    while (*p == ' ')
        p++;
    if (digits_only(p, &exact))
        must(v == exact, "a plain number read as another", text);
    /* digits, a point and digits, then the unit: no exponent (units.h;
     * "1.0e-400" read as 0, which for a threshold is "none") */
    const char *q = p;
    while (*q >= '0' && *q <= '9')
        q++;
    if (*q == '.')
        for (q++; *q >= '0' && *q <= '9'; q++)
            ;
    must(!((*q == 'e' || *q == 'E') && (q[1] == '-' || q[1] == '+' || (q[1] >= '0' && q[1] <= '9'))),
         "a size with an exponent", text);
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    must(parse_size(buf, &again) && again == v, "a size printed in digits reads differently", text);
    /* as format_size prints it: three significant digits (rounded up past
     * 2^64 - 1 near the top, where a refusal is right) */
    format_size(v, buf, sizeof buf);
    if (v > UINT64_MAX - UINT64_MAX / 200)
        return;
    must(parse_size(buf, &again), "a size printed by format_size is refused", buf);
    const uint64_t diff = again > v ? again - v : v - again;
    must(diff <= v / 200 + 1, "a size printed by format_size reads far from it", buf);
}

static void check_numbers(const char *text)
{
    uint64_t v, exact;
    /* parse_whole_in: decimal digits only, no sign, the whole string */
    if (parse_whole_in(text, 0, UINT64_MAX, &v)) {
        must(digits_only(text, &exact), "a whole number that is not digits only", text);
        must(v == exact, "a whole number read as another", text);
    }
    if (parse_whole_in(text, 5, 1000, &v))
        must(v >= 5 && v <= 1000, "a whole number out of its range", text);
    if (parse_power_of_two_in(text, 256, UINT64_C(1) << 20, &v)) {
        uint64_t s;
        must(v >= 256 && v <= (UINT64_C(1) << 20) && (v & (v - 1)) == 0,
             "a power of two out of range", text);
        must(parse_size(text, &s) && s == v, "a power of two its size disagrees with", text);
    }
    double d;
    if (parse_double_in(text, 1e-6, 1, &d))
        must(isfinite(d) && d >= 1e-6 && d <= 1, "a real number out of its range", text);
    bool b;
    (void)parse_bool(text, &b);
}

static void check_env(const char *text)
{
    char accepted[256];
    for (size_t i = 0; i < env_vars_count; i++) {
        if (!env_var_check(&env_vars[i], text, accepted, sizeof accepted))
            must(accepted[0] != 0, "a refusal that says nothing", text);
        if (env_vars[i].kind == VAR_CHOICE) {
            int k = env_var_choice(&env_vars[i], text);
            must(k >= -1 && k < 5, "a choice out of range", text);
        }
    }
    const char *near = env_var_closest(text);
    must(!near || env_var_find(near) != NULL, "a hint that is not a known name", text);
    char hint[160];
    env_var_hint(text, hint, sizeof hint);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char text[512];
    size_t n = size < sizeof text - 1 ? size : sizeof text - 1;
    memcpy(text, data, n);
    text[n] = 0;
    check_size(text);
    check_numbers(text);
    check_env(text);
    return 0;
}
