/*
 * Communicator benchmark: `ganglion bench allreduce` and `ganglion bench alltoall`, in the
 * manner of nccl-tests' all_reduce_perf and alltoall_perf.
 *
 * Method: for every message size (4 KiB, then times 4, up to 64 MiB of f32) each rank runs
 * warm-up all-reduces that are not timed, then timed calls, each timed on its own, and
 * reports their median (a call preempted by another process on this shared machine moves
 * a mean, not the median). Across ranks the benchmark prints the average, the minimum and
 * the maximum of those medians; bandwidths come from the average, as nccl-tests does:
 *
 *     algbw = bytes / time          busbw = algbw * 2 (n - 1) / n
 *
 * busbw is the rate a ring all-reduce drives every link at, so it can be compared across
 * rank counts and against the hardware. For the all-to-all (gang_comm_all_to_all_v, the
 * dispatch of expert parallelism, issue #25) a message size is what each rank sends in
 * all, bytes / n to every rank itself included, and busbw = algbw * (n - 1) / n (the part
 * that crosses a link); its peer is MPI_Alltoallv on the same sizes, and its target is a
 * ratio >= 1.0 at the sizes a decode step sends (<= 256 KiB per rank). The peer, Open MPI's
 * MPI_Allreduce on the same sizes with the same iteration counts (bench/mpi-allreduce.c under
 * mpirun), runs in the same invocation; every line carries ratio = ganglion busbw / MPI busbw.
 *
 * The buffers hold zeros so that repeated in-place sums neither overflow to infinity nor
 * fall into denormals, either of which would time the FPU instead of the communicator;
 * the peer uses zeros too.
 *
 * Every wait has a deadline: forked ranks are SIGKILLed and mpirun is stopped (SIGTERM,
 * then SIGKILL to its process group) when --timeout-s passes, and every child is reaped.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ganglion/comm.h"
#include "ganglion/common.h"

#include "bench.h"
#include "proc.h"
#include "report.h"

#define BC_MIN_BYTES ((size_t)4096)
#define BC_MAX_BYTES ((size_t)64 << 20)
#define BC_MAX_SIZES 16
#define BC_BUDGET_BYTES ((size_t)256 << 20) /* timed bytes per rank and size, roughly */
#define BC_MIN_ITERS 5
#define BC_MAX_ITERS 100
#define BC_OP_TIMEOUT_MS 60000
#define BC_STOP_GRACE_MS 5000
#define BC_LINE_MAX 4096
#define BC_TARGET 0.8
#define BC_TARGET_MIN_BYTES ((size_t)1 << 20)
#define BC_A2A_TARGET 1.0
#define BC_A2A_TARGET_MAX_BYTES ((size_t)256 << 10)

/* Command-line options and the size schedule derived from them. */
typedef struct bc_opts {
    int op;                     /* 0: all-reduce, 1: all-to-all(v) */
    const char *op_name;        /* "allreduce" or "alltoall": the report's bench name */
    int64_t ranks;              /* world size */
    char backend_name[16];      /* --backend: socket or mpi */
    gang_comm_backend backend;  /* from backend_name */
    int64_t max_bytes;          /* largest message */
    int64_t timeout_s;          /* deadline of the ganglion run and of the peer run */
    int no_peer;                /* skip mpirun mpi-allreduce */
    int nsizes;                 /* entries of the three arrays below */
    size_t bytes[BC_MAX_SIZES]; /* message sizes, multiples of 4 */
    int iters[BC_MAX_SIZES];    /* timed iterations per size */
    int warmup[BC_MAX_SIZES];   /* untimed iterations per size */
} bc_opts;

/* Per-size results across ranks, in microseconds per call. */
typedef struct bc_stats {
    double avg, min, max;
    int count; /* ranks (or peer lines) that reported this size */
} bc_stats;

/* Parsing state of one result stream: per-rank times for ganglion, stats for the peer. */
typedef struct bc_sink {
    const bc_opts *o;
    double *times;   /* ranks x nsizes, -1 until reported; NULL for the peer */
    bc_stats *stats; /* nsizes; filled directly from the peer's lines */
    char error[256]; /* first "error" a rank reported */
} bc_sink;

/* ---------------------------------------------------------------------------------
 * Schedule and helpers.
 * --------------------------------------------------------------------------------- */

/* Fills the size schedule: 4 KiB times 4 up to max_bytes, fewer iterations when larger. */
static void bc_schedule(bc_opts *o)
{
    o->nsizes = 0;
    for (size_t b = BC_MIN_BYTES; b <= (size_t)o->max_bytes && o->nsizes < BC_MAX_SIZES; b *= 4) {
        size_t it = BC_BUDGET_BYTES / b;
        if (it < BC_MIN_ITERS)
            it = BC_MIN_ITERS;
        if (it > BC_MAX_ITERS)
            it = BC_MAX_ITERS;
        o->bytes[o->nsizes] = b;
        o->iters[o->nsizes] = (int)it;
        o->warmup[o->nsizes] = it / 10 > 0 ? (int)(it / 10) : 1;
        o->nsizes++;
    }
}

