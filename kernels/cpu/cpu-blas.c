/*
 * OpenBLAS, loaded at run time.
 *
 * Every process of a gang is the one `ganglion` binary, and most of them never multiply a
 * matrix: the agents, `ganglion info`, the workers of a gang without a model. Linking
 * OpenBLAS made each of them pay for it at exec: the dynamic loader's relocations of
 * libopenblas and libgfortran, and OpenBLAS's constructor, which starts a thread pool of
 * one thread per core in every process (issue #14 measured about 6 ms of CPU per exec,
 * the largest part of a 64-node gang's start-up on two cores). So the library is opened
 * with dlopen the first time a CPU (or fake) kernels handle is opened or a GEMM runs, and
 * cblas_sgemm is resolved (the one routine the CPU kernels call), and openblas_set_num_threads
 * when present (the thread count `bench matmul` and the tests set).
 *
 * Search order: the soname through the normal dlopen search (LD_LIBRARY_PATH,
 * ld.so.cache, the system directories), then the directory pkg-config named at build time
 * (GANG_OPENBLAS_LIBDIR). A missing library is a clear error (GANG_ENOENT with a log line
 * naming what was tried), never a crash at the first GEMM.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cpu.h"

#ifndef GANG_OPENBLAS_LIBDIR
#define GANG_OPENBLAS_LIBDIR "/usr/lib/x86_64-linux-gnu"
#endif

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static gang__cpu_sgemm_fn blas_sgemm;
static int blas_rc;
static void (*blas_set_threads)(int);

int gang__cpu_blas_open(const char *soname, const char *dir, gang__cpu_sgemm_fn *out)
{
    char path[512];
    const char *tried = "";
    void *h;

    *out = NULL;
    h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL && dir != NULL && soname[0] != '/') {
        snprintf(path, sizeof(path), "%s/%s", dir, soname);
        tried = path;
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (h == NULL) {
        gang_error("kernels/cpu: cannot load OpenBLAS (%s%s%s): %s; install it (Debian: "
                   "libopenblas0) or put it on LD_LIBRARY_PATH",
                   soname, tried[0] ? ", also tried " : "", tried, dlerror());
        return GANG_ENOENT;
    }
    /* ISO C leaves object -> function pointer conversion undefined; POSIX requires dlsym's
     * result to convert, so go through memcpy rather than a cast -Wpedantic rejects. */
    void *sym = dlsym(h, "cblas_sgemm");
    if (sym == NULL) {
        gang_error("kernels/cpu: %s has no cblas_sgemm: %s", soname, dlerror());
        dlclose(h);
        return GANG_ENOENT;
    }
    memcpy(out, &sym, sizeof(*out));
    /* Kept loaded for the life of the process: GEMMs may run on any thread at any time. */
    return 0;
}

static void blas_load_once(void)
{
    void *sym;

    blas_rc = gang__cpu_blas_open(GANG_CPU_BLAS_SONAME, GANG_OPENBLAS_LIBDIR, &blas_sgemm);
    if (blas_rc != 0)
        return;
    /* Optional: OpenBLAS's thread count (gang__cpu_blas_set_threads). The library stays
     * loaded (gang__cpu_blas_open never closes it), so this finds the same handle. */
    void *h = dlopen(GANG_CPU_BLAS_SONAME, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (h == NULL)
        return;
    sym = dlsym(h, "openblas_set_num_threads");
    if (sym != NULL)
        memcpy(&blas_set_threads, &sym, sizeof(blas_set_threads));
    dlclose(h); /* drops the reference RTLD_NOLOAD took; the first one keeps it loaded */
}

int gang__cpu_blas_set_threads(int n)
{
    int rc = gang__cpu_blas_load(NULL);

    if (rc != 0)
        return rc;
    if (blas_set_threads == NULL)
        return GANG_ENOSYS;
    blas_set_threads(n);
    return 0;
}

int gang__cpu_blas_load(gang__cpu_sgemm_fn *out)
{
    pthread_once(&blas_once, blas_load_once);
    if (out != NULL)
        *out = blas_sgemm;
    return blas_rc;
}
