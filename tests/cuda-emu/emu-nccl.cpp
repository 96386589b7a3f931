/*
 * The NCCL emulator (tests/cuda-emu/, issue #24): libnccl.so.2 for the CUDA emulator's
 * build, so that the nccl communicator backend (parallel/comm-nccl.c) and the engine over
 * nccl TP / PP groups run here, with ranks as threads of one process on emulated devices
 * (GANG_EMU_DEVICES), before they run between real GPUs. Built into cuda-emu-lib/ and found
 * by the backend's own search (its build directory).
 *
 * The API the backend calls (comm-nccl.c's nccl_entries), with NCCL's semantics as the
 * backend relies on them:
 *   - init: ncclGetUniqueId, ncclCommInitRankConfig. The communicator forms once every rank
 *     of the id has called; a non-blocking one (config.blocking 0) returns ncclInProgress
 *     and ncclCommGetAsyncError answers ncclInProgress until then; a blocking one waits
 *     (at most GANG_EMU_WAIT_MS). Two ranks on one device fail the init with
 *     ncclInvalidUsage, as NCCL refuses them ("Duplicate GPU detected").
 *   - ncclCommSplit: a collective of the parent; the children form when every rank of the
 *     parent has called (NCCL_SPLIT_NOCOLOR: no child), ranks ordered by key then parent
 *     rank. Of a non-blocking parent, it returns ncclInProgress with the child allocated,
 *     and both answer ncclInProgress until the split is done.
 *   - collectives (ncclAllReduce with ncclSum over f32 / f16 / bf16 / i32, ncclAllGather,
 *     ncclBroadcast) and ncclSend / ncclRecv: asynchronous on their stream, as on a device.
 *     Each is a pending operation of its stream (emu-sync.h), posted once its inputs are
 *     there (now, or from the stream's own thread, which runs ahead of the host behind a
 *     pending operation as a GPU's stream does); a collective completes when
 *     every rank of the communicator has posted its n-th collective (the one that posts
 *     last moves the data for all, reading every rank's buffers then, and summing in
 *     rank order), a send when the peer posts the matching receive (in the order of each
 *     pair's posts, as NCCL matches them; a rank's send to itself too). Two ranks whose
 *     n-th collectives differ (kind, count, type, root) fail the communicator with
 *     ncclInvalidUsage, where NCCL would hang or corrupt. Groups (ncclGroupStart / End)
 *     need nothing more here: every operation is already asynchronous (a group matters
 *     to ranks of other processes: emu-nccl-link.cpp).
 *   - ncclCommAbort: when operations of the communicator are pending, they complete
 *     (failed) and the peers' ncclCommGetAsyncError answers ncclRemoteError (NCCL 2.2x
 *     reports a peer that went away so over sockets; within a node the peers would wait
 *     for their deadline); a peer that posts an operation needing a rank that left
 *     (aborted or destroyed) fails the same way;
 *     ncclCommFinalize, ncclCommDestroy, ncclCommCount, ncclCommUserRank, ncclGetVersion,
 *     ncclGetErrorString, ncclGetLastError.
 * GANG_EMU_NCCL_DELAY_US (carry_out) defers every operation, so that a rank that does not
 * wait for one before reading its output (or reuses its input too soon) shows it.
 * GANG_EMU_NCCL_REFUSE_CAPTURED=D refuses the operations a thread on device D enqueues on a
 * capturing stream (ncclInvalidUsage at the call), so that one rank's step fails while it
 * is recorded, its capture itself intact.
 * On a capturing stream an operation is captured, as NCCL's are: a one-rank
 * communicator's copy is a node of the graph, a larger one's post (gang_emu_stream_post)
 * is made at each replay, where the checks of a posted operation (an aborted
 * communicator, a group that failed) fail it then.
 *
 * Ranks in other processes (emu-nccl-link.cpp): the unique id names the process that made
 * it, which serves the group's state to them over a Unix socket, as NCCL's bootstrap root
 * lives in the process that called ncclGetUniqueId; a rank of another process is a proxy
 * communicator there, its operations' data travel both ways, and the process exiting is a
 * peer gone (ncclRemoteError). Two ranks on one device of one host (GANG_EMU_HOST, else
 * GANGLION_HOSTNAME, else the host name) are refused whichever processes they are in.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "emu-nccl.h"

namespace emu_nccl
{

/* One rank's part of a collective, as it posted it. */
struct part {
    const void *send = nullptr;
    void *recv = nullptr;
    size_t count = 0;
    ncclDataType_t type = ncclFloat32;
    int root = 0, color = 0, key = 0;
    ncclComm *child = nullptr;
    std::shared_ptr<gang_emu_pending> pend;
};

