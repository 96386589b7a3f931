/*
 * The mpi communicator backend: rank and world come from MPI (a job launched by mpirun,
 * usually Open MPI) and every operation goes through MPI on a private duplicate of
 * MPI_COMM_WORLD. This file and the registry are the only ones that include <mpi.h>.
 *
 * Deadlines and abort. MPI cannot cancel a collective, so every operation is issued in
 * its non-blocking form (MPI_Iallreduce, MPI_Iallgather, MPI_Ibcast, MPI_Isend/Irecv,
 * MPI_Ibarrier, MPI_Comm_idup) and driven by mpi_wait(), which calls MPI_Test in a loop
 * until the request completes, the deadline passes (GANG_ETIMEDOUT) or gang_comm_abort()
 * sets the aborted flag (GANG_EABORTED). Open MPI has no asynchronous progress thread:
 * a non-blocking collective or a large (rendezvous, fragmented) message moves forward only
 * inside MPI calls, one step per MPI_Test, so any sleep between two tests stalls the
 * transfer of every rank waiting on this one. Measured with 2 ranks on shared memory, the
 * former 2 ms of spinning followed by 50-200 us sleeps made a 16 MiB all_reduce 8x and a
 * 64 MiB one 4x slower than with continuous polling. Collectives, sends and the
 * communicator duplication therefore poll continuously (MPI_Test, then sched_yield() so
 * that an oversubscribed core goes to the peer that has work), exactly as Open MPI's own
 * blocking calls do, checking the aborted flag and the deadline after every test. Only a
 * receive, which may legitimately wait a long time (a pipeline stage idle until its
 * predecessor sends), backs off to short sleeps (50 to 200 us) after GANG_MPI_SPIN_NS of
 * polling, so that an idle stage does not burn a core; a receive of a large message that
 * is already under way may be slowed by these sleeps.
 *
 * After GANG_ETIMEDOUT or GANG_EABORTED the request is still in flight inside MPI: it can
 * be neither cancelled (collectives, sends) nor completed safely, because a late peer may
 * match it at any time. The communicator is then unusable, as the front's rules say for
 * every backend, and more strongly: the buffer given to the failed operation may still be
 * written by MPI, so it must stay allocated, and the process must be torn down (MPI cannot
 * re-form a gang in place). gang_comm_free() of such a communicator leaks the MPI
 * communicator and the request on purpose instead of freeing objects MPI still uses. A
 * timed-out or aborted receive is the exception: it is cancelled, and its buffer is free.
 *
 * Process-wide state. MPI is initialised once per process and finalised at most once,
 * after which it can never be initialised again. The first gang_comm_init() initialises
 * MPI unless the application already did (MPI_Initialized); the backend then counts its
 * live communicators (splits included) and calls MPI_Finalize when the last one is freed,
 * but only if it was the one that initialised MPI. Consequently an MPI communicator cannot
 * be created again after the last one was freed in that case (GANG_EINVAL).
 *
 * Threads. MPI is initialised with MPI_THREAD_MULTIPLE when the library provides it (Open
 * MPI built with thread support does), so that different threads may drive different
 * communicators; with a lower level every MPI call of this file is serialised by one
 * process-wide mutex (MPI_THREAD_SERIALIZED is then enough). gang_comm_abort() makes no
 * MPI call at all: it only sets the flag that mpi_wait() polls, so it is safe from any
 * thread whatever level MPI provides.
 */
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include <mpi.h>

#include "comm-backend.h"

/* Busy polling before the first sleep of a receive's mpi_wait(), and the range of its
 * sleeps; GANG_MPI_SPIN_FOREVER makes mpi_wait() poll until completion, abort or deadline. */
#define GANG_MPI_SPIN_NS 2000000ull
#define GANG_MPI_SPIN_FOREVER UINT64_MAX
#define GANG_MPI_SLEEP_MIN_NS 50000ull
#define GANG_MPI_SLEEP_MAX_NS 200000ull
/* How long a cancelled receive may take to complete before it is left in flight. */
#define GANG_MPI_CANCEL_GRACE_NS 100000000ull
/* Largest element count handed to one MPI call (MPI counts are int); larger all_reduce and
 * broadcast buffers are processed in chunks of this many elements. */
#define GANG_MPI_MAX_CHUNK ((size_t)1 << 30)
/* Smallest all_reduce, in bytes, that uses the ring of point-to-point messages instead of
 * MPI_Iallreduce (see mpi_all_reduce()). */
#define GANG_MPI_RING_MIN_BYTES ((size_t)256 << 10)

/* State of one MPI communicator (c->impl). */
typedef struct mpi_comm {
    MPI_Comm comm;      /* our own communicator: a duplicate of WORLD or a split of one */
    MPI_Comm ring;      /* duplicate of comm for the ring all_reduce's messages, so that
                           they never match a send or recv of the user, whatever its tag */
    int tag_ub;         /* largest tag MPI accepts (MPI_TAG_UB) */
    int poisoned;       /* a request was left in flight: the communicator must not be freed */
    void *scratch;      /* receive buffer of the ring all_reduce, kept between calls */
    size_t scratch_cap; /* bytes at scratch */
} mpi_comm;

