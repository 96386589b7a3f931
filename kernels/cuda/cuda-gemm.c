/*
 * CUDA backend GEMM: cuBLASLt with a per-handle plan cache, plus one timed round of it
 * against a direct cublasGemmEx call on the same buffers (the measuring primitive of
 * bench/bench-gemm.c, through kernels/kernels-bench.h).
 *
 * Layout. The kernels API is row-major; cuBLAS is column-major. A row-major [r, c] matrix
 * is the column-major [c, r] matrix with the same bytes, so C = A . op(B) (row-major) is
 * C^T = op(B)^T . A^T (column-major), i.e. a column-major GEMM with
 *   Lt "A" = our B:  trans_b == 0: stored [n rows, k cols], ld n, op N
 *                    trans_b != 0: stored [k rows, n cols], ld k, op T
 *   Lt "B" = our A:  stored [k rows, m cols], ld k, op N
 *   Lt "C" = our C:  [n rows, m cols], ld n
 * and Lt sizes (M, N, K) = (n, m, k). No data is ever transposed.
 *
 * Plans. Creating descriptors and asking the heuristic costs tens of microseconds, more
 * than a decode-sized GEMM, so each (dtype, trans_b, m, n, k, alignment) gets its
 * descriptors and chosen algorithm once, kept in GANG_CUDA_PLANS slots per handle and
 * replaced round-robin when the cache is full. The alignment of the three pointers is in
 * the key because the heuristic may pick kernels that need 16-byte (or wider) aligned
 * operands, and callers pass offsets into pool allocations.
 *
 * Precision. f32 runs with CUBLAS_COMPUTE_32F (no TF32), so it matches the CPU backend to
 * f32 rounding; f16/bf16 store in half precision and accumulate in f32 (tensor cores).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda-blas.h"
#include "cuda-internal.h"

struct gang__cuda_plan {
    int valid;
    gang_dtype dt;
    int trans_b;
    int out_f32; /* half a and b with an f32 c (gang_kernels_matmul) */
    size_t m, n, k;
    unsigned align; /* common alignment of a, b, c in bytes (<= 256) */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    /* The heuristic's candidates, best first; cur is the one in use. A candidate that
     * cublasLtMatmul refuses at launch (not supported, invalid for these pointers) is
     * dropped for the next, and the plan keeps the one that ran. */
    cublasLtMatmulAlgo_t algos[GANG_CUDA_ALGOS];
    int n_algos, cur;
};

static int lt_err(cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 0;
    gang_error("kernels/cuda: %s: %s", what, gang__blas.cublasLtGetStatusString(s));
    switch (s) {
    case CUBLAS_STATUS_ALLOC_FAILED:
        return GANG_ENOMEM;
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return GANG_ENOSYS;
    case CUBLAS_STATUS_INVALID_VALUE:
        return GANG_EINVAL;
    default:
        return GANG_EIO;
    }
}

static cudaDataType_t cuda_type(gang_dtype dt)
{
    switch (dt) {
    case GANG_DTYPE_F16:
        return CUDA_R_16F;
    case GANG_DTYPE_BF16:
        return CUDA_R_16BF;
    case GANG_DTYPE_F32:
    case GANG_DTYPE_I32: /* refused by the front before it gets here */
        break;
    }
    return CUDA_R_32F;
}

static void plan_release(gang__cuda_plan *p)
{
    if (p->lc != NULL)
        gang__blas.cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb != NULL)
        gang__blas.cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la != NULL)
        gang__blas.cublasLtMatrixLayoutDestroy(p->la);
    if (p->op != NULL)
        gang__blas.cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof(*p));
}

