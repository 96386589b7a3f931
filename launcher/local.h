/*
 * Local mode (internal to launcher/): `ganglion serve --local --nnodes P ...` runs a whole
 * gang on one host. The local parent starts P agents of the same binary, each on its own
 * loopback address (127.0.0.1, 127.0.0.2, ...) with the same port numbers, and restarts
 * any that dies, as kubelet restarts a crashed container. Agent 0 is the coordinator on
 * 127.0.0.1:--rdzv-port. The spawning helpers are shared with `ganglion bench`.
 */
#ifndef GANGLION_LAUNCHER_LOCAL_H
#define GANGLION_LAUNCHER_LOCAL_H

#include <stddef.h>
#include <sys/types.h>

#include "ganglion/common.h"

/* Room for the longest loopback address gang__local_address() writes, NUL included. */
#define GANG_LOCAL_ADDR_MAX 16

/*
 * Runs local mode until the gang stops and returns the process exit code:
 *   0   after SIGINT/SIGTERM/SIGHUP (every agent got SIGTERM, leftovers SIGKILL after 5 s),
 *       or when every agent has exited 0 on its own;
 *   75  when an agent gave up (its restart budget is spent): the others get the
 *       --give-up-linger-ms to exit on their own, then SIGTERM;
 *   2/3 when an agent exited with a usage or model error (the others are stopped);
 *   70  when an agent cannot be started at all.
 * An agent that dies by a signal, or exits with any other code (70 among them), is
 * restarted after a bounded backoff (100 ms doubling to 2 s, reset after 10 s of uptime).
 *
 * p holds the effective parameters (p->nnodes agents, p->rdzv_port). Each agent gets
 * them as flags, the way the supervisor forwards them to workers (gang__local_agent_args:
 * the registry's GANG_PARAM_FWD entries, so never --local), plus its own --node-index,
 * --bind-address and --coordinator. Agents run with GANGLION_LOCAL removed from their environment,
 * so they never recurse.
 *
 * Blocks SIGCHLD, SIGINT, SIGTERM and SIGHUP in the calling thread for its duration (it
 * waits on a signalfd) and restores the mask before returning. Call it from the main
 * thread before any other thread exists.
 */
int gang_local_main(const gang_params *p);

/*
 * Writes the loopback address of local node `index` into buf[0..cap): 127.0.0.(i+1) for
 * i < 254, else 127.0.(1 + i/254).(1 + i%254). Returns 0, GANG_EINVAL for a negative
 * index or one past the 127/8 range, GANG_ERANGE when cap is too small.
 */
int gang__local_address(int index, char *buf, size_t cap);

/* What gang__local_spawn() starts: `exe serve ARGS... --node-index I --bind-address A
 * --coordinator 127.0.0.1:PORT`. */
typedef struct gang_local_spawn_cfg {
    const char *exe;   /* path to execv, usually "/proc/self/exe" */
    const char *argv0; /* argv[0] the agent sees (ps, logs); NULL = exe */
    char *const *args; /* serve flags shared by every agent */
    int nargs;
    int node_index; /* this agent's index */
    int rdzv_port;  /* coordinator port on 127.0.0.1 */
    int out_fd;     /* stdout and stderr of the agent; -1 = inherit */
} gang_local_spawn_cfg;

/*
 * Starts one agent as described by cfg with gang_proc_spawn (proc.h) and stores its pid
 * in *out. The child gets an empty signal mask and default dispositions, loses
 * GANGLION_LOCAL, and receives SIGTERM when the calling thread exits (PR_SET_PDEATHSIG),
 * so that a killed parent leaves no orphaned gang behind. A child whose exec fails exits
 * GANG_PROC_EXEC_FAILED (127). Returns 0, GANG_EINVAL (bad index), GANG_ENOMEM, or the
 * fork errno as a GANG_E* code.
 */
int gang__local_spawn(const gang_local_spawn_cfg *cfg, pid_t *out);

/* The flags gang__local_spawn() sets per agent (NULL-terminated). */
extern const char *const gang__local_per_agent_flags[];

/*
 * The flags every local agent shares: gang_params_forward_args(p) minus
 * gang__local_per_agent_flags (the same function the supervisor builds its workers'
 * command line with). Returns 0 or GANG_ENOMEM; release with gang_args_free.
 */
int gang__local_agent_args(const gang_params *p, gang_args *out);

#endif
