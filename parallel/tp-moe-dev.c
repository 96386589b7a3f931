/*
 * The MoE block on a device kernels handle (include/ganglion/parallel.h, "Mixture-of-experts
 * layers"; issue #25): the weights live in the handle's tensor memory, the router's GEMM,
 * the row gather (gang_kernels_embedding by token index), the experts -- one GEMM per
 * active expert for gate, up and down, a loop of GEMMs on the handle's one stream -- and
 * the shared expert run there. The routing decision needs the router's logits on the host
 * (as the references route in f32 on the host too). The all-to-alls run over the gang's
 * communicator: a host one (socket, mpi) moves host rows; a device-memory one (nccl) moves
 * d's device buffers by grouped send/recv -- the counts first, downloaded to size the rows,
 * then the rows uploaded in plan order, exchanged device to device and downloaded for the
 * regroup by expert (no allocation: d's buffers already hold a call's rows). The weighted
 * combine is done on the host before one upload of the block's output: several host
 * synchronisations per MoE layer, which a device-side gather, regroup and combine would
 * remove (not done yet).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tp-moe.h"

/* The device buffers of one layer's calls, grown like the host scratch. */
typedef struct gang_tp_moe_dev {
    size_t cap;              /* tokens they were sized for */
    float *logits;           /* dev [cap, n_experts] */
    int32_t *ids;            /* dev [cap * top_k]: token of each slot, plan order */
    float *rows, *out;       /* dev [cap * top_k * ep, hidden] */
    float *gate, *up;        /* dev [cap * top_k * ep, max(ffn_count, sh_count)] */
    float *sh_out;           /* dev [cap, hidden] */
    float *sh_g;             /* dev [cap] */
    float *y_host, *x_host;  /* host [cap, hidden] */
    float *sh_host, *g_host; /* host [cap, hidden], [cap] */
    int32_t *ids_host;       /* host [cap * top_k] */
    size_t *run_n;           /* host [expert_count]: rows of each local expert */
    size_t *cnt;             /* dev [2 * n_experts]: the counts sent, then received */
} gang_tp_moe_dev;

static void dev_buffers_free(gang_kernels *k, gang_tp_moe_dev *d)
{
    if (d == NULL)
        return;
    gang_kernels_free(k, d->logits);
    gang_kernels_free(k, d->ids);
    gang_kernels_free(k, d->rows);
    gang_kernels_free(k, d->out);
    gang_kernels_free(k, d->gate);
    gang_kernels_free(k, d->up);
    gang_kernels_free(k, d->sh_out);
    gang_kernels_free(k, d->sh_g);
    gang_kernels_free(k, d->cnt);
    free(d->y_host);
    free(d->x_host);
    free(d->sh_host);
    free(d->g_host);
    free(d->ids_host);
    free(d->run_n);
    free(d);
}

/* m's device buffers for `tokens` tokens: kept, or made again for twice as many. */
static int dev_buffers(gang_tp_moe *m, gang_kernels *k, size_t tokens, gang_tp_moe_dev **out)
{
    gang_tp_moe_dev *d = m->dev;
    size_t cap, rows, h = m->hidden, wide = m->ffn_count > m->sh_count ? m->ffn_count : m->sh_count;
    int rc = 0;

    if (d != NULL && d->cap >= tokens) {
        *out = d;
        return 0;
    }
    dev_buffers_free(k, d);
    m->dev = NULL;
    cap = tokens < 16 ? 16 : 2 * tokens;
    rows = cap * m->top_k * m->ep;
    d = calloc(1, sizeof(*d));
    if (d == NULL)
        return GANG_ENOMEM;
    d->cap = cap;
#define DEV_ALLOC(p, n) (rc == 0 ? (rc = gang_kernels_alloc(k, (n), (void **)&(p))) : rc)
    DEV_ALLOC(d->logits, cap * m->n_experts * sizeof(float));
    DEV_ALLOC(d->ids, cap * m->top_k * sizeof(int32_t));
    DEV_ALLOC(d->rows, rows * h * sizeof(float));
    DEV_ALLOC(d->out, rows * h * sizeof(float));
    DEV_ALLOC(d->gate, rows * (wide ? wide : 1) * sizeof(float));
    DEV_ALLOC(d->up, rows * (wide ? wide : 1) * sizeof(float));
    DEV_ALLOC(d->sh_out, cap * h * sizeof(float));
    DEV_ALLOC(d->sh_g, cap * sizeof(float));
    DEV_ALLOC(d->cnt, 2 * m->n_experts * sizeof(size_t));
#undef DEV_ALLOC
    d->y_host = malloc(cap * h * sizeof(float));
    d->x_host = malloc(cap * h * sizeof(float));
    d->sh_host = malloc(cap * h * sizeof(float));
    d->g_host = malloc(cap * sizeof(float));
    d->ids_host = malloc(cap * m->top_k * sizeof(int32_t));
    d->run_n = calloc(m->expert_count, sizeof(size_t));
    if (rc == 0 && (d->y_host == NULL || d->x_host == NULL || d->sh_host == NULL ||
                    d->g_host == NULL || d->ids_host == NULL || d->run_n == NULL))
        rc = GANG_ENOMEM;
    if (rc != 0) {
        dev_buffers_free(k, d);
        return rc;
    }
    m->dev = *out = d;
    return 0;
}

