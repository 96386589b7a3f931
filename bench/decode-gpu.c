/*
 * `ganglion bench decode --device cuda` (and `--device fake`, the same path on the fake
 * test device): a random model of the Llama-3.2-1B shape (or Llama-3-8B's, --shape 8b)
 * built in memory, packed into each storage of --dtypes (issue #13) and moved to the
 * device, the device copy bandwidth, and the points of --layouts (1x1, TP=2, the nccl
 * point) per storage with the HBM roofline; bench-decode.c's file comment has the method.
 *
 * Building the model. Every rank draws its shard layer by layer: one full layer in f32 on
 * the host (drawn by up to 16 threads: an 8B-shaped layer is 218 M values), cut with
 * gang_tp_layer_init, packed with gang_tp_layer_pack and moved to the device before the
 * next is drawn, so host memory stays at about three f32 layers (2.6 GB for the 8B shape,
 * where the whole model in f32 would be 32 GB); then the embedding table, final norm and
 * LM-head rows are drawn in f32, packed with gang_model_pack and moved with
 * gang_model_to_device. Every value is a function of (tensor, index) alone, so every
 * storage and every layout packs the same f32 model.
 *
 * Roofline per storage: m->weight_bytes (the bytes actually stored, summed over the
 * ranks) less the embedding table (gang__bd_stream_bytes: a decode step gathers rows of
 * it, it does not stream it), plus the KV cache the decode steps read (kv_bytes_per_step,
 * as decode-model.c counts it: what matters at long contexts, --prompt).
 *
 * Variants (--variants, bd_variants): the 1x1 point of every batch again with one launch
 * choice changed (PDL, the norms and adds unfused, cuBLASLt for the decode products), on
 * the handle and model the one-rank points keep, through gang_kernels_retune; each is
 * compared with its batch's 1x1 point like a layout.
 *
 * Agreement per storage, each layout against the 1x1 point of the same storage and batch.
 * The tolerance on a flip (bench-decode.c's file comment) depends on the storage: f32
 * BD_GAP_TOL; bf16 / f16 3e-2, because the cuda GEMM rounds the activations to the
 * weight's type (cuda_matmul), so a last-bit difference between layouts' f32 sums can
 * become a half-precision step; int8 1e-1, because a column-split shard (o_proj,
 * down_proj) carries its own scale per output row, so TP=2 holds a slightly different
 * quantization of the same weights than 1x1 (tests/unit/test-layers.c measures it).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <cjson/cJSON.h>

#include "decode.h"
#include "report.h"
#include "ganglion/comm.h"
#include "ganglion/common.h"
#include "ganglion/model.h"

/* The model config of the benchmark's shape (Llama, f32, no biases, untied head). */
static void bd_model_config(const bd_opts *o, gang_model_config *mc)
{
    memset(mc, 0, sizeof(*mc));
    mc->arch = GANG_ARCH_LLAMA;
    mc->hidden = o->hidden;
    mc->ffn = o->ffn;
    mc->n_heads = o->heads;
    mc->n_kv_heads = o->kv_heads;
    mc->n_layers = o->layers;
    mc->vocab = o->vocab;
    mc->head_dim = o->hidden / o->heads;
    mc->max_pos = o->prompt + o->tokens;
    mc->rms_eps = 1e-5f;
    mc->rope_theta = 500000.0f;
    mc->bos_token_id = -1;
    mc->eos_token_id = -1; /* no stop token: every request runs its --tokens */
    mc->dtype = GANG_DTYPE_F32;
}

/* splitmix64's finaliser. */
static uint64_t bd_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/*
 * Elements [first, first + n) of tensor `tensor`: offset + scale x uniform[-1, 1), each a
 * function of (tensor, index) alone, so every rank cuts its shard out of the same model
 * and TP = 2 must give the tokens of 1x1.
 */
