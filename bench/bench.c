/*
 * Control-plane benchmarks: how fast a gang forms, how fast a failure is noticed, and
 * how fast the gang serves again.
 *
 * The benchmarks drive real agents of this binary and watch them only from the outside,
 * through each agent's GET /status, so they measure what an operator would see. The
 * measured instants come from the agents themselves where the contract provides them
 * (last_abort_wall_ms, serving_since_wall_ms) and from polling otherwise; polling runs
 * every BENCH_POLL_MS, which bounds the error it adds.
 *
 * Method (nccl-tests style): warm-up trials that are printed but not counted, then timed
 * trials, one JSON line each, then a summary line with median, min and max; the peer of
 * the rendezvous benchmark (Open MPI's mpirun of a barrier program) runs in the same
 * trial and the ratio is printed next to it.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <cjson/cJSON.h>

#include "bench-comm.h"
#include "bench-pipeline.h"
#include "cmds.h"
#include "bench.h"
#include "local.h"

#define BENCH_POLL_MS 5
#define BENCH_HTTP_TIMEOUT_MS 1000
#define BENCH_HTTP_MAX_BODY (4u << 20)
#define BENCH_STOP_GRACE_MS 10000
#define BENCH_KILL_GRACE_MS 5000
#define BENCH_EXIT_FAILED GANG_EXIT_TEMPFAIL

/* Command-line options of both benchmarks; each uses the fields it documents. */
typedef struct bench_opts {
    const char *kind;   /* "rendezvous" or "failover" */
    int nodes;          /* rendezvous: agents */
    int trials;         /* timed trials (failover: per kind) */
    int warmup;         /* untimed trials first */
    int timeout_s;      /* deadline of one gang formation / one trial */
    int peer_timeout_s; /* rendezvous: deadline of one mpirun run */
    int no_peer;        /* rendezvous: skip mpirun */
    int nnodes;         /* failover: gang shape and timings */
    int nproc_per_node;
    int hb_interval_ms;
    int hb_timeout_ms;
    int abort_timeout_ms;
    int crash; /* failover kinds to run */
    int hang;
    const char *agent_log; /* where agents' stdout/stderr go */
    char **extra;          /* serve flags after "--" */
    int nextra;
} bench_opts;

/* Paths and files shared by a run. */
typedef struct bench_ctx {
    char exe[PATH_MAX];      /* this binary's real path */
    char dir[PATH_MAX];      /* its directory, where mpi-barrier lives */
    char log_path[PATH_MAX]; /* agent log */
    int log_fd;
    uint64_t rng; /* xorshift state for port choice */
} bench_ctx;

/* ---------------------------------------------------------------------------------
 * Small helpers: numbers, JSON output, random ports.
 * --------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n) (sorts v in place); NAN for n == 0. */
static double median(double *v, int n)
{
    if (n <= 0)
        return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

/* Rounds to `digits` decimals so the JSON lines stay readable. */
static double round_to(double x, int digits)
{
    double f = pow(10.0, digits);
    return round(x * f) / f;
}

/* Adds median/min/max of v[0..n) as NAME_p50, NAME_min, NAME_max (nothing when n == 0). */
static void json_add_stats(cJSON *o, const char *name, double *v, int n, int digits)
{
    char key[96];

    if (n <= 0)
        return;
    double p50 = median(v, n); /* sorts v, so min and max are the ends */
    snprintf(key, sizeof key, "%s_p50", name);
    cJSON_AddNumberToObject(o, key, round_to(p50, digits));
    snprintf(key, sizeof key, "%s_min", name);
    cJSON_AddNumberToObject(o, key, round_to(v[0], digits));
    snprintf(key, sizeof key, "%s_max", name);
    cJSON_AddNumberToObject(o, key, round_to(v[n - 1], digits));
}

/* Prints o as one JSON line on stdout, flushes, and frees it. */
static void json_emit(cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);

    if (s != NULL) {
        fputs(s, stdout);
        fputc('\n', stdout);
        fflush(stdout);
        cJSON_free(s);
    }
    cJSON_Delete(o);
}

static uint64_t bench_rand(bench_ctx *c)
{
    c->rng ^= c->rng >> 12;
    c->rng ^= c->rng << 25;
    c->rng ^= c->rng >> 27;
    return c->rng * 0x2545F4914F6CDD1Dull;
}

/* 1 when nothing listens on or holds 127.0.0.1:port right now. */
static int port_is_free(int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int ok;

    if (fd < 0)
        return 0;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return ok;
}

/*
 * Picks a rendezvous port and the HTTP port above it, both free, in [20000, 32000): below
 * Linux's default ephemeral range, so outgoing connections never take them, and fresh
 * per trial, so that sockets of the previous trial in TIME_WAIT do not matter.
 */
static int pick_ports(bench_ctx *c, int *rdzv, int *http)
{
    for (int tries = 0; tries < 100; tries++) {
        int base = 20000 + (int)(bench_rand(c) % 6000) * 2;
        if (port_is_free(base) && port_is_free(base + 1)) {
            *rdzv = base;
            *http = base + 1;
            return 0;
        }
    }
    return GANG_EAGAIN;
}

/* ---------------------------------------------------------------------------------
 * A tiny blocking HTTP/1.0 client with one deadline per request.
 * --------------------------------------------------------------------------------- */

/* Waits until fd is ready for events or the monotonic deadline passes. */
static int wait_fd(int fd, short events, uint64_t deadline_ms)
{
    for (;;) {
        uint64_t now = gang_now_ms();
        struct pollfd pfd = {.fd = fd, .events = events};
        int rc;

        if (now >= deadline_ms)
            return GANG_ETIMEDOUT;
        rc = poll(&pfd, 1, (int)(deadline_ms - now));
        if (rc > 0)
            return 0;
        if (rc < 0 && errno != EINTR)
            return gang_err_from_errno(errno);
    }
}

/* Finds the Content-Length value in the header block head[0..len), or -1. */
static long header_content_length(const char *head, size_t len)
{
    static const char key[] = "\r\ncontent-length:";
    size_t klen = sizeof key - 1;

    for (size_t i = 0; i + klen <= len; i++) {
        if (strncasecmp(head + i, key, klen) == 0)
            return strtol(head + i + klen, NULL, 10);
    }
    return -1;
}

