/*
 * Mixture of experts: the routing rule of the families and the two all-to-alls of expert
 * parallelism (include/ganglion/parallel.h, "Mixture of experts"; issue #25).
 *
 * Routing is done in f32 on the host, as the references do (transformers computes the
 * router's softmax in float32 whatever the model's dtype). The dispatch plan is a counting
 * sort of the step's slots by expert: experts are split over the ranks in contiguous runs,
 * so sorting by expert also sorts by destination rank, and each rank receives its rows
 * already grouped by expert per source.
 */
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ganglion/parallel.h"
#include "tp-moe.h"

/*
 * A fault for the tests (tests/mp/test_moe_kill.py), off unless the environment asks:
 * GANGLION_FAULT_MOE_A2A=PATH:RANK:N kills this process (SIGKILL, as a crash would) inside
 * its N-th dispatch as EP rank RANK, between the counts' all-to-all and the rows', the first
 * time only: the process that fires creates PATH (O_EXCL), and a PATH that exists disarms
 * it, so the respawned rank of the next generation serves. Any thread; the counter is only
 * approximate under concurrent dispatches in one process, which the tests do not do. The
 * device path's dispatch (tp-moe-dev.c) has the same point, between the same two exchanges.
 */
void gang__moe_fault_point(uint32_t rank)
{
    static unsigned long calls;
    const char *v = getenv("GANGLION_FAULT_MOE_A2A");
    char path[512];
    unsigned r = 0;
    unsigned long n = 0;
    const char *c1, *c2;
    int fd;

    if (v == NULL || (c2 = strrchr(v, ':')) == NULL || c2 == v)
        return;
    for (c1 = c2 - 1; c1 > v && *c1 != ':'; c1--)
        ;
    if (*c1 != ':' || (size_t)(c1 - v) >= sizeof(path) || sscanf(c1 + 1, "%u", &r) != 1 ||
        sscanf(c2 + 1, "%lu", &n) != 1 || r != rank || ++calls != n)
        return;
    memcpy(path, v, (size_t)(c1 - v));
    path[c1 - v] = '\0';
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return;
    close(fd);
    raise(SIGKILL);
}

int gang_moe_route(const gang_moe_route_cfg *cfg, const float *logits, size_t tokens,
                   int32_t *expert, float *weight)
{
    uint32_t n, k;

    if (cfg == NULL || (tokens > 0 && (logits == NULL || expert == NULL || weight == NULL)))
        return GANG_EINVAL;
    n = cfg->n_experts;
    k = cfg->top_k;
    if (n == 0 || n > GANG_MOE_MAX_EXPERTS || k == 0 || k > n || k > GANG_MOE_MAX_TOPK)
        return GANG_EINVAL;
    for (size_t t = 0; t < tokens; t++) {
        const float *z = logits + t * n;
        int32_t *id = expert + t * k;
        float *w = weight + t * k, mx = -INFINITY, sum = 0.0f, top = 0.0f;

        for (uint32_t e = 0; e < n; e++) {
            if (isnan(z[e]))
                return GANG_EINVAL;
            mx = z[e] > mx ? z[e] : mx;
        }
        for (uint32_t e = 0; e < n; e++)
            sum += expf(z[e] - mx);
        /* Selection of the k largest by repeated scans: k <= 16, and the strict '>' keeps
         * the lower id first among equal values. */
        for (uint32_t j = 0; j < k; j++) {
            int32_t best = -1;

            for (uint32_t e = 0; e < n; e++) {
                int taken = 0;

                for (uint32_t i = 0; i < j && !taken; i++)
                    taken = id[i] == (int32_t)e;
                if (!taken && (best < 0 || z[e] > z[best]))
                    best = (int32_t)e;
            }
            id[j] = best;
            w[j] = expf(z[best] - mx) / sum;
            top += w[j];
        }
        if (cfg->norm_topk && top > 0.0f)
            for (uint32_t j = 0; j < k; j++)
                w[j] /= top;
    }
    return 0;
}