static void bd_fill(float *a, size_t n, uint64_t tensor, size_t first, float scale, float offset)
{
    uint64_t base = bd_mix(tensor * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
    size_t i;

    for (i = 0; i < n; i++) {
        uint64_t z = bd_mix(base + (uint64_t)(first + i) * 0xd1b54a32d192ed03ull);

        a[i] = offset + scale * (float)((double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0);
    }
}

/* One bd_fill cut into slices (bd_fill_par). */
typedef struct bd_fill_job {
    float *a;
    size_t first;
    uint64_t tensor;
    float scale, offset;
} bd_fill_job;

static void bd_fill_slice(void *arg, size_t lo, size_t hi)
{
    const bd_fill_job *j = arg;

    bd_fill(j->a + lo, hi - lo, j->tensor, j->first + lo, j->scale, j->offset);
}

/*
 * bd_fill over several threads (gang_parallel_slices), each a contiguous slice: the values
 * do not depend on the split; a thread takes at least 2^18 elements.
 */
static void bd_fill_par(float *a, size_t n, uint64_t tensor, size_t first, float scale,
                        float offset)
{
    bd_fill_job j = {.a = a, .first = first, .tensor = tensor, .scale = scale, .offset = offset};

    gang_parallel_slices(n, 1, (size_t)1 << 18, bd_fill_slice, &j);
}

/* Host full-layer buffers, reused for every layer of a rank. */
typedef struct bd_full_layer {
    float *buf;
    gang_layer_weights w;
} bd_full_layer;

/* Draws layer li's full weights into f (allocated on first use). */
static int bd_draw_layer(const bd_opts *o, bd_full_layer *f, uint32_t li)
{
    size_t h = o->hidden, q = h, kv = (size_t)o->kv_heads * (h / o->heads), ff = o->ffn;
    size_t sizes[9] = {h, q * h, kv * h, kv * h, h * q, h, ff * h, ff * h, h * ff}, total = 0, i;
    float *p[9];
    float scale_in_h = 1.0f / sqrtf((float)h), scale_in_f = 1.0f / sqrtf((float)ff);

    for (i = 0; i < 9; i++)
        total += sizes[i];
    if (f->buf == NULL && (f->buf = malloc(total * sizeof(float))) == NULL)
        return GANG_ENOMEM;
    p[0] = f->buf;
    for (i = 1; i < 9; i++)
        p[i] = p[i - 1] + sizes[i - 1];
    for (i = 0; i < 9; i++) {
        int is_norm = i == 0 || i == 5;

        bd_fill_par(p[i], sizes[i], (uint64_t)li * 16 + i + 1, 0,
                    is_norm ? 0.05f : (i == 8 ? scale_in_f : scale_in_h), is_norm ? 1.0f : 0.0f);
    }
    f->w = (gang_layer_weights){.attn_norm = p[0],
                                .wq = p[1],
                                .wk = p[2],
                                .wv = p[3],
                                .wo = p[4],
                                .mlp_norm = p[5],
                                .w_gate = p[6],
                                .w_up = p[7],
                                .w_down = p[8]};
    return 0;
}

/* The process's minor page faults so far (0 when getrusage fails). */
static double bd_minor_faults(void)
{
    struct rusage ru;

    return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_minflt : 0.0;
}

/*
 * Draws, packs (o->wtype) and moves rank m's layers to k one at a time (file comment),
 * counting their stored bytes and their f32 norms in m->weight_bytes; the layers' seconds
 * and their faults per layer after the first into st.
 */
static int bd_gpu_layers(const bd_opts *o, const gang_topology *t, gang_kernels *k, gang_model *m,
                         bd_build_stats *st)
{
    bd_full_layer f = {0};
    uint64_t t0 = gang_now_ns();
    double faults = 0.0, bytes0 = 0.0;
    uint32_t i;
    int rc = 0;

    for (i = 0; i < m->layer_count && rc == 0; i++) {
        gang_tp_layer *l = &m->layers[i];

        if (i == 1) { /* the first layer's pages are new: count from the second */
            faults = bd_minor_faults();
            bytes0 = (double)m->weight_bytes;
        }

        rc = bd_draw_layer(o, &f, m->layer_first + i);
        if (rc == 0)
            rc =
                gang_tp_layer_init(l, t, m->place.tp_rank, &f.w, m->cfg.rope_theta, m->cfg.rms_eps);
        if (rc == 0)
            rc = gang_tp_layer_pack(l, o->wtype);
        if (rc == 0)
            m->weight_bytes += gang_tp_layer_weight_bytes(l) + 2 * (size_t)o->hidden * 4;
        if (rc == 0)
            rc = gang_tp_layer_to_device(l, k);
    }
    st->layers_s = (double)(gang_now_ns() - t0) / 1e9;
    st->faults_per_later_layer = -1.0;
    if (rc == 0 && m->layer_count > 1) {
        st->faults_per_later_layer = (bd_minor_faults() - faults) / (m->layer_count - 1);
        st->layer_bytes = ((double)m->weight_bytes - bytes0) / (m->layer_count - 1);
    }
    free(f.buf);
    return rc;
}

/*
 * Rank `rank`'s shard of the in-memory model on the device of k, its matrices stored as
 * o->wtype: the layers (bd_gpu_layers), then the embedding table, final norm and LM-head
 * rows drawn in f32, packed with gang_model_pack and moved with gang_model_to_device.
 * m->weight_bytes is the bytes stored on the device.
 */
int gang__bd_gpu_model(const bd_opts *o, const gang_topology *t, uint32_t rank, gang_kernels *k,
                       gang_model **out, bd_build_stats *st)
{
    uint64_t t0 = gang_now_ns();
    gang_model *m;
    size_t h = o->hidden, rows;
    int rc;

    *out = NULL;
    memset(st, 0, sizeof(*st));
    m = calloc(1, sizeof(*m));
    if (m == NULL)
        return GANG_ENOMEM;
    bd_model_config(o, &m->cfg);
    rc = gang_model_place(m, t, rank);
    if (rc == 0) {
        gang_heap_reuse_begin(); /* each layer on the previous one's pages */
        rc = bd_gpu_layers(o, t, k, m, st);
        gang_heap_reuse_end();
    }
    if (rc != 0)
        goto out_free;
    if (m->place.pp_stage == 0) {
        if ((m->embed = malloc((size_t)o->vocab * h * sizeof(float))) == NULL)
            rc = GANG_ENOMEM;
        else
            bd_fill_par(m->embed, (size_t)o->vocab * h, 1u << 20, 0, 1.0f, 0.0f);
        m->weight_bytes += (size_t)o->vocab * h * sizeof(float);
    }
    if (rc == 0 && m->place.pp_stage + 1 == t->pp) {
        rows = m->shard.vocab_count;
        m->final_norm = malloc(h * sizeof(float));
        m->lm_head = malloc(rows * h * sizeof(float));
        if (m->final_norm == NULL || m->lm_head == NULL) {
            rc = GANG_ENOMEM;
        } else {
            bd_fill(m->final_norm, h, (1u << 20) + 1, 0, 0.05f, 1.0f);
            bd_fill_par(m->lm_head, rows * h, (1u << 20) + 2, (size_t)m->shard.vocab_first * h,
                        1.0f / sqrtf((float)h), 0.0f);
            m->weight_bytes += (rows + 1) * h * sizeof(float);
        }
    }
    if (rc == 0)
        rc = gang_model_pack(m, o->wtype);
    if (rc == 0)
        rc = gang_model_to_device(m, k);
    if (rc == 0) {
        st->seconds = (double)(gang_now_ns() - t0) / 1e9;
        *out = m;
        return 0;
    }

out_free:
    gang_model_device_release(m);
    gang_model_free(m);
    return rc;
}

void gang__bd_gpu_keep_release(bd_gpu_keep *keep)
{
    if (keep == NULL)
        return;
    gang_model_device_release(keep->m); /* device memory returns to k's pool: k last */
    gang_model_free(keep->m);
    gang_kernels_close(keep->k);
    memset(keep, 0, sizeof(*keep));
}

/*
 * Device copy bandwidth: median over 10 copies of --bw-mib between two pool buffers (after 3
 * warm-up copies), counting the bytes read and the bytes written, in GB/s (1e9).
 */
static int bd_copy_bandwidth(const bd_opts *o, double *gbps)
{
    const size_t bytes = o->copy_bytes;
    gang_kernels_options ko;
    gang_kernels *k = NULL;
    void *a = NULL, *b = NULL;
    double ms[10];
    uint64_t t0;
    int i, rc;

    gang_kernels_options_init(&ko);
    ko.device = o->kdev;
    ko.pool_mb =
        2 * (bytes >> 20) + 256 > o->gpu_pool_mb ? 2 * (bytes >> 20) + 256 : o->gpu_pool_mb;
    ko.trace = (int)o->trace_kernels; /* CUPTI enabled with the process's first context */
    rc = gang_kernels_open_opts(&ko, &k);
    if (rc == 0)
        rc = gang_kernels_alloc(k, bytes, &a);
    if (rc == 0)
        rc = gang_kernels_alloc(k, bytes, &b);
    for (i = 0; i < 3 && rc == 0; i++)
        rc = gang_kernels_copy(k, b, a, bytes);
    if (rc == 0)
        rc = gang_kernels_sync(k);
    for (i = 0; i < 10 && rc == 0; i++) {
        t0 = gang_now_ns();
        rc = gang_kernels_copy(k, i % 2 ? a : b, i % 2 ? b : a, bytes);
        if (rc == 0)
            rc = gang_kernels_sync(k);
        ms[i] = (double)(gang_now_ns() - t0) / 1e6;
    }
    if (rc == 0)
        *gbps = 2.0 * (double)bytes / (gang_report_median(ms, 10) / 1e3) / 1e9;
    gang_kernels_free(k, a);
    gang_kernels_free(k, b);
    gang_kernels_close(k);
    return rc;
}

/* Parameters of the model of o's shape (the embedding table included). */
static double bd_params(const bd_opts *o)
{
    double h = o->hidden, kv = (double)o->kv_heads * (o->hidden / o->heads), f = o->ffn;
    double layer = h * h * 2 + 2 * kv * h + 3 * f * h + 2 * h;

    return o->layers * layer + 2.0 * o->vocab * h + h;
}

/* The points of --layouts: tp, pp, nccl (the TP group over nccl: "nccl" is 1x1 with a
 * one-rank group, "TPx1-nccl" TP ranks on as many GPUs). */
typedef struct bd_gpu_layouts {
    uint32_t lay[BD_MAX_LAYOUTS][3];
    uint32_t n;
} bd_gpu_layouts;

/*
 * --layouts for cuda / fake: TPxPP items (at most BD_MAX_RANKS ranks, on the one device),
 * "nccl" and TPx1-nccl, 1x1 first. An nccl layout is left out, with a note on stderr, on
 * the fake device, without NCCL, or (TPx1-nccl) with fewer GPUs than TP ranks. Returns 0
 * or GANG_EUSAGE (printed).
 */
static int bd_gpu_parse_layouts(const bd_opts *o, bd_gpu_layouts *L)
{
    int nccl_ok = strcmp(o->kdev, "cuda") == 0 && gang_comm_backend_built(GANG_COMM_NCCL);
    char buf[64], *save = NULL, *tok;
    unsigned tp, pp;
    char extra;

    memset(L, 0, sizeof(*L));
    gang_strlcpy(buf, o->layouts, sizeof(buf));
    for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        size_t len = strlen(tok);
        int nccl = strcmp(tok, "nccl") == 0;

        tp = pp = 1;
        if (!nccl && len > 5 && strcmp(tok + len - 5, "-nccl") == 0) {
            tok[len - 5] = '\0'; /* TPx1-nccl: TP >= 2 ranks, one stage */
            nccl = 2;
        }
        if ((nccl != 1 && (sscanf(tok, "%ux%u%c", &tp, &pp, &extra) != 2 || tp < 1 || pp < 1 ||
                           tp * pp > BD_MAX_RANKS)) ||
            (nccl == 2 && (tp < 2 || pp != 1)) || L->n == BD_MAX_LAYOUTS ||
            (L->n == 0 && (nccl || tp * pp != 1))) {
            fprintf(stderr,
                    "ganglion bench decode: --layouts: '%s' is not a list of up to %d TPxPP "
                    "layouts of at most %d ranks, nccl or TPx1-nccl, starting with 1x1\n",
                    o->layouts, BD_MAX_LAYOUTS, BD_MAX_RANKS);
            return GANG_EUSAGE;
        }
        if (nccl && !nccl_ok) {
            fprintf(stderr, "ganglion bench decode: the %s layout is left out: %s\n",
                    nccl == 1 ? "nccl" : "TP-over-nccl",
                    strcmp(o->kdev, "cuda") != 0 ? "not on the fake device" : "NCCL not built");
            continue;
        }
        if (nccl == 2 && (int)tp > gang_kernels_device_count()) {
            fprintf(stderr,
                    "ganglion bench decode: the %ux1-nccl layout is left out: it needs "
                    "%u GPUs (one per rank), %d visible\n",
                    tp, tp, gang_kernels_device_count());
            continue;
        }
        L->lay[L->n][0] = tp;
        L->lay[L->n][1] = pp;
        L->lay[L->n][2] = nccl ? 1u : 0u;
        L->n++;
    }
    if (L->n == 0) {
        fprintf(stderr, "ganglion bench decode: --layouts: no layout\n");
        return GANG_EUSAGE;
    }
    return 0;
}

/*
 * --variants: each a launch choice changed from the flags for the 1x1 point of every batch
 * again, on the handle and model the storage's one-rank points keep (gang_kernels_retune),
 * so that the choice is measured without drawing the model again (the 8B shape's host
 * build is most of a minute on the device machine) and against the same run's point.
 */
static const struct bd_variant {
    const char *name, *flag;
    size_t field; /* offsetof the bd_opts field it sets */
    uint32_t value;
} bd_variants[BD_MAX_VARIANTS] = {
    {"pdl", "--cuda-pdl 1", offsetof(bd_opts, cuda_pdl), 1},
    {"unfused", "--fuse-residual 0", offsetof(bd_opts, fuse_residual), 0},
    {"cublas", "--half-gemv 0", offsetof(bd_opts, half_gemv), 0},
};

/* The bd_opts field variant v sets. */
static uint32_t *bd_variant_field(bd_opts *o, uint32_t v)
{
    return (uint32_t *)(void *)((char *)o + bd_variants[v].field);
}

int gang__bd_parse_variants(bd_opts *o, const char *list, char *err, size_t errlen)
{
    char buf[64], *save = NULL, *tok;
    uint32_t v, seen = 0;

    o->n_variants = 0;
    if (strlen(list) >= sizeof(buf)) {
        snprintf(err, errlen, "--variants: '%s' is too long", list);
        return GANG_EUSAGE;
    }
    gang_strlcpy(buf, list, sizeof(buf));
    for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        for (v = 0; v < BD_MAX_VARIANTS && strcmp(tok, bd_variants[v].name) != 0; v++)
            ;
        if (v == BD_MAX_VARIANTS || (seen & (1u << v))) {
            snprintf(err, errlen, "--variants: '%s' is %s (pdl, unfused, cublas, each once)", tok,
                     v == BD_MAX_VARIANTS ? "not a variant" : "named twice");
            return GANG_EUSAGE;
        }
        if (*bd_variant_field(o, v) == bd_variants[v].value) {
            snprintf(err, errlen, "--variants: '%s' is %s, which the flags already say", tok,
                     bd_variants[v].flag);
            return GANG_EUSAGE;
        }
        seen |= 1u << v;
        o->variants[o->n_variants++] = v;
    }
    return 0;
}

