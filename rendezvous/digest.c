/*
 * Model digest: a cheap fingerprint of a model directory that JOIN carries, so that the
 * coordinator can refuse a member that loaded a different model before any rank wastes
 * time on comms with it.
 *
 * Hashing every weight byte would take minutes for a large model, so the digest covers
 * what distinguishes models in practice: the whole of config.json, plus the name and size
 * of every *.safetensors and *.json file. Precisely (docs/protocol.md repeats it):
 *
 *   digest = SHA-256( SHA-256(config.json bytes) |
 *                     for each file, names sorted bytewise (strcmp):
 *                         name bytes | 0x00 | u64le size )
 *
 * config.json goes in through its own hash so that its length never has to be known up
 * front and its bytes can never be mistaken for a file entry. Names are sorted with
 * strcmp, not the locale's collation, because every node must produce the same order.
 * Hidden files (a leading '.', such as the ..data links of Kubernetes volume mounts) and
 * anything that is not a regular file after following symlinks are left out.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "ganglion/rendezvous.h"

/* A config.json this big is not a model config; stop instead of hashing it forever. */
#define CONFIG_MAX (64u * 1024u * 1024u)
#define READ_CHUNK (64u * 1024u)

static int has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s);
    size_t k = strlen(suffix);

    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

static int entry_filter(const struct dirent *e)
{
    if (e->d_name[0] == '.')
        return 0;
    return has_suffix(e->d_name, ".safetensors") || has_suffix(e->d_name, ".json");
}

static int entry_cmp(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* Maps a failed directory or file lookup to the codes the contract names. */
static int lookup_err(int e)
{
    return (e == ENOENT || e == ENOTDIR) ? GANG_ENOENT : gang_err_from_errno(e);
}

/*
 * Feeds the bytes of the file at path into st, in bounded chunks: all of it when
 * refuse_over is set (GANG_EMODEL once it passes max bytes), else its first max bytes.
 * Returns 0, GANG_ENOENT, GANG_ENOMEM or another errno-derived code.
 */
static int hash_bytes(const char *path, crypto_hash_sha256_state *st, uint64_t max, int refuse_over)
{
    uint64_t total = 0;
    int rc = 0, fd;
    uint8_t *chunk = malloc(READ_CHUNK);

    if (chunk == NULL)
        return GANG_ENOMEM;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = lookup_err(errno);
        goto out_free;
    }
    while (refuse_over || total < max) {
        size_t want = READ_CHUNK;
        if (!refuse_over && max - total < want)
            want = (size_t)(max - total);
        ssize_t n = read(fd, chunk, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = gang_err_from_errno(errno);
            break;
        }
        if (n == 0)
            break;
        total += (uint64_t)n;
        if (refuse_over && total > max) {
            rc = GANG_EMODEL;
            break;
        }
        crypto_hash_sha256_update(st, chunk, (unsigned long long)n);
    }
    close(fd);
out_free:
    free(chunk);
    return rc;
}

/*
 * Writes SHA-256 of the file at path into out. Returns 0, GANG_ENOENT, another
 * errno-derived code, or GANG_EMODEL when the file exceeds CONFIG_MAX.
 */
static int hash_file(const char *path, uint8_t out[crypto_hash_sha256_BYTES])
{
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    int rc = hash_bytes(path, &st, CONFIG_MAX, 1);
    if (rc == 0)
        crypto_hash_sha256_final(&st, out);
    return rc;
}

/*
 * The digest of a model that is one file (a GGUF file): SHA-256 of "file" | the file's
 * first FILE_HEAD_BYTES bytes (its metadata and tensor table for any usual model) | its
 * u64le size. The name is left out, as a directory's own name is.
 */
#define FILE_HEAD_BYTES (4u * 1024u * 1024u)
static int digest_file(const char *path, uint64_t size, uint8_t out[GANG_DIGEST_SIZE])
{
    crypto_hash_sha256_state st;
    uint8_t size_le[8];

    crypto_hash_sha256_init(&st);
    crypto_hash_sha256_update(&st, (const uint8_t *)"file", 4);
    int rc = hash_bytes(path, &st, FILE_HEAD_BYTES, 0);
    if (rc != 0)
        return rc;
    for (int b = 0; b < 8; b++)
        size_le[b] = (uint8_t)(size >> (8 * b));
    crypto_hash_sha256_update(&st, size_le, sizeof size_le);
    crypto_hash_sha256_final(&st, out);
    return 0;
}

/*
 * Computes the digest of the model directory dir into out (see rendezvous.h and the top
 * of this file; a regular file is digested by digest_file). Returns 0; GANG_ENOENT when dir
 * or its config.json does not exist;
 * GANG_EINVAL for a path too long; GANG_EMODEL for an oversized config.json; another
 * errno-derived code for I/O errors. out is written only on success.
 */
int gang_model_digest(const char *dir, uint8_t out[GANG_DIGEST_SIZE])
{
    crypto_hash_sha256_state st;
    uint8_t config_hash[crypto_hash_sha256_BYTES];
    char path[PATH_MAX];
    struct dirent **names = NULL;
    int count;
    int rc = 0;

    if (dir == NULL || dir[0] == '\0') {
        static const uint8_t nothing[1];
        crypto_hash_sha256(out, nothing, 0);
        return 0;
    }

    struct stat dst;
    if (stat(dir, &dst) == 0 && S_ISREG(dst.st_mode)) /* a one-file model (GGUF) */
        return digest_file(dir, (uint64_t)dst.st_size, out);
    count = scandir(dir, &names, entry_filter, entry_cmp);
    if (count < 0)
        return lookup_err(errno);

    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path) {
        rc = GANG_EINVAL;
        goto out_names;
    }
    rc = hash_file(path, config_hash);
    if (rc < 0)
        goto out_names;

    crypto_hash_sha256_init(&st);
    crypto_hash_sha256_update(&st, config_hash, sizeof config_hash);
    for (int i = 0; i < count; i++) {
        const char *name = names[i]->d_name;
        struct stat sb;
        uint8_t size_le[8];

        if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) {
            rc = GANG_EINVAL;
            goto out_names;
        }
        if (stat(path, &sb) < 0) {
            rc = lookup_err(errno);
            goto out_names;
        }
        if (!S_ISREG(sb.st_mode))
            continue;
        for (int b = 0; b < 8; b++)
            size_le[b] = (uint8_t)((uint64_t)sb.st_size >> (8 * b));
        /* The name's terminating NUL separates it from the size bytes. */
        crypto_hash_sha256_update(&st, (const uint8_t *)name, strlen(name) + 1);
        crypto_hash_sha256_update(&st, size_le, sizeof size_le);
    }
    crypto_hash_sha256_final(&st, out);

out_names:
    for (int i = 0; i < count; i++)
        free(names[i]);
    free(names);
    return rc;
}
