/*
 * Tensor-parallel layers: the Megatron split of a Llama decoder layer (column-parallel
 * Q/K/V and gate/up, row-parallel o_proj and down, one all-reduce per block) in f32. The
 * split itself is described in include/ganglion/parallel.h; tp-shard.c cuts the shards on
 * the host, packs them into their weight storage and moves them into a kernels handle's
 * tensor memory on request; this file chains kernels and all-reduces. Everything a forward call
 * touches is tensor memory of the handle it is given and every computation is a kernel call, so the
 * same code runs on the "cpu" backend (host pointers) and on "cuda" (device pointers); the
 * all-reduces go through the staging helpers (tp-stage.c) when the communicator only carries host
 * buffers.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/parallel.h"

/* ---------------------------------------------------------------------------------
 * Linear layers
 * --------------------------------------------------------------------------------- */
int gang_tp_linear_column(gang_kernels *k, const float *x, size_t tokens, size_t in,
                          const float *w_shard, size_t out_shard, float *y)
{
    /* Hugging Face weights are [out, in], so the product uses W transposed. */
    return gang_kernels_gemm(k, 1, tokens, out_shard, in, 1.0f, x, w_shard, 0.0f, y);
}

/* The storage of matrix w of l: l->wtype, or its own type in a mixed layer. */
static gang_kernels_wtype tp_wtype(const gang_tp_layer *l, const void *w)
{
    const void *const mats[7] = {l->wq, l->wk, l->wv, l->wo, l->w_gate, l->w_up, l->w_down};

    for (int i = 0; l->mixed && i < 7; i++)
        if (w == mats[i])
            return l->mtype[i];
    return l->wtype;
}

/* y[i] [tokens, out[i]] = x . W_i^T for count matrices of l read from the same x, in one
 * call (gang_kernels_matmul_n: the host backend shares x's preparation and its threads). */
static int tp_matmul_n(gang_kernels *k, const gang_tp_layer *l, const float *x, size_t tokens,
                       size_t in, size_t count, const void *const *w, const size_t *out,
                       float *const *y)
{
    gang_kernels_weight v[GANG_KERNELS_MATMUL_N_MAX];

    for (size_t i = 0; i < count; i++)
        v[i] = gang_kernels_weight_view(tp_wtype(l, w[i]), w[i], out[i], in);
    return gang_kernels_matmul_n(k, tokens, in, x, count, v, out, y);
}

/* The row-parallel input of tp_linear_row_staged: x itself (glu < 0), or the gated unit
 * (glu 0: SiLU, 1: GELU-tanh) of x's [gate | up] rows, computed by the product's kernel as
 * it reads x where it can (gang_kernels_matmul_glu), else into glu_out first. */
typedef struct tp_row_in {
    const float *x;
    int glu;
    float *glu_out;
} tp_row_in;

/*
 * Row-parallel linear: y [tokens, out] = the product of in over the TP group's shards, the
 * all-reduce staged through st (comm NULL: a single rank). With resid (the residual stream
 * [tokens, out] the product is to be added to), where the backend adds in the product's
 * launch (gang_kernels_matmul_fused): TP rank 0 adds its partial product to resid, the
 * other ranks write theirs over it, and the all-reduce of resid sums them, so resid ends
 * as resid + the full product with no add of its own; *added says so, y is not written.
 * One rank: resid + its product, the numbers of the add. Otherwise (*added 0) y as
 * without resid.
 */
static int tp_linear_row_staged(gang_kernels *k, gang_comm *comm, gang_tp_stage *st,
                                const gang_tp_layer *l, tp_row_in in, size_t tokens,
                                size_t in_shard, const void *w_shard, size_t out, float *y,
                                float *resid, int *added, uint64_t timeout_ms)
{
    gang_kernels_weight v = gang_kernels_weight_view(tp_wtype(l, w_shard), w_shard, out, in_shard);
    int rc = GANG_ENOSYS;

    *added = 0;
    if (resid != NULL) {
        const gang_kernels_fusion f = {
            .glu_in = in.glu, .glu_out = -1, .accumulate = l->shard.tp_rank == 0};

        rc = gang_kernels_matmul_fused(k, tokens, out, in_shard, in.x, &v, &f,
                                       in.glu >= 0 ? in.glu_out : NULL, resid);
        if (rc == 0) {
            *added = 1;
            y = resid;
        }
    }
    if (rc == GANG_ENOSYS)
        rc = in.glu < 0 ? gang_kernels_matmul(k, tokens, out, in_shard, in.x, &v, y)
                        : gang_kernels_matmul_glu(k, in.glu, tokens, out, in_shard, in.x, &v,
                                                  in.glu_out, y);
    if (rc != 0)
        return rc;
    /*
     * Each rank now holds the contribution of its input features only; the sum over the
     * TP group is the full product. A single rank has nothing to add.
     */
    if (comm == NULL)
        return 0;
    return gang_tp_stage_all_reduce(k, comm, st, y, tokens * out, GANG_DTYPE_F32, timeout_ms);
}

/*
 * The input of a projection from the residual stream: x itself (norm NULL), or its
 * RMSNorm with the weights norm, not yet computed: a backend with
 * gang_kernels_matmul_fused norms it in the product's launch; otherwise tp_in_ready
 * writes it into the scratch's normed first.
 */
