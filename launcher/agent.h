/* The per-Pod agent (internal to launcher/); see agent.c. */
#ifndef GANGLION_LAUNCHER_AGENT_H
#define GANGLION_LAUNCHER_AGENT_H

#include <stddef.h>

#include "ganglion/rendezvous.h"

/*
 * Resolves identity and derived settings (advertise address, nnodes from the identity
 * source) into p and id, validating them. Returns 0 or GANG_EUSAGE with a message in err.
 * Used by `serve` and by `serve --check-config`.
 */
int gang_agent_prepare(gang_params *p, char *const *envp, gang_identity *id, char *err,
                       size_t errlen);
/* Runs one agent until it stops; returns the process exit code. */
int gang_agent_main(const gang_params *p, char *const *envp);

#endif
