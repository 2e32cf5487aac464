/*
 * preallocation_hint.c - what the shim says when a framework's own
 * preallocation meets the pool's.
 *
 * TensorFlow's BFC takes (free memory - 225 MiB) in one cuMemAlloc at its
 * first tensor, XLA's default BFC 75% of the device in one cuMemCreate.
 * Under the shim either becomes one request for most of the pool's limit:
 * served (or refused) as any other, but the framework then suballocates
 * inside it, the memory serves no one else in the process, and the pool's
 * statistics see one block. The settings that leave allocation to the pool
 * are said twice:
 *
 * - when the request comes (before it is served: a refused preallocation
 *   wants the hint most), once per kind: a cuMemCreate over half the limit
 *   is all but surely XLA's (no other client makes one that large), so it
 *   is a warning; an allocation from the pool over half the limit may just
 *   as well be a program's one large buffer, so it is said at info level;
 * - in the out-of-memory report, where it matters: the refused request
 *   itself, a live block, or the loans, over half the limit.
 */
#include <stdio.h>

#include "shim.h"
#include "units.h"

static const char tensorflow_settings[] =
    "TensorFlow: TF_FORCE_GPU_ALLOW_GROWTH=true, or TF_GPU_ALLOCATOR=cuda_malloc_async to "
    "allocate from the shim's pool tensor by tensor";
static const char jax_settings[] =
    "JAX: XLA_PYTHON_CLIENT_PREALLOCATE=false, or XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async to "
    "allocate from the shim's pool directly";

void preallocation_hint(const shim_pool *sp, size_t size, const char *api, bool vmm)
{
    static atomic_bool said[2]; /* once per kind: TensorFlow's [0], XLA's [1] */
    if (size <= sp->limit / 2 || atomic_load_explicit(&said[vmm], memory_order_relaxed) ||
        atomic_exchange(&said[vmm], true))
        return;
    char a[32], b[32];
    shim_log(vmm ? LOG_WARN : LOG_INFO,
             "%s of %s on device %d takes more than half the pool's limit (%s): %s a "
             "framework preallocating its own pool inside the shim's (%s); logged once",
             api, format_size(size, a, sizeof a), (int)sp->dev,
             format_size(sp->limit, b, sizeof b), vmm ? "most likely" : "if it is",
             vmm ? jax_settings : tensorflow_settings);
}

void preallocation_report_hint(FILE *f, const bfc_stats *st, const bfc_live_info *largest,
                               size_t request, bool vmm)
{
    char a[32];
    if (request > st->bytes_limit / 2)
        fprintf(f, "hint: the request (%s) is more than half the limit: if it is a framework "
                   "preallocating its own pool, let the shim's pool serve the framework (%s).\n",
                format_size(request, a, sizeof a), vmm ? jax_settings : tensorflow_settings);
    if (largest && largest->size > st->bytes_limit / 2)
        fprintf(f, "hint: allocation #%llu (%s) holds more than half the limit: if it is a "
                   "framework's own pool inside the shim's, let the shim's pool serve the "
                   "framework (%s).\n",
                (unsigned long long)largest->seq, format_size(largest->size, a, sizeof a),
                tensorflow_settings);
    if (st->bytes_lent > st->bytes_limit / 2)
        fprintf(f, "hint: %s of the limit is lent to the program's own cuMemCreate memory: a "
                   "framework's own pool (%s).\n",
                format_size(st->bytes_lent, a, sizeof a), jax_settings);
}
