/*
 * fuzz_pool.c - libFuzzer target for the engine API. The input is a program:
 * the first bytes pick the pool's options, every following byte pair an
 * operation (allocate, free, fenced free, retire, lane open/close, bad free,
 * trim). The invariant checker runs after every operation; any violation, or
 * a misbehaving return code, aborts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bfc.h"
#include "sim_device.h"

#define MAX_LIVE 256
#define MAX_LANES 4

typedef struct cursor {
    const uint8_t *p;
    size_t left;
} cursor;

static unsigned take(cursor *c)
{
    if (!c->left)
        return 0;
    c->left--;
    return *c->p++;
}

/* Fences: tokens up to `done` have completed; seals are refused while
 * `refuse_seals` is set (as when every stream is capturing). */
static uint64_t done;
static bool refuse_seals;

static bool fence_done(void *ctx, uint32_t lane, uint64_t token, bool wait)
{
    (void)ctx, (void)lane;
    if (wait && token > done)
        done = token;
    return token <= done;
}

static bool fence_seal(void *ctx, uint32_t lane, uint64_t token)
{
    (void)ctx, (void)lane, (void)token;
    return !refuse_seals;
}

static void must(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_pool: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cursor in = {data, size};
    bfc_options o;
    bfc_options_init(&o);
    unsigned cfg = take(&in);
    unsigned lim = take(&in);
    o.limit_bytes = (uint64_t)(lim % 32 + 1) << 16; /* 64 KiB .. 2 MiB */
    /* Virtual memory: 4 KiB granules, given back at once or only under
     * pressure and on trim. */
    o.vmm = (lim & 32) != 0;
    o.map_granularity = 4096;
    o.release_threshold = lim & 64 ? 0 : UINT64_MAX;
    o.preallocate = cfg & 1;
    o.placement = cfg & 2 ? BFC_PLACE_LOW : BFC_PLACE_BY_AGE;
    o.tsl_split = (cfg & 4) != 0;
    o.garbage_collection = (cfg & 8) != 0;
    o.granularity = cfg & 16 ? 512 : 256;
    o.region_granularity = o.granularity;
    o.initial_region_bytes = 4096;
    o.min_split_bytes = (cfg & 32) ? 2048 : 256;
    sim_device dev;
    sim_device_init(&dev, o.limit_bytes);
    dev.alignment = o.vmm ? 4096 : 512;
    if (cfg & 64)
        dev.refuse_above = o.limit_bytes / 2;
    dev.track_maps = o.vmm;
    bfc_backend b = o.vmm ? sim_device_vmm_backend(&dev) : sim_device_backend(&dev);
    done = 0;
    refuse_seals = false;
    if (cfg & 128) {
        b.fence_done = fence_done;
        b.fence_seal = fence_seal;
    }
    bfc_pool *pool = bfc_pool_create(&o, &b);
    must(pool != NULL, "create failed");

    bfc_addr live[MAX_LIVE];
    size_t nlive = 0;
    uint32_t lanes[MAX_LANES] = {0};
    uint32_t opened[256]; /* every lane ever opened: closed ones may still drain */
    size_t nopened = 0;
    uint64_t token = 0;
    uint64_t lent = 0; /* loans of the limit outstanding */
    while (in.left) {
        unsigned op = take(&in), arg = take(&in);
        bfc_status s;
        switch (op % 8) {
        case 0:
        case 1: { /* allocate: sizes from 0 to beyond the limit */
            uint64_t sz = op & 8 ? (uint64_t)arg << 12 : (uint64_t)arg * 37;
            uint32_t lane = op & 16 ? lanes[arg % MAX_LANES] : BFC_NO_LANE;
            bfc_addr a = 0;
            s = bfc_pool_alloc(pool, sz, lane, &a);
            must(s == BFC_OK || s == BFC_ERR_OOM, "alloc returned an unexpected status");
            if (s == BFC_OK && sz && nlive < MAX_LIVE)
                live[nlive++] = a;
            else if (s == BFC_OK && sz)
                must(bfc_pool_free(pool, a) == BFC_OK, "free of a fresh block failed");
            break;
        }
        case 2:
        case 3: /* free, plain or fenced */
            if (nlive) {
                size_t i = arg % nlive;
                uint32_t lane = lanes[arg % MAX_LANES];
                /* Explicit tokens on lanes 0-1, deferred epochs on 2-3. */
                bool deferred = (arg % MAX_LANES) >= 2 && b.fence_seal;
                s = !(op & 8) || !lane ? bfc_pool_free(pool, live[i])
                    : deferred         ? bfc_pool_free_deferred(pool, live[i], lane)
                                       : bfc_pool_free_fenced(pool, live[i], lane, ++token);
                must(s == BFC_OK, "free of a live block failed");
                live[i] = live[--nlive];
            }
            break;
        case 4: /* retire up to some token (explicit lanes), or GPU progress */
            for (int l = 0; l < 2; l++)
                if (lanes[l])
                    bfc_pool_retire(pool, lanes[l], token - (token > arg ? arg : token));
            done += arg % 4;
            refuse_seals = (op & 32) != 0;
            break;
        case 5: { /* lanes */
            uint32_t *l = &lanes[arg % MAX_LANES];
            if (*l) {
                bfc_pool_lane_close(pool, *l);
                *l = 0;
            } else if (nopened < 256) {
                must(bfc_pool_lane_open(pool, op & 8, l) == BFC_OK, "lane_open failed");
                if (nopened < 256)
                    opened[nopened++] = *l;
            }
            break;
        }
        case 6: { /* a free of something that is not a live block start */
            /* Inside the first granule of a live block, or far outside the pool. */
            bfc_addr a = nlive ? live[arg % nlive] + 1 + arg % 255 : 0x1000 + arg;
            s = bfc_pool_free(pool, a);
            must(s == BFC_ERR_NOT_ALLOCATED || s == BFC_ERR_NOT_OWNED || a == 0,
                 "a bad free was accepted");
            break;
        }
        default:
            if (op & 8) {
                bfc_pool_trim(pool);
            } else if (op & 16 && lent) { /* a loan ends (all of it) */
                bfc_pool_end_loan(pool, lent);
                lent = 0;
            } else { /* a loan (the virtual memory door): refused or counted */
                const uint64_t want = (uint64_t)arg << 10;
                bfc_stats before;
                bfc_pool_stats(pool, &before);
                s = bfc_pool_lend(pool, want);
                must(s == BFC_OK || s == BFC_ERR_OOM, "a loan failed oddly");
                bfc_stats after;
                bfc_pool_stats(pool, &after);
                must(after.bytes_lent == before.bytes_lent + (s == BFC_OK ? want : 0),
                     "a loan miscounted");
                must(after.pool_bytes + after.bytes_lent <= after.bytes_limit,
                     "a loan left the pool over its limit");
                lent += s == BFC_OK ? want : 0;
            }
        }
        must(bfc_pool_check(pool, stderr) == 0, "invariant violated");
    }
    refuse_seals = false;
    for (size_t l = 0; l < nopened; l++) {
        bfc_pool_seal_lane(pool, opened[l]);
        bfc_pool_retire(pool, opened[l], UINT64_MAX);
    }
    while (nlive)
        must(bfc_pool_free(pool, live[--nlive]) == BFC_OK, "final free failed");
    bfc_pool_end_loan(pool, lent);
    must(bfc_pool_check(pool, stderr) == 0, "invariant violated at the end");
    bfc_stats st;
    bfc_pool_stats(pool, &st);
    must(st.bytes_in_use == 0 && st.pending_bytes == 0, "bytes left in use");
    bfc_pool_destroy(pool, true);
    must(dev.held == 0 && dev.nmaps == 0, "regions or mappings leaked");
    must(dev.misuse == 0, "bad map, unmap or unreserve call");
    sim_device_fini(&dev);
    return 0;
}
