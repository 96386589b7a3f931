/*
 * Finding the GPU libraries that are opened at run time (NCCL, cuBLAS/cuBLASLt).
 *
 * Every ganglion binary starts without them (they are dlopen'ed when a "cuda" handle or an
 * nccl communicator is first made), but where they live differs by machine: the CUDA
 * toolkit's lib64 on a developer's box, the system's loader cache on a packaged node, and
 * only inside a Python virtual environment on an image built around PyTorch (the pip
 * wheels nvidia-nccl-cu13 and nvidia-cublas put libnccl.so.2 in site-packages/nvidia/nccl/
 * lib and libcublasLt.so.13 in site-packages/nvidia/cu13/lib, and nothing on the loader's
 * path). One search order for every such library, so that the same carried binary works on
 * all three without a wrapper script:
 *   1. the explicit choice: the library's flag (--nccl-library, --cuda-library-dir) or its
 *      environment twin; a file, or a directory holding the soname. An explicit choice that
 *      does not load is an error, never silently replaced by another copy;
 *   2. the Python environment: `python3` on PATH is asked (once per process, under
 *      --lib-probe-timeout-ms) where the packages that carry the library are, and
 *      PACKAGE/lib/SONAME is tried;
 *   3. the soname through the loader's own search (LD_LIBRARY_PATH, RUNPATH, ld.so.cache:
 *      what ldconfig knows);
 *   4. the directory the build found it in.
 * The file actually loaded is logged (dladdr of one of its symbols), so a run's log says
 * which NCCL or cuBLAS it used.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ganglion/common.h"

extern char **environ;

#define DYNLIB_MAX_EXPLICIT 4
#define DYNLIB_PY_OUT 4096

/* Values given by gang_params_load (flag or environment), by flag name. */
static struct {
    char flag[32];
    char value[GANG_PARAM_STR_MAX];
} explicit_vals[DYNLIB_MAX_EXPLICIT];
static int explicit_count;
static int probe_timeout_ms = -1; /* -1: not configured, read the environment twin */

void gang_dynlib_configure(const gang_params *p)
{
    const struct {
        const char *flag;
        const char *value;
    } vals[] = {{"nccl-library", p->nccl_library}, {"cuda-library-dir", p->cuda_library_dir}};

    explicit_count = 0;
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
        gang_strlcpy(explicit_vals[i].flag, vals[i].flag, sizeof(explicit_vals[i].flag));
        gang_strlcpy(explicit_vals[i].value, vals[i].value, sizeof(explicit_vals[i].value));
        explicit_count++;
    }
    probe_timeout_ms = p->lib_probe_timeout_ms;
}

/* The explicit value of flag: the configured parameter, else its environment twin (test
 * binaries and benches that do not load the registry), else "". */
static const char *explicit_value(const char *flag)
{
    char env[96];
    const char *v;

    for (int i = 0; i < explicit_count; i++)
        if (strcmp(explicit_vals[i].flag, flag) == 0)
            return explicit_vals[i].value;
    gang_param_env_name(flag, env, sizeof(env));
    v = getenv(env);
    return v != NULL ? v : "";
}

static int probe_timeout(void)
{
    int64_t v;
    const char *s;

    if (probe_timeout_ms >= 0)
        return probe_timeout_ms;
    s = getenv("GANGLION_LIB_PROBE_TIMEOUT_MS");
    if (s != NULL && gang_parse_i64(s, 0, 600000, &v) == 0)
        return (int)v;
    return 5000;
}

/* ---------------------------------------------------------------------------------
 * The Python probe: one `python3 -c` per process, for every package any library names.
 * --------------------------------------------------------------------------------- */
static const char py_code[] = "import importlib.util, sys\n"
                              "for m in sys.argv[1:]:\n"
                              "    try:\n"
                              "        s = importlib.util.find_spec(m)\n"
                              "    except Exception:\n"
                              "        s = None\n"
                              "    if s is not None and s.submodule_search_locations:\n"
                              "        print(m + '\\t' + list(s.submodule_search_locations)[0])\n";
static const char *const py_packages[] = {"nvidia.nccl", "nvidia.cu13", "nvidia.cublas"};

static pthread_once_t py_once = PTHREAD_ONCE_INIT;
static char py_out[DYNLIB_PY_OUT];

/*
 * Runs python3 with the probe and reads its output into out (NUL-terminated) until EOF or
 * the deadline; a child still running then is killed. Returns 0, or a negative code when
 * python3 cannot be started, timed out or failed (out then holds what was read, maybe "").
 */
static int py_run(char *out, size_t cap, int timeout_ms)
{
    char *argv[8] = {"python3", "-c", (char *)(uintptr_t)py_code};
    posix_spawn_file_actions_t fa;
    int pfd[2], rc = 0, status = 0;
    size_t len = 0, np = sizeof(py_packages) / sizeof(py_packages[0]);
    int64_t deadline = (int64_t)gang_now_ms() + timeout_ms;
    pid_t pid;

    out[0] = '\0';
    for (size_t i = 0; i < np; i++)
        argv[3 + i] = (char *)(uintptr_t)py_packages[i];
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return gang_err_from_errno(errno);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    rc = posix_spawnp(&pid, "python3", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(pfd[1]);
    if (rc != 0) {
        close(pfd[0]);
        return GANG_ENOENT;
    }
    for (;;) {
        int64_t left = deadline - (int64_t)gang_now_ms();
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        ssize_t n;

        if (left <= 0 || poll(&p, 1, (int)left) == 0) {
            kill(pid, SIGKILL);
            rc = GANG_ETIMEDOUT;
            break;
        }
        n = read(pfd[0], out + len, cap - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len == cap - 1)
            break;
    }
    out[len] = '\0';
    close(pfd[0]);
    /* The child is ours to reap; a process that reaps every child itself may have done it. */
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) != 0)
        rc = GANG_EIO;
    return rc;
}