/* The local experts on d->rows, whose rows are grouped by expert (run_n[i] rows each),
 * into d->out: one GEMM per active expert for each projection, on k's stream. */
static int dev_experts(const gang_tp_moe *m, gang_kernels *k, gang_tp_moe_dev *d)
{
    size_t h = m->hidden, f = m->ffn_count, wsz = f * h, at = 0;

    for (uint32_t i = 0; i < m->expert_count; i++) {
        size_t n = d->run_n[i];
        int rc;

        if (n == 0)
            continue;
        rc = gang__tp_moe_swiglu(k, d->rows + at * h, n, h, m->w_gate + i * wsz, m->w_up + i * wsz,
                                 m->w_down + i * wsz, f, d->gate, d->up, d->out + at * h);
        if (rc != 0)
            return rc;
        at += n;
    }
    return 0;
}

/* All-to-all(v) of device buffers: send_n[r] / recv_n[r] items of `unit` bytes per rank,
 * contiguous per rank in rank order on both sides (sizes and offsets in s->xc.a2a). */
static int dev_a2a(gang_comm *c, gang_tp_moe_scratch *s, const void *send, const size_t *send_n,
                   void *recv, const size_t *recv_n, size_t unit, uint64_t deadline)
{
    uint32_t n = gang_comm_size(c);
    size_t *v = s->xc.a2a, so = 0, ro = 0;
    uint64_t left;
    gang_comm_a2a a;
    int rc = gang_deadline_left(deadline, &left);

    if (rc != 0)
        return rc;
    for (uint32_t r = 0; r < n; r++) {
        v[r] = send_n[r] * unit;
        v[n + r] = so;
        so += v[r];
        v[2 * n + r] = recv_n[r] * unit;
        v[3 * n + r] = ro;
        ro += v[2 * n + r];
    }
    a = (gang_comm_a2a){send, so, v, v + n, recv, ro, v + 2 * n, v + 3 * n};
    return gang_comm_all_to_all_v(c, &a, left);
}

/*
 * Dispatch over a device-memory communicator (nccl): the per-(rank, local expert) counts
 * go first through d->cnt and come back to the host to size the rows' exchange (bounded by
 * d->rows' capacity, checked before use); the run's rows, gathered on the host in plan order,
 * are uploaded to d->out and sent into d->rows, then downloaded into s->xc.recv for the
 * expert-major regroup. No allocation: d's buffers are sized for the call already.
 */
