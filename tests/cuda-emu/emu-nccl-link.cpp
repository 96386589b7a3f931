/*
 * The NCCL emulator's ranks in other processes (tests/cuda-emu/, issue #24): the gang's
 * workers are processes, each with its own emulated GPU(s), and their TP / PP groups,
 * the MoE all-to-alls and the P/D KV transfers run over NCCL between them.
 *
 * As NCCL's bootstrap root lives in the process that called ncclGetUniqueId, the group
 * of a unique id lives there (emu-nccl.cpp's state): the id names that process (its pid
 * and a random name: the Pods of tests/k8s-sim/ have PID namespaces of their own) and its
 * TCP address (the first IPv4 address of an interface that is up and not loopback, as
 * NCCL picks one, else 127.0.0.1; a port of its own, listened on from the process's first
 * ncclGetUniqueId on), so that ranks of other hosts (the Pods of tests/k8s-sim/, network
 * namespaces) reach it too. A rank of another process connects to it (one connection per
 * pair of processes) and is a proxy communicator there, served by a thread of that
 * process (the broker):
 *   - init, split and the asynchronous state are requests answered at once (a blocking
 *     init or split polls the state until it is not ncclInProgress, at most
 *     GANG_EMU_WAIT_MS); a state not answered within 200 ms is the last one answered (a
 *     stopped broker must not hold its peers past their deadlines: NCCL's call is local);
 *     abort and destroy are told, not answered;
 *   - an operation is asynchronous on its stream, as on a device: the caller gets a
 *     pending operation of the stream, and the communicator's shipper thread sends the
 *     operation with its input once every operation of the communicator's earlier groups
 *     (ncclGroupStart / End, or single calls) completed (an input may be an earlier
 *     operation's output); the broker posts it for the proxy with a pending operation
 *     whose completion sends the result (the output's bytes) back, written into the
 *     caller's buffer by the connection's reader thread, which then completes the stream's
 *     pending operation.
 * A process that exits closes its connections: the broker aborts its proxies (the peers'
 * pending operations fail, ncclRemoteError, and so do operations needing it later), and
 * the ranks of a broker that exited see their pending operations fail and ncclRemoteError
 * as their state. An operation on a capturing stream is queued at each replay of the
 * graph (its group order taken then); a group on a capturing stream is not emulated (the
 * process stops naming the call).
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "emu-nccl.h"

namespace emu_nccl
{
namespace
{

enum msg_type : uint32_t { M_INIT = 1, M_SPLIT, M_STATE, M_OP, M_END, M_REPLY, M_RESULT };

/* Every message: this header, then len bytes. Both ends are this library, in processes
 * of one machine. */
struct msg {
    uint32_t type = 0, len = 0;
    uint64_t handle = 0; /* the broker's name of a communicator */
    uint64_t seq = 0;    /* a request's (M_REPLY answers it) or an operation's (M_RESULT) */
    int64_t a[6] = {0, 0, 0, 0, 0, 0};
};

const uint32_t max_payload = 1u << 30;

bool write_all(int fd, const void *p, size_t n)
{
    const char *c = (const char *)p;

    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        c += w;
        n -= (size_t)w;
    }
    return true;
}

