/*
 * Mixture-of-experts layers on a TP group (include/ganglion/parallel.h, "Mixture-of-experts
 * layers"; issue #25): the router, the routed experts with their rows grouped by expert
 * (one GEMM per active expert for each of gate, up and down), the shared expert, and the
 * expert-parallel exchange through gang_moe_dispatch / gang_moe_combine.
 *
 * Why the output is a partial sum: every rank of the TP group ends the block with its share
 * (its columns of every expert with ep 1, or its run of tokens with ep = tp, plus its
 * columns of the shared expert on every token) and one all-reduce sums them. That keeps the
 * residual stream identical on every rank, so the attention of the next layer (TP by heads)
 * runs unchanged, and it costs the same all-reduce a dense MLP pays.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/parallel.h"
#include "tp-moe.h"

/* gang_tp_moe_timing_*: the token count timed (0: none) and the sums. */
static _Atomic uint32_t moe_time_tokens;
static _Atomic uint64_t moe_time_calls, moe_time_block_ns, moe_time_a2a_ns;

void gang_tp_moe_timing_reset(uint32_t tokens)
{
    atomic_store(&moe_time_tokens, 0);
    atomic_store(&moe_time_calls, 0);
    atomic_store(&moe_time_block_ns, 0);
    atomic_store(&moe_time_a2a_ns, 0);
    atomic_store(&moe_time_tokens, tokens);
}

void gang__tp_moe_timed(size_t tokens, uint64_t block_ns, uint64_t a2a_ns)
{
    if (tokens != atomic_load(&moe_time_tokens))
        return;
    atomic_fetch_add(&moe_time_calls, 1);
    atomic_fetch_add(&moe_time_block_ns, block_ns);
    atomic_fetch_add(&moe_time_a2a_ns, a2a_ns);
}

void gang_tp_moe_timing_get(gang_moe_timing *out)
{
    out->calls = atomic_load(&moe_time_calls);
    out->block_ns = atomic_load(&moe_time_block_ns);
    out->a2a_ns = atomic_load(&moe_time_a2a_ns);
}

static void moe_scratch_free(gang_tp_moe_scratch *s)
{
    if (s == NULL)
        return;
    free(s->logits);
    free(s->expert);
    free(s->weight);
    gang_moe_plan_free(&s->plan);
    free(s->xc.send);
    free(s->xc.recv);
    free(s->xc.cnt_out);
    free(s->xc.cnt_in);
    free(s->xc.a2a);
    free(s->rows_in);
    free(s->rows_out);
    free(s->gate);
    free(s->up);
    free(s->sh_scale);
    free(s->run_first);
    free(s);
}

/*
 * The scratch of m for a call of `tokens` tokens: kept when it is large enough, else made
 * again for twice the tokens (so a serving loop reaches its size in a few steps and then
 * allocates nothing). The plan covers a run of ceil(tokens / ep) tokens sized by the cap.
 */
