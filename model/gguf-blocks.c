/*
 * A GGUF file's quantized tensors kept as their blocks (issue #27): one rank's band of a
 * weight read as the file's bytes, whole blocks, for the block types the kernels compute
 * with (include/ganglion/kernels.h, "Block types"), and the one-line description of how
 * a loaded shard stores its weights.
 *
 * A band of rows is whole rows of blocks: always kept. A band of columns (the
 * row-parallel o_proj and down_proj of a TP shard) is kept only when it starts and ends
 * on the type's block boundaries (32 or 256 elements); otherwise the caller dequantizes
 * that tensor to f32 and says so (gang__gguf_band_blocks hands it the reason). q_proj and
 * k_proj rows are put back in the Hugging Face order within each head, as gguf-load.c
 * does for f32, by moving whole rows of blocks.
 *
 * Mapped weights (issue #27, "load time and RSS track the file"): when the loader has
 * mapped the file (gang__gguf_map, the default; `--no-mmap` reads), a band of whole rows
 * in the file's order is not copied: the array handed back points into the mapping, at
 * the file's bytes, and only the pages a rank's kernels read become resident (a TP row
 * band is one contiguous range of the file; MADV_WILLNEED starts reading it ahead). What
 * needs a copy is still read with pread into an array of its own, so the mapping's pages
 * of it are never touched: a band of columns (the row-parallel o_proj / down_proj of a
 * TP shard: a short range per row) and the q_proj / k_proj of a Llama file (rows
 * reordered within each head). The kernels read blocks with unaligned loads, so the
 * file's alignment (general.alignment, 32 by default; a row band starts anywhere a row
 * does) is enough.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ganglion/model.h"
#include "gguf.h"
#include "model-internal.h"

/* Hugging Face row order within each head of rows x rb bytes (see gguf-load.c). */
static int gb_unpermute(char *w, uint64_t rows, size_t rb, uint32_t head_dim)
{
    uint64_t half = head_dim / 2;
    size_t per = (size_t)head_dim * rb;
    char *tmp = malloc(per);

    if (tmp == NULL)
        return GANG_ENOMEM;
    for (uint64_t h = 0; h < rows / head_dim; h++) {
        char *head = w + h * per;
        memcpy(tmp, head, per);
        for (uint64_t a = 0; a < 2; a++)
            for (uint64_t b = 0; b < half; b++)
                memcpy(head + (a * half + b) * rb, tmp + (2 * b + a) * rb, rb);
    }
    free(tmp);
    return 0;
}

static int gb_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int gang__gguf_band_blocks(const gang__gguf *g, const struct gang_model_config *cfg,
                           const char *hf_name, uint64_t rows, uint64_t cols, uint64_t row_first,
                           uint64_t row_count, uint64_t col_first, uint64_t col_count, void **out,
                           gang_kernels_wtype *type, char *why, size_t whylen, size_t *bytes)
{
    const gang__gguf_tensor *t = NULL;
    char name[160];
    size_t e = 0, bb = 0, rb;
    char *w;
    int rc = 0;

    *out = NULL;
    if (why != NULL && whylen > 0)
        why[0] = '\0';
    if (gang__gguf_hf_name((int)cfg->arch, hf_name, name, sizeof(name)) == 0)
        t = gang__gguf_find(g, name);
    /* Anything unusual is the f32 path's to report, with its messages. */
    if (t == NULL || rows == 0 || t->n_dims != 2 || t->ne[0] != cols || t->rows != rows ||
        !gang__gguf_kernel_type(t->type, type) || !gang_kernels_wtype_block(*type, &e, &bb) ||
        row_first > rows || row_count > rows - row_first || col_first > cols ||
        col_count > cols - col_first || row_count == 0 || col_count == 0)
        return 0;
    if (col_first % e != 0 || col_count % e != 0) {
        snprintf(why, whylen,
                 "%s (%s): this rank's columns [%llu, %llu) do not fall on its %zu-element "
                 "blocks",
                 name, gang_kernels_wtype_name(*type), (unsigned long long)col_first,
                 (unsigned long long)(col_first + col_count), e);
        return 0;
    }
    int permuted = cfg->arch == GANG_ARCH_LLAMA && (gb_ends_with(hf_name, "q_proj.weight") ||
                                                    gb_ends_with(hf_name, "k_proj.weight"));
    if (permuted && (row_first % cfg->head_dim != 0 || row_count % cfg->head_dim != 0))
        return 0;
    rb = (size_t)(col_count / e) * bb;
    uint64_t base = g->data_start + t->offset + row_first * t->row_bytes + col_first / e * bb;
    if (g->map != NULL && col_count == cols && !permuted) {
        /* The file's bytes as they lie: parse checked data_start + offset + bytes <= the
         * file's size, which is the mapping's. */
        *out = g->map + base;
        gang__gguf_map_advise(g->map, base, rb * (size_t)row_count, MADV_WILLNEED);
        *bytes += rb * (size_t)row_count;
        return 0;
    }
    w = gang_kernels_weight_host_alloc(rb * (size_t)row_count);
    if (w == NULL)
        return GANG_ENOMEM;
    if (col_count == cols) /* whole rows: one range */
        rc = gang__gguf_pread(g->fd, w, rb * (size_t)row_count, base);
    for (uint64_t r = 0; col_count != cols && r < row_count && rc == 0; r++)
        rc = gang__gguf_pread(g->fd, w + r * rb, rb, base + r * t->row_bytes);
    if (rc == 0 && permuted)
        rc = gb_unpermute(w, row_count, rb, cfg->head_dim);
    if (rc != 0) {
        free(w);
        snprintf(why, whylen, "%s: read failed (the file changed or shrank?)", name);
        return rc == GANG_EIO ? GANG_EMODEL : rc;
    }
    *out = w;
    *bytes += rb * (size_t)row_count;
    return 0;
}

