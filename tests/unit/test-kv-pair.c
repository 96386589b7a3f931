/*
 * The device path of P/D KV transfers (issue #26, launcher/worker-kv-pair.c) on the fake
 * device (CTest unit-kv-pair): a prefill engine and a decode engine, each on its own
 * "fake" handle (device memory the host cannot read), with the launcher's transport
 * (worker-kv.c) between them on 127.0.0.1:
 *  - over TCP (no pair: device -> host -> TCP -> host -> device), the baseline;
 *  - over the fake pair (fake-comm.c: send/recv of device buffers that abort on a host
 *    pointer), after the same authenticated handshake: the decode's greedy tokens equal
 *    the TCP path's and the naive reference's, the blocks counted as cached, the rows
 *    moved over the pair (its byte count) and not over TCP;
 *  - a pair whose sends fail: the fetch meets its deadline, the import fails, and the
 *    decode engine prefills: the same tokens, no cached blocks; the same with a 20 s
 *    deadline and the transport aborted (gang__wkv_abort, a stopping worker): the fetch
 *    ends at once and falls back;
 *  - a decode gang of PP 2 fed by the 1 x 1 prefill engine: each decode rank fetches its
 *    run of layers out of the prefill rank's blocks over its own pair;
 *  - the pair's halves alone over a socketpair: whole blocks and a layer run of each
 *    block on the fake pair, and on the nccl pair with two GPUs (skipped, saying why,
 *    without: bench/gpu-check.sh runs it; NCCL refuses two ranks of one communicator on
 *    one GPU).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine-fixture.h"
#include "fake-comm.h"
#include "ganglion/serve.h"
#include "worker-kv.h"

#define KV_TIMEOUT_MS 1500

static const gang__wkv_pair fake_pair = {.make_blob = fake_pair_blob, .join = fake_pair_join};

/* What one P/D run gave. */
typedef struct pd_result {
    int32_t tokens[8];
    uint32_t n;
    gang_gen_event done;     /* the decode's DONE */
    uint64_t pair_transfers; /* the decode transport's pair count */
    uint64_t pair_bytes;     /* bytes received over fake pairs during the run */
} pd_result;

/* Steps e on k until it has nothing pending; the tokens and the DONE event. */
static uint32_t run_on(gang_engine *e, gang_kernels *k, const gang_gen_request *r, int32_t *toks,
                       gang_gen_event *done)
{
    char err[256];
    gang_gen_event ev;
    uint32_t n = 0;
    if (gang_engine_submit(e, r, err, sizeof(err)) != 0)
        fail_msg("submit: %s", err);
    for (int s = 0; s < 2000 && gang_engine_pending(e) > 0; s++) {
        assert_int_equal(gang_engine_step(e, k, NULL, NULL, NULL, NULL, STEP_TIMEOUT_MS), 0);
        while (gang_engine_poll(e, &ev)) {
            if (ev.kind == GANG_GEN_TOKEN && n < 8)
                toks[n++] = ev.token;
            else if (ev.kind != GANG_GEN_TOKEN)
                *done = ev;
        }
    }
    assert_int_equal(gang_engine_pending(e), 0);
    return n;
}

/*
 * A TCP port free right now (the kernel's pick for a bind to port 0), for a prefill
 * transport to serve on. A port computed from the pid (as before) fell in the ephemeral
 * range and was once taken by another test's connection under ctest -j2 ("Address already
 * in use": the export refused, the test failed); the kernel's pick is free when asked.
 */
static uint32_t free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* The transport config of one side (prefill: serving on port). */
static gang__wres_config side_config(uint32_t role, uint32_t port)
{
    gang__wres_config c;
    memset(&c, 0, sizeof(c));
    c.role = role;
    c.kv_port = port;
    gang_strlcpy(c.kv_bind, HOST, sizeof(c.kv_bind));
    gang_strlcpy(c.kv_advertise, HOST, sizeof(c.kv_advertise));
    c.kv_timeout_ms = KV_TIMEOUT_MS;
    c.kv_store_bytes = 1u << 20;
    c.kv_hold_ms = 30000;
    c.kv_token.present = 1;
    memset(c.kv_token.key, 0x5a, sizeof(c.kv_token.key));
    return c;
}

