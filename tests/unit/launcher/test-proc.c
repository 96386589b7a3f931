/*
 * The spawner's signal rule (launcher/proc.h): a program started by gang_proc_spawn, or by
 * the supervisor's uv_spawn, begins with an empty signal mask and no ignored signal, even
 * when its parent blocks and ignores some; the child's environment; and the failure paths
 * (a missing program, exit 127 with the reason on its stderr).
 *
 * Each child is /bin/sh exec'ing grep on the SigBlk and SigIgn lines of /proc/self/status:
 * exec, not a fork of the shell (dash blocks every signal around its vfork, so a forked
 * grep may read the shell's mask mid-spawn), so grep shows what came through the execs.
 * What it prints is read back through a pipe with a deadline.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include <cmocka.h>

#include "ganglion/common.h"
#include "launcher-tests.h"
#include "proc.h"

#define PROC_TEST_DEADLINE_MS 10000
#define PROC_SHOW_SIGNALS "exec grep -E '^Sig(Blk|Ign):' /proc/self/status"

/* The parent's signal state under test, restored by proc_teardown. */
typedef struct proc_fixture {
    sigset_t old_mask;
    struct sigaction old_usr2, old_pipe, old_hup;
} proc_fixture;

static void on_hup(int sig)
{
    (void)sig;
}

/* Blocks SIGUSR1 and SIGTERM, ignores SIGUSR2 and SIGPIPE, handles SIGHUP. */
static int proc_setup(void **state)
{
    static proc_fixture f;
    struct sigaction ign = {.sa_handler = SIG_IGN}, hup = {.sa_handler = on_hup};
    sigset_t block;

    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    sigaddset(&block, SIGTERM);
    if (sigprocmask(SIG_BLOCK, &block, &f.old_mask) != 0 ||
        sigaction(SIGUSR2, &ign, &f.old_usr2) != 0 || sigaction(SIGPIPE, &ign, &f.old_pipe) != 0 ||
        sigaction(SIGHUP, &hup, &f.old_hup) != 0)
        return -1;
    *state = &f;
    return 0;
}

static int proc_teardown(void **state)
{
    proc_fixture *f = *state;

    sigaction(SIGUSR2, &f->old_usr2, NULL);
    sigaction(SIGPIPE, &f->old_pipe, NULL);
    sigaction(SIGHUP, &f->old_hup, NULL);
    sigprocmask(SIG_SETMASK, &f->old_mask, NULL);
    return 0;
}

/* Reads fd until EOF or the deadline into buf (NUL-terminated). Returns the bytes read. */
static size_t read_all(int fd, char *buf, size_t cap, uint64_t deadline_ms)
{
    size_t len = 0;

    while (len + 1 < cap) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        uint64_t now = gang_now_ms();
        if (now >= deadline_ms || poll(&p, 1, (int)(deadline_ms - now)) <= 0)
            break;
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    return len;
}

/*
 * The hex mask of "Name:\t%llx" in status text, or ~0 when the line is missing, without
 * the signals the C library keeps for itself (glibc: 32 and 33, below SIGRTMIN): sigaction
 * refuses them, so no spawner can reset them, and GNU make 4.3 starts its children (ctest
 * under `make test`) with 32 ignored.
 */
static unsigned long long status_mask(const char *text, const char *name)
{
    const char *p = strstr(text, name);
    unsigned long long v, reserved = 0;

    if (p == NULL || sscanf(p + strlen(name), " %llx", &v) != 1)
        return ~0ull;
    for (int sig = 32; sig < SIGRTMIN && sig <= 64; sig++)
        reserved |= 1ull << (sig - 1);
    return v & ~reserved;
}

/*
 * Spawns argv with s (its stdout and stderr on one pipe), collects what it printed into
 * out and its wait status into *status. Fails the test on a spawn error or a child that
 * outlives the deadline.
 */
static void spawn_and_collect(char *const *argv, gang_spawn s, char *out, size_t cap, int *status)
{
    uint64_t deadline = gang_now_ms() + PROC_TEST_DEADLINE_MS;
    int fds[2];
    pid_t pid;

    assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
    s.out_fd = fds[1];
    s.err_fd = fds[1];
    s.close_fd = fds[0];
    assert_int_equal(gang_proc_spawn(argv, &s, &pid), 0);
    close(fds[1]);
    read_all(fds[0], out, cap, deadline);
    close(fds[0]);
    if (gang_proc_reap_until(&pid, status, 1, deadline) != 0) {
        gang_proc_stop(&pid, 1, 0, 0, 1000);
        fail_msg("the child did not exit within %d ms", PROC_TEST_DEADLINE_MS);
    }
}

