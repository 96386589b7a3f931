/* Test groups of the serve binary; each returns the number of failed tests. */
#ifndef GANG_SERVE_TESTS_H
#define GANG_SERVE_TESTS_H
int gang_test_http(void);
int gang_test_metrics(void);
int gang_test_tools(void);
#endif
