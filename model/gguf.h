/*
 * GGUF reader (internal to model/): llama.cpp's single-file model format, opened
 * read-only and validated before anything is read (docs/model.md, "GGUF files").
 *
 * File layout (version 2 and 3, little-endian):
 *
 *     "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *     n_kv x (string key | u32 type | value)          metadata
 *     n_tensors x (string name | u32 n_dims | n_dims x u64 ne | u32 type | u64 offset)
 *     padding to general.alignment (32 when absent)
 *     data section: each tensor at data_start + offset
 *
 * A string is u64 length + bytes; an array is u32 element type + u64 count + elements.
 * ne[0] is the innermost (column) dimension: a tensor of ne [cols, rows] is rows x cols
 * in row-major order, and a quantized row is ne[0] / block elements blocks.
 *
 * gang__gguf_parse refuses whatever could make a later read go wrong, with one line that
 * names the file and the item: bad magic, a version other than 2 or 3, a header cut
 * short, counts, string lengths or array counts beyond what the file can hold or beyond
 * the caps below, nested arrays, unknown value types, an alignment that is not a power
 * of two, tensors with more than 4 dimensions, a zero or overflowing dimension, an
 * unknown or unsupported tensor type (named), a row that is not whole blocks, a data
 * offset that is not aligned, data outside the file, two tensors of one name and two
 * tensors whose bytes overlap.
 *
 * Memory: the header (metadata + tensor infos) is read into one buffer (at most
 * GANG__GGUF_MAX_HEADER bytes); tensor data is read only by gang__gguf_read, with pread
 * of the rows asked for, through bounded scratch buffers.
 */
#ifndef GANGLION_MODEL_GGUF_H
#define GANGLION_MODEL_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/kernels.h"

#define GANG__GGUF_MAX_DIMS 4
#define GANG__GGUF_MAX_HEADER (64u << 20) /* metadata + tensor infos (Llama 3: ~10 MB) */
#define GANG__GGUF_MAX_KV 65536u          /* metadata entries */
#define GANG__GGUF_MAX_TENSORS 65536u
#define GANG__GGUF_MAX_KEY 65536u         /* bytes of a key or a tensor name */
#define GANG__GGUF_MAX_STRING (16u << 20) /* bytes of one string value */
#define GANG__GGUF_MAX_ARRAY (1u << 24)   /* elements of one array */
#define GANG__GGUF_MAX_ALIGN (1u << 20)

/* Metadata value types. */
enum {
    GANG__GGUF_U8 = 0,
    GANG__GGUF_I8 = 1,
    GANG__GGUF_U16 = 2,
    GANG__GGUF_I16 = 3,
    GANG__GGUF_U32 = 4,
    GANG__GGUF_I32 = 5,
    GANG__GGUF_F32 = 6,
    GANG__GGUF_BOOL = 7,
    GANG__GGUF_STRING = 8,
    GANG__GGUF_ARRAY = 9,
    GANG__GGUF_U64 = 10,
    GANG__GGUF_I64 = 11,
    GANG__GGUF_F64 = 12
};

/* Tensor types read (ggml's numbering); every other one is refused by name. */
enum {
    GANG__GGML_F32 = 0,
    GANG__GGML_F16 = 1,
    GANG__GGML_Q4_0 = 2,
    GANG__GGML_Q4_1 = 3,
    GANG__GGML_Q5_0 = 6,
    GANG__GGML_Q5_1 = 7,
    GANG__GGML_Q8_0 = 8,
    GANG__GGML_Q4_K = 12,
    GANG__GGML_Q5_K = 13,
    GANG__GGML_Q6_K = 14,
    GANG__GGML_IQ4_NL = 20,
    GANG__GGML_IQ4_XS = 23,
    GANG__GGML_BF16 = 30
};

/* One metadata entry. Scalars are decoded; strings and arrays point into the header. */
typedef struct gang__gguf_kv {
    const char *key; /* into the header buffer, key_len bytes (not NUL-terminated) */
    uint32_t key_len;
    uint32_t type;     /* GANG__GGUF_* */
    uint32_t arr_type; /* arrays: the element type */
    uint64_t n;        /* arrays: element count; strings: byte length */
    uint64_t off;      /* offset in the header of the string bytes / first element */
    union {
        uint64_t u;
        int64_t i;
        double f;
    } num; /* integer, bool and float scalars */
} gang__gguf_kv;

typedef struct gang__gguf_tensor {
    char *name; /* owned, NUL-terminated */
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[GANG__GGUF_MAX_DIMS]; /* 1 beyond n_dims */
    uint64_t offset;                  /* from the data section start */
    uint64_t bytes;                   /* rows x row_bytes */
    uint64_t rows;                    /* ne[1] x ne[2] x ne[3] */
    uint64_t row_bytes;               /* bytes of one row of ne[0] elements */
} gang__gguf_tensor;

