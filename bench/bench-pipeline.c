/*
 * Pipeline benchmark: `ganglion bench pipeline`, measured throughput of the microbatched
 * schedule against its bubble bound.
 *
 * Model: the whole batch costs T = --stage-ms on every one of the P stages, so one of the
 * M microbatches costs W = T / M per stage. The GPipe forward fills and drains the
 * pipeline in P - 1 slots each, so one batch ideally takes (M + P - 1) W; a pipeline
 * without bubbles would take T. The bubble bound on efficiency is therefore
 *
 *     bound = T / ((M + P - 1) W) = M / (M + P - 1)
 *
 * and, with batch_ms the measured median batch time,
 *
 *     efficiency = T / batch_ms          ratio = efficiency / bound
 *
 * ratio is 1 when the schedule and the communicator add nothing to the bubbles; the
 * target is ratio >= 0.9 for P = 2..4, M = 4..16.
 *
 * Synthetic work: a stage "computes" a microbatch by sleeping until an absolute deadline
 * W after it began (clock_nanosleep, TIMER_ABSTIME, with the thread's timer slack cut to
 * 1 ns), not by spinning. The P stages are threads of this process and the machines this
 * runs on may have two cores; spinning stages would fight for them and the benchmark
 * would measure CPU contention instead of the schedule. Sleeping makes W a fixed wall-
 * clock cost, so the benchmark measures exactly what the issue asks: the bubbles plus the
 * overhead of the schedule and of the socket communicator (activation transfers of
 * --bytes per microbatch, default 64 KiB, and the result path back to stage 0).
 *
 * Schedule: gang_pipeline_run of parallel/pipeline.c, the one the engine serves with
 * (see the comment there for the order and why it cannot deadlock): this file only
 * supplies its callbacks, WORK = the synthetic sleep, SEND/RECV_ACT and SEND/RECV_RESULT
 * = socket send and recv of --bytes, with tag k for microbatch k between stages and tag
 * M + k for its result. The microbatches are the batch's units (one unit each).
 *
 * Stage 0 times each batch from its start to the arrival of the last result. No barrier
 * separates batches: when stage 0 has every result, every other stage has finished the
 * batch and waits for the next one, so batches do not overlap. Each message carries the
 * microbatch index stage 0 wrote into it, and every receiver checks it.
 *
 * Method (nccl-tests style): --warmup untimed batches, then --iters timed ones; the line
 * reports the median, min and max batch time, and ratio from the median.
 *
 * Every wait has a deadline: every communicator call takes one, and the main thread waits
 * for the stage threads at most --timeout-s per point; past it, it aborts every
 * communicator (which makes blocked calls return promptly), and if a thread still does
 * not finish it reports the failure and exits 75 without joining.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "ganglion/comm.h"
#include "ganglion/common.h"
#include "ganglion/parallel.h"

#include "bench.h"
#include "report.h"

#define BP_MAX_PP 16
#define BP_MAX_POINTS 16
#define BP_MIN_BYTES ((size_t)sizeof(uint32_t))
#define BP_MAX_BYTES ((size_t)64 << 20)
#define BP_INIT_TIMEOUT_MS 20000
#define BP_ABORT_GRACE_MS 5000
#define BP_TARGET 0.9
#define BP_HOST "127.0.0.1"
#define BP_WATCHDOG UINT32_MAX /* bp_fail's rank when the main thread gives up */

/* Command-line options; a zero pp or microbatches means "sweep that dimension". */
typedef struct bp_opts {
    int pp;           /* stages, or 0 for 2, 3, 4 */
    int microbatches; /* microbatches per batch, or 0 for 4, 8, 16 */
    int stage_ms;     /* cost of the whole batch on one stage */
    size_t bytes;     /* activation bytes per microbatch */
    int iters;        /* timed batches */
    int warmup;       /* untimed batches first */
    int timeout_s;    /* deadline of one point */
} bp_opts;

/* State shared by the stage threads of one point; lock guards the fields marked so. */
typedef struct bp_run {
    const bp_opts *o;
    uint32_t pp, mb;        /* this point's shape */
    uint64_t work_ns;       /* W: synthetic work per microbatch and stage */
    uint64_t op_timeout_ms; /* deadline of every communicator call */
    char blob[256];         /* rank 0's bootstrap blob */
    size_t blob_len;
    gang_comm_listener *listener; /* consumed by rank 0's gang_comm_init */
    double *batch_ms;             /* iters timed batch times, written by stage 0 */
    pthread_mutex_t lock;
    pthread_cond_t cond;         /* signalled when a stage thread finishes */
    int finished;                /* lock: stage threads that returned */
    int aborted;                 /* lock: every communicator is (to be) aborted */
    gang_comm *comms[BP_MAX_PP]; /* lock: live communicators, for gang_comm_abort */
    int rc;                      /* lock: first error of any stage */
    char why[256];               /* lock: what failed first */
} bp_run;