uint32_t gang_moe_expert_rank(const gang_moe_plan *p, uint32_t e)
{
    return e / (p->n_experts / p->ep);
}

int gang_moe_plan_init(gang_moe_plan *p, uint32_t n_experts, uint32_t top_k, uint32_t ep,
                       uint32_t rank, size_t max_tokens)
{
    memset(p, 0, sizeof(*p));
    if (n_experts == 0 || n_experts > GANG_MOE_MAX_EXPERTS || top_k == 0 || top_k > n_experts ||
        top_k > GANG_MOE_MAX_TOPK || ep == 0 || n_experts % ep != 0 || rank >= ep ||
        max_tokens == 0 || max_tokens > SIZE_MAX / top_k / sizeof(uint32_t))
        return GANG_EINVAL;
    p->n_experts = n_experts;
    p->top_k = top_k;
    p->ep = ep;
    p->rank = rank;
    p->max_slots = max_tokens * top_k;
    p->order = calloc(p->max_slots, sizeof(*p->order));
    p->send_rows = calloc(ep, sizeof(*p->send_rows));
    p->send_expert = calloc(n_experts, sizeof(*p->send_expert));
    p->cursor = calloc(n_experts, sizeof(*p->cursor));
    if (p->order == NULL || p->send_rows == NULL || p->send_expert == NULL || p->cursor == NULL) {
        gang_moe_plan_free(p);
        return GANG_ENOMEM;
    }
    return 0;
}

void gang_moe_plan_free(gang_moe_plan *p)
{
    if (p == NULL)
        return;
    free(p->order);
    free(p->send_rows);
    free(p->send_expert);
    free(p->cursor);
    memset(p, 0, sizeof(*p));
}

int gang_moe_plan_build(gang_moe_plan *p, const int32_t *expert, size_t tokens)
{
    size_t slots, run = 0;

    if (tokens > p->max_slots / p->top_k)
        return GANG_ERANGE;
    slots = tokens * p->top_k;
    memset(p->send_expert, 0, p->n_experts * sizeof(*p->send_expert));
    memset(p->send_rows, 0, p->ep * sizeof(*p->send_rows));
    for (size_t s = 0; s < slots; s++) {
        if (expert[s] < 0 || (uint32_t)expert[s] >= p->n_experts)
            return GANG_EINVAL;
        p->send_expert[expert[s]]++;
    }
    for (uint32_t e = 0; e < p->n_experts; e++) {
        p->send_rows[gang_moe_expert_rank(p, e)] += p->send_expert[e];
        p->cursor[e] = run;
        run += p->send_expert[e];
    }
    /* Stable: within an expert, slots keep their order (token, then rank of the choice). */
    for (size_t s = 0; s < slots; s++)
        p->order[p->cursor[expert[s]]++] = (uint32_t)s;
    p->slots = slots;
    return 0;
}

/* The all-to-all of rows: send_rows[r] / recv_rows[r] rows of width floats per rank,
 * contiguous per rank in rank order on both sides. */
static int moe_rows_a2a(gang_comm *c, gang_moe_exchange *xc, const float *send,
                        const size_t *send_rows, float *recv, const size_t *recv_rows,
                        size_t send_total, size_t recv_total, uint64_t tmo)
{
    uint32_t n = gang_comm_size(c);
    size_t *v = xc->a2a, row = xc->width * sizeof(float), so = 0, ro = 0;
    gang_comm_a2a a;

    for (uint32_t r = 0; r < n; r++) {
        v[r] = send_rows[r] * row;
        v[n + r] = so;
        so += v[r];
        v[2 * n + r] = recv_rows[r] * row;
        v[3 * n + r] = ro;
        ro += v[2 * n + r];
    }
    a = (gang_comm_a2a){send, send_total * row, v,         v + n,
                        recv, recv_total * row, v + 2 * n, v + 3 * n};
    return gang_comm_all_to_all_v(c, &a, tmo);
}

