/* placeholder: ganglion bench gemm (in progress) */
#include <stdio.h>

#include "cmds.h"
#include "ganglion/common.h"

int gang_bench_gemm_main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ganglion bench gemm: not available yet\n");
    return GANG_EXIT_USAGE;
}
