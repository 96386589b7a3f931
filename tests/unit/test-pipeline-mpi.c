/*
 * The pipelined forward pass (parallel/pipeline.c) on the mpi communicator backend under
 * a real mpirun (Open MPI). CTest runs `mpiexec -np 4 test-pipeline-mpi`: the four
 * processes form one layout, tp = 2 x pp = 2 (two nodes of two ranks: ranks 0 and 1 are
 * stage 0, ranks 2 and 3 stage 1). Every process builds the same random stack of small
 * Llama layers and the same batch of 8 sequences x 3 tokens (same seed), and computes the
 * single-rank reference locally: the layers applied one after the other with tp = 1 and
 * no communicator, as tests/unit/test-pipeline.c does. The ranks then run the pipelined
 * forward with 1, 2 and 4 microbatches, and every TP rank of stage 0 must get the
 * reference output within 1e-4 relative error (f32).
 *
 * The identity comes from Open MPI's OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE and the
 * backend initialises MPI itself (this file never includes <mpi.h>). The TP communicator
 * is split from the world with color = pp stage and key = tp rank, the PP communicator
 * with color = tp rank and key = pp stage.
 *
 * Output: rank 0 prints cmocka's report; the other ranks discard cmocka's progress lines
 * (stdout) but keep its failure messages (stderr). Before exiting, the ranks sum their
 * failure counts with an all_reduce on the world communicator, which carries nothing but
 * the two splits and so stays healthy even when a forward pass broke the TP or PP
 * communicator; every rank exits 1 if any rank failed (or if the tally itself failed),
 * so mpiexec's exit status reflects every rank. Every communicator is freed, the world
 * last, so that MPI finalizes cleanly.
 *
 * Exit status 77 (skipped) when the mpi backend is not built, when the binary was not
 * started by Open MPI's mpirun with 4 ranks, or when MPI cannot start.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ganglion/comm.h"
#include "ganglion/kernels.h"
#include "ganglion/parallel.h"

/* The one layout under test: tp x pp ranks, as pp nodes of tp ranks. */
#define TP 2u
#define PP 2u
#define WORLD (TP * PP)

/* Deadline of every operation: generous, a failure shows as a timeout. */
#define OP_TIMEOUT_MS 20000u

/*
 * Model shape (that of test-pipeline.c): small enough for milliseconds, large enough for
 * 2-way TP with GQA. Five layers split unevenly over the two stages (3 + 2).
 */
#define N_LAYERS 5
#define HIDDEN 32
#define N_HEADS 4
#define N_KV_HEADS 2
#define HEAD_DIM (HIDDEN / N_HEADS)
#define KV_DIM (N_KV_HEADS * HEAD_DIM)
#define FFN 64
#define BATCH 8
#define TOKENS 3
#define ACT (BATCH * TOKENS * HIDDEN)
#define ROPE_THETA 10000.0f
#define NORM_EPS 1e-5f
#define REL_TOL 1e-4

/* ---------------------------------------------------------------------------------
 * A random model and its single-rank reference (as in test-pipeline.c).
 * --------------------------------------------------------------------------------- */
typedef struct layer_mem {
    float attn_norm[HIDDEN], mlp_norm[HIDDEN];
    float wq[HIDDEN * HIDDEN], wk[KV_DIM * HIDDEN], wv[KV_DIM * HIDDEN], wo[HIDDEN * HIDDEN];
    float w_gate[FFN * HIDDEN], w_up[FFN * HIDDEN], w_down[HIDDEN * FFN];
} layer_mem;

typedef struct model {
    layer_mem mem[N_LAYERS];
    gang_layer_weights w[N_LAYERS];
    float x[ACT];   /* the input hidden states of the batch */
    float ref[ACT]; /* the reference output */
    float out[ACT]; /* stage 0: the pipelined output */
} model;

/* What every rank holds for the tests; set by main and the group setup. */
typedef struct rank_state {
    uint32_t rank;           /* global rank */
    uint32_t stage, tp_rank; /* place in the layout */
    gang_comm *tp_comm;      /* the ranks of this stage, in tp-rank order */
    gang_comm *pp_comm;      /* the ranks of this tp rank, in stage order */
    model *m;                /* the random stack, its input and reference */
    gang_pipeline *pipe;     /* this rank's share of the pipeline */
    gang_kernels *k;         /* this thread's kernels handle */
} rank_state;