/*
 * GETs http://host:port/path (host is an IPv4 literal). The whole exchange - connect,
 * send, receive - must finish within timeout_ms. Reading stops at Content-Length or at
 * EOF, so it works whether or not the server keeps the connection alive. On success
 * returns 0 with the status code in *status and the body, NUL-terminated and owned by
 * the caller (free()), in *body. Errors: GANG_EINVAL (bad host), GANG_ETIMEDOUT,
 * GANG_EPROTO (not HTTP), GANG_EMSGSIZE (body over 4 MiB), GANG_ENOMEM, or a socket
 * errno such as GANG_ECONNREFUSED.
 */
static int http_get(const char *host, int port, const char *path, int timeout_ms, int *status,
                    char **body)
{
    uint64_t deadline = gang_now_ms() + (uint64_t)timeout_ms;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    char req[512];
    char *buf = NULL;
    size_t cap = 8192, len = 0, sent = 0, reqlen;
    int fd, rc, err = 0;
    socklen_t elen = sizeof err;

    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return GANG_EINVAL;
    reqlen = (size_t)snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s:%d\r\n\r\n", path, host,
                              port);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return gang_err_from_errno(errno);

    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (errno != EINPROGRESS) {
            rc = gang_err_from_errno(errno);
            goto out_close;
        }
        rc = wait_fd(fd, POLLOUT, deadline);
        if (rc < 0)
            goto out_close;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
        if (err != 0) {
            rc = gang_err_from_errno(err);
            goto out_close;
        }
    }
    while (sent < reqlen) {
        ssize_t n = send(fd, req + sent, reqlen - sent, MSG_NOSIGNAL);
        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
            rc = gang_err_from_errno(errno);
            goto out_close;
        }
        rc = wait_fd(fd, POLLOUT, deadline);
        if (rc < 0)
            goto out_close;
    }

    buf = malloc(cap);
    if (buf == NULL) {
        rc = GANG_ENOMEM;
        goto out_close;
    }
    for (;;) {
        char *eoh;
        ssize_t n;

        if (len + 1 >= cap) {
            char *nb;
            if (cap >= BENCH_HTTP_MAX_BODY) {
                rc = GANG_EMSGSIZE;
                goto out_free;
            }
            nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                rc = GANG_ENOMEM;
                goto out_free;
            }
            buf = nb;
            cap *= 2;
        }
        n = recv(fd, buf + len, cap - len - 1, 0);
        if (n == 0)
            break;
        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR) {
                rc = gang_err_from_errno(errno);
                goto out_free;
            }
            rc = wait_fd(fd, POLLIN, deadline);
            if (rc < 0)
                goto out_free;
            continue;
        }
        len += (size_t)n;
        buf[len] = '\0';
        eoh = strstr(buf, "\r\n\r\n");
        if (eoh != NULL) {
            long clen = header_content_length(buf, (size_t)(eoh - buf) + 2);
            if (clen >= 0 && len >= (size_t)(eoh + 4 - buf) + (size_t)clen)
                break;
        }
    }
    buf[len] = '\0';

    {
        char *eoh = strstr(buf, "\r\n\r\n");
        if (eoh == NULL || sscanf(buf, "HTTP/%*d.%*d %d", status) != 1) {
            rc = GANG_EPROTO;
            goto out_free;
        }
        memmove(buf, eoh + 4, len - (size_t)(eoh + 4 - buf) + 1);
    }
    *body = buf;
    buf = NULL;
    rc = 0;

out_free:
    free(buf);
out_close:
    close(fd);
    return rc;
}

/* GETs /status of the agent at host:port and parses it; NULL on any failure. */
static cJSON *get_status(const char *host, int port)
{
    char *body = NULL;
    int status = 0;
    cJSON *j;

    if (http_get(host, port, "/status", BENCH_HTTP_TIMEOUT_MS, &status, &body) != 0)
        return NULL;
    j = status == 200 ? cJSON_Parse(body) : NULL;
    free(body);
    return j;
}

/* Number at a path of object keys (NULL-terminated varargs style, two levels here). */
static double jnum(const cJSON *o, const char *k1, const char *k2, double def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k1);

    if (v != NULL && k2 != NULL)
        v = cJSON_GetObjectItemCaseSensitive(v, k2);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

static const char *jstr(const cJSON *o, const char *k1, const char *k2)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k1);

    if (v != NULL && k2 != NULL)
        v = cJSON_GetObjectItemCaseSensitive(v, k2);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* ---------------------------------------------------------------------------------
 * Child processes.
 * --------------------------------------------------------------------------------- */

/*
 * Forks and execs argv[0] (searched in PATH when it has no '/') in a new process group,
 * with stdout and stderr on out_fd, and SIGTERM when this process dies. Returns 0 and
 * the pid, or a GANG_E* code; a child whose exec fails exits 127.
 */
static int spawn_group(char *const *argv, int out_fd, pid_t *out)
{
    pid_t parent = getpid();
    pid_t pid = fork();

    if (pid < 0)
        return gang_err_from_errno(errno);
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(0);
        if (out_fd >= 0) {
            dup2(out_fd, 1);
            dup2(out_fd, 2);
        }
        unsetenv("GANGLION_LOCAL");
        /* Open MPI's single-copy shared memory needs ptrace rights that containers
         * usually withhold; the barrier does not need it. */
        setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
        execvp(argv[0], argv);
        dprintf(2, "ganglion bench: cannot exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid); /* also from here, so it holds before the child runs */
    *out = pid;
    return 0;
}

/*
 * Waits until every pid in pids[0..n) has exited or deadline_ms passes; reaped entries
 * are set to 0 and their wait status stored in statuses[i]. Returns how many remain.
 */
static int reap_until(pid_t *pids, int *statuses, int n, uint64_t deadline_ms)
{
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++) {
            if (pids[i] > 0 && waitpid(pids[i], &statuses[i], WNOHANG) == pids[i])
                pids[i] = 0;
            left += pids[i] > 0;
        }
        if (left == 0 || gang_now_ms() >= deadline_ms)
            return left;
        gang_sleep_ms(2);
    }
}

