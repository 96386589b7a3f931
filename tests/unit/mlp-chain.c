/* A decode layer's MLP chain on one handle (mlp-chain.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "mlp-chain.h"

/*
 * A round of the residual stream in the products (gang_kernels_matmul_fused, where k has
 * it): x += d (an add), the gate|up product norming x as it reads it (with the gated unit
 * where k fuses it), the down product adding to x, then d = 0: what the other rounds
 * leave, x holding the round's output already. Where k has no such call (the CPU), the
 * separate calls.
 */
static void fused_round(gang_kernels *k, size_t m, size_t hid, size_t ffn,
                        const gang_kernels_weight *g1, const gang_kernels_weight *g2,
                        const float *dn, float *dx, float *dd, float *dh, float *dgu, float *ds)
{
    gang_kernels_fusion f = {.norm = dn, .eps = 1e-5f, .glu_in = -1, .glu_out = 0};
    int rc;

    assert_int_equal(gang_kernels_add(k, dx, dd, m * hid), 0);
    rc = gang_kernels_matmul_fused(k, m, ffn, hid, dx, g1, &f, dh, ds);
    if (rc == GANG_ENOSYS) {
        f.glu_out = -1;
        rc = gang_kernels_matmul_fused(k, m, 2 * ffn, hid, dx, g1, &f, dh, dgu);
        f = (gang_kernels_fusion){.glu_in = 0, .glu_out = -1, .accumulate = 1};
    } else {
        f = (gang_kernels_fusion){.glu_in = -1, .glu_out = -1, .accumulate = 1};
    }
    if (rc == GANG_ENOSYS) { /* no such call: the separate ones */
        assert_int_equal(gang_kernels_rmsnorm(k, dx, dn, 1e-5f, m, hid, dh), 0);
        assert_int_equal(gang_kernels_matmul(k, m, 2 * ffn, hid, dh, g1, dgu), 0);
        assert_int_equal(gang_kernels_matmul_glu(k, 0, m, hid, ffn, dgu, g2, ds, dd), 0);
        assert_int_equal(gang_kernels_add(k, dx, dd, m * hid), 0);
    } else {
        assert_int_equal(rc, 0);
        rc = f.glu_in >= 0 ? gang_kernels_matmul_fused(k, m, hid, ffn, dgu, g2, &f, ds, dx)
                           : gang_kernels_matmul_fused(k, m, hid, ffn, ds, g2, &f, NULL, dx);
        assert_int_equal(rc, 0);
    }
    assert_int_equal(gang_kernels_scale(k, dd, 0.0f, m * hid), 0);
}

void mlp_chain(gang_kernels *k, gang_kernels_wtype t, size_t m, size_t hid, size_t ffn,
               const void *w1, const void *w2, const float *nw, const float *x0, int rounds,
               float **x_out, float **d_out)
{
    size_t b1 = gang_kernels_weight_bytes(t, 2 * ffn, hid),
           b2 = gang_kernels_weight_bytes(t, hid, ffn);
    void *dw1 = NULL, *dw2 = NULL, *dn = NULL, *dx = NULL, *dd = NULL, *dh = NULL, *dgu = NULL;
    void *ds = NULL;
    float *zeros = calloc(m * hid, 4), *x = malloc(m * hid * 4), *d = malloc(m * hid * 4);
    gang_kernels_weight g1, g2;

    assert_true(b1 > 0 && b2 > 0 && zeros != NULL && x != NULL && d != NULL);
    assert_int_equal(gang_kernels_alloc(k, b1, &dw1), 0);
    assert_int_equal(gang_kernels_alloc(k, b2, &dw2), 0);
    assert_int_equal(gang_kernels_alloc(k, hid * 4, &dn), 0);
    assert_int_equal(gang_kernels_alloc(k, m * hid * 4, &dx), 0);
    assert_int_equal(gang_kernels_alloc(k, m * hid * 4, &dd), 0);
    assert_int_equal(gang_kernels_alloc(k, m * hid * 4, &dh), 0);
    assert_int_equal(gang_kernels_alloc(k, m * 2 * ffn * 4, &dgu), 0);
    assert_int_equal(gang_kernels_alloc(k, m * ffn * 4, &ds), 0);
    assert_int_equal(gang_kernels_upload(k, dw1, w1, b1), 0);
    assert_int_equal(gang_kernels_upload(k, dw2, w2, b2), 0);
    assert_int_equal(gang_kernels_upload(k, dn, nw, hid * 4), 0);
    assert_int_equal(gang_kernels_upload(k, dx, x0, m * hid * 4), 0);
    assert_int_equal(gang_kernels_upload(k, dd, zeros, m * hid * 4), 0);
    g1 = gang_kernels_weight_view(t, dw1, 2 * ffn, hid);
    g2 = gang_kernels_weight_view(t, dw2, hid, ffn);
    for (int r = 0; r < rounds; r++) {
        int rc = GANG_ENOSYS;

        if (r % 3 == 2) {
            fused_round(k, m, hid, ffn, &g1, &g2, dn, dx, dd, dh, dgu, ds);
            continue;
        }
        assert_int_equal(gang_kernels_add_rmsnorm(k, dx, dd, dn, 1e-5f, m, hid, dh), 0);
        if (r % 3 == 1) /* the gated unit by the gate|up GEMV where the handle has it */
            rc = gang_kernels_matmul_to_glu(k, 0, m, ffn, hid, dh, &g1, ds);
        if (rc == 0) {
            assert_int_equal(gang_kernels_matmul(k, m, hid, ffn, ds, &g2, dd), 0);
            continue;
        }
        assert_int_equal(rc, GANG_ENOSYS);
        assert_int_equal(gang_kernels_matmul(k, m, 2 * ffn, hid, dh, &g1, dgu), 0);
        assert_int_equal(gang_kernels_matmul_glu(k, 0, m, hid, ffn, dgu, &g2, ds, dd), 0);
    }
    assert_int_equal(gang_kernels_download(k, x, dx, m * hid * 4), 0);
    assert_int_equal(gang_kernels_download(k, d, dd, m * hid * 4), 0);
    void *bufs[] = {dw1, dw2, dn, dx, dd, dh, dgu, ds};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        gang_kernels_free(k, bufs[i]);
    free(zeros);
    *x_out = x;
    if (d_out != NULL)
        *d_out = d;
    else
        free(d);
}
