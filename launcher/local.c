/*
 * Local mode: a whole gang of agents on one host, supervised the way kubelet supervises
 * the Pods of a StatefulSet.
 *
 * The parent is a small single-threaded supervisor. It forks one agent per node, each
 * bound to its own loopback address so that every agent can use the same HTTP and
 * rendezvous port numbers, exactly as Pods do with their own IPs. It then sleeps in
 * poll(2) on a signalfd that delivers SIGCHLD, SIGINT, SIGTERM and SIGHUP; the poll
 * timeout is the nearest deadline (a scheduled restart or a shutdown step), so every
 * wait is bounded and no signal can be lost between a check and the sleep.
 *
 * Exit status policy (the exit codes of docs/design.md):
 *   signal, 70 or any other code   restart after a backoff, like a crashed container;
 *   0                              the agent stopped cleanly: it stays down;
 *   2, 3                           configuration or model error, never retried: the gang
 *                                  cannot form, so everything stops with that code;
 *   75                             the agent gave up (restart budget spent): nothing is
 *                                  restarted any more, the others are given their
 *                                  give-up linger to exit on their own, then stopped;
 *   127                            exec failed (GANG_PROC_EXEC_FAILED): stop everything,
 *                                  exit 70.
 *
 * Shutdown runs in steps, each with a deadline: optionally wait for the agents to exit
 * on their own (after a give-up), then SIGTERM and wait 5 s, then SIGKILL and wait 5 s
 * more; an agent that survives even that is reported and abandoned.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "local.h"
#include "proc.h"

#define LOCAL_BACKOFF_INITIAL_MS 100
#define LOCAL_BACKOFF_MAX_MS 2000
#define LOCAL_STABLE_MS 10000       /* uptime after which an agent's backoff is reset */
#define LOCAL_TERM_GRACE_MS 5000    /* SIGTERM -> SIGKILL */
#define LOCAL_KILL_GRACE_MS 5000    /* SIGKILL -> abandon */
#define LOCAL_GIVE_UP_SLACK_MS 2000 /* added to --give-up-linger-ms */

/* One supervised agent. */
typedef struct local_agent {
    pid_t pid;              /* running process, 0 when down */
    uint64_t started_ms;    /* monotonic time of the last start */
    uint64_t restart_at_ms; /* monotonic time of a scheduled restart, 0 = none */
    uint32_t restarts;      /* restarts so far, for the logs */
    gang_backoff backoff;   /* delay before the next restart */
} local_agent;

/* Where the shutdown sequence stands. */
typedef enum local_phase {
    LOCAL_RUNNING = 0, /* supervising and restarting */
    LOCAL_DRAINING,    /* no restarts; waiting for agents to exit on their own */
    LOCAL_TERMINATING, /* SIGTERM sent; waiting */
    LOCAL_KILLING,     /* SIGKILL sent; waiting */
    LOCAL_DONE
} local_phase;

typedef struct local_gang {
    gang_local_spawn_cfg spawn; /* shared spawn settings; node_index set per start */
    local_agent *agents;
    int nagents;
    int sfd; /* signalfd for SIGCHLD, SIGINT, SIGTERM, SIGHUP */
    local_phase phase;
    uint64_t phase_deadline_ms; /* when the current shutdown step ends */
    int exit_code;              /* what gang_local_main() returns */
} local_gang;

/* ---------------------------------------------------------------------------------
 * Addresses and argument lists.
 * --------------------------------------------------------------------------------- */

int gang__local_address(int index, char *buf, size_t cap)
{
    int n;

    /* The third octet grows by one per 254 nodes and must stay below 256. */
    if (index < 0 || index / 254 > 254)
        return GANG_EINVAL;
    if (index < 254)
        n = snprintf(buf, cap, "127.0.0.%d", index + 1);
    else
        n = snprintf(buf, cap, "127.0.%d.%d", 1 + index / 254, 1 + index % 254);
    if (n < 0 || (size_t)n >= cap)
        return GANG_ERANGE;
    return 0;
}

