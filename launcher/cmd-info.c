/* placeholder: ganglion info (in progress) */
#include <stdio.h>

#include "cmds.h"
#include "ganglion/common.h"

int gang_cmd_info(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("ganglion info: GPU discovery is not built into this binary yet\n");
    return GANG_EXIT_OK;
}
