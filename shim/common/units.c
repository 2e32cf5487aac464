/* units.c - parsing and printing sizes (see units.h). */
#include "units.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static bool suffix_shift(const char *s, unsigned *shift)
{
    static const struct { const char *name; unsigned shift; } table[] = {
        {"", 0},    {"b", 0},   {"k", 10},  {"kb", 10}, {"kib", 10}, {"m", 20},
        {"mb", 20}, {"mib", 20}, {"g", 30}, {"gb", 30}, {"gib", 30}, {"t", 40},
        {"tb", 40}, {"tib", 40}, {"p", 50}, {"pb", 50}, {"pib", 50},
    };
    while (*s == ' ')
        s++;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcasecmp(s, table[i].name) == 0) {
            *shift = table[i].shift;
            return true;
        }
    return false;
}

bool parse_size(const char *text, uint64_t *out)
{
    if (!text)
        return false;
    while (*text == ' ')
        text++;
    if (*text < '0' || *text > '9')
        return false; /* no sign, no empty string */
    char *end;
    errno = 0;
    unsigned long long whole = strtoull(text, &end, 10);
    if (errno)
        return false;
    unsigned shift;
    if (*end != '.') {
        if (!suffix_shift(end, &shift) || (shift && whole > (UINT64_MAX >> shift)))
            return false;
        *out = (uint64_t)whole << shift;
        return true;
    }
    /* Digits, a point and digits, then the unit: strtod alone also reads
     * an exponent ("1.0e-400" underflowed to 0, a threshold's "none"). */
    const char *frac = end + 1;
    while (*frac >= '0' && *frac <= '9')
        frac++;
    double value = strtod(text, &end);
    if (end != frac || !suffix_shift(end, &shift) || !isfinite(value) || value < 0)
        return false;
    double bytes = value * (double)(UINT64_C(1) << shift);
    /* Less than a byte, but not 0, is no size: "0.5" would read as 0,
     * which for a threshold means "none", the opposite of a small one. */
    if (bytes >= 18446744073709551616.0 || (value > 0 && bytes < 1))
        return false;
    *out = (uint64_t)bytes;
    return true;
}

bool parse_power_of_two_in(const char *text, uint64_t lo, uint64_t hi, uint64_t *out)
{
    uint64_t v;
    if (!parse_size(text, &v) || v < lo || v > hi || (v & (v - 1)))
        return false;
    *out = v;
    return true;
}

bool parse_whole_in(const char *text, uint64_t lo, uint64_t hi, uint64_t *out)
{
    /* Digits from the first byte: strtoull alone skips blanks and takes a
     * sign (" -1" read as 2^64 - 1), and saturates past 2^64 - 1. */
    if (!text || *text < '0' || *text > '9')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool parse_double_in(const char *text, double lo, double hi, double *out)
{
    if (!text || !*text)
        return false;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    const bool converted = end != text; /* blank converts nothing, and reads as 0 */
    while (*end == ' ')
        end++;
    if (!converted || errno || *end || !isfinite(v) || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool parse_bool(const char *text, bool *out)
{
    static const char *yes[] = {"1", "true", "yes", "on"};
    static const char *no[] = {"0", "false", "no", "off"};
    if (!text)
        return false;
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(text, yes[i]) == 0) {
            *out = true;
            return true;
        }
        if (strcasecmp(text, no[i]) == 0) {
            *out = false;
            return true;
        }
    }
    return false;
}

const char *format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (bytes < 1024) {
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
        return buf;
    }
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, unit[u]);
    return buf;
}