bool read_all(int fd, void *p, size_t n)
{
    char *c = (char *)p;

    while (n > 0) {
        ssize_t r = recv(fd, c, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        c += r;
        n -= (size_t)r;
    }
    return true;
}

/* The next message of fd, false at its end (or a malformed one). */
bool read_msg(int fd, msg &h, std::vector<unsigned char> &body)
{
    if (!read_all(fd, &h, sizeof(h)) || h.len > max_payload)
        return false;
    body.resize(h.len);
    return h.len == 0 || read_all(fd, body.data(), h.len);
}

/* One connection's end; several threads write on it, one reads. Closed with the last
 * reference (a completion still to send keeps it). */
struct wire {
    int fd = -1;
    std::mutex wlock;

    ~wire()
    {
        if (fd >= 0)
            close(fd);
    }

    bool put(msg h, const void *body, size_t len)
    {
        std::lock_guard<std::mutex> g(wlock);

        h.len = (uint32_t)len;
        return write_all(fd, &h, sizeof(h)) && (len == 0 || write_all(fd, body, len));
    }
};

/* This host's address for the ids: the first IPv4 address of an interface that is up and
 * not loopback, else 127.0.0.1. */
std::string host_address()
{
    struct ifaddrs *ifs = nullptr;
    std::string ip = "127.0.0.1";
    char buf[INET_ADDRSTRLEN];

    if (getifaddrs(&ifs) != 0)
        return ip;
    for (struct ifaddrs *i = ifs; i != nullptr; i = i->ifa_next)
        if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET &&
            (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK) &&
            inet_ntop(AF_INET, &((const sockaddr_in *)i->ifa_addr)->sin_addr, buf, sizeof(buf))) {
            ip = buf;
            break;
        }
    freeifaddrs(ifs);
    return ip;
}

