/*
 * Authentication and model digest tests: the HMAC inputs match the documented layout
 * byte for byte, both proofs verify with the right token and fail with a wrong one or
 * any tampered input, token files are validated, and the model digest tracks exactly the
 * files it claims to cover.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "ganglion/rendezvous.h"
#include "rdzv-tests.h"

/* ---------------------------------------------------------------------------------
 * Helpers
 * --------------------------------------------------------------------------------- */

/* Writes len bytes to a fresh temp file; path receives its name (caller unlinks). */
static void write_temp(char path[64], const void *data, size_t len)
{
    int fd;

    strcpy(path, "/tmp/ganglion-token-XXXXXX");
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    assert_int_equal(close(fd), 0);
}

/* Loads a token from a temp file holding s; returns the load result. */
static int load_from_string(const char *s, gang_token *t, char *err, size_t errlen)
{
    char path[64];
    int rc;

    write_temp(path, s, strlen(s));
    rc = gang_auth_load_token(path, t, err, errlen);
    unlink(path);
    return rc;
}

static void token_of(const char *s, gang_token *t)
{
    char err[256];
    assert_int_equal(load_from_string(s, t, err, sizeof err), 0);
    assert_int_equal(t->present, 1);
}

static void put_file(const char *dir, const char *name, const void *data, size_t len)
{
    char path[512];
    FILE *f;

    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void remove_file(const char *dir, const char *name)
{
    char path[512];

    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

static void sample_join(gang_msg_join *j)
{
    memset(j, 0, sizeof *j);
    strcpy(j->job, "llama-serve");
    j->node_index = 3;
    j->nnodes = 4;
    j->nproc_per_node = 8;
    j->tp = 8;
    j->pp = 4;
    for (int i = 0; i < GANG_DIGEST_SIZE; i++)
        j->model_digest[i] = (uint8_t)(i * 7 + 1);
    j->generation_seen = 7;
    strcpy(j->host, "10.0.0.3");
    gang_auth_random(j->client_nonce, sizeof j->client_nonce);
}

static int group_setup(void **state)
{
    (void)state;
    /* A second call must be harmless too: several modules may initialise. */
    if (gang_auth_init() != 0 || gang_auth_init() != 0)
        return -1;
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Token files
 * --------------------------------------------------------------------------------- */

static void test_token_trailing_whitespace_stripped(void **state)
{
    static const char tok[] = "0123456789abcdef-secret";
    uint8_t want[32];
    gang_token a, b;
    (void)state;

    crypto_hash_sha256(want, (const uint8_t *)tok, strlen(tok));
    token_of(tok, &a);
    token_of("0123456789abcdef-secret\n", &b);
    assert_memory_equal(a.key, want, sizeof want);
    assert_memory_equal(b.key, want, sizeof want);
    token_of("0123456789abcdef-secret \t\r\n\n", &b);
    assert_memory_equal(b.key, want, sizeof want);
    /* Leading whitespace is part of the token. */
    token_of(" 0123456789abcdef-secret", &b);
    assert_memory_not_equal(b.key, want, sizeof want);
}

static void test_token_length_bounds(void **state)
{
    char buf[4200];
    char err[256];
    gang_token t;
    (void)state;

    /* 15 bytes is too short, even with a newline that makes the file 16 bytes. */
    assert_int_equal(load_from_string("0123456789abcde\n", &t, err, sizeof err), GANG_EINVAL);
    assert_int_equal(t.present, 0);
    assert_true(strlen(err) > 0);
    token_of("0123456789abcdef", &t);

    memset(buf, 'k', 4096);
    buf[4096] = '\0';
    token_of(buf, &t);
    buf[4096] = 'k';
    buf[4097] = '\0';
    err[0] = '\0';
    assert_int_equal(load_from_string(buf, &t, err, sizeof err), GANG_EINVAL);
    assert_int_equal(t.present, 0);
    assert_true(strlen(err) > 0);
}

static void test_token_empty_and_missing(void **state)
{
    char err[256];
    gang_token t;
    (void)state;

    assert_int_equal(load_from_string("", &t, err, sizeof err), GANG_EINVAL);
    assert_int_equal(load_from_string(" \n\t\n", &t, err, sizeof err), GANG_EINVAL);
    assert_int_equal(t.present, 0);
    assert_int_equal(gang_auth_load_token("/tmp/ganglion-no-such-token-file", &t, err, sizeof err),
                     GANG_ENOENT);
    assert_int_equal(t.present, 0);
    assert_non_null(strstr(err, "ganglion-no-such-token-file"));
    /* No path: no token, and that is not an error here (the agent warns). */
    memset(&t, 0xFF, sizeof t);
    assert_int_equal(gang_auth_load_token("", &t, err, sizeof err), 0);
    assert_int_equal(t.present, 0);
}

/* ---------------------------------------------------------------------------------
 * JOIN and WELCOME proofs
 * --------------------------------------------------------------------------------- */

/* The member's MAC is HMAC-SHA256 over exactly the documented bytes. */
static void test_join_mac_layout(void **state)
{
    static const char label[] = "ganglion-join-v1";
    uint8_t input[256], nonce[GANG_NONCE_SIZE], want[GANG_MAC_SIZE];
    gang_msg_join j;
    gang_token t;
    size_t n = 0;
    (void)state;

    token_of("a-token-of-sufficient-length", &t);
    sample_join(&j);
    gang_auth_random(nonce, sizeof nonce);
    gang_auth_sign_join(&t, nonce, &j);

    memcpy(input + n, label, strlen(label));
    n += strlen(label);
    memcpy(input + n, nonce, sizeof nonce);
    n += sizeof nonce;
    memcpy(input + n, j.client_nonce, sizeof j.client_nonce);
    n += sizeof j.client_nonce;
    memcpy(input + n, "llama-serve", 12); /* job and its terminating 0 byte */
    n += 12;
    memcpy(input + n, "\x03\0\0\0", 4); /* node_index 3, little-endian */
    n += 4;
    memcpy(input + n, "\x04\0\0\0\x08\0\0\0\x08\0\0\0\x04\0\0\0", 16); /* shape */
    n += 16;
    memcpy(input + n, j.model_digest, GANG_DIGEST_SIZE);
    n += GANG_DIGEST_SIZE;
    memcpy(input + n, "\x07\0\0\0\0\0\0\0", 8); /* generation_seen 7 */
    n += 8;
    memcpy(input + n, "10.0.0.3", 9); /* host and its terminating 0 byte */
    n += 9;
    crypto_auth_hmacsha256(want, input, n, t.key);
    assert_memory_equal(j.mac, want, sizeof want);
}

/* Every JOIN field is bound by the MAC: changing any one of them breaks verification. */
static void test_join_mac_binds_every_field(void **state)
{
    uint8_t nonce[GANG_NONCE_SIZE];
    gang_msg_join j, x;
    gang_token t;
    (void)state;

    token_of("a-token-of-sufficient-length", &t);
    sample_join(&j);
    gang_auth_random(nonce, sizeof nonce);
    gang_auth_sign_join(&t, nonce, &j);
    assert_int_equal(gang_auth_verify_join(&t, nonce, &j), 0);
    for (int field = 0; field < 7; field++) {
        x = j;
        switch (field) {
        case 0:
            x.nnodes++;
            break;
        case 1:
            x.nproc_per_node++;
            break;
        case 2:
            x.tp++;
            break;
        case 3:
            x.pp++;
            break;
        case 4:
            x.model_digest[31] ^= 1;
            break;
        case 5:
            x.generation_seen++;
            break;
        default:
            x.host[0] = '9';
            break;
        }
        assert_int_equal(gang_auth_verify_join(&t, nonce, &x), GANG_EAUTH);
    }
}

static void test_welcome_mac_layout(void **state)
{
    static const char label[] = "ganglion-welcome-v1";
    uint8_t input[128], sn[GANG_NONCE_SIZE], cn[GANG_NONCE_SIZE];
    uint8_t mac[GANG_MAC_SIZE], want[GANG_MAC_SIZE];
    gang_token t;
    size_t n = 0;
    (void)state;

    token_of("a-token-of-sufficient-length", &t);
    gang_auth_random(sn, sizeof sn);
    gang_auth_random(cn, sizeof cn);
    gang_auth_sign_welcome(&t, cn, sn, mac);
    memcpy(input + n, label, strlen(label));
    n += strlen(label);
    memcpy(input + n, cn, sizeof cn);
    n += sizeof cn;
    memcpy(input + n, sn, sizeof sn);
    n += sizeof sn;
    crypto_auth_hmacsha256(want, input, n, t.key);
    assert_memory_equal(mac, want, sizeof want);
}

/*
 * The session key and tags match protocol.md §5.3 byte for byte:
 *   session_key = HMAC(k, "ganglion-session-v1" | server_nonce | client_nonce)
 *   tag = HMAC(session_key, dir | u64le seq | frame)[0..16)
 */
static void test_session_tag_layout(void **state)
{
    static const char label[] = "ganglion-session-v1";
    static const uint8_t frame[] = "pretend this is a header and a payload";
    uint8_t input[256], sn[GANG_NONCE_SIZE], cn[GANG_NONCE_SIZE];
    uint8_t key[GANG_MAC_SIZE], want[GANG_MAC_SIZE], tag[GANG_WIRE_TAG_SIZE];
    gang_session coord, member;
    gang_token t;
    size_t n = 0;
    (void)state;

    token_of("a-token-of-sufficient-length", &t);
    gang_auth_random(sn, sizeof sn);
    gang_auth_random(cn, sizeof cn);
    memcpy(input + n, label, strlen(label));
    n += strlen(label);
    memcpy(input + n, sn, sizeof sn);
    n += sizeof sn;
    memcpy(input + n, cn, sizeof cn);
    n += sizeof cn;
    crypto_auth_hmacsha256(key, input, n, t.key);

    gang_auth_session_start(&coord, &t, sn, cn, 1);
    gang_auth_session_start(&member, &t, sn, cn, 0);
    assert_true(coord.active && member.active);
    assert_memory_equal(coord.key, key, sizeof key);
    assert_memory_equal(member.key, key, sizeof key);

    /* Coordinator -> member, frames 0 and 1; then member -> coordinator, frame 0. */
    for (uint64_t seq = 0; seq < 2; seq++) {
        n = 0;
        input[n++] = GANG_SESSION_DIR_TO_MEMBER;
        for (int i = 0; i < 8; i++)
            input[n++] = (uint8_t)(seq >> (8 * i));
        memcpy(input + n, frame, sizeof frame);
        n += sizeof frame;
        crypto_auth_hmacsha256(want, input, n, key);
        assert_int_equal(gang_auth_session_sign(&coord, frame, sizeof frame, tag), 0);
        assert_memory_equal(tag, want, sizeof tag);
    }
    n = 0;
    input[n++] = GANG_SESSION_DIR_TO_COORD;
    memset(input + n, 0, 8);
    n += 8;
    memcpy(input + n, frame, sizeof frame);
    n += sizeof frame;
    crypto_auth_hmacsha256(want, input, n, key);
    assert_int_equal(gang_auth_session_sign(&member, frame, sizeof frame, tag), 0);
    assert_memory_equal(tag, want, sizeof tag);
    gang_auth_session_clear(&coord);
    gang_auth_session_clear(&member);
    assert_false(coord.active);
}

/*
 * A tag verifies once, in order, in its own direction, on the bytes it was made for and
 * on this connection only: wrong, modified, replayed, reordered, reflected and
 * cross-connection frames all fail with GANG_EAUTH.
 */
static void test_session_verify(void **state)
{
    uint8_t f0[] = "frame zero", f1[] = "frame one";
    uint8_t t0[GANG_WIRE_TAG_SIZE], t1[GANG_WIRE_TAG_SIZE], bad[GANG_WIRE_TAG_SIZE];
    uint8_t sn[GANG_NONCE_SIZE], cn[GANG_NONCE_SIZE];
    gang_session coord, member, other;
    gang_token t, none;
    (void)state;

    token_of("a-token-of-sufficient-length", &t);
    gang_auth_random(sn, sizeof sn);
    gang_auth_random(cn, sizeof cn);
    gang_auth_session_start(&coord, &t, sn, cn, 1);
    assert_int_equal(gang_auth_session_sign(&coord, f0, sizeof f0, t0), 0);
    assert_int_equal(gang_auth_session_sign(&coord, f1, sizeof f1, t1), 0);

    /* In order: accepted. Replayed: refused. */
    gang_auth_session_start(&member, &t, sn, cn, 0);
    assert_int_equal(gang_auth_session_verify(&member, f0, sizeof f0, t0), 0);
    assert_int_equal(gang_auth_session_verify(&member, f1, sizeof f1, t1), 0);
    assert_int_equal(gang_auth_session_verify(&member, f1, sizeof f1, t1), GANG_EAUTH);

    /* Reordered: frame 1 first is refused, and so is a wrong tag or a modified frame. */
    gang_auth_session_start(&member, &t, sn, cn, 0);
    assert_int_equal(gang_auth_session_verify(&member, f1, sizeof f1, t1), GANG_EAUTH);
    memcpy(bad, t0, sizeof bad);
    bad[GANG_WIRE_TAG_SIZE - 1] ^= 0x80;
    assert_int_equal(gang_auth_session_verify(&member, f0, sizeof f0, bad), GANG_EAUTH);
    f0[0] ^= 1;
    assert_int_equal(gang_auth_session_verify(&member, f0, sizeof f0, t0), GANG_EAUTH);
    f0[0] ^= 1;
    /* A failed check does not advance the counter: the genuine frame 0 still verifies. */
    assert_int_equal(gang_auth_session_verify(&member, f0, sizeof f0, t0), 0);

    /* Reflected: the coordinator does not accept its own frame 0 back. */
    assert_int_equal(gang_auth_session_verify(&coord, f0, sizeof f0, t0), GANG_EAUTH);

    /* Another connection (another client nonce) has another key. */
    cn[0] ^= 1;
    gang_auth_session_start(&other, &t, sn, cn, 0);
    assert_int_equal(gang_auth_session_verify(&other, f0, sizeof f0, t0), GANG_EAUTH);

    /* No token: no session, and an inactive session neither signs nor verifies. */
    memset(&none, 0, sizeof none);
    gang_auth_session_start(&other, &none, sn, cn, 0);
    assert_false(other.active);
    assert_int_equal(gang_auth_session_sign(&other, f0, sizeof f0, t0), GANG_EINVAL);
    assert_int_equal(gang_auth_session_verify(&other, f0, sizeof f0, t0), GANG_EINVAL);
    gang_auth_session_clear(&coord);
    gang_auth_session_clear(&member);
}

static int reader_tag_check(void *ctx, const uint8_t *frame, size_t len,
                            const uint8_t tag[GANG_WIRE_TAG_SIZE])
{
    return gang_auth_session_verify(ctx, frame, len, tag);
}

/*
 * The streaming reader with a session: tagged frames come out in order, even fed byte by
 * byte; a bad header still fails from its 20 bytes; a wrong tag fails with GANG_EAUTH
 * before the payload is decoded (garbage behind a wrong tag is not reported as EPROTO),
 * and the error is sticky.
 */
static void test_reader_with_session(void **state)
{
    static uint8_t stream[4 * GANG_WIRE_MAX_FRAME];
    uint8_t sn[GANG_NONCE_SIZE], cn[GANG_NONCE_SIZE];
    gang_session tx, rx;
    gang_msg m, out;
    gang_token t;
    size_t len = 0, n = 0;
    gang_wire_reader *r;
    (void)state;

    token_of("a-token-of-sufficient-length", &t);
    gang_auth_random(sn, sizeof sn);
    gang_auth_random(cn, sizeof cn);
    gang_auth_session_start(&tx, &t, sn, cn, 0);
    gang_auth_session_start(&rx, &t, sn, cn, 1);
    for (uint32_t i = 0; i < 3; i++) {
        memset(&m, 0, sizeof m);
        m.type = GANG_MSG_READY;
        m.generation = 7 + i;
        m.u.ready.node_index = i;
        assert_int_equal(gang_wire_encode(&m, stream + n, sizeof stream - n, &len), 0);
        assert_int_equal(gang_auth_session_sign(&tx, stream + n, len, stream + n + len), 0);
        n += len + GANG_WIRE_TAG_SIZE;
    }
    r = gang_wire_reader_new();
    assert_non_null(r);
    gang_wire_reader_set_tag_check(r, reader_tag_check, &rx);
    for (uint32_t i = 0, got = 0; i < n; i++) {
        assert_int_equal(gang_wire_reader_feed(r, stream + i, 1), 0);
        int rc = gang_wire_reader_next(r, &out);
        assert_true(rc == 0 || rc == 1);
        if (rc == 1) {
            assert_int_equal(out.u.ready.node_index, got);
            assert_true(out.generation == 7 + got);
            got++;
            assert_int_equal(gang_wire_reader_pending(r), 0);
        }
        if (i == n - 1)
            assert_int_equal(got, 3);
    }
    gang_wire_reader_free(r);

    /* A bad header (magic) with a session: refused from its 20 bytes. */
    r = gang_wire_reader_new();
    gang_wire_reader_set_tag_check(r, reader_tag_check, &rx);
    memcpy(stream, "HTTP/1.1 200 OK\r\n\r\nxx", 21);
    assert_int_equal(gang_wire_reader_feed(r, stream, GANG_WIRE_HEADER_SIZE), 0);
    assert_int_equal(gang_wire_reader_next(r, &out), GANG_EPROTO);
    gang_wire_reader_free(r);

    /* A frame with a garbage payload and a wrong tag: GANG_EAUTH, sticky. */
    memset(&m, 0, sizeof m);
    m.type = GANG_MSG_READY;
    assert_int_equal(gang_wire_encode(&m, stream, sizeof stream, &len), 0);
    stream[16] = 2; /* payload_len 2: a truncated READY, which the decoder would refuse */
    memset(stream + GANG_WIRE_HEADER_SIZE + 2, 0x5A, GANG_WIRE_TAG_SIZE);
    r = gang_wire_reader_new();
    gang_wire_reader_set_tag_check(r, reader_tag_check, &rx);
    assert_int_equal(gang_wire_reader_feed(r, stream, GANG_WIRE_HEADER_SIZE + 2), 0);
    assert_int_equal(gang_wire_reader_next(r, &out), 0); /* waits for the tag */
    assert_int_equal(
        gang_wire_reader_feed(r, stream + GANG_WIRE_HEADER_SIZE + 2, GANG_WIRE_TAG_SIZE), 0);
    assert_int_equal(gang_wire_reader_next(r, &out), GANG_EAUTH);
    assert_int_equal(gang_wire_reader_next(r, &out), GANG_EAUTH);
    assert_int_equal(gang_wire_reader_feed(r, stream, 1), GANG_EAUTH);
    gang_wire_reader_free(r);
    gang_auth_session_clear(&tx);
    gang_auth_session_clear(&rx);
}

static void test_join_sign_verify(void **state)
{
    uint8_t nonce[GANG_NONCE_SIZE], zero[GANG_MAC_SIZE] = {0};
    gang_msg_join j, x;
    gang_token t, other;
    (void)state;

    token_of("the-shared-rendezvous-token", &t);
    token_of("the-shared-rendezvous-tokem", &other);
    sample_join(&j);
    gang_auth_random(nonce, sizeof nonce);
    gang_auth_sign_join(&t, nonce, &j);
    assert_memory_not_equal(j.mac, zero, sizeof zero);
    assert_int_equal(gang_auth_verify_join(&t, nonce, &j), 0);

    /* Wrong token, on either side. */
    assert_int_equal(gang_auth_verify_join(&other, nonce, &j), GANG_EAUTH);

    /* Another challenge: a recorded JOIN does not answer a fresh nonce. */
    nonce[0] ^= 1;
    assert_int_equal(gang_auth_verify_join(&t, nonce, &j), GANG_EAUTH);
    nonce[0] ^= 1;

    x = j;
    x.client_nonce[GANG_NONCE_SIZE - 1] ^= 0x80;
    assert_int_equal(gang_auth_verify_join(&t, nonce, &x), GANG_EAUTH);
    x = j;
    x.node_index = 2;
    assert_int_equal(gang_auth_verify_join(&t, nonce, &x), GANG_EAUTH);
    x = j;
    x.job[0] = 'L';
    assert_int_equal(gang_auth_verify_join(&t, nonce, &x), GANG_EAUTH);
    x = j;
    strcpy(x.job, "llama-serv");
    assert_int_equal(gang_auth_verify_join(&t, nonce, &x), GANG_EAUTH);
    /* Every byte of the MAC counts, the last one included. */
    x = j;
    x.mac[7] ^= 1;
    assert_int_equal(gang_auth_verify_join(&t, nonce, &x), GANG_EAUTH);
    x = j;
    x.mac[GANG_MAC_SIZE - 1] ^= 0x40;
    assert_int_equal(gang_auth_verify_join(&t, nonce, &x), GANG_EAUTH);
    memset(x.mac, 0, sizeof x.mac);
    assert_int_equal(gang_auth_verify_join(&t, nonce, &x), GANG_EAUTH);
}

static void test_welcome_sign_verify(void **state)
{
    uint8_t sn[GANG_NONCE_SIZE], cn[GANG_NONCE_SIZE], mac[GANG_MAC_SIZE];
    gang_msg_join j;
    gang_token t, other;
    (void)state;

    token_of("the-shared-rendezvous-token", &t);
    token_of("a-different-rendezvous-token", &other);
    gang_auth_random(sn, sizeof sn);
    gang_auth_random(cn, sizeof cn);
    gang_auth_sign_welcome(&t, cn, sn, mac);
    assert_int_equal(gang_auth_verify_welcome(&t, cn, sn, mac), 0);
    assert_int_equal(gang_auth_verify_welcome(&other, cn, sn, mac), GANG_EAUTH);
    /* The nonces are ordered: swapping them is a different proof. */
    assert_int_equal(gang_auth_verify_welcome(&t, sn, cn, mac), GANG_EAUTH);
    cn[3] ^= 4;
    assert_int_equal(gang_auth_verify_welcome(&t, cn, sn, mac), GANG_EAUTH);
    cn[3] ^= 4;
    mac[31] ^= 1;
    assert_int_equal(gang_auth_verify_welcome(&t, cn, sn, mac), GANG_EAUTH);

    /* A member's own MAC reflected back is not the coordinator's proof. */
    sample_join(&j);
    memcpy(j.client_nonce, cn, sizeof cn);
    j.job[0] = '\0';
    gang_auth_sign_join(&t, sn, &j);
    assert_int_equal(gang_auth_verify_welcome(&t, cn, sn, j.mac), GANG_EAUTH);
}

/* Without a token the MAC is all zero and verification is left to policy. */
static void test_no_token(void **state)
{
    uint8_t nonce[GANG_NONCE_SIZE] = {1}, mac[GANG_MAC_SIZE], zero[GANG_MAC_SIZE] = {0};
    gang_msg_join j;
    gang_token none;
    (void)state;

    memset(&none, 0, sizeof none);
    sample_join(&j);
    memset(j.mac, 0xEE, sizeof j.mac);
    gang_auth_sign_join(&none, nonce, &j);
    assert_memory_equal(j.mac, zero, sizeof zero);
    memset(mac, 0xEE, sizeof mac);
    gang_auth_sign_welcome(&none, nonce, nonce, mac);
    assert_memory_equal(mac, zero, sizeof zero);
    j.mac[0] = 0x42;
    assert_int_equal(gang_auth_verify_join(&none, nonce, &j), 0);
    assert_int_equal(gang_auth_verify_welcome(&none, nonce, nonce, j.mac), 0);
}

static void test_random(void **state)
{
    uint8_t a[32], b[32];
    (void)state;

    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    gang_auth_random(a, sizeof a);
    gang_auth_random(b, sizeof b);
    assert_memory_not_equal(a, b, sizeof a);
}

/* ---------------------------------------------------------------------------------
 * Model digest
 * --------------------------------------------------------------------------------- */

static void test_digest_empty_path(void **state)
{
    static const uint8_t sha256_empty[32] = {
        0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4,
        0xc8, 0x99, 0x6f, 0xb9, 0x24, 0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b,
        0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55,
    };
    uint8_t d[GANG_DIGEST_SIZE];
    (void)state;

    assert_int_equal(gang_model_digest("", d), 0);
    assert_memory_equal(d, sha256_empty, sizeof d);
    assert_int_equal(gang_model_digest("/tmp/ganglion-no-such-model-dir", d), GANG_ENOENT);
}

static void test_digest_tracks_model(void **state)
{
    static const char cfg[] = "{\"hidden_size\": 64}";
    static const char cfg2[] = "{\"hidden_size\": 65}"; /* same length, other bytes */
    uint8_t d1[GANG_DIGEST_SIZE], d2[GANG_DIGEST_SIZE], want[GANG_DIGEST_SIZE];
    uint8_t cfg_hash[32], weights[100];
    crypto_hash_sha256_state st;
    char dir[64];
    (void)state;

    strcpy(dir, "/tmp/ganglion-model-XXXXXX");
    assert_non_null(mkdtemp(dir));
    memset(weights, 7, sizeof weights);

    /* A directory without config.json is not a model. */
    assert_int_equal(gang_model_digest(dir, d1), GANG_ENOENT);

    put_file(dir, "config.json", cfg, strlen(cfg));
    put_file(dir, "model.safetensors", weights, sizeof weights);
    assert_int_equal(gang_model_digest(dir, d1), 0);

    /* The documented construction, computed independently. */
    crypto_hash_sha256(cfg_hash, (const uint8_t *)cfg, strlen(cfg));
    crypto_hash_sha256_init(&st);
    crypto_hash_sha256_update(&st, cfg_hash, sizeof cfg_hash);
    crypto_hash_sha256_update(&st, (const uint8_t *)"config.json\0\x13\0\0\0\0\0\0\0", 20);
    crypto_hash_sha256_update(&st, (const uint8_t *)"model.safetensors\0\x64\0\0\0\0\0\0\0", 26);
    crypto_hash_sha256_final(&st, want);
    assert_memory_equal(d1, want, sizeof want);

    /* Stable: same files, same digest; files it does not cover change nothing. */
    assert_int_equal(gang_model_digest(dir, d2), 0);
    assert_memory_equal(d1, d2, sizeof d1);
    put_file(dir, "README.md", "hello", 5);
    put_file(dir, ".hidden.json", "{}", 2);
    assert_int_equal(gang_model_digest(dir, d2), 0);
    assert_memory_equal(d1, d2, sizeof d1);

    /* config.json's contents count, even at an equal size. */
    put_file(dir, "config.json", cfg2, strlen(cfg2));
    assert_int_equal(gang_model_digest(dir, d2), 0);
    assert_memory_not_equal(d1, d2, sizeof d1);
    put_file(dir, "config.json", cfg, strlen(cfg));
    assert_int_equal(gang_model_digest(dir, d2), 0);
    assert_memory_equal(d1, d2, sizeof d1);

    /* So do the names and sizes of the weight files. */
    put_file(dir, "model.safetensors", weights, sizeof weights - 1);
    assert_int_equal(gang_model_digest(dir, d2), 0);
    assert_memory_not_equal(d1, d2, sizeof d1);
    put_file(dir, "model.safetensors", weights, sizeof weights);
    put_file(dir, "extra.safetensors", weights, 1);
    assert_int_equal(gang_model_digest(dir, d2), 0);
    assert_memory_not_equal(d1, d2, sizeof d1);
    remove_file(dir, "extra.safetensors");
    assert_int_equal(gang_model_digest(dir, d2), 0);
    assert_memory_equal(d1, d2, sizeof d1);

    remove_file(dir, "config.json");
    remove_file(dir, "model.safetensors");
    remove_file(dir, "README.md");
    remove_file(dir, ".hidden.json");
    assert_int_equal(rmdir(dir), 0);
}

int gang_test_auth(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_trailing_whitespace_stripped),
        cmocka_unit_test(test_token_length_bounds),
        cmocka_unit_test(test_token_empty_and_missing),
        cmocka_unit_test(test_join_mac_layout),
        cmocka_unit_test(test_join_mac_binds_every_field),
        cmocka_unit_test(test_welcome_mac_layout),
        cmocka_unit_test(test_session_tag_layout),
        cmocka_unit_test(test_session_verify),
        cmocka_unit_test(test_reader_with_session),
        cmocka_unit_test(test_join_sign_verify),
        cmocka_unit_test(test_welcome_sign_verify),
        cmocka_unit_test(test_no_token),
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_digest_empty_path),
        cmocka_unit_test(test_digest_tracks_model),
    };
    return cmocka_run_group_tests_name("auth", tests, group_setup, NULL);
}
