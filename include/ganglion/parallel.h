/*
 * ganglion parallel module: the gang topology (which rank does what), the data-plane
 * bootstrap blob, the tensor-parallel layers and the pipeline schedule. The communicator
 * front and its backends are declared in ganglion/comm.h, the module's other header.
 *
 * No CUDA, NCCL, MPI or libuv types appear here. Everything in the topology part is pure
 * arithmetic on plain structs: it allocates nothing, keeps no global state and is safe to
 * call from any thread, as long as a gang_topology is not written while it is read.
 */
#ifndef GANGLION_PARALLEL_H
#define GANGLION_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/common.h"

/* =================================================================================
 * Topology: rank numbering
 *
 * The gang has world = nnodes x nproc_per_node ranks. Ranks are numbered node by node:
 *
 *     rank = node x nproc_per_node + local_rank
 *
 * and the world is cut into pp pipeline stages of tp ranks each:
 *
 *     pp_stage = rank / tp          tp_rank = rank % tp
 *
 * so a tensor-parallel group is tp consecutive ranks. Tensor parallelism all-reduces
 * twice per layer and wants NVLink, so a TP group must sit on one node: tp must divide
 * nproc_per_node. allow_cross_node_tp lifts that rule for tests and for odd clusters;
 * the numbering does not change, a group then simply straddles a node boundary.
 * Pipeline stages exchange only one activation tensor per microbatch, so they may (and
 * on multi-node gangs usually do) span nodes: with nproc_per_node = tp, stage i is node i.
 *
 * Pipeline neighbours keep their tp_rank: rank r of stage s sends its activations to
 * rank r + tp (same tp_rank, stage s + 1), so every TP rank has its own point-to-point
 * link and no stage has to gather before sending.
 *
 * Expert parallelism wider than TP (ep = k x tp, k > 1; a MoE model's --ep): a stage is
 * then stage_ranks = ep consecutive ranks, holding k replicas of the TP group:
 *
 *     pp_stage = rank / ep          ep_rank = rank % ep
 *     tp_replica = ep_rank / tp     tp_rank = ep_rank % tp
 *
 * so a TP group is still tp consecutive ranks (the attention and dense layers, the same
 * on every replica), the stage's ep ranks form the EP group (the experts and their
 * all-to-alls), the world is ep x pp, and pipeline neighbours are rank +- ep (same
 * ep_rank). With ep <= tp (ep 1 or ep = tp) stage_ranks = tp, k = 1, ep_rank = tp_rank
 * and everything above holds unchanged.
 *
 * =================================================================================
 * Topology: the Megatron split of a transformer layer across a TP group
 *
 * A linear layer Y = X W can be split two ways across tp ranks:
 *
 *   column-parallel  W = [W_0 | W_1 | ... ]  (split by output columns). Rank r computes
 *                    Y_r = X W_r, a slice of the output columns. It needs the full
 *                    input X and produces a sharded output; no communication.
 *   row-parallel     W = [W_0 ; W_1 ; ... ]  (split by input rows). Rank r computes the
 *                    partial product P_r = X_r W_r from its slice X_r of the input
 *                    columns; Y = sum_r P_r, which is one all-reduce of a full-size Y.
 *
 * Megatron-LM chains the two so that the sharded output of the first is exactly the
 * sharded input of the second, with anything elementwise in between done locally:
 *
 *   MLP        gate and up projections (hidden x ffn) are column-parallel over the ffn
 *              columns [ffn_first, ffn_first + ffn_count); SiLU(gate) * up is elementwise
 *              so it runs on the local columns; the down projection (ffn x hidden) is
 *              row-parallel over the SAME rows [ffn_first, ffn_first + ffn_count); one
 *              all-reduce of the (tokens x hidden) output.
 *   attention  Q, K and V projections are column-parallel by heads: rank r holds the
 *              query heads [head_first, head_first + head_count) and the key/value heads
 *              [kv_head_first, kv_head_first + kv_head_count), each head being head_dim
 *              consecutive columns. Attention is per head, so it runs locally. The output
 *              projection is row-parallel over the rows of the local query heads,
 *              [head_first x head_dim, (head_first + head_count) x head_dim); one
 *              all-reduce.
 *
 * So a layer costs two all-reduces in the forward pass and nothing else. Grouped-query
 * attention: query head h reads key/value head h / (n_heads / n_kv_heads). When
 * tp <= n_kv_heads the kv heads are split like the query heads (tp must divide
 * n_kv_heads). When tp > n_kv_heads there are not enough kv heads to go round: each kv
 * head is replicated on kv_replicas = tp / n_kv_heads consecutive ranks, rank r holding
 * kv head r / kv_replicas (tp must be a multiple of n_kv_heads). In both cases the query
 * heads of a rank read only kv heads the rank holds, so attention never communicates.
 *
 * The LM head (hidden x vocab) may be column-parallel over the vocabulary; rank r then
 * produces the logits of [vocab_first, vocab_first + vocab_count) and the caller gathers
 * them (or reduces a local argmax). The vocabulary need not divide by tp: the first
 * vocab % tp ranks hold one extra entry. Callers that keep the LM head whole on every
 * rank simply ignore the vocab range.
 * ================================================================================= */

/* Upper bound on the world size; keeps every rank representable in an int32_t. */
#define GANG_TOPOLOGY_MAX_WORLD 65536

/*
 * What the caller asks for. Fields are signed so that a negative value coming from a
 * flag or a config file is reported as such rather than wrapped into a huge unsigned one.
 */
typedef struct gang_topology_config {
    int32_t nnodes;              /* nodes (Pods) in the gang, >= 1 */
    int32_t nproc_per_node;      /* ranks (GPUs) per node, >= 1 */
    int32_t tp;                  /* tensor-parallel degree, >= 1 */
    int32_t pp;                  /* pipeline-parallel degree, >= 1 */
    int32_t allow_cross_node_tp; /* 0 or 1: let a TP group straddle a node boundary */
    int32_t n_layers;            /* transformer layers, >= pp */
    int32_t n_heads;             /* query heads, divisible by tp and by n_kv_heads */
    int32_t n_kv_heads;          /* key/value heads (GQA); == n_heads without GQA */
    int32_t ffn;                 /* MLP intermediate size, divisible by tp */
    int32_t hidden;              /* model width, divisible by n_heads when head_dim is 0 */
    int32_t vocab;               /* vocabulary size, >= tp */
    int32_t head_dim;            /* per-head width (even, >= 2); 0: hidden / n_heads */
    int32_t ep;                  /* 0, 1 or tp: a stage is tp ranks; k x tp (k > 1): a
                                    stage is ep ranks, k replicas of the TP group */
} gang_topology_config;