typedef struct gang__gguf {
    char *path; /* for messages (owned) */
    int fd;     /* -1 when closed or parsed from memory */
    uint64_t file_size;
    uint32_t version;
    uint8_t *hdr; /* the header bytes (owned) */
    size_t hdr_len;
    uint64_t *str_offs; /* string arrays: offsets of their elements (owned, one pool) */
    gang__gguf_kv *kv;  /* in file order */
    size_t n_kv;
    gang__gguf_tensor *tensors; /* sorted by name */
    size_t n_tensors;
    uint64_t alignment;
    uint64_t data_start;
    /* The whole file mapped read-only (gang__gguf_map), or NULL (pread); not owned: the
     * model whose arrays point into it unmaps it. */
    uint8_t *map;
} gang__gguf;

/* A string as pointer + length (not NUL-terminated). */
typedef struct gang__gguf_str {
    const char *p;
    uint64_t n;
} gang__gguf_str;

/*
 * Parses a GGUF header from buf[0..len), the first len bytes of a file of file_size
 * bytes (len == file_size for a whole file in memory), into *g (name: for messages).
 * Returns 0; GANG_EAGAIN when the header continues beyond len (read more and call
 * again); GANG_EMODEL with a one-line message for every refusal listed above;
 * GANG_ENOMEM. *g owns the copy of the header it keeps and nothing on error.
 */
int gang__gguf_parse(const uint8_t *buf, size_t len, uint64_t file_size, const char *name,
                     gang__gguf *g, char *err, size_t errlen);

/* Opens and validates path (a regular file). 0 and *g (gang__gguf_close); GANG_EMODEL
 * with a message naming the file; GANG_ENOMEM. */
int gang__gguf_open(const char *path, gang__gguf *g, char *err, size_t errlen);

/* Releases everything of g and zeroes it; safe on a zeroed struct. */
void gang__gguf_close(gang__gguf *g);

/* pread of exactly n bytes of fd at off (EINTR retried): 0, or GANG_EIO on an error or
 * end of file. */
int gang__gguf_pread(int fd, void *buf, size_t n, uint64_t off);

/* The metadata entry key, or NULL. */
const gang__gguf_kv *gang__gguf_find_kv(const gang__gguf *g, const char *key);
/* The tensor called name, or NULL. */
const gang__gguf_tensor *gang__gguf_find(const gang__gguf *g, const char *name);

/* Element i of a string array kv (or the string kv itself with i == 0). */
gang__gguf_str gang__gguf_arr_str(const gang__gguf *g, const gang__gguf_kv *kv, uint64_t i);
/* Element i of an integer array kv as int64 (0 for other types). */
int64_t gang__gguf_arr_int(const gang__gguf *g, const gang__gguf_kv *kv, uint64_t i);
/* Element i of a float array kv (0 for other types). */
double gang__gguf_arr_float(const gang__gguf *g, const gang__gguf_kv *kv, uint64_t i);

/*
 * Copies rows [row_first, +row_count) x columns [col_first, +col_count) of tensor t (a
 * matrix [t->rows, ne[0]]) into dst [row_count, col_count] as f32: whole rows are read
 * (pread) and dequantized, and the column slice is kept. Returns 0; GANG_EINVAL for a
 * band outside the tensor; GANG_EIO when the file cannot be read; GANG_ENOMEM.
 */
int gang__gguf_read(const gang__gguf *g, const gang__gguf_tensor *t, uint64_t row_first,
                    uint64_t row_count, uint64_t col_first, uint64_t col_count, float *dst);

/* ---- quantized blocks (gguf-quant.c) ---- */

/* Name of a tensor type ("Q4_K"), or NULL when ggml has no such type. */
const char *gang__gguf_type_name(uint32_t type);
/* Elements and bytes of one block of a supported type: 0, or GANG_EMODEL (unsupported). */
int gang__gguf_type_block(uint32_t type, uint32_t *elems, uint32_t *bytes);
/* 1 with *out the kernels' block type (gang_kernels_wtype) of a GGML tensor type, 0 when
 * the kernels have none (F32, F16, BF16 and the unsupported types). */
int gang__gguf_kernel_type(uint32_t type, gang_kernels_wtype *out);
/* Dequantizes n elements (whole blocks) of a supported type from src to dst. */
void gang__gguf_dequant(uint32_t type, const uint8_t *src, float *dst, uint64_t n);

/* ---- model config from metadata (gguf-config.c) ---- */

struct gang_model_config;
/* Fills cfg from the llama.* metadata of a GGUF file (gang_model_config_read's hook). */
int gang__gguf_config_read(const char *path, struct gang_model_config *cfg, char *err,
                           size_t errlen);
/* Whether path names a GGUF file (ends in ".gguf"). */
int gang__gguf_is_path(const char *path);
/* The GGUF tensor name of a Hugging Face tensor name of a model of architecture arch (a
 * gang_model_arch: Gemma's post_attention_layernorm is not Llama's), into out (cap);
 * 0 or GANG_ENOENT. */
int gang__gguf_hf_name(int arch, const char *hf, char *out, size_t cap);
/* The GGUF name of a mixture-of-experts tensor's Hugging Face name (gguf-load.c): the
 * router (ffn_gate_inp), an expert's projection (ffn_{gate,up,down}_exps, *expert its
 * index; -1 for the others), the shared expert (ffn_*_shexp, ffn_gate_inp_shexp). expert
 * may be NULL. 0 or GANG_ENOENT. */