static rank_state g;

/* The same seed on every rank: every process draws the same stack and input. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* Uniform in [-1, 1) from xorshift64*: deterministic across runs, ranks and platforms. */
static float rnd(void)
{
    double u;

    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    u = (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
    return (float)(2.0 * u - 1.0);
}

static void fill(float *a, size_t n, float scale, float offset)
{
    size_t i;

    for (i = 0; i < n; i++)
        a[i] = rnd() * scale + offset;
}

static int topology_for(uint32_t tp, uint32_t pp, gang_topology *t)
{
    gang_topology_config cfg = {
        .nnodes = (int32_t)pp,
        .nproc_per_node = (int32_t)tp,
        .tp = (int32_t)tp,
        .pp = (int32_t)pp,
        .allow_cross_node_tp = 0,
        .n_layers = N_LAYERS,
        .n_heads = N_HEADS,
        .n_kv_heads = N_KV_HEADS,
        .ffn = FFN,
        .hidden = HIDDEN,
        .vocab = 16,
    };

    return gang_topology_init(&cfg, t, NULL, 0);
}

/*
 * The reference: every sequence through every layer in turn on this one rank, with the
 * plain single-rank layer (tp = 1, comm NULL) and one cache reused by every prefill.
 */
static void model_reference(model *m)
{
    gang_topology t;
    gang_tp_layer l;
    gang_kernels *k = NULL;
    float ck[TOKENS * KV_DIM], cv[TOKENS * KV_DIM];
    gang_tp_kv_cache cache = {.k = ck, .v = cv, .cap = TOKENS};
    uint32_t i, s;

    assert_int_equal(topology_for(1, 1, &t), 0);
    assert_int_equal(gang_kernels_open("cpu", &k), 0);
    memcpy(m->ref, m->x, sizeof(m->ref));
    for (i = 0; i < N_LAYERS; i++) {
        assert_int_equal(gang_tp_layer_init(&l, &t, 0, &m->w[i], ROPE_THETA, NORM_EPS), 0);
        for (s = 0; s < BATCH; s++)
            assert_int_equal(gang_tp_layer_forward(&l, k, NULL, m->ref + s * TOKENS * HIDDEN,
                                                   TOKENS, 0, &cache, OP_TIMEOUT_MS),
                             0);
        gang_tp_layer_free(&l);
    }
    gang_kernels_close(k);
}

static model *model_new(void)
{
    model *m = calloc(1, sizeof(*m));
    float s_h = 1.0f / sqrtf((float)HIDDEN), s_f = 1.0f / sqrtf((float)FFN);
    uint32_t i;

    assert_non_null(m);
    for (i = 0; i < N_LAYERS; i++) {
        layer_mem *p = &m->mem[i];

        fill(p->attn_norm, HIDDEN, 0.2f, 1.0f);
        fill(p->mlp_norm, HIDDEN, 0.2f, 1.0f);
        /* Large q/k weights give peaked softmaxes, so a wrong head mapping cannot hide. */
        fill(p->wq, HIDDEN * HIDDEN, 3.0f * s_h, 0.0f);
        fill(p->wk, KV_DIM * HIDDEN, 3.0f * s_h, 0.0f);
        fill(p->wv, KV_DIM * HIDDEN, s_h, 0.0f);
        fill(p->wo, HIDDEN * HIDDEN, s_h, 0.0f);
        fill(p->w_gate, FFN * HIDDEN, 2.0f * s_h, 0.0f);
        fill(p->w_up, FFN * HIDDEN, s_h, 0.0f);
        fill(p->w_down, HIDDEN * FFN, s_f, 0.0f);
        m->w[i] = (gang_layer_weights){.attn_norm = p->attn_norm,
                                       .wq = p->wq,
                                       .wk = p->wk,
                                       .wv = p->wv,
                                       .wo = p->wo,
                                       .mlp_norm = p->mlp_norm,
                                       .w_gate = p->w_gate,
                                       .w_up = p->w_up,
                                       .w_down = p->w_down};
    }
    fill(m->x, ACT, 1.0f, 0.0f);
    model_reference(m);
    return m;
}

/* Norm-wise relative error: max |got - ref| over max |ref|. */
static double rel_err(const float *got, const float *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    size_t i;

    for (i = 0; i < n; i++) {
        num = fmax(num, fabs((double)got[i] - (double)ref[i]));
        den = fmax(den, fabs((double)ref[i]));
    }
    return den > 0.0 ? num / den : num;
}

/* ---------------------------------------------------------------------------------
 * Group setup and teardown: the model, this rank's pipeline and its kernels handle.
 * --------------------------------------------------------------------------------- */
static int group_setup(void **state)
{
    gang_topology t;
    gang_pipeline_config cfg;
    const gang_rank_place *place;

    (void)state;
    g.m = model_new();
    assert_int_equal(topology_for(TP, PP, &t), 0);
    cfg = (gang_pipeline_config){.topo = &t,
                                 .rank = g.rank,
                                 .layers = g.m->w,
                                 .rope_theta = ROPE_THETA,
                                 .norm_eps = NORM_EPS,
                                 .max_batch = BATCH,
                                 .max_tokens = TOKENS};
    assert_int_equal(gang_pipeline_init(&cfg, &g.pipe), 0);
    place = gang_pipeline_place(g.pipe);
    assert_int_equal(place->pp_stage, g.stage);
    assert_int_equal(place->tp_rank, g.tp_rank);
    assert_int_equal(gang_kernels_open("cpu", &g.k), 0);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    gang_kernels_close(g.k);
    gang_pipeline_free(g.pipe);
    free(g.m);
    g.k = NULL;
    g.pipe = NULL;
    g.m = NULL;
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Tests: collective calls, run by every rank in the same order.
 * --------------------------------------------------------------------------------- */

/* The splits give each rank the communicator ranks and sizes the pipeline expects. */
static void test_split_places(void **state)
{
    (void)state;
    assert_int_equal(gang_comm_size(g.tp_comm), TP);
    assert_int_equal(gang_comm_rank(g.tp_comm), g.tp_rank);
    assert_int_equal(gang_comm_size(g.pp_comm), PP);
    assert_int_equal(gang_comm_rank(g.pp_comm), g.stage);
    assert_int_equal(gang_comm_backend_of(g.tp_comm), GANG_COMM_MPI);
    assert_int_equal(gang_comm_backend_of(g.pp_comm), GANG_COMM_MPI);
}

/*
 * One pipelined forward pass in `microbatches` microbatches. Every rank must succeed;
 * every TP rank of stage 0 must hold the reference output within REL_TOL.
 */
static void check_forward(uint32_t microbatches)
{
    int is_first = g.stage == 0;
    double e;
    int rc;

    if (is_first)
        memcpy(g.m->out, g.m->x, sizeof(g.m->out));
    rc = gang_pipeline_forward(g.pipe, g.k, g.tp_comm, g.pp_comm, is_first ? g.m->out : NULL, BATCH,
                               TOKENS, microbatches, OP_TIMEOUT_MS);
    if (rc != 0)
        fail_msg("rank %u (stage %u, tp rank %u), %u microbatches: %s", g.rank, g.stage, g.tp_rank,
                 microbatches, gang_err_name(rc));
    if (!is_first)
        return;
    e = rel_err(g.m->out, g.m->ref, ACT);
    if (!(e <= REL_TOL))
        fail_msg("rank %u (tp rank %u), %u microbatches: relative error %g", g.rank, g.tp_rank,
                 microbatches, e);
}

static void test_forward_1_microbatch(void **state)
{
    (void)state;
    check_forward(1);
}

static void test_forward_2_microbatches(void **state)
{
    (void)state;
    check_forward(2);
}

static void test_forward_4_microbatches(void **state)
{
    (void)state;
    check_forward(4);
}

/* Reads a non-negative decimal from the environment; -1 when absent or malformed. */
static int64_t env_u32(const char *name)
{
    const char *s = getenv(name);
    int64_t v = -1;

    if (s == NULL || gang_parse_i64(s, 0, UINT32_MAX, &v) != 0)
        return -1;
    return v;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_places),
        cmocka_unit_test(test_forward_1_microbatch),
        cmocka_unit_test(test_forward_2_microbatches),
        cmocka_unit_test(test_forward_4_microbatches),
    };
    gang_comm_config cfg;
    gang_comm *world = NULL;
    int64_t rank = env_u32("OMPI_COMM_WORLD_RANK");
    int64_t size = env_u32("OMPI_COMM_WORLD_SIZE");
    int32_t failed = 0;
    int rc;

    if (!gang_comm_backend_built(GANG_COMM_MPI)) {
        printf("test-pipeline-mpi: skipped: the mpi backend is not built into this binary\n");
        return 77;
    }
    if (rank < 0 || size < 0 || rank >= size) {
        printf("test-pipeline-mpi: skipped: run under Open MPI's mpiexec with %u ranks "
               "(OMPI_COMM_WORLD_RANK/SIZE not set)\n",
               WORLD);
        return 77;
    }
    if (size != WORLD) {
        printf("test-pipeline-mpi: skipped: needs exactly %u ranks (tp %u x pp %u), got %d\n",
               WORLD, TP, PP, (int)size);
        return 77;
    }
    g.rank = (uint32_t)rank;
    g.stage = g.rank / TP;
    g.tp_rank = g.rank % TP;
    gang_log_set_identity((int)g.stage, (int)rank);

    memset(&cfg, 0, sizeof(cfg));
    cfg.backend = GANG_COMM_MPI;
    cfg.rank = g.rank;
    cfg.world_size = WORLD;
    cfg.timeout_ms = OP_TIMEOUT_MS;
    rc = gang_comm_init(&cfg, &world);
    if (rc == GANG_EIO) {
        printf("test-pipeline-mpi: skipped: MPI cannot start here\n");
        return 77;
    }
    if (rc != 0) {
        fprintf(stderr, "rank %u: gang_comm_init(mpi) failed: %s\n", g.rank, gang_err_name(rc));
        return 1;
    }

    /* The TP group is this stage's ranks in tp-rank order, the PP group this tp rank's
     * ranks in stage order. A failed split is counted and skips the tests on this rank. */
    rc = gang_comm_split(world, g.stage, g.tp_rank, OP_TIMEOUT_MS, &g.tp_comm);
    if (rc == 0)
        rc = gang_comm_split(world, g.tp_rank, g.stage, OP_TIMEOUT_MS, &g.pp_comm);
    if (rc != 0) {
        fprintf(stderr, "rank %u: gang_comm_split failed: %s\n", g.rank, gang_err_name(rc));
        failed = 1;
    }

    if (g.rank != 0 && freopen("/dev/null", "w", stdout) == NULL)
        fprintf(stderr, "rank %u: cannot silence stdout\n", g.rank);
    if (failed == 0)
        failed = (int32_t)cmocka_run_group_tests_name("pipeline-mpi", tests, group_setup,
                                                      group_teardown);

    /*
     * The failure count of every rank, summed on the world communicator: it carried only
     * the splits, so it is healthy even when a forward pass broke the TP or PP
     * communicator. If it broke anyway, this rank exits 1 on its own.
     */
    rc = gang_comm_all_reduce(world, &failed, 1, GANG_DTYPE_I32, OP_TIMEOUT_MS);
    if (rc != 0) {
        fprintf(stderr, "rank %u: tally all_reduce failed: %s\n", g.rank, gang_err_name(rc));
        failed = 1;
    }
    if (g.rank == 0)
        printf("test-pipeline-mpi: %d failure(s) over %u ranks (tp %u x pp %u)\n", (int)failed,
               WORLD, TP, PP);
    fflush(stdout);
    gang_comm_free(g.pp_comm);
    gang_comm_free(g.tp_comm);
    gang_comm_free(world); /* The last MPI communicator: MPI_Finalize happens here. */
    return failed == 0 ? 0 : 1;
}