/* A validated layout. Plain value type: copy it freely; it owns nothing. */
typedef struct gang_topology {
    uint32_t nnodes;            /* as configured */
    uint32_t nproc_per_node;    /* as configured */
    uint32_t world_size;        /* nnodes x nproc_per_node == stage_ranks x pp */
    uint32_t tp;                /* ranks per TP group */
    uint32_t stage_ranks;       /* ranks per pipeline stage: tp, or ep when ep > tp */
    uint32_t tp_replicas;       /* TP groups per stage: stage_ranks / tp (1 unless ep > tp) */
    uint32_t pp;                /* pipeline stages */
    uint32_t tp_cross_node;     /* 1 when TP groups straddle nodes (only if allowed) */
    uint32_t n_layers;          /* as configured */
    uint32_t n_heads;           /* as configured */
    uint32_t n_kv_heads;        /* as configured */
    uint32_t ffn;               /* as configured */
    uint32_t hidden;            /* as configured */
    uint32_t vocab;             /* as configured */
    uint32_t head_dim;          /* as configured, or hidden / n_heads */
    uint32_t heads_per_rank;    /* n_heads / tp */
    uint32_t kv_heads_per_rank; /* n_kv_heads / tp, or 1 when kv heads are replicated */
    uint32_t kv_replicas;       /* ranks holding each kv head: tp / n_kv_heads, or 1 */
    uint32_t ffn_per_rank;      /* ffn / tp */
} gang_topology;

/* Where one rank sits in the gang. */
typedef struct gang_rank_place {
    uint32_t rank;                /* global rank */
    uint32_t node;                /* rank / nproc_per_node */
    uint32_t local_rank;          /* rank % nproc_per_node */
    uint32_t pp_stage;            /* rank / stage_ranks */
    uint32_t ep_rank;             /* rank % stage_ranks: the index in the stage (EP group) */
    uint32_t tp_replica;          /* ep_rank / tp: which TP group of the stage */
    uint32_t tp_rank;             /* ep_rank % tp */
    uint32_t tp_group_first_rank; /* the TP group is [first, first + tp) */
    uint32_t stage_first_rank;    /* the stage (EP group) is [first, first + stage_ranks) */
    int32_t pp_prev_rank;         /* same ep_rank in stage - 1, or -1 on the first stage */
    int32_t pp_next_rank;         /* same ep_rank in stage + 1, or -1 on the last stage */
} gang_rank_place;

/* What one TP rank holds of every layer (see the Megatron block above). */
typedef struct gang_tp_shard {
    uint32_t tp_rank;       /* the rank within its TP group this shard belongs to */
    uint32_t head_first;    /* query heads [head_first, head_first + head_count) */
    uint32_t head_count;    /* n_heads / tp */
    uint32_t kv_head_first; /* kv heads [kv_head_first, kv_head_first + kv_head_count) */
    uint32_t kv_head_count; /* n_kv_heads / tp, or 1 when replicated */
    uint32_t kv_replicas;   /* TP ranks that hold the same kv heads (1 = no replication) */
    uint32_t ffn_first;     /* gate/up columns and down rows [ffn_first, +ffn_count) */
    uint32_t ffn_count;     /* ffn / tp */
    uint32_t vocab_first;   /* LM-head columns [vocab_first, vocab_first + vocab_count) */
    uint32_t vocab_count;   /* vocab / tp, plus one on the first vocab % tp ranks */
} gang_tp_shard;

/*
 * Validates cfg and fills *t. Refuses, with GANG_EUSAGE and a one-line message in err
 * that names the offending values: a field that is zero or negative (allow_cross_node_tp
 * not 0 or 1, ep negative); ep above tp and not a multiple of it (which ep a MoE model
 * accepts is gang_model_moe_layout's call); a world size above GANG_TOPOLOGY_MAX_WORLD;
 * stage_ranks x pp different from nnodes x nproc_per_node; a TP group spanning nodes
 * (tp > nproc_per_node or nproc_per_node % tp != 0) unless allow_cross_node_tp; pp > n_layers;
 * n_heads not divisible by n_kv_heads; n_heads not divisible by tp; n_kv_heads not divisible by tp
 * while tp is not a multiple of n_kv_heads; ffn not divisible by tp; hidden not
 * divisible by n_heads; vocab < tp. Returns GANG_EINVAL if cfg or t is NULL.
 * err may be NULL or errlen 0 to skip the message; it is always NUL-terminated otherwise
 * (empty on success). *t is written only on success.
 */
int gang_topology_init(const gang_topology_config *cfg, gang_topology *t, char *err, size_t errlen);

/*
 * Fills *out with where global rank `rank` sits: node, local rank, pp stage, tp rank, the
 * first rank of its TP group and its pipeline neighbours. Returns 0, or GANG_EINVAL if a
 * pointer is NULL or rank >= t->world_size (then *out is untouched).
 */
int gang_topology_rank(const gang_topology *t, uint32_t rank, gang_rank_place *out);

/*
 * The global rank at (pp_stage, tp_rank) of the stage's first TP group (replica 0):
 * pp_stage x stage_ranks + tp_rank. Returns 0, or GANG_EINVAL if a pointer is NULL or
 * either index is out of range.
 */
int gang_topology_rank_at(const gang_topology *t, uint32_t pp_stage, uint32_t tp_rank,
                          uint32_t *rank);

/*
 * The layers of pipeline stage `stage`: [*first, *first + *count). Uneven split rule:
 * every stage gets n_layers / pp layers and the FIRST n_layers % pp stages get one more,
 * so stages are contiguous, in order, cover [0, n_layers) exactly and differ by at most
 * one layer (the earlier stages also run the embedding, the last one the LM head, which
 * roughly balances the extra layer). Every stage has at least one layer because
 * pp <= n_layers. Returns 0, or GANG_EINVAL if a pointer is NULL or stage >= pp.
 */
int gang_topology_stage_layers(const gang_topology *t, uint32_t stage, uint32_t *first,
                               uint32_t *count);

/*
 * The shard of every layer held by TP rank `tp_rank` (0 <= tp_rank < tp): query heads,
 * key/value heads (replicated when tp > n_kv_heads, see above), ffn columns of the
 * column-parallel gate/up projections which are also the rows of the row-parallel down
 * projection, and the LM-head vocabulary range. The shards of ranks 0..tp-1 partition
 * the query heads, the ffn width and the vocabulary in rank order. Returns 0, or
 * GANG_EINVAL if a pointer is NULL or tp_rank >= tp.
 */
int gang_topology_tp_shard(const gang_topology *t, uint32_t tp_rank, gang_tp_shard *out);

