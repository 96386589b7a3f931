/*
 * The stages of one engine step: what every rank does with the plan once it has it.
 *
 * The plan's sequences are cut into K = min(microbatches, n_seq) microbatches of whole,
 * consecutive sequences, and the microbatches flow through the stages in the one GPipe
 * schedule of the project, gang_pipeline_run (parallel/pipeline.c, which gives the order
 * and why it cannot deadlock). This file supplies its callbacks:
 *
 *   WORK(k)         stage 0 embeds the microbatch's token ids; every stage runs its
 *                   layers with the batched ragged forward (one GEMM per weight for all the
 *                   microbatch's tokens, two TP all-reduces per layer); the last stage
 *                   takes the last token of every sequence that samples, applies the final
 *                   RMSNorm and this TP rank's vocabulary rows of the LM head, all-gathers
 *                   the logits over the TP group (each rank's part padded to
 *                   ceil(vocab / tp) so the counts are equal), and its TP rank 0 samples.
 *   SEND/RECV_ACT   the microbatch's activations over pp, to the same TP rank of the
 *                   neighbouring stage.
 *   SEND/RECV_RESULT the sampled tokens over world, from (stage P-1, TP rank 0) to
 *                   global rank 0; the other TP ranks skip both ends, which keeps every
 *                   message's two ends in agreement. With an EP group wider than the TP
 *                   group (a stage of k TP replicas) every replica computes and samples
 *                   the same tokens, and only the first (ep_rank 0) sends or receives.
 *                   The MoE blocks run over the stage's EP communicator (the scratch's
 *                   moe_comm, set by gang_engine_step), the rest over tp.
 *
 * Tags are reused from step to step. That is safe because rank 0 starts the next step's
 * broadcast only after it has received every token of this step, which the last stage
 * sends after receiving every activation of this step.
 *
 * Which communicator carries what. The activations go over pp and the TP collectives over
 * tp, through gang_tp_stage_* (device pointers straight to an nccl communicator, staged
 * through the host for socket / MPI). The tokens are host data (the plan's out array), so
 * they go over the WORLD communicator, which is always a host one (gang_engine_step
 * refuses an nccl world), from the global rank of (stage P-1, TP rank 0) to global rank 0,
 * with the same tags as above. Keeping them off pp matters for nccl, whose point-to-point
 * has no tags and no host buffers: with P = 2 the activations 0 -> 1 and the tokens
 * 1 -> 0 would otherwise share the nccl pair, and the per-pair order of the schedule
 * above would be the only thing matching them. On pp only activations remain, and
 * between two neighbours they flow in one direction, in microbatch order on both sides,
 * which is exactly nccl's ordering rule.
 */
#include <string.h>

#include "engine-internal.h"

/*
 * Waits for what the step's device communicators enqueued without waiting (nccl ordered
 * on the device: gang_comm_settle), with the step's deadline; nothing for host ones.
 */
static int run_settle(gang_comm *tp, gang_comm *pp, uint64_t deadline)
{
    uint64_t left;
    int rc = 0;

    if (tp != NULL && (rc = gang_deadline_left(deadline, &left)) == 0)
        rc = gang_comm_settle(tp, left);
    if (rc == 0 && pp != NULL && (rc = gang_deadline_left(deadline, &left)) == 0)
        rc = gang_comm_settle(pp, left);
    return rc;
}

/* Token range [*t0, *t1) of the sequences [first, first + count) of the plan. */
static void run_token_range(const gang_engine *e, uint32_t first, uint32_t count, uint32_t *t0,
                            uint32_t *t1)
{
    const gang__plan_seq *last = &e->plan.seqs[first + count - 1];

    *t0 = e->plan.seqs[first].tok_off;
    *t1 = last->tok_off + last->n;
}

/*
 * Copies the last token's activations of every sampling sequence of [first, first +
 * count) into e->head_in from head row row0 on, in order; consecutive source rows (a
 * batch of decodes) go in one copy. Returns the number of rows in *ns.
 */