static void py_probe_once(void)
{
    int ms = probe_timeout();
    int rc;

    if (ms == 0)
        return; /* the probe is switched off */
    rc = py_run(py_out, sizeof(py_out), ms);
    if (rc == GANG_ETIMEDOUT)
        gang_warn("dynlib: python3 did not say where its packages are within %d ms "
                  "(--lib-probe-timeout-ms); the Python environment is not searched",
                  ms);
}

/* The directory of one package the probe found; GANG_ENOENT when it found none. */
static int py_dir(const char *package, char *dir, size_t cap)
{
    size_t n = strlen(package);

    pthread_once(&py_once, py_probe_once);
    for (const char *l = py_out; *l != '\0';) {
        const char *end = strchr(l, '\n');
        size_t len = end != NULL ? (size_t)(end - l) : strlen(l);

        if (len > n + 1 && strncmp(l, package, n) == 0 && l[n] == '\t') {
            if (len - n - 1 >= cap)
                return GANG_ERANGE;
            memcpy(dir, l + n + 1, len - n - 1);
            dir[len - n - 1] = '\0';
            return 0;
        }
        l += len + (end != NULL);
    }
    return GANG_ENOENT;
}

/* ---------------------------------------------------------------------------------
 * The search.
 * --------------------------------------------------------------------------------- */

/* Appends "; what" to the list of places tried (for the one error line). */
static void tried_add(char *tried, size_t cap, const char *what, const char *why)
{
    size_t len = strlen(tried);

    if (len + 4 < cap)
        snprintf(tried + len, cap - len, "%s%s (%s)", len > 0 ? "; " : "", what, why);
}

/* dlopen of path; the loader's message goes into tried on failure. */
static void *try_open(const char *path, char *tried, size_t cap)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    const char *why;

    if (h != NULL)
        return h;
    why = dlerror();
    if (why != NULL && strstr(why, "No such file") != NULL)
        why = "not there";
    tried_add(tried, cap, path, why != NULL ? why : "dlopen failed");
    return NULL;
}

/* A file, or a directory holding soname: the path to open. */
static int explicit_path(const char *value, const char *soname, char *path, size_t cap)
{
    struct stat st;

    if (stat(value, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (snprintf(path, cap, "%s/%s", value, soname) >= (int)cap)
            return GANG_ERANGE;
        return 0;
    }
    return gang_strlcpy(path, value, cap);
}

int gang_dynlib_open(const gang_dynlib *lib, void **handle, char *loaded, size_t cap)
{
    char path[GANG_PARAM_STR_MAX + 128], dir[GANG_PARAM_STR_MAX], tried[2048] = "";
    const char *ex = explicit_value(lib->flag), *how = NULL, *how_flag = "";
    void *h = NULL, *sym;
    Dl_info info;

    *handle = NULL;
    if (ex[0] != '\0') {
        if (explicit_path(ex, lib->soname, path, sizeof(path)) != 0) {
            gang_error("%s: --%s=%s is too long", lib->what, lib->flag, ex);
            return GANG_EINVAL;
        }
        h = try_open(path, tried, sizeof(tried));
        if (h == NULL) {
            gang_error("%s: cannot load the library --%s names: %s", lib->what, lib->flag, tried);
            return GANG_ENOENT;
        }
        how = "--";
        how_flag = lib->flag;
    }
    for (int i = 0; h == NULL && lib->py_packages != NULL && lib->py_packages[i] != NULL; i++) {
        if (py_dir(lib->py_packages[i], dir, sizeof(dir)) != 0)
            continue;
        snprintf(path, sizeof(path), "%s/lib/%s", dir, lib->soname);
        h = try_open(path, tried, sizeof(tried));
        how = "the Python environment's package";
    }
    if (h == NULL) {
        h = try_open(lib->soname, tried, sizeof(tried));
        how = "the loader's search path";
    }
    if (h == NULL && lib->build_dir != NULL && lib->build_dir[0] != '\0') {
        snprintf(path, sizeof(path), "%s/%s", lib->build_dir, lib->soname);
        h = try_open(path, tried, sizeof(tried));
        how = "the build-time directory";
    }
    if (h == NULL) {
        char env[96];
        gang_param_env_name(lib->flag, env, sizeof(env));
        gang_error("%s: %s not found; tried %s. Name it with --%s or %s", lib->what, lib->soname,
                   tried, lib->flag, env);
        return GANG_ENOENT;
    }
    /* The file the loader actually mapped (a soname may resolve anywhere). */
    sym = dlsym(h, lib->probe_symbol);
    if (sym != NULL && dladdr(sym, &info) != 0 && info.dli_fname != NULL)
        gang_strlcpy(loaded, info.dli_fname, cap);
    else
        gang_strlcpy(loaded, lib->soname, cap);
    gang_info("%s: loaded %s (found through %s%s)", lib->what, loaded, how, how_flag);
    *handle = h;
    return 0;
}
