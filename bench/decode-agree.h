/*
 * Layout agreement of `ganglion bench decode` (bench/decode-agree.c): whether a TP / PP
 * layout computes the same model as 1x1, judged by the logits of every greedy decision
 * rather than by exact token equality. Two layouts sum the same products in different
 * orders (a K-split GEMM's partial sums, cuBLASLt's algorithm for half-width shapes), so
 * their f32 logits differ by rounding, and at a near-tie the greedy token may flip; a
 * flip where 1x1's two best candidates are far apart is a real disagreement.
 */
#ifndef GANGLION_BENCH_DECODE_AGREE_H
#define GANGLION_BENCH_DECODE_AGREE_H

#include <stdint.h>

#include <cjson/cJSON.h>

#define GANG_AGREE_TOP 5 /* raw log-probabilities recorded per decision */

/* One greedy decision as the TOKEN event reported it (the request asked for logprobs). */
typedef struct gang__decision {
    int32_t token;
    uint32_t n_top;              /* entries of ids / lps, descending */
    int32_t ids[GANG_AGREE_TOP]; /* the best candidates */
    float lps[GANG_AGREE_TOP];   /* their raw log-probabilities */
} gang__decision;

typedef struct gang__agreement {
    uint32_t compared;       /* decisions taken from the same context in both layouts */
    uint32_t agree;          /* of those, with the same token */
    uint32_t divergences;    /* with another token (the sequence is compared no further) */
    uint32_t over_tol;       /* divergences where 1x1's top-2 gap exceeded gap_tol: failures */
    double max_abs_diff;     /* largest |log-prob difference| of a candidate both reported */
    double max_gap_diverged; /* largest 1x1 top-2 gap at a divergence (0 without one) */
} gang__agreement;

/*
 * Compares got with base, both [seqs x steps] decisions in sequence-major order. A
 * sequence is compared decision by decision until the first divergence: after it, the
 * two contexts differ and nothing more is comparable. A log-probability difference is
 * the difference of the logits up to each row's normaliser; the top-2 gap of
 * log-probabilities equals the top-2 logit gap exactly. A divergence counts in over_tol
 * when base's gap between its best and second-best candidate is above gap_tol (or base
 * reported fewer than two). Pure; out is overwritten.
 */
void gang__decode_agree(const gang__decision *base, const gang__decision *got, uint32_t seqs,
                        uint32_t steps, double gap_tol, gang__agreement *out);

/*
 * The agreement of got with base (gang__decode_agree at gap_tol) added to a point's JSON
 * line: tokens_match_1x1 (every token equal), the decisions compared, the top-1 agreement,
 * the largest log-prob difference, the divergences and the largest 1x1 gap at one,
 * gap_tol, and logits_match_1x1 (no divergence over gap_tol).
 */
void gang__decode_agree_emit(cJSON *line, const gang__decision *base, const gang__decision *got,
                             uint32_t seqs, uint32_t steps, double gap_tol);

#endif