/* The parent pid of pid from /proc/PID/stat, or -1. */
static pid_t proc_ppid(pid_t pid)
{
    char path[64], buf[512];
    const char *rp;
    ssize_t n;
    int fd;
    int ppid = -1;

    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    /* The command name may hold spaces and ')'; the fields resume after the last ')'. */
    rp = strrchr(buf, ')');
    if (rp == NULL || sscanf(rp + 1, " %*c %d", &ppid) != 1)
        return -1;
    return (pid_t)ppid;
}

/*
 * Sends sig to root and every process below it. Needed for mpirun, which puts each rank
 * in a process group of its own, so that signalling mpirun's group misses them. The
 * tree is walked breadth-first over /proc, a bounded number of levels deep.
 */
static void kill_tree(pid_t root, int sig)
{
    pid_t level[4096];
    size_t nlevel = 1;

    level[0] = root;
    for (int depth = 0; depth < 8 && nlevel > 0; depth++) {
        pid_t next[4096];
        size_t nnext = 0;
        DIR *d = opendir("/proc");
        struct dirent *e;

        while (d != NULL && (e = readdir(d)) != NULL && nnext < 4096) {
            pid_t pid = (pid_t)atoi(e->d_name);
            pid_t ppid = pid > 0 ? proc_ppid(pid) : -1;
            for (size_t i = 0; i < nlevel && ppid > 0; i++) {
                if (ppid == level[i]) {
                    next[nnext++] = pid;
                    break;
                }
            }
        }
        if (d != NULL)
            closedir(d);
        for (size_t i = 0; i < nlevel; i++)
            kill(level[i], sig);
        memcpy(level, next, nnext * sizeof next[0]);
        nlevel = nnext;
    }
}

/* Reaps whatever children are left over (nothing tracked may still be running). */
static void reap_strays(void)
{
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
}

/*
 * Stops processes: SIGTERM to each, up to BENCH_STOP_GRACE_MS, then SIGKILL and up to
 * BENCH_KILL_GRACE_MS more. With `group` each pid leads a process group (spawn_group());
 * only the leader gets SIGTERM, so that it can stop its own children in order, but the
 * SIGKILL and a final sweep go to the whole group, so that nothing outlives the run.
 * pids[] entries are zeroed as they are reaped. Returns how many did not exit 0.
 */
static int stop_all(pid_t *pids, int n, int group)
{
    int *st = calloc((size_t)n, sizeof *st);
    pid_t *leaders = calloc((size_t)n, sizeof *leaders);
    int bad = 0;

    if (st == NULL || leaders == NULL) {
        free(st);
        free(leaders);
        return n;
    }
    for (int i = 0; i < n; i++) {
        leaders[i] = pids[i];
        if (pids[i] > 0)
            kill(pids[i], SIGTERM);
    }
    if (reap_until(pids, st, n, gang_now_ms() + BENCH_STOP_GRACE_MS) > 0) {
        for (int i = 0; i < n; i++) {
            if (pids[i] > 0)
                kill(group ? -pids[i] : pids[i], SIGKILL);
        }
        reap_until(pids, st, n, gang_now_ms() + BENCH_KILL_GRACE_MS);
    }
    for (int i = 0; i < n; i++) {
        if (group && leaders[i] > 0)
            kill(-leaders[i], SIGKILL);
        if (st[i] != 0 || pids[i] > 0)
            bad++;
    }
    free(leaders);
    free(st);
    return bad;
}

/* ---------------------------------------------------------------------------------
 * bench rendezvous
 * --------------------------------------------------------------------------------- */

/*
 * One ganglion trial: starts o->nodes agents, times first fork -> coordinator serving,
 * stops them. Returns 0 with the seconds in *secs (and the part of them spent forking
 * the agents in *spawn_secs) and the count of agents that did not exit 0 after SIGTERM
 * in *bad_exits; GANG_ETIMEDOUT when the gang did not form.
 */
