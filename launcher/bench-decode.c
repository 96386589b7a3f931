/* placeholder: ganglion bench decode (in progress) */
#include <stdio.h>

#include "cmds.h"
#include "ganglion/common.h"

int gang_bench_decode_main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ganglion bench decode: not available yet\n");
    return GANG_EXIT_USAGE;
}
