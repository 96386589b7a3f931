/*
 * socket backend, bootstrap: the TCP connections (connect, accept, hello, address
 * lists), and the life of a communicator (init, split, free). Rank 0's listener, its blob
 * and which pairs connect: comm-socket-blob.c.
 * Shared state and the data-plane rules: comm-socket.h.
 *
 *
 * Bootstrap (gang_comm_init with GANG_COMM_SOCKET):
 *
 *   rank 0                         rank r > 0
 *   listener from                  opens its own listener on advertise_host:0
 *   gang_comm_socket_listen()      connects to rank 0 (address from the blob)
 *                            <---  hello {magic, version, session, rank, world, its port+host}
 *   checks session, version,
 *   world, rank range, duplicate;
 *   refuses with a status and
 *   keeps serving the others
 *   once all world-1 are in:  --->  status 0 + the addresses of r's lower peers
 *                                   (gang__sock_peers_of: every rank 1..r-1, or in a
 *                                   sparse world only those r pairs with)
 *                                   connects to each and sends its hello, not waiting
 *                                   accepts its higher peers, checks their hellos
 *                                   then reads the verdicts of its lower peers
 *
 * The connection a rank opened to rank 0 becomes the pair's data connection, so rank 0 is
 * done once it has sent the lists. No rank waits for another before its accept phase (a
 * connect completes in the kernel backlog before accept, and hellos are sent without
 * waiting for the verdict), so the connections can neither deadlock nor form a chain of
 * ranks that wait for each other in turn.
 *
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm-socket.h"

/* ---------------------------------------------------------------------------------
 * Blocking socket helpers of the bootstrap.
 * --------------------------------------------------------------------------------- */
static int sock_prepare_fd(int fd)
{
    int one = 1;
    int fl = fcntl(fd, F_GETFL);

    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return gang_err_from_errno(errno);
    /* Collectives exchange many small frames; Nagle would add a delay to each. */
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0)
        return gang_err_from_errno(errno);
    return 0;
}

/*
 * Waits until fd reports events, the deadline passes (GANG_ETIMEDOUT) or abort_fd becomes
 * readable (GANG_EABORTED). A hang-up counts as ready: the following I/O reports it.
 */
static int sock_wait(int fd, short events, int abort_fd, uint64_t deadline)
{
    struct pollfd p[2];
    int rc;

    for (;;) {
        p[0].fd = fd;
        p[0].events = events;
        p[0].revents = 0;
        p[1].fd = abort_fd;
        p[1].events = POLLIN;
        p[1].revents = 0;
        if (gang_now_ms() >= deadline)
            return GANG_ETIMEDOUT;
        rc = poll(p, abort_fd >= 0 ? 2 : 1, sock_poll_ms(deadline));
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0)
            return gang_err_from_errno(errno);
        if (p[1].revents)
            return GANG_EABORTED;
        if (p[0].revents)
            return 0;
    }
}