typedef struct tp_in {
    const float *x;
    const float *norm;
} tp_in;

/* in normed into s->normed where it is still to be (*in then s->normed itself). */
static int tp_in_ready(gang_kernels *k, const gang_tp_layer *l, gang_tp_scratch *s, tp_in *in,
                       size_t total)
{
    int rc;

    if (in->norm == NULL)
        return 0;
    rc = gang_kernels_rmsnorm(k, in->x, in->norm, l->norm_eps, total, l->hidden, s->normed);
    if (rc == 0)
        *in = (tp_in){.x = s->normed};
    return rc;
}

/* y [total, out] = in . W^T for a matrix of l reading the residual stream (kdim hidden), in's
 * norm in the product's launch where the backend has it, else first (tp_in_ready). */
static int tp_matmul_in(gang_kernels *k, const gang_tp_layer *l, gang_tp_scratch *s, tp_in in,
                        size_t total, const void *w, size_t out, float *y)
{
    gang_kernels_weight v = gang_kernels_weight_view(tp_wtype(l, w), w, out, l->hidden);
    int rc;

    if (in.norm != NULL) {
        const gang_kernels_fusion f = {
            .norm = in.norm, .eps = l->norm_eps, .glu_in = -1, .glu_out = -1};

        rc = gang_kernels_matmul_fused(k, total, out, l->hidden, in.x, &v, &f, s->normed, y);
        if (rc != GANG_ENOSYS || (rc = tp_in_ready(k, l, s, &in, total)) != 0)
            return rc;
    }
    return gang_kernels_matmul(k, total, out, l->hidden, in.x, &v, y);
}

/* ---------------------------------------------------------------------------------
 * Batched ragged forward (serving)
 *
 * A serving step carries several sequences at once, each at its own positions and with
 * its own KV cache: decodes of one token next to prefill chunks of many. Everything that
 * is per token (the norms, the five projections, the SwiGLU gate, the residual adds)
 * does not care which sequence a token belongs to, so it runs once on the concatenation
 * of all tokens: one GEMM per weight, which is where the time goes, and one all-reduce
 * per block instead of one per block and sequence. Only two things are per sequence:
 * where its keys and values go (rows pos0 .. pos0 + n - 1 of its own cache) and the
 * attention itself, which reads that cache. RoPE takes a position per token, so the
 * positions array carries each sequence's own range.
 *
 * This is the only whole-layer forward: one sequence is a batch of one. The numerics of
 * a sequence do not depend on the others in the batch up to the GEMM library's blocking
 * (a row of a product does not depend on the other rows in exact arithmetic); the tests
 * check within 1e-5 relative.
 * --------------------------------------------------------------------------------- */

/*
 * A communicator must match the layer: NULL only when the layer was cut for one rank,
 * otherwise of size tp with this rank at the shard's tp rank. A mismatch would reduce
 * the wrong partial sums together, so it is refused rather than computed.
 */
static int tp_check_comm(const gang_tp_layer *l, gang_comm *comm)
{
    if (comm == NULL)
        return l->tp == 1 ? 0 : GANG_EINVAL;
    if (gang_comm_size(comm) != l->tp || gang_comm_rank(comm) != l->shard.tp_rank)
        return GANG_EINVAL;
    return 0;
}

/*
 * The layer's arrays must be tensor memory of k: device arrays of this very handle for a
 * device k, host arrays for a host one (any "cpu" handle reads host memory).
 */
static int tp_check_mem(const gang_tp_layer *l, gang_kernels *k)
{
    if ((gang_kernels_caps(k) & GANG_KERNELS_CAP_DEVICE_MEM))
        return l->mem == k ? 0 : GANG_EINVAL;
    return l->mem == NULL ? 0 : GANG_EINVAL;
}

/*
 * Adds the layer's q/k/v biases (those it has) to the projections of `tokens` tokens:
 * q [tokens, q_cols], kk and v [tokens, kv_cols]. Biases act before RoPE, as in Hugging
 * Face's Qwen2 attention, where the rotation applies to the biased projections.
 */
static int tp_add_biases(const gang_tp_layer *l, gang_kernels *k, float *q, float *kk, float *v,
                         size_t tokens)
{
    size_t q_cols = (size_t)l->shard.head_count * l->head_dim;
    size_t kv_cols = (size_t)l->shard.kv_head_count * l->head_dim;
    int rc = 0;

    if (l->bq != NULL)
        rc = gang_kernels_add_rows(k, q, l->bq, tokens, q_cols);
    if (rc == 0 && l->bk != NULL)
        rc = gang_kernels_add_rows(k, kk, l->bk, tokens, kv_cols);
    if (rc == 0 && l->bv != NULL)
        rc = gang_kernels_add_rows(k, v, l->bv, tokens, kv_cols);
    return rc;
}

void gang_tp_scratch_free(gang_tp_scratch *s)
{
    if (s == NULL)
        return;
    if (s->mem != NULL) {
        gang_kernels_free(s->mem, s->normed);
        gang_kernels_free(s->mem, s->positions);
        gang_kernels_free(s->mem, s->rope_tabs);
    } else {
        free(s->normed);
        free(s->positions);
        free(s->rope_tabs);
    }
    free(s->pos_host);
    free(s->tab_host);
    free(s->stage.host);
    free(s->attn_seqs);
    free(s->attn_pages);
    memset(s, 0, sizeof(*s));
}