static int run_gather_last(gang_engine *e, gang_kernels *k, uint32_t first, uint32_t count,
                           uint32_t row0, uint32_t *ns)
{
    size_t hidden = e->m->topo.hidden, row = hidden * sizeof(float);
    float *head_in = e->head_in + (size_t)row0 * hidden;
    uint32_t i, src, run_src = 0, run_dst = 0, run_len = 0, n = 0;
    int rc = 0;

    for (i = first; i < first + count && rc == 0; i++) {
        const gang__plan_seq *s = &e->plan.seqs[i];

        if (!s->sample)
            continue;
        src = s->tok_off + s->n - 1;
        if (run_len > 0 && src == run_src + run_len) {
            run_len++;
        } else {
            if (run_len > 0)
                rc = gang_kernels_copy(k, head_in + (size_t)run_dst * hidden,
                                       e->act + (size_t)run_src * hidden, run_len * row);
            run_src = src;
            run_dst = n;
            run_len = 1;
        }
        n++;
    }
    if (rc == 0 && run_len > 0)
        rc = gang_kernels_copy(k, head_in + (size_t)run_dst * hidden,
                               e->act + (size_t)run_src * hidden, run_len * row);
    *ns = n;
    return rc;
}

/*
 * Samples plan sequence i from logits row `row` (TP rank 0 of the last stage): the
 * penalties count the slot's history (e->hist, complete below the drawn position, which
 * is pos0 + n and the key of the draw), and the logprobs, when asked, read the raw row.
 */
static void run_sample(gang_engine *e, uint32_t i, uint32_t row)
{
    const gang__plan_seq *s = &e->plan.seqs[i];
    const float *lg = e->logits + (size_t)row * e->vocab;
    gang__history h = {.ids = e->hist + (size_t)s->slot * e->max_ctx,
                       .n = s->pos0 + s->n,
                       .n_prompt = s->n_prompt,
                       .slot = s->slot};

    e->head_row[i] = row;
    e->plan.out[i] = gang__sample_seq(&e->sampler, lg, &s->sp, &h);
    if (s->sp.logprobs)
        gang__logprobs(&e->sampler, lg, e->plan.out[i], s->sp.top_logprobs, &e->plan.res[i]);
}

/*
 * The last stage's head for sequences [first, first + count): final norm of each
 * sampling sequence's last token, LM head on this rank's vocabulary rows, all-gather of
 * the padded logits, and on TP rank 0 the full logits rows, assembled in tensor memory
 * (head rows row0 .. of the step, so that every row of the step stays there). Then, on a
 * device step, the rows are sampled on the device and only the ids come back
 * (engine-device.c: at the end of the step with one stage, here on a pipeline's last
 * stage, which sends them on); on the host, the rows come down in one download and are
 * sampled there. Either way the sampled tokens end in e->plan.out.
 */
