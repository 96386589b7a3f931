/*
 * `ganglion bench decode --model PATH` (issue #13): the engine's decode on a real model
 * (a Hugging Face directory or a .gguf file), on the CPU, against the machine's memory
 * bandwidth and against transformers, in one run.
 *
 * Order of a run, each step one or more JSON lines (report.h):
 *   1. "model_info": the model's shape and the threads the engine's CPU GEMMs use
 *      (OpenBLAS's thread count; the CPUs online);
 *   2. "read_bandwidth": the machine's read bandwidth (read-bw.c: every online CPU sums
 *      its slice of a --bw-mib buffer, median of --bw-passes passes); measured again
 *      before every 1x1 point, whose roofline takes that value (bdm_bandwidth);
 *   3. the points: for every storage of --dtypes (f32, bf16, f16: gang_load_options.dtype;
 *      int8: .quantize = "int8" over the checkpoint's own dtype), every batch of --batch
 *      and every layout of --layouts (1x1 by default), the point of bench-decode.c (rank
 *      threads, --warmup + --iters iterations of one prefill step and --tokens - 1 decode
 *      steps, EOS ignored), with the roofline below. A storage the loader refuses
 *      (GANG_ENOSYS: this build cannot hold it) prints one line with "refused": the
 *      loader's message, and the run goes on with the next storage;
 *   4. the transformers peer (decode-peer.c, bench/hf-decode.py): its lines, or one line
 *      "skipped" / "failed" with the reason;
 *   5. "vs_transformers" lines: every storage's 1x1 decode tokens/s at each batch over the
 *      peer's best at that batch (best over its thread counts and dtypes);
 *   6. "target" lines, the targets on the bf16 storage, each PASS, FAIL or n/a
 *      with the reason: batch-1 roofline_ratio >= 0.7, batch-1 >= 2x the peer, batch-32
 *      (32 sequences in flight in the engine: the "32 concurrent clients") >= 3x the peer's
 *      static batch of 32.
 *
 * Roofline. A decode step of the engine streams every weight it holds once (the layers,
 * the final norm, the LM head) and reads the KV cache of every sequence; the embedding
 * table is not streamed (a step gathers one row per sequence), except the rows a tied LM
 * head reads from it (gang_model.lm_head_tied: the head is not held a second time). So
 *   bytes_per_step = stream_bytes + kv_bytes_per_step
 *   stream_bytes   = sum over ranks of m->weight_bytes less the embedding table (less the
 *                    table's rows other than the tied head's)
 *   kv_bytes_per_step = batch x (prompt + tokens / 2) x layers x 2 x kv_heads x head_dim x
 *                    the cache element's bytes (the points use `serve`'s
 *                    --kv-cache-dtype auto: bf16 for bf16 weights, f16 for f16, else f32;
 *                    prompt + tokens / 2 is the mean context of the decode steps)
 *   roofline_tok_s = batch x read_bandwidth / bytes_per_step,
 *   roofline_ratio = decode_tok_s / roofline_tok_s.
 * m->weight_bytes is the storage's true size (gang_load_options); the embedding table's
 * part of it is found by counting parameters from the config (the table's share of what
 * the rank holds) and assuming the table is stored at the model's mean bytes per
 * parameter: exact for f32, bf16 and f16 storage; for int8, where the table may stay in
 * a wider type, the estimate errs towards fewer bytes, so the ratio errs low.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../kernels/kernels-bench.h" /* the CPU backend's thread count */
#include "decode.h"
#include "report.h"
#include "ganglion/common.h"
#include "ganglion/model.h"

#define BDM_TARGET_ROOFLINE 0.7
#define BDM_TARGET_BATCH1 2.0
#define BDM_TARGET_BATCH32 3.0
#define BDM_TARGET_STORAGE "bf16"

/* What the points measured: per storage, per batch, the 1x1 point. */
typedef struct bdm_cell {
    int ran;
    double decode_tps, roofline_ratio;
} bdm_cell;