/* Reads exactly len bytes before the deadline; EOF or reset is GANG_EPEER. */
int gang__sock_read_full(int fd, void *buf, size_t len, int abort_fd, uint64_t deadline)
{
    uint8_t *p = buf;
    size_t got = 0;
    int rc;

    while (got < len) {
        ssize_t n = recv(fd, p + got, len - got, MSG_DONTWAIT);

        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if (n == 0)
            return GANG_EPEER;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return GANG_EPEER;
        rc = sock_wait(fd, POLLIN, abort_fd, deadline);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Writes exactly len bytes before the deadline; a closed peer is GANG_EPEER. */
int gang__sock_write_full(int fd, const void *buf, size_t len, int abort_fd, uint64_t deadline)
{
    const uint8_t *p = buf;
    size_t done = 0;
    int rc;

    while (done < len) {
        ssize_t n = send(fd, p + done, len - done, MSG_DONTWAIT | MSG_NOSIGNAL);

        if (n >= 0) {
            done += (size_t)n;
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return GANG_EPEER;
        rc = sock_wait(fd, POLLOUT, abort_fd, deadline);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Opens a listening socket on host, port chosen by the kernel. */
int gang__sock_listen_on(const char *host, int *fd_out, uint16_t *port_out)
{
    struct addrinfo hints, *res = NULL, *ai;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int fd = -1, rc, one = 1;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(host, "0", &hints, &res) != 0)
        return GANG_ERESOLVE;
    rc = GANG_EIO;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            continue;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0)
            break;
        rc = gang_err_from_errno(errno);
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return rc;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        rc = gang_err_from_errno(errno);
        close(fd);
        return rc;
    }
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return 0;
}

/*
 * Connects to host:port before the deadline. A refused connection is retried every 20 ms:
 * the listener of a peer is always open before its address is published, so a refusal
 * only means a slow kernel, never a peer that is not there yet.
 */
static int sock_connect(const char *host, uint16_t port, int abort_fd, uint64_t deadline,
                        int *fd_out)
{
    struct addrinfo hints, *res = NULL;
    char port_s[8];
    int fd, rc, err;
    socklen_t el;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(port_s, sizeof(port_s), "%u", (unsigned)port);
    if (getaddrinfo(host, port_s, &hints, &res) != 0)
        return GANG_ERESOLVE;
    for (;;) {
        fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            rc = gang_err_from_errno(errno);
            goto out_res;
        }
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
            err = 0;
        } else if (errno == EINPROGRESS) {
            rc = sock_wait(fd, POLLOUT, abort_fd, deadline);
            if (rc < 0)
                goto out_fd;
            el = sizeof(err);
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
                err = errno;
        } else {
            err = errno;
        }
        if (err == 0)
            break;
        close(fd);
        if (err != ECONNREFUSED) {
            rc = GANG_EPEER;
            goto out_res;
        }
        if (gang_now_ms() + 20 >= deadline) {
            rc = GANG_ETIMEDOUT;
            goto out_res;
        }
        rc = sock_wait(abort_fd, POLLIN, -1, gang_now_ms() + 20);
        if (rc == 0) {
            rc = GANG_EABORTED;
            goto out_res;
        }
    }
    rc = sock_prepare_fd(fd);
    if (rc < 0)
        goto out_fd;
    freeaddrinfo(res);
    *fd_out = fd;
    return 0;

out_fd:
    close(fd);
out_res:
    freeaddrinfo(res);
    return rc;
}

/* Accepts one connection before the deadline. */
static int sock_accept(int lfd, int abort_fd, uint64_t deadline, int *fd_out)
{
    int fd, rc;

    for (;;) {
        fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0)
            break;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
            return gang_err_from_errno(errno);
        rc = sock_wait(lfd, POLLIN, abort_fd, deadline);
        if (rc < 0)
            return rc;
    }
    rc = sock_prepare_fd(fd);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

/* ---------------------------------------------------------------------------------
 * Bootstrap.
 * --------------------------------------------------------------------------------- */
typedef struct sock_addr {
    char host[SOCK_HOST_MAX + 1];
    uint16_t port;
} sock_addr;

/* Encodes a hello into out (SOCK_HELLO_LEN + strlen(host) bytes); returns its length. */
static size_t sock_hello_encode(uint8_t *out, const uint8_t *session, uint32_t rank, uint32_t world,
                                uint16_t port, const char *host)
{
    size_t hl = host != NULL ? strlen(host) : 0;

    put_u32(out, SOCK_MAGIC);
    put_u32(out + 4, SOCK_VERSION);
    memcpy(out + 8, session, SOCK_SESSION_LEN);
    put_u32(out + 24, rank);
    put_u32(out + 28, world);
    put_u32(out + 32, port);
    put_u32(out + 36, (uint32_t)hl);
    if (hl > 0)
        memcpy(out + SOCK_HELLO_LEN, host, hl);
    return SOCK_HELLO_LEN + hl;
}

