/*
 * Data-plane bootstrap: the one place that knows the blob a gang's rank 0 hands to every
 * rank through the control plane, and how each rank turns it into communicators. The
 * launcher carries the blob opaquely (format and contracts in include/ganglion/comm.h):
 *
 *   SOCKET                      the socket backend's blob (gang_comm_socket_listen)
 *   SOCKET "\n" "nccl:" HEX     the same, then the NCCL unique id in lowercase hex
 *
 * Rank 0 builds it with gang_bootstrap_create(); every rank validates it with
 * gang_bootstrap_parse() and joins with gang_bootstrap_join().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ganglion/comm.h"

#define BOOT_NCCL_PREFIX "nccl:"
#define BOOT_SOCKET_CAP 1024 /* the socket part: host (<= 255), port and session id */

struct gang_bootstrap {
    gang_comm_listener *listener; /* rank 0's socket listener, handed to the socket join */
};

/* Checks the socket part blob[0, *nl): printable bytes up to the first newline. */
static int boot_parse_socket(const uint8_t *blob, size_t len, size_t *nl, char *err, size_t errlen)
{
    size_t i;

    *nl = len;
    for (i = 0; i < len; i++) {
        if (blob[i] == '\n') {
            *nl = i;
            break;
        }
        if (blob[i] < 0x20 || blob[i] > 0x7e) {
            snprintf(err, errlen,
                     "bootstrap blob: byte %zu of the socket part is 0x%02x, "
                     "not a printable character",
                     i, blob[i]);
            return GANG_EPROTO;
        }
    }
    if (*nl == 0) {
        snprintf(err, errlen, "bootstrap blob: the socket part before the nccl line is empty");
        return GANG_EPROTO;
    }
    return 0;
}

/* Checks the line after the socket part: "nccl:" and exactly 256 lowercase hex digits. */
static int boot_parse_nccl(const uint8_t *l2, size_t n2, char *err, size_t errlen)
{
    static const char prefix[] = BOOT_NCCL_PREFIX;
    const size_t plen = sizeof(prefix) - 1;
    size_t i;

    if (n2 < plen || memcmp(l2, prefix, plen) != 0) {
        snprintf(err, errlen,
                 "bootstrap blob: the line after the socket part must start "
                 "with '%s' (got %zu bytes that do not)",
                 prefix, n2);
        return GANG_EPROTO;
    }
    if (n2 - plen != GANG_BOOTSTRAP_NCCL_HEX) {
        snprintf(err, errlen,
                 "bootstrap blob: the NCCL unique id has %zu characters, "
                 "expected %d hex digits",
                 n2 - plen, GANG_BOOTSTRAP_NCCL_HEX);
        return GANG_EPROTO;
    }
    for (i = plen; i < n2; i++) {
        uint8_t ch = l2[i];

        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) {
            snprintf(err, errlen,
                     "bootstrap blob: character %zu of the NCCL unique id is "
                     "0x%02x, not a lowercase hex digit",
                     i - plen, ch);
            return GANG_EPROTO;
        }
    }
    return 0;
}

/*
 * Validates blob[len] and points out's parts into it. An empty blob is a gang of one's
 * (socket-only, no parts). GANG_EPROTO with a one-line reason in err otherwise.
 */
int gang_bootstrap_parse(const uint8_t *blob, size_t len, gang_bootstrap_parts *out, char *err,
                         size_t errlen)
{
    const size_t plen = sizeof(BOOT_NCCL_PREFIX) - 1;
    size_t nl;
    int rc;

    if (out == NULL)
        return GANG_EINVAL;
    memset(out, 0, sizeof(*out));
    if (len == 0)
        return 0;
    if (blob == NULL) {
        snprintf(err, errlen, "bootstrap blob: NULL with %zu bytes", len);
        return GANG_EPROTO;
    }
    rc = boot_parse_socket(blob, len, &nl, err, errlen);
    if (rc < 0)
        return rc;
    out->socket = blob;
    out->socket_len = nl;
    if (nl == len)
        return 0;
    rc = boot_parse_nccl(blob + nl + 1, len - nl - 1, err, errlen);
    if (rc < 0) {
        memset(out, 0, sizeof(*out));
        return rc;
    }
    out->nccl = blob + nl + 1 + plen;
    out->nccl_len = GANG_BOOTSTRAP_NCCL_HEX;
    return 0;
}

/*
 * Writes the blob of (socket, nccl) into out[cap]; the result is checked with the parser,
 * so a part that would not parse is refused (GANG_EINVAL) rather than sent.
 */
int gang_bootstrap_format(const uint8_t *socket, size_t socket_len, const uint8_t *nccl,
                          size_t nccl_len, uint8_t *out, size_t cap, size_t *len)
{
    static const char prefix[] = BOOT_NCCL_PREFIX;
    const size_t plen = sizeof(prefix) - 1;
    gang_bootstrap_parts parsed;
    char err[160] = "";
    size_t need;

    if (len == NULL)
        return GANG_EINVAL;
    *len = 0;
    if (socket == NULL || socket_len == 0 || out == NULL)
        return GANG_EINVAL;
    need = socket_len + (nccl != NULL ? 1 + plen + nccl_len : 0);
    if (need > cap)
        return GANG_ERANGE;
    memcpy(out, socket, socket_len);
    if (nccl != NULL) {
        out[socket_len] = '\n';
        memcpy(out + socket_len + 1, prefix, plen);
        memcpy(out + socket_len + 1 + plen, nccl, nccl_len);
    }
    if (gang_bootstrap_parse(out, need, &parsed, err, sizeof(err)) != 0 ||
        (nccl != NULL) != (parsed.nccl != NULL)) {
        gang_error("bootstrap: refusing to build a malformed blob: %s", err);
        return GANG_EINVAL;
    }
    *len = need;
    return 0;
}

