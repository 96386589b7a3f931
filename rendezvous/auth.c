/*
 * Rendezvous authentication: a mutual HMAC-SHA256 challenge over the shared token, with
 * libsodium doing all of the cryptography (docs/design.md §4: never hand-rolled crypto).
 *
 *   coordinator -> CHALLENGE(server_nonce)
 *   member      -> JOIN(..., client_nonce,
 *                       mac_m = HMAC(k, "ganglion-join-v1" | server_nonce | client_nonce |
 *                                   job | 0x00 | u32le node_index | u32le nnodes |
 *                                   u32le nproc_per_node | u32le tp | u32le pp |
 *                                   model_digest[32] | u64le generation_seen | host | 0x00))
 *   coordinator -> WELCOME(mac_c = HMAC(k, "ganglion-welcome-v1" | client_nonce |
 *                                      server_nonce))          or REJECT(GANG_EAUTH)
 *
 * k is the SHA-256 of the token, so every token length gives a full-size key. The labels
 * are different for the two directions, which stops a reflected member MAC from passing
 * as the coordinator's proof; each side's fresh nonce stops replay of the other side's
 * old messages. The MAC covers every field of the JOIN, so a man in the middle cannot
 * change the shape, model digest, generation or advertised host of a member. The strings
 * end in a 0 byte so that neighbouring fields cannot trade bytes and produce the same MAC
 * input; everything else has a fixed length.
 *
 * Without a token (present = 0) signing writes an all-zero MAC and verifying accepts
 * anything: whether an unauthenticated peer is acceptable is the coordinator's policy,
 * not this file's.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "ganglion/rendezvous.h"

#define TOKEN_MIN 16
#define TOKEN_MAX 4096
/* The file may carry trailing whitespace after a maximal token; anything beyond this is
 * not a token file, and reading stops there instead of slurping whatever the path names. */
#define TOKEN_FILE_MAX (TOKEN_MAX + 1024)

static const char join_label[] = "ganglion-join-v1";
static const char welcome_label[] = "ganglion-welcome-v1";

/* Initialises libsodium (see rendezvous.h). sodium_init() returns 1 when already done. */
int gang_auth_init(void)
{
    if (sodium_init() < 0)
        return GANG_EINTERNAL;
    return 0;
}

static void set_err(char *err, size_t errlen, const char *msg, const char *path)
{
    if (err && errlen)
        snprintf(err, errlen, "token file %s: %s", path, msg);
}

static int is_space(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/*
 * Loads a token file into t (see rendezvous.h). On failure t is left with present = 0 and
 * a zero key, and err says why. The token bytes are wiped from the stack before return,
 * so only the derived key stays in memory.
 */
int gang_auth_load_token(const char *path, gang_token *t, char *err, size_t errlen)
{
    uint8_t buf[TOKEN_FILE_MAX + 1];
    size_t len = 0;
    int fd;
    int rc = 0;

    memset(t, 0, sizeof *t);
    if (err && errlen)
        err[0] = '\0';
    if (path == NULL || path[0] == '\0')
        return 0;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        set_err(err, errlen, strerror(e), path);
        return gang_err_from_errno(e);
    }
    /* Read one byte more than allowed so that an oversized file is noticed. */
    while (len < sizeof buf) {
        ssize_t n = read(fd, buf + len, sizeof buf - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            rc = gang_err_from_errno(e);
            set_err(err, errlen, strerror(e), path);
            goto out_close;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    if (len > TOKEN_FILE_MAX) {
        rc = GANG_EINVAL;
        set_err(err, errlen, "file is too large to be a token", path);
        goto out_close;
    }

    while (len > 0 && is_space(buf[len - 1]))
        len--;
    if (len == 0) {
        rc = GANG_EINVAL;
        set_err(err, errlen, "token is empty", path);
        goto out_close;
    }
    if (len < TOKEN_MIN) {
        rc = GANG_EINVAL;
        set_err(err, errlen, "token is shorter than 16 bytes", path);
        goto out_close;
    }
    if (len > TOKEN_MAX) {
        rc = GANG_EINVAL;
        set_err(err, errlen, "token is longer than 4096 bytes", path);
        goto out_close;
    }
    crypto_hash_sha256(t->key, buf, len);
    t->present = 1;

out_close:
    sodium_memzero(buf, sizeof buf);
    close(fd);
    return rc;
}

void gang_auth_random(uint8_t *out, size_t n)
{
    randombytes_buf(out, n);
}

/* HMAC input of the member's proof; see the block comment at the top of the file. */
static void join_mac(const gang_token *t, const uint8_t server_nonce[GANG_NONCE_SIZE],
                     const gang_msg_join *j, uint8_t mac[GANG_MAC_SIZE])
{
    crypto_auth_hmacsha256_state st;
    uint8_t zero = 0;
    uint8_t idx[4];

    for (int i = 0; i < 4; i++)
        idx[i] = (uint8_t)(j->node_index >> (8 * i));
    crypto_auth_hmacsha256_init(&st, t->key, sizeof t->key);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)join_label, sizeof join_label - 1);
    crypto_auth_hmacsha256_update(&st, server_nonce, GANG_NONCE_SIZE);
    crypto_auth_hmacsha256_update(&st, j->client_nonce, GANG_NONCE_SIZE);
    /* strnlen: a job field that lost its NUL must not make us read past the struct. */
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)j->job, strnlen(j->job, GANG_JOB_MAX));
    crypto_auth_hmacsha256_update(&st, &zero, 1);
    crypto_auth_hmacsha256_update(&st, idx, sizeof idx);
    const uint32_t shape[4] = {j->nnodes, j->nproc_per_node, j->tp, j->pp};
    for (int f = 0; f < 4; f++) {
        uint8_t le[4];
        for (int i = 0; i < 4; i++)
            le[i] = (uint8_t)(shape[f] >> (8 * i));
        crypto_auth_hmacsha256_update(&st, le, sizeof le);
    }
    crypto_auth_hmacsha256_update(&st, j->model_digest, GANG_DIGEST_SIZE);
    uint8_t gen[8];
    for (int i = 0; i < 8; i++)
        gen[i] = (uint8_t)(j->generation_seen >> (8 * i));
    crypto_auth_hmacsha256_update(&st, gen, sizeof gen);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)j->host, strnlen(j->host, GANG_HOST_MAX));
    crypto_auth_hmacsha256_update(&st, &zero, 1);
    crypto_auth_hmacsha256_final(&st, mac);
    sodium_memzero(&st, sizeof st);
}

