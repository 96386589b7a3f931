/*
 * The launcher's GPU parts: the agent's fault record (persistence across a restart, the
 * counters by kind) and the worker's GPU glue (worker-gpu.c) against the fake NVML:
 * no library, placement on an NVLink-pair topology with the bus id handed to the CUDA
 * side, the watch's event on the worker's pipe, and the fault it reports.
 */
#include <poll.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent-gpu.h"
#include "ganglion/gpu.h"
#include "launcher-tests.h"
#include "worker.h"

static void test_fault_record_persistence(void **state)
{
    (void)state;
    gang__gpu_faults f;
    memset(&f, 0, sizeof(f));
    const char *xid = "rank 3 (node 1 local 1): GPU 1 (GPU-x): Xid 79 (GPU has fallen off the bus)";
    const char *lost = "rank 3 (node 1 local 1): GPU 1 (GPU-x) does not answer: lost";

    /* One fault, then the node serves: it did not persist. */
    assert_int_equal(gang__gpu_faults_record(&f, 5, 3, 1, xid), 0);
    gang__gpu_faults_served(&f);
    assert_int_equal(gang__gpu_faults_record(&f, 6, 3, 1, xid), 0);
    assert_int_equal(f.persistent, 0);
    /* Another local rank's fault in the next generation is not this GPU persisting. */
    assert_int_equal(gang__gpu_faults_record(&f, 7, 2, 0, lost), 0);
    /* The same local rank again, later, without serving between: persistent. */
    assert_int_equal(gang__gpu_faults_record(&f, 7, 3, 1, lost), 1);
    assert_int_equal(f.persistent, 1);
    assert_string_equal(f.reason, lost);
    assert_int_equal(gang__gpu_faults_record(&f, 8, 3, 1, lost), 0); /* set once */
    gang__gpu_faults_served(&f);
    assert_int_equal(f.persistent, 1); /* for good: the GPU needs a reset */

    assert_int_equal(f.total, 5);
    assert_int_equal(f.n, 3);
    assert_int_equal(f.kinds[0].rank, 3);
    assert_int_equal(f.kinds[0].gpu, 1);
    assert_string_equal(f.kinds[0].kind, "xid_79");
    assert_int_equal(f.kinds[0].count, 2);
    assert_string_equal(f.kinds[1].kind, "lost");
    assert_int_equal(f.kinds[1].rank, 2);
    assert_int_equal(f.kinds[2].count, 2);
    /* A rank outside the node is counted but never persists. */
    assert_int_equal(gang__gpu_faults_record(&f, 9, 99, UINT32_MAX, xid), 0);
}

static void worker_conf(gang_worker_config *c, const char *lib, uint32_t nproc, int32_t tp)
{
    memset(c, 0, sizeof(*c));
    gang_strlcpy(c->nvml_library, lib, sizeof(c->nvml_library));
    c->nproc_per_node = nproc;
    c->res.layout.tc.tp = tp;
    c->gpu_bind = 1;
    c->gpu_health_interval_ms = 50;
}

static void test_wgpu_without_nvml(void **state)
{
    (void)state;
    gang_worker_config c;
    gang__wgpu *g = (gang__wgpu *)1;
    gang_gpu_sample s;
    char why[64];
    worker_conf(&c, "/nonexistent/libnvidia-ml.so.1", 2, 1);
    assert_int_equal(gang__wgpu_open(&c, 0, -1, &g), 0);
    assert_null(g);
    assert_string_equal(c.res.gpu_bus_id, "");
    c.gpu_bind = 0;
    c.gpu_health_interval_ms = 0; /* nothing asked: NVML is not even opened */
    assert_int_equal(gang__wgpu_open(&c, 0, -1, &g), 0);
    assert_null(g);
    assert_int_equal(gang__wgpu_sample(NULL, &s), GANG_ENOENT);
    assert_int_equal(gang__wgpu_fault(NULL, 1, why, sizeof(why)), 0);
    gang__wgpu_close(NULL);
}

