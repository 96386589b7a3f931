/*
 * The transport of disaggregated prefill/decode's KV transfers (issue #26,
 * launcher/worker-kv.c): the engine's gang_kv_hooks over TCP between the ranks of a
 * prefill gang and those of a decode gang that hold the same layers and kv heads (equal
 * TP, any PP: the engine names which layers of which rank). Internal to the launcher.
 */
#ifndef GANGLION_LAUNCHER_WORKER_KV_H
#define GANGLION_LAUNCHER_WORKER_KV_H

#include <pthread.h>

#include "ganglion/comm.h"
#include "ganglion/kernels.h"
#include "worker.h"

typedef struct gang__wkv gang__wkv;

/*
 * Starts the transport of global rank `rank` for engine e with the config's role: a
 * prefill gang's rank with a --kv-port keeps its exports (at most kv_store_bytes, each
 * for kv_hold_ms) and serves them on kv_port + rank from a thread of its own; every rank
 * may fetch. Plugs the hooks into e (gang_engine_set_kv_hooks), with the rank's address
 * (kv_advertise when it is IPv4) for the export's list of node addresses. A listener that cannot be
 * opened is logged and leaves exports off (the decode gangs then prefill). Returns 0 and
 * *out, or GANG_ENOMEM. The loader thread calls it once; gang__wkv_stop (after the engine
 * stopped stepping) joins the thread and frees everything.
 */
int gang__wkv_start(const gang__wres_config *c, uint32_t rank, gang_engine *e, gang__wkv **out);
void gang__wkv_stop(gang__wkv *k);

/*
 * The device path (launcher/worker-kv-pair.c): after the authenticated TCP handshake, a
 * prefill rank and a decode rank that both keep their blocks in device memory form a
 * 2-rank communicator (prefill rank 0, decode rank 1), whose bootstrap blob the prefill
 * rank makes and sends over the TCP channel (so only a peer that proved the token gets
 * it), and the block rows move with gang_comm_send / gang_comm_recv between device
 * buffers. One communicator per transfer (see docs/design.md section 10).
 *   make_blob: the prefill side's fresh blob into blob[cap] (*len); 0 or an error.
 *   join: the calling thread's part of the pair of blob as `rank`, on k's device (the
 *        join makes it current), by timeout_ms; 0 and *out, or an error.
 * The nccl pair (gang__wkv_pair_nccl) is the production one; tests plug their own.
 */
#define GANG__WKV_BLOB_MAX 512

typedef struct gang__wkv_pair {
    void *ctx;
    int (*make_blob)(void *ctx, uint8_t *blob, size_t cap, size_t *len);
    int (*join)(void *ctx, gang_kernels *k, const uint8_t *blob, size_t len, uint32_t rank,
                uint64_t timeout_ms, gang_comm **out);
} gang__wkv_pair;

/* The pairs in flight of one transport, for gang__wkv_abort (all under mu). */
#define GANG__WKV_LIVE 8

typedef struct gang__wkv_live {
    pthread_mutex_t mu;
    gang_comm *c[GANG__WKV_LIVE]; /* NULL: a free entry */
    int stopping;                 /* set by gang__wkv_abort: no new pair forms */
} gang__wkv_live;

/* The NCCL pair: gang_comm_nccl_unique_id and gang_comm_init(GANG_COMM_NCCL, 2 ranks). */
extern const gang__wkv_pair gang__wkv_pair_nccl;

/*
 * Plugs pair p (copied; NULL: none) into k's hooks: with one, an engine on device memory
 * moves its transfers on the device path (put_dev / get_dev), else through host memory
 * over TCP. gang__wkv_start plugs the nccl pair when the gang's data plane is nccl. Before
 * the engine steps.
 */
void gang__wkv_set_pair(gang__wkv *k, const gang__wkv_pair *p);

/*
 * Aborts k's pair transfers in flight (gang_comm_abort: they return GANG_EABORTED within
 * the comm front's promptness) and refuses new ones, so that stopping a worker does not
 * wait for their deadlines. Any thread; before the engine is freed (which joins its
 * fetches) and gang__wkv_stop.
 */
void gang__wkv_abort(gang__wkv *k);

/* Transfers on the device path so far (served as a prefill rank, fetched as a decode). */
uint64_t gang__wkv_pair_count(gang__wkv *k);

/* Internal to worker-kv*.c. */
int gang__wkv_io(int fd, void *buf, size_t n, int out, uint64_t deadline_ms);
void gang__wkv_mac(const gang_token *t, const char *label, const uint8_t *a, size_t na,
                   const uint8_t *b, size_t nb, uint8_t out[32]);
int gang__wkv_mac_ok(const gang_token *t, const uint8_t *want, const uint8_t *got);
/* The pair's halves of one transfer on a connection whose handshake passed (nonces: the
 * server's then the client's): the server makes and sends the blob, then sends run bytes
 * of each of n blocks from dev + b * stride + at (in one message when its rows are
 * contiguous and peer_whole says the client's are, else one per block); the client
 * receives the blob and the rows into the same places of its dev (with its own stride
 * and at). The pair is listed in live (NULL: not) while it
 * exists; GANG_EABORTED once live is stopping. 0 or an error, by deadline_ms. */
int gang__wkv_pair_send(const gang__wkv_pair *p, gang__wkv_live *live, gang_kernels *k,
                        const gang_token *t, int fd, const uint8_t nonces[64], int peer_whole,
                        uint8_t *dev, size_t stride, size_t at, size_t run, uint32_t n,
                        uint64_t deadline_ms);
int gang__wkv_pair_recv(const gang__wkv_pair *p, gang__wkv_live *live, gang_kernels *k,
                        const gang_token *t, int fd, const uint8_t nonces[64], uint8_t *dev,
                        size_t stride, size_t at, size_t run, uint32_t n, uint64_t deadline_ms);

#endif