/* The largest timed iteration count of the schedule (the size of a rank's per-call times). */
static int bc_max_iters(const bc_opts *o)
{
    int m = 1;

    for (int s = 0; s < o->nsizes; s++)
        m = o->iters[s] > m ? o->iters[s] : m;
    return m;
}

/* Index of bytes in the schedule, or -1. */
static int bc_size_index(const bc_opts *o, double bytes)
{
    for (int i = 0; i < o->nsizes; i++) {
        if ((double)o->bytes[i] == bytes)
            return i;
    }
    return -1;
}

/* Writes "a,b,c" of the n integers of vals (size_t when sz, int otherwise) into out. */
static void bc_format_list(char *out, size_t cap, const void *vals, int n, int sz)
{
    size_t used = 0;

    out[0] = '\0';
    for (int i = 0; i < n && used < cap; i++) {
        unsigned long long v = sz ? (unsigned long long)((const size_t *)vals)[i]
                                  : (unsigned long long)((const int *)vals)[i];
        int w = snprintf(out + used, cap - used, "%s%llu", i ? "," : "", v);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

/* ---------------------------------------------------------------------------------
 * One rank: the timed loop, shared by forked socket ranks and mpirun-started mpi ranks.
 * --------------------------------------------------------------------------------- */

/*
 * Runs the whole schedule on comm and writes one line {"rank","bytes","time_us"} per size
 * to out_fd (one write each, so lines of ranks sharing a pipe do not interleave). Returns
 * 0, or the first collective's error after writing {"rank","error"}.
 */
/* The all-to-all's layout for bytes: bytes / n (rounded down to 4) to and from every rank,
 * back to back; the same sizes and offsets serve both sides (v[0..n) and v[n..2n)). */
static void bc_a2a_layout(size_t *v, uint32_t n, size_t bytes)
{
    for (uint32_t p = 0; p < n; p++) {
        v[p] = bytes / n / 4 * 4;
        v[n + p] = (size_t)p * v[p];
    }
}

/* One call of o's operation on bytes (all-to-all: in the layout bc_a2a_layout left in v). */
static int bc_op(gang_comm *comm, const bc_opts *o, float *buf, float *buf2, size_t bytes,
                 const size_t *v)
{
    if (o->op == 0)
        return gang_comm_all_reduce(comm, buf, bytes / sizeof(float), GANG_DTYPE_F32,
                                    BC_OP_TIMEOUT_MS);
    uint32_t n = gang_comm_size(comm);
    gang_comm_a2a a = {buf, bytes, v, v + n, buf2, bytes, v, v + n};

    return gang_comm_all_to_all_v(comm, &a, BC_OP_TIMEOUT_MS);
}

static int bc_rank_loop(gang_comm *comm, const bc_opts *o, int out_fd)
{
    uint32_t rank = gang_comm_rank(comm);
    size_t big = o->bytes[o->nsizes - 1] / sizeof(float);
    float *buf = calloc(big, sizeof(float));
    float *buf2 = o->op == 1 ? calloc(big, sizeof(float)) : NULL;
    size_t *v = calloc(2 * (size_t)gang_comm_size(comm), sizeof(size_t));
    double *call_us = calloc((size_t)bc_max_iters(o), sizeof(double));
    int rc = 0;

    if (buf == NULL || v == NULL || call_us == NULL || (o->op == 1 && buf2 == NULL)) {
        rc = GANG_ENOMEM;
        goto out_report;
    }
    for (int s = 0; s < o->nsizes; s++) {
        double us;

        bc_a2a_layout(v, gang_comm_size(comm), o->bytes[s]); /* outside the timed loop */
        for (int i = 0; i < o->warmup[s] && rc == 0; i++)
            rc = bc_op(comm, o, buf, buf2, o->bytes[s], v);
        /* Each call timed on its own: the median is what a preempted call cannot move. */
        for (int i = 0; i < o->iters[s] && rc == 0; i++) {
            uint64_t t0 = gang_now_ns();

            rc = bc_op(comm, o, buf, buf2, o->bytes[s], v);
            call_us[i] = (double)(gang_now_ns() - t0) / 1e3;
        }
        if (rc != 0)
            goto out_report;
        us = gang_report_median(call_us, o->iters[s]);
        dprintf(out_fd, "{\"rank\":%u,\"bytes\":%zu,\"time_us\":%.3f}\n", (unsigned)rank,
                o->bytes[s], us);
    }

out_report:
    if (rc != 0)
        dprintf(out_fd, "{\"rank\":%u,\"error\":\"%s\"}\n", (unsigned)rank, gang_err_name(rc));
    free(buf);
    free(buf2);
    free(v);
    free(call_us);
    return rc;
}

/* ---------------------------------------------------------------------------------
 * Collecting results from a pipe.
 * --------------------------------------------------------------------------------- */

/* Takes one result line: a rank's time, a rank's error, or a peer's per-size stats. */
static void bc_sink_line(bc_sink *k, const char *line)
{
    cJSON *j = cJSON_Parse(line);
    const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(j, "bytes");
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    int s = cJSON_IsNumber(bytes) ? bc_size_index(k->o, bytes->valuedouble) : -1;

    if (j == NULL) {
        gang_debug("bench allreduce: ignoring output line '%s'", line);
        return;
    }
    if (cJSON_IsString(err) && k->error[0] == '\0')
        snprintf(k->error, sizeof k->error, "%s", err->valuestring);
    if (s >= 0 && k->times != NULL) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "rank");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "time_us");
        if (cJSON_IsNumber(r) && cJSON_IsNumber(t) && r->valueint >= 0 && r->valueint < k->o->ranks)
            k->times[(size_t)r->valueint * (size_t)k->o->nsizes + (size_t)s] = t->valuedouble;
    } else if (s >= 0) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "time_us_avg");
        const cJSON *mn = cJSON_GetObjectItemCaseSensitive(j, "time_us_min");
        const cJSON *mx = cJSON_GetObjectItemCaseSensitive(j, "time_us_max");
        if (cJSON_IsNumber(a) && cJSON_IsNumber(mn) && cJSON_IsNumber(mx)) {
            k->stats[s].avg = a->valuedouble;
            k->stats[s].min = mn->valuedouble;
            k->stats[s].max = mx->valuedouble;
            k->stats[s].count = 1;
        }
    }
    cJSON_Delete(j);
}