/*
 * Reads a peer's hello within the handshake limit and judges it. Returns 0 with *status
 * (SOCK_OK or a refusal) and the peer's rank and address; a negative code when the
 * connection itself failed (the caller drops it either way when refused).
 */
static int sock_hello_read(int fd, int abort_fd, uint64_t deadline, const uint8_t *session,
                           uint32_t world, uint32_t *rank, sock_addr *addr, int *status)
{
    uint8_t h[SOCK_HELLO_LEN];
    uint32_t hl;
    int rc;

    deadline = min_u64(deadline, gang_now_ms() + SOCK_HANDSHAKE_MS);
    rc = gang__sock_read_full(fd, h, sizeof(h), abort_fd, deadline);
    if (rc < 0)
        return rc;
    if (get_u32(h) != SOCK_MAGIC)
        return GANG_EPROTO;
    hl = get_u32(h + 36);
    if (hl > SOCK_HOST_MAX)
        return GANG_EPROTO;
    rc = gang__sock_read_full(fd, addr->host, hl, abort_fd, deadline);
    if (rc < 0)
        return rc;
    addr->host[hl] = '\0';
    addr->port = (uint16_t)get_u32(h + 32);
    *rank = get_u32(h + 24);
    if (get_u32(h + 4) != SOCK_VERSION)
        *status = SOCK_REFUSE_VERSION;
    else if (memcmp(h + 8, session, SOCK_SESSION_LEN) != 0)
        *status = SOCK_REFUSE_SESSION;
    else if (get_u32(h + 28) != world)
        *status = SOCK_REFUSE_WORLD;
    else
        *status = SOCK_OK;
    return 0;
}

static int sock_status_to_err(uint32_t status)
{
    switch (status) {
    case SOCK_OK:
        return 0;
    case SOCK_REFUSE_SESSION: /* a blob of another gang or generation */
    case SOCK_REFUSE_VERSION:
    case SOCK_REFUSE_RANK:
        return GANG_EINVAL;
    case SOCK_REFUSE_WORLD:
        return GANG_EMISMATCH;
    case SOCK_REFUSE_DUPLICATE:
        return GANG_EDUPLICATE;
    }
    return GANG_EPROTO;
}

static const char *sock_refusal_name(int status)
{
    switch (status) {
    case SOCK_REFUSE_VERSION:
        return "protocol version";
    case SOCK_REFUSE_SESSION:
        return "session id";
    case SOCK_REFUSE_WORLD:
        return "world size";
    case SOCK_REFUSE_RANK:
        return "rank out of range";
    case SOCK_REFUSE_DUPLICATE:
        return "duplicate rank";
    }
    return "unknown";
}

/*
 * Accepts connections on lfd until the missing ranks above lo that self pairs with are
 * connected, refusing (and logging) bad hellos without giving up. Fills net->peers[].fd
 * and, when addrs is not NULL (rank 0: every rank joins it), the peers' listener
 * addresses.
 */