struct slot {
    int kind = 0, arrived = 0;
    std::vector<part> parts;
};

struct p2p {
    void *buf;
    size_t bytes;
    std::shared_ptr<gang_emu_pending> pend;
};

/* What every rank of one communicator shares. */
struct emu_group {
    int nranks = 0, joined = 0;
    std::vector<ncclComm *> members;
    std::map<unsigned long long, slot> slots; /* collective n -> the parts posted so far */
    std::map<std::pair<int, int>, std::deque<p2p>> sends, recvs; /* (from, to) */
    ncclResult_t err = ncclSuccess; /* the group failed: every member's asynchronous error */
};

namespace
{

std::mutex lock;                                           /* every communicator's state */
std::condition_variable formed;                            /* an init or a split completed */
std::map<std::string, std::shared_ptr<emu_group>> forming; /* unique id -> group */

} // namespace

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

[[noreturn]] void die(const char *what)
{
    fprintf(stderr, "nccl-emu: %s\n", what);
    abort();
}

std::string host_name()
{
    const char *e = getenv("GANG_EMU_HOST"), *pod = getenv("GANGLION_HOSTNAME");
    char h[256] = "";

    if (e != NULL && e[0] != '\0')
        return e;
    if (pod != NULL && pod[0] != '\0') /* a Pod's name (tests/k8s-sim/), as ganglion's own */
        return pod;
    gethostname(h, sizeof(h) - 1);
    return h;
}

