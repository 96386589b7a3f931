/*
 * The layout of a gang (internal to launcher/): what the parameters decide about its
 * shape, device, data plane and context length, derived by one set of rules for every
 * process that needs it (the agent before it starts anything, `serve --check-config`, and
 * each worker's model loader).
 *
 * launcher/layout.c is also the one place where the parameter registry (gang_params)
 * becomes the narrow configs of the launcher's modules: gang_agent_config_from_params
 * (agent.h, which fills the supervisor's and the API's too) and
 * gang_worker_config_from_params (worker.h, which fills the engine glue's). No module
 * keeps a copy of gang_params.
 */
#ifndef GANGLION_LAUNCHER_LAYOUT_H
#define GANGLION_LAUNCHER_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/common.h"
#include "ganglion/model.h"
#include "ganglion/parallel.h"

/* Where the KV budget is known only on the device (--device cuda without --kv-cache-mb),
 * a context longer than this is used only when --max-ctx asks for it. */
#define GANG_LAYOUT_CTX_CAP 4096
#define GANG_LAYOUT_WHY_MAX 256 /* bytes of gang_layout.ctx_why */

typedef struct gang_layout {
    char model[GANG_PARAM_STR_MAX]; /* --model directory; "" = none */
    gang_topology_config tc;        /* the gang's shape (nnodes, nproc_per_node, tp, pp,
                                       allow_cross_node_tp); the model's dimensions too once
                                       gang_layout_read_model has run */
    char device[16];                /* compute device: "cpu" or "cuda" (auto -> cpu) */
    int uses_nccl;                  /* TP / PP groups over nccl (gang__worker_uses_nccl) */
    uint32_t max_ctx;               /* --max-ctx; 0 = the model's when one sequence fits */
    uint64_t kv_cache_bytes;        /* --kv-cache-mb in bytes; 0 = sized from free memory */
    uint32_t ranks_per_host;        /* --nproc-per-node (the host budget's divisor) */
    gang_dtype kv_dtype;            /* --kv-cache-dtype (auto -> f32 until the weights'
                                       storage is known: gang_engine_setup_config) */
    int kv_auto;                    /* --kv-cache-dtype auto */
    char dtype[8];                  /* --dtype: auto, f32, bf16, f16 */
    char quantize[8];               /* --quantize: none, int8 */
    uint32_t ep;                    /* --ep: a MoE model's experts over the TP group (1 or tp) */
    int no_mmap;                    /* --no-mmap: a GGUF file's blocks read, not mapped */
    /* Filled by gang_layout_read_model: */
    gang_model_config mc;              /* config.json */
    uint32_t ctx;                      /* positions per sequence; 0 without a model */
    char ctx_why[GANG_LAYOUT_WHY_MAX]; /* why ctx is what it is (the log, /v1/models) */
} gang_layout;

/*
 * Derives the parameter-only part of the layout from p and checks it: the backend this
 * version serves with (auto, socket, or nccl with --device cuda in a build with NCCL),
 * and, with a model or a --tp / --pp other than 1, tp x pp = nnodes x nproc_per_node with
 * TP groups inside a node unless --allow-cross-node-tp. No I/O. Returns 0, or GANG_EUSAGE
 * with a message in err.
 */
int gang_layout_from_params(const gang_params *p, gang_layout *l, char *err, size_t errlen);

/*
 * With a model (l->model non-empty): reads its config.json into l->mc, completes l->tc
 * with its dimensions, checks the split with gang_topology_init (into *t when t is not
 * NULL) and derives l->ctx and l->ctx_why: --max-ctx when given (one above the model's
 * context is refused); else the model's declared context when one full sequence of it
 * fits in this rank's KV budget (--kv-cache-mb, or on the CPU the share of MemAvailable
 * the engine will take, gang_engine_kv_budget), else the longest context whose sequence
 * fits, in whole KV blocks (as vLLM: the model's length unless the memory cannot hold
 * it). With --device cuda and no --kv-cache-mb the budget is the device pool's, known
 * only after the weights are loaded: the model's context capped at GANG_LAYOUT_CTX_CAP.
 * The KV element size is the one the engine will pick (f32, or 2 bytes when --dtype or
 * --kv-cache-dtype says bf16 / f16). Without a model it does nothing. Returns 0, GANG_EMODEL
 * (config.json) or GANG_EUSAGE (the split, the context), with a message in err.
 */
int gang_layout_read_model(gang_layout *l, gang_topology *t, char *err, size_t errlen);

/* Both of the above: what the agent and `serve --check-config` check before starting. */
int gang_layout_check(const gang_params *p, gang_layout *l, char *err, size_t errlen);

/*
 * The model's name in the API (gang_api_config.model): --served-model-name, else the base
 * name of --model without trailing slashes ("/models/llama/" -> "llama"; "/" stays "/";
 * "" without a model). Writes at most cap - 1 bytes and a NUL into out.
 */
void gang__served_model_name(const gang_params *p, char *out, size_t cap);
/*
 * Reads the API key of --api-key-file PATH into key[GANG_API_KEY_MAX + 1]: the file's
 * content without surrounding whitespace, 1 to GANG_API_KEY_MAX printable ASCII bytes.
 * PATH "": an empty key (an open API). GANG_EUSAGE with the reason in err otherwise (a
 * missing or unreadable file, an empty or too long key, a non-printable byte; the message
 * never holds the key).
 */
int gang__api_key_read(const char *path, char *key, char *err, size_t errlen);

#endif
