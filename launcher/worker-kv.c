/*
 * P/D KV transfers over TCP (issue #26): rank r of a prefill gang keeps its part of each
 * export (gang_kv_hooks.put, on the data thread) and serves it on --kv-port + r from a
 * thread of its own; a rank of a decode gang fetches the parts the engine names
 * (gang_kv_hooks.get, on a fetch thread, by the import's deadline): a range of layers of
 * one prefill rank, at the address of that rank's node. Equal TP, any PP: a fetch names
 * its layers (within the serving rank's) and its kv columns, which must be the server's.
 *
 * Protocol (one transfer per connection, little-endian; mac = keyed BLAKE2b-256 with the
 * gang token's key, libsodium's crypto_generichash):
 *   server -> client  "GKV1", server nonce (32)
 *   client -> server  client nonce (32), id (u64), shape (7 x u32: layer_first,
 *                     layer_count, kv_cols, elem_bytes, block_size, n_blocks, transport),
 *                     mac("gkv-c", server nonce, client nonce, id, shape)
 *   server -> client  status (i32), bytes (u64), mac("gkv-s", client nonce, server nonce,
 *                     id, status, bytes); with status 0 and transport 0: bytes of
 *                     payload, then mac("gkv-d", server nonce, client nonce, payload);
 *                     with transport 1 or 2 (the device path, both sides' blocks in
 *                     device memory and a pair configured; 2: the client's rows are whole
 *                     blocks): the pair's blob and the rows over a 2-rank communicator
 *                     (worker-kv-pair.c)
 * The server sends nothing of an export before the client proved the token; the client
 * writes nothing into its KV blocks (the engine copies them in only after get returns 0)
 * before the server proved it and the payload's mac verified. Fresh nonces on both sides
 * stop replays. Without a token (--token-file empty, warned at start) the macs are not
 * checked, as for the rendezvous.
 *
 * The shape's layers are model layers (layer_first counts from the model's first); the
 * server answers them from each of the export's blocks, block after block.
 *
 * Bounds: a fetch asks at most the engine's own count of bytes; the server serves only
 * an export whose kv columns, element and block size equal the request's, whose layers
 * include the requested ones and that it keeps in the memory the transport asks for (else
 * GANG_EMISMATCH, logged on both sides: the gangs' TP, layer split, KV dtype or block size differ);
 * every read and write has the transfer's deadline; the store is bounded by --kv-export-mb and
 * --kv-export-hold-ms.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "ganglion/serve.h"
#include "worker-kv.h"

#define WKV_MAGIC "GKV1"
#define WKV_NONCE 32
#define WKV_MAC 32
#define WKV_SHAPE (7 * 4) /* the shape words, the transport's last */
#define WKV_REQ (WKV_NONCE + 8 + WKV_SHAPE + WKV_MAC)
#define WKV_ANS (4 + 8 + WKV_MAC)

typedef struct wkv_entry {
    struct wkv_entry *next;
    uint64_t id, expires_ms;
    uint32_t n_blocks;
    size_t bytes;
    uint8_t *data;
    gang_kernels *dk; /* the device path: data is device memory of dk (else host) */
    int busy;         /* under mu: being sent from (the device path: not copied) */
} wkv_entry;

struct gang__wkv {
    gang__wres_config cfg;
    uint32_t rank;
    gang_kv_shape shape;
    pthread_mutex_t mu;
    wkv_entry *head; /* oldest first */
    size_t stored;
    int lfd; /* -1: no listener */
    pthread_t thread;
    int started;
    atomic_int stop;
    gang_engine *e;
    gang__wkv_pair pair; /* the device path's communicator (has_pair) */
    int has_pair;
    wkv_entry *dead;     /* under mu: device entries dropped, freed on the data thread */
    atomic_ulong n_pair; /* transfers on the device path */
    gang__wkv_live live; /* the pairs in flight, for gang__wkv_abort */
};

/* ------------------------------------------------------------------ helpers */

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

