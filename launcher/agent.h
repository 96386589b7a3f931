/* The per-Pod agent (internal to launcher/); see agent.c. */
#ifndef GANGLION_LAUNCHER_AGENT_H
#define GANGLION_LAUNCHER_AGENT_H

#include <stddef.h>

#include "ganglion/serve.h"
#include "ganglion/rendezvous.h"
#include "layout.h"
#include "supervisor.h"

/*
 * Resolves identity and derived settings (advertise address, nnodes from the identity
 * source) into p and id, validating them. Returns 0 or GANG_EUSAGE with a message in err.
 * Used by `serve` and by `serve --check-config`.
 */
int gang_agent_prepare(gang_params *p, char *const *envp, gang_identity *id, char *err,
                       size_t errlen);
/*
 * Checks that the layout can work before anything starts (gang_layout_check: device and
 * backend, tp x pp = nnodes x nproc_per_node, TP groups inside a node, and with --model
 * its config.json and the split of its heads / ffn / layers). Fills *mc (with a model)
 * and *ctx (the context length, 0 without a model) and why[whylen] (why that length;
 * gang_layout.ctx_why). Returns 0, GANG_EUSAGE (exit 2) or
 * GANG_EMODEL (exit 3) with a message in err.
 */
int gang_agent_check_layout(const gang_params *p, gang_model_config *mc, uint32_t *ctx, char *why,
                            size_t whylen, char *err, size_t errlen);

/* What the agent needs, and what it hands to its supervisor and API. */
typedef struct gang_agent_config {
    gang_identity id;                 /* who this node is (gang_agent_prepare) */
    gang_layout layout;               /* shape (nnodes, nproc_per_node, tp, pp), model, ctx */
    gang_token token;                 /* --token-file, loaded */
    uint8_t digest[GANG_DIGEST_SIZE]; /* of --model (all zero without one) */
    char job_name[GANG_PARAM_STR_MAX];
    char bind_address[GANG_PARAM_STR_MAX];
    char advertise_address[GANG_PARAM_STR_MAX];
    char termination_log[GANG_PARAM_STR_MAX];
    int http_port;
    int http_max_connections;                   /* --http-max-connections */
    char cors_allow_origin[GANG_PARAM_STR_MAX]; /* --cors-allow-origin, "" = off */
    int rdzv_port;
    uint32_t max_restarts;
    uint32_t max_connections;
    uint64_t heartbeat_interval_ms;
    uint64_t heartbeat_timeout_ms;
    uint64_t handshake_timeout_ms;
    uint64_t start_timeout_ms;
    uint64_t connect_timeout_ms;
    uint64_t dns_backoff_initial_ms;
    uint64_t dns_backoff_max_ms;
    uint64_t restart_window_ms;
    uint64_t restart_backoff_ms;
    uint64_t restart_backoff_max_ms;
    uint64_t give_up_linger_ms;
    uint64_t rendezvous_timeout_ms;
    gang_sup_config sup; /* the workers (owns the forwarded flags) */
    gang_api_config api; /* the coordinator's inference API */
} gang_agent_config;

/*
 * Derives the agent's config from the effective parameters p (layout.c): identity
 * (gang_agent_prepare, on a copy of p), the token, the model digest, the layout
 * (gang_layout_check), and the supervisor's and API's configs, with the workers' flags
 * forwarded from the prepared parameters. Returns 0, or GANG_EUSAGE (identity, token,
 * layout), GANG_EMODEL (model directory or config.json) or GANG_ENOMEM with a message in
 * err. Release with gang_agent_config_free.
 */
int gang_agent_config_from_params(const gang_params *p, char *const *envp, gang_agent_config *out,
                                  char *err, size_t errlen);
void gang_agent_config_free(gang_agent_config *c);

/* Runs one agent until it stops; returns the process exit code. */
int gang_agent_main(const gang_params *p, char *const *envp);

#endif