/*
 * Reads lines from fd into k until every writer closed it (EOF) or deadline_ms passes.
 * Returns 0 at EOF, GANG_ETIMEDOUT at the deadline, or a read error. fd stays open.
 */
static int bc_collect(int fd, bc_sink *k, uint64_t deadline_ms)
{
    char line[BC_LINE_MAX];
    size_t used = 0;

    for (;;) {
        uint64_t now = gang_now_ms();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ssize_t n;
        int pr;

        if (now >= deadline_ms)
            return GANG_ETIMEDOUT;
        pr = poll(&p, 1, (int)(deadline_ms - now > 1000 ? 1000 : deadline_ms - now));
        if (pr < 0 && errno != EINTR)
            return gang_err_from_errno(errno);
        if (pr <= 0)
            continue;
        n = read(fd, line + used, sizeof line - 1 - used);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0)
            return gang_err_from_errno(errno);
        if (n == 0)
            break;
        used += (size_t)n;
        line[used] = '\0';
        /* Hand over every complete line; a line longer than the buffer is dropped. */
        char *start = line, *nl;
        while ((nl = strchr(start, '\n')) != NULL) {
            *nl = '\0';
            bc_sink_line(k, start);
            start = nl + 1;
        }
        used = (size_t)(line + used - start);
        memmove(line, start, used);
        if (used == sizeof line - 1)
            used = 0;
    }
    if (used > 0) {
        line[used] = '\0';
        bc_sink_line(k, line);
    }
    return 0;
}

/* Turns per-rank times into per-size stats; a size some rank did not report has count 0. */
static void bc_times_to_stats(const bc_opts *o, const double *times, bc_stats *st)
{
    for (int s = 0; s < o->nsizes; s++) {
        bc_stats x = {.avg = 0, .min = 0, .max = 0, .count = 0};
        for (int r = 0; r < o->ranks; r++) {
            double t = times[(size_t)r * (size_t)o->nsizes + (size_t)s];
            if (t < 0)
                continue;
            x.min = x.count == 0 || t < x.min ? t : x.min;
            x.max = x.count == 0 || t > x.max ? t : x.max;
            x.avg += t;
            x.count++;
        }
        if (x.count > 0)
            x.avg /= x.count;
        st[s] = x.count == o->ranks ? x : (bc_stats){.count = 0};
    }
}

/* ---------------------------------------------------------------------------------
 * The socket backend: forked ranks.
 * --------------------------------------------------------------------------------- */

/*
 * Forks o->ranks ranks of the socket backend on 127.0.0.1 and collects their times into
 * st. Rank 0's listener is created before the fork, so that every child knows the blob.
 * Every child is reaped before returning: after the deadline, or once the results are
 * in, the ones still running are SIGKILLed. Returns 0, GANG_ETIMEDOUT, GANG_EPEER (a rank
 * failed; why says how) or another GANG_E* code.
 */