/* Aborts a transport's pairs after a delay (the worker's stop, gang__wkv_abort). */
typedef struct aborter {
    gang__wkv *k;
    uint32_t after_ms;
} aborter;

static void *aborter_main(void *arg)
{
    aborter *a = arg;
    usleep(a->after_ms * 1000u);
    gang__wkv_abort(a->k);
    return NULL;
}

/* Exports prompt[14] from a prefill engine and continues it on a decode engine, both on
 * the fake device, with pair p (NULL: TCP) on both sides; with abort_ms, a 20 s transfer
 * deadline and the decode transport aborted abort_ms after the decode request went in. */
static void run_pd(const full_model *fm, const gang__wkv_pair *p, int fail, uint32_t abort_ms,
                   pd_result *out)
{
    gang_engine_config cfg = engine_config(1);
    layout pl, dl;
    gang__wkv *kp = NULL, *kd = NULL;
    int32_t prompt[14], first[8];
    gang_gen_event done;
    uint32_t port = free_port();
    cfg.block_size = 4;
    cfg.max_step_tokens = 16;
    cfg.prefix_caching = 1;
    for (uint32_t i = 0; i < 14; i++)
        prompt[i] = (int32_t)((i * 7 + 3) % VOCAB);
    memset(out, 0, sizeof(*out));
    layout_init_on(&pl, fm, 1, 1, &cfg, "fake");
    layout_init_on(&dl, fm, 1, 1, &cfg, "fake");
    gang__wres_config cp = side_config(GANG_ROLE_PREFILL, port);
    gang__wres_config cd = side_config(GANG_ROLE_DECODE, 0);
    if (abort_ms > 0)
        cp.kv_timeout_ms = cd.kv_timeout_ms = 20000;
    assert_int_equal(gang__wkv_start(&cp, 0, pl.engines[0], &kp), 0);
    assert_int_equal(gang__wkv_start(&cd, 0, dl.engines[0], &kd), 0);
    gang__wkv_set_pair(kp, p);
    gang__wkv_set_pair(kd, p);

    gang_gen_request r = {.id = 1, .prompt = prompt, .n_prompt = 14, .max_tokens = 1};
    r.sampling.top_p = 1.0f; /* greedy */
    r.kv.do_export = 1;
    assert_int_equal(run_on(pl.engines[0], pl.kernels[0], &r, first, &done), 1);
    assert_true(done.kv_id != 0);
    assert_int_equal(done.kv_blocks, 3);

    uint64_t moved0 = fake_pair_moved();
    fake_pair_fail_sends(fail);
    gang_gen_request d = {.id = 7, .prompt = prompt, .n_prompt = 14, .max_tokens = 8};
    d.sampling.top_p = 1.0f;
    d.kv.id = done.kv_id;
    d.kv.blocks = done.kv_blocks;
    d.kv.port = port;
    gang_strlcpy(d.kv.host, HOST, sizeof(d.kv.host));
    aborter ab = {.k = kd, .after_ms = abort_ms};
    pthread_t th;
    if (abort_ms > 0)
        assert_int_equal(pthread_create(&th, NULL, aborter_main, &ab), 0);
    out->n = run_on(dl.engines[0], dl.kernels[0], &d, out->tokens, &out->done);
    if (abort_ms > 0)
        pthread_join(th, NULL);
    fake_pair_fail_sends(0);
    out->pair_bytes = fake_pair_moved() - moved0;
    out->pair_transfers = gang__wkv_pair_count(kd);
    assert_int_equal(out->tokens[0], first[0]);
    /* The order of worker-engine.c's close: engines, transports, then the handles. */
    gang_engine_free(pl.engines[0]);
    gang_engine_free(dl.engines[0]);
    pl.engines[0] = dl.engines[0] = NULL;
    gang__wkv_stop(kp);
    gang__wkv_stop(kd);
    layout_free(&pl);
    layout_free(&dl);
}