int gang__tp_moe_scratch(gang_tp_moe *m, size_t tokens, gang_tp_moe_scratch **out)
{
    gang_tp_moe_scratch *s = m->scr;
    size_t cap, rows, h = m->hidden, wide;
    int rc;

    if (s != NULL && s->cap_tokens >= tokens) {
        *out = s;
        return 0;
    }
    moe_scratch_free(s);
    m->scr = NULL;
    cap = tokens < 16 ? 16 : 2 * tokens;
    if (cap > SIZE_MAX / (GANG_MOE_MAX_TOPK * (size_t)m->ep * h * sizeof(float)))
        return GANG_EINVAL;
    rows = cap * m->top_k * m->ep;
    wide = m->ffn_count > m->sh_count ? m->ffn_count : m->sh_count;
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return GANG_ENOMEM;
    s->cap_tokens = cap;
    s->logits = malloc(cap * m->n_experts * sizeof(float));
    s->expert = malloc(cap * m->top_k * sizeof(int32_t));
    s->weight = malloc(cap * m->top_k * sizeof(float));
    s->xc.width = h;
    s->xc.send = malloc(rows * h * sizeof(float));
    s->xc.recv = malloc(rows * h * sizeof(float));
    s->xc.recv_cap_rows = rows;
    s->xc.cnt_out = calloc(m->n_experts, sizeof(size_t));
    s->xc.cnt_in = calloc(m->n_experts, sizeof(size_t));
    s->xc.a2a = calloc(4 * (size_t)m->ep, sizeof(size_t));
    s->rows_in = malloc(rows * h * sizeof(float));
    s->rows_out = malloc(rows * h * sizeof(float));
    s->gate = malloc(rows * (wide ? wide : 1) * sizeof(float));
    s->up = malloc(rows * (wide ? wide : 1) * sizeof(float));
    s->sh_scale = malloc(cap * sizeof(float));
    s->run_first = calloc((size_t)m->ep * m->expert_count, sizeof(size_t));
    rc = gang_moe_plan_init(&s->plan, m->n_experts, m->top_k, m->ep, m->ep_rank, cap);
    if (rc == 0 &&
        (s->logits == NULL || s->expert == NULL || s->weight == NULL || s->xc.send == NULL ||
         s->xc.recv == NULL || s->xc.cnt_out == NULL || s->xc.cnt_in == NULL || s->xc.a2a == NULL ||
         s->rows_in == NULL || s->rows_out == NULL || s->gate == NULL || s->up == NULL ||
         s->sh_scale == NULL || s->run_first == NULL))
        rc = GANG_ENOMEM;
    if (rc != 0) {
        moe_scratch_free(s);
        return rc;
    }
    m->scr = *out = s;
    return 0;
}

int gang_tp_moe_init(gang_tp_moe **out, uint32_t n_experts, uint32_t top_k, int norm_topk,
                     uint32_t hidden, uint32_t moe_ffn, uint32_t sh_ffn, uint32_t tp,
                     uint32_t tp_rank, uint32_t ep)
{
    gang_tp_moe *m;
    size_t per, h = hidden;

    if (out == NULL)
        return GANG_EINVAL;
    *out = NULL;
    if (n_experts == 0 || n_experts > GANG_MOE_MAX_EXPERTS || top_k == 0 || top_k > n_experts ||
        top_k > GANG_MOE_MAX_TOPK || hidden == 0 || moe_ffn == 0 || tp == 0 || tp_rank >= tp ||
        (ep != 1 && ep != tp) || n_experts % ep != 0 || (ep == 1 && moe_ffn % tp != 0) ||
        sh_ffn % tp != 0)
        return GANG_EINVAL;
    m = calloc(1, sizeof(*m));
    if (m == NULL)
        return GANG_ENOMEM;
    m->n_experts = n_experts;
    m->top_k = top_k;
    m->norm_topk = norm_topk != 0;
    m->ep = ep;
    m->ep_rank = ep == 1 ? 0 : tp_rank;
    m->tp = tp;
    m->tp_rank = tp_rank;
    m->hidden = hidden;
    m->moe_ffn = moe_ffn;
    m->expert_count = n_experts / ep;
    m->expert_first = m->ep_rank * m->expert_count;
    m->ffn_count = ep == 1 ? moe_ffn / tp : moe_ffn;
    m->ffn_first = ep == 1 ? tp_rank * m->ffn_count : 0;
    m->sh_ffn = sh_ffn;
    m->sh_count = sh_ffn / tp;
    m->sh_first = tp_rank * m->sh_count;
    per = (size_t)m->expert_count * m->ffn_count * h;
    m->router = calloc((size_t)n_experts * h, sizeof(float));
    m->w_gate = calloc(per, sizeof(float));
    m->w_up = calloc(per, sizeof(float));
    m->w_down = calloc(per, sizeof(float));
    m->load.expert_slots = calloc(n_experts, sizeof(uint64_t));
    m->load.rank_slots = calloc(ep, sizeof(uint64_t));
    if (sh_ffn > 0) {
        m->sh_gate = calloc((size_t)m->sh_count * h, sizeof(float));
        m->sh_up = calloc((size_t)m->sh_count * h, sizeof(float));
        m->sh_down = calloc((size_t)m->sh_count * h, sizeof(float));
        m->sh_gate_w = calloc(h, sizeof(float));
    }
    if (m->router == NULL || m->w_gate == NULL || m->w_up == NULL || m->w_down == NULL ||
        m->load.expert_slots == NULL || m->load.rank_slots == NULL ||
        (sh_ffn > 0 &&
         (m->sh_gate == NULL || m->sh_up == NULL || m->sh_down == NULL || m->sh_gate_w == NULL))) {
        gang_tp_moe_free(m);
        return GANG_ENOMEM;
    }
    *out = m;
    return 0;
}