static int rdzv_trial_ganglion(bench_ctx *c, const bench_opts *o, double *secs, double *spawn_secs,
                               int *bad_exits)
{
    char nn[16], rp[16], hp[16];
    char **args = NULL;
    pid_t *pids = NULL;
    int nargs = 0, rdzv = 0, http = 0, started = 0;
    uint64_t t0, deadline;
    int rc;

    rc = pick_ports(c, &rdzv, &http);
    if (rc < 0)
        return rc;
    snprintf(nn, sizeof nn, "%d", o->nodes);
    snprintf(rp, sizeof rp, "%d", rdzv);
    snprintf(hp, sizeof hp, "%d", http);
    args = calloc((size_t)o->nextra + 16, sizeof *args);
    pids = calloc((size_t)o->nodes, sizeof *pids);
    if (args == NULL || pids == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    args[nargs++] = "--nnodes";
    args[nargs++] = nn;
    args[nargs++] = "--nproc-per-node";
    args[nargs++] = "1";
    args[nargs++] = "--rdzv-port";
    args[nargs++] = rp;
    args[nargs++] = "--http-port";
    args[nargs++] = hp;
    args[nargs++] = "--job-name";
    args[nargs++] = "bench-rendezvous";
    args[nargs++] = "--log-level";
    args[nargs++] = "warn";
    for (int i = 0; i < o->nextra; i++)
        args[nargs++] = o->extra[i];

    gang_local_spawn_cfg cfg = {.exe = "/proc/self/exe",
                                .argv0 = c->exe,
                                .args = args,
                                .nargs = nargs,
                                .rdzv_port = rdzv,
                                .out_fd = c->log_fd};
    t0 = gang_now_ns();
    for (int i = 0; i < o->nodes; i++) {
        cfg.node_index = i;
        rc = gang__local_spawn(&cfg, &pids[i]);
        if (rc < 0) {
            gang_error("bench: cannot start agent %d: %s", i, gang_strerror(rc));
            goto out_stop;
        }
        started++;
    }
    *spawn_secs = (double)(gang_now_ns() - t0) / 1e9;

    rc = GANG_ETIMEDOUT;
    deadline = gang_now_ms() + (uint64_t)o->timeout_s * 1000u;
    while (gang_now_ms() < deadline) {
        cJSON *st = get_status("127.0.0.1", http);
        int serving = st != NULL && strcmp(jstr(st, "gang", "state"), "serving") == 0;
        cJSON_Delete(st);
        if (serving) {
            *secs = (double)(gang_now_ns() - t0) / 1e9;
            rc = 0;
            break;
        }
        gang_sleep_ms(BENCH_POLL_MS);
    }

out_stop:
    *bad_exits = stop_all(pids, started, 0);
out_free:
    free(pids);
    free(args);
    return rc;
}

int gang__bench_find_in_path(const char *name, char *out, size_t cap)
{
    const char *path = getenv("PATH");
    const char *p = path ? path : "/usr/local/bin:/usr/bin:/bin";

    while (*p) {
        const char *colon = strchr(p, ':');
        size_t dl = colon ? (size_t)(colon - p) : strlen(p);
        if (dl > 0 && (size_t)snprintf(out, cap, "%.*s/%s", (int)dl, p, name) < cap &&
            access(out, X_OK) == 0)
            return 1;
        p += dl + (colon ? 1 : 0);
    }
    return 0;
}

/*
 * One peer trial: `mpirun --allow-run-as-root --oversubscribe -np N DIR/mpi-barrier`.
 * Returns 0 with the wall seconds; 1 with a reason when the peer is not available (the
 * caller prints "skipped"); a negative code with a reason when it failed.
 */
static int rdzv_trial_mpirun(bench_ctx *c, const bench_opts *o, double *secs, char *why,
                             size_t whycap)
{
    char mpirun[PATH_MAX], barrier[PATH_MAX + 16], np[16];
    pid_t pid = 0;
    int status = 0;
    uint64_t t0;
    int rc;

    if (!gang__bench_find_in_path("mpirun", mpirun, sizeof mpirun)) {
        snprintf(why, whycap, "mpirun not found in PATH (install openmpi-bin)");
        return 1;
    }
    snprintf(barrier, sizeof barrier, "%s/mpi-barrier", c->dir);
    if (access(barrier, X_OK) != 0) {
        snprintf(why, whycap, "%s not built (needs MPI at configure time)", barrier);
        return 1;
    }
    snprintf(np, sizeof np, "%d", o->nodes);
    char *argv[] = {mpirun, "--allow-run-as-root", "--oversubscribe", "-np", np, barrier, NULL};

    t0 = gang_now_ns();
    rc = spawn_group(argv, c->log_fd, &pid);
    if (rc < 0) {
        snprintf(why, whycap, "cannot start mpirun: %s", gang_strerror(rc));
        return rc;
    }
    if (reap_until(&pid, &status, 1, gang_now_ms() + (uint64_t)o->peer_timeout_s * 1000u) > 0) {
        /* mpirun stops its ranks on SIGTERM; what is left after the grace is killed. */
        kill(pid, SIGTERM);
        if (reap_until(&pid, &status, 1, gang_now_ms() + BENCH_STOP_GRACE_MS) > 0) {
            kill_tree(pid, SIGKILL);
            reap_until(&pid, &status, 1, gang_now_ms() + BENCH_KILL_GRACE_MS);
        }
        snprintf(why, whycap, "mpirun did not finish within %d s", o->peer_timeout_s);
        return GANG_ETIMEDOUT;
    }
    *secs = (double)(gang_now_ns() - t0) / 1e9;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(why, whycap, "mpirun failed (wait status 0x%x); see %s", (unsigned)status,
                 c->log_path);
        return GANG_EPEER;
    }
    return 0;
}

static int bench_rendezvous(bench_ctx *c, const bench_opts *o)
{
    double *g = calloc((size_t)o->trials + 1, sizeof *g);
    double *m = calloc((size_t)o->trials + 1, sizeof *m);
    int ng = 0, nm = 0, failed = 0;
    char skipped[PATH_MAX + 128] = "";

    if (g == NULL || m == NULL) {
        free(g);
        free(m);
        return GANG_EXIT_INTERNAL;
    }
    for (int t = -o->warmup; t < o->trials; t++) {
        cJSON *line = cJSON_CreateObject();
        double gs = 0, ms = 0, spawn = 0;
        int bad = 0;
        char why[PATH_MAX + 128] = "";
        int rc = rdzv_trial_ganglion(c, o, &gs, &spawn, &bad);

        cJSON_AddStringToObject(line, "bench", "rendezvous");
        cJSON_AddNumberToObject(line, "trial", t);
        if (t < 0)
            cJSON_AddBoolToObject(line, "warmup", 1);
        cJSON_AddNumberToObject(line, "nodes", o->nodes);
        if (rc < 0) {
            cJSON_AddStringToObject(line, "error", gang_strerror(rc));
            cJSON_AddStringToObject(line, "agent_log", c->log_path);
            failed = 1;
        } else {
            cJSON_AddNumberToObject(line, "ganglion_s", round_to(gs, 4));
            cJSON_AddNumberToObject(line, "spawn_s", round_to(spawn, 4));
            if (t >= 0)
                g[ng++] = gs;
        }
        cJSON_AddNumberToObject(line, "agents_unclean_exit", bad);
        if (!o->no_peer && skipped[0] == '\0') {
            int prc = rdzv_trial_mpirun(c, o, &ms, why, sizeof why);
            if (prc == 1) {
                gang_strlcpy(skipped, why, sizeof skipped);
            } else if (prc < 0) {
                cJSON_AddStringToObject(line, "mpirun_error", why);
            } else {
                cJSON_AddNumberToObject(line, "mpirun_s", round_to(ms, 4));
                if (rc == 0)
                    cJSON_AddNumberToObject(line, "ratio", round_to(ms / gs, 3));
                if (t >= 0)
                    m[nm++] = ms;
            }
        }
        json_emit(line);
        reap_strays();
        if (skipped[0] != '\0' && t == -o->warmup) {
            cJSON *peer = cJSON_CreateObject();
            cJSON_AddStringToObject(peer, "peer", "mpirun");
            cJSON_AddStringToObject(peer, "skipped", skipped);
            json_emit(peer);
        }
    }

    cJSON *sum = cJSON_CreateObject();
    cJSON_AddStringToObject(sum, "bench", "rendezvous");
    cJSON_AddBoolToObject(sum, "summary", 1);
    cJSON_AddNumberToObject(sum, "nodes", o->nodes);
    cJSON_AddNumberToObject(sum, "trials", o->trials);
    cJSON_AddNumberToObject(sum, "measured", ng);
    json_add_stats(sum, "ganglion_s", g, ng, 4);
    json_add_stats(sum, "mpirun_s", m, nm, 4);
    if (ng > 0 && nm > 0)
        cJSON_AddNumberToObject(sum, "ratio_p50", round_to(median(m, nm) / median(g, ng), 3));
    else if (skipped[0] != '\0')
        cJSON_AddStringToObject(sum, "peer_skipped", skipped);
    cJSON_AddStringToObject(sum, "agent_log", c->log_path);
    json_emit(sum);
    free(g);
    free(m);
    return failed ? BENCH_EXIT_FAILED : GANG_EXIT_OK;
}

