/*
 * cmocka tests of the mpi communicator backend under a real mpirun (Open MPI). CTest runs
 * `mpiexec -np 3 test-comm-mpi`; every rank runs the same tests in the same order, since
 * each one is a sequence of collective calls. The identity comes from Open MPI's
 * OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE, as it does for `ganglion serve` under
 * mpirun, and the backend initialises MPI itself (this file never includes <mpi.h>).
 *
 * Output: rank 0 prints cmocka's report; the other ranks discard cmocka's progress lines
 * (stdout) but keep its failure messages (stderr), so a failure on any rank is visible
 * without tripling the log. Before exiting, the ranks sum their failure counts with an
 * all_reduce on a communicator kept healthy for that purpose, and every rank exits 1 if
 * any rank failed: mpiexec's exit status therefore reflects every rank.
 *
 * The deadline test runs last: after GANG_ETIMEDOUT the timed-out all_reduce is still in
 * flight inside MPI (collectives cannot be cancelled), so its communicator is never used
 * again and no rank makes another call on it. Only the tally communicator, a separate
 * duplicate of MPI_COMM_WORLD, is used afterwards; MPI matches collectives per
 * communicator, so the stale request cannot capture the tally.
 *
 * Exit status 77 (skipped) when the binary was not started by Open MPI's mpirun or MPI
 * cannot start.
 */
#include <math.h> /* NAN only: the test links no libm */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm-a2a-check.h"
#include "ganglion/comm.h"

/* Deadline of operations that must succeed: generous, a failure shows as a timeout. */
#define TMO_OK 30000u
/* Deadline of the operation that must time out, and how late the timeout may come. */
#define TMO_SHORT 300u
#define LATE_SLACK_MS 250u
/* When the abort thread fires, and how promptly the blocked operation must return. */
#define ABORT_AFTER_MS 100u
#define ABORT_PROMPT_MS 100u

static uint32_t g_rank;
static uint32_t g_size;
static gang_comm *g_comm; /* the communicator under test; unusable after the deadline test */

static const gang_dtype all_dtypes[] = {GANG_DTYPE_F32, GANG_DTYPE_F16, GANG_DTYPE_BF16,
                                        GANG_DTYPE_I32};
static const size_t all_counts[] = {1, 3, 1001, (size_t)1 << 20};

/* ---------------------------------------------------------------------------------
 * Element access: the reference works in double; f16 and bf16 are converted here with
 * round-to-nearest-even so that the test does not depend on the code under test.
 * --------------------------------------------------------------------------------- */

/* Bit-level conversions: the test links no libm. */
static float bits_to_float(uint32_t x)
{
    float f;

    memcpy(&f, &x, sizeof(f));
    return f;
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 31u;
    uint32_t mant = h & 1023u;
    float f;

    if (exp == 0) {
        f = (float)mant / 16777216.0f; /* subnormal: mant * 2^-24, exact */
        return sign ? -f : f;
    }
    if (exp == 31)
        return bits_to_float(sign | 0x7f800000u | (mant << 13));
    return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

static uint16_t float_to_half(float f)
{
    uint32_t x;
    uint16_t sign;

    memcpy(&x, &f, sizeof(x));
    sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u)
        return (uint16_t)(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u));
    if (x >= 0x477ff000u) /* rounds to beyond 65504 */
        return (uint16_t)(sign | 0x7c00u);
    if (x <= 0x33000000u) /* at most 2^-25: rounds to zero (a tie goes to even 0) */
        return sign;
    if (x < 0x38800000u) { /* subnormal half: value / 2^-24 rounded to nearest even */
        uint32_t m = (x & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - (x >> 23);
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);

        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    x += 0xfffu + ((x >> 13) & 1u);
    return (uint16_t)(sign | ((x - 0x38000000u) >> 13));
}

static float bf16_to_float(uint16_t h)
{
    return bits_to_float((uint32_t)h << 16);
}