namespace
{

/* A half-precision element (f16, or bf16 when bf16) as f32, and back rounded to nearest
 * even: the toolkit's host conversions, as emu-cublas.cpp's. */
float half_to_f32(const void *p, int bf16)
{
    return bf16 ? __bfloat162float(*(const __nv_bfloat16 *)p) : __half2float(*(const __half *)p);
}

void f32_to_half(float f, int bf16, void *p)
{
    if (bf16)
        *(__nv_bfloat16 *)p = __float2bfloat16_rn(f);
    else
        *(__half *)p = __float2half_rn(f);
}

/* The sum over the ranks' send buffers, in rank order, into out (count elements of t). */
ncclResult_t reduce_sum(const std::vector<part> &ps, size_t count, ncclDataType_t t,
                        std::vector<unsigned char> &out)
{
    size_t es = type_size(t);

    out.assign(count * es, 0);
    for (size_t i = 0; i < count; i++) {
        if (t == ncclFloat32) {
            float acc = 0.0f, v;
            for (const part &p : ps) {
                memcpy(&v, (const char *)p.send + i * 4, 4);
                acc += v;
            }
            memcpy(&out[i * 4], &acc, 4);
        } else if (t == ncclFloat16 || t == ncclBfloat16) {
            float acc = 0.0f;
            for (const part &p : ps)
                acc += half_to_f32((const char *)p.send + i * 2, t == ncclBfloat16);
            f32_to_half(acc, t == ncclBfloat16, &out[i * 2]);
        } else if (t == ncclInt32) {
            int32_t acc = 0, v;
            for (const part &p : ps) {
                memcpy(&v, (const char *)p.send + i * 4, 4);
                acc += v;
            }
            memcpy(&out[i * 4], &acc, 4);
        } else
            return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* Fails g (with err) and completes everything pending on it; under lock. */
void group_fail(emu_group &g, ncclResult_t err)
{
    if (g.err == ncclSuccess)
        g.err = err;
    for (auto &kv : g.slots)
        for (part &p : kv.second.parts)
            if (p.pend)
                gang_emu_pending_finish(*p.pend, 1);
    g.slots.clear();
    for (auto *q : {&g.sends, &g.recvs}) {
        for (auto &kv : *q)
            for (p2p &m : kv.second)
                gang_emu_pending_finish(*m.pend, 1);
        q->clear();
    }
}

/* A split's children from the parts (every rank of the parent's); under lock. */
void run_split(emu_group &g, slot &s)
{
    std::map<int, std::vector<int>> colors;

    for (int r = 0; r < g.nranks; r++)
        if (s.parts[r].color != NCCL_SPLIT_NOCOLOR)
            colors[s.parts[r].color].push_back(r);
    for (auto &kv : colors) {
        std::vector<int> &rs = kv.second;
        auto ng = std::make_shared<emu_group>();

        std::stable_sort(rs.begin(), rs.end(),
                         [&](int a, int b) { return s.parts[a].key < s.parts[b].key; });
        ng->nranks = ng->joined = (int)rs.size();
        for (size_t i = 0; i < rs.size(); i++) {
            ncclComm *c = s.parts[rs[i]].child;

            c->g = ng;
            c->rank = (int)i;
            c->nranks = (int)rs.size();
            c->device = g.members[rs[i]] != nullptr ? g.members[rs[i]]->device : 0;
            c->host = g.members[rs[i]] != nullptr ? g.members[rs[i]]->host : "";
            c->formed = 1;
            ng->members.push_back(c);
        }
    }
    for (int r = 0; r < g.nranks; r++)
        if (g.members[r] != nullptr)
            g.members[r]->splitting--;
    formed.notify_all();
}

/*
 * GANG_EMU_NCCL_DELAY_US > 0: an operation whose ranks have all posted it is carried out
 * that much later, by one executor thread, in the order the operations became ready,
 * instead of at once by the last rank to post: a rank that reads an operation's output
 * without waiting for it (its stream's event), or writes its input before it completed,
 * then reads or sends the wrong data, whichever rank posted last.
 */
long long delay_us()
{
    static long long d = -1;

    if (d < 0) {
        const char *e = getenv("GANG_EMU_NCCL_DELAY_US");
        d = e != NULL && atoll(e) > 0 ? atoll(e) : 0;
    }
    return d;
}

/* The executor's queue: operations due, in order (under lock). Never destroyed: the
 * executor still waits on it when the process exits, and a condition variable destroyed
 * with a waiter blocks the exit. */
struct due_queue {
    std::deque<std::function<void()>> ops;
    std::condition_variable cv;
};

due_queue &due()
{
    static due_queue *q = new due_queue();

    return *q;
}

[[noreturn]] void executor()
{
    std::unique_lock<std::mutex> g(lock);
    due_queue &q = due();

    for (;;) {
        q.cv.wait(g, [&]() { return !q.ops.empty(); });
        std::function<void()> f = std::move(q.ops.front());
        q.ops.pop_front();
        g.unlock();
        usleep((useconds_t)delay_us());
        g.lock();
        f();
    }
}

/* Carries f (an operation all of whose ranks have posted) out now, or after the delay;
 * under lock. */
void carry_out(std::function<void()> f)
{
    static bool started = false;

    if (delay_us() == 0) {
        f();
        return;
    }
    if (!started) {
        std::thread(executor).detach();
        started = true;
    }
    due().ops.push_back(std::move(f));
    due().cv.notify_one();
}

/* Runs collective n of g once every rank posted it; under lock. */
void run_slot(emu_group &g, unsigned long long n)
{
    if (g.slots.count(n) == 0) /* the group failed meanwhile */
        return;
    slot &s = g.slots[n];
    ncclResult_t rc = ncclSuccess;
    std::vector<unsigned char> tmp;

    for (int r = 1; r < g.nranks && rc == ncclSuccess; r++) {
        const part &a = s.parts[0], &b = s.parts[r];
        if (a.count != b.count || a.type != b.type || a.root != b.root)
            rc = ncclInvalidUsage;
    }
    if (rc != ncclSuccess) {
        fprintf(stderr,
                "nccl-emu: collective %llu differs between the ranks (count, type or "
                "root): the communicator fails\n",
                n);
        group_fail(g, rc);
        return;
    }
    size_t es = type_size(s.parts[0].type), bytes = s.parts[0].count * es;
    switch (s.kind) {
    case OP_SPLIT:
        run_split(g, s);
        break;
    case OP_ALLREDUCE:
        rc = reduce_sum(s.parts, s.parts[0].count, s.parts[0].type, tmp);
        for (int r = 0; r < g.nranks && rc == ncclSuccess; r++)
            memcpy(s.parts[r].recv, tmp.data(), bytes);
        break;
    case OP_ALLGATHER:
        tmp.resize(bytes * g.nranks);
        for (int r = 0; r < g.nranks; r++)
            memcpy(&tmp[r * bytes], s.parts[r].send, bytes);
        for (int r = 0; r < g.nranks; r++)
            memcpy(s.parts[r].recv, tmp.data(), tmp.size());
        break;
    case OP_BROADCAST:
        tmp.assign((const unsigned char *)s.parts[s.parts[0].root].send,
                   (const unsigned char *)s.parts[s.parts[0].root].send + bytes);
        for (int r = 0; r < g.nranks; r++)
            memcpy(s.parts[r].recv, tmp.data(), bytes);
        break;
    }
    if (rc != ncclSuccess) {
        group_fail(g, rc);
        return;
    }
    for (part &p : s.parts)
        if (p.pend)
            gang_emu_pending_finish(*p.pend, 0);
    g.slots.erase(n);
}

/* Posts this rank's part of its next collective; under lock. */
ncclResult_t post(ncclComm *c, int kind, part p)
{
    emu_group &g = *c->g;
    unsigned long long n = c->next_coll++;
    slot &s = g.slots[n];

    if (s.parts.empty())
        s.parts.resize(g.nranks);
    if (s.kind == 0)
        s.kind = kind;
    if (s.kind != kind) {
        fprintf(stderr,
                "nccl-emu: rank %d posts a different collective as its number %llu than "
                "a peer did: the communicator fails\n",
                c->rank, n);
        if (p.pend)
            gang_emu_pending_finish(*p.pend, 1);
        group_fail(g, ncclInvalidUsage);
        return ncclSuccess; /* reported asynchronously, as NCCL does */
    }
    s.parts[c->rank] = std::move(p);
    for (ncclComm *m : g.members)
        if (m == nullptr) { /* a rank left: the collective can never complete */
            group_fail(g, ncclRemoteError);
            return ncclSuccess;
        }
    if (++s.arrived == g.nranks) {
        std::shared_ptr<emu_group> gp = c->g;

        carry_out([gp, n]() { run_slot(*gp, n); });
    }
    return ncclSuccess;
}

/* A state a call may not run in: destroyed or aborted communicators, a failed group. */
ncclResult_t usable(ncclComm *c)
{
    if (c == nullptr || c->aborted || !c->formed)
        return ncclInvalidArgument;
    return c->g->err;
}

/* The stream part of an operation of a one-rank communicator: a copy on the stream. */
ncclResult_t solo(const void *send, void *recv, size_t bytes, cudaStream_t stream)
{
    if (send == recv || bytes == 0)
        return ncclSuccess;
    gang_emu_stream_run(stream, [=]() { memmove(recv, send, bytes); });
    return ncclSuccess;
}

/* Matches the oldest send from a to b with the oldest receive; under lock. */
void match(emu_group &g, int a, int b)
{
    auto &sq = g.sends[{a, b}], &rq = g.recvs[{a, b}];

    while (!sq.empty() && !rq.empty()) {
        p2p s = sq.front(), r = rq.front();

        sq.pop_front();
        rq.pop_front();
        if (s.bytes != r.bytes) {
            fprintf(stderr,
                    "nccl-emu: rank %d sends %zu bytes to rank %d, which receives %zu: "
                    "the communicator fails\n",
                    a, s.bytes, b, r.bytes);
            gang_emu_pending_finish(*s.pend, 1);
            gang_emu_pending_finish(*r.pend, 1);
            group_fail(g, ncclInvalidUsage);
            return;
        }
        carry_out([s, r]() {
            memcpy(r.buf, s.buf, s.bytes);
            gang_emu_pending_finish(*s.pend, 0);
            gang_emu_pending_finish(*r.pend, 0);
        });
    }
}

/* Posts c's send to (is_send) or receive from peer; under lock. */
void post_point(ncclComm *c, int is_send, void *buf, size_t bytes, int peer,
                std::shared_ptr<gang_emu_pending> pend)
{
    p2p m{buf, bytes, pend};

    if (c->g->members[peer] == nullptr) { /* the peer left: it never matches */
        gang_emu_pending_finish(*pend, 1);
        group_fail(*c->g, ncclRemoteError);
        return;
    }
    if (is_send) {
        c->g->sends[{c->rank, peer}].push_back(m);
        match(*c->g, c->rank, peer);
    } else {
        c->g->recvs[{peer, c->rank}].push_back(m);
        match(*c->g, peer, c->rank);
    }
}

} // namespace

ncclResult_t check_op(const ncclComm *c, int kind, ncclDataType_t t, int root)
{
    if (type_size(t) == 0)
        return ncclInvalidArgument;
    if (kind == OP_BROADCAST && (root < 0 || root >= c->nranks))
        return ncclInvalidArgument;
    if ((kind == OP_SEND || kind == OP_RECV) && (root < 0 || root >= c->nranks))
        return ncclInvalidArgument; /* its own rank is a peer: NCCL moves a self pair too */
    return ncclSuccess;
}

namespace
{

/* GANG_EMU_NCCL_REFUSE_CAPTURED=D: an operation enqueued on a capturing stream by a thread
 * on device D is refused at the call (ncclInvalidUsage), the capture left as it was, as a
 * library refusing its arguments would (tests: one rank's recorded step fails, its
 * capture and its peers' do not). */
bool refused_in_capture(cudaStream_t stream)
{
    return gang_emu_stream_capturing(stream) &&
           gang_emu_env_names_device("GANG_EMU_NCCL_REFUSE_CAPTURED");
}

/* An operation of the public API on stream, for a communicator of this process or of a
 * group another process made. */
ncclResult_t operation(int kind, const void *send, void *recv, size_t count, ncclDataType_t t,
                       int root, ncclComm *c, cudaStream_t stream)
{
    ncclResult_t rc;

    if (refused_in_capture(stream))
        return ncclInvalidUsage;
    if (c != nullptr && c->remote != nullptr)
        return remote_op(c, kind, send, recv, count, t, root, stream);
    std::unique_lock<std::mutex> g(lock);
    if ((rc = usable(c)) != ncclSuccess || (rc = check_op(c, kind, t, root)) != ncclSuccess)
        return rc;
    if (c->nranks == 1 && kind != OP_SEND && kind != OP_RECV) {
        g.unlock();
        return solo(send, recv, count * type_size(t), stream);
    }
    g.unlock();
    /* posted once its inputs are there: now, or from the stream's thread (the comm is never
     * freed, so that a post deferred past its abort finds it ended) */
    gang_emu_stream_post(stream, [=](std::shared_ptr<gang_emu_pending> p) {
        post_op(c, kind, send, recv, count, t, root, std::move(p));
    });
    return ncclSuccess;
}

int config_blocking(const ncclConfig_t *config)
{
    return config == nullptr || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
}

/* Waits (blocking communicators) until c formed or failed; under lock. */
ncclResult_t wait_formed(std::unique_lock<std::mutex> &g, ncclComm *c)
{
    bool ok = formed.wait_for(g, std::chrono::milliseconds(gang_emu_wait_ms()),
                              [&]() { return c->formed || (c->g && c->g->err != ncclSuccess); });
    if (!ok)
        return ncclSystemError;
    return c->g ? c->g->err : ncclSuccess;
}

} // namespace

ncclResult_t post_op(ncclComm *c, int kind, const void *send, void *recv, size_t count,
                     ncclDataType_t t, int root, std::shared_ptr<gang_emu_pending> pend)
{
    std::lock_guard<std::mutex> g(lock);
    ncclResult_t rc = ncclInvalidArgument;

    if (c == nullptr || c->aborted || !c->formed ||
        (rc = check_op(c, kind, t, root)) != ncclSuccess) {
        gang_emu_pending_finish(*pend, 1);
        return rc;
    }
    if (c->g->err != ncclSuccess) { /* reported asynchronously, as NCCL does */
        gang_emu_pending_finish(*pend, 1);
        return ncclSuccess;
    }
    if (kind == OP_SEND || kind == OP_RECV) {
        post_point(c, kind == OP_SEND, kind == OP_SEND ? const_cast<void *>(send) : recv,
                   count * type_size(t), root, std::move(pend));
        return ncclSuccess;
    }
    part p;
    p.pend = std::move(pend);
    p.send = send;
    p.recv = recv;
    p.count = count;
    p.type = t;
    p.root = root;
    return post(c, kind, std::move(p));
}

ncclResult_t init_rank(ncclComm **comm, int nranks, const std::string &key, int rank, int blocking,
                       int device, const std::string &host)
{
    ncclComm *c;

    std::unique_lock<std::mutex> g(lock);
    auto &grp = forming[key];
    if (!grp) {
        grp = std::make_shared<emu_group>();
        grp->nranks = nranks;
        grp->members.assign(nranks, nullptr);
    }
    if (grp->nranks != nranks || grp->members[rank] != nullptr)
        return ncclInvalidArgument;
    c = new ncclComm();
    c->g = grp;
    c->rank = rank;
    c->nranks = nranks;
    c->device = device;
    c->host = host;
    c->blocking = blocking;
    grp->members[rank] = c;
    *comm = c;
    if (++grp->joined == nranks) {
        for (int a = 0; a < nranks; a++)
            for (int b = a + 1; b < nranks; b++) {
                const ncclComm *ma = grp->members[a], *mb = grp->members[b];

                if (ma->device == mb->device && ma->host == mb->host && grp->err == ncclSuccess) {
                    fprintf(stderr,
                            "nccl-emu: ranks %d and %d on device %d of host %s: NCCL "
                            "refuses two ranks of a communicator on one GPU\n",
                            a, b, ma->device, ma->host.c_str());
                    grp->err = ncclInvalidUsage;
                }
            }
        for (ncclComm *m : grp->members)
            m->formed = 1;
        forming.erase(key);
        formed.notify_all();
    }
    if (!c->blocking)
        return c->formed ? c->g->err : ncclInProgress;
    return wait_formed(g, c);
}

void state(ncclComm *c, ncclResult_t *st, int *rank, int *nranks)
{
    std::lock_guard<std::mutex> g(lock);

    if (c->g && c->g->err != ncclSuccess)
        *st = c->g->err;
    else if (!c->formed || c->splitting > 0)
        *st = ncclInProgress;
    else
        *st = ncclSuccess;
    *rank = c->formed ? c->rank : -1;
    *nranks = c->formed ? c->nranks : -1;
}

} // namespace emu_nccl

using namespace emu_nccl;

extern "C" {

ncclResult_t ncclGetVersion(int *version)
{
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess:
        return "no error (nccl-emu)";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (nccl-emu)";
    case ncclSystemError:
        return "unhandled system error, or a wait past GANG_EMU_WAIT_MS (nccl-emu)";
    case ncclInternalError:
        return "internal error (nccl-emu)";
    case ncclInvalidArgument:
        return "invalid argument (nccl-emu)";
    case ncclInvalidUsage:
        return "invalid usage (nccl-emu)";
    case ncclRemoteError:
        return "remote process exited or there was a network error (nccl-emu)";
    case ncclInProgress:
        return "NCCL operation in progress (nccl-emu)";
    default:
        return "unknown result code (nccl-emu)";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return "";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    std::string key = broker_key();

    memset(id, 0, sizeof(*id));
    if (key.empty() || key.size() >= sizeof(id->internal))
        return ncclSystemError;
    memcpy(id->internal, key.data(), key.size());
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    std::string key(id.internal, strnlen(id.internal, sizeof(id.internal)));

    if (comm == nullptr || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    if (key_is_remote(key))
        return remote_init(comm, nranks, key, rank, config_blocking(config));
    return init_rank(comm, nranks, key, rank, config_blocking(config), gang_emu_current_device(),
                     host_name());
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *st)
{
    int rank, nranks;

    if (comm == nullptr)
        return ncclInvalidArgument;
    if (comm->remote != nullptr)
        return remote_state(comm, st, &rank, &nranks);
    state(comm, st, &rank, &nranks);
    return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config)
{
    ncclResult_t rc;
    ncclComm *child = nullptr;
    part p;

    if (comm != nullptr && comm->remote != nullptr)
        return remote_split(comm, color, key, newcomm, config_blocking(config));
    std::unique_lock<std::mutex> g(lock);
    if ((rc = usable(comm)) != ncclSuccess)
        return rc;
    if (color != NCCL_SPLIT_NOCOLOR) {
        child = new ncclComm();
        child->blocking = config_blocking(config);
    }
    *newcomm = child;
    comm->splitting++;
    p.color = color;
    p.key = key;
    p.child = child;
    rc = post(comm, OP_SPLIT, std::move(p));
    if (rc != ncclSuccess)
        return rc;
    if (!comm->blocking)
        return ncclInProgress;
    formed.wait_for(g, std::chrono::milliseconds(gang_emu_wait_ms()),
                    [&]() { return comm->splitting == 0 || comm->g->err != ncclSuccess; });
    return comm->splitting == 0 ? comm->g->err : ncclSystemError;
}

/* A communicator's rank or size (which 0, 1) once formed. */
static ncclResult_t rank_or_size(ncclComm *comm, int which, int *out)
{
    ncclResult_t st;
    int v[2] = {-1, -1};

    if (comm == nullptr)
        return ncclInvalidArgument;
    if (comm->remote != nullptr)
        remote_state(comm, &st, &v[0], &v[1]);
    else
        state(comm, &st, &v[0], &v[1]);
    if (v[which] < 0)
        return ncclInvalidArgument;
    *out = v[which];
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    return rank_or_size(comm, 0, rank);
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    return rank_or_size(comm, 1, count);
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (comm != nullptr && comm->remote != nullptr)
        return remote_end(comm, 1);
    std::lock_guard<std::mutex> g(lock);

    if (comm == nullptr)
        return ncclSuccess;
    comm->aborted = 1;
    if (comm->g) {
        emu_group &grp = *comm->g;
        size_t queued = 0;

        /* What is pending on the group can never complete now: it fails, and the peers
         * see ncclRemoteError. Work that completed stays done (a peer that aborts after
         * the last shared operation does not fail the others). */
        for (auto *q : {&grp.sends, &grp.recvs})
            for (auto &kv : *q)
                queued += kv.second.size();
        if (!grp.slots.empty() || queued > 0)
            group_fail(grp, ncclRemoteError);
        for (size_t r = 0; r < grp.members.size(); r++)
            if (grp.members[r] == comm)
                grp.members[r] = nullptr;
        if (!comm->formed) { /* still forming: the id's group can never complete */
            for (auto it = forming.begin(); it != forming.end(); ++it)
                if (it->second.get() == &grp) {
                    forming.erase(it);
                    break;
                }
        }
    }
    formed.notify_all();
    comm->g.reset(); /* kept, ended: see ncclCommDestroy */
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    return comm == nullptr ? ncclInvalidArgument : ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (comm != nullptr && comm->remote != nullptr)
        return remote_end(comm, 0);
    std::lock_guard<std::mutex> g(lock);

    if (comm == nullptr)
        return ncclSuccess;
    if (comm->g)
        for (size_t r = 0; r < comm->g->members.size(); r++)
            if (comm->g->members[r] == comm)
                comm->g->members[r] = nullptr;
    /* Never freed: an operation whose post was deferred behind its stream's work may still
     * name it; it then finds the communicator ended and fails (a leak of a few hundred
     * bytes per communicator, in tests). */
    comm->aborted = 1;
    comm->g.reset();
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    if (op != ncclSum)
        return ncclInvalidArgument;
    return operation(OP_ALLREDUCE, send, recv, count, t, 0, comm, stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t stream)
{
    return operation(OP_ALLGATHER, send, recv, count, t, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t stream)
{
    return operation(OP_BROADCAST, send, recv, count, t, root, comm, stream);
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return operation(OP_SEND, buf, nullptr, count, t, peer, comm, stream);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return operation(OP_RECV, nullptr, buf, count, t, peer, comm, stream);
}

ncclResult_t ncclGroupStart(void)
{
    group_start();
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    group_end();
    return ncclSuccess;
}

} /* extern "C" */