static int bc_run_socket(const bc_opts *o, bc_stats *st, char *why, size_t whycap)
{
    char blob[256];
    size_t blob_len = 0;
    gang_comm_listener *l = NULL;
    pid_t *pids = calloc((size_t)o->ranks, sizeof *pids);
    double *times = malloc((size_t)o->ranks * (size_t)o->nsizes * sizeof *times);
    bc_sink k = {.o = o, .times = times, .stats = st};
    uint64_t deadline = gang_now_ms() + (uint64_t)o->timeout_s * 1000u;
    int fds[2] = {-1, -1};
    int started = 0, failed = 0;
    int rc;

    if (pids == NULL || times == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    for (size_t i = 0; i < (size_t)o->ranks * (size_t)o->nsizes; i++)
        times[i] = -1;
    rc = gang_comm_socket_listen("127.0.0.1", &l, blob, sizeof blob, &blob_len);
    if (rc != 0) {
        snprintf(why, whycap, "cannot listen: %s", gang_strerror(rc));
        goto out_free;
    }
    if (pipe(fds) != 0) {
        rc = gang_err_from_errno(errno);
        goto out_listener;
    }
    fflush(NULL);
    for (; started < o->ranks; started++) {
        /* A rank must not outlive the benchmark that collects its results. */
        pid_t pid = gang_proc_fork(SIGKILL);
        if (pid < 0) {
            rc = (int)pid;
            snprintf(why, whycap, "fork: %s", gang_strerror(rc));
            goto out_reap;
        }
        if (pid == 0) {
            gang_comm_config cfg = {.backend = GANG_COMM_SOCKET,
                                    .rank = (uint32_t)started,
                                    .world_size = (uint32_t)o->ranks,
                                    .blob = (const uint8_t *)blob,
                                    .blob_len = blob_len,
                                    .listener = started == 0 ? l : NULL,
                                    .advertise_host = "127.0.0.1",
                                    .timeout_ms = BC_OP_TIMEOUT_MS};
            gang_comm *comm = NULL;
            int crc;

            close(fds[0]);
            gang_log_set_identity(-1, started);
            if (started != 0)
                gang_comm_listener_free(l); /* only this copy of the descriptor */
            crc = gang_comm_init(&cfg, &comm);
            if (crc != 0)
                dprintf(fds[1], "{\"rank\":%d,\"error\":\"init: %s\"}\n", started,
                        gang_err_name(crc));
            else
                crc = bc_rank_loop(comm, o, fds[1]);
            gang_comm_free(comm);
            _exit(crc == 0 ? 0 : 1);
        }
        pids[started] = pid;
    }
    close(fds[1]);
    fds[1] = -1;
    rc = bc_collect(fds[0], &k, deadline);
    if (rc == GANG_ETIMEDOUT)
        snprintf(why, whycap, "ranks did not finish within %lld s", (long long)o->timeout_s);

out_reap:
    gang_comm_listener_free(l); /* the parent's copy; rank 0 owns its own */
    l = NULL;
    /* Ranks that have written EOF are exiting; give them until the deadline, no longer. */
    if (started > 0) {
        int *ws = calloc((size_t)started, sizeof *ws);
        /* The ones still running are killed and reaped, with a deadline on that too. */
        if (ws == NULL || gang_proc_reap_until(pids, ws, started, deadline) > 0)
            failed += gang_proc_stop(pids, started, 0, 0, BC_STOP_GRACE_MS);
        for (int i = 0; ws != NULL && i < started; i++)
            failed += pids[i] == 0 && ws[i] != 0;
        free(ws);
    }
    if (fds[0] >= 0)
        close(fds[0]);
    if (fds[1] >= 0)
        close(fds[1]);
    bc_times_to_stats(o, times, st);
    if (rc == 0 && (failed > 0 || k.error[0] != '\0')) {
        snprintf(why, whycap, "%d rank(s) failed%s%s", failed, k.error[0] ? ": " : "", k.error);
        rc = GANG_EPEER;
    }
out_listener:
    gang_comm_listener_free(l);
out_free:
    free(times);
    free(pids);
    return rc;
}

/* ---------------------------------------------------------------------------------
 * mpirun: the mpi backend and the peer.
 * --------------------------------------------------------------------------------- */

/*
 * Runs argv (mpirun ...) in a process group of its own with stdout into a pipe, collects
 * its lines into k until EOF or deadline_ms and reaps it. On the deadline mpirun gets
 * SIGTERM (it stops its ranks), then after BC_STOP_GRACE_MS SIGKILL to its whole group;
 * the ranks themselves die with their parent (PR_SET_PDEATHSIG in both rank programs).
 * Returns 0, GANG_ETIMEDOUT, GANG_EPEER (mpirun failed) or another GANG_E* code.
 */
static int bc_run_mpirun(char *const *argv, bc_sink *k, uint64_t deadline_ms, char *why,
                         size_t whycap)
{
    int fds[2];
    int status = 0;
    pid_t pid;
    int rc;

    if (pipe(fds) != 0)
        return gang_err_from_errno(errno);
    gang_spawn sp = {.out_fd = fds[1],
                     .err_fd = -1,
                     .close_fd = fds[0],
                     .new_group = 1,
                     .death_signal = SIGTERM,
                     .mpi_env = 1};
    rc = gang_proc_spawn(argv, &sp, &pid);
    if (rc != 0) {
        close(fds[0]);
        close(fds[1]);
        return rc;
    }
    close(fds[1]);
    rc = bc_collect(fds[0], k, deadline_ms);
    close(fds[0]);
    if (rc == GANG_ETIMEDOUT) {
        gang_proc_stop(&pid, 1, 1, BC_STOP_GRACE_MS, BC_STOP_GRACE_MS);
        snprintf(why, whycap, "mpirun did not finish in time");
        return rc;
    }
    /* EOF: mpirun is exiting; it still gets only the rest of the deadline. */
    if (gang_proc_reap_until(&pid, &status, 1, deadline_ms) > 0) {
        gang_proc_stop(&pid, 1, 1, 0, BC_STOP_GRACE_MS);
        snprintf(why, whycap, "mpirun did not exit in time");
        return GANG_ETIMEDOUT;
    }
    if (rc == 0 && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
        snprintf(why, whycap, "mpirun failed (wait status 0x%x)%s%s", (unsigned)status,
                 k->error[0] ? ": " : "", k->error);
        rc = GANG_EPEER;
    }
    return rc;
}

/*
 * Runs `mpirun --allow-run-as-root --oversubscribe -np N PROG [PRE_ARGS] --sizes ...
 * --iters ... --warmup ...` and collects its lines into k. Returns 1 with a reason when
 * mpirun or PROG is missing (the caller prints "skipped"), otherwise bc_run_mpirun's code.
 */
static int bc_mpirun_schedule(const bc_opts *o, const char *prog, char *const *pre, int npre,
                              bc_sink *k, char *why, size_t whycap)
{
    char mpirun[PATH_MAX], np[16], sizes[512], iters[512], warm[512], path[PATH_MAX];
    char *argv[32];
    int n = 0;

    if (!gang_proc_find_in_path("mpirun", mpirun, sizeof mpirun)) {
        snprintf(why, whycap, "mpirun not found in PATH (install openmpi-bin)");
        return 1;
    }
    if (access(prog, X_OK) != 0) {
        snprintf(why, whycap, "%s not built (needs MPI at configure time)", prog);
        return 1;
    }
    snprintf(np, sizeof np, "%lld", (long long)o->ranks);
    bc_format_list(sizes, sizeof sizes, o->bytes, o->nsizes, 1);
    bc_format_list(iters, sizeof iters, o->iters, o->nsizes, 0);
    bc_format_list(warm, sizeof warm, o->warmup, o->nsizes, 0);
    argv[n++] = mpirun;
    argv[n++] = "--allow-run-as-root";
    argv[n++] = "--oversubscribe";
    argv[n++] = "-np";
    argv[n++] = np;
    snprintf(path, sizeof path, "%s", prog); /* exec takes its arguments as char * */
    argv[n++] = path;
    for (int i = 0; i < npre && n < 20; i++)
        argv[n++] = pre[i];
    argv[n++] = "--sizes";
    argv[n++] = sizes;
    argv[n++] = "--iters";
    argv[n++] = iters;
    argv[n++] = "--warmup";
    argv[n++] = warm;
    argv[n] = NULL;
    return bc_run_mpirun(argv, k, gang_now_ms() + (uint64_t)o->timeout_s * 1000u, why, whycap);
}

/* ---------------------------------------------------------------------------------
 * The hidden per-rank subcommand for the mpi backend.
 * --------------------------------------------------------------------------------- */

/* Options of the hidden rank subcommand: the schedule as lists. */
typedef struct bc_rank_opts {
    char backend[16], op[16];
    char sizes[512], iters[512], warmup[512];
} bc_rank_opts;

#define BC_RSTR(f_, fld, hp) GANG_OPT_STR(bc_rank_opts, f_, fld, "", hp)
static const gang_param_info bc_rank_items[] = {
    BC_RSTR("backend", backend, "must be mpi"),
    BC_RSTR("op", op, "allreduce (default) or alltoall"),
    BC_RSTR("sizes", sizes, "message sizes in bytes, comma-separated"),
    BC_RSTR("iters", iters, "timed iterations per size, comma-separated"),
    BC_RSTR("warmup", warmup, "untimed iterations per size, comma-separated"),
};
static const gang_opt_table bc_rank_table = GANG_OPT_TABLE(bc_rank_items);
static const gang_opt_cmd bc_rank_cmd = {
    "bench allreduce-rank", "--backend mpi [--op alltoall] --sizes L --iters L --warmup L",
    "Hidden: one rank of `bench allreduce|alltoall --backend mpi`, started by mpirun; prints\n"
    "{\"rank\",\"bytes\",\"time_us\"} lines.",
    &bc_rank_table, 0};

/* Fills o's schedule from the three lists; returns the count, or GANG_EINVAL. */
static int bc_rank_schedule(const bc_rank_opts *r, bc_opts *o)
{
    int64_t v[3][BC_MAX_SIZES];
    int ns = gang_parse_i64_list(r->sizes, 4, (int64_t)BC_MAX_BYTES, v[0], BC_MAX_SIZES);
    int ni = gang_parse_i64_list(r->iters, 1, 1000000, v[1], BC_MAX_SIZES);
    int nw = gang_parse_i64_list(r->warmup, 0, 1000000, v[2], BC_MAX_SIZES);

    if (ns <= 0 || ns != ni || ns != nw)
        return GANG_EINVAL;
    for (int i = 0; i < ns; i++) {
        o->bytes[i] = (size_t)v[0][i];
        o->iters[i] = (int)v[1][i];
        o->warmup[i] = (int)v[2][i];
    }
    o->nsizes = ns;
    return ns;
}

/*
 * `allreduce-rank --backend mpi --sizes L --iters L --warmup L`: one rank started by
 * mpirun. Rank and world come from Open MPI's environment (OMPI_COMM_WORLD_RANK/SIZE),
 * which gang_comm_init checks against MPI_COMM_WORLD. Prints its lines on stdout.
 */
int gang_bench_allreduce_rank_main(int argc, char **argv)
{
    bc_opts o = {.backend = GANG_COMM_MPI};
    bc_rank_opts r;
    const char *rs = getenv("OMPI_COMM_WORLD_RANK");
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE");
    int64_t rank = 0, world = 0;
    gang_comm *comm = NULL;
    int rc;

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    rc = gang_opts_cli(&bc_rank_cmd, &r, argc, argv, NULL, NULL);
    if (rc != 0)
        return rc == GANG_OPTS_HELP ? GANG_EXIT_OK : GANG_EXIT_USAGE;
    o.op = strcmp(r.op, "alltoall") == 0;
    if ((r.op[0] != '\0' && !o.op && strcmp(r.op, "allreduce") != 0) ||
        strcmp(r.backend, "mpi") != 0 || bc_rank_schedule(&r, &o) <= 0 || rs == NULL ||
        ws == NULL || gang_parse_i64(rs, 0, 65535, &rank) != 0 ||
        gang_parse_i64(ws, 1, 65536, &world) != 0) {
        gang_opts_usage_error(&bc_rank_cmd, "needs --backend mpi, equally long --sizes/--iters/"
                                            "--warmup lists and to run under Open MPI's mpirun");
        return GANG_EXIT_USAGE;
    }
    o.ranks = world;
    gang_log_set_identity(-1, (int)rank);
    gang_comm_config cfg = {.backend = GANG_COMM_MPI,
                            .rank = (uint32_t)rank,
                            .world_size = (uint32_t)world,
                            .timeout_ms = BC_OP_TIMEOUT_MS};
    rc = gang_comm_init(&cfg, &comm);
    if (rc != 0) {
        printf("{\"rank\":%d,\"error\":\"init: %s\"}\n", (int)rank, gang_err_name(rc));
        fflush(stdout);
        return GANG_EXIT_TEMPFAIL;
    }
    fflush(stdout);
    rc = bc_rank_loop(comm, &o, 1);
    gang_comm_free(comm);
    return rc == 0 ? GANG_EXIT_OK : GANG_EXIT_TEMPFAIL;
}

/* ---------------------------------------------------------------------------------
 * The benchmark.
 * --------------------------------------------------------------------------------- */

static const gang_param_info bc_items[] = {
    {.flag = "ranks",
     .type = GANG_PARAM_INT,
     .def = "2",
     .lo = 2,
     .hi = 64,
     .help = "world size",
     .offset = offsetof(bc_opts, ranks)},
    {.flag = "backend",
     .type = GANG_PARAM_STR,
     .def = "socket",
     .help = "socket or mpi",
     .offset = offsetof(bc_opts, backend_name),
     .str_cap = sizeof(((bc_opts *)0)->backend_name)},
    {.flag = "max-bytes",
     .type = GANG_PARAM_INT,
     .def = "67108864",
     .lo = (int64_t)BC_MIN_BYTES,
     .hi = (int64_t)BC_MAX_BYTES * 4,
     .help = "largest message (4 KiB, x4, up to this)",
     .offset = offsetof(bc_opts, max_bytes)},
    {.flag = "timeout-s",
     .type = GANG_PARAM_INT,
     .def = "300",
     .lo = 1,
     .hi = 86400,
     .help = "deadline of the ganglion run and of the peer run",
     .offset = offsetof(bc_opts, timeout_s)},
    {.flag = "no-peer",
     .type = GANG_PARAM_BOOL,
     .def = "0",
     .hi = 1,
     .help = "skip the peer (mpirun mpi-allreduce)",
     .offset = offsetof(bc_opts, no_peer)},
};
static const gang_opt_table bc_table = GANG_OPT_TABLE(bc_items);
static const gang_opt_cmd bc_cmd = {
    "bench allreduce", "[flags]",
    "Times gang_comm_all_reduce (f32, sum, in place) on N ranks for 4 KiB, 16 KiB, ... up\n"
    "to --max-bytes: warm-up, then timed iterations. socket: this process forks the ranks;\n"
    "mpi: mpirun -np N ganglion bench allreduce-rank. The peer, mpirun -np N mpi-allreduce,\n"
    "runs in the same invocation; every line carries ratio = ganglion busbw / MPI busbw.",
    &bc_table, 0};

static const gang_opt_cmd bc_a2a_cmd = {
    "bench alltoall", "[flags]",
    "Times gang_comm_all_to_all_v on N ranks, each sending 4 KiB, 16 KiB, ... up to\n"
    "--max-bytes in all (an equal share to every rank): the dispatch/combine of expert\n"
    "parallelism. socket: forked ranks; mpi: mpirun. The peer, mpirun -np N mpi-allreduce\n"
    "--op alltoall (MPI_Alltoallv), runs in the same invocation; ratio = ganglion busbw /\n"
    "MPI busbw, target >= 1.0 at <= 256 KiB (a decode step's sizes).",
    &bc_table, 0};

/* Parses argv (argv[0] is the subcommand) into o for op; 0, GANG_OPTS_HELP or GANG_EUSAGE. */
static int bc_parse(int argc, char **argv, bc_opts *o, int op)
{
    const gang_opt_cmd *cmd = op == 0 ? &bc_cmd : &bc_a2a_cmd;
    char err[256];
    int rc = gang_opts_cli(cmd, o, argc, argv, NULL, NULL);

    if (rc != 0)
        return rc;
    o->op = op;
    o->op_name = op == 0 ? "allreduce" : "alltoall";
    rc = gang_opts_choice("backend", o->backend_name, "socket|mpi", err, sizeof(err));
    if (rc < 0)
        return gang_opts_usage_error(cmd, "%s", err);
    o->backend = rc == 0 ? GANG_COMM_SOCKET : GANG_COMM_MPI;
    return 0;
}

/* Adds time_us_avg/min/max, algbw_gbps and busbw_gbps (GB/s = 1e9 B/s) of st to obj. */
static void bc_add_stats(cJSON *obj, const char *prefix, const bc_stats *st, size_t bytes,
                         int ranks, int op, double *busbw)
{
    char key[64];
    double alg = (double)bytes / (st->avg * 1e-6) / 1e9;

    *busbw = alg * (op == 0 ? 2.0 : 1.0) * (ranks - 1) / ranks;
    snprintf(key, sizeof key, "%stime_us_avg", prefix);
    cJSON_AddNumberToObject(obj, key, gang_report_round(st->avg, 2));
    snprintf(key, sizeof key, "%stime_us_min", prefix);
    cJSON_AddNumberToObject(obj, key, gang_report_round(st->min, 2));
    snprintf(key, sizeof key, "%stime_us_max", prefix);
    cJSON_AddNumberToObject(obj, key, gang_report_round(st->max, 2));
    snprintf(key, sizeof key, "%salgbw_gbps", prefix);
    cJSON_AddNumberToObject(obj, key, gang_report_round(alg, 4));
    snprintf(key, sizeof key, "%sbusbw_gbps", prefix);
    cJSON_AddNumberToObject(obj, key, gang_report_round(*busbw, 4));
}

/* The ganglion run on o's backend: per-size stats in g. Returns 0 or a GANG_E* code. */
static int bc_run_ganglion(const bc_opts *o, const char *exe, bc_stats *g, char *why, size_t whycap)
{
    if (o->backend == GANG_COMM_SOCKET)
        return bc_run_socket(o, g, why, whycap);
    double *times = malloc((size_t)o->ranks * (size_t)o->nsizes * sizeof *times);
    bc_sink k = {.o = o, .times = times, .stats = g};
    char *pre[] = {"bench", "allreduce-rank", "--backend",
                   "mpi",   "--op",           (char *)(uintptr_t)o->op_name};

    if (times == NULL)
        return GANG_ENOMEM;
    for (size_t i = 0; i < (size_t)o->ranks * (size_t)o->nsizes; i++)
        times[i] = -1;
    int rc = bc_mpirun_schedule(o, exe, pre, 6, &k, why, whycap);
    bc_times_to_stats(o, times, g);
    free(times);
    return rc == 1 ? GANG_ENOSYS : rc;
}

/* One line per size: ganglion's stats, the peer's, and their ratio (collected). */
static void bc_emit_sizes(const bc_opts *o, const bc_stats *g, const bc_stats *m, const char *why,
                          const char *peer_why, int prc, double *ratios, int *nratios)
{
    const char *bname = gang_comm_backend_name(o->backend);

    for (int s = 0; s < o->nsizes; s++) {
        cJSON *line = gang_report_new(o->op_name);
        double gb = 0, mb = 0;

        cJSON_AddStringToObject(line, "backend", bname);
        cJSON_AddNumberToObject(line, "ranks", (double)o->ranks);
        cJSON_AddNumberToObject(line, "bytes", (double)o->bytes[s]);
        cJSON_AddNumberToObject(line, "iters", o->iters[s]);
        cJSON_AddNumberToObject(line, "warmup", o->warmup[s]);
        if (g[s].count > 0)
            bc_add_stats(line, "", &g[s], o->bytes[s], (int)o->ranks, o->op, &gb);
        else
            cJSON_AddStringToObject(line, "error", why[0] ? why : "not measured");
        if (m[s].count > 0) {
            bc_add_stats(line, "mpi_", &m[s], o->bytes[s], (int)o->ranks, o->op, &mb);
            if (g[s].count > 0 && mb > 0) {
                cJSON_AddNumberToObject(line, "ratio", gang_report_round(gb / mb, 3));
                if (o->op == 0 ? o->bytes[s] >= BC_TARGET_MIN_BYTES
                               : o->bytes[s] <= BC_A2A_TARGET_MAX_BYTES)
                    ratios[(*nratios)++] = gb / mb;
            }
        } else if (!o->no_peer && prc != 1) {
            cJSON_AddStringToObject(line, "mpi_error", peer_why[0] ? peer_why : "not measured");
        }
        gang_report_emit(line);
    }
}

/*
 * The summary line: the median ratio over the target's sizes (all-reduce: >= 1 MiB,
 * target 0.8; all-to-all: <= 256 KiB, the decode step's, target 1.0) against the target.
 */
static void bc_emit_summary(const bc_opts *o, double *ratios, int nratios, int rc, const char *why)
{
    cJSON *sum = gang_report_new(o->op_name);
    const char *range = o->op == 0 ? "ge_1mib" : "le_256kib";
    double target = o->op == 0 ? BC_TARGET : BC_A2A_TARGET;
    char key[64];

    cJSON_AddStringToObject(sum, "summary", "ratio = ganglion busbw / Open MPI busbw");
    cJSON_AddStringToObject(sum, "backend", gang_comm_backend_name(o->backend));
    cJSON_AddNumberToObject(sum, "ranks", (double)o->ranks);
    snprintf(key, sizeof key, "sizes_%s", range);
    cJSON_AddNumberToObject(sum, key, nratios);
    snprintf(key, sizeof key, "median_ratio_%s", range);
    if (nratios > 0) {
        double med = gang_report_median(ratios, nratios); /* sorts: ratios[0] is the min */
        cJSON_AddNumberToObject(sum, key, gang_report_round(med, 3));
        snprintf(key, sizeof key, "min_ratio_%s", range);
        cJSON_AddNumberToObject(sum, key, gang_report_round(ratios[0], 3));
        cJSON_AddNumberToObject(sum, "target", target);
        cJSON_AddBoolToObject(sum, "target_met", med >= target);
    } else {
        cJSON_AddNullToObject(sum, key);
        cJSON_AddNumberToObject(sum, "target", target);
        cJSON_AddNullToObject(sum, "target_met");
    }
    if (rc != 0)
        cJSON_AddStringToObject(sum, "error", why[0] ? why : gang_err_name(rc));
    gang_report_emit(sum);
}

/* Both benchmarks: op 0 all-reduce, op 1 all-to-all(v). */
static int bc_main(int argc, char **argv, int op)
{
    bc_opts o;
    bc_stats g[BC_MAX_SIZES], m[BC_MAX_SIZES];
    double ratios[BC_MAX_SIZES];
    int nratios = 0;
    char why[512] = "", peer_why[512] = "", exe[PATH_MAX], dir[PATH_MAX], prog[PATH_MAX + 32];
    bc_sink pk = {.o = &o, .stats = m};
    ssize_t len;
    int rc, prc = 1;

    memset(&o, 0, sizeof o);
    rc = bc_parse(argc, argv, &o, op);
    if (rc != 0)
        return rc == GANG_OPTS_HELP ? GANG_EXIT_OK : GANG_EXIT_USAGE;
    bc_schedule(&o);
    memset(g, 0, sizeof g);
    memset(m, 0, sizeof m);
    signal(SIGPIPE, SIG_IGN);
    len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        gang_error("bench %s: cannot read /proc/self/exe: %s", o.op_name, strerror(errno));
        return GANG_EXIT_INTERNAL;
    }
    exe[len] = '\0';
    gang_strlcpy(dir, exe, sizeof dir);
    if (strrchr(dir, '/') != NULL)
        *strrchr(dir, '/') = '\0';

    gang_info("bench %s: backend %s, %lld ranks, %d sizes up to %lld bytes", o.op_name,
              o.backend_name, (long long)o.ranks, o.nsizes, (long long)o.max_bytes);
    rc = bc_run_ganglion(&o, exe, g, why, sizeof why);
    if (rc != 0)
        gang_error("bench %s: ganglion %s run failed: %s (%s)", o.op_name, o.backend_name, why,
                   gang_err_name(rc));
    if (!o.no_peer) {
        snprintf(prog, sizeof prog, "%s/mpi-allreduce", dir);
        gang_info("bench %s: peer mpirun -np %lld %s --op %s", o.op_name, (long long)o.ranks, prog,
                  o.op_name);
        char *peer_pre[] = {"--op", (char *)(uintptr_t)o.op_name};
        prc = bc_mpirun_schedule(&o, prog, peer_pre, 2, &pk, peer_why, sizeof peer_why);
        if (prc == 1) {
            cJSON *skip = gang_report_new(o.op_name);
            cJSON_AddStringToObject(skip, "peer", "mpirun mpi-allreduce");
            cJSON_AddStringToObject(skip, "skipped", peer_why);
            gang_report_emit(skip);
        } else if (prc != 0) {
            gang_error("bench %s: peer failed: %s (%s)", o.op_name, peer_why, gang_err_name(prc));
        }
    }
    bc_emit_sizes(&o, g, m, why, peer_why, prc, ratios, &nratios);
    bc_emit_summary(&o, ratios, nratios, rc, why);
    return rc == 0 ? GANG_EXIT_OK : GANG_EXIT_TEMPFAIL;
}

int gang_bench_allreduce_main(int argc, char **argv)
{
    return bc_main(argc, argv, 0);
}

int gang_bench_alltoall_main(int argc, char **argv)
{
    return bc_main(argc, argv, 1);
}