static uint16_t float_to_bf16(float f)
{
    uint32_t x;

    memcpy(&x, &f, sizeof(x));
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static void put_value(void *buf, size_t i, gang_dtype dt, double v)
{
    switch (dt) {
    case GANG_DTYPE_F32:
        ((float *)buf)[i] = (float)v;
        break;
    case GANG_DTYPE_F16:
        ((uint16_t *)buf)[i] = float_to_half((float)v);
        break;
    case GANG_DTYPE_BF16:
        ((uint16_t *)buf)[i] = float_to_bf16((float)v);
        break;
    case GANG_DTYPE_I32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    }
}

static double get_value(const void *buf, size_t i, gang_dtype dt)
{
    switch (dt) {
    case GANG_DTYPE_F32:
        return ((const float *)buf)[i];
    case GANG_DTYPE_F16:
        return half_to_float(((const uint16_t *)buf)[i]);
    case GANG_DTYPE_BF16:
        return bf16_to_float(((const uint16_t *)buf)[i]);
    case GANG_DTYPE_I32:
        return ((const int32_t *)buf)[i];
    }
    return NAN;
}

/*
 * The value rank r contributes at index i: small integers in [-8, 8], so that every sum
 * over up to 16 ranks is exact in every dtype (bf16 holds integers up to 256 exactly) and
 * the result cannot depend on MPI's reduction order.
 */
static double value_of(uint32_t r, size_t i)
{
    return (double)((int)((i * 7u + (size_t)r * 13u) % 17u) - 8);
}

/* Allocates count elements of dt, failing the test on exhaustion. */
static void *alloc_elems(size_t count, gang_dtype dt)
{
    void *p = calloc(count == 0 ? 1 : count, gang_dtype_size(dt));

    assert_non_null(p);
    return p;
}

/* ---------------------------------------------------------------------------------
 * Tests.
 * --------------------------------------------------------------------------------- */

static void test_identity(void **state)
{
    (void)state;
    assert_int_equal(gang_comm_rank(g_comm), g_rank);
    assert_int_equal(gang_comm_size(g_comm), g_size);
    assert_int_equal(gang_comm_backend_of(g_comm), GANG_COMM_MPI);
    assert_int_equal(gang_comm_caps(g_comm), GANG_COMM_CAP_HOST_MEM | GANG_COMM_CAP_TAGS);
    assert_int_equal(gang_comm_async_error(g_comm), 0);
}

/* all_reduce of every dtype and size class against the exact reference. */
static void test_all_reduce(void **state)
{
    size_t d, k, i;

    (void)state;
    for (d = 0; d < sizeof(all_dtypes) / sizeof(all_dtypes[0]); d++) {
        for (k = 0; k < sizeof(all_counts) / sizeof(all_counts[0]); k++) {
            gang_dtype dt = all_dtypes[d];
            size_t count = all_counts[k];
            void *buf = alloc_elems(count, dt);
            size_t bad = 0;

            for (i = 0; i < count; i++)
                put_value(buf, i, dt, value_of(g_rank, i));
            assert_int_equal(gang_comm_all_reduce(g_comm, buf, count, dt, TMO_OK), 0);
            for (i = 0; i < count; i++) {
                double want = 0;
                uint32_t r;

                for (r = 0; r < g_size; r++)
                    want += value_of(r, i);
                if (get_value(buf, i, dt) != want && bad++ < 5)
                    print_error("all_reduce %s n=%zu [%zu]: got %g want %g\n", gang_dtype_name(dt),
                                count, i, get_value(buf, i, dt), want);
            }
            free(buf);
            assert_int_equal(bad, 0);
        }
    }
}

/*
 * f32 all_reduce of inexact values: within rounding of the reference, and bitwise
 * identical on every rank (checked by gathering every rank's result).
 */
static void test_all_reduce_f32_inexact(void **state)
{
    const size_t count = 4099;
    float *buf = alloc_elems(count, GANG_DTYPE_F32);
    float *all = alloc_elems(count * g_size, GANG_DTYPE_F32);
    size_t i;
    uint32_t r;

    (void)state;
    for (i = 0; i < count; i++)
        buf[i] = (float)((i * 2654435761u + g_rank * 97u) % 10007u) / 997.0f;
    assert_int_equal(gang_comm_all_reduce(g_comm, buf, count, GANG_DTYPE_F32, TMO_OK), 0);
    for (i = 0; i < count; i++) {
        double want = 0;
        double diff;

        for (r = 0; r < g_size; r++)
            want += (float)((i * 2654435761u + r * 97u) % 10007u) / 997.0f;
        diff = buf[i] - want;
        assert_true((diff < 0 ? -diff : diff) <= 1e-5 * (want < 0 ? -want : want) + 1e-6);
    }
    assert_int_equal(gang_comm_all_gather(g_comm, buf, all, count, GANG_DTYPE_F32, TMO_OK), 0);
    for (r = 0; r < g_size; r++)
        assert_memory_equal(all + (size_t)r * count, buf, count * sizeof(float));
    free(all);
    free(buf);
}

/* all_gather of every dtype and size class, out of place and in place. */
static void test_all_gather(void **state)
{
    size_t d, k, i;
    int in_place;

    (void)state;
    for (in_place = 0; in_place < 2; in_place++) {
        for (d = 0; d < sizeof(all_dtypes) / sizeof(all_dtypes[0]); d++) {
            for (k = 0; k < sizeof(all_counts) / sizeof(all_counts[0]); k++) {
                gang_dtype dt = all_dtypes[d];
                size_t count = all_counts[k];
                size_t esize = gang_dtype_size(dt);
                void *recv = alloc_elems(count * g_size, dt);
                void *send =
                    in_place ? (char *)recv + g_rank * count * esize : alloc_elems(count, dt);
                size_t bad = 0;
                uint32_t r;

                for (i = 0; i < count; i++)
                    put_value(send, i, dt, value_of(g_rank, i));
                assert_int_equal(gang_comm_all_gather(g_comm, send, recv, count, dt, TMO_OK), 0);
                for (r = 0; r < g_size; r++)
                    for (i = 0; i < count; i++)
                        if (get_value(recv, r * count + i, dt) != value_of(r, i))
                            bad++;
                if (!in_place)
                    free(send);
                free(recv);
                assert_int_equal(bad, 0);
            }
        }
    }
}

/* broadcast from every root, every dtype and size class. */
static void test_broadcast(void **state)
{
    size_t d, k, i;
    uint32_t root;

    (void)state;
    for (root = 0; root < g_size; root++) {
        for (d = 0; d < sizeof(all_dtypes) / sizeof(all_dtypes[0]); d++) {
            for (k = 0; k < sizeof(all_counts) / sizeof(all_counts[0]); k++) {
                gang_dtype dt = all_dtypes[d];
                size_t count = all_counts[k];
                void *buf = alloc_elems(count, dt);
                size_t bad = 0;

                for (i = 0; i < count; i++)
                    put_value(buf, i, dt, value_of(g_rank == root ? root : 99, i) + 0.0);
                assert_int_equal(gang_comm_broadcast(g_comm, buf, count, dt, root, TMO_OK), 0);
                for (i = 0; i < count; i++)
                    if (get_value(buf, i, dt) != value_of(root, i))
                        bad++;
                free(buf);
                assert_int_equal(bad, 0);
            }
        }
    }
}

/*
 * Tagged point-to-point in a ring: every rank sends two small messages to its right
 * neighbour, tag 1 then tag 2, and receives from its left neighbour tag 2 first. The
 * messages are small so that MPI sends them eagerly: a blocking send of a large message
 * completes only once it is matched, and receiving in reverse order would then deadlock
 * (with any backend that does not buffer whole messages).
 */
static void test_send_recv_ring_reverse_tags(void **state)
{
    uint32_t right = (g_rank + 1) % g_size;
    uint32_t left = (g_rank + g_size - 1) % g_size;
    uint8_t a[64], b[1000], ra[64], rb[1000];
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(a); i++)
        a[i] = (uint8_t)(g_rank * 31u + i);
    for (i = 0; i < sizeof(b); i++)
        b[i] = (uint8_t)(g_rank * 17u + i * 3u);
    assert_int_equal(gang_comm_send(g_comm, a, sizeof(a), right, 1, TMO_OK), 0);
    assert_int_equal(gang_comm_send(g_comm, b, sizeof(b), right, 2, TMO_OK), 0);
    assert_int_equal(gang_comm_recv(g_comm, rb, sizeof(rb), left, 2, TMO_OK), 0);
    assert_int_equal(gang_comm_recv(g_comm, ra, sizeof(ra), left, 1, TMO_OK), 0);
    for (i = 0; i < sizeof(ra); i++)
        assert_int_equal(ra[i], (uint8_t)(left * 31u + i));
    for (i = 0; i < sizeof(rb); i++)
        assert_int_equal(rb[i], (uint8_t)(left * 17u + i * 3u));
}

