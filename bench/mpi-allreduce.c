/*
 * The peer of `ganglion bench allreduce`: Open MPI's MPI_Allreduce (f32, sum, in place)
 * on the sizes and with the iteration counts the benchmark passes, timed the same way as
 * the ganglion ranks: per size warm-up calls, then timed calls whose median time each rank
 * measures itself. Rank 0 prints one JSON line per size with the average, minimum and
 * maximum of those medians across ranks:
 *
 *     mpirun -np N mpi-allreduce --sizes 4096,16384 --iters 100,100 --warmup 10,10
 *     {"bytes":4096,"iters":100,"time_us_avg":...,"time_us_min":...,"time_us_max":...}
 *
 * The buffer holds zeros, as in the benchmark, so that no overflow or denormal is timed.
 * With --op alltoall it is the peer of `ganglion bench alltoall`: MPI_Alltoallv of bytes /
 * N bytes (rounded down to 4) to every rank, MPI_BYTE, out of place.
 */
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <signal.h>

#include "ganglion/common.h"

#include "report.h"

#define MAX_SIZES 16
#define LIST_CAP 256

/* The peer's flags, in an option table like every ganglion subcommand. */
typedef struct peer_opts {
    char sizes[LIST_CAP], iters[LIST_CAP], warmup[LIST_CAP], op[16];
} peer_opts;

static const gang_param_info peer_items[] = {
    {"sizes", GANG_PARAM_STR, "", 0, 0, "message sizes in bytes, comma-separated",
     offsetof(peer_opts, sizes), 0, 0, LIST_CAP},
    {"iters", GANG_PARAM_STR, "", 0, 0, "timed calls per size, comma-separated",
     offsetof(peer_opts, iters), 0, 0, LIST_CAP},
    {"warmup", GANG_PARAM_STR, "", 0, 0, "warm-up calls per size, comma-separated",
     offsetof(peer_opts, warmup), 0, 0, LIST_CAP},
    {"op", GANG_PARAM_STR, "allreduce", 0, 0, "allreduce or alltoall", offsetof(peer_opts, op), 0,
     0, 16},
};
static const gang_opt_table peer_table = GANG_OPT_TABLE(peer_items);
static const gang_opt_cmd peer_cmd = {
    .name = "mpi-allreduce",
    .synopsis = "--sizes L --iters L --warmup L",
    .about = "Open MPI's MPI_Allreduce timed like `ganglion bench allreduce` (equally long "
             "comma-separated lists)",
    .table = &peer_table,
};

/*
 * Reads the three lists and the operation (*a2a: 1 for alltoall) from argv; returns their
 * common length, 0 after --help, or -1 after printing why they are unusable.
 */
static int parse_peer(int argc, char **argv, int64_t *sizes, int64_t *iters, int64_t *warm,
                      int *a2a)
{
    peer_opts o;
    int rc = gang_opts_cli(&peer_cmd, &o, argc, argv, NULL, NULL);
    if (rc == GANG_OPTS_HELP)
        return 0;
    if (rc != 0)
        return -1;
    *a2a = strcmp(o.op, "alltoall") == 0;
    if (!*a2a && strcmp(o.op, "allreduce") != 0) {
        gang_opts_usage_error(&peer_cmd, "--op must be allreduce or alltoall");
        return -1;
    }
    int ns = gang_parse_i64_list(o.sizes, 4, INT32_MAX, sizes, MAX_SIZES);
    int ni = gang_parse_i64_list(o.iters, 1, INT32_MAX, iters, MAX_SIZES);
    int nw = gang_parse_i64_list(o.warmup, 0, INT32_MAX, warm, MAX_SIZES);
    if (ns <= 0 || ns != ni || ns != nw) {
        gang_opts_usage_error(&peer_cmd,
                              "--sizes, --iters and --warmup must be equally long "
                              "lists of at most %d integers",
                              MAX_SIZES);
        return -1;
    }
    return ns;
}

int main(int argc, char **argv)
{
    int64_t sizes[MAX_SIZES], iters[MAX_SIZES], warm[MAX_SIZES];
    int rank = 0, rc, ns, a2a = 0, world = 1;
    int *cnt = NULL, *disp = NULL;
    int64_t maxb = 0, maxit = 1;
    double *call_us;
    float *buf;

    /* A rank must not outlive mpirun when the benchmark stops it on its deadline. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    ns = parse_peer(argc, argv, sizes, iters, warm, &a2a);
    if (ns <= 0)
        return ns == 0 ? 0 : 2;
    rc = MPI_Init(&argc, &argv);
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "mpi-allreduce: MPI_Init failed (%d)\n", rc);
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int s = 0; s < ns; s++)
        maxb = sizes[s] > maxb ? sizes[s] : maxb;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    /* alltoall: the second half of buf receives; counts and displacements per size below */
    buf = calloc(2 * ((size_t)maxb / sizeof(float) + 1), sizeof(float));
    cnt = calloc((size_t)world, sizeof(int));
    disp = calloc((size_t)world, sizeof(int));
    for (int s = 0; s < ns; s++)
        maxit = iters[s] > maxit ? iters[s] : maxit;
    call_us = calloc((size_t)maxit, sizeof(double));
    if (buf == NULL || cnt == NULL || disp == NULL || call_us == NULL) {
        fprintf(stderr, "mpi-allreduce: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }
    for (int s = 0; s < ns && rc == MPI_SUCCESS; s++) {
        int count = (int)(sizes[s] / (int64_t)sizeof(float));
        double t0 = 0, us, sum = 0, mn = 0, mx = 0;

        for (int p = 0; p < world; p++) {
            cnt[p] = (int)(sizes[s] / world / 4 * 4);
            disp[p] = p * cnt[p];
        }
        for (int64_t i = 0; i < warm[s] + iters[s] && rc == MPI_SUCCESS; i++) {
            t0 = MPI_Wtime();
            if (a2a)
                rc = MPI_Alltoallv(buf, cnt, disp, MPI_BYTE, buf + maxb / 4 + 1, cnt, disp,
                                   MPI_BYTE, MPI_COMM_WORLD);
            else
                rc = MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if (i >= warm[s])
                call_us[i - warm[s]] = (MPI_Wtime() - t0) * 1e6;
        }
        us = gang_report_median(call_us, (int)iters[s]);
        if (rc != MPI_SUCCESS)
            break;
        MPI_Reduce(&us, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        MPI_Reduce(&us, &mn, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
        MPI_Reduce(&us, &mx, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("{\"bytes\":%lld,\"iters\":%lld,\"time_us_avg\":%.3f,\"time_us_min\":%.3f,"
                   "\"time_us_max\":%.3f}\n",
                   (long long)sizes[s], (long long)iters[s], sum / world, mn, mx);
            fflush(stdout);
        }
    }
    if (rc != MPI_SUCCESS)
        fprintf(stderr, "mpi-allreduce: MPI_%s failed (%d)\n", a2a ? "Alltoallv" : "Allreduce", rc);
    free(buf);
    free(cnt);
    free(call_us);
    free(disp);
    MPI_Finalize();
    return rc == MPI_SUCCESS ? 0 : 1;
}