/* The per-sequence RoPE tables of dynamic NTK: n floats of tensor memory and 2n of host. */
static int tp_scratch_tables(gang_tp_scratch *s, size_t n, gang_kernels *k)
{
    int rc = 0;

    if (k != NULL)
        rc = gang_kernels_alloc(k, (n > 0 ? n : 1) * sizeof(float), (void **)&s->rope_tabs);
    else
        s->rope_tabs = malloc((n > 0 ? n : 1) * sizeof(float));
    s->tab_host = malloc((2 * n > 0 ? 2 * n : 1) * sizeof(float));
    return rc != 0 ? rc : s->rope_tabs == NULL || s->tab_host == NULL ? GANG_ENOMEM : 0;
}

int gang_tp_scratch_init(gang_tp_scratch *s, const gang_tp_layer *l, size_t max_tokens)
{
    return gang_tp_scratch_init_on(s, l, max_tokens, NULL);
}

int gang_tp_scratch_init_on(gang_tp_scratch *s, const gang_tp_layer *l, size_t max_tokens,
                            gang_kernels *k)
{
    size_t per_token, total;
    int rc = 0;

    if (s == NULL)
        return GANG_EINVAL;
    memset(s, 0, sizeof(*s));
    if (l == NULL || max_tokens == 0)
        return GANG_EINVAL;
    s->hidden = l->hidden;
    s->q_cols = (size_t)l->shard.head_count * l->head_dim;
    s->kv_cols = (size_t)l->shard.kv_head_count * l->head_dim;
    s->ffn_cols = l->shard.ffn_count;
    /* A device layer's concatenated GEMMs (wqkv, wgu) write here before the split. */
    if (gang_kernels_caps(k) & GANG_KERNELS_CAP_DEVICE_MEM)
        s->fused_cols = s->q_cols + 2 * s->kv_cols > 2 * s->ffn_cols ? s->q_cols + 2 * s->kv_cols
                                                                     : 2 * s->ffn_cols;
    per_token = 2 * s->hidden + s->q_cols + 2 * s->kv_cols + 2 * s->ffn_cols + s->fused_cols;
    if (per_token == 0 || max_tokens > SIZE_MAX / sizeof(float) / per_token) {
        memset(s, 0, sizeof(*s));
        return GANG_EINVAL;
    }
    total = per_token * max_tokens;
    /* One block for every float array, carved in the order of the struct. */
    if (k != NULL) {
        s->mem = k;
        rc = gang_kernels_alloc(k, total * sizeof(float), (void **)&s->normed);
        if (rc == 0)
            rc = gang_kernels_alloc(k, 2 * max_tokens * sizeof(int32_t), (void **)&s->positions);
    } else {
        s->normed = malloc(total * sizeof(float));
        s->positions = malloc(2 * max_tokens * sizeof(int32_t));
        rc = s->normed == NULL || s->positions == NULL ? GANG_ENOMEM : 0;
    }
    if (rc == 0) {
        s->pos_host = malloc(4 * max_tokens * sizeof(int32_t));
        rc = s->pos_host == NULL ? GANG_ENOMEM : 0;
    }
    if (rc == 0 && l->rope_dyn_factor > 0.0f)
        rc = tp_scratch_tables(s, l->head_dim / 2 * max_tokens, k);
    /* The all-reduces of a device handle over a host communicator stage through here. */
    if (rc == 0 && (gang_kernels_caps(k) & GANG_KERNELS_CAP_DEVICE_MEM)) {
        s->stage.bytes = max_tokens * s->hidden * sizeof(float);
        s->stage.host = malloc(s->stage.bytes);
        rc = s->stage.host == NULL ? GANG_ENOMEM : 0;
    }
    if (rc != 0) {
        gang_tp_scratch_free(s);
        return rc;
    }
    s->max_tokens = max_tokens;
    s->delta = s->normed + max_tokens * s->hidden;
    s->q = s->delta + max_tokens * s->hidden;
    s->k = s->q + max_tokens * s->q_cols;
    s->v = s->k + max_tokens * s->kv_cols;
    s->gate = s->v + max_tokens * s->kv_cols;
    s->up = s->gate + max_tokens * s->ffn_cols;
    s->fused = s->fused_cols > 0 ? s->up + max_tokens * s->ffn_cols : NULL;
    return 0;
}

/*
 * Validates the ragged batch against the layer, the scratch and the caches, and fills
 * s->pos_host with the call's positions [total], then each token's table offset [total]
 * (0 without a table_base). Returns 0 and the token count in *total, or GANG_EINVAL.
 */
