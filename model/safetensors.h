/*
 * Safetensors reader (internal to model/): one file, or the set of files named by a
 * model.safetensors.index.json, opened read-only and validated before anything is read.
 *
 * File layout (https://github.com/huggingface/safetensors, "format"):
 *
 *     [8 bytes: N, little-endian u64][N bytes: JSON header][data section]
 *
 * The header is a JSON object: "__metadata__" (an object of strings, skipped) and, for
 * every tensor, "name": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [b, e]}
 * where [b, e) is a byte range of the data section. gang__st_open refuses anything that
 * could make a later read go wrong: N beyond the file or GANG_MODEL_MAX_HEADER_BYTES, a
 * header that is not a JSON object of such entries, a dtype other than F32/F16/BF16, an
 * element count that overflows, offsets outside the data section, a range whose size is
 * not elements x dtype size, two tensors of one name, and two ranges that overlap.
 *
 * Memory: a file is opened, its header read and validated, and nothing else is touched
 * until gang__st_read copies out the rows and columns it is asked for with pread, so the
 * resident memory of a loader is what it copies out, not the file. (A read-only mapping
 * released with MADV_DONTNEED was measured first and kept stray large-folio pages
 * resident; see safetensors.c.)
 *
 * Threads: a file or set is read-only after open and may be read from several threads.
 */
#ifndef GANGLION_MODEL_SAFETENSORS_H
#define GANGLION_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/comm.h"

#define GANG__ST_MAX_DIMS 8
#define GANG__ST_INDEX_NAME "model.safetensors.index.json"
#define GANG__ST_SINGLE_NAME "model.safetensors"

/* One tensor entry of a header, validated. */
typedef struct gang__st_tensor {
    char *name;       /* owned */
    gang_dtype dtype; /* F32, F16 or BF16 */
    uint32_t ndim;    /* 0 .. GANG__ST_MAX_DIMS */
    uint64_t shape[GANG__ST_MAX_DIMS];
    uint64_t numel; /* product of the shape (1 for a scalar) */
    uint64_t begin; /* byte range [begin, end) of the data section */
    uint64_t end;
} gang__st_tensor;

/* One open safetensors file. */
typedef struct gang__st_file {
    char *path;               /* as opened, for messages */
    const char *base;         /* the file name part of path */
    int fd;                   /* -1 when closed */
    uint64_t size;            /* file size */
    uint64_t data_off;        /* 8 + N: where the data section starts */
    gang__st_tensor *tensors; /* sorted by name */
    size_t n_tensors;
} gang__st_file;

/*
 * Opens and validates one file (read-only; the header is read, no data). Returns 0 and
 * *f (release with gang__st_close); GANG_EMODEL with a one-line message naming the file
 * for every refusal listed above and for a file that cannot be opened; GANG_ENOMEM. *f
 * owns nothing on error.
 */
int gang__st_open(const char *path, gang__st_file *f, char *err, size_t errlen);

/* Closes a file from gang__st_open and zeroes it; safe on a zeroed struct. */
void gang__st_close(gang__st_file *f);

/* The tensor called name, or NULL. */
const gang__st_tensor *gang__st_find(const gang__st_file *f, const char *name);

/*
 * Copies the band rows [row_first, +row_count) x columns [col_first, +col_count) of
 * tensor t, seen as a matrix [shape[0], numel / shape[0]] (a 1-D tensor is one row),
 * into dst [row_count, col_count] as f32, converting F16 and BF16 exactly. Reads only
 * those bytes (one pread per row of a column band, one range for a band of whole rows).
 * Returns 0; GANG_EINVAL for a band outside the tensor (the caller checks shapes first,
 * so this is a bug guard); GANG_EIO when the file cannot be read (it shrank or failed
 * after validation).
 */
int gang__st_read(const gang__st_file *f, const gang__st_tensor *t, uint64_t row_first,
                  uint64_t row_count, uint64_t col_first, uint64_t col_count, float *dst);

/*
 * The weights of a model directory: DIR/model.safetensors when it exists, otherwise
 * DIR/model.safetensors.index.json and the files its "weight_map" names (each opened
 * once). Index validation: a JSON object whose "weight_map" is an object of tensor name
 * -> file name strings; file names must be plain names in DIR (no '/', '\\' or "..");
 * each named file must open and validate, and must hold the tensors mapped to it.
 */
typedef struct gang__st_set {
    gang__st_file *files;
    size_t n_files;
    struct gang__st_entry *entries; /* index mode: tensor -> file, sorted by name */
    size_t n_entries;
} gang__st_set;

/* Opens the weights of dir. Returns 0 and *s (release with gang__st_set_close);
 * GANG_EMODEL with a message naming the file; GANG_ENOMEM. *s owns nothing on error. */
int gang__st_set_open(const char *dir, gang__st_set *s, char *err, size_t errlen);

/* Closes every file of a set and zeroes it; safe on a zeroed struct. */
void gang__st_set_close(gang__st_set *s);

/* Finds tensor name in the set: 0 with *file and *t, or GANG_ENOENT. */
int gang__st_set_find(const gang__st_set *s, const char *name, const gang__st_file **file,
                      const gang__st_tensor **t);

/*
 * Reads a whole small file (config.json, an index) into a NUL-terminated malloc'd buffer.
 * Returns 0 with *out (free it) and *len; GANG_EMODEL with a message naming the file when
 * it cannot be read, is not a regular file or is larger than max bytes; GANG_ENOMEM.
 */
int gang__read_small_file(const char *path, size_t max, char **out, size_t *len, char *err,
                          size_t errlen);

#endif /* GANGLION_MODEL_SAFETENSORS_H */