void gang_tp_moe_free(gang_tp_moe *m)
{
    if (m == NULL)
        return;
    gang__tp_moe_dev_free(m); /* the device arrays and buffers, back to m->mem */
    free(m->router);
    free(m->w_gate);
    free(m->w_up);
    free(m->w_down);
    free(m->sh_gate);
    free(m->sh_up);
    free(m->sh_down);
    free(m->sh_gate_w);
    free(m->load.expert_slots);
    free(m->load.rank_slots);
    moe_scratch_free(m->scr);
    free(m);
}

size_t gang_tp_moe_weight_bytes(const gang_tp_moe *m)
{
    size_t h, n;

    if (m == NULL)
        return 0;
    h = m->hidden;
    n = (size_t)m->n_experts * h + 3 * (size_t)m->expert_count * m->ffn_count * h;
    if (m->sh_ffn > 0)
        n += 3 * (size_t)m->sh_count * h + h;
    return n * sizeof(float);
}

/* One SwiGLU expert shard on n rows: out [n, hidden] = (silu(in Wg^T) * (in Wu^T)) Wd^T. */
int gang__tp_moe_swiglu(gang_kernels *k, const float *in, size_t n, size_t hidden, const float *wg,
                        const float *wu, const float *wd, size_t ffn, float *gate, float *up,
                        float *out)
{
    int rc = gang_kernels_gemm(k, 1, n, ffn, hidden, 1.0f, in, wg, 0.0f, gate);

    if (rc == 0)
        rc = gang_kernels_gemm(k, 1, n, ffn, hidden, 1.0f, in, wu, 0.0f, up);
    if (rc == 0)
        rc = gang_kernels_silu_mul(k, gate, up, n * ffn, gate);
    if (rc == 0)
        rc = gang_kernels_gemm(k, 1, n, hidden, ffn, 1.0f, gate, wd, 0.0f, out);
    return rc;
}

/*
 * The routed experts on the rows dispatch left in buf (ep sources, each with its rows
 * grouped by local expert as cnt[src * expert_count + i] says): per local expert, its rows
 * of every source gathered into one block, one GEMM each for gate, up and down, and the
 * outputs written back over the inputs, in place.
 */