static int dev_dispatch(const gang_tp_moe *m, gang_kernels *k, gang_comm *comm,
                        gang_tp_moe_scratch *s, gang_tp_moe_dev *d, uint64_t deadline)
{
    uint32_t ep = m->ep, per = m->expert_count, ne = m->n_experts;
    size_t each[GANG_MOE_MAX_EXPERTS], in_rows[GANG_MOE_MAX_EXPERTS], total = 0, h = m->hidden;
    size_t cap_rows = d->cap * m->top_k * ep, row = h * sizeof(float);
    int rc;

    if (ep > GANG_MOE_MAX_EXPERTS || gang_comm_size(comm) != ep || ne != ep * per)
        return GANG_EINVAL;
    for (uint32_t e = 0; e < ne; e++)
        s->xc.cnt_out[e] = s->plan.send_expert[e];
    for (uint32_t r = 0; r < ep; r++)
        each[r] = per;
    rc = gang_kernels_upload(k, d->cnt, s->xc.cnt_out, ne * sizeof(size_t));
    if (rc == 0)
        rc = dev_a2a(comm, s, d->cnt, each, d->cnt + ne, each, sizeof(size_t), deadline);
    if (rc == 0)
        rc = gang_kernels_download(k, s->xc.cnt_in, d->cnt + ne, ne * sizeof(size_t));
    if (rc != 0)
        return rc;
    gang__moe_fault_point(s->plan.rank);
    for (uint32_t r = 0; r < ep; r++) { /* peers' counts: bounded before they size anything */
        in_rows[r] = 0;
        for (uint32_t i = 0; i < per; i++) {
            if (s->xc.cnt_in[r * per + i] > cap_rows - total)
                return GANG_ERANGE;
            in_rows[r] += s->xc.cnt_in[r * per + i];
            total += s->xc.cnt_in[r * per + i];
        }
    }
    if (total > s->xc.recv_cap_rows || s->plan.slots > cap_rows)
        return GANG_ERANGE;
    for (size_t i = 0; i < s->plan.slots; i++)
        memcpy(s->xc.send + i * h, d->x_host + (size_t)(s->plan.order[i] / m->top_k) * h, row);
    rc = s->plan.slots > 0 ? gang_kernels_upload(k, d->out, s->xc.send, s->plan.slots * row) : 0;
    if (rc == 0)
        rc = dev_a2a(comm, s, d->out, s->plan.send_rows, d->rows, in_rows, row, deadline);
    if (rc == 0 && total > 0)
        rc = gang_kernels_download(k, s->xc.recv, d->rows, total * row);
    s->xc.recv_rows = rc == 0 ? total : 0;
    return rc;
}

/* Combine over a device-memory communicator: s->xc.recv's outputs uploaded to d->rows, sent
 * back into d->out in the plan's slots, downloaded and weighted into yr on the host. */
static int dev_combine(const gang_tp_moe *m, gang_kernels *k, gang_comm *comm,
                       gang_tp_moe_scratch *s, gang_tp_moe_dev *d, float *yr, uint64_t deadline)
{
    uint32_t ep = m->ep, per = m->expert_count;
    size_t in_rows[GANG_MOE_MAX_EXPERTS], row = m->hidden * sizeof(float);
    int rc;

    for (uint32_t r = 0; r < ep; r++) {
        in_rows[r] = 0;
        for (uint32_t i = 0; i < per; i++)
            in_rows[r] += s->xc.cnt_in[r * per + i];
    }
    rc = s->xc.recv_rows > 0 ? gang_kernels_upload(k, d->rows, s->xc.recv, s->xc.recv_rows * row)
                             : 0;
    if (rc == 0)
        rc = dev_a2a(comm, s, d->rows, in_rows, d->out, s->plan.send_rows, row, deadline);
    if (rc == 0 && s->plan.slots > 0)
        rc = gang_kernels_download(k, s->xc.send, d->out, s->plan.slots * row);
    if (rc == 0)
        gang__tp_moe_accumulate(&s->plan, s->weight, s->xc.send, m->hidden, yr);
    return rc;
}

/*
 * EP over comm: this rank's run of x (downloaded) dispatched on the host, the received
 * rows regrouped by expert and uploaded, the experts run, and the outputs put back in the
 * order dispatch left them for the combine into yr (host rows of the run).
 */