/*
 * The 1x1 point of batch `batch` once per --variants entry, each against base (the batch's
 * 1x1 point with the flags as given) for agreement. Returns the number of failed points.
 */
static uint32_t bd_gpu_variant_points(const bd_opts *o, const gang_model_config *mc, uint32_t batch,
                                      const bd_result *base)
{
    bd_result res;
    uint32_t v, failed = 0;

    for (v = 0; v < o->n_variants; v++) {
        bd_opts ov = *o; /* the keep is shared: the same handle and model */
        const struct bd_variant *d = &bd_variants[o->variants[v]];

        *bd_variant_field(&ov, o->variants[v]) = d->value;
        ov.variant = d->name;
        if (gang__bd_point(&ov, mc, 1, 1, batch, 0, base, &res) != 0)
            failed++;
        else
            free(res.dec);
    }
    return failed;
}

/* One "skipped" line and the reason on stderr: --device cuda without a GPU. */
static void bd_gpu_skipped(void)
{
    gang_device_info probe;
    const char *why = gang_kernels_device_info(0, &probe) == GANG_ENOSYS
                          ? "CUDA support is not built into this binary"
                          : "no GPU visible (no NVIDIA driver or device)";
    cJSON *line = cJSON_CreateObject();

    fprintf(stderr, "ganglion bench decode --device cuda: skipped: %s\n", why);
    cJSON_AddStringToObject(line, "bench", "decode");
    cJSON_AddStringToObject(line, "device", "cuda");
    cJSON_AddStringToObject(line, "skipped", why);
    gang_report_emit(line);
}