static void test_kv_pair_fake(void **state)
{
    (void)state;
    full_model *fm = full_model_new(33, 0);
    int32_t prompt[14], want[8];
    pd_result tcp, pair, failed;
    for (uint32_t i = 0; i < 14; i++)
        prompt[i] = (int32_t)((i * 7 + 3) % VOCAB);
    ref_greedy(fm, prompt, 14, 8, want);

    run_pd(fm, NULL, 0, 0, &tcp);
    assert_int_equal(tcp.n, 8);
    assert_memory_equal(tcp.tokens, want, sizeof(want));
    assert_int_equal(tcp.done.kv_blocks, 3); /* imported over TCP */
    assert_int_equal(tcp.done.kv_device, 0);
    assert_int_equal(tcp.pair_transfers, 0);
    assert_int_equal(tcp.pair_bytes, 0);

    run_pd(fm, &fake_pair, 0, 0, &pair);
    assert_int_equal(pair.n, 8);
    assert_memory_equal(pair.tokens, tcp.tokens, sizeof(want));
    assert_int_equal(pair.done.kv_blocks, 3);
    assert_int_equal(pair.done.kv_device, 1); /* what ganglion_kv_imports_device_total counts */
    assert_int_equal(pair.done.index, 12);    /* 12 prompt tokens cached: not computed */
    assert_int_equal(pair.pair_transfers, 1);
    /* 3 blocks x 3 layers x K and V x 4 positions x KV_DIM floats, all over the pair. */
    assert_int_equal(pair.pair_bytes, 3u * N_LAYERS * 2u * 4u * KV_DIM * sizeof(float));

    uint64_t t0 = gang_now_ms();
    run_pd(fm, &fake_pair, 1, 0, &failed);
    assert_int_equal(failed.n, 8);
    assert_memory_equal(failed.tokens, want, sizeof(want)); /* prefilled on the decode side */
    assert_int_equal(failed.done.kv_blocks, 0);
    assert_int_equal(failed.done.kv_device, 0);
    assert_int_equal(failed.done.index, 0);
    assert_int_equal(failed.pair_transfers, 0);
    assert_int_equal(failed.pair_bytes, 0);
    assert_true(gang_now_ms() - t0 >= KV_TIMEOUT_MS / 2); /* the receiver met its deadline */

    /* A pair stuck until its 20 s deadline, aborted after 300 ms (a worker that stops):
     * the fetch ends at once (GANG_EABORTED), the request prefills. */
    t0 = gang_now_ms();
    run_pd(fm, &fake_pair, 1, 300, &failed);
    uint64_t took = gang_now_ms() - t0;
    assert_int_equal(failed.n, 8);
    assert_memory_equal(failed.tokens, want, sizeof(want));
    assert_int_equal(failed.done.kv_blocks, 0);
    assert_true(took < 10000);
    print_message("aborted pair: the run took %llu ms (deadline 20000 ms)\n",
                  (unsigned long long)took);
    free(fm);
}

/* ---- a decode gang of PP 2 fed by a prefill gang of PP 1 (a run of layers each) ---- */

static gang_gen_request pp_req; /* the decode request rank 0 submits at the first step */
static pd_result pp_out;

/* Every rank steps 300 times (lockstep: every step is a gang step); rank 0 submits first
 * and collects the events. */
