/*
 * CPU backend: GEMM through OpenBLAS's CBLAS interface (loaded at run time: cpu-blas.c).
 */
#include <string.h>

#include "cpu.h"

/*
 * C[m,n] = alpha * A[m,k] . op(B) + beta * C, all row-major. The front has checked that the
 * dimensions fit in int (CBLAS takes int). When beta == 0 we clear C ourselves before the
 * call: BLAS promises not to read C then, but clearing it makes NaN left in a fresh buffer
 * harmless even with a BLAS build that multiplies by beta instead of overwriting.
 * GANG_ENOENT when OpenBLAS cannot be loaded (cpu-blas.c).
 */
int gang__cpu_gemm(int trans_b, size_t m, size_t n, size_t kdim, float alpha, const float *a,
                   const float *b, float beta, float *c)
{
    int ldb = trans_b ? (int)kdim : (int)n;
    gang__cpu_sgemm_fn sgemm;
    int rc = gang__cpu_blas_load(&sgemm);

    if (rc < 0)
        return rc;
    if (beta == 0.0f)
        memset(c, 0, m * n * sizeof(*c));
    sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n,
          (int)kdim, alpha, a, (int)kdim, b, ldb, beta, c, (int)n);
    return 0;
}
