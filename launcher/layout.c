/*
 * The layout of a gang, and the one place the parameters become the launcher modules'
 * narrow configs (see layout.h). The rules of the layout (data plane, the split's
 * arithmetic, the context length) live here only; the agent, `serve --check-config` and
 * the workers' loaders all call them.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "ganglion/comm.h"
#include "layout.h"
#include "worker.h"

#include <sodium.h>

int gang__worker_uses_nccl(const gang_params *p)
{
    if (p->model[0] == '\0' || strcmp(p->device, "cuda") != 0)
        return 0;
    if (strcmp(p->backend, "nccl") == 0)
        return 1;
    /* auto: nccl where it is built, else the socket backend with host staging. Every
     * rank runs the same binary, so every rank decides alike. */
    return strcmp(p->backend, "auto") == 0 && gang_comm_backend_built(GANG_COMM_NCCL);
}

/*
 * The data plane of the workers (docs/gpu.md, "Serving on the GPU"):
 *   auto    socket on the CPU; on --device cuda the TP / PP groups over nccl (when
 *           NCCL is built; else the socket backend, staged through host memory);
 *   socket  the socket backend everywhere (staged through host memory on cuda);
 *   nccl    TP / PP over nccl; needs --device cuda and a build with NCCL;
 *   mpi     refused: MPI is for the benchmarks and tests, workers do not serve on it.
 * The plan broadcast, the token return and the idle ticks always use a socket world.
 * --device cuda itself is checked by each worker (a GPU per local rank), because the
 * agent must not initialise CUDA before it forks.
 */
static int layout_check_backend(const gang_params *p, char *err, size_t errlen)
{
    if (strcmp(p->backend, "mpi") == 0) {
        snprintf(err, errlen,
                 "--backend mpi: workers cannot serve over MPI (the mpi backend "
                 "is for the benchmarks and tests); use --backend auto, socket or nccl");
        return GANG_EUSAGE;
    }
    if (strcmp(p->backend, "nccl") == 0) {
        if (strcmp(p->device, "cuda") != 0) {
            snprintf(err, errlen,
                     "--backend nccl needs --device cuda (NCCL moves GPU memory; "
                     "--device %s workers use the socket backend: --backend auto or socket)",
                     p->device);
            return GANG_EUSAGE;
        }
        if (!gang_comm_backend_built(GANG_COMM_NCCL)) {
            snprintf(err, errlen,
                     "--backend nccl: this binary was built without NCCL "
                     "(--backend auto or socket stage the GPU traffic through host memory)");
            return GANG_EUSAGE;
        }
    } else if (strcmp(p->backend, "auto") != 0 && strcmp(p->backend, "socket") != 0) {
        snprintf(err, errlen, "--backend %s: not one of auto, socket, nccl", p->backend);
        return GANG_EUSAGE;
    }
    return 0;
}