static int tp_batch_check(const gang_tp_layer *l, gang_tp_scratch *s, uint32_t n_seq,
                          const uint32_t *seq_tokens, const uint32_t *seq_pos0,
                          gang_tp_kv_cache *const *caches, size_t *total)
{
    size_t n = 0, i, t;

    if (s->normed == NULL || s->pos_host == NULL || s->hidden != l->hidden ||
        s->q_cols != (size_t)l->shard.head_count * l->head_dim ||
        s->kv_cols != (size_t)l->shard.kv_head_count * l->head_dim ||
        s->ffn_cols != l->shard.ffn_count)
        return GANG_EINVAL;
    for (i = 0; i < n_seq; i++) {
        const gang_tp_kv_cache *c = caches[i];
        size_t len = seq_tokens[i], pos0 = seq_pos0[i];

        if (c == NULL || c->k == NULL || c->v == NULL || len == 0)
            return GANG_EINVAL;
        if (pos0 > c->cap || len > c->cap - pos0 || pos0 + len > (size_t)INT32_MAX)
            return GANG_EINVAL;
        if (c->table != NULL) {
            /* The blocks this call writes must lie in the pool. */
            if (c->table_host == NULL || c->block_size == 0 || c->n_blocks == 0 ||
                (c->dtype != GANG_DTYPE_F32 && c->dtype != GANG_DTYPE_BF16 &&
                 c->dtype != GANG_DTYPE_F16))
                return GANG_EINVAL;
            for (t = pos0 / c->block_size; t <= (pos0 + len - 1) / c->block_size; t++)
                if (c->table_host[t] < 0 || (size_t)c->table_host[t] >= c->n_blocks)
                    return GANG_EINVAL;
        }
        if (len > s->max_tokens - n || c->table_off > (size_t)INT32_MAX)
            return GANG_EINVAL;
        for (t = 0; t < len; t++) {
            s->pos_host[n + t] = (int32_t)(pos0 + t);
            s->pos_host[s->max_tokens + n + t] = c->table_base != NULL ? (int32_t)c->table_off : 0;
        }
        n += len;
    }
    memmove(s->pos_host + n, s->pos_host + s->max_tokens, n * sizeof(int32_t));
    *total = n;
    return 0;
}

/*
 * Brings the positions and table offsets of the call (s->pos_host[0 .. 2 total)) into
 * tensor memory, without a host wait (gang_kernels_upload_async). Every layer of a step
 * passes the same ones, so the upload is skipped when the tensor copy already holds
 * them: one upload per step, not per layer.
 */
static int tp_batch_positions(gang_kernels *k, gang_tp_scratch *s, size_t total)
{
    int32_t *held = s->pos_host + 2 * s->max_tokens;
    int rc;

    if (s->pos_valid == 2 * total && memcmp(held, s->pos_host, 2 * total * sizeof(int32_t)) == 0)
        return 0;
    s->pos_valid = 0;
    rc = gang_kernels_upload_async(k, s->positions, s->pos_host, 2 * total * sizeof(int32_t));
    if (rc != 0)
        return rc;
    memcpy(held, s->pos_host, 2 * total * sizeof(int32_t));
    s->pos_valid = 2 * total;
    return 0;
}

int gang_tp_scratch_prepare(gang_tp_scratch *s, const gang_tp_layer *l, gang_kernels *k,
                            uint32_t n_seq, const uint32_t *seq_tokens, const uint32_t *seq_pos0,
                            gang_tp_kv_cache *const *caches)
{
    size_t total;
    int rc;

    if (s == NULL || l == NULL || k == NULL || seq_tokens == NULL || seq_pos0 == NULL ||
        caches == NULL || n_seq == 0)
        return GANG_EINVAL;
    rc = tp_batch_check(l, s, n_seq, seq_tokens, seq_pos0, caches, &total);
    return rc != 0 ? rc : tp_batch_positions(k, s, total);
}

/*
 * Dynamic NTK (transformers' "dynamic" rope_type): a sequence whose last position in this
 * call is p is rotated, for all its tokens of the call, with the plain frequencies of the
 * base theta x (factor x L / orig - (factor - 1))^(d / (d - 2)), L = max(p + 1, orig):
 * what transformers does for one sequence fed in the same chunks (the keys already
 * cached keep the rotation of their own call). Fills s->rope_tabs with one table per
 * sequence, uploaded only when they changed (once per step, not per layer).
 */
static int tp_rope_tables(const gang_tp_layer *l, gang_kernels *k, gang_tp_scratch *s,
                          uint32_t n_seq, const uint32_t *seq_tokens, const uint32_t *seq_pos0)
{
    size_t half = l->head_dim / 2, n = (size_t)n_seq * half, i, j;
    double d = (double)l->head_dim, f = (double)l->rope_dyn_factor, orig = l->rope_dyn_orig;
    float *held = s->tab_host + half * s->max_tokens;
    int rc;

    if (s->rope_tabs == NULL || s->tab_host == NULL || n_seq > s->max_tokens)
        return GANG_EINVAL;
    for (i = 0; i < n_seq; i++) {
        double len = (double)seq_pos0[i] + (double)seq_tokens[i];
        double base = (double)l->rope_theta *
                      pow(f * (len > orig ? len : orig) / orig - (f - 1.0), d / (d - 2.0));

        for (j = 0; j < half; j++)
            s->tab_host[i * half + j] = (float)(1.0 / pow(base, (double)(2 * j) / d));
    }
    if (s->tab_valid == n && memcmp(held, s->tab_host, n * sizeof(float)) == 0)
        return 0;
    s->tab_valid = 0;
    rc = gang_kernels_upload(k, s->rope_tabs, s->tab_host, n * sizeof(float));
    if (rc != 0)
        return rc;
    memcpy(held, s->tab_host, n * sizeof(float));
    s->tab_valid = n;
    return 0;
}

