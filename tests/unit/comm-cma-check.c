/*
 * unit-comm: the probe and the reads of the socket backend's single-copy all-to-all path
 * (parallel/comm-socket-cma.c), on a pair's control page shared with a forked child that
 * plays the peer: a true cookie is read and raises our flag; a wrong cookie, our own pid,
 * a pid in no process and a dead peer each leave the pair on the rings (or fail the read
 * as GANG_EPEER) instead of reading some other memory. The path itself carries the
 * conformance suite's all-to-all transfers of 16 KiB and more wherever the probe passes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm-socket.h"
#include "comm-cma-check.h"

#define PAGE SOCK_RING_HDR

/* A peer in a child: publishes its slot (it is the higher rank, 1) and its data, then
 * waits for the parent's word to exit. */
static pid_t spawn_peer(sock_net *peer_net, sock_peer *peer_view, int *go, char *data)
{
    pid_t pid = fork();

    if (pid == 0) {
        gang__sock_cma_publish(peer_net, peer_view, 1, 0);
        memcpy(data, "payload of the peer", 20);
        __atomic_store_n(&go[1], 1, __ATOMIC_RELEASE);
        /* Until the parent says so, or 20 s: a parent whose assertion failed never does. */
        for (int i = 0; i < 20000 && __atomic_load_n(&go[0], __ATOMIC_ACQUIRE) == 0; i++)
            usleep(1000);
        _exit(0);
    }
    for (int i = 0; pid > 0 && i < 20000 && __atomic_load_n(&go[1], __ATOMIC_ACQUIRE) == 0; i++)
        usleep(1000);
    return pid;
}

void gang_test_cma_probe(void **state)
{
    (void)state;
    uint8_t *page =
        mmap(NULL, PAGE + 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_ptr_not_equal(page, MAP_FAILED);
    int *go = (int *)(void *)(page + PAGE);
    static sock_net me_net, peer_net;
    static char data[64];
    sock_peer me = {.shm = page}, peer_view = {.shm = page};
    uint8_t got[20];

    assert_int_equal(gang__sock_cma_init(&me_net), 0);
    assert_int_equal(gang__sock_cma_init(&peer_net), 0);
    gang__sock_cma_publish(&me_net, &me, 0, 1); /* we are rank 0 (the lower) */
    assert_int_equal(gang__sock_cma_tx_ok(&me), 0);

    pid_t pid = spawn_peer(&peer_net, &peer_view, go, data);
    assert_true(pid > 0);
    gang__sock_cma_probe(&me, 0, 1);
    if (!me.cma_rx) {
        __atomic_store_n(&go[0], 1, __ATOMIC_RELEASE);
        waitpid(pid, NULL, 0);
        munmap(page, PAGE + 4096);
        skip(); /* the kernel refuses process_vm_readv here: the rings carry everything */
    }
    assert_int_equal(me.cma_pid, pid);
    /* Our flag (the lower rank's, at 640) is up: the peer may now send us descriptors; the
     * peer never probed us, so we still may not send it any. */
    assert_int_equal(__atomic_load_n((int *)(void *)(page + 640), __ATOMIC_ACQUIRE), 1);
    assert_int_equal(gang__sock_cma_tx_ok(&me), 0);
    memset(got, 0, sizeof(got));
    assert_int_equal(gang__sock_cma_read(&me, got, (uint64_t)(uintptr_t)data, 20), 0);
    assert_memory_equal(got, "payload of the peer", 20);

    /* A wrong cookie in the peer's slot: refused, nothing raised. */
    sock_peer again = {.shm = page};
    memset(page + 512 + 64 + 16, 0x5a, 16); /* the higher rank's cookie bytes */
    memset(page + 640, 0, 64);
    gang__sock_cma_probe(&again, 0, 1);
    assert_int_equal(again.cma_rx, 0);
    /* Our own pid in the slot: refused. */
    uint32_t self = (uint32_t)getpid();
    memcpy(page + 576, &self, sizeof(self));
    gang__sock_cma_probe(&again, 0, 1);
    assert_int_equal(again.cma_rx, 0);

    /* The peer exits: a read of its memory is GANG_EPEER, and a probe of it refused. */
    __atomic_store_n(&go[0], 1, __ATOMIC_RELEASE);
    waitpid(pid, NULL, 0);
    assert_int_equal(gang__sock_cma_read(&me, got, (uint64_t)(uintptr_t)data, 20), GANG_EPEER);
    memcpy(page + 576, &me.cma_pid, sizeof(self));
    gang__sock_cma_probe(&again, 0, 1);
    assert_int_equal(again.cma_rx, 0);
    munmap(page, PAGE + 4096);
}