/* =================================================================================
 * Tensor-parallel layers (parallel/tp-layers.c)
 *
 * The Megatron split above applied to one Llama decoder layer, in f32, with the kernels
 * of include/ganglion/kernels.h and the all-reduce of include/ganglion/comm.h.
 *
 * Memory: a layer is cut on the host (gang_tp_layer_init, malloc'd arrays) and may then
 * be moved into the tensor memory of a device kernels handle (gang_tp_layer_to_device).
 * The one forward (gang_tp_layer_forward_batch) takes tensor pointers of the kernels
 * handle it is given (host pointers for "cpu"); a layer or scratch that lives on one
 * device handle is refused with GANG_EINVAL when called with another. Communicators carry
 * host buffers (socket, mpi) or device buffers (nccl): with a device handle and a host
 * communicator, the collectives are staged through host memory (gang_tp_stage_*, below).
 * A TP rank copies its shard out of the full Hugging Face weight matrices once
 * (gang_tp_layer_init); the forward then runs on that shard and all-reduces over the TP
 * communicator (the ranks of one pipeline stage, in tp-rank order, e.g. from
 * gang_comm_split with color = pp stage and key = tp rank).
 *
 * Every weight is stored as Hugging Face does, [out_features, in_features] row-major,
 * so y = x . W^T. A column-parallel shard is a band of rows of W (output features),
 * a row-parallel shard is a band of columns of W (input features).
 *
 * With tp == 1 the communicator may be NULL: the layer is then the plain single-rank
 * forward pass, which is what the distributed one is checked against.
 *
 * Threads: a gang_tp_layer is read-only after init and may be shared by threads; the
 * kernels handle and the communicator follow their own rules (one driving thread each).
 * ================================================================================= */
#include "ganglion/comm.h"
#include "ganglion/kernels.h"

/*
 * Copies rows [row_first, row_first + row_count) of the row-major matrix src [rows, cols]
 * into dst [row_count, cols]: the shard of a column-parallel weight. Large copies run on
 * several threads (gang_parallel_slices, at least 4 MiB each). Returns 0, or GANG_EINVAL
 * for a NULL pointer, a zero size or a band outside the matrix.
 */
int gang_tp_slice_rows(const float *src, size_t rows, size_t cols, size_t row_first,
                       size_t row_count, float *dst);

/*
 * Copies columns [col_first, col_first + col_count) of src [rows, cols] into dst
 * [rows, col_count]: the shard of a row-parallel weight. Threads and errors as above.
 */
int gang_tp_slice_cols(const float *src, size_t rows, size_t cols, size_t col_first,
                       size_t col_count, float *dst);

/*
 * Column-parallel linear: y [tokens, out_shard] = x [tokens, in] . w_shard^T, where
 * w_shard [out_shard, in] is this rank's band of output rows of W. No communication:
 * the output stays sharded by output feature. y must not overlap x or w_shard.
 * Returns 0 or the kernel's error.
 */
int gang_tp_linear_column(gang_kernels *k, const float *x, size_t tokens, size_t in,
                          const float *w_shard, size_t out_shard, float *y);

/*
 * The full weights of one Llama decoder layer, host f32, Hugging Face layout. The
 * caller owns them; gang_tp_layer_init only reads them. Sizes come from the topology:
 * q_dim = n_heads x head_dim, kv_dim = n_kv_heads x head_dim.
 */
typedef struct gang_layer_weights {
    const float *attn_norm;      /* [hidden] input_layernorm */
    const float *wq;             /* [q_dim, hidden] q_proj */
    const float *wk;             /* [kv_dim, hidden] k_proj */
    const float *wv;             /* [kv_dim, hidden] v_proj */
    const float *wo;             /* [hidden, q_dim] o_proj */
    const float *mlp_norm;       /* [hidden] post_attention_layernorm */
    const float *w_gate;         /* [ffn, hidden] gate_proj */
    const float *w_up;           /* [ffn, hidden] up_proj */
    const float *w_down;         /* [hidden, ffn] down_proj */
    const float *bq;             /* [q_dim] q_proj bias (Qwen2), or NULL for none */
    const float *bk;             /* [kv_dim] k_proj bias, or NULL */
    const float *bv;             /* [kv_dim] v_proj bias, or NULL */
    const float *q_norm;         /* [head_dim] q_norm (Qwen3: RMSNorm of each q head), or NULL */
    const float *k_norm;         /* [head_dim] k_norm, or NULL */
    const float *post_attn_norm; /* [hidden] Gemma's norm of the attention output, or NULL */
    const float *post_mlp_norm;  /* [hidden] Gemma's norm of the MLP output, or NULL */
} gang_layer_weights;

/* The MLP's gate activation. */
typedef enum gang_tp_act {
    GANG_ACT_SILU = 0,     /* SwiGLU: silu(gate) * up (Llama, Mistral, Qwen) */
    GANG_ACT_GELU_TANH = 1 /* GeGLU: gelu_tanh(gate) * up (Gemma) */
} gang_tp_act;

/*
 * One TP rank's shard of one decoder layer. Owns its arrays: malloc'd by init (mem NULL),
 * or tensor memory of mem after gang_tp_layer_to_device.
 */