/*
 * RoPE of the call's q [total, q_cols] and k (kp) [total, kv_cols]: the layer's table for
 * every token at once, or with dynamic NTK each sequence's own table.
 */
static int tp_batch_rope(const gang_tp_layer *l, gang_kernels *k, gang_tp_scratch *s,
                         uint32_t n_seq, const uint32_t *seq_tokens, float *kp, size_t total)
{
    size_t hd = l->head_dim, off = 0, i;
    int rc = 0;

    if (l->rope_dyn_factor <= 0.0f) {
        rc = gang_kernels_rope(k, s->q, s->positions, total, l->shard.head_count, hd, l->rope_freq,
                               l->rope_scale);
        return rc != 0 ? rc
                       : gang_kernels_rope(k, kp, s->positions, total, l->shard.kv_head_count, hd,
                                           l->rope_freq, l->rope_scale);
    }
    for (i = 0; i < n_seq && rc == 0; off += seq_tokens[i], i++) {
        const float *tab = s->rope_tabs + i * (hd / 2);

        rc = gang_kernels_rope(k, s->q + off * s->q_cols, s->positions + off, seq_tokens[i],
                               l->shard.head_count, hd, tab, l->rope_scale);
        if (rc == 0)
            rc = gang_kernels_rope(k, kp + off * s->kv_cols, s->positions + off, seq_tokens[i],
                                   l->shard.kv_head_count, hd, tab, l->rope_scale);
    }
    return rc;
}

/*
 * Copies the rows of one sequence's tokens (scratch rows off .. off + len - 1, positions
 * pos0 ..) into its paged cache c: one copy of K and one of V per block touched.
 */
static int tp_paged_write(gang_kernels *k, const gang_tp_kv_cache *c, const gang_tp_scratch *s,
                          size_t off, size_t pos0, size_t len)
{
    size_t bs = c->block_size, w = s->kv_cols, done = 0, es = gang_dtype_size(c->dtype);
    char *kb = (char *)c->k, *vb = (char *)c->v;
    int rc = 0;

    while (done < len && rc == 0) {
        size_t p = pos0 + done, in_block = p % bs, run = bs - in_block;
        size_t row = (size_t)c->table_host[p / bs] * bs + in_block;
        const float *ks = s->k + (off + done) * w, *vs = s->v + (off + done) * w;

        if (run > len - done)
            run = len - done;
        if (c->dtype == GANG_DTYPE_F32) {
            rc = gang_kernels_copy(k, kb + row * w * es, ks, run * w * sizeof(float));
            if (rc == 0)
                rc = gang_kernels_copy(k, vb + row * w * es, vs, run * w * sizeof(float));
        } else {
            /* A half-precision pool: the rows are rounded to it as they are stored. */
            rc = gang_kernels_convert(k, GANG_DTYPE_F32, ks, c->dtype, kb + row * w * es, run * w);
            if (rc == 0)
                rc = gang_kernels_convert(k, GANG_DTYPE_F32, vs, c->dtype, vb + row * w * es,
                                          run * w);
        }
        done += run;
    }
    return rc;
}

/* Room in s for the attention descriptors of n_seq sequences (host, kept between calls). */
static int tp_attn_reserve(gang_tp_scratch *s, size_t n_seq)
{
    gang_kernels_attn_seq *sq;
    gang_kernels_kv_pages *pg;

    if (n_seq <= s->attn_cap)
        return 0;
    sq = realloc(s->attn_seqs, n_seq * sizeof(*sq));
    if (sq == NULL)
        return GANG_ENOMEM;
    s->attn_seqs = sq;
    pg = realloc(s->attn_pages, n_seq * sizeof(*pg));
    if (pg == NULL)
        return GANG_ENOMEM;
    s->attn_pages = pg;
    s->attn_cap = n_seq;
    return 0;
}

/*
 * The attention of the batch one descriptor per sequence: each sequence's new rows (the
 * scratch's k and v) into its cache, then one gang_kernels_attention_batch call, in
 * place in s->q.
 */
static int tp_batch_attend_seqs(const gang_tp_layer *l, gang_kernels *k, uint32_t n_seq,
                                const uint32_t *seq_tokens, const uint32_t *seq_pos0,
                                gang_tp_kv_cache *const *caches, gang_tp_scratch *s)
{
    size_t off = 0, i, kv_bytes = s->kv_cols * sizeof(float);
    int rc;

    if ((rc = tp_attn_reserve(s, n_seq)) != 0)
        return rc;
    /* Each sequence's new rows into its cache, then one attention call for the batch. */
    for (i = 0; i < n_seq; i++) {
        gang_tp_kv_cache *c = caches[i];
        size_t len = seq_tokens[i], pos0 = seq_pos0[i];
        gang_kernels_attn_seq *d = &s->attn_seqs[i];

        if (c->table != NULL) {
            rc = tp_paged_write(k, c, s, off, pos0, len);
            if (rc != 0)
                return rc;
            s->attn_pages[i] =
                (gang_kernels_kv_pages){c->table, c->block_size, c->n_blocks, c->dtype};
        } else if (n_seq > 1) {
            rc = gang_kernels_copy(k, c->k + pos0 * s->kv_cols, s->k + off * s->kv_cols,
                                   len * kv_bytes);
            if (rc == 0)
                rc = gang_kernels_copy(k, c->v + pos0 * s->kv_cols, s->v + off * s->kv_cols,
                                       len * kv_bytes);
            if (rc != 0)
                return rc;
        }
        *d = (gang_kernels_attn_seq){.q = s->q + off * s->q_cols,
                                     .out = s->q + off * s->q_cols,
                                     .kc = c->k,
                                     .vc = c->v,
                                     .pages = c->table != NULL ? &s->attn_pages[i] : NULL,
                                     .tq = len,
                                     .tk = pos0 + len,
                                     .pos0 = pos0};
        off += len;
    }
    return gang_kernels_attention_batch(k, s->attn_seqs, n_seq, l->shard.head_count,
                                        l->shard.kv_head_count, l->head_dim, l->window);
}

