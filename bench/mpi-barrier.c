/*
 * The peer of `ganglion bench rendezvous`: the smallest complete MPI job. mpirun starts
 * N copies, they wire up (MPI_Init), meet once (MPI_Barrier) and leave (MPI_Finalize),
 * which is the MPI equivalent of a ganglion gang forming and reporting READY. The
 * benchmark times `mpirun -np N mpi-barrier` from fork to exit.
 */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int rc = MPI_Init(&argc, &argv);

    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "mpi-barrier: MPI_Init failed (%d)\n", rc);
        return 1;
    }
    rc = MPI_Barrier(MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS)
        fprintf(stderr, "mpi-barrier: MPI_Barrier failed (%d)\n", rc);
    MPI_Finalize();
    return rc == MPI_SUCCESS ? 0 : 1;
}