/* Per-rank row totals of the (rank, local expert) counts cnt[ep * per]. */
static void moe_rank_rows(const size_t *cnt, uint32_t ep, uint32_t per, size_t *rows, size_t *total)
{
    *total = 0;
    for (uint32_t r = 0; r < ep; r++) {
        rows[r] = 0;
        for (uint32_t i = 0; i < per; i++)
            rows[r] += cnt[r * per + i];
        *total += rows[r];
    }
}

int gang_moe_dispatch(gang_comm *c, const gang_moe_plan *p, const float *x, gang_moe_exchange *xc,
                      uint64_t timeout_ms)
{
    uint32_t ep = p->ep, per = p->n_experts / ep;
    size_t in_rows[GANG_MOE_MAX_EXPERTS], total = 0, *cnt_bytes = xc->a2a;
    gang_comm_a2a a;
    int rc;

    if (gang_comm_size(c) != ep || gang_comm_rank(c) != p->rank || ep > GANG_MOE_MAX_EXPERTS)
        return GANG_EINVAL;
    /* The counts: per (destination rank, its local expert), as 8-byte entries. */
    for (uint32_t e = 0; e < p->n_experts; e++)
        xc->cnt_out[e] = p->send_expert[e];
    for (uint32_t r = 0; r < ep; r++) {
        cnt_bytes[r] = cnt_bytes[2 * ep + r] = per * sizeof(size_t);
        cnt_bytes[ep + r] = cnt_bytes[3 * ep + r] = (size_t)r * per * sizeof(size_t);
    }
    a = (gang_comm_a2a){
        xc->cnt_out, p->n_experts * sizeof(size_t), cnt_bytes,          cnt_bytes + ep,
        xc->cnt_in,  p->n_experts * sizeof(size_t), cnt_bytes + 2 * ep, cnt_bytes + 3 * ep};
    rc = gang_comm_all_to_all_v(c, &a, timeout_ms);
    if (rc < 0)
        return rc;
    gang__moe_fault_point(p->rank);
    moe_rank_rows(xc->cnt_in, ep, per, in_rows, &total);
    if (total > xc->recv_cap_rows)
        return GANG_ERANGE;
    /* The rows, in the plan's order (grouped by destination rank, then expert). */
    for (size_t i = 0; i < p->slots; i++)
        memcpy(xc->send + i * xc->width, x + (size_t)(p->order[i] / p->top_k) * xc->width,
               xc->width * sizeof(float));
    rc =
        moe_rows_a2a(c, xc, xc->send, p->send_rows, xc->recv, in_rows, p->slots, total, timeout_ms);
    xc->recv_rows = rc == 0 ? total : 0;
    return rc;
}

int gang_moe_combine(gang_comm *c, const gang_moe_plan *p, const float *weight,
                     gang_moe_exchange *xc, float *y, uint64_t timeout_ms)
{
    uint32_t ep = p->ep, per = p->n_experts / ep;
    size_t in_rows[GANG_MOE_MAX_EXPERTS], total = 0;
    int rc;

    if (gang_comm_size(c) != ep || gang_comm_rank(c) != p->rank)
        return GANG_EINVAL;
    moe_rank_rows(xc->cnt_in, ep, per, in_rows, &total);
    /* Back the way they came: what came from rank r returns to r, into send's slots. */
    rc =
        moe_rows_a2a(c, xc, xc->recv, in_rows, xc->send, p->send_rows, total, p->slots, timeout_ms);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < p->slots; i++) {
        uint32_t s = p->order[i];
        float w = weight[s], *dst = y + (size_t)(s / p->top_k) * xc->width;
        const float *src = xc->send + i * xc->width;

        for (size_t d = 0; d < xc->width; d++)
            dst[d] += w * src[d];
    }
    return 0;
}
