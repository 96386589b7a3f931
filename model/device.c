/*
 * Moving a model shard into a kernels handle's tensor memory, once, before serving.
 *
 * gang_model_load produces host arrays (f32, or packed weights of the chosen storage); the "cuda"
 * engine wants every weight in device memory and no host copy left behind (a GPU worker's host
 * memory should track its activations, not its weights). Arrays move one at a time (allocate from
 * the pool, upload, free the host copy), so peak host memory never grows; the layers move with
 * gang_tp_layer_to_device, which records its handle so that gang_tp_layer_free returns
 * the memory to the right pool. On the "cpu" backend nothing moves: host memory is its
 * tensor memory.
 *
 * A GGUF file's blocks (m->blocks, issue #27) move as the file's bytes, for the device's
 * block kernels; the model must have been loaded with gang_load_options.keep_layout (the
 * CPU's repacked layout is for the CPU kernels only). Matrices that point into the mapped
 * file (m->wmap) are uploaded from it and never freed; the mapping goes once every array
 * moved.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ganglion/model.h"
#include "model-internal.h"

/* Moves one optional host array of n bytes into k; NULL stays NULL. The host copy is
 * freed unless it lies in m's mapped file. */
static int dev_move(const gang_model *m, gang_kernels *k, void **arr, size_t n)
{
    void *d = NULL;
    int rc;

    if (*arr == NULL || n == 0)
        return 0;
    rc = gang_kernels_alloc(k, n, &d);
    if (rc != 0)
        return rc;
    rc = gang_kernels_upload(k, d, *arr, n);
    if (rc != 0) {
        gang_kernels_free(k, d);
        return rc;
    }
    if (!gang__model_in_map(m, *arr))
        free(*arr);
    *arr = d;
    return 0;
}

/*
 * The matrices of layer l that point into m's mapped file become heap copies, so that
 * gang_tp_layer_to_device frees them after the upload as it frees every host array (one
 * layer at a time: host memory grows by at most one layer). On GANG_ENOMEM the layer holds
 * copies and mapped pointers side by side, which gang_model_free tells apart.
 */
static int dev_unmap_layer(const gang_model *m, gang_tp_layer *l)
{
    size_t q = (size_t)l->shard.head_count * l->head_dim, h = l->hidden;
    size_t kv = (size_t)l->shard.kv_head_count * l->head_dim, f = l->shard.ffn_count;
    const size_t rows[7] = {q, kv, kv, h, f, f, h}, cols[7] = {h, h, h, q, h, h, f};
    void **const mats[7] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down};

    for (int j = 0; j < 7; j++) {
        size_t n = gang_kernels_weight_bytes(l->mixed ? l->mtype[j] : l->wtype, rows[j], cols[j]);
        void *copy;

        if (!gang__model_in_map(m, *mats[j]))
            continue;
        if ((copy = malloc(n)) == NULL)
            return GANG_ENOMEM;
        memcpy(copy, *mats[j], n);
        *mats[j] = copy;
    }
    return 0;
}

int gang_model_to_device(gang_model *m, gang_kernels *k)
{
    void **top[3];
    size_t n[3], hidden;
    uint32_t i, j, count;
    int rc = 0;

    if (m == NULL || k == NULL)
        return GANG_EINVAL;
    if (m->mem == k)
        return 0;
    if (m->mem != NULL)
        return GANG_EINVAL;
    if (!(gang_kernels_caps(k) & GANG_KERNELS_CAP_DEVICE_MEM))
        return 0;
    if (m->repacked) {
        gang_error("model: its block weights are in the CPU kernels' layout; for --device %s "
                   "load it with gang_load_options.keep_layout",
                   gang_kernels_name(k));
        return GANG_EINVAL;
    }
    hidden = m->cfg.hidden != 0 ? m->cfg.hidden : m->topo.hidden;
    /* The embedding table and the LM head are packed weights of m->wtype (an own head of
     * a blocks model: of head_type). */
    top[0] = (void **)&m->final_norm, n[0] = hidden * sizeof(float);
    top[1] = &m->embed, n[1] = gang_kernels_weight_bytes(m->wtype, m->topo.vocab, hidden);
    top[2] = &m->lm_head;
    n[2] = gang_kernels_weight_bytes(m->blocks ? m->head_type : m->wtype, m->shard.vocab_count,
                                     hidden);
    /* A tied head is rows of the table: it moves with it (count: what has arrays). */
    count = m->lm_head_tied ? 2 : 3;
    m->mem = k;
    for (j = 0; j < count; j++) {
        rc = dev_move(m, k, top[j], n[j]);
        if (rc != 0)
            break;
    }
    if (rc == 0 && m->lm_head_tied)
        m->lm_head = gang__model_tied_head(m);
    for (i = 0; rc == 0 && m->layers != NULL && i < m->layer_count; i++) {
        rc = dev_unmap_layer(m, &m->layers[i]);
        if (rc == 0)
            rc = gang_tp_layer_to_device(&m->layers[i], k);
    }
    if (rc == 0 && m->wmap != NULL) {
        munmap(m->wmap, m->wmap_len); /* nothing points into it any more */
        m->wmap = NULL;
        m->wmap_len = 0;
    }
    if (rc == 0)
        return 0;
    /*
     * A failed move leaves the model unusable but consistent: the top-level arrays that
     * did not move (j and after) are dropped here, so each one is device memory or NULL,
     * and each layer records where its arrays are; gang_model_device_release followed by
     * gang_model_free then releases everything exactly once.
     */
    for (; j < count; j++) {
        if (!gang__model_in_map(m, *top[j]))
            free(*top[j]);
        *top[j] = NULL;
    }
    if (m->lm_head_tied && m->embed == NULL)
        m->lm_head = NULL; /* its table was dropped above */
    gang_error("model: moving the weights to the '%s' device failed: %s", gang_kernels_name(k),
               gang_strerror(rc));
    return rc;
}

void gang_model_device_release(gang_model *m)
{
    uint32_t i;

    if (m == NULL || m->mem == NULL)
        return;
    for (i = 0; m->layers != NULL && i < m->layer_count; i++) {
        if (m->layers[i].mem != NULL)
            gang_tp_layer_free(&m->layers[i]);
    }
    gang_kernels_free(m->mem, m->final_norm);
    gang_kernels_free(m->mem, m->embed);
    if (!m->lm_head_tied)
        gang_kernels_free(m->mem, m->lm_head);
    m->final_norm = NULL;
    m->embed = NULL;
    m->lm_head = NULL;
    m->mem = NULL;
}