/* ---------------------------------------------------------------------------------
 * bench failover
 * --------------------------------------------------------------------------------- */

/* A running local gang as the failover benchmark sees it. */
typedef struct failover_gang {
    pid_t pid; /* the `serve --local` parent (its own process group) */
    int nnodes;
    int http_port;
    char (*addr)[GANG_LOCAL_ADDR_MAX]; /* each agent's address */
} failover_gang;

/* Coordinator's view: gang state and generation; 0 when /status could not be read. */
static int coord_view(const failover_gang *fg, char *state, size_t cap, int64_t *gen,
                      int64_t *serving_since)
{
    cJSON *st = get_status(fg->addr[0], fg->http_port);

    if (st == NULL)
        return 0;
    gang_strlcpy(state, jstr(st, "gang", "state"), cap);
    *gen = (int64_t)jnum(st, "gang", "generation", -1);
    if (serving_since)
        *serving_since = (int64_t)jnum(st, "gang", "serving_since_wall_ms", 0);
    cJSON_Delete(st);
    return 1;
}

/*
 * Waits until the coordinator serves a generation above min_gen and every agent reports
 * ready in that generation. Returns 0 and the generation, or GANG_ETIMEDOUT.
 */
static int wait_settled(const failover_gang *fg, int64_t min_gen, uint64_t deadline_ms,
                        int64_t *gen_out)
{
    while (gang_now_ms() < deadline_ms) {
        char state[32] = "";
        int64_t gen = -1;
        int all = 1;

        if (coord_view(fg, state, sizeof state, &gen, NULL) && strcmp(state, "serving") == 0 &&
            gen > min_gen) {
            for (int a = 0; a < fg->nnodes && all; a++) {
                cJSON *st = get_status(fg->addr[a], fg->http_port);
                all = st != NULL && cJSON_IsTrue(cJSON_GetObjectItem(st, "ready")) &&
                      (int64_t)jnum(st, "generation", NULL, -1) == gen;
                cJSON_Delete(st);
            }
            if (all) {
                *gen_out = gen;
                return 0;
            }
        }
        gang_sleep_ms(BENCH_POLL_MS * 4);
    }
    return GANG_ETIMEDOUT;
}

/* The pid of local rank `lr` on agent `node`, or -1. */
static pid_t worker_pid(const failover_gang *fg, int node, int lr)
{
    cJSON *st = get_status(fg->addr[node], fg->http_port);
    const cJSON *ranks = st ? cJSON_GetObjectItemCaseSensitive(st, "local_ranks") : NULL;
    const cJSON *r = cJSON_IsArray(ranks) ? cJSON_GetArrayItem(ranks, lr) : NULL;
    pid_t pid = r ? (pid_t)jnum(r, "pid", NULL, -1) : -1;

    cJSON_Delete(st);
    return pid;
}

/* Results of one failover trial. */
typedef struct failover_result {
    double detect_ms;       /* last agent to learn of the failure */
    double first_detect_ms; /* first agent */
    double reform_ms;       /* kill -> coordinator serving a newer generation */
    double reform_after_detect_ms;
    int64_t generation; /* the new generation */
} failover_result;

/*
 * One trial: signals a worker of a non-coordinator node (SIGKILL for a crash, SIGSTOP for
 * a hang) and watches every agent's last_abort_wall_ms and the coordinator's generation.
 * Detection uses the agents' own wall clocks; re-formation uses the coordinator's
 * serving_since_wall_ms when it reports one, else the poll that first saw "serving".
 */
static int failover_trial(const failover_gang *fg, const bench_opts *o, int trial, int hang,
                          int64_t gen0, failover_result *res, cJSON *line)
{
    int node = fg->nnodes > 1 ? 1 + trial % (fg->nnodes - 1) : 0;
    int lr = trial % o->nproc_per_node;
    pid_t pid = worker_pid(fg, node, lr);
    int64_t *seen = calloc((size_t)fg->nnodes, sizeof *seen);
    int nseen = 0, rc = GANG_ETIMEDOUT;
    uint64_t kill_wall, kill_ns, deadline;
    cJSON *per_node;

    cJSON_AddNumberToObject(line, "node", node);
    cJSON_AddNumberToObject(line, "local_rank", lr);
    if (seen == NULL)
        return GANG_ENOMEM;
    if (pid <= 0) {
        cJSON_AddStringToObject(line, "error", "no worker pid in the agent's /status");
        free(seen);
        return GANG_ENOENT;
    }
    kill_wall = gang_wall_ms();
    kill_ns = gang_now_ns();
    kill(pid, hang ? SIGSTOP : SIGKILL);
    deadline = gang_now_ms() + (uint64_t)o->timeout_s * 1000u;

    while (gang_now_ms() < deadline) {
        for (int a = 0; a < fg->nnodes && nseen < fg->nnodes; a++) {
            if (seen[a] != 0)
                continue;
            cJSON *st = get_status(fg->addr[a], fg->http_port);
            int64_t t = st ? (int64_t)jnum(st, "last_abort_wall_ms", NULL, 0) : 0;
            cJSON_Delete(st);
            if (t >= (int64_t)kill_wall) {
                seen[a] = t;
                nseen++;
            }
        }
        if (nseen == fg->nnodes) {
            char state[32] = "";
            int64_t gen = -1, since = 0;
            if (coord_view(fg, state, sizeof state, &gen, &since) &&
                strcmp(state, "serving") == 0 && gen > gen0) {
                double polled = (double)(gang_now_ns() - kill_ns) / 1e6;
                res->reform_ms =
                    since >= (int64_t)kill_wall ? (double)(since - (int64_t)kill_wall) : polled;
                res->generation = gen;
                rc = 0;
                break;
            }
        }
        gang_sleep_ms(BENCH_POLL_MS);
    }
    /* A hung worker should have been killed by its agent; if it was not, let it go on. */
    if (hang)
        kill(pid, SIGCONT);

    per_node = cJSON_AddArrayToObject(line, "detect_ms_by_node");
    res->detect_ms = 0;
    res->first_detect_ms = 1e18;
    for (int a = 0; a < fg->nnodes; a++) {
        double d = seen[a] ? (double)(seen[a] - (int64_t)kill_wall) : -1;
        cJSON_AddItemToArray(per_node, cJSON_CreateNumber(d));
        if (seen[a] && d > res->detect_ms)
            res->detect_ms = d;
        if (seen[a] && d < res->first_detect_ms)
            res->first_detect_ms = d;
    }
    res->reform_after_detect_ms = res->reform_ms - res->detect_ms;
    if (rc < 0)
        cJSON_AddStringToObject(line, "error",
                                nseen < fg->nnodes ? "not every agent saw the abort"
                                                   : "gang did not re-form in time");
    free(seen);
    return rc;
}

