/*
 * Sampling of the next token from one row of logits.
 *
 * Determinism is the point: a request must get the same tokens whether it runs alone or
 * next to others, in one microbatch or several, before or after a gang restart. So the
 * sampler keeps no state between calls. Its randomness is a counter-based generator: the
 * uniform draw of the token at absolute position p of a request with seed s is a fixed
 * function of (s, p) (two rounds of the splitmix64 finaliser over s and p), and the
 * candidates are ordered by a total order (logit descending, then token id ascending), so
 * the result depends on nothing but the logits, the parameters and the position.
 *
 * The filters follow the usual order of serving stacks: top-k keeps the k largest
 * logits, the temperature softmax turns them into probabilities (in double), top-p keeps
 * the shortest prefix of the sorted candidates whose mass reaches p (at least one), and
 * one draw walks the cumulative mass of what is left. Temperature 0, or top-k 1, is
 * greedy: the argmax with the lowest index on ties, exactly gang_kernels_argmax.
 *
 * Penalties come before all of that (gang__sample_seq), on a copy of the row, counted
 * over the sequence's own tokens, which the last stage keeps per KV slot: so they too
 * depend on nothing but the sequence. So do the logit bias and the grammar's mask: the
 * grammar's state is replayed from the sequence's output each draw (text.h,
 * gang_jgram_mask), never carried, so a preempted or resubmitted request is constrained
 * exactly as an uninterrupted one. Logprobs (gang__logprobs) read the raw row.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "engine-internal.h"
#include "ganglion/common.h"

int gang__sampler_init(gang__sampler *s, uint32_t vocab)
{
    memset(s, 0, sizeof(*s));
    if (vocab == 0)
        return GANG_EINVAL;
    s->cand = malloc((size_t)vocab * sizeof(*s->cand));
    s->prob = malloc((size_t)vocab * sizeof(*s->prob));
    s->adj = malloc((size_t)vocab * sizeof(*s->adj));
    s->count = calloc(vocab, sizeof(*s->count));
    if (s->cand == NULL || s->prob == NULL || s->adj == NULL || s->count == NULL) {
        gang__sampler_free(s);
        return GANG_ENOMEM;
    }
    s->vocab = vocab;
    return 0;
}

void gang__sampler_free(gang__sampler *s)
{
    if (s == NULL)
        return;
    gang__sampler_vocab_wait(s);
    for (uint32_t i = 0; s->slot_g != NULL && i < s->n_slots; i++)
        gang_jgram_free(s->slot_g[i]);
    free(s->slot_g);
    free(s->allowed);
    gang_jgram_vocab_free(s->gv);
    free(s->cand);
    free(s->prob);
    free(s->adj);
    free(s->count);
    memset(s, 0, sizeof(*s));
}

void gang__sampler_vocab(gang__sampler *s, gang_jgram_vocab *gv, const int32_t *eos, uint32_t n_eos)
{
    gang_jgram_vocab_free(s->gv);
    s->gv = gv;
    s->n_eos = n_eos < GANG_MAX_EOS ? n_eos : GANG_MAX_EOS;
    memcpy(s->eos, eos, (size_t)s->n_eos * sizeof(*eos));
}

int gang__sampler_grammar(gang__sampler *s, uint32_t n_slots, uint32_t slot, const char *text,
                          uint32_t len)
{
    char err[256];
    if (s->slot_g == NULL) {
        s->slot_g = calloc(n_slots, sizeof(*s->slot_g));
        s->allowed = malloc(s->vocab);
        if (s->slot_g == NULL || s->allowed == NULL) {
            free(s->slot_g);
            free(s->allowed);
            s->slot_g = NULL;
            s->allowed = NULL;
            return GANG_ENOMEM;
        }
        s->n_slots = n_slots;
    }
    if (slot >= s->n_slots)
        return GANG_EINVAL;
    gang__sampler_vocab_wait(s); /* the first grammar waits for the tokens' table */
    gang_jgram_free(s->slot_g[slot]);
    s->slot_g[slot] = NULL;
    int rc = gang_jgram_compile(text, len, &s->slot_g[slot], err, sizeof(err));
    if (rc == GANG_ENOMEM)
        return rc;
    if (rc != 0)
        gang_warn("sampling: the grammar of slot %u does not compile here (%s): unconstrained",
                  slot, err);
    else if (s->gv == NULL)
        gang_warn("sampling: slot %u has a grammar but this rank has no tokenizer: "
                  "unconstrained",
                  slot);
    return 0;
}

