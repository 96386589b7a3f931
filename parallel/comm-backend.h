/*
 * Communicator backend interface (internal to parallel/). parallel/comm.c is the front:
 * it validates arguments (NULLs, counts, dtype, peer/root range, timeout > 0, the aborted
 * flag) and then calls through the backend's vtable; every entry may assume valid
 * arguments. Registration of the built backends (and the GANG_ENOSYS stubs of those that
 * are not built) lives only in parallel/comm-registry.c.
 */
#ifndef GANG_PARALLEL_COMM_BACKEND_H
#define GANG_PARALLEL_COMM_BACKEND_H

#include <stdatomic.h>

#include "ganglion/comm.h"

typedef struct gang__comm_ops {
    const char *name;
    uint32_t caps; /* GANG_COMM_CAP_* of include/ganglion/comm.h */
    int (*init)(gang_comm *c, const gang_comm_config *cfg);
    void (*free)(gang_comm *c);
    /* The front allocates child and sets its ops and backend; split sets rank, size, impl. */
    int (*split)(gang_comm *c, uint32_t color, uint32_t key, uint64_t timeout_ms, gang_comm *child);
    int (*all_reduce)(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint64_t tmo);
    int (*all_gather)(gang_comm *c, const void *send, void *recv, size_t count, gang_dtype dt,
                      uint64_t tmo);
    int (*broadcast)(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint32_t root,
                     uint64_t tmo);
    int (*send)(gang_comm *c, const void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                uint64_t tmo);
    int (*recv)(gang_comm *c, void *buf, size_t bytes, uint32_t peer, uint32_t tag, uint64_t tmo);
    int (*barrier)(gang_comm *c, uint64_t tmo); /* optional: NULL = front emulates */
    /* optional: NULL = GANG_ENOSYS; the front has checked every region */
    int (*all_to_all_v)(gang_comm *c, const gang_comm_a2a *a, uint64_t tmo);
    /* Optional (device-memory backends): order the next operation after the work already
     * in stream, and stream's later work after that operation, on the device. */
    int (*order_after)(gang_comm *c, void *stream);
    /* Optional: wait for the device work of operations that returned at enqueue
     * (gang_comm_settle); NULL: a backend whose operations complete before returning. */
    int (*settle)(gang_comm *c, uint64_t tmo);
    /* Optional (gang_comm_graph_ok / gang_comm_pend_on): NULL = no device graphs. */
    int (*graph_ok)(const gang_comm *c);
    int (*pend_on)(gang_comm *c, void *stream);
    void (*abort)(gang_comm *c); /* wakes blocked operations */
} gang__comm_ops;

/* The front's part of every communicator; backends keep their state behind impl. */
struct gang_comm {
    const gang__comm_ops *ops;
    gang_comm_backend backend;
    uint32_t rank, size;
    atomic_int aborted;     /* set by gang_comm_abort() */
    atomic_int async_error; /* first error recorded */
    void *impl;             /* backend state */
};

/* The vtable of backend b (a stub returning GANG_ENOSYS when not built). */
const gang__comm_ops *gang__comm_ops_for(gang_comm_backend b);
/* Records err as the communicator's async error if none is recorded yet. */
void gang__comm_set_error(gang_comm *c, int err);

/* Reductions shared by the CPU backends: dst[i] += src[i] with f32 accumulation; dst and
 * src must not overlap (the f32/i32 loops use restrict pointers). */
void gang__comm_reduce_sum(void *dst, const void *src, size_t count, gang_dtype dt);

extern const gang__comm_ops gang__comm_socket_ops;
/* Defined in the module libganglion-mpi.so (comm-mpi.c), never in the binary itself. */
extern const gang__comm_ops gang__comm_mpi_ops;

/* comm-mpi-load.c: the mpi backend's module, opened at run time. */
#define GANG_MPI_PLUGIN_NAME "libganglion-mpi.so"
/*
 * The mpi vtable from the module, loaded once per process (thread-safe) from the
 * executable's directory, then the build tree; NULL (logged once) when it cannot be.
 */
const gang__comm_ops *gang__comm_mpi_plugin(void);
/* One attempt at the module at path: 0 with *out, or GANG_ENOENT. For tests. */
int gang__comm_mpi_plugin_open(const char *path, const gang__comm_ops **out);

#endif