/* Starts `serve --local` for the failover benchmark. */
static int failover_start(bench_ctx *c, const bench_opts *o, failover_gang *fg)
{
    char nn[16], np[16], rp[16], hp[16], hi[16], ht[16], at[16], mr[16];
    char **argv;
    int n = 0, rdzv = 0, rc;

    rc = pick_ports(c, &rdzv, &fg->http_port);
    if (rc < 0)
        return rc;
    fg->nnodes = o->nnodes;
    fg->addr = calloc((size_t)o->nnodes, sizeof *fg->addr);
    argv = calloc((size_t)o->nextra + 40, sizeof *argv);
    if (fg->addr == NULL || argv == NULL) {
        free(argv);
        return GANG_ENOMEM;
    }
    for (int a = 0; a < o->nnodes; a++)
        gang__local_address(a, fg->addr[a], sizeof fg->addr[a]);
    snprintf(nn, sizeof nn, "%d", o->nnodes);
    snprintf(np, sizeof np, "%d", o->nproc_per_node);
    snprintf(rp, sizeof rp, "%d", rdzv);
    snprintf(hp, sizeof hp, "%d", fg->http_port);
    snprintf(hi, sizeof hi, "%d", o->hb_interval_ms);
    snprintf(ht, sizeof ht, "%d", o->hb_timeout_ms);
    snprintf(at, sizeof at, "%d", o->abort_timeout_ms);
    /* Every trial is a gang restart; the budget must outlast them all. */
    snprintf(mr, sizeof mr, "%d", 4 * (o->trials + o->warmup) + 10);

    /* Flag/value pairs read best one pair per line. */
    /* clang-format off */
    char *fixed[] = {
        c->exe, "serve", "--local",
        "--nnodes", nn,
        "--nproc-per-node", np,
        "--rdzv-port", rp,
        "--http-port", hp,
        "--heartbeat-interval-ms", hi,
        "--heartbeat-timeout-ms", ht,
        "--abort-timeout-ms", at,
        "--max-restarts", mr,
        "--restart-backoff-ms", "20",
        "--restart-backoff-max-ms", "200",
        "--job-name", "bench-failover",
        "--log-level", "warn",
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        argv[n++] = fixed[i];
    for (int i = 0; i < o->nextra; i++)
        argv[n++] = o->extra[i];
    argv[n] = NULL;
    rc = spawn_group(argv, c->log_fd, &fg->pid);
    free(argv);
    return rc;
}

static int bench_failover(bench_ctx *c, const bench_opts *o)
{
    failover_gang fg = {0};
    int ntotal = (o->crash + o->hang) * (o->trials + o->warmup);
    double *v[4]; /* crash detect, crash reform, hang detect, hang reform */
    double *after[2];
    int nv[2] = {0, 0};
    int failed = 0, rc, unclean = 0;
    int64_t gen = 0;

    for (int k = 0; k < 4; k++)
        v[k] = calloc((size_t)o->trials + 1, sizeof(double));
    for (int k = 0; k < 2; k++)
        after[k] = calloc((size_t)o->trials + 1, sizeof(double));
    if (!v[0] || !v[1] || !v[2] || !v[3] || !after[0] || !after[1]) {
        gang_error("bench: out of memory");
        failed = 1;
        goto out_free;
    }
    rc = failover_start(c, o, &fg);
    if (rc < 0) {
        gang_error("bench: cannot start the local gang: %s", gang_strerror(rc));
        failed = 1;
        goto out_free;
    }
    rc = wait_settled(&fg, -1, gang_now_ms() + (uint64_t)o->timeout_s * 1000u, &gen);
    if (rc < 0) {
        cJSON *line = cJSON_CreateObject();
        cJSON_AddStringToObject(line, "bench", "failover");
        cJSON_AddStringToObject(line, "error", "the gang did not form");
        cJSON_AddStringToObject(line, "agent_log", c->log_path);
        json_emit(line);
        failed = 1;
        goto out_stop;
    }

    /* Crash and hang trials alternate, so both see the same machine conditions. */
    for (int t = 0; t < ntotal; t++) {
        int hang = o->crash && o->hang ? t % 2 : o->hang;
        int index = o->crash && o->hang ? t / 2 : t;
        int timed = index >= o->warmup;
        failover_result res = {0};
        cJSON *line = cJSON_CreateObject();

        cJSON_AddStringToObject(line, "bench", "failover");
        cJSON_AddStringToObject(line, "kind", hang ? "hang" : "crash");
        cJSON_AddNumberToObject(line, "trial", index - o->warmup);
        if (!timed)
            cJSON_AddBoolToObject(line, "warmup", 1);
        rc = failover_trial(&fg, o, t, hang, gen, &res, line);
        if (rc == 0) {
            cJSON_AddNumberToObject(line, "detect_ms", res.detect_ms);
            cJSON_AddNumberToObject(line, "first_detect_ms", res.first_detect_ms);
            cJSON_AddNumberToObject(line, "reform_ms", round_to(res.reform_ms, 1));
            cJSON_AddNumberToObject(line, "reform_after_detect_ms",
                                    round_to(res.reform_after_detect_ms, 1));
            cJSON_AddNumberToObject(line, "generation", (double)res.generation);
            rc = wait_settled(&fg, res.generation - 1,
                              gang_now_ms() + (uint64_t)o->timeout_s * 1000u, &gen);
            if (rc < 0)
                cJSON_AddStringToObject(line, "error", "agents did not all become ready");
        } else if (!cJSON_GetObjectItem(line, "error")) {
            cJSON_AddStringToObject(line, "error", gang_strerror(rc));
        }
        json_emit(line);
        if (rc < 0) {
            failed = 1;
            break;
        }
        if (timed) {
            v[hang * 2][nv[hang]] = res.detect_ms;
            v[hang * 2 + 1][nv[hang]] = res.reform_ms;
            after[hang][nv[hang]] = res.reform_after_detect_ms;
            nv[hang]++;
        }
    }

out_stop:
    unclean = stop_all(&fg.pid, 1, 1);
    {
        cJSON *sum = cJSON_CreateObject();
        cJSON *set = cJSON_CreateObject();
        double bound = o->hb_timeout_ms + o->hb_interval_ms;

        cJSON_AddStringToObject(sum, "bench", "failover");
        cJSON_AddBoolToObject(sum, "summary", 1);
        cJSON_AddNumberToObject(set, "nnodes", o->nnodes);
        cJSON_AddNumberToObject(set, "nproc_per_node", o->nproc_per_node);
        cJSON_AddNumberToObject(set, "heartbeat_interval_ms", o->hb_interval_ms);
        cJSON_AddNumberToObject(set, "heartbeat_timeout_ms", o->hb_timeout_ms);
        cJSON_AddNumberToObject(set, "abort_timeout_ms", o->abort_timeout_ms);
        cJSON_AddItemToObject(sum, "settings", set);
        cJSON_AddNumberToObject(sum, "crash_trials", nv[0]);
        cJSON_AddNumberToObject(sum, "hang_trials", nv[1]);
        json_add_stats(sum, "crash_detect_ms", v[0], nv[0], 1);
        json_add_stats(sum, "crash_reform_ms", v[1], nv[0], 1);
        json_add_stats(sum, "crash_reform_after_detect_ms", after[0], nv[0], 1);
        json_add_stats(sum, "hang_detect_ms", v[2], nv[1], 1);
        json_add_stats(sum, "hang_reform_ms", v[3], nv[1], 1);
        json_add_stats(sum, "hang_reform_after_detect_ms", after[1], nv[1], 1);
        /* The targets, judged on the medians (v[] is sorted by now). */
        if (nv[0] > 0)
            cJSON_AddBoolToObject(sum, "crash_detect_under_100ms", median(v[0], nv[0]) < 100);
        if (nv[1] > 0) {
            cJSON_AddNumberToObject(sum, "hang_detect_bound_ms", bound);
            cJSON_AddBoolToObject(sum, "hang_detect_within_bound", median(v[2], nv[1]) <= bound);
        }
        cJSON_AddBoolToObject(sum, "gang_stopped_cleanly", unclean == 0);
        cJSON_AddStringToObject(sum, "agent_log", c->log_path);
        json_emit(sum);
    }
out_free:
    for (int k = 0; k < 4; k++)
        free(v[k]);
    for (int k = 0; k < 2; k++)
        free(after[k]);
    free(fg.addr);
    return failed ? BENCH_EXIT_FAILED : GANG_EXIT_OK;
}

/* ---------------------------------------------------------------------------------
 * Command line.
 * --------------------------------------------------------------------------------- */

static void bench_usage(void)
{
    fprintf(stderr, "usage: ganglion bench rendezvous --nodes N [--trials T] [--warmup W] "
                    "[--timeout-s S]\n"
                    "                [--no-peer] [--peer-timeout-s S] [--agent-log FILE] "
                    "[-- SERVE FLAGS]\n"
                    "       ganglion bench failover [--trials T] [--warmup W] [--nnodes P] "
                    "[--nproc-per-node Q]\n"
                    "                [--heartbeat-interval-ms I] [--heartbeat-timeout-ms H] "
                    "[--abort-timeout-ms A]\n"
                    "                [--kinds crash,hang] [--timeout-s S] [--agent-log FILE] "
                    "[-- SERVE FLAGS]\n"
                    "       ganglion bench allreduce [--ranks N] [--backend socket|mpi] "
                    "[--max-bytes B] [--timeout-s S] [--no-peer]\n"
                    "       ganglion bench pipeline [--pp P] [--microbatches M] [--stage-ms T] "
                    "[--bytes B] [--iters N]\n");
}

/*
 * Matches argv[*i] against --name (taking "--name=v" or "--name v"); on a match stores
 * the value, advances *i past it and returns 1. Returns -1 when the value is missing.
 */
static int opt_value(int argc, char **argv, int *i, const char *name, const char **val)
{
    size_t n = strlen(name);
    const char *a = argv[*i];

    if (strncmp(a, "--", 2) != 0 || strncmp(a + 2, name, n) != 0)
        return 0;
    if (a[2 + n] == '=') {
        *val = a + 3 + n;
        return 1;
    }
    if (a[2 + n] != '\0')
        return 0;
    if (*i + 1 >= argc)
        return -1;
    *val = argv[++*i];
    return 1;
}

/* Parses argv into o; returns 0 or GANG_EUSAGE after printing why. */
static int bench_parse(int argc, char **argv, bench_opts *o)
{
    static const struct {
        const char *name;
        size_t off;
        int64_t lo, hi;
    } ints[] = {
        {"nodes", offsetof(bench_opts, nodes), 1, 4096},
        {"trials", offsetof(bench_opts, trials), 1, 100000},
        {"warmup", offsetof(bench_opts, warmup), 0, 1000},
        {"timeout-s", offsetof(bench_opts, timeout_s), 1, 86400},
        {"peer-timeout-s", offsetof(bench_opts, peer_timeout_s), 1, 86400},
        {"nnodes", offsetof(bench_opts, nnodes), 1, 4096},
        {"nproc-per-node", offsetof(bench_opts, nproc_per_node), 1, 64},
        {"heartbeat-interval-ms", offsetof(bench_opts, hb_interval_ms), 10, 600000},
        {"heartbeat-timeout-ms", offsetof(bench_opts, hb_timeout_ms), 20, 3600000},
        {"abort-timeout-ms", offsetof(bench_opts, abort_timeout_ms), 10, 600000},
    };
    int i = 0;

    if (argc > 0 && strcmp(argv[0], "bench") == 0)
        i = 1;
    if (i >= argc) {
        bench_usage();
        return GANG_EUSAGE;
    }
    o->kind = argv[i++];
    for (; i < argc; i++) {
        const char *val = NULL;
        int matched = 0;

        if (strcmp(argv[i], "--") == 0) {
            o->extra = argv + i + 1;
            o->nextra = argc - i - 1;
            break;
        }
        if (strcmp(argv[i], "--no-peer") == 0) {
            o->no_peer = 1;
            continue;
        }
        for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !matched; k++) {
            int m = opt_value(argc, argv, &i, ints[k].name, &val);
            int64_t x;
            if (m == 0)
                continue;
            if (m < 0 || gang_parse_i64(val, ints[k].lo, ints[k].hi, &x) != 0) {
                fprintf(stderr, "ganglion bench: --%s needs an integer in [%lld, %lld]\n",
                        ints[k].name, (long long)ints[k].lo, (long long)ints[k].hi);
                return GANG_EUSAGE;
            }
            *(int *)(void *)((char *)o + ints[k].off) = (int)x;
            matched = 1;
        }
        if (matched)
            continue;
        int m = opt_value(argc, argv, &i, "agent-log", &val);
        if (m > 0) {
            o->agent_log = val;
            continue;
        }
        if (m == 0)
            m = opt_value(argc, argv, &i, "kinds", &val);
        if (m > 0) {
            o->crash = strstr(val, "crash") != NULL;
            o->hang = strstr(val, "hang") != NULL;
            if (!o->crash && !o->hang) {
                fprintf(stderr, "ganglion bench: --kinds takes crash, hang or crash,hang\n");
                return GANG_EUSAGE;
            }
            continue;
        }
        fprintf(stderr, "ganglion bench: unknown or incomplete argument '%s'\n", argv[i]);
        bench_usage();
        return GANG_EUSAGE;
    }
    if (strcmp(o->kind, "rendezvous") != 0 && strcmp(o->kind, "failover") != 0) {
        fprintf(stderr, "ganglion bench: unknown benchmark '%s'\n", o->kind);
        bench_usage();
        return GANG_EUSAGE;
    }
    if (strcmp(o->kind, "failover") == 0 && o->nnodes < 2) {
        fprintf(stderr, "ganglion bench failover: --nnodes must be at least 2\n");
        return GANG_EUSAGE;
    }
    return 0;
}

