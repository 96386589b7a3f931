/*
 * The all-to-all(v) conformance checks, shared by every backend's test binary (unit-comm:
 * socket; mpi-comm: MPI): uneven sizes, zero bytes to some ranks, every byte to one rank,
 * a large exchange, the counts-then-data exchange expert parallelism does, and the
 * front's refusals. Each rank calls gang_test_a2a_check() on its communicator; the data
 * are a function of (sender, receiver, byte index), so a byte landing in the wrong place
 * or from the wrong rank is seen.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm-a2a-check.h"

#define A2A_TIMEOUT_MS 20000

static uint8_t a2a_byte(uint32_t from, uint32_t to, size_t i)
{
    return (uint8_t)(i * 131 + from * 17 + to * 5 + 3);
}

/* The bytes rank `from` sends to rank `to` in pattern k. */
static size_t a2a_size(int k, uint32_t from, uint32_t to, uint32_t n)
{
    switch (k) {
    case 0: /* uneven, some large */
        return ((size_t)from * 7 + to * 3 + 1) % 97 * 131 + (from == to ? 5 : 0);
    case 1: /* nothing to the next rank, nothing from rank 0 to anyone but itself */
        return to == (from + 1) % n || (from == 0 && to != 0) ? 0 : 1000 + to;
    case 2: /* every rank sends everything to rank 0 */
        return to == 0 ? 65536 + from : 0;
    default: /* 1 MiB between every pair */
        return 1u << 20;
    }
}

/* Runs pattern k with regions laid out back to back, a gap of 3 bytes between them. */
static int a2a_pattern(gang_comm *c, int k, char *why, size_t cap)
{
    uint32_t n = gang_comm_size(c), me = gang_comm_rank(c);
    size_t *v = calloc(4 * (size_t)n, sizeof(size_t)), stot = 0, rtot = 0;
    uint8_t *send = NULL, *recv = NULL;
    gang_comm_a2a a;
    int rc = GANG_ENOMEM;

    if (v == NULL)
        goto out;
    for (uint32_t p = 0; p < n; p++) {
        v[p] = a2a_size(k, me, p, n);
        v[n + p] = stot;
        stot += v[p] + 3;
        v[2 * n + p] = a2a_size(k, p, me, n);
        v[3 * n + p] = rtot;
        rtot += v[2 * n + p] + 3;
    }
    send = malloc(stot);
    recv = malloc(rtot);
    if (send == NULL || recv == NULL)
        goto out;
    memset(recv, 0xee, rtot);
    for (uint32_t p = 0; p < n; p++)
        for (size_t i = 0; i < v[p]; i++)
            send[v[n + p] + i] = a2a_byte(me, p, i);
    a = (gang_comm_a2a){.send = send,
                        .send_cap = stot,
                        .send_bytes = v,
                        .send_off = v + n,
                        .recv = recv,
                        .recv_cap = rtot,
                        .recv_bytes = v + 2 * n,
                        .recv_off = v + 3 * n};
    rc = gang_comm_all_to_all_v(c, &a, A2A_TIMEOUT_MS);
    if (rc != 0) {
        snprintf(why, cap, "pattern %d: all_to_all_v: %s", k, gang_strerror(rc));
        goto out;
    }
    for (uint32_t p = 0; p < n; p++) {
        const uint8_t *r = recv + v[3 * n + p];

        for (size_t i = 0; i < v[2 * n + p]; i++) {
            if (r[i] != a2a_byte(p, me, i)) {
                snprintf(why, cap, "pattern %d: byte %zu from rank %u is %u, want %u", k, i,
                         (unsigned)p, r[i], a2a_byte(p, me, i));
                rc = -1;
                goto out;
            }
        }
        if (r[v[2 * n + p]] != 0xee) { /* the gap after each region is untouched */
            snprintf(why, cap, "pattern %d: wrote past the region of rank %u", k, (unsigned)p);
            rc = -1;
            goto out;
        }
    }
out:
    if (rc == GANG_ENOMEM)
        snprintf(why, cap, "pattern %d: out of memory", k);
    free(v);
    free(send);
    free(recv);
    return rc;
}

/*
 * The exchange expert parallelism makes: first every rank's token counts per destination
 * (8-byte entries, an all-to-all of fixed sizes), then the tokens (rows of 24 bytes) with
 * the receive sizes taken from the counts received.
 */