typedef struct gang_tp_layer {
    gang_kernels *mem;   /* handle whose memory holds the arrays, NULL: host malloc */
    gang_tp_shard shard; /* which heads and ffn columns these arrays hold */
    uint32_t tp;         /* TP degree the shard was cut for */
    uint32_t hidden;     /* model width */
    uint32_t head_dim;   /* per-head width */
    float rope_theta;    /* RoPE base */
    float norm_eps;      /* RMSNorm epsilon */
    float *attn_norm;    /* [hidden], replicated on every rank */
    /* The seven matrices are packed weights of type wtype (gang_kernels_weight_bytes:
     * f32 arrays while wtype is GANG_KW_F32, the default; see gang_tp_layer_pack). */
    gang_kernels_wtype wtype;
    /* Block storage (issue #27, a GGUF file's own blocks): when mixed is 1 each of the
     * seven matrices has its own type, mtype[] in the order wq, wk, wv, wo, w_gate, w_up,
     * w_down (a block type, or f32 where a tensor could not stay in blocks), each its own
     * allocation, and wtype says nothing about them. gang_tp_layer_pack refuses such a
     * layer with GANG_EINVAL; gang_tp_layer_to_device moves each matrix as it is. */
    int mixed;
    gang_kernels_wtype mtype[7];
    /* After gang_tp_layer_pack on the host: the one block (gang_kernels_weight_host_alloc)
     * that holds the seven packed matrices, which point into it and are not freed one by
     * one; NULL while each matrix is its own allocation (f32, or on a device). */
    void *wblock;
    void *wq;               /* [head_count x head_dim, hidden] rows of q_proj */
    void *wk;               /* [kv_head_count x head_dim, hidden] rows of k_proj */
    void *wv;               /* [kv_head_count x head_dim, hidden] rows of v_proj */
    void *wo;               /* [hidden, head_count x head_dim] columns of o_proj */
    float *mlp_norm;        /* [hidden], replicated on every rank */
    void *w_gate;           /* [ffn_count, hidden] rows of gate_proj */
    void *w_up;             /* [ffn_count, hidden] rows of up_proj */
    void *w_down;           /* [hidden, ffn_count] columns of down_proj */
    float *bq;              /* [head_count x head_dim] q_proj bias (Qwen2), or NULL */
    float *bk;              /* [kv_head_count x head_dim] k_proj bias, or NULL */
    float *bv;              /* [kv_head_count x head_dim] v_proj bias, or NULL */
    float *q_norm;          /* [head_dim] per-head RMSNorm of q before RoPE (Qwen3), or NULL */
    float *k_norm;          /* [head_dim] per-head RMSNorm of k before RoPE, or NULL */
    float *rope_freq;       /* [head_dim / 2] RoPE inverse frequencies: theta^(-2i/head_dim)
                               from gang_tp_layer_init; a loader may overwrite the host array
                               with the model's scaled table before moving it to a device */
    float rope_scale;       /* factor on RoPE's cos and sin (YaRN's attention factor), 1 */
    float rope_dyn_factor;  /* dynamic NTK: factor (> 1), else 0 (tp_rope_tables) */
    uint32_t rope_dyn_orig; /* dynamic NTK: the original context (max_position_embeddings) */
    uint32_t window;        /* sliding-window attention: keys a query sees, itself included
                               (gang_kernels_attention_window); 0 = all before it */
    float *post_attn_norm;  /* [hidden] Gemma: RMSNorm of the attention block's output before
                               the residual add, or NULL */
    float *post_mlp_norm;   /* [hidden] Gemma: the same for the MLP block, or NULL */
    gang_tp_act act;        /* the MLP gate's activation (SiLU unless set) */
    /* On a device only (gang_tp_layer_to_device): q/k/v concatenated by rows into one
     * packed matrix [q + 2 kv rows, hidden] and gate/up into one [2 x ffn_count, hidden]
     * (an int8 one holds every band's elements, then every band's scales, as one packed
     * weight), so that the batched forward runs one GEMM for each and converts the
     * activations once (issue #24); wq, wk, wv, w_gate and w_up are then NULL. NULL on the
     * host, where the separate matrices stay. */
    void *wqkv;
    void *wgu;
    /* A mixture-of-experts layer (parallel/tp-moe.c): the MLP is this rank's experts and the
     * router instead of w_gate / w_up / w_down (then NULL). NULL: a dense layer. Owned by
     * the layer (gang_tp_layer_free releases it). */
    struct gang_tp_moe *moe;
} gang_tp_layer;

/*
 * Cuts TP rank tp_rank's shard of one layer out of the full weights w, for the layout t,
 * into *l (which the caller provides; its old contents are ignored). The q/k/v biases,
 * when present, are cut like the rows of their projections (each is independent: a NULL
 * one stays NULL in the shard). rope_theta must be > 0 and norm_eps >= 0. On success
 * the caller releases l with gang_tp_layer_free. The norm weights may be NULL (the shard
 * is then only good for slicing: gang_tp_layer_forward_batch refuses it with
 * GANG_EINVAL). Returns 0, GANG_EINVAL (NULL argument, tp_rank out of range, bad theta
 * or eps) or GANG_ENOMEM; on error *l is left zeroed and owns nothing.
 */
int gang_tp_layer_init(gang_tp_layer *l, const gang_topology *t, uint32_t tp_rank,
                       const gang_layer_weights *w, float rope_theta, float norm_eps);

/*
 * Releases the arrays of a layer from gang_tp_layer_init (to l->mem when it was moved to
 * a device, which must still be open) and zeroes it; NULL is ignored.
 */
void gang_tp_layer_free(gang_tp_layer *l);

/*
 * Converts the seven matrices of a host layer (f32, from gang_tp_layer_init or a loader)
 * into packed weights of type t (gang_kernels_weight_pack: bf16 / f16 rounding, or int8
 * with a scale per output row of this shard), one matrix at a time, into one block of
 * huge-page-advised host memory (l->wblock, gang_kernels_weight_host_alloc: a small
 * model's matrices are each below 2 MiB, together they are not), and sets l->wtype.
 * Norms, biases and RoPE tables stay f32. The forward pass then multiplies with
 * gang_kernels_matmul over the packed weights. GANG_KW_F32, or a layer already of type
 * t, changes nothing. Returns 0, GANG_EINVAL (NULL, a layer on a device or of another
 * packed type, a non-finite weight for int8) or GANG_ENOMEM; on error the layer is
 * unchanged (all seven matrices are converted, or none).
 */
int gang_tp_layer_pack(gang_tp_layer *l, gang_kernels_wtype t);

/* Bytes the seven matrices of l take in their storage (what a forward pass streams). */
size_t gang_tp_layer_weight_bytes(const gang_tp_layer *l);

/*
 * Moves a host layer into the tensor memory of k: every array is allocated from k and
 * uploaded, then the host copies are freed and l->mem = k; q/k/v and gate/up go up as
 * the two concatenated matrices wqkv and wgu (wq, wk, wv, w_gate, w_up become NULL),
 * except in a mixed layer, whose seven matrices of their own types move one by one. On
 * the "cpu" backend, or for a layer already on k, nothing changes (host memory is the
 * cpu backend's tensor memory).
 * Returns 0, GANG_EINVAL (NULL, a layer already on another handle) or the allocation or
 * upload error; on error the layer is unchanged (still on the host) and nothing leaks.
 */
int gang_tp_layer_to_device(gang_tp_layer *l, gang_kernels *k);

/*
 * Device buffers over any communicator: the one staging mechanism of the TP layers, the
 * engine's pipeline transfers and its logits all-gather. Each call behaves like the
 * gang_comm_* call of the same name on tensor memory of k:
 *  - k on the host ("cpu"): the buffers are passed straight through;
 *  - k a device and c a device communicator (nccl): the operation is ordered after k's
 *    enqueued work on the device (gang_comm_order_after; no host wait), then the device
 *    pointers are passed straight through; a device communicator without device ordering
 *    gets a gang_kernels_sync of k instead;
 *  - k a device and c a host communicator (socket, mpi): the data is downloaded into
 *    st->host, the collective runs there, and the result is uploaded back.
 * st holds the host staging buffer, sized once by its owner so that the serving loop
 * allocates nothing: all_reduce, send and recv need the buffer's bytes, all_gather
 * (1 + size of c) x count elements. st may be NULL or too small: the call then
 * allocates a temporary host buffer (GANG_ENOMEM when that fails), which is what
 * the layer forward does without a scratch. Errors are those of the communicator and of k.
 */
typedef struct gang_tp_stage {
    void *host;   /* host staging memory, or NULL */
    size_t bytes; /* its size */
} gang_tp_stage;