/* One stage thread. */
typedef struct bp_stage {
    bp_run *run;
    uint32_t rank; /* pipeline stage */
    pthread_t th;
} bp_stage;

/*
 * Records the first failure of the point and aborts every live communicator, so that the
 * other stages, blocked on a peer that will never answer, return at once instead of at
 * their deadlines. rank is the failing stage, or BP_WATCHDOG. Safe from any thread.
 */
static void bp_fail(bp_run *r, int rc, const char *what, uint32_t rank)
{
    pthread_mutex_lock(&r->lock);
    if (r->rc == 0) {
        r->rc = rc;
        if (rank == BP_WATCHDOG)
            snprintf(r->why, sizeof r->why, "%s: %s", what, gang_err_name(rc));
        else
            snprintf(r->why, sizeof r->why, "stage %u: %s: %s", (unsigned)rank, what,
                     gang_err_name(rc));
    }
    r->aborted = 1;
    for (uint32_t i = 0; i < r->pp; i++) {
        if (r->comms[i] != NULL)
            gang_comm_abort(r->comms[i]);
    }
    pthread_mutex_unlock(&r->lock);
}

/* The synthetic work of one microbatch: sleeps until ns after now (see the file comment). */
static void bp_work(uint64_t ns)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ns += (uint64_t)ts.tv_nsec;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* ---------------------------------------------------------------------------------
 * One stage.
 * --------------------------------------------------------------------------------- */

/* The callbacks' view of one stage: its communicator and its one activation buffer
 * (every send and recv completes before the next one, so one suffices). */
typedef struct bp_ctx {
    bp_run *r;
    gang_comm *c;
    uint32_t rank;    /* pipeline stage */
    uint8_t *buf;     /* run->o->bytes */
    const char *what; /* the step that failed */
} bp_ctx;

/* WORK: the synthetic work of one microbatch. */
static int bp_cb_work(void *ctx, const gang_pipeline_mb *mb, uint64_t deadline)
{
    bp_ctx *x = ctx;

    (void)mb;
    (void)deadline;
    bp_work(x->r->work_ns);
    return 0;
}

/* Sends buf to stage peer; stage 0 first stamps it with the microbatch index. */
static int bp_cb_send(void *ctx, const gang_pipeline_mb *mb, uint32_t peer, uint32_t tag,
                      uint64_t deadline)
{
    bp_ctx *x = ctx;
    uint64_t left;
    int rc;

    x->what = peer == 0 ? "send result" : "send activation";
    if (x->rank == 0)
        memcpy(x->buf, &mb->index, sizeof mb->index);
    rc = gang_deadline_left(deadline, &left);
    return rc != 0 ? rc : gang_comm_send(x->c, x->buf, x->r->o->bytes, peer, tag, left);
}

/* Receives buf from stage peer and checks that it carries microbatch mb's index. */
static int bp_cb_recv(void *ctx, const gang_pipeline_mb *mb, uint32_t peer, uint32_t tag,
                      uint64_t deadline)
{
    bp_ctx *x = ctx;
    uint32_t idx;
    uint64_t left;
    int rc;

    x->what = x->rank == 0 ? "recv result" : "recv activation";
    rc = gang_deadline_left(deadline, &left);
    if (rc == 0)
        rc = gang_comm_recv(x->c, x->buf, x->r->o->bytes, peer, tag, left);
    if (rc != 0)
        return rc;
    memcpy(&idx, x->buf, sizeof idx);
    if (idx != mb->index) {
        x->what = "message of the wrong microbatch";
        return GANG_EPROTO;
    }
    return 0;
}

/*
 * Runs one batch of the schedule (gang_pipeline_run, M microbatches of one unit each) on
 * stage x->rank within op_timeout_ms. Returns 0 or the first error; x->what names the
 * failing step.
 */
static int bp_batch(bp_ctx *x)
{
    const gang_pipeline_ops ops = {.ctx = x,
                                   .work = bp_cb_work,
                                   .send_act = bp_cb_send,
                                   .recv_act = bp_cb_recv,
                                   .send_result = bp_cb_send,
                                   .recv_result = bp_cb_recv};

    x->what = "schedule";
    return gang_pipeline_run(&ops, x->rank, x->r->pp, x->r->mb, x->r->mb,
                             gang_deadline_after(x->r->op_timeout_ms));
}