typedef struct bdm_run {
    char storages[BD_MAX_STORAGES][8];
    uint32_t n_storages;
    uint32_t layouts[BD_MAX_LAYOUTS][2]; /* tp, pp */
    uint32_t n_layouts;
    char refused[BD_MAX_STORAGES][256]; /* the loader's message; "" when it loaded */
    bdm_cell cells[BD_MAX_STORAGES][BD_MAX_BATCHES];
    uint32_t failed; /* points that failed (not refusals) */
} bdm_run;

/* Parameters of one decoder layer of cfg (what the loader reads for it), over TP = 1. */
static double bdm_layer_params(const gang_model_config *c)
{
    double h = c->hidden, q = (double)c->n_heads * c->head_dim;
    double kv = (double)c->n_kv_heads * c->head_dim, p;

    p = h * q + 2.0 * kv * h + q * h + 3.0 * c->ffn * h + 2.0 * h;
    if (c->post_norms)
        p += 2.0 * h;
    if (c->qk_norm)
        p += 2.0 * c->head_dim;
    if (c->attn_bias)
        p += q + 2.0 * kv;
    return p;
}

double gang__bd_stream_bytes(const gang_model *m)
{
    const gang_model_config *c = &m->cfg;
    double table = m->embed != NULL ? (double)c->vocab * c->hidden : 0.0;
    double head = m->lm_head != NULL ? (double)m->shard.vocab_count * c->hidden : 0.0;
    double held = (double)m->layer_count * bdm_layer_params(c) / m->topo.tp + table;
    /* The table's rows a step does not stream: all of them, or all but the tied head's. */
    double idle = m->lm_head_tied ? table - head : table;

    if (m->final_norm != NULL)
        held += c->hidden;
    if (!m->lm_head_tied)
        held += head;
    if (held <= 0.0)
        return (double)m->weight_bytes;
    return (double)m->weight_bytes * (held - idle) / held;
}

double gang__bd_kv_bytes_per_step(const bd_opts *o, uint32_t batch, size_t kv_elem_bytes)
{
    return (double)batch * (o->prompt + o->tokens / 2.0) * o->kv_token_elems *
           (double)kv_elem_bytes;
}

void gang__bd_model_fields(cJSON *line, const bd_opts *o, uint32_t batch, bd_result *res)
{
    double kv = gang__bd_kv_bytes_per_step(o, batch, res->kv_elem_bytes);
    double step = res->stream_bytes + kv;

    cJSON_AddNumberToObject(line, "weight_bytes", res->weight_bytes);
    cJSON_AddNumberToObject(line, "stream_bytes_per_step", gang_report_round(res->stream_bytes, 0));
    cJSON_AddNumberToObject(line, "kv_bytes_per_step", gang_report_round(kv, 0));
    cJSON_AddNumberToObject(line, "bytes_per_token", gang_report_round(step / batch, 0));
    if (o->read_gbps > 0.0 && step > 0.0) {
        double roof = (double)batch * o->read_gbps * 1e9 / step;

        cJSON_AddNumberToObject(line, "read_GBps", gang_report_round(o->read_gbps, 2));
        cJSON_AddNumberToObject(line, "roofline_tok_s", gang_report_round(roof, 1));
        res->roofline_ratio = res->decode_tps / roof;
        cJSON_AddNumberToObject(line, "roofline_ratio", gang_report_round(res->roofline_ratio, 3));
    }
}

/* The load options of storage name (validated by bdm_parse). */
static gang_load_options bdm_storage(const char *name)
{
    gang_load_options l = {NULL, NULL, 0, 0, 0};

    if (strcmp(name, "int8") == 0)
        l.quantize = "int8";
    else
        l.dtype = name;
    return l;
}