int gang__cuda_gemm_init(gang__cuda_ctx *c)
{
    cublasLtHandle_t lt = NULL;
    int rc;

    if ((rc = gang__blas_load()) < 0)
        return rc;
    c->plans = calloc(GANG_CUDA_PLANS, sizeof(*c->plans));
    if (c->plans == NULL)
        return GANG_ENOMEM;
    if ((rc = lt_err(gang__blas.cublasLtCreate(&lt), "cublasLtCreate")) < 0)
        return rc;
    c->lt = lt;
    /* A small pool gets a smaller workspace rather than a refusal: the heuristic then
     * simply skips the algorithms that need more. */
    c->workspace_bytes = GANG_CUDA_WORKSPACE;
    if (c->workspace_bytes > c->pool.size / 8)
        c->workspace_bytes = c->pool.size / 8 / GANG_CUDA_POOL_ALIGN * GANG_CUDA_POOL_ALIGN;
    if (c->workspace_bytes > 0) {
        if ((rc = gang__cuda_mem_alloc(c, c->workspace_bytes, &c->workspace)) < 0)
            return rc;
    }
    return 0;
}

void gang__cuda_gemm_fini(gang__cuda_ctx *c)
{
    if (c->plans != NULL) {
        for (unsigned i = 0; i < GANG_CUDA_PLANS; i++)
            if (c->plans[i].valid)
                plan_release(&c->plans[i]);
        free(c->plans);
        c->plans = NULL;
    }
    if (c->blas != NULL)
        gang__blas.cublasDestroy((cublasHandle_t)c->blas);
    if (c->lt != NULL)
        gang__blas.cublasLtDestroy((cublasLtHandle_t)c->lt);
    c->blas = c->lt = NULL;
}

/* The largest power of two (<= 256) dividing every address: what the heuristic may assume. */
static unsigned ptr_align(const void *a, const void *b, const void *cm)
{
    uintptr_t x = (uintptr_t)a | (uintptr_t)b | (uintptr_t)cm | 256u;

    return (unsigned)(x & (~x + 1));
}

/* Builds the descriptors of a plan and asks the heuristic for its GANG_CUDA_ALGOS best
 * algorithms (those it reports usable), best first. */
static int plan_build(gang__cuda_ctx *c, gang__cuda_plan *p)
{
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res[GANG_CUDA_ALGOS];
    cublasOperation_t ta = p->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
    cudaDataType_t t = cuda_type(p->dt);
    uint64_t rows_a = p->trans_b ? p->k : p->n, cols_a = p->trans_b ? p->n : p->k;
    uint64_t ws = c->workspace_bytes;
    uint32_t al = p->align;
    int found = 0, rc;

    rc = lt_err(gang__blas.cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                "cublasLtMatmulDescCreate");
    if (rc < 0)
        goto out;
    if ((rc = lt_err(gang__blas.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                               &ta, sizeof(ta)),
                     "TRANSA")) < 0 ||
        (rc = lt_err(gang__blas.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                               &tb, sizeof(tb)),
                     "TRANSB")) < 0)
        goto out;
    if ((rc = lt_err(
             gang__blas.cublasLtMatrixLayoutCreate(&p->la, t, rows_a, cols_a, (int64_t)rows_a),
             "layout A")) < 0 ||
        (rc = lt_err(gang__blas.cublasLtMatrixLayoutCreate(&p->lb, t, p->k, p->m, (int64_t)p->k),
                     "layout B")) < 0 ||
        (rc = lt_err(gang__blas.cublasLtMatrixLayoutCreate(&p->lc, p->out_f32 ? CUDA_R_32F : t,
                                                           p->n, p->m, (int64_t)p->n),
                     "layout C")) < 0)
        goto out;
    if ((rc = lt_err(gang__blas.cublasLtMatmulPreferenceCreate(&pref), "preference")) < 0)
        goto out;
    gang__blas.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof(ws));
    gang__blas.cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof(al));
    gang__blas.cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof(al));
    gang__blas.cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof(al));
    gang__blas.cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof(al));
    rc = lt_err(gang__blas.cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)c->lt, p->op, p->la,
                                                          p->lb, p->lc, p->lc, pref,
                                                          GANG_CUDA_ALGOS, res, &found),
                "cublasLtMatmulAlgoGetHeuristic");
    if (rc < 0)
        goto out;
    p->n_algos = 0;
    p->cur = 0;
    for (int i = 0; i < found && i < GANG_CUDA_ALGOS; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS)
            p->algos[p->n_algos++] = res[i].algo;
    if (p->n_algos == 0) {
        gang_error("kernels/cuda: cuBLASLt has no algorithm for %s gemm m=%zu n=%zu k=%zu",
                   p->dt == GANG_DTYPE_F32 ? "f32" : "half", p->m, p->n, p->k);
        rc = GANG_ENOSYS;
        goto out;
    }
    p->valid = 1;
