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
struct gang_model_config;
/*
 * Checks that the layout can work before anything starts: device and backend this
 * version serves with, tp x pp = nnodes x nproc_per_node, TP groups inside a node, and
 * with --model its config.json and the split of its heads / ffn / layers (the
 * topology's rules). Fills *mc (with a model) and *ctx (the context length, 0 without a
 * model). Returns 0, GANG_EUSAGE (exit 2) or GANG_EMODEL (exit 3) with a message in err.
 */
int gang_agent_check_layout(const gang_params *p, struct gang_model_config *mc, uint32_t *ctx,
                            char *err, size_t errlen);
int gang_agent_main(const gang_params *p, char *const *envp);

#endif