static int moe_experts(gang_tp_moe *m, gang_kernels *k, gang_tp_moe_scratch *s, float *buf,
                       const size_t *cnt, uint32_t sources)
{
    size_t h = m->hidden, f = m->ffn_count, at = 0, wsz = f * h;
    uint32_t per = m->expert_count;

    for (uint32_t src = 0; src < sources; src++)
        for (uint32_t i = 0; i < per; i++) {
            s->run_first[src * per + i] = at;
            at += cnt[src * per + i];
        }
    for (uint32_t i = 0; i < per; i++) {
        size_t n = 0;
        int rc;

        for (uint32_t src = 0; src < sources; src++) {
            size_t c = cnt[src * per + i];

            memcpy(s->rows_in + n * h, buf + s->run_first[src * per + i] * h,
                   c * h * sizeof(float));
            n += c;
        }
        if (n == 0) /* an idle expert costs nothing */
            continue;
        rc = gang__tp_moe_swiglu(k, s->rows_in, n, h, m->w_gate + i * wsz, m->w_up + i * wsz,
                                 m->w_down + i * wsz, f, s->gate, s->up, s->rows_out);
        if (rc != 0)
            return rc;
        n = 0;
        for (uint32_t src = 0; src < sources; src++) {
            size_t c = cnt[src * per + i];

            memcpy(buf + s->run_first[src * per + i] * h, s->rows_out + n * h,
                   c * h * sizeof(float));
            n += c;
        }
    }
    return 0;
}

/* The shared expert's columns on every token, scaled by its sigmoid gate, added to y. */
static int moe_shared(gang_tp_moe *m, gang_kernels *k, gang_tp_moe_scratch *s, const float *x,
                      size_t tokens, float *y)
{
    size_t h = m->hidden;
    int rc;

    if (m->sh_ffn == 0 || tokens == 0)
        return 0;
    rc = gang__tp_moe_swiglu(k, x, tokens, h, m->sh_gate, m->sh_up, m->sh_down, m->sh_count,
                             s->gate, s->up, s->rows_out);
    if (rc != 0)
        return rc;
    for (size_t t = 0; t < tokens; t++) {
        double dot = 0.0;
        float g;

        for (size_t d = 0; d < h; d++)
            dot += (double)x[t * h + d] * m->sh_gate_w[d];
        g = 1.0f / (1.0f + expf(-(float)dot));
        for (size_t d = 0; d < h; d++)
            y[t * h + d] += g * s->rows_out[t * h + d];
    }
    return 0;
}

/* The load counters of one step from the plan of this rank's run. */
void gang__tp_moe_count(gang_tp_moe *m, const gang_moe_plan *p)
{
    uint64_t mx = 0;
    double mean = (double)p->slots / m->n_experts;

    m->load.steps++;
    m->load.slots += p->slots;
    for (uint32_t e = 0; e < m->n_experts; e++) {
        m->load.expert_slots[e] += p->send_expert[e];
        mx = p->send_expert[e] > mx ? p->send_expert[e] : mx;
    }
    for (uint32_t r = 0; r < m->ep; r++)
        m->load.rank_slots[r] += p->send_rows[r];
    m->load.last_max_over_mean = mean > 0.0 ? (double)mx / mean : 1.0;
    m->load.max_over_mean_sum += m->load.last_max_over_mean;
}

/* Adds weight x row for every slot of the plan (rows in plan order) into y's token rows. */
void gang__tp_moe_accumulate(const gang_moe_plan *p, const float *weight, const float *rows,
                             size_t h, float *y)
{
    for (size_t i = 0; i < p->slots; i++) {
        uint32_t slot = p->order[i];
        float w = weight[slot], *dst = y + (size_t)(slot / p->top_k) * h;
        const float *src = rows + i * h;

        for (size_t d = 0; d < h; d++)
            dst[d] += w * src[d];
    }
}

/*
 * The routed experts on this rank's run [first, first + n) of x, into y's rows of that
 * run: route, plan, then either the local path (ep 1: the rows gathered in plan order are
 * already grouped by expert) or dispatch, experts, combine over comm.
 */
