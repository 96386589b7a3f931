/*
 * The device path of P/D KV transfers (issue #26, worker-kv.h): after worker-kv.c's
 * authenticated handshake on a connection, the prefill rank makes a fresh bootstrap blob
 * of a 2-rank communicator and sends it over that connection, MACed with the gang token:
 *
 *   server -> client  len (u32, <= GANG__WKV_BLOB_MAX), msgs (u32: 1 or n_blocks), blob,
 *                     mac("gkv-p", server nonce, client nonce, len, msgs, blob)
 *
 * then both join the pair (prefill rank 0, decode rank 1) and the block rows move with
 * gang_comm_send / gang_comm_recv between the two device buffers: one message when the
 * rows are contiguous on both sides (whole blocks: the client says so in its request's
 * transport word, 2), else one per block (tag b; NCCL matches them in order). Every step has the
 * transfer's deadline (the comm front's: GANG_ETIMEDOUT, the communicator then unusable); any error
 * fails the fetch, and the engine prefills instead. gang__wkv_abort aborts the pairs in
 * flight (the comm front's gang_comm_abort), so a stopping worker does not wait for them.
 *
 * What is authenticated: the peer, at setup (only a client that proved the token gets the
 * blob, and only a server that proved it gave one the client joins); the rows themselves
 * travel without a MAC (NCCL moves them device to device; a MAC would need them on the
 * host or a kernel of its own). See docs/design.md section 10.
 */
#include <string.h>

#include "worker-kv.h"

static int pair_nccl_blob(void *ctx, uint8_t *blob, size_t cap, size_t *len)
{
    (void)ctx;
    return gang_comm_nccl_unique_id(blob, cap, len);
}

static int pair_nccl_join(void *ctx, gang_kernels *k, const uint8_t *blob, size_t len,
                          uint32_t rank, uint64_t timeout_ms, gang_comm **out)
{
    (void)ctx;
    int rc = gang_kernels_bind_thread(k); /* NCCL takes the thread's current device */
    if (rc != 0)
        return rc;
    gang_comm_config c = {.backend = GANG_COMM_NCCL,
                          .rank = rank,
                          .world_size = 2,
                          .blob = blob,
                          .blob_len = len,
                          .timeout_ms = timeout_ms};
    return gang_comm_init(&c, out);
}

const gang__wkv_pair gang__wkv_pair_nccl = {.make_blob = pair_nccl_blob, .join = pair_nccl_join};

/* The blob message's mac over the nonces, its header (length and message count words)
 * and the blob. */