out:
    if (pref != NULL)
        gang__blas.cublasLtMatmulPreferenceDestroy(pref);
    if (rc < 0)
        plan_release(p);
    return rc;
}

/* Finds the cached plan of a shape or builds it in a free (or the next victim) slot. */
static int plan_get(gang__cuda_ctx *c, gang_dtype dt, int trans_b, int out_f32, size_t m, size_t n,
                    size_t k, unsigned align, gang__cuda_plan **out)
{
    gang__cuda_plan *slot = NULL;
    int rc;

    for (unsigned i = 0; i < GANG_CUDA_PLANS; i++) {
        gang__cuda_plan *p = &c->plans[i];

        if (!p->valid) {
            if (slot == NULL)
                slot = p;
            continue;
        }
        if (p->dt == dt && p->trans_b == trans_b && p->out_f32 == out_f32 && p->m == m &&
            p->n == n && p->k == k && p->align == align) {
            *out = p;
            return 0;
        }
    }
    if (slot == NULL) {
        slot = &c->plans[c->plan_next++ % GANG_CUDA_PLANS];
        plan_release(slot);
    }
    slot->dt = dt;
    slot->trans_b = trans_b;
    slot->out_f32 = out_f32;
    slot->m = m;
    slot->n = n;
    slot->k = k;
    slot->align = align;
    if ((rc = plan_build(c, slot)) < 0)
        return rc;
    *out = slot;
    return 0;
}

/*
 * Runs one product through its plan. When cublasLtMatmul refuses the plan's algorithm at
 * launch (CUBLAS_STATUS_NOT_SUPPORTED or _INVALID_VALUE: nothing was enqueued), the next
 * candidate of the heuristic is tried, and the plan keeps the first that launches; any
 * other status is the caller's error. GANG_ENOSYS when every candidate was refused.
 */
static int gemm_run(gang__cuda_ctx *c, gang_dtype dt, int trans_b, int out_f32, size_t m, size_t n,
                    size_t kdim, float alpha, const void *a, const void *b, float beta, void *cmat)
{
    gang__cuda_plan *p;
    int rc = plan_get(c, dt, trans_b, out_f32, m, n, kdim, ptr_align(a, b, cmat), &p);

    if (rc < 0)
        return rc;
    for (; p->cur < p->n_algos; p->cur++) {
        cublasStatus_t st = gang__blas.cublasLtMatmul(
            (cublasLtHandle_t)c->lt, p->op, &alpha, b, p->la, a, p->lb, &beta, cmat, p->lc, cmat,
            p->lc, &p->algos[p->cur], c->workspace, c->workspace_bytes, c->stream);

        if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE)
            return lt_err(st, "cublasLtMatmul");
        gang_warn("kernels/cuda: cuBLASLt refused algorithm %d of %d for gemm m=%zu n=%zu "
                  "k=%zu (%s); trying the next",
                  p->cur + 1, p->n_algos, m, n, kdim, gang__blas.cublasLtGetStatusString(st));
    }
    gang_error("kernels/cuda: cuBLASLt refused all %d algorithms for gemm m=%zu n=%zu k=%zu",
               p->n_algos, m, n, kdim);
    return GANG_ENOSYS;
}

int gang__cuda_gemm(void *ctx, gang_dtype dt, int trans_b, size_t m, size_t n, size_t kdim,
                    float alpha, const void *a, const void *b, float beta, void *cmat)
{
    gang__cuda_ctx *c = ctx;
    int rc = gang__cuda_err(cudaSetDevice(c->device), "cudaSetDevice");

    if (rc < 0)
        return rc;
    return gemm_run(c, dt, trans_b != 0, 0, m, n, kdim, alpha, a, b, beta, cmat);
}