/* Process-wide state of the backend; every field is guarded by mpi_state_lock. */
static pthread_mutex_t mpi_state_lock = PTHREAD_MUTEX_INITIALIZER;
static int mpi_ready;          /* MPI is initialised and the fields below are valid */
static int mpi_we_initialised; /* this backend called MPI_Init_thread */
static int mpi_finalised;      /* this backend called MPI_Finalize; MPI is gone for good */
static int mpi_refs;           /* live communicators of this backend */
static int mpi_thread_level;   /* level provided by MPI */
static int mpi_tag_ub;         /* MPI_TAG_UB of MPI_COMM_WORLD */
static MPI_Op mpi_op_sum_f16 = MPI_OP_NULL;
static MPI_Op mpi_op_sum_bf16 = MPI_OP_NULL;

/* Serialises MPI calls when MPI does not provide MPI_THREAD_MULTIPLE. */
static pthread_mutex_t mpi_call_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int mpi_serialise;

/* Enters an MPI call: takes the call lock when MPI calls must be serialised. */
static void mpi_enter(void)
{
    if (atomic_load_explicit(&mpi_serialise, memory_order_relaxed))
        pthread_mutex_lock(&mpi_call_lock);
}

/* Leaves an MPI call entered with mpi_enter(). */
static void mpi_leave(void)
{
    if (atomic_load_explicit(&mpi_serialise, memory_order_relaxed))
        pthread_mutex_unlock(&mpi_call_lock);
}

/*
 * Maps an MPI error code to a GANG_E* code and logs it with the operation's name. A
 * truncated receive (the sender sent more than the receiver expects) is GANG_EPROTO, as
 * the front specifies for a size mismatch.
 */
static int mpi_error(int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    int cls = MPI_ERR_UNKNOWN;

    MPI_Error_class(rc, &cls);
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        msg[0] = '\0';
    gang_error("comm mpi: %s failed: %s (MPI error %d)", what, msg, rc);
    switch (cls) {
    case MPI_ERR_TRUNCATE:
        return GANG_EPROTO;
    case MPI_ERR_NO_MEM:
        return GANG_ENOMEM;
    case MPI_ERR_BUFFER:
    case MPI_ERR_COUNT:
    case MPI_ERR_TYPE:
    case MPI_ERR_TAG:
    case MPI_ERR_COMM:
    case MPI_ERR_RANK:
    case MPI_ERR_ROOT:
    case MPI_ERR_OP:
    case MPI_ERR_ARG:
        return GANG_EINVAL;
    default:
        return GANG_EIO;
    }
}

/* The absolute deadline, in gang_now_ns() time, of an operation given tmo_ms from now. */
static uint64_t mpi_deadline(uint64_t tmo_ms)
{
    uint64_t now = gang_now_ns();

    if (tmo_ms > (UINT64_MAX - now) / 1000000u)
        return UINT64_MAX;
    return now + tmo_ms * 1000000u;
}