/*
 * A 4 MiB message around the ring (far beyond the eager limit): even ranks send first,
 * odd ranks receive first, so that the blocking sends cannot all wait on each other.
 */
static void test_send_recv_ring_large(void **state)
{
    const size_t bytes = (size_t)4 << 20;
    uint32_t right = (g_rank + 1) % g_size;
    uint32_t left = (g_rank + g_size - 1) % g_size;
    uint8_t *out = malloc(bytes);
    uint8_t *in = malloc(bytes);
    size_t i, bad = 0;

    (void)state;
    assert_non_null(out);
    assert_non_null(in);
    for (i = 0; i < bytes; i++)
        out[i] = (uint8_t)(i * 13u + g_rank);
    if (g_rank % 2 == 0) {
        assert_int_equal(gang_comm_send(g_comm, out, bytes, right, 7, TMO_OK), 0);
        assert_int_equal(gang_comm_recv(g_comm, in, bytes, left, 7, TMO_OK), 0);
    } else {
        assert_int_equal(gang_comm_recv(g_comm, in, bytes, left, 7, TMO_OK), 0);
        assert_int_equal(gang_comm_send(g_comm, out, bytes, right, 7, TMO_OK), 0);
    }
    for (i = 0; i < bytes; i++)
        if (in[i] != (uint8_t)(i * 13u + left))
            bad++;
    free(in);
    free(out);
    assert_int_equal(bad, 0);
}