int gang_layout_from_params(const gang_params *p, gang_layout *l, char *err, size_t errlen)
{
    int64_t world = p->nnodes * p->nproc_per_node;
    memset(l, 0, sizeof(*l));
    gang_strlcpy(l->model, p->model, sizeof(l->model));
    l->tc.nnodes = (int32_t)p->nnodes;
    l->tc.nproc_per_node = (int32_t)p->nproc_per_node;
    l->tc.tp = (int32_t)p->tp;
    l->tc.pp = (int32_t)p->pp;
    l->tc.allow_cross_node_tp = p->allow_cross_node_tp ? 1 : 0;
    l->ep = (uint32_t)p->ep;
    l->tc.ep = (int32_t)p->ep;
    gang_strlcpy(l->device, strcmp(p->device, "auto") == 0 ? "cpu" : p->device, sizeof(l->device));
    l->uses_nccl = gang__worker_uses_nccl(p);
    l->max_ctx = (uint32_t)p->max_ctx;
    l->kv_cache_bytes = (uint64_t)p->kv_cache_mb << 20;
    l->ranks_per_host = (uint32_t)p->nproc_per_node;
    int rc = layout_check_backend(p, err, errlen);
    if (rc != 0)
        return rc;
    if (strcmp(p->dtype, "auto") != 0 && strcmp(p->dtype, "f32") != 0 &&
        strcmp(p->dtype, "bf16") != 0 && strcmp(p->dtype, "f16") != 0) {
        snprintf(err, errlen, "--dtype %s: not one of auto, f32, bf16, f16", p->dtype);
        return GANG_EUSAGE;
    }
    if (strcmp(p->quantize, "none") != 0 && strcmp(p->quantize, "int8") != 0) {
        snprintf(err, errlen, "--quantize %s: not one of none, int8", p->quantize);
        return GANG_EUSAGE;
    }
    uint32_t role;
    if (gang_role_parse(p->role, &role) != 0) {
        snprintf(err, errlen, "--role %s: not one of both, prefill, decode", p->role);
        return GANG_EUSAGE;
    }
    gang_strlcpy(l->dtype, p->dtype, sizeof(l->dtype));
    gang_strlcpy(l->quantize, p->quantize, sizeof(l->quantize));
    l->no_mmap = p->no_mmap;
    l->kv_auto = strcmp(p->kv_cache_dtype, "auto") == 0;
    if (l->kv_auto || strcmp(p->kv_cache_dtype, "f32") == 0) {
        l->kv_dtype = GANG_DTYPE_F32; /* auto: until the weights' storage is known */
    } else if (strcmp(p->kv_cache_dtype, "bf16") == 0) {
        l->kv_dtype = GANG_DTYPE_BF16;
    } else if (strcmp(p->kv_cache_dtype, "f16") == 0) {
        l->kv_dtype = GANG_DTYPE_F16;
    } else {
        snprintf(err, errlen, "--kv-cache-dtype %s: not one of auto, f32, bf16, f16",
                 p->kv_cache_dtype);
        return GANG_EUSAGE;
    }
    /* Without a model and with the default tp = pp = 1 there is nothing to split: such a
     * gang only forms its data plane (tests, network checks). */
    if (p->model[0] == '\0' && p->tp == 1 && p->pp == 1)
        return 0;
    /* A stage is the TP group, or with --ep above --tp the EP group of ep / tp of them. */
    if (p->ep > p->tp && p->ep % p->tp != 0) {
        snprintf(err, errlen,
                 "--ep %lld with --tp %lld: an EP group wider than the TP group must hold "
                 "whole TP groups (--ep a multiple of --tp)",
                 (long long)p->ep, (long long)p->tp);
        return GANG_EUSAGE;
    }
    if (p->ep > p->tp && p->ep * p->pp != world) {
        snprintf(err, errlen,
                 "--ep %lld x --pp %lld = %lld ranks (a stage is the EP group: --tp %lld "
                 "replicated %lld times), but the gang has --nnodes %lld x --nproc-per-node "
                 "%lld = %lld",
                 (long long)p->ep, (long long)p->pp, (long long)(p->ep * p->pp), (long long)p->tp,
                 (long long)(p->ep / p->tp), (long long)p->nnodes, (long long)p->nproc_per_node,
                 (long long)world);
        return GANG_EUSAGE;
    }
    if (p->ep <= p->tp && p->tp * p->pp != world) {
        snprintf(err, errlen,
                 "--tp %lld x --pp %lld = %lld ranks, but the gang has --nnodes "
                 "%lld x --nproc-per-node %lld = %lld",
                 (long long)p->tp, (long long)p->pp, (long long)(p->tp * p->pp),
                 (long long)p->nnodes, (long long)p->nproc_per_node, (long long)world);
        return GANG_EUSAGE;
    }
    if (!p->allow_cross_node_tp && p->nproc_per_node % p->tp != 0) {
        snprintf(err, errlen,
                 "--tp %lld does not divide --nproc-per-node %lld: a TP group "
                 "would span nodes (--allow-cross-node-tp to force it)",
                 (long long)p->tp, (long long)p->nproc_per_node);
        return GANG_EUSAGE;
    }
    return 0;
}

/* The bytes of KV cache one position takes on this rank's largest stage shard, as the
 * engine sizes its blocks (eng_blocks): layers x K and V x kv heads x head_dim x the
 * element size the engine will choose. */
static uint64_t layout_kv_elem_bytes(const gang_layout *l)
{
    if (!l->kv_auto)
        return gang_dtype_size(l->kv_dtype);
    if (strcmp(l->dtype, "bf16") == 0 || strcmp(l->dtype, "f16") == 0)
        return 2;
    return 4;
}

static uint64_t layout_kv_per_position(const gang_layout *l, const gang_topology *t)
{
    uint64_t layers = t->n_layers / t->pp + (t->n_layers % t->pp != 0 ? 1u : 0u);
    return layers * 2u * t->kv_heads_per_rank * t->head_dim * layout_kv_elem_bytes(l);
}

