/*
 * Child processes and loopback ports (proc.h): the one spawner of every program ganglion
 * starts by fork and exec (local agents, generate's server, the benchmarks' gangs, mpirun
 * and their peers), and what the commands share to watch and stop them.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ganglion/common.h"
#include "proc.h"

#define PROC_TREE_MAX 4096
#define PORT_LO 20000
#define PORT_SPAN 12000

pid_t gang_proc_fork(int death_signal)
{
    pid_t parent = getpid();
    pid_t pid = fork();

    if (pid < 0)
        return gang_err_from_errno(errno);
    if (pid == 0 && death_signal != 0) {
        prctl(PR_SET_PDEATHSIG, death_signal);
        if (getppid() != parent)
            _exit(0);
    }
    return pid;
}

#define PROC_ENV_LOCAL "GANGLION_LOCAL="
#define PROC_ENV_MPI_SHM "OMPI_MCA_btl_vader_single_copy_mechanism="

/*
 * The child's environment, built in the parent (the child must not allocate: the parent
 * may have threads): this process's, less GANGLION_LOCAL with drop_local or mpi_env, plus
 * Open MPI's single-copy switch set to "none" with mpi_env unless it is set already. The
 * array is allocated, its strings are borrowed from environ. NULL on GANG_ENOMEM.
 */
static char **proc_child_env(const gang_spawn *s)
{
    extern char **environ;
    size_t n = 0, k = 0;
    int have_shm = 0;
    char **env;

    while (environ != NULL && environ[n] != NULL)
        n++;
    env = calloc(n + 2, sizeof *env);
    if (env == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const char *e = environ[i];
        if ((s->drop_local || s->mpi_env) &&
            strncmp(e, PROC_ENV_LOCAL, strlen(PROC_ENV_LOCAL)) == 0)
            continue;
        have_shm |= strncmp(e, PROC_ENV_MPI_SHM, strlen(PROC_ENV_MPI_SHM)) == 0;
        env[k++] = environ[i];
    }
    if (s->mpi_env && !have_shm)
        env[k++] = PROC_ENV_MPI_SHM "none";
    env[k] = NULL;
    return env;
}

/*
 * Runs in the child only, and only async-signal-safe calls: the signal rule of proc.h
 * (every disposition back to SIG_DFL, then the empty mask), the process group and the
 * descriptors of s, then exec. Never returns; a failed exec prints why and exits 127.
 */
static void proc_child_exec(char *const *argv, const gang_spawn *s, char **env)
{
    struct sigaction dfl;
    sigset_t none;

    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    /* SIGKILL, SIGSTOP and the C library's reserved real-time signals refuse: harmless. */
    for (int sig = 1; sig < NSIG; sig++)
        sigaction(sig, &dfl, NULL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (s->new_group)
        setpgid(0, 0);
    if (s->out_fd >= 0)
        dup2(s->out_fd, 1);
    if (s->err_fd >= 0)
        dup2(s->err_fd, 2);
    if (s->close_fd >= 0)
        close(s->close_fd);
    if (s->path != NULL)
        execve(s->path, argv, env);
    else
        execvpe(argv[0], argv, env);
    dprintf(2, "ganglion: cannot exec %s: %s\n", s->path ? s->path : argv[0], strerror(errno));
    _exit(GANG_PROC_EXEC_FAILED);
}

int gang_proc_spawn(char *const *argv, const gang_spawn *s, pid_t *out)
{
    sigset_t all, old;
    char **env = proc_child_env(s);
    pid_t pid;

    if (env == NULL)
        return GANG_ENOMEM;
    fflush(NULL);
    /* Every signal blocked across fork(): none of this process's handlers may run in the
     * child before it has put the dispositions back to the defaults. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid = gang_proc_fork(s->death_signal);
    if (pid == 0)
        proc_child_exec(argv, s, env);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    free(env);
    if (pid < 0)
        return (int)pid;
    if (s->new_group)
        setpgid(pid, pid); /* also from here, so that it holds before the child runs */
    *out = pid;
    return 0;
}

int gang_proc_reap_until(pid_t *pids, int *statuses, int n, uint64_t deadline_ms)
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

int gang_proc_stop(pid_t *pids, int n, int group, uint64_t term_ms, uint64_t kill_ms)
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
    if (gang_proc_reap_until(pids, st, n, gang_now_ms() + term_ms) > 0) {
        for (int i = 0; i < n; i++) {
            if (pids[i] > 0)
                kill(group ? -pids[i] : pids[i], SIGKILL);
        }
        gang_proc_reap_until(pids, st, n, gang_now_ms() + kill_ms);
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

/* Appends to next[] every process whose parent is in level[0..nlevel); returns the count. */
static size_t proc_children(const pid_t *level, size_t nlevel, pid_t *next)
{
    size_t nnext = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;

    while (d != NULL && (e = readdir(d)) != NULL && nnext < PROC_TREE_MAX) {
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
    return nnext;
}

void gang_proc_kill_tree(pid_t root, int sig)
{
    static pid_t level[PROC_TREE_MAX], next[PROC_TREE_MAX];
    size_t nlevel = 1;

    level[0] = root;
    for (int depth = 0; depth < 8 && nlevel > 0; depth++) {
        size_t nnext = proc_children(level, nlevel, next);
        for (size_t i = 0; i < nlevel; i++)
            kill(level[i], sig);
        memcpy(level, next, nnext * sizeof next[0]);
        nlevel = nnext;
    }
}

void gang_proc_reap_strays(void)
{
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
}

int gang_proc_find_in_path(const char *name, char *out, size_t cap)
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

int gang_proc_pick_ports(int n, int *ports)
{
    static uint64_t rng;

    if (n < 1 || n > 8)
        return GANG_EINVAL;
    if (rng == 0)
        rng = (gang_now_ns() ^ ((uint64_t)getpid() << 32)) | 1;
    for (int tries = 0; tries < 100; tries++) {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        int base = PORT_LO + (int)((rng * 0x2545F4914F6CDD1Dull) % (PORT_SPAN / 8)) * 8;
        int ok = 1;
        for (int i = 0; i < n && ok; i++)
            ok = port_is_free(base + i);
        if (ok) {
            for (int i = 0; i < n; i++)
                ports[i] = base + i;
            return 0;
        }
    }
    return GANG_EAGAIN;
}