/* Sleeps ns nanoseconds; an interruption only shortens the sleep, the caller loops. */
static void mpi_nap(uint64_t ns)
{
    struct timespec ts;

    ts.tv_sec = (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    nanosleep(&ts, NULL);
}

/*
 * Drives *req to completion, filling *st (may be MPI_STATUS_IGNORE). Polls MPI_Test
 * continuously (yielding the core between tests) for spin_ns, then with sleeps of
 * GANG_MPI_SLEEP_MIN_NS growing to GANG_MPI_SLEEP_MAX_NS; spin_ns = GANG_MPI_SPIN_FOREVER
 * never sleeps, which is what a collective needs to progress at full speed (see the top of
 * the file). Returns 0, the mapped MPI error, GANG_EABORTED when c's aborted flag is set
 * (c may be NULL during init, when only the deadline applies) or GANG_ETIMEDOUT when
 * deadline_ns passes; both are checked after every test. On GANG_EABORTED and
 * GANG_ETIMEDOUT *req is still in flight and belongs to MPI; the caller decides whether to
 * cancel it or leave the communicator poisoned.
 */
static int mpi_wait(gang_comm *c, MPI_Request *req, MPI_Status *st, uint64_t deadline_ns,
                    uint64_t spin_ns, const char *what)
{
    uint64_t start = gang_now_ns();
    uint64_t nap = 0;

    for (;;) {
        uint64_t now;
        int done = 0;
        int rc;

        mpi_enter();
        rc = MPI_Test(req, &done, st);
        mpi_leave();
        if (rc != MPI_SUCCESS)
            return mpi_error(rc, what);
        if (done)
            return 0;
        if (c != NULL && atomic_load(&c->aborted))
            return GANG_EABORTED;
        now = gang_now_ns();
        if (now >= deadline_ns)
            return GANG_ETIMEDOUT;
        if (now - start < spin_ns) {
            sched_yield();
            continue;
        }
        nap = nap == 0 ? GANG_MPI_SLEEP_MIN_NS : nap * 2;
        if (nap > GANG_MPI_SLEEP_MAX_NS)
            nap = GANG_MPI_SLEEP_MAX_NS;
        mpi_nap(nap < deadline_ns - now ? nap : deadline_ns - now);
    }
}

/*
 * Finishes a failed wait on a collective or a send of c: the request cannot be
 * cancelled, so c is marked poisoned (never freed through MPI) and the error recorded.
 * Returns err.
 */
static int mpi_fail(gang_comm *c, int err, const char *what)
{
    mpi_comm *m = c->impl;

    m->poisoned = 1;
    if (err == GANG_ETIMEDOUT)
        gang_error("comm mpi: %s timed out on rank %u; the communicator is unusable and "
                   "the process must be torn down",
                   what, (unsigned)c->rank);
    gang__comm_set_error(c, err);
    return err;
}

/* Waits for a request of c and poisons c if it is left in flight; returns 0 or an error. */
static int mpi_wait_op(gang_comm *c, MPI_Request *req, uint64_t deadline_ns, const char *what)
{
    int err = mpi_wait(c, req, MPI_STATUS_IGNORE, deadline_ns, GANG_MPI_SPIN_FOREVER, what);

    if (err == GANG_ETIMEDOUT || err == GANG_EABORTED)
        return mpi_fail(c, err, what);
    if (err != 0)
        gang__comm_set_error(c, err);
    return err;
}

/* MPI_User_function for the sum of IEEE halves: accumulates in f32, rounds to even. */
static void mpi_sum_f16(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    gang__comm_reduce_sum(inout, in, (size_t)*len, GANG_DTYPE_F16);
}

/* MPI_User_function for the sum of bfloat16 values: accumulates in f32, rounds to even. */
static void mpi_sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    gang__comm_reduce_sum(inout, in, (size_t)*len, GANG_DTYPE_BF16);
}

/* The MPI datatype that carries elements of dt (f16 and bf16 travel as 16-bit words). */
static MPI_Datatype mpi_type_of(gang_dtype dt)
{
    switch (dt) {
    case GANG_DTYPE_F32:
        return MPI_FLOAT;
    case GANG_DTYPE_I32:
        return MPI_INT32_T;
    case GANG_DTYPE_F16:
    case GANG_DTYPE_BF16:
    default:
        return MPI_UINT16_T;
    }
}

/* The MPI reduction that sums elements of dt; the half types use our own operations. */
static MPI_Op mpi_sum_of(gang_dtype dt)
{
    switch (dt) {
    case GANG_DTYPE_F16:
        return mpi_op_sum_f16;
    case GANG_DTYPE_BF16:
        return mpi_op_sum_bf16;
    case GANG_DTYPE_F32:
    case GANG_DTYPE_I32:
    default:
        return MPI_SUM;
    }
}

/*
 * Makes sure MPI is initialised and the process-wide state filled in. Called with
 * mpi_state_lock held. Initialises MPI only when nobody did before (the application may
 * have called MPI_Init itself, in which case it also finalises). Returns 0, or GANG_EINVAL
 * when MPI was already finalised, GANG_EIO when MPI cannot start.
 */
static int mpi_process_init_locked(void)
{
    int initialised = 0;
    int finalised = 0;
    int provided = MPI_THREAD_SINGLE;
    int flag = 0;
    int *ub = NULL;
    int rc;

    if (mpi_ready)
        return 0;
    MPI_Finalized(&finalised);
    if (finalised || mpi_finalised) {
        gang_error("comm mpi: MPI was already finalised in this process; an MPI "
                   "communicator cannot be created again");
        return GANG_EINVAL;
    }
    MPI_Initialized(&initialised);
    if (!initialised) {
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS)
            return mpi_error(rc, "MPI_Init_thread");
        mpi_we_initialised = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    mpi_thread_level = provided;
    if (provided < MPI_THREAD_MULTIPLE)
        atomic_store(&mpi_serialise, 1);
    if (provided < MPI_THREAD_SERIALIZED)
        gang_warn("comm mpi: MPI provides thread level %d only; drive every MPI "
                  "communicator from the thread that initialised MPI",
                  provided);
    else if (provided < MPI_THREAD_MULTIPLE)
        gang_info("comm mpi: MPI_THREAD_MULTIPLE not provided; MPI calls are serialised");
    rc = MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    mpi_tag_ub = rc == MPI_SUCCESS && flag && ub != NULL ? *ub : 32767; /* MPI's minimum */
    rc = MPI_Op_create(mpi_sum_f16, 1, &mpi_op_sum_f16);
    if (rc == MPI_SUCCESS)
        rc = MPI_Op_create(mpi_sum_bf16, 1, &mpi_op_sum_bf16);
    if (rc != MPI_SUCCESS)
        return mpi_error(rc, "MPI_Op_create");
    mpi_ready = 1;
    return 0;
}

