/*
 * Child processes and loopback ports for the commands that start other programs (local,
 * generate, bench): one fork helper, one spawner, one reap / stop, one free-port picker.
 * Internal to the launcher and the benchmarks.
 *
 * The signal rule of every child ganglion starts. fork() copies the parent's blocked mask
 * and its dispositions, and exec keeps the mask and every SIG_IGN disposition (only
 * handlers go back to SIG_DFL). A parent that blocks SIGCHLD, SIGTERM, SIGINT and SIGHUP
 * for its signalfd (local.c) or ignores SIGPIPE would hand that on: an agent that never
 * sees SIGTERM, an mpirun that cannot be stopped. So:
 *   - a child that execs (gang_proc_spawn) starts the program with an EMPTY signal mask
 *     and EVERY disposition at SIG_DFL, plus, where asked, the parent-death signal;
 *     the parent blocks every signal across the fork, so none of its handlers runs in the
 *     child before the reset;
 *   - a child that does not exec (gang_proc_fork alone: a benchmark's rank running this
 *     program's code) keeps the parent's signal state, which that code was written for;
 *   - the supervisor's workers are started by libuv's uv_spawn, which applies the same
 *     rule as gang_proc_spawn (every disposition of signals 1..31 to SIG_DFL, then the
 *     empty mask), because their exits are watched through the agent's libuv loop; the
 *     worker sets its own parent-death signal (worker.c). test-proc.c checks both.
 */
#ifndef GANGLION_LAUNCHER_PROC_H
#define GANGLION_LAUNCHER_PROC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The exit code of a child whose exec failed (it prints why first), as a shell's. */
#define GANG_PROC_EXEC_FAILED 127

/* How gang_proc_spawn starts a program. */
typedef struct gang_spawn {
    const char *path; /* program to exec; NULL: argv[0], searched in PATH */
    int out_fd;       /* the child's stdout, when >= 0 */
    int err_fd;       /* the child's stderr, when >= 0 */
    int close_fd;     /* a descriptor the child closes first (a pipe's read end), or -1 */
    int new_group;    /* 1: the child leads a process group of its own */
    int death_signal; /* sent to the child when the calling thread dies; 0 for none */
    int drop_local;   /* 1: the child's environment lacks GANGLION_LOCAL */
    int mpi_env;      /* 1: drop GANGLION_LOCAL, and disable Open MPI's single-copy
                         shared memory (it needs ptrace rights containers withhold) */
} gang_spawn;

/*
 * fork() that ties the child to this process: in the child, death_signal (when non-zero)
 * is delivered when the parent dies, and a child whose parent died before that took
 * effect exits at once. The child keeps the parent's signal state (the rule above): use
 * it alone only for a child that runs this program's code. Returns like fork(): the pid,
 * 0 in the child, or a GANG_E* code.
 */
pid_t gang_proc_fork(int death_signal);

/*
 * Forks and execs argv as s says (stdio flushed first), with the signal rule above: the
 * program starts with an empty mask and default dispositions. The child's environment is
 * built here, before the fork, and the child makes only async-signal-safe calls, so a
 * threaded caller may spawn too. Returns 0 with the pid in *out, GANG_ENOMEM, or fork's
 * error as a GANG_E* code; a child whose exec fails prints "ganglion: cannot exec PATH:
 * REASON" to its stderr and exits GANG_PROC_EXEC_FAILED.
 */
int gang_proc_spawn(char *const *argv, const gang_spawn *s, pid_t *out);

/*
 * Waits until every pid in pids[0..n) has exited or deadline_ms (monotonic) passes;
 * reaped entries become 0 with their wait status in statuses[i]. Returns how many remain.
 */
int gang_proc_reap_until(pid_t *pids, int *statuses, int n, uint64_t deadline_ms);

/*
 * Stops processes: SIGTERM to each, up to term_ms, then SIGKILL and up to kill_ms more.
 * With group each pid leads a process group: only the leader gets SIGTERM (so it can stop
 * its own children in order), but SIGKILL and a final sweep go to the whole group.
 * pids[] entries become 0 as they are reaped. Returns how many did not exit 0.
 */
int gang_proc_stop(pid_t *pids, int n, int group, uint64_t term_ms, uint64_t kill_ms);

/*
 * Sends sig to root and every process below it (walking /proc, bounded depth), for
 * programs like mpirun that put their children in process groups of their own.
 */
void gang_proc_kill_tree(pid_t root, int sig);

/* Reaps whatever exited children are left over, without blocking. */
void gang_proc_reap_strays(void);

/* Looks for an executable `name` in $PATH; fills out and returns 1 when found. */
int gang_proc_find_in_path(const char *name, char *out, size_t cap);

/*
 * Picks n consecutive loopback ports (n <= 8), all free now, at a random base in
 * [20000, 32000): below Linux's default ephemeral range, so that outgoing connections do
 * not take them before the child binds them. Returns 0 with ports[0..n), or GANG_EAGAIN.
 */
int gang_proc_pick_ports(int n, int *ports);

#endif
