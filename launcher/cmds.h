/*
 * Entry points of the subcommands that live in their own files (internal to launcher/).
 * Each takes argv with argv[0] = the subcommand's own name ("mkmodel", "info", ...), as
 * every command of main.c's table does, and returns a process exit code of the contract
 * (0, 2 usage, 3 model, 70, 75).
 */
#ifndef GANGLION_LAUNCHER_CMDS_H
#define GANGLION_LAUNCHER_CMDS_H

#include <stdint.h>

/* ganglion mkmodel --out DIR [...]: writes a deterministic random model (cmd-model.c). */
int gang_cmd_mkmodel(int argc, char **argv);

/* ganglion generate --model DIR --prompt-ids 1,2,3 [...]: one prompt through a local gang. */
int gang_cmd_generate(int argc, char **argv);

/* ganglion info [--labels]: GPU discovery (cmd-info.c). */
int gang_cmd_info(int argc, char **argv);
/* ganglion info --model PATH (cmd-info-model.c): prints what the model needs for tp x pp
 * and the layouts it allows. Returns an exit code (3 for a model that cannot be read). */
int gang__info_model(const char *path, int64_t tp, int64_t pp, int64_t ep);
/* ganglion info (cmd-info-topo.c): the GPU topology NVML (library lib, "" = the driver's)
 * reports and the placement of nproc local ranks (0 = one per GPU) in TP groups of tp.
 * Prints a line and returns 0 when NVML is absent. Returns an exit code. */
int gang__info_topology(const char *lib, int64_t nproc, int64_t tp);

#endif