void no_delay(int fd)
{
    int one = 1;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* The random name of this process's broker (0 until it made an id). */
std::atomic<unsigned long long> my_nonce{0};

/* The pid, the broker's random name and the "IP:PORT" of the process that made key (a pid
 * alone does not tell processes of several PID namespaces apart). 0 when malformed. */
int key_parts(const std::string &key, unsigned long long *nonce, std::string *addr)
{
    int pid = 0;
    unsigned long long n = 0;
    char a[64] = "";

    if (sscanf(key.c_str(), "nccl-emu %d %llx %*u %63s", &pid, &n, a) != 3)
        return 0;
    if (nonce != nullptr)
        *nonce = n;
    if (addr != nullptr)
        *addr = a;
    return pid;
}

/* The bytes an operation sends with it, and those its result carries back. */
void op_bytes(int kind, size_t count, size_t es, int rank, int nranks, int root, size_t *in,
              size_t *out)
{
    size_t b = count * es;

    *in = kind == OP_RECV || (kind == OP_BROADCAST && rank != root) ? 0 : b;
    *out = kind == OP_SEND ? 0 : kind == OP_ALLGATHER ? b * (size_t)nranks : b;
}

/* --- the broker: serves the groups of this process's ids to ranks of other processes -- */

/* One connected process, and its ranks here (proxies) by handle. */
struct client {
    std::shared_ptr<wire> w = std::make_shared<wire>();
    std::map<uint64_t, ncclComm *> comms; /* its serving thread's alone */
    uint64_t next = 1;

    uint64_t add(ncclComm *c)
    {
        if (c == nullptr)
            return 0;
        comms[next] = c;
        return next++;
    }

    ncclComm *find(uint64_t h)
    {
        auto it = comms.find(h);
        return it == comms.end() ? nullptr : it->second;
    }
};

void reply(client &cl, const msg &req, int64_t a0, uint64_t handle = 0, int64_t a1 = 0,
           int64_t a2 = 0)
{
    msg r;

    r.type = M_REPLY;
    r.seq = req.seq;
    r.handle = handle;
    r.a[0] = a0;
    r.a[1] = a1;
    r.a[2] = a2;
    cl.w->put(r, nullptr, 0);
}

/* M_OP: posts the proxy's part with the bytes that came; its completion sends the
 * result. */
void serve_op(client &cl, const msg &h, std::vector<unsigned char> &body)
{
    static unsigned char none;
    ncclComm *c = cl.find(h.handle);
    int kind = (int)h.a[0], root = (int)h.a[3];
    size_t count = (size_t)h.a[1], out_bytes = (size_t)h.a[4];
    ncclDataType_t t = (ncclDataType_t)h.a[2];
    auto in = std::make_shared<std::vector<unsigned char>>(std::move(body));
    auto out = std::make_shared<std::vector<unsigned char>>(out_bytes);
    auto pend = std::make_shared<gang_emu_pending>();
    std::shared_ptr<wire> w = cl.w;
    uint64_t seq = h.seq;

    pend->on_finish = [w, seq, in, out, kind](int failed) {
        msg r;
        int data = !failed && kind != OP_SEND;

        r.type = M_RESULT;
        r.seq = seq;
        r.a[0] = failed;
        w->put(r, data ? out->data() : nullptr, data ? out->size() : 0);
    };
    if (c == nullptr || c->aborted || !c->formed) {
        gang_emu_pending_finish(*pend, 1);
        return;
    }
    size_t want_in, want_out;
    op_bytes(kind, count, type_size(t), c->rank, c->nranks, root, &want_in, &want_out);
    if (type_size(t) == 0 || in->size() != want_in || out_bytes != want_out)
        die("an operation of a rank of another process whose bytes do not match its count");
    post_op(c, kind, in->empty() ? &none : in->data(), out->empty() ? &none : out->data(), count, t,
            root, pend);
}

/* Serves one connected process until it closes; then its ranks here abort (it exited, or
 * its library was torn down). */
void serve(std::shared_ptr<client> cl)
{
    msg h;
    std::vector<unsigned char> body;

    while (read_msg(cl->w->fd, h, body)) {
        ncclComm *c = cl->find(h.handle), *nc = nullptr;
        ncclResult_t st;
        int rank, nranks;

        switch (h.type) {
        case M_INIT: { /* body: the key, a 0 byte, the host; a: nranks, rank, device */
            std::string key((const char *)body.data(),
                            strnlen((const char *)body.data(), body.size()));
            std::string host = key.size() + 1 < body.size()
                                   ? std::string((const char *)body.data() + key.size() + 1,
                                                 body.size() - key.size() - 1)
                                   : std::string();
            ncclResult_t rc = ncclInvalidArgument;

            if (h.a[0] >= 1 && h.a[1] >= 0 && h.a[1] < h.a[0])
                rc = init_rank(&nc, (int)h.a[0], key, (int)h.a[1], 0, (int)h.a[2], host);
            reply(*cl, h, rc, cl->add(nc));
            break;
        }
        case M_SPLIT: { /* a: color, key */
            ncclConfig_t conf = NCCL_CONFIG_INITIALIZER;
            ncclResult_t rc = ncclInvalidArgument;

            conf.blocking = 0;
            if (c != nullptr)
                rc = ncclCommSplit(c, (int)h.a[0], (int)h.a[1], &nc, &conf);
            reply(*cl, h, rc, cl->add(nc));
            break;
        }
        case M_STATE:
            if (c == nullptr) {
                reply(*cl, h, ncclInvalidArgument, 0, -1, -1);
                break;
            }
            state(c, &st, &rank, &nranks);
            reply(*cl, h, st, 0, rank, nranks);
            break;
        case M_OP:
            serve_op(*cl, h, body);
            break;
        case M_END: /* a: abort; not answered */
            cl->comms.erase(h.handle);
            if (c != nullptr && h.a[0])
                ncclCommAbort(c);
            else if (c != nullptr)
                ncclCommDestroy(c);
            break;
        default:
            die("a malformed message from a rank of another process");
        }
    }
    for (auto &kv : cl->comms)
        ncclCommAbort(kv.second);
    cl->comms.clear();
}

[[noreturn]] void listen_loop(int lfd)
{
    for (;;) {
        int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            perror("nccl-emu: accept");
            die("the broker cannot accept the ranks of other processes");
        }
        auto cl = std::make_shared<client>();
        no_delay(fd);
        cl->w->fd = fd;
        std::thread(serve, cl).detach();
    }
}

/* --- a rank whose group another process made ----------------------------------------- */

struct outstanding {
    void *recv;
    size_t bytes;
    std::shared_ptr<gang_emu_pending> pend;
    const void *owner; /* its remote_comm */
};