/* The "copy_bandwidth" line (with the model's parameter count). */
static void bd_gpu_copy_line(const bd_opts *o, int rc)
{
    cJSON *line = cJSON_CreateObject();

    cJSON_AddStringToObject(line, "bench", "decode");
    cJSON_AddStringToObject(line, "device", o->kdev);
    cJSON_AddStringToObject(line, "measure", "copy_bandwidth");
    cJSON_AddStringToObject(line, "shape", o->shape);
    cJSON_AddNumberToObject(line, "copy_bytes", (double)o->copy_bytes);
    if (rc == 0)
        cJSON_AddNumberToObject(line, "copy_GBps", gang_report_round(o->copy_gbps, 1));
    else
        cJSON_AddStringToObject(line, "error", gang_err_name(rc));
    cJSON_AddNumberToObject(line, "params", bd_params(o));
    gang_report_emit(line);
}

/* The storage of a --dtypes name (validated) and its agreement tolerance (file comment). */
static void bd_gpu_storage(bd_opts *o, const char *name)
{
    o->storage = name;
    if (strcmp(name, "bf16") == 0 || strcmp(name, "f16") == 0) {
        o->wtype = name[0] == 'b' ? GANG_KW_BF16 : GANG_KW_F16;
        o->gap_tol = 3e-2;
    } else if (strcmp(name, "int8") == 0) {
        o->wtype = GANG_KW_I8;
        o->gap_tol = 1e-1;
    } else {
        o->wtype = GANG_KW_F32;
        o->gap_tol = BD_GAP_TOL;
    }
}

