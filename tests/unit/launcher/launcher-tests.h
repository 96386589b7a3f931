/* Test groups of the launcher binary; each returns the number of failed tests. */
#ifndef GANG_LAUNCHER_TESTS_H
#define GANG_LAUNCHER_TESTS_H
int gang_test_worker(void);
int gang_test_config(void);
int gang_test_gpu(void);
int gang_test_fwd(void);
int gang_test_wctl(void);
int gang_test_proc(void);
#endif