static int run_head(gang_engine *e, gang_kernels *k, gang_comm *tp, gang_comm *pp, uint32_t first,
                    uint32_t count, uint64_t deadline)
{
    const gang_model *m = e->m;
    size_t hidden = m->topo.hidden, vc = m->shard.vocab_count, vocab = e->vocab;
    uint32_t i, j, r, ns = 0, tp_n = m->topo.tp, row0 = e->n_head_rows;
    float *head_in = e->head_in + (size_t)row0 * hidden,
          *head_out = e->head_out + (size_t)row0 * vc;
    gang_kernels_weight head;
    const float *rows;
    float *dst;
    uint64_t left;
    int rc;

    rc = run_gather_last(e, k, first, count, row0, &ns);
    if (rc != 0 || ns == 0)
        return rc;
    rc = gang_kernels_rmsnorm(k, head_in, m->final_norm, m->cfg.rms_eps, ns, hidden, head_in);
    if (rc != 0)
        return rc;
    head = gang_model_head(m);
    rc = gang_kernels_matmul(k, ns, vc, hidden, head_in, &head, head_out);
    if (rc != 0)
        return rc;
    rows = head_out; /* tp == 1: this rank's rows are the whole vocabulary */
    if (tp_n > 1) {
        /* Pad every rank's part to vpad columns so the all-gather counts are equal. */
        rc = gang_kernels_copy_2d(k, e->head_pad, e->vpad * sizeof(float), head_out,
                                  vc * sizeof(float), vc * sizeof(float), ns);
        if (rc == 0)
            rc = gang_deadline_left(deadline, &left);
        if (rc == 0)
            rc = gang_tp_stage_all_gather(k, tp, &e->stage, e->head_pad, e->gathered,
                                          (size_t)ns * e->vpad, GANG_DTYPE_F32, left);
        if (rc != 0 || m->place.tp_rank != 0)
            return rc;
        /* Rank r's columns of every row: one strided copy per rank. */
        dst = (e->logits_dev != NULL ? e->logits_dev : e->logits) + (size_t)row0 * vocab;
        for (r = 0; r < tp_n && rc == 0; r++)
            rc = gang_kernels_copy_2d(k, dst + e->shards[r].vocab_first, vocab * sizeof(float),
                                      e->gathered + (size_t)r * ns * e->vpad,
                                      e->vpad * sizeof(float),
                                      e->shards[r].vocab_count * sizeof(float), ns);
        if (rc != 0)
            return rc;
        rows = e->logits_dev != NULL ? dst : NULL; /* host: the rows are already in place */
    }
    if (!e->host_sample) {
        rc = gang__dev_sample(e, k, rows, first, count, row0, ns);
        e->n_head_rows = row0 + ns;
        if (rc == 0 && m->topo.pp > 1)
            rc = run_settle(tp, pp, deadline);
        if (rc == 0 && m->topo.pp > 1)
            rc = gang__dev_fetch_ids(e, k); /* the pipeline sends them on now */
        return rc;
    }
    /* Sampling on the host: the step's one copy of the sampled rows (after the device
     * collectives it depends on, awaited with the deadline: the download itself has none). */
    if (rows != NULL) {
        rc = run_settle(tp, pp, deadline);
        if (rc == 0)
            rc = gang_kernels_download(k, e->logits + (size_t)row0 * vocab, rows,
                                       (size_t)ns * vocab * sizeof(float));
        if (rc != 0)
            return rc;
    }
    for (i = first, j = 0; i < first + count; i++) {
        if (e->plan.seqs[i].sample)
            run_sample(e, i, row0 + j++);
    }
    e->n_head_rows = row0 + ns;
    return 0;
}

/* F(k): the stage's work on the sequences [first, first + count), in place in e->act. */
static int run_stage(gang_engine *e, gang_kernels *k, gang_comm *tp, gang_comm *pp, uint32_t first,
                     uint32_t count, uint64_t deadline)
{
    const gang_model *m = e->m;
    size_t hidden = m->topo.hidden;
    uint32_t t0, t1, l, i;
    uint64_t left;
    float *h;
    int rc;

    run_token_range(e, first, count, &t0, &t1);
    h = e->act + (size_t)t0 * hidden;
    if (e->is_first) {
        gang_kernels_weight table = gang_kernels_weight_view(m->wtype, m->embed, e->vocab, hidden);

        rc = gang_kernels_embedding_w(k, &table, e->vocab, hidden, e->tokens_dev + t0, t1 - t0, h);
        if (rc == 0 && m->cfg.embed_scale > 0.0f && m->cfg.embed_scale != 1.0f) /* Gemma */
            rc = gang_kernels_scale(k, h, m->cfg.embed_scale, (size_t)(t1 - t0) * hidden);
        if (rc != 0)
            return rc;
    }
    e->scratch.normed_for = NULL;
    for (l = 0; l < m->layer_count; l++) {
        for (i = 0; i < count; i++)
            e->cache_ptrs[i] = &e->caches[(size_t)l * e->slots + e->plan.seqs[first + i].slot];
        rc = gang_deadline_left(deadline, &left);
        if (rc != 0)
            return rc;
        /* Each layer's last add also norms for the next one (gang_tp_scratch). */
        e->scratch.next_norm = l + 1 < m->layer_count ? m->layers[l + 1].attn_norm : NULL;
        rc =
            gang_tp_layer_forward_batch(&m->layers[l], k, tp, h, count, e->plan.seq_tokens + first,
                                        e->plan.seq_pos0 + first, e->cache_ptrs, &e->scratch, left);
        if (rc != 0)
            return rc;
    }
    if (e->is_last)
        return run_head(e, k, tp, pp, first, count, deadline);
    return 0;
}

/* Activations of sequences [first, first + count) to or from PP rank peer (staged through
 * the host when the activations are device memory and pp a host communicator). */