static int pp_body(rank_ctx *x, gang_comm *world, gang_comm *tp, gang_comm *pp)
{
    gang_kernels *k = x->run->kernels[x->rank];
    char err[256];
    gang_gen_event ev;
    int rc = 0;
    for (uint32_t s = 0; s < 300 && rc == 0; s++) {
        if (x->rank == 0 && s == 0)
            rc = gang_engine_submit(x->engine, &pp_req, err, sizeof(err));
        if (rc == 0)
            rc = gang_engine_step(x->engine, k, world, tp, NULL, pp, STEP_TIMEOUT_MS);
        while (rc == 0 && x->rank == 0 && gang_engine_poll(x->engine, &ev)) {
            if (ev.kind == GANG_GEN_TOKEN && pp_out.n < 8)
                pp_out.tokens[pp_out.n++] = ev.token;
            else if (ev.kind != GANG_GEN_TOKEN)
                pp_out.done = ev;
        }
    }
    if (rc == 0 && x->rank == 0 && gang_engine_pending(x->engine) != 0)
        rc = GANG_EINTERNAL;
    return rc;
}

/*
 * The prefill engine (1 x 1, all 3 layers) exports prompt[14]; a decode gang of PP 2 on
 * the fake device (rank 0: layers 0-1, rank 1: layer 2), each rank with its own transport
 * and the fake pair, fetches its run of layers out of the prefill rank's blocks (the
 * hand-over names the PP 1 layout): the engine's get_dev with a run inside bigger source
 * blocks, one message per block. The tokens equal the reference's, the blocks imported.
 */
static void test_kv_pair_pp2(void **state)
{
    (void)state;
    static rank_ctx xs[MAX_RANKS];
    full_model *fm = full_model_new(33, 0);
    gang_engine_config cfg = engine_config(1);
    layout pl, dl;
    gang__wkv *kp = NULL, *kd[2] = {NULL, NULL};
    int32_t prompt[14], want[8], first[8];
    gang_gen_event done;
    uint32_t port = free_port();
    cfg.block_size = 4;
    cfg.max_step_tokens = 16;
    cfg.prefix_caching = 1;
    for (uint32_t i = 0; i < 14; i++)
        prompt[i] = (int32_t)((i * 7 + 3) % VOCAB);
    ref_greedy(fm, prompt, 14, 8, want);
    layout_init_on(&pl, fm, 1, 1, &cfg, "fake");
    layout_init_on(&dl, fm, 1, 2, &cfg, "fake");
    gang__wres_config cp = side_config(GANG_ROLE_PREFILL, port);
    gang__wres_config cd = side_config(GANG_ROLE_DECODE, 0);
    assert_int_equal(gang__wkv_start(&cp, 0, pl.engines[0], &kp), 0);
    gang__wkv_set_pair(kp, &fake_pair);
    for (uint32_t r = 0; r < 2; r++) {
        assert_int_equal(gang__wkv_start(&cd, r, dl.engines[r], &kd[r]), 0);
        gang__wkv_set_pair(kd[r], &fake_pair);
    }
    gang_gen_request r = {.id = 1, .prompt = prompt, .n_prompt = 14, .max_tokens = 1};
    r.sampling.top_p = 1.0f;
    r.kv.do_export = 1;
    assert_int_equal(run_on(pl.engines[0], pl.kernels[0], &r, first, &done), 1);
    assert_true(done.kv_id != 0);

    uint64_t m0 = fake_pair_moved();
    memset(&pp_out, 0, sizeof(pp_out));
    pp_req = (gang_gen_request){.id = 7, .prompt = prompt, .n_prompt = 14, .max_tokens = 8};
    pp_req.sampling.top_p = 1.0f;
    pp_req.kv.id = done.kv_id;
    pp_req.kv.blocks = done.kv_blocks;
    pp_req.kv.port = port;
    pp_req.kv.src = (gang_kv_layout){.layers = N_LAYERS, .pp = 1, .tp = 1};
    gang_strlcpy(pp_req.kv.host, HOST, sizeof(pp_req.kv.host));
    run_gang_on(1, 2, dl.engines, dl.kernels, NULL, pp_body, NULL, xs);
    for (uint32_t i = 0; i < 2; i++)
        assert_int_equal(xs[i].body_rc, 0);
    assert_int_equal(pp_out.n, 8);
    assert_memory_equal(pp_out.tokens, want, sizeof(want));
    assert_int_equal(pp_out.done.kv_blocks, 3);
    assert_int_equal(pp_out.done.kv_device, 1);
    assert_int_equal(gang__wkv_pair_count(kd[0]), 1);
    assert_int_equal(gang__wkv_pair_count(kd[1]), 1);
    /* Every layer of the 3 blocks once: 2 layers to rank 0, 1 to rank 1. */
    assert_int_equal(fake_pair_moved() - m0, 3u * N_LAYERS * 2u * 4u * KV_DIM * sizeof(float));
    gang_engine_free(pl.engines[0]);
    pl.engines[0] = NULL;
    for (uint32_t i = 0; i < 2; i++) {
        gang_engine_free(dl.engines[i]);
        dl.engines[i] = NULL;
        gang__wkv_stop(kd[i]);
    }
    gang__wkv_stop(kp);
    layout_free(&pl);
    layout_free(&dl);
    free(fm);
}