static void pair_blob_mac(const gang_token *t, const uint8_t nonces[64], const uint8_t *msg,
                          size_t len, uint8_t out[32])
{
    uint8_t head[64 + 8];
    memcpy(head, nonces, 64);
    memcpy(head + 64, msg, 8);
    gang__wkv_mac(t, "gkv-p", head, sizeof head, msg + 8, len, out);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Lists c in live: 1, or 0 when live is stopping (c is then not listed). A full list
 * leaves c unlisted (it still ends by its deadline). */
static int live_add(gang__wkv_live *live, gang_comm *c)
{
    int ok = 1;
    if (live == NULL)
        return 1;
    pthread_mutex_lock(&live->mu);
    if (live->stopping)
        ok = 0;
    for (int i = 0; ok && i < GANG__WKV_LIVE; i++)
        if (live->c[i] == NULL) {
            live->c[i] = c;
            break;
        }
    pthread_mutex_unlock(&live->mu);
    return ok;
}

/* Unlists c (before it is freed: an abort never reaches a freed communicator). */
static void live_del(gang__wkv_live *live, gang_comm *c)
{
    if (live == NULL || c == NULL)
        return;
    pthread_mutex_lock(&live->mu);
    for (int i = 0; i < GANG__WKV_LIVE; i++)
        if (live->c[i] == c)
            live->c[i] = NULL;
    pthread_mutex_unlock(&live->mu);
}

/* Moves the rows over c (send: rank 0 to 1; else 1 from 0) by deadline_ms: msgs 1 is all
 * n runs at once (contiguous on both sides), else one message per block. */
static int pair_move(gang_comm *c, int send, uint8_t *dev, size_t stride, size_t at, size_t run,
                     uint32_t n, uint32_t msgs, uint64_t deadline_ms)
{
    size_t bytes = msgs == 1 ? run * n : run;
    for (uint32_t b = 0; b < msgs; b++) {
        uint64_t left;
        int rc = gang_deadline_left(deadline_ms, &left);
        uint8_t *p = dev + (size_t)b * stride + at;
        if (rc == 0)
            rc = send ? gang_comm_send(c, p, bytes, 1, b, left)
                      : gang_comm_recv(c, p, bytes, 0, b, left);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Joins the pair of blob as rank, lists it in live, moves the rows, frees it. */
static int pair_run(const gang__wkv_pair *p, gang__wkv_live *live, gang_kernels *k,
                    const uint8_t *blob, size_t len, uint32_t rank, uint8_t *dev, size_t stride,
                    size_t at, size_t run, uint32_t n, uint32_t msgs, uint64_t deadline_ms)
{
    uint64_t left;
    gang_comm *c = NULL;
    int rc = gang_deadline_left(deadline_ms, &left);
    if (rc == 0)
        rc = p->join(p->ctx, k, blob, len, rank, left, &c);
    if (rc == 0 && !live_add(live, c))
        rc = GANG_EABORTED;
    if (rc == 0)
        rc = pair_move(c, rank == 0, dev, stride, at, run, n, msgs, deadline_ms);
    live_del(live, c);
    gang_comm_free(c);
    return rc;
}

int gang__wkv_pair_send(const gang__wkv_pair *p, gang__wkv_live *live, gang_kernels *k,
                        const gang_token *t, int fd, const uint8_t nonces[64], int peer_whole,
                        uint8_t *dev, size_t stride, size_t at, size_t run, uint32_t n,
                        uint64_t deadline_ms)
{
    uint8_t msg[8 + GANG__WKV_BLOB_MAX], mac[32];
    size_t len = 0;
    int rc = p->make_blob(p->ctx, msg + 8, GANG__WKV_BLOB_MAX, &len);
    if (rc != 0)
        return rc;
    if (len == 0 || len > GANG__WKV_BLOB_MAX)
        return GANG_ERANGE;
    /* One message only when the rows are contiguous on both sides. */
    uint32_t msgs = peer_whole && at == 0 && run == stride ? 1 : n;
    put32(msg, (uint32_t)len);
    put32(msg + 4, msgs);
    pair_blob_mac(t, nonces, msg, len, mac);
    rc = gang__wkv_io(fd, msg, 8 + len, 1, deadline_ms);
    if (rc == 0)
        rc = gang__wkv_io(fd, mac, sizeof mac, 1, deadline_ms);
    if (rc != 0)
        return rc;
    return pair_run(p, live, k, msg + 8, len, 0, dev, stride, at, run, n, msgs, deadline_ms);
}

int gang__wkv_pair_recv(const gang__wkv_pair *p, gang__wkv_live *live, gang_kernels *k,
                        const gang_token *t, int fd, const uint8_t nonces[64], uint8_t *dev,
                        size_t stride, size_t at, size_t run, uint32_t n, uint64_t deadline_ms)
{
    uint8_t msg[8 + GANG__WKV_BLOB_MAX], mac[32], got[32];
    int rc = gang__wkv_io(fd, msg, 8, 0, deadline_ms);
    if (rc != 0)
        return rc;
    size_t len = get32(msg);
    uint32_t msgs = get32(msg + 4);
    if (len == 0 || len > GANG__WKV_BLOB_MAX)
        return GANG_EPROTO;
    rc = gang__wkv_io(fd, msg + 8, len, 0, deadline_ms);
    if (rc == 0)
        rc = gang__wkv_io(fd, got, sizeof got, 0, deadline_ms);
    if (rc != 0)
        return rc;
    pair_blob_mac(t, nonces, msg, len, mac);
    if (!gang__wkv_mac_ok(t, mac, got))
        return GANG_EAUTH;
    if (msgs != n && (msgs != 1 || at != 0 || run != stride))
        return GANG_EPROTO; /* (one message needs contiguous rows here) */
    return pair_run(p, live, k, msg + 8, len, 1, dev, stride, at, run, n, msgs, deadline_ms);
}