/* The splitmix64 finaliser: a bijective mix of 64 bits. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double gang__sample_uniform(uint64_t seed, uint64_t position)
{
    uint64_t z = mix64(seed + 0x9e3779b97f4a7c15ull);

    z = mix64(z ^ (position * 0xd1b54a32d192ed03ull + 0x632be59bd9b4e019ull));
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/*
 * Greedy: the largest logit, lowest index on ties, NaN ignored; 0 for an all-NaN row. Two
 * passes: the largest non-NaN value m, then the first index holding a value equal to m;
 * the same index as one pass keeping the first strict maximum (+0 and -0 compare equal
 * both ways). With SSE2 (x86-64) each pass runs 16 logits a step, the first in four
 * independent maxima (maxps(x, m) keeps m where x is NaN, as "x > m ? x : m" does), the
 * second by compare masks: about 4x the one-pass loop on a 262,144-word row, and a
 * batch-32 step of such a vocabulary samples 8 M logits on the host.
 */
static int32_t sample_argmax(const float *x, uint32_t n)
{
    float m = -INFINITY;
    uint32_t i = 0;

#if defined(__SSE2__)
    __m128 v[4];
    float lanes[16];
    for (int l = 0; l < 4; l++)
        v[l] = _mm_set1_ps(-INFINITY);
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 4; l++)
            v[l] = _mm_max_ps(_mm_loadu_ps(x + i + 4 * l), v[l]);
    for (int l = 0; l < 4; l++)
        _mm_storeu_ps(lanes + 4 * l, v[l]);
    for (int l = 0; l < 16; l++)
        m = lanes[l] > m ? lanes[l] : m;
#endif
    for (; i < n; i++)
        m = x[i] > m ? x[i] : m;
    i = 0;
#if defined(__SSE2__)
    const __m128 mv = _mm_set1_ps(m);
    for (; i + 16 <= n; i += 16) {
        int hit = 0;
        for (int l = 0; l < 4; l++)
            hit |= _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + i + 4 * l), mv)) << (4 * l);
        if (hit != 0)
            return (int32_t)(i + (uint32_t)__builtin_ctz((unsigned)hit));
    }
#endif
    for (; i < n; i++)
        if (x[i] == m)
            return (int32_t)i;
    return 0; /* every value NaN */
}

/* Logit descending, then id ascending: a total order, so qsort's instability is moot. */
static int cand_cmp(const void *a, const void *b)
{
    const gang__cand *x = a, *y = b;

    if (x->logit > y->logit)
        return -1;
    if (x->logit < y->logit)
        return 1;
    return x->id < y->id ? -1 : (x->id > y->id ? 1 : 0);
}