/* l->ctx and l->ctx_why when the model is known (see gang_layout_read_model). */
static void layout_default_ctx(gang_layout *l, const gang_topology *t, uint32_t allowed)
{
    const double mib = 1024.0 * 1024.0;
    l->kv_block_bytes = (uint64_t)t->n_layers * 2u * t->n_kv_heads * t->head_dim *
                        layout_kv_elem_bytes(l) * GANG_KV_BLOCK_DEFAULT;
    if (l->max_ctx > 0) {
        l->ctx = l->max_ctx;
        snprintf(l->ctx_why, sizeof(l->ctx_why), "--max-ctx %u (the model declares %u)", l->max_ctx,
                 allowed);
        return;
    }
    if (l->kv_cache_bytes == 0 && (strcmp(l->device, "cpu") != 0 || l->tc.nnodes > 1)) {
        l->ctx = allowed < GANG_LAYOUT_CTX_CAP ? allowed : GANG_LAYOUT_CTX_CAP;
        snprintf(l->ctx_why, sizeof(l->ctx_why),
                 "the model declares %u; %s, so at most %u without --kv-cache-mb or --max-ctx",
                 allowed,
                 l->tc.nnodes > 1 ? "each node's free memory differs"
                                  : "the device's KV budget is known only after load",
                 GANG_LAYOUT_CTX_CAP);
        return;
    }
    gang_engine_setup s = {.kv_cache_bytes = l->kv_cache_bytes,
                           .ranks_per_host = l->ranks_per_host};
    uint64_t budget = gang_engine_kv_budget(&s, NULL);
    /* Sized from free memory: the workers measure it after their weights took some, so
     * the agent keeps a quarter aside. */
    if (l->kv_cache_bytes == 0)
        budget = budget / 4 * 3;
    uint64_t per_block = layout_kv_per_position(l, t) * GANG_KV_BLOCK_DEFAULT;
    uint64_t blocks = per_block > 0 ? budget / per_block : 0;
    uint64_t need = (uint64_t)(allowed + GANG_KV_BLOCK_DEFAULT - 1) / GANG_KV_BLOCK_DEFAULT;
    const char *src = l->kv_cache_bytes ? "--kv-cache-mb" : "the free memory's share";
    if (blocks >= need || blocks * GANG_KV_BLOCK_DEFAULT < 2) {
        /* Fits; or not even one block fits, and the engine says so with the sizes. */
        l->ctx = allowed;
        snprintf(l->ctx_why, sizeof(l->ctx_why),
                 "the model's declared context: one full sequence takes %.1f MiB of KV "
                 "cache, the budget (%s) is %.1f MiB",
                 (double)need * (double)per_block / mib, src, (double)budget / mib);
        return;
    }
    l->ctx = (uint32_t)(blocks * GANG_KV_BLOCK_DEFAULT);
    snprintf(l->ctx_why, sizeof(l->ctx_why),
             "lowered from the model's %u: one full sequence would take %.1f MiB of KV cache, "
             "the budget (%s) is %.1f MiB",
             allowed, (double)need * (double)per_block / mib, src, (double)budget / mib);
}

int gang_layout_read_model(gang_layout *l, gang_topology *t, char *err, size_t errlen)
{
    gang_topology scratch;
    if (l->model[0] == '\0')
        return 0;
    if (gang_model_config_read(l->model, &l->mc, err, errlen) != 0)
        return GANG_EMODEL;
    /* The model's dimensions, then the gang's shape over them. */
    gang_topology_config shape = l->tc;
    gang_model_topology_config(&l->mc, &l->tc);
    l->tc.nnodes = shape.nnodes;
    l->tc.nproc_per_node = shape.nproc_per_node;
    l->tc.tp = shape.tp;
    l->tc.pp = shape.pp;
    l->tc.allow_cross_node_tp = shape.allow_cross_node_tp;
    l->tc.ep = shape.ep;
    if (gang_topology_init(&l->tc, t ? t : &scratch, err, errlen) != 0)
        return GANG_EUSAGE;
    /* A MoE model: how its experts sit on the TP groups. */
    if (gang_model_moe_layout(&l->mc, (uint32_t)l->tc.tp, l->ep, err, errlen) != 0)
        return GANG_EUSAGE;
    uint32_t allowed = l->mc.max_ctx_allowed > 0 ? l->mc.max_ctx_allowed : l->mc.max_pos;
    if (l->max_ctx > allowed) {
        snprintf(err, errlen, "--max-ctx %u exceeds the model's context %u", l->max_ctx, allowed);
        return GANG_EUSAGE;
    }
    layout_default_ctx(l, t ? t : &scratch, allowed);
    return 0;
}