/* HMAC input of the coordinator's proof; see the block comment at the top of the file. */
static void welcome_mac(const gang_token *t, const uint8_t client_nonce[GANG_NONCE_SIZE],
                        const uint8_t server_nonce[GANG_NONCE_SIZE], uint8_t mac[GANG_MAC_SIZE])
{
    crypto_auth_hmacsha256_state st;

    crypto_auth_hmacsha256_init(&st, t->key, sizeof t->key);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)welcome_label, sizeof welcome_label - 1);
    crypto_auth_hmacsha256_update(&st, client_nonce, GANG_NONCE_SIZE);
    crypto_auth_hmacsha256_update(&st, server_nonce, GANG_NONCE_SIZE);
    crypto_auth_hmacsha256_final(&st, mac);
    sodium_memzero(&st, sizeof st);
}

/*
 * Fills j->mac from j's job, node_index and client_nonce (set them first) and the
 * coordinator's server_nonce. Without a token the MAC is all zero.
 */
void gang_auth_sign_join(const gang_token *t, const uint8_t server_nonce[GANG_NONCE_SIZE],
                         gang_msg_join *j)
{
    if (!t->present) {
        memset(j->mac, 0, sizeof j->mac);
        return;
    }
    join_mac(t, server_nonce, j, j->mac);
}

/*
 * Checks j->mac against the server_nonce this connection was challenged with. Returns 0
 * or GANG_EAUTH; always 0 without a token (policy belongs to the coordinator). The
 * comparison takes the same time wherever the MACs differ, so a peer cannot learn a valid
 * MAC byte by byte from response times.
 */
int gang_auth_verify_join(const gang_token *t, const uint8_t server_nonce[GANG_NONCE_SIZE],
                          const gang_msg_join *j)
{
    uint8_t want[GANG_MAC_SIZE];
    int rc;

    if (!t->present)
        return 0;
    join_mac(t, server_nonce, j, want);
    rc = sodium_memcmp(want, j->mac, GANG_MAC_SIZE) == 0 ? 0 : GANG_EAUTH;
    sodium_memzero(want, sizeof want);
    return rc;
}

/* Computes the coordinator's WELCOME proof into mac; all zero without a token. */
void gang_auth_sign_welcome(const gang_token *t, const uint8_t client_nonce[GANG_NONCE_SIZE],
                            const uint8_t server_nonce[GANG_NONCE_SIZE], uint8_t mac[GANG_MAC_SIZE])
{
    if (!t->present) {
        memset(mac, 0, GANG_MAC_SIZE);
        return;
    }
    welcome_mac(t, client_nonce, server_nonce, mac);
}

/*
 * The member's check of the coordinator's proof: 0 or GANG_EAUTH, in constant time;
 * always 0 without a token.
 */
int gang_auth_verify_welcome(const gang_token *t, const uint8_t client_nonce[GANG_NONCE_SIZE],
                             const uint8_t server_nonce[GANG_NONCE_SIZE],
                             const uint8_t mac[GANG_MAC_SIZE])
{
    uint8_t want[GANG_MAC_SIZE];
    int rc;

    if (!t->present)
        return 0;
    welcome_mac(t, client_nonce, server_nonce, want);
    rc = sodium_memcmp(want, mac, GANG_MAC_SIZE) == 0 ? 0 : GANG_EAUTH;
    sodium_memzero(want, sizeof want);
    return rc;
}

