/*
 * The peer of `ganglion bench allreduce`: Open MPI's MPI_Allreduce (f32, sum, in place)
 * on the sizes and with the iteration counts the benchmark passes, timed the same way as
 * the ganglion ranks: per size warm-up calls, then a timed loop whose mean time per call
 * each rank measures itself. Rank 0 prints one JSON line per size with the average,
 * minimum and maximum of those times across ranks:
 *
 *     mpirun -np N mpi-allreduce --sizes 4096,16384 --iters 100,100 --warmup 10,10
 *     {"bytes":4096,"iters":100,"time_us_avg":...,"time_us_min":...,"time_us_max":...}
 *
 * The buffer holds zeros, as in the benchmark, so that no overflow or denormal is timed.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <signal.h>

#define MAX_SIZES 16

/* Parses "a,b,c" into at most MAX_SIZES longs >= lo; returns the count or -1. */
static int parse_list(const char *s, long *out, long lo)
{
    int n = 0;

    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < lo || n >= MAX_SIZES || (*end != ',' && *end != '\0'))
            return -1;
        out[n++] = v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

int main(int argc, char **argv)
{
    long sizes[MAX_SIZES], iters[MAX_SIZES], warm[MAX_SIZES];
    int ns = -1, ni = -2, nw = -3;
    int rank = 0, rc;
    long maxb = 0;
    float *buf;

    /* A rank must not outlive mpirun when the benchmark stops it on its deadline. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--sizes") == 0)
            ns = parse_list(argv[i + 1], sizes, 4);
        else if (strcmp(argv[i], "--iters") == 0)
            ni = parse_list(argv[i + 1], iters, 1);
        else if (strcmp(argv[i], "--warmup") == 0)
            nw = parse_list(argv[i + 1], warm, 0);
    }
    if (ns <= 0 || ns != ni || ns != nw) {
        fprintf(stderr, "usage: mpi-allreduce --sizes L --iters L --warmup L "
                        "(equally long comma-separated lists)\n");
        return 2;
    }
    rc = MPI_Init(&argc, &argv);
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "mpi-allreduce: MPI_Init failed (%d)\n", rc);
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int s = 0; s < ns; s++)
        maxb = sizes[s] > maxb ? sizes[s] : maxb;
    buf = calloc((size_t)maxb / sizeof(float) + 1, sizeof(float));
    if (buf == NULL) {
        fprintf(stderr, "mpi-allreduce: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }
    for (int s = 0; s < ns && rc == MPI_SUCCESS; s++) {
        int count = (int)(sizes[s] / (long)sizeof(float));
        double t0, us, sum = 0, mn = 0, mx = 0;
        int world = 1;

        for (long i = 0; i < warm[s] && rc == MPI_SUCCESS; i++)
            rc = MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        for (long i = 0; i < iters[s] && rc == MPI_SUCCESS; i++)
            rc = MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        us = (MPI_Wtime() - t0) * 1e6 / (double)iters[s];
        if (rc != MPI_SUCCESS)
            break;
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        MPI_Reduce(&us, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        MPI_Reduce(&us, &mn, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
        MPI_Reduce(&us, &mx, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("{\"bytes\":%ld,\"iters\":%ld,\"time_us_avg\":%.3f,\"time_us_min\":%.3f,"
                   "\"time_us_max\":%.3f}\n",
                   sizes[s], iters[s], sum / world, mn, mx);
            fflush(stdout);
        }
    }
    if (rc != MPI_SUCCESS)
        fprintf(stderr, "mpi-allreduce: MPI_Allreduce failed (%d)\n", rc);
    free(buf);
    MPI_Finalize();
    return rc == MPI_SUCCESS ? 0 : 1;
}