int32_t gang__sample(gang__sampler *s, const float *logits, const gang_sampling *sp,
                     uint64_t position)
{
    uint32_t i, n = 0, keep;
    double sum = 0.0, cum, target, inv_t;

    if (!(sp->temperature > 0.0f) || sp->top_k == 1)
        return sample_argmax(logits, s->vocab);
    for (i = 0; i < s->vocab; i++) {
        if (isnan(logits[i]))
            continue;
        s->cand[n].logit = logits[i];
        s->cand[n].id = (int32_t)i;
        n++;
    }
    if (n == 0)
        return 0;
    qsort(s->cand, n, sizeof(*s->cand), cand_cmp);
    if (sp->top_k > 0 && sp->top_k < n)
        n = sp->top_k;
    if (isinf(s->cand[0].logit))
        return s->cand[0].id; /* an infinite logit takes all the mass */

    inv_t = 1.0 / (double)sp->temperature;
    for (i = 0; i < n; i++) {
        s->prob[i] = exp(((double)s->cand[i].logit - (double)s->cand[0].logit) * inv_t);
        sum += s->prob[i];
    }
    /* top-p: the shortest prefix whose mass reaches p of the total (at least one). */
    keep = n;
    if (sp->top_p > 0.0f && sp->top_p < 1.0f) {
        cum = 0.0;
        for (i = 0; i < n; i++) {
            cum += s->prob[i];
            if (cum >= (double)sp->top_p * sum) {
                keep = i + 1;
                break;
            }
        }
        sum = 0.0;
        for (i = 0; i < keep; i++)
            sum += s->prob[i];
    }
    target = gang__sample_uniform(sp->seed, position) * sum;
    cum = 0.0;
    for (i = 0; i < keep; i++) {
        cum += s->prob[i];
        if (target < cum)
            return s->cand[i].id;
    }
    return s->cand[keep - 1].id;
}

/*
 * The penalties, in vLLM's order: repetition over the prompt and the output (each distinct
 * id once; count[] marks the ids seen and is cleared again), then frequency and presence
 * over the output (count[] counts, and is cleared as each id is penalised).
 */
static void sample_penalise(gang__sampler *s, const gang_sampling *sp, const gang__history *h)
{
    float rp = sp->repetition_penalty;
    uint32_t i, t;

    if (rp > 0.0f && rp != 1.0f) {
        for (i = 0; i < h->n; i++) {
            t = (uint32_t)h->ids[i];
            if (s->count[t] != 0)
                continue;
            s->count[t] = 1;
            s->adj[t] = s->adj[t] > 0.0f ? s->adj[t] / rp : s->adj[t] * rp;
        }
        for (i = 0; i < h->n; i++)
            s->count[(uint32_t)h->ids[i]] = 0;
    }
    if (sp->frequency_penalty == 0.0f && sp->presence_penalty == 0.0f)
        return;
    for (i = h->n_prompt; i < h->n; i++)
        s->count[(uint32_t)h->ids[i]]++;
    for (i = h->n_prompt; i < h->n; i++) {
        t = (uint32_t)h->ids[i];
        if (s->count[t] == 0)
            continue;
        s->adj[t] -= sp->frequency_penalty * (float)s->count[t] + sp->presence_penalty;
        s->count[t] = 0;
    }
}

/* Adds sp's logit bias to adj (a bias at or below GANG_LOGIT_BIAS_BAN removes the id). */
static void sample_bias(gang__sampler *s, const gang_sampling *sp)
{
    for (uint32_t i = 0; i < sp->n_bias && i < GANG_MAX_LOGIT_BIAS; i++) {
        if (sp->bias_ids[i] < 0 || (uint32_t)sp->bias_ids[i] >= s->vocab)
            continue;
        float *x = &s->adj[sp->bias_ids[i]];
        *x = sp->bias[i] <= GANG_LOGIT_BIAS_BAN ? -INFINITY : *x + sp->bias[i];
    }
}

/*
 * The grammar's mask over adj: what it refuses goes to -inf; the EOS ids keep their
 * logit only when the output is a whole value. An output the grammar refuses (it cannot
 * happen unless the grammar changed under a request) or a mask with nothing left lets
 * only the EOS ids through, so the request ends instead of running on unconstrained.
 */
static void sample_grammar(gang__sampler *s, const gang__history *h)
{
    const gang_jgram *g = s->slot_g != NULL && h->slot < s->n_slots ? s->slot_g[h->slot] : NULL;
    float keep[GANG_MAX_EOS];
    int end = 0;
    if (g == NULL || s->gv == NULL)
        return;
    for (uint32_t i = 0; i < s->n_eos; i++)
        keep[i] = (uint32_t)s->eos[i] < s->vocab ? s->adj[s->eos[i]] : 0.0f;
    int n = gang_jgram_mask(g, s->gv, h->ids + h->n_prompt, h->n - h->n_prompt, s->allowed,
                            s->vocab, &end);
    if (n < 0)
        memset(s->allowed, 0, s->vocab);
    for (uint32_t i = 0; i < s->vocab; i++)
        if (!s->allowed[i])
            s->adj[i] = -INFINITY;
    if (end || n <= 0)
        for (uint32_t i = 0; i < s->n_eos; i++)
            if ((uint32_t)s->eos[i] < s->vocab)
                s->adj[s->eos[i]] = isfinite(keep[i]) ? keep[i] : 0.0f;
}