/* Arguments MPI cannot carry are refused locally, before any communication. */
static void test_ranges(void **state)
{
    uint8_t x = 0;
    gang_comm *child = NULL;

    (void)state;
    assert_int_equal(gang_comm_send(g_comm, &x, 1, (g_rank + 1) % g_size, UINT32_MAX, TMO_OK),
                     GANG_ERANGE);
    assert_int_equal(gang_comm_recv(g_comm, &x, 1, (g_rank + 1) % g_size, UINT32_MAX, TMO_OK),
                     GANG_ERANGE);
    assert_int_equal(gang_comm_split(g_comm, UINT32_MAX, 0, TMO_OK, &child), GANG_ERANGE);
    assert_null(child);
}

/*
 * A message of the wrong size is GANG_EPROTO, longer (MPI truncation) and shorter alike.
 * Runs on a private split so that the errors it records stay out of g_comm.
 */
static void test_size_mismatch(void **state)
{
    uint32_t right = (g_rank + 1) % g_size;
    uint32_t left = (g_rank + g_size - 1) % g_size;
    uint8_t big[100], small[32], want[64];
    gang_comm *c = NULL;

    (void)state;
    memset(big, 1, sizeof(big));
    memset(small, 2, sizeof(small));
    assert_int_equal(gang_comm_split(g_comm, 0, g_rank, TMO_OK, &c), 0);
    assert_int_equal(gang_comm_send(c, big, sizeof(big), right, 3, TMO_OK), 0);
    assert_int_equal(gang_comm_send(c, small, sizeof(small), right, 4, TMO_OK), 0);
    assert_int_equal(gang_comm_recv(c, want, sizeof(want), left, 3, TMO_OK), GANG_EPROTO);
    assert_int_equal(gang_comm_recv(c, want, sizeof(want), left, 4, TMO_OK), GANG_EPROTO);
    assert_int_equal(gang_comm_barrier(c, TMO_OK), 0);
    gang_comm_free(c);
}

/* A barrier holds every rank until the last one (rank 0, 200 ms late) arrives. */
/* All-to-all(v) over MPI_Ialltoallv: the shared conformance checks (tests/unit/comm-a2a-check.c).
 */
