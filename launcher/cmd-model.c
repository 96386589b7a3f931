/* placeholder: ganglion mkmodel (in progress) */
#include <stdio.h>

#include "cmds.h"
#include "ganglion/common.h"

int gang_cmd_mkmodel(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ganglion mkmodel: not available yet\n");
    return GANG_EXIT_USAGE;
}