/*
 * Thread of stage st->rank: joins the communicator, runs warm-up and timed batches (stage
 * 0 records the timed ones in run->batch_ms), meets the others at a closing barrier so no
 * stage frees its sockets while a message to it is in flight, and frees the communicator.
 * Any failure goes to bp_fail(). Always counts itself in run->finished.
 */
static void *bp_stage_main(void *arg)
{
    bp_stage *st = arg;
    bp_run *r = st->run;
    gang_comm_config cfg = {.backend = GANG_COMM_SOCKET,
                            .rank = st->rank,
                            .world_size = r->pp,
                            .blob = (const uint8_t *)r->blob,
                            .blob_len = r->blob_len,
                            .listener = st->rank == 0 ? r->listener : NULL,
                            .advertise_host = BP_HOST,
                            .timeout_ms = BP_INIT_TIMEOUT_MS};
    gang_comm *c = NULL;
    uint8_t *buf = NULL;
    const char *what = "init";
    int rc, aborted;

    /* The default 50 us slack would be added to every synthetic microbatch. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    rc = gang_comm_init(&cfg, &c);
    if (rc != 0)
        goto out_fail;
    pthread_mutex_lock(&r->lock);
    r->comms[st->rank] = c;
    aborted = r->aborted;
    pthread_mutex_unlock(&r->lock);
    if (aborted) {
        rc = GANG_EABORTED;
        goto out_fail;
    }
    buf = calloc(1, r->o->bytes);
    if (buf == NULL) {
        what = "allocate activations";
        rc = GANG_ENOMEM;
        goto out_fail;
    }
    for (int b = 0; b < r->o->warmup + r->o->iters; b++) {
        bp_ctx x = {.r = r, .c = c, .rank = st->rank, .buf = buf};
        uint64_t t0 = gang_now_ns();

        rc = bp_batch(&x);
        if (rc != 0) {
            what = x.what;
            goto out_fail;
        }
        if (st->rank == 0 && b >= r->o->warmup)
            r->batch_ms[b - r->o->warmup] = (double)(gang_now_ns() - t0) / 1e6;
    }
    what = "closing barrier";
    rc = gang_comm_barrier(c, r->op_timeout_ms);
    if (rc != 0)
        goto out_fail;
    goto out_free;

out_fail:
    bp_fail(r, rc, what, st->rank);
out_free:
    pthread_mutex_lock(&r->lock);
    r->comms[st->rank] = NULL;
    pthread_mutex_unlock(&r->lock);
    gang_comm_free(c);
    free(buf);
    pthread_mutex_lock(&r->lock);
    r->finished++;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

/* ---------------------------------------------------------------------------------
 * One point: P stage threads, M microbatches.
 * --------------------------------------------------------------------------------- */

/*
 * Waits until `started` stage threads have finished or deadline_ns (monotonic) passes.
 * Returns 1 when they all finished. Called with r->lock held.
 */
static int bp_wait_locked(bp_run *r, int started, uint64_t deadline_ns)
{
    while (r->finished < started) {
        uint64_t now = gang_now_ns();
        struct timespec ts;

        if (now >= deadline_ns)
            return 0;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (deadline_ns - now);
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&r->cond, &r->lock, &ts);
    }
    return 1;
}

/*
 * Measures one point and prints its JSON line; *ratio receives its ratio (NAN when not
 * measured). Returns 0, a negative GANG_E* when the stages failed (the line then carries
 * "error"), or exits the process with 75 when a stage thread ignores the abort and cannot
 * be joined.
 */