/* This process's connection to one broker. */
struct link {
    std::shared_ptr<wire> w = std::make_shared<wire>();
    int owner = 0; /* the pid that connected (a forked child connects again) */
    std::mutex mu; /* everything below, and every remote_comm's queue */
    std::condition_variable cv;
    bool dead = false;
    uint64_t next_seq = 1;
    std::map<uint64_t, msg> replies;
    std::set<uint64_t> abandoned; /* requests whose answer came too late */
    std::map<uint64_t, outstanding> ops;
};

/* Reads the broker's answers and results until the connection ends; then every operation
 * still out fails and every request is answered "gone". */
void reader(std::shared_ptr<link> L)
{
    msg h;
    std::vector<unsigned char> body;

    while (read_msg(L->w->fd, h, body)) {
        std::unique_lock<std::mutex> g(L->mu);
        if (h.type == M_REPLY) {
            if (L->abandoned.erase(h.seq) == 0)
                L->replies[h.seq] = h;
            L->cv.notify_all();
            continue;
        }
        auto it = L->ops.find(h.seq);
        if (h.type != M_RESULT || it == L->ops.end())
            continue;
        outstanding o = it->second;
        L->ops.erase(it);
        g.unlock();
        int failed = h.a[0] != 0 || body.size() != o.bytes;
        if (!failed && o.bytes > 0)
            memcpy(o.recv, body.data(), o.bytes);
        gang_emu_pending_finish(*o.pend, failed);
        g.lock();
        L->cv.notify_all(); /* shippers wait for completions */
    }
    std::map<uint64_t, outstanding> left;
    {
        std::lock_guard<std::mutex> g(L->mu);
        L->dead = true;
        left.swap(L->ops);
        L->cv.notify_all();
    }
    for (auto &kv : left)
        gang_emu_pending_finish(*kv.second.pend, 1);
}

std::mutex links_lock;
std::map<std::string, std::shared_ptr<link>> links; /* by the broker's address */

/* The connection to the broker at addr ("IP:PORT"; made once), or null when it cannot be
 * reached. */
std::shared_ptr<link> link_to(const std::string &addr)
{
    std::lock_guard<std::mutex> g(links_lock);
    std::shared_ptr<link> &L = links[addr];
    sockaddr_in a;
    size_t colon = addr.rfind(':');

    if (L && L->owner == getpid())
        return L;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    if (colon == std::string::npos ||
        inet_pton(AF_INET, addr.substr(0, colon).c_str(), &a.sin_addr) != 1) {
        fprintf(stderr, "nccl-emu: the unique id's address '%s' is malformed\n", addr.c_str());
        L.reset();
        return nullptr;
    }
    a.sin_port = htons((uint16_t)atoi(addr.c_str() + colon + 1));
    L = std::make_shared<link>();
    L->owner = getpid();
    L->w->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (L->w->fd < 0 || connect(L->w->fd, (const sockaddr *)&a, sizeof(a)) != 0) {
        fprintf(stderr, "nccl-emu: cannot reach %s, where the unique id was made: %s\n",
                addr.c_str(), strerror(errno));
        L.reset();
        return nullptr;
    }
    no_delay(L->w->fd);
    std::thread(reader, L).detach();
    return L;
}

enum answered { ANSWERED, GONE, LATE };

/* Sends request h and waits for its answer at most timeout_ms (a late answer is dropped
 * when it comes): GONE when the broker is. A broker that stops (a process stopped, or
 * busy) must not hold up its peers' calls past their own deadlines: NCCL's calls that
 * these stand for are local. */
answered request(link &L, msg h, const void *body, size_t len, msg &answer, long long timeout_ms)
{
    std::unique_lock<std::mutex> g(L.mu);

    if (L.dead)
        return GONE;
    h.seq = L.next_seq++;
    g.unlock();
    if (!L.w->put(h, body, len))
        return GONE;
    g.lock();
    L.cv.wait_for(g, std::chrono::milliseconds(timeout_ms),
                  [&]() { return L.dead || L.replies.count(h.seq) > 0; });
    auto it = L.replies.find(h.seq);
    if (it == L.replies.end()) {
        if (L.dead)
            return GONE;
        L.abandoned.insert(h.seq);
        return LATE;
    }
    answer = it->second;
    L.replies.erase(it);
    return ANSWERED;
}

