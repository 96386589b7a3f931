/*
 * The CUDA emulator's cuBLASLt and cuBLAS (tests/cuda-emu/, issue #24): the entry points
 * kernels/cuda/cuda-blas.c resolves, built as libcublasLt.so.13 and libcublas.so.13 in the
 * emulator's build directory, where the backend's run-time search finds them through
 * GANG_CUDA_LIBRARY_DIR (so the loading path is the one a device run takes).
 *
 * A matmul is the textbook column-major product D = alpha op(A) op(B) + beta C over
 * f32 / f16 / bf16 matrices with a double accumulator rounded to f32 (the compute type),
 * then alpha and beta C applied in f32, D rounded to its type to nearest even, enqueued on the
 * call's stream (recorded when the stream is captured). Layouts that do not agree, descriptor
 * attributes it does not implement (an epilogue, a bias) and a scale type other than f32 are
 * refused, never ignored. The heuristic offers two algorithms; with GANG_EMU_LT_REFUSE_FIRST=1 a
 * matmul on the first answers CUBLAS_STATUS_NOT_SUPPORTED, which is how a test reaches the
 * backend's fallback to the next algorithm.
 */
#include "emu-kernel.h" /* first: its qualifiers come before the CUDA headers' */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace
{

struct desc_impl {
    cublasOperation_t ta, tb;
};

struct layout_impl {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};

struct handle_impl {
    cudaStream_t stream;
};

double load(cudaDataType t, const void *p, size_t i)
{
    switch (t) {
    case CUDA_R_32F:
        return ((const float *)p)[i];
    case CUDA_R_16F:
        return __half2float(((const __half *)p)[i]);
    default:
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    }
}

void store(cudaDataType t, void *p, size_t i, double v)
{
    switch (t) {
    case CUDA_R_32F:
        ((float *)p)[i] = (float)v;
        break;
    case CUDA_R_16F:
        ((__half *)p)[i] = __float2half_rn((float)v);
        break;
    default:
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v);
        break;
    }
}

bool type_ok(cudaDataType t)
{
    return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF;
}