/* 1 when a layer's q/k/v leave their GEMM through the one launch that splits, biases and
 * rotates them (gang_kernels_split_qkv_rope): a concatenated weight (a device layer), no
 * per-head norm between the bias and RoPE (Qwen3's), the layer's own RoPE table (not
 * dynamic NTK's per-sequence ones). */
static int tp_qkv_rope_fused(const gang_tp_layer *l)
{
    return l->wqkv != NULL && l->q_norm == NULL && l->rope_dyn_factor <= 0.0f;
}

/*
 * The q, k and v projections of the call's tokens (of in) into s->q, kp and vp: one GEMM
 * over the concatenated weight of a device layer, split back into the three in one launch (with
 * the biases and RoPE when tp_qkv_rope_fused); one gang_kernels_matmul_n of the three
 * weights on the host.
 */
static int tp_batch_qkv(const gang_tp_layer *l, gang_kernels *k, gang_tp_scratch *s, size_t total,
                        tp_in in, float *kp, float *vp)
{
    const void *const w[3] = {l->wq, l->wk, l->wv};
    const size_t out[3] = {s->q_cols, s->kv_cols, s->kv_cols};
    float *const y[3] = {s->q, kp, vp};
    int rc;

    if (l->wqkv != NULL) {
        rc = tp_matmul_in(k, l, s, in, total, l->wqkv, s->q_cols + 2 * s->kv_cols, s->fused);
        if (rc == 0 && tp_qkv_rope_fused(l)) {
            gang_kernels_qkv_rope a = {.x = s->fused,
                                       .rows = total,
                                       .n_heads = l->shard.head_count,
                                       .n_kv_heads = l->shard.kv_head_count,
                                       .head_dim = l->head_dim,
                                       .bq = l->bq,
                                       .bk = l->bk,
                                       .bv = l->bv,
                                       .positions = s->positions,
                                       .inv_freq = l->rope_freq,
                                       .scale = l->rope_scale,
                                       .q = s->q,
                                       .k = kp,
                                       .v = vp};

            return gang_kernels_split_qkv_rope(k, &a);
        }
        return rc != 0 ? rc
                       : gang_kernels_split_cols3(k, s->fused, total, s->q_cols, s->kv_cols,
                                                  s->kv_cols, s->q, kp, vp);
    }
    if ((rc = tp_in_ready(k, l, s, &in, total)) != 0)
        return rc;
    return tp_matmul_n(k, l, in.x, total, l->hidden, 3, w, out, y);
}

/*
 * The MLP's gated unit of the call's tokens (of x), as the down projection's input (*in):
 * on a device layer the concatenated gate/up weight's product, whose gated unit the backend
 * writes into s->gate in the same launch where it can (gang_kernels_matmul_fused's glu_out:
 * the decode GEMV, x's norm too), else the product into s->fused, whose gated unit the down product
 * computes as it reads it (tp_row_in); on the host one gang_kernels_matmul_n of the two
 * weights and the element-wise gate into s->gate.
 */
static int tp_batch_gate(const gang_tp_layer *l, gang_kernels *k, gang_tp_scratch *s, size_t total,
                         tp_in x, tp_row_in *in)
{
    const void *const w[2] = {l->w_gate, l->w_up};
    const size_t out[2] = {s->ffn_cols, s->ffn_cols};
    float *const y[2] = {s->gate, s->up};
    int gelu = l->act == GANG_ACT_GELU_TANH, rc;

    if (l->wgu != NULL) {
        gang_kernels_weight v =
            gang_kernels_weight_view(tp_wtype(l, l->wgu), l->wgu, 2 * s->ffn_cols, l->hidden);
        const gang_kernels_fusion f = {
            .norm = x.norm, .eps = l->norm_eps, .glu_in = -1, .glu_out = gelu};

        rc = gang_kernels_matmul_fused(k, total, s->ffn_cols, l->hidden, x.x, &v, &f,
                                       x.norm != NULL ? s->normed : NULL, s->gate);
        if (rc != GANG_ENOSYS) {
            *in = (tp_row_in){.x = s->gate, .glu = -1};
            return rc;
        }
        *in = (tp_row_in){.x = s->fused, .glu = gelu, .glu_out = s->gate};
        return tp_matmul_in(k, l, s, x, total, l->wgu, 2 * s->ffn_cols, s->fused);
    }
    *in = (tp_row_in){.x = s->gate, .glu = -1};
    if ((rc = tp_in_ready(k, l, s, &x, total)) != 0)
        return rc;
    rc = tp_matmul_n(k, l, x.x, total, l->hidden, 2, w, out, y);
    if (rc != 0)
        return rc;
    return gelu ? gang_kernels_gelu_mul(k, s->gate, s->up, total * s->ffn_cols, s->gate)
                : gang_kernels_silu_mul(k, s->gate, s->up, total * s->ffn_cols, s->gate);
}

