/*
 * cuBLAS and cuBLASLt, loaded at run time (cuda-blas.c). Private to kernels/cuda/.
 *
 * The binary does not link libcublas / libcublasLt: the agent and every other CUDA-free
 * command start without them (no 150 ms of relocations per process, and no failure to
 * start on a node that has no CUDA libraries at all). The first "cuda" handle loads them
 * with dlopen and fills gang__blas; calls go through it: gang__blas.cublasLtMatmul(...).
 * Members carry the library's function names (cublas_v2.h renames a few to their _v2
 * symbols, and the same renaming applies here), typed from the headers.
 */
#ifndef GANGLION_KERNELS_CUDA_BLAS_H
#define GANGLION_KERNELS_CUDA_BLAS_H

#include <cublasLt.h>
#include <cublas_v2.h>

typedef struct gang__blas_api {
    __typeof__(&cublasLtCreate) cublasLtCreate;
    __typeof__(&cublasLtDestroy) cublasLtDestroy;
    __typeof__(&cublasLtGetStatusString) cublasLtGetStatusString;
    __typeof__(&cublasLtMatmulDescCreate) cublasLtMatmulDescCreate;
    __typeof__(&cublasLtMatmulDescDestroy) cublasLtMatmulDescDestroy;
    __typeof__(&cublasLtMatmulDescSetAttribute) cublasLtMatmulDescSetAttribute;
    __typeof__(&cublasLtMatrixLayoutCreate) cublasLtMatrixLayoutCreate;
    __typeof__(&cublasLtMatrixLayoutDestroy) cublasLtMatrixLayoutDestroy;
    __typeof__(&cublasLtMatmulPreferenceCreate) cublasLtMatmulPreferenceCreate;
    __typeof__(&cublasLtMatmulPreferenceDestroy) cublasLtMatmulPreferenceDestroy;
    __typeof__(&cublasLtMatmulPreferenceSetAttribute) cublasLtMatmulPreferenceSetAttribute;
    __typeof__(&cublasLtMatmulAlgoGetHeuristic) cublasLtMatmulAlgoGetHeuristic;
    __typeof__(&cublasLtMatmul) cublasLtMatmul;
    __typeof__(&cublasCreate) cublasCreate;
    __typeof__(&cublasDestroy) cublasDestroy;
    __typeof__(&cublasSetStream) cublasSetStream;
    __typeof__(&cublasSetWorkspace) cublasSetWorkspace;
    __typeof__(&cublasGemmEx) cublasGemmEx;
} gang__blas_api;

/* Filled by gang__blas_load(); read-only afterwards. */
extern gang__blas_api gang__blas;

/* Loads both libraries once (thread-safe). 0, or GANG_EIO with a log line naming the
 * library and dlerror()'s reason; later calls return the first result again. */
int gang__blas_load(void);

#endif