int gang__bd_parse_storages(const char *list, char (*names)[8], uint32_t *n, char *err,
                            size_t errlen)
{
    char buf[64], *save = NULL, *tok;

    *n = 0;
    gang_strlcpy(buf, list, sizeof(buf));
    for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        if (strcmp(tok, "f32") != 0 && strcmp(tok, "bf16") != 0 && strcmp(tok, "f16") != 0 &&
            strcmp(tok, "int8") != 0 && strcmp(tok, "auto") != 0) {
            gang_set_err(err, errlen, "--dtypes: '%s' is not one of auto, f32, bf16, f16, int8",
                         tok);
            return GANG_EUSAGE;
        }
        if (*n == BD_MAX_STORAGES) {
            gang_set_err(err, errlen, "--dtypes: at most %d storages", BD_MAX_STORAGES);
            return GANG_EUSAGE;
        }
        gang_strlcpy(names[(*n)++], tok, sizeof(names[0]));
    }
    if (*n == 0) {
        gang_set_err(err, errlen, "--dtypes needs at least one storage");
        return GANG_EUSAGE;
    }
    return 0;
}

/* --dtypes and --layouts into run; 0 or GANG_EUSAGE with the reason in err. */
static int bdm_parse(const bd_opts *o, bdm_run *run, char *err, size_t errlen)
{
    char buf[64], *save = NULL, *tok;
    int rc = gang__bd_parse_storages(o->dtypes, run->storages, &run->n_storages, err, errlen);

    if (rc != 0)
        return rc;
    gang_strlcpy(buf, o->layouts, sizeof(buf));
    for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        unsigned tp = 0, pp = 0;
        char extra;

        if (sscanf(tok, "%ux%u%c", &tp, &pp, &extra) != 2 || tp < 1 || pp < 1 ||
            tp * pp > BD_MAX_RANKS || run->n_layouts == BD_MAX_LAYOUTS ||
            (run->n_layouts == 0 && tp * pp != 1)) {
            gang_set_err(err, errlen,
                         "--layouts: '%s' is not a list of up to %d TPxPP layouts of at most %d "
                         "ranks, starting with 1x1",
                         o->layouts, BD_MAX_LAYOUTS, BD_MAX_RANKS);
            return GANG_EUSAGE;
        }
        run->layouts[run->n_layouts][0] = tp;
        run->layouts[run->n_layouts][1] = pp;
        run->n_layouts++;
    }
    if (run->n_storages == 0 || run->n_layouts == 0) {
        gang_set_err(err, errlen, "--dtypes and --layouts need at least one entry");
        return GANG_EUSAGE;
    }
    return 0;
}

/* The "model_info" line; sets o's shape from the model's config. */
static void bdm_info(bd_opts *o, const gang_model_config *mc)
{
    cJSON *line = gang_report_new("decode");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    double load[1];

    o->layers = mc->n_layers;
    o->hidden = mc->hidden;
    o->heads = mc->n_heads;
    o->kv_heads = mc->n_kv_heads;
    o->ffn = mc->ffn;
    o->vocab = mc->vocab;
    /* One token's keys and values over every layer, in elements (the point multiplies by
     * its cache type's size: `serve`'s auto type for the storage, bf16 for bf16 weights). */
    o->kv_token_elems = (double)mc->n_layers * 2.0 * mc->n_kv_heads * mc->head_dim;
    if (line == NULL)
        return;
    cJSON_AddStringToObject(line, "measure", "model_info");
    cJSON_AddStringToObject(line, "model", o->model);
    cJSON_AddNumberToObject(line, "layers", mc->n_layers);
    cJSON_AddNumberToObject(line, "hidden", mc->hidden);
    cJSON_AddNumberToObject(line, "heads", mc->n_heads);
    cJSON_AddNumberToObject(line, "kv_heads", mc->n_kv_heads);
    cJSON_AddNumberToObject(line, "ffn", mc->ffn);
    cJSON_AddNumberToObject(line, "vocab", mc->vocab);
    cJSON_AddStringToObject(line, "checkpoint_dtype", gang_dtype_name(mc->dtype));
    /* The typed matmul's pool and OpenBLAS get the same count (kernels-bench.h). */
    cJSON_AddNumberToObject(line, "cpu_threads", gang__kernels_cpu_threads(0));
    cJSON_AddNumberToObject(line, "cpus_online", (double)cpus);
    /* Other work on the machine moves every figure: the load says how much there was. */
    if (getloadavg(load, 1) == 1)
        cJSON_AddNumberToObject(line, "loadavg_1m", gang_report_round(load[0], 2));
    cJSON_AddNumberToObject(line, "prompt", o->prompt);
    cJSON_AddNumberToObject(line, "tokens", o->tokens);
    cJSON_AddNumberToObject(line, "iters", o->iters);
    cJSON_AddNumberToObject(line, "warmup", o->warmup);
    gang_report_emit(line);
}