static int run_xfer_act(gang_engine *e, gang_kernels *k, int is_send, gang_comm *pp, uint32_t first,
                        uint32_t count, uint32_t peer, uint32_t tag, uint64_t deadline)
{
    size_t hidden = e->m->topo.hidden;
    uint32_t t0, t1;
    uint64_t left;
    float *h;
    int rc;

    run_token_range(e, first, count, &t0, &t1);
    h = e->act + (size_t)t0 * hidden;
    rc = gang_deadline_left(deadline, &left);
    if (rc != 0)
        return rc;
    if (is_send)
        return gang_tp_stage_send(k, pp, &e->stage, h, (size_t)(t1 - t0) * hidden * sizeof(float),
                                  peer, tag, left);
    return gang_tp_stage_recv(k, pp, &e->stage, h, (size_t)(t1 - t0) * hidden * sizeof(float), peer,
                              tag, left);
}

/*
 * The sampled tokens of sequences [first, first + count) over the world communicator
 * (host memory; see the file comment): sent by the last stage's TP rank 0 to global rank
 * 0, or received by rank 0 from it. When a sequence of the range asked for logprobs
 * (both ends know it from the plan) the message is the range's gang__result records,
 * tokens included, instead of the bare token ids: one message either way.
 */
static int run_xfer_tokens(gang_engine *e, int is_send, gang_comm *world, uint32_t first,
                           uint32_t count, uint32_t tag, uint64_t deadline)
{
    const gang_model *m = e->m;
    uint32_t last_root, i, lp = 0;
    void *buf = e->plan.out + first;
    size_t bytes = (size_t)count * sizeof(int32_t);
    uint64_t left;
    int rc;

    rc = gang_topology_rank_at(&m->topo, m->topo.pp - 1, 0, &last_root);
    if (rc == 0)
        rc = gang_deadline_left(deadline, &left);
    if (rc != 0)
        return rc;
    for (i = first; i < first + count; i++)
        lp |= e->plan.seqs[i].sp.logprobs;
    if (lp) {
        buf = e->plan.res + first;
        bytes = (size_t)count * sizeof(gang__result);
        for (i = first; is_send && i < first + count; i++)
            e->plan.res[i].token = e->plan.out[i];
    }
    if (is_send)
        return gang_comm_send(world, buf, bytes, 0, tag, left);
    rc = gang_comm_recv(world, buf, bytes, last_root, tag, left);
    for (i = first; rc == 0 && lp && i < first + count; i++)
        e->plan.out[i] = e->plan.res[i].token;
    return rc;
}

/* What the schedule's callbacks need: the engine, its kernels and the step's comms. */
typedef struct run_ctx {
    gang_engine *e;
    gang_kernels *k;
    gang_comm *world, *tp, *pp;
} run_ctx;

/* WORK(k): the stage's work on microbatch mb (run_stage). */
static int run_cb_work(void *ctx, const gang_pipeline_mb *mb, uint64_t deadline)
{
    run_ctx *c = ctx;

    return run_stage(c->e, c->k, c->tp, c->pp, mb->first, mb->count, deadline);
}

/* SEND_ACT: mb's activations to stage peer over pp (pp rank == stage). */
static int run_cb_send_act(void *ctx, const gang_pipeline_mb *mb, uint32_t peer, uint32_t tag,
                           uint64_t deadline)
{
    run_ctx *c = ctx;

    return run_xfer_act(c->e, c->k, 1, c->pp, mb->first, mb->count, peer, tag, deadline);
}

/* RECV_ACT: mb's activations from stage peer over pp. */
static int run_cb_recv_act(void *ctx, const gang_pipeline_mb *mb, uint32_t peer, uint32_t tag,
                           uint64_t deadline)
{
    run_ctx *c = ctx;

    return run_xfer_act(c->e, c->k, 0, c->pp, mb->first, mb->count, peer, tag, deadline);
}

/* SEND_RESULT: mb's sampled tokens to global rank 0, by the stage's first rank only (TP
 * rank 0 of its first TP group: the replicas of an EP group wider than TP sample the same
 * tokens and keep them). */
static int run_cb_send_result(void *ctx, const gang_pipeline_mb *mb, uint32_t peer, uint32_t tag,
                              uint64_t deadline)
{
    run_ctx *c = ctx;

    (void)peer;
    if (c->e->m->place.ep_rank != 0)
        return 0;
    return run_xfer_tokens(c->e, 1, c->world, mb->first, mb->count, tag, deadline);
}