/* ---- the pair's halves alone, over a socketpair (the handshake's connection) ---- */

typedef struct pair_side {
    const gang__wkv_pair *p;
    gang_kernels *k;
    int fd, send, peer_whole, rc;
    uint8_t *dev;
    size_t stride, at, run;
} pair_side;

static void *pair_side_main(void *arg)
{
    pair_side *s = arg;
    gang_token t = {.present = 1};
    uint8_t nonces[64];
    memset(t.key, 0x33, sizeof(t.key));
    memset(nonces, 0x44, sizeof(nonces));
    uint64_t until = gang_now_ms() + KV_TIMEOUT_MS;
    s->rc = s->send ? gang__wkv_pair_send(s->p, NULL, s->k, &t, s->fd, nonces, s->peer_whole,
                                          s->dev, s->stride, s->at, s->run, 3, until)
                    : gang__wkv_pair_recv(s->p, NULL, s->k, &t, s->fd, nonces, s->dev, s->stride,
                                          s->at, s->run, 3, until);
    return NULL;
}

/*
 * Moves run bytes of each of 3 blocks from a device buffer of ka (blocks of sstride bytes,
 * the run at sat) to one of kb (dstride, dat) over pair p -- the two sides' layouts differ
 * when the gangs' PP does; fails unless exactly those bytes arrived (the rest of the
 * destination untouched) and both sides returned 0.
 */