static void test_all_to_all_v(void **state)
{
    char why[256] = "";
    int rc;

    (void)state;
    rc = gang_test_a2a_check(g_comm, 1, why, sizeof(why));
    if (rc != 0)
        fail_msg("all_to_all_v: %s", why);
}

static void test_barrier(void **state)
{
    uint64_t t0;

    (void)state;
    assert_int_equal(gang_comm_barrier(g_comm, TMO_OK), 0);
    t0 = gang_now_ms();
    if (g_rank == 0)
        gang_sleep_ms(200);
    assert_int_equal(gang_comm_barrier(g_comm, TMO_OK), 0);
    assert_true(gang_now_ms() - t0 >= 150);
}

/*
 * Split into two colors (rank parity) with keys that reverse the parent order: the child
 * ranks follow the keys, and collectives stay inside a color.
 */
static void test_split(void **state)
{
    uint32_t color = g_rank % 2;
    uint32_t members = 0, pos = 0, r;
    gang_comm *c = NULL;
    int32_t sum;
    int32_t want = 0;

    (void)state;
    for (r = 0; r < g_size; r++) {
        if (r % 2 != color)
            continue;
        members++;
        want += (int32_t)r;
        if (r > g_rank)
            pos++;
    }
    assert_int_equal(gang_comm_split(g_comm, color, g_size - g_rank, TMO_OK, &c), 0);
    assert_int_equal(gang_comm_size(c), members);
    assert_int_equal(gang_comm_rank(c), pos);
    sum = (int32_t)g_rank;
    assert_int_equal(gang_comm_all_reduce(c, &sum, 1, GANG_DTYPE_I32, TMO_OK), 0);
    assert_int_equal(sum, want);
    assert_int_equal(gang_comm_barrier(c, TMO_OK), 0);
    gang_comm_free(c);
}

typedef struct abort_arg {
    gang_comm *comm;
    uint64_t fired_ms; /* when gang_comm_abort() was called */
} abort_arg;

static void *abort_later(void *p)
{
    abort_arg *a = p;

    gang_sleep_ms(ABORT_AFTER_MS);
    a->fired_ms = gang_now_ms();
    gang_comm_abort(a->comm);
    return NULL;
}

/*
 * gang_comm_abort() from another thread ends a blocked operation promptly: every rank but
 * the last blocks in an all_reduce the last rank never joins, the last rank blocks in a
 * recv nobody sends. The abort makes no MPI call (it only sets the flag the waiting
 * thread polls), so it needs no MPI_THREAD_MULTIPLE and runs at every thread level.
 */
static void test_abort_from_thread(void **state)
{
    abort_arg a;
    pthread_t th;
    gang_comm *c = NULL;
    float x = 1.0f;
    int rc;

    (void)state;
    assert_int_equal(gang_comm_split(g_comm, 0, g_rank, TMO_OK, &c), 0);
    a.comm = c;
    a.fired_ms = 0;
    assert_int_equal(pthread_create(&th, NULL, abort_later, &a), 0);
    if (g_rank + 1 < g_size)
        rc = gang_comm_all_reduce(c, &x, 1, GANG_DTYPE_F32, TMO_OK);
    else
        rc = gang_comm_recv(c, &x, sizeof(x), 0, 5, TMO_OK);
    pthread_join(th, NULL);
    assert_int_equal(rc, GANG_EABORTED);
    assert_true(gang_now_ms() - a.fired_ms < ABORT_PROMPT_MS);
    /* Every later operation fails at once, without communicating. */
    assert_int_equal(gang_comm_barrier(c, TMO_OK), GANG_EABORTED);
    gang_comm_free(c);
}

/*
 * Deadline: the last rank skips one all_reduce, so every other rank returns GANG_ETIMEDOUT
 * within its deadline. Must be the last test on g_comm (see the file comment).
 */
static void test_deadline_last(void **state)
{
    float x = 1.0f;
    uint64_t t0, took;

    (void)state;
    if (g_rank + 1 == g_size)
        return; /* Skips the all_reduce on purpose; makes no further call on g_comm. */
    t0 = gang_now_ms();
    assert_int_equal(gang_comm_all_reduce(g_comm, &x, 1, GANG_DTYPE_F32, TMO_SHORT),
                     GANG_ETIMEDOUT);
    took = gang_now_ms() - t0;
    assert_true(took >= TMO_SHORT);
    assert_true(took < TMO_SHORT + LATE_SLACK_MS);
}