/* mac(label, a, b) over the gang token's key; zeros without a token. */
void gang__wkv_mac(const gang_token *t, const char *label, const uint8_t *a, size_t na,
                   const uint8_t *b, size_t nb, uint8_t out[WKV_MAC])
{
    crypto_generichash_state st;
    memset(out, 0, WKV_MAC);
    if (!t->present)
        return;
    crypto_generichash_init(&st, t->key, sizeof(t->key), WKV_MAC);
    crypto_generichash_update(&st, (const uint8_t *)label, strlen(label));
    crypto_generichash_update(&st, a, na);
    crypto_generichash_update(&st, b, nb);
    crypto_generichash_final(&st, out, WKV_MAC);
}

int gang__wkv_mac_ok(const gang_token *t, const uint8_t *want, const uint8_t *got)
{
    return !t->present || sodium_memcmp(want, got, WKV_MAC) == 0;
}

/* Moves n bytes on fd (out: write) by deadline_ms. 0, GANG_ETIMEDOUT or GANG_EPEER. */
int gang__wkv_io(int fd, void *buf, size_t n, int out, uint64_t deadline_ms)
{
    uint8_t *p = buf;
    while (n > 0) {
        uint64_t now = gang_now_ms();
        if (now >= deadline_ms)
            return GANG_ETIMEDOUT;
        struct pollfd pfd = {.fd = fd, .events = out ? POLLOUT : POLLIN};
        int left = (int)(deadline_ms - now > 1000 ? 1000 : deadline_ms - now);
        if (poll(&pfd, 1, left) < 0 && errno != EINTR)
            return GANG_EPEER;
        if (pfd.revents == 0)
            continue;
        ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
            return GANG_EPEER;
        if (k > 0) {
            p += k;
            n -= (size_t)k;
        }
    }
    return 0;
}

/* The request's shape words: layers [first, first + count) of this rank's block shape, the
 * block count and the transport (0: the payload over this connection, 1: the pair). */
static void wkv_shape_words(const gang_kv_shape *s, uint32_t first, uint32_t count,
                            uint32_t n_blocks, uint32_t pair, uint8_t out[WKV_SHAPE])
{
    const uint32_t w[7] = {first, count, s->kv_cols, s->elem_bytes, s->block_size, n_blocks, pair};
    for (int i = 0; i < 7; i++)
        put_u32(out + 4 * i, w[i]);
}

/* One layer's K and V rows of one block in shape s. */
static size_t wkv_layer_bytes(const gang_kv_shape *s)
{
    return 2u * (size_t)s->block_size * s->kv_cols * s->elem_bytes;
}

/* Whether a request's shape words w can be served from this rank's shape s: the same kv
 * columns, element and block size, layers within s's, 1..avail blocks. */
static int wkv_shape_ok(const gang_kv_shape *s, const uint8_t *w, uint32_t avail)
{
    uint32_t lf = get_u32(w), lc = get_u32(w + 4), n = get_u32(w + 20);
    return get_u32(w + 8) == s->kv_cols && get_u32(w + 12) == s->elem_bytes &&
           get_u32(w + 16) == s->block_size && lc > 0 && lf >= s->layer_first &&
           lc <= s->layer_count && lf - s->layer_first <= s->layer_count - lc && n > 0 &&
           n <= avail;
}

/* ------------------------------------------------------------------ the store */

/* Drops the expired entries, then the oldest until `need` more bytes fit, stopping at one
 * being sent from; device entries go to the dead list. Under mu. */
static void wkv_evict(gang__wkv *k, size_t need)
{
    uint64_t now = gang_now_ms();
    while (k->head != NULL && !k->head->busy &&
           (k->head->expires_ms <= now || k->stored + need > k->cfg.kv_store_bytes)) {
        wkv_entry *e = k->head;
        k->head = e->next;
        k->stored -= e->bytes;
        if (e->dk != NULL) {
            e->next = k->dead;
            k->dead = e;
            continue;
        }
        free(e->data);
        free(e);
    }
}

/* Frees the dead device entries (on the data thread, or after it stopped). */
static void wkv_bury(gang__wkv *k)
{
    pthread_mutex_lock(&k->mu);
    wkv_entry *d = k->dead;
    k->dead = NULL;
    pthread_mutex_unlock(&k->mu);
    while (d != NULL) {
        wkv_entry *n = d->next;
        gang_kernels_free(d->dk, d->data);
        free(d);
        d = n;
    }
}

