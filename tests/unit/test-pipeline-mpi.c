/*
 * The serving path (the engine of model/ on the pipeline schedule of parallel/pipeline.c
 * and the batched TP layers) on the mpi communicator backend under a real mpirun (Open
 * MPI). CTest runs `mpiexec -np 4 test-pipeline-mpi`: the four processes form one layout,
 * tp = 2 x pp = 2 (two nodes of two ranks: ranks 0 and 1 are stage 0, ranks 2 and 3
 * stage 1). Every process draws the same random model (tests/unit/engine-fixture.c, same
 * seed), cuts its own shard, and computes the naive reference locally. The gang then
 * serves the fixture's script of eight concurrent requests with 1, 2 and 3 microbatches:
 * rank 0 must see exactly the reference's tokens; and one step of three sequences must
 * leave on the last stage's TP rank 0 (rank 2) the logits a single rank computes, within
 * 1e-4 relative error (f32).
 *
 * The identity comes from Open MPI's OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE and the
 * backend initialises MPI itself (this file never includes <mpi.h>). The TP communicator
 * is split from the world with color = pp stage and key = tp rank, the PP communicator
 * with color = tp rank and key = pp stage; the world carries the plans and the tokens.
 *
 * Output: rank 0 prints cmocka's report; the other ranks discard cmocka's progress lines
 * (stdout) but keep its failure messages (stderr). Before exiting, the ranks sum their
 * failure counts with an all_reduce on a separate tally communicator (a split of the
 * world, which carries nothing else and so stays healthy even when a step broke the
 * others); every rank exits 1 if any rank failed (or if the tally itself failed), so
 * mpiexec's exit status reflects every rank. Every communicator is freed, the world
 * last, so that MPI finalizes cleanly.
 *
 * Exit status 77 (skipped) when the mpi backend is not built, when the binary was not
 * started by Open MPI's mpirun with 4 ranks, or when MPI cannot start.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine-fixture.h"
#include "engine-internal.h"

/* The one layout under test: tp x pp ranks, as pp nodes of tp ranks. */
#define TP 2u
#define PP 2u
#define WORLD (TP * PP)
#define LAST_ROOT ((PP - 1) * TP) /* the last stage's TP rank 0: holds the logits */

/* Deadline of every operation: generous, a failure shows as a timeout. */
#define OP_TIMEOUT_MS 20000u

/* What every rank holds for the tests; set by main and the group setup. */
typedef struct rank_state {
    uint32_t rank;            /* global rank */
    uint32_t stage, tp_rank;  /* place in the layout */
    gang_comm *world;         /* plans and tokens */
    gang_comm *tp_comm;       /* the ranks of this stage, in tp-rank order */
    gang_comm *pp_comm;       /* the ranks of this tp rank, in stage order */
    full_model *fm;           /* the random model (the same on every rank) */
    script sc;                /* the fixture's eight-request script */
    script_out exp[MAX_REQS]; /* its reference outputs */
} rank_state;

static rank_state g;

/* ---------------------------------------------------------------------------------
 * Group setup and teardown: the model, its script and the reference outputs.
 * --------------------------------------------------------------------------------- */
static int group_setup(void **state)
{
    (void)state;
    g.fm = full_model_new(21, 0);
    make_script(g.fm, &g.sc);
    expected_outputs(g.fm, &g.sc, g.exp);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    free(g.fm);
    g.fm = NULL;
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Tests: collective calls, run by every rank in the same order.
 * --------------------------------------------------------------------------------- */

/* The splits give each rank the communicator ranks and sizes the engine expects. */
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
 * Serves the script, then the one-step logits script, on this rank's engine with
 * `microbatches`. Every rank must succeed; rank 0 must see the reference tokens, rank
 * LAST_ROOT the single rank's logits.
 */
static void check_serving(uint32_t microbatches)
{
    static script one;
    gang_engine_config cfg = engine_config(microbatches);
    gang_run run;
    rank_ctx x;
    char what[64];
    layout l1;
    gang_model *m = shard_new(g.fm, TP, PP, g.rank);
    gang_engine *e = NULL;
    char err[256];
    int rc;

    snprintf(what, sizeof(what), "rank %u, %u microbatches", g.rank, microbatches);
    if (gang_engine_init(m, &cfg, &e, err, sizeof(err)) != 0)
        fail_msg("%s: engine init: %s", what, err);
    memset(&run, 0, sizeof(run));
    memset(&x, 0, sizeof(x));
    run.n = WORLD;
    run.tp = TP;
    run.pp = PP;
    run.sc = &g.sc;
    x.run = &run;
    x.rank = g.rank;
    x.engine = e;
    memset(g.sc.out, 0, sizeof(g.sc.out));
    rc = script_body(&x, g.world, g.tp_comm, g.pp_comm);
    if (rc != 0)
        fail_msg("%s: script: %s", what, gang_err_name(rc));
    if (g.rank == 0)
        check_script(&g.sc, g.exp, what);

    make_logits_script(&one);
    run.sc = &one;
    rc = script_body(&x, g.world, g.tp_comm, g.pp_comm);
    if (rc != 0)
        fail_msg("%s: logits step: %s", what, gang_err_name(rc));
    if (g.rank == LAST_ROOT) {
        layout_init(&l1, g.fm, 1, 1, &cfg);
        make_logits_script(&one);
        script_run_local(l1.engines[0], &one);
        check_step_logits(e, l1.engines[0], g.fm, &one, what);
        layout_free(&l1);
    } else {
        assert_null(gang__engine_logits(e, 0));
    }
    gang_engine_free(e);
    shard_free(m);
}

static void test_serving_1_microbatch(void **state)
{
    (void)state;
    check_serving(1);
}

static void test_serving_2_microbatches(void **state)
{
    (void)state;
    check_serving(2);
}

static void test_serving_3_microbatches(void **state)
{
    (void)state;
    check_serving(3);
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
        cmocka_unit_test(test_serving_1_microbatch),
        cmocka_unit_test(test_serving_2_microbatches),
        cmocka_unit_test(test_serving_3_microbatches),
    };
    gang_comm_config cfg;
    gang_comm *world = NULL, *tally = NULL;
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
    if (rc == 0)
        rc = gang_comm_split(world, 0, g.rank, OP_TIMEOUT_MS, &tally);
    g.world = world;
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
     * The failure count of every rank, summed on the tally communicator: it carried only
     * its split, so it is healthy even when a step broke the others. If it broke anyway
     * (or the split failed), this rank exits 1 on its own.
     */
    rc = tally == NULL ? GANG_EINVAL
                       : gang_comm_all_reduce(tally, &failed, 1, GANG_DTYPE_I32, OP_TIMEOUT_MS);
    if (rc != 0) {
        fprintf(stderr, "rank %u: tally all_reduce failed: %s\n", g.rank, gang_err_name(rc));
        failed = 1;
    }
    if (g.rank == 0)
        printf("test-pipeline-mpi: %d failure(s) over %u ranks (tp %u x pp %u)\n", (int)failed,
               WORLD, TP, PP);
    fflush(stdout);
    gang_comm_free(tally);
    gang_comm_free(g.pp_comm);
    gang_comm_free(g.tp_comm);
    gang_comm_free(world); /* The last MPI communicator: MPI_Finalize happens here. */
    return failed == 0 ? 0 : 1;
}