/* The parent blocks and ignores signals; its exec'd child has neither. */
static void test_spawn_resets_signals(void **state)
{
    char *argv[] = {"sh", "-c", PROC_SHOW_SIGNALS, NULL};
    gang_spawn s = {.path = "/bin/sh", .death_signal = SIGKILL};
    char out[512];
    int status;
    sigset_t cur;

    (void)state;
    /* The fixture took effect here: otherwise the test would prove nothing. */
    sigprocmask(SIG_BLOCK, NULL, &cur);
    assert_true(sigismember(&cur, SIGUSR1) && sigismember(&cur, SIGTERM));
    spawn_and_collect(argv, s, out, sizeof out, &status);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (status_mask(out, "SigBlk:") != 0 || status_mask(out, "SigIgn:") != 0)
        fail_msg("the child inherited signal state: %s", out);
    /* The parent's own state is untouched by the spawn. */
    sigprocmask(SIG_BLOCK, NULL, &cur);
    assert_true(sigismember(&cur, SIGUSR1) && sigismember(&cur, SIGTERM));
}

/* PATH search (path NULL) and the child's environment: drop_local, mpi_env, neither. */
static void test_spawn_path_and_env(void **state)
{
    char *argv[] = {"sh", "-c", "echo \"local=${GANGLION_LOCAL-unset} x=${PROC_TEST_KEEP-unset}\"",
                    NULL};
    gang_spawn s = {.path = NULL, .drop_local = 1};
    char out[256];
    int status;

    (void)state;
    setenv("GANGLION_LOCAL", "true", 1);
    setenv("PROC_TEST_KEEP", "kept", 1);
    spawn_and_collect(argv, s, out, sizeof out, &status);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_string_equal(out, "local=unset x=kept\n");

    /* mpi_env: GANGLION_LOCAL dropped too, Open MPI's single-copy switch "none" unless the
     * caller's environment sets it. */
    char *mpi[] = {"sh", "-c",
                   "echo \"local=${GANGLION_LOCAL-unset} "
                   "sc=${OMPI_MCA_btl_vader_single_copy_mechanism-unset}\"",
                   NULL};
    gang_spawn m = {.mpi_env = 1};
    unsetenv("OMPI_MCA_btl_vader_single_copy_mechanism");
    spawn_and_collect(mpi, m, out, sizeof out, &status);
    assert_string_equal(out, "local=unset sc=none\n");
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "cma", 1);
    spawn_and_collect(mpi, m, out, sizeof out, &status);
    assert_string_equal(out, "local=unset sc=cma\n");
    /* Without either flag the environment passes whole. */
    m.mpi_env = 0;
    spawn_and_collect(mpi, m, out, sizeof out, &status);
    assert_string_equal(out, "local=true sc=cma\n");
    unsetenv("OMPI_MCA_btl_vader_single_copy_mechanism");
    unsetenv("GANGLION_LOCAL");
    unsetenv("PROC_TEST_KEEP");
}

/* A program that does not exist: the child says why and exits 127; by path and in PATH. */
static void test_spawn_missing_program(void **state)
{
    char *by_path[] = {"ganglion-no-such-program", NULL};
    gang_spawn s = {.path = "/nonexistent/ganglion-no-such-program"};
    char out[512];
    int status;

    (void)state;
    spawn_and_collect(by_path, s, out, sizeof out, &status);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), GANG_PROC_EXEC_FAILED);
    assert_non_null(strstr(out, "ganglion: cannot exec /nonexistent/ganglion-no-such-program"));

    s.path = NULL;
    spawn_and_collect(by_path, s, out, sizeof out, &status);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), GANG_PROC_EXEC_FAILED);
    assert_non_null(strstr(out, "cannot exec ganglion-no-such-program"));
}

/*
 * Runs in a forked helper: a fork that fails (RLIMIT_NPROC 0, as the unprivileged user
 * nobody when started as root, which the limit does not bind) must return the error and
 * leave the caller's signal mask as it was. Exits 0 when so, 77 when it cannot set up.
 */