/*
 * A "read_bandwidth" line; sets o->read_gbps. Measured once at the start and again just
 * before every 1x1 point (storage and batch name it then), whose roofline uses the value
 * measured next to it: the VM's bandwidth drifts by 20% over minutes, more than the
 * points it judges differ by. Returns 0 or the measurement's error.
 */
static int bdm_bandwidth(bd_opts *o, const char *storage, uint32_t batch)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t threads = cpus > 0 ? (uint32_t)cpus : 1;
    size_t bytes = (size_t)o->bw_mib << 20;
    double g[3];
    int rc = gang__read_bandwidth(bytes, threads, o->bw_passes, g);
    cJSON *line = gang_report_new("decode");

    if (line == NULL)
        return GANG_ENOMEM;
    cJSON_AddStringToObject(line, "measure", "read_bandwidth");
    if (storage != NULL) {
        cJSON_AddStringToObject(line, "before_storage", storage);
        cJSON_AddNumberToObject(line, "before_batch", batch);
    }
    cJSON_AddStringToObject(line, "method",
                            "every online CPU sums its slice of one buffer (first-touched by "
                            "it) as 64-bit integers in 8 lanes; bytes / pass time, median of "
                            "the passes after 1 untimed");
    cJSON_AddNumberToObject(line, "bytes", (double)bytes);
    cJSON_AddNumberToObject(line, "threads", threads);
    cJSON_AddNumberToObject(line, "passes", o->bw_passes);
    if (rc == 0) {
        o->read_gbps = g[0];
        cJSON_AddNumberToObject(line, "read_GBps", gang_report_round(g[0], 2));
        cJSON_AddNumberToObject(line, "read_GBps_min", gang_report_round(g[1], 2));
        cJSON_AddNumberToObject(line, "read_GBps_max", gang_report_round(g[2], 2));
    } else {
        cJSON_AddStringToObject(line, "error", gang_err_name(rc));
    }
    gang_report_emit(line);
    return rc;
}

/* Every point of storage s (index si): batches x layouts, 1x1 first. */
static void bdm_storage_points(bd_opts *o, const gang_model_config *mc, bdm_run *run, uint32_t si)
{
    bd_result base, res;
    uint32_t b, l;
    int rc;

    o->storage = run->storages[si];
    o->load = bdm_storage(o->storage);
    for (b = 0; b < o->n_batches; b++) {
        memset(&base, 0, sizeof(base));
        for (l = 0; l < run->n_layouts; l++) {
            bd_result *out = l == 0 ? &base : &res;

            if (l == 0 && bdm_bandwidth(o, o->storage, o->batches[b]) != 0) {
                run->failed++;
                break;
            }
            rc = gang__bd_point(o, mc, run->layouts[l][0], run->layouts[l][1], o->batches[b], 0,
                                l == 0 ? NULL : &base, out);
            if (out->refused) {
                /* Refused at the first point: the same storage is refused at every other. */
                gang_strlcpy(run->refused[si], "refused by the loader (see its line)",
                             sizeof(run->refused[si]));
                free(base.dec);
                return;
            }
            if (rc != 0) {
                run->failed++;
                if (l == 0)
                    break; /* no base to compare the other layouts against */
                continue;
            }
            if (l == 0) {
                run->cells[si][b].ran = 1;
                run->cells[si][b].decode_tps = base.decode_tps;
                run->cells[si][b].roofline_ratio = base.roofline_ratio;
            } else {
                free(res.dec);
            }
        }
        free(base.dec);
    }
}