/* Counts one more live communicator. */
static void mpi_ref_get(void)
{
    pthread_mutex_lock(&mpi_state_lock);
    mpi_refs++;
    pthread_mutex_unlock(&mpi_state_lock);
}

/*
 * Counts one communicator less; the last one finalises MPI when this backend initialised
 * it. MPI_Finalize is collective in practice (Open MPI waits for every process), which is
 * why a process that freed its last communicator early waits here for the others.
 */
static void mpi_ref_put(void)
{
    int rc;

    pthread_mutex_lock(&mpi_state_lock);
    if (--mpi_refs == 0 && mpi_we_initialised && !mpi_finalised) {
        MPI_Op_free(&mpi_op_sum_f16);
        MPI_Op_free(&mpi_op_sum_bf16);
        rc = MPI_Finalize();
        if (rc != MPI_SUCCESS)
            gang_warn("comm mpi: MPI_Finalize failed (MPI error %d)", rc);
        mpi_finalised = 1;
        mpi_ready = 0;
    }
    pthread_mutex_unlock(&mpi_state_lock);
}

/*
 * Initialises MPI if needed and duplicates MPI_COMM_WORLD (MPI_Comm_idup, so that the
 * deadline holds even when a rank never arrives). cfg->rank and cfg->world_size must be
 * those of MPI_COMM_WORLD: a launcher that disagrees with mpirun is a configuration error
 * (GANG_EINVAL, logged). The new communicator returns errors instead of aborting the job
 * (MPI_ERRORS_RETURN). On failure c->impl stays NULL and MPI stays initialised.
 */
static int mpi_init(gang_comm *c, const gang_comm_config *cfg)
{
    uint64_t deadline = mpi_deadline(cfg->timeout_ms);
    MPI_Request req = MPI_REQUEST_NULL;
    mpi_comm *m = NULL;
    int rank = -1;
    int size = -1;
    int err;
    int rc;

    c->impl = NULL;
    pthread_mutex_lock(&mpi_state_lock);
    err = mpi_process_init_locked();
    pthread_mutex_unlock(&mpi_state_lock);
    if (err != 0)
        goto out;
    mpi_enter();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    mpi_leave();
    if ((int64_t)cfg->rank != rank || (int64_t)cfg->world_size != size) {
        gang_error("comm mpi: configured as rank %u of %u but MPI_COMM_WORLD says rank %d "
                   "of %d; under mpirun take the identity from MPI",
                   (unsigned)cfg->rank, (unsigned)cfg->world_size, rank, size);
        err = GANG_EINVAL;
        goto out;
    }
    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        err = GANG_ENOMEM;
        goto out;
    }
    m->comm = MPI_COMM_NULL;
    m->ring = MPI_COMM_NULL;
    m->tag_ub = mpi_tag_ub;
    mpi_enter();
    rc = MPI_Comm_idup(MPI_COMM_WORLD, &m->comm, &req);
    mpi_leave();
    if (rc != MPI_SUCCESS) {
        err = mpi_error(rc, "MPI_Comm_idup");
        goto out_free;
    }
    err = mpi_wait(c, &req, MPI_STATUS_IGNORE, deadline, GANG_MPI_SPIN_FOREVER, "MPI_Comm_idup");
    if (err != 0) {
        /* The duplication is still in flight: leak m, MPI may write m->comm later. */
        m = NULL;
        goto out;
    }
    mpi_enter();
    rc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    mpi_leave();
    if (rc != MPI_SUCCESS) {
        err = mpi_error(rc, "MPI_Comm_set_errhandler");
        goto out_comm;
    }
    /* The ring's communicator inherits MPI_ERRORS_RETURN from m->comm. */
    mpi_enter();
    rc = MPI_Comm_idup(m->comm, &m->ring, &req);
    mpi_leave();
    if (rc != MPI_SUCCESS) {
        err = mpi_error(rc, "MPI_Comm_idup");
        goto out_comm;
    }
    err = mpi_wait(c, &req, MPI_STATUS_IGNORE, deadline, GANG_MPI_SPIN_FOREVER, "MPI_Comm_idup");
    if (err != 0) {
        /* As above: the duplication is still in flight, so m is leaked. */
        m = NULL;
        goto out;
    }
    c->rank = (uint32_t)rank;
    c->size = (uint32_t)size;
    c->impl = m;
    mpi_ref_get();
    gang_debug("comm mpi: rank %d of %d ready (thread level %d)", rank, size, mpi_thread_level);
    return 0;

out_comm:
    mpi_enter();
    MPI_Comm_free(&m->comm);
    mpi_leave();
out_free:
    free(m);
out:
    return err;
}

/*
 * Frees c's MPI communicator, unless an operation was left in flight on it (then the
 * communicator and its request are leaked: freeing what MPI still uses is worse), and
 * finalises MPI with the last communicator if the backend initialised it.
 */