/* The flags gang__local_spawn() sets per agent; every other forwarded flag is shared. */
const char *const gang__local_per_agent_flags[] = {"node-index", "bind-address", "coordinator",
                                                   NULL};

int gang__local_agent_args(const gang_params *p, gang_args *out)
{
    return gang_params_forward_args(p, gang__local_per_agent_flags, out);
}

/* ---------------------------------------------------------------------------------
 * Spawning.
 * --------------------------------------------------------------------------------- */

/*
 * Builds the agent's argv and starts it with gang_proc_spawn (proc.h: empty signal mask
 * and default dispositions, whatever this supervisor blocks for its signalfd). SIGTERM
 * rather than SIGKILL as the parent-death signal: the agent then stops its own workers
 * cleanly. The argv is freed once the child is started.
 */
int gang__local_spawn(const gang_local_spawn_cfg *cfg, pid_t *out)
{
    char arg0[PATH_MAX];
    char addr[GANG_LOCAL_ADDR_MAX];
    char index[16];
    char coord[32];
    gang_spawn sp = {.path = cfg->exe,
                     .out_fd = cfg->out_fd,
                     .err_fd = cfg->out_fd,
                     .close_fd = -1,
                     .death_signal = SIGTERM,
                     .drop_local = 1};
    char **argv;
    int n = 0;
    int rc;

    rc = gang__local_address(cfg->node_index, addr, sizeof addr);
    if (rc < 0)
        return rc;
    snprintf(index, sizeof index, "%d", cfg->node_index);
    snprintf(coord, sizeof coord, "127.0.0.1:%d", cfg->rdzv_port);

    /* argv0, "serve", the shared args, three flag/value pairs, NULL. */
    argv = calloc((size_t)cfg->nargs + 9, sizeof *argv);
    if (argv == NULL)
        return GANG_ENOMEM;
    /* A copy: exec takes its arguments as char *. */
    snprintf(arg0, sizeof arg0, "%s", cfg->argv0 ? cfg->argv0 : cfg->exe);
    argv[n++] = arg0;
    argv[n++] = "serve";
    for (int i = 0; i < cfg->nargs; i++)
        argv[n++] = cfg->args[i];
    argv[n++] = "--node-index";
    argv[n++] = index;
    argv[n++] = "--bind-address";
    argv[n++] = addr;
    argv[n++] = "--coordinator";
    argv[n++] = coord;
    argv[n] = NULL;

    rc = gang_proc_spawn(argv, &sp, out);
    free(argv);
    return rc;
}

/* ---------------------------------------------------------------------------------
 * Supervision.
 * --------------------------------------------------------------------------------- */

/* Starts agent i now. A failed fork is retried through the normal restart backoff. */
static void local_start(local_gang *g, int i)
{
    local_agent *a = &g->agents[i];
    char addr[GANG_LOCAL_ADDR_MAX];
    int rc;

    a->restart_at_ms = 0;
    g->spawn.node_index = i;
    gang__local_address(i, addr, sizeof addr);
    rc = gang__local_spawn(&g->spawn, &a->pid);
    if (rc < 0) {
        uint64_t delay = gang_backoff_next(&a->backoff);
        gang_error("local: cannot start agent %d: %s; retrying in %llu ms", i, gang_strerror(rc),
                   (unsigned long long)delay);
        a->pid = 0;
        a->restart_at_ms = gang_now_ms() + delay;
        return;
    }
    a->started_ms = gang_now_ms();
    gang_info("local: started agent %d (pid %d) on %s, restarts %u", i, (int)a->pid, addr,
              a->restarts);
}

/* Sends sig to every running agent. */
static void local_signal_all(local_gang *g, int sig)
{
    for (int i = 0; i < g->nagents; i++) {
        if (g->agents[i].pid > 0)
            kill(g->agents[i].pid, sig);
    }
}

static int local_running(const local_gang *g)
{
    int n = 0;

    for (int i = 0; i < g->nagents; i++)
        n += g->agents[i].pid > 0;
    return n;
}

/*
 * Enters a shutdown phase: cancels scheduled restarts, sends the phase's signal and sets
 * its deadline. The first reason to stop decides the exit code; later ones only move
 * the sequence forward.
 */