int gang_tp_stage_all_reduce(gang_kernels *k, gang_comm *c, gang_tp_stage *st, void *buf,
                             size_t count, gang_dtype dt, uint64_t timeout_ms);
int gang_tp_stage_all_gather(gang_kernels *k, gang_comm *c, gang_tp_stage *st, const void *send,
                             void *recv, size_t count, gang_dtype dt, uint64_t timeout_ms);
int gang_tp_stage_send(gang_kernels *k, gang_comm *c, gang_tp_stage *st, const void *buf,
                       size_t bytes, uint32_t peer, uint32_t tag, uint64_t timeout_ms);
int gang_tp_stage_recv(gang_kernels *k, gang_comm *c, gang_tp_stage *st, void *buf, size_t bytes,
                       uint32_t peer, uint32_t tag, uint64_t timeout_ms);

/*
 * This rank's key/value cache of one layer: rows of [cap, kv_head_count, head_dim] for
 * positions 0 .. cap-1, holding only the kv heads of the rank's shard (a replicated kv
 * head is cached by every rank that holds it). The caller owns the arrays; the layer
 * forward writes the rows of the tokens it processes and reads the earlier ones.
 */
typedef struct gang_tp_kv_cache {
    float *k;   /* [cap, kv_head_count, head_dim] */
    float *v;   /* [cap, kv_head_count, head_dim] */
    size_t cap; /* positions the arrays can hold */
    /* Paged (table != NULL): k and v are instead a pool of n_blocks blocks of block_size
     * rows shared by many sequences, and position p of this one lives in row
     * p % block_size of block table[p / block_size]; cap is then the positions the table
     * covers (entries x block_size). table is tensor memory (for the attention kernel),
     * table_host the same entries on the host (for the cache writes); both have at least
     * ceil(cap / block_size) entries, each < n_blocks. */
    const int32_t *table;
    const int32_t *table_host;
    size_t block_size;
    size_t n_blocks;
    gang_dtype dtype; /* paged: the pool's elements, F32 (0), BF16 or F16 (k and v then
                         point at bf16 / f16 data: the rows are rounded as written) */
    /* Paged, optional: table == table_base + table_off, where table_base (tensor memory)
     * holds the tables of every sequence sharing the pool. When every cache of a batched
     * call has one (the same base, pool and dtype) and k is a device, the call appends the
     * keys and runs the attention of all its sequences in one launch
     * (gang_kernels_attention_step); NULL: one descriptor per sequence. */
    const int32_t *table_base;
    size_t table_off;
} gang_tp_kv_cache;

/*
 * Caller-provided scratch of the batched forward below, sized once for a layer shape
 * and a token bound, so that a serving step loop allocates nothing. One per driving
 * thread; every layer of a stage has the same shard shape, so one serves them all.
 */
typedef struct gang_tp_scratch {
    gang_kernels *mem;   /* handle whose tensor memory holds the float arrays and positions,
                            NULL: host malloc */
    size_t max_tokens;   /* tokens one call may pass (sum over its sequences) */
    size_t hidden;       /* the shape it was sized for */
    size_t q_cols;       /* head_count x head_dim */
    size_t kv_cols;      /* kv_head_count x head_dim */
    size_t ffn_cols;     /* ffn_count */
    float *normed;       /* [max_tokens, hidden] */
    float *delta;        /* [max_tokens, hidden] */
    float *q;            /* [max_tokens, q_cols] */
    float *k;            /* [max_tokens, kv_cols] */
    float *v;            /* [max_tokens, kv_cols] */
    float *gate;         /* [max_tokens, ffn_cols] */
    float *up;           /* [max_tokens, ffn_cols] */
    float *fused;        /* device scratch only: [max_tokens, fused_cols], the output of a
                            concatenated GEMM (q/k/v or gate/up) before it is split; NULL on
                            the host */
    size_t fused_cols;   /* max(q_cols + 2 kv_cols, 2 ffn_cols) on a device, else 0 */
    int32_t *positions;  /* [2 x max_tokens] tensor memory: the call's RoPE positions
                            [total], then its tokens' table offsets [total] (table_off) */
    int32_t *pos_host;   /* [4 x max_tokens] host: the call's positions and table offsets
                            as positions holds them, then a copy of what positions holds */
    size_t pos_valid;    /* entries of positions that copy describes (0: none) */
    float *rope_tabs;    /* dynamic NTK layers only: [max_tokens, head_dim / 2] tensor
                            memory, the frequency table of each sequence of the call */
    float *tab_host;     /* [2 x max_tokens x head_dim / 2] host: the tables, then a copy
                            of what rope_tabs holds */
    size_t tab_valid;    /* floats of rope_tabs that copy describes (0: none) */
    gang_tp_stage stage; /* host staging of the all-reduces (device handles only) */
    /* Host: the descriptors of a call's one attention batch, grown to the most sequences
     * a call has passed (gang_kernels_attention_batch). */
    gang_kernels_attn_seq *attn_seqs;
    gang_kernels_kv_pages *attn_pages;
    size_t attn_cap;
    /* The communicator a MoE block runs over when its EP group is wider than the TP group
     * (the stage's ep ranks, gang_tp_moe's tp = ep); NULL: the layer's own comm. Not owned:
     * the caller sets it before a call (the engine, every step) and keeps it open. */
    gang_comm *moe_comm;
    /* The next layer's input norm weight (its attn_norm, same eps), NULL: none. Not owned:
     * the caller sets it before each call (the engine: the next layer of the stage, NULL
     * for the last); the call then ends with gang_kernels_add_rmsnorm into normed instead
     * of the bare residual add, and the next call, seeing its own attn_norm in normed_for,
     * skips its first RMSNorm: one launch per layer less. */
    const float *next_norm;
    const float *normed_for; /* the norm weight normed was left for (the call's own) */
} gang_tp_scratch;

/*
 * Allocates scratch for up to max_tokens tokens of layers shaped like l (hidden, shard
 * heads and ffn columns). Returns 0; GANG_EINVAL (NULL, max_tokens 0 or a size that
 * overflows); GANG_ENOMEM. On error *s is zeroed. Release with gang_tp_scratch_free.
 */
int gang_tp_scratch_init(gang_tp_scratch *s, const gang_tp_layer *l, size_t max_tokens);

/*
 * The same, in the tensor memory of k (k NULL: host malloc, as gang_tp_scratch_init).
 * With a device k the scratch also holds a host staging buffer of max_tokens x hidden
 * floats for the all-reduces over a host communicator. Same errors, plus k's.
 */
int gang_tp_scratch_init_on(gang_tp_scratch *s, const gang_tp_layer *l, size_t max_tokens,
                            gang_kernels *k);