/* =================================================================================
 * Per-connection session MACs (docs/protocol.md §5.3). After a successful handshake with
 * a token, both sides derive
 *
 *   session_key = HMAC-SHA256(k, "ganglion-session-v1" | server_nonce | client_nonce)
 *
 * and every later frame in either direction is followed by
 *
 *   tag = first 16 bytes of HMAC-SHA256(session_key, dir | u64le seq | frame bytes)
 *
 * where dir is GANG_SESSION_DIR_TO_MEMBER or GANG_SESSION_DIR_TO_COORD and seq counts the
 * frames sent in that direction since the handshake, from 0. The session key is fresh per
 * connection (both nonces are), the direction byte stops reflection, the sequence number
 * stops replay, reordering and dropping; the tag covers the header, so the type,
 * generation and length cannot be changed either. 2^64 frames never happen, so the
 * counter does not wrap in practice; it is not allowed to (see gang_auth_session_sign).
 * ================================================================================= */
static const char session_label[] = "ganglion-session-v1";

/*
 * Starts s from the handshake's nonces (see rendezvous.h). Without a token s stays
 * inactive: unauthenticated gangs send frames without tags.
 */
void gang_auth_session_start(gang_session *s, const gang_token *t,
                             const uint8_t server_nonce[GANG_NONCE_SIZE],
                             const uint8_t client_nonce[GANG_NONCE_SIZE], int coordinator_side)
{
    crypto_auth_hmacsha256_state st;

    gang_auth_session_clear(s);
    if (!t->present)
        return;
    crypto_auth_hmacsha256_init(&st, t->key, sizeof t->key);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)session_label, sizeof session_label - 1);
    crypto_auth_hmacsha256_update(&st, server_nonce, GANG_NONCE_SIZE);
    crypto_auth_hmacsha256_update(&st, client_nonce, GANG_NONCE_SIZE);
    crypto_auth_hmacsha256_final(&st, s->key);
    sodium_memzero(&st, sizeof st);
    s->send_dir = coordinator_side ? GANG_SESSION_DIR_TO_MEMBER : GANG_SESSION_DIR_TO_COORD;
    s->recv_dir = coordinator_side ? GANG_SESSION_DIR_TO_COORD : GANG_SESSION_DIR_TO_MEMBER;
    s->send_seq = 0;
    s->recv_seq = 0;
    s->active = 1;
}

void gang_auth_session_clear(gang_session *s)
{
    sodium_memzero(s, sizeof *s);
}

/* The full 32-byte HMAC of one frame in direction dir with sequence number seq. */
static void session_mac(const gang_session *s, uint8_t dir, uint64_t seq, const uint8_t *frame,
                        size_t len, uint8_t mac[GANG_MAC_SIZE])
{
    crypto_auth_hmacsha256_state st;
    uint8_t seq_le[8];

    for (int i = 0; i < 8; i++)
        seq_le[i] = (uint8_t)(seq >> (8 * i));
    crypto_auth_hmacsha256_init(&st, s->key, sizeof s->key);
    crypto_auth_hmacsha256_update(&st, &dir, 1);
    crypto_auth_hmacsha256_update(&st, seq_le, sizeof seq_le);
    crypto_auth_hmacsha256_update(&st, frame, len);
    crypto_auth_hmacsha256_final(&st, mac);
    sodium_memzero(&st, sizeof st);
}

/*
 * Tags the next outgoing frame and advances the send sequence number. GANG_EINVAL when
 * the session is not active or its counter is exhausted, so a wrapped counter can never
 * reuse a tag.
 */
int gang_auth_session_sign(gang_session *s, const uint8_t *frame, size_t len,
                           uint8_t tag[GANG_WIRE_TAG_SIZE])
{
    uint8_t mac[GANG_MAC_SIZE];

    if (!s->active || s->send_seq == UINT64_MAX)
        return GANG_EINVAL;
    session_mac(s, s->send_dir, s->send_seq, frame, len, mac);
    memcpy(tag, mac, GANG_WIRE_TAG_SIZE);
    sodium_memzero(mac, sizeof mac);
    s->send_seq++;
    return 0;
}

/*
 * Checks the tag of the next incoming frame against the expected receive sequence number,
 * in constant time, and advances it on success. GANG_EAUTH for a wrong, replayed,
 * reordered or reflected frame (the connection must then be closed), GANG_EINVAL when
 * the session is not active.
 */
int gang_auth_session_verify(gang_session *s, const uint8_t *frame, size_t len,
                             const uint8_t tag[GANG_WIRE_TAG_SIZE])
{
    uint8_t mac[GANG_MAC_SIZE];
    int rc;

    if (!s->active || s->recv_seq == UINT64_MAX)
        return GANG_EINVAL;
    session_mac(s, s->recv_dir, s->recv_seq, frame, len, mac);
    rc = sodium_memcmp(mac, tag, GANG_WIRE_TAG_SIZE) == 0 ? 0 : GANG_EAUTH;
    sodium_memzero(mac, sizeof mac);
    if (rc == 0)
        s->recv_seq++;
    return rc;
}