int gang_layout_check(const gang_params *p, gang_layout *l, char *err, size_t errlen)
{
    int rc = gang_layout_from_params(p, l, err, errlen);
    return rc != 0 ? rc : gang_layout_read_model(l, NULL, err, errlen);
}

int gang_agent_check_layout(const gang_params *p, gang_model_config *mc, uint32_t *ctx, char *why,
                            size_t whylen, char *err, size_t errlen)
{
    gang_layout l;
    int rc = gang_layout_check(p, &l, err, errlen);
    *ctx = rc == 0 ? l.ctx : 0;
    gang_strlcpy(why, rc == 0 ? l.ctx_why : "", whylen);
    if (rc == 0 && l.model[0])
        *mc = l.mc;
    return rc;
}

/* ---------------------------------------------------------------------------------
 * The agent, its supervisor and its API.
 * --------------------------------------------------------------------------------- */

/* The supervisor's part; the workers get every forwarded flag of the prepared p. */
static int sup_config_from_params(const gang_params *p, const gang_identity *id,
                                  gang_sup_config *out)
{
    memset(out, 0, sizeof(*out));
    out->exe = "/proc/self/exe";
    out->node_index = (uint32_t)id->node_index;
    out->nproc_per_node = (uint32_t)p->nproc_per_node;
    out->heartbeat_interval_ms = (uint64_t)p->heartbeat_interval_ms;
    out->heartbeat_timeout_ms = (uint64_t)p->heartbeat_timeout_ms;
    out->abort_timeout_ms = (uint64_t)p->abort_timeout_ms;
    return gang_params_forward_args(p, NULL, &out->worker_args);
}

void gang__served_model_name(const gang_params *p, char *out, size_t cap)
{
    if (p->served_model_name[0] != '\0') {
        gang_strlcpy(out, p->served_model_name, cap);
        return;
    }
    size_t end = strlen(p->model);
    while (end > 1 && p->model[end - 1] == '/')
        end--;
    size_t start = end;
    while (start > 0 && p->model[start - 1] != '/')
        start--;
    size_t n = end - start;
    if (n == 0) { /* "/" */
        gang_strlcpy(out, p->model, cap);
        return;
    }
    if (n >= cap)
        n = cap - 1;
    memcpy(out, p->model + start, n);
    out[n] = '\0';
}

/* See layout.h. */
int gang__api_key_read(const char *path, char *key, char *err, size_t errlen)
{
    char buf[GANG_API_KEY_MAX * 4 + 2];
    key[0] = '\0';
    if (path[0] == '\0')
        return 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "--api-key-file %s: %s", path, strerror(errno));
        return GANG_EUSAGE;
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    size_t a = 0;
    while (a < n && isspace((unsigned char)buf[a]))
        a++;
    while (n > a && isspace((unsigned char)buf[n - 1]))
        n--;
    for (size_t i = a; i < n; i++) {
        if (buf[i] < 0x21 || buf[i] > 0x7e) {
            snprintf(err, errlen, "--api-key-file %s: the key must be printable ASCII", path);
            return GANG_EUSAGE;
        }
    }
    if (n == a || n - a > GANG_API_KEY_MAX) {
        snprintf(err, errlen, "--api-key-file %s: the key must have 1 to %d bytes", path,
                 GANG_API_KEY_MAX);
        return GANG_EUSAGE;
    }
    memcpy(key, buf + a, n - a);
    key[n - a] = '\0';
    sodium_memzero(buf, sizeof(buf));
    return 0;
}

static void api_config_from_params(const gang_params *p, const gang_layout *l, gang_api_config *out)
{
    memset(out, 0, sizeof(*out));
    gang_strlcpy(out->model_dir, l->model, sizeof(out->model_dir));
    gang__served_model_name(p, out->model, sizeof(out->model));
    out->has_model = l->model[0] != '\0';
    if (out->has_model)
        out->mc = l->mc;
    out->ctx = l->ctx;
    gang_strlcpy(out->ctx_why, l->ctx_why, sizeof(out->ctx_why));
    out->kv_block_bytes = l->kv_block_bytes;
    out->max_queue = (uint32_t)p->max_queue;
    out->request_timeout_ms = (uint64_t)p->request_timeout_ms;
    (void)gang_role_parse(p->role, &out->role); /* checked by gang_layout_from_params */
    out->kv_port = (uint32_t)p->kv_port;
}

