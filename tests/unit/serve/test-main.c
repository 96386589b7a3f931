/* The serve module's cmocka binary: every group of the module runs from here. */
#include <stdio.h>

#include "serve-tests.h"

int main(void)
{
    int failed = 0;
    failed += gang_test_http();
    failed += gang_test_metrics();
    failed += gang_test_tools();
    return failed ? 1 : 0;
}