static void mpi_free(gang_comm *c)
{
    mpi_comm *m = c->impl;

    if (m == NULL)
        return;
    if (!m->poisoned) {
        mpi_enter();
        MPI_Comm_free(&m->ring);
        MPI_Comm_free(&m->comm);
        mpi_leave();
        free(m->scratch);
    }
    /* A poisoned communicator leaks its scratch too: a ring receive may still write it. */
    free(m);
    c->impl = NULL;
    mpi_ref_put();
}

/*
 * MPI_Comm_split(color, key), which orders the members of a color by key then by parent
 * rank as the front specifies. MPI has no non-blocking split, so the deadline is honoured
 * by an MPI_Ibarrier first: once every rank has entered the split, MPI_Comm_split only
 * exchanges colors and completes. Colors and keys beyond INT_MAX are GANG_ERANGE.
 */
static int mpi_split(gang_comm *c, uint32_t color, uint32_t key, uint64_t timeout_ms,
                     gang_comm *child)
{
    uint64_t deadline = mpi_deadline(timeout_ms);
    MPI_Request req = MPI_REQUEST_NULL;
    mpi_comm *m = c->impl;
    mpi_comm *cm = NULL;
    int rank = -1;
    int size = -1;
    int err;
    int rc;

    child->impl = NULL;
    if (color > INT_MAX || key > INT_MAX) {
        gang_error("comm mpi: split color %u / key %u exceed MPI's int range", (unsigned)color,
                   (unsigned)key);
        return GANG_ERANGE;
    }
    cm = calloc(1, sizeof(*cm));
    if (cm == NULL)
        return GANG_ENOMEM;
    cm->comm = MPI_COMM_NULL;
    cm->ring = MPI_COMM_NULL;
    cm->tag_ub = m->tag_ub;
    mpi_enter();
    rc = MPI_Ibarrier(m->comm, &req);
    mpi_leave();
    if (rc != MPI_SUCCESS) {
        err = mpi_error(rc, "MPI_Ibarrier (split)");
        goto out_free;
    }
    err = mpi_wait_op(c, &req, deadline, "split");
    if (err != 0)
        goto out_free;
    mpi_enter();
    rc = MPI_Comm_split(m->comm, (int)color, (int)key, &cm->comm);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_set_errhandler(cm->comm, MPI_ERRORS_RETURN);
    /* Every member has just completed the split, so this blocking dup completes too. */
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_dup(cm->comm, &cm->ring);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_rank(cm->comm, &rank);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_size(cm->comm, &size);
    mpi_leave();
    if (rc != MPI_SUCCESS) {
        err = mpi_error(rc, "MPI_Comm_split");
        gang__comm_set_error(c, err);
        goto out_comm;
    }
    child->rank = (uint32_t)rank;
    child->size = (uint32_t)size;
    child->impl = cm;
    mpi_ref_get();
    return 0;

out_comm:
    mpi_enter();
    if (cm->ring != MPI_COMM_NULL)
        MPI_Comm_free(&cm->ring);
    if (cm->comm != MPI_COMM_NULL)
        MPI_Comm_free(&cm->comm);
    mpi_leave();
out_free:
    free(cm);
    return err;
}

/*
 * Drives the n requests reqs[] of c to completion with MPI_Testall, polling continuously
 * like mpi_wait() with GANG_MPI_SPIN_FOREVER. Returns 0 or an error recorded on c; on
 * GANG_ETIMEDOUT and GANG_EABORTED the requests are still in flight and c is poisoned.
 */
static int mpi_wait_all(gang_comm *c, MPI_Request *reqs, int n, uint64_t deadline_ns,
                        const char *what)
{
    int err = 0;

    for (;;) {
        int done = 0;
        int rc;

        mpi_enter();
        rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        mpi_leave();
        if (rc != MPI_SUCCESS) {
            err = mpi_error(rc, what);
            break;
        }
        if (done)
            return 0;
        if (atomic_load(&c->aborted)) {
            err = GANG_EABORTED;
            break;
        }
        if (gang_now_ns() >= deadline_ns) {
            err = GANG_ETIMEDOUT;
            break;
        }
        sched_yield();
    }
    /* After an MPI error the state of the other requests is unknown: treat them as in
     * flight, like after a timeout. */
    return mpi_fail(c, err, what);
}

/*
 * One step of the ring: sends send_len elements at send to the right neighbour and
 * receives recv_len elements from the left one into recv, both on m->ring, and waits for
 * both under the deadline. Returns 0 or an error recorded on c (c is then poisoned).
 */
static int mpi_ring_step(gang_comm *c, const void *send, size_t send_len, void *recv,
                         size_t recv_len, gang_dtype dt, uint64_t deadline_ns)
{
    mpi_comm *m = c->impl;
    int right = (int)((c->rank + 1) % c->size);
    int left = (int)((c->rank + c->size - 1) % c->size);
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int rc;

    mpi_enter();
    rc = MPI_Irecv(recv, (int)recv_len, mpi_type_of(dt), left, 0, m->ring, &reqs[0]);
    if (rc == MPI_SUCCESS)
        rc = MPI_Isend(send, (int)send_len, mpi_type_of(dt), right, 0, m->ring, &reqs[1]);
    mpi_leave();
    if (rc != MPI_SUCCESS) {
        /* A receive already posted cannot be withdrawn safely: c is unusable. */
        mpi_error(rc, "all_reduce ring");
        return mpi_fail(c, GANG_EIO, "all_reduce");
    }
    return mpi_wait_all(c, reqs, 2, deadline_ns, "all_reduce");
}