static int moe_routed(gang_tp_moe *m, gang_kernels *k, gang_comm *comm, gang_tp_moe_scratch *s,
                      const float *x, size_t first, size_t n, float *y, uint64_t deadline,
                      uint64_t *a2a_ns)
{
    gang_moe_route_cfg rc_cfg = {m->n_experts, m->top_k, m->norm_topk};
    size_t h = m->hidden;
    const float *xr = x + first * h;
    uint64_t left, t0;
    int rc = 0;

    if (n > 0) {
        rc = gang_kernels_gemm(k, 1, n, m->n_experts, h, 1.0f, xr, m->router, 0.0f, s->logits);
        if (rc == 0)
            rc = gang_moe_route(&rc_cfg, s->logits, n, s->expert, s->weight);
    }
    if (rc == 0)
        rc = gang_moe_plan_build(&s->plan, s->expert, n);
    if (rc != 0)
        return rc;
    gang__tp_moe_count(m, &s->plan);
    if (m->ep == 1) {
        for (size_t i = 0; i < s->plan.slots; i++)
            memcpy(s->xc.send + i * h, xr + (size_t)(s->plan.order[i] / m->top_k) * h,
                   h * sizeof(float));
        rc = moe_experts(m, k, s, s->xc.send, s->plan.send_expert, 1);
        if (rc == 0)
            gang__tp_moe_accumulate(&s->plan, s->weight, s->xc.send, h, y + first * h);
        return rc;
    }
    t0 = gang_now_ns();
    rc = gang_deadline_left(deadline, &left);
    if (rc == 0)
        rc = gang_moe_dispatch(comm, &s->plan, xr, &s->xc, left);
    *a2a_ns += gang_now_ns() - t0;
    if (rc == 0)
        rc = moe_experts(m, k, s, s->xc.recv, s->xc.cnt_in, m->ep);
    if (rc == 0)
        rc = gang_deadline_left(deadline, &left);
    t0 = gang_now_ns();
    if (rc == 0)
        rc = gang_moe_combine(comm, &s->plan, s->weight, &s->xc, y + first * h, left);
    *a2a_ns += gang_now_ns() - t0;
    return rc;
}

int gang_tp_moe_forward(gang_tp_moe *m, gang_kernels *k, gang_comm *comm, const float *x,
                        size_t tokens, float *y, uint64_t timeout_ms)
{
    gang_tp_moe_scratch *s;
    size_t first = 0, n = tokens, base, extra;
    uint64_t deadline, left = 0, t0 = gang_now_ns(), a2a_ns = 0;
    int rc;

    if (m == NULL || k == NULL || x == NULL || y == NULL || timeout_ms == 0)
        return GANG_EINVAL;
    if (gang_kernels_caps(k) & GANG_KERNELS_CAP_DEVICE_MEM)
        return m->mem == k ? gang__tp_moe_forward_dev(m, k, comm, x, tokens, y, timeout_ms)
                           : GANG_EINVAL;
    if (m->mem != NULL)
        return GANG_EINVAL;
    if (comm == NULL ? m->tp != 1
                     : gang_comm_size(comm) != m->tp || gang_comm_rank(comm) != m->tp_rank)
        return GANG_EINVAL;
    deadline = gang_deadline_after(timeout_ms);
    rc = gang__tp_moe_scratch(m, tokens, &s);
    if (rc != 0)
        return rc;
    memset(y, 0, tokens * m->hidden * sizeof(float));
    if (m->ep > 1) { /* this rank's run of the tokens: the uneven split of the pipeline */
        base = tokens / m->ep;
        extra = tokens % m->ep;
        first = m->ep_rank * base + (m->ep_rank < extra ? m->ep_rank : extra);
        n = base + (m->ep_rank < extra ? 1 : 0);
    }
    rc = moe_routed(m, k, comm, s, x, first, n, y, deadline, &a2a_ns);
    if (rc == 0)
        rc = moe_shared(m, k, s, x, tokens, y);
    if (rc == 0 && comm != NULL && m->tp > 1)
        rc = gang_deadline_left(deadline, &left);
    if (rc == 0 && comm != NULL && m->tp > 1)
        rc = gang_comm_all_reduce(comm, y, tokens * m->hidden, GANG_DTYPE_F32, left);
    if (rc == 0)
        gang__tp_moe_timed(tokens, gang_now_ns() - t0, a2a_ns);
    return rc;
}