static void local_enter_phase(local_gang *g, local_phase phase, uint64_t wait_ms)
{
    for (int i = 0; i < g->nagents; i++)
        g->agents[i].restart_at_ms = 0;
    g->phase = phase;
    g->phase_deadline_ms = gang_now_ms() + wait_ms;
    if (phase == LOCAL_TERMINATING) {
        gang_info("local: sending SIGTERM to %d agent(s)", local_running(g));
        local_signal_all(g, SIGTERM);
    } else if (phase == LOCAL_KILLING) {
        gang_warn("local: sending SIGKILL to %d agent(s) still running", local_running(g));
        local_signal_all(g, SIGKILL);
    }
}

/* Starts shutting down with exit code `code`, unless a shutdown is already under way. */
static void local_stop(local_gang *g, int code, local_phase phase, uint64_t wait_ms)
{
    if (g->phase != LOCAL_RUNNING)
        return;
    g->exit_code = code;
    local_enter_phase(g, phase, wait_ms);
}

/* Applies the exit status policy of the file comment to agent i's wait status. */
static void local_on_exit(local_gang *g, int i, int status, const gang_params *p)
{
    local_agent *a = &g->agents[i];
    uint64_t up_ms = gang_now_ms() - a->started_ms;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;

    if (WIFSIGNALED(status))
        gang_info("local: agent %d (pid %d) killed by signal %d after %llu ms", i, (int)a->pid,
                  WTERMSIG(status), (unsigned long long)up_ms);
    else
        gang_info("local: agent %d (pid %d) exited with code %d after %llu ms", i, (int)a->pid,
                  code, (unsigned long long)up_ms);
    a->pid = 0;
    if (g->phase != LOCAL_RUNNING)
        return;

    switch (code) {
    case GANG_EXIT_OK:
        gang_info("local: agent %d stopped cleanly; not restarting it", i);
        return;
    case GANG_EXIT_USAGE:
    case GANG_EXIT_MODEL:
        gang_error("local: agent %d failed with a %s error (exit %d), which a restart cannot "
                   "fix; stopping the gang",
                   i, code == GANG_EXIT_USAGE ? "usage" : "model", code);
        local_stop(g, code, LOCAL_TERMINATING, LOCAL_TERM_GRACE_MS);
        return;
    case GANG_EXIT_TEMPFAIL:
        gang_error("local: agent %d gave up (exit 75); waiting up to %lld ms for the others "
                   "to exit",
                   i, (long long)p->give_up_linger_ms + LOCAL_GIVE_UP_SLACK_MS);
        local_stop(g, GANG_EXIT_TEMPFAIL, LOCAL_DRAINING,
                   (uint64_t)p->give_up_linger_ms + LOCAL_GIVE_UP_SLACK_MS);
        return;
    case GANG_PROC_EXEC_FAILED:
        gang_error("local: agent %d could not be executed; stopping the gang", i);
        local_stop(g, GANG_EXIT_INTERNAL, LOCAL_TERMINATING, LOCAL_TERM_GRACE_MS);
        return;
    default:
        break;
    }

    /* A crash: restart after a backoff that resets once the agent had run stably. */
    if (up_ms >= LOCAL_STABLE_MS)
        gang_backoff_reset(&a->backoff);
    uint64_t delay = gang_backoff_next(&a->backoff);
    a->restarts++;
    a->restart_at_ms = gang_now_ms() + delay;
    gang_info("local: restarting agent %d in %llu ms", i, (unsigned long long)delay);
}

/* Reaps every exited child without blocking. */
static void local_reap(local_gang *g, const gang_params *p)
{
    int status;
    pid_t pid;

    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < g->nagents; i++) {
            if (g->agents[i].pid == pid) {
                local_on_exit(g, i, status, p);
                break;
            }
        }
    }
}