/* RECV_RESULT: mb's sampled tokens from the last stage's first rank, by stage 0's first
 * rank only (global rank 0). */
static int run_cb_recv_result(void *ctx, const gang_pipeline_mb *mb, uint32_t peer, uint32_t tag,
                              uint64_t deadline)
{
    run_ctx *c = ctx;

    (void)peer;
    if (c->e->m->place.ep_rank != 0)
        return 0;
    return run_xfer_tokens(c->e, 0, c->world, mb->first, mb->count, tag, deadline);
}

/*
 * After a capture that is dropped: graphs off for the generation (rank 0's go out in the next
 * plans), the head's host records of the recorded step forgotten, and the step's kernels
 * run one by one (nothing ran: a capture only records).
 */
static int run_without_graphs(gang_engine *e, const gang_pipeline_ops *ops, uint64_t deadline)
{
    e->graphs_off = 1;
    e->n_head_rows = 0;
    e->ids_first = e->ids_pending = 0;
    return gang_pipeline_run(ops, 0, 1, e->plan.n_seq, 1, deadline);
}

/*
 * A capture that could not begin or end, with TP 1 (one rank: graph steps have one stage
 * and no EP group): run_without_graphs, with a log line unless the device has no graphs.
 */
static int run_capture_failed(gang_engine *e, const gang_pipeline_ops *ops, int rc_cap, int rc_run,
                              uint64_t deadline)
{
    if (rc_cap != GANG_ENOSYS)
        gang_warn("engine: the decode step could not be captured as a graph (%s, %s); "
                  "running its kernels one by one in this generation",
                  gang_err_name(rc_cap), gang_err_name(rc_run));
    return run_without_graphs(e, ops, deadline);
}

/*
 * With a TP group over NCCL the capture holds the step's collectives, and whether a
 * collective is captured must be the same on every rank (NCCL's rule): before any rank
 * launches its graph, every rank tells the others over the world (host sockets; with one
 * stage and no EP group it is the TP group) whether its capture failed (cap) or its step
 * did (run, a failure that is not the capture's). A capture that failed on any rank is
 * dropped on every rank: graphs go off everywhere (rank 0's choice travels in the plans
 * from the next step on) and this step runs its kernels one by one on every rank alike,
 * nothing of the captures having run. A step that failed anywhere fails everywhere (the
 * gang re-forms); graphs stay on. 0: every rank captured, *g is launched; 1: the step ran
 * without a graph; else a GANG_E* code (*g freed).
 */
static int run_capture_agree(gang_engine *e, gang_comm *world, const gang_pipeline_ops *ops,
                             int rc_cap, int rc_run, gang_kernels_graph **g, uint64_t deadline)
{
    int32_t v[2] = {rc_cap != 0, rc_cap == 0 && rc_run != 0};
    uint64_t left;
    int rc = gang_deadline_left(deadline, &left);

    if (rc == 0)
        rc = gang_comm_all_reduce(world, v, 2, GANG_DTYPE_I32, left);
    if (rc == 0 && v[0] == 0 && v[1] == 0)
        return 0;
    gang_kernels_graph_free(e->k, *g);
    *g = NULL;
    if (rc != 0)
        return rc;
    if (v[0] == 0)
        return rc_run != 0 ? rc_run : GANG_EPEER;
    gang_warn("engine: the decode step with its TP collectives could not be captured as a graph "
              "on %d of %u ranks (here: %s, %s); every rank drops its capture and runs its "
              "kernels one by one in this generation",
              (int)v[0], gang_comm_size(world), gang_err_name(rc_cap), gang_err_name(rc_run));
    rc = run_without_graphs(e, ops, deadline);
    return rc != 0 ? rc : 1;
}

/*
 * A decode step as a graph (cfg.cuda_graphs; gang__dev_graph_ok said it may be): the
 * layers' positions go up first (no upload may happen inside), then the graph of this
 * batch size is replayed, or, the first time, the step's work (one stage, one microbatch)
 * is captured into one and launched. With a TP group (NCCL) the graph holds the step's
 * collectives, the ranks agree on the capture (run_capture_agree), and gang_comm_pend_on
 * hands a replay to the step's settle, which waits for it with the deadline. With TP 1 a
 * device without graphs, or a capture that fails: run_capture_failed.
 */
