/*
 * socket backend, blob: rank 0's listener and the blob that names it
 * ("host:port/SESSION;shm=TAG[;tp=K]"), its options, and the rule of which pairs of a
 * world connect (gang__sock_pair: every pair, or in a sparse world rank 0's star, the
 * world ring and the TP / PP groups; include/ganglion/comm.h). Shared state:
 * comm-socket.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "comm-socket.h"

/* ---------------------------------------------------------------------------------
 * Listener and blob.
 * --------------------------------------------------------------------------------- */
static int sock_random(uint8_t *buf, size_t len)
{
    size_t got = 0;

    while (got < len) {
        ssize_t n = getrandom(buf + got, len - got, 0);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return gang_err_from_errno(errno);
        got += (size_t)n;
    }
    return 0;
}

/* Writes the shared-memory tag of job and generation (see gang_comm_socket_opts). */
void gang__sock_make_tag(const char *job, uint64_t generation, char *tag)
{
    size_t i, k = 0;

    if (job == NULL || job[0] == '\0')
        job = "anon";
    for (i = 0; job[i] != '\0' && k < 24; i++) {
        char ch = job[i];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '_' || ch == '.';

        tag[k++] = ok ? ch : '_';
    }
    snprintf(tag + k, SOCK_TAG_MAX + 1 - k, "-g%llu", (unsigned long long)generation);
}

int gang_comm_socket_listen(const char *advertise_host, gang_comm_listener **out, char *blob,
                            size_t blob_cap, size_t *blob_len)
{
    return gang_comm_socket_listen_opts(advertise_host, NULL, out, blob, blob_cap, blob_len);
}

/*
 * Creates rank 0's listener on advertise_host (port chosen by the kernel) and writes the
 * blob "host:port/SESSION;shm=TAG" (IPv6 hosts in brackets; SESSION is 32 hex digits),
 * then ";tp=K" for a sparse world, NUL terminated; *blob_len excludes the NUL.
 * GANG_ERANGE when blob_cap is too small.
 */
int gang_comm_socket_listen_opts(const char *advertise_host, const gang_comm_socket_opts *opts,
                                 gang_comm_listener **out, char *blob, size_t blob_cap,
                                 size_t *blob_len)
{
    gang_comm_listener *l;
    char hex[2 * SOCK_SESSION_LEN + 1], extra[32] = "";
    int rc, n, v6;
    size_t i;

    if (out != NULL)
        *out = NULL;
    if (advertise_host == NULL || out == NULL || blob == NULL || blob_len == NULL ||
        advertise_host[0] == '\0' || strlen(advertise_host) > SOCK_HOST_MAX)
        return GANG_EINVAL;
    l = calloc(1, sizeof(*l));
    if (l == NULL)
        return GANG_ENOMEM;
    l->fd = -1;
    memcpy(l->host, advertise_host, strlen(advertise_host) + 1);
    gang__sock_make_tag(opts != NULL ? opts->job : NULL, opts != NULL ? opts->generation : 0,
                        l->tag);
    l->sparse = opts != NULL && opts->sparse;
    l->tp = opts != NULL ? opts->tp : 0;
    if (l->sparse)
        snprintf(extra, sizeof(extra), ";tp=%u", (unsigned)l->tp);
    rc = sock_random(l->session, sizeof(l->session));
    if (rc < 0)
        goto out_free;
    rc = gang__sock_listen_on(advertise_host, &l->fd, &l->port);
    if (rc < 0)
        goto out_free;
    for (i = 0; i < SOCK_SESSION_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", l->session[i]);
    v6 = strchr(advertise_host, ':') != NULL;
    n = snprintf(blob, blob_cap, v6 ? "[%s]:%u/%s;shm=%s%s" : "%s:%u/%s;shm=%s%s", advertise_host,
                 (unsigned)l->port, hex, l->tag, extra);
    if (n < 0 || (size_t)n >= blob_cap) {
        rc = GANG_ERANGE;
        goto out_free;
    }
    *blob_len = (size_t)n;
    *out = l;
    return 0;

out_free:
    gang_comm_listener_free(l);
    return rc;
}

void gang_comm_listener_free(gang_comm_listener *l)
{
    if (l == NULL)
        return;
    if (l->fd >= 0)
        close(l->fd);
    free(l);
}

/*
 * Parses the options after the session id: ";shm=TAG" (letters, digits, '_', '.', '-')
 * and ";tp=K" (a sparse world); none is the full mesh of an older rank 0.
 */
static int sock_parse_opts(char *o, sock_net *net)
{
    int64_t v;

    while (o != NULL && *o != '\0') {
        char *next = strchr(o, ';');

        if (next != NULL)
            *next++ = '\0';
        if (strncmp(o, "shm=", 4) == 0) {
            size_t i, tl = strlen(o + 4);

            if (tl == 0 || tl > SOCK_TAG_MAX)
                return GANG_EINVAL;
            for (i = 0; i < tl; i++) {
                char ch = o[4 + i];

                if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                      (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == '-'))
                    return GANG_EINVAL;
            }
            memcpy(net->tag, o + 4, tl + 1);
        } else if (strncmp(o, "tp=", 3) == 0) {
            if (gang_parse_i64(o + 3, 0, net->n, &v) < 0)
                return GANG_EINVAL;
            net->sparse = 1;
            net->tp = (uint32_t)v;
        } else {
            return GANG_EINVAL;
        }
        o = next;
    }
    return 0;
}

