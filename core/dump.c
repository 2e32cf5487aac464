/*
 * dump.c - the pool's memory map as text: a summary in TSL's DebugString
 * layout, a line per size class in use, every chunk, and an occupancy strip
 * per region in the manner of TSL's RenderOccupancy:
 *   '*' bytes the program asked for    'x' rounding and split waste
 *   '_' free                           'p' freed, waiting for its fence
 *   '.' free address space with no memory mapped behind it (vmm)
 * Each column shows the kind that covers most of its bytes.
 *
 * Over virtual memory a free chunk is address space, not memory: the
 * summary's LargestFreeBlock and Fragmentation count only what the limit
 * lets the pool back (bfc_pool_free_space), two more lines say how much
 * address space there is and how much of the free part lies beyond the
 * limit, and each region and free chunk says how much of it is mapped. An
 * out-of-memory report that showed a free block larger than the limit
 * beside "the pool is full" contradicted itself.
 */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

#define STRIP_COLUMNS 100u

static void dump_summary(const bfc_pool *p, FILE *out)
{
    bfc_stats s;
    pool_stats_locked(p, &s);
    bfc_free_space fs;
    pool_free_space_locked(p, &s, &fs);
    fprintf(out,
            "Limit:            %20llu\n"
            "InUse:            %20llu\n"
            "MaxInUse:         %20llu\n"
            "NumAllocs:        %20llu\n"
            "MaxAllocSize:     %20llu\n"
            "Reserved:         %20llu\n"
            "PeakReserved:     %20llu\n"
            "LargestFreeBlock: %20llu\n"
            "Pending:          %20llu\n"
            "Requested:        %20llu\n"
            "Fragmentation:    %20.4f\n",
            (unsigned long long)s.bytes_limit, (unsigned long long)s.bytes_in_use,
            (unsigned long long)s.peak_bytes_in_use,
            (unsigned long long)s.num_allocs,
            (unsigned long long)s.largest_alloc_size,
            (unsigned long long)s.bytes_reserved,
            (unsigned long long)s.peak_bytes_reserved,
            (unsigned long long)fs.largest_free_block_bytes,
            (unsigned long long)s.pending_bytes,
            (unsigned long long)s.bytes_requested, fs.fragmentation);
    if (p->opt.vmm)
        fprintf(out,
                "AddressSpace:     %20llu\n"
                "FreeBeyondLimit:  %20llu\n",
                (unsigned long long)s.va_bytes, (unsigned long long)fs.beyond_limit_bytes);
}

static void add_piece(void *arg, bfc_addr lo, bfc_addr hi, bool mapped)
{
    if (mapped)
        *(uint64_t *)arg += hi - lo;
}

/* Mapped bytes of [lo, hi) of region r (vmm). */
static uint64_t mapped_in(const bfc_pool *p, const region *r, bfc_addr lo, bfc_addr hi)
{
    uint64_t n = 0;
    backing_pieces(p, r, lo, hi, add_piece, &n);
    return n;
}

typedef struct bin_tally {
    uint64_t chunks, in_use, bytes, bytes_in_use, requested;
} bin_tally;

static void dump_bins(const bfc_pool *p, FILE *out)
{
    bin_tally *t = calloc(BIN_COUNT, sizeof *t);
    if (!t) {
        fprintf(out, "(bin summary skipped: no host memory)\n");
        return;
    }
    for (uint32_t r = 0; r < p->nregions; r++) {
        for (uint32_t c = p->regions[r].first; c != CHUNK_NIL; c = C(p, c)->next) {
            const chunk *cc = C(p, c);
            bin_tally *b = &t[bin_index(cc->size)];
            b->chunks++;
            b->bytes += cc->size;
            if (cc->state == CHUNK_ALLOCATED) {
                b->in_use++;
                b->bytes_in_use += cc->size;
                b->requested += cc->requested;
            }
        }
    }
    for (uint32_t b = 0; b < BIN_COUNT; b++) {
        if (!t[b].chunks)
            continue;
        fprintf(out,
                "Bin (%llu): total chunks %llu, in use %llu; %llu bytes in chunks, "
                "%llu in use, %llu requested\n",
                (unsigned long long)bin_min_size(b), (unsigned long long)t[b].chunks,
                (unsigned long long)t[b].in_use, (unsigned long long)t[b].bytes,
                (unsigned long long)t[b].bytes_in_use,
                (unsigned long long)t[b].requested);
    }
    free(t);
}