/*
 * Every point of the current storage: batches x layouts (1x1 first; a failed 1x1 skips
 * the batch's other layouts), then each batch's --variants points, then its "summary" line
 * with the batch-1 roofline ratio of the 1x1 point against the 0.7 target. Returns
 * the number of failed points.
 */
static uint32_t bd_gpu_storage_points(const bd_opts *o, const gang_model_config *mc,
                                      const bd_gpu_layouts *L)
{
    bd_result base[BD_MAX_BATCHES], res;
    double ratio1 = -1.0;
    uint32_t b, l, failed = 0;
    cJSON *line;

    memset(base, 0, sizeof(base));
    for (b = 0; b < o->n_batches; b++) {
        for (l = 0; l < L->n; l++) {
            int prc =
                gang__bd_point(o, mc, L->lay[l][0], L->lay[l][1], o->batches[b], (int)L->lay[l][2],
                               l == 0 ? NULL : &base[b], l == 0 ? &base[b] : &res);

            if (prc != 0) {
                failed++;
                if (l == 0)
                    break;
            } else if (l > 0) {
                free(res.dec);
            } else if (o->batches[b] == 1) {
                ratio1 = base[b].roofline_ratio;
            }
        }
    }
    /* The variants after every point of the flags, whose figures a failing variant (an
     * option not yet run on a device) then cannot take down with it. */
    for (b = 0; b < o->n_batches; b++) {
        if (base[b].dec != NULL)
            failed += bd_gpu_variant_points(o, mc, o->batches[b], &base[b]);
        free(base[b].dec);
    }
    line = cJSON_CreateObject();
    cJSON_AddStringToObject(line, "bench", "decode");
    cJSON_AddStringToObject(line, "device", o->kdev);
    cJSON_AddStringToObject(line, "measure", "summary");
    cJSON_AddStringToObject(line, "shape", o->shape);
    cJSON_AddStringToObject(line, "storage", o->storage);
    cJSON_AddNumberToObject(line, "batch1_roofline_ratio", gang_report_round(ratio1, 3));
    cJSON_AddNumberToObject(line, "target_ratio", 0.7);
    cJSON_AddBoolToObject(line, "meets_target", ratio1 >= 0.7);
    cJSON_AddNumberToObject(line, "failed_points", failed);
    gang_report_emit(line);
    return failed;
}

