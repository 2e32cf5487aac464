/*
 * tracegen.c - `bfcshim tracegen`: synthetic allocation traces in RMM CSV.
 *
 * They model what cudaMalloc sees from a framework without its own cache
 * (PyTorch with PYTORCH_NO_CUDA_MEMORY_CACHING=1): one allocation per tensor,
 * in program order. They are for tests and benchmarks when no GPU is at hand;
 * every file is named synthetic-... so that nobody mistakes one for a
 * captured trace.
 *
 * Models
 *   gpt     GPT-style decoder trained in mixed precision: fp32 master weights;
 *           per step bf16 weight casts, activations saved layer by layer,
 *           freed in reverse during backward, fresh fp32 gradients,
 *           AdamW with foreach temporaries, zero_grad(set_to_none). With
 *           --vary-seq the sequence length changes every step, as with
 *           unpadded batches, which is what fragments a pool.
 *   resnet  ResNet-style CNN: conv/bn activations whose sizes halve and
 *           channels double by stage, cuDNN workspaces allocated and freed
 *           around every convolution, SGD with momentum.
 *   churn   N long-lived blocks scattered through the pool, then short-lived
 *           traffic among them: the scaling benchmark (1e3 .. 1e6 live).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef BFCSHIM_HAVE_ZLIB
#include <zlib.h>
#endif

#include "cli.h"
#include "out_file.h"
#include "units.h"

typedef struct gen {
    FILE *out;
    uint64_t next_id; /* fake pointers: unique for the whole trace */
    uint64_t now_us;
    uint64_t rng;
    uint64_t events, live_bytes, peak_bytes;
} gen;

typedef uint64_t tensor; /* the fake pointer; 0 = none */