/* The agent's own scalars and strings (everything but identity, secrets and layout). */
static void agent_fields_from_params(const gang_params *p, gang_agent_config *c)
{
    gang_strlcpy(c->job_name, p->job_name, sizeof(c->job_name));
    gang_strlcpy(c->bind_address, p->bind_address, sizeof(c->bind_address));
    gang_strlcpy(c->advertise_address, p->advertise_address, sizeof(c->advertise_address));
    gang_strlcpy(c->termination_log, p->termination_log, sizeof(c->termination_log));
    c->http_port = (int)p->http_port;
    c->http_max_connections = (int)p->http_max_connections;
    gang_strlcpy(c->cors_allow_origin, p->cors_allow_origin, sizeof(c->cors_allow_origin));
    c->rdzv_port = (int)p->rdzv_port;
    c->max_restarts = (uint32_t)p->max_restarts;
    c->max_connections = (uint32_t)p->max_connections;
    c->heartbeat_interval_ms = (uint64_t)p->heartbeat_interval_ms;
    c->heartbeat_timeout_ms = (uint64_t)p->heartbeat_timeout_ms;
    c->handshake_timeout_ms = (uint64_t)p->handshake_timeout_ms;
    c->start_timeout_ms = (uint64_t)p->start_timeout_ms;
    c->connect_timeout_ms = (uint64_t)p->connect_timeout_ms;
    c->dns_backoff_initial_ms = (uint64_t)p->dns_backoff_initial_ms;
    c->dns_backoff_max_ms = (uint64_t)p->dns_backoff_max_ms;
    c->restart_window_ms = (uint64_t)p->restart_window_s * 1000;
    c->restart_backoff_ms = (uint64_t)p->restart_backoff_ms;
    c->restart_backoff_max_ms = (uint64_t)p->restart_backoff_max_ms;
    c->give_up_linger_ms = (uint64_t)p->give_up_linger_ms;
    c->rendezvous_timeout_ms = (uint64_t)p->rendezvous_timeout_ms;
}

/*
 * The checks run in the order the agent has always run them (identity, token, model
 * digest, layout), so that the first problem is the one reported.
 */
int gang_agent_config_from_params(const gang_params *params, char *const *envp,
                                  gang_agent_config *out, char *err, size_t errlen)
{
    char why[400];
    int rc;
    gang_params *p = malloc(sizeof(*p)); /* prepared copy; gone when this returns */
    memset(out, 0, sizeof(*out));
    if (p == NULL)
        return GANG_ENOMEM;
    *p = *params;
    gang_strlcpy(out->termination_log, p->termination_log, sizeof(out->termination_log));
    rc = gang_agent_prepare(p, envp, &out->id, err, errlen);
    if (rc != 0) {
        rc = GANG_EUSAGE;
        goto out_free;
    }
    rc = gang_auth_init();
    if (rc == 0)
        rc = gang_auth_load_token(p->token_file, &out->token, why, sizeof(why));
    if (rc != 0) {
        snprintf(err, errlen, "token: %s", why);
        rc = GANG_EUSAGE;
        goto out_free;
    }
    rc = gang_model_digest(p->model, out->digest);
    if (rc != 0) {
        snprintf(err, errlen, "model directory '%s': %s", p->model, gang_strerror(rc));
        rc = GANG_EMODEL;
        goto out_free;
    }
    rc = gang_layout_check(p, &out->layout, err, errlen);
    if (rc != 0)
        goto out_free;
    /* The workers serve the context chosen here, whatever their own view of free memory. */
    if (out->layout.model[0] != '\0')
        p->max_ctx = out->layout.ctx;
    if (out->layout.model[0] != '\0')
        gang_info("agent: context %u positions: %s", out->layout.ctx, out->layout.ctx_why);
    agent_fields_from_params(p, out);
    api_config_from_params(p, &out->layout, &out->api);
    rc = gang__api_key_read(p->api_key_file, out->api.api_key, err, errlen);
    if (rc != 0)
        goto out_free;
    rc = sup_config_from_params(p, &out->id, &out->sup);
    if (rc != 0)
        snprintf(err, errlen, "out of memory");
out_free:
    free(p);
    return rc;
}