/*
 * Ring all_reduce of count elements at buf over c's size ranks (at least 2), as NCCL and
 * Open MPI's tuned MPI_Allreduce do: the buffer is cut into size blocks; in size - 1
 * reduce-scatter steps every rank sends one block to its right neighbour and adds the
 * block it receives from its left one into its own copy, after which rank r holds the
 * full sum of block (r + 1) % size; size - 1 allgather steps then pass the summed blocks
 * around. Every rank sends and receives 2 (size - 1) / size of the buffer, all links busy
 * at once. Every block must fit an int (the caller checks). Returns 0 or an error
 * recorded on c.
 */
static int mpi_ring_all_reduce(gang_comm *c, void *buf, size_t count, gang_dtype dt,
                               uint64_t deadline_ns)
{
    mpi_comm *m = c->impl;
    size_t esize = gang_dtype_size(dt);
    size_t p = c->size;
    size_t r = c->rank;
    size_t most = (count + p - 1) / p;
    char *b = buf;
    int err;

    if (m->scratch_cap < most * esize) {
        void *n = malloc(most * esize);

        if (n == NULL) {
            gang__comm_set_error(c, GANG_ENOMEM);
            return GANG_ENOMEM;
        }
        free(m->scratch);
        m->scratch = n;
        m->scratch_cap = most * esize;
    }
    /* Block i spans elements [i * count / p, (i + 1) * count / p). */
#define RING_OFF(i) ((i)*count / p)
#define RING_LEN(i) (RING_OFF((i) + 1) - RING_OFF(i))
    for (size_t s = 0; s + 1 < p; s++) {
        size_t out = (r + p - s) % p;
        size_t in = (r + p - s - 1) % p;

        err = mpi_ring_step(c, b + RING_OFF(out) * esize, RING_LEN(out), m->scratch, RING_LEN(in),
                            dt, deadline_ns);
        if (err != 0)
            return err;
        gang__comm_reduce_sum(b + RING_OFF(in) * esize, m->scratch, RING_LEN(in), dt);
    }
    for (size_t s = 0; s + 1 < p; s++) {
        size_t out = (r + 1 + p - s) % p;
        size_t in = (r + p - s) % p;

        err = mpi_ring_step(c, b + RING_OFF(out) * esize, RING_LEN(out), b + RING_OFF(in) * esize,
                            RING_LEN(in), dt, deadline_ns);
        if (err != 0)
            return err;
    }
#undef RING_OFF
#undef RING_LEN
    return 0;
}

/*
 * In-place sum. Buffers of at least GANG_MPI_RING_MIN_BYTES (with blocks that fit an int)
 * use mpi_ring_all_reduce(): Open MPI's libnbc, behind MPI_Iallreduce, sums 2 or 3 ranks
 * and every in-place buffer by reducing to a root and broadcasting back, two full
 * transfers one after the other, which measured 0.5-0.7x the blocking MPI_Allreduce at 1
 * to 64 MiB with 2 ranks; the ring of MPI_Isend/MPI_Irecv measured 1-2x. Smaller buffers,
 * where latency dominates, use MPI_Iallreduce(MPI_IN_PLACE), in chunks of at most
 * GANG_MPI_MAX_CHUNK elements. f16 and bf16 use the user-defined operations above, or
 * gang__comm_reduce_sum() in the ring, which round alike.
 */
static int mpi_all_reduce(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint64_t tmo)
{
    uint64_t deadline = mpi_deadline(tmo);
    mpi_comm *m = c->impl;
    size_t esize = gang_dtype_size(dt);
    size_t done = 0;
    int err = 0;

    if (c->size > 1 && count * esize >= GANG_MPI_RING_MIN_BYTES &&
        count / c->size < (size_t)INT_MAX)
        return mpi_ring_all_reduce(c, buf, count, dt, deadline);
    while (err == 0 && done < count) {
        size_t n = count - done < GANG_MPI_MAX_CHUNK ? count - done : GANG_MPI_MAX_CHUNK;
        MPI_Request req = MPI_REQUEST_NULL;
        int rc;

        mpi_enter();
        rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + done * esize, (int)n, mpi_type_of(dt),
                            mpi_sum_of(dt), m->comm, &req);
        mpi_leave();
        if (rc != MPI_SUCCESS) {
            err = mpi_error(rc, "MPI_Iallreduce");
            gang__comm_set_error(c, err);
            break;
        }
        err = mpi_wait_op(c, &req, deadline, "all_reduce");
        done += n;
    }
    return err;
}