static void dump_chunks(const bfc_pool *p, FILE *out)
{
    for (uint32_t r = 0; r < p->nregions; r++) {
        const region *rg = &p->regions[r];
        if (p->opt.vmm)
            fprintf(out, "Region %u: 0x%llx, %llu bytes of address space, %llu mapped\n", r,
                    (unsigned long long)rg->base, (unsigned long long)rg->size,
                    (unsigned long long)backing_count(p, rg));
        else
            fprintf(out, "Region %u: 0x%llx, %llu bytes\n", r, (unsigned long long)rg->base,
                    (unsigned long long)rg->size);
        for (uint32_t c = rg->first; c != CHUNK_NIL; c = C(p, c)->next) {
            const chunk *cc = C(p, c);
            unsigned long long a = cc->addr, sz = cc->size;
            if (cc->state == CHUNK_ALLOCATED)
                fprintf(out, "  InUse   0x%llx size %llu requested %llu seq %llu\n",
                        a, sz, (unsigned long long)cc->requested,
                        (unsigned long long)cc->stamp);
            else if (cc->state == CHUNK_PENDING)
                fprintf(out, "  Pending 0x%llx size %llu lane %u token %llu\n", a, sz,
                        cc->lane, (unsigned long long)cc->stamp);
            else if (p->opt.vmm)
                fprintf(out, "  Free    0x%llx size %llu, %llu mapped\n", a, sz,
                        (unsigned long long)mapped_in(p, rg, cc->addr, cc->addr + cc->size));
            else
                fprintf(out, "  Free    0x%llx size %llu\n", a, sz);
        }
    }
}

enum { KINDS = 5 }; /* requested, waste, free, pending, unmapped: the glyphs */

/* Adds `bytes` of kind k over [from, to) of a region split into columns. */
static void spread(uint64_t (*cols)[KINDS], uint64_t base, uint64_t width, uint64_t from,
                   uint64_t to, int k)
{
    while (from < to) {
        uint64_t col = (from - base) / width;
        if (col >= STRIP_COLUMNS)
            col = STRIP_COLUMNS - 1;
        uint64_t col_end = base + (col + 1) * width;
        uint64_t end = col == STRIP_COLUMNS - 1 || col_end > to ? to : col_end;
        cols[col][k] += end - from;
        from = end;
    }
}

typedef struct strip {
    uint64_t (*cols)[KINDS];
    uint64_t base, width;
} strip;

static void spread_piece(void *arg, bfc_addr lo, bfc_addr hi, bool mapped)
{
    const strip *s = arg;
    spread(s->cols, s->base, s->width, lo, hi, mapped ? 2 : 4);
}

static void dump_occupancy(const bfc_pool *p, FILE *out)
{
    static const char glyph[KINDS] = {'*', 'x', '_', 'p', '.'};
    for (uint32_t r = 0; r < p->nregions; r++) {
        const region *rg = &p->regions[r];
        uint64_t cols[STRIP_COLUMNS][KINDS];
        memset(cols, 0, sizeof cols);
        uint64_t width = rg->size / STRIP_COLUMNS ? rg->size / STRIP_COLUMNS : 1;
        strip st = {cols, rg->base, width};
        for (uint32_t c = rg->first; c != CHUNK_NIL; c = C(p, c)->next) {
            const chunk *cc = C(p, c);
            uint64_t a = cc->addr, end = cc->addr + cc->size;
            if (cc->state == CHUNK_ALLOCATED) {
                spread(cols, rg->base, width, a, a + cc->requested, 0);
                spread(cols, rg->base, width, a + cc->requested, end, 1);
            } else if (cc->state == CHUNK_PENDING) {
                spread(cols, rg->base, width, a, end, 3);
            } else if (p->opt.vmm) {
                backing_pieces(p, rg, a, end, spread_piece, &st);
            } else {
                spread(cols, rg->base, width, a, end, 2);
            }
        }
        char line[STRIP_COLUMNS + 1];
        for (uint32_t i = 0; i < STRIP_COLUMNS; i++) {
            int best = 0;
            for (int k = 1; k < KINDS; k++)
                if (cols[i][k] > cols[i][best])
                    best = k;
            line[i] = glyph[best];
        }
        line[STRIP_COLUMNS] = '\0';
        fprintf(out, "Region %u |%s|\n", r, line);
    }
}

void bfc_pool_dump(bfc_pool *p, FILE *out, unsigned what)
{
    bfc_lock_acquire(&p->lock);
    if (what & BFC_DUMP_SUMMARY)
        dump_summary(p, out);
    if (what & BFC_DUMP_BINS)
        dump_bins(p, out);
    if (what & BFC_DUMP_CHUNKS)
        dump_chunks(p, out);
    if (what & BFC_DUMP_OCCUPANCY)
        dump_occupancy(p, out);
    bfc_lock_release(&p->lock);
}