/*
 * --device cuda: the copy bandwidth, then for every storage of --dtypes the points of
 * --layouts at every batch and the storage's summary line.
 */
int gang__bd_main_cuda(bd_opts *o)
{
    char names[BD_MAX_STORAGES][8], err[256];
    bd_gpu_layouts L;
    gang_model_config mc;
    uint32_t n_names = 0, si, failed = 0;
    int rc;

    if (gang__bd_parse_storages(o->dtypes, names, &n_names, err, sizeof(err)) != 0) {
        fprintf(stderr, "ganglion bench decode: %s\n", err);
        return GANG_EXIT_USAGE;
    }
    if (bd_gpu_parse_layouts(o, &L) != 0)
        return GANG_EXIT_USAGE;
    o->no_agree = L.n == 1 && o->n_variants == 0;
    if (strcmp(o->kdev, "cuda") == 0 && gang_kernels_device_count() == 0) {
        bd_gpu_skipped();
        return GANG_EXIT_OK;
    }
    gang_heap_single_arena(); /* before the ranks' threads: their layers' blocks shared */
    bd_model_config(o, &mc);
    o->kv_token_elems = (double)mc.n_layers * 2.0 * mc.n_kv_heads * mc.head_dim;
    rc = bd_copy_bandwidth(o, &o->copy_gbps);
    bd_gpu_copy_line(o, rc);
    if (rc != 0)
        return GANG_EXIT_TEMPFAIL;
    for (si = 0; si < n_names; si++) {
        bd_gpu_keep keep = {0};

        bd_gpu_storage(o, names[si]);
        o->keep = &keep; /* the one-rank points of this storage share one model */
        failed += bd_gpu_storage_points(o, &mc, &L);
        o->keep = NULL;
        gang__bd_gpu_keep_release(&keep);
    }
    return failed > 0 ? GANG_EXIT_TEMPFAIL : GANG_EXIT_OK;
}

