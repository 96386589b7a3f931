/* The rendezvous module's cmocka binary: every group of the module runs from here. */
#include <stdio.h>

#include "rdzv-tests.h"

int main(void)
{
    int failed = 0;
    failed += gang_test_wire();
    failed += gang_test_auth();
    failed += gang_test_identity();
    failed += gang_test_coordinator();
    return failed ? 1 : 0;
}