/* Appends e to the store (room made first). */
static void wkv_append(gang__wkv *k, wkv_entry *e)
{
    pthread_mutex_lock(&k->mu);
    wkv_evict(k, e->bytes);
    wkv_entry **pp = &k->head;
    while (*pp != NULL)
        pp = &(*pp)->next;
    *pp = e;
    k->stored += e->bytes;
    pthread_mutex_unlock(&k->mu);
}

/* gang_kv_hooks.put: keeps a copy of this rank's part of export id. */
static int wkv_put(void *ctx, uint64_t id, const void *data, size_t bytes, uint32_t n_blocks)
{
    gang__wkv *k = ctx;
    if (k->lfd < 0 || bytes > k->cfg.kv_store_bytes)
        return GANG_ERANGE;
    wkv_entry *e = calloc(1, sizeof(*e));
    uint8_t *copy = malloc(bytes);
    if (e == NULL || copy == NULL) {
        free(e);
        free(copy);
        return GANG_ENOMEM;
    }
    memcpy(copy, data, bytes);
    *e = (wkv_entry){.id = id,
                     .n_blocks = n_blocks,
                     .bytes = bytes,
                     .data = copy,
                     .expires_ms = gang_now_ms() + k->cfg.kv_hold_ms};
    wkv_append(k, e);
    return 0;
}

/* gang_kv_hooks.put_dev: keeps export id's device buffer (owned from here). */
static int wkv_put_dev(void *ctx, uint64_t id, gang_kernels *dk, void *dev, size_t bytes,
                       uint32_t n_blocks)
{
    gang__wkv *k = ctx;
    wkv_bury(k);
    if (k->lfd < 0 || bytes > k->cfg.kv_store_bytes)
        return GANG_ERANGE;
    wkv_entry *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return GANG_ENOMEM;
    *e = (wkv_entry){.id = id,
                     .n_blocks = n_blocks,
                     .bytes = bytes,
                     .data = dev,
                     .dk = dk,
                     .expires_ms = gang_now_ms() + k->cfg.kv_hold_ms};
    wkv_append(k, e);
    return 0;
}

/* ------------------------------------------------------------------ the server */

/* What a fetch gets from the store: status, and with 0 either a host copy of the rows
 * (data, bytes) or, on the device path, the entry itself (dev, marked busy). */
typedef struct wkv_found {
    int32_t status;
    uint64_t bytes;
    uint8_t *data;
    wkv_entry *dev;
    size_t at, run;
} wkv_found;

/* Looks export id up for request shape words w. Logs a mismatch. */
static void wkv_lookup(gang__wkv *k, uint64_t id, const uint8_t *w, wkv_found *f)
{
    uint32_t n = get_u32(w + 20), lf = get_u32(w), lc = get_u32(w + 4), pair = get_u32(w + 24);
    memset(f, 0, sizeof(*f));
    pthread_mutex_lock(&k->mu);
    wkv_evict(k, 0);
    wkv_entry *e = k->head;
    while (e != NULL && e->id != id)
        e = e->next;
    if (e == NULL)
        f->status = GANG_ENOENT;
    else if (!wkv_shape_ok(&k->shape, w, e->n_blocks) || pair > 2 || (pair != 0) != (e->dk != NULL))
        f->status = GANG_EMISMATCH;
    size_t lb = wkv_layer_bytes(&k->shape);
    f->run = f->status == 0 ? (size_t)lc * lb : 0;
    f->at = f->status == 0 ? (size_t)(lf - k->shape.layer_first) * lb : 0;
    f->bytes = (uint64_t)n * f->run;
    if (f->status == 0 && e->dk != NULL) {
        e->busy++; /* (kept while sent: its device buffer is sent from in place) */
        f->dev = e;
    } else if (f->status == 0 && (f->data = malloc(f->bytes)) != NULL) {
        /* (A copy: the store may drop the entry while this one is sent.) */
        for (uint32_t b = 0; b < n; b++)
            memcpy(f->data + (size_t)b * f->run, e->data + (size_t)b * k->shape.block_bytes + f->at,
                   f->run);
    } else if (f->status == 0) {
        f->status = GANG_ENOMEM;
    }
    pthread_mutex_unlock(&k->mu);
    if (f->status != 0)
        f->bytes = 0;
    if (f->status == GANG_EMISMATCH && e != NULL && (pair != 0) != (e->dk != NULL))
        gang_warn("P/D: KV fetch of %llx on rank %u asks for the %s path, this rank keeps it "
                  "in %s memory (both pools need the same --device and --backend)",
                  (unsigned long long)id, k->rank, pair ? "device (nccl)" : "TCP",
                  e->dk != NULL ? "device" : "host");
    else if (f->status == GANG_EMISMATCH)
        gang_warn("P/D: KV fetch of %llx on rank %u (layers %u..+%u of %u blocks): this rank "
                  "holds layers %u..+%u of another shape (TP, layer split, KV dtype or block "
                  "size differ: the pools need equal TP and KV cache)",
                  (unsigned long long)id, k->rank, lf, lc, n, k->shape.layer_first,
                  k->shape.layer_count);
}