/* Opens the agent log (given, or a fresh file in $TMPDIR) and finds this binary. */
static int bench_ctx_init(bench_ctx *c, const bench_opts *o)
{
    ssize_t len = readlink("/proc/self/exe", c->exe, sizeof c->exe - 1);
    const char *tmp = getenv("TMPDIR");
    char *slash;

    if (len <= 0) {
        gang_error("bench: cannot read /proc/self/exe: %s", strerror(errno));
        return GANG_ENOENT;
    }
    c->exe[len] = '\0';
    gang_strlcpy(c->dir, c->exe, sizeof c->dir);
    slash = strrchr(c->dir, '/');
    if (slash != NULL)
        *slash = '\0';
    c->rng = (gang_now_ns() ^ ((uint64_t)getpid() << 32)) | 1;

    if (o->agent_log != NULL)
        gang_strlcpy(c->log_path, o->agent_log, sizeof c->log_path);
    else
        snprintf(c->log_path, sizeof c->log_path, "%s/ganglion-bench-%s-%d.log",
                 tmp && *tmp ? tmp : "/tmp", o->kind, (int)getpid());
    c->log_fd = open(c->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (c->log_fd < 0) {
        gang_error("bench: cannot open %s: %s", c->log_path, strerror(errno));
        return gang_err_from_errno(errno);
    }
    return 0;
}

int gang_bench_main(int argc, char **argv)
{
    bench_opts o = {.nodes = 8,
                    .trials = 0,
                    .warmup = 1,
                    .timeout_s = 0,
                    .peer_timeout_s = 900,
                    .nnodes = 4,
                    .nproc_per_node = 2,
                    .hb_interval_ms = 100,
                    .hb_timeout_ms = 1000,
                    .abort_timeout_ms = 500,
                    .crash = 1,
                    .hang = 1};
    bench_ctx c = {.log_fd = -1};
    int rc;

    if (argc > 0 && strncmp(argv[0], "allreduce", 9) == 0)
        return gang_bench_allreduce_main(argc, argv);
    if (argc > 0 && strcmp(argv[0], "pipeline") == 0)
        return gang_bench_pipeline_main(argc, argv);
    if (argc > 0 && strcmp(argv[0], "decode") == 0)
        return gang_bench_decode_main(argc, argv);
    if (argc > 0 && strcmp(argv[0], "gemm") == 0)
        return gang_bench_gemm_main(argc, argv);
    if (bench_parse(argc, argv, &o) < 0)
        return GANG_EXIT_USAGE;
    if (bench_ctx_init(&c, &o) < 0)
        return GANG_EXIT_INTERNAL;
    /* A broken pipe on stdout (| head) must not kill the run before its children are
     * stopped; writes then just fail. */
    signal(SIGPIPE, SIG_IGN);

    if (strcmp(o.kind, "rendezvous") == 0) {
        o.trials = o.trials ? o.trials : 5;
        o.timeout_s = o.timeout_s ? o.timeout_s : 120;
        gang_info("bench rendezvous: %d node(s), %d trial(s) after %d warm-up; agent log %s",
                  o.nodes, o.trials, o.warmup, c.log_path);
        rc = bench_rendezvous(&c, &o);
    } else {
        o.trials = o.trials ? o.trials : 10;
        o.timeout_s = o.timeout_s ? o.timeout_s : 60;
        gang_info("bench failover: %d x %d, %d trial(s) per kind after %d warm-up; "
                  "agent log %s",
                  o.nnodes, o.nproc_per_node, o.trials, o.warmup, c.log_path);
        rc = bench_failover(&c, &o);
    }
    close(c.log_fd);
    return rc;
}