static int sock_accept_ranks(sock_net *net, int lfd, uint32_t self, uint32_t lo, uint32_t missing,
                             const uint8_t *session, uint64_t deadline, sock_addr *addrs)
{
    int rc;

    while (missing > 0) {
        sock_addr a;
        uint8_t st[4];
        uint32_t peer = 0;
        int status = SOCK_OK, fd = -1;

        rc = sock_accept(lfd, net->abort_fd, deadline, &fd);
        if (rc < 0)
            return rc;
        rc = sock_hello_read(fd, net->abort_fd, deadline, session, net->n, &peer, &a, &status);
        if (rc == GANG_EABORTED) {
            close(fd);
            return rc;
        }
        if (rc < 0) {
            gang_warn("comm socket: rank %u dropped a connection during its hello: %s",
                      (unsigned)self, gang_strerror(rc));
            close(fd);
            continue;
        }
        if (status == SOCK_OK && (peer >= net->n || peer < lo || peer == self ||
                                  (addrs == NULL && gang__sock_pair(net, peer, self) == 0)))
            status = SOCK_REFUSE_RANK;
        if (status == SOCK_OK && net->peers[peer].fd >= 0)
            status = SOCK_REFUSE_DUPLICATE;
        put_u32(st, (uint32_t)status);
        if (status != SOCK_OK) {
            gang_warn("comm socket: rank %u refused a peer claiming rank %u: wrong %s",
                      (unsigned)self, (unsigned)peer, sock_refusal_name(status));
            /* Best effort: the refused peer learns why; we keep serving the others. */
            (void)gang__sock_write_full(fd, st, sizeof(st), net->abort_fd,
                                        min_u64(deadline, gang_now_ms() + 100));
            close(fd);
            continue;
        }
        net->peers[peer].fd = fd;
        if (addrs != NULL)
            addrs[peer] = a;
        missing--;
        /* Mesh connections are acknowledged at once; rank 0 answers with the table later. */
        if (addrs == NULL) {
            rc = gang__sock_write_full(fd, st, sizeof(st), net->abort_fd, deadline);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/*
 * Rank 0: gathers every rank's hello on the listener (the star), then sends each rank
 * r the addresses of the peers below it that it must connect to: status 0, a count, then
 * {rank, port, host length, host} each. A sparse world sends O(tp) entries per rank.
 */
static int sock_boot_root(sock_net *net, gang_comm_listener *l, uint64_t deadline)
{
    sock_addr *addrs;
    uint8_t *table = NULL, *p;
    uint32_t r, i, k, *lower;
    int rc;

    addrs = calloc(net->n, sizeof(*addrs));
    lower = calloc((size_t)net->n + 8, sizeof(*lower)); /* sock_peers_of's candidates */
    if (addrs == NULL || lower == NULL) {
        rc = GANG_ENOMEM;
        goto out_free;
    }
    memcpy(net->session, l->session, SOCK_SESSION_LEN);
    memcpy(net->tag, l->tag, sizeof(net->tag));
    net->sparse = l->sparse;
    net->tp = l->tp;
    memcpy(addrs[0].host, l->host, strlen(l->host) + 1);
    addrs[0].port = l->port;
    rc = sock_accept_ranks(net, l->fd, 0, 1, net->n - 1, l->session, deadline, addrs);
    if (rc < 0)
        goto out_free;
    for (r = 1; r < net->n; r++) {
        k = gang__sock_peers_of(net, r, 1, lower);
        free(table);
        table = malloc(8 + (size_t)k * (12 + SOCK_HOST_MAX));
        if (table == NULL) {
            rc = GANG_ENOMEM;
            goto out_free;
        }
        put_u32(table, SOCK_OK);
        put_u32(table + 4, k);
        p = table + 8;
        for (i = 0; i < k; i++) {
            size_t hl = strlen(addrs[lower[i]].host);

            put_u32(p, lower[i]);
            put_u32(p + 4, addrs[lower[i]].port);
            put_u32(p + 8, (uint32_t)hl);
            memcpy(p + 12, addrs[lower[i]].host, hl);
            p += 12 + hl;
        }
        rc = gang__sock_write_full(net->peers[r].fd, table, (size_t)(p - table), net->abort_fd,
                                   deadline);
        if (rc < 0)
            goto out_free;
    }
    rc = 0;

out_free:
    free(addrs);
    free(lower);
    free(table);
    return rc;
}

/* Sends a hello on fd. */
static int sock_send_hello(sock_net *net, int fd, const uint8_t *session, uint32_t rank,
                           uint16_t port, const char *host, uint64_t deadline)
{
    uint8_t h[SOCK_HELLO_LEN + SOCK_HOST_MAX];
    size_t len = sock_hello_encode(h, session, rank, net->n, port, host);

    return gang__sock_write_full(fd, h, len, net->abort_fd, deadline);
}

/* Reads the 4-byte verdict on a hello. */
static int sock_read_verdict(sock_net *net, int fd, uint64_t deadline)
{
    uint8_t st[4];
    int rc = gang__sock_read_full(fd, st, sizeof(st), net->abort_fd, deadline);

    return rc < 0 ? rc : sock_status_to_err(get_u32(st));
}

/*
 * Rank r > 0: joins through rank 0 and reads the addresses of its lower peers; then
 * connects to each of them and sends its hello without waiting, accepts its higher
 * peers, and only then reads the verdicts of the lower ones. Nobody waits on anyone
 * before its accept phase, so there is neither a deadlock nor a chain of ranks that
 * wait for each other in turn.
 */
static int sock_boot_rank(sock_net *net, uint32_t rank, const gang_comm_config *cfg,
                          uint64_t deadline)
{
    char host0[SOCK_HOST_MAX + 1], host[SOCK_HOST_MAX + 1];
    uint8_t session[SOCK_SESSION_LEN], b[12];
    uint32_t *lower = NULL, k, i, higher;
    uint16_t port0, port;
    int lfd = -1, rc, fd0 = -1;

    rc = gang__sock_parse_blob(cfg->blob, cfg->blob_len, host0, &port0, session, net);
    if (rc < 0)
        return rc;
    memcpy(net->session, session, SOCK_SESSION_LEN);
    if (cfg->advertise_host == NULL || cfg->advertise_host[0] == '\0' ||
        strlen(cfg->advertise_host) > SOCK_HOST_MAX)
        return GANG_EINVAL;
    lower = calloc(2 * (size_t)net->n + 8, sizeof(*lower)); /* lower peers, then higher */
    if (lower == NULL)
        return GANG_ENOMEM;
    rc = gang__sock_listen_on(cfg->advertise_host, &lfd, &port);
    if (rc < 0)
        goto out;
    rc = sock_connect(host0, port0, net->abort_fd, deadline, &fd0);
    if (rc < 0)
        goto out;
    net->peers[0].fd = fd0;
    rc = sock_send_hello(net, fd0, session, rank, port, cfg->advertise_host, deadline);
    if (rc == 0)
        rc = sock_read_verdict(net, fd0, deadline);
    if (rc == 0)
        rc = gang__sock_read_full(fd0, b, 4, net->abort_fd, deadline);
    if (rc < 0)
        goto out;
    k = get_u32(b);
    if (k >= net->n) {
        rc = GANG_EPROTO;
        goto out;
    }
    for (i = 0; i < k; i++) {
        uint32_t hl, p;

        rc = gang__sock_read_full(fd0, b, sizeof(b), net->abort_fd, deadline);
        if (rc < 0)
            goto out;
        p = get_u32(b);
        hl = get_u32(b + 8);
        if (hl > SOCK_HOST_MAX || p == 0 || p >= rank || net->peers[p].fd >= 0 ||
            gang__sock_pair(net, p, rank) == SOCK_PAIR_NONE) {
            rc = GANG_EPROTO;
            goto out;
        }
        rc = gang__sock_read_full(fd0, host, hl, net->abort_fd, deadline);
        if (rc < 0)
            goto out;
        host[hl] = '\0';
        rc = sock_connect(host, (uint16_t)get_u32(b + 4), net->abort_fd, deadline,
                          &net->peers[p].fd);
        if (rc == 0)
            rc = sock_send_hello(net, net->peers[p].fd, session, rank, 0, NULL, deadline);
        if (rc < 0)
            goto out;
        lower[i] = p;
    }
    higher = gang__sock_peers_of(net, rank, 0, lower + k);
    rc = sock_accept_ranks(net, lfd, rank, rank + 1, higher, session, deadline, NULL);
    for (i = 0; rc == 0 && i < k; i++)
        rc = sock_read_verdict(net, net->peers[lower[i]].fd, deadline);

out:
    if (lfd >= 0)
        close(lfd);
    free(lower);
    return rc;
}

/* ---------------------------------------------------------------------------------
 * Communicator life: the shared net, init, free and split.
 * --------------------------------------------------------------------------------- */
static void sock_net_unref(sock_net *net)
{
    uint32_t r;

    if (net == NULL || atomic_fetch_sub(&net->refs, 1) != 1)
        return;
    for (r = 0; net->peers != NULL && r < net->n; r++) {
        sock_peer *p = &net->peers[r];

        while (p->uq_head != NULL) {
            sock_msg *m = p->uq_head;

            p->uq_head = m->next;
            free(m);
        }
        free(p->rx_msg);
        if (p->shm != NULL)
            munmap(p->shm, p->shm_len);
        if (p->fd >= 0)
            close(p->fd);
    }
    if (net->abort_fd >= 0)
        close(net->abort_fd);
    free(net->peers);
    free(net->conn);
    free(net->pfds);
    free(net->pmap);
    free(net);
}

static void sock_comm_destroy(sock_comm *sc)
{
    if (sc == NULL)
        return;
    sock_net_unref(sc->net);
    free(sc->world_of);
    free(sc->send_seq);
    free(sc->recv_seq);
    free(sc->scratch);
    free(sc->ops);
    free(sc);
}

/* Allocates a communicator's state for n ranks over net (taking a reference). */
static sock_comm *sock_comm_new(sock_net *net, uint32_t n, uint64_t comm_id)
{
    sock_comm *sc = calloc(1, sizeof(*sc));

    if (sc == NULL)
        return NULL;
    sc->world_of = calloc(n, sizeof(*sc->world_of));
    sc->send_seq = calloc(n, sizeof(*sc->send_seq));
    sc->recv_seq = calloc(n, sizeof(*sc->recv_seq));
    if (sc->world_of == NULL || sc->send_seq == NULL || sc->recv_seq == NULL) {
        free(sc->world_of);
        free(sc->send_seq);
        free(sc->recv_seq);
        free(sc);
        return NULL;
    }
    atomic_fetch_add(&net->refs, 1);
    sc->net = net;
    sc->comm_id = comm_id;
    return sc;
}

/* Lists the connected peers in net->conn (ascending), for loops that skip the others. */
static int sock_list_conn(sock_net *net)
{
    uint32_t r;

    net->conn = calloc(net->n, sizeof(*net->conn));
    if (net->conn == NULL)
        return GANG_ENOMEM;
    for (r = 0; r < net->n; r++) {
        if (net->peers[r].fd >= 0)
            net->conn[net->nconn++] = r;
    }
    return 0;
}

/*
 * Connects the pairs of the world (see the protocol comment at the top of this file):
 * every pair, or in a sparse world only those that talk. Rank 0's listener is consumed
 * on every outcome.
 */
int gang__sock_init(gang_comm *c, const gang_comm_config *cfg)
{
    uint64_t deadline = gang_deadline_after(cfg->timeout_ms);
    sock_net *net;
    sock_comm *sc;
    uint32_t r;
    int rc;

    if (cfg->rank == 0 && cfg->listener == NULL && cfg->world_size > 1) {
        rc = GANG_EINVAL;
        goto out_listener;
    }
    net = calloc(1, sizeof(*net));
    if (net == NULL) {
        rc = GANG_ENOMEM;
        goto out_listener;
    }
    atomic_init(&net->refs, 1);
    atomic_init(&net->aborted, 0);
    atomic_init(&net->error, 0);
    net->n = cfg->world_size;
    net->abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    net->peers = calloc(net->n, sizeof(*net->peers));
    net->pfds = calloc((size_t)net->n + 1, sizeof(*net->pfds));
    net->pmap = calloc((size_t)net->n + 1, sizeof(*net->pmap));
    if (net->peers != NULL) {
        for (r = 0; r < net->n; r++)
            net->peers[r].fd = -1;
    }
    if (net->abort_fd < 0 || net->peers == NULL || net->pfds == NULL || net->pmap == NULL) {
        rc = net->abort_fd < 0 ? gang_err_from_errno(errno) : GANG_ENOMEM;
        goto out_net;
    }
    /* While booting, every wait watches the caller's cancel fd instead of the
     * communicator's own abort eventfd (nobody can abort a communicator that does not
     * exist yet); the own one is put back before anything can close it. */
    int own_abort_fd = net->abort_fd;
    if (cfg->cancel_fd != NULL)
        net->abort_fd = *cfg->cancel_fd;
    if (cfg->rank == 0)
        rc = net->n > 1 ? sock_boot_root(net, cfg->listener, deadline) : 0;
    else
        rc = sock_boot_rank(net, cfg->rank, cfg, deadline);
    if (rc == 0)
        rc = sock_list_conn(net);
    if (rc == 0 && net->n > 1)
        rc = gang__sock_shm_setup(net, cfg->rank, deadline);
    net->abort_fd = own_abort_fd;
    if (rc < 0)
        goto out_net;
    sc = sock_comm_new(net, net->n, 0);
    if (sc == NULL) {
        rc = GANG_ENOMEM;
        goto out_net;
    }
    for (r = 0; r < net->n; r++)
        sc->world_of[r] = r;
    sock_net_unref(net); /* sc holds the reference now */
    c->impl = sc;
    gang_comm_listener_free(cfg->listener);
    return 0;

out_net:
    sock_net_unref(net);
out_listener:
    gang_comm_listener_free(cfg->listener);
    return rc;
}

void gang__sock_free(gang_comm *c)
{
    sock_comm_destroy(c->impl);
    c->impl = NULL;
}

/* splitmix64: spreads (parent id, split number, color) into a child id. */
static uint64_t sock_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/*
 * Split: an all-gather of (color, key) tells every rank the members of its color; they
 * are ordered by key then parent rank. The child re-uses the parent's connections with a
 * rank map and a comm_id derived from the parent's id, the split number and the color, so
 * its frames never match the parent's or a sibling's.
 */
int gang__sock_split(gang_comm *c, uint32_t color, uint32_t key, uint64_t timeout_ms,
                     gang_comm *child)
{
    sock_comm *sc = c->impl, *cc;
    uint32_t n = c->size, mine[2] = {color, key}, *all, *members, m = 0, i, j, me = 0;
    uint64_t id;
    int rc;

    all = malloc((size_t)n * 2 * sizeof(*all));
    members = malloc((size_t)n * sizeof(*members));
    if (all == NULL || members == NULL) {
        rc = GANG_ENOMEM;
        goto out;
    }
    rc = gang__sock_all_gather(c, mine, all, 2, GANG_DTYPE_I32, timeout_ms);
    if (rc < 0)
        goto out;
    id = sock_mix(sc->comm_id ^ sock_mix(((uint64_t)sc->split_seq << 32) | color));
    sc->split_seq++;
    for (i = 0; i < n; i++) {
        if (all[2 * i] != color)
            continue;
        /* Insertion by (key, parent rank); parent ranks arrive in increasing order. */
        for (j = m; j > 0 && all[2 * members[j - 1] + 1] > all[2 * i + 1]; j--)
            members[j] = members[j - 1];
        members[j] = i;
        m++;
    }
    cc = sock_comm_new(sc->net, m, id == 0 ? 1 : id);
    if (cc == NULL) {
        rc = GANG_ENOMEM;
        goto out;
    }
    for (j = 0; j < m; j++) {
        cc->world_of[j] = sc->world_of[members[j]];
        if (members[j] == c->rank)
            me = j;
    }
    child->rank = me;
    child->size = m;
    child->impl = cc;
    rc = 0;

out:
    free(all);
    free(members);
    return rc;
}