static int dev_exchange(gang_tp_moe *m, gang_kernels *k, gang_comm *comm, gang_tp_moe_scratch *s,
                        gang_tp_moe_dev *d, const float *xr, size_t n, float *yr, uint64_t deadline,
                        uint64_t *a2a_ns)
{
    size_t h = m->hidden, at = 0, row = h * sizeof(float);
    uint32_t per = m->expert_count, ep = m->ep;
    uint64_t left, t0;
    int rc;

    /* A device-memory communicator (nccl) exchanges d's device buffers, a host one (socket,
     * mpi) the host rows. */
    int staged = !(gang_comm_caps(comm) & GANG_COMM_CAP_HOST_MEM);

    rc = n > 0 ? gang_kernels_download(k, d->x_host, xr, n * row) : 0;

    t0 = gang_now_ns();
    if (rc == 0)
        rc = gang_deadline_left(deadline, &left);
    if (rc == 0)
        rc = staged ? dev_dispatch(m, k, comm, s, d, deadline)
                    : gang_moe_dispatch(comm, &s->plan, d->x_host, &s->xc, left);
    *a2a_ns += gang_now_ns() - t0;
    if (rc != 0)
        return rc;
    /* Source-major runs -> expert-major rows (and back below), offsets in run_first. */
    for (uint32_t src = 0, off = 0; src < ep; src++)
        for (uint32_t i = 0; i < per; i++) {
            s->run_first[src * per + i] = off;
            off += (uint32_t)s->xc.cnt_in[src * per + i];
        }
    for (uint32_t i = 0; i < per; i++) {
        d->run_n[i] = 0;
        for (uint32_t src = 0; src < ep; src++) {
            size_t c = s->xc.cnt_in[src * per + i];

            memcpy(s->rows_in + at * h, s->xc.recv + s->run_first[src * per + i] * h, c * row);
            at += c;
            d->run_n[i] += c;
        }
    }
    rc = at > 0 ? gang_kernels_upload(k, d->rows, s->rows_in, at * row) : 0;
    if (rc == 0)
        rc = dev_experts(m, k, d);
    if (rc == 0 && at > 0)
        rc = gang_kernels_download(k, s->rows_out, d->out, at * row);
    if (rc != 0)
        return rc;
    at = 0;
    for (uint32_t i = 0; i < per; i++)
        for (uint32_t src = 0; src < ep; src++) {
            size_t c = s->xc.cnt_in[src * per + i];

            memcpy(s->xc.recv + s->run_first[src * per + i] * h, s->rows_out + at * h, c * row);
            at += c;
        }
    t0 = gang_now_ns();
    rc = gang_deadline_left(deadline, &left);
    if (rc == 0)
        rc = staged ? dev_combine(m, k, comm, s, d, yr, deadline)
                    : gang_moe_combine(comm, &s->plan, s->weight, &s->xc, yr, left);
    *a2a_ns += gang_now_ns() - t0;
    return rc;
}

/* ep 1: the run's rows gathered on the device in plan order (already grouped by expert),
 * the experts run, the outputs downloaded and weighted into yr on the host. */
static int dev_local(gang_tp_moe *m, gang_kernels *k, gang_tp_moe_scratch *s, gang_tp_moe_dev *d,
                     const float *x, size_t tokens, size_t first, float *yr)
{
    size_t h = m->hidden, slots = s->plan.slots;
    int rc = 0;

    if (slots == 0)
        return 0;
    for (size_t i = 0; i < slots; i++)
        d->ids_host[i] = (int32_t)(first + s->plan.order[i] / m->top_k);
    for (uint32_t i = 0; i < m->expert_count; i++)
        d->run_n[i] = s->plan.send_expert[m->expert_first + i];
    rc = gang_kernels_upload(k, d->ids, d->ids_host, slots * sizeof(int32_t));
    if (rc == 0)
        rc = gang_kernels_embedding(k, x, tokens, h, d->ids, slots, d->rows);
    if (rc == 0)
        rc = dev_experts(m, k, d);
    if (rc == 0)
        rc = gang_kernels_download(k, s->rows_out, d->out, slots * h * sizeof(float));
    if (rc == 0)
        gang__tp_moe_accumulate(&s->plan, s->weight, s->rows_out, h, yr);
    return rc;
}

/* The shared expert's columns on every token, scaled by sigmoid(x . gate), into y_host. */
static int dev_shared(const gang_tp_moe *m, gang_kernels *k, gang_tp_moe_dev *d, const float *x,
                      size_t tokens)
{
    size_t h = m->hidden;
    int rc;

    if (m->sh_ffn == 0 || tokens == 0)
        return 0;
    rc = gang__tp_moe_swiglu(k, x, tokens, h, m->sh_gate, m->sh_up, m->sh_down, m->sh_count,
                             d->gate, d->up, d->sh_out);
    if (rc == 0)
        rc = gang_kernels_gemm(k, 1, tokens, 1, h, 1.0f, x, m->sh_gate_w, 0.0f, d->sh_g);
    if (rc == 0)
        rc = gang_kernels_download(k, d->sh_host, d->sh_out, tokens * h * sizeof(float));
    if (rc == 0)
        rc = gang_kernels_download(k, d->g_host, d->sh_g, tokens * sizeof(float));
    for (size_t t = 0; rc == 0 && t < tokens; t++) {
        float g = 1.0f / (1.0f + expf(-d->g_host[t]));

        for (size_t i = 0; i < h; i++)
            d->y_host[t * h + i] += g * d->sh_host[t * h + i];
    }
    return rc;
}

