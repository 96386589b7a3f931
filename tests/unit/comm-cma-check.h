/* The probe of the socket backend's single-copy path (comm-cma-check.c), in unit-comm. */
#ifndef GANG_TEST_COMM_CMA_CHECK_H
#define GANG_TEST_COMM_CMA_CHECK_H

/* cmocka test: probe, read and every refusal against a forked peer (skips where the kernel
 * refuses process_vm_readv). */
void gang_test_cma_probe(void **state);

#endif
