/* The launcher module's cmocka binary: every group of the module runs from here. */
#include <stdio.h>

#include "launcher-tests.h"

int main(void)
{
    int failed = 0;
    failed += gang_test_worker();
    failed += gang_test_config();
    failed += gang_test_gpu();
    failed += gang_test_fwd();
    failed += gang_test_wctl();
    failed += gang_test_proc();
    return failed ? 1 : 0;
}