/*
 * 1 when the batch's caches allow the one-launch step attention: a device handle, and
 * every cache paged on one pool with its table in one array (table_base).
 */
static int tp_step_kv(gang_kernels *k, uint32_t n_seq, gang_tp_kv_cache *const *caches,
                      gang_kernels_step_kv *kv, const gang_tp_scratch *s, size_t total)
{
    const gang_tp_kv_cache *c0 = caches[0];
    size_t max_keys = c0->cap;

    if (!(gang_kernels_caps(k) & GANG_KERNELS_CAP_DEVICE_MEM) || c0->table_base == NULL)
        return 0;
    for (uint32_t i = 1; i < n_seq; i++) {
        const gang_tp_kv_cache *c = caches[i];

        if (c->table_base != c0->table_base || c->k != c0->k || c->v != c0->v ||
            c->dtype != c0->dtype || c->block_size != c0->block_size || c->n_blocks != c0->n_blocks)
            return 0;
        if (c->cap > max_keys)
            max_keys = c->cap;
    }
    *kv = (gang_kernels_step_kv){.kc = c0->k,
                                 .vc = c0->v,
                                 .tables = c0->table_base,
                                 .positions = s->positions,
                                 .table_rows = s->positions + total,
                                 .block_size = c0->block_size,
                                 .n_blocks = c0->n_blocks,
                                 .dtype = c0->dtype,
                                 .max_keys = max_keys};
    return 1;
}

/*
 * The attention block on the whole batch: in [total, hidden] in, s->delta [total, hidden]
 * out (after the o_proj all-reduce), or, with resid and *added set, resid += the block's
 * output instead (tp_linear_row_staged).
 */
static int tp_batch_attention(const gang_tp_layer *l, gang_kernels *k, gang_comm *comm,
                              uint32_t n_seq, const uint32_t *seq_tokens, const uint32_t *seq_pos0,
                              gang_tp_kv_cache *const *caches, gang_tp_scratch *s, size_t total,
                              tp_in in, float *resid, int *added, uint64_t timeout_ms)
{
    size_t hd = l->head_dim;
    float *kp = s->k, *vp = s->v;
    gang_kernels_step_kv kv;
    int rc, step = tp_step_kv(k, n_seq, caches, &kv, s, total);

    /*
     * A cache row has exactly the width of this rank's K and V projections. With one
     * sequence (batch-1 decode, a lone prefill) the projections write straight into its
     * cache rows and RoPE rotates the keys there, which saves two copies per layer;
     * otherwise (or when the cache is paged) they go to the scratch and each sequence's
     * rows are copied to its cache, block by block when it is paged.
     */
    if (n_seq == 1 && caches[0]->table == NULL) {
        kp = caches[0]->k + (size_t)seq_pos0[0] * s->kv_cols;
        vp = caches[0]->v + (size_t)seq_pos0[0] * s->kv_cols;
    }
    rc = tp_batch_qkv(l, k, s, total, in, kp, vp);
    if (rc != 0)
        return rc;
    if (!tp_qkv_rope_fused(l)) {
        rc = tp_add_biases(l, k, s->q, kp, vp, total);
        if (rc != 0)
            return rc;
        /* Qwen3: every q and k head RMS-normed over its head_dim, before RoPE. */
        if (l->q_norm != NULL) {
            rc = gang_kernels_rmsnorm(k, s->q, l->q_norm, l->norm_eps, total * l->shard.head_count,
                                      hd, s->q);
            if (rc == 0)
                rc = gang_kernels_rmsnorm(k, kp, l->k_norm, l->norm_eps,
                                          total * l->shard.kv_head_count, hd, kp);
            if (rc != 0)
                return rc;
        }
        rc = tp_batch_rope(l, k, s, n_seq, seq_tokens, kp, total);
        if (rc != 0)
            return rc;
    }
    /* A device step: every sequence's rows appended and attended in one launch (a shape
     * the backend's kernel does not take, GANG_ENOSYS before anything ran: per sequence). */
    rc = step ? gang_kernels_attention_step(k, &kv, kp, vp, s->q, total, l->shard.head_count,
                                            l->shard.kv_head_count, hd, l->window, s->q)
              : GANG_ENOSYS;
    if (rc == GANG_ENOSYS)
        rc = tp_batch_attend_seqs(l, k, n_seq, seq_tokens, seq_pos0, caches, s);
    if (rc != 0)
        return rc;
    return tp_linear_row_staged(k, comm, &s->stage, l, (tp_row_in){.x = s->q, .glu = -1}, total,
                                s->q_cols, l->wo, l->hidden, s->delta, resid, added, timeout_ms);
}