/* Serves one connection: proof, lookup, answer, then the payload over this connection or
 * the pair. Failures close it (logged). */
static void wkv_serve_one(gang__wkv *k, int fd)
{
    uint64_t deadline = gang_now_ms() + k->cfg.kv_timeout_ms;
    uint8_t hello[4 + WKV_NONCE], req[WKV_REQ], ans[WKV_ANS], mac[WKV_MAC];
    memcpy(hello, WKV_MAGIC, 4);
    gang_auth_random(hello + 4, WKV_NONCE);
    if (gang__wkv_io(fd, hello, sizeof hello, 1, deadline) != 0 ||
        gang__wkv_io(fd, req, sizeof req, 0, deadline) != 0)
        return;
    const uint8_t *cn = req, *idb = req + WKV_NONCE, *shape = req + WKV_NONCE + 8;
    uint8_t both[2 * WKV_NONCE + 8 + WKV_SHAPE];
    memcpy(both, hello + 4, WKV_NONCE);
    memcpy(both + WKV_NONCE, cn, WKV_NONCE);
    memcpy(both + 2 * WKV_NONCE, idb, 8 + WKV_SHAPE);
    gang__wkv_mac(&k->cfg.kv_token, "gkv-c", both, sizeof both, NULL, 0, mac);
    if (!gang__wkv_mac_ok(&k->cfg.kv_token, mac, req + WKV_NONCE + 8 + WKV_SHAPE)) {
        gang_warn("P/D: a KV fetch on rank %u did not prove the token: refused", k->rank);
        return;
    }
    wkv_found f;
    wkv_lookup(k, get_u64(idb), shape, &f);
    if (f.status == 0 && f.dev != NULL && !k->has_pair)
        f.status = GANG_ENOSYS; /* (cannot happen: device entries come with a pair) */
    put_u32(ans, (uint32_t)f.status);
    put_u64(ans + 4, f.status == 0 ? f.bytes : 0);
    uint8_t sb[2 * WKV_NONCE + 8 + 12];
    memcpy(sb, cn, WKV_NONCE);
    memcpy(sb + WKV_NONCE, hello + 4, WKV_NONCE);
    memcpy(sb + 2 * WKV_NONCE, idb, 8);
    memcpy(sb + 2 * WKV_NONCE + 8, ans, 12);
    gang__wkv_mac(&k->cfg.kv_token, "gkv-s", sb, sizeof sb, NULL, 0, ans + 12);
    int rc = gang__wkv_io(fd, ans, sizeof ans, 1, deadline);
    if (rc == 0 && f.status == 0 && f.dev != NULL) {
        rc = gang__wkv_pair_send(&k->pair, &k->live, f.dev->dk, &k->cfg.kv_token, fd, both,
                                 get_u32(shape + 24) == 2, f.dev->data, k->shape.block_bytes, f.at,
                                 f.run, get_u32(shape + 20), deadline);
        if (rc != 0)
            gang_warn("P/D: sending KV export %llx from rank %u over the device pair failed: %s",
                      (unsigned long long)f.dev->id, k->rank, gang_strerror(rc));
        else
            atomic_fetch_add(&k->n_pair, 1);
    } else if (rc == 0 && f.status == 0 && gang__wkv_io(fd, f.data, f.bytes, 1, deadline) == 0) {
        gang__wkv_mac(&k->cfg.kv_token, "gkv-d", both, 2 * WKV_NONCE, f.data, f.bytes, mac);
        (void)gang__wkv_io(fd, mac, sizeof mac, 1, deadline);
    }
    if (f.dev != NULL) {
        pthread_mutex_lock(&k->mu);
        f.dev->busy--;
        pthread_mutex_unlock(&k->mu);
    }
    free(f.data);
}