/* Drains the signalfd; SIGINT/SIGTERM/SIGHUP start a shutdown, a repeat escalates it. */
static void local_read_signals(local_gang *g)
{
    struct signalfd_siginfo si;

    while (read(g->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGCHLD)
            continue;
        if (g->phase == LOCAL_RUNNING) {
            gang_info("local: received signal %u; stopping the gang", si.ssi_signo);
            local_stop(g, GANG_EXIT_OK, LOCAL_TERMINATING, LOCAL_TERM_GRACE_MS);
        } else if (g->phase == LOCAL_DRAINING) {
            local_enter_phase(g, LOCAL_TERMINATING, LOCAL_TERM_GRACE_MS);
        } else if (g->phase == LOCAL_TERMINATING) {
            gang_info("local: received signal %u again; killing the gang", si.ssi_signo);
            local_enter_phase(g, LOCAL_KILLING, LOCAL_KILL_GRACE_MS);
        }
    }
}

/*
 * Advances the state machine by time: starts due restarts, moves a shutdown phase on at
 * its deadline, and returns the poll timeout to the next deadline (at most 1 s).
 */
static int local_tick(local_gang *g)
{
    uint64_t now = gang_now_ms();
    uint64_t next = now + 1000;

    if (g->phase == LOCAL_RUNNING) {
        for (int i = 0; i < g->nagents; i++) {
            local_agent *a = &g->agents[i];
            if (a->pid == 0 && a->restart_at_ms != 0 && a->restart_at_ms <= now)
                local_start(g, i);
            if (a->pid == 0 && a->restart_at_ms != 0 && a->restart_at_ms < next)
                next = a->restart_at_ms;
        }
        /* Every agent stopped cleanly and none is due: the gang is over. */
        if (local_running(g) == 0) {
            int pending = 0;
            for (int i = 0; i < g->nagents; i++)
                pending += g->agents[i].restart_at_ms != 0;
            if (!pending) {
                g->exit_code = GANG_EXIT_OK;
                g->phase = LOCAL_DONE;
            }
        }
        return (int)(next - now);
    }

    if (local_running(g) == 0) {
        g->phase = LOCAL_DONE;
        return 0;
    }
    if (now >= g->phase_deadline_ms) {
        if (g->phase == LOCAL_DRAINING) {
            local_enter_phase(g, LOCAL_TERMINATING, LOCAL_TERM_GRACE_MS);
        } else if (g->phase == LOCAL_TERMINATING) {
            local_enter_phase(g, LOCAL_KILLING, LOCAL_KILL_GRACE_MS);
        } else {
            gang_error("local: %d agent(s) survived SIGKILL for %d ms; abandoning them",
                       local_running(g), LOCAL_KILL_GRACE_MS);
            g->phase = LOCAL_DONE;
            return 0;
        }
    }
    if (g->phase_deadline_ms < next)
        next = g->phase_deadline_ms;
    return next > now ? (int)(next - now) : 0;
}

/* ---------------------------------------------------------------------------------
 * --dp N: N independent local gangs behind a router (issue #26).
 * --------------------------------------------------------------------------------- */

/* Flags set per gang in --dp mode; every other forwarded flag is shared. */
static const char *const dp_per_gang_flags[] = {"rdzv-port", "http-port", "job-name", NULL};

/* Starts child k of --dp mode: gang k (k < dp), or the router (k == dp). */
static int dp_spawn(const gang_params *p, const gang_args *args, int k, pid_t *out)
{
    char rdzv[16], http[16], job[GANG_PARAM_STR_MAX + 16], replicas[64 * 24] = "";
    char *argv[GANG_PARAM_STR_MAX];
    int n = 0, dp = (int)p->dp;
    gang_spawn sp = {.path = "/proc/self/exe",
                     .out_fd = -1,
                     .err_fd = -1,
                     .close_fd = -1,
                     .death_signal = SIGTERM,
                     .drop_local = 1};

    if (args->argc + 16 > (int)(sizeof argv / sizeof argv[0]))
        return GANG_ERANGE;
    argv[n++] = "ganglion";
    if (k < dp) {
        snprintf(rdzv, sizeof rdzv, "%lld", (long long)p->rdzv_port + 2 * k);
        snprintf(http, sizeof http, "%lld", (long long)p->http_port + 1 + 2 * k);
        snprintf(job, sizeof job, "%s-%d", p->job_name, k);
        char *fixed[] = {"serve", "--local",     "--dp", "1",          "--rdzv-port",
                         rdzv,    "--http-port", http,   "--job-name", job};
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
            argv[n++] = fixed[i];
        for (int i = 0; i < args->argc; i++)
            argv[n++] = args->argv[i];
    } else {
        for (int i = 0; i < dp; i++) {
            size_t len = strlen(replicas);
            snprintf(replicas + len, sizeof replicas - len, "%s127.0.0.1:%lld", i ? "," : "",
                     (long long)p->http_port + 1 + 2 * i);
        }
        snprintf(http, sizeof http, "%lld", (long long)p->http_port);
        char *fixed[] = {"router", "--replicas",     replicas,   "--http-port",
                         http,     "--bind-address", "127.0.0.1"};
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
            argv[n++] = fixed[i];
    }
    argv[n] = NULL;
    return gang_proc_spawn(argv, &sp, out);
}