static int run_graphed(gang_engine *e, gang_kernels *k, gang_comm *world, gang_comm *tp,
                       const gang_pipeline_ops *ops, uint64_t deadline)
{
    gang_kernels_graph *g = gang__dev_graph_find(e);
    int rc = gang__dev_graph_prepare(e, k), rc_cap, rc_run = 0;
    const int agree = e->m->topo.tp > 1;

    if (rc == 0 && g == NULL) {
        rc_cap = gang_kernels_graph_begin(k); /* GANG_ENOSYS: no graphs here */
        if (rc_cap == 0) {
            rc_run = gang_pipeline_run(ops, 0, 1, e->plan.n_seq, 1, deadline); /* recorded */
            rc_cap = gang_kernels_graph_end(k, &g);
        }
        if (agree) {
            rc = run_capture_agree(e, world, ops, rc_cap, rc_run, &g, deadline);
            if (rc != 0)
                return rc == 1 ? 0 : rc;
        } else if (rc_cap != 0) {
            return run_capture_failed(e, ops, rc_cap, rc_run, deadline);
        } else if (rc_run != 0) {
            gang_kernels_graph_free(k, g);
            return rc_run;
        }
        gang_info("engine: the decode step of batch %u captured as a graph%s", e->plan.n_seq,
                  agree ? ", its TP collectives (NCCL) inside" : "");
        gang__dev_graph_store(e, g);
    }
    if (rc == 0)
        rc = gang_kernels_graph_launch(k, g);
    if (rc == 0 && agree)
        rc = gang_comm_pend_on(tp, gang_kernels_device_stream(k));
    if (rc == 0)
        gang__dev_graph_done(e);
    return rc;
}

int gang__engine_run(gang_engine *e, gang_kernels *k, gang_comm *world, gang_comm *tp,
                     gang_comm *pp, uint64_t deadline)
{
    run_ctx c = {.e = e, .k = k, .world = world, .tp = tp, .pp = pp};
    const gang_pipeline_ops ops = {.ctx = &c,
                                   .work = run_cb_work,
                                   .send_act = run_cb_send_act,
                                   .recv_act = run_cb_recv_act,
                                   .send_result = run_cb_send_result,
                                   .recv_result = run_cb_recv_result};
    uint32_t nmb = e->cfg.microbatches, i;
    int rc;

    if (nmb > e->plan.n_seq)
        nmb = e->plan.n_seq;
    e->n_head_rows = 0;
    /* The sampling rank records every token fed to a slot, at its position, for the
     * penalties: a slot's rows below a sampled position are always this request's. */
    for (i = 0; e->hist != NULL && i < e->plan.n_seq; i++) {
        const gang__plan_seq *s = &e->plan.seqs[i];

        memcpy(e->hist + (size_t)s->slot * e->max_ctx + s->pos0, e->plan.tokens + s->tok_off,
               (size_t)s->n * sizeof(int32_t));
    }
    rc = gang__dev_step_begin(e);
    /* Stage 0 embeds from tensor memory: the step's token ids go over in one upload,
     * enqueued without a host wait. */
    if (rc == 0 && e->is_first)
        rc = gang_kernels_upload_async(k, e->tokens_dev, e->plan.tokens,
                                       (size_t)e->plan.n_tokens * sizeof(int32_t));
    if (rc != 0)
        return rc;
    if (gang__dev_graph_ok(e, tp, nmb))
        rc = run_graphed(e, k, world, tp, &ops, deadline);
    else
        rc = gang_pipeline_run(&ops, e->m->place.pp_stage, e->m->topo.pp, e->plan.n_seq, nmb,
                               deadline);
    /* The step's collectives, awaited once with its deadline (nccl returns at enqueue),
     * then with one stage the ids of every microbatch come down at once: the step's one
     * host synchronisation of the compute stream. */
    if (rc == 0)
        rc = run_settle(tp, pp, deadline);
    if (rc == 0 && e->is_last && e->m->topo.pp == 1)
        rc = gang__dev_fetch_ids(e, k);
    return rc;
}
