/* The all-to-all(v) conformance checks (comm-a2a-check.c), shared by unit-comm and mpi-comm. */
#ifndef GANG_TEST_COMM_A2A_CHECK_H
#define GANG_TEST_COMM_A2A_CHECK_H

#include <stddef.h>

#include "ganglion/comm.h"

/*
 * Runs every all-to-all(v) check on c; every rank of c must call it. big adds 1 MiB between
 * every pair. 0, or a negative code with the first difference described in why.
 */
int gang_test_a2a_check(gang_comm *c, int big, char *why, size_t cap);

#endif