static int a2a_counts_then_data(gang_comm *c, char *why, size_t cap)
{
    uint32_t n = gang_comm_size(c), me = gang_comm_rank(c);
    size_t *v = calloc(8 * (size_t)n, sizeof(size_t)), stot = 0, rtot = 0, row = 24;
    uint64_t *cnt_out = calloc(n, sizeof(uint64_t)), *cnt_in = calloc(n, sizeof(uint64_t));
    uint8_t *send = NULL, *recv = NULL;
    gang_comm_a2a a;
    int rc = GANG_ENOMEM;

    if (v == NULL || cnt_out == NULL || cnt_in == NULL)
        goto out;
    for (uint32_t p = 0; p < n; p++) {
        cnt_out[p] = (me * 3 + p * 5) % 7; /* tokens routed to rank p's experts */
        v[p] = v[2 * n + p] = 8;
        v[n + p] = v[3 * n + p] = 8 * (size_t)p;
    }
    a = (gang_comm_a2a){cnt_out, 8 * (size_t)n, v,         v + n,
                        cnt_in,  8 * (size_t)n, v + 2 * n, v + 3 * n};
    rc = gang_comm_all_to_all_v(c, &a, A2A_TIMEOUT_MS);
    if (rc != 0) {
        snprintf(why, cap, "counts: all_to_all_v: %s", gang_strerror(rc));
        goto out;
    }
    for (uint32_t p = 0; p < n; p++) {
        if (cnt_in[p] != (p * 3 + me * 5) % 7) {
            snprintf(why, cap, "counts: %llu from rank %u, want %u", (unsigned long long)cnt_in[p],
                     (unsigned)p, (unsigned)((p * 3 + me * 5) % 7));
            rc = -1;
            goto out;
        }
        v[4 * n + p] = cnt_out[p] * row;
        v[5 * n + p] = stot;
        stot += v[4 * n + p];
        v[6 * n + p] = cnt_in[p] * row;
        v[7 * n + p] = rtot;
        rtot += v[6 * n + p];
    }
    send = malloc(stot + 1);
    recv = malloc(rtot + 1);
    rc = GANG_ENOMEM;
    if (send == NULL || recv == NULL)
        goto out;
    for (uint32_t p = 0; p < n; p++)
        for (size_t i = 0; i < v[4 * n + p]; i++)
            send[v[5 * n + p] + i] = a2a_byte(me, p, i);
    a = (gang_comm_a2a){send, stot, v + 4 * n, v + 5 * n, recv, rtot, v + 6 * n, v + 7 * n};
    rc = gang_comm_all_to_all_v(c, &a, A2A_TIMEOUT_MS);
    if (rc != 0) {
        snprintf(why, cap, "tokens: all_to_all_v: %s", gang_strerror(rc));
        goto out;
    }
    for (uint32_t p = 0; p < n; p++)
        for (size_t i = 0; i < v[6 * n + p]; i++)
            if (recv[v[7 * n + p] + i] != a2a_byte(p, me, i)) {
                snprintf(why, cap, "tokens: byte %zu from rank %u differs", i, (unsigned)p);
                rc = -1;
                goto out;
            }
out:
    if (rc == GANG_ENOMEM)
        snprintf(why, cap, "counts then data: out of memory");
    free(v);
    free(cnt_out);
    free(cnt_in);
    free(send);
    free(recv);
    return rc;
}

/* The front refuses, on every rank alike (so no rank is left waiting): a region past its
 * buffer, overlapping receive regions, a self region whose sizes differ, NULL arrays. */
static int a2a_refusals(gang_comm *c, char *why, size_t cap)
{
    uint32_t n = gang_comm_size(c), me = gang_comm_rank(c);
    size_t *v = calloc(4 * (size_t)n, sizeof(size_t));
    uint8_t buf[64];
    gang_comm_a2a a;
    int rc = 0, want = GANG_EINVAL, got;

    if (v == NULL) {
        snprintf(why, cap, "refusals: out of memory");
        return GANG_ENOMEM;
    }
    a = (gang_comm_a2a){buf, sizeof(buf), v, v + n, buf, sizeof(buf), v + 2 * n, v + 3 * n};
    v[0] = 8;
    v[n] = 60; /* 60 + 8 > 64 */
    v[2 * n] = 8;
    if ((got = gang_comm_all_to_all_v(c, &a, A2A_TIMEOUT_MS)) != want) {
        snprintf(why, cap, "a send region past the buffer: %s", gang_strerror(got));
        rc = -1;
        goto out;
    }
    memset(v, 0, 4 * (size_t)n * sizeof(size_t));
    if (n >= 2) {
        v[2 * n] = v[2 * n + 1] = 16;
        v[3 * n] = 0;
        v[3 * n + 1] = 8; /* [0,16) and [8,24) overlap */
        if ((got = gang_comm_all_to_all_v(c, &a, A2A_TIMEOUT_MS)) != want) {
            snprintf(why, cap, "overlapping receive regions: %s", gang_strerror(got));
            rc = -1;
            goto out;
        }
        memset(v, 0, 4 * (size_t)n * sizeof(size_t));
    }
    v[me] = 4; /* sends itself 4 bytes but expects 0 */
    if ((got = gang_comm_all_to_all_v(c, &a, A2A_TIMEOUT_MS)) != want) {
        snprintf(why, cap, "a self region of two sizes: %s", gang_strerror(got));
        rc = -1;
        goto out;
    }
    a.recv_off = NULL;
    if ((got = gang_comm_all_to_all_v(c, &a, A2A_TIMEOUT_MS)) != want) {
        snprintf(why, cap, "NULL offsets: %s", gang_strerror(got));
        rc = -1;
    }
out:
    free(v);
    return rc;
}

int gang_test_a2a_check(gang_comm *c, int big, char *why, size_t cap)
{
    int rc = a2a_refusals(c, why, cap);

    for (int k = 0; rc == 0 && k < (big ? 4 : 3); k++)
        rc = a2a_pattern(c, k, why, cap);
    if (rc == 0)
        rc = a2a_counts_then_data(c, why, cap);
    return rc;
}