/* Reads a non-negative decimal from the environment; -1 when absent or malformed. */
static int64_t env_u32(const char *name)
{
    const char *s = getenv(name);
    int64_t v = -1;

    if (s == NULL || gang_parse_i64(s, 0, UINT32_MAX, &v) != 0)
        return -1;
    return v;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_all_reduce),
        cmocka_unit_test(test_all_reduce_f32_inexact),
        cmocka_unit_test(test_all_gather),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_send_recv_ring_reverse_tags),
        cmocka_unit_test(test_send_recv_ring_large),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_size_mismatch),
        cmocka_unit_test(test_all_to_all_v),
        cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_abort_from_thread),
        cmocka_unit_test(test_deadline_last),
    };
    gang_comm_config cfg;
    gang_comm *tally = NULL;
    gang_comm *probe = NULL;
    int64_t rank = env_u32("OMPI_COMM_WORLD_RANK");
    int64_t size = env_u32("OMPI_COMM_WORLD_SIZE");
    int32_t failed;
    int rc;

    if (!gang_comm_backend_built(GANG_COMM_MPI)) {
        printf("test-comm-mpi: skipped: the mpi backend is not built into this binary\n");
        return 77;
    }
    if (rank < 0 || size < 2 || rank >= size) {
        printf("test-comm-mpi: skipped: run under Open MPI's mpiexec with at least 2 ranks "
               "(OMPI_COMM_WORLD_RANK/SIZE not set)\n");
        return 77;
    }
    g_rank = (uint32_t)rank;
    g_size = (uint32_t)size;
    gang_log_set_identity(-1, (int)rank);

    /* A launcher that disagrees with MPI about the world is refused (this also starts MPI,
     * which must survive the refusal). */
    memset(&cfg, 0, sizeof(cfg));
    cfg.backend = GANG_COMM_MPI;
    cfg.rank = g_rank;
    cfg.world_size = g_size + 1;
    cfg.timeout_ms = TMO_OK;
    rc = gang_comm_init(&cfg, &probe);
    if (rc == GANG_EIO) {
        printf("test-comm-mpi: skipped: MPI cannot start here\n");
        return 77;
    }
    failed = rc == GANG_EINVAL ? 0 : 1;
    if (rc != GANG_EINVAL)
        fprintf(stderr, "rank %u: init with a wrong world size returned %s, want GANG_EINVAL\n",
                (unsigned)g_rank, gang_err_name(rc));
    if (rc == 0)
        gang_comm_free(probe);

    cfg.world_size = g_size;
    rc = gang_comm_init(&cfg, &tally);
    if (rc == 0)
        rc = gang_comm_init(&cfg, &g_comm);
    if (rc != 0) {
        fprintf(stderr, "rank %u: gang_comm_init(mpi) failed: %s\n", (unsigned)g_rank,
                gang_err_name(rc));
        return 1;
    }

    if (g_rank != 0 && freopen("/dev/null", "w", stdout) == NULL)
        fprintf(stderr, "rank %u: cannot silence stdout\n", (unsigned)g_rank);
    failed += (int32_t)cmocka_run_group_tests_name("comm-mpi", tests, NULL, NULL);

    /* The failure count of every rank, summed on the communicator kept healthy for it. */
    rc = gang_comm_all_reduce(tally, &failed, 1, GANG_DTYPE_I32, TMO_OK);
    if (rc != 0) {
        fprintf(stderr, "rank %u: tally all_reduce failed: %s\n", (unsigned)g_rank,
                gang_err_name(rc));
        failed = 1;
    }
    if (g_rank == 0)
        printf("test-comm-mpi: %d failure(s) over %u ranks\n", (int)failed, (unsigned)g_size);
    fflush(stdout);
    gang_comm_free(g_comm);
    gang_comm_free(tally); /* The last MPI communicator: MPI_Finalize happens here. */
    return failed == 0 ? 0 : 1;
}
