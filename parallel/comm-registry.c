/*
 * Registration of the communicator backends: the only file that asks which optional
 * backends this build contains (docs/design.md §5). A backend that is not built is
 * answered by a stub vtable whose entries return GANG_ENOSYS, so callers never test for
 * NULL. The mpi backend, when built, is a module loaded at its first use
 * (comm-mpi-load.c).
 */
#include "ganglion/config.h"

#include "comm-backend.h"

#if defined(GANG_HAVE_NCCL) && GANG_HAVE_NCCL
#define COMM_NCCL_BUILT 1
#else
#define COMM_NCCL_BUILT 0
#endif

/* The stubs: a backend that is not built, or the mpi module that cannot be loaded (which
 * has its own init; unused functions are errors). */
#if !GANG_HAVE_MPI || !COMM_NCCL_BUILT
static int stub_init(gang_comm *c, const gang_comm_config *cfg)
{
    (void)c;
    (void)cfg;
    return GANG_ENOSYS;
}
#endif

static void stub_free(gang_comm *c)
{
    (void)c;
}

static int stub_split(gang_comm *c, uint32_t color, uint32_t key, uint64_t timeout_ms,
                      gang_comm *child)
{
    (void)c;
    (void)color;
    (void)key;
    (void)timeout_ms;
    (void)child;
    return GANG_ENOSYS;
}

static int stub_all_reduce(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint64_t tmo)
{
    (void)c;
    (void)buf;
    (void)count;
    (void)dt;
    (void)tmo;
    return GANG_ENOSYS;
}

static int stub_all_gather(gang_comm *c, const void *send, void *recv, size_t count, gang_dtype dt,
                           uint64_t tmo)
{
    (void)c;
    (void)send;
    (void)recv;
    (void)count;
    (void)dt;
    (void)tmo;
    return GANG_ENOSYS;
}

static int stub_broadcast(gang_comm *c, void *buf, size_t count, gang_dtype dt, uint32_t root,
                          uint64_t tmo)
{
    (void)c;
    (void)buf;
    (void)count;
    (void)dt;
    (void)root;
    (void)tmo;
    return GANG_ENOSYS;
}

static int stub_send(gang_comm *c, const void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                     uint64_t tmo)
{
    (void)c;
    (void)buf;
    (void)bytes;
    (void)peer;
    (void)tag;
    (void)tmo;
    return GANG_ENOSYS;
}

static int stub_recv(gang_comm *c, void *buf, size_t bytes, uint32_t peer, uint32_t tag,
                     uint64_t tmo)
{
    (void)c;
    (void)buf;
    (void)bytes;
    (void)peer;
    (void)tag;
    (void)tmo;
    return GANG_ENOSYS;
}

static int stub_barrier(gang_comm *c, uint64_t tmo)
{
    (void)c;
    (void)tmo;
    return GANG_ENOSYS;
}

static void stub_abort(gang_comm *c)
{
    (void)c;
}

#define GANG_COMM_STUB_OPS(backend_name)                                                           \
    {                                                                                              \
        .name = backend_name, .init = stub_init, .free = stub_free, .split = stub_split,           \
        .all_reduce = stub_all_reduce, .all_gather = stub_all_gather, .broadcast = stub_broadcast, \
        .send = stub_send, .recv = stub_recv, .barrier = stub_barrier, .abort = stub_abort,        \
    }

#if !GANG_HAVE_MPI
static const gang__comm_ops comm_mpi_stub_ops = GANG_COMM_STUB_OPS("mpi");
#else
/*
 * MPI is built as a module (comm-mpi-load.c); when it cannot be loaded, every mpi
 * communicator fails at init with GANG_ENOENT (the loader has logged what it tried) rather
 * than with GANG_ENOSYS, which would say that the binary was built without MPI.
 */
static int missing_init(gang_comm *c, const gang_comm_config *cfg)
{
    (void)c;
    (void)cfg;
    return GANG_ENOENT;
}

static const gang__comm_ops comm_mpi_missing_ops = {
    .name = "mpi",
    .init = missing_init,
    .free = stub_free,
    .split = stub_split,
    .all_reduce = stub_all_reduce,
    .all_gather = stub_all_gather,
    .broadcast = stub_broadcast,
    .send = stub_send,
    .recv = stub_recv,
    .barrier = stub_barrier,
    .abort = stub_abort,
};
#endif
/*
 * NCCL: cmake/cuda.cmake compiles parallel/comm-nccl.c and defines GANG_HAVE_NCCL=1 for this
 * library when the toolkit and libnccl are found; otherwise the stub answers GANG_ENOSYS,
 * and so does the unique-id helper of the bootstrap.
 */
#if COMM_NCCL_BUILT
extern const gang__comm_ops gang__comm_nccl_ops;
#else
static const gang__comm_ops comm_nccl_stub_ops = GANG_COMM_STUB_OPS("nccl");

int gang_comm_nccl_unique_id(uint8_t *blob, size_t cap, size_t *len)
{
    (void)blob;
    (void)cap;
    if (len != NULL)
        *len = 0;
    return GANG_ENOSYS;
}

int gang_comm_nccl_library(char *path, size_t cap)
{
    if (cap > 0)
        path[0] = '\0';
    return GANG_ENOSYS;
}
#endif

const gang__comm_ops *gang__comm_ops_for(gang_comm_backend b)
{
    switch (b) {
    case GANG_COMM_SOCKET:
        return &gang__comm_socket_ops;
    case GANG_COMM_MPI:
#if GANG_HAVE_MPI
        if (gang__comm_mpi_plugin() != NULL)
            return gang__comm_mpi_plugin();
        return &comm_mpi_missing_ops;
#else
        return &comm_mpi_stub_ops;
#endif
    case GANG_COMM_NCCL:
#if COMM_NCCL_BUILT
        return &gang__comm_nccl_ops;
#else
        return &comm_nccl_stub_ops;
#endif
    }
    return NULL;
}

int gang_comm_backend_built(gang_comm_backend b)
{
    switch (b) {
    case GANG_COMM_SOCKET:
        return 1;
    case GANG_COMM_MPI:
        return GANG_HAVE_MPI ? 1 : 0;
    case GANG_COMM_NCCL:
        return COMM_NCCL_BUILT;
    }
    return 0;
}