/* The peer's best decode tokens/s at batch (over its dtypes and thread counts); 0: none. */
static const bd_peer_row *bdm_peer_best(const bd_peer *p, uint32_t batch)
{
    const bd_peer_row *best = NULL;

    for (uint32_t i = 0; i < p->n_rows; i++)
        if (p->rows[i].batch == batch && (best == NULL || p->rows[i].decode_tps > best->decode_tps))
            best = &p->rows[i];
    return best;
}

/* One "vs_transformers" line per storage that ran and batch the peer measured. */
static void bdm_ratios(const bd_opts *o, const bdm_run *run, const bd_peer *p)
{
    for (uint32_t si = 0; si < run->n_storages; si++) {
        for (uint32_t b = 0; b < o->n_batches; b++) {
            const bd_peer_row *best = bdm_peer_best(p, o->batches[b]);
            const bdm_cell *c = &run->cells[si][b];
            cJSON *line;

            if (!c->ran || best == NULL || best->decode_tps <= 0.0)
                continue;
            line = gang_report_new("decode");
            if (line == NULL)
                return;
            cJSON_AddStringToObject(line, "measure", "vs_transformers");
            cJSON_AddStringToObject(line, "storage", run->storages[si]);
            cJSON_AddNumberToObject(line, "batch", o->batches[b]);
            cJSON_AddNumberToObject(line, "ganglion_decode_tok_s",
                                    gang_report_round(c->decode_tps, 2));
            cJSON_AddNumberToObject(line, "transformers_decode_tok_s",
                                    gang_report_round(best->decode_tps, 2));
            cJSON_AddStringToObject(line, "transformers_dtype", best->dtype);
            cJSON_AddNumberToObject(line, "transformers_threads", best->threads);
            cJSON_AddNumberToObject(line, "ratio",
                                    gang_report_round(c->decode_tps / best->decode_tps, 3));
            gang_report_emit(line);
        }
    }
}

/* One "target" line: value against target, or n/a with why (value < 0). */
static void bdm_target(const char *name, double value, double target, const char *why)
{
    cJSON *line = gang_report_new("decode");

    if (line == NULL)
        return;
    cJSON_AddStringToObject(line, "measure", "target");
    cJSON_AddStringToObject(line, "name", name);
    cJSON_AddStringToObject(line, "storage", BDM_TARGET_STORAGE);
    cJSON_AddNumberToObject(line, "target", target);
    if (why != NULL) {
        cJSON_AddStringToObject(line, "verdict", "n/a");
        cJSON_AddStringToObject(line, "why", why);
    } else {
        cJSON_AddNumberToObject(line, "value", gang_report_round(value, 3));
        cJSON_AddStringToObject(line, "verdict", value >= target ? "PASS" : "FAIL");
    }
    gang_report_emit(line);
}