/*
 * What gang_tp_layer_forward_batch does first for a batch, alone: validates it against l,
 * s and the caches and brings the call's positions and table offsets into s's tensor
 * memory (without a host wait), so that the forward calls of the same batch upload
 * nothing. The engine calls it before it captures or replays a decode step as a graph
 * (gang_kernels_graph_*), in which no upload may happen. 0, GANG_EINVAL or k's error.
 */
int gang_tp_scratch_prepare(gang_tp_scratch *s, const gang_tp_layer *l, gang_kernels *k,
                            uint32_t n_seq, const uint32_t *seq_tokens, const uint32_t *seq_pos0,
                            gang_tp_kv_cache *const *caches);

/* Releases the arrays of gang_tp_scratch_init(_on) (to s->mem, which must still be
 * open) and zeroes s; NULL is ignored. */
void gang_tp_scratch_free(gang_tp_scratch *s);

/*
 * Batched ragged decoder layer for serving: n_seq sequences whose tokens are
 * concatenated in the residual stream x [sum of seq_tokens, hidden], sequence i holding
 * seq_tokens[i] >= 1 tokens at absolute positions seq_pos0[i] .. seq_pos0[i] +
 * seq_tokens[i] - 1 and its own cache caches[i] (distinct sequences must have distinct
 * caches). The one whole-layer forward, serving and single sequence alike (n_seq = 1):
 * per sequence, in place on the residual stream,
 *   x = x + attention(rmsnorm(x, attn_norm));  x = x + mlp(rmsnorm(x, mlp_norm))
 * with the numerics of each sequence independent of the others, but the norms, the
 * q/k/v, o_proj, gate/up and down GEMMs run once on all the tokens, RoPE takes per-token
 * positions, and only the cache writes and the attention run per sequence: two
 * all-reduces per call, whatever n_seq. In place on x; scratch s must have been
 * sized for this layer's shape and at least the total token count. Returns 0;
 * GANG_EINVAL (NULL pointer, n_seq 0, timeout_ms 0, an empty sequence, a sequence beyond
 * its cache, too many tokens for s, a scratch or communicator that does not match the
 * layer, a layer or scratch in the memory of another handle, no norm weights); a kernel
 * error; GANG_ETIMEDOUT when timeout_ms has passed before the MLP's all-reduce; the
 * communicator's error as is (x is then garbage and the cache rows of these tokens may
 * be written).
 */
int gang_tp_layer_forward_batch(const gang_tp_layer *l, gang_kernels *k, gang_comm *comm, float *x,
                                uint32_t n_seq, const uint32_t *seq_tokens,
                                const uint32_t *seq_pos0, gang_tp_kv_cache *const *caches,
                                gang_tp_scratch *s, uint64_t timeout_ms);

/* ================================ end of tensor-parallel layers ======================== */

/* =================================================================================
 * Pipeline (parallel/pipeline.c)
 *
 * The one GPipe microbatch schedule of the project, model-agnostic. A batch of B units
 * (sequences for the engine) is cut into K microbatches of whole, consecutive units, and
 * the microbatches flow through the P stages: stage s works on microbatch k while stage
 * s + 1 works on k - 1. What a stage does is the caller's, through gang_pipeline_ops:
 * WORK runs the stage's share (its layers; embedding on stage 0, the head on the last),
 * SEND_ACT / RECV_ACT move a microbatch's activations to / from the neighbouring stage
 * (tag k for microbatch k), SEND_RESULT / RECV_RESULT move its result from the last stage
 * back to stage 0 (tag K + k). pipeline.c gives the exact order and why it cannot
 * deadlock even on a rendezvous backend. The model's engine serves with it
 * (engine/engine-run.c) and `ganglion bench pipeline` measures it with synthetic work.
 *
 * Uneven microbatches: K need not divide B (1 <= K <= B). Like the layer split, every
 * microbatch gets B / K units and the FIRST B % K microbatches get one more, so
 * microbatch k starts at unit k x (B / K) + min(k, B % K). Every rank derives the same
 * sizes from (B, K), so a message's size is never sent.
 *
 * Deadlines are absolute gang_now_ms() times: the schedule checks it before every
 * callback (GANG_ETIMEDOUT once passed) and hands it on, so a callback with several
 * operations shares out what is left (gang_deadline_left).
 *
 * Threads: gang_pipeline_run keeps no state; one thread drives each rank's call.
 * ================================================================================= */

/* One microbatch, as the callbacks see it. */
typedef struct gang_pipeline_mb {
    uint32_t index; /* k, in [0, K) */
    uint32_t first; /* its units are [first, first + count) of the batch */
    uint32_t count; /* >= 1 */
} gang_pipeline_mb;

/*
 * A stage's callbacks. Each returns 0 or a negative GANG_E* code, which stops the
 * schedule and is returned as is. peer is a pipeline stage index (the caller maps it to
 * a rank of its communicator), tag the message's tag. A callback may skip a transfer
 * (return 0 without moving anything) only if the other end skips it too. send_* and
 * recv_* may be NULL when there is one stage.
 */
typedef struct gang_pipeline_ops {
    void *ctx; /* passed back to every callback */
    int (*work)(void *ctx, const gang_pipeline_mb *mb, uint64_t deadline);
    int (*send_act)(void *ctx, const gang_pipeline_mb *mb, uint32_t peer, uint32_t tag,
                    uint64_t deadline);
    int (*recv_act)(void *ctx, const gang_pipeline_mb *mb, uint32_t peer, uint32_t tag,
                    uint64_t deadline);
    int (*send_result)(void *ctx, const gang_pipeline_mb *mb, uint32_t peer, uint32_t tag,
                       uint64_t deadline);
    int (*recv_result)(void *ctx, const gang_pipeline_mb *mb, uint32_t peer, uint32_t tag,
                       uint64_t deadline);
} gang_pipeline_ops;

/*
 * Runs one batch of `batch` units in `microbatches` microbatches on pipeline stage
 * `stage` of `stages`, calling ops in the schedule's order (pipeline.c). A collective
 * call: every rank of the gang calls it with the same batch, microbatches and stages.
 * batch == microbatches == 0 is an empty step (returns 0, calls nothing). Returns 0;
 * GANG_EINVAL (NULL ops or work, stage >= stages, stages 0, a missing transfer callback
 * with stages > 1, microbatches outside [1, batch] or above UINT32_MAX / 2);
 * GANG_ETIMEDOUT once deadline has passed before a callback; or the first callback error.
 */
int gang_pipeline_run(const gang_pipeline_ops *ops, uint32_t stage, uint32_t stages, uint32_t batch,
                      uint32_t microbatches, uint64_t deadline);

/*
 * The first unit and the unit count of microbatch mb when `batch` units are cut into
 * `microbatches` (the uneven rule above). Returns 0, or GANG_EINVAL when microbatches is
 * 0 or above batch, mb >= microbatches, or a pointer is NULL.
 */