int gang__gguf_moe_name(const char *hf, char *out, size_t cap, int64_t *expert);

/* ---- tokenizer.json from metadata (gguf-text.c, gguf-spm.c) ---- */

struct cJSON;
/* A NUL-terminated malloc'd copy of a metadata string (NULL on ENOMEM or an embedded NUL). */
char *gang__gguf_str_dup(gang__gguf_str s);
/* Adds item to obj under name, taking item even on failure; 0 or GANG_ENOMEM. */
int gang__gguf_json_add(struct cJSON *obj, const char *name, struct cJSON *item);

/*
 * The BPE model of a SentencePiece vocabulary (tokenizer.ggml.model "llama": tokens,
 * scores, unknown_token_id) into root["model"], with the normalizer and decoder of a
 * legacy Llama tokenizer.json (see gguf-spm.c). 0, GANG_EMODEL with a message (no or bad
 * scores, too many merges) or GANG_ENOMEM.
 */
int gang__gguf_spm(const gang__gguf *g, const gang__gguf_kv *toks, struct cJSON *root, char *err,
                   size_t errlen);

/* ---- shared by config.c and gguf-config.c ---- */

/* Gemma 3's constant features on cfg (hidden, head_dim set): q/k norm, sandwich norms,
 * (1 + w) norm weights, GeGLU, sqrt(hidden) embedding scale, and q_scale from the
 * query_pre_attn_scalar qpas (> 0). */
void gang__model_gemma_defaults(struct gang_model_config *cfg, float qpas);

/* ---- weights by Hugging Face name (gguf-load.c) ---- */

/*
 * The loader's band read (model/load.c, ld_band) for a GGUF file: rows [row_first,
 * +row_count) x columns [col_first, +col_count) of the Hugging Face tensor hf_name, whose
 * shape must be [rows, cols] (rows == 0: the 1-D [cols]), read from the GGUF tensor of
 * that role (ne [cols, rows]) into a new malloc'd f32 array *out; q_proj and k_proj rows
 * are put back in the Hugging Face order (llama.cpp permutes them within each head for
 * its RoPE convention). *bytes grows by the f32 bytes copied. Returns 0; GANG_EMODEL
 * (missing tensor, wrong shape, read failure) with a message naming the file and the
 * tensor; GANG_ENOMEM.
 */
int gang__gguf_band(const gang__gguf *g, const struct gang_model_config *cfg, const char *hf_name,
                    uint64_t rows, uint64_t cols, uint64_t row_first, uint64_t row_count,
                    uint64_t col_first, uint64_t col_count, float **out, char *err, size_t errlen,
                    size_t *bytes);

/* ---- weights as the file's blocks (gguf-blocks.c) ---- */

/*
 * The band of gang__gguf_band kept as the file's own blocks (issue #27): when the GGUF
 * tensor for hf_name is 2-D of shape [rows, cols] with a block type the kernels compute
 * with, and the band's columns start and end on block boundaries, *out is a new array
 * (gang_kernels_weight_host_alloc; free()) of row_count rows of whole blocks, *type its
 * kernels type, q_proj / k_proj rows in the Hugging Face order, and *bytes grows by its
 * size. Otherwise *out stays NULL and the caller reads the band as f32 (gang__gguf_band);
 * why[] then says why when the reason is the TP cut (columns off the block boundaries),
 * else it is empty. Returns 0 (either way), GANG_EMODEL on a read failure (why says so)
 * or GANG_ENOMEM.
 */
int gang__gguf_band_blocks(const gang__gguf *g, const struct gang_model_config *cfg,
                           const char *hf_name, uint64_t rows, uint64_t cols, uint64_t row_first,
                           uint64_t row_count, uint64_t col_first, uint64_t col_count, void **out,
                           gang_kernels_wtype *type, char *why, size_t whylen, size_t *bytes);

/*
 * Maps g's whole file read-only and private (mmap PROT_READ, MAP_PRIVATE) into *base, of
 * g->file_size bytes, for the caller to own (munmap) and to set as g->map, after which
 * gang__gguf_band_blocks hands out whole-row bands as pointers into it. Returns 0;
 * GANG_EINVAL (no open file, or a size mmap cannot take) or GANG_EIO (mmap failed), with
 * a message naming the file. The file was validated by gang__gguf_open (every tensor
 * inside it); a file cut short later, while mapped, faults (SIGBUS) on a read of the
 * lost pages, as any mapped file does.
 */
int gang__gguf_map(const gang__gguf *g, void **base, char *err, size_t errlen);

/*
 * madvise(advice) of the bytes [off, off + n) of the mapping map, best effort:
 * MADV_WILLNEED on the pages that hold any of them, MADV_DONTNEED only on the pages
 * wholly inside them (a page shared with a neighbouring tensor stays).
 */
void gang__gguf_map_advise(const void *map, uint64_t off, size_t n, int advice);

#endif /* GANGLION_MODEL_GGUF_H */