/*
 * `serve --local --dp N`: N independent local gangs (each its own `serve --local`, which
 * supervises and restarts its agents) and the router in front of them, started as
 * children. Nothing is restarted at this level: the gangs restart their own agents, and
 * a gang supervisor or the router exiting means a configuration error or a gang that gave
 * up, so everything stops (SIGTERM, then SIGKILL after LOCAL_TERM_GRACE_MS x 3: each gang
 * needs up to two grace periods of its own) and the first exit code is returned. SIGINT,
 * SIGTERM and SIGHUP stop everything with 0.
 */
static int local_dp_main(const gang_params *p)
{
    int nchild = (int)p->dp + 1, sfd = -1, rc = GANG_EXIT_INTERNAL, running = 0;
    pid_t pids[65] = {0};
    gang_args args = {NULL, 0};
    sigset_t mask, oldmask;

    if (p->http_port + 2 * p->dp > 65535 || p->rdzv_port + 2 * p->dp > 65535) {
        gang_error("local: --dp %lld does not fit the ports above --http-port / --rdzv-port",
                   (long long)p->dp);
        return GANG_EXIT_USAGE;
    }
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    if (gang_params_forward_args(p, dp_per_gang_flags, &args) != 0 ||
        sigprocmask(SIG_BLOCK, &mask, &oldmask) != 0)
        goto out_args;
    sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0)
        goto out_mask;
    for (int k = 0; k < nchild; k++) {
        if (dp_spawn(p, &args, k, &pids[k]) != 0) {
            gang_error("local: cannot start %s %d", k < nchild - 1 ? "gang" : "router", k);
            goto out_stop;
        }
        running++;
    }
    gang_info("local: %lld gang(s) behind the router on 127.0.0.1:%lld", (long long)p->dp,
              (long long)p->http_port);
    rc = GANG_EXIT_OK;
    for (int stop = 0; !stop;) {
        struct signalfd_siginfo si;
        struct pollfd pfd = {.fd = sfd, .events = POLLIN};
        int status;
        pid_t pid;
        if (poll(&pfd, 1, 1000) < 0 && errno != EINTR)
            break;
        while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si)
            stop |= si.ssi_signo != SIGCHLD;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            for (int k = 0; k < nchild; k++) {
                if (pids[k] != pid)
                    continue;
                pids[k] = 0;
                running--;
                rc = WIFEXITED(status) ? WEXITSTATUS(status) : GANG_EXIT_INTERNAL;
                gang_error("local: %s %d exited (code %d); stopping everything",
                           k < nchild - 1 ? "gang" : "router", k, rc);
                stop = 1;
            }
        }
    }
out_stop:
    for (int k = 0; k < nchild; k++) {
        if (pids[k] > 0)
            kill(pids[k], SIGTERM);
    }
    int killed = 0;
    for (uint64_t end = gang_now_ms() + 3 * LOCAL_TERM_GRACE_MS; running > 0;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        for (int k = 0; pid > 0 && k < nchild; k++) {
            if (pids[k] == pid) {
                pids[k] = 0;
                running--;
            }
        }
        if (pid > 0)
            continue;
        if (gang_now_ms() >= end && killed) {
            gang_error("local: %d child(ren) survived SIGKILL; abandoning them", running);
            break;
        }
        if (gang_now_ms() >= end) {
            for (int k = 0; k < nchild; k++) {
                if (pids[k] > 0)
                    kill(pids[k], SIGKILL);
            }
            killed = 1;
            end = gang_now_ms() + LOCAL_KILL_GRACE_MS;
        }
        poll(NULL, 0, 20);
    }
    close(sfd);