int gang_pipeline_microbatch(uint32_t batch, uint32_t microbatches, uint32_t mb, uint32_t *first,
                             uint32_t *count);

/* ====================================== end of pipeline ================================== */

/* =================================================================================
 * Mixture of experts: routing and expert parallelism (parallel/moe.c, issue #25)
 *
 * A MoE layer sends each token to top_k of n_experts feed-forward experts, chosen by a
 * router's logits, and sums their outputs weighted by the routing weights. Under expert
 * parallelism (EP) the experts are split over the ep ranks of a group in contiguous runs
 * (rank r holds experts [r * n_experts / ep, (r + 1) * n_experts / ep)); every rank routes
 * its own tokens, and two all-to-alls per layer move them: dispatch (a token's row to the
 * rank of each of its experts) and combine (each expert's output row back). The counts
 * travel first, so no buffer is sized by guess.
 * ================================================================================= */

/* The routing rule of a family: softmax over the router's logits (in f32), the top_k
 * largest (equal probabilities: the lower expert id first), and, with norm_topk, the k
 * weights divided by their sum (Mixtral always; Qwen2-MoE / Qwen3-MoE per norm_topk_prob). */
typedef struct gang_moe_route_cfg {
    uint32_t n_experts; /* 1..GANG_MOE_MAX_EXPERTS */
    uint32_t top_k;     /* 1..n_experts, at most GANG_MOE_MAX_TOPK */
    int norm_topk;
} gang_moe_route_cfg;

#define GANG_MOE_MAX_EXPERTS 1024u
#define GANG_MOE_MAX_TOPK 16u

/*
 * Routes tokens rows of logits[tokens][n_experts]: expert[t * top_k + j] and
 * weight[t * top_k + j] for j in order of decreasing weight. A NaN logit is GANG_EINVAL
 * (a broken model must not route silently); GANG_EINVAL for a bad cfg. Any thread.
 */
int gang_moe_route(const gang_moe_route_cfg *cfg, const float *logits, size_t tokens,
                   int32_t *expert, float *weight);

/*
 * The dispatch plan of one step on one rank, in arrays the caller sizes once for the most
 * tokens a step routes (gang_moe_plan_init) so that a step allocates nothing.
 *   order[i]        the i-th slot (t * top_k + j) in send order: by destination rank, then
 *                   expert, then slot; so each rank's rows are contiguous and grouped by
 *                   expert
 *   send_rows[r]    slots sent to rank r
 *   send_expert[e]  slots of expert e (this rank's tokens only)
 */
typedef struct gang_moe_plan {
    uint32_t n_experts, top_k, ep, rank;
    size_t max_slots, slots;
    uint32_t *order;
    size_t *send_rows;   /* [ep] */
    size_t *send_expert; /* [n_experts] */
    size_t *cursor;      /* [n_experts]: scratch of gang_moe_plan_build */
} gang_moe_plan;

/* Allocates a plan for up to max_tokens tokens per step on rank of ep ranks. 0,
 * GANG_EINVAL (ep does not divide n_experts, rank >= ep, ...) or GANG_ENOMEM. */
int gang_moe_plan_init(gang_moe_plan *p, uint32_t n_experts, uint32_t top_k, uint32_t ep,
                       uint32_t rank, size_t max_tokens);
void gang_moe_plan_free(gang_moe_plan *p);
/* Fills p from the experts gang_moe_route chose for tokens tokens (counting sort, O(slots +
 * n_experts)). GANG_ERANGE over max_tokens, GANG_EINVAL for an expert id out of range. */
int gang_moe_plan_build(gang_moe_plan *p, const int32_t *expert, size_t tokens);
/* The rank that holds expert e under p's split. */
uint32_t gang_moe_expert_rank(const gang_moe_plan *p, uint32_t e);

/*
 * One MoE layer's traffic on an EP group c (c's size = p->ep, its rank = p->rank), on
 * host buffers of f32 rows of width floats, through gang_comm_all_to_all_v. The caller
 * provides the scratch: send and recv rows (max_slots x ep rows each, since every rank may
 * route all its tokens to one rank) and the per-rank, per-local-expert counts.
 */
typedef struct gang_moe_exchange {
    size_t width;         /* floats per row */
    float *send, *recv;   /* [max_slots * ep * width] each */
    size_t recv_cap_rows; /* rows recv holds */
    size_t *cnt_out;      /* [ep * experts_per_rank]: rows to each (rank, local expert) */
    size_t *cnt_in;       /* [ep * experts_per_rank]: rows from each (rank, local expert) */
    size_t *a2a;          /* [4 * ep]: the all-to-all's sizes and offsets */
    size_t recv_rows;     /* after dispatch: rows received, source rank-major, then expert */
} gang_moe_exchange;

/*
 * Dispatch: exchanges the per-(rank, local expert) counts, then sends every slot's token
 * row (x[tokens][width], rows in p's order) to its expert's rank. Afterwards x->recv holds
 * x->recv_rows rows, ordered by source rank then local expert, with x->cnt_in giving the
 * runs. Collective over c; 0 or the communicator's error, GANG_ERANGE when recv is short.
 */
int gang_moe_dispatch(gang_comm *c, const gang_moe_plan *p, const float *x, gang_moe_exchange *xc,
                      uint64_t timeout_ms);
/*
 * Combine: sends x->recv's rows (now the experts' outputs, in the order dispatch left
 * them) back to their sources and accumulates y[t] += weight[slot] * row for every slot
 * of this rank's tokens (y[tokens][width], not cleared here). Collective over c.
 */
int gang_moe_combine(gang_comm *c, const gang_moe_plan *p, const float *weight,
                     gang_moe_exchange *xc, float *y, uint64_t timeout_ms);