int gang__gguf_map(const gang__gguf *g, void **base, char *err, size_t errlen)
{
    void *p;

    *base = NULL;
    if (g->fd < 0 || g->file_size == 0 || g->file_size > SIZE_MAX) {
        gang_set_err(err, errlen, "%s: cannot be mapped (not an open file of a size mmap takes)",
                     g->path);
        return GANG_EINVAL;
    }
    /* Read-only and private: nothing is ever written through it, and a file changed
     * underneath is the page cache's business, not a write into the file. */
    p = mmap(NULL, (size_t)g->file_size, PROT_READ, MAP_PRIVATE, g->fd, 0);
    if (p == MAP_FAILED) {
        gang_set_err(err, errlen, "%s: mmap of %llu bytes failed: %s", g->path,
                     (unsigned long long)g->file_size, strerror(errno));
        return GANG_EIO;
    }
    *base = p;
    return 0;
}

void gang__gguf_map_advise(const void *map, uint64_t off, size_t n, int advice)
{
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t page = pg > 0 ? (uintptr_t)pg : 4096u;
    uintptr_t a = (uintptr_t)map + (uintptr_t)off, end = a + n;

    if (map == NULL || n == 0)
        return;
    /* MADV_DONTNEED drops whole pages only: shrink to the pages inside the range (a page
     * shared with a neighbour stays); WILLNEED may cover them whole. */
    if (advice == MADV_DONTNEED) {
        a = (a + page - 1) / page * page;
        end = end / page * page;
    } else {
        a = a / page * page;
    }
    if (end > a)
        (void)madvise((void *)a, end - a, advice); /* advice: best effort */
}

void gang__model_storage_desc(const gang_model *m, char *buf, size_t cap)
{
    size_t count[GANG_KW_LAST + 1] = {0}, used = 0, mapped = 0;

    for (uint32_t i = 0; m->layers != NULL && i < m->layer_count; i++) {
        const gang_tp_layer *l = &m->layers[i];
        const void *const mats[7] = {l->wq, l->wk, l->wv, l->wo, l->w_gate, l->w_up, l->w_down};
        for (int j = 0; j < 7; j++) {
            if (mats[j] != NULL)
                count[l->mixed ? l->mtype[j] : l->wtype]++;
            mapped += gang__model_in_map(m, mats[j]);
        }
    }
    if (m->embed != NULL)
        count[m->wtype]++;
    mapped += gang__model_in_map(m, m->embed);
    if (m->lm_head != NULL && !m->lm_head_tied) {
        count[m->blocks ? m->head_type : m->wtype]++;
        mapped += gang__model_in_map(m, m->lm_head);
    }
    buf[0] = '\0';
    used += (size_t)snprintf(buf, cap, "%s", m->blocks ? "the GGUF file's own blocks:" : "");
    for (int t = 0; t <= GANG_KW_LAST && used < cap; t++)
        if (count[t] > 0)
            used += (size_t)snprintf(buf + used, cap - used, "%s%s x %zu",
                                     used > 0 && buf[used - 1] != ':' ? ", " : " ",
                                     gang_kernels_wtype_name((gang_kernels_wtype)t), count[t]);
    if (m->wmap != NULL && used < cap)
        snprintf(buf + used, cap - used, " (%zu mapped from the file)", mapped);
    if (used > 0 && buf[0] == ' ')
        memmove(buf, buf + 1, strlen(buf));
}