/* Parses "host:port/SESSION[;option...]" into net's options; GANG_EINVAL if malformed. */
int gang__sock_parse_blob(const uint8_t *blob, size_t len, char *host, uint16_t *port,
                          uint8_t *session, sock_net *net)
{
    char buf[SOCK_BLOB_MAX + 1];
    char *slash, *colon, *h, *semi;
    int64_t p;
    size_t i, hl;
    int rc;

    if (blob == NULL || len == 0 || len > SOCK_BLOB_MAX || memchr(blob, '\0', len) != NULL)
        return GANG_EINVAL;
    memcpy(buf, blob, len);
    buf[len] = '\0';
    semi = strchr(buf, ';');
    if (semi != NULL)
        *semi++ = '\0';
    rc = sock_parse_opts(semi, net);
    if (rc < 0)
        return rc;
    slash = strrchr(buf, '/');
    if (slash == NULL || strlen(slash + 1) != 2 * SOCK_SESSION_LEN)
        return GANG_EINVAL;
    for (i = 0; i < SOCK_SESSION_LEN; i++) {
        int hi = gang_hex_digit(slash[1 + 2 * i]), lo = gang_hex_digit(slash[2 + 2 * i]);

        if (hi < 0 || lo < 0)
            return GANG_EINVAL;
        session[i] = (uint8_t)(hi << 4 | lo);
    }
    *slash = '\0';
    colon = strrchr(buf, ':');
    if (colon == NULL || gang_parse_i64(colon + 1, 1, 65535, &p) < 0)
        return GANG_EINVAL;
    *colon = '\0';
    h = buf;
    hl = strlen(h);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h[hl - 1] = '\0';
        h++;
        hl -= 2;
    }
    if (hl == 0 || hl > SOCK_HOST_MAX)
        return GANG_EINVAL;
    memcpy(host, h, hl + 1);
    *port = (uint16_t)p;
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Which pairs talk (gang_comm_socket_opts in include/ganglion/comm.h).
 * --------------------------------------------------------------------------------- */
int gang__sock_pair(const sock_net *net, uint32_t a, uint32_t b)
{
    uint32_t n = net->n, t = net->tp, lo = a < b ? a : b, hi = a < b ? b : a;

    if (a == b || hi >= n)
        return SOCK_PAIR_NONE;
    if (!net->sparse)
        return SOCK_PAIR_BULK;
    if (t > 0 && (lo / t == hi / t || (lo % t == hi % t && (hi - lo == t || hi - lo == n - t))))
        return SOCK_PAIR_BULK;
    if (lo == 0 || hi - lo == 1)
        return SOCK_PAIR_CTRL;
    return SOCK_PAIR_NONE;
}

/*
 * The peers of rank r > 0 other than rank 0, below r (lower = 1) or above it (lower = 0),
 * ascending and without repeats, into out (n + 8 entries: the candidates go there before
 * they are filtered); returns their count. A sparse
 * world looks only at the few candidates gang__sock_pair can accept, so the cost is
 * O(tp), not O(n).
 */
uint32_t gang__sock_peers_of(const sock_net *net, uint32_t r, int lower, uint32_t *out)
{
    uint32_t n = net->n, t = net->tp, k = 0, i, j, p;
    uint32_t cand[6];

    if (!net->sparse) {
        for (p = lower ? 1 : r + 1; p < (lower ? r : n); p++)
            out[k++] = p;
        return k;
    }
    if (t > 0) {
        for (p = r - r % t; p < r - r % t + t && p < n; p++)
            out[k++] = p;
    }
    cand[0] = r - 1;
    cand[1] = r + 1;
    cand[2] = r >= t ? r - t : n;
    cand[3] = r + t;
    cand[4] = r + t >= n ? r + t - n : n;
    cand[5] = r + n - t;
    for (i = 0; i < 6; i++) {
        if (t > 0 || i < 2)
            out[k++] = cand[i];
    }
    /* Keep the accepted ones of the right side, then sort and drop repeats. */
    for (i = 0, j = 0; i < k; i++) {
        p = out[i];
        if (p == 0 || p >= n || (lower ? p >= r : p <= r) ||
            gang__sock_pair(net, p, r) == SOCK_PAIR_NONE)
            continue;
        out[j++] = p;
    }
    k = j;
    for (i = 1; i < k; i++) {
        for (j = i; j > 0 && out[j - 1] > out[j]; j--) {
            p = out[j];
            out[j] = out[j - 1];
            out[j - 1] = p;
        }
    }
    for (i = 0, j = 0; i < k; i++) {
        if (j == 0 || out[j - 1] != out[i])
            out[j++] = out[i];
    }
    return j;
}