void gang_agent_config_free(gang_agent_config *c)
{
    gang_args_free(&c->sup.worker_args);
}

/* ---------------------------------------------------------------------------------
 * The worker and its engine glue.
 * --------------------------------------------------------------------------------- */

static void wres_config_from_params(const gang_params *p, const gang_layout *l,
                                    gang__wres_config *out)
{
    memset(out, 0, sizeof(*out));
    out->layout = *l;
    out->gpu_memory_mb = (uint64_t)p->gpu_memory_mb;
    out->gpu_memory_percent = (uint32_t)p->gpu_memory_percent;
    out->share_gpus = p->share_gpus ? 1u : 0u;
    out->max_batch = (uint32_t)p->max_batch;
    out->microbatches = (uint32_t)p->microbatches;
    out->max_step_tokens = (uint32_t)p->max_step_tokens;
    out->kv_cache_bytes = (uint64_t)p->kv_cache_mb << 20;
    out->prefix_caching = p->enable_prefix_caching ? 1u : 0u;
    out->cuda_graphs = p->cuda_graphs ? 1u : 0u;
    out->gpu_pool_split = p->gpu_pool_split ? 1u : 0u;
    out->cuda_pdl = p->cuda_pdl ? 1u : 0u;
    (void)gang_role_parse(p->role, &out->role); /* checked by gang_layout_from_params */
    out->kv_port = (uint32_t)p->kv_port;
    gang_strlcpy(out->kv_bind, p->bind_address, sizeof(out->kv_bind));
    gang_strlcpy(out->kv_advertise, p->advertise_address[0] ? p->advertise_address : "127.0.0.1",
                 sizeof(out->kv_advertise));
    out->kv_timeout_ms = (uint64_t)p->kv_transfer_timeout_ms;
    out->kv_store_bytes = (uint64_t)p->kv_export_mb << 20;
    out->kv_hold_ms = (uint64_t)p->kv_export_hold_ms;
}

int gang_worker_config_from_params(const gang_params *p, const char *agent_path,
                                   uint32_t local_rank, gang_worker_config *out, char *err,
                                   size_t errlen)
{
    gang_layout l;
    memset(out, 0, sizeof(*out));
    if (agent_path[0] == '\0' ||
        gang_strlcpy(out->agent_path, agent_path, sizeof(out->agent_path)) != 0) {
        snprintf(err, errlen, "--agent-socket '%s' is empty or longer than %zu bytes", agent_path,
                 sizeof(out->agent_path) - 1);
        return GANG_EUSAGE;
    }
    if (gang_log_parse_format(p->log_format, &out->log_format) != 0 ||
        gang_log_parse_level(p->log_level, &out->log_level) != 0) {
        snprintf(err, errlen, "bad --log-format '%s' or --log-level '%s'", p->log_format,
                 p->log_level);
        return GANG_EUSAGE;
    }
    int rc = gang_layout_from_params(p, &l, err, errlen);
    if (rc != 0)
        return rc;
    out->local_rank = local_rank;
    out->node = (int)p->node_index;
    out->nproc_per_node = (uint32_t)p->nproc_per_node;
    out->heartbeat_interval_ms = (uint64_t)p->heartbeat_interval_ms;
    out->heartbeat_timeout_ms = (uint64_t)p->heartbeat_timeout_ms;
    out->start_timeout_ms = (uint64_t)p->start_timeout_ms;
    out->step_timeout_ms = (uint64_t)p->step_timeout_ms;
    gang_strlcpy(out->job, p->job_name, sizeof(out->job));
    gang_strlcpy(out->advertise, p->advertise_address[0] ? p->advertise_address : "127.0.0.1",
                 sizeof(out->advertise));
    gang_strlcpy(out->device, p->device, sizeof(out->device));
    gang_strlcpy(out->backend, p->backend, sizeof(out->backend));
    gang_strlcpy(out->nvml_library, p->nvml_library, sizeof(out->nvml_library));
    out->gpu_health_interval_ms = (uint64_t)p->gpu_health_interval_ms;
    out->gpu_bind = p->gpu_bind != 0;
    wres_config_from_params(p, &l, &out->res);
    /* The KV transfers of P/D authenticate with the gang's token (worker-kv.c). */
    char why[256] = "libsodium did not initialise";
    if (gang_auth_init() != 0 ||
        gang_auth_load_token(p->token_file, &out->res.kv_token, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "token: %s", why);
        return GANG_EUSAGE;
    }
    return 0;
}