/*
 * MPI_Iallgather of count elements per rank. When send is exactly this rank's block of
 * recv, MPI_IN_PLACE is used (MPI forbids aliased buffers otherwise). count must fit an
 * int (GANG_ERANGE beyond).
 */
static int mpi_all_gather(gang_comm *c, const void *send, void *recv, size_t count, gang_dtype dt,
                          uint64_t tmo)
{
    uint64_t deadline = mpi_deadline(tmo);
    mpi_comm *m = c->impl;
    MPI_Datatype type = mpi_type_of(dt);
    MPI_Request req = MPI_REQUEST_NULL;
    const void *mine = (const char *)recv + (size_t)c->rank * count * gang_dtype_size(dt);
    int err;
    int rc;

    if (count > INT_MAX) {
        gang_error("comm mpi: all_gather of %zu elements per rank exceeds MPI's int count", count);
        return GANG_ERANGE;
    }
    mpi_enter();
    if (send == mine)
        rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)count, type, m->comm,
                            &req);
    else
        rc = MPI_Iallgather(send, (int)count, type, recv, (int)count, type, m->comm, &req);
    mpi_leave();
    if (rc != MPI_SUCCESS) {
        err = mpi_error(rc, "MPI_Iallgather");
        gang__comm_set_error(c, err);
        return err;
    }
    return mpi_wait_op(c, &req, deadline, "all_gather");
}

/* MPI_Ibcast from root, in chunks of at most GANG_MPI_MAX_CHUNK elements. */
static int mpi_broadcast(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint32_t root,
                         uint64_t tmo)
{
    uint64_t deadline = mpi_deadline(tmo);
    mpi_comm *m = c->impl;
    size_t esize = gang_dtype_size(dt);
    size_t done = 0;
    int err = 0;

    while (err == 0 && done < count) {
        size_t n = count - done < GANG_MPI_MAX_CHUNK ? count - done : GANG_MPI_MAX_CHUNK;
        MPI_Request req = MPI_REQUEST_NULL;
        int rc;

        mpi_enter();
        rc = MPI_Ibcast((char *)buf + done * esize, (int)n, mpi_type_of(dt), (int)root, m->comm,
                        &req);
        mpi_leave();
        if (rc != MPI_SUCCESS) {
            err = mpi_error(rc, "MPI_Ibcast");
            gang__comm_set_error(c, err);
            break;
        }
        err = mpi_wait_op(c, &req, deadline, "broadcast");
        done += n;
    }
    return err;
}

/*
 * MPI_Ialltoallv in bytes. MPI takes int counts and displacements, so every region must
 * lie below INT_MAX bytes from its buffer's start (GANG_ERANGE beyond). The int arrays are
 * allocated per call: this backend serves the conformance tests and the benchmarks' peer,
 * not a decode step.
 */
static int mpi_all_to_all_v(gang_comm *c, const gang_comm_a2a *a, uint64_t tmo)
{
    uint64_t deadline = mpi_deadline(tmo);
    mpi_comm *m = c->impl;
    uint32_t n = c->size;
    MPI_Request req = MPI_REQUEST_NULL;
    int *v = calloc(4 * (size_t)n, sizeof(int)), rc, err = 0;

    if (v == NULL)
        return GANG_ENOMEM;
    for (uint32_t p = 0; p < n; p++) {
        if (a->send_off[p] + a->send_bytes[p] > INT_MAX ||
            a->recv_off[p] + a->recv_bytes[p] > INT_MAX) {
            gang_error("comm mpi: all_to_all_v regions beyond MPI's int displacements");
            free(v);
            return GANG_ERANGE;
        }
        v[p] = (int)a->send_bytes[p];
        v[n + p] = (int)a->send_off[p];
        v[2 * n + p] = (int)a->recv_bytes[p];
        v[3 * n + p] = (int)a->recv_off[p];
    }
    mpi_enter();
    rc = MPI_Ialltoallv(a->send, v, v + n, MPI_BYTE, a->recv, v + 2 * n, v + 3 * n, MPI_BYTE,
                        m->comm, &req);
    mpi_leave();
    if (rc != MPI_SUCCESS) {
        err = mpi_error(rc, "MPI_Ialltoallv");
        gang__comm_set_error(c, err);
    } else {
        err = mpi_wait_op(c, &req, deadline, "all_to_all_v");
    }
    free(v);
    return err;
}

/* Checks what MPI's point-to-point calls cannot take: byte counts and tags beyond int. */
static int mpi_check_p2p(const mpi_comm *m, size_t bytes, uint32_t tag, const char *what)
{
    if (bytes > INT_MAX) {
        gang_error("comm mpi: %s of %zu bytes exceeds MPI's int count", what, bytes);
        return GANG_ERANGE;
    }
    if ((int64_t)tag > (int64_t)m->tag_ub) {
        gang_error("comm mpi: %s tag %u exceeds MPI_TAG_UB (%d)", what, (unsigned)tag, m->tag_ub);
        return GANG_ERANGE;
    }
    return 0;
}

