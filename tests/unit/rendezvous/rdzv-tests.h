/* Test groups of the rendezvous binary; each returns the number of failed tests. */
#ifndef GANG_RDZV_TESTS_H
#define GANG_RDZV_TESTS_H
int gang_test_wire(void);
int gang_test_auth(void);
int gang_test_identity(void);
int gang_test_coordinator(void);
#endif