/*
 * Rank 0: opens the socket listener, adds an NCCL unique id when with_nccl, and writes
 * the blob. On failure nothing stays open, *out is NULL and err says which step failed.
 */
int gang_bootstrap_create(const char *advertise_host, int with_nccl, gang_bootstrap **out,
                          uint8_t *blob, size_t cap, size_t *len, char *err, size_t errlen)
{
    return gang_bootstrap_create_opts(advertise_host, NULL, with_nccl, out, blob, cap, len, err,
                                      errlen);
}

/* gang_bootstrap_create with the socket world's options (include/ganglion/comm.h). */
int gang_bootstrap_create_opts(const char *advertise_host, const gang_comm_socket_opts *sock_opts,
                               int with_nccl, gang_bootstrap **out, uint8_t *blob, size_t cap,
                               size_t *len, char *err, size_t errlen)
{
    char sock[BOOT_SOCKET_CAP];
    uint8_t id[GANG_BOOTSTRAP_NCCL_HEX];
    size_t sock_len = 0, id_len = 0;
    gang_bootstrap *b;
    int rc;

    if (out != NULL)
        *out = NULL;
    if (len != NULL)
        *len = 0;
    if (out == NULL || blob == NULL || len == NULL) {
        snprintf(err, errlen, "bootstrap: no place for the blob");
        return GANG_EINVAL;
    }
    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        snprintf(err, errlen, "bootstrap: out of memory");
        return GANG_ENOMEM;
    }
    rc = gang_comm_socket_listen_opts(advertise_host, sock_opts, &b->listener, sock, sizeof(sock),
                                      &sock_len);
    if (rc < 0) {
        snprintf(err, errlen, "cannot open its data-plane listener on '%s': %s",
                 advertise_host != NULL ? advertise_host : "(null)", gang_strerror(rc));
        goto out_free;
    }
    if (with_nccl) {
        rc = gang_comm_nccl_unique_id(id, sizeof(id), &id_len);
        if (rc < 0) {
            snprintf(err, errlen, "cannot create the NCCL unique id for the TP / PP groups: %s",
                     gang_strerror(rc));
            goto out_free;
        }
    }
    rc = gang_bootstrap_format((const uint8_t *)sock, sock_len, with_nccl ? id : NULL, id_len, blob,
                               cap, len);
    if (rc < 0) {
        snprintf(err, errlen, "cannot build the bootstrap blob: %s", gang_strerror(rc));
        goto out_free;
    }
    *out = b;
    return 0;

out_free:
    gang_bootstrap_free(b);
    return rc;
}

void gang_bootstrap_free(gang_bootstrap *b)
{
    if (b == NULL)
        return;
    gang_comm_listener_free(b->listener);
    free(b);
}

/*
 * Joins the world of backend `world` from the blob: the socket world from the socket
 * part (rank 0 hands its listener over: cfg->root is consumed), the nccl world from the
 * unique id (the caller made its GPU current on this thread first).
 */
int gang_bootstrap_join(const gang_bootstrap_join_config *cfg, gang_comm_backend world,
                        gang_comm **out)
{
    gang_bootstrap_parts parts;
    gang_comm_config cc;
    char err[256] = "";
    int rc;

    if (out != NULL)
        *out = NULL;
    if (cfg == NULL || out == NULL) {
        rc = GANG_EINVAL;
        goto out_root;
    }
    rc = gang_bootstrap_parse(cfg->blob, cfg->blob_len, &parts, err, sizeof(err));
    if (rc < 0) {
        gang_error("%s", err);
        goto out_root;
    }
    memset(&cc, 0, sizeof(cc));
    cc.backend = world;
    cc.rank = cfg->rank;
    cc.world_size = cfg->world_size;
    cc.timeout_ms = cfg->timeout_ms;
    cc.cancel_fd = cfg->cancel_fd;
    switch (world) {
    case GANG_COMM_SOCKET:
        cc.blob = parts.socket;
        cc.blob_len = parts.socket_len;
        cc.advertise_host = cfg->advertise_host;
        if (cfg->root != NULL) {
            cc.listener = cfg->root->listener; /* consumed by gang_comm_init */
            cfg->root->listener = NULL;
        }
        break;
    case GANG_COMM_NCCL:
        if (parts.nccl == NULL) {
            gang_error("bootstrap: the blob carries no NCCL unique id");
            rc = GANG_EPROTO;
            goto out_root;
        }
        cc.blob = parts.nccl;
        cc.blob_len = parts.nccl_len;
        break;
    default:
        rc = GANG_EINVAL;
        goto out_root;
    }
    gang_bootstrap_free(cfg->root);
    return gang_comm_init(&cc, out);

out_root:
    if (cfg != NULL)
        gang_bootstrap_free(cfg->root);
    return rc;
}
