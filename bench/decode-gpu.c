/*
 * `ganglion bench decode --device cuda` (and `--device fake`, the same path on the fake
 * test device): a random model of the Llama-3.2-1B shape built in memory and moved to the
 * device, the device copy bandwidth, and the points 1x1, TP=2 (and the nccl point) with
 * the HBM roofline; bench-decode.c's file comment has the method.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

        bd_fill(p[i], sizes[i], (uint64_t)li * 16 + i + 1, 0,
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

/*
 * Rank `rank`'s shard of the in-memory model on the device of k: each layer is drawn on
 * the host, cut with gang_tp_layer_init and moved to the device before the next is drawn
 * (host memory stays at one full layer), then the embedding, final norm and LM-head rows
 * follow with gang_model_to_device.
 */
int gang__bd_gpu_model(const bd_opts *o, const gang_topology *t, uint32_t rank, gang_kernels *k,
                       gang_model **out)
{
    bd_full_layer f = {0};
    gang_model *m;
    size_t h = o->hidden;
    uint32_t i;
    int rc;

    *out = NULL;
    m = calloc(1, sizeof(*m));
    if (m == NULL)
        return GANG_ENOMEM;
    bd_model_config(o, &m->cfg);
    rc = gang_model_place(m, t, rank);
    if (rc != 0)
        goto out_free;
    for (i = 0; i < m->layer_count && rc == 0; i++) {
        rc = bd_draw_layer(o, &f, m->layer_first + i);
        if (rc == 0)
            rc = gang_tp_layer_init(&m->layers[i], t, m->place.tp_rank, &f.w, m->cfg.rope_theta,
                                    m->cfg.rms_eps);
        if (rc == 0)
            rc = gang_tp_layer_to_device(&m->layers[i], k);
    }
    free(f.buf);
    if (rc != 0)
        goto out_free;
    if (m->place.pp_stage == 0) {
        if ((m->embed = malloc((size_t)o->vocab * h * sizeof(float))) == NULL)
            rc = GANG_ENOMEM;
        else
            bd_fill(m->embed, (size_t)o->vocab * h, 1u << 20, 0, 1.0f, 0.0f);
    }
    if (rc == 0 && m->place.pp_stage + 1 == t->pp) {
        m->final_norm = malloc(h * sizeof(float));
        m->lm_head = malloc((size_t)m->shard.vocab_count * h * sizeof(float));
        if (m->final_norm == NULL || m->lm_head == NULL) {
            rc = GANG_ENOMEM;
        } else {
            bd_fill(m->final_norm, h, (1u << 20) + 1, 0, 0.05f, 1.0f);
            bd_fill(m->lm_head, (size_t)m->shard.vocab_count * h, (1u << 20) + 2,
                    (size_t)m->shard.vocab_first * h, 1.0f / sqrtf((float)h), 0.0f);
        }
    }
    if (rc == 0)
        rc = gang_model_to_device(m, k);
    if (rc == 0) {
        *out = m;
        return 0;
    }

out_free:
    gang_model_device_release(m);
    gang_model_free(m);
    return rc;
}

/*
 * Device copy bandwidth: median over 10 copies of 1 GiB between two pool buffers (after 3
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

/* Weight bytes one decode step reads (see the file comment). */
static double bd_weight_bytes(const bd_opts *o)
{
    double h = o->hidden, kv = (double)o->kv_heads * (o->hidden / o->heads), f = o->ffn;
    double layer = h * h * 2 + 2 * kv * h + 3 * f * h + 2 * h;

    return 4.0 * (o->layers * layer + (double)o->vocab * h + 2 * h);
}

/*
 * --device cuda: the copy bandwidth, then 1x1 and TP=2 (one GPU, socket) at every batch,
 * then a summary line with the batch-1 roofline ratio against the 0.7 target.
 */
int gang__bd_main_cuda(bd_opts *o)
{
    /* tp, pp, nccl: 1x1, TP=2 over host staging, 1x1 with a one-rank nccl TP group */
    static const uint32_t lay[3][3] = {{1, 1, 0}, {2, 1, 0}, {1, 1, 1}};
    uint32_t n_lay =
        strcmp(o->kdev, "cuda") == 0 && gang_comm_backend_built(GANG_COMM_NCCL) ? 3 : 2;
    gang_model_config mc;
    bd_result base, res;
    double ratio1 = -1.0;
    uint32_t b, l;
    int rc = 0, prc, failed = 0;
    cJSON *line;

    if (strcmp(o->kdev, "cuda") == 0 && gang_kernels_device_count() == 0) {
        gang_device_info probe;
        const char *why = gang_kernels_device_info(0, &probe) == GANG_ENOSYS
                              ? "CUDA support is not built into this binary"
                              : "no GPU visible (no NVIDIA driver or device)";

        fprintf(stderr, "ganglion bench decode --device cuda: skipped: %s\n", why);
        line = cJSON_CreateObject();
        cJSON_AddStringToObject(line, "bench", "decode");
        cJSON_AddStringToObject(line, "device", "cuda");
        cJSON_AddStringToObject(line, "skipped", why);
        gang_report_emit(line);
        return GANG_EXIT_OK;
    }
    bd_model_config(o, &mc);
    o->weight_bytes = bd_weight_bytes(o);
    rc = bd_copy_bandwidth(o, &o->copy_gbps);
    line = cJSON_CreateObject();
    cJSON_AddStringToObject(line, "bench", "decode");
    cJSON_AddStringToObject(line, "device", o->kdev);
    cJSON_AddStringToObject(line, "measure", "copy_bandwidth");
    cJSON_AddNumberToObject(line, "copy_bytes", (double)o->copy_bytes);
    if (rc == 0)
        cJSON_AddNumberToObject(line, "copy_GBps", gang_report_round(o->copy_gbps, 1));
    else
        cJSON_AddStringToObject(line, "error", gang_err_name(rc));
    cJSON_AddNumberToObject(line, "weight_bytes_per_step", o->weight_bytes);
    cJSON_AddNumberToObject(line, "params", o->weight_bytes / 4.0);
    gang_report_emit(line);
    if (rc != 0)
        return GANG_EXIT_TEMPFAIL;
    for (b = 0; b < o->n_batches; b++) {
        memset(&base, 0, sizeof(base));
        for (l = 0; l < n_lay; l++) {
            prc = gang__bd_point(o, &mc, lay[l][0], lay[l][1], o->batches[b], (int)lay[l][2],
                                 l == 0 ? NULL : &base, l == 0 ? &base : &res);
            if (prc != 0) {
                failed++;
                if (l == 0)
                    break;
            } else if (l > 0) {
                free(res.dec);
            } else if (o->batches[b] == 1) {
                ratio1 = base.roofline_ratio;
            }
        }
        free(base.dec);
    }
    line = cJSON_CreateObject();
    cJSON_AddStringToObject(line, "bench", "decode");
    cJSON_AddStringToObject(line, "device", o->kdev);
    cJSON_AddStringToObject(line, "measure", "summary");
    cJSON_AddNumberToObject(line, "batch1_roofline_ratio", gang_report_round(ratio1, 3));
    cJSON_AddNumberToObject(line, "target_ratio", 0.7);
    cJSON_AddBoolToObject(line, "meets_target", ratio1 >= 0.7);
    cJSON_AddNumberToObject(line, "failed_points", failed);
    gang_report_emit(line);
    return failed > 0 ? GANG_EXIT_TEMPFAIL : GANG_EXIT_OK;
}