static void *wkv_thread(void *arg)
{
    gang__wkv *k = arg;
    while (!atomic_load(&k->stop)) {
        struct pollfd pfd = {.fd = k->lfd, .events = POLLIN};
        if (poll(&pfd, 1, 200) <= 0)
            continue;
        int fd = accept4(k->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            continue;
        wkv_serve_one(k, fd);
        close(fd);
    }
    return NULL;
}

/* Opens the listener on kv_bind:kv_port + rank. The fd, or -1 (logged). */
static int wkv_listen(const gang__wkv *k)
{
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)(k->cfg.kv_port + k->rank))};
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (inet_pton(AF_INET, k->cfg.kv_bind, &sa.sin_addr) != 1)
        sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
        bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(fd, 16) == 0)
        return fd;
    gang_warn("P/D: rank %u cannot serve KV exports on port %u: %s; this gang's prompts will "
              "be prefilled again by the decode gangs",
              k->rank, k->cfg.kv_port + k->rank, strerror(errno));
    if (fd >= 0)
        close(fd);
    return -1;
}

/* ------------------------------------------------------------------ the client */

/* Connects to host:port by deadline. The fd or a negative GANG_E*. */
static int wkv_connect(const char *host, uint32_t port, uint64_t deadline)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (port == 0 || port > 65535 || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return GANG_EINVAL; /* a router hands over an IPv4 address, never a name */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1;
    if (fd < 0)
        return GANG_ENOMEM;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS) {
        close(fd);
        return GANG_ECONNREFUSED;
    }
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    uint64_t now = gang_now_ms();
    int err = 0;
    socklen_t len = sizeof err;
    if (now >= deadline || poll(&pfd, 1, (int)(deadline - now)) != 1 ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        close(fd);
        return err != 0 ? GANG_ECONNREFUSED : GANG_ETIMEDOUT;
    }
    return fd;
}

/* Where a fetch puts its rows: bytes at host data, or (dk set: the device path) run bytes
 * of each block at device memory data + b * stride + at. */
typedef struct wkv_dest {
    uint8_t *data;
    size_t bytes;
    gang_kernels *dk;
    size_t stride, at, run;
} wkv_dest;