static void test_wgpu_place_and_watch(void **state)
{
    (void)state;
    char path[128], why[256];
    cpu_set_t before;
    int fds[2];
    gang_worker_config c;
    gang__wgpu *g = NULL;
    gang_gpu_sample s;
    struct timeval tv;
    assert_int_equal(sched_getaffinity(0, sizeof(before), &before), 0);
    snprintf(path, sizeof(path), "/tmp/ganglion-test-wgpu-%d.conf", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("gpu 0 bus=00000000:10:00.0\ngpu 1 bus=00000000:11:00.0\n"
          "gpu 2 bus=00000000:12:00.0\ngpu 3 bus=00000000:13:00.0\nnvlink 0 2\nnvlink 1 3\n",
          f);
    fclose(f);
    setenv("FAKE_NVML_CONFIG", path, 1);
    assert_int_equal(pipe(fds), 0);

    /* TP 2 over 4 local ranks on pairs (0,2) (1,3): local rank 1 gets GPU 2. */
    worker_conf(&c, FAKE_NVML_PATH, 4, 2);
    assert_int_equal(gang__wgpu_open(&c, 1, fds[1], &g), 0);
    assert_non_null(g);
    assert_string_equal(c.res.gpu_bus_id, "00000000:12:00.0");
    usleep(100000);
    assert_int_equal(gang__wgpu_sample(g, &s), 0);
    assert_int_equal(s.gpu, 2);
    assert_int_equal(gang__wgpu_fault(g, 0, why, sizeof(why)), 0);

    gettimeofday(&tv, NULL);
    f = fopen(path, "a");
    assert_non_null(f);
    fprintf(f, "xid 2 48 %lld\n", (long long)tv.tv_sec * 1000 + tv.tv_usec / 1000);
    fclose(f);
    struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 2000), 1);
    gang__wevent ev;
    assert_int_equal(read(fds[0], &ev, sizeof(ev)), (ssize_t)sizeof(ev));
    assert_int_equal(ev.type, GANG__WEV_GPU);
    assert_int_equal(gang__wgpu_fault(g, 1, why, sizeof(why)), 1);
    assert_non_null(strstr(why, "GPU 2"));
    assert_non_null(strstr(why, "Xid 48"));
    assert_int_equal(gang__wgpu_fault(g, 0, why, sizeof(why)), 0); /* acknowledged */
    gang__wgpu_close(g);

    /* Without --gpu-bind: the local rank's own index, no binding; no watch asked. */
    worker_conf(&c, FAKE_NVML_PATH, 4, 2);
    c.gpu_bind = 0;
    c.gpu_health_interval_ms = 0;
    assert_int_equal(gang__wgpu_open(&c, 1, fds[1], &g), 0);
    assert_null(g);
    /* More local ranks than GPUs (MIG or time-slicing share a GPU): watched, not placed. */
    worker_conf(&c, FAKE_NVML_PATH, 8, 1);
    assert_int_equal(gang__wgpu_open(&c, 6, fds[1], &g), 0);
    assert_non_null(g);
    assert_string_equal(c.res.gpu_bus_id, "");
    assert_int_equal(gang__wgpu_sample(g, &s), 0);
    assert_int_equal(s.gpu, 2);
    gang__wgpu_close(g);
    /* --gpu-bind=0 with a watch: the local rank's own GPU, and CUDA keeps its choice. */
    worker_conf(&c, FAKE_NVML_PATH, 4, 2);
    c.gpu_bind = 0;
    assert_int_equal(gang__wgpu_open(&c, 1, fds[1], &g), 0);
    assert_non_null(g);
    assert_string_equal(c.res.gpu_bus_id, "");
    assert_int_equal(gang__wgpu_sample(g, &s), 0);
    assert_int_equal(s.gpu, 1);
    gang__wgpu_close(g);

    /* A lost GPU spoils the topology: the rank still watches its own GPU, which the
     * first sample reports lost. */
    gettimeofday(&tv, NULL);
    f = fopen(path, "a");
    assert_non_null(f);
    fprintf(f, "lost 3 %lld\n", (long long)tv.tv_sec * 1000 + tv.tv_usec / 1000);
    fclose(f);
    worker_conf(&c, FAKE_NVML_PATH, 4, 2);
    assert_int_equal(gang__wgpu_open(&c, 3, fds[1], &g), 0);
    assert_non_null(g);
    assert_string_equal(c.res.gpu_bus_id, "");
    assert_int_equal(poll(&pfd, 1, 2000), 1);
    assert_int_equal(read(fds[0], &ev, sizeof(ev)), (ssize_t)sizeof(ev));
    assert_int_equal(gang__wgpu_fault(g, 0, why, sizeof(why)), 1);
    assert_non_null(strstr(why, "GPU 3"));
    assert_non_null(strstr(why, "does not answer"));
    gang__wgpu_close(g);

    close(fds[0]);
    close(fds[1]);
    unlink(path);
    assert_int_equal(sched_setaffinity(0, sizeof(before), &before), 0);
}

int gang_test_gpu(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fault_record_persistence),
        cmocka_unit_test(test_wgpu_without_nvml),
        cmocka_unit_test(test_wgpu_place_and_watch),
    };
    return cmocka_run_group_tests_name("gpu", tests, NULL, NULL);
}
