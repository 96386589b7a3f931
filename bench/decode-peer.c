/*
 * The transformers peer of `ganglion bench decode --model`: bench/hf-decode.py run with
 * the reference Python (scripts/fetch-reference.sh) on the same model, batches, prompt
 * length and token count, after the engine's points (the two never run at once). Its
 * stdout (JSON lines, one per point) goes to a temporary file and its stderr to a log;
 * the script gets --peer-timeout-s in all, then SIGTERM and SIGKILL to its process group.
 * Each of its lines is printed again, in order, so one run's output holds both sides.
 */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench.h"
#include "decode.h"
#include "proc.h"
#include "report.h"
#include "ganglion/common.h"
#include "ganglion/model.h"

/* Longest line of the script's output taken; longer ones are not the script's. */
#define BDP_MAX_LINE 4096

/* The peer's --dtypes: the half and full precisions of ours it has (int8: none). */
static void bdp_dtypes(const char *ours, char *out, size_t cap)
{
    static const char *const torch_has[3] = {"f32", "bf16", "f16"};
    char buf[64], *save = NULL, *tok;

    out[0] = '\0';
    gang_strlcpy(buf, ours, sizeof(buf));
    for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save))
        for (int i = 0; i < 3; i++)
            if (strcmp(tok, torch_has[i]) == 0 && strlen(out) + strlen(tok) + 2 <= cap) {
                if (out[0] != '\0')
                    strcat(out, ",");
                strcat(out, tok);
            }
    if (out[0] == '\0')
        gang_strlcpy(out, "f32", cap);
}

/* Keeps row (dtype, batch, threads, tok/s) in p when it beats that (dtype, batch)'s best. */
static void bdp_keep(bd_peer *p, const char *dtype, uint32_t batch, uint32_t threads, double tps)
{
    uint32_t i;

    for (i = 0; i < p->n_rows; i++)
        if (p->rows[i].batch == batch && strcmp(p->rows[i].dtype, dtype) == 0)
            break;
    if (i == p->n_rows) {
        if (p->n_rows == BD_MAX_PEER_ROWS)
            return;
        p->n_rows++;
        memset(&p->rows[i], 0, sizeof(p->rows[i]));
        gang_strlcpy(p->rows[i].dtype, dtype, sizeof(p->rows[i].dtype));
        p->rows[i].batch = batch;
    }
    if (tps > p->rows[i].decode_tps) {
        p->rows[i].decode_tps = tps;
        p->rows[i].threads = threads;
    }
}

/* Prints every JSON line of the script's output again and keeps its points in p. */
static void bdp_collect(FILE *f, bd_peer *p)
{
    char line[BDP_MAX_LINE];

    while (fgets(line, sizeof(line), f) != NULL) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *dt, *b, *t, *tps;

        if (o == NULL || !cJSON_IsObject(o) || !cJSON_IsString(cJSON_GetObjectItem(o, "bench"))) {
            cJSON_Delete(o);
            continue;
        }
        dt = cJSON_GetObjectItem(o, "dtype");
        b = cJSON_GetObjectItem(o, "batch");
        t = cJSON_GetObjectItem(o, "threads");
        tps = cJSON_GetObjectItem(o, "decode_tok_s");
        if (cJSON_IsString(dt) && cJSON_IsNumber(b) && cJSON_IsNumber(t) && cJSON_IsNumber(tps) &&
            b->valuedouble >= 1 && b->valuedouble <= 1 << 20 && tps->valuedouble > 0 &&
            t->valuedouble >= 1 && t->valuedouble <= 1 << 20)
            bdp_keep(p, dt->valuestring, (uint32_t)b->valuedouble, (uint32_t)t->valuedouble,
                     tps->valuedouble);
        gang_report_emit(o);
    }
}

/* The script's command line into argv (numbers in bufs, copies of o's paths in paths: exec
 * takes its arguments as char *). */