/* The exchange of a fetch on a connected fd (see the protocol above). */
static int wkv_fetch(gang__wkv *k, int fd, const gang_kv_xfer *src, const gang_kv_part *part,
                     const wkv_dest *d, uint32_t n_blocks, uint64_t deadline)
{
    uint8_t *data = d->data;
    size_t bytes = d->bytes;
    uint8_t hello[4 + WKV_NONCE], req[WKV_REQ], ans[WKV_ANS], mac[WKV_MAC];
    int rc = gang__wkv_io(fd, hello, sizeof hello, 0, deadline);
    if (rc != 0)
        return rc;
    if (memcmp(hello, WKV_MAGIC, 4) != 0)
        return GANG_EPROTO;
    uint8_t both[2 * WKV_NONCE + 8 + WKV_SHAPE];
    memcpy(both, hello + 4, WKV_NONCE);
    gang_auth_random(both + WKV_NONCE, WKV_NONCE);
    put_u64(both + 2 * WKV_NONCE, src->id);
    /* The transport word: 0 TCP; the pair, 1 (rows per block) or 2 (whole blocks here). */
    uint32_t tw = d->dk == NULL ? 0 : d->at == 0 && d->run == d->stride ? 2 : 1;
    wkv_shape_words(&k->shape, part->layer_first, part->layer_count, n_blocks, tw,
                    both + 2 * WKV_NONCE + 8);
    memcpy(req, both + WKV_NONCE, WKV_NONCE + 8 + WKV_SHAPE);
    gang__wkv_mac(&k->cfg.kv_token, "gkv-c", both, sizeof both, NULL, 0,
                  req + WKV_NONCE + 8 + WKV_SHAPE);
    rc = gang__wkv_io(fd, req, sizeof req, 1, deadline);
    if (rc == 0)
        rc = gang__wkv_io(fd, ans, sizeof ans, 0, deadline);
    if (rc != 0)
        return rc;
    uint8_t sb[2 * WKV_NONCE + 8 + 12];
    memcpy(sb, both + WKV_NONCE, WKV_NONCE);
    memcpy(sb + WKV_NONCE, hello + 4, WKV_NONCE);
    memcpy(sb + 2 * WKV_NONCE, both + 2 * WKV_NONCE, 8);
    memcpy(sb + 2 * WKV_NONCE + 8, ans, 12);
    gang__wkv_mac(&k->cfg.kv_token, "gkv-s", sb, sizeof sb, NULL, 0, mac);
    if (!gang__wkv_mac_ok(&k->cfg.kv_token, mac, ans + 12))
        return GANG_EAUTH;
    int32_t status = (int32_t)get_u32(ans);
    if (status != 0)
        return status < 0 ? status : GANG_EPROTO;
    if (get_u64(ans + 4) != bytes)
        return GANG_EPROTO;
    if (d->dk != NULL)
        return gang__wkv_pair_recv(&k->pair, &k->live, d->dk, &k->cfg.kv_token, fd, both, data,
                                   d->stride, d->at, d->run, n_blocks, deadline);
    rc = gang__wkv_io(fd, data, bytes, 0, deadline);
    if (rc == 0)
        rc = gang__wkv_io(fd, ans, WKV_MAC, 0, deadline);
    if (rc != 0)
        return rc;
    gang__wkv_mac(&k->cfg.kv_token, "gkv-d", both, 2 * WKV_NONCE, data, bytes, mac);
    return gang__wkv_mac_ok(&k->cfg.kv_token, mac, ans) ? 0 : GANG_EAUTH;
}

/* gang_kv_hooks.get: layers of src's blocks from the source gang's rank part names. */
static int wkv_get(void *ctx, const gang_kv_xfer *src, const gang_kv_part *part, void *data,
                   size_t bytes, uint32_t n_blocks, uint64_t deadline_ms)
{
    gang__wkv *k = ctx;
    if (part->layer_count == 0 || part->layer_count > k->shape.layer_count ||
        bytes != (size_t)n_blocks * part->layer_count * wkv_layer_bytes(&k->shape) ||
        part->rank > 65535 - src->port)
        return GANG_EINVAL;
    int fd = wkv_connect(part->host, src->port + part->rank, deadline_ms);
    if (fd < 0)
        return fd;
    wkv_dest d = {.data = data, .bytes = bytes};
    int rc = wkv_fetch(k, fd, src, part, &d, n_blocks, deadline_ms);
    close(fd);
    return rc;
}

/* gang_kv_hooks.get_dev: the same into device memory, over the pair. */
static int wkv_get_dev(void *ctx, const gang_kv_xfer *src, const gang_kv_part *part,
                       gang_kernels *dk, void *dev, size_t stride, size_t at, size_t run,
                       uint32_t n_blocks, uint64_t deadline_ms)
{
    gang__wkv *k = ctx;
    if (!k->has_pair || part->layer_count == 0 || part->layer_count > k->shape.layer_count ||
        run != part->layer_count * wkv_layer_bytes(&k->shape) || stride != k->shape.block_bytes ||
        run > stride || at > stride - run || part->rank > 65535 - src->port)
        return GANG_EINVAL;
    int fd = wkv_connect(part->host, src->port + part->rank, deadline_ms);
    if (fd < 0)
        return fd;
    wkv_dest d = {
        .data = dev, .bytes = run * n_blocks, .dk = dk, .stride = stride, .at = at, .run = run};
    int rc = wkv_fetch(k, fd, src, part, &d, n_blocks, deadline_ms);
    close(fd);
    if (rc == 0)
        atomic_fetch_add(&k->n_pair, 1);
    return rc;
}

