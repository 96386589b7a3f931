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
 */
#include <stdlib.h>

#include "ganglion/model.h"
#include "model-internal.h"

/* Moves one optional host array of n bytes into k; NULL stays NULL. */
static int dev_move(gang_kernels *k, void **arr, size_t n)
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
    free(*arr);
    *arr = d;
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
    if (m->blocks) {
        gang_error("model: a GGUF file's blocks are computed on the CPU only so far: "
                   "--dtype bf16 (or f32) dequantizes them for --device %s",
                   gang_kernels_name(k));
        return GANG_ENOSYS;
    }
    hidden = m->cfg.hidden != 0 ? m->cfg.hidden : m->topo.hidden;
    /* The embedding table and the LM head are packed weights of m->wtype. */
    top[0] = (void **)&m->final_norm, n[0] = hidden * sizeof(float);
    top[1] = &m->embed, n[1] = gang_kernels_weight_bytes(m->wtype, m->topo.vocab, hidden);
    top[2] = &m->lm_head;
    n[2] = gang_kernels_weight_bytes(m->wtype, m->shard.vocab_count, hidden);
    /* A tied head is rows of the table: it moves with it (count: what has arrays). */
    count = m->lm_head_tied ? 2 : 3;
    m->mem = k;
    for (j = 0; j < count; j++) {
        rc = dev_move(k, top[j], n[j]);
        if (rc != 0)
            break;
    }
    if (rc == 0 && m->lm_head_tied)
        m->lm_head = gang__model_tied_head(m);
    for (i = 0; rc == 0 && m->layers != NULL && i < m->layer_count; i++)
        rc = gang_tp_layer_to_device(&m->layers[i], k);
    if (rc == 0)
        return 0;
    /*
     * A failed move leaves the model unusable but consistent: the top-level arrays that
     * did not move (j and after) are dropped here, so each one is device memory or NULL,
     * and each layer records where its arrays are; gang_model_device_release followed by
     * gang_model_free then releases everything exactly once.
     */
    for (; j < count; j++) {
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