static void bdp_argv(const bd_opts *o, char *argv[24], char bufs[7][128],
                     char paths[3][BD_PATH_MAX])
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int n = 0, len = 0;

    bdp_dtypes(o->dtypes, bufs[0], sizeof(bufs[0]));
    bufs[1][0] = '\0';
    for (uint32_t i = 0; i < o->n_batches; i++)
        len += snprintf(bufs[1] + len, sizeof(bufs[1]) - (size_t)len, "%s%u", i ? "," : "",
                        o->batches[i]);
    /* torch's thread counts 1 and 2 at batch 1 (the best kept), as the CPUs allow. */
    snprintf(bufs[2], sizeof(bufs[2]), "%s", cpus >= 2 ? "1,2" : "1");
    snprintf(bufs[3], sizeof(bufs[3]), "%u", o->prompt);
    snprintf(bufs[4], sizeof(bufs[4]), "%u", o->tokens);
    snprintf(bufs[5], sizeof(bufs[5]), "%u", o->peer_iters);
    snprintf(bufs[6], sizeof(bufs[6]), "%u", o->peer_budget_s);
    snprintf(paths[0], BD_PATH_MAX, "%s", o->peer_python);
    snprintf(paths[1], BD_PATH_MAX, "%s", o->peer_script);
    snprintf(paths[2], BD_PATH_MAX, "%s", o->model);
    argv[n++] = paths[0];
    argv[n++] = paths[1];
    argv[n++] = "--model";
    argv[n++] = paths[2];
    argv[n++] = "--dtypes";
    argv[n++] = bufs[0];
    argv[n++] = "--batch";
    argv[n++] = bufs[1];
    argv[n++] = "--threads";
    argv[n++] = bufs[2];
    argv[n++] = "--prompt";
    argv[n++] = bufs[3];
    argv[n++] = "--tokens";
    argv[n++] = bufs[4];
    argv[n++] = "--iters";
    argv[n++] = bufs[5];
    argv[n++] = "--warmup";
    argv[n++] = "1";
    argv[n++] = "--budget-s";
    argv[n++] = bufs[6];
    argv[n] = NULL;
}

/* Why the peer cannot run here (p->why), or 0 when it can. */
static int bdp_available(const bd_opts *o, bd_peer *p)
{
    if (gang_model_is_gguf(o->model))
        snprintf(p->why, sizeof(p->why),
                 "skipped: %s is a GGUF file; transformers loads a Hugging Face directory "
                 "(bench that directory for the peer)",
                 o->model);
    else if (access(o->peer_python, X_OK) != 0)
        snprintf(p->why, sizeof(p->why),
                 "skipped: no reference Python at %s (scripts/fetch-reference.sh makes it)",
                 o->peer_python);
    else if (access(o->peer_script, R_OK) != 0)
        snprintf(p->why, sizeof(p->why), "skipped: no peer script at %s (--peer-script)",
                 o->peer_script);
    else
        return 0;
    return 1;
}

int gang__bd_peer_run(const bd_opts *o, bd_peer *p)
{
    char out_path[] = "/tmp/ganglion-hf-decode-out-XXXXXX";
    char log_path[] = "/tmp/ganglion-hf-decode-log-XXXXXX";
    char *argv[24], bufs[7][128], paths[3][BD_PATH_MAX];
    int out_fd = -1, log_fd = -1, status = 0, rc = 0, keep_log = 0;
    pid_t pid = 0;
    FILE *f;

    if (bdp_available(o, p))
        return 0;
    out_fd = mkstemp(out_path);
    log_fd = mkstemp(log_path);
    if (out_fd < 0 || log_fd < 0) {
        rc = GANG_EIO;
        goto out_close;
    }
    bdp_argv(o, argv, bufs, paths);
    fprintf(stderr, "ganglion bench decode: transformers peer: %s %s (log %s)\n", argv[0], argv[1],
            log_path);
    gang_spawn s = {.path = argv[0],
                    .out_fd = out_fd,
                    .err_fd = log_fd,
                    .close_fd = -1,
                    .new_group = 1,
                    .death_signal = SIGTERM};
    rc = gang_proc_spawn(argv, &s, &pid);
    if (rc != 0)
        goto out_close;
    if (gang_proc_reap_until(&pid, &status, 1,
                             gang_now_ms() + (uint64_t)o->peer_timeout_s * 1000u) > 0) {
        gang_proc_stop(&pid, 1, 1, BENCH_STOP_GRACE_MS, BENCH_KILL_GRACE_MS);
        snprintf(p->why, sizeof(p->why), "failed: not done within --peer-timeout-s %u; log %s",
                 o->peer_timeout_s, log_path);
        keep_log = 1;
    }
    f = fdopen(out_fd, "r");
    if (f == NULL) {
        rc = GANG_EIO;
        goto out_close;
    }
    out_fd = -1;
    rewind(f);
    bdp_collect(f, p);
    fclose(f);
    if (!keep_log && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
        snprintf(p->why, sizeof(p->why), "failed: exit status 0x%x, %u points; log %s",
                 (unsigned)status, p->n_rows, log_path);
        keep_log = 1;
    }
    /* A script that measured some points before failing still counts for those. */
    p->ran = p->n_rows > 0;

out_close:
    if (out_fd >= 0)
        close(out_fd);
    if (log_fd >= 0)
        close(log_fd);
    unlink(out_path);
    if (!keep_log)
        unlink(log_path);
    return rc;
}
