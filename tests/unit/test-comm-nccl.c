/*
 * cmocka tests of the nccl communicator backend.
 *
 * Without a GPU (CI): the registration, the bootstrap blob helper and the refusal of a bad
 * blob run; everything that needs a device calls skip() after saying why.
 * With one GPU: world = 1 (every collective and dtype, split, barrier, abort), and the
 * deadline machinery with a world of 2 where the second rank never comes: init returns
 * GANG_ETIMEDOUT at its deadline, and GANG_EABORTED promptly when another thread writes
 * the cancel fd. Aborting a collective from another thread (gang_comm_abort) needs two
 * ranks, hence two GPUs (NCCL refuses two ranks of one communicator on one device).
 * With two GPUs or more: 2 ranks as threads, one GPU each, every operation against values
 * computed here; an all-reduce captured into a CUDA graph and replayed (gang_comm_pend_on:
 * the settle after a replay waits for it, and fails at its deadline when the peer never
 * launched its replay); the same with rank 1 in another process (this binary run again
 * with --rank-process, as a gang's workers are processes); and a rank's process that exits
 * inside the communicator, which its peer's next collective reports.
 */
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ganglion/comm.h"
#include "ganglion/common.h"
#include "ganglion/kernels.h"

#define NEED_GPUS(n)                                                                               \
    do {                                                                                           \
        int have_ = gang_kernels_device_count();                                                   \
        if (have_ < (n)) {                                                                         \
            print_message("[  SKIP    ] needs %d GPU(s), %d visible (gang_kernels_device_"         \
                          "count)\n",                                                              \
                          (n), have_);                                                             \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

/* A "cuda" kernels handle on GPU dev: selects the device on this thread and gives pool
 * memory for the buffers. */
static gang_kernels *open_gpu(int dev)
{
    gang_kernels_options o;
    gang_kernels *k = NULL;

    gang_kernels_options_init(&o);
    o.device = "cuda";
    o.device_index = dev;
    o.pool_mb = 512;
    assert_int_equal(gang_kernels_open_opts(&o, &k), 0);
    return k;
}

static void make_blob(uint8_t *blob, size_t *len)
{
    assert_int_equal(gang_comm_nccl_unique_id(blob, 256, len), 0);
    assert_int_equal(*len, 256);
}

static gang_comm_config nccl_config(const uint8_t *blob, size_t len, uint32_t rank, uint32_t world,
                                    uint64_t tmo)
{
    gang_comm_config cfg;

    memset(&cfg, 0, sizeof(cfg));
    cfg.backend = GANG_COMM_NCCL;
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.blob = blob;
    cfg.blob_len = len;
    cfg.timeout_ms = tmo;
    return cfg;
}

/* ---------------------------------------------------------------------------------
 * No GPU needed.
 * --------------------------------------------------------------------------------- */
static void test_registry(void **state)
{
    uint8_t blob[256];
    size_t len = 0;
    gang_comm *c = (gang_comm *)blob;
    gang_comm_config cfg;

    (void)state;
    assert_true(gang_comm_backend_built(GANG_COMM_NCCL));
    assert_string_equal(gang_comm_backend_name(GANG_COMM_NCCL), "nccl");
    assert_int_equal(gang_comm_nccl_unique_id(blob, 255, &len), GANG_ERANGE);
    assert_int_equal(gang_comm_nccl_unique_id(NULL, 256, &len), GANG_EINVAL);
    /* A blob that is not 256 hex digits is refused before any device is touched. */
    memset(blob, 'z', sizeof(blob));
    cfg = nccl_config(blob, sizeof(blob), 0, 1, 1000);
    assert_int_equal(gang_comm_init(&cfg, &c), GANG_EINVAL);
    assert_null(c);
    cfg.blob_len = 17;
    assert_int_equal(gang_comm_init(&cfg, &c), GANG_EINVAL);
}

/* ncclGetUniqueId needs a network interface, not a GPU: where it works the blob is hex. */
static void test_unique_id_blob(void **state)
{
    uint8_t blob[300];
    size_t len = 0;
    int rc;

    (void)state;
    rc = gang_comm_nccl_unique_id(blob, sizeof(blob), &len);
    if (rc != 0) {
        print_message("[  SKIP    ] ncclGetUniqueId failed here (%s): no usable interface\n",
                      gang_err_name(rc));
        skip();
    }
    assert_int_equal(len, 256);
    for (size_t i = 0; i < len; i++)
        assert_non_null(strchr("0123456789abcdef", blob[i]));
}

/* Without a GPU a well-formed blob gets GANG_EIO, not a crash or a hang. */
static void test_no_gpu_init(void **state)
{
    uint8_t blob[256];
    size_t len = 0;
    gang_comm *c = NULL;
    gang_comm_config cfg;

    (void)state;
    if (gang_kernels_device_count() > 0) {
        print_message("[  SKIP    ] a GPU is present: the no-GPU refusal cannot be checked\n");
        skip();
    }
    memset(blob, 'a', sizeof(blob));
    len = sizeof(blob);
    cfg = nccl_config(blob, len, 0, 1, 1000);
    assert_int_equal(gang_comm_init(&cfg, &c), GANG_EIO);
    assert_null(c);
}

/* ---------------------------------------------------------------------------------
 * One GPU.
 * --------------------------------------------------------------------------------- */
static void test_world1(void **state)
{
    uint8_t blob[256];
    size_t len;
    gang_comm *c = NULL, *sub = NULL;
    gang_comm_config cfg;
    float host[1000], back[1000];
    int32_t ih[7] = {1, -2, 3, 2147483647, 0, 5, 6}, ib[7];
    void *d = NULL, *g = NULL;

    (void)state;
    NEED_GPUS(1);
    gang_kernels *k = open_gpu(0);
    make_blob(blob, &len);
    cfg = nccl_config(blob, len, 0, 1, 20000);
    assert_int_equal(gang_comm_init(&cfg, &c), 0);
    assert_int_equal(gang_comm_size(c), 1);
    assert_int_equal(gang_comm_caps(c), GANG_COMM_CAP_DEVICE_MEM);
    for (int i = 0; i < 1000; i++)
        host[i] = (float)i * 0.5f - 3.0f;
    assert_int_equal(gang_kernels_alloc(k, sizeof(host), &d), 0);
    assert_int_equal(gang_kernels_alloc(k, sizeof(host), &g), 0);
    assert_int_equal(gang_kernels_upload(k, d, host, sizeof(host)), 0);
    /* A sum over one rank is the identity, for every dtype (half values are finite in
     * their own format, so no NaN canonicalisation can change bits). */
    assert_int_equal(gang_comm_all_reduce(c, d, 1000, GANG_DTYPE_F32, 5000), 0);
    assert_int_equal(gang_kernels_download(k, back, d, sizeof(back)), 0);
    assert_memory_equal(back, host, sizeof(host));
    for (int dt = 0; dt < 2; dt++) {
        uint16_t hh[1000], hb[1000];
        gang_dtype t = dt == 0 ? GANG_DTYPE_F16 : GANG_DTYPE_BF16;

        for (int i = 0; i < 1000; i++)
            hh[i] = dt == 0 ? gang_f32_to_f16(host[i]) : gang_f32_to_bf16(host[i]);
        assert_int_equal(gang_kernels_upload(k, d, hh, sizeof(hh)), 0);
        assert_int_equal(gang_comm_all_reduce(c, d, 1000, t, 5000), 0);
        assert_int_equal(gang_kernels_download(k, hb, d, sizeof(hb)), 0);
        assert_memory_equal(hb, hh, sizeof(hh));
    }
    assert_int_equal(gang_kernels_upload(k, d, ih, sizeof(ih)), 0);
    assert_int_equal(gang_comm_all_reduce(c, d, 7, GANG_DTYPE_I32, 5000), 0);
    assert_int_equal(gang_comm_broadcast(c, d, 7, GANG_DTYPE_I32, 0, 5000), 0);
    assert_int_equal(gang_comm_all_gather(c, d, g, 7, GANG_DTYPE_I32, 5000), 0);
    assert_int_equal(gang_kernels_download(k, ib, g, sizeof(ib)), 0);
    assert_memory_equal(ib, ih, sizeof(ih));
    assert_int_equal(gang_comm_barrier(c, 5000), 0);
    /* Split into one group of one. */
    assert_int_equal(gang_comm_split(c, 3, 0, 20000, &sub), 0);
    assert_int_equal(gang_comm_size(sub), 1);
    assert_int_equal(gang_comm_rank(sub), 0);
    assert_int_equal(gang_comm_all_reduce(sub, d, 7, GANG_DTYPE_I32, 5000), 0);
    gang_comm_free(sub);
    /* Abort: every later operation answers GANG_EABORTED, free still works. */
    gang_comm_abort(c);
    assert_int_equal(gang_comm_all_reduce(c, d, 7, GANG_DTYPE_I32, 5000), GANG_EABORTED);
    assert_int_equal(gang_comm_async_error(c), GANG_EABORTED);
    gang_comm_free(c);
    gang_kernels_free(k, d);
    gang_kernels_free(k, g);
    gang_kernels_close(k);
}

/* A world of 2 where rank 1 never comes: the init deadline holds. */
static void test_init_deadline(void **state)
{
    uint8_t blob[256];
    size_t len;
    gang_comm *c = NULL;
    gang_comm_config cfg;

    (void)state;
    NEED_GPUS(1);
    gang_kernels *k = open_gpu(0);
    make_blob(blob, &len);
    cfg = nccl_config(blob, len, 0, 2, 700);
    uint64_t t0 = gang_now_ms();
    assert_int_equal(gang_comm_init(&cfg, &c), GANG_ETIMEDOUT);
    uint64_t took = gang_now_ms() - t0;
    print_message("init of a world of 2 without its peer: GANG_ETIMEDOUT after %llu ms\n",
                  (unsigned long long)took);
    assert_true(took >= 650 && took < 5000);
    assert_null(c);
    gang_kernels_close(k);
}

/* Stopping an init that waits for a peer: the cancel fd, written from another thread. */
typedef struct cancel_arg {
    int fd;
    int delay_ms;
} cancel_arg;

static void *cancel_later(void *p)
{
    cancel_arg *a = p;
    struct timespec ts = {a->delay_ms / 1000, (long)(a->delay_ms % 1000) * 1000000L};
    uint64_t one = 1;

    nanosleep(&ts, NULL);
    if (write(a->fd, &one, sizeof(one)) != (ssize_t)sizeof(one))
        abort();
    return NULL;
}

static void test_init_cancel(void **state)
{
    uint8_t blob[256];
    size_t len;
    gang_comm *c = NULL;
    gang_comm_config cfg;
    pthread_t th;
    cancel_arg ca;
    int fd;

    (void)state;
    NEED_GPUS(1);
    gang_kernels *k = open_gpu(0);
    make_blob(blob, &len);
    fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    assert_true(fd >= 0);
    cfg = nccl_config(blob, len, 0, 2, 30000);
    cfg.cancel_fd = &fd;
    ca = (cancel_arg){.fd = fd, .delay_ms = 300};
    assert_int_equal(pthread_create(&th, NULL, cancel_later, &ca), 0);
    uint64_t t0 = gang_now_ms();
    assert_int_equal(gang_comm_init(&cfg, &c), GANG_EABORTED);
    uint64_t took = gang_now_ms() - t0;
    pthread_join(th, NULL);
    print_message("init cancelled from another thread after %llu ms\n", (unsigned long long)took);
    assert_true(took >= 250 && took < 3000);
    assert_null(c);
    close(fd);
    gang_kernels_close(k);
}

typedef struct abort_arg {
    gang_comm *c;
    int delay_ms;
} abort_arg;

static void *abort_later(void *p)
{
    abort_arg *a = p;
    struct timespec ts = {a->delay_ms / 1000, (long)(a->delay_ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
    gang_comm_abort(a->c);
    return NULL;
}

/*
 * Abort from another thread while the driving thread waits inside a collective. The
 * collective waits because rank 1 of a world of 2 is this same process's second
 * communicator, which never joins the collective: initialised from a second thread so
 * that both ranks exist, then only rank 0 calls all_reduce.
 */
typedef struct rank_arg {
    const uint8_t *blob;
    size_t len;
    uint32_t rank;
    int dev;
    gang_comm *c;
    int rc;
} rank_arg;

static void *init_rank(void *p)
{
    rank_arg *a = p;
    gang_kernels_options o;
    gang_kernels *k = NULL;
    gang_comm_config cfg = nccl_config(a->blob, a->len, a->rank, 2, 30000);

    gang_kernels_options_init(&o);
    o.device = "cuda";
    o.device_index = a->dev;
    o.pool_mb = 256;
    a->rc = gang_kernels_open_opts(&o, &k);
    if (a->rc == 0)
        a->rc = gang_comm_init(&cfg, &a->c);
    gang_kernels_close(k); /* the device stays current on this thread; c keeps it */
    return NULL;
}

static void test_abort_in_collective(void **state)
{
    uint8_t blob[256];
    size_t len;
    pthread_t th[2], ab;
    rank_arg ra[2];
    abort_arg aa;
    void *d = NULL;

    (void)state;
    NEED_GPUS(2); /* two ranks of one communicator need two devices in NCCL */
    make_blob(blob, &len);
    for (uint32_t r = 0; r < 2; r++) {
        ra[r] = (rank_arg){.blob = blob, .len = len, .rank = r, .dev = (int)r};
        assert_int_equal(pthread_create(&th[r], NULL, init_rank, &ra[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    assert_int_equal(ra[0].rc, 0);
    assert_int_equal(ra[1].rc, 0);
    gang_kernels *k = open_gpu(0);
    assert_int_equal(gang_kernels_alloc(k, 4096, &d), 0);
    aa = (abort_arg){.c = ra[0].c, .delay_ms = 300};
    assert_int_equal(pthread_create(&ab, NULL, abort_later, &aa), 0);
    uint64_t t0 = gang_now_ms();
    assert_int_equal(gang_comm_all_reduce(ra[0].c, d, 1024, GANG_DTYPE_F32, 20000), GANG_EABORTED);
    uint64_t took = gang_now_ms() - t0;
    pthread_join(ab, NULL);
    print_message("abort from another thread ended the collective after %llu ms\n",
                  (unsigned long long)took);
    assert_true(took < 2000);
    gang_comm_abort(ra[1].c);
    gang_comm_free(ra[0].c);
    gang_comm_free(ra[1].c);
    gang_kernels_free(k, d);
    gang_kernels_close(k);
}

/* ---------------------------------------------------------------------------------
 * Two GPUs: two ranks as threads.
 * --------------------------------------------------------------------------------- */
typedef struct pair_arg {
    const uint8_t *blob;
    size_t len;
    uint32_t rank;
    int failed;
    char why[160];
} pair_arg;

#define PAIR_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf(a->why, sizeof(a->why), "rank %u: %s (line %d)", a->rank, #cond, __LINE__);   \
            a->failed = 1;                                                                         \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static void *pair_rank(void *p)
{
    pair_arg *a = p;
    gang_kernels_options o;
    gang_kernels *k = NULL;
    gang_comm *c = NULL, *sub = NULL;
    gang_comm_config cfg = nccl_config(a->blob, a->len, a->rank, 2, 30000);
    const size_t n = 1 << 20;
    float *h = malloc(n * sizeof(float)), *r = malloc(2 * n * sizeof(float));
    void *d = NULL, *g = NULL;
    uint16_t hb[16];

    gang_kernels_options_init(&o);
    o.device = "cuda";
    o.device_index = (int)a->rank;
    o.pool_mb = 512;
    PAIR_CHECK(h != NULL && r != NULL);
    PAIR_CHECK(gang_kernels_open_opts(&o, &k) == 0);
    PAIR_CHECK(gang_comm_init(&cfg, &c) == 0);
    PAIR_CHECK(gang_kernels_alloc(k, n * sizeof(float), &d) == 0);
    PAIR_CHECK(gang_kernels_alloc(k, 2 * n * sizeof(float), &g) == 0);
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(i % 1000) + (float)a->rank * 0.25f;
    PAIR_CHECK(gang_kernels_upload(k, d, h, n * sizeof(float)) == 0);
    PAIR_CHECK(gang_comm_all_gather(c, d, g, n, GANG_DTYPE_F32, 10000) == 0);
    PAIR_CHECK(gang_kernels_download(k, r, g, 2 * n * sizeof(float)) == 0);
    for (size_t i = 0; i < n; i++)
        PAIR_CHECK(r[i] == (float)(i % 1000) && r[n + i] == (float)(i % 1000) + 0.25f);
    PAIR_CHECK(gang_comm_all_reduce(c, d, n, GANG_DTYPE_F32, 10000) == 0);
    PAIR_CHECK(gang_kernels_download(k, r, d, n * sizeof(float)) == 0);
    for (size_t i = 0; i < n; i++)
        PAIR_CHECK(r[i] == 2.0f * (float)(i % 1000) + 0.25f);
    /* bf16: 1.5 + 2.5 = 4 exactly */
    for (size_t i = 0; i < 16; i++)
        hb[i] = gang_f32_to_bf16(a->rank == 0 ? 1.5f : 2.5f);
    PAIR_CHECK(gang_kernels_upload(k, d, hb, sizeof(hb)) == 0);
    PAIR_CHECK(gang_comm_all_reduce(c, d, 16, GANG_DTYPE_BF16, 10000) == 0);
    PAIR_CHECK(gang_kernels_download(k, hb, d, sizeof(hb)) == 0);
    for (size_t i = 0; i < 16; i++)
        PAIR_CHECK(gang_bf16_to_f32(hb[i]) == 4.0f);
    PAIR_CHECK(gang_comm_broadcast(c, d, n, GANG_DTYPE_I32, 1, 10000) == 0);
    PAIR_CHECK(gang_comm_barrier(c, 10000) == 0);
    /* point-to-point both ways, and an empty token */
    if (a->rank == 0) {
        PAIR_CHECK(gang_comm_send(c, d, 4096, 1, 7, 10000) == 0);
        PAIR_CHECK(gang_comm_recv(c, g, 0, 1, 8, 10000) == 0);
    } else {
        PAIR_CHECK(gang_comm_recv(c, g, 4096, 0, 7, 10000) == 0);
        PAIR_CHECK(gang_comm_send(c, d, 0, 0, 8, 10000) == 0);
    }
    /* each rank alone in its own group */
    PAIR_CHECK(gang_comm_split(c, a->rank, 0, 20000, &sub) == 0);
    PAIR_CHECK(gang_comm_size(sub) == 1);
    PAIR_CHECK(gang_comm_all_reduce(sub, d, 16, GANG_DTYPE_BF16, 10000) == 0);
out:
    gang_comm_free(sub);
    gang_comm_free(c);
    if (k != NULL) {
        gang_kernels_free(k, d);
        gang_kernels_free(k, g);
    }
    gang_kernels_close(k);
    free(h);
    free(r);
    return NULL;
}

static void test_two_ranks(void **state)
{
    uint8_t blob[256];
    size_t len;
    pthread_t th[2];
    pair_arg pa[2];

    (void)state;
    NEED_GPUS(2);
    make_blob(blob, &len);
    for (uint32_t r = 0; r < 2; r++) {
        pa[r] = (pair_arg){.blob = blob, .len = len, .rank = r};
        assert_int_equal(pthread_create(&th[r], NULL, pair_rank, &pa[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++)
        if (pa[r].failed)
            fail_msg("%s", pa[r].why);
}

/*
 * A collective captured into a CUDA graph (the decode step's TP all-reduces, issue #24): each
 * rank captures order_after + all-reduce of a blocking group (a split child) + a scale
 * kernel, then replays it three rounds on fresh inputs; after each launch gang_comm_pend_on
 * hands the replay to gang_comm_settle, and the result is the rounds' mean. Then rank 1
 * does not launch its fourth replay: rank 0's settle must fail at its 300 ms deadline, not
 * return 0 with its stream still waiting for the peer (the NCCL stream itself is idle: the
 * replay runs on the caller's stream).
 */
typedef struct graph_arg {
    pair_arg p;             /* blob, rank and the failure, as a pair's (PAIR_CHECK) */
    pthread_barrier_t *bar; /* rank 1 leaves once rank 0 has its settle's answer */
    int settle_rc;          /* rank 0: the failed round's settle */
    uint64_t settle_ms;
} graph_arg;

static void *graph_rank(void *p)
{
    graph_arg *ga = p;
    pair_arg *a = &ga->p;
    gang_kernels_options o;
    gang_kernels *k = NULL;
    gang_kernels_graph *g = NULL;
    gang_comm *c = NULL, *tp = NULL;
    gang_comm_config cfg = nccl_config(a->blob, a->len, a->rank, 2, 30000);
    enum { N = 4096 };
    float h[N], r[N];
    void *d = NULL, *stream;
    int in_bar = 0;

    gang_kernels_options_init(&o);
    o.device = "cuda";
    o.device_index = (int)a->rank;
    o.pool_mb = 64;
    PAIR_CHECK(gang_kernels_open_opts(&o, &k) == 0);
    PAIR_CHECK(gang_comm_init(&cfg, &c) == 0);
    PAIR_CHECK(gang_comm_split(c, 0, a->rank, 20000, &tp) == 0);
    PAIR_CHECK(gang_comm_graph_ok(tp) == 1);
    PAIR_CHECK(gang_kernels_alloc(k, sizeof(h), &d) == 0);
    stream = gang_kernels_device_stream(k);
    PAIR_CHECK(stream != NULL);
    PAIR_CHECK(gang_kernels_graph_begin(k) == 0);
    PAIR_CHECK(gang_comm_order_after(tp, stream) == 0);
    PAIR_CHECK(gang_comm_all_reduce(tp, d, N, GANG_DTYPE_F32, 10000) == 0);
    PAIR_CHECK(gang_kernels_scale(k, d, 0.5f, N) == 0);
    PAIR_CHECK(gang_kernels_graph_end(k, &g) == 0);
    PAIR_CHECK(gang_comm_settle(tp, 10000) == 0); /* the capture ran nothing */
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < N; i++)
            h[i] = (float)(i % 97) + (float)(a->rank * 8 + round);
        PAIR_CHECK(gang_kernels_upload(k, d, h, sizeof(h)) == 0);
        PAIR_CHECK(gang_kernels_graph_launch(k, g) == 0);
        PAIR_CHECK(gang_comm_pend_on(tp, stream) == 0);
        PAIR_CHECK(gang_comm_settle(tp, 10000) == 0);
        PAIR_CHECK(gang_kernels_download(k, r, d, sizeof(r)) == 0);
        for (size_t i = 0; i < N; i++) /* ((x + 8 r0 + k) + (x + 8 + k)) / 2 */
            PAIR_CHECK(r[i] == (float)(i % 97) + 4.0f + (float)round);
    }
    if (a->rank == 0) {
        PAIR_CHECK(gang_kernels_graph_launch(k, g) == 0);
        PAIR_CHECK(gang_comm_pend_on(tp, stream) == 0);
        uint64_t t0 = gang_now_ms();
        ga->settle_rc = gang_comm_settle(tp, 300);
        ga->settle_ms = gang_now_ms() - t0;
    }
    in_bar = 1;
    pthread_barrier_wait(ga->bar);
out:
    if (!in_bar)
        pthread_barrier_wait(ga->bar);
    if (tp != NULL)
        gang_comm_abort(tp);
    if (c != NULL)
        gang_comm_abort(c);
    gang_comm_free(tp);
    gang_comm_free(c);
    if (k != NULL) {
        gang_kernels_sync(k); /* the replay ends once its collective failed */
        gang_kernels_graph_free(k, g);
        gang_kernels_free(k, d);
    }
    gang_kernels_close(k);
    return NULL;
}

static void test_graph_replay(void **state)
{
    uint8_t blob[256];
    size_t len;
    pthread_t th[2];
    pthread_barrier_t bar;
    graph_arg ga[2];

    (void)state;
    NEED_GPUS(2);
    make_blob(blob, &len);
    assert_int_equal(pthread_barrier_init(&bar, NULL, 2), 0);
    for (uint32_t r = 0; r < 2; r++) {
        ga[r] = (graph_arg){.p = {.blob = blob, .len = len, .rank = r}, .bar = &bar};
        assert_int_equal(pthread_create(&th[r], NULL, graph_rank, &ga[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&bar);
    for (int r = 0; r < 2; r++)
        if (ga[r].p.failed)
            fail_msg("%s", ga[r].p.why);
    print_message("3 replays of a captured all-reduce gave the mean; a replay whose peer never "
                  "launched: settle %s after %llu ms (deadline 300)\n",
                  gang_err_name(ga[0].settle_rc), (unsigned long long)ga[0].settle_ms);
    assert_int_equal(ga[0].settle_rc, GANG_ETIMEDOUT);
    assert_true(ga[0].settle_ms >= 250 && ga[0].settle_ms < 3000);
}

/* ---------------------------------------------------------------------------------
 * Two GPUs: rank 1 in another process.
 * --------------------------------------------------------------------------------- */
extern char **environ;

/* Runs this binary again as rank 1 of the blob's world in role ("pair": pair_rank's
 * operations; "exit": init, then exit at once) and returns its pid. */
static pid_t spawn_rank(const char *role, const uint8_t *blob, size_t len)
{
    char hex[257], name[] = "test-comm-nccl", flag[] = "--rank-process", r[16];
    char *argv[] = {name, flag, r, hex, NULL};
    pid_t pid;

    assert_true(len < sizeof(hex));
    snprintf(r, sizeof(r), "%s", role);
    memcpy(hex, blob, len);
    hex[len] = '\0';
    assert_int_equal(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ), 0);
    return pid;
}

/* The exit status of pid within timeout_ms (killed and -1 past it). */
static int reap(pid_t pid, uint64_t timeout_ms)
{
    uint64_t end = gang_now_ms() + timeout_ms;
    int st;

    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (gang_now_ms() >= end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        usleep(10000);
    }
}

/* The child's side: exit status 0 when its role went as it should. */
static int rank_process(const char *role, const char *hex)
{
    size_t len = strlen(hex);

    if (strcmp(role, "pair") == 0) {
        pair_arg a = {.blob = (const uint8_t *)hex, .len = len, .rank = 1};

        pair_rank(&a);
        if (a.failed)
            fprintf(stderr, "rank process: %s\n", a.why);
        return a.failed;
    }
    if (strcmp(role, "exit") == 0) {
        rank_arg a = {.blob = (const uint8_t *)hex, .len = len, .rank = 1, .dev = 1};

        init_rank(&a);
        _exit(a.rc == 0 ? 0 : 3); /* no free, no abort: as a process that dies */
    }
    return 2;
}

static void test_two_processes(void **state)
{
    uint8_t blob[256];
    size_t len;
    pair_arg a;

    (void)state;
    NEED_GPUS(2);
    make_blob(blob, &len);
    pid_t pid = spawn_rank("pair", blob, len);
    a = (pair_arg){.blob = blob, .len = len, .rank = 0};
    pair_rank(&a);
    int st = reap(pid, 60000);
    if (a.failed)
        fail_msg("%s", a.why);
    assert_int_equal(st, 0);
}

/* Rank 1's process exits right after init; rank 0's all-reduce then fails, before its
 * deadline, and the communicator is freed. */
static void test_peer_process_exits(void **state)
{
    uint8_t blob[256];
    size_t len;
    rank_arg ra;
    void *d = NULL;

    (void)state;
    NEED_GPUS(2);
    make_blob(blob, &len);
    pid_t pid = spawn_rank("exit", blob, len);
    ra = (rank_arg){.blob = blob, .len = len, .rank = 0, .dev = 0};
    init_rank(&ra);
    assert_int_equal(ra.rc, 0);
    assert_int_equal(reap(pid, 30000), 0);
    gang_kernels *k = open_gpu(0);
    assert_int_equal(gang_kernels_alloc(k, 4096, &d), 0);
    uint64_t t0 = gang_now_ms();
    int rc = gang_comm_all_reduce(ra.c, d, 1024, GANG_DTYPE_F32, 20000);
    uint64_t took = gang_now_ms() - t0;
    print_message("the peer's process exited: all_reduce -> %s after %llu ms\n", gang_err_name(rc),
                  (unsigned long long)took);
    assert_true(rc < 0);
    assert_true(took < 25000);
    gang_comm_free(ra.c);
    gang_kernels_free(k, d);
    gang_kernels_close(k);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--rank-process") == 0)
        return rank_process(argv[2], argv[3]);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_unique_id_blob),
        cmocka_unit_test(test_no_gpu_init),
        cmocka_unit_test(test_world1),
        cmocka_unit_test(test_init_deadline),
        cmocka_unit_test(test_init_cancel),
        cmocka_unit_test(test_abort_in_collective),
        cmocka_unit_test(test_two_ranks),
        cmocka_unit_test(test_graph_replay),
        cmocka_unit_test(test_two_processes),
        cmocka_unit_test(test_peer_process_exits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