static void fork_failure_child(void)
{
    struct rlimit none = {0, 0};
    char *argv[] = {"true", NULL};
    gang_spawn s = {.path = "/bin/true"};
    sigset_t before, after;
    pid_t pid = 0;
    int rc, same = 1;

    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
        _exit(77);
    if (setrlimit(RLIMIT_NPROC, &none) != 0)
        _exit(77);
    sigprocmask(SIG_BLOCK, NULL, &before);
    rc = gang_proc_spawn(argv, &s, &pid);
    sigprocmask(SIG_BLOCK, NULL, &after);
    for (int sig = 1; sig < NSIG; sig++)
        same &= sigismember(&before, sig) == sigismember(&after, sig);
    if (rc != GANG_EAGAIN || pid != 0 || !same) {
        dprintf(2, "fork failure: rc %s, pid %d, mask kept %d\n", gang_err_name(rc), (int)pid,
                same);
        _exit(1);
    }
    _exit(0);
}

/* The failure of fork itself (in a helper process, whose limits the test may change). */
static void test_spawn_fork_failure(void **state)
{
    pid_t helper;
    int status = 0;

    (void)state;
    fflush(NULL);
    helper = fork();
    assert_true(helper >= 0);
    if (helper == 0)
        fork_failure_child();
    if (gang_proc_reap_until(&helper, &status, 1, gang_now_ms() + PROC_TEST_DEADLINE_MS) != 0) {
        gang_proc_stop(&helper, 1, 0, 0, 1000);
        fail_msg("the helper did not exit within %d ms", PROC_TEST_DEADLINE_MS);
    }
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) {
        printf("skipped: cannot become an unprivileged user with RLIMIT_NPROC 0 here\n");
        skip();
    }
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* What the uv_spawn test collects. */
typedef struct uv_child {
    int64_t exit_status;
    int term_signal;
    int exited;
} uv_child;

static void on_uv_exit(uv_process_t *p, int64_t exit_status, int term_signal)
{
    uv_child *c = p->data;
    c->exit_status = exit_status;
    c->term_signal = term_signal;
    c->exited = 1;
    uv_close((uv_handle_t *)p, NULL);
}

/* The supervisor's workers come from uv_spawn (proc.h relies on it keeping the rule). */
static void test_uv_spawn_resets_signals(void **state)
{
    char *argv[] = {"/bin/sh", "-c", PROC_SHOW_SIGNALS, NULL};
    uint64_t deadline = gang_now_ms() + PROC_TEST_DEADLINE_MS;
    uv_child c = {0};
    uv_loop_t loop;
    uv_process_t proc;
    uv_process_options_t o;
    int fds[2];
    char out[512];

    (void)state;
    assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
    uv_stdio_container_t stdio[3] = {{.flags = UV_IGNORE},
                                     {.flags = UV_INHERIT_FD, .data.fd = fds[1]},
                                     {.flags = UV_INHERIT_FD, .data.fd = fds[1]}};
    memset(&o, 0, sizeof o);
    o.file = argv[0];
    o.args = argv;
    o.exit_cb = on_uv_exit;
    o.stdio = stdio;
    o.stdio_count = 3;
    assert_int_equal(uv_loop_init(&loop), 0);
    proc.data = &c;
    assert_int_equal(uv_spawn(&loop, &proc, &o), 0);
    close(fds[1]);
    read_all(fds[0], out, sizeof out, deadline);
    close(fds[0]);
    while (!c.exited && gang_now_ms() < deadline)
        uv_run(&loop, UV_RUN_ONCE);
    uv_run(&loop, UV_RUN_NOWAIT);
    assert_true(c.exited);
    assert_int_equal(uv_loop_close(&loop), 0);
    assert_int_equal(c.exit_status, 0);
    if (status_mask(out, "SigBlk:") != 0 || status_mask(out, "SigIgn:") != 0)
        fail_msg("uv_spawn's child inherited signal state: %s", out);
}

int gang_test_proc(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_spawn_resets_signals, proc_setup, proc_teardown),
        cmocka_unit_test_setup_teardown(test_spawn_path_and_env, proc_setup, proc_teardown),
        cmocka_unit_test_setup_teardown(test_spawn_missing_program, proc_setup, proc_teardown),
        cmocka_unit_test_setup_teardown(test_uv_spawn_resets_signals, proc_setup, proc_teardown),
        cmocka_unit_test_setup_teardown(test_spawn_fork_failure, proc_setup, proc_teardown),
    };
    return cmocka_run_group_tests_name("proc", tests, NULL, NULL);
}