static int bp_point(const bp_opts *o, uint32_t pp, uint32_t mb, double *ratio)
{
    bp_run r = {.o = o, .pp = pp, .mb = mb};
    bp_stage st[BP_MAX_PP];
    pthread_condattr_t ca;
    int started = 0, rc, done;
    uint64_t deadline;
    double t_ms = (double)o->stage_ms, ideal_ms, bound;
    cJSON *line = gang_report_new("pipeline");

    *ratio = NAN;
    r.work_ns = (uint64_t)o->stage_ms * 1000000u / mb;
    r.op_timeout_ms = (uint64_t)o->timeout_s * 1000u;
    pthread_mutex_init(&r.lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r.cond, &ca);
    pthread_condattr_destroy(&ca);

    r.batch_ms = calloc((size_t)o->iters, sizeof *r.batch_ms);
    if (r.batch_ms == NULL || line == NULL) {
        rc = GANG_ENOMEM;
        snprintf(r.why, sizeof r.why, "out of memory");
        goto out_line;
    }
    rc = gang_comm_socket_listen(BP_HOST, &r.listener, r.blob, sizeof r.blob - 1, &r.blob_len);
    if (rc != 0) {
        snprintf(r.why, sizeof r.why, "listen: %s", gang_err_name(rc));
        goto out_line;
    }
    deadline = gang_now_ns() + (uint64_t)o->timeout_s * 1000000000u;
    for (uint32_t i = 0; i < pp; i++) {
        st[i] = (bp_stage){.run = &r, .rank = i};
        if (pthread_create(&st[i].th, NULL, bp_stage_main, &st[i]) != 0) {
            if (i == 0)
                gang_comm_listener_free(r.listener); /* no thread took it over */
            bp_fail(&r, GANG_ENOMEM, "pthread_create", BP_WATCHDOG);
            break;
        }
        started++;
    }

    pthread_mutex_lock(&r.lock);
    done = bp_wait_locked(&r, started, deadline);
    pthread_mutex_unlock(&r.lock);
    if (!done) {
        bp_fail(&r, GANG_ETIMEDOUT, "point deadline (--timeout-s)", BP_WATCHDOG);
        pthread_mutex_lock(&r.lock);
        done = bp_wait_locked(&r, started, gang_now_ns() + BP_ABORT_GRACE_MS * 1000000ull);
        pthread_mutex_unlock(&r.lock);
        if (!done) {
            fprintf(stderr,
                    "ganglion bench pipeline: pp=%u microbatches=%u: stage threads "
                    "did not stop %d ms after the abort; giving up\n",
                    (unsigned)pp, (unsigned)mb, BP_ABORT_GRACE_MS);
            fflush(stdout);
            exit(GANG_EXIT_TEMPFAIL);
        }
    }
    for (int i = 0; i < started; i++)
        pthread_join(st[i].th, NULL);
    if (started < (int)pp && rc == 0)
        rc = GANG_ENOMEM;
    if (r.rc != 0)
        rc = r.rc;

out_line:
    if (line == NULL) {
        if (rc == 0)
            rc = GANG_ENOMEM;
        goto out_free;
    }
    ideal_ms = (double)(mb + pp - 1) * t_ms / mb;
    bound = (double)mb / (mb + pp - 1);
    cJSON_AddStringToObject(line, "backend", "socket");
    cJSON_AddNumberToObject(line, "pp", pp);
    cJSON_AddNumberToObject(line, "microbatches", mb);
    cJSON_AddNumberToObject(line, "stage_ms", t_ms);
    gang_report_add_num(line, "microbatch_ms", t_ms / mb, 4);
    cJSON_AddNumberToObject(line, "bytes", (double)o->bytes);
    cJSON_AddNumberToObject(line, "warmup", o->warmup);
    cJSON_AddNumberToObject(line, "iters", o->iters);
    gang_report_add_num(line, "ideal_ms", ideal_ms, 3);
    if (rc == 0) {
        double p50 = gang_report_add_stats(line, "batch_ms", r.batch_ms, o->iters, 3);
        double eff = t_ms / p50;
        *ratio = eff / bound;
        gang_report_add_num(line, "efficiency", eff, 4);
        gang_report_add_num(line, "bound", bound, 4);
        gang_report_add_num(line, "ratio", *ratio, 4);
        cJSON_AddBoolToObject(line, "target_met", *ratio >= BP_TARGET);
    } else {
        gang_report_add_num(line, "bound", bound, 4);
        cJSON_AddStringToObject(line, "error", r.why[0] ? r.why : gang_err_name(rc));
    }
    gang_report_emit(line);

out_free:
    free(r.batch_ms);
    pthread_cond_destroy(&r.cond);
    pthread_mutex_destroy(&r.lock);
    return rc;
}

/* ---------------------------------------------------------------------------------
 * Command line and sweep.
 * --------------------------------------------------------------------------------- */

/* The command line as the option table holds it; 0 for pp / microbatches: sweep. */
typedef struct bp_flags {
    int64_t pp, microbatches, stage_ms, bytes, iters, warmup, timeout_s;
} bp_flags;