static void pair_exchange(const gang__wkv_pair *p, gang_kernels *ka, gang_kernels *kb,
                          size_t sstride, size_t sat, size_t dstride, size_t dat, size_t run)
{
    uint8_t src[3 * 256], dst[3 * 256], want[3 * 256];
    int fds[2];
    pthread_t th;
    assert_true(3 * sstride <= sizeof(src) && 3 * dstride <= sizeof(dst));
    for (size_t i = 0; i < 3 * sstride; i++)
        src[i] = (uint8_t)(i * 13 + 1);
    memset(want, 0xee, 3 * dstride);
    memset(dst, 0xee, 3 * dstride);
    for (size_t b = 0; b < 3; b++)
        memcpy(want + b * dstride + dat, src + b * sstride + sat, run);
    pair_side a = {.p = p, .k = ka, .send = 1, .stride = sstride, .at = sat, .run = run};
    pair_side z = {.p = p, .k = kb, .send = 0, .stride = dstride, .at = dat, .run = run};
    a.peer_whole = dat == 0 && run == dstride;
    assert_int_equal(gang_kernels_alloc(ka, 3 * sstride, (void **)&a.dev), 0);
    assert_int_equal(gang_kernels_alloc(kb, 3 * dstride, (void **)&z.dev), 0);
    assert_int_equal(gang_kernels_upload(ka, a.dev, src, 3 * sstride), 0);
    assert_int_equal(gang_kernels_upload(kb, z.dev, dst, 3 * dstride), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    a.fd = fds[0];
    z.fd = fds[1];
    assert_int_equal(pthread_create(&th, NULL, pair_side_main, &a), 0);
    pair_side_main(&z);
    pthread_join(th, NULL);
    close(fds[0]);
    close(fds[1]);
    assert_int_equal(a.rc, 0);
    assert_int_equal(z.rc, 0);
    assert_int_equal(gang_kernels_download(kb, dst, z.dev, 3 * dstride), 0);
    assert_memory_equal(dst, want, 3 * dstride);
    gang_kernels_free(ka, a.dev);
    gang_kernels_free(kb, z.dev);
}

/* The fake pair's halves, device buffers on two fake handles: whole blocks on both sides
 * (one message), a layer run of each block on both (one per block), and the layouts of
 * prefill PP 1 -> decode PP 2 (the server cuts a run out of bigger blocks, the client's
 * are whole) and PP 2 -> PP 1 (the server's whole blocks into a run of the client's). */
static void test_kv_pair_halves_fake(void **state)
{
    (void)state;
    gang_kernels *ka = NULL, *kb = NULL;
    assert_int_equal(gang_kernels_open("fake", &ka), 0);
    assert_int_equal(gang_kernels_open("fake", &kb), 0);
    uint64_t m0 = fake_pair_moved();
    pair_exchange(&fake_pair, ka, kb, 96, 0, 96, 0, 96);
    pair_exchange(&fake_pair, ka, kb, 96, 32, 96, 32, 48);
    pair_exchange(&fake_pair, ka, kb, 96, 48, 48, 0, 48);
    pair_exchange(&fake_pair, ka, kb, 48, 0, 96, 48, 48);
    assert_int_equal(fake_pair_moved() - m0, 3 * 96 + 3 * 3 * 48);
    gang_kernels_close(ka);
    gang_kernels_close(kb);
}

/* The nccl pair's halves on GPUs 0 and 1. NCCL refuses two ranks of one communicator on
 * one GPU ("Duplicate GPU detected"), so it needs two: bench/gpu-check.sh lists it. */
static void test_kv_pair_halves_nccl(void **state)
{
    (void)state;
    char lib[512];
    if (!gang_comm_backend_built(GANG_COMM_NCCL)) {
        print_message("SKIP: the nccl backend is not built into this binary\n");
        skip();
    }
    if (gang_kernels_device_count() < 2 || gang_comm_nccl_library(lib, sizeof(lib)) != 0) {
        print_message("SKIP: the nccl pair needs 2 GPUs and libnccl (NCCL refuses two ranks "
                      "on one GPU); %d GPU(s) here\n",
                      gang_kernels_device_count());
        skip();
    }
    gang_kernels *k[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        gang_kernels_options o;
        gang_kernels_options_init(&o);
        o.device = "cuda";
        o.device_index = i;
        o.pool_mb = 64;
        assert_int_equal(gang_kernels_open_opts(&o, &k[i]), 0);
    }
    pair_exchange(&gang__wkv_pair_nccl, k[0], k[1], 256, 0, 256, 0, 256);
    pair_exchange(&gang__wkv_pair_nccl, k[0], k[1], 256, 64, 128, 0, 128);
    pair_exchange(&gang__wkv_pair_nccl, k[0], k[1], 128, 0, 256, 128, 128);
    gang_kernels_close(k[0]);
    gang_kernels_close(k[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_pair_halves_fake),
        cmocka_unit_test(test_kv_pair_fake),
        cmocka_unit_test(test_kv_pair_pp2),
        cmocka_unit_test(test_kv_pair_halves_nccl),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