int32_t gang__sample_seq(gang__sampler *s, const float *logits, const gang_sampling *sp,
                         const gang__history *h)
{
    int rep = sp->repetition_penalty > 0.0f && sp->repetition_penalty != 1.0f;

    if (!rep && sp->frequency_penalty == 0.0f && sp->presence_penalty == 0.0f && sp->n_bias == 0 &&
        sp->grammar_bytes == 0)
        return gang__sample(s, logits, sp, h->n);
    memcpy(s->adj, logits, (size_t)s->vocab * sizeof(float));
    sample_penalise(s, sp, h);
    sample_bias(s, sp);
    if (sp->grammar_bytes > 0)
        sample_grammar(s, h);
    return gang__sample(s, s->adj, sp, h->n);
}

/* Whether (a, ia) ranks before (b, ib): larger value, then lower id. */
static int lp_before(float a, int32_t ia, float b, int32_t ib)
{
    return a > b || (a == b && ia < ib);
}

void gang__logprobs(const gang__sampler *s, const float *logits, int32_t token, uint32_t n_top,
                    gang__result *r)
{
    double mx = -INFINITY, sum = 0.0, lse;
    uint32_t i, j, n = 0;

    if (n_top > GANG_MAX_TOP_LOGPROBS)
        n_top = GANG_MAX_TOP_LOGPROBS;
    for (i = 0; i < s->vocab; i++)
        if (!isnan(logits[i]) && logits[i] > mx)
            mx = logits[i];
    for (i = 0; i < s->vocab && isfinite(mx); i++)
        if (!isnan(logits[i]))
            sum += exp((double)logits[i] - mx);
    lse = isfinite(mx) ? mx + log(sum) : mx;
    /* The n_top best by insertion into a sorted prefix: O(vocab x n_top) at worst. */
    for (i = 0; i < s->vocab && n_top > 0; i++) {
        if (isnan(logits[i]) ||
            (n == n_top && !lp_before(logits[i], (int32_t)i, r->top_lp[n - 1], r->top_ids[n - 1])))
            continue;
        j = n < n_top ? n++ : n - 1;
        for (; j > 0 && lp_before(logits[i], (int32_t)i, r->top_lp[j - 1], r->top_ids[j - 1]);
             j--) {
            r->top_lp[j] = r->top_lp[j - 1];
            r->top_ids[j] = r->top_ids[j - 1];
        }
        r->top_lp[j] = logits[i];
        r->top_ids[j] = (int32_t)i;
    }
    for (j = 0; j < n; j++)
        r->top_lp[j] = (float)((double)r->top_lp[j] - lse);
    r->n_top = n;
    r->token = token;
    r->logprob = token >= 0 && (uint32_t)token < s->vocab && !isnan(logits[token])
                     ? (float)((double)logits[token] - lse)
                     : -INFINITY;
}

int gang__penalties_ok(const gang_sampling *sp)
{
    for (uint32_t i = 0; i < sp->n_bias && i < GANG_MAX_LOGIT_BIAS; i++)
        if (!(sp->bias[i] >= -100.0f && sp->bias[i] <= 100.0f))
            return 0;
    return sp->presence_penalty >= -2.0f && sp->presence_penalty <= 2.0f &&
           sp->frequency_penalty >= -2.0f && sp->frequency_penalty <= 2.0f &&
           sp->repetition_penalty >= 0.0f && isfinite(sp->repetition_penalty) &&
           sp->n_bias <= GANG_MAX_LOGIT_BIAS;
}
