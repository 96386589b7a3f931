/*
 * socket backend, single-copy path of the all-to-all between shared-memory peers.
 *
 * Through a ring a message is copied twice (sender's buffer -> ring -> receiver's buffer).
 * When the kernel lets a rank read its peer's memory (process_vm_readv: same user, and
 * ptrace access granted by Yama, the seccomp profile and dumpability), an all-to-all
 * transfer of at least SOCK_CMA_MIN bytes puts only a descriptor {address, bytes} of the
 * sender's buffer on the ring, in a frame whose kind carries SOCK_KIND_CMA; the receiver
 * reads the bytes straight into its buffer (or its unexpected-message queue) and answers
 * with a SOCK_KIND_ACK frame, which completes the send: until then the sender's buffer
 * must stay as it is, so only operations whose ranks all wait in the same call use it
 * (the all-to-all; point-to-point sends stay eager, the pipeline relies on that).
 *
 * Whether a pair may use it is probed once at start-up, per direction: each side writes
 * {pid, address, 16 random bytes at that address} into its slot of the pair's control
 * page, the other reads those bytes with process_vm_readv and compares them, then raises
 * its "I can read you" flag. The comparison also rules out a peer in another PID
 * namespace (its pid names another process here, or none). A sender uses the path only
 * once the receiver's flag is up; anything else (no permission, no flag yet, a TCP peer,
 * a small message) takes the ring as before, so the probe failing costs nothing but the
 * second copy. Control page offsets: descriptors at 512 (lower rank) and 576 (higher),
 * flags at 640 (set by the lower rank: it reads the higher) and 704.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* process_vm_readv */
#endif
#include <errno.h>
#include <string.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>

#include "comm-socket.h"

#define SOCK_CMA_DESC_LO 512
#define SOCK_CMA_DESC_HI 576
#define SOCK_CMA_FLAG_LO 640
#define SOCK_CMA_FLAG_HI 704
#define SOCK_CMA_COOKIE 16

/* One side's slot in the control page. */
typedef struct sock_cma_slot {
    uint32_t pid;
    uint32_t pad;
    uint64_t addr;
    uint8_t cookie[SOCK_CMA_COOKIE];
} sock_cma_slot;

_Static_assert(sizeof(sock_cma_slot) <= 64, "a CMA slot must fit its cache line");
_Static_assert(SOCK_CMA_FLAG_HI + 64 <= SOCK_RING_HDR, "the CMA words must fit the page");

/* Fills net's cookie with random bytes (once per net, before the first pair is set up). */
int gang__sock_cma_init(sock_net *net)
{
    size_t got = 0;

    while (got < sizeof(net->cma_cookie)) {
        ssize_t n = getrandom(net->cma_cookie + got, sizeof(net->cma_cookie) - got, 0);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return gang_err_from_errno(errno);
        got += (size_t)n;
    }
    return 0;
}

static uint8_t *sock_cma_word(sock_peer *p, int lo_side, size_t lo_off, size_t hi_off)
{
    return (uint8_t *)p->shm + (lo_side ? lo_off : hi_off);
}

/*
 * Writes our slot of the pair's control page (self < peer: the lower rank's slot). The
 * peer reads it only after a set-up message we write after this (a system call on the
 * pair's socket orders the two), so no fence is needed.
 */
void gang__sock_cma_publish(sock_net *net, sock_peer *p, uint32_t self, uint32_t peer)
{
    sock_cma_slot s = {.pid = (uint32_t)getpid(), .addr = (uint64_t)(uintptr_t)net->cma_cookie};

    memcpy(s.cookie, net->cma_cookie, SOCK_CMA_COOKIE);
    memcpy(sock_cma_word(p, self < peer, SOCK_CMA_DESC_LO, SOCK_CMA_DESC_HI), &s, sizeof(s));
    p->cma_peer_flag =
        (atomic_int *)(void *)sock_cma_word(p, peer < self, SOCK_CMA_FLAG_LO, SOCK_CMA_FLAG_HI);
}

/*
 * Tries to read the peer's cookie from its memory as its slot describes; on a match notes
 * its pid for later reads (p->cma_rx) and raises our flag, which tells the peer it may
 * send us descriptors. The peer's slot must be written (the set-up's message order sees
 * to it). A refusal of any kind only leaves the pair on the rings.
 */
void gang__sock_cma_probe(sock_peer *p, uint32_t self, uint32_t peer)
{
    sock_cma_slot s;
    uint8_t got[SOCK_CMA_COOKIE];
    struct iovec local = {.iov_base = got, .iov_len = sizeof(got)}, remote;

    memcpy(&s, sock_cma_word(p, peer < self, SOCK_CMA_DESC_LO, SOCK_CMA_DESC_HI), sizeof(s));
    if (s.pid == 0 || s.pid > INT32_MAX || s.pid == (uint32_t)getpid())
        return;
    remote.iov_base = (void *)(uintptr_t)s.addr;
    remote.iov_len = sizeof(got);
    if (process_vm_readv((pid_t)s.pid, &local, 1, &remote, 1, 0) != (ssize_t)sizeof(got) ||
        memcmp(got, s.cookie, sizeof(got)) != 0)
        return;
    p->cma_pid = (int)s.pid;
    p->cma_rx = 1;
    atomic_store_explicit(
        (atomic_int *)(void *)sock_cma_word(p, self < peer, SOCK_CMA_FLAG_LO, SOCK_CMA_FLAG_HI), 1,
        memory_order_release);
}

/* Whether the peer reads our memory (its flag is up): then a send may be a descriptor. */
int gang__sock_cma_tx_ok(const sock_peer *p)
{
    return p->shm != NULL && p->cma_peer_flag != NULL &&
           atomic_load_explicit(p->cma_peer_flag, memory_order_acquire);
}

/*
 * Reads len bytes at the peer's address addr into dst. Returns 0, GANG_EPEER when the
 * peer is gone, or GANG_EPROTO when the kernel refuses or the range is not the peer's
 * (a descriptor this pair's probe does not vouch for).
 */
int gang__sock_cma_read(const sock_peer *p, void *dst, uint64_t addr, size_t len)
{
    size_t got = 0;

    while (got < len) {
        struct iovec local = {.iov_base = (uint8_t *)dst + got, .iov_len = len - got};
        struct iovec remote = {.iov_base = (void *)(uintptr_t)(addr + got), .iov_len = len - got};
        ssize_t n = process_vm_readv((pid_t)p->cma_pid, &local, 1, &remote, 1, 0);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == ESRCH)
            return GANG_EPEER;
        if (n <= 0)
            return GANG_EPROTO;
        got += (size_t)n;
    }
    return 0;
}
