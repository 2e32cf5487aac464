/*
 * fuzz_plan_file.c - libFuzzer target for the placement-plan reader
 * (shim/common/plan_file.c, BFCSHIM_PLAN and `bfcshim replay --plan`). The
 * input is written to a scratch file and read as a plan. A refusal must say
 * where ("file..."); a plan accepted must be what its header announced, at
 * a granularity a pool can have, must read back the same once written, and
 * is installed in a pool that then serves its sizes with the invariant
 * checker on.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bfc.h"
#include "env_vars.h"
#include "plan_file.h"
#include "sim_device.h"

static void must(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_plan_file: %s\n", what);
        abort();
    }
}

/* Two scratch files for the whole run: the input, and the plan written back. */
static char in_path[64], out_path[64];

static void scratch(char *path, size_t len)
{
    snprintf(path, len, "/tmp/fuzz_plan_file.XXXXXX");
    int fd = mkstemp(path);
    must(fd >= 0, "mkstemp");
    close(fd);
}

static void remove_scratch(void)
{
    unlink(in_path);
    unlink(out_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!in_path[0]) {
        scratch(in_path, sizeof in_path);
        scratch(out_path, sizeof out_path);
        atexit(remove_scratch);
    }
    FILE *f = fopen(in_path, "wb");
    must(f && fwrite(data, 1, size, f) == size && fclose(f) == 0, "writing the input");

    plan_file plan;
    char err[512] = "";
    if (!plan_file_read(in_path, &plan, err, sizeof err)) {
        must(strncmp(err, in_path, strlen(in_path)) == 0, "an error that does not name the file");
        must(plan.entries == NULL && plan.n == 0, "a refused plan keeps memory");
        return 0;
    }
    /* A pool takes only a plan at its own granularity, a power of two from
     * ENV_ALIGNMENT_MIN (BFCSHIM_ALIGNMENT, bfcshim plan --granularity). */
    must(plan.granularity >= ENV_ALIGNMENT_MIN && plan.granularity <= ENV_ALIGNMENT_MAX &&
             (plan.granularity & (plan.granularity - 1)) == 0,
         "a granularity no pool can have");
    must(plan.n == 0 || plan.entries, "entries missing");

    /* Written and read again: the same plan. */
    must(plan_file_write(out_path, &plan), "writing the plan back");
    plan_file again;
    must(plan_file_read(out_path, &again, err, sizeof err), "the plan written back is refused");
    must(again.granularity == plan.granularity && again.pool_bytes == plan.pool_bytes &&
             again.n == plan.n &&
             (plan.n == 0 || memcmp(again.entries, plan.entries, plan.n * sizeof *plan.entries) == 0),
         "the plan written back reads differently");
    plan_file_free(&again);

    /* Installed in a pool of its granularity (small, so that inputs stay
     * cheap): refused only as bfc.h says, and then serving its sizes. */
    sim_device dev;
    sim_device_init(&dev, UINT64_C(1) << 40);
    bfc_backend b = sim_device_backend(&dev);
    bfc_options o;
    bfc_options_init(&o);
    o.limit_bytes = UINT64_C(1) << 24;
    o.granularity = plan.granularity;
    o.region_granularity = plan.granularity;
    bfc_pool *pool = bfc_pool_create(&o, &b);
    must(pool != NULL, "pool");
    bool valid = true;
    for (size_t i = 0; i < plan.n; i++) {
        const bfc_plan_entry *e = &plan.entries[i];
        if (e->size == 0 || e->size % plan.granularity || e->offset % plan.granularity ||
            e->size >= BFC_SIZE_LIMIT || e->offset >= BFC_SIZE_LIMIT - e->size)
            valid = false;
    }
    bfc_status st = bfc_pool_set_plan(pool, plan.entries, plan.n);
    if (valid)
        must(st == BFC_OK, "a valid plan refused");
    else
        must(st == BFC_ERR_INVALID, "an invalid plan not refused as invalid");
    size_t n = plan.n < 512 ? plan.n : 512;
    bfc_addr *addr = calloc(n ? n : 1, sizeof *addr);
    must(addr != NULL, "host memory");
    for (size_t i = 0; i < n; i++) {
        uint64_t want = plan.entries[i].size ? plan.entries[i].size : 1;
        bfc_status s = bfc_pool_alloc(pool, want, BFC_NO_LANE, &addr[i]);
        must(s == BFC_OK || s == BFC_ERR_OOM || s == BFC_ERR_TOO_LARGE, "alloc status");
        if (s != BFC_OK)
            addr[i] = 0;
        /* every other one freed at once, so that places come free */
        if (s == BFC_OK && (i & 1)) {
            must(bfc_pool_free(pool, addr[i]) == BFC_OK, "free status");
            addr[i] = 0;
        }
    }
    must(bfc_pool_check(pool, stderr) == 0, "invariant violated");
    bfc_pool_destroy(pool, true);
    free(addr);
    plan_file_free(&plan);
    return 0;
}