/* The product, checked; enqueued on stream. */
cublasStatus_t gemm(cudaStream_t stream, cublasOperation_t ta, cublasOperation_t tb, layout_impl a,
                    layout_impl b, layout_impl c, layout_impl d, float alpha, float beta,
                    const void *pa, const void *pb, const void *pc, void *pd)
{
    uint64_t m = d.rows, n = d.cols;
    uint64_t ka = ta == CUBLAS_OP_N ? a.cols : a.rows, ma = ta == CUBLAS_OP_N ? a.rows : a.cols;
    uint64_t kb = tb == CUBLAS_OP_N ? b.rows : b.cols, nb = tb == CUBLAS_OP_N ? b.cols : b.rows;

    if (!type_ok(a.type) || !type_ok(b.type) || !type_ok(c.type) || !type_ok(d.type) ||
        (ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) ||
        ma != m || nb != n || ka != kb || c.rows != m || c.cols != n || a.ld < (int64_t)a.rows ||
        b.ld < (int64_t)b.rows || c.ld < (int64_t)c.rows || d.ld < (int64_t)d.rows || pa == NULL ||
        pb == NULL || pd == NULL || (beta != 0.0f && pc == NULL))
        return CUBLAS_STATUS_INVALID_VALUE;
    gang_emu_enqueue(stream, [=]() {
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                double s = 0.0;

                for (uint64_t k = 0; k < ka; k++) {
                    size_t ia = ta == CUBLAS_OP_N ? i + k * (size_t)a.ld : k + i * (size_t)a.ld;
                    size_t ib = tb == CUBLAS_OP_N ? k + j * (size_t)b.ld : j + k * (size_t)b.ld;

                    s += load(a.type, pa, ia) * load(b.type, pb, ib);
                }
                /* the f32 accumulator (CUBLAS_COMPUTE_32F) rounded, then the epilogue in f32:
                 * a residual add (beta 1) rounds as an add kernel does */
                float r = (float)s * alpha;

                if (beta != 0.0f)
                    r = fmaf(beta, (float)load(c.type, pc, i + j * (size_t)c.ld), r);
                store(d.type, pd, i + j * (size_t)d.ld, r);
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    *h = reinterpret_cast<cublasLtHandle_t>(new handle_impl());
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    delete reinterpret_cast<handle_impl *>(h);
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:
        return "success (emulated cuBLASLt)";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "not supported (emulated cuBLASLt)";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "invalid value (emulated cuBLASLt)";
    default:
        return "error (emulated cuBLASLt)";
    }
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType_t scale)
{
    if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = reinterpret_cast<cublasLtMatmulDesc_t>(new desc_impl{CUBLAS_OP_N, CUBLAS_OP_N});
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    delete reinterpret_cast<desc_impl *>(d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t bytes)
{
    desc_impl *x = reinterpret_cast<desc_impl *>(d);
    int32_t v;

    if (buf == NULL || bytes != sizeof(int32_t))
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&v, buf, sizeof(v));
    if (attr == CUBLASLT_MATMUL_DESC_TRANSA)
        x->ta = (cublasOperation_t)v;
    else if (attr == CUBLASLT_MATMUL_DESC_TRANSB)
        x->tb = (cublasOperation_t)v;
    else
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    if (!type_ok(type))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    *l = reinterpret_cast<cublasLtMatrixLayout_t>(new layout_impl{type, rows, cols, ld});
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    delete reinterpret_cast<layout_impl *>(l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    *p = reinterpret_cast<cublasLtMatmulPreference_t>(new int(0));
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    delete reinterpret_cast<int *>(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t bytes)
{
    (void)p;
    (void)attr;
    return buf == NULL || bytes == 0 ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int *returned)
{
    (void)h;
    (void)pref;
    if (op == NULL || a == NULL || b == NULL || c == NULL || d == NULL || requested <= 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    *returned = requested < 2 ? requested : 2;
    for (int i = 0; i < *returned; i++) {
        memset(&results[i], 0, sizeof(results[i]));
        results[i].algo.data[0] = (uint64_t)i + 1;
        results[i].state = CUBLAS_STATUS_SUCCESS;
        results[i].wavesCount = 1.0f;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t la, const void *B,
                              cublasLtMatrixLayout_t lb, const void *beta, const void *C,
                              cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes,
                              cudaStream_t stream)
{
    const char *refuse = getenv("GANG_EMU_LT_REFUSE_FIRST");
    desc_impl *x = reinterpret_cast<desc_impl *>(op);

    (void)h;
    (void)ws;
    (void)ws_bytes;
    if (algo == NULL || algo->data[0] == 0 || x == NULL || la == NULL || lb == NULL || lc == NULL ||
        ld == NULL)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (refuse != NULL && strcmp(refuse, "1") == 0 && algo->data[0] == 1)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return gemm(stream, x->ta, x->tb, *reinterpret_cast<layout_impl *>(la),
                *reinterpret_cast<layout_impl *>(lb), *reinterpret_cast<layout_impl *>(lc),
                *reinterpret_cast<layout_impl *>(ld), *(const float *)alpha, *(const float *)beta,
                A, B, C, D);
}

cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
    *h = reinterpret_cast<cublasHandle_t>(new handle_impl());
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
    delete reinterpret_cast<handle_impl *>(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    reinterpret_cast<handle_impl *>(h)->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t bytes)
{
    (void)h;
    (void)ws;
    (void)bytes;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    (void)algo;
    if (compute != CUBLAS_COMPUTE_32F || m < 0 || n < 0 || k < 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    layout_impl la = {at, (uint64_t)(ta == CUBLAS_OP_N ? m : k),
                      (uint64_t)(ta == CUBLAS_OP_N ? k : m), lda};
    layout_impl lb = {bt, (uint64_t)(tb == CUBLAS_OP_N ? k : n),
                      (uint64_t)(tb == CUBLAS_OP_N ? n : k), ldb};
    layout_impl lc = {ct, (uint64_t)m, (uint64_t)n, ldc};
    return gemm(reinterpret_cast<handle_impl *>(h)->stream, ta, tb, la, lb, lc, lc,
                *(const float *)alpha, *(const float *)beta, A, B, C, C);
}

} /* extern "C" */