/* The three targets on the bf16 storage (file comment). */
static void bdm_targets(const bd_opts *o, const bdm_run *run, const bd_peer *p)
{
    static const struct {
        const char *name;
        uint32_t batch;
        int vs_peer;
        double target;
    } t[3] = {{"batch1_roofline_ratio", 1, 0, BDM_TARGET_ROOFLINE},
              {"batch1_vs_transformers", 1, 1, BDM_TARGET_BATCH1},
              {"batch32_vs_transformers", 32, 1, BDM_TARGET_BATCH32}};
    char why[400];
    int si = -1;

    for (uint32_t i = 0; i < run->n_storages; i++)
        if (strcmp(run->storages[i], BDM_TARGET_STORAGE) == 0)
            si = (int)i;
    for (int i = 0; i < 3; i++) {
        const bdm_cell *c = NULL;
        const bd_peer_row *best = t[i].vs_peer ? bdm_peer_best(p, t[i].batch) : NULL;

        for (uint32_t b = 0; si >= 0 && b < o->n_batches; b++)
            if (o->batches[b] == t[i].batch)
                c = &run->cells[si][b];
        if (si < 0)
            snprintf(why, sizeof(why), "storage %s not in --dtypes", BDM_TARGET_STORAGE);
        else if (run->refused[si][0])
            snprintf(why, sizeof(why), "storage %s %s", BDM_TARGET_STORAGE, run->refused[si]);
        else if (c == NULL)
            snprintf(why, sizeof(why), "batch %u not in --batch", t[i].batch);
        else if (!c->ran)
            snprintf(why, sizeof(why), "the point failed");
        else if (t[i].vs_peer && !p->ran)
            snprintf(why, sizeof(why), "transformers peer: %s", p->why);
        else if (t[i].vs_peer && best == NULL)
            snprintf(why, sizeof(why), "the peer did not measure batch %u", t[i].batch);
        else
            why[0] = '\0';
        if (why[0] != '\0')
            bdm_target(t[i].name, -1.0, t[i].target, why);
        else
            bdm_target(t[i].name,
                       t[i].vs_peer ? c->decode_tps / best->decode_tps : c->roofline_ratio,
                       t[i].target, NULL);
    }
}

/* The peer, or its "skipped" / "failed" line. */
static void bdm_peer(const bd_opts *o, bd_peer *p)
{
    cJSON *line;
    int rc = 0;

    memset(p, 0, sizeof(*p));
    if (o->no_peer)
        snprintf(p->why, sizeof(p->why), "skipped: --no-peer");
    else
        rc = gang__bd_peer_run(o, p);
    if (p->ran)
        return;
    if (rc != 0 && p->why[0] == '\0')
        snprintf(p->why, sizeof(p->why), "failed: %s", gang_err_name(rc));
    fprintf(stderr, "ganglion bench decode: transformers peer: %s\n", p->why);
    line = gang_report_new("decode");
    if (line == NULL)
        return;
    cJSON_AddStringToObject(line, "side", "transformers");
    cJSON_AddStringToObject(line, "peer", p->why);
    gang_report_emit(line);
}

int gang__bd_main_model(bd_opts *o)
{
    gang_model_config mc;
    bdm_run *run = calloc(1, sizeof(*run));
    bd_peer *peer = calloc(1, sizeof(*peer));
    char err[512];
    int rc = GANG_EXIT_OK;

    if (run == NULL || peer == NULL) {
        rc = GANG_EXIT_INTERNAL;
        goto out_free;
    }
    if (bdm_parse(o, run, err, sizeof(err)) != 0) {
        fprintf(stderr, "ganglion bench decode: %s\n", err);
        rc = GANG_EXIT_USAGE;
        goto out_free;
    }
    if (gang_model_config_read(o->model, &mc, err, sizeof(err)) != 0) {
        fprintf(stderr, "ganglion bench decode: %s\n", err);
        rc = GANG_EXIT_MODEL;
        goto out_free;
    }
    o->no_agree = run->n_layouts == 1;
    bdm_info(o, &mc);
    if (bdm_bandwidth(o, NULL, 0) != 0) {
        rc = GANG_EXIT_TEMPFAIL;
        goto out_free;
    }
    for (uint32_t si = 0; si < run->n_storages; si++)
        bdm_storage_points(o, &mc, run, si);
    bdm_peer(o, peer);
    bdm_ratios(o, run, peer);
    bdm_targets(o, run, peer);
    rc = run->failed > 0 ? GANG_EXIT_TEMPFAIL : GANG_EXIT_OK;

out_free:
    free(run);
    free(peer);
    return rc;
}
