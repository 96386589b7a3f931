/*
 * Run-time loading of cuBLAS / cuBLASLt (see cuda-blas.h for why).
 *
 * Search order for each library: its soname through the normal dlopen search
 * (LD_LIBRARY_PATH, ld.so.cache, the system directories), then the toolkit's library
 * directory recorded at build time (GANG_CUDA_LIBDIR), which covers a build tree run on
 * a machine whose loader does not know /usr/local/cuda. The sonames come from the headers
 * the code was compiled against, so the loaded library matches the declarations.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "cuda-blas.h"
#include "cuda-internal.h"

#define BLAS_STR_(x) #x
#define BLAS_STR(x) BLAS_STR_(x)
#define BLAS_SONAME_LT "libcublasLt.so." BLAS_STR(CUBLAS_VER_MAJOR)
#define BLAS_SONAME "libcublas.so." BLAS_STR(CUBLAS_VER_MAJOR)
#ifndef GANG_CUDA_LIBDIR
#define GANG_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

gang__blas_api gang__blas;

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static int blas_rc;

static void *blas_open(const char *soname)
{
    char path[512];
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);

    if (h != NULL)
        return h;
    snprintf(path, sizeof(path), "%s/%s", GANG_CUDA_LIBDIR, soname);
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        gang_error("kernels/cuda: cannot load %s (also tried %s): %s", soname, path, dlerror());
    return h;
}

/* Resolves one symbol into *slot; the name is the (macro-expanded) function name. */
static int blas_sym(void *lib, const char *name, void **slot)
{
    *slot = dlsym(lib, name);
    if (*slot == NULL) {
        gang_error("kernels/cuda: symbol %s is missing from cuBLAS: %s", name, dlerror());
        return GANG_EIO;
    }
    return 0;
}

/* Every entry point, the library it lives in (1: cuBLASLt, 0: cuBLAS) and its slot. */
#define BLAS_ENTRY(in_lt, fn)                                                                      \
    {                                                                                              \
        in_lt, BLAS_STR(fn), (void **)&gang__blas.fn                                               \
    }
static const struct blas_entry {
    int in_lt;
    const char *name; /* after cublas_v2.h's renaming, e.g. "cublasCreate_v2" */
    void **slot;
} blas_entries[] = {
    BLAS_ENTRY(1, cublasLtCreate),
    BLAS_ENTRY(1, cublasLtDestroy),
    BLAS_ENTRY(1, cublasLtGetStatusString),
    BLAS_ENTRY(1, cublasLtMatmulDescCreate),
    BLAS_ENTRY(1, cublasLtMatmulDescDestroy),
    BLAS_ENTRY(1, cublasLtMatmulDescSetAttribute),
    BLAS_ENTRY(1, cublasLtMatrixLayoutCreate),
    BLAS_ENTRY(1, cublasLtMatrixLayoutDestroy),
    BLAS_ENTRY(1, cublasLtMatmulPreferenceCreate),
    BLAS_ENTRY(1, cublasLtMatmulPreferenceDestroy),
    BLAS_ENTRY(1, cublasLtMatmulPreferenceSetAttribute),
    BLAS_ENTRY(1, cublasLtMatmulAlgoGetHeuristic),
    BLAS_ENTRY(1, cublasLtMatmul),
    BLAS_ENTRY(0, cublasCreate),
    BLAS_ENTRY(0, cublasDestroy),
    BLAS_ENTRY(0, cublasSetStream),
    BLAS_ENTRY(0, cublasSetWorkspace),
    BLAS_ENTRY(0, cublasGemmEx),
};

/*
 * The libraries stay loaded for the life of the process (handles may outlive any one
 * caller), so they are never dlclose()d.
 */
static void blas_load_once(void)
{
    void *lt = blas_open(BLAS_SONAME_LT), *bl = lt != NULL ? blas_open(BLAS_SONAME) : NULL;

    blas_rc = 0;
    if (lt == NULL || bl == NULL) {
        blas_rc = GANG_EIO;
        return;
    }
    for (size_t i = 0; i < sizeof(blas_entries) / sizeof(blas_entries[0]); i++) {
        const struct blas_entry *e = &blas_entries[i];

        if ((blas_rc = blas_sym(e->in_lt ? lt : bl, e->name, e->slot)) < 0)
            return;
    }
}

int gang__blas_load(void)
{
    pthread_once(&blas_once, blas_load_once);
    return blas_rc;
}
