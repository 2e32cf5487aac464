/*
 * linear_probe.h - the one subtle rule of open addressing with linear probing
 * and backward-shift deletion, shared by the engine's live index and the
 * trace parser's pointer map.
 *
 * After emptying slot `hole`, the entry at slot j (further along the same
 * probe run) may move back into the hole only if its home slot does not lie
 * cyclically in (hole, j]: otherwise a lookup starting at its home would no
 * longer pass through it.
 */
#ifndef BFCSHIM_CORE_LINEAR_PROBE_H
#define BFCSHIM_CORE_LINEAR_PROBE_H

#include <stdbool.h>
#include <stdint.h>

static inline bool probe_may_fill_hole(uint64_t hole, uint64_t j, uint64_t home)
{
    bool home_in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    return !home_in_range;
}

#endif