/* How long a state request waits (then the last answer stands), and an init or split. */
const long long state_wait_ms = 200, setup_wait_ms = 10000;

/* An operation posted on a remote communicator, not yet sent. */
struct job {
    const void *send;
    size_t in_bytes, out_bytes;
    void *recv;
    msg h;
    std::shared_ptr<gang_emu_pending> pend;
    unsigned long long batch;
};

std::atomic<unsigned long long> batches{0};
thread_local int group_depth = 0;
thread_local unsigned long long group_batch = 0;

} // namespace

/* A remote communicator's side here. */
struct remote_comm {
    std::shared_ptr<link> L;
    uint64_t handle = 0;
    std::atomic<int> err{ncclSuccess};  /* its state as last answered, once failed */
    ncclResult_t last = ncclInProgress; /* the last state answered */
    std::deque<job> queue;              /* under L->mu, as the rest */
    std::deque<std::pair<unsigned long long, std::shared_ptr<gang_emu_pending>>> sent;
    bool stop = false;
    std::thread shipper;
};

namespace
{

/* 1 when an operation sent before, of a group earlier than batch, has not completed. */
bool earlier_open(remote_comm &rc, unsigned long long batch)
{
    while (!rc.sent.empty() && rc.sent.front().second->done.load())
        rc.sent.pop_front();
    for (auto &s : rc.sent)
        if (s.first < batch && !s.second->done.load())
            return true;
    return false;
}

/* The shipper: sends rc's operations in order, each once the earlier groups' completed,
 * reading its input then; at stop, fails what is left. */
void ship(remote_comm *rc)
{
    link &L = *rc->L;
    std::unique_lock<std::mutex> g(L.mu);

    for (;;) {
        L.cv.wait(g, [&]() { return rc->stop || !rc->queue.empty(); });
        if (rc->queue.empty())
            return;
        if (!L.cv.wait_for(g, std::chrono::milliseconds(gang_emu_wait_ms()), [&]() {
                return rc->stop || L.dead || !earlier_open(*rc, rc->queue.front().batch);
            }))
            die("an operation of a remote communicator waited past GANG_EMU_WAIT_MS for the "
                "operations before it");
        job j = std::move(rc->queue.front());
        rc->queue.pop_front();
        if (rc->stop || L.dead) {
            g.unlock();
            gang_emu_pending_finish(*j.pend, 1);
            g.lock();
            continue;
        }
        j.h.seq = L.next_seq++;
        L.ops[j.h.seq] = outstanding{j.recv, j.out_bytes, j.pend, rc};
        rc->sent.emplace_back(j.batch, j.pend);
        g.unlock();
        L.w->put(j.h, j.send, j.in_bytes); /* a failure ends the reader, which fails it */
        g.lock();
    }
}

remote_comm *remote_new(std::shared_ptr<link> L, uint64_t handle)
{
    remote_comm *rc = new remote_comm();

    rc->L = std::move(L);
    rc->handle = handle;
    rc->shipper = std::thread(ship, rc);
    return rc;
}

/* Polls c's state until it is not ncclInProgress (a blocking init or split). */
ncclResult_t remote_wait(ncclComm *c)
{
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(gang_emu_wait_ms());
    ncclResult_t st = ncclInProgress;
    int rank, nranks;

    while (remote_state(c, &st, &rank, &nranks) == ncclSuccess && st == ncclInProgress &&
           std::chrono::steady_clock::now() < end)
        usleep(1000);
    return st == ncclInProgress ? ncclSystemError : st;
}

} // namespace

