/*
 * Run-time loading of cuBLAS / cuBLASLt (see cuda-blas.h for why).
 *
 * Where they are searched is common/dynlib.c's order: --cuda-library-dir (or
 * GANGLION_CUDA_LIBRARY_DIR), the Python environment's nvidia.cu13 package (the pip wheel
 * nvidia-cublas, which is how a PyTorch image carries them), the loader's own search, then
 * the toolkit's library directory recorded at build time (GANG_CUDA_LIBDIR). cuBLASLt is
 * loaded first; cuBLAS is looked for in the directory cuBLASLt came from before the
 * search, so the two always come from the same release. The sonames come from the headers
 * the code was compiled against, so the loaded library matches the declarations.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda-backend.h"
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
static char blas_lt_file[1024]; /* the cuBLASLt file mapped, once loaded */

static const char *const blas_py_packages[] = {"nvidia.cu13", "nvidia.cublas", NULL};

/*
 * Opens soname through gang_dynlib_open; dir, when not "", is tried first (the directory
 * the other library of the pair came from). *from receives the file loaded.
 */
static void *blas_open(const char *what, const char *soname, const char *probe, const char *dir,
                       char *from, size_t cap)
{
    char path[1024];
    void *h;
    gang_dynlib lib = {.what = what,
                       .soname = soname,
                       .flag = "cuda-library-dir",
                       .py_packages = blas_py_packages,
                       .build_dir = GANG_CUDA_LIBDIR,
                       .probe_symbol = probe};

    if (dir[0] != '\0' && snprintf(path, sizeof(path), "%s/%s", dir, soname) < (int)sizeof(path) &&
        (h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != NULL) {
        gang_strlcpy(from, path, cap);
        gang_info("%s: loaded %s (beside the cuBLASLt loaded)", what, path);
        return h;
    }
    return gang_dynlib_open(&lib, &h, from, cap) == 0 ? h : NULL;
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
    char *lt_file = blas_lt_file, dir[1024] = "", bl_file[1024];
    void *lt = blas_open("cuBLASLt", BLAS_SONAME_LT, "cublasLtCreate", "", lt_file,
                         sizeof(blas_lt_file)),
         *bl = NULL;
    char *slash = strrchr(lt_file, '/');

    if (slash != NULL) {
        memcpy(dir, lt_file, (size_t)(slash - lt_file));
        dir[slash - lt_file] = '\0';
    }
    if (lt != NULL)
        bl = blas_open("cuBLAS", BLAS_SONAME, "cublasCreate_v2", dir, bl_file, sizeof(bl_file));
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

int gang__blas_library(char *path, size_t cap)
{
    int rc = gang__blas_load();

    gang_strlcpy(path, rc == 0 ? blas_lt_file : "", cap);
    return rc;
}
