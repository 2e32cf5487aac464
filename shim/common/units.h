/*
 * units.h - byte sizes as people write them ("40GiB", "512MB", "1.5G",
 * "1048576") and as we print them, shared by the shim's configuration and the
 * bfcshim command.
 */
#ifndef BFCSHIM_COMMON_UNITS_H
#define BFCSHIM_COMMON_UNITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Parses a size. Suffixes: B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB,
 * P/PB/PiB, any case; KB and KiB both mean 1024 (as in XLA and PyTorch
 * settings). A fraction is allowed before a suffix ("1.5GiB"). Whatever
 * format_size prints reads back (within its rounding) unless it rounds past
 * 2^64 - 1. Returns false for anything else, including overflow and
 * negative numbers. */
bool parse_size(const char *text, uint64_t *out);

/* Parses a size (parse_size) that is a power of two in [lo, hi]. */
bool parse_power_of_two_in(const char *text, uint64_t lo, uint64_t hi, uint64_t *out);

/* Parses a whole number in [lo, hi], decimal digits only (no sign); the
 * whole string must be consumed. */
bool parse_whole_in(const char *text, uint64_t lo, uint64_t hi, uint64_t *out);

/* Parses a real number in [lo, hi]; the whole string must be consumed. */
bool parse_double_in(const char *text, double lo, double hi, double *out);

/* Parses true/false/1/0/yes/no/on/off (any case). */
bool parse_bool(const char *text, bool *out);

/* "9.54 GiB", "512 B": three significant digits, binary units. */
const char *format_size(uint64_t bytes, char *buf, size_t len);

#endif