int gang_tp_layer_forward_batch(const gang_tp_layer *l, gang_kernels *k, gang_comm *comm, float *x,
                                uint32_t n_seq, const uint32_t *seq_tokens,
                                const uint32_t *seq_pos0, gang_tp_kv_cache *const *caches,
                                gang_tp_scratch *s, uint64_t timeout_ms)
{
    uint64_t deadline, left;
    size_t total, n;
    int rc, normed_ready, added;
    tp_row_in down_in = {.glu = -1};
    tp_in in;

    if (l == NULL || k == NULL || x == NULL || seq_tokens == NULL || seq_pos0 == NULL ||
        caches == NULL || s == NULL || n_seq == 0 || timeout_ms == 0)
        return GANG_EINVAL;
    /* normed already holds this layer's input norm when the previous call left it for this
     * attn_norm (gang_tp_scratch's next_norm); it is consumed here, whatever follows. */
    normed_ready = s->normed_for != NULL && s->normed_for == l->attn_norm;
    s->normed_for = NULL;
    if ((l->wq == NULL && l->wqkv == NULL) || l->attn_norm == NULL || l->mlp_norm == NULL)
        return GANG_EINVAL;
    /* A concatenated weight needs the device scratch's room for its GEMM's output. */
    if ((l->wqkv != NULL || l->wgu != NULL) &&
        (s->fused == NULL || s->fused_cols < s->q_cols + 2 * s->kv_cols ||
         s->fused_cols < 2 * s->ffn_cols))
        return GANG_EINVAL;
    rc = tp_check_comm(l, comm);
    if (rc == 0)
        rc = tp_check_mem(l, k);
    if (rc != 0)
        return rc;
    /* The scratch, like the layer, must be tensor memory of k. */
    if ((gang_kernels_caps(k) & GANG_KERNELS_CAP_DEVICE_MEM)
            ? s->mem != k
            : (gang_kernels_caps(s->mem) & GANG_KERNELS_CAP_DEVICE_MEM))
        return GANG_EINVAL;
    rc = tp_batch_check(l, s, n_seq, seq_tokens, seq_pos0, caches, &total);
    if (rc == 0)
        rc = tp_batch_positions(k, s, total);
    if (rc == 0 && l->rope_dyn_factor > 0.0f)
        rc = tp_rope_tables(l, k, s, n_seq, seq_tokens, seq_pos0);
    if (rc != 0)
        return rc;
    n = total * l->hidden;
    deadline = gang_deadline_after(timeout_ms);

    /*
     * The residual stream: where the backend fuses (gang_kernels_matmul_fused), the input
     * norms happen in the q|k|v and gate|up products' launches and the o and down products
     * add themselves to x, so no norm or add runs between the products; otherwise (or
     * around Gemma's sandwich norms and a mixture of experts) the separate calls, the
     * previous layer's last add with this layer's input norm among them.
     */
    in = normed_ready ? (tp_in){.x = s->normed} : (tp_in){.x = x, .norm = l->attn_norm};
    rc = tp_batch_attention(l, k, comm, n_seq, seq_tokens, seq_pos0, caches, s, total, in,
                            l->post_attn_norm == NULL ? x : NULL, &added, timeout_ms);
    if (rc != 0)
        return rc;
    if (added)
        in = (tp_in){.x = x, .norm = l->mlp_norm};
    else {
        if (l->post_attn_norm != NULL) /* Gemma's sandwich norm, in place */
            rc = gang_kernels_rmsnorm(k, s->delta, l->post_attn_norm, l->norm_eps, total, l->hidden,
                                      s->delta);
        if (rc == 0)
            rc = gang_kernels_add_rmsnorm(k, x, s->delta, l->mlp_norm, l->norm_eps, total,
                                          l->hidden, s->normed);
        if (rc != 0)
            return rc;
        in = (tp_in){.x = s->normed};
    }
    /* The second all-reduce (the MoE block's all-to-alls too) gets what is left. */
    rc = gang_deadline_left(deadline, &left);
    if (rc != 0)
        return rc;
    if (l->moe != NULL) { /* a mixture-of-experts MLP (parallel/tp-moe.c), on the EP group */
        rc = tp_in_ready(k, l, s, &in, total);
        if (rc == 0)
            rc = gang_tp_moe_forward(l->moe, k, s->moe_comm != NULL ? s->moe_comm : comm, in.x,
                                     total, s->delta, left);
    } else {
        rc = tp_batch_gate(l, k, s, total, in, &down_in);
        if (rc == 0)
            rc = tp_linear_row_staged(k, comm, &s->stage, l, down_in, total, s->ffn_cols, l->w_down,
                                      l->hidden, s->delta, l->post_mlp_norm == NULL ? x : NULL,
                                      &added, left);
        /* added: x holds the layer's output; the next layer norms it in its own products */
        if (rc != 0 || added)
            return rc;
    }
    if (rc == 0 && l->post_mlp_norm != NULL)
        rc = gang_kernels_rmsnorm(k, s->delta, l->post_mlp_norm, l->norm_eps, total, l->hidden,
                                  s->delta);
    if (rc != 0)
        return rc;
    if (s->next_norm == NULL)
        return gang_kernels_add(k, x, s->delta, n);
    /* The next layer's input norm with this residual add (the same eps: one per model). */
    rc = gang_kernels_add_rmsnorm(k, x, s->delta, s->next_norm, l->norm_eps, total, l->hidden,
                                  s->normed);
    if (rc == 0)
        s->normed_for = s->next_norm;
    return rc;
}
