/*
 * json_check.h - is a text one well-formed JSON value (RFC 8259)? The report
 * embeds the user's stats and A/B files in its page, where a malformed one
 * would break the page's script: they are checked first, and refused with
 * the place of the first error.
 */
#ifndef BFCSHIM_COMMON_JSON_CHECK_H
#define BFCSHIM_COMMON_JSON_CHECK_H

#include <stdbool.h>
#include <stddef.h>

/* True when text[0..n) is exactly one JSON value (whitespace around it
 * allowed). Otherwise false, with `why` (if given) saying what and at which
 * byte offset. Nesting deeper than 64 is refused. */
bool json_check(const char *text, size_t n, char *why, size_t len);

#endif