void gang__bd_emit_build(cJSON *line, const bd_build_stats *st)
{
    cJSON *b = cJSON_AddObjectToObject(line, "model_build");

    if (b == NULL)
        return;
    cJSON_AddNumberToObject(b, "seconds", gang_report_round(st->seconds, 2));
    cJSON_AddNumberToObject(b, "layers_s", gang_report_round(st->layers_s, 2));
    cJSON_AddNumberToObject(b, "faults_per_later_layer",
                            gang_report_round(st->faults_per_later_layer, 0));
    cJSON_AddNumberToObject(b, "layer_bytes", gang_report_round(st->layer_bytes, 0));
}

/*
 * The point's kernel trace (--trace-kernels, gang_kernels_trace) as the line's "trace"
 * object, per decode step: the step's wall time (host), the device's span from its first
 * kernel to its last, the time some kernel ran (busy) and the device idle inside the span
 * between kernels; then each op's kernels and microseconds per step and its share of the
 * busy time. A failed collect is "trace_error".
 */
void gang__bd_emit_trace(cJSON *line, int traced, const gang_kernels_trace *t)
{
    double n = t->spans > 0 ? (double)t->spans : 1.0;
    double busy = t->busy_ns > 0 ? (double)t->busy_ns : 1.0;
    cJSON *o, *ops;

    if (traced < 0) {
        cJSON_AddStringToObject(line, "trace_error", gang_err_name(traced));
        return;
    }
    if (traced == 0 || (o = cJSON_AddObjectToObject(line, "trace")) == NULL)
        return;
    cJSON_AddNumberToObject(o, "steps", (double)t->spans);
    cJSON_AddNumberToObject(o, "kernels_per_step", gang_report_round(t->kernels / n, 2));
    cJSON_AddNumberToObject(o, "graph_kernels_per_step",
                            gang_report_round(t->graph_kernels / n, 2));
    cJSON_AddNumberToObject(o, "step_us", gang_report_round(t->wall_ns / n / 1e3, 2));
    cJSON_AddNumberToObject(o, "device_us_per_step", gang_report_round(t->device_ns / n / 1e3, 2));
    cJSON_AddNumberToObject(o, "busy_us_per_step", gang_report_round(t->busy_ns / n / 1e3, 2));
    cJSON_AddNumberToObject(o, "idle_in_step_us",
                            gang_report_round((double)(t->device_ns - t->busy_ns) / n / 1e3, 2));
    cJSON_AddNumberToObject(
        o, "busy_share_of_step",
        gang_report_round(t->wall_ns > 0 ? t->busy_ns / (double)t->wall_ns : 0, 3));
    cJSON_AddNumberToObject(o, "dropped", (double)t->dropped);
    if ((ops = cJSON_AddArrayToObject(o, "ops")) == NULL)
        return;
    for (uint32_t i = 0; i < t->n_ops; i++) {
        const gang_kernels_trace_op *op = &t->ops[i];
        cJSON *e = cJSON_CreateObject();

        if (e == NULL || !cJSON_AddItemToArray(ops, e)) {
            cJSON_Delete(e);
            return;
        }
        cJSON_AddStringToObject(e, "name", op->name);
        cJSON_AddNumberToObject(e, "per_step", gang_report_round(op->count / n, 2));
        cJSON_AddNumberToObject(e, "us_per_step", gang_report_round(op->total_ns / n / 1e3, 2));
        cJSON_AddNumberToObject(e, "share", gang_report_round(op->total_ns / busy, 3));
    }
}