static uint64_t rnd(gen *g)
{
    uint64_t z = (g->rng += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static uint64_t rnd_below(gen *g, uint64_t n) { return n ? rnd(g) % n : 0; }

static void line(gen *g, const char *action, tensor p, uint64_t size)
{
    g->now_us += 1 + rnd_below(g, 20);
    uint64_t us = g->now_us % 1000000, s = g->now_us / 1000000;
    fprintf(g->out, "0,%02" PRIu64 ":%02" PRIu64 ":%02" PRIu64 ":%06" PRIu64 ",%s,0x%" PRIx64
                    ",%" PRIu64 ",0\n",
            s / 3600 % 24, s / 60 % 60, s % 60, us, action, p, size);
    g->events++;
}

/* Sizes are remembered by pointer so that frees can be logged with them. */
typedef struct sized {
    tensor p;
    uint64_t size;
} sized;

static sized alloc(gen *g, uint64_t size)
{
    if (size == 0)
        size = 1;
    tensor p = UINT64_C(0x7f0000000000) + (++g->next_id << 9);
    line(g, "allocate", p, size);
    g->live_bytes += size;
    if (g->live_bytes > g->peak_bytes)
        g->peak_bytes = g->live_bytes;
    return (sized){p, size};
}

static void release(gen *g, sized *t)
{
    if (!t->p)
        return;
    line(g, "free", t->p, t->size);
    g->live_bytes -= t->size;
    t->p = 0;
}

/* ---- gpt ----------------------------------------------------------------- */

typedef struct gpt_cfg {
    int layers, steps;
    uint64_t hidden, heads, seq, batch, vocab;
    bool vary_seq;
} gpt_cfg;

/* Parameter shapes of one block, in elements. */
enum { P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_PROJW, P_PROJB, P_LN2W, P_LN2B,
       P_FC1W, P_FC1B, P_FC2W, P_FC2B, P_PER_LAYER };

static uint64_t gpt_param_elems(const gpt_cfg *c, int k)
{
    uint64_t d = c->hidden;
    switch (k) {
    case P_QKVW: return 3 * d * d;
    case P_QKVB: return 3 * d;
    case P_PROJW: return d * d;
    case P_FC1W: return 4 * d * d;
    case P_FC1B: return 4 * d;
    case P_FC2W: return 4 * d * d;
    default: return d; /* layer norm weights and biases, proj and fc2 biases */
    }
}

/* Saved activations of one block (bf16), freed during its backward. */
enum { A_X, A_LN1, A_STATS1, A_QKV, A_ATTN, A_LSE, A_H, A_LN2, A_STATS2, A_FC1, A_GELU,
       A_CAST_QKV, A_CAST_PROJ, A_CAST_FC1, A_CAST_FC2, A_PER_LAYER };

static void gpt(gen *g, const gpt_cfg *c)
{
    const int L = c->layers;
    const uint64_t d = c->hidden, V = c->vocab;
    const int nparams = L * P_PER_LAYER + 3; /* + embedding, positions, final LN */
    sized *w = calloc((size_t)nparams, sizeof *w), *grad = calloc((size_t)nparams, sizeof *grad);
    sized *m = calloc((size_t)nparams, sizeof *m), *v = calloc((size_t)nparams, sizeof *v);
    sized *act = calloc((size_t)L * A_PER_LAYER, sizeof *act);
    uint64_t *elems = calloc((size_t)nparams, sizeof *elems);
    if (!w || !grad || !m || !v || !act || !elems) {
        fprintf(stderr, "bfcshim tracegen: out of host memory\n");
        exit(1);
    }
    for (int l = 0; l < L; l++)
        for (int k = 0; k < P_PER_LAYER; k++)
            elems[l * P_PER_LAYER + k] = gpt_param_elems(c, k);
    elems[L * P_PER_LAYER] = V * d;          /* token embedding (tied head) */
    elems[L * P_PER_LAYER + 1] = c->seq * d; /* positions */
    elems[L * P_PER_LAYER + 2] = 2 * d;      /* final layer norm */

    /* Model construction: fp32 master weights, then the cuBLAS workspace. */
    for (int i = 0; i < nparams; i++)
        w[i] = alloc(g, elems[i] * 4);
    sized workspace = alloc(g, 32u << 20);

    for (int step = 0; step < c->steps; step++) {
        uint64_t s = c->seq;
        if (c->vary_seq) /* multiples of 64 between a quarter and all of seq */
            s = (c->seq / 4 + rnd_below(g, c->seq - c->seq / 4 + 1)) / 64 * 64;
        if (s < 64)
            s = 64;
        const uint64_t T = c->batch * s;
        sized ids = alloc(g, T * 8), targets = alloc(g, T * 8);

        /* Forward. */
        sized x = alloc(g, T * d * 2); /* embedding + positions */
        for (int l = 0; l < L; l++) {
            sized *a = &act[l * A_PER_LAYER];
            const int p = l * P_PER_LAYER;
            a[A_X] = x;
            a[A_CAST_QKV] = alloc(g, elems[p + P_QKVW] * 2);
            a[A_LN1] = alloc(g, T * d * 2);
            a[A_STATS1] = alloc(g, T * 8);
            a[A_QKV] = alloc(g, T * 3 * d * 2);
            a[A_ATTN] = alloc(g, T * d * 2);
            a[A_LSE] = alloc(g, c->batch * c->heads * s * 4);
            a[A_CAST_PROJ] = alloc(g, elems[p + P_PROJW] * 2);
            sized proj = alloc(g, T * d * 2);
            a[A_H] = alloc(g, T * d * 2); /* h = x + attn: saved as ln2's input */
            release(g, &proj);
            a[A_LN2] = alloc(g, T * d * 2);
            a[A_STATS2] = alloc(g, T * 8);
            a[A_CAST_FC1] = alloc(g, elems[p + P_FC1W] * 2);
            a[A_FC1] = alloc(g, T * 4 * d * 2);
            a[A_GELU] = alloc(g, T * 4 * d * 2);
            a[A_CAST_FC2] = alloc(g, elems[p + P_FC2W] * 2);
            sized fc2 = alloc(g, T * d * 2);
            x = alloc(g, T * d * 2); /* h + mlp: the next block's input */
            release(g, &fc2);
        }
        sized lnf = alloc(g, T * d * 2);
        sized cast_emb = alloc(g, V * d * 2);
        sized logits = alloc(g, T * V * 2);
        sized logprobs = alloc(g, T * V * 4); /* cross entropy in fp32 */
        release(g, &logits);
        sized loss = alloc(g, 4);

        /* Backward. */
        sized dlogits = alloc(g, T * V * 2);
        release(g, &logprobs);
        sized dx = alloc(g, T * d * 2);
        sized demb16 = alloc(g, V * d * 2);
        int pe = L * P_PER_LAYER;
        if (!grad[pe].p)
            grad[pe] = alloc(g, elems[pe] * 4);
        release(g, &demb16);
        release(g, &dlogits);
        release(g, &cast_emb);
        release(g, &lnf);
        release(g, &x);
        for (int l = L - 1; l >= 0; l--) {
            sized *a = &act[l * A_PER_LAYER];
            const int p = l * P_PER_LAYER;
            /* MLP. */
            sized dgelu = alloc(g, T * 4 * d * 2);
            sized dw = alloc(g, elems[p + P_FC2W] * 2);
            if (!grad[p + P_FC2W].p)
                grad[p + P_FC2W] = alloc(g, elems[p + P_FC2W] * 4);
            release(g, &dw);
            if (!grad[p + P_FC2B].p)
                grad[p + P_FC2B] = alloc(g, elems[p + P_FC2B] * 4);
            release(g, &a[A_GELU]);
            release(g, &a[A_CAST_FC2]);
            sized dfc1 = alloc(g, T * 4 * d * 2);
            release(g, &dgelu);
            release(g, &a[A_FC1]);
            dw = alloc(g, elems[p + P_FC1W] * 2);
            if (!grad[p + P_FC1W].p)
                grad[p + P_FC1W] = alloc(g, elems[p + P_FC1W] * 4);
            release(g, &dw);
            if (!grad[p + P_FC1B].p)
                grad[p + P_FC1B] = alloc(g, elems[p + P_FC1B] * 4);
            sized dln2 = alloc(g, T * d * 2);
            release(g, &dfc1);
            release(g, &a[A_CAST_FC1]);
            sized dx2 = alloc(g, T * d * 2);
            for (int k = P_LN2W; k <= P_LN2B; k++)
                if (!grad[p + k].p)
                    grad[p + k] = alloc(g, elems[p + k] * 4);
            release(g, &dln2);
            release(g, &a[A_LN2]);
            release(g, &a[A_STATS2]);
            release(g, &a[A_H]);
            release(g, &dx);
            dx = dx2;
            /* Attention. */
            sized dattn = alloc(g, T * d * 2);
            dw = alloc(g, elems[p + P_PROJW] * 2);
            if (!grad[p + P_PROJW].p)
                grad[p + P_PROJW] = alloc(g, elems[p + P_PROJW] * 4);
            release(g, &dw);
            if (!grad[p + P_PROJB].p)
                grad[p + P_PROJB] = alloc(g, elems[p + P_PROJB] * 4);
            release(g, &a[A_CAST_PROJ]);
            sized dqkv = alloc(g, T * 3 * d * 2);
            release(g, &dattn);
            release(g, &a[A_ATTN]);
            release(g, &a[A_LSE]);
            release(g, &a[A_QKV]);
            dw = alloc(g, elems[p + P_QKVW] * 2);
            if (!grad[p + P_QKVW].p)
                grad[p + P_QKVW] = alloc(g, elems[p + P_QKVW] * 4);
            release(g, &dw);
            if (!grad[p + P_QKVB].p)
                grad[p + P_QKVB] = alloc(g, elems[p + P_QKVB] * 4);
            sized dln1 = alloc(g, T * d * 2);
            release(g, &dqkv);
            release(g, &a[A_CAST_QKV]);
            dx2 = alloc(g, T * d * 2);
            for (int k = P_LN1W; k <= P_LN1B; k++)
                if (!grad[p + k].p)
                    grad[p + k] = alloc(g, elems[p + k] * 4);
            release(g, &dln1);
            release(g, &a[A_LN1]);
            release(g, &a[A_STATS1]);
            release(g, &a[A_X]);
            release(g, &dx);
            dx = dx2;
        }
        for (int k = pe + 1; k < nparams; k++)
            if (!grad[k].p)
                grad[k] = alloc(g, elems[k] * 4);
        release(g, &dx);
        release(g, &loss);

        /* Gradient clipping: one norm per parameter, then the total. */
        sized *norms = calloc((size_t)nparams, sizeof *norms);
        for (int i = 0; norms && i < nparams; i++)
            norms[i] = alloc(g, 4);
        sized total = alloc(g, 4);
        for (int i = 0; norms && i < nparams; i++)
            release(g, &norms[i]);
        free(norms);
        release(g, &total);

        /* AdamW, foreach: state on the first step, then per-step temporaries
         * for every parameter at once (the denominators), freed together. */
        for (int i = 0; i < nparams; i++) {
            if (!m[i].p) {
                m[i] = alloc(g, elems[i] * 4);
                v[i] = alloc(g, elems[i] * 4);
            }
        }
        sized *tmp = calloc((size_t)nparams, sizeof *tmp);
        for (int i = 0; tmp && i < nparams; i++)
            tmp[i] = alloc(g, elems[i] * 4);
        for (int i = 0; tmp && i < nparams; i++)
            release(g, &tmp[i]);
        free(tmp);

        /* zero_grad(set_to_none=True); the batch goes. */
        for (int i = 0; i < nparams; i++)
            release(g, &grad[i]);
        release(g, &ids);
        release(g, &targets);
    }
    (void)workspace;
    free(w), free(grad), free(m), free(v), free(act), free(elems);
}

/* ---- resnet --------------------------------------------------------------- */

typedef struct cnn_cfg {
    int steps, blocks_per_stage;
    uint64_t batch, image;
} cnn_cfg;

typedef struct conv_act {
    sized in_bn, out_relu, cast_w;
} conv_act;

static void resnet(gen *g, const cnn_cfg *c)
{
    enum { STAGES = 4, CONVS_PER_BLOCK = 3 };
    const int nconv = STAGES * c->blocks_per_stage * CONVS_PER_BLOCK + 1;
    uint64_t *wel = calloc((size_t)nconv, sizeof *wel), *chan = calloc((size_t)nconv, sizeof *chan);
    uint64_t *hw = calloc((size_t)nconv, sizeof *hw);
    sized *w = calloc((size_t)nconv * 4, sizeof *w), *mom = calloc((size_t)nconv, sizeof *mom);
    sized *grad = calloc((size_t)nconv * 2, sizeof *grad);
    conv_act *act = calloc((size_t)nconv, sizeof *act);
    /* cuDNN workspace per layer and pass: the algorithm, hence the size, is
     * chosen once per shape and reused every step. */
    uint64_t *ws_fwd = calloc((size_t)nconv, sizeof *ws_fwd);
    uint64_t *ws_bwd = calloc((size_t)nconv, sizeof *ws_bwd);
    if (!wel || !chan || !hw || !w || !mom || !grad || !act || !ws_fwd || !ws_bwd) {
        fprintf(stderr, "bfcshim tracegen: out of host memory\n");
        exit(1);
    }
    /* Stem: 7x7, 64 channels at image/4. Stages: bottleneck blocks. */
    uint64_t side = c->image / 4, ch = 64;
    wel[0] = 3 * 64 * 7 * 7;
    chan[0] = 64;
    hw[0] = side * side;
    int k = 1;
    for (int st = 0; st < STAGES; st++) {
        uint64_t mid = ch;
        uint64_t out = ch * 4;
        for (int b = 0; b < c->blocks_per_stage; b++) {
            uint64_t in = (st == 0 && b == 0) ? 64 : out;
            wel[k] = in * mid, chan[k] = mid, hw[k] = side * side, k++;
            wel[k] = mid * mid * 9, chan[k] = mid, hw[k] = side * side, k++;
            wel[k] = mid * out, chan[k] = out, hw[k] = side * side, k++;
        }
        ch *= 2;
        if (side > 7)
            side /= 2;
    }
    for (int i = 0; i < nconv; i++) {
        ws_fwd[i] = (rnd_below(g, 64) + 1) << 20;
        ws_bwd[i] = (rnd_below(g, 96) + 1) << 20;
    }
    for (int i = 0; i < nconv; i++) {
        w[i * 4] = alloc(g, wel[i] * 4);             /* conv weight */
        w[i * 4 + 1] = alloc(g, chan[i] * 4);        /* bn weight */
        w[i * 4 + 2] = alloc(g, chan[i] * 4);        /* bn bias */
        w[i * 4 + 3] = alloc(g, chan[i] * 4 * 2);    /* running mean + var */
    }
    for (int step = 0; step < c->steps; step++) {
        sized images = alloc(g, c->batch * 3 * c->image * c->image * 2);
        sized labels = alloc(g, c->batch * 8);
        for (int i = 0; i < nconv; i++) {
            uint64_t n = c->batch * chan[i] * hw[i] * 2;
            act[i].cast_w = alloc(g, wel[i] * 2);
            sized ws = alloc(g, ws_fwd[i]);
            act[i].in_bn = alloc(g, n);
            release(g, &ws);
            act[i].out_relu = alloc(g, n);
            sized stats = alloc(g, chan[i] * 8);
            release(g, &stats);
        }
        sized pooled = alloc(g, c->batch * ch * 2);
        sized fc = alloc(g, c->batch * 1000 * 4);
        sized loss = alloc(g, 4);
        sized dfc = alloc(g, c->batch * 1000 * 4);
        release(g, &fc);
        sized dpool = alloc(g, c->batch * ch * 2);
        release(g, &dfc);
        release(g, &pooled);
        sized dx = alloc(g, act[nconv - 1].out_relu.size);
        release(g, &dpool);
        for (int i = nconv - 1; i >= 0; i--) {
            sized dbn = alloc(g, act[i].in_bn.size);
            release(g, &act[i].out_relu);
            sized ws = alloc(g, ws_bwd[i]);
            if (!grad[i * 2].p) {
                grad[i * 2] = alloc(g, wel[i] * 4);
                grad[i * 2 + 1] = alloc(g, chan[i] * 4 * 2);
            }
            sized dxin = alloc(g, i > 0 ? act[i - 1].out_relu.size : images.size);
            release(g, &ws);
            release(g, &dbn);
            release(g, &act[i].in_bn);
            release(g, &act[i].cast_w);
            release(g, &dx);
            dx = dxin;
        }
        release(g, &dx);
        release(g, &loss);
        for (int i = 0; i < nconv; i++) /* SGD momentum buffers, then step */
            if (!mom[i].p)
                mom[i] = alloc(g, wel[i] * 4);
        for (int i = 0; i < nconv * 2; i++)
            release(g, &grad[i]);
        release(g, &images);
        release(g, &labels);
    }
    free(wel), free(chan), free(hw), free(w), free(mom), free(grad), free(act);
    free(ws_fwd), free(ws_bwd);
}

/* ---- churn ---------------------------------------------------------------- */

static void churn(gen *g, uint64_t live, uint64_t ops)
{
    /* Interleave keepers with fillers, then free the fillers: the keepers end
     * up scattered, with holes of mixed sizes between them. */
    sized *keep = calloc(live, sizeof *keep), *fill = calloc(live, sizeof *fill);
    enum { WINDOW = 256 };
    sized recent[WINDOW] = {{0, 0}};
    if (!keep || !fill) {
        fprintf(stderr, "bfcshim tracegen: out of host memory\n");
        exit(1);
    }
    for (uint64_t i = 0; i < live; i++) {
        keep[i] = alloc(g, (rnd_below(g, 32) + 1) * 512);
        fill[i] = alloc(g, (rnd_below(g, 32) + 1) * 512);
    }
    for (uint64_t i = 0; i < live; i++)
        release(g, &fill[i]);
    /* Short-lived traffic: a sliding window of recent blocks, mostly small.
     * `ops` counts these operations alone (half allocations, half frees). */
    for (uint64_t i = 0; i < ops / 2; i++) {
        sized *slot = &recent[rnd_below(g, WINDOW)];
        release(g, slot);
        uint64_t size = rnd_below(g, 16) == 0 ? (rnd_below(g, 64) + 1) << 16
                                               : (rnd_below(g, 32) + 1) * 512;
        *slot = alloc(g, size);
    }
    free(keep), free(fill);
}

/* ---- command -------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bfcshim tracegen [--model gpt|resnet|churn] [-o FILE] [--seed N]\n"
            "         gpt:    [--layers L] [--hidden D] [--heads H] [--seq S] [--batch B]\n"
            "                 [--vocab V] [--steps N] [--vary-seq]\n"
            "         resnet: [--blocks B] [--image PX] [--batch B] [--steps N]\n"
            "         churn:  [--live N] [--ops N]  (N long-lived blocks, then N ops of\n"
            "                 short-lived traffic among them)\n"
            "Writes a synthetic allocation trace (RMM CSV) named synthetic-...csv unless\n"
            "-o says otherwise, and prints its name, events and peak live bytes.\n");
}

/* The output stream: a plain file, or gzip for a name ending in .gz (what
 * the name promises, and what replay reads back). */
#ifdef BFCSHIM_HAVE_ZLIB
static ssize_t gz_write(void *cookie, const char *buf, size_t n)
{
    return n == 0 ? 0 : gzwrite((gzFile)cookie, buf, (unsigned)n) > 0 ? (ssize_t)n : -1;
}

static int gz_close(void *cookie) { return gzclose((gzFile)cookie) == Z_OK ? 0 : -1; }
#endif

static FILE *open_output(const char *path)
{
    size_t n = strlen(path);
    bool gz = n > 3 && strcmp(path + n - 3, ".gz") == 0;
    FILE *f = NULL;
    /* Not through a link planted at the name (out_file.h). */
    if (!gz) {
        f = out_file_fopen(path, "w");
    } else {
#ifdef BFCSHIM_HAVE_ZLIB
        int fd = out_file_open(path, O_TRUNC);
        gzFile z = fd >= 0 ? gzdopen(fd, "wb") : NULL;
        if (fd >= 0 && !z)
            close(fd);
        f = z ? fopencookie(z, "w", (cookie_io_functions_t){.write = gz_write,
                                                              .close = gz_close})
              : NULL;
        if (z && !f)
            gzclose(z);
#else
        fprintf(stderr, "bfcshim tracegen: %s: this build has no zlib, so it cannot write "
                        "gzip; name the file without .gz\n", path);
        return NULL;
#endif
    }
    if (!f)
        cli_cannot_write("tracegen", path, errno ? errno : ENOMEM);
    return f;
}

int cmd_tracegen(int argc, char **argv)
{
    const char *model = "gpt", *out_path = NULL;
    gpt_cfg gc = {.layers = 12, .steps = 3, .hidden = 768, .heads = 12, .seq = 1024,
                  .batch = 8, .vocab = 50304, .vary_seq = false};
    cnn_cfg cc = {.steps = 3, .blocks_per_stage = 3, .batch = 64, .image = 224};
    uint64_t seed = 1, live = 10000, ops = 1000000;
    enum { O_LAYERS = 256, O_HIDDEN, O_HEADS, O_SEQ, O_BATCH, O_VOCAB, O_STEPS, O_VARY,
           O_BLOCKS, O_IMAGE, O_LIVE, O_OPS, O_SEED, O_MODEL };
    static const struct option longopts[] = {
        {"model", required_argument, 0, O_MODEL}, {"layers", required_argument, 0, O_LAYERS},
        {"hidden", required_argument, 0, O_HIDDEN}, {"heads", required_argument, 0, O_HEADS},
        {"seq", required_argument, 0, O_SEQ},     {"batch", required_argument, 0, O_BATCH},
        {"vocab", required_argument, 0, O_VOCAB}, {"steps", required_argument, 0, O_STEPS},
        {"vary-seq", no_argument, 0, O_VARY},     {"blocks", required_argument, 0, O_BLOCKS},
        {"image", required_argument, 0, O_IMAGE}, {"live", required_argument, 0, O_LIVE},
        {"ops", required_argument, 0, O_OPS},     {"seed", required_argument, 0, O_SEED},
        {"help", no_argument, 0, 'h'},            {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0; /* cli_bad_option says it in one line */
    while ((c = getopt_long(argc, argv, ":o:h", longopts, NULL)) != -1) {
        long long n = 0;
        if (c >= O_LAYERS && c <= O_SEED && c != O_VARY) {
            char *end;
            n = strtoll(optarg, &end, 10);
            if (*end || n < 1)
                return cli_bad_value("tracegen", cli_option_name(longopts, c), optarg,
                                     "a positive whole number");
        }
        switch (c) {
        case O_MODEL: model = optarg; break;
        case 'o': out_path = optarg; break;
        case O_LAYERS: gc.layers = (int)n; break;
        case O_HIDDEN: gc.hidden = (uint64_t)n; break;
        case O_HEADS: gc.heads = (uint64_t)n; break;
        case O_SEQ: gc.seq = (uint64_t)n; break;
        case O_BATCH: gc.batch = cc.batch = (uint64_t)n; break;
        case O_VOCAB: gc.vocab = (uint64_t)n; break;
        case O_STEPS: gc.steps = cc.steps = (int)n; break;
        case O_VARY: gc.vary_seq = true; break;
        case O_BLOCKS: cc.blocks_per_stage = (int)n; break;
        case O_IMAGE: cc.image = (uint64_t)n; break;
        case O_LIVE: live = (uint64_t)n; break;
        case O_OPS: ops = (uint64_t)n; break;
        case O_SEED: seed = (uint64_t)n; break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("tracegen", argv, c);
        }
    }
    char name[256];
    if (strcmp(model, "gpt") == 0)
        snprintf(name, sizeof name, "synthetic-gpt-L%d-d%" PRIu64 "-b%" PRIu64 "-s%" PRIu64
                 "%s-steps%d-seed%" PRIu64 ".csv", gc.layers, gc.hidden, gc.batch, gc.seq,
                 gc.vary_seq ? "var" : "", gc.steps, seed);
    else if (strcmp(model, "resnet") == 0)
        snprintf(name, sizeof name, "synthetic-resnet-blocks%d-b%" PRIu64 "-px%" PRIu64
                 "-steps%d-seed%" PRIu64 ".csv", cc.blocks_per_stage, cc.batch, cc.image,
                 cc.steps, seed);
    else if (strcmp(model, "churn") == 0)
        snprintf(name, sizeof name, "synthetic-churn-live%" PRIu64 "-ops%" PRIu64
                 "-seed%" PRIu64 ".csv", live, ops, seed);
    else
        return cli_bad_value("tracegen", "--model", model, "gpt, resnet or churn");
    if (!out_path)
        out_path = name;
    gen g = {.rng = seed};
    g.out = open_output(out_path);
    if (!g.out)
        return 1;
    fputs("Thread,Time,Action,Pointer,Size,Stream\n", g.out);
    if (strcmp(model, "gpt") == 0)
        gpt(&g, &gc);
    else if (strcmp(model, "resnet") == 0)
        resnet(&g, &cc);
    else
        churn(&g, live, ops);
    if (fclose(g.out) != 0) {
        fprintf(stderr, "bfcshim tracegen: %s: %s\n", out_path, strerror(errno));
        return 1;
    }
    char peak[32];
    printf("%s: %" PRIu64 " events, peak live %s (synthetic %s trace)\n", out_path, g.events,
           format_size(g.peak_bytes, peak, sizeof peak), model);
    return 0;
}