#define BP_INT(f_, fld, d, l, h, hp) GANG_OPT_INT(bp_flags, f_, fld, #d, l, h, hp)
static const gang_param_info bp_items[] = {
    BP_INT("pp", pp, 0, 2, BP_MAX_PP, "stages (default: sweep 2, 3, 4)"),
    BP_INT("microbatches", microbatches, 0, 1, 4096, "per batch (default: sweep 4, 8, 16)"),
    BP_INT("stage-ms", stage_ms, 40, 1, 600000, "synthetic work of a whole batch per stage"),
    BP_INT("bytes", bytes, 65536, (int64_t)BP_MIN_BYTES, (int64_t)BP_MAX_BYTES,
           "activation bytes per microbatch"),
    BP_INT("iters", iters, 10, 1, 100000, "timed batches"),
    BP_INT("warmup", warmup, 2, 0, 100000, "untimed batches first"),
    BP_INT("timeout-s", timeout_s, 60, 1, 86400, "deadline of one point"),
};
static const gang_opt_table bp_table = GANG_OPT_TABLE(bp_items);
static const gang_opt_cmd bp_cmd = {
    "bench pipeline", "[flags]",
    "P stage threads connected by the socket communicator run the GPipe forward schedule on\n"
    "M microbatches; each line reports the median, min and max batch time and ratio =\n"
    "measured efficiency / bubble bound M/(M+P-1).",
    &bp_table, 0};

/* Parses argv into o. Returns 0, GANG_OPTS_HELP, or GANG_EUSAGE after printing why. */
static int bp_parse(int argc, char **argv, bp_opts *o)
{
    bp_flags f;

    memset(&f, 0, sizeof(f));
    int rc = gang_opts_cli(&bp_cmd, &f, argc, argv, NULL, NULL);
    if (rc != 0)
        return rc;
    o->pp = (int)f.pp;
    o->microbatches = (int)f.microbatches;
    o->stage_ms = (int)f.stage_ms;
    o->bytes = (size_t)f.bytes;
    o->iters = (int)f.iters;
    o->warmup = (int)f.warmup;
    o->timeout_s = (int)f.timeout_s;
    return 0;
}

int gang_bench_pipeline_main(int argc, char **argv)
{
    static const int sweep_pp[] = {2, 3, 4}, sweep_mb[] = {4, 8, 16};
    bp_opts o = {
        .stage_ms = 40, .bytes = (size_t)64 << 10, .iters = 10, .warmup = 2, .timeout_s = 60};
    double ratios[BP_MAX_POINTS];
    int npp, nmb, nratios = 0, failed = 0, rc = 0;
    cJSON *sum;

    int prc0 = bp_parse(argc, argv, &o);
    if (prc0 != 0)
        return prc0 == GANG_OPTS_HELP ? GANG_EXIT_OK : GANG_EXIT_USAGE;
    npp = o.pp ? 1 : 3;
    nmb = o.microbatches ? 1 : 3;
    for (int a = 0; a < npp; a++) {
        for (int b = 0; b < nmb; b++) {
            uint32_t pp = (uint32_t)(o.pp ? o.pp : sweep_pp[a]);
            uint32_t mb = (uint32_t)(o.microbatches ? o.microbatches : sweep_mb[b]);
            double ratio;
            int prc = bp_point(&o, pp, mb, &ratio);

            if (prc != 0) {
                failed++;
                rc = prc;
            } else {
                ratios[nratios++] = ratio;
            }
        }
    }

    sum = gang_report_new("pipeline");
    if (sum != NULL) {
        double min = INFINITY;

        for (int i = 0; i < nratios; i++)
            min = ratios[i] < min ? ratios[i] : min;
        cJSON_AddStringToObject(sum, "summary",
                                "ratio = (stage_ms / batch_ms_p50) / (M / (M + P - 1))");
        cJSON_AddNumberToObject(sum, "points", nratios);
        cJSON_AddNumberToObject(sum, "failed", failed);
        cJSON_AddNumberToObject(sum, "target", BP_TARGET);
        if (nratios > 0)
            gang_report_add_num(sum, "min_ratio", min, 4);
        else
            cJSON_AddNullToObject(sum, "min_ratio");
        cJSON_AddBoolToObject(sum, "target_met", failed == 0 && nratios > 0 && min >= BP_TARGET);
        if (rc != 0)
            cJSON_AddStringToObject(sum, "error", gang_err_name(rc));
        gang_report_emit(sum);
    }
    if (rc == GANG_ENOMEM)
        return GANG_EXIT_INTERNAL;
    return rc != 0 ? GANG_EXIT_TEMPFAIL : GANG_EXIT_OK;
}