int gang__tp_moe_forward_dev(gang_tp_moe *m, gang_kernels *k, gang_comm *comm, const float *x,
                             size_t tokens, float *y, uint64_t timeout_ms)
{
    gang_moe_route_cfg rcfg = {m->n_experts, m->top_k, m->norm_topk};
    uint64_t deadline = gang_deadline_after(timeout_ms), t0 = gang_now_ns(), a2a_ns = 0, left;
    size_t h = m->hidden, first = 0, n = tokens;
    gang_tp_moe_scratch *s;
    gang_tp_moe_dev *d;
    int rc = gang__tp_moe_scratch(m, tokens, &s);

    if (rc == 0)
        rc = dev_buffers(m, k, tokens, &d);
    if (rc != 0)
        return rc;
    if (m->ep > 1) { /* this rank's run: the uneven split of the host path */
        size_t base = tokens / m->ep, extra = tokens % m->ep;

        first = m->ep_rank * base + (m->ep_rank < extra ? m->ep_rank : extra);
        n = base + (m->ep_rank < extra ? 1 : 0);
    }
    memset(d->y_host, 0, tokens * h * sizeof(float));
    if (n > 0) {
        rc = gang_kernels_gemm(k, 1, n, m->n_experts, h, 1.0f, x + first * h, m->router, 0.0f,
                               d->logits);
        if (rc == 0)
            rc = gang_kernels_download(k, s->logits, d->logits, n * m->n_experts * sizeof(float));
        if (rc == 0)
            rc = gang_moe_route(&rcfg, s->logits, n, s->expert, s->weight);
    }
    if (rc == 0)
        rc = gang_moe_plan_build(&s->plan, s->expert, n);
    if (rc != 0)
        return rc;
    gang__tp_moe_count(m, &s->plan);
    rc = m->ep == 1 ? dev_local(m, k, s, d, x, tokens, first, d->y_host + first * h)
                    : dev_exchange(m, k, comm, s, d, x + first * h, n, d->y_host + first * h,
                                   deadline, &a2a_ns);
    if (rc == 0)
        rc = dev_shared(m, k, d, x, tokens);
    if (rc == 0)
        rc = gang_kernels_upload(k, y, d->y_host, tokens * h * sizeof(float));
    if (rc == 0 && comm != NULL && m->tp > 1 && (rc = gang_deadline_left(deadline, &left)) == 0)
        rc = gang_tp_stage_all_reduce(k, comm, NULL, y, tokens * h, GANG_DTYPE_F32, left);
    if (rc == 0)
        gang__tp_moe_timed(tokens, gang_now_ns() - t0, a2a_ns);
    return rc;
}

int gang_tp_moe_to_device(gang_tp_moe *m, gang_kernels *k)
{
    void *dev[8] = {0};
    int rc = 0;

    if (m == NULL || k == NULL)
        return GANG_EINVAL;
    if (m->mem == k || !(gang_kernels_caps(k) & GANG_KERNELS_CAP_DEVICE_MEM))
        return 0;
    if (m->mem != NULL)
        return GANG_EINVAL;
    float **arr[] = {&m->router,  &m->w_gate, &m->w_up,    &m->w_down,
                     &m->sh_gate, &m->sh_up,  &m->sh_down, &m->sh_gate_w};
    size_t h = m->hidden, per = (size_t)m->expert_count * m->ffn_count * h;
    size_t sh = (size_t)m->sh_count * h;
    size_t n[] = {(size_t)m->n_experts * h, per, per, per, sh, sh, sh, h};
    for (size_t i = 0; i < 8 && rc == 0; i++) {
        if (*arr[i] == NULL)
            continue;
        rc = gang_kernels_alloc(k, n[i] * sizeof(float), &dev[i]);
        if (rc == 0)
            rc = gang_kernels_upload(k, dev[i], *arr[i], n[i] * sizeof(float));
    }
    if (rc != 0) { /* all or nothing: the host arrays stay */
        for (size_t i = 0; i < 8; i++)
            gang_kernels_free(k, dev[i]);
        return rc;
    }
    for (size_t i = 0; i < 8; i++) {
        if (*arr[i] == NULL)
            continue;
        free(*arr[i]);
        *arr[i] = dev[i];
    }
    m->mem = k;
    return 0;
}

void gang__tp_moe_dev_free(gang_tp_moe *m)
{
    float **arr[] = {&m->router,  &m->w_gate, &m->w_up,    &m->w_down,
                     &m->sh_gate, &m->sh_up,  &m->sh_down, &m->sh_gate_w};

    if (m->mem == NULL)
        return;
    dev_buffers_free(m->mem, m->dev);
    m->dev = NULL;
    for (size_t i = 0; i < sizeof(arr) / sizeof(arr[0]); i++) {
        gang_kernels_free(m->mem, *arr[i]);
        *arr[i] = NULL;
    }
    m->mem = NULL;
}
