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
#include "stack-fixture.h"

/* The one layout under test: tp x pp ranks, as pp nodes of tp ranks. */
#define TP 2u
#define PP 2u
#define WORLD (TP * PP)

/* Deadline of every operation: generous, a failure shows as a timeout. */
#define OP_TIMEOUT_MS 20000u

/* Five layers of the shared stack (stack-fixture.h) split unevenly over the stages (3 + 2). */
#define N_LAYERS 5

/* What every rank holds for the tests; set by main and the group setup. */
typedef struct rank_state {
    uint32_t rank;           /* global rank */
    uint32_t stage, tp_rank; /* place in the layout */
    gang_comm *tp_comm;      /* the ranks of this stage, in tp-rank order */
    gang_comm *pp_comm;      /* the ranks of this tp rank, in stage order */
    stack_model *m;          /* the random stack, its input and reference */
    float out[ACT];          /* stage 0: the pipelined output */
    gang_pipeline *pipe;     /* this rank's share of the pipeline */
    gang_kernels *k;         /* this thread's kernels handle */
} rank_state;

static rank_state g;

/* ---------------------------------------------------------------------------------
 * Group setup and teardown: the model, this rank's pipeline and its kernels handle.
 * --------------------------------------------------------------------------------- */
static int group_setup(void **state)
{
    gang_topology t;
    gang_pipeline_config cfg;
    const gang_rank_place *place;

    (void)state;
    g.m = stack_model_new(N_LAYERS);
    assert_int_equal(stack_topology(TP, PP, N_LAYERS, &t), 0);
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
        memcpy(g.out, g.m->x, sizeof(g.out));
    rc = gang_pipeline_forward(g.pipe, g.k, g.tp_comm, g.pp_comm, is_first ? g.out : NULL, BATCH,
                               TOKENS, microbatches, OP_TIMEOUT_MS);
    if (rc != 0)
        fail_msg("rank %u (stage %u, tp rank %u), %u microbatches: %s", g.rank, g.stage, g.tp_rank,
                 microbatches, gang_err_name(rc));
    if (!is_first)
        return;
    e = stack_rel_err(g.out, g.m->ref, ACT);
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