out_mask:
    sigprocmask(SIG_SETMASK, &oldmask, NULL);
out_args:
    gang_args_free(&args);
    return rc;
}

int gang_local_main(const gang_params *p)
{
    local_gang g = {.sfd = -1, .exit_code = GANG_EXIT_INTERNAL};
    char exe_path[PATH_MAX];
    char last_addr[GANG_LOCAL_ADDR_MAX];
    gang_args args = {NULL, 0};
    sigset_t mask, oldmask;
    ssize_t len;
    int rc = GANG_EXIT_INTERNAL;

    if (p->dp > 1)
        return local_dp_main(p);
    if (p->nnodes < 1 || gang__local_address((int)p->nnodes - 1, last_addr, sizeof last_addr)) {
        gang_error("local: --nnodes %lld does not fit the loopback range", (long long)p->nnodes);
        return GANG_EXIT_USAGE;
    }
    /* The agents exec /proc/self/exe, which works even if the file is replaced while the
     * gang runs; argv[0] carries the real path for ps and logs. */
    len = readlink("/proc/self/exe", exe_path, sizeof exe_path - 1);
    if (len < 0)
        len = 0;
    exe_path[len] = '\0';

    g.agents = calloc((size_t)p->nnodes, sizeof *g.agents);
    if (g.agents == NULL || gang__local_agent_args(p, &args) != 0) {
        gang_error("local: out of memory");
        goto out_free;
    }
    g.nagents = (int)p->nnodes;
    g.spawn = (gang_local_spawn_cfg){
        .exe = "/proc/self/exe",
        .argv0 = len > 0 ? exe_path : "ganglion",
        .args = args.argv,
        .nargs = args.argc,
        .rdzv_port = (int)p->rdzv_port,
        .out_fd = -1,
    };
    /* Workers orphaned by a killed agent are re-parented to us and reaped with the rest,
     * instead of lingering as zombies under a container's init. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    for (int i = 0; i < g.nagents; i++)
        gang_backoff_init(&g.agents[i].backoff, LOCAL_BACKOFF_INITIAL_MS, LOCAL_BACKOFF_MAX_MS,
                          (uint64_t)getpid() * 7919u + (uint64_t)i + 1);

    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &mask, &oldmask) != 0) {
        gang_error("local: sigprocmask: %s", strerror(errno));
        goto out_free;
    }
    g.sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (g.sfd < 0) {
        gang_error("local: signalfd: %s", strerror(errno));
        goto out_mask;
    }

    gang_info("local: starting %d agent(s) x %lld rank(s); coordinator 127.0.0.1:%lld, "
              "http port %lld",
              g.nagents, (long long)p->nproc_per_node, (long long)p->rdzv_port,
              (long long)p->http_port);
    for (int i = 0; i < g.nagents; i++)
        local_start(&g, i);

    while (g.phase != LOCAL_DONE) {
        struct pollfd pfd = {.fd = g.sfd, .events = POLLIN};
        int timeout = local_tick(&g);

        if (g.phase == LOCAL_DONE)
            break;
        if (poll(&pfd, 1, timeout) < 0 && errno != EINTR) {
            gang_error("local: poll: %s", strerror(errno));
            local_signal_all(&g, SIGKILL);
            break;
        }
        local_read_signals(&g);
        local_reap(&g, p);
    }
    rc = g.exit_code;
    gang_info("local: gang stopped; exit code %d", rc);

    close(g.sfd);
out_mask:
    sigprocmask(SIG_SETMASK, &oldmask, NULL);
out_free:
    free(g.agents);
    gang_args_free(&args);
    return rc;
}
