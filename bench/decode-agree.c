/*
 * Layout agreement of bench decode by the logits (decode-agree.h).
 */
#include <math.h>
#include <string.h>

#include "decode-agree.h"
#include "report.h"

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

void gang__decode_agree_emit(cJSON *line, const gang__decision *base, const gang__decision *got,
                             uint32_t seqs, uint32_t steps, double gap_tol)
{
    gang__agreement ag;
    int same = 1;

    gang__decode_agree(base, got, seqs, steps, gap_tol, &ag);
    for (size_t i = 0; i < (size_t)seqs * steps && same; i++)
        same = base[i].token == got[i].token;
    cJSON_AddBoolToObject(line, "tokens_match_1x1", same);
    cJSON_AddNumberToObject(line, "decisions_compared", ag.compared);
    cJSON_AddNumberToObject(line, "top1_agreement",
                            ag.compared ? gang_report_round((double)ag.agree / ag.compared, 4)
                                        : 0.0);
    cJSON_AddNumberToObject(line, "max_abs_logprob_diff", ag.max_abs_diff);
    cJSON_AddNumberToObject(line, "divergences", ag.divergences);
    cJSON_AddNumberToObject(line, "max_top2_gap_at_divergence", ag.max_gap_diverged);
    cJSON_AddNumberToObject(line, "gap_tol", gap_tol);
    cJSON_AddBoolToObject(line, "logits_match_1x1", ag.over_tol == 0);
}
