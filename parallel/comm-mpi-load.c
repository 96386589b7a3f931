/*
 * The mpi backend, loaded at run time.
 *
 * parallel/comm-mpi.c is built as its own shared module, libganglion-mpi.so, linked with
 * Open MPI, and not into the `ganglion` binary: only the benchmarks and tests run on the
 * mpi backend (workers refuse it), yet linking libmpi made every exec of every agent and
 * worker load libmpi, libopen-rte, libopen-pal, hwloc, libevent and udev (issue #14: about
 * 3 ms of CPU per exec, on the start-up path of every rank). The module is opened the
 * first time an mpi communicator is created, with RTLD_GLOBAL because Open MPI's own
 * components expect its symbols to be global.
 *
 * The module calls back five functions of the binary (logging, the clock, the dtype size,
 * the front's reduction and error helpers); the executables that link gang_parallel export
 * them (CMakeLists.txt, --export-dynamic-symbol), so nothing else of the binary is visible.
 *
 * Search order: libganglion-mpi.so in the directory of the running executable
 * (/proc/self/exe), then in the build tree's bin/ (GANG_MPI_PLUGIN_DIR, for the tests,
 * which run from tests/). A missing module or symbol is GANG_ENOENT with a log line
 * naming what was tried; the registry then hands out a table whose init answers it.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "comm-backend.h"

#ifndef GANG_MPI_PLUGIN_DIR
#define GANG_MPI_PLUGIN_DIR "."
#endif

static pthread_once_t mpi_once = PTHREAD_ONCE_INIT;
static const gang__comm_ops *mpi_ops;

int gang__comm_mpi_plugin_open(const char *path, const gang__comm_ops **out)
{
    void *h, *sym;

    *out = NULL;
    h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL) {
        gang_debug("comm: cannot load %s: %s", path, dlerror());
        return GANG_ENOENT;
    }
    sym = dlsym(h, "gang__comm_mpi_ops");
    if (sym == NULL) {
        gang_error("comm: %s has no gang__comm_mpi_ops: %s", path, dlerror());
        dlclose(h);
        return GANG_ENOENT;
    }
    /* Kept loaded for the life of the process: MPI cannot be initialised twice. */
    *out = sym;
    return 0;
}

/* The directory of the running executable into dir (no trailing slash); 0 or -1. */
static int mpi_exe_dir(char *dir, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", dir, cap - 1);
    char *slash;

    if (n <= 0 || (size_t)n >= cap - 1)
        return -1;
    dir[n] = '\0';
    slash = strrchr(dir, '/');
    if (slash == NULL)
        return -1;
    *slash = '\0';
    return 0;
}

static void mpi_load_once(void)
{
    char dir[PATH_MAX], first[PATH_MAX + 32] = "", second[PATH_MAX + 32];

    if (mpi_exe_dir(dir, sizeof(dir)) == 0) {
        snprintf(first, sizeof(first), "%s/%s", dir, GANG_MPI_PLUGIN_NAME);
        if (gang__comm_mpi_plugin_open(first, &mpi_ops) == 0)
            return;
    }
    snprintf(second, sizeof(second), "%s/%s", GANG_MPI_PLUGIN_DIR, GANG_MPI_PLUGIN_NAME);
    if (gang__comm_mpi_plugin_open(second, &mpi_ops) == 0)
        return;
    gang_error("comm: the mpi backend is built as %s, which cannot be loaded (tried %s%s%s): "
               "install it next to the ganglion binary, with Open MPI's libraries",
               GANG_MPI_PLUGIN_NAME, first, first[0] ? " and " : "", second);
}

const gang__comm_ops *gang__comm_mpi_plugin(void)
{
    pthread_once(&mpi_once, mpi_load_once);
    return mpi_ops;
}