/* Plugs k's hooks into its engine: the device path's with a pair. */
static void wkv_plug(gang__wkv *k)
{
    gang_kv_hooks h = {.ctx = k, .put = wkv_put, .get = wkv_get};
    if (k->has_pair) {
        h.put_dev = wkv_put_dev;
        h.get_dev = wkv_get_dev;
    }
    struct in_addr a;
    if (inet_pton(AF_INET, k->cfg.kv_advertise, &a) == 1)
        h.addr = a.s_addr; /* a name: the decode gangs use the replica's address */
    gang_engine_set_kv_hooks(k->e, &h, k->cfg.kv_timeout_ms);
}

void gang__wkv_set_pair(gang__wkv *k, const gang__wkv_pair *p)
{
    k->has_pair = p != NULL;
    if (p != NULL)
        k->pair = *p;
    wkv_plug(k);
}

void gang__wkv_abort(gang__wkv *k)
{
    if (k == NULL)
        return;
    pthread_mutex_lock(&k->live.mu);
    k->live.stopping = 1;
    for (int i = 0; i < GANG__WKV_LIVE; i++)
        if (k->live.c[i] != NULL)
            gang_comm_abort(k->live.c[i]);
    pthread_mutex_unlock(&k->live.mu);
}

uint64_t gang__wkv_pair_count(gang__wkv *k)
{
    return atomic_load(&k->n_pair);
}

/* ------------------------------------------------------------------ life */

int gang__wkv_start(const gang__wres_config *c, uint32_t rank, gang_engine *e, gang__wkv **out)
{
    *out = NULL;
    gang__wkv *k = calloc(1, sizeof(*k));
    if (k == NULL)
        return GANG_ENOMEM;
    k->cfg = *c;
    k->rank = rank;
    k->lfd = -1;
    gang_engine_kv_shape(e, &k->shape);
    pthread_mutex_init(&k->mu, NULL);
    pthread_mutex_init(&k->live.mu, NULL);
    if (c->role == GANG_ROLE_PREFILL && c->kv_port != 0) {
        k->lfd = wkv_listen(k);
        k->started = k->lfd >= 0 && pthread_create(&k->thread, NULL, wkv_thread, k) == 0;
        if (!k->started && k->lfd >= 0) {
            close(k->lfd);
            k->lfd = -1;
        }
        if (k->started)
            gang_info("P/D: rank %u serves its KV exports on port %u%s", rank, c->kv_port + rank,
                      c->kv_token.present ? "" : " WITHOUT authentication (no --token-file)");
    }
    k->e = e;
    /* An nccl data plane moves the blocks device to device (worker-kv-pair.c). */
    gang__wkv_set_pair(k, c->layout.uses_nccl ? &gang__wkv_pair_nccl : NULL);
    *out = k;
    return 0;
}

void gang__wkv_stop(gang__wkv *k)
{
    if (k == NULL)
        return;
    atomic_store(&k->stop, 1);
    if (k->started)
        pthread_join(k->thread, NULL);
    if (k->lfd >= 0)
        close(k->lfd);
    pthread_mutex_lock(&k->mu);
    while (k->head != NULL) {
        wkv_entry *e = k->head;
        k->head = e->next;
        if (e->dk != NULL) {
            e->next = k->dead;
            k->dead = e;
            continue;
        }
        free(e->data);
        free(e);
    }
    pthread_mutex_unlock(&k->mu);
    wkv_bury(k);
    pthread_mutex_destroy(&k->mu);
    pthread_mutex_destroy(&k->live.mu);
    free(k);
}