/* =================================================================================
 * Mixture-of-experts layers (parallel/tp-moe.c, issue #25)
 *
 * The MLP of a MoE decoder layer: a router [n_experts, hidden] (replicated), n_experts
 * SwiGLU experts of moe_ffn columns, and optionally a shared expert (Qwen2-MoE) with its
 * sigmoid gate [hidden]. Inside one TP group (the ranks that run the layer's attention with
 * their heads) the experts are held one of two ways:
 *   ep 1:   every rank holds every expert, cut by columns like a dense MLP (gate/up rows and
 *           down columns [ffn_first, +ffn_count) of moe_ffn / tp); each rank routes every
 *           token and computes its columns of the chosen experts; no all-to-all.
 *   ep tp:  expert parallelism over the TP group: rank r holds experts
 *           [r n_experts / ep, (r + 1) n_experts / ep) whole. The step's tokens are cut in ep
 *           contiguous runs; rank r routes run r, sends each (token, choice) row to its
 *           expert's rank and gets the outputs back (gang_moe_dispatch / gang_moe_combine on
 *           the TP communicator), and computes the rows it received grouped by expert: one
 *           GEMM per active expert for gate, up and down, not one per token.
 * The shared expert is always cut by columns over the TP group and runs on every token.
 * Either way each rank ends with a partial [tokens, hidden] (its columns, or its run of
 * tokens with zeros elsewhere) and one all-reduce over the TP group sums the block's output,
 * so the residual stream is the same on every rank, as after a dense MLP.
 *
 * On a device handle (parallel/tp-moe-dev.c) the router, the experts (one GEMM per active
 * expert for gate, up and down: a loop of GEMMs on the handle's one stream) and the shared
 * expert run on the device; the routing decision, the regroup by expert and the weighted
 * combine are on the host, with the rows downloaded and uploaded around them. The
 * all-to-alls take host rows on a host communicator (socket, mpi) and the layer's device
 * buffers on a device-memory one (nccl: the counts first, then the rows, device to device). The
 * experts stay f32 whatever the layer's storage (gang_tp_layer_pack). The layer keeps its step
 * scratch (grown to the most tokens a call passed, so a steady serving loop allocates nothing) and
 * its load counters: one driving thread per layer.
 * ================================================================================= */

/* Load-balance counters of one MoE layer, cumulative since the layer was made. */
typedef struct gang_moe_load {
    uint64_t steps;            /* forward calls */
    uint64_t slots;            /* (token, choice) pairs routed by this rank */
    uint64_t *expert_slots;    /* [n_experts]: slots routed to each expert by this rank */
    double max_over_mean_sum;  /* sum over steps of the step's max / mean slots per expert */
    double last_max_over_mean; /* the last step's max / mean slots per expert (1: even) */
    uint64_t *rank_slots;      /* [ep]: slots this rank sent to each EP rank's experts */
} gang_moe_load;

typedef struct gang_tp_moe {
    uint32_t n_experts, top_k;
    int norm_topk;        /* weights renormalised over the top_k (Mixtral; norm_topk_prob) */
    uint32_t ep;          /* 1, or tp: experts split over the group the block runs on */
    uint32_t ep_rank;     /* this rank's index in the EP group (tp_rank when ep > 1) */
    uint32_t tp, tp_rank; /* the group the block runs on: the layer's TP group, or the
                             stage's EP group when it is wider (then tp = ep) */
    uint32_t hidden;
    uint32_t moe_ffn;      /* each expert's full intermediate width */
    uint32_t expert_first; /* local experts [expert_first, +expert_count) */
    uint32_t expert_count;
    uint32_t ffn_first; /* columns of each local expert held: [ffn_first, +ffn_count) */
    uint32_t ffn_count;
    float *router;               /* [n_experts, hidden] */
    float *w_gate, *w_up;        /* [expert_count][ffn_count, hidden] */
    float *w_down;               /* [expert_count][hidden, ffn_count] */
    uint32_t sh_ffn;             /* shared expert's full width; 0: none */
    uint32_t sh_first, sh_count; /* its columns on this rank */
    float *sh_gate, *sh_up;      /* [sh_count, hidden] */
    float *sh_down;              /* [hidden, sh_count] */
    float *sh_gate_w;            /* [hidden]: shared_expert_gate, sigmoid(x . w) scales it */
    gang_moe_load load;
    struct gang_tp_moe_scratch *scr; /* the step scratch, made at the first forward */
    gang_kernels *mem;               /* after gang_tp_moe_to_device: the handle holding the
                                        weight arrays; NULL: host malloc */
    struct gang_tp_moe_dev *dev;     /* device step buffers (parallel/tp-moe-dev.c) */
} gang_tp_moe;

/*
 * Allocates *out for a layer of tp_rank in a group of tp ranks (the TP group, or the
 * stage's EP group when it is wider than TP: the caller passes ep and the EP rank) with
 * experts held as ep (1 or tp) says: the scalar fields filled, the ranges computed, the load
 * counters and zeroed weight arrays of the right sizes allocated (the loader fills them).
 * GANG_EINVAL for a shape that cannot be cut so (ep not 1 or tp, n_experts % ep, moe_ffn % tp with
 * ep 1, sh_ffn % tp, top_k outside [1, min(n_experts, GANG_MOE_MAX_TOPK)]); GANG_ENOMEM.
 */
int gang_tp_moe_init(gang_tp_moe **out, uint32_t n_experts, uint32_t top_k, int norm_topk,
                     uint32_t hidden, uint32_t moe_ffn, uint32_t sh_ffn, uint32_t tp,
                     uint32_t tp_rank, uint32_t ep);
/* Releases m and its arrays and scratch (to m->mem, which must still be open). NULL ok. */
void gang_tp_moe_free(gang_tp_moe *m);
/*
 * Moves m's weight arrays into the tensor memory of a device handle k (router, experts,
 * shared expert; its routing and load counters stay on the host). A host k, or m already
 * on k, changes nothing. 0; GANG_EINVAL (m on another handle); k's allocation or upload
 * error (m unchanged: still on the host).
 */
int gang_tp_moe_to_device(gang_tp_moe *m, gang_kernels *k);
/* Bytes of expert, router and shared weights m holds. */
size_t gang_tp_moe_weight_bytes(const gang_tp_moe *m);

/*
 * The MoE block of one call: x [tokens, hidden] (the normed residual, the same on every
 * rank of comm) in, y [tokens, hidden] the block's output, summed over comm (comm NULL for
 * tp 1), tensor memory of k, as m's weights are (GANG_EINVAL otherwise). Collective
 * over comm, within timeout_ms for each all-to-all and the all-reduce. 0; GANG_EINVAL;
 * GANG_ENOMEM (the scratch grows); the router's GANG_EINVAL for a NaN logit; the
 * communicator's errors (GANG_EPEER when a rank is lost inside an all-to-all).
 */
int gang_tp_moe_forward(gang_tp_moe *m, gang_kernels *k, gang_comm *comm, const float *x,
                        size_t tokens, float *y, uint64_t timeout_ms);

/*
 * Process-wide timing of the MoE blocks (for `ganglion bench moe`): the calls of exactly
 * `tokens` tokens (a decode step of that batch) since the last reset, the time inside
 * gang_tp_moe_forward and the part of it inside the two all-to-alls, summed over every
 * rank thread of the process. gang_tp_moe_timing_reset(0) counts nothing. Any thread.
 */
typedef struct gang_moe_timing {
    uint64_t calls, block_ns, a2a_ns;
} gang_moe_timing;
void gang_tp_moe_timing_reset(uint32_t tokens);
void gang_tp_moe_timing_get(gang_moe_timing *out);

#endif /* GANGLION_PARALLEL_H */