/*
 * MPI_Isend of bytes to peer with MPI tag = tag. A send that times out cannot be cancelled
 * reliably (MPI deprecates it), so it poisons the communicator.
 */
static int mpi_send(gang_comm *c, const void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                    uint64_t tmo)
{
    uint64_t deadline = mpi_deadline(tmo);
    mpi_comm *m = c->impl;
    MPI_Request req = MPI_REQUEST_NULL;
    int err;
    int rc;

    err = mpi_check_p2p(m, bytes, tag, "send");
    if (err != 0)
        return err;
    mpi_enter();
    rc = MPI_Isend(buf, (int)bytes, MPI_BYTE, (int)peer, (int)tag, m->comm, &req);
    mpi_leave();
    if (rc != MPI_SUCCESS) {
        err = mpi_error(rc, "MPI_Isend");
        gang__comm_set_error(c, err);
        return err;
    }
    return mpi_wait_op(c, &req, deadline, "send");
}

/*
 * MPI_Irecv of exactly bytes from peer with MPI tag = tag. A message of another size is
 * GANG_EPROTO (MPI reports a longer one as truncation, a shorter one by its count). A
 * receive that times out or is aborted is cancelled so that its buffer is released; if
 * the cancellation does not complete within GANG_MPI_CANCEL_GRACE_NS the communicator is
 * poisoned like after a collective.
 */
static int mpi_recv(gang_comm *c, void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                    uint64_t tmo)
{
    uint64_t deadline = mpi_deadline(tmo);
    mpi_comm *m = c->impl;
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Status st;
    int got = -1;
    int err;
    int rc;

    err = mpi_check_p2p(m, bytes, tag, "recv");
    if (err != 0)
        return err;
    mpi_enter();
    rc = MPI_Irecv(buf, (int)bytes, MPI_BYTE, (int)peer, (int)tag, m->comm, &req);
    mpi_leave();
    if (rc != MPI_SUCCESS) {
        err = mpi_error(rc, "MPI_Irecv");
        goto out_error;
    }
    err = mpi_wait(c, &req, &st, deadline, GANG_MPI_SPIN_NS, "recv");
    if (err == GANG_ETIMEDOUT || err == GANG_EABORTED)
        goto out_cancel;
    if (err != 0)
        goto out_error;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if ((size_t)got != bytes || got < 0) {
        gang_error("comm mpi: recv from rank %u tag %u got %d bytes, expected %zu", (unsigned)peer,
                   (unsigned)tag, got, bytes);
        err = GANG_EPROTO;
        goto out_error;
    }
    return 0;

out_cancel:
    mpi_enter();
    rc = MPI_Cancel(&req);
    mpi_leave();
    if (rc != MPI_SUCCESS ||
        mpi_wait(NULL, &req, MPI_STATUS_IGNORE, mpi_deadline(0) + GANG_MPI_CANCEL_GRACE_NS,
                 GANG_MPI_SPIN_NS, "recv cancel") != 0)
        return mpi_fail(c, err, "recv");
    if (err == GANG_ETIMEDOUT)
        gang_error("comm mpi: recv from rank %u tag %u timed out on rank %u", (unsigned)peer,
                   (unsigned)tag, (unsigned)c->rank);
out_error:
    gang__comm_set_error(c, err);
    return err;
}

/* MPI_Ibarrier under the deadline. */
static int mpi_barrier(gang_comm *c, uint64_t tmo)
{
    uint64_t deadline = mpi_deadline(tmo);
    mpi_comm *m = c->impl;
    MPI_Request req = MPI_REQUEST_NULL;
    int err;
    int rc;

    mpi_enter();
    rc = MPI_Ibarrier(m->comm, &req);
    mpi_leave();
    if (rc != MPI_SUCCESS) {
        err = mpi_error(rc, "MPI_Ibarrier");
        gang__comm_set_error(c, err);
        return err;
    }
    return mpi_wait_op(c, &req, deadline, "barrier");
}

/*
 * Nothing to wake: a blocked operation looks at the aborted flag, which the front has
 * already set, after every MPI_Test, and sleeps at most GANG_MPI_SLEEP_MAX_NS between two
 * tests (a receive only; the others never sleep). No MPI call is made here, which is what
 * makes gang_comm_abort() safe from any thread at any MPI thread level.
 */
static void mpi_abort(gang_comm *c)
{
    (void)c;
}

const gang__comm_ops gang__comm_mpi_ops = {
    .name = "mpi",
    .caps = GANG_COMM_CAP_HOST_MEM | GANG_COMM_CAP_TAGS,
    .init = mpi_init,
    .free = mpi_free,
    .split = mpi_split,
    .all_reduce = mpi_all_reduce,
    .all_gather = mpi_all_gather,
    .broadcast = mpi_broadcast,
    .send = mpi_send,
    .recv = mpi_recv,
    .barrier = mpi_barrier,
    .all_to_all_v = mpi_all_to_all_v,
    .abort = mpi_abort,
};
