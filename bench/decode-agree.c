/*
 * Layout agreement of bench decode by the logits (decode-agree.h).
 */
#include <math.h>
#include <string.h>

#include "decode-agree.h"

/* The largest |lp difference| over the candidates both decisions reported. */
static double decision_diff(const gang__decision *a, const gang__decision *b)
{
    double worst = 0.0;

    for (uint32_t i = 0; i < a->n_top; i++)
        for (uint32_t j = 0; j < b->n_top; j++)
            if (a->ids[i] == b->ids[j] && fabs((double)a->lps[i] - b->lps[j]) > worst)
                worst = fabs((double)a->lps[i] - b->lps[j]);
    return worst;
}

void gang__decode_agree(const gang__decision *base, const gang__decision *got, uint32_t seqs,
                        uint32_t steps, double gap_tol, gang__agreement *out)
{
    memset(out, 0, sizeof(*out));
    for (uint32_t s = 0; s < seqs; s++) {
        for (uint32_t i = 0; i < steps; i++) {
            const gang__decision *a = &base[(size_t)s * steps + i],
                                 *b = &got[(size_t)s * steps + i];
            double d = decision_diff(a, b), gap;

            out->compared++;
            if (d > out->max_abs_diff)
                out->max_abs_diff = d;
            if (a->token == b->token) {
                out->agree++;
                continue;
            }
            out->divergences++;
            gap = a->n_top >= 2 ? (double)a->lps[0] - a->lps[1] : INFINITY;
            if (!(gap <= gap_tol))
                out->over_tol++;
            if (gap > out->max_gap_diverged)
                out->max_gap_diverged = gap;
            break; /* the contexts differ from here on */
        }
    }
}