int gang__cuda_gemm_half_f32(gang__cuda_ctx *c, gang_dtype dt, size_t m, size_t n, size_t kdim,
                             const void *a, const void *b, float beta, float *cmat)
{
    return gemm_run(c, dt, 1, 1, m, n, kdim, 1.0f, a, b, beta, cmat);
}

/* The peer of the benchmark: the same column-major mapping through cublasGemmEx. */
static int gemm_ref(gang__cuda_ctx *c, gang_dtype dt, int trans_b, size_t m, size_t n, size_t kdim,
                    const void *a, const void *b, void *cmat)
{
    const float alpha = 1.0f, beta = 0.0f;
    cudaDataType_t t = cuda_type(dt);
    int lda = trans_b ? (int)kdim : (int)n;

    return lt_err(gang__blas.cublasGemmEx(
                      (cublasHandle_t)c->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N,
                      (int)n, (int)m, (int)kdim, &alpha, b, t, lda, a, t, (int)kdim, &beta, cmat, t,
                      (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  "cublasGemmEx");
}

/* The cuBLAS handle of the reference, made on first use, on the handle's stream and
 * with the same workspace as our path. */
static int ref_ready(gang__cuda_ctx *c)
{
    int rc;

    if (c->blas == NULL) {
        cublasHandle_t h;

        if ((rc = lt_err(gang__blas.cublasCreate(&h), "cublasCreate")) < 0)
            return rc;
        c->blas = h;
    }
    if ((rc = lt_err(gang__blas.cublasSetStream((cublasHandle_t)c->blas, c->stream),
                     "cublasSetStream")) < 0)
        return rc;
    return lt_err(
        gang__blas.cublasSetWorkspace((cublasHandle_t)c->blas, c->workspace, c->workspace_bytes),
        "cublasSetWorkspace");
}

/*
 * One timed round of the GEMM benchmark (kernels/kernels-bench.h): our GEMM into c_ours,
 * then the cuBLAS peer into c_ref, each between its own pair of events on the handle's
 * stream so that both see the same clocks and caches. Returns when both finished.
 */
int gang__cuda_gemm_pair(void *ctx, gang_dtype dt, int trans_b, size_t m, size_t n, size_t kdim,
                         const void *a, const void *b, void *c_ours, void *c_ref, float *ours_ms,
                         float *ref_ms)
{
    gang__cuda_ctx *c = ctx;
    cudaEvent_t ev[3] = {NULL, NULL, NULL};
    int rc;

    if ((rc = gang__cuda_err(cudaSetDevice(c->device), "cudaSetDevice")) < 0)
        return rc;
    if ((rc = ref_ready(c)) < 0)
        return rc;
    for (int i = 0; i < 3; i++)
        if ((rc = gang__cuda_err(cudaEventCreate(&ev[i]), "cudaEventCreate")) < 0)
            goto out_events;
    cudaEventRecord(ev[0], c->stream);
    rc = gemm_run(c, dt, trans_b, 0, m, n, kdim, 1.0f, a, b, 0.0f, c_ours);
    cudaEventRecord(ev[1], c->stream);
    if (rc == 0)
        rc = gemm_ref(c, dt, trans_b, m, n, kdim, a, b, c_ref);
    cudaEventRecord(ev[2], c->stream);
    if (rc < 0)
        goto out_events;
    if ((rc = gang__cuda_err(cudaEventSynchronize(ev[2]), "bench wait")) < 0)
        goto out_events;
    cudaEventElapsedTime(ours_ms, ev[0], ev[1]);
    cudaEventElapsedTime(ref_ms, ev[1], ev[2]);

out_events:
    cudaStreamSynchronize(c->stream);
    for (int i = 0; i < 3; i++)
        if (ev[i] != NULL)
            cudaEventDestroy(ev[i]);
    return rc;
}