std::string broker_key()
{
    static std::mutex m;
    static int listening = 0;
    static std::atomic<unsigned long long> counter{0};
    std::lock_guard<std::mutex> g(m);
    int pid = getpid();
    char key[128];

    static std::string addr;

    if (listening != pid) { /* first id of this process (a forked child listens anew) */
        sockaddr_in a;
        socklen_t len = sizeof(a);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

        memset(&a, 0, sizeof(a));
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        if (fd < 0 || bind(fd, (const sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 128) != 0 ||
            getsockname(fd, (sockaddr *)&a, &len) != 0) {
            fprintf(stderr, "nccl-emu: cannot listen for the ranks of other processes: %s\n",
                    strerror(errno));
            if (fd >= 0)
                close(fd);
            return "";
        }
        std::thread(listen_loop, fd).detach();
        listening = pid;
        my_nonce = ((unsigned long long)std::random_device{}() << 32) ^ std::random_device{}() ^
                   (unsigned long long)pid;
        addr = host_address() + ":" + std::to_string(ntohs(a.sin_port));
    }
    snprintf(key, sizeof(key), "nccl-emu %d %llx %llu %s", pid, my_nonce.load(),
             counter.fetch_add(1), addr.c_str());
    return key;
}

int key_is_remote(const std::string &key)
{
    unsigned long long nonce = 0;
    int pid = key_parts(key, &nonce, nullptr);

    return pid > 0 && (pid != getpid() || nonce != my_nonce);
}

ncclResult_t remote_init(ncclComm **comm, int nranks, const std::string &key, int rank,
                         int blocking)
{
    std::string addr, body = key + std::string(1, '\0') + host_name();
    std::shared_ptr<link> L = key_parts(key, nullptr, &addr) > 0 ? link_to(addr) : nullptr;
    msg h, r;

    if (!L)
        return ncclSystemError;
    h.type = M_INIT;
    h.a[0] = nranks;
    h.a[1] = rank;
    h.a[2] = gang_emu_current_device();
    if (request(*L, h, body.data(), body.size(), r, setup_wait_ms) != ANSWERED)
        return ncclRemoteError;
    if (r.handle == 0)
        return (ncclResult_t)r.a[0];
    ncclComm *c = new ncclComm();
    c->rank = rank;
    c->nranks = nranks;
    c->device = (int)h.a[2];
    c->host = host_name();
    c->blocking = blocking;
    c->remote = remote_new(L, r.handle);
    *comm = c;
    ncclResult_t rc = (ncclResult_t)r.a[0];
    if (rc == ncclInProgress && blocking)
        rc = remote_wait(c);
    return rc;
}

ncclResult_t remote_state(ncclComm *c, ncclResult_t *st, int *rank, int *nranks)
{
    remote_comm &rc = *c->remote;
    msg h, r;

    h.type = M_STATE;
    h.handle = rc.handle;
    answered a = request(*rc.L, h, nullptr, 0, r, state_wait_ms);
    if (a != ANSWERED) {
        if (a == GONE)
            rc.err = ncclRemoteError;
        *st = rc.err != ncclSuccess ? (ncclResult_t)rc.err.load() : rc.last;
        *rank = c->formed ? c->rank : -1;
        *nranks = c->formed ? c->nranks : -1;
        return ncclSuccess;
    }
    *st = (ncclResult_t)r.a[0];
    *rank = (int)r.a[1];
    *nranks = (int)r.a[2];
    if (*rank >= 0) {
        c->rank = *rank;
        c->nranks = *nranks;
        c->formed = 1;
    }
    rc.last = *st;
    if (*st != ncclSuccess && *st != ncclInProgress)
        rc.err = *st;
    return ncclSuccess;
}

ncclResult_t remote_op(ncclComm *c, int kind, const void *send, void *recv, size_t count,
                       ncclDataType_t t, int root, cudaStream_t stream)
{
    remote_comm &rc = *c->remote;
    ncclResult_t st;
    int rank, nranks;
    job j;

    if (c->aborted)
        return ncclInvalidArgument;
    if (!c->formed) /* learn its rank and size (a split's child) */
        remote_state(c, &st, &rank, &nranks);
    if (!c->formed)
        return ncclInvalidArgument;
    if (rc.err != ncclSuccess)
        return (ncclResult_t)rc.err.load();
    if ((st = check_op(c, kind, t, root)) != ncclSuccess)
        return st;
    const bool captured = gang_emu_stream_capturing(stream) != 0;
    if (captured && group_depth > 0)
        die("a group of a communicator of another process's unique id on a capturing stream "
            "(not emulated)");
    op_bytes(kind, count, type_size(t), c->rank, c->nranks, root, &j.in_bytes, &j.out_bytes);
    j.send = send;
    j.recv = recv;
    j.h.type = M_OP;
    j.h.handle = rc.handle;
    j.h.a[0] = kind;
    j.h.a[1] = (int64_t)count;
    j.h.a[2] = t;
    j.h.a[3] = root;
    j.h.a[4] = (int64_t)j.out_bytes;
    j.batch = captured ? 0 : group_depth > 0 ? group_batch : ++batches; /* 0: at each post */
    /* queued for the shipper once its inputs are there: now, or from the stream's thread
     * (rc is never freed: a post deferred past the communicator's end fails) */
    remote_comm *rcp = &rc;
    gang_emu_stream_post(stream, [rcp, j](std::shared_ptr<gang_emu_pending> p) {
        std::unique_lock<std::mutex> g(rcp->L->mu);
        if (rcp->stop) {
            g.unlock();
            gang_emu_pending_finish(*p, 1);
            return;
        }
        job q = j; /* a captured operation's post runs at every replay */
        q.pend = std::move(p);
        if (q.batch == 0)
            q.batch = ++batches;
        rcp->queue.push_back(std::move(q));
        rcp->L->cv.notify_all();
    });
    return ncclSuccess;
}

ncclResult_t remote_split(ncclComm *c, int color, int key, ncclComm **child, int blocking)
{
    remote_comm &rc = *c->remote;
    msg h, r;

    *child = nullptr;
    h.type = M_SPLIT;
    h.handle = rc.handle;
    h.a[0] = color;
    h.a[1] = key;
    if (request(*rc.L, h, nullptr, 0, r, setup_wait_ms) != ANSWERED)
        return ncclRemoteError;
    if (r.handle != 0) {
        ncclComm *nc = new ncclComm();

        nc->blocking = blocking;
        nc->device = c->device;
        nc->host = c->host;
        nc->remote = remote_new(rc.L, r.handle);
        *child = nc;
    }
    ncclResult_t res = (ncclResult_t)r.a[0];
    if (res == ncclInProgress && c->blocking)
        res = remote_wait(c);
    return res;
}

ncclResult_t remote_end(ncclComm *c, int abort)
{
    remote_comm *rc = c->remote;
    std::vector<std::shared_ptr<gang_emu_pending>> failed;
    msg h;

    if (c->aborted)
        return ncclSuccess;
    {
        std::lock_guard<std::mutex> g(rc->L->mu);
        rc->stop = true;
        rc->L->cv.notify_all();
    }
    rc->shipper.join();
    if (abort) { /* what it sent fails here at once, as NCCL's abort ends its kernels */
        std::lock_guard<std::mutex> g(rc->L->mu);
        for (auto it = rc->L->ops.begin(); it != rc->L->ops.end();)
            if (it->second.owner == rc) {
                failed.push_back(it->second.pend);
                it = rc->L->ops.erase(it);
            } else
                ++it;
    }
    for (auto &p : failed)
        gang_emu_pending_finish(*p, 1);
    h.type = M_END;
    h.handle = rc->handle;
    h.a[0] = abort;
    rc->L->w->put(h, nullptr, 0); /* not answered: a broker gone has nothing left to end */
    /* Neither c nor rc is freed: an operation deferred behind its stream's work may still
     * name them, and then fails (rc->stop). */
    c->aborted = 1;
    return ncclSuccess;
}

void group_start()
{
    if (group_depth++ == 0)
        group_batch = ++batches;
}

void group_end()
{
    if (group_depth > 0)
        group_depth--;
}

} // namespace emu_nccl
